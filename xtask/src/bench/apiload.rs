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
//!    `--timeout` [`lab::PROBE_TIMEOUT`]) runs in ns `client` and an ARP watcher (every
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

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Result, anyhow, bail};
use xtask::lab::{self, ApiClient, Lab, NODES};

use super::harness::api::{create, get_lease, lease_watch_path};
use super::harness::build::vipd_release_binary;
use super::harness::cluster::{reachable_holder, start_trial_cluster};
use super::harness::ctx::Ctx;
use super::harness::probe::{stop_probe, wait_probe_steady};
use super::harness::procfs::cpu_percent;
use super::harness::subject::{Subject, Timings};
use super::harness::text::metric_sum;
use super::harness::{CREATE_THREADS, METRICS_PORT, SAMPLE_INTERVAL, VIP};
use crate::args::{parse_flags, whole_number};

/// Namespace of the ConfigMaps the load lists and patches.
pub const LOAD_NAMESPACE: &str = "load";
/// The load runs this long before a row's window starts (a full stride of every loop).
pub const WARM_UP: Duration = Duration::from_secs(3);
/// `timeoutSeconds` of each Lease watch call (the lab's HTTPS client reads with a 5 s
/// timeout, so the server must end a quiet watch sooner).
const WATCH_CHUNK_SECS: u64 = 2;
/// Name of vipd's renew latency histogram.
const RENEW_HISTOGRAM: &str = "vipd_lease_renew_duration_seconds";

const USAGE: &str = "usage: cargo xtask bench apiload [options]

options:
  --timings LIST    vipd lease timings as in `bench failover`: comma list of `default`
                    (3/2/1), `fast` (0.6/0.4/0.2 with vip_nftfence) or LEASE/RENEW/RETRY
                    seconds with an optional +nft (default: fast)
  --load LIST       load levels: comma list of concurrent load loops, each LISTing every
                    ConfigMap of namespace load and PATCHing one, again and again
                    (0 to 512; default 0,4,16,64)
  --seconds N       measuring window per row, seconds (1 to 3600; default 60)
  --objects N       ConfigMaps created in namespace load (1 to 100000; default 2000)
  --object-kib N    size of each ConfigMap's data, KiB (1 to 512; default 4)
  --no-build        do not run `cargo build --release -p vipd` first
  --vipd PATH       vipd binary to use (default target/release/vipd)
  -v, --verbose     print progress";

/// Parsed options of `bench apiload`.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// vipd timings, one block of rows each.
    pub timings: Vec<Timings>,
    /// Load levels: concurrent load loops.
    pub loads: Vec<usize>,
    /// Measuring window per row, seconds.
    pub seconds: u64,
    /// ConfigMaps in [`LOAD_NAMESPACE`].
    pub objects: usize,
    /// KiB of data per ConfigMap.
    pub object_kib: usize,
    /// Build vipd in release mode first.
    pub build: bool,
    /// Explicit vipd binary.
    pub vipd_path: Option<PathBuf>,
    /// Print progress.
    pub verbose: bool,
}

