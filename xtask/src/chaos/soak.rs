//! The phases of a soak (start, warm-up, canary, faults, settle, final audit and checks) and
//! its report.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use xtask::lab::{self, ArpRoundProber, Signal};

use super::audit::{
    AuditParams, FaultKind, Violation, ViolationKind, audit, canary_verdict, check_status,
    leftovers, orphan_leases, rss_violation, secs, split_canary, v,
};
use super::driver::Chaos;
use super::options::Options;
use super::{
    CANARY_ADDR, CANARY_HOLD, CP_TIMINGS, ROUND_PERIOD, ROUND_WINDOW, STATUS_WAIT, lease_gc_wait,
    pool_address,
};

/// Figures for the report besides faults and violations.
#[derive(Debug, Default)]
pub(super) struct Report {
    rss_start: BTreeMap<String, (i32, u64)>,
    rss_end: BTreeMap<String, (i32, u64)>,
    rounds: usize,
    audited_s: f64,
    warnings: Vec<String>,
    canary: Option<String>,
}

/// The soak: start, warm-up, canary, the fault phase, the final settle, audit and checks;
/// what it measured for the report.
pub(super) fn soak(c: &mut Chaos, o: &Options, rng: &mut fastrand::Rng) -> Result<Report> {
    let mut report = Report::default();
    let universe = start_soak(c, o)?;
    let audit_from = warm_up(c, o, &mut report)?;
    fault_phase(c, o, rng)?;
    final_settle(c)?;
    final_audit(c, o, &mut report, audit_from, universe)?;
    check_orphan_leases(c, o, &mut report)?;
    check_rss(c, o, &mut report);
    stop_all_vipds(c)?;
    check_leftovers(c)?;
    check_panics(c);
    Ok(report)
}

/// Starts vipd on every node and the prober of every pool address (plus the control-plane
/// VIP and the canary); returns the probed addresses.
fn start_soak(c: &mut Chaos, o: &Options) -> Result<Vec<Ipv4Addr>> {
    c.create_cluster_objects()?;
    for n in c.nodes.clone() {
        c.start_vipd(&n)?;
    }
    let mut universe: Vec<Ipv4Addr> = (0..).map_while(pool_address).collect();
    universe.push(lab::CONTROL_PLANE_VIP);
    if o.canary {
        universe.push(CANARY_ADDR);
    }
    c.prober = Some(ArpRoundProber::start(
        &c.lab.netns_path("client")?,
        lab::ETH,
        lab::CLIENT_V4,
        universe.clone(),
        ROUND_PERIOD,
        ROUND_WINDOW,
        c.epoch,
    )?);
    let at = c.now();
    c.desire(lab::CONTROL_PLANE_VIP, "control-plane", at);
    Ok(universe)
}

/// Creates the Services and waits until each answered, then 10 s; records RSS at start,
/// clears the fault table and runs the canary if asked. Returns the start of the audit.
fn warm_up(c: &mut Chaos, o: &Options, report: &mut Report) -> Result<Duration> {
    // Warm-up: every Service created and answered, then RSS start.
    for i in 0..o.services {
        let addr = pool_address(i).ok_or_else(|| anyhow!("pool too small"))?;
        let name = format!("svc-{i}");
        c.next_svc = i + 1;
        c.create_service(&name, addr)?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !c.answered_all() {
        if Instant::now() > deadline {
            bail!("warm-up: not every Service answered within 120 s of its creation");
        }
        c.check_alive()?;
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(10));
    let audit_from = c.now();
    report.rss_start = c.rss();
    // The fault table counts the fault phase only (the warm-up creates are not faults).
    c.faults.clear();
    if o.canary {
        put_canary(c)?;
    }
    println!(
        "  warm-up done at {}: {} Services answered; faults start",
        secs(audit_from),
        c.services.len()
    );
    Ok(audit_from)
}

/// Two nodes answer for an address nobody owns for [`CANARY_HOLD`]: the auditor must see two
/// MACs and an answer without a Service.
fn put_canary(c: &mut Chaos) -> Result<()> {
    let cidr = format!("{CANARY_ADDR}/32");
    let pair: Vec<String> = c.nodes.iter().take(2).cloned().collect();
    for n in &pair {
        c.lab
            .exec(n, "ip", &["addr", "add", &cidr, "dev", lab::ETH])?;
    }
    std::thread::sleep(CANARY_HOLD);
    for n in &pair {
        c.lab
            .exec(n, "ip", &["addr", "del", &cidr, "dev", lab::ETH])?;
    }
    println!(
        "  canary: {CANARY_ADDR} was on {} for {} s",
        pair.join(" and "),
        CANARY_HOLD.as_secs()
    );
    Ok(())
}

/// Runs episodes for `o.minutes`, printing progress every minute.
fn fault_phase(c: &mut Chaos, o: &Options, rng: &mut fastrand::Rng) -> Result<()> {
    let end = Instant::now() + Duration::from_secs_f64(o.minutes * 60.0);
    let mut next_progress = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        c.episode(rng, o.services, o.faults.as_ref())?;
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(60);
            let f: u64 = c.faults.values().sum();
            eprintln!(
                "  {:.1} min: {f} faults and Service changes, {} Services",
                c.now().as_secs_f64() / 60.0,
                c.services.len()
            );
        }
    }
    Ok(())
}

