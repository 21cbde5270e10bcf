//! Lease leader election: client-go `tools/leaderelection` semantics, plus a watch on the
//! Lease so that a released lease is taken within one API round trip and an expired one at
//! its expiry instead of at the next poll.
//!
//! * [`record`]: the record in the Lease and the pure rules (who may write what, when).
//! * [`LeaseClient`]: the small trait every Lease access goes through; [`kube::KubeLeaseClient`]
//!   implements it against the API server, tests use a fake.
//! * [`Elector`]: the campaign/renew loop. It publishes [`LeaderState`] on a `watch` channel;
//!   the VIP holder follows it and acknowledges each dropped term, and only after that
//!   acknowledgement does the elector release the lease (never two holders). Its state is
//!   declared here; `run.rs` holds the loop (timers, watch events, stepping down) and
//!   `attempt.rs` one `tryAcquireOrRenew` step and the lease calls' bookkeeping.
//! * [`Gates`]: local conditions (link carrier, local API server health) that make a node
//!   step down and stop campaigning until they are good again.
//!
//! # Duplicate identity (two processes with the same node name)
//! A Lease that names our identity counts as ours only if this process wrote it
//! ([`record::OwnWrites`]). One found at start (our own crashed predecessor, or another vipd
//! running under the same `vip_nodename`) is treated as held by another node: taken once it
//! expires under the usual rule (lease duration after it last changed), so a restart retakes
//! its stale lease after at most one lease duration while a live twin keeps it. When such a
//! record *changes* while we did not write it, another process is renewing under our
//! identity: the elector logs an ERROR once, counts every such write
//! (`vipd_duplicate_identity_total`), and publishes [`DuplicateIdentity`] on
//! [`Elector::duplicate_identity`] (the manager fails `/readyz` and posts a Warning Event). A
//! holder that sees such a write steps down at once without releasing the lease (the twin
//! holds it) and campaigns again only after the lease expired. The condition clears as soon
//! as the lease no longer shows another process's write under our identity: when this
//! process acquires it after it expired, or when it is released, deleted or held by a
//! different identity.

mod attempt;
pub(crate) mod failback;
pub(crate) mod identity;
pub mod kube;
pub mod local;
pub mod metrics;
pub(crate) mod outage;
pub mod own_runtime;
pub mod record;
pub mod ridemark;
mod run;
pub mod spread;

use crate::lease::Timing;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub(crate) use attempt::timed;
pub use record::{LeaseRecord, Observed, OwnWrites, Standing};

/// Errors of one Lease API call.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum LeaseError {
    /// The write's `resourceVersion` precondition failed (HTTP 409 Conflict): somebody else
    /// wrote the Lease since we read it.
    #[error("lease {lease}: conflict, it changed since it was read (409)")]
    Conflict {
        /// `namespace/name` of the Lease.
        lease: String,
    },
    /// Create failed because the Lease exists (HTTP 409 AlreadyExists).
    #[error("lease {lease}: already exists")]
    AlreadyExists {
        /// `namespace/name` of the Lease.
        lease: String,
    },
    /// The call did not finish within its own timeout.
    #[error("lease {lease}: {op} timed out after {timeout_ms} ms")]
    Timeout {
        /// `namespace/name` of the Lease.
        lease: String,
        /// `get`, `create`, `update`.
        op: &'static str,
        /// The timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// Any other API or transport failure, with the server's or client's message.
    #[error("lease {lease}: {op} failed: {message}")]
    Api {
        /// `namespace/name` of the Lease.
        lease: String,
        /// `get`, `create`, `update`.
        op: &'static str,
        /// The HTTP status the server answered with; `None`: no answer (a transport
        /// failure). See [`LeaseError::unreachable`].
        status: Option<u16>,
        /// What went wrong (includes HTTP status and reason for API errors, e.g. 403
        /// Forbidden names the verb and resource).
        message: String,
    },
}

