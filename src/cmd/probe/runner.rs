//! The probe loop on its fixed schedule ([`probe`]) and the `vipd probe` entry points.

use std::future::Future;
use std::io::Write;
use std::time::SystemTime;

use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::ProbeError;
use super::client::request;
use super::config::{Args, Limit, ProbeConfig};
use super::report::{outcome_line, summary_json, summary_text};
use super::stats::{Outcome, ProbeMeta, ProbeStats};

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
