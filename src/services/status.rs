//! What the holder of a Service's addresses writes back, only when it changes:
//! `status.loadBalancer.ingress`, the `kube-vip.io/vipHost` annotation and Events (also
//! Events about a Lease: [`KubeStatusWriter::lease_event`], e.g. a duplicate identity).
//!
//! - [`desired_ingress`] / [`ingress_differs`] / [`event_name`] are pure.
//! - Event names are deterministic ([`event_name`]): the same Event written by several
//!   nodes or again after a restart is one object (409 AlreadyExists counts as written).
//! - [`StatusWriter`] is the seam the orchestration talks to; [`KubeStatusWriter`] is the
//!   kube-rs implementation, [`MemoryStatusWriter`] an in-memory one for unit tests.
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

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Event as CoreEvent, EventSource, LoadBalancerIngress, ObjectReference, PortStatus, Service,
};
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::manifest::rbac::{EventApi, discover_event_api};

use super::model::{ANN_VIP_HOST, ParsedAddresses, PortProto, ServiceKey, SkipReason};

/// Time limit of every single API request the [`KubeStatusWriter`] makes (2 s).
pub const API_TIMEOUT: Duration = Duration::from_secs(2);
/// `reportingController` of vipd's Events (events.k8s.io/v1).
pub const REPORTING_CONTROLLER: &str = "vipd";
/// Longest Event note the API accepts (events.k8s.io/v1: 1 kB); longer notes are cut.
pub const MAX_NOTE_BYTES: usize = 1024;
/// How long an identical Event is folded into a series instead of creating a new one
/// (6 minutes, client-go's and kube-rs's value).
pub const EVENT_SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// A failed Event write is logged at warn once per (reason, HTTP status) in this window
/// (60 s); the next line after it gives the number of failures not logged meanwhile.
pub const EVENT_FAILURE_LOG_WINDOW: Duration = Duration::from_secs(60);

/// The ingress entries for the announced `addresses`: one per address, in the order given
/// (the first configured address first), each with every Service port (`port`,
/// `protocol`), as kube-vip writes them.
pub fn desired_ingress(addresses: &[IpAddr], ports: &[PortProto]) -> Vec<LoadBalancerIngress> {
    let ports: Vec<PortStatus> = ports
        .iter()
        .map(|p| PortStatus {
            port: p.port,
            protocol: p.protocol.clone(),
            error: None,
        })
        .collect();
    addresses
        .iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip.to_string()),
            ports: (!ports.is_empty()).then(|| ports.clone()),
            ..Default::default()
        })
        .collect()
}

/// The Service's current `status.loadBalancer.ingress` differs from `desired`, comparing
/// per entry, in order: `ip`, `hostname` and the (port, protocol) list. Fields vipd does
/// not write (`ipMode`, which newer servers default to `VIP`, and `ports[].error`) are
/// ignored, so a server-side default does not cause endless rewrites. No ingress and an
/// empty list are the same.
pub fn ingress_differs(current: &Service, desired: &[LoadBalancerIngress]) -> bool {
    ingress_differs_with(current, desired, true)
}

/// [`ingress_differs`], optionally ignoring `ports` (for servers that drop them).
pub fn ingress_differs_with(
    current: &Service,
    desired: &[LoadBalancerIngress],
    compare_ports: bool,
) -> bool {
    let cur = current_ingress(current);
    cur.len() != desired.len()
        || cur
            .iter()
            .zip(desired)
            .any(|(a, b)| !same_entry(a, b, compare_ports))
}

fn current_ingress(svc: &Service) -> &[LoadBalancerIngress] {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default()
}

fn same_entry(a: &LoadBalancerIngress, b: &LoadBalancerIngress, compare_ports: bool) -> bool {
    let ports = |e: &LoadBalancerIngress| -> Vec<(i32, String)> {
        e.ports
            .iter()
            .flatten()
            .map(|p| (p.port, p.protocol.clone()))
            .collect()
    };
    a.ip == b.ip && a.hostname == b.hostname && (!compare_ports || ports(a) == ports(b))
}

/// The `kube-vip.io/vipHost` annotation of a Service.
pub fn vip_host_of(svc: &Service) -> Option<&str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_VIP_HOST))
        .map(String::as_str)
}

/// Event severity (events.k8s.io/v1 `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `Normal`: an address was announced by a node or moved.
    Normal,
    /// `Warning`: rejected input, conflicts, unsupported requests.
    Warning,
}

impl EventKind {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Normal => "Normal",
            EventKind::Warning => "Warning",
        }
    }
}

