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
//! `kube-vip.io/vipHost` level-triggered (`StatusSync`: compared with the cache after every
//! pass over it, written when they differ, retried with back-off after a failure) and posts
//! one `AddressAnnounced` Event per change ([`status_diff`]). Services that are not
//! announced get a Warning naming the reason and the value (refused addresses:
//! [`Unusable`]); one whose `externalTrafficPolicy: Local` leaves it announced nowhere has
//! its status cleared ([`announced_nowhere`]). Event names are deterministic
//! ([`super::status::event_name`]), so nodes and restarts add no duplicates.
//!
//! Governance moves (S34): when an address moves to another lease, the previous lease
//! retires on every node and the address is held back from other leases until its handover
//! is done (see [`super::governance`]).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::desired::{self, Candidate, LeaseRef, Mode, Plan, PlanConfig};
use super::endpoints::{
    SERVICE_NAME_LABEL, endpointslice_v1_served, ready_local_endpoint_from_endpoints,
    ready_local_endpoint_from_slices,
};
use super::governance::{self, Handover, LeaseView};
use super::model::{self, PortProto, Selection, ServiceInfo, ServiceKey};
use super::status::{KubeStatusWriter, ServiceEvent, StatusWriter, desired_ingress};
use crate::admin::Readiness;
use crate::config::Config;
use crate::election::kube::{KubeLeaseClient, LeaseHub};
use crate::election::{ElectionEnd, Elector, Gates, LeaderState, LeaseClient, Timing};
use crate::metrics::Metrics;
use crate::net::conflict::fmt_mac;
use crate::net::{Announcer, Kernel};
pub use crate::nodes::node_addresses;
use crate::reconcile::{HolderConfig, VipHolder, VipSpec};

/// What a group task needs to know about the Services whose addresses it announces.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupSpec {
    /// VIPs governed by the group's lease.
    pub vips: Vec<VipSpec>,
    /// Services announced through this group, with the addresses and ports for their
    /// status, sorted by Service (a vector: a BTreeMap's first node alone is about 1 KiB,
    /// and there is one spec per lease, often with a single Service).
    pub services: Vec<(ServiceKey, Vec<IpAddr>, Vec<PortProto>)>,
}

struct GroupHandle {
    spec: watch::Sender<GroupSpec>,
    stop: CancellationToken,
    /// Set before `stop` when the group's Services are gone: delete the lease after
    /// releasing it.
    delete_lease: Arc<std::sync::atomic::AtomicBool>,
    /// The group's election end (`None` if the task panicked).
    join: JoinHandle<Option<ElectionEnd>>,
}

