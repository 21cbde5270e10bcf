//! HTTP probing of Service addresses from the client namespace.

use std::collections::{BTreeSet, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::{CONNECT_TIMEOUT, POLL_INTERVAL, READ_TIMEOUT};
use crate::bench::stats::{ms, percentile, summary_ms};

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

/// Of the [`POLLERS`] threads of a [`Poller`], those that try only the Services whose
/// address no counted node carried at the last listing; the others try only the carried
/// ones. An address nobody carries costs an attempt the whole connect timeout, so these try
/// at most about 40 a second however many wait.
pub const BACKGROUND_POLLERS: usize = 8;

/// Time from the start of one listing of the counted nodes' addresses to the start of the
/// next (200 ms), unless a listing takes longer ([`next_sample_start`]).
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// Connect timeout of the first try of a Service whose address a counted node carries
/// (50 ms; each further failed try while carried doubles it, up to [`CONNECT_TIMEOUT`]). A
/// connect to a carried address takes well under a millisecond in the lab, unless its SYN
/// is lost (the client's neighbour entry still names a node that lost the address: the
/// poweroff phase): then the try is abandoned after 50 ms, not the whole connect timeout,
/// and the threads trying carried addresses stay free. The doubling keeps a node too busy
/// to answer within 50 ms measurable.
pub const CARRIED_CONNECT_TIMEOUT: Duration = Duration::from_millis(50);

/// Longest wait of an idle poller thread before it looks at the queues again; it is woken
/// when work for it arrives, this is only a safety net.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// When the next listing starts: `interval` after the previous one `started`, but no sooner
/// than the previous one's own duration after it `ended`, so that listing takes at most
/// half of one core however many addresses the nodes carry.
pub fn next_sample_start(started: Instant, ended: Instant, interval: Duration) -> Instant {
    (started + interval).max(ended + ended.saturating_duration_since(started))
}

/// Which pending Services a poller thread tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Only those whose address a counted node carried at the last listing.
    Carried,
    /// Only the others.
    Background,
}

/// A Service waiting for its first answer.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Its index.
    pub i: usize,
    /// Its address.
    pub addr: SocketAddr,
    /// The instant its wait is measured from.
    pub start: Instant,
    /// When it may be tried next.
    pub next: Instant,
    /// Whether a counted node carried its address at the last listing (it is queued with
    /// the carried ones).
    pub carried: bool,
    /// When the first listing that showed its address carried returned (`None`: never
    /// carried), or when it was queued if that is later.
    pub seen_carried: Option<Instant>,
    /// Whether it was tried since `seen_carried`.
    pub tried_carried: bool,
    /// Tries that failed while its address was carried.
    pub carried_failures: u32,
    /// Attempts so far.
    pub attempts: u64,
    /// The last attempt's error.
    pub last_error: Option<String>,
}

impl Pending {
    /// Service `i` at `addr`, its wait measured from (and first tried at) `start`.
    pub fn new(i: usize, addr: SocketAddr, start: Instant) -> Pending {
        Pending {
            i,
            addr,
            start,
            next: start,
            carried: false,
            seen_carried: None,
            tried_carried: false,
            carried_failures: 0,
            attempts: 0,
            last_error: None,
        }
    }

    /// Counts an attempt that starts at `started`; when it is the first one since a listing
    /// showed the address carried, returns the time from that listing to it.
    pub fn attempt(&mut self, started: Instant) -> Option<Duration> {
        self.attempts += 1;
        let seen = self.seen_carried?;
        if self.tried_carried {
            return None;
        }
        self.tried_carried = true;
        Some(started.saturating_duration_since(seen))
    }

    /// The connect timeout of its next try: [`CONNECT_TIMEOUT`] unless its address is
    /// carried, else [`CARRIED_CONNECT_TIMEOUT`] doubled per earlier failure while carried,
    /// [`CONNECT_TIMEOUT`] at most.
    pub fn connect_timeout(&self) -> Duration {
        if !self.carried {
            return CONNECT_TIMEOUT;
        }
        let doubled = CARRIED_CONNECT_TIMEOUT.saturating_mul(1 << self.carried_failures.min(16));
        doubled.min(CONNECT_TIMEOUT)
    }

