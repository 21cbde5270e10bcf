//! Egress through the VIP (kube-vip's `kube-vip.io/egress`), the nftables side: the
//! connections pods on this node open leave with their Service's VIP as source address,
//! only while this node's fence for that VIP runs.
//!
//! The chains live in the fence's own table (`inet vipd_fence`, [`super::fence`]) so that
//! their rules can look up the fence's `live4` / `live6` sets, whose elements exist only
//! while this node holds the VIP and its renewal-driven timeout runs (the fence keeps those
//! per-VIP elements for the VIPs [`NftEgress`] asks it to track, and each lives exactly as
//! its holder's element):
//!
//! ```text
//! table inet vipd_fence {
//!     chain egress_snat {
//!         type nat hook postrouting priority 99; policy accept;   # before srcnat (100)
//!         meta nfproto ipv4 ip saddr 198.51.100.11 ip daddr != 10.42.0.0/16 ...
//!             [ 192.0.2.50 in @live4 ] counter snat ip to 192.0.2.50
//!     }
//!     chain egress_guard {
//!         type filter hook postrouting priority 300; policy accept;   # after srcnat
//!         meta nfproto ipv4 ip saddr 192.0.2.50 ip saddr != @live4 counter drop
//!     }
//!     chain egress_moved {
//!         type filter hook forward priority 0; policy accept;
//!         meta nfproto ipv4 meta l4proto tcp ct reply ip daddr 192.0.2.50
//!             ct reply ip daddr != @live4 counter reject with tcp reset
//!     }
//! }
//! ```
//!
//! * The SNAT rule loads the VIP into a register and looks it up in `live4` before the
//!   `snat`: when the element is absent or expired (the VIP is not this node's, vipd was
//!   killed or froze) the rule does not match and the connection leaves as it would
//!   without vipd (the CNI's masquerade). So the rules can be installed ahead of time on
//!   every node with a local endpoint: they act from the moment this node's fence for the
//!   VIP is set, before the VIP is answered, and stop with it. `nft` itself cannot write
//!   such a rule (its `snat to` takes no set lookup of a constant), netlink can.
//! * The guard chain runs after source NAT: a packet leaving with an egress VIP as source
//!   while this node's fence for it does not run is dropped. That covers connections that
//!   were translated while this node held the VIP (conntrack keeps their translation after
//!   the VIP moved): they stop instead of sending with an address another node answers.
//! * The moved chain answers a pod's TCP packet of such a connection with a reset, so the
//!   application sees the connection end at once (its next packet then starts a new
//!   connection with the pod's usual source) instead of retransmitting into the guard's
//!   drop until TCP gives up; the conntrack entry itself is left to time out.
//! * Priority 99 puts the SNAT chain before iptables' and other tables' `srcnat` chains
//!   (100), where CNIs masquerade pod traffic; the first chain that translates a connection
//!   decides its source.
//!
//! The whole content is replaced in one transaction ([`apply_commands`]): both chains are
//! flushed and refilled, so a rule never exists half. [`super::fence::NftFence::start`]
//! replaces the table at start (rules of a killed run go with it); its close at exit too.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use netlink_packet_netfilter::nftables::{Bitwise, DataAttribute, Expressions, MetaKey, Register};

use super::fence::{FENCE_TABLE, VipFence};
use super::nl::{self, Base, Batch, Family, Kernel, Mode, Transport, be32, other};
use super::svcsec::L4;

/// The source NAT chain (type nat, hook postrouting, priority [`SNAT_PRIORITY`]).
pub const SNAT_CHAIN: &str = "egress_snat";
/// The guard chain (type filter, hook postrouting, priority [`GUARD_PRIORITY`]).
pub const GUARD_CHAIN: &str = "egress_guard";
/// The chain resetting pods' TCP connections translated to a VIP this node no longer
/// holds (type filter, hook forward, priority 0).
pub const MOVED_CHAIN: &str = "egress_moved";
/// One before `srcnat` (100), where iptables' `POSTROUTING` and CNIs' masquerade run.
pub const SNAT_PRIORITY: i32 = 99;
/// After every source NAT chain: sees the translated source.
pub const GUARD_PRIORITY: i32 = 300;

