//! `--cp-and-service`: a trial starts vipd on one node first, waits until it carries both
//! VIPs, then starts the others and waits until they follow both Leases.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use xtask::lab::NODES;

use crate::bench::harness::cluster::{Cluster, prepare_trial, reachable_holder};
use crate::bench::harness::ctx::Ctx;
use crate::bench::harness::subject::Subject;
use crate::bench::harness::text::tail;
use crate::bench::harness::{LEASE_NAME, LEASE_NAMESPACE, SERVICES_LEASE_NAME};

/// `--cp-and-service`: clears what a previous trial may have left ([`prepare_trial`]),
/// starts vipd on one node (node-a, node-b, node-c by trial number), waits until that node
/// carries every VIP of the run and the client reaches each, then starts the other nodes
/// and waits until each follows every Lease of the run.
pub fn start_one_node_first(
    ctx: &Ctx,
    subject: &Subject,
    trial: usize,
    notes: &mut Vec<String>,
) -> Result<Cluster> {
    prepare_trial(ctx, subject, notes)?;
    let first = NODES[trial.saturating_sub(1) % NODES.len()];
    let mut cluster = Cluster::empty();
    cluster.add(ctx, subject, first)?;
    let h = reachable_holder(ctx, subject, &cluster)?;
    if h != first {
        bail!("{h} carries the VIPs, but only {first} runs vipd");
    }
    let others: Vec<&str> = NODES.iter().copied().filter(|n| *n != first).collect();
    for n in &others {
        cluster.add(ctx, subject, n)?;
    }
    let leases = [LEASE_NAME, SERVICES_LEASE_NAME].map(|l| format!("{LEASE_NAMESPACE}/{l}"));
    let t0 = Instant::now();
    for n in &others {
        loop {
            let log = cluster.log(n);
            let missing: Vec<&String> =
                leases.iter().filter(|l| !follows(&log, l, first)).collect();
            if missing.is_empty() {
                break;
            }
            if t0.elapsed() > Duration::from_secs(15) {
                bail!(
                    "{n} does not follow {missing:?} held by {first} after 15 s; log:\n{}",
                    tail(&log, 15)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(cluster)
}

/// Whether a vipd log (`vip_loglevel=info`) says it follows `lease` (`NAMESPACE/NAME`)
/// held by `holder`: vipd's `following` line with `lease=` and `holder=` fields.
pub fn follows(log: &str, lease: &str, holder: &str) -> bool {
    log.lines().any(|l| {
        l.contains("following")
            && l.contains(&format!("lease={lease}"))
            && l.contains(&format!("holder={holder}"))
    })
}
