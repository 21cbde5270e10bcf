//! The Services runtime: reflectors on Services and Endpoints, the plan recomputed on every
//! change, and one group task (Lease election + VIP holder + status writer) per Lease.
//!
//! Group tasks are started only for groups this node campaigns for ("no lease is created
//! for a Service that will not be announced"), at most one per Lease (so at most one per
//! Service and node, S03), and stopped (VIPs dropped, lease released) when the group goes or
//! the node should no longer campaign; when its Services are gone, the node that released
//! the lease also deletes it (S17).
//!
//! Status and Events (S38, S39): a group's holder keeps each Service's status and
//! `kube-vip.io/vipHost` level-triggered (`sync::StatusSync`: compared with the cache after every
//! pass over it, written when they differ, retried with back-off after a failure) and posts
//! one `AddressAnnounced` Event per change (`sync::status_diff`). Services that are not
//! announced get a Warning naming the reason and the value (refused addresses:
//! `select::Unusable`); one whose `externalTrafficPolicy: Local` leaves it announced nowhere has
//! its status cleared (`select::announced_nowhere`). Event names are deterministic
//! ([`crate::kube::events::event_name`]), so nodes and restarts add no duplicates.
//!
//! Governance moves (S34): when an address moves to another lease, the previous lease
//! retires on every node and the address is held back from other leases until its handover
//! is done (see [`super::governance`]).

use crate::services::plan::decide::GroupSpec;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::Settings;
use super::endpoints::endpointslice_v1_served;
use super::governance::{self, Handover, LeaseView};
use super::group::GroupHandle;
use super::publish::KubeStatusWriter;
use super::route_mode::route_holder_cfg;
use super::select::*;
use super::shared::Shared;
use super::sync::*;
use super::watch::*;
use crate::election::kube::{KubeLeaseClient, LeaseHub};
use crate::election::{ElectionEnd, LeaseClient};
use crate::holder::HolderConfig;
use crate::kube::watch::{scoped_api, spawn_reflector};
use crate::lease::Timing;
use crate::net::lo_routes::LoopbackRoutes;
use crate::net::route_kernel::{NoAnnouncer, RouteKernel};
use crate::net::{Announcer, CachedKernel, Kernel, NetlinkKernel, RawAnnouncer};
use crate::nodes::eligibility::Ineligible;
pub use crate::nodes::node_addresses;
use crate::obs::metrics::Metrics;
use crate::obs::readiness::{Readiness, WatchActivity};
use crate::services::plan::decide::{self, StopOrder};
use crate::services::plan::desired::{self, Candidate, LeaseRef, Mode, Plan, PlanConfig, Shards};
use crate::services::plan::notes::Note;

mod ride;
use ride::{RideSetup, ride_setup};

impl GroupSpec {
    /// Counts `vipd_vip_handovers_total{vip, reason}` once for each of the group's VIPs:
    /// this node (the holder) hands them over on purpose.
    pub(super) fn count_handovers(&self, metrics: &Metrics, reason: &str) {
        let metrics = metrics.families::<super::metrics::ServiceMetrics>();
        for v in &self.vips {
            metrics.vip_handover(v.vip.addr, reason);
        }
    }
}

/// Governance moves (S34, see [`super::governance`]).
struct Governance {
    /// The governing lease of every address in the last plan.
    prev: BTreeMap<IpAddr, LeaseRef>,
    /// Retiring leases whose handover is not done yet: one retirement each, or several
    /// for a shared lease that keeps running ([`file_retirement`]).
    retiring: BTreeMap<LeaseRef, Vec<Retirement>>,
    /// Woken when a retirement's handover is done (the plan is applied again at once).
    settled: Arc<Notify>,
    /// Addresses held back per lease, as last logged.
    held_back: BTreeMap<LeaseRef, BTreeSet<IpAddr>>,
}

/// One retiring lease, followed by a task until its handover is done.
struct Retirement {
    /// Addresses held back from every other lease meanwhile.
    addrs: BTreeSet<IpAddr>,
    done: Arc<std::sync::atomic::AtomicBool>,
    stop: CancellationToken,
}

/// `/readyz` ride state with `svc_ridethrough=false`.
const RIDE_OFF_STATE: &str = "off (svc_ridethrough=false); Service VIPs go at the renew deadline during an API server outage";

/// The ride state on `/readyz` when ride-through is off because of the Service lease
/// timings (its default there; set explicitly, the manager refuses them).
const RIDE_OFF_TIMINGS_STATE: &str = "off (Service lease timings a ride cannot start in time with: svc_leaseduration minus svc_retryperiod must exceed about 3.2 s, e.g. 5/3/1 as `vipd manifest` writes); Service VIPs go at the renew deadline during an API server outage";

/// The ride state on `/readyz` when ride-through, on by default, could not start (no
/// Services interface for the peer protocol, or no socket on it; the log says which).
const RIDE_NO_START_STATE: &str = "off (on by default but cannot start on this node: no Services interface for the peer protocol, see the log; set vip_servicesinterface); Service VIPs go at the renew deadline during an API server outage";