/// One source NAT rule: connections from `source` (a pod's address) to a destination that
/// passes the filters leave with `vip` as source, while `vip` is in this node's fence.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnatRule {
    /// The Service, `namespace/name`: the rule's comment, by which its counter is read.
    pub service: String,
    /// The Service VIP the connections leave with.
    pub vip: IpAddr,
    /// The endpoint's address (same family as `vip`).
    pub source: IpAddr,
    /// Destinations never translated (pod and service CIDRs, denied networks), of the
    /// rule's family.
    pub excluded: Vec<IpNet>,
    /// Only destinations in this network (one of `kube-vip.io/egress-allowed-networks`);
    /// `None`: any destination.
    pub allowed: Option<IpNet>,
    /// Only this destination protocol and port (one of
    /// `kube-vip.io/egress-destination-ports`); `None`: any.
    pub port: Option<(L4, u16)>,
}

impl fmt::Display for SnatRule {
    /// The rule in `nft`-like syntax (the live-set check in brackets: `nft` cannot say it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ip, live) = names(self.vip);
        write!(
            f,
            "meta nfproto {} {ip} saddr {}",
            family_name(self.vip),
            self.source
        )?;
        for n in &self.excluded {
            write!(f, " {ip} daddr != {n}")?;
        }
        if let Some(n) = &self.allowed {
            write!(f, " {ip} daddr {n}")?;
        }
        if let Some((l4, port)) = self.port {
            write!(f, " meta l4proto {} th dport {port}", l4.number())?;
        }
        write!(
            f,
            " [ {} in @{live} ] counter snat {ip} to {}",
            self.vip, self.vip
        )
    }
}

/// The table content: source NAT rules, in order, and the VIPs guarded after NAT.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressTable {
    /// The rules of [`SNAT_CHAIN`], in order (the first match translates).
    pub snat: Vec<SnatRule>,
    /// The VIPs of [`GUARD_CHAIN`], sorted, without duplicates.
    pub guarded: Vec<IpAddr>,
}

/// Errors of the egress chains; each names the commands concerned.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EgressError {
    /// Changing the chains failed (they are as before: the transaction is atomic). The
    /// usual cause: the fence table does not exist (`vip_nftfence` off or its setup failed).
    /// `command` is the batch's [`nl::Batch::summary`], `detail` the kernel's answer.
    #[error("cannot update the egress chains of inet {FENCE_TABLE}: `{command}` failed: {detail}")]
    Change {
        /// The commands, in `nft` syntax.
        command: String,
        /// The kernel's answer.
        detail: String,
    },
}

/// `ip` / `ip6` and the fence's live set of `addr`'s family.
fn names(addr: IpAddr) -> (&'static str, &'static str) {
    match addr {
        IpAddr::V4(_) => ("ip", "live4"),
        IpAddr::V6(_) => ("ip6", "live6"),
    }
}

fn family_name(addr: IpAddr) -> &'static str {
    match addr {
        IpAddr::V4(_) => "ipv4",
        IpAddr::V6(_) => "ipv6",
    }
}

