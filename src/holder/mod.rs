//! The VIP holder: follows one election's [`LeaderState`] and makes the kernel hold
//! exactly the VIPs that state calls for, with the kernel fence, gratuitous ARP /
//! unsolicited neighbour advertisements, and the periodic check that repairs what others
//! changed (scenarios S01, S08, S09, S26 in `docs/scenarios.md`).
//!
//! The decision ([`address_steps`]) is a pure function of what the kernel shows and what we lead; the
//! [`VipHolder`] loop applies it through the [`Kernel`] and [`Announcer`] traits.

pub mod acd;
mod announce;
mod answers;
mod check;
mod claims;
pub mod metrics;
mod refresh;
pub mod takeovers;
mod task;
mod vipset;

use crate::lease::{FencePlan, Timing, TimingError, fence_plan};
use crate::net::route_kernel::ROUTE_WITHDRAW_SLACK;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::election::{Gates, LeaderState, Leadership};
use crate::net::conflict::{Claim, ConflictMonitor, WatchId, fmt_mac};
use crate::net::nd_responder::AnswerGate;
use crate::net::{AddrInfo, Announcer, Kernel, Lifetime, LinkInfo, NetError, Vip};
use crate::obs::logging::RepeatLimiter;
use acd::{Action, ProbeState};

/// Gate name closed while the VIP interface has had no carrier for longer than the renew
/// deadline, or cannot be found.
pub(crate) const GATE_LINK: &str = "link";
/// Gate name closed while a configured VIP is on the node but was not added by vipd.
pub const GATE_CONFLICT: &str = "vip-conflict";
pub use crate::election::GATE_STARTING;

/// One VIP this holder manages: the address and the interface to put it on (`None` =
/// choose automatically, scenario S27).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipSpec {
    /// Address and prefix.
    pub vip: Vip,
    /// Interface name from the configuration, if any.
    pub interface: Option<String>,
    /// The address must be gone by this instant whatever the lease says (a DHCP lease's
    /// expiry, RFC 2131 §4.4.5): every add or refresh gets a valid lifetime that ends by
    /// then, and from less than a second before it the VIP is not added and is removed.
    /// `None` = only the kernel fence limits it.
    pub not_after: Option<Instant>,
}

/// The valid lifetime, in whole seconds, a VIP may get at `now` when it must be gone by
/// `not_after` ([`VipSpec::not_after`]): `lifetime` cut to the whole seconds left (0 once
/// less than one is left). Pure.
pub fn cap_lifetime(lifetime: u32, not_after: Option<Instant>, now: Instant) -> u32 {
    match not_after {
        Some(at) => {
            let left = at.saturating_duration_since(now).as_secs();
            lifetime.min(u32::try_from(left).unwrap_or(u32::MAX))
        }
        None => lifetime,
    }
}

/// Repeat announcements a node sends at most per second, over all its holders, once a
/// VIP's first repeat is out ([`repeat_interval`]): 10. Up to `arp_rate` × 10 VIPs on a
/// node (30 at kube-vip's 3 s) every VIP is announced every `arp_rate`, as kube-vip does;
/// above, the repeats spread out (1 000 VIPs: every 100 s; 3 300: every 330 s). Each repeat
/// is a frame every host on the segment processes, and an unsolicited NA (to all nodes)
/// costs each receiving vipd node a walk of its multicast groups, one per IPv6 VIP it
/// holds (`ipv6_chk_mcast_addr`, a list: about 0.8 ms a frame for the two other nodes of
/// the 10 000-Service bench, 3 100-3 800 groups each): at 1 000 IPv6 VIPs a node every 3 s
/// the repeats were 20-40 % of an idle vipd's CPU in the 3 000-Service bench, at 100 a
/// second a node a quarter of it in the 10 000-Service one, and at 25 a second still half
/// of the busiest node's (docs/services-bench.md). MetalLB's layer 2 mode announces for 5 s
/// after it takes an address and never again (its `internal/layer2/announcer.go`).
pub const REPEATS_PER_SEC: u32 = 10;

/// The interval between two repeat announcements of one VIP when its node holds `held`
/// VIPs: `arp_rate` (`vip_arpRate`), or longer so that the node's repeats stay at
/// [`REPEATS_PER_SEC`] (`held` / 10 seconds). Announcements at a bind, and the first repeat
/// after it, keep `arp_rate`: the repeat is what fixes a client that missed the bind's.
/// Pure.
pub fn repeat_interval(arp_rate: Duration, held: usize) -> Duration {
    let spread = Duration::from_secs_f64(held as f64 / f64::from(REPEATS_PER_SEC));
    arp_rate.max(spread)
}

/// How many VIPs this node holds, shared by its holders to pace their repeat announcements
/// ([`repeat_interval`]) and to size the second line of their addresses
/// ([`crate::lease::second_line_len`]). The manager sets it from its periodic address dump
/// (vipd's addresses on the node, every 2 s); until then it is 0: every repeat comes at
/// `arp_rate` and the second line is its shortest.
#[derive(Debug, Default)]
pub struct AnnouncePace {
    held: std::sync::atomic::AtomicUsize,
}

