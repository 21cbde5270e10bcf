//! The `drain` scenario of `bench services`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::bringup::sequential_bringup;
use super::context::Bench;
use super::http::http_answer_within;
use super::*;
use crate::bench::harness::METRICS_PORT;
use crate::bench::stats::{ms, summary_ms};

/// Services of the drain scenario (192.0.2.150-164).
pub const DRAIN_SERVICES: usize = 15;

/// A Service that stayed where it was during the drain may not have a gap longer than this
/// (it would be a side effect of the drain).
pub const DRAIN_QUIET_GAP: Duration = Duration::from_millis(100);

/// Connect timeout of the drain scenario's probes: in the lab a connect takes well under
/// 1 ms, so a SYN unanswered for this long was lost (the VIP was moving); a shorter timeout
/// than [`CONNECT_TIMEOUT`] keeps the measured gap close to the real one.
pub const DRAIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(30);

/// Every probe of one Service: when each attempt ended, and the answering node (`None`:
/// failed).
type ProbeLog = Vec<(Instant, Option<String>)>;

/// Probes `addr` (one attempt per [`POLL_INTERVAL`] at most) until `stop`. Must run inside
/// the client's namespace.
fn probe_until(addr: SocketAddr, stop: &std::sync::atomic::AtomicBool) -> ProbeLog {
    let mut log = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let r = http_answer_within(addr, DRAIN_CONNECT_TIMEOUT).ok();
        log.push((Instant::now(), r));
        let next = started + POLL_INTERVAL;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    log
}

/// What one Service's probe saw around a drain of `from` at `t0`.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainMove {
    /// Last answer from `from` (ms after `t0`; negative: before the drain started).
    pub last_old_ms: f64,
    /// First answer from another node after that (ms after `t0`).
    pub first_new_ms: f64,
    /// `first_new_ms - last_old_ms`: the client-visible gap, ms.
    pub gap_ms: f64,
    /// Failed attempts in between.
    pub failures: usize,
    /// The node that answered then.
    pub to: String,
}

/// The move of one Service off `from`, from its probe `log` (`None` when it never answered
/// from `from`, or never from another node after that). Pure.
pub fn drain_move(log: &[(Instant, Option<String>)], from: &str, t0: Instant) -> Option<DrainMove> {
    let rel = |t: Instant| -> f64 { if t >= t0 { ms(t - t0) } else { -ms(t0 - t) } };
    let last_old = log.iter().rposition(|(_, n)| n.as_deref() == Some(from))?;
    let (first_new, to) = log
        .iter()
        .enumerate()
        .skip(last_old + 1)
        .find_map(|(i, (_, n))| n.as_ref().map(|n| (i, n.clone())))?;
    let failures = log[last_old + 1..first_new]
        .iter()
        .filter(|(_, n)| n.is_none())
        .count();
    let (a, b) = (rel(log[last_old].0), rel(log[first_new].0));
    Some(DrainMove {
        last_old_ms: a,
        first_new_ms: b,
        gap_ms: b - a,
        failures,
        to,
    })
}

/// The longest time between two consecutive successful answers in `log`, ms (0 with fewer
/// than two). Pure.
pub fn longest_gap_ms(log: &[(Instant, Option<String>)]) -> f64 {
    let ok: Vec<Instant> = log
        .iter()
        .filter(|(_, n)| n.is_some())
        .map(|(t, _)| *t)
        .collect();
    ok.windows(2).map(|w| ms(w[1] - w[0])).fold(0.0, f64::max)
}

/// Scenario (d), `drain`: runs it in a lab of its own and prints its figures.
///
/// # Errors
/// When the lab or vipd cannot start, or the scenario cannot run.
pub fn run(vipd: &Path, verbose: bool) -> Result<()> {
    println!(
        "== bench services: drain ({DRAIN_SERVICES} IPv4 Services over 3 nodes, `vipd drain` on the node answering most)"
    );
    let b = Bench::start(vipd, verbose)?;
    let (names, addrs) = services("drain", DRAIN_SERVICES, v4_address)?;
    let (up, failed) = sequential_bringup(&b, &names, &addrs)?;
    if !failed.is_empty() {
        bail!("drain: Services did not come up: {failed:?}");
    }
    // Let the spread settle (leases acquired in the first seconds), then read the holders
    // from the answers.
    std::thread::sleep(Duration::from_secs(3));
    let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
    for (_, n) in &up {
        *by_node.entry(n.clone()).or_default() += 1;
    }
    let node = by_node
        .iter()
        .max_by_key(|(_, c)| **c)
        .map(|(n, _)| n.clone())
        .ok_or_else(|| anyhow!("drain: no Service answered"))?;
    let (logs, t0, drain_out) = probe_while_draining(&b, vipd, &node, &addrs)?;
    let drained = drain_out
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("failed: {e}"));
    println!("  Services per node before: {by_node:?}; `vipd drain` on {node}: {drained}");
    print_moves(&b, &node, &names, &addrs, &logs, t0);
    b.finish();
    Ok(())
}

