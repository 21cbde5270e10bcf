//! What an address may be as a VIP, per family: one rule for the control-plane VIP
//! (`address`, `vip_address`) and for Service addresses (`spec.loadBalancerIP`, the
//! `kube-vip.io/loadbalancerIPs` annotation).
//!
//! The classes follow the IANA special-purpose registries (RFC 6890) as far as they matter
//! on a LAN: an address a node cannot answer ARP / neighbour solicitations for on behalf of
//! others, or one whose meaning is ambiguous, is refused. Documentation and private ranges
//! (RFC 5737, RFC 1918, RFC 3849, RFC 4193) are ordinary VIPs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not usable as a VIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotAVip {
    /// `0.0.0.0` or `::` (in a Service address this asks for DHCP, decided by the caller).
    Unspecified,
    /// Loopback (`127.0.0.0/8`, `::1`).
    Loopback,
    /// Multicast (`224.0.0.0/4`, `ff00::/8`).
    Multicast,
    /// Link-local (`169.254.0.0/16`, `fe80::/10`): not routed, and the kernel's own.
    LinkLocal,
    /// The limited broadcast address `255.255.255.255`.
    Broadcast,
    /// `0.0.0.0/8` other than `0.0.0.0` itself ("this network", RFC 1122 3.2.1.3).
    ThisNetwork,
    /// IPv4-mapped (`::ffff:192.0.2.1`, RFC 4291 2.5.5.2) or deprecated IPv4-compatible
    /// (`::192.0.2.1`) IPv6: ambiguous, the IPv4 form must be written.
    Ipv4InIpv6,
}

impl fmt::Display for NotAVip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotAVip::Unspecified => "the unspecified address",
            NotAVip::Loopback => "a loopback address",
            NotAVip::Multicast => "a multicast address",
            NotAVip::LinkLocal => "a link-local address",
            NotAVip::Broadcast => "the broadcast address",
            NotAVip::ThisNetwork => "an address in 0.0.0.0/8",
            NotAVip::Ipv4InIpv6 => "an IPv4 address written as IPv6 (write the IPv4 form)",
        })
    }
}

/// Checks that `ip` may be a VIP, whatever its source.
///
/// # Errors
/// The [`NotAVip`] class the address falls in.
pub(crate) fn check_vip(ip: IpAddr) -> Result<(), NotAVip> {
    if ip.is_unspecified() {
        return Err(NotAVip::Unspecified);
    }
    match ip {
        IpAddr::V4(v4) => check_v4(v4),
        IpAddr::V6(v6) => check_v6(v6),
    }
}

fn check_v4(ip: Ipv4Addr) -> Result<(), NotAVip> {
    if ip.is_loopback() {
        Err(NotAVip::Loopback)
    } else if ip.is_multicast() {
        Err(NotAVip::Multicast)
    } else if ip.is_link_local() {
        Err(NotAVip::LinkLocal)
    } else if ip.is_broadcast() {
        Err(NotAVip::Broadcast)
    } else if ip.octets()[0] == 0 {
        Err(NotAVip::ThisNetwork)
    } else {
        Ok(())
    }
}

fn check_v6(ip: Ipv6Addr) -> Result<(), NotAVip> {
    let seg = ip.segments();
    if ip.is_loopback() {
        Err(NotAVip::Loopback)
    } else if ip.is_multicast() {
        Err(NotAVip::Multicast)
    } else if seg[0] & 0xffc0 == 0xfe80 {
        Err(NotAVip::LinkLocal)
    } else if ip.to_ipv4_mapped().is_some() || seg[..6].iter().all(|s| *s == 0) {
        // ::ffff:a.b.c.d (mapped) or ::a.b.c.d (compatible; :: and ::1 handled above).
        Err(NotAVip::Ipv4InIpv6)
    } else {
        Ok(())
    }
}

/// Per address family prefix lengths for VIPs (`vip_subnet`, e.g. `32` or `32,128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VipSubnet {
    /// Prefix length for IPv4 VIPs (0..=32, default 32).
    pub v4: u8,
    /// Prefix length for IPv6 VIPs (0..=128, default 128).
    pub v6: u8,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_verdict_per_address_class() {
        let cases: &[(&str, Result<(), NotAVip>)] = &[
            ("192.0.2.10", Ok(())),
            ("10.0.0.1", Ok(())),
            ("100.64.0.1", Ok(())),
            ("2001:db8::10", Ok(())),
            ("fd00::1", Ok(())),
            ("0.0.0.0", Err(NotAVip::Unspecified)),
            ("::", Err(NotAVip::Unspecified)),
            ("127.0.0.1", Err(NotAVip::Loopback)),
            ("127.255.0.9", Err(NotAVip::Loopback)),
            ("::1", Err(NotAVip::Loopback)),
            ("224.0.0.18", Err(NotAVip::Multicast)),
            ("239.1.1.1", Err(NotAVip::Multicast)),
            ("ff02::1", Err(NotAVip::Multicast)),
            ("169.254.1.1", Err(NotAVip::LinkLocal)),
            ("fe80::1", Err(NotAVip::LinkLocal)),
            ("febf::1", Err(NotAVip::LinkLocal)),
            ("255.255.255.255", Err(NotAVip::Broadcast)),
            ("0.1.2.3", Err(NotAVip::ThisNetwork)),
            ("::ffff:192.0.2.1", Err(NotAVip::Ipv4InIpv6)),
            ("::192.0.2.1", Err(NotAVip::Ipv4InIpv6)),
        ];
        for (text, want) in cases {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(check_vip(ip), *want, "{text}");
        }
    }
}
