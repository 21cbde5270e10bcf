//! `cargo xtask chaos`: the chaos soak. See docs/chaos.md.
//!
//! ```text
//! cargo xtask chaos --minutes N [--seed S] [--services 50] [--nodes 3] [--no-build]
//!     [--vipd PATH] [--orphan-leases-warn] [--rss-growth-pct 20] [-v]
//! ```
//!
//! Starts a lab ([`Lab::start`]), runs `vipd manager` on the nodes in control-plane and
//! Services mode (`cp_enable`, `svc_enable`, `svc_election`, lease timings 3/2/1 s for both)
//! and creates `--services` LoadBalancer Services (addresses from [`POOL_FIRST`]..=
//! [`POOL_LAST`]). Then, for N minutes, it injects random faults in episodes (a seeded
//! [`fastrand::Rng`]; the seed is printed): SIGKILL / SIGTERM of a holder (then a restart),
//! SIGSTOP / SIGCONT of a holder, link cut, partition from the API server (nftables drop in
//! the node's namespace, no RST), API server freeze (SIGSTOP) and restart, etcd restart,
//! Service create / address edit / delete and annotation changes. Each episode heals what it
//! broke, then usually leaves the lab quiet for longer than the answer bound.
//!
//! An [`ArpRoundProber`] in the `client` namespace asks for every pool address and the
//! control-plane VIP every [`ROUND_PERIOD`] for the whole run; [`audit`] turns its rounds and
//! the fault timeline into invariant violations. At the end: the status of every Service
//! against the node that answers ([`check_status`]), orphaned leases ([`orphan_leases`]),
//! RSS start/end ([`rss_violation`]), and after a graceful stop of every vipd: leaked
//! addresses, nftables `vipd` tables and extra links on the nodes ([`leftovers`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::args::{parse_flags, whole_number};
use xtask::lab::{
    self, ArpRoundProber, ControlPlaneProcess, Lab, LabAddress, LabOptions, LabProcess, MacAddr,
    ProbeRound, Signal,
};

const USAGE: &str = "usage: cargo xtask chaos --minutes N [options]

options:
  --minutes N            length of the fault phase in minutes, may be fractional (required)
  --seed S               seed of the fault schedule (default: from the clock; printed)
  --services N           LoadBalancer Services kept alive (default 50, at most 60)
  --nodes N              nodes running vipd (default 3, the lab has 3)
  --no-build             do not run `cargo build --release -p vipd`; use the newest of
                         target/{debug,release}/vipd (or $VIPD_BIN)
  --vipd PATH            vipd binary to use
  --orphan-leases-warn   report leases of deleted Services as a warning, not a violation
  --faults LIST          only these fault kinds (comma list of kill, stop, term, link-cut,
                         partition, api-freeze, api-restart, etcd-restart, services); to
                         chase a finding. Default: all
  --nft-fence            run vipd with vip_nftfence=true (the nftables fence in front of
                         every VIP's address lifetime, docs/operators.md)
  --canary               check the auditor end to end: put 192.0.2.250 on two nodes for 2 s
                         after the warm-up; the run fails unless the auditor reports it
  --rss-growth-pct P     RSS growth (end over start, same process) counted as a violation
                         (default 20)
  -v, --verbose          print every fault as it is injected";

/// First address of the Service address pool (192.0.2.150).
pub const POOL_FIRST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 150);
/// Last address of the Service address pool (192.0.2.249): 100 addresses, so edits always
/// find a free one; never the subnet's broadcast (.255).
pub const POOL_LAST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 249);
/// Default number of Services.
pub const DEFAULT_SERVICES: usize = 50;
/// Largest `--services` (pool size minus room for address edits).
pub const MAX_SERVICES: usize = 60;
/// Lease duration of the control-plane and Service leases, seconds (vipd's default).
pub const LEASE_S: u64 = 3;
/// Renew deadline, seconds (vipd's default).
pub const RENEW_S: u64 = 2;
/// Retry period, seconds (vipd's default).
pub const RETRY_S: u64 = 1;
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
/// How long the orphaned-lease check waits for vipd to delete them. vipd's collector
/// (`services::lease_gc`) deletes a lease no Service names once it has been unchanged for
/// its duration (3 s here) plus `GC_GRACE` (30 s), judged at lists `GC_INTERVAL` (10 s)
/// apart: up to 3 + 30 + 2 x 10 s after the lease's last write, when the Service was
/// deleted while its holder was down; plus 7 s for the list and the delete.
pub const LEASE_GC_WAIT: Duration = Duration::from_secs(60);
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

/// The bound within which every announceable Service must be answered (and every address
/// without a Service must fall silent) once the last disturbance that could affect it has
/// settled: lease duration + 1 s + [`PROBE_SLACK`].
pub fn answer_bound() -> Duration {
    Duration::from_secs(LEASE_S + 1) + PROBE_SLACK
}

// ----- options ---------------------------------------------------------------------------

/// Command-line options of `cargo xtask chaos`.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Length of the fault phase, minutes.
    pub minutes: f64,
    /// Seed of the schedule; `None`: from the clock.
    pub seed: Option<u64>,
    /// Services kept alive.
    pub services: usize,
    /// Nodes running vipd (2 or 3).
    pub nodes: usize,
    /// Build the release vipd first.
    pub build: bool,
    /// Explicit vipd binary.
    pub vipd: Option<PathBuf>,
    /// Orphaned leases are a warning, not a violation.
    pub orphan_leases_warn: bool,
    /// Put [`CANARY_ADDR`] on two nodes for [`CANARY_HOLD`] after the warm-up and require
    /// the auditor to report it.
    pub canary: bool,
    /// Run vipd with `vip_nftfence=true`.
    pub nft_fence: bool,
    /// Only these fault kinds (`None`: all); [`FaultKind::SvcCreate`] stands for the
    /// Service-only episodes.
    pub faults: Option<BTreeSet<FaultKind>>,
    /// RSS growth threshold, percent.
    pub rss_growth_pct: f64,
    /// Print every fault.
    pub verbose: bool,
}

impl Options {
    /// Parses the arguments after `chaos`.
    ///
    /// # Errors
    /// An unknown flag, a missing value, `--minutes` missing, or a value out of range (the
    /// message names flag and value); `--help` returns the usage as the error.
    pub fn parse(args: &[&str]) -> Result<Options> {
        let mut o = Options {
            minutes: f64::NAN,
            seed: None,
            services: DEFAULT_SERVICES,
            nodes: lab::NODES.len(),
            build: true,
            vipd: None,
            orphan_leases_warn: false,
            canary: false,
            nft_fence: false,
            faults: None,
            rss_growth_pct: 20.0,
            verbose: false,
        };
        parse_flags(args, USAGE, |a, value| {
            let number = |flag: &str, v: &str| -> Result<f64> {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| anyhow!("{flag}: {v:?} is not a number"))
            };
            match a {
                "--minutes" => {
                    let v = value()?;
                    let m = number("--minutes", v)?;
                    if !(m > 0.0 && m <= 24.0 * 60.0) {
                        bail!("--minutes: {v:?} is outside (0, 1440]");
                    }
                    o.minutes = m;
                }
                "--seed" => {
                    let v = value()?;
                    o.seed = Some(
                        v.parse()
                            .map_err(|_| anyhow!("--seed: {v:?} is not a whole number"))?,
                    );
                }
                "--services" => o.services = whole_number(a, value()?, 1..=MAX_SERVICES)?,
                "--nodes" => o.nodes = whole_number(a, value()?, 2..=lab::NODES.len())?,
                "--rss-growth-pct" => {
                    let v = value()?;
                    let p = number("--rss-growth-pct", v)?;
                    if p < 0.0 {
                        bail!("--rss-growth-pct: {v:?} is negative");
                    }
                    o.rss_growth_pct = p;
                }
                "--no-build" => o.build = false,
                "--vipd" => o.vipd = Some(PathBuf::from(value()?)),
                "--orphan-leases-warn" => o.orphan_leases_warn = true,
                "--canary" => o.canary = true,
                "--nft-fence" => o.nft_fence = true,
                "--faults" => o.faults = Some(parse_faults(value()?)?),
                "-v" | "--verbose" => o.verbose = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        if o.minutes.is_nan() {
            bail!("--minutes is required\n\n{USAGE}");
        }
        Ok(o)
    }
}

/// The names `--faults` takes, and the kind each stands for (`services`: the Service
/// operations, during holds and as episodes of their own).
pub const FAULT_FLAGS: [(&str, FaultKind); 9] = [
    ("kill", FaultKind::Kill),
    ("stop", FaultKind::Stop),
    ("term", FaultKind::Term),
    ("link-cut", FaultKind::LinkCut),
    ("partition", FaultKind::Partition),
    ("api-freeze", FaultKind::ApiFreeze),
    ("api-restart", FaultKind::ApiRestart),
    ("etcd-restart", FaultKind::EtcdRestart),
    ("services", FaultKind::SvcCreate),
];

/// Parses the `--faults` list.
///
/// # Errors
/// An unknown name (naming it) or an empty list.
pub fn parse_faults(list: &str) -> Result<BTreeSet<FaultKind>> {
    let mut out = BTreeSet::new();
    for w in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let Some((_, kind)) = FAULT_FLAGS.iter().find(|(name, _)| *name == w) else {
            let names: Vec<&str> = FAULT_FLAGS.iter().map(|(n, _)| *n).collect();
            bail!(
                "--faults: unknown fault {w:?} (expected {})",
                names.join(", ")
            );
        };
        out.insert(*kind);
    }
    if out.is_empty() {
        bail!("--faults: empty list {list:?}");
    }
    Ok(out)
}

/// The command that replays a run of `o` with `seed`: every option that changes the
/// schedule or what runs (the fault list, the Service count, the nodes, the fence).
pub fn rerun_command(o: &Options, seed: u64) -> String {
    let mut c = format!("cargo xtask chaos --minutes {} --seed {seed}", o.minutes);
    if let Some(only) = &o.faults {
        let names: Vec<&str> = FAULT_FLAGS
            .iter()
            .filter(|(_, k)| only.contains(k))
            .map(|(n, _)| *n)
            .collect();
        c.push_str(&format!(" --faults {}", names.join(",")));
    }
    if o.services != DEFAULT_SERVICES {
        c.push_str(&format!(" --services {}", o.services));
    }
    if o.nodes != 3 {
        c.push_str(&format!(" --nodes {}", o.nodes));
    }
    if o.nft_fence {
        c.push_str(" --nft-fence");
    }
    c
}

// ----- the model the auditor judges ------------------------------------------------------

/// A kind of fault (or Service change) the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL of a holder's vipd, restarted after the hold.
    Kill,
    /// SIGSTOP of a holder's vipd, SIGCONT after the hold.
    Stop,
    /// SIGTERM of a holder's vipd (graceful), restarted after the hold.
    Term,
    /// The node's switch port down (carrier lost), up after the hold.
    LinkCut,
    /// nftables drop of everything to/from the API server in the node's namespace.
    Partition,
    /// SIGSTOP of kube-apiserver, SIGCONT after the hold.
    ApiFreeze,
    /// kube-apiserver stopped (SIGTERM) and started again.
    ApiRestart,
    /// etcd stopped (SIGTERM) and started again.
    EtcdRestart,
    /// A Service created.
    SvcCreate,
    /// A Service's address changed.
    SvcEdit,
    /// A Service deleted.
    SvcDelete,
    /// An annotation change: `kube-vip.io/ignore` toggled, or an unrelated annotation set.
    Annotation,
    /// vipd found dead without the soak killing it, restarted.
    CrashRestart,
}

