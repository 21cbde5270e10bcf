//! Resolving kube-vip's BGP options (`bgp_*`, `mpbgp_*`) and the routing table's id and
//! protocol into [`crate::routed::Settings`], for `vipd manifest bird|frr`: the same
//! inputs, precedence and messages as `vipd manager` (which refuses the BGP options and reads
//! the table's id and protocol only in routing-table mode, [`routing_table`]).

use super::super::options::{
    K_CLEAN_ROUTING_TABLE, K_CONFIG_FILE, K_LB_ENABLE, K_NODE_LABELING, K_ROUTING_PROTOCOL,
    K_ROUTING_TABLE, K_ROUTING_TABLE_ID, K_ROUTING_TABLE_TYPE,
};
use super::super::parse::*;
use super::super::*;
use super::Inputs;
use crate::routed;

/// Parses `raw` with a wing parser whose error is a reason; the error names the setting and
/// the value ([`ConfigError::Invalid`]).
fn with<T>(raw: &Raw, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<T, ConfigError> {
    parse(&raw.value).map_err(|reason| {
        let mut e = raw.invalid(reason);
        // Passwords stay out of messages and logs.
        if let ConfigError::Invalid { value, .. } = &mut e {
            match raw.key {
                "bgp_peerpass" => *value = "<hidden>".into(),
                "bgp_peers" => *value = routed::redact_passwords(value),
                _ => {}
            }
        }
        e
    })
}

/// Resolves the BGP settings from flags, environment and config-file text (YAML, keys =
/// kube-vip environment variable names) with `vipd manager`'s precedence (environment >
/// flag > file > default, see [`crate::config`]). Pure.
///
/// Defaults are kube-vip's (`cmd/kube-vip.go`): `bgp_as` and `bgp_peeras` 65000, hold time
/// 30 s, keepalive 10 s, table 198, protocol 248. `bgp_peeraddress` adds one peer after
/// those of `bgp_peers` (`pkg/kubevip/config_environment.go`).
///
/// # Errors
/// [`ConfigError::Invalid`] naming the setting and value: an unparsable peer list, an AS
/// out of range, a bad address, a timer out of range, a keepalive not below the hold time,
/// no peer at all (neither `bgp_peers` nor `bgp_peeraddress`); [`ConfigError::File`] for a
/// malformed config file.
pub fn routed_settings(
    args: &RoutedArgs,
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&str>,
) -> Result<routed::Settings, ConfigError> {
    let inputs = Inputs::new(args.flag_values(), env, file)?;
    let router_id = match inputs.get("bgp_routerid") {
        Some(raw) => Some(with(&raw, |v| {
            v.parse::<std::net::Ipv4Addr>()
                .map_err(|_| format!("{v:?} is not an IPv4 address (a BGP router ID is one)"))
        })?),
        None => None,
    };
    let router_interface = inputs
        .get("bgp_routerinterface")
        .map(parse_interface)
        .transpose()?
        .flatten();
    let local_as = match inputs.get("bgp_as") {
        Some(raw) => with(&raw, routed::parse_as)?,
        None => routed::DEFAULT_LOCAL_AS,
    };
    let mut peers = match inputs.get("bgp_peers") {
        Some(raw) => with(&raw, routed::parse_peers)?,
        None => Vec::new(),
    };
    if let Some(raw) = inputs.get("bgp_peeraddress") {
        let address = routed::PeerAddress::Ip(with(&raw, routed::parse_peer_address)?);
        if peers.iter().any(|p| p.address == address) {
            return Err(raw.invalid("this peer is also in bgp_peers"));
        }
        let asn = match inputs.get("bgp_peeras") {
            Some(raw) => with(&raw, routed::parse_as)?,
            None => routed::DEFAULT_PEER_AS,
        };
        let password = match inputs.get("bgp_peerpass") {
            Some(raw) => {
                with(&raw, routed::check_password)?;
                Some(raw.value)
            }
            None => None,
        };
        peers.push(routed::Peer {
            address,
            asn: Some(asn),
            password,
            multihop: inputs.bool_or("bgp_multihop", false)?,
            port: routed::BGP_PORT,
            mpbgp: routed::Mpbgp::default(),
            bfd: routed::DEFAULT_BFD,
        });
    }
    if peers.is_empty() {
        return Err(Raw::default_of("bgp_peers", "").invalid(
            "no BGP peer: set bgp_peers (--bgppeers) or bgp_peeraddress (--peerAddress)",
        ));
    }
    let source_ip = match inputs.get("bgp_sourceip") {
        Some(raw) => Some(with(&raw, routed::parse_peer_address)?),
        None => None,
    };
    let source_if = inputs
        .get("bgp_sourceif")
        .map(parse_interface)
        .transpose()?
        .flatten();
    let hold_raw = inputs.text_or("bgp_hold_time", &routed::DEFAULT_HOLD_TIME.to_string());
    let hold_time = with(&hold_raw, |v| routed::parse_timer(v, 3))?;
    let keepalive = match inputs.get("bgp_keepalive_interval") {
        Some(raw) => {
            let k = with(&raw, |v| routed::parse_timer(v, 1))?;
            if k >= hold_time {
                return Err(raw.invalid(format!(
                    "the keepalive interval must be shorter than the hold time ({hold_time} s, bgp_hold_time)"
                )));
            }
            k
        }
        // kube-vip's 10 s, or a third of a shorter hold time (RFC 4271 §10's ratio).
        None => routed::DEFAULT_KEEPALIVE.min((hold_time / 3).max(1)),
    };
    let mpbgp = routed::Mpbgp {
        nexthop: match inputs.get("mpbgp_nexthop") {
            Some(raw) => Some(with(&raw, routed::MpbgpNexthop::parse)?),
            None => None,
        },
        ipv4: match inputs.get("mpbgp_ipv4") {
            Some(raw) => Some(with(&raw, |v| {
                v.parse()
                    .map_err(|_| format!("{v:?} is not an IPv4 address"))
            })?),
            None => None,
        },
        ipv6: match inputs.get("mpbgp_ipv6") {
            Some(raw) => Some(with(&raw, |v| {
                v.parse()
                    .map_err(|_| format!("{v:?} is not an IPv6 address"))
            })?),
            None => None,
        },
    };
    let table = match inputs.get("vip_routingtableid") {
        Some(raw) => with(&raw, routed::parse_table)?,
        None => routed::DEFAULT_TABLE,
    };
    let protocol = match inputs.get("vip_routingprotocol") {
        Some(raw) => with(&raw, routed::parse_protocol)?,
        None => routed::DEFAULT_PROTOCOL,
    };
    Ok(routed::Settings {
        router_id,
        router_interface,
        local_as,
        peers,
        source_ip,
        source_if,
        hold_time,
        keepalive,
        mpbgp,
        table,
        protocol,
    })
}

/// [`routed_settings`] from the real process: `std::env`, and the config file named by
/// the `config_file` environment variable or `--config-file` (environment wins).
///
/// # Errors
/// Everything [`routed_settings`] returns, plus [`ConfigError::FileRead`].
pub fn routed_settings_from_process(args: &RoutedArgs) -> Result<routed::Settings, ConfigError> {
    let env = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
    let path = env(K_CONFIG_FILE).filter(|p| !p.is_empty()).or_else(|| {
        args.config_file()
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| !p.is_empty())
    });
    let text = match path {
        Some(p) => Some(
            std::fs::read_to_string(&p).map_err(|source| ConfigError::FileRead {
                path: PathBuf::from(&p),
                source,
            })?,
        ),
        None => None,
    };
    routed_settings(args, &env, text.as_deref())
}

