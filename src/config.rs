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
//! BGP (`bgp_enable`, every `bgp_*`, `zebra_*`, `mpbgp_*`, `annotation`), routing-table mode
//! (`vip_routingtable`, `vip_routingtableid`, `vip_routingtabletype`, `vip_routingprotocol`,
//! `vip_cleanroutingtable`), WireGuard (`vip_wireguard`), egress (`egress_podcidr`,
//! `egress_servicecidr`, `egress_clean`), IPVS (`lb_enable`), dynamic DNS (`vip_ddns`),
//! UPnP (`enable_upnp`), `enable_service_security`, `disable_service_updates`,
//! `enable_endpointslices`, `mirror_dest_interface`, `health_check_port`, `cp_detect`,
//! `vip_singlenode`, `vip_startleader`, `vip_interfaceloglobal`,
//! `lb_class_legacy_handling=false`, and the Equinix Metal (`vip_packet*`,
//! `provider_config`) settings.
//!
//! Harmless ones are accepted and ignored with a warning ([`OptionKind::Ignored`]):
//! `dns_mode` (silent when `first`, kube-vip's default), `lb_port`, `lb_fwdmethod`,
//! `iptables_backend`, `backend_health_check_interval`, `egress_withnftables`,
//! `vip_leaseannotations`, `vip_configmap`, `enable_endpoints`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

/// Default `vip_leaseduration`: 3 s (kube-vip's is 5 s). The shortest lease that keeps one
/// lease write per second (retry period 1 s) and room for a whole-second kernel fence
/// (2 s) below it; the failover benchmark (`docs/failover.md`) measured a poweroff p95 gap
/// of about 3.0 s at 3/2/1 against 5.2 s at 5/3/1. kube-vip manifests set all three
/// timings explicitly and keep their values.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(3);
/// Default `vip_renewdeadline`: 2 s (kube-vip's is 3 s).
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(2);
/// Default `vip_retryperiod` (kube-vip's: 1 s).
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(1);
/// Largest accepted lease timing (any of the three): 1 hour.
pub const MAX_LEASE_TIMING: Duration = Duration::from_secs(3600);
/// client-go's `JitterFactor`: `NewLeaderElector` requires
/// `renew_deadline > JITTER_FACTOR * retry_period`.
pub const LEADER_ELECTION_JITTER_FACTOR: f64 = 1.2;
/// Default `vip_arpRate`: 3000 ms (kube-vip's).
pub const DEFAULT_ARP_RATE: Duration = Duration::from_millis(3000);
/// Default `vip_arpprobe`: 50 ms (see [`crate::reconcile::DEFAULT_PROBE_WINDOW`]).
pub const DEFAULT_ARP_PROBE: Duration = crate::reconcile::DEFAULT_PROBE_WINDOW;
/// Longest `vip_arpprobe`: 1 s (a probe delays failover by its whole window).
pub const MAX_ARP_PROBE: Duration = Duration::from_secs(1);
/// Smallest accepted `vip_arpRate` (100 ms): faster repeats only flood the segment.
pub const MIN_ARP_RATE: Duration = Duration::from_millis(100);
/// Largest accepted `vip_arpRate` (1 hour).
pub const MAX_ARP_RATE: Duration = Duration::from_secs(3600);
/// Default `port` (the API server port): 6443.
pub const DEFAULT_PORT: u16 = 6443;
/// Default `vip_leasename`.
pub const DEFAULT_LEASE_NAME: &str = "plndr-cp-lock";
/// Default `svc_leasename`.
pub const DEFAULT_SERVICES_LEASE_NAME: &str = "plndr-svcs-lock";
/// Default `cp_namespace`.
pub const DEFAULT_NAMESPACE: &str = "kube-system";
/// Default `lb_class_name`.
pub const DEFAULT_LB_CLASS_NAME: &str = "kube-vip.io/kube-vip-class";
/// Default `prometheus_server` (`host:port`, empty host = all addresses).
pub const DEFAULT_PROMETHEUS_SERVER: &str = ":2112";
/// Default IPv4 VIP prefix length.
pub const DEFAULT_V4_PREFIX: u8 = 32;
/// Default IPv6 VIP prefix length.
pub const DEFAULT_V6_PREFIX: u8 = 128;

// ---------------------------------------------------------------------------------------
// Types the rest of the crate codes against.
// ---------------------------------------------------------------------------------------

/// Lease timings and identity for one election (client-go leaderelection semantics).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    /// Lease object name, e.g. `plndr-cp-lock` (kube-vip `vip_leasename`).
    pub name: String,
    /// Namespace of the Lease (kube-vip `cp_namespace`).
    pub namespace: String,
    /// `vip_leaseduration`: how long a lease is valid after its last observed change.
    pub lease_duration: Duration,
    /// `vip_renewdeadline`: the holder stops leading if it could not renew for this long.
    pub renew_deadline: Duration,
    /// `vip_retryperiod`: interval between renew / acquire attempts.
    pub retry_period: Duration,
}

/// Per address family prefix lengths for VIPs (`vip_subnet`, e.g. `32` or `32,128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VipSubnet {
    /// Prefix length for IPv4 VIPs (0..=32, default 32).
    pub v4: u8,
    /// Prefix length for IPv6 VIPs (0..=128, default 128).
    pub v6: u8,
}

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
    /// `vip_leaderelection` / `--leaderElection`.
    pub leader_election: bool,
    /// Control-plane lease (`vip_leasename`, `cp_namespace`, timings).
    pub lease: LeaseConfig,
    /// `svc_leaseduration` (vipd option, default `vip_leaseduration`): lease duration of
    /// Service leases (per-Service and global).
    pub services_lease_duration: Duration,
    /// `svc_renewdeadline` (vipd option, default `vip_renewdeadline`).
    pub services_renew_deadline: Duration,
    /// `svc_retryperiod` (vipd option, default `vip_retryperiod`): every held Service lease
    /// is written once per retry period.
    pub services_retry_period: Duration,
    /// `svc_election` / `--servicesElection`.
    pub services_election: bool,
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
    /// `prometheus_server` (default `:2112`); `None` when set to empty (disabled).
    pub prometheus_server: Option<String>,
    /// `k8s_config_file` / `--k8sConfigPath`; `None` = in-cluster / default kubeconfig.
    ///
    /// Note: kube-vip defaults this to `/etc/kubernetes/admin.conf`, and kube-vip static pod
    /// manifests rely on that default; the client builder should try that path when this is
    /// `None`, `control_plane` is set and no in-cluster config exists.
    pub kubeconfig: Option<PathBuf>,
    /// `kubernetes_addr`: explicit API server address (`host:port`), overrides the
    /// kubeconfig's server. Control-plane mode falls back to `127.0.0.1:<port>`.
    pub kubernetes_addr: Option<String>,
    /// `dhcp_mode`.
    pub dhcp_mode: bool,
    /// `vip_ipv6_dad` (vipd's own, default false): run IPv6 duplicate address detection
    /// on VIPs. Off by default: the lease and the kernel fence already ensure one holder
    /// among vipd nodes, and DAD delays every IPv6 failover by 1-2 s (scenario S26).
    pub ipv6_dad: bool,
    /// `enable_node_labeling`.
    pub enable_node_labeling: bool,
    /// `vip_loglevel`.
    pub log_level: LogLevel,
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
        "kube-vip option(s) not implemented by vipd are set: {}; unset them (or set them to false/empty)",
        .options.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
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

// ---------------------------------------------------------------------------------------
// The option table: one source of truth for flags, help, docs and manifests.
// ---------------------------------------------------------------------------------------

/// What vipd does with a kube-vip option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionKind {
    /// Implemented; ends up in [`Config`].
    Supported,
    /// Older / deprecated name of another option (its env name); used when that one is
    /// unset, with a warning.
    Alias(&'static str),
    /// Accepted and ignored with a warning (does not change what vipd does).
    Ignored,
    /// Refused at start when set as described; `&str` names the kube-vip feature.
    Refused(RefuseWhen, &'static str),
}

/// When a [`OptionKind::Refused`] option counts as set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseWhen {
    /// A boolean that is true (Go `strconv.ParseBool`); false is accepted.
    True,
    /// A boolean that is false; true (kube-vip's default) is accepted.
    False,
    /// Any non-empty value.
    NonEmpty,
    /// Any value other than empty or `0`.
    NonZero,
}

/// The value type of an option, for docs and manifest generators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// Go `strconv.ParseBool` syntax: `1 t T TRUE true True 0 f F FALSE false False`.
    Bool,
    /// Free text (names, paths, addresses).
    Text,
    /// A whole number.
    Integer,
    /// Seconds, whole or decimal (`2.5`).
    Seconds,
    /// Whole milliseconds.
    Millis,
}

/// One row of the option table (see [`env_names`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvOption {
    /// kube-vip environment variable name (also the config-file key), e.g. `vip_interface`.
    pub env: &'static str,
    /// Long flag of `vipd manager` without `--`, e.g. `interface`; empty when there is none.
    pub flag: &'static str,
    /// Default, as text (empty = unset); descriptive defaults are written `<like this>`.
    pub default: &'static str,
    /// Value type.
    pub value_type: ValueType,
    /// One-line description, including the unit where there is one.
    pub help: &'static str,
    /// Supported, alias, ignored or refused.
    pub kind: OptionKind,
}

impl EnvOption {
    /// The `--help` text of the flag: description, `[env: NAME]` and `[default: X]`.
    pub fn help_text(&self) -> String {
        let mut s = String::from(self.help);
        match self.kind {
            OptionKind::Supported => {}
            OptionKind::Alias(of) => s.push_str(&format!(" (deprecated alias of {of})")),
            OptionKind::Ignored => s.push_str(" (accepted and ignored by vipd)"),
            OptionKind::Refused(..) => s.push_str(" (kube-vip only: refused by vipd when set)"),
        }
        s.push_str(&format!(" [env: {}]", self.env));
        if !self.default.is_empty() {
            s.push_str(&format!(" [default: {}]", self.default));
        }
        s
    }
}

const K_INTERFACE: &str = "vip_interface";
const K_ADDRESS: &str = "address";
const K_VIP_ADDRESS: &str = "vip_address";
const K_SUBNET: &str = "vip_subnet";
const K_CIDR: &str = "vip_cidr";
const K_PORT: &str = "port";
const K_NODE_NAME: &str = "vip_nodename";
const K_ARP: &str = "vip_arp";
const K_ARP_RATE: &str = "vip_arpRate";
const K_ARP_PROBE: &str = "vip_arpprobe";
const K_CP_ENABLE: &str = "cp_enable";
const K_SVC_ENABLE: &str = "svc_enable";
const K_LEADER_ELECTION: &str = "vip_leaderelection";
const K_LEASE_NAME: &str = "vip_leasename";
const K_NAMESPACE: &str = "cp_namespace";
const K_LEASE_DURATION: &str = "vip_leaseduration";
const K_RENEW_DEADLINE: &str = "vip_renewdeadline";
const K_RETRY_PERIOD: &str = "vip_retryperiod";
const K_SVC_LEASE_DURATION: &str = "svc_leaseduration";
const K_SVC_RENEW_DEADLINE: &str = "svc_renewdeadline";
const K_SVC_RETRY_PERIOD: &str = "svc_retryperiod";
const K_SVC_ELECTION: &str = "svc_election";
const K_SVC_LEASE_NAME: &str = "svc_leasename";
const K_SVC_NAMESPACE: &str = "svc_namespace";
const K_LB_CLASS_ONLY: &str = "lb_class_only";
const K_LB_CLASS_NAME: &str = "lb_class_name";
const K_SVC_INTERFACE: &str = "vip_servicesinterface";
const K_PROMETHEUS: &str = "prometheus_server";
const K_K8S_CONFIG: &str = "k8s_config_file";
const K_KUBERNETES_ADDR: &str = "kubernetes_addr";
const K_DHCP_MODE: &str = "dhcp_mode";
const K_IPV6_DAD: &str = "vip_ipv6_dad";
const K_NODE_LABELING: &str = "enable_node_labeling";
const K_LOG_LEVEL: &str = "vip_loglevel";
const K_CONFIG_FILE: &str = "config_file";
const K_DNS_MODE: &str = "dns_mode";

/// Options where an empty environment value counts as set (kube-vip uses `LookupEnv`).
const EMPTY_ENV_IS_SET: &[&str] = &[K_LB_CLASS_NAME];

const fn opt(
    env: &'static str,
    flag: &'static str,
    default: &'static str,
    value_type: ValueType,
    help: &'static str,
) -> EnvOption {
    EnvOption {
        env,
        flag,
        default,
        value_type,
        help,
        kind: OptionKind::Supported,
    }
}

