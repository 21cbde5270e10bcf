//! Resolution: flags, environment and config file into one validated [`Config`], with
//! kube-vip's precedence (see the module docs of [`crate::config`]).

use super::options::*;
use super::parse::*;
use super::*;
use crate::controlplane::lb::LoadBalancerConfig;
use crate::lease::LeaseConfig;
use services::*;

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
    /// system hostname (`/proc/sys/kernel/hostname`) as the default node name. Returns the
    /// warnings unlogged: the binary logs them once its log output is set up
    /// ([`Resolved::init_logging_then_warn`]).
    ///
    /// Errors: everything [`resolve`] returns, plus [`ConfigError::FileRead`].
    pub fn from_process(args: &ManagerArgs) -> Result<Resolved, ConfigError> {
        let env = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
        let path = env(K_CONFIG_FILE).filter(|p| !p.is_empty()).or_else(|| {
            args.flag(K_CONFIG_FILE)
                .filter(|p| !p.is_empty())
                .map(str::to_string)
        });
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
        resolve_detailed(args, &env, text.as_deref(), &system_hostname)
    }
}

impl Resolved {
    /// Calls `init_logging` with the configured log level (`vip_loglevel`), then logs the
    /// warnings with `tracing::warn!`, in that order: a warning logged before the log
    /// output exists goes nowhere. Returns the configuration.
    pub fn init_logging_then_warn(self, init_logging: impl FnOnce(LogLevel)) -> Config {
        init_logging(self.config.log_level);
        for w in &self.warnings {
            tracing::warn!("{w}");
        }
        self.config
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
    let inputs = Inputs::new(args.flag_values(), env, file)?;
    let mut warnings = Vec::new();

    check_kube_vip_only(&inputs, &mut warnings)?;
    let modes = modes(&inputs)?;
    let (addresses, vip_subnet) = addresses(&inputs, &modes, &mut warnings)?;
    let port = match inputs.get(K_PORT) {
        Some(raw) => parse_port(&raw)?,
        None => DEFAULT_PORT,
    };
    let node_name = node_name(&inputs, hostname)?;
    let interface = interface_option(&inputs, K_INTERFACE)?;
    let services_interface = interface_option(&inputs, K_SVC_INTERFACE)?;
    let (arp_rate, arp_probe) = arp_timings(&inputs)?;
    let nft_fence =
        crate::net::nft::fence::NftFenceSetting::from_option(match inputs.get(K_NFT_FENCE) {
            Some(_) => Some(inputs.bool_or(K_NFT_FENCE, true)?),
            None => None,
        });
    let lease = lease(&inputs, nft_fence.wanted())?;
    let services_timing = services_timing(&inputs, &lease, nft_fence.wanted())?;
    let svc = services(&inputs, modes.services, &mut warnings)?;
    let routing_table = routed::routing_table(&inputs, &modes, &mut warnings)?;
    if routing_table.is_some() && modes.control_plane {
        // Without election: every healthy node routes it, only the fence must fit.
        routed::route_fence_fits(&inputs, &lease.timing, &[K_LEASE_DURATION], false)?;
    }
    let unelected =
        super::services_unelected(routing_table.is_some(), svc.election, modes.leader_election);
    let services_timing = match routing_table {
        Some(_) if modes.services => {
            routed::services_route_timing(&inputs, services_timing, !unelected)?
        }
        _ => services_timing,
    };
    // Without election (routing-table mode, vip_leaderelection=false) no lease is held, so
    // there is nothing to ride through: off, and a warning when asked for.
    let services_ride_through = match unelected {
        true => {
            if let Some(raw) = inputs.get(K_SVC_RIDETHROUGH)
                && parse_bool(&raw)?
            {
                warnings.push(format!(
                    "{} has no effect without election (vip_routingtable with svc_election=false and vip_leaderelection=false): every node routes on its own, no lease to ride through",
                    raw.setting()
                ));
            }
            false
        }
        false => inputs.bool_or(K_SVC_RIDETHROUGH, ride_through_fits(&services_timing))?,
    };
    let ipam = ipam(&inputs, modes.services, &mut warnings)?;
    let dhcp_backoff_attempts = dhcp_backoff_attempts(&inputs, modes.services, &mut warnings)?;
    let api = api_access(&inputs)?;
    let load_balancer = load_balancer(&inputs)?;
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
        arp: true,
        arp_rate,
        arp_probe,
        control_plane: modes.control_plane,
        services: modes.services,
        leader_election: modes.leader_election,
        lease,
        services_timing,
        services_election: svc.election,
        services_lease_shards: svc.lease_shards,
        services_ipv6_loopback: svc.ipv6_loopback,
        services_ride_through,
        services_ride_through_set: inputs.get(K_SVC_RIDETHROUGH).is_some(),
        ipam,
        services_lease_name: svc.lease_name,
        services_namespace: svc.namespace,
        lb_class_only: svc.lb_class_only,
        lb_class_name: svc.lb_class_name,
        services_interface,
        // A routed VIP is on no node subnet: routing-table mode checks none by default.
        services_subnet_check: inputs.bool_or(K_SVC_SUBNET_CHECK, routing_table.is_none())?,
        service_security: inputs.bool_or(K_SERVICE_SECURITY, false)?,
        egress: egress(&inputs)?,
        prometheus_server: api.prometheus_server,
        kubeconfig: api.kubeconfig,
        kubernetes_addr: api.kubernetes_addr,
        dhcp_backoff_attempts,
        ipv6_dad: modes.ipv6_dad,
        nft_fence,
        routing_table,
        eligibility: crate::nodes::eligibility::EligibilityRules {
            drain_on_cordon: inputs.bool_or(K_DRAIN_ON_CORDON, false)?,
            exclude_cordoned: inputs.bool_or(K_SVC_EXCLUDE_CORDONED, false)?,
        },
        services_health: services_health(&inputs)?,
        services_failback: services_failback(&inputs)?,
        enable_node_labeling: api.enable_node_labeling,
        load_balancer,
        log_level,
    };
    Ok(Resolved { config, warnings })
}

