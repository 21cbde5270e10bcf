//! "Does a host already use this MAC?", asked on the wire before vipd creates a DHCP
//! macvlan with a MAC it did not derive itself (a `kube-vip.io/hwaddr` set by hand, copied,
//! or pinned by Harvester): a macvlan with another host's MAC takes that host's traffic (the
//! switch learns the MAC on this node's port), and the neighbour table only knows the hosts
//! this node talked to.
//!
//! The question is an ICMPv6 Echo Request (RFC 4443 §4.1) to the all-nodes address
//! `ff02::1` in an Ethernet frame sent to that MAC alone: only a host whose NIC has the MAC
//! receives it, and every IPv6 node answers an echo to all-nodes (Linux:
//! `net.ipv6.icmp.echo_ignore_multicast` 0 by default). Any IPv6 frame from the MAC within
//! [`MAC_PROBE_WAIT`] counts as an answer. Hosts without IPv6, or ignoring multicast
//! echoes, stay unseen: the probe narrows the gap, it cannot close it. The source is the
//! parent's own link-local address; without one there is no probe.

use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use pnet::packet::MutablePacket;
use pnet::packet::Packet;
use pnet::packet::ethernet::{EtherTypes, EthernetPacket, MutableEthernetPacket};
use pnet::packet::icmpv6::{Icmpv6Code, Icmpv6Packet, Icmpv6Types, MutableIcmpv6Packet};
use pnet::packet::ip::IpNextHeaderProtocols;
use pnet::packet::ipv6::{Ipv6Packet, MutableIpv6Packet};
use pnet::util::MacAddr;
use tokio::io::unix::AsyncFd;

/// How long answers are awaited. A host on the segment answers within a millisecond; the
/// rest is slack for a loaded node.
pub const MAC_PROBE_WAIT: Duration = Duration::from_millis(50);

/// `ff02::1`, all nodes (RFC 4291 §2.7.1).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_LEN: usize = 14;
const IPV6_LEN: usize = 40;
/// ICMPv6 echo: type, code, checksum, identifier, sequence, 8 bytes of data.
const ECHO_LEN: usize = 16;

/// The probe frame: Ethernet dst `mac` (unicast: no other NIC takes it), src `src_mac`;
/// IPv6 `src_ip` (the parent's link-local) to `ff02::1`, hop limit 255; ICMPv6 Echo Request
/// with identifier `ident`, sequence 1, data `vipd-mac`, checksum over the RFC 8200 §8.1
/// pseudo-header. 70 bytes.
pub fn echo_frame(src_mac: [u8; 6], src_ip: Ipv6Addr, mac: [u8; 6], ident: u16) -> Vec<u8> {
    let mut buf = vec![0u8; ETH_LEN + IPV6_LEN + ECHO_LEN];
    if let Some(mut eth) = MutableEthernetPacket::new(&mut buf) {
        eth.set_destination(MacAddr::from(mac));
        eth.set_source(MacAddr::from(src_mac));
        eth.set_ethertype(EtherTypes::Ipv6);
        if let Some(mut ip6) = MutableIpv6Packet::new(eth.payload_mut()) {
            ip6.set_version(6);
            ip6.set_payload_length(ECHO_LEN as u16);
            ip6.set_next_header(IpNextHeaderProtocols::Icmpv6);
            ip6.set_hop_limit(255);
            ip6.set_source(src_ip);
            ip6.set_destination(ALL_NODES);
            if let Some(mut echo) = MutableIcmpv6Packet::new(ip6.payload_mut()) {
                echo.set_icmpv6_type(Icmpv6Types::EchoRequest);
                echo.set_icmpv6_code(Icmpv6Code(0));
                let mut rest = [0u8; 12];
                rest[..2].copy_from_slice(&ident.to_be_bytes());
                rest[2..4].copy_from_slice(&1u16.to_be_bytes());
                rest[4..].copy_from_slice(b"vipd-mac");
                echo.set_payload(&rest);
                echo.set_checksum(0);
            }
            let sum = Icmpv6Packet::new(ip6.payload())
                .map(|p| pnet::packet::icmpv6::checksum(&p, &src_ip, &ALL_NODES));
            if let (Some(sum), Some(mut echo)) = (sum, MutableIcmpv6Packet::new(ip6.payload_mut()))
            {
                echo.set_checksum(sum);
            }
        }
    }
    buf
}

/// The IPv6 source of `frame` when it is an IPv6 frame sent from `mac`; `None` otherwise.
/// Pure.
pub fn answer_from(frame: &[u8], mac: [u8; 6]) -> Option<Ipv6Addr> {
    let eth = EthernetPacket::new(frame)?;
    if eth.get_source() != MacAddr::from(mac) || eth.get_ethertype() != EtherTypes::Ipv6 {
        return None;
    }
    Ipv6Packet::new(eth.payload()).map(|ip6| ip6.get_source())
}

