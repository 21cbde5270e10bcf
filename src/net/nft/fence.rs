//! The nftables fence (issue 16; `vip_nftfence`, on by default wherever the kernel supports
//! it, [`NftFenceSetting`]): a VIP is answered only while its renewal-driven timeout runs,
//! to the millisecond.
//!
//! The address-lifetime fence ([`crate::lease::fence_lifetime`]) is counted by the kernel
//! in whole seconds from when it handles the request. This fence is counted from the
//! moment the renewal request was *sent*, in milliseconds, and it does not depend on the
//! address being removed: vipd's own tables drop the traffic.
//!
//! ```text
//! table arp vipd_fence {
//!     map vips { type ipv4_addr : verdict; }   # fenced IPv4 VIP -> its holder's chain
//!     set live { type mark; flags timeout; }   # holders whose timeout runs
//!     chain input {
//!         type filter hook input priority filter; policy accept;
//!         arp operation request arp daddr ip vmap @vips
//!     }
//!     chain holder_1 {                          # one a holder of this node
//!         1 != @live counter drop               # `nft list` shows 0x1000000 [invalid type]
//!     }
//! }
//! table inet vipd_fence {
//!     map vips4 { type ipv4_addr : verdict; }   map vips6 { type ipv6_addr : verdict; }
//!     set live { type mark; flags timeout; }
//!     set live4 { type ipv4_addr; flags timeout; }  set live6 { type ipv6_addr; flags timeout; }
//!     chain prerouting {
//!         type filter hook prerouting priority -150; policy accept;
//!         ip daddr vmap @vips4
//!         ip6 daddr vmap @vips6
//!         icmpv6 type nd-neighbor-solicit @th,64,128 vmap @vips6
//!     }
//!     chain holder_1 { 1 != @live counter drop }
//! }
//! ```
//!
//! Each VIP holder of this node has a key ([`LiveKey`], never reused in a process), a chain
//! `holder_<key>` in each table and one element `<key>` in each `live` set, set with the
//! holder's timeout at every renewal. A fenced VIP's map element jumps to its holder's chain,
//! which drops the packet once the holder's element has expired; an expired VIP's element is
//! `drop`; a VIP in no map is not fenced. So a renewal of a holder of 600 VIPs (a shard) is
//! one element a table, not one a VIP (the map elements change only when a VIP changes
//! holder, expires or goes), and a packet costs one map lookup and one set lookup whatever
//! the number of VIPs. `nft` cannot write a map's value looked up in a set (and nftables 1.0.6
//! aborts listing such a rule), hence the chain per holder. `live4`/`live6` hold, one by one,
//! only the VIPs something needs alone ([`VipFence::track`]: egress, [`super::egress`]).
//!
//! The `inet` chain runs at priority -150, before destination NAT (-100), so the
//! load balancer's DNAT ([`crate::controlplane::lb`]) never turns a fenced packet into a forwarded one.
//! Neighbour solicitations for an IPv6 VIP go to its solicited-node multicast address and
//! carry the VIP as the ICMPv6 target (bits 64..192 of the ICMPv6 message, RFC 4861 §4.3):
//! nftables 1.0.6 has no `icmpv6 taddr`, so that rule looks those 16 raw bytes up in the
//! VIP map (the kernel compares bytes; `nft` refuses to write it, for the types, but lists
//! it).
//!
//! Live elements' timeouts are sent in milliseconds (`timeout 1995ms` in `nft` syntax) through
//! netlink ([`nl`]), computed right before the `sendmsg` that commits them. Where the kernel
//! updates existing elements (Linux 6.12 and later; [`NftFence::start`] probes for it), a
//! refresh is one `add` carrying the timeout and, as its expiration, the same value
//! ([`nl::refresh_element`]): the kernel sets a live element's expiration from that attribute
//! only, so an add without it of the timeout the element already has leaves it to expire at
//! its old time (a withdrawn first version did that: renewals every second of the same 2 s
//! let elements lapse, and lab_dhcp S24 and lab_conflicts S33 answered in half their slots).
//! Elsewhere a refresh of an
//! element that may still be live deletes and re-adds it in one transaction (a plain `add`
//! of an element that exists keeps its old timeout); the first `add` carries the same
//! timeout, so an element without one (which would never expire) is never created. The
//! delete makes the kernel wait for readers to finish (about 20 ms a run, against about
//! 3 ms for adds alone), so where [`NftFence`] knows the element has expired (its own
//! record of every timeout it set, [`LIVE_SLACK`] added), as at a takeover, it only adds:
//! nftables treats an expired element as absent, and an `add` over one that has not quite
//! expired keeps the earlier, shorter timeout, which can only end the VIP's answers early.
//!
//! The tables are vipd's own (`vipd_fence`, next to the ARP flux guard's `arp vipd`):
//! [`NftFence::start`] replaces ones left by an earlier run, [`VipFence::close`] deletes
//! them, no other table is read or changed.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use futures::future::BoxFuture;
use tracing::{debug, info, warn};

use netlink_packet_netfilter::nftables::MetaKey;

use super::nl::{self, Batch, Family, Kernel, Key, Mode, NftError, Transport};

/// Name of the fence's tables (families `arp` and `inet`).
pub const FENCE_TABLE: &str = "vipd_fence";

/// Added to the end of every timeout [`NftFence`] set before it counts the element as
/// expired (and refreshes it with adds only): the kernel counts timeouts in jiffies (up to
/// 10 ms at `HZ=100`) from when it handled the run, which is before the run returned.
pub const LIVE_SLACK: Duration = Duration::from_millis(10);

/// Errors of the nftables fence; each names the `nft` commands concerned.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FenceError {
    /// Creating the tables failed (kernel without nf_tables `arp`/`inet`
    /// or set timeouts, no CAP_NET_ADMIN).
    #[error(
        "cannot create the nftables fence tables arp/inet {FENCE_TABLE}: `{command}` failed: {detail}"
    )]
    Setup {
        /// The commands, in `nft` syntax.
        command: String,
        /// `nft`'s error output, or why it could not run.
        detail: String,
    },
    /// Changing the sets failed (the VIPs' elements are as before).
    #[error("cannot update the nftables fence for {vips}: `{command}` failed: {detail}")]
    Change {
        /// The VIPs concerned, comma-separated.
        vips: String,
        /// The commands, in `nft` syntax.
        command: String,
        /// `nft`'s error output, or why it could not run.
        detail: String,
    },
    /// Deleting the tables failed.
    #[error(
        "cannot delete the nftables fence tables arp/inet {FENCE_TABLE}: `{command}` failed: {detail}"
    )]
    Remove {
        /// The commands, in `nft` syntax.
        command: String,
        /// `nft`'s error output, or why it could not run.
        detail: String,
    },
}

/// "Answer this VIP only while its timeout runs". Implemented by [`NftFence`] and
/// [`NoopFence`]; the VIP holder refreshes its VIPs on every renewal and disarms them once
/// their addresses are gone.
pub trait VipFence: Send + Sync + fmt::Debug + 'static {
    /// Arms `vips` (their traffic is filtered from now on) and lets them be answered until
    /// `until`: the holder's element timeout (whole milliseconds, rounded down) is computed
    /// from `until` right before the transaction is sent, so time spent queued or frozen
    /// before it does not stretch it. When less than 1 ms is left the VIPs are expired
    /// instead. `vips` are all of `owner`'s VIPs: one it armed but does not name (its disarm
    /// failed) stops living on its element.
    ///
    /// Returns the latest moment the elements may live: the run's end plus the timeout it
    /// carried (the kernel counts it from some moment inside the run). Past the lease the
    /// caller must refresh again (a shorter timeout) or [`VipFence::expire`].
    ///
    /// # Errors
    /// [`FenceError::Change`] when `nft` fails (nothing changed).
    fn refresh<'a>(
        &'a self,
        owner: Owner,
        vips: &'a [IpAddr],
        until: Instant,
    ) -> BoxFuture<'a, Result<Instant, FenceError>>;

    /// Ends the live time of `vips` now: armed ones are not answered any more.
    ///
    /// # Errors
    /// [`FenceError::Change`].
    fn expire<'a>(&'a self, vips: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>>;

    /// Takes back `owner`'s arming of `vips` (once its addresses are gone): a VIP no other
    /// holder armed is no longer filtered and its live element goes; one another holder of
    /// this node armed meanwhile (the address moved to it) stays filtered, with that
    /// holder's element. Disarming what is not armed is `Ok`.
    ///
    /// # Errors
    /// [`FenceError::Change`].
    fn disarm<'a>(
        &'a self,
        owner: Owner,
        vips: &'a [IpAddr],
    ) -> BoxFuture<'a, Result<(), FenceError>>;

    /// Keeps `vips` (the whole set; empty: none) live one by one as well, in the `inet`
    /// table's `live4`/`live6` sets, each element living exactly as its holder's: for rules
    /// that need one VIP's state rather than its holder's (egress, [`super::egress`]). A VIP
    /// that leaves the set loses its element. Their number is small: every refresh of their
    /// holder sets each of their elements.
    ///
    /// # Errors
    /// [`FenceError::Change`].
    fn track<'a>(&'a self, vips: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>>;

    /// Whether traffic is really filtered (false for [`NoopFence`]).
    fn active(&self) -> bool;

    /// Deletes the tables (the manager calls it at exit, after the holders ended).
    ///
    /// # Errors
    /// [`FenceError::Remove`].
    fn close(&self) -> BoxFuture<'_, Result<(), FenceError>>;
}