/// Routing-table mode for `vipd manager` (`vip_routingtable`; kube-vip
/// `pkg/kubevip/config_environment.go`, `pkg/manager/manager_table.go`): the table, type
/// and protocol of the VIP routes with the routed wing's parsers ([`routed::parse_table`],
/// [`routed::parse_protocol`]), and `vip_cleanroutingtable`. `None` when off; the table and
/// protocol are then read by `vipd manifest bird|frr` only.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the option and value: a bad table, type or protocol;
/// `lb_enable` with `cp_enable` (no control-plane load balancer in this mode;
/// `enable_node_labeling` only warns). The control-plane VIP is routed by every node whose
/// own API server is healthy, without election (kube-vip's table mode). Who routes a Service (kube-vip's `StartServices` in `pkg/manager/worker/table.go`):
/// with `svc_election` each Service's lease holder; else with `vip_leaderelection` (the
/// default) the holder of the one Services lease (`svc_leasename`); else every node that
/// may serve the Service (`crate::config::Config::services_unelected`).
pub(super) fn routing_table(
    inputs: &Inputs<'_>,
    modes: &super::Modes,
    warnings: &mut Vec<String>,
) -> Result<Option<crate::net::route_kernel::RouteMode>, ConfigError> {
    use crate::net::route::RouteKind;
    let on = inputs.bool_or(K_ROUTING_TABLE, false)?;
    if !on {
        for key in [K_ROUTING_TABLE_TYPE, K_CLEAN_ROUTING_TABLE] {
            if let Some(raw) = inputs.get(key) {
                warnings.push(format!(
                    "{} has no effect without vip_routingtable=true",
                    raw.setting()
                ));
            }
        }
        return Ok(None);
    }
    if modes.control_plane
        && let Some(lb) = inputs.get(K_LB_ENABLE)
        && parse_bool(&lb)?
    {
        return Err(lb.invalid(
            "the control-plane load balancer is not built for routing-table mode (vip_routingtable=true): every healthy control-plane node takes the VIP's traffic itself (ECMP); remove lb_enable",
        ));
    }
    if modes.control_plane
        && let Some(label) = inputs.get(K_NODE_LABELING)
        && parse_bool(&label)?
    {
        warnings.push(format!(
            "{} has no effect in routing-table mode: every healthy control-plane node routes the VIP, there is no one holder to label",
            label.setting()
        ));
    }
    let table = match inputs.get(K_ROUTING_TABLE_ID) {
        Some(raw) => with(&raw, routed::parse_table)?,
        None => routed::DEFAULT_TABLE,
    };
    let protocol = match inputs.get(K_ROUTING_PROTOCOL) {
        Some(raw) => with(&raw, routed::parse_protocol)?,
        None => routed::DEFAULT_PROTOCOL,
    };
    let kind = match inputs.get(K_ROUTING_TABLE_TYPE) {
        Some(raw) => with(&raw, |v| match v.trim() {
            "0" | "1" => Ok(RouteKind::Unicast),
            "2" => Ok(RouteKind::Local),
            _ => Err(format!(
                "{v:?} is not a route type vipd knows: 1 (or 0) unicast, 2 local"
            )),
        })?,
        None => RouteKind::Unicast,
    };
    if kind == RouteKind::Local
        && let Some(raw) = inputs.get(K_ROUTING_TABLE_TYPE)
    {
        warnings.push(format!(
            "{}: local routes are not exported by BIRD: the VIP routes will reach no router; kube-vip's default is 1 (unicast)",
            raw.setting()
        ));
    }
    Ok(Some(crate::net::route_kernel::RouteMode {
        table,
        protocol,
        kind,
        clean: inputs.bool_or(K_CLEAN_ROUTING_TABLE, false)?,
    }))
}

