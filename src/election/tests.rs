//! Elector tests against an in-memory lease server, on tokio's paused clock: time only moves
//! when every task waits, so the timing assertions are exact and need no sleeps.

use crate::lease::Timing;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::*;

mod duplicate_identity;
mod failback;
mod ride;
mod spreading;

#[derive(Default)]
struct ServerState {
    lease: Option<(LeaseRecord, u64)>,
    rv: u64,
    /// Identities whose calls fail (partitioned from the API); their watches see nothing.
    cut: HashSet<String>,
    /// Clients whose next update is applied but answered with an error (the answer was
    /// lost), once.
    lose_answer: HashSet<String>,
    /// How long every get takes.
    get_delay: Duration,
    writes: Vec<(String, LeaseRecord)>,
}

impl ServerState {
    /// The lease as stored, with its resourceVersion.
    fn observed(&self) -> Option<Observed> {
        self.lease.as_ref().map(|(r, rv)| Observed {
            record: r.clone(),
            resource_version: rv.to_string(),
        })
    }

    /// Stores `rec` under the next resourceVersion.
    fn store(&mut self, rec: &LeaseRecord) -> Observed {
        self.rv += 1;
        self.lease = Some((rec.clone(), self.rv));
        Observed {
            record: rec.clone(),
            resource_version: self.rv.to_string(),
        }
    }
}

struct FakeServer {
    state: Mutex<ServerState>,
    events: broadcast::Sender<LeaseEvent>,
}

impl FakeServer {
    fn new() -> Arc<Self> {
        Arc::new(FakeServer {
            state: Mutex::new(ServerState::default()),
            events: broadcast::channel(1024).0,
        })
    }
    fn cut(&self, who: &str, cut: bool) {
        let mut s = self.state.lock().unwrap();
        if cut {
            s.cut.insert(who.to_string());
        } else {
            s.cut.remove(who);
        }
    }
    /// Writes a record directly, as `kubectl edit` would.
    fn force(&self, rec: LeaseRecord) {
        let obs = self.state.lock().unwrap().store(&rec);
        let _ = self.events.send(LeaseEvent::Changed(obs));
    }
    /// Applies `who`'s next update but fails the call, as a connection lost after the
    /// request was sent.
    fn lose_next_answer(&self, who: &str) {
        self.state
            .lock()
            .unwrap()
            .lose_answer
            .insert(who.to_string());
    }
    /// Renews the lease as another process with identity `identity` would (a twin under
    /// the same name that believes it holds the lease).
    fn renew_as(&self, identity: &str) {
        let old = self.record();
        let rec = record::claim(
            old.as_ref(),
            identity,
            Duration::from_secs(5),
            record::now_micros(),
        );
        self.force(rec);
    }
    /// Sends a watch event without changing the lease: a late event of an earlier state, as
    /// a lagging (shared) watch delivers it.
    fn replay(&self, obs: Observed) {
        let _ = self.events.send(LeaseEvent::Changed(obs));
    }
    /// The lease as stored, with its resourceVersion.
    fn observed(&self) -> Option<Observed> {
        self.state.lock().unwrap().observed()
    }
    /// Deletes the lease, as `kubectl delete lease` would.
    fn delete(&self) {
        self.state.lock().unwrap().lease = None;
        let _ = self.events.send(LeaseEvent::Deleted);
    }
    fn holder(&self) -> Option<String> {
        self.record().map(|r| r.holder)
    }
    fn record(&self) -> Option<LeaseRecord> {
        self.observed().map(|o| o.record)
    }
    fn writes_by(&self, who: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .writes
            .iter()
            .filter(|(w, _)| w == who)
            .count()
    }
}

#[derive(Clone)]
struct FakeClient {
    server: Arc<FakeServer>,
    who: String,
}