/// Governance moves (S34, see [`super::governance`]).
struct Governance {
    /// The governing lease of every address in the last plan.
    prev: BTreeMap<IpAddr, LeaseRef>,
    /// Retiring leases whose handover is not done yet.
    retiring: BTreeMap<LeaseRef, Retirement>,
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

/// Everything the group tasks share.
struct Shared<K: Kernel, A: Announcer> {
    node: String,
    /// Per-Service leases (deleted with their Service); the global lease is never deleted.
    per_service: bool,
    timing: Timing,
    holder_cfg: HolderConfig,
    kernel: Arc<K>,
    announcer: Arc<A>,
    /// For Lease reads and writes only (see `kubeclient::ServicesClients`).
    lease_client: kube::Client,
    hub: LeaseHub,
    status: KubeStatusWriter,
    services: Store<Service>,
    metrics: Metrics,
    /// `/readyz`: a lease written under this node's identity by another process fails it.
    readiness: Readiness,
    /// Bumped after every pass over the Services cache: group tasks then compare their
    /// Services' status with the cache (no API call when it matches) and restore it.
    services_seen: watch::Sender<u64>,
}

/// Runs the Services side of `vipd manager` until `shutdown`, then stops every group task
/// (dropping VIPs and releasing leases) before returning.
#[allow(clippy::too_many_arguments)] // each one is a separate part the manager owns
pub async fn run<K: Kernel, A: Announcer>(
    cfg: Arc<Config>,
    clients: crate::kubeclient::ServicesClients,
    kernel: Arc<K>,
    announcer: Arc<A>,
    holder_cfg: HolderConfig,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    let watches = CancellationToken::new();
    let client = clients.other.clone();
    let namespace = cfg.services_namespace.as_deref();
    let svc_api: Api<Service> = scoped_api(&client, namespace);
    let ep_api: Api<Endpoints> = scoped_api(&client, namespace);
    let changed = Arc::new(Notify::new());
    // Watch health: every watch below reports its events and (re)starts; a watch silent
    // for longer than its timeout plus a margin fails /readyz (watch-stalled:<resource>).
    let activity = clients.watches.clone();
    readiness.track_watches(activity.clone());
    activity.spawn_monitor(watches.clone());
    let (svc_store, svc_writer) = reflector::store();
    spawn_reflector(
        "services",
        svc_api,
        svc_writer,
        changed.clone(),
        watches.clone(),
        activity.clone(),
        strip_service,
    );
    // Node addresses: a Service must never take another node's own address.
    let (node_store, node_writer) = reflector::store::<Node>();
    let node_api: Api<Node> = Api::all(client.clone());
    spawn_reflector(
        "nodes",
        node_api,
        node_writer,
        changed.clone(),
        watches.clone(),
        activity.clone(),
        strip_node,
    );
    // Endpoints for externalTrafficPolicy Local: EndpointSlice v1 where the server has it
    // (1.21+), else core Endpoints (the lab's v1.20).
    let endpoints = if endpointslice_v1_served(&client).await {
        info!("reading endpoints from discovery.k8s.io/v1 EndpointSlices");
        let api: Api<EndpointSlice> = scoped_api(&client, namespace);
        let (store, writer) = reflector::store();
        spawn_reflector(
            "endpointslices",
            api,
            writer,
            changed.clone(),
            watches.clone(),
            activity.clone(),
            strip_metadata::<EndpointSlice>,
        );
        EndpointStore::Slices(store)
    } else {
        info!("EndpointSlice v1 not served; reading core v1 Endpoints");
        let (store, writer) = reflector::store();
        spawn_reflector(
            "endpoints",
            ep_api,
            writer,
            changed.clone(),
            watches.clone(),
            activity.clone(),
            strip_metadata::<Endpoints>,
        );
        EndpointStore::Endpoints(store)
    };

    let hub = match (&cfg.services_election, namespace) {
        (true, ns) => LeaseHub::start(client.clone(), ns, activity.clone(), watches.clone()),
        (false, _) => LeaseHub::start(
            client.clone(),
            Some(&cfg.lease.namespace),
            activity.clone(),
            watches.clone(),
        ),
    };
    let shared = Arc::new(Shared {
        node: cfg.node_name.clone(),
        per_service: cfg.services_election,
        timing: cfg.services_timing,
        holder_cfg: HolderConfig {
            check_following: false,
            ..holder_cfg
        },
        kernel,
        announcer,
        lease_client: clients.leases.clone(),
        hub,
        status: KubeStatusWriter::new(client.clone(), &cfg.node_name),
        services: svc_store.clone(),
        metrics,
        readiness,
        services_seen: watch::channel(0).0,
    });
    let plan_cfg = PlanConfig {
        mode: if cfg.services_election {
            Mode::PerService
        } else {
            Mode::Global(LeaseRef {
                namespace: cfg.lease.namespace.clone(),
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
    };
    info!(mode = ?plan_cfg.mode, namespace = namespace.unwrap_or("<all>"), "Services: watching LoadBalancer Services");

    // No plan before every cache has its first full list: a plan made without the Nodes
    // could announce a node's own address, one without the Services could stop groups.
    let ready = async {
        let _ = tokio::join!(
            svc_store.wait_until_ready(),
            node_store.wait_until_ready(),
            endpoints.wait_until_ready(),
        );
    };
    tokio::select! {
        _ = shutdown.cancelled() => {
            watches.cancel();
            return;
        }
        _ = ready => info!("Services: initial lists of Services, Nodes and endpoints loaded"),
    }

    if cfg.services_election {
        // Leases of Services deleted while their holder was down (see lease_gc).
        tokio::spawn(super::lease_gc::run(
            client.clone(),
            cfg.services_namespace.clone(),
            svc_store.clone(),
            cfg.services_timing.lease_duration,
            watches.clone(),
        ));
    }
    let mut groups: BTreeMap<LeaseRef, GroupHandle> = BTreeMap::new();
    let mut gov = Governance {
        prev: BTreeMap::new(),
        retiring: BTreeMap::new(),
        settled: Arc::new(Notify::new()),
        held_back: BTreeMap::new(),
    };
    let mut reported = Reported::default();
    let mut cleared: HashSet<String> = HashSet::new();
    // Notes whose Event or a status clear failed are tried again after a back-off, also
    // when no cache changes meanwhile.
    let mut retry = Retry::default();
    let mut subnets = ConnectedSubnets::default();
    let mut namespaces_counted: BTreeMap<String, usize> = BTreeMap::new();
    let mut write_rate_warned: Option<usize> = None;
    loop {
        let settle = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = changed.notified() => true,
            // A handover finished: held-back addresses may be bound now, without delay.
            _ = gov.settled.notified() => false,
            _ = retry.wait() => false,
        };
        if settle {
            // Let a burst of events settle into one recomputation.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let services = svc_store.state();
        let local = endpoints.local_ready(&cfg.node_name);
        let node_addrs = node_addresses(&node_store.state());
        let unusable = Unusable {
            control_plane: if cfg.control_plane {
                cfg.addresses.clone()
            } else {
                Vec::new()
            },
            vip_subnet: cfg.vip_subnet,
            connected: subnets.get(&*shared.kernel).await,
        };
        let (candidates, mut notes) = candidates(&cfg, &services, &local, &node_addrs, &unusable);
        let plan = desired::plan(&candidates, &plan_cfg);
        let endpointless = if cfg.services_election {
            announced_nowhere(&plan, &endpoints.without_ready_endpoint(&services))
        } else {
            // One lease for all: its holder announces Local Services too.
            HashSet::new()
        };
        let mut per_ns: BTreeMap<String, usize> = BTreeMap::new();
        for k in plan.addresses.keys() {
            *per_ns.entry(k.namespace.clone()).or_default() += 1;
        }
        for ns in namespaces_counted
            .keys()
            .filter(|ns| !per_ns.contains_key(*ns))
        {
            shared.metrics.forget_namespace(ns);
        }
        for (ns, n) in &per_ns {
            shared.metrics.active_services(ns, *n);
        }
        namespaces_counted = per_ns;
        write_rate_warned = warn_lease_write_rate(&plan, shared.timing, write_rate_warned);
        for key in plan.addresses.keys().filter(|k| endpointless.contains(*k)) {
            notes.push(Note {
                key: key.clone(),
                uid: uid_of(&services, key),
                reason: super::status::REASON_NO_LOCAL_ENDPOINT,
                message: "not announced: externalTrafficPolicy is Local and no node has a ready \
                          endpoint of this Service; status and kube-vip.io/vipHost cleared until \
                          one has"
                    .to_string(),
                warn: true,
            });
        }
        let retry_failed = retry.due();
        let mut ok = report(
            &shared,
            &plan,
            &services,
            notes,
            &mut reported,
            retry_failed,
        )
        .await;
        ok &= clear_stale(&shared, &plan, &endpointless, &services, &mut cleared).await;
        retry.after(ok);
        reconcile_groups(&shared, &plan, &candidates, &mut groups, &mut gov).await;
        shared.services_seen.send_modify(|n| *n = n.wrapping_add(1));
    }
    info!(groups = groups.len(), "Services: stopping");
    for r in gov.retiring.values() {
        r.stop.cancel();
    }
    let stops: Vec<_> = groups
        .into_values()
        .map(|g| {
            g.stop.cancel();
            g.join
        })
        .collect();
    for j in stops {
        let _ = j.await;
    }
    watches.cancel();
}

/// Cluster-wide Service lease writes per second above which vipd warns: each held lease is
/// renewed once per retry period, and small API servers (k3s with SQLite, a busy etcd)
/// start to fall behind at a few hundred writes per second.
pub const LEASE_WRITES_WARN_PER_S: f64 = 200.0;

/// Expected Service lease writes per second for `leases` held leases at `timing` (one
/// renewal per retry period, client-go's cadence).
pub fn lease_writes_per_s(leases: usize, timing: Timing) -> f64 {
    leases as f64 / timing.retry_period.as_secs_f64().max(0.001)
}

/// Retry period (whole seconds) that keeps `leases` leases at or below
/// [`LEASE_WRITES_WARN_PER_S`].
pub fn suggested_retry_secs(leases: usize) -> u64 {
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
            "Service leases will cost about {:.0} lease writes per second across the cluster (one per lease per retry period); if the API server falls behind, leases flap. Consider svc_retryperiod={retry} svc_renewdeadline={} svc_leaseduration={}",
            rate,
            retry * 2,
            retry * 3
        );
        return Some(leases);
    }
    warned
}

/// An API for `K` in `namespace` (`svc_namespace`), or in all namespaces.
fn scoped_api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs a reflector on `api` into `writer` until `stop`. `what` is the resource's plural
/// (`services`, ...): the name its watch is tracked under in `activity`, where every event
/// it delivers counts (the client's `WatchStartLayer` reports its restarts).
#[allow(clippy::too_many_arguments)] // each one is a separate part of the reflector
fn spawn_reflector<K>(
    what: &'static str,
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    changed: Arc<Notify>,
    stop: CancellationToken,
    activity: crate::admin::WatchActivity,
    strip: fn(&mut K),
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    activity.register(
        what,
        Duration::from_secs(crate::kubeclient::SERVICES_WATCH_TIMEOUT_SECS.into()),
    );
    tokio::spawn(async move {
        // Watch errors (401/403 included, S15) retry with a capped exponential back-off
        // (kubeclient::WatchBackoff: 0.8 s doubling to 20 s, plus up to 25 %); each is logged with the resource and the
        // server's message, which for RBAC names the verb.
        // Objects are stripped to what vipd reads before they are cached (at 1000 Services,
        // managedFields alone were 7 MB of a node's memory).
        let mut stream = reflector::reflector(
            writer,
            watcher(
                api,
                watcher::Config::default().timeout(crate::kubeclient::SERVICES_WATCH_TIMEOUT_SECS),
            )
            .modify(strip),
        )
        .backoff(crate::kubeclient::WatchBackoff::default())
        .boxed();
        let mut failing = false;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => ev,
            };
            match ev {
                Some(Ok(_)) => {
                    activity.touch(what);
                    if failing {
                        info!(resource = what, "watch recovered");
                        failing = false;
                    }
                    changed.notify_one();
                }
                Some(Err(e)) => {
                    warn!(resource = what, verb = "list/watch", error = %e, "watch failed; retrying with back-off");
                    failing = true;
                }
                None => return,
            }
        }
    });
}