/// Why the Services wing cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    /// Building the Services' Kubernetes clients failed.
    #[error(transparent)]
    Client(#[from] crate::kube::client::ClientError),
    /// `svc_ridethrough` cannot start: the Services interface, the socket or the timings
    /// (the message names which and how to fix it; a missing peer key is not an error).
    #[error("{0}")]
    RideThrough(String),
    /// The Service lease timings (`svc_leaseduration`, `svc_renewdeadline`,
    /// `svc_retryperiod`) cannot be fenced.
    #[error(transparent)]
    Fence(#[from] crate::lease::TimingError),
    /// `enable_service_security` is on but its nftables table cannot be created (no
    /// nf_tables `inet` family, no CAP_NET_ADMIN).
    #[error("enable_service_security: {0}")]
    ServiceSecurity(#[from] crate::net::nft::svcsec::SvcSecError),
}

/// What the Services wing shares with the rest of the manager.
pub struct Parts {
    /// The kernel the VIPs go to.
    pub kernel: Arc<NetlinkKernel>,
    /// The process's shared dump of the node's addresses over `kernel`, kept until they
    /// change ([`CachedKernel::watched_or_aged`]): the wing's VIP holders read and write
    /// their addresses through it (writes invalidate it).
    pub addresses: Arc<CachedKernel<NetlinkKernel>>,
    /// `addresses` with IPv6 VIPs on `lo` as local routes (`svc_ipv6_loopback`, docs/design.md
    /// "IPv6 VIPs on lo"), the process's one: the wing's holders use it when the VIPs go on
    /// `lo`; the manager counts its routes as VIPs held.
    pub loopback: Arc<LoopbackRoutes<CachedKernel<NetlinkKernel>, NetlinkKernel>>,
    /// The manager's holder settings; the wing keeps their DAD, conflict probe window,
    /// conflict monitor and ARP guard, and derives the fence and timings from the Service
    /// lease timings.
    pub holder_cfg: HolderConfig,
    /// Metrics of the elections, holders and Services.
    pub metrics: Metrics,
    /// `/readyz` conditions (watch health, duplicate identity).
    pub readiness: Readiness,
    /// Why this node may not announce Service VIPs now (`None`: eligible), from
    /// [`crate::nodes::eligibility::follow`]: closes every group's
    /// [`crate::nodes::eligibility::GATE_INELIGIBLE`].
    pub ineligible: watch::Receiver<Option<Ineligible>>,
    /// The DHCP client (issue 13): the holder of a Service whose address is `0.0.0.0` / `::`
    /// starts one client per such Service through it, as kube-vip does without any option.
    /// `None` when rtnetlink could not be opened: such Services then get no address and an
    /// error is logged.
    pub dhcp: Option<Arc<dyn crate::dhcp::Dhcp>>,
    /// Where every pass reports the Services with egress annotations
    /// ([`crate::kube::service::EgressFacts`], for the egress wing); `None`: nobody reads.
    pub egress: Option<crate::kube::service::EgressTx>,
    /// The process's Node cache (every Node): node addresses, this node's labels, pod
    /// CIDRs and the peer membership; a change of it starts a pass.
    pub nodes: crate::nodes::NodeCache,
    /// The process's Services cache (shared with the allocator): a change of it starts a
    /// pass.
    pub services: crate::kube::service::ServiceCache,
    /// Routing-table mode (`vip_routingtable`): the process's one [`RouteKernel`], shared
    /// with the control-plane VIP (one set of fence devices, one clean-up at start); the
    /// holders route Service VIPs through it. `None`: addresses and ARP/NDP.
    pub routes: Option<Arc<RouteKernel>>,
}

/// The running Services wing.
pub struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops every group task (VIPs dropped, then leases released) and the watches, and
    /// waits for them.
    pub async fn stop(self) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            error!(error = %e, "Services task failed");
        }
    }
}

/// Starts the Services side of `vipd manager` (`svc_enable`): its clients, watches and
/// one election + VIP holder per Lease, until [`Running::stop`].
///
/// # Errors
/// [`ServicesError`] when the Service lease timings cannot be fenced or the clients
/// cannot be built.
pub async fn start(cfg: &Arc<Settings>, parts: Parts) -> Result<Running, ServicesError> {
    let holder_cfg = HolderConfig {
        skip_dad: parts.holder_cfg.skip_dad,
        probe_window: parts.holder_cfg.probe_window,
        conflict_monitor: parts.holder_cfg.conflict_monitor.clone(),
        arp_guard: parts.holder_cfg.arp_guard.clone(),
        nft_fence: parts.holder_cfg.nft_fence.clone(),
        announce_pace: parts.holder_cfg.announce_pace.clone(),
        ..HolderConfig::from_timing(&cfg.services_timing, cfg.arp_rate, cfg.nft_fence)?
    };
    // With the nftables fence running, a Service VIP's element fences it and its address
    // is a second line refreshed a minute before it runs out, not at every renewal
    // (docs/design.md, "The second line"): thousands of VIPs per node otherwise cost seconds of kernel time per
    // second. The control-plane VIP keeps the address fence (one address costs nothing).
    let holder_cfg = match (cfg.routing_table, holder_cfg.nft_fence.active()) {
        // Routing-table mode: the route's lifetime is the fence (no element, no ARP/NDP).
        (Some(_), _) => route_holder_cfg(cfg)?,
        (None, true) => HolderConfig {
            fence: crate::lease::with_second_line(holder_cfg.fence),
            // IPv6 VIPs on `lo`, answered by vipd while their elements run
            // (docs/design.md "IPv6 VIPs on lo"): one responder for the process.
            nd_answers: cfg.services_ipv6_loopback.then(|| {
                let answers: Arc<dyn crate::net::nd_responder::SolicitationAnswers> =
                    Arc::new(crate::net::nd_responder::NdResponder::new());
                answers
            }),
            ..holder_cfg
        },
        (None, false) => holder_cfg,
    };
    if cfg.services_ipv6_loopback && holder_cfg.nd_answers.is_none() {
        warn!(
            "svc_ipv6_loopback has no effect here: IPv6 Service VIPs on lo need the nftables fence (vip_nftfence) and no routing-table mode; they stay on their interface"
        );
    } else if holder_cfg.nd_answers.is_some() {
        info!(
            "IPv6 Service VIPs go on lo as local routes (table local, proto 118); vipd answers their neighbour solicitations on their interface while their nftables elements run (svc_ipv6_loopback)"
        );
    }
    if holder_cfg.fence.second_line_secs > 0 {
        info!(
            second_line_secs = holder_cfg.fence.second_line_secs,
            refresh_left_secs = holder_cfg.fence.second_line_refresh_secs,
            fence_secs = holder_cfg.fence.address_secs,
            "Service VIPs: the nftables fence ends each VIP's answers at its lease; addresses get a lifetime of at least {} s as its second line (half a second per VIP the node holds, at most {} s), refreshed when {} s are left",
            holder_cfg.fence.second_line_secs,
            crate::lease::SECOND_LINE_MAX_SECS,
            holder_cfg.fence.second_line_refresh_secs
        );
    }
    match parts.routes.clone() {
        Some(routes) => {
            // Per-Service holders share one route dump per check interval.
            let cached = Arc::new(CachedKernel::new(routes, Duration::from_millis(200)));
            launch(cfg, parts, holder_cfg, cached, Arc::new(NoAnnouncer)).await
        }
        // IPv6 VIPs on `lo` as local routes, the others as addresses (docs/design.md
        // "IPv6 VIPs on lo").
        None if holder_cfg.nd_answers.is_some() => {
            let kernel = parts.loopback.clone();
            launch(cfg, parts, holder_cfg, kernel, Arc::new(RawAnnouncer)).await
        }
        None => {
            // The holders share the process's address dump (kept until the node's
            // addresses change, `Parts::addresses`).
            let cached = parts.addresses.clone();
            launch(cfg, parts, holder_cfg, cached, Arc::new(RawAnnouncer)).await
        }
    }
}