/// One change seen on the Lease's watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The Lease was created or changed (or listed when the watch (re)started).
    Changed(Observed),
    /// The Lease was deleted, or a (re)started watch found none.
    Deleted,
    /// The watch failed; it retries by itself with backoff. Until the next good event the
    /// elector also polls at the retry period.
    Error(String),
}

/// Access to one Lease. Implementations do no retries and no timeouts of their own: the
/// elector wraps every call in its own timeout and decides about retries.
pub trait LeaseClient: Send + Sync + 'static {
    /// `namespace/name`, for logs and errors.
    fn describe(&self) -> String;
    /// Reads the Lease; `Ok(None)` when it does not exist (404).
    fn get(&self) -> impl Future<Output = Result<Option<Observed>, LeaseError>> + Send;
    /// Creates the Lease with this record; [`LeaseError::AlreadyExists`] when it exists.
    fn create(
        &self,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<Observed, LeaseError>> + Send;
    /// Replaces the record, on condition that the Lease is still at `resource_version`;
    /// [`LeaseError::Conflict`] when it is not.
    fn update(
        &self,
        record: &LeaseRecord,
        resource_version: &str,
    ) -> impl Future<Output = Result<Observed, LeaseError>> + Send;
    /// A never-ending stream of changes of this Lease (restarts by itself after errors).
    fn watch(&self) -> BoxStream<'static, LeaseEvent>;
}

/// Another process writes the lease under this elector's identity (two nodes configured
/// with the same node name). Published by [`Elector::duplicate_identity`] while it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateIdentity {
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// The identity both processes use (`vip_nodename`).
    pub identity: String,
}

/// Leadership as published by the [`Elector`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderState {
    /// Not leading. `holder` is the current holder as last seen, if any.
    Following {
        /// Identity of the node that holds the lease, when known and held.
        holder: Option<String>,
    },
    /// Leading. `term` grows with every acquisition; `renewed_at` is the monotonic instant
    /// the last successful acquire/renew request was sent (the VIP holder refreshes the
    /// kernel fence on each change of it, for no longer than the lease still covers).
    Leading {
        /// Acquisition counter of this process, starting at 1.
        term: u64,
        /// When the request of our last successful lease write was sent.
        renewed_at: Instant,
        /// This term began by taking a lease that this process saw held by another holder
        /// and then released (vipd releases only after its VIP holder confirmed the VIPs
        /// gone): a handover, so nobody else can still answer for the VIPs and the conflict
        /// probe may be skipped. `false` for a lease taken after expiry, created, found under
        /// our own name, or found already released at start (after a restart, where a
        /// misconfigured second vipd may be answering): those are probed.
        clean: bool,
    },
}

impl LeaderState {
    /// `true` when leading.
    #[cfg(test)]
    pub(crate) fn is_leading(&self) -> bool {
        matches!(self, LeaderState::Leading { .. })
    }
}

/// Gate name the VIP holder keeps closed from its creation until its first local checks
/// (interface found, VIP not on the node untagged) have run, so the elector never
/// campaigns before them: a node that cannot carry the VIP must not take the lease, not
/// even briefly.
pub const GATE_STARTING: &str = "starting";

/// Named local conditions that all have to be good for a node to hold or seek the lease,
/// e.g. `link` (carrier on the VIP interface) and `local-api` (the node's own API server
/// answers its health check). A gate that closes makes the holder step down and release
/// the lease; candidates do not campaign while any gate is closed.
#[derive(Clone, Debug)]
pub struct Gates(Arc<watch::Sender<BTreeMap<String, bool>>>);

impl Default for Gates {
    fn default() -> Self {
        Gates(Arc::new(watch::Sender::new(BTreeMap::new())))
    }
}

impl Gates {
    /// Sets gate `name` open (`true`) or closed; creates it when new. Only notifies on change.
    pub fn set(&self, name: &str, open: bool) {
        self.0
            .send_if_modified(|m| m.insert(name.to_string(), open) != Some(open));
    }

    /// Names of the closed gates.
    pub fn closed(&self) -> Vec<String> {
        closed(&self.0.borrow())
    }