/// The fence used when `vip_nftfence=false` or nftables cannot do it: filters nothing
/// (the address lifetime alone fences).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoopFence;

impl VipFence for NoopFence {
    fn refresh<'a>(
        &'a self,
        _: Owner,
        _: &'a [IpAddr],
        until: Instant,
    ) -> BoxFuture<'a, Result<Instant, FenceError>> {
        Box::pin(async move { Ok(until) })
    }
    fn expire<'a>(&'a self, _: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async { Ok(()) })
    }
    fn disarm<'a>(&'a self, _: Owner, _: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async { Ok(()) })
    }
    fn track<'a>(&'a self, _: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async { Ok(()) })
    }
    fn active(&self) -> bool {
        false
    }
    fn close(&self) -> BoxFuture<'_, Result<(), FenceError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The key of one holder's live element in the fence's `live` sets and the name of its
/// chain (`holder_<key>`): counted from 1 in this process ([`NftFence`]) and never handed
/// out twice, so an element one holder set never makes another holder's VIPs answered.
pub type LiveKey = u32;

/// The key of no holder: a VIP mapped to it is dropped (`<vip> : drop` in the maps), an
/// expired VIP or one refreshed with less than 1 ms left.
pub const EXPIRED: LiveKey = 0;

/// The key [`probe_timeout_updates`] uses (never handed out: keys count up from 1).
const PROBE_KEY: LiveKey = LiveKey::MAX;

/// The chain of holder `key` in each table: `<key> != @live counter drop`.
pub fn holder_chain(key: LiveKey) -> String {
    format!("holder_{key}")
}

/// What a VIP's map elements hold for `key`: `jump holder_<key>`, or `drop` for
/// [`EXPIRED`].
fn verdict(key: LiveKey) -> nl::MapVerdict {
    match key {
        EXPIRED => nl::MapVerdict::Drop,
        k => nl::MapVerdict::Jump(holder_chain(k)),
    }
}

/// The maps `vip` is fenced in: `(family, map)`. IPv4 in the `arp` table (ARP requests) and
/// the `inet` table (packets); IPv6 in the `inet` table, one map for both its rules (packets
/// to the address, and neighbour solicitations whose ICMPv6 target, `@th,64,128`, is the same
/// 16 bytes).
fn places(vip: IpAddr) -> &'static [(Family, &'static str)] {
    match vip {
        IpAddr::V4(_) => &[(Family::Arp, "vips"), (Family::Inet, "vips4")],
        IpAddr::V6(_) => &[(Family::Inet, "vips6")],
    }
}

/// The per-VIP live set of `vip`'s family (`inet`), for the VIPs the fence tracks one by
/// one ([`VipFence::track`]).
fn per_vip_set(vip: IpAddr) -> &'static str {
    match vip {
        IpAddr::V4(_) => "live4",
        IpAddr::V6(_) => "live6",
    }
}

/// The order of a transaction's commands ([`Grouped`]): new holder chains, the maps (`arp
/// vips`, `inet vips4`, `inet vips6`), the live sets (`arp live`, `inet live`), the per-VIP
/// live sets, and last the chains of holders that armed nothing any more (once no map
/// element jumps to them).
mod at {
    pub const NEW_CHAINS: u8 = 0;
    pub const ARP_VIPS: u8 = 1;
    pub const VIPS4: u8 = 2;
    pub const VIPS6: u8 = 3;
    pub const ARP_LIVE: u8 = 4;
    pub const INET_LIVE: u8 = 5;
    pub const LIVE4: u8 = 6;
    pub const LIVE6: u8 = 7;
    pub const OLD_CHAINS: u8 = 8;
}

fn place_index(family: Family, set: &str) -> u8 {
    match (family, set) {
        (Family::Arp, "vips") => at::ARP_VIPS,
        (_, "vips4") => at::VIPS4,
        (_, "vips6") => at::VIPS6,
        (Family::Arp, _) => at::ARP_LIVE,
        (_, "live4") => at::LIVE4,
        (_, "live6") => at::LIVE6,
        _ => at::INET_LIVE,
    }
}

/// The live sets of the holders' keys: one a table.
const LIVE_SETS: [(Family, &str); 2] = [(Family::Arp, "live"), (Family::Inet, "live")];

/// The tables: each has a `live` set and one chain per holder.
const TABLES: [Family; 2] = [Family::Arp, Family::Inet];

/// The batch deleting both tables whether they exist or not.
pub(crate) fn remove_commands() -> Batch {
    let mut b = nl::remove_table(Family::Arp, FENCE_TABLE);
    b.append(nl::remove_table(Family::Inet, FENCE_TABLE));
    b
}

/// How often at most a failed run rewrites the fence's maps from the record
/// ([`NftFence::resync`]).
pub const RESYNC_EVERY: Duration = Duration::from_secs(10);

/// The batch rewriting the maps and sets from `rec` at `now` ([`NftFence::resync`]): every
/// map and live set flushed; each recorded holder's chains created if missing and left with
/// their one rule; every recorded VIP's map elements; each holder's live elements with what
/// is left of its last refresh; the tracked VIPs' own elements likewise.
fn resync_commands(rec: &Recorded, now: Instant) -> Batch {
    let t = FENCE_TABLE;
    let mut b = Batch::new();
    for (f, spec, _) in fence_sets() {
        b.push(nl::flush_set(f, t, spec.name));
    }
    let mut owners: Vec<&Keyed> = rec.owners.values().collect();
    owners.sort_by_key(|k| k.key);
    for k in &owners {
        for f in TABLES {
            b.push(nl::add_regular_chain(f, t, &holder_chain(k.key)));
            b.push(nl::flush_chain(f, t, &holder_chain(k.key)));
            b.push(holder_rule(f, k.key));
        }
    }
    let mut vips: Vec<(&IpAddr, &Armed)> = rec.vips.iter().collect();
    vips.sort_by_key(|(v, _)| **v);
    for (v, a) in &vips {
        for (f, map) in places(**v) {
            b.push(nl::map_element(
                *f,
                t,
                map,
                Key::Addr(**v),
                verdict(a.key),
                false,
            ));
        }
    }
    // What is left of each holder's last refresh, by key.
    let left: HashMap<LiveKey, Duration> = owners
        .iter()
        .filter_map(|k| Some((k.key, timeout_until(k.live?.0, now))))
        .filter(|(_, t)| !t.is_zero())
        .collect();
    for (key, timeout) in &left {
        for (f, set) in LIVE_SETS {
            b.push(nl::element(
                f,
                t,
                set,
                Key::Mark(*key),
                false,
                Some(*timeout),
                None,
            ));
        }
    }
    for v in &rec.tracked {
        if let Some(timeout) = rec.vips.get(v).and_then(|a| left.get(&a.key)) {
            b.push(nl::element(
                Family::Inet,
                t,
                per_vip_set(*v),
                Key::Addr(*v),
                false,
                Some(*timeout),
                None,
            ));
        }
    }
    b
}

