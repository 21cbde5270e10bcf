//! Service security (kube-vip's `enable_service_security` / `--onlyAllowTrafficServicePorts`):
//! on the node announcing a Service VIP, only the Service's own ports reach the VIP in the
//! INPUT path; everything else to it is dropped. vipd's own table, changed through netlink
//! ([`super::nl`]):
//!
//! ```text
//! table inet vipd_svcsec {
//!     set guard4 { type ipv4_addr; }                                 # guarded VIPs
//!     set guard6 { type ipv6_addr; }
//!     set allow4 { type ipv4_addr . inet_proto . inet_service; }     # VIP . proto . port
//!     set allow6 { type ipv6_addr . inet_proto . inet_service; }
//!     chain input {
//!         type filter hook input priority filter; policy accept;
//!         ip daddr . meta l4proto . th dport @allow4 accept
//!         ip6 daddr . meta l4proto . th dport @allow6 accept
//!         ip daddr @guard4 udp dport 68 accept
//!         ip6 daddr @guard6 udp dport 68 accept
//!         ip6 daddr @guard6 icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
//!         ip daddr @guard4 counter drop
//!         ip6 daddr @guard6 counter drop
//!     }
//! }
//! ```
//!
//! kube-vip (pkg/vip/address.go, `configureNFTables`, `addNftablesRulesToLimitTrafficPorts`,
//! `insertCommonNFTablesRules`, `insertNFTablesRulesForServicePorts`) inserts, per Service
//! VIP, a rule accepting UDP 68 (the DHCP client, pkg/vip/dhcpv4.go `dhcpClientPort`), one
//! rule and one anonymous set per protocol accepting the Service's ports, and a drop rule,
//! into the shared `filter INPUT` chain. vipd keeps the same verdicts in its own table, with
//! the VIPs and ports as set elements: adding or removing a Service is adding or deleting
//! its elements in one atomic transaction, the ruleset itself never changes, and a lookup
//! costs the same for one Service as for thousands. One difference, for IPv6: unicast
//! neighbour solicitations and advertisements to the VIP (neighbour unreachability
//! detection, RFC 4861 §7.3) are accepted; kube-vip drops them, which makes routers fall
//! back to multicast solicitations.
//!
//! Accepting here only ends this chain: the packet still meets every other table's INPUT
//! chains (iptables' included), so the table never opens what another one closes. It is
//! vipd's alone: [`NftSvcSec::start`] replaces one left by an earlier run, [`NftSvcSec::close`]
//! deletes it, no other table is read or changed.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use netlink_packet_netfilter::nftables::{MetaKey, Register};

use super::nl::{self, Base, Batch, Family, Kernel, Mode, Transport};

/// Name of vipd's Service security table (family `inet`).
pub const SVCSEC_TABLE: &str = "vipd_svcsec";

/// The DHCP client port, always open on a guarded VIP (kube-vip `dhcpClientPort`,
/// pkg/vip/dhcpv4.go): DHCP-mode addresses are renewed by unicast to the address itself.
pub const DHCP_CLIENT_PORT: u16 = 68;

/// A transport protocol a Service port may have (`spec.ports[].protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum L4 {
    /// `TCP` (IP protocol 6).
    Tcp,
    /// `UDP` (IP protocol 17).
    Udp,
    /// `SCTP` (IP protocol 132).
    Sctp,
}

impl L4 {
    /// The Kubernetes protocol name (`TCP`, `UDP`, `SCTP`, case-sensitive as the API's
    /// validation has it); `None` for any other.
    pub fn from_kubernetes(name: &str) -> Option<L4> {
        match name {
            "TCP" => Some(L4::Tcp),
            "UDP" => Some(L4::Udp),
            "SCTP" => Some(L4::Sctp),
            _ => None,
        }
    }

    /// The IP protocol number, as the set elements carry it (a number, so that `nft` needs
    /// no `/etc/protocols`).
    pub fn number(self) -> u8 {
        match self {
            L4::Tcp => 6,
            L4::Udp => 17,
            L4::Sctp => 132,
        }
    }
}

/// One element of the table's sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Element {
    /// The VIP is guarded: traffic to it not allowed below is dropped.
    Guard(IpAddr),
    /// Traffic to the VIP with this protocol and destination port passes.
    Allow(IpAddr, L4, u16),
}

impl Element {
    /// The set the element belongs to.
    pub fn set(&self) -> &'static str {
        match self {
            Element::Guard(IpAddr::V4(_)) => "guard4",
            Element::Guard(IpAddr::V6(_)) => "guard6",
            Element::Allow(IpAddr::V4(_), _, _) => "allow4",
            Element::Allow(IpAddr::V6(_), _, _) => "allow6",
        }
    }

    /// The element in `nft` syntax (`192.0.2.10`, `192.0.2.10 . 6 . 80`).
    pub fn value(&self) -> String {
        match self {
            Element::Guard(vip) => vip.to_string(),
            Element::Allow(vip, l4, port) => format!("{vip} . {} . {port}", l4.number()),
        }
    }
}

