//! ARP flux guard (scenario S36): a VIP is answered by ARP only on the interface it is
//! placed on.
//!
//! Linux answers an ARP request for any local IPv4 address on *every* interface that
//! receives it (`net.ipv4.conf.*.arp_ignore = 0`, the default). A node with a second
//! interface on the VIP's segment (e.g. `eth1 192.0.2.111/24` next to `eth0 192.0.2.11/24`)
//! therefore answers for the VIP from two MACs, and clients flap between them ("ARP flux").
//! vipd keeps its own nftables table in the `arp` family and never touches host sysctls or
//! any other table:
//!
//! ```text
//! table arp vipd {
//!     set vips   { type ipv4_addr; }              # every pinned VIP
//!     set pinned { type ipv4_addr . ifname; }     # VIP . the one interface that may answer
//!     chain input {
//!         type filter hook input priority filter; policy accept;
//!         arp operation request arp daddr ip @vips arp daddr ip . iifname != @pinned counter drop
//!     }
//! }
//! ```
//!
//! An ARP request for a pinned VIP that arrives on any other interface is dropped before
//! the kernel's ARP code sees it, so it is never answered there. [`ArpGuard::pin`] and
//! [`ArpGuard::unpin`] only add and delete set elements (one atomic nf_tables transaction
//! each), reference-counted per `(VIP, interface)` so two holders may pin the same VIP.
//! The manager replaces a table left by an earlier run at start ([`NftArpGuard::start`])
//! and deletes the table at exit ([`ArpGuard::close`]). Where the kernel's
//! nf_tables `arp` family is missing, [`start_arp_guard`] returns a [`NoopArpGuard`] and
//! logs once that ARP flux protection is off and why.
//!
//! IPv6 needs no guard: Linux answers a neighbour solicitation only for addresses on the
//! interface that received it, so VIPs are never answered from another interface.
//!
//! # Library choice
//! The table is changed through netlink from vipd's own process ([`super::nl`], messages
//! from netlink-packet-netfilter, rust-netlink, MIT): no `nft` binary at run time, no
//! process per change. Rejected: `nftables` (nftables-rs, the JSON API) needs the `nft`
//! binary and a process per change; `rustables` (netlink) is GPL-3.0-or-later, which
//! vipd's Apache-2.0 binary cannot link; `nftnl` (Mullvad) links libnftnl/libmnl, GPL C
//! libraries needed at build and run time.

use super::nl::{self, Batch, Family, Kernel, Mode, Transport};
use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;

use futures::future::BoxFuture;
use netlink_packet_netfilter::nftables::{MetaKey, Register};
use tracing::{info, warn};

/// Name of vipd's table (family `arp`).
pub const TABLE: &str = "vipd";
/// Set of pinned VIPs (`ipv4_addr`).
pub(crate) const SET_VIPS: &str = "vips";
/// Set of allowed `(VIP . interface name)` pairs (`ipv4_addr . ifname`).
pub(crate) const SET_PINNED: &str = "pinned";
/// The input-hook chain holding the one filter rule.
pub(crate) const CHAIN: &str = "input";

/// Errors of the ARP guard; each names the VIP / interface and the command concerned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArpGuardError {
    /// Adding the pin failed.
    #[error("cannot pin VIP {vip} to interface {ifname}: `{command}` failed: {detail}")]
    Pin {
        /// The VIP.
        vip: Ipv4Addr,
        /// The interface it should be answered on.
        ifname: String,
        /// The command, in `nft` syntax.
        command: String,
        /// The kernel's answer (errno per refused command), or why it could not be sent.
        detail: String,
    },
    /// Removing the pin failed.
    #[error("cannot unpin VIP {vip} from interface {ifname}: `{command}` failed: {detail}")]
    Unpin {
        /// The VIP.
        vip: Ipv4Addr,
        /// The interface.
        ifname: String,
        /// The command, in `nft` syntax.
        command: String,
        /// The kernel's answer (errno per refused command), or why it could not be sent.
        detail: String,
    },
    /// Creating the table failed (kernel without nf_tables `arp`, no CAP_NET_ADMIN).
    #[error("cannot create nftables table arp {TABLE}: `{command}` failed: {detail}")]
    Setup {
        /// The command, in `nft` syntax.
        command: String,
        /// The kernel's answer (errno per refused command), or why it could not be sent.
        detail: String,
    },
    /// Deleting the table failed.
    #[error("cannot delete nftables table arp {TABLE}: `{command}` failed: {detail}")]
    Remove {
        /// The command, in `nft` syntax.
        command: String,
        /// The kernel's answer (errno per refused command), or why it could not be sent.
        detail: String,
    },
    /// Not a Linux interface name ([`crate::net::is_ifname`]).
    #[error(
        "VIP {vip}: interface name {ifname:?} is not a Linux interface name ({})",
        crate::net::iface::IFNAME_RULE
    )]
    InvalidIfname {
        /// The VIP.
        vip: Ipv4Addr,
        /// The name given.
        ifname: String,
    },
}