impl Options {
    /// Parses the arguments after `bench apiload`.
    ///
    /// # Errors
    /// Names the flag and the value that is invalid (an unknown flag, a missing value, a
    /// timing `Timings::parse` refuses, a number out of range).
    pub fn parse(args: &[&str]) -> Result<Options> {
        let mut o = Options {
            timings: vec![Timings::parse("fast")?],
            loads: vec![0, 4, 16, 64],
            seconds: 60,
            objects: 2000,
            object_kib: 4,
            build: true,
            vipd_path: None,
            verbose: false,
        };
        parse_flags(args, USAGE, |a, value| {
            match a {
                "--timings" => {
                    o.timings = value()?
                        .split(',')
                        .map(Timings::parse)
                        .collect::<Result<_>>()?;
                }
                "--load" => {
                    o.loads = value()?
                        .split(',')
                        .map(|v| whole_number("--load", v, 0..=512))
                        .collect::<Result<_>>()?;
                }
                "--seconds" => o.seconds = whole_number("--seconds", value()?, 1..=3600)? as u64,
                "--objects" => o.objects = whole_number("--objects", value()?, 1..=100_000)?,
                "--object-kib" => o.object_kib = whole_number("--object-kib", value()?, 1..=512)?,
                "--no-build" => o.build = false,
                "--vipd" => o.vipd_path = Some(PathBuf::from(value()?)),
                "-v" | "--verbose" => o.verbose = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(o)
    }
}

/// Figures of one row (one timing at one load level).
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Timing label (`default`, `fast`, ...).
    pub timings: String,
    /// Concurrent load loops.
    pub load: usize,
    /// Window length, seconds.
    pub window_s: f64,
    /// Completed LISTs per second (all loops).
    pub lists_per_s: f64,
    /// Completed PATCHes per second.
    pub writes_per_s: f64,
    /// Load requests that failed (error or non-2xx).
    pub load_failures: u64,
    /// CPU of kube-apiserver, percent of one core.
    pub apiserver_cpu: Option<f64>,
    /// CPU of etcd, percent of one core.
    pub etcd_cpu: Option<f64>,
    /// CPU of this process (the load loops, the watchers), percent of one core.
    pub xtask_cpu: Option<f64>,
    /// Successful renewals in the window (all nodes).
    pub renewals: f64,
    /// Their mean latency, ms.
    pub renew_mean_ms: Option<f64>,
    /// Their 95th percentile, ms, estimated from the histogram's buckets.
    pub renew_p95_ms: Option<f64>,
    /// Failed renew attempts (`vipd_lease_renew_failures_total`).
    pub renew_failures: f64,
    /// Lease writes (watch events) per second.
    pub lease_writes_per_s: f64,
    /// Longest time between two Lease writes (renewTime), ms.
    pub max_write_gap_ms: Option<f64>,
    /// `stepping down` lines in the vipd logs.
    pub step_downs: usize,
    /// `acquired lease; leading` lines in the vipd logs.
    pub acquisitions: usize,
    /// Times the Lease's holder became a different node.
    pub holder_changes: usize,
    /// Time with two or more ARP responders for the VIP, ms.
    pub two_responders_ms: f64,
    /// The probe's longest gap, ms.
    pub probe_gap_ms: Option<f64>,
    /// Probe failures.
    pub probe_failures: u64,
    /// Probe requests with a known outcome.
    pub probe_requests: u64,
    /// Step-down reasons seen, with counts.
    pub reasons: Vec<(String, usize)>,
    /// Anything worth a look.
    pub notes: Vec<String>,
}

/// `cargo xtask bench apiload ARGS...`.
///
/// # Errors
/// Bad arguments, not root, a failed build, a lab that cannot start or a load collection
/// that cannot be created. A row that fails is printed as failed and the run goes on.
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    if nix::unistd::geteuid().as_raw() != 0 {
        bail!("`cargo xtask bench apiload` needs root (network namespaces); run it with sudo -E");
    }
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

/// The admin client for the API server as seen from ns `api` (127.0.0.1:6443).
fn api_client(lab: &Lab) -> Result<ApiClient> {
    Ok(lab.admin_client(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        lab::API_PORT,
    ))?)
}

/// Creates namespace [`LOAD_NAMESPACE`] and `objects` ConfigMaps `load-N` of `kib` KiB each
/// ([`CREATE_THREADS`] threads in ns `api`; existing ones are kept).
fn fill(lab: &Lab, objects: usize, kib: usize) -> Result<()> {
    create(
        lab,
        "/api/v1/namespaces",
        &serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": LOAD_NAMESPACE}}),
        "namespace load",
    )?;
    let client = api_client(lab)?;
    let blob = "x".repeat(kib * 1024);
    let path = format!("/api/v1/namespaces/{LOAD_NAMESPACE}/configmaps");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..CREATE_THREADS)
            .map(|t| {
                let (client, blob, path) = (&client, &blob, &path);
                s.spawn(move || {
                    lab.in_netns("api", || -> Result<()> {
                        for i in (t..objects).step_by(CREATE_THREADS) {
                            let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": format!("load-{i}")},
                                "data": {"blob": blob}})
                            .to_string();
                            let r = client.request("POST", path, Some(&body))?;
                            if !matches!(r.status, 201 | 409) {
                                bail!("create ConfigMap load-{i}: HTTP {}: {}", r.status, r.body);
                            }
                        }
                        Ok(())
                    })?
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow!("a ConfigMap creating thread panicked"))??;
        }
        Ok(())
    })
}

