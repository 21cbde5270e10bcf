//! The governance-move rule (S34): which leases retire and which groups may bind what
//! (pure), when a retiring lease's handover is done (pure), and [`follow`] against a fake
//! lease on tokio's paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;
use tokio::sync::broadcast;

use super::*;
use crate::election::LeaseError;

fn rec(holder: &str, acquired: i64, transitions: i32, dur: i32) -> LeaseRecord {
    LeaseRecord {
        holder: holder.into(),
        lease_duration_secs: dur,
        acquire_time: Some(Timestamp::from_second(acquired).unwrap()),
        renew_time: Some(Timestamp::from_second(acquired).unwrap()),
        transitions,
        failback_request: None,
        lease_duration_ms: None,
        ride_through: None,
    }
}

fn obs(r: LeaseRecord, rv: u64) -> Observed {
    Observed {
        record: r,
        resource_version: rv.to_string(),
    }
}

fn view(o: Option<Observed>, at: Instant) -> LeaseView {
    LeaseView {
        known: true,
        observed: o,
        observed_at: at,
        absent_until: None,
    }
}

#[test]
fn a_held_lease_is_handed_over_at_its_expiry_on_our_clock() {
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let v = view(Some(obs(held.clone(), 7)), t0);
    let at = t0 + Duration::from_secs(5);
    assert_eq!(
        handover(Some(&held), &v, t0 + Duration::from_secs(1)),
        Handover::NotBefore(at)
    );
    assert_eq!(handover(Some(&held), &v, at), Handover::Done);
    // Held by this very node counts the same (its VIP holder may not have confirmed).
    assert_eq!(handover(None, &v, t0), Handover::NotBefore(at));
}

#[test]
fn a_released_lease_is_handed_over_at_once() {
    let t0 = Instant::now();
    let released = record::release(
        &rec("node-a", 100, 0, 5),
        Timestamp::from_second(110).unwrap(),
    );
    assert_eq!(
        handover(None, &view(Some(obs(released, 8)), t0), t0),
        Handover::Done
    );
}

#[test]
fn a_renewal_by_the_same_holder_postpones_a_new_term_ends_it() {
    let t0 = Instant::now();
    let from = rec("node-a", 100, 3, 5);
    let mut v = view(Some(obs(from.clone(), 7)), t0);
    // The frozen holder resumed within its renew deadline and renewed: same term.
    let mut renewed = from.clone();
    renewed.renew_time = Some(Timestamp::from_second(104).unwrap());
    let t1 = t0 + Duration::from_secs(3);
    v.seen(Some(obs(renewed, 9)), t1);
    assert_eq!(
        handover(Some(&from), &v, t1 + Duration::from_secs(4)),
        Handover::NotBefore(t1 + Duration::from_secs(5))
    );
    // Another node took it (after a release or an expiry): that term is over.
    v.seen(Some(obs(rec("node-b", 120, 4, 5), 10)), t1);
    assert_eq!(handover(Some(&from), &v, t1), Handover::Done);
    // The same holder after a new acquisition: a new term too.
    let mut v = view(Some(obs(from.clone(), 7)), t0);
    v.seen(Some(obs(rec("node-a", 130, 4, 5), 11)), t1);
    assert_eq!(handover(Some(&from), &v, t1), Handover::Done);
}

#[test]
fn deleted_while_held_waits_one_lease_duration_deleted_after_release_does_not() {
    let t0 = Instant::now();
    let mut v = view(Some(obs(rec("node-a", 100, 0, 5), 7)), t0);
    let t1 = t0 + Duration::from_secs(1);
    v.deleted(t1);
    assert_eq!(v.absent_until, Some(t1 + Duration::from_secs(5)));
    assert_eq!(
        handover(None, &v, t1),
        Handover::NotBefore(t1 + Duration::from_secs(5))
    );
    let released = record::release(
        &rec("node-a", 100, 0, 5),
        Timestamp::from_second(110).unwrap(),
    );
    let mut v = view(Some(obs(released, 8)), t0);
    v.deleted(t1);
    assert_eq!(handover(None, &v, t1), Handover::Done);
}

