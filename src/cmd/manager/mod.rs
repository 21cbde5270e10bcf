//! `vipd manager`: wires configuration, the kernel, elections and VIP holders together and
//! runs until SIGTERM/SIGINT.
//!
//! Shutdown order (never two holders, all within about 2 s): the elector publishes
//! `Following`, the VIP holder removes the VIPs and acknowledges, the elector releases the
//! Lease (client-go `ReleaseOnCancel`), then the process exits 0.

pub mod admin;
pub mod metrics;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::controlplane;
use crate::election::Gates;
use crate::holder::{self, HolderConfig};
use crate::kube::service::ServiceCache;
use crate::net::conflict::{ConflictMonitor, RawConflictMonitor};
use crate::net::route_kernel::LOOPBACK_IFINDEX;
use crate::net::{Kernel, NetlinkKernel};
use crate::nodes::eligibility::{self, DrainSwitch, Wing};
use crate::nodes::{NodeCache, NodeScope};
use crate::services;

/// Errors that stop the manager at start.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Building the Kubernetes client failed.
    #[error(transparent)]
    Client(#[from] crate::kube::client::ClientError),
    /// The kernel could not be reached (netlink socket).
    #[error(transparent)]
    Net(#[from] crate::net::NetError),
    /// The lease timings cannot be fenced.
    #[error(transparent)]
    Fence(#[from] crate::lease::TimingError),
    /// The control-plane configuration cannot be used on this cluster.
    #[error(transparent)]
    ControlPlane(#[from] controlplane::ControlPlaneError),
    /// The Services wing cannot start (its clients or lease timings).
    #[error(transparent)]
    Services(#[from] services::ServicesError),
    /// A feature that is configured but not implemented in this release.
    #[error("{0}")]
    Unsupported(String),
    /// Sub-second lease timings need the millisecond fence, which could not start.
    #[error(
        "lease timings {timings} have no whole-second address fence and need the millisecond nftables fence, which could not start on this node (see the warning above; `vipd preflight` checks it): refusing to run unfenced; use whole-second timings (e.g. 3/2/1) or a kernel with nf_tables arp/inet and set timeouts"
    )]
    NoMillisecondFence {
        /// Which timings, each as `option=value s`: the control plane's or the Services'.
        timings: String,
    },
}

/// Runs the manager until `shutdown` is cancelled (the binary cancels it on SIGTERM and
/// SIGINT), then shuts down in the documented order.
///
/// # Errors
/// [`ManagerError`] for problems found at start; once running, failures are retried and
/// logged, never returned.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), ManagerError> {
    info!(node = %cfg.node_name, version = env!("CARGO_PKG_VERSION"), "vipd manager starting");
    let (metrics, readiness, drain) = start_admin(&cfg, &shutdown).await;
    if !cfg.control_plane && !cfg.services {
        return Err(ManagerError::Unsupported(
            "nothing to do: set cp_enable (--controlplane) and/or svc_enable (--services)".into(),
        ));
    }
    let cfg = Arc::new(cfg);
    let holder_cfg = holder_config(&cfg)?;
    let (client, url) = crate::kube::client::election_client(&cfg.kube()).await?;
    info!(api = %url, "talking to this API server (kubernetes_addr, else 127.0.0.1:port in control-plane mode, else the kubeconfig's)");

    let kernel = Arc::new(NetlinkKernel::new()?);
    startup_checks(&cfg, &client, kernel.as_ref()).await?;
    let arp_guard = prepare_node(kernel.as_ref(), &cfg).await;
    match crate::net::lo_routes::remove_stale(kernel.as_ref()).await {
        Ok(removed) if !removed.is_empty() => {
            info!(
                count = removed.len(),
                "removed the local routes of IPv6 VIPs on lo an earlier run left"
            )
        }
        Ok(_) => {}
        Err(e) => {
            warn!(error = %e, "could not list the local routes of IPv6 VIPs on lo for stale VIP cleanup")
        }
    }
    let holder_cfg = HolderConfig {
        arp_guard: arp_guard.clone(),
        ..holder_cfg
    };

    // API health: in control-plane mode it gates the control-plane election (the node's own
    // API server); in every mode it drives /readyz and systemd READY=1.
    let cp_gates = Gates::default();
    let health_stop = CancellationToken::new();
    let health = tokio::spawn(controlplane::health_loop(
        client.clone(),
        cfg.control_plane.then(|| cp_gates.clone()),
        readiness.clone(),
        health_stop.clone(),
    ));
    // One dump of the node's addresses shared by the readers of all of them (the
    // housekeeping below, the control-plane and Service VIP holders), kept until an
    // address changes.
    let addresses = Arc::new(crate::net::CachedKernel::watched_or_aged(
        kernel.clone(),
        Duration::from_millis(200),
    ));
    // IPv6 Service VIPs on lo are local routes (svc_ipv6_loopback): the Service holders
    // write them through this, and the housekeeping counts them with the addresses. The
    // node's route notifications are followed only where such routes can exist.
    let loopback = Arc::new(match cfg.services && cfg.services_ipv6_loopback {
        true => crate::net::lo_routes::LoopbackRoutes::watched(addresses.clone(), kernel.clone()),
        false => crate::net::lo_routes::LoopbackRoutes::new(addresses.clone(), kernel.clone()),
    });
    let aux_stop = CancellationToken::new();
    tokio::spawn(aux_loop(
        loopback.clone(),
        metrics.clone(),
        holder_cfg.announce_pace.clone(),
        aux_stop.clone(),
    ));

    // One list+watch of Nodes for the whole process (eligibility, the load balancer, the
    // Services wing, the allocator), and with `svc_enable` one of Services (the Services
    // wing, the allocator), until the end.
    let (nodes, service_cache) = start_shared_caches(&cfg, &readiness, &aux_stop).await?;
    let svc_eligible = start_eligibility(&cfg, &nodes, &drain, &metrics, &cp_gates, &aux_stop);

    // The millisecond fence (vip_nftfence, on by default): every VIP, the control plane's
    // and the Services' (DHCP-mode addresses included), through one batching writer.
    let nft_fence = crate::net::nft::fence::start_fence(cfg.nft_fence, cfg.binds_addresses()).await;
    needs_nft_fence(&cfg, &holder_cfg, nft_fence.active())?;
    // Routing-table mode: one route kernel for the process (one set of fence devices, one
    // clean-up of the table), before any election.
    let routes = match cfg.routing_table {
        Some(mode) => {
            let routes = Arc::new(crate::net::route_kernel::RouteKernel::new(
                kernel.clone(),
                mode,
            ));
            routes.prepare().await;
            Some(routes)
        }
        None => None,
    };
    // Routing-table mode: the route's lifetime fences the control-plane VIP (no probe, ARP
    // pins or nftables element); the configuration refused timings without a whole-second
    // fence.
    let cp_holder_cfg = match &routes {
        Some(_) => HolderConfig::routed(&cfg.lease.timing, cfg.arp_rate)?,
        // Its own pace (never set: every repeat at arp_rate): one VIP saves nothing by
        // waiting for the Services' count.
        None => HolderConfig {
            nft_fence: nft_fence.clone(),
            announce_pace: Arc::new(crate::holder::AnnouncePace::default()),
            ..holder_cfg.clone()
        },
    };
    // The control-plane elector renews on the election runtime, with a client of its own.
    let (elections, cp_lease_client) = match cfg.control_plane {
        true => {
            let rt = crate::election::own_runtime::election_runtime();
            let c = crate::kube::client::election_lease_client(&cfg.kube(), rt.as_ref()).await?;
            (rt, c)
        }
        false => (None, client.clone()),
    };
    let control_plane = cfg.control_plane.then(|| {
        controlplane::start(
            &cfg.controlplane(),
            controlplane::Parts {
                client: client.clone(),
                lease_client: cp_lease_client,
                elections,
                kernel: addresses.clone(),
                holder_cfg: cp_holder_cfg,
                gates: cp_gates.clone(),
                metrics: metrics.clone(),
                readiness: readiness.clone(),
                nodes: nodes.clone(),
                routes: routes.clone(),
            },
            shutdown.clone(),
        )
    });
    let dhcp = start_dhcp(cfg.services, cfg.dhcp_backoff_attempts).await;
    let (egress_tx, egress) = start_egress(&cfg, &client, &metrics, &nft_fence);
    let ipam = start_ipam(&cfg, &kernel, &holder_cfg, &metrics, &nodes, &service_cache).await?;
    let services = match service_cache {
        Some(service_cache) => Some(
            services::start(
                &Arc::new(cfg.services()),
                services::Parts {
                    kernel: kernel.clone(),
                    addresses,
                    loopback,
                    holder_cfg: HolderConfig {
                        nft_fence: nft_fence.clone(),
                        ..holder_cfg
                    },
                    metrics: metrics.clone(),
                    readiness: readiness.clone(),
                    ineligible: svc_eligible,
                    dhcp,
                    egress: egress_tx,
                    nodes,
                    services: service_cache,
                    routes,
                },
            )
            .await?,
        ),
        None => None,
    };
    readiness.set_election_running(true);

    shutdown.cancelled().await;
    if let Err(e) = crate::obs::systemd::notify_stopping() {
        warn!(error = %e, "cannot notify systemd");
    }
    info!("shutting down: dropping VIPs, then releasing the leases");
    stop_elections(services, control_plane, ipam).await;
    stop_egress(egress).await;
    readiness.set_election_running(false);
    health_stop.cancel();
    let _ = health.await;
    aux_stop.cancel();
    clean_up_node(
        kernel.as_ref(),
        arp_guard.as_ref(),
        nft_fence.as_ref(),
        cfg.control_plane && cfg.routing_table.is_some(),
    )
    .await;
    info!("vipd manager stopped");
    Ok(())
}

/// Starts the egress wing with Services (`svc_enable`): the sender the Services wing
/// reports to, and the running wing; both `None` without Services.
fn start_egress(
    cfg: &Config,
    client: &kube::Client,
    metrics: &crate::obs::metrics::Metrics,
    fence: &Arc<dyn crate::net::nft::fence::VipFence>,
) -> (
    Option<crate::kube::service::EgressTx>,
    Option<crate::egress::Running>,
) {
    if !cfg.services {
        return (None, None);
    }
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(Default::default()));
    let nft = crate::net::nft::egress::NftEgress::default().with_fence(fence.clone());
    // In a pod, the API server's Service address (kube-vip.io/egress-detect-api-server).
    let settings = crate::egress::Settings {
        api_server: std::env::var("KUBERNETES_SERVICE_HOST")
            .ok()
            .and_then(|h| h.parse().ok()),
        fence: fence.active(),
        ..cfg.egress.clone()
    };
    let m = metrics.families::<crate::egress::metrics::EgressMetrics>();
    let events = crate::kube::events::Recorder::new(client.clone(), &cfg.node_name);
    (
        Some(tx),
        Some(crate::egress::start(settings, rx, nft, m, events)),
    )
}

