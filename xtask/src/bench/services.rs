//! `cargo xtask bench services`: figures for vipd's LoadBalancer Services (S31, S32) in the
//! lab. It prints figures, not pass/fail; docs/services-bench.md records a run against its
//! targets (30 MB per node, p95 create-to-answer).
//!
//! ```text
//! cargo xtask bench services [--scenario bringup|scale|churn|drain|dhcp|all] [--services N]
//!     [--minutes M] [--dhcp-services N] [--no-build] [--vipd PATH] [-v]
//! ```
//!
//! Every scenario gets its own lab ([`Lab::start`] with HTTP backends: every node answers
//! `GET /` on port 80 of any local address, VIPs included, with its node name) and runs the
//! release build of vipd on node-a, node-b and node-c in Services mode with `svc_election`
//! (one Lease `kubevip-<service>` per Service in `default`), kube-vip's lease timings 5/3/1 s,
//! `vip_interface=eth0` and `prometheus_server=:2112`. Services are created, deleted and
//! listed through the lab API server (admin token) from the `client` namespace, and "answered"
//! always means: an HTTP/1.0 `GET /` from the `client` namespace to `<address>:80` got an
//! `HTTP/1.x 200` answer. Each Service is polled by its own thread (new TCP connection per
//! attempt, connect timeout [`CONNECT_TIMEOUT`], one attempt every [`POLL_INTERVAL`] at most),
//! so a Service that answers late never delays the measurement of another.
//!
//! Scenarios:
//!
//! - **bringup**: 50 Services (192.0.2.150-199, then 10 IPv6 Services 2001:db8::2:1-a) are
//!   created one at a time; for each, the time from the create call returning to the first
//!   answer. Prints p50/p95/max (ms) per family and which node answered.
//! - **scale**: N Services (default 1000; 2001:db8::1:1 upwards, the lab's IPv6 /64 — the
//!   IPv4 /24 has no room) created by 4 threads in parallel, each polled from the moment its
//!   create returned. Prints the creation time, the time until all answered (from the first
//!   create call, and per Service from its own create), then in a 10 s steady-state window:
//!   Lease writes per second (a watch on Leases in `default`), Lease holder changes, vipd
//!   VmRSS, threads and CPU% per node, and CPU% of kube-apiserver and etcd.
//! - **churn**: 20 Services (192.0.2.150-169) created, answered, deleted (until no node
//!   carries their addresses) and created again, for M minutes (default 10). Prints VmRSS,
//!   thread count and any task-count gauge vipd's `/metrics` exposes (metric names containing
//!   `task`) per node at the start (after the first cycle) and at the end (after the last
//!   cycle, same state), a sample per minute, cycle figures, and the Leases left over.
//! - **drain**: [`DRAIN_SERVICES`] Services (192.0.2.150-164) created one at a time and
//!   spread over the nodes; each is then probed continuously (one thread per Service, one
//!   attempt per [`POLL_INTERVAL`] at most) while `vipd drain` runs on the node that answers
//!   most of them. Per Service VIP that moved: the gap (last answer from the drained node ->
//!   first answer from another), failed attempts in between, and who took it. Prints
//!   p50/p95/max of the gaps, that no Service answered from the drained node afterwards, and
//!   that the other Services had no gap longer than [`DRAIN_QUIET_GAP`]. These probes use a
//!   connect timeout of [`DRAIN_CONNECT_TIMEOUT`], so a SYN lost while a VIP moves costs
//!   that, not [`CONNECT_TIMEOUT`].
//! - **dhcp**: DHCP mode (issue 13) against dnsmasq, in two labs of its own; see
//!   [`dhcp`] (bring-up to the first ARP answer from the macvlan, then 50 DHCP Services on
//!   one node: RSS and renewals at T1).
//!
//! Every scenario ends with the API statuses other than 2xx seen by the bench's calls and the
//! WARN/ERROR lines of each vipd log (counts and the first distinct ones).

use std::collections::{BTreeMap, BTreeSet};

use super::stats::{ms, summary_ms};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::args::{parse_flags, whole_number};
use xtask::lab::{self, ApiClient, Lab, LabOptions, LabProcess, NODES};

mod dhcp;

const USAGE: &str = "usage: cargo xtask bench services [options]

options:
  --scenario S    bringup | scale | churn | drain | dhcp | all, or a comma list (default all)
  --services N    Services in the scale scenario (default 1000, at most 65000)
  --minutes M     length of the churn run in minutes, may be fractional (default 10)
  --dhcp-services N
                  Services created one at a time in the dhcp scenario's bring-up (default 20,
                  at most 71: the bench's dnsmasq pool 192.0.2.150-220)
  --no-build      do not run `cargo build --release -p vipd` first
  --vipd PATH     vipd binary to use (default target/release/vipd)
  -v, --verbose   print progress details";

/// Services created one at a time in the bring-up scenario (IPv4, 192.0.2.150-199).
pub const BRINGUP_V4: usize = 50;
/// IPv6 Services created after the IPv4 ones in the bring-up scenario (2001:db8::2:1-a).
pub const BRINGUP_V6: usize = 10;
/// Services recreated in the churn scenario (192.0.2.150-169).
pub const CHURN_SERVICES: usize = 20;
/// Default Service count of the scale scenario.
pub const DEFAULT_SCALE_SERVICES: usize = 1000;
/// Default length of the churn run, minutes.
pub const DEFAULT_CHURN_MINUTES: f64 = 10.0;
/// Largest `--services` (the addresses are 2001:db8::1:1 .. 2001:db8::1:fde8).
pub const MAX_SCALE_SERVICES: usize = 65_000;
/// Shortest time between two attempts of one poller (10 ms).
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// TCP connect timeout of one attempt (200 ms). A connect to an address whose neighbour
/// entry is still being resolved waits in the kernel and completes as soon as the
/// gratuitous ARP / unsolicited NA arrives, so this bounds idle waiting, not resolution.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Read timeout of one HTTP answer (1 s).
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// Length of the steady-state window of the scale scenario (10 s).
pub const STEADY_WINDOW: Duration = Duration::from_secs(10);
/// Threads creating Services in parallel in the scale scenario.
pub const CREATE_THREADS: usize = 4;
/// Port of vipd's admin endpoint in the bench (`prometheus_server=:2112`).
pub const METRICS_PORT: u16 = 2112;
/// Namespace of the bench's Services and of their Leases.
pub const NAMESPACE: &str = "default";

