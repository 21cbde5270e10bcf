//! Reflectors: a cache of one kind of object kept by a watch, with the client's back-off,
//! objects stripped before they are cached, and the watch's health reported to `/readyz`.
//! [`spawn_reflector`] feeds one consumer; [`spawn_shared`] one list+watch whose cache
//! ([`SharedCache`]) every consumer of the process reads, each woken on every change, or
//! on the changes of its [`View`] only (a reader of less than the cache keeps).
//! A change is an event that changes what the cache holds: an object that comes back equal
//! but for its resourceVersion once stripped wakes no one ([`wakes`]).

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// An API for `K` in `namespace` (`svc_namespace`, say), or in all namespaces.
pub fn scoped_api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// What a watched kind of object must be for a reflector: a kube resource of a static
/// type, cloneable, deserialised from the API server's answers, and sent between tasks.
/// Every such type is one (blanket implementation).
pub trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + PartialEq
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + PartialEq
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The events of a watch on `api` (field selector `fields`; `None`: every object), each
/// object stripped with `strip` before it is cached (at 1000 Services, managedFields alone
/// were 7 MB of a node's memory), the watch tracked in `activity` as `what` from now on.
/// The server ends each watch after [`crate::kube::client::SERVICES_WATCH_TIMEOUT_SECS`];
/// errors (401/403 included, S15) retry with [`crate::kube::client::WatchBackoff`] (0.8 s
/// doubling to 20 s, plus up to 25 %).
fn stripped_events<K>(
    what: &'static str,
    api: Api<K>,
    strip: fn(&mut K),
    fields: Option<String>,
    activity: &crate::obs::readiness::WatchActivity,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Watched,
{
    activity.register(
        what,
        Duration::from_secs(crate::kube::client::SERVICES_WATCH_TIMEOUT_SECS.into()),
    );
    let config = fields
        .map_or_else(watcher::Config::default, |f| {
            watcher::Config::default().fields(&f)
        })
        .timeout(crate::kube::client::SERVICES_WATCH_TIMEOUT_SECS);
    watcher(api, config)
        .modify(strip)
        .backoff(crate::kube::client::WatchBackoff::default())
}

/// Runs a reflector on `api` into `writer` until `stop`. `what` is the resource's plural
/// (`services`, ...): the name its watch is tracked under in `activity`, where every event
/// it delivers counts (the client's `WatchStartLayer` reports its restarts). `fields`: a
/// field selector (`metadata.name=kubevip`), or `None` for every object.
#[allow(clippy::too_many_arguments)] // each one is a separate part of the reflector
pub fn spawn_reflector<K>(
    what: &'static str,
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    changed: Arc<Notify>,
    stop: CancellationToken,
    activity: crate::obs::readiness::WatchActivity,
    strip: fn(&mut K),
    fields: Option<String>,
) where
    K: Watched,
{
    let events = stripped_events(what, api, strip, fields, &activity);
    reflect_from(what, events, writer, changed, stop, activity);
}

/// [`spawn_reflector`] on any stream of watch events (tests feed their own): the
/// reflector's task, which wakes `changed` after each event that [`wakes`] says changed
/// the cache, and logs the watch's failures as [`say`] tells.
fn reflect_from<K, S>(
    what: &'static str,
    events: S,
    writer: reflector::store::Writer<K>,
    changed: Arc<Notify>,
    stop: CancellationToken,
    activity: crate::obs::readiness::WatchActivity,
) where
    K: kube::Resource<DynamicType = ()> + Clone + PartialEq + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (events, woken) = judged(events, writer.as_reader(), Vec::new());
    tokio::spawn(async move {
        // Each watch error is logged with the resource and the server's message, which for
        // RBAC names the verb.
        let mut stream = reflector::reflector(writer, events).boxed();
        let mut failing = false;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => ev,
            };
            let Some(ev) = ev else { return };
            log_result(what, &mut failing, &ev, "");
            if ev.is_ok() {
                activity.touch(what);
                if woken.all.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    changed.notify_one();
                }
            }
        }
    });
}