    /// A receiver that sees every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<BTreeMap<String, bool>> {
        self.0.subscribe()
    }
}

fn closed(m: &BTreeMap<String, bool>) -> Vec<String> {
    m.iter()
        .filter(|(_, open)| !**open)
        .map(|(k, _)| k.clone())
        .collect()
}

/// The other end of an [`Elector`]: what the VIP holder (or any follower of leadership) uses.
pub struct Leadership {
    /// Current leadership; changes on acquire, every renew and on loss.
    pub state: watch::Receiver<LeaderState>,
    /// The follower writes here the last `term` whose VIPs it has dropped. The elector
    /// waits for this acknowledgement (up to [`ACK_TIMEOUT`]) before it releases the lease.
    pub dropped: watch::Sender<u64>,
}

/// The follower of an elector whose leading holds nothing that must go before the release
/// (the lease collector, tests): acknowledges every term as soon as it ends, so the elector
/// releases the lease at once on a step-down or a clean stop instead of leaving it to
/// expire after [`ACK_TIMEOUT`]. Ends when the elector does.
pub(crate) async fn acknowledge_terms(mut leadership: Leadership) {
    let mut term = None;
    loop {
        match *leadership.state.borrow_and_update() {
            LeaderState::Leading { term: t, .. } => term = Some(t),
            LeaderState::Following { .. } => {
                if let Some(t) = term.take() {
                    leadership.dropped.send_replace(t);
                }
            }
        }
        if leadership.state.changed().await.is_err() {
            return;
        }
    }
}

/// How long the elector waits for the VIP holder to confirm it dropped the VIPs before it
/// releases the lease. Without the confirmation it does not release: the lease then expires
/// normally, after the kernel fence removed the addresses.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a candidate re-reads a lease held by another node while its watch works. The
/// watch delivers every renewal; correctness never depends on this poll (every write is
/// conditional on the resourceVersion), it only bounds how long a silently stalled watch
/// can hide a change.
pub(crate) const HEALTHY_WATCH_POLL: Duration = Duration::from_secs(30);

/// Capped exponential back-off between failed campaign attempts (also between failed
/// Node label checks, [`crate::nodes::label`]).
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `base`, doubles after every delay handed out, up to `max`.
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            next: base,
        }
    }
    /// The delay before the next retry.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
    /// Back to `base` (after a success).
    pub(crate) fn reset(&mut self) {
        self.next = self.base;
    }
}

const SHUTTING_DOWN: &str = "shutting down";

/// How an [`Elector::run`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionEnd {
    /// This node held the lease and released it on the way out.
    pub released: bool,
    /// The lease as last seen (after the release, when there was one).
    pub observed: Option<Observed>,
    /// When `observed` was last seen to change, on this node's monotonic clock (expiry of a
    /// held lease is judged from here, see [`record::standing`]).
    pub observed_at: Instant,
    /// Set when the lease was deleted while another node held it: that node may carry the
    /// VIPs until this instant (see the elector's rule for creating it again).
    pub absent_until: Option<Instant>,
    /// The writes this run made (or may have made: answers lost) to the lease, which tell
    /// its own records from those another process wrote under the same identity
    /// ([`OwnWrites::is_ours`]; see the stopped group's second lease delete).
    pub own: OwnWrites,
}