/// Empties the egress chains (after the Services wing dropped its VIPs) and stops the wing.
async fn stop_egress(egress: Option<crate::egress::Running>) {
    if let Some(e) = egress {
        e.stop().await;
    }
}

/// Starts the allocator (`svc_ipam` with `svc_enable`), probing with the holders' conflict
/// monitor; `None` when allocation is off.
async fn start_ipam(
    cfg: &Config,
    kernel: &Arc<NetlinkKernel>,
    holder_cfg: &HolderConfig,
    metrics: &crate::obs::metrics::Metrics,
    nodes: &NodeCache,
    services: &Option<ServiceCache>,
) -> Result<Option<crate::ipam::Running>, ManagerError> {
    let (Some(settings), Some(services)) = (cfg.ipam(), services) else {
        return Ok(None);
    };
    let parts = crate::ipam::Parts {
        kernel: kernel.clone(),
        conflict_monitor: holder_cfg.conflict_monitor.clone(),
        metrics: metrics.clone(),
        nodes: nodes.clone(),
        services: services.clone(),
    };
    Ok(Some(crate::ipam::start(settings, parts).await?))
}

/// Stops the wings at once: each drops its VIPs, then releases its leases (the allocator
/// only releases its Lease).
async fn stop_elections(
    services: Option<services::Running>,
    control_plane: Option<controlplane::Running>,
    ipam: Option<crate::ipam::Running>,
) {
    tokio::join!(
        async {
            if let Some(i) = ipam {
                i.stop().await;
            }
        },
        async {
            if let Some(s) = services {
                s.stop().await;
            }
        },
        async {
            if let Some(cp) = control_plane {
                cp.stop().await;
            }
        }
    );
}

