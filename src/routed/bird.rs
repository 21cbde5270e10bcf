//! BIRD 2 configuration (`bird.conf`, BIRD 2.0 user's guide) for the node's BGP speaker.
//!
//! Shape:
//! - two BIRD tables of their own, `vipd4` and `vipd6`, filled only by a `protocol kernel`
//!   per family that learns (`learn`) the routes of protocol [`Settings::protocol`]
//!   (`krt_source`, the route's `rtm_protocol`) in kernel table [`Settings::table`] and
//!   exports nothing to the kernel;
//! - `protocol device` (interface states) and `protocol bfd` (BFD sessions on request of
//!   the BGP protocols);
//! - one `protocol bgp` per peer: the peer's family channel (both with MP-BGP) on the
//!   vipd tables, `import none` (the node takes no route from the router), `export all`
//!   (only vipd's routes are in those tables), `next hop self`, BFD with the peer's
//!   intervals, hold and keepalive times, multihop, password, source address.

use std::fmt::Write as _;
use std::net::IpAddr;

use super::{MULTIHOP_TTL, MpbgpNexthop, PeerAddress, RenderError, Settings, header};

/// The `scan time` of the kernel protocols, seconds. An IPv4 VIP route the kernel flushes
/// when its fence device's address expires (a frozen or lease-less vipd,
/// docs/design.md "The route fence") comes with no `RTM_DELROUTE`: BIRD sees it gone only
/// at its next scan, so what BGP announces outlives the route by up to this. 1 s: the
/// table holds only vipd's routes, and a scan is one route dump (BIRD's default, 60 s,
/// and the earlier 10 s left a frozen holder's route announced that long).
pub const KERNEL_SCAN_SECS: u32 = 1;

/// BIRD table names of the VIP routes (IPv4, IPv6).
pub const TABLES: (&str, &str) = ("vipd4", "vipd6");