/// One benchmark scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// Service created -> first answer, one Service at a time.
    Bringup,
    /// Many Services at once: time until all answered, Lease writes, RSS, CPU.
    Scale,
    /// Services deleted and recreated for minutes: RSS, threads, tasks at start and end.
    Churn,
    /// `vipd drain` on a node: the gap of every Service VIP it held.
    Drain,
    /// DHCP mode: bring-up to the first ARP answer, 50 DHCP Services on one node.
    Dhcp,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    pub const ALL: [Scenario; 5] = [
        Scenario::Bringup,
        Scenario::Scale,
        Scenario::Churn,
        Scenario::Drain,
        Scenario::Dhcp,
    ];

    /// Parses `bringup`, `scale`, `churn`, `drain`, `dhcp` or `all` (every scenario).
    ///
    /// # Errors
    /// For any other word, naming it.
    pub fn parse_list(value: &str) -> Result<BTreeSet<Scenario>> {
        let mut out = BTreeSet::new();
        for w in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "bringup" | "bring-up" => {
                    out.insert(Scenario::Bringup);
                }
                "scale" => {
                    out.insert(Scenario::Scale);
                }
                "churn" => {
                    out.insert(Scenario::Churn);
                }
                "drain" => {
                    out.insert(Scenario::Drain);
                }
                "dhcp" => {
                    out.insert(Scenario::Dhcp);
                }
                "all" => out.extend(Scenario::ALL),
                other => bail!(
                    "--scenario: unknown scenario {other:?} (expected bringup, scale, churn, drain, dhcp or all)"
                ),
            }
        }
        if out.is_empty() {
            bail!("--scenario: empty value {value:?}");
        }
        Ok(out)
    }
}

/// Command-line options of `bench services`.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Scenarios to run, in order.
    pub scenarios: BTreeSet<Scenario>,
    /// Services of the scale scenario.
    pub services: usize,
    /// Length of the churn run, minutes.
    pub minutes: f64,
    /// Services created one at a time in the dhcp scenario's bring-up.
    pub dhcp_services: usize,
    /// Run `cargo build --release -p vipd` first.
    pub build: bool,
    /// Explicit vipd binary.
    pub vipd: Option<PathBuf>,
    /// Print progress details.
    pub verbose: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            scenarios: Scenario::ALL.into(),
            services: DEFAULT_SCALE_SERVICES,
            minutes: DEFAULT_CHURN_MINUTES,
            dhcp_services: dhcp::DEFAULT_BRINGUP,
            build: true,
            vipd: None,
            verbose: false,
        }
    }
}

impl Options {
    /// Parses the arguments after `bench services`.
    ///
    /// # Errors
    /// An unknown flag, a missing value, or a value out of range (naming flag and value);
    /// `--help` returns the usage as the error.
    pub fn parse(args: &[&str]) -> Result<Options> {
        let mut o = Options::default();
        parse_flags(args, USAGE, |a, value| {
            match a {
                "--scenario" => o.scenarios = Scenario::parse_list(value()?)?,
                "--services" => o.services = whole_number(a, value()?, 1..=MAX_SCALE_SERVICES)?,
                "--minutes" => {
                    let v = value()?;
                    let m: f64 = v
                        .parse()
                        .map_err(|_| anyhow!("--minutes: {v:?} is not a number"))?;
                    if !(m.is_finite() && m > 0.0 && m <= 24.0 * 60.0) {
                        bail!("--minutes: {v:?} is outside (0, 1440]");
                    }
                    o.minutes = m;
                }
                "--dhcp-services" => {
                    o.dhcp_services = whole_number(a, value()?, 1..=dhcp::pool().len())?;
                }
                "--no-build" => o.build = false,
                "--vipd" => o.vipd = Some(PathBuf::from(value()?)),
                "-v" | "--verbose" => o.verbose = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(o)
    }
}

/// Entry point of `cargo xtask bench services ARGS`.
///
/// # Errors
/// Bad arguments, a failed build, a lab that cannot start, or a scenario that cannot run
/// (vipd not starting, the API server refusing the bench's calls).
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    if nix::unistd::geteuid().as_raw() != 0 {
        bail!("`cargo xtask bench services` needs root (network namespaces); run it with sudo -E");
    }
    let vipd = super::failover::vipd_release_binary(o.build, o.vipd.as_deref())?;
    println!("vipd binary: {}", vipd.display());
    for s in &o.scenarios {
        let t0 = Instant::now();
        match s {
            Scenario::Bringup => bringup(&vipd, o.verbose)?,
            Scenario::Scale => scale(&vipd, o.services, o.verbose)?,
            Scenario::Churn => churn(&vipd, o.minutes, o.verbose)?,
            Scenario::Drain => drain(&vipd, o.verbose)?,
            Scenario::Dhcp => dhcp::run(&vipd, o.dhcp_services, o.verbose)?,
        }
        println!("({s:?} took {:.0} s)\n", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

// ----- addresses -------------------------------------------------------------------------

/// Address of bring-up / churn Service `i` (IPv4): 192.0.2.150 + i, for i < 50.
///
/// # Errors
/// When `i` >= 50 (the lab's /24 has no further free block).
pub fn v4_address(i: usize) -> Result<IpAddr> {
    let octet = u8::try_from(150 + i)
        .ok()
        .filter(|o| *o < 200)
        .ok_or_else(|| anyhow!("IPv4 Service index {i}: only 50 addresses (192.0.2.150-199)"))?;
    Ok(IpAddr::V4(Ipv4Addr::new(192, 0, 2, octet)))
}

/// Address of scale Service `i`: 2001:db8::1:(i+1) (hex), inside the lab's 2001:db8::/64.
///
/// # Errors
/// When `i` >= [`MAX_SCALE_SERVICES`].
pub fn scale_address(i: usize) -> Result<IpAddr> {
    if i >= MAX_SCALE_SERVICES {
        bail!("scale Service index {i} is beyond {MAX_SCALE_SERVICES}");
    }
    let low = u16::try_from(i + 1)?;
    Ok(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 1, low)))
}

/// Address of IPv6 bring-up Service `i`: 2001:db8::2:(i+1).
///
/// # Errors
/// When `i` does not fit 16 bits.
pub fn v6_bringup_address(i: usize) -> Result<IpAddr> {
    let low = u16::try_from(i + 1)?;
    Ok(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 2, low)))
}

/// A `type: LoadBalancer` Service `default/<name>` with `addr` in the
/// `kube-vip.io/loadbalancerIPs` annotation, port 80/TCP, externalTrafficPolicy Cluster.
pub fn service_json(name: &str, addr: IpAddr) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "annotations": {"kube-vip.io/loadbalancerIPs": addr.to_string()},
        },
        "spec": {
            "type": "LoadBalancer",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
            "externalTrafficPolicy": "Cluster",
        }
    })
}

// ----- /proc -----------------------------------------------------------------------------

/// A field of /proc/<pid>/status, e.g. `VmRSS` (KiB) or `Threads`: the first number after
/// `<key>:`.
pub fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// utime + stime (clock ticks) from the text of /proc/<pid>/stat.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    // Fields after the command name (which may contain spaces) start with the state.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// [`status_field`] of `/proc/<pid>/status`.
pub fn proc_status(pid: i32, key: &str) -> Option<u64> {
    status_field(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        key,
    )
}

