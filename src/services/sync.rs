//! Status, annotations and Events kept level-triggered (S38, S39): the group holder's
//! [`StatusSync`], the main loop's notes and stale-status clearing, with retries.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, Store};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::publish::{ServiceEvent, StatusWriter, desired_ingress};
use crate::kube::calls::at_most;
use crate::net::conflict::fmt_mac;
use crate::services::plan::desired::Plan;
use crate::services::plan::model::{self, ServiceKey};

use crate::election::LeaderState;
use crate::services::plan::decide::{self, GroupSpec};
use crate::services::plan::notes::{Note, uid_of};

/// What the status side works with (the seam of its unit tests): this node's name, the
/// Services cache it compares with, and the writer ([`super::publish::KubeStatusWriter`] in
/// the runtime, [`super::publish::MemoryStatusWriter`] in tests).
pub(super) struct StatusCtx<'a, W: StatusWriter> {
    /// This node (`kube-vip.io/vipHost` value).
    pub(super) node: &'a str,
    /// The Services cache (the reflector's store).
    pub(super) services: &'a Store<Service>,
    /// Where status, annotations and Events go.
    pub(super) writer: &'a W,
    /// Every node that may serve a Service routes it (no election,
    /// `crate::services::plan::desired::Mode::Unelected`): see [`StatusSync::sync`].
    pub(super) every_node: bool,
}

impl<W: StatusWriter> StatusCtx<'_, W> {
    /// The cached Service `key`, if any.
    pub(super) fn cached(&self, key: &ServiceKey) -> Option<Arc<Service>> {
        self.services
            .get(&reflector::ObjectRef::new(&key.name).within(&key.namespace))
    }
}

/// Notes reported while their cause lasts: id -> the Event was written (or none is due).
#[derive(Default)]
pub(super) struct Reported(std::collections::HashMap<String, bool>);

/// Back-off of the main loop's retries (failed Events of notes, failed status clears):
/// the watches' back-off ([`crate::kube::client::WatchBackoff`], 0.8 s doubling to 20 s
/// plus up to 25 %), reset after a pass where everything succeeded.
#[derive(Default)]
pub(super) struct Retry {
    pub(super) backoff: crate::kube::client::WatchBackoff,
    pub(super) at: Option<tokio::time::Instant>,
}

impl Retry {
    /// Schedules the next retry after a failed pass (`ok` false), clears it otherwise.
    pub(super) fn after(&mut self, ok: bool) {
        use kube::runtime::utils::Backoff;
        if ok {
            self.backoff.reset();
            self.at = None;
        } else if let Some(d) = self.backoff.next() {
            self.at = Some(tokio::time::Instant::now() + d);
        }
    }

    /// No retry is scheduled, or it is due.
    pub(super) fn due(&self) -> bool {
        self.at.is_none_or(|at| at <= tokio::time::Instant::now())
    }

