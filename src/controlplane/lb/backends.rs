//! Which backends the load balancer spreads over, and their health.
//!
//! * Candidates ([`node_backends`]), as kube-vip's node watcher finds them: Nodes carrying
//!   the label [`CONTROL_PLANE_LABEL`] (any value) whose `Ready` condition is `True`, at
//!   each of their `InternalIP` addresses. Only addresses of a VIP's family are used for it.
//! * Health ([`Health`]): an HTTPS `GET /readyz` to `address:port` every
//!   [`super::health::INTERVAL`] ([`super::health`]). A backend in the set leaves it after [`FALL`] failed
//!   checks in a row and comes back after [`RISE`] good ones (kube-vip had a bug where a
//!   recovered backend never came back: here every backend is checked for as long as its
//!   Node is a candidate). A backend not checked yet (new Node, new term) is in the set
//!   until its first check, and its first check alone decides: a new holder starts
//!   forwarding at once and drops a dead node after one check instead of three.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

/// The label kube-vip's node watcher selects control-plane Nodes by
/// (`node-role.kubernetes.io/control-plane`, any value).
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// Failed checks in a row that take a backend out of the set.
pub const FALL: u32 = 3;
/// Good checks in a row that bring a backend back.
pub const RISE: u32 = 2;

/// A candidate backend: a control-plane Node's address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Candidate {
    /// The Node's name (for logs and metrics).
    pub node: String,
    /// One of its `InternalIP` addresses.
    pub addr: IpAddr,
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The candidates among `nodes`: every `InternalIP` of every Ready Node labelled
/// [`CONTROL_PLANE_LABEL`], sorted by address (the round-robin order), without duplicates.
/// Unparsable addresses are skipped.
pub fn node_backends<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = nodes
        .into_iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
        })
        .filter(|n| ready(n))
        .flat_map(|n| {
            let name = n.metadata.name.clone().unwrap_or_default();
            n.status
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse::<IpAddr>().ok())
                .map(move |addr| Candidate {
                    node: name.clone(),
                    addr,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by(|a, b| a.addr.cmp(&b.addr).then_with(|| a.node.cmp(&b.node)));
    out.dedup_by(|a, b| a.addr == b.addr);
    out
}

/// Health of one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendHealth {
    /// In the forwarding set now.
    pub in_set: bool,
    /// Checked at least once.
    pub checked: bool,
    /// Failed checks in a row.
    pub fails: u32,
    /// Good checks in a row.
    pub oks: u32,
}

impl Default for BackendHealth {
    fn default() -> Self {
        BackendHealth {
            in_set: true,
            checked: false,
            fails: 0,
            oks: 0,
        }
    }
}

impl BackendHealth {
    /// Records one check; returns whether the backend entered or left the set.
    pub fn record(&mut self, ok: bool) -> bool {
        let was = self.in_set;
        if ok {
            self.oks += 1;
            self.fails = 0;
            if !self.in_set && (self.oks >= RISE || !self.checked) {
                self.in_set = true;
            }
        } else {
            self.fails += 1;
            self.oks = 0;
            if self.in_set && (self.fails >= FALL || !self.checked) {
                self.in_set = false;
            }
        }
        self.checked = true;
        was != self.in_set
    }
}

/// The health of every candidate, by address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    backends: BTreeMap<IpAddr, (String, BackendHealth)>,
}

impl Health {
    /// Follows the candidates: new ones start unchecked (in the set), gone ones are
    /// forgotten, the others keep their state. Returns whether the set changed.
    pub fn set_candidates(&mut self, candidates: &[Candidate]) -> bool {
        let before = self.in_set();
        self.backends
            .retain(|a, _| candidates.iter().any(|c| c.addr == *a));
        for c in candidates {
            self.backends
                .entry(c.addr)
                .and_modify(|(n, _)| n.clone_from(&c.node))
                .or_insert_with(|| (c.node.clone(), BackendHealth::default()));
        }
        before != self.in_set()
    }

    /// Forgets every check (a new term): every candidate is unchecked again.
    pub fn reset(&mut self) {
        for (_, h) in self.backends.values_mut() {
            *h = BackendHealth::default();
        }
    }

    /// Records a check of `addr` (ignored when it is no longer a candidate). Returns
    /// `Some(in_set)` when the backend entered or left the set.
    pub fn record(&mut self, addr: IpAddr, ok: bool) -> Option<bool> {
        let (_, h) = self.backends.get_mut(&addr)?;
        h.record(ok).then_some(h.in_set)
    }

    /// The backends in the set, by address (the round-robin order).
    pub fn in_set(&self) -> Vec<IpAddr> {
        self.backends
            .iter()
            .filter(|(_, (_, h))| h.in_set)
            .map(|(a, _)| *a)
            .collect()
    }

    /// Every candidate's address (what to check).
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.backends.keys().copied().collect()
    }

    /// The Node name of `addr`, if a candidate.
    pub fn node_of(&self, addr: IpAddr) -> Option<&str> {
        self.backends.get(&addr).map(|(n, _)| n.as_str())
    }

    /// Every candidate: address, Node name, in the set.
    pub fn all(&self) -> impl Iterator<Item = (IpAddr, &str, bool)> {
        self.backends
            .iter()
            .map(|(a, (n, h))| (*a, n.as_str(), h.in_set))
    }
}

#[cfg(test)]
mod tests;
