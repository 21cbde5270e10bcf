//! `cargo xtask bench services`: figures for vipd's LoadBalancer Services (S31, S32) in the
//! lab. It prints figures, not pass/fail; docs/services-bench.md records a run against its
//! targets (30 MB per node, p95 create-to-answer).
//!
//! ```text
//! cargo xtask bench services [--scenario bringup|scale|coldstart|churn|drain|dhcp|all] [--services N]
//!     [--minutes M] [--dhcp-services N] [--no-build] [--vipd PATH] [-v]
//! ```
//!
//! Every scenario gets its own lab ([`Lab::start`](xtask::lab::Lab::start) with HTTP backends: every node answers
//! `GET /` on port 80 of any local address, VIPs included, with its node name) and runs the
//! release build of vipd on node-a, node-b and node-c in Services mode with `svc_election`
//! (one Lease `kubevip-<service>` per Service in `default`), vipd's default lease timings
//! 3/2/1 s (the bench sets none), `vip_interface=eth0` and `prometheus_server=:2112`.
//! Services are created, deleted and listed through the lab API server (admin token) from
//! the `client` namespace, and "answered" always means: an HTTP/1.0 `GET /` from the
//! `client` namespace to `<address>:80` got an `HTTP/1.x 200` answer. Each Service is polled
//! by its own thread (new TCP connection per attempt, connect timeout [`CONNECT_TIMEOUT`],
//! one attempt every [`POLL_INTERVAL`] at most), so a Service that answers late never
//! delays the measurement of another; scale and coldstart (and its poweroff phase) instead
//! share [`POLLERS`](http::POLLERS) threads among the Services not answered yet
//! ([`http::Poller`]): a listing of the nodes' eth0 addresses about every
//! [`SAMPLE_INTERVAL`](http::SAMPLE_INTERVAL) says which addresses a node carries, and those
//! are tried first, the others only by [`BACKGROUND_POLLERS`](http::BACKGROUND_POLLERS)
//! threads, so a carried address is tried within about one listing interval whatever the
//! number of Services waiting.
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
//! - **coldstart**: the other order. The same N Services (`scale-<i>`, same addresses, 4
//!   threads) are created while no vipd runs; then vipd starts on the three nodes and every
//!   Service is polled from the moment the vipd processes are spawned, until it answers or
//!   60 s + N/100 s passed. Prints p50/p95/max of vipd start -> first answer, the time until
//!   all answered, the answering nodes, the polling figures (the listing interval and the
//!   delay from a listing that shows an address carried to its first try: together they
//!   bound the figures' resolution), then the steady state of scale, then a poweroff
//!   phase: the node carrying the most Service addresses loses its vipd (SIGKILL) and its
//!   link at once, as in `bench failover --scenario poweroff`; per address it carried, the
//!   time until it answers again from another node (p50/p95/max, 30 s at most), the
//!   answering nodes, and in samples every 200 ms of the two remaining nodes' eth0
//!   addresses how many had an address on both (expected 0). Prints the Service lease
//!   timing vipd runs with (3/2/1 s unless `VIPD_BENCH_ENV` sets others) to compare the
//!   slowest takeover with the lease duration + 1 s, per address the first listing that
//!   showed it on a remaining node, and per lease the powered-off node held, from a lease
//!   watch opened 2 s before: its last renewal seen, when another node took it, and how long
//!   after its expiry ([`poweroff::LeaseMoves`]). Not part of `all`.
//! - **churn**: 20 Services (192.0.2.150-169) created, answered, deleted (until no node
//!   carries their addresses) and created again, for M minutes (default 10). Prints VmRSS,
//!   thread count and any task-count gauge vipd's `/metrics` exposes (metric names containing
//!   `task`) per node at the start (after the first cycle) and at the end (after the last
//!   cycle, same state), a sample per minute, cycle figures, and the Leases left over.
//! - **drain**: [`DRAIN_SERVICES`](drain::DRAIN_SERVICES) Services (192.0.2.150-164) created one at a time and
//!   spread over the nodes; each is then probed continuously (one thread per Service, one
//!   attempt per [`POLL_INTERVAL`] at most) while `vipd drain` runs on the node that answers
//!   most of them. Per Service VIP that moved: the gap (last answer from the drained node ->
//!   first answer from another), failed attempts in between, and who took it. Prints
//!   p50/p95/max of the gaps, that no Service answered from the drained node afterwards, and
//!   that the other Services had no gap longer than [`DRAIN_QUIET_GAP`](drain::DRAIN_QUIET_GAP). These probes use a
//!   connect timeout of [`DRAIN_CONNECT_TIMEOUT`](drain::DRAIN_CONNECT_TIMEOUT), so a SYN lost while a VIP moves costs
//!   that, not [`CONNECT_TIMEOUT`].
//! - **dhcp**: DHCP mode (issue 13) against dnsmasq, in two labs of its own; see
//!   [`dhcp`] (bring-up to the first ARP answer from the macvlan, then 50 DHCP Services on
//!   one node: RSS and renewals at T1).
//!
//! Every scenario ends with the API statuses other than 2xx seen by the bench's calls and the
//! WARN/ERROR lines of each vipd log (counts and the first distinct ones).
//!
//! The files: one a scenario ([`bringup`], [`scale`], [`coldstart`] with its [`poweroff`]
//! phase, [`churn`], [`drain`], [`dhcp`]), the vipd cluster they run against ([`context`])
//! and the HTTP probing of Service addresses ([`http`]); the lab side is
//! [`super::harness`].

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::harness::api;
use super::harness::build::vipd_release_binary;
use crate::args::{parse_flags, whole_number};

