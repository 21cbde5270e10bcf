//! `enable_node_labeling` (kube-vip's `--enableNodeLabeling`): the node holding the
//! control-plane lease carries the label [`HAS_IP`]`=<VIP>` on its own Node object, as
//! kube-vip does. Only the control-plane VIP is labelled (Services are not, also as in
//! kube-vip), and only with `cp_enable`.
//!
//! * The value is the first control-plane address (`address` order) in kube-vip's spelling
//!   ([`has_ip_value`]): an IPv4 address as written, an IPv6 address as the 32 lowercase hex
//!   digits of its 16 bytes (a label value cannot hold `:`).
//! * Level-triggered: [`run`] follows the elector's leadership and makes the label match it
//!   (set while leading, removed otherwise, also a stale one found at start), retrying with
//!   capped back-off after a failed call (API outage, RBAC) and re-checking every
//!   [`RESYNC`] (someone removed it by hand). It runs in its own task: the VIP is bound and
//!   announced whatever the label's state.
//! * A node without a Node object (bootstrap) is logged once at info and retried quietly.
//! * On a clean stop the label is removed from this node (bounded by [`SHUTDOWN_LIMIT`]).
//!   On hand-over the new holder labels itself and the old one removes its own, so for a
//!   moment both or neither may carry it.
//!
//! [`NodeLabels`] is the one trait every access to the Node goes through;
//! [`KubeNodeLabels`] implements it with a GET and a JSON merge patch of
//! `metadata.labels` (RBAC: `get` and `patch` on nodes, granted with
//! `--enableNodeLabeling`), tests use a fake.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::election::{Backoff, LeaderState};
use crate::obs::logging::RepeatLimiter;

/// The label key (kube-vip's `kubevip.HasIP`).
pub const HAS_IP: &str = "kube-vip.io/has-ip";

/// Re-check of a label that matched (someone may have changed it): 60 s.
pub(crate) const RESYNC: Duration = Duration::from_secs(60);

/// First delay after a failed check or write; doubles up to [`BACKOFF_MAX`].
pub(crate) const BACKOFF_BASE: Duration = Duration::from_secs(1);

/// Largest delay between retries (16 s): a Node registered late is labelled within it.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(16);

/// Timeout of each Node API call: 5 s.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the removal at a clean stop may take (1 s; it runs while the VIPs are
/// dropped and the lease released, so it does not lengthen the stop).
pub(crate) const SHUTDOWN_LIMIT: Duration = Duration::from_secs(1);

/// The label value for `addr`, spelled like kube-vip (`utils.SanitizeIPForLabel`): an IPv4
/// address in dotted decimal, an IPv6 address as the 32 lowercase hex digits of its 16
/// bytes (`2001:db8::10` -> `20010db8000000000000000000000010`).
pub fn has_ip_value(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => v6.octets().iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// What this node's Node object shows, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLabel {
    /// There is no Node object of this name (yet).
    NoNode,
    /// The Node exists without [`HAS_IP`].
    Absent,
    /// The Node carries [`HAS_IP`] with this value.
    Value(String),
}

/// What to do to make the label match leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LabelStep {
    /// It matches.
    InPlace,
    /// Set [`HAS_IP`] to this value.
    Set(String),
    /// Remove [`HAS_IP`].
    Remove,
    /// Leading, but there is no Node object to label: check again later.
    WaitForNode,
}

/// The step that makes the label match: while `leading`, [`HAS_IP`]`=want`; otherwise no
/// [`HAS_IP`] at all, whatever its value (a stale one from an earlier run or an earlier
/// `address` included). Pure.
pub(crate) fn label_step(leading: bool, want: &str, seen: &NodeLabel) -> LabelStep {
    match (leading, seen) {
        (true, NodeLabel::NoNode) => LabelStep::WaitForNode,
        (true, NodeLabel::Value(v)) if v == want => LabelStep::InPlace,
        (true, _) => LabelStep::Set(want.to_string()),
        (false, NodeLabel::Value(_)) => LabelStep::Remove,
        (false, _) => LabelStep::InPlace,
    }
}