/// Everything healed (each episode heals its faults), every Service announceable again,
/// every vipd running; then waits for the status to converge and records what did not.
fn final_settle(c: &mut Chaos) -> Result<()> {
    c.check_alive()?;
    let ignored: Vec<String> = c
        .services
        .iter()
        .filter(|(_, s)| s.ignored)
        .map(|(n, _)| n.clone())
        .collect();
    for name in ignored {
        let start = c.now();
        c.patch_service(
            &name,
            serde_json::json!({"metadata": {"annotations": {"kube-vip.io/ignore": null}}}),
        )?;
        let at = c.now();
        let addr = c.services.get(&name).map(|s| s.addr);
        if let (Some(addr), Some(s)) = (addr, c.services.get_mut(&name)) {
            s.ignored = false;
            c.desire(addr, &name, at);
            c.record_svc(FaultKind::Annotation, &name, start, vec![addr]);
        }
    }
    std::thread::sleep(c.longest_bound() + Duration::from_secs(2));
    // Status converges (level-triggered writes with back-off).
    let deadline = Instant::now() + STATUS_WAIT;
    let status_violations = loop {
        let observed = c.observed_services()?;
        let last = c
            .prober
            .as_ref()
            .and_then(ArpRoundProber::last)
            .unwrap_or_default();
        let vs = check_status(&observed, &last.replies, &|m| c.node_of(m));
        if vs.is_empty() || Instant::now() > deadline {
            break vs;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    c.violations.extend(status_violations);
    Ok(())
}

/// Stops the prober and audits its rounds from `audit_from` (and the canary's verdict).
fn final_audit(
    c: &mut Chaos,
    o: &Options,
    report: &mut Report,
    audit_from: Duration,
    universe: Vec<Ipv4Addr>,
) -> Result<()> {
    let rounds = c
        .prober
        .take()
        .map(ArpRoundProber::stop)
        .transpose()?
        .unwrap_or_default();
    report.rounds = rounds.len();
    report.audited_s = rounds
        .last()
        .map_or(0.0, |r| r.t.saturating_sub(audit_from).as_secs_f64());
    let params = AuditParams {
        service_bound: c.svc_timings().answer_bound(),
        control_plane: (lab::CONTROL_PLANE_VIP, CP_TIMINGS.answer_bound()),
        audit_from,
        universe,
    };
    let found = audit(&rounds, &c.tl, &params, &|m| c.node_of(m));
    let (canary, found) = split_canary(found);
    c.violations.extend(found);
    if o.canary {
        match canary_verdict(&canary) {
            Ok(msg) => report.canary = Some(msg),
            Err(x) => c.violations.push(x),
        }
    }
    Ok(())
}

/// Leases of deleted Services (vipd deletes them; the GC may lag by lease + grace): a
/// violation, or a warning with `--orphan-leases-warn`.
fn check_orphan_leases(c: &mut Chaos, o: &Options, report: &mut Report) -> Result<()> {
    let gc_wait = lease_gc_wait(c.svc_timings().lease);
    let deadline = Instant::now() + gc_wait;
    let orphans = loop {
        let names: BTreeSet<String> = c.observed_services()?.into_iter().map(|s| s.name).collect();
        let orphans = orphan_leases(&c.lease_names()?, &names);
        if orphans.is_empty() || Instant::now() > deadline {
            break orphans;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    if !orphans.is_empty() {
        let detail = format!(
            "{} lease(s) of deleted Services left {} s after the end: {}",
            orphans.len(),
            gc_wait.as_secs(),
            orphans
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
        if o.orphan_leases_warn {
            report.warnings.push(detail);
        } else {
            c.violations.push(v(ViolationKind::OrphanLease, detail));
        }
    }
    Ok(())
}

/// Records RSS at the end and flags growth over `o.rss_growth_pct`.
fn check_rss(c: &mut Chaos, o: &Options, report: &mut Report) {
    report.rss_end = c.rss();
    for (node, start) in &report.rss_start {
        if let Some(end) = report.rss_end.get(node)
            && let Some(x) = rss_violation(node, *start, *end, o.rss_growth_pct)
        {
            c.violations.push(x);
        }
    }
}

/// Graceful stop of every vipd at once: each must exit 0 within 15 s.
fn stop_all_vipds(c: &mut Chaos) -> Result<()> {
    for p in c.procs.values() {
        let _ = p.signal(Signal::SIGTERM);
    }
    let procs = std::mem::take(&mut c.procs);
    for (node, mut p) in procs {
        match p.wait_timeout(Duration::from_secs(15))? {
            Some(st) if st.success() => {}
            Some(st) => c.violations.push(v(
                ViolationKind::VipdExit,
                format!("vipd on {node} exited with {st} on the final SIGTERM"),
            )),
            None => {
                c.violations.push(v(
                    ViolationKind::SlowShutdown,
                    format!("vipd on {node} still running 15 s after the final SIGTERM"),
                ));
                p.kill()?;
            }
        }
    }
    Ok(())
}

/// What is left on the nodes after the final stop (addresses, nft tables, links).
fn check_leftovers(c: &mut Chaos) -> Result<()> {
    for node in c.nodes.clone() {
        let own: Vec<IpAddr> = [
            lab::node_ipv4(&node).map(IpAddr::V4),
            lab::node_ipv6(&node).map(IpAddr::V6),
        ]
        .into_iter()
        .flatten()
        .collect();
        let addrs = c.lab.addresses(&node, lab::ETH)?;
        let nft = c.lab.exec_unchecked(&node, "nft", &["list", "tables"])?;
        let links = c.lab.exec(&node, "ip", &["-j", "link", "show"])?;
        let links: serde_json::Value =
            serde_json::from_slice(&links.stdout).context("ip -j link JSON")?;
        let links: Vec<String> = links
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l["ifname"].as_str().map(str::to_string))
            .collect();
        let found = leftovers(
            &node,
            &addrs,
            &own,
            &String::from_utf8_lossy(&nft.stdout),
            &links,
        );
        c.violations.extend(found);
    }
    Ok(())
}

/// Panics in any vipd log, including the logs of processes the soak killed.
fn check_panics(c: &mut Chaos) {
    for (node, path) in &c.logs {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.contains("panicked") {
            let line = log
                .lines()
                .find(|l| l.contains("panicked"))
                .unwrap_or_default();
            c.violations.push(v(
                ViolationKind::VipdExit,
                format!("vipd on {node} panicked ({}): {line}", path.display()),
            ));
        }
    }
}

/// `git describe --always --dirty` of the workspace (empty when git fails).
pub(super) fn workspace_commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(lab::control_plane::workspace_root())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Prints the report: faults, violations, figures and the command that reruns the soak.
pub(super) fn print_report(c: &Chaos, r: &Report, seed: u64, o: &Options, commit: &str) {
    println!("\n== chaos soak result");
    println!(
        "  seed {seed}, {} min of faults, commit {commit}, {} probe rounds ({:.0} s audited), {} Services at the end",
        o.minutes,
        r.rounds,
        r.audited_s,
        c.services.len()
    );
    println!("\n  faults injected:");
    println!("    {:<28} {:>6}", "kind", "count");
    for (k, n) in &c.faults {
        println!("    {:<28} {:>6}", k.name(), n);
    }
    println!("    {:<28} {:>6}", "total", c.faults.values().sum::<u64>());
    println!("\n  invariant violations:");
    let mut by: BTreeMap<ViolationKind, Vec<&Violation>> = BTreeMap::new();
    for x in &c.violations {
        by.entry(x.kind).or_default().push(x);
    }
    println!("    {:<30} {:>6}  first examples", "kind", "count");
    for k in [
        ViolationKind::TwoMacs,
        ViolationKind::Unanswered,
        ViolationKind::StaleAnswer,
        ViolationKind::Status,
        ViolationKind::OrphanLease,
        ViolationKind::RssGrowth,
        ViolationKind::VipdExit,
        ViolationKind::SlowShutdown,
        ViolationKind::LeakedAddress,
        ViolationKind::LeakedNftTable,
        ViolationKind::LeakedLink,
    ] {
        let list = by.get(&k).map(Vec::as_slice).unwrap_or_default();
        println!("    {:<30} {:>6}", k.name(), list.len());
        for x in list.iter().take(3) {
            for (i, line) in x.detail.lines().enumerate() {
                println!("      {}{line}", if i == 0 { "- " } else { "  " });
            }
        }
    }
    println!("\n  RSS (KiB) start (after warm-up) -> end (before the final stop):");
    for (node, (p0, r0)) in &r.rss_start {
        let (p1, r1) = r.rss_end.get(node).copied().unwrap_or((0, 0));
        let same = if *p0 == p1 {
            format!(
                "same process, {:+.1} %",
                (r1 as f64 / (*r0).max(1) as f64 - 1.0) * 100.0
            )
        } else {
            format!("restarted during the run (pid {p0} -> {p1}), not compared")
        };
        println!("    {node}: {r0} -> {r1} ({same})");
    }
    if let Some(msg) = &r.canary {
        println!("\n  canary: {msg}");
    }
    for w in &r.warnings {
        println!("\n  warning: {w}");
    }
    if !c.notes.is_empty() {
        println!("\n  harness notes ({}):", c.notes.len());
        for n in c.notes.iter().take(10) {
            println!("    {n}");
        }
    }
    println!("\n  vipd logs:");
    let mut per_node: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    for (node, path) in &c.logs {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        let (w, e, p, _) = crate::bench::harness::text::log_findings(&log);
        let x = per_node.entry(node).or_default();
        x.0 += w;
        x.1 += e;
        x.2 += p;
    }
    for (node, (w, e, p)) in per_node {
        println!("    {node}: {w} WARN, {e} ERROR, {p} panics (all its processes)");
    }
}