/// `kubectl apply` keeps a copy of the whole object in this annotation; vipd never reads it.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what the cache does not need from a Service: managedFields, labels, the selector
/// and `kubectl apply`'s copy of the object. Annotations (kube-vip.io/*), the rest of the
/// spec and the status stay.
pub fn strip_service(svc: &mut Service) {
    svc.metadata.managed_fields = None;
    // Endpoints come from Endpoints / EndpointSlices; labels and the selector are unused.
    svc.metadata.labels = None;
    if let Some(spec) = svc.spec.as_mut() {
        spec.selector = None;
    }
    if let Some(a) = svc.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// Keeps of a Node only its name and `status.addresses` (a Node's status carries its image
/// list, often tens of KiB).
pub fn strip_node(node: &mut Node) {
    let addresses = node.status.as_mut().and_then(|s| s.addresses.take());
    *node = Node {
        metadata: kube::api::ObjectMeta {
            name: node.metadata.name.take(),
            resource_version: node.metadata.resource_version.take(),
            ..Default::default()
        },
        spec: None,
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses,
            ..Default::default()
        }),
    };
}

/// Drops managedFields and annotations from core Endpoints or an EndpointSlice (subsets,
/// endpoints and the slice's labels, which name its Service, stay).
pub fn strip_metadata<K: kube::Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
}

/// Something to tell the user about a Service (logged, and a Warning Event when `warn`).
/// The same note (Service, reason, message) is logged once per process while its cause
/// lasts, and its Event is written until it succeeds.
struct Note {
    key: ServiceKey,
    /// The Service's `metadata.uid` (part of the Event's name, see
    /// [`super::status::event_name`]).
    uid: Option<String>,
    reason: &'static str,
    message: String,
    warn: bool,
}

impl Note {
    /// Deduplication key: Service, reason and message (never the resourceVersion, which
    /// changes with every status write).
    fn id(&self) -> String {
        format!("{}|{}|{}", self.key, self.reason, self.message)
    }
}

/// Notes reported while their cause lasts: id -> the Event was written (or none is due).
#[derive(Default)]
struct Reported(std::collections::HashMap<String, bool>);

/// Back-off of the main loop's retries (failed Events of notes, failed status clears):
/// the watches' back-off ([`crate::kubeclient::WatchBackoff`], 0.8 s doubling to 20 s
/// plus up to 25 %), reset after a pass where everything succeeded.
#[derive(Default)]
struct Retry {
    backoff: crate::kubeclient::WatchBackoff,
    at: Option<tokio::time::Instant>,
}

impl Retry {
    /// Schedules the next retry after a failed pass (`ok` false), clears it otherwise.
    fn after(&mut self, ok: bool) {
        use kube::runtime::utils::Backoff;
        if ok {
            self.backoff.reset();
            self.at = None;
        } else if let Some(d) = self.backoff.next() {
            self.at = Some(tokio::time::Instant::now() + d);
        }
    }

    /// No retry is scheduled, or it is due.
    fn due(&self) -> bool {
        self.at.is_none_or(|at| at <= tokio::time::Instant::now())
    }

