//! The leader election record kept in a `coordination.k8s.io/v1` Lease, and the pure
//! decisions taken on it.
//!
//! The record and the rules follow client-go's `tools/leaderelection` (`LeaderElectionRecord`,
//! `tryAcquireOrRenew`, `ReleaseOnCancel`) so that vipd and kube-vip (which uses client-go)
//! can share one Lease during a mixed roll-out.
//!
//! One rule goes beyond client-go: a Lease naming our identity is ours only if this process
//! wrote it ([`OwnWrites`]). Another process running under the same identity (two nodes with
//! the same `vip_nodename`) would otherwise let both hold the VIPs; a process that crashed
//! and restarted finds its old lease "held by another" and takes it once it expires.

use std::collections::VecDeque;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// What a Lease says about leadership (client-go `LeaderElectionRecord`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `spec.holderIdentity`; empty = nobody holds it (released, as client-go's
    /// `ReleaseOnCancel` leaves it).
    pub holder: String,
    /// `spec.leaseDurationSeconds`, in whole seconds: how long candidates wait after the last
    /// observed change before they may take the lease.
    pub lease_duration_secs: i32,
    /// `spec.acquireTime`: wall-clock time the current holder acquired the lease.
    pub acquire_time: Option<Timestamp>,
    /// `spec.renewTime`: wall-clock time of the holder's last renewal.
    pub renew_time: Option<Timestamp>,
    /// `spec.leaseTransitions`: how many times the holder changed.
    pub transitions: i32,
    /// The [`FAILBACK_REQUEST_ANNOTATION`] on the Lease (vipd's fail-back, not client-go's):
    /// a node more preferred than the holder asks for the lease; only the holder decides
    /// ([`super::failback`]). Kept by the holder's renewals and its release, cleared by an
    /// acquisition.
    pub failback_request: Option<String>,
    /// The exact lease duration in milliseconds, from [`LEASE_DURATION_ANNOTATION`], when
    /// the holder's lease duration is not a whole number of seconds (`leaseDurationSeconds`
    /// is then rounded up). Read only when the annotation was written with this record's
    /// `renewTime` (any later write by another client, e.g. kube-vip's client-go, changes
    /// `renewTime` and so voids it); see [`LeaseRecord::wait`].
    pub lease_duration_ms: Option<u32>,
    /// The longest ride past expiry the holder may make through an API outage, from
    /// [`super::ridemark::RIDE_THROUGH_ANNOTATION`] (read only when written with this
    /// record's `renewTime`); `None`: the holder does not ride on this write. Candidates
    /// that cannot follow the ride-through takeover rule wait this much longer
    /// ([`super::ridemark::plain_may_take`]).
    pub ride_through: Option<Duration>,
}

/// Lease annotation in which a candidate more preferred than the holder asks for a
/// fail-back (`svc_failback`): its node name.
pub const FAILBACK_REQUEST_ANNOTATION: &str = "vipd.io/failback-request";

/// Lease annotation with the holder's exact lease duration when it is not a whole number
/// of seconds (sub-second timings, issue 16): `<ms>ms@<renewTime in microseconds since the
/// Unix epoch>`, e.g. `600ms@1764615341123456`. vipd candidates wait this long instead of
/// the rounded-up `leaseDurationSeconds` (kube-vip's client-go keeps reading the seconds,
/// which are never shorter); the `renewTime` part ties the value to the write that made it.
pub const LEASE_DURATION_ANNOTATION: &str = "vipd.io/lease-duration";

/// The [`LEASE_DURATION_ANNOTATION`] value for `ms` written with `renew_time`.
fn lease_duration_value(ms: u32, renew_time: Timestamp) -> String {
    format!("{ms}ms@{}", renew_time.as_microsecond())
}

/// The milliseconds of a [`LEASE_DURATION_ANNOTATION`] value, when it is well formed and
/// was written with `renew_time` (to the microsecond); `None` otherwise.
fn parse_lease_duration(value: &str, renew_time: Option<Timestamp>) -> Option<u32> {
    let (ms, micros) = value.split_once("ms@")?;
    let (ms, micros) = (ms.parse::<u32>().ok()?, micros.parse::<i64>().ok()?);
    (ms > 0 && renew_time?.as_microsecond() == micros).then_some(ms)
}

/// Sets annotation `key` to `value`, or removes it when `None`.
fn set_annotation(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
    value: Option<String>,
) {
    match value {
        Some(v) => {
            meta.annotations
                .get_or_insert_with(Default::default)
                .insert(key.to_string(), v);
        }
        None => {
            if let Some(a) = meta.annotations.as_mut() {
                a.remove(key);
            }
        }
    }
}

