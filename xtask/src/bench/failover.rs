//! `cargo xtask bench failover`: measures control-plane VIP failover in the lab, for vipd
//! and for keepalived (VRRP: `keepalived`, VRRPv2 `advert_int 1`, and `keepalived-fast`, VRRPv3
//! `advert_int 0.1`), and prints p50/p95/max client-visible gaps and the time two
//! hosts answered ARP for the VIP at once.
//!
//! ```text
//! cargo xtask bench failover [--scenario graceful,kill,freeze,poweroff,partition,drain|all]
//!     [--trials N] [--impl vipd|keepalived|keepalived-fast|both] [--timings default,5/3/1,...]
//!     [--no-build] [--vipd PATH] [--json FILE] [--no-idle]
//!     [--lb | --service | --ride | --cp-and-service] [-v]
//! ```
//!
//! One lab ([`Lab::start`], HTTP backends on every node answering their node name) is shared
//! by every trial of a run. A trial:
//!
//! 1. cleans up (deletes the Lease `kube-system/plndr-cp-lock`, checks no node carries
//!    192.0.2.10) and starts one instance per node (vipd in control-plane mode, or one
//!    keepalived per node, [`keepalived_conf`]);
//! 2. waits until exactly one node carries the VIP and the client reaches it, then starts
//!    `vipd probe http://192.0.2.10/ --interval 20ms --json` in ns `client` and an
//!    [`xtask::lab::ArpWatcher`] (ARP request every 20 ms) in ns `api`, so the watcher's
//!    replies never touch the client's neighbour cache; waits until the probe answers
//!    steadily;
//! 3. waits `(trial - 1) mod 5` fifths of a second (so the trials sample the holder's 1 s
//!    renew cycle evenly), acts on the holder ([`Scenario`]) and polls, every ~20 ms, which nodes carry the VIP
//!    until another node does;
//! 4. lets things settle (2 s; for `freeze`: 3 s, SIGCONT, then 4 s watching that the
//!    thawed node neither carries nor answers for the VIP again), stops the probe and the
//!    watcher, heals the lab and stops every instance.
//!
//! Figures per trial: the probe's longest gap between two successful answers (ms), the time
//! from the event until another node carries the VIP (kernel view, ms), and the time during
//! which two or more MACs answered ARP for the VIP (number of 20 ms slots with two
//! responders x 20 ms). Before the scenarios, an idle phase per vipd timing reads VmRSS of
//! the leading and a following vipd after 10 s and counts Lease writes over 10 s with a
//! watch.
//!
//! `--cp-and-service` (vipd only; issue 16: kube-vip users reported 9 s for this case) moves
//! two VIPs held by one node: the control-plane VIP 192.0.2.10 (Lease
//! `kube-system/plndr-cp-lock`) and the LoadBalancer Service `default/failover`'s VIP
//! [`SERVICE_VIP`] 192.0.2.20 under the global Services Lease `kube-system/plndr-svcs-lock`
//! (`svc_election=false`, kube-vip's default), `svc_*` timings equal to the `vip_*` ones. A
//! trial deletes both Leases, starts vipd on one node first (node-a, -b, -c in turn), waits
//! until that node carries both VIPs and the client reaches both, then starts the other two
//! and waits until they follow both Leases; it runs one probe and one ARP watcher per VIP,
//! acts on the holder as above and polls until another node carries each VIP. Each trial
//! gives one result per VIP (`vipd T cp+svc:cp`, `vipd T cp+svc:svc`) in the usual tables,
//! and a pair table: the slower VIP's gap (both back), the spread between the two
//! takeovers and whether both VIPs moved to the same node.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::args::parse_flags;
use serde::{Deserialize, Serialize};
use xtask::lab::{
    self, ArpWatcher, Lab, LabOptions, LabProcess, MacAddr, NODES, Signal, WatchReport,
};

use super::stats::{ms, percentile};

/// The control-plane VIP every trial moves (192.0.2.10).
pub const VIP: Ipv4Addr = lab::CONTROL_PLANE_VIP;
/// The Service of `--service` / `--ride` (its VIP is [`VIP`]) and of `--cp-and-service`
/// (its VIP is [`SERVICE_VIP`]).
pub const SERVICE_NAME: &str = "failover";
/// The Service VIP of `--cp-and-service` (192.0.2.20), next to the control-plane VIP.
pub const SERVICE_VIP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
/// Name of the Lease all Services share without `svc_election` (vipd's and kube-vip's
/// default `svc_leasename`), in [`LEASE_NAMESPACE`].
pub const SERVICES_LEASE_NAME: &str = "plndr-svcs-lock";
/// Namespace of vipd's control-plane Lease.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// Name of vipd's (and kube-vip's) control-plane Lease.
pub const LEASE_NAME: &str = "plndr-cp-lock";
/// Interval of `vipd probe` requests and of the ARP watcher's requests (20 ms).
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(20);
/// How long the idle phase waits before reading RSS, and how long it counts Lease writes.
pub const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// Trial n waits `((n - 1) mod 5) / 5` of this before the event (1 s: the retry period and
/// keepalived's VRRP advert interval; keepalived-fast's 0.1 s adverts repeat ten times in
/// it), so five trials sample the renew cycle evenly.
pub const PHASE_SPREAD: Duration = Duration::from_secs(1);
/// keepalived binary (Debian package `keepalived`).
pub const KEEPALIVED: &str = "/usr/sbin/keepalived";

const USAGE: &str = "usage: cargo xtask bench failover [options]

options:
  --scenario LIST   comma list of graceful,kill,freeze,poweroff,partition,drain or `all`
                    (default all; drain: vipd only)
  --trials N        trials per scenario and implementation (default 5)
  --impl WHICH      vipd | keepalived | keepalived-fast | both (default both);
                    keepalived runs two rows: `keepalived` (VRRPv2, advert_int 1) and
                    `keepalived-fast` (VRRPv3, advert_int 0.1); keepalived-fast runs only
                    the latter; both = vipd and the two keepalived rows
  --timings LIST    vipd lease timings, comma list of `default` (vipd's built-in defaults,
                    vip_lease* unset) or LEASE/RENEW/RETRY seconds, e.g. 5/3/1 or 2.5/2/1
                    (default: default,5/3/1)
  --no-build        do not run `cargo build --release -p vipd` first
  --vipd PATH       vipd binary to use (default target/release/vipd)
  --json FILE       also write every trial's figures as JSON to FILE
  --no-idle         skip the idle RSS / lease-write measurement
  --lb              vipd with lb_enable: the probe opens TCP connections to VIP:6443 (the
                    control-plane load balancer's frontend) instead of HTTP to VIP:80;
                    control-plane Node objects are created for the backends (vipd only)
  --service         the VIP is a LoadBalancer Service's (192.0.2.10, per-Service lease
                    default/kubevip-failover; vipd in Services mode, timings as svc_*;
                    vipd only, no idle phase)
  --ride            --service with svc_ridethrough (Node objects and the key Secret
                    created; the option's peer protocol runs on eth0)
  --cp-and-service  one node holds two VIPs before the event: the control-plane VIP
                    192.0.2.10 and a LoadBalancer Service's 192.0.2.20 (global Services
                    lease kube-system/plndr-svcs-lock, svc_election=false, svc_* timings
                    = vip_* timings); one probe and ARP watcher per VIP, figures per VIP
                    (`vipd T cp+svc:cp`, `vipd T cp+svc:svc`) and per pair (vipd only, no
                    idle phase; not with --lb, --service or --ride)
  -v, --verbose     print progress of every trial";

/// What is done to the VIP holder in a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// SIGTERM to the holder (keepalived: to its parent process).
    Graceful,
    /// SIGKILL to the holder (keepalived: to the parent and its VRRP child at once, as a
    /// crashed node).
    Kill,
    /// SIGSTOP to the holder's processes; SIGCONT 3 s after the takeover, then 4 s checking
    /// the thawed node does not answer for the VIP again.
    Freeze,
    /// SIGKILL plus the holder's link cut (no carrier) at the same instant.
    Poweroff,
    /// The holder cut off from everything (switch port detached, carrier kept).
    Partition,
    /// `vipd drain` on the holder (maintenance hand-over; vipd only: keepalived has no
    /// equivalent, its trials are skipped).
    Drain,
}

impl Scenario {
    /// Every scenario, in the order they run.
    pub const ALL: [Scenario; 6] = [
        Scenario::Graceful,
        Scenario::Kill,
        Scenario::Freeze,
        Scenario::Poweroff,
        Scenario::Partition,
        Scenario::Drain,
    ];

    /// The command-line name (`graceful`, `kill`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Graceful => "graceful",
            Scenario::Kill => "kill",
            Scenario::Freeze => "freeze",
            Scenario::Poweroff => "poweroff",
            Scenario::Partition => "partition",
            Scenario::Drain => "drain",
        }
    }

    /// Parses a command-line name.
    ///
    /// # Errors
    /// Names the value and the accepted names when it is none of them.
    pub fn parse(s: &str) -> Result<Scenario> {
        Scenario::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                anyhow!(
                    "invalid --scenario value {s:?}: expected graceful, kill, freeze, poweroff, partition, drain or all"
                )
            })
    }
}

/// vipd lease timings of a run: `None` = vipd's defaults (the `vip_lease*` variables
/// unset), else (lease duration, renew deadline, retry period) in seconds as given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// `default`, `fast` or `LEASE/RENEW/RETRY[+nft]`, as printed.
    pub label: String,
    /// `vip_leaseduration`, `vip_renewdeadline`, `vip_retryperiod` values (seconds).
    pub values: Option<[String; 3]>,
    /// Run with the nftables fence (`vip_nftfence=true`), which sub-second timings need.
    #[serde(default)]
    pub nft_fence: bool,
}

/// The `fast` profile (docs/failover.md): lease 0.6 s, renew deadline 0.4 s, retry 0.2 s
/// (5 Lease writes/s), with the millisecond nftables fence.
pub const FAST_PROFILE: &str = "0.6/0.4/0.2+nft";

impl Timings {
    /// Parses `default`, `fast` ([`FAST_PROFILE`]) or `LEASE/RENEW/RETRY` (positive decimal
    /// seconds, lease > renew > retry), optionally followed by `+nft` (the nftables fence).
    ///
    /// # Errors
    /// Names the value and what is wrong with it.
    pub fn parse(s: &str) -> Result<Timings> {
        if s == "default" {
            return Ok(Timings {
                label: s.to_string(),
                values: None,
                nft_fence: false,
            });
        }
        if s == "fast" {
            return Ok(Timings {
                label: s.to_string(),
                ..Timings::parse(FAST_PROFILE)?
            });
        }
        let (body, nft_fence) = match s.strip_suffix("+nft") {
            Some(b) => (b, true),
            None => (s, false),
        };
        let parts: Vec<&str> = body.split('/').collect();
        let [l, r, p] = parts.as_slice() else {
            bail!(
                "invalid --timings value {s:?}: expected `default`, `fast` or LEASE/RENEW/RETRY seconds, e.g. 5/3/1 (add +nft for the nftables fence)"
            );
        };
        let num = |x: &str| -> Result<f64> {
            x.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| {
                    anyhow!(
                        "invalid --timings value {s:?}: {x:?} is not a positive number of seconds"
                    )
                })
        };
        let (lv, rv, pv) = (num(l)?, num(r)?, num(p)?);
        if !(lv > rv && rv > pv) {
            bail!("invalid --timings value {s:?}: need lease > renew deadline > retry period");
        }
        Ok(Timings {
            label: s.to_string(),
            values: Some([l.to_string(), r.to_string(), p.to_string()]),
            nft_fence,
        })
    }
}

