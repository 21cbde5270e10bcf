//! Readiness: what `/readyz` of the admin endpoint checks ([`Readiness`]: configuration,
//! API reachable, election running, no duplicate identity, no stalled watch (see
//! [`WatchActivity`]), and the Service leases riding through an API outage). Set by every
//! layer; served by `vipd manager`'s admin endpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What `/readyz` checks. Cheap to clone; the setters are called by the manager.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<ReadinessInner>);

#[derive(Debug, Default)]
struct ReadinessInner {
    config_valid: AtomicBool,
    api_reachable: AtomicBool,
    election_running: AtomicBool,
    /// Leases (`namespace/name`) that another process writes under this node's identity.
    duplicate_identity: Mutex<BTreeSet<String>>,
    /// The watches whose silence fails readiness (see [`Readiness::track_watches`]).
    watches: Mutex<Vec<WatchActivity>>,
    /// Service leases (`namespace/name`) whose VIPs ride through an API outage
    /// (`svc_ridethrough`).
    riding: Mutex<BTreeSet<String>>,
    /// `svc_ridethrough`'s state while no lease rides (off, keyless, armed); `None` without
    /// Services.
    ride_state: Mutex<Option<&'static str>>,
}

/// Name of the `/readyz` line listing the Service leases that ride through an API outage.
pub(crate) const RIDING_THROUGH: &str = "riding-through";

/// Name of the `/readyz` line with `svc_ridethrough`'s state while no lease rides.
pub(crate) const RIDE_THROUGH: &str = "ride-through";

/// Name of the readiness condition that fails while another process writes a lease under
/// this node's identity (see [`crate::election::DuplicateIdentity`]).
pub(crate) const DUPLICATE_IDENTITY: &str = "duplicate-identity";

