//! One group task per Lease: the election, the VIP holder that follows it, and the status,
//! annotation and Events its Services get while this node leads ([`crate::services::plan::decide::status_step`]).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::dhcp_clients::{DhcpClients, DhcpEvent};
use super::publish::{ServiceEvent, StatusWriter};
use super::shared::Shared;
use super::sync::{StatusInputs, report_conflicts, report_handover, until};
use crate::election::kube::KubeLeaseClient;
use crate::election::local::LocalLeaseClient;
use crate::election::metrics::LeaseMetrics;
use crate::election::{
    DuplicateIdentity, ElectionEnd, Elector, Gates, LeaderState, LeaseClient, LeaseError,
    LeaseEvent, LeaseRecord, Observed,
};
use crate::holder::metrics::VipMetrics;
use crate::holder::{VipHolder, VipSpec};
use crate::net::{Announcer, Kernel};
use crate::nodes::eligibility::{GATE_INELIGIBLE, Ineligible};
use crate::services::plan::decide::DhcpClientId;
use crate::services::plan::decide::GroupSpec;
use crate::services::plan::decide::{self, GroupEvent};
use crate::services::plan::desired::{LeaseRef, NotHere};
use crate::services::plan::model::ServiceKey;
use crate::services::plan::reasons::REASON_SERVICE_SECURITY_PORT;
use crate::services::plan::security::{Held, Problem, exempt, ruleset};

/// The main loop's handle on a running group task.
pub(super) struct GroupHandle {
    /// The group's spec, shared with the group task (one copy of a shard's hundreds of
    /// Services for the handle, the task, its status task and its health follower, not
    /// four).
    spec: watch::Sender<Arc<GroupSpec>>,
    stop: CancellationToken,
    /// Set before `stop` when the group's Services are gone: delete the lease after
    /// releasing it.
    delete_lease: Arc<AtomicBool>,
    /// Set before `stop` when this node may not announce the group any more (node
    /// selector, subnet): a holder posts a `HandedOver` Event and counts the hand-over.
    not_here: Arc<std::sync::Mutex<Option<NotHere>>>,
    /// Set before `stop`: MACs another DHCP Service goes on with (no DHCPRELEASE for them).
    continued_macs: Arc<std::sync::Mutex<BTreeSet<DhcpClientId>>>,
    /// The group's election end (`None` if the task panicked).
    join: JoinHandle<Option<ElectionEnd>>,
}

impl GroupHandle {
    /// Starts the group task of `lease` with `spec`.
    pub(super) fn spawn<K: Kernel, A: Announcer>(
        shared: &Arc<Shared<K, A>>,
        lease: &LeaseRef,
        spec: GroupSpec,
    ) -> Self {
        let (tx, rx) = watch::channel(Arc::new(spec));
        let stop = CancellationToken::new();
        let delete_lease = Arc::new(AtomicBool::new(false));
        let not_here = Arc::new(std::sync::Mutex::new(None));
        let continued_macs = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        let join = tokio::spawn(group_task(
            shared.clone(),
            lease.clone(),
            rx,
            stop.clone(),
            Ending {
                delete_lease: delete_lease.clone(),
                not_here: not_here.clone(),
                continued_macs: continued_macs.clone(),
            },
        ));
        debug!(%lease, "Services: election started");
        GroupHandle {
            spec: tx,
            stop,
            delete_lease,
            not_here,
            continued_macs,
            join,
        }
    }

    /// Hands the group a new spec (no wake-up when it is the same).
    pub(super) fn update(&self, spec: GroupSpec) {
        self.spec.send_if_modified(|cur| {
            if **cur != spec {
                *cur = Arc::new(spec);
                true
            } else {
                false
            }
        });
    }

    /// Asks the group to stop (VIPs dropped, lease released, and deleted with
    /// `delete_lease`) without waiting; `not_here`: why this node may not announce it any
    /// more (its holder then posts a `HandedOver` Event); `continued_macs`: MACs another
    /// DHCP Service goes on with, whose leases are not released.
    pub(super) fn cancel(
        &self,
        delete_lease: bool,
        not_here: Option<NotHere>,
        continued_macs: BTreeSet<DhcpClientId>,
    ) {
        self.delete_lease.store(delete_lease, Ordering::SeqCst);
        if let Ok(mut n) = self.not_here.lock() {
            *n = not_here;
        }
        if let Ok(mut m) = self.continued_macs.lock() {
            *m = continued_macs;
        }
        self.stop.cancel();
    }

    /// Waits for the group task; its election end (`None` if it panicked).
    pub(super) async fn join(self) -> Option<ElectionEnd> {
        self.join.await.ok().flatten()
    }
}

