//! [`LeaseClient`] against the Kubernetes API (`coordination.k8s.io/v1` Lease) with kube-rs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube_runtime::WatchStreamExt;
use kube_runtime::watcher;

use super::{LeaseClient, LeaseError, LeaseEvent, LeaseRecord, Observed};

/// One Lease, accessed through kube-rs. Keeps the last Lease object it read or wrote so that
/// a replace keeps the object's other metadata (labels, annotations, owner references).
#[derive(Clone)]
pub(crate) struct KubeLeaseClient {
    api: Api<Lease>,
    namespace: String,
    name: String,
    last: Arc<Mutex<Option<Lease>>>,
    hub: Option<LeaseHub>,
    /// Labels put on the Lease when this client creates it (never added to an existing
    /// one: they mark leases vipd created, see `services::lease_gc`). Shared: one map for
    /// every per-Service lease of the process, not one per Service.
    labels: Option<Arc<std::collections::BTreeMap<String, String>>>,
}

impl KubeLeaseClient {
    /// A client for Lease `name` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        KubeLeaseClient {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            last: Arc::new(Mutex::new(None)),
            hub: None,
            labels: None,
        }
    }

    /// Creates the Lease (when it does not exist) with `labels`; a Lease that exists keeps
    /// the labels it has (a replace carries them over, none are added). A replace of a
    /// Lease this client never read (seen absent, then created by another node) reads it
    /// first, one GET, so that its labels are not dropped.
    pub(crate) fn with_labels(
        mut self,
        labels: Arc<std::collections::BTreeMap<String, String>>,
    ) -> Self {
        self.labels = Some(labels);
        self
    }

    /// Takes this lease's watch events from a shared [`LeaseHub`] instead of opening a watch
    /// of its own.
    pub(crate) fn with_hub(mut self, hub: LeaseHub) -> Self {
        self.hub = Some(hub);
        self
    }

    /// Deletes the Lease if it is still at `resource_version` (used when the Service it
    /// governs is deleted, by the node that held it). Absent or changed = `Ok(false)`.
    ///
    /// # Errors
    /// [`LeaseError::Api`] for other failures.
    pub async fn delete(&self, resource_version: &str) -> Result<bool, LeaseError> {
        let dp = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: Some(resource_version.to_string()),
                uid: None,
            }),
            ..Default::default()
        };
        match Box::pin(self.api.delete(&self.name, &dp)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
            Err(e) => Err(self.err("delete", e)),
        }
    }

    fn remember(&self, lease: &Lease) -> Observed {
        if let Ok(mut last) = self.last.lock() {
            let mut copy = lease.clone();
            // Not needed for a replace: the server keeps managedFields a write leaves out.
            copy.metadata.managed_fields = None;
            *last = Some(copy);
        }
        observe(lease)
    }

    fn err(&self, op: &'static str, e: kube::Error) -> LeaseError {
        let lease = self.describe();
        if let kube::Error::Api(status) = &e {
            if status.is_conflict() {
                return LeaseError::Conflict { lease };
            }
            if status.is_already_exists() {
                return LeaseError::AlreadyExists { lease };
            }
            return LeaseError::Api {
                lease,
                op,
                status: Some(status.code),
                message: format!("{} {}: {}", status.code, status.reason, status.message),
            };
        }
        LeaseError::Api {
            lease,
            op,
            status: None,
            message: e.to_string(),
        }
    }
}

fn observe(lease: &Lease) -> Observed {
    Observed {
        record: LeaseRecord::from_lease(lease),
        resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
    }
}

impl LeaseClient for KubeLeaseClient {
    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    async fn get(&self) -> Result<Option<Observed>, LeaseError> {
        match Box::pin(self.api.get_opt(&self.name)).await {
            Ok(Some(lease)) => Ok(Some(self.remember(&lease))),
            Ok(None) => Ok(None),
            Err(e) => Err(self.err("get", e)),
        }
    }