impl Element {
    /// The element's key bytes: the address, then (allow elements) the protocol and the
    /// port in network byte order, each field padded to 4 bytes.
    pub fn key(&self) -> Vec<u8> {
        let addr = |a: &IpAddr| match a {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        match self {
            Element::Guard(vip) => addr(vip),
            Element::Allow(vip, l4, port) => {
                let mut k = addr(vip);
                k.extend([l4.number(), 0, 0, 0]);
                k.extend(port.to_be_bytes());
                k.extend([0, 0]);
                k
            }
        }
    }
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {{ {} }}", self.set(), self.value())
    }
}

/// Errors of the Service security table; each names the `nft` commands concerned.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SvcSecError {
    /// Creating the table failed (kernel without nf_tables `inet`, no
    /// CAP_NET_ADMIN).
    #[error(
        "cannot create the Service security table inet {SVCSEC_TABLE}: `{command}` failed: {detail}"
    )]
    Setup {
        /// The commands, in `nft` syntax.
        command: String,
        /// `nft`'s error output, or why it could not run.
        detail: String,
    },
    /// Changing the sets failed (they are as before: the transaction is atomic).
    #[error(
        "cannot update the Service security table inet {SVCSEC_TABLE}: `{command}` failed: {detail}"
    )]
    Change {
        /// The commands, in `nft` syntax.
        command: String,
        /// `nft`'s error output, or why it could not run.
        detail: String,
    },
    /// Deleting the table failed.
    #[error(
        "cannot delete the Service security table inet {SVCSEC_TABLE}: `{command}` failed: {detail}"
    )]
    Remove {
        /// The commands, in `nft` syntax.
        command: String,
        /// `nft`'s error output, or why it could not run.
        detail: String,
    },
}

/// The batch deleting the table whether it exists or not.
pub fn remove_commands() -> Batch {
    nl::remove_table(Family::Inet, SVCSEC_TABLE)
}

/// Set ids within the setup batch (rules refer to sets by name and id).
const GUARD4: (&str, u32) = ("guard4", 1);
const GUARD6: (&str, u32) = ("guard6", 2);
const ALLOW4: (&str, u32) = ("allow4", 3);
const ALLOW6: (&str, u32) = ("allow6", 4);
/// The anonymous `{ nd-neighbor-solicit, nd-neighbor-advert }` set's id.
const ND_TYPES_ID: u32 = 5;

/// `nft`'s user data of `type ipvN_addr . inet_proto . inet_service` and of the anonymous
/// `icmpv6_type` set, copied from what nftables 1.0.6 sends (shown by `nft list`).
const ALLOW_USERDATA: &str = "000400000000030800040d0000000100";
const ND_TYPES_USERDATA: &str = "0004020000000314000407000000010c00040e000000010401000000";

fn svcsec_sets() -> Vec<nl::SetSpec> {
    let set = |(name, id): (&'static str, u32), key_type, key_len, userdata, shown| nl::SetSpec {
        name,
        id,
        key_type,
        key_len,
        timeout: false,
        userdata,
        shown,
    };
    let be = nl::keybyteorder(2);
    let allow = nl::unhex(ALLOW_USERDATA);
    // Concatenations: 6 bits a field type (ipv4_addr 7, ipv6_addr 8, inet_proto 12,
    // inet_service 13), fields padded to 4 bytes.
    vec![
        set(GUARD4, 7, 4, be.clone(), "{ type ipv4_addr; }"),
        set(GUARD6, 8, 16, be, "{ type ipv6_addr; }"),
        set(
            ALLOW4,
            (7 << 12) | (12 << 6) | 13,
            12,
            allow.clone(),
            "{ type ipv4_addr . inet_proto . inet_service; }",
        ),
        set(
            ALLOW6,
            (8 << 12) | (12 << 6) | 13,
            24,
            allow,
            "{ type ipv6_addr . inet_proto . inet_service; }",
        ),
    ]
}

/// `ip daddr` (`ip6 daddr` when `v6`) in an `inet` table: the family match and the load.
fn daddr(v6: bool) -> Vec<nl::Expr> {
    let (proto, offset, len) = if v6 {
        (libc::NFPROTO_IPV6, 24, 16)
    } else {
        (libc::NFPROTO_IPV4, 16, 4)
    };
    vec![
        nl::meta(MetaKey::Nfproto),
        nl::cmp(true, &[proto as u8]),
        nl::payload(Base::Network, offset, len),
    ]
}

