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
//!     set vips { type ipv4_addr; }                  # fenced IPv4 VIPs
//!     set live { type ipv4_addr; flags timeout; }   # ... while their timeout runs
//!     chain input {
//!         type filter hook input priority filter; policy accept;
//!         arp operation request arp daddr ip @vips arp daddr ip != @live counter drop
//!     }
//! }
//! table inet vipd_fence {
//!     set vips4 { type ipv4_addr; }   set live4 { type ipv4_addr; flags timeout; }
//!     set vips6 { type ipv6_addr; }   set live6 { type ipv6_addr; flags timeout; }
//!     chain prerouting {
//!         type filter hook prerouting priority -150; policy accept;
//!         ip daddr @vips4 ip daddr != @live4 counter drop
//!         ip6 daddr @vips6 ip6 daddr != @live6 counter drop
//!         icmpv6 type nd-neighbor-solicit @th,64,128 @vips6ns @th,64,128 != @live6ns counter drop
//!     }
//!     set vips6ns { typeof @th,64,128; }  set live6ns { typeof @th,64,128; flags timeout; }
//! }
//! ```
//!
//! The `inet` chain runs at priority -150, before destination NAT (-100), so the
//! load balancer's DNAT ([`crate::controlplane::lb`]) never turns a fenced packet into a forwarded one.
//! Neighbour solicitations for an IPv6 VIP go to its solicited-node multicast address and
//! carry the VIP as the ICMPv6 target (bits 64..192 of the ICMPv6 message, RFC 4861 §4.3):
//! nftables 1.0.6 has no `icmpv6 taddr`, so those sets hold the VIP as a 128-bit integer
//! matched against that raw payload.
//!
//! Element timeouts are sent in milliseconds (`timeout 1995ms` in `nft` syntax) through
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
    /// `until`: the element timeout (whole milliseconds, rounded down) is computed from
    /// `until` right before `nft` runs, so time spent queued or frozen before the run does
    /// not stretch it. When less than 1 ms is left the VIPs' elements are expired instead.
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
    fn active(&self) -> bool {
        false
    }
    fn close(&self) -> BoxFuture<'_, Result<(), FenceError>> {
        Box::pin(async { Ok(()) })
    }
}

/// One place a VIP is fenced: `(family, VIP set, live set, key)`.
type Place = (Family, &'static str, &'static str, Key);

/// Every place `vip` is fenced: IPv4 in the `arp` table (ARP requests) and the `inet`
/// table (packets); IPv6 in the `inet` table, as an address (packets) and as the 128-bit
/// integer the neighbour solicitation rule compares the ICMPv6 target with (`@th,64,128`,
/// the same 16 bytes).
fn places(vip: IpAddr) -> [Place; 2] {
    match vip {
        IpAddr::V4(_) => [
            (Family::Arp, "vips", "live", Key::Addr(vip)),
            (Family::Inet, "vips4", "live4", Key::Addr(vip)),
        ],
        IpAddr::V6(a) => [
            (Family::Inet, "vips6", "live6", Key::Addr(vip)),
            (
                Family::Inet,
                "vips6ns",
                "live6ns",
                Key::Integer(u128::from(a)),
            ),
        ],
    }
}

/// The batch deleting both tables whether they exist or not.
pub(crate) fn remove_commands() -> Batch {
    let mut b = nl::remove_table(Family::Arp, FENCE_TABLE);
    b.append(nl::remove_table(Family::Inet, FENCE_TABLE));
    b
}

/// `nft`'s user data of the `typeof @th,64,128` sets (key byte order and the typeof
/// expression), copied from what nftables 1.0.6 sends, so that `nft list` shows them as
/// written.
const TH_64_128_USERDATA: &str =
    "0004020000000326000407000000011e000400000000010400000000020403000000030440000000040480000000";

/// The fence's sets: `(family, spec)`, ids in the order `nft` gives them.
fn fence_sets() -> Vec<(Family, nl::SetSpec)> {
    let set = |name, id, key_type, key_len, timeout, userdata: Vec<u8>, shown| nl::SetSpec {
        name,
        id,
        key_type,
        key_len,
        timeout,
        userdata,
        shown,
    };
    let th = nl::unhex(TH_64_128_USERDATA);
    let be = nl::keybyteorder(2);
    vec![
        (
            Family::Arp,
            set("vips", 1, 7, 4, false, be.clone(), "{ type ipv4_addr; }"),
        ),
        (
            Family::Arp,
            set(
                "live",
                2,
                7,
                4,
                true,
                be.clone(),
                "{ type ipv4_addr; flags timeout; }",
            ),
        ),
        (
            Family::Inet,
            set("vips4", 3, 7, 4, false, be.clone(), "{ type ipv4_addr; }"),
        ),
        (
            Family::Inet,
            set(
                "live4",
                4,
                7,
                4,
                true,
                be.clone(),
                "{ type ipv4_addr; flags timeout; }",
            ),
        ),
        (
            Family::Inet,
            set("vips6", 5, 8, 16, false, be.clone(), "{ type ipv6_addr; }"),
        ),
        (
            Family::Inet,
            set(
                "live6",
                6,
                8,
                16,
                true,
                be,
                "{ type ipv6_addr; flags timeout; }",
            ),
        ),
        (
            Family::Inet,
            set(
                "vips6ns",
                7,
                4,
                16,
                false,
                th.clone(),
                "{ typeof @th,64,128; }",
            ),
        ),
        (
            Family::Inet,
            set(
                "live6ns",
                8,
                4,
                16,
                true,
                th,
                "{ typeof @th,64,128; flags timeout; }",
            ),
        ),
    ]
}

/// `<load> @<vips> <load> != @<live> counter drop`: the fence rule over one key.
fn fence_rule(
    prefix: Vec<nl::Expr>,
    load: &nl::Expr,
    vips: (&str, u32),
    live: (&str, u32),
) -> Vec<nl::Expr> {
    let mut e = prefix;
    e.extend([
        load.clone(),
        nl::lookup(vips.0, vips.1, false),
        load.clone(),
        nl::lookup(live.0, live.1, true),
        nl::counter(),
        nl::verdict(nl::NF_DROP),
    ]);
    e
}