    async fn create(&self, record: &LeaseRecord) -> Result<Observed, LeaseError> {
        let mut spec = LeaseSpec::default();
        record.apply_to(&mut spec);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: self.labels.as_deref().cloned(),
                ..Default::default()
            },
            spec: Some(spec),
        };
        let mut lease = lease;
        record.apply_annotations(&mut lease.metadata);
        match Box::pin(self.api.create(&PostParams::default(), &lease)).await {
            Ok(l) => Ok(self.remember(&l)),
            Err(e) => Err(self.err("create", e)),
        }
    }

    async fn update(
        &self,
        record: &LeaseRecord,
        resource_version: &str,
    ) -> Result<Observed, LeaseError> {
        let mut last = self.last.lock().ok().and_then(|l| l.clone());
        if last.is_none() && self.labels.is_some() {
            // Never read (seen absent, then created by another node and learned from the
            // watch): read it once, so that the replace keeps its labels (the marks of a
            // lease vipd created, see `with_labels`) instead of dropping them.
            if let Ok(Some(mut l)) = Box::pin(self.api.get_opt(&self.name)).await {
                self.remember(&l);
                l.metadata.managed_fields = None;
                last = Some(l);
            }
        }
        let base = last.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: None,
        });
        let mut lease = base;
        lease.metadata.resource_version = Some(resource_version.to_string());
        let mut spec = lease.spec.take().unwrap_or_default();
        record.apply_to(&mut spec);
        lease.spec = Some(spec);
        record.apply_annotations(&mut lease.metadata);
        match Box::pin(self.api.replace(&self.name, &PostParams::default(), &lease)).await {
            Ok(l) => Ok(self.remember(&l)),
            Err(e) => Err(self.err("update", e)),
        }
    }

    fn watch(&self) -> BoxStream<'static, LeaseEvent> {
        if let Some(hub) = &self.hub {
            return hub.subscribe(&self.namespace, &self.name);
        }
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let name = self.name.clone();
        watcher(self.api.clone(), cfg)
            .default_backoff()
            .filter_map(move |ev| {
                let out = match ev {
                    Ok(watcher::Event::Apply(l)) | Ok(watcher::Event::InitApply(l)) => {
                        (l.metadata.name.as_deref() == Some(name.as_str()))
                            .then(|| LeaseEvent::Changed(observe(&l)))
                    }
                    Ok(watcher::Event::Delete(_)) => Some(LeaseEvent::Deleted),
                    Ok(watcher::Event::Init) => None,
                    // Init listed nothing: `InitApply` did not come. Report absence only when
                    // nothing was applied; the elector ignores a Deleted for an absent lease.
                    Ok(watcher::Event::InitDone) => None,
                    Err(e) => Some(LeaseEvent::Error(e.to_string())),
                };
                futures::future::ready(out)
            })
            .boxed()
    }
}

/// Name of [`LeaseHub`]'s watch in its `WatchActivity` (the resource's plural, as the
/// HTTP layer reports its restarts).
pub(crate) const LEASE_WATCH: &str = "leases";

/// Events buffered per lease for its subscribers. A subscriber that falls further behind
/// gets [`LeaseEvent::Error`] and re-reads the lease (only the latest state matters).
const LEASE_EVENT_BUFFER: usize = 2;

/// One watch on Leases shared by many [`KubeLeaseClient`]s (per-Service elections: hundreds
/// of leases, one watch connection instead of one per lease). Events are dispatched by
/// `namespace/name`; after a watch restart, leases that were not re-listed are reported as
/// deleted (kube-runtime's `InitDone` contract).
#[derive(Clone)]
pub struct LeaseHub {
    subscribers: Arc<Mutex<HashMap<String, broadcast::Sender<LeaseEvent>>>>,
}

impl LeaseHub {
    /// Starts the shared watch on Leases in `namespace` (`None` = all namespaces) on the
    /// current tokio runtime. The watch is tracked as `leases` in `activity` (every event
    /// counts; `client`'s `crate::kube::client::WatchStartLayer` reports its restarts). The task
    /// ends when `shutdown` is cancelled.
    pub fn start(
        client: kube::Client,
        namespace: Option<&str>,
        activity: crate::obs::readiness::WatchActivity,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Self {
        let hub = LeaseHub {
            subscribers: Arc::new(Mutex::new(HashMap::new())),
        };
        let api: Api<Lease> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let h = hub.clone();
        activity.register(
            LEASE_WATCH,
            std::time::Duration::from_secs(crate::kube::client::SERVICES_WATCH_TIMEOUT_SECS.into()),
        );
        tokio::spawn(async move {
            // The Services clients' read timeout (crate::kube::client::SERVICES_READ_TIMEOUT) is
            // longer than this server-side watch timeout.
            let cfg = watcher::Config::default()
                .timeout(crate::kube::client::SERVICES_WATCH_TIMEOUT_SECS);
            let mut stream = watcher(api, cfg)
                .backoff(crate::kube::client::WatchBackoff::default())
                .boxed();
            let mut listed: HashSet<String> = HashSet::new();
            loop {
                let ev = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    ev = stream.next() => ev,
                };
                let Some(ev) = ev else { return };
                if ev.is_ok() {
                    activity.touch(LEASE_WATCH);
                }
                match ev {
                    Ok(watcher::Event::Init) => listed.clear(),
                    Ok(watcher::Event::InitApply(l)) => {
                        let key = key_of(&l);
                        h.send(&key, LeaseEvent::Changed(observe(&l)));
                        listed.insert(key);
                    }
                    Ok(watcher::Event::InitDone) => {
                        let gone: Vec<String> = h
                            .keys()
                            .into_iter()
                            .filter(|k| !listed.contains(k))
                            .collect();
                        for k in gone {
                            h.send(&k, LeaseEvent::Deleted);
                        }
                    }
                    Ok(watcher::Event::Apply(l)) => {
                        h.send(&key_of(&l), LeaseEvent::Changed(observe(&l)))
                    }
                    Ok(watcher::Event::Delete(l)) => h.send(&key_of(&l), LeaseEvent::Deleted),
                    Err(e) => {
                        let msg = e.to_string();
                        for k in h.keys() {
                            h.send(&k, LeaseEvent::Error(msg.clone()));
                        }
                    }
                }
            }
        });
        hub
    }

