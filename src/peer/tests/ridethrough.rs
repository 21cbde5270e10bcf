//! The ride-through rules one by one, on explicit instants (one node's view).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::Timing;
use crate::peer::ridethrough::*;
use crate::peer::wire::{Flags, HeldLease, Kind, LeaseRef, Message};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn cfg() -> RideConfig {
    let t = Timing {
        lease_duration: Duration::from_secs(5),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
    };
    RideConfig::new(&t, 2).expect("defaults")
}

fn lease() -> LeaseRef {
    LeaseRef {
        namespace: "default".into(),
        name: "web".into(),
    }
}

fn held(rv: &str) -> HeldLease {
    HeldLease {
        lease: lease(),
        term: 1,
        resource_version: rv.into(),
    }
}

const NONE: Flags = Flags {
    api_reachable: false,
    api_heard: false,
    api_hold: false,
};
const REACH: Flags = Flags {
    api_reachable: true,
    api_heard: false,
    api_hold: false,
};
const HOLD: Flags = Flags {
    api_reachable: false,
    api_heard: false,
    api_hold: true,
};

fn members(n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("n{i}")).collect()
}

/// Node `own` of `n` members.
fn node(own: &str, n: usize) -> Peers {
    let mut p = Peers::new(cfg(), own);
    p.set_membership(members(n));
    p
}

fn msg(from: &str, kind: Kind, flags: Flags, leases: Vec<HeldLease>, digest: u64) -> Message {
    Message {
        kind,
        node: from.into(),
        flags,
        membership: digest,
        wall_ms: 0,
        leases,
        target: None,
    }
}

fn hb(p: &Peers, from: &str, flags: Flags, leases: Vec<HeldLease>) -> Message {
    msg(from, Kind::Heartbeat, flags, leases, p.digest())
}

#[test]
fn config_rules_are_checked() {
    let c = cfg();
    assert_eq!(c.liveness, ms(600));
    assert!(c.check().is_ok());
    let e = RideConfig {
        liveness: ms(2250),
        ..c
    }
    .check()
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("shorter than the fence plus margin (2250 ms)"),
        "{e}"
    );
    let e = RideConfig {
        flag_hold: ms(250),
        ..c
    }
    .check()
    .unwrap_err();
    assert!(e.to_string().contains("flag hold 250 ms"), "{e}");
    let e = RideConfig {
        liveness: ms(300),
        ..c
    }
    .check()
    .unwrap_err();
    assert!(e.to_string().contains("two heartbeat intervals"), "{e}");
}

#[test]
fn flags_keep_the_hold_promise_then_clear() {
    let t0 = Instant::now();
    let mut p = node("n0", 3);
    p.set_api(t0, true);
    assert_eq!(p.outgoing_flags(t0), REACH);
    p.set_api(t0 + ms(100), false);
    // Within the hold after the last vouching frame: api_hold; after it: nothing.
    assert_eq!(p.outgoing_flags(t0 + ms(200)), HOLD);
    assert_eq!(p.outgoing_flags(t0 + ms(999)), HOLD);
    assert_eq!(p.outgoing_flags(t0 + ms(1000)), NONE);
    // Hearing a peer that reaches the API: api_heard for the liveness window, then the hold.
    let t1 = t0 + ms(5000);
    p.receive(t1, &hb(&p, "n1", REACH, vec![]));
    let heard = p.outgoing_flags(t1 + ms(600));
    assert!(heard.api_heard && !heard.api_reachable && !heard.api_hold);
    assert_eq!(p.outgoing_flags(t1 + ms(601)), HOLD);
    assert_eq!(p.outgoing_flags(t1 + ms(1600)), NONE);
    // A hold never renews itself.
    assert_eq!(p.outgoing_flags(t1 + ms(1700)), NONE);
}

/// A holder of n0 among 3 that lost the API 1 s after renewing at t0.
fn rider(t0: Instant) -> Peers {
    let mut p = node("n0", 3);
    p.set_api(t0, true);
    p.renewed(held("10"), t0, false);
    p.set_api(t0 + ms(1000), false);
    p
}

