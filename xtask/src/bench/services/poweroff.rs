//! The poweroff phase that ends the `coldstart` scenario: the node carrying the most Service
//! addresses "loses power" as in `bench failover --scenario poweroff` (SIGKILL of its vipd
//! and its link cut at the same instant); every address it carried is polled until it
//! answers again from another node, while the two remaining nodes' eth0 and lo addresses are
//! sampled for an address on both at once. The same listings tell the poller which
//! addresses a remaining node carries ([`Poller::run`]): those are tried first; the
//! powered-off node, which still carries its addresses behind its cut link, does not count.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use xtask::lab::{NODES, Signal};

use super::context::Bench;
use super::http::{Poller, SAMPLE_INTERVAL, next_sample_start};
use super::scale::{answered_by, print_failures};
use crate::bench::harness::procfs::children_of;
use crate::bench::stats::{ms, summary_ms};

/// How long after the power-off each address the node carried may take to answer again.
pub const POWEROFF_LIMIT: Duration = Duration::from_secs(30);
/// Time between the starts of two samples of the remaining nodes' addresses: the poller's
/// listing interval, since one listing serves both (when a listing takes longer, the next
/// one starts that long after it ended: [`next_sample_start`]).
pub const CARRIER_SAMPLE_INTERVAL: Duration = SAMPLE_INTERVAL;
/// How long the remaining nodes are still sampled after the polling ended (a second node
/// taking an address just after the first answer is caught too).
pub const CARRIER_SAMPLE_TAIL: Duration = Duration::from_secs(2);
/// Double-carried addresses listed in the report.
pub const DOUBLE_CARRIERS_LISTED: usize = 5;

/// vipd's Service lease timing keys, in the order duration, renew deadline, retry period:
/// the Service key, the key it defaults to, and vipd's default (seconds).
const TIMING_KEYS: [(&str, &str, f64); 3] = [
    ("svc_leaseduration", "vip_leaseduration", 3.0),
    ("svc_renewdeadline", "vip_renewdeadline", 2.0),
    ("svc_retryperiod", "vip_retryperiod", 1.0),
];

/// One of the Service lease timings vipd runs with and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct TimingValue {
    /// Seconds.
    pub secs: f64,
    /// The setting it was read from (`svc_leaseduration`, `vip_leaseduration`), or `None`
    /// for vipd's default.
    pub key: Option<&'static str>,
}

/// The Service lease timings (duration, renew deadline, retry period) vipd resolves from the
/// settings `get` returns: each `svc_*` setting, else its `vip_*` one, else vipd's default
/// 3/2/1 s. A value that is not a number counts as unset (vipd would not have started).
pub fn service_lease_timing(get: impl Fn(&str) -> Option<String>) -> [TimingValue; 3] {
    TIMING_KEYS.map(|(svc, vip, default)| {
        [svc, vip]
            .into_iter()
            .find_map(|k| {
                let v: f64 = get(k)?.trim().parse().ok()?;
                (v.is_finite() && v > 0.0).then_some(TimingValue {
                    secs: v,
                    key: Some(k),
                })
            })
            .unwrap_or(TimingValue {
                secs: default,
                key: None,
            })
    })
}

/// `3/2/1 s (vipd's defaults)`, or with the settings they came from:
/// `9/6/3 s (svc_leaseduration=9, svc_renewdeadline=6, svc_retryperiod=3)`.
pub fn timing_text(t: &[TimingValue; 3]) -> String {
    let secs = t
        .iter()
        .map(|v| format!("{}", v.secs))
        .collect::<Vec<_>>()
        .join("/");
    let set: Vec<String> = t
        .iter()
        .filter_map(|v| Some(format!("{}={}", v.key?, v.secs)))
        .collect();
    if set.is_empty() {
        format!("{secs} s (vipd's defaults)")
    } else if set.len() == t.len() {
        format!("{secs} s ({})", set.join(", "))
    } else {
        format!("{secs} s ({}; the rest vipd's defaults)", set.join(", "))
    }
}

/// The node carrying the most addresses (the first by name on a tie); `None` when none
/// carries any.
pub fn most_carrying(carried: &BTreeMap<String, BTreeSet<IpAddr>>) -> Option<&str> {
    carried
        .iter()
        .filter(|(_, s)| !s.is_empty())
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
        .map(|(n, _)| n.as_str())
}

/// The "never two responders" count: samples of which watched addresses each remaining
/// node carries, and those in which an address was on two nodes or more.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DoubleCarriers {
    /// Samples taken.
    pub samples: usize,
    /// Samples in which some address was on two nodes or more.
    pub samples_with: usize,
    /// Distinct addresses ever seen on two nodes or more.
    pub addresses: BTreeSet<IpAddr>,
    /// The first [`DOUBLE_CARRIERS_LISTED`] of them, with when they were first seen so and
    /// on which nodes.
    pub first: Vec<(IpAddr, Duration, Vec<String>)>,
    /// How many addresses each node carried in the last sample, and how many none of them.
    pub last: Option<(BTreeMap<String, usize>, usize)>,
}

