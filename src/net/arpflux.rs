//! ARP flux check (scenario S36), run by `vipd manager` at start and by `vipd preflight`:
//! finds interfaces other than a VIP's that the kernel would answer ARP for the VIP on.
//!
//! Linux answers an ARP request for any local IPv4 address on whatever interface receives
//! it, unless the receiving interface's effective `arp_ignore` (the larger of
//! `net.ipv4.conf.all.arp_ignore` and `net.ipv4.conf.<if>.arp_ignore`) is 1 or more, or
//! its effective `arp_filter` (`all` OR `<if>`) is 1. An interface is at risk when it is
//! on the VIP's segment; vipd cannot see L2 segments, so it uses the subnets: another
//! interface with an address in a subnet that holds the VIP or overlaps a subnet of the
//! VIP interface. The decision ([`flux_findings`]) is pure; [`gather`] reads the kernel
//! and `/proc/sys`.
//!
//! IPv6 has no such problem (neighbour solicitations are answered only for addresses on
//! the receiving interface), so only IPv4 VIPs are checked.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use super::iface::in_subnet;
use super::{Kernel, NetError};

/// The remedy, as a shell command.
pub(crate) const REMEDY: &str = "sysctl -w net.ipv4.conf.all.arp_ignore=1";
/// The persistent form of [`REMEDY`].
pub(crate) const REMEDY_PERSISTENT: &str =
    "echo 'net.ipv4.conf.all.arp_ignore = 1' > /etc/sysctl.d/90-vipd-arp.conf";

/// `arp_ignore` / `arp_filter` of one `net.ipv4.conf.<name>` directory; `None` = could not
/// be read (treated as 0, the kernel default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArpConf {
    /// `arp_ignore` (0..=8).
    pub arp_ignore: Option<u8>,
    /// `arp_filter` (0 or 1).
    pub arp_filter: Option<u8>,
}

/// One interface with its IPv4 addresses (not vipd's) and its ARP sysctls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfaceV4 {
    /// Interface name.
    pub name: String,
    /// Addresses with prefix length (0..=32).
    pub addrs: Vec<(Ipv4Addr, u8)>,
    /// `net.ipv4.conf.<name>.*`.
    pub conf: ArpConf,
}

/// What to check: a VIP (when known) and the interface it is (or will be) placed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxTarget {
    /// The VIP, `None` to check the interface's own subnets only (Services: addresses are
    /// not known at start).
    pub vip: Option<Ipv4Addr>,
    /// The VIP interface.
    pub ifname: String,
}

/// One other interface that would answer ARP for the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxPeer {
    /// Interface name.
    pub name: String,
    /// Its address on the shared subnet.
    pub addr: (Ipv4Addr, u8),
}

/// A finding: `target` can be answered from the MACs of `peers` too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxFinding {
    /// What was checked.
    pub target: FluxTarget,
    /// The interfaces at risk, with the address that puts them on the segment.
    pub peers: Vec<FluxPeer>,
}