#[test]
fn ride_needs_a_quiet_majority() {
    let t0 = Instant::now();
    let mut p = rider(t0);
    let t = t0 + ms(2000);
    assert_eq!(
        p.may_ride_through(t, &lease()),
        RideDecision::StepDown(StepDownReason::NoMajority { heard: 1, of: 3 })
    );
    p.receive(t, &hb(&p, "n1", NONE, vec![]));
    assert_eq!(
        p.may_ride_through(t, &lease()),
        RideDecision::Ride {
            until: t + Duration::from_secs(2)
        }
    );
    // A peer with another membership does not count.
    let mut q = rider(t0);
    q.receive(t, &msg("n1", Kind::Heartbeat, NONE, vec![], q.digest() ^ 1));
    assert!(matches!(
        q.may_ride_through(t, &lease()),
        RideDecision::StepDown(StepDownReason::NoMajority { heard: 1, of: 3 })
    ));
    // Heard too long ago does not count either.
    let mut q = rider(t0);
    q.receive(t - ms(601), &hb(&q, "n1", NONE, vec![]));
    assert!(matches!(
        q.may_ride_through(t, &lease()),
        RideDecision::StepDown(StepDownReason::NoMajority { .. })
    ));
}

#[test]
fn any_flag_stops_a_ride_even_a_hold() {
    let t0 = Instant::now();
    let mut p = rider(t0);
    let t = t0 + ms(2000);
    p.receive(t, &hb(&p, "n1", NONE, vec![]));
    // A non-member's hold-only frame counts too.
    p.receive(t, &hb(&p, "stranger", HOLD, vec![]));
    assert_eq!(
        p.may_ride_through(t, &lease()),
        RideDecision::StepDown(StepDownReason::PeerReachesApi {
            node: "stranger".into()
        })
    );
    // Within the API fence it may start once the flag is older than the liveness window.
    let t2 = t + ms(601);
    p.receive(t2, &hb(&p, "n1", NONE, vec![]));
    assert!(matches!(
        p.may_ride_through(t2, &lease()),
        RideDecision::Ride { .. }
    ));
}

#[test]
fn ride_rules_in_order() {
    let t0 = Instant::now();
    let mut p = rider(t0);
    let other = LeaseRef {
        namespace: "default".into(),
        name: "other".into(),
    };
    assert_eq!(
        p.may_ride_through(t0, &other),
        RideDecision::StepDown(StepDownReason::NotHeld)
    );
    p.set_api(t0 + ms(1500), true);
    assert_eq!(
        p.may_ride_through(t0 + ms(1500), &lease()),
        RideDecision::NotNeeded
    );
    p.set_api(t0 + ms(1600), false);

    let mut cp = node("n0", 3);
    cp.renewed(held("1"), t0, true);
    assert_eq!(
        cp.may_ride_through(t0 + ms(100), &lease()),
        RideDecision::StepDown(StepDownReason::ControlPlane)
    );

    let mut nm = rider(t0);
    nm.set_membership(["n1", "n2"].iter().map(|s| s.to_string()).collect());
    assert_eq!(
        nm.may_ride_through(t0 + ms(2000), &lease()),
        RideDecision::StepDown(StepDownReason::NotMember)
    );

    let t = t0 + ms(2000);
    p.receive(t, &hb(&p, "n1", NONE, vec![held("11")]));
    assert_eq!(
        p.may_ride_through(t, &lease()),
        RideDecision::StepDown(StepDownReason::OtherHolder { node: "n1".into() })
    );
    assert!(StepDownReason::OtherHolder { node: "n1".into() }.drop_now());
    // Final: a later quiet majority does not bring it back.
    p.receive(t + ms(700), &hb(&p, "n1", NONE, vec![]));
    assert!(matches!(
        p.may_ride_through(t + ms(700), &lease()),
        RideDecision::StepDown(StepDownReason::OtherHolder { .. })
    ));
}

