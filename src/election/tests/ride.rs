//! The elector's ride-through seam ([`RideLink`]) on the paused clock: how long a leader
//! whose renewals fail keeps leading, what it reports, and acquisitions gated by the link.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::lease::FENCE_MARGIN;

/// A link that records what the elector reports and lets the test publish ride grants the
/// way `peer::node` does.
#[derive(Default)]
struct FakeRide {
    state: Mutex<Option<Arc<watch::Sender<LeaderState>>>>,
    renewed: Mutex<Vec<(u64, String, Instant)>>,
    dropped: Mutex<usize>,
    allow: AtomicBool,
    api_back: watch::Sender<u64>,
    /// The last view the elector reported: (holder, resourceVersion, observed at).
    observed: Mutex<Option<(String, String, Instant)>>,
    /// The resourceVersion the holder "handed over".
    handed_over: Mutex<Option<String>>,
    /// A peer "asks" for the lease.
    asked_by: Mutex<Option<String>>,
    news: watch::Sender<u64>,
}

impl FakeRide {
    fn new(allow: bool) -> Arc<Self> {
        let r = FakeRide::default();
        r.allow.store(allow, Ordering::SeqCst);
        Arc::new(r)
    }

    /// Publishes a ride grant ending at `until` on the current term, as `peer::node` does.
    fn grant(&self, until: Instant) {
        let r = until - (TIMING.lease_duration - FENCE_MARGIN);
        let st = self.state.lock().unwrap().clone().expect("attached");
        st.send_if_modified(|s| match s {
            LeaderState::Leading { renewed_at, .. } if r > *renewed_at => {
                *renewed_at = r;
                true
            }
            _ => false,
        });
    }
}

impl RideLink for FakeRide {
    fn attach(&self, state: Arc<watch::Sender<LeaderState>>) {
        *self.state.lock().unwrap() = Some(state);
    }
    fn renewed(&self, term: u64, resource_version: &str, sent: Instant) {
        self.renewed
            .lock()
            .unwrap()
            .push((term, resource_version.to_string(), sent));
    }
    fn dropped(&self) {
        *self.dropped.lock().unwrap() += 1;
    }
    fn may_acquire(&self, _: Instant, _: Option<&Observed>, _: Instant) -> bool {
        self.allow.load(Ordering::SeqCst)
    }
    fn api_back(&self) -> watch::Receiver<u64> {
        self.api_back.subscribe()
    }
    fn observe(&self, observed: Option<&Observed>, observed_at: Instant) {
        *self.observed.lock().unwrap() = observed.map(|o| {
            (
                o.record.holder.clone(),
                o.resource_version.clone(),
                observed_at,
            )
        });
    }
    fn handed_over(&self, observed: &Observed) -> bool {
        self.handed_over.lock().unwrap().as_deref() == Some(observed.resource_version.as_str())
    }
    fn hand_over_requested(&self) -> Option<String> {
        self.asked_by.lock().unwrap().clone()
    }
    fn news(&self) -> watch::Receiver<u64> {
        self.news.subscribe()
    }
}

fn renewed_at(n: &Node) -> Instant {
    match *n.state.borrow() {
        LeaderState::Leading { renewed_at, .. } => renewed_at,
        LeaderState::Following { .. } => panic!("not leading"),
    }
}

/// Cut from the API without a ride grant, a leader with a link keeps leading until its
/// API fence ends (last send + lease duration - margin, where the holder's own fence check
/// removes the VIPs anyway), not only to the renew deadline; then it steps down without
/// releasing, and the link hears the confirmed drop.
#[tokio::test(start_paused = true)]
async fn without_a_grant_a_cut_leader_leads_to_the_end_of_its_api_fence() {
    let server = FakeServer::new();
    let ride = FakeRide::new(true);
    let mut a = start_with(&server, "a", "a", true, None, Some(ride.clone()));
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    server.cut("a", true);
    let sent = renewed_at(&a);
    let fence_end = sent + TIMING.lease_duration - FENCE_MARGIN;
    tokio::time::sleep_until(sent + TIMING.renew_deadline + Duration::from_millis(100)).await;
    assert!(a.state.borrow().is_leading(), "past the renew deadline");
    assert!(until_following(&mut a, Duration::from_secs(5)).await);
    let down = Instant::now();
    assert!(
        down >= fence_end,
        "stepped down {:?} early",
        fence_end - down
    );
    assert!(down < fence_end + Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(*ride.dropped.lock().unwrap(), 1);
    // Every write was reported with its send time and resourceVersion, before Leading.
    let renewed = ride.renewed.lock().unwrap().clone();
    assert!(!renewed.is_empty());
    assert_eq!(renewed.last().unwrap().2, sent);
}

/// Ride grants keep a cut leader leading (the published renewed_at rises with them) for
/// as long as they come; it steps down exactly when the last one ends. Renewals keep being
/// tried meanwhile, and once the API answers the leader renews (same term), the published
/// renewed_at never going back below the grant.
#[tokio::test(start_paused = true)]
async fn ride_grants_keep_a_cut_leader_leading_until_the_last_one_ends() {
    let server = FakeServer::new();
    let ride = FakeRide::new(true);
    let mut a = start_with(&server, "a", "a", true, None, Some(ride.clone()));
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let term = ride.renewed.lock().unwrap()[0].0;
    server.cut("a", true);
    let start = Instant::now();
    let mut last_until = start;
    while Instant::now() < start + Duration::from_secs(10) {
        last_until = Instant::now() + Duration::from_secs(2);
        ride.grant(last_until);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            a.state.borrow().is_leading(),
            "riding at {:?}",
            Instant::now() - start
        );
    }
    // The API answers again: the leader renews in the same term.
    let writes = server.writes_by("a");
    server.cut("a", false);
    ride.api_back.send_modify(|v| *v += 1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        server.writes_by("a") > writes,
        "renewed at once when the API is back"
    );
    match *a.state.borrow() {
        LeaderState::Leading {
            term: t,
            renewed_at,
            ..
        } => {
            assert_eq!(t, term);
            assert!(renewed_at + TIMING.lease_duration - FENCE_MARGIN >= last_until);
        }
        LeaderState::Following { .. } => panic!("lost the lease"),
    }
    // Cut again, one grant, then none: steps down when it ends, not before.
    server.cut("a", true);
    let sent = ride.renewed.lock().unwrap().last().unwrap().2;
    tokio::time::sleep_until(sent + TIMING.renew_deadline).await;
    let until = Instant::now() + Duration::from_secs(2);
    ride.grant(until);
    assert!(until_following(&mut a, Duration::from_secs(10)).await);
    let down = Instant::now();
    assert!(
        down >= until && down < until + Duration::from_millis(100),
        "{:?}",
        down - until
    );
}