    fn keys(&self) -> Vec<String> {
        self.subscribers
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn send(&self, key: &str, ev: LeaseEvent) {
        if let Ok(mut m) = self.subscribers.lock()
            && let Some(tx) = m.get(key)
            && tx.send(ev).is_err()
        {
            // Nobody listens any more.
            m.remove(key);
        }
    }

    /// Events of Lease `namespace/name` from now on. Dropping the stream unsubscribes (the
    /// last subscriber of a lease removes its entry, so deleted Services leave nothing).
    pub(crate) fn subscribe(&self, namespace: &str, name: &str) -> BoxStream<'static, LeaseEvent> {
        let key = format!("{namespace}/{name}");
        let rx = match self.subscribers.lock() {
            Ok(mut m) => m
                .entry(key.clone())
                .or_insert_with(|| broadcast::channel(LEASE_EVENT_BUFFER).0)
                .subscribe(),
            Err(_) => broadcast::channel(1).1,
        };
        let guard = Unsubscribe {
            hub: self.clone(),
            key,
        };
        // Tuple fields drop in order: the receiver before the guard.
        futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
            match rx.recv().await {
                Ok(ev) => Some((ev, (rx, guard))),
                // Missed events: the elector polls until the next good event.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    Some((LeaseEvent::Error("lease events lagged".into()), (rx, guard)))
                }
                Err(broadcast::error::RecvError::Closed) => None,
            }
        })
        .boxed()
    }

    /// Number of leases with subscribers (for tests and leak checks).
    pub fn subscribed(&self) -> usize {
        self.subscribers.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// Removes a lease's entry from the hub when its last subscriber goes.
struct Unsubscribe {
    hub: LeaseHub,
    key: String,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        if let Ok(mut m) = self.hub.subscribers.lock()
            && m.get(&self.key).is_some_and(|tx| tx.receiver_count() == 0)
        {
            m.remove(&self.key);
        }
    }
}

