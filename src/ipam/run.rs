//! The allocator's pass ([`Allocator::pass`]): reads the caches, asks the pure
//! [`super::decide::plan`] what to do, probes the addresses it is about to hand out, and
//! makes the conditional writes, while this node holds the allocator's Lease.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::kube::calls::at_most;
use k8s_openapi::api::core::v1::Service;
use tokio::time::Instant;
use tracing::{info, warn};

use super::decide::{Decision, RequestWarning, plan, requested_warnings};
use super::inuse::{InUse, ServiceView, User, usage};
use super::metrics::{PoolFigures, PoolMetrics};
use super::pool::PoolBook;
use super::probe::AddressProbe;
use super::reasons::*;
use super::settings::Settings;
use super::view::view_of;
use super::write::{Change, ServiceApi, WriteOutcome};
use crate::kube::ObjectKey;
use crate::kube::client::SERVICES_OTHER_MAX_IN_FLIGHT;
use crate::kube::events::{Event, EventKind};
use crate::kube::service::FINALIZER_LB_CLEANUP;
use crate::net::conflict::fmt_mac;

/// How long an address another host answered for is left out before it is probed again.
pub const REFUSED_FOR: Duration = Duration::from_secs(60);
/// How long an address just written counts as used while the Services cache has not shown
/// it yet (a write the cache never shows, e.g. a Service deleted meanwhile, stops counting).
const PENDING_FOR: Duration = Duration::from_secs(30);
/// First retry delay after a failed write; doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest retry delay after failed writes.
const RETRY_MAX: Duration = Duration::from_secs(30);
/// How many of a pass's writes, and of its Events, are in flight at once: as many as the
/// Services client lets wait for their response (more would only queue in the client).
const WRITES_IN_FLIGHT: usize = SERVICES_OTHER_MAX_IN_FLIGHT;
/// How many times one pass decides again after its probes refused addresses.
const PROBE_ROUNDS: usize = 4;

/// What one pass reads: the caches' content.
pub struct PassInput<'a> {
    /// Every Service (of `svc_namespace`, or all).
    pub services: &'a [Arc<Service>],
    /// Every Node's own addresses: `(node, address)`.
    pub nodes: &'a [(String, IpAddr)],
    /// The pool ConfigMap's `data`; `None`: no such ConfigMap.
    pub pools: Option<&'a BTreeMap<String, String>>,
}

/// The allocator's memory between passes (one term of the Lease).
pub struct Allocator<A: ServiceApi, P: AddressProbe> {
    settings: Arc<Settings>,
    api: A,
    probe: P,
    metrics: Option<Arc<PoolMetrics>>,
    /// Written, not yet seen in the cache: Service -> (its addresses, written at).
    pending: BTreeMap<ObjectKey, (Vec<IpAddr>, Instant)>,
    /// Answered by another host: address -> until.
    refused: BTreeMap<IpAddr, Instant>,
    /// The addresses Services showed at the last pass.
    shown: BTreeSet<IpAddr>,
    /// Addresses Services stopped showing, held back until then ([`Self::hold_released`]).
    released: BTreeMap<IpAddr, Instant>,
    /// Events posted this term: (uid, reason, message), so each is posted once.
    posted: HashSet<(String, &'static str, String)>,
    /// Consecutive passes with a failed write (the retry back-off).
    failures: u32,
    /// Events queued by this pass: (Service, its uid, the Event).
    outbox: Vec<(ObjectKey, String, Event)>,
}

/// One write a pass makes, and what it means once written.
struct Write<'a> {
    svc: &'a Service,
    view: &'a ServiceView,
    change: Change,
    then: Then,
    /// The Normal Event posted right after the write, by the same call (so a holder killed
    /// midway loses at most the Events of the writes in flight): reason and message; `None`
    /// when none is due or it was posted this term already.
    told: Option<(&'static str, String)>,
}

/// What a [`Write`] does, for its log line and Event.
enum Then {
    Allocated {
        addrs: Vec<IpAddr>,
        pool: String,
        shared: bool,
    },
    Released {
        addrs: Vec<IpAddr>,
    },
    FinalizerRemoved,
}

/// What became of one [`Write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Written,
    /// The Service changed since the decision, is gone, or the fence refused the write.
    Stale,
    /// The request failed (retried with back-off).
    Failed,
}

