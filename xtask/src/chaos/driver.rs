//! The fault driver: [`Chaos`], the lab of a soak with vipd on the nodes, the Services it
//! creates, edits and deletes, and the faults it injects and heals (recorded on the
//! [`Timeline`] the auditor judges).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use xtask::lab::{self, ArpRoundProber, ControlPlaneProcess, Lab, LabProcess, MacAddr, Signal};

use super::audit::{
    Desired, Disturbance, FaultKind, ObservedService, Timeline, Violation, ViolationKind, secs, v,
};
use super::{
    CP_TIMINGS, NAMESPACE, PARTITION_TABLE, TOUCH_ANNOTATION, Timings, pool_address, svc_timings,
};

/// State of one Service the soak keeps.
#[derive(Debug, Clone)]
pub(super) struct Svc {
    /// Its address.
    pub(super) addr: Ipv4Addr,
    /// Not announceable (an ignored annotation): its address must stay silent.
    pub(super) ignored: bool,
    touch: u64,
}

/// The lab of a soak and everything the driver did in it (the auditor's timeline
/// included).
pub(super) struct Chaos {
    /// The lab.
    pub(super) lab: Lab,
    /// vipd binary.
    pub(super) vipd: PathBuf,
    /// The nodes that run vipd.
    pub(super) nodes: Vec<String>,
    /// The running vipd of each node.
    pub(super) procs: BTreeMap<String, LabProcess>,
    /// Every vipd process ever started, with its log, for the log scan at the end.
    pub(super) logs: Vec<(String, PathBuf)>,
    /// The Services the soak keeps, by name.
    pub(super) services: BTreeMap<String, Svc>,
    /// Number of the next Service created (`chaos-N`).
    pub(super) next_svc: usize,
    /// What the auditor judges: disturbances and desired addresses over time.
    pub(super) tl: Timeline,
    /// The start of the soak: times on the timeline count from it.
    pub(super) epoch: Instant,
    /// Faults injected, by kind.
    pub(super) faults: BTreeMap<FaultKind, u64>,
    /// Violations found so far.
    pub(super) violations: Vec<Violation>,
    /// Notes for the report.
    pub(super) notes: Vec<String>,
    /// The nodes by the MAC of their eth0.
    pub(super) macs: BTreeMap<MacAddr, String>,
    /// The ARP prober of the `client` namespace, once started.
    pub(super) prober: Option<ArpRoundProber>,
    /// Print progress.
    pub(super) verbose: bool,
    /// vipd runs with `vip_nftfence=true` ([`Options::nft_fence`](super::options::Options::nft_fence));
    /// otherwise the option is left at vipd's default.
    pub(super) nft_fence: bool,
    /// vipd runs with `svc_leaseshards` set to this; 0: not set (one lease per Service).
    pub(super) lease_shards: u16,
    /// The generated manifests' configuration: Service leases [`SVC_TIMINGS`](super::SVC_TIMINGS),
    /// ride-through at its default (on), the key Secret created; `false` (`--no-ride`):
    /// Service leases at vipd's bare 3/2/1, no Secret.
    pub(super) ride: bool,
}

impl Chaos {
    /// Time since the start of the soak.
    pub(super) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn say(&self, s: impl AsRef<str>) {
        if self.verbose {
            eprintln!("  [{:>7.1} s] {}", self.now().as_secs_f64(), s.as_ref());
        }
    }

    /// The node whose eth0 has `mac`, or the MAC itself.
    pub(super) fn node_of(&self, mac: MacAddr) -> String {
        self.macs
            .get(&mac)
            .cloned()
            .unwrap_or_else(|| mac.to_string())
    }

    /// The Service lease timings of this run.
    pub(super) fn svc_timings(&self) -> Timings {
        svc_timings(self.ride)
    }

    /// The longer of the control-plane and the Service answer bounds: how long the lab is
    /// left quiet for the auditor to judge every address, and how long a released address
    /// is not reused.
    pub(super) fn longest_bound(&self) -> Duration {
        CP_TIMINGS
            .answer_bound()
            .max(self.svc_timings().answer_bound())
    }

    /// The Node objects (the peer membership) and, with ride-through, the peer key Secret,
    /// as a cluster deployed from `vipd manifest rbac` has them.
    pub(super) fn create_cluster_objects(&self) -> Result<()> {
        let nodes: Vec<&str> = self.nodes.iter().map(String::as_str).collect();
        self.lab.register_nodes(&nodes)?;
        if self.ride {
            self.lab.create_peer_key_secret()?;
        }
        Ok(())
    }