/// Starts the wing's task with `kernel` and `announcer` (addresses and ARP/NDP, or routes
/// and nothing to announce).
async fn launch<K: Kernel, A: Announcer>(
    cfg: &Arc<Settings>,
    parts: Parts,
    holder_cfg: HolderConfig,
    cached: Arc<K>,
    announcer: Arc<A>,
) -> Result<Running, ServicesError> {
    let elections = crate::election::own_runtime::election_runtime();
    let clients = crate::kube::client::services_clients(&cfg.kube, elections.as_ref()).await?;
    let ride = match cfg.services_ride_through {
        true => match ride_setup(cfg, cached.as_ref(), &holder_cfg).await {
            Ok(r) => Some(r),
            // On by default: never a reason not to start (as without the key).
            Err(e) if !cfg.services_ride_through_set => {
                warn!(error = %e, "Service VIPs do not ride through API server outages: ride-through, on by default, cannot start on this node (set vip_servicesinterface, or svc_ridethrough=false to silence this; a restart tries again)");
                parts.readiness.set_ride_state(Some(RIDE_NO_START_STATE));
                None
            }
            Err(e) => return Err(e),
        },
        false => {
            // Off with timings a ride starts in time with means the option said so.
            let state = if crate::peer::ridethrough::RideConfig::start_ok_for(&cfg.services_timing)
            {
                RIDE_OFF_STATE
            } else {
                RIDE_OFF_TIMINGS_STATE
            };
            info!(
                lease_duration_s = cfg.services_timing.lease_duration.as_secs_f64(),
                retry_period_s = cfg.services_timing.retry_period.as_secs_f64(),
                "Service VIPs do not ride through API server outages: ride-through {state}"
            );
            parts.readiness.set_ride_state(Some(state));
            None
        }
    };
    let security = super::security::Security::start(cfg.service_security).await?;
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(
        cfg.clone(),
        clients,
        ride,
        security,
        cached,
        announcer,
        holder_cfg,
        parts.metrics,
        parts.readiness,
        parts.ineligible,
        parts.dhcp,
        parts.egress,
        parts.nodes,
        parts.services,
        stop.clone(),
    ));
    Ok(Running { stop, task })
}

/// The caches of Services, Nodes and endpoints, and the notification of their changes.
struct Caches {
    services: Store<Service>,
    /// The process's Services cache (its first list: [`crate::kube::watch::SharedCache::ready`]).
    service_cache: crate::kube::service::ServiceCache,
    /// Node addresses: a Service must never take another node's own address (the store of
    /// `node_cache`).
    nodes: Store<Node>,
    /// The process's Node cache (its first list: [`crate::nodes::NodeCache::ready`]).
    node_cache: crate::nodes::NodeCache,
    endpoints: EndpointStore,
    /// Woken by every change of a cache.
    changed: Arc<Notify>,
}

impl Caches {
    /// Waits for every cache's first full list; `false` when `shutdown` came first. No
    /// plan before: a plan made without the Nodes could announce a node's own address, one
    /// without the Services could stop groups.
    async fn ready(&self, shutdown: &CancellationToken) -> bool {
        let ready = async {
            let _ = tokio::join!(
                self.service_cache.ready(),
                self.node_cache.ready(),
                self.endpoints.wait_until_ready(),
            );
        };
        tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = ready => {
                info!("Services: initial lists of Services, Nodes and endpoints loaded");
                true
            }
        }
    }
}

/// Starts the reflectors on endpoints (until `watches`), reporting to `activity`; the
/// Services and the Nodes come from the process's caches `services` and `nodes`, whose
/// changes wake the wing like those of its own caches.
async fn start_caches(
    cfg: &Settings,
    client: &kube::Client,
    services: &crate::kube::service::ServiceCache,
    nodes: &crate::nodes::NodeCache,
    activity: &WatchActivity,
    watches: &CancellationToken,
) -> Caches {
    let namespace = cfg.services_namespace.as_deref();
    let changed = Arc::new(Notify::new());
    services.wake(changed.clone(), watches.clone());
    nodes.wake(changed.clone(), watches.clone());
    // Endpoints for externalTrafficPolicy Local: EndpointSlice v1 where the server has it
    // (1.21+), else core Endpoints (the lab's v1.20).
    let endpoints = if endpointslice_v1_served(client).await {
        info!("reading endpoints from discovery.k8s.io/v1 EndpointSlices");
        let api: Api<EndpointSlice> = scoped_api(client, namespace);
        let (store, writer) = reflector::store();
        spawn_reflector(
            "endpointslices",
            api,
            writer,
            changed.clone(),
            watches.clone(),
            activity.clone(),
            strip_metadata::<EndpointSlice>,
            None,
        );
        EndpointStore::Slices(store)
    } else {
        info!("EndpointSlice v1 not served; reading core v1 Endpoints");
        let ep_api: Api<Endpoints> = scoped_api(client, namespace);
        let (store, writer) = reflector::store();
        spawn_reflector(
            "endpoints",
            ep_api,
            writer,
            changed.clone(),
            watches.clone(),
            activity.clone(),
            strip_metadata::<Endpoints>,
            None,
        );
        EndpointStore::Endpoints(store)
    };
    Caches {
        services: services.store().clone(),
        service_cache: services.clone(),
        nodes: nodes.store().clone(),
        node_cache: nodes.clone(),
        endpoints,
        changed,
    }
}

