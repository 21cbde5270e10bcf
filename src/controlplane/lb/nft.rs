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
//! Every change is one atomic `nft` transaction ([`NftBatch`]): the first install replaces a
//! stale table left by an earlier run, a backend change flushes and refills the
//! `prerouting` chain, removal deletes the table. No other table is ever named.

use std::net::IpAddr;

use nftables::expr::{
    CT, CTDir, Expression, Fib, FibFlag, FibResult, Map, NamedExpression, NgMode, Numgen, Payload,
    PayloadField, SetItem,
};
use nftables::schema::{Chain, NfCmd, NfListObject, Rule, Table};
use nftables::stmt::{Counter, Match, NAT, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use crate::net::nft::NftBatch;

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

    fn nf(self) -> NfFamily {
        match self {
            Family::Ip => NfFamily::IP,
            Family::Ip6 => NfFamily::IP6,
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
    /// The `nft` command that adds this ruleset's DNAT rule for `vip`, `None` without
    /// backends.
    fn dnat_text(&self, vip: IpAddr) -> Option<String> {
        if self.backends.is_empty() {
            return None;
        }
        let map = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("{i} : {b}"))
            .collect::<Vec<_>>()
            .join(", ");
        Some(format!(
            "add rule {f} {TABLE} {CHAIN_DNAT} {f} daddr {vip} fib daddr type local tcp dport {lp} counter dnat to numgen inc mod {n} map {{ {map} }}:{p}",
            f = self.family,
            lp = self.lb_port,
            n = self.backends.len(),
            p = self.port,
        ))
    }
}

fn table(family: Family) -> Table<'static> {
    Table {
        family: family.nf(),
        name: TABLE.into(),
        handle: None,
    }
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: protocol.into(),
            field: field.into(),
        },
    )))
}

fn eq(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

fn addr(a: IpAddr) -> Expression<'static> {
    Expression::String(a.to_string().into())
}

/// `<family> daddr <vip> fib daddr type local tcp dport <lb_port> counter dnat to numgen inc
/// mod N map {...}:<port>`.
fn dnat_rule(rs: &Ruleset, vip: IpAddr) -> Rule<'static> {
    let map = rs
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| SetItem::Mapping(Expression::Number(i as u32), addr(*b)))
        .collect::<Vec<_>>();
    let to = Expression::Named(NamedExpression::Map(Box::new(Map {
        key: Expression::Named(NamedExpression::Numgen(Numgen {
            mode: NgMode::Inc,
            ng_mod: rs.backends.len() as u32,
            offset: Some(0),
        })),
        data: Expression::Named(NamedExpression::Set(map)),
    })));
    Rule {
        family: rs.family.nf(),
        table: TABLE.into(),
        chain: CHAIN_DNAT.into(),
        expr: vec![
            eq(payload(rs.family.name(), "daddr"), addr(vip)),
            eq(
                Expression::Named(NamedExpression::Fib(Fib {
                    result: FibResult::Type,
                    flags: [FibFlag::Daddr].into_iter().collect(),
                })),
                Expression::String("local".into()),
            ),
            eq(
                payload("tcp", "dport"),
                Expression::Number(u32::from(rs.lb_port)),
            ),
            Statement::Counter(Counter::Anonymous(None)),
            Statement::DNAT(Some(NAT {
                addr: Some(to),
                family: None,
                port: Some(Expression::Number(u32::from(rs.port))),
                flags: None,
            })),
        ]
        .into(),
        ..Rule::default()
    }
}

/// `ct status dnat ct original <family> daddr <vip> counter masquerade`.
fn masquerade_rule(family: Family, vip: IpAddr) -> Rule<'static> {
    let ct = |key: &'static str, dir: Option<CTDir>| {
        Expression::Named(NamedExpression::CT(CT {
            key: key.into(),
            family: None,
            dir,
        }))
    };
    let daddr = match family {
        Family::Ip => "ip daddr",
        Family::Ip6 => "ip6 daddr",
    };
    Rule {
        family: family.nf(),
        table: TABLE.into(),
        chain: CHAIN_SNAT.into(),
        expr: vec![
            Statement::Match(Match {
                left: ct("status", None),
                right: Expression::String("dnat".into()),
                op: Operator::IN,
            }),
            eq(ct(daddr, Some(CTDir::Original)), addr(vip)),
            Statement::Counter(Counter::Anonymous(None)),
            Statement::Masquerade(None),
        ]
        .into(),
        ..Rule::default()
    }
}