/// Leader election for one Lease and one identity.
pub struct Elector<C: LeaseClient> {
    client: C,
    identity: String,
    timing: Timing,
    state_tx: Arc<watch::Sender<LeaderState>>,
    dropped_rx: watch::Receiver<u64>,
    gates: watch::Receiver<BTreeMap<String, bool>>,
    metrics: Option<Arc<metrics::LeaseMetrics>>,
    duplicate_tx: watch::Sender<Option<DuplicateIdentity>>,
    /// Rate limiter of failed-call lines, keyed by whether the call was a renewal (see
    /// [`crate::obs::logging`]): a Lease API down for minutes logs once a minute, not at every
    /// back-off step.
    quiet: crate::obs::logging::RepeatLimiter<bool, String>,
    /// The outage log shared with the other leases of the wing ([`Elector::with_outage`]);
    /// `None`: this elector logs its unanswered calls itself (`quiet`).
    outage: Option<outage::ApiOutage>,
    /// Asked before every acquisition (see [`Elector::with_acquire_check`]).
    acquire_check: Option<AcquireCheck>,
    /// Delays acquisitions by the leases this node holds (see [`Elector::with_spread`]).
    spread: Option<Arc<spread::Spread>>,
    /// An extra delay before acquisitions (see [`Elector::with_preference`]).
    preference: Option<watch::Receiver<Duration>>,
    /// Ride-through of API outages (see [`RideLink`]); `None`: today's rules only.
    ride: Option<Arc<dyn RideLink>>,
    /// Bumped by the ride link when this node reaches the API again: renew at once.
    api_back: Option<watch::Receiver<u64>>,
    /// Bumped by the ride link on hand-over news ([`RideLink::news`]).
    ride_news: Option<watch::Receiver<u64>>,
    /// Fail-back to more preferred nodes (see [`Elector::with_failback`]); `None`: off.
    failback: Option<failback::FailbackLink>,
    /// The node of each fail-back hand-over this holder made (see [`Elector::failbacks`]).
    failback_tx: watch::Sender<Option<String>>,
}

/// The ride-through seam of a Service lease's elector ([`crate::peer`], `svc_ridethrough`). With a
/// link, the elector
/// * reports every successful lease write ([`RideLink::renewed`], before it publishes
///   [`LeaderState::Leading`]) and every confirmed drop of the VIPs ([`RideLink::dropped`]);
/// * lets the link raise the published `renewed_at` of the current term (a ride-through
///   grant, see [`RideLink::attach`]);
/// * keeps leading past the renew deadline for as long as the published `renewed_at`
///   covers (`renewed_at + lease duration - FENCE_MARGIN`: exactly when the VIP holder's
///   [`crate::lease::fence_lapsed`] removes the VIPs), retrying renewals meanwhile;
/// * acquires only what [`RideLink::may_acquire`] allows (takeover with consent);
/// * tells the link what it observes of the lease while not leading
///   ([`RideLink::observe`], so that the link can ask a holder cut off from the API to hand
///   over), and on [`RideLink::news`] steps down at once when the link says a peer asked for
///   the lease ([`RideLink::hand_over_requested`]), or takes a lease whose holder handed
///   this very version over ([`RideLink::handed_over`]) without waiting for its expiry.
pub(crate) trait RideLink: Send + Sync {
    /// The elector's state channel: the link may raise `renewed_at` of a `Leading` state
    /// of the term it was told about (and nothing else).
    fn attach(&self, state: Arc<watch::Sender<LeaderState>>);
    /// A lease write of `term` succeeded; its request was sent at `sent`; the lease is now
    /// at `resource_version`.
    fn renewed(&self, term: u64, resource_version: &str, sent: Instant);
    /// The holder confirmed the VIPs of the last term gone.
    fn dropped(&self);
    /// Whether this candidate may acquire the lease it observed as `observed` (changed last
    /// at `observed_at`, `None`: absent).
    fn may_acquire(&self, now: Instant, observed: Option<&Observed>, observed_at: Instant) -> bool;
    /// Bumped when this node reaches the API server again after it could not.
    fn api_back(&self) -> watch::Receiver<u64>;
    /// What this node, not leading, last observed of the lease (`None`: absent or not
    /// known), changed last at `observed_at`.
    fn observe(&self, observed: Option<&Observed>, observed_at: Instant);
    /// The holder named in `observed` released this very version to its peers after its
    /// VIPs were gone (`Released`): it may be taken now, expired or not.
    fn handed_over(&self, observed: &Observed) -> bool;
    /// `Some(asking node)` while a peer asks this holder for the lease and this node cannot
    /// reach the API server: step down at once (the link sends `Released` once the drop of
    /// the VIPs is confirmed, [`RideLink::dropped`]).
    fn hand_over_requested(&self) -> Option<String>;
    /// Bumped when [`RideLink::hand_over_requested`] or [`RideLink::handed_over`] may have
    /// become true.
    fn news(&self) -> watch::Receiver<u64>;
    /// Asked for every lease write this elector builds: `Some(longest ride past expiry)`
    /// when this holder may ride through on it (written as the Lease's
    /// [`ridemark::RIDE_THROUGH_ANNOTATION`]), `None` when not (no peer key). The link
    /// must ride only on writes it answered `Some` for (the next [`RideLink::renewed`]).
    fn ride_cap(&self) -> Option<Duration> {
        None
    }
}

