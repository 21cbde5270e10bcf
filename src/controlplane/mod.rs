//! The control-plane VIP: one Lease (`vip_leasename` in `cp_namespace`), its VIPs, and the
//! health check of the node's own API server (scenario S10). [`start`] runs the election
//! and the VIP holder (and with `enable_node_labeling` the holder's Node label,
//! [`crate::nodes::label`]); [`Running::stop`] drops the VIPs, then releases the Lease.

pub mod lb;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::election::kube::KubeLeaseClient;
use crate::election::local::LocalLeaseClient;
use crate::election::{Elector, Gates, LeaseClient};
use crate::holder::{HolderConfig, VipHolder, VipSpec};
use crate::net::route_kernel::{NoAnnouncer, RouteKernel, RoutedAddressKernel};
use crate::net::{Announcer, CachedKernel, Kernel, NetlinkKernel, RawAnnouncer, Vip};
use crate::obs::readiness::Readiness;

/// What the control-plane wing reads of the node's configuration (composed by
/// `crate::config::Config::controlplane`). Each field names the option it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `vip_nodename`: this node's name, never empty.
    pub node_name: String,
    /// `vip_interface`; `None`: chosen per VIP.
    pub interface: Option<String>,
    /// `address`: the control-plane VIPs.
    pub addresses: Vec<IpAddr>,
    /// `vip_subnet`: prefix lengths of VIPs.
    pub vip_subnet: crate::net::VipSubnet,
    /// `port`: the API server port (health checks, load balancer backends).
    pub port: u16,
    /// `vip_arpRate`: gratuitous ARP repeat interval.
    pub arp_rate: std::time::Duration,
    /// `vip_leasename`, `cp_namespace`, `vip_leaseduration`/`renewdeadline`/`retryperiod`.
    pub lease: crate::lease::LeaseConfig,
    /// `enable_node_labeling`: label the holder's Node `kube-vip.io/has-ip`.
    pub enable_node_labeling: bool,
    /// `lb_enable` with `lb_port`, `lb_fwdmethod`; `None`: no load balancing.
    pub load_balancer: Option<lb::LoadBalancerConfig>,
}

/// Why the control-plane configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// A control-plane VIP is a node's own address (`status.addresses`).
    #[error("address {address} is node {node}'s own address and cannot be the control-plane VIP")]
    NodeAddress {
        /// The VIP from `address`.
        address: IpAddr,
        /// The node whose address it is.
        node: String,
    },
    /// A control-plane VIP is the network or broadcast address of a subnet on its interface
    /// ([`crate::net::vip_subnet_edge`]): hosts on the segment do not send unicast to it.
    #[error(
        "address {address} is the {edge} of {network}/{prefix} on {interface} (hosts on the \
         segment do not send unicast to it, so the VIP would be unreachable); choose a host \
         address of that subnet for address (--address)"
    )]
    SubnetEdge {
        /// The VIP from `address`.
        address: IpAddr,
        /// Network or broadcast address.
        edge: crate::net::SubnetEdge,
        /// The subnet's network address.
        network: IpAddr,
        /// The subnet's prefix length.
        prefix: u8,
        /// The VIP's interface (`vip_interface`, else the one chosen for it).
        interface: String,
    },
}

/// The control-plane VIPs with their prefix (`vip_subnet`) and interface.
pub(crate) fn control_plane_vips(cfg: &Settings) -> Vec<VipSpec> {
    cfg.addresses
        .iter()
        .map(|a| VipSpec {
            vip: Vip {
                addr: *a,
                prefix: match a {
                    IpAddr::V4(_) => cfg.vip_subnet.v4,
                    IpAddr::V6(_) => cfg.vip_subnet.v6,
                },
            },
            interface: cfg.interface.clone(),
            not_after: None,
        })
        .collect()
}

/// The network / broadcast rule ([`crate::net::vip_subnet_edge`]) for one control-plane
/// VIP: `spec` with its own prefix against `connected`, the subnets (address, prefix) of the
/// node's own addresses on `interface`, the VIP's interface. Pure.
///
/// # Errors
/// [`ControlPlaneError::SubnetEdge`] naming the address, the subnet and the interface.
pub(crate) fn check_subnet_edge(
    spec: &VipSpec,
    interface: &str,
    connected: &[(IpAddr, u8)],
) -> Result<(), ControlPlaneError> {
    let address = spec.vip.addr;
    match crate::net::vip_subnet_edge(address, spec.vip.prefix, connected) {
        None => Ok(()),
        Some((edge, prefix)) => Err(ControlPlaneError::SubnetEdge {
            address,
            edge,
            network: crate::net::network_of(address, prefix),
            prefix,
            interface: interface.to_string(),
        }),
    }
}

