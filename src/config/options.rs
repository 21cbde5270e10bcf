//! The option table: every kube-vip and vipd option with its env name, flag, default, help
//! and what vipd does with it; the single source of `--help`, docs and manifests.

use super::*;

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
    /// The flag's value placeholder in `--help`, e.g. `IFACE` (by default from the type).
    pub value_name: &'static str,
    /// A one-letter flag as well (kube-vip's `-n` for `--namespace`).
    pub short: Option<char>,
}

impl ValueType {
    /// The default `--help` placeholder for a value of this type.
    pub(crate) const fn placeholder(self) -> &'static str {
        match self {
            ValueType::Bool => "BOOL",
            ValueType::Text => "VALUE",
            ValueType::Integer => "NUMBER",
            ValueType::Seconds => "SECONDS",
            ValueType::Millis => "MS",
        }
    }
}

impl EnvOption {
    /// This row with `name` as its `--help` placeholder.
    pub const fn named(mut self, name: &'static str) -> EnvOption {
        self.value_name = name;
        self
    }

    /// This row with `default` as its default (text, as in kube-vip's flag).
    pub(crate) const fn with_default(mut self, default: &'static str) -> EnvOption {
        self.default = default;
        self
    }

    /// This row with a one-letter flag as well.
    pub(crate) const fn with_short(mut self, c: char) -> EnvOption {
        self.short = Some(c);
        self
    }

