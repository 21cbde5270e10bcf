//! Which nodes have ready endpoints of a Service, for `externalTrafficPolicy: Local`
//! (scenario S21: only nodes with a ready local endpoint campaign; with none anywhere
//! nobody announces).
//!
//! Two sources, as kube-vip reads them: `discovery.k8s.io/v1` EndpointSlices where the API
//! server serves them ([`endpointslice_v1_served`]), else core `v1` Endpoints (the lab's
//! v1.20 server only has `discovery.k8s.io/v1beta1`, whose node field differs). Readiness:
//! - Endpoints: an address in `subsets[].addresses` (never `notReadyAddresses`) whose
//!   `nodeName` is the node.
//! - EndpointSlice v1: an endpoint whose `conditions.ready` is not `false` (absent means
//!   ready, as the API documents: "unknown state ... should be interpreted as ready"), or
//!   whose `conditions.serving` is `true`, and whose `nodeName` is the node. Terminating
//!   endpoints have `ready: false`; those still `serving` (a Pod in its graceful shutdown
//!   that passes its readiness probe) count, as kube-proxy still sends them traffic for
//!   `externalTrafficPolicy: Local` when a node has no ready endpoint, so a rolling update
//!   does not drop the VIP before the new Pod is ready. Core Endpoints cannot tell
//!   terminating-but-serving addresses apart (they are in `notReadyAddresses`).
//!
//! Everything here is pure except [`endpointslice_v1_served`].

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

/// Label on an EndpointSlice naming its Service (`discovery.k8s.io/v1` `LabelServiceName`).
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A Service's endpoints in one of the two API forms.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EndpointSource<'a> {
    /// Core `v1` Endpoints (same name as the Service).
    Endpoints(&'a Endpoints),
    /// The Service's `discovery.k8s.io/v1` EndpointSlices (label
    /// [`SERVICE_NAME_LABEL`]); slices of other Services must be filtered out first, see
    /// [`slices_of_service`].
    Slices(&'a [EndpointSlice]),
}

impl EndpointSource<'_> {
    /// `node` has a ready endpoint.
    #[cfg(test)]
    pub(crate) fn ready_on(&self, node: &str) -> bool {
        match self {
            EndpointSource::Endpoints(e) => ready_local_endpoint_from_endpoints(e, node),
            EndpointSource::Slices(s) => ready_local_endpoint_from_slices(s, node),
        }
    }

    /// Any node (or an endpoint without a node name) has a ready endpoint.
    #[cfg(test)]
    pub(crate) fn any_ready(&self) -> bool {
        any_ready_endpoint(*self)
    }

    /// Names of the nodes with at least one ready endpoint, sorted (endpoints without
    /// `nodeName` are not counted).
    pub(crate) fn ready_nodes(&self) -> BTreeSet<String> {
        match self {
            EndpointSource::Endpoints(e) => ready_addresses(e)
                .filter_map(|a| a.node_name.clone())
                .collect(),
            EndpointSource::Slices(s) => ready_slice_endpoints(s)
                .filter_map(|ep| ep.node_name.clone())
                .collect(),
        }
    }
}

fn ready_addresses(
    e: &Endpoints,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::EndpointAddress> {
    e.subsets
        .iter()
        .flatten()
        .flat_map(|s| s.addresses.iter().flatten())
}

fn ready_slice_endpoints(slices: &[EndpointSlice]) -> impl Iterator<Item = &Endpoint> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|ep| counts(ep.conditions.as_ref()))
}

/// Whether an EndpointSlice endpoint with `conditions` counts as a local endpoint: ready
/// (or unknown), or terminating and still serving.
fn counts(conditions: Option<&k8s_openapi::api::discovery::v1::EndpointConditions>) -> bool {
    let Some(c) = conditions else {
        return true;
    };
    c.ready != Some(false) || c.serving == Some(true)
}

/// Core Endpoints: `node` has an address in `subsets[].addresses` (ready ones;
/// `notReadyAddresses` do not count).
pub(crate) fn ready_local_endpoint_from_endpoints(endpoints: &Endpoints, node: &str) -> bool {
    ready_addresses(endpoints).any(|a| a.node_name.as_deref() == Some(node))
}

/// EndpointSlice v1: `node` has an endpoint whose `conditions.ready` is not `false`, or
/// that is still `serving` (see the module docs).
pub(crate) fn ready_local_endpoint_from_slices(slices: &[EndpointSlice], node: &str) -> bool {
    ready_slice_endpoints(slices).any(|ep| ep.node_name.as_deref() == Some(node))
}

