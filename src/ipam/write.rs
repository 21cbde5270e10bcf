//! The allocator's writes ([`ServiceApi`]): every write is a JSON merge patch that carries
//! the `resourceVersion` the decision was made on, so the API server refuses it (409) when
//! the Service changed since: never a blind write.

use std::future::Future;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::kube::ObjectKey;
use crate::kube::events::{ApiError, Event, Recorder, Regarding, timed_as};
use crate::kube::service::{ANN_LOADBALANCER_IPS, ANN_SERVICE_INTERFACE, LABEL_IMPLEMENTATION};

/// What became of a conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written.
    Written,
    /// The Service changed since the decision (409) or is gone (404): decide again.
    Stale,
}

/// One conditional change of a Service (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Label `implementation=kube-vip`, annotation `kube-vip.io/loadbalancerIPs` = `addrs`
    /// joined with `,`, `spec.loadBalancerIP` = the first, and `kube-vip.io/serviceInterface`
    /// when `interface` is set (what kube-vip-cloud-provider writes, `syncLoadBalancer`).
    Allocate {
        /// Primary family first.
        addrs: Vec<IpAddr>,
        /// `interface-<namespace>` / `interface-global`.
        interface: Option<String>,
    },
    /// Removes the label, the annotation and `spec.loadBalancerIP`; `finalizers`, when
    /// `Some`, replaces the finalizer list (the load-balancer cleanup finalizer taken out).
    Release {
        /// The new finalizer list, if it changes.
        finalizers: Option<Vec<String>>,
    },
    /// Replaces the finalizer list (a Service being deleted: the load-balancer cleanup
    /// finalizer of a kube-vip-cloud-provider that is gone taken out).
    Finalizers(Vec<String>),
}

impl Change {
    /// The merge patch of this change, conditional on `resource_version`.
    pub fn patch(&self, resource_version: &str) -> Value {
        let (label, value) = LABEL_IMPLEMENTATION;
        match self {
            Change::Allocate { addrs, interface } => {
                let joined = addrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                let mut annotations = json!({ ANN_LOADBALANCER_IPS: joined });
                if let Some(i) = interface {
                    annotations[ANN_SERVICE_INTERFACE] = json!(i);
                }
                json!({
                    "metadata": {
                        "resourceVersion": resource_version,
                        "labels": { label: value },
                        "annotations": annotations,
                    },
                    "spec": { "loadBalancerIP": addrs.first().map(ToString::to_string) },
                })
            }
            Change::Release { finalizers } => {
                let mut patch = json!({
                    "metadata": {
                        "resourceVersion": resource_version,
                        "labels": { label: null },
                        "annotations": { ANN_LOADBALANCER_IPS: null },
                    },
                    "spec": { "loadBalancerIP": null },
                });
                if let Some(f) = finalizers {
                    patch["metadata"]["finalizers"] = json!(f);
                }
                patch
            }
            Change::Finalizers(f) => json!({
                "metadata": { "resourceVersion": resource_version, "finalizers": f },
            }),
        }
    }
}

/// The API side of the allocator: conditional writes and Events. The allocator's tests use
/// a fake.
pub trait ServiceApi: Send + Sync + 'static {
    /// Applies `change` to the Service `key` if it is still at `resource_version`.
    ///
    /// # Errors
    /// [`ApiError`] naming the Service when the request fails for any reason other than a
    /// conflict or a missing Service.
    fn write(
        &self,
        key: &ObjectKey,
        resource_version: &str,
        change: &Change,
    ) -> impl Future<Output = Result<WriteOutcome, ApiError>> + Send;

    /// Posts `event` about the Service `key` (uid `uid`); failures are logged by the
    /// recorder and otherwise ignored (an Event never holds up an allocation).
    fn event(&self, key: &ObjectKey, uid: &str, event: &Event) -> impl Future<Output = ()> + Send;
}

/// [`ServiceApi`] on the API server.
#[derive(Clone)]
pub struct KubeServiceApi {
    client: kube::Client,
    recorder: Recorder,
}

impl KubeServiceApi {
    /// Writes with `client`; Events as `node`.
    pub fn new(client: kube::Client, node: &str) -> Self {
        KubeServiceApi {
            recorder: Recorder::new(client.clone(), node),
            client,
        }
    }
}

impl ServiceApi for KubeServiceApi {
    async fn write(
        &self,
        key: &ObjectKey,
        resource_version: &str,
        change: &Change,
    ) -> Result<WriteOutcome, ApiError> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), &key.namespace);
        let patch = change.patch(resource_version);
        let pp = PatchParams::default();
        let op = match change {
            Change::Allocate { .. } => "allocate an address (merge patch)",
            Change::Release { .. } => "release its addresses (merge patch)",
            Change::Finalizers(_) => "remove the load-balancer cleanup finalizer (merge patch)",
        };
        let patch = Patch::Merge(&patch);
        let fut = api.patch(&key.name, &pp, &patch);
        match timed_as("Service", key, op, fut).await {
            Ok(_) => Ok(WriteOutcome::Written),
            Err(e) if e.is_not_found() || e.api_code() == Some(409) => Ok(WriteOutcome::Stale),
            Err(e) => Err(e),
        }
    }

    async fn event(&self, key: &ObjectKey, uid: &str, event: &Event) {
        let _ = self
            .recorder
            .write_event(
                Regarding::of::<Service>(),
                key,
                Some(uid.to_string()),
                event,
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_is_what_kube_vip_cloud_provider_writes_and_is_conditional() {
        let change = Change::Allocate {
            addrs: vec![
                "192.0.2.10".parse().unwrap(),
                "2001:db8::10".parse().unwrap(),
            ],
            interface: Some("eth1".into()),
        };
        assert_eq!(
            change.patch("42"),
            json!({
                "metadata": {
                    "resourceVersion": "42",
                    "labels": {"implementation": "kube-vip"},
                    "annotations": {
                        "kube-vip.io/loadbalancerIPs": "192.0.2.10,2001:db8::10",
                        "kube-vip.io/serviceInterface": "eth1"
                    }
                },
                "spec": {"loadBalancerIP": "192.0.2.10"}
            })
        );
    }

    #[test]
    fn a_release_clears_what_an_allocation_wrote() {
        let patch = Change::Release {
            finalizers: Some(vec![]),
        }
        .patch("7");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["metadata"]["labels"]["implementation"], Value::Null);
        assert_eq!(
            patch["metadata"]["annotations"]["kube-vip.io/loadbalancerIPs"],
            Value::Null
        );
        assert_eq!(patch["spec"]["loadBalancerIP"], Value::Null);
        assert_eq!(patch["metadata"]["finalizers"], json!([]));
    }
}