impl AnnouncePace {
    /// Records that the node holds `n` VIPs.
    pub fn set_held(&self, n: usize) {
        self.held.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// [`repeat_interval`] for the count last recorded.
    pub fn interval(&self, arp_rate: Duration) -> Duration {
        repeat_interval(arp_rate, self.held())
    }

    /// The count last recorded (0 until the first): VIP addresses of vipd on the node.
    pub fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Settings of a [`VipHolder`].
#[derive(Debug, Clone)]
pub struct HolderConfig {
    /// Gratuitous ARP / unsolicited NA repeat interval while held (`vip_arpRate`, ms); longer
    /// where the node holds more than `arp_rate` × [`REPEATS_PER_SEC`] VIPs ([`announce_pace`](Self::announce_pace)).
    pub arp_rate: Duration,
    /// The node's VIP count its holders pace their repeat announcements by ([`AnnouncePace`]);
    /// one per process. Default: a pace of its own that stays at 0 (every repeat at `arp_rate`).
    pub announce_pace: Arc<AnnouncePace>,
    /// Interval of the periodic check (address present, DAD state, carrier).
    pub check_interval: Duration,
    /// How the VIPs are fenced ([`fence_plan`]): the address lifetime in seconds, whether
    /// it is the fence, the nftables element's duration and the margin.
    pub fence: FencePlan,
    /// The lease duration: a VIP's lifetime never reaches past the last renewal's send
    /// time plus this, less [`FENCE_MARGIN`] (see [`fence_grant`]).
    pub lease_duration: Duration,
    /// A link without carrier for longer than this closes the [`GATE_LINK`] gate (renew
    /// deadline).
    pub carrier_grace: Duration,
    /// Add IPv6 VIPs with `IFA_F_NODAD`.
    pub skip_dad: bool,
    /// Conflict probe window (RFC 5227 probing compressed to tens of ms, see
    /// [`probe`]): before binding a VIP of a term that did not start from a cleanly released
    /// lease, probe for this long and bind only if no other MAC claims the address. Zero
    /// disables probing and the conflict watch (`vip_arpprobe=0`).
    pub probe_window: Duration,
    /// Sends the probes and watches for claims (see [`probe`]); `None`: VIPs are bound as
    /// soon as the lease is held, and nothing watches for other hosts claiming them.
    pub conflict_monitor: Option<Arc<dyn ConflictMonitor>>,
    /// Run the periodic check (carrier) also while not leading. The control-plane holder
    /// does; per-Service holders check only while leading or while one of their gates is
    /// closed (to notice it can open again), which keeps hundreds of them cheap.
    pub check_following: bool,
    /// The ARP flux guard (S36) the holder pins its IPv4 VIPs to their interface with, from
    /// the moment the interface is resolved (before the address is ever added) until the
    /// VIP leaves the set or the holder ends. Default: [`crate::net::NoopArpGuard`] (no
    /// pins). IPv6 needs none (see [`crate::net::nft`]).
    pub arp_guard: Arc<dyn crate::net::ArpGuard>,
    /// The nftables fence (`vip_nftfence`) the holder refreshes its VIPs in on every
    /// renewal ([`fence_timeout`]) and disarms them from once their addresses are gone.
    /// Default: [`crate::net::nft::fence::NoopFence`] (the address lifetime alone fences).
    pub nft_fence: Arc<dyn crate::net::nft::fence::VipFence>,
    /// IPv6 VIPs on `lo` (`svc_ipv6_loopback`, docs/design.md "IPv6 VIPs on lo"): with
    /// `Some`, an IPv6 VIP without a not-after time (not a DHCP lease's address) is placed on
    /// `lo` instead of its interface (the Services wing's kernel makes that a local route:
    /// [`crate::net::lo_routes::LoopbackRoutes`]), and this answers the neighbour solicitations for it
    /// that arrive on its interface while the holder's [`AnswerGate`] is open (the nftables
    /// element's end, or the address fence's where the elements cannot be set). Set only
    /// where the nftables fence runs. Default `None`: every VIP on its interface, answered
    /// by the kernel.
    pub nd_answers: Option<Arc<dyn crate::net::nd_responder::SolicitationAnswers>>,
    /// The node's takeovers in progress ([`takeovers::Takeovers`]), one per process for
    /// the Service VIP holders: this holder marks its VIPs there from the start of a term
    /// with VIPs until the first batch of them is in place, none is still in its probe
    /// window, or the term ends. Default: a count of its own that nobody reads.
    pub takeovers: Arc<takeovers::Takeovers>,
}

impl HolderConfig {
    /// Settings derived from lease timings and the ARP rate: check every
    /// `min(arp_rate, 500 ms)`, carrier grace = renew deadline, IPv6 DAD skipped (see
    /// `Config::ipv6_dad`; set `skip_dad` from it); the fence from [`fence_plan`] with
    /// `nft` = `vip_nftfence`.
    ///
    /// # Errors
    /// See [`fence_plan`].
    pub(crate) fn from_timing(
        t: &Timing,
        arp_rate: Duration,
        nft: bool,
    ) -> Result<Self, TimingError> {
        let fence = fence_plan(t, nft)?;
        Ok(HolderConfig {
            arp_rate,
            announce_pace: Arc::new(AnnouncePace::default()),
            check_interval: arp_rate.min(Duration::from_millis(500)),
            fence,
            lease_duration: t.lease_duration,
            carrier_grace: t.renew_deadline,
            skip_dad: true,
            probe_window: DEFAULT_PROBE_WINDOW,
            conflict_monitor: None,
            check_following: true,
            arp_guard: Arc::new(crate::net::NoopArpGuard::default()),
            nft_fence: Arc::new(crate::net::nft::fence::NoopFence),
            takeovers: Arc::default(),
            nd_answers: None,
        })
    }

    /// The settings of a holder of routes (routing-table mode, docs/design.md "The route
    /// fence"): the whole-second fence of `t` is each route's lifetime; no conflict probe
    /// (RFC 5227 has nothing to say about a route), no ARP flux pins and no nftables fence.
    ///
    /// # Errors
    /// [`TimingError`] when `t` has no whole-second fence (sub-second timings: a route's
    /// lifetime is counted in seconds).
    pub(crate) fn routed(t: &Timing, arp_rate: Duration) -> Result<Self, TimingError> {
        Ok(HolderConfig {
            probe_window: Duration::ZERO,
            conflict_monitor: None,
            ..Self::from_timing(t, arp_rate, false)?
        })
    }
}

/// Service lease timings for elected routing-table mode when none are given: kube-vip's
/// 5/3/1 (lease duration, renew deadline, retry period). Its route fence (2 s) plus
/// [`ROUTE_WITHDRAW_SLACK`] ends before another node can take the lease (5 s); vipd's bare
/// 3/2/1 cannot ([`route_gone_before_takeover`]).
pub const ROUTED_SERVICE_TIMING: Timing = Timing {
    lease_duration: Duration::from_secs(5),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_secs(1),
};

/// Whether a route fenced under timings `t` leaves the router before another node can take
/// the lease: its fence lifetime ([`crate::lease::fence_lifetime`]) plus
/// [`ROUTE_WITHDRAW_SLACK`] is shorter than the lease duration (a candidate waits a whole
/// lease duration after the last renewal it saw). Only elected routes need it: without
/// election every node routes at once anyway. Pure. Measured: at 3/2/1 the router had the
/// old and the new holder's paths at once for up to 0.8 s after a kill or a freeze
/// (docs/failover.md, "Routed mode").
pub fn route_gone_before_takeover(t: &Timing) -> bool {
    crate::lease::fence_lifetime(t)
        .is_ok_and(|f| Duration::from_secs(u64::from(f)) + ROUTE_WITHDRAW_SLACK < t.lease_duration)
}

/// Addresses a holder refuses because another host claims them, each with that host's MAC
/// (see [`VipHolder::with_conflict_reports`]).
pub(crate) type Conflicts = Vec<(IpAddr, [u8; 6])>;

/// Default conflict probe window (`vip_arpprobe`): 50 ms.
pub(crate) const DEFAULT_PROBE_WINDOW: Duration = Duration::from_millis(50);

/// A kernel change the VIP holder decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Add (or re-add) the VIP with this valid lifetime in seconds.
    Add {
        /// The VIP.
        vip: Vip,
        /// Interface index.
        ifindex: u32,
        /// Valid lifetime, seconds.
        valid_lft_secs: u32,
    },
    /// Refresh the lifetime of the VIP, which is in place but which the kernel removes
    /// within [`REFRESH_BELOW_SECS`] (no renewal refreshed it: the API server is slow or
    /// unreachable while the lease still holds), with this valid lifetime in seconds.
    Refresh {
        /// The VIP.
        vip: Vip,
        /// Interface index.
        ifindex: u32,
        /// Valid lifetime, seconds.
        valid_lft_secs: u32,
    },
    /// Remove the VIP (ours only).
    Remove {
        /// The VIP.
        vip: Vip,
        /// Interface index.
        ifindex: u32,
    },
}

/// VIPs added or refreshed per kernel batch by one holder before it reads its lease again
/// ([`VipHolder::catch_up`]): next to thousands of IPv6 addresses each add costs the kernel
/// milliseconds (more while other holders add theirs), and a shard's 600 VIPs in one batch
/// took 8-20 s in the 10 000-Service bench, during which the holder, inside the batch, saw
/// none of its lease's renewals: its nftables elements ran out after the fence lifetime
/// (the VIPs already added stayed unanswered until the batch ended) and the batch's
/// announcements were skipped as if the lease had lapsed. Between chunks the holder takes
/// the latest renewal, sets its elements again when they are due and announces the chunk.
pub const ADD_CHUNK: usize = 64;

/// Where a takeover's time went, from the term's start (the lease acquired, or renewed by a
/// new term) to its first VIPs in place and announced: logged once per term at info level,
/// so a slow failover can be read from the new holder's log (issue 28: a shard's 600 IPv6
/// VIPs took 5-12 s after the lease was taken in the 10 000-Service power-off bench).
/// Durations in milliseconds when displayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takeover {
    /// VIPs put in place by this batch.
    pub vips: usize,
    /// From the term's start to the end of the announcements.
    pub since_leading: Duration,
    /// The conflict probe window the VIPs waited for (zero when they were bound at once:
    /// a clean hand-over, or probing off).
    pub probe_window: Duration,
    /// Setting the batch's nftables fence elements, when this batch set them (a renewal's
    /// refresh; a bind after the probe window uses the elements set before).
    pub fence: Option<Duration>,
    /// Adding the addresses ([`Kernel::add_or_refresh_many`]).
    pub adds: Duration,
    /// Gratuitous ARPs / unsolicited neighbour advertisements sent (IPv6 VIPs under duplicate
    /// address detection are announced after it, by the periodic check).
    pub announced: usize,
    /// Sending them.
    pub announce: Duration,
}

