//! The ride-through marker on a Service Lease (`svc_ridethrough`, issue 27): what keeps a
//! cluster with ride-through on by default safe when some vipd nodes cannot follow the
//! peer protocol's takeover rule (no peer key, `svc_ridethrough=false`).
//!
//! A holder that may ride through an API outage (its peer key read and a member of its own
//! membership, see `peer::node`) writes
//! [`RIDE_THROUGH_ANNOTATION`] with every write of the lease: the longest ride past the
//! lease's expiry it may make (`max_ride`, 60 s), tied to that write's `renewTime` like
//! [`super::record::LEASE_DURATION_ANNOTATION`] (another client's later write voids it). A
//! holder rides only on a renewal that carried the marker (the peer link records only those).
//!
//! A candidate that cannot follow the ride-through takeover rule (P5 of docs/design.md: it
//! has no key, or the option is off) takes a marked lease only at its last observed change +
//! lease duration + the marked ride ([`super::record::plain_may_take`]): the "without a blocking set" branch
//! of P5, whose bound (the holder's last grant ends by its renewal's send + lease duration +
//! `max_ride` - margin, and the candidate observed that renewal no earlier than it was sent)
//! the safety argument already proves. An unmarked lease is taken at plain expiry: its holder
//! never rides on it. kube-vip and vipd before this marker do not read it (docs/operators.md).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// Lease annotation of a holder that may ride through an API outage: `<secs>s@<renewTime in
/// microseconds since the Unix epoch>`, e.g. `60s@1764615341123456`.
pub const RIDE_THROUGH_ANNOTATION: &str = "vipd.io/ride-through";

/// Longest ride a marker may announce; a larger value is read as this (a marker is trusted
/// to lengthen a candidate's wait, and a broken one must not block a lease for hours).
pub const MAX_MARKED_RIDE: Duration = Duration::from_secs(600);

/// The [`RIDE_THROUGH_ANNOTATION`] value for a ride of up to `ride` written with `renew_time`.
pub(crate) fn marker_value(ride: Duration, renew_time: Timestamp) -> String {
    format!(
        "{}s@{}",
        ride.as_secs_f64().ceil() as u64,
        renew_time.as_microsecond()
    )
}

/// The ride of a [`RIDE_THROUGH_ANNOTATION`] value written with `renew_time` (to the
/// microsecond), at most [`MAX_MARKED_RIDE`]; `None` when absent, malformed or written with
/// another `renewTime` (another client wrote the lease since).
pub(crate) fn parse_marker(value: &str, renew_time: Option<Timestamp>) -> Option<Duration> {
    let (secs, micros) = value.split_once("s@")?;
    let (secs, micros) = (secs.parse::<u64>().ok()?, micros.parse::<i64>().ok()?);
    (renew_time?.as_microsecond() == micros).then(|| Duration::from_secs(secs).min(MAX_MARKED_RIDE))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The marker is tied to the write's renewTime: a later write by a client that keeps
    /// annotations (kube-vip's client-go) voids it; a huge value is capped; garbage is no
    /// marker.
    #[test]
    fn the_marker_is_tied_to_its_renew_time() {
        let t = Timestamp::from_microsecond(1_764_615_341_123_456).expect("time");
        let later = Timestamp::from_microsecond(1_764_615_342_123_456).expect("time");
        let v = marker_value(Duration::from_secs(60), t);
        assert_eq!(v, "60s@1764615341123456");
        assert_eq!(parse_marker(&v, Some(t)), Some(Duration::from_secs(60)));
        assert_eq!(parse_marker(&v, Some(later)), None);
        assert_eq!(parse_marker(&v, None), None);
        assert_eq!(
            parse_marker(&marker_value(Duration::from_secs(99_999), t), Some(t)),
            Some(MAX_MARKED_RIDE)
        );
        assert_eq!(parse_marker("yes", Some(t)), None);
        assert_eq!(parse_marker("-5s@1764615341123456", Some(t)), None);
    }
}
