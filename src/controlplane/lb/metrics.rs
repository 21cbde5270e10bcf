//! The control-plane load balancer's metric.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `vipd_lb_backend_up` | gauge | `node`, `address` | `lb_enable`, on the control-plane VIP's holder only: 1 while a control-plane node's API server is in the load balancer's set, 0 while it fails its health checks |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::obs::metrics::{Families, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    node: String,
    address: String,
}

/// The load balancer's family (see the module docs).
pub struct LbMetrics {
    backends: Family<BackendLabels, Gauge>,
}

impl Families for LbMetrics {
    fn register(registry: &mut Registry, _node: &str) -> Self {
        let backends = Family::default();
        registry.register(
            "vipd_lb_backend_up",
            "Control-plane load balancer (lb_enable), on the VIP's holder: 1 while the node's API server is in the set, 0 while it fails its health checks",
            Family::clone(&backends),
        );
        LbMetrics { backends }
    }
}

impl LbMetrics {
    /// Replaces every `vipd_lb_backend_up` series with `backends` (node, address, in the
    /// set); an empty list (not leading, or `lb_enable` off) leaves none.
    pub fn backends<'a>(&self, backends: impl IntoIterator<Item = (&'a str, String, bool)>) {
        self.backends.clear();
        for (node, address, up) in backends {
            self.backends
                .get_or_create(&BackendLabels {
                    node: node.to_string(),
                    address,
                })
                .set(i64::from(up));
        }
    }
}