    /// Resolves when a scheduled retry is due; never when none is.
    async fn wait(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// The node's connected subnets (its own addresses, not vipd's), read from the kernel at
/// most every [`ConnectedSubnets::REFRESH`].
#[derive(Default)]
struct ConnectedSubnets {
    read_at: Option<tokio::time::Instant>,
    subnets: Vec<(IpAddr, u8)>,
}

impl ConnectedSubnets {
    const REFRESH: Duration = Duration::from_secs(2);

    /// (address, prefix) of every address of the node that is not a VIP of vipd's. A
    /// failed read keeps the last list.
    async fn get<K: Kernel>(&mut self, kernel: &K) -> Vec<(IpAddr, u8)> {
        let now = tokio::time::Instant::now();
        if self
            .read_at
            .is_none_or(|t| now.duration_since(t) >= Self::REFRESH)
        {
            match kernel.addresses(None).await {
                Ok(addrs) => {
                    self.subnets = addrs
                        .iter()
                        .filter(|a| !a.ours)
                        .map(|a| (a.vip.addr, a.vip.prefix))
                        .collect();
                    self.read_at = Some(now);
                }
                Err(e) => debug!(error = %e, "reading the node's addresses failed"),
            }
        }
        self.subnets.clone()
    }
}

/// Addresses vipd refuses for Services (besides nodes' own addresses): the control-plane
/// VIP (with `cp_enable`), and network / broadcast addresses of the VIP's prefix or of a
/// subnet connected to the node (S39).
#[derive(Debug, Clone)]
pub struct Unusable {
    /// Control-plane VIP addresses (empty without `cp_enable`).
    pub control_plane: Vec<IpAddr>,
    /// `vip_subnet`: the prefix a Service VIP is bound with.
    pub vip_subnet: crate::config::VipSubnet,
    /// The node's own addresses with their prefixes (its connected subnets).
    pub connected: Vec<(IpAddr, u8)>,
}

impl Unusable {
    /// Why `addr` is refused, as the Warning's (reason, message), or `None`.
    pub fn check(&self, addr: IpAddr) -> Option<(&'static str, String)> {
        if self.control_plane.contains(&addr) {
            return Some((
                super::status::REASON_CONTROL_PLANE_ADDRESS,
                format!(
                    "address {addr} is the control-plane VIP; refused (the control-plane lease \
                     governs it; give the Service another address)"
                ),
            ));
        }
        let (edge, prefix) = self.edge(addr)?;
        Some((
            super::status::REASON_UNUSABLE_ADDRESS,
            format!(
                "address {addr} is the {edge} of subnet {}/{prefix}; refused (hosts on the \
                 segment do not send unicast to it)",
                network_of(addr, prefix)
            ),
        ))
    }

    /// The network / broadcast rule ([`crate::net::subnet_edge_of`]) over the VIP prefix
    /// and the connected subnets.
    fn edge(&self, addr: IpAddr) -> Option<(crate::net::SubnetEdge, u8)> {
        let mut subnets = vec![(addr, desired::vip_prefix(&self.vip_subnet, &addr))];
        subnets.extend(self.connected.iter().copied());
        crate::net::subnet_edge_of(addr, &subnets)
    }
}

/// `addr` with its host bits (beyond `prefix`) cleared, for messages.
fn network_of(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let p = u32::from(prefix.min(32));
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let p = u32::from(prefix.min(128));
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

/// The Services among `endpointless` (externalTrafficPolicy Local, no ready endpoint on
/// any node) that no node campaigns for: every group they are in has only such members
/// (a member with policy Cluster, or a Local one with an endpoint somewhere, keeps the
/// group's addresses announced, S21). Pure.
pub fn announced_nowhere(plan: &Plan, endpointless: &HashSet<ServiceKey>) -> HashSet<ServiceKey> {
    let mut alive: HashSet<&ServiceKey> = HashSet::new();
    for g in plan.groups.values() {
        if !g.services.iter().all(|k| endpointless.contains(k)) {
            alive.extend(g.services.iter());
        }
    }
    endpointless
        .iter()
        .filter(|k| plan.addresses.contains_key(*k) && !alive.contains(k))
        .cloned()
        .collect()
}

/// The uid of Service `key` in `services`.
fn uid_of(services: &[Arc<Service>], key: &ServiceKey) -> Option<String> {
    services
        .iter()
        .find(|s| ServiceKey::of(s) == *key)
        .and_then(|s| s.metadata.uid.clone())
}

/// The endpoint cache, in whichever API form the server offers.
enum EndpointStore {
    Endpoints(Store<Endpoints>),
    Slices(Store<EndpointSlice>),
}

impl EndpointStore {
    /// Resolves once the first full list is in (see `Store::wait_until_ready`).
    async fn wait_until_ready(&self) {
        let _ = match self {
            EndpointStore::Endpoints(s) => s.wait_until_ready().await,
            EndpointStore::Slices(s) => s.wait_until_ready().await,
        };
    }

    /// The `externalTrafficPolicy: Local` Services among `services` that no node has a
    /// ready endpoint of (endpoints without a node name count for no node): announced
    /// nowhere (S21).
    fn without_ready_endpoint(&self, services: &[Arc<Service>]) -> HashSet<ServiceKey> {
        let with: HashSet<(String, String)> = match self {
            EndpointStore::Endpoints(store) => store
                .state()
                .iter()
                .filter(|e| {
                    !super::endpoints::EndpointSource::Endpoints(e)
                        .ready_nodes()
                        .is_empty()
                })
                .map(|e| {
                    (
                        e.metadata.namespace.clone().unwrap_or_default(),
                        e.metadata.name.clone().unwrap_or_default(),
                    )
                })
                .collect(),
            EndpointStore::Slices(store) => store
                .state()
                .iter()
                .filter(|s| {
                    !super::endpoints::EndpointSource::Slices(std::slice::from_ref(s.as_ref()))
                        .ready_nodes()
                        .is_empty()
                })
                .filter_map(|s| {
                    let svc = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
                    Some((s.metadata.namespace.clone().unwrap_or_default(), svc))
                })
                .collect(),
        };
        services
            .iter()
            .filter(|s| {
                s.spec
                    .as_ref()
                    .and_then(|sp| sp.external_traffic_policy.as_deref())
                    == Some("Local")
            })
            .map(|s| ServiceKey::of(s))
            .filter(|k| !with.contains(&(k.namespace.clone(), k.name.clone())))
            .collect()
    }

    /// Services (namespace, name) with a ready endpoint on `node`.
    fn local_ready(&self, node: &str) -> HashSet<(String, String)> {
        match self {
            EndpointStore::Endpoints(store) => store
                .state()
                .iter()
                .filter(|e| ready_local_endpoint_from_endpoints(e, node))
                .map(|e| {
                    (
                        e.metadata.namespace.clone().unwrap_or_default(),
                        e.metadata.name.clone().unwrap_or_default(),
                    )
                })
                .collect(),
            EndpointStore::Slices(store) => store
                .state()
                .iter()
                .filter(|s| {
                    ready_local_endpoint_from_slices(std::slice::from_ref(s.as_ref()), node)
                })
                .filter_map(|s| {
                    let svc = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
                    Some((s.metadata.namespace.clone().unwrap_or_default(), svc))
                })
                .collect(),
        }
    }
}

/// Selected Services as planner input, plus what to report about the others. `local`:
/// Services with a ready endpoint on this node; `unusable`: addresses refused besides the
/// nodes' own (`node_addrs`).
fn candidates(
    cfg: &Config,
    services: &[Arc<Service>],
    local: &HashSet<(String, String)>,
    node_addrs: &BTreeMap<IpAddr, String>,
    unusable: &Unusable,
) -> (Vec<Candidate>, Vec<Note>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for svc in services {
        let info: ServiceInfo = model::service_info(svc);
        let note = |reason: &'static str, message: String, warn: bool| Note {
            key: info.key.clone(),
            uid: info.uid.clone(),
            reason,
            message,
            warn,
        };
        match model::selection(
            &info,
            cfg.lb_class_only,
            &cfg.lb_class_name,
            cfg.services_namespace.as_deref(),
        ) {
            Selection::Announce => {}
            Selection::Skip(reason) => {
                // Only our own Services (of our class, LoadBalancer) get a word.
                if reason.warrants_warning() {
                    notes.push(note(
                        super::status::REASON_INVALID_CONFIG,
                        format!("not announced: {reason}"),
                        true,
                    ));
                } else if matches!(reason, model::SkipReason::NoAddress) {
                    // Name the field and the rejected values, not just "no address".
                    let message = match info.addresses.rejection_message() {
                        Some(rejected) => format!("not announced: no usable address; {rejected}"),
                        None => format!("not announced: {reason}"),
                    };
                    notes.push(note(super::status::REASON_NO_ADDRESS, message, false));
                }
                if !matches!(reason, model::SkipReason::NoAddress)
                    || info.addresses.rejected.is_empty()
                {
                    continue;
                }
            }
        }
        for r in &info.addresses.rejected {
            notes.push(note(
                super::status::REASON_INVALID_ADDRESS,
                format!(
                    "address {:?} from {} rejected: {}",
                    r.value, info.addresses.source, r.reason
                ),
                true,
            ));
        }
        if info.addresses.dhcp {
            notes.push(note(
                super::status::REASON_DHCP_NOT_ENABLED,
                if cfg.dhcp_mode {
                    "address 0.0.0.0 / :: asks for DHCP, which this vipd release does not implement yet".to_string()
                } else {
                    "address 0.0.0.0 / :: asks for DHCP, but DHCP mode is not enabled (dhcp_mode)".to_string()
                },
                true,
            ));
        }
        let mut addresses = info.addresses.addresses.clone();
        addresses.retain(|a| {
            if let Some(node) = node_addrs.get(a) {
                notes.push(note(
                    super::status::REASON_ADDRESS_OF_NODE,
                    format!(
                        "address {a} from {} is node {node}'s own address; refused (announcing it would take the node's traffic)",
                        info.addresses.source
                    ),
                    true,
                ));
                return false;
            }
            if let Some((reason, why)) = unusable.check(*a) {
                notes.push(note(
                    reason,
                    format!("{why}; from {}", info.addresses.source),
                    true,
                ));
                return false;
            }
            true
        });
        if addresses.is_empty() {
            continue;
        }
        let local_endpoint = local.contains(&(info.key.namespace.clone(), info.key.name.clone()));
        out.push(Candidate {
            key: info.key.clone(),
            created: info.created,
            addresses,
            ports: info.ports.clone(),
            etp_local: info.etp_local,
            local_endpoint,
            interface: info.interface.clone(),
            lease: LeaseRef {
                namespace: info.key.namespace.clone(),
                name: info.lease_name.clone(),
            },
        });
    }
    (out, notes)
}

/// Logs every note once while its cause lasts and writes its Warning Event until that
/// succeeds (every node that sees the cause may write it: the Event's deterministic name,
/// [`super::status::event_name`], makes the API server keep one). Events that failed
/// before are written again only with `retry_failed` (the back-off is over). Returns
/// `false` when an Event write failed or is still due (the caller retries after a
/// back-off).
async fn report<K: Kernel, A: Announcer>(
    shared: &Shared<K, A>,
    plan: &Plan,
    services: &[Arc<Service>],
    notes: Vec<Note>,
    reported: &mut Reported,
    retry_failed: bool,
) -> bool {
    let mut all = notes;
    for c in &plan.conflicts {
        all.push(Note {
            key: c.service.clone(),
            uid: uid_of(services, &c.service),
            reason: super::status::REASON_ADDRESS_CONFLICT,
            message: format!(
                "not announced: {} port {}/{} is already used by {}",
                c.address, c.port.port, c.port.protocol, c.with
            ),
            warn: true,
        });
    }
    // Forget notes whose cause is gone (bounded memory; a recurrence is reported again).
    let current: HashSet<String> = all.iter().map(Note::id).collect();
    reported.0.retain(|id, _| current.contains(id));
    let mut ok = true;
    for n in all {
        let id = n.id();
        let written = match reported.0.get(&id) {
            Some(false) if !retry_failed => {
                ok = false;
                continue;
            }
            Some(written) => *written,
            None => {
                if n.warn {
                    warn!(service = %n.key, reason = n.reason, "{}", n.message);
                } else {
                    info!(service = %n.key, reason = n.reason, "{}", n.message);
                }
                !n.warn
            }
        };
        if written {
            reported.0.insert(id, true);
            continue;
        }
        let ev = ServiceEvent::warning(n.reason, n.message.clone());
        let done = match shared.status.event(&n.key, n.uid.as_deref(), &ev).await {
            Ok(()) => true,
            Err(e) => {
                // Logged at warn by the writer (rate-limited); retried after a back-off.
                debug!(service = %n.key, error = %e, "cannot record event; retrying");
                ok = false;
                false
            }
        };
        reported.0.insert(id, done);
    }
    ok
}

/// Services this node last reported as announcing (`kube-vip.io/vipHost` = this node) that
/// are announced by nobody now (address removed or invalid, conflict, type change, or
/// `externalTrafficPolicy: Local` with no ready endpoint on any node: `endpointless`):
/// their status and annotation would mislead, so they are cleared, once per object version
/// (a failed clear is retried: returns `false`).
async fn clear_stale<K: Kernel, A: Announcer>(
    shared: &Shared<K, A>,
    plan: &Plan,
    endpointless: &HashSet<ServiceKey>,
    services: &[Arc<Service>],
    cleared: &mut HashSet<String>,
) -> bool {
    let mut now_stale = HashSet::new();
    let mut ok = true;
    for svc in services {
        let key = ServiceKey::of(svc);
        let host = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(model::ANN_VIP_HOST));
        if host != Some(&shared.node)
            || (plan.addresses.contains_key(&key) && !endpointless.contains(&key))
        {
            continue;
        }
        let id = format!(
            "{key}/{}",
            svc.metadata.resource_version.clone().unwrap_or_default()
        );
        if !cleared.contains(&id) {
            match shared.status.clear(&key).await {
                Ok(_) => {
                    info!(service = %key, "no longer announced anywhere: status and vipHost cleared")
                }
                Err(e) => {
                    warn!(service = %key, error = %e, "clearing status failed; retrying");
                    ok = false;
                    continue;
                }
            }
        }
        now_stale.insert(id);
    }
    *cleared = now_stale;
    ok
}

async fn reconcile_groups<K: Kernel, A: Announcer>(
    shared: &Arc<Shared<K, A>>,
    plan: &Plan,
    candidates: &[Candidate],
    groups: &mut BTreeMap<LeaseRef, GroupHandle>,
    gov: &mut Governance,
) {
    gov.retiring
        .retain(|_, r| !r.done.load(std::sync::atomic::Ordering::SeqCst));
    let running: BTreeSet<LeaseRef> = groups.keys().cloned().collect();
    // Groups that are gone, that this node should not campaign for, or whose lease
    // retires (S34).
    let changes = governance::changes(&gov.prev, plan, &running);
    gov.prev = governance::governors(plan);
    // Subscribe to every retiring lease before its group stops, so that no change (the
    // holder's release) falls between what the elector saw and what the retirement sees.
    let mut retiring: Vec<(LeaseRef, BTreeSet<IpAddr>, KubeLeaseClient, _)> = changes
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
    // Leases that still govern an address somewhere (whether or not this node campaigns).
    // Any other lease serves nobody: its Service was deleted, changed type or class, or
    // lost its addresses (S17, S18, S32: no lease for a Service that is not announced).
    let in_use: BTreeSet<&LeaseRef> = plan.groups.keys().collect();
    let mut ends: BTreeMap<LeaseRef, ElectionEnd> = BTreeMap::new();
    for lease in changes.stop {
        if let Some(g) = groups.remove(&lease) {
            // The lease serves no Service any more: whoever releases it also deletes it.
            let owner_gone = shared.per_service && !in_use.contains(&lease);
            g.delete_lease
                .store(owner_gone, std::sync::atomic::Ordering::SeqCst);
            info!(%lease, delete = owner_gone, "Services: stopping election");
            g.stop.cancel();
            if let Ok(Some(end)) = g.join.await {
                ends.insert(lease, end);
            }
        }
    }
    for (lease, addrs, client, events) in retiring.drain(..) {
        let view = ends
            .get(&lease)
            .map(LeaseView::from_end)
            .unwrap_or_else(|| LeaseView::unknown(tokio::time::Instant::now()));
        if handover_done(&view) {
            debug!(%lease, "retiring lease released or gone: its addresses may move at once");
            continue;
        }
        start_retirement(shared, gov, lease, addrs, client, events, view);
    }
    let retiring: BTreeMap<LeaseRef, BTreeSet<IpAddr>> = gov
        .retiring
        .iter()
        .map(|(l, r)| (l.clone(), r.addrs.clone()))
        .collect();
    let running: BTreeSet<LeaseRef> = groups.keys().cloned().collect();
    let admission = governance::admit(plan, &running, &retiring);
    for (lease, addrs) in &admission.held_back {
        if gov.held_back.get(lease) != Some(addrs) {
            info!(%lease, addresses = ?addrs, "Services: not binding these addresses until the lease that governed them before is released or expires");
        }
    }
    gov.held_back = admission.held_back.clone();
    // Ports per Service, from the planner's input (no second pass over the Services).
    let ports: BTreeMap<&ServiceKey, &[PortProto]> = candidates
        .iter()
        .map(|c| (&c.key, c.ports.as_slice()))
        .collect();
    for (lease, vips) in admission.run {
        let Some(group) = plan.groups.get(&lease) else {
            continue;
        };
        let spec = GroupSpec {
            vips,
            services: group
                .services
                .iter()
                .map(|k| {
                    let addrs = plan.addresses.get(k).cloned().unwrap_or_default();
                    let ports = ports.get(k).map(|p| p.to_vec()).unwrap_or_default();
                    (k.clone(), addrs, ports)
                })
                .collect(),
        };
        match groups.get(&lease) {
            Some(g) => {
                g.spec.send_if_modified(|cur| {
                    if *cur != spec {
                        *cur = spec.clone();
                        true
                    } else {
                        false
                    }
                });
            }
            None => {
                let (tx, rx) = watch::channel(spec);
                let stop = CancellationToken::new();
                let delete_lease = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let join = tokio::spawn(group_task(
                    shared.clone(),
                    lease.clone(),
                    rx,
                    stop.clone(),
                    delete_lease.clone(),
                ));
                debug!(%lease, "Services: election started");
                groups.insert(
                    lease.clone(),
                    GroupHandle {
                        spec: tx,
                        stop,
                        delete_lease,
                        join,
                    },
                );
            }
        }
    }
}

/// One Lease: election, VIP holder, status writing. Returns how the election ended.
async fn group_task<K: Kernel, A: Announcer>(
    shared: Arc<Shared<K, A>>,
    lease: LeaseRef,
    mut spec: watch::Receiver<GroupSpec>,
    stop: CancellationToken,
    delete_lease: Arc<std::sync::atomic::AtomicBool>,
) -> Option<ElectionEnd> {
    let gates = Gates::default();
    let mut client =
        KubeLeaseClient::new(shared.lease_client.clone(), &lease.namespace, &lease.name)
            .with_hub(shared.hub.clone());
    if shared.per_service {
        // Marks the leases the orphan collector may delete (never the global one).
        client = client.with_labels(super::lease_gc::lease_labels());
    }
    let (elector, leadership) =
        Elector::new(client.clone(), shared.node.clone(), shared.timing, &gates);
    let elector = elector.with_metrics(shared.metrics.clone());
    let mut duplicate = elector.duplicate_identity();
    let lease_key = ServiceKey::new(&lease.namespace, &lease.name);
    let mut state = leadership.state.clone();
    let initial = spec.borrow_and_update().clone();
    let (vips_tx, vips_rx) = watch::channel(initial.vips.clone());
    let (conflicts_tx, mut conflicts) = watch::channel(Vec::new());
    let holder = VipHolder::new(
        &lease.to_string(),
        shared.kernel.clone(),
        shared.announcer.clone(),
        initial.vips.clone(),
        shared.holder_cfg.clone(),
        gates.clone(),
    )
    .with_updates(vips_rx)
    .with_conflict_reports(conflicts_tx)
    .with_metrics(shared.metrics.clone());
    // The holder runs from the start, also while following: its local checks (interface
    // present, VIP not already on the node untagged) close the gates before this node
    // campaigns, so a node that must not carry the address never takes the lease.
    let holder_stop = CancellationToken::new();
    let elector_stop = CancellationToken::new();
    let holder_task = tokio::spawn(holder.run(leadership, holder_stop.clone()));
    let elector_task = tokio::spawn(elector.run(elector_stop.clone()));
    let mut leading = false;
    let mut current = initial;
    // Address conflicts already posted as Events (posted again only when they change).
    let mut reported: Vec<(IpAddr, [u8; 6])> = Vec::new();
    // Level-triggered status (S38): while leading, status, vipHost and the announcement
    // Events are written until they match, retried with back-off after a failure.
    let mut status = StatusSync::default();
    let mut seen = shared.services_seen.subscribe();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            r = spec.changed() => {
                if r.is_err() {
                    break;
                }
                current = spec.borrow_and_update().clone();
                vips_tx.send_replace(current.vips.clone());
                if leading {
                    Box::pin(status.sync(&shared, &current, true)).await;
                }
            }
            r = state.changed() => {
                if r.is_err() {
                    break;
                }
                let now_leading = matches!(*state.borrow_and_update(), LeaderState::Leading { .. });
                if now_leading && !leading {
                    status = StatusSync::default();
                    Box::pin(status.sync(&shared, &current, true)).await;
                } else if !now_leading {
                    // The next holder writes its own status and Events.
                    status = StatusSync::default();
                }
                leading = now_leading;
            }
            r = seen.changed() => {
                if r.is_err() {
                    break;
                }
                seen.borrow_and_update();
                // The Services cache changed: compare (no API call when it matches); while
                // a retry is scheduled, the retry does the writing.
                if leading && status.retry.at.is_none() {
                    Box::pin(status.sync(&shared, &current, false)).await;
                }
            }
            _ = status.retry.wait() => {
                if leading {
                    Box::pin(status.sync(&shared, &current, true)).await;
                } else {
                    status.retry.at = None;
                }
            }
            r = conflicts.changed() => {
                if r.is_err() {
                    break;
                }
                let now = conflicts.borrow_and_update().clone();
                let new: Vec<(IpAddr, [u8; 6])> =
                    now.iter().filter(|c| !reported.contains(c)).copied().collect();
                reported = now;
                Box::pin(report_conflicts(&shared, &current, &new)).await;
            }
            r = duplicate.changed() => {
                if r.is_err() {
                    break;
                }
                // S35: Event about the Services of a per-Service lease, about the Lease
                // for the global one.
                let cond = duplicate.borrow_and_update().clone();
                let about: Vec<ServiceKey> = if shared.per_service {
                    current.services.iter().map(|(k, _, _)| k.clone()).collect()
                } else {
                    Vec::new()
                };
                Box::pin(crate::identity::publish(
                    cond.as_ref(),
                    &lease_key,
                    &about,
                    &shared.readiness,
                    &shared.status,
                ))
                .await;
            }
        }
    }
    shared
        .readiness
        .set_duplicate_identity(&lease.to_string(), false);
    elector_stop.cancel();
    let end = elector_task.await.ok();
    holder_stop.cancel();
    let _ = holder_task.await;
    // Series of a group that is gone would otherwise stay for the process lifetime.
    shared.metrics.forget_lease(&lease.to_string());
    for v in &current.vips {
        shared.metrics.forget_vip(v.vip.addr);
    }
    // Deleted by the node that released it, or that still holds it after stepping down
    // without a release (e.g. it was frozen past its renew deadline): the VIP holder has
    // stopped, and other nodes judge a lease deleted while held as held for one more lease
    // duration. The write is conditional: a lease someone else wrote since is kept.
    if delete_lease.load(std::sync::atomic::Ordering::SeqCst)
        && let Some(end) = &end
        && let Some(obs) = &end.observed
        && (end.released || obs.record.holder == shared.node)
    {
        match Box::pin(client.delete(&obs.resource_version)).await {
            Ok(true) => info!(%lease, "lease deleted"),
            Ok(false) => debug!(%lease, "lease already changed or gone; not deleted"),
            Err(e) => warn!(%lease, error = %e, "deleting the lease failed"),
        }
    }
    end
}

