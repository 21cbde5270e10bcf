//! `cargo xtask bench failover`: measures control-plane VIP failover in the lab, for vipd
//! and for keepalived (VRRP: `keepalived`, VRRPv2 `advert_int 1`, and `keepalived-fast`, VRRPv3
//! `advert_int 0.1`), and prints p50/p95/max client-visible gaps and the time two
//! hosts answered ARP for the VIP at once.
//!
//! ```text
//! cargo xtask bench failover [--scenario graceful,kill,freeze,poweroff,partition,drain|all]
//!     [--trials N] [--impl vipd|keepalived|keepalived-fast|both] [--timings default,5/3/1,...]
//!     [--no-build] [--vipd PATH] [--json FILE] [--no-idle]
//!     [--lb | --service | --ride | --cp-and-service | --routed [--spread N]] [-v]
//! ```
//!
//! One lab ([`Lab::start`](xtask::lab::Lab::start), HTTP backends on every node answering their node name) is shared
//! by every trial of a run. A trial:
//!
//! 1. cleans up (deletes the Lease `kube-system/plndr-cp-lock`, checks no node carries
//!    192.0.2.10) and starts one instance per node (vipd in control-plane mode, or one
//!    keepalived per node, [`keepalived_conf`](super::harness::subject::keepalived_conf));
//! 2. waits until exactly one node carries the VIP and the client reaches it, then starts
//!    `vipd probe http://192.0.2.10/ --interval 20ms --json` in ns `client` and an
//!    [`xtask::lab::ArpWatcher`] (ARP request every 20 ms) in ns `api`, so the watcher's
//!    replies never touch the client's neighbour cache; waits until the probe answers
//!    steadily;
//! 3. waits `(trial - 1) mod 5` fifths of a second (so the trials sample the holder's 1 s
//!    renew cycle evenly), acts on the holder ([`Scenario`]) and polls, every ~20 ms, which nodes carry the VIP
//!    until another node does;
//! 4. lets things settle (2 s; for `freeze`: 3 s, SIGCONT, then 4 s watching that the
//!    thawed node neither carries nor answers for the VIP again), stops the probe and the
//!    watcher, heals the lab and stops every instance.
//!
//! Figures per trial: the probe's longest gap between two successful answers (ms), the time
//! from the event until another node carries the VIP (kernel view, ms), and the time during
//! which two or more MACs answered ARP for the VIP (number of 20 ms slots with two
//! responders x 20 ms). Before the scenarios, an idle phase per vipd timing reads VmRSS of
//! the leading and a following vipd after 10 s and counts Lease writes over 10 s with a
//! watch.
//!
//! `--cp-and-service` (vipd only; issue 16: kube-vip users reported 9 s for this case) moves
//! two VIPs held by one node: the control-plane VIP 192.0.2.10 (Lease
//! `kube-system/plndr-cp-lock`) and the LoadBalancer Service `default/failover`'s VIP
//! [`SERVICE_VIP`](super::harness::SERVICE_VIP) 192.0.2.20 under the global Services Lease `kube-system/plndr-svcs-lock`
//! (`svc_election=false`, kube-vip's default), `svc_*` timings equal to the `vip_*` ones. A
//! trial deletes both Leases, starts vipd on one node first (node-a, -b, -c in turn), waits
//! until that node carries both VIPs and the client reaches both, then starts the other two
//! and waits until they follow both Leases; it runs one probe and one ARP watcher per VIP,
//! acts on the holder as above and polls until another node carries each VIP. Each trial
//! gives one result per VIP (`vipd T cp+svc:cp`, `vipd T cp+svc:svc`) in the usual tables,
//! and a pair table: the slower VIP's gap (both back), the spread between the two
//! takeovers and whether both VIPs moved to the same node.
//!
//! `--routed` (issue 29) runs the trials in routing-table mode behind a BGP router with BFD
//! and ECMP, and measures the ECMP spread: see [`routed`].
//!
//! The files: [`options`] (the command line), [`scenario`] (what each scenario does to the
//! holder and how it is healed), [`trial`] (one trial and its figures),
//! [`cp_and_service`] (the start of a `--cp-and-service` trial), [`idle`](mod@idle) (the idle phase)
//! and [`report`] (the tables); the lab side is [`super::harness`].

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::harness::KEEPALIVED;
use super::harness::build::vipd_release_binary;
use super::harness::ctx::Ctx;
use super::harness::subject::Subject;

pub mod cp_and_service;
pub mod idle;
pub mod options;
pub mod report;
pub mod routed;
pub mod scenario;
pub mod trial;

#[cfg(test)]
mod tests;

