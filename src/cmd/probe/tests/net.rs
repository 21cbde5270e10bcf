use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch};

use super::super::*;
use super::cli;

// ---------- network, against a local test server on 127.0.0.1 ----------

#[derive(Debug, Clone, PartialEq)]
enum Mode {
    /// 200 with body "<name>\n".
    Answer(&'static str),
    /// The given status code, body "down\n".
    Status(u16),
    /// No listener: connects are refused.
    Refuse,
    /// Accept and never answer (connections held until the mode changes).
    Hang,
}

/// A tiny HTTP/1.0-style responder (a fixture: the client under test is hyper).
struct TestServer {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    accepted: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

fn listen(addr: SocketAddr) -> TcpListener {
    let sock = TcpSocket::new_v4().expect("socket");
    sock.set_reuseaddr(true).expect("SO_REUSEADDR");
    sock.bind(addr).expect("bind the test port again");
    sock.listen(128).expect("listen")
}

impl TestServer {
    async fn start(mode: Mode) -> Self {
        let first = listen(SocketAddr::from(([127, 0, 0, 1], 0)));
        let addr = first.local_addr().expect("local addr");
        let first = (mode != Mode::Refuse).then_some(first);
        let (mode_tx, mut mode_rx) = watch::channel(mode);
        let (count_tx, count_rx) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            let mut listener = first;
            let mut held = Vec::new();
            loop {
                let mode = mode_rx.borrow_and_update().clone();
                if mode == Mode::Refuse {
                    listener = None;
                    held.clear();
                    if mode_rx.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                let l = listener.get_or_insert_with(|| listen(addr));
                tokio::select! {
                    changed = mode_rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        held.clear();
                    }
                    accepted = l.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        count_tx.send_modify(|n| *n += 1);
                        match mode {
                            Mode::Hang => held.push(stream),
                            Mode::Answer(name) => {
                                let body = format!("{name}\n");
                                tokio::spawn(respond(stream, "200 OK".to_owned(), body));
                            }
                            Mode::Status(code) => {
                                let status = format!("{code} Test");
                                tokio::spawn(respond(stream, status, "down\n".to_owned()));
                            }
                            Mode::Refuse => {}
                        }
                    }
                }
            }
        });
        Self {
            addr,
            mode: mode_tx,
            accepted: count_rx,
            task,
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    fn accepted(&self) -> u64 {
        *self.accepted.borrow()
    }

    fn config(&self, interval_ms: u64, timeout_ms: u64, limit: Limit) -> ProbeConfig {
        ProbeConfig {
            target: Target::parse(&format!("http://{}/", self.addr)).expect("target"),
            interval: Duration::from_millis(interval_ms),
            timeout: Duration::from_millis(timeout_ms),
            limit,
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn respond(mut stream: TcpStream, status: String, body: String) {
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    // The client must ask for a fresh connection per request.
    let text = String::from_utf8_lossy(&req).to_ascii_lowercase();
    let body = if text.contains("connection: close") {
        body
    } else {
        "keep-alive-requested\n".to_owned()
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Bound on a whole network test, so a bug fails it instead of hanging the suite.
const TEST_BOUND: Duration = Duration::from_secs(30);

/// Runs `cfg` until its limit ends the run (no shutdown), bounded by [`TEST_BOUND`]; returns
/// the statistics and the outcomes in completion order.
async fn probe_to_limit(cfg: &ProbeConfig) -> (ProbeStats, Vec<Outcome>) {
    let mut seen = Vec::new();
    let stats = tokio::time::timeout(
        TEST_BOUND,
        probe(cfg, std::future::pending(), |_, o| seen.push(o.clone())),
    )
    .await
    .expect("the limit (and each request's timeout) ends the run");
    (stats, seen)
}

#[tokio::test]
async fn new_connection_per_request_and_count_limit() {
    let server = TestServer::start(Mode::Answer("node-a")).await;
    let cfg = server.config(10, 1000, Limit::Count(5));
    let (stats, seen) = probe_to_limit(&cfg).await;
    let s = stats.summary();
    assert_eq!((s.requests, s.successes, s.abandoned), (5, 5, 0));
    assert_eq!(s.backends, BTreeMap::from([("node-a".to_owned(), 5)]));
    assert_eq!(s.switch_count, 0);
    assert_eq!(server.accepted(), 5, "one TCP connection per request");
    let mut seqs: Vec<u64> = seen.iter().map(|o| o.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn schedule_is_not_delayed_by_hanging_requests() {
    let server = TestServer::start(Mode::Hang).await;
    let cfg = server.config(10, 300, Limit::Count(3));
    let (stats, mut seen) = probe_to_limit(&cfg).await;
    seen.sort_by_key(|o| o.seq);
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|o| o.result == Err(FailureKind::Timeout)));
    // Each request started while the previous one was still hanging.
    for pair in seen.windows(2) {
        assert!(pair[1].sent_at < pair[0].answered_at(), "{pair:?}");
    }
    assert_eq!(server.accepted(), 3);
    let s = stats.summary();
    assert_eq!(
        s.failures_by_kind,
        BTreeMap::from([("timeout".to_owned(), 3)])
    );
    assert_eq!(s.trailing_failures, 3);
}

#[tokio::test]
async fn http_status_is_a_failure() {
    let server = TestServer::start(Mode::Status(503)).await;
    let cfg = server.config(10, 1000, Limit::Count(2));
    let s = probe_to_limit(&cfg).await.0.summary();
    assert_eq!((s.successes, s.failures), (0, 2));
    assert_eq!(
        s.failures_by_kind,
        BTreeMap::from([("http_503".to_owned(), 2)])
    );
}

/// `tcp://`: a completed handshake is a success (a server that never answers a byte still
/// counts), a refused connection a failure.
#[tokio::test]
async fn tcp_target_counts_handshakes() {
    let server = TestServer::start(Mode::Hang).await;
    let cfg = ProbeConfig {
        target: Target::parse(&format!("tcp://{}", server.addr)).expect("target"),
        ..server.config(10, 1000, Limit::Count(3))
    };
    let s = probe_to_limit(&cfg).await.0.summary();
    assert_eq!((s.successes, s.failures), (3, 0));
    server.set(Mode::Refuse);
    // The server task closes its listener when it sees the mode change.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(server.addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "listener still open"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let s = probe_to_limit(&cfg).await.0.summary();
    assert_eq!((s.successes, s.failures), (0, 3));
    assert_eq!(
        s.failures_by_kind,
        BTreeMap::from([("refused".to_owned(), 3)])
    );
}

#[tokio::test]
async fn shutdown_stops_at_once_and_counts_abandoned() {
    let server = TestServer::start(Mode::Hang).await;
    // Requests would hang for 60 s; shutdown when two are held by the server.
    let cfg = server.config(10, 60_000, Limit::Forever);
    let mut accepted = server.accepted.clone();
    let shutdown = async move {
        let _ = accepted.wait_for(|n| *n >= 2).await;
    };
    let stats = tokio::time::timeout(TEST_BOUND, probe(&cfg, shutdown, |_, _| {}))
        .await
        .expect("shutdown must not wait for the 60 s timeout");
    let s = stats.summary();
    assert_eq!(s.requests, 0);
    assert!(s.abandoned >= 2, "{s:?}");
}

#[tokio::test]
async fn detects_switch_across_refused_and_hanging_backend() {
    let server = TestServer::start(Mode::Answer("node-a")).await;
    // Duration limit only as a safety net: the test stops the probe itself.
    let cfg = server.config(20, 300, Limit::Duration(TEST_BOUND));
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let mut stop_tx = Some(stop_tx);
    let (mut phase, mut n) = (0, 0);
    let next = |mode: Mode, phase: &mut i32, n: &mut i32| {
        server.set(mode);
        *phase += 1;
        *n = 0;
    };
    let stats = probe(
        &cfg,
        async move {
            let _ = stop_rx.await;
        },
        |_, o| match (phase, &o.result) {
            (0, Ok(b)) if b == "node-a" => {
                n += 1;
                if n >= 3 {
                    next(Mode::Refuse, &mut phase, &mut n);
                }
            }
            (1, Err(FailureKind::Refused)) => {
                n += 1;
                if n >= 2 {
                    next(Mode::Hang, &mut phase, &mut n);
                }
            }
            (2, Err(FailureKind::Timeout)) => {
                n += 1;
                if n >= 2 {
                    next(Mode::Answer("node-b"), &mut phase, &mut n);
                }
            }
            (3, Ok(b)) if b == "node-b" => {
                n += 1;
                if n >= 3
                    && let Some(tx) = stop_tx.take()
                {
                    let _ = tx.send(());
                }
            }
            _ => {}
        },
    )
    .await;
    assert!(stop_tx.is_none(), "all phases seen before the safety limit");
    let s = stats.summary();
    assert_eq!(s.switch_count, 1, "{s:?}");
    let sw = &s.switches[0];
    assert_eq!((sw.from.as_str(), sw.to.as_str()), ("node-a", "node-b"));
    assert!(sw.failures >= 4, "{sw:?}");
    assert!(
        s.failures_by_kind.get("refused").copied().unwrap_or(0) >= 2,
        "{s:?}"
    );
    assert!(
        s.failures_by_kind.get("timeout").copied().unwrap_or(0) >= 2,
        "{s:?}"
    );
    assert!(s.backends.get("node-a").copied().unwrap_or(0) >= 3);
    assert!(s.backends.get("node-b").copied().unwrap_or(0) >= 3);
    // The outage is the longest gap, and it lasted at least one hanging request's timeout.
    let gap = s.longest_gap.as_ref().expect("a gap");
    assert_eq!((gap.gap_ms, gap.failures), (sw.gap_ms, sw.failures));
    assert!(gap.gap_ms >= 300.0, "{gap:?}");
    assert!(s.failures >= 4);
}

#[tokio::test]
async fn run_prints_lines_and_json_summary() {
    let server = TestServer::start(Mode::Answer("node-a")).await;
    let args = cli(&[
        &format!("http://{}/", server.addr),
        "--interval",
        "10ms",
        "--count",
        "3",
        "--json",
    ])
    .expect("parses");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    tokio::time::timeout(
        TEST_BOUND,
        run_with_output(args, std::future::pending(), &mut out, &mut err),
    )
    .await
    .expect("ends")
    .expect("runs");
    let out = String::from_utf8(out).expect("utf8");
    let summary: Summary = serde_json::from_str(out.trim()).expect("stdout is only the JSON");
    assert_eq!((summary.requests, summary.successes), (3, 3));
    let err = String::from_utf8(err).expect("utf8");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines.iter().all(|l| l
            .get(12..)
            .is_some_and(|r| r.starts_with(" node-a ") && r.ends_with("ms"))),
        "{err}"
    );

    let quiet = cli(&[
        &format!("http://{}/", server.addr),
        "--count",
        "1",
        "--interval",
        "1ms",
        "-q",
    ])
    .expect("parses");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    run_with_output(quiet, std::future::pending(), &mut out, &mut err)
        .await
        .expect("runs");
    let out = String::from_utf8(out).expect("utf8");
    assert!(out.starts_with("--- http://127.0.0.1:"), "{out}");
    assert!(out.contains("1 requests, 1 successes, 0 failures"), "{out}");
    assert!(err.is_empty());
}

#[tokio::test]
async fn refused_connection_is_classified() {
    // Starting in Refuse mode, the port is closed before `start` returns.
    let server = TestServer::start(Mode::Refuse).await;
    let cfg = server.config(10, 1000, Limit::Count(1));
    let s = probe_to_limit(&cfg).await.0.summary();
    assert_eq!(server.accepted(), 0);
    assert_eq!(
        s.failures_by_kind,
        BTreeMap::from([("refused".to_owned(), 1)])
    );
}
