//! Lease leader election: client-go `tools/leaderelection` semantics, plus a watch on the
//! Lease so that a released lease is taken within one API round trip and an expired one at
//! its expiry instead of at the next poll.
//!
//! * [`record`]: the record in the Lease and the pure rules (who may write what, when).
//! * [`LeaseClient`]: the small trait every Lease access goes through; [`kube::KubeLeaseClient`]
//!   implements it against the API server, tests use a fake.
//! * [`Elector`]: the campaign/renew loop. It publishes [`LeaderState`] on a `watch` channel;
//!   the VIP holder follows it and acknowledges each dropped term, and only after that
//!   acknowledgement does the elector release the lease (never two holders).
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

pub mod kube;
pub mod record;

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

/// Lease timings (client-go `LeaderElectionConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Written as `leaseDurationSeconds` (rounded up to whole seconds): candidates wait this
    /// long after the last observed change before they take the lease.
    pub lease_duration: Duration,
    /// The holder stops leading when it could not renew for this long. Shorter than
    /// `lease_duration`.
    pub renew_deadline: Duration,
    /// Interval between renewals by the holder, and the poll interval of candidates whose
    /// watch is failing. Shorter than `renew_deadline`.
    pub retry_period: Duration,
}

impl Timing {
    /// Timeout of each single Lease API call: half the renew deadline, within 0.5..=5 s, so
    /// a holder gets at least two tries before its renew deadline.
    pub fn call_timeout(&self) -> Duration {
        (self.renew_deadline / 2).clamp(Duration::from_millis(500), Duration::from_secs(5))
    }

