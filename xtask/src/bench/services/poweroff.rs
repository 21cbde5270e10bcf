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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use xtask::lab::{NODES, Signal};

use super::context::{Bench, LeaseSeen};
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

/// Leases listed one by one in the poweroff report (those taken last): a shard holder holds
/// a few, a per-Service holder hundreds.
pub const LEASES_LISTED: usize = 16;

/// What the bench's lease watch saw of one lease the powered-off node held, by the arrival
/// times of the watch's events at the bench ([`LeaseMoves`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseMove {
    /// When the last write still naming the powered-off node arrived.
    pub last_renewal: Option<Instant>,
    /// When the first write naming another holder arrived, and that holder.
    pub taken: Option<(Instant, String)>,
}

/// The leases the powered-off node held and how they moved: fed with each lease write the
/// bench's watch receives (from a few seconds before the power-off), it tells per lease the
/// last renewal seen and the first write by another holder after the power-off. A follower
/// may take a lease once the lease duration has passed since it saw the last renewal
/// (client-go's `observedTime`), so `taken - last_renewal - lease duration` is the time the
/// survivors' elections took beyond the expiry, the watch's delivery delays mostly
/// cancelling out. Only leases of the Service lease duration are followed (shards,
/// per-Service leases, the allocator's); the others (the lease collector's, 15 s) are named
/// apart: they cannot move within the phase.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseMoves {
    victim: String,
    /// By `namespace/name`.
    pub moves: BTreeMap<String, LeaseMove>,
    /// The victim's leases of another duration: `namespace/name` and seconds.
    pub other_durations: Vec<(String, f64)>,
    /// When the node was powered off; a take seen before it was no take-over (the lease
    /// is then no longer followed).
    powered_off: Option<Instant>,
}

impl LeaseMoves {
    /// Follows the leases of `listed` that `victim` holds and whose duration is
    /// `duration_secs` (the Service lease duration); sets the victim's others apart.
    pub fn new(victim: &str, listed: &[LeaseSeen], duration_secs: f64) -> LeaseMoves {
        let mut out = LeaseMoves {
            victim: victim.to_string(),
            ..LeaseMoves::default()
        };
        for l in listed.iter().filter(|l| l.holder == victim) {
            match l.duration_secs {
                Some(d) if (d - duration_secs).abs() > 1e-9 => {
                    out.other_durations.push((l.key(), d));
                }
                _ => {
                    out.moves.insert(l.key(), LeaseMove::default());
                }
            }
        }
        out
    }

    /// The node was powered off `at`.
    pub fn powered_off(&mut self, at: Instant) {
        self.powered_off = Some(at);
    }

    /// A write of `lease` (`namespace/name`) naming `holder` arrived `at`. Writes of other
    /// leases are ignored, and so is every write after the first by another holder; a
    /// lease another node took before the power-off is no longer followed.
    pub fn observe(&mut self, at: Instant, lease: &str, holder: &str) {
        let victim = &self.victim;
        let Some(m) = self.moves.get_mut(lease) else {
            return;
        };
        if m.taken.is_some() {
            return;
        }
        if holder == victim {
            m.last_renewal = Some(at);
        } else if self.powered_off.is_some_and(|t0| at >= t0) {
            m.taken = Some((at, holder.to_string()));
        } else {
            self.moves.remove(lease);
        }
    }