fn octets(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// `meta nfproto <family>`.
fn nfproto(addr: IpAddr) -> [nl::Expr; 2] {
    let p = match addr {
        IpAddr::V4(_) => libc::NFPROTO_IPV4,
        IpAddr::V6(_) => libc::NFPROTO_IPV6,
    };
    [nl::meta(MetaKey::Nfproto), nl::cmp(true, &[p as u8])]
}

/// The source (`daddr == false`) or destination address of `addr`'s family into reg 1.
fn load_addr(addr: IpAddr, daddr: bool) -> nl::Expr {
    match (addr, daddr) {
        (IpAddr::V4(_), false) => nl::payload(Base::Network, 12, 4),
        (IpAddr::V4(_), true) => nl::payload(Base::Network, 16, 4),
        (IpAddr::V6(_), false) => nl::payload(Base::Network, 8, 16),
        (IpAddr::V6(_), true) => nl::payload(Base::Network, 24, 16),
    }
}

/// `<ip> daddr [!=] <net>`: the destination masked to the prefix, compared.
fn daddr_in(net: &IpNet, equal: bool) -> [nl::Expr; 3] {
    let mask = octets(net.netmask());
    [
        load_addr(net.addr(), true),
        Expressions::Bitwise(vec![
            Bitwise::SourceRegister(Register::Reg1),
            Bitwise::DestinationRegister(Register::Reg1),
            Bitwise::Length(mask.len() as u32),
            Bitwise::Mask(DataAttribute::Value(mask.clone())),
            Bitwise::Xor(DataAttribute::Value(vec![0; mask.len()])),
        ])
        .into(),
        nl::cmp(equal, &octets(net.network())),
    ]
}

/// `lookup reg 1 set <live>` (by name: the set is the fence's, not of this batch);
/// `invert`: not in the set.
fn live(addr: IpAddr, invert: bool) -> nl::Expr {
    nl::lookup_named(names(addr).1, Register::Reg1, invert)
}

/// `immediate reg 1 <vip>; lookup reg 1 @liveN; counter; nat snat <family> addr_min reg 1`.
fn snat_to(vip: IpAddr) -> [nl::Expr; 4] {
    let nfproto = match vip {
        IpAddr::V4(_) => libc::NFPROTO_IPV4,
        IpAddr::V6(_) => libc::NFPROTO_IPV6,
    };
    [
        nl::immediate(Register::Reg1, &octets(vip)),
        live(vip, false),
        nl::counter(),
        // NFTA_NAT_TYPE (NFT_NAT_SNAT 0), NFTA_NAT_FAMILY, NFTA_NAT_REG_ADDR_MIN.
        other("nat", vec![be32(1, 0), be32(2, nfproto as u32), be32(3, 1)]),
    ]
}

/// The expressions of one source NAT rule.
pub fn snat_exprs(r: &SnatRule) -> Vec<nl::Expr> {
    let mut e = nfproto(r.vip).to_vec();
    e.push(load_addr(r.source, false));
    e.push(nl::cmp(true, &octets(r.source)));
    for n in &r.excluded {
        e.extend(daddr_in(n, false));
    }
    if let Some(n) = &r.allowed {
        e.extend(daddr_in(n, true));
    }
    if let Some((l4, port)) = r.port {
        e.push(nl::meta(MetaKey::L4Proto));
        e.push(nl::cmp(true, &[l4.number()]));
        e.push(nl::payload(Base::Transport, 2, 2));
        e.push(nl::cmp(true, &port.to_be_bytes()));
    }
    e.extend(snat_to(r.vip));
    e
}

/// The expressions of one guard rule: `<ip> saddr <vip> <ip> saddr != @liveN counter drop`.
pub fn guard_exprs(vip: IpAddr) -> Vec<nl::Expr> {
    let mut e = nfproto(vip).to_vec();
    e.push(load_addr(vip, false));
    e.push(nl::cmp(true, &octets(vip)));
    e.push(live(vip, true));
    e.push(nl::counter());
    e.push(nl::verdict(nl::NF_DROP));
    e
}

/// The expressions of one moved-connection rule: `meta l4proto tcp ct reply <ip> daddr
/// <vip> ct reply <ip> daddr != @liveN counter reject with tcp reset`.
pub fn moved_exprs(vip: IpAddr) -> Vec<nl::Expr> {
    let family = match vip {
        IpAddr::V4(_) => Family::Ip,
        IpAddr::V6(_) => Family::Ip6,
    };
    let mut e = nfproto(vip).to_vec();
    e.push(nl::meta(MetaKey::L4Proto));
    e.push(nl::cmp(true, &[libc::IPPROTO_TCP as u8]));
    e.push(nl::nat::ct_reply_daddr(family));
    e.push(nl::cmp(true, &octets(vip)));
    e.push(live(vip, true));
    e.push(nl::counter());
    e.push(nl::nat::reject_tcp_reset());
    e
}

/// The batch making the chains hold exactly `table`: the chains created if missing,
/// flushed, refilled, in one transaction.
pub fn apply_commands(table: &EgressTable) -> Batch {
    let t = FENCE_TABLE;
    let mut c = Batch::new();
    let snat = nl::BaseChain {
        chain_type: "nat",
        hook: nl::hook::POSTROUTING,
        hook_name: "postrouting",
        priority: SNAT_PRIORITY,
    };
    let guard = nl::BaseChain {
        chain_type: "filter",
        hook: nl::hook::POSTROUTING,
        hook_name: "postrouting",
        priority: GUARD_PRIORITY,
    };
    let moved = nl::BaseChain {
        chain_type: "filter",
        hook: nl::hook::FORWARD,
        hook_name: "forward",
        priority: 0,
    };
    c.push(nl::add_chain(Family::Inet, t, SNAT_CHAIN, snat));
    c.push(nl::add_chain(Family::Inet, t, GUARD_CHAIN, guard));
    c.push(nl::add_chain(Family::Inet, t, MOVED_CHAIN, moved));
    for chain in [SNAT_CHAIN, GUARD_CHAIN, MOVED_CHAIN] {
        c.push(nl::flush_chain(Family::Inet, t, chain));
    }
    for r in &table.snat {
        c.push(nl::add_rule_commented(
            Family::Inet,
            t,
            SNAT_CHAIN,
            snat_exprs(r),
            &r.to_string(),
            &r.service,
        ));
    }
    for vip in &table.guarded {
        let (ip, live) = names(*vip);
        let text = format!(
            "meta nfproto {} {ip} saddr {vip} {ip} saddr != @{live} counter drop",
            family_name(*vip)
        );
        c.push(nl::add_rule(
            Family::Inet,
            t,
            GUARD_CHAIN,
            guard_exprs(*vip),
            &text,
        ));
        let text = format!(
            "meta nfproto {} meta l4proto tcp ct reply {ip} daddr {vip} ct reply {ip} daddr != @{live} counter reject with tcp reset",
            family_name(*vip)
        );
        c.push(nl::add_rule(
            Family::Inet,
            t,
            MOVED_CHAIN,
            moved_exprs(*vip),
            &text,
        ));
    }
    c
}

/// Checks, without changing anything, that the kernel accepts the egress chains (one rule
/// of each family with every kind of filter, and a guard) in a fresh fence table: the
/// fence's setup batch followed by [`apply_commands`], sent in check mode (validated, then
/// aborted). For `vipd preflight`.
///
/// # Errors
/// [`EgressError::Change`] naming the commands and the kernel's answer.
pub async fn check() -> Result<(), EgressError> {
    let rule = |vip: &str, source: &str, net: &str| SnatRule {
        service: "vipd/preflight".into(),
        vip: vip
            .parse()
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
        source: source
            .parse()
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
        excluded: net.parse().into_iter().collect(),
        allowed: net.parse().ok(),
        port: Some((L4::Tcp, 443)),
    };
    let table = EgressTable {
        snat: vec![
            rule("192.0.2.1", "198.51.100.1", "203.0.113.0/24"),
            rule("2001:db8::1", "2001:db8:1::1", "2001:db8:2::/48"),
        ],
        guarded: vec![IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1))],
    };
    let mut c = super::fence::setup_commands();
    c.append(apply_commands(&table));
    nl::send_with(&Kernel, c.clone(), Mode::Check)
        .await
        .map_err(|e| EgressError::Change {
            command: c.summary(),
            detail: e.answer(),
        })
}