/// A failed Node API call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// The call did not finish within [`CALL_TIMEOUT`].
    #[error("node {node}: {op} timed out after {timeout_ms} ms")]
    Timeout {
        /// The Node's name.
        node: String,
        /// `get` or `patch`.
        op: &'static str,
        /// The timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// Any other API or transport failure (for API errors: HTTP status, reason, message).
    #[error("node {node}: {op} failed: {message}")]
    Api {
        /// The Node's name.
        node: String,
        /// `get` or `patch`.
        op: &'static str,
        /// What went wrong (e.g. `403 Forbidden: ... cannot patch resource "nodes" ...`).
        message: String,
    },
}

/// Access to this node's [`HAS_IP`] label. Implementations do no retries; [`run`] does.
pub trait NodeLabels: Send + Sync + 'static {
    /// The Node's name, for logs and errors.
    fn node(&self) -> &str;
    /// Reads the Node's label.
    fn get(&self) -> impl Future<Output = Result<NodeLabel, LabelError>> + Send;
    /// Sets the label to `value` (`Some`) or removes it (`None`). A Node that does not
    /// exist is `Ok(NodeLabel::NoNode)`, otherwise the label as written.
    fn set(
        &self,
        value: Option<&str>,
    ) -> impl Future<Output = Result<NodeLabel, LabelError>> + Send;
}

/// [`NodeLabels`] through kube-rs: `GET /api/v1/nodes/<name>` and a JSON merge patch of
/// `metadata.labels` (`null` removes the key; a missing Node is never created).
pub(crate) struct KubeNodeLabels {
    api: Api<Node>,
    node: String,
}

impl KubeNodeLabels {
    /// The Node named `node` (`vip_nodename`).
    pub fn new(client: kube::Client, node: &str) -> Self {
        KubeNodeLabels {
            api: Api::all(client),
            node: node.to_string(),
        }
    }

    fn err(&self, op: &'static str, e: kube::Error) -> LabelError {
        let message = match &e {
            kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
            other => other.to_string(),
        };
        LabelError::Api {
            node: self.node.clone(),
            op,
            message,
        }
    }

    fn timeout(&self, op: &'static str) -> LabelError {
        LabelError::Timeout {
            node: self.node.clone(),
            op,
            timeout_ms: CALL_TIMEOUT.as_millis() as u64,
        }
    }
}

/// The [`HAS_IP`] label of `node`, when it is a Node.
fn seen_on(node: Option<Node>) -> NodeLabel {
    match node {
        None => NodeLabel::NoNode,
        Some(n) => match n.metadata.labels.and_then(|mut l| l.remove(HAS_IP)) {
            Some(v) => NodeLabel::Value(v),
            None => NodeLabel::Absent,
        },
    }
}

impl NodeLabels for KubeNodeLabels {
    fn node(&self) -> &str {
        &self.node
    }

    async fn get(&self) -> Result<NodeLabel, LabelError> {
        match timeout(CALL_TIMEOUT, Box::pin(self.api.get_opt(&self.node))).await {
            Ok(Ok(n)) => Ok(seen_on(n)),
            Ok(Err(e)) => Err(self.err("get", e)),
            Err(_) => Err(self.timeout("get")),
        }
    }

    async fn set(&self, value: Option<&str>) -> Result<NodeLabel, LabelError> {
        let patch = json!({ "metadata": { "labels": { HAS_IP: value } } });
        let pp = PatchParams::default();
        let patch = Patch::Merge(&patch);
        match timeout(
            CALL_TIMEOUT,
            Box::pin(self.api.patch(&self.node, &pp, &patch)),
        )
        .await
        {
            Ok(Ok(n)) => Ok(seen_on(Some(n))),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(NodeLabel::NoNode),
            Ok(Err(e)) => Err(self.err("patch", e)),
            Err(_) => Err(self.timeout("patch")),
        }
    }
}

