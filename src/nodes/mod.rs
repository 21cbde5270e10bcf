//! Node objects: the process's one Node cache ([`start`], [`NodeCache`]: one list+watch
//! for every reader), which addresses belong to which node (a VIP must never take a node's
//! own address: the holder would take that node's traffic), and the control-plane holder's
//! `kube-vip.io/has-ip` label ([`label`], `enable_node_labeling`).

pub mod eligibility;
pub mod label;
pub mod selector;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

/// The pod CIDRs of every node (`spec.podCIDRs`, else `spec.podCIDR`; unparsable ones
/// skipped), sorted, without duplicates.
pub fn pod_cidrs(nodes: &[Arc<Node>]) -> Vec<ipnet::IpNet> {
    let mut out: Vec<ipnet::IpNet> = nodes
        .iter()
        .filter_map(|n| n.spec.as_ref())
        .flat_map(|sp| match &sp.pod_cidrs {
            Some(list) if !list.is_empty() => list.clone(),
            _ => sp.pod_cidr.clone().into_iter().collect(),
        })
        .filter_map(|c| c.parse::<ipnet::IpNet>().ok().map(|n| n.trunc()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every node's own addresses (`status.addresses` of type InternalIP / ExternalIP) and the
/// node they belong to.
pub fn node_addresses(nodes: &[Arc<Node>]) -> BTreeMap<IpAddr, String> {
    let mut out = BTreeMap::new();
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        for a in n.status.iter().flat_map(|s| s.addresses.iter().flatten()) {
            if (a.type_ == "InternalIP" || a.type_ == "ExternalIP")
                && let Ok(ip) = a.address.parse::<IpAddr>()
            {
                out.insert(ip, name.clone());
            }
        }
    }
    out
}

/// The process's one cache of Node objects ([`start`]): the Services wing, the allocator,
/// eligibility and the control-plane load balancer all read it.
pub type NodeCache = crate::kube::watch::SharedCache<Node>;

/// What the process's consumers need of the Node watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeScope {
    /// Only this node's Node object (eligibility alone: `cp_enable` without `lb_enable` or
    /// `svc_enable`): a watch with a field selector on its name.
    Own,
    /// Every Node (Services, the allocator, the load balancer's backends).
    All,
}

/// Starts the process's one list+watch of Nodes ([`NodeScope::All`], or only `node`'s with
/// [`NodeScope::Own`]) on `client` until `stop`, its objects stripped with [`strip_node`],
/// its health reported to `activity` as `nodes`. Errors and back-off: see
/// [`crate::kube::watch::spawn_shared`]. RBAC: `list` and `watch` on nodes.
pub fn start(
    client: kube::Client,
    scope: NodeScope,
    node: &str,
    activity: crate::obs::readiness::WatchActivity,
    stop: tokio_util::sync::CancellationToken,
) -> NodeCache {
    let fields = match scope {
        NodeScope::Own => Some(format!("metadata.name={node}")),
        NodeScope::All => None,
    };
    crate::kube::watch::spawn_shared(
        "nodes",
        kube::Api::<Node>::all(client),
        strip_node,
        fields,
        activity,
        stop,
        &[],
    )
}

/// The Node conditions a consumer reads: `Ready` (eligibility, the load balancer's
/// backends) and `NetworkUnavailable` (eligibility).
const CONDITIONS: [&str; 2] = ["Ready", "NetworkUnavailable"];

/// Keeps of a Node only what a reader of [`NodeCache`] reads (a Node's status carries its
/// image list, often tens of KiB; managedFields and other annotations are as large):
/// its name and labels (node selectors, [`eligibility::EXCLUDE_LABEL`], the peer membership
/// label [`crate::peer::MEMBER_LABEL`], the control-plane label of the load balancer), of
/// its annotations only [`eligibility::DRAIN_ANNOTATION`], `spec.podCIDR(s)` (egress) and
/// `spec.unschedulable` (cordon), `status.addresses` and of its conditions the type and
/// status of those in [`CONDITIONS`].
pub fn strip_node(node: &mut Node) {
    let status = node.status.take().unwrap_or_default();
    let conditions = status.conditions.map(|cs| {
        cs.into_iter()
            .filter(|c| CONDITIONS.contains(&c.type_.as_str()))
            .map(|c| k8s_openapi::api::core::v1::NodeCondition {
                type_: c.type_,
                status: c.status,
                ..Default::default()
            })
            .collect()
    });
    let annotations = node
        .metadata
        .annotations
        .take()
        .and_then(|mut a| a.remove_entry(eligibility::DRAIN_ANNOTATION))
        .map(|(k, v)| [(k, v)].into());
    *node = Node {
        metadata: kube::api::ObjectMeta {
            name: node.metadata.name.take(),
            labels: node.metadata.labels.take(),
            annotations,
            resource_version: node.metadata.resource_version.take(),
            ..Default::default()
        },
        spec: node
            .spec
            .take()
            .map(|sp| k8s_openapi::api::core::v1::NodeSpec {
                pod_cidr: sp.pod_cidr,
                pod_cidrs: sp.pod_cidrs,
                unschedulable: sp.unschedulable,
                ..Default::default()
            }),
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses: status.addresses,
            conditions,
            ..Default::default()
        }),
    };
}

#[cfg(test)]
mod tests;
