//! The manager side of the peer protocol: the ride grant as the VIP holder sees it.

use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::watch;

use crate::election::LeaderState;
use crate::lease::FENCE_MARGIN;
use crate::lease::fence_grant;
use crate::lease::fence_lapsed;
use crate::peer::node::{hand_over_requests, publish_grant, ride_renewed_at};
use crate::peer::wire::{Encoder, Flags, HeldLease, Kind, LeaseRef, Message, PeerKey};

const LEASE: Duration = Duration::from_secs(5);
const FENCE_SECS: u32 = 2;

/// A ride grant `until` published as `renewed_at`: at every instant the holder gives a
/// lifetime that ends no later than `until`, and from `until` on it holds nothing.
#[tokio::test(start_paused = true)]
async fn ride_grant_bounds_every_lifetime_the_holder_gives() {
    let e = Instant::now();
    let until = e + Duration::from_secs(2);
    let r = ride_renewed_at(until, LEASE).expect("renewed_at");
    assert_eq!(r + LEASE - FENCE_MARGIN, until);
    let mut t = e;
    let mut granted_any = false;
    while t < until + Duration::from_millis(500) {
        let age = t.saturating_duration_since(r);
        let grant = fence_grant(FENCE_SECS, LEASE, age);
        let lapsed = fence_lapsed(LEASE, FENCE_MARGIN, age);
        if t >= until {
            assert!(
                lapsed,
                "the holder must hold nothing at or after until ({t:?})"
            );
        } else {
            assert!(!lapsed, "before until the grant stands ({t:?})");
        }
        assert!(
            grant == 0 || t + Duration::from_secs(u64::from(grant)) <= until,
            "a lifetime of {grant} s given at {:?} outlives the grant",
            t - e
        );
        granted_any |= grant > 0;
        t += Duration::from_millis(10);
    }
    assert!(granted_any, "a fresh grant gives at least one second");
    // Right after the evaluation the holder gives one whole second (a 2 s grant less the
    // time since), refreshed at every heartbeat.
    assert_eq!(
        fence_grant(FENCE_SECS, LEASE, (e + Duration::from_millis(1)) - r),
        1
    );
}

/// A grant raises `renewed_at` of the reported term only, never lowers it, and never turns
/// a step-down (Following) or another term back into leading; a touch notifies the holder
/// without changing anything.
#[tokio::test(start_paused = true)]
async fn grants_only_raise_the_reported_term() {
    let t0 = Instant::now();
    let leading = |term, renewed_at| LeaderState::Leading {
        term,
        renewed_at,
        clean: false,
    };
    let (tx, mut rx) = watch::channel(leading(3, t0));
    rx.borrow_and_update();
    let later = t0 + Duration::from_secs(1);
    assert!(publish_grant(&tx, 3, Some(later), false));
    assert_eq!(*rx.borrow_and_update(), leading(3, later));
    // Lower: unchanged, no notification unless touched.
    assert!(!publish_grant(&tx, 3, Some(t0), false));
    assert!(!rx.has_changed().unwrap());
    assert!(publish_grant(&tx, 3, Some(t0), true));
    assert_eq!(*rx.borrow_and_update(), leading(3, later));
    // Another term: untouched.
    assert!(!publish_grant(
        &tx,
        2,
        Some(later + Duration::from_secs(1)),
        true
    ));
    assert_eq!(*tx.borrow(), leading(3, later));
    // A step-down stays a step-down.
    tx.send_replace(LeaderState::Following { holder: None });
    assert!(!publish_grant(
        &tx,
        3,
        Some(later + Duration::from_secs(5)),
        true
    ));
    assert_eq!(*tx.borrow(), LeaderState::Following { holder: None });
}

fn asked(name: &str, rv: &str) -> HeldLease {
    HeldLease {
        lease: LeaseRef {
            namespace: "default".into(),
            name: name.into(),
        },
        term: 0,
        resource_version: rv.into(),
    }
}

/// A candidate that asks one holder for several leases at once (a busy holder partitioned
/// from the API: the chaos soak's 17 Services per node) sends one request per lease, and
/// every one of them encodes; the grouped request it used to build is refused by the
/// encoder (so nothing was sent).
#[test]
fn hand_over_requests_name_one_lease_each_and_encode() {
    let base = Message {
        kind: Kind::HandOverRequest,
        node: "node-a".into(),
        flags: Flags {
            api_reachable: true,
            api_heard: false,
            api_hold: false,
        },
        membership: 7,
        wall_ms: 1_790_000_000_000,
        leases: Vec::new(),
        target: None,
    };
    let asks = [
        (
            "node-b".to_string(),
            vec![asked("kubevip-svc-1", "10"), asked("kubevip-svc-2", "11")],
        ),
        ("node-c".to_string(), vec![asked("kubevip-svc-3", "12")]),
    ]
    .into();
    let msgs = hand_over_requests(&base, asks);
    let shape: Vec<(Option<&str>, Vec<&str>)> = msgs
        .iter()
        .map(|m| {
            (
                m.target.as_deref(),
                m.leases.iter().map(|l| l.lease.name.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (Some("node-b"), vec!["kubevip-svc-1"]),
            (Some("node-b"), vec!["kubevip-svc-2"]),
            (Some("node-c"), vec!["kubevip-svc-3"]),
        ]
    );
    let key = PeerKey::from_bytes(&[9; 32]).expect("32-byte key");
    let mut enc = Encoder::new(key, 1);
    for m in &msgs {
        assert_eq!(m.kind, Kind::HandOverRequest);
        assert_eq!((m.node.as_str(), m.membership), ("node-a", 7));
        let frames = enc.encode(m).expect("a hand-over request encodes");
        assert_eq!(frames.len(), 1);
    }
    let grouped = Message {
        leases: vec![asked("kubevip-svc-1", "10"), asked("kubevip-svc-2", "11")],
        target: Some("node-b".into()),
        ..base
    };
    assert!(enc.encode(&grouped).is_err());
}