/// The planner's settings from the configuration.
fn plan_config(cfg: &Settings) -> PlanConfig {
    PlanConfig {
        mode: if cfg.services_unelected {
            Mode::Unelected
        } else if cfg.services_election && cfg.services_lease_shards > 0 {
            Mode::Sharded(Shards {
                namespace: cfg
                    .services_namespace
                    .clone()
                    .unwrap_or_else(|| cfg.cp_namespace.clone()),
                count: cfg.services_lease_shards,
            })
        } else if cfg.services_election {
            Mode::PerService
        } else {
            Mode::Global(LeaseRef {
                namespace: cfg.cp_namespace.clone(),
                name: cfg.services_lease_name.clone(),
            })
        },
        control_plane: if cfg.control_plane {
            cfg.addresses.clone()
        } else {
            Vec::new()
        },
        interface: cfg
            .services_interface
            .clone()
            .or_else(|| cfg.interface.clone()),
        subnet: cfg.vip_subnet,
    }
}

/// Runs the Services side of `vipd manager` until `shutdown`, then stops every group task
/// (dropping VIPs and releasing leases) before returning.
#[allow(clippy::too_many_arguments)] // each one is a separate part the manager owns
async fn run<K: Kernel, A: Announcer>(
    cfg: Arc<Settings>,
    clients: crate::kube::client::ServicesClients,
    ride: Option<RideSetup>,
    security: Option<Arc<super::security::Security>>,
    kernel: Arc<K>,
    announcer: Arc<A>,
    holder_cfg: HolderConfig,
    metrics: Metrics,
    readiness: Readiness,
    ineligible: watch::Receiver<Option<Ineligible>>,
    dhcp: Option<Arc<dyn crate::dhcp::Dhcp>>,
    egress: Option<crate::kube::service::EgressTx>,
    nodes: crate::nodes::NodeCache,
    services: crate::kube::service::ServiceCache,
    shutdown: CancellationToken,
) {
    let dhcp = dhcp_client(dhcp);
    let watches = CancellationToken::new();
    let client = clients.other.clone();
    let namespace = cfg.services_namespace.as_deref();
    // Watch health: a watch silent past its timeout fails /readyz (watch-stalled:<kind>).
    let activity = clients.watches.clone();
    readiness.track_watches(activity.clone());
    activity.spawn_monitor(watches.clone());
    let caches = start_caches(&cfg, &client, &services, &nodes, &activity, &watches).await;
    let lease_namespace = match cfg.services_election {
        true => namespace,
        false => Some(cfg.cp_namespace.as_str()),
    };
    let hub = LeaseHub::start(client.clone(), lease_namespace, activity, watches.clone());
    // Heartbeats start here, after the manager's start-up cleanup removed a previous
    // process's VIPs; membership comes from the Node cache.
    let ride = ride.map(|r| {
        r.start(
            &cfg.node_name,
            &clients.leases,
            &caches.nodes,
            &metrics,
            &readiness,
            &watches,
        )
    });
    // The node's takeovers in progress: marked by its Service VIP holders, given way to by
    // its status writes (holder::takeovers).
    let takeovers = Arc::new(crate::holder::takeovers::Takeovers::default());
    // Shard leases and the own leases beside them spread apart (Shared::own_spread).
    let (spread, own_spread) = match plan_config(&cfg).mode {
        Mode::Sharded(_) => (
            crate::election::spread::Spread::for_shards(),
            crate::election::spread::Spread::new(),
        ),
        _ => {
            let spread = crate::election::spread::Spread::new();
            (spread.clone(), spread)
        }
    };
    let shared = Arc::new(Shared {
        egress,
        ride,
        dhcp,
        failback: cfg.services_failback,
        security: security.clone(),
        node: cfg.node_name.clone(),
        mode: plan_config(&cfg).mode,
        timing: cfg.services_timing,
        holder_cfg: HolderConfig {
            check_following: false,
            takeovers: takeovers.clone(),
            ..holder_cfg
        },
        kernel,
        announcer,
        lease_client: clients.leases.clone(),
        elections: clients.elections.clone(),
        hub,
        // Status and Event writes give way to the node's takeovers (holder::takeovers).
        status: KubeStatusWriter::new(client.clone(), &cfg.node_name).giving_way_to(takeovers),
        services: caches.services.clone(),
        metrics,
        readiness,
        services_seen: watch::channel(0).0,
        ineligible,
        health: super::health::HealthSettings {
            default: cfg.services_health.check.clone(),
            policy: super::health::HealthPolicy {
                hold: cfg.services_health.hold,
                ..Default::default()
            },
        },
        spread,
        own_spread,
        outage: crate::election::outage::ApiOutage::new(cfg.services_timing.retry_period),
    });
    let plan_cfg = plan_config(&cfg);
    info!(mode = ?plan_cfg.mode, namespace = namespace.unwrap_or("<all>"), "Services: watching LoadBalancer Services");
    let security_stop = CancellationToken::new();
    let security = security.map(|s| s.spawn(security_stop.clone()));
    if !caches.ready(&shutdown).await {
        security_stop.cancel();
        if let Some(task) = security {
            let _ = task.await;
        }
        watches.cancel();
        return;
    }
    if !caches
        .services
        .state()
        .iter()
        .any(|s| crate::kube::service::is_load_balancer(s))
    {
        // Nothing to campaign for at start: no cold start to share, so the Services created
        // from now on are raced without the spread's discovery period.
        shared.spread.end_discovery();
        shared.own_spread.end_discovery();
    }
    spawn_lease_gc(&cfg, &plan_cfg, &client, &caches, &watches);
    let mut main = MainLoop::new(cfg, shared, plan_cfg, caches);
    main.run_until(&shutdown).await;
    main.stop().await;
    // The groups have dropped their VIPs: the table goes.
    security_stop.cancel();
    if let Some(task) = security {
        let _ = task.await;
    }
    watches.cancel();
}