/// `vip_arpRate` and `vip_arpprobe`: the gratuitous ARP interval and the conflict probe's
/// listening time, checked against their bounds.
fn arp_timings(inputs: &Inputs<'_>) -> Result<(Duration, Duration), ConfigError> {
    let arp_rate = match inputs.get(K_ARP_RATE) {
        Some(raw) => parse_millis(&raw, MIN_ARP_RATE, MAX_ARP_RATE)?,
        None => DEFAULT_ARP_RATE,
    };
    let arp_probe = match inputs.get(K_ARP_PROBE) {
        Some(raw) => parse_millis(&raw, Duration::ZERO, MAX_ARP_PROBE)?,
        None => DEFAULT_ARP_PROBE,
    };
    Ok((arp_rate, arp_probe))
}

/// `dhcp_backoff_attempts` (default 0: retry forever); warns when it is set without
/// `svc_enable` (only Services use DHCP).
fn dhcp_backoff_attempts(
    inputs: &Inputs<'_>,
    services: bool,
    warnings: &mut Vec<String>,
) -> Result<u32, ConfigError> {
    let Some(raw) = inputs.get(K_DHCP_BACKOFF_ATTEMPTS) else {
        return Ok(0);
    };
    let n = parse_count(&raw)?;
    if !services {
        warnings.push(format!(
            "{} has no effect without svc_enable (only Services with address 0.0.0.0 / :: use DHCP)",
            raw.setting()
        ));
    }
    Ok(n)
}

/// `svc_failback_holddown`'s default.
pub(crate) const DEFAULT_FAILBACK_HOLDDOWN: Duration = Duration::from_secs(30);

/// What vipd runs (`cp_enable`, `svc_enable`, `vip_ipv6_dad`).
pub(super) struct Modes {
    control_plane: bool,
    services: bool,
    ipv6_dad: bool,
    leader_election: bool,
}