/// Core Endpoints: the addresses on `node`, ready (`addresses`) or not
/// (`notReadyAddresses`), unparsable ones skipped.
pub(crate) fn node_addresses_from_endpoints(endpoints: &Endpoints, node: &str) -> Vec<IpAddr> {
    endpoints
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            let ready = s.addresses.iter().flatten();
            ready.chain(s.not_ready_addresses.iter().flatten())
        })
        .filter(|a| a.node_name.as_deref() == Some(node))
        .filter_map(|a| a.ip.parse().ok())
        .collect()
}

/// EndpointSlice v1: the addresses of the endpoints on `node`, whatever their conditions.
pub(crate) fn node_addresses_from_slice(slice: &EndpointSlice, node: &str) -> Vec<IpAddr> {
    slice
        .endpoints
        .iter()
        .filter(|ep| ep.node_name.as_deref() == Some(node))
        .flat_map(|ep| ep.addresses.iter())
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// Some ready endpoint exists anywhere (also one without a node name).
#[cfg(test)]
pub(crate) fn any_ready_endpoint(source: EndpointSource<'_>) -> bool {
    match source {
        EndpointSource::Endpoints(e) => ready_addresses(e).next().is_some(),
        EndpointSource::Slices(s) => ready_slice_endpoints(s).next().is_some(),
    }
}

/// The slices among `slices` that belong to Service `name` in `namespace` (label
/// [`SERVICE_NAME_LABEL`]).
#[cfg(test)]
pub(crate) fn slices_of_service<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    namespace: &str,
    name: &str,
) -> Vec<EndpointSlice> {
    slices
        .into_iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .is_some_and(|n| n == name)
        })
        .cloned()
        .collect()
}