/// A keepalived variant of the bench: the VRRP version and advertisement interval of
/// [`keepalived_conf`] (everything else is the same recipe). Only the constants exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vrrp {
    label: &'static str,
    version: u8,
    /// Advertisement interval in centiseconds (VRRPv3's unit, RFC 5798 §5.2.7; VRRPv2
    /// only knows whole seconds, RFC 3768 §5.3.7).
    advert_cs: u16,
}

impl Vrrp {
    /// `keepalived`: VRRPv2 (keepalived's default), `advert_int 1`.
    pub const CLASSIC: Vrrp = Vrrp {
        label: "keepalived",
        version: 2,
        advert_cs: 100,
    };
    /// `keepalived-fast`: VRRPv3, `advert_int 0.1` (keepalived's sub-second adverts need
    /// VRRPv3).
    pub const FAST: Vrrp = Vrrp {
        label: "keepalived-fast",
        version: 3,
        advert_cs: 10,
    };
    /// Both variants, in the order they run.
    pub const ALL: [Vrrp; 2] = [Vrrp::CLASSIC, Vrrp::FAST];

    /// Label in tables and JSON: `keepalived` or `keepalived-fast`.
    pub fn label(self) -> &'static str {
        self.label
    }

    /// VRRP version (`vrrp_version` in global_defs): 2 or 3.
    pub fn version(self) -> u8 {
        self.version
    }

    /// Advertisement interval (`advert_int`).
    pub fn advert(self) -> Duration {
        Duration::from_millis(u64::from(self.advert_cs) * 10)
    }

    /// Master-down interval of a BACKUP with priority 100: 3 x advert + skew, skew =
    /// (256 - priority) / 256 x advert (RFC 5798 §6.1; RFC 3768 §6.1 with the advert in
    /// whole seconds gives the same). 3.61 s for `keepalived`, 0.36 s for `keepalived-fast`.
    pub fn master_down(self) -> Duration {
        self.advert().mul_f64(3.0 + (256.0 - 100.0) / 256.0)
    }
}

/// What runs on the nodes.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// vipd in control-plane mode with these timings.
    Vipd(Timings),
    /// keepalived with this VRRP variant, see [`keepalived_conf`].
    Keepalived(Vrrp),
}

impl Subject {
    /// Label in tables: `vipd default`, `vipd 5/3/1`, `keepalived`, `keepalived-fast`.
    pub fn label(&self) -> String {
        match self {
            Subject::Vipd(t) => format!("vipd {}", t.label),
            Subject::Keepalived(v) => v.label().into(),
        }
    }
}

/// Parsed options of `bench failover`.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Scenarios to run, in order.
    pub scenarios: Vec<Scenario>,
    /// Trials per scenario and subject.
    pub trials: usize,
    /// Run vipd.
    pub vipd: bool,
    /// keepalived variants to run, in order.
    pub keepalived: Vec<Vrrp>,
    /// vipd timings to run.
    pub timings: Vec<Timings>,
    /// Build vipd in release mode first.
    pub build: bool,
    /// Explicit vipd binary.
    pub vipd_path: Option<PathBuf>,
    /// Where to write the JSON results.
    pub json: Option<PathBuf>,
    /// Measure idle RSS and Lease writes.
    pub idle: bool,
    /// Print progress.
    pub verbose: bool,
    /// vipd with `lb_enable` (control-plane load balancing): the probe opens TCP connections
    /// to VIP:6443, which the holder spreads over the nodes' API endpoints.
    pub lb: bool,
    /// The VIP is a Service's: `Some(ride)`, with `svc_ridethrough` when `ride`.
    pub service: Option<bool>,
    /// One node holds the control-plane VIP and a Service VIP ([`SERVICE_VIP`]) before the
    /// event (`--cp-and-service`).
    pub cp_and_service: bool,
}

impl BenchOptions {
    /// Parses the arguments after `bench failover`.
    ///
    /// # Errors
    /// Names the flag and value that are invalid.
    pub fn parse(args: &[&str]) -> Result<BenchOptions> {
        let mut o = BenchOptions {
            scenarios: Scenario::ALL.to_vec(),
            trials: 5,
            vipd: true,
            keepalived: Vrrp::ALL.to_vec(),
            timings: vec![Timings::parse("default")?, Timings::parse("5/3/1")?],
            build: true,
            vipd_path: None,
            json: None,
            idle: true,
            verbose: false,
            lb: false,
            service: None,
            cp_and_service: false,
        };
        parse_flags(args, USAGE, |a, value| {
            match a {
                "--scenario" | "--scenarios" => {
                    let v = value()?;
                    o.scenarios = if v == "all" {
                        Scenario::ALL.to_vec()
                    } else {
                        v.split(',').map(Scenario::parse).collect::<Result<_>>()?
                    };
                }
                "--trials" => {
                    let v = value()?;
                    o.trials = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        anyhow!("invalid --trials value {v:?}: expected a positive integer")
                    })?;
                }
                "--impl" => {
                    let v = value()?;
                    (o.vipd, o.keepalived) = match v {
                        "vipd" => (true, Vec::new()),
                        "keepalived" => (false, Vrrp::ALL.to_vec()),
                        "keepalived-fast" => (false, vec![Vrrp::FAST]),
                        "both" => (true, Vrrp::ALL.to_vec()),
                        _ => bail!(
                            "invalid --impl value {v:?}: expected vipd, keepalived, keepalived-fast or both"
                        ),
                    };
                }
                "--timings" => {
                    o.timings = value()?
                        .split(',')
                        .map(Timings::parse)
                        .collect::<Result<_>>()?;
                }
                "--no-build" => o.build = false,
                "--vipd" => o.vipd_path = Some(PathBuf::from(value()?)),
                "--json" => o.json = Some(PathBuf::from(value()?)),
                "--no-idle" => o.idle = false,
                "--lb" => o.lb = true,
                "--service" => o.service = Some(o.service.unwrap_or(false)),
                "--ride" => o.service = Some(true),
                "--cp-and-service" => o.cp_and_service = true,
                "-v" | "--verbose" => o.verbose = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        if o.cp_and_service {
            let other = [
                (o.service == Some(false), "--service"),
                (o.service == Some(true), "--ride"),
                (o.lb, "--lb"),
            ];
            if let Some((_, flag)) = other.iter().find(|(set, _)| *set) {
                bail!(
                    "--cp-and-service cannot be combined with {flag}: it runs the control-plane VIP and a Service VIP (192.0.2.20) side by side, with HTTP probes"
                );
            }
            if !o.vipd {
                bail!("--cp-and-service measures vipd only: use --impl vipd (or both)");
            }
        }
        Ok(o)
    }

    fn subjects(&self) -> Vec<Subject> {
        let mut s = Vec::new();
        if self.vipd {
            let suffix = match self.service {
                None if self.cp_and_service => " cp+svc",
                None => "",
                Some(false) => " svc",
                Some(true) => " svc+ride",
            };
            s.extend(self.timings.iter().cloned().map(|t| {
                Subject::Vipd(Timings {
                    label: format!("{}{suffix}", t.label),
                    ..t
                })
            }));
        }
        if self.service.is_none() && !self.cp_and_service {
            s.extend(self.keepalived.iter().copied().map(Subject::Keepalived));
        }
        s
    }
}

/// Figures of one trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialResult {
    /// The scenario.
    pub scenario: Scenario,
    /// [`Subject::label`].
    pub subject: String,
    /// Trial number, from 1.
    pub trial: usize,
    /// Node that held the VIP before the event.
    pub holder: String,
    /// Node that carried it after the event, if any did within the time limit.
    pub new_holder: Option<String>,
    /// The probe's longest gap between two successful answers, ms (an open gap at the end
    /// counts up to the end of the probe). `None` if the probe got fewer than two answers.
    pub gap_ms: Option<f64>,
    /// From the event until another node carried the VIP (kernel view), ms.
    pub takeover_ms: Option<f64>,
    /// From the event until the old holder no longer carried the VIP, ms.
    pub old_gone_ms: Option<f64>,
    /// Time with two or more ARP responders for the VIP, ms (slots x 20 ms).
    pub two_responders_ms: f64,
    /// MACs seen answering together, as `node-a+node-b`.
    pub two_responder_nodes: Vec<String>,
    /// Backend switches the probe saw.
    pub switches: u64,
    /// Probe failures.
    pub probe_failures: u64,
    /// Probe requests with a known outcome.
    pub probe_requests: u64,
    /// The probe's backend switches, as `from->to at MS ms (gap MS ms)`.
    pub probe_switches: Vec<String>,
    /// Whether the probe's last answers came from a node (false: an open gap at the end).
    pub recovered: bool,
    /// freeze only: the thawed node carried or answered for the VIP again.
    pub came_back: Option<bool>,
    /// Anything worth a look.
    pub notes: Vec<String>,
}

/// Idle figures of one subject.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdleResult {
    /// [`Subject::label`].
    pub subject: String,
    /// VmRSS of the leading vipd after [`IDLE_WINDOW`], KiB.
    pub leader_rss_kib: Option<u64>,
    /// Largest VmRSS of a following vipd after [`IDLE_WINDOW`], KiB.
    pub follower_rss_kib: Option<u64>,
    /// Lease writes (watch events) per second over [`IDLE_WINDOW`].
    pub lease_writes_per_s: Option<f64>,
}

/// Both VIPs of one `--cp-and-service` trial, from its two [`TrialResult`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairResult {
    /// The scenario.
    pub scenario: Scenario,
    /// [`Subject::label`] (`vipd T cp+svc`).
    pub subject: String,
    /// Trial number, from 1.
    pub trial: usize,
    /// Node that held both VIPs before the event.
    pub holder: String,
    /// Node that carried the control-plane VIP after the event.
    pub cp_new_holder: Option<String>,
    /// Node that carried the Service VIP after the event.
    pub svc_new_holder: Option<String>,
    /// Both VIPs moved to the same node.
    pub same_node: bool,
    /// The larger of the two VIPs' gaps: until both answered again, ms (`None` if a probe
    /// had fewer than two answers).
    pub both_gap_ms: Option<f64>,
    /// The Service VIP's takeover minus the control-plane VIP's, ms (`None` if either did
    /// not move).
    pub takeover_spread_ms: Option<f64>,
}

impl PairResult {
    /// The pair of `cp` and `svc` (the two results of one trial, in [`Ctx::vips`] order).
    pub fn of(subject: &str, cp: &TrialResult, svc: &TrialResult) -> PairResult {
        PairResult {
            scenario: cp.scenario,
            subject: subject.to_string(),
            trial: cp.trial,
            holder: cp.holder.clone(),
            cp_new_holder: cp.new_holder.clone(),
            svc_new_holder: svc.new_holder.clone(),
            same_node: cp.new_holder.is_some() && cp.new_holder == svc.new_holder,
            both_gap_ms: cp.gap_ms.zip(svc.gap_ms).map(|(a, b)| a.max(b)),
            takeover_spread_ms: svc.takeover_ms.zip(cp.takeover_ms).map(|(s, c)| s - c),
        }
    }
}

/// Everything a run measured (the `--json` output).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BenchReport {
    /// Every trial (with `--cp-and-service` one per VIP and trial).
    pub trials: Vec<TrialResult>,
    /// Idle figures per vipd timing.
    pub idle: Vec<IdleResult>,
    /// `--cp-and-service`: both VIPs of each trial.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<PairResult>,
}

/// `cargo xtask bench ARGS...`.
///
/// # Errors
/// Bad arguments, not root, a lab that cannot start, or a trial that cannot be set up.
pub fn run(args: &[&str]) -> Result<()> {
    match args {
        ["failover", rest @ ..] => failover(&BenchOptions::parse(rest)?),
        _ => bail!("{USAGE}"),
    }
}