/// The connections the source NAT rules translated so far, per Service (the rules'
/// comments; a nat chain sees the first packet of a connection only, so its counter counts
/// connections). Counters start at 0 whenever [`apply_commands`] replaced the rules.
///
/// # Errors
/// [`EgressError::Change`] (no such chain: nothing was ever applied, or the fence table is
/// gone).
pub async fn translated() -> Result<std::collections::BTreeMap<String, u64>, EgressError> {
    let rules = nl::dump::rule_counts(Family::Inet, FENCE_TABLE, SNAT_CHAIN)
        .await
        .map_err(|e| EgressError::Change {
            command: format!("list chain inet {FENCE_TABLE} {SNAT_CHAIN}"),
            detail: e.answer(),
        })?;
    let mut out = std::collections::BTreeMap::new();
    for r in rules {
        if let Some(service) = r.comment {
            *out.entry(service).or_insert(0) += r.packets;
        }
    }
    Ok(out)
}

/// The egress chains of the fence table, changed through netlink ([`nl`]), and the fence
/// that keeps their VIPs' own live elements (`live4`/`live6`, [`VipFence::track`]).
#[derive(Debug, Clone)]
pub struct NftEgress {
    transport: Arc<dyn Transport>,
    fence: Option<Arc<dyn VipFence>>,
    /// The VIPs the fence was last asked to track.
    tracked: Arc<tokio::sync::Mutex<Vec<IpAddr>>>,
}