/// The modes, and the kube-vip modes vipd does not offer (`vip_arp=false`,
/// `vip_leaderelection=false` with `cp_enable`) refused with the reason.
fn modes(inputs: &Inputs<'_>) -> Result<Modes, ConfigError> {
    let control_plane = inputs.bool_or(K_CP_ENABLE, false)?;
    let services = inputs.bool_or(K_SVC_ENABLE, false)?;
    let ipv6_dad = inputs.bool_or(K_IPV6_DAD, false)?;
    // Routing-table mode announces nothing on the segment: kube-vip's guide turns
    // vip_arp off with it.
    if let Some(raw) = inputs.get(K_ARP)
        && !parse_bool(&raw)?
        && !inputs.bool_or(K_ROUTING_TABLE, false)?
    {
        return Err(raw.invalid(
            "vipd only implements ARP/NDP announcement and routing-table mode; remove vip_arp, set it to true, or set vip_routingtable=true",
        ));
    }
    // vip_leaderelection governs the control-plane election only (Service leases are
    // always elected): with cp_enable off it has nothing to govern, and Harvester's guest
    // clusters set it to false. Routing-table mode without svc_election is the exception:
    // false there means every node routes (Config::services_unelected).
    let leader_election = match inputs.get(K_LEADER_ELECTION) {
        Some(raw) => {
            let on = parse_bool(&raw)?;
            // Routing-table mode has no control-plane election at all (kube-vip's), so
            // false is harmless there.
            if !on && control_plane && !inputs.bool_or(K_ROUTING_TABLE, false)? {
                return Err(raw.invalid(
            "vipd always uses Lease leader election for the control-plane VIP (without it every node would answer for the VIP); remove vip_leaderelection or set it to true",
                ));
            }
            on
        }
        None => true,
    };
    if !control_plane && !services {
        let raw = inputs
            .get(K_CP_ENABLE)
            .unwrap_or_else(|| Raw::default_of(K_CP_ENABLE, "false"));
        return Err(raw.invalid(
            "neither cp_enable (--controlplane) nor svc_enable (--services) is true: vipd would have nothing to do",
        ));
    }
    Ok(Modes {
        control_plane,
        services,
        ipv6_dad,
        leader_election,
    })
}

/// The value of `key`, else of its deprecated alias `old` (with a warning either way when
/// the alias is set).
fn with_alias(
    inputs: &Inputs<'_>,
    key: &'static str,
    old: &'static str,
    warnings: &mut Vec<String>,
) -> Option<Raw> {
    match (inputs.get(key), inputs.get(old)) {
        (Some(new), Some(old)) => {
            warnings.push(format!(
                "{} is deprecated and ignored because {} is set",
                old.setting(),
                new.setting()
            ));
            Some(new)
        }
        (Some(new), None) => Some(new),
        (None, Some(old_raw)) => {
            warnings.push(format!(
                "{} is deprecated: use {key} instead",
                old_raw.setting()
            ));
            Some(old_raw)
        }
        (None, None) => None,
    }
}

/// The control-plane VIPs (`address`, alias `vip_address`) and their prefix lengths
/// (`vip_subnet`, alias `vip_cidr`).
fn addresses(
    inputs: &Inputs<'_>,
    modes: &Modes,
    warnings: &mut Vec<String>,
) -> Result<(Vec<IpAddr>, VipSubnet), ConfigError> {
    let address_raw = with_alias(inputs, K_ADDRESS, K_VIP_ADDRESS, warnings);
    let addresses = match &address_raw {
        Some(raw) => parse_addresses(raw)?,
        None => Vec::new(),
    };
    if modes.control_plane && addresses.is_empty() {
        let raw = address_raw.unwrap_or_else(|| Raw::default_of(K_ADDRESS, ""));
        return Err(raw.invalid(
            "cp_enable needs at least one VIP in address (--address); DHCP (address 0.0.0.0) gives Services their addresses, not the control plane",
        ));
    }
    let vip_subnet = match with_alias(inputs, K_SUBNET, K_CIDR, warnings) {
        Some(raw) => parse_subnet(&raw, &addresses)?,
        None => VipSubnet {
            v4: DEFAULT_V4_PREFIX,
            v6: DEFAULT_V6_PREFIX,
        },
    };
    // A VIP that is the network or broadcast address of its own prefix is unreachable
    // (the subnets on its interface are checked at start: controlplane::subnet_edges).
    for a in &addresses {
        let prefix = if a.is_ipv6() {
            vip_subnet.v6
        } else {
            vip_subnet.v4
        };
        if let (Some(edge), Some(raw)) = (crate::net::subnet_edge(*a, prefix), &address_raw) {
            return Err(raw.invalid(format!(
                "{a} is the {edge} of {}/{prefix} (its prefix from vip_subnet); hosts on the \
                 segment do not send unicast to it: choose a host address of the subnet",
                crate::net::network_of(*a, prefix)
            )));
        }
    }
    Ok((addresses, vip_subnet))
}

