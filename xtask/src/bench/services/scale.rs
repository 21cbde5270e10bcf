//! The `scale` scenario of `bench services`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use xtask::lab::NODES;

use super::context::{Bench, NodeSample};
use super::http::{Answer, Poller};
use super::*;
use crate::bench::harness::CREATE_THREADS;
use crate::bench::harness::procfs::{cpu_percent, proc_status};
use crate::bench::harness::text::metric_sum;
use crate::bench::stats::{ms, summary_ms};

/// Scenario (b), `scale`: runs it in a lab of its own and prints its figures.
///
/// # Errors
/// When the lab or vipd cannot start, or the scenario cannot run.
pub fn run(vipd: &Path, n: usize, verbose: bool) -> Result<()> {
    println!("== bench services: scale ({n} IPv6 Services, svc_election, 3 nodes)");
    let b = Bench::start(vipd, verbose)?;
    let addrs = (0..n).map(scale_address).collect::<Result<Vec<_>>>()?;
    let idle = b.samples();
    let limit = Duration::from_secs(60 + n as u64 / 10);
    let run = scale_create(&b, &addrs, limit)?;
    print_scale_creation(n, &run);
    scale_steady_state(&b, &addrs, &idle)?;
    b.finish();
    Ok(())
}

/// What the creation phase of the scale scenario recorded, per Service in address order.
struct ScaleRun {
    /// Just before the first create call.
    t0: Instant,
    /// When the last create call returned.
    create_done: Instant,
    /// When every poller had finished.
    all_done: Instant,
    /// When each Service's create call returned (unset: it failed).
    created: Vec<OnceLock<Instant>>,
    /// Each Service's first answer and the failures (creates too).
    poller: Poller,
}

/// Creates a Service per address ([`create_services`]); a [`Poller`] tries the created ones
/// not answered yet until each answers or `limit` after its create passed, those that a
/// node carries first ([`Poller::run`], every node counts).
fn scale_create(b: &Bench, addrs: &[IpAddr], limit: Duration) -> Result<ScaleRun> {
    let poller = Poller::new(addrs.len(), limit);
    let addr_set: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    let carried = || b.carried_by(&NODES, &addr_set);
    let t0 = Instant::now();
    let (created, create_done) = b.in_client(|| {
        std::thread::scope(|s| -> Result<_> {
            let polling = s.spawn(|| poller.run(&carried));
            let created = create_services(
                b,
                addrs,
                &|i, addr, at| poller.add(i, SocketAddr::new(addr, 80), at),
                &|msg| poller.fail(msg),
            );
            let create_done = Instant::now();
            poller.close();
            polling
                .join()
                .map_err(|_| anyhow!("poller thread panicked"))??;
            Ok((created?, create_done))
        })
    })??;
    Ok(ScaleRun {
        t0,
        create_done,
        all_done: Instant::now(),
        created,
        poller,
    })
}

/// Creates `scale-<i>` with address `addrs[i]`, for every `i`, from [`CREATE_THREADS`]
/// threads (thread `k` creates `k`, `k + CREATE_THREADS`, ...); must run inside the client
/// namespace. Calls `on_created(i, address, instant its create returned)` for each Service
/// created and `fail` for each create that failed. Returns when each Service's create
/// returned (unset: it failed).
///
/// # Errors
/// When a creator thread panicked.
pub(super) fn create_services(
    b: &Bench,
    addrs: &[IpAddr],
    on_created: &(dyn Fn(usize, IpAddr, Instant) + Sync),
    fail: &(dyn Fn(String) + Sync),
) -> Result<Vec<OnceLock<Instant>>> {
    let created: Vec<OnceLock<Instant>> = (0..addrs.len()).map(|_| OnceLock::new()).collect();
    std::thread::scope(|s| {
        let mut creators = Vec::new();
        for k in 0..CREATE_THREADS {
            let created = &created;
            creators.push(s.spawn(move || {
                for i in (k..addrs.len()).step_by(CREATE_THREADS) {
                    let addr = addrs[i];
                    if !b.create(&format!("scale-{i}"), addr) {
                        fail(format!("scale-{i}: create failed"));
                        continue;
                    }
                    let at = Instant::now();
                    let _ = created[i].set(at);
                    on_created(i, addr, at);
                }
            }));
        }
        for c in creators {
            c.join().map_err(|_| anyhow!("creator thread panicked"))?;
        }
        Ok(())
    })
    .map(|()| created)
}

/// How many first answers came from each node.
pub(super) fn answered_by(answered: &[OnceLock<Answer>]) -> BTreeMap<String, usize> {
    let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
    for a in answered.iter().filter_map(OnceLock::get) {
        *by_node.entry(a.node.clone()).or_default() += 1;
    }
    by_node
}

