//! `vipd probe`: the wget failover loop, done right.
//!
//! `vipd probe http://VIP[:port]/path --interval 100ms --timeout 1s [--count N | --duration 30s]`
//! requests the target on a fixed schedule until `--count` requests were issued, `--duration`
//! elapsed or the caller's shutdown future fires (SIGINT/SIGTERM), prints one line per answer
//! and, on exit, a summary: requests, successes, failures by kind, the longest gap between two
//! successful answers and every switch of the answering backend.
//!
//! How it differs from `while true; do wget -qO- http://VIP/; sleep 0.1; done`:
//!
//! - **Fixed schedule.** Request *n* starts at `n * interval` after the start (a
//!   [`tokio::time::Interval`] with [`MissedTickBehavior::Skip`]); a slow or hanging request
//!   never delays the next one. Requests in flight at the next tick keep running, each with
//!   its own timeout.
//! - **A new TCP connection per request** and `Connection: close`: no keep-alive, so a
//!   failover is observed instead of hidden by a pooled connection to the old holder.
//! - **Bound time.** Name resolution, connect, request and reading the response body together
//!   are bound by `--timeout`.
//! - HTTP/1.1 by hyper 1 (`hyper::client::conn::http1`) over a tokio `TcpStream`.
//!
//! The statistics are a pure type, [`ProbeStats`], fed with [`Outcome`]s in any order and
//! analysed in *start order* (by [`Outcome::seq`]); it is unit-tested with synthetic sequences.
//!
//! # Output
//!
//! Per answer (unless `--quiet`), stamped with the local wall-clock time the answer arrived
//! (`HH:MM:SS.mmm`), then the first line of the body (the backend's node name) and the latency:
//!
//! ```text
//! 12:00:01.250 node-a 3.1ms
//! 12:00:01.350 FAIL timeout 1000ms
//! ```
//!
//! These lines go to stdout, or to stderr with `--json` so that stdout then carries only the
//! JSON summary (one line), which is what `cargo xtask bench` parses. The summary is
//! [`summary_text`] or, with `--json`, [`summary_json`]; its shape is [`Summary`].

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

/// Largest number of body bytes read per answer while looking for the first line (64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Largest number of switches kept individually in [`ProbeStats`]; further switches are only
/// counted ([`Summary::switch_count`]). Flapping between two holders (a split brain) at 10
/// requests per second for an hour stays far below this.
pub const MAX_SWITCHES_KEPT: usize = 10_000;

/// Errors of `vipd probe`.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A command-line value is invalid; names the flag (e.g. `--interval`) and the value.
    #[error("invalid value {value:?} for {flag}: {reason}")]
    InvalidArg {
        /// The flag or argument name, e.g. `--interval` or `TARGET`.
        flag: &'static str,
        /// The value as given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// Writing the output (stdout/stderr) failed.
    #[error("writing probe output: {0}")]
    Output(#[from] std::io::Error),
    /// Serialising the JSON summary failed.
    #[error("serialising probe summary: {0}")]
    Json(#[from] serde_json::Error),
}

/// A duration string that [`parse_duration`] refused; the message names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {reason} (expected e.g. \"100ms\", \"1s\", \"1.5s\", \"2m\")")]
pub struct DurationError {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a duration such as `"100ms"`, `"1s"`, `"1.5s"`, `"2m"`.
///
/// Grammar: a non-negative decimal number (digits, optionally `.` and more digits) followed
/// by exactly one unit: `us`, `ms`, `s`, `m` (minutes) or `h`, like Go's
/// `time.ParseDuration` for a single term. Surrounding whitespace is ignored. The value is
/// computed exactly (no floating point); sub-nanosecond digits are truncated.
///
/// # Errors
///
/// [`DurationError`] naming the value when the number or unit is missing or malformed, or the
/// result overflows [`Duration`].
pub fn parse_duration(value: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        value: value.to_owned(),
        reason,
    };
    let s = value.trim();
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(num_end);
    if number.is_empty() {
        return Err(err("missing number"));
    }
    let unit_ns: u128 = match unit {
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" => return Err(err("missing unit")),
        _ => return Err(err("unknown unit")),
    };
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if frac_part.contains('.') {
        return Err(err("more than one decimal point"));
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("missing number"));
    }
    let mut nanos: u128 = 0;
    for d in int_part.bytes() {
        nanos = nanos
            .checked_mul(10)
            .and_then(|n| n.checked_add(u128::from(d - b'0')))
            .ok_or_else(|| err("too large"))?;
    }
    nanos = nanos.checked_mul(unit_ns).ok_or_else(|| err("too large"))?;
    // Fractional digits: value = digit * unit / 10^position, truncated at 1 ns.
    let mut scale = unit_ns;
    for d in frac_part.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        nanos += u128::from(d - b'0') * scale;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| err("too large"))?;
    // The remainder is < 10^9 and always fits a u32.
    let sub = u32::try_from(nanos % 1_000_000_000).map_err(|_| err("too large"))?;
    Ok(Duration::new(secs, sub))
}

