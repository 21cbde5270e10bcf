//! Announcements: gratuitous ARP (IPv4) and unsolicited neighbour advertisement (IPv6).
//!
//! The frame builders are pure (bytes in, bytes out) and unit-tested by parsing the frames
//! back; [`RawAnnouncer`] only puts them on the wire through the process's send-only
//! `AF_PACKET` socket ([`super::packet::send_raw`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use pnet::packet::MutablePacket;
use pnet::packet::arp::{ArpHardwareTypes, ArpOperations, MutableArpPacket};
use pnet::packet::ethernet::{EtherTypes, MutableEthernetPacket};
use pnet::packet::icmpv6::ndp::{
    MutableNeighborAdvertPacket, NdpOption, NdpOptionTypes, NeighborAdvertFlags,
};
use pnet::packet::icmpv6::{self, Icmpv6Code, Icmpv6Packet, Icmpv6Types};
use pnet::packet::ip::IpNextHeaderProtocols;
use pnet::packet::ipv6::MutableIpv6Packet;
use pnet::util::MacAddr;

use super::{Announcer, LinkInfo, NetError, Vip};

/// Ethernet header length in bytes.
pub(super) const ETH_LEN: usize = 14;
/// ARP payload length for Ethernet/IPv4 in bytes.
const ARP_LEN: usize = 28;
/// IPv6 header length in bytes.
pub(super) const IPV6_LEN: usize = 40;
/// Neighbour advertisement (24 bytes) plus one 8-byte target link-layer address option.
const NA_LEN: usize = 24 + 8;
/// IPv6 all-nodes multicast address (RFC 4291 §2.7.1).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// Ethernet address of ff02::1 (RFC 2464 §7: 33:33 + low 32 bits).
const ALL_NODES_MAC: MacAddr = MacAddr(0x33, 0x33, 0, 0, 0, 1);

pub(crate) fn mac_of(mac: [u8; 6]) -> MacAddr {
    MacAddr(mac[0], mac[1], mac[2], mac[3], mac[4], mac[5])
}

/// A gratuitous ARP frame (42 bytes: Ethernet + ARP, no padding; the NIC pads to 60) in ARP
/// *request* form, as RFC 5227 §3 ("ARP Announcement") and RFC 5944 §4.6 describe and as the
/// Linux kernel and kube-vip send it: `arp_request_frame` with sender IP = target IP = `ip`.
pub fn garp_frame(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    arp_request_frame(mac, ip, ip)
}

/// An Ethernet/IPv4 ARP request frame (RFC 826; 42 bytes: Ethernet + ARP, no padding; the NIC
/// pads to 60): Ethernet dst `ff:ff:ff:ff:ff:ff`, src `mac`, type 0x0806; ARP htype 1, ptype
/// 0x0800, op 1 (request), sender MAC = `mac`, sender IP `sender_ip`, target MAC
/// `00:00:00:00:00:00`, target IP `target_ip`. The one builder behind the gratuitous ARP
/// ([`garp_frame`]) and the RFC 5227 probe ([`super::conflict::arp_probe_frame`]).
pub(crate) fn arp_request_frame(mac: [u8; 6], sender_ip: Ipv4Addr, target_ip: Ipv4Addr) -> Vec<u8> {
    let mut buf = vec![0u8; ETH_LEN + ARP_LEN];
    if let Some(mut eth) = MutableEthernetPacket::new(&mut buf) {
        eth.set_destination(MacAddr::broadcast());
        eth.set_source(mac_of(mac));
        eth.set_ethertype(EtherTypes::Arp);
        if let Some(mut arp) = MutableArpPacket::new(eth.payload_mut()) {
            arp.set_hardware_type(ArpHardwareTypes::Ethernet);
            arp.set_protocol_type(EtherTypes::Ipv4);
            arp.set_hw_addr_len(6);
            arp.set_proto_addr_len(4);
            arp.set_operation(ArpOperations::Request);
            arp.set_sender_hw_addr(mac_of(mac));
            arp.set_sender_proto_addr(sender_ip);
            arp.set_target_hw_addr(MacAddr::zero());
            arp.set_target_proto_addr(target_ip);
        }
    }
    buf
}

