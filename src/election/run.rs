//! The elector's loop: timers, watch events, stepping down.

use super::attempt::timed;
use super::*;

/// Who holds a lease, as the spread counts it ([`spread::LeaseWatch`]).
#[derive(Debug, PartialEq)]
pub(crate) enum Holder {
    /// Another node, validly.
    Valid(String),
    /// Another node, whose hold expired without a release.
    Lapsed(String),
    /// Nobody else: free, absent, or this node.
    None,
}

/// Who holds a lease whose standing is `standing` and whose record was last seen as
/// `observed`, for the elector of `identity`: another node validly; another node whose hold
/// expired without a release (the record still names it: a node powered off, its other
/// leases lapsing one after another); else nobody. Pure.
pub(crate) fn spread_holder(
    standing: Standing,
    observed: Option<&record::Observed>,
    identity: &str,
) -> Holder {
    match standing {
        Standing::HeldByOther { holder, .. } if holder != identity => Holder::Valid(holder),
        Standing::Free => match observed {
            Some(o) if o.record.is_held() && o.record.holder != identity => {
                Holder::Lapsed(o.record.holder.clone())
            }
            _ => Holder::None,
        },
        _ => Holder::None,
    }
}

/// The next bump of the ride link's "API reachable again" signal; pending without a link.
async fn api_back(rx: &mut Option<watch::Receiver<u64>>) {
    match rx {
        Some(r) => {
            if r.changed().await.is_err() {
                *rx = None;
            }
        }
        None => std::future::pending().await,
    }
}

impl<C: LeaseClient> Elector<C> {
    /// Campaigns, leads and follows until `shutdown` is cancelled. On shutdown a holder
    /// publishes `Following`, waits for the VIP holder's acknowledgement and releases the
    /// lease (client-go `ReleaseOnCancel`). Never returns before shutdown: API failures are
    /// retried with back-off, a lost lease is campaigned for again.
    pub async fn run(mut self, shutdown: CancellationToken) -> ElectionEnd {
        let lease = self.client.describe();
        info!(%lease, identity = %self.identity, ?self.timing, "leader election starting");
        let mut watch = self.client.watch();
        let now = Instant::now();
        let mut st = self.first_run(now);
        let seen = self.spread.as_ref().map(|sp| sp.watch_lease(&lease));
        // The gates' sender was dropped: they stay as they are (all open when none was ever
        // set), and the closed channel, ready at every poll, is not polled again.
        let mut gates_gone = false;
        loop {
            let now = Instant::now();
            if st.leading.is_none()
                && let Some(r) = &self.ride
            {
                r.observe(st.observed.as_ref().filter(|_| st.known), st.observed_at);
            }
            self.report_holder(&st, seen.as_ref(), now);
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
                    if let Some(o) = &self.outage {
                        o.reached(&lease);
                    }
                    info!(%lease, "leader election stopped");
                    return ElectionEnd {
                        released,
                        observed: st.observed,
                        observed_at: st.observed_at,
                        absent_until: st.absent_until,
                        own: st.own,
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
                changed = self.gates.changed(), if !gates_gone => {
                    if changed.is_err() {
                        gates_gone = true;
                        continue;
                    }
                    self.on_gates_changed(&mut st, &lease, open, &closed_before).await;
                }
                _ = sleep_until(wake) => {
                    // Woken at the lease's expiry: its lapsed holder is told to the spread
                    // before the acquisition is judged (else the first of a dead node's
                    // leases to expire was judged with it still counted, a spread step
                    // late).
                    self.report_holder(&st, seen.as_ref(), Instant::now());
                    Box::pin(self.on_timer(&mut st, open)).await;
                }
                _ = api_back(&mut self.api_back) => {
                    if st.leading.is_some() {
                        st.next_attempt = Instant::now();
                    }
                }
                _ = api_back(&mut self.ride_news) => {
                    Box::pin(self.on_ride_news(&mut st, open)).await;
                }
            }
        }
    }

    /// The first state of a run: nothing observed, an attempt due at `now`.
    fn first_run(&self, now: Instant) -> Run {
        Run {
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
            free_since: None,
            own: OwnWrites::default(),
            ever_observed: false,
            started: record::now_micros(),
            failback_seen: None,
            failback_asked: None,
        }
    }