/// "Answer ARP for this VIP only on this interface". Implemented by [`NftArpGuard`] and
/// [`NoopArpGuard`]; a holder pins an IPv4 VIP before it adds the address and unpins it
/// after removing it for good.
pub trait ArpGuard: Send + Sync + fmt::Debug + 'static {
    /// From now on, ARP requests for `vip` are answered on `ifname` only (requests arriving
    /// on other interfaces are dropped). Pins are counted: each `pin` needs its `unpin`.
    ///
    /// # Errors
    /// [`ArpGuardError::Pin`] when the kernel refuses (nothing changed),
    /// [`ArpGuardError::InvalidIfname`].
    fn pin<'a>(
        &'a self,
        vip: Ipv4Addr,
        ifname: &'a str,
    ) -> BoxFuture<'a, Result<(), ArpGuardError>>;

    /// Undoes one [`ArpGuard::pin`]; the filter for `vip` goes when its last pin goes.
    /// Unpinning what is not pinned is `Ok` and does nothing.
    ///
    /// # Errors
    /// [`ArpGuardError::Unpin`] when the kernel refuses (the pin stays counted).
    fn unpin<'a>(
        &'a self,
        vip: Ipv4Addr,
        ifname: &'a str,
    ) -> BoxFuture<'a, Result<(), ArpGuardError>>;

    /// Whether requests are really filtered (false for [`NoopArpGuard`]).
    fn active(&self) -> bool;

    /// Removes everything the guard installed (the manager calls it at exit, after the
    /// holders removed their VIPs).
    ///
    /// # Errors
    /// [`ArpGuardError::Remove`].
    fn close(&self) -> BoxFuture<'_, Result<(), ArpGuardError>>;
}

/// The guard used where nftables is not available: filters nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoopArpGuard {
    /// Why the real guard is off (empty when none was asked for, e.g. in unit tests).
    pub reason: String,
}