#[test]
fn ride_chain_gap_and_cap() {
    let t0 = Instant::now();
    let mut p = rider(t0);
    // API fence: 5 s - 250 ms after the renewal was sent. Ride from 4 s on, every 500 ms.
    let mut t = t0 + ms(4000);
    let mut last = None;
    while t < t0 + ms(12_000) {
        p.receive(t, &hb(&p, "n1", NONE, vec![]));
        let d = p.may_ride_through(t, &lease());
        assert!(
            matches!(d, RideDecision::Ride { .. }),
            "{d:?} at {:?}",
            t - t0
        );
        last = Some(t);
        t += ms(500);
    }
    // A stall longer than the liveness window past the API fence ends it, for good.
    let t = last.expect("rode") + ms(601);
    p.receive(t, &hb(&p, "n1", NONE, vec![]));
    assert_eq!(
        p.may_ride_through(t, &lease()),
        RideDecision::StepDown(StepDownReason::Gap)
    );
    p.receive(t + ms(100), &hb(&p, "n1", NONE, vec![]));
    assert_eq!(
        p.may_ride_through(t + ms(100), &lease()),
        RideDecision::StepDown(StepDownReason::Gap)
    );
    // Never started before the API fence ended: Gap too.
    let mut q = rider(t0);
    let t = t0 + ms(4750);
    q.receive(t, &hb(&q, "n1", NONE, vec![]));
    assert_eq!(
        q.may_ride_through(t, &lease()),
        RideDecision::StepDown(StepDownReason::Gap)
    );

    // The cap: the grant ends by renewal + lease duration + max_ride - margin.
    let c = cfg();
    let cap = t0 + c.lease_duration + c.max_ride - c.margin;
    let mut q = rider(t0);
    let mut t = t0 + ms(4000);
    let mut grants = Vec::new();
    loop {
        q.receive(t, &hb(&q, "n1", NONE, vec![]));
        match q.may_ride_through(t, &lease()) {
            RideDecision::Ride { until } => grants.push(until),
            RideDecision::StepDown(r) => {
                assert_eq!(r, StepDownReason::RideTooLong);
                break;
            }
            RideDecision::NotNeeded => unreachable!(),
        }
        t += ms(500);
    }
    assert!(t >= cap && t < cap + ms(500));
    assert_eq!(grants.last(), Some(&cap));
}

#[test]
fn hand_over_request_releases_only_without_api() {
    let t0 = Instant::now();
    let mut p = rider(t0);
    let mut req = msg(
        "n2",
        Kind::HandOverRequest,
        REACH,
        vec![held("10")],
        p.digest(),
    );
    req.target = Some("n1".into());
    p.receive(t0 + ms(1500), &req);
    assert_eq!(
        p.should_release(t0 + ms(1500), &lease()),
        None,
        "not for us"
    );
    req.target = Some("n0".into());
    p.receive(t0 + ms(1500), &req);
    assert_eq!(p.should_release(t0 + ms(1500), &lease()), Some("n2".into()));
    // Stale after the liveness window.
    assert_eq!(p.should_release(t0 + ms(2101), &lease()), None);
    // Not while we reach the API (we renew instead).
    p.set_api(t0 + ms(1600), true);
    assert_eq!(p.should_release(t0 + ms(1600), &lease()), None);
    p.set_api(t0 + ms(1700), false);
    assert_eq!(p.listed(t0 + ms(1700)), vec![held("10")]);
    assert_eq!(p.released(&lease()), Some(held("10")));
    assert!(p.listed(t0 + ms(1700)).is_empty());
    assert_eq!(
        p.may_ride_through(t0 + ms(1700), &lease()),
        RideDecision::StepDown(StepDownReason::Released)
    );
}

fn view(holder: Option<&str>, rv: &str, observed_at: Instant) -> LeaseView {
    LeaseView {
        lease: lease(),
        holder: holder.map(str::to_string),
        resource_version: rv.into(),
        observed_at,
        control_plane: false,
        marked: true,
    }
}

