//! Control-plane load balancing (kube-vip's `lb_enable` / `--enableLoadBalancer`), with
//! nftables instead of IPVS.
//!
//! The node holding the control-plane lease spreads new TCP connections to
//! `VIP:lb_port` round-robin over the API servers of all healthy control-plane nodes
//! (`InternalIP:port`), masquerading them so the replies come back through it:
//!
//! * Backends ([`backends`]): Ready Nodes labelled `node-role.kubernetes.io/control-plane`,
//!   their `InternalIP` addresses of the VIP's family (kube-vip's node watcher), from the
//!   process's Node cache ([`crate::nodes::NodeCache`]: one watch of every Node on every
//!   node, shared with the other readers), so a new holder knows them at once.
//! * Health ([`health`]): while leading, an HTTPS `GET /readyz` to every backend each
//!   second (an answer below 500 within 500 ms is healthy; a backend that accepts TCP and
//!   never answers fails, kube-vip #890); 3 failures take one out, 2 successes bring it
//!   back.
//! * Rules ([`nft`]): `table ip vipd_lb` (and `ip6 vipd_lb` for IPv6 VIPs), only on the
//!   holder. Installed when the term starts (replacing a stale table), updated in one
//!   transaction per backend change (established connections keep their backend), and
//!   deleted when the lease is lost or vipd stops, *before* the lease is released: the
//!   elector's release waits for this task's acknowledgement as well as the VIP holder's.
//!   A stale table is deleted at start. No other table is touched.
//! * Only the control plane: kube-vip starts its IPVS balancer in the control-plane VIP
//!   service only, never for Services; with `cp_enable=false` (Harvester's guest values)
//!   `lb_enable` is accepted and does nothing.
//! * Forwarding (`lb_fwdmethod`, [`Forwarding`]): see its docs for what `local` and
//!   `masquerade` mean here and why the other IPVS methods are refused.
//!
//! Kernel needs: nf_tables with NAT (`nft_nat`, `nft_masq`, `nft_numgen`, `nft_fib`,
//! conntrack), changed through netlink from vipd's own process (no `nft` binary); IPv4
//! forwarding, which vipd switches on when it
//! installs the rules, as kube-vip does (Kubernetes nodes have it on already).

pub mod backends;
pub mod health;
pub mod metrics;
pub mod nft;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::election::LeaderState;
use crate::net::nft::nl::{self, Batch, Mode, Transport};
use backends::{Candidate, Health};
use health::Prober;
use nft::{Family, Ruleset};

/// The control-plane load balancer's settings (`lb_enable` set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancerConfig {
    /// `lb_port` / `--lbPort` (default 6443): the frontend port on the VIP.
    pub lb_port: u16,
    /// `lb_fwdmethod` / `--lbForwardingMethod` (default `local`).
    pub forwarding: Forwarding,
}

/// `lb_port`'s default (kube-vip's `--lbPort`): 6443.
pub const DEFAULT_LB_PORT: u16 = 6443;

/// `lb_fwdmethod` (kube-vip's `--lbForwardingMethod`, default `local`).
///
/// kube-vip hands the method to IPVS. Its default `local` is IPVS's `LOCALNODE` forwarding,
/// whose transmitter delivers every connection to the holder's own stack whichever backend
/// the scheduler picked: with `lb_port == port` kube-vip's default therefore serves every
/// connection from the holder's API server and spreads nothing, and it restarts when the
/// holder has no healthy local backend. vipd implements what the option is set for (the
/// k3s and Harvester guides enable it to spread API traffic): both `local` and
/// `masquerade` DNAT new connections round-robin to the healthy backends and masquerade
/// them (IPVS `masquerade` is NAT; the source rewrite makes replies return through the
/// holder on a flat network, where IPVS NAT needs the backends to route through the
/// director). `tunnel`, `directroute` and `bypass` are refused: they need the backends to
/// accept packets for the VIP (IPIP decapsulation or the VIP on a non-ARPing loopback),
/// which nftables on the holder cannot arrange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Forwarding {
    /// `local` (default): DNAT + masquerade (see above).
    #[default]
    Local,
    /// `masquerade`: DNAT + masquerade.
    Masquerade,
}