/// What the load loops did.
#[derive(Debug, Default)]
struct LoadCounters {
    lists: AtomicU64,
    writes: AtomicU64,
    failures: AtomicU64,
}

/// One load loop: LIST every ConfigMap of [`LOAD_NAMESPACE`], PATCH one, until `stop`.
/// Runs on a thread inside ns `api`.
fn load_loop(client: &ApiClient, id: usize, objects: usize, stop: &AtomicBool, k: &LoadCounters) {
    let list = format!("/api/v1/namespaces/{LOAD_NAMESPACE}/configmaps");
    let mut n = id;
    while !stop.load(Ordering::Relaxed) {
        match client.request("GET", &list, None) {
            Ok(r) if r.status == 200 => k.lists.fetch_add(1, Ordering::Relaxed),
            _ => k.failures.fetch_add(1, Ordering::Relaxed),
        };
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let path = format!("{list}/load-{}", n % objects);
        let body = format!(r#"{{"data":{{"tick":"{n}"}}}}"#);
        match client.request("PATCH", &path, Some(&body)) {
            Ok(r) if r.status == 200 => k.writes.fetch_add(1, Ordering::Relaxed),
            _ => k.failures.fetch_add(1, Ordering::Relaxed),
        };
        n += 7919;
    }
}

/// Running load loops.
struct Load {
    stop: Arc<AtomicBool>,
    counters: Arc<LoadCounters>,
    threads: Vec<std::thread::JoinHandle<lab::Result<()>>>,
}

impl Load {
    /// Starts `loops` load loops, each a thread inside ns `api`.
    fn start(lab: &Lab, loops: usize, objects: usize) -> Result<Load> {
        let ns = lab.netns_path("api")?;
        let client = api_client(lab)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(LoadCounters::default());
        let mut threads = Vec::new();
        for id in 0..loops {
            let (c, s, k) = (client.clone(), stop.clone(), counters.clone());
            threads.push(lab::netns::spawn_in_netns(
                &ns,
                &format!("apiload-{id}"),
                move || {
                    load_loop(&c, id, objects, &s, &k);
                    Ok(())
                },
            )?);
        }
        Ok(Load {
            stop,
            counters,
            threads,
        })
    }

    /// (lists, writes, failures) so far.
    fn counts(&self) -> (u64, u64, u64) {
        let k = &self.counters;
        (
            k.lists.load(Ordering::Relaxed),
            k.writes.load(Ordering::Relaxed),
            k.failures.load(Ordering::Relaxed),
        )
    }

    /// Stops the loops and waits for them (each finishes its request in flight).
    fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().map_err(|_| anyhow!("a load loop panicked"))??;
        }
        Ok(())
    }
}

/// One write of the Lease as the watch saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseWrite {
    /// `spec.holderIdentity` (empty when released).
    pub holder: String,
    /// `spec.renewTime` as seconds of the UTC day, if set.
    pub renew_tod: Option<f64>,
}

impl LeaseWrite {
    /// Reads holder and renew time from a Lease object.
    pub fn from_lease(lease: &serde_json::Value) -> LeaseWrite {
        LeaseWrite {
            holder: lease["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            renew_tod: lease["spec"]["renewTime"].as_str().and_then(time_of_day),
        }
    }
}

/// Seconds since midnight UTC of an RFC 3339 UTC time (`2026-12-01T21:40:00.123456Z`, as
/// the API server writes a Lease's MicroTime); `None` when it is not of that form.
pub fn time_of_day(t: &str) -> Option<f64> {
    let (_, time) = t.split_once('T')?;
    let time = time.strip_suffix('Z')?;
    let mut it = time.splitn(3, ':');
    let h: f64 = it.next()?.parse().ok()?;
    let m: f64 = it.next()?.parse().ok()?;
    let s: f64 = it.next()?.parse().ok()?;
    (h < 24.0 && m < 60.0 && s < 61.0).then_some(h * 3600.0 + m * 60.0 + s)
}

/// Seconds since midnight UTC now.
fn now_tod() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() % 86_400.0)
        .unwrap_or_default()
}

/// `b - a` for times of day, across midnight.
fn tod_diff(a: f64, b: f64) -> f64 {
    let d = b - a;
    if d < -43_200.0 { d + 86_400.0 } else { d }
}