/// The fence's maps and sets: `(family, spec, is a verdict map)`, ids in the order `nft`
/// gives them.
fn fence_sets() -> Vec<(Family, nl::SetSpec, bool)> {
    let set = |name, id, key_type, key_len, timeout, order, shown| nl::SetSpec {
        name,
        id,
        key_type,
        key_len,
        timeout,
        userdata: nl::keybyteorder(order),
        shown,
    };
    // nft's types: ipv4_addr 7, ipv6_addr 8, mark 19; byte order 2 big endian, 1 host.
    vec![
        (
            Family::Arp,
            set("vips", 1, 7, 4, false, 2, "{ type ipv4_addr : verdict; }"),
            true,
        ),
        (
            Family::Arp,
            set("live", 2, 19, 4, true, 1, "{ type mark; flags timeout; }"),
            false,
        ),
        (
            Family::Inet,
            set("vips4", 3, 7, 4, false, 2, "{ type ipv4_addr : verdict; }"),
            true,
        ),
        (
            Family::Inet,
            set("vips6", 4, 8, 16, false, 2, "{ type ipv6_addr : verdict; }"),
            true,
        ),
        (
            Family::Inet,
            set("live", 5, 19, 4, true, 1, "{ type mark; flags timeout; }"),
            false,
        ),
        (
            Family::Inet,
            set(
                "live4",
                6,
                7,
                4,
                true,
                2,
                "{ type ipv4_addr; flags timeout; }",
            ),
            false,
        ),
        (
            Family::Inet,
            set(
                "live6",
                7,
                8,
                16,
                true,
                2,
                "{ type ipv6_addr; flags timeout; }",
            ),
            false,
        ),
    ]
}

/// `meta nfproto <proto>`, as `nft` writes the family match of `ip ...`/`ip6 ...` in an
/// `inet` table.
fn nfproto(proto: u8) -> Vec<nl::Expr> {
    vec![nl::meta(MetaKey::Nfproto), nl::cmp(true, &[proto])]
}

/// The fence's rules in its base chains: `(family, chain, expressions, text)`. Each loads a
/// VIP and looks it up in a verdict map: `jump holder_<key>` for an armed VIP, `drop` for an
/// expired one; a VIP not in the map is not fenced.
fn fence_rules() -> Vec<(Family, &'static str, Vec<nl::Expr>, &'static str)> {
    use netlink_packet_netfilter::nftables::Register;
    use nl::{Base, payload};
    let vmap = |prefix: Vec<nl::Expr>, load: nl::Expr, map: (&str, u32)| {
        let mut e = prefix;
        e.push(load);
        e.push(nl::map_lookup_to(
            map.0,
            map.1,
            Register::Reg1,
            Register::Verdict,
        ));
        e
    };
    let arp_daddr = payload(Base::Network, 24, 4);
    let arp_request = vec![payload(Base::Network, 6, 2), nl::cmp(true, &[0, 1])];
    let ip_daddr = payload(Base::Network, 16, 4);
    let ip6_daddr = payload(Base::Network, 24, 16);
    let th = payload(Base::Transport, 8, 16);
    let mut ns = nfproto(libc::NFPROTO_IPV6 as u8);
    ns.extend([
        nl::meta(MetaKey::L4Proto),
        nl::cmp(true, &[libc::IPPROTO_ICMPV6 as u8]),
        payload(Base::Transport, 0, 1),
        // ICMPv6 type 135: neighbour solicitation.
        nl::cmp(true, &[135]),
    ]);
    vec![
        (
            Family::Arp,
            "input",
            vmap(arp_request, arp_daddr, ("vips", 1)),
            "arp operation request arp daddr ip vmap @vips",
        ),
        (
            Family::Inet,
            "prerouting",
            vmap(nfproto(libc::NFPROTO_IPV4 as u8), ip_daddr, ("vips4", 3)),
            "ip daddr vmap @vips4",
        ),
        (
            Family::Inet,
            "prerouting",
            vmap(nfproto(libc::NFPROTO_IPV6 as u8), ip6_daddr, ("vips6", 4)),
            "ip6 daddr vmap @vips6",
        ),
        (
            Family::Inet,
            "prerouting",
            vmap(ns, th, ("vips6", 4)),
            "icmpv6 type nd-neighbor-solicit @th,64,128 vmap @vips6",
        ),
    ]
}

/// The commands creating holder `key`'s chain in both tables, with its rule
/// ([`holder_rule`]).
fn holder_chain_commands(key: LiveKey) -> Vec<nl::Cmd> {
    let name = holder_chain(key);
    TABLES
        .into_iter()
        .flat_map(|f| {
            [
                nl::add_regular_chain(f, FENCE_TABLE, &name),
                holder_rule(f, key),
            ]
        })
        .collect()
}

/// The one rule of holder `key`'s chain in `family`'s table, `<key> != @live counter drop`
/// (its live set looked up by name: the set exists since the start).
fn holder_rule(family: Family, key: LiveKey) -> nl::Cmd {
    use netlink_packet_netfilter::nftables::Register;
    nl::add_rule_commented(
        family,
        FENCE_TABLE,
        &holder_chain(key),
        vec![
            nl::immediate(Register::Reg1, &key.to_ne_bytes()),
            nl::lookup_named("live", Register::Reg1, true),
            nl::counter(),
            nl::verdict(nl::NF_DROP),
        ],
        &format!("{key} != @live counter drop"),
        &format!("holder {key}: its VIPs are dropped once its element {key} of @live expires"),
    )
}

/// The batch (re)creating both tables with empty maps and sets (tables left by an earlier
/// run are deleted in the same transaction).
pub(crate) fn setup_commands() -> Batch {
    let t = FENCE_TABLE;
    let mut b = remove_commands();
    b.push(nl::add_table(Family::Arp, t));
    b.push(nl::add_table(Family::Inet, t));
    for (f, spec, map) in fence_sets() {
        b.push(match map {
            true => nl::add_verdict_map(f, t, &spec),
            false => nl::add_set(f, t, &spec),
        });
    }
    let filter = |hook, hook_name, priority| nl::BaseChain {
        chain_type: "filter",
        hook,
        hook_name,
        priority,
    };
    b.push(nl::add_chain(
        Family::Arp,
        t,
        "input",
        filter(nl::hook::ARP_IN, "input", 0),
    ));
    b.push(nl::add_chain(
        Family::Inet,
        t,
        "prerouting",
        filter(nl::hook::PREROUTING, "prerouting", -150),
    ));
    for (f, chain, exprs, text) in fence_rules() {
        b.push(nl::add_rule(f, t, chain, exprs, text));
    }
    b
}

/// Whole milliseconds of `timeout`, rounded down (never longer than granted).
fn millis(timeout: Duration) -> u128 {
    timeout.as_millis()
}

/// A fence change's commands, built element by element and sent set by set
/// ([`Grouped::batch`]).
#[derive(Default)]
struct Grouped {
    /// `((place, step), command)`, in the order built.
    cmds: Vec<((u8, u8), nl::Cmd)>,
}

impl Grouped {
    fn push(&mut self, at: (u8, u8), cmd: nl::Cmd) {
        self.cmds.push((at, cmd));
    }

    /// The commands ordered by place ([`at`]), then by step (a stable sort: each element's
    /// own commands keep their order, so an add still precedes its delete). Commands on
    /// different elements are independent inside one transaction; the order only makes each
    /// set's commands consecutive, which [`nl::Batch::messages`] sends as one message, and
    /// puts a chain's creation before the elements that jump to it and its deletion after.
    fn batch(mut self) -> Batch {
        self.cmds.sort_by_key(|(at, _)| *at);
        let mut b = Batch::new();
        for (_, c) in self.cmds {
            b.push(c);
        }
        b
    }
}

