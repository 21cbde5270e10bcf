//! What the holder of a Service's addresses writes back, only when it changes:
//! `status.loadBalancer.ingress`, the `kube-vip.io/vipHost` annotation and Events (also
//! its Events through a [`crate::kube::events::Recorder`]).
//!
//! - [`desired_ingress`] / [`ingress_differs`] / [`event_name`] are pure.
//! - Event names are deterministic ([`event_name`]): the same Event written by several
//!   nodes or again after a restart is one object (409 AlreadyExists counts as written).
//! - [`StatusWriter`] is the seam the orchestration talks to; [`KubeStatusWriter`] is the
//!   kube-rs implementation, `MemoryStatusWriter` an in-memory one for unit tests
//!   (`#[cfg(test)]` only).
//!
//! This file holds the vocabulary (Event kinds and reasons, [`ServiceEvent`], errors, the
//! [`StatusWriter`] seam); `ingress.rs` the pure ingress / `vipHost` comparisons,
//! `writer.rs` the Service reads and patches of [`KubeStatusWriter`], `events.rs` its
//! Events (names, notes, series, failure logs), `memory.rs` the test writer.
//!
//! # When to call [`StatusWriter::clear`]
//! kube-vip leaves the status and `vipHost` in place when a node stops holding a Service
//! (the next holder overwrites them). vipd does the same on a hand-over, but a Service
//! that is announced *nowhere* (externalTrafficPolicy Local with no ready endpoint,
//! all addresses rejected, an address conflict, `kube-vip.io/ignore` added, class changed)
//! would otherwise keep an ingress IP that does not answer, which misleads clients and
//! tools (`kubectl get svc` shows an EXTERNAL-IP). So: call `clear` when the Service is no
//! longer announced by any node, and only then (it is not the job of a node that merely
//! lost the lease). Deleted Services need no clearing.
//!
//! # Old API servers and `ingress[].ports`
//! `status.loadBalancer.ingress[].ports` exists since Kubernetes 1.20 but servers before
//! 1.24 drop it unless the `MixedProtocolLBService` feature gate is on. [`KubeStatusWriter`]
//! notices when the server dropped the ports it wrote and from then on compares without
//! ports, so it does not rewrite the status on every call.

use std::future::Future;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::LoadBalancerIngress;

use crate::services::plan::model::ServiceKey;

pub use crate::kube::events::EventKind;
use crate::services::plan::reasons::*;

/// One Event about a Service (or a Lease): see [`crate::kube::events::Event`].
pub type ServiceEvent = crate::kube::events::Event;
/// A failed write about a Service: see [`crate::kube::events::ApiError`].
pub type StatusError = crate::kube::events::ApiError;

mod ingress;
#[cfg(test)]
mod memory;
#[cfg(test)]
mod tests;
mod writer;

pub(crate) use ingress::current_ingress;
pub use ingress::{desired_ingress, ingress_differs, ingress_differs_with, vip_host_of};
#[cfg(test)]
pub use memory::{MemoryServiceStatus, MemoryStatusWriter};
pub use writer::{KubeStatusWriter, STATUS_CALLS_IN_FLIGHT, TAKEOVER_WAIT_LIMIT};

impl ServiceEvent {
    /// A Warning with `reason` (PascalCase) and `note`, action `Announce`.
    pub fn warning(reason: &str, note: String) -> Self {
        ServiceEvent {
            kind: EventKind::Warning,
            reason: reason.into(),
            action: "Announce".into(),
            note,
            change: String::new(),
        }
    }

    /// The same Event marked as a separate change `change` (see [`ServiceEvent::change`]).
    pub(crate) fn with_change(self, change: impl Into<String>) -> Self {
        ServiceEvent {
            change: change.into(),
            ..self
        }
    }

    /// Normal: `node` now announces `addresses` (`previous`: the node that did before, for
    /// a move).
    pub fn announced(node: &str, addresses: &[IpAddr], previous: Option<&str>) -> Self {
        let list: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        let moved = match previous {
            Some(p) if p != node => format!(" (moved from {p})"),
            _ => String::new(),
        };
        ServiceEvent {
            kind: EventKind::Normal,
            reason: REASON_ANNOUNCED.into(),
            action: "Announce".into(),
            note: format!("{} announced by node {node}{moved}", list.join(", ")),
            change: String::new(),
        }
    }

    /// Normal: `node`, which announced `before` for the Service, now announces `addresses`
    /// instead (a DHCP lease replaced after a NAK or a conflict, an edited address).
    pub(crate) fn readdressed(node: &str, addresses: &[IpAddr], before: &[IpAddr]) -> Self {
        let list = |a: &[IpAddr]| {
            let v: Vec<String> = a.iter().map(ToString::to_string).collect();
            v.join(", ")
        };
        ServiceEvent {
            note: format!(
                "{} announced by node {node} (was {})",
                list(addresses),
                list(before)
            ),
            ..Self::announced(node, addresses, None)
        }
    }

    /// Normal: `node` hands `addresses` over to another node because `why` (it is no
    /// longer eligible: drained, excluded, NotReady, ...): the VIPs are removed, then the
    /// lease is released. Each hand-over is a separate Event.
    pub(crate) fn handed_over(node: &str, addresses: &[IpAddr], why: &str) -> Self {
        let list: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        ServiceEvent {
            kind: EventKind::Normal,
            reason: REASON_HANDED_OVER.into(),
            action: "Release".into(),
            note: format!(
                "node {node} hands {} over to another node: {why}",
                list.join(", ")
            ),
            change: crate::election::record::now_micros().to_string(),
        }
    }

