//! DHCPv6 messages on a macvlan: a kernel UDP socket on port 546 (RFC 8415 §7.2), bound to
//! the macvlan with `SO_BINDTODEVICE`, so that each Service's client has its own socket on
//! the same port. Unlike DHCPv4, no raw socket is needed: the client talks from the
//! macvlan's link-local address, which vipd adds, without DAD, before the socket opens and
//! keeps with a short lifetime ([`crate::net::macvlan::Macvlans::add_link_local`]). The
//! socket is bound to `[::]:546` on the
//! device, and the kernel picks that link-local address as the source of every message to
//! `ff02::1:2` (link scope, RFC 6724); replies come back to it. (Bound to the wildcard
//! rather than to the link-local address itself, so that opening the socket never waits for
//! or races the address.)

use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};

use dhcproto::v6::Message;
use dhcproto::{Decodable, Encodable};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

use super::machine::{ALL_SERVERS, Dest6, Outgoing6};
use crate::dhcp::wire::{Transport, Wire};

/// UDP port of DHCPv6 clients (RFC 8415 §7.2).
pub const CLIENT_PORT6: u16 = 546;
/// UDP port of DHCPv6 servers and relay agents.
pub const SERVER_PORT6: u16 = 547;

/// [`Transport`] over UDP sockets bound to the macvlan (needs `CAP_NET_RAW` for
/// `SO_BINDTODEVICE` and `CAP_NET_BIND_SERVICE` for port 546); the socket lives in the
/// network namespace of the thread that opens it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Udp6Transport;

/// A [`Wire`] on one macvlan.
#[derive(Debug)]
pub struct Udp6Wire {
    sock: UdpSocket,
    ifindex: u32,
    buf: Vec<u8>,
}

impl Transport for Udp6Transport {
    type Wire = Udp6Wire;

    fn open(&self, ifindex: u32, name: &str) -> io::Result<Udp6Wire> {
        let step = |what: &str| {
            let what = format!("{what} on {name}");
            move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
        };
        let sock = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))
            .map_err(step("open a UDP socket"))?;
        sock.set_only_v6(true).map_err(step("set IPV6_V6ONLY"))?;
        sock.bind_device(Some(name.as_bytes()))
            .map_err(step("bind the socket to the macvlan (SO_BINDTODEVICE)"))?;
        sock.set_multicast_if_v6(ifindex)
            .map_err(step("set IPV6_MULTICAST_IF"))?;
        sock.set_multicast_loop_v6(false)
            .map_err(step("clear IPV6_MULTICAST_LOOP"))?;
        // A host DHCPv6 client on the node (ISC dhclient binds [::]:546 with SO_REUSEADDR, on
        // no device) would otherwise make this bind fail; the kernel still delivers what
        // arrives on the macvlan to this socket, the one bound to that device.
        sock.set_reuse_address(true)
            .map_err(step("set SO_REUSEADDR"))?;
        sock.set_nonblocking(true)
            .map_err(step("make the socket non-blocking"))?;
        let any = SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, CLIENT_PORT6, 0, 0);
        sock.bind(&SocketAddr::V6(any).into()).map_err(|e| {
            let what = if e.kind() == io::ErrorKind::PermissionDenied {
                "bind UDP port 546 (needs CAP_NET_BIND_SERVICE)"
            } else {
                "bind UDP port 546"
            };
            step(what)(e)
        })?;
        let sock = UdpSocket::from_std(sock.into()).map_err(step("register the socket"))?;
        Ok(Udp6Wire {
            sock,
            ifindex,
            buf: vec![0u8; 2048],
        })
    }
}

/// Where `dest` is, as a socket address (link-local addresses scoped to `ifindex`).
pub fn dest_addr(dest: Dest6, ifindex: u32) -> SocketAddrV6 {
    let ip = match dest {
        Dest6::AllServers => ALL_SERVERS,
        Dest6::Unicast(ip) => ip,
    };
    let scoped = ip.is_multicast() || ip.is_unicast_link_local();
    SocketAddrV6::new(ip, SERVER_PORT6, 0, if scoped { ifindex } else { 0 })
}

impl Wire for Udp6Wire {
    type Out = Outgoing6;
    type Msg = (Ipv6Addr, Message);

    async fn send(&mut self, out: &Outgoing6) -> io::Result<()> {
        let payload = out.msg.to_vec().map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("encode DHCPv6: {e}"))
        })?;
        self.sock
            .send_to(&payload, dest_addr(out.dest, self.ifindex))
            .await
            .map(|_| ())
    }

    async fn recv(&mut self) -> io::Result<(Ipv6Addr, Message)> {
        loop {
            let (n, from) = self.sock.recv_from(&mut self.buf).await?;
            let SocketAddr::V6(from) = from else {
                continue;
            };
            if let Some(msg) = self.buf.get(..n).and_then(|b| Message::from_bytes(b).ok()) {
                return Ok((*from.ip(), msg));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_and_link_local_are_scoped_to_the_macvlan() {
        let all = dest_addr(Dest6::AllServers, 7);
        assert_eq!(
            (*all.ip(), all.port(), all.scope_id()),
            (ALL_SERVERS, 547, 7)
        );
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        assert_eq!(dest_addr(Dest6::Unicast(ll), 7).scope_id(), 7);
        let global: Ipv6Addr = "2001:db8::3".parse().unwrap();
        assert_eq!(dest_addr(Dest6::Unicast(global), 7).scope_id(), 0);
    }
}