impl Forwarding {
    /// Parses a `lb_fwdmethod` value (case-insensitive, as kube-vip).
    ///
    /// # Errors
    /// Why the value is refused: IPVS-only methods and unknown values.
    pub fn parse(s: &str) -> Result<Forwarding, String> {
        match s.to_ascii_lowercase().as_str() {
            "local" => Ok(Forwarding::Local),
            "masquerade" => Ok(Forwarding::Masquerade),
            m @ ("tunnel" | "directroute" | "bypass") => Err(format!(
                "IPVS forwarding method {m:?} is not supported by vipd's nftables load balancer: \
                 it needs the backends to accept packets addressed to the VIP (tunnel \
                 decapsulation or the VIP on their loopback); use local (the default) or masquerade"
            )),
            _ => Err("expected local (the default) or masquerade".to_string()),
        }
    }

    /// The value as kube-vip spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Forwarding::Local => "local",
            Forwarding::Masquerade => "masquerade",
        }
    }
}

/// What the load balancer forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbConfig {
    /// The control-plane VIPs (`address`).
    pub vips: Vec<IpAddr>,
    /// Frontend port (`lb_port`).
    pub lb_port: u16,
    /// Backend port (`port`, the API server's).
    pub port: u16,
    /// `lb_fwdmethod`.
    pub forwarding: Forwarding,
}

impl LbConfig {
    /// The families that have a VIP.
    fn families(&self) -> Vec<Family> {
        Family::ALL
            .into_iter()
            .filter(|f| self.vips.iter().any(|v| Family::of(*v) == *f))
            .collect()
    }

    /// The rulesets for backends `in_set`: one per family with a VIP, with the backends of
    /// that family. Pure.
    pub fn rulesets(&self, in_set: &[IpAddr]) -> Vec<Ruleset> {
        self.families()
            .into_iter()
            .map(|family| Ruleset {
                family,
                vips: self
                    .vips
                    .iter()
                    .copied()
                    .filter(|v| Family::of(*v) == family)
                    .collect(),
                lb_port: self.lb_port,
                port: self.port,
                backends: in_set
                    .iter()
                    .copied()
                    .filter(|b| Family::of(*b) == family)
                    .collect(),
            })
            .collect()
    }
}

/// A failed change of the load balancer's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("load balancer: `{command}` failed: {detail}")]
pub struct LbError {
    /// The commands, in `nft` syntax.
    pub command: String,
    /// The kernel's answer (each refused command with its errno), or why it could not be
    /// asked.
    pub detail: String,
}

/// The kernel side of the load balancer. Implemented by [`NftLbKernel`]; tests use a fake.
pub trait LbKernel: Send + Sync + 'static {
    /// Commits one nf_tables transaction.
    ///
    /// # Errors
    /// The kernel's answer as text (nothing changed).
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<(), String>>;

    /// Makes sure the node forwards `family` packets; `Ok(true)` when it switched it on.
    ///
    /// # Errors
    /// Why the sysctl cannot be read or written.
    fn enable_forwarding(&self, family: Family) -> Result<bool, String>;
}

/// [`LbKernel`] through nf_tables netlink ([`nl`], in the calling task's network
/// namespace) and `/proc/sys`.
#[derive(Debug, Clone)]
pub struct NftLbKernel {
    transport: Arc<dyn Transport>,
}

impl Default for NftLbKernel {
    fn default() -> Self {
        NftLbKernel {
            transport: Arc::new(nl::Kernel),
        }
    }
}

impl NftLbKernel {
    /// Changes the kernel's tables.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LbKernel for NftLbKernel {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            nl::send_with(self.transport.as_ref(), batch.clone(), Mode::Commit)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn enable_forwarding(&self, family: Family) -> Result<bool, String> {
        let path = match family {
            Family::Ip => "/proc/sys/net/ipv4/ip_forward",
            Family::Ip6 => "/proc/sys/net/ipv6/conf/all/forwarding",
        };
        let now = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
        if now.trim() == "1" {
            return Ok(false);
        }
        std::fs::write(path, "1").map_err(|e| format!("writing 1 to {path}: {e}"))?;
        Ok(true)
    }
}

/// Checks, without changing anything (the transaction is validated by the kernel and
/// aborted, [`Mode::Check`]), that this node can hold the load balancer's IPv4 rules
/// (nf_tables NAT, fib, numgen map, masquerade): for `vipd preflight`.
///
/// # Errors
/// [`LbError`] with the kernel's answer.
pub async fn check() -> Result<(), LbError> {
    let rs = Ruleset {
        family: Family::Ip,
        vips: vec![IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 10))],
        lb_port: DEFAULT_LB_PORT,
        port: DEFAULT_LB_PORT,
        backends: vec![IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 11))],
    };
    let b = nft::install_batch(&rs);
    nl::send_with(&nl::Kernel, b.clone(), Mode::Check)
        .await
        .map_err(|e| LbError {
            command: b.text(),
            detail: e.to_string(),
        })
}