/// An unsolicited neighbour advertisement frame (RFC 4861 §7.2.6; 86 bytes), as the Linux
/// kernel's `ndisc_send_unsol_na` sends it: Ethernet dst `33:33:00:00:00:01`, src `mac`;
/// IPv6 src = `ip` (the address being announced), dst `ff02::1`, hop limit 255; ICMPv6 type 136
/// code 0 with Router and Solicited clear and Override set, target = `ip`, one target
/// link-layer address option (type 2, length 1 = 8 bytes) carrying `mac`; ICMPv6 checksum over
/// the RFC 8200 §8.1 pseudo-header. Built by `na_frame`.
pub fn unsolicited_na_frame(mac: [u8; 6], ip: Ipv6Addr) -> Vec<u8> {
    na_frame(
        mac,
        ALL_NODES_MAC.octets(),
        ip,
        ALL_NODES,
        NeighborAdvertFlags::Override,
    )
}

/// A neighbour advertisement frame (RFC 4861 §4.4; 86 bytes) for `target`: Ethernet dst
/// `eth_dst`, src `mac`, type 0x86dd; IPv6 src = `target` (the address advertised), dst
/// `dst`, hop limit 255; ICMPv6 type 136 code 0 with `flags` (the R/S/O byte:
/// `NeighborAdvertFlags::{Router, Solicited, Override}`), target = `target`, one target
/// link-layer address option (type 2, length 1 = 8 bytes) carrying `mac`; ICMPv6 checksum
/// over the RFC 8200 §8.1 pseudo-header. The one builder behind the unsolicited
/// advertisement ([`unsolicited_na_frame`]) and the answers of the neighbour discovery
/// responder ([`super::nd_responder::advert_frame`]).
pub(crate) fn na_frame(
    mac: [u8; 6],
    eth_dst: [u8; 6],
    target: Ipv6Addr,
    dst: Ipv6Addr,
    flags: u8,
) -> Vec<u8> {
    let mut buf = vec![0u8; ETH_LEN + IPV6_LEN + NA_LEN];
    if let Some(mut eth) = MutableEthernetPacket::new(&mut buf) {
        eth.set_destination(mac_of(eth_dst));
        eth.set_source(mac_of(mac));
        eth.set_ethertype(EtherTypes::Ipv6);
        if let Some(mut ip6) = MutableIpv6Packet::new(eth.payload_mut()) {
            ip6.set_version(6);
            ip6.set_traffic_class(0);
            ip6.set_flow_label(0);
            ip6.set_payload_length(NA_LEN as u16);
            ip6.set_next_header(IpNextHeaderProtocols::Icmpv6);
            ip6.set_hop_limit(255);
            ip6.set_source(target);
            ip6.set_destination(dst);
            if let Some(mut na) = MutableNeighborAdvertPacket::new(ip6.payload_mut()) {
                na.set_icmpv6_type(Icmpv6Types::NeighborAdvert);
                na.set_icmpv6_code(Icmpv6Code(0));
                na.set_flags(flags);
                na.set_reserved(0);
                na.set_target_addr(target);
                na.set_options(&[NdpOption {
                    option_type: NdpOptionTypes::TargetLLAddr,
                    length: 1,
                    data: mac.to_vec(),
                }]);
                na.set_checksum(0);
            }
            let sum =
                Icmpv6Packet::new(ip6.payload_mut()).map(|p| icmpv6::checksum(&p, &target, &dst));
            if let (Some(sum), Some(mut na)) =
                (sum, MutableNeighborAdvertPacket::new(ip6.payload_mut()))
            {
                na.set_checksum(sum);
            }
        }
    }
    buf
}

/// [`Announcer`] over the process's send-only `AF_PACKET` `SOCK_RAW` socket
/// ([`super::packet::send_raw`]): it receives nothing, so no receive queue fills while vipd
/// holds a VIP. Needs `CAP_NET_RAW`. The socket sends in the network namespace of the
/// calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawAnnouncer;

impl Announcer for RawAnnouncer {
    fn announce(&self, link: &LinkInfo, vip: Vip) -> Result<(), NetError> {
        let frame = match vip.addr {
            IpAddr::V4(ip) => garp_frame(link.mac, ip),
            IpAddr::V6(ip) => unsolicited_na_frame(link.mac, ip),
        };
        send_frame(link, vip, &frame)
    }
}

