//! The routed wing (issue 29, routed networks): vipd puts the VIP routes into a kernel
//! routing table (kube-vip's routing-table mode, table 198 and route protocol 248 by
//! default) and the node's own routing daemon, BIRD 2 or FRR, exports them over BGP to the
//! top-of-rack router, with BFD, so that the router spreads a VIP over every node that
//! announces it (ECMP).
//!
//! vipd does not speak BGP itself. This wing holds what kube-vip's `bgp_*` options mean
//! ([`Settings`], parsed by the config layer from the same environment, flags and config
//! file as `vipd manager`) and turns them into the routing daemon's configuration:
//! [`bird::render`] (BIRD 2 `bird.conf`) and [`frr::render`] (FRR `frr.conf`), both pure.
//! `vipd manifest bird|frr` prints them.
//!
//! Sources (kube-vip, github.com/kube-vip/kube-vip): the option names in
//! `pkg/kubevip/config_envvar.go`, their parsing in `pkg/kubevip/config_environment.go`,
//! the peer list format in `pkg/kubevip/config_bgp.go` (`ParseBGPPeerConfig`), the
//! defaults in `cmd/kube-vip.go` (flags `--localAS 65000`, `--peerAS 65000`,
//! `--bgpHoldTimer 30`, `--bgpKeepAliveInterval 10`, `--tableID 198`,
//! `--routingProtocol 248`), and how a peer becomes a GoBGP neighbor in `pkg/bgp/peers.go`
//! (multihop TTL 50, BFD defaults 300 ms / 300 ms / 3).

pub mod bird;
pub mod frr;

use std::net::{IpAddr, Ipv4Addr};

/// Default local AS (`bgp_as`, kube-vip's `--localAS`).
pub const DEFAULT_LOCAL_AS: u32 = 65000;
/// Default peer AS (`bgp_peeras`, kube-vip's `--peerAS`), used by `bgp_peeraddress`.
pub const DEFAULT_PEER_AS: u32 = 65000;
/// Default BGP hold time in seconds (`bgp_hold_time`, kube-vip's `--bgpHoldTimer`).
pub const DEFAULT_HOLD_TIME: u16 = 30;
/// Default BGP keepalive interval in seconds (`bgp_keepalive_interval`, kube-vip's
/// `--bgpKeepAliveInterval`).
pub const DEFAULT_KEEPALIVE: u16 = 10;
/// Default kernel routing table of the VIP routes (`vip_routingtableid`, kube-vip's
/// `--tableID`).
pub const DEFAULT_TABLE: u32 = 198;
/// Default route protocol (`rtm_protocol`) of the VIP routes (`vip_routingprotocol`,
/// kube-vip's `--routingProtocol`).
pub const DEFAULT_PROTOCOL: u8 = 248;
/// BGP port.
pub const BGP_PORT: u16 = 179;
/// TTL of a multihop eBGP session (kube-vip: `MultihopTtl: 50` in `pkg/bgp/peers.go`).
pub const MULTIHOP_TTL: u8 = 50;
/// kube-vip's BFD defaults (`pkg/kubevip/config_bgp.go`): receive and transmit interval
/// 300 ms, detect multiplier 3, so a dead peer is detected in 900 ms.
pub const DEFAULT_BFD: Bfd = Bfd {
    enabled: true,
    receive_ms: 300,
    transmit_ms: 300,
    multiplier: 3,
};

/// The node's BGP speaker as kube-vip's `bgp_*` options describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `bgp_routerid`: the BGP router ID (an IPv4 address).
    pub router_id: Option<Ipv4Addr>,
    /// `bgp_routerinterface`: take the router ID from this interface's address (kube-vip
    /// reads it at start; the generated configuration lets the daemon read it). Used when
    /// `bgp_routerid` is unset. Neither: the daemon picks one of the node's addresses.
    pub router_interface: Option<String>,
    /// `bgp_as`: the node's AS number (1 to 4294967295).
    pub local_as: u32,
    /// `bgp_peers`, then the one peer of `bgp_peeraddress` (with `bgp_peeras`,
    /// `bgp_peerpass`, `bgp_multihop`), in that order (kube-vip appends the latter). At
    /// least one.
    pub peers: Vec<Peer>,
    /// `bgp_sourceip`: the local address of every session.
    pub source_ip: Option<IpAddr>,
    /// `bgp_sourceif`: the interface every session is bound to.
    pub source_if: Option<String>,
    /// `bgp_hold_time`, seconds (3 to 65535).
    pub hold_time: u16,
    /// `bgp_keepalive_interval`, seconds (1 to less than the hold time).
    pub keepalive: u16,
    /// `mpbgp_nexthop`, `mpbgp_ipv4`, `mpbgp_ipv6`: both address families on every session
    /// (a peer's own `mpbgp_*` in `bgp_peers` wins).
    pub mpbgp: Mpbgp,
    /// `vip_routingtableid`: the kernel table vipd puts the VIP routes in.
    pub table: u32,
    /// `vip_routingprotocol`: the route protocol of vipd's routes in that table.
    pub protocol: u8,
}

