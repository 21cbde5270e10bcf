//! The Services wing's metrics: announced Services, data-path health checks and deliberate
//! hand-overs. DHCP mode's are in [`dhcp`].
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `kube_vip_active_services` | gauge | `namespace` | LoadBalancer Services this node announces (kube-vip's name) |
//! | `vipd_health_check_failures_total` | counter | `lease_name` | failed data-path health checks of this Service lease's group (run while leading, and while handed over for health) |
//! | `vipd_health_handovers_total` | counter | `lease_name` | times this node handed the lease over because its data-path health check failed |
//! | `vipd_services_pass_duration_seconds` | histogram | | time one pass over the Services cache took (plan, notes, status checks, group updates), seconds; passes are paced by it ([`super::runtime`]) |
//! | `vipd_vip_handovers_total` | counter | `vip`, `reason` | times this node handed a Service VIP it held over on purpose, by reason: the node became ineligible (`drained`, `drain-annotation`, `cordon-drain`, `excluded`, `not-ready`, `network-unavailable`, `cordoned`), `health` (data-path check), `node-selector` (its labels stopped matching the Service's `vipd.io/node-selector`), `subnet` (no connected subnet holds the VIP any more), `failback` (handed back to a returning preferred node, `svc_failback`); kept until the Service goes |

pub mod dhcp;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::nodes::eligibility::Ineligible;
use crate::obs::metrics::{Families, LeaseLabels, Registry, gauge_value};

/// The per-Service `reason` values of `vipd_vip_handovers_total`, besides the node-wide
/// ineligibility reasons ([`Ineligible::label`]).
pub(crate) const SERVICE_HANDOVER_REASONS: [&str; 3] = ["health", "node-selector", "subnet"];

/// Upper bounds (seconds) of the pass duration histogram buckets: 1 ms to 5 s.
pub(crate) const PASS_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandoverLabels {
    vip: String,
    reason: String,
}

/// The Services wing's families (see the module docs).
pub struct ServiceMetrics {
    active: Family<NamespaceLabels, Gauge>,
    health_failures: Family<LeaseLabels, Counter>,
    health_handovers: Family<LeaseLabels, Counter>,
    vip_handovers: Family<HandoverLabels, Counter>,
    pass: Histogram,
}

impl Families for ServiceMetrics {
    fn register(registry: &mut Registry, _node: &str) -> Self {
        let m = ServiceMetrics {
            active: Family::default(),
            health_failures: Family::default(),
            health_handovers: Family::default(),
            vip_handovers: Family::default(),
            pass: Histogram::new(PASS_BUCKETS),
        };
        registry.register(
            "kube_vip_active_services",
            "LoadBalancer Services this node announces",
            m.active.clone(),
        );
        registry.register(
            "vipd_health_check_failures",
            "Failed data-path health checks of this Service lease's group",
            m.health_failures.clone(),
        );
        registry.register(
            "vipd_health_handovers",
            "Times this node handed the lease over because its data-path health check failed",
            m.health_handovers.clone(),
        );
        registry.register(
            "vipd_vip_handovers",
            "Times this node handed a Service VIP over on purpose, by reason",
            m.vip_handovers.clone(),
        );
        registry.register(
            "vipd_services_pass_duration_seconds",
            "Time one pass over the Services cache took, seconds",
            m.pass.clone(),
        );
        m
    }
}

impl ServiceMetrics {
    fn namespace(namespace: &str) -> NamespaceLabels {
        NamespaceLabels {
            namespace: namespace.to_string(),
        }
    }

    /// Sets `kube_vip_active_services{namespace}` to `n`.
    pub fn active_services(&self, namespace: &str, n: usize) {
        self.active
            .get_or_create(&Self::namespace(namespace))
            .set(gauge_value(n));
    }

    /// Removes `kube_vip_active_services{namespace}` (a namespace without announced
    /// Services any more).
    pub fn forget_namespace(&self, namespace: &str) {
        self.active.remove(&Self::namespace(namespace));
    }

    /// Counts one failed data-path health check of `lease`'s group.
    pub fn health_check_failed(&self, lease: &str) {
        self.health_failures
            .get_or_create(&LeaseLabels::of(lease))
            .inc();
    }

    /// Counts one hand-over of `lease` for a failed health check.
    pub fn health_handover(&self, lease: &str) {
        self.health_handovers
            .get_or_create(&LeaseLabels::of(lease))
            .inc();
    }

    /// Removes the health check series of `lease` (its group is gone).
    pub fn forget_lease(&self, lease: &str) {
        let l = LeaseLabels::of(lease);
        self.health_failures.remove(&l);
        self.health_handovers.remove(&l);
    }

    /// Counts one deliberate hand-over of Service VIP `vip` for `reason` (the `reason`
    /// label, see the module docs).
    pub fn vip_handover(&self, vip: impl std::fmt::Display, reason: &str) {
        self.vip_handovers
            .get_or_create(&HandoverLabels {
                vip: vip.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Records one pass over the Services cache that took `took`.
    pub fn pass(&self, took: std::time::Duration) {
        self.pass.observe(took.as_secs_f64());
    }

    /// Removes every `vipd_vip_handovers_total` series of `vip` (its Service is gone).
    pub fn forget_vip_handovers(&self, vip: impl std::fmt::Display) {
        let vip = vip.to_string();
        let reasons = Ineligible::ALL
            .map(Ineligible::label)
            .into_iter()
            .chain(SERVICE_HANDOVER_REASONS);
        for reason in reasons {
            self.vip_handovers.remove(&HandoverLabels {
                vip: vip.clone(),
                reason: reason.to_string(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::metrics::Metrics;

    #[test]
    fn vip_handovers_count_per_vip_and_reason_until_the_service_goes() {
        let metrics = Metrics::new("node-a");
        let m = metrics.families::<ServiceMetrics>();
        m.vip_handover("192.0.2.20", "health");
        m.vip_handover("192.0.2.20", "health");
        m.vip_handover("192.0.2.20", "not-ready");
        m.vip_handover("192.0.2.20", "subnet");
        m.vip_handover("192.0.2.21", "node-selector");
        let t = metrics.encode();
        for want in [
            r#"vipd_vip_handovers_total{vip="192.0.2.20",reason="health"} 2"#,
            r#"vipd_vip_handovers_total{vip="192.0.2.20",reason="not-ready"} 1"#,
            r#"vipd_vip_handovers_total{vip="192.0.2.21",reason="node-selector"} 1"#,
        ] {
            assert!(t.lines().any(|l| l == want), "missing {want}: {t}");
        }
        m.forget_vip_handovers("192.0.2.20");
        let t = metrics.encode();
        assert!(!t.contains("192.0.2.20"), "{t}");
        assert!(t.contains(r#"vip="192.0.2.21""#), "{t}");
    }

    #[test]
    fn forgotten_namespaces_and_leases_leave_no_series() {
        let metrics = Metrics::new("node-a");
        let m = metrics.families::<ServiceMetrics>();
        m.active_services("default", 2);
        m.active_services("shop", 1);
        for lease in ["default/kubevip-a", "default/kubevip-b"] {
            m.health_check_failed(lease);
            m.health_handover(lease);
        }
        m.forget_namespace("shop");
        m.forget_lease("default/kubevip-a");
        let t = metrics.encode();
        assert!(!t.contains("namespace=\"shop\""), "{t}");
        assert!(!t.contains("kubevip-a"), "{t}");
        for kept in [
            r#"kube_vip_active_services{namespace="default"} 2"#,
            r#"vipd_health_handovers_total{lease_name="default/kubevip-b"} 1"#,
        ] {
            assert!(t.lines().any(|l| l == kept), "missing {kept}: {t}");
        }
    }
}