#[test]
fn an_older_version_does_not_undo_a_newer_one() {
    let t0 = Instant::now();
    let released = record::release(
        &rec("node-a", 100, 0, 5),
        Timestamp::from_second(110).unwrap(),
    );
    let mut v = view(Some(obs(released, 9)), t0);
    v.seen(Some(obs(rec("node-a", 100, 0, 5), 8)), t0);
    assert_eq!(handover(None, &v, t0), Handover::Done);
}

#[test]
fn an_elector_that_saw_no_lease_is_no_evidence_of_absence() {
    let t0 = Instant::now();
    let end = ElectionEnd {
        released: false,
        observed: None,
        observed_at: t0,
        absent_until: None,
        own: Default::default(),
    };
    assert_eq!(
        handover(None, &LeaseView::from_end(&end), t0),
        Handover::Unknown
    );
    let end = ElectionEnd {
        absent_until: Some(t0 + Duration::from_secs(5)),
        ..end
    };
    assert_eq!(
        handover(None, &LeaseView::from_end(&end), t0),
        Handover::NotBefore(t0 + Duration::from_secs(5))
    );
}

// ----- follow() against a fake lease, on the paused clock -------------------------------

#[derive(Clone)]
struct Fake {
    lease: Arc<Mutex<Option<Observed>>>,
    events: broadcast::Sender<LeaseEvent>,
    gets: Arc<AtomicUsize>,
}

impl Fake {
    fn new(o: Option<Observed>) -> Self {
        Fake {
            lease: Arc::new(Mutex::new(o)),
            events: broadcast::channel(16).0,
            gets: Arc::new(AtomicUsize::new(0)),
        }
    }
    fn write(&self, o: Observed) {
        *self.lease.lock().unwrap() = Some(o.clone());
        let _ = self.events.send(LeaseEvent::Changed(o));
    }
    fn delete(&self) {
        *self.lease.lock().unwrap() = None;
        let _ = self.events.send(LeaseEvent::Deleted);
    }
}

impl LeaseClient for Fake {
    fn describe(&self) -> String {
        "default/kubevip-old".into()
    }
    async fn get(&self) -> Result<Option<Observed>, LeaseError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        Ok(self.lease.lock().unwrap().clone())
    }
    async fn create(&self, _: &LeaseRecord) -> Result<Observed, LeaseError> {
        panic!("a retirement never writes")
    }
    async fn update(&self, _: &LeaseRecord, _: &str) -> Result<Observed, LeaseError> {
        panic!("a retirement never writes")
    }
    fn watch(&self) -> BoxStream<'static, LeaseEvent> {
        let rx = self.events.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.ok().map(|ev| (ev, rx))
        })
        .boxed()
    }
}

const TIMING: Timing = Timing {
    lease_duration: Duration::from_secs(5),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_secs(1),
};

fn spawn_follow(
    fake: &Fake,
    v: LeaseView,
) -> (tokio::task::JoinHandle<(bool, Instant)>, CancellationToken) {
    spawn_follow_until(fake, v, None)
}

/// [`spawn_follow`] of a lease that keeps running: done by `done_by` at the latest.
fn spawn_follow_until(
    fake: &Fake,
    v: LeaseView,
    done_by: Option<Instant>,
) -> (tokio::task::JoinHandle<(bool, Instant)>, CancellationToken) {
    let stop = CancellationToken::new();
    let events = fake.watch();
    let (f, s) = (fake.clone(), stop.clone());
    let h = tokio::spawn(async move {
        let r = follow(f, events, v, TIMING, done_by, s).await;
        (r, Instant::now())
    });
    (h, stop)
}

#[tokio::test(start_paused = true)]
async fn frozen_holder_is_waited_for_until_its_lease_expires() {
    // The holder froze right after its last renewal (seen at t0) and never writes again.
    let t0 = Instant::now();
    let held = obs(rec("node-a", 100, 0, 5), 7);
    let fake = Fake::new(Some(held.clone()));
    let (h, _stop) = spawn_follow(&fake, view(Some(held), t0));
    let (done, at) = h.await.unwrap();
    assert!(done);
    assert_eq!(
        at,
        t0 + Duration::from_secs(5),
        "exactly at expiry, not before"
    );
    assert_eq!(fake.gets.load(Ordering::SeqCst), 1, "one read at the start");
}

