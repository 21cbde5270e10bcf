//! Reflectors: a cache of one kind of object kept by a watch, with the client's back-off,
//! objects stripped before they are cached, and the watch's health reported to `/readyz`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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
        Duration::from_secs(crate::kube::client::SERVICES_WATCH_TIMEOUT_SECS.into()),
    );
    tokio::spawn(async move {
        // Watch errors (401/403 included, S15) retry with a capped exponential back-off
        // (crate::kube::client::WatchBackoff: 0.8 s doubling to 20 s, plus up to 25 %); each is logged with the resource and the
        // server's message, which for RBAC names the verb.
        // Objects are stripped to what vipd reads before they are cached (at 1000 Services,
        // managedFields alone were 7 MB of a node's memory).
        let mut stream = reflector::reflector(
            writer,
            watcher(
                api,
                fields
                    .map_or_else(watcher::Config::default, |f| {
                        watcher::Config::default().fields(&f)
                    })
                    .timeout(crate::kube::client::SERVICES_WATCH_TIMEOUT_SECS),
            )
            .modify(strip),
        )
        .backoff(crate::kube::client::WatchBackoff::default())
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

/// `kubectl apply` keeps a copy of the whole object in this annotation; vipd never reads it
/// (stripped before objects are cached).
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no cache of Services needs: managedFields, the selector, `kubectl apply`'s
/// copy of the object ([`LAST_APPLIED`]) and every label `keep` refuses (no labels left:
/// none at all). Annotations, the rest of the spec and the status stay.
pub fn strip_service(svc: &mut k8s_openapi::api::core::v1::Service, keep: impl Fn(&str) -> bool) {
    svc.metadata.managed_fields = None;
    if let Some(labels) = svc.metadata.labels.as_mut() {
        labels.retain(|k, _| keep(k));
    }
    if svc.metadata.labels.as_ref().is_some_and(|l| l.is_empty()) {
        svc.metadata.labels = None;
    }
    if let Some(spec) = svc.spec.as_mut() {
        spec.selector = None;
    }
    if let Some(a) = svc.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stripped_service_keeps_only_the_labels_asked_for() {
        let svc = || -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": "web",
                    "labels": {"implementation": "kube-vip", "app": "web"},
                    "annotations": {LAST_APPLIED: "{...}", "kube-vip.io/loadbalancerIPs": "192.0.2.10"},
                    "managedFields": [{"manager": "kubectl"}]
                },
                "spec": {"type": "LoadBalancer", "selector": {"app": "web"}}
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
        assert_eq!(kept.spec.as_ref().and_then(|s| s.selector.clone()), None);
        let annotations = kept.metadata.annotations.unwrap_or_default();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert!(annotations.contains_key("kube-vip.io/loadbalancerIPs"));
        let mut none = svc();
        strip_service(&mut none, |_| false);
        assert_eq!(none.metadata.labels, None);
    }
}
