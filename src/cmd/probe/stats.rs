//! The outcome of a request ([`Outcome`], [`FailureKind`]) and the pure statistics over a run
//! ([`ProbeStats`], [`Summary`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::clock::wall_clock;

/// Largest number of switches kept individually in [`ProbeStats`]; further switches are only
/// counted ([`Summary::switch_count`]). Flapping between two holders (a split brain) at 10
/// requests per second for an hour stays far below this.
pub const MAX_SWITCHES_KEPT: usize = 10_000;

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureKind {
    /// TCP connect refused (RST to the SYN: nobody listens, e.g. the VIP moved but the
    /// backend is down). Label `refused`.
    Refused,
    /// No route / host unreachable (`EHOSTUNREACH`, `ENETUNREACH`: ARP for the VIP got no
    /// answer). Label `unreachable`.
    Unreachable,
    /// The request did not complete within `--timeout`. Label `timeout`.
    Timeout,
    /// The connection was reset or closed before a complete response. Label `reset`.
    Reset,
    /// The server answered with a non-2xx status. Label `http_<code>`, e.g. `http_503`.
    Status(u16),
    /// The response was not valid HTTP/1 (detail attached). Label `protocol`.
    Protocol(String),
    /// Anything else, e.g. name resolution failed (detail attached). Label `other`.
    Other(String),
}

impl FailureKind {
    /// The stable label used in the per-answer lines and as key of
    /// [`Summary::failures_by_kind`]: `refused`, `unreachable`, `timeout`, `reset`,
    /// `http_<code>`, `protocol`, `other`.
    pub fn label(&self) -> String {
        match self {
            Self::Refused => "refused".to_owned(),
            Self::Unreachable => "unreachable".to_owned(),
            Self::Timeout => "timeout".to_owned(),
            Self::Reset => "reset".to_owned(),
            Self::Status(code) => format!("http_{code}"),
            Self::Protocol(_) => "protocol".to_owned(),
            Self::Other(_) => "other".to_owned(),
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Protocol(detail) | Self::Other(detail) => {
                write!(f, "{} ({detail})", self.label())
            }
            _ => f.write_str(&self.label()),
        }
    }
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Request number in start order, 0-based and gap-free over a run. [`ProbeStats`]
    /// analyses outcomes in this order, whatever order they complete in.
    pub seq: u64,
    /// When the request started, as an offset from the probe start (monotonic clock).
    pub sent_at: Duration,
    /// From start to answer or failure (for a timeout about `--timeout`).
    pub latency: Duration,
    /// `Ok(backend)`: a 2xx answer whose body's first line (without trailing `\r`/spaces) is
    /// `backend`, the node name. `Err(kind)`: the failure.
    pub result: Result<String, FailureKind>,
}

impl Outcome {
    /// When the answer (or failure) arrived: `sent_at + latency`, offset from the probe start.
    pub(crate) fn answered_at(&self) -> Duration {
        self.sent_at + self.latency
    }
}

/// The longest time without a successful answer (see [`ProbeStats`] for the definition).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gap {
    /// When the gap started: the arrival of the earlier successful answer, ms since the
    /// probe start.
    pub start_ms: f64,
    /// Length of the gap in ms.
    pub gap_ms: f64,
    /// Failed requests (in start order) between the two successful answers.
    pub failures: u64,
}

/// A change of the answering backend between two successive successful answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Switch {
    /// Backend of the earlier answer (first body line).
    pub from: String,
    /// Backend of the later answer.
    pub to: String,
    /// Arrival of the first answer of `to`, ms since the probe start.
    pub at_ms: f64,
    /// Time from the last answer of `from` to the first answer of `to`, in ms.
    pub gap_ms: f64,
    /// Failed requests (in start order) between the two answers.
    pub failures: u64,
}

/// Latency of successful answers, in ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Fastest answer, ms.
    pub min_ms: f64,
    /// Mean over all successful answers, ms.
    pub avg_ms: f64,
    /// Slowest answer, ms.
    pub max_ms: f64,
}