impl LeaseRecord {
    /// Reads the record from a Lease (absent fields become empty / zero).
    pub(crate) fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        let renew_time = spec.renew_time.as_ref().map(|t| t.0);
        LeaseRecord {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration_secs: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
            failback_request: lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(FAILBACK_REQUEST_ANNOTATION))
                .filter(|v| !v.is_empty())
                .cloned(),
            lease_duration_ms: lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LEASE_DURATION_ANNOTATION))
                .and_then(|v| parse_lease_duration(v, renew_time)),
            ride_through: lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::ridemark::RIDE_THROUGH_ANNOTATION))
                .and_then(|v| super::ridemark::parse_marker(v, renew_time)),
        }
    }

    /// How long after an observed change of this record a candidate waits before taking
    /// the lease: the exact [`LeaseRecord::lease_duration_ms`] when it is known and not
    /// longer than `leaseDurationSeconds` (which a consistent record rounds up from it),
    /// else `leaseDurationSeconds`.
    pub fn wait(&self) -> Duration {
        let secs = Duration::from_secs(u64::try_from(self.lease_duration_secs.max(0)).unwrap_or(0));
        match self
            .lease_duration_ms
            .map(|ms| Duration::from_millis(u64::from(ms)))
        {
            Some(exact) if exact <= secs => exact,
            _ => secs,
        }
    }

    /// Writes [`LeaseRecord::failback_request`], [`LeaseRecord::lease_duration_ms`] (with
    /// the renew time, [`LEASE_DURATION_ANNOTATION`]) and [`LeaseRecord::ride_through`]
    /// (with the renew time, [`super::ridemark::RIDE_THROUGH_ANNOTATION`]) into a Lease's
    /// annotations (each removed when `None`; other annotations are left as they were).
    pub(crate) fn apply_annotations(
        &self,
        meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) {
        use super::ridemark::{RIDE_THROUGH_ANNOTATION, marker_value};
        set_annotation(
            meta,
            FAILBACK_REQUEST_ANNOTATION,
            self.failback_request.clone(),
        );
        let renewed = self.renew_time;
        set_annotation(
            meta,
            LEASE_DURATION_ANNOTATION,
            (self.lease_duration_ms.zip(renewed)).map(|(ms, t)| lease_duration_value(ms, t)),
        );
        set_annotation(
            meta,
            RIDE_THROUGH_ANNOTATION,
            (self.ride_through.zip(renewed)).map(|(ride, t)| marker_value(ride, t)),
        );
    }

    /// Writes the record into a Lease spec (other spec fields are left as they were).
    pub(crate) fn apply_to(&self, spec: &mut LeaseSpec) {
        spec.holder_identity = Some(self.holder.clone());
        spec.lease_duration_seconds = Some(self.lease_duration_secs);
        spec.acquire_time = self.acquire_time.map(MicroTime);
        spec.renew_time = self.renew_time.map(MicroTime);
        spec.lease_transitions = Some(self.transitions);
    }

    /// `true` when somebody holds the lease.
    pub(crate) fn is_held(&self) -> bool {
        !self.holder.is_empty()
    }
}

/// A record as last read from (or written to) the API server, with its `resourceVersion`,
/// which every write uses as its precondition (optimistic concurrency).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The leadership record.
    pub record: LeaseRecord,
    /// `metadata.resourceVersion` of the Lease this record came from.
    pub resource_version: String,
}

impl Observed {
    /// `true` if `other` is an older version of the same object than `self`. Resource versions
    /// are opaque strings in the API, but etcd-backed servers use increasing integers: when
    /// both parse as integers an older one is recognised (a late watch event must not undo a
    /// newer write); when they do not, nothing is considered older.
    pub(crate) fn is_newer_than(&self, other: &Observed) -> bool {
        match (
            self.resource_version.parse::<u64>(),
            other.resource_version.parse::<u64>(),
        ) {
            (Ok(a), Ok(b)) => a > b,
            _ => false,
        }
    }
}

/// How many of this process's most recent writes [`OwnWrites`] remembers: enough for the
/// writes whose watch events or re-reads can still be on their way (one write per retry
/// period, one in flight at a time; an older event is also older than what the elector has
/// seen and is ignored anyway). Small on purpose: every Service lease has one.
pub(crate) const OWN_WRITES_KEPT: usize = 4;