/// Reason of [`ServiceEvent::announced`].
pub const REASON_ANNOUNCED: &str = "AddressAnnounced";
/// Reason of [`ServiceEvent::invalid_address`].
pub const REASON_INVALID_ADDRESS: &str = "InvalidAddress";
/// Reason of [`ServiceEvent::address_conflict`].
pub const REASON_ADDRESS_CONFLICT: &str = "AddressConflict";
/// Reason of [`ServiceEvent::address_in_use`].
pub const REASON_ADDRESS_IN_USE: &str = "AddressInUse";
/// Reason of [`ServiceEvent::dhcp_not_enabled`].
pub const REASON_DHCP_NOT_ENABLED: &str = "DHCPNotEnabled";
/// Reason of [`ServiceEvent::invalid_config`].
pub const REASON_INVALID_CONFIG: &str = "InvalidConfiguration";
/// Reason of [`ServiceEvent::duplicate_identity`].
pub const REASON_DUPLICATE_IDENTITY: &str = "DuplicateIdentity";
/// Reason of a Warning about a Service address that is the control-plane VIP (refused:
/// the control-plane lease governs that address, and no Service group announces it).
pub const REASON_CONTROL_PLANE_ADDRESS: &str = "ControlPlaneAddress";
/// Reason of a Warning about a Service address that is the network or broadcast address of
/// a subnet connected to the node or of the VIP's own prefix (`vip_subnet`); see
/// [`crate::net::subnet_edge_of`].
pub const REASON_UNUSABLE_ADDRESS: &str = "UnusableAddress";
/// Reason of a Warning about an `externalTrafficPolicy: Local` Service with no ready
/// endpoint on any node: announced nowhere, its status and `vipHost` are cleared.
pub const REASON_NO_LOCAL_ENDPOINT: &str = "NoLocalEndpoint";
/// Reason of a Warning about a Service address that is a node's own address.
pub const REASON_ADDRESS_OF_NODE: &str = "AddressOfNode";
/// Reason of the log line (no Event) about a Service without any address.
pub const REASON_NO_ADDRESS: &str = "NoAddress";

/// One Event about a Service (or a Lease): events.k8s.io/v1 `type`, `reason`, `action` (both
/// PascalCase, at most 128 characters) and `note` (human text, cut to
/// [`MAX_NOTE_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceEvent {
    /// Normal or Warning.
    pub kind: EventKind,
    /// Why (e.g. [`REASON_ANNOUNCED`]).
    pub reason: String,
    /// What vipd did or failed to do (e.g. `Announce`).
    pub action: String,
    /// The message shown by `kubectl describe`.
    pub note: String,
    /// What distinguishes this occurrence from an identical earlier one that is a separate
    /// change (e.g. the Service's resourceVersion when a move was seen); empty for most
    /// Events. Part of the Event's name ([`event_name`]), never shown.
    pub change: String,
}

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
    pub fn with_change(self, change: impl Into<String>) -> Self {
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

    /// Warning naming every rejected value, or `None` when nothing was rejected.
    pub fn invalid_address(parsed: &ParsedAddresses) -> Option<Self> {
        Some(ServiceEvent {
            kind: EventKind::Warning,
            reason: REASON_INVALID_ADDRESS.into(),
            action: "ParseAddress".into(),
            note: parsed.rejection_message()?,
            change: String::new(),
        })
    }

    /// Warning: `address` `port` is already served by Service `other` (S07), so this
    /// Service is not announced on it.
    pub fn address_conflict(address: IpAddr, port: &PortProto, other: &ServiceKey) -> Self {
        ServiceEvent {
            kind: EventKind::Warning,
            reason: REASON_ADDRESS_CONFLICT.into(),
            action: "Announce".into(),
            note: format!(
                "{address} port {}/{} is already used by Service {other}; not announced",
                port.port, port.protocol
            ),
            change: String::new(),
        }
    }

    /// Warning: `node` holds the Service's lease, but another host (`other_mac`, as
    /// `aa:bb:cc:dd:ee:ff`) answers ARP / neighbour discovery for `address` (RFC 5227
    /// conflict), so `node` does not announce it and probes again with back-off.
    pub fn address_in_use(address: IpAddr, other_mac: &str, node: &str) -> Self {
        ServiceEvent {
            kind: EventKind::Warning,
            reason: REASON_ADDRESS_IN_USE.into(),
            action: "Announce".into(),
            note: format!(
                "{address} is already answered by another host (MAC {other_mac}); node {node} \
                 holds the lease but does not announce it, and probes again with back-off \
                 until the address is free"
            ),
            change: String::new(),
        }
    }

    /// Warning: the Service asks for a DHCP address (`0.0.0.0` / `::`) but `dhcp_mode` is
    /// off.
    pub fn dhcp_not_enabled() -> Self {
        ServiceEvent {
            kind: EventKind::Warning,
            reason: REASON_DHCP_NOT_ENABLED.into(),
            action: "Announce".into(),
            note: "address 0.0.0.0 / :: asks for DHCP, but DHCP mode is not enabled \
                   (dhcp_mode); not announced"
                .into(),
            change: String::new(),
        }
    }

    /// Warning: another process writes lease `lease` (`namespace/name`) under this node's
    /// identity `identity`, so this node does not hold the lease or its addresses while the
    /// other one renews it.
    pub fn duplicate_identity(identity: &str, lease: &str) -> Self {
        ServiceEvent {
            kind: EventKind::Warning,
            reason: REASON_DUPLICATE_IDENTITY.into(),
            action: "LeaderElection".into(),
            note: format!(
                "another vipd process writes lease {lease} under this node's identity \
                 {identity}; node names (vip_nodename) must be unique. This process does not \
                 hold the lease or its addresses while the other one renews it"
            ),
            change: String::new(),
        }
    }

    /// Warning for a skip the user should fix ([`SkipReason::warrants_warning`]).
    pub fn invalid_config(reason: &SkipReason) -> Self {
        ServiceEvent {
            kind: EventKind::Warning,
            reason: REASON_INVALID_CONFIG.into(),
            action: "Announce".into(),
            note: format!("not announced: {reason}"),
            change: String::new(),
        }
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

/// A failed write, naming the object (a Service, or a Lease for
/// [`KubeStatusWriter::lease_event`]) and the operation.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The API answered with an error or the connection failed.
    #[error("{kind} {key}: {op}: {source}")]
    Api {
        /// `Service` or `Lease`.
        kind: &'static str,
        /// The object's namespace and name.
        key: ServiceKey,
        /// What was attempted (e.g. `patch status.loadBalancer.ingress`).
        op: &'static str,
        /// The kube-rs error.
        #[source]
        source: kube::Error,
    },
    /// No answer within [`API_TIMEOUT`].
    #[error("{kind} {key}: {op}: no answer within {after:?}")]
    Timeout {
        /// `Service` or `Lease`.
        kind: &'static str,
        /// The object's namespace and name.
        key: ServiceKey,
        /// What was attempted.
        op: &'static str,
        /// The limit ([`API_TIMEOUT`]).
        after: Duration,
    },
}

impl StatusError {
    /// The HTTP status code of an API error (e.g. 403 for missing RBAC).
    pub fn api_code(&self) -> Option<u16> {
        match self {
            StatusError::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }

    /// The API said 404.
    pub fn is_not_found(&self) -> bool {
        self.api_code() == Some(404)
    }
}

/// Writes what the holder reports about a Service. Every method writes only when
/// something changes.
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

    /// Sets annotation `kube-vip.io/vipHost` to `node`.
    ///
    /// # Errors
    /// [`StatusError`] naming the Service and the operation.
    fn set_vip_host(
        &self,
        key: &ServiceKey,
        node: &str,
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
    /// Repeats of an identical Event by this process within [`EVENT_SERIES_WINDOW`] update
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

/// Cuts `note` to at most [`MAX_NOTE_BYTES`] bytes on a character boundary, marking the
/// cut with `…`.
pub fn truncate_note(note: &str) -> String {
    if note.len() <= MAX_NOTE_BYTES {
        return note.to_string();
    }
    let mut end = MAX_NOTE_BYTES - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end])
}

/// The name of the Event `ev` about object `object` (a Service or Lease name) with uid
/// `uid`: `<object>.<16 hex digits>`, the digits the first 8 bytes of the SHA-256 of uid,
/// type, reason, note and change id. Deterministic, so the same Event written by another
/// node, or again after a restart, has the same name: the API server answers 409
/// AlreadyExists and keeps exactly one (the writer treats that as success). A valid Event
/// name (DNS-1123 subdomain, at most 253 characters) for any valid object name: the object
/// part is cut to 236 characters, with a trailing `.` or `-` removed.
pub fn event_name(object: &str, uid: Option<&str>, ev: &ServiceEvent) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [
        uid.unwrap_or_default(),
        ev.kind.as_str(),
        &ev.reason,
        &ev.note,
        &ev.change,
    ] {
        ctx.update(part.as_bytes());
        ctx.update(&[0]);
    }
    let digest = ctx.finish();
    let hex: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut end = object.len().min(236);
    while !object.is_char_boundary(end) {
        end -= 1;
    }
    let prefix = object[..end].trim_end_matches(['.', '-']);
    format!("{prefix}.{hex}")
}