impl FaultKind {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "sigkill+restart",
            FaultKind::Stop => "sigstop/sigcont",
            FaultKind::Term => "sigterm+restart",
            FaultKind::LinkCut => "link cut",
            FaultKind::Partition => "partition from API",
            FaultKind::ApiFreeze => "API server freeze",
            FaultKind::ApiRestart => "API server restart",
            FaultKind::EtcdRestart => "etcd restart",
            FaultKind::SvcCreate => "service create",
            FaultKind::SvcEdit => "service address edit",
            FaultKind::SvcDelete => "service delete",
            FaultKind::Annotation => "annotation change",
            FaultKind::CrashRestart => "unexpected exit, restarted",
        }
    }

    /// Faults of the control plane.
    pub fn is_control_plane_fault(self) -> bool {
        matches!(
            self,
            FaultKind::ApiFreeze | FaultKind::ApiRestart | FaultKind::EtcdRestart
        )
    }
}

/// One disturbance on the timeline: from `start` until `settled` (`None`: never healed)
/// the addresses it concerns are not judged, nor for [`answer_bound`] after `settled`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disturbance {
    /// What happened.
    pub kind: FaultKind,
    /// Its target (node, Service), for reports.
    pub target: String,
    /// When it started (since the run's epoch).
    pub start: Duration,
    /// When it was healed (process running again, link up, API ready, API call returned).
    pub settled: Option<Duration>,
    /// The addresses it may affect; `None`: every address (node and control-plane faults).
    pub addrs: Option<Vec<Ipv4Addr>>,
}

/// An interval during which `addr` should be announced (a Service that vipd must announce
/// has it), `[from, to)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The address.
    pub addr: Ipv4Addr,
    /// Who wants it (Service name, or `control-plane`).
    pub owner: String,
    /// Since when (since the epoch).
    pub from: Duration,
    /// Until when; `None`: still.
    pub to: Option<Duration>,
}

/// Everything the driver did, in the auditor's terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Faults and Service changes.
    pub disturbances: Vec<Disturbance>,
    /// Who should be answered when.
    pub desired: Vec<Desired>,
}

/// A kind of invariant violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// Two or more MACs answered one ARP request for an address.
    TwoMacs,
    /// An announceable address went unanswered although nothing disturbed it for the bound.
    Unanswered,
    /// An address without a Service (deleted, moved, ignored) was answered past the bound.
    StaleAnswer,
    /// After the final settle, status ingress or `kube-vip.io/vipHost` differ from reality.
    Status,
    /// A lease of a deleted Service is left.
    OrphanLease,
    /// RSS of a vipd grew beyond the threshold.
    RssGrowth,
    /// A vipd exited without being told to, or exited non-zero on SIGTERM, or panicked.
    VipdExit,
    /// A vipd did not exit within 15 s of SIGTERM.
    SlowShutdown,
    /// A VIP address is left on a node interface after vipd stopped.
    LeakedAddress,
    /// An nftables table `vipd` is left after vipd stopped.
    LeakedNftTable,
    /// A link other than lo and eth0 (e.g. a macvlan) is left after vipd stopped.
    LeakedLink,
}

impl ViolationKind {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::TwoMacs => "two MACs for one address",
            ViolationKind::Unanswered => "announceable, not answered",
            ViolationKind::StaleAnswer => "answered without a Service",
            ViolationKind::Status => "status/vipHost != reality",
            ViolationKind::OrphanLease => "lease of deleted Service",
            ViolationKind::RssGrowth => "RSS growth",
            ViolationKind::VipdExit => "vipd exit/panic",
            ViolationKind::SlowShutdown => "slow shutdown",
            ViolationKind::LeakedAddress => "leaked address",
            ViolationKind::LeakedNftTable => "leaked nftables table",
            ViolationKind::LeakedLink => "leaked link",
        }
    }
}

/// One invariant violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant.
    pub kind: ViolationKind,
    /// What was seen (times in seconds since the epoch).
    pub detail: String,
}