/// [`check_subnet_edge`] for every control-plane VIP against the subnets of its interface
/// (`vip_interface`, else the one the kernel chooses for it), read from `kernel`: the
/// interface's addresses that are not vipd's and whose duplicate address detection did not
/// fail. A VIP whose interface cannot be found or read is left out (`None`; the VIP holder
/// reports it).
pub(crate) async fn subnet_edges<K: Kernel>(
    kernel: &K,
    cfg: &Settings,
) -> Vec<(IpAddr, Option<Result<(), ControlPlaneError>>)> {
    let mut out = Vec::new();
    for spec in control_plane_vips(cfg) {
        let link = match &spec.interface {
            Some(name) => kernel.link_by_name(name).await.ok(),
            None => match kernel.choose_interface(spec.vip.addr).await {
                Ok(idx) => kernel.link_by_index(idx).await.ok(),
                Err(_) => None,
            },
        };
        let checked = match link {
            None => None,
            Some(link) => match kernel.addresses(Some(link.index)).await {
                Ok(addrs) => {
                    let connected: Vec<(IpAddr, u8)> = addrs
                        .iter()
                        .filter(|a| !a.ours && !a.dad_failed)
                        .map(|a| (a.vip.addr, a.vip.prefix))
                        .collect();
                    Some(check_subnet_edge(&spec, &link.name, &connected))
                }
                Err(_) => None,
            },
        };
        out.push((spec.vip.addr, checked));
    }
    out
}

/// What the control-plane wing shares with the rest of the manager.
pub struct Parts {
    /// Client of the election's API server (the node's own in control-plane mode).
    pub client: kube::Client,
    /// The same server's client for the control-plane Lease alone, built on `elections`
    /// ([`crate::kube::client::election_lease_client`]).
    pub lease_client: kube::Client,
    /// Where the elector runs: the election runtime ([`crate::election::own_runtime`]), so
    /// its renewals never wait for the Services' work on the main runtime; `None`: here.
    pub elections: Option<tokio::runtime::Handle>,
    /// The kernel the VIPs go to, through the process's one dump of the node's addresses
    /// (kept until an address changes, [`CachedKernel::watched_or_aged`]): the holder's
    /// checks share it with the Services wing's holders instead of dumping the node's
    /// thousands of Service addresses twice a second on their own.
    pub kernel: Arc<CachedKernel<NetlinkKernel>>,
    /// The VIP holder's settings (fence, GARP rate, conflict probe, ARP guard).
    pub holder_cfg: HolderConfig,
    /// Election gates; [`health_loop`] drives [`GATE_LOCAL_API`] on them.
    pub gates: Gates,
    /// Metrics of the election and the holder.
    pub metrics: crate::obs::metrics::Metrics,
    /// `/readyz` conditions (duplicate identity).
    pub readiness: Readiness,
    /// The process's Node cache (the load balancer's backends; every Node with
    /// `lb_enable`).
    pub nodes: crate::nodes::NodeCache,
    /// Routing-table mode (`vip_routingtable`): the process's one [`RouteKernel`], shared
    /// with the Services wing; `None`: the VIP is an address announced by ARP/NDP.
    pub routes: Option<Arc<RouteKernel>>,
}

/// The running control-plane election and VIP holder.
pub struct Running {
    election_stop: CancellationToken,
    elector_task: JoinHandle<()>,
    holder_stop: CancellationToken,
    holder_task: JoinHandle<()>,
    labeler: Option<(CancellationToken, JoinHandle<()>)>,
    load_balancer: Option<crate::controlplane::lb::Running>,
}