fn failover(o: &BenchOptions) -> Result<()> {
    if nix::unistd::geteuid().as_raw() != 0 {
        bail!("`cargo xtask bench` needs root (network namespaces); run it with sudo -E");
    }
    let subjects = o.subjects();
    if subjects.iter().any(|s| matches!(s, Subject::Keepalived(_)))
        && !Path::new(KEEPALIVED).is_file()
    {
        bail!("{KEEPALIVED} not found: apt-get install keepalived (or use --impl vipd)");
    }
    let vipd = vipd_release_binary(o.build, o.vipd_path.as_deref())?;
    let started = Instant::now();
    let mut ctx = Ctx::start(vipd, o.verbose)?;
    if o.lb {
        ctx.enable_lb()?;
    }
    if let Some(ride) = o.service {
        ctx.enable_service(ride)?;
    }
    if o.cp_and_service {
        ctx.enable_cp_and_service()?;
    }
    println!(
        "lab {} up in {:.1} s; vipd {}",
        ctx.lab.prefix(),
        started.elapsed().as_secs_f64(),
        ctx.vipd.display()
    );
    let mut report = BenchReport::default();
    if o.idle && o.vipd && o.service.is_none() && !o.cp_and_service {
        for t in &o.timings {
            let subject = Subject::Vipd(t.clone());
            match idle(&ctx, &subject) {
                Ok(r) => {
                    println!("{}", idle_line(&r));
                    report.idle.push(r);
                }
                Err(e) => println!("idle {}: failed: {e:#}", subject.label()),
            }
        }
    }
    for scenario in &o.scenarios {
        for subject in &subjects {
            if (*scenario == Scenario::Drain || o.lb) && matches!(subject, Subject::Keepalived(_)) {
                continue;
            }
            for trial in 1..=o.trials {
                match run_trial_per_vip(&ctx, *scenario, subject, trial) {
                    Ok(rs) => {
                        for r in &rs {
                            println!("{}", trial_line(r));
                        }
                        if let [cp, svc] = rs.as_slice() {
                            let p = PairResult::of(&subject.label(), cp, svc);
                            println!("{}", pair_line(&p));
                            report.pairs.push(p);
                        }
                        report.trials.extend(rs);
                    }
                    Err(e) => {
                        println!(
                            "{:<9} {:<16} #{trial}: trial failed: {e:#}",
                            scenario.name(),
                            subject.label()
                        );
                    }
                }
            }
        }
    }
    println!();
    print!("{}", summary_table(&report));
    print!("{}", pair_table(&report));
    print!("{}", ratio_table(&report));
    if !report.idle.is_empty() {
        println!("\nidle (after {} s):", IDLE_WINDOW.as_secs());
        for r in &report.idle {
            println!("  {}", idle_line(r));
        }
    }
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
        println!("\nper-trial figures written to {}", path.display());
    }
    println!(
        "\nbench finished in {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

/// Builds vipd in release mode (unless `build` is false) and returns its path: `explicit`,
/// else `<target>/release/vipd`.
///
/// # Errors
/// When cargo fails or the binary is missing.
pub fn vipd_release_binary(build: bool, explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if !p.is_file() {
            bail!("--vipd {}: no such file", p.display());
        }
        return Ok(p.to_path_buf());
    }
    release_artifact(build, &[], "vipd")
}

/// Runs `cargo build --release -p vipd EXTRA...` (unless `build` is false) and returns
/// `<target>/release/<path>` (e.g. `vipd`, or `examples/peer_sim` with `--example
/// peer_sim`).
///
/// # Errors
/// When cargo fails or the file is missing (the message names the command to run).
pub fn release_artifact(build: bool, extra: &[&str], path: &str) -> Result<PathBuf> {
    let mut args = vec!["build", "--release", "-p", "vipd"];
    args.extend_from_slice(extra);
    let cmd = format!("cargo {}", args.join(" "));
    if build {
        let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        c.current_dir(lab::control_plane::workspace_root())
            .args(&args);
        eprintln!("==> {c:?}");
        let st = c.status().with_context(|| format!("run {cmd}"))?;
        if !st.success() {
            bail!("{cmd} failed ({st})");
        }
    }
    let p = lab::control_plane::target_dir().join("release").join(path);
    if !p.is_file() {
        bail!(
            "{} not found: run `{cmd}` (or drop --no-build)",
            p.display()
        );
    }
    Ok(p)
}

/// A running lab with HTTP backends and the vipd binary to use.
pub struct Ctx {
    /// The lab.
    pub lab: Lab,
    /// vipd binary (manager and probe).
    pub vipd: PathBuf,
    /// Print progress.
    pub verbose: bool,
    macs: HashMap<MacAddr, String>,
    /// vipd runs with `lb_enable`, the probe targets VIP:6443 over TCP ([`Ctx::enable_lb`]).
    pub lb: bool,
    /// The VIP is a Service's, `Some(ride)` ([`Ctx::enable_service`]).
    pub service: Option<bool>,
    /// The control-plane VIP and a Service VIP on one node
    /// ([`Ctx::enable_cp_and_service`]).
    pub cp_and_service: bool,
}

impl Ctx {
    /// Starts a lab with HTTP backends on every node.
    ///
    /// # Errors
    /// When the lab cannot start.
    pub fn start(vipd: PathBuf, verbose: bool) -> Result<Ctx> {
        let lab = Lab::start(LabOptions {
            http_backends: true,
            ..LabOptions::default()
        })?;
        let mut macs = HashMap::new();
        for n in NODES {
            macs.insert(lab.mac_of(n)?, n.to_string());
        }
        Ok(Ctx {
            lab,
            vipd,
            verbose,
            macs,
            lb: false,
            service: None,
            cp_and_service: false,
        })
    }

    /// The VIP becomes a LoadBalancer Service's for the rest of the run: Node objects for
    /// the lab nodes (the peer membership), with `ride` the key Secret `vipd-peer-key`, and
    /// the Service [`SERVICE_NAME`] at 192.0.2.10; vipd runs in Services mode
    /// ([`start_vipd`]).
    ///
    /// # Errors
    /// When an object cannot be created.
    pub fn enable_service(&mut self, ride: bool) -> Result<()> {
        self.create_service_objects(ride, VIP)?;
        self.service = Some(ride);
        Ok(())
    }

    /// The control-plane VIP and a Service VIP held together for the rest of the run: Node
    /// objects for the lab nodes and the Service [`SERVICE_NAME`] at [`SERVICE_VIP`]; vipd
    /// runs with `cp_enable` and `svc_enable` under the global Services Lease
    /// ([`start_vipd`]).
    ///
    /// # Errors
    /// When an object cannot be created.
    pub fn enable_cp_and_service(&mut self) -> Result<()> {
        self.create_service_objects(false, SERVICE_VIP)?;
        self.cp_and_service = true;
        Ok(())
    }