impl FluxFinding {
    /// The names of the interfaces at risk, comma-separated.
    pub(crate) fn peer_names(&self) -> String {
        self.peers
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One-line description for logs and preflight, saying whether the nftables guard
    /// (`guard_active`) covers it.
    pub fn message(&self, guard_active: bool) -> String {
        let peers = self
            .peers
            .iter()
            .map(|p| format!("{} ({}/{})", p.name, p.addr.0, p.addr.1))
            .collect::<Vec<_>>()
            .join(", ");
        let what = match self.target.vip {
            Some(v) => format!("VIP {v} is on {}", self.target.ifname),
            None => format!("VIPs go on {}", self.target.ifname),
        };
        let cover = if guard_active {
            "vipd's nftables table (arp vipd) drops ARP requests for its VIPs on other interfaces while vipd runs"
        } else {
            "vipd's nftables guard is off, so nothing stops it"
        };
        format!(
            "ARP flux: {what}, but {peers} share its subnet with arp_ignore=0 and arp_filter=0 (effective values of net.ipv4.conf.all and net.ipv4.conf.<interface>): the kernel answers ARP for the VIP from those interfaces' MACs too; {cover}. Fix: {REMEDY} (persistent: {REMEDY_PERSISTENT})"
        )
    }
}

/// Whether `a/prefix` holds `x`.
fn contains((a, prefix): (Ipv4Addr, u8), x: Ipv4Addr) -> bool {
    in_subnet(IpAddr::V4(x), IpAddr::V4(a), prefix)
}

/// Whether two subnets overlap (the shorter one holds the other).
fn overlaps((a, p): (Ipv4Addr, u8), (b, q): (Ipv4Addr, u8)) -> bool {
    in_subnet(IpAddr::V4(a), IpAddr::V4(b), p.min(q))
}

/// Effective `arp_ignore` of an interface: the larger of `all` and the interface's.
pub(crate) fn effective_arp_ignore(all: ArpConf, iface: ArpConf) -> u8 {
    all.arp_ignore
        .unwrap_or(0)
        .max(iface.arp_ignore.unwrap_or(0))
}

/// Effective `arp_filter` of an interface: set if set on `all` or on the interface.
pub(crate) fn effective_arp_filter(all: ArpConf, iface: ArpConf) -> bool {
    all.arp_filter.unwrap_or(0) != 0 || iface.arp_filter.unwrap_or(0) != 0
}

/// The findings for `targets`: for each, the other interfaces of `ifaces` that have an
/// address in a subnet holding the VIP, or overlapping a subnet of the target interface,
/// and whose effective `arp_ignore` is 0 and effective `arp_filter` is 0 (`all` =
/// `net.ipv4.conf.all`). Targets whose interface is not in `ifaces` are checked against
/// the VIP only. Targets without peers give no finding.
pub fn flux_findings(targets: &[FluxTarget], ifaces: &[IfaceV4], all: ArpConf) -> Vec<FluxFinding> {
    let mut out = Vec::new();
    for t in targets {
        let own: &[(Ipv4Addr, u8)] = ifaces
            .iter()
            .find(|i| i.name == t.ifname)
            .map_or(&[], |i| i.addrs.as_slice());
        let mut peers = Vec::new();
        for i in ifaces.iter().filter(|i| i.name != t.ifname) {
            if effective_arp_ignore(all, i.conf) != 0 || effective_arp_filter(all, i.conf) {
                continue;
            }
            let shared = i.addrs.iter().find(|a| {
                t.vip.is_some_and(|v| contains(**a, v)) || own.iter().any(|o| overlaps(*o, **a))
            });
            if let Some(a) = shared {
                peers.push(FluxPeer {
                    name: i.name.clone(),
                    addr: *a,
                });
            }
        }
        if !peers.is_empty() {
            out.push(FluxFinding {
                target: t.clone(),
                peers,
            });
        }
    }
    out
}

/// Reads `arp_ignore` and `arp_filter` of `/proc/sys/net/ipv4/conf/<name>/` under `root`
/// (`/proc/sys` on a real node).
pub(crate) fn read_arp_conf(root: &Path, name: &str) -> ArpConf {
    let read = |f: &str| {
        std::fs::read_to_string(root.join("net/ipv4/conf").join(name).join(f))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    ArpConf {
        arp_ignore: read("arp_ignore"),
        arp_filter: read("arp_filter"),
    }
}

/// The node's interfaces with ARP (a hardware address) and their IPv4 addresses that are
/// not vipd's, with their sysctls, and `net.ipv4.conf.all`.
///
/// # Errors
/// [`NetError`] when the addresses cannot be listed; an interface that vanished meanwhile
/// is skipped.
pub(crate) async fn gather<K: Kernel>(kernel: &K) -> Result<(Vec<IfaceV4>, ArpConf), NetError> {
    let root = Path::new("/proc/sys");
    let mut by_index: BTreeMap<u32, Vec<(Ipv4Addr, u8)>> = BTreeMap::new();
    for a in kernel.addresses(None).await? {
        if let (IpAddr::V4(v4), false) = (a.vip.addr, a.ours) {
            by_index
                .entry(a.ifindex)
                .or_default()
                .push((v4, a.vip.prefix));
        }
    }
    let mut ifaces = Vec::new();
    for (index, addrs) in by_index {
        let Ok(link) = kernel.link_by_index(index).await else {
            continue;
        };
        if link.mac == [0; 6] {
            continue;
        }
        let conf = read_arp_conf(root, &link.name);
        ifaces.push(IfaceV4 {
            name: link.name,
            addrs,
            conf,
        });
    }
    Ok((ifaces, read_arp_conf(root, "all")))
}

/// [`gather`] then [`flux_findings`].
///
/// # Errors
/// See [`gather`].
pub async fn check<K: Kernel>(
    kernel: &K,
    targets: &[FluxTarget],
) -> Result<Vec<FluxFinding>, NetError> {
    let (ifaces, all) = gather(kernel).await?;
    Ok(flux_findings(targets, &ifaces, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn iface(name: &str, addrs: &[(&str, u8)], ignore: u8, filter: u8) -> IfaceV4 {
        IfaceV4 {
            name: name.into(),
            addrs: addrs.iter().map(|(a, p)| (ip(a), *p)).collect(),
            conf: ArpConf {
                arp_ignore: Some(ignore),
                arp_filter: Some(filter),
            },
        }
    }

    fn target(vip: Option<&str>, ifname: &str) -> FluxTarget {
        FluxTarget {
            vip: vip.map(ip),
            ifname: ifname.into(),
        }
    }

    const ZERO: ArpConf = ArpConf {
        arp_ignore: Some(0),
        arp_filter: Some(0),
    };

    #[test]
    fn second_interface_on_the_vip_subnet_is_found() {
        let ifaces = [
            iface("eth0", &[("192.0.2.11", 24)], 0, 0),
            iface("eth1", &[("192.0.2.111", 24)], 0, 0),
            iface("eth2", &[("198.51.100.5", 24)], 0, 0),
        ];
        let f = flux_findings(&[target(Some("192.0.2.10"), "eth0")], &ifaces, ZERO);
        assert_eq!(f.len(), 1);
        assert_eq!(
            f[0].peers,
            vec![FluxPeer {
                name: "eth1".into(),
                addr: (ip("192.0.2.111"), 24)
            }]
        );
        let m = f[0].message(true);
        assert!(
            m.starts_with("ARP flux: VIP 192.0.2.10 is on eth0, but eth1 (192.0.2.111/24)"),
            "{m}"
        );
        assert!(m.contains(REMEDY) && m.contains("/etc/sysctl.d/"), "{m}");
        assert!(m.contains("arp vipd"), "{m}");
        assert!(f[0].message(false).contains("guard is off"));
    }

    #[test]
    fn sysctls_effective_values() {
        let ifaces = |ignore, filter| {
            [
                iface("eth0", &[("192.0.2.11", 24)], 0, 0),
                iface("eth1", &[("192.0.2.111", 24)], ignore, filter),
            ]
        };
        let t = [target(Some("192.0.2.10"), "eth0")];
        // The interface's own arp_ignore, arp_filter.
        assert!(flux_findings(&t, &ifaces(1, 0), ZERO).is_empty());
        assert!(flux_findings(&t, &ifaces(2, 0), ZERO).is_empty());
        assert!(flux_findings(&t, &ifaces(0, 1), ZERO).is_empty());
        // all.arp_ignore / all.arp_filter win over an interface's 0 (max / or).
        let all = |i, f| ArpConf {
            arp_ignore: Some(i),
            arp_filter: Some(f),
        };
        assert!(flux_findings(&t, &ifaces(0, 0), all(1, 0)).is_empty());
        assert!(flux_findings(&t, &ifaces(0, 0), all(0, 1)).is_empty());
        // Unreadable = kernel default 0.
        assert_eq!(
            flux_findings(&t, &ifaces(0, 0), ArpConf::default()).len(),
            1
        );
        // The VIP interface's own sysctls do not matter: it is meant to answer.
        let mut i = ifaces(0, 0);
        i[0].conf.arp_ignore = Some(1);
        assert_eq!(flux_findings(&t, &i, ZERO).len(), 1);
    }

    #[test]
    fn subnets_vip_or_interface() {
        // eth1 holds the VIP's subnet but eth0's is different (VIP routed differently).
        let ifaces = [
            iface("eth0", &[("10.0.0.5", 24)], 0, 0),
            iface("eth1", &[("192.0.2.111", 24)], 0, 0),
        ];
        let f = flux_findings(&[target(Some("192.0.2.10"), "eth0")], &ifaces, ZERO);
        assert_eq!(f[0].peer_names(), "eth1");
        // Without a VIP (Services at start): overlap with the VIP interface's subnets.
        let ifaces = [
            iface("eth0", &[("192.0.2.11", 24)], 0, 0),
            iface("eth1", &[("192.0.2.200", 25)], 0, 0),
            iface("eth2", &[("192.0.3.1", 24)], 0, 0),
        ];
        let f = flux_findings(&[target(None, "eth0")], &ifaces, ZERO);
        assert_eq!(f[0].peer_names(), "eth1");
        assert!(f[0].message(true).contains("VIPs go on eth0"));
        // Nobody else on the segment.
        let ifaces = [
            iface("eth0", &[("192.0.2.11", 24)], 0, 0),
            iface("eth2", &[("192.0.3.1", 24)], 0, 0),
        ];
        assert!(flux_findings(&[target(Some("192.0.2.10"), "eth0")], &ifaces, ZERO).is_empty());
        // Unknown VIP interface: the VIP's subnet still counts.
        let f = flux_findings(&[target(Some("192.0.3.9"), "eth9")], &ifaces, ZERO);
        assert_eq!(f[0].peer_names(), "eth2");
    }

    #[test]
    fn subnet_arithmetic() {
        assert!(contains((ip("192.0.2.111"), 24), ip("192.0.2.10")));
        assert!(!contains((ip("192.0.2.111"), 32), ip("192.0.2.10")));
        assert!(contains((ip("10.1.2.3"), 0), ip("192.0.2.10")));
        assert!(overlaps((ip("192.0.2.1"), 24), (ip("192.0.2.200"), 30)));
        assert!(!overlaps((ip("192.0.2.1"), 25), (ip("192.0.2.200"), 25)));
    }

    #[test]
    fn reads_proc_sys_layout() {
        let dir = tempfile::tempdir().unwrap();
        let eth1 = dir.path().join("net/ipv4/conf/eth1");
        std::fs::create_dir_all(&eth1).unwrap();
        std::fs::write(eth1.join("arp_ignore"), "1\n").unwrap();
        std::fs::write(eth1.join("arp_filter"), "0\n").unwrap();
        assert_eq!(
            read_arp_conf(dir.path(), "eth1"),
            ArpConf {
                arp_ignore: Some(1),
                arp_filter: Some(0)
            }
        );
        assert_eq!(read_arp_conf(dir.path(), "eth9"), ArpConf::default());
    }
}