/// How many writes whose outcome is unknown [`OwnWrites`] remembers besides the most recent
/// ones: the first attempts after the last confirmed write. While the API server cannot
/// commit (etcd stalled, an API outage that queues requests), every renewal times out but
/// may still be committed when storage resumes, the oldest queued one first (each carries
/// the same precondition, so at most one of them lands); 64 covers more than a minute of
/// renewals at a 1 s retry period, past the ride-through cap. 16 bytes each, kept only
/// until the next confirmed write.
pub(crate) const UNCONFIRMED_KEPT: usize = 64;

/// One remembered write: what [`OwnWrites::is_ours`] compares, nothing more (a few hundred
/// Service leases per node each keep [`OWN_WRITES_KEPT`] of them).
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnWrite {
    /// The resourceVersion the server gave it; `None` while the outcome is unknown.
    rv: Option<String>,
    /// Written with a holder (a renewal or an acquisition), not a release.
    held: bool,
    /// `renewTime` in whole microseconds (what the API server stores).
    renew_micros: Option<i64>,
}

impl OwnWrite {
    fn of(rv: Option<String>, record: &LeaseRecord) -> Self {
        OwnWrite {
            rv,
            held: record.is_held(),
            renew_micros: record.renew_time.map(|t| t.as_microsecond()),
        }
    }

    /// Same holder kind and the same `renewTime` to the microsecond: the callers only ask
    /// about records that name our own identity, the only holder this process writes.
    fn same_write(&self, b: &LeaseRecord) -> bool {
        self.held == b.is_held()
            && self.renew_micros.is_some()
            && self.renew_micros == b.renew_time.map(|t| t.as_microsecond())
    }
}

/// The writes this process made to one Lease (or may have made: a write whose answer was
/// lost to a timeout or a broken connection may still have been applied). A record that
/// names our identity but is none of these was written by another process under our name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnWrites {
    /// Oldest first.
    recent: VecDeque<OwnWrite>,
    /// The first [`UNCONFIRMED_KEPT`] writes sent since the last confirmed one (held, and
    /// `renewTime` in microseconds): a late commit of any of them is still ours, however
    /// many attempts followed it (the most recent ones are in `recent`).
    unconfirmed: Vec<(bool, i64)>,
}

impl OwnWrites {
    /// Notes a write about to be sent (outcome unknown until [`OwnWrites::succeeded`]).
    pub(crate) fn attempted(&mut self, record: &LeaseRecord) {
        let w = OwnWrite::of(None, record);
        if let Some(us) = w.renew_micros
            && self.unconfirmed.len() < UNCONFIRMED_KEPT
        {
            self.unconfirmed.push((w.held, us));
        }
        self.remember(w);
    }

    /// Keeps at most [`OWN_WRITES_KEPT`] (dropping the oldest before adding, so the buffer
    /// never grows past that capacity).
    fn remember(&mut self, w: OwnWrite) {
        while self.recent.len() >= OWN_WRITES_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(w);
    }

    /// Notes that the write of `record` was stored as `stored`.
    /// Writes sent before it can no longer land (they carried an older precondition), so
    /// the unconfirmed ones are forgotten.
    pub(crate) fn succeeded(&mut self, record: &LeaseRecord, stored: &Observed) {
        self.unconfirmed = Vec::new();
        let sent = OwnWrite::of(None, record);
        match self.recent.iter_mut().rev().find(|w| **w == sent) {
            Some(entry) => entry.rv = Some(stored.resource_version.clone()),
            None => self.remember(OwnWrite::of(
                Some(stored.resource_version.clone()),
                &stored.record,
            )),
        }
    }

    /// `true` when `obs` is one of our writes: its resourceVersion is one we got back, or
    /// its record is one we sent (same holder and `renewTime` to the microsecond, which
    /// also recognises a write whose answer was lost, and our write after somebody edited
    /// only the Lease's metadata).
    pub(crate) fn is_ours(&self, obs: &Observed) -> bool {
        let late = obs.record.renew_time.is_some_and(|t| {
            self.unconfirmed
                .contains(&(obs.record.is_held(), t.as_microsecond()))
        });
        late || self.recent.iter().any(|w| {
            w.rv.as_deref() == Some(obs.resource_version.as_str()) || w.same_write(&obs.record)
        })
    }
}

/// `true` when `obs` names `identity` as holder but this process did not write it: another
/// process under our identity (or our own predecessor, before a restart) wrote it.
pub(crate) fn foreign_under_identity(obs: &Observed, identity: &str, own: &OwnWrites) -> bool {
    obs.record.is_held() && obs.record.holder == identity && !own.is_ours(obs)
}

