//! `vipd manifest pod|daemonset|rbac|systemd|bird|frr`: deployment files generated from typed
//! objects (k8s-openapi for Kubernetes, a typed unit model for systemd), never from string
//! templates.
//!
//! The generator takes kube-vip's `manifest` flags (`--interface`, `--address`,
//! `--controlplane`, `--services`, `--k8sConfigPath`, `--taint`, ...) so a kube-vip
//! how-to works unchanged with `vipd` in place of `kube-vip`. The environment variable
//! names written into the manifests come from [`crate::config::env_names`] (looked up by
//! flag, never retyped), and the resulting environment is resolved with
//! [`crate::config::resolve_detailed`] before anything is printed, so the generator refuses
//! exactly what `vipd manager` would refuse, with the manager's error.

pub mod docs;
pub mod pod;
pub mod rbac;
pub mod routed;
pub mod systemd;

use clap::{Args, Subcommand};

use crate::config::{self, ManagerArgs};

/// Container image used when `--image` is not given.
pub(crate) const DEFAULT_IMAGE: &str = concat!("ghcr.io/vipd/vipd:v", env!("CARGO_PKG_VERSION"));
/// kube-vip's default `--k8sConfigPath` for generated manifests (kubeadm's admin kubeconfig).
pub(crate) const DEFAULT_KUBECONFIG: &str = crate::kube::client::KUBEADM_ADMIN_CONF;
/// The kubeconfig that kubeadm >= 1.29 gives full rights on the first control-plane node
/// during `kubeadm init` (admin.conf is only bound to RBAC once the API server is up).
pub(crate) const SUPER_ADMIN_CONF: &str = "/etc/kubernetes/super-admin.conf";
/// Name of the Pod / DaemonSet / ServiceAccount / container.
pub(crate) const APP_NAME: &str = "vipd";
/// Node name used in place of the downward-API `spec.nodeName` when the generated
/// environment is resolved for validation.
pub(crate) const VALIDATION_NODE_NAME: &str = "manifest-validation-node";