/// Watches the control-plane Lease from its current state until `stop`, in chunks of
/// [`WATCH_CHUNK_SECS`] continued from the last resourceVersion; returns the state at the
/// start and every write seen, and the number of failed watch calls.
fn watch_lease(lab: &Lab, stop: &AtomicBool) -> Result<(LeaseWrite, Vec<LeaseWrite>, u64)> {
    let get = || -> Result<(LeaseWrite, String)> {
        let (v, rv) = get_lease(lab)?;
        Ok((LeaseWrite::from_lease(&v), rv))
    };
    let (first, mut rv) = get()?;
    let mut writes = Vec::new();
    let mut failed = 0;
    while !stop.load(Ordering::Relaxed) {
        let path = lease_watch_path(&rv, WATCH_CHUNK_SECS);
        let mut restart = false;
        match lab.api_request("GET", &path, None) {
            Ok(r) if r.status == 200 => {
                for e in r
                    .body
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                {
                    match e["type"].as_str() {
                        Some("ADDED" | "MODIFIED" | "DELETED") => {
                            writes.push(LeaseWrite::from_lease(&e["object"]));
                            if let Some(v) = e["object"]["metadata"]["resourceVersion"].as_str() {
                                rv = v.to_string();
                            }
                        }
                        // ERROR (e.g. 410 Gone): start again from the current state.
                        _ => restart = true,
                    }
                }
            }
            _ => restart = true,
        }
        if restart {
            failed += 1;
            std::thread::sleep(Duration::from_millis(100));
            if let Ok((_, v)) = get() {
                rv = v;
            }
        }
    }
    Ok((first, writes, failed))
}

/// Times the holder became a different node: `writes` in order, starting from `first`'s
/// holder; a release (empty holder) is no change by itself, the next holder is compared
/// with the last non-empty one.
pub fn holder_changes(first: &LeaseWrite, writes: &[LeaseWrite]) -> usize {
    let mut last = first.holder.as_str();
    let mut changes = 0;
    for w in writes.iter().filter(|w| !w.holder.is_empty()) {
        if !last.is_empty() && w.holder != last {
            changes += 1;
        }
        last = &w.holder;
    }
    changes
}

/// Longest time between consecutive renew times in `[start, end]` (seconds of the day),
/// counting from `start` and up to `end`, ms.
pub fn max_write_gap_ms(writes: &[LeaseWrite], start: f64, end: f64) -> f64 {
    let mut prev = start;
    let mut worst: f64 = 0.0;
    for t in writes.iter().filter_map(|w| w.renew_tod) {
        if tod_diff(start, t) < 0.0 || tod_diff(t, end) < 0.0 {
            continue;
        }
        worst = worst.max(tod_diff(prev, t));
        prev = t;
    }
    worst.max(tod_diff(prev, end)) * 1000.0
}

/// Cumulative buckets `(le, count)` of histogram `name`, summed over its label sets, in
/// ascending `le` (`+Inf` as infinity).
pub fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let series = format!("{name}_bucket{{");
    let mut out: Vec<(f64, f64)> = Vec::new();
    for l in text.lines().filter(|l| l.starts_with(&series)) {
        let Some((labels, value)) = l.rsplit_once(' ') else {
            continue;
        };
        let le = labels
            .split("le=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| match v {
                "+Inf" => Some(f64::INFINITY),
                v => v.parse::<f64>().ok(),
            });
        let (Some(le), Ok(v)) = (le, value.trim().parse::<f64>()) else {
            continue;
        };
        match out.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += v,
            None => out.push((le, v)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// `after - before`, bucket by bucket (buckets missing before count 0).
fn bucket_diff(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(le, a)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, v)| *v);
            (*le, a - b)
        })
        .collect()
}

/// Quantile `q` (0..=1) of cumulative buckets as Prometheus' `histogram_quantile` estimates
/// it: linear within the bucket holding the rank, the largest finite bound when the rank
/// falls in `+Inf`; `None` without observations.
pub fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in buckets {
        if c >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let in_bucket = c - prev.1;
            let frac = if in_bucket > 0.0 {
                (rank - prev.1) / in_bucket
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, c);
    }
    Some(prev.0)
}