/// `true` when `obs` is held by anybody but this process (another identity, or another
/// process under our identity).
pub(crate) fn held_by_another(obs: &Observed, identity: &str, own: &OwnWrites) -> bool {
    obs.record.is_held() && (obs.record.holder != identity || !own.is_ours(obs))
}

/// The current wall-clock time cut to whole microseconds, as a Lease's `MicroTime` stores
/// it: what [`OwnWrites`] sent is then exactly what the server returns.
pub(crate) fn now_micros() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now)
}

/// Where a candidate or holder stands with respect to the lease at a given instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// No Lease object exists: create it with us as holder.
    Absent,
    /// We hold it (this process wrote the record): renew.
    Ours,
    /// Nobody holds it (released), or the holder let it expire: take it now.
    Free,
    /// Another node holds it and it is valid until `expires_at` (local monotonic clock).
    /// This includes a record naming our own identity that this process did not write.
    HeldByOther {
        /// The current holder's identity (our own for a record we did not write).
        holder: String,
        /// When the lease expires unless it changes again before.
        expires_at: Instant,
    },
}

/// Judges the lease as client-go does: expiry is measured on *our own* monotonic clock from
/// the instant we last saw the record change (`observed_at`), plus the record's own
/// `leaseDurationSeconds`, or its exact duration ([`LeaseRecord::wait`]) (so a released
/// lease, written with duration 1 s and no holder, is free at once). The holder's wall-clock `renewTime` is never compared with our clock.
///
/// A record naming `identity` is [`Standing::Ours`] only when `own` says this process wrote
/// it; otherwise it is judged like any other holder's (taken once it expired).
pub fn standing(
    observed: Option<&Observed>,
    observed_at: Instant,
    now: Instant,
    identity: &str,
    own: &OwnWrites,
) -> Standing {
    let Some(obs) = observed else {
        return Standing::Absent;
    };
    let rec = &obs.record;
    if !rec.is_held() {
        return Standing::Free;
    }
    if rec.holder == identity && own.is_ours(obs) {
        return Standing::Ours;
    }
    let expires_at = observed_at + rec.wait();
    if now >= expires_at {
        Standing::Free
    } else {
        Standing::HeldByOther {
            holder: rec.holder.clone(),
            expires_at,
        }
    }
}

/// Whether a candidate that cannot follow the ride-through takeover rule (no peer key, or
/// `svc_ridethrough=false`; see [`super::ridemark`]) may take the lease it observed as
/// `observed` (last changed at `observed_at`) now: always for an absent, released or
/// unmarked lease (the caller already found it free), and for a marked one only from
/// `observed_at` + lease duration + the marked ride on.
pub fn plain_may_take(observed: Option<&Observed>, observed_at: Instant, now: Instant) -> bool {
    match observed {
        Some(o) if o.record.is_held() => match o.record.ride_through {
            Some(ride) => now >= observed_at + o.record.wait() + ride,
            None => true,
        },
        _ => true,
    }
}

/// The record to write when acquiring or renewing (client-go `tryAcquireOrRenew`):
/// `acquireTime` and `leaseTransitions` are kept while the holder stays the same; a change
/// of holder sets `acquireTime` to now and increments `leaseTransitions`.
///
/// `lease_duration` is written as `leaseDurationSeconds` rounded up ([`duration_secs`]),
/// and, when it is not a whole number of seconds, exactly in [`LEASE_DURATION_ANNOTATION`].
pub fn claim(
    old: Option<&LeaseRecord>,
    identity: &str,
    lease_duration: Duration,
    now: Timestamp,
) -> LeaseRecord {
    let lease_duration_secs = duration_secs(lease_duration);
    let lease_duration_ms = (lease_duration.subsec_nanos() != 0)
        .then(|| u32::try_from(lease_duration.as_micros().div_ceil(1000)).unwrap_or(u32::MAX));
    let record = claim_secs(old, identity, lease_duration_secs, now);
    LeaseRecord {
        lease_duration_ms,
        ..record
    }
}

fn claim_secs(
    old: Option<&LeaseRecord>,
    identity: &str,
    lease_duration_secs: i32,
    now: Timestamp,
) -> LeaseRecord {
    match old {
        Some(old) if old.holder == identity => LeaseRecord {
            holder: identity.to_string(),
            lease_duration_secs,
            acquire_time: old.acquire_time.or(Some(now)),
            renew_time: Some(now),
            transitions: old.transitions,
            failback_request: old.failback_request.clone(),
            lease_duration_ms: None,
            ride_through: None,
        },
        Some(old) => LeaseRecord {
            holder: identity.to_string(),
            lease_duration_secs,
            acquire_time: Some(now),
            renew_time: Some(now),
            // client-go increments only when there was a previous holder; a released lease
            // (empty holder) still counts as a transition there, and so it does here.
            transitions: old.transitions.saturating_add(1),
            failback_request: None,
            lease_duration_ms: None,
            ride_through: None,
        },
        None => LeaseRecord {
            holder: identity.to_string(),
            lease_duration_secs,
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions: 0,
            failback_request: None,
            lease_duration_ms: None,
            ride_through: None,
        },
    }
}

