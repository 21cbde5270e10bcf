//! The command line of `bench failover`.

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};

use super::scenario::Scenario;
use crate::args::parse_flags;
use crate::bench::harness::subject::{Subject, Timings, Vrrp};

/// Usage of `bench failover`.
pub const USAGE: &str = "usage: cargo xtask bench failover [options]

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
  --freeze-ms MS    freeze only: thaw the holder MS ms after the event, whether or not
                    another node took over (default: 3 s after the takeover); e.g. 800 with
                    --timings 0.6/0.4/0.2 thaws it while its 1 s address may still be
                    there, so whatever it commits at the thaw shows as two responders
  --routed          routing-table mode (issue 29): vipd (Services, svc_election=true,
                    vip_routingtable=true, the route fence) on every node with BIRD from
                    `vipd manifest bird`, BGP + BFD to a BIRD router with ECMP; the client
                    (in the router's namespace) opens new connections to a dual-stack
                    Service's routed VIPs 198.51.100.80 and 2001:db8:5::80; figures per
                    family (`vipd T routed:v4`, `:v6`) plus when the router dropped the old
                    holder's path and installed the new one's, and the ECMP spread
                    (scenarios graceful,kill,freeze,poweroff; timings 5/3/1 unless
                    --timings: vipd refuses elected routes under 3/2/1; vipd only, no idle
                    phase; not with --lb, --service, --ride, --cp-and-service or
                    --freeze-ms)
  --spread N        --routed: new connections per VIP of the ECMP spread, over static
                    routes on every node (default 300; 0 skips it)
  -v, --verbose     print progress of every trial";

/// New connections per VIP of the `--routed` ECMP spread, unless `--spread` says otherwise.
pub const DEFAULT_SPREAD: usize = 300;

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
    /// One node holds the control-plane VIP and a Service VIP ([`SERVICE_VIP`](crate::bench::harness::SERVICE_VIP)) before the
    /// event (`--cp-and-service`).
    pub cp_and_service: bool,
    /// Freeze only: thaw the holder this long after the event (`--freeze-ms`).
    pub freeze_for: Option<std::time::Duration>,
    /// Routing-table mode with BGP, BFD and ECMP (`--routed`).
    pub routed: bool,
    /// `--routed`: new connections per VIP of the ECMP spread (`--spread`; 0: none).
    pub spread: usize,
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
            freeze_for: None,
            routed: false,
            spread: DEFAULT_SPREAD,
        };
        let mut scenarios_given = false;
        let mut timings_given = false;
        let mut spread_given = false;
        parse_flags(args, USAGE, |a, value| {
            match a {
                "--scenario" | "--scenarios" => {
                    scenarios_given = true;
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
                    timings_given = true;
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
                "--freeze-ms" => {
                    let v = value()?;
                    let ms: u64 = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        anyhow!("invalid --freeze-ms value {v:?}: expected a positive number of milliseconds")
                    })?;
                    o.freeze_for = Some(std::time::Duration::from_millis(ms));
                }
                "--routed" => o.routed = true,
                "--spread" => {
                    spread_given = true;
                    let v = value()?;
                    o.spread = v.parse().map_err(|_| {
                        anyhow!("invalid --spread value {v:?}: expected a number of connections (0 skips the spread)")
                    })?;
                }
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
        if o.routed {
            o.check_routed(scenarios_given)?;
            // vipd refuses elected routes under leases shorter than the route's lifetime +
            // 2 s (3/2/1) and uses 5/3/1 when none is given: one row, not two equal ones.
            if !timings_given {
                o.timings = vec![Timings::parse("5/3/1")?];
            }
        } else if spread_given {
            bail!("--spread measures the ECMP spread of --routed: add --routed");
        }
        Ok(o)
    }

    /// `--routed`: refuses what it cannot be combined with, and runs the scenarios it has
    /// ([`Scenario::ROUTED`]) unless `--scenario` named some.
    fn check_routed(&mut self, scenarios_given: bool) -> Result<()> {
        let other = [
            (self.service == Some(false), "--service"),
            (self.service == Some(true), "--ride"),
            (self.lb, "--lb"),
            (self.cp_and_service, "--cp-and-service"),
            (self.freeze_for.is_some(), "--freeze-ms"),
        ];
        if let Some((_, flag)) = other.iter().find(|(set, _)| *set) {
            bail!(
                "--routed cannot be combined with {flag}: it runs one dual-stack Service in routing-table mode"
            );
        }
        if !self.vipd {
            bail!("--routed measures vipd only: use --impl vipd (or both)");
        }
        if !scenarios_given {
            self.scenarios = Scenario::ROUTED.to_vec();
        }
        if let Some(s) = self
            .scenarios
            .iter()
            .find(|s| !Scenario::ROUTED.contains(s))
        {
            bail!(
                "--routed runs graceful, kill, freeze and poweroff, not {}",
                s.name()
            );
        }
        Ok(())
    }

    /// What runs on the nodes, in the order the trials run them: the vipd timings (labelled
    /// with the run's VIP mode), then the keepalived variants (only for the control-plane
    /// VIP alone).
    pub fn subjects(&self) -> Vec<Subject> {
        let mut s = Vec::new();
        if self.vipd {
            let suffix = match self.service {
                _ if self.routed => " routed",
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
        if self.service.is_none() && !self.cp_and_service && !self.routed {
            s.extend(self.keepalived.iter().copied().map(Subject::Keepalived));
        }
        s
    }
}
