//! The metrics registry (prometheus-client, OpenMetrics text), served on `/metrics` by the
//! manager's admin server.
//!
//! Each module registers the families it owns: it declares them in a type that implements
//! [`Families`], and reaches them with [`Metrics::families`], which registers them on first
//! use. The manager registers every owner's families at start (`cmd::manager::metrics`), so
//! `/metrics` lists all of them from the first scrape. The owners and their tables:
//! `election::metrics` (leadership, renewals, failovers), `holder::metrics` (announcements,
//! conflicts, VIPs held), `nodes::eligibility::metrics` (eligibility), `peer::metrics` (ride-through, peer
//! frames), `services::metrics` (Services, health checks, hand-overs, DHCP clients),
//! `controlplane::lb::metrics` (load balancer backends), `ipam::metrics` (address pools).
//!
//! This module owns the one family that belongs to the process as a whole:
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `kube_vip_build_info` | gauge (1) | `version`, `build`, `node` | version skew across nodes (kube-vip's name) |

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::registry::Registry;

/// The label set of a lease's series: `lease_name` (`namespace/name`, or the control-plane
/// lease's name, as kube-vip labels it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    /// The lease, e.g. `plndr-cp-lock` or `default/kubevip-web`.
    pub lease_name: String,
}

impl LeaseLabels {
    /// The labels of `lease`.
    pub fn of(lease: &str) -> Self {
        LeaseLabels {
            lease_name: lease.to_string(),
        }
    }
}

/// The label set of a VIP's series: `vip` (an address, e.g. `192.0.2.10`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VipLabels {
    /// The address as text.
    pub vip: String,
}

impl VipLabels {
    /// The labels of `vip`.
    pub fn of(vip: impl std::fmt::Display) -> Self {
        VipLabels {
            vip: vip.to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    build: String,
    node: String,
}

/// A module's metric families: registered once per [`Metrics`], the first time the module
/// asks for them ([`Metrics::families`]).
pub trait Families: Send + Sync + 'static {
    /// Creates the families and registers each in `registry`; `node` is this node's name,
    /// for families with a `node` label.
    fn register(registry: &mut Registry, node: &str) -> Self;
}

type Registered = HashMap<TypeId, Arc<dyn Any + Send + Sync>>;

struct Inner {
    node: String,
    registry: Mutex<Registry>,
    families: Mutex<Registered>,
}

/// vipd's metrics: one registry and the families registered in it. Cheap to clone (an
/// `Arc`); every method is thread-safe and never fails.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("node", &self.0.node)
            .finish()
    }
}

impl Metrics {
    /// A registry for node `node` (the `node` label) holding `kube_vip_build_info`; other
    /// families are registered by their owners.
    pub fn new(node: &str) -> Self {
        let mut registry = Registry::default();
        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "kube_vip_build_info",
            "Constant 1; track version skew across nodes",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                build: "vipd".to_string(),
                node: node.to_string(),
            })
            .set(1);
        Metrics(Arc::new(Inner {
            node: node.to_string(),
            registry: Mutex::new(registry),
            families: Mutex::new(HashMap::new()),
        }))
    }

    /// The families of type `F`, registered now if no one asked for them before. A lock
    /// and a map lookup: owners on a hot path may keep the `Arc`.
    pub fn families<F: Families>(&self) -> Arc<F> {
        let mut registered = self
            .0
            .families
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = registered
            .get(&TypeId::of::<F>())
            .and_then(|f| Arc::clone(f).downcast::<F>().ok())
        {
            return f;
        }
        let mut registry = self
            .0
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let f = Arc::new(F::register(&mut registry, &self.0.node));
        registered.insert(TypeId::of::<F>(), f.clone());
        f
    }

    /// This node's name, as the `node` label gives it.
    pub fn node(&self) -> &str {
        &self.0.node
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut s = String::new();
        let registry = self
            .0
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if prometheus_client::encoding::text::encode(&mut s, &registry).is_err() {
            // Writing to a String cannot fail; keep the output well-formed anyway.
            s.clear();
            let _ = writeln!(s, "# EOF");
        }
        s
    }
}

/// Converts a count to a gauge value, saturating at `i64::MAX`.
pub fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metric names a module's docs table lists (`//! | \`name\` | ...` lines at the top of
/// `source`), as queries spell them (`_total` for counters): for tests that tie a table to
/// what is exported.
pub fn documented_names(source: &str) -> Vec<String> {
    source
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .filter_map(|l| l.strip_prefix("//! | `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

/// The metric names `text` (an exposition) declares, as queries spell them (`_total` for
/// counters).
pub fn exported_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, kind) = (w.next()?, w.next()?);
            Some(if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    struct Probe {
        hits: Family<LeaseLabels, Counter>,
    }

    impl Families for Probe {
        fn register(registry: &mut Registry, _node: &str) -> Self {
            let hits = Family::default();
            registry.register("test_hits", "Hits", Family::clone(&hits));
            Probe { hits }
        }
    }

    #[test]
    fn families_are_registered_once_and_shared_by_clones() {
        let m = Metrics::new("node-a");
        assert!(!m.encode().contains("test_hits"));
        m.families::<Probe>()
            .hits
            .get_or_create(&LeaseLabels::of("a"))
            .inc();
        m.clone()
            .families::<Probe>()
            .hits
            .get_or_create(&LeaseLabels::of("a"))
            .inc();
        let t = m.encode();
        assert_eq!(t.matches("# TYPE test_hits counter").count(), 1, "{t}");
        assert!(
            t.lines()
                .any(|l| l == r#"test_hits_total{lease_name="a"} 2"#),
            "{t}"
        );
    }

    #[test]
    fn build_info_and_the_end_marker() {
        let t = Metrics::new("node-a").encode();
        let build = t
            .lines()
            .find(|l| l.starts_with("kube_vip_build_info{"))
            .unwrap_or_default();
        assert!(build.contains(r#"node="node-a""#), "{t}");
        assert!(build.ends_with(" 1"), "{t}");
        assert!(t.ends_with("# EOF\n"), "{t}");
        assert_eq!(
            exported_names(&t),
            documented_names(include_str!("metrics.rs"))
        );
    }
}
