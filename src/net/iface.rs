//! Interface choice for a VIP when `vip_interface` is empty (scenario S27), as a pure function
//! over the node's addresses and default routes.

use std::net::IpAddr;

use super::AddrInfo;

/// Longest Linux interface name in bytes (`IFNAMSIZ - 1`).
pub const IFNAME_MAX: usize = 15;

/// The rule [`is_ifname`] checks, for error messages.
pub const IFNAME_RULE: &str = "1 to 15 bytes, not '.' or '..', no '/', ':', NUL or whitespace";

/// `true` when the kernel accepts `name` as an interface name (its `dev_valid_name`): 1 to
/// [`IFNAME_MAX`] bytes, not `.` or `..`, and no `/`, `:`, NUL or whitespace.
pub fn is_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= IFNAME_MAX
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
}

/// A default route (`0.0.0.0/0` or `::/0`) of the main routing table, reduced to what interface
/// choice needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultRoute {
    /// `true` for `::/0`, `false` for `0.0.0.0/0`.
    pub ipv6: bool,
    /// Route metric (`RTA_PRIORITY`); lower wins, as in the kernel's route selection.
    pub metric: u32,
    /// Output interfaces in the kernel's order: `[RTA_OIF]` for a single-path route, the
    /// nexthops' devices (`RTA_MULTIPATH`) for a multipath route. Empty when the route uses a
    /// nexthop object (`RTA_NH_ID`), which is not resolved here.
    pub devices: Vec<u32>,
}

/// `true` when `addr` lies in `net/prefix` (same family; prefix clamped to the family width).
pub(super) fn in_subnet(addr: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let p = u32::from(prefix.min(32));
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            (u32::from(a) & mask) == (u32::from(n) & mask)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let p = u32::from(prefix.min(128));
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            (u128::from(a) & mask) == (u128::from(n) & mask)
        }
        _ => false,
    }
}

/// An address that cannot be a VIP on a subnet (scenario S39): hosts on the segment do not
/// send unicast frames to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubnetEdge {
    /// The subnet's network address (all host bits zero): IPv4 on prefixes up to /30, and
    /// IPv6's Subnet-Router anycast address (RFC 4291 2.6.1) on prefixes up to /126.
    Network,
    /// The subnet's broadcast address (all host bits one): IPv4 on prefixes up to /30 (a
    /// /31 has none, RFC 3021; IPv6 has no broadcast).
    Broadcast,
}

impl std::fmt::Display for SubnetEdge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SubnetEdge::Network => "network address",
            SubnetEdge::Broadcast => "broadcast address",
        })
    }
}