/// `<daddr> . meta l4proto . th dport @allowN accept`.
fn allow_rule(v6: bool) -> Vec<nl::Expr> {
    // The concatenation's fields go to consecutive 32-bit registers after the address.
    let (l4, port, set) = if v6 {
        (Register::Reg2, Register::Reg32_05, ALLOW6)
    } else {
        (Register::Reg32_01, Register::Reg32_02, ALLOW4)
    };
    let mut e = daddr(v6);
    e.extend([
        nl::meta_to(MetaKey::L4Proto, l4),
        nl::payload_to(Base::Transport, 2, 2, port),
        nl::lookup(set.0, set.1, false),
        nl::verdict(nl::NF_ACCEPT),
    ]);
    e
}

/// `<daddr> @guardN <then...>`.
fn guarded(v6: bool, then: Vec<nl::Expr>) -> Vec<nl::Expr> {
    let set = if v6 { GUARD6 } else { GUARD4 };
    let mut e = daddr(v6);
    e.push(nl::lookup(set.0, set.1, false));
    e.extend(then);
    e
}

/// `meta l4proto <proto>`.
fn l4proto(proto: i32) -> [nl::Expr; 2] {
    [nl::meta(MetaKey::L4Proto), nl::cmp(true, &[proto as u8])]
}

/// The table's rules, in order: `(expressions, text)`.
fn svcsec_rules() -> Vec<(Vec<nl::Expr>, String)> {
    let p = DHCP_CLIENT_PORT;
    let dhcp = |v6| {
        let mut then = l4proto(libc::IPPROTO_UDP).to_vec();
        then.extend([
            nl::payload(Base::Transport, 2, 2),
            nl::cmp(true, &p.to_be_bytes()),
            nl::verdict(nl::NF_ACCEPT),
        ]);
        guarded(v6, then)
    };
    let mut nd = l4proto(libc::IPPROTO_ICMPV6).to_vec();
    nd.extend([
        nl::payload(Base::Transport, 0, 1),
        nl::lookup(nl::ANONYMOUS_SET, ND_TYPES_ID, false),
        nl::verdict(nl::NF_ACCEPT),
    ]);
    let drop = || vec![nl::counter(), nl::verdict(nl::NF_DROP)];
    vec![
        (
            allow_rule(false),
            "ip daddr . meta l4proto . th dport @allow4 accept".into(),
        ),
        (
            allow_rule(true),
            "ip6 daddr . meta l4proto . th dport @allow6 accept".into(),
        ),
        (
            dhcp(false),
            format!("ip daddr @guard4 udp dport {p} accept"),
        ),
        (
            dhcp(true),
            format!("ip6 daddr @guard6 udp dport {p} accept"),
        ),
        (
            guarded(true, nd),
            "ip6 daddr @guard6 icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept"
                .into(),
        ),
        (
            guarded(false, drop()),
            "ip daddr @guard4 counter drop".into(),
        ),
        (
            guarded(true, drop()),
            "ip6 daddr @guard6 counter drop".into(),
        ),
    ]
}

/// The batch (re)creating the table with empty sets (a table left by an earlier run
/// is deleted in the same transaction).
pub fn setup_commands() -> Batch {
    let t = SVCSEC_TABLE;
    let mut c = remove_commands();
    c.push(nl::add_table(Family::Inet, t));
    for spec in svcsec_sets() {
        c.push(nl::add_set(Family::Inet, t, &spec));
    }
    let filter = nl::BaseChain {
        chain_type: "filter",
        hook: nl::hook::INPUT,
        hook_name: "input",
        priority: 0,
    };
    c.push(nl::add_chain(Family::Inet, t, "input", filter));
    // ICMPv6 types 135 and 136: neighbour solicitation and advertisement.
    c.append(nl::add_anonymous_set(
        Family::Inet,
        t,
        ND_TYPES_ID,
        // icmpv6_type
        29,
        &[&[135], &[136]],
        &nl::unhex(ND_TYPES_USERDATA),
        "{ nd-neighbor-solicit, nd-neighbor-advert }",
    ));
    for (exprs, text) in svcsec_rules() {
        c.push(nl::add_rule(Family::Inet, t, "input", exprs, &text));
    }
    c
}