/// Command-line arguments of `vipd probe` (clap derive; the lead wires it into `main.rs`).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Args {
    /// Target URL, `http://HOST[:PORT][/PATH]` (HOST: IPv4, `[IPv6]` or a name resolved per
    /// request). Without a scheme, `http://` is assumed. HTTPS is not supported.
    #[arg(value_name = "URL")]
    pub target: String,
    /// Time between request starts (fixed schedule), e.g. 100ms, 1s, 1.5s, 2m.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Duration,
    /// Bound on resolve + connect + request + response body, per request.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
    /// Stop after issuing this many requests (then wait for those in flight).
    #[arg(long, conflicts_with = "duration")]
    pub count: Option<u64>,
    /// Stop issuing requests after this long (then wait for those in flight).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,
    /// Do not print a line per answer; only the summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as one line of JSON on stdout (per-answer lines go to stderr).
    #[arg(long)]
    pub json: bool,
}

/// The parsed target of a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as normalised (`http://host[:port]/path`).
    pub url: String,
    /// Host as in the URL, without IPv6 brackets.
    pub host: String,
    /// TCP port (default 80).
    pub port: u16,
    /// Value of the `Host` header (the URL's authority).
    pub authority: String,
    /// Request target in origin form, `/path?query` (default `/`).
    pub path_and_query: String,
}

impl Target {
    /// Parses `http://HOST[:PORT][/PATH]`; a missing scheme means `http://`.
    ///
    /// # Errors
    ///
    /// [`ProbeError::InvalidArg`] for `TARGET` when the URL does not parse, the scheme is not
    /// `http`, or the host is missing.
    pub fn parse(value: &str) -> Result<Self, ProbeError> {
        let invalid = |reason: String| ProbeError::InvalidArg {
            flag: "TARGET",
            value: value.to_owned(),
            reason,
        };
        let with_scheme = if value.contains("://") {
            value.to_owned()
        } else {
            format!("http://{value}")
        };
        let uri: http::Uri = with_scheme
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => return Err(invalid(format!("scheme {other:?} unsupported, use http"))),
            None => return Err(invalid("missing scheme".to_owned())),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| invalid("missing host".to_owned()))?;
        if authority.as_str().contains('@') {
            return Err(invalid("user info in the URL is not supported".to_owned()));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if host.is_empty() {
            return Err(invalid("missing host".to_owned()));
        }
        // `Authority::port()` is `None` for an out-of-range port such as 99999: read the text
        // after the host instead, so that such a port is an error, not silently port 80.
        let port_text = authority
            .as_str()
            .strip_prefix(authority.host())
            .and_then(|rest| rest.strip_prefix(':'))
            .unwrap_or("");
        let port = if port_text.is_empty() {
            80
        } else {
            match port_text.parse::<u16>() {
                Ok(0) | Err(_) => return Err(invalid(format!("invalid port {port_text:?}"))),
                Ok(n) => n,
            }
        };
        let path_and_query = uri
            .path_and_query()
            .map(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .unwrap_or("/")
            .to_owned();
        Ok(Self {
            url: format!("http://{}{}", authority.as_str(), path_and_query),
            host,
            port,
            authority: authority.as_str().to_owned(),
            path_and_query,
        })
    }
}

/// When a probe run stops issuing requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Only the shutdown future stops it.
    Forever,
    /// After issuing this many requests.
    Count(u64),
    /// After this long since the first request.
    Duration(Duration),
}

/// Validated probe settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    /// What to request.
    pub target: Target,
    /// Time between request starts (> 0).
    pub interval: Duration,
    /// Per-request bound on resolve + connect + response (> 0).
    pub timeout: Duration,
    /// When to stop issuing requests.
    pub limit: Limit,
}