/// Whether the API server serves `discovery.k8s.io/v1` `endpointslices` (Kubernetes
/// 1.21+), asked through API discovery (`GET /apis/discovery.k8s.io/v1`). `false` when the
/// group version is missing (v1.20: only v1beta1) or discovery fails; the caller then
/// falls back to core Endpoints, which every server serves. Not retried; call once at
/// start.
pub(crate) async fn endpointslice_v1_served(client: &kube::Client) -> bool {
    match client.list_api_group_resources("discovery.k8s.io/v1").await {
        Ok(list) => list.resources.iter().any(|r| r.name == "endpointslices"),
        Err(e) => {
            tracing::info!(
                error = %e,
                "discovery.k8s.io/v1 not served; reading core v1 Endpoints"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset};
    use k8s_openapi::api::discovery::v1::EndpointConditions;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn addr(ip: &str, node: Option<&str>) -> EndpointAddress {
        EndpointAddress {
            ip: ip.into(),
            node_name: node.map(str::to_string),
            ..Default::default()
        }
    }

    fn endpoints(ready: Vec<EndpointAddress>, not_ready: Vec<EndpointAddress>) -> Endpoints {
        Endpoints {
            metadata: ObjectMeta::default(),
            subsets: Some(vec![
                EndpointSubset {
                    addresses: Some(ready),
                    not_ready_addresses: Some(not_ready),
                    ports: None,
                },
                EndpointSubset::default(),
            ]),
        }
    }

    fn ep(node: Option<&str>, ready: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec!["10.0.0.1".into()],
            node_name: node.map(str::to_string),
            conditions: Some(EndpointConditions {
                ready,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(ns: &str, svc: &str, eps: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), svc.to_string())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: eps,
            ports: None,
        }
    }

    #[test]
    fn core_endpoints_ready_only() {
        let e = endpoints(
            vec![addr("10.0.0.1", Some("node-a"))],
            vec![addr("10.0.0.2", Some("node-b"))],
        );
        assert!(ready_local_endpoint_from_endpoints(&e, "node-a"));
        assert!(
            !ready_local_endpoint_from_endpoints(&e, "node-b"),
            "not ready"
        );
        assert!(!ready_local_endpoint_from_endpoints(&e, "node-c"));
        let src = EndpointSource::Endpoints(&e);
        assert!(src.any_ready());
        assert_eq!(src.ready_nodes(), BTreeSet::from(["node-a".to_string()]));

        let only_not_ready = endpoints(vec![], vec![addr("10.0.0.2", Some("node-a"))]);
        assert!(!any_ready_endpoint(EndpointSource::Endpoints(
            &only_not_ready
        )));
        assert!(!EndpointSource::Endpoints(&only_not_ready).ready_on("node-a"));
        let empty = Endpoints::default();
        assert!(!any_ready_endpoint(EndpointSource::Endpoints(&empty)));
        // A ready address without nodeName counts as "some endpoint" but for no node.
        let nameless = endpoints(vec![addr("10.0.0.3", None)], vec![]);
        assert!(any_ready_endpoint(EndpointSource::Endpoints(&nameless)));
        assert!(
            EndpointSource::Endpoints(&nameless)
                .ready_nodes()
                .is_empty()
        );
    }

    #[test]
    fn slices_ready_condition() {
        let slices = vec![
            slice(
                "default",
                "web",
                vec![
                    ep(Some("node-a"), Some(true)),
                    ep(Some("node-b"), Some(false)),
                ],
            ),
            slice("default", "web", vec![ep(Some("node-c"), None)]),
        ];
        assert!(ready_local_endpoint_from_slices(&slices, "node-a"));
        assert!(
            !ready_local_endpoint_from_slices(&slices, "node-b"),
            "ready=false"
        );
        assert!(
            ready_local_endpoint_from_slices(&slices, "node-c"),
            "absent ready means ready"
        );
        let src = EndpointSource::Slices(&slices);
        assert_eq!(
            src.ready_nodes(),
            BTreeSet::from(["node-a".to_string(), "node-c".to_string()])
        );
        let no_conditions = vec![slice(
            "default",
            "web",
            vec![Endpoint {
                node_name: Some("node-a".into()),
                ..Default::default()
            }],
        )];
        assert!(EndpointSource::Slices(&no_conditions).ready_on("node-a"));

        let none_ready = vec![slice(
            "default",
            "web",
            vec![ep(Some("node-a"), Some(false))],
        )];
        assert!(!any_ready_endpoint(EndpointSource::Slices(&none_ready)));
        assert!(!any_ready_endpoint(EndpointSource::Slices(&[])));
    }

    #[test]
    fn terminating_but_serving_endpoints_count() {
        let cond = |ready, serving, terminating| EndpointConditions {
            ready,
            serving,
            terminating,
        };
        let ep_with = |node: &str, c: EndpointConditions| Endpoint {
            addresses: vec!["10.0.0.1".into()],
            node_name: Some(node.into()),
            conditions: Some(c),
            ..Default::default()
        };
        let slices = vec![slice(
            "default",
            "web",
            vec![
                // Rolling update: the old Pod terminates but still serves.
                ep_with("node-a", cond(Some(false), Some(true), Some(true))),
                // Terminating and no longer serving.
                ep_with("node-b", cond(Some(false), Some(false), Some(true))),
                // Not ready, not terminating (serving false: fails its probe).
                ep_with("node-c", cond(Some(false), Some(false), Some(false))),
                // Not ready with serving unknown.
                ep_with("node-d", cond(Some(false), None, None)),
            ],
        )];
        let src = EndpointSource::Slices(&slices);
        assert!(src.ready_on("node-a"), "terminating but serving counts");
        assert!(!src.ready_on("node-b"));
        assert!(!src.ready_on("node-c"));
        assert!(!src.ready_on("node-d"));
        assert_eq!(src.ready_nodes(), BTreeSet::from(["node-a".to_string()]));
        assert!(src.any_ready());
    }

    #[test]
    fn slices_filtered_by_service() {
        let all = vec![
            slice("default", "web", vec![ep(Some("node-a"), Some(true))]),
            slice("default", "db", vec![ep(Some("node-b"), Some(true))]),
            slice("other", "web", vec![ep(Some("node-c"), Some(true))]),
        ];
        let web = slices_of_service(&all, "default", "web");
        assert_eq!(web.len(), 1);
        let src = EndpointSource::Slices(&web);
        assert!(src.ready_on("node-a"));
        assert!(!src.ready_on("node-b") && !src.ready_on("node-c"));
    }

    /// Egress: every address on the node, ready or not, whatever the conditions; bad
    /// addresses skipped.
    #[test]
    fn node_addresses_ready_or_not() {
        let e = endpoints(
            vec![
                addr("10.0.0.1", Some("node-a")),
                addr("bogus", Some("node-a")),
            ],
            vec![
                addr("10.0.0.2", Some("node-a")),
                addr("10.0.0.3", Some("node-b")),
            ],
        );
        let want: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        assert_eq!(node_addresses_from_endpoints(&e, "node-a"), want);
        let s = slice(
            "default",
            "web",
            vec![
                ep(Some("node-a"), Some(false)),
                ep(Some("node-b"), Some(true)),
            ],
        );
        assert_eq!(node_addresses_from_slice(&s, "node-a").len(), 1);
        assert!(node_addresses_from_slice(&s, "node-c").is_empty());
    }
}