    /// The `--help` text of the flag: description, `[env: NAME]` and `[default: X]`.
    pub(crate) fn help_text(&self) -> String {
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

pub(super) const K_INTERFACE: &str = "vip_interface";
pub(super) const K_ADDRESS: &str = "address";
pub(super) const K_VIP_ADDRESS: &str = "vip_address";
pub(super) const K_SUBNET: &str = "vip_subnet";
pub(super) const K_CIDR: &str = "vip_cidr";
pub(super) const K_PORT: &str = "port";
pub(super) const K_NODE_NAME: &str = "vip_nodename";
pub(super) const K_ARP: &str = "vip_arp";
pub(super) const K_ARP_RATE: &str = "vip_arpRate";
pub(super) const K_ARP_PROBE: &str = "vip_arpprobe";
pub(super) const K_CP_ENABLE: &str = "cp_enable";
pub(super) const K_SVC_ENABLE: &str = "svc_enable";
pub(super) const K_LEADER_ELECTION: &str = "vip_leaderelection";
pub(super) const K_LEASE_NAME: &str = "vip_leasename";
pub(super) const K_NAMESPACE: &str = "cp_namespace";
pub(super) const K_LEASE_DURATION: &str = "vip_leaseduration";
pub(super) const K_RENEW_DEADLINE: &str = "vip_renewdeadline";
pub(super) const K_RETRY_PERIOD: &str = "vip_retryperiod";
pub(super) const K_SVC_LEASE_DURATION: &str = "svc_leaseduration";
pub(super) const K_SVC_RENEW_DEADLINE: &str = "svc_renewdeadline";
pub(super) const K_SVC_RETRY_PERIOD: &str = "svc_retryperiod";
pub(super) const K_SVC_ELECTION: &str = "svc_election";
pub(super) const K_SVC_LEASE_NAME: &str = "svc_leasename";
pub(super) const K_SVC_LEASE_SHARDS: &str = "svc_leaseshards";
pub(super) const K_SVC_IPV6_LOOPBACK: &str = "svc_ipv6_loopback";
pub(super) const K_SVC_NAMESPACE: &str = "svc_namespace";
pub(super) const K_LB_CLASS_ONLY: &str = "lb_class_only";
pub(super) const K_LB_CLASS_NAME: &str = "lb_class_name";
pub(super) const K_SVC_INTERFACE: &str = "vip_servicesinterface";
pub(super) const K_PROMETHEUS: &str = "prometheus_server";
pub(super) const K_K8S_CONFIG: &str = "k8s_config_file";
pub(super) const K_KUBERNETES_ADDR: &str = "kubernetes_addr";
pub(super) const K_DHCP_MODE: &str = "dhcp_mode";
pub(super) const K_DHCP_BACKOFF_ATTEMPTS: &str = "dhcp_backoff_attempts";
pub(super) const K_IPV6_DAD: &str = "vip_ipv6_dad";
pub(super) const K_NFT_FENCE: &str = "vip_nftfence";
pub(super) const K_NODE_LABELING: &str = "enable_node_labeling";
pub(super) const K_DRAIN_ON_CORDON: &str = "drain_on_cordon";
pub(super) const K_SVC_EXCLUDE_CORDONED: &str = "svc_exclude_cordoned";
pub(super) const K_SVC_SUBNET_CHECK: &str = "svc_subnet_check";
pub(super) const K_EGRESS_PODCIDR: &str = "egress_podcidr";
pub(super) const K_EGRESS_SERVICECIDR: &str = "egress_servicecidr";
pub(super) const K_EGRESS_INTERNAL_SNAT: &str = "egress_enableinternalsnat";
pub(super) const K_SERVICE_SECURITY: &str = "enable_service_security";
pub(super) const K_SVC_HEALTHCHECK: &str = "svc_healthcheck";
pub(super) const K_SVC_HEALTHCHECK_HOLD: &str = "svc_healthcheck_hold";
pub(super) const K_SVC_RIDETHROUGH: &str = "svc_ridethrough";
pub(super) const K_SVC_IPAM: &str = "svc_ipam";
pub(super) const K_IPAM_CONFIG_MAP: &str = "KUBEVIP_CONFIG_MAP";
pub(super) const K_IPAM_NAMESPACE: &str = "KUBEVIP_NAMESPACE";
pub(super) const K_SVC_FAILBACK: &str = "svc_failback";
pub(super) const K_SVC_FAILBACK_HOLDDOWN: &str = "svc_failback_holddown";
pub(super) const K_LOG_LEVEL: &str = "vip_loglevel";
pub(super) const K_CONFIG_FILE: &str = "config_file";
pub(super) const K_DNS_MODE: &str = "dns_mode";
pub(super) const K_LB_ENABLE: &str = "lb_enable";
pub(super) const K_LB_PORT: &str = "lb_port";
pub(super) const K_LB_FWD: &str = "lb_fwdmethod";
pub(super) const K_ROUTING_TABLE: &str = "vip_routingtable";
pub(super) const K_ROUTING_TABLE_ID: &str = "vip_routingtableid";
pub(super) const K_ROUTING_TABLE_TYPE: &str = "vip_routingtabletype";
pub(super) const K_ROUTING_PROTOCOL: &str = "vip_routingprotocol";
pub(super) const K_CLEAN_ROUTING_TABLE: &str = "vip_cleanroutingtable";

/// Options where an empty environment value counts as set (kube-vip uses `LookupEnv`).
pub(super) const EMPTY_ENV_IS_SET: &[&str] = &[K_LB_CLASS_NAME];

pub(super) const fn opt(
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
        value_name: value_type.placeholder(),
        short: None,
    }
}

pub(super) const fn alias(
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
        value_name: value_type.placeholder(),
        short: None,
    }
}

pub(super) const fn ignored(
    env: &'static str,
    flag: &'static str,
    help: &'static str,
) -> EnvOption {
    EnvOption {
        env,
        flag,
        default: "",
        value_type: ValueType::Text,
        help,
        kind: OptionKind::Ignored,
        value_name: "VALUE",
        short: None,
    }
}

/// The feature name of the BGP rows. vipd does not speak BGP; the refusal says what to do
/// instead ([`feature_hint`]).
pub(crate) const BGP: &str = "BGP";
/// The feature name of the MP-BGP rows.
pub(crate) const BGP_MP: &str = "BGP (MP-BGP)";

