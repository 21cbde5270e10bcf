//! The Services runtime's watches: reflectors on Services, Nodes and Endpoints /
//! EndpointSlices (stripped of what vipd never reads), and the endpoint cache in whichever
//! API form the server offers.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;

use super::endpoints::{
    SERVICE_NAME_LABEL, node_addresses_from_endpoints, node_addresses_from_slice,
    ready_local_endpoint_from_endpoints, ready_local_endpoint_from_slices,
};
use crate::services::plan::model::ServiceKey;

/// Drops managedFields and annotations from core Endpoints or an EndpointSlice (subsets,
/// endpoints and the slice's labels, which name its Service, stay).
pub(crate) fn strip_metadata<K: kube::Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
}

/// The endpoint cache, in whichever API form the server offers.
pub(super) enum EndpointStore {
    Endpoints(Store<Endpoints>),
    Slices(Store<EndpointSlice>),
}

impl EndpointStore {
    /// Resolves once the first full list is in (see `Store::wait_until_ready`).
    pub(super) async fn wait_until_ready(&self) {
        let _ = match self {
            EndpointStore::Endpoints(s) => s.wait_until_ready().await,
            EndpointStore::Slices(s) => s.wait_until_ready().await,
        };
    }

    /// The `externalTrafficPolicy: Local` Services among `services` that no node has a
    /// ready endpoint of (endpoints without a node name count for no node): announced
    /// nowhere (S21).
    pub(super) fn without_ready_endpoint(&self, services: &[Arc<Service>]) -> HashSet<ServiceKey> {
        let with = self.services_with(
            |e| {
                !super::endpoints::EndpointSource::Endpoints(e)
                    .ready_nodes()
                    .is_empty()
            },
            |s| {
                !super::endpoints::EndpointSource::Slices(std::slice::from_ref(s))
                    .ready_nodes()
                    .is_empty()
            },
        );
        services
            .iter()
            .filter(|s| {
                s.spec
                    .as_ref()
                    .and_then(|sp| sp.external_traffic_policy.as_deref())
                    == Some("Local")
            })
            .map(|s| ServiceKey::of(&**s))
            .filter(|k| !with.contains(&(k.namespace.clone(), k.name.clone())))
            .collect()
    }

    /// Services (namespace, name) with a ready endpoint on `node`.
    pub(super) fn local_ready(&self, node: &str) -> HashSet<(String, String)> {
        self.services_with(
            |e| ready_local_endpoint_from_endpoints(e, node),
            |s| ready_local_endpoint_from_slices(std::slice::from_ref(s), node),
        )
    }

    /// Per Service (namespace, name) of `wanted`, the addresses of its endpoints on `node`,
    /// ready or not (for egress), sorted and without duplicates; Services with none are
    /// absent. Core Endpoints are looked up by name; slices are scanned.
    pub(super) fn node_addresses(
        &self,
        node: &str,
        wanted: &HashSet<(String, String)>,
    ) -> HashMap<(String, String), Vec<IpAddr>> {
        let mut out: HashMap<(String, String), Vec<IpAddr>> = HashMap::new();
        match self {
            EndpointStore::Endpoints(store) => {
                for (ns, name) in wanted {
                    let r = kube::runtime::reflector::ObjectRef::new(name).within(ns);
                    if let Some(e) = store.get(&r) {
                        let a = node_addresses_from_endpoints(&e, node);
                        out.insert((ns.clone(), name.clone()), a);
                    }
                }
            }
            EndpointStore::Slices(store) => {
                for s in store.state() {
                    let Some(svc) = s
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    else {
                        continue;
                    };
                    let key = (
                        s.metadata.namespace.clone().unwrap_or_default(),
                        svc.clone(),
                    );
                    if wanted.contains(&key) {
                        out.entry(key)
                            .or_default()
                            .extend(node_addresses_from_slice(&s, node));
                    }
                }
            }
        }
        out.retain(|_, v| {
            v.sort();
            v.dedup();
            !v.is_empty()
        });
        out
    }

    /// Services (namespace, name) whose Endpoints object (or one of whose EndpointSlices,
    /// by their `kubernetes.io/service-name` label) passes the predicate for its API form.
    fn services_with(
        &self,
        endpoints: impl Fn(&Endpoints) -> bool,
        slice: impl Fn(&EndpointSlice) -> bool,
    ) -> HashSet<(String, String)> {
        match self {
            EndpointStore::Endpoints(store) => store
                .state()
                .iter()
                .filter(|e| endpoints(e))
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
                .filter(|s| slice(s))
                .filter_map(|s| {
                    let svc = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
                    Some((s.metadata.namespace.clone().unwrap_or_default(), svc))
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::watch::LAST_APPLIED;
    use crate::nodes::{node_addresses, strip_node};
    use crate::services::endpoints::SERVICE_NAME_LABEL;
    use crate::services::plan::model;
    use k8s_openapi::api::core::v1::Node;

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
        svc.metadata.labels = Some(
            [
                ("app".to_string(), "web".to_string()),
                ("implementation".to_string(), "kube-vip".to_string()),
            ]
            .into(),
        );
        crate::kube::service::strip_cached_service(&mut svc);
        assert_eq!(svc.metadata.managed_fields, None);
        // Of the labels only the allocator's (kube-vip-cloud-provider's implementation).
        assert_eq!(
            svc.metadata.labels,
            Some([("implementation".to_string(), "kube-vip".to_string())].into())
        );
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
        assert_eq!(
            node.metadata.labels,
            Some([("a".to_string(), "b".to_string())].into()),
            "labels are matched against node selectors"
        );
        assert_eq!(node.status.as_ref().and_then(|s| s.images.as_ref()), None);
        assert_eq!(
            node_addresses(&[Arc::new(node)]).get(&"192.0.2.21".parse().unwrap()),
            Some(&"node-a".to_string())
        );
    }
}