/// Acquisitions go through the link: a candidate it refuses never takes a free lease;
/// allowed, it takes it within a retry period.
#[tokio::test(start_paused = true)]
async fn the_link_decides_acquisitions() {
    let server = FakeServer::new();
    let ride = FakeRide::new(false);
    let mut b = start_with(&server, "b", "b", true, None, Some(ride.clone()));
    assert!(!until_leading(&mut b, Duration::from_secs(10)).await);
    assert_eq!(server.writes_by("b"), 0);
    ride.allow.store(true, Ordering::SeqCst);
    assert!(until_leading(&mut b, TIMING.retry_period + Duration::from_millis(10)).await);
}

/// A holder asked for the lease while it cannot reach the API steps down at once on the
/// link's news (long before the renew deadline), without releasing (it cannot write; the
/// link sends `Released` after the drop it hears of), and only when the link says it was
/// asked: news alone moves nothing.
#[tokio::test(start_paused = true)]
async fn an_asked_holder_steps_down_at_once_without_releasing() {
    let server = FakeServer::new();
    let ride = FakeRide::new(true);
    let mut a = start_with(&server, "a", "a", true, None, Some(ride.clone()));
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    server.cut("a", true);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    ride.news.send_modify(|v| *v += 1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(a.state.borrow().is_leading(), "news without a request");
    *ride.asked_by.lock().unwrap() = Some("b".into());
    let asked = Instant::now();
    ride.news.send_modify(|v| *v += 1);
    assert!(until_following(&mut a, Duration::from_millis(10)).await);
    assert!(Instant::now() - asked < Duration::from_millis(10));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(*ride.dropped.lock().unwrap(), 1, "the link heard the drop");
    assert_eq!(server.holder().as_deref(), Some("a"), "not released");
}

/// A candidate reports what it observes of a lease held by another node; once the link
/// says the holder handed that very version over, it takes the lease on the news, long
/// before expiry, as a clean handover. A `Released` for another version does not count.
#[tokio::test(start_paused = true)]
async fn a_handed_over_version_is_taken_before_expiry() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let ride = FakeRide::new(true);
    let mut b = start_with(&server, "b", "b", true, None, Some(ride.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.cut("a", true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (holder, rv, _) = ride
        .observed
        .lock()
        .unwrap()
        .clone()
        .expect("the candidate reported its view");
    assert_eq!(holder, "a");
    *ride.handed_over.lock().unwrap() = Some(format!("{rv}-other"));
    ride.news.send_modify(|v| *v += 1);
    assert!(!until_leading(&mut b, Duration::from_millis(500)).await);
    *ride.handed_over.lock().unwrap() = Some(rv);
    let news = Instant::now();
    ride.news.send_modify(|v| *v += 1);
    assert!(until_leading(&mut b, Duration::from_millis(10)).await);
    assert!(Instant::now() - news < Duration::from_millis(10));
    assert_eq!(server.holder().as_deref(), Some("b"));
    assert_eq!(clean_term(&b), Some(true), "handed over: clean");
}

/// A candidate whose acquisition the link refused tries again at once on the link's news
/// (the peers now allow the take), not a retry period later.
#[tokio::test(start_paused = true)]
async fn news_retries_a_refused_acquisition_at_once() {
    let server = FakeServer::new();
    let ride = FakeRide::new(false);
    let mut b = start_with(&server, "b", "b", true, None, Some(ride.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!b.state.borrow().is_leading(), "refused by the link");
    ride.allow.store(true, Ordering::SeqCst);
    ride.news.send_modify(|v| *v += 1);
    assert!(until_leading(&mut b, Duration::from_millis(10)).await);
}