    /// The failure of a Service that did not answer within `limit`.
    pub fn never_answered(&self, limit: Duration) -> String {
        let carried = match self.seen_carried {
            Some(at) => format!(
                "carried {:.0} ms after its wait began",
                ms(at.saturating_duration_since(self.start))
            ),
            None => "never carried by a counted node".into(),
        };
        format!(
            "{} never answered within {:.1} s ({} attempts, {carried}, last error: {})",
            self.addr,
            limit.as_secs_f64(),
            self.attempts,
            self.last_error.as_deref().unwrap_or("none")
        )
    }
}

/// The Services of a [`Poller`] not answered yet and the choice of the next one to try: a
/// queue of those whose address a counted node carried at the last listing, tried first
/// (they normally answer at once), and a queue of the others; first in, first out in each.
#[derive(Debug, Default)]
pub struct Schedule {
    carried: VecDeque<Pending>,
    other: VecDeque<Pending>,
    /// The addresses the counted nodes carried at the last listing.
    now_carried: BTreeSet<IpAddr>,
    /// When the last listing returned.
    sampled_at: Option<Instant>,
    /// Taken and neither put back nor done yet.
    in_flight: usize,
}

impl Schedule {
    /// Queues `p` by the last listing; returns whether with the carried ones.
    pub fn add(&mut self, mut p: Pending) -> bool {
        p.carried = self.now_carried.contains(&p.addr.ip());
        if p.carried
            && let Some(at) = self.sampled_at
        {
            p.seen_carried.get_or_insert(at.max(p.start));
        }
        let carried = p.carried;
        if carried {
            self.carried.push_back(p);
        } else {
            self.other.push_back(p);
        }
        carried
    }

    /// The next Service for a thread of `role`, in flight until [`Schedule::put_back`] or
    /// [`Schedule::done`].
    pub fn take(&mut self, role: Role) -> Option<Pending> {
        let p = match role {
            Role::Carried => self.carried.pop_front(),
            Role::Background => self.other.pop_front(),
        }?;
        self.in_flight += 1;
        Some(p)
    }

    /// A taken Service that did not answer goes back ([`Schedule::add`]).
    pub fn put_back(&mut self, p: Pending) -> bool {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.add(p)
    }

    /// A taken Service answered or was given up.
    pub fn done(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// A listing returned at `at`: the counted nodes carry `carried`. Queues every Service
    /// again by it (those no longer carried go back with the others).
    pub fn sampled(&mut self, carried: BTreeSet<IpAddr>, at: Instant) {
        self.now_carried = carried;
        self.sampled_at = Some(at);
        let carried = std::mem::take(&mut self.carried);
        let other = std::mem::take(&mut self.other);
        for p in carried.into_iter().chain(other) {
            self.add(p);
        }
    }

    /// Removes the queued Services whose wait began `limit` or more before `now` and
    /// returns them (the ones in flight are left to their threads).
    pub fn expire(&mut self, now: Instant, limit: Duration) -> Vec<Pending> {
        let mut out = Vec::new();
        for q in [&mut self.carried, &mut self.other] {
            let (keep, gone): (VecDeque<Pending>, VecDeque<Pending>) = std::mem::take(q)
                .into_iter()
                .partition(|p| now < p.start + limit);
            *q = keep;
            out.extend(gone);
        }
        out
    }

    /// Nothing queued and nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.carried.is_empty() && self.other.is_empty() && self.in_flight == 0
    }

    /// Drops every queued Service.
    pub fn clear(&mut self) {
        self.carried.clear();
        self.other.clear();
    }
}

/// What a [`Poller`] did, for the report ([`PollStats::line`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PollStats {
    /// Connection attempts.
    pub attempts: u64,
    /// Of them, attempts to addresses a counted node carried at the last listing.
    pub carried_attempts: u64,
    /// Of those, the ones that failed.
    pub carried_failures: u64,
    /// Per Service whose address a listing showed carried: the time from that listing's
    /// return to the Service's first attempt after it, ms.
    pub first_tries_ms: Vec<f64>,
    /// Per Service that answered after a listing showed its address carried: the time from
    /// that listing's return to the answer, ms (what the node's address, fence and the
    /// client's neighbour resolution add after the address is on the interface).
    pub carried_to_answer_ms: Vec<f64>,
    /// The failed tries of carried addresses by error kind (`std::io::ErrorKind`'s name, or
    /// "not 200"), most frequent first.
    pub carried_errors: Vec<(String, u64)>,
    /// Listings made.
    pub samples: usize,
    /// Listings that failed, and the first failure.
    pub sample_errors: usize,
    /// The first listing failure.
    pub first_sample_error: Option<String>,
    /// Time from one listing's start to the next one's, ms.
    pub sample_periods_ms: Vec<f64>,
    /// Duration of each listing, ms.
    pub sample_took_ms: Vec<f64>,
}