/// Identity of an Event for folding repeats: everything that shows, including the note
/// (kube-rs's `Recorder` folds on reason/action only and would keep showing an old note,
/// e.g. an earlier rejected value; that is why vipd writes Events itself).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventIdentity {
    regarding: Regarding,
    key: ServiceKey,
    uid: Option<String>,
    event: ServiceEvent,
}

/// The kind of object an Event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Regarding {
    /// A core v1 Service.
    Service,
    /// A coordination.k8s.io/v1 Lease.
    Lease,
}

impl Regarding {
    fn kind(self) -> &'static str {
        match self {
            Regarding::Service => "Service",
            Regarding::Lease => "Lease",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Regarding::Service => "v1",
            Regarding::Lease => "coordination.k8s.io/v1",
        }
    }
}

/// (Event reason, HTTP status of the failure) for rate-limiting failure logs.
type FailureKey = (String, Option<u16>);

#[derive(Debug, Clone)]
struct SeriesState {
    name: String,
    count: i32,
    last_seen: Instant,
}

/// [`StatusWriter`] through kube-rs: status with a merge patch on the `status`
/// subresource, the annotation with a merge patch on `metadata.annotations`, Events as
/// events.k8s.io/v1 objects where the server serves them, else as core v1 Events (decided
/// once, by API discovery before the first Event: [`KubeStatusWriter::event_api`]);
/// `reportingController` / `source.component` [`REPORTING_CONTROLLER`],
/// `reportingInstance` / `source.host` the node name. Each request is limited to
/// [`API_TIMEOUT`].
///
/// Every write first reads the Service (one GET) and skips the write when nothing would
/// change. A failed Event write is logged at warn with the object, reason and HTTP status,
/// once per (reason, status) per [`EVENT_FAILURE_LOG_WINDOW`]. RBAC: the rows of
/// [`crate::manifest::rbac::API_CALLS`] with call sites in this file.
#[derive(Clone)]
pub struct KubeStatusWriter {
    client: kube::Client,
    node: String,
    /// The server dropped `ingress[].ports` once: compare without ports from then on.
    ports_dropped: Arc<AtomicBool>,
    series: Arc<Mutex<HashMap<EventIdentity, SeriesState>>>,
    /// The Event API, once discovered (shared with clones).
    event_api: Arc<tokio::sync::OnceCell<EventApi>>,
    /// Event write failures by (reason, HTTP status): when last logged, and how many were
    /// not logged since.
    event_failures: Arc<Mutex<HashMap<FailureKey, (Instant, u32)>>>,
}