impl Default for NftEgress {
    fn default() -> Self {
        NftEgress::new(Arc::new(Kernel))
    }
}

impl NftEgress {
    /// The chains through `transport` (the kernel: [`NftEgress::default`]), with no fence to
    /// ask for the VIPs' own elements (the rules' VIPs stay unanswered unless something else
    /// tracks them: tests of the chains alone).
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        NftEgress {
            transport,
            fence: None,
            tracked: Arc::default(),
        }
    }

    /// The same chains, asking `fence` to keep each rule's VIP live one by one
    /// ([`VipFence::track`]), which the rules look up.
    pub fn with_fence(mut self, fence: Arc<dyn VipFence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Makes the chains hold exactly `table` ([`apply_commands`]). With a fence, the VIPs of
    /// both the old and the new rules are tracked before the change (a new rule never looks
    /// up a VIP whose element is missing while its holder's lives: the guard would drop its
    /// traffic), and only the new ones after it.
    ///
    /// # Errors
    /// [`EgressError::Change`] when the kernel refuses (no fence table: `vip_nftfence` off
    /// or failed; no `nat` support for the `inet` family, kernels before 5.2): the chains
    /// are as before.
    pub async fn apply(&self, table: &EgressTable) -> Result<(), EgressError> {
        let want: Vec<IpAddr> = table
            .snat
            .iter()
            .map(|r| r.vip)
            .chain(table.guarded.iter().copied())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut tracked = self.tracked.lock().await;
        let track = |vips: Vec<IpAddr>| async move {
            match &self.fence {
                Some(f) => f.track(&vips).await.map_err(|e| EgressError::Change {
                    command: format!("track {} VIPs in the fence's live4/live6", vips.len()),
                    detail: e.to_string(),
                }),
                None => Ok(()),
            }
        };
        let both: std::collections::BTreeSet<IpAddr> =
            tracked.iter().chain(want.iter()).copied().collect();
        track(both.iter().copied().collect()).await?;
        *tracked = both.into_iter().collect();
        let c = apply_commands(table);
        nl::send_with(self.transport.as_ref(), c.clone(), Mode::Commit)
            .await
            .map_err(|e| EgressError::Change {
                command: c.summary(),
                detail: e.answer(),
            })?;
        if *tracked != want {
            // On failure the old VIPs stay tracked (harmless) until the next change.
            if track(want.clone()).await.is_ok() {
                *tracked = want;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