    /// Warning: `node` hands `addresses` over to another node because its data-path health
    /// check failed (`why` names the check, how often it failed and the last error, see
    /// [`crate::services::health`]): the VIPs are removed, then the lease is released. Each
    /// hand-over is a separate Event.
    pub(crate) fn health_handover(node: &str, addresses: &[IpAddr], why: &str) -> Self {
        ServiceEvent {
            kind: EventKind::Warning,
            reason: REASON_HEALTH_CHECK_FAILED.into(),
            ..Self::handed_over(node, addresses, why)
        }
    }

    /// Warning: `node` holds the Service's lease, but another host (`other_mac`, as
    /// `aa:bb:cc:dd:ee:ff`) answers ARP / neighbour discovery for `address` (RFC 5227
    /// conflict), so `node` does not announce it and probes again with back-off.
    pub(crate) fn address_in_use(address: IpAddr, other_mac: &str, node: &str) -> Self {
        Self::warning(
            REASON_ADDRESS_IN_USE,
            format!(
                "{address} is already answered by another host (MAC {other_mac}); node {node} \
                 holds the lease but does not announce it, and probes again with back-off \
                 until the address is free"
            ),
        )
    }

    /// Warning: the DHCP server leased `address` to the Service, but another host
    /// (`other_mac`) answers ARP / neighbour discovery for it (the RFC 5227 probe before
    /// use); `node`'s client declines it (DHCPDECLINE, RFC 2131 §4.4.1; DHCPv6 Decline, RFC
    /// 8415 §18.2.8) and asks for another address after the RFC's wait.
    pub(crate) fn dhcp_address_in_use(address: IpAddr, other_mac: &str, node: &str) -> Self {
        Self::warning(
            REASON_ADDRESS_IN_USE,
            format!(
                "{address}, leased by the DHCP server, is already answered by another host \
                 (MAC {other_mac}); node {node} declined it (DHCPDECLINE) and asks the server \
                 for another address"
            ),
        )
    }
}

/// What a write call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The object was changed.
    Written,
    /// Already as wanted; no write request was made.
    Unchanged,
    /// The Service does not exist (deleted meanwhile); nothing written.
    NotFound,
}

/// Writes what the holder reports about a Service. The caller decides from its cache what
/// differs (`crate::services::sync`'s `status_diff`) and calls only for that;
/// [`StatusWriter::set_ingress`] and [`StatusWriter::set_vip_host`] may write without
/// reading the Service first ([`KubeStatusWriter`] patches at once, and a patch the server
/// already has changes nothing there).
pub trait StatusWriter: Send + Sync {
    /// Sets `status.loadBalancer.ingress` to `ingress` (usually [`desired_ingress`]); an
    /// empty list removes it.
    ///
    /// # Errors
    /// [`StatusError`] naming the Service and the operation.
    fn set_ingress(
        &self,
        key: &ServiceKey,
        ingress: Vec<LoadBalancerIngress>,
    ) -> impl Future<Output = Result<WriteOutcome, StatusError>> + Send;

    /// Whether ingress comparisons ([`ingress_differs_with`]) should include
    /// `ingress[].ports`: `false` once the server was seen dropping them (Kubernetes before
    /// 1.24 without the `MixedProtocolLBService` gate; see the module docs), so a cache that
    /// holds the ingress as such a server stored it does not count as differing on every
    /// pass. `true` unless the writer learnt otherwise.
    fn compares_ports(&self) -> bool {
        true
    }

    /// Sets annotation `kube-vip.io/vipHost` to `node`.
    ///
    /// # Errors
    /// [`StatusError`] naming the Service and the operation.
    fn set_vip_host(
        &self,
        key: &ServiceKey,
        node: &str,
    ) -> impl Future<Output = Result<WriteOutcome, StatusError>> + Send;

    /// Sets each `(annotation, value)` of `annotations` on the Service (a merge patch of
    /// `metadata.annotations`; DHCP mode writes `kube-vip.io/hwaddr` and
    /// `kube-vip.io/requestedIP` with it). The caller sends only values that differ from
    /// its cache.
    ///
    /// # Errors
    /// [`StatusError`] naming the Service and the operation.
    fn set_annotations(
        &self,
        key: &ServiceKey,
        annotations: &[(&'static str, String)],
    ) -> impl Future<Output = Result<WriteOutcome, StatusError>> + Send;

    /// Removes the ingress and the `vipHost` annotation: only when the Service is announced
    /// by no node at all (see the module docs).
    ///
    /// # Errors
    /// [`StatusError`] naming the Service and the operation.
    fn clear(
        &self,
        key: &ServiceKey,
    ) -> impl Future<Output = Result<WriteOutcome, StatusError>> + Send;

    /// Records an Event on the Service. `uid` is the Service's `metadata.uid` when known
    /// (`kubectl describe` matches Events by it); when `None` the writer looks it up.
    /// Repeats of an identical Event by this process within [`crate::kube::events::EVENT_SERIES_WINDOW`] update
    /// the first one's series (count) instead of creating new objects; an identical Event
    /// already written by another node or before a restart (same [`event_name`]) is kept
    /// as it is and counts as written.
    ///
    /// # Errors
    /// [`StatusError`] naming the Service and the operation.
    fn event(
        &self,
        key: &ServiceKey,
        uid: Option<&str>,
        event: &ServiceEvent,
    ) -> impl Future<Output = Result<(), StatusError>> + Send;
}