/// Starts the control-plane election (`vip_leasename` in `cp_namespace`, client-go
/// semantics) and the VIP holder that follows it; a duplicate identity (S35) fails
/// `/readyz` and posts a Warning Event about the Lease until `shutdown`. With
/// `enable_node_labeling`, a task of its own keeps this node's `kube-vip.io/has-ip` label
/// in step with the lease (the first address of `address`), never holding up the VIPs.
///
/// In routing-table mode (`parts.routes`) there is no election, as in kube-vip
/// (`pkg/manager/worker/table.go` starts the control plane without one): the elector runs
/// on a process-local lease ([`LocalLeaseClient`]), so every control-plane node routes the
/// VIP (fenced host route, [`RoutedAddressKernel`]: also bound on the loopback) while its
/// gates are open, the local API server's health ([`GATE_LOCAL_API`]) among them; the
/// fabric spreads the VIP over those nodes by ECMP. No Node label then (the label names one
/// holder).
pub fn start(cfg: &Settings, parts: Parts, shutdown: CancellationToken) -> Running {
    match parts.routes.clone() {
        Some(routes) => {
            info!(
                table = routes.mode().table,
                "control-plane VIP in routing-table mode: every control-plane node whose own API server is healthy routes it (and binds it on the loopback), without election, as kube-vip does"
            );
            let leases =
                LocalLeaseClient::new(&format!("local/{}/{}", cfg.lease.namespace, cfg.lease.name));
            let kernel = Arc::new(RoutedAddressKernel::new(routes));
            launch(cfg, parts, leases, kernel, Arc::new(NoAnnouncer), shutdown)
        }
        None => {
            let leases = KubeLeaseClient::new(
                parts.lease_client.clone(),
                &cfg.lease.namespace,
                &cfg.lease.name,
            );
            let kernel = parts.kernel.clone();
            launch(cfg, parts, leases, kernel, Arc::new(RawAnnouncer), shutdown)
        }
    }
}

/// [`start`] with the lease, kernel and announcer of the mode.
fn launch<C: LeaseClient, K: Kernel, A: Announcer>(
    cfg: &Settings,
    parts: Parts,
    leases: C,
    kernel: Arc<K>,
    announcer: Arc<A>,
    shutdown: CancellationToken,
) -> Running {
    let routed = parts.routes.is_some();
    let Parts {
        client,
        holder_cfg,
        gates,
        metrics,
        readiness,
        nodes,
        elections,
        ..
    } = parts;
    if routed {
        // Every healthy node routes the VIP: a node routes it only once its own API server
        // has answered (the health loop opens the gate at its first good check), never on
        // the benefit of the doubt at start.
        gates.set(GATE_LOCAL_API, false);
    }
    let (elector, leadership) =
        Elector::new(leases, cfg.node_name.clone(), cfg.lease.timing, &gates);
    let elector = elector.with_metrics(&metrics);
    let labeler = match (cfg.enable_node_labeling && !routed, cfg.addresses.first()) {
        (true, Some(first)) => {
            let stop = CancellationToken::new();
            let value = crate::nodes::label::has_ip_value(*first);
            info!(label = %format!("{}={value}", crate::nodes::label::HAS_IP), node = %cfg.node_name, "enable_node_labeling: the control-plane VIP's holder labels its Node");
            let task = tokio::spawn(crate::nodes::label::run(
                crate::nodes::label::KubeNodeLabels::new(client.clone(), &cfg.node_name),
                value,
                leadership.state.clone(),
                stop.clone(),
            ));
            Some((stop, task))
        }
        _ => None,
    };
    tokio::spawn(crate::election::identity::follow(
        elector.duplicate_identity(),
        crate::kube::ObjectKey::new(&cfg.lease.namespace, &cfg.lease.name),
        readiness,
        crate::kube::events::Recorder::new(client.clone(), &cfg.node_name),
        shutdown,
    ));
    // With lb_enable the load balancer sits between the holder's acknowledgement and the
    // elector: the lease is released only once the VIPs and the rules are gone.
    let (leadership, load_balancer) = match &cfg.load_balancer {
        Some(lb) => {
            let (running, holder_dropped) = crate::controlplane::lb::start(
                crate::controlplane::lb::LbConfig {
                    vips: cfg.addresses.clone(),
                    lb_port: lb.lb_port,
                    port: cfg.port,
                    forwarding: lb.forwarding,
                },
                nodes,
                leadership.state.clone(),
                leadership.dropped,
                metrics.clone(),
            );
            (
                crate::election::Leadership {
                    state: leadership.state,
                    dropped: holder_dropped,
                },
                Some(running),
            )
        }
        None => (leadership, None),
    };
    let vips = match routed {
        // A route is a host route (/32, /128) whatever vip_subnet says: the holder compares
        // what it holds with what it asked for.
        true => control_plane_vips(cfg)
            .into_iter()
            .map(|s| VipSpec {
                vip: Vip::host(s.vip.addr),
                ..s
            })
            .collect(),
        false => control_plane_vips(cfg),
    };
    info!(
        vips = ?vips.iter().map(|s| s.vip.to_string()).collect::<Vec<_>>(),
        lease = %format!("{}/{}", cfg.lease.namespace, cfg.lease.name),
        fence_secs = holder_cfg.fence.address_secs,
        arp_rate_ms = cfg.arp_rate.as_millis() as u64,
        "control-plane VIP"
    );
    let holder = VipHolder::new("control-plane", kernel, announcer, vips, holder_cfg, gates)
        .with_metrics(&metrics);
    let election_stop = CancellationToken::new();
    let holder_stop = CancellationToken::new();
    let holder_task = tokio::spawn(holder.run(leadership, holder_stop.clone()));
    let elector_stop = election_stop.clone();
    let elector_task = crate::election::own_runtime::spawn_on(elections.as_ref(), async move {
        elector.run(elector_stop).await;
    });
    Running {
        election_stop,
        elector_task,
        holder_stop,
        holder_task,
        labeler,
        load_balancer,
    }
}