/// A group task's parts while it runs.
struct Group<K: Kernel, A: Announcer> {
    shared: Arc<Shared<K, A>>,
    lease: LeaseRef,
    client: GroupLease,
    spec: watch::Receiver<Arc<GroupSpec>>,
    /// The spec last received.
    current: Arc<GroupSpec>,
    vips_tx: watch::Sender<Vec<VipSpec>>,
    /// The elector's preference delay, from the spec's preferred nodes.
    preference: watch::Sender<Duration>,
    /// The spec's preferred nodes, for the elector's fail-back (`svc_failback`).
    preferred: watch::Sender<Vec<String>>,
    /// The elector's fail-back hand-overs (the node each went to).
    failbacks: watch::Receiver<Option<String>>,
    state: watch::Receiver<LeaderState>,
    conflicts: watch::Receiver<Vec<(IpAddr, [u8; 6])>>,
    bound: watch::Receiver<Vec<IpAddr>>,
    duplicate: watch::Receiver<Option<DuplicateIdentity>>,
    seen: watch::Receiver<u64>,
    leading: bool,
    /// Address conflicts already posted as Events (posted again only when they change).
    reported: Vec<(IpAddr, [u8; 6])>,
    /// Level-triggered status (S38): while leading, status, vipHost and the announcement
    /// Events are written until they match, retried with back-off after a failure, by the
    /// group's status task ([`super::sync::follow`]), which hears of every event here.
    status_events: mpsc::UnboundedSender<GroupEvent>,
    /// The effective spec the status task writes for (updated before each event but the
    /// cache passes, which do not change it).
    status_spec: watch::Sender<Arc<GroupSpec>>,
    status_stop: CancellationToken,
    status_task: JoinHandle<()>,
    /// This group's election gates (the holder's and [`GATE_INELIGIBLE`]).
    gates: Gates,
    /// Why this node may not announce Service VIPs (`None`: eligible).
    ineligible: watch::Receiver<Option<Ineligible>>,
    elector_stop: CancellationToken,
    elector_task: JoinHandle<ElectionEnd>,
    holder_stop: CancellationToken,
    holder_task: JoinHandle<()>,
    /// The data-path health check ([`super::health::task::follow`]); stopped with the holder.
    health_task: JoinHandle<()>,
    /// DHCP mode: the clients of the group's DHCP Services while this node leads
    /// (`None` without a DHCP client, see [`Shared::dhcp`]).
    dhcp: Option<DhcpClients>,
    /// Leading, and DHCP Services wait for the automatic parent interface (no IPv4 default
    /// route yet): when to look for it again ([`DHCP_PARENT_RETRY`]).
    dhcp_parent_retry: Option<tokio::time::Instant>,
    /// Service security: the problems already posted as Warnings (posted again only after
    /// they went away).
    security_reported: Vec<Problem>,
}

/// How often a leader whose DHCP Services have no parent interface (no IPv4 default route,
/// no configured interface) looks for one again: 5 s.
const DHCP_PARENT_RETRY: Duration = Duration::from_secs(5);

/// How a group ends, set by [`GroupHandle::cancel`] before it stops.
struct Ending {
    delete_lease: Arc<AtomicBool>,
    not_here: Arc<std::sync::Mutex<Option<NotHere>>>,
    continued_macs: Arc<std::sync::Mutex<BTreeSet<DhcpClientId>>>,
}

/// One Lease: election, VIP holder, status writing. Returns how the election ended.
async fn group_task<K: Kernel, A: Announcer>(
    shared: Arc<Shared<K, A>>,
    lease: LeaseRef,
    spec: watch::Receiver<Arc<GroupSpec>>,
    stop: CancellationToken,
    ending: Ending,
) -> Option<ElectionEnd> {
    let mut group = Group::start(shared.clone(), lease, spec);
    group.run(&stop).await;
    // With the DHCP leases: those addresses are what is handed over.
    let (leading, spec) = (group.leading, group.effective());
    let continued = ending
        .continued_macs
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default();
    let end = Box::pin(group.finish(ending.delete_lease.load(Ordering::SeqCst), &continued)).await;
    let why = ending.not_here.lock().ok().and_then(|n| n.clone());
    // The VIPs are gone and the lease released (the next node takes it at once): only
    // now the Event, which costs an API call.
    if let Some(why) = why
        && leading
    {
        spec.count_handovers(&shared.metrics, why.reason);
        Box::pin(report_handover(&shared.status_ctx(), &spec, &why.message)).await;
    }
    end
}

/// A group's lease: a Kubernetes Lease (elected modes), or one that lives in this process
/// only ([`LocalLeaseClient`]: without election every eligible node leads its groups).
#[derive(Clone)]
enum GroupLease {
    /// The Lease on the API server, on the shared lease hub (boxed: ten times the size
    /// of the local one).
    Kube(Box<KubeLeaseClient>),
    /// In memory: always granted while the node's gates are open.
    Local(LocalLeaseClient),
}

impl LeaseClient for GroupLease {
    fn describe(&self) -> String {
        match self {
            GroupLease::Kube(c) => c.describe(),
            GroupLease::Local(c) => c.describe(),
        }
    }

    async fn get(&self) -> Result<Option<Observed>, LeaseError> {
        match self {
            GroupLease::Kube(c) => c.get().await,
            GroupLease::Local(c) => c.get().await,
        }
    }

    async fn create(&self, record: &LeaseRecord) -> Result<Observed, LeaseError> {
        match self {
            GroupLease::Kube(c) => c.create(record).await,
            GroupLease::Local(c) => c.create(record).await,
        }
    }

    async fn update(&self, record: &LeaseRecord, rv: &str) -> Result<Observed, LeaseError> {
        match self {
            GroupLease::Kube(c) => c.update(record, rv).await,
            GroupLease::Local(c) => c.update(record, rv).await,
        }
    }

    fn watch(&self) -> futures::stream::BoxStream<'static, LeaseEvent> {
        match self {
            GroupLease::Kube(c) => c.watch(),
            GroupLease::Local(c) => c.watch(),
        }
    }
}

/// The lease of group `lease`: without election ([`Mode::elects`] false) a process-local
/// one; else the Lease on the shared lease hub, where every lease but the global one
/// carries the labels of the leases the orphan collector may delete ([`Mode::collectable`]:
/// it deletes only those no Service uses, shard leases beyond the current count among
/// them).
///
/// [`Mode::elects`]: crate::services::plan::desired::Mode::elects
/// [`Mode::collectable`]: crate::services::plan::desired::Mode::collectable
fn lease_client<K: Kernel, A: Announcer>(shared: &Shared<K, A>, lease: &LeaseRef) -> GroupLease {
    if !shared.mode.elects() {
        return GroupLease::Local(LocalLeaseClient::new(&lease.to_string()));
    }
    let client = KubeLeaseClient::new(shared.lease_client.clone(), &lease.namespace, &lease.name)
        .with_hub(shared.hub.clone());
    GroupLease::Kube(Box::new(if shared.mode.collectable(lease) {
        client.with_labels(super::lease_gc::shared_lease_labels())
    } else {
        client
    }))
}