impl KubeStatusWriter {
    /// A writer reporting as `node` (the Event `reportingInstance`, max 128 characters).
    pub fn new(client: kube::Client, node: &str) -> Self {
        KubeStatusWriter {
            client,
            node: node.to_string(),
            ports_dropped: Arc::new(AtomicBool::new(false)),
            series: Arc::new(Mutex::new(HashMap::new())),
            event_api: Arc::new(tokio::sync::OnceCell::new()),
            event_failures: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A writer that uses `api` for Events without asking the server (tests, or a caller
    /// that already knows).
    pub fn with_event_api(self, api: EventApi) -> Self {
        KubeStatusWriter {
            event_api: Arc::new(tokio::sync::OnceCell::new_with(Some(api))),
            ..self
        }
    }

    /// The Event API this writer posts to: events.k8s.io/v1 where the server serves it,
    /// core v1 otherwise ([`discover_event_api`]), asked once and then kept (a failed
    /// discovery is asked again on the next Event).
    ///
    /// # Errors
    /// [`StatusError`] about `key` (the object of the Event being written) when discovery
    /// fails or times out.
    pub async fn event_api(
        &self,
        kind: &'static str,
        key: &ServiceKey,
    ) -> Result<EventApi, StatusError> {
        self.event_api
            .get_or_try_init(|| async {
                let api = timed_as(
                    kind,
                    key,
                    "discover the Event API",
                    discover_event_api(&self.client),
                )
                .await?;
                match api {
                    EventApi::EventsV1 => tracing::info!("writing Events through events.k8s.io/v1"),
                    EventApi::Core => tracing::info!(
                        "events.k8s.io/v1 not served; writing Events through core v1"
                    ),
                }
                Ok(api)
            })
            .await
            .copied()
    }

    /// Logs a failed Event write at warn, once per (reason, HTTP status) per
    /// [`EVENT_FAILURE_LOG_WINDOW`], with the count of failures not logged since.
    fn log_event_failure(&self, ev: &ServiceEvent, err: &StatusError) {
        let code = err.api_code();
        let now = Instant::now();
        let suppressed = {
            let mut map = self
                .event_failures
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let entry = map
                .entry((ev.reason.clone(), code))
                .or_insert((now - EVENT_FAILURE_LOG_WINDOW - Duration::from_secs(1), 0));
            if entry.0 + EVENT_FAILURE_LOG_WINDOW > now {
                entry.1 += 1;
                return;
            }
            let n = entry.1;
            *entry = (now, 0);
            n
        };
        let status = code.map_or_else(|| "none".to_string(), |c| c.to_string());
        let hint = match code {
            Some(403) => {
                "; RBAC: allow create and patch on events (both events.k8s.io and core: \
                 vipd manifest rbac), check with vipd preflight"
            }
            _ => "",
        };
        tracing::warn!(
            reason = %ev.reason,
            http_status = %status,
            suppressed,
            "cannot record Event: {err}{hint}"
        );
    }

    /// The server was seen dropping `status.loadBalancer.ingress[].ports` (pre-1.24
    /// without the `MixedProtocolLBService` gate).
    pub fn server_drops_ingress_ports(&self) -> bool {
        self.ports_dropped.load(Ordering::Relaxed)
    }

    fn services(&self, key: &ServiceKey) -> Api<Service> {
        Api::namespaced(self.client.clone(), &key.namespace)
    }

    /// The Service, or `None` on 404.
    async fn get(&self, key: &ServiceKey) -> Result<Option<Service>, StatusError> {
        let api = self.services(key);
        match timed(key, "get Service", api.get(&key.name)).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn patch_ingress(
        &self,
        key: &ServiceKey,
        ingress: &[LoadBalancerIngress],
    ) -> Result<Option<Service>, StatusError> {
        let value = if ingress.is_empty() {
            serde_json::Value::Null
        } else {
            json!(ingress)
        };
        let patch = json!({ "status": { "loadBalancer": { "ingress": value } } });
        let api = self.services(key);
        let pp = PatchParams::default();
        let patch = Patch::Merge(&patch);
        let fut = api.patch_status(&key.name, &pp, &patch);
        match timed(key, "patch status.loadBalancer.ingress", fut).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn patch_vip_host(
        &self,
        key: &ServiceKey,
        node: Option<&str>,
    ) -> Result<WriteOutcome, StatusError> {
        let patch = json!({ "metadata": { "annotations": { ANN_VIP_HOST: node } } });
        let api = self.services(key);
        let pp = PatchParams::default();
        let patch = Patch::Merge(&patch);
        let fut = api.patch(&key.name, &pp, &patch);
        match timed(key, "patch annotation kube-vip.io/vipHost", fut).await {
            Ok(_) => Ok(WriteOutcome::Written),
            Err(e) if e.is_not_found() => Ok(WriteOutcome::NotFound),
            Err(e) => Err(e),
        }
    }

    /// Notes a server that dropped the ports it was sent.
    fn learn_ports(&self, sent: &[LoadBalancerIngress], stored: &Service) {
        let sent_ports = sent
            .iter()
            .any(|e| e.ports.as_ref().is_some_and(|p| !p.is_empty()));
        let kept_ports = current_ingress(stored)
            .iter()
            .any(|e| e.ports.as_ref().is_some_and(|p| !p.is_empty()));
        if sent_ports && !kept_ports && !self.ports_dropped.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "the API server drops status.loadBalancer.ingress[].ports \
                 (Kubernetes < 1.24 without MixedProtocolLBService); comparing without ports"
            );
        }
    }

    /// Writes an Event about `key` (see [`Self::write_event_inner`]); failures are logged
    /// ([`Self::log_event_failure`]) and returned.
    async fn write_event(
        &self,
        regarding: Regarding,
        key: &ServiceKey,
        uid: Option<String>,
        ev: &ServiceEvent,
    ) -> Result<(), StatusError> {
        let r = self.write_event_inner(regarding, key, uid, ev).await;
        match &r {
            Ok(()) => tracing::debug!(object = %key, reason = %ev.reason, "Event recorded"),
            Err(e) => self.log_event_failure(ev, e),
        }
        r
    }

    /// Creates the Event, or folds a repeat into the first one's series (events.k8s.io) or
    /// count (core).
    async fn write_event_inner(
        &self,
        regarding: Regarding,
        key: &ServiceKey,
        uid: Option<String>,
        ev: &ServiceEvent,
    ) -> Result<(), StatusError> {
        let kind = regarding.kind();
        let api = self.event_api(kind, key).await?;
        let ident = EventIdentity {
            regarding,
            key: key.clone(),
            uid: uid.clone(),
            event: ev.clone(),
        };
        let now = Instant::now();
        let repeat = {
            let mut map = self.series.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, s| now.duration_since(s.last_seen) < EVENT_SERIES_WINDOW);
            map.get_mut(&ident).map(|s| {
                s.count += 1;
                s.last_seen = now;
                (s.name.clone(), s.count)
            })
        };
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &key.namespace);
        let core: Api<CoreEvent> = Api::namespaced(self.client.clone(), &key.namespace);
        if let Some((name, count)) = repeat {
            let pp = PatchParams::default();
            let patched = match api {
                EventApi::EventsV1 => {
                    let patch = json!({ "series": EventSeries {
                        count,
                        last_observed_time: MicroTime(Timestamp::now()),
                    }});
                    timed_as(
                        kind,
                        key,
                        "patch Event series",
                        events.patch(&name, &pp, &Patch::Merge(&patch)),
                    )
                    .await
                    .map(|_| ())
                }
                EventApi::Core => {
                    let patch = json!({ "count": count, "lastTimestamp": Time(Timestamp::now()) });
                    timed_as(
                        kind,
                        key,
                        "patch Event count",
                        core.patch(&name, &pp, &Patch::Merge(&patch)),
                    )
                    .await
                    .map(|_| ())
                }
            };
            match patched {
                Ok(_) => return Ok(()),
                // The Event was garbage-collected (TTL): start a new one below.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let now_ts = Timestamp::now();
        let name = event_name(&key.name, uid.as_deref(), ev);
        let reference = ObjectReference {
            api_version: Some(regarding.api_version().into()),
            kind: Some(kind.into()),
            namespace: Some(key.namespace.clone()),
            name: Some(key.name.clone()),
            uid,
            ..Default::default()
        };
        let meta = ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(key.namespace.clone()),
            ..Default::default()
        };
        if api == EventApi::Core {
            let obj = CoreEvent {
                metadata: meta,
                involved_object: reference,
                type_: Some(ev.kind.as_str().into()),
                reason: Some(ev.reason.clone()),
                action: Some(ev.action.clone()),
                message: Some(truncate_note(&ev.note)),
                count: Some(1),
                first_timestamp: Some(Time(now_ts)),
                last_timestamp: Some(Time(now_ts)),
                source: Some(EventSource {
                    component: Some(REPORTING_CONTROLLER.into()),
                    host: Some(self.node.clone()),
                }),
                reporting_component: Some(REPORTING_CONTROLLER.into()),
                reporting_instance: Some(self.node.clone()),
                ..Default::default()
            };
            let created = timed_as(
                kind,
                key,
                "create Event",
                core.create(&PostParams::default(), &obj),
            )
            .await;
            // 409 AlreadyExists: the same Event (same [`event_name`]) was written before, by
            // another node or before a restart; that is success, not an error.
            if let Err(e) = created
                && e.api_code() != Some(409)
            {
                return Err(e);
            }
            self.remember_series(ident, name, now);
            return Ok(());
        }
        let obj = K8sEvent {
            metadata: meta,
            event_time: Some(MicroTime(now_ts)),
            type_: Some(ev.kind.as_str().into()),
            reason: Some(ev.reason.clone()),
            action: Some(ev.action.clone()),
            note: Some(truncate_note(&ev.note)),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.node.clone()),
            regarding: Some(reference),
            ..Default::default()
        };
        let created = timed_as(
            kind,
            key,
            "create Event",
            events.create(&PostParams::default(), &obj),
        )
        .await;
        // 409 AlreadyExists: the same Event (same [`event_name`]) was written before, by
        // another node or before a restart; that is success, not an error.
        if let Err(e) = created
            && e.api_code() != Some(409)
        {
            return Err(e);
        }
        self.remember_series(ident, name, now);
        Ok(())
    }

    /// Remembers a created Event for folding its repeats.
    fn remember_series(&self, ident: EventIdentity, name: String, now: Instant) {
        let mut map = self.series.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(
            ident,
            SeriesState {
                name,
                count: 1,
                last_seen: now,
            },
        );
    }

    /// Records an Event about Lease `key` (its namespace and name), e.g. a duplicate
    /// identity found by the Lease's election. Reads the Lease for its uid (`kubectl
    /// describe lease` matches Events by it); a Lease that is gone gets no Event. Repeats
    /// fold into a series as for Services. RBAC: leases get, events create + patch.
    ///
    /// # Errors
    /// [`StatusError`] naming the Lease and the operation.
    pub async fn lease_event(
        &self,
        key: &ServiceKey,
        event: &ServiceEvent,
    ) -> Result<(), StatusError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
        let kind = Regarding::Lease.kind();
        let uid = match timed_as(kind, key, "get Lease", api.get(&key.name)).await {
            Ok(lease) => lease.metadata.uid,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        self.write_event(Regarding::Lease, key, uid, event).await
    }
}

/// Runs one API request about a Service with [`API_TIMEOUT`], mapping errors to
/// [`StatusError`].
async fn timed<T>(
    key: &ServiceKey,
    op: &'static str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, StatusError> {
    timed_as(Regarding::Service.kind(), key, op, fut).await
}

/// [`timed`] for an object of kind `kind`.
async fn timed_as<T>(
    kind: &'static str,
    key: &ServiceKey,
    op: &'static str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, StatusError> {
    match tokio::time::timeout(API_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(StatusError::Api {
            kind,
            key: key.clone(),
            op,
            source,
        }),
        Err(_) => Err(StatusError::Timeout {
            kind,
            key: key.clone(),
            op,
            after: API_TIMEOUT,
        }),
    }
}

impl StatusWriter for KubeStatusWriter {
    async fn set_ingress(
        &self,
        key: &ServiceKey,
        ingress: Vec<LoadBalancerIngress>,
    ) -> Result<WriteOutcome, StatusError> {
        let Some(current) = self.get(key).await? else {
            return Ok(WriteOutcome::NotFound);
        };
        let compare_ports = !self.server_drops_ingress_ports();
        if !ingress_differs_with(&current, &ingress, compare_ports) {
            return Ok(WriteOutcome::Unchanged);
        }
        match self.patch_ingress(key, &ingress).await? {
            Some(stored) => {
                self.learn_ports(&ingress, &stored);
                Ok(WriteOutcome::Written)
            }
            None => Ok(WriteOutcome::NotFound),
        }
    }