/// Whether the kernel updates an existing set element's expiration on an add that carries
/// one (Linux 6.12 and later; before, the add succeeds and the element keeps its expiry, so
/// a refresh must delete and add it again). Finds out in the fence's `inet` table: sets an
/// element of `live` ([`PROBE_KEY`], never a holder's) for 60 s, adds it again with the same
/// 60 s timeout and an expiration of 1 ms (the case renewals are: the same timeout again,
/// which a plain add leaves alone), waits 20 ms and creates it once more with
/// `NLM_F_EXCL`, which only succeeds when the second add shortened it (an expired element
/// counts as absent); then removes it. Any failure: `false` (the delete-and-add way works
/// on every kernel).
async fn probe_timeout_updates(transport: &dyn Transport) -> bool {
    let key = PROBE_KEY.to_ne_bytes();
    let shown = PROBE_KEY.to_string();
    let (f, t, set, shown) = (Family::Inet, FENCE_TABLE, "live", shown.as_str());
    let (long, short) = (Duration::from_secs(60), Duration::from_millis(1));
    let one = Some(short);
    let batch = |cmd: nl::Cmd| {
        let mut b = Batch::new();
        b.push(cmd);
        b
    };
    let set_up = send_batch(
        transport,
        batch(nl::add_element(f, t, set, &key, Some(long), shown)),
        Mode::Commit,
    )
    .await
    .is_ok()
        && send_batch(
            transport,
            batch(nl::expiring_element(f, t, set, &key, long, short, shown)),
            Mode::Commit,
        )
        .await
        .is_ok();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let updates = set_up
        && send_batch(
            transport,
            batch(nl::create_element(f, t, set, &key, one, shown)),
            Mode::Commit,
        )
        .await
        .is_ok();
    let mut gone = batch(nl::add_element(f, t, set, &key, one, shown));
    gone.push(nl::delete_element(f, t, set, &key, shown));
    if let Err(e) = send_batch(transport, gone, Mode::Commit).await {
        debug!(error = %e, "cannot remove the nftables fence's probe element (it expires within 60 s)");
    }
    updates
}

/// One change a holder asks of the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// [`VipFence::refresh`] until this moment.
    Refresh(Instant),
    /// [`VipFence::expire`].
    Expire,
    /// [`VipFence::disarm`].
    Disarm,
    /// [`VipFence::track`]: the op's VIPs are the whole new set.
    Track,
}

/// Who asks for a change: one VIP holder (its [`VipFence::refresh`] arms the VIP for it,
/// its [`VipFence::disarm`] takes back only its own arming). Unique per holder in this
/// process ([`next_owner`]).
pub type Owner = u64;

/// A new [`Owner`], never handed out before in this process.
pub fn next_owner() -> Owner {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// One VIP in the fence's maps, as the kernel holds it after the last successful run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Armed {
    /// The holders that armed it (refreshed it) and have not disarmed it, sorted; empty when
    /// only an expire armed it.
    owners: Vec<Owner>,
    /// The key its map elements jump to: the holder that refreshed it last, [`EXPIRED`]
    /// once expired.
    key: LiveKey,
}

/// One holder's live key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Keyed {
    key: LiveKey,
    /// The end its last refresh asked for, and the latest instant its live elements may
    /// still exist (the end of that run + the timeout it carried + [`LIVE_SLACK`]); `None`:
    /// never set.
    live: Option<(Instant, Instant)>,
    /// How many VIPs it has armed (its entry and its chains go with the last one).
    vips: usize,
}

/// A [`Change`] of some VIPs, asked for by `owner`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Op {
    /// Without repeats ([`distinct`]): [`plan`] counts a refresh's VIPs against those its
    /// holder arms.
    vips: Vec<IpAddr>,
    change: Change,
    owner: Owner,
}

/// `vips` without repeats, in order (a holder's list may name a VIP twice: the API does not
/// forbid it).
fn distinct(vips: &[IpAddr]) -> Vec<IpAddr> {
    let mut seen = HashSet::with_capacity(vips.len());
    vips.iter().copied().filter(|v| seen.insert(*v)).collect()
}

/// The element timeout of a refresh until `until`, written at `now` (whole milliseconds,
/// rounded down; zero once less than 1 ms is left). Pure.
fn timeout_until(until: Instant, now: Instant) -> Duration {
    Duration::from_millis(
        u64::try_from(millis(until.saturating_duration_since(now))).unwrap_or(u64::MAX),
    )
}

/// The recorded state a transaction starts from.
#[derive(Debug, Default)]
struct Recorded {
    /// The VIPs in the maps.
    vips: HashMap<IpAddr, Armed>,
    /// The holders with a key (and chains).
    owners: HashMap<Owner, Keyed>,
    /// The VIPs also kept live one by one in `live4`/`live6` ([`VipFence::track`]).
    tracked: HashSet<IpAddr>,
    /// The last [`LiveKey`] handed out (0: none yet).
    last_key: LiveKey,
}

/// A transaction as planned ([`plan`]): its commands and the state once it has run.
#[derive(Debug)]
struct Plan {
    batch: Batch,
    /// The touched VIPs once it has run (`None`: in no map).
    vips: Vec<(IpAddr, Option<Armed>)>,
    /// The touched holders once it has run (`None`: no VIP armed any more, forgotten).
    owners: Vec<(Owner, Option<Keyed>)>,
    /// The holders whose live elements it sets, with the end each asked for.
    refreshed: Vec<(Owner, Instant)>,
    /// The tracked VIPs once it has run, when a [`Change::Track`] changed them.
    tracked: Option<HashSet<IpAddr>>,
    /// [`Recorded::last_key`] once it has run.
    last_key: LiveKey,
}

