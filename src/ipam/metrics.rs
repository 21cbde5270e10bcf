//! The allocator's metric, exported by the node that holds the allocator's Lease.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `vipd_pool_addresses` | gauge | `pool`, `state` | on the allocator's holder: addresses of the pool (`cidr-global`, `range-shop`, ...) by `state`: `total` (usable: after `skip-end-ips-in-cidr` and the .0/.255 rule), `used` (shown by a Service, a Node or the control-plane VIP), `free`; no series elsewhere, nor for a malformed key |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::obs::metrics::{Families, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
    state: &'static str,
}

/// The allocator's family (see the module docs).
pub struct PoolMetrics {
    addresses: Family<PoolLabels, Gauge>,
}

impl Families for PoolMetrics {
    fn register(registry: &mut Registry, _node: &str) -> Self {
        let addresses = Family::default();
        registry.register(
            "vipd_pool_addresses",
            "Addresses of an IPAM pool by state (total, used, free), on the allocator's holder",
            Family::clone(&addresses),
        );
        PoolMetrics { addresses }
    }
}

/// One pool's figures: (key, total, used). Counts saturate at `i64::MAX`.
pub type PoolFigures = (String, u128, u128);

impl PoolMetrics {
    /// Replaces every series with `pools` (an empty list: none, e.g. not leading).
    pub fn set(&self, pools: &[PoolFigures]) {
        let gauge = |n: u128| i64::try_from(n).unwrap_or(i64::MAX);
        self.addresses.clear();
        for (pool, total, used) in pools {
            for (state, n) in [
                ("total", *total),
                ("used", *used),
                ("free", total.saturating_sub(*used)),
            ] {
                self.addresses
                    .get_or_create(&PoolLabels {
                        pool: pool.clone(),
                        state,
                    })
                    .set(gauge(n));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::metrics::Metrics;

    #[test]
    fn figures_replace_the_previous_ones() {
        let metrics = Metrics::new("n");
        let m = metrics.families::<PoolMetrics>();
        m.set(&[("cidr-global".into(), 14, 3), ("range-shop".into(), 2, 2)]);
        let t = metrics.encode();
        for want in [
            r#"vipd_pool_addresses{pool="cidr-global",state="total"} 14"#,
            r#"vipd_pool_addresses{pool="cidr-global",state="free"} 11"#,
            r#"vipd_pool_addresses{pool="range-shop",state="free"} 0"#,
        ] {
            assert!(t.lines().any(|l| l == want), "missing {want}: {t}");
        }
        m.set(&[("cidr-global".into(), 14, 4)]);
        let t = metrics.encode();
        assert!(!t.contains("range-shop"), "{t}");
        m.set(&[]);
        assert!(!metrics.encode().contains("vipd_pool_addresses{"));
    }
}