impl std::fmt::Display for Takeover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_millis();
        write!(
            f,
            "{} VIPs in place {} ms after leading: probe window {} ms, ",
            self.vips,
            ms(self.since_leading),
            ms(self.probe_window)
        )?;
        match self.fence {
            Some(d) => write!(f, "nftables fence {} ms, ", ms(d))?,
            None => write!(f, "nftables fence set before, ")?,
        }
        write!(
            f,
            "adds {} ms, {} announced in {} ms",
            ms(self.adds),
            self.announced,
            ms(self.announce)
        )
    }
}

/// A VIP in place whose remaining valid lifetime, as the kernel reports it (whole seconds,
/// rounded up), is at most this many seconds gets it refreshed by the periodic check while
/// the lease still covers one ([`Step::Refresh`]). The address lifetime ([`fence_lifetime`],
/// 2 s at 5/3/1 and 3/2/1) is shorter than the time a holder leads without a successful
/// renewal (the renew deadline, 3 s at 5/3/1, or a ride-through grant), so without this the
/// kernel removed the VIP of a leading holder 2 s after its last renewal during an API
/// freeze and the check re-added it up to a check interval later: a gap a client sees. One
/// second is enough: the check runs at least every 500 ms and, for an address with
/// [`crate::net::cache::LIFETIME_MARGIN`] (3 s) or less left, reads a dump at most 200 ms old
/// (a Service VIP holder's shared dump, [`crate::net::cache`], is otherwise kept until an
/// address changes, its lifetimes aged; the listing with the IPv6 VIPs on `lo` as routes,
/// [`crate::net::lo_routes`], likewise 200 ms near a route's end and a second otherwise),
/// so a refresh comes while at least 300 ms are left.
///
/// [`fence_lifetime`]: crate::lease::fence_lifetime
pub const REFRESH_BELOW_SECS: u32 = 1;