impl ProbeConfig {
    /// Validates [`Args`].
    ///
    /// # Errors
    ///
    /// [`ProbeError::InvalidArg`] naming the flag and value: a bad `TARGET`, `--interval` below
    /// 1 ms, a zero `--timeout`, `--count 0`, a zero `--duration`, or both `--count` and
    /// `--duration`.
    pub fn from_args(args: &Args) -> Result<Self, ProbeError> {
        let target = Target::parse(&args.target)?;
        if args.interval < Duration::from_millis(1) {
            return Err(ProbeError::InvalidArg {
                flag: "--interval",
                value: format!("{:?}", args.interval),
                reason: "must be at least 1ms".to_owned(),
            });
        }
        if args.timeout.is_zero() {
            return Err(ProbeError::InvalidArg {
                flag: "--timeout",
                value: format!("{:?}", args.timeout),
                reason: "must be greater than zero".to_owned(),
            });
        }
        let limit = match (args.count, args.duration) {
            (Some(_), Some(d)) => {
                return Err(ProbeError::InvalidArg {
                    flag: "--duration",
                    value: format!("{d:?}"),
                    reason: "cannot be combined with --count".to_owned(),
                });
            }
            (Some(0), None) => {
                return Err(ProbeError::InvalidArg {
                    flag: "--count",
                    value: "0".to_owned(),
                    reason: "must be at least 1".to_owned(),
                });
            }
            (Some(n), None) => Limit::Count(n),
            (None, Some(d)) if d.is_zero() => {
                return Err(ProbeError::InvalidArg {
                    flag: "--duration",
                    value: format!("{d:?}"),
                    reason: "must be greater than zero".to_owned(),
                });
            }
            (None, Some(d)) => Limit::Duration(d),
            (None, None) => Limit::Forever,
        };
        Ok(Self {
            target,
            interval: args.interval,
            timeout: args.timeout,
            limit,
        })
    }
}

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
    pub fn answered_at(&self) -> Duration {
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
    pub fn set_elapsed(&mut self, elapsed: Duration) {
        self.elapsed = elapsed;
    }

    /// Sets the number of requests abandoned in flight at shutdown ([`Summary::abandoned`]).
    pub fn set_abandoned(&mut self, abandoned: u64) {
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
fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// Duration in ms given as f64 ms -> back to a [`Duration`] (for display only).
fn from_ms(v: f64) -> Duration {
    Duration::try_from_secs_f64(v / 1000.0).unwrap_or_default()
}

/// `HH:MM:SS.mmm` of `start + offset` in the local time zone (libc `localtime_r`, which
/// honours `TZ` like `date`); UTC if the conversion fails.
fn wall_clock(start: SystemTime, offset: Duration) -> String {
    let since_epoch = start
        .checked_add(offset)
        .unwrap_or(start)
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since_epoch.as_secs();
    let millis = since_epoch.subsec_millis();
    let (h, m, s) = local_hms(secs).unwrap_or(((secs / 3600) % 24, (secs / 60) % 60, secs % 60));
    format!("{h:02}:{m:02}:{s:02}.{millis:03}")
}

/// Local hour, minute, second of a Unix time, or `None` if libc cannot convert it.
fn local_hms(unix_secs: u64) -> Option<(u64, u64, u64)> {
    let t = libc::time_t::try_from(unix_secs).ok()?;
    // SAFETY: `tm` is plain old data for which all-zero bytes are a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the duration of the call; localtime_r is the
    // re-entrant variant that writes only into `tm`.
    let res = unsafe { libc::localtime_r(&t, &mut tm) };
    if res.is_null() {
        return None;
    }
    let field = |v: libc::c_int| u64::try_from(v).ok();
    Some((field(tm.tm_hour)?, field(tm.tm_min)?, field(tm.tm_sec)?))
}

/// One per-answer line (without newline): `12:00:01.250 node-a 3.1ms` or
/// `12:00:01.350 FAIL timeout 1000ms`, stamped with the local time the answer arrived.
pub fn outcome_line(stats: &ProbeStats, o: &Outcome) -> String {
    let clock = stats.clock(o.answered_at());
    match &o.result {
        Ok(backend) => format!("{clock} {backend} {:.1}ms", ms(o.latency)),
        Err(kind) => format!("{clock} FAIL {kind} {}ms", o.latency.as_millis()),
    }
}

/// The human summary printed at the end of `vipd probe` (several lines, ends with `\n`).
/// Times of day are local wall-clock `HH:MM:SS.mmm`, durations ms.
pub fn summary_text(stats: &ProbeStats) -> String {
    use std::fmt::Write as _;
    let s = stats.summary();
    let mut out = String::new();
    let _ = writeln!(out, "--- {} probe summary ---", s.target);
    let kinds = if s.failures_by_kind.is_empty() {
        String::new()
    } else {
        let parts: Vec<String> = s
            .failures_by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        format!(" ({})", parts.join(", "))
    };
    let _ = writeln!(
        out,
        "{} requests, {} successes, {} failures{kinds}, {} abandoned in flight, {:.1} s",
        s.requests,
        s.successes,
        s.failures,
        s.abandoned,
        s.elapsed_ms / 1000.0
    );
    if let Some(l) = &s.latency {
        let _ = writeln!(
            out,
            "latency min/avg/max {:.1}/{:.1}/{:.1} ms",
            l.min_ms, l.avg_ms, l.max_ms
        );
    } else {
        let _ = writeln!(out, "no successful answer");
    }
    if let Some(g) = &s.longest_gap {
        let _ = writeln!(
            out,
            "longest gap {:.1} ms from {} ({} failures in between)",
            g.gap_ms,
            stats.clock(from_ms(g.start_ms)),
            g.failures
        );
    }
    if let (Some(last), true) = (s.last_success_ms, s.trailing_failures > 0) {
        let _ = writeln!(
            out,
            "no answer since {} ({} failures at the end)",
            stats.clock(from_ms(last)),
            s.trailing_failures
        );
    }
    let _ = writeln!(out, "{} backend switches", s.switch_count);
    for sw in &s.switches {
        let _ = writeln!(
            out,
            "  {} {} -> {} gap {:.1} ms ({} failures)",
            stats.clock(from_ms(sw.at_ms)),
            sw.from,
            sw.to,
            sw.gap_ms,
            sw.failures
        );
    }
    if !s.backends.is_empty() {
        let parts: Vec<String> = s.backends.iter().map(|(b, n)| format!("{b} {n}")).collect();
        let _ = writeln!(out, "answers per backend: {}", parts.join(", "));
    }
    out
}

/// The JSON summary (one line, no trailing newline); shape documented on [`Summary`].
///
/// # Errors
///
/// [`ProbeError::Json`] if serialisation fails (not expected for this plain data).
pub fn summary_json(stats: &ProbeStats) -> Result<String, ProbeError> {
    Ok(serde_json::to_string(&stats.summary())?)
}

/// Runs the probe loop: issues requests on the fixed schedule until the [`Limit`] or
/// `shutdown` resolves, calls `on_outcome` for each outcome as it completes (completion
/// order) and returns the statistics.
///
/// With [`Limit::Count`] / [`Limit::Duration`] the requests in flight at the end are awaited
/// (each is bound by its timeout). When `shutdown` resolves, requests in flight are aborted
/// and counted as abandoned. Never fails: request errors are outcomes.
pub async fn probe<S, F>(config: &ProbeConfig, shutdown: S, mut on_outcome: F) -> ProbeStats
where
    S: Future<Output = ()>,
    F: FnMut(&ProbeStats, &Outcome),
{
    let start = Instant::now();
    let mut stats = ProbeStats::new(ProbeMeta {
        target: config.target.url.clone(),
        interval: config.interval,
        timeout: config.timeout,
        started_at: SystemTime::now(),
    });
    let mut ticker = tokio::time::interval_at(start, config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let stop_at = match config.limit {
        Limit::Duration(d) => Some(start + d),
        _ => None,
    };
    let stop_sleep = tokio::time::sleep_until(stop_at.unwrap_or(start));
    tokio::pin!(stop_sleep, shutdown);

    let mut inflight: JoinSet<Outcome> = JoinSet::new();
    let mut seq: u64 = 0;
    let mut issuing = true;
    let mut interrupted = false;
    loop {
        if !issuing && inflight.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            () = &mut shutdown => {
                interrupted = true;
                break;
            }
            () = &mut stop_sleep, if issuing && stop_at.is_some() => {
                issuing = false;
            }
            Some(joined) = inflight.join_next(), if !inflight.is_empty() => {
                // A JoinError means the request task panicked or was aborted: no outcome.
                if let Ok(outcome) = joined {
                    stats.record(outcome.clone());
                    on_outcome(&stats, &outcome);
                }
            }
            _ = ticker.tick(), if issuing => {
                let sent = Instant::now();
                let target = config.target.clone();
                let timeout = config.timeout;
                let this_seq = seq;
                inflight.spawn(async move {
                    let result = request(&target, timeout).await;
                    Outcome {
                        seq: this_seq,
                        sent_at: sent - start,
                        latency: sent.elapsed(),
                        result,
                    }
                });
                seq += 1;
                if matches!(config.limit, Limit::Count(n) if seq >= n) {
                    issuing = false;
                }
            }
        }
    }
    if interrupted {
        stats.set_abandoned(inflight.len() as u64);
        inflight.abort_all();
    }
    stats.set_elapsed(start.elapsed());
    stats
}

/// `vipd probe`: validates `args`, probes, prints per-answer lines and the summary on
/// stdout/stderr (see the module docs) and returns the statistics (the caller may derive an
/// exit status, e.g. failure when `successes == 0`).
///
/// `shutdown` is the caller's SIGINT/SIGTERM future; when it resolves the probe stops at
/// once and prints the summary.
///
/// # Errors
///
/// [`ProbeError::InvalidArg`] for invalid arguments, [`ProbeError::Output`] when the summary
/// cannot be written.
pub async fn run<S>(args: Args, shutdown: S) -> Result<ProbeStats, ProbeError>
where
    S: Future<Output = ()>,
{
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    run_with_output(args, shutdown, &mut out, &mut err).await
}

/// [`run`] with explicit writers: `out` is stdout, `err` stderr. Per-answer lines go to `out`,
/// or to `err` with `--json`; write errors of per-answer lines are ignored (a closed pipe
/// must not stop the probe), the summary's are returned.
///
/// # Errors
///
/// As [`run`].
pub async fn run_with_output<S, O, E>(
    args: Args,
    shutdown: S,
    out: &mut O,
    err: &mut E,
) -> Result<ProbeStats, ProbeError>
where
    S: Future<Output = ()>,
    O: Write,
    E: Write,
{
    let config = ProbeConfig::from_args(&args)?;
    let stats = probe(&config, shutdown, |stats, outcome| {
        if args.quiet {
            return;
        }
        let line = outcome_line(stats, outcome);
        let w: &mut dyn Write = if args.json { &mut *err } else { &mut *out };
        let _ = writeln!(w, "{line}");
        let _ = w.flush();
    })
    .await;
    if args.json {
        writeln!(out, "{}", summary_json(&stats)?)?;
    } else {
        write!(out, "{}", summary_text(&stats))?;
    }
    out.flush()?;
    Ok(stats)
}

/// One request on a new connection, bound by `timeout` as a whole.
async fn request(target: &Target, timeout: Duration) -> Result<String, FailureKind> {
    match tokio::time::timeout(timeout, request_unbounded(target)).await {
        Ok(result) => result,
        Err(_) => Err(FailureKind::Timeout),
    }
}

async fn request_unbounded(target: &Target) -> Result<String, FailureKind> {
    let addr = match target.host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, target.port),
        Err(_) => tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .map_err(|e| FailureKind::Other(format!("resolve {}: {e}", target.host)))?
            .next()
            .ok_or_else(|| FailureKind::Other(format!("resolve {}: no address", target.host)))?,
    };
    let stream = TcpStream::connect(addr).await.map_err(|e| io_failure(&e))?;
    // Small requests: do not let Nagle delay them. Failure to set it is harmless.
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| hyper_failure(&e))?;
    let req = http::Request::get(target.path_and_query.as_str())
        .header(http::header::HOST, target.authority.as_str())
        .header(http::header::CONNECTION, "close")
        .header(http::header::USER_AGENT, "vipd-probe")
        .body(Empty::<Bytes>::new())
        .map_err(|e| FailureKind::Other(format!("building request: {e}")))?;
    let exchange = async move {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| hyper_failure(&e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(FailureKind::Status(status.as_u16()));
        }
        first_line(resp.into_body()).await
    };
    // Drive the connection and the exchange together on this task, so that a timeout drops
    // both and no connection task outlives the request. Once the exchange has its answer the
    // connection is dropped (closed) without waiting for the rest of the body.
    tokio::pin!(exchange);
    tokio::select! {
        result = &mut exchange => result,
        // The connection ended first (closed after the response, or failed): the exchange
        // now completes from what was received, or with the connection's error.
        _ = conn => exchange.await,
    }
}

