//! The egress wing (kube-vip's `kube-vip.io/egress`, issue 30): the connections that a
//! Service's endpoints on this node open leave with the Service's VIP as source address
//! while this node holds the VIP, and with their usual address otherwise.
//!
//! The Services wing reports every Service with egress annotations, its VIPs and this
//! node's endpoints of it ([`crate::kube::service::EgressFacts`], through a watch channel
//! the manager wires); [`plan`] turns them into source NAT rules, and [`run`] keeps the
//! egress chains of vipd's fence table equal to them ([`crate::net::nft::egress`]). The
//! rules are installed on every node with endpoints of the Service and act only while the
//! node's fence for the VIP runs: a new holder's rules exist before it answers for the
//! VIP, and a killed or frozen vipd's rules stop with its fence.
//!
//! Needs the millisecond fence (`vip_nftfence`, on by default) and nf_tables NAT for the
//! `inet` family (Linux 5.2+).

pub mod metrics;
pub mod plan;
pub mod run;

use ipnet::IpNet;

pub use run::{Running, start};

/// What the egress wing reads of the node's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// `egress_podcidr`: the cluster's pod networks, never translated (traffic between
    /// pods keeps its addresses). Empty: the Nodes' `spec.podCIDRs`, else
    /// [`FALLBACK_POD_CIDR`] (kube-vip's discovery and fallback).
    pub pod_cidrs: Vec<IpNet>,
    /// `egress_servicecidr`: the cluster's Service networks, never translated. Empty:
    /// [`FALLBACK_SERVICE_CIDR`] (kube-vip's fallback; vipd does not read ServiceCIDR
    /// objects or kube-controller-manager's flags).
    pub service_cidrs: Vec<IpNet>,
    /// `egress_enableinternalsnat`: translate traffic to the pod and service CIDRs too
    /// (kube-vip `EnableInternalSNAT`).
    pub internal_snat: bool,
    /// The API server's address (`KUBERNETES_SERVICE_HOST` in a pod): denied for the
    /// Services annotated `kube-vip.io/egress-detect-api-server`. `None`: not known.
    pub api_server: Option<std::net::IpAddr>,
    /// The millisecond fence runs on this node (`vip_nftfence` on and its tables set up):
    /// without it egress is off (its rules act only through the fence's live sets) and
    /// each egress Service is reported once.
    pub fence: bool,
}

/// kube-vip's IPv4 pod CIDR when none is configured or discovered (pkg/services
/// `egress.go`).
pub const FALLBACK_POD_CIDR: &str = "10.0.0.0/16";
/// kube-vip's IPv4 service CIDR when none is configured or discovered.
pub const FALLBACK_SERVICE_CIDR: &str = "10.96.0.0/12";