const fn alias(
    env: &'static str,
    flag: &'static str,
    of: &'static str,
    value_type: ValueType,
    help: &'static str,
) -> EnvOption {
    EnvOption {
        env,
        flag,
        default: "",
        value_type,
        help,
        kind: OptionKind::Alias(of),
    }
}

const fn ignored(env: &'static str, flag: &'static str, help: &'static str) -> EnvOption {
    EnvOption {
        env,
        flag,
        default: "",
        value_type: ValueType::Text,
        help,
        kind: OptionKind::Ignored,
    }
}

const fn refused(
    env: &'static str,
    flag: &'static str,
    when: RefuseWhen,
    feature: &'static str,
) -> EnvOption {
    let value_type = match when {
        RefuseWhen::True | RefuseWhen::False => ValueType::Bool,
        RefuseWhen::NonEmpty | RefuseWhen::NonZero => ValueType::Text,
    };
    EnvOption {
        env,
        flag,
        default: "",
        value_type,
        help: feature,
        kind: OptionKind::Refused(when, feature),
    }
}

use RefuseWhen::{False as RFalse, NonEmpty, NonZero, True as RTrue};
use ValueType::{Bool, Integer, Millis, Seconds, Text};

static OPTIONS: &[EnvOption] = &[
    // --- supported ---------------------------------------------------------------------
    opt(
        K_INTERFACE,
        "interface",
        "<auto: the interface whose subnet holds the VIP, else the default route's>",
        Text,
        "Interface the VIPs are added to and announced on",
    ),
    opt(
        K_ADDRESS,
        "address",
        "",
        Text,
        "VIP address(es) for the control plane: comma-separated IPv4 and/or IPv6 addresses (no DNS names)",
    ),
    alias(K_VIP_ADDRESS, "vip", K_ADDRESS, Text, "VIP address"),
    opt(
        K_SUBNET,
        "vipSubnet",
        "32,128",
        Text,
        "VIP prefix length(s): one per address in `address` order, or `v4` / `v4,v6` (e.g. 32 or 32,128)",
    ),
    alias(K_CIDR, "cidr", K_SUBNET, Text, "VIP prefix length"),
    opt(
        K_PORT,
        "port",
        "6443",
        Integer,
        "Port of the Kubernetes API server behind the control-plane VIP",
    ),
    opt(
        K_NODE_NAME,
        "nodeName",
        "<hostname, lower-cased>",
        Text,
        "Node name, used as the lease holder identity; must be unique per node (DNS-1123 subdomain)",
    ),
    opt(
        K_ARP,
        "arp",
        "true",
        Bool,
        "ARP/NDP announcement mode (vipd's only mode: false is an error)",
    ),
    opt(
        K_ARP_RATE,
        "arpRate",
        "3000",
        Millis,
        "Interval between repeated gratuitous ARP / unsolicited NA while a VIP is held, in milliseconds",
    ),
    opt(
        K_ARP_PROBE,
        "arpProbe",
        "50",
        Millis,
        "Address conflict probe window in milliseconds (vipd option, RFC 5227 ARP probes / IPv6 DAD-style solicitations): before binding a VIP whose lease was not released cleanly, bind only if no other host answers within this window; 0 turns conflict detection off",
    ),
    opt(
        K_CP_ENABLE,
        "controlplane",
        "false",
        Bool,
        "Hold the control-plane VIP (address) under the lease vip_leasename",
    ),
    opt(
        K_SVC_ENABLE,
        "services",
        "false",
        Bool,
        "Announce the VIPs of Services of type LoadBalancer",
    ),
    opt(
        K_LEADER_ELECTION,
        "leaderElection",
        "true",
        Bool,
        "Kubernetes Lease leader election (vipd always elects: false is an error)",
    ),
    opt(
        K_LEASE_NAME,
        "leaseName",
        DEFAULT_LEASE_NAME,
        Text,
        "Name of the control-plane Lease",
    ),
    opt(
        K_NAMESPACE,
        "namespace",
        DEFAULT_NAMESPACE,
        Text,
        "Namespace of the Leases",
    ),
    opt(
        K_LEASE_DURATION,
        "leaseDuration",
        "3",
        Seconds,
        "Lease duration in seconds (decimals allowed): how long a lease is valid after its last change",
    ),
    opt(
        K_RENEW_DEADLINE,
        "leaseRenewDuration",
        "2",
        Seconds,
        "Renew deadline in seconds (decimals allowed): the holder steps down if it could not renew for this long; shorter than vip_leaseduration",
    ),
    opt(
        K_RETRY_PERIOD,
        "leaseRetry",
        "1",
        Seconds,
        "Retry period in seconds (decimals allowed) between renew / acquire attempts; renew deadline > 1.2 x retry period",
    ),
    opt(
        K_SVC_LEASE_DURATION,
        "servicesLeaseDuration",
        "<vip_leaseduration>",
        Seconds,
        "Lease duration of Service leases in seconds (vipd option): every held lease is written once per retry period, so hundreds of Services with per-Service election may need longer timings than the control plane",
    ),
    opt(
        K_SVC_RENEW_DEADLINE,
        "servicesLeaseRenewDuration",
        "<vip_renewdeadline>",
        Seconds,
        "Renew deadline of Service leases in seconds (vipd option)",
    ),
    opt(
        K_SVC_RETRY_PERIOD,
        "servicesLeaseRetry",
        "<vip_retryperiod>",
        Seconds,
        "Retry period of Service leases in seconds (vipd option)",
    ),
    opt(
        K_SVC_ELECTION,
        "servicesElection",
        "false",
        Bool,
        "One Lease per Service instead of one for all Services",
    ),
    opt(
        K_SVC_LEASE_NAME,
        "servicesLeaseName",
        DEFAULT_SERVICES_LEASE_NAME,
        Text,
        "Name of the Lease for all Services (when svc_election is false)",
    ),
    opt(
        K_SVC_NAMESPACE,
        "servicesNamespace",
        "<all namespaces>",
        Text,
        "Namespace whose Services are watched",
    ),
    opt(
        K_LB_CLASS_ONLY,
        "lbClassOnly",
        "false",
        Bool,
        "Only handle Services whose loadBalancerClass is lb_class_name",
    ),
    opt(
        K_LB_CLASS_NAME,
        "lbClassName",
        DEFAULT_LB_CLASS_NAME,
        Text,
        "loadBalancerClass vipd handles",
    ),
    opt(
        K_SVC_INTERFACE,
        "serviceInterface",
        "<vip_interface>",
        Text,
        "Interface for Service VIPs",
    ),
    opt(
        K_PROMETHEUS,
        "prometheusHTTPServer",
        DEFAULT_PROMETHEUS_SERVER,
        Text,
        "host:port of the metrics and health HTTP server; empty disables it",
    ),
    opt(
        K_K8S_CONFIG,
        "k8sConfigPath",
        "<in-cluster, then the default kubeconfig>",
        Text,
        "Path to the kubeconfig used to reach the API server",
    ),
    opt(
        K_KUBERNETES_ADDR,
        "kubernetesAddr",
        "<kubeconfig's server; control plane: 127.0.0.1:port>",
        Text,
        "host:port of the API server, overrides the kubeconfig's server",
    ),
    opt(
        K_DHCP_MODE,
        "dhcpMode",
        "false",
        Bool,
        "Obtain Service VIPs by DHCP (requires svc_enable)",
    ),
    opt(
        K_IPV6_DAD,
        "ipv6DAD",
        "false",
        Bool,
        "Run IPv6 duplicate address detection on VIPs before announcing them (vipd option; off: the lease and kernel fence already keep one holder, DAD delays IPv6 failover by 1-2 s)",
    ),
    opt(
        K_NODE_LABELING,
        "enableNodeLabeling",
        "false",
        Bool,
        "Label the node holding a VIP",
    ),
    opt(
        K_LOG_LEVEL,
        "log",
        "4",
        Text,
        "Log level: logrus number 0..=6 (2 error, 3 warn, 4 info, 5 debug, 6 trace) or a name",
    ),
    opt(
        K_CONFIG_FILE,
        "config-file",
        "",
        Text,
        "YAML file whose keys are these env names; fills only what neither flag nor env sets",
    ),
    // --- accepted, ignored ---------------------------------------------------------------
    ignored(
        K_DNS_MODE,
        "dnsMode",
        "DNS lookup mode for `address` (vipd takes IP addresses only)",
    ),
    ignored("lb_port", "lbPort", "IPVS load-balancer port"),
    ignored(
        "lb_fwdmethod",
        "lbForwardingMethod",
        "IPVS forwarding method",
    ),
    ignored(
        "iptables_backend",
        "",
        "iptables backend for egress / service security",
    ),
    ignored(
        "backend_health_check_interval",
        "",
        "IPVS backend health-check interval",
    ),
    ignored("egress_withnftables", "", "Egress with nftables"),
    ignored("vip_leaseannotations", "", "Annotations on the Lease"),
    ignored(
        "vip_configmap",
        "",
        "ConfigMap of the legacy `kube-vip service` command",
    ),
    ignored(
        "enable_endpoints",
        "enableEndpoints",
        "Use Endpoints instead of EndpointSlices",
    ),
    // --- refused -----------------------------------------------------------------------
    refused("bgp_enable", "bgp", RTrue, "BGP"),
    refused("bgp_routerid", "bgpRouterID", NonEmpty, "BGP"),
    refused("bgp_routerinterface", "", NonEmpty, "BGP"),
    refused("bgp_as", "localAS", NonEmpty, "BGP"),
    refused("bgp_peeraddress", "peerAddress", NonEmpty, "BGP"),
    refused("bgp_peers", "bgppeers", NonEmpty, "BGP"),
    refused("bgp_peeras", "", NonEmpty, "BGP"),
    refused("bgp_peerpass", "", NonEmpty, "BGP"),
    refused("bgp_multihop", "", RTrue, "BGP"),
    refused("bgp_sourceif", "", NonEmpty, "BGP"),
    refused("bgp_sourceip", "", NonEmpty, "BGP"),
    refused("bgp_hold_time", "", NonEmpty, "BGP"),
    refused("bgp_keepalive_interval", "", NonEmpty, "BGP"),
    refused("annotation", "", NonEmpty, "BGP node annotations"),
    refused("zebra_enable", "", RTrue, "BGP (Zebra)"),
    refused("zebra_url", "", NonEmpty, "BGP (Zebra)"),
    refused("zebra_version", "", NonEmpty, "BGP (Zebra)"),
    refused("zebra_software_name", "", NonEmpty, "BGP (Zebra)"),
    refused("mpbgp_nexthop", "", NonEmpty, "BGP (MP-BGP)"),
    refused("mpbgp_ipv4", "", NonEmpty, "BGP (MP-BGP)"),
    refused("mpbgp_ipv6", "", NonEmpty, "BGP (MP-BGP)"),
    refused("vip_routingtable", "table", RTrue, "routing-table mode"),
    refused("vip_routingtableid", "", NonEmpty, "routing-table mode"),
    refused("vip_routingtabletype", "", NonEmpty, "routing-table mode"),
    refused("vip_routingprotocol", "", NonEmpty, "routing-table mode"),
    refused(
        "vip_cleanroutingtable",
        "cleanRoutingTable",
        RTrue,
        "routing-table mode",
    ),
    refused("vip_wireguard", "wireguard", RTrue, "WireGuard"),
    refused("egress_podcidr", "", NonEmpty, "egress"),
    refused("egress_servicecidr", "", NonEmpty, "egress"),
    refused("egress_clean", "", RTrue, "egress"),
    refused(
        "lb_enable",
        "enableLoadBalancer",
        RTrue,
        "IPVS load balancer",
    ),
    refused("vip_ddns", "ddns", RTrue, "dynamic DNS"),
    refused("enable_upnp", "", RTrue, "UPnP"),
    refused(
        "enable_service_security",
        "onlyAllowTrafficServicePorts",
        RTrue,
        "service security (drops non-service traffic)",
    ),
    refused(
        "disable_service_updates",
        "disableServiceUpdates",
        RTrue,
        "disabling Service status updates",
    ),
    refused(
        "enable_endpointslices",
        "enableEndpointSlices",
        RTrue,
        "EndpointSlices switch",
    ),
    refused(
        "mirror_dest_interface",
        "mirrorDestInterface",
        NonEmpty,
        "traffic mirroring",
    ),
    refused(
        "health_check_port",
        "healthCheckPort",
        NonZero,
        "separate health-check port (vipd serves /healthz on prometheus_server)",
    ),
    refused(
        "cp_detect",
        "autodetectcp",
        RTrue,
        "control-plane address detection",
    ),
    refused(
        "vip_singlenode",
        "",
        RTrue,
        "single-node mode without election",
    ),
    refused(
        "vip_startleader",
        "",
        RTrue,
        "starting as leader without election",
    ),
    refused(
        "vip_interfaceloglobal",
        "loInterfaceGlobalScope",
        RTrue,
        "global scope on lo",
    ),
    refused(
        "lb_class_legacy_handling",
        "lbClassNameLegacyHandling",
        RFalse,
        "non-legacy loadBalancerClass handling",
    ),
    refused("vip_packet", "", RTrue, "Equinix Metal"),
    refused("vip_packetproject", "", NonEmpty, "Equinix Metal"),
    refused("vip_packetprojectid", "", NonEmpty, "Equinix Metal"),
    refused("provider_config", "", NonEmpty, "Equinix Metal"),
];