/// Where a peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAddress {
    /// An IPv4 or IPv6 address (IPv6 in brackets in `bgp_peers`: `[2001:db8::1]:65001`).
    Ip(IpAddr),
    /// `unnumbered:IFACE`: the router at the other end of this interface, found by its
    /// IPv6 link-local address (RFC 5549 style).
    Unnumbered(String),
}

/// One BGP neighbor (one entry of `bgp_peers`:
/// `<address>:<AS>:<password>:<multihop>:<port>:<mpbgp options>:<BFD options>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The neighbor.
    pub address: PeerAddress,
    /// Its AS number (1 to 4294967295); `None` for an unnumbered peer without one
    /// (the daemon learns it: FRR's `remote-as external`).
    pub asn: Option<u32>,
    /// TCP MD5 password (RFC 2385); `None` = none.
    pub password: Option<String>,
    /// eBGP multihop (TTL [`MULTIHOP_TTL`]).
    pub multihop: bool,
    /// TCP port of the neighbor (default [`BGP_PORT`]).
    pub port: u16,
    /// The peer's own MP-BGP options (empty fields: the global ones).
    pub mpbgp: Mpbgp,
    /// BFD for this session.
    pub bfd: Bfd,
}

/// MP-BGP: carry both address families on one session, with the next hop of the other
/// family (kube-vip `mpbgp_nexthop`: `fixed` with `mpbgp_ipv4`/`mpbgp_ipv6`,
/// `auto_sourceip`, `auto_sourceif`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mpbgp {
    /// The next-hop mode; `None`: one address family per session (the peer's).
    pub nexthop: Option<MpbgpNexthop>,
    /// `mpbgp_ipv4`: the IPv4 next hop of `fixed`.
    pub ipv4: Option<std::net::Ipv4Addr>,
    /// `mpbgp_ipv6`: the IPv6 next hop of `fixed`.
    pub ipv6: Option<std::net::Ipv6Addr>,
}

/// `mpbgp_nexthop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpbgpNexthop {
    /// `fixed`: the next hops are `mpbgp_ipv4` / `mpbgp_ipv6`.
    Fixed,
    /// `auto_sourceip`: the other family's address of the interface of `bgp_sourceip`.
    AutoSourceIp,
    /// `auto_sourceif`: the addresses of `bgp_sourceif`.
    AutoSourceIf,
}

impl MpbgpNexthop {
    /// Parses kube-vip's name.
    ///
    /// # Errors
    /// The reason, for any other text.
    pub fn parse(s: &str) -> Result<MpbgpNexthop, String> {
        match s {
            "fixed" => Ok(MpbgpNexthop::Fixed),
            "auto_sourceip" => Ok(MpbgpNexthop::AutoSourceIp),
            "auto_sourceif" => Ok(MpbgpNexthop::AutoSourceIf),
            _ => Err(format!(
                "{s:?} is not an MP-BGP next-hop mode (fixed, auto_sourceip, auto_sourceif)"
            )),
        }
    }
}

/// BFD (RFC 5880) for one session: intervals in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bfd {
    /// BFD on. vipd's generator turns it on unless the peer's BFD options say `false`
    /// (kube-vip's default is off).
    pub enabled: bool,
    /// Required minimum receive interval, ms (1 to 65535).
    pub receive_ms: u32,
    /// Desired minimum transmit interval, ms (1 to 65535).
    pub transmit_ms: u32,
    /// Detect multiplier (1 to 255).
    pub multiplier: u32,
}

/// Parses an AS number as kube-vip does (`strconv.ParseUint(s, 10, 32)`), refusing 0
/// (reserved, RFC 7607).
///
/// # Errors
/// The reason, naming the value.
pub fn parse_as(s: &str) -> Result<u32, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not an AS number (1 to 4294967295)"));
    }
    match s.parse::<u32>() {
        Ok(0) => Err("AS 0 is reserved (RFC 7607): use 1 to 4294967295".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("AS {s} is out of range (1 to 4294967295)")),
    }
}