/// Collects the leases of Services deleted while their holder was down (see lease_gc):
/// per-Service leases, or the Local Services' own leases beside the global one; nothing
/// without election.
fn spawn_lease_gc(
    cfg: &Settings,
    plan_cfg: &PlanConfig,
    client: &kube::Client,
    caches: &Caches,
    watches: &CancellationToken,
) {
    let namespace = match &plan_cfg.mode {
        Mode::PerService | Mode::Sharded(_) => cfg.services_namespace.clone(),
        Mode::Global(g) => Some(g.namespace.clone()),
        // No Lease is ever written: none to collect (and another vipd's leases in the
        // cluster are not this one's to delete).
        Mode::Unelected => return,
    };
    // One collector for the cluster: the holder of the GC lease.
    let gc_namespace = namespace
        .clone()
        .unwrap_or_else(|| cfg.cp_namespace.clone());
    let leases = KubeLeaseClient::new(client.clone(), &gc_namespace, super::lease_gc::GC_LEASE);
    let (elector, leadership) = crate::election::Elector::new(
        leases,
        cfg.node_name.clone(),
        super::lease_gc::GC_LEASE_TIMING,
        &crate::election::Gates::default(),
    );
    let collector = leadership.state.clone();
    // Nothing to drop but the collecting, which stops at its next tick: every term is
    // acknowledged at once, so a clean stop releases the GC lease.
    tokio::spawn(crate::election::acknowledge_terms(leadership));
    tokio::spawn(elector.run(watches.clone()));
    tokio::spawn(super::lease_gc::run(
        client.clone(),
        namespace,
        plan_cfg.mode.clone(),
        caches.services.clone(),
        cfg.services_timing.lease_duration,
        collector,
        watches.clone(),
    ));
}

/// The DHCP client the wing's groups use (an error is logged when there is none: Services
/// with address `0.0.0.0` / `::` then get no address).
fn dhcp_client(dhcp: Option<Arc<dyn crate::dhcp::Dhcp>>) -> Option<Arc<dyn crate::dhcp::Dhcp>> {
    if dhcp.is_none() {
        error!("this vipd runs no DHCP client: Services with address 0.0.0.0 / :: get no address");
    }
    dhcp
}

/// The main loop's state between passes.
struct MainLoop<K: Kernel, A: Announcer> {
    cfg: Arc<Settings>,
    shared: Arc<Shared<K, A>>,
    plan_cfg: PlanConfig,
    caches: Caches,
    groups: BTreeMap<LeaseRef, GroupHandle>,
    gov: Governance,
    reported: Reported,
    cleared: HashSet<String>,
    /// Notes whose Event or a status clear failed are tried again after a back-off, also
    /// when no cache changes meanwhile.
    retry: Retry,
    subnets: ConnectedSubnets,
    namespaces_counted: BTreeMap<String, usize>,
    write_rate_warned: Option<usize>,
}

impl<K: Kernel, A: Announcer> MainLoop<K, A> {
    fn new(
        cfg: Arc<Settings>,
        shared: Arc<Shared<K, A>>,
        plan_cfg: PlanConfig,
        caches: Caches,
    ) -> Self {
        MainLoop {
            cfg,
            shared,
            plan_cfg,
            caches,
            groups: BTreeMap::new(),
            gov: Governance {
                prev: BTreeMap::new(),
                retiring: BTreeMap::new(),
                settled: Arc::new(Notify::new()),
                held_back: BTreeMap::new(),
            },
            reported: Reported::default(),
            cleared: HashSet::new(),
            retry: Retry::default(),
            subnets: ConnectedSubnets::default(),
            namespaces_counted: BTreeMap::new(),
            write_rate_warned: None,
        }
    }

    /// Makes a pass on every change (of a cache, of the node's addresses, a finished
    /// handover, a retry due) until `shutdown`.
    async fn run_until(&mut self, shutdown: &CancellationToken) {
        // The node's own addresses decide which Services it may announce (the subnet rule):
        // a change of them alone starts a pass too.
        let mut addresses = tokio::time::interval(ConnectedSubnets::REFRESH);
        addresses.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = PassTimes::default();
        loop {
            let settle = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.caches.changed.notified() => true,
                // A handover finished: held-back addresses may be bound now, without delay.
                _ = self.gov.settled.notified() => false,
                _ = self.retry.wait() => false,
                _ = addresses.tick() => {
                    if !self.subnets.changed(&*self.shared.kernel).await {
                        continue;
                    }
                    debug!("Services: the node's addresses changed");
                    false
                }
            };
            if settle {
                // Let a burst of events settle into one recomputation, and keep passes
                // from taking more than a share of the node's CPU (see `next_pass_at`).
                let now = tokio::time::Instant::now();
                tokio::time::sleep_until(next_pass_at(now, last)).await;
            }
            let started = tokio::time::Instant::now();
            self.pass().await;
            let ended = tokio::time::Instant::now();
            last = PassTimes {
                ended: Some(ended),
                took: ended - started,
            };
            self.shared.service_metrics().pass(last.took);
        }
    }

    /// One pass over the caches: plan, metrics, notes and stale status, then the groups.
    async fn pass(&mut self) {
        let services = self.caches.services.state();
        let (candidates, mut notes) = self.candidates(&services).await;
        self.report_egress(&candidates, &services);
        let plan = desired::plan_leases(&candidates, &self.plan_cfg);
        let endpointless = decide::endpointless(
            &plan,
            &self.caches.endpoints.without_ready_endpoint(&services),
        );
        self.count(&plan);
        notes.extend(decide::endpointless_notes(&plan, &endpointless, &services));
        let retry_failed = self.retry.due();
        let shared = &self.shared;
        let mut ok = report(
            &shared.status,
            &plan,
            &services,
            notes,
            &mut self.reported,
            retry_failed,
        )
        .await;
        ok &= clear_stale(
            &shared.status_ctx(),
            &plan,
            &endpointless,
            &services,
            &mut self.cleared,
        )
        .await;
        self.retry.after(ok);
        reconcile_groups(shared, &plan, &candidates, &mut self.groups, &mut self.gov).await;
        shared.services_seen.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Sends the egress facts of this pass when they changed.
    fn report_egress(&self, candidates: &[Candidate], services: &[Arc<Service>]) {
        let Some(tx) = &self.shared.egress else {
            return;
        };
        // Without egress Services (the usual case) no endpoint or Node is looked at.
        let mut facts = decide::egress_facts(candidates, services);
        let report = match facts.is_empty() {
            true => crate::kube::service::EgressReport::default(),
            false => {
                let wanted: HashSet<(String, String)> = facts
                    .iter()
                    .map(|f| (f.namespace.clone(), f.name.clone()))
                    .collect();
                let local = self
                    .caches
                    .endpoints
                    .node_addresses(&self.cfg.node_name, &wanted);
                for f in &mut facts {
                    let key = (f.namespace.clone(), f.name.clone());
                    f.local_endpoints = local.get(&key).cloned().unwrap_or_default();
                }
                crate::kube::service::EgressReport {
                    services: facts,
                    node_pod_cidrs: crate::nodes::pod_cidrs(&self.caches.nodes.state()),
                }
            }
        };
        tx.send_if_modified(|cur| {
            let changed = **cur != report;
            if changed {
                *cur = Arc::new(report);
            }
            changed
        });
    }

    /// The candidate Services of `services` and the notes about the others.
    async fn candidates(&mut self, services: &[Arc<Service>]) -> (Vec<Candidate>, Vec<Note>) {
        let cfg = &self.cfg;
        let local = self.caches.endpoints.local_ready(&cfg.node_name);
        let nodes = self.caches.nodes.state();
        let node_addrs = node_addresses(&nodes);
        let connected = self.subnets.get(&*self.shared.kernel).await;
        let unusable = Unusable {
            control_plane: if cfg.control_plane {
                cfg.addresses.clone()
            } else {
                Vec::new()
            },
            vip_subnet: cfg.vip_subnet,
            connected: connected.iter().map(|c| (c.addr, c.prefix)).collect(),
        };
        let here = ThisNode {
            labels: nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(cfg.node_name.as_str()))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default(),
            connected,
            interface: self.plan_cfg.interface.clone(),
            subnet_check: cfg.services_subnet_check,
        };
        candidates(cfg, services, &local, &node_addrs, &unusable, &here)
    }

    /// The active-Services gauges per namespace and the lease write rate warning.
    fn count(&mut self, plan: &Plan) {
        let per_ns = decide::per_namespace(plan);
        let metrics = self.shared.service_metrics();
        for ns in self
            .namespaces_counted
            .keys()
            .filter(|ns| !per_ns.contains_key(*ns))
        {
            metrics.forget_namespace(ns);
        }
        for (ns, n) in &per_ns {
            metrics.active_services(ns, *n);
        }
        self.namespaces_counted = per_ns;
        // Without election no Lease is written: nothing to warn about.
        if self.plan_cfg.mode.elects() {
            self.write_rate_warned =
                warn_lease_write_rate(plan, self.shared.timing, self.write_rate_warned);
        }
    }

    /// Stops every retirement and group task and waits for the groups (VIPs dropped,
    /// leases released).
    async fn stop(self) {
        info!(groups = self.groups.len(), "Services: stopping");
        for r in self.gov.retiring.values().flatten() {
            r.stop.cancel();
        }
        let groups: Vec<GroupHandle> = self.groups.into_values().collect();
        for g in &groups {
            g.cancel(false, None, BTreeSet::new());
        }
        for g in groups {
            let _ = g.join().await;
        }
    }
}