/// What a pass asks of the loop around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassEnd {
    /// Run again after this long even if nothing changes (a failed or stale write, a
    /// pending or refused address to expire); `None`: only on a change.
    pub again_in: Option<Duration>,
}

impl<A: ServiceApi, P: AddressProbe> Allocator<A, P> {
    /// An allocator with nothing done yet.
    pub fn new(
        settings: Arc<Settings>,
        api: A,
        probe: P,
        metrics: Option<Arc<PoolMetrics>>,
    ) -> Self {
        Allocator {
            settings,
            api,
            probe,
            metrics,
            pending: BTreeMap::new(),
            refused: BTreeMap::new(),
            shown: BTreeSet::new(),
            released: BTreeMap::new(),
            posted: HashSet::new(),
            failures: 0,
            outbox: Vec::new(),
        }
    }

    /// Clears the pool metrics (this node no longer allocates).
    pub fn stand_down(&mut self) {
        if let Some(m) = &self.metrics {
            m.set(&[]);
        }
        self.posted.clear();
        self.pending.clear();
        self.shown.clear();
        self.released.clear();
    }

    /// One pass over `input`; `may_write()` is checked right before every write (the
    /// Lease's fence: false once this node may no longer be the holder).
    pub async fn pass(
        &mut self,
        input: &PassInput<'_>,
        may_write: &(dyn Fn() -> bool + Sync),
    ) -> PassEnd {
        let now = Instant::now();
        let empty = BTreeMap::new();
        let book = PoolBook::from_data(input.pools.unwrap_or(&empty));
        let views: Vec<ServiceView> = input
            .services
            .iter()
            .map(|s| view_of(s, self.settings.lb_class_only, &self.settings.lb_class_name))
            .collect();
        self.forget_seen(&views, now);
        self.hold_released(&views, now);
        let in_use = self.in_use(&views, input.nodes, &book);
        // A Service whose allocation is written but not yet in the cache is left alone.
        // Without pending writes (the usual case) every view is planned: no copy of them.
        let waiting: BTreeSet<&ObjectKey> = self.pending.keys().collect();
        let to_plan: std::borrow::Cow<'_, [ServiceView]> = if waiting.is_empty() {
            std::borrow::Cow::Borrowed(&views)
        } else {
            views
                .iter()
                .filter(|v| !waiting.contains(&v.key))
                .cloned()
                .collect::<Vec<_>>()
                .into()
        };
        let mut again: Option<Duration> = None;
        let mut decisions = Vec::new();
        for _ in 0..PROBE_ROUNDS {
            let refused = |a: IpAddr| {
                self.refused.get(&a).is_some_and(|until| *until > now)
                    || self.released.contains_key(&a)
            };
            decisions = plan(&to_plan, &book, &in_use, &refused);
            let candidates: Vec<IpAddr> = decisions
                .iter()
                .filter_map(|(_, d)| match d {
                    Decision::Allocate { addrs, .. } => Some(addrs.clone()),
                    _ => None,
                })
                .flatten()
                .filter(|a| !a.is_unspecified() && !in_use.is_used(*a))
                .collect();
            if candidates.is_empty() {
                break;
            }
            let answered = self.probe.answered(candidates).await;
            if answered.is_empty() {
                break;
            }
            for (addr, mac) in answered {
                self.refuse(&views, &decisions, addr, mac, now);
            }
            again = Some(REFUSED_FOR);
        }
        let by_key: BTreeMap<&ObjectKey, &Arc<Service>> = input
            .services
            .iter()
            .zip(&views)
            .map(|(s, v)| (&v.key, s))
            .collect();
        let views_by_key: BTreeMap<&ObjectKey, &ServiceView> =
            views.iter().map(|v| (&v.key, v)).collect();
        let mut writes = Vec::new();
        for (key, decision) in &decisions {
            let (Some(svc), Some(view)) = (by_key.get(key), views_by_key.get(key)) else {
                continue;
            };
            writes.extend(self.write_for(svc, view, decision, &book, input.pools.is_some()));
        }
        writes.extend(finalizer_writes(input.services, &views));
        for (write, outcome) in self.write_all(writes, may_write).await {
            if let Some(d) = self.written(&write, outcome) {
                soonest(&mut again, d);
            }
        }
        self.warn_requests(&views, &book, &in_use);
        self.post_queued().await;
        self.export(&book, &in_use);
        if !self.pending.is_empty() {
            soonest(&mut again, PENDING_FOR);
        }
        if let Some(until) = self.released.values().min() {
            soonest(&mut again, until.duration_since(now));
        }
        let uids: BTreeSet<&str> = views.iter().map(|v| v.uid.as_str()).collect();
        self.posted
            .retain(|(uid, _, _)| uids.contains(uid.as_str()));
        self.refused.retain(|_, until| *until > now);
        PassEnd { again_in: again }
    }

    /// Drops pending writes the cache now shows (the annotation is there) or that are too
    /// old (a write the cache never shows, e.g. the Service was deleted meanwhile).
    fn forget_seen(&mut self, views: &[ServiceView], now: Instant) {
        let annotated: BTreeSet<&ObjectKey> = views
            .iter()
            .filter(|v| !v.needs_address())
            .map(|v| &v.key)
            .collect();
        let present: BTreeSet<&ObjectKey> = views.iter().map(|v| &v.key).collect();
        self.pending.retain(|key, (_, at)| {
            present.contains(key)
                && !annotated.contains(key)
                && now.duration_since(*at) < PENDING_FOR
        });
    }

    /// Holds back, for the Services lease duration, every address a Service showed at the
    /// last pass and shows no more (deleted, edited, released): the VIP holder of that
    /// Service answers for it until it sees the change (a holder cut off from the API, until
    /// its lease's renew deadline), and the probe would take its answer for another host's:
    /// refused for [`REFUSED_FOR`] with a Warning naming a node's MAC (seen in the lab on a
    /// Service deleted while another waited for its address).
    fn hold_released(&mut self, views: &[ServiceView], now: Instant) {
        let shown: BTreeSet<IpAddr> = views.iter().flat_map(ServiceView::shown).collect();
        let until = now + self.settings.timing.lease_duration;
        for gone in self.shown.difference(&shown) {
            self.released.insert(*gone, until);
        }
        self.released
            .retain(|a, until| *until > now && !shown.contains(a));
        self.shown = shown;
    }

    /// Every address in use, with the addresses written but not yet seen.
    fn in_use(&self, views: &[ServiceView], nodes: &[(String, IpAddr)], book: &PoolBook) -> InUse {
        let mut in_use = InUse::build(views, nodes, &self.settings.control_plane, |ns| {
            book.allow_share(ns)
        });
        for (key, (addrs, _)) in &self.pending {
            for addr in addrs {
                in_use.add(
                    *addr,
                    User::Service {
                        key: key.clone(),
                        ports: Vec::new(),
                        share_ok: false,
                    },
                );
            }
        }
        in_use
    }

    /// Leaves `addr` out for [`REFUSED_FOR`] and tells the Service it was meant for.
    fn refuse(
        &mut self,
        views: &[ServiceView],
        decisions: &[(ObjectKey, Decision)],
        addr: IpAddr,
        mac: [u8; 6],
        now: Instant,
    ) {
        self.refused.insert(addr, now + REFUSED_FOR);
        let Some((key, pool)) = decisions.iter().find_map(|(k, d)| match d {
            Decision::Allocate { addrs, pool, .. } if addrs.contains(&addr) => Some((k, pool)),
            _ => None,
        }) else {
            return;
        };
        let message = format!(
            "{addr} of pool {pool} is answered by another host ({}) on the segment: not handed out; probed again in {} s",
            fmt_mac(mac),
            REFUSED_FOR.as_secs()
        );
        warn!(service = %key, %addr, mac = %fmt_mac(mac), "pool address answered by another host: not handed out");
        if let Some(v) = views.iter().find(|v| &v.key == key) {
            self.queue(v, EventKind::Warning, REASON_IN_USE, message);
        }
    }

    /// The write `decision` needs, if any; queues the Event of a decision that gives no
    /// address (`cm_exists`: the pool ConfigMap exists, see [`why_no_address`]).
    fn write_for<'a>(
        &mut self,
        svc: &'a Service,
        view: &'a ServiceView,
        decision: &Decision,
        book: &PoolBook,
        cm_exists: bool,
    ) -> Option<Write<'a>> {
        let (change, then) = match decision {
            Decision::Keep => return None,
            Decision::Allocate {
                addrs,
                pool,
                shared,
                interface,
            } => (
                Change::Allocate {
                    addrs: addrs.clone(),
                    interface: interface.clone(),
                },
                Then::Allocated {
                    addrs: addrs.clone(),
                    pool: pool.clone(),
                    shared: *shared,
                },
            ),
            Decision::Release { addrs } => (
                Change::Release {
                    finalizers: without_cleanup_finalizer(svc),
                },
                Then::Released {
                    addrs: addrs.clone(),
                },
            ),
            Decision::NoPool
            | Decision::PoolInvalid(_)
            | Decision::Exhausted { .. }
            | Decision::FamilyMissing { .. } => {
                let cm = &self.settings.config_map;
                if let Some((kind, reason, message)) =
                    why_no_address(decision, book, cm, cm_exists, &view.key.namespace)
                {
                    self.queue(view, kind, reason, message);
                }
                return None;
            }
        };
        let told = match &then {
            Then::Allocated {
                addrs,
                pool,
                shared,
            } => {
                let share = if *shared {
                    " (shared, allow-share)"
                } else {
                    ""
                };
                let cm = &self.settings.config_map;
                let message = format!(
                    "allocated {} from pool {pool} of ConfigMap {cm}{share}",
                    join(addrs)
                );
                Some((REASON_ALLOCATED, message))
            }
            Then::Released { addrs } => Some((
                REASON_RELEASED,
                format!(
                    "released {}: no longer a LoadBalancer Service vipd serves; back in the pool",
                    join(addrs)
                ),
            )),
            Then::FinalizerRemoved => None,
        }
        .filter(|(reason, message)| {
            !self
                .posted
                .contains(&(view.uid.clone(), *reason, message.clone()))
        });
        Some(Write {
            svc,
            view,
            change,
            then,
            told,
        })
    }

    /// Makes `writes`, up to [`WRITES_IN_FLIGHT`] at once; `may_write()` is checked right
    /// before each. Counts the pass's failures for [`Self::retry_delay`]: one more after a
    /// pass with a failed write, none after a pass whose writes all went through.
    async fn write_all<'a>(
        &mut self,
        writes: Vec<Write<'a>>,
        may_write: &(dyn Fn() -> bool + Sync),
    ) -> Vec<(Write<'a>, Outcome)> {
        let api = &self.api;
        let done = at_most(WRITES_IN_FLIGHT, writes, |w| write_one(api, w, may_write)).await;
        if done.iter().any(|(_, o)| *o == Outcome::Failed) {
            self.failures = self.failures.saturating_add(1);
        } else if done.iter().any(|(_, o)| *o == Outcome::Written) {
            self.failures = 0;
        }
        done
    }

    /// Records what `write` achieved: the pending allocation, the log line and the Event.
    /// `Some(delay)`: decide again after it (the Service changed since the decision, or the
    /// fence refused the write); a failed write waits for [`Self::retry_delay`].
    fn written(&mut self, write: &Write<'_>, outcome: Outcome) -> Option<Duration> {
        match outcome {
            Outcome::Stale => return Some(RETRY_MIN),
            Outcome::Failed => return None,
            Outcome::Written => {}
        }
        let view = write.view;
        match &write.then {
            Then::Allocated { addrs, pool, .. } => {
                self.pending
                    .insert(view.key.clone(), (addrs.clone(), Instant::now()));
                info!(service = %view.key, addresses = %join(addrs), %pool, "address allocated");
            }
            Then::Released { addrs } => {
                info!(service = %view.key, addresses = %join(addrs), "address released");
            }
            Then::FinalizerRemoved => {
                info!(service = %view.key, finalizer = FINALIZER_LB_CLEANUP, "finalizer removed: the Service can be deleted");
            }
        }
        if let Some((reason, message)) = &write.told {
            self.posted
                .insert((view.uid.clone(), reason, message.clone()));
        }
        None
    }

    /// The delay before the next attempt after failed writes.
    pub fn retry_delay(&self) -> Option<Duration> {
        (self.failures > 0).then(|| {
            let shift = self.failures.saturating_sub(1).min(8);
            (RETRY_MIN * 2u32.pow(shift)).min(RETRY_MAX)
        })
    }

    /// Warnings about requested addresses outside every pool or already used.
    fn warn_requests(&mut self, views: &[ServiceView], book: &PoolBook, in_use: &InUse) {
        if book.is_empty() {
            return;
        }
        for view in views
            .iter()
            .filter(|v| v.ours && !v.deleting && !v.needs_address())
        {
            for w in requested_warnings(view, book, in_use) {
                let cm = &self.settings.config_map;
                let (reason, message) = match w {
                    RequestWarning::NotInPool { addr } => (
                        REASON_NOT_IN_POOL,
                        format!(
                            "requested address {addr} is outside every pool of ConfigMap {cm} (announced as usual)"
                        ),
                    ),
                    RequestWarning::InUse { addr, by } => (
                        REASON_IN_USE,
                        format!("requested address {addr} is already used by {by}"),
                    ),
                };
                self.queue(view, EventKind::Warning, reason, message);
            }
        }
    }

    /// The pool figures.
    fn export(&self, book: &PoolBook, in_use: &InUse) {
        if let Some(m) = &self.metrics {
            let figures: Vec<PoolFigures> = usage(book, in_use)
                .into_iter()
                .map(|u| (u.pool, u.total, u.used))
                .collect();
            m.set(&figures);
        }
    }

    /// Queues an Event for [`Self::post_queued`], once per term for the same Service,
    /// reason and message.
    fn queue(
        &mut self,
        view: &ServiceView,
        kind: EventKind,
        reason: &'static str,
        message: String,
    ) {
        if !self
            .posted
            .insert((view.uid.clone(), reason, message.clone()))
        {
            return;
        }
        let event = Event {
            kind,
            reason: reason.to_string(),
            action: "Allocate".to_string(),
            note: message,
            change: String::new(),
        };
        self.outbox
            .push((view.key.clone(), view.uid.clone(), event));
    }

    /// Posts the queued Events, up to [`WRITES_IN_FLIGHT`] at once.
    async fn post_queued(&mut self) {
        let api = &self.api;
        let queued = std::mem::take(&mut self.outbox);
        at_most(WRITES_IN_FLIGHT, queued, |(key, uid, event)| {
            post_one(api, key, uid, event)
        })
        .await;
    }
}

