//! `vipd probe`: the wget failover loop, done right.
//!
//! `vipd probe http://VIP[:port]/path --interval 100ms --timeout 900ms [--count N | --duration 30s]`
//! requests the target on a fixed schedule until `--count` requests were issued, `--duration`
//! elapsed or the caller's shutdown future fires (SIGINT/SIGTERM), prints one line per answer
//! and, on exit, a summary: requests, successes, failures by kind, the longest gap between two
//! successful answers and every switch of the answering backend.
//!
//! How it differs from `while true; do wget -qO- http://VIP/; sleep 0.1; done`:
//!
//! - **Fixed schedule.** Request *n* starts at `n * interval` after the start (a
//!   [`tokio::time::Interval`] with
//!   [`MissedTickBehavior::Skip`](tokio::time::MissedTickBehavior::Skip)); a slow or hanging
//!   request never delays the next one. Requests in flight at the next tick keep running, each
//!   with its own timeout.
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
//! 12:00:01.350 FAIL timeout 900ms
//! ```
//!
//! These lines go to stdout, or to stderr with `--json` so that stdout then carries only the
//! JSON summary (one line), which is what `cargo xtask bench` parses. The summary is
//! [`summary_text`] or, with `--json`, [`summary_json`]; its shape is [`Summary`].

mod client;
mod clock;
mod config;
mod report;
mod runner;
mod stats;

pub use client::MAX_BODY_BYTES;
pub use config::{Args, DurationError, Limit, ProbeConfig, Target, parse_duration};
pub use report::{outcome_line, summary_json, summary_text};
pub use runner::{probe, run, run_with_output};
pub use stats::{
    FailureKind, Gap, LatencySummary, MAX_SWITCHES_KEPT, Outcome, ProbeMeta, ProbeStats, Summary,
    Switch,
};

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

#[cfg(test)]
mod tests;
