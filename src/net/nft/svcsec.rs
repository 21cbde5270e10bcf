//! Service security (kube-vip's `enable_service_security` / `--onlyAllowTrafficServicePorts`):
//! on the node announcing a Service VIP, only the Service's own ports reach the VIP in the
//! INPUT path; everything else to it is dropped. vipd's own table, changed through the `nft`
//! binary:
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
use std::path::PathBuf;

use super::run_nft_text;

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

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {{ {} }}", self.set(), self.value())
    }
}

/// Errors of the Service security table; each names the `nft` commands concerned.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SvcSecError {
    /// Creating the table failed (no `nft` binary, kernel without nf_tables `inet`, no
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

/// The commands deleting the table whether it exists or not.
pub fn remove_commands() -> Vec<String> {
    vec![
        format!("add table inet {SVCSEC_TABLE}"),
        format!("delete table inet {SVCSEC_TABLE}"),
    ]
}

/// The transaction (re)creating the table with empty sets (a table left by an earlier run
/// is deleted in the same transaction).
pub fn setup_commands() -> Vec<String> {
    let t = SVCSEC_TABLE;
    let p = DHCP_CLIENT_PORT;
    let mut c = remove_commands();
    c.extend([
        format!("add table inet {t}"),
        format!("add set inet {t} guard4 {{ type ipv4_addr; }}"),
        format!("add set inet {t} guard6 {{ type ipv6_addr; }}"),
        format!("add set inet {t} allow4 {{ type ipv4_addr . inet_proto . inet_service; }}"),
        format!("add set inet {t} allow6 {{ type ipv6_addr . inet_proto . inet_service; }}"),
        format!(
            "add chain inet {t} input {{ type filter hook input priority filter; policy accept; }}"
        ),
        format!("add rule inet {t} input ip daddr . meta l4proto . th dport @allow4 accept"),
        format!("add rule inet {t} input ip6 daddr . meta l4proto . th dport @allow6 accept"),
        format!("add rule inet {t} input ip daddr @guard4 udp dport {p} accept"),
        format!("add rule inet {t} input ip6 daddr @guard6 udp dport {p} accept"),
        format!(
            "add rule inet {t} input ip6 daddr @guard6 icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept"
        ),
        format!("add rule inet {t} input ip daddr @guard4 counter drop"),
        format!("add rule inet {t} input ip6 daddr @guard6 counter drop"),
    ]);
    c
}

/// The transaction turning the sets' content from `from` into `to`: elements only in `to`
/// are added, elements only in `from` deleted (each delete follows an add of the same
/// element, so it never fails, whatever the kernel holds). Allow elements are added before
/// guards and guards deleted before allow elements, though one transaction is atomic
/// anyway. Empty when nothing changes.
pub fn change_commands(from: &BTreeSet<Element>, to: &BTreeSet<Element>) -> Vec<String> {
    let t = SVCSEC_TABLE;
    let add = |e: &Element| format!("add element inet {t} {} {{ {} }}", e.set(), e.value());
    let del = |e: &Element| format!("delete element inet {t} {} {{ {} }}", e.set(), e.value());
    let mut c = Vec::new();
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
    c.extend(allow.into_iter().chain(guard).map(add));
    c
}

/// The real table: `inet vipd_svcsec`, changed through the `nft` binary.
#[derive(Debug)]
pub struct NftSvcSec {
    nft: PathBuf,
    /// The sets' content as of the last successful run; one run at a time.
    applied: tokio::sync::Mutex<BTreeSet<Element>>,
}

impl NftSvcSec {
    /// Creates the table with empty sets (replacing one left by an earlier run).
    ///
    /// # Errors
    /// [`SvcSecError::Setup`] when `nft` cannot run or fails.
    pub async fn start(nft: impl Into<PathBuf>) -> Result<Self, SvcSecError> {
        let nft = nft.into();
        let c = setup_commands();
        run_nft_text(&nft, &[], &c)
            .await
            .map_err(|detail| SvcSecError::Setup {
                command: c.join("; "),
                detail,
            })?;
        Ok(NftSvcSec {
            nft,
            applied: tokio::sync::Mutex::new(BTreeSet::new()),
        })
    }

    /// Checks, without changing anything (`nft --check`), that the table could be
    /// created: for `vipd preflight`.
    ///
    /// # Errors
    /// [`SvcSecError::Setup`] as [`NftSvcSec::start`].
    pub async fn check(nft: impl Into<PathBuf>) -> Result<(), SvcSecError> {
        let c = setup_commands();
        run_nft_text(&nft.into(), &["--check"], &c)
            .await
            .map_err(|detail| SvcSecError::Setup {
                command: c.join("; "),
                detail,
            })
    }

    /// Makes the sets hold exactly `to`, in one transaction ([`change_commands`]); nothing
    /// runs when they already do. Returns whether anything changed.
    ///
    /// # Errors
    /// [`SvcSecError::Change`] when `nft` fails: the sets are as before, and the next call
    /// tries the whole difference again.
    pub async fn apply(&self, to: &BTreeSet<Element>) -> Result<bool, SvcSecError> {
        let mut applied = self.applied.lock().await;
        let c = change_commands(&applied, to);
        if c.is_empty() {
            return Ok(false);
        }
        run_nft_text(&self.nft, &[], &c)
            .await
            .map_err(|detail| SvcSecError::Change {
                command: c.join("; "),
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
        remove(&self.nft).await?;
        applied.clear();
        Ok(())
    }
}

/// Deletes the table if it exists (one left by a run with the option on, when it is off
/// now: it would keep dropping traffic to the VIPs it names once this node holds them
/// again).
///
/// # Errors
/// [`SvcSecError::Remove`] when `nft` cannot run or fails.
pub async fn remove(nft: &std::path::Path) -> Result<(), SvcSecError> {
    let c = remove_commands();
    run_nft_text(nft, &[], &c)
        .await
        .map_err(|detail| SvcSecError::Remove {
            command: c.join("; "),
            detail,
        })
}

#[cfg(test)]
mod tests;
