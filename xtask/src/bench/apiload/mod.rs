//! `cargo xtask bench apiload`: the flapping guard under API server load. vipd in
//! control-plane mode on node-a/b/c while concurrent loops of expensive API requests slow
//! the lab's API server down; per lease timing and load level it prints how slow the
//! holder's renewals got, how often it stepped down and leadership moved, and whether two
//! hosts ever answered ARP for the VIP at once.
//!
//! ```text
//! cargo xtask bench apiload [--timings fast,default,...] [--load 0,4,16,64] [--seconds 60]
//!     [--objects 2000] [--object-kib 4] [--no-build] [--vipd PATH] [-v]
//! ```
//!
//! One lab ([`Ctx::start`], as `bench failover`) for the whole run. First the load's
//! collection: `--objects` ConfigMaps of `--object-kib` KiB each in namespace [`LOAD_NAMESPACE`].
//! Then, per timing and load level (a row):
//!
//! 1. vipd starts on the three nodes (fresh Lease, [`start_trial_cluster`]); once one node
//!    holds the VIP and the client reaches it, `vipd probe http://192.0.2.10/` (every 20 ms,
//!    `--timeout` [`lab::PROBE_TIMEOUT`](xtask::lab::PROBE_TIMEOUT)) runs in ns `client` and an ARP watcher (every
//!    20 ms) in ns `api`;
//! 2. `--load` N loops start, each a thread inside ns `api` (never the root namespace)
//!    talking to the API server at 127.0.0.1:6443 as admin (`system:masters`; the lab runs
//!    the API server without priority and fairness): LIST of every ConfigMap in
//!    [`LOAD_NAMESPACE`], then a merge PATCH of one of them, again and again;
//! 3. after [`WARM_UP`] the window of `--seconds` starts: the vipd metrics of every node
//!    (`vipd_lease_renew_duration_seconds`, `vipd_lease_renew_failures_total`) are read at
//!    both ends, a watch of the Lease records every write, the vipd logs are read from that
//!    point on, and the CPU time of etcd and kube-apiserver is sampled;
//! 4. the load stops, then the probe and the watcher (their figures span warm-up and
//!    window), and vipd.
//!
//! The default levels (0, 4, 16, 64 loops) were chosen on the 2-core lab machine: 4 loops
//! already keep kube-apiserver busy most of a core, 16 saturate it and push the fast
//! profile's renewals past its 400 ms renew deadline, 64 also stretch the default profile's
//! renewals towards its 2 s one (docs/failover.md, "The flapping guard under API load").

//!
//! The files: [`options`] (the command line), [`load`] (the ConfigMaps and the loops that
//! load the API server), [`lease`] (the Lease's writes from a watch), [`figures`] (vipd's
//! metrics and logs) and [`report`] (a row and its line).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use xtask::lab::NODES;

use super::harness::build::vipd_release_binary;
use super::harness::cluster::{reachable_holder, start_trial_cluster};
use super::harness::ctx::Ctx;
use super::harness::probe::{stop_probe, wait_probe_steady};
use super::harness::procfs::cpu_percent;
use super::harness::subject::{Subject, Timings};
use super::harness::{SAMPLE_INTERVAL, VIP};
use figures::{bucket_diff, histogram_quantile, log_counts, reason_kind, renew_totals, scrape};
use lease::{LeaseWrite, holder_changes, max_write_gap_ms, now_tod, tod_diff, watch_lease};
use load::{Load, fill};
use options::Options;
use report::{Row, header, row_line};

pub mod figures;
pub mod lease;
pub mod load;
pub mod options;
pub mod report;

#[cfg(test)]
mod tests;

/// Namespace of the ConfigMaps the load lists and patches.
pub const LOAD_NAMESPACE: &str = "load";
/// The load runs this long before a row's window starts (a full stride of every loop).
pub const WARM_UP: Duration = Duration::from_secs(3);
/// `timeoutSeconds` of each Lease watch call (the lab's HTTPS client reads with a 5 s
/// timeout, so the server must end a quiet watch sooner).
pub(super) const WATCH_CHUNK_SECS: u64 = 2;
/// Name of vipd's renew latency histogram.
pub(super) const RENEW_HISTOGRAM: &str = "vipd_lease_renew_duration_seconds";