mod bringup;
mod churn;
mod coldstart;
pub(crate) mod context;
mod dhcp;
mod drain;
pub(crate) mod http;
mod poweroff;
mod scale;

#[cfg(test)]
mod tests;

const USAGE: &str = "usage: cargo xtask bench services [options]

options:
  --scenario S    bringup | scale | coldstart (or cold-start) | churn | drain | dhcp | all,
                  or a comma list (default all: every one but coldstart)
  --services N    Services in the scale and coldstart scenarios (default 1000, at most 35000:
                  the lab API server's node ports 30000-65000)
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
/// Largest `--services`: every LoadBalancer Service takes a node port, and the lab's API
/// server hands out 30000-65000 (35 001 ports); the addresses are 2001:db8::1:1 onwards.
pub const MAX_SCALE_SERVICES: usize = 35_000;
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
/// Namespace of the bench's Services and of their Leases.
pub const NAMESPACE: &str = api::NAMESPACE;

/// One benchmark scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// Service created -> first answer, one Service at a time.
    Bringup,
    /// Many Services at once: time until all answered, Lease writes, RSS, CPU.
    Scale,
    /// The scale scenario's Services created before any vipd runs: time from vipd's start
    /// until all answered, then the same steady state, then the node carrying the most
    /// addresses powered off: time until each of its addresses answers again.
    Coldstart,
    /// Services deleted and recreated for minutes: RSS, threads, tasks at start and end.
    Churn,
    /// `vipd drain` on a node: the gap of every Service VIP it held.
    Drain,
    /// DHCP mode: bring-up to the first ARP answer, 50 DHCP Services on one node.
    Dhcp,
}

impl Scenario {
    /// The scenarios `all` (and the default) runs, in order: every one but
    /// [`Scenario::Coldstart`], which may take minutes at the default 1000 Services (its
    /// limit is 60 s + 10 ms per Service after vipd's start, and at vipd's default lease
    /// timings 1000 Service Leases flap in the lab).
    pub const ALL: [Scenario; 5] = [
        Scenario::Bringup,
        Scenario::Scale,
        Scenario::Churn,
        Scenario::Drain,
        Scenario::Dhcp,
    ];