/// What to do instead of a refused feature, said once after the list of refused options.
pub(crate) fn feature_hint(feature: &str) -> Option<&'static str> {
    (feature == BGP || feature == BGP_MP).then_some(
        "vipd does not speak BGP: run BIRD 2 or FRR on the node with the configuration \
         `vipd manifest bird` or `vipd manifest frr` writes from these bgp_* settings, and \
         leave them out of vipd's own (docs/operators.md, \"Routed networks: BIRD/FRR configuration\")",
    )
}

/// The env names `vipd manifest bird|frr` reads (the BGP rows and the routing table's id
/// and protocol), in table order.
pub(crate) const ROUTED_KEYS: &[&str] = &[
    "bgp_routerid",
    "bgp_routerinterface",
    "bgp_as",
    "bgp_peeraddress",
    "bgp_peers",
    "bgp_peeras",
    "bgp_peerpass",
    "bgp_multihop",
    "bgp_sourceif",
    "bgp_sourceip",
    "bgp_hold_time",
    "bgp_keepalive_interval",
    "mpbgp_nexthop",
    "mpbgp_ipv4",
    "mpbgp_ipv6",
    "vip_routingtableid",
    "vip_routingprotocol",
];

/// The `vipd manifest bird|frr` help of a [`ROUTED_KEYS`] row (kube-vip's meaning; the
/// table's help of a refused row is only its feature name).
pub(crate) fn routed_help(env: &str) -> Option<&'static str> {
    Some(match env {
        "bgp_routerid" => "BGP router ID (an IPv4 address)",
        "bgp_routerinterface" => {
            "Take the router ID from this interface's address (when bgp_routerid is unset)"
        }
        "bgp_as" => "The node's AS number (1 to 4294967295)",
        "bgp_peeraddress" => {
            "One BGP peer's address (with bgp_peeras, bgp_peerpass, bgp_multihop), added after bgp_peers"
        }
        "bgp_peers" => {
            "BGP peers, comma-separated: <address>:<AS>[:password[:multihop[:port[:mpbgp[:bfd]]]]], IPv6 addresses in brackets ([2001:db8::1]:65001), unnumbered:IFACE[:AS]; bfd is enable;rx_ms;tx_ms;multiplier (default on, 300;300;3)"
        }
        "bgp_peeras" => "AS number of the bgp_peeraddress peer",
        "bgp_peerpass" => "TCP MD5 password of the bgp_peeraddress peer",
        "bgp_multihop" => "eBGP multihop (TTL 50) for the bgp_peeraddress peer",
        "bgp_sourceif" => "Interface every BGP session is bound to / takes its source address from",
        "bgp_sourceip" => "Source address of every BGP session (of the same family as the peer)",
        "bgp_hold_time" => "BGP hold time, seconds (3 to 65535)",
        "bgp_keepalive_interval" => "BGP keepalive interval, seconds (less than the hold time)",
        "mpbgp_nexthop" => {
            "MP-BGP: carry IPv4 and IPv6 on every session; next hop of the other family: fixed (mpbgp_ipv4/mpbgp_ipv6), auto_sourceip, auto_sourceif"
        }
        "mpbgp_ipv4" => "MP-BGP fixed IPv4 next hop",
        "mpbgp_ipv6" => "MP-BGP fixed IPv6 next hop",
        "vip_routingtableid" => "Kernel routing table holding vipd's VIP routes",
        "vip_routingprotocol" => "Route protocol (rtm_protocol) of vipd's VIP routes in that table",
        _ => return None,
    })
}

pub(super) const fn refused(
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
        value_name: value_type.placeholder(),
        short: None,
    }
}

use RefuseWhen::{False as RFalse, NonEmpty, NonZero, True as RTrue};
use ValueType::{Bool, Integer, Millis, Seconds, Text};