/// Whether a retiring lease's handover is already done by what its elector saw (released,
/// or absent and seen so).
fn handover_done(view: &LeaseView) -> bool {
    governance::handover(None, view, tokio::time::Instant::now()) == Handover::Done
}

/// Starts following a retiring lease (see [`governance::follow`]); its addresses are held
/// back from other leases until it is done. A lease already retiring is followed again
/// from `view`, with the union of the addresses.
fn start_retirement<K: Kernel, A: Announcer>(
    shared: &Arc<Shared<K, A>>,
    gov: &mut Governance,
    lease: LeaseRef,
    mut addrs: BTreeSet<IpAddr>,
    client: KubeLeaseClient,
    events: futures::stream::BoxStream<'static, crate::election::LeaseEvent>,
    view: LeaseView,
) {
    if let Some(old) = gov.retiring.remove(&lease) {
        old.stop.cancel();
        addrs.extend(old.addrs);
    }
    debug!(%lease, addresses = ?addrs, holder = ?view.observed.as_ref().map(|o| o.record.holder.as_str()), "Services: retiring lease; other leases wait for its release or expiry before binding its addresses");
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
        if governance::follow(client, events, view, timing, st).await {
            debug!(lease = %l, "Services: retiring lease released, deleted or expired");
            d.store(true, std::sync::atomic::Ordering::SeqCst);
            settled.notify_one();
        }
    });
    gov.retiring.insert(lease, Retirement { addrs, done, stop });
}

