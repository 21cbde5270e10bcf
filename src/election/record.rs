//! The leader election record kept in a `coordination.k8s.io/v1` Lease, and the pure
//! decisions taken on it.
//!
//! The record and the rules follow client-go's `tools/leaderelection` (`LeaderElectionRecord`,
//! `tryAcquireOrRenew`, `ReleaseOnCancel`) so that vipd and kube-vip (which uses client-go)
//! can share one Lease during a mixed roll-out.

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
}

impl LeaseRecord {
    /// Reads the record from a Lease (absent fields become empty / zero).
    pub fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        LeaseRecord {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration_secs: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    /// Writes the record into a Lease spec (other spec fields are left as they were).
    pub fn apply_to(&self, spec: &mut LeaseSpec) {
        spec.holder_identity = Some(self.holder.clone());
        spec.lease_duration_seconds = Some(self.lease_duration_secs);
        spec.acquire_time = self.acquire_time.map(MicroTime);
        spec.renew_time = self.renew_time.map(MicroTime);
        spec.lease_transitions = Some(self.transitions);
    }

    /// `true` when somebody holds the lease.
    pub fn is_held(&self) -> bool {
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
    pub fn is_newer_than(&self, other: &Observed) -> bool {
        match (
            self.resource_version.parse::<u64>(),
            other.resource_version.parse::<u64>(),
        ) {
            (Ok(a), Ok(b)) => a > b,
            _ => false,
        }
    }
}

/// Where a candidate or holder stands with respect to the lease at a given instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// No Lease object exists: create it with us as holder.
    Absent,
    /// We hold it: renew.
    Ours,
    /// Nobody holds it (released), or the holder let it expire: take it now.
    Free,
    /// Another node holds it and it is valid until `expires_at` (local monotonic clock).
    HeldByOther {
        /// The current holder's identity.
        holder: String,
        /// When the lease expires unless it changes again before.
        expires_at: Instant,
    },
}

/// Judges the lease as client-go does: expiry is measured on *our own* monotonic clock from
/// the instant we last saw the record change (`observed_at`), plus the record's own
/// `leaseDurationSeconds` (so a released lease, written with duration 1 s and no holder, is
/// free at once). The holder's wall-clock `renewTime` is never compared with our clock.
pub fn standing(
    observed: Option<&Observed>,
    observed_at: Instant,
    now: Instant,
    identity: &str,
) -> Standing {
    let Some(obs) = observed else {
        return Standing::Absent;
    };
    let rec = &obs.record;
    if !rec.is_held() {
        return Standing::Free;
    }
    if rec.holder == identity {
        return Standing::Ours;
    }
    let duration = Duration::from_secs(u64::try_from(rec.lease_duration_secs.max(0)).unwrap_or(0));
    let expires_at = observed_at + duration;
    if now >= expires_at {
        Standing::Free
    } else {
        Standing::HeldByOther {
            holder: rec.holder.clone(),
            expires_at,
        }
    }
}

/// The record to write when acquiring or renewing (client-go `tryAcquireOrRenew`):
/// `acquireTime` and `leaseTransitions` are kept while the holder stays the same; a change
/// of holder sets `acquireTime` to now and increments `leaseTransitions`.
pub fn claim(
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
        },
        Some(old) => LeaseRecord {
            holder: identity.to_string(),
            lease_duration_secs,
            acquire_time: Some(now),
            renew_time: Some(now),
            // client-go increments only when there was a previous holder; a released lease
            // (empty holder) still counts as a transition there, and so it does here.
            transitions: old.transitions.saturating_add(1),
        },
        None => LeaseRecord {
            holder: identity.to_string(),
            lease_duration_secs,
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions: 0,
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
    }
}

/// Whole seconds written as `leaseDurationSeconds` for a configured lease duration: rounded
/// up, so candidates (ours and client-go's) never wait less than configured; at least 1.
pub fn duration_secs(lease_duration: Duration) -> i32 {
    let ms = lease_duration.as_millis();
    let secs = ms.div_ceil(1000).max(1);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn absent_lease_is_created() {
        let t = Instant::now();
        assert_eq!(standing(None, t, t, "a"), Standing::Absent);
    }

    #[test]
    fn own_lease_is_renewed_even_when_old() {
        let t = Instant::now();
        let o = obs("a", 5, "1");
        assert_eq!(
            standing(Some(&o), t, t + Duration::from_secs(60), "a"),
            Standing::Ours
        );
    }

    #[test]
    fn released_lease_is_free_at_once() {
        let t = Instant::now();
        let o = obs("", 1, "1");
        assert_eq!(standing(Some(&o), t, t, "b"), Standing::Free);
    }

    #[test]
    fn other_holder_valid_until_observed_plus_duration() {
        let t = Instant::now();
        let o = obs("a", 5, "1");
        let just_before = t + Duration::from_millis(4999);
        assert_eq!(
            standing(Some(&o), t, just_before, "b"),
            Standing::HeldByOther {
                holder: "a".into(),
                expires_at: t + Duration::from_secs(5)
            }
        );
        assert_eq!(
            standing(Some(&o), t, t + Duration::from_secs(5), "b"),
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
            standing(Some(&o), t, t + Duration::from_secs(1), "b"),
            Standing::HeldByOther { .. }
        ));
    }

    #[test]
    fn negative_duration_is_treated_as_zero() {
        let t = Instant::now();
        let o = obs("a", -3, "1");
        assert_eq!(standing(Some(&o), t, t, "b"), Standing::Free);
    }

    #[test]
    fn claim_keeps_acquire_time_on_renew_and_counts_transitions() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(1_005).unwrap();
        let first = claim(None, "a", 5, t0);
        assert_eq!(first.transitions, 0);
        assert_eq!(first.acquire_time, Some(t0));
        let renewed = claim(Some(&first), "a", 5, t1);
        assert_eq!(renewed.acquire_time, Some(t0));
        assert_eq!(renewed.renew_time, Some(t1));
        assert_eq!(renewed.transitions, 0);
        let taken = claim(Some(&renewed), "b", 5, t1);
        assert_eq!(taken.holder, "b");
        assert_eq!(taken.acquire_time, Some(t1));
        assert_eq!(taken.transitions, 1);
    }

    #[test]
    fn release_empties_holder_and_shortens_duration() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let held = claim(None, "a", 5, t0);
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
        let rec = claim(None, "node-a", 5, t0);
        let mut spec = LeaseSpec::default();
        rec.apply_to(&mut spec);
        let lease = Lease {
            spec: Some(spec),
            ..Default::default()
        };
        assert_eq!(LeaseRecord::from_lease(&lease), rec);
    }
}