fn key_of(l: &Lease) -> String {
    format!(
        "{}/{}",
        l.metadata.namespace.as_deref().unwrap_or_default(),
        l.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> LeaseHub {
        LeaseHub {
            subscribers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A fake API server for one Lease: records (method, body) of every request; GET
    /// returns `stored`, POST and PUT echo the body with resourceVersion "2".
    /// (HTTP method, JSON body) of every request the fake API server got.
    type Requests = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

    fn fake_api(stored: Lease) -> (kube::Client, Requests) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let log = log.clone();
            let stored = stored.clone();
            async move {
                let method = req.method().to_string();
                let body = crate::kube::fake_api::json_body(req).await;
                log.lock().unwrap().push((method.clone(), body.clone()));
                let mut reply = if method == "GET" {
                    serde_json::to_value(&stored).unwrap()
                } else {
                    body
                };
                reply["metadata"]["resourceVersion"] = serde_json::json!("2");
                let code = if method == "POST" { 201 } else { 200 };
                Ok::<_, std::convert::Infallible>(crate::kube::fake_api::json_reply(code, &reply))
            }
        });
        (kube::Client::new(svc, "default"), seen)
    }

    fn labels_of(body: &serde_json::Value) -> serde_json::Value {
        body["metadata"]["labels"].clone()
    }

    #[tokio::test]
    async fn labels_are_set_on_create_and_kept_by_a_replace_of_a_lease_never_read() {
        let labels: std::collections::BTreeMap<String, String> = [(
            "app.kubernetes.io/managed-by".to_string(),
            "vipd".to_string(),
        )]
        .into();
        let mut stored = Lease::default();
        stored.metadata.name = Some("kubevip-web".into());
        stored.metadata.namespace = Some("default".into());
        stored.metadata.resource_version = Some("1".into());
        stored.metadata.labels = Some(labels.clone());
        let rec = LeaseRecord {
            holder: "node-b".into(),
            ..Default::default()
        };

        // Created by this client: with the labels.
        let (client, seen) = fake_api(stored.clone());
        let c = KubeLeaseClient::new(client, "default", "kubevip-web")
            .with_labels(Arc::new(labels.clone()));
        c.create(&rec).await.unwrap();
        let reqs = seen.lock().unwrap().clone();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].0, "POST");
        assert_eq!(labels_of(&reqs[0].1), serde_json::json!(labels));

        // Created by another node, learned from the watch, taken over by this one: the
        // replace carries the labels it read, not an empty metadata.
        let (client, seen) = fake_api(stored.clone());
        let c = KubeLeaseClient::new(client, "default", "kubevip-web")
            .with_labels(Arc::new(labels.clone()));
        c.update(&rec, "1").await.unwrap();
        let reqs = seen.lock().unwrap().clone();
        let put = reqs.iter().find(|(m, _)| m == "PUT").expect("a PUT");
        assert_eq!(labels_of(&put.1), serde_json::json!(labels));
        assert_eq!(put.1["metadata"]["resourceVersion"], "1");
        assert_eq!(put.1["spec"]["holderIdentity"], "node-b");

        // A lease that exists is never labelled by this client (it may not be vipd's).
        let mut foreign = stored.clone();
        foreign.metadata.labels = None;
        let (client, seen) = fake_api(foreign);
        let c =
            KubeLeaseClient::new(client, "default", "kubevip-web").with_labels(Arc::new(labels));
        c.update(&rec, "1").await.unwrap();
        let reqs = seen.lock().unwrap().clone();
        let put = reqs.iter().find(|(m, _)| m == "PUT").expect("a PUT");
        assert_eq!(labels_of(&put.1), serde_json::Value::Null);
    }

    #[tokio::test]
    async fn the_failback_request_is_an_annotation_set_and_removed_by_a_replace() {
        use crate::election::record::FAILBACK_REQUEST_ANNOTATION as KEY;
        let mut stored = Lease::default();
        stored.metadata.name = Some("kubevip-web".into());
        stored.metadata.namespace = Some("default".into());
        stored.metadata.resource_version = Some("1".into());
        stored.metadata.annotations = Some([("other".to_string(), "x".to_string())].into());
        let (client, seen) = fake_api(stored);
        let c = KubeLeaseClient::new(client, "default", "kubevip-web");
        assert_eq!(
            c.get().await.unwrap().unwrap().record.failback_request,
            None
        );
        let mut rec = LeaseRecord {
            holder: "node-b".into(),
            failback_request: Some("node-a".into()),
            ..Default::default()
        };
        let obs = c.update(&rec, "1").await.unwrap();
        assert_eq!(obs.record.failback_request.as_deref(), Some("node-a"));
        rec.failback_request = None;
        let obs = c.update(&rec, "2").await.unwrap();
        assert_eq!(obs.record.failback_request, None);
        let reqs = seen.lock().unwrap().clone();
        let puts: Vec<_> = reqs.iter().filter(|(m, _)| m == "PUT").collect();
        assert_eq!(puts.len(), 2);
        assert_eq!(puts[0].1["metadata"]["annotations"][KEY], "node-a");
        assert_eq!(puts[0].1["metadata"]["annotations"]["other"], "x");
        assert_eq!(
            puts[1].1["metadata"]["annotations"][KEY],
            serde_json::Value::Null
        );
        assert_eq!(puts[1].1["metadata"]["annotations"]["other"], "x");
    }

    #[tokio::test]
    async fn hub_dispatches_by_lease_and_forgets_dropped_subscribers() {
        let h = hub();
        let mut a1 = h.subscribe("default", "kubevip-a");
        let a2 = h.subscribe("default", "kubevip-a");
        let mut b = h.subscribe("default", "kubevip-b");
        assert_eq!(h.subscribed(), 2);
        h.send("default/kubevip-a", LeaseEvent::Deleted);
        assert_eq!(a1.next().await, Some(LeaseEvent::Deleted));
        h.send("default/kubevip-b", LeaseEvent::Error("x".into()));
        assert_eq!(b.next().await, Some(LeaseEvent::Error("x".into())));
        drop(a1);
        assert_eq!(h.subscribed(), 2, "a still has a subscriber");
        drop(a2);
        assert_eq!(
            h.subscribed(),
            1,
            "last subscriber of a gone: entry removed"
        );
        drop(b);
        assert_eq!(h.subscribed(), 0);
    }
}