/// Probes every one of `addrs` continuously ([`probe_until`]) while `vipd drain` runs on
/// `node` (1 s after the probes start, then 5 s for the moves); returns each address's
/// probe log, when the drain started and its output.
fn probe_while_draining(
    b: &Bench,
    vipd: &Path,
    node: &str,
    addrs: &[IpAddr],
) -> Result<(
    Vec<ProbeLog>,
    Instant,
    xtask::lab::Result<std::process::Output>,
)> {
    let admin = format!("127.0.0.1:{METRICS_PORT}");
    let stop = std::sync::atomic::AtomicBool::new(false);
    b.in_client(|| {
        std::thread::scope(|s| {
            let probes: Vec<_> = addrs
                .iter()
                .map(|a| {
                    let stop = &stop;
                    s.spawn(move || probe_until(SocketAddr::new(*a, 80), stop))
                })
                .collect();
            std::thread::sleep(Duration::from_secs(1));
            let t0 = Instant::now();
            let out = b
                .lab
                .exec(node, vipd, &["drain", "--admin", admin.as_str()]);
            // Long enough for every move (graceful: tens of ms each, paced by the spread).
            std::thread::sleep(Duration::from_secs(5));
            stop.store(true, Ordering::SeqCst);
            let logs: Vec<ProbeLog> = probes
                .into_iter()
                .map(|p| p.join().unwrap_or_default())
                .collect();
            (logs, t0, out)
        })
    })
}

/// Prints the moves of a drain of `node` from the probe logs: the gap of each VIP that
/// moved, the longest gap of the others, and the Services still answered from `node`.
fn print_moves(
    b: &Bench,
    node: &str,
    names: &[String],
    addrs: &[IpAddr],
    logs: &[ProbeLog],
    t0: Instant,
) {
    let mut gaps = Vec::new();
    let mut still_on_drained = Vec::new();
    let mut others = Vec::new();
    for ((name, addr), log) in names.iter().zip(addrs).zip(logs) {
        let after: Vec<&Option<String>> = log
            .iter()
            .filter(|(t, _)| *t >= t0 + Duration::from_secs(3))
            .map(|(_, n)| n)
            .collect();
        if after.iter().any(|n| n.as_deref() == Some(node)) {
            still_on_drained.push(name.clone());
        }
        match drain_move(log, node, t0) {
            Some(m) => {
                b.say(format!(
                    "{name} {addr}: {node} -> {}: gap {:.0} ms ({} failed attempts; last old answer at {:.0} ms)",
                    m.to, m.gap_ms, m.failures, m.last_old_ms
                ));
                gaps.push(m);
            }
            None => others.push(longest_gap_ms(log)),
        }
    }
    let g: Vec<f64> = gaps.iter().map(|m| m.gap_ms).collect();
    let mut to: BTreeMap<&str, usize> = BTreeMap::new();
    for m in &gaps {
        *to.entry(m.to.as_str()).or_default() += 1;
    }
    println!(
        "  moved: {} VIPs, gap (last answer from {node} -> first from the new node): {}",
        gaps.len(),
        summary_ms(&g)
    );
    println!(
        "    failed attempts per move: max {}; taken by: {to:?}; last VIP answered from its new node {:.0} ms after `vipd drain` started",
        gaps.iter().map(|m| m.failures).max().unwrap_or(0),
        gaps.iter().map(|m| m.first_new_ms).fold(0.0, f64::max)
    );
    let quiet_max = others.iter().copied().fold(0.0, f64::max);
    println!(
        "  the {} Services on other nodes: longest gap {quiet_max:.0} ms (limit {} ms){}",
        others.len(),
        DRAIN_QUIET_GAP.as_millis(),
        if quiet_max > ms(DRAIN_QUIET_GAP) {
            "  <-- over"
        } else {
            ""
        }
    );
    println!(
        "  answered from {node} more than 3 s after the drain: {}",
        if still_on_drained.is_empty() {
            "none".to_string()
        } else {
            format!("{still_on_drained:?}  <-- not drained")
        }
    );
}