/// The last step of shutting down: removes whatever vipd-tagged VIPs are left, the ARP
/// flux table and the nftables fence tables, warning about each that cannot go.
async fn clean_up_node(
    kernel: &NetlinkKernel,
    arp_guard: &dyn crate::net::ArpGuard,
    nft_fence: &dyn crate::net::nft::fence::VipFence,
    routed_control_plane: bool,
) {
    // Belt and braces: nothing tagged may outlive the process, but for the routed
    // control-plane VIP's loopback address, left to run out with its lifetime (at most the
    // fence, 2 s) so the connections still on their way while the route's withdrawal
    // travels are accepted (RoutedAddressKernel::remove).
    let keep = routed_control_plane.then_some(LOOPBACK_IFINDEX);
    if let Err(e) = holder::remove_stale(kernel, keep).await {
        warn!(error = %e, "final VIP cleanup failed");
    }
    if let Err(e) = crate::net::lo_routes::remove_stale(kernel).await {
        warn!(error = %e, "final cleanup of the local routes of IPv6 VIPs on lo failed");
    }
    if let Err(e) = arp_guard.close().await {
        warn!(error = %e, "could not remove the ARP flux table");
    }
    if let Err(e) = nft_fence.close().await {
        warn!(error = %e, "could not remove the nftables fence tables");
    }
}

