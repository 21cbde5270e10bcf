//! [`Ctx`]: a running lab with HTTP backends on every node, the vipd binary, and the VIPs and
//! Leases of a failover run (control-plane VIP, Service VIP, both).

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use xtask::lab::{self, ArpWatcher, Lab, LabOptions, LabProcess, MacAddr, NODES};

use super::api::{self, lease_path};
use super::{
    LEASE_NAMESPACE, SAMPLE_INTERVAL, SERVICE_NAME, SERVICE_VIP, SERVICES_LEASE_NAME, VIP,
};

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
    /// Freeze trials thaw the holder this long after the event (`--freeze-ms`); `None`: 3 s
    /// after the takeover.
    pub freeze_for: Option<Duration>,
    /// vipd in routing-table mode (`--routed`, [`Ctx::enable_routed`]).
    pub routed: bool,
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
            freeze_for: None,
            routed: false,
        })
    }

    /// The VIP becomes a LoadBalancer Service's for the rest of the run: Node objects for
    /// the lab nodes (the peer membership), with `ride` the key Secret `vipd-peer-key`, and
    /// the Service [`SERVICE_NAME`] at 192.0.2.10; vipd runs in Services mode
    /// ([`start_vipd`](super::cluster::start_vipd)).
    ///
    /// # Errors
    /// When an object cannot be created.
    pub fn enable_service(&mut self, ride: bool) -> Result<()> {
        self.create_service_objects(ride, &[IpAddr::V4(VIP)])?;
        self.service = Some(ride);
        Ok(())
    }

    /// The control-plane VIP and a Service VIP held together for the rest of the run: Node
    /// objects for the lab nodes and the Service [`SERVICE_NAME`] at [`SERVICE_VIP`]; vipd
    /// runs with `cp_enable` and `svc_enable` under the global Services Lease
    /// ([`start_vipd`](super::cluster::start_vipd)).
    ///
    /// # Errors
    /// When an object cannot be created.
    pub fn enable_cp_and_service(&mut self) -> Result<()> {
        self.create_service_objects(false, &[IpAddr::V4(SERVICE_VIP)])?;
        self.cp_and_service = true;
        Ok(())
    }

    /// The Service VIPs are routed for the rest of the run (`--routed`): the LoadBalancer
    /// Service [`SERVICE_NAME`] at `addrs` (the routed VIPs, on no lab segment), vipd in
    /// Services mode with per-Service leases and `vip_routingtable=true`
    /// ([`start_vipd`](super::cluster::start_vipd)). The routers and the nodes' BIRDs are
    /// the caller's (`bench::failover::routed`).
    ///
    /// # Errors
    /// When an object cannot be created.
    pub fn enable_routed(&mut self, addrs: &[IpAddr]) -> Result<()> {
        self.create_service_objects(false, addrs)?;
        self.service = Some(false);
        self.routed = true;
        Ok(())
    }

    /// Node objects for the lab nodes, with `ride` the key Secret `vipd-peer-key`, and the
    /// LoadBalancer Service [`SERVICE_NAME`] at `addrs`.
    fn create_service_objects(&self, ride: bool, addrs: &[IpAddr]) -> Result<()> {
        self.lab.register_nodes(&NODES)?;
        if ride {
            self.lab.create_peer_key_secret()?;
        }
        api::create(
            &self.lab,
            "/api/v1/namespaces/default/services",
            &api::service_json_ips(SERVICE_NAME, addrs),
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

    /// Prints `what` (indented) when the run is verbose.
    pub fn say(&self, what: impl AsRef<str>) {
        if self.verbose {
            eprintln!("    {}", what.as_ref());
        }
    }

    /// The lab node with `mac`, or the MAC itself when no node has it.
    pub fn node_of(&self, mac: &MacAddr) -> String {
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

    /// For each of `vips`, the nodes whose eth0 carries it and whose fence lets it answer
    /// (one `ip addr` per node, and the node's fence tables where it carries one of them:
    /// a Service VIP's second-line address stays on a killed or frozen holder's eth0,
    /// inert, [`lab::FenceView`]; an address the fence does not name is listed again after
    /// the fence's read, [`lab::FenceView::answers_listed_before`]).
    ///
    /// # Errors
    /// When `ip addr` fails.
    pub fn holders_of(&self, vips: &[Ipv4Addr]) -> Result<Vec<Vec<String>>> {
        let mut out = vec![Vec::new(); vips.len()];
        for n in NODES {
            let addrs = self.lab.addresses(n, lab::ETH)?;
            let mut fence: Option<lab::FenceView> = None;
            // The node's addresses after the fence's read, listed once if needed.
            let relisted: std::cell::OnceCell<Option<Vec<IpAddr>>> = std::cell::OnceCell::new();
            for (vip, holders) in vips.iter().zip(out.iter_mut()) {
                let ip = IpAddr::V4(*vip);
                if !addrs.iter().any(|a| a.addr == ip) {
                    continue;
                }
                let view = fence.get_or_insert_with(|| lab::FenceView::read(&self.lab, n));
                let still_listed = || {
                    relisted
                        .get_or_init(|| {
                            let now = self.lab.addresses(n, lab::ETH).ok()?;
                            Some(now.into_iter().map(|a| a.addr).collect())
                        })
                        .as_ref()
                        .is_none_or(|now| now.contains(&ip))
                };
                if view.answers_listed_before(ip, still_listed) {
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
        wait_stable(limit, stable_for, || {
            let h = self.holders_of(&vips)?;
            let one = match h.first().map(Vec::as_slice) {
                Some([one]) if h.iter().all(|x| x == std::slice::from_ref(one)) => {
                    Some(one.clone())
                }
                _ => None,
            };
            Ok((one, format!("holders: {h:?}")))
        })
        .with_context(|| format!("no stable single holder of {vips:?}"))
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
    /// `tcp://VIP:6443`) for `vip` in ns client ([`lab::PROBE_TIMEOUT`]); a new TCP
    /// connection per request.
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn start_probe(&self, vip: IpAddr) -> Result<LabProcess> {
        Ok(self.lab.spawn(
            "client",
            &self.vipd,
            &[
                "probe",
                &if self.lb {
                    format!("tcp://{}", SocketAddr::new(vip, 6443))
                } else {
                    format!("http://{}/", SocketAddr::new(vip, 80))
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

/// Polls `current` every 50 ms until it has named the same node for `stable_for`, and
/// returns that node. `current` gives the node that alone holds what is watched (`None`:
/// none or several) and what it saw, for the error.
///
/// # Errors
/// When `current` fails, or after `limit` without a stable node (naming what `current` saw
/// last).
pub fn wait_stable(
    limit: Duration,
    stable_for: Duration,
    mut current: impl FnMut() -> Result<(Option<String>, String)>,
) -> Result<String> {
    let t0 = Instant::now();
    let mut since: Option<(String, Instant)> = None;
    loop {
        let (one, seen) = current()?;
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
            bail!("none stable for {stable_for:?} after {limit:?} ({seen})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
