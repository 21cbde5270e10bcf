//! The egress wing's metrics.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `vipd_egress_endpoints` | gauge | `service` | endpoints of the Service (`namespace/name`) on this node with egress rules installed: their connections leave with its VIP while this node holds it; no series for a Service without one |
//! | `vipd_egress_connections_total` | counter | `service` | connections this node translated to the Service's VIP (read from the rules' counters every 10 s and before each change of the rules) |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::obs::metrics::{Families, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
}

/// The egress wing's families (see the module docs).
pub struct EgressMetrics {
    endpoints: Family<ServiceLabels, Gauge>,
    connections: Family<ServiceLabels, Counter>,
}

impl Families for EgressMetrics {
    fn register(registry: &mut Registry, _node: &str) -> Self {
        let m = EgressMetrics {
            endpoints: Family::default(),
            connections: Family::default(),
        };
        registry.register(
            "vipd_egress_endpoints",
            "Endpoints of the Service on this node with egress rules installed",
            m.endpoints.clone(),
        );
        registry.register(
            "vipd_egress_connections",
            "Connections this node translated to the Service's VIP",
            m.connections.clone(),
        );
        m
    }
}

impl EgressMetrics {
    /// Replaces the endpoint gauges with `per_service` (`namespace/name`, endpoints).
    pub fn set_endpoints(&self, per_service: &[(String, usize)]) {
        self.endpoints.clear();
        for (service, n) in per_service {
            self.endpoints
                .get_or_create(&ServiceLabels {
                    service: service.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Adds `n` translated connections of `service`.
    pub fn translated(&self, service: &str, n: u64) {
        self.connections
            .get_or_create(&ServiceLabels {
                service: service.to_string(),
            })
            .inc_by(n);
    }
}
