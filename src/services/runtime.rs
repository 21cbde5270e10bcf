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
//! ([`super::status::event_name`]), so nodes and restarts add no duplicates.
//!
//! Governance moves (S34): when an address moves to another lease, the previous lease
//! retires on every node and the address is held back from other leases until its handover
//! is done (see [`super::governance`]).

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
use tracing::{debug, info, warn};

use super::desired::{self, Candidate, LeaseRef, Mode, Plan, PlanConfig};
use super::endpoints::endpointslice_v1_served;
use super::governance::{self, Handover, LeaseView};
use super::model::{PortProto, ServiceKey};
use super::select::*;
use super::status::KubeStatusWriter;
use super::sync::*;
use super::watch::*;
use crate::admin::Readiness;
use crate::config::Config;
use crate::election::kube::{KubeLeaseClient, LeaseHub};
use crate::election::{ElectionEnd, Elector, Gates, LeaderState, LeaseClient, Timing};
use crate::holder::{HolderConfig, VipHolder, VipSpec};
use crate::metrics::Metrics;
use crate::net::{Announcer, Kernel};
pub use crate::nodes::node_addresses;

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
pub(super) struct Shared<K: Kernel, A: Announcer> {
    pub(super) node: String,
    /// Per-Service leases (deleted with their Service); the global lease is never deleted.
    pub(super) per_service: bool,
    pub(super) timing: Timing,
    pub(super) holder_cfg: HolderConfig,
    pub(super) kernel: Arc<K>,
    pub(super) announcer: Arc<A>,
    /// For Lease reads and writes only (see `kubeclient::ServicesClients`).
    pub(super) lease_client: kube::Client,
    pub(super) hub: LeaseHub,
    pub(super) status: KubeStatusWriter,
    pub(super) services: Store<Service>,
    pub(super) metrics: Metrics,
    /// `/readyz`: a lease written under this node's identity by another process fails it.
    pub(super) readiness: Readiness,
    /// Bumped after every pass over the Services cache: group tasks then compare their
    /// Services' status with the cache (no API call when it matches) and restore it.
    pub(super) services_seen: watch::Sender<u64>,
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
    let elector = elector
        .with_metrics(shared.metrics.clone())
        .with_acquire_check(service_still_exists(
            shared.lease_client.clone(),
            spec.clone(),
        ));
    let mut duplicate = elector.duplicate_identity();
    let lease_key = ServiceKey::new(&lease.namespace, &lease.name);
    let mut state = leadership.state.clone();
    let initial = spec.borrow_and_update().clone();
    let (vips_tx, vips_rx) = watch::channel(initial.vips.clone());
    let (conflicts_tx, mut conflicts) = watch::channel(Vec::new());
    let (bound_tx, mut bound) = watch::channel(Vec::new());
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
    .with_bound_reports(bound_tx)
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
                    let held = bound.borrow().clone();
                    let refused: Vec<IpAddr> = conflicts.borrow().iter().map(|(a, _)| *a).collect();
                    Box::pin(status.sync(&shared, &current, &held, &refused, true)).await;
                }
            }
            r = state.changed() => {
                if r.is_err() {
                    break;
                }
                let now_leading = matches!(*state.borrow_and_update(), LeaderState::Leading { .. });
                if now_leading && !leading {
                    status = StatusSync::default();
                    let held = bound.borrow().clone();
                    let refused: Vec<IpAddr> = conflicts.borrow().iter().map(|(a, _)| *a).collect();
                    Box::pin(status.sync(&shared, &current, &held, &refused, true)).await;
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
                    let held = bound.borrow().clone();
                    let refused: Vec<IpAddr> = conflicts.borrow().iter().map(|(a, _)| *a).collect();
                    Box::pin(status.sync(&shared, &current, &held, &refused, false)).await;
                }
            }
            _ = status.retry.wait() => {
                if leading {
                    let held = bound.borrow().clone();
                    let refused: Vec<IpAddr> = conflicts.borrow().iter().map(|(a, _)| *a).collect();
                    Box::pin(status.sync(&shared, &current, &held, &refused, true)).await;
                } else {
                    status.retry.at = None;
                }
            }
            r = bound.changed() => {
                if r.is_err() {
                    break;
                }
                bound.borrow_and_update();
                // The holder bound, refused or gave up an address: report what is held.
                if leading {
                    let held = bound.borrow().clone();
                    let refused: Vec<IpAddr> = conflicts.borrow().iter().map(|(a, _)| *a).collect();
                    Box::pin(status.sync(&shared, &current, &held, &refused, false)).await;
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

/// The acquisition check of a group's elector ([`crate::election::AcquireCheck`]): a GET
/// of its Services from the API server (not the cache) finds at least one that still exists
/// and is not being deleted. A failed GET (API slow or down, RBAC) answers `true`: the lease
/// call that follows needs the API anyway, and the check must never block a healthy
/// takeover.
fn service_still_exists(
    client: kube::Client,
    spec: watch::Receiver<GroupSpec>,
) -> crate::election::AcquireCheck {
    Arc::new(move || {
        let keys: Vec<ServiceKey> = spec
            .borrow()
            .services
            .iter()
            .map(|(k, _, _)| k.clone())
            .collect();
        let client = client.clone();
        Box::pin(async move {
            for key in &keys {
                let api: Api<Service> = Api::namespaced(client.clone(), &key.namespace);
                match tokio::time::timeout(Duration::from_secs(2), api.get_opt(&key.name)).await {
                    Ok(Ok(Some(svc))) if svc.metadata.deletion_timestamp.is_none() => return true,
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        debug!(service = %key, error = %e, "acquisition check: GET failed; not blocking");
                        return true;
                    }
                    Err(_) => return true,
                }
            }
            info!(services = ?keys, "not taking the lease: its Services no longer exist (the local cache is behind)");
            false
        })
    })
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
}