/// The record to write when giving the lease up on purpose (client-go `ReleaseOnCancel`):
/// empty holder, `leaseDurationSeconds` 1, renew/acquire time now, transitions kept.
pub fn release(old: &LeaseRecord, now: Timestamp) -> LeaseRecord {
    LeaseRecord {
        holder: String::new(),
        lease_duration_secs: 1,
        acquire_time: Some(now),
        renew_time: Some(now),
        transitions: old.transitions,
        failback_request: old.failback_request.clone(),
        lease_duration_ms: None,
        ride_through: None,
    }
}

/// Whole seconds written as `leaseDurationSeconds` for a configured lease duration: rounded
/// up, so candidates (ours and client-go's) never wait less than configured; at least 1.
pub(crate) fn duration_secs(lease_duration: Duration) -> i32 {
    let ms = lease_duration.as_millis();
    let secs = ms.div_ceil(1000).max(1);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE: Duration = Duration::from_secs(5);

    fn obs(holder: &str, dur: i32, rv: &str) -> Observed {
        Observed {
            record: LeaseRecord {
                holder: holder.into(),
                lease_duration_secs: dur,
                ..Default::default()
            },
            resource_version: rv.into(),
        }
    }

    fn none() -> OwnWrites {
        OwnWrites::default()
    }

    #[test]
    fn absent_lease_is_created() {
        let t = Instant::now();
        assert_eq!(standing(None, t, t, "a", &none()), Standing::Absent);
    }

    #[test]
    fn own_lease_is_renewed_even_when_old() {
        let t = Instant::now();
        let o = obs("a", 5, "1");
        let mut own = none();
        own.attempted(&o.record);
        own.succeeded(&o.record, &o);
        assert_eq!(
            standing(Some(&o), t, t + Duration::from_secs(60), "a", &own),
            Standing::Ours
        );
    }

    #[test]
    fn our_identity_written_by_another_process_is_held_until_it_expires() {
        // Found at start (a restart, or a twin under the same name): not ours.
        let t = Instant::now();
        let o = obs("a", 5, "7");
        assert_eq!(
            standing(Some(&o), t, t + Duration::from_millis(4999), "a", &none()),
            Standing::HeldByOther {
                holder: "a".into(),
                expires_at: t + Duration::from_secs(5)
            }
        );
        assert_eq!(
            standing(Some(&o), t, t + Duration::from_secs(5), "a", &none()),
            Standing::Free
        );
        assert!(foreign_under_identity(&o, "a", &none()));
        assert!(held_by_another(&o, "a", &none()));
        assert!(!foreign_under_identity(&o, "b", &none()));
        assert!(held_by_another(&o, "b", &none()));
    }

    #[test]
    fn own_writes_are_recognised_by_version_or_by_record() {
        let t0 = Timestamp::from_microsecond(1_000_000_123).unwrap();
        let mine = claim(None, "a", FIVE, t0);
        let mut own = none();
        own.attempted(&mine);
        // Answer lost (timeout), but the server stored it: recognised by its renewTime.
        let stored = Observed {
            record: mine.clone(),
            resource_version: "9".into(),
        };
        assert!(own.is_ours(&stored));
        // Somebody else's renewal under the same name: a different renewTime.
        let t1 = Timestamp::from_microsecond(1_000_000_124).unwrap();
        let twin = Observed {
            record: claim(Some(&mine), "a", FIVE, t1),
            resource_version: "10".into(),
        };
        assert!(!own.is_ours(&twin));
        // A successful write is also known by its version (e.g. after a metadata-only
        // edit the record is still ours; by version it is ours whatever the record).
        own.succeeded(&mine, &stored);
        assert!(own.is_ours(&Observed {
            record: LeaseRecord::default(),
            resource_version: "9".into(),
        }));
        // Only the most recent writes are kept.
        for i in 0..OWN_WRITES_KEPT as i64 {
            let r = claim(
                None,
                "a",
                FIVE,
                Timestamp::from_microsecond(2_000_000_000 + i).unwrap(),
            );
            own.attempted(&r);
        }
        assert!(!own.is_ours(&stored));
        // Every Service lease keeps one of these: the buffer never grows past what it keeps.
        for i in 0..100 {
            own.attempted(&claim(
                None,
                "a",
                FIVE,
                Timestamp::from_microsecond(3_000_000_000 + i).unwrap(),
            ));
        }
        assert_eq!(own.recent.len(), OWN_WRITES_KEPT);
        assert!(own.recent.capacity() <= OWN_WRITES_KEPT.next_power_of_two());
        assert_eq!(own.unconfirmed.len(), UNCONFIRMED_KEPT);
    }

    /// Issue 27: storage stalls for 20 s; every renewal times out (outcome unknown), one per
    /// retry period. When storage resumes, the first of them is committed: the holder must
    /// recognise it as its own (not a duplicate process) however many attempts followed,
    /// while a record another process wrote under the same name in the meantime (its own
    /// `renewTime`) is still foreign. A confirmed write ends the unknowns.
    #[test]
    fn a_late_commit_of_any_unconfirmed_renewal_is_ours_a_twin_is_not() {
        let at = |us: i64| Timestamp::from_microsecond(1_700_000_000_000_000 + us).unwrap();
        let first = claim(None, "a", FIVE, at(0));
        let stored = Observed {
            record: first.clone(),
            resource_version: "10".into(),
        };
        let mut own = none();
        own.attempted(&first);
        own.succeeded(&first, &stored);
        // 20 renewals sent during the stall, all timed out.
        let sent: Vec<LeaseRecord> = (1..=20)
            .map(|i| claim(Some(&first), "a", FIVE, at(i * 1_000_000)))
            .collect();
        for r in &sent {
            own.attempted(r);
        }
        let late = |r: &LeaseRecord, rv: &str| Observed {
            record: r.clone(),
            resource_version: rv.into(),
        };
        // The oldest one lands when storage resumes (beyond the most recent writes kept).
        assert!(own.is_ours(&late(&sent[0], "11")));
        assert!(!foreign_under_identity(&late(&sent[0], "11"), "a", &own));
        assert!(!held_by_another(&late(&sent[0], "11"), "a", &own));
        // So could any other of them.
        assert!(sent.iter().all(|r| own.is_ours(&late(r, "11"))));
        // A second process named "a" renewing meanwhile writes its own renewTime: foreign.
        let twin = claim(Some(&first), "a", FIVE, at(1_500_000));
        assert!(foreign_under_identity(&late(&twin, "12"), "a", &own));
        // Once a renewal is confirmed, the earlier unknowns cannot land any more (they
        // carried an older precondition) and are forgotten.
        let confirmed = claim(Some(&first), "a", FIVE, at(30_000_000));
        own.attempted(&confirmed);
        own.succeeded(&confirmed, &late(&confirmed, "14"));
        assert!(!own.is_ours(&late(&sent[0], "15")));
        assert!(own.unconfirmed.is_empty());
    }

    #[test]
    fn released_lease_is_free_at_once() {
        let t = Instant::now();
        let o = obs("", 1, "1");
        assert_eq!(standing(Some(&o), t, t, "b", &none()), Standing::Free);
    }

    #[test]
    fn other_holder_valid_until_observed_plus_duration() {
        let t = Instant::now();
        let o = obs("a", 5, "1");
        let just_before = t + Duration::from_millis(4999);
        assert_eq!(
            standing(Some(&o), t, just_before, "b", &none()),
            Standing::HeldByOther {
                holder: "a".into(),
                expires_at: t + Duration::from_secs(5)
            }
        );
        assert_eq!(
            standing(Some(&o), t, t + Duration::from_secs(5), "b", &none()),
            Standing::Free
        );
    }

    #[test]
    fn expiry_counts_from_observation_not_renew_time() {
        // A holder whose wall clock is far in the past is still valid for a full duration
        // after we first saw the record.
        let t = Instant::now();
        let mut o = obs("a", 5, "1");
        o.record.renew_time = Some(Timestamp::UNIX_EPOCH);
        assert!(matches!(
            standing(Some(&o), t, t + Duration::from_secs(1), "b", &none()),
            Standing::HeldByOther { .. }
        ));
    }

    #[test]
    fn negative_duration_is_treated_as_zero() {
        let t = Instant::now();
        let o = obs("a", -3, "1");
        assert_eq!(standing(Some(&o), t, t, "b", &none()), Standing::Free);
    }

    #[test]
    fn claim_keeps_acquire_time_on_renew_and_counts_transitions() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(1_005).unwrap();
        let first = claim(None, "a", FIVE, t0);
        assert_eq!(first.transitions, 0);
        assert_eq!(first.acquire_time, Some(t0));
        let renewed = claim(Some(&first), "a", FIVE, t1);
        assert_eq!(renewed.acquire_time, Some(t0));
        assert_eq!(renewed.renew_time, Some(t1));
        assert_eq!(renewed.transitions, 0);
        let taken = claim(Some(&renewed), "b", FIVE, t1);
        assert_eq!(taken.holder, "b");
        assert_eq!(taken.acquire_time, Some(t1));
        assert_eq!(taken.transitions, 1);
    }

    #[test]
    fn release_empties_holder_and_shortens_duration() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let held = claim(None, "a", FIVE, t0);
        let released = release(&held, t0);
        assert!(!released.is_held());
        assert_eq!(released.lease_duration_secs, 1);
        assert_eq!(released.transitions, held.transitions);
    }

    #[test]
    fn duration_rounds_up_to_whole_seconds() {
        assert_eq!(duration_secs(Duration::from_millis(2500)), 3);
        assert_eq!(duration_secs(Duration::from_secs(5)), 5);
        assert_eq!(duration_secs(Duration::from_millis(10)), 1);
    }

    #[test]
    fn numeric_resource_versions_are_ordered() {
        assert!(obs("a", 5, "11").is_newer_than(&obs("a", 5, "10")));
        assert!(!obs("a", 5, "10").is_newer_than(&obs("a", 5, "11")));
        assert!(!obs("a", 5, "x").is_newer_than(&obs("a", 5, "10")));
    }

    #[test]
    fn lease_round_trip() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let rec = claim(None, "node-a", FIVE, t0);
        let mut spec = LeaseSpec::default();
        rec.apply_to(&mut spec);
        let lease = Lease {
            spec: Some(spec),
            ..Default::default()
        };
        assert_eq!(LeaseRecord::from_lease(&lease), rec);
    }
}