#[test]
fn take_with_consent() {
    let t0 = Instant::now();
    let mut c = node("n1", 3);
    let v = view(Some("n0"), "10", t0);
    assert_eq!(c.may_take(t0, &v), TakeDecision::NoApi);
    c.set_api(t0, true);
    assert_eq!(
        c.may_take(t0, &view(None, "10", t0)),
        TakeDecision::Take(TakeReason::NoOtherHolder)
    );
    let cp = LeaseView {
        control_plane: true,
        ..v.clone()
    };
    assert_eq!(c.may_take(t0 + ms(4999), &cp), TakeDecision::NotExpired);
    assert_eq!(
        c.may_take(t0 + ms(5000), &cp),
        TakeDecision::Take(TakeReason::ControlPlane)
    );

    // Holder heard listing the lease and reaching the API: defer, even when expired.
    let t = t0 + ms(6000);
    c.receive(t, &hb(&c, "n0", REACH, vec![held("10")]));
    assert_eq!(
        c.may_take(t, &v),
        TakeDecision::Defer {
            holder: "n0".into()
        }
    );
    // Holder cut off from the API: ask, once we reached the API for the ask delay (3 s)
    // and a probe sent after the holder said so answered (our last good answer may be
    // older than its outage: an API server whose etcd stalls answers for a while).
    c.receive(t, &hb(&c, "n0", NONE, vec![held("10")]));
    c.probe_ok(t - ms(1));
    assert_eq!(
        c.may_take(t, &v),
        TakeDecision::Defer {
            holder: "n0".into()
        }
    );
    c.probe_ok(t + ms(1));
    assert_eq!(
        c.may_take(t + ms(10), &v),
        TakeDecision::AskFirst {
            holder: "n0".into()
        }
    );
    // A later frame of it saying the same keeps the first one's time; one that reaches the
    // API starts it again.
    c.receive(t + ms(200), &hb(&c, "n0", NONE, vec![held("10")]));
    assert!(matches!(
        c.may_take(t + ms(210), &v),
        TakeDecision::AskFirst { .. }
    ));
    let mut back = c.clone();
    back.receive(t + ms(200), &hb(&back, "n0", REACH, vec![held("10")]));
    back.receive(t + ms(400), &hb(&back, "n0", NONE, vec![held("10")]));
    assert!(matches!(
        back.may_take(t + ms(410), &v),
        TakeDecision::Defer { .. }
    ));
    // ... but not while the holder renewed within the ask delay (a short blip of its API).
    assert_eq!(
        c.may_take(t, &view(Some("n0"), "10", t - ms(2999))),
        TakeDecision::Defer {
            holder: "n0".into()
        }
    );
    assert_eq!(
        c.may_take(t, &view(Some("n0"), "10", t - ms(3000))),
        TakeDecision::AskFirst {
            holder: "n0".into()
        }
    );
    let mut late = node("n1", 3);
    late.set_api(t - ms(2999), true);
    late.receive(t, &hb(&late, "n0", NONE, vec![held("10")]));
    assert_eq!(
        late.may_take(t, &v),
        TakeDecision::Defer {
            holder: "n0".into()
        }
    );
    // Released for this very version: take, expired or not.
    c.receive(
        t,
        &msg("n0", Kind::Released, NONE, vec![held("10")], c.digest()),
    );
    assert_eq!(
        c.may_take(t, &view(Some("n0"), "10", t)),
        TakeDecision::Take(TakeReason::Released {
            holder: "n0".into()
        })
    );
    // ... but not for another version.
    assert_eq!(
        c.may_take(t, &view(Some("n0"), "11", t)),
        TakeDecision::NotExpired
    );
    // Heartbeating without the lease: take once expired.
    let mut d = node("n1", 3);
    d.set_api(t0, true);
    d.receive(t, &hb(&d, "n0", NONE, vec![]));
    assert_eq!(
        d.may_take(t, &view(Some("n0"), "10", t)),
        TakeDecision::NotExpired
    );
    assert_eq!(
        d.may_take(t, &v),
        TakeDecision::Take(TakeReason::NotListed {
            holder: "n0".into()
        })
    );
}

