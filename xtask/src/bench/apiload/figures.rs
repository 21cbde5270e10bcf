//! vipd's figures: renewal histograms from `/metrics` and step-downs from the logs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use xtask::lab::NODES;

use super::RENEW_HISTOGRAM;
use crate::bench::harness::METRICS_PORT;
use crate::bench::harness::ctx::Ctx;
use crate::bench::harness::text::metric_sum;

/// Cumulative buckets `(le, count)` of histogram `name`, summed over its label sets, in
/// ascending `le` (`+Inf` as infinity).
pub fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let series = format!("{name}_bucket{{");
    let mut out: Vec<(f64, f64)> = Vec::new();
    for l in text.lines().filter(|l| l.starts_with(&series)) {
        let Some((labels, value)) = l.rsplit_once(' ') else {
            continue;
        };
        let le = labels
            .split("le=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| match v {
                "+Inf" => Some(f64::INFINITY),
                v => v.parse::<f64>().ok(),
            });
        let (Some(le), Ok(v)) = (le, value.trim().parse::<f64>()) else {
            continue;
        };
        match out.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += v,
            None => out.push((le, v)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// `after - before`, bucket by bucket (buckets missing before count 0).
pub(super) fn bucket_diff(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(le, a)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, v)| *v);
            (*le, a - b)
        })
        .collect()
}

/// Quantile `q` (0..=1) of cumulative buckets as Prometheus' `histogram_quantile` estimates
/// it: linear within the bucket holding the rank, the largest finite bound when the rank
/// falls in `+Inf`; `None` without observations.
pub fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in buckets {
        if c >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let in_bucket = c - prev.1;
            let frac = if in_bucket > 0.0 {
                (rank - prev.1) / in_bucket
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, c);
    }
    Some(prev.0)
}

/// The vipd metrics of every node (empty text for a node that did not answer).
pub(super) fn scrape(ctx: &Ctx) -> Vec<String> {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), METRICS_PORT);
    NODES
        .iter()
        .map(|n| {
            ctx.lab
                .http_get(n, addr, "/metrics", Duration::from_secs(2))
                .unwrap_or_default()
        })
        .collect()
}

/// Renewal figures summed over the nodes: (buckets, sum s, count, failures).
pub(super) fn renew_totals(texts: &[String]) -> (Vec<(f64, f64)>, f64, f64, f64) {
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    let (mut sum, mut count, mut failures) = (0.0, 0.0, 0.0);
    for t in texts {
        for (le, c) in histogram_buckets(t, RENEW_HISTOGRAM) {
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, v)) => *v += c,
                None => buckets.push((le, c)),
            }
        }
        sum += metric_sum(t, &format!("{RENEW_HISTOGRAM}_sum")).unwrap_or_default();
        count += metric_sum(t, &format!("{RENEW_HISTOGRAM}_count")).unwrap_or_default();
        failures += metric_sum(t, "vipd_lease_renew_failures_total").unwrap_or_default();
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    (buckets, sum, count, failures)
}

/// Counts of step-downs (vipd's `stepping down lease=...` and `stepping down: shutting
/// down` lines; not the health check's `...; stepping down and not campaigning`, which is
/// followed by its own step-down line when the node led) and of `acquired lease; leading`
/// lines in `log`, and the step-down reasons (the text after `reason=`).
pub fn log_counts(log: &str) -> (usize, usize, Vec<String>) {
    let mut downs = 0;
    let mut reasons = Vec::new();
    for l in log
        .lines()
        .filter(|l| l.contains("stepping down lease=") || l.contains("stepping down: "))
    {
        downs += 1;
        let why = l
            .split_once("reason=")
            .map_or("(none given)", |(_, r)| r.trim());
        reasons.push(why.trim_matches('"').to_string());
    }
    let acquired = log
        .lines()
        .filter(|l| l.contains("acquired lease; leading"))
        .count();
    (downs, acquired, reasons)
}

/// Masks the numbers in a step-down reason (`renewals failed for 412 ms` and `for 398 ms`
/// count as one reason).
pub(super) fn reason_kind(why: &str) -> String {
    let mut out = String::new();
    let mut in_num = false;
    for c in why.chars() {
        if c.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
    }
    out
}