/// Routing-table mode fences each VIP route with a lifetime of whole seconds (the holder's
/// kernel fence, [`crate::lease::fence_lifetime`]; docs/design.md, "The route fence"): the
/// lease timings of each routed VIP (the control plane's, the Services') must leave room for
/// one, whatever `vip_nftfence` says (the millisecond fence of sub-second timings fences
/// addresses, not routes).
///
/// With `elected` (one holder routes the VIP at a time) the route must also leave the
/// router before another node may take the lease
/// ([`crate::holder::route_gone_before_takeover`]): at 3/2/1 the lab's router had
/// two paths at once for up to 0.8 s.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the first of `keys` given (the lease duration option,
/// then the one it defaults to), else the first key with the value in use.
pub(super) fn route_fence_fits(
    inputs: &Inputs<'_>,
    timing: &crate::lease::Timing,
    keys: &[&'static str],
    elected: bool,
) -> Result<(), ConfigError> {
    use crate::holder::route_gone_before_takeover;
    use crate::net::route_kernel::ROUTE_WITHDRAW_SLACK;
    let raw = || {
        keys.iter().find_map(|k| inputs.get(k)).unwrap_or_else(|| {
            Raw::default_of(keys[0], &timing.lease_duration.as_secs_f64().to_string())
        })
    };
    let Ok(fence) = crate::lease::fence_lifetime(timing) else {
        return Err(raw().invalid(format!(
            "routing-table mode fences each VIP route with a lifetime of whole seconds, longer than the retry period ({} s) and shorter than the lease duration ({} s): these timings leave none (sub-second timings cannot fence a route); use e.g. 5/3/1",
            timing.retry_period.as_secs_f64(),
            timing.lease_duration.as_secs_f64()
        )));
    };
    if elected && !route_gone_before_takeover(timing) {
        return Err(raw().invalid(format!(
            "with election a routed VIP must leave the router before another node may take its lease: the route's lifetime ({fence} s) + the kernel's and BIRD's slack ({} s) is not shorter than the lease duration ({} s), so the router could have two paths at once; use e.g. 5/3/1",
            ROUTE_WITHDRAW_SLACK.as_secs(),
            timing.lease_duration.as_secs_f64()
        )));
    }
    Ok(())
}

/// The Service lease timings in routing-table mode: [`ROUTED_SERVICE_TIMING`] (5/3/1) when
/// `elected` and no lease timing is given at all (neither the `svc_*` nor the `vip_*` they
/// default to), else `timing`; checked by [`route_fence_fits`].
///
/// # Errors
/// [`route_fence_fits`]'s, naming the Service lease duration option given.
///
/// [`ROUTED_SERVICE_TIMING`]: crate::holder::ROUTED_SERVICE_TIMING
pub(super) fn services_route_timing(
    inputs: &Inputs<'_>,
    timing: crate::lease::Timing,
    elected: bool,
) -> Result<crate::lease::Timing, ConfigError> {
    use super::super::options::{
        K_LEASE_DURATION, K_RENEW_DEADLINE, K_RETRY_PERIOD, K_SVC_LEASE_DURATION,
        K_SVC_RENEW_DEADLINE, K_SVC_RETRY_PERIOD,
    };
    let given = [
        K_SVC_LEASE_DURATION,
        K_SVC_RENEW_DEADLINE,
        K_SVC_RETRY_PERIOD,
        K_LEASE_DURATION,
        K_RENEW_DEADLINE,
        K_RETRY_PERIOD,
    ]
    .iter()
    .any(|k| inputs.get(k).is_some());
    let timing = match elected && !given {
        true => crate::holder::ROUTED_SERVICE_TIMING,
        false => timing,
    };
    route_fence_fits(
        inputs,
        &timing,
        &[K_SVC_LEASE_DURATION, K_LEASE_DURATION],
        elected,
    )?;
    Ok(timing)
}
