//! Prometheus metrics (prometheus-client, OpenMetrics text), served on `/metrics` by
//! [`crate::obs::readiness`].
//!
//! kube-vip's metric names are kept where kube-vip has the same thing:
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `kube_vip_is_leader` | gauge | `node`, `lease_name` | 1 while this node holds the lease |
//! | `kube_vip_leader_election_transitions_total` | counter | `lease_name` | leadership changes of this node (became or stopped being leader) |
//! | `kube_vip_active_services` | gauge | `namespace` | LoadBalancer Services this node announces |
//! | `kube_vip_build_info` | gauge (1) | `version`, `build`, `node` | version skew across nodes |
//!
//! vipd's own:
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `vipd_lease_renew_duration_seconds` | histogram | `lease_name` | latency of successful renewals, seconds |
//! | `vipd_lease_renew_failures_total` | counter | `lease_name` | failed renew attempts |
//! | `vipd_failovers_total` | counter | `lease_name` | times this node took over a lease another node held |
//! | `vipd_duplicate_identity_total` | counter | `lease_name` | writes under this node's identity made by another process (duplicate node name) |
//! | `vipd_garp_sent_total` | counter | `vip` | gratuitous ARPs / unsolicited NAs sent |
//! | `vipd_vips_held` | gauge | | VIPs this node carries right now |
//! | `vipd_node_ineligible` | gauge | `vips`, `reason` | 1 while this node may not announce `vips` (`control-plane` or `services`) for `reason` (drained, drain-annotation, cordon-drain, excluded, not-ready, cordoned, unknown); no series while eligible |
//! | `vipd_ride_through` | gauge | `lease_name` | 1 while this node keeps the lease's Service VIPs through an API server outage (`svc_ridethrough`); no series otherwise |
//! | `vipd_peer_api_reachable` | gauge | | with `svc_ridethrough`: 1 while this node's API probe (`/readyz`) answers, as its heartbeats say |
//! | `vipd_peer_frames_total` | counter | `result` | peer protocol frames received: `accepted`, or why rejected (`bad_mac`, `bad_magic`, `bad_version`, `malformed`, `skew`, `replay`, `old_boot`) |
//! | `vipd_health_check_failures_total` | counter | `lease_name` | failed data-path health checks of this Service lease's group (run while leading, and while handed over for health) |
//! | `vipd_health_handovers_total` | counter | `lease_name` | times this node handed the lease over because its data-path health check failed |
//! | `vipd_vip_handovers_total` | counter | `vip`, `reason` | times this node handed a Service VIP it held over on purpose, by reason: the node became ineligible (`drained`, `drain-annotation`, `cordon-drain`, `excluded`, `not-ready`, `cordoned`), `health` (data-path check), `node-selector` (its labels stopped matching the Service's `vipd.io/node-selector`), `subnet` (no connected subnet holds the VIP any more); kept until the Service goes |
//! | `vipd_lb_backend_up` | gauge | `node`, `address` | `lb_enable`, on the control-plane VIP's holder only: 1 while a control-plane node's API server is in the load balancer's set, 0 while it fails its health checks |
//! | `vipd_vip_conflicts_total` | counter | `vip` | times another host was found answering for a VIP this node leads (RFC 5227 conflict): the VIP was not bound, or was removed |
//!
//! DHCP mode's are in `src/obs/metrics/dhcp.rs` (`vipd_dhcp_state`, `vipd_dhcp_lease_expiry_timestamp_seconds`,
//! `vipd_dhcp_events_total`).