/// The group's ends of its VIP holder's channels.
struct HolderLinks {
    /// The VIPs to hold.
    vips_tx: watch::Sender<Vec<VipSpec>>,
    /// Address conflicts the holder found.
    conflicts: watch::Receiver<Vec<(IpAddr, [u8; 6])>>,
    /// The addresses the holder has bound.
    bound: watch::Receiver<Vec<IpAddr>>,
}

/// The VIP holder of `lease`, starting with `vips`, behind `gates`, and the group's ends
/// of its channels.
fn new_holder<K: Kernel, A: Announcer>(
    shared: &Shared<K, A>,
    lease: &LeaseRef,
    vips: &[VipSpec],
    gates: &Gates,
) -> (VipHolder<K, A>, HolderLinks) {
    let (vips_tx, vips_rx) = watch::channel(vips.to_vec());
    let (conflicts_tx, conflicts) = watch::channel(Vec::new());
    let (bound_tx, bound) = watch::channel(Vec::new());
    let holder = VipHolder::new(
        &lease.to_string(),
        shared.kernel.clone(),
        shared.announcer.clone(),
        vips.to_vec(),
        shared.holder_cfg.clone(),
        gates.clone(),
    )
    .with_updates(vips_rx)
    .with_conflict_reports(conflicts_tx)
    .with_bound_reports(bound_tx)
    .with_metrics(&shared.metrics);
    let links = HolderLinks {
        vips_tx,
        conflicts,
        bound,
    };
    (holder, links)
}

impl<K: Kernel, A: Announcer> Group<K, A> {
    /// Starts the elector and the VIP holder of `lease`.
    fn start(
        shared: Arc<Shared<K, A>>,
        lease: LeaseRef,
        mut spec: watch::Receiver<Arc<GroupSpec>>,
    ) -> Self {
        let gates = Gates::default();
        let mut ineligible = shared.ineligible.clone();
        gates.set(GATE_INELIGIBLE, ineligible.borrow_and_update().is_none());
        let client = lease_client(&shared, &lease);
        let (elector, leadership) =
            Elector::new(client.clone(), shared.node.clone(), shared.timing, &gates);
        let elector = match &shared.ride {
            Some(node) if shared.mode.elects() => {
                elector.with_ride(node.link(&lease.namespace, &lease.name))
            }
            _ => elector,
        };
        let initial = spec.borrow_and_update().clone();
        let (preference, preference_rx) = watch::channel(
            crate::election::spread::preference_delay(&shared.node, &initial.preferred),
        );
        let (preferred, preferred_rx) = watch::channel(initial.preferred.clone());
        let elector = match shared.failback.filter(|_| shared.mode.elects()) {
            Some(holddown) => elector.with_failback(crate::election::failback::FailbackLink {
                holddown,
                preferred: preferred_rx,
            }),
            None => elector,
        };
        let failbacks = elector.failbacks();
        let elector = elector.with_metrics(&shared.metrics);
        // Without election the lease is this process's own: nothing to spread, prefer,
        // ride through or check against the API server.
        let elector = match shared.mode.elects() {
            true => elector
                .with_spread(shared.spread_for(&lease))
                .with_outage(shared.outage.clone())
                .with_preference(preference_rx)
                .with_acquire_check(service_still_exists(
                    shared.lease_client.clone(),
                    spec.clone(),
                )),
            false => elector,
        };
        let duplicate = elector.duplicate_identity();
        let state = leadership.state.clone();
        let (holder, links) = new_holder(&shared, &lease, &initial.vips, &gates);
        // The holder runs from the start, also while following: its local checks (interface
        // present, VIP not already on the node untagged) close the gates before this node
        // campaigns, so a node that must not carry the address never takes the lease.
        let holder_stop = CancellationToken::new();
        let elector_stop = CancellationToken::new();
        let health_task = tokio::spawn(super::health::task::follow(
            shared.clone(),
            lease.to_string(),
            spec.clone(),
            state.clone(),
            gates.clone(),
            holder_stop.clone(),
        ));
        let holder_task = tokio::spawn(holder.run(leadership, holder_stop.clone()));
        let elector_task = crate::election::own_runtime::spawn_on(
            shared.elections.as_ref(),
            elector.run(elector_stop.clone()),
        );
        let seen = shared.services_seen.subscribe();
        let (status_events, events_rx) = mpsc::unbounded_channel();
        let (status_spec, spec_rx) = watch::channel(initial.clone());
        let status_stop = CancellationToken::new();
        let status_task = tokio::spawn({
            let shared = shared.clone();
            let inputs = StatusInputs {
                spec: spec_rx,
                bound: links.bound.clone(),
                conflicts: links.conflicts.clone(),
                leader: state.clone(),
            };
            let stop = status_stop.clone();
            async move {
                let ctx = shared.status_ctx();
                super::sync::follow(&ctx, events_rx, inputs, &stop).await;
            }
        });
        let dhcp = shared
            .dhcp
            .clone()
            .map(|d| DhcpClients::new(d).with_metrics(&shared.metrics));
        Group {
            dhcp,
            dhcp_parent_retry: None,
            security_reported: Vec::new(),
            gates,
            ineligible,
            shared,
            lease,
            client,
            spec,
            current: initial,
            vips_tx: links.vips_tx,
            preference,
            preferred,
            failbacks,
            state,
            conflicts: links.conflicts,
            bound: links.bound,
            duplicate,
            seen,
            leading: false,
            reported: Vec::new(),
            status_events,
            status_spec,
            status_stop,
            status_task,
            elector_stop,
            elector_task,
            holder_stop,
            holder_task,
            health_task,
        }
    }