    /// The report's lines for a power-off at `t0` with leases of `duration`: a summary,
    /// then per lease (at most [`LEASES_LISTED`]: those not taken first, then the ones
    /// taken last) its last renewal seen and its take, relative to `t0` (ms), and the
    /// take's delay beyond the expiry; then the leases of other durations.
    pub fn lines(&self, t0: Instant, duration: Duration) -> Vec<String> {
        let rel = |at: Instant| match at.checked_duration_since(t0) {
            Some(d) => ms(d),
            None => -ms(t0.saturating_duration_since(at)),
        };
        let mut taken_ms = Vec::new();
        let mut late_ms = Vec::new();
        let mut per_lease = Vec::new();
        for (name, m) in &self.moves {
            let seen = m.last_renewal.map(rel);
            let took = m.taken.as_ref().map(|(at, h)| (rel(*at), h));
            let late = match (seen, &took) {
                (Some(s), Some((t, _))) => Some(*t - s - ms(duration)),
                _ => None,
            };
            if let Some((t, _)) = took {
                taken_ms.push(t);
            }
            late_ms.extend(late);
            let order = took.map_or(f64::INFINITY, |(t, _)| t);
            per_lease.push((
                order,
                format!(
                    "{name}: last renewal seen {}, taken {}{}",
                    seen.map_or("never".into(), |s| format!("{s:+.0} ms")),
                    took.map_or("not within the watch".into(), |(t, h)| format!(
                        "{t:+.0} ms by {h}"
                    )),
                    late.map_or(String::new(), |l| format!(" ({l:+.0} ms after its expiry)")),
                ),
            ));
        }
        per_lease.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut out = vec![format!(
            "leases it held of the Service lease duration ({}), as the bench's lease watch saw them: taken by another node {}/{}, power-off -> taken: {}; after the expiry (last renewal seen + {} s): {}",
            self.moves.len(),
            taken_ms.len(),
            self.moves.len(),
            summary_ms(&taken_ms),
            duration.as_secs_f64(),
            summary_ms(&late_ms),
        )];
        if per_lease.len() > LEASES_LISTED {
            out.push(format!(
                "{LEASES_LISTED} of them: those not taken, then the ones taken last"
            ));
        }
        out.extend(per_lease.into_iter().take(LEASES_LISTED).map(|(_, l)| l));
        if !self.other_durations.is_empty() {
            let names: Vec<String> = self
                .other_durations
                .iter()
                .map(|(n, d)| format!("{n} ({d} s)"))
                .collect();
            out.push(format!(
                "left out, another lease duration: {}",
                names.join(", ")
            ));
        }
        out
    }
}

