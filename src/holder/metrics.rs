//! The holder's metrics: announcements, conflicts and the VIPs this node carries.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `vipd_garp_sent_total` | counter | `vip` | gratuitous ARPs / unsolicited NAs sent |
//! | `vipd_vips_held` | gauge | | VIPs this node carries right now |
//! | `vipd_vip_conflicts_total` | counter | `vip` | times another host was found answering for a VIP this node leads (RFC 5227 conflict): the VIP was not bound, or was removed |

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::obs::metrics::{Families, Registry, VipLabels, gauge_value};

/// The holder's families (see the module docs).
pub struct VipMetrics {
    garp: Family<VipLabels, Counter>,
    conflicts: Family<VipLabels, Counter>,
    vips_held: Gauge,
}

impl Families for VipMetrics {
    fn register(registry: &mut Registry, _node: &str) -> Self {
        let m = VipMetrics {
            garp: Family::default(),
            conflicts: Family::default(),
            vips_held: Gauge::default(),
        };
        registry.register(
            "vipd_garp_sent",
            "Gratuitous ARPs / unsolicited neighbour advertisements sent",
            m.garp.clone(),
        );
        registry.register(
            "vipd_vip_conflicts",
            "Times another host was found answering for a VIP this node leads; the VIP was not bound or was removed",
            m.conflicts.clone(),
        );
        registry.register(
            "vipd_vips_held",
            "VIPs this node carries right now",
            m.vips_held.clone(),
        );
        m
    }
}

impl VipMetrics {
    /// Counts one gratuitous ARP / unsolicited NA for `vip` (an address, e.g. `192.0.2.10`).
    pub fn garp_sent(&self, vip: impl std::fmt::Display) {
        self.garp.get_or_create(&VipLabels::of(vip)).inc();
    }

    /// Counts one address conflict for `vip` (another host answers for it).
    pub fn vip_conflict(&self, vip: impl std::fmt::Display) {
        self.conflicts.get_or_create(&VipLabels::of(vip)).inc();
    }

    /// Sets `vipd_vips_held` to `n`.
    pub fn vips_held(&self, n: usize) {
        self.vips_held.set(gauge_value(n));
    }

    /// Removes the `vipd_garp_sent_total` and `vipd_vip_conflicts_total` series of `vip` (a
    /// VIP this node no longer has any use for).
    pub fn forget_vip(&self, vip: impl std::fmt::Display) {
        let labels = VipLabels::of(vip);
        self.garp.remove(&labels);
        self.conflicts.remove(&labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::metrics::Metrics;

    #[test]
    fn announcements_conflicts_and_forgotten_vips() {
        let metrics = Metrics::new("n");
        let m = metrics.families::<VipMetrics>();
        m.garp_sent("192.0.2.10");
        m.garp_sent(std::net::IpAddr::from([192, 0, 2, 10]));
        m.garp_sent("192.0.2.11");
        m.vip_conflict("192.0.2.10");
        m.vips_held(2);
        let t = metrics.encode();
        for want in [
            r#"vipd_garp_sent_total{vip="192.0.2.10"} 2"#,
            r#"vipd_vip_conflicts_total{vip="192.0.2.10"} 1"#,
            "vipd_vips_held 2",
        ] {
            assert!(t.lines().any(|l| l == want), "missing {want}: {t}");
        }
        m.forget_vip("192.0.2.10");
        let t = metrics.encode();
        assert!(!t.contains("192.0.2.10"), "{t}");
        assert!(
            t.lines()
                .any(|l| l == r#"vipd_garp_sent_total{vip="192.0.2.11"} 1"#),
            "{t}"
        );
    }
}
