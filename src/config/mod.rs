//! Configuration: kube-vip compatible flags and environment variables -> one typed,
//! validated, immutable [`Config`].
//!
//! # Sources and precedence (kube-vip's)
//!
//! kube-vip parses its cobra flags first and then overwrites them from the environment
//! (`ParseEnvironment`), and an optional `--config-file` only fills what is still unset.
//! vipd keeps that order, per setting:
//!
//! 1. the environment variable (kube-vip's name, e.g. `vip_leaseduration`), when set to a
//!    non-empty value (kube-vip tests `os.Getenv(..) != ""`; `lb_class_name` is the one
//!    exception where an empty value counts, as kube-vip uses `LookupEnv` for it);
//! 2. the command-line flag (kube-vip's name, e.g. `--leaseDuration`), when given, even
//!    with an empty value (`--prometheusHTTPServer=` disables the metrics server);
//! 3. the YAML config file (keys are the environment variable names, values strings,
//!    numbers or booleans), when the key is present with a non-empty value;
//! 4. the default in [`env_names`].
//!
//! clap's own `env` attribute would give flag > environment, so it is deliberately not used;
//! [`resolve`] implements the order above as a pure function of its inputs.
//!
//! # Deviations from kube-vip (all on purpose)
//!
//! - vipd only does ARP/NDP announcement under leader election: `vip_arp` and
//!   `vip_leaderelection` default to `true`, and setting either to false is an error
//!   (kube-vip defaults both to false, which in ARP mode lets every node answer for the VIP).
//! - kube-vip reads `svc_election`, `svc_leasename`, `svc_namespace`, `lb_class_only` and
//!   `lb_class_name` from the environment only when `svc_enable` is also set in the
//!   environment; vipd always reads them, and warns when they are set without `svc_enable`.
//! - `address` must hold IP addresses; kube-vip also resolves DNS names (`dns_mode`), vipd
//!   refuses them with an error.
//! - The lease timings accept decimals (`2.5`), kube-vip only whole seconds.
//! - `k8s_config_file` has no default (kube-vip: `/etc/kubernetes/admin.conf`); see
//!   [`Config::kubeconfig`].
//! - The config file's keys are the environment variable names (kube-vip's own file uses its
//!   Go struct's field names); unknown keys are an error, not ignored.
//!
//! # kube-vip options vipd does not implement
//!
//! Options that would change behaviour are refused at start with
//! [`ConfigError::Unsupported`] naming every one that is set ([`OptionKind::Refused`]):
//! BGP (`bgp_enable`, every `bgp_*`, `zebra_*`, `mpbgp_*`, `annotation`), WireGuard
//! (`vip_wireguard`), egress (`egress_podcidr`,
//! `egress_servicecidr`, `egress_clean`), dynamic DNS (`vip_ddns`),
//! UPnP (`enable_upnp`), `disable_service_updates`,
//! `enable_endpointslices`, `mirror_dest_interface`, `health_check_port`, `cp_detect`,
//! `vip_singlenode`, `vip_startleader`, `vip_interfaceloglobal`,
//! `lb_class_legacy_handling=false`, and the Equinix Metal (`vip_packet*`,
//! `provider_config`) settings.
//!
//! Harmless ones are accepted and ignored with a warning ([`OptionKind::Ignored`]):
//! `dhcp_mode` (kube-vip: the address family dynamic DNS asks DHCP for; a Service whose
//! address is `0.0.0.0` / `::` uses DHCP with no option, in kube-vip and in vipd),
//! `dns_mode` (silent when `first`, kube-vip's default),
//! `iptables_backend`, `backend_health_check_interval`, `egress_withnftables`,
//! `vip_leaseannotations`, `vip_configmap`, `enable_endpoints`. `backend_health_check_interval`
//! is kube-vip's IPVS health-check interval; vipd's load balancer (`lb_enable`) checks every
//! second ([`crate::controlplane::lb::health::INTERVAL`]).

use crate::net::VipSubnet;
use crate::services::plan::model::DEFAULT_LB_CLASS_NAME;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::lease::Timing;