impl ArpGuard for NoopArpGuard {
    fn pin<'a>(&'a self, _: Ipv4Addr, _: &'a str) -> BoxFuture<'a, Result<(), ArpGuardError>> {
        Box::pin(async { Ok(()) })
    }
    fn unpin<'a>(&'a self, _: Ipv4Addr, _: &'a str) -> BoxFuture<'a, Result<(), ArpGuardError>> {
        Box::pin(async { Ok(()) })
    }
    fn active(&self) -> bool {
        false
    }
    fn close(&self) -> BoxFuture<'_, Result<(), ArpGuardError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The `vips` set's id within the setup batch (the rule refers to it by name and id).
const VIPS_ID: u32 = 1;
/// The `pinned` set's id within the setup batch.
const PINNED_ID: u32 = 2;

/// `nft`'s user data of `type ipv4_addr . ifname` (key byte order and the concatenation's
/// fields), copied from what nftables 1.0.6 sends, so that `nft list` shows it as written.
const PINNED_USERDATA: &str = "000400000000030800040d0000000100";

/// The batch that (re)creates vipd's table empty: an existing one (left by an earlier
/// run) is deleted in the same transaction (`add table` first, so the delete cannot fail).
pub(crate) fn setup_batch() -> Batch {
    use nl::{Base, payload};
    let mut b = remove_batch();
    b.push(nl::add_table(Family::Arp, TABLE));
    b.push(nl::add_set(
        Family::Arp,
        TABLE,
        &nl::SetSpec {
            name: SET_VIPS,
            id: VIPS_ID,
            key_type: 7,
            key_len: 4,
            timeout: false,
            userdata: nl::keybyteorder(2),
            shown: "{ type ipv4_addr; }",
        },
    ));
    b.push(nl::add_set(
        Family::Arp,
        TABLE,
        &nl::SetSpec {
            name: SET_PINNED,
            id: PINNED_ID,
            // ipv4_addr (7) . ifname (41), 6 bits a field.
            key_type: (7 << 6) | 41,
            key_len: 4 + IFNAMSIZ,
            timeout: false,
            userdata: nl::unhex(PINNED_USERDATA),
            shown: "{ type ipv4_addr . ifname; }",
        },
    ));
    let filter = nl::BaseChain {
        chain_type: "filter",
        hook: nl::hook::ARP_IN,
        hook_name: "input",
        priority: 0,
    };
    b.push(nl::add_chain(Family::Arp, TABLE, CHAIN, filter));
    let daddr = payload(Base::Network, 24, 4);
    let exprs = vec![
        payload(Base::Network, 6, 2),
        // ARP operation 1: request.
        nl::cmp(true, &[0, 1]),
        daddr.clone(),
        nl::lookup(SET_VIPS, VIPS_ID, false),
        daddr,
        nl::meta_to(MetaKey::Iifname, Register::Reg32_01),
        nl::lookup(SET_PINNED, PINNED_ID, true),
        nl::counter(),
        nl::verdict(nl::NF_DROP),
    ];
    let text = format!(
        "arp operation request arp daddr ip @{SET_VIPS} arp daddr ip . iifname != @{SET_PINNED} counter drop"
    );
    b.push(nl::add_rule(Family::Arp, TABLE, CHAIN, exprs, &text));
    b
}

/// `IFNAMSIZ`: an interface name's field in a set key, NUL-padded.
const IFNAMSIZ: u32 = 16;

/// The batch that deletes vipd's table whether it exists or not.
pub(crate) fn remove_batch() -> Batch {
    nl::remove_table(Family::Arp, TABLE)
}

/// The `pinned` element of `(vip, ifname)`: key bytes and as `nft` shows it. `ifname` is a
/// Linux interface name (checked by the caller: at most 15 bytes).
fn pair_elem(vip: Ipv4Addr, ifname: &str) -> (Vec<u8>, String) {
    let mut key = vip.octets().to_vec();
    let mut name = ifname.as_bytes().to_vec();
    name.resize(IFNAMSIZ as usize, 0);
    key.extend(name);
    (key, format!("{vip} . \"{ifname}\""))
}

/// The batch for the first pin of `(vip, ifname)`: the pair, then (when `vip` had no
/// pin yet, `first_for_vip`) the VIP itself. Both in one transaction: requests on `ifname`
/// are never dropped.
pub(crate) fn pin_batch(vip: Ipv4Addr, ifname: &str, first_for_vip: bool) -> Batch {
    let mut b = Batch::new();
    let (key, shown) = pair_elem(vip, ifname);
    b.push(nl::add_element(
        Family::Arp,
        TABLE,
        SET_PINNED,
        &key,
        None,
        &shown,
    ));
    if first_for_vip {
        let v = vip.to_string();
        b.push(nl::add_element(
            Family::Arp,
            TABLE,
            SET_VIPS,
            &vip.octets(),
            None,
            &v,
        ));
    }
    b
}

/// The batch for the last unpin of `(vip, ifname)`: the VIP (when no other interface
/// keeps it pinned, `last_for_vip`), then the pair.
pub(crate) fn unpin_batch(vip: Ipv4Addr, ifname: &str, last_for_vip: bool) -> Batch {
    let mut b = Batch::new();
    if last_for_vip {
        let v = vip.to_string();
        b.push(nl::delete_element(
            Family::Arp,
            TABLE,
            SET_VIPS,
            &vip.octets(),
            &v,
        ));
    }
    let (key, shown) = pair_elem(vip, ifname);
    b.push(nl::delete_element(
        Family::Arp,
        TABLE,
        SET_PINNED,
        &key,
        &shown,
    ));
    b
}

/// Reference counts of pins, by `(VIP, interface)`: decides which pin or unpin needs an
/// nf_tables transaction (the first pin and the last unpin of a pair).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PinCounts(BTreeMap<(Ipv4Addr, String), u32>);

impl PinCounts {
    /// The transaction a pin needs now, `None` when the pair is pinned already.
    pub(crate) fn pin_batch(&self, vip: Ipv4Addr, ifname: &str) -> Option<Batch> {
        if self.0.contains_key(&(vip, ifname.to_string())) {
            return None;
        }
        let first_for_vip = !self.0.keys().any(|(v, _)| *v == vip);
        Some(pin_batch(vip, ifname, first_for_vip))
    }

    /// The transaction an unpin needs now, `None` when other pins of the pair remain or it
    /// is not pinned.
    pub(crate) fn unpin_batch(&self, vip: Ipv4Addr, ifname: &str) -> Option<Batch> {
        match self.0.get(&(vip, ifname.to_string())) {
            Some(1) => {
                let last_for_vip = !self.0.keys().any(|(v, i)| *v == vip && i != ifname);
                Some(unpin_batch(vip, ifname, last_for_vip))
            }
            _ => None,
        }
    }