/// Writes `bird.conf` for `s`.
///
/// # Errors
/// [`RenderError`] for what BIRD cannot do: an unnumbered peer (BIRD needs the peer's
/// address), MP-BGP without a fixed next hop of the other family.
pub fn render(s: &Settings) -> Result<String, RenderError> {
    let mut o = String::new();
    for line in header(s, "bird") {
        let _ = writeln!(o, "# {line}");
    }
    o.push('\n');
    match (&s.router_id, &s.router_interface) {
        (Some(id), _) => {
            let _ = writeln!(o, "router id {id};");
        }
        (None, Some(iface)) => {
            let _ = writeln!(o, "router id from \"{iface}\";");
        }
        (None, None) => {}
    }
    let (t4, t6) = TABLES;
    let _ = writeln!(o, "ipv4 table {t4};\nipv6 table {t6};\n");
    o.push_str("protocol device vipd_device {\n}\n\n");
    for (family, table) in [("ipv4", t4), ("ipv6", t6)] {
        let _ = write!(
            o,
            "protocol kernel vipd_kernel_{family} {{\n\
             \tkernel table {};\n\
             \tlearn;\n\
             \tscan time {KERNEL_SCAN_SECS};\n\
             \t{family} {{\n\
             \t\ttable {table};\n\
             \t\timport where krt_source = {};\n\
             \t\texport none;\n\
             \t}};\n\
             }}\n\n",
            s.table, s.protocol
        );
    }
    o.push_str("protocol bfd vipd_bfd {\n}\n");
    for (i, peer) in s.peers.iter().enumerate() {
        let addr = match &peer.address {
            PeerAddress::Ip(ip) => *ip,
            PeerAddress::Unnumbered(iface) => {
                return Err(RenderError(format!(
                    "peer {} (unnumbered:{iface}): BIRD needs the peer's address; give it in \
                     bgp_peers ([fe80::...] is not supported either), or use `vipd manifest frr`",
                    i + 1
                )));
            }
        };
        let Some(asn) = peer.asn else {
            return Err(RenderError(format!("peer {} ({addr}) has no AS", i + 1)));
        };
        let _ = write!(o, "\nprotocol bgp vipd_peer{} {{\n", i + 1);
        let _ = writeln!(o, "\tdescription \"{addr}\";");
        match s.source_ip.filter(|src| src.is_ipv4() == addr.is_ipv4()) {
            Some(src) => {
                let _ = writeln!(o, "\tlocal {src} as {};", s.local_as);
            }
            None => {
                let _ = writeln!(o, "\tlocal as {};", s.local_as);
            }
        }
        if peer.port == super::BGP_PORT {
            let _ = writeln!(o, "\tneighbor {addr} as {asn};");
        } else {
            let _ = writeln!(o, "\tneighbor {addr} port {} as {asn};", peer.port);
        }
        // BIRD takes a session with a peer of the same AS (iBGP) as multihop unless told
        // `direct`: kube-vip's (GoBGP's) iBGP peers without multihop are on the segment.
        let ibgp = asn == s.local_as;
        let source_ip = s.source_ip.filter(|src| src.is_ipv4() == addr.is_ipv4());
        if peer.multihop {
            if let Some(iface) = &s.source_if {
                return Err(RenderError(format!(
                    "peer {} ({addr}) is multihop: BIRD cannot bind a multihop session to an \
                     interface (bgp_sourceif={iface}); give its address in bgp_sourceip instead",
                    i + 1
                )));
            }
            if peer.bfd.enabled && source_ip.is_none() {
                return Err(RenderError(format!(
                    "peer {} ({addr}) is multihop with BFD: BIRD's multihop BFD needs the local \
                     address: set bgp_sourceip (an address of the same family), or turn BFD off \
                     for this peer in bgp_peers",
                    i + 1
                )));
            }
        }
        if let Some(iface) = &s.source_if {
            let _ = writeln!(o, "\tinterface \"{iface}\";");
        }
        if peer.multihop {
            let _ = writeln!(o, "\tmultihop {MULTIHOP_TTL};");
        } else if ibgp {
            let _ = writeln!(o, "\tdirect;");
        }
        if let Some(p) = &peer.password {
            let _ = writeln!(o, "\tpassword \"{p}\";");
        }
        let _ = writeln!(o, "\thold time {};", s.hold_time);
        let _ = writeln!(o, "\tkeepalive time {};", s.keepalive);
        if peer.bfd.enabled {
            let _ = writeln!(
                o,
                "\tbfd {{ min rx interval {} ms; min tx interval {} ms; multiplier {}; }};",
                peer.bfd.receive_ms, peer.bfd.transmit_ms, peer.bfd.multiplier
            );
        }
        let mp = s.mpbgp_of(peer);
        let other_hop: Option<String> = match mp.nexthop {
            None => None,
            Some(MpbgpNexthop::Fixed) => Some(match addr {
                IpAddr::V4(_) => mp.ipv6.map(|a| a.to_string()).ok_or_else(|| {
                    RenderError(format!(
                        "peer {} ({addr}): mpbgp_nexthop=fixed needs mpbgp_ipv6, the IPv6 next hop of the IPv6 routes on this IPv4 session",
                        i + 1
                    ))
                })?,
                IpAddr::V6(_) => mp.ipv4.map(|a| a.to_string()).ok_or_else(|| {
                    RenderError(format!(
                        "peer {} ({addr}): mpbgp_nexthop=fixed needs mpbgp_ipv4, the IPv4 next hop of the IPv4 routes on this IPv6 session",
                        i + 1
                    ))
                })?,
            }),
            Some(_) => {
                return Err(RenderError(format!(
                    "peer {} ({addr}): BIRD needs the other family's next hop written down: use mpbgp_nexthop=fixed with mpbgp_ipv4/mpbgp_ipv6",
                    i + 1
                )));
            }
        };
        for (family, table, own) in [("ipv4", t4, addr.is_ipv4()), ("ipv6", t6, addr.is_ipv6())] {
            let hop = if own {
                "next hop self".to_string()
            } else {
                match &other_hop {
                    Some(h) => format!("next hop address {h}"),
                    None => continue,
                }
            };
            let _ = writeln!(
                o,
                "\t{family} {{ table {table}; import none; export all; {hop}; }};"
            );
        }
        o.push_str("}\n");
    }
    Ok(o)
}
