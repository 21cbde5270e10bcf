use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::time::Instant;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Records every transaction (in `nft` syntax); fails while `fail` is set.
#[derive(Default)]
struct FakeKernel {
    log: Mutex<Vec<String>>,
    fail: std::sync::atomic::AtomicBool,
}

impl LbKernel for Arc<FakeKernel> {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("Operation not permitted".into());
            }
            self.log.lock().unwrap().push(batch.text());
            Ok(())
        })
    }
    fn enable_forwarding(&self, _: Family) -> Result<bool, String> {
        Ok(false)
    }
}

impl FakeKernel {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// Backends in `down` refuse connections.
#[derive(Default)]
struct FakeProber {
    down: Mutex<HashSet<IpAddr>>,
}

impl Prober for Arc<FakeProber> {
    fn check(&self, addr: SocketAddr) -> BoxFuture<'static, health::CheckResult> {
        let down = self.down.lock().unwrap().contains(&addr.ip());
        Box::pin(async move {
            match down {
                true => Err(health::CheckFailure::Connect("refused".into())),
                false => Ok(()),
            }
        })
    }
}

fn cfg() -> LbConfig {
    LbConfig {
        vips: vec![ip("192.0.2.10")],
        lb_port: 6443,
        port: 6443,
        forwarding: Forwarding::Local,
    }
}

#[test]
fn forwarding_methods() {
    assert_eq!(Forwarding::parse("local"), Ok(Forwarding::Local));
    assert_eq!(Forwarding::parse("Masquerade"), Ok(Forwarding::Masquerade));
    for m in ["tunnel", "directroute", "bypass"] {
        let e = Forwarding::parse(m).unwrap_err();
        assert!(e.contains(m) && e.contains("not supported"), "{e}");
    }
    assert!(Forwarding::parse("nat").unwrap_err().contains("local"));
}

#[test]
fn rulesets_per_family_with_that_familys_backends() {
    let c = LbConfig {
        vips: vec![ip("192.0.2.10"), ip("2001:db8::10")],
        ..cfg()
    };
    let rs = c.rulesets(&[ip("192.0.2.11"), ip("2001:db8::11"), ip("192.0.2.12")]);
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[0].family, Family::Ip);
    assert_eq!(rs[0].vips, vec![ip("192.0.2.10")]);
    assert_eq!(rs[0].backends, vec![ip("192.0.2.11"), ip("192.0.2.12")]);
    assert_eq!(rs[1].family, Family::Ip6);
    assert_eq!(rs[1].backends, vec![ip("2001:db8::11")]);
    // IPv4 only: no ip6 table.
    assert_eq!(cfg().rulesets(&[ip("2001:db8::11")]).len(), 1);
}

struct Harness {
    kernel: Arc<FakeKernel>,
    prober: Arc<FakeProber>,
    cands: watch::Sender<Vec<Candidate>>,
    state: watch::Sender<LeaderState>,
    holder_ack: watch::Sender<u64>,
    acked: watch::Receiver<u64>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    metrics: crate::obs::metrics::Metrics,
}

fn cand(n: &str, a: &str) -> Candidate {
    Candidate {
        node: n.into(),
        addr: ip(a),
    }
}

fn start() -> Harness {
    let kernel = Arc::new(FakeKernel::default());
    let prober = Arc::new(FakeProber::default());
    let (cands, cands_rx) = watch::channel(vec![
        cand("a", "192.0.2.11"),
        cand("b", "192.0.2.12"),
        cand("c", "192.0.2.13"),
    ]);
    let (state, state_rx) = watch::channel(LeaderState::Following { holder: None });
    let (holder_ack, holder_rx) = watch::channel(0u64);
    let (acked_tx, acked) = watch::channel(0u64);
    let stop = CancellationToken::new();
    let metrics = crate::obs::metrics::Metrics::new("test");
    let lb = Lb {
        cfg: cfg(),
        tables: Tables::new(kernel.clone()),
        prober: Arc::new(prober.clone()),
        metrics: Some(metrics.families()),
    };
    let task = tokio::spawn(lb.run(cands_rx, state_rx, holder_rx, acked_tx, stop.clone()));
    Harness {
        kernel,
        prober,
        cands,
        state,
        holder_ack,
        acked,
        stop,
        task,
        metrics,
    }
}