mod dhcp;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the renew latency histogram buckets.
pub(crate) const RENEW_BUCKETS: [f64; 11] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaderLabels {
    node: String,
    lease_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    lease_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VipLabels {
    vip: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandoverLabels {
    vip: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IneligibleLabels {
    vips: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    node: String,
    address: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    build: String,
    node: String,
}

type HistogramFamily = Family<LeaseLabels, Histogram, fn() -> Histogram>;

fn renew_histogram() -> Histogram {
    Histogram::new(RENEW_BUCKETS)
}

struct Inner {
    registry: Registry,
    node: String,
    is_leader: Family<LeaderLabels, Gauge>,
    transitions: Family<LeaseLabels, Counter>,
    active_services: Family<NamespaceLabels, Gauge>,
    renew: HistogramFamily,
    renew_failures: Family<LeaseLabels, Counter>,
    failovers: Family<LeaseLabels, Counter>,
    duplicate_identity: Family<LeaseLabels, Counter>,
    garp: Family<VipLabels, Counter>,
    vips_held: Gauge,
    conflicts: Family<VipLabels, Counter>,
    ineligible: Family<IneligibleLabels, Gauge>,
    riding: Family<LeaseLabels, Gauge>,
    peer_api: Gauge,
    peer_frames: Family<ResultLabels, Counter>,
    health_failures: Family<LeaseLabels, Counter>,
    health_handovers: Family<LeaseLabels, Counter>,
    vip_handovers: Family<HandoverLabels, Counter>,
    lb_backends: Family<BackendLabels, Gauge>,
    dhcp: dhcp::DhcpMetrics,
}

/// vipd's metrics. Cheap to clone (an `Arc`); every method is thread-safe and never fails.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("node", &self.0.node)
            .finish()
    }
}

/// Registers the ride-through and peer protocol families.
fn register_peer(
    registry: &mut Registry,
    riding: &Family<LeaseLabels, Gauge>,
    peer_api: &Gauge,
    peer_frames: &Family<ResultLabels, Counter>,
) {
    registry.register(
        "vipd_ride_through",
        "1 while this node keeps the lease's Service VIPs through an API server outage",
        riding.clone(),
    );
    registry.register(
        "vipd_peer_api_reachable",
        "1 while this node's API probe answers (peer protocol, svc_ridethrough)",
        peer_api.clone(),
    );
    registry.register(
        "vipd_peer_frames",
        "Peer protocol frames received: accepted, or the reason they were rejected",
        peer_frames.clone(),
    );
}

/// Registers the control-plane load balancer's family.
fn register_lb(registry: &mut Registry, lb_backends: &Family<BackendLabels, Gauge>) {
    registry.register(
        "vipd_lb_backend_up",
        "Control-plane load balancer (lb_enable), on the VIP's holder: 1 while the node's API server is in the set, 0 while it fails its health checks",
        lb_backends.clone(),
    );
}

/// Registers the families kube-vip also has (same names): leadership, Services, build.
fn register_kube_vip(
    registry: &mut Registry,
    is_leader: &Family<LeaderLabels, Gauge>,
    transitions: &Family<LeaseLabels, Counter>,
    active_services: &Family<NamespaceLabels, Gauge>,
    build_info: &Family<BuildLabels, Gauge>,
) {
    registry.register(
        "kube_vip_is_leader",
        "1 if this node currently holds the lease",
        is_leader.clone(),
    );
    registry.register(
        "kube_vip_leader_election_transitions",
        "Leadership changes of this node; frequent transitions mean instability",
        transitions.clone(),
    );
    registry.register(
        "kube_vip_active_services",
        "LoadBalancer Services this node announces",
        active_services.clone(),
    );
    registry.register(
        "kube_vip_build_info",
        "Constant 1; track version skew across nodes",
        build_info.clone(),
    );
}

/// Registers the lease families: renewals, failovers, duplicate identities.
fn register_lease(
    registry: &mut Registry,
    renew: &HistogramFamily,
    renew_failures: &Family<LeaseLabels, Counter>,
    failovers: &Family<LeaseLabels, Counter>,
    duplicate_identity: &Family<LeaseLabels, Counter>,
) {
    registry.register(
        "vipd_lease_renew_duration_seconds",
        "Latency of successful lease renewals in seconds",
        renew.clone(),
    );
    registry.register(
        "vipd_lease_renew_failures",
        "Failed lease renew attempts",
        renew_failures.clone(),
    );
    registry.register(
        "vipd_failovers",
        "Times this node took over a lease that another node held",
        failovers.clone(),
    );
    registry.register(
        "vipd_duplicate_identity",
        "Writes to the lease under this node's identity made by another process \
         (two nodes with the same node name)",
        duplicate_identity.clone(),
    );
}

/// Registers the VIP families: announcements, conflicts, VIPs held, eligibility.
fn register_vips(
    registry: &mut Registry,
    garp: &Family<VipLabels, Counter>,
    conflicts: &Family<VipLabels, Counter>,
    vips_held: &Gauge,
    ineligible: &Family<IneligibleLabels, Gauge>,
) {
    registry.register(
        "vipd_garp_sent",
        "Gratuitous ARPs / unsolicited neighbour advertisements sent",
        garp.clone(),
    );
    registry.register(
        "vipd_vip_conflicts",
        "Times another host was found answering for a VIP this node leads; the VIP was not bound or was removed",
        conflicts.clone(),
    );
    registry.register(
        "vipd_vips_held",
        "VIPs this node carries right now",
        vips_held.clone(),
    );
    registry.register(
        "vipd_node_ineligible",
        "1 while this node may not announce these VIPs (control-plane or services) for this reason",
        ineligible.clone(),
    );
}

/// Registers the health check and hand-over families.
fn register_handovers(
    registry: &mut Registry,
    health_failures: &Family<LeaseLabels, Counter>,
    health_handovers: &Family<LeaseLabels, Counter>,
    vip_handovers: &Family<HandoverLabels, Counter>,
) {
    registry.register(
        "vipd_health_check_failures",
        "Failed data-path health checks of this Service lease's group",
        health_failures.clone(),
    );
    registry.register(
        "vipd_health_handovers",
        "Times this node handed the lease over because its data-path health check failed",
        health_handovers.clone(),
    );
    registry.register(
        "vipd_vip_handovers",
        "Times this node handed a Service VIP over on purpose, by reason",
        vip_handovers.clone(),
    );
}

impl Metrics {
    /// A registry with every metric registered, for node `node` (the `node` label).
    pub fn new(node: &str) -> Self {
        let mut registry = Registry::default();
        let is_leader = Family::<LeaderLabels, Gauge>::default();
        let transitions = Family::<LeaseLabels, Counter>::default();
        let active_services = Family::<NamespaceLabels, Gauge>::default();
        let build_info = Family::<BuildLabels, Gauge>::default();
        let renew: HistogramFamily = Family::new_with_constructor(renew_histogram);
        let renew_failures = Family::<LeaseLabels, Counter>::default();
        let failovers = Family::<LeaseLabels, Counter>::default();
        let duplicate_identity = Family::<LeaseLabels, Counter>::default();
        let garp = Family::<VipLabels, Counter>::default();
        let vips_held = Gauge::default();
        let conflicts = Family::<VipLabels, Counter>::default();
        let ineligible = Family::<IneligibleLabels, Gauge>::default();
        let riding = Family::<LeaseLabels, Gauge>::default();
        let peer_api = Gauge::default();
        let peer_frames = Family::<ResultLabels, Counter>::default();
        let health_failures = Family::<LeaseLabels, Counter>::default();
        let health_handovers = Family::<LeaseLabels, Counter>::default();
        let vip_handovers = Family::<HandoverLabels, Counter>::default();
        let lb_backends = Family::<BackendLabels, Gauge>::default();
        register_peer(&mut registry, &riding, &peer_api, &peer_frames);
        register_lb(&mut registry, &lb_backends);
        register_kube_vip(
            &mut registry,
            &is_leader,
            &transitions,
            &active_services,
            &build_info,
        );
        register_lease(
            &mut registry,
            &renew,
            &renew_failures,
            &failovers,
            &duplicate_identity,
        );
        register_vips(&mut registry, &garp, &conflicts, &vips_held, &ineligible);
        register_handovers(
            &mut registry,
            &health_failures,
            &health_handovers,
            &vip_handovers,
        );
        let dhcp = dhcp::DhcpMetrics::register(&mut registry);
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                build: "vipd".to_string(),
                node: node.to_string(),
            })
            .set(1);
        Metrics(Arc::new(Inner {
            registry,
            node: node.to_string(),
            is_leader,
            transitions,
            active_services,
            renew,
            renew_failures,
            failovers,
            duplicate_identity,
            garp,
            vips_held,
            conflicts,
            ineligible,
            riding,
            peer_api,
            peer_frames,
            health_failures,
            health_handovers,
            vip_handovers,
            lb_backends,
            dhcp,
        }))
    }

    fn lease(lease: &str) -> LeaseLabels {
        LeaseLabels {
            lease_name: lease.to_string(),
        }
    }

    /// Sets `kube_vip_is_leader{node, lease_name}` to 1 or 0.
    pub(crate) fn set_leading(&self, lease: &str, leading: bool) {
        self.0
            .is_leader
            .get_or_create(&LeaderLabels {
                node: self.0.node.clone(),
                lease_name: lease.to_string(),
            })
            .set(i64::from(leading));
    }

    /// Counts one leadership change of this node for `lease`.
    pub fn transition(&self, lease: &str) {
        self.0.transitions.get_or_create(&Self::lease(lease)).inc();
    }

    /// Observes one successful renewal of `lease` that took `latency`.
    pub(crate) fn renew_latency(&self, lease: &str, latency: Duration) {
        self.0
            .renew
            .get_or_create(&Self::lease(lease))
            .observe(latency.as_secs_f64());
    }

    /// Counts one failed renew attempt of `lease`.
    pub(crate) fn renew_failure(&self, lease: &str) {
        self.0
            .renew_failures
            .get_or_create(&Self::lease(lease))
            .inc();
    }

    /// Counts one takeover of `lease` from another holder.
    pub fn failover(&self, lease: &str) {
        self.0.failovers.get_or_create(&Self::lease(lease)).inc();
    }

    /// Counts one write to `lease` under this node's identity by another process.
    pub(crate) fn duplicate_identity(&self, lease: &str) {
        self.0
            .duplicate_identity
            .get_or_create(&Self::lease(lease))
            .inc();
    }

    /// Counts one gratuitous ARP / unsolicited NA for `vip` (an address, e.g. `192.0.2.10`).
    pub(crate) fn garp_sent(&self, vip: impl std::fmt::Display) {
        self.0
            .garp
            .get_or_create(&VipLabels {
                vip: vip.to_string(),
            })
            .inc();
    }

    /// Removes every series of `lease` (leader gauge, transitions, renew latency and
    /// failures, failovers, duplicate-identity writes, health checks), so that Services deleted over time do not leave series behind.
    pub(crate) fn forget_lease(&self, lease: &str) {
        let l = Self::lease(lease);
        self.0.is_leader.remove(&LeaderLabels {
            node: self.0.node.clone(),
            lease_name: lease.to_string(),
        });
        self.0.transitions.remove(&l);
        self.0.renew.remove(&l);
        self.0.renew_failures.remove(&l);
        self.0.failovers.remove(&l);
        self.0.duplicate_identity.remove(&l);
        self.0.health_failures.remove(&l);
        self.0.health_handovers.remove(&l);
    }

    /// Counts one failed data-path health check of `lease`'s group.
    pub(crate) fn health_check_failed(&self, lease: &str) {
        self.0
            .health_failures
            .get_or_create(&Self::lease(lease))
            .inc();
    }

    /// Counts one hand-over of `lease` for a failed health check.
    pub(crate) fn health_handover(&self, lease: &str) {
        self.0
            .health_handovers
            .get_or_create(&Self::lease(lease))
            .inc();
    }

    /// Counts one deliberate hand-over of Service VIP `vip` for `reason` (the `reason`
    /// label, see the module docs).
    pub(crate) fn vip_handover(&self, vip: impl std::fmt::Display, reason: &str) {
        self.0
            .vip_handovers
            .get_or_create(&HandoverLabels {
                vip: vip.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Removes the `vipd_vip_handovers_total` series of `vip` with each of `reasons` (every
    /// reason its owner counts: its Service is gone).
    pub(crate) fn forget_vip_handovers<'a>(
        &self,
        vip: impl std::fmt::Display,
        reasons: impl IntoIterator<Item = &'a str>,
    ) {
        let vip = vip.to_string();
        for reason in reasons {
            self.0.vip_handovers.remove(&HandoverLabels {
                vip: vip.clone(),
                reason: reason.to_string(),
            });
        }
    }

    /// Counts one address conflict for `vip` (another host answers for it).
    pub(crate) fn vip_conflict(&self, vip: impl std::fmt::Display) {
        self.0
            .conflicts
            .get_or_create(&VipLabels {
                vip: vip.to_string(),
            })
            .inc();
    }

    /// Removes the `vipd_garp_sent_total` and `vipd_vip_conflicts_total` series of `vip` (a
    /// VIP this node no longer has any use for).
    pub(crate) fn forget_vip(&self, vip: impl std::fmt::Display) {
        let labels = VipLabels {
            vip: vip.to_string(),
        };
        self.0.garp.remove(&labels);
        self.0.conflicts.remove(&labels);
    }

    /// Removes `kube_vip_active_services{namespace}` (a namespace without announced
    /// Services any more).
    pub(crate) fn forget_namespace(&self, namespace: &str) {
        self.0.active_services.remove(&NamespaceLabels {
            namespace: namespace.to_string(),
        });
    }

    /// Sets `vipd_node_ineligible{vips, reason}`: 1 for `reason`, and no other series of
    /// `vips` (none at all when `reason` is `None`: eligible); `every_reason` lists the
    /// reasons its owner has (`crate::nodes::eligibility::Ineligible::label`).
    pub fn set_ineligible(&self, vips: &str, reason: Option<&str>, every_reason: &[&str]) {
        for r in every_reason {
            if Some(*r) != reason {
                self.0.ineligible.remove(&IneligibleLabels {
                    vips: vips.to_string(),
                    reason: r.to_string(),
                });
            }
        }
        if let Some(reason) = reason {
            self.0
                .ineligible
                .get_or_create(&IneligibleLabels {
                    vips: vips.to_string(),
                    reason: reason.to_string(),
                })
                .set(1);
        }
    }

    /// Sets `vipd_ride_through{lease_name}`: 1 while riding, no series otherwise.
    pub(crate) fn set_riding(&self, lease: &str, riding: bool) {
        if riding {
            self.0.riding.get_or_create(&Self::lease(lease)).set(1);
        } else {
            self.0.riding.remove(&Self::lease(lease));
        }
    }

    /// Sets `vipd_peer_api_reachable`.
    pub(crate) fn set_peer_api_reachable(&self, reachable: bool) {
        self.0.peer_api.set(i64::from(reachable));
    }

    /// Counts one received peer frame: `accepted` or the rejection reason.
    pub(crate) fn peer_frame(&self, result: &str) {
        self.0
            .peer_frames
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
    }

    /// Sets `vipd_vips_held` to `n`.
    pub fn vips_held(&self, n: usize) {
        self.0.vips_held.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Replaces every `vipd_lb_backend_up` series with `backends` (node, address, in the
    /// set); an empty list (not leading, or `lb_enable` off) leaves none.
    pub fn lb_backends<'a>(&self, backends: impl IntoIterator<Item = (&'a str, String, bool)>) {
        self.0.lb_backends.clear();
        for (node, address, up) in backends {
            self.0
                .lb_backends
                .get_or_create(&BackendLabels {
                    node: node.to_string(),
                    address,
                })
                .set(i64::from(up));
        }
    }

    /// Sets `kube_vip_active_services{namespace}` to `n`.
    pub fn active_services(&self, namespace: &str, n: usize) {
        self.0
            .active_services
            .get_or_create(&NamespaceLabels {
                namespace: namespace.to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A registry with one series in every family (lease `example`, VIP `192.0.2.10`,
    /// namespace `default`): what `/metrics` can show, for checking dashboards and alert
    /// rules against the names vipd exports (an empty family prints nothing at all).
    pub fn example(node: &str) -> Self {
        let m = Metrics::new(node);
        let lease = "example";
        m.set_leading(lease, true);
        m.transition(lease);
        m.renew_latency(lease, Duration::from_millis(5));
        m.renew_failure(lease);
        m.failover(lease);
        m.duplicate_identity(lease);
        m.garp_sent("192.0.2.10");
        m.vip_conflict("192.0.2.10");
        m.vips_held(1);
        m.active_services("default", 1);
        m.set_ineligible("services", Some("drained"), &["drained"]);
        m.set_riding(lease, true);
        m.set_peer_api_reachable(true);
        m.peer_frame("accepted");
        m.health_check_failed(lease);
        m.health_handover(lease);
        m.vip_handover("192.0.2.10", "health");
        m.lb_backends([(node, "192.0.2.11".to_string(), true)]);
        m.dhcp_state("default/example", "v4", "bound", Some(1_800_000_000));
        m.dhcp_event("default/example", "v4", "renewed");
        m
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut s = String::new();
        if prometheus_client::encoding::text::encode(&mut s, &self.0.registry).is_err() {
            // Writing to a String cannot fail; keep the output well-formed anyway.
            s.clear();
            let _ = writeln!(s, "# EOF");
        }
        s
    }
}

/// Content type of [`Metrics::encode`].
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    /// Ineligibility reasons as their owner (`nodes::eligibility`) names them.
    const REASONS: &[&str] = &["not-ready", "drained", "cordoned"];

    /// `vipd_node_ineligible{vips, reason}`: one series per kind of VIP, for the current
    /// reason only; none once eligible.
    #[test]
    fn ineligible_keeps_only_the_current_reason() {
        let m = Metrics::new("node-a");
        m.set_ineligible("services", Some("not-ready"), REASONS);
        m.set_ineligible("control-plane", Some("drained"), REASONS);
        m.set_ineligible("services", Some("drained"), REASONS);
        let text = m.encode();
        assert!(
            text.contains(r#"vipd_node_ineligible{vips="services",reason="drained"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"reason="not-ready""#), "{text}");
        m.set_ineligible("services", None, REASONS);
        let text = m.encode();
        assert!(!text.contains(r#"vips="services""#), "{text}");
        assert!(
            text.contains(r#"vipd_node_ineligible{vips="control-plane",reason="drained"} 1"#),
            "{text}"
        );
    }

    /// [`Metrics::example`] shows every metric, and the module docs' tables list exactly
    /// what it shows (names as queries spell them: `_total` for counters).
    #[test]
    fn example_shows_every_metric_and_the_docs_list_them() {
        let text = Metrics::example("node-a").encode();
        let mut exported: Vec<String> = text
            .lines()
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
            .collect();
        exported.sort();
        let mut documented: Vec<String> =
            [include_str!("metrics.rs"), include_str!("metrics/dhcp.rs")]
                .iter()
                .flat_map(|f| f.lines().take_while(|l| l.starts_with("//!")))
                .filter_map(|l| l.strip_prefix("//! | `"))
                .filter_map(|l| l.split('`').next())
                .map(str::to_string)
                .collect();
        documented.sort();
        assert_eq!(exported.len(), 22, "{text}");
        assert_eq!(exported, documented);
    }

    #[test]
    fn forgotten_leases_vips_and_namespaces_leave_no_series() {
        let m = Metrics::new("node-a");
        for lease in ["default/kubevip-a", "default/kubevip-b"] {
            m.set_leading(lease, true);
            m.transition(lease);
            m.renew_latency(lease, Duration::from_millis(20));
            m.renew_failure(lease);
            m.failover(lease);
            m.duplicate_identity(lease);
            m.health_check_failed(lease);
            m.health_handover(lease);
        }
        m.garp_sent("192.0.2.10");
        m.garp_sent("192.0.2.11");
        m.active_services("default", 2);
        m.active_services("shop", 1);
        m.forget_lease("default/kubevip-a");
        m.forget_vip("192.0.2.10");
        m.forget_namespace("shop");
        let t = m.encode();
        assert!(!t.contains("kubevip-a"), "{t}");
        assert!(!t.contains("192.0.2.10"), "{t}");
        assert!(!t.contains("namespace=\"shop\""), "{t}");
        for kept in [
            r#"kube_vip_is_leader{node="node-a",lease_name="default/kubevip-b"} 1"#,
            r#"vipd_lease_renew_failures_total{lease_name="default/kubevip-b"} 1"#,
            r#"vipd_failovers_total{lease_name="default/kubevip-b"} 1"#,
            r#"vipd_garp_sent_total{vip="192.0.2.11"} 1"#,
            r#"kube_vip_active_services{namespace="default"} 2"#,
        ] {
            assert!(t.lines().any(|l| l == kept), "missing {kept}: {t}");
        }
    }

    #[test]
    fn vip_handovers_count_per_vip_and_reason_and_survive_until_the_service_goes() {
        let m = Metrics::new("node-a");
        m.vip_handover("192.0.2.20", "health");
        m.vip_handover("192.0.2.20", "health");
        m.vip_handover("192.0.2.20", "not-ready");
        m.vip_handover("192.0.2.21", "node-selector");
        // A group that stops forgets its GARP and conflict series, not the hand-overs.
        m.forget_vip("192.0.2.20");
        let t = m.encode();
        for want in [
            r#"vipd_vip_handovers_total{vip="192.0.2.20",reason="health"} 2"#,
            r#"vipd_vip_handovers_total{vip="192.0.2.20",reason="not-ready"} 1"#,
            r#"vipd_vip_handovers_total{vip="192.0.2.21",reason="node-selector"} 1"#,
        ] {
            assert!(t.lines().any(|l| l == want), "missing {want}: {t}");
        }
        m.forget_vip_handovers("192.0.2.20", ["health", "not-ready", "node-selector"]);
        let t = m.encode();
        assert!(!t.contains("192.0.2.20"), "{t}");
        assert!(t.contains(r#"vip="192.0.2.21""#), "{t}");
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn kube_vip_names_and_values() {
        let m = Metrics::new("node-a");
        m.set_leading("plndr-cp-lock", true);
        m.transition("plndr-cp-lock");
        m.transition("plndr-cp-lock");
        m.active_services("default", 3);
        let t = m.encode();
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
        assert_eq!(
            line(&t, "kube_vip_active_services{"),
            Some(r#"kube_vip_active_services{namespace="default"} 3"#)
        );
        assert!(
            line(&t, "kube_vip_build_info{").is_some_and(|l| l.ends_with(" 1")),
            "{t}"
        );
        assert!(t.ends_with("# EOF\n"), "{t}");
        m.set_leading("plndr-cp-lock", false);
        assert_eq!(
            line(&m.encode(), "kube_vip_is_leader{"),
            Some(r#"kube_vip_is_leader{node="node-a",lease_name="plndr-cp-lock"} 0"#)
        );
    }

    #[test]
    fn vipd_metrics() {
        let m = Metrics::new("n");
        m.renew_latency("l", Duration::from_millis(30));
        m.renew_latency("l", Duration::from_millis(700));
        m.renew_failure("l");
        m.failover("l");
        m.duplicate_identity("l");
        m.garp_sent("192.0.2.10");
        m.garp_sent(std::net::IpAddr::from([192, 0, 2, 10]));
        m.vips_held(2);
        let t = m.encode();
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
        assert_eq!(
            line(&t, "vipd_lease_renew_failures_total{"),
            Some(r#"vipd_lease_renew_failures_total{lease_name="l"} 1"#)
        );
        assert_eq!(
            line(&t, "vipd_failovers_total{"),
            Some(r#"vipd_failovers_total{lease_name="l"} 1"#)
        );
        assert_eq!(
            line(&t, "vipd_duplicate_identity_total{"),
            Some(r#"vipd_duplicate_identity_total{lease_name="l"} 1"#)
        );
        assert_eq!(
            line(&t, "vipd_garp_sent_total{"),
            Some(r#"vipd_garp_sent_total{vip="192.0.2.10"} 2"#)
        );
        assert_eq!(line(&t, "vipd_vips_held "), Some("vipd_vips_held 2"));
    }
}