/// A whole number within `min..=max`.
fn parse_in(s: &str, what: &str, min: u32, max: u32) -> Result<u32, String> {
    let range = || format!("{what} {s:?} is out of range ({min} to {max})");
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{what} {s:?} is not a whole number"));
    }
    let n: u32 = s.parse().map_err(|_| range())?;
    if n < min || n > max {
        return Err(range());
    }
    Ok(n)
}

/// Checks a password for the configuration files: printable ASCII, no quote or
/// backslash (BIRD's strings have no escapes; FRR's line ends at white space).
///
/// # Errors
/// The reason (never the password itself).
pub fn check_password(p: &str) -> Result<(), String> {
    if p.len() > 80 {
        return Err(
            "the BGP password is longer than 80 characters (TCP MD5 keys are at most 80)".into(),
        );
    }
    if p.bytes()
        .any(|b| !(0x21..=0x7e).contains(&b) || b == b'"' || b == b'\\')
    {
        return Err(
            "the BGP password may only hold printable ASCII without spaces, '\"' or '\\'".into(),
        );
    }
    Ok(())
}

/// Parses a peer address: an IP address without zone, not unspecified, multicast or
/// loopback.
fn parse_peer_ip(s: &str) -> Result<IpAddr, String> {
    if s.contains('%') {
        return Err(format!(
            "{s:?}: zone indexes are not supported; for a link-local peer use unnumbered:IFACE"
        ));
    }
    let ip: IpAddr = s
        .parse()
        .map_err(|_| format!("{s:?} is not an IP address"))?;
    if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
        return Err(format!("{ip} cannot be a BGP peer"));
    }
    Ok(ip)
}

/// Parses kube-vip's MP-BGP field of a peer (`key=value` pairs separated by `;`).
fn parse_peer_mpbgp(s: &str) -> Result<Mpbgp, String> {
    let mut m = Mpbgp::default();
    for kv in s.split(';') {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(format!(
                "MP-BGP option {kv:?} has no value (expected key=value)"
            ));
        };
        match k {
            "mpbgp_nexthop" => m.nexthop = Some(MpbgpNexthop::parse(v)?),
            "mpbgp_ipv4" if !v.is_empty() => {
                m.ipv4 = Some(
                    v.parse()
                        .map_err(|_| format!("mpbgp_ipv4 {v:?} is not an IPv4 address"))?,
                )
            }
            "mpbgp_ipv6" if !v.is_empty() => {
                m.ipv6 = Some(
                    v.parse()
                        .map_err(|_| format!("mpbgp_ipv6 {v:?} is not an IPv6 address"))?,
                )
            }
            "mpbgp_ipv4" | "mpbgp_ipv6" => {}
            _ => return Err(format!("MP-BGP option {k:?} is not supported")),
        }
    }
    Ok(m)
}

/// Parses kube-vip's BFD field of a peer: `enable;receive_ms;transmit_ms;multiplier`
/// (empty numbers keep kube-vip's defaults).
fn parse_peer_bfd(s: &str) -> Result<Bfd, String> {
    let parts: Vec<&str> = s.split(';').collect();
    if parts.len() < 4 {
        return Err(format!(
            "BFD options {s:?} need 4 fields: enable;receive_ms;transmit_ms;multiplier"
        ));
    }
    let enabled = crate::syntax::parse_go_bool(parts[0])
        .ok_or_else(|| format!("BFD enable {:?} is not a boolean", parts[0]))?;
    let mut bfd = Bfd {
        enabled,
        ..DEFAULT_BFD
    };
    if !parts[1].is_empty() {
        bfd.receive_ms = parse_in(parts[1], "BFD receive interval (ms)", 1, 65535)?;
    }
    if !parts[2].is_empty() {
        bfd.transmit_ms = parse_in(parts[2], "BFD transmit interval (ms)", 1, 65535)?;
    }
    if !parts[3].is_empty() {
        bfd.multiplier = parse_in(parts[3], "BFD detect multiplier", 1, 255)?;
    }
    Ok(bfd)
}

