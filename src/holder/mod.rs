//! The VIP holder: follows one election's [`LeaderState`] and makes the kernel hold
//! exactly the VIPs that state calls for, with the kernel fence, gratuitous ARP /
//! unsolicited neighbour advertisements, and the periodic check that repairs what others
//! changed (scenarios S01, S08, S09, S26 in `docs/scenarios.md`).
//!
//! The decision ([`address_steps`]) is a pure function of what the kernel shows and what we lead; the
//! [`VipHolder`] loop applies it through the [`Kernel`] and [`Announcer`] traits.

mod announce;
mod claims;
pub mod probe;
mod task;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::election::{Gates, LeaderState, Leadership, Timing};
use crate::obs::logging::RepeatLimiter;
use crate::net::conflict::{Claim, ConflictMonitor, WatchId, fmt_mac};
use crate::net::{AddrInfo, Announcer, Kernel, Lifetime, LinkInfo, NetError, Vip};
use probe::{Action, ProbeState};

/// Gate name closed while the VIP interface has had no carrier for longer than the renew
/// deadline, or cannot be found.
pub(crate) const GATE_LINK: &str = "link";
/// Gate name closed while a configured VIP is on the node but was not added by vipd.
pub const GATE_CONFLICT: &str = "vip-conflict";
pub use crate::election::GATE_STARTING;

/// Errors of the fence computation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FenceError {
    /// No whole number of seconds is both longer than the retry period and shorter than the
    /// lease duration.
    #[error(
        "lease timings leave no room for the kernel fence: the VIP lifetime must be a whole number of seconds longer than vip_retryperiod ({retry_ms} ms) and shorter than vip_leaseduration ({lease_ms} ms); use e.g. vip_leaseduration=3 vip_renewdeadline=2 vip_retryperiod=1, or turn on the millisecond fence (vip_nftfence=true) for sub-second timings"
    )]
    NoRoom {
        /// Retry period in ms.
        retry_ms: u128,
        /// Lease duration in ms.
        lease_ms: u128,
    },
    /// The millisecond fence (`min(renew deadline, lease duration - NFT_FENCE_MARGIN)`)
    /// would end before the next renewal.
    #[error(
        "lease timings leave no room for the millisecond fence: min(vip_renewdeadline, vip_leaseduration - 50 ms) = {fence_ms} ms must be longer than vip_retryperiod ({retry_ms} ms); use e.g. the fast profile vip_leaseduration=0.6 vip_renewdeadline=0.4 vip_retryperiod=0.2"
    )]
    NoRoomMs {
        /// The fence, ms.
        fence_ms: u128,
        /// Retry period in ms.
        retry_ms: u128,
    },
}

/// The kernel fence: the valid lifetime, in whole seconds (the kernel's unit), given to
/// every VIP and refreshed on every successful renew. A killed or frozen vipd stops
/// refreshing and the kernel removes the address before any other node may take the lease.
///
/// Rule: the largest whole number of seconds below the renew deadline; when that is not
/// longer than the retry period (the address would lapse between two renewals), the
/// smallest whole number above the retry period instead, as long as it stays below the lease
/// duration (the bound safety needs: a candidate waits a full lease duration after the last
/// renewal it saw). Kube-vip's 5/3/1 gives 2 s.
///
/// # Errors
/// [`FenceError::NoRoom`] when no such number exists (e.g. lease 2 s, retry 1 s).
pub fn fence_lifetime(t: &Timing) -> Result<u32, FenceError> {
    let rd_ms = t.renew_deadline.as_millis();
    let below_rd = rd_ms.div_ceil(1000).saturating_sub(1);
    let retry_ms = t.retry_period.as_millis();
    let lease_ms = t.lease_duration.as_millis();
    let f = if below_rd * 1000 > retry_ms {
        below_rd
    } else {
        retry_ms / 1000 + 1
    };
    if f == 0 || f * 1000 >= lease_ms {
        return Err(FenceError::NoRoom { retry_ms, lease_ms });
    }
    u32::try_from(f).map_err(|_| FenceError::NoRoom { retry_ms, lease_ms })
}

/// Whether timings `t` can be fenced by the nftables element alone: no whole number of
/// seconds fits them ([`fence_lifetime`] fails), so [`fence_plan`] needs `vip_nftfence`
/// and refuses them without it. Pure.
pub fn needs_nft_fence(t: &Timing) -> bool {
    fence_lifetime(t).is_err()
}