/// When and how long the last pass over the Services cache ran.
#[derive(Debug, Clone, Copy, Default)]
struct PassTimes {
    /// When it ended (`None`: no pass yet).
    ended: Option<tokio::time::Instant>,
    /// How long it took.
    took: Duration,
}

/// The quiet time after a cache change before a pass starts, so a burst of events (a
/// Deployment's EndpointSlices, a batch of Services) makes one pass: 20 ms.
pub(crate) const PASS_SETTLE: Duration = Duration::from_millis(20);

/// A pass that took `d` is followed by at least `PASS_PACE × d` without a pass caused by
/// cache changes: passes then use at most a third of a core however fast the Services
/// change (a pass reads every Service: about 0.2 s at 10 000 on a 2-core VM, and at
/// 10 000 Services each status write the holders make comes back as an event).
pub(crate) const PASS_PACE: u32 = 2;

/// The longest pause [`PASS_PACE`] makes between two passes: 2 s.
pub(crate) const MAX_PASS_GAP: Duration = Duration::from_secs(2);

/// When the pass caused by a cache change seen at `now` starts, after the `last` pass: at
/// least [`PASS_SETTLE`] after `now`, and at least `PASS_PACE ×` its duration (at most
/// [`MAX_PASS_GAP`]) after it ended. A change made while waiting joins this pass. Passes
/// woken by a finished handover, a due retry or a change of the node's addresses do not
/// wait.
fn next_pass_at(now: tokio::time::Instant, last: PassTimes) -> tokio::time::Instant {
    let settled = now + PASS_SETTLE;
    match last.ended {
        Some(ended) => settled.max(ended + (last.took * PASS_PACE).min(MAX_PASS_GAP)),
        None => settled,
    }
}

/// Cluster-wide Service lease writes per second above which vipd warns: each held lease is
/// renewed once per retry period, and small API servers (k3s with SQLite, a busy etcd)
/// start to fall behind at a few hundred writes per second.
pub(crate) const LEASE_WRITES_WARN_PER_S: f64 = 200.0;

/// Expected Service lease writes per second for `leases` held leases at `timing` (one
/// renewal per retry period, client-go's cadence).
pub fn lease_writes_per_s(leases: usize, timing: Timing) -> f64 {
    leases as f64 / timing.retry_period.as_secs_f64().max(0.001)
}

/// Retry period (whole seconds) that keeps `leases` leases at or below
/// [`LEASE_WRITES_WARN_PER_S`].
pub(crate) fn suggested_retry_secs(leases: usize) -> u64 {
    (leases as f64 / LEASE_WRITES_WARN_PER_S).ceil().max(1.0) as u64
}

/// Warns when the plan's lease count at the Service timings means more than
/// [`LEASE_WRITES_WARN_PER_S`] lease writes per second, with timings that would not: once
/// when the rate crosses the threshold, again each time the lease count grew by half since
/// the last warning. Returns the lease count last warned about (`None` while below).
fn warn_lease_write_rate(plan: &Plan, timing: Timing, warned: Option<usize>) -> Option<usize> {
    let leases = plan.groups.len();
    let rate = lease_writes_per_s(leases, timing);
    if rate <= LEASE_WRITES_WARN_PER_S {
        return None;
    }
    if warned.is_none_or(|w| leases >= w + w / 2) {
        let retry = suggested_retry_secs(leases);
        warn!(
            leases,
            writes_per_s = rate.round() as u64,
            retry_period_s = timing.retry_period.as_secs_f64(),
            "Service leases will cost about {:.0} lease writes per second across the cluster (one per lease per retry period); if the API server falls behind, leases flap. Consider shard leases (svc_leaseshards=32 with svc_election: 32 writes per retry period whatever the number of Services), or svc_retryperiod={retry} svc_renewdeadline={} svc_leaseduration={}",
            rate,
            retry * 2,
            retry * 3
        );
        return Some(leases);
    }
    warned
}