/// The installed tables, by family, and the transactions that bring them to a wanted state.
#[derive(Debug)]
pub(crate) struct Tables<K> {
    kernel: K,
    installed: BTreeMap<Family, Ruleset>,
}

impl<K: LbKernel> Tables<K> {
    pub(crate) fn new(kernel: K) -> Self {
        Tables {
            kernel,
            installed: BTreeMap::new(),
        }
    }

    /// Whether no table is installed (as far as this process knows).
    pub(crate) fn is_empty(&self) -> bool {
        self.installed.is_empty()
    }

    async fn run(&self, b: Batch) -> Result<(), LbError> {
        self.kernel.apply(&b).await.map_err(|detail| LbError {
            command: b.text(),
            detail,
        })
    }

    /// Brings the tables to `want`: a new family is installed (forwarding switched on
    /// first), a changed backend list is one update, a family no longer wanted is removed.
    pub(crate) async fn sync(&mut self, want: &[Ruleset]) -> Result<(), LbError> {
        for rs in want {
            match self.installed.get(&rs.family) {
                Some(old) if old == rs => {}
                Some(old)
                    if old.vips == rs.vips && old.port == rs.port && old.lb_port == rs.lb_port =>
                {
                    self.run(nft::update_batch(rs)).await?;
                    info!(family = %rs.family, backends = ?rs.backends, "load balancer: backends changed");
                    self.installed.insert(rs.family, rs.clone());
                }
                _ => {
                    match self.kernel.enable_forwarding(rs.family) {
                        Ok(true) => {
                            info!(family = %rs.family, "load balancer: switched on packet forwarding (as kube-vip does)")
                        }
                        Ok(false) => {}
                        Err(e) => {
                            warn!(family = %rs.family, error = %e, "load balancer: cannot switch on packet forwarding; connections to other nodes will fail")
                        }
                    }
                    self.run(nft::install_batch(rs)).await?;
                    info!(family = %rs.family, table = %format!("{} {}", rs.family, nft::TABLE), backends = ?rs.backends, "load balancer: rules installed");
                    self.installed.insert(rs.family, rs.clone());
                }
            }
        }
        let gone: Vec<Family> = self
            .installed
            .keys()
            .copied()
            .filter(|f| !want.iter().any(|r| r.family == *f))
            .collect();
        for f in gone {
            self.run(nft::remove_batch(f)).await?;
            info!(family = %f, "load balancer: rules removed");
            self.installed.remove(&f);
        }
        Ok(())
    }

    /// Deletes vipd's load-balancer tables of `families`, installed or not (a stale one
    /// from an earlier run).
    pub(crate) async fn remove(&mut self, families: &[Family]) -> Result<(), LbError> {
        for f in families {
            self.run(nft::remove_batch(*f)).await?;
            self.installed.remove(f);
        }
        Ok(())
    }
}

/// How often a failed rule change is retried: 1 s.
const RETRY: Duration = Duration::from_secs(1);

/// The load balancer's task state.
pub(crate) struct Lb<K, P> {
    pub(crate) cfg: LbConfig,
    pub(crate) tables: Tables<K>,
    pub(crate) prober: Arc<P>,
    pub(crate) metrics: Option<Arc<metrics::LbMetrics>>,
}

fn is_leading(s: &LeaderState) -> Option<u64> {
    match s {
        LeaderState::Leading { term, .. } => Some(*term),
        LeaderState::Following { .. } => None,
    }
}