#[test]
fn take_from_a_silent_holder_needs_a_blocking_set_or_the_cap() {
    let t0 = Instant::now();
    // n1 of 3; the holder n0 last heard (listing) at t0 + 1 s.
    let mut c = node("n1", 3);
    c.set_api(t0, true);
    let d = c.digest();
    c.receive(t0 + ms(1000), &hb(&c, "n0", NONE, vec![held("10")]));
    let v = view(Some("n0"), "10", t0);
    // Vouching since t0 (own frames) and n2's frames every 200 ms.
    let t5 = t0 + ms(5000);
    let mut t = t0;
    while t <= t5 {
        assert!(c.outgoing_flags(t).api_reachable);
        c.receive(t, &msg("n2", Kind::Heartbeat, REACH, vec![], d));
        if t == t0 + ms(4000) {
            assert_eq!(c.may_take(t, &v), TakeDecision::NotExpired);
        }
        t += ms(200);
    }
    // Expired at 5 s; evidence (2.9 s) since t0: a blocking set of 2 (n1, n2) of 3.
    assert_eq!(
        c.may_take(t5, &v),
        TakeDecision::Take(TakeReason::HolderSilent {
            holder: "n0".into()
        })
    );

    // n2 unflagged once: its streak restarts, only n1 vouches: wait for the cap.
    let mut e = c.clone();
    e.receive(t5, &msg("n2", Kind::Heartbeat, NONE, vec![], d));
    e.receive(t5 + ms(100), &msg("n2", Kind::Heartbeat, REACH, vec![], d));
    let cap = t0 + ms(5000) + Duration::from_secs(60);
    assert_eq!(
        e.may_take(t5 + ms(100), &v),
        TakeDecision::WaitUntil {
            at: cap,
            why: WaitReason::NoQuorum {
                vouching: 1,
                needed: 2
            }
        }
    );
    assert_eq!(
        e.may_take(cap, &v),
        TakeDecision::Take(TakeReason::RideCapPassed {
            holder: "n0".into()
        })
    );
    // A hold-only frame neither breaks nor extends the streak.
    let mut h = c.clone();
    h.receive(t5 + ms(200), &msg("n2", Kind::Heartbeat, HOLD, vec![], d));
    h.outgoing_flags(t5 + ms(200));
    assert!(matches!(
        h.may_take(t5 + ms(200), &v),
        TakeDecision::Take(_)
    ));
    // Vouching that is not fresh (last real flag more than hold - delivery ago) does not count.
    assert!(matches!(
        h.may_take(t5 + ms(951), &v),
        TakeDecision::WaitUntil {
            why: WaitReason::NoQuorum { vouching: 1, .. },
            ..
        }
    ));
    // The holder's membership unknown or different: no blocking set.
    let mut u = node("n1", 3);
    u.set_api(t0, true);
    u.receive(
        t0 + ms(1000),
        &msg("n0", Kind::Heartbeat, NONE, vec![held("10")], d ^ 1),
    );
    assert!(matches!(
        u.may_take(t5, &v),
        TakeDecision::WaitUntil {
            why: WaitReason::NoQuorum { vouching: 0, .. },
            ..
        }
    ));
    // Heard listing 1 s ago (silent for longer than the liveness window since): the
    // blocking set alone decides, no extra silence wait (the rule this replaced took the
    // lease only 2.85 s after the holder was last heard).
    let mut s = c.clone();
    s.receive(t5 - ms(1000), &hb(&s, "n0", NONE, vec![held("10")]));
    assert_eq!(
        s.may_take(t5, &v),
        TakeDecision::Take(TakeReason::HolderSilent {
            holder: "n0".into()
        })
    );
    // Heard within the liveness window: not silent; it cannot reach the API and the lease
    // is past the ask delay: ask it first.
    let mut r = c.clone();
    r.receive(t5 - ms(500), &hb(&r, "n0", NONE, vec![held("10")]));
    r.probe_ok(t5 - ms(400));
    assert_eq!(
        r.may_take(t5, &v),
        TakeDecision::AskFirst {
            holder: "n0".into()
        }
    );
}

/// Issue 27 (b): the flags fade one frame after their source's do. The holder looks at each
/// peer's latest frame in the window (an older flagged one followed by an unflagged one
/// only says the flags faded), and a relay stops saying `api_heard` as soon as the latest
/// frame of the node it relays no longer says `api_reachable`.
#[test]
fn flags_fade_with_the_latest_frame_of_each_peer() {
    let t0 = Instant::now();
    let mut p = rider(t0);
    let t = t0 + ms(2000);
    p.receive(t - ms(300), &hb(&p, "n1", HOLD, vec![]));
    p.receive(t - ms(100), &hb(&p, "n1", NONE, vec![]));
    assert!(
        matches!(p.may_ride_through(t, &lease()), RideDecision::Ride { .. }),
        "the peer's latest frame carries no flag"
    );
    // Its latest frame flagged again: no ride.
    p.receive(t + ms(100), &hb(&p, "n1", HOLD, vec![]));
    assert_eq!(
        p.may_ride_through(t + ms(100), &lease()),
        RideDecision::StepDown(StepDownReason::PeerReachesApi { node: "n1".into() })
    );

    // A relay: n2 heard n1 reach the API, then n1's next frame says it no longer does.
    let mut relay = node("n2", 3);
    relay.receive(t0, &hb(&relay, "n1", REACH, vec![]));
    let heard = relay.outgoing_flags(t0 + ms(10));
    assert!(heard.api_heard, "{heard:?}");
    relay.receive(t0 + ms(200), &hb(&relay, "n1", HOLD, vec![]));
    let after = relay.outgoing_flags(t0 + ms(210));
    assert!(!after.api_heard && after.api_hold, "{after:?}");
}

