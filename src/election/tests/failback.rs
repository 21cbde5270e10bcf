//! Fail-back (`svc_failback`): a returning preferred node asks, the holder hands over after
//! the hold-down with one graceful hand-over, never preempted.

use super::*;
use crate::election::failback::FailbackLink;
use crate::election::spread::{Spread, preference_delay};

const HOLDDOWN: Duration = Duration::from_secs(5);

fn list(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// An elector with spread, the preference delay of `preferred` and (with `failback`)
/// fail-back; also returns its fail-back hand-overs.
fn start_pref(
    server: &Arc<FakeServer>,
    who: &str,
    preferred: &[String],
    failback: bool,
) -> (Node, watch::Receiver<Option<String>>) {
    let mut handed = None;
    let delay = watch::channel(preference_delay(who, preferred)).1;
    let prefs = watch::channel(preferred.to_vec()).1;
    let node = start_built(server, who, who, true, |e| {
        let mut e = e.with_spread(Spread::new()).with_preference(delay);
        if failback {
            e = e.with_failback(FailbackLink {
                holddown: HOLDDOWN,
                preferred: prefs,
            });
        }
        handed = Some(e.failbacks());
        e
    });
    (node, handed.unwrap())
}

fn span_end(n: &Node) -> Option<Instant> {
    n.log
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(_, l)| !l)
        .map(|(t, _)| *t)
}

fn span_start(n: &Node) -> Option<Instant> {
    n.log
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(_, l)| *l)
        .map(|(t, _)| *t)
}

/// The preferred node comes back while a less preferred one holds: it asks on the lease, the
/// holder keeps the lease for the hold-down, then releases it to that node, which takes it at
/// once (without its preference delay of 100 ms). Never two leaders; the request is gone
/// from the new holder's record.
#[tokio::test(start_paused = true)]
async fn a_returning_preferred_node_gets_the_lease_after_the_holddown() {
    // "a" never runs: "p" is second (100 ms preference delay), "o" third.
    let preferred = list(&["a", "p", "o"]);
    let server = FakeServer::new();
    let (mut o, mut o_handed) = start_pref(&server, "o", &preferred, true);
    assert!(until_leading(&mut o, Duration::from_secs(1)).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut p, _) = start_pref(&server, "p", &preferred, true);
    // p asks at the holder's next renewal (a watch event).
    let asked = timeout(Duration::from_secs(2), async {
        loop {
            if server
                .record()
                .is_some_and(|r| r.failback_request.as_deref() == Some("p"))
            {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("p asked for a fail-back");
    assert_eq!(server.holder().as_deref(), Some("o"));
    // The holder's renewals keep the request, and it keeps the lease for the hold-down.
    assert!(
        !until_leading(&mut p, HOLDDOWN - Duration::from_millis(100)).await,
        "no hand-over before the hold-down"
    );
    assert_eq!(server.holder().as_deref(), Some("o"));
    assert_eq!(
        server.record().unwrap().failback_request.as_deref(),
        Some("p")
    );
    // At the first renewal after the hold-down: one graceful hand-over.
    assert!(until_leading(&mut p, TIMING.retry_period + Duration::from_millis(200)).await);
    assert!(Instant::now() - asked >= HOLDDOWN);
    assert!(!o.state.borrow().is_leading());
    assert!(o_handed.has_changed().unwrap());
    assert_eq!(o_handed.borrow_and_update().as_deref(), Some("p"));
    let gap = span_start(&p).unwrap() - span_end(&o).unwrap();
    assert!(
        gap < Duration::from_millis(100),
        "taken at once, not after the preference delay: {gap:?}"
    );
    let rec = server.record().unwrap();
    assert_eq!(rec.holder, "p");
    assert_eq!(
        rec.failback_request, None,
        "the acquisition clears the request"
    );
    // Exactly one release by o, naming p; and it stays with p.
    let releases: Vec<LeaseRecord> = server
        .state
        .lock()
        .unwrap()
        .writes
        .iter()
        .filter(|(w, r)| w == "o" && !r.is_held())
        .map(|(_, r)| r.clone())
        .collect();
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].failback_request.as_deref(), Some("p"));
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(server.holder().as_deref(), Some("p"));
    assert!(!o_handed.has_changed().unwrap());
    assert_never_two_leaders(&[&o, &p], Instant::now());
}

/// Without fail-back on the holder, the request stands and nothing moves: never a
/// preemption.
#[tokio::test(start_paused = true)]
async fn without_failback_on_the_holder_the_request_moves_nothing() {
    let preferred = list(&["p", "o"]);
    let server = FakeServer::new();
    let (mut o, _) = start_pref(&server, "o", &preferred, false);
    assert!(until_leading(&mut o, Duration::from_secs(1)).await);
    let (mut p, _) = start_pref(&server, "p", &preferred, true);
    assert!(!until_leading(&mut p, HOLDDOWN * 4).await, "no preemption");
    let rec = server.record().unwrap();
    assert_eq!(rec.holder, "o");
    assert_eq!(
        rec.failback_request.as_deref(),
        Some("p"),
        "kept by the renewals"
    );
}

/// A request by a node that is not more preferred than the holder is cleared by the
/// holder's next renewal, and nothing moves; a candidate whose gates are closed (not
/// campaigning) never asks.
#[tokio::test(start_paused = true)]
async fn requests_of_nodes_not_more_preferred_are_cleared_and_closed_gates_never_ask() {
    let preferred = list(&["p", "o"]);
    let server = FakeServer::new();
    let (mut o, o_handed) = start_pref(&server, "o", &preferred, true);
    assert!(until_leading(&mut o, Duration::from_secs(1)).await);
    let mut rec = server.record().unwrap();
    rec.failback_request = Some("x".into());
    server.force(rec);
    tokio::time::sleep(TIMING.retry_period + Duration::from_millis(100)).await;
    let rec = server.record().unwrap();
    assert_eq!(rec.holder, "o");
    assert_eq!(rec.failback_request, None, "cleared by the renewal");
    // p starts with a closed gate: it does not campaign, so it does not ask.
    let gates_closed = |n: &Node| n.gates.set("link", false);
    let (p, _) = start_pref(&server, "p", &preferred, true);
    gates_closed(&p);
    tokio::time::sleep(HOLDDOWN * 2).await;
    assert_eq!(server.record().unwrap().failback_request, None);
    assert_eq!(server.holder().as_deref(), Some("o"));
    assert!(!o_handed.has_changed().unwrap());
}