/// Time kept between a VIP's expiry and the earliest takeover by another node (its lease
/// duration after the last renewal it saw): the kernel's address expiry work
/// (`check_lifetime`, net/ipv4/devinet.c) removes a lone address up to 250 ms late
/// (`ADDRCONF_TIMER_FUZZ`), and clocks run at slightly different rates. Several addresses
/// expiring within a second of each other can be removed up to a second late (its runs are
/// at least `ADDRCONF_TIMER_FUZZ_MAX` apart): docs/design.md, "The kernel fence", says what
/// covers that (the RFC 5227 probe before a takeover after expiry; exactly, the nftables
/// fence).
pub const FENCE_MARGIN: Duration = Duration::from_millis(250);

/// The valid lifetime, in whole seconds, a VIP may get `age` after the last renewal request
/// was sent: [`fence_lifetime`]'s `fence_secs`, cut so that the address is gone
/// [`FENCE_MARGIN`] before `lease_duration` has passed since that send (no candidate takes
/// the lease earlier). 0 (do not add or refresh) once less than a second is left, e.g. when
/// a stale leadership update is acted on after the process was frozen. Pure.
pub fn fence_grant(fence_secs: u32, lease_duration: Duration, age: Duration) -> u32 {
    let left = lease_duration.saturating_sub(age.saturating_add(FENCE_MARGIN));
    u32::try_from(left.as_secs())
        .unwrap_or(u32::MAX)
        .min(fence_secs)
}

/// Whether the lease others see may have expired `age` after the last renewal request was
/// sent (less `margin`: [`FENCE_MARGIN`], or [`NFT_FENCE_MARGIN`] under the millisecond
/// fence): from then on this node must hold nothing, whatever its elector has not yet
/// noticed (a process continued after a freeze, a stalled task). Pure.
pub fn fence_lapsed(lease_duration: Duration, margin: Duration, age: Duration) -> bool {
    age.saturating_add(margin) >= lease_duration
}

/// How long the nftables fence ([`crate::net::nft::fence`]) may keep a VIP answered,
/// asked `age` after the last renewal request was sent: until that send time plus `fence`
/// (the fence lifetime, the same one [`fence_grant`] starts from), never past the send time
/// plus `lease_duration` less `margin` ([`FencePlan::margin`]); whole milliseconds, rounded down. Zero
/// (drop now) once that end has passed, e.g. when the process was frozen between the
/// renewal and this call. Unlike [`fence_grant`] it is not cut to whole seconds: the
/// element ends at `sent + fence` to the millisecond whenever it is asked. Pure.
pub fn fence_timeout(
    fence: Duration,
    lease_duration: Duration,
    margin: Duration,
    age: Duration,
) -> Duration {
    let end = fence.min(lease_duration.saturating_sub(margin));
    let left = end.saturating_sub(age);
    Duration::from_millis(u64::try_from(left.as_millis()).unwrap_or(u64::MAX))
}

/// Whether a fence element that may live until `ends` after the last renewal request was
/// sent (what [`crate::net::nft::fence::VipFence::refresh`] returns: its run's end plus
/// the timeout it carried) may outlive the lease as the other nodes see it: past
/// `lease_duration` less `margin` plus [`NFT_RUN_ALLOWANCE`], the part of the margin kept
/// for the `nft` run itself. Then the holder must shorten or expire it. Pure.
pub fn fence_overrun(lease_duration: Duration, margin: Duration, ends: Duration) -> bool {
    ends > lease_duration.saturating_sub(margin) + NFT_RUN_ALLOWANCE.min(margin)
}

/// How long an `nft` run may take (from writing its transaction to its answer) before the
/// element it set counts as overrunning the lease ([`fence_overrun`]): the part of
/// [`NFT_FENCE_MARGIN`] (and of [`FENCE_MARGIN`]) kept for it. The rest of the margin, 20 ms,
/// covers the jiffy granularity of nftables timeouts (at most 10 ms) and clock-rate drift
/// (under 1 ms on a 1 s lease). A delete of a live element makes a run wait for the kernel's
/// readers (about 20 ms), so a run rarely takes longer on an idle node; a longer one costs
/// another run with what is left of the element's time, or its expiry.
pub const NFT_RUN_ALLOWANCE: Duration = Duration::from_millis(30);

