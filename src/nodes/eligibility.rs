//! Which VIPs this node may announce, from its Node object and the local drain switch.
//!
//! * Service VIPs: a node campaigns for a Service lease only while it is eligible
//!   ([`services_ineligibility`]): not drained (`vipd drain`, the [`DRAIN_ANNOTATION`]
//!   annotation, or a cordon with `drain_on_cordon`), not labelled [`EXCLUDE_LABEL`] (the
//!   label kube-proxy-less load balancers and cloud controllers honour), Ready, without the
//!   `NetworkUnavailable=True` condition (the node's network is not configured: MetalLB's
//!   speaker stopped announcing from such nodes after metallb #1710, where one kept
//!   answering for VIPs it could not serve), and not cordoned when `svc_exclude_cordoned`
//!   is set (cordoned nodes stay eligible by default: cordoning stops new Pods, not
//!   traffic). This follows MetalLB's L2 speaker (NotReady, NetworkUnavailable and excluded
//!   nodes do not announce).
//! * The control-plane VIP ([`control_plane_ineligibility`]) only honours a drain: it must
//!   work before any Node object exists (bootstrap) and while the kubelet reports NotReady
//!   or the network NetworkUnavailable (the API server may be fine; it is what the CNI needs
//!   to reach to make the network available).
//! * No Node object (yet): eligible.
//!
//! A holder that becomes ineligible hands over gracefully: the elector's gate closes, the
//! VIPs are removed, then the lease is released (the ~50 ms path), and the next eligible
//! candidate takes it at once (Service leases: after its spread delay,
//! [`crate::election::spread`]).
//!
//! [`follow_own_node`] follows this node's Node object in the process's Node cache
//! ([`crate::nodes::NodeCache`]) and publishes the facts [`NodeFacts`] the decisions need.

pub mod metrics;

use std::fmt;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The well-known label that keeps a node out of external load balancers
/// (`node.kubernetes.io/exclude-from-external-load-balancers`, any value).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// vipd's maintenance annotation on a Node: `vipd.io/drain=true` (Go ParseBool true
/// values) hands every VIP the node holds to a peer and stops it campaigning until the
/// annotation is removed or false.
pub const DRAIN_ANNOTATION: &str = "vipd.io/drain";

/// The election gate a node's ineligibility closes (see [`crate::election::Gates`]): the
/// elector steps down with a release and stops campaigning until it opens again.
pub const GATE_INELIGIBLE: &str = "ineligible";

/// The local drain switch (`vipd drain`, through the admin endpoint's `/drain`). Cheap to
/// clone; every clone is the same switch.
/// It also keeps, per [`Wing`], the reason this node does not announce those VIPs now
/// (recorded by [`follow`]), so `GET /drain` and `vipd drain --status` tell the whole
/// story: a node drained by the annotation or a cordon is not announcing either.
#[derive(Debug, Clone)]
pub struct DrainSwitch {
    switch: std::sync::Arc<watch::Sender<bool>>,
    reasons: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<&'static str, Ineligible>>>,
}

impl Default for DrainSwitch {
    fn default() -> Self {
        DrainSwitch {
            switch: std::sync::Arc::new(watch::Sender::new(false)),
            reasons: Default::default(),
        }
    }
}

impl DrainSwitch {
    /// Drains (`true`) or undrains this node; logs a change.
    pub fn set(&self, drained: bool) {
        if self
            .switch
            .send_if_modified(|d| std::mem::replace(d, drained) != drained)
        {
            if drained {
                info!(
                    "drained (vipd drain): handing every VIP over and not campaigning until undrained"
                );
            } else {
                info!("undrained (vipd drain --undo): campaigning again");
            }
        }
    }

    /// Whether this node is drained with `vipd drain`.
    pub fn is_set(&self) -> bool {
        *self.switch.borrow()
    }

    /// A receiver of every change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.switch.subscribe()
    }

    /// Records why `wing`'s VIPs are not announced now (`None`: they may be).
    pub fn record(&self, wing: Wing, why: Option<Ineligible>) {
        if let Ok(mut m) = self.reasons.lock() {
            match why {
                Some(r) => m.insert(wing.label(), r),
                None => m.remove(wing.label()),
            };
        }
    }

    /// The answer of `GET /drain`: `drained` or `not drained` (the `vipd drain` switch),
    /// then one line per kind of VIP this node does not announce for another reason, e.g.
    /// `services: not announcing: annotated vipd.io/drain=true`.
    pub fn report(&self) -> String {
        let mut out = String::from(if self.is_set() {
            "drained"
        } else {
            "not drained"
        });
        out.push('\n');
        if let Ok(m) = self.reasons.lock() {
            for (wing, why) in m.iter().filter(|(_, w)| **w != Ineligible::DrainedLocally) {
                out.push_str(&format!("{wing}: not announcing: {why}\n"));
            }
        }
        out
    }
}