/// The exact lease duration: written with the renew time when the duration is not whole
/// seconds, honoured by [`standing`] only while it belongs to the current write, never
/// longer than `leaseDurationSeconds`.
#[cfg(test)]
mod exact_duration {
    use super::*;
    use k8s_openapi::api::coordination::v1::Lease;

    fn lease_of(rec: &LeaseRecord) -> Lease {
        let mut lease = Lease::default();
        let mut spec = LeaseSpec::default();
        rec.apply_to(&mut spec);
        rec.apply_annotations(&mut lease.metadata);
        lease.spec = Some(spec);
        lease
    }

    #[test]
    fn sub_second_duration_round_trips_and_is_what_candidates_wait() {
        let t0 = Timestamp::from_microsecond(1_764_615_341_123_456).unwrap();
        let rec = claim(None, "a", Duration::from_millis(600), t0);
        assert_eq!(
            (rec.lease_duration_secs, rec.lease_duration_ms),
            (1, Some(600))
        );
        let lease = lease_of(&rec);
        assert_eq!(
            lease.metadata.annotations.as_ref().unwrap()[LEASE_DURATION_ANNOTATION],
            "600ms@1764615341123456"
        );
        let read = LeaseRecord::from_lease(&lease);
        assert_eq!(read, rec);
        assert_eq!(read.wait(), Duration::from_millis(600));
        // Whole seconds: no annotation, the seconds as before; a renewal by the same
        // holder with whole seconds removes an earlier annotation.
        let whole = claim(Some(&rec), "a", Duration::from_secs(3), t0);
        assert_eq!(
            (whole.lease_duration_secs, whole.lease_duration_ms),
            (3, None)
        );
        let mut lease2 = lease.clone();
        whole.apply_annotations(&mut lease2.metadata);
        assert!(
            !lease2
                .metadata
                .annotations
                .unwrap()
                .contains_key(LEASE_DURATION_ANNOTATION)
        );
        assert_eq!(whole.wait(), Duration::from_secs(3));
        // 2.5 s: 3 s written, 2500 ms exact.
        let r = claim(None, "a", Duration::from_millis(2500), t0);
        assert_eq!(
            (r.lease_duration_secs, r.lease_duration_ms),
            (3, Some(2500))
        );
    }