/// The commands of `ops`, in order, as one transaction written at `now` (refresh timeouts
/// are counted from it, [`timeout_until`]), from the recorded state `rec`, which it does not
/// change (the caller records the plan once the kernel took it). Pure.
///
/// - A refresh maps each of its VIPs to its holder's chain (a holder's first refresh gets a
///   new key, and its chain in both tables) and sets the holder's live element in both
///   tables: one element a holder, however many VIPs it holds. With less than 1 ms left,
///   its VIPs are mapped to `drop` instead.
/// - An expire maps its VIPs to `drop` (a VIP in no map is added: an expired VIP is
///   filtered, whatever the kernel held before); the holder's next refresh maps them back.
/// - A disarm takes back its holder's arming: a VIP no other holder armed leaves the maps
///   (no longer filtered); one another holder of this node armed meanwhile (the address
///   moved to it) stays, mapped to that holder's chain, so it is answered while that
///   holder's element lives, without a gap. A holder left with no VIP loses its key and its
///   chains.
/// - A track sets the VIPs kept live one by one as well (`live4`/`live6`, for rules that
///   need one VIP's state: egress), from their holder's last refresh.
///
/// Only VIPs whose verdict changes get map commands: an element whose verdict changes is
/// added with its recorded verdict, deleted and added with the new one (the kernel refuses
/// an add over an element with another verdict), and one that goes is added and deleted, so
/// neither fails whether or not the kernel still held it. A live element is added with its
/// timeout and, where the kernel updates elements (`updates`), its expiration; elsewhere,
/// when it may still be live, it is added, deleted and added again (a plain add keeps an
/// element's old timeout). When several ops refresh one holder, the last one's timeout is
/// sent.
fn plan(ops: &[Op], rec: &Recorded, now: Instant, updates: bool) -> Plan {
    let mut vips: HashMap<IpAddr, Option<Armed>> = HashMap::new();
    let mut order: Vec<IpAddr> = Vec::new();
    let mut owners: HashMap<Owner, Option<Keyed>> = HashMap::new();
    let mut last_key = rec.last_key;
    // Per live key refreshed: its holder, the end asked for and the timeout it gives (the
    // keys in the order first refreshed).
    let mut live: HashMap<LiveKey, (Owner, Instant, Duration)> = HashMap::new();
    let mut live_order: Vec<LiveKey> = Vec::new();
    let mut tracked: Option<HashSet<IpAddr>> = None;
    // VIPs whose per-VIP element is to be set again from their final state.
    let mut per_vip: Vec<IpAddr> = Vec::new();
    fn current<'a>(
        vips: &'a HashMap<IpAddr, Option<Armed>>,
        rec: &'a Recorded,
        v: &IpAddr,
    ) -> Option<&'a Armed> {
        match vips.get(v) {
            Some(a) => a.as_ref(),
            None => rec.vips.get(v),
        }
    }
    let keyed = |owners: &HashMap<Owner, Option<Keyed>>, o: Owner| match owners.get(&o) {
        Some(k) => *k,
        None => rec.owners.get(&o).copied(),
    };
    // The key a VIP armed by `a.owners` jumps to once `leaving` no longer carries it: the
    // other holder whose refresh asked for the latest end (counting this transaction's; the
    // highest owner on a tie), or `drop` when none is left.
    let other_holder =
        |a: &Armed,
         leaving: Owner,
         owners: &HashMap<Owner, Option<Keyed>>,
         live: &HashMap<LiveKey, (Owner, Instant, Duration)>| {
            let end = |k: &Keyed| {
                live.get(&k.key)
                    .map(|(_, until, _)| *until)
                    .or(k.live.map(|(until, _)| until))
            };
            a.owners
                .iter()
                .filter(|o| **o != leaving)
                .filter_map(|o| keyed(owners, *o).map(|k| (end(&k), k.key)))
                .max_by_key(|(end, _)| *end)
                .map_or(EXPIRED, |(_, key)| key)
        };
    let is_tracked = |tracked: &Option<HashSet<IpAddr>>, v: &IpAddr| {
        tracked.as_ref().unwrap_or(&rec.tracked).contains(v)
    };
    for op in ops {
        match op.change {
            Change::Refresh(until) => {
                let timeout = timeout_until(until, now);
                let mut k = keyed(&owners, op.owner).unwrap_or_else(|| {
                    // Never EXPIRED nor PROBE_KEY; 4 billion holders in one process would be
                    // needed to reach the end.
                    last_key = last_key.saturating_add(1).min(PROBE_KEY - 1);
                    Keyed {
                        key: last_key,
                        live: None,
                        vips: 0,
                    }
                });
                let target = if timeout.is_zero() { EXPIRED } else { k.key };
                for v in &op.vips {
                    // A holder's steady renewal: every VIP already jumps to its chain.
                    if !vips.contains_key(v)
                        && rec.vips.get(v).is_some_and(|a| {
                            a.key == target && a.owners.binary_search(&op.owner).is_ok()
                        })
                    {
                        if is_tracked(&tracked, v) {
                            per_vip.push(*v);
                        }
                        continue;
                    }
                    let mut a = current(&vips, rec, v).cloned().unwrap_or(Armed {
                        owners: Vec::new(),
                        key: EXPIRED,
                    });
                    if let Err(at) = a.owners.binary_search(&op.owner) {
                        a.owners.insert(at, op.owner);
                        k.vips += 1;
                    }
                    a.key = target;
                    if !vips.contains_key(v) {
                        order.push(*v);
                    }
                    vips.insert(*v, Some(a));
                    if is_tracked(&tracked, v) {
                        per_vip.push(*v);
                    }
                }
                // A holder refreshes all its VIPs: one it still arms but did not name (its
                // disarm failed) no longer lives on its element. It jumps to another holder
                // of the node that armed it, or is dropped, until the holder's disarm goes
                // through. Only when the holder arms more VIPs than it named (`Op::vips`
                // has no repeats) is the node's record searched.
                if op.vips.len() < k.vips {
                    let named: HashSet<&IpAddr> = op.vips.iter().collect();
                    let mut stray: Vec<IpAddr> = rec
                        .vips
                        .keys()
                        .chain(vips.keys())
                        .filter(|v| !named.contains(v))
                        .filter(|v| {
                            current(&vips, rec, v).is_some_and(|a| {
                                a.key == k.key && a.owners.binary_search(&op.owner).is_ok()
                            })
                        })
                        .copied()
                        .collect();
                    stray.sort_unstable();
                    stray.dedup();
                    for v in stray {
                        let Some(mut a) = current(&vips, rec, &v).cloned() else {
                            continue;
                        };
                        a.key = other_holder(&a, op.owner, &owners, &live);
                        if !vips.contains_key(&v) {
                            order.push(v);
                        }
                        vips.insert(v, Some(a));
                        if is_tracked(&tracked, &v) {
                            per_vip.push(v);
                        }
                    }
                }
                owners.insert(op.owner, Some(k));
                // A refresh with no time left maps its VIPs to `drop`; the holder's other
                // VIPs keep what an earlier op of this transaction set.
                if !timeout.is_zero() && live.insert(k.key, (op.owner, until, timeout)).is_none() {
                    live_order.push(k.key);
                }
            }
            Change::Expire => {
                for v in &op.vips {
                    let mut a = current(&vips, rec, v).cloned().unwrap_or(Armed {
                        owners: Vec::new(),
                        key: EXPIRED,
                    });
                    a.key = EXPIRED;
                    if !vips.contains_key(v) {
                        order.push(*v);
                    }
                    vips.insert(*v, Some(a));
                    if is_tracked(&tracked, v) {
                        per_vip.push(*v);
                    }
                }
            }
            Change::Disarm => {
                let mut k = keyed(&owners, op.owner);
                for v in &op.vips {
                    let mut a = current(&vips, rec, v).cloned();
                    if let Some(arm) = a.as_mut() {
                        if let Ok(at) = arm.owners.binary_search(&op.owner) {
                            arm.owners.remove(at);
                            if let Some(k) = k.as_mut() {
                                k.vips = k.vips.saturating_sub(1);
                            }
                        }
                        if arm.owners.is_empty() {
                            a = None;
                        } else if k.is_some_and(|k| k.key == arm.key) {
                            // Moved to another holder of this node.
                            arm.key = other_holder(arm, op.owner, &owners, &live);
                        }
                    }
                    if !vips.contains_key(v) {
                        order.push(*v);
                    }
                    vips.insert(*v, a);
                    if is_tracked(&tracked, v) {
                        per_vip.push(*v);
                    }
                }
                if let Some(k) = k {
                    owners.insert(op.owner, (k.vips > 0).then_some(k));
                    if k.vips == 0 {
                        live.remove(&k.key);
                    }
                }
            }
            Change::Track => {
                let before = tracked.take().unwrap_or_else(|| rec.tracked.clone());
                let after: HashSet<IpAddr> = op.vips.iter().copied().collect();
                per_vip.extend(before.symmetric_difference(&after).copied());
                tracked = Some(after);
            }
        }
    }
    let t = FENCE_TABLE;
    let mut b = Grouped::default();
    // New holders' chains first, then the maps that jump to them.
    let recorded_key = |o: &Owner| rec.owners.get(o).map(|k| k.key);
    for (o, k) in &owners {
        if let Some(k) = k
            && recorded_key(o) != Some(k.key)
        {
            for c in holder_chain_commands(k.key) {
                b.push((at::NEW_CHAINS, 0), c);
            }
        }
    }
    for v in &order {
        let before = rec.vips.get(v).map(|a| a.key);
        let after = vips.get(v).and_then(|a| a.as_ref()).map(|a| a.key);
        if before == after {
            continue;
        }
        for (f, map) in places(*v) {
            let at = |step| (place_index(*f, map), step);
            let el = |key, delete| nl::map_element(*f, t, map, Key::Addr(*v), verdict(key), delete);
            if let Some(old) = before {
                b.push(at(0), el(old, false));
                b.push(at(1), el(old, true));
            }
            if let Some(new) = after {
                b.push(at(2), el(new, false));
            }
        }
    }
    let refreshed: Vec<(LiveKey, Owner, Instant, Duration)> = live_order
        .iter()
        .filter_map(|k| live.get(k).map(|(o, until, t)| (*k, *o, *until, *t)))
        .collect();
    for (key, owner, _, timeout) in &refreshed {
        let may_be_live = rec
            .owners
            .get(owner)
            .and_then(|k| k.live)
            .is_some_and(|(_, ends)| ends > now);
        for (f, set) in LIVE_SETS {
            let at = |step| (place_index(f, set), step);
            live_commands(
                &mut b,
                at,
                f,
                set,
                Key::Mark(*key),
                *timeout,
                updates,
                may_be_live,
            );
        }
    }
    // The tracked VIPs touched, and those that jump to a refreshed holder's chain (a holder
    // refreshes all its VIPs, but its element is theirs whatever the list): their own
    // element follows their final state.
    let tracked_now = tracked.as_ref().unwrap_or(&rec.tracked);
    let key_of = |v: &IpAddr| {
        vips.get(v)
            .map_or_else(|| rec.vips.get(v), |a| a.as_ref())
            .map_or(EXPIRED, |a| a.key)
    };
    per_vip.extend(tracked_now.iter().filter(|v| live.contains_key(&key_of(v))));
    let mut seen = HashSet::new();
    for v in per_vip.into_iter().filter(|v| seen.insert(*v)) {
        let set = per_vip_set(v);
        let at = |step| (place_index(Family::Inet, set), step);
        let key = key_of(&v);
        // The end its holder asked for: this transaction's refresh, or the last one.
        let end = match live.get(&key) {
            _ if key == EXPIRED => None,
            Some((_, until, _)) => Some(*until),
            None => owners
                .values()
                .flatten()
                .chain(rec.owners.values())
                .find(|k| k.key == key)
                .and_then(|k| k.live.map(|(until, _)| until)),
        };
        let timeout = end.map_or(Duration::ZERO, |u| timeout_until(u, now));
        if tracked_now.contains(&v) && !timeout.is_zero() {
            // Tracked VIPs are few: always the way that replaces whatever the kernel holds.
            live_commands(
                &mut b,
                at,
                Family::Inet,
                set,
                Key::Addr(v),
                timeout,
                updates,
                true,
            );
        } else {
            gone_commands(&mut b, at(0), Family::Inet, set, Key::Addr(v));
        }
    }
    // Holders left with no VIP (or armed again in the same transaction, with a new key):
    // their chains, once no element jumps to them, and their live elements.
    for (o, k) in &owners {
        if let Some(old) = recorded_key(o)
            && k.map(|k| k.key) != Some(old)
        {
            for f in TABLES {
                b.push(
                    (at::OLD_CHAINS, 0),
                    nl::delete_chain(f, t, &holder_chain(old)),
                );
            }
            // Its live elements too.
            for (f, set) in LIVE_SETS {
                gone_commands(&mut b, (place_index(f, set), 3), f, set, Key::Mark(old));
            }
        }
    }
    let mut owners: Vec<(Owner, Option<Keyed>)> = owners.into_iter().collect();
    owners.sort_by_key(|(o, _)| *o);
    Plan {
        batch: b.batch(),
        vips: order
            .into_iter()
            .map(|v| {
                let a = vips.remove(&v).flatten();
                (v, a)
            })
            .collect(),
        owners,
        refreshed: refreshed
            .iter()
            .map(|(_, o, until, _)| (*o, *until))
            .collect(),
        tracked,
        last_key,
    }
}