/// Which VIPs a decision is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wing {
    /// The control-plane VIP ([`control_plane_ineligibility`]; an unknown Node counts as
    /// eligible: bootstrap).
    ControlPlane,
    /// Service VIPs ([`services_ineligibility`]; an unknown Node is [`Ineligible::Unknown`]
    /// until the first list answers, so a drained node never campaigns at start).
    Services,
}

impl Wing {
    /// The `vips` label value.
    pub fn label(self) -> &'static str {
        match self {
            Wing::ControlPlane => "control-plane",
            Wing::Services => "services",
        }
    }
}

/// The reason for `wing` given what is known (`facts`: `None` until the Node was read).
/// Pure.
pub fn ineligibility(
    wing: Wing,
    facts: Option<&NodeFacts>,
    rules: EligibilityRules,
    drained_locally: bool,
) -> Option<Ineligible> {
    match (wing, facts) {
        (Wing::ControlPlane, f) => {
            control_plane_ineligibility(&f.cloned().unwrap_or_default(), rules, drained_locally)
        }
        (Wing::Services, None) if !drained_locally => Some(Ineligible::Unknown),
        (Wing::Services, f) => {
            services_ineligibility(&f.cloned().unwrap_or_default(), rules, drained_locally)
        }
    }
}

/// Follows `facts` and the local drain `switch` until `stop` (or a channel closes), and
/// calls `on_change` with the reason `wing`'s VIPs may not be announced (`None`:
/// eligible) at start and on every change, logging each change and setting
/// `vipd_node_ineligible{vips,reason}`.
pub async fn follow(
    wing: Wing,
    mut facts: watch::Receiver<Option<NodeFacts>>,
    switch: DrainSwitch,
    rules: EligibilityRules,
    metrics: crate::obs::metrics::Metrics,
    mut on_change: impl FnMut(Option<Ineligible>),
    stop: CancellationToken,
) {
    let metrics = metrics.families::<metrics::EligibilityMetrics>();
    let mut drain = switch.subscribe();
    let mut last: Option<Option<Ineligible>> = None;
    loop {
        let now = ineligibility(
            wing,
            facts.borrow_and_update().as_ref(),
            rules,
            *drain.borrow_and_update(),
        );
        if last != Some(now) {
            match (now, last.flatten()) {
                (Some(Ineligible::Unknown), _) => {
                    debug!(vips = wing.label(), "waiting for this node's Node object")
                }
                (Some(r), _) => {
                    warn!(vips = wing.label(), reason = %r, "this node is not eligible: handing its VIPs over and not campaigning")
                }
                (None, Some(r)) if r != Ineligible::Unknown => {
                    info!(
                        vips = wing.label(),
                        "this node is eligible again: campaigning"
                    )
                }
                (None, _) => {}
            }
            metrics.set(wing, now);
            switch.record(wing, now);
            on_change(now);
            last = Some(now);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            r = facts.changed() => if r.is_err() { return },
            r = drain.changed() => if r.is_err() { return },
        }
    }
}

/// What the decisions read from this node's Node object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The Node object exists.
    pub exists: bool,
    /// It carries [`EXCLUDE_LABEL`].
    pub excluded: bool,
    /// [`DRAIN_ANNOTATION`] is a true value.
    pub drain_annotation: bool,
    /// `spec.unschedulable` (cordoned).
    pub cordoned: bool,
    /// The `Ready` condition is present and not `True`.
    pub not_ready: bool,
    /// The `NetworkUnavailable` condition is `True` (set by a cloud's route controller or
    /// the CNI until the node's network is configured; absent, `False` or `Unknown`: the
    /// network counts as available).
    pub network_unavailable: bool,
}

impl NodeFacts {
    /// The facts of `node` (`None`: no Node object).
    pub fn of(node: Option<&Node>) -> Self {
        let Some(n) = node else {
            return NodeFacts::default();
        };
        let condition = |type_: &str| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == type_))
        };
        let ready = condition("Ready");
        NodeFacts {
            exists: true,
            excluded: n
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(EXCLUDE_LABEL)),
            drain_annotation: n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DRAIN_ANNOTATION))
                .and_then(|v| crate::syntax::parse_go_bool(v))
                .unwrap_or(false),
            cordoned: n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            not_ready: ready.is_some_and(|c| c.status != "True"),
            network_unavailable: condition("NetworkUnavailable")
                .is_some_and(|c| c.status == "True"),
        }
    }
}

/// The operator's choices (`drain_on_cordon`, `svc_exclude_cordoned`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EligibilityRules {
    /// A cordoned node hands over every VIP (so `kubectl drain` moves VIPs before the
    /// reboot).
    pub drain_on_cordon: bool,
    /// A cordoned node does not announce Service VIPs (the control-plane VIP stays).
    pub exclude_cordoned: bool,
}