    /// Another client (kube-vip's client-go) writes the Lease keeping our annotation but
    /// with its own renewTime and seconds: the annotation no longer counts, candidates wait
    /// the seconds. A value longer than the seconds or malformed never shortens the wait.
    #[test]
    fn a_stale_or_inconsistent_annotation_is_ignored() {
        let t0 = Timestamp::from_microsecond(1_764_615_341_123_456).unwrap();
        let mut lease = lease_of(&claim(None, "a", Duration::from_millis(600), t0));
        let spec = lease.spec.as_mut().unwrap();
        spec.lease_duration_seconds = Some(15);
        spec.renew_time = Some(MicroTime(
            Timestamp::from_microsecond(1_764_615_342_000_000).unwrap(),
        ));
        let read = LeaseRecord::from_lease(&lease);
        assert_eq!(read.lease_duration_ms, None);
        assert_eq!(read.wait(), Duration::from_secs(15));
        for bad in ["600", "ms@1764615341123456", "0ms@1764615342000000", "x"] {
            let mut l = lease.clone();
            l.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(LEASE_DURATION_ANNOTATION.into(), bad.into());
            assert_eq!(
                LeaseRecord::from_lease(&l).wait(),
                Duration::from_secs(15),
                "{bad}"
            );
        }
        let longer = LeaseRecord {
            lease_duration_secs: 1,
            lease_duration_ms: Some(5000),
            ..Default::default()
        };
        assert_eq!(longer.wait(), Duration::from_secs(1));
    }