/// Applies a plan to this node's group tasks: stops those [`decide::stops`] names (after
/// subscribing to the leases that retire), follows the retirements whose handover is not
/// done, then starts or updates the groups [`decide::runs`] admits.
async fn reconcile_groups<K: Kernel, A: Announcer>(
    shared: &Arc<Shared<K, A>>,
    plan: &Plan,
    candidates: &[Candidate],
    groups: &mut BTreeMap<LeaseRef, GroupHandle>,
    gov: &mut Governance,
) {
    prune_retirements(&mut gov.retiring);
    let running: BTreeSet<LeaseRef> = groups.keys().cloned().collect();
    let stops = decide::stops(&gov.prev, plan, &running, &shared.mode);
    gov.prev = crate::services::plan::governance::governors(plan);
    // Subscribe to every retiring lease before its group stops, so that no change (the
    // holder's release) falls between what the elector saw and what the retirement sees.
    let kept = stops.kept;
    let retiring: Vec<_> = stops
        .retire
        .into_iter()
        .map(|(lease, addrs)| {
            let client =
                KubeLeaseClient::new(shared.lease_client.clone(), &lease.namespace, &lease.name)
                    .with_hub(shared.hub.clone());
            let events = client.watch();
            (lease, addrs, client, events)
        })
        .collect();
    let ends = stop_groups(groups, stops.stop).await;
    for (lease, addrs, client, events) in retiring {
        let view = ends
            .get(&lease)
            .map(LeaseView::from_end)
            .unwrap_or_else(|| LeaseView::unknown(tokio::time::Instant::now()));
        if handover_done(&view) {
            debug!(%lease, "retiring lease released or gone: its addresses may move at once");
            continue;
        }
        // A shared lease keeps running without the moved addresses: its holder dropped them
        // on the same Service change, so the handover is done one lease duration from now
        // at the latest (the new holder's conflict probe is the backstop).
        let done_by = kept
            .contains(&lease)
            .then(|| tokio::time::Instant::now() + shared.timing.lease_duration);
        start_retirement(shared, gov, lease, addrs, client, events, view, done_by);
    }
    let retiring = retiring_addrs(&gov.retiring);
    let running: BTreeSet<LeaseRef> = groups.keys().cloned().collect();
    let runs = decide::runs(plan, candidates, &running, &retiring);
    for (lease, addrs) in &runs.held_back {
        if gov.held_back.get(lease) != Some(addrs) {
            info!(%lease, addresses = ?addrs, "Services: not binding these addresses until the lease that governed them before is released or expires");
        }
    }
    gov.held_back = runs.held_back;
    for (lease, spec) in runs.specs {
        match groups.get(&lease) {
            Some(g) => g.update(spec),
            None => {
                let g = GroupHandle::spawn(shared, &lease, spec);
                groups.insert(lease, g);
            }
        }
    }
}

/// Stops the groups in `orders` one after the other (each drops its VIPs, releases its
/// lease and deletes it when ordered); how each election ended.
async fn stop_groups(
    groups: &mut BTreeMap<LeaseRef, GroupHandle>,
    orders: Vec<StopOrder>,
) -> BTreeMap<LeaseRef, ElectionEnd> {
    let mut ends = BTreeMap::new();
    for StopOrder {
        lease,
        delete_lease,
        not_here,
        continued_macs,
    } in orders
    {
        if let Some(g) = groups.remove(&lease) {
            match &not_here {
                Some(why) => {
                    info!(%lease, reason = %why.message, "Services: this node may not announce the lease's Services any more; stopping election")
                }
                None => info!(%lease, delete = delete_lease, "Services: stopping election"),
            }
            g.cancel(delete_lease, not_here, continued_macs);
            if let Some(end) = g.join().await {
                ends.insert(lease, end);
            }
        }
    }
    ends
}

/// Whether a retiring lease's handover is already done by what its elector saw (released,
/// or absent and seen so).
fn handover_done(view: &LeaseView) -> bool {
    governance::handover(None, view, tokio::time::Instant::now()) == Handover::Done
}

/// Drops the retirements whose handover is done, and the leases left with none.
fn prune_retirements(retiring: &mut BTreeMap<LeaseRef, Vec<Retirement>>) {
    for parts in retiring.values_mut() {
        parts.retain(|r| !r.done.load(std::sync::atomic::Ordering::SeqCst));
    }
    retiring.retain(|_, parts| !parts.is_empty());
}

/// Every retiring lease with the addresses it holds back (the union of its retirements).
fn retiring_addrs(
    retiring: &BTreeMap<LeaseRef, Vec<Retirement>>,
) -> BTreeMap<LeaseRef, BTreeSet<IpAddr>> {
    retiring
        .iter()
        .map(|(l, parts)| {
            let addrs = parts.iter().flat_map(|r| r.addrs.iter().copied()).collect();
            (l.clone(), addrs)
        })
        .collect()
}

/// Files a new retirement of `lease` with `addrs` beside those already running for it;
/// returns the addresses the new retirement must follow. A lease that keeps running
/// (`kept`: its handover is also done one lease duration after it began) adds a
/// retirement of its own and leaves the earlier ones as they are: merged, every new move
/// would push the bound of the earlier addresses back by one lease duration, and a shard
/// that keeps losing addresses more often than that would hold them back for ever. A
/// lease that stops (its holder releases it) replaces the earlier ones: the union is
/// followed again from the elector's last view.
fn file_retirement(
    retiring: &mut BTreeMap<LeaseRef, Vec<Retirement>>,
    lease: &LeaseRef,
    mut addrs: BTreeSet<IpAddr>,
    kept: bool,
) -> BTreeSet<IpAddr> {
    if !kept && let Some(old) = retiring.remove(lease) {
        for r in old {
            r.stop.cancel();
            addrs.extend(r.addrs);
        }
    }
    addrs
}