/// Posts an `AddressInUse` Warning Event on every Service of the group that uses an address
/// in `new` (address, other host's MAC).
async fn report_conflicts<K: Kernel, A: Announcer>(
    shared: &Shared<K, A>,
    spec: &GroupSpec,
    new: &[(IpAddr, [u8; 6])],
) {
    for (addr, mac) in new {
        let ev = ServiceEvent::address_in_use(*addr, &fmt_mac(*mac), &shared.node);
        for (key, addrs, _) in spec.services.iter().filter(|(_, a, _)| a.contains(addr)) {
            let uid = shared
                .services
                .get(&reflector::ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|s| s.metadata.uid.clone());
            if let Err(e) = shared.status.event(key, uid.as_deref(), &ev).await {
                warn!(service = %key, error = %e, "cannot record the address conflict event");
            }
            debug!(service = %key, addresses = ?addrs, "address conflict reported");
        }
    }
}

/// The status side of a group while this node leads it: what is still to be written.
#[derive(Default)]
struct StatusSync {
    /// Services whose announcement Event was queued this term (at most one per term).
    announced: HashSet<ServiceKey>,
    /// Announcement Events not written yet: (Service uid, Event).
    pending: BTreeMap<ServiceKey, (Option<String>, ServiceEvent)>,
    /// Back-off after a failed write.
    retry: Retry,
}

