//! `cargo xtask demo`: vipd's main job end to end, in about a minute.
//!
//! Builds vipd (release), starts a lab with an HTTP backend on every node, runs vipd in
//! control-plane mode on node-a, node-b and node-c (vipd's default lease timings), and
//! probes `http://192.0.2.10/` every 20 ms from ns `client` with `vipd probe`. Then it stops
//! the VIP holder twice (SIGTERM; then SIGKILL with the link cut at the same instant, the
//! `poweroff` case), printing each time who took over, the longest gap the client saw, the
//! probe's summary and the time two hosts answered ARP for the VIP (must be 0). Each round
//! is one trial of [`crate::bench::failover::trial::run_trial`], so the figures are measured exactly as
//! `cargo xtask bench failover` measures them. The lab is torn down at the end, also on
//! error.

use std::time::Instant;

use anyhow::{Result, bail};
use xtask::lab::{self, NAMESPACES, NODES};

use crate::bench::failover::scenario::Scenario;
use crate::bench::failover::trial::{TrialResult, run_trial};
use crate::bench::harness::VIP;
use crate::bench::harness::build::vipd_release_binary;
use crate::bench::harness::ctx::Ctx;
use crate::bench::harness::subject::{Subject, Timings};
use crate::bench::harness::text::or_none;

/// Runs the demo. See the module documentation.
///
/// # Errors
/// Not root, vipd does not build, the lab does not start, or a round cannot be set up.
pub fn run() -> Result<()> {
    crate::require_root("demo")?;
    // Fail early, with instructions, before the release build.
    let api = xtask::lab::find_apiserver()?;
    eprintln!("==> lab: kube-apiserver {}", api.display());
    let vipd = vipd_release_binary(true, None)?;
    let started = Instant::now();
    let ctx = Ctx::start(vipd, true)?;
    println!(
        "lab {} up in {:.1} s (API server {} {})",
        ctx.lab.prefix(),
        started.elapsed().as_secs_f64(),
        ctx.lab.api_url(),
        ctx.lab.server_version()?
    );
    for ns in NAMESPACES.iter().filter(|n| **n != "lan") {
        let addrs: Vec<String> = ctx
            .lab
            .addresses(ns, lab::ETH)?
            .iter()
            .filter(|a| a.scope == "global" && a.addr.is_ipv4())
            .map(|a| format!("{}/{}", a.addr, a.prefix))
            .collect();
        println!("  {ns:<7} {}  {}", ctx.lab.mac_of(ns)?, addrs.join(" "));
    }
    println!(
        "\nvipd manager on {} (control plane, VIP {}, lease timings: vipd defaults);\n\
         client: vipd probe http://{}/ --interval 20ms\n",
        NODES.join(", "),
        VIP,
        VIP
    );
    let subject = Subject::Vipd(Timings::parse("default")?);
    let rounds = [
        (Scenario::Graceful, "round 1: SIGTERM to the holder"),
        (
            Scenario::Poweroff,
            "round 2: SIGKILL to the holder and its link cut at the same instant",
        ),
    ];
    let mut results = Vec::new();
    for (i, (scenario, title)) in rounds.iter().enumerate() {
        println!("{title}");
        let r = run_trial(&ctx, *scenario, &subject, i + 1)?;
        print_round(&r);
        results.push(r);
    }
    println!("\nsummary:");
    for r in &results {
        println!(
            "  {:<9} {} -> {}: the client saw a gap of {} ms; two ARP responders for {:.0} ms",
            r.scenario.name(),
            r.holder,
            r.new_holder.as_deref().unwrap_or("nobody"),
            r.gap_ms
                .map(|g| format!("{g:.0}"))
                .unwrap_or_else(|| "?".into()),
            r.two_responders_ms
        );
    }
    let ok = results
        .iter()
        .all(|r| r.two_responders_ms == 0.0 && r.recovered && r.new_holder.is_some());
    drop(ctx);
    println!(
        "lab torn down; demo took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if !ok {
        bail!("a round did not fail over cleanly (see the notes above)");
    }
    Ok(())
}

fn print_round(r: &TrialResult) {
    let opt = |v: Option<f64>| {
        v.map(|v| format!("{v:.0} ms"))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "  {} held the VIP; {} carried it {} after the event (old address gone after {})",
        r.holder,
        r.new_holder.as_deref().unwrap_or("nobody"),
        opt(r.takeover_ms),
        opt(r.old_gone_ms)
    );
    println!(
        "  client: {} requests, {} failed, longest gap {}, switches: {}",
        r.probe_requests,
        r.probe_failures,
        opt(r.gap_ms),
        or_none(&r.probe_switches, "; ")
    );
    println!(
        "  two hosts answering ARP for the VIP: {:.0} ms",
        r.two_responders_ms
    );
    for n in &r.notes {
        println!("  note: {n}");
    }
}