/// The vipd metrics of every node (empty text for a node that did not answer).
fn scrape(ctx: &Ctx) -> Vec<String> {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), METRICS_PORT);
    NODES
        .iter()
        .map(|n| {
            ctx.lab
                .http_get(n, addr, "/metrics", Duration::from_secs(2))
                .unwrap_or_default()
        })
        .collect()
}

/// Renewal figures summed over the nodes: (buckets, sum s, count, failures).
fn renew_totals(texts: &[String]) -> (Vec<(f64, f64)>, f64, f64, f64) {
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    let (mut sum, mut count, mut failures) = (0.0, 0.0, 0.0);
    for t in texts {
        for (le, c) in histogram_buckets(t, RENEW_HISTOGRAM) {
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, v)) => *v += c,
                None => buckets.push((le, c)),
            }
        }
        sum += metric_sum(t, &format!("{RENEW_HISTOGRAM}_sum")).unwrap_or_default();
        count += metric_sum(t, &format!("{RENEW_HISTOGRAM}_count")).unwrap_or_default();
        failures += metric_sum(t, "vipd_lease_renew_failures_total").unwrap_or_default();
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    (buckets, sum, count, failures)
}

/// Counts of step-downs (vipd's `stepping down lease=...` and `stepping down: shutting
/// down` lines; not the health check's `...; stepping down and not campaigning`, which is
/// followed by its own step-down line when the node led) and of `acquired lease; leading`
/// lines in `log`, and the step-down reasons (the text after `reason=`).
pub fn log_counts(log: &str) -> (usize, usize, Vec<String>) {
    let mut downs = 0;
    let mut reasons = Vec::new();
    for l in log
        .lines()
        .filter(|l| l.contains("stepping down lease=") || l.contains("stepping down: "))
    {
        downs += 1;
        let why = l
            .split_once("reason=")
            .map_or("(none given)", |(_, r)| r.trim());
        reasons.push(why.trim_matches('"').to_string());
    }
    let acquired = log
        .lines()
        .filter(|l| l.contains("acquired lease; leading"))
        .count();
    (downs, acquired, reasons)
}

