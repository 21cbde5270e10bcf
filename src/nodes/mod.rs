//! Node objects: which addresses belong to which node (a VIP must never take a node's own
//! address: the holder would take that node's traffic), and the control-plane holder's
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

/// Keeps of a Node only its name, labels (this node's are matched against Services' node
/// selectors; the peer membership label [`crate::peer::MEMBER_LABEL`] is among them) and
/// `status.addresses` (a Node's status carries its image list, often tens of KiB).
pub fn strip_node(node: &mut Node) {
    let addresses = node.status.as_mut().and_then(|s| s.addresses.take());
    *node = Node {
        metadata: kube::api::ObjectMeta {
            name: node.metadata.name.take(),
            labels: node.metadata.labels.take(),
            resource_version: node.metadata.resource_version.take(),
            ..Default::default()
        },
        // The pod CIDRs (egress never translates traffic to them).
        spec: node
            .spec
            .take()
            .map(|sp| k8s_openapi::api::core::v1::NodeSpec {
                pod_cidr: sp.pod_cidr,
                pod_cidrs: sp.pod_cidrs,
                ..Default::default()
            }),
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses,
            ..Default::default()
        }),
    };
}