impl PollStats {
    /// The report's polling figures over `elapsed` of polling (what follows "polling: ").
    pub fn line(&self, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64().max(0.001);
        let p50 = |v: &[f64]| percentile(v, 50.0).map_or("n/a".into(), |x| format!("{x:.0} ms"));
        let max = |v: &[f64]| percentile(v, 100.0).map_or("n/a".into(), |x| format!("{x:.0} ms"));
        let errors = match (self.sample_errors, &self.first_sample_error) {
            (0, _) => "none failed".to_string(),
            (n, first) => format!("{n} failed, first: {}", first.as_deref().unwrap_or("?")),
        };
        let background = self.attempts.saturating_sub(self.carried_attempts);
        format!(
            "{} attempts in {secs:.1} s ({POLLERS} threads); carried address, listing -> first try: {}; \
             addresses listed {} times, every {} (p50, max {}), a listing took {} (p50, max {}), {errors}; \
             {} attempts to carried addresses ({} failed{}), {background} ({:.0}/s, {BACKGROUND_POLLERS} threads) to the others; \
             carried address, listing -> answer: {}",
            self.attempts,
            summary_ms(&self.first_tries_ms),
            self.samples,
            p50(&self.sample_periods_ms),
            max(&self.sample_periods_ms),
            p50(&self.sample_took_ms),
            max(&self.sample_took_ms),
            self.carried_attempts,
            self.carried_failures,
            if self.carried_errors.is_empty() {
                String::new()
            } else {
                let kinds: Vec<String> = self
                    .carried_errors
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                format!(": {}", kinds.join(", "))
            },
            background as f64 / secs,
            summary_ms(&self.carried_to_answer_ms),
        )
    }
}

/// The address listings of a [`Poller`].
#[derive(Debug, Default)]
struct Samples {
    starts: Vec<Instant>,
    took: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
}

/// A poller thread's guard: a panic abandons the poller, so that the other threads do not
/// wait for the Service the panicking one had in flight.
struct AbandonOnPanic<'a>(&'a Poller);

impl Drop for AbandonOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abandon();
        }
    }
}

/// The bounded poller of the scale and coldstart scenarios and the poweroff phase:
/// [`POLLERS`] threads share the Services not answered yet, each Service tried at most once
/// per [`POLL_INTERVAL`] (see [`http_answer`]) until it answers or `limit` after its start
/// instant passed. Services are added with [`Poller::add`] (before or while
/// [`Poller::run`] runs); [`Poller::close`] says that no more will come.
///
/// One more thread lists the addresses the counted nodes carry about every
/// [`SAMPLE_INTERVAL`]; the Services whose address is carried are tried by all but
/// [`BACKGROUND_POLLERS`] threads, the others only by those ([`Schedule`]). A try of an
/// address nobody carries lasts the connect timeout: when every thread tried every waiting
/// Service in turn, each of 10 000 was tried only about every 31 s. Now a carried address
/// is tried within about a listing interval of appearing, however many wait.
pub struct Poller {
    limit: Duration,
    schedule: Mutex<Schedule>,
    /// Wakes the threads of [`Role::Carried`].
    wake_carried: Condvar,
    /// Wakes the threads of [`Role::Background`].
    wake_other: Condvar,
    closed: AtomicBool,
    abandoned: AtomicBool,
    /// Each Service's first answer by index (unset: none within the limit, or never added).
    pub answered: Vec<OnceLock<Answer>>,
    failures: Mutex<Vec<String>>,
    attempts: AtomicU64,
    carried_attempts: AtomicU64,
    carried_failures: AtomicU64,
    first_tries: Mutex<Vec<Duration>>,
    carried_to_answer: Mutex<Vec<Duration>>,
    carried_errors: Mutex<std::collections::BTreeMap<String, u64>>,
    samples: Mutex<Samples>,
}