/// Errors of the manifest generator. Each names the flag and value.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A flag vipd does not implement (e.g. `--enableLoadBalancer`).
    #[error("--{flag}: {reason}")]
    Unsupported {
        /// The flag, without `--`.
        flag: &'static str,
        /// Why, and what to do instead.
        reason: String,
    },
    /// A flag value that cannot be used.
    #[error("--{flag}={value:?}: {reason}")]
    Invalid {
        /// The flag, without `--`.
        flag: &'static str,
        /// The value given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The OS gave no random bytes for the peer key Secret.
    #[error("no random bytes from the OS for the peer key (Secret vipd-peer-key)")]
    NoRandom,
    /// The generated environment would be refused by `vipd manager`.
    #[error("the generated configuration would not start `vipd manager`: {0}")]
    Config(config::ConfigError),
    /// A flag of the generator has no row in [`config::env_names`] (a bug in vipd).
    #[error("internal: flag --{0} has no environment variable in the option table")]
    UnknownFlag(&'static str),
    /// A BGP setting of `vipd manifest bird|frr` is invalid.
    #[error("invalid BGP settings: {0}")]
    Bgp(config::ConfigError),
    /// The routing daemon cannot do what the BGP settings ask.
    #[error("vipd manifest {daemon}: {reason}")]
    Routed {
        /// `bird` or `frr`.
        daemon: &'static str,
        /// Why.
        reason: String,
    },
    /// YAML serialisation failed.
    #[error("cannot serialise the manifest to YAML: {0}")]
    Yaml(String),
}

/// `vipd manifest ...`: print deployment files to stdout.
#[derive(Debug, Clone, Subcommand)]
pub enum ManifestCommand {
    /// A static Pod (for /etc/kubernetes/manifests or k3s/RKE2 agent pod-manifests).
    Pod(Box<GenArgs>),
    /// A DaemonSet (control-plane nodes with --taint, or every node for Services).
    Daemonset(Box<GenArgs>),
    /// ServiceAccount, ClusterRole and ClusterRoleBinding with exactly the verbs vipd uses,
    /// and the peer key Secret (svc_ridethrough) with a new random key.
    Rbac(rbac::RbacArgs),
    /// The peer key Secret vipd-peer-key alone, with a new random 32-byte key (for
    /// `kubectl create -f -`, which never replaces an existing key).
    PeerKey(rbac::PeerKeyArgs),
    /// A systemd unit (Type=notify, watchdog, capabilities limited to NET_ADMIN/NET_RAW/NET_BIND_SERVICE),
    /// or with --environment-file the matching EnvironmentFile.
    Systemd(Box<systemd::SystemdArgs>),
    /// BIRD 2 configuration (bird.conf) for routed networks: exports vipd's VIP routes
    /// from kernel table 198 over BGP with BFD, from kube-vip's bgp_* settings (environment,
    /// flags or --config-file, as `vipd manager` reads them).
    Bird(routed::RoutedManifestArgs),
    /// FRR configuration (frr.conf) for routed networks, as `bird` (FRR 8.4: IPv4 VIPs only).
    Frr(routed::RoutedManifestArgs),
}

/// Go `strconv.ParseBool` (what cobra uses for kube-vip's boolean flags).
///
/// # Errors
/// [`ManifestError::Invalid`] naming `flag` for any other text.
pub(crate) fn parse_go_bool(flag: &'static str, value: &str) -> Result<bool, ManifestError> {
    crate::syntax::parse_go_bool(value).ok_or_else(|| ManifestError::Invalid {
        flag,
        value: value.to_string(),
        reason: format!("expected a boolean ({})", crate::syntax::GO_BOOL_VALUES),
    })
}

/// kube-vip's `manifest pod|daemonset` flags (same spellings; booleans take `--flag` or
/// `--flag=BOOL`). Kept as text and parsed by [`GenArgs::plan`], so every error names the
/// flag.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct GenArgs {
    /// Interface the VIPs are added to and announced on [writes: vip_interface]
    #[arg(long = "interface", value_name = "IFACE")]
    pub interface: Option<String>,
    /// Control-plane VIP(s), comma-separated IPv4/IPv6 [writes: address]
    #[arg(long = "address", visible_alias = "vip", value_name = "IP[,IP]")]
    pub address: Option<String>,
    /// VIP prefix length(s), e.g. 32 or 32,128 [writes: vip_subnet]
    #[arg(
        long = "vipSubnet",
        visible_alias = "cidr",
        value_name = "PREFIX[,PREFIX]"
    )]
    pub vip_subnet: Option<String>,
    /// API server port behind the control-plane VIP [writes: port] [default: 6443]
    #[arg(long = "port", value_name = "PORT")]
    pub port: Option<String>,
    /// Hold the control-plane VIP [writes: cp_enable]
    #[arg(long = "controlplane", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub control_plane: Option<String>,
    /// Announce LoadBalancer Service VIPs [writes: svc_enable]
    #[arg(long = "services", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub services: Option<String>,
    /// ARP/NDP mode (false only with --table) [writes: vip_arp]
    #[arg(long = "arp", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub arp: Option<String>,
    /// Routing-table mode (kube-vip's): host routes for the VIPs in a kernel table for the
    /// node's BIRD or FRR to announce over BGP (`vipd manifest bird|frr`); this makes the
    /// container privileged, since vipd opens /dev/net/tun (the IPv4 routes' fence devices)
    /// and sets net.ipv6.route.gc_interval [writes: vip_routingtable]
    #[arg(long = "table", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub table: Option<String>,
    /// Routing-table mode: the kernel table of the VIP routes [writes: vip_routingtableid]
    /// [default: 198]
    #[arg(long = "tableID", value_name = "TABLE")]
    pub table_id: Option<String>,
    /// Routing-table mode: the route type, 1 unicast, 2 local [writes: vip_routingtabletype]
    /// [default: 1]
    #[arg(long = "tableType", value_name = "TYPE")]
    pub table_type: Option<String>,
    /// Routing-table mode: the route protocol vipd marks its routes with
    /// [writes: vip_routingprotocol] [default: 248]
    #[arg(long = "routingProtocol", value_name = "PROTOCOL")]
    pub routing_protocol: Option<String>,
    /// Routing-table mode: remove the protocol's routes left in the table at start
    /// [writes: vip_cleanroutingtable]
    #[arg(long = "cleanRoutingTable", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub clean_routing_table: Option<String>,
    /// Lease leader election of the control-plane VIP (false is refused with --controlplane
    /// in ARP mode; with --table, false and no --servicesElection routes every Service from
    /// every node that may serve it, ECMP) [writes: vip_leaderelection]
    #[arg(long = "leaderElection", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub leader_election: Option<String>,
    /// One Lease per Service [writes: svc_election]
    #[arg(long = "servicesElection", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub services_election: Option<String>,
    /// Service VIPs ride through API server outages [writes: svc_ridethrough] [default: true
    /// in vipd; =false turns it off]; the peer key Secret vipd-peer-key comes from `vipd
    /// manifest rbac` (or `vipd manifest peer-key`), without it vipd runs without ride-through;
    /// unless it is off, Service lease timings a ride cannot start in time with (the default
    /// 3/2/1) are written as 5/3/1 [writes: svc_leaseduration, svc_renewdeadline,
    /// svc_retryperiod]
    #[arg(long = "servicesRideThrough", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub services_ride_through: Option<String>,
    /// Services with address 0.0.0.0 (::) get theirs from the network's DHCPv4 (DHCPv6)
    /// server on a macvlan (always, with --services, as in kube-vip): this makes the
    /// container privileged, since vipd writes the macvlans' sysctls; writes no variable;
    /// needs --services
    #[arg(long = "dhcpServices", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub dhcp_services: Option<String>,
    /// DHCP Services: give up after this many failed attempts in a row to get a Service's
    /// address; 0 retries forever [writes: dhcp_backoff_attempts] [default: 0; kube-vip's is 3]
    #[arg(long = "dhcpBackoffAttempts", value_name = "COUNT")]
    pub dhcp_backoff_attempts: Option<String>,
    /// Interface for Service VIPs [writes: vip_servicesinterface]
    #[arg(long = "serviceInterface", value_name = "IFACE")]
    pub service_interface: Option<String>,
    /// Lease duration, seconds [writes: vip_leaseduration] [default: 3]
    #[arg(long = "leaseDuration", value_name = "SECONDS")]
    pub lease_duration: Option<String>,
    /// Renew deadline, seconds [writes: vip_renewdeadline] [default: 2]
    #[arg(long = "leaseRenewDuration", value_name = "SECONDS")]
    pub renew_deadline: Option<String>,
    /// Retry period, seconds [writes: vip_retryperiod] [default: 1]
    #[arg(long = "leaseRetry", value_name = "SECONDS")]
    pub retry_period: Option<String>,
    /// Fence every VIP in nftables too (table vipd_fence), to the millisecond; on by default
    /// wherever the kernel supports it, and needed by sub-second lease timings such as the
    /// fast profile 0.6/0.4/0.2; --nftFence=false turns it off [writes: vip_nftfence]
    /// [default: true]
    #[arg(long = "nftFence", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub nft_fence: Option<String>,
    /// Name of the control-plane Lease [writes: vip_leasename]
    #[arg(long = "leaseName", value_name = "NAME")]
    pub lease_name: Option<String>,
    /// Name of the Lease for all Services, when --servicesElection is off [writes: svc_leasename]
    /// [default: plndr-svcs-lock]
    #[arg(long = "servicesLeaseName", value_name = "NAME")]
    pub services_lease_name: Option<String>,
    /// Namespace of the Pod/DaemonSet and of the Leases [writes: cp_namespace] [default: kube-system]
    #[arg(long = "namespace", short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Host path of the kubeconfig, mounted read-only at the same path [writes: k8s_config_file]
    /// [default: /etc/kubernetes/admin.conf]
    #[arg(long = "k8sConfigPath", value_name = "PATH")]
    pub k8s_config_path: Option<String>,
    /// DaemonSet only: use the ServiceAccount `vipd` (see `vipd manifest rbac`) instead of a
    /// kubeconfig
    #[arg(long = "inCluster", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub in_cluster: Option<String>,
    /// DaemonSet only: tolerate control-plane taints and require a control-plane node
    #[arg(long = "taint", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub taint: Option<String>,
    /// Container image
    #[arg(long = "image", value_name = "IMAGE", default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// Only handle Services whose loadBalancerClass is lb_class_name [writes: lb_class_only]
    #[arg(long = "lbClassOnly", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub lb_class_only: Option<String>,
    /// loadBalancerClass vipd handles [writes: lb_class_name]
    #[arg(long = "lbClassName", value_name = "CLASS")]
    pub lb_class_name: Option<String>,
    /// Control-plane load balancing with nftables: the VIP's holder spreads VIP:lbPort over
    /// the control-plane nodes' API servers [writes: lb_enable]
    #[arg(long = "enableLoadBalancer", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub enable_load_balancer: Option<String>,
    /// Frontend port of the load balancer on the VIP [writes: lb_port] [default: 6443]
    #[arg(long = "lbPort", value_name = "PORT")]
    pub lb_port: Option<String>,
    /// Load-balancer forwarding method: local or masquerade [writes: lb_fwdmethod]
    /// [default: local]
    #[arg(long = "lbForwardingMethod", value_name = "METHOD")]
    pub lb_forwarding_method: Option<String>,
    /// kubeadm >= 1.29, first control-plane node only: mount super-admin.conf (as the
    /// kubeconfig path) because admin.conf has no rights before `kubeadm init` ends (S29)
    #[arg(long = "kubeadm-init", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub kubeadm_init: Option<String>,
    /// API server host:port vipd talks to [writes: kubernetes_addr]
    /// [default: control plane: 127.0.0.1:<port>]
    #[arg(long = "kubernetesAddr", value_name = "HOST:PORT")]
    pub kubernetes_addr: Option<String>,
    /// Metrics and health endpoint, host:port; empty disables it (and the probes)
    /// [writes: prometheus_server] [default: :2112]
    #[arg(long = "prometheusHTTPServer", value_name = "HOST:PORT")]
    pub prometheus_server: Option<String>,
    /// Gratuitous ARP repeat interval, milliseconds [writes: vip_arpRate]
    #[arg(long = "arpRate", value_name = "MS")]
    pub arp_rate: Option<String>,
    /// Label the Node holding the control-plane VIP kube-vip.io/has-ip=<VIP> [writes: enable_node_labeling]
    #[arg(long = "enableNodeLabeling", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub enable_node_labeling: Option<String>,
    /// Log level (logrus number 0..=6 or a name) [writes: vip_loglevel]
    #[arg(long = "log", value_name = "LEVEL")]
    pub log: Option<String>,
    /// kube-vip's flags for features vipd does not implement (`--bgp`, `--wireguard`,
    /// ...): accepted by the parser and refused by [`GenArgs::plan`] with the
    /// reason, as `vipd manager` refuses them.
    #[command(flatten)]
    pub refused: crate::config::RefusedFlags,
}