    /// A candidate that saw a 600 ms holder's renewal takes the lease 600 ms later, not 1 s.
    #[test]
    fn standing_expires_after_the_exact_duration() {
        let t0 = Timestamp::from_microsecond(1_764_615_341_123_456).unwrap();
        let rec = claim(None, "a", Duration::from_millis(600), t0);
        let obs = Observed {
            record: rec,
            resource_version: "1".into(),
        };
        let seen = Instant::now();
        let own = OwnWrites::default();
        assert!(matches!(
            standing(
                Some(&obs),
                seen,
                seen + Duration::from_millis(599),
                "b",
                &own
            ),
            Standing::HeldByOther { .. }
        ));
        assert_eq!(
            standing(
                Some(&obs),
                seen,
                seen + Duration::from_millis(600),
                "b",
                &own
            ),
            Standing::Free
        );
    }

    fn marked(holder: &str, ride: Option<Duration>) -> Observed {
        Observed {
            record: LeaseRecord {
                holder: holder.into(),
                lease_duration_secs: 5,
                ride_through: ride,
                ..Default::default()
            },
            resource_version: "7".into(),
        }
    }

    /// The mixed-cluster rule: a keyless (or option-off) candidate takes an unmarked expired
    /// lease at once, a marked one only past lease duration + the marked ride after it last
    /// saw it change, which is after the holder's last possible ride grant.
    #[tokio::test(start_paused = true)]
    async fn a_marked_lease_is_taken_only_after_the_ride_cap() {
        let seen = Instant::now();
        let marked_lease = marked("node-a", Some(Duration::from_secs(60)));
        let plain = marked("node-a", None);
        let at = |s: u64| seen + Duration::from_secs(s);
        assert!(plain_may_take(Some(&plain), seen, at(5)));
        assert!(!plain_may_take(Some(&marked_lease), seen, at(5)));
        assert!(!plain_may_take(Some(&marked_lease), seen, at(64)));
        assert!(plain_may_take(Some(&marked_lease), seen, at(65)));
        assert!(plain_may_take(None, seen, at(0)));
        assert!(plain_may_take(
            Some(&marked("", Some(Duration::from_secs(60)))),
            seen,
            at(0)
        ));
    }

    /// The marker a riding-capable holder writes survives the Lease round trip; a renewal
    /// without it (a keyless holder) removes it; a release carries none.
    #[test]
    fn the_ride_marker_round_trips_and_is_removed_by_an_unmarked_write() {
        let t = Timestamp::from_second(1_764_615_341).unwrap();
        let mut rec = claim(None, "node-a", Duration::from_secs(5), t);
        rec.ride_through = Some(Duration::from_secs(60));
        let mut lease = lease_of(&rec);
        let read = LeaseRecord::from_lease(&lease);
        assert_eq!(read.ride_through, Some(Duration::from_secs(60)));
        let mut unmarked = claim(Some(&read), "node-a", Duration::from_secs(5), t);
        assert_eq!(unmarked.ride_through, None, "each write decides anew");
        unmarked.renew_time = Some(Timestamp::from_second(1_764_615_342).unwrap());
        unmarked.apply_annotations(&mut lease.metadata);
        assert_eq!(LeaseRecord::from_lease(&lease).ride_through, None);
        assert_eq!(release(&read, t).ride_through, None);
    }
}