/// Every option `vipd manager` knows: kube-vip's environment variable name, the flag,
/// the default, the help and what vipd does with it. The single source of truth for
/// `--help`, README tables and generated manifests.
pub fn env_names() -> &'static [EnvOption] {
    OPTIONS
}

/// The table row for an environment variable name.
pub fn option(env: &str) -> Option<&'static EnvOption> {
    OPTIONS.iter().find(|o| o.env == env)
}

/// `--help` text for the flag of `env` (see [`EnvOption::help_text`]).
fn help_for(env: &str) -> String {
    option(env).map(EnvOption::help_text).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The clap surface.
// ---------------------------------------------------------------------------------------

/// `vipd manager`: run the VIP announcer (kube-vip `manager` compatible flags).
///
/// Every option can also be given by its kube-vip environment variable, which wins over
/// the flag (kube-vip's precedence); `--config-file` fills only what is still unset.
/// Values are kept as text here and parsed by [`resolve`], so errors name the flag or
/// variable and value the same way whichever source they come from.
#[derive(Parser, Debug, Clone, Default, PartialEq, Eq)]
#[command(name = "manager")]
pub struct ManagerArgs {
    #[arg(long = "interface", value_name = "IFACE", help = help_for(K_INTERFACE))]
    interface: Option<String>,
    #[arg(long = "address", value_name = "IP[,IP]", help = help_for(K_ADDRESS))]
    address: Option<String>,
    #[arg(long = "vip", value_name = "IP", help = help_for(K_VIP_ADDRESS))]
    vip: Option<String>,
    #[arg(long = "vipSubnet", value_name = "PREFIX[,PREFIX]", help = help_for(K_SUBNET))]
    vip_subnet: Option<String>,
    #[arg(long = "cidr", value_name = "PREFIX", help = help_for(K_CIDR))]
    cidr: Option<String>,
    #[arg(long = "port", value_name = "PORT", help = help_for(K_PORT))]
    port: Option<String>,
    #[arg(long = "nodeName", value_name = "NAME", help = help_for(K_NODE_NAME))]
    node_name: Option<String>,
    #[arg(long = "arp", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_ARP))]
    arp: Option<String>,
    #[arg(long = "arpRate", value_name = "MS", help = help_for(K_ARP_RATE))]
    arp_rate: Option<String>,
    #[arg(long = "arpProbe", value_name = "MS", help = help_for(K_ARP_PROBE))]
    arp_probe: Option<String>,
    #[arg(long = "controlplane", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_CP_ENABLE))]
    control_plane: Option<String>,
    #[arg(long = "services", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_SVC_ENABLE))]
    services: Option<String>,
    #[arg(long = "leaderElection", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_LEADER_ELECTION))]
    leader_election: Option<String>,
    #[arg(long = "leaseName", value_name = "NAME", help = help_for(K_LEASE_NAME))]
    lease_name: Option<String>,
    #[arg(long = "namespace", short = 'n', value_name = "NAMESPACE", help = help_for(K_NAMESPACE))]
    namespace: Option<String>,
    #[arg(long = "leaseDuration", value_name = "SECONDS", help = help_for(K_LEASE_DURATION))]
    lease_duration: Option<String>,
    #[arg(long = "leaseRenewDuration", value_name = "SECONDS", help = help_for(K_RENEW_DEADLINE))]
    renew_deadline: Option<String>,
    #[arg(long = "leaseRetry", value_name = "SECONDS", help = help_for(K_RETRY_PERIOD))]
    retry_period: Option<String>,
    #[arg(long = "servicesLeaseDuration", value_name = "SECONDS", help = help_for(K_SVC_LEASE_DURATION))]
    services_lease_duration: Option<String>,
    #[arg(long = "servicesLeaseRenewDuration", value_name = "SECONDS", help = help_for(K_SVC_RENEW_DEADLINE))]
    services_renew_deadline: Option<String>,
    #[arg(long = "servicesLeaseRetry", value_name = "SECONDS", help = help_for(K_SVC_RETRY_PERIOD))]
    services_retry_period: Option<String>,
    #[arg(long = "servicesElection", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_SVC_ELECTION))]
    services_election: Option<String>,
    #[arg(long = "servicesLeaseName", value_name = "NAME", help = help_for(K_SVC_LEASE_NAME))]
    services_lease_name: Option<String>,
    #[arg(long = "servicesNamespace", value_name = "NAMESPACE", help = help_for(K_SVC_NAMESPACE))]
    services_namespace: Option<String>,
    #[arg(long = "lbClassOnly", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_LB_CLASS_ONLY))]
    lb_class_only: Option<String>,
    #[arg(long = "lbClassName", value_name = "CLASS", help = help_for(K_LB_CLASS_NAME))]
    lb_class_name: Option<String>,
    #[arg(long = "serviceInterface", value_name = "IFACE", help = help_for(K_SVC_INTERFACE))]
    services_interface: Option<String>,
    #[arg(long = "prometheusHTTPServer", value_name = "HOST:PORT", help = help_for(K_PROMETHEUS))]
    prometheus_server: Option<String>,
    #[arg(long = "k8sConfigPath", value_name = "PATH", help = help_for(K_K8S_CONFIG))]
    k8s_config: Option<String>,
    #[arg(long = "kubernetesAddr", value_name = "HOST:PORT", help = help_for(K_KUBERNETES_ADDR))]
    kubernetes_addr: Option<String>,
    #[arg(long = "dhcpMode", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_DHCP_MODE))]
    dhcp_mode: Option<String>,
    #[arg(long = "ipv6DAD", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_IPV6_DAD))]
    ipv6_dad: Option<String>,
    #[arg(long = "enableNodeLabeling", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for(K_NODE_LABELING))]
    node_labeling: Option<String>,
    #[arg(long = "log", value_name = "LEVEL", help = help_for(K_LOG_LEVEL))]
    log: Option<String>,
    #[arg(long = "config-file", value_name = "PATH", help = help_for(K_CONFIG_FILE))]
    config_file: Option<String>,

    // kube-vip flags vipd ignores (hidden: accepted for drop-in compatibility).
    #[arg(long = "dnsMode", hide = true, help = help_for(K_DNS_MODE))]
    dns_mode: Option<String>,
    #[arg(long = "lbPort", hide = true, help = help_for("lb_port"))]
    lb_port: Option<String>,
    #[arg(long = "lbForwardingMethod", hide = true, help = help_for("lb_fwdmethod"))]
    lb_fwdmethod: Option<String>,
    #[arg(long = "enableEndpoints", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("enable_endpoints"))]
    enable_endpoints: Option<String>,

    // kube-vip flags vipd refuses (hidden: present only to give a clear error).
    #[arg(long = "bgp", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("bgp_enable"))]
    bgp: Option<String>,
    #[arg(long = "table", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("vip_routingtable"))]
    table: Option<String>,
    #[arg(long = "cleanRoutingTable", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("vip_cleanroutingtable"))]
    clean_routing_table: Option<String>,
    #[arg(long = "wireguard", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("vip_wireguard"))]
    wireguard: Option<String>,
    #[arg(long = "enableLoadBalancer", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("lb_enable"))]
    enable_load_balancer: Option<String>,
    #[arg(long = "ddns", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("vip_ddns"))]
    ddns: Option<String>,
    #[arg(long = "onlyAllowTrafficServicePorts", hide = true, num_args = 0..=1,
          require_equals = true, default_missing_value = "true",
          help = help_for("enable_service_security"))]
    service_security: Option<String>,
    #[arg(long = "disableServiceUpdates", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("disable_service_updates"))]
    disable_service_updates: Option<String>,
    #[arg(long = "enableEndpointSlices", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("enable_endpointslices"))]
    enable_endpoint_slices: Option<String>,
    #[arg(long = "autodetectcp", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("cp_detect"))]
    autodetect_cp: Option<String>,
    #[arg(long = "mirrorDestInterface", hide = true, help = help_for("mirror_dest_interface"))]
    mirror_dest_interface: Option<String>,
    #[arg(long = "healthCheckPort", hide = true, help = help_for("health_check_port"))]
    health_check_port: Option<String>,
    #[arg(long = "loInterfaceGlobalScope", hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", help = help_for("vip_interfaceloglobal"))]
    lo_global_scope: Option<String>,
    #[arg(long = "lbClassNameLegacyHandling", hide = true, num_args = 0..=1,
          require_equals = true, default_missing_value = "true",
          help = help_for("lb_class_legacy_handling"))]
    lb_class_legacy_handling: Option<String>,
    #[arg(long = "bgpRouterID", hide = true, help = help_for("bgp_routerid"))]
    bgp_router_id: Option<String>,
    #[arg(long = "localAS", hide = true, help = help_for("bgp_as"))]
    bgp_as: Option<String>,
    #[arg(long = "peerAddress", hide = true, help = help_for("bgp_peeraddress"))]
    bgp_peer_address: Option<String>,
    #[arg(long = "bgppeers", hide = true, help = help_for("bgp_peers"))]
    bgp_peers: Option<String>,
}

impl ManagerArgs {
    /// (environment variable name, flag value) for every flag given on the command line.
    fn flag_values(&self) -> Vec<(&'static str, &str)> {
        let all: [(&'static str, &Option<String>); 57] = [
            (K_INTERFACE, &self.interface),
            (K_ADDRESS, &self.address),
            (K_VIP_ADDRESS, &self.vip),
            (K_SUBNET, &self.vip_subnet),
            (K_CIDR, &self.cidr),
            (K_PORT, &self.port),
            (K_NODE_NAME, &self.node_name),
            (K_ARP, &self.arp),
            (K_ARP_RATE, &self.arp_rate),
            (K_ARP_PROBE, &self.arp_probe),
            (K_CP_ENABLE, &self.control_plane),
            (K_SVC_ENABLE, &self.services),
            (K_LEADER_ELECTION, &self.leader_election),
            (K_LEASE_NAME, &self.lease_name),
            (K_NAMESPACE, &self.namespace),
            (K_LEASE_DURATION, &self.lease_duration),
            (K_RENEW_DEADLINE, &self.renew_deadline),
            (K_RETRY_PERIOD, &self.retry_period),
            (K_SVC_LEASE_DURATION, &self.services_lease_duration),
            (K_SVC_RENEW_DEADLINE, &self.services_renew_deadline),
            (K_SVC_RETRY_PERIOD, &self.services_retry_period),
            (K_SVC_ELECTION, &self.services_election),
            (K_SVC_LEASE_NAME, &self.services_lease_name),
            (K_SVC_NAMESPACE, &self.services_namespace),
            (K_LB_CLASS_ONLY, &self.lb_class_only),
            (K_LB_CLASS_NAME, &self.lb_class_name),
            (K_SVC_INTERFACE, &self.services_interface),
            (K_PROMETHEUS, &self.prometheus_server),
            (K_K8S_CONFIG, &self.k8s_config),
            (K_KUBERNETES_ADDR, &self.kubernetes_addr),
            (K_DHCP_MODE, &self.dhcp_mode),
            (K_IPV6_DAD, &self.ipv6_dad),
            (K_NODE_LABELING, &self.node_labeling),
            (K_LOG_LEVEL, &self.log),
            (K_CONFIG_FILE, &self.config_file),
            (K_DNS_MODE, &self.dns_mode),
            ("lb_port", &self.lb_port),
            ("lb_fwdmethod", &self.lb_fwdmethod),
            ("enable_endpoints", &self.enable_endpoints),
            ("bgp_enable", &self.bgp),
            ("vip_routingtable", &self.table),
            ("vip_cleanroutingtable", &self.clean_routing_table),
            ("vip_wireguard", &self.wireguard),
            ("lb_enable", &self.enable_load_balancer),
            ("vip_ddns", &self.ddns),
            ("enable_service_security", &self.service_security),
            ("disable_service_updates", &self.disable_service_updates),
            ("enable_endpointslices", &self.enable_endpoint_slices),
            ("cp_detect", &self.autodetect_cp),
            ("mirror_dest_interface", &self.mirror_dest_interface),
            ("health_check_port", &self.health_check_port),
            ("vip_interfaceloglobal", &self.lo_global_scope),
            ("lb_class_legacy_handling", &self.lb_class_legacy_handling),
            ("bgp_routerid", &self.bgp_router_id),
            ("bgp_as", &self.bgp_as),
            ("bgp_peeraddress", &self.bgp_peer_address),
            ("bgp_peers", &self.bgp_peers),
        ];
        all.into_iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
            .collect()
    }

    /// `--config-file`, if given.
    pub fn config_file(&self) -> Option<&Path> {
        self.config_file.as_deref().map(Path::new)
    }
}

// ---------------------------------------------------------------------------------------
// Resolution.
// ---------------------------------------------------------------------------------------

/// A resolved configuration plus the warnings met on the way (deprecated names, ignored
/// kube-vip options, settings that have no effect).
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The validated configuration.
    pub config: Config,
    /// Human-readable warnings, each naming the setting; [`resolve`] logs them.
    pub warnings: Vec<String>,
}