impl Readiness {
    /// All conditions false.
    pub fn new() -> Self {
        Self::default()
    }
    /// The configuration was resolved and validated.
    pub(crate) fn set_config_valid(&self, v: bool) {
        self.0.config_valid.store(v, Ordering::Relaxed);
    }
    /// The API server answered the last check.
    pub(crate) fn set_api_reachable(&self, v: bool) {
        self.0.api_reachable.store(v, Ordering::Relaxed);
    }
    /// The leader election loop runs (leading or following).
    pub(crate) fn set_election_running(&self, v: bool) {
        self.0.election_running.store(v, Ordering::Relaxed);
    }
    /// Marks (`true`) or clears lease `lease` (`namespace/name`) as written under this
    /// node's identity by another process.
    pub(crate) fn set_duplicate_identity(&self, lease: &str, duplicate: bool) {
        let mut set = self
            .0
            .duplicate_identity
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if duplicate {
            set.insert(lease.to_string());
        } else {
            set.remove(lease);
        }
    }
    /// Marks (`true`) or clears Service lease `lease` (`namespace/name`) as riding through
    /// an API outage: while any lease rides, an unreachable API does not fail readiness
    /// (the data plane is served as designed) and `/readyz` names the leases
    /// ([`RIDING_THROUGH`]).
    pub(crate) fn set_riding(&self, lease: &str, riding: bool) {
        let mut set = self.0.riding.lock().unwrap_or_else(|p| p.into_inner());
        if riding {
            set.insert(lease.to_string());
        } else {
            set.remove(lease);
        }
    }
    /// `svc_ridethrough`'s state while no lease rides (`off ...`, `keyless ...`, `armed
    /// ...`), shown as a [`RIDE_THROUGH`] line of `/readyz`; `None`: no line.
    pub(crate) fn set_ride_state(&self, state: Option<&'static str>) {
        *self.0.ride_state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }
    /// Service leases riding through an API outage, sorted.
    pub(crate) fn riding_leases(&self) -> Vec<String> {
        self.0
            .riding
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
    /// Leases another process writes under this node's identity, sorted.
    pub(crate) fn duplicate_identity_leases(&self) -> Vec<String> {
        self.0
            .duplicate_identity
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
    /// Makes readiness fail while one of `watches`' watches is stalled (see
    /// [`WatchActivity::stalled`]); the condition is named [`WATCH_STALLED`]`:<watch>`.
    pub(crate) fn track_watches(&self, watches: WatchActivity) {
        if let Ok(mut w) = self.0.watches.lock() {
            w.push(watches);
        }
    }
    /// Watches stalled now, with how long each has been silent, sorted by name.
    pub(crate) fn stalled_watches(&self) -> Vec<(String, Duration)> {
        let now = Instant::now();
        let mut out: Vec<_> = self
            .0
            .watches
            .lock()
            .map(|w| w.iter().flat_map(|a| a.stalled(now)).collect())
            .unwrap_or_default();
        out.sort();
        out
    }
    /// The conditions that are not met, by name (`config`, `api` unless a Service lease
    /// rides through, `election`, [`DUPLICATE_IDENTITY`], `watch-stalled:<watch>` per
    /// stalled watch); empty = ready.
    pub fn missing(&self) -> Vec<String> {
        let mut m = Vec::new();
        if !self.0.config_valid.load(Ordering::Relaxed) {
            m.push("config".to_string());
        }
        if !self.0.api_reachable.load(Ordering::Relaxed) && self.riding_leases().is_empty() {
            m.push("api".to_string());
        }
        if !self.0.election_running.load(Ordering::Relaxed) {
            m.push("election".to_string());
        }
        if !self.duplicate_identity_leases().is_empty() {
            m.push(DUPLICATE_IDENTITY.to_string());
        }
        for (watch, _) in self.stalled_watches() {
            m.push(format!("{WATCH_STALLED}:{watch}"));
        }
        m
    }
    /// The `/readyz` body: `ok`, or the missing conditions, with the leases of a duplicate
    /// identity named; then, while Service leases ride through an API outage, a
    /// [`RIDING_THROUGH`] line naming them.
    pub fn report(&self) -> String {
        let missing = self.missing();
        let mut body = if missing.is_empty() {
            "ok\n".to_string()
        } else {
            format!("not ready: {}\n", missing.join(", "))
        };
        let riding = self.riding_leases();
        let state = *self.0.ride_state.lock().unwrap_or_else(|p| p.into_inner());
        if !riding.is_empty() {
            body.push_str(&format!(
                "{RIDING_THROUGH}: the API server is unreachable; the VIPs of {} Service \
                 lease(s) stay while a majority of the vipd nodes vouch (svc_ridethrough): {}\n",
                riding.len(),
                first_of(riding)
            ));
        } else if let Some(state) = state {
            body.push_str(&format!("{RIDE_THROUGH}: {state}\n"));
        }
        if missing.is_empty() {
            return body;
        }
        let leases = self.duplicate_identity_leases();
        if !leases.is_empty() {
            let list = first_of(leases);
            body.push_str(&format!(
                "{DUPLICATE_IDENTITY}: another process writes lease(s) {list} under this \
                 node's identity; node names (vip_nodename) must be unique\n"
            ));
        }
        for (watch, silent) in self.stalled_watches() {
            body.push_str(&format!(
                "{WATCH_STALLED}:{watch}: no event and no restart for {} s, longer than the \
                 watch's timeout plus {} s (its API connection may be half-open, or the watch \
                 cannot be re-established)\n",
                silent.as_secs(),
                WATCH_STALL_MARGIN.as_secs()
            ));
        }
        body
    }
    /// Whether every condition holds.
    pub(crate) fn is_ready(&self) -> bool {
        self.missing().is_empty()
    }
}

/// The first ten of `names`, comma-separated, with "and N more" for the rest.
fn first_of(names: Vec<String>) -> String {
    const SHOWN: usize = 10;
    let more = names.len().saturating_sub(SHOWN);
    let mut list = names.into_iter().take(SHOWN).collect::<Vec<_>>().join(", ");
    if more > 0 {
        list.push_str(&format!(" and {more} more"));
    }
    list
}

/// Prefix of the readiness condition of a stalled watch: `watch-stalled:services`.
pub(crate) const WATCH_STALLED: &str = "watch-stalled";

/// How much longer than its timeout a watch may stay silent before it counts as stalled
/// (room for the restart's request and a busy API server).
pub(crate) const WATCH_STALL_MARGIN: Duration = Duration::from_secs(15);

/// The stalled watches among `watches` (name, time of the last activity, timeout): those
/// silent for longer than their timeout plus `margin` at `now`, with how long each has been
/// silent, in the order given. A watch's activity is any event it delivered and any
/// successful (re)start; a healthy watch whose server ends it after `timeout` restarts at
/// least that often, so silence past `timeout + margin` means it hangs (typically on a
/// half-open connection) or cannot be re-established. A last activity later than `now`
/// counts as silent for zero.
pub(crate) fn stalled_watches<'a>(
    watches: impl IntoIterator<Item = (&'a str, Instant, Duration)>,
    now: Instant,
    margin: Duration,
) -> Vec<(&'a str, Duration)> {
    watches
        .into_iter()
        .filter_map(|(name, last, timeout)| {
            let silent = now.saturating_duration_since(last);
            (silent > timeout + margin).then_some((name, silent))
        })
        .collect()
}

/// One watch's bookkeeping in [`WatchActivity`].
#[derive(Debug, Clone, Copy)]
struct WatchEntry {
    /// The server-side timeout the watch runs with.
    timeout: Duration,
    /// Its last event or successful (re)start (registration counts as a start).
    last: Instant,
    /// Whether it was stalled at the last [`WatchActivity::transitions`].
    stalled: bool,
}

/// Last activity of a set of API watches, by name (the resource's plural, e.g. `services`,
/// `leases`), shared by the code that runs them (which reports events) and the HTTP layer
/// of their client (which reports successful (re)starts, see
/// `crate::kube::client::WatchStartLayer`). Cheap to clone; only registered watches are tracked.
#[derive(Debug, Clone, Default)]
pub struct WatchActivity(Arc<Mutex<BTreeMap<String, WatchEntry>>>);

impl WatchActivity {
    /// No watch tracked.
    pub fn new() -> Self {
        Self::default()
    }
    /// Tracks watch `name`, whose server ends it after `timeout`, from now on (registering
    /// counts as its start).
    pub(crate) fn register(&self, name: &str, timeout: Duration) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(
                name.to_string(),
                WatchEntry {
                    timeout,
                    last: Instant::now(),
                    stalled: false,
                },
            );
        }
    }
    /// Records an event or a successful (re)start of watch `name` now; ignored for a watch
    /// that is not registered.
    pub fn touch(&self, name: &str) {
        if let Ok(mut m) = self.0.lock()
            && let Some(e) = m.get_mut(name)
        {
            e.last = Instant::now();
        }
    }
    /// The watches stalled at `now` (see [`stalled_watches`], margin
    /// [`WATCH_STALL_MARGIN`]), with how long each has been silent, sorted by name.
    pub fn stalled(&self, now: Instant) -> Vec<(String, Duration)> {
        let Ok(m) = self.0.lock() else {
            return Vec::new();
        };
        stalled_watches(
            m.iter().map(|(n, e)| (n.as_str(), e.last, e.timeout)),
            now,
            WATCH_STALL_MARGIN,
        )
        .into_iter()
        .map(|(n, d)| (n.to_string(), d))
        .collect()
    }
    /// Watches that became stalled and watches that recovered since the last call, each
    /// with how long it has been (or had been) silent.
    pub(crate) fn transitions(&self, now: Instant) -> (Vec<(String, Duration)>, Vec<String>) {
        let stalled = self.stalled(now);
        let (mut became, mut recovered) = (Vec::new(), Vec::new());
        if let Ok(mut m) = self.0.lock() {
            for (name, e) in m.iter_mut() {
                let s = stalled.iter().find(|(n, _)| n == name);
                match (e.stalled, s) {
                    (false, Some((_, silent))) => became.push((name.clone(), *silent)),
                    (true, None) => recovered.push(name.clone()),
                    _ => {}
                }
                e.stalled = s.is_some();
            }
        }
        (became, recovered)
    }
    /// Logs, once per change, each watch that becomes stalled (WARN) or recovers (INFO),
    /// checking every second until `stop` is cancelled.
    pub(crate) fn spawn_monitor(&self, stop: CancellationToken) -> JoinHandle<()> {
        let activity = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let (became, recovered) = activity.transitions(Instant::now());
                for (watch, silent) in became {
                    warn!(
                        watch = %watch,
                        silent_s = silent.as_secs(),
                        "watch stalled: no event and no restart for longer than its timeout \
                         plus {} s; /readyz fails ({WATCH_STALLED}:{watch}) until it recovers",
                        WATCH_STALL_MARGIN.as_secs()
                    );
                }
                for watch in recovered {
                    info!(watch = %watch, "watch no longer stalled");
                }
            }
        })
    }
}