/// How the generated workload reaches the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// A kubeconfig from the node: `host_path` mounted read-only at `mount_path`, which is
    /// what `k8s_config_file` names.
    Kubeconfig {
        /// File on the node (`super-admin.conf` with `--kubeadm-init`).
        host_path: String,
        /// Path inside the container.
        mount_path: String,
    },
    /// The ServiceAccount [`APP_NAME`] (`--inCluster`).
    InCluster,
}

/// One environment variable of the generated workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// A literal value (always a string in the manifest).
    Text(String),
    /// The node's name from the downward API (`spec.nodeName`).
    NodeName,
}

/// Everything the generators need, checked: the ordered environment (kube-vip names) and
/// the deployment choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// `(kube-vip environment variable, value)` in a stable order.
    pub env: Vec<(&'static str, EnvValue)>,
    /// Kubernetes namespace of the workload (= `cp_namespace`).
    pub namespace: String,
    /// Container image.
    pub image: String,
    /// API access.
    pub access: Access,
    /// DaemonSet tolerations + control-plane affinity.
    pub taint: bool,
    /// Port of the admin endpoint (probes), `None` when it is disabled.
    pub admin_port: Option<u16>,
    /// Host of the admin endpoint when it is bound to one address (probe `host`).
    pub admin_host: Option<String>,
    /// The container runs privileged: `--dhcpServices` (vipd writes the sysctls of the
    /// macvlans of DHCP Services, and `/proc/sys` is read-only in unprivileged containers)
    /// or `--table` (vipd opens `/dev/net/tun`, which an unprivileged container lacks, and
    /// sets `net.ipv6.route.gc_interval`).
    pub privileged: bool,
}