/// Default `vip_leaseduration`: 3 s (kube-vip's is 5 s). The shortest lease that keeps one
/// lease write per second (retry period 1 s) and room for a whole-second kernel fence
/// (2 s) below it; the failover benchmark (`docs/failover.md`) measured a poweroff p95 gap
/// of about 3.0 s at 3/2/1 against 5.2 s at 5/3/1. kube-vip manifests set all three
/// timings explicitly and keep their values.
pub(crate) const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(3);
/// Default `vip_renewdeadline`: 2 s (kube-vip's is 3 s).
pub(crate) const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(2);
/// Default `vip_retryperiod` (kube-vip's: 1 s).
pub(crate) const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(1);
/// Largest accepted lease timing (any of the three): 1 hour.
pub(crate) const MAX_LEASE_TIMING: Duration = Duration::from_secs(3600);
/// Shortest accepted retry period (`vip_retryperiod`, `svc_retryperiod`): 100 ms, half the
/// fast profile's. One lease write per retry period is the cost of a lease; a typo such as
/// `0.001` for `1` would have the holder write as fast as the API server answers.
pub(crate) const MIN_RETRY_PERIOD: Duration = Duration::from_millis(100);
/// client-go's `JitterFactor`: `NewLeaderElector` requires
/// `renew_deadline > JITTER_FACTOR * retry_period`.
pub(crate) const LEADER_ELECTION_JITTER_FACTOR: f64 = 1.2;
/// Default `vip_arpRate`: 3000 ms (kube-vip's).
pub(crate) const DEFAULT_ARP_RATE: Duration = Duration::from_millis(3000);
/// Default `vip_arpprobe`: 50 ms (see [`crate::holder::DEFAULT_PROBE_WINDOW`]).
pub(crate) const DEFAULT_ARP_PROBE: Duration = crate::holder::DEFAULT_PROBE_WINDOW;
/// Longest `vip_arpprobe`: 1 s (a probe delays failover by its whole window).
pub(crate) const MAX_ARP_PROBE: Duration = Duration::from_secs(1);
/// Smallest accepted `vip_arpRate` (100 ms): faster repeats only flood the segment.
pub(crate) const MIN_ARP_RATE: Duration = Duration::from_millis(100);
/// Largest accepted `vip_arpRate` (1 hour).
pub(crate) const MAX_ARP_RATE: Duration = Duration::from_secs(3600);
/// Default `port` (the API server port): 6443.
pub(crate) const DEFAULT_PORT: u16 = 6443;
/// Default `vip_leasename`.
pub(crate) const DEFAULT_LEASE_NAME: &str = "plndr-cp-lock";
/// Default `svc_leasename`.
pub(crate) const DEFAULT_SERVICES_LEASE_NAME: &str = "plndr-svcs-lock";
/// Default `cp_namespace`.
pub(crate) const DEFAULT_NAMESPACE: &str = "kube-system";
/// Default `prometheus_server` (`host:port`, empty host = all addresses).
pub(crate) const DEFAULT_PROMETHEUS_SERVER: &str = ":2112";
/// Default IPv4 VIP prefix length.
pub(crate) const DEFAULT_V4_PREFIX: u8 = 32;
/// Default IPv6 VIP prefix length.
pub(crate) const DEFAULT_V6_PREFIX: u8 = 128;

mod args;
mod options;
mod parse;
mod resolve;

pub use args::{ManagerArgs, RefusedFlags, RoutedArgs};
pub use options::{EnvOption, OptionKind, RefuseWhen, ValueType, env_names, option};
use options::{K_CONFIG_FILE, K_NODE_NAME};
pub use resolve::{
    Resolved, resolve, resolve_detailed, routed_settings, routed_settings_from_process,
};

// ---------------------------------------------------------------------------------------
// Types the rest of the crate codes against.
// ---------------------------------------------------------------------------------------

/// Log level (`vip_loglevel`, kube-vip uses logrus numbers 0..=6; names also accepted).
///
/// logrus numbers: 0 panic, 1 fatal, 2 error (all three map to [`LogLevel::Error`]),
/// 3 warn, 4 info (kube-vip's default), 5 debug, 6 trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// logrus 0..=2, `error`.
    Error,
    /// logrus 3, `warn`.
    Warn,
    /// logrus 4, `info` (default).
    Info,
    /// logrus 5, `debug`.
    Debug,
    /// logrus 6, `trace`.
    Trace,
}

impl LogLevel {
    /// The matching `tracing` level filter.
    pub fn as_tracing(self) -> tracing::level_filters::LevelFilter {
        use tracing::level_filters::LevelFilter;
        match self {
            LogLevel::Error => LevelFilter::ERROR,
            LogLevel::Warn => LevelFilter::WARN,
            LogLevel::Info => LevelFilter::INFO,
            LogLevel::Debug => LevelFilter::DEBUG,
            LogLevel::Trace => LevelFilter::TRACE,
        }
    }
}