/// Between renewals the periodic check refreshes the nftables fence elements when they end
/// within its interval plus this slack, as it refreshes the addresses ([`Step::Refresh`]):
/// the element, set for the fence lifetime on each renewal, would otherwise drop the VIP's
/// answers while its holder still leads without a renewal (until its renew deadline, or a
/// ride-through), where the address stays (found by the lab: 192.0.2.40 unanswered
/// 1.25-1.41 s into a 1.4 s API freeze at 5/3/1). With renewals on time (every retry
/// period, shorter than the fence lifetime less the check interval and this slack) the check
/// never refreshes one, so a frozen holder still goes silent at its last renewal plus the
/// fence lifetime. 250 ms: a check runs up to its interval late.
pub const NFT_REFRESH_SLACK: Duration = Duration::from_millis(250);

/// Decides the kernel changes for one check.
///
/// * `desired`: the VIPs of this holder with their resolved interface index.
/// * `present`: every address on the node (from the kernel).
/// * `fence_left`: `Some(seconds of fence lifetime left since the last renew)` while
///   leading, `None` when not leading.
///
/// While leading: a missing VIP is added with the fence time left (not re-added at all once
/// that is under one second: the next renew re-adds it); a VIP the kernel removes within
/// [`REFRESH_BELOW_SECS`] is refreshed with it (same condition); a VIP in `dadfailed` is
/// removed and added again (S26); our copy of a VIP on another interface is removed. Not leading: every
/// copy of our VIPs that is ours is removed. Addresses not tagged as ours are never touched.
pub fn address_steps(
    desired: &[(Vip, u32)],
    present: &[AddrInfo],
    fence_left: Option<u32>,
) -> Vec<Step> {
    let mut steps = Vec::new();
    // vipd's copies of the desired addresses, read once: a shard's holder checks hundreds
    // of VIPs against thousands of addresses twice a second.
    let ours = OursIndex::new(present, desired.iter().map(|(vip, _)| vip.addr));
    for (vip, ifindex) in desired {
        let copies = ours.copies(vip.addr);
        match fence_left {
            Some(left) => {
                for c in copies {
                    if c.ifindex != *ifindex || c.vip.prefix != vip.prefix {
                        steps.push(Step::Remove {
                            vip: c.vip,
                            ifindex: c.ifindex,
                        });
                    }
                }
                let here = copies
                    .iter()
                    .find(|c| c.ifindex == *ifindex && c.vip.prefix == vip.prefix);
                let add = Step::Add {
                    vip: *vip,
                    ifindex: *ifindex,
                    valid_lft_secs: left,
                };
                match here {
                    None if left >= 1 => steps.push(add),
                    None => {}
                    Some(c) if c.dad_failed => {
                        steps.push(Step::Remove {
                            vip: *vip,
                            ifindex: *ifindex,
                        });
                        if left >= 1 {
                            steps.push(add);
                        }
                    }
                    Some(c) if left >= 1 && lifetime_runs_out(c) => steps.push(Step::Refresh {
                        vip: *vip,
                        ifindex: *ifindex,
                        valid_lft_secs: left,
                    }),
                    Some(_) => {}
                }
            }
            None => {
                for c in copies {
                    steps.push(Step::Remove {
                        vip: c.vip,
                        ifindex: c.ifindex,
                    });
                }
            }
        }
    }
    steps
}

