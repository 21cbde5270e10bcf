//! `vipd probe --json`: its summary, and waiting until it answers steadily.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use xtask::lab::{LabProcess, Signal};

use super::text::tail;

/// The subset of `vipd probe --json`'s summary the bench reads (see vipd's
/// `probe::Summary`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeSummary {
    /// Requests with a known outcome.
    #[serde(default)]
    pub requests: u64,
    /// 2xx answers.
    #[serde(default)]
    pub successes: u64,
    /// Failed requests.
    #[serde(default)]
    pub failures: u64,
    /// Run time, ms.
    #[serde(default)]
    pub elapsed_ms: f64,
    /// Arrival of the last success, ms.
    #[serde(default)]
    pub last_success_ms: Option<f64>,
    /// Failures after the last success.
    #[serde(default)]
    pub trailing_failures: u64,
    /// Longest gap.
    #[serde(default)]
    pub longest_gap: Option<ProbeGap>,
    /// Switch count.
    #[serde(default)]
    pub switch_count: u64,
    /// Switches.
    #[serde(default)]
    pub switches: Vec<ProbeSwitch>,
}

/// `longest_gap` of the probe summary.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeGap {
    /// Length, ms.
    pub gap_ms: f64,
}

/// One entry of `switches` of the probe summary.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeSwitch {
    /// Old backend.
    pub from: String,
    /// New backend.
    pub to: String,
    /// First answer of `to`, ms since the probe start.
    pub at_ms: f64,
    /// Gap, ms.
    pub gap_ms: f64,
    /// Failures in between.
    pub failures: u64,
}

impl ProbeSummary {
    /// The longest gap including an open gap at the end (ms), `None` without any answer.
    pub fn worst_gap_ms(&self) -> Option<f64> {
        let closed = self.longest_gap.as_ref().map(|g| g.gap_ms);
        let open = (self.trailing_failures > 0)
            .then(|| self.last_success_ms.map(|l| self.elapsed_ms - l))
            .flatten();
        match (closed, open) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Stops a probe (SIGINT) and parses the JSON summary line from its log.
///
/// # Errors
/// When the probe does not exit or prints no summary.
pub fn stop_probe(mut probe: LabProcess) -> Result<ProbeSummary> {
    let _ = probe.signal(Signal::SIGINT);
    let line = json_summary(
        &mut probe,
        Duration::from_secs(5),
        "vipd probe did not exit within 5 s of SIGINT",
        "no JSON summary in the probe output",
    )?;
    serde_json::from_str(&line).with_context(|| format!("parse probe summary {line}"))
}

/// Waits up to `limit` for `p` to exit and returns the last line of its output that is a
/// JSON object (the summary `vipd probe --json` and peer_sim print last).
///
/// # Errors
/// `not_done` when it does not exit in time (it is killed then), `no_summary: LOG TAIL` when
/// no line is a JSON object.
pub fn json_summary(
    p: &mut LabProcess,
    limit: Duration,
    not_done: &str,
    no_summary: &str,
) -> Result<String> {
    if p.wait_timeout(limit)?.is_none() {
        let _ = p.kill();
        bail!("{not_done}");
    }
    let log = p.log();
    log.lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{no_summary}: {}", tail(&log, 10)))
}

/// Waits until the probe's last `n` answer lines (stderr, `HH:MM:SS.mmm NODE LAT`) all name
/// `node`.
pub(crate) fn wait_probe_steady(
    probe: &LabProcess,
    node: &str,
    n: usize,
    limit: Duration,
) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let log = probe.log();
        let last: Vec<&str> = log
            .lines()
            .filter(|l| !l.starts_with('{'))
            .rev()
            .take(n)
            .collect();
        if last.len() == n
            && last
                .iter()
                .all(|l| l.split_whitespace().nth(1) == Some(node))
        {
            return Ok(());
        }
        if t0.elapsed() > limit {
            bail!(
                "probe did not answer steadily from {node} within {limit:?}: {}",
                tail(&log, 5)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_gap_at_the_end_counts() {
        let s: ProbeSummary = serde_json::from_str(
            r#"{"requests":10,"successes":5,"failures":5,"elapsed_ms":1000.0,
                "last_success_ms":400.0,"trailing_failures":5,
                "longest_gap":{"start_ms":0.0,"gap_ms":100.0,"failures":0},
                "switch_count":0,"switches":[],"backends":{"node-a":5}}"#,
        )
        .unwrap();
        assert_eq!(s.worst_gap_ms(), Some(600.0));
        let closed = ProbeSummary {
            longest_gap: Some(ProbeGap { gap_ms: 250.0 }),
            ..ProbeSummary::default()
        };
        assert_eq!(closed.worst_gap_ms(), Some(250.0));
        assert_eq!(ProbeSummary::default().worst_gap_ms(), None);
    }
}