fn v(kind: ViolationKind, detail: String) -> Violation {
    Violation { kind, detail }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Judging parameters of [`audit`].
#[derive(Debug, Clone)]
pub struct AuditParams {
    /// Answer bound after a disturbance settles ([`answer_bound`]).
    pub bound: Duration,
    /// Rounds before this are checked for two MACs only (warm-up).
    pub audit_from: Duration,
    /// Every address probed (pool and control-plane VIP).
    pub universe: Vec<Ipv4Addr>,
}

/// Merged `[start, end)` intervals during which `addr` is not judged.
fn blind_intervals(addr: Ipv4Addr, tl: &Timeline, bound: Duration) -> Vec<(Duration, Duration)> {
    let mut iv: Vec<(Duration, Duration)> = tl
        .disturbances
        .iter()
        .filter(|d| d.addrs.as_ref().is_none_or(|a| a.contains(&addr)))
        .map(|d| (d.start, d.settled.map_or(Duration::MAX, |s| s + bound)))
        .collect();
    // A desired interval's edges are changes of this address too.
    for d in tl.desired.iter().filter(|d| d.addr == addr) {
        iv.push((d.from, d.from + bound));
        if let Some(to) = d.to {
            iv.push((to, to + bound));
        }
    }
    iv.sort();
    let mut out: Vec<(Duration, Duration)> = Vec::new();
    for (s, e) in iv {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

fn covered(iv: &[(Duration, Duration)], t: Duration) -> bool {
    let i = iv.partition_point(|(s, _)| *s <= t);
    i > 0 && t < iv[i - 1].1
}

/// The last disturbance of `addr` that started at or before `t`, for reports.
fn last_disturbance(addr: Ipv4Addr, tl: &Timeline, t: Duration) -> String {
    tl.disturbances
        .iter()
        .filter(|d| d.addrs.as_ref().is_none_or(|a| a.contains(&addr)) && d.start <= t)
        .max_by_key(|d| d.start)
        .map(|d| {
            format!(
                "last disturbance: {} {} at {}, settled {}",
                d.kind.name(),
                d.target,
                secs(d.start),
                d.settled.map_or("never".into(), secs)
            )
        })
        .unwrap_or_else(|| "no disturbance before".into())
}

/// The auditor's verdict on the probe rounds of a run (pure).
///
/// - [`ViolationKind::TwoMacs`]: a round in which two or more MACs answered one address,
///   at any time.
/// - From `audit_from` on, for every address at every round outside its blind intervals
///   (a disturbance that may affect it, from its start until `bound` after it settled; a
///   Service change of it, for `bound`): [`ViolationKind::Unanswered`] when it should be
///   answered (a [`Desired`] interval covers the round) and nobody did;
///   [`ViolationKind::StaleAnswer`] when it should not and somebody did.
///
/// Consecutive failing rounds of one address and kind are one violation (its detail gives
/// the first and last round and the count). `node_of` names a MAC's node.
pub fn audit(
    rounds: &[ProbeRound],
    tl: &Timeline,
    p: &AuditParams,
    node_of: &dyn Fn(MacAddr) -> String,
) -> Vec<Violation> {
    let mut out = Vec::new();
    // TwoMacs runs per address: (first t, last t, rounds, macs).
    type Run = (Duration, Duration, usize, BTreeSet<String>);
    let mut open: BTreeMap<(ViolationKind, Ipv4Addr), Run> = BTreeMap::new();
    let blind: BTreeMap<Ipv4Addr, Vec<(Duration, Duration)>> = p
        .universe
        .iter()
        .map(|a| (*a, blind_intervals(*a, tl, p.bound)))
        .collect();
    let close = |key: (ViolationKind, Ipv4Addr), run: Run, out: &mut Vec<Violation>| {
        let (kind, addr) = key;
        let owner = tl
            .desired
            .iter()
            .filter(|d| d.addr == addr && d.from <= run.0)
            .max_by_key(|d| d.from)
            .map(|d| d.owner.clone())
            .unwrap_or_else(|| "-".into());
        let what = match kind {
            ViolationKind::TwoMacs => format!(
                "answered by {} at once",
                run.3.iter().cloned().collect::<Vec<_>>().join(" and ")
            ),
            ViolationKind::Unanswered => "not answered".to_string(),
            _ => format!(
                "answered by {} without a Service",
                run.3.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        };
        out.push(v(
            kind,
            format!(
                "{addr} ({owner}) {what} from {} to {} ({} rounds); {}",
                secs(run.0),
                secs(run.1),
                run.2,
                last_disturbance(addr, tl, run.0)
            ),
        ));
    };
    for r in rounds {
        let mut failing: BTreeMap<(ViolationKind, Ipv4Addr), BTreeSet<String>> = BTreeMap::new();
        for (addr, macs) in &r.replies {
            if macs.len() >= 2 {
                failing.insert(
                    (ViolationKind::TwoMacs, *addr),
                    macs.iter().map(|m| node_of(*m)).collect(),
                );
            }
        }
        if r.t >= p.audit_from {
            for addr in &p.universe {
                if blind.get(addr).is_some_and(|iv| covered(iv, r.t)) {
                    continue;
                }
                let expected = tl
                    .desired
                    .iter()
                    .any(|d| d.addr == *addr && d.from <= r.t && d.to.is_none_or(|to| r.t < to));
                let answered: BTreeSet<String> = r
                    .replies
                    .get(addr)
                    .map(|m| m.iter().map(|m| node_of(*m)).collect())
                    .unwrap_or_default();
                if expected && answered.is_empty() {
                    failing.insert((ViolationKind::Unanswered, *addr), BTreeSet::new());
                } else if !expected && !answered.is_empty() {
                    failing.insert((ViolationKind::StaleAnswer, *addr), answered);
                }
            }
        }
        let keys: Vec<_> = open.keys().copied().collect();
        for k in keys {
            if !failing.contains_key(&k)
                && let Some(run) = open.remove(&k)
            {
                close(k, run, &mut out);
            }
        }
        for (k, nodes) in failing {
            let run = open.entry(k).or_insert((r.t, r.t, 0, BTreeSet::new()));
            run.1 = r.t;
            run.2 += 1;
            run.3.extend(nodes);
        }
    }
    for (k, run) in std::mem::take(&mut open) {
        close(k, run, &mut out);
    }
    out
}

/// A Service as read back from the API server after the final settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedService {
    /// Its name.
    pub name: String,
    /// Its address (the `kube-vip.io/loadbalancerIPs` annotation).
    pub addr: Option<Ipv4Addr>,
    /// `status.loadBalancer.ingress[*].ip`.
    pub ingress: Vec<String>,
    /// The `kube-vip.io/vipHost` annotation.
    pub vip_host: Option<String>,
}

/// Status check after the final settle (pure): for each Service, exactly one node answers
/// its address (`answering`, the last probe round), its ingress is exactly that address and
/// `kube-vip.io/vipHost` names the answering node.
pub fn check_status(
    services: &[ObservedService],
    answering: &BTreeMap<Ipv4Addr, BTreeSet<MacAddr>>,
    node_of: &dyn Fn(MacAddr) -> String,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for s in services {
        let Some(addr) = s.addr else {
            out.push(v(
                ViolationKind::Status,
                format!("{}: no address annotation", s.name),
            ));
            continue;
        };
        let nodes: Vec<String> = answering
            .get(&addr)
            .map(|m| m.iter().map(|m| node_of(*m)).collect())
            .unwrap_or_default();
        let node = match nodes.as_slice() {
            [n] => n.clone(),
            [] => {
                out.push(v(
                    ViolationKind::Unanswered,
                    format!("{} ({addr}) not answered after the final settle", s.name),
                ));
                continue;
            }
            many => {
                out.push(v(
                    ViolationKind::TwoMacs,
                    format!(
                        "{} ({addr}) answered by {} after the final settle",
                        s.name,
                        many.join(" and ")
                    ),
                ));
                continue;
            }
        };
        if s.ingress != [addr.to_string()] {
            out.push(v(
                ViolationKind::Status,
                format!(
                    "{} ({addr}, answered by {node}): status ingress {:?}",
                    s.name, s.ingress
                ),
            ));
        }
        if s.vip_host.as_deref() != Some(node.as_str()) {
            out.push(v(
                ViolationKind::Status,
                format!(
                    "{} ({addr}) answered by {node} but kube-vip.io/vipHost is {:?}",
                    s.name, s.vip_host
                ),
            ));
        }
    }
    out
}

/// Lease names (`kubevip-<service>`) whose Service is not in `services` (pure). Leases with
/// other names are not vipd's default Service leases and are left alone.
pub fn orphan_leases(leases: &[String], services: &BTreeSet<String>) -> Vec<String> {
    leases
        .iter()
        .filter(|l| {
            l.strip_prefix(LEASE_PREFIX)
                .is_some_and(|svc| !services.contains(svc))
        })
        .cloned()
        .collect()
}

/// RSS verdict (pure): a violation when the same process (`pid`) grew by more than
/// `pct` percent from `start` to `end` (KiB). Restarted processes are not compared.
pub fn rss_violation(
    node: &str,
    start: (i32, u64),
    end: (i32, u64),
    pct: f64,
) -> Option<Violation> {
    let ((p0, r0), (p1, r1)) = (start, end);
    if p0 != p1 || r0 == 0 {
        return None;
    }
    let growth = (r1 as f64 / r0 as f64 - 1.0) * 100.0;
    (growth > pct).then(|| {
        v(
            ViolationKind::RssGrowth,
            format!("{node} (pid {p0}): RSS {r0} KiB -> {r1} KiB ({growth:+.1} %, limit {pct} %)"),
        )
    })
}

/// What is left on a node after vipd stopped (pure): addresses on `eth0` other than the
/// node's own and link-local ones, `nft list tables` lines naming one of vipd's tables
/// (`vipd`, `vipd_fence`, `vipd_lb`; not the soak's own [`PARTITION_TABLE`]), and links
/// other than `lo` and `eth0` (`links`: names from `ip -j link`).
pub fn leftovers(
    node: &str,
    addrs: &[LabAddress],
    own: &[IpAddr],
    nft_tables: &str,
    links: &[String],
) -> Vec<Violation> {
    let mut out = Vec::new();
    for a in addrs {
        let link_local = matches!(a.addr, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
        if !own.contains(&a.addr) && !link_local {
            out.push(v(
                ViolationKind::LeakedAddress,
                format!("{node}: {}/{} left on eth0", a.addr, a.prefix),
            ));
        }
    }
    for l in nft_tables.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let vipds = |name: &str| ["vipd", "vipd_fence", "vipd_lb"].contains(&name);
        if w.first() == Some(&"table") && w.last().is_some_and(|n| vipds(n)) {
            out.push(v(
                ViolationKind::LeakedNftTable,
                format!("{node}: {} left", l.trim()),
            ));
        }
    }
    for l in links.iter().filter(|l| *l != "lo" && *l != lab::ETH) {
        out.push(v(
            ViolationKind::LeakedLink,
            format!("{node}: link {l} left"),
        ));
    }
    out
}

/// Splits the violations about [`CANARY_ADDR`] from the others (pure).
pub fn split_canary(found: Vec<Violation>) -> (Vec<Violation>, Vec<Violation>) {
    let prefix = format!("{CANARY_ADDR} ");
    found
        .into_iter()
        .partition(|x| x.detail.starts_with(&prefix))
}

/// Verdict of the `--canary` check (pure): the auditor must have reported the canary
/// address as answered by two MACs and as answered without a Service. `Ok` describes what
/// it saw; `Err` is the violation "the auditor missed it".
pub fn canary_verdict(canary: &[Violation]) -> std::result::Result<String, Violation> {
    let two = canary.iter().any(|x| x.kind == ViolationKind::TwoMacs);
    let stale = canary.iter().any(|x| x.kind == ViolationKind::StaleAnswer);
    if two && stale {
        Ok(format!(
            "detected as expected ({})",
            canary
                .iter()
                .map(|x| x.detail.split(';').next().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
                .join("; ")
        ))
    } else {
        Err(v(
            ViolationKind::TwoMacs,
            format!(
                "canary {CANARY_ADDR} on two nodes was not reported (two MACs: {two}, answered without a Service: {stale})"
            ),
        ))
    }
}

/// Address `i` of the pool ([`POOL_FIRST`] + i), `None` past [`POOL_LAST`].
pub fn pool_address(i: usize) -> Option<Ipv4Addr> {
    let a = u32::from(POOL_FIRST).checked_add(u32::try_from(i).ok()?)?;
    (a <= u32::from(POOL_LAST)).then(|| Ipv4Addr::from(a))
}

// ----- the driver ------------------------------------------------------------------------

/// State of one Service the soak keeps.
#[derive(Debug, Clone)]
struct Svc {
    addr: Ipv4Addr,
    ignored: bool,
    touch: u64,
}

struct Chaos {
    lab: Lab,
    vipd: PathBuf,
    nodes: Vec<String>,
    procs: BTreeMap<String, LabProcess>,
    /// Every vipd process ever started, with its log, for the log scan at the end.
    logs: Vec<(String, PathBuf)>,
    services: BTreeMap<String, Svc>,
    next_svc: usize,
    tl: Timeline,
    epoch: Instant,
    faults: BTreeMap<FaultKind, u64>,
    violations: Vec<Violation>,
    notes: Vec<String>,
    macs: BTreeMap<MacAddr, String>,
    prober: Option<ArpRoundProber>,
    verbose: bool,
    /// vipd runs with `vip_nftfence=true` ([`Options::nft_fence`]).
    nft_fence: bool,
}

impl Chaos {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn say(&self, s: impl AsRef<str>) {
        if self.verbose {
            eprintln!("  [{:>7.1} s] {}", self.now().as_secs_f64(), s.as_ref());
        }
    }

    fn node_of(&self, mac: MacAddr) -> String {
        self.macs
            .get(&mac)
            .cloned()
            .unwrap_or_else(|| mac.to_string())
    }

    fn start_vipd(&mut self, node: &str) -> Result<()> {
        let kubeconfig = self.lab.kubeconfig(node)?.to_string_lossy().into_owned();
        let (l, r, p) = (
            LEASE_S.to_string(),
            RENEW_S.to_string(),
            RETRY_S.to_string(),
        );
        let vip = lab::CONTROL_PLANE_VIP.to_string();
        let env: Vec<(&str, &str)> = vec![
            ("cp_enable", "true"),
            ("vip_leaderelection", "true"),
            ("address", &vip),
            ("svc_enable", "true"),
            ("svc_election", "true"),
            ("vip_arp", "true"),
            ("vip_interface", lab::ETH),
            ("vip_nodename", node),
            ("k8s_config_file", &kubeconfig),
            ("vip_leaseduration", &l),
            ("vip_renewdeadline", &r),
            ("vip_retryperiod", &p),
            ("svc_leaseduration", &l),
            ("svc_renewdeadline", &r),
            ("svc_retryperiod", &p),
            ("prometheus_server", ""),
            ("vip_loglevel", "info"),
            (
                "vip_nftfence",
                if self.nft_fence { "true" } else { "false" },
            ),
        ];
        let proc = self.lab.spawn(node, &self.vipd, &["manager"], &env)?;
        self.logs
            .push((node.to_string(), proc.log_path().to_path_buf()));
        self.procs.insert(node.to_string(), proc);
        Ok(())
    }

    /// Admin API call from ns `api`; `Err` on I/O errors.
    fn api(&self, method: &str, path: &str, body: Option<&str>) -> Result<lab::HttpResponse> {
        Ok(self.lab.api_request(method, path, body)?)
    }

    fn service_body(name: &str, s: &Svc) -> String {
        let mut j = crate::bench::harness::api::service_json(name, IpAddr::V4(s.addr));
        j["metadata"]["annotations"][TOUCH_ANNOTATION] = serde_json::json!(s.touch.to_string());
        if s.ignored {
            j["metadata"]["annotations"]["kube-vip.io/ignore"] = serde_json::json!("true");
        }
        j.to_string()
    }

    fn free_address(&self, rng: &mut fastrand::Rng) -> Option<Ipv4Addr> {
        let used: BTreeSet<Ipv4Addr> = self.services.values().map(|s| s.addr).collect();
        // Addresses released within the bound are not reused yet (they may still answer).
        let bound = answer_bound();
        let now = self.now();
        let recent: BTreeSet<Ipv4Addr> = self
            .tl
            .desired
            .iter()
            .filter(|d| d.to.is_some_and(|to| now < to + bound + bound))
            .map(|d| d.addr)
            .collect();
        let free: Vec<Ipv4Addr> = (0..)
            .map_while(pool_address)
            .filter(|a| !used.contains(a) && !recent.contains(a))
            .collect();
        (!free.is_empty()).then(|| free[rng.usize(..free.len())])
    }

    fn desire(&mut self, addr: Ipv4Addr, owner: &str, at: Duration) {
        self.tl.desired.push(Desired {
            addr,
            owner: owner.to_string(),
            from: at,
            to: None,
        });
    }

    fn undesire(&mut self, addr: Ipv4Addr, at: Duration) {
        for d in self
            .tl
            .desired
            .iter_mut()
            .filter(|d| d.addr == addr && d.to.is_none())
        {
            d.to = Some(at);
        }
    }

    fn record_svc(&mut self, kind: FaultKind, name: &str, start: Duration, addrs: Vec<Ipv4Addr>) {
        let now = self.now();
        self.tl.disturbances.push(Disturbance {
            kind,
            target: name.to_string(),
            start,
            settled: Some(now),
            addrs: Some(addrs),
        });
        *self.faults.entry(kind).or_default() += 1;
    }

    fn create_service(&mut self, name: &str, addr: Ipv4Addr) -> Result<()> {
        let svc = Svc {
            addr,
            ignored: false,
            touch: 0,
        };
        let start = self.now();
        let r = self.api(
            "POST",
            &format!("/api/v1/namespaces/{NAMESPACE}/services"),
            Some(&Self::service_body(name, &svc)),
        )?;
        if r.status != 201 {
            bail!("create Service {name}: HTTP {}: {}", r.status, r.body);
        }
        let at = self.now();
        self.services.insert(name.to_string(), svc);
        self.desire(addr, name, at);
        self.record_svc(FaultKind::SvcCreate, name, start, vec![addr]);
        Ok(())
    }

    fn patch_service(&self, name: &str, patch: serde_json::Value) -> Result<()> {
        for _ in 0..5 {
            let r = self.api(
                "PATCH",
                &format!("/api/v1/namespaces/{NAMESPACE}/services/{name}"),
                Some(&patch.to_string()),
            )?;
            match r.status {
                200 => return Ok(()),
                409 => std::thread::sleep(Duration::from_millis(100)),
                s => bail!("patch Service {name}: HTTP {s}: {}", r.body),
            }
        }
        bail!("patch Service {name}: 5 conflicts in a row")
    }

    /// One random Service operation (create, address edit, delete, annotation change).
    fn service_op(&mut self, rng: &mut fastrand::Rng, target: usize) -> Result<()> {
        let n = self.services.len();
        let roll = rng.u32(..100);
        let names: Vec<String> = self.services.keys().cloned().collect();
        let pick = |rng: &mut fastrand::Rng| names.get(rng.usize(..names.len().max(1))).cloned();
        if (n < target && roll < 50) || n == 0 {
            let Some(addr) = self.free_address(rng) else {
                return Ok(());
            };
            let name = format!("svc-{}", self.next_svc);
            self.next_svc += 1;
            self.say(format!("create {name} {addr}"));
            return self.create_service(&name, addr);
        }
        let Some(name) = pick(rng) else {
            return Ok(());
        };
        let Some(svc) = self.services.get(&name).cloned() else {
            return Ok(());
        };
        if n > target.saturating_sub(5) && roll < 30 {
            self.say(format!("delete {name} {}", svc.addr));
            let start = self.now();
            let r = self.api(
                "DELETE",
                &format!("/api/v1/namespaces/{NAMESPACE}/services/{name}"),
                None,
            )?;
            if !matches!(r.status, 200 | 202) {
                bail!("delete Service {name}: HTTP {}: {}", r.status, r.body);
            }
            let at = self.now();
            self.services.remove(&name);
            self.undesire(svc.addr, at);
            self.record_svc(FaultKind::SvcDelete, &name, start, vec![svc.addr]);
        } else if roll < 65 {
            let Some(addr) = self.free_address(rng) else {
                return Ok(());
            };
            self.say(format!("edit {name} {} -> {addr}", svc.addr));
            let start = self.now();
            self.patch_service(
                &name,
                serde_json::json!({"metadata": {"annotations": {
                    "kube-vip.io/loadbalancerIPs": addr.to_string()}}}),
            )?;
            let at = self.now();
            if !svc.ignored {
                self.undesire(svc.addr, at);
                self.desire(addr, &name, at);
            }
            if let Some(s) = self.services.get_mut(&name) {
                s.addr = addr;
            }
            self.record_svc(FaultKind::SvcEdit, &name, start, vec![svc.addr, addr]);
        } else {
            let toggle = roll < 80;
            let start = self.now();
            if toggle {
                let ignored = !svc.ignored;
                self.say(format!("{name}: kube-vip.io/ignore {ignored}"));
                let value = if ignored {
                    serde_json::json!("true")
                } else {
                    serde_json::Value::Null
                };
                self.patch_service(
                    &name,
                    serde_json::json!({"metadata": {"annotations": {"kube-vip.io/ignore": value}}}),
                )?;
                let at = self.now();
                if ignored {
                    self.undesire(svc.addr, at);
                } else {
                    self.desire(svc.addr, &name, at);
                }
                if let Some(s) = self.services.get_mut(&name) {
                    s.ignored = ignored;
                }
            } else {
                let touch = svc.touch + 1;
                self.say(format!("{name}: {TOUCH_ANNOTATION}={touch}"));
                self.patch_service(
                    &name,
                    serde_json::json!({"metadata": {"annotations": {
                        TOUCH_ANNOTATION: touch.to_string()}}}),
                )?;
                if let Some(s) = self.services.get_mut(&name) {
                    s.touch = touch;
                }
            }
            self.record_svc(FaultKind::Annotation, &name, start, vec![svc.addr]);
        }
        Ok(())
    }

    /// Nodes answering for at least one address in the last probe round.
    fn holders(&self) -> BTreeSet<String> {
        self.prober
            .as_ref()
            .and_then(ArpRoundProber::last)
            .map(|r| {
                r.replies
                    .values()
                    .flatten()
                    .map(|m| self.node_of(*m))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Restarts vipd processes that exited on their own (a violation).
    fn check_alive(&mut self) -> Result<()> {
        let nodes = self.nodes.clone();
        for node in nodes {
            let exited = match self.procs.get_mut(&node) {
                Some(p) => p.try_wait()?,
                None => continue,
            };
            if let Some(st) = exited {
                let log = self
                    .procs
                    .get(&node)
                    .map(LabProcess::log)
                    .unwrap_or_default();
                self.violations.push(v(
                    ViolationKind::VipdExit,
                    format!(
                        "vipd on {node} exited by itself ({st}) at {}; log tail:\n{}",
                        secs(self.now()),
                        crate::bench::harness::text::tail(&log, 8)
                    ),
                ));
                let start = self.now();
                self.start_vipd(&node)?;
                self.tl.disturbances.push(Disturbance {
                    kind: FaultKind::CrashRestart,
                    target: node.clone(),
                    start,
                    settled: Some(self.now()),
                    addrs: None,
                });
                *self.faults.entry(FaultKind::CrashRestart).or_default() += 1;
            }
        }
        Ok(())
    }

    /// Waits until the API server answers /readyz (ns `api`), up to `limit`.
    fn wait_api_ready(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self
                .api("GET", "/readyz", None)
                .is_ok_and(|r| r.status == 200)
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    fn nft(&self, node: &str, script: &str) -> Result<()> {
        self.lab.exec(node, "nft", &[script])?;
        Ok(())
    }

    /// Injects `kind` on `target` (a node for node faults); returns the undo to run at heal.
    fn inject(&mut self, kind: FaultKind, target: &str) -> Result<()> {
        self.say(format!("inject {} on {target}", kind.name()));
        match kind {
            FaultKind::Kill => {
                if let Some(p) = self.procs.get_mut(target) {
                    p.kill()?;
                }
                self.procs.remove(target);
            }
            FaultKind::Term => {
                if let Some(mut p) = self.procs.remove(target) {
                    p.signal(Signal::SIGTERM)?;
                    match p.wait_timeout(Duration::from_secs(15))? {
                        Some(st) if st.success() => {}
                        Some(st) => self.violations.push(v(
                            ViolationKind::VipdExit,
                            format!(
                                "vipd on {target} exited with {st} on SIGTERM at {}",
                                secs(self.now())
                            ),
                        )),
                        None => {
                            self.violations.push(v(
                                ViolationKind::SlowShutdown,
                                format!(
                                    "vipd on {target} still running 15 s after SIGTERM at {}",
                                    secs(self.now())
                                ),
                            ));
                            p.kill()?;
                        }
                    }
                }
            }
            FaultKind::Stop => {
                if let Some(p) = self.procs.get(target) {
                    p.signal(Signal::SIGSTOP)?;
                }
            }
            FaultKind::LinkCut => self.lab.cut_link(target)?,
            FaultKind::Partition => {
                let api = lab::API_IP;
                self.nft(
                    target,
                    &format!(
                        "add table inet {PARTITION_TABLE}; \
                         add chain inet {PARTITION_TABLE} in {{ type filter hook input priority -10; }}; \
                         add chain inet {PARTITION_TABLE} out {{ type filter hook output priority -10; }}; \
                         add rule inet {PARTITION_TABLE} in ip saddr {api} drop; \
                         add rule inet {PARTITION_TABLE} out ip daddr {api} drop"
                    ),
                )?;
            }
            FaultKind::ApiFreeze => {
                if let Some(pid) = self.lab.control_plane_pids().get(1) {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), Signal::SIGSTOP)?;
                }
            }
            FaultKind::ApiRestart => self
                .lab
                .restart_control_plane(ControlPlaneProcess::ApiServer, Duration::from_secs(120))?,
            FaultKind::EtcdRestart => self
                .lab
                .restart_control_plane(ControlPlaneProcess::Etcd, Duration::from_secs(120))?,
            _ => bail!("{kind:?} is not injected by inject()"),
        }
        Ok(())
    }

    fn heal(&mut self, kind: FaultKind, target: &str) -> Result<()> {
        self.say(format!("heal {} on {target}", kind.name()));
        match kind {
            FaultKind::Kill | FaultKind::Term => self.start_vipd(target)?,
            FaultKind::Stop => {
                if let Some(p) = self.procs.get(target) {
                    p.signal(Signal::SIGCONT)?;
                }
            }
            FaultKind::LinkCut => self.lab.restore_link(target)?,
            FaultKind::Partition => {
                self.nft(target, &format!("delete table inet {PARTITION_TABLE}"))?
            }
            FaultKind::ApiFreeze => {
                if let Some(pid) = self.lab.control_plane_pids().get(1) {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), Signal::SIGCONT)?;
                }
            }
            _ => {}
        }
        if kind.is_control_plane_fault() && !self.wait_api_ready(Duration::from_secs(120)) {
            bail!(
                "the API server is not ready 120 s after healing {}",
                kind.name()
            );
        }
        Ok(())
    }

    /// One episode: 1-2 faults, Service operations during the hold, heal, quiet.
    fn episode(
        &mut self,
        rng: &mut fastrand::Rng,
        target_services: usize,
        only: Option<&BTreeSet<FaultKind>>,
    ) -> Result<()> {
        self.check_alive()?;
        let chosen = self.choose_faults(rng, only);
        let hold = Duration::from_millis(rng.u64(300..8000));
        let mut svc_ops = rng.usize(0..4) + usize::from(chosen.is_empty());
        if only.is_some_and(|o| !o.contains(&FaultKind::SvcCreate)) {
            // `--faults` without `services`: no Service operations during holds either.
            svc_ops = 0;
        }
        let cp_fault = chosen.iter().any(|(k, _)| k.is_control_plane_fault());
        let active = self.inject_all(chosen);
        self.hold_with_service_ops(rng, hold, svc_ops, cp_fault, target_services);
        self.heal_all(rng, active)?;
        let quiet = if rng.u32(..100) < 75 {
            answer_bound() + Duration::from_millis(rng.u64(500..4000))
        } else {
            Duration::from_millis(rng.u64(0..1000))
        };
        std::thread::sleep(quiet);
        Ok(())
    }

    /// Draws 1 (70 %) or 2 faults by weight among `only` (all kinds when `None`): at most
    /// one control-plane fault; a node fault hits a holder when there is one.
    fn choose_faults(
        &self,
        rng: &mut fastrand::Rng,
        only: Option<&BTreeSet<FaultKind>>,
    ) -> Vec<(FaultKind, String)> {
        const WEIGHTS: [(FaultKind, u32); 9] = [
            (FaultKind::Kill, 3),
            (FaultKind::Stop, 3),
            (FaultKind::Term, 3),
            (FaultKind::LinkCut, 3),
            (FaultKind::Partition, 3),
            (FaultKind::ApiFreeze, 1),
            (FaultKind::ApiRestart, 1),
            (FaultKind::EtcdRestart, 1),
            // Service operations only.
            (FaultKind::SvcCreate, 4),
        ];
        let weights: Vec<(FaultKind, u32)> = WEIGHTS
            .into_iter()
            .filter(|(k, _)| only.is_none_or(|o| o.contains(k)))
            .collect();
        let total: u32 = weights.iter().map(|(_, w)| w).sum::<u32>().max(1);
        let n_faults = if rng.u32(..100) < 70 { 1 } else { 2 };
        let mut chosen: Vec<(FaultKind, String)> = Vec::new();
        for _ in 0..n_faults {
            let mut x = rng.u32(..total);
            let mut kind = FaultKind::SvcCreate;
            for (k, w) in weights.iter().copied() {
                if x < w {
                    kind = k;
                    break;
                }
                x -= w;
            }
            if kind == FaultKind::SvcCreate {
                continue;
            }
            if kind.is_control_plane_fault() {
                if chosen.iter().any(|(k, _)| k.is_control_plane_fault()) {
                    continue;
                }
                chosen.push((kind, "control-plane".into()));
                continue;
            }
            // A node fault hits a holder; SIGKILL/SIGTERM spare the first node, whose vipd
            // lives through the whole run (its RSS start/end is the leak check).
            let used: BTreeSet<String> = chosen.iter().map(|(_, t)| t.clone()).collect();
            let restart = matches!(kind, FaultKind::Kill | FaultKind::Term);
            let eligible = |n: &String| {
                let spared = restart && *n == self.nodes[0];
                !used.contains(n) && !spared && self.procs.contains_key(n)
            };
            let holders: Vec<String> = self.holders().into_iter().filter(eligible).collect();
            let all: Vec<String> = self.nodes.iter().filter(|n| eligible(n)).cloned().collect();
            let pool = if holders.is_empty() { all } else { holders };
            if pool.is_empty() {
                continue;
            }
            chosen.push((kind, pool[rng.usize(..pool.len())].clone()));
        }
        chosen
    }

    /// Injects each chosen fault, records it as a disturbance (restarts are settled at once:
    /// they return when the API server is ready again) and returns those injected with
    /// their disturbance index.
    fn inject_all(&mut self, chosen: Vec<(FaultKind, String)>) -> Vec<(FaultKind, String, usize)> {
        let mut active: Vec<(FaultKind, String, usize)> = Vec::new();
        for (kind, target) in chosen {
            let start = self.now();
            match self.inject(kind, &target) {
                Ok(()) => {
                    *self.faults.entry(kind).or_default() += 1;
                    let idx = self.tl.disturbances.len();
                    self.tl.disturbances.push(Disturbance {
                        kind,
                        target: target.clone(),
                        start,
                        settled: None,
                        addrs: None,
                    });
                    active.push((kind, target, idx));
                }
                Err(e) => self.notes.push(format!(
                    "{}: could not inject {} on {target}: {e:#}",
                    secs(start),
                    kind.name()
                )),
            }
        }
        // Restarts are whole faults: settled when the API server is ready again.
        for (kind, _, idx) in &active {
            if matches!(kind, FaultKind::ApiRestart | FaultKind::EtcdRestart)
                && let Some(d) = self.tl.disturbances.get_mut(*idx)
            {
                d.settled = Some(self.epoch.elapsed());
            }
        }
        active
    }

    /// Holds the faults for `hold`, running `svc_ops` Service operations at random times
    /// meanwhile (none during a control-plane fault).
    fn hold_with_service_ops(
        &mut self,
        rng: &mut fastrand::Rng,
        hold: Duration,
        svc_ops: usize,
        cp_fault: bool,
        target_services: usize,
    ) {
        let hold_end = Instant::now() + hold;
        for _ in 0..svc_ops {
            if cp_fault {
                break;
            }
            let left = hold_end.saturating_duration_since(Instant::now());
            std::thread::sleep(Duration::from_millis(
                rng.u64(0..=left.as_millis() as u64 / 2),
            ));
            if let Err(e) = self.service_op(rng, target_services) {
                self.notes.push(format!(
                    "{}: Service operation failed: {e:#}",
                    secs(self.now())
                ));
            }
        }
        std::thread::sleep(hold_end.saturating_duration_since(Instant::now()));
    }

    /// Heals the active faults in random order (restarts healed themselves) and marks them
    /// settled.
    fn heal_all(
        &mut self,
        rng: &mut fastrand::Rng,
        mut active: Vec<(FaultKind, String, usize)>,
    ) -> Result<()> {
        rng.shuffle(&mut active);
        for (kind, target, idx) in active {
            if !matches!(kind, FaultKind::ApiRestart | FaultKind::EtcdRestart) {
                self.heal(kind, &target)?;
                let now = self.now();
                if let Some(d) = self.tl.disturbances.get_mut(idx) {
                    d.settled = Some(now);
                }
            }
        }
        Ok(())
    }

    /// Every Service as the API server has it.
    fn observed_services(&self) -> Result<Vec<ObservedService>> {
        let r = self.api(
            "GET",
            &format!("/api/v1/namespaces/{NAMESPACE}/services"),
            None,
        )?;
        if r.status != 200 {
            bail!("list Services: HTTP {}: {}", r.status, r.body);
        }
        let j: serde_json::Value = serde_json::from_str(&r.body).context("Service list JSON")?;
        let mut out = Vec::new();
        for s in j["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let name = s["metadata"]["name"].as_str().unwrap_or_default();
            if name == "kubernetes" {
                continue;
            }
            let ann = &s["metadata"]["annotations"];
            out.push(ObservedService {
                name: name.to_string(),
                addr: ann["kube-vip.io/loadbalancerIPs"]
                    .as_str()
                    .and_then(|a| a.parse().ok()),
                ingress: s["status"]["loadBalancer"]["ingress"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|i| i["ip"].as_str().map(str::to_string))
                    .collect(),
                vip_host: ann["kube-vip.io/vipHost"].as_str().map(str::to_string),
            });
        }
        Ok(out)
    }

    fn lease_names(&self) -> Result<Vec<String>> {
        let r = self.api(
            "GET",
            &format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"),
            None,
        )?;
        if r.status != 200 {
            bail!("list leases: HTTP {}: {}", r.status, r.body);
        }
        let j: serde_json::Value = serde_json::from_str(&r.body).context("lease list JSON")?;
        Ok(j["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    fn rss(&self) -> BTreeMap<String, (i32, u64)> {
        self.procs
            .iter()
            .map(|(n, p)| {
                (
                    n.clone(),
                    (
                        p.pid(),
                        crate::bench::harness::procfs::rss_kib(p.pid()).unwrap_or(0),
                    ),
                )
            })
            .collect()
    }

    fn answered_all(&self) -> bool {
        let Some(r) = self.prober.as_ref().and_then(ArpRoundProber::last) else {
            return false;
        };
        self.services
            .values()
            .filter(|s| !s.ignored)
            .map(|s| s.addr)
            .chain([lab::CONTROL_PLANE_VIP])
            .all(|a| r.replies.get(&a).is_some_and(|m| m.len() == 1))
    }
}

/// Entry point of `cargo xtask chaos ARGS`. Prints the fault and violation tables.
///
/// # Errors
/// Bad arguments, not root, a failed build, a lab that does not start, or any invariant
/// violation (the error counts them).
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    if nix::unistd::geteuid().as_raw() != 0 {
        bail!("`cargo xtask chaos` needs root (network namespaces); run it with sudo -E");
    }
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
    println!(
        "  lease {LEASE_S}/{RENEW_S}/{RETRY_S} s, answer bound {} (lease + 1 s + {} ms probe slack)",
        secs(answer_bound()),
        PROBE_SLACK.as_millis()
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
    };
    let result = soak(&mut c, &o, &mut rng);
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

/// Figures for the report besides faults and violations.
#[derive(Debug, Default)]
struct Report {
    rss_start: BTreeMap<String, (i32, u64)>,
    rss_end: BTreeMap<String, (i32, u64)>,
    rounds: usize,
    audited_s: f64,
    warnings: Vec<String>,
    canary: Option<String>,
}

fn soak(c: &mut Chaos, o: &Options, rng: &mut fastrand::Rng) -> Result<Report> {
    let mut report = Report::default();
    let universe = start_soak(c, o)?;
    let audit_from = warm_up(c, o, &mut report)?;
    fault_phase(c, o, rng)?;
    final_settle(c)?;
    final_audit(c, o, &mut report, audit_from, universe)?;
    check_orphan_leases(c, o, &mut report)?;
    check_rss(c, o, &mut report);
    stop_all_vipds(c)?;
    check_leftovers(c)?;
    check_panics(c);
    Ok(report)
}

/// Starts vipd on every node and the prober of every pool address (plus the control-plane
/// VIP and the canary); returns the probed addresses.
fn start_soak(c: &mut Chaos, o: &Options) -> Result<Vec<Ipv4Addr>> {
    for n in c.nodes.clone() {
        c.start_vipd(&n)?;
    }
    let mut universe: Vec<Ipv4Addr> = (0..).map_while(pool_address).collect();
    universe.push(lab::CONTROL_PLANE_VIP);
    if o.canary {
        universe.push(CANARY_ADDR);
    }
    c.prober = Some(ArpRoundProber::start(
        &c.lab.netns_path("client")?,
        lab::ETH,
        lab::CLIENT_V4,
        universe.clone(),
        ROUND_PERIOD,
        ROUND_WINDOW,
        c.epoch,
    )?);
    let at = c.now();
    c.desire(lab::CONTROL_PLANE_VIP, "control-plane", at);
    Ok(universe)
}

/// Creates the Services and waits until each answered, then 10 s; records RSS at start,
/// clears the fault table and runs the canary if asked. Returns the start of the audit.
fn warm_up(c: &mut Chaos, o: &Options, report: &mut Report) -> Result<Duration> {
    // Warm-up: every Service created and answered, then RSS start.
    for i in 0..o.services {
        let addr = pool_address(i).ok_or_else(|| anyhow!("pool too small"))?;
        let name = format!("svc-{i}");
        c.next_svc = i + 1;
        c.create_service(&name, addr)?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !c.answered_all() {
        if Instant::now() > deadline {
            bail!("warm-up: not every Service answered within 120 s of its creation");
        }
        c.check_alive()?;
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(10));
    let audit_from = c.now();
    report.rss_start = c.rss();
    // The fault table counts the fault phase only (the warm-up creates are not faults).
    c.faults.clear();
    if o.canary {
        put_canary(c)?;
    }
    println!(
        "  warm-up done at {}: {} Services answered; faults start",
        secs(audit_from),
        c.services.len()
    );
    Ok(audit_from)
}

/// Two nodes answer for an address nobody owns for [`CANARY_HOLD`]: the auditor must see two
/// MACs and an answer without a Service.
fn put_canary(c: &mut Chaos) -> Result<()> {
    let cidr = format!("{CANARY_ADDR}/32");
    let pair: Vec<String> = c.nodes.iter().take(2).cloned().collect();
    for n in &pair {
        c.lab
            .exec(n, "ip", &["addr", "add", &cidr, "dev", lab::ETH])?;
    }
    std::thread::sleep(CANARY_HOLD);
    for n in &pair {
        c.lab
            .exec(n, "ip", &["addr", "del", &cidr, "dev", lab::ETH])?;
    }
    println!(
        "  canary: {CANARY_ADDR} was on {} for {} s",
        pair.join(" and "),
        CANARY_HOLD.as_secs()
    );
    Ok(())
}

/// Runs episodes for `o.minutes`, printing progress every minute.
fn fault_phase(c: &mut Chaos, o: &Options, rng: &mut fastrand::Rng) -> Result<()> {
    let end = Instant::now() + Duration::from_secs_f64(o.minutes * 60.0);
    let mut next_progress = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        c.episode(rng, o.services, o.faults.as_ref())?;
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(60);
            let f: u64 = c.faults.values().sum();
            eprintln!(
                "  {:.1} min: {f} faults and Service changes, {} Services",
                c.now().as_secs_f64() / 60.0,
                c.services.len()
            );
        }
    }
    Ok(())
}

/// Everything healed (each episode heals its faults), every Service announceable again,
/// every vipd running; then waits for the status to converge and records what did not.
fn final_settle(c: &mut Chaos) -> Result<()> {
    c.check_alive()?;
    let ignored: Vec<String> = c
        .services
        .iter()
        .filter(|(_, s)| s.ignored)
        .map(|(n, _)| n.clone())
        .collect();
    for name in ignored {
        let start = c.now();
        c.patch_service(
            &name,
            serde_json::json!({"metadata": {"annotations": {"kube-vip.io/ignore": null}}}),
        )?;
        let at = c.now();
        let addr = c.services.get(&name).map(|s| s.addr);
        if let (Some(addr), Some(s)) = (addr, c.services.get_mut(&name)) {
            s.ignored = false;
            c.desire(addr, &name, at);
            c.record_svc(FaultKind::Annotation, &name, start, vec![addr]);
        }
    }
    std::thread::sleep(answer_bound() + Duration::from_secs(2));
    // Status converges (level-triggered writes with back-off).
    let deadline = Instant::now() + STATUS_WAIT;
    let status_violations = loop {
        let observed = c.observed_services()?;
        let last = c
            .prober
            .as_ref()
            .and_then(ArpRoundProber::last)
            .unwrap_or_default();
        let vs = check_status(&observed, &last.replies, &|m| c.node_of(m));
        if vs.is_empty() || Instant::now() > deadline {
            break vs;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    c.violations.extend(status_violations);
    Ok(())
}

/// Stops the prober and audits its rounds from `audit_from` (and the canary's verdict).
fn final_audit(
    c: &mut Chaos,
    o: &Options,
    report: &mut Report,
    audit_from: Duration,
    universe: Vec<Ipv4Addr>,
) -> Result<()> {
    let rounds = c
        .prober
        .take()
        .map(ArpRoundProber::stop)
        .transpose()?
        .unwrap_or_default();
    report.rounds = rounds.len();
    report.audited_s = rounds
        .last()
        .map_or(0.0, |r| r.t.saturating_sub(audit_from).as_secs_f64());
    let params = AuditParams {
        bound: answer_bound(),
        audit_from,
        universe,
    };
    let found = audit(&rounds, &c.tl, &params, &|m| c.node_of(m));
    let (canary, found) = split_canary(found);
    c.violations.extend(found);
    if o.canary {
        match canary_verdict(&canary) {
            Ok(msg) => report.canary = Some(msg),
            Err(x) => c.violations.push(x),
        }
    }
    Ok(())
}

/// Leases of deleted Services (vipd deletes them; the GC may lag by lease + grace): a
/// violation, or a warning with `--orphan-leases-warn`.
fn check_orphan_leases(c: &mut Chaos, o: &Options, report: &mut Report) -> Result<()> {
    let deadline = Instant::now() + LEASE_GC_WAIT;
    let orphans = loop {
        let names: BTreeSet<String> = c.observed_services()?.into_iter().map(|s| s.name).collect();
        let orphans = orphan_leases(&c.lease_names()?, &names);
        if orphans.is_empty() || Instant::now() > deadline {
            break orphans;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    if !orphans.is_empty() {
        let detail = format!(
            "{} lease(s) of deleted Services left {} s after the end: {}",
            orphans.len(),
            LEASE_GC_WAIT.as_secs(),
            orphans
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
        if o.orphan_leases_warn {
            report.warnings.push(detail);
        } else {
            c.violations.push(v(ViolationKind::OrphanLease, detail));
        }
    }
    Ok(())
}

/// Records RSS at the end and flags growth over `o.rss_growth_pct`.
fn check_rss(c: &mut Chaos, o: &Options, report: &mut Report) {
    report.rss_end = c.rss();
    for (node, start) in &report.rss_start {
        if let Some(end) = report.rss_end.get(node)
            && let Some(x) = rss_violation(node, *start, *end, o.rss_growth_pct)
        {
            c.violations.push(x);
        }
    }
}

/// Graceful stop of every vipd at once: each must exit 0 within 15 s.
fn stop_all_vipds(c: &mut Chaos) -> Result<()> {
    for p in c.procs.values() {
        let _ = p.signal(Signal::SIGTERM);
    }
    let procs = std::mem::take(&mut c.procs);
    for (node, mut p) in procs {
        match p.wait_timeout(Duration::from_secs(15))? {
            Some(st) if st.success() => {}
            Some(st) => c.violations.push(v(
                ViolationKind::VipdExit,
                format!("vipd on {node} exited with {st} on the final SIGTERM"),
            )),
            None => {
                c.violations.push(v(
                    ViolationKind::SlowShutdown,
                    format!("vipd on {node} still running 15 s after the final SIGTERM"),
                ));
                p.kill()?;
            }
        }
    }
    Ok(())
}

/// What is left on the nodes after the final stop (addresses, nft tables, links).
fn check_leftovers(c: &mut Chaos) -> Result<()> {
    for node in c.nodes.clone() {
        let own: Vec<IpAddr> = [
            lab::node_ipv4(&node).map(IpAddr::V4),
            lab::node_ipv6(&node).map(IpAddr::V6),
        ]
        .into_iter()
        .flatten()
        .collect();
        let addrs = c.lab.addresses(&node, lab::ETH)?;
        let nft = c.lab.exec_unchecked(&node, "nft", &["list", "tables"])?;
        let links = c.lab.exec(&node, "ip", &["-j", "link", "show"])?;
        let links: serde_json::Value =
            serde_json::from_slice(&links.stdout).context("ip -j link JSON")?;
        let links: Vec<String> = links
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l["ifname"].as_str().map(str::to_string))
            .collect();
        let found = leftovers(
            &node,
            &addrs,
            &own,
            &String::from_utf8_lossy(&nft.stdout),
            &links,
        );
        c.violations.extend(found);
    }
    Ok(())
}

/// Panics in any vipd log, including the logs of processes the soak killed.
fn check_panics(c: &mut Chaos) {
    for (node, path) in &c.logs {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.contains("panicked") {
            let line = log
                .lines()
                .find(|l| l.contains("panicked"))
                .unwrap_or_default();
            c.violations.push(v(
                ViolationKind::VipdExit,
                format!("vipd on {node} panicked ({}): {line}", path.display()),
            ));
        }
    }
}

/// `git describe --always --dirty` of the workspace (empty when git fails).
fn workspace_commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(lab::control_plane::workspace_root())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn print_report(c: &Chaos, r: &Report, seed: u64, o: &Options, commit: &str) {
    println!("\n== chaos soak result");
    println!(
        "  seed {seed}, {} min of faults, commit {commit}, {} probe rounds ({:.0} s audited), {} Services at the end",
        o.minutes,
        r.rounds,
        r.audited_s,
        c.services.len()
    );
    println!("\n  faults injected:");
    println!("    {:<28} {:>6}", "kind", "count");
    for (k, n) in &c.faults {
        println!("    {:<28} {:>6}", k.name(), n);
    }
    println!("    {:<28} {:>6}", "total", c.faults.values().sum::<u64>());
    println!("\n  invariant violations:");
    let mut by: BTreeMap<ViolationKind, Vec<&Violation>> = BTreeMap::new();
    for x in &c.violations {
        by.entry(x.kind).or_default().push(x);
    }
    println!("    {:<30} {:>6}  first examples", "kind", "count");
    for k in [
        ViolationKind::TwoMacs,
        ViolationKind::Unanswered,
        ViolationKind::StaleAnswer,
        ViolationKind::Status,
        ViolationKind::OrphanLease,
        ViolationKind::RssGrowth,
        ViolationKind::VipdExit,
        ViolationKind::SlowShutdown,
        ViolationKind::LeakedAddress,
        ViolationKind::LeakedNftTable,
        ViolationKind::LeakedLink,
    ] {
        let list = by.get(&k).map(Vec::as_slice).unwrap_or_default();
        println!("    {:<30} {:>6}", k.name(), list.len());
        for x in list.iter().take(3) {
            for (i, line) in x.detail.lines().enumerate() {
                println!("      {}{line}", if i == 0 { "- " } else { "  " });
            }
        }
    }
    println!("\n  RSS (KiB) start (after warm-up) -> end (before the final stop):");
    for (node, (p0, r0)) in &r.rss_start {
        let (p1, r1) = r.rss_end.get(node).copied().unwrap_or((0, 0));
        let same = if *p0 == p1 {
            format!(
                "same process, {:+.1} %",
                (r1 as f64 / (*r0).max(1) as f64 - 1.0) * 100.0
            )
        } else {
            format!("restarted during the run (pid {p0} -> {p1}), not compared")
        };
        println!("    {node}: {r0} -> {r1} ({same})");
    }
    if let Some(msg) = &r.canary {
        println!("\n  canary: {msg}");
    }
    for w in &r.warnings {
        println!("\n  warning: {w}");
    }
    if !c.notes.is_empty() {
        println!("\n  harness notes ({}):", c.notes.len());
        for n in c.notes.iter().take(10) {
            println!("    {n}");
        }
    }
    println!("\n  vipd logs:");
    let mut per_node: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    for (node, path) in &c.logs {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        let (w, e, p, _) = crate::bench::harness::text::log_findings(&log);
        let x = per_node.entry(node).or_default();
        x.0 += w;
        x.1 += e;
        x.2 += p;
    }
    for (node, (w, e, p)) in per_node {
        println!("    {node}: {w} WARN, {e} ERROR, {p} panics (all its processes)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 150);
    const B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 151);

    fn mac(n: u8) -> MacAddr {
        MacAddr::new(2, 0, 0xc0, 0, 2, n)
    }

    fn node_of(m: MacAddr) -> String {
        format!("node-{}", m.5)
    }

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    /// Rounds every 0.25 s from `from` to `to` (s) in which `who(t)` answers `addr`.
    fn rounds(from: f64, to: f64, addr: Ipv4Addr, who: impl Fn(f64) -> Vec<u8>) -> Vec<ProbeRound> {
        let mut out = Vec::new();
        let mut t = from;
        while t < to {
            let mut r = ProbeRound {
                t: s(t),
                replies: BTreeMap::new(),
            };
            let macs: BTreeSet<MacAddr> = who(t).into_iter().map(mac).collect();
            if !macs.is_empty() {
                r.replies.insert(addr, macs);
            }
            out.push(r);
            t += 0.25;
        }
        out
    }

    fn params(universe: &[Ipv4Addr]) -> AuditParams {
        AuditParams {
            bound: s(4.5),
            audit_from: s(0.0),
            universe: universe.to_vec(),
        }
    }

    fn desired(addr: Ipv4Addr, from: f64, to: Option<f64>) -> Desired {
        Desired {
            addr,
            owner: "svc-0".into(),
            from: s(from),
            to: to.map(s),
        }
    }

    fn fault(kind: FaultKind, start: f64, settled: Option<f64>) -> Disturbance {
        Disturbance {
            kind,
            target: "node-b".into(),
            start: s(start),
            settled: settled.map(s),
            addrs: None,
        }
    }

    #[test]
    fn two_macs_in_one_round_is_a_violation_even_during_a_fault() {
        let tl = Timeline {
            disturbances: vec![fault(FaultKind::Stop, 0.0, None)],
            desired: vec![desired(A, 0.0, None)],
        };
        // Two MACs from 2.0 s to 2.5 s (3 rounds): one violation naming both nodes.
        let r = rounds(0.0, 10.0, A, |t| {
            if (2.0..2.6).contains(&t) {
                vec![11, 12]
            } else {
                vec![11]
            }
        });
        let found = audit(&r, &tl, &params(&[A]), &node_of);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, ViolationKind::TwoMacs);
        assert!(found[0].detail.contains("node-11 and node-12"), "{found:?}");
        assert!(found[0].detail.contains("3 rounds"), "{found:?}");
    }

    #[test]
    fn unanswered_counts_only_after_the_bound_past_the_last_settle() {
        // Killed at 10 s, restarted at 12 s; bound 4.5 s: blind until 16.5 s.
        let tl = Timeline {
            disturbances: vec![fault(FaultKind::Kill, 10.0, Some(12.0))],
            desired: vec![desired(A, 0.0, None)],
        };
        let p = AuditParams {
            audit_from: s(5.0),
            ..params(&[A])
        };
        // Silent 10..16.25 s: inside the blind interval, fine.
        let ok = rounds(0.0, 30.0, A, |t| {
            if (10.0..16.3).contains(&t) {
                vec![]
            } else {
                vec![12]
            }
        });
        assert_eq!(audit(&ok, &tl, &p, &node_of), vec![]);
        // Silent until 17 s: the rounds at 16.5 and 16.75 s fail.
        let late = rounds(0.0, 30.0, A, |t| {
            if (10.0..17.0).contains(&t) {
                vec![]
            } else {
                vec![12]
            }
        });
        let found = audit(&late, &tl, &p, &node_of);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, ViolationKind::Unanswered);
        assert!(
            found[0]
                .detail
                .contains("from 16.50 s to 16.75 s (2 rounds)"),
            "{found:?}"
        );
        assert!(
            found[0].detail.contains("sigkill+restart node-b"),
            "{found:?}"
        );
        // Silence before audit_from (warm-up) is not judged.
        let warm = rounds(0.0, 30.0, A, |t| if t < 5.0 { vec![] } else { vec![12] });
        assert_eq!(audit(&warm, &tl, &p, &node_of), vec![]);
    }

    #[test]
    fn an_unhealed_fault_blinds_forever_and_service_changes_blind_their_address_only() {
        let tl = Timeline {
            disturbances: vec![Disturbance {
                kind: FaultKind::SvcEdit,
                target: "svc-0".into(),
                start: s(9.9),
                settled: Some(s(10.0)),
                addrs: Some(vec![A, B]),
            }],
            // svc-0 moved from A to B at 10 s.
            desired: vec![desired(A, 0.0, Some(10.0)), desired(B, 10.0, None)],
        };
        let mut r = rounds(0.0, 20.0, A, |t| if t < 12.0 { vec![11] } else { vec![] });
        let rb = rounds(0.0, 20.0, B, |t| if t >= 11.0 { vec![12] } else { vec![] });
        for (x, y) in r.iter_mut().zip(rb) {
            x.replies.extend(y.replies);
        }
        assert_eq!(audit(&r, &tl, &params(&[A, B]), &node_of), vec![]);
        // A still answered at 15 s (past 10 + 4.5): stale.
        let mut r2 = rounds(0.0, 20.0, A, |t| if t < 15.0 { vec![11] } else { vec![] });
        let rb = rounds(0.0, 20.0, B, |t| if t >= 11.0 { vec![12] } else { vec![] });
        for (x, y) in r2.iter_mut().zip(rb) {
            x.replies.extend(y.replies);
        }
        let found = audit(&r2, &tl, &params(&[A, B]), &node_of);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, ViolationKind::StaleAnswer);
        assert!(found[0].detail.starts_with("192.0.2.150"), "{found:?}");
        // A fault never settled: nothing is judged after it started.
        let tl2 = Timeline {
            disturbances: vec![fault(FaultKind::ApiFreeze, 1.0, None)],
            desired: vec![desired(A, 0.0, None)],
        };
        let silent = rounds(0.0, 20.0, A, |t| if t < 1.0 { vec![11] } else { vec![] });
        assert_eq!(audit(&silent, &tl2, &params(&[A]), &node_of), vec![]);
    }

    #[test]
    fn status_must_name_the_answering_node() {
        let mut answering = BTreeMap::new();
        answering.insert(A, [mac(11)].into_iter().collect::<BTreeSet<_>>());
        answering.insert(B, [mac(11), mac(12)].into_iter().collect());
        let good = ObservedService {
            name: "svc-0".into(),
            addr: Some(A),
            ingress: vec![A.to_string()],
            vip_host: Some("node-11".into()),
        };
        assert_eq!(
            check_status(std::slice::from_ref(&good), &answering, &node_of),
            vec![]
        );
        let wrong_host = ObservedService {
            vip_host: Some("node-12".into()),
            ..good.clone()
        };
        let found = check_status(&[wrong_host], &answering, &node_of);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, ViolationKind::Status);
        assert!(found[0].detail.contains("vipHost"), "{found:?}");
        let no_ingress = ObservedService {
            ingress: vec![],
            ..good.clone()
        };
        assert_eq!(
            check_status(&[no_ingress], &answering, &node_of)[0].kind,
            ViolationKind::Status
        );
        let two = ObservedService {
            addr: Some(B),
            ..good.clone()
        };
        assert_eq!(
            check_status(&[two], &answering, &node_of)[0].kind,
            ViolationKind::TwoMacs
        );
        let silent = ObservedService {
            addr: Some(Ipv4Addr::new(192, 0, 2, 200)),
            ..good
        };
        assert_eq!(
            check_status(&[silent], &answering, &node_of)[0].kind,
            ViolationKind::Unanswered
        );
    }

    #[test]
    fn orphan_leases_are_default_service_leases_without_service() {
        let services: BTreeSet<String> = ["svc-1".to_string()].into();
        let leases = vec![
            "kubevip-svc-1".to_string(),
            "kubevip-svc-2".to_string(),
            "plndr-cp-lock".to_string(),
        ];
        assert_eq!(orphan_leases(&leases, &services), vec!["kubevip-svc-2"]);
    }

    #[test]
    fn rss_growth_is_judged_on_the_same_process_only() {
        assert_eq!(rss_violation("node-a", (10, 1000), (10, 1200), 20.0), None);
        let x = rss_violation("node-a", (10, 1000), (10, 1201), 20.0).unwrap();
        assert_eq!(x.kind, ViolationKind::RssGrowth);
        assert!(x.detail.contains("1000 KiB -> 1201 KiB"), "{x:?}");
        assert_eq!(rss_violation("node-b", (10, 1000), (11, 5000), 20.0), None);
    }

    #[test]
    fn leftovers_find_vip_addresses_vipd_tables_and_extra_links() {
        let addr = |a: &str, p: u8| LabAddress {
            addr: a.parse().unwrap(),
            prefix: p,
            scope: "global".into(),
            label: None,
            flags: vec![],
            protocol: None,
            valid_lft: None,
            preferred_lft: None,
        };
        let own: Vec<IpAddr> = vec![
            "192.0.2.11".parse().unwrap(),
            "2001:db8::11".parse().unwrap(),
        ];
        let addrs = vec![
            addr("192.0.2.11", 24),
            addr("2001:db8::11", 64),
            addr("fe80::1", 64),
            addr("192.0.2.150", 32),
        ];
        let nft = "table inet vipd_chaos_partition\ntable arp vipd\ntable inet vipd_fence\n";
        let links = vec!["lo".to_string(), "eth0".into(), "vip-1".into()];
        let found = leftovers("node-a", &addrs, &own, nft, &links);
        let kinds: Vec<ViolationKind> = found.iter().map(|x| x.kind).collect();
        assert_eq!(
            kinds,
            vec![
                ViolationKind::LeakedAddress,
                ViolationKind::LeakedNftTable,
                ViolationKind::LeakedNftTable,
                ViolationKind::LeakedLink
            ],
            "{found:?}"
        );
        assert!(found[0].detail.contains("192.0.2.150/32"));
        assert!(leftovers("node-a", &addrs[..3], &own, "", &links[..2]).is_empty());
    }

    /// The printed rerun command replays the run: every option that changes the schedule
    /// or what runs (found by the new-user trial: `--faults` and `--nft-fence` were left
    /// out, so the command ran a different schedule).
    #[test]
    fn the_rerun_command_carries_the_options_of_the_run() {
        let o = Options::parse(&["--minutes", "2"]).unwrap();
        assert_eq!(
            rerun_command(&o, 711036458),
            "cargo xtask chaos --minutes 2 --seed 711036458"
        );
        let o = Options::parse(&[
            "--minutes",
            "3",
            "--faults",
            "services,stop",
            "--nft-fence",
            "--services",
            "10",
            "--nodes",
            "2",
        ])
        .unwrap();
        let c = rerun_command(&o, 5);
        assert_eq!(
            c,
            "cargo xtask chaos --minutes 3 --seed 5 --faults stop,services --services 10 --nodes 2 --nft-fence"
        );
        let args: Vec<&str> = c.split(' ').skip(3).collect();
        let again = Options::parse(&args).unwrap();
        assert_eq!(
            (again.faults, again.nft_fence, again.services, again.nodes),
            (o.faults, true, 10, 2)
        );
    }

    #[test]
    fn options_parse_and_name_bad_values() {
        assert!(
            Options::parse(&["--minutes", "1", "--nft-fence"])
                .unwrap()
                .nft_fence
        );
        let o = Options::parse(&["--minutes", "2"]).unwrap();
        assert!(!o.nft_fence);
        assert_eq!(o.minutes, 2.0);
        assert_eq!(o.services, DEFAULT_SERVICES);
        assert_eq!(o.nodes, 3);
        assert!(o.build && !o.orphan_leases_warn && o.seed.is_none());
        let o = Options::parse(&[
            "--minutes",
            "0.5",
            "--seed",
            "42",
            "--services",
            "10",
            "--nodes",
            "2",
            "--no-build",
            "--orphan-leases-warn",
        ])
        .unwrap();
        assert_eq!((o.seed, o.services, o.nodes), (Some(42), 10, 2));
        assert!(!o.build && o.orphan_leases_warn);
        let o = Options::parse(&["--minutes", "1", "--faults", "stop, kill,services"]).unwrap();
        assert_eq!(
            o.faults,
            Some([FaultKind::Stop, FaultKind::Kill, FaultKind::SvcCreate].into())
        );
        for (args, needle) in [
            (vec![], "--minutes is required"),
            (vec!["--minutes", "0"], "--minutes"),
            (vec!["--minutes", "x"], "\"x\""),
            (vec!["--minutes", "1", "--services", "61"], "--services: 61"),
            (vec!["--minutes", "1", "--nodes", "4"], "--nodes: 4"),
            (vec!["--minutes", "1", "--seed", "-3"], "--seed: \"-3\""),
            (vec!["--minutes", "1", "--bogus"], "\"--bogus\""),
            (vec!["--minutes", "1", "--faults", "stop,nap"], "\"nap\""),
            (vec!["--minutes", "1", "--faults", ","], "--faults: empty"),
        ] {
            let e = Options::parse(&args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn canary_needs_both_two_macs_and_stale_answer() {
        let x = |kind, addr: Ipv4Addr| v(kind, format!("{addr} (-) something; more"));
        let found = vec![
            x(ViolationKind::TwoMacs, CANARY_ADDR),
            x(ViolationKind::StaleAnswer, CANARY_ADDR),
            x(ViolationKind::Unanswered, A),
        ];
        let (canary, rest) = split_canary(found);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].kind, ViolationKind::Unanswered);
        let msg = canary_verdict(&canary).unwrap();
        assert!(msg.contains("192.0.2.250 (-) something"), "{msg}");
        assert!(canary_verdict(&canary[..1]).is_err());
        assert!(canary_verdict(&[]).is_err());
        assert!(
            CANARY_ADDR > POOL_LAST,
            "the canary is never a Service address"
        );
    }

    #[test]
    fn pool_stays_inside_the_lab_subnet_and_off_the_broadcast() {
        assert_eq!(pool_address(0), Some(POOL_FIRST));
        assert_eq!(pool_address(99), Some(POOL_LAST));
        assert_eq!(pool_address(100), None);
        assert_eq!(answer_bound(), Duration::from_millis(4500));
    }
}