    /// Starts vipd on `node` in control-plane and Services mode, configured as the
    /// generated manifests do ([`Chaos::ride`], [`Chaos::nft_fence`]).
    pub(super) fn start_vipd(&mut self, node: &str) -> Result<()> {
        let kubeconfig = self.lab.kubeconfig(node)?.to_string_lossy().into_owned();
        let svc = self.svc_timings();
        let [cl, cr, cp, sl, sr, sp] = [
            CP_TIMINGS.lease,
            CP_TIMINGS.renew,
            CP_TIMINGS.retry,
            svc.lease,
            svc.renew,
            svc.retry,
        ]
        .map(|x| x.to_string());
        let vip = lab::CONTROL_PLANE_VIP.to_string();
        let mut env: Vec<(&str, &str)> = vec![
            ("cp_enable", "true"),
            ("vip_leaderelection", "true"),
            ("address", &vip),
            ("svc_enable", "true"),
            ("svc_election", "true"),
            ("vip_arp", "true"),
            ("vip_interface", lab::ETH),
            ("vip_nodename", node),
            ("k8s_config_file", &kubeconfig),
            ("vip_leaseduration", &cl),
            ("vip_renewdeadline", &cr),
            ("vip_retryperiod", &cp),
            ("svc_leaseduration", &sl),
            ("svc_renewdeadline", &sr),
            ("svc_retryperiod", &sp),
            ("prometheus_server", ""),
            ("vip_loglevel", "info"),
        ];
        // svc_ridethrough is never set (its default follows the Service timings); the
        // nftables fence only with --nft-fence, otherwise at vipd's default.
        if self.nft_fence {
            env.push(("vip_nftfence", "true"));
        }
        let shards = self.lease_shards.to_string();
        if self.lease_shards > 0 {
            env.push(("svc_leaseshards", &shards));
        }
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
        let bound = self.longest_bound();
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

    /// From `at` on, `addr` is desired (announced by some node) for Service `owner`.
    pub(super) fn desire(&mut self, addr: Ipv4Addr, owner: &str, at: Duration) {
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

    /// Puts a Service change of `kind` on `name` (touching `addrs`) on the timeline.
    pub(super) fn record_svc(
        &mut self,
        kind: FaultKind,
        name: &str,
        start: Duration,
        addrs: Vec<Ipv4Addr>,
    ) {
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

    /// Creates Service `name` at `addr` and records it.
    pub(super) fn create_service(&mut self, name: &str, addr: Ipv4Addr) -> Result<()> {
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

    /// Merge-patches Service `name` with `patch`.
    pub(super) fn patch_service(&self, name: &str, patch: serde_json::Value) -> Result<()> {
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
    pub(super) fn check_alive(&mut self) -> Result<()> {
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

    /// Runs the nftables `script` in `node`'s namespace.
    pub(super) fn nft(&self, node: &str, script: &str) -> Result<()> {
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
    pub(super) fn episode(
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
            self.longest_bound() + Duration::from_millis(rng.u64(500..4000))
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

    /// GET of the list at `path` as JSON; `what` names the objects in errors (plural, singular).
    fn list(&self, path: &str, what: (&str, &str)) -> Result<serde_json::Value> {
        let r = self.api("GET", path, None)?;
        if r.status != 200 {
            bail!("list {}: HTTP {}: {}", what.0, r.status, r.body);
        }
        serde_json::from_str(&r.body).with_context(|| format!("{} list JSON", what.1))
    }

    /// Every Service as the API server has it.
    pub(super) fn observed_services(&self) -> Result<Vec<ObservedService>> {
        let j = self.list(
            &format!("/api/v1/namespaces/{NAMESPACE}/services"),
            ("Services", "Service"),
        )?;
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

    /// Names of the Leases in the Services' namespace.
    pub(super) fn lease_names(&self) -> Result<Vec<String>> {
        let j = self.list(
            &format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"),
            ("leases", "lease"),
        )?;
        Ok(j["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    /// (pid, VmRSS KiB) of each node's vipd.
    pub(super) fn rss(&self) -> BTreeMap<String, (i32, u64)> {
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

    /// Whether the prober's last round saw exactly one MAC for every announceable address
    /// and the control-plane VIP.
    pub(super) fn answered_all(&self) -> bool {
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