    /// Follows the election, the holder and the cache until `stop` (or a channel closes).
    async fn run(&mut self, stop: &CancellationToken) {
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.spec.changed() => {
                    if r.is_err() {
                        return;
                    }
                    self.current = self.spec.borrow_and_update().clone();
                    if self.leading {
                        Box::pin(self.dhcp_follow()).await;
                    }
                    self.push_vips();
                    self.preference.send_replace(crate::election::spread::preference_delay(
                        &self.shared.node,
                        &self.current.preferred,
                    ));
                    self.preferred.send_if_modified(|p| {
                        let changed = *p != self.current.preferred;
                        if changed {
                            p.clone_from(&self.current.preferred);
                        }
                        changed
                    });
                    GroupEvent::Spec
                }
                r = self.state.changed() => {
                    if r.is_err() {
                        return;
                    }
                    let leading = matches!(*self.state.borrow_and_update(), LeaderState::Leading { .. });
                    if leading == self.leading && renewal_skippable(self.dhcp.as_ref(), &self.current) {
                        // A renewal (every retry period): nothing for the Service security
                        // ports or the status task (`status_step`: Nothing), and a shard's
                        // spec is hundreds of Services to copy. A DHCP group (one Service)
                        // goes on: its renewals retry the annotations that differ.
                        continue;
                    }
                    Box::pin(self.dhcp_leading(leading)).await;
                    GroupEvent::Leading(leading)
                }
                _ = dhcp_changed(&mut self.dhcp) => {
                    Box::pin(self.dhcp_observe()).await;
                    GroupEvent::Bound
                }
                _ = until(self.dhcp_parent_retry) => {
                    Box::pin(self.dhcp_parent_retry()).await;
                    continue;
                }
                r = self.seen.changed() => {
                    if r.is_err() {
                        return;
                    }
                    self.seen.borrow_and_update();
                    GroupEvent::CacheSeen
                }
                r = self.bound.changed() => {
                    if r.is_err() {
                        return;
                    }
                    self.bound.borrow_and_update();
                    GroupEvent::Bound
                }
                r = self.conflicts.changed() => {
                    if r.is_err() {
                        return;
                    }
                    Box::pin(self.conflicts_changed()).await;
                    continue;
                }
                r = self.duplicate.changed() => {
                    if r.is_err() {
                        return;
                    }
                    Box::pin(self.duplicate_changed()).await;
                    continue;
                }
                r = self.failbacks.changed() => {
                    if r.is_err() {
                        return;
                    }
                    Box::pin(self.failed_back()).await;
                    continue;
                }
                r = self.ineligible.changed() => {
                    if r.is_err() {
                        return;
                    }
                    Box::pin(self.eligibility_changed()).await;
                    continue;
                }
            };
            Box::pin(self.status_event(event)).await;
        }
    }

    /// The elector handed the lease over to a more preferred node (fail-back): the VIPs are
    /// gone and the lease released; count it and post the `HandedOver` Events.
    async fn failed_back(&mut self) {
        let Some(to) = self.failbacks.borrow_and_update().clone() else {
            return;
        };
        let spec = self.effective();
        spec.count_handovers(&self.shared.metrics, "failback");
        let why = format!("fail-back: {to} is more preferred (vipd.io/preferred-nodes)");
        info!(lease = %self.lease, to = %to, "handed the Service over to a more preferred node");
        report_handover(&self.shared.status_ctx(), &spec, &why).await;
    }

    /// Hands `event` to the status task (with the effective spec first, unless a cache
    /// pass, which does not change it); while leading, writes the DHCP annotations that
    /// differ from the cache.
    async fn status_event(&mut self, event: GroupEvent) {
        if let GroupEvent::Leading(now) = event {
            self.leading = now;
        }
        Box::pin(self.security_follow()).await;
        if event != GroupEvent::CacheSeen {
            self.status_spec.send_replace(self.effective());
        }
        // The status task ends only after this loop (stopped in `finish`).
        let _ = self.status_events.send(event);
        if let (true, Some(dhcp)) = (self.leading, &self.dhcp) {
            let spec = self.status_spec.borrow().clone();
            write_annotations(dhcp, &spec, &self.shared.status_ctx()).await;
        }
    }

    /// Service security: reports the Services this group announces (none unless leading)
    /// and posts a Warning for each new port that cannot be allowed.
    async fn security_follow(&mut self) {
        let Some(security) = self.shared.security.clone() else {
            return;
        };
        let held = match self.leading {
            true => held_services(&self.effective(), &self.shared.status_ctx()),
            false => Vec::new(),
        };
        let problems = ruleset(&held).problems;
        security.set(&self.lease.to_string(), held);
        let new: Vec<DhcpEvent> = problems
            .iter()
            .filter(|p| !self.security_reported.contains(p))
            .map(|p| {
                warn!(service = %p.key, "{}", p.message);
                (
                    p.key.clone(),
                    REASON_SERVICE_SECURITY_PORT,
                    p.message.clone(),
                )
            })
            .collect();
        self.security_reported = problems;
        post_events(&self.shared.status, new).await;
    }

    /// The spec with the DHCP Services' leased addresses ([`DhcpClients::effective`]; the
    /// spec received itself, shared, without a DHCP client).
    fn effective(&self) -> Arc<GroupSpec> {
        match &self.dhcp {
            Some(d) => Arc::new(d.effective(&self.current)),
            None => self.current.clone(),
        }
    }

    /// Hands the holder the VIPs of [`Self::effective`] (no wake-up when unchanged).
    fn push_vips(&self) {
        let spec = self.effective();
        self.vips_tx.send_if_modified(|cur| {
            if *cur != spec.vips {
                cur.clone_from(&spec.vips);
                true
            } else {
                false
            }
        });
    }

    /// DHCP mode, leadership changed: leading starts the clients; not leading stops them
    /// without DHCPRELEASE (the next holder asks for the same addresses) and drops their
    /// addresses from the VIP set.
    async fn dhcp_leading(&mut self, leading: bool) {
        if leading == self.leading {
            return;
        }
        if leading {
            self.dhcp_follow().await;
        } else if let Some(d) = &mut self.dhcp {
            self.dhcp_parent_retry = None;
            let stopping = d.take_all(false, &BTreeSet::new());
            self.push_vips();
            stopping.finish().await;
        }
        self.push_vips();
    }

    /// Leading: makes the DHCP clients follow the spec, posting a Warning for each that
    /// cannot start.
    async fn dhcp_follow(&mut self) {
        let Some(d) = &mut self.dhcp else {
            return;
        };
        let needs_auto = self.current.dhcp.iter().any(|s| s.request.parent.is_none());
        let parent = match needs_auto {
            true => auto_parent(self.shared.kernel.as_ref()).await,
            false => None,
        };
        // Without a parent those Services get a Warning now and their clients once one
        // appears (a default route added after vipd started).
        self.dhcp_parent_retry = (needs_auto && parent.is_none())
            .then(|| tokio::time::Instant::now() + DHCP_PARENT_RETRY);
        // The addresses of clients that stop leave the VIP set before their macvlans go
        // (a VIP whose interface vanished would close the link gate).
        let retired = d.retire(&self.current.dhcp);
        self.push_vips();
        retired.finish().await;
        let Some(d) = &mut self.dhcp else {
            return;
        };
        let events = d.start_missing(&self.current.dhcp, parent.as_deref());
        post_events(&self.shared.status, events).await;
    }

    /// [`Self::dhcp_parent_retry`] is due: starts the waiting clients once the automatic
    /// parent interface exists (quietly looking again later while it does not).
    async fn dhcp_parent_retry(&mut self) {
        self.dhcp_parent_retry = None;
        if !self.leading {
            return;
        }
        match find_auto_parent(self.shared.kernel.as_ref()).await {
            Ok(_) => self.dhcp_follow().await,
            Err(_) => {
                self.dhcp_parent_retry = Some(tokio::time::Instant::now() + DHCP_PARENT_RETRY);
            }
        }
    }

    /// A DHCP client's state changed: Warnings for new failures, the VIP set updated.
    async fn dhcp_observe(&mut self) {
        let Some(d) = &mut self.dhcp else {
            return;
        };
        let events = d.observe();
        self.push_vips();
        post_events(&self.shared.status, events).await;
    }

    /// Opens or closes [`GATE_INELIGIBLE`]; when it closes while this node leads (the
    /// elector then drops the VIPs and releases the lease), posts a Normal Event on each of
    /// the group's Services saying why.
    async fn eligibility_changed(&mut self) {
        let why = *self.ineligible.borrow_and_update();
        self.gates.set(GATE_INELIGIBLE, why.is_none());
        let Some(why) = why else {
            return;
        };
        if !self.leading {
            return;
        }
        self.current
            .count_handovers(&self.shared.metrics, why.label());
        report_handover(
            &self.shared.status_ctx(),
            &self.effective(),
            &why.to_string(),
        )
        .await;
    }

    /// Posts an Event for every new address conflict.
    async fn conflicts_changed(&mut self) {
        let now = self.conflicts.borrow_and_update().clone();
        let new: Vec<(IpAddr, [u8; 6])> = now
            .iter()
            .filter(|c| !self.reported.contains(c))
            .copied()
            .collect();
        self.reported = now;
        let spec = self.effective();
        let declined: Vec<IpAddr> = match &self.dhcp {
            Some(d) => new
                .iter()
                .filter(|(addr, _)| d.decline(*addr).is_some())
                .map(|(addr, _)| *addr)
                .collect(),
            None => Vec::new(),
        };
        report_conflicts(&self.shared.status_ctx(), &spec, &new, &declined).await;
    }

    /// S35: Event about the Services of a per-Service lease, about the Lease for the
    /// global one.
    async fn duplicate_changed(&mut self) {
        let cond = self.duplicate.borrow_and_update().clone();
        let about: Vec<ServiceKey> = if self.shared.per_service(&self.lease) {
            self.current
                .services
                .iter()
                .map(|(k, _, _)| k.clone())
                .collect()
        } else {
            Vec::new()
        };
        crate::election::identity::publish(
            cond.as_ref(),
            &ServiceKey::new(&self.lease.namespace, &self.lease.name),
            &about,
            &self.shared.readiness,
            self.shared.status.recorder(),
        )
        .await;
    }

    /// Stops the elector (which releases the lease once the holder has dropped the VIPs),
    /// then the holder; forgets the group's metrics series and deletes the lease when
    /// [`decide::lease_to_delete`] says so. Returns how the election ended.
    async fn finish(
        mut self,
        delete_lease: bool,
        continued: &BTreeSet<DhcpClientId>,
    ) -> Option<ElectionEnd> {
        // No status write after this: the holder is about to drop the VIPs.
        self.status_stop.cancel();
        let _ = self.status_task.await;
        // DHCP clients first, so their macvlans (and addresses) are gone before the lease
        // is released: released with the group's Services gone (unless another DHCP
        // Service goes on with the MAC), else kept for the next holder.
        if let Some(d) = &mut self.dhcp {
            let stopping = d.take_all(delete_lease, continued);
            self.vips_tx.send_replace(self.current.vips.clone());
            stopping.finish().await;
        }
        let lease = self.lease;
        let shared = self.shared;
        shared
            .readiness
            .set_duplicate_identity(&lease.to_string(), false);
        self.elector_stop.cancel();
        let end = self.elector_task.await.ok();
        self.holder_stop.cancel();
        let _ = self.holder_task.await;
        let _ = self.health_task.await;
        // The VIPs are gone: so are their Services' entries.
        if let Some(security) = &shared.security {
            security.set(&lease.to_string(), Vec::new());
        }
        // Series of a group that is gone would otherwise stay for the process lifetime.
        let service_metrics = shared.service_metrics();
        let lease_name = lease.to_string();
        shared
            .metrics
            .families::<LeaseMetrics>()
            .forget(&lease_name);
        service_metrics.forget_lease(&lease_name);
        let vip_metrics = shared.metrics.families::<VipMetrics>();
        for v in &self.current.vips {
            vip_metrics.forget_vip(v.vip.addr);
            if delete_lease {
                service_metrics.forget_vip_handovers(v.vip.addr);
            }
        }
        // Other nodes judge a lease deleted while held as held for one more lease duration;
        // the VIP holder has stopped.
        if let (Some(rv), Some(e), GroupLease::Kube(client)) = (
            decide::lease_to_delete(delete_lease, end.as_ref(), &shared.node),
            end.as_ref(),
            &self.client,
        ) {
            Box::pin(delete_stopped_lease(
                client,
                &lease,
                rv,
                &shared.node,
                &e.own,
            ))
            .await;
        }
        end
    }
}