/// The flags [`judged`] sets for the event just yielded: whether it changed the cache
/// ([`wakes`]) and each [`View`] ([`wakes_by`]).
struct Woken {
    all: std::sync::atomic::AtomicBool,
    views: Vec<std::sync::atomic::AtomicBool>,
}

/// `events` with each event judged by [`wakes`] (and [`wakes_by`] for each of `views`)
/// against `store` before the reflector applies it: a flag is set for an event that
/// changes what the cache's readers (of that view) see, and read (and cleared) by the
/// consumer after the reflector yielded that event (the stream is pulled one event at a
/// time, so the flags always belong to the event just yielded).
fn judged<K, S>(
    events: S,
    store: Store<K>,
    views: Vec<View<K>>,
) -> (
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    Arc<Woken>,
)
where
    K: kube::Resource<DynamicType = ()> + Clone + PartialEq + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let woken = Arc::new(Woken {
        all: AtomicBool::new(false),
        views: views.iter().map(|_| AtomicBool::new(false)).collect(),
    });
    let flags = woken.clone();
    let events = events.map(move |mut ev| {
        if let Ok(ev) = &mut ev {
            let all = wakes(&store, ev);
            flags.all.store(all, Relaxed);
            for (flag, view) in flags.views.iter().zip(&views) {
                flag.store(all && wakes_by(&store, ev, view.same), Relaxed);
            }
        }
        ev
    });
    (events, woken)
}

/// Whether `event`, about to be applied to `store`, changes what the store's readers read:
/// an `Apply` of an object equal to the cached one but for `metadata.resourceVersion` (after
/// stripping: a Node's heartbeat, a Service's annotation that a reader's strip drops) does
/// not, nor do `Init` and `InitApply` (a re-list fills a buffer; the store changes at its
/// `InitDone`, which does). Every other event does. Pure but for reading `store` (`event`
/// is left as it came: see [`wakes_by`]).
fn wakes<K>(store: &Store<K>, event: &mut watcher::Event<K>) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + PartialEq,
{
    wakes_by(store, event, PartialEq::eq)
}

/// [`wakes`] with `same` judging an `Apply` against the cached object (a [`View`]'s sense
/// of sameness: whether `event` changes what that view's reader reads). `same` sees the
/// new object with the cached one's `metadata.resourceVersion`, so it compares the two but
/// for their versions; the event's own version is put back before this returns (no copy
/// of either object: a deep copy per watch event before, on every node, and two per
/// Service event for the allocator's view).
fn wakes_by<K>(store: &Store<K>, event: &mut watcher::Event<K>, same: fn(&K, &K) -> bool) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + PartialEq,
{
    match event {
        watcher::Event::Apply(new) => store
            .get(&reflector::ObjectRef::from_obj(new))
            .is_none_or(|old| !with_version_of(old.as_ref(), new, |new| same(old.as_ref(), new))),
        watcher::Event::Init | watcher::Event::InitApply(_) => false,
        watcher::Event::Delete(_) | watcher::Event::InitDone => true,
    }
}

/// `f(new)` with `new`'s `metadata.resourceVersion` set to `old`'s for the call, and put
/// back after it.
fn with_version_of<K, T>(old: &K, new: &mut K, f: impl FnOnce(&K) -> T) -> T
where
    K: kube::Resource,
{
    let own = std::mem::replace(
        &mut new.meta_mut().resource_version,
        old.meta().resource_version.clone(),
    );
    let out = f(new);
    new.meta_mut().resource_version = own;
    out
}

/// One reflector's cache shared by every consumer of a process: the objects (a
/// [`Store`], stripped as [`spawn_shared`] was told) and a change count each consumer
/// follows on its own ([`SharedCache::changes`], [`SharedCache::wake`]), so that one
/// list+watch serves them all. Cheap to clone; every clone reads the same cache.
#[derive(Clone)]
pub struct SharedCache<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    changes: watch::Receiver<u64>,
    listed: watch::Receiver<bool>,
    /// The change count of each [`View`] the cache was started with, by name.
    views: Arc<Vec<(&'static str, watch::Receiver<u64>)>>,
}

