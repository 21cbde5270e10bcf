//! Every module's metric families, registered at start so that `/metrics` lists all of them
//! from the first scrape, and an example with one series in each.
//!
//! The tables that say what each metric means are in the owners' module docs:
//! `obs::metrics` (build info), `election::metrics`, `holder::metrics`, `nodes::eligibility::metrics`,
//! `peer::metrics`, `services::metrics`, `services::metrics::dhcp`,
//! `controlplane::lb::metrics`, `ipam::metrics`, `egress::metrics`.

use std::time::Duration;

use crate::controlplane::lb::metrics::LbMetrics;
use crate::egress::metrics::EgressMetrics;
use crate::election::metrics::LeaseMetrics;
use crate::holder::metrics::VipMetrics;
use crate::ipam::metrics::PoolMetrics;
use crate::nodes::eligibility::metrics::EligibilityMetrics;
use crate::nodes::eligibility::{Ineligible, Wing};
use crate::obs::metrics::Metrics;
use crate::peer::metrics::PeerMetrics;
use crate::services::metrics::ServiceMetrics;
use crate::services::metrics::dhcp::DhcpMetrics;

/// A registry for node `node` with every module's families registered, in a fixed order
/// (kube-vip's names first).
pub fn every_family(node: &str) -> Metrics {
    let m = Metrics::new(node);
    m.families::<LeaseMetrics>();
    m.families::<ServiceMetrics>();
    m.families::<VipMetrics>();
    m.families::<EligibilityMetrics>();
    m.families::<PeerMetrics>();
    m.families::<LbMetrics>();
    m.families::<DhcpMetrics>();
    m.families::<PoolMetrics>();
    m.families::<EgressMetrics>();
    m
}

/// A registry with one series in every family (lease `example`, VIP `192.0.2.10`,
/// namespace `default`): what `/metrics` can show, for checking dashboards and alert rules
/// against the names vipd exports (an empty family prints no sample).
pub fn example(node: &str) -> Metrics {
    let m = every_family(node);
    let lease = "example";
    let election = m.families::<LeaseMetrics>();
    election.set_leading(lease, true);
    election.transition(lease);
    election.renew_latency(lease, Duration::from_millis(5));
    election.renew_failure(lease);
    election.failover(lease);
    election.duplicate_identity(lease);
    let vips = m.families::<VipMetrics>();
    vips.garp_sent("192.0.2.10");
    vips.vip_conflict("192.0.2.10");
    vips.vips_held(1);
    let services = m.families::<ServiceMetrics>();
    services.active_services("default", 1);
    services.health_check_failed(lease);
    services.health_handover(lease);
    services.vip_handover("192.0.2.10", "health");
    services.pass(std::time::Duration::from_millis(3));
    m.families::<EligibilityMetrics>()
        .set(Wing::Services, Some(Ineligible::DrainedLocally));
    let peer = m.families::<PeerMetrics>();
    peer.set_riding(lease, true);
    peer.set_api_reachable(true);
    peer.frame("accepted");
    m.families::<LbMetrics>()
        .backends([(node, "192.0.2.11".to_string(), true)]);
    let dhcp = m.families::<DhcpMetrics>();
    dhcp.state("default/example", "v4", "bound", Some(1_800_000_000));
    dhcp.event("default/example", "v4", "renewed");
    m.families::<PoolMetrics>()
        .set(&[("cidr-global".to_string(), 14, 1)]);
    let egress = m.families::<EgressMetrics>();
    egress.set_endpoints(&[("default/example".to_string(), 2)]);
    egress.translated("default/example", 1);
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::metrics::{documented_names, exported_names};

    /// The owners' module docs, whose tables list their metrics.
    const TABLES: [&str; 10] = [
        include_str!("../../obs/metrics.rs"),
        include_str!("../../election/metrics.rs"),
        include_str!("../../holder/metrics.rs"),
        include_str!("../../nodes/eligibility/metrics.rs"),
        include_str!("../../peer/metrics.rs"),
        include_str!("../../services/metrics.rs"),
        include_str!("../../services/metrics/dhcp.rs"),
        include_str!("../../controlplane/lb/metrics.rs"),
        include_str!("../../ipam/metrics.rs"),
        include_str!("../../egress/metrics.rs"),
    ];

    /// [`example`] shows every metric, and the owners' tables list exactly what it shows.
    #[test]
    fn example_shows_every_metric_and_the_owners_list_them() {
        let text = example("node-a").encode();
        let mut exported = exported_names(&text);
        exported.sort();
        let mut documented: Vec<String> = TABLES.iter().flat_map(|t| documented_names(t)).collect();
        documented.sort();
        assert_eq!(exported.len(), 26, "{text}");
        assert_eq!(exported, documented);
    }

    /// The families are registered at start, so the exposition lists them in one order
    /// whichever module records a series first (an empty family prints nothing).
    #[test]
    fn the_order_is_fixed_at_start() {
        let m = every_family("a");
        m.families::<DhcpMetrics>()
            .event("default/web", "v4", "renewed");
        m.families::<LeaseMetrics>().failover("l");
        m.families::<VipMetrics>().vips_held(1);
        let order = exported_names(&m.encode());
        let reference: Vec<String> = exported_names(&example("a").encode())
            .into_iter()
            .filter(|n| order.contains(n))
            .collect();
        for name in [
            "vipd_dhcp_events_total",
            "vipd_failovers_total",
            "vipd_vips_held",
        ] {
            assert!(order.iter().any(|n| n == name), "{name}: {order:?}");
        }
        assert_eq!(order, reference);
    }
}
