//! Text the benches read: log tails and findings, `/metrics` samples.

use std::collections::BTreeSet;

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Samples of metrics whose name contains `task` (any case), e.g. a tokio task gauge, as
/// (`name{labels}`, value); comment lines are skipped.
pub fn task_metrics(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            if !name.to_ascii_lowercase().contains("task") {
                return None;
            }
            Some((series.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Sum of the samples of metric `name` (all label sets), or `None` when absent.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = l.rsplit_once(' ') else {
            continue;
        };
        if series.split('{').next() == Some(name)
            && let Ok(v) = value.trim().parse::<f64>()
        {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

// ----- HTTP probing ----------------------------------------------------------------------

/// (WARN lines, ERROR lines, panics, up to 6 distinct WARN/ERROR messages without their
/// timestamp) of a vipd log.
pub fn log_findings(log: &str) -> (usize, usize, usize, Vec<String>) {
    let mut warn = 0;
    let mut err = 0;
    let mut seen = BTreeSet::new();
    let mut examples = Vec::new();
    for l in log.lines() {
        let is_warn = l.contains(" WARN ");
        let is_err = l.contains("ERROR ");
        if !(is_warn || is_err) {
            continue;
        }
        if is_warn {
            warn += 1;
        } else {
            err += 1;
        }
        let msg = l.split_once(' ').map_or(l, |(_, m)| m).trim();
        // Group by the message start (fields after it often carry names and addresses).
        let key: String = msg.chars().take(60).collect();
        if examples.len() < 6 && seen.insert(key) {
            examples.push(msg.chars().take(240).collect());
        }
    }
    let panics = log.matches("panicked").count();
    (warn, err, panics, examples)
}

/// `items` joined with `sep`, or `none` when there are none.
pub fn or_none(items: &[String], sep: &str) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(sep)
    }
}
