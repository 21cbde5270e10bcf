//! The load balancer's nftables rules: one table per address family, `ip vipd_lb` and
//! `ip6 vipd_lb`, owned by vipd and present only on the control-plane VIP's holder.
//!
//! ```text
//! table ip vipd_lb {
//!     chain prerouting {
//!         type nat hook prerouting priority dstnat; policy accept;
//!         ip daddr 192.0.2.10 fib daddr type local tcp dport 6443 counter dnat to numgen inc mod 3 map { 0 : 192.0.2.11, 1 : 192.0.2.12, 2 : 192.0.2.13 }:6443
//!     }
//!     chain postrouting {
//!         type nat hook postrouting priority srcnat; policy accept;
//!         ct status dnat ct original ip daddr 192.0.2.10 counter masquerade
//!     }
//! }
//! ```
//!
//! * New connections to `VIP:lb_port` are spread round-robin (`numgen inc`, IPVS's `rr`)
//!   over the healthy backends at `port`; only the VIP address is matched, so the node's own
//!   API server on its node address is never redirected, also when `lb_port == port`.
//! * The rule matches only while the VIP is a local address (`fib daddr type local`): a
//!   table left by a killed vipd (removed when vipd starts again) is inert once the kernel
//!   fence has removed the VIP, so only the node holding the VIP ever forwards.
//! * Connections that were redirected leave with the holder's address (`masquerade`), so the
//!   replies come back through the holder, which undoes both translations.
//! * NAT applies to the first packet of a connection only; established connections follow
//!   their conntrack entry, so replacing the rule (a backend set change) never disturbs them.
//! * With no healthy backend there is no redirect rule: connections reach the holder's own
//!   stack (its API server when `lb_port == port`).
//!
//! Every change is one atomic nf_tables transaction ([`Batch`], sent through netlink from
//! vipd's own process, [`nl`]): the first install replaces a stale table left by an earlier
//! run, a backend change flushes and refills the `prerouting` chain, removal deletes the
//! table. No other table is ever named. The backend map of each DNAT rule is an anonymous
//! map of the same transaction, as `nft` creates it for the rule above.

use std::net::IpAddr;

use netlink_packet_netfilter::nftables::MetaKey;

use crate::net::nft::nl::{self, Base, BaseChain, Batch, hook, nat};

/// Name of vipd's load-balancer table (families `ip` and `ip6`).
pub const TABLE: &str = "vipd_lb";
/// The DNAT chain (hook prerouting, priority dstnat).
pub const CHAIN_DNAT: &str = "prerouting";
/// The masquerade chain (hook postrouting, priority srcnat).
pub const CHAIN_SNAT: &str = "postrouting";
/// nftables' `dstnat` priority.
const PRIO_DSTNAT: i32 = -100;
/// nftables' `srcnat` priority.
const PRIO_SRCNAT: i32 = 100;

/// The address family of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4: `table ip vipd_lb`.
    Ip,
    /// IPv6: `table ip6 vipd_lb`.
    Ip6,
}

impl Family {
    /// Both families.
    pub const ALL: [Family; 2] = [Family::Ip, Family::Ip6];