/// The validated configuration of `vipd manager`.
///
/// Built only by [`resolve`] / [`resolve_detailed`] / [`Config::from_process`]; there are
/// no setters, treat it as immutable.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `vip_nodename` / `--nodeName`; default: hostname, lower-cased. Never empty.
    pub node_name: String,
    /// `vip_interface` / `--interface`; `None` = choose automatically per VIP.
    pub interface: Option<String>,
    /// `address` (comma list, IPv4 and IPv6; `vip_address` deprecated alias).
    pub addresses: Vec<IpAddr>,
    /// `vip_subnet` / `--vipSubnet` (also `vip_cidr`).
    pub vip_subnet: VipSubnet,
    /// `port` (default 6443): the API server port of the control plane.
    pub port: u16,
    /// `vip_arp` / `--arp`.
    pub arp: bool,
    /// `vip_arpRate` in milliseconds (default 3000): GARP repeat interval.
    pub arp_rate: Duration,
    /// `vip_arpprobe` in milliseconds (vipd's own, default 50, 0..=1000): the address conflict
    /// probe window (RFC 5227); zero turns conflict detection off.
    pub arp_probe: Duration,
    /// `cp_enable` / `--controlplane`.
    pub control_plane: bool,
    /// `svc_enable` / `--services`.
    pub services: bool,
    /// `vip_leaderelection` / `--leaderElection`: always `true` with `cp_enable` (false is
    /// refused); without it, `false` is accepted and has no effect (Service leases are
    /// always elected), except in routing-table mode with `svc_election=false`, where it
    /// means no election at all ([`Config::services_unelected`]).
    pub leader_election: bool,
    /// Control-plane lease (`vip_leasename`, `cp_namespace`, timings).
    pub lease: crate::lease::LeaseConfig,
    /// Timings of Service leases (per-Service and global): `svc_leaseduration`,
    /// `svc_renewdeadline`, `svc_retryperiod` (vipd options, each defaulting to its `vip_*`
    /// twin). Every held Service lease is written once per retry period.
    pub services_timing: Timing,
    /// `svc_election` / `--servicesElection`.
    pub services_election: bool,
    /// `svc_leaseshards` / `--servicesLeaseShards` (vipd option, with `svc_election`): the
    /// number of shard leases Services share; 0 (default): one lease per Service.
    pub services_lease_shards: u16,
    /// `svc_ipv6_loopback` / `--servicesIPv6Loopback` (vipd option, default false): IPv6
    /// Service VIPs on `lo` as local routes, their neighbour solicitations answered by vipd
    /// ([`crate::net::nd_responder`]), where the nftables fence runs.
    pub services_ipv6_loopback: bool,
    /// `svc_ridethrough` / `--servicesRideThrough` (vipd option): Service VIPs ride through
    /// API server outages with the peer protocol ([`crate::peer`]); the key comes from the
    /// Secret [`crate::kube::api::PEER_KEY_SECRET`] in `cp_namespace`.
    pub services_ride_through: bool,
    /// Whether `svc_ridethrough` was given (rather than its default, on where the Service
    /// lease timings fit): given, a ride-through that cannot start stops the manager;
    /// defaulted, vipd warns once and runs without it.
    pub services_ride_through_set: bool,
    /// `svc_ipam` / `--servicesIPAM` (vipd option, default true, with `svc_enable`): the
    /// pool ConfigMap (`KUBEVIP_NAMESPACE`/`KUBEVIP_CONFIG_MAP`, default
    /// `kube-system/kubevip`) the allocator reads; `None`: no allocation.
    pub ipam: Option<crate::kube::ObjectKey>,
    /// `svc_leasename` (default `plndr-svcs-lock`).
    pub services_lease_name: String,
    /// `svc_namespace`; `None` = all namespaces.
    pub services_namespace: Option<String>,
    /// `lb_class_only`.
    pub lb_class_only: bool,
    /// `lb_class_name` (default `kube-vip.io/kube-vip-class`).
    pub lb_class_name: String,
    /// `vip_servicesinterface`.
    pub services_interface: Option<String>,
    /// `svc_subnet_check` (vipd option, default true): a node campaigns for a Service only
    /// when its own subnets contain every address of the Service.
    pub services_subnet_check: bool,
    /// `enable_service_security` / `--onlyAllowTrafficServicePorts` (default false): only
    /// the Services' own ports reach their VIPs on the announcing node
    /// ([`crate::services::Settings::service_security`]).
    pub service_security: bool,
    /// `egress_podcidr`, `egress_servicecidr` (kube-vip's egress options): networks the
    /// egress wing never translates ([`crate::egress::Settings`]).
    pub egress: crate::egress::Settings,
    /// `prometheus_server` (default `:2112`); `None` when set to empty (disabled). Only
    /// addresses the admin endpoint can bind: `:port`, `localhost:port`, an IPv4 address or
    /// `[IPv6]:port` (see [`crate::syntax::ListenAddr`]).
    pub prometheus_server: Option<crate::syntax::ListenAddr>,
    /// `k8s_config_file` / `--k8sConfigPath`; `None` = in-cluster / default kubeconfig.
    ///
    /// Note: kube-vip defaults this to `/etc/kubernetes/admin.conf`, and kube-vip static pod
    /// manifests rely on that default; the client builder should try that path when this is
    /// `None`, `control_plane` is set and no in-cluster config exists.
    pub kubeconfig: Option<PathBuf>,
    /// `kubernetes_addr`: explicit API server address (`host:port`), overrides the
    /// kubeconfig's server. Control-plane mode falls back to `127.0.0.1:<port>`.
    pub kubernetes_addr: Option<String>,
    /// `dhcp_backoff_attempts` / `--dhcpBackoffAttempts`: a Service's DHCP client gives up
    /// after this many failed attempts in a row ([`crate::dhcp::DhcpState::GaveUp`]); 0
    /// (vipd's default; kube-vip's is 3) retries forever.
    pub dhcp_backoff_attempts: u32,
    /// `vip_ipv6_dad` (vipd's own, default false): run IPv6 duplicate address detection
    /// on VIPs. Off by default: the lease and the kernel fence already ensure one holder
    /// among vipd nodes, and DAD delays every IPv6 failover by 1-2 s (scenario S26).
    pub ipv6_dad: bool,
    /// `vip_nftfence` (vipd's own; unset: on wherever the kernel supports it): fence every
    /// VIP in nftables to the millisecond as well as by the address lifetime
    /// ([`crate::net::nft::fence`]).
    pub nft_fence: crate::net::nft::fence::NftFenceSetting,
    /// `vip_routingtable` (with `vip_routingtableid`, `vip_routingtabletype`,
    /// `vip_routingprotocol`, `vip_cleanroutingtable`): routing-table mode: each VIP is a
    /// fenced host route in that table ([`crate::net::route_kernel`]) instead of an address
    /// bound and announced on the segment; a Service's from its lease holder, or from every
    /// node that may serve it ([`Config::services_unelected`]); the control-plane VIP from
    /// every node whose own API server is healthy, without election. `None`: off (the
    /// default).
    pub routing_table: Option<crate::net::route_kernel::RouteMode>,
    /// `enable_node_labeling`: with `cp_enable`, the control-plane lease holder labels its
    /// own Node `kube-vip.io/has-ip=<first address>` ([`crate::nodes::label`]).
    pub enable_node_labeling: bool,
    /// `drain_on_cordon` and `svc_exclude_cordoned` (vipd options): what a cordon means for
    /// eligibility ([`crate::nodes::eligibility`]).
    pub eligibility: crate::nodes::eligibility::EligibilityRules,
    /// `svc_healthcheck` and `svc_healthcheck_hold` (vipd options): the data-path check of
    /// Service VIP holders ([`crate::services::health`]).
    pub services_health: crate::services::health::ServicesHealth,
    /// `svc_failback` and `svc_failback_holddown` (vipd options): the hold-down of fail-back
    /// to more preferred nodes ([`crate::election::failback`]); `None` (the default): off.
    pub services_failback: Option<Duration>,
    /// `lb_enable` / `--enableLoadBalancer`, `lb_port`, `lb_fwdmethod`: control-plane load
    /// balancing ([`crate::controlplane::lb`]); `None` when `lb_enable` is off.
    pub load_balancer: Option<crate::controlplane::lb::LoadBalancerConfig>,
    /// `vip_loglevel`.
    pub log_level: LogLevel,
}

