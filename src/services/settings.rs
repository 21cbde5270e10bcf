//! The Services wing's own settings, composed by the configuration
//! (`crate::config::Config::services`) from kube-vip's and vipd's options.

use std::net::IpAddr;
use std::time::Duration;

use crate::lease::Timing;
use crate::net::VipSubnet;

use super::health::ServicesHealth;

/// What the Services wing reads of the node's configuration. Each field names the option
/// it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where the API server is (`k8s_config_file`, `kubernetes_addr`, `cp_enable`, `port`).
    pub kube: crate::kube::client::Settings,
    /// `vip_nodename`: this node's name, never empty.
    pub node_name: String,
    /// `vip_interface`; `None`: chosen per VIP.
    pub interface: Option<String>,
    /// `cp_enable`: the control-plane VIPs (`addresses`) are refused to Services.
    pub control_plane: bool,
    /// `address`: the control-plane VIPs.
    pub addresses: Vec<IpAddr>,
    /// `vip_servicesinterface`: the interface of Service VIPs, if other than
    /// `vip_interface`.
    pub services_interface: Option<String>,
    /// `vip_subnet`: prefix lengths of VIPs.
    pub vip_subnet: VipSubnet,
    /// `vip_arpRate`: gratuitous ARP repeat interval.
    pub arp_rate: Duration,
    /// `vip_nftfence` not false: fence every VIP in nftables too, to the millisecond.
    pub nft_fence: bool,
    /// `cp_namespace`: where the peer key Secret is (`svc_ridethrough`) and the global
    /// Services lease lives.
    pub cp_namespace: String,
    /// `svc_leaseduration`, `svc_renewdeadline`, `svc_retryperiod`.
    pub services_timing: Timing,
    /// `svc_election`: one lease per Service.
    pub services_election: bool,
    /// `svc_leaseshards` (with `svc_election`): Services share this many shard leases
    /// (`crate::services::plan::desired::Shards`); 0: one lease per Service.
    pub services_lease_shards: u16,
    /// `svc_ipv6_loopback`: IPv6 Service VIPs on `lo` as local routes, their neighbour solicitations
    /// answered by vipd, where the nftables fence runs (docs/design.md "IPv6 VIPs on lo").
    pub services_ipv6_loopback: bool,
    /// `svc_ridethrough`: ride through API outages with the peer protocol.
    pub services_ride_through: bool,
    /// Whether `svc_ridethrough` was given: only then does a ride-through that cannot start
    /// (no Services interface, no socket) stop the wing; defaulted, it warns and runs
    /// without.
    pub services_ride_through_set: bool,
    /// `svc_leasename`: the global Services lease.
    pub services_lease_name: String,
    /// `svc_namespace`; `None`: all namespaces.
    pub services_namespace: Option<String>,
    /// `svc_subnet_check`: campaign only for Services inside one of the node's subnets.
    pub services_subnet_check: bool,
    /// `enable_service_security` (kube-vip's `--onlyAllowTrafficServicePorts`): only the
    /// Services' own ports (and UDP 68, the DHCP client's) reach the VIPs this node
    /// announces; everything else to them is dropped ([`super::security`]).
    pub service_security: bool,
    /// `svc_healthcheck`, `svc_healthcheck_hold`.
    pub services_health: ServicesHealth,
    /// `svc_failback_holddown` with `svc_failback`; `None`: off.
    pub services_failback: Option<Duration>,
    /// `vip_routingtable` and its settings: the holders route the VIPs instead of binding
    /// them ([`crate::net::route_kernel`]); `None`: addresses, ARP/NDP.
    pub routing_table: Option<crate::net::route_kernel::RouteMode>,
    /// Routing-table mode without election (`vip_routingtable=true`, `svc_election=false`,
    /// `vip_leaderelection=false`, kube-vip's `ServicesNoLeader`): every node that may
    /// serve a Service routes its addresses
    /// (`crate::services::plan::desired::Mode::Unelected`). Never with ARP/NDP.
    pub services_unelected: bool,
    /// `lb_class_only`.
    pub lb_class_only: bool,
    /// `lb_class_name`.
    pub lb_class_name: String,
}