impl Poller {
    /// A poller for Services `0..n`, each given `limit` from its start instant.
    pub fn new(n: usize, limit: Duration) -> Poller {
        Poller {
            limit,
            schedule: Mutex::new(Schedule::default()),
            wake_carried: Condvar::new(),
            wake_other: Condvar::new(),
            closed: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            answered: (0..n).map(|_| OnceLock::new()).collect(),
            failures: Mutex::new(Vec::new()),
            attempts: AtomicU64::new(0),
            carried_attempts: AtomicU64::new(0),
            carried_failures: AtomicU64::new(0),
            first_tries: Mutex::new(Vec::new()),
            carried_to_answer: Mutex::new(Vec::new()),
            carried_errors: Mutex::new(std::collections::BTreeMap::new()),
            samples: Mutex::new(Samples::default()),
        }
    }

    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn wake_one(&self, carried: bool) {
        if carried {
            self.wake_carried.notify_one();
        } else {
            self.wake_other.notify_one();
        }
    }

    fn wake_all(&self) {
        self.wake_carried.notify_all();
        self.wake_other.notify_all();
    }

    /// Adds Service `i` (below the poller's `n`) at `addr`, its wait measured from `start`.
    pub fn add(&self, i: usize, addr: SocketAddr, start: Instant) {
        let carried = self.schedule().add(Pending::new(i, addr, start));
        self.wake_one(carried);
    }

    /// Adds every `(index, address, start instant)` of `list` ([`Poller::add`]).
    pub fn add_all(&self, list: impl IntoIterator<Item = (usize, SocketAddr, Instant)>) {
        for (i, addr, start) in list {
            self.add(i, addr, start);
        }
    }

    /// No more Services will be added: [`Poller::run`] returns once the pending ones are
    /// done.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Drops every pending Service and closes: [`Poller::run`] returns after the attempts in
    /// flight.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.closed.store(true, Ordering::SeqCst);
        self.schedule().clear();
        self.wake_all();
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

    /// What the poller did so far.
    pub fn stats(&self) -> PollStats {
        let first_tries_ms = self
            .first_tries
            .lock()
            .map(|v| v.iter().copied().map(ms).collect())
            .unwrap_or_default();
        let carried_to_answer_ms = self
            .carried_to_answer
            .lock()
            .map(|v| v.iter().copied().map(ms).collect())
            .unwrap_or_default();
        let mut carried_errors: Vec<(String, u64)> = self
            .carried_errors
            .lock()
            .map(|m| m.iter().map(|(k, n)| (k.clone(), *n)).collect())
            .unwrap_or_default();
        carried_errors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let s = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        PollStats {
            attempts: self.attempts(),
            carried_attempts: self.carried_attempts.load(Ordering::Relaxed),
            carried_failures: self.carried_failures.load(Ordering::Relaxed),
            first_tries_ms,
            carried_to_answer_ms,
            carried_errors,
            samples: s.took.len(),
            sample_errors: s.errors,
            first_sample_error: s.first_error.clone(),
            sample_periods_ms: s.starts.windows(2).map(|w| ms(w[1] - w[0])).collect(),
            sample_took_ms: s.took.iter().copied().map(ms).collect(),
        }
    }

    /// The poller was abandoned, or is closed with nothing pending or in flight.
    fn finished(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
            || (self.closed.load(Ordering::SeqCst) && self.schedule().is_idle())
    }

    /// Runs [`POLLERS`] threads until the poller is closed and nothing is pending, and one
    /// more that calls `carried` about every [`SAMPLE_INTERVAL`] ([`next_sample_start`]) for
    /// the addresses the counted nodes carry now (those of a node that does not count, e.g.
    /// one whose link is cut, must be left out): the Services at those addresses are tried
    /// by all threads but [`BACKGROUND_POLLERS`], the others only by those. A failed listing
    /// is counted ([`Poller::stats`]) and leaves the last one in force. Must run inside the
    /// client's namespace (the threads it spawns stay there).
    ///
    /// # Errors
    /// When a poller thread panicked.
    pub fn run(&self, carried: &(dyn Fn() -> Result<BTreeSet<IpAddr>> + Sync)) -> Result<()> {
        std::thread::scope(|s| {
            let mut threads: Vec<_> = (0..POLLERS)
                .map(|k| {
                    let role = if k < BACKGROUND_POLLERS {
                        Role::Background
                    } else {
                        Role::Carried
                    };
                    s.spawn(move || self.poll(role))
                })
                .collect();
            threads.push(s.spawn(|| self.sample(carried)));
            for t in threads {
                t.join().map_err(|_| anyhow!("poller thread panicked"))?;
            }
            Ok(())
        })
    }

