//! The VIP reconciler: follows one election's [`LeaderState`] and makes the kernel hold
//! exactly the VIPs that state calls for, with the kernel fence, gratuitous ARP /
//! unsolicited neighbour advertisements, and the periodic check that repairs what others
//! changed (scenarios S01, S08, S09, S26 in `docs/scenarios.md`).
//!
//! The decision ([`plan`]) is a pure function of what the kernel shows and what we lead; the
//! [`VipHolder`] loop applies it through the [`Kernel`] and [`Announcer`] traits.

pub mod probe;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::election::{Gates, LeaderState, Leadership, Timing};
use crate::logging::RepeatLimiter;
use crate::net::conflict::{Claim, ConflictMonitor, WatchId, fmt_mac};
use crate::net::{AddrInfo, Announcer, Kernel, LinkInfo, NetError, Vip};
use probe::{Action, ProbeState};

/// Gate name closed while the VIP interface has had no carrier for longer than the renew
/// deadline, or cannot be found.
pub const GATE_LINK: &str = "link";
/// Gate name closed while a configured VIP is on the node but was not added by vipd.
pub const GATE_CONFLICT: &str = "vip-conflict";
pub use crate::election::GATE_STARTING;

/// Errors of the fence computation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FenceError {
    /// No whole number of seconds is both longer than the retry period and shorter than the
    /// lease duration.
    #[error(
        "lease timings leave no room for the kernel fence: the VIP lifetime must be a whole number of seconds longer than vip_retryperiod ({retry_ms} ms) and shorter than vip_leaseduration ({lease_ms} ms); use e.g. vip_leaseduration=5 vip_renewdeadline=3 vip_retryperiod=1"
    )]
    NoRoom {
        /// Retry period in ms.
        retry_ms: u128,
        /// Lease duration in ms.
        lease_ms: u128,
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

/// Time kept between a VIP's expiry and the earliest takeover by another node (its lease
/// duration after the last renewal it saw): the kernel's address expiry work runs late by
/// up to a fraction of a second, and clocks run at slightly different rates.
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

/// One VIP this holder manages: the address and the interface to put it on (`None` =
/// choose automatically, scenario S27).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipSpec {
    /// Address and prefix.
    pub vip: Vip,
    /// Interface name from the configuration, if any.
    pub interface: Option<String>,
}

/// Settings of a [`VipHolder`].
#[derive(Debug, Clone)]
pub struct HolderConfig {
    /// Gratuitous ARP / unsolicited NA repeat interval while held (`vip_arpRate`, ms).
    pub arp_rate: Duration,
    /// Interval of the periodic check (address present, DAD state, carrier).
    pub check_interval: Duration,
    /// Kernel fence lifetime in seconds, see [`fence_lifetime`].
    pub fence_secs: u32,
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
}

impl HolderConfig {
    /// Settings derived from lease timings and the ARP rate: check every
    /// `min(arp_rate, 500 ms)`, carrier grace = renew deadline, IPv6 DAD skipped (see
    /// `Config::ipv6_dad`; set `skip_dad` from it).
    ///
    /// # Errors
    /// See [`fence_lifetime`].
    pub fn from_timing(t: &Timing, arp_rate: Duration) -> Result<Self, FenceError> {
        Ok(HolderConfig {
            arp_rate,
            check_interval: arp_rate.min(Duration::from_millis(500)),
            fence_secs: fence_lifetime(t)?,
            lease_duration: t.lease_duration,
            carrier_grace: t.renew_deadline,
            skip_dad: true,
            probe_window: DEFAULT_PROBE_WINDOW,
            conflict_monitor: None,
            check_following: true,
            arp_guard: Arc::new(crate::net::NoopArpGuard::default()),
        })
    }
}

/// Addresses a holder refuses because another host claims them, each with that host's MAC
/// (see [`VipHolder::with_conflict_reports`]).
pub type Conflicts = Vec<(IpAddr, [u8; 6])>;

/// Default conflict probe window (`vip_arpprobe`): 50 ms.
pub const DEFAULT_PROBE_WINDOW: Duration = Duration::from_millis(50);

