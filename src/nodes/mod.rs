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
        spec: None,
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses,
            ..Default::default()
        }),
    };
}