/// Whether `addr` is the network or broadcast address of the subnet `addr/prefix` (the one
/// rule, used for the VIP's own prefix and for the node's connected subnets alike):
/// IPv4 prefixes /31 and /32 and IPv6 prefixes /127 and /128 have neither; a prefix longer
/// than the family width is clamped.
pub fn subnet_edge(addr: IpAddr, prefix: u8) -> Option<SubnetEdge> {
    match addr {
        IpAddr::V4(a) => {
            let p = u32::from(prefix.min(32));
            if p >= 31 {
                return None;
            }
            let host = u32::MAX >> p;
            let a = u32::from(a);
            if a & host == 0 {
                Some(SubnetEdge::Network)
            } else if a & host == host {
                Some(SubnetEdge::Broadcast)
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let p = u32::from(prefix.min(128));
            if p >= 127 {
                return None;
            }
            let host = u128::MAX >> p;
            (u128::from(a) & host == 0).then_some(SubnetEdge::Network)
        }
    }
}

/// The first subnet among `subnets` (address, prefix) that holds `addr` and of which
/// `addr` is the network or broadcast address ([`subnet_edge`]), with that subnet's
/// prefix. `subnets` are the VIP's own prefix (`addr/vip_subnet`) and the node's connected
/// subnets (its addresses that are not ours).
pub fn subnet_edge_of(addr: IpAddr, subnets: &[(IpAddr, u8)]) -> Option<(SubnetEdge, u8)> {
    subnets
        .iter()
        .filter(|(net, prefix)| in_subnet(addr, *net, *prefix))
        .find_map(|(_, prefix)| subnet_edge(addr, *prefix).map(|e| (e, *prefix)))
}

/// The one network / broadcast rule for a VIP (control plane and Services alike): the
/// first of `addr/prefix` (the VIP's own prefix, `vip_subnet`) and the node's `connected`
/// subnets (address, prefix; its addresses that are not vipd's) of which `addr` is the
/// network or broadcast address ([`subnet_edge_of`]), with that subnet's prefix.
pub fn vip_subnet_edge(
    addr: IpAddr,
    prefix: u8,
    connected: &[(IpAddr, u8)],
) -> Option<(SubnetEdge, u8)> {
    let mut subnets = Vec::with_capacity(connected.len() + 1);
    subnets.push((addr, prefix));
    subnets.extend_from_slice(connected);
    subnet_edge_of(addr, &subnets)
}

/// `addr` with its host bits (beyond `prefix`, clamped to the family width) cleared: the
/// network address of its subnet, for messages such as `192.0.2.0/24`.
pub fn network_of(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let p = u32::from(prefix.min(32));
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let p = u32::from(prefix.min(128));
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

/// Interface choice (S27): the index of the interface whose connected subnet holds `addr`
/// (longest prefix wins; on a tie the first address in `addrs`; addresses that are `ours`
/// are ignored, so a VIP never selects itself), else the first device of the lowest-metric
/// default route of `addr`'s family (for a multipath route: the first nexthop's device; on
/// equal metrics the first route in `defaults`). `None` when neither exists.
///
/// `addrs` is what [`super::Kernel::addresses`] returns; `defaults` the main-table default
/// routes in dump order. Addresses in `dad_failed` state are skipped (the kernel does not
/// install their prefix route either).
pub fn choose_interface_from(
    addr: IpAddr,
    addrs: &[AddrInfo],
    defaults: &[DefaultRoute],
) -> Option<u32> {
    let mut best: Option<(u8, u32)> = None;
    for a in addrs {
        if a.ours || a.dad_failed || !in_subnet(addr, a.vip.addr, a.vip.prefix) {
            continue;
        }
        if best.is_none_or(|(p, _)| a.vip.prefix > p) {
            best = Some((a.vip.prefix, a.ifindex));
        }
    }
    if let Some((_, ifindex)) = best {
        return Some(ifindex);
    }
    let mut route: Option<&DefaultRoute> = None;
    for r in defaults {
        if r.ipv6 != addr.is_ipv6() || r.devices.is_empty() {
            continue;
        }
        if route.is_none_or(|b| r.metric < b.metric) {
            route = Some(r);
        }
    }
    route.and_then(|r| r.devices.first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Vip;

    #[test]
    fn interface_names_checked_like_the_kernel() {
        for ok in ["eth0", "enp0s31f6.100", "vip-0123abcd", "a23456789012345"] {
            assert!(is_ifname(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a234567890123456",
            "eth 0",
            "a/b",
            "eth0:1",
            "a\0b",
        ] {
            assert!(!is_ifname(bad), "{bad:?}");
        }
    }

    fn addr(ifindex: u32, a: &str, prefix: u8, ours: bool) -> AddrInfo {
        let vip = Vip {
            addr: a.parse().unwrap(),
            prefix,
        };
        AddrInfo::plain(ifindex, vip, ours)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn connected_subnet_wins_over_default_route() {
        let addrs = [addr(2, "192.0.2.11", 24, false)];
        let defaults = [DefaultRoute {
            ipv6: false,
            metric: 0,
            devices: vec![3],
        }];
        assert_eq!(
            choose_interface_from(ip("192.0.2.10"), &addrs, &defaults),
            Some(2)
        );
        assert_eq!(
            choose_interface_from(ip("198.51.100.1"), &addrs, &defaults),
            Some(3)
        );
    }

    #[test]
    fn subnet_edges_v4_v6() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            subnet_edge(ip("192.0.2.255"), 24),
            Some(SubnetEdge::Broadcast)
        );
        assert_eq!(subnet_edge(ip("192.0.2.0"), 24), Some(SubnetEdge::Network));
        assert_eq!(subnet_edge(ip("192.0.2.20"), 24), None);
        assert_eq!(
            subnet_edge(ip("192.0.2.127"), 25),
            Some(SubnetEdge::Broadcast)
        );
        assert_eq!(
            subnet_edge(ip("192.0.2.128"), 25),
            Some(SubnetEdge::Network)
        );
        assert_eq!(
            subnet_edge(ip("192.0.2.3"), 30),
            Some(SubnetEdge::Broadcast)
        );
        // /31 (RFC 3021) and /32: both addresses usable.
        assert_eq!(subnet_edge(ip("192.0.2.0"), 31), None);
        assert_eq!(subnet_edge(ip("192.0.2.1"), 31), None);
        assert_eq!(subnet_edge(ip("192.0.2.255"), 32), None);
        assert_eq!(subnet_edge(ip("192.0.2.0"), 40), None);
        // IPv6: no broadcast; the Subnet-Router anycast address is refused up to /126.
        assert_eq!(subnet_edge(ip("2001:db8::ffff:ffff:ffff:ffff"), 64), None);
        assert_eq!(subnet_edge(ip("2001:db8::"), 64), Some(SubnetEdge::Network));
        assert_eq!(
            subnet_edge(ip("2001:db8::1:0"), 112),
            Some(SubnetEdge::Network)
        );
        assert_eq!(subnet_edge(ip("2001:db8::"), 127), None);
        assert_eq!(subnet_edge(ip("2001:db8::"), 128), None);
        assert_eq!(subnet_edge(ip("2001:db8::50"), 64), None);
        // Against the node's subnets: only subnets holding the address count.
        let subnets = [
            (ip("192.0.2.255"), 32),
            (ip("192.0.2.11"), 24),
            (ip("198.51.100.1"), 24),
        ];
        assert_eq!(
            subnet_edge_of(ip("192.0.2.255"), &subnets),
            Some((SubnetEdge::Broadcast, 24))
        );
        assert_eq!(
            subnet_edge_of(ip("192.0.2.0"), &subnets),
            Some((SubnetEdge::Network, 24))
        );
        assert_eq!(subnet_edge_of(ip("192.0.2.20"), &subnets), None);
        assert_eq!(subnet_edge_of(ip("203.0.113.255"), &subnets), None);
        assert_eq!(SubnetEdge::Broadcast.to_string(), "broadcast address");
    }

    #[test]
    fn longest_prefix_wins_regardless_of_order() {
        let addrs = [
            addr(2, "192.0.2.11", 24, false),
            addr(3, "192.0.2.130", 25, false),
            addr(4, "192.0.0.1", 16, false),
        ];
        assert_eq!(
            choose_interface_from(ip("192.0.2.200"), &addrs, &[]),
            Some(3)
        );
        assert_eq!(
            choose_interface_from(ip("192.0.2.20"), &addrs, &[]),
            Some(2)
        );
        assert_eq!(choose_interface_from(ip("192.0.9.9"), &addrs, &[]), Some(4));
    }

    #[test]
    fn our_own_addresses_and_dadfailed_are_ignored() {
        let mut failed = addr(5, "2001:db8::1", 64, false);
        failed.dad_failed = true;
        let addrs = [
            addr(7, "192.0.2.10", 32, true),
            addr(7, "192.0.2.0", 24, true),
            failed,
        ];
        assert_eq!(choose_interface_from(ip("192.0.2.10"), &addrs, &[]), None);
        assert_eq!(choose_interface_from(ip("2001:db8::10"), &addrs, &[]), None);
    }

    #[test]
    fn multipath_takes_first_nexthop_and_lowest_metric() {
        let defaults = [
            DefaultRoute {
                ipv6: false,
                metric: 100,
                devices: vec![9],
            },
            DefaultRoute {
                ipv6: false,
                metric: 10,
                devices: vec![5, 4],
            },
            DefaultRoute {
                ipv6: false,
                metric: 10,
                devices: vec![6],
            },
        ];
        assert_eq!(
            choose_interface_from(ip("203.0.113.1"), &[], &defaults),
            Some(5)
        );
    }

    #[test]
    fn family_must_match_and_no_route_is_none() {
        let addrs = [addr(2, "192.0.2.11", 24, false)];
        let defaults = [
            DefaultRoute {
                ipv6: false,
                metric: 0,
                devices: vec![2],
            },
            DefaultRoute {
                ipv6: true,
                metric: 0,
                devices: vec![],
            },
        ];
        // IPv6 VIP: no v6 subnet, the only v6 default route uses a nexthop object.
        assert_eq!(
            choose_interface_from(ip("2001:db8::10"), &addrs, &defaults),
            None
        );
        assert_eq!(choose_interface_from(ip("2001:db8::10"), &[], &[]), None);
        let v6 = [DefaultRoute {
            ipv6: true,
            metric: 1024,
            devices: vec![8],
        }];
        assert_eq!(
            choose_interface_from(ip("2001:db8::10"), &addrs, &v6),
            Some(8)
        );
    }

    #[test]
    fn subnet_math_edges() {
        assert!(in_subnet(ip("10.1.2.3"), ip("0.0.0.0"), 0));
        assert!(in_subnet(ip("192.0.2.10"), ip("192.0.2.10"), 32));
        assert!(!in_subnet(ip("192.0.2.11"), ip("192.0.2.10"), 32));
        assert!(in_subnet(ip("2001:db8::ffff"), ip("2001:db8::1"), 64));
        assert!(!in_subnet(ip("2001:db9::1"), ip("2001:db8::1"), 32));
        assert!(!in_subnet(ip("192.0.2.1"), ip("2001:db8::1"), 0));
    }
}
