//! `cargo xtask chaos`: the chaos soak. See docs/chaos.md.
//!
//! ```text
//! cargo xtask chaos --minutes N [--seed S] [--services 50] [--nodes 3] [--no-build]
//!     [--vipd PATH] [--orphan-leases-warn] [--nft-fence] [--no-ride] [--rss-growth-pct 20] [-v]
//! ```
//!
//! Starts a lab ([`Lab::start`]), runs `vipd manager` on the nodes in control-plane and
//! Services mode as the generated manifests configure it (`cp_enable`, `svc_enable`,
//! `svc_election`, control-plane leases [`CP_TIMINGS`], Service leases [`SVC_TIMINGS`],
//! ride-through and the nftables fence at vipd's defaults, the Node objects and the peer key
//! Secret created; `--no-ride`: Services at vipd's bare 3/2/1, no Secret) and creates `--services` LoadBalancer Services (addresses from [`POOL_FIRST`]..=
//! [`POOL_LAST`]). Then, for N minutes, it injects random faults in episodes (a seeded
//! [`fastrand::Rng`]; the seed is printed): SIGKILL / SIGTERM of a holder (then a restart),
//! SIGSTOP / SIGCONT of a holder, link cut, partition from the API server (nftables drop in
//! the node's namespace, no RST), API server freeze (SIGSTOP) and restart, etcd restart,
//! Service create / address edit / delete and annotation changes. Each episode heals what it
//! broke, then usually leaves the lab quiet for longer than the answer bound.
//!
//! An [`ArpRoundProber`](xtask::lab::ArpRoundProber) in the `client` namespace asks for every pool address and the
//! control-plane VIP every [`ROUND_PERIOD`] for the whole run; [`audit`](audit::audit) turns its rounds and
//! the fault timeline into invariant violations. At the end: the status of every Service
//! against the node that answers ([`check_status`](audit::check_status)), orphaned leases ([`orphan_leases`](audit::orphan_leases)),
//! RSS start/end ([`rss_violation`](audit::rss_violation)), and after a graceful stop of every vipd: leaked
//! addresses, nftables `vipd` tables and extra links on the nodes ([`leftovers`](audit::leftovers)).
//!
//! The files: [`options`] (the command line), [`audit`] (the pure auditor: the fault
//! timeline, the invariants and the end checks, judged from recorded data only),
//! [`driver`] (the lab side: vipd on the nodes, Services, faults injected and healed) and
//! [`soak`] (the run's phases and its report).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use xtask::lab::{self, Lab, LabOptions, Signal};

use audit::{Timeline, secs};
use driver::Chaos;
use options::{Options, rerun_command};
use soak::{print_report, workspace_commit};

pub mod audit;
mod driver;
pub mod options;
mod soak;

#[cfg(test)]
mod tests;

/// First address of the Service address pool (192.0.2.150).
pub const POOL_FIRST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 150);
/// Last address of the Service address pool (192.0.2.249): 100 addresses, so edits always
/// find a free one; never the subnet's broadcast (.255).
pub const POOL_LAST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 249);
/// Default number of Services.
pub const DEFAULT_SERVICES: usize = 50;
/// Largest `--services` (pool size minus room for address edits).
pub const MAX_SERVICES: usize = 60;
/// Lease timings of one kind of lease (seconds), as vipd's `*_leaseduration`,
/// `*_renewdeadline` and `*_retryperiod` take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// Lease duration.
    pub lease: u64,
    /// Renew deadline.
    pub renew: u64,
    /// Retry period.
    pub retry: u64,
}

impl Timings {
    /// The bound within which an address under a lease of these timings must be answered
    /// again (and an address without a Service must fall silent) once the last disturbance
    /// that could affect it has settled: lease duration (a candidate takes a lease it saw
    /// unchanged for that long) + retry period (it looks once per retry period) +
    /// [`PROBE_SLACK`]. Ride-through adds nothing here: a ride only keeps a holder
    /// answering, and a take from a silent holder needs a blocking set whose runs began
    /// F + margin + W + delta = 2.9 s before (docs/design.md, P5), which fits in lease +
    /// retry once the API answers again (docs/chaos.md, "Answer bounds").
    pub fn answer_bound(self) -> Duration {
        Duration::from_secs(self.lease + self.retry) + PROBE_SLACK
    }

    /// `lease/renew/retry s`, for the report.
    pub fn label(self) -> String {
        format!("{}/{}/{} s", self.lease, self.renew, self.retry)
    }
}

/// Control-plane lease timings: what `vipd manifest` writes (vipd's defaults).
pub const CP_TIMINGS: Timings = Timings {
    lease: 3,
    renew: 2,
    retry: 1,
};
/// Service lease timings `vipd manifest` writes with ride-through on (its default since
/// issue 27): kube-vip's 5/3/1, where a ride can start within the API fence.
pub const SVC_TIMINGS: Timings = Timings {
    lease: 5,
    renew: 3,
    retry: 1,
};
/// Service lease timings with `--no-ride`: vipd's bare defaults (3/2/1), under which
/// ride-through is off by default.
pub const NO_RIDE_SVC_TIMINGS: Timings = CP_TIMINGS;

/// The Service lease timings of a run (`ride`: the generated manifests' configuration).
pub fn svc_timings(ride: bool) -> Timings {
    if ride {
        SVC_TIMINGS
    } else {
        NO_RIDE_SVC_TIMINGS
    }
}