/// vipd's addresses in `present` whose address is one of `wanted`, for looking many VIPs up
/// in one dump: a shard's holder has hundreds, the node thousands of addresses, and its
/// checks run twice a second, so only the wanted addresses are indexed, with no allocation
/// for an address with one copy (nearly all), hashed with foldhash, not SipHash (the keys
/// are the node's own addresses: nothing for an attacker to collide). A check of 600 VIPs
/// against 3 770 addresses ([`address_steps`]) takes about 0.05 ms with it; its index alone
/// took 0.15 ms with SipHash and a `Vec` per VIP (release build, a scratch timing). Pure.
pub(crate) struct OursIndex<'a> {
    by_addr: foldhash::HashMap<IpAddr, Copies<'a>>,
}

/// vipd's copies of one address in a dump ([`OursIndex`]).
enum Copies<'a> {
    /// Not present, or not vipd's.
    None,
    /// One copy (the usual case).
    One(&'a AddrInfo),
    /// Copies on several interfaces, in the dump's order.
    Many(Vec<&'a AddrInfo>),
}

impl<'a> OursIndex<'a> {
    /// The index of vipd's addresses in `present` among `wanted`.
    pub(crate) fn new(present: &'a [AddrInfo], wanted: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut by_addr: foldhash::HashMap<IpAddr, Copies<'a>> = wanted
            .into_iter()
            .map(|addr| (addr, Copies::None))
            .collect();
        for a in present.iter().filter(|a| a.ours) {
            if let Some(copies) = by_addr.get_mut(&a.vip.addr) {
                *copies = match std::mem::replace(copies, Copies::None) {
                    Copies::None => Copies::One(a),
                    Copies::One(first) => Copies::Many(vec![first, a]),
                    Copies::Many(mut all) => {
                        all.push(a);
                        Copies::Many(all)
                    }
                };
            }
        }
        OursIndex { by_addr }
    }

    /// vipd's copies of `addr`, on any interface, in the dump's order (none when `addr` was
    /// not wanted).
    pub(crate) fn copies(&self, addr: IpAddr) -> &[&'a AddrInfo] {
        match self.by_addr.get(&addr) {
            None | Some(Copies::None) => &[],
            Some(Copies::One(a)) => std::slice::from_ref(a),
            Some(Copies::Many(all)) => all,
        }
    }

    /// vipd's copy of `addr` on interface `ifindex` (the dump's last, should the kernel list
    /// two).
    pub(crate) fn at(&self, ifindex: u32, addr: IpAddr) -> Option<&'a AddrInfo> {
        self.copies(addr)
            .iter()
            .rev()
            .find(|a| a.ifindex == ifindex)
            .copied()
    }
}

/// Whether the kernel removes `a` within [`REFRESH_BELOW_SECS`] (a finite valid lifetime
/// that short). Pure.
fn lifetime_runs_out(a: &AddrInfo) -> bool {
    a.valid_lft_secs.is_some_and(|s| s <= REFRESH_BELOW_SECS)
}