/// The summary of a probe run; this is the JSON printed by `vipd probe --json` (one line,
/// serde field names as below, all durations are milliseconds as JSON numbers with up to
/// microsecond precision, all instants are ms offsets from `started_unix_ms`):
///
/// ```json
/// {"target":"http://192.0.2.10/","interval_ms":100.0,"timeout_ms":1000.0,
///  "started_unix_ms":1735732800000,"elapsed_ms":30012.5,
///  "requests":300,"successes":290,"failures":10,"abandoned":0,
///  "failures_by_kind":{"refused":2,"timeout":8},
///  "latency":{"min_ms":0.4,"avg_ms":1.2,"max_ms":3.4},
///  "backends":{"node-a":150,"node-b":140},
///  "first_success_ms":0.9,"last_success_ms":29900.8,"trailing_failures":0,
///  "longest_gap":{"start_ms":12001.2,"gap_ms":3012.0,"failures":29},
///  "switch_count":1,
///  "switches":[{"from":"node-a","to":"node-b","at_ms":15013.2,"gap_ms":3012.0,"failures":29}]}
/// ```
///
/// `latency`, `first_success_ms`, `last_success_ms` and `longest_gap` are `null` when there
/// were too few successful answers (none; fewer than two for `longest_gap`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The probed URL.
    pub target: String,
    /// `--interval` in ms.
    pub interval_ms: f64,
    /// `--timeout` in ms.
    pub timeout_ms: f64,
    /// Wall-clock time of the probe start, ms since the Unix epoch (UTC).
    pub started_unix_ms: u64,
    /// Run time from the first request to the end of the run, ms.
    pub elapsed_ms: f64,
    /// Requests whose outcome is known (`successes + failures`).
    pub requests: u64,
    /// 2xx answers.
    pub successes: u64,
    /// Failed requests, all kinds.
    pub failures: u64,
    /// Requests still in flight when the run was interrupted (not counted in `requests`).
    pub abandoned: u64,
    /// Failures per [`FailureKind::label`].
    pub failures_by_kind: BTreeMap<String, u64>,
    /// Latency of successful answers; `null` without any.
    pub latency: Option<LatencySummary>,
    /// Successful answers per backend (first body line).
    pub backends: BTreeMap<String, u64>,
    /// Arrival of the first successful answer, ms since start.
    pub first_success_ms: Option<f64>,
    /// Arrival of the last successful answer (in start order), ms since start.
    pub last_success_ms: Option<f64>,
    /// Failures after the last successful answer (a gap still open at the end; all failures
    /// when there was no success).
    pub trailing_failures: u64,
    /// The longest gap between two successive successful answers; `null` with fewer than two.
    pub longest_gap: Option<Gap>,
    /// Number of backend switches (may exceed `switches.len()`, see [`MAX_SWITCHES_KEPT`]).
    pub switch_count: u64,
    /// The switches in start order.
    pub switches: Vec<Switch>,
}

/// Metadata of a run, carried into the [`Summary`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeMeta {
    /// The probed URL.
    pub target: String,
    /// `--interval`.
    pub interval: Duration,
    /// `--timeout`.
    pub timeout: Duration,
    /// Wall-clock time of the probe start; offsets are added to it for display.
    pub started_at: SystemTime,
}

/// The analysis state that is updated in start order.
#[derive(Debug, Clone, Default)]
struct Core {
    next_seq: u64,
    successes: u64,
    failures: u64,
    failures_by_kind: BTreeMap<String, u64>,
    backends: BTreeMap<String, u64>,
    latency_min: Option<Duration>,
    latency_max: Duration,
    latency_sum: Duration,
    first_success: Option<Duration>,
    /// Arrival time and backend of the last success in start order.
    last_success: Option<(Duration, String)>,
    failures_since_success: u64,
    longest_gap: Option<(Duration, Duration, u64)>,
    switch_count: u64,
    switches: Vec<Switch>,
}

impl Core {
    fn apply(&mut self, o: Outcome) {
        self.next_seq = o.seq + 1;
        match o.result {
            Err(kind) => {
                self.failures += 1;
                self.failures_since_success += 1;
                *self.failures_by_kind.entry(kind.label()).or_default() += 1;
            }
            Ok(backend) => {
                let at = o.sent_at + o.latency;
                self.successes += 1;
                *self.backends.entry(backend.clone()).or_default() += 1;
                self.latency_min = Some(self.latency_min.map_or(o.latency, |m| m.min(o.latency)));
                self.latency_max = self.latency_max.max(o.latency);
                self.latency_sum += o.latency;
                if self.first_success.is_none() {
                    self.first_success = Some(at);
                }
                if let Some((prev_at, prev_backend)) = &self.last_success {
                    // Arrival times of successive answers in start order can go backwards
                    // (an earlier request answered slowly): such a gap counts as zero.
                    let gap = at.saturating_sub(*prev_at);
                    let longer = self.longest_gap.is_none_or(|(_, g, _)| gap > g);
                    if longer {
                        self.longest_gap = Some((*prev_at, gap, self.failures_since_success));
                    }
                    if *prev_backend != backend {
                        self.switch_count += 1;
                        if self.switches.len() < MAX_SWITCHES_KEPT {
                            self.switches.push(Switch {
                                from: prev_backend.clone(),
                                to: backend.clone(),
                                at_ms: ms(at),
                                gap_ms: ms(gap),
                                failures: self.failures_since_success,
                            });
                        }
                    }
                }
                self.failures_since_success = 0;
                self.last_success = Some((at, backend));
            }
        }
    }
}