/// A reader's narrower sense of a change, for a reader that reads less of each object than
/// the cache keeps (the allocator reads a Service's addresses, not its status writes'
/// `vipHost`): `same(old, new)` says the two are the same for that reader. The cache counts
/// the changes of each view apart ([`SharedCache::wake_on_view`]); a new or deleted object
/// and the end of a re-list change every view.
#[derive(Clone, Copy)]
pub struct View<K> {
    /// The view's name (what its reader asks for).
    pub name: &'static str,
    /// Whether `old` and `new` (both stripped as cached, and with the same
    /// `metadata.resourceVersion`: the cache sets `old`'s on `new` for the call) are the
    /// same for the reader. Called for every watch event that changes the cache: it should
    /// compare in place, without copying either object.
    pub same: fn(&K, &K) -> bool,
}

impl<K> SharedCache<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    /// The cache (a re-list replaces it as a whole at its end). Wait for its first list
    /// with [`SharedCache::ready`], not with [`Store::wait_until_ready`]: kube-runtime's
    /// wakes only the last task that waited, so of several readers all but one would wait
    /// forever.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Resolves once the first list is in the cache (`true`), or when the watch stopped
    /// before (`false`). Any number of tasks may wait at once.
    pub async fn ready(&self) -> bool {
        let mut listed = self.listed.clone();
        listed.wait_for(|l| *l).await.is_ok()
    }

    /// A receiver of the number of changes the watch delivered: it changes after each event
    /// that changed the cache ([`wakes`]; applied to the cache first), and closes when the
    /// watch stops.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Wakes `notify` (`notify_one`) after every change until `stop` or the watch stops: for
    /// a consumer that already waits on one [`Notify`] for the changes of its other caches.
    pub fn wake(&self, notify: Arc<Notify>, stop: CancellationToken) {
        Self::wake_on(self.changes(), notify, stop);
    }

    /// [`Self::wake`] on the changes of the [`View`] named `view` only; on every change
    /// when the cache has no such view (so a reader is never left asleep).
    pub fn wake_on_view(&self, view: &str, notify: Arc<Notify>, stop: CancellationToken) {
        let changes = self
            .views
            .iter()
            .find(|(name, _)| *name == view)
            .map(|(_, rx)| rx.clone())
            .unwrap_or_else(|| self.changes());
        Self::wake_on(changes, notify, stop);
    }

    fn wake_on(mut changes: watch::Receiver<u64>, notify: Arc<Notify>, stop: CancellationToken) {
        changes.mark_unchanged();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = changes.changed() => if r.is_err() { return },
                }
                notify.notify_one();
            }
        });
    }
}

/// Runs one reflector on `api` (with field selector `fields`, e.g. `metadata.name=node-a`;
/// `None`: every object) until `stop`, for every consumer of the process. `what` is the
/// resource's plural (`nodes`): the name its watch is tracked under in `activity` and logged
/// with. Objects are stripped with `strip` before they are cached, so it must keep what every
/// consumer reads; `views`: the narrower changes some readers wake on ([`View`]). Watch errors retry with [`crate::kube::client::WatchBackoff`]; the first
/// of a run of failures is logged at WARN (`watch failed`, with the resource and the
/// server's message, which for RBAC names the verb), the rest at DEBUG, the recovery at
/// INFO; the cache keeps its last state meanwhile.
pub fn spawn_shared<K>(
    what: &'static str,
    api: Api<K>,
    strip: fn(&mut K),
    fields: Option<String>,
    activity: crate::obs::readiness::WatchActivity,
    stop: CancellationToken,
    views: &[View<K>],
) -> SharedCache<K>
where
    K: Watched,
{
    let events = stripped_events(what, api, strip, fields, &activity);
    shared_from(what, events, activity, stop, views)
}