/// VIPs among `vips` that the node already carries without vipd's tag: vipd refuses to
/// manage those (it would otherwise remove a node's own address on step-down).
pub fn conflicts(vips: &[Vip], present: &[AddrInfo]) -> Vec<(IpAddr, u32)> {
    present
        .iter()
        .filter(|a| !a.ours && vips.iter().any(|v| v.addr == a.vip.addr))
        .map(|a| (a.vip.addr, a.ifindex))
        .collect()
}

/// Removes every vipd-tagged address on the node but those on interface `keep_on` (none
/// kept when `None`). Run once at start, before any election: at that point this process
/// leads nothing, so every tagged address is stale (a previous run crashed, or the config
/// changed); and at exit. Untagged addresses are never touched. Returns the removed VIPs.
///
/// # Errors
/// [`NetError`] when the kernel cannot be read; single failed removals are logged.
pub(crate) async fn remove_stale<K: Kernel>(
    kernel: &K,
    keep_on: Option<u32>,
) -> Result<Vec<Vip>, NetError> {
    let mut removed = Vec::new();
    for a in kernel.all_addresses().await?.iter() {
        if !a.ours || keep_on == Some(a.ifindex) {
            continue;
        }
        match kernel.remove(a.ifindex, a.vip).await {
            Ok(()) => {
                info!(vip = %a.vip, ifindex = a.ifindex, "removed stale VIP left by an earlier run");
                removed.push(a.vip);
            }
            Err(e) => warn!(vip = %a.vip, error = %e, "could not remove stale VIP"),
        }
    }
    Ok(removed)
}

/// Tries to remove and confirm the removal of the VIPs before giving up for this round.
const DROP_ATTEMPTS: u32 = 3;
/// How many times a refresh of the nftables fence is tried when its answer shows the
/// element may outlive the lease (`VipHolder::refresh_nft_fence`) before it is expired
/// instead.
const FENCE_RECHECKS: u32 = 3;
/// Pause before a removal try that follows a failed netlink call (none after a success).
const DROP_RETRY: Duration = Duration::from_millis(30);

/// The interface resolved for each VIP, by VIP index: slot `i` is VIP `i`'s (a holder of a
/// shard lease holds hundreds of VIPs and looks each up on every renewal). VIPs on one
/// interface share one entry (`Arc`): a shard's hundreds of VIPs on `eth0` are one
/// `LinkInfo`, not hundreds of copies of its name to clone at every check, refresh and
/// announcement. Empty slots at the end are not kept, so a follower's holder carries no
/// allocation.
#[derive(Debug, Default)]
struct Links {
    slots: Vec<Option<Arc<LinkInfo>>>,
    /// The entry inserted last, shared by the next insert of an equal link.
    recent: Option<Arc<LinkInfo>>,
}

impl Links {
    fn get(&self, i: &usize) -> Option<&LinkInfo> {
        self.shared(i).map(|l| &**l)
    }

    /// VIP `i`'s entry, to keep (a clone is a reference count).
    fn shared(&self, i: &usize) -> Option<&Arc<LinkInfo>> {
        self.slots.get(*i).and_then(Option::as_ref)
    }

    fn insert(&mut self, i: usize, link: LinkInfo) {
        let shared = match &self.recent {
            Some(r) if **r == link => r.clone(),
            _ => {
                let r = Arc::new(link);
                self.recent = Some(r.clone());
                r
            }
        };
        self.insert_shared(i, shared);
    }

    /// Sets VIP `i`'s entry to `link` as it is (shared with whoever holds it).
    fn insert_shared(&mut self, i: usize, link: Arc<LinkInfo>) {
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        self.slots[i] = Some(link);
    }

    fn remove(&mut self, i: &usize) {
        if let Some(slot) = self.slots.get_mut(*i) {
            *slot = None;
        }
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        if self.slots.is_empty() {
            self.recent = None;
        }
    }