    /// Parses a comma list of `bringup`, `scale`, `coldstart`, `churn`, `drain`, `dhcp` and
    /// `all` ([`Scenario::ALL`]).
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
                "coldstart" | "cold-start" => {
                    out.insert(Scenario::Coldstart);
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
                    "--scenario: unknown scenario {other:?} (expected bringup, scale, coldstart, churn, drain, dhcp or all)"
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
    crate::require_root("bench services")?;
    let vipd = vipd_release_binary(o.build, o.vipd.as_deref())?;
    println!("vipd binary: {}", vipd.display());
    // The lab's client needs a neighbour entry per address it reaches, and the kernel's
    // neighbour tables are one for every network namespace (their limits exist only in the
    // root one): at 1024 IPv6 entries (the default gc_thresh3), thousands of Services fail
    // with "neighbor table overflow" whatever vipd does.
    let _limits = match o
        .scenarios
        .iter()
        .any(|s| matches!(s, Scenario::Scale | Scenario::Coldstart))
    {
        true => Some(NeighbourLimits::raise(4 * o.services + 1024)?),
        false => None,
    };
    for s in &o.scenarios {
        let t0 = Instant::now();
        match s {
            Scenario::Bringup => bringup::run(&vipd, o.verbose)?,
            Scenario::Scale => scale::run(&vipd, o.services, o.verbose)?,
            Scenario::Coldstart => coldstart::run(&vipd, o.services, o.verbose)?,
            Scenario::Churn => churn::run(&vipd, o.minutes, o.verbose)?,
            Scenario::Drain => drain::run(&vipd, o.verbose)?,
            Scenario::Dhcp => dhcp::run(&vipd, o.dhcp_services, o.verbose)?,
        }
        println!("({s:?} took {:.0} s)\n", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The kernel's IPv4 and IPv6 neighbour table limits (`net.ipv{4,6}.neigh.default.gc_thresh1..3`,
/// set in the root network namespace only, counted over all of them), raised for a bench
/// and put back as they were when dropped (also on an error or a panic; not on SIGKILL).
/// Nothing is sent anywhere: only the limits change. Benches that run at once share them
/// through [`SHARED_LIMITS`]: the limits are put back to what they were before the first of
/// them once the last one still running ends (found by a new-user trial: a bench that
/// ended put back the default under another bench still running, and that one, ending,
/// put back the first one's raised values).
pub struct NeighbourLimits {
    me: (u32, u64),
}

/// The file the running benches share their [`NeighbourLimits`] in, under an exclusive
/// lock: the limits before the first of them and the pids still using them.
pub const SHARED_LIMITS: &str = "/run/vipd-bench-neighbour-limits";

/// What [`SHARED_LIMITS`] holds: `orig <path> <value>` and `pid <pid>` lines.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SharedLimits {
    /// Each limit's value before the first bench raised it.
    pub originals: Vec<(String, String)>,
    /// The benches using the raised limits: pid and start time (`/proc/<pid>/stat` field
    /// 22), so that a pid reused by another process is not taken for a bench.
    pub pids: Vec<(u32, u64)>,
}

impl SharedLimits {
    /// Reads the file's text; unknown lines are skipped.
    pub fn parse(text: &str) -> Self {
        let mut out = SharedLimits::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("orig"), Some(path), Some(value)) => {
                    out.originals.push((path.to_string(), value.to_string()));
                }
                (Some("pid"), Some(pid), Some(start)) => {
                    if let (Ok(p), Ok(t)) = (pid.parse(), start.parse()) {
                        out.pids.push((p, t));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (path, value) in &self.originals {
            out.push_str(&format!("orig {path} {value}\n"));
        }
        for (pid, start) in &self.pids {
            out.push_str(&format!("pid {pid} {start}\n"));
        }
        out
    }

    /// Bench `me` (pid, start time) starts, finding `current` (path, value) limits: a limit
    /// with no original recorded gets its current value as original; benches no longer
    /// `alive` are forgotten (one SIGKILLed never left).
    pub fn join(
        &mut self,
        me: (u32, u64),
        current: &[(String, String)],
        alive: impl Fn((u32, u64)) -> bool,
    ) {
        self.pids.retain(|p| alive(*p));
        for (path, value) in current {
            if !self.originals.iter().any(|(p, _)| p == path) {
                self.originals.push((path.clone(), value.clone()));
            }
        }
        if !self.pids.contains(&me) {
            self.pids.push(me);
        }
    }

    /// Bench `me` ends: the originals to put back when no bench still `alive` uses the
    /// limits (and then nothing is left to share), else nothing.
    pub fn leave(
        &mut self,
        me: (u32, u64),
        alive: impl Fn((u32, u64)) -> bool,
    ) -> Vec<(String, String)> {
        self.pids.retain(|p| *p != me && alive(*p));
        match self.pids.is_empty() {
            true => std::mem::take(&mut self.originals),
            false => Vec::new(),
        }
    }
}

/// The start time of process `pid` (`/proc/<pid>/stat` field 22, clock ticks since boot);
/// `None` when it does not run.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from its end.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether bench `(pid, start time)` still runs (the pid not reused by another process).
fn bench_alive((pid, start): (u32, u64)) -> bool {
    start_time(pid) == Some(start)
}

/// Runs `f` on [`SHARED_LIMITS`]'s content under its exclusive lock and writes back what
/// `f` leaves (an empty file when nothing is shared).
fn with_shared_limits<T>(f: impl FnOnce(&mut SharedLimits) -> Result<T>) -> Result<T> {
    use std::io::{Read, Seek, Write};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(SHARED_LIMITS)
        .map_err(|e| anyhow!("open {SHARED_LIMITS}: {e}"))?;
    file.lock()
        .map_err(|e| anyhow!("lock {SHARED_LIMITS}: {e}"))?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| anyhow!("read {SHARED_LIMITS}: {e}"))?;
    let mut shared = SharedLimits::parse(&text);
    let out = f(&mut shared)?;
    // Emptied, never removed: a bench waiting for the lock holds the file open, and a
    // removed file would give it a lock nobody else sees.
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(shared.render().as_bytes()))
        .map_err(|e| anyhow!("write {SHARED_LIMITS}: {e}"))?;
    Ok(out)
}

impl NeighbourLimits {
    /// Raises gc_thresh3 to at least `entries` (gc_thresh2 to half, gc_thresh1 to a quarter
    /// of it), when lower; says so.
    ///
    /// # Errors
    /// When a limit or [`SHARED_LIMITS`] cannot be read or written.
    pub fn raise(entries: usize) -> Result<Self> {
        let pid = std::process::id();
        let me = (pid, start_time(pid).unwrap_or(0));
        with_shared_limits(|shared| {
            let mut current = Vec::new();
            let mut raise = Vec::new();
            for family in ["ipv4", "ipv6"] {
                for (n, want) in [(3, entries), (2, entries / 2), (1, entries / 4)] {
                    let path = format!("/proc/sys/net/{family}/neigh/default/gc_thresh{n}");
                    let now = std::fs::read_to_string(&path)
                        .map_err(|e| anyhow!("read {path}: {e}"))?
                        .trim()
                        .to_string();
                    if !now.parse::<usize>().is_ok_and(|v| v >= want) {
                        raise.push((path.clone(), now.clone(), want));
                    }
                    current.push((path, now));
                }
            }
            shared.join(me, &current, bench_alive);
            for (path, now, want) in raise {
                std::fs::write(&path, want.to_string())
                    .map_err(|e| anyhow!("write {path}: {e}"))?;
                println!(
                    "  {path}: {now} -> {want} for the bench (the client needs an entry per Service address; put back when the last bench running ends)"
                );
            }
            Ok(())
        })?;
        Ok(NeighbourLimits { me })
    }
}

impl Drop for NeighbourLimits {
    fn drop(&mut self) {
        let restored = with_shared_limits(|shared| {
            let back = shared.leave(self.me, bench_alive);
            for (path, value) in &back {
                if let Err(e) = std::fs::write(path, value) {
                    eprintln!("cannot put {path} back to {value}: {e}");
                }
            }
            Ok(())
        });
        if let Err(e) = restored {
            eprintln!("cannot put the neighbour table limits back: {e:#}");
        }
    }
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

/// Names `PREFIX-0`.. and addresses (`address(i)`, e.g. [`v4_address`]) of `n` Services.
///
/// # Errors
/// The first error of `address`.
pub fn services(
    prefix: &str,
    n: usize,
    address: fn(usize) -> Result<IpAddr>,
) -> Result<(Vec<String>, Vec<IpAddr>)> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    let addrs = (0..n).map(address).collect::<Result<Vec<_>>>()?;
    Ok((names, addrs))
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