/// Sends [`echo_frame`] on interface `ifindex` (MAC `src_mac`, link-local `src_ip`) and
/// returns the IPv6 source of the first IPv6 frame from `mac` that arrives there within
/// `wait`; `None` when none does.
///
/// # Errors
/// The step that failed and the OS error (opening or binding the `AF_PACKET` socket needs
/// CAP_NET_RAW; sending).
pub async fn mac_answers(
    ifindex: u32,
    src_mac: [u8; 6],
    src_ip: Ipv6Addr,
    mac: [u8; 6],
    wait: Duration,
) -> Result<Option<Ipv6Addr>, (&'static str, std::io::Error)> {
    let sock = super::packet::bound_packet_socket(ifindex, socket2::Type::RAW, ETH_P_IPV6)?;
    sock.set_nonblocking(true)
        .map_err(|e| ("make the socket non-blocking", e))?;
    // SAFETY: the socket2 socket owns its descriptor and moves into the AsyncFd, which owns
    // it until dropped; `as_raw_fd` always returns that same descriptor.
    let fd = unsafe { AsyncFd::register(sock) }
        .map_err(|e| ("register the socket", e.into_parts().1))?;
    let ident = u16::try_from(std::process::id() & 0xffff).unwrap_or(0);
    let frame = echo_frame(src_mac, src_ip, mac, ident);
    // SAFETY: `frame` is valid for its length; the socket is bound to the interface.
    let n = unsafe {
        libc::send(
            fd.get_ref().as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
        )
    };
    if n < 0 {
        return Err(("send the echo request", std::io::Error::last_os_error()));
    }
    let listen = async {
        let mut buf = vec![0u8; 2048];
        loop {
            let Ok(mut guard) = fd.readable().await else {
                return None;
            };
            let got = guard.try_io(|inner| {
                // SAFETY: `buf` is valid for `buf.len()` bytes.
                let n = unsafe {
                    libc::recv(
                        inner.get_ref().as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                    )
                };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(usize::try_from(n).unwrap_or(0))
                }
            });
            // A failed read (would block: try again on the next readiness) is not an answer.
            if let Ok(Ok(n)) = got
                && let Some(ip) = buf.get(..n).and_then(|f| answer_from(f, mac))
            {
                return Some(ip);
            }
        }
    };
    Ok(tokio::time::timeout(wait, listen).await.ok().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
    const MAC: [u8; 6] = [0x00, 0x00, 0x6c, 0x12, 0x34, 0x56];

    #[test]
    fn echo_frame_is_an_icmpv6_echo_to_all_nodes_sent_to_the_mac_alone() {
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        let f = echo_frame(SRC, ll, MAC, 0x0102);
        assert_eq!(f.len(), 70);
        let eth = EthernetPacket::new(&f).unwrap();
        assert_eq!(eth.get_destination(), MacAddr::from(MAC));
        assert_eq!(eth.get_source(), MacAddr::from(SRC));
        let ip6 = Ipv6Packet::new(eth.payload()).unwrap();
        assert_eq!(ip6.get_destination(), ALL_NODES);
        assert_eq!(ip6.get_source(), ll);
        assert_eq!(ip6.get_next_header(), IpNextHeaderProtocols::Icmpv6);
        let icmp = Icmpv6Packet::new(ip6.payload()).unwrap();
        assert_eq!(icmp.get_icmpv6_type(), Icmpv6Types::EchoRequest);
        assert_eq!(
            icmp.get_checksum(),
            pnet::packet::icmpv6::checksum(&icmp, &ll, &ALL_NODES)
        );
        assert_ne!(icmp.get_checksum(), 0);
        assert_eq!(&icmp.payload()[..4], &[0x01, 0x02, 0x00, 0x01]);
    }

    #[test]
    fn only_ipv6_frames_from_the_mac_are_answers() {
        let ll: Ipv6Addr = "fe80::6c:12ff:fe34:5678".parse().unwrap();
        // An answer from MAC (the same frame shape, addressed the other way).
        let reply = echo_frame(MAC, ll, SRC, 1);
        assert_eq!(answer_from(&reply, MAC), Some(ll));
        // Our own request, or another host's frame, is not.
        assert_eq!(answer_from(&echo_frame(SRC, ll, MAC, 1), MAC), None);
        let mut arp = reply.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(answer_from(&arp, MAC), None);
        assert_eq!(answer_from(&reply[..10], MAC), None);
    }
}
