//! The peer protocol's metrics: ride-through and received frames.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `vipd_ride_through` | gauge | `lease_name` | 1 while this node keeps the lease's Service VIPs through an API server outage (`svc_ridethrough`); no series otherwise |
//! | `vipd_peer_api_reachable` | gauge | | with `svc_ridethrough`: 1 while this node's API probe (`/readyz`) answers, as its heartbeats say |
//! | `vipd_peer_frames_total` | counter | `result` | peer protocol frames received: `accepted`, or why rejected (`bad_mac`, `bad_magic`, `bad_version`, `malformed`, `skew`, `replay`, `old_boot`) |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::obs::metrics::{Families, LeaseLabels, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// The peer protocol's families (see the module docs).
pub struct PeerMetrics {
    riding: Family<LeaseLabels, Gauge>,
    api: Gauge,
    frames: Family<ResultLabels, Counter>,
}

impl Families for PeerMetrics {
    fn register(registry: &mut Registry, _node: &str) -> Self {
        let m = PeerMetrics {
            riding: Family::default(),
            api: Gauge::default(),
            frames: Family::default(),
        };
        registry.register(
            "vipd_ride_through",
            "1 while this node keeps the lease's Service VIPs through an API server outage",
            m.riding.clone(),
        );
        registry.register(
            "vipd_peer_api_reachable",
            "1 while this node's API probe answers (peer protocol, svc_ridethrough)",
            m.api.clone(),
        );
        registry.register(
            "vipd_peer_frames",
            "Peer protocol frames received: accepted, or the reason they were rejected",
            m.frames.clone(),
        );
        m
    }
}

impl PeerMetrics {
    /// Sets `vipd_ride_through{lease_name}`: 1 while riding, no series otherwise.
    pub fn set_riding(&self, lease: &str, riding: bool) {
        if riding {
            self.riding.get_or_create(&LeaseLabels::of(lease)).set(1);
        } else {
            self.riding.remove(&LeaseLabels::of(lease));
        }
    }

    /// Sets `vipd_peer_api_reachable`.
    pub fn set_api_reachable(&self, reachable: bool) {
        self.api.set(i64::from(reachable));
    }

    /// Counts one received peer frame: `accepted` or the rejection reason.
    pub fn frame(&self, result: &str) {
        self.frames
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::metrics::Metrics;

    #[test]
    fn riding_leaves_no_series_once_it_ends() {
        let metrics = Metrics::new("n");
        let m = metrics.families::<PeerMetrics>();
        m.set_riding("default/kubevip-web", true);
        m.set_api_reachable(true);
        m.frame("accepted");
        m.frame("replay");
        let t = metrics.encode();
        for want in [
            r#"vipd_ride_through{lease_name="default/kubevip-web"} 1"#,
            "vipd_peer_api_reachable 1",
            r#"vipd_peer_frames_total{result="replay"} 1"#,
        ] {
            assert!(t.lines().any(|l| l == want), "missing {want}: {t}");
        }
        m.set_riding("default/kubevip-web", false);
        assert!(!metrics.encode().contains("kubevip-web"));
    }
}
