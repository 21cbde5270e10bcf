use std::sync::{Arc, Mutex};

use super::*;

#[test]
fn value_is_spelled_like_kube_vip() {
    assert_eq!(has_ip_value("192.0.2.10".parse().unwrap()), "192.0.2.10");
    // kube-vip's SanitizeIPForLabel: hex of the 16 bytes, no ':' (not a label character).
    assert_eq!(
        has_ip_value("2001:db8::10".parse().unwrap()),
        "20010db8000000000000000000000010"
    );
    let v = has_ip_value("2001:db8::a:ff".parse().unwrap());
    assert_eq!(v, "20010db80000000000000000000a00ff");
    assert!(v.len() <= 63 && v.chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn step_follows_leadership_and_what_the_node_shows() {
    let want = "192.0.2.10";
    let val = |v: &str| NodeLabel::Value(v.to_string());
    let cases = [
        (true, NodeLabel::Absent, LabelStep::Set(want.into())),
        (true, val(want), LabelStep::InPlace),
        // An earlier `address`: rewritten.
        (true, val("192.0.2.99"), LabelStep::Set(want.into())),
        (true, NodeLabel::NoNode, LabelStep::WaitForNode),
        (false, NodeLabel::Absent, LabelStep::InPlace),
        (false, NodeLabel::NoNode, LabelStep::InPlace),
        // A stale label, ours or an earlier address: removed.
        (false, val(want), LabelStep::Remove),
        (false, val("192.0.2.99"), LabelStep::Remove),
    ];
    for (leading, seen, step) in cases {
        assert_eq!(label_step(leading, want, &seen), step, "{leading} {seen:?}");
    }
}

/// In-memory Node: whether it exists, its label, how many of the next calls fail, and the
/// number of writes.
#[derive(Default)]
struct Fake {
    exists: bool,
    label: Option<String>,
    fail_next: u32,
    /// Calls never answer.
    hang: bool,
    writes: u32,
}

#[derive(Clone, Default)]
struct FakeNode(Arc<Mutex<Fake>>);

impl FakeNode {
    fn with(exists: bool, label: Option<&str>) -> Self {
        FakeNode(Arc::new(Mutex::new(Fake {
            exists,
            label: label.map(str::to_string),
            ..Default::default()
        })))
    }
    fn label(&self) -> Option<String> {
        self.0.lock().unwrap().label.clone()
    }
    fn fail(&self, n: u32) {
        self.0.lock().unwrap().fail_next = n;
    }
    fn failing(&self, op: &'static str) -> Result<(), LabelError> {
        let mut f = self.0.lock().unwrap();
        if f.fail_next > 0 {
            f.fail_next -= 1;
            return Err(LabelError::Api {
                node: "node-a".into(),
                op,
                message: "403 Forbidden".into(),
            });
        }
        Ok(())
    }
}

impl NodeLabels for FakeNode {
    fn node(&self) -> &str {
        "node-a"
    }
    async fn get(&self) -> Result<NodeLabel, LabelError> {
        let hang = self.0.lock().unwrap().hang;
        if hang {
            std::future::pending::<()>().await;
        }
        self.failing("get")?;
        let f = self.0.lock().unwrap();
        Ok(match (f.exists, &f.label) {
            (false, _) => NodeLabel::NoNode,
            (true, None) => NodeLabel::Absent,
            (true, Some(v)) => NodeLabel::Value(v.clone()),
        })
    }
    async fn set(&self, value: Option<&str>) -> Result<NodeLabel, LabelError> {
        self.failing("patch")?;
        let mut f = self.0.lock().unwrap();
        if !f.exists {
            return Ok(NodeLabel::NoNode);
        }
        f.writes += 1;
        f.label = value.map(str::to_string);
        Ok(match value {
            None => NodeLabel::Absent,
            Some(v) => NodeLabel::Value(v.to_string()),
        })
    }
}

const VIP: &str = "192.0.2.10";

fn leading_state() -> LeaderState {
    LeaderState::Leading {
        term: 1,
        renewed_at: Instant::now(),
        clean: true,
    }
}

fn following() -> LeaderState {
    LeaderState::Following { holder: None }
}

/// Starts [`run`] on `node`; returns the leadership sender, the stop token and the task.
fn start(
    node: &FakeNode,
    initial: LeaderState,
) -> (
    watch::Sender<LeaderState>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(initial);
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(node.clone(), VIP.to_string(), rx, stop.clone()));
    (tx, stop, task)
}

/// Lets (paused) time run in 10 ms steps until `cond`, for at most `limit`; returns how
/// long it took, or panics naming `what`.
async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() <= limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t0.elapsed()
}