impl Config {
    /// Resolve from the real process: `std::env`, the config file named by the
    /// `config_file` environment variable or `--config-file` (environment wins), and the
    /// system hostname (`/proc/sys/kernel/hostname`) as the default node name. Logs the
    /// warnings with `tracing::warn!`.
    ///
    /// Errors: everything [`resolve`] returns, plus [`ConfigError::FileRead`].
    pub fn from_process(args: &ManagerArgs) -> Result<Config, ConfigError> {
        let env = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
        let path = env(K_CONFIG_FILE)
            .filter(|p| !p.is_empty())
            .or_else(|| args.config_file.clone().filter(|p| !p.is_empty()));
        let text = match path {
            Some(p) => {
                Some(
                    std::fs::read_to_string(&p).map_err(|source| ConfigError::FileRead {
                        path: PathBuf::from(&p),
                        source,
                    })?,
                )
            }
            None => None,
        };
        resolve(args, &env, text.as_deref())
    }
}

/// Resolve `vipd manager`'s configuration from flags, environment and config-file text
/// (YAML, keys = kube-vip environment variable names), with kube-vip's precedence
/// (environment > flag > file > default; see the module docs), and validate it.
///
/// Pure apart from reading the system hostname when `vip_nodename` is unset everywhere
/// (use [`resolve_detailed`] to supply it). Warnings are logged with `tracing::warn!`.
///
/// Errors: [`ConfigError::Invalid`] naming the setting and value,
/// [`ConfigError::Unsupported`] listing the refused kube-vip options that are set,
/// [`ConfigError::File`] for a malformed file or unknown key, [`ConfigError::NoNodeName`].
pub fn resolve(
    args: &ManagerArgs,
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&str>,
) -> Result<Config, ConfigError> {
    let resolved = resolve_detailed(args, env, file, &system_hostname)?;
    for w in &resolved.warnings {
        tracing::warn!("{w}");
    }
    Ok(resolved.config)
}

/// [`resolve`] with an injectable hostname source (used for the default node name) that
/// returns the warnings instead of logging them. Entirely pure.
pub fn resolve_detailed(
    args: &ManagerArgs,
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&str>,
    hostname: &dyn Fn() -> Option<String>,
) -> Result<Resolved, ConfigError> {
    let file = match file {
        Some(text) => parse_file(text)?,
        None => BTreeMap::new(),
    };
    let inputs = Inputs {
        flags: args.flag_values(),
        env,
        file,
    };
    let mut warnings = Vec::new();

    check_kube_vip_only(&inputs, &mut warnings)?;

    // --- modes ---
    let control_plane = inputs.bool_or(K_CP_ENABLE, false)?;
    let services = inputs.bool_or(K_SVC_ENABLE, false)?;
    let dhcp_mode = inputs.bool_or(K_DHCP_MODE, false)?;
    let ipv6_dad = inputs.bool_or(K_IPV6_DAD, false)?;
    let arp = inputs.bool_or(K_ARP, true)?;
    let leader_election = inputs.bool_or(K_LEADER_ELECTION, true)?;
    if let Some(raw) = inputs.get(K_ARP)
        && !arp
    {
        return Err(raw.invalid(
            "vipd only implements ARP/NDP announcement; remove vip_arp or set it to true",
        ));
    }
    if let Some(raw) = inputs.get(K_LEADER_ELECTION)
        && !leader_election
    {
        return Err(raw.invalid(
            "vipd always uses Lease leader election (without it every node would answer for the VIP); remove vip_leaderelection or set it to true",
        ));
    }
    if !control_plane && !services {
        let raw = inputs
            .get(K_CP_ENABLE)
            .unwrap_or_else(|| Raw::default_of(K_CP_ENABLE, "false"));
        return Err(raw.invalid(
            "neither cp_enable (--controlplane) nor svc_enable (--services) is true: vipd would have nothing to do",
        ));
    }
    if dhcp_mode && !services {
        let raw = inputs
            .get(K_DHCP_MODE)
            .unwrap_or_else(|| Raw::default_of(K_DHCP_MODE, "true"));
        return Err(
            raw.invalid("dhcp_mode obtains Service VIPs and requires svc_enable (--services)")
        );
    }

    // --- addresses ---
    let mut addresses = Vec::new();
    let address_raw = match (inputs.get(K_ADDRESS), inputs.get(K_VIP_ADDRESS)) {
        (Some(a), Some(old)) => {
            warnings.push(format!(
                "{} is deprecated and ignored because {} is set",
                old.setting(),
                a.setting()
            ));
            Some(a)
        }
        (Some(a), None) => Some(a),
        (None, Some(old)) => {
            warnings.push(format!(
                "{} is deprecated: use address instead",
                old.setting()
            ));
            Some(old)
        }
        (None, None) => None,
    };
    if let Some(raw) = &address_raw {
        addresses = parse_addresses(raw)?;
    }
    if control_plane && addresses.is_empty() && !dhcp_mode {
        let raw = address_raw.unwrap_or_else(|| Raw::default_of(K_ADDRESS, ""));
        return Err(raw.invalid("cp_enable needs at least one VIP in address (or dhcp_mode)"));
    }

    let subnet_raw = match (inputs.get(K_SUBNET), inputs.get(K_CIDR)) {
        (Some(s), Some(old)) => {
            warnings.push(format!(
                "{} is ignored because {} is set",
                old.setting(),
                s.setting()
            ));
            Some(s)
        }
        (Some(s), None) => Some(s),
        (None, Some(old)) => {
            warnings.push(format!("{} is the older name of vip_subnet", old.setting()));
            Some(old)
        }
        (None, None) => None,
    };
    let vip_subnet = match &subnet_raw {
        Some(raw) => parse_subnet(raw, &addresses)?,
        None => VipSubnet {
            v4: DEFAULT_V4_PREFIX,
            v6: DEFAULT_V6_PREFIX,
        },
    };

    let port = match inputs.get(K_PORT) {
        Some(raw) => parse_port(&raw)?,
        None => DEFAULT_PORT,
    };

    // --- identity ---
    let node_name = match inputs.get(K_NODE_NAME) {
        Some(raw) => {
            check_dns1123_subdomain(&raw)?;
            raw.value
        }
        None => {
            let host = hostname()
                .map(|h| h.trim().to_lowercase())
                .filter(|h| !h.is_empty())
                .ok_or(ConfigError::NoNodeName)?;
            let raw = Raw {
                key: K_NODE_NAME,
                value: host,
                origin: Origin::Hostname,
            };
            check_dns1123_subdomain(&raw)?;
            raw.value
        }
    };

    // --- interfaces ---
    let interface = inputs
        .get(K_INTERFACE)
        .map(parse_interface)
        .transpose()?
        .flatten();
    let services_interface = inputs
        .get(K_SVC_INTERFACE)
        .map(parse_interface)
        .transpose()?
        .flatten();

    // --- ARP ---
    let arp_rate = match inputs.get(K_ARP_RATE) {
        Some(raw) => parse_millis(&raw, MIN_ARP_RATE, MAX_ARP_RATE)?,
        None => DEFAULT_ARP_RATE,
    };
    let arp_probe = match inputs.get(K_ARP_PROBE) {
        Some(raw) => parse_millis(&raw, Duration::ZERO, MAX_ARP_PROBE)?,
        None => DEFAULT_ARP_PROBE,
    };

    // --- lease ---
    let lease_name = inputs.text_or(K_LEASE_NAME, DEFAULT_LEASE_NAME);
    check_dns1123_subdomain(&lease_name)?;
    let namespace = inputs.text_or(K_NAMESPACE, DEFAULT_NAMESPACE);
    check_dns1123_label(&namespace)?;
    let (lease_duration, renew_deadline, retry_period) = lease_timings(
        &inputs,
        [K_LEASE_DURATION, K_RENEW_DEADLINE, K_RETRY_PERIOD],
        [
            DEFAULT_LEASE_DURATION,
            DEFAULT_RENEW_DEADLINE,
            DEFAULT_RETRY_PERIOD,
        ],
    )?;
    let (services_lease_duration, services_renew_deadline, services_retry_period) = lease_timings(
        &inputs,
        [
            K_SVC_LEASE_DURATION,
            K_SVC_RENEW_DEADLINE,
            K_SVC_RETRY_PERIOD,
        ],
        [lease_duration, renew_deadline, retry_period],
    )?;

    // --- services ---
    let services_election = inputs.bool_or(K_SVC_ELECTION, false)?;
    let services_lease_name = inputs.text_or(K_SVC_LEASE_NAME, DEFAULT_SERVICES_LEASE_NAME);
    check_dns1123_subdomain(&services_lease_name)?;
    let services_namespace = match inputs.get(K_SVC_NAMESPACE) {
        Some(raw) if raw.value.is_empty() => None,
        Some(raw) => {
            check_dns1123_label(&raw)?;
            Some(raw.value)
        }
        None => None,
    };
    let lb_class_only = inputs.bool_or(K_LB_CLASS_ONLY, false)?;
    let lb_class_name = inputs.text_or(K_LB_CLASS_NAME, DEFAULT_LB_CLASS_NAME);
    if lb_class_name.value.is_empty() {
        if lb_class_only {
            return Err(
                lb_class_name.invalid("lb_class_only is true, so lb_class_name must not be empty")
            );
        }
    } else {
        check_qualified_name(&lb_class_name)?;
    }
    if !services {
        for key in [
            K_SVC_ELECTION,
            K_SVC_LEASE_NAME,
            K_SVC_NAMESPACE,
            K_LB_CLASS_ONLY,
            K_SVC_INTERFACE,
        ] {
            if let Some(raw) = inputs.get(key) {
                warnings.push(format!(
                    "{} has no effect without svc_enable",
                    raw.setting()
                ));
            }
        }
    }

    // --- API access, metrics, logging ---
    let prometheus_server = match inputs.get(K_PROMETHEUS) {
        Some(raw) if raw.value.is_empty() => None,
        Some(raw) => {
            check_host_port(&raw, false)?;
            Some(raw.value)
        }
        None => Some(DEFAULT_PROMETHEUS_SERVER.to_string()),
    };
    let kubeconfig = match inputs.get(K_K8S_CONFIG) {
        Some(raw) if raw.value.is_empty() => None,
        Some(raw) => {
            if raw.value.contains('\0') {
                return Err(raw.invalid("a path cannot contain NUL"));
            }
            Some(PathBuf::from(raw.value))
        }
        None => None,
    };
    let kubernetes_addr = match inputs.get(K_KUBERNETES_ADDR) {
        Some(raw) if raw.value.is_empty() => None,
        Some(raw) => {
            check_host_port(&raw, true)?;
            Some(raw.value)
        }
        None => None,
    };
    let enable_node_labeling = inputs.bool_or(K_NODE_LABELING, false)?;
    let log_level = match inputs.get(K_LOG_LEVEL) {
        Some(raw) => parse_log_level(&raw)?,
        None => LogLevel::Info,
    };

    let config = Config {
        node_name,
        interface,
        addresses,
        vip_subnet,
        port,
        arp,
        arp_rate,
        arp_probe,
        control_plane,
        services,
        leader_election,
        lease: LeaseConfig {
            name: lease_name.value,
            namespace: namespace.value,
            lease_duration,
            renew_deadline,
            retry_period,
        },
        services_lease_duration,
        services_renew_deadline,
        services_retry_period,
        services_election,
        services_lease_name: services_lease_name.value,
        services_namespace,
        lb_class_only,
        lb_class_name: lb_class_name.value,
        services_interface,
        prometheus_server,
        kubeconfig,
        kubernetes_addr,
        dhcp_mode,
        ipv6_dad,
        enable_node_labeling,
        log_level,
    };
    Ok(Resolved { config, warnings })
}