    async fn set_vip_host(
        &self,
        key: &ServiceKey,
        node: &str,
    ) -> Result<WriteOutcome, StatusError> {
        let Some(current) = self.get(key).await? else {
            return Ok(WriteOutcome::NotFound);
        };
        if vip_host_of(&current) == Some(node) {
            return Ok(WriteOutcome::Unchanged);
        }
        self.patch_vip_host(key, Some(node)).await
    }

    async fn clear(&self, key: &ServiceKey) -> Result<WriteOutcome, StatusError> {
        let Some(current) = self.get(key).await? else {
            return Ok(WriteOutcome::NotFound);
        };
        let mut outcome = WriteOutcome::Unchanged;
        if !current_ingress(&current).is_empty() {
            if self.patch_ingress(key, &[]).await?.is_none() {
                return Ok(WriteOutcome::NotFound);
            }
            outcome = WriteOutcome::Written;
        }
        if vip_host_of(&current).is_some() {
            outcome = self.patch_vip_host(key, None).await?;
        }
        Ok(outcome)
    }

    async fn event(
        &self,
        key: &ServiceKey,
        uid: Option<&str>,
        event: &ServiceEvent,
    ) -> Result<(), StatusError> {
        let uid = match uid {
            Some(u) => Some(u.to_string()),
            None => match self.get(key).await? {
                Some(svc) => svc.metadata.uid,
                // Gone: nothing to attach the Event to.
                None => return Ok(()),
            },
        };
        self.write_event(Regarding::Service, key, uid, event).await
    }
}

/// What a [`MemoryStatusWriter`] holds for one Service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryServiceStatus {
    /// `status.loadBalancer.ingress`.
    pub ingress: Vec<LoadBalancerIngress>,
    /// `kube-vip.io/vipHost`.
    pub vip_host: Option<String>,
    /// Events in order (identical repeats included).
    pub events: Vec<ServiceEvent>,
    /// Number of writes that changed something (ingress or annotation).
    pub writes: usize,
}