impl DoubleCarriers {
    /// Adds one sample, taken `at` after the power-off: the watched addresses `watched` and
    /// which of them each node carries.
    pub fn add(
        &mut self,
        at: Duration,
        watched: &BTreeSet<IpAddr>,
        carried: &BTreeMap<String, BTreeSet<IpAddr>>,
    ) {
        self.samples += 1;
        let mut on: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
        for (node, set) in carried {
            for a in set.iter().filter(|a| watched.contains(a)) {
                on.entry(*a).or_default().push(node.clone());
            }
        }
        let mut any = false;
        for (a, nodes) in on.iter().filter(|(_, n)| n.len() > 1) {
            any = true;
            if self.addresses.insert(*a) && self.first.len() < DOUBLE_CARRIERS_LISTED {
                self.first.push((*a, at, nodes.clone()));
            }
        }
        if any {
            self.samples_with += 1;
        }
        let per_node = carried
            .iter()
            .map(|(n, s)| (n.clone(), s.iter().filter(|a| watched.contains(a)).count()))
            .collect();
        self.last = Some((per_node, watched.len().saturating_sub(on.len())));
    }
}

/// The "never two responders" samples and the failed listings (count, first failure).
#[derive(Debug, Default)]
struct Sampled {
    dc: DoubleCarriers,
    errors: usize,
    first_error: Option<String>,
}

/// One sample of which of `watched` each of `nodes` carries ([`Bench::carried_on`]: two
/// address listings per node), taken `t0.elapsed()` after the power-off and added to
/// `sampled`; returns the addresses any of them carries (for [`Poller::run`]).
///
/// # Errors
/// When a listing fails (also counted in `sampled`).
fn sample_carriers(
    b: &Bench,
    nodes: &[&str],
    watched: &BTreeSet<IpAddr>,
    t0: Instant,
    sampled: &Mutex<Sampled>,
) -> Result<BTreeSet<IpAddr>> {
    let at = t0.elapsed();
    let sample: Result<BTreeMap<String, BTreeSet<IpAddr>>> = nodes
        .iter()
        .map(|n| Ok((n.to_string(), b.carried_on(n, watched)?)))
        .collect();
    let sample = sample.map(|mut s| {
        drop_inert_doubles(&mut s, |n| xtask::lab::FenceView::read(&b.lab, n));
        s
    });
    let mut s = sampled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match sample {
        Ok(sample) => {
            s.dc.add(at, watched, &sample);
            Ok(sample.into_values().flatten().collect())
        }
        Err(e) => {
            s.errors += 1;
            s.first_error.get_or_insert_with(|| format!("{e:#}"));
            Err(e)
        }
    }
}

/// Of the addresses on two nodes or more in `sample`, removes from each such node the ones
/// its nftables fence does not let it answer (`fence(node)`, read only when some address is
/// on two nodes): a Service VIP's address is the fence's second line and stays on a node
/// whose holder lost it, inert, for up to 300 s (docs/design.md, "The second line"); it is
/// no responder. The fence is read after the address listing, so an element that expired
/// in between counts as inert.
pub(super) fn drop_inert_doubles(
    sample: &mut BTreeMap<String, BTreeSet<IpAddr>>,
    fence: impl Fn(&str) -> xtask::lab::FenceView,
) {
    let mut seen: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for set in sample.values() {
        for a in set {
            *seen.entry(*a).or_default() += 1;
        }
    }
    let doubles: BTreeSet<IpAddr> = seen
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(a, _)| a)
        .collect();
    if doubles.is_empty() {
        return;
    }
    for (node, set) in sample.iter_mut() {
        if set.is_disjoint(&doubles) {
            continue;
        }
        let view = fence(node);
        set.retain(|a| !doubles.contains(a) || view.answers(*a));
    }
}

/// SIGKILL to `node`'s vipd and every process under it (SIGSTOP first when there are
/// several, so none reacts to another's death: a `VIPD_BENCH_WRAP` wrapper), as `bench
/// failover` kills a powered-off holder.
fn kill_node_vipd(b: &Bench, node: &str) -> Result<()> {
    let pid = b
        .pid(node)
        .ok_or_else(|| anyhow!("no vipd on {node} to power off"))?;
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        pids.extend(children_of(pids[i]));
        i += 1;
    }
    let kill = |p: i32, s: Signal| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), s);
    if pids.len() > 1 {
        for p in &pids {
            let _ = kill(*p, Signal::SIGSTOP);
        }
    }
    let mut killed = false;
    for p in &pids {
        killed |= kill(*p, Signal::SIGKILL).is_ok();
    }
    if !killed {
        bail!("could not SIGKILL {node}'s vipd (pids {pids:?})");
    }
    Ok(())
}