/// Removes the element `key` of `family`'s `set` whether it exists or not: an add with a
/// 1 ms timeout (at `at`), then a delete (the step after), which therefore never fails.
fn gone_commands(b: &mut Grouped, at: (u8, u8), family: Family, set: &'static str, key: Key) {
    let t = FENCE_TABLE;
    let one = Some(Duration::from_millis(1));
    b.push(
        at,
        nl::element(family, t, set, key.clone(), false, one, None),
    );
    b.push(
        (at.0, at.1 + 1),
        nl::element(family, t, set, key, true, None, None),
    );
}

/// Sets a live element `key` of `family`'s `set` to expire `timeout` after the kernel
/// handles it: one add with its expiration where the kernel updates elements (`updates`),
/// else an add, and when the element `may_be_live`, a delete and an add again (an add over
/// a live element keeps its old timeout). Every add carries the timeout: an element without
/// one (which would never expire) is never created.
#[allow(clippy::too_many_arguments)]
fn live_commands(
    b: &mut Grouped,
    at: impl Fn(u8) -> (u8, u8),
    family: Family,
    set: &'static str,
    key: Key,
    timeout: Duration,
    updates: bool,
    may_be_live: bool,
) {
    let t = FENCE_TABLE;
    let add = |expires| nl::element(family, t, set, key.clone(), false, Some(timeout), expires);
    if updates {
        b.push(at(0), add(Some(timeout)));
        return;
    }
    b.push(at(0), add(None));
    if may_be_live {
        b.push(
            at(1),
            nl::element(family, t, set, key.clone(), true, None, None),
        );
        b.push(at(2), add(None));
    }
}