/// The hostname from `/proc/sys/kernel/hostname` (Linux), else `/etc/hostname`.
fn system_hostname() -> Option<String> {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Env,
    Flag(&'static str),
    File,
    Default,
    Hostname,
}

/// One raw setting value and its origin.
#[derive(Debug, Clone)]
struct Raw {
    key: &'static str,
    value: String,
    origin: Origin,
}

impl Raw {
    fn default_of(key: &'static str, value: &str) -> Raw {
        Raw {
            key,
            value: value.to_string(),
            origin: Origin::Default,
        }
    }

    /// How the setting is named in messages, e.g. `flag --leaseDuration (vip_leaseduration)`.
    fn setting(&self) -> String {
        match &self.origin {
            Origin::Env => format!("environment variable {}", self.key),
            Origin::Flag(f) => format!("flag --{f} ({})", self.key),
            Origin::File => format!("{} in the config file", self.key),
            Origin::Default => format!("{} (default)", self.key),
            Origin::Hostname => format!("{} (default: the hostname, lower-cased)", self.key),
        }
    }

    fn invalid(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: self.key,
            setting: self.setting(),
            value: self.value.clone(),
            reason: reason.into(),
        }
    }
}

struct Inputs<'a> {
    flags: Vec<(&'static str, &'a str)>,
    env: &'a dyn Fn(&str) -> Option<String>,
    file: BTreeMap<String, String>,
}

impl Inputs<'_> {
    /// The value of `key` by kube-vip's precedence: environment, flag, file.
    fn get(&self, key: &'static str) -> Option<Raw> {
        let empty_ok = EMPTY_ENV_IS_SET.contains(&key);
        if let Some(v) = (self.env)(key)
            && (empty_ok || !v.is_empty())
        {
            return Some(Raw {
                key,
                value: v,
                origin: Origin::Env,
            });
        }
        if let Some((_, v)) = self.flags.iter().find(|(k, _)| *k == key) {
            let flag = option(key).map(|o| o.flag).unwrap_or(key);
            return Some(Raw {
                key,
                value: (*v).to_string(),
                origin: Origin::Flag(flag),
            });
        }
        if let Some(v) = self.file.get(key)
            && (empty_ok || !v.is_empty())
        {
            return Some(Raw {
                key,
                value: v.clone(),
                origin: Origin::File,
            });
        }
        None
    }

    fn bool_or(&self, key: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            Some(raw) => parse_bool(&raw),
            None => Ok(default),
        }
    }

    fn text_or(&self, key: &'static str, default: &str) -> Raw {
        self.get(key)
            .unwrap_or_else(|| Raw::default_of(key, default))
    }
}

/// Parses and checks one set of lease timings (`keys` = duration, renew deadline, retry
/// period env names; `defaults` used for unset ones): renew deadline < duration, renew
/// deadline > client-go's jitter factor x retry period. Errors name the setting and value.
fn lease_timings(
    inputs: &Inputs<'_>,
    keys: [&'static str; 3],
    defaults: [Duration; 3],
) -> Result<(Duration, Duration, Duration), ConfigError> {
    let raws = keys.map(|k| inputs.get(k));
    let mut vals = defaults;
    for (v, raw) in vals.iter_mut().zip(raws.iter()) {
        if let Some(raw) = raw {
            *v = parse_seconds(raw)?;
        }
    }
    let [lease_duration, renew_deadline, retry_period] = vals;
    let shown = |i: usize| {
        raws[i]
            .clone()
            .unwrap_or_else(|| Raw::default_of(keys[i], &format!("{}", defaults[i].as_secs_f64())))
    };
    if renew_deadline >= lease_duration {
        return Err(shown(1).invalid(format!(
            "the renew deadline ({} s) must be shorter than the lease duration {} ({} s)",
            renew_deadline.as_secs_f64(),
            keys[0],
            lease_duration.as_secs_f64()
        )));
    }
    if renew_deadline.as_secs_f64() <= LEADER_ELECTION_JITTER_FACTOR * retry_period.as_secs_f64() {
        return Err(shown(2).invalid(format!(
            "the retry period ({} s) must be shorter than the renew deadline {} ({} s) divided by client-go's jitter factor {}",
            retry_period.as_secs_f64(),
            keys[1],
            renew_deadline.as_secs_f64(),
            LEADER_ELECTION_JITTER_FACTOR
        )));
    }
    Ok((lease_duration, renew_deadline, retry_period))
}

/// Refuse the kube-vip options vipd does not implement; warn about the ignored ones.
fn check_kube_vip_only(inputs: &Inputs<'_>, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
    let mut refused = Vec::new();
    for o in OPTIONS {
        match o.kind {
            OptionKind::Refused(when, feature) => {
                let Some(raw) = inputs.get(o.env) else {
                    continue;
                };
                let set = match when {
                    RefuseWhen::True => parse_bool(&raw)?,
                    RefuseWhen::False => !parse_bool(&raw)?,
                    RefuseWhen::NonEmpty => !raw.value.is_empty(),
                    RefuseWhen::NonZero => !raw.value.is_empty() && raw.value != "0",
                };
                if set {
                    refused.push(RefusedSetting {
                        key: o.env,
                        setting: raw.setting(),
                        value: raw.value,
                        feature,
                    });
                }
            }
            OptionKind::Ignored => {
                let Some(raw) = inputs.get(o.env) else {
                    continue;
                };
                if o.env == K_DNS_MODE && raw.value == "first" {
                    continue;
                }
                warnings.push(format!(
                    "{} = {:?} is a kube-vip option vipd ignores ({})",
                    raw.setting(),
                    raw.value,
                    o.help
                ));
            }
            OptionKind::Supported | OptionKind::Alias(_) => {}
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Unsupported { options: refused })
    }
}

/// Parse the YAML config file into key -> text. Keys must be known option names; values
/// strings, numbers, booleans or null (= unset).
fn parse_file(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let file_err = |key: Option<String>, reason: String| ConfigError::File { key, reason };
    let value: serde_norway::Value =
        serde_norway::from_str(text).map_err(|e| file_err(None, format!("not valid YAML: {e}")))?;
    let mapping = match value {
        serde_norway::Value::Null => return Ok(BTreeMap::new()),
        serde_norway::Value::Mapping(m) => m,
        _ => {
            return Err(file_err(
                None,
                "the top level must be a mapping of option names to values".into(),
            ));
        }
    };
    let mut out = BTreeMap::new();
    for (k, v) in mapping {
        let key = match k {
            serde_norway::Value::String(s) => s,
            other => {
                return Err(file_err(
                    None,
                    format!("keys must be strings, found {other:?}"),
                ));
            }
        };
        if key == K_CONFIG_FILE {
            return Err(file_err(
                Some(key),
                "config_file cannot be set inside the config file".into(),
            ));
        }
        if option(&key).is_none() {
            return Err(file_err(
                Some(key.clone()),
                format!(
                    "unknown key {key:?} (keys are kube-vip environment variable names, e.g. vip_interface)"
                ),
            ));
        }
        let text = match v {
            serde_norway::Value::Null => continue,
            serde_norway::Value::Bool(b) => b.to_string(),
            serde_norway::Value::Number(n) => n.to_string(),
            serde_norway::Value::String(s) => s,
            _ => {
                return Err(file_err(
                    Some(key.clone()),
                    format!("the value of {key:?} must be a string, number or boolean"),
                ));
            }
        };
        out.insert(key, text);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Value parsers; each error names the setting and the value.
// ---------------------------------------------------------------------------------------

/// Go `strconv.ParseBool`.
fn parse_bool(raw: &Raw) -> Result<bool, ConfigError> {
    crate::syntax::parse_go_bool(&raw.value).ok_or_else(|| {
        raw.invalid(format!(
            "not a boolean (Go strconv.ParseBool: {})",
            crate::syntax::GO_BOOL_VALUES
        ))
    })
}

/// Seconds, whole or with up to 9 decimals, in (0, [`MAX_LEASE_TIMING`]].
fn parse_seconds(raw: &Raw) -> Result<Duration, ConfigError> {
    let v = raw.value.as_str();
    if v.starts_with('-') {
        return Err(raw.invalid("must be a positive number of seconds"));
    }
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits(int) || !digits(frac) || (v.contains('.') && frac.is_empty()) {
        return Err(raw.invalid("not a number of seconds (e.g. 5 or 2.5)"));
    }
    if frac.len() > 9 {
        return Err(raw.invalid("more than 9 decimal places"));
    }
    let secs: u64 = int
        .parse()
        .map_err(|_| raw.invalid(format!("must be at most {} s", MAX_LEASE_TIMING.as_secs())))?;
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        let padded = format!("{frac:0<9}");
        padded
            .parse()
            .map_err(|_| raw.invalid("not a number of seconds"))?
    };
    let d = Duration::new(secs, 0).checked_add(Duration::from_nanos(u64::from(nanos)));
    match d {
        Some(d) if d.is_zero() => Err(raw.invalid("must be greater than zero")),
        Some(d) if d <= MAX_LEASE_TIMING => Ok(d),
        _ => Err(raw.invalid(format!("must be at most {} s", MAX_LEASE_TIMING.as_secs()))),
    }
}

/// Whole milliseconds in [[`MIN_ARP_RATE`], [`MAX_ARP_RATE`]].
/// A whole number of milliseconds within `min..=max`.
fn parse_millis(raw: &Raw, min: Duration, max: Duration) -> Result<Duration, ConfigError> {
    let v = raw.value.as_str();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(raw.invalid("not a whole number of milliseconds"));
    }
    let range = || {
        format!(
            "must be between {} and {} ms",
            min.as_millis(),
            max.as_millis()
        )
    };
    let ms: u64 = v.parse().map_err(|_| raw.invalid(range()))?;
    let d = Duration::from_millis(ms);
    if d < min || d > max {
        return Err(raw.invalid(range()));
    }
    Ok(d)
}

/// TCP port 1..=65535.
fn parse_port(raw: &Raw) -> Result<u16, ConfigError> {
    let v = raw.value.as_str();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(raw.invalid("not a port number"));
    }
    match v.parse::<u16>() {
        Ok(0) | Err(_) => Err(raw.invalid("port must be between 1 and 65535")),
        Ok(p) => Ok(p),
    }
}

fn parse_log_level(raw: &Raw) -> Result<LogLevel, ConfigError> {
    Ok(match raw.value.to_ascii_lowercase().as_str() {
        "0" | "1" | "2" | "panic" | "fatal" | "error" => LogLevel::Error,
        "3" | "warn" | "warning" => LogLevel::Warn,
        "4" | "info" => LogLevel::Info,
        "5" | "debug" => LogLevel::Debug,
        "6" | "trace" => LogLevel::Trace,
        _ => {
            return Err(raw.invalid(
                "not a log level (logrus 0..=6, or panic/fatal/error/warn/info/debug/trace)",
            ));
        }
    })
}

/// Comma-separated IP addresses usable as VIPs; no duplicates.
fn parse_addresses(raw: &Raw) -> Result<Vec<IpAddr>, ConfigError> {
    let mut out: Vec<IpAddr> = Vec::new();
    if raw.value.is_empty() {
        return Ok(out);
    }
    for item in raw.value.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(raw.invalid("empty entry in the comma-separated address list"));
        }
        let ip: IpAddr = item.parse().map_err(|_| {
            let hint = if item.contains('/') {
                "; give the prefix length in vip_subnet"
            } else if item.contains('%') {
                "; zone indexes are not supported"
            } else if item.bytes().any(|b| b.is_ascii_alphabetic()) && !item.contains(':') {
                "; vipd does not resolve DNS names"
            } else {
                ""
            };
            raw.invalid(format!("{item:?} is not an IP address{hint}"))
        })?;
        if let Err(class) = crate::net::vip::check_vip(ip) {
            return Err(raw.invalid(format!("{item} is {class}, not usable as a VIP")));
        }
        if out.contains(&ip) {
            return Err(raw.invalid(format!("{ip} is listed twice")));
        }
        out.push(ip);
    }
    Ok(out)
}

