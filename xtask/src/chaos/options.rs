//! The command line of `cargo xtask chaos`, and the command that reruns a soak.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use xtask::lab;

use super::audit::FaultKind;
use super::{DEFAULT_SERVICES, MAX_SERVICES};
use crate::args::{parse_flags, whole_number};

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
                         every VIP's address lifetime, docs/operators.md); without it the
                         option is left at vipd's default
  --lease-shards N       run vipd with svc_leaseshards=N (shard leases, 1 to 1024; default:
                         one lease per Service)
  --no-ride              Service leases at vipd's bare 3/2/1 (ride-through off by default
                         there) and no peer key Secret, instead of the generated manifests'
                         5/3/1 with ride-through
  --canary               check the auditor end to end: put 192.0.2.250 on two nodes for 2 s
                         after the warm-up; the run fails unless the auditor reports it
  --rss-growth-pct P     RSS growth (end over start, same process) counted as a violation
                         (default 20)
  -v, --verbose          print every fault as it is injected";

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
    /// Put [`CANARY_ADDR`](super::CANARY_ADDR) on two nodes for [`CANARY_HOLD`](super::CANARY_HOLD) after the warm-up and require
    /// the auditor to report it.
    pub canary: bool,
    /// Run vipd with `vip_nftfence=true` (`false`: vipd's default).
    pub nft_fence: bool,
    /// Run vipd with `svc_leaseshards` set to this (0: not set, one lease per Service).
    pub lease_shards: u16,
    /// The generated manifests' configuration (Service leases 5/3/1, ride-through at its
    /// default, the peer key Secret); `false` with `--no-ride`: Service leases at vipd's
    /// bare 3/2/1, no Secret.
    pub ride: bool,
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
            lease_shards: 0,
            ride: true,
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
                "--lease-shards" => {
                    o.lease_shards = u16::try_from(whole_number(a, value()?, 1..=1024)?)?
                }
                "--no-ride" => o.ride = false,
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
/// schedule or what runs (the fault list, the Service count, the nodes, the fence, the
/// ride-through configuration).
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
    if o.lease_shards > 0 {
        c.push_str(&format!(" --lease-shards {}", o.lease_shards));
    }
    if !o.ride {
        c.push_str(" --no-ride");
    }
    c
}