/// The start-up checks that refuse a configuration the node cannot serve: a control-plane
/// VIP that is a node's own address or the network / broadcast address of a subnet on its
/// interface; and the info lines for options that do nothing without `cp_enable`.
///
/// # Errors
/// [`ManagerError`] from the checks.
async fn startup_checks(
    cfg: &Config,
    client: &kube::Client,
    kernel: &NetlinkKernel,
) -> Result<(), ManagerError> {
    if cfg.control_plane {
        controlplane::check_not_node_addresses(client, &cfg.addresses).await?;
    } else if cfg.enable_node_labeling {
        info!(
            "enable_node_labeling labels the control-plane VIP's holder only; cp_enable is off, so no Node is labelled"
        );
    }
    if !cfg.control_plane && !cfg.leader_election {
        info!(
            "vip_leaderelection=false governs the control-plane election only; cp_enable is off, so it has no effect (Service leases are always elected)"
        );
    }
    if !cfg.control_plane && cfg.load_balancer.is_some() {
        info!(
            "lb_enable balances the control-plane VIP only (as kube-vip); cp_enable is off, so nothing is balanced"
        );
    }
    if cfg.control_plane {
        for (_, checked) in controlplane::subnet_edges(kernel, &cfg.controlplane()).await {
            if let Some(Err(e)) = checked {
                return Err(e.into());
            }
        }
    }
    Ok(())
}