/// What the holder should write for one Service, judged from the cache: the ingress and
/// vipHost differ, and the Event to queue when this node does not announce it yet.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusDiff {
    /// `status.loadBalancer.ingress` differs from the desired one (or the Service is not in
    /// the cache).
    pub ingress: bool,
    /// `kube-vip.io/vipHost` is not this node.
    pub vip_host: bool,
    /// The announcement Event (Normal `AddressAnnounced`, "moved from" the previous
    /// vipHost), when vipHost names another node or none; its change id is the Service's
    /// resourceVersion, so the same move seen again after a restart has the same Event name.
    pub announce: Option<ServiceEvent>,
}

/// [`StatusDiff`] of `cached` (the Service in the cache, `None` when absent) against the
/// desired `ingress` with this node `node` as holder. Pure.
pub fn status_diff(
    cached: Option<&Service>,
    node: &str,
    addrs: &[IpAddr],
    ingress: &[k8s_openapi::api::core::v1::LoadBalancerIngress],
) -> StatusDiff {
    let host = cached.and_then(super::status::vip_host_of);
    StatusDiff {
        ingress: cached.is_none_or(|svc| super::status::ingress_differs(svc, ingress)),
        vip_host: host != Some(node),
        announce: (host != Some(node)).then(|| {
            let rv = cached
                .and_then(|s| s.metadata.resource_version.clone())
                .unwrap_or_default();
            ServiceEvent::announced(node, addrs, host).with_change(rv)
        }),
    }
}