    /// The listing thread: lists, queues the Services again by it and gives up those past
    /// their limit, until the poller is finished.
    fn sample(&self, carried: &(dyn Fn() -> Result<BTreeSet<IpAddr>> + Sync)) {
        let _guard = AbandonOnPanic(self);
        while !self.finished() {
            let started = Instant::now();
            let listed = carried();
            let ended = Instant::now();
            if let Ok(mut s) = self.samples.lock() {
                s.starts.push(started);
                s.took.push(ended.saturating_duration_since(started));
                if let Err(e) = &listed {
                    s.errors += 1;
                    s.first_error.get_or_insert_with(|| format!("{e:#}"));
                }
            }
            let expired = {
                let mut s = self.schedule();
                if let Ok(set) = listed {
                    s.sampled(set, ended);
                }
                s.expire(ended, self.limit)
            };
            for p in &expired {
                self.fail(p.never_answered(self.limit));
            }
            self.wake_all();
            let next = next_sample_start(started, ended, SAMPLE_INTERVAL);
            while !self.finished() {
                let Some(wait) = next.checked_duration_since(Instant::now()) else {
                    break;
                };
                std::thread::sleep(wait.min(Duration::from_millis(10)));
            }
        }
    }

    /// One poller thread of `role`: takes the next Service for it ([`Schedule::take`]),
    /// tries it once, records its answer or puts it back for its next try; ends when the
    /// poller is finished.
    fn poll(&self, role: Role) {
        let _guard = AbandonOnPanic(self);
        let wake = if role == Role::Carried {
            &self.wake_carried
        } else {
            &self.wake_other
        };
        loop {
            let mut p = {
                let mut s = self.schedule();
                loop {
                    if self.abandoned.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Some(p) = s.take(role) {
                        break p;
                    }
                    if self.closed.load(Ordering::SeqCst) && s.is_idle() {
                        return;
                    }
                    s = wake
                        .wait_timeout(s, IDLE_WAIT)
                        .map_or_else(|e| e.into_inner().0, |(g, _)| g);
                }
            };
            if let Some(wait) = p.next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let started = Instant::now();
            self.attempts.fetch_add(1, Ordering::Relaxed);
            if p.carried {
                self.carried_attempts.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(d) = p.attempt(started)
                && let Ok(mut v) = self.first_tries.lock()
            {
                v.push(d);
            }
            let result = http_answer_within(p.addr, p.connect_timeout());
            if let Err(e) = &result
                && p.carried
            {
                p.carried_failures += 1;
                self.carried_failures.fetch_add(1, Ordering::Relaxed);
                let kind = match e.kind() {
                    std::io::ErrorKind::Other => "not 200".to_string(),
                    k => format!("{k:?}"),
                };
                if let Ok(mut m) = self.carried_errors.lock() {
                    *m.entry(kind).or_default() += 1;
                }
            }
            match result {
                Ok(node) => {
                    if let Some(seen) = p.seen_carried
                        && let Ok(mut v) = self.carried_to_answer.lock()
                    {
                        v.push(Instant::now().saturating_duration_since(seen));
                    }
                    if let Some(a) = self.answered.get(p.i) {
                        let _ = a.set(Answer {
                            at: Instant::now(),
                            node,
                        });
                    }
                    self.done();
                }
                Err(e) if started >= p.start + self.limit => {
                    p.last_error = Some(e.to_string());
                    self.fail(p.never_answered(self.limit));
                    self.done();
                }
                Err(e) => {
                    p.last_error = Some(e.to_string());
                    p.next = started + POLL_INTERVAL;
                    let carried = self.schedule().put_back(p);
                    self.wake_one(carried);
                }
            }
        }
    }

    /// A Service in flight answered or was given up; wakes every thread when that was the
    /// last one and the poller is closed.
    fn done(&self) {
        let mut s = self.schedule();
        s.done();
        if self.closed.load(Ordering::SeqCst) && s.is_idle() {
            drop(s);
            self.wake_all();
        }
    }
}