/// Starts following a retiring lease (see [`governance::follow`]); its addresses are held
/// back from other leases until it is done, or until `done_by` for a lease that keeps
/// running ([`decide::Stops::kept`]). How it joins retirements of the same lease already
/// running: [`file_retirement`].
#[allow(clippy::too_many_arguments)]
fn start_retirement<K: Kernel, A: Announcer>(
    shared: &Arc<Shared<K, A>>,
    gov: &mut Governance,
    lease: LeaseRef,
    addrs: BTreeSet<IpAddr>,
    client: KubeLeaseClient,
    events: futures::stream::BoxStream<'static, crate::election::LeaseEvent>,
    view: LeaseView,
    done_by: Option<tokio::time::Instant>,
) {
    let addrs = file_retirement(&mut gov.retiring, &lease, addrs, done_by.is_some());
    debug!(%lease, addresses = ?addrs, holder = ?view.observed.as_ref().map(|o| o.record.holder.as_str()), kept = done_by.is_some(), "Services: retiring lease; other leases wait for its release or expiry (a kept shared lease: one lease duration at most) before binding its addresses");
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = CancellationToken::new();
    let (d, st, settled, timing, l) = (
        done.clone(),
        stop.clone(),
        gov.settled.clone(),
        shared.timing,
        lease.clone(),
    );
    tokio::spawn(async move {
        if governance::follow(client, events, view, timing, done_by, st).await {
            debug!(lease = %l, "Services: retiring lease released, deleted or expired");
            d.store(true, std::sync::atomic::Ordering::SeqCst);
            settled.notify_one();
        }
    });
    gov.retiring
        .entry(lease)
        .or_default()
        .push(Retirement { addrs, done, stop });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retirement(addrs: &[&str]) -> Retirement {
        Retirement {
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            done: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            stop: CancellationToken::new(),
        }
    }

    fn ips(addrs: &[&str]) -> BTreeSet<IpAddr> {
        addrs.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn a_kept_lease_that_loses_another_address_does_not_push_back_the_first_ones_bound() {
        let shard = LeaseRef {
            namespace: "kube-system".into(),
            name: "vipd-services-shard-1".into(),
        };
        let mut retiring = BTreeMap::new();
        // 192.0.2.150 left the shard at t0 (done by t0 + one lease duration).
        let first = retirement(&["192.0.2.150"]);
        let (first_done, first_stop) = (first.done.clone(), first.stop.clone());
        retiring.insert(shard.clone(), vec![first]);
        // 192.0.2.151 leaves it before that: followed on its own, with its own bound.
        let follow = file_retirement(&mut retiring, &shard, ips(&["192.0.2.151"]), true);
        assert_eq!(follow, ips(&["192.0.2.151"]), "only the new address");
        assert!(
            !first_stop.is_cancelled(),
            "the first retirement keeps its bound"
        );
        retiring
            .entry(shard.clone())
            .or_default()
            .push(retirement(&["192.0.2.151"]));
        assert_eq!(
            retiring_addrs(&retiring).get(&shard),
            Some(&ips(&["192.0.2.150", "192.0.2.151"]))
        );
        // The first bound passes: its address is free, the second still waits.
        first_done.store(true, std::sync::atomic::Ordering::SeqCst);
        prune_retirements(&mut retiring);
        assert_eq!(
            retiring_addrs(&retiring).get(&shard),
            Some(&ips(&["192.0.2.151"]))
        );
        // A lease that stops (released by its holder) follows the union again.
        let follow = file_retirement(&mut retiring, &shard, ips(&["192.0.2.152"]), false);
        assert_eq!(follow, ips(&["192.0.2.151", "192.0.2.152"]));
        assert!(!retiring.contains_key(&shard), "replaced");
        // Done everywhere: the lease leaves the map.
        let mut done = BTreeMap::new();
        let r = retirement(&["192.0.2.152"]);
        r.done.store(true, std::sync::atomic::Ordering::SeqCst);
        done.insert(shard.clone(), vec![r]);
        prune_retirements(&mut done);
        assert!(done.is_empty());
    }

    fn timing(retry_s: u64) -> Timing {
        Timing {
            lease_duration: Duration::from_secs(3 * retry_s),
            renew_deadline: Duration::from_secs(2 * retry_s),
            retry_period: Duration::from_secs(retry_s),
        }
    }

    #[test]
    fn passes_are_paced_by_their_cost() {
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        // The first pass: only the settle time.
        assert_eq!(next_pass_at(t0, PassTimes::default()), t0 + PASS_SETTLE);
        // A cheap pass long ago: only the settle time.
        let cheap = PassTimes {
            ended: Some(t0),
            took: ms(2),
        };
        assert_eq!(next_pass_at(t0 + ms(500), cheap), t0 + ms(520));
        // A 300 ms pass that just ended: twice its duration after its end.
        let dear = PassTimes {
            ended: Some(t0),
            took: ms(300),
        };
        assert_eq!(next_pass_at(t0 + ms(1), dear), t0 + ms(600));
        // ... but a change long after it waits only the settle time.
        assert_eq!(next_pass_at(t0 + ms(900), dear), t0 + ms(920));
        // A pass of 5 s: the gap is capped.
        let huge = PassTimes {
            ended: Some(t0),
            took: Duration::from_secs(5),
        };
        assert_eq!(next_pass_at(t0, huge), t0 + MAX_PASS_GAP);
        // Passes at most a third of the time under a constant stream of changes.
        let mut now = t0;
        let mut busy = Duration::ZERO;
        let mut last = PassTimes::default();
        for _ in 0..100 {
            let start = next_pass_at(now, last);
            let took = ms(250);
            busy += took;
            now = start + took;
            last = PassTimes {
                ended: Some(now),
                took,
            };
        }
        let share = busy.as_secs_f64() / (now - t0).as_secs_f64();
        assert!(share <= 0.34, "passes took {share:.2} of the time");
    }

    #[test]
    fn lease_write_rate_and_the_timings_suggested_against_it() {
        assert_eq!(lease_writes_per_s(1000, timing(1)), 1000.0);
        assert_eq!(lease_writes_per_s(300, timing(3)), 100.0);
        assert_eq!(suggested_retry_secs(0), 1);
        assert_eq!(suggested_retry_secs(200), 1);
        assert_eq!(suggested_retry_secs(201), 2);
        assert_eq!(suggested_retry_secs(1000), 5);
        for n in [1, 150, 201, 999, 1000, 5000] {
            let t = timing(suggested_retry_secs(n));
            assert!(
                lease_writes_per_s(n, t) <= LEASE_WRITES_WARN_PER_S,
                "{n} leases at the suggested retry period still exceed the threshold"
            );
        }
    }
}