/// Prints how many failures there were and the first five.
pub(super) fn print_failures(fails: &[String]) {
    if !fails.is_empty() {
        println!("  {} failures, first ones:", fails.len());
        for f in fails.iter().take(5) {
            println!("    {f}");
        }
    }
}

/// Prints the creation phase: rate, time until all answered, per-Service latency, the
/// answering nodes, the first failures and the polling figures
/// ([`PollStats::line`](super::http::PollStats::line)).
fn print_scale_creation(n: usize, run: &ScaleRun) {
    let answered = &run.poller.answered;
    let created_n = run.created.iter().filter(|c| c.get().is_some()).count();
    let answered_n = answered.iter().filter(|a| a.get().is_some()).count();
    let per_service: Vec<f64> = run
        .created
        .iter()
        .zip(answered)
        .filter_map(|(c, a)| Some(ms(a.get()?.at.saturating_duration_since(*c.get()?))))
        .collect();
    let last_answer = answered.iter().filter_map(|a| a.get().map(|a| a.at)).max();
    let create_secs = run.create_done.duration_since(run.t0).as_secs_f64();
    println!(
        "  created {created_n}/{n} Services in {create_secs:.1} s ({:.0}/s, {CREATE_THREADS} threads)",
        created_n as f64 / create_secs
    );
    println!(
        "  answered {answered_n}/{n}; all answered {} after the first create call, {} after the last create returned",
        last_answer.map_or("never".into(), |l| format!(
            "{:.2} s",
            l.duration_since(run.t0).as_secs_f64()
        )),
        last_answer.map_or("n/a".into(), |l| format!(
            "{:.2} s",
            l.saturating_duration_since(run.create_done).as_secs_f64()
        )),
    );
    println!(
        "  per Service, own create -> first answer: {}",
        summary_ms(&per_service)
    );
    println!("  answered by: {:?}", answered_by(answered));
    print_failures(&run.poller.failures());
    println!(
        "  polling: {}",
        run.poller.stats().line(run.all_done.duration_since(run.t0))
    );
}

/// The steady state's window: [`STEADY_WINDOW`], or `VIPD_BENCH_WINDOW_SECS` (whole
/// seconds, at least 1; e.g. 150 for one whole period of the Service VIPs' second-line
/// refresh, whose burst a 10 s window may or may not catch).
///
/// # Errors
/// A value that is not a whole number of seconds of at least 1, naming the variable and the
/// value.
fn steady_window() -> Result<Duration> {
    window_from(std::env::var("VIPD_BENCH_WINDOW_SECS").ok().as_deref())
}

/// [`steady_window`] from the variable's value (`None`: unset).
fn window_from(value: Option<&str>) -> Result<Duration> {
    let Some(v) = value else {
        return Ok(STEADY_WINDOW);
    };
    match v.trim().parse::<u64>() {
        Ok(secs) if secs >= 1 => Ok(Duration::from_secs(secs)),
        Ok(_) => Err(anyhow!(
            "VIPD_BENCH_WINDOW_SECS={v:?}: must be at least 1 second"
        )),
        Err(e) => Err(anyhow!(
            "VIPD_BENCH_WINDOW_SECS={v:?}: not a whole number of seconds ({e})"
        )),
    }
}

/// How long the steady state waits after the last answer before its window: 5 s, or
/// `VIPD_BENCH_SETTLE_SECS` (whole seconds; e.g. 60 to measure a node at rest after the
/// bring-up's status writes and the allocator's passes have ended).
///
/// # Errors
/// A value that is not a whole number of seconds, naming the variable and the value.
fn steady_settle() -> Result<Duration> {
    match std::env::var("VIPD_BENCH_SETTLE_SECS") {
        Err(_) => Ok(Duration::from_secs(5)),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|e| {
                anyhow!("VIPD_BENCH_SETTLE_SECS={v:?}: not a whole number of seconds ({e})")
            }),
    }
}

