//! The Services wing in routing-table mode (`vip_routingtable`, issue 29): the holders'
//! settings and the start-up steps (docs/design.md, "The route fence").

use std::time::Duration;

use tracing::{info, warn};

use crate::holder::HolderConfig;
use crate::lease::TimingError;
use crate::net::route_kernel::{RouteKernel, WANTED_IPV6_GC_INTERVAL, shorten_ipv6_route_gc};

use super::settings::Settings;

/// The holders' settings in routing-table mode: the whole-second fence of the Service
/// lease timings is the route's lifetime; no conflict probe (RFC 5227 has nothing to say
/// about a route), no ARP flux pins and no nftables fence (the route's lifetime fences).
///
/// # Errors
/// [`TimingError`] when the Service lease timings have no whole-second fence (sub-second
/// timings: a route's lifetime is counted in seconds).
pub(super) fn route_holder_cfg(cfg: &Settings) -> Result<HolderConfig, TimingError> {
    let base = HolderConfig::from_timing(&cfg.services_timing, cfg.arp_rate, false)?;
    Ok(HolderConfig {
        probe_window: Duration::ZERO,
        conflict_monitor: None,
        ..base
    })
}

/// Start-up of routing-table mode, before any election: `vip_cleanroutingtable` removes
/// the routes of the protocol left in the table, and the IPv6 route collector is made to
/// run every [`WANTED_IPV6_GC_INTERVAL`] s in this network namespace (an expired IPv6
/// route otherwise stays up to 30 s past its lifetime). Failures are logged.
pub(super) async fn prepare_route_mode(routes: &RouteKernel) {
    let mode = routes.mode();
    info!(
        table = mode.table,
        protocol = mode.protocol,
        kind = ?mode.kind,
        "Services: routing-table mode: the lease holder routes each VIP (fenced host route) instead of binding it; no ARP/NDP"
    );
    if mode.clean {
        match routes.clean().await {
            Ok(r) => info!(
                removed = r.len(),
                "vip_cleanroutingtable: table {} cleaned of protocol {} routes",
                mode.table,
                mode.protocol
            ),
            Err(e) => warn!(error = %e, "vip_cleanroutingtable: cannot read the table"),
        }
    }
    match shorten_ipv6_route_gc() {
        Ok(Some((old, new))) if old != new => info!(
            old_secs = old,
            new_secs = new,
            "routing-table mode: set net.ipv6.route.gc_interval of this network namespace so that an expired IPv6 VIP route goes within its lifetime + {WANTED_IPV6_GC_INTERVAL} s"
        ),
        Ok(Some(_)) => {}
        Ok(None) => info!("routing-table mode: no IPv6 in this network namespace"),
        Err(e) => warn!(
            error = %e,
            "routing-table mode: cannot set net.ipv6.route.gc_interval to {WANTED_IPV6_GC_INTERVAL}: an expired IPv6 VIP route goes up to the current interval (kernel default 30 s) after its lifetime"
        ),
    }
}