/// One check: read the label, take the [`label_step`], write when needed. Returns the
/// step taken.
async fn reconcile<L: NodeLabels>(
    labels: &L,
    leading: bool,
    want: &str,
) -> Result<LabelStep, LabelError> {
    let seen = labels.get().await?;
    let step = label_step(leading, want, &seen);
    let wrote = match &step {
        LabelStep::Set(v) => labels.set(Some(v)).await?,
        LabelStep::Remove => labels.set(None).await?,
        LabelStep::InPlace | LabelStep::WaitForNode => return Ok(step),
    };
    // Deleted between the read and the write.
    if wrote == NodeLabel::NoNode && leading {
        return Ok(LabelStep::WaitForNode);
    }
    Ok(step)
}

fn leading(state: &LeaderState) -> bool {
    matches!(state, LeaderState::Leading { .. })
}

/// Keeps this node's [`HAS_IP`] label equal to `value` while `state` says it leads and
/// absent otherwise (see the module docs), until `stop`; then removes it (within
/// [`SHUTDOWN_LIMIT`]).
pub(crate) async fn run<L: NodeLabels>(
    labels: L,
    value: String,
    mut state: watch::Receiver<LeaderState>,
    stop: CancellationToken,
) {
    let mut is_leading = leading(&state.borrow_and_update());
    let mut state_open = true;
    let mut next = Instant::now();
    let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_MAX);
    let mut no_node_logged = false;
    let mut quiet: RepeatLimiter<(), String> = RepeatLimiter::default();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            changed = state.changed(), if state_open => {
                let now = match changed {
                    Ok(()) => leading(&state.borrow_and_update()),
                    // The elector is gone: it leads nothing.
                    Err(_) => {
                        state_open = false;
                        false
                    }
                };
                if now != is_leading {
                    is_leading = now;
                    next = Instant::now();
                    backoff.reset();
                }
                continue;
            }
            _ = sleep_until(next) => {}
        }
        let res = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = reconcile(&labels, is_leading, &value) => r,
        };
        match res {
            Ok(LabelStep::WaitForNode) => {
                let delay = backoff.next_delay();
                if !no_node_logged {
                    no_node_logged = true;
                    info!(node = %labels.node(), label = HAS_IP, "no Node object of this name yet; it is labelled once it exists");
                } else {
                    debug!(node = %labels.node(), retry_ms = delay.as_millis() as u64, "still no Node object of this name");
                }
                next = Instant::now() + delay;
            }
            Ok(step) => {
                if let Some(r) = quiet.clear(&(), Instant::now()) {
                    info!(node = %labels.node(), "node label can be written again{r}");
                }
                match step {
                    LabelStep::Set(v) => {
                        info!(node = %labels.node(), label = %format!("{HAS_IP}={v}"), "labelled this node as the control-plane VIP's holder")
                    }
                    LabelStep::Remove => {
                        info!(node = %labels.node(), label = HAS_IP, "removed the label from this node (not the control-plane VIP's holder)")
                    }
                    _ => debug!(node = %labels.node(), leading = is_leading, "node label in place"),
                }
                no_node_logged = false;
                backoff.reset();
                next = Instant::now() + RESYNC;
            }
            Err(e) => {
                if let Some(r) = quiet.observe((), e.to_string(), Instant::now()) {
                    warn!(error = %e, label = HAS_IP, leading = is_leading, "cannot update this node's label; retrying{r}");
                }
                next = Instant::now() + backoff.next_delay();
            }
        }
    }
    match timeout(SHUTDOWN_LIMIT, reconcile(&labels, false, &value)).await {
        Ok(Ok(LabelStep::Remove)) => {
            info!(node = %labels.node(), label = HAS_IP, "removed the label from this node (stopping)")
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            warn!(error = %e, label = HAS_IP, "could not remove the label from this node at stop")
        }
        Err(_) => warn!(
            node = %labels.node(),
            label = HAS_IP,
            limit_ms = SHUTDOWN_LIMIT.as_millis() as u64,
            "removing the label from this node at stop timed out"
        ),
    }
}

#[cfg(test)]
mod tests;