    /// The local gates changed (from `closed_before`; `open`: they were all open): step down
    /// when one closed while leading, campaign at once when they all opened again.
    async fn on_gates_changed(
        &mut self,
        st: &mut Run,
        lease: &str,
        open: bool,
        closed_before: &[String],
    ) {
        let closed_now = closed(&self.gates.borrow_and_update());
        // The VIP holder's start-up gate is routine: not worth an info line.
        let starting_only = |c: &[String]| c.iter().all(|g| g == GATE_STARTING);
        if !closed_now.is_empty() {
            if st.leading.is_some() {
                let why = format!("local condition failed: {}", closed_now.join(", "));
                let _ = Box::pin(self.step_down(st, true, &why)).await;
            } else if starting_only(&closed_now) {
                debug!(%lease, "waiting for the VIP holder's first local checks");
            } else {
                info!(%lease, gates = ?closed_now, "not campaigning while local conditions fail");
            }
        } else if !open {
            // Only a real change from closed to open (gates are first set open
            // at start, which is no news).
            if starting_only(closed_before) {
                debug!(%lease, "local checks done; campaigning");
            } else {
                info!(%lease, "local conditions good again; campaigning");
            }
            st.next_attempt = Instant::now();
        }
    }

    /// Who holds the lease as the spread counts it ([`spread_holder`]); `None` before the
    /// lease was first read.
    /// Tells the node's spread (`seen`, when it spreads) who holds this lease at `now`
    /// ([`Self::other_holder`]): another node validly, nobody, or a holder that let it lapse
    /// ([`spread::LeaseWatch::lapsed`]).
    fn report_holder(&self, st: &Run, seen: Option<&spread::LeaseWatch>, now: Instant) {
        let Some(seen) = seen else {
            return;
        };
        match self.other_holder(st, now) {
            Some(Holder::Valid(h)) => seen.holder(Some(&h)),
            Some(Holder::Lapsed(h)) => seen.lapsed(&h, self.timing.lease_duration),
            Some(Holder::None) => seen.holder(None),
            None => {}
        }
    }

    fn other_holder(&self, st: &Run, now: Instant) -> Option<Holder> {
        st.known
            .then(|| spread_holder(self.standing(st, now), st.observed.as_ref(), &self.identity))
    }

    /// The lease's standing as this elector sees it at `now` ([`record::standing`]).
    fn standing(&self, st: &Run, now: Instant) -> Standing {
        record::standing(
            st.observed.as_ref(),
            st.observed_at,
            now,
            &self.identity,
            &st.own,
        )
    }

