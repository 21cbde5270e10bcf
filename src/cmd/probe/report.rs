//! What `vipd probe` prints: the per-answer lines and the summary, as text or JSON.

use std::time::Duration;

use super::ProbeError;
use super::stats::{Outcome, ProbeStats, ms};

/// Duration in ms given as f64 ms -> back to a [`Duration`] (for display only).
fn from_ms(v: f64) -> Duration {
    Duration::try_from_secs_f64(v / 1000.0).unwrap_or_default()
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

/// The JSON summary (one line, no trailing newline); shape documented on [`Summary`](super::Summary).
///
/// # Errors
///
/// [`ProbeError::Json`] if serialisation fails (not expected for this plain data).
pub fn summary_json(stats: &ProbeStats) -> Result<String, ProbeError> {
    Ok(serde_json::to_string(&stats.summary())?)
}
