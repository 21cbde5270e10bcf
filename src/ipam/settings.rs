//! The IPAM wing's own settings, composed by the configuration
//! (`crate::config::Config::ipam`).

use std::net::IpAddr;

use crate::kube::ObjectKey;
use crate::lease::Timing;

/// kube-vip-cloud-provider's ConfigMap name (`KUBEVIP_CONFIG_MAP`'s default).
pub const DEFAULT_CONFIG_MAP: &str = "kubevip";
/// kube-vip-cloud-provider's namespace (`KUBEVIP_NAMESPACE`'s default).
pub const DEFAULT_NAMESPACE: &str = "kube-system";
/// The Lease kube-vip-cloud-provider elects its one writer with (the cloud-provider
/// framework's `--leader-elect-resource-name`, `kube-vip-cloud-controller`); vipd's
/// allocator takes the same one, so the two never allocate at once.
pub const LEASE_NAME: &str = "kube-vip-cloud-controller";

/// What the IPAM wing reads of the node's configuration. Each field names the option it
/// comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where the API server is.
    pub kube: crate::kube::client::Settings,
    /// `vip_nodename`: this node's name (the Lease holder identity, Events).
    pub node_name: String,
    /// `KUBEVIP_NAMESPACE` / `KUBEVIP_CONFIG_MAP`: the ConfigMap with the pools.
    pub config_map: ObjectKey,
    /// The allocator's Lease: [`LEASE_NAME`] in the ConfigMap's namespace.
    pub lease: ObjectKey,
    /// `svc_leaseduration`, `svc_renewdeadline`, `svc_retryperiod`.
    pub timing: Timing,
    /// `svc_namespace`; `None`: Services of every namespace.
    pub services_namespace: Option<String>,
    /// `lb_class_only`.
    pub lb_class_only: bool,
    /// `lb_class_name`.
    pub lb_class_name: String,
    /// `address` with `cp_enable`: the control-plane VIPs, never handed out.
    pub control_plane: Vec<IpAddr>,
    /// `vip_servicesinterface`, else `vip_interface`: where an address is probed before it
    /// is handed out; `None`: the interface whose subnet holds it.
    pub interface: Option<String>,
}