impl<K: LbKernel, P: Prober> Lb<K, P> {
    /// Follows leadership until `stop`: rules while leading, none otherwise. Each of the
    /// VIP holder's acknowledgements of a dropped term (`holder_dropped`) is passed on to
    /// the elector (`dropped`) once the rules are gone too, so the lease is released only
    /// after both. At `stop` the tables are deleted.
    pub(crate) async fn run(
        mut self,
        mut candidates: watch::Receiver<Vec<Candidate>>,
        mut state: watch::Receiver<LeaderState>,
        mut holder_dropped: watch::Receiver<u64>,
        dropped: watch::Sender<u64>,
        stop: CancellationToken,
    ) {
        let families = self.cfg.families();
        if let Err(e) = self.tables.remove(&Family::ALL).await {
            warn!(error = %e, "load balancer: cannot remove a stale table at start");
        }
        let mut health = Health::default();
        let relevant = |cs: &[Candidate]| -> Vec<Candidate> {
            cs.iter()
                .filter(|c| families.contains(&Family::of(c.addr)))
                .cloned()
                .collect()
        };
        health.set_candidates(&relevant(&candidates.borrow_and_update()));
        let (targets_tx, _) = watch::channel(health.addresses());
        let (results_tx, mut results_rx) = mpsc::channel(4);
        let mut checker: Option<(CancellationToken, JoinHandle<()>)> = None;
        let mut term: Option<u64> = None;
        let mut pending_ack: Option<u64> = None;
        let mut dirty = true;
        let mut failing = false;
        let (mut state_open, mut ack_open, mut nodes_open) = (true, true, true);
        let mut retry = tokio::time::interval(RETRY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                r = state.changed(), if state_open => {
                    let now = match r {
                        Ok(()) => is_leading(&state.borrow_and_update()),
                        Err(_) => {
                            state_open = false;
                            None
                        }
                    };
                    if now != term {
                        if let Some((s, _)) = checker.take() {
                            s.cancel();
                        }
                        if now.is_some() {
                            health.reset();
                            checker = Some(self.start_checker(&targets_tx, &results_tx));
                        }
                        term = now;
                        dirty = true;
                    }
                }
                r = holder_dropped.changed(), if ack_open => match r {
                    Ok(()) => pending_ack = Some(*holder_dropped.borrow_and_update()),
                    Err(_) => ack_open = false,
                },
                r = candidates.changed(), if nodes_open => match r {
                    Ok(()) => {
                        let cs = relevant(&candidates.borrow_and_update());
                        if health.set_candidates(&cs) {
                            dirty = true;
                        }
                        debug!(candidates = ?cs, "load balancer: control-plane nodes");
                        targets_tx.send_replace(health.addresses());
                    }
                    Err(_) => nodes_open = false,
                },
                Some(results) = results_rx.recv() => {
                    if term.is_some() && self.record(&mut health, results) {
                        dirty = true;
                    }
                }
                _ = retry.tick(), if dirty => {}
            }
            if dirty && self.apply(term.is_some(), &health, &mut failing).await {
                dirty = false;
            }
            if term.is_none()
                && self.tables.is_empty()
                && let Some(t) = pending_ack.take()
            {
                let _ = dropped.send(t);
            }
        }
        self.finish(checker.take(), pending_ack.take(), &dropped)
            .await;
    }

    /// Starts the health checker of a term: probes the addresses `targets` names, sends
    /// its results to `results`; stopped by cancelling the token returned with its task.
    fn start_checker(
        &self,
        targets: &watch::Sender<Vec<IpAddr>>,
        results: &mpsc::Sender<Vec<(IpAddr, health::CheckResult)>>,
    ) -> (CancellationToken, JoinHandle<()>) {
        let s = CancellationToken::new();
        let task = tokio::spawn(health::run(
            self.prober.clone(),
            targets.subscribe(),
            self.cfg.port,
            results.clone(),
            s.clone(),
        ));
        (s, task)
    }

    /// At stop: stops the health checker (`checker`), deletes the tables, and passes on a
    /// pending acknowledgement of a dropped term (`pending_ack`) to the elector (`dropped`).
    async fn finish(
        &mut self,
        checker: Option<(CancellationToken, JoinHandle<()>)>,
        pending_ack: Option<u64>,
        dropped: &watch::Sender<u64>,
    ) {
        if let Some((s, task)) = checker {
            s.cancel();
            let _ = task.await;
        }
        if let Some(m) = &self.metrics {
            m.backends([]);
        }
        match self.tables.remove(&Family::ALL).await {
            Ok(()) => info!("load balancer: rules removed (stopping)"),
            Err(e) => warn!(error = %e, "load balancer: cannot remove the rules at stop"),
        }
        if let Some(t) = pending_ack {
            let _ = dropped.send(t);
        }
    }

    /// Makes the tables match: the rulesets of the healthy backends while `leading`, none
    /// otherwise; updates the backend metrics. `true` when done; a failure is logged once
    /// per run of failures (`failing`) and retried by the caller.
    async fn apply(&mut self, leading: bool, health: &Health, failing: &mut bool) -> bool {
        let want = match leading {
            true => self.cfg.rulesets(&health.in_set()),
            false => Vec::new(),
        };
        match self.tables.sync(&want).await {
            Ok(()) => {
                if let Some(m) = &self.metrics {
                    m.backends(
                        health
                            .all()
                            .filter(|_| leading)
                            .map(|(a, n, up)| (n, a.to_string(), up)),
                    );
                }
                if std::mem::take(failing) {
                    info!("load balancer: rules can be changed again");
                }
                true
            }
            Err(e) if !*failing => {
                *failing = true;
                warn!(error = %e, "load balancer: cannot change the rules; retrying every second");
                false
            }
            Err(e) => {
                debug!(error = %e, "load balancer: still cannot change the rules");
                false
            }
        }
    }

    /// Records one round of health-check `results` (backend address, the check's result);
    /// `true` when a backend entered or left the set (logged, with the last failure's
    /// reason when it left).
    fn record(
        &self,
        health: &mut Health,
        results: Vec<(std::net::IpAddr, health::CheckResult)>,
    ) -> bool {
        let mut changed = false;
        for (addr, result) in results {
            if let Err(e) = &result {
                debug!(backend = %addr, port = self.cfg.port, error = %e, "load balancer: backend health check failed");
            }
            if let Some(now_in) = health.record(addr, result.is_ok()) {
                let node = health.node_of(addr).unwrap_or_default().to_string();
                match result {
                    Err(e) if !now_in => {
                        warn!(%node, backend = %addr, port = self.cfg.port, error = %e, "load balancer: backend failed its health checks, out of the set")
                    }
                    _ => {
                        info!(%node, backend = %addr, port = self.cfg.port, "load balancer: backend healthy, back in the set")
                    }
                }
                changed = true;
            }
        }
        changed
    }
}