/// The "never two responders" samples, the failed listings (count, first failure) and when
/// each watched address was first listed on a remaining node.
#[derive(Debug, Default)]
struct Sampled {
    dc: DoubleCarriers,
    errors: usize,
    first_error: Option<String>,
    /// Per address, the end of the first listing that showed it on a remaining node,
    /// after the power-off.
    first_listed: BTreeMap<IpAddr, Duration>,
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
        drop_inert_doubles(
            &mut s,
            |n| xtask::lab::FenceView::read(&b.lab, n),
            |n| b.carried_on(n, watched).ok(),
        );
        s
    });
    let mut s = sampled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ended = t0.elapsed();
    match sample {
        Ok(sample) => {
            s.dc.add(at, watched, &sample);
            for a in sample.values().flatten() {
                s.first_listed.entry(*a).or_insert(ended);
            }
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
/// in between counts as inert. An address the fence of a node running it does not name is
/// counted only if the node's addresses listed again (`relist(node)`, once, when needed;
/// `None`, a failed listing, keeps the first) still show it
/// ([`xtask::lab::FenceView::answers_listed_before`]): a holder that steps down disarms its
/// VIPs once their addresses are gone, so a fence read after that removal finds them not
/// fenced at all, which alone would count the first listing's address as answered (seen in
/// a power-off whose survivors swapped their shards after an API server stall: 230
/// addresses a node was still removing, over a listing that took 3 s).
pub(super) fn drop_inert_doubles(
    sample: &mut BTreeMap<String, BTreeSet<IpAddr>>,
    fence: impl Fn(&str) -> xtask::lab::FenceView,
    relist: impl Fn(&str) -> Option<BTreeSet<IpAddr>>,
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
        let now: std::cell::OnceCell<Option<BTreeSet<IpAddr>>> = std::cell::OnceCell::new();
        set.retain(|a| {
            !doubles.contains(a)
                || view.answers_listed_before(*a, || {
                    now.get_or_init(|| relist(node))
                        .as_ref()
                        .is_none_or(|n| n.contains(a))
                })
        });
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
    // The lease watch starts LEASE_WATCH_LEAD before the power-off, so that it sees every
    // lease's last renewal.
    let (rv, listed) = b.in_client(|| b.lease_list(ALL_LEASES))??;
    let moves = Mutex::new(LeaseMoves::new(&victim, &listed, timing[0].secs));
    let watch_done = AtomicBool::new(false);
    let (r, watched_leases, t0) = std::thread::scope(|s| {
        let watch = s.spawn(|| watch_lease_moves(b, &rv, &moves, &watch_done));
        std::thread::sleep(LEASE_WATCH_LEAD);
        let t0 = Instant::now();
        let r = power_off_and_poll(
            b, &victim, &remaining, &watched, &index, &poller, &sampled, &moves, t0,
        );
        watch_done.store(true, Ordering::SeqCst);
        let w = watch
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the lease watch panicked")));
        (r, w, t0)
    });
    match watched_leases {
        Ok(reopened) if reopened > 0 => println!(
            "    (the lease watch ended early {reopened} time(s) and was reopened from its last resourceVersion)"
        ),
        Ok(_) => {}
        Err(e) => {
            println!("    !! the lease watch failed, the lease figures below are incomplete: {e:#}")
        }
    }
    let moved = moves
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (k, line) in moved
        .lines(t0, Duration::from_secs_f64(timing[0].secs))
        .into_iter()
        .enumerate()
    {
        println!("    {}{line}", if k == 0 { "" } else { "  " });
    }
    r
}

/// Lists of every namespace's Leases (per-Service leases in `default`, shard leases and the
/// allocator's in `kube-system`).
const ALL_LEASES: &str = "/apis/coordination.k8s.io/v1/leases";

/// How long before the power-off the lease watch starts (2 s: two renewals of a lease
/// renewed every second, vipd's default retry period).
pub const LEASE_WATCH_LEAD: Duration = Duration::from_secs(2);

/// Feeds every lease write from `rv` on to `moves` with its arrival time, until `done`
/// (checked every 200 ms); runs the watch from the client namespace. A watch the server
/// ends early is opened again from the last resourceVersion it gave (as any watch client
/// does). Returns how many times it was reopened.
///
/// # Errors
/// When the watch cannot be opened, answers with another status than 200, or ends without
/// having given a resourceVersion to go on from.
fn watch_lease_moves(
    b: &Bench,
    rv: &str,
    moves: &Mutex<LeaseMoves>,
    done: &AtomicBool,
) -> Result<usize> {
    let deadline = Instant::now()
        + LEASE_WATCH_LEAD
        + POWEROFF_LIMIT
        + CARRIER_SAMPLE_TAIL
        + Duration::from_secs(5);
    let mut rv = rv.to_string();
    let mut reopened = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let path = format!(
            "{ALL_LEASES}?watch=1&resourceVersion={rv}&timeoutSeconds={}",
            left.as_secs().max(1)
        );
        let mut last_rv: Option<String> = None;
        let status = b.in_client(|| {
            b.api.get_lines(&path, Duration::from_millis(200), |line| {
                if let Some(l) = line
                    && let Ok(e) = serde_json::from_str::<serde_json::Value>(l)
                {
                    let at = Instant::now();
                    let o = &e["object"];
                    if let Some(v) = o["metadata"]["resourceVersion"].as_str() {
                        last_rv = Some(v.to_string());
                    }
                    if matches!(e["type"].as_str(), Some("ADDED" | "MODIFIED"))
                        && let Some(seen) = LeaseSeen::from_json(o)
                        && let Ok(mut m) = moves.lock()
                    {
                        m.observe(at, &seen.key(), &seen.holder);
                    }
                }
                !done.load(Ordering::SeqCst)
            })
        })??;
        if status != 200 {
            bail!("lease watch from resourceVersion {rv}: HTTP {status}");
        }
        if done.load(Ordering::SeqCst) || Instant::now() >= deadline {
            return Ok(reopened);
        }
        if let Some(v) = last_rv {
            rv = v;
        }
        reopened += 1;
    }
}

/// The power-off at `t0` (now), the polling and the report but for the lease lines
/// ([`run`]); `moves` is the lease watch's record, told of the power-off.
#[allow(clippy::too_many_arguments)]
fn power_off_and_poll(
    b: &Bench,
    victim: &str,
    remaining: &[&str],
    watched: &BTreeSet<IpAddr>,
    index: &BTreeMap<IpAddr, usize>,
    poller: &Poller,
    sampled: &Mutex<Sampled>,
    moves: &Mutex<LeaseMoves>,
    t0: Instant,
) -> Result<()> {
    if let Ok(mut m) = moves.lock() {
        m.powered_off(t0);
    }
    kill_node_vipd(b, victim)?;
    b.lab.cut_link(victim)?;
    let cut = t0.elapsed();
    // Added only now: an attempt before the cut could still reach the node's own backend.
    poller.add_all(
        watched
            .iter()
            .filter_map(|a| Some((*index.get(a)?, SocketAddr::new(*a, 80), t0))),
    );
    poller.close();
    // Only the remaining nodes count: the powered-off one still carries its addresses.
    let sample = || sample_carriers(b, remaining, watched, t0, sampled);
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
        first_listed,
    } = std::mem::take(
        &mut *sampled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );

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
    let listed: Vec<f64> = first_listed.values().copied().map(ms).collect();
    println!(
        "    per address, power-off -> first listed on {} (the end of that listing): min {}, {}",
        remaining.join(" or "),
        listed
            .iter()
            .copied()
            .reduce(f64::min)
            .map_or("n/a".into(), |m| format!("{m:.0} ms")),
        summary_ms(&listed)
    );
    let by = answered_by(answered);
    println!("    answered by: {by:?}");
    if let Some(n) = by.get(victim) {
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