/// Why this node may not announce a VIP (for logs, Events and the
/// `vipd_node_ineligible{reason}` metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ineligible {
    /// `vipd drain` on this node.
    DrainedLocally,
    /// [`DRAIN_ANNOTATION`] on the Node.
    DrainAnnotation,
    /// Cordoned, with `drain_on_cordon`.
    CordonDrain,
    /// Labelled [`EXCLUDE_LABEL`].
    Excluded,
    /// The kubelet reports the node not Ready.
    NotReady,
    /// The Node's `NetworkUnavailable` condition is `True`: its network is not configured
    /// yet (or any more), so traffic for a VIP it announced would be lost (metallb #1710).
    NetworkUnavailable,
    /// Cordoned, with `svc_exclude_cordoned`.
    Cordoned,
    /// The Node object has not been read yet (Service VIPs wait for it).
    Unknown,
}

impl Ineligible {
    /// Every reason, for metrics.
    pub const ALL: [Ineligible; 8] = [
        Ineligible::DrainedLocally,
        Ineligible::DrainAnnotation,
        Ineligible::CordonDrain,
        Ineligible::Excluded,
        Ineligible::NotReady,
        Ineligible::NetworkUnavailable,
        Ineligible::Cordoned,
        Ineligible::Unknown,
    ];

    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            Ineligible::DrainedLocally => "drained",
            Ineligible::DrainAnnotation => "drain-annotation",
            Ineligible::CordonDrain => "cordon-drain",
            Ineligible::Excluded => "excluded",
            Ineligible::NotReady => "not-ready",
            Ineligible::NetworkUnavailable => "network-unavailable",
            Ineligible::Cordoned => "cordoned",
            Ineligible::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Ineligible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ineligible::DrainedLocally => "drained with `vipd drain`",
            Ineligible::DrainAnnotation => "annotated vipd.io/drain=true",
            Ineligible::CordonDrain => "cordoned (drain_on_cordon)",
            Ineligible::Excluded => {
                "labelled node.kubernetes.io/exclude-from-external-load-balancers"
            }
            Ineligible::NotReady => "NotReady",
            Ineligible::NetworkUnavailable => "NetworkUnavailable (condition True)",
            Ineligible::Cordoned => "cordoned (svc_exclude_cordoned)",
            Ineligible::Unknown => "this node's Node object has not been read yet",
        })
    }
}

/// Why this node may not campaign for the control-plane VIP: a drain only. Pure.
pub fn control_plane_ineligibility(
    facts: &NodeFacts,
    rules: EligibilityRules,
    drained_locally: bool,
) -> Option<Ineligible> {
    if drained_locally {
        Some(Ineligible::DrainedLocally)
    } else if facts.drain_annotation {
        Some(Ineligible::DrainAnnotation)
    } else if rules.drain_on_cordon && facts.cordoned {
        Some(Ineligible::CordonDrain)
    } else {
        None
    }
}

/// Why this node may not campaign for Service VIPs (the first reason that applies, drains
/// first); `None`: eligible. Pure.
pub fn services_ineligibility(
    facts: &NodeFacts,
    rules: EligibilityRules,
    drained_locally: bool,
) -> Option<Ineligible> {
    control_plane_ineligibility(facts, rules, drained_locally).or(if facts.excluded {
        Some(Ineligible::Excluded)
    } else if facts.not_ready {
        Some(Ineligible::NotReady)
    } else if facts.network_unavailable {
        Some(Ineligible::NetworkUnavailable)
    } else if rules.exclude_cordoned && facts.cordoned {
        Some(Ineligible::Cordoned)
    } else {
        None
    })
}

/// The facts of Node `node` as `nodes` has it (no such Node: [`NodeFacts::default`]).
pub fn facts_in(nodes: &Store<Node>, node: &str) -> NodeFacts {
    NodeFacts::of(nodes.get(&ObjectRef::new(node)).as_deref())
}

/// Follows Node `node` in the process's Node cache `nodes` until `stop` (or the cache's
/// watch stops), publishing its [`NodeFacts`] on `tx` only on change; `None` stays until
/// the cache's first list answers. A failing watch (RBAC, API outage) is logged once by the
/// cache ([`crate::kube::watch::spawn_shared`]) and retried with back-off; the last facts
/// stay meanwhile. RBAC: `list` and `watch` on nodes.
pub async fn follow_own_node(
    nodes: crate::nodes::NodeCache,
    node: String,
    tx: watch::Sender<Option<NodeFacts>>,
    stop: CancellationToken,
) {
    let mut changes = nodes.changes();
    tokio::select! {
        _ = stop.cancelled() => return,
        listed = nodes.ready() => if !listed { return },
    }
    loop {
        // Seen before the cache is read: a change after the read wakes the next round.
        changes.borrow_and_update();
        let facts = Some(facts_in(nodes.store(), &node));
        tx.send_if_modified(|cur| {
            if *cur != facts {
                debug!(%node, facts = ?facts, "this node's Node object changed");
                *cur = facts;
                true
            } else {
                false
            }
        });
        tokio::select! {
            _ = stop.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests;