/// An in-memory [`StatusWriter`] for tests of the orchestration: same "only when it
/// changes" rule, no API. Services are created on first use (never [`WriteOutcome::NotFound`]).
#[derive(Debug, Clone, Default)]
pub struct MemoryStatusWriter {
    state: Arc<Mutex<HashMap<ServiceKey, MemoryServiceStatus>>>,
}

impl MemoryStatusWriter {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// What is recorded for `key` (default when nothing).
    pub fn get(&self, key: &ServiceKey) -> MemoryServiceStatus {
        self.lock().get(key).cloned().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ServiceKey, MemoryServiceStatus>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(
        &self,
        key: &ServiceKey,
        f: impl FnOnce(&mut MemoryServiceStatus) -> bool,
    ) -> WriteOutcome {
        let mut map = self.lock();
        let entry = map.entry(key.clone()).or_default();
        if f(entry) {
            entry.writes += 1;
            WriteOutcome::Written
        } else {
            WriteOutcome::Unchanged
        }
    }
}

impl StatusWriter for MemoryStatusWriter {
    async fn set_ingress(
        &self,
        key: &ServiceKey,
        ingress: Vec<LoadBalancerIngress>,
    ) -> Result<WriteOutcome, StatusError> {
        Ok(self.update(key, |s| {
            let changed = s.ingress != ingress;
            s.ingress = ingress;
            changed
        }))
    }