/// Margin of the millisecond fence ([`FencePlan`] with `address_fences` false): time kept
/// between the end of a VIP's nftables element and the earliest takeover by another node.
/// It covers what the whole-second [`FENCE_MARGIN`] covers except the kernel's address
/// expiry lag, which does not apply (an element's timeout is checked on every packet, to the
/// jiffy): clock-rate drift between the nodes (under 0.1 %, under 1 ms on a 1 s lease), the
/// jiffy granularity of nftables timeouts (at most 10 ms at HZ=100), and the time `nft`
/// takes to apply an element ([`NFT_RUN_ALLOWANCE`], which [`fence_overrun`] checks).
/// docs/design.md has the proof.
pub const NFT_FENCE_MARGIN: Duration = Duration::from_millis(50);

/// How a holder's VIPs are fenced, from the lease timings ([`fence_plan`], issue 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencePlan {
    /// Valid lifetime, whole seconds, given to every VIP address and refreshed on every
    /// renewal.
    pub address_secs: u32,
    /// The address lifetime is the fence: every grant is cut so that the address is gone
    /// [`FENCE_MARGIN`] before the lease can pass ([`fence_grant`]). `false` under the
    /// millisecond fence: the nftables element is the fence, and the address (which the
    /// kernel can only time in whole seconds) may outlive the lease, inert (its ARP, NS and
    /// IP packets dropped), as a second line.
    pub address_fences: bool,
    /// How long after a renewal's send time the VIP's nftables element keeps it answered
    /// ([`fence_timeout`]).
    pub nft: Duration,
    /// The margin before the lease can pass: [`FENCE_MARGIN`] or [`NFT_FENCE_MARGIN`].
    pub margin: Duration,
}

/// The fence for these lease timings. When [`fence_lifetime`] finds a whole number of
/// seconds, the address lifetime fences (and the nftables fence, when on, ends at the same
/// time). Otherwise (sub-second timings such as the `fast` profile) the nftables fence must
/// be on (`nft`): its elements last `min(renew deadline, lease duration -
/// NFT_FENCE_MARGIN)`, which must be longer than the retry period, and the addresses get
/// the lease duration rounded up to whole seconds.
///
/// # Errors
/// [`FenceError::NoRoom`] when no whole-second fence fits and `nft` is false;
/// [`FenceError::NoRoomMs`] when the millisecond fence would not outlast a retry period.
pub fn fence_plan(t: &Timing, nft: bool) -> Result<FencePlan, FenceError> {
    match fence_lifetime(t) {
        Ok(secs) => Ok(FencePlan {
            address_secs: secs,
            address_fences: true,
            nft: Duration::from_secs(u64::from(secs)),
            margin: FENCE_MARGIN,
        }),
        Err(e) if !nft => Err(e),
        Err(_) => {
            let fence = t
                .renew_deadline
                .min(t.lease_duration.saturating_sub(NFT_FENCE_MARGIN));
            if fence <= t.retry_period {
                return Err(FenceError::NoRoomMs {
                    fence_ms: fence.as_millis(),
                    retry_ms: t.retry_period.as_millis(),
                });
            }
            let secs = t.lease_duration.as_millis().div_ceil(1000).max(1);
            Ok(FencePlan {
                address_secs: u32::try_from(secs).unwrap_or(u32::MAX),
                address_fences: false,
                nft: fence,
                margin: NFT_FENCE_MARGIN,
            })
        }
    }
}

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

/// Settings of a [`VipHolder`].
#[derive(Debug, Clone)]
pub struct HolderConfig {
    /// Gratuitous ARP / unsolicited NA repeat interval while held (`vip_arpRate`, ms).
    pub arp_rate: Duration,
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
    ) -> Result<Self, FenceError> {
        let fence = fence_plan(t, nft)?;
        Ok(HolderConfig {
            arp_rate,
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
        })
    }
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
    /// Remove the VIP (ours only).
    Remove {
        /// The VIP.
        vip: Vip,
        /// Interface index.
        ifindex: u32,
    },
}

