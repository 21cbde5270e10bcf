//! The election's metrics: leadership, renewals, failovers and duplicate identities, one
//! series per lease.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `kube_vip_is_leader` | gauge | `node`, `lease_name` | 1 while this node holds the lease (kube-vip's name) |
//! | `kube_vip_leader_election_transitions_total` | counter | `lease_name` | leadership changes of this node (became or stopped being leader; kube-vip's name) |
//! | `vipd_lease_renew_duration_seconds` | histogram | `lease_name` | latency of successful renewals, seconds |
//! | `vipd_lease_renew_failures_total` | counter | `lease_name` | failed renew attempts |
//! | `vipd_failovers_total` | counter | `lease_name` | times this node took over a lease another node held |
//! | `vipd_duplicate_identity_total` | counter | `lease_name` | writes under this node's identity made by another process (duplicate node name) |

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::obs::metrics::{Families, LeaseLabels, Registry};

/// Upper bounds (seconds) of the renew latency histogram buckets.
pub(crate) const RENEW_BUCKETS: [f64; 11] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaderLabels {
    node: String,
    lease_name: String,
}

type HistogramFamily = Family<LeaseLabels, Histogram, fn() -> Histogram>;

fn renew_histogram() -> Histogram {
    Histogram::new(RENEW_BUCKETS)
}

/// The election's families (see the module docs).
pub struct LeaseMetrics {
    node: String,
    is_leader: Family<LeaderLabels, Gauge>,
    transitions: Family<LeaseLabels, Counter>,
    renew: HistogramFamily,
    renew_failures: Family<LeaseLabels, Counter>,
    failovers: Family<LeaseLabels, Counter>,
    duplicate_identity: Family<LeaseLabels, Counter>,
}

impl Families for LeaseMetrics {
    fn register(registry: &mut Registry, node: &str) -> Self {
        let m = LeaseMetrics {
            node: node.to_string(),
            is_leader: Family::default(),
            transitions: Family::default(),
            renew: Family::new_with_constructor(renew_histogram),
            renew_failures: Family::default(),
            failovers: Family::default(),
            duplicate_identity: Family::default(),
        };
        registry.register(
            "kube_vip_is_leader",
            "1 if this node currently holds the lease",
            m.is_leader.clone(),
        );
        registry.register(
            "kube_vip_leader_election_transitions",
            "Leadership changes of this node; frequent transitions mean instability",
            m.transitions.clone(),
        );
        registry.register(
            "vipd_lease_renew_duration_seconds",
            "Latency of successful lease renewals in seconds",
            m.renew.clone(),
        );
        registry.register(
            "vipd_lease_renew_failures",
            "Failed lease renew attempts",
            m.renew_failures.clone(),
        );
        registry.register(
            "vipd_failovers",
            "Times this node took over a lease that another node held",
            m.failovers.clone(),
        );
        registry.register(
            "vipd_duplicate_identity",
            "Writes to the lease under this node's identity made by another process \
             (two nodes with the same node name)",
            m.duplicate_identity.clone(),
        );
        m
    }
}

impl LeaseMetrics {
    fn leader(&self, lease: &str) -> LeaderLabels {
        LeaderLabels {
            node: self.node.clone(),
            lease_name: lease.to_string(),
        }
    }

    /// Sets `kube_vip_is_leader{node, lease_name}` to 1 or 0.
    pub fn set_leading(&self, lease: &str, leading: bool) {
        self.is_leader
            .get_or_create(&self.leader(lease))
            .set(i64::from(leading));
    }

    /// Counts one leadership change of this node for `lease`.
    pub fn transition(&self, lease: &str) {
        self.transitions
            .get_or_create(&LeaseLabels::of(lease))
            .inc();
    }

    /// Observes one successful renewal of `lease` that took `latency`.
    pub fn renew_latency(&self, lease: &str, latency: Duration) {
        self.renew
            .get_or_create(&LeaseLabels::of(lease))
            .observe(latency.as_secs_f64());
    }

    /// Counts one failed renew attempt of `lease`.
    pub fn renew_failure(&self, lease: &str) {
        self.renew_failures
            .get_or_create(&LeaseLabels::of(lease))
            .inc();
    }