    /// The family of `addr`.
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::Ip,
            IpAddr::V6(_) => Family::Ip6,
        }
    }

    /// `ip` or `ip6`, as `nft` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }

    fn nl(self) -> nl::Family {
        match self {
            Family::Ip => nl::Family::Ip,
            Family::Ip6 => nl::Family::Ip6,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one family's table forwards: connections to each VIP at `lb_port` go to the
/// `backends` at `port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    /// The table's family; every address below is of it.
    pub family: Family,
    /// The control-plane VIPs of this family.
    pub vips: Vec<IpAddr>,
    /// The frontend port (`lb_port`).
    pub lb_port: u16,
    /// The backends' port (`port`, the API server's).
    pub port: u16,
    /// Healthy backends, in a stable order (the round-robin order).
    pub backends: Vec<IpAddr>,
}

impl Ruleset {
    /// The DNAT rule's text for `vip` in `nft` syntax (what `add rule ... prerouting`
    /// follows with).
    fn dnat_text(&self, vip: IpAddr) -> String {
        let map = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("{i} : {b}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "{f} daddr {vip} fib daddr type local tcp dport {lp} counter dnat to numgen inc mod {n} map {{ {map} }}:{p}",
            f = self.family,
            lp = self.lb_port,
            n = self.backends.len(),
            p = self.port,
        )
    }
}

/// An address's bytes in network byte order.
fn octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// `payload load <family> daddr => reg 1; cmp eq reg 1 <vip>`.
fn daddr_is(vip: IpAddr) -> [nl::Expr; 2] {
    let (offset, len) = match vip {
        IpAddr::V4(_) => (16, 4),
        IpAddr::V6(_) => (24, 16),
    };
    [
        nl::payload(Base::Network, offset, len),
        nl::cmp(true, &octets(vip)),
    ]
}

/// `<family> daddr <vip> fib daddr type local tcp dport <lb_port> counter dnat to numgen inc
/// mod N map {...}:<port>`, the map being anonymous map `map_id` of the same batch.
fn dnat_exprs(rs: &Ruleset, vip: IpAddr, map_id: u32) -> Vec<nl::Expr> {
    /// IPPROTO_TCP.
    const TCP: u8 = 6;
    let n = u32::try_from(rs.backends.len()).unwrap_or(u32::MAX);
    let mut e = Vec::from(daddr_is(vip));
    e.extend(nat::fib_daddr_local());
    e.push(nl::meta(MetaKey::L4Proto));
    e.push(nl::cmp(true, &[TCP]));
    e.push(nl::payload(Base::Transport, 2, 2));
    e.push(nl::cmp(true, &rs.lb_port.to_be_bytes()));
    e.push(nl::counter());
    e.push(nat::numgen_inc(n));
    e.push(nat::map_lookup(nl::ANONYMOUS_MAP, map_id));
    e.extend(nat::dnat_to_port(rs.family.nl(), rs.port));
    e
}

/// `ct status dnat ct original <family> daddr <vip> counter masquerade`.
fn masquerade_exprs(family: Family, vip: IpAddr) -> Vec<nl::Expr> {
    let mut e = Vec::from(nat::ct_status_dnat());
    e.push(nat::ct_original_daddr(family.nl()));
    e.push(nl::cmp(true, &octets(vip)));
    e.push(nl::counter());
    e.push(nat::masquerade());
    e
}

/// `type nat hook <hook> priority <priority>; policy accept;`.
fn nat_chain(hook: u32, hook_name: &'static str, priority: i32) -> BaseChain {
    BaseChain {
        chain_type: "nat",
        hook,
        hook_name,
        priority,
    }
}

/// Deletes `<family> vipd_lb` whether it exists or not (`add table` first, so the delete
/// cannot fail): the removal on losing the lease or stopping, and the stale cleanup at start.
pub fn remove_batch(family: Family) -> Batch {
    nl::remove_table(family.nl(), TABLE)
}

/// Installs `rs` from scratch: deletes any table of that name (a stale one), creates the
/// table, both chains, the masquerade rules and the DNAT rules, in one transaction.
pub fn install_batch(rs: &Ruleset) -> Batch {
    let f = rs.family;
    let mut b = remove_batch(f);
    b.push(nl::add_table(f.nl(), TABLE));
    b.push(nl::add_chain(
        f.nl(),
        TABLE,
        CHAIN_DNAT,
        nat_chain(hook::PREROUTING, "prerouting", PRIO_DSTNAT),
    ));
    b.push(nl::add_chain(
        f.nl(),
        TABLE,
        CHAIN_SNAT,
        nat_chain(hook::POSTROUTING, "postrouting", PRIO_SRCNAT),
    ));
    for vip in &rs.vips {
        b.push(nl::add_rule(
            f.nl(),
            TABLE,
            CHAIN_SNAT,
            masquerade_exprs(f, *vip),
            &format!("ct status dnat ct original {f} daddr {vip} counter masquerade"),
        ));
    }
    push_dnat_rules(&mut b, rs);
    b
}

/// Points the DNAT rules at `rs.backends`: flushes the `prerouting` chain and refills it in
/// one transaction (connections already established keep their backend; the old rules'
/// anonymous maps go with them).
pub fn update_batch(rs: &Ruleset) -> Batch {
    let mut b = Batch::new();
    b.push(nl::flush_chain(rs.family.nl(), TABLE, CHAIN_DNAT));
    push_dnat_rules(&mut b, rs);
    b
}

/// One DNAT rule per VIP, each with its backend map (ids 1, 2, ...), none without backends.
fn push_dnat_rules(b: &mut Batch, rs: &Ruleset) {
    if rs.backends.is_empty() {
        return;
    }
    let addrs: Vec<Vec<u8>> = rs.backends.iter().map(|a| octets(*a)).collect();
    for (id, vip) in (1u32..).zip(&rs.vips) {
        b.append(nat::add_address_map(rs.family.nl(), TABLE, id, &addrs));
        b.push(nl::add_rule(
            rs.family.nl(),
            TABLE,
            CHAIN_DNAT,
            dnat_exprs(rs, *vip, id),
            &rs.dnat_text(*vip),
        ));
    }
}

#[cfg(test)]
mod tests;