    /// Records a pin (after its transaction, if any, succeeded).
    pub fn pinned(&mut self, vip: Ipv4Addr, ifname: &str) {
        *self.0.entry((vip, ifname.to_string())).or_insert(0) += 1;
    }

    /// Records an unpin (after its transaction, if any, succeeded).
    pub(crate) fn unpinned(&mut self, vip: Ipv4Addr, ifname: &str) {
        let key = (vip, ifname.to_string());
        if let Some(n) = self.0.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&key);
            }
        }
    }

    /// How many pins `(vip, ifname)` has.
    #[cfg(test)]
    pub fn count(&self, vip: Ipv4Addr, ifname: &str) -> u32 {
        self.0.get(&(vip, ifname.to_string())).copied().unwrap_or(0)
    }
}

/// The real guard: vipd's `table arp vipd`, changed through netlink ([`nl`]).
#[derive(Debug)]
pub struct NftArpGuard {
    transport: Arc<dyn Transport>,
    counts: tokio::sync::Mutex<PinCounts>,
}

/// Sends `b` through `transport`; the error is the kernel's answer as text.
async fn send(transport: &dyn Transport, b: &Batch, mode: Mode) -> Result<(), String> {
    nl::send_with(transport, b.clone(), mode)
        .await
        .map_err(|e| e.to_string())
}

impl NftArpGuard {
    /// Creates the table empty in the kernel (replacing one left by an earlier run).
    ///
    /// # Errors
    /// [`ArpGuardError::Setup`] when the kernel refuses (no nf_tables `arp` family, no
    /// CAP_NET_ADMIN).
    pub async fn start() -> Result<Self, ArpGuardError> {
        Self::start_with(Arc::new(Kernel)).await
    }

    /// [`NftArpGuard::start`] through `transport`.
    ///
    /// # Errors
    /// As [`NftArpGuard::start`].
    pub async fn start_with(transport: Arc<dyn Transport>) -> Result<Self, ArpGuardError> {
        let b = setup_batch();
        send(transport.as_ref(), &b, Mode::Commit)
            .await
            .map_err(|detail| ArpGuardError::Setup {
                command: b.text(),
                detail,
            })?;
        Ok(NftArpGuard {
            transport,
            counts: tokio::sync::Mutex::new(PinCounts::default()),
        })
    }

    /// Checks, without changing anything (the batch is validated by the kernel and
    /// aborted), that the table could be created: for `vipd preflight`.
    ///
    /// # Errors
    /// [`ArpGuardError::Setup`] as [`NftArpGuard::start`].
    pub async fn check() -> Result<(), ArpGuardError> {
        let b = setup_batch();
        send(&Kernel, &b, Mode::Check)
            .await
            .map_err(|detail| ArpGuardError::Setup {
                command: b.text(),
                detail,
            })
    }
}

impl ArpGuard for NftArpGuard {
    fn pin<'a>(
        &'a self,
        vip: Ipv4Addr,
        ifname: &'a str,
    ) -> BoxFuture<'a, Result<(), ArpGuardError>> {
        Box::pin(async move {
            if !crate::net::iface::is_ifname(ifname) {
                return Err(ArpGuardError::InvalidIfname {
                    vip,
                    ifname: ifname.to_string(),
                });
            }
            let mut counts = self.counts.lock().await;
            if let Some(b) = counts.pin_batch(vip, ifname) {
                send(self.transport.as_ref(), &b, Mode::Commit)
                    .await
                    .map_err(|detail| ArpGuardError::Pin {
                        vip,
                        ifname: ifname.to_string(),
                        command: b.text(),
                        detail,
                    })?;
            }
            counts.pinned(vip, ifname);
            Ok(())
        })
    }

    fn unpin<'a>(
        &'a self,
        vip: Ipv4Addr,
        ifname: &'a str,
    ) -> BoxFuture<'a, Result<(), ArpGuardError>> {
        Box::pin(async move {
            let mut counts = self.counts.lock().await;
            if let Some(b) = counts.unpin_batch(vip, ifname) {
                send(self.transport.as_ref(), &b, Mode::Commit)
                    .await
                    .map_err(|detail| ArpGuardError::Unpin {
                        vip,
                        ifname: ifname.to_string(),
                        command: b.text(),
                        detail,
                    })?;
            }
            counts.unpinned(vip, ifname);
            Ok(())
        })
    }

    fn active(&self) -> bool {
        true
    }

    fn close(&self) -> BoxFuture<'_, Result<(), ArpGuardError>> {
        Box::pin(async move {
            let mut counts = self.counts.lock().await;
            let b = remove_batch();
            send(self.transport.as_ref(), &b, Mode::Commit)
                .await
                .map_err(|detail| ArpGuardError::Remove {
                    command: b.text(),
                    detail,
                })?;
            *counts = PinCounts::default();
            Ok(())
        })
    }
}