/// Timeout of each call [`delete_stopped_lease`] makes (5 s).
const LEASE_DELETE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Deletes a stopped group's lease at version `rv` ([`decide::lease_to_delete`]). When the
/// lease was changed since (409), it is read again and deleted at its new version if
/// [`decide::lease_to_delete_again`] allows (released, or under this node's name `node` by
/// a write of the stopped elector, `own`; one another process wrote under the same name is
/// its live lease): the answer to the release may have been lost to a call timeout after
/// the server wrote it, and that lease would otherwise stay until the orphan collector ([`super::lease_gc`]), a
/// lease duration plus 30 s later. Two rounds at most; a failed call (API unreachable) is
/// logged and left to the collector, so that a stop never waits on an outage.
async fn delete_stopped_lease(
    client: &KubeLeaseClient,
    lease: &LeaseRef,
    rv: &str,
    node: &str,
    own: &crate::election::OwnWrites,
) {
    let mut rv = rv.to_string();
    let name = lease.to_string();
    let bound = LEASE_DELETE_CALL_TIMEOUT;
    for round in 0..2 {
        match crate::election::timed(&name, "delete", bound, client.delete(&rv)).await {
            Ok(true) => {
                info!(%lease, "lease deleted");
                return;
            }
            Ok(false) if round == 0 => {
                debug!(%lease, "lease changed or gone since it was last seen; reading it again")
            }
            Ok(false) => {
                debug!(%lease, "lease changed again; left to the orphan collector");
                return;
            }
            Err(e) => {
                warn!(%lease, error = %e, "deleting the lease failed; left to the orphan collector");
                return;
            }
        }
        let current = match crate::election::timed(&name, "get", bound, client.get()).await {
            Ok(current) => current,
            Err(e) => {
                warn!(%lease, error = %e, "reading the lease again failed; left to the orphan collector");
                return;
            }
        };
        match decide::lease_to_delete_again(current.as_ref(), node, own) {
            Some(v) => rv = v.to_string(),
            None => {
                debug!(%lease, "lease gone or held by another node; not deleted");
                return;
            }
        }
    }
}

