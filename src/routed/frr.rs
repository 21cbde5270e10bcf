//! FRR configuration (`frr.conf`, integrated configuration; FRR 8.4 and later) for the
//! node's BGP speaker.
//!
//! Shape: `ip import-table <table>` makes zebra read vipd's kernel table; `router bgp`
//! redistributes it (`redistribute table <table>`, the form FRR 8.4 has) to one neighbor
//! per peer with BFD (a `bfd` profile per peer with its intervals), takes no route from
//! them (route-map `vipd-import-none` inbound), `next-hop-self`, hold and keepalive
//! timers, multihop, password, update source; `maximum-paths`.
//!
//! Limits of FRR 8.4 (Debian 12), checked with `vtysh --dryrun`: it imports IPv4 kernel
//! tables only (no `ipv6 import-table`), so IPv6 VIP routes are not exported (use BIRD);
//! `ip import-table` takes every route of the table whatever its protocol, and zebra also
//! puts the imported routes in its main table; table ids above 252 are refused.

use std::fmt::Write as _;
use std::net::IpAddr;

use super::{MULTIHOP_TTL, MpbgpNexthop, PeerAddress, RenderError, Settings, header};

/// Largest table `ip import-table` takes.
pub const MAX_IMPORT_TABLE: u32 = 252;
/// `maximum-paths` written for both families.
pub const MAXIMUM_PATHS: u32 = 64;
/// The route-map that takes no route from the peers.
pub const IMPORT_NONE: &str = "vipd-import-none";