/// The Event for a Service of `namespace` that gets no address, with `cm` the pool
/// ConfigMap (`cm_exists`: it exists): its type, reason and what to do. A Warning, except
/// for a Service without a pool because there is no ConfigMap at all: then maybe another
/// controller assigns addresses in this cluster (a cloud provider, such as Harvester's), and
/// a Normal Event says both ways. `None` for decisions that are not about a missing address.
fn why_no_address(
    decision: &Decision,
    book: &PoolBook,
    cm: &ObjectKey,
    cm_exists: bool,
    namespace: &str,
) -> Option<(EventKind, &'static str, String)> {
    if matches!(decision, Decision::NoPool) && !cm_exists {
        return Some((
            EventKind::Normal,
            REASON_NO_POOL,
            format!(
                "no address from vipd: ConfigMap {cm} does not exist. To allocate from a pool (kube-vip-cloud-provider's format), create it, e.g. kubectl create configmap -n {} {} --from-literal cidr-global=192.0.2.10/32, or set kube-vip.io/loadbalancerIPs on the Service; if another controller assigns addresses in this cluster (a cloud provider such as Harvester's), set svc_ipam=false on vipd",
                cm.namespace, cm.name,
            ),
        ));
    }
    let (reason, message) = match decision {
        Decision::NoPool => (
            REASON_NO_POOL,
            format!(
                "no address: no pool applies to namespace {namespace}; add one to ConfigMap {cm} (kube-vip-cloud-provider's format), e.g. kubectl create configmap -n {} {} --from-literal cidr-global=192.0.2.10/32, or set kube-vip.io/loadbalancerIPs on the Service",
                cm.namespace, cm.name,
            ),
        ),
        Decision::PoolInvalid(e) => (
            REASON_POOL_INVALID,
            format!(
                "no address: ConfigMap {cm} {e}; fix the key (value \"{}\")",
                e.value
            ),
        ),
        Decision::Exhausted { pool, family } => {
            let text = book
                .pools()
                .filter_map(Result::ok)
                .find(|p| p.key.to_string() == *pool)
                .map(|p| p.text.clone())
                .unwrap_or_default();
            (
                REASON_POOL_EXHAUSTED,
                format!(
                    "no address: every {family} address of pool {pool} ({text}) of ConfigMap {cm} is in use; allocated as soon as one is free"
                ),
            )
        }
        Decision::FamilyMissing { pool, family } => (
            REASON_NO_POOL,
            format!(
                "no address: pool {pool} of ConfigMap {cm} has no {family} address, which the Service's ipFamilies / ipFamilyPolicy ask for"
            ),
        ),
        Decision::Keep | Decision::Allocate { .. } | Decision::Release { .. } => return None,
    };
    Some((EventKind::Warning, reason, message))
}