use idle::{idle, idle_line};
use options::{BenchOptions, USAGE};
use report::{
    BenchReport, PairResult, pair_line, pair_table, ratio_table, route_table, spread_table,
    summary_table, trial_line,
};
use routed::{PathSource, Routed, measure_spread, run_routed_trial};
use scenario::Scenario;
use trial::run_trial_per_vip;

/// How long the idle phase waits before reading RSS, and how long it counts Lease writes.
pub const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// Trial n waits `((n - 1) mod 5) / 5` of this before the event (1 s: the retry period and
/// keepalived's VRRP advert interval; keepalived-fast's 0.1 s adverts repeat ten times in
/// it), so five trials sample the renew cycle evenly.
pub const PHASE_SPREAD: Duration = Duration::from_secs(1);
/// `cargo xtask bench ARGS...`.
///
/// # Errors
/// Bad arguments, not root, a lab that cannot start, or a trial that cannot be set up.
pub fn run(args: &[&str]) -> Result<()> {
    match args {
        ["failover", rest @ ..] => failover(&BenchOptions::parse(rest)?),
        _ => bail!("{USAGE}"),
    }
}

fn failover(o: &BenchOptions) -> Result<()> {
    crate::require_root("bench")?;
    let subjects = o.subjects();
    if subjects.iter().any(|s| matches!(s, Subject::Keepalived(_)))
        && !Path::new(KEEPALIVED).is_file()
    {
        bail!("{KEEPALIVED} not found: apt-get install keepalived (or use --impl vipd)");
    }
    let vipd = vipd_release_binary(o.build, o.vipd_path.as_deref())?;
    let started = Instant::now();
    let mut ctx = Ctx::start(vipd, o.verbose)?;
    ctx.freeze_for = o.freeze_for;
    if o.lb {
        ctx.enable_lb()?;
    }
    if let Some(ride) = o.service {
        ctx.enable_service(ride)?;
    }
    if o.cp_and_service {
        ctx.enable_cp_and_service()?;
    }
    let routed = if o.routed {
        Some(Routed::start(&mut ctx)?)
    } else {
        None
    };
    println!(
        "lab {} up in {:.1} s; vipd {}",
        ctx.lab.prefix(),
        started.elapsed().as_secs_f64(),
        ctx.vipd.display()
    );
    let mut report = BenchReport::default();
    if o.idle && o.vipd && o.service.is_none() && !o.cp_and_service && !o.routed {
        for t in &o.timings {
            let subject = Subject::Vipd(t.clone());
            match idle(&ctx, &subject) {
                Ok(r) => {
                    println!("{}", idle_line(&r));
                    report.idle.push(r);
                }
                Err(e) => println!("idle {}: failed: {e:#}", subject.label()),
            }
        }
    }
    // Failed trials are reported and the bench goes on; it fails at the end when nothing
    // was measured (e.g. a configuration vipd refuses: every trial fails the same way).
    let mut failed = 0usize;
    for scenario in &o.scenarios {
        for subject in &subjects {
            if (*scenario == Scenario::Drain || o.lb) && matches!(subject, Subject::Keepalived(_)) {
                continue;
            }
            for trial in 1..=o.trials {
                let rs = match &routed {
                    Some(r) => run_routed_trial(&ctx, r, *scenario, subject, trial),
                    None => run_trial_per_vip(&ctx, *scenario, subject, trial),
                };
                match rs {
                    Ok(rs) => {
                        for r in &rs {
                            println!("{}", trial_line(r));
                        }
                        if let (false, [cp, svc]) = (o.routed, rs.as_slice()) {
                            let p = PairResult::of(&subject.label(), cp, svc);
                            println!("{}", pair_line(&p));
                            report.pairs.push(p);
                        }
                        report.trials.extend(rs);
                    }
                    Err(e) => {
                        failed += 1;
                        println!(
                            "{:<9} {:<16} #{trial}: trial failed: {e:#}",
                            scenario.name(),
                            subject.label()
                        );
                    }
                }
            }
        }
    }
    if routed.is_some() && o.spread > 0 {
        match measure_spread(&ctx, PathSource::StaticRoutes, o.spread) {
            Ok(s) => report.spread = s,
            Err(e) => println!("ECMP spread: failed: {e:#}"),
        }
    }
    println!();
    print!("{}", summary_table(&report));
    print!("{}", route_table(&report));
    print!("{}", spread_table(&report));
    print!("{}", pair_table(&report));
    print!("{}", ratio_table(&report));
    if !report.idle.is_empty() {
        println!("\nidle (after {} s):", IDLE_WINDOW.as_secs());
        for r in &report.idle {
            println!("  {}", idle_line(r));
        }
    }
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
        println!("\nper-trial figures written to {}", path.display());
    }
    println!(
        "\nbench finished in {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    if failed > 0 && report.trials.is_empty() {
        bail!("every trial failed ({failed}): nothing was measured (see the failures above)");
    }
    Ok(())
}
