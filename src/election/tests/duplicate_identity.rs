//! Elector tests of duplicate identity (two processes under one node name): a lease under
//! our identity counts as ours only if this process wrote it (see the module docs).

use super::*;

/// A restart (or a twin) finds a lease under its own identity that this process did not
/// write: it is not taken before it expires (lease duration after it was last seen to
/// change), and it is taken then. Nothing changed meanwhile, so no duplicate is reported.
/// (Before S35 a restarted process renewed such a lease at once.)
#[tokio::test(start_paused = true)]
async fn own_identity_lease_found_at_start_is_taken_only_after_it_expires() {
    let server = FakeServer::new();
    let mut first = start_as(&server, "run-1", "x", true);
    assert!(until_leading(&mut first, Duration::from_millis(10)).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Crash: no release, the lease stays under "x".
    first.task.abort();
    let _ = (&mut first.task).await;
    let last_write = server.writes_by("run-1");
    let t0 = Instant::now();
    let mut second = start_as(&server, "run-2", "x", true);
    assert!(
        !until_leading(&mut second, Duration::from_millis(4900)).await,
        "took its own stale lease before it expired"
    );
    assert_eq!(server.writes_by("run-2"), 0);
    assert_eq!(
        *second.state.borrow(),
        LeaderState::Following {
            holder: Some("x".into())
        }
    );
    assert!(until_leading(&mut second, Duration::from_millis(200)).await);
    let took = Instant::now() - t0;
    assert!(took >= TIMING.lease_duration, "took it after {took:?}");
    assert!(
        took <= TIMING.lease_duration + Duration::from_millis(100),
        "took it after {took:?}"
    );
    assert_eq!(server.holder().as_deref(), Some("x"));
    assert_eq!(server.writes_by("run-1"), last_write);
    assert!(!second.duplicate_ever(), "{:?}", second.duplicate_log);
    assert!(second.duplicate.borrow().is_none());
}

/// A holder sees its lease renewed under its identity by somebody else (a twin that believes
/// the lease is its own, e.g. an older vipd): it steps down at once without releasing, the
/// condition is published, it stays out while the twin renews and takes the lease back
/// only after it expired; then the condition clears.
#[tokio::test(start_paused = true)]
async fn twin_renewing_under_our_identity_makes_the_holder_step_down_without_releasing() {
    let server = FakeServer::new();
    let mut a = start_as(&server, "node-a", "x", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let writes_before = server.writes_by("node-a");
    server.renew_as("x");
    let twin_rec = server.record().unwrap();
    assert!(until_following(&mut a, Duration::from_millis(10)).await);
    assert_eq!(
        *a.duplicate.borrow(),
        Some(DuplicateIdentity {
            lease: "test/lease".into(),
            identity: "x".into()
        })
    );
    // Not released: the record is still the twin's.
    assert_eq!(server.writes_by("node-a"), writes_before);
    assert_eq!(server.record(), Some(twin_rec));
    // The twin keeps renewing for 20 s: a never leads again, and raises the condition once.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        server.renew_as("x");
        assert!(!a.state.borrow().is_leading());
    }
    assert_eq!(server.writes_by("node-a"), writes_before);
    let raised = a
        .duplicate_log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, d)| d.is_some())
        .count();
    assert_eq!(raised, 1, "{:?}", a.duplicate_log);
    // The twin is gone: a takes the lease once it expired, and the condition clears.
    let gone = Instant::now();
    assert!(until_leading(&mut a, Duration::from_secs(6)).await);
    let back = Instant::now() - gone;
    assert!(back >= TIMING.lease_duration, "back after {back:?}");
    assert!(a.duplicate.borrow().is_none());
}