/// Which Nodes the process's one Node watch lists: every Node when the Services wing (and
/// with it the allocator) or the load balancer reads them, else only this node's, which
/// eligibility alone reads. Pure.
fn node_scope(cfg: &Config) -> NodeScope {
    if cfg.services || (cfg.control_plane && cfg.load_balancer.is_some()) {
        NodeScope::All
    } else {
        NodeScope::Own
    }
}

/// Starts the process's one Node cache ([`crate::nodes::start`], scope [`node_scope`])
/// and, with `svc_enable`, its one Services cache ([`crate::kube::service::start_cache`],
/// in `svc_namespace`, with the allocator's view when `svc_ipam` is on), until `stop`, on a
/// client of their own. With `svc_enable` their watches are tracked by `/readyz` like the
/// Services side's own watches (`watch-stalled:nodes`, `watch-stalled:services`).
///
/// # Errors
/// [`ManagerError::Client`] when the client cannot be built.
async fn start_shared_caches(
    cfg: &Config,
    readiness: &crate::obs::readiness::Readiness,
    stop: &CancellationToken,
) -> Result<(NodeCache, Option<ServiceCache>), ManagerError> {
    let (client, activity) = crate::kube::client::watch_client(&cfg.kube()).await?;
    let scope = node_scope(cfg);
    let nodes = crate::nodes::start(
        client.clone(),
        scope,
        &cfg.node_name,
        activity.clone(),
        stop.clone(),
    );
    if !cfg.services {
        return Ok((nodes, None));
    }
    let views = match cfg.ipam() {
        Some(_) => vec![crate::ipam::SERVICE_VIEW],
        None => Vec::new(),
    };
    let services = crate::kube::service::start_cache(
        &client,
        cfg.services_namespace.as_deref(),
        activity.clone(),
        stop.clone(),
        &views,
    );
    readiness.track_watches(activity.clone());
    activity.spawn_monitor(stop.clone());
    Ok((nodes, Some(services)))
}

/// Eligibility ([`eligibility`]): this node's Node object (followed in `nodes` until
/// `stop`) and `vipd drain` close the `ineligible` gate of the control-plane election
/// (`cp_gates`, drains only) and, through the returned receiver, of every Service election.
fn start_eligibility(
    cfg: &Config,
    nodes: &NodeCache,
    drain: &DrainSwitch,
    metrics: &crate::obs::metrics::Metrics,
    cp_gates: &Gates,
    stop: &CancellationToken,
) -> tokio::sync::watch::Receiver<Option<eligibility::Ineligible>> {
    let (facts_tx, facts) = tokio::sync::watch::channel(None);
    tokio::spawn(eligibility::follow_own_node(
        nodes.clone(),
        cfg.node_name.clone(),
        facts_tx,
        stop.clone(),
    ));
    if cfg.control_plane {
        let gates = cp_gates.clone();
        tokio::spawn(eligibility::follow(
            Wing::ControlPlane,
            facts.clone(),
            drain.clone(),
            cfg.eligibility,
            metrics.clone(),
            move |why| gates.set(eligibility::GATE_INELIGIBLE, why.is_none()),
            stop.clone(),
        ));
    }
    let (svc_eligible_tx, svc_eligible) = tokio::sync::watch::channel(None);
    if cfg.services {
        svc_eligible_tx.send_replace(Some(eligibility::Ineligible::Unknown));
        tokio::spawn(eligibility::follow(
            Wing::Services,
            facts.clone(),
            drain.clone(),
            cfg.eligibility,
            metrics.clone(),
            move |why| {
                svc_eligible_tx.send_replace(why);
            },
            stop.clone(),
        ));
    }
    svc_eligible
}