    /// Largest back-off between failed campaign attempts: the lease duration (so a node that
    /// lost its API connection gets the lease back within about one lease duration once the
    /// API returns), at least the retry period.
    pub fn max_backoff(&self) -> Duration {
        self.lease_duration.max(self.retry_period)
    }
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
    pub fn is_leading(&self) -> bool {
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
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, bool>> {
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

/// How long the elector waits for the VIP holder to confirm it dropped the VIPs before it
/// releases the lease. Without the confirmation it does not release: the lease then expires
/// normally, after the kernel fence removed the addresses.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a candidate re-reads a lease held by another node while its watch works. The
/// watch delivers every renewal; correctness never depends on this poll (every write is
/// conditional on the resourceVersion), it only bounds how long a silently stalled watch
/// can hide a change.
pub const HEALTHY_WATCH_POLL: Duration = Duration::from_secs(30);

/// Capped exponential back-off between failed campaign attempts.
#[derive(Debug, Clone)]
struct Backoff {
    base: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            next: base,
        }
    }
    fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
    fn reset(&mut self) {
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
}

/// Leader election for one Lease and one identity.
pub struct Elector<C: LeaseClient> {
    client: C,
    identity: String,
    timing: Timing,
    state_tx: watch::Sender<LeaderState>,
    dropped_rx: watch::Receiver<u64>,
    gates: watch::Receiver<BTreeMap<String, bool>>,
    metrics: Option<crate::metrics::Metrics>,
    duplicate_tx: watch::Sender<Option<DuplicateIdentity>>,
    /// Rate limiter of failed-call lines, keyed by whether the call was a renewal (see
    /// [`crate::logging`]): a Lease API down for minutes logs once a minute, not at every
    /// back-off step.
    quiet: crate::logging::RepeatLimiter<bool, String>,
    /// Asked before every acquisition (see [`Elector::with_acquire_check`]).
    acquire_check: Option<AcquireCheck>,
}

/// Asked before this node acquires the lease (creates it, or takes it over after it was
/// released or expired), never before a renewal: `false` skips the attempt, which is retried
/// a retry period later. The Services side confirms with the API server that a Service
/// still names the lease, so a node acting on a stale cache (frozen, partitioned, re-watching
/// after an outage) cannot resurrect a deleted Service's address.
pub type AcquireCheck = Arc<dyn Fn() -> futures::future::BoxFuture<'static, bool> + Send + Sync>;

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
    /// The writes this process made: a record naming our identity is ours only if it is
    /// one of them.
    own: OwnWrites,
    /// Whether this process has read the lease (present or absent) from the server, or
    /// written it: only a change after that proves a second process under our identity.
    /// The first state seen may be our own predecessor's, and watch events that arrive
    /// before the first read may be late ones of writes made before this process started
    /// (a shared watch that lags), so they do not count.
    ever_observed: bool,
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
                state_tx,
                dropped_rx,
                gates: gates.subscribe(),
                metrics: None,
                duplicate_tx: watch::Sender::new(None),
                quiet: crate::logging::RepeatLimiter::default(),
                acquire_check: None,
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

    /// Reports leadership, transitions, failovers and renew latency / failures to
    /// `metrics`, labelled with the lease (`namespace/name`).
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The duplicate-identity condition of this lease (see the module docs): `Some` while
    /// another process writes it under our identity. Subscribe before [`Elector::run`].
    pub fn duplicate_identity(&self) -> watch::Receiver<Option<DuplicateIdentity>> {
        self.duplicate_tx.subscribe()
    }

    /// Campaigns, leads and follows until `shutdown` is cancelled. On shutdown a holder
    /// publishes `Following`, waits for the VIP holder's acknowledgement and releases the
    /// lease (client-go `ReleaseOnCancel`). Never returns before shutdown: API failures are
    /// retried with back-off, a lost lease is campaigned for again.
    pub async fn run(mut self, shutdown: CancellationToken) -> ElectionEnd {
        let lease = self.client.describe();
        info!(%lease, identity = %self.identity, ?self.timing, "leader election starting");
        let mut watch = self.client.watch();
        let now = Instant::now();
        let mut st = Run {
            observed: None,
            known: false,
            observed_at: now,
            leading: None,
            term: 0,
            next_attempt: now,
            watch_healthy: false,
            backoff: Backoff::new(self.timing.retry_period, self.timing.max_backoff()),
            absent_until: None,
            seen_other_holder: false,
            own: OwnWrites::default(),
            ever_observed: false,
        };
        loop {
            let now = Instant::now();
            let closed_before = closed(&self.gates.borrow());
            let open = closed_before.is_empty();
            let wake = self.next_wake(&st, open, now);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    let mut released = false;
                    if st.leading.is_some() {
                        released = Box::pin(self.step_down(&mut st, true, SHUTTING_DOWN)).await;
                    }
                    info!(%lease, "leader election stopped");
                    return ElectionEnd {
                        released,
                        observed: st.observed,
                        observed_at: st.observed_at,
                        absent_until: st.absent_until,
                    };
                }
                ev = watch.next() => {
                    match ev {
                        Some(ev) => Box::pin(self.on_watch_event(&mut st, ev)).await,
                        None => {
                            warn!(%lease, "lease watch ended; restarting it");
                            st.watch_healthy = false;
                            watch = self.client.watch();
                        }
                    }
                }
                changed = self.gates.changed() => {
                    if changed.is_err() {
                        // Gates dropped: treat as all open from now on.
                        continue;
                    }
                    let closed_now = closed(&self.gates.borrow_and_update());
                    // The VIP holder's start-up gate is routine: not worth an info line.
                    let starting_only = |c: &[String]| {
                        c.iter().all(|g| g == GATE_STARTING)
                    };
                    if !closed_now.is_empty() {
                        if st.leading.is_some() {
                            let why = format!("local condition failed: {}", closed_now.join(", "));
                            let _ = Box::pin(self.step_down(&mut st, true, &why)).await;
                        } else if starting_only(&closed_now) {
                            debug!(%lease, "waiting for the VIP holder's first local checks");
                        } else {
                            info!(%lease, gates = ?closed_now, "not campaigning while local conditions fail");
                        }
                    } else if !open {
                        // Only a real change from closed to open (gates are first set open
                        // at start, which is no news).
                        if starting_only(&closed_before) {
                            debug!(%lease, "local checks done; campaigning");
                        } else {
                            info!(%lease, "local conditions good again; campaigning");
                        }
                        st.next_attempt = Instant::now();
                    }
                }
                _ = sleep_until(wake) => {
                    Box::pin(self.on_timer(&mut st, open)).await;
                }
            }
        }
    }

    /// When the loop must next act on its own (without a watch event).
    fn next_wake(&self, st: &Run, open: bool, now: Instant) -> Instant {
        let far = now + Duration::from_secs(3600);
        if let Some((_, last_renew)) = st.leading {
            return st.next_attempt.min(last_renew + self.timing.renew_deadline);
        }
        if !open {
            return far;
        }
        if !st.known {
            return st.next_attempt;
        }
        match record::standing(
            st.observed.as_ref(),
            st.observed_at,
            now,
            &self.identity,
            &st.own,
        ) {
            Standing::HeldByOther { expires_at, .. } => {
                // Act exactly at expiry; re-read in between only as a fallback: every retry
                // period while the watch fails, every HEALTHY_WATCH_POLL while it works
                // (with hundreds of per-Service leases, polls would dominate API load).
                let poll_at = if st.watch_healthy {
                    st.next_attempt + HEALTHY_WATCH_POLL
                } else {
                    st.next_attempt
                };
                expires_at.min(poll_at)
            }
            _ => st.next_attempt,
        }
    }

    /// Publishes `Following { holder }` and logs it once per change of holder.
    fn publish_following(&self, holder: &str) {
        let lease = self.client.describe();
        let changed = self.state_tx.send_if_modified(|s| {
            let new = LeaderState::Following {
                holder: Some(holder.to_string()),
            };
            if *s != new {
                *s = new;
                true
            } else {
                false
            }
        });
        if changed && holder == self.identity {
            info!(
                %lease,
                %holder,
                "following: the lease names this node's identity but this process \
                 did not write it (an earlier run of vipd on this node, or another \
                 vipd with the same node name); taking it only once it expires"
            );
        } else if changed {
            info!(%lease, %holder, "following");
        }
    }

    async fn on_watch_event(&mut self, st: &mut Run, ev: LeaseEvent) {
        let lease = self.client.describe();
        match ev {
            LeaseEvent::Changed(obs) => {
                st.watch_healthy = true;
                if let Some(cur) = &st.observed
                    && (cur.is_newer_than(&obs) || *cur == obs)
                {
                    return;
                }
                debug!(%lease, holder = %obs.record.holder, rv = %obs.resource_version, "lease changed");
                self.check_identity(st, Some(&obs));
                st.absent_until = None;
                let other = record::held_by_another(&obs, &self.identity, &st.own);
                let twin = record::foreign_under_identity(&obs, &self.identity, &st.own);
                let released = !obs.record.is_held();
                st.seen_other_holder |= other;
                st.observed = Some(obs);
                st.known = true;
                st.observed_at = Instant::now();
                if st.leading.is_some() && (other || released) {
                    // Never released here: whoever wrote the lease holds it now.
                    let why = if twin {
                        "another process wrote the lease under this node's identity \
                         (duplicate identity); not releasing it"
                    } else if other {
                        "another holder was written into the lease"
                    } else {
                        "the lease was released by someone else"
                    };
                    let _ = self.step_down(st, false, why).await;
                    st.next_attempt = Instant::now() + st.backoff.next_delay();
                } else if st.leading.is_none() && released {
                    // Released: take it within one round trip.
                    st.next_attempt = Instant::now();
                } else if st.leading.is_none()
                    && other
                    && let Some(obs) = &st.observed
                {
                    let holder = obs.record.holder.clone();
                    self.publish_following(&holder);
                }
            }
            LeaseEvent::Deleted => {
                st.watch_healthy = true;
                if st.leading.is_some() && Box::pin(self.still_ours(st)).await {
                    // A watch's "deleted" can be stale: a shared watch whose (re)list ran
                    // before this lease was created reports it absent. The API server says
                    // we still hold it, so there is nothing to drop.
                    debug!(%lease, "watch reported the lease deleted, but the API server has it under our last write; ignoring");
                    return;
                }
                let now = Instant::now();
                self.check_identity(st, None);
                if let Some(last) = st.observed.take() {
                    debug!(%lease, "lease deleted");
                    if record::held_by_another(&last, &self.identity, &st.own) {
                        let secs =
                            u64::try_from(last.record.lease_duration_secs.max(0)).unwrap_or(0);
                        st.absent_until = Some(now + Duration::from_secs(secs));
                    }
                }
                st.known = true;
                st.observed_at = now;
                if st.leading.is_some() {
                    // The API no longer says we hold it: drop now, then campaign (we may
                    // re-create it at once: nobody else can hold the VIPs).
                    let _ = self.step_down(st, false, "the lease was deleted").await;
                }
                st.next_attempt = st.absent_until.unwrap_or(now).max(now);
            }
            LeaseEvent::Error(e) => {
                if st.watch_healthy {
                    warn!(%lease, error = %e, "lease watch failed; polling every retry period until it recovers");
                }
                st.watch_healthy = false;
            }
        }
    }

    /// Asks the API server whether the lease still exists with a record this process wrote
    /// (one GET within the call timeout). `false` when it does not, or when the GET fails: the
    /// caller then acts on what the watch said.
    async fn still_ours(&self, st: &mut Run) -> bool {
        let lease = self.client.describe();
        match timed(&lease, "get", self.call_timeout(st), self.client.get()).await {
            Ok(Some(obs)) if obs.record.holder == self.identity && st.own.is_ours(&obs) => {
                if st
                    .observed
                    .as_ref()
                    .is_none_or(|cur| obs.is_newer_than(cur))
                {
                    st.observed = Some(obs);
                }
                true
            }
            _ => false,
        }
    }

    async fn on_timer(&mut self, st: &mut Run, open: bool) {
        let now = Instant::now();
        if let Some((_, last_renew)) = st.leading {
            if now >= last_renew + self.timing.renew_deadline {
                let why = format!(
                    "could not renew within the renew deadline ({} ms)",
                    self.timing.renew_deadline.as_millis()
                );
                let _ = self.step_down(st, false, &why).await;
                st.next_attempt = Instant::now() + st.backoff.next_delay();
                return;
            }
        } else if !open {
            return;
        } else if st.known
            && matches!(
                record::standing(
                    st.observed.as_ref(),
                    st.observed_at,
                    now,
                    &self.identity,
                    &st.own
                ),
                Standing::HeldByOther { .. }
            )
        {
            // Woken to poll, not at expiry: re-read the lease before deciding.
            st.known = false;
        }
        self.try_acquire_or_renew(st).await;
    }

    /// One client-go `tryAcquireOrRenew` step.
    async fn try_acquire_or_renew(&mut self, st: &mut Run) {
        let lease = self.client.describe();
        let call_timeout = self.call_timeout(st);
        if !st.known {
            match timed(&lease, "get", call_timeout, self.client.get()).await {
                Ok(obs) => {
                    self.calls_ok();
                    self.check_identity(st, obs.as_ref());
                    st.seen_other_holder |= obs
                        .as_ref()
                        .is_some_and(|o| record::held_by_another(o, &self.identity, &st.own));
                    if st.observed != obs {
                        st.observed_at = Instant::now();
                    }
                    st.observed = obs;
                    st.known = true;
                    st.ever_observed = true;
                }
                Err(e) => {
                    self.on_failure(st, e);
                    return;
                }
            }
        }
        let now = Instant::now();
        let standing = record::standing(
            st.observed.as_ref(),
            st.observed_at,
            now,
            &self.identity,
            &st.own,
        );
        let duration = record::duration_secs(self.timing.lease_duration);
        let mut call_started = Instant::now();
        let previous_holder = st
            .observed
            .as_ref()
            .map(|o| o.record.holder.clone())
            .filter(|h| !h.is_empty() && *h != self.identity);
        // A clean handover: released, and this process saw who held it before the release.
        let released_before =
            st.seen_other_holder && st.observed.as_ref().is_some_and(|o| !o.record.is_held());
        let acquiring = st.leading.is_none()
            && match standing {
                Standing::Absent => st.absent_until.is_none_or(|t| now >= t),
                Standing::Ours | Standing::Free => true,
                Standing::HeldByOther { .. } => false,
            };
        if acquiring
            && let Some(check) = &self.acquire_check
            && !check().await
        {
            debug!(%lease, "not acquiring: the acquisition check says the lease serves nothing");
            st.next_attempt = Instant::now() + self.timing.retry_period;
            return;
        }
        let result = match &standing {
            Standing::HeldByOther { holder, .. } => {
                let under_our_name = *holder == self.identity;
                if st.leading.is_some() {
                    let why = if under_our_name {
                        "the lease was written under this node's identity by another process \
                         (duplicate identity)"
                            .to_string()
                    } else {
                        format!("lease is held by {holder}")
                    };
                    let _ = self.step_down(st, false, &why).await;
                } else {
                    self.publish_following(holder);
                }
                st.next_attempt = now + self.timing.retry_period;
                return;
            }
            Standing::Absent if st.absent_until.is_some_and(|t| now < t) => {
                st.next_attempt = st.absent_until.unwrap_or(now);
                return;
            }
            Standing::Absent => {
                let rec = record::claim(None, &self.identity, duration, record::now_micros());
                st.own.attempted(&rec);
                let r = timed(
                    &lease,
                    "create",
                    self.call_timeout(st),
                    self.client.create(&rec),
                )
                .await;
                (rec, r)
            }
            Standing::Ours | Standing::Free => {
                call_started = Instant::now();
                let Some(obs) = st.observed.clone() else {
                    return;
                };
                let rec = record::claim(
                    Some(&obs.record),
                    &self.identity,
                    duration,
                    record::now_micros(),
                );
                st.own.attempted(&rec);
                let r = timed(
                    &lease,
                    "update",
                    self.call_timeout(st),
                    self.client.update(&rec, &obs.resource_version),
                )
                .await;
                (rec, r)
            }
        };
        let (sent, result) = result;
        match result {
            Ok(obs) => {
                self.calls_ok();
                st.own.succeeded(&sent, &obs);
                st.seen_other_holder = false;
                self.check_identity(st, Some(&obs));
                st.ever_observed = true;
                let now = Instant::now();
                st.absent_until = None;
                st.observed = Some(obs);
                st.known = true;
                st.observed_at = now;
                st.backoff.reset();
                st.next_attempt = now + self.timing.retry_period;
                match st.leading {
                    Some((term, _)) => {
                        let clean = matches!(
                            *self.state_tx.borrow(),
                            LeaderState::Leading { clean: true, .. }
                        );
                        if let Some(m) = &self.metrics {
                            m.renew_latency(&lease, now - call_started);
                        }
                        // A renewal counts from when its request was sent: the API server
                        // may have written it at any moment after that, so the fence the VIP
                        // holder derives from it never outlives the lease others see.
                        st.leading = Some((term, call_started));
                        self.state_tx.send_replace(LeaderState::Leading {
                            term,
                            renewed_at: call_started,
                            clean,
                        });
                    }
                    None => {
                        st.term += 1;
                        st.leading = Some((st.term, call_started));
                        info!(%lease, term = st.term, "acquired lease; leading");
                        if let Some(m) = &self.metrics {
                            m.set_leading(&lease, true);
                            m.transition(&lease);
                            if previous_holder.is_some() {
                                m.failover(&lease);
                            }
                        }
                        self.state_tx.send_replace(LeaderState::Leading {
                            term: st.term,
                            renewed_at: call_started,
                            clean: released_before,
                        });
                    }
                }
            }
            Err(LeaseError::Conflict { .. }) | Err(LeaseError::AlreadyExists { .. }) => {
                // Somebody wrote it since we read it: read again and decide again at once.
                debug!(%lease, "lease changed under us; re-reading");
                st.known = false;
                st.next_attempt = Instant::now();
            }
            Err(e) => self.on_failure(st, e),
        }
    }

    fn on_failure(&mut self, st: &mut Run, e: LeaseError) {
        let now = Instant::now();
        if st.leading.is_some() {
            if let Some(m) = &self.metrics {
                m.renew_failure(&self.client.describe());
            }
            if let Some(r) = self.quiet.observe(true, e.to_string(), now) {
                warn!(error = %e, "renewing the lease failed; retrying until the renew deadline{r}");
            }
            st.next_attempt = now + self.timing.retry_period;
        } else {
            let delay = st.backoff.next_delay();
            if let Some(r) = self.quiet.observe(false, e.to_string(), now) {
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "lease call failed{r}");
            }
            st.next_attempt = now + delay;
        }
    }

    /// A lease call succeeded: failures logged before are over (one line saying so).
    fn calls_ok(&mut self) {
        let now = Instant::now();
        // Renewals and other calls fail together: one line when they work again.
        let ended = match (self.quiet.clear(&true, now), self.quiet.clear(&false, now)) {
            (Some(a), Some(b)) => Some(a.merge(b)),
            (a, b) => a.or(b),
        };
        if let Some(r) = ended {
            info!(lease = %self.client.describe(), "lease calls succeed again{r}");
        }
    }

    fn call_timeout(&self, st: &Run) -> Duration {
        let t = self.timing.call_timeout();
        match st.leading {
            Some((_, last_renew)) => {
                let left = (last_renew + self.timing.renew_deadline)
                    .saturating_duration_since(Instant::now());
                t.min(left.max(Duration::from_millis(50)))
            }
            None => t,
        }
    }

    /// Stops leading: publishes `Following`, waits for the VIP holder to confirm the VIPs
    /// are gone, then (if `release`) releases the lease. A release is skipped when the
    /// confirmation did not come: the lease then expires normally, after the kernel fence.
    async fn step_down(&mut self, st: &mut Run, release: bool, why: &str) -> bool {
        let lease = self.client.describe();
        let Some((term, _)) = st.leading.take() else {
            return false;
        };
        if release && why == SHUTTING_DOWN {
            info!(%lease, term, "stepping down: shutting down");
        } else {
            warn!(%lease, term, reason = why, "stepping down");
        }
        if let Some(m) = &self.metrics {
            m.set_leading(&lease, false);
        }
        let holder = st
            .observed
            .as_ref()
            .filter(|o| record::held_by_another(o, &self.identity, &st.own))
            .map(|o| o.record.holder.clone());
        self.state_tx
            .send_replace(LeaderState::Following { holder });
        let acked = timeout(ACK_TIMEOUT, self.dropped_rx.wait_for(|t| *t >= term))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false);
        if !acked {
            warn!(%lease, term, "VIPs not confirmed dropped within {} ms; not releasing the lease, it will expire", ACK_TIMEOUT.as_millis());
            return false;
        }
        if !release {
            return false;
        }
        let Some(obs) = st.observed.clone() else {
            return false;
        };
        // Only a record this process wrote: one under our name written by another process
        // (duplicate identity) is that process's lease.
        if obs.record.holder != self.identity || !st.own.is_ours(&obs) {
            return false;
        }
        let rec = record::release(&obs.record, record::now_micros());
        st.own.attempted(&rec);
        match timed(
            &lease,
            "update",
            self.timing.call_timeout(),
            self.client.update(&rec, &obs.resource_version),
        )
        .await
        {
            Ok(new) => {
                info!(%lease, "lease released");
                st.own.succeeded(&rec, &new);
                st.observed = Some(new);
                st.observed_at = Instant::now();
                true
            }
            Err(e) => {
                warn!(%lease, error = %e, "releasing the lease failed; it will expire");
                st.known = false;
                false
            }
        }
    }
}