/// Parses one entry of `bgp_peers` (kube-vip's `ParseBGPPeerConfig`, same field order
/// and defaults).
fn parse_peer(entry: &str) -> Result<Peer, String> {
    let (address, rest) = if let Some(after) = entry.strip_prefix('[') {
        let Some((addr, rest)) = after.split_once(']') else {
            return Err("no matching ']' for the IPv6 address".into());
        };
        let rest = rest.strip_prefix(':').ok_or_else(|| {
            "an IPv6 peer needs :AS after the bracketed address ([2001:db8::1]:65000)".to_string()
        })?;
        (PeerAddress::Ip(parse_peer_ip(addr)?), rest)
    } else if let Some(after) = entry.strip_prefix("unnumbered:") {
        let (iface, rest) = after.split_once(':').unwrap_or((after, ""));
        if !crate::net::is_ifname(iface) {
            return Err(format!(
                "{iface:?} is not an interface name ({})",
                crate::net::IFNAME_RULE
            ));
        }
        (PeerAddress::Unnumbered(iface.to_string()), rest)
    } else {
        let Some((addr, rest)) = entry.split_once(':') else {
            return Err("expected <address>:<AS>[:password[:multihop[:port]]]".into());
        };
        let ip = parse_peer_ip(addr).map_err(|e| {
            if !addr.contains('.') && addr.bytes().all(|b| b.is_ascii_hexdigit()) {
                "put an IPv6 peer address in brackets: [2001:db8::1]:65000".to_string()
            } else {
                e
            }
        })?;
        (PeerAddress::Ip(ip), rest)
    };
    let fields: Vec<&str> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split(':').collect()
    };
    let field = |i: usize| fields.get(i).copied().unwrap_or("");
    let asn = match field(0) {
        "" if matches!(address, PeerAddress::Unnumbered(_)) => None,
        "" => return Err("the peer's AS is missing (<address>:<AS>)".into()),
        s => Some(parse_as(s)?),
    };
    let password = match field(1) {
        "" => None,
        p => {
            check_password(p)?;
            Some(p.to_string())
        }
    };
    // After a password, a field's value is not quoted: a password with ':' is split into the
    // fields that follow it (kube-vip's format cannot carry one), and an error must not show
    // part of it.
    let after_password = |e: String, what: &str| match password.is_some() {
        true => format!(
            "{what} (a field after the password) is not valid; its value is not shown: a \
             password containing ':' is split into the following fields in bgp_peers (give it \
             in bgp_peerpass instead)"
        ),
        false => e,
    };
    let multihop = match field(2) {
        "" => false,
        s => crate::syntax::parse_go_bool(s).ok_or_else(|| {
            after_password(
                format!("multihop {s:?} is not a boolean (true/false)"),
                "multihop",
            )
        })?,
    };
    let port = match field(3) {
        "" => BGP_PORT,
        s => u16::try_from(parse_in(s, "port", 1, 65535).map_err(|e| after_password(e, "port"))?)
            .unwrap_or(BGP_PORT),
    };
    let mpbgp = match field(4) {
        "" => Mpbgp::default(),
        s => parse_peer_mpbgp(s).map_err(|e| after_password(e, "MP-BGP"))?,
    };
    let bfd = match field(5) {
        "" => DEFAULT_BFD,
        s => parse_peer_bfd(s).map_err(|e| after_password(e, "BFD"))?,
    };
    if fields.len() > 6 {
        return Err(format!(
            "{} fields after the address; at most 6 (AS, password, multihop, port, MP-BGP, BFD)",
            fields.len()
        ));
    }
    Ok(Peer {
        address,
        asn,
        password,
        multihop,
        port,
        mpbgp,
        bfd,
    })
}

/// Parses `bgp_peers`: comma-separated peers,
/// `<address>:<AS>[:password[:multihop[:port[:mpbgp[:bfd]]]]]`, IPv6 addresses in
/// brackets, `unnumbered:IFACE[:AS...]` for unnumbered peers (kube-vip's
/// `ParseBGPPeerConfig`; empty entries are skipped as there). No two peers with the same
/// address.
///
/// # Errors
/// The reason, naming the entry (1-based) and its address part; never a password.
pub fn parse_peers(value: &str) -> Result<Vec<Peer>, String> {
    let mut out: Vec<Peer> = Vec::new();
    for (i, entry) in value.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let shown = entry
            .split_once(']')
            .map(|(a, _)| format!("{a}]"))
            .unwrap_or_else(|| entry.split(':').take(2).collect::<Vec<_>>().join(":"));
        let peer = parse_peer(entry).map_err(|e| format!("peer {} ({shown}): {e}", i + 1))?;
        if out.iter().any(|p| p.address == peer.address) {
            return Err(format!("peer {} ({shown}) is listed twice", i + 1));
        }
        out.push(peer);
    }
    if out.is_empty() {
        return Err("no peer in the list".into());
    }
    Ok(out)
}