/// The acquisition check of a group's elector ([`crate::election::AcquireCheck`]): a GET
/// of its Services from the API server (not the cache) finds at least one that still exists
/// and is not being deleted. A GET that fails or takes longer than 2 s answers `false`: the
/// elector asks again a retry period later. The API server that just failed a GET may still
/// take the lease write that follows (a timeout under load, a connection reset after a
/// restart), and a node whose cache is behind would then announce a deleted Service's
/// address (chaos soak, seed 20261201: 0.5 s, 6 s after the delete). Only a 403 answers
/// `true`: missing RBAC (which `vipd preflight` reports) must not stop every takeover.
fn service_still_exists(
    client: kube::Client,
    spec: watch::Receiver<Arc<GroupSpec>>,
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
                    Ok(Err(kube::Error::Api(e))) if e.code == 403 => {
                        debug!(service = %key, error = %e, "acquisition check: GET forbidden (RBAC); not blocking");
                        return true;
                    }
                    Ok(Err(e)) => {
                        debug!(service = %key, error = %e, "acquisition check: GET failed; not acquiring until it works");
                        return false;
                    }
                    Err(_) => {
                        debug!(service = %key, "acquisition check: GET timed out; not acquiring until it works");
                        return false;
                    }
                }
            }
            info!(services = ?keys, "not taking the lease: its Services no longer exist (the local cache is behind)");
            false
        })
    })
}

/// The Services of `spec` as service security sees them: their addresses and ports, and
/// whether the cached Service carries the exemption annotation.
fn held_services<W: StatusWriter>(
    spec: &GroupSpec,
    ctx: &super::sync::StatusCtx<'_, W>,
) -> Vec<Held> {
    spec.services
        .iter()
        .map(|(key, addresses, ports)| Held {
            key: key.clone(),
            addresses: addresses.clone(),
            ports: ports.clone(),
            exempt: ctx
                .cached(key)
                .is_some_and(|s| exempt(s.metadata.annotations.as_ref())),
        })
        .collect()
}

/// Resolves when a DHCP client's state changes; never without clients.
async fn dhcp_changed(dhcp: &mut Option<DhcpClients>) {
    match dhcp {
        Some(d) => d.changed().await,
        None => std::future::pending().await,
    }
}

/// The automatic parent interface of DHCP macvlans: the IPv4 default route's interface
/// (as for VIPs without a configured interface); `None` (logged) when there is none.
async fn auto_parent<K: Kernel>(kernel: &K) -> Option<String> {
    match find_auto_parent(kernel).await {
        Ok(name) => Some(name),
        Err(e) => {
            warn!(error = %e, "no interface for DHCP macvlans (set vip_servicesinterface)");
            None
        }
    }
}

/// [`auto_parent`] without the log line.
async fn find_auto_parent<K: Kernel>(kernel: &K) -> Result<String, crate::net::NetError> {
    let any = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    let idx = kernel.choose_interface(any).await?;
    Ok(kernel.link_by_index(idx).await?.name)
}