    /// When the loop must next act on its own (without a watch event).
    pub(super) fn next_wake(&self, st: &Run, open: bool, now: Instant) -> Instant {
        let far = now + Duration::from_secs(3600);
        if let Some((_, last_renew)) = st.leading {
            return st.next_attempt.min(self.lead_end(last_renew));
        }
        if !open {
            return far;
        }
        if !st.known {
            return st.next_attempt;
        }
        match self.standing(st, now) {
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
    pub(super) fn publish_following(&self, holder: &str) {
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

    pub(super) async fn on_watch_event(&mut self, st: &mut Run, ev: LeaseEvent) {
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
                // Following through the watch alone (no read needed while it is healthy),
                // a write made since this run started is a state seen: the next change of
                // it under our identity proves a twin (lab S35 once missed it this way).
                if obs.record.renew_time.is_some_and(|t| t >= st.started) {
                    st.ever_observed = true;
                }
                st.absent_until = None;
                let other = record::held_by_another(&obs, &self.identity, &st.own);
                let twin = record::foreign_under_identity(&obs, &self.identity, &st.own);
                let released = !obs.record.is_held();
                st.seen_other_holder |= other;
                if other {
                    st.free_since = None;
                }
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
                    Box::pin(self.ask_failback(st)).await;
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
                        st.absent_until = Some(now + last.record.wait());
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
                // The wing's shared watch fails for every lease at once: said once.
                let news = || self.outage.as_ref().is_none_or(|o| o.watch_failed(&e));
                if st.watch_healthy && news() {
                    warn!(%lease, error = %e, "lease watch failed; polling every retry period until it recovers");
                } else if st.watch_healthy {
                    debug!(%lease, error = %e, "lease watch failed; polling every retry period until it recovers");
                }
                st.watch_healthy = false;
            }
        }
    }

    pub(super) async fn on_timer(&mut self, st: &mut Run, open: bool) {
        let now = Instant::now();
        if let Some((_, last_renew)) = st.leading {
            if now >= self.lead_end(last_renew) {
                let why = if self.ride.is_some() {
                    format!(
                        "could not renew within the renew deadline ({} ms) and no ride-through grant covers the VIPs",
                        self.timing.renew_deadline.as_millis()
                    )
                } else {
                    format!(
                        "could not renew within the renew deadline ({} ms)",
                        self.timing.renew_deadline.as_millis()
                    )
                };
                let _ = self.step_down(st, false, &why).await;
                st.next_attempt = Instant::now() + st.backoff.next_delay();
                return;
            }
            if now < st.next_attempt {
                // Woken at an end of leadership that a ride grant has moved since.
                return;
            }
            if let Some(to) = self.failback_due(st, now) {
                let why = format!("fail-back: handing over to the more preferred node {to}");
                if Box::pin(self.step_down(st, true, &why)).await {
                    self.failback_tx.send_replace(Some(to));
                }
                st.next_attempt = Instant::now();
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

    /// News from the ride link: a holder asked for the lease while it cannot reach the API
    /// steps down at once (not releasing: it cannot write; the link sends `Released` after
    /// the confirmed drop); a candidate tries now, when its observed holder handed this very
    /// version over or the lease is free by the usual rules (the link then allows the take:
    /// trying at once instead of at the next retry).
    async fn on_ride_news(&mut self, st: &mut Run, open: bool) {
        let Some(ride) = self.ride.clone() else {
            return;
        };
        if st.leading.is_some() {
            if let Some(by) = ride.hand_over_requested() {
                let why = format!(
                    "{by} asked for the lease and this node cannot reach the API server: handing over"
                );
                let _ = self.step_down(st, false, &why).await;
                st.next_attempt = Instant::now() + st.backoff.next_delay();
            }
            return;
        }
        if !open || !st.known {
            return;
        }
        let free = !matches!(
            record::standing(
                st.observed.as_ref(),
                st.observed_at,
                Instant::now(),
                &self.identity,
                &st.own
            ),
            Standing::HeldByOther { .. }
        );
        if free || st.observed.as_ref().is_some_and(|o| ride.handed_over(o)) {
            self.try_acquire_or_renew(st).await;
        }
    }

    /// Stops leading: publishes `Following`, waits for the VIP holder to confirm the VIPs
    /// are gone, then (if `release`) releases the lease. A release is skipped when the
    /// confirmation did not come: the lease then expires normally, after the kernel fence.
    pub(super) async fn step_down(&mut self, st: &mut Run, release: bool, why: &str) -> bool {
        let lease = self.client.describe();
        let Some((term, _)) = st.leading.take() else {
            return false;
        };
        if let Some(sp) = &self.spread {
            sp.released();
        }
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
        if let Some(r) = &self.ride {
            r.dropped();
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

#[cfg(test)]
mod spread_holder_tests {
    use super::*;
    use record::{LeaseRecord, Observed, OwnWrites};

    fn obs(holder: &str) -> Observed {
        Observed {
            record: LeaseRecord {
                holder: holder.into(),
                lease_duration_secs: 5,
                ..Default::default()
            },
            resource_version: "1".into(),
        }
    }

    /// A powered-off node's lease: valid while its duration runs, lapsed after (the record
    /// still names it); a released lease, this node's own and a lease never read are nobody's.
    #[test]
    fn a_lease_expired_under_another_node_is_lapsed_a_released_one_is_free() {
        let t = Instant::now();
        let own = OwnWrites::default();
        let holder_at = |o: Option<&Observed>, after: u64| {
            let now = t + Duration::from_secs(after);
            spread_holder(record::standing(o, t, now, "b", &own), o, "b")
        };
        let a = obs("a");
        assert_eq!(holder_at(Some(&a), 1), Holder::Valid("a".into()));
        assert_eq!(holder_at(Some(&a), 6), Holder::Lapsed("a".into()));
        assert_eq!(holder_at(Some(&obs("")), 6), Holder::None, "released");
        assert_eq!(holder_at(None, 6), Holder::None, "absent");
        // A record naming this node's identity that this process did not write: valid or
        // expired, never another node.
        let b = obs("b");
        assert_eq!(holder_at(Some(&b), 1), Holder::None);
        assert_eq!(holder_at(Some(&b), 6), Holder::None);
    }
}