fn cpu_ticks(pid: i32) -> Option<u64> {
    stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf(3) only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU use of `pids` over `window`, percent of one core each (`None` when a pid vanished).
pub fn cpu_percent(pids: &[i32], window: Duration) -> Vec<Option<f64>> {
    let before: Vec<Option<u64>> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    let t0 = Instant::now();
    std::thread::sleep(window);
    let secs = t0.elapsed().as_secs_f64();
    let hz = clock_ticks_per_s();
    pids.iter()
        .zip(before)
        .map(|(p, b)| {
            let a = cpu_ticks(*p)?;
            Some((a.saturating_sub(b?)) as f64 / hz / secs * 100.0)
        })
        .collect()
}

// ----- metrics ---------------------------------------------------------------------------

/// Samples of metrics whose name contains `task` (any case), e.g. a tokio task gauge, as
/// (`name{labels}`, value); comment lines are skipped.
pub fn task_metrics(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            if !name.to_ascii_lowercase().contains("task") {
                return None;
            }
            Some((series.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Sum of the samples of metric `name` (all label sets), or `None` when absent.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = l.rsplit_once(' ') else {
            continue;
        };
        if series.split('{').next() == Some(name)
            && let Ok(v) = value.trim().parse::<f64>()
        {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

// ----- HTTP probing ----------------------------------------------------------------------

/// One `GET /` (HTTP/1.0) to `addr`; the first body line (the backend's node name) when the
/// answer is `HTTP/1.x 200`. Must run on a thread inside the client's namespace.
///
/// # Errors
/// The I/O error (connect refused / timed out / unreachable ...) or a non-200 answer.
pub fn http_answer(addr: SocketAddr) -> std::io::Result<String> {
    http_answer_within(addr, CONNECT_TIMEOUT)
}

/// [`http_answer`] with a connect timeout of `connect`.
///
/// # Errors
/// As [`http_answer`].
pub fn http_answer_within(addr: SocketAddr, connect: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, connect)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.set_write_timeout(Some(READ_TIMEOUT))?;
    s.write_all(format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut buf = Vec::new();
    s.take(4096).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let ok = text
        .lines()
        .next()
        .is_some_and(|l| l.starts_with("HTTP/1.") && l.split_whitespace().nth(1) == Some("200"));
    if !ok {
        return Err(std::io::Error::other(format!(
            "not a 200 answer: {:?}",
            text.lines().next().unwrap_or_default()
        )));
    }
    Ok(text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| b.lines().next())
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// When a Service first answered and from which node.
#[derive(Debug, Clone)]
pub struct Answer {
    /// When the answer arrived.
    pub at: Instant,
    /// The backend's node name.
    pub node: String,
}

/// Polls `addr` until it answers (see [`http_answer`]) or `deadline`; at most one attempt
/// per [`POLL_INTERVAL`]. Must run inside the client's namespace.
///
/// # Errors
/// At the deadline: the number of attempts and the last error.
pub fn poll_until_answer(addr: SocketAddr, deadline: Instant) -> Result<Answer> {
    let mut attempts = 0u64;
    loop {
        let started = Instant::now();
        attempts += 1;
        let err = match http_answer(addr) {
            Ok(node) => {
                return Ok(Answer {
                    at: Instant::now(),
                    node,
                });
            }
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            bail!("{addr} never answered ({attempts} attempts, last error: {err})");
        }
        let next = started + POLL_INTERVAL;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}

// ----- the bench context -------------------------------------------------------------------

/// HTTP statuses of the bench's own API calls.
#[derive(Debug, Default)]
struct ApiStats {
    by_status: Mutex<BTreeMap<u16, u64>>,
    io_errors: AtomicU64,
    first_errors: Mutex<Vec<String>>,
}

impl ApiStats {
    fn record(&self, what: &str, r: &lab::Result<lab::HttpResponse>) {
        match r {
            Ok(resp) => {
                if let Ok(mut m) = self.by_status.lock() {
                    *m.entry(resp.status).or_default() += 1;
                }
                if !(200..300).contains(&resp.status) {
                    self.note(format!(
                        "{what}: HTTP {}: {}",
                        resp.status,
                        resp.body.chars().take(200).collect::<String>()
                    ));
                }
            }
            Err(e) => {
                self.io_errors.fetch_add(1, Ordering::Relaxed);
                self.note(format!("{what}: {e}"));
            }
        }
    }

    fn note(&self, s: String) {
        if let Ok(mut v) = self.first_errors.lock()
            && v.len() < 5
        {
            v.push(s);
        }
    }

    fn print(&self) {
        let m = self.by_status.lock().map(|m| m.clone()).unwrap_or_default();
        let calls: u64 = m.values().sum();
        let bad: Vec<String> = m
            .iter()
            .filter(|(s, _)| !(200..300).contains(*s))
            .map(|(s, n)| format!("{n} x HTTP {s}"))
            .collect();
        let io = self.io_errors.load(Ordering::Relaxed);
        println!(
            "  bench API calls: {calls} answered, non-2xx: {}, connection errors: {io}",
            if bad.is_empty() {
                "none".to_string()
            } else {
                bad.join(", ")
            }
        );
        for e in self
            .first_errors
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
        {
            println!("    {e}");
        }
    }
}

/// Per-node figures of one moment.
#[derive(Debug, Clone, Default)]
struct NodeSample {
    rss_kib: Option<u64>,
    /// Anonymous (heap, stacks) part of the RSS; the rest is mostly the binary's pages.
    rss_anon_kib: Option<u64>,
    threads: Option<u64>,
    tasks: Vec<(String, f64)>,
    vips_held: Option<f64>,
    active_services: Option<f64>,
}

impl NodeSample {
    fn line(&self) -> String {
        let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
        let tasks = if self.tasks.is_empty() {
            "n/a".to_string()
        } else {
            self.tasks
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            "RSS {:>6.1} MiB (anon {:.1}), threads {:>3}, tasks {tasks}, vipd_vips_held {}, kube_vip_active_services {}",
            self.rss_kib.map_or(f64::NAN, |k| k as f64 / 1024.0),
            self.rss_anon_kib.map_or(f64::NAN, |k| k as f64 / 1024.0),
            opt(self.threads),
            self.vips_held.map_or("?".into(), |v| v.to_string()),
            self.active_services.map_or("?".into(), |v| v.to_string()),
        )
    }
}

/// A lab with HTTP backends and vipd (Services mode, svc_election) on every node.
struct Bench {
    lab: Lab,
    procs: Vec<(String, LabProcess)>,
    api: ApiClient,
    stats: ApiStats,
    verbose: bool,
}

impl Bench {
    fn start(vipd: &Path, verbose: bool) -> Result<Bench> {
        Bench::start_with(vipd, verbose, &[])
    }

    /// As [`Bench::start`], with more vipd settings on every node (`extra` overrides the
    /// defaults; `VIPD_BENCH_ENV` overrides both).
    fn start_with(vipd: &Path, verbose: bool, extra: &[(&str, &str)]) -> Result<Bench> {
        let lab = Lab::start(LabOptions {
            http_backends: true,
            ..LabOptions::default()
        })?;
        let api = lab.admin_client(SocketAddr::new(IpAddr::V4(lab::API_IP), lab::API_PORT))?;
        let mut procs = Vec::new();
        for node in NODES {
            let kubeconfig = lab.kubeconfig(node)?.to_string_lossy().into_owned();
            let env: Vec<(&str, &str)> = vec![
                ("cp_enable", "false"),
                ("svc_enable", "true"),
                ("svc_election", "true"),
                ("address", ""),
                ("vip_arp", "true"),
                ("vip_interface", lab::ETH),
                ("vip_nodename", node),
                ("k8s_config_file", &kubeconfig),
                ("prometheus_server", ":2112"),
                ("vip_loglevel", "info"),
            ];
            // Extra vipd settings for a run, e.g. Service lease timings:
            // VIPD_BENCH_ENV="svc_leaseduration=9,svc_renewdeadline=6,svc_retryperiod=3"
            let mut env = env;
            for (k, v) in extra {
                env.retain(|(ek, _)| ek != k);
                env.push((*k, *v));
            }
            let from_env = std::env::var("VIPD_BENCH_ENV").unwrap_or_default();
            for kv in from_env.split(',').filter(|kv| !kv.is_empty()) {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                env.retain(|(ek, _)| *ek != k);
                env.push((k, v));
            }
            // Profiling: VIPD_BENCH_WRAP="heaptrack -o /tmp/vipd-a" runs node-a's vipd under
            // that command; with `{node}` in it ("heaptrack -o /tmp/hp-{node}") every node's.
            // RSS figures of wrapped nodes are the wrapper's, not vipd's.
            let wrap = std::env::var("VIPD_BENCH_WRAP").unwrap_or_default();
            let wrapped = !wrap.trim().is_empty() && (node == NODES[0] || wrap.contains("{node}"));
            let proc = if wrapped {
                let wrap = wrap.replace("{node}", node);
                let mut words: Vec<String> = wrap.split_whitespace().map(String::from).collect();
                let program = words.remove(0);
                words.push(vipd.to_string_lossy().into_owned());
                words.push("manager".into());
                lab.spawn(node, &program, &words, &env)?
            } else {
                lab.spawn(node, vipd, &["manager"], &env)?
            };
            procs.push((node.to_string(), proc));
        }
        let b = Bench {
            lab,
            procs,
            api,
            stats: ApiStats::default(),
            verbose,
        };
        b.wait_ready()?;
        Ok(b)
    }

    fn say(&self, s: impl AsRef<str>) {
        if self.verbose {
            eprintln!("    {}", s.as_ref());
        }
    }

    /// Waits until every vipd answers /healthz and logged that it watches Services.
    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        for (node, p) in &self.procs {
            loop {
                let healthy = self
                    .metrics_get(node, "/healthz")
                    .is_ok_and(|b| b.contains("ok"));
                if healthy && p.log().contains("watching LoadBalancer Services") {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "vipd on {node} not ready after 30 s (healthz: {healthy}); log:\n{}",
                        tail(&p.log(), 30)
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // The Service and Endpoints reflectors list right after that line; let them.
        std::thread::sleep(Duration::from_secs(1));
        Ok(())
    }

    fn metrics_get(&self, node: &str, path: &str) -> Result<String> {
        let t = Duration::from_secs(2);
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), METRICS_PORT);
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), METRICS_PORT);
        match self.lab.http_get(node, v6, path, t) {
            Ok(b) => Ok(b),
            Err(_) => Ok(self.lab.http_get(node, v4, path, t)?),
        }
    }

    fn pid(&self, node: &str) -> Option<i32> {
        self.procs
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, p)| p.pid())
    }

    fn sample(&self, node: &str) -> NodeSample {
        let pid = self.pid(node);
        let metrics = self.metrics_get(node, "/metrics").unwrap_or_default();
        NodeSample {
            rss_kib: pid.and_then(|p| proc_status(p, "VmRSS")),
            rss_anon_kib: pid.and_then(|p| proc_status(p, "RssAnon")),
            threads: pid.and_then(|p| proc_status(p, "Threads")),
            tasks: task_metrics(&metrics),
            vips_held: metric_sum(&metrics, "vipd_vips_held"),
            active_services: metric_sum(&metrics, "kube_vip_active_services"),
        }
    }

    fn samples(&self) -> Vec<(String, NodeSample)> {
        NODES
            .iter()
            .map(|n| (n.to_string(), self.sample(n)))
            .collect()
    }

    /// Runs `f` on a thread in the client namespace (threads it spawns stay there).
    fn in_client<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        Ok(self.lab.in_netns("client", f)?)
    }

    /// Creates `default/<name>` with `addr`; must run inside a lab namespace. A call that
    /// got no answer (the lab client's 5 s timeout) is repeated up to twice; 409
    /// AlreadyExists on a repeat means the first call went through. Returns whether the
    /// Service exists.
    fn create(&self, name: &str, addr: IpAddr) -> bool {
        let body = service_json(name, addr).to_string();
        for attempt in 0..3 {
            let r = self.api.request(
                "POST",
                &format!("/api/v1/namespaces/{NAMESPACE}/services"),
                Some(&body),
            );
            self.stats.record(&format!("create {name}"), &r);
            match r {
                Ok(x) if x.status == 201 => return true,
                Ok(x) if x.status == 409 && attempt > 0 => return true,
                Ok(_) => return false,
                Err(_) => continue,
            }
        }
        false
    }

    /// Deletes `default/<name>`; must run inside a lab namespace.
    fn delete(&self, name: &str) -> bool {
        let r = self.api.request(
            "DELETE",
            &format!("/api/v1/namespaces/{NAMESPACE}/services/{name}"),
            None,
        );
        self.stats.record(&format!("delete {name}"), &r);
        matches!(r, Ok(ref x) if matches!(x.status, 200 | 202))
    }

    /// Leases in `default` (must run inside a lab namespace): the list's resourceVersion
    /// and (name, holderIdentity) of each.
    fn leases(&self) -> Result<(String, BTreeMap<String, String>)> {
        let r = self.api.request(
            "GET",
            &format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"),
            None,
        );
        self.stats.record("list leases", &r);
        let r = r?;
        if r.status != 200 {
            bail!("list leases: HTTP {}: {}", r.status, r.body);
        }
        let v: serde_json::Value = serde_json::from_str(&r.body).context("lease list JSON")?;
        let rv = v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut out = BTreeMap::new();
        for l in v["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
            out.insert(
                l["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                l["spec"]["holderIdentity"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
        Ok((rv, out))
    }

    /// Counts Lease writes in `default` with a watch for `window` (must run inside a lab
    /// namespace): (writes, writes per second, holder changes, leases at the start).
    fn lease_writes(&self, window: Duration) -> Result<LeaseWatch> {
        let (rv, mut holders) = self.leases()?;
        let leases = holders.len();
        let path = format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases?watch=1&resourceVersion={rv}&timeoutSeconds={}",
            window.as_secs().max(1)
        );
        let t0 = Instant::now();
        let r = self.api.request("GET", &path, None);
        let took = t0.elapsed();
        self.stats.record("watch leases", &r);
        let r = r?;
        if r.status != 200 {
            bail!("watch leases: HTTP {}: {}", r.status, r.body);
        }
        let mut writes = 0u64;
        let mut holder_changes = 0u64;
        for e in r
            .body
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        {
            if !matches!(e["type"].as_str(), Some("MODIFIED" | "ADDED" | "DELETED")) {
                continue;
            }
            writes += 1;
            let name = e["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let h = e["object"]["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if holders.insert(name, h.clone()).is_some_and(|old| old != h) {
                holder_changes += 1;
            }
        }
        Ok(LeaseWatch {
            writes,
            per_s: writes as f64 / took.as_secs_f64().max(1.0),
            seconds: took.as_secs_f64(),
            holder_changes,
            leases,
        })
    }

    /// Nodes' eth0 addresses that are in `addrs`, per node.
    fn carried(&self, addrs: &BTreeSet<IpAddr>) -> Result<BTreeMap<String, usize>> {
        let mut out = BTreeMap::new();
        for n in NODES {
            let c = self
                .lab
                .addresses(n, lab::ETH)?
                .iter()
                .filter(|a| addrs.contains(&a.addr))
                .count();
            out.insert(n.to_string(), c);
        }
        Ok(out)
    }

    /// Prints WARN/ERROR counts and the first distinct lines of each vipd's log.
    fn print_logs(&self) {
        println!("  vipd logs:");
        for (node, p) in &self.procs {
            let log = p.log();
            let (warn, err, panics, examples) = log_findings(&log);
            println!(
                "    {node}: {} lines, {warn} WARN, {err} ERROR, {panics} panics",
                log.lines().count()
            );
            for e in examples {
                println!("      {e}");
            }
        }
    }

    fn stop(mut self) {
        // SIGTERM all first so they release their leases in parallel.
        for (_, p) in &self.procs {
            let _ = p.signal(lab::Signal::SIGTERM);
        }
        for (node, p) in &mut self.procs {
            match p.stop(Duration::from_secs(20)) {
                Ok(st) if st.success() => {}
                Ok(st) => println!("  vipd on {node} exited with {st}"),
                Err(e) => println!("  stopping vipd on {node}: {e}"),
            }
        }
    }
}

/// Result of [`Bench::lease_writes`].
#[derive(Debug, Clone, Copy)]
struct LeaseWatch {
    writes: u64,
    per_s: f64,
    seconds: f64,
    holder_changes: u64,
    leases: usize,
}

/// (WARN lines, ERROR lines, panics, up to 6 distinct WARN/ERROR messages without their
/// timestamp) of a vipd log.
pub fn log_findings(log: &str) -> (usize, usize, usize, Vec<String>) {
    let mut warn = 0;
    let mut err = 0;
    let mut seen = BTreeSet::new();
    let mut examples = Vec::new();
    for l in log.lines() {
        let is_warn = l.contains(" WARN ");
        let is_err = l.contains("ERROR ");
        if !(is_warn || is_err) {
            continue;
        }
        if is_warn {
            warn += 1;
        } else {
            err += 1;
        }
        let msg = l.split_once(' ').map_or(l, |(_, m)| m).trim();
        // Group by the message start (fields after it often carry names and addresses).
        let key: String = msg.chars().take(60).collect();
        if examples.len() < 6 && seen.insert(key) {
            examples.push(msg.chars().take(240).collect());
        }
    }
    let panics = log.matches("panicked").count();
    (warn, err, panics, examples)
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ----- scenarios -------------------------------------------------------------------------

/// (latency ms, answering node) per answered Service, and one message per failure.
type BringupResult = (Vec<(f64, String)>, Vec<String>);

/// Creates `names[i]` with `addrs[i]` one at a time, each polled until it answers (10 s
/// limit); returns (latency ms, node) per answered Service and the failures.
fn sequential_bringup(b: &Bench, names: &[String], addrs: &[IpAddr]) -> Result<BringupResult> {
    b.in_client(|| {
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        for (name, addr) in names.iter().zip(addrs) {
            if !b.create(name, *addr) {
                failed.push(format!("{name}: create failed"));
                continue;
            }
            let created = Instant::now();
            match poll_until_answer(
                SocketAddr::new(*addr, 80),
                created + Duration::from_secs(10),
            ) {
                Ok(a) => {
                    let l = ms(a.at.duration_since(created));
                    b.say(format!("{name} {addr}: {l:.0} ms ({})", a.node));
                    ok.push((l, a.node));
                }
                Err(e) => failed.push(format!("{name}: {e}")),
            }
        }
        (ok, failed)
    })
}

fn print_bringup(label: &str, ok: &[(f64, String)], failed: &[String]) {
    let lat: Vec<f64> = ok.iter().map(|(l, _)| *l).collect();
    let mut by_node: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, n) in ok {
        *by_node.entry(n.as_str()).or_default() += 1;
    }
    println!("  {label}: created -> first answer: {}", summary_ms(&lat));
    println!(
        "    answered by: {by_node:?}; not answered within 10 s: {}",
        failed.len()
    );
    for f in failed.iter().take(5) {
        println!("    {f}");
    }
}

/// Scenario (a).
fn bringup(vipd: &Path, verbose: bool) -> Result<()> {
    println!(
        "== bench services: bring-up ({BRINGUP_V4} IPv4 + {BRINGUP_V6} IPv6 Services, one at a time)"
    );
    let b = Bench::start(vipd, verbose)?;
    let names: Vec<String> = (0..BRINGUP_V4).map(|i| format!("bringup-{i}")).collect();
    let addrs = (0..BRINGUP_V4)
        .map(v4_address)
        .collect::<Result<Vec<_>>>()?;
    let (ok4, failed4) = sequential_bringup(&b, &names, &addrs)?;
    let names6: Vec<String> = (0..BRINGUP_V6).map(|i| format!("bringup6-{i}")).collect();
    let addrs6 = (0..BRINGUP_V6)
        .map(v6_bringup_address)
        .collect::<Result<Vec<_>>>()?;
    let (ok6, failed6) = sequential_bringup(&b, &names6, &addrs6)?;
    print_bringup("IPv4 (192.0.2.150-199)", &ok4, &failed4);
    print_bringup("IPv6 (2001:db8::2:1-a)", &ok6, &failed6);
    for (n, s) in b.samples() {
        println!("  {n}: {}", s.line());
    }
    b.stats.print();
    b.print_logs();
    b.stop();
    Ok(())
}

/// Scenario (b).
fn scale(vipd: &Path, n: usize, verbose: bool) -> Result<()> {
    println!("== bench services: scale ({n} IPv6 Services, svc_election, 3 nodes)");
    let b = Bench::start(vipd, verbose)?;
    let addrs = (0..n).map(scale_address).collect::<Result<Vec<_>>>()?;
    let idle = b.samples();
    let limit = Duration::from_secs(60 + n as u64 / 10);
    let run = scale_create(&b, &addrs, limit)?;
    print_scale_creation(&b, n, &run);
    scale_steady_state(&b, &addrs, &idle)?;
    b.stats.print();
    b.print_logs();
    b.stop();
    Ok(())
}

/// What the creation phase of the scale scenario recorded, per Service in address order.
struct ScaleRun {
    /// Just before the first create call.
    t0: Instant,
    /// When the last create call returned.
    create_done: OnceLock<Instant>,
    /// When every poller had finished.
    all_done: Instant,
    /// When each Service's create call returned (unset: it failed).
    created: Vec<OnceLock<Instant>>,
    /// Each Service's first answer (unset: none within the limit).
    answered: Vec<OnceLock<Answer>>,
    failures: Mutex<Vec<String>>,
}

/// Creates a Service per address from [`CREATE_THREADS`] threads, each followed by a poller
/// thread that waits (up to `limit` after the create) for its first answer.
fn scale_create(b: &Bench, addrs: &[IpAddr], limit: Duration) -> Result<ScaleRun> {
    let created: Vec<OnceLock<Instant>> = (0..addrs.len()).map(|_| OnceLock::new()).collect();
    let answered: Vec<OnceLock<Answer>> = (0..addrs.len()).map(|_| OnceLock::new()).collect();
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let t0 = Instant::now();
    let create_done: OnceLock<Instant> = OnceLock::new();
    b.in_client(|| {
        std::thread::scope(|s| -> Result<()> {
            let mut creators = Vec::new();
            for k in 0..CREATE_THREADS {
                let (created, answered, failures) = (&created, &answered, &failures);
                creators.push(s.spawn(move || -> Result<()> {
                    for i in (k..addrs.len()).step_by(CREATE_THREADS) {
                        let addr = addrs[i];
                        if !b.create(&format!("scale-{i}"), addr) {
                            if let Ok(mut f) = failures.lock() {
                                f.push(format!("scale-{i}: create failed"));
                            }
                            continue;
                        }
                        let at = Instant::now();
                        let _ = created[i].set(at);
                        std::thread::Builder::new()
                            .name(format!("poll-{i}"))
                            .stack_size(128 * 1024)
                            .spawn_scoped(s, move || {
                                match poll_until_answer(SocketAddr::new(addr, 80), at + limit) {
                                    Ok(a) => {
                                        let _ = answered[i].set(a);
                                    }
                                    Err(e) => {
                                        if let Ok(mut f) = failures.lock() {
                                            f.push(e.to_string());
                                        }
                                    }
                                }
                            })
                            .context("spawn a poller thread")?;
                    }
                    Ok(())
                }));
            }
            for c in creators {
                c.join().map_err(|_| anyhow!("creator thread panicked"))??;
            }
            let _ = create_done.set(Instant::now());
            Ok(())
        })
    })??;
    Ok(ScaleRun {
        t0,
        create_done,
        all_done: Instant::now(),
        created,
        answered,
        failures,
    })
}

/// Prints the creation phase: rate, time until all answered, per-Service latency, the
/// answering nodes and the first failures.
fn print_scale_creation(b: &Bench, n: usize, run: &ScaleRun) {
    let created_n = run.created.iter().filter(|c| c.get().is_some()).count();
    let answered_n = run.answered.iter().filter(|a| a.get().is_some()).count();
    let per_service: Vec<f64> = run
        .created
        .iter()
        .zip(&run.answered)
        .filter_map(|(c, a)| Some(ms(a.get()?.at.saturating_duration_since(*c.get()?))))
        .collect();
    let last_answer = run
        .answered
        .iter()
        .filter_map(|a| a.get().map(|a| a.at))
        .max();
    let create_secs = run
        .create_done
        .get()
        .map_or(f64::NAN, |d| d.duration_since(run.t0).as_secs_f64());
    let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
    for a in run.answered.iter().filter_map(OnceLock::get) {
        *by_node.entry(a.node.clone()).or_default() += 1;
    }
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
        match (last_answer, run.create_done.get()) {
            (Some(l), Some(c)) => format!("{:.2} s", l.saturating_duration_since(*c).as_secs_f64()),
            _ => "n/a".into(),
        }
    );
    println!(
        "  per Service, own create -> first answer: {}",
        summary_ms(&per_service)
    );
    println!("  answered by: {by_node:?}");
    let fails = run.failures.lock().map(|f| f.clone()).unwrap_or_default();
    if !fails.is_empty() {
        println!("  {} failures, first ones:", fails.len());
        for f in fails.iter().take(5) {
            println!("    {f}");
        }
    }
    b.say(format!(
        "polling finished {:.1} s after start",
        run.all_done.duration_since(run.t0).as_secs_f64()
    ));
}

/// Steady state: lets renewals settle, then watches Leases and samples CPU for
/// [`STEADY_WINDOW`], and prints them with the carried addresses and each node's sample
/// (RSS before the Services from `idle`).
fn scale_steady_state(b: &Bench, addrs: &[IpAddr], idle: &[(String, NodeSample)]) -> Result<()> {
    // Steady state: let renewals settle, then watch Leases and sample CPU for 10 s.
    std::thread::sleep(Duration::from_secs(5));
    let addr_set: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    let carried = b.carried(&addr_set)?;
    let mut pids: Vec<i32> = NODES.iter().filter_map(|n| b.pid(n)).collect();
    let cp = b.lab.control_plane_pids();
    pids.extend(&cp);
    let (watch, cpu) = std::thread::scope(|s| {
        let w = s.spawn(|| b.in_client(|| b.lease_writes(STEADY_WINDOW)));
        let cpu = cpu_percent(&pids, STEADY_WINDOW);
        (w.join(), cpu)
    });
    let (_, holders) = b.in_client(|| b.leases())??;
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
        "  steady state ({} s window, 5 s after the last answer):",
        STEADY_WINDOW.as_secs()
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
    println!("    Leases by holder: {lease_by_holder:?}");
    println!("    addresses carried on eth0: {carried:?}");
    let pct = |v: Option<&Option<f64>>| {
        v.copied()
            .flatten()
            .map_or("?".into(), |p| format!("{p:.0}%"))
    };
    for (i, node) in NODES.iter().enumerate() {
        let s = b.sample(node);
        let before = idle
            .iter()
            .find(|(n, _)| n == node)
            .and_then(|(_, s)| s.rss_kib)
            .map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0));
        println!(
            "    {node}: CPU {} | {} | RSS before the Services {before} MiB",
            pct(cpu.get(i)),
            s.line()
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

/// Per-minute sample of the churn run.
struct ChurnSample {
    minute: f64,
    cycles: usize,
    nodes: Vec<(String, NodeSample)>,
}

/// Scenario (c).
fn churn(vipd: &Path, minutes: f64, verbose: bool) -> Result<()> {
    println!(
        "== bench services: churn ({CHURN_SERVICES} Services created/answered/deleted in a loop for {minutes} min)"
    );
    let b = Bench::start(vipd, verbose)?;
    let names: Vec<String> = (0..CHURN_SERVICES).map(|i| format!("churn-{i}")).collect();
    let addrs = (0..CHURN_SERVICES)
        .map(v4_address)
        .collect::<Result<Vec<_>>>()?;
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
    b.stats.print();
    b.print_logs();
    b.stop();
    Ok(())
}

/// Services of the drain scenario (192.0.2.150-164).
pub const DRAIN_SERVICES: usize = 15;

/// A Service that stayed where it was during the drain may not have a gap longer than this
/// (it would be a side effect of the drain).
pub const DRAIN_QUIET_GAP: Duration = Duration::from_millis(100);

/// Connect timeout of the drain scenario's probes: in the lab a connect takes well under
/// 1 ms, so a SYN unanswered for this long was lost (the VIP was moving); a shorter timeout
/// than [`CONNECT_TIMEOUT`] keeps the measured gap close to the real one.
pub const DRAIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(30);

/// Every probe of one Service: when each attempt ended, and the answering node (`None`:
/// failed).
type ProbeLog = Vec<(Instant, Option<String>)>;

/// Probes `addr` (one attempt per [`POLL_INTERVAL`] at most) until `stop`. Must run inside
/// the client's namespace.
fn probe_until(addr: SocketAddr, stop: &std::sync::atomic::AtomicBool) -> ProbeLog {
    let mut log = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let r = http_answer_within(addr, DRAIN_CONNECT_TIMEOUT).ok();
        log.push((Instant::now(), r));
        let next = started + POLL_INTERVAL;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    log
}

/// What one Service's probe saw around a drain of `from` at `t0`.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainMove {
    /// Last answer from `from` (ms after `t0`; negative: before the drain started).
    pub last_old_ms: f64,
    /// First answer from another node after that (ms after `t0`).
    pub first_new_ms: f64,
    /// `first_new_ms - last_old_ms`: the client-visible gap, ms.
    pub gap_ms: f64,
    /// Failed attempts in between.
    pub failures: usize,
    /// The node that answered then.
    pub to: String,
}

/// The move of one Service off `from`, from its probe `log` (`None` when it never answered
/// from `from`, or never from another node after that). Pure.
pub fn drain_move(log: &[(Instant, Option<String>)], from: &str, t0: Instant) -> Option<DrainMove> {
    let rel = |t: Instant| -> f64 { if t >= t0 { ms(t - t0) } else { -ms(t0 - t) } };
    let last_old = log.iter().rposition(|(_, n)| n.as_deref() == Some(from))?;
    let (first_new, to) = log
        .iter()
        .enumerate()
        .skip(last_old + 1)
        .find_map(|(i, (_, n))| n.as_ref().map(|n| (i, n.clone())))?;
    let failures = log[last_old + 1..first_new]
        .iter()
        .filter(|(_, n)| n.is_none())
        .count();
    let (a, b) = (rel(log[last_old].0), rel(log[first_new].0));
    Some(DrainMove {
        last_old_ms: a,
        first_new_ms: b,
        gap_ms: b - a,
        failures,
        to,
    })
}

/// The longest time between two consecutive successful answers in `log`, ms (0 with fewer
/// than two). Pure.
pub fn longest_gap_ms(log: &[(Instant, Option<String>)]) -> f64 {
    let ok: Vec<Instant> = log
        .iter()
        .filter(|(_, n)| n.is_some())
        .map(|(t, _)| *t)
        .collect();
    ok.windows(2).map(|w| ms(w[1] - w[0])).fold(0.0, f64::max)
}

/// Scenario (d).
fn drain(vipd: &Path, verbose: bool) -> Result<()> {
    println!(
        "== bench services: drain ({DRAIN_SERVICES} IPv4 Services over 3 nodes, `vipd drain` on the node answering most)"
    );
    let b = Bench::start(vipd, verbose)?;
    let names: Vec<String> = (0..DRAIN_SERVICES).map(|i| format!("drain-{i}")).collect();
    let addrs = (0..DRAIN_SERVICES)
        .map(v4_address)
        .collect::<Result<Vec<_>>>()?;
    let (up, failed) = sequential_bringup(&b, &names, &addrs)?;
    if !failed.is_empty() {
        bail!("drain: Services did not come up: {failed:?}");
    }
    // Let the spread settle (leases acquired in the first seconds), then read the holders
    // from the answers.
    std::thread::sleep(Duration::from_secs(3));
    let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
    for (_, n) in &up {
        *by_node.entry(n.clone()).or_default() += 1;
    }
    let node = by_node
        .iter()
        .max_by_key(|(_, c)| **c)
        .map(|(n, _)| n.clone())
        .ok_or_else(|| anyhow!("drain: no Service answered"))?;
    let admin = format!("127.0.0.1:{METRICS_PORT}");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (logs, t0, drain_out) = b.in_client(|| {
        std::thread::scope(|s| {
            let probes: Vec<_> = addrs
                .iter()
                .map(|a| {
                    let stop = &stop;
                    s.spawn(move || probe_until(SocketAddr::new(*a, 80), stop))
                })
                .collect();
            std::thread::sleep(Duration::from_secs(1));
            let t0 = Instant::now();
            let out = b
                .lab
                .exec(&node, vipd, &["drain", "--admin", admin.as_str()]);
            // Long enough for every move (graceful: tens of ms each, paced by the spread).
            std::thread::sleep(Duration::from_secs(5));
            stop.store(true, Ordering::SeqCst);
            let logs: Vec<ProbeLog> = probes
                .into_iter()
                .map(|p| p.join().unwrap_or_default())
                .collect();
            (logs, t0, out)
        })
    })?;
    let drained = drain_out
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("failed: {e}"));
    println!("  Services per node before: {by_node:?}; `vipd drain` on {node}: {drained}");
    let mut gaps = Vec::new();
    let mut still_on_drained = Vec::new();
    let mut others = Vec::new();
    for ((name, addr), log) in names.iter().zip(&addrs).zip(&logs) {
        let after: Vec<&Option<String>> = log
            .iter()
            .filter(|(t, _)| *t >= t0 + Duration::from_secs(3))
            .map(|(_, n)| n)
            .collect();
        if after.iter().any(|n| n.as_deref() == Some(node.as_str())) {
            still_on_drained.push(name.clone());
        }
        match drain_move(log, &node, t0) {
            Some(m) => {
                b.say(format!(
                    "{name} {addr}: {node} -> {}: gap {:.0} ms ({} failed attempts; last old answer at {:.0} ms)",
                    m.to, m.gap_ms, m.failures, m.last_old_ms
                ));
                gaps.push(m);
            }
            None => others.push(longest_gap_ms(log)),
        }
    }
    let g: Vec<f64> = gaps.iter().map(|m| m.gap_ms).collect();
    let mut to: BTreeMap<&str, usize> = BTreeMap::new();
    for m in &gaps {
        *to.entry(m.to.as_str()).or_default() += 1;
    }
    println!(
        "  moved: {} VIPs, gap (last answer from {node} -> first from the new node): {}",
        gaps.len(),
        summary_ms(&g)
    );
    println!(
        "    failed attempts per move: max {}; taken by: {to:?}; last VIP answered from its new node {:.0} ms after `vipd drain` started",
        gaps.iter().map(|m| m.failures).max().unwrap_or(0),
        gaps.iter().map(|m| m.first_new_ms).fold(0.0, f64::max)
    );
    let quiet_max = others.iter().copied().fold(0.0, f64::max);
    println!(
        "  the {} Services on other nodes: longest gap {quiet_max:.0} ms (limit {} ms){}",
        others.len(),
        DRAIN_QUIET_GAP.as_millis(),
        if quiet_max > ms(DRAIN_QUIET_GAP) {
            "  <-- over"
        } else {
            ""
        }
    );
    println!(
        "  answered from {node} more than 3 s after the drain: {}",
        if still_on_drained.is_empty() {
            "none".to_string()
        } else {
            format!("{still_on_drained:?}  <-- not drained")
        }
    );
    b.stats.print();
    b.print_logs();
    b.stop();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_defaults_and_errors_name_flag_and_value() {
        let o = Options::parse(&[]).unwrap();
        assert_eq!(o, Options::default());
        let o = Options::parse(&["--scenario", "churn", "--minutes", "2.5", "--no-build"]).unwrap();
        assert_eq!(o.scenarios, [Scenario::Churn].into());
        assert_eq!(o.minutes, 2.5);
        assert!(!o.build);
        let o = Options::parse(&["--scenario", "scale,bringup", "--services", "300"]).unwrap();
        assert_eq!(o.scenarios, [Scenario::Bringup, Scenario::Scale].into());
        assert_eq!(o.services, 300);
        for (args, needle) in [
            (vec!["--scenario", "fast"], "\"fast\""),
            (vec!["--services", "0"], "--services"),
            (vec!["--services", "x1"], "\"x1\""),
            (vec!["--minutes", "-1"], "--minutes"),
            (vec!["--minutes"], "needs a value"),
            (vec!["--frobnicate"], "--frobnicate"),
        ] {
            let e = Options::parse(&args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn dhcp_scenario_and_its_service_count_are_parsed() {
        let o = Options::parse(&["--scenario", "dhcp", "--dhcp-services", "7"]).unwrap();
        assert_eq!(o.scenarios, [Scenario::Dhcp].into());
        assert_eq!(o.dhcp_services, 7);
        assert_eq!(Options::default().dhcp_services, 20);
        assert!(Options::default().scenarios.contains(&Scenario::Dhcp));
        let e = Options::parse(&["--dhcp-services", "72"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--dhcp-services") && e.contains("72"), "{e}");
    }

    #[test]
    fn drain_scenario_is_parsed_and_in_all() {
        let o = Options::parse(&["--scenario", "drain"]).unwrap();
        assert_eq!(o.scenarios, [Scenario::Drain].into());
        let o = Options::parse(&["--scenario", "all"]).unwrap();
        assert!(o.scenarios.contains(&Scenario::Drain));
    }

    #[test]
    fn drain_move_is_last_old_answer_to_first_new_one() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let a = || Some("node-a".to_string());
        let b = || Some("node-b".to_string());
        let log = vec![
            (at(0), a()),
            (at(10), a()),
            (at(20), None),
            (at(30), None),
            (at(70), b()),
            (at(80), b()),
        ];
        let m = drain_move(&log, "node-a", at(5)).unwrap();
        assert_eq!((m.gap_ms, m.failures, m.to.as_str()), (60.0, 2, "node-b"));
        assert_eq!((m.last_old_ms, m.first_new_ms), (5.0, 65.0));
        assert_eq!(drain_move(&log, "node-c", t0), None, "never on node-c");
        assert_eq!(
            drain_move(&log[..4], "node-a", t0),
            None,
            "never answered again"
        );
        assert_eq!(longest_gap_ms(&log), 60.0);
        assert_eq!(longest_gap_ms(&log[..1]), 0.0);
    }

    #[test]
    fn addresses_stay_in_the_lab_subnets() {
        assert_eq!(v4_address(0).unwrap().to_string(), "192.0.2.150");
        assert_eq!(v4_address(49).unwrap().to_string(), "192.0.2.199");
        assert!(v4_address(50).is_err());
        assert_eq!(scale_address(0).unwrap().to_string(), "2001:db8::1:1");
        assert_eq!(scale_address(999).unwrap().to_string(), "2001:db8::1:3e8");
        assert!(scale_address(MAX_SCALE_SERVICES).is_err());
        assert_eq!(v6_bringup_address(9).unwrap().to_string(), "2001:db8::2:a");
        let all: BTreeSet<IpAddr> = (0..MAX_SCALE_SERVICES)
            .map(|i| scale_address(i).unwrap())
            .collect();
        assert_eq!(all.len(), MAX_SCALE_SERVICES, "addresses are distinct");
        // None collides with the nodes (::11-13), the client (::100) or the gateway (::1).
        for ip in [lab::CLIENT_V6, lab::GATEWAY_V6] {
            assert!(!all.contains(&IpAddr::V6(ip)));
        }
    }

    #[test]
    fn service_json_carries_address_annotation() {
        let s = service_json("web", "2001:db8::1:5".parse().unwrap());
        assert_eq!(
            s["metadata"]["annotations"]["kube-vip.io/loadbalancerIPs"],
            "2001:db8::1:5"
        );
        assert_eq!(s["spec"]["type"], "LoadBalancer");
        assert_eq!(s["spec"]["ports"][0]["port"], 80);
    }

    #[test]
    fn proc_parsing() {
        let status = "Name:\tvipd\nVmRSS:\t   12345 kB\nThreads:\t7\n";
        assert_eq!(status_field(status, "VmRSS"), Some(12345));
        assert_eq!(status_field(status, "Threads"), Some(7));
        assert_eq!(status_field(status, "VmSwap"), None);
        let stat = "42 (vipd (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0";
        assert_eq!(stat_cpu_ticks(stat), Some(300));
        assert_eq!(stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn metrics_parsing() {
        let text = "# HELP vipd_vips_held VIPs\n# TYPE vipd_vips_held gauge\nvipd_vips_held 3\n\
                    kube_vip_active_services{namespace=\"default\"} 2\n\
                    kube_vip_active_services{namespace=\"other\"} 1\n\
                    vipd_tokio_alive_tasks 41\n";
        assert_eq!(metric_sum(text, "vipd_vips_held"), Some(3.0));
        assert_eq!(metric_sum(text, "kube_vip_active_services"), Some(3.0));
        assert_eq!(metric_sum(text, "vipd_missing"), None);
        assert_eq!(
            task_metrics(text),
            vec![("vipd_tokio_alive_tasks".to_string(), 41.0)]
        );
    }

    #[test]
    fn log_findings_counts_levels_and_dedups() {
        let log = "2025-01-01T00:00:00Z  INFO started\n\
                   2025-01-01T00:00:01Z  WARN lease renew failed lease=a\n\
                   2025-01-01T00:00:02Z  WARN lease renew failed lease=a\n\
                   2025-01-01T00:00:03Z ERROR watch failed\n\
                   thread 'x' panicked at src/a.rs\n";
        let (w, e, p, ex) = log_findings(log);
        assert_eq!((w, e, p), (2, 1, 1));
        assert_eq!(ex.len(), 2, "{ex:?}");
        assert!(ex[0].starts_with("WARN lease renew failed"), "{ex:?}");
    }

    #[test]
    fn http_answer_reads_node_name_and_rejects_non_200() {
        use std::net::TcpListener;
        let serve = |reply: &'static str| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf);
                s.write_all(reply.as_bytes()).unwrap();
            });
            addr
        };
        let a = serve("HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nnode-b\n");
        assert_eq!(http_answer(a).unwrap(), "node-b");
        let a = serve("HTTP/1.0 503 Service Unavailable\r\n\r\nbusy\n");
        assert!(http_answer(a).is_err());
    }
}