#[tokio::test(start_paused = true)]
async fn a_release_ends_the_wait_at_once_and_a_renewal_postpones_it() {
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let fake = Fake::new(Some(obs(held.clone(), 7)));
    let (h, _stop) = spawn_follow(&fake, view(Some(obs(held.clone(), 7)), t0));
    // The holder resumes after 4 s and renews (same term): 5 s more from then.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut renewed = held.clone();
    renewed.renew_time = Some(Timestamp::from_second(104).unwrap());
    fake.write(obs(renewed, 8));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!h.is_finished(), "renewed 3 s ago: still held");
    // It learns its Service is gone: drops the VIPs, releases.
    let released = record::release(&held, Timestamp::from_second(108).unwrap());
    fake.write(obs(released, 9));
    let (done, at) = h.await.unwrap();
    assert!(done);
    assert_eq!(at, t0 + Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn a_release_the_elector_missed_is_found_by_the_first_read() {
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let released = record::release(&held, Timestamp::from_second(108).unwrap());
    let fake = Fake::new(Some(obs(released, 9)));
    let (h, _stop) = spawn_follow(&fake, view(Some(obs(held, 7)), t0));
    let (done, at) = h.await.unwrap();
    assert!(done);
    assert_eq!(at, t0);
}

#[tokio::test(start_paused = true)]
async fn released_then_deleted_by_its_holder_is_done_deleted_while_held_waits() {
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let fake = Fake::new(Some(obs(held.clone(), 7)));
    let (h, _stop) = spawn_follow(&fake, view(Some(obs(held.clone(), 7)), t0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.write(obs(
        record::release(&held, Timestamp::from_second(108).unwrap()),
        8,
    ));
    fake.delete();
    let (_, at) = h.await.unwrap();
    assert_eq!(at, t0 + Duration::from_millis(100));

    // `kubectl delete lease` while node-a holds it: node-a may still answer.
    let fake = Fake::new(Some(obs(held.clone(), 7)));
    let (h, _stop) = spawn_follow(&fake, view(Some(obs(held, 7)), t0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t1 = Instant::now();
    fake.delete();
    let (_, at) = h.await.unwrap();
    assert_eq!(at, t1 + Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_lease_never_seen_is_read_first() {
    let fake = Fake::new(None);
    let (h, _stop) = spawn_follow(&fake, LeaseView::unknown(Instant::now()));
    let (done, _) = h.await.unwrap();
    assert!(done, "absent on the first read: nothing to wait for");
    assert_eq!(fake.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_kept_shared_lease_is_done_one_lease_duration_after_its_retirement_began() {
    // A shard keeps running without the moved address; its holder renews every second and
    // never releases: the retirement ends at `done_by`, not at the lease's expiry (never).
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let fake = Fake::new(Some(obs(held.clone(), 7)));
    let done_by = t0 + TIMING.lease_duration;
    let (h, _stop) = spawn_follow_until(&fake, view(Some(obs(held.clone(), 7)), t0), Some(done_by));
    for i in 1..=4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut renewed = held.clone();
        renewed.renew_time = Some(Timestamp::from_second(100 + i).unwrap());
        fake.write(obs(renewed, 7 + i as u64));
        assert!(!h.is_finished(), "renewed, {i} s in: still waiting");
    }
    let (done, at) = h.await.unwrap();
    assert!(done);
    assert_eq!(at, done_by);
    // Released (its holder drained) before then: done at once, as for any lease.
    let fake = Fake::new(Some(obs(held.clone(), 7)));
    let t1 = Instant::now();
    let (h, _stop) = spawn_follow_until(
        &fake,
        view(Some(obs(held.clone(), 7)), t1),
        Some(t1 + TIMING.lease_duration),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    fake.write(obs(
        record::release(&held, Timestamp::from_second(101).unwrap()),
        8,
    ));
    let (done, at) = h.await.unwrap();
    assert!(done);
    assert_eq!(at, t1 + Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn stopping_a_retirement_reports_not_done() {
    let t0 = Instant::now();
    let held = obs(rec("node-a", 100, 0, 5), 7);
    let fake = Fake::new(Some(held.clone()));
    let (h, stop) = spawn_follow(&fake, view(Some(held), t0));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let (done, _) = h.await.unwrap();
    assert!(!done);
}
