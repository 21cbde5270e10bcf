//! The `coldstart` scenario of `bench services`: the Services exist before any vipd runs.
//!
//! Three phases in one lab: the Services are created while no vipd runs; vipd starts on the
//! three nodes and every Service is polled from that instant until it first answers; after
//! the steady state of `scale`, the [`poweroff`](super::poweroff) phase powers off the node
//! carrying the most Service addresses (SIGKILL of its vipd and its link cut, as `bench
//! failover --scenario poweroff`) and measures, per address it carried, the time until the
//! address answers again from another node ([`POWEROFF_LIMIT`](super::poweroff::POWEROFF_LIMIT)
//! at most), while the two remaining nodes' eth0 addresses are sampled for an address on
//! both ("never two responders"); it prints the Service lease timing vipd ran with, so the
//! slowest takeover can be compared with the lease duration + 1 s.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use xtask::lab::NODES;

use super::context::Bench;
use super::http::{Answer, Poller};
use super::scale::{answered_by, create_services, print_failures, scale_steady_state};
use super::*;
use crate::bench::harness::CREATE_THREADS;
use crate::bench::stats::{ms, summary_ms};

/// How long after vipd started each of `n` Services may take to answer: 60 s + `n` / 100 s.
pub fn coldstart_limit(n: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(10 * n as u64)
}

/// Scenario `coldstart`: runs it in a lab of its own and prints its figures.
///
/// # Errors
/// When the lab or vipd cannot start, or the scenario cannot run.
pub fn run(vipd: &Path, n: usize, verbose: bool) -> Result<()> {
    println!(
        "== bench services: coldstart ({n} IPv6 Services created before vipd starts, svc_election, 3 nodes)"
    );
    let mut b = Bench::start_lab(verbose, |_| Ok(()))?;
    let addrs = (0..n).map(scale_address).collect::<Result<Vec<_>>>()?;

    // The Services, while no vipd runs.
    let create_failures = std::sync::Mutex::new(Vec::new());
    let c0 = Instant::now();
    let created = b.in_client(|| {
        create_services(&b, &addrs, &|_, _, _| {}, &|msg| {
            if let Ok(mut f) = create_failures.lock() {
                f.push(msg);
            }
        })
    })??;
    let create_secs = c0.elapsed().as_secs_f64();
    let created_n = created.iter().filter(|c| c.get().is_some()).count();
    println!(
        "  created {created_n}/{n} Services in {create_secs:.1} s ({:.0}/s, {CREATE_THREADS} threads), no vipd running",
        created_n as f64 / create_secs
    );
    print_failures(&create_failures.into_inner().unwrap_or_default());

    // vipd on the three nodes; every created Service is polled from the first spawn on.
    let poller = Poller::new(n, coldstart_limit(n));
    let addr_set: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    let t0 = b.spawn_vipd(vipd, &[])?;
    let spawned = t0.elapsed();
    poller.add_all(
        created
            .iter()
            .enumerate()
            .filter(|(_, c)| c.get().is_some())
            .map(|(i, _)| (i, SocketAddr::new(addrs[i], 80), t0)),
    );
    poller.close();
    let (healthy, polled) = std::thread::scope(|s| {
        let healthy = s.spawn(|| {
            let r = b.wait_healthy().map(|()| t0.elapsed());
            if r.is_err() {
                poller.abandon();
            }
            r
        });
        let carried = || b.carried_by(&NODES, &addr_set);
        let polled = b.in_client(|| poller.run(&carried));
        (healthy.join(), polled)
    });
    let all_done = t0.elapsed();
    let healthy = healthy.map_err(|_| anyhow!("readiness thread panicked"))??;
    polled??;

    let answered = &poller.answered;
    let per_service: Vec<f64> = answered
        .iter()
        .filter_map(|a| Some(ms(a.get()?.at.saturating_duration_since(t0))))
        .collect();
    let answered_n = per_service.len();
    let last_answer = answered.iter().filter_map(|a| a.get().map(|a| a.at)).max();
    println!(
        "  vipd spawned on {} nodes in {:.0} ms; all healthy (/healthz, Services watch) {:.2} s after the first spawn",
        NODES.len(),
        ms(spawned),
        healthy.as_secs_f64()
    );
    println!(
        "  answered {answered_n}/{n}; {} after vipd started",
        match last_answer {
            Some(l) if answered_n == n =>
                format!("all answered {:.2} s", l.duration_since(t0).as_secs_f64()),
            Some(l) => format!(
                "not all answered; the last answer {:.2} s",
                l.duration_since(t0).as_secs_f64()
            ),
            None => "none answered within the limit".into(),
        }
    );
    println!(
        "  per Service, vipd start -> first answer: {}",
        summary_ms(&per_service)
    );
    println!("  answered by: {:?}", answered_by(answered));
    print_failures(&poller.failures());
    // All Services wait from the same instant: an address is tried first once a listing
    // shows it carried, so the listing interval and the delay to that try bound how closely
    // a first answer is seen.
    println!(
        "  polling: {}; limit {:.0} s",
        poller.stats().line(all_done),
        coldstart_limit(n).as_secs_f64()
    );
    if b.verbose {
        for (i, d) in slowest(answered, t0, 5) {
            b.say(format!(
                "slow: scale-{i} ({}) answered after {:.0} ms",
                addrs[i],
                ms(d)
            ));
        }
    }

    scale_steady_state(&b, &addrs, &[])?;
    // Last: the powered-off node stays off until the lab goes.
    let poweroff = super::poweroff::run(&b, &addrs);
    b.finish();
    poweroff
}

/// The `k` Services that answered last (index, time from `t0`), slowest first.
pub fn slowest(answered: &[OnceLock<Answer>], t0: Instant, k: usize) -> Vec<(usize, Duration)> {
    let mut v: Vec<(usize, Duration)> = answered
        .iter()
        .enumerate()
        .filter_map(|(i, a)| Some((i, a.get()?.at.saturating_duration_since(t0))))
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(k);
    v
}