/// Asked before this node acquires the lease (creates it, or takes it over after it was
/// released or expired), never before a renewal: `false` skips the attempt, which is retried
/// a retry period later. The Services side confirms with the API server that a Service
/// still names the lease, so a node acting on a stale cache (frozen, partitioned, re-watching
/// after an outage) cannot resurrect a deleted Service's address.
pub(crate) type AcquireCheck =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, bool> + Send + Sync>;

/// Mutable state of a running elector.
struct Run {
    observed: Option<Observed>,
    /// Whether `observed` reflects the server (false until the first read, and after a
    /// conflict).
    known: bool,
    observed_at: Instant,
    leading: Option<(u64, Instant)>,
    term: u64,
    next_attempt: Instant,
    watch_healthy: bool,
    backoff: Backoff,
    /// After the Lease was deleted while another node held it: not before this instant may
    /// we create it (that node may still carry the VIPs until its own watch or its kernel
    /// fence removes them).
    absent_until: Option<Instant>,
    /// This process saw the lease held by another holder since it last wrote it itself: a
    /// release seen after that is a handover from that holder (see `LeaderState::Leading`'s
    /// `clean`), not a release found at start (ours from before a restart, or one that a
    /// misconfigured second vipd may answer for).
    seen_other_holder: bool,
    /// When this node last found the lease free to acquire (absent, released or expired)
    /// since it was last held by anyone: the spread delay counts from here.
    free_since: Option<Instant>,
    /// The writes this process made: a record naming our identity is ours only if it is
    /// one of them.
    own: OwnWrites,
    /// Holder: the fail-back request in the lease and when this term first saw it.
    failback_seen: Option<(String, Instant)>,
    /// Candidate: when it last wrote a fail-back request (asked again at most once per
    /// hold-down, so nodes with different views of the preferred nodes cannot ping-pong).
    failback_asked: Option<Instant>,
    /// Whether this process has read the lease (present or absent) from the server, or
    /// written it: only a change after that proves a second process under our identity.
    /// The first state seen may be our own predecessor's, and watch events that arrive
    /// before the first read may be late ones of writes made before this process started
    /// (a shared watch that lags), so they do not count.
    ever_observed: bool,
    /// When this run started (wall clock, whole microseconds as a Lease stores it): a
    /// record first seen through the watch counts as observed (so that its next change
    /// proves a twin) only when it was written after this, never a late event of a write
    /// made before this process ran.
    started: k8s_openapi::jiff::Timestamp,
}

impl<C: LeaseClient> Elector<C> {
    /// Creates an elector; `gates` are the local conditions (see [`Gates`]). Returns the
    /// elector (run it with [`Elector::run`]) and the [`Leadership`] end for the VIP holder.
    pub fn new(client: C, identity: String, timing: Timing, gates: &Gates) -> (Self, Leadership) {
        let (state_tx, state_rx) = watch::channel(LeaderState::Following { holder: None });
        let (dropped_tx, dropped_rx) = watch::channel(0u64);
        (
            Elector {
                client,
                identity,
                timing,
                state_tx: Arc::new(state_tx),
                dropped_rx,
                gates: gates.subscribe(),
                metrics: None,
                duplicate_tx: watch::Sender::new(None),
                quiet: crate::obs::logging::RepeatLimiter::default(),
                outage: None,
                acquire_check: None,
                spread: None,
                preference: None,
                ride: None,
                api_back: None,
                ride_news: None,
                failback: None,
                failback_tx: watch::Sender::new(None),
            },
            Leadership {
                state: state_rx,
                dropped: dropped_tx,
            },
        )
    }