/// `cargo xtask bench apiload ARGS...`.
///
/// # Errors
/// Bad arguments, not root, a failed build, a lab that cannot start or a load collection
/// that cannot be created. A row that fails is printed as failed and the run goes on.
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    crate::require_root("bench apiload")?;
    let vipd = vipd_release_binary(o.build, o.vipd_path.as_deref())?;
    let started = Instant::now();
    let ctx = Ctx::start(vipd, o.verbose)?;
    println!(
        "lab {} up in {:.1} s; vipd {}",
        ctx.lab.prefix(),
        started.elapsed().as_secs_f64(),
        ctx.vipd.display()
    );
    let t_fill = Instant::now();
    fill(&ctx.lab, o.objects, o.object_kib)?;
    println!(
        "{} ConfigMaps of {} KiB in namespace {LOAD_NAMESPACE} created in {:.1} s",
        o.objects,
        o.object_kib,
        t_fill.elapsed().as_secs_f64()
    );
    println!("{}", header());
    let mut rows = Vec::new();
    for t in &o.timings {
        for &load in &o.loads {
            match measure(&ctx, &o, t, load) {
                Ok(r) => {
                    println!("{}", row_line(&r));
                    rows.push(r);
                }
                Err(e) => println!("{:<8} {load:>4}  row failed: {e:#}", t.label),
            }
        }
    }
    println!();
    println!("{}", header());
    for r in &rows {
        println!("{}", row_line(r));
    }
    println!("\nstep-down reasons and notes:");
    for r in &rows {
        for (why, n) in &r.reasons {
            println!("  {} load {}: {n} x {why}", r.timings, r.load);
        }
        for n in &r.notes {
            println!("  {} load {}: note: {n}", r.timings, r.load);
        }
    }
    println!(
        "\nbench finished in {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

fn say(ctx: &Ctx, what: impl AsRef<str>) {
    if ctx.verbose {
        eprintln!("    {}", what.as_ref());
    }
}

/// One row: see the module documentation.
fn measure(ctx: &Ctx, o: &Options, t: &Timings, load: usize) -> Result<Row> {
    let subject = Subject::Vipd(t.clone());
    let mut row = Row {
        timings: t.label.clone(),
        load,
        ..Row::default()
    };
    say(ctx, format!("{} load {load}: starting vipd", t.label));
    let mut cluster = start_trial_cluster(ctx, &subject, &mut row.notes)?;
    let holder = reachable_holder(ctx, &subject, &cluster)?;
    let watcher = ctx.start_arp_watch(VIP)?;
    let probe = ctx.start_probe(VIP.into())?;
    wait_probe_steady(&probe, &holder, 25, Duration::from_secs(10))?;
    say(ctx, format!("{holder} holds the VIP; {load} load loops"));
    let loadgen = Load::start(&ctx.lab, load, o.objects)?;
    std::thread::sleep(WARM_UP);

    let logs_from: Vec<usize> = NODES.iter().map(|n| cluster.log(n).len()).collect();
    let before = scrape(ctx);
    let counts0 = loadgen.counts();
    let stop_watch = AtomicBool::new(false);
    let window = Duration::from_secs(o.seconds);
    let (cpu, watched, t_window, start_tod, end_tod) = std::thread::scope(|s| {
        let w = s.spawn(|| watch_lease(&ctx.lab, &stop_watch));
        let start_tod = now_tod();
        let t0 = Instant::now();
        let mut pids = ctx.lab.control_plane_pids();
        pids.push(std::process::id() as i32);
        let cpu = cpu_percent(&pids, window);
        let t_window = t0.elapsed();
        let end_tod = now_tod();
        stop_watch.store(true, Ordering::Relaxed);
        let watched = w
            .join()
            .map_err(|_| anyhow!("lease watch thread panicked"))
            .and_then(|r| r);
        (cpu, watched, t_window, start_tod, end_tod)
    });
    let after = scrape(ctx);
    let counts1 = loadgen.counts();
    let logs: Vec<String> = NODES
        .iter()
        .zip(&logs_from)
        .map(|(n, from)| cluster.log(n).get(*from..).unwrap_or_default().to_string())
        .collect();
    loadgen.stop()?;
    let summary = stop_probe(probe);
    let arp = watcher.stop()?;
    cluster.stop();
    let left = ctx.clear_vip(Duration::from_secs(6))?;
    if !left.is_empty() {
        row.notes.push(format!(
            "VIP still on {} 6 s after vipd stopped; removed by hand",
            left.join(",")
        ));
    }
    let summary = summary?;

    let secs = t_window.as_secs_f64();
    row.window_s = secs;
    row.lists_per_s = (counts1.0 - counts0.0) as f64 / secs;
    row.writes_per_s = (counts1.1 - counts0.1) as f64 / secs;
    row.load_failures = counts1.2 - counts0.2;
    // control_plane_pids: etcd, then kube-apiserver; then this process.
    row.etcd_cpu = cpu.first().copied().flatten();
    row.apiserver_cpu = cpu.get(1).copied().flatten();
    row.xtask_cpu = cpu.get(2).copied().flatten();

    renew_figures(&mut row, &before, &after);
    lease_figures(&mut row, watched, secs, start_tod, end_tod);
    log_figures(&mut row, &logs);

    let two = arp.slots.iter().filter(|s| s.responders.len() >= 2).count();
    row.two_responders_ms = two as f64 * SAMPLE_INTERVAL.as_secs_f64() * 1000.0;
    row.probe_gap_ms = summary.worst_gap_ms();
    row.probe_failures = summary.failures;
    row.probe_requests = summary.requests;
    Ok(row)
}

/// The renewal figures of `row` from the nodes' `/metrics` at both ends of the window.
fn renew_figures(row: &mut Row, before: &[String], after: &[String]) {
    let (b0, sum0, n0, f0) = renew_totals(before);
    let (b1, sum1, n1, f1) = renew_totals(after);
    let buckets = bucket_diff(&b1, &b0);
    row.renewals = n1 - n0;
    row.renew_failures = f1 - f0;
    row.renew_mean_ms = (row.renewals > 0.0).then(|| (sum1 - sum0) / row.renewals * 1000.0);
    row.renew_p95_ms = histogram_quantile(&buckets, 0.95).map(|v| v * 1000.0);
    if before.iter().chain(after).any(String::is_empty) {
        row.notes
            .push("a node's metrics did not answer; its renewals are missing".into());
    }
}

/// The Lease figures of `row` from the watch of the window (`secs` long, from `start_tod`
/// to `end_tod`, seconds of the UTC day).
fn lease_figures(
    row: &mut Row,
    watched: Result<(LeaseWrite, Vec<LeaseWrite>, u64)>,
    secs: f64,
    start_tod: f64,
    end_tod: f64,
) {
    match watched {
        Ok((first, writes, failed)) => {
            let in_window: Vec<LeaseWrite> = writes
                .into_iter()
                .filter(|w| w.renew_tod.is_none_or(|t| tod_diff(t, end_tod) >= 0.0))
                .collect();
            row.lease_writes_per_s = in_window.len() as f64 / secs;
            row.holder_changes = holder_changes(&first, &in_window);
            row.max_write_gap_ms = Some(max_write_gap_ms(&in_window, start_tod, end_tod));
            if failed > 0 {
                row.notes.push(format!(
                    "{failed} Lease watch calls failed and were restarted"
                ));
            }
        }
        Err(e) => row.notes.push(format!("Lease watch failed: {e:#}")),
    }
}

/// Step-downs, acquisitions, their reasons and health-gate closures of `row` from the vipd
/// logs of the window (one per node, in [`NODES`] order).
fn log_figures(row: &mut Row, logs: &[String]) {
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for (n, log) in NODES.iter().zip(logs) {
        let (downs, acquired, why) = log_counts(log);
        let gated = log.matches("local API server unhealthy").count();
        if gated > 0 {
            row.notes.push(format!(
                "{n}: local API server health gate closed {gated} times (/livez too slow)"
            ));
        }
        row.step_downs += downs;
        row.acquisitions += acquired;
        for w in why {
            let k = format!("{n}: {}", reason_kind(&w));
            match reasons.iter_mut().find(|(r, _)| *r == k) {
                Some((_, c)) => *c += 1,
                None => reasons.push((k, 1)),
            }
        }
    }
    row.reasons = reasons;
}