/// `vip_nodename`, else the hostname lower-cased; a DNS-1123 subdomain either way.
fn node_name(
    inputs: &Inputs<'_>,
    hostname: &dyn Fn() -> Option<String>,
) -> Result<String, ConfigError> {
    let raw = match inputs.get(K_NODE_NAME) {
        Some(raw) => raw,
        None => Raw {
            key: K_NODE_NAME,
            value: hostname()
                .map(|h| h.trim().to_lowercase())
                .filter(|h| !h.is_empty())
                .ok_or(ConfigError::NoNodeName)?,
            origin: Origin::Hostname,
        },
    };
    check_dns1123_subdomain(&raw)?;
    Ok(raw.value)
}

/// An interface option (`vip_interface`, `vip_servicesinterface`); `None` when unset/empty.
fn interface_option(inputs: &Inputs<'_>, key: &'static str) -> Result<Option<String>, ConfigError> {
    Ok(inputs.get(key).map(parse_interface).transpose()?.flatten())
}

/// The control-plane lease: name, namespace and timings.
/// `svc_ridethrough`'s default (issue 27): on when the Service lease timings have the
/// whole-second address fence and peer protocol timings its safety argument needs, and let
/// a ride start within the API fence (`RideConfig::start_ok_for`: kube-vip's 5/3/1 does,
/// vipd's bare 3/2/1 does not, so `vipd manifest` writes 5/3/1 for Services); off otherwise,
/// where setting it explicitly is refused at start with the reason.
pub(crate) fn ride_through_fits(services_timing: &crate::lease::Timing) -> bool {
    crate::lease::fence_lifetime(services_timing).is_ok_and(|secs| {
        crate::peer::ridethrough::RideConfig::new(services_timing, secs).is_ok()
            && crate::peer::ridethrough::RideConfig::start_ok_for(services_timing)
    })
}

fn lease(inputs: &Inputs<'_>, nft_fence: bool) -> Result<LeaseConfig, ConfigError> {
    let name = inputs.text_or(K_LEASE_NAME, DEFAULT_LEASE_NAME);
    check_dns1123_subdomain(&name)?;
    let namespace = inputs.text_or(K_NAMESPACE, DEFAULT_NAMESPACE);
    check_dns1123_label(&namespace)?;
    let timing = lease_timings(
        inputs,
        [K_LEASE_DURATION, K_RENEW_DEADLINE, K_RETRY_PERIOD],
        [
            DEFAULT_LEASE_DURATION,
            DEFAULT_RENEW_DEADLINE,
            DEFAULT_RETRY_PERIOD,
        ],
        nft_fence,
    )?;
    Ok(LeaseConfig {
        name: name.value,
        namespace: namespace.value,
        timing,
    })
}

/// `lb_enable`, `lb_port`, `lb_fwdmethod` (the last two are checked even with `lb_enable`
/// off, as kube-vip parses them regardless).
fn load_balancer(inputs: &Inputs<'_>) -> Result<Option<LoadBalancerConfig>, ConfigError> {
    let lb_port = match inputs.get(K_LB_PORT) {
        Some(raw) => parse_port(&raw)?,
        None => crate::controlplane::lb::DEFAULT_LB_PORT,
    };
    let forwarding = match inputs.get(K_LB_FWD) {
        Some(raw) if raw.value.is_empty() => crate::controlplane::lb::Forwarding::default(),
        Some(raw) => {
            crate::controlplane::lb::Forwarding::parse(&raw.value).map_err(|r| raw.invalid(r))?
        }
        None => crate::controlplane::lb::Forwarding::default(),
    };
    Ok(inputs
        .bool_or(K_LB_ENABLE, false)?
        .then_some(LoadBalancerConfig {
            lb_port,
            forwarding,
        }))
}

/// API access and the admin endpoint.
pub(super) struct ApiAccess {
    prometheus_server: Option<crate::syntax::ListenAddr>,
    kubeconfig: Option<PathBuf>,
    kubernetes_addr: Option<String>,
    enable_node_labeling: bool,
}

/// `prometheus_server` (empty disables it), `k8s_config_file`, `kubernetes_addr`,
/// `enable_node_labeling`.
fn api_access(inputs: &Inputs<'_>) -> Result<ApiAccess, ConfigError> {
    let prometheus_server = match inputs.get(K_PROMETHEUS) {
        Some(raw) if raw.value.is_empty() => None,
        Some(raw) => {
            Some(crate::syntax::ListenAddr::parse(&raw.value).map_err(|r| raw.invalid(r))?)
        }
        None => Some(
            crate::syntax::ListenAddr::parse(DEFAULT_PROMETHEUS_SERVER)
                .map_err(|r| Raw::default_of(K_PROMETHEUS, DEFAULT_PROMETHEUS_SERVER).invalid(r))?,
        ),
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
            check_host_port(&raw)?;
            Some(raw.value)
        }
        None => None,
    };
    Ok(ApiAccess {
        prometheus_server,
        kubeconfig,
        kubernetes_addr,
        enable_node_labeling: inputs.bool_or(K_NODE_LABELING, false)?,
    })
}