/// Reads the body until its first line is complete (or EOF, or [`MAX_BODY_BYTES`]) and
/// returns that line without trailing whitespace; invalid UTF-8 is replaced.
async fn first_line(mut body: hyper::body::Incoming) -> Result<String, FailureKind> {
    let mut buf: Vec<u8> = Vec::new();
    while !buf.contains(&b'\n') && buf.len() < MAX_BODY_BYTES {
        match body.frame().await {
            None => break,
            Some(Err(e)) => return Err(hyper_failure(&e)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
    let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
    Ok(String::from_utf8_lossy(line).trim_end().to_owned())
}

fn io_failure(e: &std::io::Error) -> FailureKind {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => FailureKind::Refused,
        K::HostUnreachable | K::NetworkUnreachable => FailureKind::Unreachable,
        K::TimedOut => FailureKind::Timeout,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
            FailureKind::Reset
        }
        _ => FailureKind::Other(e.to_string()),
    }
}

fn hyper_failure(e: &hyper::Error) -> FailureKind {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io_failure(io);
        }
        source = s.source();
    }
    if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        FailureKind::Reset
    } else if e.is_parse() || e.is_parse_status() {
        FailureKind::Protocol(e.to_string())
    } else if e.is_timeout() {
        FailureKind::Timeout
    } else {
        FailureKind::Other(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpSocket};
    use tokio::sync::{oneshot, watch};

    // ---------- pure statistics ----------

    fn meta() -> ProbeMeta {
        ProbeMeta {
            target: "http://192.0.2.10/".to_owned(),
            interval: Duration::from_millis(100),
            timeout: Duration::from_millis(1000),
            started_at: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        }
    }

    /// Request `seq` started at `seq * 100 ms`, took `lat_ms`.
    fn out(seq: u64, lat_ms: u64, result: Result<&str, FailureKind>) -> Outcome {
        Outcome {
            seq,
            sent_at: Duration::from_millis(seq * 100),
            latency: Duration::from_millis(lat_ms),
            result: result.map(str::to_owned),
        }
    }

    fn stats_of(outcomes: impl IntoIterator<Item = Outcome>) -> ProbeStats {
        let mut s = ProbeStats::new(meta());
        for o in outcomes {
            s.record(o);
        }
        s
    }

    /// a a FAIL(refused) FAIL(timeout) b b, arrivals 1, 101, -, -, 402, 501 ms.
    fn switch_sequence() -> Vec<Outcome> {
        vec![
            out(0, 1, Ok("node-a")),
            out(1, 1, Ok("node-a")),
            out(2, 3, Err(FailureKind::Refused)),
            out(3, 1000, Err(FailureKind::Timeout)),
            out(4, 2, Ok("node-b")),
            out(5, 1, Ok("node-b")),
        ]
    }

    #[test]
    fn gap_spans_failures_between_successes() {
        let s = stats_of([
            out(0, 1, Ok("node-a")),
            out(1, 1000, Err(FailureKind::Timeout)),
            out(2, 5, Err(FailureKind::Refused)),
            out(3, 1, Ok("node-a")),
        ])
        .summary();
        assert_eq!(
            s.longest_gap,
            Some(Gap {
                start_ms: 1.0,
                gap_ms: 300.0,
                failures: 2
            })
        );
        assert_eq!((s.requests, s.successes, s.failures), (4, 2, 2));
        assert_eq!(s.switch_count, 0);
        assert!(s.switches.is_empty());
        assert_eq!(s.trailing_failures, 0);
        assert_eq!(
            s.failures_by_kind,
            BTreeMap::from([("refused".to_owned(), 1), ("timeout".to_owned(), 1)])
        );
    }

    #[test]
    fn switch_with_failures_in_between() {
        let s = stats_of(switch_sequence()).summary();
        assert_eq!(s.switch_count, 1);
        assert_eq!(
            s.switches,
            vec![Switch {
                from: "node-a".to_owned(),
                to: "node-b".to_owned(),
                at_ms: 402.0,
                gap_ms: 301.0,
                failures: 2,
            }]
        );
        assert_eq!(
            s.longest_gap,
            Some(Gap {
                start_ms: 101.0,
                gap_ms: 301.0,
                failures: 2
            })
        );
        assert_eq!(
            s.backends,
            BTreeMap::from([("node-a".to_owned(), 2), ("node-b".to_owned(), 2)])
        );
        let lat = s.latency.as_ref().map(|l| (l.min_ms, l.avg_ms, l.max_ms));
        assert_eq!(lat, Some((1.0, 1.25, 2.0)));
        assert_eq!(s.first_success_ms, Some(1.0));
        assert_eq!(s.last_success_ms, Some(501.0));
    }

    #[test]
    fn out_of_order_completions_are_analysed_in_start_order() {
        let in_order = stats_of(switch_sequence()).summary();
        // Completion order: the timeout (seq 3) completes last, seq 0 after seq 1.
        let seq = switch_sequence();
        let shuffled = [5, 1, 0, 4, 2, 3].map(|i| seq[i].clone());
        let s = stats_of(shuffled);
        assert_eq!(s.summary(), in_order);
        // Reversed order too, with a duplicate that must be ignored.
        let mut reversed: Vec<Outcome> = switch_sequence().into_iter().rev().collect();
        reversed.push(out(4, 2, Ok("node-b")));
        assert_eq!(stats_of(reversed).summary(), in_order);
    }

    #[test]
    fn missing_request_does_not_block_the_summary() {
        // seq 1 was abandoned at shutdown: never recorded.
        let s = stats_of([
            out(0, 1, Ok("node-a")),
            out(2, 1, Ok("node-b")),
            out(3, 1, Err(FailureKind::Reset)),
        ])
        .summary();
        assert_eq!((s.requests, s.successes, s.failures), (3, 2, 1));
        assert_eq!(s.switch_count, 1);
        assert_eq!(s.trailing_failures, 1);
    }

    #[test]
    fn no_success_at_all() {
        let s = stats_of([
            out(0, 3, Err(FailureKind::Refused)),
            out(1, 1000, Err(FailureKind::Timeout)),
            out(2, 1, Err(FailureKind::Status(503))),
        ])
        .summary();
        assert_eq!((s.requests, s.successes, s.failures), (3, 0, 3));
        assert_eq!(s.latency, None);
        assert_eq!(s.longest_gap, None);
        assert_eq!(s.first_success_ms, None);
        assert_eq!(s.last_success_ms, None);
        assert_eq!(s.trailing_failures, 3);
        assert!(s.failures_by_kind.contains_key("http_503"));
        assert!(s.backends.is_empty());
    }

    #[test]
    fn single_success_has_no_gap() {
        let s = stats_of([
            out(0, 1000, Err(FailureKind::Timeout)),
            out(1, 4, Ok("node-a")),
        ])
        .summary();
        assert_eq!(s.longest_gap, None);
        assert_eq!(s.switch_count, 0);
        assert_eq!(s.first_success_ms, Some(104.0));
        assert_eq!(s.last_success_ms, Some(104.0));
        assert_eq!(s.trailing_failures, 0);
    }

    #[test]
    fn slow_earlier_answer_gives_zero_not_negative_gap() {
        // seq 0 answered at 900 ms, seq 1 at 101 ms: the second pair's gap is 0.
        let s = stats_of([
            out(0, 900, Ok("node-a")),
            out(1, 1, Ok("node-a")),
            out(2, 1, Ok("node-a")),
        ])
        .summary();
        assert_eq!(
            s.longest_gap,
            Some(Gap {
                start_ms: 101.0,
                gap_ms: 100.0,
                failures: 0
            })
        );
    }

    #[test]
    fn flapping_backends_count_every_switch() {
        let s = stats_of([
            out(0, 1, Ok("node-a")),
            out(1, 1, Ok("node-b")),
            out(2, 1, Ok("node-a")),
        ])
        .summary();
        assert_eq!(s.switch_count, 2);
        let pairs: Vec<(&str, &str)> = s
            .switches
            .iter()
            .map(|w| (w.from.as_str(), w.to.as_str()))
            .collect();
        assert_eq!(pairs, [("node-a", "node-b"), ("node-b", "node-a")]);
    }

    #[test]
    fn summary_text_names_gap_switch_and_kinds() {
        let mut stats = stats_of(switch_sequence());
        stats.set_elapsed(Duration::from_millis(600));
        let text = summary_text(&stats);
        assert!(text.contains("6 requests, 4 successes, 2 failures (refused 1, timeout 1)"));
        assert!(text.contains("longest gap 301.0 ms from "));
        assert!(text.contains("(2 failures in between)"));
        assert!(text.contains("1 backend switches"));
        assert!(text.contains("node-a -> node-b gap 301.0 ms (2 failures)"));
        assert!(text.contains("answers per backend: node-a 2, node-b 2"));
        let none = summary_text(&stats_of([out(0, 3, Err(FailureKind::Refused))]));
        assert!(none.contains("no successful answer"));
    }

    #[test]
    fn json_summary_shape() {
        let mut stats = stats_of(switch_sequence());
        stats.set_elapsed(Duration::from_millis(600));
        stats.set_abandoned(1);
        let json = summary_json(&stats).expect("serialises");
        assert!(!json.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(v["target"], "http://192.0.2.10/");
        assert_eq!(v["interval_ms"], 100.0);
        assert_eq!(v["timeout_ms"], 1000.0);
        assert_eq!(v["started_unix_ms"], 1_700_000_000_000u64);
        assert_eq!(v["elapsed_ms"], 600.0);
        assert_eq!(v["requests"], 6);
        assert_eq!(v["abandoned"], 1);
        assert_eq!(v["failures_by_kind"]["timeout"], 1);
        assert_eq!(v["longest_gap"]["gap_ms"], 301.0);
        assert_eq!(v["switches"][0]["from"], "node-a");
        assert_eq!(v["switches"][0]["gap_ms"], 301.0);
        assert_eq!(v["latency"]["max_ms"], 2.0);
        let back: Summary = serde_json::from_str(&json).expect("parses back");
        assert_eq!(back, stats.summary());
        let empty = summary_json(&stats_of([])).expect("serialises");
        let v: serde_json::Value = serde_json::from_str(&empty).expect("valid JSON");
        assert!(v["longest_gap"].is_null() && v["latency"].is_null());
    }

    #[test]
    fn outcome_lines() {
        let stats = stats_of([]);
        let ok = outcome_line(&stats, &out(0, 3, Ok("node-a")));
        let fail = outcome_line(&stats, &out(1, 1000, Err(FailureKind::Timeout)));
        let is_clock = |s: &str| {
            s.len() == 12
                && s.chars()
                    .enumerate()
                    .all(|(i, c)| matches!((i, c), (2 | 5, ':') | (8, '.')) || c.is_ascii_digit())
        };
        let (clock, rest) = ok.split_at(12);
        assert!(is_clock(clock), "{ok}");
        assert_eq!(rest, " node-a 3.0ms");
        let (clock, rest) = fail.split_at(12);
        assert!(is_clock(clock), "{fail}");
        assert_eq!(rest, " FAIL timeout 1000ms");
    }

    // ---------- parsing ----------

    #[test]
    fn durations() {
        let ok = [
            ("100ms", Duration::from_millis(100)),
            ("1s", Duration::from_secs(1)),
            ("1.5s", Duration::from_millis(1500)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("250us", Duration::from_micros(250)),
            (".5s", Duration::from_millis(500)),
            ("0.1s", Duration::from_millis(100)),
            (" 20ms ", Duration::from_millis(20)),
        ];
        for (s, d) in ok {
            assert_eq!(parse_duration(s), Ok(d), "{s}");
        }
        for bad in [
            "",
            "100",
            "ms",
            "1x",
            "-1s",
            "1..5s",
            "1.5.s",
            "1 s",
            "99999999999999999999h",
        ] {
            let e = parse_duration(bad).expect_err(bad);
            assert_eq!(e.value, bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn cli(argv: &[&str]) -> Result<Args, clap::Error> {
        use clap::Parser as _;
        Cli::try_parse_from(std::iter::once("probe").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn cli_defaults_and_errors_name_flag_and_value() {
        let a = cli(&["http://192.0.2.10/"]).expect("parses");
        assert_eq!(a.interval, Duration::from_millis(100));
        assert_eq!(a.timeout, Duration::from_secs(1));
        assert_eq!(
            (a.count, a.duration, a.quiet, a.json),
            (None, None, false, false)
        );
        let e = cli(&["http://x/", "--interval", "1x"]).expect_err("bad interval");
        let msg = e.to_string();
        assert!(msg.contains("--interval") && msg.contains("1x"), "{msg}");
        let e = cli(&["http://x/", "--timeout", "5"]).expect_err("no unit");
        assert!(e.to_string().contains("--timeout"), "{e}");
        assert!(cli(&["http://x/", "--count", "3", "--duration", "1s"]).is_err());
    }

    #[test]
    fn config_validation_names_the_flag() {
        let base = cli(&["http://x/"]).expect("parses");
        let flag_of = |a: Args| match ProbeConfig::from_args(&a) {
            Err(ProbeError::InvalidArg { flag, .. }) => flag,
            other => panic!("expected InvalidArg, got {other:?}"),
        };
        assert_eq!(
            flag_of(Args {
                interval: Duration::ZERO,
                ..base.clone()
            }),
            "--interval"
        );
        assert_eq!(
            flag_of(Args {
                timeout: Duration::ZERO,
                ..base.clone()
            }),
            "--timeout"
        );
        assert_eq!(
            flag_of(Args {
                count: Some(0),
                ..base.clone()
            }),
            "--count"
        );
        assert_eq!(
            flag_of(Args {
                duration: Some(Duration::ZERO),
                ..base.clone()
            }),
            "--duration"
        );
        assert_eq!(
            flag_of(Args {
                target: "https://x/".to_owned(),
                ..base.clone()
            }),
            "TARGET"
        );
        let c = ProbeConfig::from_args(&Args {
            count: Some(7),
            ..base
        })
        .expect("valid");
        assert_eq!(c.limit, Limit::Count(7));
    }

    #[test]
    fn targets() {
        let t = Target::parse("http://192.0.2.10/").expect("v4");
        assert_eq!((t.host.as_str(), t.port), ("192.0.2.10", 80));
        assert_eq!(
            (t.authority.as_str(), t.path_and_query.as_str()),
            ("192.0.2.10", "/")
        );
        let t = Target::parse("http://[2001:db8::10]:8080/healthz?x=1").expect("v6");
        assert_eq!((t.host.as_str(), t.port), ("2001:db8::10", 8080));
        assert_eq!(t.authority, "[2001:db8::10]:8080");
        assert_eq!(t.path_and_query, "/healthz?x=1");
        let t = Target::parse("192.0.2.10:81").expect("no scheme");
        assert_eq!((t.port, t.url.as_str()), (81, "http://192.0.2.10:81/"));
        for bad in [
            "https://192.0.2.10/",
            "ftp://x/",
            "http://",
            "http://u@x/",
            "http://x:99999/",
            "http://x:0/",
        ] {
            match Target::parse(bad) {
                Err(ProbeError::InvalidArg { flag, value, .. }) => {
                    assert_eq!((flag, value.as_str()), ("TARGET", bad));
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

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

    #[tokio::test]
    async fn new_connection_per_request_and_count_limit() {
        let server = TestServer::start(Mode::Answer("node-a")).await;
        let cfg = server.config(10, 1000, Limit::Count(5));
        let mut seen = Vec::new();
        let stats = tokio::time::timeout(
            TEST_BOUND,
            probe(&cfg, std::future::pending(), |_, o| seen.push(o.clone())),
        )
        .await
        .expect("count limit ends the run");
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
        let mut seen = Vec::new();
        let stats = tokio::time::timeout(
            TEST_BOUND,
            probe(&cfg, std::future::pending(), |_, o| seen.push(o.clone())),
        )
        .await
        .expect("timeouts end every request");
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
        let stats =
            tokio::time::timeout(TEST_BOUND, probe(&cfg, std::future::pending(), |_, _| {}))
                .await
                .expect("ends");
        let s = stats.summary();
        assert_eq!((s.successes, s.failures), (0, 2));
        assert_eq!(
            s.failures_by_kind,
            BTreeMap::from([("http_503".to_owned(), 2)])
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
        let s = probe(&cfg, std::future::pending(), |_, _| {})
            .await
            .summary();
        assert_eq!(server.accepted(), 0);
        assert_eq!(
            s.failures_by_kind,
            BTreeMap::from([("refused".to_owned(), 1)])
        );
    }
}