fn leading(term: u64) -> LeaderState {
    LeaderState::Leading {
        term,
        renewed_at: Instant::now(),
        clean: true,
    }
}

/// Waits (virtual time) until the kernel log has an entry matching `pred`; returns the log.
async fn until(k: &FakeKernel, what: &str, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
    for _ in 0..200 {
        {
            let log = k.log.lock().unwrap();
            if pred(&log) {
                return log.clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: {:?}", k.log.lock().unwrap());
}

fn dnat(backends: &str) -> impl Fn(&[String]) -> bool + '_ {
    move |log: &[String]| {
        log.last()
            .is_some_and(|l| l.contains(&format!("map {{ {backends} }}:6443")))
    }
}

/// Stale tables go at start; leading installs all candidates at once; a dead backend leaves
/// after its first check of the term and, once known healthy, only after three failures; it
/// comes back after two successes; losing the lease removes the table before the holder's
/// acknowledgement is passed on; stop removes the tables.
#[tokio::test(start_paused = true)]
async fn follows_leadership_and_health() {
    let h = start();
    leading_installs_every_candidate_then_drops_the_dead_one(&h).await;
    health_moves_backends_in_and_out(&h).await;
    losing_the_lease_holds_the_ack_until_the_rules_are_gone(&h).await;
    // Leading again, then stop: both families removed.
    h.state.send_replace(leading(2));
    until(&h.kernel, "reinstall", |l| !l.is_empty()).await;
    h.kernel.take();
    h.stop.cancel();
    h.task.await.unwrap();
    assert!(
        !h.metrics.encode().contains("vipd_lb_backend_up{"),
        "no series after stop"
    );
    assert_eq!(
        h.kernel.take(),
        [
            "add table ip vipd_lb; delete table ip vipd_lb",
            "add table ip6 vipd_lb; delete table ip6 vipd_lb"
        ]
    );
}

/// Step of [`follows_leadership_and_health`]: stale tables go at start; leading installs
/// every candidate at once; an unchecked dead backend leaves after one check.
async fn leading_installs_every_candidate_then_drops_the_dead_one(h: &Harness) {
    let log = until(&h.kernel, "stale cleanup", |l| l.len() >= 2).await;
    assert_eq!(
        log,
        [
            "add table ip vipd_lb; delete table ip vipd_lb",
            "add table ip6 vipd_lb; delete table ip6 vipd_lb"
        ]
    );
    h.kernel.take();
    h.prober.down.lock().unwrap().insert(ip("192.0.2.12"));
    h.state.send_replace(leading(1));
    let log = until(&h.kernel, "install", |l| !l.is_empty()).await;
    assert!(
        log[0].starts_with("add table ip vipd_lb; delete table ip vipd_lb; add table ip vipd_lb")
            && log[0].contains("map { 0 : 192.0.2.11, 1 : 192.0.2.12, 2 : 192.0.2.13 }:6443"),
        "installed at once with every candidate: {log:?}"
    );
    until(
        &h.kernel,
        "unchecked dead backend out after one check",
        dnat("0 : 192.0.2.11, 1 : 192.0.2.13"),
    )
    .await;
    let text = h.metrics.encode();
    assert!(
        text.contains(r#"vipd_lb_backend_up{node="b",address="192.0.2.12"} 0"#)
            && text.contains(r#"vipd_lb_backend_up{node="a",address="192.0.2.11"} 1"#),
        "{text}"
    );
    h.kernel.take();
}

/// Step of [`follows_leadership_and_health`]: healthy again, back after two good checks;
/// known healthy, out only after three failures; a node that leaves the candidates leaves
/// the set at once.
async fn health_moves_backends_in_and_out(h: &Harness) {
    // Healthy again: back after two good checks.
    h.prober.down.lock().unwrap().clear();
    let t0 = Instant::now();
    until(
        &h.kernel,
        "back",
        dnat("0 : 192.0.2.11, 1 : 192.0.2.12, 2 : 192.0.2.13"),
    )
    .await;
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    h.kernel.take();
    // Known healthy: out only after three failures.
    h.prober.down.lock().unwrap().insert(ip("192.0.2.13"));
    let t0 = Instant::now();
    until(&h.kernel, "out", dnat("0 : 192.0.2.11, 1 : 192.0.2.12")).await;
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(t0.elapsed() <= Duration::from_secs(4), "{:?}", t0.elapsed());
    // A node leaves the candidates: the set follows at once.
    h.cands
        .send_replace(vec![cand("a", "192.0.2.11"), cand("c", "192.0.2.13")]);
    until(&h.kernel, "node removed", dnat("0 : 192.0.2.11")).await;
    h.kernel.take();
}

/// Step of [`follows_leadership_and_health`]: the holder acknowledges a dropped term before
/// the rules are gone; the acknowledgement is held back until they are.
async fn losing_the_lease_holds_the_ack_until_the_rules_are_gone(h: &Harness) {
    h.kernel
        .fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    h.state
        .send_replace(LeaderState::Following { holder: None });
    h.holder_ack.send_replace(1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        *h.acked.borrow(),
        0,
        "not passed on while the table is there"
    );
    h.kernel
        .fail
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let mut acked = h.acked.clone();
    tokio::time::timeout(Duration::from_secs(3), acked.wait_for(|t| *t == 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        h.kernel.take(),
        ["add table ip vipd_lb; delete table ip vipd_lb"]
    );
}

/// An acknowledgement while following with no table is passed on at once.
#[tokio::test(start_paused = true)]
async fn ack_passes_through_when_no_rules() {
    let h = start();
    h.holder_ack.send_replace(3);
    let mut acked = h.acked.clone();
    tokio::time::timeout(Duration::from_secs(1), acked.wait_for(|t| *t == 3))
        .await
        .unwrap()
        .unwrap();
    h.stop.cancel();
    h.task.await.unwrap();
}

/// The backends come from the process's Node cache, which holds every Node: only the
/// Ready control-plane Nodes are candidates, published once the first list is in and
/// again when they change, not when another Node does.
#[tokio::test]
async fn candidates_are_the_control_plane_nodes_of_the_shared_cache() {
    use kube::runtime::watcher::Event::*;
    let node = |name: &str, addr: &str, control_plane: bool| -> k8s_openapi::api::core::v1::Node {
        let labels = match control_plane {
            true => serde_json::json!({backends::CONTROL_PLANE_LABEL: ""}),
            false => serde_json::json!({}),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "status": {
                "addresses": [{"type": "InternalIP", "address": addr}],
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }))
        .unwrap()
    };
    let (events, cache) = crate::kube::watch::test_cache();
    let (tx, mut rx) = watch::channel(Vec::new());
    let stop = CancellationToken::new();
    let task = tokio::spawn(watch_candidates(cache.clone(), tx, stop.clone()));
    for ev in [
        Init,
        InitApply(node("a", "192.0.2.11", true)),
        InitApply(node("w", "192.0.2.21", false)),
        InitDone,
    ] {
        events.unbounded_send(Ok(ev)).unwrap();
    }
    rx.changed().await.unwrap();
    assert_eq!(*rx.borrow_and_update(), [cand("a", "192.0.2.11")]);
    // A worker's change publishes nothing; a new control-plane Node does.
    events
        .unbounded_send(Ok(Apply(node("w", "192.0.2.22", false))))
        .unwrap();
    events
        .unbounded_send(Ok(Apply(node("b", "192.0.2.12", true))))
        .unwrap();
    rx.changed().await.unwrap();
    assert_eq!(
        *rx.borrow_and_update(),
        [cand("a", "192.0.2.11"), cand("b", "192.0.2.12")]
    );
    stop.cancel();
    task.await.unwrap();
}