    /// Resolves when a scheduled retry is due; never when none is.
    pub(super) async fn wait(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// Logs every note once while its cause lasts and writes its Warning Event until that
/// succeeds (every node that sees the cause may write it: the Event's deterministic name,
/// [`crate::kube::events::event_name`], makes the API server keep one). Events that failed
/// before are written again only with `retry_failed` (the back-off is over). Returns
/// `false` when an Event write failed or is still due (the caller retries after a
/// back-off).
pub(super) async fn report<W: StatusWriter>(
    writer: &W,
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
            reason: crate::services::plan::reasons::REASON_ADDRESS_CONFLICT,
            message: format!(
                "not announced: {} port {}/{} is already used by {}",
                c.address, c.port.port, c.port.protocol, c.with
            ),
            warn: true,
        });
    }
    for c in &plan.dhcp_conflicts {
        all.push(Note {
            key: c.service.clone(),
            uid: uid_of(services, &c.service),
            reason: crate::services::plan::reasons::REASON_INVALID_CONFIG,
            message: format!(
                "not announced: {} is already used by DHCP Service {}; give each DHCP Service its own (remove a copied kube-vip.io/hwaddr or kube-vip.io/macvlanName: vipd then derives them from the Service UID)",
                c.what, c.with
            ),
            warn: true,
        });
    }
    for l in &plan.lapsed {
        let list: Vec<String> = l.addresses.iter().map(ToString::to_string).collect();
        all.push(Note {
            key: l.service.clone(),
            uid: uid_of(services, &l.service),
            reason: crate::services::plan::reasons::REASON_DHCP_LEASE_LAPSED,
            message: format!(
                "not announced: {} came from a DHCP Service's lease ({}), and no DHCP Service asks for it now (the DHCP Service deleted, or its lease lost and replaced by another address: NAKed, declined or expired): the DHCP server may lease it to another host. Point this Service at its DHCP Service's current address, or remove the annotation {} to announce it as a static address",
                list.join(", "),
                model::ANN_DHCP_LEASE,
                model::ANN_DHCP_LEASE
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
        let done = match writer.event(&n.key, n.uid.as_deref(), &ev).await {
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

/// Services this node last reported as announcing (`kube-vip.io/vipHost` = this node;
/// without election, `ctx.every_node`: every endpointless Service with an ingress) that
/// are announced by nobody now (address removed or invalid, conflict, type change, or
/// `externalTrafficPolicy: Local` with no ready endpoint on any node: `endpointless`):
/// their status and annotation would mislead, so they are cleared, once per object version
/// (a failed clear is retried: returns `false`).
pub(super) async fn clear_stale<W: StatusWriter>(
    ctx: &StatusCtx<'_, W>,
    plan: &Plan,
    endpointless: &HashSet<ServiceKey>,
    services: &[Arc<Service>],
    cleared: &mut HashSet<String>,
) -> bool {
    let mut now_stale = HashSet::new();
    let mut ok = true;
    for svc in services {
        let key = ServiceKey::of(&**svc);
        let host = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(model::ANN_VIP_HOST));
        let ours = match ctx.every_node {
            // Without election no vipHost names who wrote the status: every node clears
            // an endpointless Service's ingress (the same write; one that finds it gone
            // changes nothing). Only those: a Service out of the plan may be another
            // controller's.
            true => endpointless.contains(&key) && has_ingress(svc),
            false => host.map(String::as_str) == Some(ctx.node),
        };
        if !ours || (plan.addresses.contains_key(&key) && !endpointless.contains(&key)) {
            continue;
        }
        let id = format!(
            "{key}/{}",
            svc.metadata.resource_version.clone().unwrap_or_default()
        );
        if !cleared.contains(&id) {
            match ctx.writer.clear(&key).await {
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

/// Whether `svc` has a `status.loadBalancer.ingress` entry.
fn has_ingress(svc: &Service) -> bool {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// Posts an `AddressInUse` Warning Event on every Service of the group that uses an address
/// in `new` (address, other host's MAC); `declined` are the DHCP leases among them, whose
/// clients send DHCPDECLINE and ask for another address instead of probing again.
pub(super) async fn report_conflicts<W: StatusWriter>(
    ctx: &StatusCtx<'_, W>,
    spec: &GroupSpec,
    new: &[(IpAddr, [u8; 6])],
    declined: &[IpAddr],
) {
    for (addr, mac) in new {
        let ev = if declined.contains(addr) {
            ServiceEvent::dhcp_address_in_use(*addr, &fmt_mac(*mac), ctx.node)
        } else {
            ServiceEvent::address_in_use(*addr, &fmt_mac(*mac), ctx.node)
        };
        for (key, addrs, _) in spec.services.iter().filter(|(_, a, _)| a.contains(addr)) {
            let uid = ctx.cached(key).and_then(|s| s.metadata.uid.clone());
            if let Err(e) = ctx.writer.event(key, uid.as_deref(), &ev).await {
                warn!(service = %key, error = %e, "cannot record the address conflict event");
            }
            debug!(service = %key, addresses = ?addrs, "address conflict reported");
        }
    }
}

/// Posts a Normal `HandedOver` Event on each Service of `spec`: this node hands its
/// addresses over because `why`.
pub(super) async fn report_handover<W: StatusWriter>(
    ctx: &StatusCtx<'_, W>,
    spec: &GroupSpec,
    why: &str,
) {
    report_each(ctx, spec, |addrs| {
        ServiceEvent::handed_over(ctx.node, addrs, why)
    })
    .await;
}

/// Posts the Event `make(addresses)` on each of the group's Services (a failure is logged).
pub(super) async fn report_each<W: StatusWriter>(
    ctx: &StatusCtx<'_, W>,
    spec: &GroupSpec,
    make: impl Fn(&[IpAddr]) -> ServiceEvent,
) {
    for (key, addrs, _) in &spec.services {
        let ev = make(addrs);
        let uid = ctx.cached(key).and_then(|s| s.metadata.uid.clone());
        if let Err(e) = ctx.writer.event(key, uid.as_deref(), &ev).await {
            warn!(service = %key, error = %e, "cannot record the hand-over event");
        }
    }
}

/// The status side of a group while this node leads it: what is still to be written.
#[derive(Default)]
pub(super) struct StatusSync {
    /// Services whose announcement Event was queued this term, with the addresses it
    /// named: one Event when the Service comes to this node, another only when the
    /// addresses it holds here change (a DHCP lease replaced after a NAK, an edited
    /// `loadBalancerIP`).
    pub(super) announced: HashMap<ServiceKey, Vec<IpAddr>>,
    /// Announcement Events not written yet: (Service uid, Event).
    pub(super) pending: BTreeMap<ServiceKey, (Option<String>, ServiceEvent)>,
    /// Back-off after a failed status, vipHost or clear write; while it runs, cache passes
    /// leave the writing to it ([`crate::services::plan::decide::status_step`]).
    pub(super) retry: Retry,
    /// Back-off after a failed Event post, apart from [`Self::retry`]: Events that keep
    /// failing (an RBAC without `events`, as kube-vip's chart had) do not hold back the
    /// status, so a hand edit is restored at the next cache pass.
    pub(super) event_retry: Retry,
}

/// Logs the announcement notes of one sync, one line each while few
/// ([`crate::obs::logging::each_or_summary`]: a shard's holder announces hundreds at once).
fn log_notes(node: &str, notes: &[(&ServiceKey, String)]) {
    crate::obs::logging::each_or_summary(
        notes,
        |(key, note), at_info| match at_info {
            true => info!(service = %key, "{note}"),
            false => debug!(service = %key, "{note}"),
        },
        |count| {
            let first: Vec<String> = notes.iter().take(3).map(|(k, _)| k.to_string()).collect();
            info!(count, first = ?first, "{count} Services announced by node {node} (each at debug level)");
        },
    );
}

/// What the holder should write for one Service, judged from the cache: the ingress and
/// vipHost differ, and the Event to queue when this node does not announce it yet.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusDiff {
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
/// desired `ingress` with this node `node` as holder; `compare_ports`: whether the ingress
/// comparison includes `ports` ([`StatusWriter::compares_ports`]). Pure.
pub(crate) fn status_diff(
    cached: Option<&Service>,
    node: &str,
    addrs: &[IpAddr],
    ingress: &[k8s_openapi::api::core::v1::LoadBalancerIngress],
    compare_ports: bool,
) -> StatusDiff {
    let host = cached.and_then(super::publish::vip_host_of);
    StatusDiff {
        ingress: cached
            .is_none_or(|svc| super::publish::ingress_differs_with(svc, ingress, compare_ports)),
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
    /// vipHost) plus the pending announcement Events. Pending Events are posted when
    /// `retrying` or when their own back-off is not running. A failed write schedules
    /// [`Self::retry`], a failed Event [`Self::event_retry`] (back-off); success clears
    /// each.
    /// `bound`: the addresses the VIP holder holds now; `refused`: those it refuses because
    /// another host claims them. A Service is reported only with its bound addresses; with
    /// none bound, nothing is written while they are being probed, and a status this node
    /// wrote earlier is cleared once every one of them is refused.
    ///
    /// Without election (`ctx.every_node`) several nodes hold a Service at once and each
    /// group holds one address: a Service one of whose addresses this group holds gets the
    /// ingress of all its addresses (the same on every node, so the nodes agree and write
    /// it once), no `kube-vip.io/vipHost` (it would flip between the nodes; kube-vip
    /// writes it with ARP only, `pkg/services/services.go` `updateStatus`) and no
    /// announcement Event (every node would post one).
    pub(super) async fn sync<W: StatusWriter>(
        &mut self,
        ctx: &StatusCtx<'_, W>,
        spec: &GroupSpec,
        bound: &[IpAddr],
        refused: &[IpAddr],
        retrying: bool,
    ) {
        let keys: HashSet<&ServiceKey> = spec.services.iter().map(|(k, _, _)| k).collect();
        self.pending.retain(|k, _| keys.contains(k));
        self.announced.retain(|k, _| keys.contains(k));
        let mut writes: Vec<Write> = Vec::new();
        let mut notes: Vec<(&ServiceKey, String)> = Vec::new();
        for (key, all, ports) in &spec.services {
            let cached = ctx.cached(key);
            let all_refused = (!all.is_empty() && all.iter().all(|a| refused.contains(a)))
                || spec.dhcp_unserved.contains(key);
            let mut addrs: Vec<IpAddr> =
                all.iter().filter(|a| bound.contains(a)).copied().collect();
            if ctx.every_node && !addrs.is_empty() {
                addrs.clone_from(all);
            }
            if addrs.is_empty() {
                // Not held here (yet): claim nothing. Once every address is refused, take
                // back a claim of ours; while they are only being probed, leave it (a
                // restarted holder re-probing its own address must not flap the status).
                // The announced addresses are kept: bound again, a different address is
                // announced as such.
                self.pending.remove(key);
                let ours = cached
                    .as_deref()
                    .and_then(super::publish::vip_host_of)
                    .is_some_and(|h| h == ctx.node);
                if all_refused && ours {
                    writes.push(Write::Clear(key.clone()));
                }
                continue;
            }
            let addrs = addrs.as_slice();
            let ingress = desired_ingress(addrs, ports);
            let mut diff = status_diff(
                cached.as_deref(),
                ctx.node,
                addrs,
                &ingress,
                ctx.writer.compares_ports(),
            );
            if ctx.every_node {
                diff.vip_host = false;
                diff.announce = None;
                self.announced.insert(key.clone(), addrs.to_vec());
            }
            let event = match (diff.announce, self.announced.get(key)) {
                (Some(ev), None) => Some(ev),
                (_, Some(before)) if before.as_slice() != addrs => {
                    let rv = cached
                        .as_ref()
                        .and_then(|s| s.metadata.resource_version.clone())
                        .unwrap_or_default();
                    Some(ServiceEvent::readdressed(ctx.node, addrs, before).with_change(rv))
                }
                _ => None,
            };
            self.announced.insert(key.clone(), addrs.to_vec());
            if let Some(ev) = event {
                notes.push((key, ev.note.clone()));
                let uid = cached.as_ref().and_then(|s| s.metadata.uid.clone());
                self.pending.insert(key.clone(), (uid, ev));
            }
            if diff.ingress || diff.vip_host {
                writes.push(Write::Set {
                    key: key.clone(),
                    ingress: diff.ingress.then_some(ingress),
                    vip_host: diff.vip_host,
                });
            }
        }
        log_notes(ctx.node, &notes);
        // Concurrently, at most STATUS_WRITES_IN_FLIGHT at a time: a group governing
        // hundreds of Services (a shard lease) wrote them one after another, and its next
        // change of VIPs waited for the last write.
        let done = at_most(STATUS_WRITES_IN_FLIGHT, writes, |w| w.apply(ctx)).await;
        let mut ok = true;
        for (w, done_ok) in done {
            ok &= done_ok;
            if let (Write::Clear(key), true) = (&w, done_ok) {
                self.announced.remove(key);
            }
        }
        self.retry.after(ok);
        if self.pending.is_empty() {
            self.event_retry.after(true);
        } else if retrying || self.event_retry.due() {
            let posted = self.post_pending(ctx).await;
            self.event_retry.after(posted);
        }
    }

    /// A retry is scheduled (writes or Events).
    fn retry_at(&self) -> Option<tokio::time::Instant> {
        match (self.retry.at, self.event_retry.at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Posts the pending announcement Events (those posted leave the list); `false` when
    /// one failed.
    async fn post_pending<W: StatusWriter>(&mut self, ctx: &StatusCtx<'_, W>) -> bool {
        let posts: Vec<_> = self
            .pending
            .iter()
            .map(|(key, (uid, ev))| (key.clone(), uid.clone(), ev.clone()))
            .collect();
        let results = at_most(STATUS_WRITES_IN_FLIGHT, posts, |(key, uid, ev)| {
            post_event(ctx, key, uid, ev)
        })
        .await;
        let mut ok = true;
        for (key, posted) in results {
            if posted {
                self.pending.remove(&key);
            } else {
                ok = false;
            }
        }
        ok
    }
}

/// What a group's status task reads when it writes: the latest of each, not one per event.
pub(super) struct StatusInputs {
    /// The group's effective spec (with the DHCP Services' leased addresses).
    pub(super) spec: watch::Receiver<Arc<GroupSpec>>,
    /// The addresses the VIP holder has bound.
    pub(super) bound: watch::Receiver<Vec<IpAddr>>,
    /// The addresses it refuses because another host (this MAC) claims them.
    pub(super) conflicts: watch::Receiver<Vec<(IpAddr, [u8; 6])>>,
    /// The group's election state: a sync still writing when it stops leading is dropped
    /// (the next holder writes its own status).
    pub(super) leader: watch::Receiver<LeaderState>,
}

/// The status side of one group, in its own task: the group's loop sends what it saw
/// (`events`) and goes on pushing VIP changes to its holder while the writes here wait for
/// the writer's slots ([`super::publish::STATUS_CALLS_IN_FLIGHT`] per process: at a cold
/// start a shard's holder has hundreds queued). Every event queued meanwhile is taken at
/// once ([`decide::status_batch`]), so a burst of cache passes is one sync with the
/// latest `inputs`; retries fall due here. A sync still writing when the election state
/// stops leading is dropped. Returns when `stop` is cancelled (a write in flight is
/// dropped) or the group drops its sender.
pub(super) async fn follow<W: StatusWriter>(
    ctx: &StatusCtx<'_, W>,
    mut events: mpsc::UnboundedReceiver<decide::GroupEvent>,
    mut inputs: StatusInputs,
    stop: &CancellationToken,
) {
    let mut sync = StatusSync::default();
    let mut leading = false;
    // A sync skipped or dropped because the elector stopped leading before the group's
    // loop said so: made up for if the elector leads again without the loop ever seeing
    // the loss (a watch keeps only the latest state), forgotten at the end of the term.
    let mut owed = false;
    let mut elector_alive = true;
    loop {
        // A retry falls due only while the elector leads: while it does not, a due retry
        // would start a sync that is dropped at once, again and again.
        let leads = elector_leads(&inputs.leader);
        let scheduled = sync.retry_at();
        let retry_at = scheduled.filter(|_| leads);
        // The elector's changes (every renewal) wake this task only when they matter: a
        // sync is owed, or a retry waits for the elector to lead again.
        let watch_elector = elector_alive && (owed || (!leads && scheduled.is_some()));
        let first = if owed && leads {
            decide::GroupEvent::RetryDue
        } else {
            tokio::select! {
                _ = stop.cancelled() => return,
                e = events.recv() => match e {
                    Some(e) => e,
                    None => return,
                },
                _ = until(retry_at) => decide::GroupEvent::RetryDue,
                r = inputs.leader.changed(), if watch_elector => {
                    elector_alive = r.is_ok();
                    continue;
                }
            }
        };
        let mut batch = vec![first];
        while let Ok(e) = events.try_recv() {
            batch.push(e);
        }
        let step = decide::status_batch(leading, sync.retry.at.is_some(), &batch);
        leading = step.leading;
        if step.reset {
            sync = StatusSync::default();
            owed = false;
        }
        if step.drop_retry {
            sync.retry.at = None;
            sync.event_retry.at = None;
        }
        let Some(retrying) = step.sync else {
            continue;
        };
        // The group's loop may not have handed over the loss of the lease yet: the elector
        // decides (a node that does not lead writes nothing).
        if !elector_leads(&inputs.leader) {
            owed = true;
            continue;
        }
        owed = false;
        let spec = inputs.spec.borrow().clone();
        let held = inputs.bound.borrow().clone();
        let refused: Vec<IpAddr> = inputs.conflicts.borrow().iter().map(|(a, _)| *a).collect();
        tokio::select! {
            // In this order: a sync is never polled (and never writes) once the lease is
            // lost.
            biased;
            _ = stop.cancelled() => return,
            _ = not_leading(&mut inputs.leader) => {
                owed = true;
                debug!("stopped leading while writing the status; the rest is dropped");
            }
            _ = sync.sync(ctx, &spec, &held, &refused, retrying) => {}
        }
    }
}

/// The elector leads now.
fn elector_leads(leader: &watch::Receiver<LeaderState>) -> bool {
    matches!(*leader.borrow(), LeaderState::Leading { .. })
}

/// Resolves once `leader` is not [`LeaderState::Leading`] (at once if it is not now);
/// never when the elector is gone.
async fn not_leading(leader: &mut watch::Receiver<LeaderState>) {
    let lost = leader
        .wait_for(|s| !matches!(s, LeaderState::Leading { .. }))
        .await
        .is_ok();
    if !lost {
        std::future::pending::<()>().await;
    }
}

/// Resolves at `at`; never when `None` (the services wing's timers: status retries, DHCP
/// parent look-ups, security re-checks).
pub(super) async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Status writes (and Events) one group has in flight at most; the writer itself keeps at
/// most [`super::publish::STATUS_CALLS_IN_FLIGHT`] in flight for the whole process, so
/// groups beyond that wait for a slot.
const STATUS_WRITES_IN_FLIGHT: usize = 8;

/// One write of [`StatusSync::sync`] for one Service.
enum Write {
    /// Clear its status and vipHost (every address refused; the status names this node).
    Clear(ServiceKey),
    /// Write its ingress (when `Some`) and its vipHost (when `vip_host`).
    Set {
        key: ServiceKey,
        ingress: Option<Vec<k8s_openapi::api::core::v1::LoadBalancerIngress>>,
        vip_host: bool,
    },
}

/// Posts `ev` about `key`; the key and whether it was posted.
async fn post_event<W: StatusWriter>(
    ctx: &StatusCtx<'_, W>,
    key: ServiceKey,
    uid: Option<String>,
    ev: ServiceEvent,
) -> (ServiceKey, bool) {
    match ctx.writer.event(&key, uid.as_deref(), &ev).await {
        Ok(()) => (key, true),
        Err(e) => {
            debug!(service = %key, error = %e, "cannot record event; retrying");
            (key, false)
        }
    }
}

impl Write {
    /// Makes the write, logging a failure; the write and `false` when it failed (retried
    /// with back-off).
    async fn apply<W: StatusWriter>(self, ctx: &StatusCtx<'_, W>) -> (Self, bool) {
        let ok = self.write(ctx).await;
        (self, ok)
    }

    async fn write<W: StatusWriter>(&self, ctx: &StatusCtx<'_, W>) -> bool {
        match self {
            Write::Clear(key) => match ctx.writer.clear(key).await {
                Ok(_) => {
                    info!(service = %key, "address not held (refused, given up, or its DHCP lease lost and not re-acquired): status and vipHost cleared");
                    true
                }
                Err(e) => {
                    warn!(service = %key, error = %e, "clearing status failed; retrying with back-off");
                    false
                }
            },
            Write::Set {
                key,
                ingress,
                vip_host,
            } => {
                let mut ok = true;
                if let Some(ingress) = ingress {
                    match ctx.writer.set_ingress(key, ingress.clone()).await {
                        Ok(out) => debug!(service = %key, ?out, "status.loadBalancer.ingress"),
                        Err(e) => {
                            warn!(service = %key, error = %e, "writing status failed; retrying with back-off");
                            ok = false;
                        }
                    }
                }
                if *vip_host && let Err(e) = ctx.writer.set_vip_host(key, ctx.node).await {
                    warn!(service = %key, error = %e, "writing vipHost annotation failed; retrying with back-off");
                    ok = false;
                }
                ok
            }
        }
    }
}

#[cfg(test)]
mod tests;