/// The environment variable of `vipd manager` flag `flag` (without `--`), from
/// [`config::env_names`].
///
/// # Errors
/// [`ManifestError::UnknownFlag`] when the table has no such flag (a vipd bug).
pub(crate) fn env_for(flag: &'static str) -> Result<&'static str, ManifestError> {
    config::env_names()
        .iter()
        .find(|o| o.flag == flag)
        .map(|o| o.env)
        .ok_or(ManifestError::UnknownFlag(flag))
}

/// The table default of the option behind `flag` (empty when there is none).
fn default_for(flag: &'static str) -> Result<&'static str, ManifestError> {
    config::env_names()
        .iter()
        .find(|o| o.flag == flag)
        .map(|o| o.default)
        .ok_or(ManifestError::UnknownFlag(flag))
}

impl GenArgs {
    fn flag_bool(flag: &'static str, v: &Option<String>) -> Result<bool, ManifestError> {
        v.as_deref()
            .map(|s| parse_go_bool(flag, s))
            .transpose()
            .map(|b| b.unwrap_or(false))
    }

    /// How the pod reaches the API: in-cluster, or a kubeconfig from the node
    /// (`--k8sConfigPath`, default admin.conf; super-admin.conf mounted at that path on the
    /// first kubeadm node, S29).
    ///
    /// # Errors
    /// [`ManifestError::Invalid`] for a relative `--k8sConfigPath`.
    fn access(&self, in_cluster: bool, kubeadm_init: bool) -> Result<Access, ManifestError> {
        if in_cluster {
            return Ok(Access::InCluster);
        }
        let path = self
            .k8s_config_path
            .clone()
            .unwrap_or_else(|| DEFAULT_KUBECONFIG.to_string());
        if !path.starts_with('/') {
            return Err(ManifestError::Invalid {
                flag: "k8sConfigPath",
                value: path,
                reason: "must be an absolute path on the node".into(),
            });
        }
        Ok(Access::Kubeconfig {
            host_path: if kubeadm_init {
                SUPER_ADMIN_CONF.to_string()
            } else {
                path.clone()
            },
            mount_path: path,
        })
    }

    /// The mode flags, checked alone and together.
    ///
    /// # Errors
    /// [`ManifestError::Invalid`] for a flag that is not a Go bool, for `--k8sConfigPath`
    /// with `--inCluster`, or for `--kubeadm-init` with `--inCluster` or without
    /// `--controlplane`.
    /// See [`warnings`].
    fn ineffective(&self) -> Vec<String> {
        let Ok(modes) = self.modes() else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        if !modes.lb {
            for (flag, v) in [
                ("lbPort", &self.lb_port),
                ("lbForwardingMethod", &self.lb_forwarding_method),
            ] {
                if let Some(v) = v {
                    out.push(format!(
                        "--{flag}={v} has no effect without --enableLoadBalancer; not written to the manifest"
                    ));
                }
            }
        }
        // Written (the manager reads them), but they do nothing in this combination.
        if let Some(v) = &self.dhcp_backoff_attempts
            && !modes.svc
        {
            out.push(format!(
                "--dhcpBackoffAttempts={v} has no effect without --services (the manager logs the same)"
            ));
        }
        let election =
            Self::flag_bool("servicesElection", &self.services_election).unwrap_or(false);
        if let Some(v) = &self.services_lease_name
            && election
        {
            out.push(format!(
                "--servicesLeaseName={v} has no effect with --servicesElection (every Service has its own Lease)"
            ));
        }
        out
    }

    fn modes(&self) -> Result<Modes, ManifestError> {
        let modes = Modes {
            lb: Self::flag_bool("enableLoadBalancer", &self.enable_load_balancer)?,
            cp: Self::flag_bool("controlplane", &self.control_plane)?,
            svc: Self::flag_bool("services", &self.services)?,
            in_cluster: Self::flag_bool("inCluster", &self.in_cluster)?,
            kubeadm_init: Self::flag_bool("kubeadm-init", &self.kubeadm_init)?,
            taint: Self::flag_bool("taint", &self.taint)?,
            dhcp: Self::flag_bool("dhcpServices", &self.dhcp_services)?,
            table: Self::flag_bool("table", &self.table)?,
        };
        if modes.dhcp && !modes.svc {
            return Err(ManifestError::Invalid {
                flag: "dhcpServices",
                value: self.dhcp_services.clone().unwrap_or_default(),
                reason: "is about Services with address 0.0.0.0 / ::: add --services".into(),
            });
        }
        let Modes {
            cp,
            in_cluster,
            kubeadm_init,
            ..
        } = modes;
        if in_cluster && let Some(path) = &self.k8s_config_path {
            return Err(ManifestError::Invalid {
                flag: "k8sConfigPath",
                value: path.clone(),
                reason: "is not used with --inCluster (the pod reaches the API with the \
                         ServiceAccount vipd): give one of the two"
                    .into(),
            });
        }
        if kubeadm_init && in_cluster {
            return Err(ManifestError::Invalid {
                flag: "kubeadm-init",
                value: "true".into(),
                reason: "mounts super-admin.conf as the kubeconfig, which --inCluster does not use"
                    .into(),
            });
        }
        if kubeadm_init && !cp {
            return Err(ManifestError::Invalid {
                flag: "kubeadm-init",
                value: "true".into(),
                reason:
                    "is for the control-plane VIP of the first kubeadm node: add --controlplane"
                        .into(),
            });
        }
        Ok(modes)
    }

    /// [`GenArgs::plan`] for a static Pod, which refuses the two DaemonSet-only flags
    /// instead of ignoring them: `--inCluster` (the kubelet mounts no ServiceAccount token
    /// into a static pod, and the API server refuses the mirror pod of a static pod that
    /// names a ServiceAccount, so the pod could never reach the API) and `--taint`
    /// (tolerations and node affinity are scheduling, and a static pod is not scheduled:
    /// it runs where its file is).
    ///
    /// # Errors
    /// [`ManifestError::Invalid`] naming `inCluster` or `taint` when set to true; everything
    /// [`GenArgs::plan`] returns.
    pub fn static_pod_plan(&self) -> Result<Deployment, ManifestError> {
        let plan = self.plan()?;
        if matches!(plan.access, Access::InCluster) {
            return Err(ManifestError::Invalid {
                flag: "inCluster",
                value: "true".into(),
                reason: "a static pod cannot use a ServiceAccount (the kubelet mounts no token \
                         into it and the API server refuses its mirror pod): use \
                         --k8sConfigPath (default /etc/kubernetes/admin.conf) for `manifest \
                         pod`, or `manifest daemonset --inCluster`"
                    .into(),
            });
        }
        if plan.taint {
            return Err(ManifestError::Invalid {
                flag: "taint",
                value: "true".into(),
                reason: "applies to `manifest daemonset` only: a static pod is not scheduled, \
                         it runs on the node whose kubelet reads its file"
                    .into(),
            });
        }
        Ok(plan)
    }

    /// [`GenArgs::plan`] for a DaemonSet, which runs the same Pod on every node: a
    /// `--prometheusHTTPServer` bound to one node's address would fail to bind (and its
    /// probes would ask that node) everywhere else, so only `:port`, an unspecified address
    /// or loopback are accepted.
    ///
    /// # Errors
    /// [`ManifestError::Invalid`] naming `prometheusHTTPServer`; everything
    /// [`GenArgs::plan`] returns.
    pub fn daemonset_plan(&self) -> Result<Deployment, ManifestError> {
        let plan = self.plan()?;
        if let Some(h) = &plan.admin_host {
            let loopback = h == "localhost"
                || h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                return Err(ManifestError::Invalid {
                    flag: "prometheusHTTPServer",
                    value: self.prometheus_server.clone().unwrap_or_default(),
                    reason: "a DaemonSet runs on every node: bind :PORT (every address) or \
                             localhost:PORT, not one node's address"
                        .into(),
                });
            }
        }
        Ok(plan)
    }

    /// Checks the flags and turns them into a [`Deployment`].
    ///
    /// # Errors
    /// [`ManifestError::Invalid`] for unusable values and flag combinations,
    /// [`ManifestError::Config`] when `vipd manager` would refuse the generated environment.
    pub fn plan(&self) -> Result<Deployment, ManifestError> {
        let Modes {
            cp,
            svc,
            in_cluster,
            kubeadm_init,
            taint,
            lb,
            dhcp,
            table,
        } = self.modes()?;
        let mut env: Vec<(&'static str, EnvValue)> = Vec::new();
        let mut push = |flag: &'static str, v: &str| -> Result<(), ManifestError> {
            env.push((env_for(flag)?, EnvValue::Text(v.to_string())));
            Ok(())
        };
        let bool_text = |b: bool| if b { "true" } else { "false" };
        // The mode first, as kube-vip writes it.
        push("arp", self.arp.as_deref().unwrap_or("true"))?;
        push(
            "leaderElection",
            self.leader_election.as_deref().unwrap_or("true"),
        )?;
        if let Some(i) = &self.interface {
            push("interface", i)?;
        }
        let port = self
            .port
            .clone()
            .unwrap_or(default_for("port")?.to_string());
        push("port", &port)?;
        push("controlplane", bool_text(cp))?;
        push("services", bool_text(svc))?;
        if let Some(a) = &self.address {
            push("address", a)?;
        }
        if let Some(s) = &self.vip_subnet {
            push("vipSubnet", s)?;
        }
        let namespace = self
            .namespace
            .clone()
            .unwrap_or(default_for("namespace")?.to_string());
        push("namespace", &namespace)?;
        if let Some(n) = &self.lease_name {
            push("leaseName", n)?;
        }
        if let Some(n) = &self.services_lease_name {
            push("servicesLeaseName", n)?;
        }
        self.push_timings_and_tuning(lb, &mut push)?;
        let prometheus = self
            .prometheus_server
            .clone()
            .unwrap_or(config::DEFAULT_PROMETHEUS_SERVER.to_string());
        push("prometheusHTTPServer", &prometheus)?;
        // The API address is set explicitly instead of relying on hostAliases (S29): the
        // node's own API server in control-plane mode.
        let api_addr = crate::kube::client::api_address(self.kubernetes_addr.as_deref(), cp, port);
        if let Some(a) = &api_addr {
            push("kubernetesAddr", a)?;
        }
        let access = self.access(in_cluster, kubeadm_init)?;
        if let Access::Kubeconfig { mount_path, .. } = &access {
            push("k8sConfigPath", mount_path)?;
        }
        env.push((env_for("nodeName")?, EnvValue::NodeName));
        // Refused kube-vip features: the manager's configuration check (`Deployment::resolve`
        // below) refuses them with the feature's name, as it would at start.
        for (k, v) in self.refused.given() {
            env.push((k, EnvValue::Text(v.clone())));
        }

        let (admin_host, admin_port) = admin_endpoint(&prometheus)?;
        let mut plan = Deployment {
            env,
            namespace,
            image: self.image.clone(),
            access,
            taint,
            admin_port,
            admin_host,
            privileged: dhcp || table,
        };
        // Elected routing-table mode needs Service leases longer than the route's lifetime
        // and its withdrawal slack: 5/3/1, what the manager uses when no timing is given.
        // Timings given (which the Service leases inherit) are written as given, and the
        // manager's check below refuses them if they are too short.
        let timings_given = [
            &self.lease_duration,
            &self.renew_deadline,
            &self.retry_period,
        ]
        .iter()
        .any(|t| t.is_some());
        if table && svc && !timings_given {
            let t = crate::holder::ROUTED_SERVICE_TIMING;
            plan.push_service_timings(
                [t.lease_duration, t.renew_deadline, t.retry_period]
                    .map(|d| d.as_secs().to_string()),
            )?;
        }
        let resolved = plan.resolve()?;
        // Unless the user turned it off, ride-through is wanted (vipd's default where the
        // Service timings allow it): write Service timings it can work with.
        let ride_wanted =
            self.services_ride_through.is_none() || resolved.config.services_ride_through;
        if ride_timings_needed(&resolved.config, ride_wanted) {
            let (l, r, p) = crate::peer::ridethrough::RIDE_SERVICE_TIMINGS;
            plan.push_service_timings([l, r, p].map(str::to_string))?;
            plan.resolve()?;
        }
        Ok(plan)
    }

    /// The lease timings, the flags passed through as given and, when `lb` is on, the
    /// load balancer's variables, in this order, through `push` (part of [`Self::plan`]).
    fn push_timings_and_tuning(
        &self,
        lb: bool,
        push: &mut impl FnMut(&'static str, &str) -> Result<(), ManifestError>,
    ) -> Result<(), ManifestError> {
        push(
            "leaseDuration",
            self.lease_duration
                .as_deref()
                .unwrap_or(default_for("leaseDuration")?),
        )?;
        push(
            "leaseRenewDuration",
            self.renew_deadline
                .as_deref()
                .unwrap_or(default_for("leaseRenewDuration")?),
        )?;
        push(
            "leaseRetry",
            self.retry_period
                .as_deref()
                .unwrap_or(default_for("leaseRetry")?),
        )?;
        // Passed through as given; `vipd manager` checks them (plan.resolve() below).
        for (flag, value) in [
            ("arpRate", &self.arp_rate),
            ("servicesElection", &self.services_election),
            ("servicesRideThrough", &self.services_ride_through),
            ("dhcpBackoffAttempts", &self.dhcp_backoff_attempts),
            ("nftFence", &self.nft_fence),
            ("table", &self.table),
            ("tableID", &self.table_id),
            ("tableType", &self.table_type),
            ("routingProtocol", &self.routing_protocol),
            ("cleanRoutingTable", &self.clean_routing_table),
            ("serviceInterface", &self.service_interface),
            ("lbClassOnly", &self.lb_class_only),
            ("lbClassName", &self.lb_class_name),
            ("enableNodeLabeling", &self.enable_node_labeling),
            ("log", &self.log),
        ] {
            if let Some(v) = value {
                push(flag, v)?;
            }
        }
        // As kube-vip's generator: all three load-balancer variables when it is enabled.
        if lb {
            push("enableLoadBalancer", "true")?;
            push(
                "lbPort",
                self.lb_port.as_deref().unwrap_or(default_for("lbPort")?),
            )?;
            push(
                "lbForwardingMethod",
                self.lb_forwarding_method
                    .as_deref()
                    .unwrap_or(default_for("lbForwardingMethod")?),
            )?;
        }
        Ok(())
    }
}

/// The mode flags of `vipd manifest pod|daemonset`, parsed as Go bools.
#[derive(Debug, Clone, Copy)]
struct Modes {
    /// `--controlplane`
    cp: bool,
    /// `--services`
    svc: bool,
    /// `--inCluster`
    in_cluster: bool,
    /// `--kubeadm-init`
    kubeadm_init: bool,
    /// `--taint`
    taint: bool,
    /// `--dhcpServices`
    dhcp: bool,
    /// `--table`
    table: bool,
    /// `--enableLoadBalancer`
    lb: bool,
}

/// Splits `prometheus_server` (`host:port`, `[v6]:port`, `:port`, empty = disabled).
fn admin_endpoint(value: &str) -> Result<(Option<String>, Option<u16>), ManifestError> {
    if value.is_empty() {
        return Ok((None, None));
    }
    let invalid = |reason: &str| ManifestError::Invalid {
        flag: "prometheusHTTPServer",
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let (host, port) = crate::syntax::split_host_port(value).map_err(invalid)?;
    let host = match host {
        "" | "0.0.0.0" | "::" => None,
        h => Some(h.to_string()),
    };
    Ok((host, Some(port)))
}

impl Deployment {
    /// Writes the Service lease timings `values` (duration, renew deadline, retry period,
    /// seconds) as `svc_leaseduration`, `svc_renewdeadline`, `svc_retryperiod`.
    ///
    /// # Errors
    /// [`ManifestError::UnknownFlag`] when the option table lacks one (a vipd bug).
    fn push_service_timings(&mut self, values: [String; 3]) -> Result<(), ManifestError> {
        for (flag, v) in [
            "servicesLeaseDuration",
            "servicesLeaseRenewDuration",
            "servicesLeaseRetry",
        ]
        .into_iter()
        .zip(values)
        {
            self.env.push((env_for(flag)?, EnvValue::Text(v)));
        }
        Ok(())
    }

    /// The environment as `vipd manager` sees it in a pod on node `node_name`.
    pub fn env_for_node(&self, node_name: &str) -> Vec<(String, String)> {
        self.env
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    EnvValue::Text(t) => t.clone(),
                    EnvValue::NodeName => node_name.to_string(),
                };
                (k.to_string(), v)
            })
            .collect()
    }

    /// Resolves the environment exactly as `vipd manager` (no flags, no config file) would on
    /// a node named [`VALIDATION_NODE_NAME`].
    ///
    /// # Errors
    /// [`ManifestError::Config`] with the manager's error.
    pub fn resolve(&self) -> Result<config::Resolved, ManifestError> {
        let env = self.env_for_node(VALIDATION_NODE_NAME);
        resolve_env(&env).map_err(|e| ManifestError::Config(as_generator_flag(e)))
    }
}