/// Posts DHCP Warnings (failures are logged by the writer and not retried: the next
/// failure posts again).
async fn post_events<W: StatusWriter>(writer: &W, events: Vec<DhcpEvent>) {
    for (key, reason, message) in events {
        let ev = ServiceEvent::warning(reason, message);
        if let Err(e) = writer.event(&key, None, &ev).await {
            debug!(service = %key, error = %e, "cannot record DHCP event");
        }
    }
}

/// Writes back the DHCP annotations that differ from the cache
/// ([`DhcpClients::annotations`], and [`DhcpClients::lease_marks`] on the Services of
/// `spec` sharing a leased address); a failure is tried again at the next pass over the
/// cache.
async fn write_annotations<W: StatusWriter>(
    dhcp: &DhcpClients,
    spec: &GroupSpec,
    ctx: &super::sync::StatusCtx<'_, W>,
) {
    let writes = dhcp
        .annotations(|k| ctx.cached(k))
        .into_iter()
        .chain(dhcp.lease_marks(spec, |k| ctx.cached(k)));
    for (key, values) in writes {
        match ctx.writer.set_annotations(&key, &values).await {
            Ok(_) => debug!(service = %key, annotations = ?values, "DHCP annotations written"),
            Err(e) => {
                warn!(service = %key, error = %e, "writing the DHCP annotations failed; retrying at the next change")
            }
        }
    }
}

/// Whether a renewal of the group's lease (leading as before) needs nothing of the group's
/// loop: the group has no DHCP Service and no DHCP client still running. Every group has
/// [`DhcpClients`] wherever this vipd runs a DHCP client (every node where it can open its
/// raw socket), so whether the group has them at all says nothing (found by the new-user
/// trial: with `self.dhcp.is_none()` no group of a real node ever skipped a renewal).
fn renewal_skippable(dhcp: Option<&DhcpClients>, spec: &GroupSpec) -> bool {
    spec.dhcp.is_empty() && dhcp.is_none_or(DhcpClients::idle)
}

#[cfg(test)]
mod renewal_tests {
    use super::*;
    use crate::dhcp::fake::FakeDhcp;
    use crate::services::dhcp_clients::tests::{dhcp_service, service};

    #[test]
    fn a_group_without_dhcp_services_skips_renewals_on_a_node_with_a_dhcp_client() {
        let spec = GroupSpec::default();
        assert!(renewal_skippable(None, &spec), "no DHCP client on the node");
        let clients = DhcpClients::new(Arc::new(FakeDhcp::new()));
        assert!(
            renewal_skippable(Some(&clients), &spec),
            "a node with a DHCP client, a group with no DHCP Service (every shard on a real node)"
        );
        let mut dhcp_spec = GroupSpec::default();
        dhcp_spec.dhcp.push(dhcp_service(&service("dhcp", &[])));
        assert!(
            !renewal_skippable(Some(&clients), &dhcp_spec),
            "a DHCP group goes on"
        );
    }

    /// The other half of the rule: a group whose last DHCP Service left while its client
    /// still runs goes on renewing (the renewal's pass retires the client and releases its
    /// lease), and skips renewals once the client is gone.
    #[tokio::test(start_paused = true)]
    async fn a_dhcp_client_still_running_after_its_service_left_keeps_the_renewals() {
        let mut clients = DhcpClients::new(Arc::new(FakeDhcp::new()));
        let dhcp = dhcp_service(&service("dhcp", &[]));
        assert!(
            clients
                .follow(std::slice::from_ref(&dhcp), Some("eth0"))
                .await
                .is_empty()
        );
        let left = GroupSpec::default();
        assert!(
            !renewal_skippable(Some(&clients), &left),
            "the Service left, its client still runs"
        );
        clients.follow(&[], Some("eth0")).await;
        assert!(
            renewal_skippable(Some(&clients), &left),
            "the client released: nothing left to retire"
        );
    }
}

#[cfg(test)]
mod acquire_check_tests {
    use super::*;
    use crate::kube::fake_api::{json_reply, status};

    /// A client whose API server answers every GET with `status` and `body`, after `delay`.
    fn api(status: u16, body: serde_json::Value, delay: Duration) -> kube::Client {
        let svc = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
            let body = body.clone();
            async move {
                tokio::time::sleep(delay).await;
                Ok::<_, std::convert::Infallible>(json_reply(status, &body))
            }
        });
        kube::Client::new(svc, "default")
    }

    async fn check(client: kube::Client) -> bool {
        let spec = GroupSpec {
            services: vec![(
                ServiceKey {
                    namespace: "default".into(),
                    name: "svc-27".into(),
                },
                Vec::new(),
                Vec::new(),
            )],
            ..Default::default()
        };
        let (_tx, rx) = watch::channel(Arc::new(spec));
        service_still_exists(client, rx)().await
    }

    #[tokio::test(start_paused = true)]
    async fn acquires_only_when_the_api_server_shows_the_service() {
        let svc = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "svc-27", "namespace": "default"}});
        assert!(check(api(200, svc, Duration::ZERO)).await, "exists");
        assert!(
            !check(api(404, status(404), Duration::ZERO)).await,
            "deleted"
        );
        assert!(
            !check(api(500, status(500), Duration::ZERO)).await,
            "a failed GET blocks"
        );
        assert!(
            !check(api(200, serde_json::json!({}), Duration::from_secs(3))).await,
            "a GET slower than 2 s blocks"
        );
        assert!(
            check(api(403, status(403), Duration::ZERO)).await,
            "RBAC missing: preflight's business, not a reason to stop takeovers"
        );
    }
}

#[cfg(test)]
mod lease_delete_tests {
    use std::sync::Mutex;

    use super::*;
    use crate::election::OwnWrites;
    use crate::kube::fake_api::{json_body, json_reply, status};