impl<C: LeaseClient> Elector<C> {
    /// Judges a newly seen state of the lease, before `st.observed` is replaced by it. A
    /// record under our identity that this process did not write, seen as a *change* (the
    /// lease was seen before in another state), proves that another process writes under
    /// our identity: counted each time, logged as an ERROR once per episode, published on
    /// [`Elector::duplicate_identity`]. Any state that is not such a record (ours, released,
    /// deleted, held by a different identity) ends the episode.
    fn check_identity(&self, st: &Run, new: Option<&Observed>) {
        let lease = self.client.describe();
        match new {
            Some(obs) if record::foreign_under_identity(obs, &self.identity, &st.own) => {
                let changed =
                    st.ever_observed && st.observed.as_ref().is_none_or(|p| p.record != obs.record);
                if !changed {
                    return;
                }
                if let Some(m) = &self.metrics {
                    m.duplicate_identity(&lease);
                }
                let cond = DuplicateIdentity {
                    lease: lease.clone(),
                    identity: self.identity.clone(),
                };
                let first = self.duplicate_tx.send_if_modified(|c| {
                    if c.is_none() {
                        *c = Some(cond);
                        true
                    } else {
                        false
                    }
                });
                if first {
                    error!(
                        %lease,
                        identity = %self.identity,
                        rv = %obs.resource_version,
                        "duplicate identity: another process writes lease {lease} under this \
                         node's identity {}; node names (vip_nodename) must be unique. This \
                         process does not hold the lease or its VIPs while the other one \
                         renews it",
                        self.identity
                    );
                } else {
                    debug!(%lease, rv = %obs.resource_version, "another write under this node's identity");
                }
            }
            _ => {
                if self.duplicate_tx.send_if_modified(|c| c.take().is_some()) {
                    info!(
                        %lease,
                        identity = %self.identity,
                        "duplicate identity cleared: the lease no longer shows another \
                         process's write under this node's identity"
                    );
                }
            }
        }
    }
}

async fn timed<T>(
    lease: &str,
    op: &'static str,
    limit: Duration,
    fut: impl Future<Output = Result<T, LeaseError>>,
) -> Result<T, LeaseError> {
    match timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(LeaseError::Timeout {
            lease: lease.to_string(),
            op,
            timeout_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        }),
    }
}

#[cfg(test)]
mod tests;