    /// Node objects for the lab nodes, with `ride` the key Secret `vipd-peer-key`, and the
    /// LoadBalancer Service [`SERVICE_NAME`] at `addr`.
    fn create_service_objects(&self, ride: bool, addr: Ipv4Addr) -> Result<()> {
        let create = |path: &str, body: serde_json::Value, what: &str| {
            super::create(&self.lab, path, &body, what)
        };
        for n in NODES {
            create(
                "/api/v1/nodes",
                serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
                n,
            )?;
        }
        if ride {
            create(
                "/api/v1/namespaces/kube-system/secrets",
                serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "vipd-peer-key", "namespace": "kube-system"},
                    "stringData": {"key": "ZmFpbG92ZXItYmVuY2gta2V5LWF0LWxlYXN0LTMyLWJ5dGVz"}}),
                "Secret vipd-peer-key",
            )?;
        }
        create(
            "/api/v1/namespaces/default/services",
            super::services::service_json(SERVICE_NAME, IpAddr::V4(addr)),
            "Service",
        )
    }

    /// The VIPs a trial moves, each with its tag in result labels: `[(VIP, "")]`, or with
    /// `--cp-and-service` `[(VIP, "cp"), (SERVICE_VIP, "svc")]`.
    pub fn vips(&self) -> Vec<(Ipv4Addr, &'static str)> {
        if self.cp_and_service {
            vec![(VIP, "cp"), (SERVICE_VIP, "svc")]
        } else {
            vec![(VIP, "")]
        }
    }

    /// API paths of the Leases a trial deletes first: the control-plane Lease, the
    /// Service's own Lease with `--service`, both the control-plane and the global
    /// Services Lease with `--cp-and-service`.
    pub fn lease_paths(&self) -> Vec<String> {
        if self.service.is_some() {
            return vec![format!(
                "/apis/coordination.k8s.io/v1/namespaces/default/leases/kubevip-{SERVICE_NAME}"
            )];
        }
        let mut v = vec![lease_path()];
        if self.cp_and_service {
            v.push(format!(
                "/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{SERVICES_LEASE_NAME}"
            ));
        }
        v
    }

    /// Control-plane load balancing for the rest of the run: Node objects for every lab
    /// node (control-plane role label, Ready, InternalIP = its lab address) as the backends,
    /// `lb_enable=true` for vipd, and a TCP probe of VIP:6443.
    ///
    /// # Errors
    /// When a Node cannot be created.
    pub fn enable_lb(&mut self) -> Result<()> {
        for n in NODES {
            let ip = lab::node_ipv4(n).ok_or_else(|| anyhow!("no address for {n}"))?;
            self.lab.register_control_plane_node(n, &[ip.into()])?;
        }
        self.lb = true;
        Ok(())
    }

    fn say(&self, what: impl AsRef<str>) {
        if self.verbose {
            eprintln!("    {}", what.as_ref());
        }
    }

    fn node_of(&self, mac: &MacAddr) -> String {
        self.macs
            .get(mac)
            .cloned()
            .unwrap_or_else(|| mac.to_string())
    }

    /// Nodes whose eth0 carries the VIP.
    ///
    /// # Errors
    /// When `ip addr` fails.
    pub fn holders(&self) -> Result<Vec<String>> {
        Ok(self.holders_of(&[VIP])?.pop().unwrap_or_default())
    }

    /// For each of `vips`, the nodes whose eth0 carries it (one `ip addr` per node).
    ///
    /// # Errors
    /// When `ip addr` fails.
    pub fn holders_of(&self, vips: &[Ipv4Addr]) -> Result<Vec<Vec<String>>> {
        let mut out = vec![Vec::new(); vips.len()];
        for n in NODES {
            let addrs = self.lab.addresses(n, lab::ETH)?;
            for (vip, holders) in vips.iter().zip(out.iter_mut()) {
                if addrs.iter().any(|a| a.addr == IpAddr::V4(*vip)) {
                    holders.push(n.to_string());
                }
            }
        }
        Ok(out)
    }

    /// Waits up to `limit` until exactly one node carries the VIP; returns it.
    ///
    /// # Errors
    /// On timeout (naming who carried it last) or when `ip addr` fails.
    pub fn single_holder(&self, limit: Duration) -> Result<String> {
        let t0 = Instant::now();
        loop {
            let h = self.holders()?;
            if let [one] = h.as_slice() {
                return Ok(one.clone());
            }
            if t0.elapsed() > limit {
                bail!("no single holder of {VIP} after {limit:?} (holders: {h:?})");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `limit` until one node has carried every VIP of the run ([`Ctx::vips`])
    /// alone for `stable_for` (keepalived may hand the VIP to its MASTER shortly after a
    /// BACKUP took it); returns that node.
    ///
    /// # Errors
    /// On timeout or when `ip addr` fails.
    pub fn stable_holder(&self, limit: Duration, stable_for: Duration) -> Result<String> {
        let vips: Vec<Ipv4Addr> = self.vips().iter().map(|(v, _)| *v).collect();
        let t0 = Instant::now();
        let mut since: Option<(String, Instant)> = None;
        loop {
            let h = self.holders_of(&vips)?;
            let one = match h.first().map(Vec::as_slice) {
                Some([one]) if h.iter().all(|x| x == std::slice::from_ref(one)) => {
                    Some(one.clone())
                }
                _ => None,
            };
            since = match (one, since) {
                (Some(one), Some((prev, at))) if one == prev => Some((prev, at)),
                (Some(one), _) => Some((one, Instant::now())),
                (None, _) => None,
            };
            if let Some((n, at)) = &since
                && at.elapsed() >= stable_for
            {
                return Ok(n.clone());
            }
            if t0.elapsed() > limit {
                bail!("no stable single holder of {vips:?} after {limit:?} (holders: {h:?})");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Deletes the run's Leases ([`Ctx::lease_paths`]; ignores 404).
    ///
    /// # Errors
    /// When an API call fails.
    pub fn delete_lease(&self) -> Result<()> {
        for path in self.lease_paths() {
            let r = self
                .lab
                .api_request("DELETE", &path, None)
                .with_context(|| format!("delete the lease {path}"))?;
            if !matches!(r.status, 200 | 202 | 404) {
                bail!("DELETE {path}: HTTP {}: {}", r.status, r.body);
            }
        }
        Ok(())
    }

    /// Makes sure no node carries a VIP of the run ([`Ctx::vips`]): waits up to `grace` (a
    /// vipd fence expiring), then removes leftovers by hand and returns the nodes it removed
    /// them from.
    ///
    /// # Errors
    /// When `ip` fails.
    pub fn clear_vip(&self, grace: Duration) -> Result<Vec<String>> {
        let vips: Vec<Ipv4Addr> = self.vips().iter().map(|(v, _)| *v).collect();
        let t0 = Instant::now();
        loop {
            let h = self.holders_of(&vips)?;
            if h.iter().all(Vec::is_empty) {
                return Ok(Vec::new());
            }
            if t0.elapsed() >= grace {
                let mut removed = BTreeSet::new();
                for (vip, nodes) in vips.iter().zip(&h) {
                    for n in nodes {
                        self.lab.exec(
                            n,
                            "ip",
                            &["addr", "del", &format!("{vip}/32"), "dev", lab::ETH],
                        )?;
                        removed.insert(n.clone());
                    }
                }
                return Ok(removed.into_iter().collect());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts `vipd probe http://VIP/ --interval 20ms --timeout 900ms --json` (with `--lb`
    /// `tcp://VIP:6443`) for `vip` in ns client ([`lab::PROBE_TIMEOUT`]).
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn start_probe(&self, vip: Ipv4Addr) -> Result<LabProcess> {
        Ok(self.lab.spawn(
            "client",
            &self.vipd,
            &[
                "probe",
                &if self.lb {
                    format!("tcp://{vip}:6443")
                } else {
                    format!("http://{vip}/")
                },
                "--interval",
                "20ms",
                "--timeout",
                lab::PROBE_TIMEOUT,
                "--json",
            ],
            &[],
        )?)
    }

    /// Starts the ARP watcher for `vip` (every 20 ms) in ns `api`, away from the client's
    /// neighbour cache.
    ///
    /// # Errors
    /// When the socket cannot be opened.
    pub fn start_arp_watch(&self, vip: Ipv4Addr) -> Result<ArpWatcher> {
        Ok(self
            .lab
            .arp_watch_from_api(IpAddr::V4(vip), SAMPLE_INTERVAL)?)
    }
}

fn lease_path() -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{LEASE_NAME}")
}

/// The control-plane Lease as JSON, and its `resourceVersion`.
///
/// # Errors
/// The request fails, answers other than 200, or the Lease has no resourceVersion.
pub(crate) fn get_lease(lab: &Lab) -> Result<(serde_json::Value, String)> {
    let r = lab.api_request("GET", &lease_path(), None)?;
    if r.status != 200 {
        bail!("GET lease: HTTP {}: {}", r.status, r.body);
    }
    let v: serde_json::Value = serde_json::from_str(&r.body)?;
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("lease without resourceVersion"))?
        .to_string();
    Ok((v, rv))
}

/// API path of a watch of the control-plane Lease from `rv`, ended by the server after
/// `timeout_secs`.
pub(crate) fn lease_watch_path(rv: &str, timeout_secs: u64) -> String {
    format!(
        "/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases?watch=1&fieldSelector=metadata.name%3D{LEASE_NAME}&resourceVersion={rv}&timeoutSeconds={timeout_secs}"
    )
}

/// One instance per node of a [`Subject`].
pub struct Cluster {
    procs: Vec<(String, LabProcess)>,
}

impl Cluster {
    /// Starts one instance on every node.
    ///
    /// # Errors
    /// When a process cannot be spawned or a config file written.
    pub fn start(ctx: &Ctx, subject: &Subject) -> Result<Cluster> {
        let mut c = Cluster { procs: Vec::new() };
        for n in NODES {
            c.add(ctx, subject, n)?;
        }
        Ok(c)
    }

    /// Starts an instance on `node` too.
    ///
    /// # Errors
    /// When the process cannot be spawned or a config file written.
    pub fn add(&mut self, ctx: &Ctx, subject: &Subject, node: &str) -> Result<()> {
        let p = match subject {
            Subject::Vipd(t) => start_vipd(ctx, node, t)?,
            Subject::Keepalived(v) => start_keepalived(ctx, node, *v)?,
        };
        self.procs.push((node.to_string(), p));
        Ok(())
    }

    /// The process started on `node`.
    pub fn process(&self, node: &str) -> Option<&LabProcess> {
        self.procs.iter().find(|(n, _)| n == node).map(|(_, p)| p)
    }

    fn process_mut(&mut self, node: &str) -> Option<&mut LabProcess> {
        self.procs
            .iter_mut()
            .find(|(n, _)| n == node)
            .map(|(_, p)| p)
    }

    /// Pids of `node`'s instance: the process and (keepalived) its descendants.
    pub fn pids(&self, node: &str) -> Vec<i32> {
        let Some(p) = self.process(node) else {
            return Vec::new();
        };
        let mut all = vec![p.pid()];
        let mut i = 0;
        while i < all.len() {
            all.extend(children_of(all[i]));
            i += 1;
        }
        all
    }

    /// Sends `sig` to `node`'s main process only.
    ///
    /// # Errors
    /// When kill(2) fails.
    pub fn signal_main(&self, node: &str, sig: Signal) -> Result<()> {
        let p = self
            .process(node)
            .ok_or_else(|| anyhow!("no instance on {node}"))?;
        Ok(p.signal(sig)?)
    }

    /// Sends `sig` to every process of `node`'s instance. For SIGKILL the processes are
    /// first stopped (SIGSTOP) so that none can react to another's death in between (a
    /// keepalived parent respawning its VRRP child).
    ///
    /// # Errors
    /// When no process could be signalled.
    pub fn signal_all(&self, node: &str, sig: Signal) -> Result<()> {
        let pids = self.pids(node);
        if sig == Signal::SIGKILL && pids.len() > 1 {
            for p in &pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), Signal::SIGSTOP);
            }
        }
        let mut ok = false;
        for p in &pids {
            ok |= nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), sig).is_ok();
        }
        if !ok {
            bail!("could not send {sig} to {node}'s processes {pids:?}");
        }
        Ok(())
    }

    /// Stops every instance: SIGCONT, SIGTERM, up to 3 s grace, then SIGKILL for the
    /// process and its descendants.
    pub fn stop(&mut self) {
        let nodes: Vec<String> = self.procs.iter().map(|(n, _)| n.clone()).collect();
        let mut descendants = Vec::new();
        for n in &nodes {
            let pids = self.pids(n);
            for p in &pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), Signal::SIGCONT);
            }
            descendants.extend(pids.into_iter().skip(1));
            if let Some(p) = self.process(n) {
                let _ = p.signal(Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for n in &nodes {
            if let Some(p) = self.process_mut(n) {
                let left = deadline.saturating_duration_since(Instant::now());
                if !matches!(p.wait_timeout(left), Ok(Some(_))) {
                    let _ = p.kill();
                }
            }
        }
        // keepalived children are reparented when the parent dies; make sure they are gone.
        for p in descendants {
            if Path::new(&format!("/proc/{p}")).exists() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Signal::SIGKILL);
            }
        }
    }

    /// Log of `node`'s instance.
    pub fn log(&self, node: &str) -> String {
        self.process(node).map(LabProcess::log).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Direct children of `pid` (from /proc/*/stat field 4).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Starts `vipd manager` in control-plane mode on `node` with kube-vip environment
/// variables (as tests/support/mod.rs does), the timings `t` (nothing set for `default`),
/// the default ARP rate and the metrics server left at its default; after
/// [`Ctx::enable_service`] in Services mode with per-Service leases (timings as `svc_*`,
/// `svc_ridethrough` as asked); after [`Ctx::enable_cp_and_service`] in control-plane mode
/// and Services mode with the global Services Lease (`svc_election=false`) and the
/// timings as both `vip_*` and `svc_*` (kube-vip has no `svc_*` timings: its Services use
/// `vip_*`, as vipd's do when `svc_*` are unset).
///
/// # Errors
/// When it cannot be spawned.
pub fn start_vipd(ctx: &Ctx, node: &str, t: &Timings) -> Result<LabProcess> {
    let kubeconfig = ctx.lab.kubeconfig(node)?.to_string_lossy().into_owned();
    if let Some(ride) = ctx.service {
        let mut env: Vec<(&str, &str)> = vec![
            ("vip_arp", "true"),
            ("cp_enable", "false"),
            ("svc_enable", "true"),
            ("svc_election", "true"),
            ("address", ""),
            ("vip_interface", lab::ETH),
            ("vip_nodename", node),
            ("k8s_config_file", &kubeconfig),
            ("vip_loglevel", "info"),
            ("svc_ridethrough", if ride { "true" } else { "false" }),
        ];
        env.extend(lease_env(SVC_TIMING_ENV, t));
        if t.nft_fence {
            env.push(("vip_nftfence", "true"));
        }
        return Ok(ctx.lab.spawn(node, &ctx.vipd, &["manager"], &env)?);
    }
    let vip = VIP.to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("vip_arp", "true"),
        ("cp_enable", "true"),
        ("vip_leaderelection", "true"),
        ("address", &vip),
        ("vip_interface", lab::ETH),
        ("vip_nodename", node),
        ("k8s_config_file", &kubeconfig),
        ("vip_loglevel", "info"),
    ];
    env.extend(lease_env(VIP_TIMING_ENV, t));
    if t.nft_fence {
        env.push(("vip_nftfence", "true"));
    }
    if ctx.lb {
        env.push(("lb_enable", "true"));
    }
    if ctx.cp_and_service {
        env.extend([("svc_enable", "true"), ("svc_election", "false")]);
        env.extend(lease_env(SVC_TIMING_ENV, t));
    }
    Ok(ctx.lab.spawn(node, &ctx.vipd, &["manager"], &env)?)
}

/// vipd's (and kube-vip's) control-plane lease timing variables: duration, renew deadline,
/// retry period.
const VIP_TIMING_ENV: [&str; 3] = ["vip_leaseduration", "vip_renewdeadline", "vip_retryperiod"];
/// vipd's Service lease timing variables (vipd only; unset they take the `vip_*` values).
const SVC_TIMING_ENV: [&str; 3] = ["svc_leaseduration", "svc_renewdeadline", "svc_retryperiod"];

/// `keys` paired with the values of `t` (nothing for `default`).
fn lease_env<'a>(keys: [&'static str; 3], t: &'a Timings) -> Vec<(&'static str, &'a str)> {
    t.values
        .iter()
        .flat_map(|v| keys.into_iter().zip(v.iter().map(String::as_str)))
        .collect()
}

/// keepalived configuration of `node`: the common two-tier HA recipe, one MASTER with
/// priority 101 (node-a) and BACKUPs with priority 100, preemption on (keepalived's
/// default), multicast, virtual router id 51, no authentication, `192.0.2.10/32 dev eth0`,
/// with the VRRP version (`vrrp_version` in global_defs) and `advert_int` of `vrrp`
/// ([`Vrrp::CLASSIC`]: 2 and 1 s, [`Vrrp::FAST`]: 3 and 0.1 s). Everything else is
/// keepalived's default (5 gratuitous ARPs at the transition to MASTER, again 5 s later).
pub fn keepalived_conf(node: &str, vrrp: Vrrp) -> String {
    let (state, prio) = if node == NODES[0] {
        ("MASTER", 101)
    } else {
        ("BACKUP", 100)
    };
    // f64's Display prints 1.0 as `1` and 0.1 as `0.1`.
    let advert = vrrp.advert().as_secs_f64();
    format!(
        "global_defs {{\n    router_id {node}\n    vrrp_version {version}\n}}\n\n\
         vrrp_instance VI_CP {{\n    state {state}\n    interface {eth}\n    virtual_router_id 51\n    \
         priority {prio}\n    advert_int {advert}\n    virtual_ipaddress {{\n        {VIP}/32 dev {eth}\n    }}\n}}\n",
        version = vrrp.version(),
        eth = lab::ETH
    )
}

/// Starts `keepalived -n -l -D -P -f CONF -p PID -r VRRP_PID` on `node` (foreground, VRRP
/// only, per-node pid files under the lab directory) with [`keepalived_conf`]`(node, vrrp)`.
///
/// # Errors
/// When the config cannot be written or the process spawned.
pub fn start_keepalived(ctx: &Ctx, node: &str, vrrp: Vrrp) -> Result<LabProcess> {
    let dir = ctx.lab.dir().join("keepalived");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let conf = dir.join(format!("{node}.conf"));
    std::fs::write(&conf, keepalived_conf(node, vrrp))
        .with_context(|| format!("write {}", conf.display()))?;
    let s = |p: PathBuf| p.to_string_lossy().into_owned();
    let args = [
        "-n".to_string(),
        "-l".into(),
        "-D".into(),
        "-P".into(),
        "-f".into(),
        s(conf),
        "-p".into(),
        s(dir.join(format!("{node}.pid"))),
        "-r".into(),
        s(dir.join(format!("{node}-vrrp.pid"))),
    ];
    Ok(ctx.lab.spawn(node, KEEPALIVED, &args, &[])?)
}

/// The subset of `vipd probe --json`'s summary the bench reads (see vipd's
/// `probe::Summary`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeSummary {
    /// Requests with a known outcome.
    #[serde(default)]
    pub requests: u64,
    /// 2xx answers.
    #[serde(default)]
    pub successes: u64,
    /// Failed requests.
    #[serde(default)]
    pub failures: u64,
    /// Run time, ms.
    #[serde(default)]
    pub elapsed_ms: f64,
    /// Arrival of the last success, ms.
    #[serde(default)]
    pub last_success_ms: Option<f64>,
    /// Failures after the last success.
    #[serde(default)]
    pub trailing_failures: u64,
    /// Longest gap.
    #[serde(default)]
    pub longest_gap: Option<ProbeGap>,
    /// Switch count.
    #[serde(default)]
    pub switch_count: u64,
    /// Switches.
    #[serde(default)]
    pub switches: Vec<ProbeSwitch>,
}

/// `longest_gap` of the probe summary.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeGap {
    /// Length, ms.
    pub gap_ms: f64,
}

/// One entry of `switches` of the probe summary.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeSwitch {
    /// Old backend.
    pub from: String,
    /// New backend.
    pub to: String,
    /// First answer of `to`, ms since the probe start.
    pub at_ms: f64,
    /// Gap, ms.
    pub gap_ms: f64,
    /// Failures in between.
    pub failures: u64,
}

impl ProbeSummary {
    /// The longest gap including an open gap at the end (ms), `None` without any answer.
    pub fn worst_gap_ms(&self) -> Option<f64> {
        let closed = self.longest_gap.as_ref().map(|g| g.gap_ms);
        let open = (self.trailing_failures > 0)
            .then(|| self.last_success_ms.map(|l| self.elapsed_ms - l))
            .flatten();
        match (closed, open) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Stops a probe (SIGINT) and parses the JSON summary line from its log.
///
/// # Errors
/// When the probe does not exit or prints no summary.
pub fn stop_probe(mut probe: LabProcess) -> Result<ProbeSummary> {
    let _ = probe.signal(Signal::SIGINT);
    if probe.wait_timeout(Duration::from_secs(5))?.is_none() {
        let _ = probe.kill();
        bail!("vipd probe did not exit within 5 s of SIGINT");
    }
    let log = probe.log();
    let line = log
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("no JSON summary in the probe output: {}", tail(&log, 10)))?;
    serde_json::from_str(line).with_context(|| format!("parse probe summary {line}"))
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits until the probe's last `n` answer lines (stderr, `HH:MM:SS.mmm NODE LAT`) all name
/// `node`.
pub(crate) fn wait_probe_steady(
    probe: &LabProcess,
    node: &str,
    n: usize,
    limit: Duration,
) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let log = probe.log();
        let last: Vec<&str> = log
            .lines()
            .filter(|l| !l.starts_with('{'))
            .rev()
            .take(n)
            .collect();
        if last.len() == n
            && last
                .iter()
                .all(|l| l.split_whitespace().nth(1) == Some(node))
        {
            return Ok(());
        }
        if t0.elapsed() > limit {
            bail!(
                "probe did not answer steadily from {node} within {limit:?}: {}",
                tail(&log, 5)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What happened to one VIP after the event, from polling the nodes' addresses.
#[derive(Debug, Default)]
struct Watch {
    new_holder: Option<String>,
    takeover: Option<Duration>,
    old_gone: Option<Duration>,
    max_carriers: usize,
}

/// Polls the nodes' addresses until, for every one of `vips`, a node other than `old`
/// carries it, or `limit` passes; one [`Watch`] per VIP, in order.
fn watch_takeovers(
    ctx: &Ctx,
    vips: &[Ipv4Addr],
    old: &str,
    t0: Instant,
    limit: Duration,
) -> Result<Vec<Watch>> {
    let mut ws: Vec<Watch> = vips.iter().map(|_| Watch::default()).collect();
    loop {
        let hs = ctx.holders_of(vips)?;
        let now = t0.elapsed();
        for (w, h) in ws.iter_mut().zip(&hs) {
            if w.new_holder.is_some() {
                continue;
            }
            w.max_carriers = w.max_carriers.max(h.len());
            if w.old_gone.is_none() && !h.iter().any(|n| n == old) {
                w.old_gone = Some(now);
            }
            if let Some(n) = h.iter().find(|n| *n != old) {
                w.new_holder = Some(n.clone());
                w.takeover = Some(now);
            }
        }
        if ws.iter().all(|w| w.new_holder.is_some()) || now > limit {
            return Ok(ws);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Largest time a takeover may take before the trial gives up: generous, three lease
/// durations of the slowest timings we expect plus slack.
fn takeover_limit(subject: &Subject) -> Duration {
    match subject {
        Subject::Vipd(t) => {
            let lease = t
                .values
                .as_ref()
                .and_then(|v| v[0].parse::<f64>().ok())
                .unwrap_or(5.0);
            Duration::from_secs_f64(lease * 3.0 + 10.0)
        }
        Subject::Keepalived(_) => Duration::from_secs(20),
    }
}

/// Runs one trial of `scenario` for `subject`. See the module documentation.
///
/// # Errors
/// When the trial cannot be set up (no holder, probe never answers); what happens after the
/// event is reported in the result, not as an error.
pub fn run_trial(
    ctx: &Ctx,
    scenario: Scenario,
    subject: &Subject,
    trial: usize,
) -> Result<TrialResult> {
    run_trial_per_vip(ctx, scenario, subject, trial)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("the trial measured no VIP"))
}

/// Runs one trial of `scenario` for `subject` and returns one result per VIP of the run
/// ([`Ctx::vips`], in that order; labelled `SUBJECT:TAG` when there are several). See the
/// module documentation.
///
/// # Errors
/// When the trial cannot be set up (no holder, probe never answers); what happens after the
/// event is reported in the results, not as an error.
pub fn run_trial_per_vip(
    ctx: &Ctx,
    scenario: Scenario,
    subject: &Subject,
    trial: usize,
) -> Result<Vec<TrialResult>> {
    let mut notes = Vec::new();
    ctx.say(format!(
        "{} {} #{trial}: setting up",
        scenario.name(),
        subject.label()
    ));
    let mut cluster = if ctx.cp_and_service {
        start_one_node_first(ctx, subject, trial, &mut notes)?
    } else {
        start_trial_cluster(ctx, subject, &mut notes)?
    };
    let holder = reachable_holder(ctx, subject, &cluster)?;
    let vips = ctx.vips();
    let addrs: Vec<Ipv4Addr> = vips.iter().map(|(v, _)| *v).collect();
    // Each watcher's slots count from its own start.
    let mut watchers = Vec::new();
    for v in &addrs {
        watchers.push((ctx.start_arp_watch(*v)?, Instant::now()));
    }
    let mut probes = Vec::new();
    for v in &addrs {
        probes.push(ctx.start_probe(*v)?);
    }
    // The HTTP probe names the answering node; a TCP probe only says it connected.
    let answer = if ctx.lb { "connected" } else { holder.as_str() };
    for p in &probes {
        wait_probe_steady(p, answer, 25, Duration::from_secs(10))?;
    }
    // The holder may have changed meanwhile (it should not).
    let h = ctx.holders_of(&addrs)?;
    if h.iter().any(|h| *h != [holder.clone()]) {
        let h: Vec<String> = h.iter().map(|h| format!("{h:?}")).collect();
        notes.push(format!(
            "holders changed before the event: {}",
            h.join(", ")
        ));
    }
    // Spread the event over one renew (or VRRP advert) interval, trial by trial, so the
    // trials do not all hit the same phase of the holder's 1 s renew cycle.
    std::thread::sleep(PHASE_SPREAD.mul_f64((trial.saturating_sub(1) % 5) as f64 / 5.0));
    ctx.say(format!(
        "{holder} holds the VIP; acting: {}",
        scenario.name()
    ));

    let t0 = Instant::now();
    act(ctx, &cluster, scenario, &holder)?;
    let ws = watch_takeovers(ctx, &addrs, &holder, t0, takeover_limit(subject))?;
    let opt_ms =
        |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{} ms", d.as_millis()));
    let mut per_vip: Vec<Vec<String>> = vec![Vec::new(); vips.len()];
    // Under the millisecond fence a killed or frozen holder's address outlives the lease
    // by design, inert (its element ended): only the two-responder figure counts there.
    let inert_allowed = matches!(subject, Subject::Vipd(t) if t.nft_fence)
        && matches!(scenario, Scenario::Kill | Scenario::Freeze);
    for ((w, (vip, _)), notes) in ws.iter().zip(&vips).zip(per_vip.iter_mut()) {
        let of = if vips.len() > 1 {
            format!(" of {vip}")
        } else {
            String::new()
        };
        ctx.say(format!(
            "takeover{of} by {} after {} (old gone after {})",
            w.new_holder.as_deref().unwrap_or("nobody"),
            opt_ms(w.takeover),
            opt_ms(w.old_gone)
        ));
        if w.max_carriers > 1
            && !inert_allowed
            && matches!(
                scenario,
                Scenario::Graceful | Scenario::Kill | Scenario::Freeze | Scenario::Drain
            )
        {
            notes.push(format!("{} nodes carried the VIP at once", w.max_carriers));
        }
    }
    let came_back = if scenario == Scenario::Freeze {
        let watching: Vec<(Ipv4Addr, &ArpWatcher, Duration)> = addrs
            .iter()
            .zip(&watchers)
            .map(|(v, (w, at))| (*v, w, t0.duration_since(*at)))
            .collect();
        thaw_and_watch(ctx, &cluster, &watching, &holder, t0, &mut per_vip)?
            .into_iter()
            .map(Some)
            .collect()
    } else {
        std::thread::sleep(Duration::from_secs(2));
        vec![None; vips.len()]
    };
    let summaries: Vec<Result<ProbeSummary>> = probes.into_iter().map(stop_probe).collect();
    let mut reports = Vec::new();
    for (w, at) in watchers {
        reports.push((w.stop()?, t0.duration_since(at)));
    }
    end_trial(ctx, &mut cluster, scenario, subject, &holder, &mut notes)?;

    let mut out = Vec::new();
    for (i, (summary, (report, event_at))) in summaries.into_iter().zip(reports).enumerate() {
        let summary = summary?;
        let mut notes = [notes.clone(), std::mem::take(&mut per_vip[i])].concat();
        let (two_ms, pairs) = two_responders(ctx, &report, event_at, &mut notes);
        let w = &ws[i];
        if w.new_holder.is_none() {
            notes.push("no takeover within the time limit".into());
        }
        let (recovered, sw) = probe_notes(&summary, &mut notes);
        let subject = match vips[i].1 {
            "" => subject.label(),
            tag => format!("{}:{tag}", subject.label()),
        };
        out.push(TrialResult {
            scenario,
            subject,
            trial,
            holder: holder.clone(),
            new_holder: w.new_holder.clone(),
            gap_ms: summary.worst_gap_ms(),
            takeover_ms: w.takeover.map(ms),
            old_gone_ms: w.old_gone.map(ms),
            two_responders_ms: two_ms,
            two_responder_nodes: pairs.into_iter().collect(),
            switches: summary.switch_count,
            probe_failures: summary.failures,
            probe_requests: summary.requests,
            probe_switches: sw,
            recovered,
            came_back: came_back[i],
            notes,
        });
    }
    Ok(out)
}

/// Clears what a previous trial may have left (the vipd leases, the VIPs, a killed vipd's
/// fence tables).
fn prepare_trial(ctx: &Ctx, subject: &Subject, notes: &mut Vec<String>) -> Result<()> {
    if matches!(subject, Subject::Vipd(_)) {
        ctx.delete_lease()?;
    }
    // A vipd killed under the nftables fence leaves its tables (a restarted vipd replaces
    // them); they would keep dropping the VIP's ARP and traffic for the next subject.
    for n in NODES {
        for family in ["arp", "inet"] {
            let _ = ctx
                .lab
                .exec_unchecked(n, "nft", &["delete", "table", family, "vipd_fence"]);
        }
    }
    let leftovers = ctx.clear_vip(Duration::from_secs(6))?;
    if !leftovers.is_empty() {
        notes.push(format!(
            "VIP left on {} before the trial, removed by hand",
            leftovers.join(",")
        ));
    }
    Ok(())
}

/// Clears what a previous trial may have left ([`prepare_trial`]) and starts the subject on
/// every node.
pub(crate) fn start_trial_cluster(
    ctx: &Ctx,
    subject: &Subject,
    notes: &mut Vec<String>,
) -> Result<Cluster> {
    prepare_trial(ctx, subject, notes)?;
    Cluster::start(ctx, subject)
}

/// `--cp-and-service`: clears what a previous trial may have left ([`prepare_trial`]),
/// starts vipd on one node (node-a, node-b, node-c by trial number), waits until that node
/// carries every VIP of the run and the client reaches each, then starts the other nodes
/// and waits until each follows every Lease of the run.
fn start_one_node_first(
    ctx: &Ctx,
    subject: &Subject,
    trial: usize,
    notes: &mut Vec<String>,
) -> Result<Cluster> {
    prepare_trial(ctx, subject, notes)?;
    let first = NODES[trial.saturating_sub(1) % NODES.len()];
    let mut cluster = Cluster { procs: Vec::new() };
    cluster.add(ctx, subject, first)?;
    let h = reachable_holder(ctx, subject, &cluster)?;
    if h != first {
        bail!("{h} carries the VIPs, but only {first} runs vipd");
    }
    let others: Vec<&str> = NODES.iter().copied().filter(|n| *n != first).collect();
    for n in &others {
        cluster.add(ctx, subject, n)?;
    }
    let leases = [LEASE_NAME, SERVICES_LEASE_NAME].map(|l| format!("{LEASE_NAMESPACE}/{l}"));
    let t0 = Instant::now();
    for n in &others {
        loop {
            let log = cluster.log(n);
            let missing: Vec<&String> =
                leases.iter().filter(|l| !follows(&log, l, first)).collect();
            if missing.is_empty() {
                break;
            }
            if t0.elapsed() > Duration::from_secs(15) {
                bail!(
                    "{n} does not follow {missing:?} held by {first} after 15 s; log:\n{}",
                    tail(&log, 15)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(cluster)
}

/// Whether a vipd log (`vip_loglevel=info`) says it follows `lease` (`NAMESPACE/NAME`)
/// held by `holder`: vipd's `following` line with `lease=` and `holder=` fields.
fn follows(log: &str, lease: &str, holder: &str) -> bool {
    log.lines().any(|l| {
        l.contains("following")
            && l.contains(&format!("lease={lease}"))
            && l.contains(&format!("holder={holder}"))
    })
}

/// Waits for a stable holder of every VIP of the run and until the client reaches it
/// through each of them; returns it.
pub(crate) fn reachable_holder(ctx: &Ctx, subject: &Subject, cluster: &Cluster) -> Result<String> {
    // keepalived: longer than its master-down interval (3 x advert_int + skew: 3.6 s, 4.5 s
    // stable; keepalived-fast 0.36 s, 1.26 s stable).
    let stable_for = match subject {
        Subject::Vipd(_) => Duration::from_millis(500),
        Subject::Keepalived(v) => v.master_down() + Duration::from_millis(900),
    };
    let holder = ctx
        .stable_holder(Duration::from_secs(30), stable_for)
        .map_err(|e| {
            anyhow!(
                "{e}; logs:\n{}",
                NODES
                    .iter()
                    .map(|n| format!("--- {n}\n{}", tail(&cluster.log(n), 15)))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })?;
    for (vip, _) in ctx.vips() {
        let vip80 = SocketAddr::new(IpAddr::V4(vip), 80);
        let t_http = Instant::now();
        loop {
            let body = ctx
                .lab
                .http_get("client", vip80, "/", Duration::from_millis(500));
            if body.as_deref().is_ok_and(|b| b.trim() == holder) {
                break;
            }
            if t_http.elapsed() > Duration::from_secs(10) {
                bail!("client never reached {holder} through {vip}: {body:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(holder)
}

/// The event of `scenario` on `holder`.
fn act(ctx: &Ctx, cluster: &Cluster, scenario: Scenario, holder: &str) -> Result<()> {
    match scenario {
        Scenario::Graceful => cluster.signal_main(holder, Signal::SIGTERM)?,
        Scenario::Kill => cluster.signal_all(holder, Signal::SIGKILL)?,
        Scenario::Freeze => cluster.signal_all(holder, Signal::SIGSTOP)?,
        Scenario::Poweroff => {
            cluster.signal_all(holder, Signal::SIGKILL)?;
            ctx.lab.cut_link(holder)?;
        }
        Scenario::Partition => ctx.lab.partition(holder)?,
        Scenario::Drain => {
            // Through the holder's own admin endpoint (the default :2112), as an operator
            // would run it on the node.
            ctx.lab.exec(holder, &ctx.vipd, &["drain"])?;
        }
    }
    Ok(())
}

/// Freeze only: 3 s after the event thaws the old holder and watches 4 s whether it carried
/// or answered for each VIP again (noted in that VIP's notes). `watching` holds each VIP, its
/// watcher and the event's time on that watcher's clock.
fn thaw_and_watch(
    ctx: &Ctx,
    cluster: &Cluster,
    watching: &[(Ipv4Addr, &ArpWatcher, Duration)],
    holder: &str,
    t0: Instant,
    notes: &mut [Vec<String>],
) -> Result<Vec<bool>> {
    std::thread::sleep(Duration::from_secs(3));
    for p in cluster.pids(holder) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Signal::SIGCONT);
    }
    let cont_after_event = t0.elapsed();
    let t_cont = Instant::now();
    let vips: Vec<Ipv4Addr> = watching.iter().map(|(v, _, _)| *v).collect();
    let mut carried = vec![false; vips.len()];
    while t_cont.elapsed() < Duration::from_secs(4) {
        for (c, h) in carried.iter_mut().zip(ctx.holders_of(&vips)?) {
            *c |= h.iter().any(|h| h == holder);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let old_mac = ctx.lab.mac_of(holder)?;
    let mut out = Vec::new();
    for (((_, watcher, event_at), carried), notes) in
        watching.iter().zip(carried).zip(notes.iter_mut())
    {
        let cont_at = *event_at + cont_after_event;
        let answered = watcher
            .report()
            .slots
            .iter()
            .filter(|s| s.t >= cont_at)
            .any(|s| s.responders.contains(&old_mac));
        if carried || answered {
            notes.push(format!(
                "thawed {holder} came back (carried the VIP: {carried}, answered ARP: {answered})"
            ));
        }
        out.push(carried || answered);
    }
    Ok(out)
}

/// Heals the event, stops every instance and removes a VIP left behind (noted).
fn end_trial(
    ctx: &Ctx,
    cluster: &mut Cluster,
    scenario: Scenario,
    subject: &Subject,
    holder: &str,
    notes: &mut Vec<String>,
) -> Result<()> {
    // Heal before stopping, so graceful stops can reach the API server.
    match scenario {
        Scenario::Poweroff => ctx.lab.restore_link(holder)?,
        Scenario::Partition => ctx.lab.heal(holder)?,
        _ => {}
    }
    cluster.stop();
    // vipd removes its VIP when stopped (or the kernel fence does); a killed keepalived
    // leaves it behind for good. Either way the next trial starts clean.
    let grace = match subject {
        Subject::Vipd(_) => Duration::from_secs(6),
        Subject::Keepalived(_) => Duration::from_secs(1),
    };
    let left = ctx.clear_vip(grace)?;
    if !left.is_empty() {
        notes.push(format!(
            "VIP still on {} {grace:?} after every instance stopped; removed by hand",
            left.join(",")
        ));
    }
    Ok(())
}

/// Time with two or more ARP responders (slots x interval, ms) and the node pairs seen; a
/// note when there were any.
fn two_responders(
    ctx: &Ctx,
    report: &WatchReport,
    event_at: Duration,
    notes: &mut Vec<String>,
) -> (f64, BTreeSet<String>) {
    let mut two = 0usize;
    let mut pairs = BTreeSet::new();
    for s in &report.slots {
        if s.responders.len() >= 2 {
            two += 1;
            let names: Vec<String> = s.responders.iter().map(|m| ctx.node_of(m)).collect();
            pairs.insert(names.join("+"));
        }
    }
    let two_ms = two as f64 * ms(report.interval);
    if two > 0 {
        let first = report
            .slots
            .iter()
            .find(|s| s.responders.len() >= 2)
            .map(|s| ms(s.t.saturating_sub(event_at)))
            .unwrap_or_default();
        notes.push(format!(
            "two ARP responders ({}) for {two_ms:.0} ms, first {first:.0} ms after the event",
            pairs.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    (two_ms, pairs)
}

/// Whether the probe recovered, and its switches as text; notes a trailing gap and more
/// than one switch.
fn probe_notes(summary: &ProbeSummary, notes: &mut Vec<String>) -> (bool, Vec<String>) {
    let recovered = summary.trailing_failures == 0 && summary.successes > 0;
    if !recovered {
        notes.push(format!(
            "probe ended in a gap ({} trailing failures)",
            summary.trailing_failures
        ));
    }
    let sw: Vec<String> = summary
        .switches
        .iter()
        .map(|s| {
            format!(
                "{}->{} at {:.0} ms (gap {:.0} ms, {} failed)",
                s.from, s.to, s.at_ms, s.gap_ms, s.failures
            )
        })
        .collect();
    if summary.switch_count > 1 {
        notes.push(format!(
            "{} switches: {}",
            summary.switch_count,
            sw.join("; ")
        ));
    }
    (recovered, sw)
}

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Counts writes to the control-plane Lease for `window` with a watch
/// (`?watch=1&timeoutSeconds=N` from the current resourceVersion); returns writes/second.
///
/// # Errors
/// When the Lease cannot be read or the watch fails.
pub fn lease_writes_per_s(lab: &Lab, window: Duration) -> Result<f64> {
    let (_, rv) = get_lease(lab)?;
    let path = lease_watch_path(&rv, window.as_secs().max(1));
    let t0 = Instant::now();
    let w = lab.api_request("GET", &path, None)?;
    let took = t0.elapsed();
    if w.status != 200 {
        bail!("watch lease: HTTP {}: {}", w.status, w.body);
    }
    let events = w
        .body
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| matches!(e["type"].as_str(), Some("MODIFIED" | "ADDED" | "DELETED")))
        .count();
    Ok(events as f64 / took.as_secs_f64().max(1.0))
}

/// The idle phase: start `subject` on every node, wait for a holder, count Lease writes
/// and read the RSS of the leader and the followers after [`IDLE_WINDOW`].
///
/// # Errors
/// When the cluster does not elect a holder.
pub fn idle(ctx: &Ctx, subject: &Subject) -> Result<IdleResult> {
    ctx.delete_lease()?;
    ctx.clear_vip(Duration::from_secs(6))?;
    let mut cluster = Cluster::start(ctx, subject)?;
    let holder = ctx.single_holder(Duration::from_secs(30))?;
    let t0 = Instant::now();
    let writes = std::thread::scope(|s| {
        let h = s.spawn(|| lease_writes_per_s(&ctx.lab, IDLE_WINDOW));
        std::thread::sleep(IDLE_WINDOW.saturating_sub(t0.elapsed()));
        h.join()
            .map_err(|_| anyhow!("lease watch thread panicked"))
            .and_then(|r| r)
    });
    let leader_rss = cluster.process(&holder).and_then(|p| rss_kib(p.pid()));
    let follower_rss = NODES
        .iter()
        .filter(|n| **n != holder)
        .filter_map(|n| cluster.process(n).and_then(|p| rss_kib(p.pid())))
        .max();
    cluster.stop();
    let writes = match writes {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!("lease write count failed: {e:#}");
            None
        }
    };
    Ok(IdleResult {
        subject: subject.label(),
        leader_rss_kib: leader_rss,
        follower_rss_kib: follower_rss,
        lease_writes_per_s: writes,
    })
}

fn idle_line(r: &IdleResult) -> String {
    let mib = |k: Option<u64>| {
        k.map(|k| {
            format!(
                "{k} KiB = {:.1} MB ({:.1} MiB)",
                k as f64 * 1024.0 / 1e6,
                k as f64 / 1024.0
            )
        })
        .unwrap_or_else(|| "?".into())
    };
    format!(
        "idle {:<16} RSS leader {}  follower {}  lease writes {}/s",
        r.subject,
        mib(r.leader_rss_kib),
        mib(r.follower_rss_kib),
        r.lease_writes_per_s
            .map(|w| format!("{w:.2}"))
            .unwrap_or_else(|| "?".into())
    )
}

fn opt_ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into())
}

/// One line per trial.
pub fn trial_line(r: &TrialResult) -> String {
    let mut s = format!(
        "{:<9} {:<16} #{} {}->{}: gap {} ms, takeover {} ms, old gone {} ms, two responders {:.0} ms",
        r.scenario.name(),
        r.subject,
        r.trial,
        r.holder,
        r.new_holder.as_deref().unwrap_or("?"),
        opt_ms(r.gap_ms),
        opt_ms(r.takeover_ms),
        opt_ms(r.old_gone_ms),
        r.two_responders_ms
    );
    for n in &r.notes {
        let _ = write!(s, "\n      note: {n}");
    }
    s
}

/// One line per `--cp-and-service` trial: where each VIP went and the slower VIP's gap.
pub fn pair_line(p: &PairResult) -> String {
    let to = |n: &Option<String>| n.clone().unwrap_or_else(|| "?".into());
    format!(
        "{:<9} {:<16} #{} {}->cp {}, svc {} ({}): both back after {} ms, svc takeover - cp takeover {} ms",
        p.scenario.name(),
        p.subject,
        p.trial,
        p.holder,
        to(&p.cp_new_holder),
        to(&p.svc_new_holder),
        if p.same_node {
            "same node"
        } else {
            "different nodes"
        },
        opt_ms(p.both_gap_ms),
        opt_ms(p.takeover_spread_ms)
    )
}

/// The `--cp-and-service` table per (scenario, subject): trials, p50/p95/max of the slower
/// VIP's gap (ms), the largest takeover spread between the two VIPs (ms, absolute) and in
/// how many trials both moved to the same node. Empty without pairs.
pub fn pair_table(report: &BenchReport) -> String {
    let mut s = String::new();
    if report.pairs.is_empty() {
        return s;
    }
    let mut order: Vec<(Scenario, &str)> = Vec::new();
    for p in &report.pairs {
        if !order.contains(&(p.scenario, p.subject.as_str())) {
            order.push((p.scenario, p.subject.as_str()));
        }
    }
    let w = label_width(order.iter().map(|(_, subj)| *subj));
    let _ = writeln!(
        s,
        "
both VIPs (control-plane and Service, one holder before the event; both back = the slower VIP's gap):"
    );
    let _ = writeln!(
        s,
        "{:<9} {:<w$} {:>6} {:>9} {:>9} {:>9} {:>11} {:>10}",
        "scenario", "impl", "trials", "both p50", "both p95", "both max", "spread max", "same node",
    );
    for (scenario, subject) in order {
        let ps: Vec<&PairResult> = report
            .pairs
            .iter()
            .filter(|p| p.scenario == scenario && p.subject == subject)
            .collect();
        let both: Vec<f64> = ps.iter().filter_map(|p| p.both_gap_ms).collect();
        let spread = ps
            .iter()
            .filter_map(|p| p.takeover_spread_ms)
            .map(f64::abs)
            .reduce(f64::max);
        let _ = writeln!(
            s,
            "{:<9} {:<w$} {:>6} {:>9} {:>9} {:>9} {:>11} {:>10}",
            scenario.name(),
            subject,
            ps.len(),
            opt_ms(percentile(&both, 50.0)),
            opt_ms(percentile(&both, 95.0)),
            opt_ms(percentile(&both, 100.0)),
            opt_ms(spread),
            format!("{}/{}", ps.iter().filter(|p| p.same_node).count(), ps.len()),
        );
    }
    s
}

/// Width of the `impl` column: the longest label, at least 16.
fn label_width<'a>(labels: impl Iterator<Item = &'a str>) -> usize {
    labels.map(str::len).fold(16, usize::max)
}

/// p50, p95 and max of the trials' gaps of one (scenario, subject).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GapStats {
    /// Median gap, ms.
    pub p50: f64,
    /// 95th percentile, ms.
    pub p95: f64,
    /// Largest, ms.
    pub max: f64,
}

fn gap_stats(rs: &[&TrialResult]) -> Option<GapStats> {
    let v: Vec<f64> = rs.iter().filter_map(|r| r.gap_ms).collect();
    Some(GapStats {
        p50: percentile(&v, 50.0)?,
        p95: percentile(&v, 95.0)?,
        max: percentile(&v, 100.0)?,
    })
}

fn grouped(report: &BenchReport) -> Vec<((Scenario, String), Vec<&TrialResult>)> {
    let mut order: Vec<(Scenario, String)> = Vec::new();
    let mut map: HashMap<(Scenario, String), Vec<&TrialResult>> = HashMap::new();
    for r in &report.trials {
        let k = (r.scenario, r.subject.clone());
        if !map.contains_key(&k) {
            order.push(k.clone());
        }
        map.entry(k).or_default().push(r);
    }
    order
        .into_iter()
        .map(|k| {
            let v = map.remove(&k).unwrap_or_default();
            (k, v)
        })
        .collect()
}

/// The per-(scenario, subject) table: trials, gap p50/p95/max (ms), takeover p50 (ms) and
/// the worst trial's time with two responders (ms).
pub fn summary_table(report: &BenchReport) -> String {
    let mut s = String::new();
    let groups = grouped(report);
    let w = label_width(groups.iter().map(|((_, subj), _)| subj.as_str()));
    let _ = writeln!(
        s,
        "{:<9} {:<w$} {:>6} {:>8} {:>8} {:>8} {:>10} {:>12}  notes",
        "scenario", "impl", "trials", "gap p50", "gap p95", "gap max", "takeover50", "2-resp max",
    );
    for ((scenario, subject), rs) in groups {
        let g = gap_stats(&rs);
        let take: Vec<f64> = rs.iter().filter_map(|r| r.takeover_ms).collect();
        let two_max = rs
            .iter()
            .map(|r| r.two_responders_ms)
            .fold(0.0_f64, f64::max);
        let flagged = rs.iter().filter(|r| !r.notes.is_empty()).count();
        let _ = writeln!(
            s,
            "{:<9} {:<w$} {:>6} {:>8} {:>8} {:>8} {:>10} {:>12}  {}",
            scenario.name(),
            subject,
            rs.len(),
            opt_ms(g.map(|g| g.p50)),
            opt_ms(g.map(|g| g.p95)),
            opt_ms(g.map(|g| g.max)),
            opt_ms(percentile(&take, 50.0)),
            format!("{two_max:.0}"),
            if flagged > 0 {
                format!("{flagged} trial(s) with notes")
            } else {
                String::new()
            }
        );
    }
    s
}

/// vipd / keepalived ratios of gap p50 and p95 per scenario and vipd timing, one section
/// per keepalived variant ([`Vrrp::label`]) in the report.
pub fn ratio_table(report: &BenchReport) -> String {
    let groups = grouped(report);
    let stats: HashMap<(Scenario, String), GapStats> = groups
        .iter()
        .filter_map(|(k, rs)| gap_stats(rs).map(|g| (k.clone(), g)))
        .collect();
    let mut s = String::new();
    for vrrp in Vrrp::ALL {
        ratio_section(&mut s, &groups, &stats, vrrp.label());
    }
    s
}

/// The lines of [`ratio_table`] against the keepalived row `against`.
fn ratio_section(
    s: &mut String,
    groups: &[((Scenario, String), Vec<&TrialResult>)],
    stats: &HashMap<(Scenario, String), GapStats>,
    against: &str,
) {
    let mut header = false;
    for ((scenario, subject), g) in groups
        .iter()
        .filter(|((_, subj), _)| subj.starts_with("vipd"))
        .filter_map(|(k, _)| stats.get(k).map(|g| (k, g)))
    {
        let Some(k) = stats.get(&(*scenario, against.to_string())) else {
            continue;
        };
        if !header {
            let _ = writeln!(s, "\nvipd / {against} (gap; < 1 means vipd is faster):");
            header = true;
        }
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}", a / b)
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            s,
            "  {:<9} {:<16} p50 {:>5}  p95 {:>5}",
            scenario.name(),
            subject,
            ratio(g.p50, k.p50),
            ratio(g.p95, k.p95)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_reject_bad_values() {
        let o = BenchOptions::parse(&[
            "--scenario",
            "kill,freeze",
            "--trials",
            "3",
            "--impl",
            "vipd",
            "--timings",
            "default,2.5/2/1",
        ])
        .unwrap();
        assert_eq!(o.scenarios, vec![Scenario::Kill, Scenario::Freeze]);
        assert_eq!(o.trials, 3);
        assert!(o.vipd && o.keepalived.is_empty());
        assert_eq!(o.timings[1].values.as_ref().unwrap()[0], "2.5");
        assert_eq!(o.subjects().len(), 2);
        assert!(BenchOptions::parse(&["--lb"]).unwrap().lb);
        assert!(!BenchOptions::parse(&[]).unwrap().lb);
        let e = BenchOptions::parse(&["--scenario", "reboot"]).unwrap_err();
        assert!(e.to_string().contains("\"reboot\""), "{e}");
        assert!(BenchOptions::parse(&["--trials", "0"]).is_err());
        assert!(BenchOptions::parse(&["--timings", "3/5/1"]).is_err());
        assert!(BenchOptions::parse(&["--timings", "5/3"]).is_err());
        assert!(BenchOptions::parse(&["--trials"]).is_err());
        // The fast profile: sub-second timings with the nftables fence.
        let o = BenchOptions::parse(&["--timings", "fast,3/2/1,1/0.6/0.3+nft"]).unwrap();
        let fast = &o.timings[0];
        assert_eq!(fast.label, "fast");
        assert_eq!(
            fast.values.as_ref().unwrap(),
            &["0.6".to_string(), "0.4".into(), "0.2".into()]
        );
        assert!(fast.nft_fence && !o.timings[1].nft_fence && o.timings[2].nft_fence);
        assert_eq!(o.timings[2].values.as_ref().unwrap()[1], "0.6");
        assert!(BenchOptions::parse(&["--timings", "fast+nft"]).is_err());
    }

    #[test]
    fn impl_selects_vipd_and_the_keepalived_rows() {
        let labels = |args: &[&str]| -> Vec<String> {
            BenchOptions::parse(args)
                .unwrap()
                .subjects()
                .iter()
                .map(Subject::label)
                .collect()
        };
        let all = [
            "vipd default",
            "vipd 5/3/1",
            "keepalived",
            "keepalived-fast",
        ];
        assert_eq!(labels(&[]), all);
        assert_eq!(labels(&["--impl", "both"]), all);
        assert_eq!(labels(&["--impl", "vipd"]), ["vipd default", "vipd 5/3/1"]);
        assert_eq!(
            labels(&["--impl", "keepalived"]),
            ["keepalived", "keepalived-fast"]
        );
        assert_eq!(labels(&["--impl", "keepalived-fast"]), ["keepalived-fast"]);
        // Services mode is vipd only.
        assert_eq!(
            labels(&["--impl", "both", "--service", "--timings", "default"]),
            ["vipd default svc"]
        );
        let e = BenchOptions::parse(&["--impl", "kube-vip"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid --impl value \"kube-vip\": expected vipd, keepalived, keepalived-fast or both"
        );
    }

    #[test]
    fn cp_and_service_is_vipd_only_and_alone() {
        let o = BenchOptions::parse(&["--cp-and-service", "--timings", "default,fast"]).unwrap();
        assert!(o.cp_and_service && o.service.is_none() && !o.lb);
        // keepalived rows are skipped, as with --service.
        let labels: Vec<String> = o.subjects().iter().map(Subject::label).collect();
        assert_eq!(labels, ["vipd default cp+svc", "vipd fast cp+svc"]);
        assert!(!BenchOptions::parse(&[]).unwrap().cp_and_service);
        for (flags, named) in [
            (&["--cp-and-service", "--service"][..], "--service"),
            (&["--service", "--cp-and-service"][..], "--service"),
            (&["--cp-and-service", "--ride"][..], "--ride"),
            (&["--lb", "--cp-and-service"][..], "--lb"),
        ] {
            let e = BenchOptions::parse(flags).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!(
                    "--cp-and-service cannot be combined with {named}:"
                )),
                "{flags:?}: {e}"
            );
        }
        let e = BenchOptions::parse(&["--cp-and-service", "--impl", "keepalived"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--cp-and-service measures vipd only: use --impl vipd (or both)"
        );
    }

    #[test]
    fn service_timings_mirror_the_control_plane_timings() {
        let fast = Timings::parse("fast").unwrap();
        assert_eq!(
            lease_env(SVC_TIMING_ENV, &fast),
            [
                ("svc_leaseduration", "0.6"),
                ("svc_renewdeadline", "0.4"),
                ("svc_retryperiod", "0.2")
            ]
        );
        assert_eq!(
            lease_env(VIP_TIMING_ENV, &fast),
            [
                ("vip_leaseduration", "0.6"),
                ("vip_renewdeadline", "0.4"),
                ("vip_retryperiod", "0.2")
            ]
        );
        assert!(lease_env(SVC_TIMING_ENV, &Timings::parse("default").unwrap()).is_empty());
    }

    #[test]
    fn follows_reads_vipds_following_line() {
        let log = "2026-12-01T21:50:00.123456Z  INFO leader election starting lease=kube-system/plndr-svcs-lock identity=node-b\n\
                   2026-12-01T21:50:00.200000Z  INFO following lease=kube-system/plndr-cp-lock holder=node-a";
        assert!(follows(log, "kube-system/plndr-cp-lock", "node-a"));
        assert!(!follows(log, "kube-system/plndr-cp-lock", "node-c"));
        assert!(!follows(log, "kube-system/plndr-svcs-lock", "node-a"));
    }

    #[test]
    fn pairs_take_the_slower_vip_and_name_the_new_nodes() {
        let r = |subject: &str, to: &str, gap: f64, take: f64| TrialResult {
            scenario: Scenario::Poweroff,
            subject: subject.into(),
            trial: 2,
            holder: "node-a".into(),
            new_holder: Some(to.into()),
            gap_ms: Some(gap),
            takeover_ms: Some(take),
            old_gone_ms: None,
            two_responders_ms: 0.0,
            two_responder_nodes: vec![],
            switches: 1,
            probe_failures: 0,
            probe_requests: 10,
            probe_switches: vec![],
            recovered: true,
            came_back: None,
            notes: vec![],
        };
        let same = PairResult::of(
            "vipd fast cp+svc",
            &r("vipd fast cp+svc:cp", "node-b", 700.0, 650.0),
            &r("vipd fast cp+svc:svc", "node-b", 900.0, 610.0),
        );
        assert!(same.same_node);
        assert_eq!(same.both_gap_ms, Some(900.0));
        assert_eq!(same.takeover_spread_ms, Some(-40.0));
        let split = PairResult::of(
            "vipd fast cp+svc",
            &r("vipd fast cp+svc:cp", "node-b", 700.0, 650.0),
            &r("vipd fast cp+svc:svc", "node-c", 600.0, 700.0),
        );
        assert!(!split.same_node);
        assert_eq!(split.both_gap_ms, Some(700.0));
        assert!(pair_line(&split).contains("->cp node-b, svc node-c (different nodes)"));
        let report = BenchReport {
            trials: vec![],
            idle: vec![],
            pairs: vec![same, split],
        };
        let table = pair_table(&report);
        let row = table.lines().last().unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        // scenario, impl (3 words), trials, both p50/p95/max, spread max, same node
        assert_eq!(
            cols,
            [
                "poweroff", "vipd", "fast", "cp+svc", "2", "700", "900", "900", "50", "1/2"
            ],
            "{table}"
        );
        assert_eq!(pair_table(&BenchReport::default()), "");
    }

    #[test]
    fn open_gap_at_the_end_counts() {
        let s: ProbeSummary = serde_json::from_str(
            r#"{"requests":10,"successes":5,"failures":5,"elapsed_ms":1000.0,
                "last_success_ms":400.0,"trailing_failures":5,
                "longest_gap":{"start_ms":0.0,"gap_ms":100.0,"failures":0},
                "switch_count":0,"switches":[],"backends":{"node-a":5}}"#,
        )
        .unwrap();
        assert_eq!(s.worst_gap_ms(), Some(600.0));
        let closed = ProbeSummary {
            longest_gap: Some(ProbeGap { gap_ms: 250.0 }),
            ..ProbeSummary::default()
        };
        assert_eq!(closed.worst_gap_ms(), Some(250.0));
        assert_eq!(ProbeSummary::default().worst_gap_ms(), None);
    }

    #[test]
    fn keepalived_conf_is_the_documented_recipe() {
        for vrrp in Vrrp::ALL {
            let a = keepalived_conf("node-a", vrrp);
            assert!(
                a.contains("state MASTER") && a.contains("priority 101"),
                "{a}"
            );
            for n in ["node-b", "node-c"] {
                let b = keepalived_conf(n, vrrp);
                assert!(
                    b.contains("state BACKUP") && b.contains("priority 100"),
                    "{b}"
                );
            }
            assert!(
                a.contains("virtual_router_id 51") && a.contains("192.0.2.10/32 dev eth0"),
                "{a}"
            );
        }
        let lines =
            |c: String| -> Vec<String> { c.lines().map(|l| l.trim().to_string()).collect() };
        let classic = lines(keepalived_conf("node-b", Vrrp::CLASSIC));
        assert!(classic.contains(&"vrrp_version 2".into()), "{classic:?}");
        assert!(classic.contains(&"advert_int 1".into()), "{classic:?}");
        let fast = lines(keepalived_conf("node-b", Vrrp::FAST));
        assert!(fast.contains(&"vrrp_version 3".into()), "{fast:?}");
        assert!(fast.contains(&"advert_int 0.1".into()), "{fast:?}");
        // Only the version and the advert interval differ.
        let differing: Vec<_> = classic.iter().filter(|l| !fast.contains(l)).collect();
        assert_eq!(differing, ["vrrp_version 2", "advert_int 1"]);
        assert_eq!(Vrrp::CLASSIC.label(), "keepalived");
        assert_eq!(Vrrp::FAST.label(), "keepalived-fast");
        assert_eq!(Vrrp::CLASSIC.master_down().as_millis(), 3609);
        assert_eq!(Vrrp::FAST.master_down().as_millis(), 360);
    }

    #[test]
    fn tables_group_by_scenario_and_impl() {
        let t = |subject: &str, gap: f64| TrialResult {
            scenario: Scenario::Kill,
            subject: subject.into(),
            trial: 1,
            holder: "node-a".into(),
            new_holder: Some("node-b".into()),
            gap_ms: Some(gap),
            takeover_ms: Some(gap),
            old_gone_ms: None,
            two_responders_ms: 0.0,
            two_responder_nodes: vec![],
            switches: 1,
            probe_failures: 0,
            probe_requests: 10,
            probe_switches: vec![],
            recovered: true,
            came_back: None,
            notes: vec![],
        };
        let report = BenchReport {
            trials: vec![
                t("vipd default", 1000.0),
                t("keepalived", 4000.0),
                t("keepalived-fast", 500.0),
            ],
            idle: vec![],
            pairs: vec![],
        };
        let table = summary_table(&report);
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(table.contains("\nkill      keepalived-fast "), "{table}");
        let ratios = ratio_table(&report);
        let (classic, fast) = ratios
            .split_once("vipd / keepalived-fast ")
            .expect("a keepalived-fast section");
        assert!(
            classic.contains("vipd / keepalived (") && classic.contains("p50  0.25"),
            "{ratios}"
        );
        assert!(fast.contains("p50  2.00"), "{ratios}");
        let json = serde_json::to_string(&report.trials[2]).unwrap();
        assert!(json.contains(r#""subject":"keepalived-fast""#), "{json}");
    }
}
