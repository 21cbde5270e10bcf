//! One campaign or renewal step (client-go `tryAcquireOrRenew`) and the lease calls'
//! bookkeeping: failures, time limits, the duplicate-identity check.

use std::ops::ControlFlow;

use super::*;

/// What a successful write means beyond the record: when its request was sent, and for an
/// acquisition whether it took the lease from another holder (`failover`) and after a clean
/// release (`clean`, see [`LeaderState::Leading`]).
struct Taken {
    call_started: Instant,
    failover: bool,
    clean: bool,
}

impl<C: LeaseClient> Elector<C> {
    /// Asks the API server whether the lease still exists with a record this process wrote
    /// (one GET within the call timeout). `false` when it does not, or when the GET fails: the
    /// caller then acts on what the watch said.
    pub(super) async fn still_ours(&self, st: &mut Run) -> bool {
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

    /// One client-go `tryAcquireOrRenew` step: read the lease when it is not known, judge it
    /// ([`record::standing`]), write the claim it allows and act on the answer.
    pub(super) async fn try_acquire_or_renew(&mut self, st: &mut Run) {
        if !st.known && !self.read_lease(st).await {
            return;
        }
        let lease = self.client.describe();
        let now = Instant::now();
        let mut standing = record::standing(
            st.observed.as_ref(),
            st.observed_at,
            now,
            &self.identity,
            &st.own,
        );
        let handed_over = self.handed_over(st, &standing);
        if handed_over {
            debug!(%lease, "its holder handed the lease over to the peers; taking it before expiry");
            standing = Standing::Free;
        }
        let call_started = Instant::now();
        let previous_holder = st
            .observed
            .as_ref()
            .map(|o| o.record.holder.clone())
            .filter(|h| !h.is_empty() && *h != self.identity);
        // A clean handover: released, and this process saw who held it before the release;
        // or handed over by its holder after its VIPs were gone.
        let released_before = handed_over
            || (st.seen_other_holder && st.observed.as_ref().is_some_and(|o| !o.record.is_held()));
        let acquiring = st.leading.is_none()
            && match standing {
                Standing::Absent => st.absent_until.is_none_or(|t| now >= t),
                Standing::Ours | Standing::Free => true,
                Standing::HeldByOther { .. } => false,
            };
        let absent = matches!(standing, Standing::Absent);
        let ControlFlow::Continue(in_flight) =
            self.acquire_turn(st, &lease, now, acquiring, absent)
        else {
            return;
        };
        if acquiring && !self.may_acquire(st, &lease, now).await {
            return;
        }
        let Some((sent, call_started, result)) =
            self.write_claim(st, &standing, now, call_started).await
        else {
            return;
        };
        match result {
            Ok(obs) => {
                let taken = Taken {
                    call_started,
                    failover: previous_holder.is_some(),
                    clean: released_before,
                };
                self.on_written(st, &sent, obs, taken);
            }
            Err(LeaseError::Conflict { .. }) | Err(LeaseError::AlreadyExists { .. }) => {
                // Somebody wrote it since we read it: read again and decide again at once.
                debug!(%lease, "lease changed under us; re-reading");
                st.known = false;
                st.next_attempt = Instant::now();
            }
            Err(e) => self.on_failure(st, e),
        }
        drop(in_flight);
    }

    /// Whether the lease's holder handed this very version over (ride link): free to take
    /// before expiry.
    fn handed_over(&self, st: &Run, standing: &Standing) -> bool {
        st.leading.is_none()
            && matches!(standing, Standing::HeldByOther { .. })
            && self.ride.as_ref().is_some_and(|r| {
                st.observed
                    .as_ref()
                    .is_some_and(|o| o.record.holder != self.identity && r.handed_over(o))
            })
    }

    /// When an acquisition (`acquiring`; `absent`: of a lease that does not exist yet) may
    /// be written: at once for the node a fail-back request names, else after the spread's
    /// and the preference's wait since the lease became free. `Continue` with the spread's
    /// in-flight mark to hold during the write; `Break` (with `st.next_attempt` set) while
    /// it must wait.
    fn acquire_turn(
        &self,
        st: &mut Run,
        lease: &str,
        now: Instant,
        acquiring: bool,
        absent: bool,
    ) -> ControlFlow<(), Option<spread::InFlight>> {
        let mut in_flight = None;
        // A lease released with a fail-back request (see [`super::failback`]) goes to the
        // node it names: that node takes it at once, every other one a retry period later.
        let handed_to = st
            .observed
            .as_ref()
            .filter(|o| !o.record.is_held())
            .and_then(|o| o.record.failback_request.as_deref());
        let invited = acquiring && handed_to == Some(self.identity.as_str());
        let after_invited = if acquiring && handed_to.is_some() && !invited {
            self.timing.retry_period
        } else {
            Duration::ZERO
        };
        let preference = self
            .preference
            .as_ref()
            .map(|p| *p.borrow())
            .unwrap_or_default()
            + after_invited;
        if invited {
            debug!(%lease, "the lease was handed to this node (fail-back); taking it at once");
            in_flight = self.spread.as_ref().map(|sp| sp.begin());
        } else if acquiring && (self.spread.is_some() || !preference.is_zero()) {
            let free_since = *st.free_since.get_or_insert(now);
            let at = match &self.spread {
                Some(sp) => sp.not_before(free_since, absent),
                None => free_since,
            } + preference;
            if now < at {
                debug!(%lease, wait_ms = (at - now).as_millis() as u64, ahead = self.spread.as_ref().map(|sp| sp.ahead()), preference_ms = preference.as_millis() as u64, "spreading: waiting before acquiring");
                st.next_attempt = at;
                return ControlFlow::Break(());
            }
            in_flight = self.spread.as_ref().map(|sp| sp.begin());
        }
        ControlFlow::Continue(in_flight)
    }

    /// Whether an acquisition may be written now: the ride link lets this candidate acquire
    /// the lease it observed, and the acquisition check says the lease serves something;
    /// when not, the next attempt is a retry period away.
    async fn may_acquire(&self, st: &mut Run, lease: &str, now: Instant) -> bool {
        let allowed = match &self.ride {
            Some(ride) => ride.may_acquire(now, st.observed.as_ref(), st.observed_at),
            // No ride link: a marked lease's holder may ride (mixed cluster, `ridemark`).
            None => super::record::plain_may_take(st.observed.as_ref(), st.observed_at, now),
        };
        if !allowed {
            debug!(%lease, "not acquiring yet: the holder may still ride through an API outage (ride-through marker)");
            st.next_attempt = Instant::now() + self.timing.retry_period;
            return false;
        }
        if let Some(check) = &self.acquire_check
            && !check().await
        {
            debug!(%lease, "not acquiring: the acquisition check says the lease serves nothing");
            st.next_attempt = Instant::now() + self.timing.retry_period;
            return false;
        }
        true
    }

    /// Reads the lease (a GET within the call timeout) and records what it shows; `false`
    /// (after [`Self::on_failure`]) when the call failed.
    async fn read_lease(&mut self, st: &mut Run) -> bool {
        let lease = self.client.describe();
        let call_timeout = self.call_timeout(st);
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
                true
            }
            Err(e) => {
                self.on_failure(st, e);
                false
            }
        }
    }

    /// Writes the claim `standing` allows (create when absent, update when ours or free) and
    /// returns the record sent, when its request was sent (`call_started` for a create, taken
    /// anew for an update) and the answer. `None` when there is nothing to write: held by
    /// another (stepped down or following), or absent but not creatable before
    /// `st.absent_until`.
    async fn write_claim(
        &mut self,
        st: &mut Run,
        standing: &Standing,
        now: Instant,
        call_started: Instant,
    ) -> Option<(LeaseRecord, Instant, Result<Observed, LeaseError>)> {
        let lease = self.client.describe();
        let duration = self.timing.lease_duration;
        match standing {
            Standing::HeldByOther { holder, .. } => {
                st.free_since = None;
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
                None
            }
            Standing::Absent if st.absent_until.is_some_and(|t| now < t) => {
                st.next_attempt = st.absent_until.unwrap_or(now);
                None
            }
            Standing::Absent => {
                let mut rec = record::claim(None, &self.identity, duration, record::now_micros());
                rec.ride_through = self.ride.as_ref().and_then(|r| r.ride_cap());
                st.own.attempted(&rec);
                let r = timed(
                    &lease,
                    "create",
                    self.call_timeout(st),
                    self.client.create(&rec),
                )
                .await;
                Some((rec, call_started, r))
            }
            Standing::Ours | Standing::Free => {
                let call_started = Instant::now();
                let obs = st.observed.clone()?;
                let mut rec = record::claim(
                    Some(&obs.record),
                    &self.identity,
                    duration,
                    record::now_micros(),
                );
                if st.leading.is_some() {
                    rec.failback_request = self.failback_kept(rec.failback_request.take());
                }
                rec.ride_through = self.ride.as_ref().and_then(|r| r.ride_cap());
                st.own.attempted(&rec);
                let r = timed(
                    &lease,
                    "update",
                    self.call_timeout(st),
                    self.client.update(&rec, &obs.resource_version),
                )
                .await;
                Some((rec, call_started, r))
            }
        }
    }

    /// The claim `sent` was written (`obs` is the server's answer): records it, then renews
    /// the current term or starts a new one, and publishes [`LeaderState::Leading`].
    fn on_written(&mut self, st: &mut Run, sent: &LeaseRecord, obs: Observed, taken: Taken) {
        let lease = self.client.describe();
        let call_started = taken.call_started;
        let resource_version = obs.resource_version.clone();
        self.calls_ok();
        st.own.succeeded(sent, &obs);
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
                if let Some(r) = &self.ride {
                    r.renewed(term, &resource_version, call_started);
                }
                // With ride-through, a ride grant published meanwhile may reach further;
                // both bounds are safe on their own, so the later one stands.
                let renewed_at = match *self.state_tx.borrow() {
                    LeaderState::Leading {
                        term: t,
                        renewed_at,
                        ..
                    } if t == term && self.ride.is_some() => renewed_at.max(call_started),
                    _ => call_started,
                };
                self.state_tx.send_replace(LeaderState::Leading {
                    term,
                    renewed_at,
                    clean,
                });
            }
            None => {
                st.term += 1;
                st.leading = Some((st.term, call_started));
                st.free_since = None;
                st.failback_seen = None;
                if let Some(sp) = &self.spread {
                    sp.acquired(now);
                }
                // Listed in heartbeats before any VIP of the term is bound (P2).
                if let Some(r) = &self.ride {
                    r.renewed(st.term, &resource_version, call_started);
                }
                info!(%lease, term = st.term, "acquired lease; leading");
                if let Some(m) = &self.metrics {
                    m.set_leading(&lease, true);
                    m.transition(&lease);
                    if taken.failover {
                        m.failover(&lease);
                    }
                }
                self.state_tx.send_replace(LeaderState::Leading {
                    term: st.term,
                    renewed_at: call_started,
                    clean: taken.clean,
                });
            }
        }
    }

    pub(super) fn on_failure(&mut self, st: &mut Run, e: LeaseError) {
        let now = Instant::now();
        // An unanswered call of a wing's lease: one line per outage, not per lease.
        let shared = self.outage.as_ref().filter(|_| e.unreachable());
        if let Some(o) = shared {
            o.call_failed(&self.client.describe(), &e);
        } else if let Some(o) = &self.outage {
            // Answered (403...): the server is reachable from this lease.
            o.reached(&self.client.describe());
        }
        let aggregated = shared.is_some();
        if st.leading.is_some() {
            if let Some(m) = &self.metrics {
                m.renew_failure(&self.client.describe());
            }
            if !aggregated && let Some(r) = self.quiet.observe(true, e.to_string(), now) {
                warn!(error = %e, "renewing the lease failed; retrying until the renew deadline{r}");
            }
            st.next_attempt = now + self.timing.retry_period;
        } else {
            let delay = st.backoff.next_delay();
            if !aggregated && let Some(r) = self.quiet.observe(false, e.to_string(), now) {
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "lease call failed{r}");
            }
            st.next_attempt = now + delay;
        }
    }

    /// A lease call succeeded: failures logged before are over (one line saying so).
    pub(super) fn calls_ok(&mut self) {
        let now = Instant::now();
        if let Some(o) = &self.outage {
            o.reached(&self.client.describe());
        }
        // Renewals and other calls fail together: one line when they work again.
        let ended = match (self.quiet.clear(&true, now), self.quiet.clear(&false, now)) {
            (Some(a), Some(b)) => Some(a.merge(b)),
            (a, b) => a.or(b),
        };
        if let Some(r) = ended {
            info!(lease = %self.client.describe(), "lease calls succeed again{r}");
        }
    }

    pub(super) fn call_timeout(&self, st: &Run) -> Duration {
        let t = self.timing.call_timeout();
        match st.leading {
            Some((_, last_renew)) => {
                let left = self
                    .lead_end(last_renew)
                    .saturating_duration_since(Instant::now());
                t.min(left.max(Duration::from_millis(50)))
            }
            None => t,
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
    pub(super) fn check_identity(&self, st: &Run, new: Option<&Observed>) {
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

/// `fut` bounded by `limit`; past it, [`LeaseError::Timeout`] naming `lease` and `op`.
pub(crate) async fn timed<T>(
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
