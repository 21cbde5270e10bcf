//! The `churn` scenario of `bench services`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::context::{Bench, NodeSample};
use super::http::poll_until_answer;
use super::*;
use crate::bench::stats::{ms, summary_ms};

/// Per-minute sample of the churn run.
struct ChurnSample {
    minute: f64,
    cycles: usize,
    nodes: Vec<(String, NodeSample)>,
}

/// Scenario (c), `churn`: runs it in a lab of its own and prints its figures.
///
/// # Errors
/// When the lab or vipd cannot start, or the scenario cannot run.
pub fn run(vipd: &Path, minutes: f64, verbose: bool) -> Result<()> {
    println!(
        "== bench services: churn ({CHURN_SERVICES} Services created/answered/deleted in a loop for {minutes} min)"
    );
    let b = Bench::start(vipd, verbose)?;
    let (names, addrs) = services("churn", CHURN_SERVICES, v4_address)?;
    let addr_set: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    let run_for = Duration::from_secs_f64(minutes * 60.0);
    let t0 = Instant::now();
    let mut run = ChurnRun::default();
    let mut next_sample = Duration::ZERO;
    loop {
        // Create all, wait for every answer (one poller thread per Service).
        for r in churn_up(&b, &names, &addrs)? {
            match r {
                Ok(l) => run.up_ms.push(l),
                Err(e) => run.problems.push(format!("cycle {}: {e:#}", run.cycles)),
            }
        }
        run.cycles += 1;
        let elapsed = t0.elapsed();
        let last = elapsed >= run_for;
        if run.cycles == 1 || last || elapsed >= next_sample {
            // Sample with the Services up, the same state each time.
            std::thread::sleep(Duration::from_secs(1));
            run.series.push(ChurnSample {
                minute: t0.elapsed().as_secs_f64() / 60.0,
                cycles: run.cycles,
                nodes: b.samples(),
            });
            next_sample = elapsed + Duration::from_secs(60);
            eprintln!(
                "  churn: {:.1} min, {} cycles, {} problems",
                elapsed.as_secs_f64() / 60.0,
                run.cycles,
                run.problems.len()
            );
        }
        churn_down(&b, &names, &addr_set, &mut run)?;
        if last {
            break;
        }
    }
    let leftover = churn_leftover_leases(&b)?;
    std::thread::sleep(Duration::from_secs(1));
    let idle_after = b.samples();
    print_churn(&run, t0, &leftover, &idle_after);
    b.finish();
    Ok(())
}

/// What the churn loop recorded.
#[derive(Default)]
struct ChurnRun {
    /// Completed create/answer/delete cycles.
    cycles: usize,
    /// Per Service and cycle: create call returned -> first answer, ms.
    up_ms: Vec<f64>,
    /// Per cycle: first delete call -> no node carries any address, ms.
    gone_ms: Vec<f64>,
    problems: Vec<String>,
    series: Vec<ChurnSample>,
}

/// Creates every Service (one thread each) and waits up to 30 s for its first answer;
/// returns each one's create -> answer time in ms, or what went wrong.
fn churn_up(b: &Bench, names: &[String], addrs: &[IpAddr]) -> Result<Vec<Result<f64>>> {
    b.in_client(|| {
        std::thread::scope(|s| {
            let handles: Vec<_> = names
                .iter()
                .zip(addrs)
                .map(|(name, addr)| {
                    s.spawn(move || -> Result<f64> {
                        if !b.create(name, *addr) {
                            bail!("{name}: create failed");
                        }
                        let c = Instant::now();
                        let a = poll_until_answer(
                            SocketAddr::new(*addr, 80),
                            c + Duration::from_secs(30),
                        )?;
                        Ok(ms(a.at.duration_since(c)))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("poller panicked"))))
                .collect()
        })
    })
}

/// Deletes every Service and waits (up to 30 s) until no node carries any of `addr_set`,
/// recording the time or a problem in `run`.
fn churn_down(
    b: &Bench,
    names: &[String],
    addr_set: &BTreeSet<IpAddr>,
    run: &mut ChurnRun,
) -> Result<()> {
    let d0 = Instant::now();
    b.in_client(|| {
        for name in names {
            b.delete(name);
        }
    })?;
    let d1 = Instant::now();
    loop {
        let carried: usize = b.carried(addr_set)?.values().sum();
        if carried == 0 {
            run.gone_ms
                .push(ms(d1.duration_since(d0)) + ms(d1.elapsed()));
            break;
        }
        if d1.elapsed() > Duration::from_secs(30) {
            run.problems.push(format!(
                "cycle {}: {carried} addresses still carried 30 s after the deletes",
                run.cycles
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Leases left behind once every Service is gone (vipd deletes them, S17), after up to
/// 15 s.
fn churn_leftover_leases(b: &Bench) -> Result<BTreeMap<String, String>> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let leftover = loop {
        let (_, leases) = b.in_client(|| b.leases())??;
        if leases.is_empty() || Instant::now() > deadline {
            break leases;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    Ok(leftover)
}

/// Prints the churn figures: cycles, latencies, problems, leftover Leases, the per-minute
/// samples, start -> end growth and the idle samples after the last delete.
fn print_churn(
    run: &ChurnRun,
    t0: Instant,
    leftover: &BTreeMap<String, String>,
    idle_after: &[(String, NodeSample)],
) {
    println!(
        "  {} cycles in {:.1} min ({} Service creations)",
        run.cycles,
        t0.elapsed().as_secs_f64() / 60.0,
        run.cycles * CHURN_SERVICES
    );
    println!("  created -> first answer: {}", summary_ms(&run.up_ms));
    println!(
        "  delete calls -> no node carries the 20 addresses: {}",
        summary_ms(&run.gone_ms)
    );
    println!("  problems: {}", run.problems.len());
    for p in run.problems.iter().take(8) {
        println!("    {p}");
    }
    println!(
        "  Leases left 15 s after the last delete: {} {:?}",
        leftover.len(),
        leftover.keys().take(5).collect::<Vec<_>>()
    );
    println!("  samples (Services up):");
    for s in &run.series {
        for (n, ns) in &s.nodes {
            println!(
                "    {:>5.1} min, cycle {:>4}, {n}: {}",
                s.minute,
                s.cycles,
                ns.line()
            );
        }
    }
    if let (Some(first), Some(last)) = (run.series.first(), run.series.last()) {
        println!("  start -> end:");
        for ((n, a), (_, z)) in first.nodes.iter().zip(&last.nodes) {
            let d = |a: Option<u64>, z: Option<u64>| match (a, z) {
                (Some(a), Some(z)) => format!("{:+}", z as i64 - a as i64),
                _ => "?".into(),
            };
            println!(
                "    {n}: RSS {} -> {} KiB ({}), threads {} -> {} ({}), tasks {:?} -> {:?}",
                a.rss_kib.map_or("?".into(), |v| v.to_string()),
                z.rss_kib.map_or("?".into(), |v| v.to_string()),
                d(a.rss_kib, z.rss_kib),
                a.threads.map_or("?".into(), |v| v.to_string()),
                z.threads.map_or("?".into(), |v| v.to_string()),
                d(a.threads, z.threads),
                a.tasks,
                z.tasks
            );
        }
    }
    println!("  after the last delete (no Services):");
    for (n, s) in idle_after {
        println!("    {n}: {}", s.line());
    }
}
