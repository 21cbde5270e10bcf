//! Resolving the Services options: `svc_*` timings, health checks, fail-back, election and
//! class settings, and IPAM (`svc_ipam`, `KUBEVIP_CONFIG_MAP`, `KUBEVIP_NAMESPACE`).

use super::super::options::*;
use super::super::parse::*;
use super::super::*;
use super::{DEFAULT_FAILBACK_HOLDDOWN, Inputs, lease_timings};
use crate::lease::LeaseConfig;
use crate::services::health::ServicesHealth;

/// The Services' lease timings; each defaults to the control plane's (`lease`).
pub(super) fn services_timing(
    inputs: &Inputs<'_>,
    lease: &LeaseConfig,
    nft_fence: bool,
) -> Result<Timing, ConfigError> {
    lease_timings(
        inputs,
        [
            K_SVC_LEASE_DURATION,
            K_SVC_RENEW_DEADLINE,
            K_SVC_RETRY_PERIOD,
        ],
        [
            lease.timing.lease_duration,
            lease.timing.renew_deadline,
            lease.timing.retry_period,
        ],
        nft_fence,
    )
}

/// `svc_healthcheck` and `svc_healthcheck_hold`.
pub(super) fn services_health(inputs: &Inputs<'_>) -> Result<ServicesHealth, ConfigError> {
    let check = match inputs.get(K_SVC_HEALTHCHECK) {
        Some(raw) => {
            crate::services::health::parse_check(&raw.value).map_err(|e| raw.invalid(e))?
        }
        None => None,
    };
    let hold = match inputs.get(K_SVC_HEALTHCHECK_HOLD) {
        Some(raw) => parse_seconds(&raw)?,
        None => crate::services::health::DEFAULT_HOLD,
    };
    Ok(ServicesHealth { check, hold })
}

/// `svc_failback` and `svc_failback_holddown` (default 30 s): the hold-down when on.
pub(super) fn services_failback(inputs: &Inputs<'_>) -> Result<Option<Duration>, ConfigError> {
    let holddown = match inputs.get(K_SVC_FAILBACK_HOLDDOWN) {
        Some(raw) => parse_seconds(&raw)?,
        None => DEFAULT_FAILBACK_HOLDDOWN,
    };
    Ok(inputs.bool_or(K_SVC_FAILBACK, false)?.then_some(holddown))
}

/// The Services settings other than timings and interface.
pub(super) struct ServicesSettings {
    pub(super) election: bool,
    pub(super) lease_name: String,
    pub(super) lease_shards: u16,
    pub(super) ipv6_loopback: bool,
    pub(super) namespace: Option<String>,
    pub(super) lb_class_only: bool,
    pub(super) lb_class_name: String,
}

/// `svc_election`, `svc_leasename`, `svc_namespace`, `lb_class_only`, `lb_class_name`;
/// warns about those set without `svc_enable`.
pub(super) fn services(
    inputs: &Inputs<'_>,
    enabled: bool,
    warnings: &mut Vec<String>,
) -> Result<ServicesSettings, ConfigError> {
    let election = inputs.bool_or(K_SVC_ELECTION, false)?;
    let lease_name = inputs.text_or(K_SVC_LEASE_NAME, DEFAULT_SERVICES_LEASE_NAME);
    check_dns1123_subdomain(&lease_name)?;
    let lease_shards = lease_shards(inputs, enabled && election, warnings)?;
    let ipv6_loopback = inputs.bool_or(K_SVC_IPV6_LOOPBACK, false)?;
    let namespace = match inputs.get(K_SVC_NAMESPACE) {
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
    if !enabled {
        for key in [
            K_SVC_ELECTION,
            K_SVC_LEASE_NAME,
            K_SVC_LEASE_SHARDS,
            K_SVC_IPV6_LOOPBACK,
            K_SVC_NAMESPACE,
            K_LB_CLASS_ONLY,
            K_SVC_INTERFACE,
            K_SVC_RIDETHROUGH,
            K_SERVICE_SECURITY,
            K_SVC_FAILBACK,
        ] {
            if let Some(raw) = inputs.get(key) {
                warnings.push(format!(
                    "{} has no effect without svc_enable",
                    raw.setting()
                ));
            }
        }
    }
    Ok(ServicesSettings {
        election,
        lease_name: lease_name.value,
        lease_shards,
        ipv6_loopback,
        namespace,
        lb_class_only,
        lb_class_name: lb_class_name.value,
    })
}

/// The most shard leases `svc_leaseshards` may ask for.
pub(crate) const MAX_LEASE_SHARDS: u16 = 1024;

/// `svc_leaseshards` (default 0: one lease per Service): at most [`MAX_LEASE_SHARDS`];
/// ignored with a warning where it cannot apply (Services on with `svc_election` false:
/// one lease already serves all; without `svc_enable` the caller warns).
fn lease_shards(
    inputs: &Inputs<'_>,
    per_service: bool,
    warnings: &mut Vec<String>,
) -> Result<u16, ConfigError> {
    let Some(raw) = inputs.get(K_SVC_LEASE_SHARDS) else {
        return Ok(0);
    };
    let n = parse_count(&raw)?;
    let n = u16::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_LEASE_SHARDS)
        .ok_or_else(|| raw.invalid(format!("must be at most {MAX_LEASE_SHARDS}")))?;
    if !per_service && n > 0 && inputs.bool_or(K_SVC_ENABLE, false)? {
        warnings.push(format!(
            "{} has no effect without svc_election (one Lease, svc_leasename, serves all Services)",
            raw.setting()
        ));
        return Ok(0);
    }
    Ok(n)
}

/// `svc_ipam`, `KUBEVIP_CONFIG_MAP`, `KUBEVIP_NAMESPACE`: `None` when allocation is off
/// (`svc_ipam` false, or Services off, with a warning if it was set).
pub(super) fn ipam(
    inputs: &Inputs<'_>,
    services: bool,
    warnings: &mut Vec<String>,
) -> Result<Option<crate::kube::ObjectKey>, ConfigError> {
    let on = inputs.bool_or(K_SVC_IPAM, true)?;
    let name = inputs.text_or(K_IPAM_CONFIG_MAP, crate::ipam::DEFAULT_CONFIG_MAP);
    check_dns1123_subdomain(&name)?;
    let namespace = inputs.text_or(K_IPAM_NAMESPACE, crate::ipam::DEFAULT_NAMESPACE);
    check_dns1123_label(&namespace)?;
    if !services {
        for key in [K_SVC_IPAM, K_IPAM_CONFIG_MAP, K_IPAM_NAMESPACE] {
            if let Some(raw) = inputs.get(key) {
                warnings.push(format!(
                    "{} has no effect without svc_enable",
                    raw.setting()
                ));
            }
        }
        return Ok(None);
    }
    Ok(on.then(|| crate::kube::ObjectKey::new(&namespace.value, &name.value)))
}
