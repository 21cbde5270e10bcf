//! Putting DHCP messages on a macvlan and reading the replies, before the interface has an
//! address: an `AF_PACKET` `SOCK_DGRAM` socket bound to the macvlan (the kernel writes the
//! Ethernet header with the macvlan's MAC), carrying IPv4/UDP built with `pnet_packet` and
//! DHCP encoded with `dhcproto`. A kernel UDP socket cannot do this: it cannot send from
//! `0.0.0.0` (RFC 2131 §4.1) nor receive replies to an address the interface does not have.
//!
//! Only frames sent to the macvlan's MAC or to broadcast reach its socket (macvlan
//! filtering), and only UDP to port 68 is decoded.

use std::future::Future;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

use dhcproto::v4::Message;
use dhcproto::{Decodable, Encodable};
use pnet::packet::Packet;
use pnet::packet::ip::IpNextHeaderProtocols;
use pnet::packet::ipv4::{self, Ipv4Packet, MutableIpv4Packet};
use pnet::packet::udp::{self, MutableUdpPacket, UdpPacket};
use tokio::io::unix::AsyncFd;

use super::machine::{Dest, Outgoing};
use crate::net::packet::{bound_packet_socket, sockaddr_ll};

/// UDP port of DHCP servers (RFC 2131 §4.1).
pub const SERVER_PORT: u16 = 67;
/// UDP port of DHCP clients.
pub const CLIENT_PORT: u16 = 68;
/// `ETH_P_IP`.
const ETH_P_IP: u16 = 0x0800;
/// `PACKET_OUTGOING`: a frame this host sent, looped back to packet sockets.
const PACKET_OUTGOING: u8 = 4;
const BROADCAST_MAC: [u8; 6] = [0xff; 6];
const IPV4_HEADER: usize = 20;
const UDP_HEADER: usize = 8;

/// One client's packet I/O (a socket on its macvlan, or a test double).
pub trait Wire: Send + 'static {
    /// Sends `out` (UDP 68 -> 67).
    ///
    /// # Errors
    /// The socket's error.
    fn send(&mut self, out: &Outgoing) -> impl Future<Output = io::Result<()>> + Send;

    /// The next DHCP message received on port 68. Cancel-safe.
    ///
    /// # Errors
    /// The socket's error (e.g. the interface is gone).
    fn recv(&mut self) -> impl Future<Output = io::Result<Message>> + Send;
}

/// Opens a [`Wire`] on an interface.
pub trait Transport: Send + Sync + 'static {
    /// The wire type.
    type Wire: Wire;

    /// A wire on interface `ifindex` (named `name`, for errors).
    ///
    /// # Errors
    /// The OS error, with the step in the message.
    fn open(&self, ifindex: u32, name: &str) -> io::Result<Self::Wire>;
}

/// IPv4 + UDP around a DHCP message (the Ethernet header is the kernel's).
///
/// # Errors
/// When `dhcproto` cannot encode the message.
pub fn ip_udp_packet(out: &Outgoing) -> io::Result<Vec<u8>> {
    let payload = out
        .msg
        .to_vec()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encode DHCP: {e}")))?;
    let dst = match out.dest {
        Dest::Broadcast => Ipv4Addr::BROADCAST,
        Dest::Unicast(ip) => ip,
    };
    let total = IPV4_HEADER + UDP_HEADER + payload.len();
    let too_big = || io::Error::new(io::ErrorKind::InvalidInput, "DHCP message too large");
    let total16 = u16::try_from(total).map_err(|_| too_big())?;
    let mut buf = vec![0u8; total];
    {
        let mut udp_pkt = MutableUdpPacket::new(&mut buf[IPV4_HEADER..]).ok_or_else(too_big)?;
        udp_pkt.set_source(CLIENT_PORT);
        udp_pkt.set_destination(SERVER_PORT);
        udp_pkt.set_length(total16 - IPV4_HEADER as u16);
        udp_pkt.set_payload(&payload);
        let sum = udp::ipv4_checksum(&udp_pkt.to_immutable(), &out.src, &dst);
        udp_pkt.set_checksum(sum);
    }
    let mut ip = MutableIpv4Packet::new(&mut buf).ok_or_else(too_big)?;
    ip.set_version(4);
    ip.set_header_length(5);
    ip.set_total_length(total16);
    // RFC 2131 §4.1 does not care; 64 like the kernel's default TTL.
    ip.set_ttl(64);
    ip.set_next_level_protocol(IpNextHeaderProtocols::Udp);
    ip.set_source(out.src);
    ip.set_destination(dst);
    let sum = ipv4::checksum(&ip.to_immutable());
    ip.set_checksum(sum);
    Ok(buf)
}

/// The DHCP message in an IPv4 packet if it is UDP to port 68 with a good length.
pub fn dhcp_in_ip_packet(packet: &[u8]) -> Option<(Ipv4Addr, Message)> {
    let ip = Ipv4Packet::new(packet)?;
    if ip.get_version() != 4 || ip.get_next_level_protocol() != IpNextHeaderProtocols::Udp {
        return None;
    }
    let header = usize::from(ip.get_header_length()) * 4;
    let total = usize::from(ip.get_total_length()).min(packet.len());
    let udp_pkt = UdpPacket::new(packet.get(header..total)?)?;
    if udp_pkt.get_destination() != CLIENT_PORT {
        return None;
    }
    let len = usize::from(udp_pkt.get_length()).checked_sub(UDP_HEADER)?;
    let payload = udp_pkt.payload().get(..len)?;
    Message::from_bytes(payload)
        .ok()
        .map(|m| (ip.get_source(), m))
}

/// [`Transport`] over `AF_PACKET` `SOCK_DGRAM` sockets (needs `CAP_NET_RAW`); the socket
/// lives in the network namespace of the thread that opens it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PacketTransport;