/// `bgp_peers` with every password (the field after the AS) and the fields after it
/// replaced by `<hidden>`, for messages (a password containing ':' spills into them).
pub fn redact_passwords(value: &str) -> String {
    value
        .split(',')
        .map(|entry| {
            let (addr, rest) = match entry.split_once(']') {
                Some((a, r)) => (format!("{a}]"), r.strip_prefix(':').unwrap_or(r)),
                None => match entry.split_once(':') {
                    Some((a, r)) if !a.starts_with("unnumbered") => (a.to_string(), r),
                    _ => match entry
                        .strip_prefix("unnumbered:")
                        .and_then(|r| r.split_once(':'))
                    {
                        Some((i, r)) => (format!("unnumbered:{i}"), r),
                        None => return entry.to_string(),
                    },
                },
            };
            let mut fields: Vec<&str> = rest.split(':').collect();
            if fields.len() > 1 && !fields[1].is_empty() {
                // What follows the password may be more of it (a ':' in it): hidden too.
                fields.truncate(1);
                fields.push("<hidden>");
            }
            format!("{addr}:{}", fields.join(":"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses `bgp_peeraddress`: one IP address (IPv6 with or without brackets).
///
/// # Errors
/// The reason.
pub fn parse_peer_address(value: &str) -> Result<IpAddr, String> {
    let v = value
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(value);
    parse_peer_ip(v)
}

/// Parses a BGP timer in seconds within `min..=65535` (`bgp_hold_time`,
/// `bgp_keepalive_interval`; kube-vip parses them as unsigned 32-bit).
///
/// # Errors
/// The reason.
pub fn parse_timer(value: &str, min: u16) -> Result<u16, String> {
    let n = parse_in(value, "seconds", u32::from(min), 65535)?;
    u16::try_from(n).map_err(|_| format!("{value} is out of range"))
}

/// Parses `vip_routingtableid` (1 to 4294967295, not one of the kernel's own tables:
/// 253 `default`, 254 `main`, 255 `local`; their routes are not vipd's alone, and the
/// node's own policy rules look them up, so a VIP route there would steer the node's own
/// traffic).
///
/// # Errors
/// The reason.
pub fn parse_table(value: &str) -> Result<u32, String> {
    let n = parse_in(value, "table", 1, u32::MAX)?;
    let kernels = match n {
        253 => Some("default"),
        254 => Some("main"),
        255 => Some("local"),
        _ => None,
    };
    if let Some(name) = kernels {
        return Err(format!(
            "table {n} is the kernel's {name} table (the node's own routing rules look it up); vipd's routes need a table of their own (default 198)"
        ));
    }
    Ok(n)
}

/// Parses `vip_routingprotocol` (1 to 255, not BIRD's own 12, whose routes BIRD does not
/// learn).
///
/// # Errors
/// The reason.
pub fn parse_protocol(value: &str) -> Result<u8, String> {
    let n = parse_in(value, "protocol", 1, 255)?;
    if n == 12 {
        return Err("protocol 12 is BIRD's own (default 248)".into());
    }
    u8::try_from(n).map_err(|_| format!("{value} is out of range"))
}

/// A reason the daemon's configuration cannot be written for these settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RenderError(pub String);

impl Settings {
    /// The MP-BGP options of `peer`: its own, else the global ones (kube-vip
    /// `SetMpbgpOptions`).
    pub fn mpbgp_of(&self, peer: &Peer) -> Mpbgp {
        Mpbgp {
            nexthop: peer.mpbgp.nexthop.or(self.mpbgp.nexthop),
            ipv4: peer.mpbgp.ipv4.or(self.mpbgp.ipv4),
            ipv6: peer.mpbgp.ipv6.or(self.mpbgp.ipv6),
        }
    }
}

/// The lines of the header comment both configurations start with.
fn header(s: &Settings, tool: &str) -> Vec<String> {
    let what = match tool {
        // FRR's `ip import-table` takes every route of the table, whatever its protocol.
        "frr" => format!(
            "Exports every route of kernel table {} (keep it for vipd's VIP routes, protocol {}) to the peers below, with BFD;",
            s.table, s.protocol
        ),
        _ => format!(
            "Exports the routes of protocol {} in kernel table {} (vipd's VIP routes) to the peers below, with BFD;",
            s.protocol, s.table
        ),
    };
    vec![
        format!("Generated by `vipd manifest {tool}` from kube-vip's bgp_* settings."),
        what,
        "takes no route from them. Give every node the same AS so the router can spread a VIP over them (ECMP).".into(),
    ]
}

#[cfg(test)]
mod tests;