/// Sends one Ethernet frame on `link` through the process's send-only `AF_PACKET` socket
/// ([`super::packet::send_raw`]: opened once per network namespace, nothing is read).
/// `vip` names the address the frame is about, for the error.
///
/// # Errors
/// [`NetError::Announce`] when the socket cannot be opened or the send fails.
pub(crate) fn send_frame(link: &LinkInfo, vip: Vip, frame: &[u8]) -> Result<(), NetError> {
    super::packet::send_raw(link.index, frame).map_err(|source| NetError::Announce {
        vip,
        ifname: link.name.clone(),
        what: "send",
        source,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pnet::packet::Packet;
    use pnet::packet::arp::ArpPacket;
    use pnet::packet::ethernet::EthernetPacket;
    use pnet::packet::icmpv6::ndp::NeighborAdvertPacket;
    use pnet::packet::ipv6::Ipv6Packet;

    const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    #[test]
    fn garp_fields() {
        let ip = Ipv4Addr::new(192, 0, 2, 10);
        let f = garp_frame(MAC, ip);
        assert_eq!(f.len(), 42);
        let eth = EthernetPacket::new(&f).unwrap();
        assert_eq!(eth.get_destination(), MacAddr::broadcast());
        assert_eq!(eth.get_source(), mac_of(MAC));
        assert_eq!(eth.get_ethertype(), EtherTypes::Arp);
        let arp = ArpPacket::new(eth.payload()).unwrap();
        assert_eq!(arp.get_hardware_type(), ArpHardwareTypes::Ethernet);
        assert_eq!(arp.get_protocol_type(), EtherTypes::Ipv4);
        assert_eq!(arp.get_hw_addr_len(), 6);
        assert_eq!(arp.get_proto_addr_len(), 4);
        assert_eq!(arp.get_operation(), ArpOperations::Request);
        assert_eq!(arp.get_sender_hw_addr(), mac_of(MAC));
        assert_eq!(arp.get_sender_proto_addr(), ip);
        assert_eq!(arp.get_target_hw_addr(), MacAddr::zero());
        assert_eq!(arp.get_target_proto_addr(), ip);
        // Raw bytes, independent of pnet's accessors.
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[14..22], &[0, 1, 0x08, 0, 6, 4, 0, 1]);
    }

    /// RFC 1071 one's complement sum over pseudo-header + ICMPv6 message: 0xffff when valid.
    pub(crate) fn icmpv6_sum_ok(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> bool {
        let mut data = Vec::new();
        data.extend_from_slice(&src.octets());
        data.extend_from_slice(&dst.octets());
        data.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        data.extend_from_slice(&[0, 0, 0, 58]);
        data.extend_from_slice(msg);
        if data.len() % 2 == 1 {
            data.push(0);
        }
        let mut sum: u32 = data
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    }

    #[test]
    fn unsolicited_na_fields() {
        let ip: Ipv6Addr = "2001:db8::10".parse().unwrap();
        let f = unsolicited_na_frame(MAC, ip);
        assert_eq!(f.len(), 14 + 40 + 32);
        let eth = EthernetPacket::new(&f).unwrap();
        assert_eq!(eth.get_destination(), MacAddr(0x33, 0x33, 0, 0, 0, 1));
        assert_eq!(eth.get_source(), mac_of(MAC));
        assert_eq!(eth.get_ethertype(), EtherTypes::Ipv6);
        let ip6 = Ipv6Packet::new(eth.payload()).unwrap();
        assert_eq!(ip6.get_version(), 6);
        assert_eq!(ip6.get_payload_length(), 32);
        assert_eq!(ip6.get_next_header(), IpNextHeaderProtocols::Icmpv6);
        assert_eq!(ip6.get_hop_limit(), 255);
        assert_eq!(ip6.get_source(), ip);
        assert_eq!(ip6.get_destination(), ALL_NODES);
        let na = NeighborAdvertPacket::new(ip6.payload()).unwrap();
        assert_eq!(na.get_icmpv6_type(), Icmpv6Types::NeighborAdvert);
        assert_eq!(na.get_icmpv6_code(), Icmpv6Code(0));
        assert_eq!(na.get_flags(), NeighborAdvertFlags::Override);
        assert_eq!(na.get_flags() & NeighborAdvertFlags::Solicited, 0);
        assert_eq!(na.get_flags() & NeighborAdvertFlags::Router, 0);
        assert_eq!(na.get_target_addr(), ip);
        let opts = na.get_options();
        assert_eq!(opts.len(), 1);
        assert_eq!(opts[0].option_type, NdpOptionTypes::TargetLLAddr);
        assert_eq!(opts[0].length, 1);
        assert_eq!(opts[0].data, MAC.to_vec());
        // Raw bytes: type, code, flags byte (O = 0x20), option header.
        let icmp = &f[54..];
        assert_eq!(icmp[0], 136);
        assert_eq!(icmp[1], 0);
        assert_eq!(icmp[4], 0x20);
        assert_eq!(&icmp[24..26], &[2, 1]);
        assert!(icmpv6_sum_ok(ip, ALL_NODES, icmp), "bad ICMPv6 checksum");
        // And the checksum is not trivially zero / would catch corruption.
        let mut bad = icmp.to_vec();
        bad[10] ^= 1;
        assert!(!icmpv6_sum_ok(ip, ALL_NODES, &bad));
    }
}
