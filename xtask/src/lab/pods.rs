//! The pod namespaces of [`LabOptions::pods`](super::LabOptions::pods): one behind each
//! node, joined to it by a veth created from inside the node namespace with the peer moved
//! straight into the pod namespace (nothing in the root namespace), routed by the node.

use std::path::Path;

use super::error::{Result, io_ctx};
use super::process::ip;
use super::{ETH, Lab, NODES, POD_GATEWAY_V4, POD_GATEWAY_V6, POD_IF, netns};
use super::{node_ipv4, node_ipv6, pod_ipv4, pod_ipv6, pod_of};

/// Sysctls of a node namespace with pods: it routes its pod's traffic.
const NODE_FORWARDING: [&str; 2] = ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"];

impl Lab {
    /// Connects each node's pod and routes the pod addresses from `client`.
    pub(super) fn connect_pods(&self) -> Result<()> {
        for node in NODES {
            self.connect_pod(node)?;
            self.route_pod_from_client(node)?;
        }
        Ok(())
    }

    /// The veth `pod0` (node) / `eth0` (pod), the gateways on `pod0`, the pod's addresses,
    /// routes both ways, and forwarding in the node.
    fn connect_pod(&self, node: &str) -> Result<()> {
        let (Some(pod), Some(v4), Some(v6)) = (pod_of(node), pod_ipv4(node), pod_ipv6(node)) else {
            return Self::node_checked(node);
        };
        let node_ns = self.ns_name(node)?;
        let pod_ns = self.ns_name(pod)?;
        ip(&[
            "-n", &node_ns, "link", "add", POD_IF, "type", "veth", "peer", "name", ETH, "netns",
            &pod_ns,
        ])?;
        let (gw4, gw6) = (POD_GATEWAY_V4.to_string(), POD_GATEWAY_V6.to_string());
        let (v4, v6) = (format!("{v4}/32"), format!("{v6}/128"));
        let n = |args: &[&str]| ip(&[&["-n", node_ns.as_str()], args].concat()).map(drop);
        let p = |args: &[&str]| ip(&[&["-n", pod_ns.as_str()], args].concat()).map(drop);
        n(&[
            "addr",
            "add",
            &format!("{gw4}/32"),
            "scope",
            "link",
            "dev",
            POD_IF,
        ])?;
        n(&["addr", "add", &format!("{gw6}/64"), "dev", POD_IF, "nodad"])?;
        n(&["link", "set", POD_IF, "up"])?;
        n(&["route", "add", &v4, "dev", POD_IF])?;
        n(&["-6", "route", "add", &v6, "dev", POD_IF])?;
        p(&["link", "set", "lo", "up"])?;
        p(&["addr", "add", &v4, "dev", ETH])?;
        p(&["addr", "add", &v6, "dev", ETH, "nodad"])?;
        p(&["link", "set", ETH, "up"])?;
        p(&["route", "add", "default", "via", &gw4, "dev", ETH, "onlink"])?;
        p(&["-6", "route", "add", "default", "via", &gw6, "dev", ETH])?;
        let path = self.netns_path(node)?;
        netns::run_in_netns(&path, || -> Result<()> {
            for k in NODE_FORWARDING {
                let f = Path::new("/proc/sys").join(k);
                std::fs::write(&f, "1")
                    .map_err(io_ctx(format!("write {} in {node}", f.display())))?;
            }
            Ok(())
        })?
    }

    /// In `client`: the pod of `node` via `node`'s lab address, so replies to pod traffic
    /// that no one translated find their way back.
    fn route_pod_from_client(&self, node: &str) -> Result<()> {
        let client = self.ns_name("client")?;
        let pairs = [
            (
                pod_ipv4(node).map(|a| format!("{a}/32")),
                node_ipv4(node).map(|a| a.to_string()),
            ),
            (
                pod_ipv6(node).map(|a| format!("{a}/128")),
                node_ipv6(node).map(|a| a.to_string()),
            ),
        ];
        for (dst, via) in pairs {
            if let (Some(dst), Some(via)) = (dst, via) {
                ip(&["-n", &client, "route", "add", &dst, "via", &via, "dev", ETH])?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn pod_addresses_follow_their_node() {
        assert_eq!(pod_of("node-b"), Some("pod-b"));
        assert_eq!(pod_of("client"), None);
        assert_eq!(pod_ipv4("node-a"), Some(Ipv4Addr::new(198, 51, 100, 11)));
        assert_eq!(pod_ipv4("node-c"), Some(Ipv4Addr::new(198, 51, 100, 13)));
        assert_eq!(
            pod_ipv6("node-b"),
            Some(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x12))
        );
        assert_eq!(pod_ipv6("pod-a"), None);
    }
}