/// Starts the admin endpoint (`/metrics`, `/healthz`, `/readyz`, `/drain` on
/// `prometheus_server`) until `shutdown`; returns the metrics, readiness and drain switch
/// the other parts update or follow. A port that
/// cannot be bound is logged and vipd goes on: the VIP matters more than its metrics.
async fn start_admin(
    cfg: &Config,
    shutdown: &CancellationToken,
) -> (
    crate::obs::metrics::Metrics,
    crate::obs::readiness::Readiness,
    DrainSwitch,
) {
    let metrics = metrics::every_family(&cfg.node_name);
    let readiness = crate::obs::readiness::Readiness::new();
    let drain = DrainSwitch::default();
    readiness.set_config_valid(true);
    if let Some(addr) = &cfg.prometheus_server
        && let Err(e) = crate::cmd::manager::admin::start(
            addr,
            metrics.clone(),
            readiness.clone(),
            drain.clone(),
            shutdown.clone(),
        )
        .await
    {
        error!(error = %e, "admin endpoint not started");
    }
    (metrics, readiness, drain)
}

/// The VIP holders' settings at the control-plane lease timings, with one RFC 5227
/// conflict capture for every holder of this process (none with `vip_arpprobe=0`).
///
/// # Errors
/// [`crate::lease::TimingError`] when the lease timings cannot be fenced.
fn holder_config(cfg: &Config) -> Result<HolderConfig, crate::lease::TimingError> {
    let monitor: Option<Arc<dyn ConflictMonitor>> = if cfg.arp_probe.is_zero() {
        info!("address conflict detection off (vip_arpprobe=0)");
        None
    } else {
        Some(Arc::new(RawConflictMonitor::new()))
    };
    Ok(HolderConfig {
        skip_dad: !cfg.ipv6_dad,
        probe_window: cfg.arp_probe,
        conflict_monitor: monitor,
        ..HolderConfig::from_timing(&cfg.lease.timing, cfg.arp_rate, cfg.nft_fence.wanted())?
    })
}

/// Sub-second lease timings are fenced by nftables alone ([`crate::lease::fence_plan`]): when
/// the nftables fence could not start, refuse to run rather than fall back to an address
/// lifetime that would outlive the lease.
///
/// # Errors
/// [`ManagerError::NoMillisecondFence`] naming the timings.
fn needs_nft_fence(cfg: &Config, cp: &HolderConfig, active: bool) -> Result<(), ManagerError> {
    if active {
        return Ok(());
    }
    if cfg.control_plane && !cp.fence.address_fences {
        return Err(ManagerError::NoMillisecondFence {
            timings: timings_text(
                ["vip_leaseduration", "vip_renewdeadline", "vip_retryperiod"],
                &cfg.lease.timing,
            ),
        });
    }
    if cfg.services && crate::lease::needs_nft_fence(&cfg.services_timing) {
        return Err(ManagerError::NoMillisecondFence {
            timings: timings_text(
                ["svc_leaseduration", "svc_renewdeadline", "svc_retryperiod"],
                &cfg.services_timing,
            ),
        });
    }
    Ok(())
}