/// Masks the numbers in a step-down reason (`renewals failed for 412 ms` and `for 398 ms`
/// count as one reason).
fn reason_kind(why: &str) -> String {
    let mut out = String::new();
    let mut in_num = false;
    for c in why.chars() {
        if c.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
    }
    out
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
    let probe = ctx.start_probe(VIP)?;
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

    let (b0, sum0, n0, f0) = renew_totals(&before);
    let (b1, sum1, n1, f1) = renew_totals(&after);
    let buckets = bucket_diff(&b1, &b0);
    row.renewals = n1 - n0;
    row.renew_failures = f1 - f0;
    row.renew_mean_ms = (row.renewals > 0.0).then(|| (sum1 - sum0) / row.renewals * 1000.0);
    row.renew_p95_ms = histogram_quantile(&buckets, 0.95).map(|v| v * 1000.0);
    if before.iter().chain(&after).any(String::is_empty) {
        row.notes
            .push("a node's metrics did not answer; its renewals are missing".into());
    }

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

    let mut reasons: Vec<(String, usize)> = Vec::new();
    for (n, log) in NODES.iter().zip(&logs) {
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

    let two = arp.slots.iter().filter(|s| s.responders.len() >= 2).count();
    row.two_responders_ms = two as f64 * SAMPLE_INTERVAL.as_secs_f64() * 1000.0;
    row.probe_gap_ms = summary.worst_gap_ms();
    row.probe_failures = summary.failures;
    row.probe_requests = summary.requests;
    Ok(row)
}

fn header() -> String {
    format!(
        "{:<8} {:>4} {:>6} {:>7} {:>5} {:>5} {:>5} {:>5} | {:>6} {:>6} {:>6} {:>5} | {:>5} {:>6} | {:>5} {:>4} {:>6} {:>7} | {:>5} {:>6} {:>9}",
        "timings",
        "load",
        "LIST/s",
        "PATCH/s",
        "lfail",
        "api%",
        "etcd%",
        "gen%",
        "renews",
        "mean",
        "p95~",
        "rfail",
        "lw/s",
        "maxgap",
        "stepd",
        "acq",
        "moves",
        "moves/m",
        "2resp",
        "gap",
        "pfail"
    )
}

fn row_line(r: &Row) -> String {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    format!(
        "{:<8} {:>4} {:>6.1} {:>7.1} {:>5} {:>5} {:>5} {:>5} | {:>6.0} {:>6} {:>6} {:>5.0} | {:>5.1} {:>6} | {:>5} {:>4} {:>6} {:>7.1} | {:>5.0} {:>6} {:>9}",
        r.timings,
        r.load,
        r.lists_per_s,
        r.writes_per_s,
        r.load_failures,
        opt(r.apiserver_cpu),
        opt(r.etcd_cpu),
        opt(r.xtask_cpu),
        r.renewals,
        opt(r.renew_mean_ms),
        opt(r.renew_p95_ms),
        r.renew_failures,
        r.lease_writes_per_s,
        opt(r.max_write_gap_ms),
        r.step_downs,
        r.acquisitions,
        r.holder_changes,
        r.holder_changes as f64 * 60.0 / r.window_s.max(1.0),
        r.two_responders_ms,
        opt(r.probe_gap_ms),
        format!("{}/{}", r.probe_failures, r.probe_requests),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let o = Options::parse(&[]).unwrap();
        assert_eq!(o.timings, vec![Timings::parse("fast").unwrap()]);
        assert_eq!(o.loads, vec![0, 4, 16, 64]);
        assert_eq!(o.seconds, 60);
        assert_eq!((o.objects, o.object_kib), (2000, 4));
        assert!(o.build && !o.verbose && o.vipd_path.is_none());
    }

    #[test]
    fn flags() {
        let o = Options::parse(&[
            "--timings",
            "default,fast,5/3/1",
            "--load",
            "0,8,32",
            "--seconds",
            "30",
            "--objects",
            "500",
            "--object-kib",
            "8",
            "--no-build",
            "--vipd",
            "/x/vipd",
            "-v",
        ])
        .unwrap();
        let labels: Vec<&str> = o.timings.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["default", "fast", "5/3/1"]);
        assert!(o.timings[1].nft_fence);
        assert_eq!(o.loads, vec![0, 8, 32]);
        assert_eq!(o.seconds, 30);
        assert_eq!((o.objects, o.object_kib), (500, 8));
        assert!(!o.build && o.verbose);
        assert_eq!(o.vipd_path, Some(PathBuf::from("/x/vipd")));
    }

    #[test]
    fn bad_values_name_flag_and_value() {
        let err = |a: &[&str]| format!("{:#}", Options::parse(a).unwrap_err());
        assert!(err(&["--load", "0,x"]).contains("--load: \"x\""));
        assert!(err(&["--load", "513"]).contains("--load: 513 is outside 0..=512"));
        assert!(err(&["--seconds", "0"]).contains("--seconds: 0 is outside"));
        assert!(err(&["--objects", "-1"]).contains("--objects: \"-1\""));
        assert!(err(&["--object-kib", "600"]).contains("--object-kib: 600"));
        assert!(err(&["--timings", "0.4/0.6/0.2"]).contains("invalid --timings value"));
        assert!(err(&["--seconds"]).contains("--seconds needs a value"));
        assert!(err(&["--bogus"]).contains("unknown option \"--bogus\""));
    }

    #[test]
    fn renew_time_of_day() {
        assert_eq!(time_of_day("2026-12-01T21:40:00.250000Z"), Some(78_000.25));
        assert_eq!(time_of_day("2026-12-01T00:00:01Z"), Some(1.0));
        assert_eq!(time_of_day("2026-12-01 21:40:00Z"), None);
        assert_eq!(time_of_day("2026-12-01T21:40:00+01:00"), None);
        assert_eq!(tod_diff(86_399.5, 0.5), 1.0);
    }

    fn w(holder: &str, t: Option<f64>) -> LeaseWrite {
        LeaseWrite {
            holder: holder.into(),
            renew_tod: t,
        }
    }

    #[test]
    fn holder_changes_skip_releases_and_renewals() {
        let first = w("node-a", Some(0.0));
        let writes = [
            w("node-a", Some(1.0)),
            w("", None),
            w("node-a", Some(3.0)),
            w("node-b", Some(4.0)),
            w("node-b", Some(5.0)),
            w("", None),
            w("node-c", Some(7.0)),
        ];
        assert_eq!(holder_changes(&first, &writes), 2);
        assert_eq!(holder_changes(&w("", None), &writes[..1]), 0);
    }

    #[test]
    fn write_gaps_count_window_edges() {
        let writes = [w("a", Some(10.5)), w("a", Some(11.0)), w("a", Some(13.0))];
        // Window 10..13.2: gaps 0.5, 0.5, 2.0, 0.2 s.
        assert!((max_write_gap_ms(&writes, 10.0, 13.2) - 2000.0).abs() < 1e-6);
        // Writes outside the window are ignored: 10.9..12 sees 11.0 only.
        assert!((max_write_gap_ms(&writes, 10.9, 12.0) - 1000.0).abs() < 1e-6);
    }

    const METRICS: &str = "# TYPE vipd_lease_renew_duration_seconds histogram\n\
        vipd_lease_renew_duration_seconds_bucket{lease_name=\"kube-system/plndr-cp-lock\",le=\"0.1\"} 6\n\
        vipd_lease_renew_duration_seconds_bucket{lease_name=\"kube-system/plndr-cp-lock\",le=\"0.25\"} 8\n\
        vipd_lease_renew_duration_seconds_bucket{lease_name=\"kube-system/plndr-cp-lock\",le=\"0.5\"} 10\n\
        vipd_lease_renew_duration_seconds_bucket{lease_name=\"kube-system/plndr-cp-lock\",le=\"+Inf\"} 10\n\
        vipd_lease_renew_duration_seconds_sum{lease_name=\"kube-system/plndr-cp-lock\"} 1.5\n\
        vipd_lease_renew_duration_seconds_count{lease_name=\"kube-system/plndr-cp-lock\"} 10\n\
        vipd_lease_renew_failures_total{lease_name=\"kube-system/plndr-cp-lock\"} 3\n";

    #[test]
    fn histogram_parsing_and_quantiles() {
        let b = histogram_buckets(METRICS, RENEW_HISTOGRAM);
        assert_eq!(
            b,
            vec![(0.1, 6.0), (0.25, 8.0), (0.5, 10.0), (f64::INFINITY, 10.0)]
        );
        // Rank 5 of 10 in the first bucket: 5/6 of 0..0.1.
        assert!((histogram_quantile(&b, 0.5).unwrap() - 0.1 * 5.0 / 6.0).abs() < 1e-9);
        // Rank 9.5 in 0.25..0.5, 1.5 of its 2.
        assert!((histogram_quantile(&b, 0.95).unwrap() - 0.4375).abs() < 1e-9);
        assert_eq!(
            histogram_quantile(&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.5),
            None
        );
        assert_eq!(
            histogram_quantile(&[(0.1, 1.0), (f64::INFINITY, 4.0)], 0.95),
            Some(0.1)
        );
        let (buckets, sum, count, failures) =
            renew_totals(&[METRICS.to_string(), METRICS.to_string()]);
        assert_eq!(buckets[1], (0.25, 16.0));
        assert_eq!((sum, count, failures), (3.0, 20.0, 6.0));
        assert_eq!(
            bucket_diff(&buckets, &b),
            vec![(0.1, 6.0), (0.25, 8.0), (0.5, 10.0), (f64::INFINITY, 10.0)]
        );
    }

    #[test]
    fn log_lines_counted() {
        let log = "2026-12-01T21:00:00Z  INFO acquired lease; leading lease=kube-system/plndr-cp-lock term=1\n\
            2026-12-01T21:00:01Z  WARN stepping down lease=kube-system/plndr-cp-lock term=1 reason=\"renewals failed for 412 ms\"\n\
            2026-12-01T21:00:02Z  WARN local API server unhealthy; stepping down and not campaigning error=/livez: timed out\n\
            2026-12-01T21:00:02Z  INFO acquired lease; leading lease=kube-system/plndr-cp-lock term=2\n\
            2026-12-01T21:00:03Z  INFO stepping down: shutting down lease=kube-system/plndr-cp-lock term=2\n";
        let (downs, acquired, reasons) = log_counts(log);
        assert_eq!((downs, acquired), (2, 2));
        assert_eq!(reasons, ["renewals failed for 412 ms", "(none given)"]);
        assert_eq!(reason_kind(&reasons[0]), "renewals failed for N ms");
    }
}
