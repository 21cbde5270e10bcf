//! `status.loadBalancer.ingress` and the `kube-vip.io/vipHost` annotation: what vipd
//! writes and whether the Service already has it (pure).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, PortStatus, Service};

use crate::services::plan::model::{ANN_VIP_HOST, PortProto};

/// The ingress entries for the announced `addresses`: one per address, in the order given
/// (the first configured address first), each with every Service port (`port`,
/// `protocol`), as kube-vip writes them.
pub fn desired_ingress(addresses: &[IpAddr], ports: &[PortProto]) -> Vec<LoadBalancerIngress> {
    let ports: Vec<PortStatus> = ports
        .iter()
        .map(|p| PortStatus {
            port: p.port,
            protocol: p.protocol.clone(),
            error: None,
        })
        .collect();
    addresses
        .iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip.to_string()),
            ports: (!ports.is_empty()).then(|| ports.clone()),
            ..Default::default()
        })
        .collect()
}

/// The Service's current `status.loadBalancer.ingress` differs from `desired`, comparing
/// per entry, in order: `ip`, `hostname` and the (port, protocol) list. Fields vipd does
/// not write (`ipMode`, which newer servers default to `VIP`, and `ports[].error`) are
/// ignored, so a server-side default does not cause endless rewrites. No ingress and an
/// empty list are the same.
pub fn ingress_differs(current: &Service, desired: &[LoadBalancerIngress]) -> bool {
    ingress_differs_with(current, desired, true)
}

/// [`ingress_differs`], optionally ignoring `ports` (for servers that drop them).
pub fn ingress_differs_with(
    current: &Service,
    desired: &[LoadBalancerIngress],
    compare_ports: bool,
) -> bool {
    let cur = current_ingress(current);
    cur.len() != desired.len()
        || cur
            .iter()
            .zip(desired)
            .any(|(a, b)| !same_entry(a, b, compare_ports))
}

/// The Service's `status.loadBalancer.ingress` (empty when there is none).
pub(crate) fn current_ingress(svc: &Service) -> &[LoadBalancerIngress] {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default()
}

fn same_entry(a: &LoadBalancerIngress, b: &LoadBalancerIngress, compare_ports: bool) -> bool {
    let ports = |e: &LoadBalancerIngress| -> Vec<(i32, String)> {
        e.ports
            .iter()
            .flatten()
            .map(|p| (p.port, p.protocol.clone()))
            .collect()
    };
    a.ip == b.ip && a.hostname == b.hostname && (!compare_ports || ports(a) == ports(b))
}

/// The `kube-vip.io/vipHost` annotation of a Service.
pub fn vip_host_of(svc: &Service) -> Option<&str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_VIP_HOST))
        .map(String::as_str)
}