/// Time between two probe rounds.
pub const ROUND_PERIOD: Duration = Duration::from_millis(250);
/// How long a round collects replies after sending its requests (replies on the lab's
/// veths arrive within a millisecond; the rest is slack for a loaded machine).
pub const ROUND_WINDOW: Duration = Duration::from_millis(100);
/// Slack added to lease + 1 s in [`answer_bound`]: one probe period plus its window.
pub const PROBE_SLACK: Duration = Duration::from_millis(500);
/// How long the final status check waits for status and `vipHost` to converge (status
/// writes are retried with back-off).
pub const STATUS_WAIT: Duration = Duration::from_secs(30);
/// How long the orphaned-lease check waits for vipd to delete them, for Service leases of
/// duration `lease_s`. vipd's collector (`services::lease_gc`, one per cluster: the holder of
/// the Lease `vipd-lease-gc`, 15 s) deletes a lease no Service names once it has been
/// unchanged for its duration plus `GC_GRACE` (30 s) on the collector's own clock, judged at
/// lists `GC_INTERVAL` (10 s) apart: up to lease + 30 + 2 x 10 s after the lease's last
/// write, when the Service was deleted while its holder was down, + the GC lease's 15 s when
/// the collector itself was killed (its successor starts its own clock); plus 7 s for the
/// list and the delete (75 s at 3 s leases, 77 s at 5 s).
pub fn lease_gc_wait(lease_s: u64) -> Duration {
    Duration::from_secs(lease_s + 30 + 2 * 10 + 15 + 7)
}
/// Namespace of the Services.
pub const NAMESPACE: &str = "default";
/// Prefix of the per-Service lease names (`kubevip-<service>`).
pub const LEASE_PREFIX: &str = "kubevip-";
/// Annotation the soak sets to an increasing counter ("annotation change" that must not
/// move anything).
pub const TOUCH_ANNOTATION: &str = "chaos.vipd.dev/touch";
/// Address of the `--canary` check: outside the pool, never a Service's.
pub const CANARY_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 250);
/// How long the canary address stays on two nodes.
pub const CANARY_HOLD: Duration = Duration::from_secs(2);
/// nftables table the soak uses for partitions (never `vipd`).
pub const PARTITION_TABLE: &str = "vipd_chaos_partition";

/// Address `i` of the pool ([`POOL_FIRST`] + i), `None` past [`POOL_LAST`].
pub fn pool_address(i: usize) -> Option<Ipv4Addr> {
    let a = u32::from(POOL_FIRST).checked_add(u32::try_from(i).ok()?)?;
    (a <= u32::from(POOL_LAST)).then(|| Ipv4Addr::from(a))
}

/// Entry point of `cargo xtask chaos ARGS`. Prints the fault and violation tables.
///
/// # Errors
/// Bad arguments, not root, a failed build, a lab that does not start, or any invariant
/// violation (the error counts them).
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    crate::require_root("chaos")?;
    let vipd = match (&o.vipd, o.build) {
        (Some(p), _) => crate::bench::harness::build::vipd_release_binary(false, Some(p))?,
        (None, true) => crate::bench::harness::build::vipd_release_binary(true, None)?,
        (None, false) => lab::vipd_binary(None)?,
    };
    let seed = o.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000_000)
            .unwrap_or(1)
    });
    println!(
        "chaos soak: {} min, seed {seed} (rerun: {}), {} Services, {} nodes, vipd {}",
        o.minutes,
        rerun_command(&o, seed),
        o.services,
        o.nodes,
        vipd.display()
    );
    let svc = svc_timings(o.ride);
    println!(
        "  leases: control plane {}, Services {} ({}, ride-through {}), answer bounds {} / {} (lease + retry + {} ms probe slack), nftables fence {}",
        CP_TIMINGS.label(),
        svc.label(),
        if o.lease_shards > 0 {
            format!("{} shard leases", o.lease_shards)
        } else {
            "one lease per Service".to_string()
        },
        if o.ride {
            "default (on), key Secret created"
        } else {
            "off"
        },
        secs(CP_TIMINGS.answer_bound()),
        secs(svc.answer_bound()),
        PROBE_SLACK.as_millis(),
        if o.nft_fence {
            "on (--nft-fence)"
        } else {
            "vipd's default"
        }
    );
    // The commit the binaries were built from, taken before the run (it may be long).
    let commit = workspace_commit();
    let started_at = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("  commit {commit}, started {started_at}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let lab = Lab::start(LabOptions::default())?;
    let mut macs = BTreeMap::new();
    for n in &lab::NODES[..o.nodes] {
        macs.insert(lab.mac_of(n)?, n.to_string());
    }
    let mut c = Chaos {
        lab,
        vipd,
        nodes: lab::NODES[..o.nodes]
            .iter()
            .map(|n| n.to_string())
            .collect(),
        procs: BTreeMap::new(),
        logs: Vec::new(),
        services: BTreeMap::new(),
        next_svc: 0,
        tl: Timeline::default(),
        epoch: Instant::now(),
        faults: BTreeMap::new(),
        violations: Vec::new(),
        notes: Vec::new(),
        macs,
        prober: None,
        verbose: o.verbose,
        nft_fence: o.nft_fence,
        lease_shards: o.lease_shards,
        ride: o.ride,
    };
    let result = soak::soak(&mut c, &o, &mut rng);
    // Whatever happened: no vipd may outlive the lab (the lab's teardown kills the rest).
    for p in c.procs.values_mut() {
        let _ = p.signal(Signal::SIGCONT);
        let _ = p.kill();
    }
    let report = result?;
    print_report(&c, &report, seed, &o, &commit);
    let n = c.violations.len();
    if n > 0 {
        bail!("chaos soak: {n} invariant violation(s) (seed {seed})");
    }
    println!("chaos soak passed: no invariant violations (seed {seed})");
    Ok(())
}