/// The hostname from `/proc/sys/kernel/hostname` (Linux), else `/etc/hostname`.
pub(super) fn system_hostname() -> Option<String> {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
}

pub(super) struct Inputs<'a> {
    pub(super) flags: Vec<(&'static str, &'a str)>,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
    pub(super) file: BTreeMap<String, String>,
}

impl<'a> Inputs<'a> {
    /// The inputs of one resolution: the flags given, the environment, and the config
    /// file's text (parsed here).
    ///
    /// # Errors
    /// [`ConfigError::File`] for a malformed file or an unknown key.
    pub(super) fn new(
        flags: Vec<(&'static str, &'a str)>,
        env: &'a dyn Fn(&str) -> Option<String>,
        file: Option<&str>,
    ) -> Result<Inputs<'a>, ConfigError> {
        let file = match file {
            Some(text) => parse_file(text)?,
            None => BTreeMap::new(),
        };
        Ok(Inputs { flags, env, file })
    }

    /// The value of `key` by kube-vip's precedence: environment, flag, file.
    pub(super) fn get(&self, key: &'static str) -> Option<Raw> {
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

    pub(super) fn bool_or(&self, key: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            Some(raw) => parse_bool(&raw),
            None => Ok(default),
        }
    }

    pub(super) fn text_or(&self, key: &'static str, default: &str) -> Raw {
        self.get(key)
            .unwrap_or_else(|| Raw::default_of(key, default))
    }
}

/// Parses and checks one set of lease timings (`keys` = duration, renew deadline, retry
/// period env names; `defaults` used for unset ones): renew deadline < duration, renew
/// deadline > client-go's jitter factor x retry period, retry period at least
/// [`MIN_RETRY_PERIOD`], and a fence for them ([`crate::lease::fence_plan`] with
/// `nft_fence`: `vip_nftfence` not false; sub-second timings need it). The manager, the manifest
/// generator and `vipd preflight` all resolve the configuration here, so what one refuses
/// the others refuse too. Errors name the setting and value.
pub(super) fn lease_timings(
    inputs: &Inputs<'_>,
    keys: [&'static str; 3],
    defaults: [Duration; 3],
    nft_fence: bool,
) -> Result<Timing, ConfigError> {
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
    if retry_period < MIN_RETRY_PERIOD {
        return Err(shown(2).invalid(format!(
            "the retry period must be at least {} s: the holder writes the lease once per retry period",
            MIN_RETRY_PERIOD.as_secs_f64()
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
    let timing = Timing {
        lease_duration,
        renew_deadline,
        retry_period,
    };
    crate::lease::fence_plan(&timing, nft_fence).map_err(|e| shown(0).invalid(e.to_string()))?;
    Ok(timing)
}

/// Refuse the kube-vip options vipd does not implement; warn about the ignored ones.
pub(super) fn check_kube_vip_only(
    inputs: &Inputs<'_>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
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
pub(super) fn parse_file(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
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

mod routed;
mod services;

pub use routed::{routed_settings, routed_settings_from_process};

/// `egress_podcidr`, `egress_servicecidr`: comma-separated CIDRs (kube-vip takes one; a
/// list is accepted), each error naming the setting and the entry;
/// `egress_enableinternalsnat`.
fn egress(inputs: &Inputs<'_>) -> Result<crate::egress::Settings, ConfigError> {
    let cidrs = |key: &'static str| match inputs.get(key) {
        Some(raw) => crate::egress::plan::parse_networks(key, &raw.value)
            .map_err(|reason| raw.invalid(reason)),
        None => Ok(Vec::new()),
    };
    Ok(crate::egress::Settings {
        pod_cidrs: cidrs(K_EGRESS_PODCIDR)?,
        service_cidrs: cidrs(K_EGRESS_SERVICECIDR)?,
        internal_snat: inputs.bool_or(K_EGRESS_INTERNAL_SNAT, false)?,
        // The manager reads it from its environment (KUBERNETES_SERVICE_HOST).
        api_server: None,
        // The manager knows whether the fence started.
        fence: false,
    })
}