/// [`spawn_shared`] on any stream of watch events (tests feed their own, see
/// [`test_cache`]).
pub(crate) fn shared_from<K, S>(
    what: &'static str,
    events: S,
    activity: crate::obs::readiness::WatchActivity,
    stop: CancellationToken,
    views: &[View<K>],
) -> SharedCache<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + PartialEq + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (store, writer) = reflector::store();
    let (tx, changes) = watch::channel(0u64);
    let (listed_tx, listed) = watch::channel(false);
    let (view_txs, view_rxs): (Vec<_>, Vec<_>) = views
        .iter()
        .map(|v| {
            let (tx, rx) = watch::channel(0u64);
            (tx, (v.name, rx))
        })
        .unzip();
    let (events, woken) = judged(events, store.clone(), views.to_vec());
    let mut stream = reflector::reflector(writer, events).boxed();
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => ev,
            };
            let Some(ev) = ev else { return };
            log_result(
                what,
                &mut failing,
                &ev,
                ", every user of the cache keeps its last state",
            );
            if let Ok(ev) = ev {
                activity.touch(what);
                if matches!(ev, watcher::Event::InitDone) {
                    listed_tx.send_if_modified(|l| !std::mem::replace(l, true));
                }
                if woken.all.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    tx.send_modify(|n| *n = n.wrapping_add(1));
                }
                for (flag, view) in woken.views.iter().zip(&view_txs) {
                    if flag.swap(false, std::sync::atomic::Ordering::Relaxed) {
                        view.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
            }
        }
    });
    SharedCache {
        store,
        changes,
        listed,
        views: Arc::new(view_rxs),
    }
}

/// Logs one result of the watch on `what` as [`say`] tells (`failing`: whether the watch was
/// failing, updated): the first failure of a run at WARN (`watch failed; retrying with
/// back-off` and `tail`), the others at DEBUG, the recovery at INFO.
fn log_result<K>(
    what: &str,
    failing: &mut bool,
    ev: &Result<watcher::Event<K>, watcher::Error>,
    tail: &str,
) {
    match (say(failing, ev.as_ref().map_err(|_| ())), ev) {
        (Say::Failed, Err(e)) => {
            warn!(resource = what, verb = "list/watch", error = %e, "watch failed; retrying with back-off{tail}")
        }
        (Say::StillFailing, Err(e)) => {
            debug!(resource = what, error = %e, "watch still failing")
        }
        (Say::Recovered, _) => info!(resource = what, "watch recovered"),
        _ => {}
    }
}

/// What [`log_result`] logs for one result of a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Say {
    /// The first failure of a run: WARN.
    Failed,
    /// A further failure of the run: DEBUG.
    StillFailing,
    /// The first success after a run of failures: INFO.
    Recovered,
    /// Nothing.
    Nothing,
}

/// What to log for `result`, the next result of a watch (`Err`: a failure; `Ok(event)`),
/// given whether it was `failing`, which it updates. The `Init` event that starts every
/// list attempt is no success: a list that keeps failing yields `Init` then the error on
/// each attempt, and is still one failure. Pure.
fn say<K>(failing: &mut bool, result: Result<&watcher::Event<K>, ()>) -> Say {
    match result {
        Err(()) if !std::mem::replace(failing, true) => Say::Failed,
        Err(()) => Say::StillFailing,
        Ok(watcher::Event::Init) => Say::Nothing,
        Ok(_) if std::mem::take(failing) => Say::Recovered,
        Ok(_) => Say::Nothing,
    }
}

/// A [`SharedCache`] fed by hand, for tests of its readers: what is sent on the returned
/// sender is what its watch delivers (dropping the sender stops the watch).
#[cfg(test)]
pub(crate) fn test_cache<K>() -> (
    futures::channel::mpsc::UnboundedSender<Result<watcher::Event<K>, watcher::Error>>,
    SharedCache<K>,
)
where
    K: kube::Resource<DynamicType = ()> + Clone + PartialEq + Send + Sync + 'static,
{
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let activity = crate::obs::readiness::WatchActivity::new();
    (
        tx,
        shared_from("test", rx, activity, CancellationToken::new(), &[]),
    )
}