impl StatusSync {
    /// Compares every Service of `spec` with the cache and writes what differs (ingress,
    /// vipHost) plus the pending announcement Events. `retrying`: also write when only
    /// Events are pending. On any failure, schedules a retry (back-off); on success,
    /// clears it.
    async fn sync<K: Kernel, A: Announcer>(
        &mut self,
        shared: &Shared<K, A>,
        spec: &GroupSpec,
        retrying: bool,
    ) {
        let mut ok = true;
        let keys: HashSet<&ServiceKey> = spec.services.iter().map(|(k, _, _)| k).collect();
        self.pending.retain(|k, _| keys.contains(k));
        self.announced.retain(|k| keys.contains(k));
        for (key, addrs, ports) in &spec.services {
            let ingress = desired_ingress(addrs, ports);
            let cached = shared
                .services
                .get(&reflector::ObjectRef::new(&key.name).within(&key.namespace));
            let diff = status_diff(cached.as_deref(), &shared.node, addrs, &ingress);
            if let Some(ev) = diff.announce
                && self.announced.insert(key.clone())
            {
                info!(service = %key, "{}", ev.note);
                let uid = cached.as_ref().and_then(|s| s.metadata.uid.clone());
                self.pending.insert(key.clone(), (uid, ev));
            }
            if diff.ingress {
                match shared.status.set_ingress(key, ingress).await {
                    Ok(out) => debug!(service = %key, ?out, "status.loadBalancer.ingress"),
                    Err(e) => {
                        warn!(service = %key, error = %e, "writing status failed; retrying with back-off");
                        ok = false;
                    }
                }
            }
            if diff.vip_host
                && let Err(e) = shared.status.set_vip_host(key, &shared.node).await
            {
                warn!(service = %key, error = %e, "writing vipHost annotation failed; retrying with back-off");
                ok = false;
            }
        }
        if retrying || !self.pending.is_empty() {
            let mut done = Vec::new();
            for (key, (uid, ev)) in &self.pending {
                match shared.status.event(key, uid.as_deref(), ev).await {
                    Ok(()) => done.push(key.clone()),
                    Err(e) => {
                        debug!(service = %key, error = %e, "cannot record event; retrying");
                        ok = false;
                    }
                }
            }
            for k in done {
                self.pending.remove(&k);
            }
        }
        self.retry.after(ok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(retry_s: u64) -> Timing {
        Timing {
            lease_duration: Duration::from_secs(3 * retry_s),
            renew_deadline: Duration::from_secs(2 * retry_s),
            retry_period: Duration::from_secs(retry_s),
        }
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

    #[test]
    fn unusable_addresses_name_the_rule() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let u = Unusable {
            control_plane: vec![ip("192.0.2.10")],
            vip_subnet: crate::config::VipSubnet { v4: 32, v6: 128 },
            connected: vec![(ip("192.0.2.11"), 24), (ip("2001:db8::11"), 64)],
        };
        let (reason, msg) = u.check(ip("192.0.2.10")).unwrap();
        assert_eq!(reason, "ControlPlaneAddress");
        assert!(
            msg.contains("192.0.2.10") && msg.contains("control-plane VIP"),
            "{msg}"
        );
        let (reason, msg) = u.check(ip("192.0.2.255")).unwrap();
        assert_eq!(reason, "UnusableAddress");
        assert!(
            msg.contains("broadcast address of subnet 192.0.2.0/24"),
            "{msg}"
        );
        let (_, msg) = u.check(ip("192.0.2.0")).unwrap();
        assert!(
            msg.contains("network address of subnet 192.0.2.0/24"),
            "{msg}"
        );
        assert_eq!(u.check(ip("192.0.2.20")), None);
        assert_eq!(
            u.check(ip("198.51.100.255")),
            None,
            "no connected subnet holds it"
        );
        assert_eq!(u.check(ip("2001:db8::ffff")), None);
        assert!(u.check(ip("2001:db8::")).is_some());
        // The VIP's own prefix counts too (vip_subnet /28: .15 is its broadcast).
        let u = Unusable {
            control_plane: Vec::new(),
            vip_subnet: crate::config::VipSubnet { v4: 28, v6: 128 },
            connected: Vec::new(),
        };
        let (_, msg) = u.check(ip("198.51.100.15")).unwrap();
        assert!(msg.contains("198.51.100.0/28"), "{msg}");
    }

    #[test]
    fn status_diff_compares_the_cache_and_queues_one_announcement() {
        use k8s_openapi::api::core::v1::{LoadBalancerStatus, ServiceStatus};
        let addrs: Vec<IpAddr> = vec!["192.0.2.20".parse().unwrap()];
        let ports = vec![PortProto {
            port: 80,
            protocol: "TCP".into(),
        }];
        let ingress = desired_ingress(&addrs, &ports);
        let mut svc = Service::default();
        svc.metadata.resource_version = Some("7".into());
        svc.metadata.annotations =
            Some([(model::ANN_VIP_HOST.to_string(), "node-a".to_string())].into());
        // Held by node-a before: everything differs, a move is announced.
        let d = status_diff(Some(&svc), "node-b", &addrs, &ingress);
        assert!(d.ingress && d.vip_host);
        let ev = d.announce.unwrap();
        assert_eq!(
            ev.note,
            "192.0.2.20 announced by node node-b (moved from node-a)"
        );
        assert_eq!(ev.change, "7");
        // Written: nothing to do, nothing to announce (a restart of the same holder).
        svc.metadata.annotations =
            Some([(model::ANN_VIP_HOST.to_string(), "node-b".to_string())].into());
        svc.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(ingress.clone()),
            }),
            ..Default::default()
        });
        let d = status_diff(Some(&svc), "node-b", &addrs, &ingress);
        assert_eq!(
            d,
            StatusDiff {
                ingress: false,
                vip_host: false,
                announce: None
            }
        );
        // Changed by someone else: restored.
        svc.status = None;
        assert!(status_diff(Some(&svc), "node-b", &addrs, &ingress).ingress);
        assert!(status_diff(None, "node-b", &addrs, &ingress).vip_host);
    }

    #[test]
    fn local_services_without_endpoints_are_announced_nowhere_unless_their_group_lives() {
        use super::desired::Group;
        let k = |n: &str| ServiceKey::new("default", n);
        let lease = |n: &str| LeaseRef {
            namespace: "default".into(),
            name: n.into(),
        };
        let mut plan = Plan::default();
        for (l, members) in [("kubevip-a", &["a"][..]), ("kubevip-b", &["b", "c"][..])] {
            plan.groups.insert(
                lease(l),
                Group {
                    vips: Vec::new(),
                    campaign: false,
                    services: members.iter().map(|m| k(m)).collect(),
                },
            );
            for m in members {
                plan.addresses.insert(k(m), Vec::new());
            }
        }
        // a: alone and endpointless; b: shares its address with c (policy Cluster, or
        // Local with an endpoint somewhere), so b's address is still announced.
        let endpointless: HashSet<ServiceKey> = [k("a"), k("b"), k("gone")].into();
        assert_eq!(announced_nowhere(&plan, &endpointless), [k("a")].into());
        let all: HashSet<ServiceKey> = [k("a"), k("b"), k("c")].into();
        assert_eq!(announced_nowhere(&plan, &all), all);
    }

    /// A LoadBalancer Service `name` with annotation `kube-vip.io/loadbalancerIPs` = `ips`.
    fn lb(name: &str, ips: &str) -> Arc<Service> {
        let mut svc = Service::default();
        svc.metadata.name = Some(name.into());
        svc.metadata.namespace = Some("default".into());
        svc.metadata.uid = Some(format!("uid-{name}"));
        svc.metadata.annotations =
            Some([(model::ANN_LOADBALANCER_IPS.to_string(), ips.to_string())].into());
        svc.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ..Default::default()
        });
        Arc::new(svc)
    }

    #[test]
    fn refused_addresses_are_noted_with_field_and_value() {
        use clap::Parser;
        let env: std::collections::HashMap<&str, &str> = [
            ("cp_enable", "true"),
            ("svc_enable", "true"),
            ("address", "192.0.2.10"),
            ("vip_interface", "eth0"),
            ("vip_nodename", "node-a"),
        ]
        .into();
        let args = crate::config::ManagerArgs::try_parse_from(["manager"]).unwrap();
        let cfg =
            crate::config::resolve(&args, &|k| env.get(k).map(|v| v.to_string()), None).unwrap();
        let unusable = Unusable {
            control_plane: cfg.addresses.clone(),
            vip_subnet: cfg.vip_subnet,
            connected: vec![("192.0.2.11".parse().unwrap(), 24)],
        };
        let services = [
            lb("bad", "192.0.2.300"),
            lb("cp", "192.0.2.10"),
            lb("bcast", "192.0.2.255,192.0.2.40"),
            lb("good", "192.0.2.41"),
        ];
        let (cands, notes) = candidates(
            &cfg,
            &services,
            &HashSet::new(),
            &BTreeMap::new(),
            &unusable,
        );
        let found = |svc: &str, reason: &str| -> Vec<String> {
            notes
                .iter()
                .filter(|n| n.key.name == svc && n.reason == reason)
                .map(|n| {
                    assert_eq!(n.uid.as_deref(), Some(format!("uid-{svc}").as_str()));
                    n.message.clone()
                })
                .collect()
        };
        // All entries rejected: the log line names the field and the value, not just
        // "no address".
        let m = found("bad", "NoAddress");
        assert_eq!(m.len(), 1);
        assert!(
            m[0].contains("kube-vip.io/loadbalancerIPs") && m[0].contains("\"192.0.2.300\""),
            "{m:?}"
        );
        assert_eq!(found("bad", "InvalidAddress").len(), 1);
        let m = found("cp", "ControlPlaneAddress");
        assert!(m.len() == 1 && m[0].contains("192.0.2.10"), "{m:?}");
        let m = found("bcast", "UnusableAddress");
        assert!(
            m.len() == 1 && m[0].contains("192.0.2.255") && m[0].contains("192.0.2.0/24"),
            "{m:?}"
        );
        let announced: Vec<(String, Vec<IpAddr>)> = cands
            .iter()
            .map(|c| (c.key.name.clone(), c.addresses.clone()))
            .collect();
        assert_eq!(
            announced,
            [
                ("bcast".to_string(), vec!["192.0.2.40".parse().unwrap()]),
                ("good".to_string(), vec!["192.0.2.41".parse().unwrap()]),
            ]
        );
        // The ids do not change with the resourceVersion (no repeat on every re-plan, e.g.
        // after vipd's own status writes).
        let bumped: Vec<Arc<Service>> = services
            .iter()
            .map(|s| {
                let mut s = (**s).clone();
                s.metadata.resource_version = Some("2".into());
                Arc::new(s)
            })
            .collect();
        let (_, again) = candidates(&cfg, &bumped, &HashSet::new(), &BTreeMap::new(), &unusable);
        let ids = |n: &[Note]| n.iter().map(Note::id).collect::<Vec<_>>();
        assert_eq!(ids(&notes), ids(&again));
    }

    #[test]
    fn strip_keeps_what_vipd_reads() {
        use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut svc = Service::default();
        svc.metadata.name = Some("web".into());
        svc.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        svc.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_string(), "{...}".to_string()),
                (model::ANN_VIP_HOST.to_string(), "node-a".to_string()),
            ]
            .into(),
        );
        strip_service(&mut svc);
        assert_eq!(svc.metadata.managed_fields, None);
        let ann = svc.metadata.annotations.unwrap_or_default();
        assert_eq!(ann.len(), 1);
        assert_eq!(
            ann.get(model::ANN_VIP_HOST).map(String::as_str),
            Some("node-a")
        );

        let mut node = Node::default();
        node.metadata.name = Some("node-a".into());
        node.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        node.status = Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                address: "192.0.2.21".into(),
                type_: "InternalIP".into(),
            }]),
            images: Some(vec![Default::default(); 50]),
            ..Default::default()
        });
        let mut slice = EndpointSlice::default();
        slice.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        slice.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        slice.metadata.labels = Some([(SERVICE_NAME_LABEL.to_string(), "web".to_string())].into());
        strip_metadata(&mut slice);
        assert_eq!(slice.metadata.managed_fields, None);
        assert_eq!(slice.metadata.annotations, None);
        assert_eq!(
            slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .map(String::as_str),
            Some("web")
        );

        strip_node(&mut node);
        assert_eq!(node.metadata.labels, None);
        assert_eq!(node.status.as_ref().and_then(|s| s.images.as_ref()), None);
        assert_eq!(
            node_addresses(&[Arc::new(node)]).get(&"192.0.2.21".parse().unwrap()),
            Some(&"node-a".to_string())
        );
    }
}