    /// A fake API server holding one Lease (`None`: absent) at a resourceVersion: GET
    /// returns it, DELETE removes it only when its precondition names that version (409
    /// otherwise, 404 when absent). Returns the client, the Lease, and the preconditions
    /// of every DELETE.
    #[allow(clippy::type_complexity)]
    fn api(
        holder: &str,
        version: &str,
    ) -> (
        kube::Client,
        Arc<Mutex<Option<(String, String)>>>,
        Arc<Mutex<Vec<String>>>,
    ) {
        api_renewed(holder, version, None)
    }

    /// [`api`] with the Lease's `renewTime` (RFC 3339 with microseconds; `None`: unset).
    #[allow(clippy::type_complexity)]
    fn api_renewed(
        holder: &str,
        version: &str,
        renew: Option<&str>,
    ) -> (
        kube::Client,
        Arc<Mutex<Option<(String, String)>>>,
        Arc<Mutex<Vec<String>>>,
    ) {
        let renew = renew.map(str::to_string);
        let stored = Arc::new(Mutex::new(Some((holder.to_string(), version.to_string()))));
        let deletes = Arc::new(Mutex::new(Vec::new()));
        let (s, d) = (stored.clone(), deletes.clone());
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (stored, deletes, renew) = (s.clone(), d.clone(), renew.clone());
            async move {
                let method = req.method().to_string();
                let body = json_body(req).await;
                let mut lease = stored.lock().unwrap();
                let (code, reply) = match (method.as_str(), lease.clone()) {
                    (_, None) => (404, status(404)),
                    ("GET", Some((holder, rv))) => (
                        200,
                        serde_json::json!({"apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease", "metadata": {"name": "vipd-local.default.web",
                            "namespace": "kube-system", "resourceVersion": rv},
                            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 5,
                                "renewTime": renew}}),
                    ),
                    ("DELETE", Some((_, rv))) => {
                        let want = body["preconditions"]["resourceVersion"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        deletes.lock().unwrap().push(want.clone());
                        if want == rv {
                            *lease = None;
                            (200, status(200))
                        } else {
                            (409, status(409))
                        }
                    }
                    _ => (405, status(405)),
                };
                Ok::<_, std::convert::Infallible>(json_reply(code, &reply))
            }
        });
        (kube::Client::new(svc, "default"), stored, deletes)
    }

    fn lease() -> LeaseRef {
        LeaseRef {
            namespace: "kube-system".into(),
            name: "vipd-local.default.web".into(),
        }
    }

    /// The release was written but its answer lost: the group saw version 5 under its own
    /// name, the server has the released lease at 6. The lease is deleted all the same.
    #[tokio::test]
    async fn a_release_whose_answer_was_lost_is_deleted_at_its_new_version() {
        let (client, stored, deletes) = api("", "6");
        let c = KubeLeaseClient::new(client, "kube-system", "vipd-local.default.web");
        delete_stopped_lease(&c, &lease(), "5", "node-a", &OwnWrites::default()).await;
        assert_eq!(*deletes.lock().unwrap(), ["5", "6"]);
        assert!(stored.lock().unwrap().is_none(), "deleted");
    }

    /// A lease another node took since (a recreated Service's holder) is kept; one that is
    /// at the version seen is deleted at once.
    #[tokio::test]
    async fn a_lease_another_node_holds_now_is_kept() {
        let (client, stored, deletes) = api("node-b", "6");
        let c = KubeLeaseClient::new(client, "kube-system", "vipd-local.default.web");
        delete_stopped_lease(&c, &lease(), "5", "node-a", &OwnWrites::default()).await;
        assert_eq!(*deletes.lock().unwrap(), ["5"]);
        assert!(stored.lock().unwrap().is_some(), "kept");

        let (client, stored, deletes) = api("", "5");
        let c = KubeLeaseClient::new(client, "kube-system", "vipd-local.default.web");
        delete_stopped_lease(&c, &lease(), "5", "node-a", &OwnWrites::default()).await;
        assert_eq!(*deletes.lock().unwrap(), ["5"]);
        assert!(stored.lock().unwrap().is_none(), "deleted");
    }

    /// Another process under this node's name (duplicate identity: a twin, e.g. a cloned
    /// machine with the same node name) took the lease since the stopped group's elector
    /// last saw it (a recreated Service's holder): the record names this node, but this
    /// process never wrote it. It is that process's live lease and is kept, as the elector
    /// itself treats such a record as another holder's (`held_by_another`).
    #[tokio::test]
    async fn a_lease_a_twin_under_this_nodes_name_holds_now_is_kept() {
        let (client, stored, deletes) =
            api_renewed("node-a", "6", Some("2026-12-07T04:00:00.000001Z"));
        let c = KubeLeaseClient::new(client, "kube-system", "vipd-local.default.web");
        delete_stopped_lease(&c, &lease(), "5", "node-a", &OwnWrites::default()).await;
        assert_eq!(*deletes.lock().unwrap(), ["5"]);
        assert!(stored.lock().unwrap().is_some(), "kept");
    }

    /// The stopped elector's own renewal whose answer was lost (sent, outcome unknown):
    /// the record under this node's name at the new version is its own, and is deleted.
    #[tokio::test]
    async fn this_processs_own_write_whose_answer_was_lost_is_deleted() {
        let renew = "2026-12-07T04:00:00.000001Z";
        let mut own = OwnWrites::default();
        own.attempted(&crate::election::LeaseRecord {
            holder: "node-a".into(),
            renew_time: Some(renew.parse().unwrap()),
            ..Default::default()
        });
        let (client, stored, deletes) = api_renewed("node-a", "6", Some(renew));
        let c = KubeLeaseClient::new(client, "kube-system", "vipd-local.default.web");
        delete_stopped_lease(&c, &lease(), "5", "node-a", &own).await;
        assert_eq!(*deletes.lock().unwrap(), ["5", "6"]);
        assert!(stored.lock().unwrap().is_none(), "deleted");
    }
}