/// Decides the kernel changes for one check.
///
/// * `desired`: the VIPs of this holder with their resolved interface index.
/// * `present`: every address on the node (from the kernel).
/// * `fence_left`: `Some(seconds of fence lifetime left since the last renew)` while
///   leading, `None` when not leading.
///
/// While leading: a missing VIP is added with the fence time left (not re-added at all once
/// that is under one second: the next renew re-adds it); a VIP in `dadfailed` is removed and
/// added again (S26); our copy of a VIP on another interface is removed. Not leading: every
/// copy of our VIPs that is ours is removed. Addresses not tagged as ours are never touched.
pub fn address_steps(
    desired: &[(Vip, u32)],
    present: &[AddrInfo],
    fence_left: Option<u32>,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for (vip, ifindex) in desired {
        let copies: Vec<&AddrInfo> = present
            .iter()
            .filter(|a| a.vip.addr == vip.addr && a.ours)
            .collect();
        match fence_left {
            Some(left) => {
                for c in &copies {
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

/// VIPs among `vips` that the node already carries without vipd's tag: vipd refuses to
/// manage those (it would otherwise remove a node's own address on step-down).
pub fn conflicts(vips: &[Vip], present: &[AddrInfo]) -> Vec<(IpAddr, u32)> {
    present
        .iter()
        .filter(|a| !a.ours && vips.iter().any(|v| v.addr == a.vip.addr))
        .map(|a| (a.vip.addr, a.ifindex))
        .collect()
}

/// Removes every vipd-tagged address on the node among `addrs` (all tagged addresses when
/// `addrs` is `None`). Run once at start, before any election: at that point this process
/// leads nothing, so every tagged address is stale (a previous run crashed, or the config
/// changed). Untagged addresses are never touched. Returns the removed VIPs.
///
/// # Errors
/// [`NetError`] when the kernel cannot be read; single failed removals are logged.
pub(crate) async fn remove_stale<K: Kernel>(
    kernel: &K,
    addrs: Option<&[IpAddr]>,
) -> Result<Vec<Vip>, NetError> {
    let mut removed = Vec::new();
    for a in kernel.addresses(None).await? {
        if !a.ours || addrs.is_some_and(|set| !set.contains(&a.vip.addr)) {
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

/// The interface resolved for each VIP, by VIP index. A small vector rather than a BTreeMap:
/// a node runs one holder per Service lease, each with one or two VIPs, and a BTreeMap's
/// first node alone takes about 600 bytes.
#[derive(Debug, Default)]
struct Links(Vec<(usize, LinkInfo)>);

impl Links {
    fn get(&self, i: &usize) -> Option<&LinkInfo> {
        self.0.iter().find(|(k, _)| k == i).map(|(_, l)| l)
    }

    fn insert(&mut self, i: usize, link: LinkInfo) {
        match self.0.iter_mut().find(|(k, _)| *k == i) {
            Some(slot) => slot.1 = link,
            None => self.0.push((i, link)),
        }
    }

    fn remove(&mut self, i: &usize) {
        self.0.retain(|(k, _)| k != i);
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn iter(&self) -> impl Iterator<Item = (&usize, &LinkInfo)> {
        self.0.iter().map(|(k, l)| (k, l))
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
    last_garp: Option<Instant>,
    /// IPv6 VIPs added but not yet announced because they were tentative.
    pending_na: Vec<usize>,
    updates: Option<watch::Receiver<Vec<VipSpec>>>,
    metrics: Option<crate::obs::metrics::Metrics>,
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
    /// IPv4 VIPs pinned to their interface against ARP flux (S36).
    arp: crate::net::ArpPins,
    /// VIPs armed in the nftables fence (`HolderConfig::nft_fence`).
    nft_fenced: Vec<IpAddr>,
    /// This holder as an owner of nftables fence elements (another holder of this node
    /// may arm the same VIP after an address moved; each disarms only its own arming).
    fence_owner: crate::net::nft::fence::Owner,
    /// Rate limiter of the log lines of repeating conditions (checked twice a second).
    quiet: RepeatLimiter<Quiet, String>,
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
}

impl Quiet {
    fn vip(self) -> Option<IpAddr> {
        match self {
            Quiet::Place | Quiet::Untagged | Quiet::ListAddresses => None,
            Quiet::Add(a)
            | Quiet::Missing(a)
            | Quiet::Announce(a)
            | Quiet::Remove(a)
            | Quiet::Probe(a) => Some(a),
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
            last_garp: None,
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
            arp,
            nft_fenced: Vec::new(),
            fence_owner: crate::net::nft::fence::next_owner(),
            quiet: RepeatLimiter::default(),
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
    pub(crate) fn with_metrics(mut self, metrics: crate::obs::metrics::Metrics) -> Self {
        self.metrics = Some(metrics);
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