impl Running {
    /// Stops in the documented order: the elector publishes `Following`, the holder
    /// removes the VIPs and acknowledges, the elector releases the Lease; then the holder
    /// task ends. The Node label (`enable_node_labeling`) is removed meanwhile, within
    /// [`crate::nodes::label::SHUTDOWN_LIMIT`]. With `lb_enable` the load balancer's rules
    /// are removed before the Lease is released, and its task ends last.
    pub async fn stop(self) {
        if let Some((stop, _)) = &self.labeler {
            stop.cancel();
        }
        self.election_stop.cancel();
        if let Err(e) = self.elector_task.await {
            error!(error = %e, "election task failed");
        }
        self.holder_stop.cancel();
        if let Err(e) = self.holder_task.await {
            error!(error = %e, "VIP holder task failed");
        }
        if let Some(lb) = self.load_balancer {
            lb.stop().await;
        }
        if let Some((_, task)) = self.labeler
            && let Err(e) = task.await
        {
            error!(error = %e, "node label task failed");
        }
    }
}

/// Refuses control-plane VIPs that are some node's own address (`status.addresses`): the
/// node holding the lease would take that node's traffic. A failed Node list (API down,
/// RBAC) is logged and does not stop the start.
///
/// # Errors
/// [`ControlPlaneError::NodeAddress`] naming the address and the node.
pub(crate) async fn check_not_node_addresses(
    client: &kube::Client,
    vips: &[IpAddr],
) -> Result<(), ControlPlaneError> {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let list =
        match tokio::time::timeout(Duration::from_secs(5), api.list(&Default::default())).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot list Nodes to check the VIPs against node addresses");
                return Ok(());
            }
            Err(_) => {
                warn!("listing Nodes timed out; VIPs not checked against node addresses");
                return Ok(());
            }
        };
    let nodes: Vec<Arc<_>> = list.items.into_iter().map(Arc::new).collect();
    let owners = crate::nodes::node_addresses(&nodes);
    for v in vips {
        if let Some(node) = owners.get(v) {
            return Err(ControlPlaneError::NodeAddress {
                address: *v,
                node: node.clone(),
            });
        }
    }
    Ok(())
}

/// Gate closed while the node's own API server fails its health check.
pub(crate) const GATE_LOCAL_API: &str = "local-api";

/// Consecutive failed health checks after which the node steps down.
pub(crate) const HEALTH_FAILURES: u32 = 3;

/// Interval between health checks of the local API server (1 s).
pub(crate) const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// Counts consecutive failures and successes of a health check; pure.
#[derive(Debug, Clone, Default)]
pub(crate) struct HealthTracker {
    failures: u32,
}

impl HealthTracker {
    /// Records one result and returns whether the gate should be open: closes after
    /// [`HEALTH_FAILURES`] consecutive failures, opens again at the first success.
    pub fn record(&mut self, ok: bool) -> bool {
        if ok {
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
        }
        self.failures < HEALTH_FAILURES
    }
}