/// Whether a configuration where `svc_ridethrough` is wanted (`ride_wanted`: not turned off
/// by the user) needs the Service lease timings
/// [`crate::peer::ridethrough::RIDE_SERVICE_TIMINGS`] written: its Service timings do not
/// let a ride start within the API fence, which the manager refuses with ride-through set
/// (`RideConfig::check_start`) and under which its default leaves ride-through off.
fn ride_timings_needed(c: &config::Config, ride_wanted: bool) -> bool {
    c.services
        && ride_wanted
        && !crate::peer::ridethrough::RideConfig::start_ok_for(&c.services_timing)
}

/// The manager names a bad setting by where it read it (an environment variable, or a
/// default when the variable is absent); the generator's user gave a flag, so the error
/// names the generator's flag for that setting instead, e.g. `flag --vipSubnet (vip_subnet)`.
fn as_generator_flag(e: config::ConfigError) -> config::ConfigError {
    match e {
        config::ConfigError::Invalid {
            key, value, reason, ..
        } if config::option(key).is_some_and(|o| !o.flag.is_empty()) => {
            let flag = config::option(key).map(|o| o.flag).unwrap_or_default();
            config::ConfigError::Invalid {
                key,
                setting: format!("flag --{flag} ({key})"),
                value,
                reason,
            }
        }
        other => other,
    }
}