/// The batch turning the sets' content from `from` into `to`: elements only in `to`
/// are added, elements only in `from` deleted (each delete follows an add of the same
/// element, so it never fails, whatever the kernel holds). Allow elements are added before
/// guards and guards deleted before allow elements, though one transaction is atomic
/// anyway. Empty when nothing changes.
pub fn change_commands(from: &BTreeSet<Element>, to: &BTreeSet<Element>) -> Batch {
    let t = SVCSEC_TABLE;
    let add = |e: &Element| nl::add_element(Family::Inet, t, e.set(), &e.key(), None, &e.value());
    let del = |e: &Element| nl::delete_element(Family::Inet, t, e.set(), &e.key(), &e.value());
    let mut c = Batch::new();
    let gone: Vec<&Element> = from.difference(to).collect();
    for e in gone.iter().filter(|e| matches!(e, Element::Guard(_))) {
        c.push(add(e));
        c.push(del(e));
    }
    for e in gone.iter().filter(|e| matches!(e, Element::Allow(..))) {
        c.push(add(e));
        c.push(del(e));
    }
    let new = to.difference(from);
    let (allow, guard): (Vec<&Element>, Vec<&Element>) =
        new.partition(|e| matches!(e, Element::Allow(..)));
    for e in allow.into_iter().chain(guard) {
        c.push(add(e));
    }
    c
}

/// The real table: `inet vipd_svcsec`, changed through netlink ([`nl`]).
#[derive(Debug)]
pub struct NftSvcSec {
    transport: Arc<dyn Transport>,
    /// The sets' content as of the last successful run; one run at a time.
    applied: tokio::sync::Mutex<BTreeSet<Element>>,
}

/// Sends `b` through `transport`; the error is the kernel's answer as text.
async fn send(transport: &dyn Transport, b: &Batch, mode: Mode) -> Result<(), String> {
    nl::send_with(transport, b.clone(), mode)
        .await
        .map_err(|e| e.to_string())
}

impl NftSvcSec {
    /// Creates the table with empty sets (replacing one left by an earlier run).
    ///
    /// # Errors
    /// [`SvcSecError::Setup`] when the kernel refuses.
    pub async fn start() -> Result<Self, SvcSecError> {
        Self::start_with(Arc::new(Kernel)).await
    }

    /// [`NftSvcSec::start`] through `transport`.
    ///
    /// # Errors
    /// As [`NftSvcSec::start`].
    pub async fn start_with(transport: Arc<dyn Transport>) -> Result<Self, SvcSecError> {
        let c = setup_commands();
        send(transport.as_ref(), &c, Mode::Commit)
            .await
            .map_err(|detail| SvcSecError::Setup {
                command: c.text(),
                detail,
            })?;
        Ok(NftSvcSec {
            transport,
            applied: tokio::sync::Mutex::new(BTreeSet::new()),
        })
    }

    /// Checks, without changing anything (the batch is validated by the kernel and
    /// aborted), that the table could be created: for `vipd preflight`.
    ///
    /// # Errors
    /// [`SvcSecError::Setup`] as [`NftSvcSec::start`].
    pub async fn check() -> Result<(), SvcSecError> {
        let c = setup_commands();
        send(&Kernel, &c, Mode::Check)
            .await
            .map_err(|detail| SvcSecError::Setup {
                command: c.text(),
                detail,
            })
    }

    /// Makes the sets hold exactly `to`, in one transaction ([`change_commands`]); nothing
    /// is sent when they already do. Returns whether anything changed.
    ///
    /// # Errors
    /// [`SvcSecError::Change`] when the kernel refuses: the sets are as before, and the
    /// next call tries the whole difference again.
    pub async fn apply(&self, to: &BTreeSet<Element>) -> Result<bool, SvcSecError> {
        let mut applied = self.applied.lock().await;
        let c = change_commands(&applied, to);
        if c.is_empty() {
            return Ok(false);
        }
        send(self.transport.as_ref(), &c, Mode::Commit)
            .await
            .map_err(|detail| SvcSecError::Change {
                command: c.text(),
                detail,
            })?;
        applied.clone_from(to);
        Ok(true)
    }

    /// The sets' content as of the last successful run.
    pub async fn applied(&self) -> BTreeSet<Element> {
        self.applied.lock().await.clone()
    }

    /// Deletes the table (at clean exit, after the VIPs are gone).
    ///
    /// # Errors
    /// [`SvcSecError::Remove`].
    pub async fn close(&self) -> Result<(), SvcSecError> {
        let mut applied = self.applied.lock().await;
        remove_with(self.transport.as_ref()).await?;
        applied.clear();
        Ok(())
    }
}

/// Deletes the table if it exists (one left by a run with the option on, when it is off
/// now: it would keep dropping traffic to the VIPs it names once this node holds them
/// again).
///
/// # Errors
/// [`SvcSecError::Remove`] when the kernel refuses.
pub async fn remove() -> Result<(), SvcSecError> {
    remove_with(&Kernel).await
}

async fn remove_with(transport: &dyn Transport) -> Result<(), SvcSecError> {
    let c = remove_commands();
    send(transport, &c, Mode::Commit)
        .await
        .map_err(|detail| SvcSecError::Remove {
            command: c.text(),
            detail,
        })
}

#[cfg(test)]
mod tests;