/// Writes `frr.conf` for `s`.
///
/// # Errors
/// [`RenderError`] for a table above [`MAX_IMPORT_TABLE`] and for `mpbgp_nexthop=fixed`
/// without the other family's next hop.
pub fn render(s: &Settings) -> Result<String, RenderError> {
    if s.table > MAX_IMPORT_TABLE {
        return Err(RenderError(format!(
            "FRR imports kernel tables 1 to {MAX_IMPORT_TABLE} only (ip import-table); vip_routingtableid is {}",
            s.table
        )));
    }
    let mut o = String::new();
    for line in header(s, "frr") {
        let _ = writeln!(o, "! {line}");
    }
    o.push_str(
        "! FRR 8.4 imports IPv4 kernel tables only: IPv6 VIP routes are not exported (use BIRD for them).\n",
    );
    o.push_str("frr defaults datacenter\n");
    let _ = writeln!(o, "ip import-table {}", s.table);
    o.push_str("!\nbfd\n");
    for (i, p) in s.peers.iter().enumerate() {
        if p.bfd.enabled {
            let _ = write!(
                o,
                " profile vipd-peer{}\n  receive-interval {}\n  transmit-interval {}\n  detect-multiplier {}\n exit\n",
                i + 1,
                p.bfd.receive_ms,
                p.bfd.transmit_ms,
                p.bfd.multiplier
            );
        }
    }
    o.push_str("exit\n!\n");
    let _ = writeln!(o, "router bgp {}", s.local_as);
    match (&s.router_id, &s.router_interface) {
        (Some(id), _) => {
            let _ = writeln!(o, " bgp router-id {id}");
        }
        (None, Some(iface)) => {
            let _ = writeln!(
                o,
                " ! bgp_routerinterface {iface}: FRR takes its router ID from the node's addresses"
            );
        }
        (None, None) => {}
    }
    o.push_str(" no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n");
    let _ = writeln!(o, " timers bgp {} {}", s.keepalive, s.hold_time);
    let mut v4: Vec<(String, Option<String>)> = Vec::new();
    let mut v6: Vec<(String, Option<String>)> = Vec::new();
    for (i, p) in s.peers.iter().enumerate() {
        let name = match &p.address {
            PeerAddress::Ip(ip) => ip.to_string(),
            PeerAddress::Unnumbered(iface) => iface.clone(),
        };
        let remote = p
            .asn
            .map(|a| a.to_string())
            .unwrap_or_else(|| "external".into());
        match &p.address {
            PeerAddress::Ip(_) => {
                let _ = writeln!(o, " neighbor {name} remote-as {remote}");
            }
            PeerAddress::Unnumbered(_) => {
                let _ = writeln!(o, " neighbor {name} interface remote-as {remote}");
            }
        }
        if p.port != super::BGP_PORT {
            let _ = writeln!(o, " neighbor {name} port {}", p.port);
        }
        if let Some(pw) = &p.password {
            let _ = writeln!(o, " neighbor {name} password {pw}");
        }
        if p.multihop {
            let _ = writeln!(o, " neighbor {name} ebgp-multihop {MULTIHOP_TTL}");
        }
        let family_v4 = match &p.address {
            PeerAddress::Ip(ip) => ip.is_ipv4(),
            PeerAddress::Unnumbered(_) => false,
        };
        let source = match (&s.source_ip, &s.source_if) {
            (Some(ip), _) if ip.is_ipv4() == family_v4 => Some(ip.to_string()),
            (_, Some(iface)) => Some(iface.clone()),
            _ => None,
        };
        if let Some(src) = source
            && !matches!(p.address, PeerAddress::Unnumbered(_))
        {
            let _ = writeln!(o, " neighbor {name} update-source {src}");
        }
        if p.bfd.enabled {
            let _ = writeln!(o, " neighbor {name} bfd");
            let _ = writeln!(o, " neighbor {name} bfd profile vipd-peer{}", i + 1);
        }
        let mp = s.mpbgp_of(p);
        let unnumbered = matches!(p.address, PeerAddress::Unnumbered(_));
        // Unnumbered sessions run over IPv6 link-local and carry IPv4 with RFC 5549 next hops.
        let (own, other) = if family_v4 {
            (&mut v4, &mut v6)
        } else {
            (&mut v6, &mut v4)
        };
        own.push((name.clone(), None));
        if unnumbered {
            other.push((name.clone(), None));
            continue;
        }
        match mp.nexthop {
            None => {}
            Some(MpbgpNexthop::Fixed) => {
                let hop = if family_v4 {
                    mp.ipv6.map(IpAddr::V6)
                } else {
                    mp.ipv4.map(IpAddr::V4)
                };
                let Some(hop) = hop else {
                    return Err(RenderError(format!(
                        "peer {} ({name}): mpbgp_nexthop=fixed needs {}",
                        i + 1,
                        if family_v4 {
                            "mpbgp_ipv6"
                        } else {
                            "mpbgp_ipv4"
                        }
                    )));
                };
                other.push((name.clone(), Some(hop.to_string())));
            }
            Some(_) => other.push((name.clone(), None)),
        }
    }
    for (family, list) in [("ipv4", &v4), ("ipv6", &v6)] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(o, " !\n address-family {family} unicast");
        if family == "ipv4" {
            let _ = writeln!(o, "  redistribute table {}", s.table);
        }
        let _ = writeln!(o, "  maximum-paths {MAXIMUM_PATHS}");
        for (name, hop) in list {
            let _ = writeln!(o, "  neighbor {name} activate");
            let _ = writeln!(o, "  neighbor {name} next-hop-self");
            let _ = writeln!(o, "  neighbor {name} route-map {IMPORT_NONE} in");
            if hop.is_some() {
                let _ = writeln!(o, "  neighbor {name} route-map vipd-nexthop-{name} out");
            }
        }
        o.push_str(" exit-address-family\n");
    }
    o.push_str("exit\n!\n");
    let _ = writeln!(o, "route-map {IMPORT_NONE} deny 10\nexit");
    for (family, list) in [("ipv4", &v4), ("ipv6", &v6)] {
        for (name, hop) in list {
            if let Some(hop) = hop {
                let set = if family == "ipv6" {
                    format!("set ipv6 next-hop global {hop}")
                } else {
                    format!("set ip next-hop {hop}")
                };
                let _ = writeln!(
                    o,
                    "!\nroute-map vipd-nexthop-{name} permit 10\n {set}\nexit"
                );
            }
        }
    }
    o.push_str("!\n");
    Ok(o)
}
