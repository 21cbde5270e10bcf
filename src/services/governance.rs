//! Governance moves between Service leases (scenario S34 in `docs/scenarios.md`).
//!
//! An address shared by several Services is governed by the lease of the oldest of them
//! ([`crate::services::plan::desired`]). When that changes (the governing Service is deleted, changes
//! address, type or class, or an older Service starts using the address), the address moves
//! to another lease, whose holder may be another node. The rule:
//!
//! **A new governing lease's holder never binds an address while the previous governing
//! lease's holder may still answer for it.** The previous governing lease *retires* on every
//! node; the address stays held back from every other lease until the retiring lease is
//!
//! * released (vipd releases only after its VIP holder confirmed the VIPs gone), or deleted
//!   after it was seen released,
//! * expired: the last observed change plus its `leaseDurationSeconds`, on this node's
//!   monotonic clock (a frozen holder's kernel fence removed the address before that), or
//!   absent since longer than that after being deleted while held (the elector's
//!   `absent_until` rule),
//! * or taken in a new term (another holder, or a new acquisition: the term that held the
//!   address ended in one of the two ways above).
//!
//! A lease of its own Services (per-Service, `vipd-local.`, a `kube-vip.io/leaseName`
//! lease) that lost an address to another lease but still governs other addresses is
//! restarted on every node (its holder drops its VIPs and releases it, then campaigns
//! again), so that its holder gives the release signal; a lease whose Services are all gone
//! simply stops (released and deleted by its holder, S17). A shared lease (a shard, the one
//! lease for all) that still governs other addresses keeps running instead: a release
//! would hand hundreds of Services over to move one address. Its holder drops the moved
//! addresses on the same Service change that moved them, so its handover is also done
//! one lease duration after the retirement began on this node, the `done_by` of
//! [`follow`]; a holder whose view of the Services lags past that still answers the new
//! holder's conflict probe (an address new to a term is always probed), which then refuses
//! the address until it is free. An address that a lease merely drops (no other lease
//! takes it in the same step) is not held back later.
//!
//! Which leases retire and what a group may bind are decided in
//! [`crate::services::plan::governance`]; here is when a retiring lease lets go
//! ([`handover`], pure) and [`follow`], which runs one retirement against a [`LeaseClient`].

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::election::record::{self, LeaseRecord, Observed, Standing};
use crate::election::{ElectionEnd, LeaseClient, LeaseEvent};
use crate::lease::Timing;

/// What a node last knew of a retiring lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// Whether anything was read yet (`false` for a lease this node never followed).
    pub known: bool,
    /// The lease as last seen; `None` = absent.
    pub observed: Option<Observed>,
    /// When `observed` last changed, on this node's monotonic clock.
    pub observed_at: Instant,
    /// After a deletion of a held lease: its holder may answer until this instant.
    pub absent_until: Option<Instant>,
}

impl LeaseView {
    /// Nothing known yet.
    pub fn unknown(now: Instant) -> Self {
        LeaseView {
            known: false,
            observed: None,
            observed_at: now,
            absent_until: None,
        }
    }

    /// What this node's elector knew when it stopped. An elector that saw no lease is no
    /// evidence of absence (it may never have read it, e.g. while a gate was closed): the
    /// view is then unknown unless the elector saw the lease deleted while held.
    pub(crate) fn from_end(end: &ElectionEnd) -> Self {
        LeaseView {
            known: end.observed.is_some() || end.absent_until.is_some(),
            observed: end.observed.clone(),
            observed_at: end.observed_at,
            absent_until: end.absent_until,
        }
    }

    /// Records a read or a watch change: a newer (or different) record resets
    /// `observed_at`; an older or equal one is ignored; `None` is a deletion.
    pub fn seen(&mut self, obs: Option<Observed>, now: Instant) {
        self.known = true;
        let Some(obs) = obs else {
            self.deleted(now);
            return;
        };
        if let Some(cur) = &self.observed
            && (cur.is_newer_than(&obs) || *cur == obs)
        {
            return;
        }
        self.observed = Some(obs);
        self.observed_at = now;
        self.absent_until = None;
    }

    /// Records a deletion. Deleted while held: whoever held it may still answer for one
    /// lease duration from now (the twin of the elector's `absent_until`; here the holder
    /// may also be this node, whose VIP holder may not have confirmed the drop).
    pub fn deleted(&mut self, now: Instant) {
        self.known = true;
        if let Some(last) = self.observed.take() {
            if last.record.is_held() {
                self.absent_until = Some(now + last.record.wait());
            }
            self.observed_at = now;
        }
    }
}

/// Whether `now` is a later term than `from`: another holder, or the same holder after a
/// new acquisition (client-go keeps `acquireTime` and `leaseTransitions` only while the
/// holder renews).
fn new_term(from: &LeaseRecord, now: &LeaseRecord) -> bool {
    from.holder != now.holder
        || from.acquire_time != now.acquire_time
        || from.transitions != now.transitions
}

