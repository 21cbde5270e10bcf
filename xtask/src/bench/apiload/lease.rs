//! The control-plane Lease's writes, from a watch: holder changes and the gaps between writes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use xtask::lab::Lab;

use super::WATCH_CHUNK_SECS;
use crate::bench::harness::api::{get_lease, lease_watch_path};

/// One write of the Lease as the watch saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseWrite {
    /// `spec.holderIdentity` (empty when released).
    pub holder: String,
    /// `spec.renewTime` as seconds of the UTC day, if set.
    pub renew_tod: Option<f64>,
}

impl LeaseWrite {
    /// Reads holder and renew time from a Lease object.
    pub fn from_lease(lease: &serde_json::Value) -> LeaseWrite {
        LeaseWrite {
            holder: lease["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            renew_tod: lease["spec"]["renewTime"].as_str().and_then(time_of_day),
        }
    }
}

/// Seconds since midnight UTC of an RFC 3339 UTC time (`2026-12-01T21:40:00.123456Z`, as
/// the API server writes a Lease's MicroTime); `None` when it is not of that form.
pub fn time_of_day(t: &str) -> Option<f64> {
    let (_, time) = t.split_once('T')?;
    let time = time.strip_suffix('Z')?;
    let mut it = time.splitn(3, ':');
    let h: f64 = it.next()?.parse().ok()?;
    let m: f64 = it.next()?.parse().ok()?;
    let s: f64 = it.next()?.parse().ok()?;
    (h < 24.0 && m < 60.0 && s < 61.0).then_some(h * 3600.0 + m * 60.0 + s)
}

/// Seconds since midnight UTC now.
pub(super) fn now_tod() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() % 86_400.0)
        .unwrap_or_default()
}

/// `b - a` for times of day, across midnight.
pub(super) fn tod_diff(a: f64, b: f64) -> f64 {
    let d = b - a;
    if d < -43_200.0 { d + 86_400.0 } else { d }
}

/// Watches the control-plane Lease from its current state until `stop`, in chunks of
/// [`WATCH_CHUNK_SECS`] continued from the last resourceVersion; returns the state at the
/// start and every write seen, and the number of failed watch calls.
pub(super) fn watch_lease(
    lab: &Lab,
    stop: &AtomicBool,
) -> Result<(LeaseWrite, Vec<LeaseWrite>, u64)> {
    let get = || -> Result<(LeaseWrite, String)> {
        let (v, rv) = get_lease(lab)?;
        Ok((LeaseWrite::from_lease(&v), rv))
    };
    let (first, mut rv) = get()?;
    let mut writes = Vec::new();
    let mut failed = 0;
    while !stop.load(Ordering::Relaxed) {
        let path = lease_watch_path(&rv, WATCH_CHUNK_SECS);
        let mut restart = false;
        match lab.api_request("GET", &path, None) {
            Ok(r) if r.status == 200 => {
                for e in r
                    .body
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                {
                    match e["type"].as_str() {
                        Some("ADDED" | "MODIFIED" | "DELETED") => {
                            writes.push(LeaseWrite::from_lease(&e["object"]));
                            if let Some(v) = e["object"]["metadata"]["resourceVersion"].as_str() {
                                rv = v.to_string();
                            }
                        }
                        // ERROR (e.g. 410 Gone): start again from the current state.
                        _ => restart = true,
                    }
                }
            }
            _ => restart = true,
        }
        if restart {
            failed += 1;
            std::thread::sleep(Duration::from_millis(100));
            if let Ok((_, v)) = get() {
                rv = v;
            }
        }
    }
    Ok((first, writes, failed))
}

/// Times the holder became a different node: `writes` in order, starting from `first`'s
/// holder; a release (empty holder) is no change by itself, the next holder is compared
/// with the last non-empty one.
pub fn holder_changes(first: &LeaseWrite, writes: &[LeaseWrite]) -> usize {
    let mut last = first.holder.as_str();
    let mut changes = 0;
    for w in writes.iter().filter(|w| !w.holder.is_empty()) {
        if !last.is_empty() && w.holder != last {
            changes += 1;
        }
        last = &w.holder;
    }
    changes
}

/// Longest time between consecutive renew times in `[start, end]` (seconds of the day),
/// counting from `start` and up to `end`, ms.
pub fn max_write_gap_ms(writes: &[LeaseWrite], start: f64, end: f64) -> f64 {
    let mut prev = start;
    let mut worst: f64 = 0.0;
    for t in writes.iter().filter_map(|w| w.renew_tod) {
        if tod_diff(start, t) < 0.0 || tod_diff(t, end) < 0.0 {
            continue;
        }
        worst = worst.max(tod_diff(prev, t));
        prev = t;
    }
    worst.max(tod_diff(prev, end)) * 1000.0
}