/// `meta nfproto <proto>`, as `nft` writes the family match of `ip ...`/`ip6 ...` in an
/// `inet` table.
fn nfproto(proto: u8) -> Vec<nl::Expr> {
    vec![nl::meta(MetaKey::Nfproto), nl::cmp(true, &[proto])]
}

/// The fence's rules: `(family, chain, expressions, text)`.
fn fence_rules() -> Vec<(Family, &'static str, Vec<nl::Expr>, &'static str)> {
    use nl::{Base, payload};
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
            fence_rule(arp_request, &arp_daddr, ("vips", 1), ("live", 2)),
            "arp operation request arp daddr ip @vips arp daddr ip != @live counter drop",
        ),
        (
            Family::Inet,
            "prerouting",
            fence_rule(
                nfproto(libc::NFPROTO_IPV4 as u8),
                &ip_daddr,
                ("vips4", 3),
                ("live4", 4),
            ),
            "ip daddr @vips4 ip daddr != @live4 counter drop",
        ),
        (
            Family::Inet,
            "prerouting",
            fence_rule(
                nfproto(libc::NFPROTO_IPV6 as u8),
                &ip6_daddr,
                ("vips6", 5),
                ("live6", 6),
            ),
            "ip6 daddr @vips6 ip6 daddr != @live6 counter drop",
        ),
        (
            Family::Inet,
            "prerouting",
            fence_rule(ns, &th, ("vips6ns", 7), ("live6ns", 8)),
            "icmpv6 type nd-neighbor-solicit @th,64,128 @vips6ns @th,64,128 != @live6ns counter drop",
        ),
    ]
}