fn nat_chain(family: Family, name: &'static str, hook: NfHook, prio: i32) -> Chain<'static> {
    Chain {
        family: family.nf(),
        table: TABLE.into(),
        name: name.into(),
        _type: Some(NfChainType::NAT),
        hook: Some(hook),
        prio: Some(prio),
        policy: Some(NfChainPolicy::Accept),
        ..Chain::default()
    }
}

/// Deletes `<family> vipd_lb` whether it exists or not (`add table` first, so the delete
/// cannot fail): the removal on losing the lease or stopping, and the stale cleanup at start.
pub fn remove_batch(family: Family) -> NftBatch {
    let mut b = NftBatch::new();
    b.push(
        NfCmd::Add(NfListObject::Table(table(family))),
        format!("add table {family} {TABLE}"),
    );
    b.push(
        NfCmd::Delete(NfListObject::Table(table(family))),
        format!("delete table {family} {TABLE}"),
    );
    b
}

/// Installs `rs` from scratch: deletes any table of that name (a stale one), creates the
/// table, both chains, the masquerade rules and the DNAT rules, in one transaction.
pub fn install_batch(rs: &Ruleset) -> NftBatch {
    let f = rs.family;
    let mut b = remove_batch(f);
    b.push(
        NfCmd::Add(NfListObject::Table(table(f))),
        format!("add table {f} {TABLE}"),
    );
    b.push(
        NfCmd::Add(NfListObject::Chain(nat_chain(
            f,
            CHAIN_DNAT,
            NfHook::Prerouting,
            PRIO_DSTNAT,
        ))),
        format!(
            "add chain {f} {TABLE} {CHAIN_DNAT} {{ type nat hook prerouting priority dstnat; policy accept; }}"
        ),
    );
    b.push(
        NfCmd::Add(NfListObject::Chain(nat_chain(
            f,
            CHAIN_SNAT,
            NfHook::Postrouting,
            PRIO_SRCNAT,
        ))),
        format!(
            "add chain {f} {TABLE} {CHAIN_SNAT} {{ type nat hook postrouting priority srcnat; policy accept; }}"
        ),
    );
    for vip in &rs.vips {
        b.push(
            NfCmd::Add(NfListObject::Rule(masquerade_rule(f, *vip))),
            format!(
                "add rule {f} {TABLE} {CHAIN_SNAT} ct status dnat ct original {f} daddr {vip} counter masquerade"
            ),
        );
    }
    push_dnat_rules(&mut b, rs);
    b
}

/// Points the DNAT rules at `rs.backends`: flushes the `prerouting` chain and refills it in
/// one transaction (connections already established keep their backend).
pub fn update_batch(rs: &Ruleset) -> NftBatch {
    let f = rs.family;
    let mut b = NftBatch::new();
    b.push(
        NfCmd::Flush(nftables::schema::FlushObject::Chain(Chain {
            family: f.nf(),
            table: TABLE.into(),
            name: CHAIN_DNAT.into(),
            ..Chain::default()
        })),
        format!("flush chain {f} {TABLE} {CHAIN_DNAT}"),
    );
    push_dnat_rules(&mut b, rs);
    b
}

fn push_dnat_rules(b: &mut NftBatch, rs: &Ruleset) {
    for vip in &rs.vips {
        if let Some(text) = rs.dnat_text(*vip) {
            b.push(NfCmd::Add(NfListObject::Rule(dnat_rule(rs, *vip))), text);
        }
    }
}

#[cfg(test)]
mod tests;