/// `keys[0]=<lease duration> s, keys[1]=<renew deadline> s, keys[2]=<retry period> s`.
fn timings_text(keys: [&str; 3], t: &crate::lease::Timing) -> String {
    [t.lease_duration, t.renew_deadline, t.retry_period]
        .iter()
        .zip(keys)
        .map(|(d, k)| format!("{k}={} s", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Prepares the node before any election: removes the VIPs an earlier run left (this
/// process leads nothing yet, so every address vipd tagged is stale), installs the ARP flux
/// guard (S36: vipd's nftables table, replacing one left by an earlier run) and logs the
/// ARP flux check. Returns the guard.
async fn prepare_node<K: Kernel>(kernel: &K, cfg: &Config) -> Arc<dyn crate::net::ArpGuard> {
    match holder::remove_stale(kernel, None).await {
        Ok(removed) if !removed.is_empty() => info!(count = removed.len(), "removed stale VIPs"),
        Ok(_) => {}
        Err(e) => warn!(error = %e, "could not list addresses for stale VIP cleanup"),
    }
    if !cfg.binds_addresses() {
        // Routing-table mode alone: no VIP address on any interface, nothing answered on
        // the segment, so no ARP flux to guard against.
        return Arc::new(crate::net::NoopArpGuard::default());
    }
    let arp_guard = crate::net::start_arp_guard().await;
    log_arp_flux(kernel, cfg, arp_guard.active()).await;
    arp_guard
}

/// Logs the ARP flux check (S36) at start: one warning per VIP interface with other
/// interfaces on its subnet that would answer ARP for the VIP, naming them and the sysctl.
async fn log_arp_flux<K: Kernel>(kernel: &K, cfg: &Config, guard_active: bool) {
    let targets = cfg.arp_flux_targets(kernel).await;
    match crate::net::arpflux::check(kernel, &targets).await {
        Ok(findings) => {
            for f in &findings {
                warn!(interface = %f.target.ifname, others = %f.peer_names(), "{}", f.message(guard_active));
            }
        }
        Err(e) => warn!(error = %e, "ARP flux check: cannot list addresses"),
    }
}

/// Periodic housekeeping until `stop`: the `vipd_vips_held` gauge and the holders'
/// announcement pace (vipd-tagged addresses and local routes of IPv6 VIPs on `lo` on the
/// node, every 2 s, read from `kernel`'s shared dump, [`crate::net::CachedKernel`], and
/// [`crate::net::lo_routes::LoopbackRoutes`]'s routes) and systemd watchdog pings (at half
/// `WatchdogSec`, when systemd asks for them).
async fn aux_loop<K: Kernel>(
    kernel: Arc<K>,
    metrics: crate::obs::metrics::Metrics,
    pace: Arc<crate::holder::AnnouncePace>,
    stop: CancellationToken,
) {
    let watchdog = crate::obs::systemd::watchdog_interval();
    let period = watchdog.map_or(Duration::from_secs(2), |w| w.min(Duration::from_secs(2)));
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if watchdog.is_some()
            && let Err(e) = crate::obs::systemd::notify_watchdog()
        {
            warn!(error = %e, "systemd watchdog ping failed");
        }
        if let Ok(addrs) = kernel.all_addresses().await {
            let held = addrs.iter().filter(|a| a.ours).count();
            metrics
                .families::<crate::holder::metrics::VipMetrics>()
                .vips_held(held);
            pace.set_held(held);
        }
    }
}

/// Removes the macvlans a previous vipd left behind (they carry vipd's mark; a macvlan
/// without it is never touched), and returns the DHCP client of Services whose address is
/// `0.0.0.0` / `::` when `services` (`svc_enable`) is on, giving up after
/// `backoff_attempts` failed attempts in a row (`dhcp_backoff_attempts`; 0 = never).
/// Failures are logged: without the client, DHCP Services get no address and the rest of
/// vipd runs.
async fn start_dhcp(services: bool, backoff_attempts: u32) -> Option<Arc<dyn crate::dhcp::Dhcp>> {
    let client = match crate::dhcp::RawDhcp::open() {
        Ok(c) => c.with_attempt_limit(backoff_attempts),
        Err(e) => {
            if services {
                error!(error = %e, "DHCP: cannot open rtnetlink for macvlans; Services with address 0.0.0.0 / :: will not be announced");
            }
            return None;
        }
    };
    match client.macvlans().remove_stale(&[]).await {
        Ok(removed) if !removed.is_empty() => {
            info!(macvlans = ?removed, "removed macvlans a previous vipd left behind")
        }
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot remove stale vipd macvlans"),
    }
    services.then(|| Arc::new(client) as Arc<dyn crate::dhcp::Dhcp>)
}

#[cfg(test)]
mod tests;