#[tokio::test(start_paused = true)]
async fn label_follows_leadership_and_goes_at_stop() {
    let node = FakeNode::with(true, None);
    let (tx, stop, task) = start(&node, following());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(node.label(), None, "a follower has no label");
    tx.send_replace(leading_state());
    until("labelled", Duration::from_millis(100), || {
        node.label().as_deref() == Some(VIP)
    })
    .await;
    // Renewals (a new Leading value each) write nothing more.
    for term in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        tx.send_replace(LeaderState::Leading {
            term: 1,
            renewed_at: Instant::now() + Duration::from_millis(term),
            clean: true,
        });
    }
    assert_eq!(node.0.lock().unwrap().writes, 1, "one write while leading");
    tx.send_replace(following());
    until(
        "removed on losing the lease",
        Duration::from_millis(100),
        || node.label().is_none(),
    )
    .await;
    tx.send_replace(leading_state());
    until("labelled again", Duration::from_millis(100), || {
        node.label().as_deref() == Some(VIP)
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(node.label(), None, "removed at stop");
}

#[tokio::test(start_paused = true)]
async fn stale_label_of_a_follower_is_removed_at_start() {
    let node = FakeNode::with(true, Some("192.0.2.99"));
    let (_tx, stop, task) = start(&node, following());
    until("stale label removed", Duration::from_millis(100), || {
        node.label().is_none()
    })
    .await;
    stop.cancel();
    task.await.unwrap();
}

/// API outage or missing RBAC: retried with back-off (1, 2, 4 s...) until it works.
#[tokio::test(start_paused = true)]
async fn failures_are_retried_with_backoff_until_the_label_matches() {
    let node = FakeNode::with(true, None);
    node.fail(4);
    let (_tx, stop, task) = start(&node, leading_state());
    let took = until("labelled after 4 failures", Duration::from_secs(30), || {
        node.label().as_deref() == Some(VIP)
    })
    .await;
    // 1 + 2 + 4 + 8 s of back-off.
    assert!(
        took >= Duration::from_secs(15) && took < Duration::from_secs(16),
        "{took:?}"
    );
    stop.cancel();
    task.await.unwrap();
}

/// Someone removes the label by hand: it is back within one resync.
#[tokio::test(start_paused = true)]
async fn a_label_removed_by_hand_comes_back_at_the_resync() {
    let node = FakeNode::with(true, None);
    let (_tx, stop, task) = start(&node, leading_state());
    until("labelled", Duration::from_millis(100), || {
        node.label().is_some()
    })
    .await;
    node.0.lock().unwrap().label = None;
    let took = until("relabelled", RESYNC + Duration::from_secs(1), || {
        node.label().is_some()
    })
    .await;
    assert!(took > RESYNC - Duration::from_secs(2), "{took:?}");
    stop.cancel();
    task.await.unwrap();
}

/// Bootstrap: no Node object yet. Checked again with back-off up to BACKOFF_MAX, labelled
/// once it exists.
#[tokio::test(start_paused = true)]
async fn no_node_object_is_labelled_once_it_exists() {
    let node = FakeNode::with(false, None);
    let (_tx, stop, task) = start(&node, leading_state());
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(node.label(), None);
    node.0.lock().unwrap().exists = true;
    until("labelled", BACKOFF_MAX + Duration::from_secs(1), || {
        node.label().as_deref() == Some(VIP)
    })
    .await;
    stop.cancel();
    task.await.unwrap();
}

/// The API never answers at stop: the stop is not held up longer than SHUTDOWN_LIMIT.
#[tokio::test(start_paused = true)]
async fn stop_is_bounded_when_the_api_hangs() {
    let node = FakeNode::with(true, None);
    let (_tx, stop, task) = start(&node, leading_state());
    until("labelled", Duration::from_millis(100), || {
        node.label().is_some()
    })
    .await;
    node.0.lock().unwrap().hang = true;
    // A resync is under way (and hangs) when the stop comes.
    tokio::time::sleep(RESYNC + Duration::from_secs(1)).await;
    let t0 = Instant::now();
    stop.cancel();
    task.await.unwrap();
    assert_eq!(t0.elapsed(), SHUTDOWN_LIMIT);
    assert_eq!(node.label().as_deref(), Some(VIP), "could not be removed");
}

/// The elector ended (its sender dropped): nothing is led any more, the label goes.
#[tokio::test(start_paused = true)]
async fn elector_gone_counts_as_not_leading() {
    let node = FakeNode::with(true, None);
    let (tx, stop, task) = start(&node, leading_state());
    until("labelled", Duration::from_millis(100), || {
        node.label().is_some()
    })
    .await;
    drop(tx);
    until("removed", Duration::from_millis(100), || {
        node.label().is_none()
    })
    .await;
    stop.cancel();
    task.await.unwrap();
}