/// The batch (re)creating both tables with empty sets (tables left by an earlier run are
/// deleted in the same transaction).
pub(crate) fn setup_commands() -> Batch {
    let t = FENCE_TABLE;
    let mut b = remove_commands();
    b.push(nl::add_table(Family::Arp, t));
    b.push(nl::add_table(Family::Inet, t));
    for (f, spec) in fence_sets() {
        b.push(nl::add_set(f, t, &spec));
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

/// The batch arming `vips` and setting their live element to expire `timeout` after
/// the kernel handles it; `None` when `timeout` is under 1 ms (nothing may be granted).
/// A VIP for which `armed` is true is in its `vips` sets already and is not added to them
/// again. The element of a VIP for which `may_be_live` is true is deleted and added again
/// (a plain `add` keeps its timeout before Linux 6.12); known absent or expired, it is only
/// added. With `updates` (the kernel updates an existing element's expiration,
/// [`probe_timeout_updates`]) every element is added with its expiration
/// ([`nl::refresh_element`]) whatever `may_be_live` says: one message per place of a VIP (two
/// a VIP, not four, and no delete, which makes the kernel wait for readers).
pub(crate) fn refresh_commands(
    vips: &[IpAddr],
    timeout: Duration,
    may_be_live: impl Fn(&IpAddr) -> bool,
    armed: impl Fn(&IpAddr) -> bool,
    updates: bool,
) -> Option<Batch> {
    let ms = millis(timeout);
    if ms == 0 {
        return None;
    }
    let timeout = Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
    let t = FENCE_TABLE;
    let mut b = Grouped::default();
    for vip in once_each(vips) {
        let replace = may_be_live(vip);
        let arm = !armed(vip);
        for (i, (f, set, live, k)) in places(*vip).into_iter().enumerate() {
            let at = |step: u8| (i, live, step);
            let add =
                |set, timeout, expires| nl::element(f, t, set, k.clone(), false, timeout, expires);
            if arm {
                b.push(at(0), add(set, None, None));
            }
            if updates {
                b.push(at(1), add(live, Some(timeout), Some(timeout)));
                continue;
            }
            b.push(at(1), add(live, Some(timeout), None));
            if replace {
                b.push(at(2), nl::element(f, t, live, k.clone(), true, None, None));
                b.push(at(3), add(live, Some(timeout), None));
            }
        }
    }
    Some(b.batch())
}

/// `vips` without repeats, in order. A VIP given twice is fenced once: the commands are
/// grouped by step ([`Grouped::batch`]), where a second copy's delete would follow the
/// first's and fail the whole transaction (ENOENT); VIP by VIP, it followed its own add.
fn once_each(vips: &[IpAddr]) -> impl Iterator<Item = &IpAddr> {
    let mut seen = HashSet::with_capacity(vips.len());
    vips.iter().filter(move |v| seen.insert(**v))
}

/// A fence change's commands, built VIP by VIP and sent place by place
/// ([`Grouped::batch`]).
#[derive(Default)]
struct Grouped {
    /// `((place index, live set, step), command)`, in the order built.
    cmds: Vec<((usize, &'static str, u8), nl::Cmd)>,
}

impl Grouped {
    fn push(&mut self, at: (usize, &'static str, u8), cmd: nl::Cmd) {
        self.cmds.push((at, cmd));
    }

    /// The commands ordered by place (the VIPs' first place, then their second; per
    /// family), then by step within each VIP's sequence, the VIPs in the order given
    /// (a stable sort: each element's own commands keep their order, so an add still
    /// precedes its delete). Commands on different elements are independent inside one
    /// transaction; the order only makes each set's commands consecutive, which
    /// [`nl::Batch::messages`] sends as one message (a shard's renewal: a few messages
    /// instead of one per VIP and place). One VIP's commands come out in the order built.
    fn batch(mut self) -> Batch {
        self.cmds.sort_by_key(|(at, _)| *at);
        let mut b = Batch::new();
        for (_, c) in self.cmds {
            b.push(c);
        }
        b
    }
}

/// The key [`probe_timeout_updates`] uses (`0.0.0.0`, never a VIP).
const PROBE_KEY: [u8; 4] = [0; 4];

/// Whether the kernel updates an existing set element's expiration on an add that carries
/// one (Linux 6.12 and later; before, the add succeeds and the element keeps its expiry, so
/// a refresh must delete and add it again). Finds out in the fence's `inet` table: sets an
/// element of `live4` for 60 s, adds it again with the same 60 s timeout and an expiration
/// of 1 ms (the case renewals are: the same timeout again, which a plain add leaves alone),
/// waits 20 ms and creates it once more with `NLM_F_EXCL`, which only succeeds when the
/// second add shortened it (an expired element counts as absent); then removes it. Any
/// failure: `false` (the delete-and-add way works on every kernel).
async fn probe_timeout_updates(transport: &dyn Transport) -> bool {
    let (f, t, set, shown) = (Family::Inet, FENCE_TABLE, "live4", "0.0.0.0");
    let (long, short) = (Duration::from_secs(60), Duration::from_millis(1));
    let one = Some(short);
    let batch = |cmd: nl::Cmd| {
        let mut b = Batch::new();
        b.push(cmd);
        b
    };
    let set_up = send_batch(
        transport,
        batch(nl::add_element(f, t, set, &PROBE_KEY, Some(long), shown)),
        Mode::Commit,
    )
    .await
    .is_ok()
        && send_batch(
            transport,
            batch(nl::expiring_element(
                f, t, set, &PROBE_KEY, long, short, shown,
            )),
            Mode::Commit,
        )
        .await
        .is_ok();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let updates = set_up
        && send_batch(
            transport,
            batch(nl::create_element(f, t, set, &PROBE_KEY, one, shown)),
            Mode::Commit,
        )
        .await
        .is_ok();
    let mut gone = batch(nl::add_element(f, t, set, &PROBE_KEY, one, shown));
    gone.push(nl::delete_element(f, t, set, &PROBE_KEY, shown));
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

/// Per VIP, the holders that armed it and have not disarmed it.
type Arms = HashMap<IpAddr, std::collections::BTreeSet<Owner>>;

/// A transaction as written: when, its commands, and [`Arms`] of its VIPs once it has run
/// (a VIP of its ops without an entry: armed by no holder).
type Transaction = (Instant, Batch, Arms);

/// A [`Change`] of some VIPs, asked for by `owner`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Op {
    vips: Vec<IpAddr>,
    change: Change,
    owner: Owner,
}

/// The element timeout of a refresh until `until`, written at `now` (whole milliseconds,
/// rounded down; zero once less than 1 ms is left). Pure.
fn timeout_until(until: Instant, now: Instant) -> Duration {
    Duration::from_millis(
        u64::try_from(millis(until.saturating_duration_since(now))).unwrap_or(u64::MAX),
    )
}

/// The commands of `ops`, in order, as one transaction written at `now` (refresh timeouts
/// are counted from it, [`timeout_until`]). `may_be_live` holds the VIPs whose live element
/// may exist before it; it is updated as each op is written, so a second refresh of a VIP
/// in the same transaction replaces the first's element. `arms` holds who armed each VIP,
/// updated likewise: a refresh arms the VIP for its owner, a disarm takes back its owner's
/// arming and stops filtering the VIP only when no other holder armed it (an address that
/// moved from one holder of this node to another stays filtered, and its live element
/// stays the new holder's).
fn op_commands(
    ops: &[Op],
    may_be_live: &mut HashSet<IpAddr>,
    arms: &mut Arms,
    now: Instant,
    updates: bool,
) -> Batch {
    let mut c = Batch::new();
    for op in ops {
        match op.change {
            Change::Disarm => {
                let alone: Vec<IpAddr> = op
                    .vips
                    .iter()
                    .filter(|v| {
                        let Some(owners) = arms.get_mut(v) else {
                            return true;
                        };
                        owners.remove(&op.owner);
                        if owners.is_empty() {
                            arms.remove(v);
                            true
                        } else {
                            false
                        }
                    })
                    .copied()
                    .collect();
                c.append(expire_commands(&alone, true));
                alone.iter().for_each(|v| {
                    may_be_live.remove(v);
                });
                continue;
            }
            Change::Refresh(_) | Change::Expire => {}
        }
        match op.change {
            Change::Refresh(until) => {
                let timeout = timeout_until(until, now);
                let armed = |v: &IpAddr| arms.get(v).is_some_and(|o| !o.is_empty());
                let batch = refresh_commands(
                    &op.vips,
                    timeout,
                    |v| may_be_live.contains(v),
                    armed,
                    updates,
                );
                for v in &op.vips {
                    arms.entry(*v).or_default().insert(op.owner);
                }
                match batch {
                    Some(r) => {
                        c.append(r);
                        may_be_live.extend(op.vips.iter().copied());
                    }
                    None => {
                        c.append(expire_commands(&op.vips, false));
                        op.vips.iter().for_each(|v| {
                            may_be_live.remove(v);
                        });
                    }
                }
            }
            Change::Expire | Change::Disarm => {
                c.append(expire_commands(&op.vips, false));
                op.vips.iter().for_each(|v| {
                    may_be_live.remove(v);
                });
            }
        }
    }
    c
}

/// The batch removing the live elements of `vips` (and with `disarm`, the VIPs
/// themselves: no longer filtered). Each delete follows an add, so it never fails.
///
/// Without `disarm` the VIPs are armed as well (an add of an element that exists changes
/// nothing): an expired VIP is filtered, whatever the kernel's set held. A holder whose
/// fence run answered too late keeps its second-line addresses once the expire has run,
/// taking them as filtered; the set did not hold the VIP after tables flushed by someone
/// else and recreated by that very run (`NftFence::restore_tables`), nor after a first
/// refresh whose end had passed when its run was built (recorded as armed, sent as this
/// expire): the address answered, unfiltered, next to the node that took the lease.
pub(crate) fn expire_commands(vips: &[IpAddr], disarm: bool) -> Batch {
    let t = FENCE_TABLE;
    let one = Some(Duration::from_millis(1));
    let mut b = Grouped::default();
    for vip in once_each(vips) {
        for (i, (f, set, live, k)) in places(*vip).into_iter().enumerate() {
            let at = |step: u8| (i, live, step);
            let el =
                |set, delete, timeout| nl::element(f, t, set, k.clone(), delete, timeout, None);
            b.push(at(0), el(set, false, None));
            b.push(at(1), el(live, false, one));
            b.push(at(2), el(live, true, None));
            if disarm {
                b.push(at(3), el(set, true, None));
            }
        }
    }
    b.batch()
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

/// What [`NftFence`] knows of the kernel's sets, and the way to them.
#[derive(Debug)]
struct FenceState {
    transport: Arc<dyn Transport>,
    /// Per VIP, the latest instant its live element may still exist (the end of the run
    /// that set it + its timeout + [`LIVE_SLACK`]); removed when expired or disarmed.
    live: Mutex<HashMap<IpAddr, Instant>>,
    /// Who armed each VIP, as of the last successful run.
    arms: Mutex<Arms>,
    /// Whether an add with an expiration updates an existing element ([`probe_timeout_updates`]).
    updates_timeout: std::sync::atomic::AtomicBool,
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
                live: Mutex::new(HashMap::new()),
                arms: Mutex::new(HashMap::new()),
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
    /// right before the `sendmsg` that commits it ([`op_commands`]), and, when it
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
        let _one_run = self.run.lock().await;
        match self.apply_locked(ops).await {
            Err(e) => match self.restore_tables().await {
                true => self.apply_locked(ops).await,
                false => Err(e),
            },
            ok => ok,
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
                if let Ok(mut live) = self.state.live.lock() {
                    live.clear();
                }
                if let Ok(mut arms) = self.state.arms.lock() {
                    *arms = Arms::default();
                }
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
            let result = link.send(&t.1, Mode::Commit);
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
        let (written, c, arms) = written.unwrap_or_else(|| self.state.transaction(ops));
        if let Err(e) = result {
            let vips: Vec<IpAddr> = ops.iter().flat_map(|o| o.vips.clone()).collect();
            return Err(FenceError::Change {
                vips: list(&vips),
                command: c.text(),
                detail: e.to_string(),
            });
        }
        self.state.record(ops, written, done, arms);
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
                vips: vips.to_vec(),
                change,
                owner,
            }])
            .await?;
        Ok(outcome(change, written, done))
    }
}

impl FenceState {
    /// The transaction of `ops` built now ([`op_commands`]) from the recorded state: when,
    /// the batch, and who armed each of their VIPs once it has run. Reads the recorded state
    /// of the ops' VIPs only ([`op_commands`] touches no other): a shard holder's renewal
    /// copied the whole node's state (thousands of VIPs, a set of owners each) into every
    /// transaction and dropped it again, about a fifth of an idle vipd's CPU at 10 000
    /// Services (docs/services-bench.md).
    fn transaction(&self, ops: &[Op]) -> Transaction {
        let now = Instant::now();
        let touched = || ops.iter().flat_map(|o| o.vips.iter().copied());
        let mut may_be_live: HashSet<IpAddr> = {
            let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            touched()
                .filter(|v| live.get(v).is_some_and(|until| *until > now))
                .collect()
        };
        let mut arms: Arms = {
            let all = self.arms.lock().unwrap_or_else(PoisonError::into_inner);
            touched()
                .filter_map(|v| all.get(&v).map(|owners| (v, owners.clone())))
                .collect()
        };
        let updates = self
            .updates_timeout
            .load(std::sync::atomic::Ordering::Relaxed);
        let c = op_commands(ops, &mut may_be_live, &mut arms, now, updates);
        (now, c, arms)
    }

    /// Records the outcome of `ops`, committed in a transaction built at `written` and
    /// answered at `done`: the live elements' new ends, and who armed each of their VIPs
    /// (`arms`, [`Self::transaction`]'s: a VIP without an entry is armed by no holder).
    fn record(&self, ops: &[Op], written: Instant, done: Instant, arms: Arms) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        for op in ops {
            for v in &op.vips {
                match op.change {
                    Change::Refresh(until) if !timeout_until(until, written).is_zero() => {
                        live.insert(*v, ends_by(until, written, done) + LIVE_SLACK);
                    }
                    // Still armed by another holder: its element stands.
                    Change::Disarm if arms.contains_key(v) => {}
                    _ => {
                        live.remove(v);
                    }
                }
            }
        }
        drop(live);
        let mut all = self.arms.lock().unwrap_or_else(PoisonError::into_inner);
        for v in ops.iter().flat_map(|o| o.vips.iter()) {
            if !arms.contains_key(v) {
                all.remove(v);
            }
        }
        all.extend(arms);
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
        Change::Expire | Change::Disarm => done,
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
                    vips: vips.to_vec(),
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
mod tests {
    use super::*;
    use crate::net::nft::nl::Recorder;

    // The builders' commands in `nft` syntax, one a line (their bytes are checked against
    // what `nft` sends in `nl::tests`).
    fn refresh_commands(
        vips: &[IpAddr],
        timeout: Duration,
        may_be_live: impl Fn(&IpAddr) -> bool,
    ) -> Option<Vec<String>> {
        super::refresh_commands(vips, timeout, may_be_live, |_| false, false).map(|b| b.lines())
    }
    fn expire_commands(vips: &[IpAddr], disarm: bool) -> Vec<String> {
        super::expire_commands(vips, disarm).lines()
    }
    fn op_commands(
        ops: &[Op],
        may_be_live: &mut HashSet<IpAddr>,
        arms: &mut Arms,
        now: Instant,
    ) -> Vec<String> {
        super::op_commands(ops, may_be_live, arms, now, false).lines()
    }
    fn setup_commands() -> Vec<String> {
        super::setup_commands().lines()
    }
    fn remove_commands() -> Vec<String> {
        super::remove_commands().lines()
    }
    /// A fence on a [`Recorder`], after its setup.
    async fn recorded() -> (NftFence, Recorder) {
        let rec = Recorder::default();
        let f = NftFence::start_with(Arc::new(rec.clone())).await.unwrap();
        (f, rec)
    }

    fn v4() -> IpAddr {
        "192.0.2.10".parse().expect("ip")
    }
    fn v6() -> IpAddr {
        "2001:db8::10".parse().expect("ip")
    }

    /// A VIP given twice (in one holder's list) is fenced as once: grouped by step, its
    /// second delete would follow the first and the kernel would refuse the transaction.
    #[test]
    fn a_vip_given_twice_is_fenced_once() {
        let t = Duration::from_millis(1800);
        let twice = [v4(), v6(), v4(), v6()];
        let once = [v4(), v6()];
        for updates in [false, true] {
            let a = super::refresh_commands(&twice, t, |_| true, |_| false, updates).unwrap();
            let b = super::refresh_commands(&once, t, |_| true, |_| false, updates).unwrap();
            assert_eq!(a.lines(), b.lines(), "updates={updates}");
        }
        for disarm in [false, true] {
            assert_eq!(
                super::expire_commands(&twice, disarm).lines(),
                super::expire_commands(&once, disarm).lines()
            );
        }
    }

    /// A shard's renewal (hundreds of VIPs, both families) is a handful of messages, one per
    /// set and step, in both refresh ways and for an expire; each element's own commands keep
    /// their order (arm, add, delete, add again).
    #[test]
    fn a_refresh_of_many_vips_is_one_message_per_set() {
        let vips: Vec<IpAddr> = (0..300u32)
            .map(|i| {
                if i % 3 == 0 {
                    IpAddr::from([192, 0, 2, (i / 3) as u8])
                } else {
                    IpAddr::from(std::net::Ipv6Addr::from(
                        0x2001_0db8_u128 << 96 | u128::from(i),
                    ))
                }
            })
            .collect();
        let t = Duration::from_millis(1800);
        let updates = super::refresh_commands(&vips, t, |_| true, |_| true, true).unwrap();
        assert_eq!(updates.cmds().len(), 600, "one refresh per VIP and place");
        assert_eq!(
            updates.messages().len(),
            4,
            "arp live, live4, live6, live6ns"
        );
        let first = super::refresh_commands(&vips, t, |_| true, |_| false, false).unwrap();
        assert_eq!(first.cmds().len(), 600 * 4);
        assert_eq!(
            first.messages().len(),
            16,
            "4 sets x (arm, add, delete, add)"
        );
        let expire = super::expire_commands(&vips, true);
        assert_eq!(expire.messages().len(), 16);
        let one = "2001:db8::1 ";
        let own: Vec<String> = first
            .cmds()
            .iter()
            .map(|c| c.text().into_owned())
            .filter(|l| l.contains(one) && l.contains(" live6 "))
            .collect();
        assert_eq!(
            own,
            [
                "add element inet vipd_fence live6 { 2001:db8::1 timeout 1800ms }",
                "delete element inet vipd_fence live6 { 2001:db8::1 }",
                "add element inet vipd_fence live6 { 2001:db8::1 timeout 1800ms }",
            ]
        );
    }

    #[test]
    fn refresh_replaces_the_live_element_with_a_millisecond_timeout() {
        let c =
            refresh_commands(&[v4()], Duration::from_micros(1_995_900), |_| true).expect("grant");
        assert_eq!(
            c,
            vec![
                "add element arp vipd_fence vips { 192.0.2.10 }",
                "add element arp vipd_fence live { 192.0.2.10 timeout 1995ms }",
                "delete element arp vipd_fence live { 192.0.2.10 }",
                "add element arp vipd_fence live { 192.0.2.10 timeout 1995ms }",
                "add element inet vipd_fence vips4 { 192.0.2.10 }",
                "add element inet vipd_fence live4 { 192.0.2.10 timeout 1995ms }",
                "delete element inet vipd_fence live4 { 192.0.2.10 }",
                "add element inet vipd_fence live4 { 192.0.2.10 timeout 1995ms }",
            ]
        );
        let c6 = refresh_commands(&[v6()], Duration::from_millis(5), |_| true).expect("grant");
        assert!(c6.contains(
            &"add element inet vipd_fence live6ns { 0x20010db8000000000000000000000010 timeout 5ms }"
                .to_string()
        ));
        assert!(c6.iter().all(|l| l.contains(" inet vipd_fence ")));
        assert!(c6.contains(
            &"add element inet vipd_fence live6 { 2001:db8::10 timeout 5ms }".to_string()
        ));
    }

    #[test]
    fn no_live_element_is_ever_added_without_a_timeout() {
        for c in [
            refresh_commands(&[v4(), v6()], Duration::from_millis(1), |_| true).expect("grant"),
            refresh_commands(&[v4(), v6()], Duration::from_millis(1), |_| false).expect("grant"),
            expire_commands(&[v4(), v6()], false),
            expire_commands(&[v4(), v6()], true),
        ] {
            for l in c
                .iter()
                .filter(|l| l.starts_with("add element") && l.contains(" live"))
            {
                assert!(l.contains(" timeout "), "{l}");
            }
        }
    }

    #[test]
    fn under_a_millisecond_grants_nothing() {
        assert_eq!(
            refresh_commands(&[v4()], Duration::from_micros(999), |_| true),
            None
        );
        assert_eq!(refresh_commands(&[v4()], Duration::ZERO, |_| false), None);
    }

    #[test]
    fn expire_keeps_the_vip_filtered_disarm_does_not() {
        let e = expire_commands(&[v4()], false);
        // Armed (again), never taken out of the filtered sets.
        assert!(e.contains(&"add element arp vipd_fence vips { 192.0.2.10 }".to_string()));
        assert!(e.contains(&"add element inet vipd_fence vips4 { 192.0.2.10 }".to_string()));
        assert!(
            e.iter()
                .all(|l| !l.starts_with("delete element arp vipd_fence vips ")
                    && !l.starts_with("delete element inet vipd_fence vips4 "))
        );
        assert_eq!(
            e.last().map(String::as_str),
            Some("delete element inet vipd_fence live4 { 192.0.2.10 }")
        );
        let d = expire_commands(&[v4()], true);
        assert!(d.contains(&"delete element arp vipd_fence vips { 192.0.2.10 }".to_string()));
        assert!(d.contains(&"delete element inet vipd_fence vips4 { 192.0.2.10 }".to_string()));
    }

    /// Changes queued while a run is pending go into one `nft` transaction, each caller
    /// gets the run's outcome, and a failed run fails every change in it.
    #[tokio::test]
    async fn batched_fence_runs_queued_changes_as_one_transaction() {
        let (nft, rec) = recorded().await;
        let fence = BatchedFence::new(nft);
        let vips: Vec<IpAddr> = (1..=20)
            .map(|i| format!("192.0.2.{i}").parse().unwrap())
            .collect();
        let asked = Instant::now();
        // Far enough that a loaded machine still writes the run before the end (a run
        // written after it would carry no timeout).
        let until = asked + Duration::from_secs(15);
        let calls = vips
            .iter()
            .map(|v| fence.refresh(1, std::slice::from_ref(v), until));
        for r in futures::future::join_all(calls).await {
            let ends = r.expect("refreshed");
            // The timeout is rounded down to the millisecond when the batch is built.
            assert!(
                ends + Duration::from_millis(1) >= until
                    && ends <= Instant::now() + Duration::from_secs(15),
                "the run's end plus the timeout written"
            );
        }
        let runs: Vec<String> = rec.batches().iter().map(|b| b.lines().join("\n")).collect();
        assert_eq!(
            runs.len(),
            2,
            "setup, then one batch for the 20 changes: {runs:#?}"
        );
        for v in &vips {
            let ms = runs[1]
                .split(&format!("live {{ {v} timeout "))
                .nth(1)
                .and_then(|r| r.split("ms").next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{v} in the batch: {}", runs[1]));
            assert!(
                (1..=15_000).contains(&ms),
                "{v}: the time to the end when the run was written, {ms} ms"
            );
        }
        rec.set_fail(true);
        let calls = vips[..3]
            .iter()
            .map(|v| fence.expire(std::slice::from_ref(v)));
        for r in futures::future::join_all(calls).await {
            match r {
                Err(FenceError::Change { detail, .. }) => {
                    assert!(detail.contains("Invalid argument"), "{detail}")
                }
                other => panic!("expected the run's failure, got {other:?}"),
            }
        }
    }

    #[test]
    fn an_element_known_expired_is_only_added() {
        let c = refresh_commands(&[v4()], Duration::from_millis(600), |_| false).expect("grant");
        assert_eq!(
            c,
            vec![
                "add element arp vipd_fence vips { 192.0.2.10 }",
                "add element arp vipd_fence live { 192.0.2.10 timeout 600ms }",
                "add element inet vipd_fence vips4 { 192.0.2.10 }",
                "add element inet vipd_fence live4 { 192.0.2.10 timeout 600ms }",
            ]
        );
    }

    /// A VIP already armed is not added to its `vips` sets again; on a kernel that updates
    /// elements, a renewal of a live element is one add carrying its expiration per place
    /// (the 10k bench: four messages per place a VIP per renewal were most of vipd's CPU at
    /// rest); elsewhere it is deleted and added again.
    #[test]
    fn a_renewal_of_an_armed_vip_is_one_add_with_its_expiration_per_place_where_the_kernel_updates_elements()
     {
        let now = Instant::now();
        let refresh = |v: IpAddr| Op {
            vips: vec![v],
            change: Change::Refresh(now + Duration::from_millis(900)),
            owner: 1,
        };
        let (mut live, mut arms) = (HashSet::new(), Arms::new());
        let first = super::op_commands(&[refresh(v6())], &mut live, &mut arms, now, true).lines();
        assert_eq!(
            first.len(),
            4,
            "arm both places and set both elements: {first:?}"
        );
        let again = super::op_commands(&[refresh(v6())], &mut live, &mut arms, now, true).lines();
        assert_eq!(
            again,
            vec![
                "add element inet vipd_fence live6 { 2001:db8::10 timeout 900ms expires 900ms }",
                "add element inet vipd_fence live6ns { 0x20010db8000000000000000000000010 timeout 900ms expires 900ms }",
            ],
            "the same timeout again carries its expiration: without it the kernel keeps the old one"
        );
        // Without the update: no second arming, but the element is replaced.
        let (mut live, mut arms) = (HashSet::new(), Arms::new());
        super::op_commands(&[refresh(v4())], &mut live, &mut arms, now, false);
        let again = super::op_commands(&[refresh(v4())], &mut live, &mut arms, now, false).lines();
        assert!(
            !again
                .iter()
                .any(|l| l.contains(" vips ") || l.contains(" vips4 ")),
            "{again:?}"
        );
        assert_eq!(
            again.iter().filter(|l| l.starts_with("delete")).count(),
            2,
            "{again:?}"
        );
        // Disarmed by its last holder: armed again at the next refresh.
        super::op_commands(
            &[Op {
                vips: vec![v4()],
                change: Change::Disarm,
                owner: 1,
            }],
            &mut live,
            &mut arms,
            now,
            true,
        );
        let rearmed = super::op_commands(&[refresh(v4())], &mut live, &mut arms, now, true).lines();
        assert!(
            rearmed.contains(&"add element arp vipd_fence vips { 192.0.2.10 }".to_string()),
            "{rearmed:?}"
        );
    }

    /// Within one transaction, a VIP refreshed twice is replaced the second time, and one
    /// expired before its refresh is only added.
    #[test]
    fn ops_in_one_transaction_see_each_others_elements() {
        let now = Instant::now();
        let refresh = |v: IpAddr| Op {
            vips: vec![v],
            change: Change::Refresh(now + Duration::from_millis(400)),
            owner: 1,
        };
        let deletes = |c: &[String]| c.iter().filter(|l| l.starts_with("delete")).count();
        let mut live = HashSet::new();
        let c = op_commands(
            &[refresh(v4()), refresh(v4())],
            &mut live,
            &mut Arms::new(),
            now,
        );
        assert_eq!(deletes(&c), 2, "the second refresh replaces: {c:?}");
        assert!(live.contains(&v4()));
        let expire = Op {
            vips: vec![v4()],
            change: Change::Expire,
            owner: 1,
        };
        let c = op_commands(&[expire, refresh(v4())], &mut live, &mut Arms::new(), now);
        assert_eq!(
            c.last().map(String::as_str),
            Some("add element inet vipd_fence live4 { 192.0.2.10 timeout 400ms }")
        );
        assert_eq!(deletes(&c), 2, "only the expiry deletes: {c:?}");
    }

    /// An address that moved from one holder of this node to another: the old holder's
    /// disarm (at its next renewal, after the new holder armed the VIP) leaves it filtered
    /// and its live element in place; the last holder's disarm stops filtering it.
    #[test]
    fn a_vip_armed_by_another_holder_stays_filtered_when_one_disarms() {
        let now = Instant::now();
        let op = |owner: Owner, change: Change| Op {
            vips: vec![v4()],
            change,
            owner,
        };
        let refresh = Change::Refresh(now + Duration::from_millis(900));
        let (mut live, mut arms) = (HashSet::new(), Arms::new());
        op_commands(&[op(1, refresh), op(2, refresh)], &mut live, &mut arms, now);
        let c = op_commands(&[op(1, Change::Disarm)], &mut live, &mut arms, now);
        assert!(c.is_empty(), "still armed by holder 2: {c:?}");
        assert!(live.contains(&v4()), "holder 2's element stands");
        let c = op_commands(&[op(2, Change::Disarm)], &mut live, &mut arms, now);
        assert_eq!(c, expire_commands(&[v4()], true), "the last arming goes");
        assert!(arms.is_empty() && !live.contains(&v4()));
        // Disarming what nobody armed (a restart's leftovers) stops filtering it.
        let c = op_commands(&[op(3, Change::Disarm)], &mut live, &mut arms, now);
        assert_eq!(c, expire_commands(&[v4()], true));
        // An expiry by any holder ends the element (the VIP's lease may be gone).
        op_commands(&[op(1, refresh), op(2, refresh)], &mut live, &mut arms, now);
        let c = op_commands(&[op(1, Change::Expire)], &mut live, &mut arms, now);
        assert_eq!(c, expire_commands(&[v4()], false));
        assert_eq!(arms.get(&v4()).map(|o| o.len()), Some(2), "still armed");
    }

    /// Across separate runs (each transaction reads and records only its own VIPs' state):
    /// one holder's refresh of another VIP leaves the first VIP's armings alone, the first
    /// holder's disarm keeps it filtered for the second, the last disarm ends the filtering,
    /// and a refresh after that arms the VIP again.
    #[tokio::test]
    async fn armings_last_across_runs_and_only_the_last_disarm_ends_them() {
        let (f, rec) = recorded().await;
        let until = Instant::now() + Duration::from_secs(60);
        let last = |rec: &Recorder| rec.batches().last().map(|b| b.lines()).unwrap_or_default();
        let arm_v4 = "add element arp vipd_fence vips { 192.0.2.10 }".to_string();
        f.refresh(1, &[v4()], until).await.unwrap();
        assert!(last(&rec).contains(&arm_v4), "{:?}", last(&rec));
        f.refresh(2, &[v4()], until).await.unwrap();
        assert!(!last(&rec).contains(&arm_v4), "armed already");
        f.refresh(1, &[v6()], until).await.unwrap();
        let before = rec.batches().len();
        f.disarm(1, &[v4()]).await.unwrap();
        assert_eq!(
            rec.batches().len(),
            before,
            "still armed by holder 2: nothing sent"
        );
        f.disarm(2, &[v4()]).await.unwrap();
        assert_eq!(
            last(&rec),
            expire_commands(&[v4()], true),
            "the last arming goes"
        );
        f.refresh(1, &[v4()], until).await.unwrap();
        assert!(
            last(&rec).contains(&arm_v4),
            "armed again: {:?}",
            last(&rec)
        );
    }

    /// A refresh is written with the time left to its end when the transaction is written,
    /// not when it was asked for: a change that waited 300 ms in the queue (or in a frozen
    /// process) gets 300 ms less, and one whose end has passed expires its element. What it
    /// may live until is the run's end plus that timeout.
    #[test]
    fn the_timeout_is_the_time_left_when_the_run_is_written() {
        let asked = Instant::now();
        let until = asked + Duration::from_millis(1950);
        let refresh = Op {
            vips: vec![v4()],
            change: Change::Refresh(until),
            owner: 1,
        };
        let c = op_commands(
            std::slice::from_ref(&refresh),
            &mut HashSet::new(),
            &mut Arms::new(),
            asked + Duration::from_millis(300),
        );
        assert!(
            c.contains(
                &"add element inet vipd_fence live4 { 192.0.2.10 timeout 1650ms }".to_string()
            ),
            "{c:?}"
        );
        let c = op_commands(
            &[refresh],
            &mut HashSet::new(),
            &mut Arms::new(),
            asked + Duration::from_millis(1950),
        );
        assert_eq!(c, expire_commands(&[v4()], false), "expired");
        assert_eq!(
            timeout_until(until, asked + Duration::from_micros(1_949_500)),
            Duration::ZERO,
            "under a millisecond left: nothing"
        );
        let written = asked + Duration::from_millis(300);
        assert_eq!(
            ends_by(until, written, written + Duration::from_millis(20)),
            until + Duration::from_millis(20),
            "a run that took 20 ms may keep the element 20 ms past the end"
        );
    }

    /// The fence remembers the elements it set: the first refresh only adds, one while the
    /// element may be live replaces it, one after its timeout only adds again; a failed run
    /// changes nothing it remembers.
    #[tokio::test]
    async fn nft_fence_replaces_only_elements_that_may_be_live() {
        let (fence, rec) = recorded().await;
        let last_run = || {
            rec.batches()
                .last()
                .map(|b| b.lines().join("\n"))
                .unwrap_or_default()
        };
        // Long enough for a stand-in `nft` run on a loaded machine to find time left.
        let short = Duration::from_millis(200);
        fence
            .refresh(1, &[v4()], Instant::now() + short)
            .await
            .unwrap();
        assert!(!last_run().contains("delete"), "{}", last_run());
        fence
            .refresh(1, &[v4()], Instant::now() + short)
            .await
            .unwrap();
        let run = last_run();
        let replaced = run
            .split_once("delete element arp vipd_fence live { 192.0.2.10 }")
            .is_some_and(|(_, after)| {
                after.contains("add element arp vipd_fence live { 192.0.2.10 timeout")
            });
        assert!(replaced, "deleted and added again with a timeout: {run}");
        tokio::time::sleep(short + LIVE_SLACK + Duration::from_millis(50)).await;
        fence
            .refresh(1, &[v4()], Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!last_run().contains("delete"), "expired: {}", last_run());
        fence.expire(&[v4()]).await.unwrap();
        fence
            .refresh(1, &[v4()], Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            !last_run().contains("delete"),
            "expired by us: {}",
            last_run()
        );
        rec.set_fail(true);
        assert!(fence.expire(&[v4()]).await.is_err());
        rec.set_fail(false);
        fence
            .refresh(1, &[v4()], Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            last_run().contains("delete element arp vipd_fence live"),
            "the failed expiry deleted nothing: {}",
            last_run()
        );
    }

    #[test]
    fn setup_replaces_only_vipds_fence_tables() {
        let c = setup_commands();
        for l in c.iter().filter(|l| l.starts_with("delete")) {
            assert!(l.ends_with(&format!(" {FENCE_TABLE}")), "{l}");
        }
        // Every delete is preceded by an add of the same table, so it cannot fail.
        assert_eq!(&c[..4], &remove_commands()[..]);
        assert!(c.iter().any(|l| l.contains("flags timeout")));
    }

    /// The fence's runs, each reading and recording its own VIPs' state only, send what
    /// runs reading and recording the whole node's state (the earlier code, modelled here)
    /// sent, over a long pseudo-random sequence: VIPs shared by holders, moved between
    /// them, disarmed by holders that never armed them, given twice in one op, several ops
    /// in one transaction, failed runs (nothing recorded), refreshes whose end had passed.
    #[tokio::test]
    async fn runs_reading_their_own_vips_send_what_whole_state_runs_sent() {
        let (f, rec) = recorded().await;
        let norm = |lines: Vec<String>| -> Vec<String> {
            lines
                .into_iter()
                .map(|l| {
                    l.split_whitespace()
                        .filter(|t| !t.trim_end_matches(['}', ',']).ends_with("ms"))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .collect()
        };
        let vips: [IpAddr; 4] = [
            v4(),
            "192.0.2.11".parse().unwrap(),
            v6(),
            "2001:db8::11".parse().unwrap(),
        ];
        // The model: the whole node's state, cloned into each transaction and replaced.
        let mut m_live: HashMap<IpAddr, Instant> = HashMap::new();
        let mut m_arms: Arms = Arms::new();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for step in 0..600 {
            let now = Instant::now();
            let mut ops = Vec::new();
            for _ in 0..=next(3) {
                let k = 1 + next(3) as usize;
                let vs: Vec<IpAddr> = (0..k).map(|_| vips[next(4) as usize]).collect();
                let change = match next(5) {
                    0 | 1 => Change::Refresh(now + Duration::from_secs(60)),
                    2 => Change::Refresh(now - Duration::from_secs(1)),
                    3 => Change::Expire,
                    _ => Change::Disarm,
                };
                ops.push(Op {
                    vips: vs,
                    change,
                    owner: 1 + next(3),
                });
            }
            let fail = next(10) == 0;
            rec.set_fail(fail);
            let before = rec.batches().len();
            let got = f.apply(&ops).await;
            rec.set_fail(false);
            // A run with nothing to send succeeds even then.
            if got.is_err() {
                assert!(fail, "step {step}: {got:?}");
                continue;
            }
            let t = Instant::now();
            let mut may_be_live: HashSet<IpAddr> = m_live
                .iter()
                .filter(|(_, u)| **u > t)
                .map(|(v, _)| *v)
                .collect();
            let mut arms = m_arms.clone();
            let want = op_commands(&ops, &mut may_be_live, &mut arms, t);
            for op in &ops {
                for v in &op.vips {
                    match op.change {
                        Change::Refresh(until) if !timeout_until(until, t).is_zero() => {
                            m_live.insert(*v, until + LIVE_SLACK);
                        }
                        Change::Disarm if arms.contains_key(v) => {}
                        _ => {
                            m_live.remove(v);
                        }
                    }
                }
            }
            m_arms = arms;
            let sent = rec.batches();
            let got_lines = sent.get(before).map(|b| b.lines()).unwrap_or_default();
            assert_eq!(
                norm(got_lines),
                norm(want),
                "step {step}: {ops:?}, model arms {m_arms:?}"
            );
            let real = f.state.arms.lock().unwrap().clone();
            assert_eq!(real, m_arms, "step {step}: {ops:?}");
        }
    }
}