/// Starts the ARP flux guard for `vipd manager`: the [`NftArpGuard`] when the kernel
/// supports it, else a [`NoopArpGuard`]. Logs one line either way (the warning says
/// that ARP flux protection is off and why).
pub async fn start_arp_guard() -> Arc<dyn ArpGuard> {
    match NftArpGuard::start().await {
        Ok(g) => {
            info!(
                table = "arp vipd",
                "ARP flux protection on: ARP requests for a VIP are answered only on its interface (nft list table arp vipd)"
            );
            Arc::new(g)
        }
        Err(e) => {
            warn!(error = %e, "ARP flux protection is off: nftables is not usable here, so a node with another interface on the VIP's segment may answer ARP for the VIP from two MACs unless net.ipv4.conf.all.arp_ignore=1");
            Arc::new(NoopArpGuard {
                reason: e.to_string(),
            })
        }
    }
}

/// The pins one holder has made: a small helper so the holder only says which
/// `(VIP, interface)` pairs it wants.
#[derive(Debug)]
pub struct ArpPins {
    guard: Arc<dyn ArpGuard>,
    held: Vec<(Ipv4Addr, String)>,
}

impl Default for ArpPins {
    fn default() -> Self {
        ArpPins::new(Arc::new(NoopArpGuard::default()))
    }
}

/// A pin: VIP and interface name.
pub(crate) type Pin = (Ipv4Addr, String);

/// Which pins to add and which to remove: `want` are the pairs of VIPs whose interface is
/// resolved now; a held pin of a VIP still in `configured` but not in `want` (interface
/// not resolved this time) is kept, since its address may still be on the interface.
/// Returns `(to_pin, to_unpin)`.
pub(crate) fn pin_changes(
    held: &[Pin],
    want: &[Pin],
    configured: &[Ipv4Addr],
) -> (Vec<Pin>, Vec<Pin>) {
    let to_pin = want
        .iter()
        .filter(|w| !held.contains(w))
        .cloned()
        .collect::<Vec<_>>();
    let to_unpin = held
        .iter()
        .filter(|h| {
            !want.contains(h) && (!configured.contains(&h.0) || want.iter().any(|(v, _)| *v == h.0))
        })
        .cloned()
        .collect();
    let mut dedup: Vec<(Ipv4Addr, String)> = Vec::new();
    for p in to_pin {
        if !dedup.contains(&p) {
            dedup.push(p);
        }
    }
    (dedup, to_unpin)
}

impl ArpPins {
    /// No pins yet, through `guard`.
    pub fn new(guard: Arc<dyn ArpGuard>) -> Self {
        ArpPins {
            guard,
            held: Vec::new(),
        }
    }

    /// Brings the pins to `want` (see [`pin_changes`]): new pins first, then old ones
    /// removed. Failures are logged with `holder` and retried at the next call.
    pub async fn sync(
        &mut self,
        holder: &str,
        want: &[(Ipv4Addr, String)],
        configured: &[Ipv4Addr],
    ) {
        let (to_pin, to_unpin) = pin_changes(&self.held, want, configured);
        for (vip, ifname) in to_pin {
            match self.guard.pin(vip, &ifname).await {
                Ok(()) => {
                    if self.guard.active() {
                        info!(holder, %vip, interface = %ifname, "ARP for the VIP answered on this interface only");
                    }
                    self.held.push((vip, ifname));
                }
                Err(e) => {
                    warn!(holder, error = %e, "ARP flux protection not applied to this VIP")
                }
            }
        }
        for (vip, ifname) in to_unpin {
            self.unpin(holder, vip, &ifname).await;
        }
    }

    /// Removes every pin of this holder (when it ends, after its VIPs are gone).
    pub async fn release(&mut self, holder: &str) {
        for (vip, ifname) in std::mem::take(&mut self.held) {
            self.unpin(holder, vip, &ifname).await;
        }
    }

    async fn unpin(&mut self, holder: &str, vip: Ipv4Addr, ifname: &str) {
        match self.guard.unpin(vip, ifname).await {
            Ok(()) => self.held.retain(|(v, i)| !(*v == vip && i == ifname)),
            Err(e) => {
                warn!(holder, error = %e, "cannot remove the ARP flux filter of this VIP");
                if !self.held.iter().any(|(v, i)| *v == vip && i == ifname) {
                    self.held.push((vip, ifname.to_string()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