/// Follows the control-plane Nodes (label [`backends::CONTROL_PLANE_LABEL`]) in the
/// process's Node cache `nodes` and publishes their candidate backends on `tx` once its
/// first list is in and after every change of them, until `stop` (or the cache's watch
/// stops). Nodes without the label are never candidates ([`backends::node_backends`]). A
/// failing watch is logged once by the cache and retried with back-off; the last list stays
/// published meanwhile.
pub(crate) async fn watch_candidates(
    nodes: crate::nodes::NodeCache,
    tx: watch::Sender<Vec<Candidate>>,
    stop: CancellationToken,
) {
    let mut changes = nodes.changes();
    tokio::select! {
        biased;
        _ = stop.cancelled() => return,
        listed = nodes.ready() => if !listed { return },
    }
    loop {
        // Seen before the cache is read: a change after the read wakes the next round.
        changes.borrow_and_update();
        let new = backends::node_backends(nodes.store().state().iter().map(|n| n.as_ref()));
        tx.send_if_modified(|cur| {
            let changed = *cur != new;
            *cur = new;
            changed
        });
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

/// The running load balancer of the control-plane holder.
pub(crate) struct Running {
    stop: CancellationToken,
    lb_task: JoinHandle<()>,
    nodes_task: JoinHandle<()>,
}

/// Starts the load balancer for the control-plane election: the task that follows the
/// control-plane Nodes in `nodes` and the task that follows `state`. Returns the [`Running`] parts and the `dropped` sender the VIP
/// holder must acknowledge on (the task passes each acknowledgement on to `dropped` once
/// its rules are gone).
pub(crate) fn start(
    cfg: LbConfig,
    nodes: crate::nodes::NodeCache,
    state: watch::Receiver<LeaderState>,
    dropped: watch::Sender<u64>,
    metrics: crate::obs::metrics::Metrics,
) -> (Running, watch::Sender<u64>) {
    info!(
        vips = ?cfg.vips,
        lb_port = cfg.lb_port,
        port = cfg.port,
        forwarding = cfg.forwarding.as_str(),
        "lb_enable: the control-plane VIP's holder spreads connections to VIP:lb_port over the control-plane nodes' API servers (nft list table ip vipd_lb)"
    );
    let stop = CancellationToken::new();
    let (cand_tx, cand_rx) = watch::channel(Vec::new());
    let nodes_task = tokio::spawn(watch_candidates(nodes, cand_tx, stop.clone()));
    let (holder_tx, holder_rx) = watch::channel(0u64);
    let lb = Lb {
        cfg,
        tables: Tables::new(NftLbKernel::new()),
        prober: Arc::new(health::HttpsProber::new()),
        metrics: Some(metrics.families()),
    };
    let lb_task = tokio::spawn(lb.run(cand_rx, state, holder_rx, dropped, stop.clone()));
    (
        Running {
            stop,
            lb_task,
            nodes_task,
        },
        holder_tx,
    )
}

impl Running {
    /// Stops the watch and the task, which deletes the tables.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        if let Err(e) = self.lb_task.await {
            warn!(error = %e, "load balancer task failed");
        }
        let _ = self.nodes_task.await;
    }
}

#[cfg(test)]
mod tests;