/// Statistics of a probe run: a pure type, no clock, no I/O.
///
/// Feed it with [`ProbeStats::record`] in any order; it analyses outcomes in **start order**
/// ([`Outcome::seq`]), buffering those that complete before an earlier-started request (at
/// most the requests in flight). The [`summary`](ProbeStats::summary) treats requests never
/// recorded (abandoned at shutdown) as absent.
///
/// Definitions (all in start order, times are arrivals `sent_at + latency`):
/// - the **gap** between two successive successful answers is the arrival of the later minus
///   the arrival of the earlier, floored at zero; failures in between do not end a gap;
/// - a **switch** is a pair of successive successful answers with different backends; its gap
///   is that of the pair (the last answer of the old backend to the first of the new one).
#[derive(Debug, Clone)]
pub struct ProbeStats {
    meta: ProbeMeta,
    core: Core,
    pending: BTreeMap<u64, Outcome>,
    elapsed: Duration,
    abandoned: u64,
}

impl ProbeStats {
    /// Empty statistics for a run described by `meta`.
    pub fn new(meta: ProbeMeta) -> Self {
        Self {
            meta,
            core: Core::default(),
            pending: BTreeMap::new(),
            elapsed: Duration::ZERO,
            abandoned: 0,
        }
    }

    /// The run's metadata.
    pub fn meta(&self) -> &ProbeMeta {
        &self.meta
    }

    /// Records one outcome. Outcomes may arrive in completion order; they are applied in
    /// `seq` order. An outcome whose `seq` was already applied or is already buffered is
    /// ignored (a duplicate).
    pub fn record(&mut self, outcome: Outcome) {
        if outcome.seq < self.core.next_seq || self.pending.contains_key(&outcome.seq) {
            return;
        }
        self.pending.insert(outcome.seq, outcome);
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() != self.core.next_seq {
                break;
            }
            let o = entry.remove();
            self.core.apply(o);
        }
    }

    /// Sets the run time (from the first request to the end of the run) reported as
    /// [`Summary::elapsed_ms`].
    pub(crate) fn set_elapsed(&mut self, elapsed: Duration) {
        self.elapsed = elapsed;
    }

    /// Sets the number of requests abandoned in flight at shutdown ([`Summary::abandoned`]).
    pub(crate) fn set_abandoned(&mut self, abandoned: u64) {
        self.abandoned = abandoned;
    }

    /// The summary so far. Buffered outcomes behind a missing (never recorded) request are
    /// included in `seq` order, as if the missing request did not exist.
    pub fn summary(&self) -> Summary {
        let mut core = self.core.clone();
        for o in self.pending.values() {
            core.apply(o.clone());
        }
        let latency = core.latency_min.map(|min| LatencySummary {
            min_ms: ms(min),
            avg_ms: ms(core.latency_sum) / core.successes.max(1) as f64,
            max_ms: ms(core.latency_max),
        });
        Summary {
            target: self.meta.target.clone(),
            interval_ms: ms(self.meta.interval),
            timeout_ms: ms(self.meta.timeout),
            started_unix_ms: self
                .meta
                .started_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            elapsed_ms: ms(self.elapsed),
            requests: core.successes + core.failures,
            successes: core.successes,
            failures: core.failures,
            abandoned: self.abandoned,
            failures_by_kind: core.failures_by_kind,
            latency,
            backends: core.backends,
            first_success_ms: core.first_success.map(ms),
            last_success_ms: core.last_success.as_ref().map(|(at, _)| ms(*at)),
            trailing_failures: core.failures_since_success,
            longest_gap: core.longest_gap.map(|(start, gap, failures)| Gap {
                start_ms: ms(start),
                gap_ms: ms(gap),
                failures,
            }),
            switch_count: core.switch_count,
            switches: core.switches,
        }
    }

    /// Local wall-clock time (`HH:MM:SS.mmm`) of an offset from the probe start.
    pub fn clock(&self, offset: Duration) -> String {
        wall_clock(self.meta.started_at, offset)
    }
}

/// Duration in ms, rounded to the microsecond.
pub(super) fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}