/// Where the handover of a retiring lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Its holder can no longer answer for the addresses: other leases may bind them.
    Done,
    /// Not before this instant, unless the lease changes first.
    NotBefore(Instant),
    /// Nothing is known of the lease yet (read it first).
    Unknown,
}

/// Judges a retiring lease (see module docs). `from`: the held record seen when the
/// retirement started (after subscribing to changes), if any; `view`: the lease as last
/// seen. Expiry is the elector's rule ([`record::standing`]), judged as a bystander: a
/// lease held by this node counts like anyone's.
pub fn handover(from: Option<&LeaseRecord>, view: &LeaseView, now: Instant) -> Handover {
    if !view.known {
        return Handover::Unknown;
    }
    if let (Some(from), Some(obs)) = (from, &view.observed)
        && from.is_held()
        && obs.record.is_held()
        && new_term(from, &obs.record)
    {
        return Handover::Done;
    }
    // No identity is empty, so every held lease is somebody else's here.
    match record::standing(
        view.observed.as_ref(),
        view.observed_at,
        now,
        "",
        &record::OwnWrites::default(),
    ) {
        Standing::Absent => match view.absent_until {
            Some(t) if t > now => Handover::NotBefore(t),
            _ => Handover::Done,
        },
        Standing::Free => Handover::Done,
        Standing::HeldByOther { expires_at, .. } => Handover::NotBefore(expires_at),
        Standing::Ours => Handover::NotBefore(
            view.observed_at
                + view
                    .observed
                    .as_ref()
                    .map(|o| o.record.wait())
                    .unwrap_or_default(),
        ),
    }
}

/// Follows a retiring lease until its handover is [`Handover::Done`] or `done_by` (a
/// shared lease that keeps running, see the module doc; `None`: no such bound) has passed
/// (returns `true`), or `stop` is cancelled (returns `false`). `events`: the lease's
/// changes, subscribed before the elector that gave `view` stopped (so no change falls
/// between the two); the lease is also read once at the start (the elector may have
/// dropped a change it had not handled yet when it stopped) and again after every watch
/// error. Failed reads are retried every retry period of `timing`, each bounded by its call
/// timeout.
pub(crate) async fn follow<C: LeaseClient>(
    client: C,
    mut events: BoxStream<'static, LeaseEvent>,
    mut view: LeaseView,
    timing: Timing,
    done_by: Option<Instant>,
    stop: CancellationToken,
) -> bool {
    let lease = client.describe();
    let mut from: Option<LeaseRecord> = None;
    let mut read_at = Some(Instant::now());
    loop {
        if done_by.is_some_and(|t| t <= Instant::now()) {
            debug!(%lease, "retiring lease kept by its holder: one lease duration passed since the retirement began");
            return true;
        }
        let now = Instant::now();
        if read_at.is_some_and(|t| t <= now) {
            match timeout(timing.call_timeout(), client.get()).await {
                Ok(Ok(obs)) => {
                    view.seen(obs, Instant::now());
                    read_at = None;
                }
                Ok(Err(e)) => {
                    debug!(%lease, error = %e, "retiring lease: read failed; retrying");
                    read_at = Some(Instant::now() + timing.retry_period);
                }
                Err(_) => {
                    debug!(%lease, "retiring lease: read timed out; retrying");
                    read_at = Some(Instant::now() + timing.retry_period);
                }
            }
            if read_at.is_none() && from.is_none() {
                from = held(&view);
            }
        }
        let now = Instant::now();
        let wake = match handover(from.as_ref(), &view, now) {
            Handover::Done => return true,
            Handover::NotBefore(t) => t,
            Handover::Unknown => now + Duration::from_secs(3600),
        };
        let wake = read_at.map_or(wake, |r| r.min(wake));
        let wake = done_by.map_or(wake, |d| d.min(wake));
        tokio::select! {
            biased;
            _ = stop.cancelled() => return false,
            ev = events.next() => {
                let now = Instant::now();
                match ev {
                    Some(LeaseEvent::Changed(obs)) => {
                        view.seen(Some(obs), now);
                        if from.is_none() {
                            from = held(&view);
                        }
                    }
                    Some(LeaseEvent::Deleted) => view.deleted(now),
                    Some(LeaseEvent::Error(_)) => {
                        read_at.get_or_insert(now);
                    }
                    None => {
                        events = client.watch();
                        read_at = Some(now);
                    }
                }
            }
            _ = sleep_until(wake) => {}
        }
    }
}

fn held(view: &LeaseView) -> Option<LeaseRecord> {
    view.observed
        .as_ref()
        .filter(|o| o.record.is_held())
        .map(|o| o.record.clone())
}

#[cfg(test)]
pub(super) mod tests;