fn list(vips: &[IpAddr]) -> String {
    vips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The real fence: vipd's `vipd_fence` tables, changed through netlink ([`nl`]).
#[derive(Debug)]
pub struct NftFence {
    state: Arc<FenceState>,
    /// One run at a time: the recorded state follows the runs in order.
    run: tokio::sync::Mutex<()>,
}

/// What [`NftFence`] knows of the kernel's maps and sets, and the way to them.
#[derive(Debug)]
struct FenceState {
    transport: Arc<dyn Transport>,
    /// The maps' VIPs and the holders' live keys as of the last successful run.
    recorded: Mutex<Recorded>,
    /// Whether an add with an expiration updates an existing element ([`probe_timeout_updates`]).
    updates_timeout: std::sync::atomic::AtomicBool,
    /// When the maps were last rewritten from the record ([`NftFence::resync`]).
    resynced: Mutex<Option<Instant>>,
}

/// Sends `batch` through `transport` from a blocking thread; the error is the kernel's
/// answer as text.
async fn send_batch(transport: &dyn Transport, batch: Batch, mode: Mode) -> Result<(), String> {
    nl::send_with(transport, batch, mode)
        .await
        .map_err(|e| e.to_string())
}

impl NftFence {
    /// Creates both tables empty in the kernel (replacing ones left by an earlier run).
    ///
    /// # Errors
    /// [`FenceError::Setup`] when the kernel refuses (no nf_tables `arp` or `inet` family
    /// or set timeouts, no CAP_NET_ADMIN).
    /// Then finds out whether the kernel updates an element's expiration on an add that
    /// carries one ([`probe_timeout_updates`], about 20 ms): where it does, a renewal refreshes
    /// each element with one message instead of a delete and two adds.
    pub async fn start() -> Result<Self, FenceError> {
        let f = Self::start_with(Arc::new(Kernel)).await?;
        let updates = probe_timeout_updates(&Kernel).await;
        debug!(
            updates,
            "whether the kernel updates an nftables element's expiration on an add"
        );
        f.set_timeout_updates(updates);
        Ok(f)
    }

    /// Whether renewals refresh live elements with one add ([`Self::set_timeout_updates`]).
    pub fn timeout_updates(&self) -> bool {
        self.state
            .updates_timeout
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a renewal may refresh a live element with one add carrying its expiration (the
    /// kernel updates it, Linux 6.12 and later) instead of deleting and adding it again. Off after
    /// [`NftFence::start_with`]; [`NftFence::start`] probes the kernel.
    pub fn set_timeout_updates(&self, updates: bool) {
        self.state
            .updates_timeout
            .store(updates, std::sync::atomic::Ordering::Relaxed);
    }

    /// [`NftFence::start`] through `transport`.
    ///
    /// # Errors
    /// As [`NftFence::start`].
    pub async fn start_with(transport: Arc<dyn Transport>) -> Result<Self, FenceError> {
        let c = setup_commands();
        send_batch(transport.as_ref(), c.clone(), Mode::Commit)
            .await
            .map_err(|detail| FenceError::Setup {
                command: c.text(),
                detail,
            })?;
        Ok(NftFence {
            state: Arc::new(FenceState {
                transport,
                recorded: Mutex::new(Recorded::default()),
                resynced: Mutex::new(None),
                updates_timeout: std::sync::atomic::AtomicBool::new(false),
            }),
            run: tokio::sync::Mutex::new(()),
        })
    }

    /// Checks, without changing anything (the batch is validated by the kernel and
    /// aborted), that the tables could be created: for `vipd preflight`.
    ///
    /// # Errors
    /// [`FenceError::Setup`] as [`NftFence::start`].
    pub async fn check() -> Result<(), FenceError> {
        let c = setup_commands();
        send_batch(&Kernel, c.clone(), Mode::Check)
            .await
            .map_err(|detail| FenceError::Setup {
                command: c.text(),
                detail,
            })
    }

    /// Runs `ops` as one transaction, their timeouts computed from the moment it is built,
    /// right before the `sendmsg` that commits it ([`plan`]), and, when it
    /// succeeded, records the live elements' new ends. Returns when it was built and when
    /// the kernel answered ([`ends_by`]). A failed run changed nothing (nf_tables
    /// transactions are atomic).
    ///
    /// A run that fails because vipd's tables are gone (removed by someone else: `nft flush
    /// ruleset`, a firewall reload that replaces the whole ruleset) creates them again
    /// ([`Self::restore_tables`]) and runs once more: without it the fence stayed off until
    /// vipd restarted (found by the new-user trial).
    async fn apply(&self, ops: &[Op]) -> Result<(Instant, Instant), FenceError> {
        if ops.iter().all(|o| o.vips.is_empty()) {
            let now = Instant::now();
            return Ok((now, now));
        }
        self.apply_always(ops).await
    }

    /// [`Self::apply`], even when `ops` name no VIP (a track of none).
    async fn apply_always(&self, ops: &[Op]) -> Result<(Instant, Instant), FenceError> {
        let _one_run = self.run.lock().await;
        match self.apply_locked(ops).await {
            Err(e) => match self.restore_tables().await || self.resync(&e).await {
                true => self.apply_locked(ops).await,
                false => Err(e),
            },
            ok => ok,
        }
    }

    /// After a failed run whose tables are there: whether the maps and sets were rewritten
    /// from the record, at most once every [`RESYNC_EVERY`]. A run plans its changes from the
    /// record of what the kernel holds ([`plan`]); when the kernel holds something else (an
    /// operator edited vipd's maps, or a transaction the kernel committed but whose answer
    /// vipd could not read), a change of that element fails (an add over another verdict:
    /// `EEXIST`), and with it every holder's changes batched with it, until vipd restarts
    /// (found by the new-user trial). One transaction flushes the maps and the live sets,
    /// sets every recorded holder's chain to its one rule, and adds the recorded VIPs, the
    /// holders' live elements with the time left of their last refresh and the tracked VIPs'
    /// own; the record stands. Logs at warn.
    async fn resync(&self, error: &FenceError) -> bool {
        let now = Instant::now();
        {
            let mut last = self
                .state
                .resynced
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| now.saturating_duration_since(at) < RESYNC_EVERY) {
                return false;
            }
            *last = Some(now);
        }
        let batch = {
            let rec = self
                .state
                .recorded
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            resync_commands(&rec, now)
        };
        match send_batch(self.state.transport.as_ref(), batch.clone(), Mode::Commit).await {
            Ok(()) => {
                warn!(table = FENCE_TABLE, %error, "the nftables fence's maps disagreed with vipd's record of them (edited by someone else, or a transaction whose answer was lost); rewrote them from the record");
                true
            }
            Err(detail) => {
                debug!(command = %batch.summary(), %detail, "cannot rewrite the nftables fence's maps from the record");
                false
            }
        }
    }

    /// After a failed run: whether vipd's tables were gone and are created again. Checks
    /// (in the kernel's check mode: nothing changes) that both tables and their base chains
    /// exist; when they do not, runs the start's setup ([`setup_commands`], which replaces
    /// whatever is left of them) and forgets every element and arming it knew (the new
    /// tables have none: each holder arms and sets its VIPs again at its next refresh, within
    /// a retry period; until then they are not filtered, as since the tables went). Logs at
    /// warn. `false` when the tables are there (the failure was something else) or cannot
    /// be created.
    async fn restore_tables(&self) -> bool {
        let t = FENCE_TABLE;
        let mut probe = Batch::new();
        probe.push(nl::flush_chain(Family::Arp, t, "input"));
        probe.push(nl::flush_chain(Family::Inet, t, "prerouting"));
        let transport = self.state.transport.as_ref();
        if send_batch(transport, probe, Mode::Check).await.is_ok() {
            return false;
        }
        let setup = setup_commands();
        match send_batch(transport, setup.clone(), Mode::Commit).await {
            Ok(()) => {
                // Keys keep counting up: one set before cannot come back.
                let mut rec = self
                    .state
                    .recorded
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                rec.vips.clear();
                rec.owners.clear();
                drop(rec);
                warn!(
                    table = FENCE_TABLE,
                    "the nftables fence's tables were gone (removed by someone else, e.g. `nft flush ruleset`); created them again: each VIP is fenced again at its holder's next renewal"
                );
                true
            }
            Err(detail) => {
                debug!(command = %setup.text(), %detail, "the nftables fence's tables are gone and cannot be created again");
                false
            }
        }
    }

    /// [`Self::apply`] with the run lock held.
    async fn apply_locked(&self, ops: &[Op]) -> Result<(Instant, Instant), FenceError> {
        // Opened on this thread: in its network namespace.
        let link = self.state.transport.open();
        let state = self.state.clone();
        let owned = ops.to_vec();
        let run = tokio::task::spawn_blocking(move || {
            let link = match link {
                Ok(l) => l,
                Err(e) => return (None, Err(e), Instant::now()),
            };
            // The clock is read here, after the socket is open, and the batch goes to
            // the kernel as soon as it is built.
            let t = state.transaction(&owned);
            let result = link.send(&t.1.batch, Mode::Commit);
            (Some(t), result, Instant::now())
        })
        .await;
        let (written, result, done) = run.unwrap_or_else(|e| {
            (
                None,
                Err(NftError::Io {
                    batch: String::new(),
                    detail: e.to_string(),
                }),
                Instant::now(),
            )
        });
        // Not built (no socket): the batch it would have been, for the error (the
        // recorded state is unchanged: one run at a time).
        let (written, plan) = written.unwrap_or_else(|| self.state.transaction(ops));
        if let Err(e) = result {
            let vips: Vec<IpAddr> = ops.iter().flat_map(|o| o.vips.clone()).collect();
            return Err(FenceError::Change {
                vips: list(&vips),
                command: plan.batch.text(),
                detail: e.to_string(),
            });
        }
        self.state.record(plan, written, done);
        Ok((written, done))
    }

    async fn change(
        &self,
        owner: Owner,
        vips: &[IpAddr],
        change: Change,
    ) -> Result<Instant, FenceError> {
        let (written, done) = self
            .apply(&[Op {
                vips: distinct(vips),
                change,
                owner,
            }])
            .await?;
        Ok(outcome(change, written, done))
    }
}

impl Recorded {
    /// Records `plan`, committed in a transaction built at `written` and answered at `done`:
    /// the touched VIPs and holders, the tracked VIPs, and the refreshed holders' ends (the
    /// end each asked for, and [`ends_by`] + [`LIVE_SLACK`]).
    fn record(&mut self, plan: Plan, written: Instant, done: Instant) {
        fn put<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>, k: K, v: Option<V>) {
            match v {
                Some(v) => {
                    map.insert(k, v);
                }
                None => {
                    map.remove(&k);
                }
            }
        }
        for (v, a) in plan.vips {
            put(&mut self.vips, v, a);
        }
        for (o, k) in plan.owners {
            put(&mut self.owners, o, k);
        }
        for (o, until) in plan.refreshed {
            if let Some(k) = self.owners.get_mut(&o) {
                k.live = Some((until, ends_by(until, written, done) + LIVE_SLACK));
            }
        }
        if let Some(t) = plan.tracked {
            self.tracked = t;
        }
        self.last_key = plan.last_key;
    }
}

impl FenceState {
    /// The transaction of `ops` planned now ([`plan`]) from the recorded state: when, and the
    /// plan. Reads the recorded state of the ops' VIPs and holders only: a shard holder's
    /// steady renewal (every VIP already mapped to its key) is one live element a table and
    /// no map command.
    fn transaction(&self, ops: &[Op]) -> (Instant, Plan) {
        let now = Instant::now();
        let updates = self
            .updates_timeout
            .load(std::sync::atomic::Ordering::Relaxed);
        let rec = self.recorded.lock().unwrap_or_else(PoisonError::into_inner);
        (now, plan(ops, &rec, now, updates))
    }

    /// Records `plan`, committed in a transaction built at `written` and answered at `done`
    /// ([`Recorded::record`]).
    fn record(&self, plan: Plan, written: Instant, done: Instant) {
        self.recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(plan, written, done);
    }
}

/// The latest moment an element refreshed until `until` by a run written at `written` and
/// returned at `done` may live: the kernel started its timeout ([`timeout_until`] of
/// `written`) at some moment of the run, at the latest `done`. Pure.
fn ends_by(until: Instant, written: Instant, done: Instant) -> Instant {
    done + timeout_until(until, written)
}

/// What [`VipFence`]'s methods return for `change` run in a transaction written at
/// `written` and returned at `done`: for a refresh [`ends_by`], else `done` (nothing lives
/// past it).
fn outcome(change: Change, written: Instant, done: Instant) -> Instant {
    match change {
        Change::Refresh(until) => ends_by(until, written, done),
        Change::Expire | Change::Disarm | Change::Track => done,
    }
}
impl VipFence for NftFence {
    fn refresh<'a>(
        &'a self,
        owner: Owner,
        vips: &'a [IpAddr],
        until: Instant,
    ) -> BoxFuture<'a, Result<Instant, FenceError>> {
        Box::pin(self.change(owner, vips, Change::Refresh(until)))
    }

    fn expire<'a>(&'a self, vips: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move { self.change(0, vips, Change::Expire).await.map(|_| ()) })
    }

    fn disarm<'a>(
        &'a self,
        owner: Owner,
        vips: &'a [IpAddr],
    ) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move { self.change(owner, vips, Change::Disarm).await.map(|_| ()) })
    }

    fn track<'a>(&'a self, vips: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            let op = Op {
                vips: distinct(vips),
                change: Change::Track,
                owner: 0,
            };
            self.apply_always(&[op]).await.map(|_| ())
        })
    }

    fn active(&self) -> bool {
        true
    }

    fn close(&self) -> BoxFuture<'_, Result<(), FenceError>> {
        Box::pin(async move {
            let c = remove_commands();
            send_batch(self.state.transport.as_ref(), c.clone(), Mode::Commit)
                .await
                .map_err(|detail| FenceError::Remove {
                    command: c.text(),
                    detail,
                })
        })
    }
}