    /// How many VIPs have an interface.
    fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// The distinct interface indexes, ascending.
    fn interfaces(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self.slots.iter().flatten().map(|l| l.index).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Replaces what is known of interface `link.index` for every VIP on it; entries equal
    /// to `link` are kept (no copy at a check that finds the interface unchanged).
    fn update_interface(&mut self, link: &LinkInfo) {
        let mut fresh: Option<Arc<LinkInfo>> = None;
        let mut same: Option<Arc<LinkInfo>> = None;
        for held in self
            .slots
            .iter_mut()
            .flatten()
            .filter(|h| h.index == link.index)
        {
            if same.as_ref().is_some_and(|s| Arc::ptr_eq(s, held)) {
                continue;
            }
            if **held == *link {
                same = Some(held.clone());
                continue;
            }
            let f = fresh.get_or_insert_with(|| Arc::new(link.clone()));
            *held = f.clone();
        }
        if let Some(f) = fresh {
            self.recent = Some(f);
        }
    }
}

/// Holds the VIPs of one election while it leads (see module docs).
pub struct VipHolder<K: Kernel, A: Announcer> {
    kernel: Arc<K>,
    announcer: Arc<A>,
    vips: Vec<VipSpec>,
    cfg: HolderConfig,
    gates: Gates,
    name: String,
    links: Links,
    no_carrier_since: BTreeMap<u32, Instant>,
    /// When this term's VIPs were first announced, or last all repeated: the next repeat
    /// of all of them is the node's paced interval later ([`AnnouncePace`]). `None` while
    /// not leading or before the term's first announcement.
    last_repeat: Option<Instant>,
    /// VIPs announced for the first time (bound, repaired, out of DAD) whose first repeat,
    /// `arp_rate` later, is still due, in due order: only they are repeated then, not the
    /// holder's other VIPs ([`VipHolder::next_garp`]).
    first_repeats: std::collections::VecDeque<(Instant, Vip)>,
    /// IPv6 VIPs added but not yet announced because they were tentative.
    pending_na: Vec<usize>,
    updates: Option<watch::Receiver<Vec<VipSpec>>>,
    metrics: Option<Arc<metrics::VipMetrics>>,
    /// Conflict detection (RFC 5227); `None` = off.
    monitor: Option<Arc<dyn ConflictMonitor>>,
    /// Conflict state per VIP, by VIP index.
    probes: Vec<ProbeState>,
    /// Claim watches held while leading: (VIP index, watch id).
    watches: Vec<(usize, WatchId)>,
    /// Claims from the watches of the current term: created when a term starts watching and
    /// dropped when it ends, so the hundreds of Service holders that follow carry no channel.
    claims: Option<(mpsc::UnboundedSender<Claim>, mpsc::UnboundedReceiver<Claim>)>,
    /// Addresses refused because another host claims them, with its MAC.
    conflicts: Option<watch::Sender<Conflicts>>,
    /// Addresses this holder holds now (see [`VipHolder::with_bound_reports`]).
    bound: Option<watch::Sender<Vec<IpAddr>>>,
    /// When the current term's lease was last renewed, `None` while not leading.
    renewed_at: Option<Instant>,
    /// The current term (with [`Self::renewed_at`]: leading in it).
    term: u64,
    /// The latest leadership state, read between the chunks of a long batch of adds
    /// ([`VipHolder::catch_up`]); the run loop's own receiver drives everything else.
    leader_view: Option<watch::Receiver<LeaderState>>,
    /// When the current term started ([`VipHolder::start_term`]), until its first VIPs are in
    /// place and the takeover's timings are logged ([`Takeover`]); `None` for a term that
    /// started with no VIPs.
    term_started: Option<Instant>,
    /// This term's takeover in progress, with [`Self::term_started`] ([`HolderConfig::takeovers`]).
    takeover_mark: Option<takeovers::TakeoverMark>,
    /// IPv4 VIPs pinned to their interface against ARP flux (S36).
    arp: crate::net::ArpPins,
    /// VIPs armed in the nftables fence (`HolderConfig::nft_fence`). A set: each renewal
    /// compares it with the holder's VIPs, hundreds for a shard.
    nft_fenced: std::collections::HashSet<IpAddr>,
    /// When the elements last set for them end (`None` before the first is set).
    nft_until: Option<Instant>,
    /// The last attempt to set this holder's elements set all of them (`refresh_nft_fence`;
    /// false after a failed one): with [`Self::nft_until`] still ahead, a bind may give the
    /// second line ([`VipHolder::second_line_now`]).
    nft_set_ok: bool,
    /// How long this holder's next fence transaction is expected to take
    /// ([`crate::lease::fence_run_expected`] of the runs so far; zero before the first).
    nft_run_expected: Duration,
    /// This holder as an owner of nftables fence elements (another holder of this node
    /// may arm the same VIP after an address moved; each disarms only its own arming).
    fence_owner: crate::net::nft::fence::Owner,
    /// Rate limiter of the log lines of repeating conditions (checked twice a second).
    quiet: RepeatLimiter<Quiet, String>,
    /// Open while this holder's VIPs on `lo` may be answered ([`HolderConfig::nd_answers`]):
    /// until the end of the nftables elements last set (or of the address fence where they
    /// could not be set); closed when not leading.
    answer_gate: Arc<AnswerGate>,
    /// The `(interface index, VIP)` pairs this holder has [`HolderConfig::nd_answers`]
    /// answer now, with the MAC they are answered with ([`VipHolder::sync_answers`]).
    answered: std::collections::HashMap<(u32, std::net::Ipv6Addr), [u8; 6]>,
    /// What [`VipHolder::sync_answers`] last brought [`Self::answered`] to with every answer
    /// started: `(interface index, VIP, MAC)` of each bound VIP on `lo`, in VIP order. A call
    /// that finds the same skips the sync (a shard's holder turns several times a second
    /// with hundreds of VIPs). `None` until the first sync, after a failure to start an
    /// answer (the next call tries again) and once the answers are stopped.
    answers_synced: Option<Vec<(u32, std::net::Ipv6Addr, [u8; 6])>>,
}

/// Conditions of a [`VipHolder`] whose log lines are rate-limited (see
/// [`crate::obs::logging`]): logged when they start or change, then at most once per
/// [`crate::obs::logging::REPEAT_WINDOW`] with the count of repeats, and once when they clear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Quiet {
    /// Some VIPs cannot be placed (interface missing or unusable).
    Place,
    /// Some VIPs are configured on the node and were not added by vipd.
    Untagged,
    /// Listing the node's addresses fails.
    ListAddresses,
    /// Adding, refreshing or re-adding this VIP fails.
    Add(IpAddr),
    /// This VIP was found missing while leading.
    Missing(IpAddr),
    /// Announcing this VIP fails.
    Announce(IpAddr),
    /// Removing this VIP fails.
    Remove(IpAddr),
    /// Sending a conflict probe for this VIP fails.
    Probe(IpAddr),
    /// Setting this holder's nftables fence elements fails.
    NftFence,
    /// Starting the answers to neighbour solicitations for this VIP on `lo` fails
    /// ([`HolderConfig::nd_answers`]).
    Answer(IpAddr),
}