/// The poweroff phase: powers off the node whose vipd carries the most of `addrs` (SIGKILL
/// of its vipd and `Lab::cut_link`, as `bench failover --scenario poweroff`), polls every
/// address it carried from the client until it answers again or [`POWEROFF_LIMIT`] passed,
/// samples the two remaining nodes for addresses on both, and prints the figures. The
/// node stays off: run it last.
///
/// # Errors
/// When the addresses cannot be listed, the node cannot be powered off, or a poller
/// thread panicked.
pub fn run(b: &Bench, addrs: &[IpAddr]) -> Result<()> {
    let addr_set: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    let timing =
        service_lease_timing(|k| b.vipd_env.get(k).cloned().or_else(|| std::env::var(k).ok()));
    let carried = b.carried_sets(&addr_set)?;
    let Some(victim) = most_carrying(&carried).map(str::to_string) else {
        println!("  poweroff: no node carries any of the Service addresses; skipped");
        return Ok(());
    };
    let watched = carried.get(&victim).cloned().unwrap_or_default();
    let remaining: Vec<&str> = NODES.iter().copied().filter(|n| *n != victim).collect();
    let counts: BTreeMap<&str, usize> =
        carried.iter().map(|(n, s)| (n.as_str(), s.len())).collect();
    println!(
        "  poweroff: {victim} carries the most Service addresses ({counts:?}); SIGKILL of its vipd and its link cut, as `bench failover --scenario poweroff`"
    );
    println!(
        "    Service lease timing {}: compare max with lease duration + 1 s = {} s",
        timing_text(&timing),
        timing[0].secs + 1.0
    );

    let index: BTreeMap<IpAddr, usize> = addrs.iter().enumerate().map(|(i, a)| (*a, i)).collect();
    let poller = Poller::new(addrs.len(), POWEROFF_LIMIT);
    let sampled = Mutex::new(Sampled::default());
    let t0 = Instant::now();
    kill_node_vipd(b, &victim)?;
    b.lab.cut_link(&victim)?;
    let cut = t0.elapsed();
    // Added only now: an attempt before the cut could still reach the node's own backend.
    poller.add_all(
        watched
            .iter()
            .filter_map(|a| Some((*index.get(a)?, SocketAddr::new(*a, 80), t0))),
    );
    poller.close();
    // Only the remaining nodes count: the powered-off one still carries its addresses.
    let sample = || sample_carriers(b, &remaining, &watched, t0, &sampled);
    let polled = b.in_client(|| poller.run(&sample));
    let polling_done = t0.elapsed();
    // The tail: a second node taking an address just after the first answer is caught too.
    let tail_end = Instant::now() + CARRIER_SAMPLE_TAIL;
    while Instant::now() < tail_end {
        let started = Instant::now();
        let _ = sample();
        let next = next_sample_start(started, Instant::now(), CARRIER_SAMPLE_INTERVAL);
        if let Some(wait) = next.min(tail_end).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    polled??;
    let Sampled {
        dc,
        errors: sample_errors,
        first_error: first_sample_error,
    } = sampled
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);

    let answered = &poller.answered;
    let gaps: Vec<f64> = answered
        .iter()
        .filter_map(|a| Some(ms(a.get()?.at.saturating_duration_since(t0))))
        .collect();
    println!(
        "    SIGKILL + link cut took {:.0} ms; answered again {}/{} within {} s",
        ms(cut),
        gaps.len(),
        watched.len(),
        POWEROFF_LIMIT.as_secs()
    );
    println!(
        "    per address, power-off -> first answer: {}",
        summary_ms(&gaps)
    );
    let by = answered_by(answered);
    println!("    answered by: {by:?}");
    if let Some(n) = by.get(&victim) {
        println!("    !! {n} answers came from the powered-off {victim}");
    }
    print_failures(&poller.failures());
    println!(
        "    polling (carried counts on {} only): {}",
        remaining.join(" and "),
        poller.stats().line(polling_done)
    );
    let window = polling_done + CARRIER_SAMPLE_TAIL;
    println!(
        "    never two responders: {} of {} samples had an address answerable on both {} (on eth0 or lo and live in its nftables fence; one every {} ms unless a listing took longer, over {:.1} s: the polling and {} s after; expected 0)",
        dc.samples_with,
        dc.samples,
        remaining.join(" and "),
        CARRIER_SAMPLE_INTERVAL.as_millis(),
        window.as_secs_f64(),
        CARRIER_SAMPLE_TAIL.as_secs()
    );
    if !dc.addresses.is_empty() {
        println!(
            "      {} addresses on both at some sample; first ones:",
            dc.addresses.len()
        );
        for (a, at, nodes) in &dc.first {
            println!("      {a} on {} at {:.0} ms", nodes.join(" and "), ms(*at));
        }
    }
    if let Some((per_node, none)) = &dc.last {
        println!("      at the last sample: {per_node:?}, on neither: {none}");
    }
    if sample_errors > 0 {
        println!(
            "      {sample_errors} samples failed, first: {}",
            first_sample_error.unwrap_or_default()
        );
    }
    println!("    ({victim} stays off: its vipd's SIGKILL exit is listed below)");
    Ok(())
}