/// One change queued for [`BatchedFence`]'s writer and where the outcome goes.
struct Batched {
    op: Op,
    reply: tokio::sync::oneshot::Sender<Result<Instant, FenceError>>,
}

/// [`NftFence`] for many holders at once: every change queued while a transaction is under
/// way goes into the next one. With a lease per Service (a renewal per Service every retry
/// period) one transaction per renewal would be hundreds a second; batched, it is at most
/// one at a time, whatever the number of holders.
///
/// Each caller gives the end of its element's live time, and the timeout is computed from
/// it when the batch is written (`NftFence::apply`): the time spent in the queue is taken
/// off the timeout, so batching cannot stretch a fence. A failed run fails
/// every change in it (nftables transactions are atomic): their elements keep the timeouts
/// they had.
#[derive(Debug)]
pub struct BatchedFence {
    nft: Arc<NftFence>,
    queue: tokio::sync::mpsc::UnboundedSender<Batched>,
}

impl fmt::Debug for Batched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batched").field("op", &self.op).finish()
    }
}

impl BatchedFence {
    /// Wraps `nft` and starts its writer task (ends when the last clone of this fence is
    /// dropped).
    pub fn new(nft: NftFence) -> Self {
        let nft = Arc::new(nft);
        let (queue, mut rx) = tokio::sync::mpsc::unbounded_channel::<Batched>();
        let writer = nft.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                let ops: Vec<Op> = batch.iter().map(|b| b.op.clone()).collect();
                let result = writer.apply(&ops).await;
                for b in batch {
                    // A caller that went away (its holder stopped) needs no answer.
                    let _ = b.reply.send(
                        result
                            .clone()
                            .map(|(written, done)| outcome(b.op.change, written, done)),
                    );
                }
            }
        });
        BatchedFence { nft, queue }
    }

    async fn queue(
        &self,
        owner: Owner,
        vips: &[IpAddr],
        change: Change,
    ) -> Result<Instant, FenceError> {
        if vips.is_empty() {
            return Ok(Instant::now());
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let lost = |detail: &str| FenceError::Change {
            vips: list(vips),
            command: format!("{change:?}"),
            detail: detail.to_string(),
        };
        const ENDED: &str = "the fence's writer task has ended";
        self.queue
            .send(Batched {
                op: Op {
                    vips: distinct(vips),
                    change,
                    owner,
                },
                reply,
            })
            .map_err(|_| lost(ENDED))?;
        answer.await.unwrap_or_else(|_| Err(lost(ENDED)))
    }
}

impl VipFence for BatchedFence {
    fn refresh<'a>(
        &'a self,
        owner: Owner,
        vips: &'a [IpAddr],
        until: Instant,
    ) -> BoxFuture<'a, Result<Instant, FenceError>> {
        Box::pin(self.queue(owner, vips, Change::Refresh(until)))
    }

    fn expire<'a>(&'a self, vips: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move { self.queue(0, vips, Change::Expire).await.map(|_| ()) })
    }

    fn disarm<'a>(
        &'a self,
        owner: Owner,
        vips: &'a [IpAddr],
    ) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move { self.queue(owner, vips, Change::Disarm).await.map(|_| ()) })
    }

    fn track<'a>(&'a self, vips: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        self.nft.track(vips)
    }

    fn active(&self) -> bool {
        true
    }

    fn close(&self) -> BoxFuture<'_, Result<(), FenceError>> {
        self.nft.close()
    }
}

/// `vip_nftfence`: whether every VIP is fenced in nftables to the millisecond as well as by
/// its address lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NftFenceSetting {
    /// Unset: on wherever the kernel supports it; where it cannot start, the address
    /// lifetime alone fences (one warning saying what that costs) and only timings it
    /// cannot fence (sub-second ones) are refused.
    #[default]
    Default,
    /// `vip_nftfence=true`: on; where it cannot start, the same as [`Self::Default`], the
    /// warning naming the option.
    On,
    /// `vip_nftfence=false`: off; the address lifetime alone fences, and sub-second
    /// timings are refused when the configuration is read.
    Off,
}

impl NftFenceSetting {
    /// From the option's value (`None`: unset).
    pub fn from_option(value: Option<bool>) -> Self {
        match value {
            None => NftFenceSetting::Default,
            Some(true) => NftFenceSetting::On,
            Some(false) => NftFenceSetting::Off,
        }
    }

    /// Whether the millisecond fence is to be started (the lease timings are planned
    /// with it: [`crate::lease::fence_plan`]).
    pub fn wanted(self) -> bool {
        self != NftFenceSetting::Off
    }
}

/// What running without the millisecond fence costs, for logs and `vipd preflight`.
pub const WITHOUT_MS_FENCE: &str = "the address lifetime alone fences, in whole seconds: with several VIPs on one holder the kernel removes expired addresses in runs up to a second apart, so the last one can outlive the lease by up to ~1 s (a takeover's RFC 5227 probe covers that window for the control-plane VIP), and sub-second lease timings cannot be used";

/// Starts the nftables fence for `vipd manager` when `setting` wants it and `used` (a
/// control plane or Services to fence): the [`NftFence`] when the kernel supports it, else a
/// [`NoopFence`] with one warning saying that the address lifetime alone fences, what that
/// costs and why. Off: a [`NoopFence`], after deleting tables a crashed run with the fence
/// on may have left (they would drop the VIP's traffic on this node for good).
pub async fn start_fence(setting: NftFenceSetting, used: bool) -> Arc<dyn VipFence> {
    if !setting.wanted() || !used {
        if let Err(e) = send_batch(&Kernel, remove_commands(), Mode::Commit).await {
            debug!(error = %e, "no nftables fence tables to remove (the millisecond fence is off)");
        }
        return Arc::new(NoopFence);
    }
    match NftFence::start().await {
        Ok(f) => {
            info!(
                table = FENCE_TABLE,
                "millisecond fence on: every VIP is answered only for the fence lifetime after its holder last set it, never past its last renewal's send time + the lease less the margin, to the millisecond, besides its address lifetime (nft list table arp vipd_fence; nft list table inet vipd_fence)"
            );
            Arc::new(BatchedFence::new(f))
        }
        Err(e) => {
            let asked = match setting {
                NftFenceSetting::On => "vip_nftfence=true, but ",
                _ => "",
            };
            warn!(error = %e, "{asked}the millisecond fence cannot start on this node (nf_tables arp/inet with set timeouts and CAP_NET_ADMIN are needed; `vipd preflight` checks it): {WITHOUT_MS_FENCE}; set vip_nftfence=false to run this way on purpose");
            Arc::new(NoopFence)
        }
    }
}

#[cfg(test)]
mod tests;