/// `vip_subnet`: one prefix per address (kube-vip's form), or `v4` / `v4,v6`.
fn parse_subnet(raw: &Raw, addresses: &[IpAddr]) -> Result<VipSubnet, ConfigError> {
    let mut prefixes = Vec::new();
    for item in raw.value.split(',') {
        let item = item.trim();
        let digits = item.strip_prefix('/').unwrap_or(item);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 3 {
            return Err(raw.invalid(format!("{item:?} is not a prefix length")));
        }
        let p: u8 = digits
            .parse()
            .map_err(|_| raw.invalid(format!("prefix length {digits} is out of range")))?;
        prefixes.push(p);
    }
    let check = |p: u8, v6: bool| -> Result<u8, ConfigError> {
        let max = if v6 { 128 } else { 32 };
        if p == 0 || p > max {
            Err(raw.invalid(format!(
                "prefix length {p} is out of range for IPv{} (1..={max})",
                if v6 { 6 } else { 4 }
            )))
        } else {
            Ok(p)
        }
    };
    let mut subnet = VipSubnet {
        v4: DEFAULT_V4_PREFIX,
        v6: DEFAULT_V6_PREFIX,
    };
    if !addresses.is_empty() && prefixes.len() == addresses.len() {
        let (mut v4, mut v6): (Option<u8>, Option<u8>) = (None, None);
        for (ip, p) in addresses.iter().zip(&prefixes) {
            let slot = if ip.is_ipv6() { &mut v6 } else { &mut v4 };
            let p = check(*p, ip.is_ipv6())?;
            match slot {
                Some(prev) if *prev != p => {
                    return Err(raw.invalid(format!(
                        "addresses of the same family need the same prefix length ({prev} and {p})"
                    )));
                }
                _ => *slot = Some(p),
            }
        }
        subnet.v4 = v4.unwrap_or(DEFAULT_V4_PREFIX);
        subnet.v6 = v6.unwrap_or(DEFAULT_V6_PREFIX);
        return Ok(subnet);
    }
    match prefixes.as_slice() {
        [v4] => subnet.v4 = check(*v4, false)?,
        [v4, v6] => {
            subnet.v4 = check(*v4, false)?;
            subnet.v6 = check(*v6, true)?;
        }
        _ => {
            return Err(raw.invalid(format!(
                "{} prefix lengths for {} address(es): give one per address, or v4 / v4,v6",
                prefixes.len(),
                addresses.len()
            )));
        }
    }
    Ok(subnet)
}

/// Linux interface name (kernel `dev_valid_name`): 1..=15 bytes, not `.`/`..`, no `/`,
/// `:` or whitespace. Empty = automatic (`None`).
fn parse_interface(raw: Raw) -> Result<Option<String>, ConfigError> {
    let v = raw.value.as_str();
    if v.is_empty() {
        return Ok(None);
    }
    if v.len() > 15 {
        return Err(raw.invalid("interface names are at most 15 bytes (IFNAMSIZ)"));
    }
    if v == "." || v == ".." || v.contains(['/', ':']) || v.chars().any(char::is_whitespace) {
        return Err(raw.invalid("not a valid Linux interface name"));
    }
    Ok(Some(raw.value))
}

/// Kubernetes `IsDNS1123Subdomain` (object names such as Leases and nodes).
fn check_dns1123_subdomain(raw: &Raw) -> Result<(), ConfigError> {
    let v = raw.value.as_str();
    if v.is_empty() {
        return Err(raw.invalid("must not be empty"));
    }
    if !crate::syntax::is_dns1123_subdomain(v) {
        return Err(raw.invalid(
            "not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)",
        ));
    }
    Ok(())
}

/// Kubernetes `IsDNS1123Label` (namespaces).
fn check_dns1123_label(raw: &Raw) -> Result<(), ConfigError> {
    if raw.value.is_empty() {
        return Err(raw.invalid("must not be empty"));
    }
    if !crate::syntax::is_dns1123_label(&raw.value) {
        return Err(raw.invalid(
            "not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)",
        ));
    }
    Ok(())
}

/// Kubernetes `IsQualifiedName` (`[prefix/]name`), the syntax of `spec.loadBalancerClass`.
fn check_qualified_name(raw: &Raw) -> Result<(), ConfigError> {
    let (prefix, name) = match raw.value.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, raw.value.as_str()),
    };
    let name_ok = {
        let b = name.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
    };
    let prefix_ok = prefix.is_none_or(crate::syntax::is_dns1123_subdomain);
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(raw.invalid(
            "not a qualified name ([DNS-1123 subdomain/]name, name at most 63 characters)",
        ))
    }
}