/// [`Config::services_unelected`] from its three settings, for the resolver too (which
/// decides the Service timings and ride-through by it before the `Config` exists).
pub(crate) fn services_unelected(
    routing_table: bool,
    services_election: bool,
    leader_election: bool,
) -> bool {
    routing_table && !services_election && !leader_election
}

impl Config {
    /// Whether this vipd announces VIP addresses on the segment (outside routing-table
    /// mode): only then do the ARP flux guard and the nftables fence have anything to do. In
    /// routing-table mode a VIP is a host route whose lifetime fences it (docs/design.md,
    /// "The route fence"; the control-plane VIP's loopback address carries the same
    /// lifetime and is never announced). The manager and `vipd preflight` ask this one
    /// question.
    pub fn binds_addresses(&self) -> bool {
        self.routing_table.is_none() && (self.control_plane || self.services)
    }

    /// The control-plane wing's settings.
    pub fn controlplane(&self) -> crate::controlplane::Settings {
        crate::controlplane::Settings {
            node_name: self.node_name.clone(),
            interface: self.interface.clone(),
            addresses: self.addresses.clone(),
            vip_subnet: self.vip_subnet,
            port: self.port,
            arp_rate: self.arp_rate,
            lease: self.lease.clone(),
            enable_node_labeling: self.enable_node_labeling,
            load_balancer: self.load_balancer.clone(),
        }
    }