/// One health check of the API server behind `client`: `GET /livez`, falling back to
/// `/healthz` (the only one some old servers serve), each bounded by `limit`.
///
/// # Errors
/// A message saying what failed (transport error, timeout, or the body when not `ok`).
pub(crate) async fn check_api(client: &kube::Client, limit: Duration) -> Result<(), String> {
    let mut last = String::new();
    for path in ["/livez", "/healthz"] {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(limit, client.request_text(req)).await {
            Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
            Ok(Ok(body)) => last = format!("{path}: {}", body.trim()),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                last = format!("{path}: 404");
                continue;
            }
            Ok(Err(e)) => return Err(format!("{path}: {e}")),
            Err(_) => return Err(format!("{path}: timed out after {} ms", limit.as_millis())),
        }
    }
    Err(last)
}

/// Checks the API server behind `client` every [`HEALTH_INTERVAL`] until `shutdown`:
/// drives the [`GATE_LOCAL_API`] gate when `gates` is given (control-plane mode: the node's
/// own API server), sets `readiness`'s API flag, and tells systemd `READY=1` after the first
/// good answer.
pub(crate) async fn health_loop(
    client: kube::Client,
    gates: Option<Gates>,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    let mut notified = false;
    let mut tracker = HealthTracker::default();
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut was_open = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let res = check_api(&client, HEALTH_INTERVAL).await;
        let open = tracker.record(res.is_ok());
        // Without `gates` (no control-plane VIP) nothing steps down: only readiness follows.
        let (unhealthy, healthy) = match gates {
            Some(_) => (
                "local API server unhealthy; stepping down and not campaigning",
                "local API server healthy again",
            ),
            None => ("API server unreachable", "API server reachable again"),
        };
        match (&res, was_open, open) {
            (Err(e), true, false) => {
                warn!(error = %e, failures = HEALTH_FAILURES, "{unhealthy}")
            }
            (Err(e), true, true) => debug!(error = %e, "API server health check failed"),
            (Ok(()), false, true) => info!("{healthy}"),
            _ => {}
        }
        was_open = open;
        if let Some(g) = &gates {
            g.set(GATE_LOCAL_API, open);
        }
        readiness.set_api_reachable(res.is_ok());
        if res.is_ok() && !notified {
            notified = true;
            if let Err(e) = crate::obs::systemd::notify_ready("configuration valid, API reachable")
            {
                warn!(error = %e, "cannot notify systemd");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(addr: &str, prefix: u8) -> VipSpec {
        VipSpec {
            vip: Vip {
                addr: addr.parse().unwrap(),
                prefix,
            },
            interface: None,
            not_after: None,
        }
    }

    /// The node's own addresses on eth0: 192.0.2.11/24, 198.51.100.1/31, 2001:db8::11/64.
    fn eth0() -> Vec<(IpAddr, u8)> {
        ["192.0.2.11/24", "198.51.100.1/31", "2001:db8::11/64"]
            .iter()
            .map(|s| {
                let (a, p) = s.split_once('/').unwrap();
                (a.parse().unwrap(), p.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn control_plane_vip_on_a_subnet_edge_of_its_interface_is_refused() {
        let refused = [
            (
                spec("192.0.2.255", 32),
                "broadcast address of 192.0.2.0/24 on eth0",
            ),
            (
                spec("192.0.2.0", 32),
                "network address of 192.0.2.0/24 on eth0",
            ),
            (
                spec("2001:db8::", 128),
                "network address of 2001:db8::/64 on eth0",
            ),
            // The VIP's own prefix counts too (config refuses it first).
            (
                spec("203.0.113.0", 24),
                "network address of 203.0.113.0/24 on eth0",
            ),
        ];
        for (s, says) in &refused {
            let e = check_subnet_edge(s, "eth0", &eth0()).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("address {} is the {says}", s.vip.addr)),
                "{msg}"
            );
            assert!(msg.contains("--address"), "{msg}");
        }
        // Host addresses, a /31 (both addresses usable, RFC 3021), another subnet.
        for s in [
            spec("192.0.2.50", 32),
            spec("198.51.100.0", 32),
            spec("198.51.100.1", 32),
            spec("2001:db8::ffff:ffff:ffff:ffff", 128),
            spec("203.0.113.255", 32),
        ] {
            assert!(check_subnet_edge(&s, "eth0", &eth0()).is_ok(), "{}", s.vip);
        }
    }

    #[test]
    fn three_consecutive_failures_close_and_one_success_opens() {
        let mut t = HealthTracker::default();
        assert!(t.record(false));
        assert!(t.record(false));
        assert!(t.record(true), "a success resets the count");
        assert!(t.record(false));
        assert!(t.record(false));
        assert!(!t.record(false));
        assert!(!t.record(false));
        assert!(t.record(true));
    }
}
