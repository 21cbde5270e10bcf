//! Eligibility's metric.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `vipd_node_ineligible` | gauge | `vips`, `reason` | 1 while this node may not announce `vips` (`control-plane` or `services`) for `reason` (drained, drain-annotation, cordon-drain, excluded, not-ready, network-unavailable, cordoned, unknown); no series while eligible |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::{Ineligible, Wing};
use crate::obs::metrics::{Families, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IneligibleLabels {
    vips: String,
    reason: String,
}

/// Eligibility's family (see the module docs).
pub struct EligibilityMetrics {
    ineligible: Family<IneligibleLabels, Gauge>,
}

impl Families for EligibilityMetrics {
    fn register(registry: &mut Registry, _node: &str) -> Self {
        let ineligible = Family::default();
        registry.register(
            "vipd_node_ineligible",
            "1 while this node may not announce these VIPs (control-plane or services) for this reason",
            Family::clone(&ineligible),
        );
        EligibilityMetrics { ineligible }
    }
}

impl EligibilityMetrics {
    /// Sets `vipd_node_ineligible{vips, reason}`: 1 for `reason`, and no other series of
    /// `wing` (none at all when `reason` is `None`: eligible).
    pub fn set(&self, wing: Wing, reason: Option<Ineligible>) {
        for r in Ineligible::ALL {
            let labels = IneligibleLabels {
                vips: wing.label().to_string(),
                reason: r.label().to_string(),
            };
            if Some(r) == reason {
                self.ineligible.get_or_create(&labels).set(1);
            } else {
                self.ineligible.remove(&labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::metrics::Metrics;

    /// `vipd_node_ineligible{vips, reason}`: one series per kind of VIP, for the current
    /// reason only; none once eligible.
    #[test]
    fn ineligible_keeps_only_the_current_reason() {
        let metrics = Metrics::new("node-a");
        let m = metrics.families::<EligibilityMetrics>();
        m.set(Wing::Services, Some(Ineligible::NotReady));
        m.set(Wing::ControlPlane, Some(Ineligible::DrainedLocally));
        m.set(Wing::Services, Some(Ineligible::DrainedLocally));
        let text = metrics.encode();
        assert!(
            text.contains(r#"vipd_node_ineligible{vips="services",reason="drained"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"reason="not-ready""#), "{text}");
        m.set(Wing::Services, None);
        let text = metrics.encode();
        assert!(!text.contains(r#"vips="services""#), "{text}");
        assert!(
            text.contains(r#"vipd_node_ineligible{vips="control-plane",reason="drained"} 1"#),
            "{text}"
        );
    }
}