    /// Whether Services are routed without election: routing-table mode with
    /// `svc_election=false` and `vip_leaderelection=false` (kube-vip's `ServicesNoLeader`,
    /// `pkg/manager/worker/table.go`): every node that may serve a Service routes it.
    /// Elsewhere `vip_leaderelection=false` changes nothing for Services (ARP/NDP always
    /// elects one holder per address).
    pub fn services_unelected(&self) -> bool {
        services_unelected(
            self.routing_table.is_some(),
            self.services_election,
            self.leader_election,
        )
    }

    /// The Services wing's settings.
    pub fn services(&self) -> crate::services::Settings {
        crate::services::Settings {
            kube: self.kube(),
            node_name: self.node_name.clone(),
            interface: self.interface.clone(),
            control_plane: self.control_plane,
            addresses: self.addresses.clone(),
            services_interface: self.services_interface.clone(),
            vip_subnet: self.vip_subnet,
            arp_rate: self.arp_rate,
            nft_fence: self.nft_fence.wanted(),
            cp_namespace: self.lease.namespace.clone(),
            services_timing: self.services_timing,
            services_election: self.services_election,
            services_lease_shards: self.services_lease_shards,
            services_ipv6_loopback: self.services_ipv6_loopback,
            services_ride_through: self.services_ride_through,
            services_ride_through_set: self.services_ride_through_set,
            services_lease_name: self.services_lease_name.clone(),
            services_namespace: self.services_namespace.clone(),
            services_subnet_check: self.services_subnet_check,
            service_security: self.service_security,
            services_health: self.services_health.clone(),
            services_failback: self.services_failback,
            routing_table: self.routing_table,
            services_unelected: self.services_unelected(),
            lb_class_only: self.lb_class_only,
            lb_class_name: self.lb_class_name.clone(),
        }
    }

    /// The IPAM wing's settings; `None` when allocation is off.
    pub fn ipam(&self) -> Option<crate::ipam::Settings> {
        let config_map = self.ipam.clone()?;
        Some(crate::ipam::Settings {
            kube: self.kube(),
            node_name: self.node_name.clone(),
            lease: crate::kube::ObjectKey::new(&config_map.namespace, crate::ipam::LEASE_NAME),
            config_map,
            timing: self.services_timing,
            services_namespace: self.services_namespace.clone(),
            lb_class_only: self.lb_class_only,
            lb_class_name: self.lb_class_name.clone(),
            control_plane: if self.control_plane {
                self.addresses.clone()
            } else {
                Vec::new()
            },
            interface: self
                .services_interface
                .clone()
                .or_else(|| self.interface.clone()),
        })
    }

    /// The Kubernetes client's settings.
    pub fn kube(&self) -> crate::kube::client::Settings {
        crate::kube::client::Settings {
            kubeconfig: self.kubeconfig.clone(),
            kubernetes_addr: self.kubernetes_addr.clone(),
            control_plane: self.control_plane,
            port: self.port,
        }
    }