/// `kubectl apply` keeps a copy of the whole object in this annotation; vipd never reads it
/// (stripped before objects are cached).
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Keeps the entries of a label or annotation map whose key `keep` accepts; a map left
/// empty becomes `None` (as the API server returns an object without any).
pub fn retain_keys(
    map: &mut Option<std::collections::BTreeMap<String, String>>,
    keep: impl Fn(&str) -> bool,
) {
    if let Some(m) = map.as_mut() {
        m.retain(|k, _| keep(k));
    }
    if map.as_ref().is_some_and(|m| m.is_empty()) {
        *map = None;
    }
}

/// Drops what no cache of Services needs: managedFields, owner references, `kubectl
/// apply`'s copy of the object ([`LAST_APPLIED`]), every label `keep` refuses (no labels
/// left: none at all), and of the spec what no part of vipd reads: the selector, the cluster
/// IPs, external IPs and name, session affinity, the internal traffic policy,
/// `publishNotReadyAddresses`, the health-check node port, `allocateLoadBalancerNodePorts`,
/// the traffic distribution, the source ranges, and of each port its name, node port,
/// target port and application protocol. Annotations, the rest of the spec (type, class,
/// `loadBalancerIP`, the IP families and their policy, `externalTrafficPolicy`, each port's
/// number and protocol) and the status stay. Every cached Service is stripped on arrival:
/// at 10 000 Services each dropped string is about 0.3 MiB a node. A reader of a dropped
/// field adds it back here first.
pub fn strip_service(svc: &mut k8s_openapi::api::core::v1::Service, keep: impl Fn(&str) -> bool) {
    svc.metadata.managed_fields = None;
    svc.metadata.owner_references = None;
    retain_keys(&mut svc.metadata.labels, keep);
    if let Some(spec) = svc.spec.as_mut() {
        spec.selector = None;
        spec.cluster_ip = None;
        spec.cluster_ips = None;
        spec.external_ips = None;
        spec.external_name = None;
        spec.session_affinity = None;
        spec.session_affinity_config = None;
        spec.internal_traffic_policy = None;
        spec.publish_not_ready_addresses = None;
        spec.health_check_node_port = None;
        spec.allocate_load_balancer_node_ports = None;
        spec.traffic_distribution = None;
        spec.load_balancer_source_ranges = None;
        for port in spec.ports.iter_mut().flatten() {
            port.name = None;
            port.node_port = None;
            port.target_port = None;
            port.app_protocol = None;
        }
    }
    if let Some(a) = svc.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::ObjectRef;

    fn cm(name: &str, v: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "data": {"v": v},
        }))
        .unwrap()
    }

    fn value(cache: &SharedCache<ConfigMap>, name: &str) -> Option<String> {
        let key = ObjectRef::new(name).within("ns");
        let got = cache.store().get(&key)?;
        got.data.as_ref()?.get("v").cloned()
    }

    /// Every reader of one cache is woken by each change, after the cache has it: two
    /// receivers of the change count and a `Notify` of a reader with caches of its own.
    #[tokio::test]
    async fn every_reader_is_woken_by_each_change_after_the_cache_has_it() {
        use watcher::Event::*;
        let (tx, cache) = test_cache::<ConfigMap>();
        let (mut a, mut b) = (cache.changes(), cache.changes());
        let notify = Arc::new(Notify::new());
        cache.wake(notify.clone(), CancellationToken::new());
        for ev in [Init, InitApply(cm("x", "1")), InitDone] {
            tx.unbounded_send(Ok(ev)).unwrap();
        }
        assert!(cache.ready().await);
        a.wait_for(|c| *c >= 1).await.unwrap();
        b.wait_for(|c| *c >= 1).await.unwrap();
        assert_eq!(value(&cache, "x").as_deref(), Some("1"));
        tokio::time::timeout(Duration::from_secs(5), notify.notified())
            .await
            .unwrap();
        tx.unbounded_send(Ok(Apply(cm("x", "2")))).unwrap();
        a.changed().await.unwrap();
        b.changed().await.unwrap();
        assert_eq!(value(&cache, "x").as_deref(), Some("2"));
        tokio::time::timeout(Duration::from_secs(5), notify.notified())
            .await
            .unwrap();
        // The watch stops: every reader sees its end.
        drop(tx);
        while a.changed().await.is_ok() {}
        while b.changed().await.is_ok() {}
    }

    /// A list that keeps failing (each attempt: `Init`, then the error) is one WARN; the
    /// first object or the end of a list is the one recovery.
    #[test]
    fn a_failing_list_is_one_warning_and_one_recovery() {
        use watcher::Event::*;
        let mut failing = false;
        let obj = cm("x", "1");
        let results: [Result<watcher::Event<ConfigMap>, ()>; 9] = [
            Ok(Init),
            Err(()),
            Ok(Init),
            Err(()),
            Ok(Init),
            Err(()),
            Ok(Init),
            Ok(InitApply(obj.clone())),
            Ok(InitDone),
        ];
        let said: Vec<Say> = results
            .iter()
            .map(|r| say(&mut failing, r.as_ref().map_err(|_| ())))
            .collect();
        use Say::*;
        assert_eq!(
            said,
            [
                Nothing,
                Failed,
                Nothing,
                StillFailing,
                Nothing,
                StillFailing,
                Nothing,
                Recovered,
                Nothing
            ]
        );
        // A watch that fails once it runs recovers at the end of its re-list.
        let mut failing = false;
        let said: Vec<Say> = [Err(()), Ok(&Init), Ok(&InitDone), Ok(&Apply(obj))]
            .into_iter()
            .map(|r| say(&mut failing, r))
            .collect();
        assert_eq!(said, [Failed, Nothing, Recovered, Nothing]);
    }

    /// Many tasks wait for the first list at once and every one is woken (kube-runtime's
    /// `Store::wait_until_ready` wakes only the last: eligibility waited forever in the lab
    /// while the Services wing went on); a watch that stops first answers `false`.
    fn versioned(name: &str, v: &str, rv: &str) -> ConfigMap {
        let mut c = cm(name, v);
        c.metadata.resource_version = Some(rv.to_string());
        c
    }

    /// An object that comes back equal but for its resourceVersion (a Node's heartbeat once
    /// stripped, a Service whose only change is an annotation the reader's strip drops)
    /// updates the cache and wakes no reader; a change of content, a new object, a delete
    /// and the end of a list do (at 10 000 Services the allocator ran a full pass for every
    /// status write of every holder, 40 % of a core during a failover).
    #[test]
    fn only_a_change_of_content_wakes() {
        use watcher::Event::*;
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let x1 = versioned("x", "1", "1");
        assert!(wakes(&store, &mut Apply(x1.clone())), "new object");
        writer.apply_watcher_event(&Apply(x1.clone()));
        assert!(
            !wakes(&store, &mut Apply(x1.clone())),
            "the same object again"
        );
        let mut version_only = Apply(versioned("x", "1", "2"));
        assert!(
            !wakes(&store, &mut version_only),
            "only the resourceVersion changed"
        );
        let Apply(kept) = &version_only else {
            unreachable!()
        };
        assert_eq!(
            kept,
            &versioned("x", "1", "2"),
            "the event keeps its own resourceVersion (the cache takes it for conditional writes)"
        );
        let mut content = Apply(versioned("x", "2", "2"));
        assert!(wakes(&store, &mut content), "content");
        let Apply(kept) = &content else {
            unreachable!()
        };
        assert_eq!(kept, &versioned("x", "2", "2"));
        assert!(
            wakes(&store, &mut Apply(versioned("y", "1", "3"))),
            "another"
        );
        assert!(wakes(&store, &mut Delete(x1.clone())));
        assert!(!wakes(&store, &mut Init));
        assert!(!wakes(&store, &mut InitApply(x1)));
        assert!(wakes(&store, &mut InitDone));
    }

    /// Through a shared cache: the version-only event is in the cache (its new
    /// resourceVersion, for conditional writes) without a wake; the next real change wakes.
    #[tokio::test]
    async fn a_version_only_event_is_cached_without_a_wake() {
        use watcher::Event::*;
        let (tx, cache) = test_cache::<ConfigMap>();
        let changes = cache.changes();
        for ev in [Init, InitApply(versioned("x", "1", "1")), InitDone] {
            tx.unbounded_send(Ok(ev)).unwrap();
        }
        assert!(cache.ready().await);
        tx.unbounded_send(Ok(Apply(versioned("x", "1", "2"))))
            .unwrap();
        tx.unbounded_send(Ok(Apply(versioned("y", "1", "3"))))
            .unwrap();
        let mut c = changes.clone();
        c.wait_for(|_| value(&cache, "y").is_some()).await.unwrap();
        assert_eq!(
            *changes.borrow(),
            2,
            "the list's end and y, not x's version"
        );
        let x = cache
            .store()
            .get(&ObjectRef::new("x").within("ns"))
            .unwrap();
        assert_eq!(x.metadata.resource_version.as_deref(), Some("2"));
    }

    /// A view counts only the changes its reader reads: an object changed elsewhere changes
    /// the cache (every plain reader wakes) but not the view; a change of what the view
    /// reads, a new object and a delete change both; a reader asking for a view the cache
    /// does not have wakes on every change.
    #[tokio::test]
    async fn a_view_counts_only_the_changes_its_reader_reads() {
        use watcher::Event::*;
        fn same_v(a: &ConfigMap, b: &ConfigMap) -> bool {
            let v = |c: &ConfigMap| c.data.as_ref().and_then(|d| d.get("v")).cloned();
            v(a) == v(b)
        }
        let with = |v: &str, w: &str| -> ConfigMap {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "x", "namespace": "ns"},
                "data": {"v": v, "w": w},
            }))
            .unwrap()
        };
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let view = View {
            name: "v",
            same: same_v,
        };
        let cache = shared_from(
            "test",
            rx,
            crate::obs::readiness::WatchActivity::new(),
            CancellationToken::new(),
            &[view],
        );
        let view_count = || *cache.views[0].1.borrow();
        let mut all = cache.changes();
        let woken = Arc::new(Notify::new());
        cache.wake_on_view("v", woken.clone(), CancellationToken::new());
        let unknown = Arc::new(Notify::new());
        cache.wake_on_view("no-such-view", unknown.clone(), CancellationToken::new());
        for ev in [Init, InitApply(with("1", "1")), InitDone] {
            tx.unbounded_send(Ok(ev)).unwrap();
        }
        all.wait_for(|c| *c >= 1).await.unwrap();
        assert_eq!(view_count(), 1, "the list's end changes every view");
        // Another field: the cache changes, the view does not.
        tx.unbounded_send(Ok(Apply(with("1", "2")))).unwrap();
        all.wait_for(|c| *c >= 2).await.unwrap();
        assert_eq!(view_count(), 1);
        // What the view reads: both.
        tx.unbounded_send(Ok(Apply(with("2", "2")))).unwrap();
        all.wait_for(|c| *c >= 3).await.unwrap();
        assert_eq!(view_count(), 2);
        // A new object and a delete: both.
        tx.unbounded_send(Ok(Apply(cm("y", "1")))).unwrap();
        all.wait_for(|c| *c >= 4).await.unwrap();
        assert_eq!(view_count(), 3);
        tx.unbounded_send(Ok(Delete(cm("y", "1")))).unwrap();
        all.wait_for(|c| *c >= 5).await.unwrap();
        assert_eq!(view_count(), 4);
        let within = Duration::from_secs(5);
        tokio::time::timeout(within, woken.notified())
            .await
            .expect("the view's reader is woken");
        tokio::time::timeout(within, unknown.notified())
            .await
            .expect("a reader of an unknown view is woken by every change");
    }

    #[tokio::test]
    async fn every_task_waiting_for_the_first_list_is_woken() {
        use watcher::Event::*;
        let (tx, cache) = test_cache::<ConfigMap>();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.ready().await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        for ev in [Init, InitApply(cm("x", "1")), InitDone] {
            tx.unbounded_send(Ok(ev)).unwrap();
        }
        for w in waiters {
            let ready = tokio::time::timeout(Duration::from_secs(5), w).await;
            assert!(ready.unwrap().unwrap(), "every waiter sees the list");
        }
        let (tx, cache) = test_cache::<ConfigMap>();
        drop(tx);
        assert!(!cache.ready().await);
    }

    /// A failing watch leaves the cache as it was (readers keep their last state); a re-list
    /// replaces it as a whole at its end.
    #[tokio::test]
    async fn errors_keep_the_last_state_and_a_relist_replaces_it_whole() {
        use watcher::Event::*;
        let (tx, cache) = test_cache::<ConfigMap>();
        let mut rx = cache.changes();
        for ev in [
            Init,
            InitApply(cm("x", "1")),
            InitApply(cm("y", "1")),
            InitDone,
        ] {
            tx.unbounded_send(Ok(ev)).unwrap();
        }
        rx.wait_for(|c| *c >= 1).await.unwrap();
        for _ in 0..3 {
            tx.unbounded_send(Err(watcher::Error::NoResourceVersion))
                .unwrap();
        }
        // The watch comes back without a re-list: the errors kept the state.
        tx.unbounded_send(Ok(Apply(cm("z", "1")))).unwrap();
        rx.wait_for(|c| *c >= 2).await.unwrap();
        assert_eq!(value(&cache, "x").as_deref(), Some("1"));
        assert_eq!(value(&cache, "y").as_deref(), Some("1"));
        // A re-list: the cache changes (and its readers wake) once, at its end.
        tx.unbounded_send(Ok(Init)).unwrap();
        tx.unbounded_send(Ok(InitApply(cm("y", "2")))).unwrap();
        tx.unbounded_send(Ok(InitDone)).unwrap();
        rx.wait_for(|c| *c >= 3).await.unwrap();
        assert_eq!(*rx.borrow(), 3);
        assert_eq!(value(&cache, "x"), None);
        assert_eq!(value(&cache, "z"), None);
        assert_eq!(value(&cache, "y").as_deref(), Some("2"));
    }

    #[test]
    fn a_stripped_service_keeps_what_vipd_reads_and_only_the_labels_asked_for() {
        let svc = || -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": "web",
                    "labels": {"implementation": "kube-vip", "app": "web"},
                    "annotations": {LAST_APPLIED: "{...}", "kube-vip.io/loadbalancerIPs": "192.0.2.10"},
                    "managedFields": [{"manager": "kubectl"}]
                },
                "spec": {
                    "type": "LoadBalancer", "selector": {"app": "web"},
                    "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                    "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
                    "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                    "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                    "loadBalancerClass": "kube-vip.io/kube-vip-class",
                    "loadBalancerIP": "192.0.2.10",
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                               "targetPort": 8080, "nodePort": 30080}]
                },
                "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}
            }))
            .unwrap()
        };
        let mut kept = svc();
        strip_service(&mut kept, |k| k == "implementation");
        assert_eq!(
            kept.metadata.labels,
            Some([("implementation".to_string(), "kube-vip".to_string())].into())
        );
        assert_eq!(kept.metadata.managed_fields, None);
        let spec = kept.spec.clone().unwrap_or_default();
        assert_eq!(spec.selector, None);
        assert_eq!((spec.cluster_ip, spec.cluster_ips), (None, None));
        assert_eq!(spec.session_affinity, None);
        assert_eq!(spec.internal_traffic_policy, None);
        assert_eq!(spec.health_check_node_port, None);
        // What vipd reads stays: type, class, loadBalancerIP, families, policy, ports.
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(
            spec.load_balancer_class.as_deref(),
            Some("kube-vip.io/kube-vip-class")
        );
        assert_eq!(spec.load_balancer_ip.as_deref(), Some("192.0.2.10"));
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
        let ports = spec.ports.unwrap_or_default();
        assert_eq!(ports.len(), 1);
        assert_eq!(
            (ports[0].port, ports[0].protocol.as_deref()),
            (80, Some("TCP"))
        );
        assert_eq!((&ports[0].name, ports[0].node_port), (&None, None));
        assert_eq!(ports[0].target_port, None);
        assert!(kept.status.is_some());
        let annotations = kept.metadata.annotations.unwrap_or_default();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert!(annotations.contains_key("kube-vip.io/loadbalancerIPs"));
        let mut none = svc();
        strip_service(&mut none, |_| false);
        assert_eq!(none.metadata.labels, None);
    }
}