/// Issue 27 (b): timings with which a ride cannot start within the API fence of an outage
/// that begins right after a renewal are refused, naming the fields and values and timings
/// that work; those timings pass.
#[test]
fn timings_where_a_ride_cannot_start_in_time_are_refused() {
    let t = |l: u64, r: u64, p: u64| Timing {
        lease_duration: Duration::from_secs(l),
        renew_deadline: Duration::from_secs(r),
        retry_period: Duration::from_secs(p),
    };
    let c = cfg();
    assert_eq!(c.ride_start_bound(), ms(2900));
    assert_eq!(c.api_fence_after_outage(), ms(3750));
    let e = RideConfig::new(&t(3, 2, 1), 2).unwrap_err().to_string();
    for part in [
        "svc_leaseduration 3 s",
        "svc_retryperiod 1 s",
        "as early as 1750 ms",
        "up to 2900 ms",
        "svc_leaseduration=5 svc_renewdeadline=3 svc_retryperiod=1",
    ] {
        assert!(e.contains(part), "{part} missing: {e}");
    }
    assert!(RideConfig::new(&t(4, 2, 1), 2).is_err());
    let (l, r, p) = RIDE_SERVICE_TIMINGS;
    let works = t(l.parse().unwrap(), r.parse().unwrap(), p.parse().unwrap());
    assert!(RideConfig::new(&works, 2).is_ok());
    // The model may still run timings that cannot start a ride (liveness, not safety).
    assert!(RideConfig::unchecked_start(&t(3, 2, 1), 2).is_ok());
}

/// A silent holder whose observed write carries no ride-through marker cannot ride on it
/// (it had not read the Node objects yet, e.g. killed right after its start, or it is not a
/// member of its own membership): its lease is taken at expiry, not after the ride cap; a
/// marked one still needs a blocking set. Heard or never heard alike.
#[test]
fn an_unmarked_lease_of_a_silent_holder_is_taken_at_expiry() {
    let t0 = Instant::now();
    for heard in [true, false] {
        let mut c = node("n1", 3);
        c.set_api(t0, true);
        if heard {
            let empty = crate::peer::membership_digest(&BTreeSet::new());
            c.receive(
                t0 + ms(100),
                &msg("n0", Kind::Heartbeat, NONE, vec![held("10")], empty),
            );
        }
        let unmarked = LeaseView {
            marked: false,
            ..view(Some("n0"), "10", t0)
        };
        assert_eq!(
            c.may_take(t0 + ms(4999), &unmarked),
            TakeDecision::NotExpired
        );
        assert_eq!(
            c.may_take(t0 + ms(5000), &unmarked),
            TakeDecision::Take(TakeReason::Unmarked {
                holder: "n0".into()
            }),
            "heard {heard}"
        );
        assert!(matches!(
            c.may_take(t0 + ms(5000), &view(Some("n0"), "10", t0)),
            TakeDecision::WaitUntil { .. }
        ));
    }
    // Heard listing it and cut off from the API: asked as before, marked or not.
    let mut c = node("n1", 3);
    c.set_api(t0, true);
    let t = t0 + ms(6000);
    c.receive(t, &hb(&c, "n0", NONE, vec![held("10")]));
    c.probe_ok(t + ms(1));
    let unmarked = LeaseView {
        marked: false,
        ..view(Some("n0"), "10", t0)
    };
    assert!(matches!(
        c.may_take(t + ms(10), &unmarked),
        TakeDecision::AskFirst { .. }
    ));
}

/// A node marks its writes (and so may ride) only as a member of its own membership.
#[test]
fn only_a_member_marks() {
    let mut p = Peers::new(cfg(), "n1");
    assert!(!p.may_mark(), "no Node objects read yet");
    p.set_membership(members(3));
    assert!(p.may_mark());
    p.set_membership(members(3).into_iter().filter(|n| n != "n1").collect());
    assert!(!p.may_mark(), "its Node missing or named otherwise");
}