/// Two live processes with one identity: the one that comes second never leads while the
/// first renews, reports the duplicate (the first has no reason to), and takes over when
/// the first is partitioned away (after the lease expired) or stops (released: at once).
#[tokio::test(start_paused = true)]
async fn two_processes_with_one_identity_never_lead_together() {
    let server = FakeServer::new();
    let mut a = start_as(&server, "node-a", "x", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let mut b = start_as(&server, "node-b", "x", true);
    // b's first read may be the lease as it is (not yet a proof); a's next renewal is.
    assert!(
        timeout(
            TIMING.retry_period + Duration::from_millis(100),
            b.duplicate.wait_for(Option::is_some)
        )
        .await
        .is_ok(),
        "b did not report the duplicate"
    );
    assert!(!until_leading(&mut b, Duration::from_secs(30)).await);
    assert_eq!(server.writes_by("node-b"), 0, "b never writes a's lease");
    assert!(a.state.borrow().is_leading());
    assert!(!a.duplicate_ever(), "a saw no write but its own");
    // a is partitioned: it steps down by its renew deadline, b takes the expired lease.
    server.cut("node-a", true);
    let cut_at = Instant::now();
    assert!(until_leading(&mut b, Duration::from_secs(7)).await);
    assert!(Instant::now() - cut_at >= TIMING.lease_duration - TIMING.retry_period);
    assert!(
        b.duplicate.borrow().is_none(),
        "cleared by a legitimate acquisition"
    );
    // a comes back: b's lease is under "x" but not a's write: a follows and reports.
    server.cut("node-a", false);
    assert!(!until_leading(&mut a, Duration::from_secs(20)).await);
    assert!(a.duplicate.borrow().is_some());
    assert_never_two_leaders(&[&a, &b], Instant::now());
    // b stops gracefully: a takes the released lease at once.
    b.shutdown.cancel();
    (&mut b.task).await.unwrap();
    assert!(until_leading(&mut a, Duration::from_millis(100)).await);
    assert!(a.duplicate.borrow().is_none());
    assert_never_two_leaders(&[&a, &b], Instant::now());
}

/// Both start at once with no lease: one creates it, the other's create fails and its
/// re-read shows a write under its name made by somebody else (it had seen no lease).
#[tokio::test(start_paused = true)]
async fn simultaneous_start_under_one_identity_one_leads() {
    let server = FakeServer::new();
    let nodes = [
        start_as(&server, "node-a", "x", true),
        start_as(&server, "node-b", "x", true),
    ];
    tokio::time::sleep(Duration::from_secs(15)).await;
    let leading: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.state.borrow().is_leading())
        .collect();
    assert_eq!(leading.len(), 1);
    let reported: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.duplicate.borrow().is_some())
        .collect();
    assert_eq!(reported.len(), 1);
    assert!(!reported[0].state.borrow().is_leading());
    let refs: Vec<&Node> = nodes.iter().collect();
    assert_never_two_leaders(&refs, Instant::now());
}

/// Our own writes never look like a twin's: renewals seen on the watch, a renewal whose
/// answer was lost (applied, then re-read after the 409 of the next attempt), and a
/// metadata-only change of the Lease (new resourceVersion, same record).
#[tokio::test(start_paused = true)]
async fn own_writes_never_raise_duplicate_identity() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    server.lose_next_answer("a");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rec = server.record().unwrap();
    server.force(rec);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(a.state.borrow().is_leading());
    let log = a.log.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "led without a break: {log:?}");
    assert!(!a.duplicate_ever(), "{:?}", a.duplicate_log);
    assert!(server.writes_by("a") >= 20);
}

/// A lagging (shared) watch delivers, before this process could read the lease, late
/// events of writes made before it started (its predecessor's last renewals, under the same
/// identity). Those changes happened before we ran: no duplicate is reported, and the stale
/// lease is taken once it expires.
#[tokio::test(start_paused = true)]
async fn late_watch_events_from_before_start_are_no_duplicate() {
    let server = FakeServer::new();
    server.renew_as("x");
    let older = server.observed().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.renew_as("x");
    let newer = server.observed().unwrap();
    // b's first read times out (slower than the call timeout)...
    server.state.lock().unwrap().get_delay = Duration::from_secs(2);
    let mut b = start_as(&server, "node-b", "x", true);
    tokio::time::sleep(TIMING.call_timeout() + Duration::from_millis(100)).await;
    // ...and meanwhile the watch delivers both old writes, in order.
    server.replay(older);
    server.replay(newer);
    server.state.lock().unwrap().get_delay = Duration::ZERO;
    assert!(until_leading(&mut b, TIMING.lease_duration + Duration::from_millis(500)).await);
    assert_eq!(server.holder().as_deref(), Some("x"));
    assert!(!b.duplicate_ever(), "{:?}", b.duplicate_log);
}

/// Lab S35 once: the twin's lease reached a node through the watch before its first read,
/// and while the watch stayed healthy it never read again; every later renewal came
/// through the watch too and no duplicate was ever reported. A write made after the run
/// started, seen through the watch, now counts as a state seen: the next one is a twin's.
#[tokio::test(start_paused = true)]
async fn a_twin_seen_only_through_the_watch_is_reported() {
    let server = FakeServer::new();
    // b's reads never answer in time: it only sees the watch.
    server.state.lock().unwrap().get_delay = Duration::from_secs(3600);
    let mut b = start_as(&server, "node-b", "x", true);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..4 {
        server.renew_as("x");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(TIMING.call_timeout()).await;
    assert!(b.duplicate_ever(), "{:?}", b.duplicate_log);
    assert!(!until_leading(&mut b, Duration::from_millis(500)).await);
}
