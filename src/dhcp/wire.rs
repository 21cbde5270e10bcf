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
use crate::net::packet::{attach_filter, bound_packet_socket, sockaddr_ll};

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
    /// What is sent (DHCPv4: [`Outgoing`]).
    type Out;
    /// What is received (DHCPv4: [`Message`]).
    type Msg;

    /// Sends `out` (DHCPv4: UDP 68 -> 67; DHCPv6: 546 -> 547).
    ///
    /// # Errors
    /// The socket's error.
    fn send(&mut self, out: &Self::Out) -> impl Future<Output = io::Result<()>> + Send;

    /// The next DHCP message received on the client port. Cancel-safe.
    ///
    /// # Errors
    /// The socket's error (e.g. the interface is gone).
    fn recv(&mut self) -> impl Future<Output = io::Result<Self::Msg>> + Send;
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

/// Classic BPF for the client socket (`SOCK_DGRAM`: offsets from the IPv4 header): accept
/// unfragmented (or first-fragment) UDP to port [`CLIENT_PORT`], drop the rest.
pub fn client_port_filter() -> [libc::sock_filter; 9] {
    const LDB_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const LDH_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
    const LDH_IND: u16 = 0x48; // BPF_LD | BPF_H | BPF_IND
    const LDX_MSH: u16 = 0xb1; // BPF_LDX | BPF_B | BPF_MSH: X = 4 * (byte & 0x0f)
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    [
        ins(LDB_ABS, 0, 0, 9),                    // IPv4 protocol
        ins(JEQ_K, 0, 6, 17),                     // UDP, else drop
        ins(LDH_ABS, 0, 0, 6),                    // flags + fragment offset
        ins(JSET_K, 4, 0, 0x1fff),                // a later fragment: drop
        ins(LDX_MSH, 0, 0, 0),                    // X = IPv4 header length
        ins(LDH_IND, 0, 0, 2),                    // UDP destination port
        ins(JEQ_K, 0, 1, u32::from(CLIENT_PORT)), // port 68: accept, else drop
        ins(RET_K, 0, 0, 0x0004_0000),            // accept
        ins(RET_K, 0, 0, 0),                      // drop
    ]
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
        // Once the Service's address is on the macvlan, all its traffic passes here: only
        // DHCP replies may wake the client.
        attach_filter(&sock, &client_port_filter())
            .map_err(step("attach the UDP port 68 filter"))?;
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
    type Out = Outgoing;
    type Msg = Message;

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
    fn client_port_filter_jumps_land_inside_the_program() {
        let prog = client_port_filter();
        for (i, ins) in prog.iter().enumerate() {
            if ins.code & 0x07 == 0x05 {
                assert!(i + 1 + usize::from(ins.jt) < prog.len(), "{i}");
                assert!(i + 1 + usize::from(ins.jf) < prog.len(), "{i}");
            }
        }
        // Non-UDP and later fragments land on the drop; port 68 on the accept.
        assert_eq!(1 + 1 + usize::from(prog[1].jf), 8);
        assert_eq!(3 + 1 + usize::from(prog[3].jt), 8);
        assert_eq!((prog[7].code, prog[8].k), (0x06, 0));
        assert_ne!(prog[7].k, 0);
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