    async fn set_vip_host(
        &self,
        key: &ServiceKey,
        node: &str,
    ) -> Result<WriteOutcome, StatusError> {
        Ok(self.update(key, |s| {
            let changed = s.vip_host.as_deref() != Some(node);
            s.vip_host = Some(node.to_string());
            changed
        }))
    }

    async fn clear(&self, key: &ServiceKey) -> Result<WriteOutcome, StatusError> {
        Ok(self.update(key, |s| {
            let changed = !s.ingress.is_empty() || s.vip_host.is_some();
            s.ingress.clear();
            s.vip_host = None;
            changed
        }))
    }

    async fn event(
        &self,
        key: &ServiceKey,
        _uid: Option<&str>,
        event: &ServiceEvent,
    ) -> Result<(), StatusError> {
        self.lock()
            .entry(key.clone())
            .or_default()
            .events
            .push(event.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{LoadBalancerStatus, ServiceStatus};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn pp(port: i32, protocol: &str) -> PortProto {
        PortProto {
            port,
            protocol: protocol.into(),
        }
    }

    fn with_ingress(ingress: Option<Vec<LoadBalancerIngress>>) -> Service {
        Service {
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus { ingress }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn desired_one_entry_per_address_first_first() {
        let d = desired_ingress(
            &[ip("192.0.2.5"), ip("2001:db8::5")],
            &[pp(80, "TCP"), pp(53, "UDP")],
        );
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].ip.as_deref(), Some("192.0.2.5"));
        assert_eq!(d[1].ip.as_deref(), Some("2001:db8::5"));
        for e in &d {
            let ports: Vec<(i32, &str)> = e
                .ports
                .iter()
                .flatten()
                .map(|p| (p.port, p.protocol.as_str()))
                .collect();
            assert_eq!(ports, [(80, "TCP"), (53, "UDP")]);
            assert_eq!(e.hostname, None);
        }
        assert!(desired_ingress(&[], &[pp(80, "TCP")]).is_empty());
        assert_eq!(desired_ingress(&[ip("192.0.2.5")], &[])[0].ports, None);
    }

    #[test]
    fn differs_compares_ip_order_and_ports() {
        let d = desired_ingress(&[ip("192.0.2.5"), ip("192.0.2.6")], &[pp(80, "TCP")]);
        assert!(!ingress_differs(&with_ingress(Some(d.clone())), &d));
        // Missing status / empty list vs nothing desired.
        assert!(!ingress_differs(&Service::default(), &[]));
        assert!(!ingress_differs(&with_ingress(Some(vec![])), &[]));
        assert!(ingress_differs(&Service::default(), &d));
        // Order matters (first entry = first configured address).
        let rev = vec![d[1].clone(), d[0].clone()];
        assert!(ingress_differs(&with_ingress(Some(rev)), &d));
        // Changed port / protocol.
        let other = desired_ingress(&[ip("192.0.2.5"), ip("192.0.2.6")], &[pp(80, "UDP")]);
        assert!(ingress_differs(&with_ingress(Some(other.clone())), &d));
        assert!(!ingress_differs_with(&with_ingress(Some(other)), &d, false));
        // Server-side ipMode default and port errors are ignored.
        let mut server = d.clone();
        for e in &mut server {
            e.ip_mode = Some("VIP".into());
            for p in e.ports.iter_mut().flatten() {
                p.error = Some("x".into());
            }
        }
        assert!(!ingress_differs(&with_ingress(Some(server)), &d));
        // Ports dropped by an old server: differs with ports, equal without.
        let dropped: Vec<LoadBalancerIngress> = d
            .iter()
            .map(|e| LoadBalancerIngress {
                ports: None,
                ..e.clone()
            })
            .collect();
        assert!(ingress_differs(&with_ingress(Some(dropped.clone())), &d));
        assert!(!ingress_differs_with(
            &with_ingress(Some(dropped)),
            &d,
            false
        ));
    }

    #[test]
    fn note_is_cut_on_a_char_boundary() {
        let short = "x".repeat(MAX_NOTE_BYTES);
        assert_eq!(truncate_note(&short), short);
        let long = "é".repeat(MAX_NOTE_BYTES);
        let cut = truncate_note(&long);
        assert!(cut.len() <= MAX_NOTE_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn event_texts() {
        let e = ServiceEvent::announced("node-b", &[ip("192.0.2.5")], Some("node-a"));
        assert_eq!(e.kind, EventKind::Normal);
        assert_eq!(
            e.note,
            "192.0.2.5 announced by node node-b (moved from node-a)"
        );
        let e = ServiceEvent::announced("node-b", &[ip("192.0.2.5")], Some("node-b"));
        assert!(!e.note.contains("moved"));
        let e = ServiceEvent::address_conflict(
            ip("192.0.2.70"),
            &pp(80, "TCP"),
            &ServiceKey::new("default", "svc-a"),
        );
        assert_eq!(e.kind, EventKind::Warning);
        assert!(
            e.note.contains("default/svc-a") && e.note.contains("80/TCP"),
            "{}",
            e.note
        );
        let parsed = super::super::model::parse_address_list("192.0.2.300");
        let e = ServiceEvent::invalid_address(&parsed).unwrap();
        assert!(e.note.contains("\"192.0.2.300\""), "{}", e.note);
        assert!(ServiceEvent::invalid_address(&ParsedAddresses::default()).is_none());
        for e in [
            ServiceEvent::dhcp_not_enabled(),
            ServiceEvent::invalid_config(&SkipReason::LeaseNameWithLocalPolicy),
        ] {
            assert_eq!(e.kind, EventKind::Warning);
            assert!(e.reason.len() <= 128 && e.action.len() <= 128);
        }
    }

    #[test]
    fn event_names_are_deterministic_and_valid() {
        let ev = ServiceEvent::announced("node-a", &[ip("192.0.2.5")], None);
        let a = event_name("web", Some("uid-1"), &ev);
        assert_eq!(
            a,
            event_name("web", Some("uid-1"), &ev),
            "same inputs, same name"
        );
        assert!(a.starts_with("web.") && a.len() == "web.".len() + 16, "{a}");
        assert_ne!(
            a,
            event_name("web", Some("uid-2"), &ev),
            "a recreated Service"
        );
        assert_ne!(
            a,
            event_name("web", Some("uid-1"), &ev.clone().with_change("42")),
            "a separate change"
        );
        let other = ServiceEvent::announced("node-b", &[ip("192.0.2.5")], None);
        assert_ne!(a, event_name("web", Some("uid-1"), &other));
        let long = format!("{}-x", "a".repeat(250));
        let n = event_name(&long, None, &ev);
        assert!(n.len() <= 253, "{}", n.len());
        assert!(super::super::model::is_dns_subdomain(&n), "{n}");
        let dotted = format!("{}.b", "a".repeat(235));
        assert!(super::super::model::is_dns_subdomain(&event_name(
            &dotted, None, &ev
        )));
    }

    #[test]
    fn error_names_service_and_operation() {
        let e = StatusError::Timeout {
            kind: "Service",
            key: ServiceKey::new("default", "web"),
            op: "patch status.loadBalancer.ingress",
            after: API_TIMEOUT,
        };
        let s = e.to_string();
        assert!(
            s.starts_with("Service default/web") && s.contains("patch status"),
            "{s}"
        );
        assert!(!e.is_not_found());
    }

    #[tokio::test]
    async fn writer_learns_that_the_server_drops_ports() {
        // A client that is never used for a request (nothing listens there).
        let cfg = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let w = KubeStatusWriter::new(kube::Client::try_from(cfg).unwrap(), "node-a");
        let sent = desired_ingress(&[ip("192.0.2.5")], &[pp(80, "TCP")]);
        // Stored with ports: nothing learned.
        w.learn_ports(&sent, &with_ingress(Some(sent.clone())));
        assert!(!w.server_drops_ingress_ports());
        // Sent without ports: nothing to learn from.
        let bare = desired_ingress(&[ip("192.0.2.5")], &[]);
        w.learn_ports(&bare, &with_ingress(Some(bare.clone())));
        assert!(!w.server_drops_ingress_ports());
        // Stored without the ports that were sent: learned, shared with clones.
        let clone = w.clone();
        w.learn_ports(&sent, &with_ingress(Some(bare)));
        assert!(w.server_drops_ingress_ports() && clone.server_drops_ingress_ports());
    }

    #[tokio::test]
    async fn memory_writer_writes_only_changes() {
        let w = MemoryStatusWriter::new();
        let k = ServiceKey::new("default", "web");
        let d = desired_ingress(&[ip("192.0.2.5")], &[pp(80, "TCP")]);
        assert_eq!(
            w.set_ingress(&k, d.clone()).await.unwrap(),
            WriteOutcome::Written
        );
        assert_eq!(
            w.set_ingress(&k, d.clone()).await.unwrap(),
            WriteOutcome::Unchanged
        );
        assert_eq!(
            w.set_vip_host(&k, "node-a").await.unwrap(),
            WriteOutcome::Written
        );
        assert_eq!(
            w.set_vip_host(&k, "node-a").await.unwrap(),
            WriteOutcome::Unchanged
        );
        w.event(&k, None, &ServiceEvent::dhcp_not_enabled())
            .await
            .unwrap();
        let s = w.get(&k);
        assert_eq!(
            (s.ingress, s.vip_host.as_deref(), s.writes),
            (d, Some("node-a"), 2)
        );
        assert_eq!(s.events.len(), 1);
        assert_eq!(w.clear(&k).await.unwrap(), WriteOutcome::Written);
        assert_eq!(w.clear(&k).await.unwrap(), WriteOutcome::Unchanged);
        assert!(w.get(&k).ingress.is_empty());
    }
}