    /// What the ARP flux check looks at (S36): each IPv4 control-plane VIP with its
    /// interface (`vip_interface`, else the one `kernel` chooses for it), and for Services
    /// the interface their VIPs go on (`vip_interface`, else the IPv4 default route's)
    /// unless a control-plane VIP already covers it. VIPs whose interface cannot be found
    /// are left out (the holder reports those). Used by `vipd manager` at start and by
    /// `vipd preflight`.
    pub async fn arp_flux_targets<K: crate::net::Kernel>(
        &self,
        kernel: &K,
    ) -> Vec<crate::net::arpflux::FluxTarget> {
        let interface_for = async |addr: IpAddr| match &self.interface {
            Some(name) => Some(name.clone()),
            None => match kernel.choose_interface(addr).await {
                Ok(idx) => kernel.link_by_index(idx).await.ok().map(|l| l.name),
                Err(_) => None,
            },
        };
        let mut targets: Vec<crate::net::arpflux::FluxTarget> = Vec::new();
        if self.control_plane {
            for a in &self.addresses {
                if let IpAddr::V4(v4) = a
                    && let Some(ifname) = interface_for(*a).await
                {
                    targets.push(crate::net::arpflux::FluxTarget {
                        vip: Some(*v4),
                        ifname,
                    });
                }
            }
        }
        if self.services
            && let Some(ifname) = interface_for(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)).await
            && !targets.iter().any(|t| t.ifname == ifname)
        {
            targets.push(crate::net::arpflux::FluxTarget { vip: None, ifname });
        }
        targets
    }
}

// ---------------------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------------------

/// One kube-vip option vipd refuses, as found in the inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedSetting {
    /// kube-vip environment variable name, e.g. `bgp_enable`.
    pub key: &'static str,
    /// Where it was set, e.g. `environment variable bgp_enable` or `flag --bgp`.
    pub setting: String,
    /// The value found.
    pub value: String,
    /// The feature it belongs to, e.g. `BGP`.
    pub feature: &'static str,
}

impl fmt::Display for RefusedSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {:?} ({})", self.setting, self.value, self.feature)
    }
}

/// Why the configuration was rejected. Every variant names the setting (environment
/// variable, flag or config-file key) and, where there is one, the bad value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value is malformed, out of range, or inconsistent with another setting.
    #[error("invalid value {value:?} for {setting}: {reason}")]
    Invalid {
        /// kube-vip environment variable name of the setting, e.g. `vip_renewdeadline`.
        key: &'static str,
        /// Where the value came from, e.g. `flag --leaseRenewDuration (vip_renewdeadline)`.
        setting: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// kube-vip options vipd does not implement are set; vipd refuses to start rather
    /// than silently ignore them.
    #[error(
        "kube-vip option(s) not implemented by vipd are set: {}; unset them (or set them to false/empty){}",
        .options.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        unsupported_hints(.options)
    )]
    Unsupported {
        /// Every refused option found (at least one).
        options: Vec<RefusedSetting>,
    },
    /// The YAML config file cannot be used.
    #[error("config file: {reason}")]
    File {
        /// The offending key, when the problem is about one key.
        key: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    FileRead {
        /// Path given by `--config-file` / `config_file`.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `vip_nodename` is unset and the hostname could not be read.
    #[error("no node name: vip_nodename / --nodeName is unset and the hostname could not be read")]
    NoNodeName,
}

/// What to do instead of the refused features among `options` ([`options::feature_hint`]),
/// each once, as `; <hint>`.
fn unsupported_hints(options: &[RefusedSetting]) -> String {
    let mut hints: Vec<&str> = Vec::new();
    for o in options {
        if let Some(h) = options::feature_hint(o.feature)
            && !hints.contains(&h)
        {
            hints.push(h);
        }
    }
    hints.iter().map(|h| format!("; {h}")).collect()
}

impl ConfigError {
    /// The kube-vip environment variable name the error is about (the first one for
    /// [`ConfigError::Unsupported`]), if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            ConfigError::Unsupported { options } => options.first().map(|o| o.key),
            ConfigError::File { key, .. } => key.as_deref(),
            ConfigError::FileRead { .. } => Some(K_CONFIG_FILE),
            ConfigError::NoNodeName => Some(K_NODE_NAME),
        }
    }

    /// The offending value, if any.
    pub fn value(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { value, .. } => Some(value),
            ConfigError::Unsupported { options } => options.first().map(|o| o.value.as_str()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
