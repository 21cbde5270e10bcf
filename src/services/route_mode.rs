//! The Services wing in routing-table mode (`vip_routingtable`, issue 29): the holders'
//! settings (docs/design.md, "The route fence"). The start-up steps are the manager's
//! ([`crate::net::route_kernel::RouteKernel::prepare`], once for both wings).

use crate::holder::HolderConfig;
use crate::lease::TimingError;

use super::settings::Settings;

/// The holders' settings in routing-table mode: [`HolderConfig::routed`] with the Service
/// lease timings.
///
/// # Errors
/// [`TimingError`] when the Service lease timings have no whole-second fence.
pub(super) fn route_holder_cfg(cfg: &Settings) -> Result<HolderConfig, TimingError> {
    HolderConfig::routed(&cfg.services_timing, cfg.arp_rate)
}