impl Quiet {
    fn vip(self) -> Option<IpAddr> {
        match self {
            Quiet::Place | Quiet::Untagged | Quiet::ListAddresses | Quiet::NftFence => None,
            Quiet::Add(a)
            | Quiet::Missing(a)
            | Quiet::Announce(a)
            | Quiet::Remove(a)
            | Quiet::Probe(a)
            | Quiet::Answer(a) => Some(a),
        }
    }
}

impl<K: Kernel, A: Announcer> VipHolder<K, A> {
    /// A holder for `vips`; `name` labels its logs (e.g. `control-plane`). `gates` receives
    /// [`GATE_LINK`] and [`GATE_CONFLICT`], and [`GATE_STARTING`] closed until [`Self::run`]
    /// has made its first local checks (create the holder before starting the elector).
    pub fn new(
        name: &str,
        kernel: Arc<K>,
        announcer: Arc<A>,
        vips: Vec<VipSpec>,
        cfg: HolderConfig,
        gates: Gates,
    ) -> Self {
        let monitor = cfg.conflict_monitor.clone();
        let arp = crate::net::ArpPins::new(cfg.arp_guard.clone());
        gates.set(GATE_STARTING, false);
        VipHolder {
            kernel,
            announcer,
            vips,
            cfg,
            gates,
            name: name.to_string(),
            links: Links::default(),
            no_carrier_since: BTreeMap::new(),
            last_repeat: None,
            first_repeats: std::collections::VecDeque::new(),
            pending_na: Vec::new(),
            updates: None,
            metrics: None,
            monitor,
            probes: Vec::new(),
            watches: Vec::new(),
            claims: None,
            conflicts: None,
            bound: None,
            renewed_at: None,
            term_started: None,
            takeover_mark: None,
            term: 0,
            leader_view: None,
            arp,
            nft_fenced: std::collections::HashSet::new(),
            nft_until: None,
            nft_set_ok: false,
            nft_run_expected: Duration::ZERO,
            fence_owner: crate::net::nft::fence::next_owner(),
            quiet: RepeatLimiter::default(),
            answer_gate: Arc::new(AnswerGate::closed()),
            answered: std::collections::HashMap::new(),
            answers_synced: None,
        }
    }

    /// Publishes on `reports` the addresses this holder refuses because another host claims
    /// them, each with that host's MAC (empty when none): the Services side turns a new entry
    /// into a Warning Event.
    pub(crate) fn with_conflict_reports(mut self, reports: watch::Sender<Conflicts>) -> Self {
        self.conflicts = Some(reports);
        self
    }

    /// Publishes on `reports` the addresses this holder holds now: leading, the interface
    /// resolved, and the conflict probe passed (or skipped after a clean handover); empty
    /// while following. The Services side writes status only for these, so a Service's
    /// status never names an address its holder refused or gave up.
    pub(crate) fn with_bound_reports(mut self, reports: watch::Sender<Vec<IpAddr>>) -> Self {
        self.bound = Some(reports);
        self
    }

    /// Counts announcements in `metrics` (`vipd_garp_sent_total`).
    pub(crate) fn with_metrics(mut self, metrics: &crate::obs::metrics::Metrics) -> Self {
        self.metrics = Some(metrics.families::<metrics::VipMetrics>());
        self
    }

    /// Makes the VIP set follow `updates` (e.g. a Service's addresses being edited, S19):
    /// VIPs that leave the set are removed (ours only), new ones are added and announced when
    /// leading.
    pub(crate) fn with_updates(mut self, updates: watch::Receiver<Vec<VipSpec>>) -> Self {
        self.updates = Some(updates);
        self
    }
}

#[cfg(test)]
pub(crate) mod tests;