pub(super) static OPTIONS: &[EnvOption] = &[
    // --- supported ---------------------------------------------------------------------
    opt(
        K_INTERFACE,
        "interface",
        "<auto: the interface whose subnet holds the VIP, else the default route's>",
        Text,
        "Interface the VIPs are added to and announced on",
    ).named("IFACE"),
    opt(
        K_ADDRESS,
        "address",
        "",
        Text,
        "VIP address(es) for the control plane: comma-separated IPv4 and/or IPv6 addresses (no DNS names)",
    ).named("IP[,IP]"),
    alias(K_VIP_ADDRESS, "vip", K_ADDRESS, Text, "VIP address").named("IP"),
    opt(
        K_SUBNET,
        "vipSubnet",
        "32,128",
        Text,
        "VIP prefix length(s): one per address in `address` order, or `<v4 prefix>` / `<v4 prefix>,<v6 prefix>` (e.g. 32 or 32,128)",
    ).named("PREFIX[,PREFIX]"),
    alias(K_CIDR, "cidr", K_SUBNET, Text, "VIP prefix length").named("PREFIX"),
    opt(
        K_PORT,
        "port",
        "6443",
        Integer,
        "Port of the Kubernetes API server behind the control-plane VIP",
    ).named("PORT"),
    opt(
        K_NODE_NAME,
        "nodeName",
        "<hostname, lower-cased>",
        Text,
        "Node name, used as the lease holder identity; must be unique per node (DNS-1123 subdomain)",
    ).named("NAME"),
    opt(
        K_ARP,
        "arp",
        "true",
        Bool,
        "ARP/NDP announcement mode; false only with vip_routingtable (routing-table mode announces nothing on the segment), an error otherwise",
    ),
    opt(
        K_ARP_RATE,
        "arpRate",
        "3000",
        Millis,
        "Interval between repeated gratuitous ARP / unsolicited NA while a VIP is held, in milliseconds; on a node holding more than 10 VIPs per second of it (30 at 3000), repeats after the first spread out to 10 a second for the node",
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
        "Kubernetes Lease leader election of the control-plane VIP (in ARP/NDP mode vipd always elects: false is an error with cp_enable, accepted and without effect without it; routing-table mode routes the control-plane VIP without election either way). In routing-table mode (vip_routingtable) with svc_election=false: true routes every Service from the holder of the Lease svc_leasename, false from every node that may serve it (ECMP; externalTrafficPolicy Local: the nodes with a ready endpoint)",
    ),
    opt(
        K_LEASE_NAME,
        "leaseName",
        DEFAULT_LEASE_NAME,
        Text,
        "Name of the control-plane Lease",
    ).named("NAME"),
    opt(
        K_NAMESPACE,
        "namespace",
        DEFAULT_NAMESPACE,
        Text,
        "Namespace of the Leases",
    ).named("NAMESPACE").with_short('n'),
    opt(
        K_LEASE_DURATION,
        "leaseDuration",
        "3",
        Seconds,
        "Lease duration in seconds (decimals allowed): how long a lease is valid after its last change; timings with no whole-second address fence (e.g. the fast profile 0.6/0.4/0.2) need the millisecond fence (vip_nftfence, on by default)",
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
        "Retry period in seconds (decimals allowed) between renew / acquire attempts; renew deadline > 1.2 x retry period; at least 0.1",
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
        "Retry period of Service leases in seconds (vipd option); at least 0.1",
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
    ).named("NAME"),
    opt(
        K_SVC_LEASE_SHARDS,
        "servicesLeaseShards",
        "0",
        Integer,
        "With svc_election: spread Services over this many shard Leases (vipd-services-shard-<i>, in svc_namespace or cp_namespace) instead of one Lease each, so the Lease writes do not grow with the number of Services; at most 1024. 0 keeps one Lease per Service, with kube-vip's names (vipd option)",
    ).named("COUNT"),
    opt(
        K_SVC_IPV6_LOOPBACK,
        "servicesIPv6Loopback",
        "false",
        Bool,
        "Put IPv6 Service VIPs on lo as local routes (table local, proto 118) instead of addresses on their interface, and answer their neighbour solicitations on that interface from vipd (which joins each VIP's solicited-node group there), only while the VIP's nftables fence element runs: an IPv6 address add costs the kernel time in proportion to the node's addresses (thousands of VIPs per node: seconds per takeover), a local route add does not. Needs the nftables fence (vip_nftfence); without it, or in routing-table mode, the VIPs stay on their interface. DHCP-mode addresses stay on their macvlan (vipd option)",
    ),
    opt(
        K_SVC_NAMESPACE,
        "servicesNamespace",
        "<all namespaces>",
        Text,
        "Namespace whose Services are watched",
    ).named("NAMESPACE"),
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
    ).named("CLASS"),
    opt(
        K_SVC_INTERFACE,
        "serviceInterface",
        "<vip_interface>",
        Text,
        "Interface for Service VIPs",
    ).named("IFACE"),
    opt(
        K_PROMETHEUS,
        "prometheusHTTPServer",
        DEFAULT_PROMETHEUS_SERVER,
        Text,
        "address the metrics and health HTTP server binds: :port (all addresses), IPv4:port, [IPv6]:port or localhost:port; empty disables it",
    ).named("HOST:PORT"),
    opt(
        K_K8S_CONFIG,
        "k8sConfigPath",
        "<in-cluster, then the default kubeconfig>",
        Text,
        "Path to the kubeconfig used to reach the API server",
    ).named("PATH"),
    opt(
        K_KUBERNETES_ADDR,
        "kubernetesAddr",
        "<kubeconfig's server; control plane: 127.0.0.1:port>",
        Text,
        "host:port of the API server, overrides the kubeconfig's server",
    ).named("HOST:PORT"),
    opt(
        K_DHCP_BACKOFF_ATTEMPTS,
        "dhcpBackoffAttempts",
        "0",
        Integer,
        "DHCP mode: a Service's DHCP client gives up after this many failed attempts in a row to get an address (Warning Event DHCPGaveUp) until the Service's DHCP request changes or its Lease changes holder; 0 retries forever with a backoff capped at 60 s. kube-vip's default is 3, vipd's 0: a kube-vip manifest without this variable retries forever here",
    ).named("COUNT"),
    opt(
        K_IPV6_DAD,
        "ipv6DAD",
        "false",
        Bool,
        "Run IPv6 duplicate address detection on VIPs before announcing them (vipd option; off: the lease and kernel fence already keep one holder, DAD delays IPv6 failover by 1-2 s)",
    ),
    opt(
        K_NFT_FENCE,
        "nftFence",
        "<on where the kernel supports it>",
        Bool,
        "vipd option: fence every VIP (the control plane's and the Services', DHCP-mode addresses included) in nftables too (table vipd_fence), to the millisecond: ARP requests and neighbour solicitations for it and IP packets to it are dropped unless its timeout runs: the fence lifetime from when its holder last set it (each renewal, and between renewals while the lease still covers it), never past the last renewal's send time + the lease less its margin; vipd changes the table through netlink itself (no nft binary) and needs the kernel's nf_tables arp and inet families with set timeouts. Unset or true, where the kernel cannot do it: one warning, the address lifetime alone fences (the last of several VIPs can outlive the lease by up to ~1 s) and sub-second lease timings are refused; false: off, the same without the warning",
    ),
    opt(
        K_NODE_LABELING,
        "enableNodeLabeling",
        "false",
        Bool,
        "Label the Node holding the control-plane VIP kube-vip.io/has-ip=<first address> (IPv6: 32 hex digits); Services are not labelled",
    ),
    opt(
        K_DRAIN_ON_CORDON,
        "drainOnCordon",
        "false",
        Bool,
        "vipd option: a cordoned node hands every VIP it holds (control plane and Services) to a peer and stops campaigning until uncordoned, so `kubectl drain` moves VIPs before the reboot (like the vipd.io/drain=true node annotation)",
    ),
    opt(
        K_SVC_EXCLUDE_CORDONED,
        "servicesExcludeCordoned",
        "false",
        Bool,
        "vipd option: a cordoned node does not announce Service VIPs (by default cordoned nodes stay eligible; excluded-labelled, NotReady and NetworkUnavailable nodes never are)",
    ),
    opt(
        K_SVC_SUBNET_CHECK,
        "servicesSubnetCheck",
        "true",
        Bool,
        "vipd option: a node campaigns for a Service only when every address of it lies in a subnet of the node's own addresses (on the Service's interface when one is named); false announces Service VIPs outside the node's subnets (a pool routed to the segment), as kube-vip does; routing-table mode (vip_routingtable) defaults it to false: a routed VIP is on no node subnet",
    ),
    opt(
        K_EGRESS_PODCIDR,
        "egressPodCidr",
        "",
        Text,
        "kube-vip egress: the pod CIDR(s), comma-separated; egress (kube-vip.io/egress) never translates traffic to them",
    ),
    opt(
        K_EGRESS_SERVICECIDR,
        "egressServiceCidr",
        "",
        Text,
        "kube-vip egress: the Service CIDR(s), comma-separated; egress never translates traffic to them",
    ),
    opt(
        K_EGRESS_INTERNAL_SNAT,
        "egressEnableInternalSnat",
        "false",
        Bool,
        "kube-vip egress: also translate traffic to the pod and Service CIDRs",
    ),
    opt(
        K_SERVICE_SECURITY,
        "onlyAllowTrafficServicePorts",
        "false",
        Bool,
        "Service security (kube-vip's): on the node announcing a Service VIP, only the Service's own ports (protocol and port of spec.ports) and UDP 68 (DHCP client) reach the VIP in the INPUT path; all other traffic to it is dropped (nftables table inet vipd_svcsec, which vipd changes through netlink itself; Services annotated kube-vip.io/ignore-service-security=true and Services without ports are exempt; the control-plane VIP is not affected). spec.loadBalancerSourceRanges stays kube-proxy's to enforce",
    ),
    opt(
        K_SVC_HEALTHCHECK,
        "servicesHealthCheck",
        "",
        Text,
        "vipd option: the data-path check of the node holding a Service VIP, every second; after 3 failures in a row it hands the Service over (Warning Event HealthCheckFailed). `kube-proxy` (http://127.0.0.1:10256/healthz), an http:// URL (2xx is healthy), tcp:PORT (a connect to 127.0.0.1), or empty/off (default: clusters without kube-proxy would lose every VIP); per Service: annotation vipd.io/healthcheck",
    ).named("CHECK"),
    opt(
        K_SVC_HEALTHCHECK_HOLD,
        "servicesHealthCheckHold",
        "30",
        Seconds,
        "vipd option: a node that handed a Service over for health stays out at least this long (and until 2 checks in a row pass), and a holder holds at least this long before it hands over for health, so a flapping check moves a Service at most once per hold time",
    ),
    opt(
        K_SVC_FAILBACK,
        "servicesFailback",
        "false",
        Bool,
        "vipd option: fail-back to preferred nodes (annotation vipd.io/preferred-nodes): a node more preferred than a Service VIP's holder asks for it on the lease, and the holder hands over gracefully once the request stood for svc_failback_holddown; never a preemption (set it on every node)",
    ),
    opt(
        K_SVC_FAILBACK_HOLDDOWN,
        "servicesFailbackHoldDown",
        "30",
        Seconds,
        "vipd option: with svc_failback, how long a more preferred node's request must stand before the holder hands the Service over to it",
    ),
    opt(
        K_LB_ENABLE,
        "enableLoadBalancer",
        "false",
        Bool,
        "Control-plane load balancing: the control-plane VIP's holder spreads new TCP connections to VIP:lb_port round-robin over the API servers (port) of the healthy Ready control-plane Nodes, with nftables (table ip vipd_lb) instead of kube-vip's IPVS; control plane only (Services are not balanced), nothing without cp_enable",
    ),
    opt(
        K_LB_PORT,
        "lbPort",
        "6443",
        Integer,
        "Frontend port of the control-plane load balancer: connections to VIP:lb_port are spread to the control-plane nodes at port",
    ).named("PORT"),
    opt(
        K_LB_FWD,
        "lbForwardingMethod",
        "local",
        Text,
        "Load-balancer forwarding method: local or masquerade (both DNAT and masquerade with nftables); IPVS's tunnel, directroute and bypass are refused",
    ).named("METHOD"),
    opt(
        K_SVC_RIDETHROUGH,
        "servicesRideThrough",
        "<true where the Service lease timings let a ride start in time: svc_leaseduration minus svc_retryperiod above about 3.2 s, e.g. 5/3/1>",
        Bool,
        "vipd option: Service VIPs ride through API server outages while a majority of the vipd nodes vouch over signed heartbeats on the Services interface, once the Secret vipd-peer-key in cp_namespace (key `key`, at least 32 bytes; `vipd manifest rbac` creates it) is read (without it vipd runs without ride-through and warns once); default off under vipd's bare 3/2/1 and sub-second Service timings (`vipd manifest` writes 5/3/1 for Services); set true there, it is refused at start; the control-plane VIP is not affected",
    ),
    opt(
        K_SVC_IPAM,
        "servicesIPAM",
        "true",
        Bool,
        "vipd option: allocate addresses to LoadBalancer Services that have none from the pools of kube-vip-cloud-provider's ConfigMap (KUBEVIP_NAMESPACE/KUBEVIP_CONFIG_MAP), by the holder of the Lease kube-vip-cloud-controller in KUBEVIP_NAMESPACE (a running kube-vip-cloud-provider holds it: vipd then does not allocate); false turns it off",
    ),
    opt(
        K_IPAM_CONFIG_MAP,
        "ipamConfigMap",
        "kubevip",
        Text,
        "Name of the ConfigMap with the address pools (kube-vip-cloud-provider's variable and format)",
    ).named("NAME"),
    opt(
        K_IPAM_NAMESPACE,
        "ipamNamespace",
        "kube-system",
        Text,
        "Namespace of the pool ConfigMap and of the allocator's Lease kube-vip-cloud-controller (kube-vip-cloud-provider's variable)",
    ).named("NAMESPACE"),
    opt(
        K_LOG_LEVEL,
        "log",
        "4",
        Text,
        "Log level: logrus number 0..=6 (2 error, 3 warn, 4 info, 5 debug, 6 trace) or a name",
    ).named("LEVEL"),
    opt(
        K_CONFIG_FILE,
        "config-file",
        "",
        Text,
        "YAML file whose keys are these env names; fills only what neither flag nor env sets",
    ).named("PATH"),
    // --- accepted, ignored ---------------------------------------------------------------
    ignored(
        K_DHCP_MODE,
        "dhcpMode",
        "the address family (ipv4, ipv6, dual) dynamic DNS asks DHCP for; vipd does no dynamic DNS. A Service whose address is 0.0.0.0 or :: gets it by DHCP whatever this says, as in kube-vip",
    ),
    ignored(
        K_DNS_MODE,
        "dnsMode",
        "DNS lookup mode for `address` (vipd takes IP addresses only)",
    ),
    ignored(
        "iptables_backend",
        "",
        "iptables backend for egress / service security",
    ),
    ignored(
        "backend_health_check_interval",
        "",
        "Health-check interval of kube-vip's IPVS backends (vipd's lb_enable checks every second)",
    ),
    ignored(
        "egress_withnftables",
        "",
        "Egress with nftables (vipd's egress always uses nftables, through netlink)",
    ),
    ignored(
        "egress_clean",
        "",
        "Remove egress rules at start (vipd always does: its fence table, which holds them, is replaced at start)",
    ),
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
    ignored(
        "enable_endpointslices",
        "enableEndpointSlices",
        "Use EndpointSlices (vipd reads discovery.k8s.io/v1 EndpointSlices wherever the API server serves them, core Endpoints otherwise, whatever this says)",
    ),
    // --- refused -----------------------------------------------------------------------
    // BGP: `vipd manifest bird|frr` reads these rows (config::routed_settings), the
    // manager refuses them. Flags and defaults as kube-vip's cmd/kube-vip.go.
    refused("bgp_enable", "bgp", RTrue, BGP),
    refused("bgp_routerid", "bgpRouterID", NonEmpty, BGP),
    refused("bgp_routerinterface", "", NonEmpty, BGP),
    refused("bgp_as", "localAS", NonEmpty, BGP).with_default("65000"),
    refused("bgp_peeraddress", "peerAddress", NonEmpty, BGP),
    refused("bgp_peers", "bgppeers", NonEmpty, BGP),
    refused("bgp_peeras", "peerAS", NonEmpty, BGP).with_default("65000"),
    refused("bgp_peerpass", "peerPass", NonEmpty, BGP),
    refused("bgp_multihop", "multihop", RTrue, BGP),
    refused("bgp_sourceif", "sourceIF", NonEmpty, BGP),
    refused("bgp_sourceip", "sourceIP", NonEmpty, BGP),
    refused("bgp_hold_time", "bgpHoldTimer", NonEmpty, BGP).with_default("30"),
    refused(
        "bgp_keepalive_interval",
        "bgpKeepAliveInterval",
        NonEmpty,
        BGP,
    )
    .with_default("10"),
    refused("annotation", "", NonEmpty, "BGP node annotations"),
    refused("zebra_enable", "", RTrue, "BGP (Zebra)"),
    refused("zebra_url", "", NonEmpty, "BGP (Zebra)"),
    refused("zebra_version", "", NonEmpty, "BGP (Zebra)"),
    refused("zebra_software_name", "", NonEmpty, "BGP (Zebra)"),
    refused("mpbgp_nexthop", "", NonEmpty, BGP_MP),
    refused("mpbgp_ipv4", "", NonEmpty, BGP_MP),
    refused("mpbgp_ipv6", "", NonEmpty, BGP_MP),
    opt(
        K_ROUTING_TABLE,
        "table",
        "false",
        Bool,
        "Routing-table mode: a host route (/32, /128) for each VIP goes into the kernel table vip_routingtableid instead of the address being bound on the segment, for BIRD or FRR on the node to export over BGP (`vipd manifest bird|frr`); the route is fenced by the kernel (gone within its lifetime when vipd is frozen, at once when it is killed); no ARP, no NDP. Who routes a Service: with svc_election each Service's lease holder; else with vip_leaderelection (default) the holder of the Lease svc_leasename; with vip_leaderelection=false every node that may serve the Service (ECMP across the nodes). The control-plane VIP (cp_enable): every node whose own API server is healthy, without election (as kube-vip), the VIP also bound on the loopback so the node accepts it",
    ),
    opt(
        K_ROUTING_TABLE_ID,
        "tableID",
        "198",
        Integer,
        "Routing-table mode: the kernel routing table of the VIP routes (1 to 4294967295, not the kernel's 253 default, 254 main nor 255 local)",
    ),
    opt(
        K_ROUTING_TABLE_TYPE,
        "tableType",
        "1",
        Integer,
        "Routing-table mode: the route type, kube-vip's numbers: 1 (or 0) unicast, 2 local",
    ),
    opt(
        K_ROUTING_PROTOCOL,
        "routingProtocol",
        "248",
        Integer,
        "Routing-table mode: the route protocol (rtm_protocol, 1 to 255, not BIRD's 12) by which vipd finds its routes",
    ),
    opt(
        K_CLEAN_ROUTING_TABLE,
        "cleanRoutingTable",
        "false",
        Bool,
        "Routing-table mode: at start, remove every route of vip_routingprotocol left in vip_routingtableid (a previous run's)",
    ),
    refused("vip_wireguard", "wireguard", RTrue, "WireGuard"),
    refused("vip_ddns", "ddns", RTrue, "dynamic DNS"),
    refused("enable_upnp", "", RTrue, "UPnP"),
    refused(
        "disable_service_updates",
        "disableServiceUpdates",
        RTrue,
        "disabling Service status updates",
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
/// `--help`, the option table of `docs/operators.md` and generated manifests.
pub fn env_names() -> &'static [EnvOption] {
    OPTIONS
}

/// The table row for an environment variable name.
pub fn option(env: &str) -> Option<&'static EnvOption> {
    OPTIONS.iter().find(|o| o.env == env)
}