/// Resolves `vipd manager`'s configuration from exactly `env` (`name -> value`), with no
/// flags and no config file; the node name must be among `env`.
///
/// # Errors
/// Whatever [`config::resolve_detailed`] returns.
pub fn resolve_env(env: &[(String, String)]) -> Result<config::Resolved, config::ConfigError> {
    let lookup = |k: &str| {
        env.iter()
            .rev()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
    };
    config::resolve_detailed(&ManagerArgs::default(), &lookup, None, &|| None)
}

/// Serialises Kubernetes objects as a multi-document YAML stream (`---` separated).
///
/// # Errors
/// [`ManifestError::Yaml`].
pub(crate) fn to_yaml_stream<T: serde::Serialize>(objects: &[T]) -> Result<String, ManifestError> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(o).map_err(|e| ManifestError::Yaml(e.to_string()))?);
    }
    Ok(out)
}

/// Warnings about generator flags that have no effect on the generated output, one line
/// each (for stderr; the output itself is unchanged): `--lbPort` and
/// `--lbForwardingMethod` without `--enableLoadBalancer` are not written, as kube-vip's
/// generator does. Empty when the flags do not parse (then [`run`] reports the error).
pub fn warnings(cmd: &ManifestCommand) -> Vec<String> {
    match cmd {
        ManifestCommand::Pod(a) | ManifestCommand::Daemonset(a) => a.ineffective(),
        ManifestCommand::Systemd(a) if a.environment_file => a.generator.ineffective(),
        _ => Vec::new(),
    }
}

/// Runs `vipd manifest ...` and returns what it prints.
///
/// # Errors
/// See [`GenArgs::plan`], [`rbac::RbacArgs`], [`ManifestError::Yaml`].
pub fn run(cmd: &ManifestCommand) -> Result<String, ManifestError> {
    match cmd {
        ManifestCommand::Pod(a) => pod::pod_yaml(&a.static_pod_plan()?),
        ManifestCommand::Daemonset(a) => pod::daemonset_yaml(&a.daemonset_plan()?),
        ManifestCommand::Rbac(a) => rbac::rbac_yaml(a),
        ManifestCommand::PeerKey(a) => rbac::peer_key_yaml(&a.namespace),
        ManifestCommand::Systemd(a) => systemd::render(a),
        ManifestCommand::Bird(a) => routed::run(routed::Daemon::Bird, a),
        ManifestCommand::Frr(a) => routed::run(routed::Daemon::Frr, a),
    }
}

#[cfg(test)]
mod tests;