/// `host:port`, `[v6]:port` or (when `host_required` is false) `:port`.
fn check_host_port(raw: &Raw, host_required: bool) -> Result<(), ConfigError> {
    let v = raw.value.as_str();
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        let Some((h, p)) = rest.split_once("]:") else {
            return Err(raw.invalid("expected [IPv6]:port"));
        };
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(raw.invalid(format!("{h:?} is not an IPv6 address")));
        }
        (h, p)
    } else {
        let Some((h, p)) = v.rsplit_once(':') else {
            return Err(raw.invalid("expected host:port (e.g. :2112 or 127.0.0.1:6443)"));
        };
        if h.contains(':') {
            return Err(raw.invalid("an IPv6 host must be written in brackets: [addr]:port"));
        }
        let host_ok = h.is_empty()
            || h.parse::<std::net::Ipv4Addr>().is_ok()
            || (h.len() <= 253
                && h.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                }));
        if !host_ok {
            return Err(raw.invalid(format!("{h:?} is not a host name or IP address")));
        }
        (h, p)
    };
    if host_required && host.is_empty() {
        return Err(raw.invalid("a host is required (host:port)"));
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ => Err(raw.invalid(format!("{port:?} is not a port between 1 and 65535"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::collections::HashMap;

    /// A control-plane setup that resolves cleanly; cases override entries.
    const BASE: &[(&str, &str)] = &[
        ("cp_enable", "true"),
        ("address", "192.0.2.50"),
        ("vip_nodename", "node-a"),
    ];

    fn args(flags: &[&str]) -> ManagerArgs {
        ManagerArgs::try_parse_from(std::iter::once("manager").chain(flags.iter().copied()))
            .unwrap()
    }

    /// Resolve with `BASE` overridden by `env` (a value of "<unset>" removes the variable),
    /// the given flags and file, and the hostname "Node-A".
    fn run_with_host(
        flags: &[&str],
        env: &[(&str, &str)],
        file: Option<&str>,
        host: Option<&str>,
    ) -> Result<Resolved, ConfigError> {
        let mut map: HashMap<String, String> = HashMap::new();
        for (k, v) in BASE.iter().chain(env) {
            if *v == "<unset>" {
                map.remove(*k);
            } else {
                map.insert((*k).to_string(), (*v).to_string());
            }
        }
        let lookup = move |k: &str| map.get(k).cloned();
        let host = host.map(str::to_string);
        resolve_detailed(&args(flags), &lookup, file, &move || host.clone())
    }

    fn run(
        flags: &[&str],
        env: &[(&str, &str)],
        file: Option<&str>,
    ) -> Result<Resolved, ConfigError> {
        run_with_host(flags, env, file, Some("Node-A"))
    }

    fn ok(flags: &[&str], env: &[(&str, &str)], file: Option<&str>) -> Resolved {
        match run(flags, env, file) {
            Ok(r) => r,
            Err(e) => panic!("expected success for flags {flags:?} env {env:?}, got: {e}"),
        }
    }

    struct Bad {
        flags: &'static [&'static str],
        env: &'static [(&'static str, &'static str)],
        file: Option<&'static str>,
        host: Option<&'static str>,
        /// Expected `ConfigError::key()`.
        key: &'static str,
        /// Expected `ConfigError::value()` (None: the variant has no value).
        value: Option<&'static str>,
        /// Extra text the message must contain (e.g. the flag name).
        mentions: &'static str,
    }

    const fn env(
        env: &'static [(&'static str, &'static str)],
        key: &'static str,
        value: &'static str,
    ) -> Bad {
        Bad {
            flags: &[],
            env,
            file: None,
            host: Some("Node-A"),
            key,
            value: Some(value),
            mentions: "",
        }
    }

    const fn flag(
        flags: &'static [&'static str],
        key: &'static str,
        value: &'static str,
        mentions: &'static str,
    ) -> Bad {
        Bad {
            flags,
            env: &[],
            file: None,
            host: Some("Node-A"),
            key,
            value: Some(value),
            mentions,
        }
    }

    const fn file(text: &'static str, key: &'static str, value: Option<&'static str>) -> Bad {
        Bad {
            flags: &[],
            env: &[],
            file: Some(text),
            host: Some("Node-A"),
            key,
            value,
            mentions: "config file",
        }
    }

    const BAD: &[Bad] = &[
        // addresses
        env(&[("address", "192.0.2.300")], "address", "192.0.2.300"),
        env(
            &[("address", "kube.example.com")],
            "address",
            "kube.example.com",
        ),
        env(&[("address", "192.0.2.10/24")], "address", "192.0.2.10/24"),
        env(
            &[("address", "192.0.2.10,192.0.2.10")],
            "address",
            "192.0.2.10,192.0.2.10",
        ),
        env(
            &[("address", "192.0.2.10,,192.0.2.11")],
            "address",
            "192.0.2.10,,192.0.2.11",
        ),
        env(&[("address", "0.0.0.0")], "address", "0.0.0.0"),
        env(&[("address", "127.0.0.1")], "address", "127.0.0.1"),
        env(&[("address", "fe80::1")], "address", "fe80::1"),
        env(&[("address", "224.0.0.5")], "address", "224.0.0.5"),
        env(
            &[("address", "2001:db8::1,2001:DB8::1")],
            "address",
            "2001:db8::1,2001:DB8::1",
        ),
        env(
            &[("address", "<unset>"), ("vip_address", "10.0.0.999")],
            "vip_address",
            "10.0.0.999",
        ),
        // cp_enable without an address
        env(&[("address", "<unset>")], "address", ""),
        // prefixes
        env(&[("vip_subnet", "33")], "vip_subnet", "33"),
        env(&[("vip_subnet", "0")], "vip_subnet", "0"),
        env(&[("vip_subnet", "abc")], "vip_subnet", "abc"),
        env(
            &[
                ("address", "192.0.2.50,2001:db8::50"),
                ("vip_subnet", "32,129"),
            ],
            "vip_subnet",
            "32,129",
        ),
        env(
            &[
                ("address", "192.0.2.50,192.0.2.51"),
                ("vip_subnet", "32,24"),
            ],
            "vip_subnet",
            "32,24",
        ),
        env(&[("vip_subnet", "32,128,64")], "vip_subnet", "32,128,64"),
        env(&[("vip_cidr", "40")], "vip_cidr", "40"),
        // port
        env(&[("port", "0")], "port", "0"),
        env(&[("port", "70000")], "port", "70000"),
        env(&[("port", "http")], "port", "http"),
        // node name
        env(&[("vip_nodename", "Node_A")], "vip_nodename", "Node_A"),
        env(&[("vip_nodename", "node-a-")], "vip_nodename", "node-a-"),
        Bad {
            flags: &["--nodeName="],
            env: &[("vip_nodename", "<unset>")],
            file: None,
            host: Some("Node-A"),
            key: "vip_nodename",
            value: Some(""),
            mentions: "--nodeName",
        },
        Bad {
            flags: &[],
            env: &[("vip_nodename", "<unset>")],
            file: None,
            host: Some("bad_host"),
            key: "vip_nodename",
            value: Some("bad_host"),
            mentions: "hostname",
        },
        Bad {
            flags: &[],
            env: &[("vip_nodename", "<unset>")],
            file: None,
            host: None,
            key: "vip_nodename",
            value: None,
            mentions: "hostname",
        },
        // modes
        env(&[("vip_arp", "false")], "vip_arp", "false"),
        env(&[("vip_arp", "yes")], "vip_arp", "yes"),
        flag(&["--arp=false"], "vip_arp", "false", "--arp"),
        env(
            &[("vip_leaderelection", "false")],
            "vip_leaderelection",
            "false",
        ),
        env(&[("cp_enable", "false")], "cp_enable", "false"),
        env(&[("cp_enable", "<unset>")], "cp_enable", "false"),
        env(&[("dhcp_mode", "true")], "dhcp_mode", "true"),
        env(&[("svc_election", "maybe")], "svc_election", "maybe"),
        // ARP rate
        env(&[("vip_arpRate", "0")], "vip_arpRate", "0"),
        env(&[("vip_arpRate", "1.5")], "vip_arpRate", "1.5"),
        env(&[("vip_arpRate", "10")], "vip_arpRate", "10"),
        // lease timings
        env(&[("vip_leaseduration", "0")], "vip_leaseduration", "0"),
        env(&[("vip_leaseduration", "-5")], "vip_leaseduration", "-5"),
        env(&[("vip_leaseduration", "abc")], "vip_leaseduration", "abc"),
        env(
            &[("vip_leaseduration", "7200")],
            "vip_leaseduration",
            "7200",
        ),
        env(&[("vip_leaseduration", "5.")], "vip_leaseduration", "5."),
        env(
            &[("vip_leaseduration", "2.5000000001")],
            "vip_leaseduration",
            "2.5000000001",
        ),
        env(&[("vip_renewdeadline", "5")], "vip_renewdeadline", "5"),
        env(&[("vip_leaseduration", "2")], "vip_renewdeadline", "2"),
        env(&[("vip_retryperiod", "3")], "vip_retryperiod", "3"),
        env(&[("vip_retryperiod", "2.6")], "vip_retryperiod", "2.6"),
        env(&[("vip_retryperiod", "0.0")], "vip_retryperiod", "0.0"),
        env(&[("svc_renewdeadline", "9")], "svc_renewdeadline", "9"),
        env(&[("svc_leaseduration", "2")], "svc_renewdeadline", "2"),
        env(&[("svc_retryperiod", "x")], "svc_retryperiod", "x"),
        flag(
            &["--leaseDuration=abc"],
            "vip_leaseduration",
            "abc",
            "--leaseDuration",
        ),
        // names
        env(
            &[("vip_leasename", "Plndr_Lock")],
            "vip_leasename",
            "Plndr_Lock",
        ),
        flag(&["--leaseName="], "vip_leasename", "", "--leaseName"),
        env(
            &[("cp_namespace", "kube.system")],
            "cp_namespace",
            "kube.system",
        ),
        env(
            &[("svc_enable", "true"), ("svc_namespace", "-bad")],
            "svc_namespace",
            "-bad",
        ),
        flag(
            &["--services", "--servicesLeaseName="],
            "svc_leasename",
            "",
            "--servicesLeaseName",
        ),
        env(
            &[
                ("svc_enable", "true"),
                ("lb_class_only", "true"),
                ("lb_class_name", ""),
            ],
            "lb_class_name",
            "",
        ),
        env(
            &[("lb_class_name", "bad class")],
            "lb_class_name",
            "bad class",
        ),
        // interfaces
        env(
            &[("vip_interface", "this-name-is-too-long0")],
            "vip_interface",
            "this-name-is-too-long0",
        ),
        env(&[("vip_interface", "eth0:1")], "vip_interface", "eth0:1"),
        env(
            &[("vip_servicesinterface", "a/b")],
            "vip_servicesinterface",
            "a/b",
        ),
        // endpoints
        env(
            &[("prometheus_server", "2112")],
            "prometheus_server",
            "2112",
        ),
        env(&[("prometheus_server", ":0")], "prometheus_server", ":0"),
        env(
            &[("prometheus_server", "::1:2112")],
            "prometheus_server",
            "::1:2112",
        ),
        env(
            &[("prometheus_server", "[::1:2112")],
            "prometheus_server",
            "[::1:2112",
        ),
        env(&[("kubernetes_addr", ":6443")], "kubernetes_addr", ":6443"),
        env(
            &[("kubernetes_addr", "bad host:6443")],
            "kubernetes_addr",
            "bad host:6443",
        ),
        env(&[("vip_loglevel", "9")], "vip_loglevel", "9"),
        // refused kube-vip options
        env(&[("bgp_enable", "true")], "bgp_enable", "true"),
        env(&[("bgp_enable", "maybe")], "bgp_enable", "maybe"),
        env(
            &[("bgp_peers", "192.0.2.1:65000::false")],
            "bgp_peers",
            "192.0.2.1:65000::false",
        ),
        env(&[("lb_enable", "1")], "lb_enable", "1"),
        env(&[("vip_routingtable", "T")], "vip_routingtable", "T"),
        env(
            &[("egress_podcidr", "10.0.0.0/16")],
            "egress_podcidr",
            "10.0.0.0/16",
        ),
        env(&[("enable_upnp", "true")], "enable_upnp", "true"),
        env(
            &[("health_check_port", "8080")],
            "health_check_port",
            "8080",
        ),
        env(
            &[("lb_class_legacy_handling", "false")],
            "lb_class_legacy_handling",
            "false",
        ),
        flag(&["--bgp"], "bgp_enable", "true", "--bgp"),
        flag(
            &["--wireguard=true"],
            "vip_wireguard",
            "true",
            "--wireguard",
        ),
        // config file
        file("vip_wireguard: true\n", "vip_wireguard", Some("true")),
        file("vip_leaseduration: -1\n", "vip_leaseduration", Some("-1")),
        file("vip_interfac: eth0\n", "vip_interfac", None),
        file("address: [192.0.2.1, 192.0.2.2]\n", "address", None),
        file("config_file: /etc/other.yaml\n", "config_file", None),
    ];

    #[test]
    fn config_bad_inputs_name_the_setting_and_value() {
        assert!(
            BAD.len() >= 30,
            "the table must hold at least 30 bad inputs"
        );
        for (i, case) in BAD.iter().enumerate() {
            let res = run_with_host(case.flags, case.env, case.file, case.host);
            let err = match res {
                Ok(r) => panic!(
                    "case {i} ({:?} {:?} {:?}) unexpectedly resolved: {r:?}",
                    case.flags, case.env, case.file
                ),
                Err(e) => e,
            };
            let msg = err.to_string();
            assert_eq!(err.key(), Some(case.key), "case {i}: wrong key in {msg:?}");
            assert_eq!(err.value(), case.value, "case {i}: wrong value in {msg:?}");
            assert!(
                msg.contains(case.key),
                "case {i}: message does not name {}: {msg:?}",
                case.key
            );
            if let Some(v) = case.value {
                assert!(
                    msg.contains(&format!("{v:?}")),
                    "case {i}: message does not quote {v:?}: {msg:?}"
                );
            }
            assert!(
                msg.contains(case.mentions),
                "case {i}: message does not mention {:?}: {msg:?}",
                case.mentions
            );
        }
    }

    #[test]
    fn service_lease_timings_default_to_the_control_plane_ones() {
        let c = ok(
            &[],
            &[("vip_leaseduration", "7"), ("vip_renewdeadline", "4")],
            None,
        )
        .config;
        assert_eq!(c.services_lease_duration, Duration::from_secs(7));
        assert_eq!(c.services_renew_deadline, Duration::from_secs(4));
        assert_eq!(c.services_retry_period, Duration::from_secs(1));
        let c = ok(
            &["--servicesLeaseRetry=2"],
            &[("svc_leaseduration", "15"), ("svc_renewdeadline", "10")],
            None,
        )
        .config;
        assert_eq!(c.services_lease_duration, Duration::from_secs(15));
        assert_eq!(c.services_renew_deadline, Duration::from_secs(10));
        assert_eq!(c.services_retry_period, Duration::from_secs(2));
        assert_eq!(
            c.lease.lease_duration, DEFAULT_LEASE_DURATION,
            "control plane unchanged"
        );
        assert!(!c.ipv6_dad);
        assert!(ok(&["--ipv6DAD"], &[], None).config.ipv6_dad);
    }

    #[test]
    fn config_defaults() {
        let r = ok(&[], &[("vip_nodename", "<unset>")], None);
        let c = r.config;
        assert_eq!(c.node_name, "node-a", "hostname lower-cased");
        assert_eq!(c.interface, None);
        assert_eq!(c.addresses, vec!["192.0.2.50".parse::<IpAddr>().unwrap()]);
        assert_eq!(c.vip_subnet, VipSubnet { v4: 32, v6: 128 });
        assert_eq!(c.port, 6443);
        assert!(c.arp && c.leader_election && c.control_plane && !c.services);
        assert_eq!(c.arp_rate, Duration::from_millis(3000));
        assert_eq!(
            c.lease,
            LeaseConfig {
                name: "plndr-cp-lock".into(),
                namespace: "kube-system".into(),
                lease_duration: Duration::from_secs(3),
                renew_deadline: Duration::from_secs(2),
                retry_period: Duration::from_secs(1),
            }
        );
        assert!(!c.services_election);
        assert_eq!(c.services_lease_name, "plndr-svcs-lock");
        assert_eq!(c.services_namespace, None);
        assert!(!c.lb_class_only);
        assert_eq!(c.lb_class_name, "kube-vip.io/kube-vip-class");
        assert_eq!(c.services_interface, None);
        assert_eq!(c.prometheus_server.as_deref(), Some(":2112"));
        assert_eq!(c.kubeconfig, None);
        assert_eq!(c.kubernetes_addr, None);
        assert!(!c.dhcp_mode && !c.enable_node_labeling);
        assert_eq!(c.log_level, LogLevel::Info);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn config_env_overrides_flag() {
        let c = ok(
            &["--leaseDuration=10", "--interface=eth1"],
            &[("vip_leaseduration", "8")],
            None,
        )
        .config;
        assert_eq!(
            c.lease.lease_duration,
            Duration::from_secs(8),
            "env wins over flag"
        );
        assert_eq!(
            c.interface.as_deref(),
            Some("eth1"),
            "flag used where env is unset"
        );
        // kube-vip ignores empty environment values: the flag still applies.
        let c = ok(&["--interface=eth1"], &[("vip_interface", "")], None).config;
        assert_eq!(c.interface.as_deref(), Some("eth1"));
        // An env-origin error names the variable, a flag-origin error the flag.
        let e = run(&["--port=1"], &[("port", "x")], None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("environment variable port") && !e.contains("--port"),
            "{e}"
        );
    }

    #[test]
    fn config_file_only_fills_unset() {
        let yaml = "vip_interface: eth2\nvip_leaseduration: 7.5\nvip_renewdeadline: 4\nport: 8443\n\
                    vip_servicesinterface: ~\nenable_node_labeling: true\nvip_leasename: from-file\n";
        let c = ok(
            &["--port=7443"],
            &[("vip_leasename", "from-env")],
            Some(yaml),
        )
        .config;
        assert_eq!(c.interface.as_deref(), Some("eth2"), "file fills unset");
        assert_eq!(
            c.lease.lease_duration,
            Duration::from_millis(7500),
            "YAML float"
        );
        assert_eq!(
            c.lease.renew_deadline,
            Duration::from_secs(4),
            "YAML integer"
        );
        assert_eq!(c.port, 7443, "flag wins over file");
        assert_eq!(c.lease.name, "from-env", "env wins over file");
        assert!(c.enable_node_labeling, "YAML bool");
        assert_eq!(c.services_interface, None, "null = unset");
        // Empty file and empty-string values are fine.
        assert_eq!(ok(&[], &[], Some("")).config, ok(&[], &[], None).config);
        let c = ok(&[], &[], Some("vip_interface: \"\"\n")).config;
        assert_eq!(c.interface, None);
    }

    /// The control-plane VIP and Service addresses follow one rule (`net::vip::check_vip`):
    /// every address class gets the same verdict from both parsers (`0.0.0.0` and `::`
    /// aside, which ask a Service for DHCP).
    #[test]
    fn control_plane_and_service_addresses_follow_one_rule() {
        let cases: &[(&str, bool)] = &[
            ("192.0.2.10", true),
            ("10.1.2.3", true),
            ("2001:db8::10", true),
            ("127.0.0.1", false),
            ("::1", false),
            ("224.0.0.5", false),
            ("ff02::1", false),
            ("169.254.1.1", false),
            ("fe80::1", false),
            ("255.255.255.255", false),
            ("0.1.2.3", false),
            ("::ffff:192.0.2.1", false),
            ("::192.0.2.1", false),
        ];
        for (addr, usable) in cases {
            let cp = run(&[], &[("address", addr)], None);
            assert_eq!(cp.is_ok(), *usable, "control plane {addr}: {:?}", cp.err());
            if let Err(e) = cp {
                assert!(e.to_string().contains(addr), "{e}");
            }
            let svc = crate::services::model::parse_address_list(addr);
            assert_eq!(svc.addresses.len() == 1, *usable, "Service {addr}: {svc:?}");
            assert_eq!(svc.rejected.len() == 1, !*usable, "Service {addr}: {svc:?}");
        }
    }

    #[test]
    fn config_vip_address_alias() {
        let r = ok(
            &[],
            &[("address", "<unset>"), ("vip_address", "192.0.2.60")],
            None,
        );
        assert_eq!(
            r.config.addresses,
            vec!["192.0.2.60".parse::<IpAddr>().unwrap()]
        );
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("vip_address") && w.contains("deprecated")),
            "{:?}",
            r.warnings
        );
        // Both set: address wins, the alias is reported as ignored.
        let r = ok(&[], &[("vip_address", "192.0.2.60")], None);
        assert_eq!(
            r.config.addresses,
            vec!["192.0.2.50".parse::<IpAddr>().unwrap()]
        );
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("vip_address") && w.contains("ignored")),
            "{:?}",
            r.warnings
        );
        // The --vip flag is the same alias.
        let r = ok(&["--vip=192.0.2.61"], &[("address", "<unset>")], None);
        assert_eq!(
            r.config.addresses,
            vec!["192.0.2.61".parse::<IpAddr>().unwrap()]
        );
        assert!(
            r.warnings.iter().any(|w| w.contains("--vip")),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn config_vip_cidr_alias_and_subnet_forms() {
        let r = ok(&[], &[("vip_cidr", "24")], None);
        assert_eq!(r.config.vip_subnet, VipSubnet { v4: 24, v6: 128 });
        assert!(
            r.warnings.iter().any(|w| w.contains("vip_cidr")),
            "{:?}",
            r.warnings
        );
        let r = ok(&[], &[("vip_cidr", "24"), ("vip_subnet", "28")], None);
        assert_eq!(r.config.vip_subnet.v4, 28, "vip_subnet wins over vip_cidr");
        // kube-vip's per-address form, in address order (IPv6 first here).
        let c = ok(
            &[],
            &[
                ("address", "2001:db8::50, 192.0.2.50"),
                ("vip_subnet", "64,/24"),
            ],
            None,
        )
        .config;
        assert_eq!(c.vip_subnet, VipSubnet { v4: 24, v6: 64 });
        assert_eq!(c.addresses.len(), 2);
        // The v4,v6 form when the count does not match the addresses.
        let c = ok(&[], &[("vip_subnet", "30,120")], None).config;
        assert_eq!(c.vip_subnet, VipSubnet { v4: 30, v6: 120 });
    }

    #[test]
    fn config_go_parse_bool_forms_and_bare_flags() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert!(
                ok(&[], &[("enable_node_labeling", t)], None)
                    .config
                    .enable_node_labeling,
                "{t}"
            );
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert!(
                !ok(&[], &[("enable_node_labeling", f)], None)
                    .config
                    .enable_node_labeling,
                "{f}"
            );
        }
        for bad in ["yes", "on", "tRUE", " true"] {
            assert!(
                run(&[], &[("enable_node_labeling", bad)], None).is_err(),
                "{bad}"
            );
        }
        // pflag style: a bare boolean flag means true, and does not eat the next argument.
        let c = ok(
            &["--services", "--enableNodeLabeling"],
            &[("cp_enable", "<unset>"), ("address", "<unset>")],
            None,
        )
        .config;
        assert!(c.services && c.enable_node_labeling && !c.control_plane);
        assert!(ManagerArgs::try_parse_from(["manager", "--services", "true"]).is_err());
    }

    #[test]
    fn config_decimal_and_whole_seconds() {
        let c = ok(
            &[],
            &[
                ("vip_leaseduration", "4"),
                ("vip_renewdeadline", "2.5"),
                ("vip_retryperiod", "0.5"),
            ],
            None,
        )
        .config;
        assert_eq!(c.lease.lease_duration, Duration::from_secs(4));
        assert_eq!(c.lease.renew_deadline, Duration::from_millis(2500));
        assert_eq!(c.lease.retry_period, Duration::from_millis(500));
    }

    #[test]
    fn config_services_and_misc_values() {
        let r = ok(
            &["--services", "--prometheusHTTPServer="],
            &[
                ("svc_election", "true"),
                ("svc_namespace", "apps"),
                ("lb_class_name", ""),
                ("dhcp_mode", "true"),
                ("vip_servicesinterface", "eth1"),
                ("k8s_config_file", "/etc/kubernetes/admin.conf"),
                ("kubernetes_addr", "[2001:db8::2]:6443"),
                ("vip_loglevel", "debug"),
                ("vip_arpRate", "500"),
            ],
            None,
        );
        let c = r.config;
        assert!(c.services && c.services_election && c.dhcp_mode);
        assert_eq!(c.services_namespace.as_deref(), Some("apps"));
        assert_eq!(
            c.lb_class_name, "",
            "empty lb_class_name env counts (LookupEnv)"
        );
        assert_eq!(c.services_interface.as_deref(), Some("eth1"));
        assert_eq!(c.prometheus_server, None, "empty flag disables metrics");
        assert_eq!(
            c.kubeconfig,
            Some(PathBuf::from("/etc/kubernetes/admin.conf"))
        );
        assert_eq!(c.kubernetes_addr.as_deref(), Some("[2001:db8::2]:6443"));
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(c.arp_rate, Duration::from_millis(500));
        // cp_enable with dhcp_mode needs no address.
        assert!(
            run(
                &[],
                &[
                    ("address", "<unset>"),
                    ("svc_enable", "1"),
                    ("dhcp_mode", "1")
                ],
                None
            )
            .is_ok()
        );
        // Empty prometheus_server env is "unset" as in kube-vip: the default stays.
        let c = ok(&[], &[("prometheus_server", "")], None).config;
        assert_eq!(c.prometheus_server.as_deref(), Some(":2112"));
        for (n, lvl) in [
            ("0", LogLevel::Error),
            ("3", LogLevel::Warn),
            ("4", LogLevel::Info),
            ("6", LogLevel::Trace),
        ] {
            assert_eq!(ok(&[], &[("vip_loglevel", n)], None).config.log_level, lvl);
        }
    }

    #[test]
    fn config_kube_vip_options_refused_or_warned() {
        // Falsy / empty values of refused options are accepted (generated kube-vip
        // manifests carry bgp_enable "false" and the like).
        let r = ok(
            &[],
            &[
                ("bgp_enable", "false"),
                ("lb_enable", "0"),
                ("vip_ddns", "false"),
                ("bgp_routerid", ""),
                ("health_check_port", "0"),
                ("lb_class_legacy_handling", "true"),
            ],
            None,
        );
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        // Every refused option set is named in one error.
        let e = run(
            &["--table"],
            &[("bgp_enable", "true"), ("vip_wireguard", "t")],
            Some("egress_clean: true\n"),
        )
        .unwrap_err();
        let ConfigError::Unsupported { options } = &e else {
            panic!("{e}")
        };
        let keys: Vec<_> = options.iter().map(|o| o.key).collect();
        assert_eq!(
            keys,
            [
                "bgp_enable",
                "vip_routingtable",
                "vip_wireguard",
                "egress_clean"
            ]
        );
        let msg = e.to_string();
        assert!(
            msg.contains("BGP")
                && msg.contains("--table")
                && msg.contains("egress_clean in the config file"),
            "{msg}"
        );
        // Ignored options warn; dns_mode=first (kube-vip's default) is silent.
        assert!(ok(&[], &[("dns_mode", "first")], None).warnings.is_empty());
        let r = ok(&["--lbPort=6443"], &[("dns_mode", "ipv4")], None);
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(
            r.warnings.iter().any(|w| w.contains("dns_mode"))
                && r.warnings.iter().any(|w| w.contains("--lbPort"))
        );
        // Services options without svc_enable warn.
        let r = ok(&[], &[("svc_election", "true")], None);
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("svc_election") && w.contains("svc_enable")),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn config_table_defaults_match_resolution() {
        // For every supported option with a literal default, setting it explicitly to the
        // table's default must give the same Config as leaving it unset.
        let base = ok(&[], &[], None).config;
        let in_base = |k: &str| BASE.iter().any(|(b, _)| *b == k);
        let mut checked = 0;
        for o in env_names() {
            if o.kind != OptionKind::Supported
                || o.default.is_empty()
                || o.default.starts_with('<')
                || in_base(o.env)
            {
                continue;
            }
            let c = ok(&[], &[(o.env, o.default)], None).config;
            assert_eq!(
                c, base,
                "table default of {} disagrees with resolution",
                o.env
            );
            checked += 1;
        }
        assert!(checked >= 15, "only {checked} defaults checked");
        // And the constants agree with the table.
        let d = |k: &str| option(k).map(|o| o.default).unwrap_or_default();
        assert_eq!(
            d("vip_leaseduration").parse::<u64>().ok(),
            Some(DEFAULT_LEASE_DURATION.as_secs())
        );
        assert_eq!(
            d("vip_renewdeadline").parse::<u64>().ok(),
            Some(DEFAULT_RENEW_DEADLINE.as_secs())
        );
        assert_eq!(
            d("vip_retryperiod").parse::<u64>().ok(),
            Some(DEFAULT_RETRY_PERIOD.as_secs())
        );
        assert_eq!(
            d("vip_arpRate").parse::<u128>().ok(),
            Some(DEFAULT_ARP_RATE.as_millis())
        );
        assert_eq!(d("port").parse::<u16>().ok(), Some(DEFAULT_PORT));
    }

    #[test]
    fn config_help_and_table_agree() {
        let cmd = ManagerArgs::command();
        let table_flags: Vec<_> = env_names().iter().filter(|o| !o.flag.is_empty()).collect();
        // Every clap option is in the table, with the table's help text.
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            let row = table_flags
                .iter()
                .find(|o| o.flag == long)
                .unwrap_or_else(|| panic!("--{long} is not in env_names()"));
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            assert_eq!(help, row.help_text(), "--{long}");
            assert!(
                help.contains(&format!("[env: {}]", row.env)),
                "--{long}: {help}"
            );
            assert_eq!(
                arg.is_hide_set(),
                row.kind != OptionKind::Supported && !matches!(row.kind, OptionKind::Alias(_)),
                "--{long} visibility"
            );
        }
        // Every supported/alias row has a visible flag, and `--help` shows its env name.
        let rendered = ManagerArgs::command()
            .term_width(10_000)
            .render_help()
            .to_string();
        for o in env_names()
            .iter()
            .filter(|o| matches!(o.kind, OptionKind::Supported | OptionKind::Alias(_)))
        {
            assert!(!o.flag.is_empty(), "{} has no flag", o.env);
            assert!(
                rendered.contains(&format!("--{}", o.flag)),
                "--help lacks --{}",
                o.flag
            );
            assert!(
                rendered.contains(&format!("[env: {}]", o.env)),
                "--help lacks [env: {}]",
                o.env
            );
        }
        // Defaults and units are in the help.
        assert!(
            rendered.contains("[default: plndr-cp-lock]")
                && rendered.contains("in seconds")
                && rendered.contains("in milliseconds")
        );
        // No env name appears twice in the table.
        let mut envs: Vec<_> = env_names().iter().map(|o| o.env).collect();
        envs.sort_unstable();
        let before = envs.len();
        envs.dedup();
        assert_eq!(before, envs.len(), "duplicate env name in the table");
    }

    #[test]
    fn config_every_flag_feeds_its_env_key() {
        // `--flag=v` must land on the table row's env key (catches a flag wired to the
        // wrong field), for every row that has a flag.
        let rows: Vec<_> = env_names().iter().filter(|o| !o.flag.is_empty()).collect();
        for o in &rows {
            let a = ManagerArgs::try_parse_from([
                "manager".to_string(),
                format!("--{}=probe-value", o.flag),
            ])
            .unwrap_or_else(|e| panic!("--{}: {e}", o.flag));
            assert_eq!(
                a.flag_values(),
                vec![(o.env, "probe-value")],
                "--{}",
                o.flag
            );
        }
        // ... and flag_values covers exactly the table's flags.
        assert_eq!(args(&[]).flag_values(), vec![]);
        assert_eq!(rows.len(), 57);
    }

    #[test]
    fn config_file_errors_and_from_process() {
        for (text, what) in [("[1, 2]", "mapping"), ("a: [", "YAML"), ("1: x", "strings")] {
            let e = run(&[], &[], Some(text)).unwrap_err();
            assert!(
                matches!(e, ConfigError::File { .. }) && e.to_string().contains(what),
                "{e}"
            );
        }
        let missing = "/nonexistent/vipd-config-test.yaml";
        let e = Config::from_process(&args(&["--config-file", missing])).unwrap_err();
        assert!(
            matches!(e, ConfigError::FileRead { .. }) && e.to_string().contains(missing),
            "{e}"
        );
    }
}
