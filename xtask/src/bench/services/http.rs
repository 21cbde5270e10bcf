//! HTTP probing of Service addresses from the client namespace.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::{CONNECT_TIMEOUT, POLL_INTERVAL, READ_TIMEOUT};

/// One `GET /` (HTTP/1.0) to `addr`; the first body line (the backend's node name) when the
/// answer is `HTTP/1.x 200`. Must run on a thread inside the client's namespace.
///
/// # Errors
/// The I/O error (connect refused / timed out / unreachable ...) or a non-200 answer.
pub fn http_answer(addr: SocketAddr) -> std::io::Result<String> {
    http_answer_within(addr, CONNECT_TIMEOUT)
}

/// [`http_answer`] with a connect timeout of `connect`.
///
/// # Errors
/// As [`http_answer`].
pub fn http_answer_within(addr: SocketAddr, connect: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, connect)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.set_write_timeout(Some(READ_TIMEOUT))?;
    s.write_all(format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut buf = Vec::new();
    s.take(4096).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let ok = text
        .lines()
        .next()
        .is_some_and(|l| l.starts_with("HTTP/1.") && l.split_whitespace().nth(1) == Some("200"));
    if !ok {
        return Err(std::io::Error::other(format!(
            "not a 200 answer: {:?}",
            text.lines().next().unwrap_or_default()
        )));
    }
    Ok(text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| b.lines().next())
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// When a Service first answered and from which node.
#[derive(Debug, Clone)]
pub struct Answer {
    /// When the answer arrived.
    pub at: Instant,
    /// The backend's node name.
    pub node: String,
}

/// Polls `addr` until it answers (see [`http_answer`]) or `deadline`; at most one attempt
/// per [`POLL_INTERVAL`]. Must run inside the client's namespace.
///
/// # Errors
/// At the deadline: the number of attempts and the last error.
pub fn poll_until_answer(addr: SocketAddr, deadline: Instant) -> Result<Answer> {
    let mut attempts = 0u64;
    loop {
        let started = Instant::now();
        attempts += 1;
        let err = match http_answer(addr) {
            Ok(node) => {
                return Ok(Answer {
                    at: Instant::now(),
                    node,
                });
            }
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            bail!("{addr} never answered ({attempts} attempts, last error: {err})");
        }
        let next = started + POLL_INTERVAL;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}

/// Threads of a [`Poller`] (each attempt opens a connection with a [`CONNECT_TIMEOUT`]
/// connect timeout): a thread per Service overloaded the 2-core VM at 10 000 Services (load
/// average 140-430) and measured the bench more than vipd.
pub const POLLERS: usize = 64;

/// A Service waiting for its first answer: its index, address, the instant its wait is
/// measured from and when it may be tried next.
struct Pending {
    i: usize,
    addr: SocketAddr,
    start: Instant,
    next: Instant,
}

/// The bounded poller of the scale and coldstart scenarios: [`POLLERS`] threads share the
/// Services not answered yet, each Service tried at most once per [`POLL_INTERVAL`] (see
/// [`http_answer`]) until it answers or `limit` after its start instant passed. Services
/// are added with [`Poller::add`] (before or while [`Poller::run`] runs);
/// [`Poller::close`] says that no more will come.
pub struct Poller {
    limit: Duration,
    pending: Mutex<VecDeque<Pending>>,
    closed: AtomicBool,
    abandoned: AtomicBool,
    /// Each Service's first answer by index (unset: none within the limit, or never added).
    pub answered: Vec<OnceLock<Answer>>,
    failures: Mutex<Vec<String>>,
    attempts: AtomicU64,
}

impl Poller {
    /// A poller for Services `0..n`, each given `limit` from its start instant.
    pub fn new(n: usize, limit: Duration) -> Poller {
        Poller {
            limit,
            pending: Mutex::new(VecDeque::new()),
            closed: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            answered: (0..n).map(|_| OnceLock::new()).collect(),
            failures: Mutex::new(Vec::new()),
            attempts: AtomicU64::new(0),
        }
    }

    /// Adds Service `i` (below the poller's `n`) at `addr`, its wait measured from `start`.
    pub fn add(&self, i: usize, addr: SocketAddr, start: Instant) {
        if let Ok(mut q) = self.pending.lock() {
            q.push_back(Pending {
                i,
                addr,
                start,
                next: start,
            });
        }
    }

    /// Adds every `(index, address, start instant)` of `list` ([`Poller::add`]).
    pub fn add_all(&self, list: impl IntoIterator<Item = (usize, SocketAddr, Instant)>) {
        for (i, addr, start) in list {
            self.add(i, addr, start);
        }
    }

    /// No more Services will be added: [`Poller::run`] returns once the pending ones are done.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Drops every pending Service and closes: [`Poller::run`] returns after the attempts
    /// in flight.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.close();
        if let Ok(mut q) = self.pending.lock() {
            q.clear();
        }
    }

    /// Records a failure (the poller's own: a Service that never answered; or the caller's).
    pub fn fail(&self, msg: String) {
        if let Ok(mut f) = self.failures.lock() {
            f.push(msg);
        }
    }

    /// The failures recorded so far, in order.
    pub fn failures(&self) -> Vec<String> {
        self.failures.lock().map(|f| f.clone()).unwrap_or_default()
    }

    /// Connection attempts made so far.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// Runs [`POLLERS`] threads until the poller is closed and nothing is pending. Must run
    /// inside the client's namespace (the threads it spawns stay there).
    ///
    /// # Errors
    /// When a poller thread panicked.
    pub fn run(&self) -> Result<()> {
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..POLLERS).map(|_| s.spawn(|| self.poll())).collect();
            for t in threads {
                t.join().map_err(|_| anyhow!("poller thread panicked"))?;
            }
            Ok(())
        })
    }

    /// One poller thread: takes the Service due first, tries it once, records its answer or
    /// puts it back for its next try; ends when the poller is closed and nothing is pending.
    fn poll(&self) {
        while !self.abandoned.load(Ordering::SeqCst) {
            let next = self.pending.lock().ok().and_then(|mut q| q.pop_front());
            let Some(mut p) = next else {
                if self.closed.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            if let Some(wait) = p.next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let started = Instant::now();
            self.attempts.fetch_add(1, Ordering::Relaxed);
            match http_answer(p.addr) {
                Ok(node) => {
                    if let Some(a) = self.answered.get(p.i) {
                        let _ = a.set(Answer {
                            at: Instant::now(),
                            node,
                        });
                    }
                }
                Err(e) if started >= p.start + self.limit => {
                    self.fail(format!("{} never answered (last error: {e})", p.addr));
                }
                Err(_) => {
                    p.next = started + POLL_INTERVAL;
                    if let Ok(mut q) = self.pending.lock() {
                        q.push_back(p);
                    }
                }
            }
        }
    }
}