/// A [`Wire`] on one interface. Unicast goes to the MAC the server's (or relay's) replies
/// came from.
#[derive(Debug)]
pub struct PacketWire {
    fd: AsyncFd<socket2::Socket>,
    ifindex: u32,
    /// Source IP and MAC of the latest reply: where unicast goes at layer 2.
    last_reply: Option<(Ipv4Addr, [u8; 6])>,
    buf: Vec<u8>,
}

impl Transport for PacketTransport {
    type Wire = PacketWire;

    fn open(&self, ifindex: u32, name: &str) -> io::Result<PacketWire> {
        let step = |what: &str| {
            let what = format!("{what} on {name}");
            move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
        };
        let sock = bound_packet_socket(ifindex, socket2::Type::DGRAM, ETH_P_IP)
            .map_err(|(what, e)| step(what)(e))?;
        sock.set_nonblocking(true)
            .map_err(step("make the socket non-blocking"))?;
        // SAFETY: the socket2 socket owns its descriptor and moves into the AsyncFd, which
        // owns it until dropped; `as_raw_fd` always returns that same descriptor.
        let fd = unsafe { AsyncFd::register(sock) }
            .map_err(|e| step("register the socket")(e.into_parts().1))?;
        Ok(PacketWire {
            fd,
            ifindex,
            last_reply: None,
            buf: vec![0u8; 2048],
        })
    }
}

impl PacketWire {
    fn dest_mac(&self, dest: Dest) -> [u8; 6] {
        match (dest, self.last_reply) {
            (Dest::Broadcast, _) | (Dest::Unicast(_), None) => BROADCAST_MAC,
            (Dest::Unicast(_), Some((_, mac))) => mac,
        }
    }
}

impl Wire for PacketWire {
    async fn send(&mut self, out: &Outgoing) -> io::Result<()> {
        let packet = ip_udp_packet(out)?;
        let sll = sockaddr_ll(self.ifindex, ETH_P_IP, self.dest_mac(out.dest));
        loop {
            let mut guard = self.fd.writable().await?;
            let res = guard.try_io(|inner| {
                // SAFETY: `packet` is valid for its length; `sll` is a valid sockaddr_ll.
                let n = unsafe {
                    libc::sendto(
                        inner.get_ref().as_raw_fd(),
                        packet.as_ptr().cast(),
                        packet.len(),
                        0,
                        std::ptr::from_ref(&sll).cast(),
                        std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match res {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    async fn recv(&mut self) -> io::Result<Message> {
        loop {
            let mut guard = self.fd.readable().await?;
            let buf = &mut self.buf;
            let res = guard.try_io(|inner| {
                // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
                let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                // SAFETY: `buf` is valid for `buf.len()` bytes; `sll`/`len` describe a
                // sockaddr_ll the kernel fills in (never more than `len` bytes).
                let n = unsafe {
                    libc::recvfrom(
                        inner.get_ref().as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                        std::ptr::from_mut(&mut sll).cast(),
                        &mut len,
                    )
                };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                let mut mac = [0u8; 6];
                mac.copy_from_slice(&sll.sll_addr[..6]);
                Ok((usize::try_from(n).unwrap_or(0), sll.sll_pkttype, mac))
            });
            let (n, pkttype, mac) = match res {
                Ok(r) => r?,
                Err(_would_block) => continue,
            };
            if pkttype == PACKET_OUTGOING {
                continue;
            }
            if let Some((src, msg)) = self.buf.get(..n).and_then(dhcp_in_ip_packet) {
                self.last_reply = Some((src, mac));
                return Ok(msg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v4::{DhcpOption, MessageType};

    fn outgoing(dest: Dest, src: Ipv4Addr) -> Outgoing {
        let mut msg = Message::default();
        msg.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Request));
        Outgoing { msg, dest, src }
    }

    #[test]
    fn packet_round_trips_with_valid_checksums() {
        let out = outgoing(Dest::Broadcast, Ipv4Addr::UNSPECIFIED);
        let mut pkt = ip_udp_packet(&out).unwrap();
        let ip = Ipv4Packet::new(&pkt).unwrap();
        assert_eq!(ip.get_destination(), Ipv4Addr::BROADCAST);
        assert_eq!(ip.get_source(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(ip.get_checksum(), ipv4::checksum(&ip));
        let u = UdpPacket::new(&pkt[IPV4_HEADER..]).unwrap();
        assert_eq!((u.get_source(), u.get_destination()), (68, 67));
        assert_eq!(
            u.get_checksum(),
            udp::ipv4_checksum(&u, &Ipv4Addr::UNSPECIFIED, &Ipv4Addr::BROADCAST)
        );
        // A reply is the same shape with ports swapped.
        pkt[IPV4_HEADER..IPV4_HEADER + 4].copy_from_slice(&[0, 67, 0, 68]);
        let (src, msg) = dhcp_in_ip_packet(&pkt).unwrap();
        assert_eq!(src, Ipv4Addr::UNSPECIFIED);
        assert_eq!(msg, out.msg);
    }

    #[test]
    fn only_udp_to_port_68_is_decoded() {
        let out = outgoing(
            Dest::Unicast(Ipv4Addr::new(192, 0, 2, 1)),
            Ipv4Addr::new(192, 0, 2, 9),
        );
        let pkt = ip_udp_packet(&out).unwrap();
        assert_eq!(
            Ipv4Packet::new(&pkt).unwrap().get_destination(),
            Ipv4Addr::new(192, 0, 2, 1)
        );
        // Our own request goes to port 67: not a reply.
        assert!(dhcp_in_ip_packet(&pkt).is_none());
        assert!(dhcp_in_ip_packet(&pkt[..10]).is_none());
    }
}