impl FakeClient {
    fn check(&self, op: &'static str) -> Result<(), LeaseError> {
        if self.server.state.lock().unwrap().cut.contains(&self.who) {
            return Err(LeaseError::Api {
                lease: "fake".into(),
                op,
                status: None,
                message: "connection refused".into(),
            });
        }
        Ok(())
    }
}

impl LeaseClient for FakeClient {
    fn describe(&self) -> String {
        "test/lease".into()
    }
    async fn get(&self) -> Result<Option<Observed>, LeaseError> {
        let delay = self.server.state.lock().unwrap().get_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.check("get")?;
        Ok(self.server.observed())
    }
    async fn create(&self, record: &LeaseRecord) -> Result<Observed, LeaseError> {
        self.check("create")?;
        let mut s = self.server.state.lock().unwrap();
        if s.lease.is_some() {
            return Err(LeaseError::AlreadyExists {
                lease: "fake".into(),
            });
        }
        let obs = s.store(record);
        s.writes.push((self.who.clone(), record.clone()));
        let _ = self.server.events.send(LeaseEvent::Changed(obs.clone()));
        Ok(obs)
    }
    async fn update(&self, record: &LeaseRecord, rv: &str) -> Result<Observed, LeaseError> {
        self.check("update")?;
        let mut s = self.server.state.lock().unwrap();
        match &s.lease {
            Some((_, cur)) if cur.to_string() == rv => {}
            _ => {
                return Err(LeaseError::Conflict {
                    lease: "fake".into(),
                });
            }
        }
        let obs = s.store(record);
        s.writes.push((self.who.clone(), record.clone()));
        let _ = self.server.events.send(LeaseEvent::Changed(obs.clone()));
        if s.lose_answer.remove(&self.who) {
            return Err(LeaseError::Api {
                lease: "fake".into(),
                op: "update",
                status: None,
                message: "connection reset by peer".into(),
            });
        }
        Ok(obs)
    }
    fn watch(&self) -> BoxStream<'static, LeaseEvent> {
        let rx = self.server.events.subscribe();
        let server = self.server.clone();
        let who = self.who.clone();
        futures::stream::unfold((rx, server, who), |(mut rx, server, who)| async move {
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        if server.state.lock().unwrap().cut.contains(&who) {
                            continue;
                        }
                        return Some((ev, (rx, server, who)));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .boxed()
    }
}

const TIMING: Timing = Timing {
    lease_duration: Duration::from_secs(5),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_secs(1),
};

/// A running elector plus a follower that acknowledges every dropped term (as the VIP
/// holder does), and a log of (instant, leading?) transitions.
struct Node {
    state: watch::Receiver<LeaderState>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    log: Arc<Mutex<Vec<(Instant, bool)>>>,
    gates: Gates,
    /// The duplicate-identity condition as published.
    duplicate: watch::Receiver<Option<DuplicateIdentity>>,
    /// Every value the condition took, with the instant.
    duplicate_log: DuplicateLog,
}

type DuplicateLog = Arc<Mutex<Vec<(Instant, Option<DuplicateIdentity>)>>>;

impl Node {
    /// Whether the duplicate-identity condition was ever raised.
    fn duplicate_ever(&self) -> bool {
        self.duplicate_log
            .lock()
            .unwrap()
            .iter()
            .any(|(_, d)| d.is_some())
    }
}

fn start(server: &Arc<FakeServer>, who: &str, ack: bool) -> Node {
    start_as(server, who, who, ack)
}

/// Starts an elector whose API calls are made as `who` (for cuts and write counts) with
/// election identity `identity` (two processes may share one).
fn start_as(server: &Arc<FakeServer>, who: &str, identity: &str, ack: bool) -> Node {
    start_with(server, who, identity, ack, None, None)
}

/// [`start_as`], spreading with `spread` and riding through with `ride` when given.
fn start_with(
    server: &Arc<FakeServer>,
    who: &str,
    identity: &str,
    ack: bool,
    spread: Option<Arc<spread::Spread>>,
    ride: Option<Arc<dyn RideLink>>,
) -> Node {
    start_built(server, who, identity, ack, |e| {
        let e = match spread {
            Some(sp) => e.with_spread(sp),
            None => e,
        };
        match ride {
            Some(r) => e.with_ride(r),
            None => e,
        }
    })
}

/// [`start_as`], with the elector set up by `build` before it runs.
fn start_built(
    server: &Arc<FakeServer>,
    who: &str,
    identity: &str,
    ack: bool,
    build: impl FnOnce(Elector<FakeClient>) -> Elector<FakeClient>,
) -> Node {
    let gates = Gates::default();
    let client = FakeClient {
        server: server.clone(),
        who: who.into(),
    };
    let (elector, leadership) = Elector::new(client, identity.into(), TIMING, &gates);
    let elector = build(elector);
    let duplicate = elector.duplicate_identity();
    let duplicate_log = Arc::new(Mutex::new(Vec::new()));
    let mut dup_rx = duplicate.clone();
    let dup_log = duplicate_log.clone();
    tokio::spawn(async move {
        while dup_rx.changed().await.is_ok() {
            let v = dup_rx.borrow_and_update().clone();
            dup_log.lock().unwrap().push((Instant::now(), v));
        }
    });
    let shutdown = CancellationToken::new();
    let shutdown_run = shutdown.clone();
    let task = tokio::spawn(async move {
        elector.run(shutdown_run).await;
    });
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut rx = leadership.state.clone();
    let dropped = leadership.dropped;
    let log2 = log.clone();
    tokio::spawn(async move {
        let mut term = 0;
        let mut was = false;
        loop {
            let s = rx.borrow_and_update().clone();
            match s {
                LeaderState::Leading { term: t, .. } => {
                    term = t;
                    if !was {
                        log2.lock().unwrap().push((Instant::now(), true));
                    }
                    was = true;
                }
                LeaderState::Following { .. } => {
                    if was {
                        log2.lock().unwrap().push((Instant::now(), false));
                    }
                    was = false;
                    if ack {
                        let _ = dropped.send(term);
                    }
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
    Node {
        state: leadership.state,
        shutdown,
        task,
        log,
        gates,
        duplicate,
        duplicate_log,
    }
}

async fn until_leading(n: &mut Node, within: Duration) -> bool {
    timeout(within, n.state.wait_for(|s| s.is_leading()))
        .await
        .is_ok()
}

async fn until_following(n: &mut Node, within: Duration) -> bool {
    timeout(within, n.state.wait_for(|s| !s.is_leading()))
        .await
        .is_ok()
}

/// Intervals during which each node led, from the logs; checks no two overlap.
fn assert_never_two_leaders(nodes: &[&Node], end: Instant) {
    let mut spans = Vec::new();
    for n in nodes {
        let log = n.log.lock().unwrap();
        let mut start = None;
        for (t, leading) in log.iter() {
            match (leading, start) {
                (true, None) => start = Some(*t),
                (false, Some(s)) => {
                    spans.push((s, *t));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            spans.push((s, end));
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "two leaders at once: {:?} overlaps {:?}",
            w[0],
            w[1]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn first_candidate_creates_and_renews_every_retry_period() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let rec = server.record().unwrap();
    assert_eq!(rec.holder, "a");
    assert_eq!(rec.lease_duration_secs, 5);
    assert_eq!(rec.transitions, 0);
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    // create + one renew per second
    let writes = server.writes_by("a");
    assert!((10..=12).contains(&writes), "writes {writes}");
    assert!(a.state.borrow().is_leading());
}

#[tokio::test(start_paused = true)]
async fn second_candidate_follows_while_holder_renews() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let mut b = start(&server, "b", true);
    assert!(!until_leading(&mut b, Duration::from_secs(30)).await);
    assert_eq!(
        server.writes_by("b"),
        0,
        "a follower never writes a valid lease"
    );
    assert_eq!(
        *b.state.borrow(),
        LeaderState::Following {
            holder: Some("a".into())
        }
    );
    assert_never_two_leaders(&[&a, &b], Instant::now());
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_releases_and_follower_takes_over_at_once() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let mut b = start(&server, "b", true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = Instant::now();
    a.shutdown.cancel();
    (&mut a.task).await.unwrap();
    assert!(until_leading(&mut b, Duration::from_millis(100)).await);
    assert!(Instant::now() - t0 < Duration::from_millis(100));
    let rec = server.record().unwrap();
    assert_eq!(rec.holder, "b");
    assert_eq!(
        rec.transitions, 1,
        "release keeps the count (client-go), ''->b adds one"
    );
    assert_never_two_leaders(&[&a, &b], Instant::now());
}

#[tokio::test(start_paused = true)]
async fn partitioned_holder_steps_down_at_renew_deadline_before_takeover() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let mut b = start(&server, "b", true);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.cut("a", true);
    let cut_at = Instant::now();
    assert!(until_following(&mut a, Duration::from_secs(4)).await);
    let a_down = Instant::now() - cut_at;
    assert!(
        a_down <= TIMING.renew_deadline,
        "a stepped down after {a_down:?}"
    );
    assert!(until_leading(&mut b, Duration::from_secs(6)).await);
    let b_up = Instant::now() - cut_at;
    // b waits a full lease duration from the last renewal it saw (at most one retry period
    // before the cut).
    assert!(
        b_up >= TIMING.lease_duration - TIMING.retry_period,
        "b took over after {b_up:?}"
    );
    assert!(
        b_up <= TIMING.lease_duration + Duration::from_millis(10),
        "b took over after {b_up:?}"
    );
    // Healing: a sees b's lease and follows, never re-taking it.
    server.cut("a", false);
    assert!(!until_leading(&mut a, Duration::from_secs(20)).await);
    assert_never_two_leaders(&[&a, &b], Instant::now());
}

#[tokio::test(start_paused = true)]
async fn stolen_lease_is_dropped_at_once_and_won_back_after_it_expires() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut rec = server.record().unwrap();
    rec.holder = "thief".into();
    server.force(rec);
    let t0 = Instant::now();
    assert!(until_following(&mut a, Duration::from_millis(10)).await);
    assert!(until_leading(&mut a, Duration::from_secs(12)).await);
    let back = Instant::now() - t0;
    assert!(back >= TIMING.lease_duration, "re-took after {back:?}");
    assert!(back <= TIMING.lease_duration * 2, "re-took after {back:?}");
    assert_eq!(server.holder().as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn closed_gate_releases_and_keeps_node_out_until_it_opens() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let mut b = start(&server, "b", true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.gates.set("local-api", false);
    assert!(until_following(&mut a, Duration::from_millis(10)).await);
    assert!(until_leading(&mut b, Duration::from_millis(100)).await);
    // b goes away for good; a must not campaign while its gate is closed...
    b.shutdown.cancel();
    (&mut b.task).await.unwrap();
    assert!(!until_leading(&mut a, Duration::from_secs(20)).await);
    // ...and campaigns at once when it opens.
    a.gates.set("local-api", true);
    assert!(until_leading(&mut a, Duration::from_millis(100)).await);
    assert_never_two_leaders(&[&a, &b], Instant::now());
}

#[tokio::test(start_paused = true)]
async fn without_drop_confirmation_the_lease_is_not_released() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", false);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let mut b = start(&server, "b", true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.shutdown.cancel();
    (&mut a.task).await.unwrap();
    assert_eq!(
        server.holder().as_deref(),
        Some("a"),
        "no release without ack"
    );
    let t0 = Instant::now();
    assert!(until_leading(&mut b, Duration::from_secs(10)).await);
    assert!(Instant::now() - t0 >= TIMING.lease_duration - TIMING.retry_period - ACK_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn api_outage_then_recovery_without_restart() {
    // S12: the only node loses the API for longer than the lease, drops, and gets the lease
    // back by itself once the API returns.
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    server.cut("a", true);
    assert!(until_following(&mut a, Duration::from_secs(4)).await);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!a.state.borrow().is_leading());
    server.cut("a", false);
    let t0 = Instant::now();
    assert!(until_leading(&mut a, TIMING.max_backoff() + Duration::from_secs(1)).await);
    assert!(Instant::now() - t0 <= TIMING.max_backoff());
}

#[tokio::test(start_paused = true)]
async fn three_candidates_exactly_one_leads_through_churn() {
    let server = FakeServer::new();
    let mut nodes: Vec<Node> = ["a", "b", "c"]
        .iter()
        .map(|w| start(&server, w, true))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let leading = nodes
        .iter()
        .filter(|n| n.state.borrow().is_leading())
        .count();
    assert_eq!(leading, 1);
    // Cut whoever leads, three times over.
    for _ in 0..3 {
        let holder = server.holder().unwrap();
        server.cut(&holder, true);
        tokio::time::sleep(Duration::from_secs(8)).await;
        let new = server.holder().unwrap();
        assert_ne!(new, holder);
        server.cut(&holder, false);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let leading = nodes
        .iter()
        .filter(|n| n.state.borrow().is_leading())
        .count();
    assert_eq!(leading, 1);
    let refs: Vec<&Node> = nodes.iter().collect();
    assert_never_two_leaders(&refs, Instant::now());
    for n in nodes.iter_mut() {
        n.shutdown.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn deleted_lease_makes_the_holder_drop_and_others_wait() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    let mut b = start(&server, "b", true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t0 = Instant::now();
    server.delete();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // a dropped at once (the API no longer names it) ...
    assert!(
        a.log
            .lock()
            .unwrap()
            .iter()
            .any(|(t, leading)| !leading && *t >= t0),
        "a must step down when the lease is deleted"
    );
    // ... and may take it again; b, which saw a hold it, waits a lease duration first.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(server.holder().as_deref(), Some("a"));
    assert!(!b.state.borrow().is_leading());
    assert_eq!(
        server.writes_by("b"),
        0,
        "b never created the lease under a"
    );
    assert_never_two_leaders(&[&a, &b], Instant::now());
    let _ = &mut b;
}

/// A shared Lease watch that re-listed before this lease was created reports it deleted
/// (the hub's list did not contain it) although it exists: the holder confirms with the API
/// server and keeps leading instead of dropping its VIPs.
#[tokio::test(start_paused = true)]
async fn stale_deleted_event_while_leading_is_checked_and_ignored() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t0 = Instant::now();
    let _ = server.events.send(LeaseEvent::Deleted);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.state.borrow().is_leading());
    assert!(
        !a.log
            .lock()
            .unwrap()
            .iter()
            .any(|(t, leading)| !leading && *t >= t0),
        "a stale deleted event must not make the holder step down"
    );
    assert_eq!(server.holder().as_deref(), Some("a"));
}

fn clean_term(n: &Node) -> Option<bool> {
    match *n.state.borrow() {
        LeaderState::Leading { clean, .. } => Some(clean),
        LeaderState::Following { .. } => None,
    }
}

/// The conflict probe may be skipped only after a handover this process saw: the lease held
/// by another node, then released. A released lease found at start (a restart: who released
/// it, and who else may answer for its address, is unknown) and a lease created or taken
/// after expiry are not clean.
#[tokio::test(start_paused = true)]
async fn only_a_release_seen_after_another_holder_is_a_clean_handover() {
    let server = FakeServer::new();
    let mut a = start(&server, "a", true);
    assert!(until_leading(&mut a, Duration::from_millis(10)).await);
    assert_eq!(clean_term(&a), Some(false), "created: not clean");
    let mut b = start(&server, "b", true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.shutdown.cancel();
    assert!(until_leading(&mut b, Duration::from_secs(2)).await);
    assert_eq!(clean_term(&b), Some(true), "handover from a: clean");
    b.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.holder().as_deref(), Some(""), "b released it");
    // A new process finds it released: not clean.
    let mut c = start(&server, "c", true);
    assert!(until_leading(&mut c, Duration::from_secs(2)).await);
    assert_eq!(
        clean_term(&c),
        Some(false),
        "released before we looked: probe"
    );
}

/// A candidate that learns the holder from the watch (its first get waits for the VIP
/// holder's start-up checks) publishes and logs whom it follows at once: the restarted node
/// of S01 otherwise stayed `Following { holder: None }` until its next poll.
#[tokio::test(start_paused = true)]
async fn holder_learnt_from_the_watch_is_published() {
    let server = FakeServer::new();
    let b = start(&server, "b", true);
    b.gates.set(GATE_STARTING, false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    server.renew_as("a");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        *b.state.borrow(),
        LeaderState::Following {
            holder: Some("a".into())
        }
    );
    assert_eq!(
        server.writes_by("b"),
        0,
        "no campaign while a gate is closed"
    );
}

/// Gates dropped right after `Elector::new` (the IPAM wing's election once did): the gates
/// stay as they were (all open) and the elector campaigns. It used to poll the closed
/// channel in a busy loop that never reached its timer: 100 % CPU, no lease ever written.
/// Real clock: on the paused one that loop would never let time advance.
#[tokio::test]
async fn dropped_gates_leave_the_elector_campaigning() {
    let server = FakeServer::new();
    let client = FakeClient {
        server: server.clone(),
        who: "a".into(),
    };
    let (elector, leadership) = Elector::new(client, "a".into(), TIMING, &Gates::default());
    let stop = CancellationToken::new();
    tokio::spawn(elector.run(stop.clone()));
    let mut state = leadership.state;
    let led = timeout(Duration::from_secs(2), state.wait_for(|s| s.is_leading())).await;
    stop.cancel();
    assert!(led.is_ok(), "never led with dropped gates");
    assert_eq!(server.record().unwrap().holder, "a");
}

/// The acquisition check is asked before creating or taking over the lease, never before a
/// renewal: `false` keeps the node from acquiring (a Service deleted while this node's cache
/// was stale), `true` lets it acquire at the next attempt.
#[tokio::test(start_paused = true)]
async fn acquisition_waits_for_the_acquire_check() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let server = FakeServer::new();
    let allow = Arc::new(AtomicBool::new(false));
    let asked = Arc::new(AtomicUsize::new(0));
    let (a, q) = (allow.clone(), asked.clone());
    let check: AcquireCheck = Arc::new(move || {
        q.fetch_add(1, Ordering::SeqCst);
        let ok = a.load(Ordering::SeqCst);
        Box::pin(async move { ok })
    });
    let gates = Gates::default();
    let client = FakeClient {
        server: server.clone(),
        who: "a".into(),
    };
    let (elector, leadership) = Elector::new(client, "a".into(), TIMING, &gates);
    let elector = elector.with_acquire_check(check);
    let stop = CancellationToken::new();
    let stop_run = stop.clone();
    tokio::spawn(async move {
        elector.run(stop_run).await;
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        server.writes_by("a"),
        0,
        "no lease created while the check says no"
    );
    assert!(
        asked.load(Ordering::SeqCst) >= 2,
        "asked again every retry period"
    );
    allow.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(leadership.state.borrow().is_leading());
    // Renewals do not ask.
    let before = asked.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(leadership.state.borrow().is_leading());
    assert_eq!(
        asked.load(Ordering::SeqCst),
        before,
        "renewals are not checked"
    );
    stop.cancel();
}