    /// Counts one takeover of `lease` from another holder.
    pub fn failover(&self, lease: &str) {
        self.failovers.get_or_create(&LeaseLabels::of(lease)).inc();
    }

    /// Counts one write to `lease` under this node's identity by another process.
    pub fn duplicate_identity(&self, lease: &str) {
        self.duplicate_identity
            .get_or_create(&LeaseLabels::of(lease))
            .inc();
    }

    /// Removes every series of `lease` (a Service lease that is gone), so that Services
    /// deleted over time leave no series behind.
    pub fn forget(&self, lease: &str) {
        let l = LeaseLabels::of(lease);
        self.is_leader.remove(&self.leader(lease));
        self.transitions.remove(&l);
        self.renew.remove(&l);
        self.renew_failures.remove(&l);
        self.failovers.remove(&l);
        self.duplicate_identity.remove(&l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::metrics::Metrics;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn kube_vip_names_and_values() {
        let metrics = Metrics::new("node-a");
        let m = metrics.families::<LeaseMetrics>();
        m.set_leading("plndr-cp-lock", true);
        m.transition("plndr-cp-lock");
        m.transition("plndr-cp-lock");
        let t = metrics.encode();
        assert_eq!(
            line(&t, "kube_vip_is_leader{"),
            Some(r#"kube_vip_is_leader{node="node-a",lease_name="plndr-cp-lock"} 1"#),
            "{t}"
        );
        assert_eq!(
            line(&t, "kube_vip_leader_election_transitions_total{"),
            Some(r#"kube_vip_leader_election_transitions_total{lease_name="plndr-cp-lock"} 2"#),
            "{t}"
        );
        m.set_leading("plndr-cp-lock", false);
        assert_eq!(
            line(&metrics.encode(), "kube_vip_is_leader{"),
            Some(r#"kube_vip_is_leader{node="node-a",lease_name="plndr-cp-lock"} 0"#)
        );
    }

    #[test]
    fn renewals_failovers_and_duplicate_identities() {
        let metrics = Metrics::new("n");
        let m = metrics.families::<LeaseMetrics>();
        m.renew_latency("l", Duration::from_millis(30));
        m.renew_latency("l", Duration::from_millis(700));
        m.renew_failure("l");
        m.failover("l");
        m.duplicate_identity("l");
        let t = metrics.encode();
        assert_eq!(
            line(&t, "vipd_lease_renew_duration_seconds_count{"),
            Some(r#"vipd_lease_renew_duration_seconds_count{lease_name="l"} 2"#),
            "{t}"
        );
        assert_eq!(
            line(
                &t,
                r#"vipd_lease_renew_duration_seconds_bucket{le="0.05",lease_name="l"}"#
            )
            .or_else(|| line(
                &t,
                r#"vipd_lease_renew_duration_seconds_bucket{lease_name="l",le="0.05"}"#
            ))
            .map(|l| l.rsplit(' ').next().unwrap_or_default()),
            Some("1"),
            "{t}"
        );
        for want in [
            r#"vipd_lease_renew_failures_total{lease_name="l"} 1"#,
            r#"vipd_failovers_total{lease_name="l"} 1"#,
            r#"vipd_duplicate_identity_total{lease_name="l"} 1"#,
        ] {
            assert!(t.lines().any(|l| l == want), "missing {want}: {t}");
        }
    }

    #[test]
    fn a_forgotten_lease_leaves_no_series() {
        let metrics = Metrics::new("node-a");
        let m = metrics.families::<LeaseMetrics>();
        for lease in ["default/kubevip-a", "default/kubevip-b"] {
            m.set_leading(lease, true);
            m.transition(lease);
            m.renew_latency(lease, Duration::from_millis(20));
            m.renew_failure(lease);
            m.failover(lease);
            m.duplicate_identity(lease);
        }
        m.forget("default/kubevip-a");
        let t = metrics.encode();
        assert!(!t.contains("kubevip-a"), "{t}");
        for kept in [
            r#"kube_vip_is_leader{node="node-a",lease_name="default/kubevip-b"} 1"#,
            r#"vipd_lease_renew_failures_total{lease_name="default/kubevip-b"} 1"#,
            r#"vipd_failovers_total{lease_name="default/kubevip-b"} 1"#,
        ] {
            assert!(t.lines().any(|l| l == kept), "missing {kept}: {t}");
        }
    }
}