/// Takes the load-balancer cleanup finalizer off labelled Services being deleted: the
/// service controller that put it there (kube-vip-cloud-provider's) is gone, since this
/// node holds its Lease.
fn finalizer_writes<'a>(services: &'a [Arc<Service>], views: &'a [ServiceView]) -> Vec<Write<'a>> {
    services
        .iter()
        .zip(views)
        .filter(|(_, view)| view.deleting && view.labelled)
        .filter_map(|(svc, view)| {
            Some(Write {
                svc,
                view,
                change: Change::Finalizers(without_cleanup_finalizer(svc)?),
                then: Then::FinalizerRemoved,
                told: None,
            })
        })
        .collect()
}

/// Makes `write` if `may_write()` still holds.
async fn write_one<'a, A: ServiceApi>(
    api: &A,
    write: Write<'a>,
    may_write: &(dyn Fn() -> bool + Sync),
) -> (Write<'a>, Outcome) {
    if !may_write() {
        return (write, Outcome::Stale);
    }
    let rv = write
        .svc
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    let outcome = match api.write(&write.view.key, rv, &write.change).await {
        Ok(WriteOutcome::Written) => {
            if let Some((reason, message)) = &write.told {
                let event = event(EventKind::Normal, reason, message.clone());
                api.event(&write.view.key, &write.view.uid, &event).await;
            }
            Outcome::Written
        }
        Ok(WriteOutcome::Stale) => Outcome::Stale,
        Err(e) => {
            warn!(service = %write.view.key, error = %e, "allocator write failed; retrying with back-off");
            Outcome::Failed
        }
    };
    (write, outcome)
}

/// Posts one queued Event.
async fn post_one<A: ServiceApi>(api: &A, key: ObjectKey, uid: String, event: Event) {
    api.event(&key, &uid, &event).await;
}

/// An Event of the allocator (action `Allocate`).
fn event(kind: EventKind, reason: &str, message: String) -> Event {
    Event {
        kind,
        reason: reason.to_string(),
        action: "Allocate".to_string(),
        note: message,
        change: String::new(),
    }
}

/// Makes `again` at most `d`.
fn soonest(again: &mut Option<Duration>, d: Duration) {
    *again = Some(again.map_or(d, |a| a.min(d)));
}

/// The finalizer list of `svc` without the load-balancer cleanup finalizer, when it has it.
fn without_cleanup_finalizer(svc: &Service) -> Option<Vec<String>> {
    let list = svc.metadata.finalizers.as_ref()?;
    list.iter().any(|f| f == FINALIZER_LB_CLEANUP).then(|| {
        list.iter()
            .filter(|f| *f != FINALIZER_LB_CLEANUP)
            .cloned()
            .collect()
    })
}

fn join(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