/// Steady state: lets renewals settle, then watches Leases and samples CPU for the
/// window ([`steady_window`]), and prints them with the carried addresses and each node's sample
/// (RSS before the Services from `idle`; none printed for a node not in `idle`).
pub(super) fn scale_steady_state(
    b: &Bench,
    addrs: &[IpAddr],
    idle: &[(String, NodeSample)],
) -> Result<()> {
    // Steady state: let renewals settle, then watch Leases and sample CPU for the window.
    let settle = steady_settle()?;
    let window = steady_window()?;
    std::thread::sleep(settle);
    let addr_set: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    let carried = b.carried(&addr_set)?;
    let mut pids: Vec<i32> = NODES.iter().filter_map(|n| b.pid(n)).collect();
    let cp = b.lab.control_plane_pids();
    pids.extend(&cp);
    // The Service passes each node makes in the window (count and seconds of
    // `vipd_services_pass_duration_seconds`): a node at rest makes none.
    let passes = |b: &Bench| -> Vec<(Option<f64>, Option<f64>)> {
        NODES
            .iter()
            .map(|n| {
                let m = b.metrics_get(n, "/metrics").unwrap_or_default();
                (
                    metric_sum(&m, "vipd_services_pass_duration_seconds_count"),
                    metric_sum(&m, "vipd_services_pass_duration_seconds_sum"),
                )
            })
            .collect()
    };
    let passes_before = passes(b);
    let (watch, rest, cpu) = std::thread::scope(|s| {
        let w = s.spawn(|| b.in_client(|| b.lease_writes(window)));
        let r = s.spawn(|| b.in_client(|| b.rest_writes(window)));
        let cpu = cpu_percent(&pids, window);
        (w.join(), r.join(), cpu)
    });
    let (_, holders) = b.in_client(|| b.leases_at("/apis/coordination.k8s.io/v1/leases"))??;
    let mut lease_by_holder: BTreeMap<String, usize> = BTreeMap::new();
    for h in holders.values() {
        *lease_by_holder
            .entry(if h.is_empty() {
                "<none>".into()
            } else {
                h.clone()
            })
            .or_default() += 1;
    }
    println!(
        "  steady state ({} s window, {} s after the last answer):",
        window.as_secs(),
        settle.as_secs()
    );
    match watch {
        Ok(Ok(Ok(w))) => println!(
            "    Lease writes: {} in {:.1} s = {:.0}/s over {} Leases ({:.2} per Lease per s); holder changes: {}",
            w.writes,
            w.seconds,
            w.per_s,
            w.leases,
            w.per_s / (w.leases.max(1) as f64),
            w.holder_changes
        ),
        Ok(Ok(Err(e))) => println!("    Lease writes: watch failed: {e:#}"),
        Ok(Err(e)) => println!("    Lease writes: {e:#}"),
        Err(_) => println!("    Lease writes: watch thread panicked"),
    }
    let passes_after = passes(b);
    let pass_line: Vec<String> = NODES
        .iter()
        .zip(passes_before.iter().zip(&passes_after))
        .map(|(n, ((c0, s0), (c1, s1)))| match (c0, c1, s0, s1) {
            (Some(c0), Some(c1), Some(s0), Some(s1)) => {
                format!("{n} {:.0} ({:.0} ms)", c1 - c0, (s1 - s0) * 1000.0)
            }
            _ => format!("{n} ?"),
        })
        .collect();
    println!(
        "    Service passes in the window (vipd_services_pass_duration_seconds): {}",
        pass_line.join(", ")
    );
    match rest {
        Ok(Ok(Ok(r))) => println!(
            "    Service writes: {} on {} Services in {:.1} s, by writer {:?}; Event writes: {}, by reason {:?}",
            r.service_writes,
            r.services_written,
            r.seconds,
            r.service_by_writer,
            r.event_writes,
            r.event_by_reason
        ),
        Ok(Ok(Err(e))) => println!("    Service and Event writes: watch failed: {e:#}"),
        Ok(Err(e)) => println!("    Service and Event writes: {e:#}"),
        Err(_) => println!("    Service and Event writes: watch thread panicked"),
    }
    println!("    Leases by holder: {lease_by_holder:?}");
    println!("    addresses carried on eth0 or lo: {carried:?}");
    let pct = |v: Option<&Option<f64>>| {
        v.copied()
            .flatten()
            .map_or("?".into(), |p| format!("{p:.1}%"))
    };
    for (i, node) in NODES.iter().enumerate() {
        let s = b.sample(node);
        let before = idle.iter().find(|(n, _)| n == node).map(|(_, s)| {
            let rss = s
                .rss_kib
                .map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0));
            format!(" | RSS before the Services {rss} MiB")
        });
        println!(
            "    {node}: CPU {} | {}{}",
            pct(cpu.get(i)),
            s.line(),
            before.unwrap_or_default()
        );
    }
    println!(
        "    etcd CPU {}, kube-apiserver CPU {} (RSS {:.0} MiB)",
        pct(cpu.get(NODES.len())),
        pct(cpu.get(NODES.len() + 1)),
        cp.get(1)
            .and_then(|p| proc_status(*p, "VmRSS"))
            .map_or(f64::NAN, |k| k as f64 / 1024.0)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_window_is_ten_seconds_or_the_variables_whole_seconds() {
        assert_eq!(window_from(None).unwrap(), STEADY_WINDOW);
        assert_eq!(
            window_from(Some(" 150 ")).unwrap(),
            Duration::from_secs(150)
        );
        for bad in ["0", "1.5", "-3", "soon"] {
            let e = window_from(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("VIPD_BENCH_WINDOW_SECS") && e.contains(bad),
                "{bad}: {e}"
            );
        }
    }
}