    /// Asks `check` before every acquisition (see [`AcquireCheck`]).
    pub fn with_acquire_check(mut self, check: AcquireCheck) -> Self {
        self.acquire_check = Some(check);
        self
    }

    /// Spreads leases over nodes without preemption: every acquisition waits
    /// [`spread::Spread::not_before`] (longer the more leases this node holds among those
    /// sharing `spread`), and each term is counted in it while it lasts. Renewals never
    /// wait.
    pub(crate) fn with_spread(mut self, spread: Arc<spread::Spread>) -> Self {
        self.spread = Some(spread);
        self
    }

    /// Delays every acquisition by the current value of `delay` on top of the spread delay,
    /// counted from when the lease was seen free (a Service's preferred nodes, see
    /// [`spread::preference_delay`]). Renewals never wait.
    pub(crate) fn with_preference(mut self, delay: watch::Receiver<Duration>) -> Self {
        self.preference = Some(delay);
        self
    }

    /// Fails back to more preferred nodes (see [`failback`]): as a candidate, asks a less
    /// preferred holder for the lease; as a holder, hands over gracefully to a more
    /// preferred node whose request stood for the hold-down. Never preempts.
    pub(crate) fn with_failback(mut self, link: failback::FailbackLink) -> Self {
        self.failback = Some(link);
        self
    }

    /// The node of the last fail-back hand-over of this elector (notified at each one,
    /// after the lease was released). Subscribe before [`Elector::run`].
    pub(crate) fn failbacks(&self) -> watch::Receiver<Option<String>> {
        self.failback_tx.subscribe()
    }

    /// Logs unanswered lease calls into `outage`, shared with the wing's other leases: one
    /// line per API outage instead of one per lease ([`outage`]).
    pub(crate) fn with_outage(mut self, outage: outage::ApiOutage) -> Self {
        self.outage = Some(outage);
        self
    }

    /// Rides through API outages with `link` (see [`RideLink`]).
    pub(crate) fn with_ride(mut self, link: Arc<dyn RideLink>) -> Self {
        link.attach(self.state_tx.clone());
        self.api_back = Some(link.api_back());
        self.ride_news = Some(link.news());
        self.ride = Some(link);
        self
    }

    /// Until when a leader keeps leading without a renewal: the renew deadline after the
    /// last successful write's send; with a ride link, at least as long as the published
    /// `renewed_at` covers (the holder's fence, [`crate::lease::fence_lapsed`]).
    pub(crate) fn lead_end(&self, last_renew: Instant) -> Instant {
        let deadline = last_renew + self.timing.renew_deadline;
        if self.ride.is_none() {
            return deadline;
        }
        match *self.state_tx.borrow() {
            LeaderState::Leading { renewed_at, .. } => deadline.max(
                renewed_at
                    + self
                        .timing
                        .lease_duration
                        .saturating_sub(crate::lease::FENCE_MARGIN),
            ),
            LeaderState::Following { .. } => deadline,
        }
    }

    /// Reports leadership, transitions, failovers and renew latency / failures to
    /// `metrics`, labelled with the lease (`namespace/name`).
    pub(crate) fn with_metrics(mut self, metrics: &crate::obs::metrics::Metrics) -> Self {
        self.metrics = Some(metrics.families::<metrics::LeaseMetrics>());
        self
    }

    /// The duplicate-identity condition of this lease (see the module docs): `Some` while
    /// another process writes it under our identity. Subscribe before [`Elector::run`].
    pub(crate) fn duplicate_identity(&self) -> watch::Receiver<Option<DuplicateIdentity>> {
        self.duplicate_tx.subscribe()
    }
}

#[cfg(test)]
mod tests;