/// A kernel change the reconciler decided on.
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
pub fn plan(desired: &[(Vip, u32)], present: &[AddrInfo], fence_left: Option<u32>) -> Vec<Step> {
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
pub async fn remove_stale<K: Kernel>(
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
/// Pause between two removal tries.
const DROP_RETRY: Duration = Duration::from_millis(30);

async fn next_update(updates: &mut Option<watch::Receiver<Vec<VipSpec>>>) -> Vec<VipSpec> {
    if let Some(rx) = updates {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().clone();
        }
        // Sender gone: the set stays as it is.
        *updates = None;
    }
    std::future::pending().await
}

/// The next claim of the current term's watches; pending while there are none.
async fn next_claim(
    claims: &mut Option<(mpsc::UnboundedSender<Claim>, mpsc::UnboundedReceiver<Claim>)>,
) -> Option<Claim> {
    match claims {
        Some((_, rx)) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

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

    fn clear(&mut self) {
        self.0.clear();
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
    metrics: Option<crate::metrics::Metrics>,
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
    /// Rate limiter of the log lines of repeating conditions (checked twice a second).
    quiet: RepeatLimiter<Quiet, String>,
}

/// Conditions of a [`VipHolder`] whose log lines are rate-limited (see
/// [`crate::logging`]): logged when they start or change, then at most once per
/// [`crate::logging::REPEAT_WINDOW`] with the count of repeats, and once when they clear.
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
            quiet: RepeatLimiter::default(),
        }
    }

    /// Publishes on `reports` the addresses this holder refuses because another host claims
    /// them, each with that host's MAC (empty when none): the Services side turns a new entry
    /// into a Warning Event.
    pub fn with_conflict_reports(mut self, reports: watch::Sender<Conflicts>) -> Self {
        self.conflicts = Some(reports);
        self
    }

    /// Publishes on `reports` the addresses this holder holds now: leading, the interface
    /// resolved, and the conflict probe passed (or skipped after a clean handover); empty
    /// while following. The Services side writes status only for these, so a Service's
    /// status never names an address its holder refused or gave up.
    pub fn with_bound_reports(mut self, reports: watch::Sender<Vec<IpAddr>>) -> Self {
        self.bound = Some(reports);
        self
    }

    /// Counts announcements in `metrics` (`vipd_garp_sent_total`).
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Makes the VIP set follow `updates` (e.g. a Service's addresses being edited, S19):
    /// VIPs that leave the set are removed (ours only), new ones are added and announced when
    /// leading.
    pub fn with_updates(mut self, updates: watch::Receiver<Vec<VipSpec>>) -> Self {
        self.updates = Some(updates);
        self
    }

    /// Follows `leadership` until `shutdown`: adds, refreshes, repairs and announces the VIPs
    /// while leading (after a conflict probe where the term calls for one, see [`probe`]),
    /// removes them when not, and acknowledges every dropped term on `leadership.dropped`.
    /// On shutdown removes the VIPs before returning.
    pub async fn run(mut self, mut leadership: Leadership, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.check_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut term = 0u64;
        let mut updates = self.updates.take();
        let mut unacked: Option<u64> = None;
        if let Some(u) = updates.as_mut() {
            self.vips = u.borrow_and_update().clone();
        }
        self.probes = vec![ProbeState::default(); self.vips.len()];
        Box::pin(self.resolve_links()).await;
        self.gates.set(GATE_STARTING, true);
        loop {
            self.publish_bound();
            // Checks run while leading, when configured for followers, and while a gate is
            // closed (to re-open it). Followers with nothing to check or acknowledge do not
            // tick: hundreds of Service groups per node would otherwise wake twice a second
            // each for nothing.
            let checking = self.renewed_at.is_some()
                || self.cfg.check_following
                || !self.gates.closed().is_empty();
            let probe_at = self.next_probe_deadline();
            let garp_at = self.next_garp();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    if Box::pin(self.drop_all()).await {
                        let _ = leadership.dropped.send(term);
                        Box::pin(self.arp.release(&self.name)).await;
                    }
                    return;
                }
                changed = leadership.state.changed() => {
                    if changed.is_err() {
                        // Elector gone: hold nothing.
                        if Box::pin(self.drop_all()).await {
                            Box::pin(self.arp.release(&self.name)).await;
                        }
                        shutdown.cancelled().await;
                        return;
                    }
                    let state = leadership.state.borrow_and_update().clone();
                    match state {
                        LeaderState::Leading { term: t, renewed_at: r, clean } => {
                            let first = self.renewed_at.is_none() || t != term;
                            term = t;
                            self.renewed_at = Some(r);
                            if first {
                                info!(holder = %self.name, term, clean, "leading: adding VIPs");
                                Box::pin(self.resolve_links()).await;
                                self.start_term(clean);
                            }
                            Box::pin(self.refresh(first)).await;
                        }
                        LeaderState::Following { .. } => {
                            if self.renewed_at.take().is_some() {
                                info!(holder = %self.name, term, "not leading: removing VIPs");
                            }
                            // Acknowledge (which lets the elector release the lease) only
                            // once the VIPs are confirmed gone; otherwise retry on the tick.
                            if Box::pin(self.drop_all()).await {
                                let _ = leadership.dropped.send(term);
                                unacked = None;
                            } else {
                                unacked = Some(term);
                            }
                        }
                    }
                }
                Some(claim) = next_claim(&mut self.claims) => {
                    Box::pin(self.on_claim(claim)).await;
                }
                new = next_update(&mut updates) => {
                    Box::pin(self.set_vips(new)).await;
                }
                _ = sleep_until_opt(probe_at) => {
                    Box::pin(self.probe_tick()).await;
                }
                _ = tick.tick(), if checking || unacked.is_some() => {
                    if let Some(t) = unacked
                        && self.renewed_at.is_none()
                        && Box::pin(self.drop_all()).await
                    {
                        let _ = leadership.dropped.send(t);
                        unacked = None;
                    }
                    if checking {
                        Box::pin(self.check()).await;
                    }
                }
                _ = sleep_until_opt(garp_at) => {
                    Box::pin(self.announce_all(false)).await;
                }
            }
        }
    }

    /// A term starts: watch every VIP for claims by other hosts, and probe before binding
    /// unless the lease was released cleanly by its previous holder (`clean`).
    fn start_term(&mut self, clean: bool) {
        self.unwatch_all();
        let window = self.probing_window();
        let now = Instant::now();
        for i in 0..self.vips.len() {
            self.watch(i);
            let action = self.probes[i].lead(!clean, window, now);
            self.act(i, action);
        }
    }

    /// The probe window in force: zero without a monitor.
    fn probing_window(&self) -> Duration {
        if self.monitor.is_some() {
            self.cfg.probe_window
        } else {
            Duration::ZERO
        }
    }

    /// Starts the claim watch of VIP `i` (when conflict detection is on and its link known).
    fn watch(&mut self, i: usize) {
        let (Some(monitor), Some(link), Some(spec)) =
            (&self.monitor, self.links.get(&i), self.vips.get(i))
        else {
            return;
        };
        if self.cfg.probe_window.is_zero() || self.watches.iter().any(|(w, _)| *w == i) {
            return;
        }
        let tx = self
            .claims
            .get_or_insert_with(mpsc::unbounded_channel)
            .0
            .clone();
        match monitor.watch(link, spec.vip.addr, tx) {
            Ok(id) => self.watches.push((i, id)),
            Err(e) => {
                warn!(holder = %self.name, vip = %spec.vip, error = %e, "cannot watch for address conflicts")
            }
        }
    }

    fn unwatch_all(&mut self) {
        if let Some(monitor) = &self.monitor {
            for (_, id) in self.watches.drain(..) {
                monitor.unwatch(id);
            }
        }
        self.watches.clear();
        self.claims = None;
    }

    /// Carries out what the probe state of VIP `i` asked for, except binding (which needs
    /// the kernel: see [`VipHolder::bind`]).
    fn act(&mut self, i: usize, action: Action) -> bool {
        let (Some(spec), Some(link)) = (self.vips.get(i), self.links.get(&i)) else {
            return false;
        };
        match action {
            Action::None => false,
            Action::Bind => true,
            Action::Probe => {
                if let Some(monitor) = &self.monitor {
                    let key = Quiet::Probe(spec.vip.addr);
                    match monitor.send_probe(link, spec.vip.addr) {
                        Ok(()) => {
                            if let Some(r) = self.quiet.clear(&key, Instant::now()) {
                                info!(holder = %self.name, vip = %spec.vip, "conflict probes sent again{r}");
                            }
                        }
                        Err(e) => {
                            if let Some(r) = self.quiet.observe(key, e.to_string(), Instant::now())
                            {
                                warn!(holder = %self.name, vip = %spec.vip, error = %e, "cannot send conflict probe{r}");
                            }
                        }
                    }
                }
                false
            }
            Action::Refuse { mac, new } => {
                let other = fmt_mac(mac);
                if new {
                    warn!(holder = %self.name, vip = %spec.vip, interface = %link.name, other_mac = %other, "address conflict: another host answers for this address; not announcing it, probing again with back-off (RFC 5227)");
                    if let Some(m) = &self.metrics {
                        m.vip_conflict(spec.vip.addr);
                    }
                } else {
                    debug!(holder = %self.name, vip = %spec.vip, other_mac = %other, "address still in use by another host");
                }
                self.publish_conflicts();
                false
            }
        }
    }

    fn publish_conflicts(&self) {
        if let Some(tx) = &self.conflicts {
            let now: Conflicts = self
                .vips
                .iter()
                .zip(&self.probes)
                .filter_map(|(spec, p)| p.refused_by().map(|mac| (spec.vip.addr, mac)))
                .collect();
            tx.send_if_modified(|cur| {
                if *cur != now {
                    *cur = now;
                    true
                } else {
                    false
                }
            });
        }
    }

    /// A claim from another host for one of our VIPs.
    async fn on_claim(&mut self, claim: Claim) {
        if self.renewed_at.is_none() {
            return;
        }
        let rand = random_permille();
        let now = Instant::now();
        let hits: Vec<usize> = (0..self.vips.len())
            .filter(|i| self.vips[*i].vip.addr == claim.addr)
            .collect();
        for i in hits {
            let was_bound = self.probes[i].bound();
            let action = self.probes[i].claim(&claim, now, rand);
            let refused = matches!(action, Action::Refuse { .. });
            self.act(i, action);
            if refused && was_bound {
                self.unbind(i).await;
            }
        }
    }

    /// Removes VIP `i` (ours only) after a conflict.
    async fn unbind(&mut self, i: usize) {
        let Some(spec) = self.vips.get(i) else { return };
        let vip = spec.vip;
        match self.kernel.addresses(None).await {
            Ok(present) => {
                for step in plan(&[(vip, 0)], &present, None) {
                    if let Step::Remove { vip, ifindex } = step
                        && let Err(e) = self.kernel.remove(ifindex, vip).await
                    {
                        warn!(holder = %self.name, %vip, error = %e, "removing conflicting VIP failed; retried at the next check");
                    }
                }
            }
            Err(e) => {
                warn!(holder = %self.name, error = %e, "cannot list addresses; conflicting VIP removed at the next check")
            }
        }
    }

    /// Earliest moment a VIP's probe state has something to do.
    fn next_probe_deadline(&self) -> Option<Instant> {
        self.renewed_at?;
        let window = self.probing_window();
        self.probes
            .iter()
            .filter_map(|p| p.next_deadline(window))
            .min()
    }

    /// Sends due probes, binds VIPs whose probe window stayed quiet, re-probes refused ones.
    async fn probe_tick(&mut self) {
        let now = Instant::now();
        let window = self.probing_window();
        let mut bind = Vec::new();
        for i in 0..self.probes.len() {
            let action = self.probes[i].tick(window, now);
            if self.act(i, action) {
                bind.push(i);
            }
        }
        if !bind.is_empty() {
            self.publish_conflicts();
            self.bind(&bind).await;
        }
    }

    /// Adds VIPs `idx` with the fence time left of this term and announces them at once.
    async fn bind(&mut self, idx: &[usize]) {
        let Some(left) = self.fence_left(Instant::now()) else {
            return;
        };
        if left == 0 {
            // The next renewal adds them with a full fence.
            return;
        }
        let mut added = Vec::new();
        for &i in idx {
            let (Some(spec), Some(link)) = (self.vips.get(i), self.links.get(&i)) else {
                continue;
            };
            match self
                .kernel
                .add_or_refresh(link.index, spec.vip, left, self.cfg.skip_dad)
                .await
            {
                Ok(()) => {
                    self.quiet.clear(&Quiet::Add(spec.vip.addr), Instant::now());
                    info!(holder = %self.name, vip = %spec.vip, interface = %link.name, "no conflict; VIP added");
                    added.push(i);
                }
                Err(e) => {
                    if let Some(r) =
                        self.quiet
                            .observe(Quiet::Add(spec.vip.addr), e.to_string(), Instant::now())
                    {
                        error!(holder = %self.name, vip = %spec.vip, interface = %link.name, error = %e, "cannot add VIP{r}")
                    }
                }
            }
        }
        self.announce_added(&added);
    }

    /// Sends one gratuitous ARP / unsolicited NA for `vip` on `link` and counts it; logs
    /// "announced" at info when `loud` (else debug), a failure rate-limited, and the end
    /// of a run of failures.
    fn announce_one(&mut self, vip: Vip, link: &LinkInfo, loud: bool) {
        match self.announcer.announce(link, vip) {
            Ok(()) => {
                if let Some(m) = &self.metrics {
                    m.garp_sent(vip.addr);
                }
                if let Some(r) = self.quiet.clear(&Quiet::Announce(vip.addr), Instant::now()) {
                    info!(holder = %self.name, %vip, "announcing works again{r}");
                }
                if loud {
                    info!(holder = %self.name, %vip, interface = %link.name, "announced");
                } else {
                    debug!(holder = %self.name, %vip, "announced");
                }
            }
            Err(e) => {
                if let Some(r) =
                    self.quiet
                        .observe(Quiet::Announce(vip.addr), e.to_string(), Instant::now())
                {
                    warn!(holder = %self.name, %vip, interface = %link.name, error = %e, "announce failed{r}")
                }
            }
        }
    }

    /// Announces VIPs `idx` that were just added, at once: from the add's success, not from an
    /// address dump (a dump made while other holders add addresses can miss entries, and a
    /// VIP that is not announced is reached only after the clients' own neighbour
    /// solicitation retransmits, a second later). IPv6 VIPs added with DAD wait in
    /// `pending_na` until they leave the tentative state (the periodic check announces them).
    fn announce_added(&mut self, idx: &[usize]) {
        for &i in idx {
            let (Some(spec), Some(link)) = (self.vips.get(i), self.links.get(&i)) else {
                continue;
            };
            if spec.vip.addr.is_ipv6() && !self.cfg.skip_dad {
                if !self.pending_na.contains(&i) {
                    self.pending_na.push(i);
                }
                continue;
            }
            let (vip, link) = (spec.vip, link.clone());
            self.announce_one(vip, &link, true);
        }
        self.last_garp = Some(Instant::now());
    }

    /// Publishes the addresses held now (see [`VipHolder::with_bound_reports`]), only when
    /// they change.
    fn publish_bound(&self) {
        let Some(tx) = &self.bound else {
            return;
        };
        let now: Vec<IpAddr> = if self.renewed_at.is_some() {
            self.vips
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    self.links.get(i).is_some()
                        && self.probes.get(*i).is_some_and(ProbeState::bound)
                })
                .map(|(_, s)| s.vip.addr)
                .collect()
        } else {
            Vec::new()
        };
        tx.send_if_modified(|cur| {
            if *cur != now {
                *cur = now;
                true
            } else {
                false
            }
        });
    }

    /// The lifetime a VIP may get now ([`fence_grant`] from the last renewal's send time);
    /// `None` when not leading.
    fn fence_left(&self, now: Instant) -> Option<u32> {
        self.renewed_at.map(|r| {
            fence_grant(
                self.cfg.fence_secs,
                self.cfg.lease_duration,
                now.saturating_duration_since(r),
            )
        })
    }

    /// Replaces the VIP set (see [`VipHolder::with_updates`]).
    async fn set_vips(&mut self, new: Vec<VipSpec>) {
        if new == self.vips {
            return;
        }
        let leading = self.renewed_at.is_some();
        let old = std::mem::replace(&mut self.vips, new);
        // Probe state follows its address; an address new to this term was never held by
        // it and is probed like any other (see `probe`).
        let old_probes = std::mem::take(&mut self.probes);
        self.probes = self
            .vips
            .iter()
            .map(|n| {
                old.iter()
                    .position(|o| o.vip == n.vip)
                    .and_then(|j| old_probes.get(j).cloned())
                    .unwrap_or_default()
            })
            .collect();
        self.unwatch_all();
        let gone: Vec<(Vip, u32)> = old
            .iter()
            .filter(|o| !self.vips.iter().any(|n| n.vip == o.vip))
            .map(|o| (o.vip, 0))
            .collect();
        if !gone.is_empty() {
            match self.kernel.addresses(None).await {
                Ok(present) => {
                    for step in plan(&gone, &present, None) {
                        if let Step::Remove { vip, ifindex } = step {
                            match self.kernel.remove(ifindex, vip).await {
                                Ok(()) => {
                                    info!(holder = %self.name, %vip, "VIP no longer configured; removed")
                                }
                                Err(e) => {
                                    warn!(holder = %self.name, %vip, error = %e, "removing VIP failed")
                                }
                            }
                        }
                    }
                }
                Err(e) => {
                    if let Some(r) =
                        self.quiet
                            .observe(Quiet::ListAddresses, e.to_string(), Instant::now())
                    {
                        warn!(holder = %self.name, error = %e, "cannot list addresses{r}")
                    }
                }
            }
        }
        let addrs: Vec<IpAddr> = self.vips.iter().map(|s| s.vip.addr).collect();
        self.quiet
            .retain(|k| k.vip().is_none_or(|a| addrs.contains(&a)));
        self.links.clear();
        self.pending_na.clear();
        self.resolve_links().await;
        if leading {
            let window = self.probing_window();
            let now = Instant::now();
            for i in 0..self.vips.len() {
                self.watch(i);
                if self.probes[i].phase() == probe::Phase::Idle {
                    let action = self.probes[i].lead(true, window, now);
                    self.act(i, action);
                }
            }
            self.publish_conflicts();
            self.refresh(true).await;
        }
    }

    /// Resolves configured or automatic interfaces; closes [`GATE_LINK`] while any cannot
    /// be found, [`GATE_CONFLICT`] while a VIP is on the node untagged.
    async fn resolve_links(&mut self) {
        let mut missing = Vec::new();
        for (i, spec) in self.vips.iter().enumerate() {
            let found = match &spec.interface {
                Some(name) => self.kernel.link_by_name(name).await,
                None => match self.kernel.choose_interface(spec.vip.addr).await {
                    Ok(idx) => self.kernel.link_by_index(idx).await,
                    Err(e) => Err(e),
                },
            };
            match found {
                Ok(link) if link.mac == [0; 6] => {
                    missing.push(format!(
                        "{}: interface {} has no hardware address (loopback or tunnel): gratuitous ARP cannot be sent on it; set vip_interface to the Ethernet interface",
                        spec.vip, link.name
                    ));
                    self.links.remove(&i);
                }
                Ok(link) => {
                    if self.links.get(&i).map(|l| l.index) != Some(link.index) {
                        info!(holder = %self.name, vip = %spec.vip, interface = %link.name, "VIP interface");
                    }
                    self.links.insert(i, link);
                }
                Err(e) => {
                    missing.push(format!("{}: {e}", spec.vip));
                    self.links.remove(&i);
                }
            }
        }
        // Pin before any address is added (S36: no window with two ARP responders).
        let (want, configured) = self.arp_pins_wanted();
        self.arp.sync(&self.name, &want, &configured).await;
        let now = Instant::now();
        if missing.is_empty() {
            if let Some(r) = self.quiet.clear(&Quiet::Place, now) {
                info!(holder = %self.name, "VIP interfaces usable again{r}");
            }
        } else if let Some(r) = self.quiet.observe(Quiet::Place, missing.join("; "), now) {
            error!(holder = %self.name, problems = ?missing, "cannot place VIPs; not campaigning until this is fixed{r}");
        }
        self.gates.set(GATE_LINK, missing.is_empty());
        match self.kernel.addresses(None).await {
            Ok(present) => {
                let vips: Vec<Vip> = self.vips.iter().map(|s| s.vip).collect();
                let c = conflicts(&vips, &present);
                if c.is_empty() {
                    if let Some(r) = self.quiet.clear(&Quiet::Untagged, now) {
                        info!(holder = %self.name, "no VIP is configured on this node by others any more{r}");
                    }
                } else if let Some(r) = self.quiet.observe(Quiet::Untagged, format!("{c:?}"), now) {
                    error!(holder = %self.name, conflicts = ?c, "VIP already configured on this node and not added by vipd; refusing to manage it (remove it from the node or change the VIP){r}");
                }
                self.gates.set(GATE_CONFLICT, c.is_empty());
            }
            Err(e) => {
                if let Some(r) = self.quiet.observe(Quiet::ListAddresses, e.to_string(), now) {
                    warn!(holder = %self.name, error = %e, "cannot list addresses{r}")
                }
            }
        }
    }

    /// `(IPv4 VIP, resolved interface name)` pairs, and every configured IPv4 VIP.
    fn arp_pins_wanted(&self) -> (Vec<(std::net::Ipv4Addr, String)>, Vec<std::net::Ipv4Addr>) {
        let mut want = Vec::new();
        let mut configured = Vec::new();
        for (i, s) in self.vips.iter().enumerate() {
            if let IpAddr::V4(v4) = s.vip.addr {
                configured.push(v4);
                if let Some(l) = self.links.get(&i) {
                    want.push((v4, l.name.clone()));
                }
            }
        }
        (want, configured)
    }

    /// The VIPs to carry while leading, with their interface: those whose interface is
    /// known and whose conflict probe let them bind.
    fn desired(&self) -> Vec<(Vip, u32)> {
        self.vips
            .iter()
            .enumerate()
            .filter(|(i, _)| self.probes.get(*i).is_some_and(ProbeState::bound))
            .filter_map(|(i, s)| self.links.get(&i).map(|l| (s.vip, l.index)))
            .collect()
    }

    /// VIPs held back by the conflict probe (probing or refused): never on the interface.
    fn held_back(&self) -> Vec<(Vip, u32)> {
        self.vips
            .iter()
            .zip(&self.probes)
            .filter(|(_, p)| !p.bound())
            .map(|(s, _)| (s.vip, 0))
            .collect()
    }

    /// After an acquire or renew: (re-)add every VIP with the full fence lifetime, and on
    /// acquire announce at once.
    async fn refresh(&mut self, announce: bool) {
        let mut added = Vec::new();
        // Never a full fence from a stale renewal (one sent before this process was frozen,
        // acted on after it was continued): only what the lease still covers.
        let lifetime = self.fence_left(Instant::now()).unwrap_or(0);
        if lifetime == 0 {
            debug!(holder = %self.name, "renewal too old to extend the fence; not refreshing");
            return;
        }
        for (i, spec) in self.vips.iter().enumerate() {
            let Some(link) = self.links.get(&i) else {
                continue;
            };
            if !self.probes.get(i).is_some_and(ProbeState::bound) {
                continue;
            }
            let key = Quiet::Add(spec.vip.addr);
            if let Err(e) = self
                .kernel
                .add_or_refresh(link.index, spec.vip, lifetime, self.cfg.skip_dad)
                .await
            {
                if let Some(r) = self.quiet.observe(key, e.to_string(), Instant::now()) {
                    error!(holder = %self.name, vip = %spec.vip, interface = %link.name, error = %e, "cannot add VIP{r}");
                }
                continue;
            }
            if let Some(r) = self.quiet.clear(&key, Instant::now()) {
                info!(holder = %self.name, vip = %spec.vip, interface = %link.name, "adding the VIP works again{r}");
            }
            if announce {
                info!(holder = %self.name, vip = %spec.vip, interface = %link.name, "VIP added");
                added.push(i);
            }
        }
        if announce {
            self.pending_na.clear();
            self.announce_added(&added);
        }
    }

    /// Announces every held VIP; IPv6 VIPs only once they left tentative state.
    async fn announce_all(&mut self, first: bool) {
        let present = match self.kernel.addresses(None).await {
            Ok(p) => p,
            Err(e) => {
                // Retried at the next check; say so instead of silently skipping.
                warn!(holder = %self.name, error = %e, "cannot list addresses; announcements postponed");
                self.pending_na = (0..self.vips.len()).collect();
                return;
            }
        };
        for i in 0..self.vips.len() {
            let vip = self.vips[i].vip;
            let Some(link) = self.links.get(&i).cloned() else {
                continue;
            };
            let here = present
                .iter()
                .find(|a| a.ifindex == link.index && a.vip.addr == vip.addr && a.ours);
            match here {
                Some(a) if a.tentative || a.dad_failed => {
                    if !self.pending_na.contains(&i) {
                        self.pending_na.push(i);
                    }
                    continue;
                }
                Some(_) => {}
                None => continue,
            }
            self.pending_na.retain(|p| *p != i);
            self.announce_one(vip, &link, first);
        }
        self.last_garp = Some(Instant::now());
    }

    /// Periodic check: carrier, links, repair, and the GARP repeat.
    async fn check(&mut self) {
        let now = Instant::now();
        let renewed_at = self.renewed_at;
        // Carrier of the VIP interfaces (checked whether leading or not, to re-open the gate).
        let mut link_ok = true;
        let mut relink = false;
        let indexes: Vec<(usize, u32)> = self.links.iter().map(|(i, l)| (*i, l.index)).collect();
        for (i, idx) in indexes {
            match self.kernel.link_by_index(idx).await {
                Ok(l) => {
                    if l.carrier && l.up {
                        if self.no_carrier_since.remove(&idx).is_some() {
                            info!(holder = %self.name, interface = %l.name, "carrier back");
                        }
                    } else {
                        let since = *self.no_carrier_since.entry(idx).or_insert_with(|| {
                            warn!(holder = %self.name, interface = %l.name, "no carrier");
                            now
                        });
                        if now - since > self.cfg.carrier_grace {
                            link_ok = false;
                        }
                    }
                    self.links.insert(i, l);
                }
                Err(_) => relink = true,
            }
        }
        if relink || self.links.len() < self.vips.len() {
            self.resolve_links().await;
        } else {
            if !link_ok && self.gates.closed().iter().all(|g| g != GATE_LINK) {
                warn!(holder = %self.name, grace_ms = self.cfg.carrier_grace.as_millis() as u64, "no carrier for longer than the renew deadline; stepping down");
            }
            self.gates.set(GATE_LINK, link_ok);
        }
        let fence_left = self.fence_left(now);
        let present = match self.kernel.addresses(None).await {
            Ok(p) => {
                if let Some(r) = self.quiet.clear(&Quiet::ListAddresses, now) {
                    info!(holder = %self.name, "listing addresses works again{r}");
                }
                p
            }
            Err(e) => {
                if let Some(r) = self.quiet.observe(Quiet::ListAddresses, e.to_string(), now) {
                    warn!(holder = %self.name, error = %e, "cannot list addresses{r}");
                }
                return;
            }
        };
        let desired = self.desired();
        let held_back = self.held_back();
        let steps_for = |present: &[AddrInfo]| {
            let mut steps = plan(&desired, present, fence_left);
            if fence_left.is_some() {
                // A VIP refused for a conflict whose removal failed goes now.
                steps.extend(plan(&held_back, present, None));
            }
            steps
        };
        let mut steps = steps_for(&present);
        if steps.iter().any(|s| matches!(s, Step::Add { .. })) {
            // Confirm with a dump of our own before calling a VIP missing: a shared or
            // concurrent dump can miss entries while other holders add addresses.
            match self.kernel.addresses_fresh(None).await {
                Ok(p) => steps = steps_for(&p),
                Err(e) => debug!(holder = %self.name, error = %e, "cannot re-list addresses"),
            }
        }
        let mut repaired = false;
        for step in steps {
            match step {
                Step::Add {
                    vip,
                    ifindex,
                    valid_lft_secs,
                } => {
                    if let Some(r) =
                        self.quiet
                            .observe(Quiet::Missing(vip.addr), String::new(), now)
                    {
                        warn!(holder = %self.name, %vip, ifindex, "VIP missing while leading; re-adding{r}");
                    }
                    match self
                        .kernel
                        .add_or_refresh(ifindex, vip, valid_lft_secs, self.cfg.skip_dad)
                        .await
                    {
                        Ok(()) => {
                            repaired = true;
                            // A VIP missing again later is news.
                            self.quiet.clear(&Quiet::Missing(vip.addr), now);
                            if let Some(r) = self.quiet.clear(&Quiet::Add(vip.addr), now) {
                                info!(holder = %self.name, %vip, "re-adding the VIP worked{r}");
                            }
                        }
                        Err(e) => {
                            if let Some(r) =
                                self.quiet.observe(Quiet::Add(vip.addr), e.to_string(), now)
                            {
                                error!(holder = %self.name, %vip, ifindex, error = %e, "re-adding VIP failed{r}")
                            }
                        }
                    }
                }
                Step::Remove { vip, ifindex } => match self.kernel.remove(ifindex, vip).await {
                    Ok(()) => {
                        if let Some(r) = self.quiet.clear(&Quiet::Remove(vip.addr), now) {
                            info!(holder = %self.name, %vip, "VIP removed after failures{r}");
                        }
                    }
                    Err(e) => {
                        if let Some(r) =
                            self.quiet
                                .observe(Quiet::Remove(vip.addr), e.to_string(), now)
                        {
                            warn!(holder = %self.name, %vip, ifindex, error = %e, "removing VIP failed{r}");
                        }
                    }
                },
            }
        }
        if renewed_at.is_some() && (repaired || !self.pending_na.is_empty()) {
            self.announce_all(repaired).await;
        }
    }

    /// When the next repeat of the announcements is due: `arp_rate` after the last one,
    /// while leading.
    fn next_garp(&self) -> Option<Instant> {
        self.renewed_at?;
        Some(self.last_garp? + self.cfg.arp_rate)
    }

    /// Removes every VIP of this holder that is ours, wherever it is.
    async fn drop_all(&mut self) -> bool {
        self.pending_na.clear();
        self.last_garp = None;
        self.unwatch_all();
        for p in &mut self.probes {
            p.follow();
        }
        self.publish_conflicts();
        let desired: Vec<(Vip, u32)> = self.vips.iter().map(|s| (s.vip, 0)).collect();
        // Remove, then list again to confirm; a few quick tries ride out transient
        // netlink errors.
        for attempt in 0..DROP_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(DROP_RETRY).await;
            }
            let present = match self.kernel.addresses(None).await {
                Ok(p) => p,
                Err(e) => {
                    warn!(holder = %self.name, error = %e, "cannot list addresses to drop VIPs; retrying");
                    continue;
                }
            };
            let steps = plan(&desired, &present, None);
            if steps.is_empty() {
                return true;
            }
            for step in steps {
                if let Step::Remove { vip, ifindex } = step {
                    match self.kernel.remove(ifindex, vip).await {
                        Ok(()) => info!(holder = %self.name, %vip, "VIP removed"),
                        Err(e) => {
                            warn!(holder = %self.name, %vip, error = %e, "removing VIP failed; retrying")
                        }
                    }
                }
            }
        }
        error!(holder = %self.name, "could not confirm the VIPs are removed; not acknowledging, so the lease is not released and expires after the kernel fence removes them");
        false
    }
}

/// A random number in 0..1000 (for back-off jitter), from the standard library's randomly
/// keyed hasher: no RNG crate needed for this.
fn random_permille() -> u32 {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    u32::try_from(r % 1000).unwrap_or(0)
}

#[cfg(test)]
mod tests;
