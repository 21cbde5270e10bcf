//! [`KubeStatusWriter`]: the [`StatusWriter`] through kube-rs (the Service reads and
//! patches; its Events are in `events.rs`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tracing::debug;

use crate::holder::takeovers::Takeovers;
use crate::kube::events::{Recorder, Regarding, timed_as};

use super::ingress::{current_ingress, vip_host_of};
use super::{ServiceEvent, StatusError, StatusWriter, WriteOutcome};
use crate::services::plan::model::{ANN_VIP_HOST, ServiceKey};

/// [`StatusWriter`] through kube-rs: status with a merge patch on the `status`
/// subresource, the annotation with a merge patch on `metadata.annotations`, Events as
/// events.k8s.io/v1 objects where the server serves them, else as core v1 Events (decided
/// once, by API discovery before the first Event: [`Recorder::event_api`]);
/// `reportingController` / `source.component` [`REPORTING_CONTROLLER`](crate::kube::events::REPORTING_CONTROLLER),
/// `reportingInstance` / `source.host` the node name. Each request is limited to
/// [`API_TIMEOUT`].
///
/// The caller decides from its cache what differs (`crate::services::sync`'s
/// `status_diff`): [`StatusWriter::set_ingress`] and [`StatusWriter::set_vip_host`] patch at
/// once, without reading the Service first (a patch the server already has is a no-op there:
/// the API server writes nothing and sends no watch event when the object does not change);
/// only the read-modify-write fallback (RBAC without `patch`) and [`StatusWriter::clear`]
/// read it first. A failed Event write is logged at warn with the object, reason and HTTP status,
/// once per (reason, status) per [`EVENT_FAILURE_LOG_WINDOW`](crate::kube::events::EVENT_FAILURE_LOG_WINDOW). RBAC: the rows of
/// [`crate::kube::api::API_CALLS`] with call sites in this file and in `src/kube/events.rs`.
#[derive(Clone)]
pub struct KubeStatusWriter {
    pub(super) client: kube::Client,
    /// The server dropped `ingress[].ports` once: compare without ports from then on.
    pub(super) ports_dropped: Arc<AtomicBool>,
    /// The server refused a merge patch of a Service with 403 once (RBAC granting `update`
    /// only, as kube-vip's chart ClusterRoles do): writes are read-modify-write PUTs from
    /// then on ([`crate::kube::api::Variant::UpdateFallback`]).
    patch_forbidden: Arc<AtomicBool>,
    /// The Events about its Services (and, through [`KubeStatusWriter::recorder`], other
    /// objects' Events that share its series).
    recorder: Recorder,
    /// Slots of the [`StatusWriter`] calls in flight at once in this process, shared by its
    /// clones (every group of the node): [`STATUS_CALLS_IN_FLIGHT`].
    slots: Arc<tokio::sync::Semaphore>,
    /// The node's takeovers in progress, which every call waits for
    /// ([`KubeStatusWriter::giving_way_to`]).
    takeovers: Arc<Takeovers>,
}

/// The longest a [`StatusWriter`] call waits for the node's takeovers
/// ([`KubeStatusWriter::giving_way_to`]): 10 s. A shard's 600 VIPs were in place 2-7 s
/// after its lease was taken in a loaded 10 000-Service power-off; a takeover that never
/// places its VIPs (all claimed by other hosts) holds the status back no longer than this.
pub const TAKEOVER_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// [`StatusWriter`] calls (each a patch, an Event, or a clear's read and patches) a process
/// keeps in flight at once, over all its groups: 4. After a cold start at 10 000 Services
/// (issue 28) every group wrote 8 at a time, 16 per node on the Services client: 30 000
/// status, vipHost and Event writes at once from three nodes kept the API server so busy that
/// shard lease renewals (on their own client) timed out and their holders stepped down.
/// The status is not urgent (the VIPs answer already); the renewals are.
pub const STATUS_CALLS_IN_FLIGHT: usize = 4;

impl KubeStatusWriter {
    /// A writer reporting as `node` (the Event `reportingInstance`, max 128 characters).
    pub fn new(client: kube::Client, node: &str) -> Self {
        KubeStatusWriter {
            recorder: Recorder::new(client.clone(), node),
            client,
            ports_dropped: Arc::new(AtomicBool::new(false)),
            patch_forbidden: Arc::new(AtomicBool::new(false)),
            slots: Arc::new(tokio::sync::Semaphore::new(STATUS_CALLS_IN_FLIGHT)),
            takeovers: Arc::default(),
        }
    }

    /// This writer, whose calls each wait first while the node is busy taking over VIPs
    /// ([`Takeovers::busy`]: a shard's hundreds, a mass failover), at most
    /// [`TAKEOVER_WAIT_LIMIT`] a call: the status and Events of Services whose VIPs answer
    /// already can wait, the adds of the VIPs that do not yet cannot. Without it the writer
    /// never waits.
    pub fn giving_way_to(self, takeovers: Arc<Takeovers>) -> Self {
        KubeStatusWriter { takeovers, ..self }
    }

    /// Waits while the node is busy taking over ([`Self::giving_way_to`]), then for one of
    /// the process's [`STATUS_CALLS_IN_FLIGHT`] slots (held until the
    /// permit is dropped; `None` only if the semaphore were closed, which it never is).
    async fn slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        if !self.takeovers.wait_not_busy(TAKEOVER_WAIT_LIMIT).await {
            debug!(
                vips = self.takeovers.in_progress(),
                "status write: the node's takeovers still run after the wait limit; writing"
            );
        }
        self.slots.acquire().await.ok()
    }

    /// The Event recorder this writer writes its Services' Events through.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
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

    /// Sets `status.loadBalancer.ingress` (a merge patch; under RBAC without `patch`, an
    /// update of `read`, the Service as the caller just read it, else read here). `None`:
    /// the Service is gone.
    async fn patch_ingress(
        &self,
        key: &ServiceKey,
        ingress: &[LoadBalancerIngress],
        read: Option<Service>,
    ) -> Result<Option<Service>, StatusError> {
        let value = if ingress.is_empty() {
            serde_json::Value::Null
        } else {
            json!(ingress)
        };
        if !self.patch_forbidden.load(Ordering::Relaxed) {
            let patch = json!({ "status": { "loadBalancer": { "ingress": value } } });
            let api = self.services(key);
            let pp = PatchParams::default();
            let patch = Patch::Merge(&patch);
            let fut = api.patch_status(&key.name, &pp, &patch);
            match timed(key, "patch status.loadBalancer.ingress", fut).await {
                Ok(s) => return Ok(Some(s)),
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) if e.rbac_denies("patch") => self.learn_patch_forbidden(&e),
                Err(e) => return Err(e),
            }
        }
        // Change what was read, write back with its resourceVersion (a 409 is retried by the
        // caller).
        let Some(mut svc) = self.read_unless(key, read).await? else {
            return Ok(None);
        };
        svc.status
            .get_or_insert_with(Default::default)
            .load_balancer
            .get_or_insert_with(Default::default)
            .ingress = (!ingress.is_empty()).then(|| ingress.to_vec());
        let api = self.services(key);
        let pp = PostParams::default();
        let fut = api.replace_status(&key.name, &pp, &svc);
        match timed(key, "update status.loadBalancer.ingress", fut).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(self.unlearn_if_update_denied(e)),
        }
    }

    /// Notes (at info, once per switch) that RBAC refuses merge patches of Services:
    /// writes become read-modify-write updates.
    fn learn_patch_forbidden(&self, e: &StatusError) {
        if !self.patch_forbidden.swap(true, Ordering::Relaxed) {
            tracing::info!(error = %e, "a merge patch of a Service was refused by RBAC (403): it grants update but not patch on services (as kube-vip's chart ClusterRoles do); writing Services with read-modify-write updates from now on (`vipd manifest rbac` grants patch)");
        }
    }

    /// After an update RBAC refuses (the RBAC changed, e.g. to `vipd manifest rbac`'s, which
    /// grants patch only), the next write tries a merge patch again. Returns `e`.
    fn unlearn_if_update_denied(&self, e: StatusError) -> StatusError {
        if e.rbac_denies("update") && self.patch_forbidden.swap(false, Ordering::Relaxed) {
            tracing::info!(error = %e, "an update of a Service was refused by RBAC (403): trying merge patches again");
        }
        e
    }

    /// `read`, else the Service as the API server has it now (`None`: gone).
    async fn read_unless(
        &self,
        key: &ServiceKey,
        read: Option<Service>,
    ) -> Result<Option<Service>, StatusError> {
        match read {
            Some(svc) => Ok(Some(svc)),
            None => self.get(key).await,
        }
    }

    async fn patch_vip_host(
        &self,
        key: &ServiceKey,
        node: Option<&str>,
        read: Option<Service>,
    ) -> Result<WriteOutcome, StatusError> {
        let values = json!({ ANN_VIP_HOST: node });
        self.patch_annotations(key, values, "patch annotation kube-vip.io/vipHost", read)
            .await
    }

    /// A merge patch of the Service's `metadata.annotations` with `values` (a JSON object;
    /// `null` removes a key); `op` names the write in errors. Under RBAC without `patch`, an
    /// update of `read` (the Service as the caller just read it), else read here.
    pub(super) async fn patch_annotations(
        &self,
        key: &ServiceKey,
        values: serde_json::Value,
        op: &'static str,
        read: Option<Service>,
    ) -> Result<WriteOutcome, StatusError> {
        if !self.patch_forbidden.load(Ordering::Relaxed) {
            let patch = json!({ "metadata": { "annotations": values } });
            let api = self.services(key);
            let pp = PatchParams::default();
            let patch = Patch::Merge(&patch);
            let fut = api.patch(&key.name, &pp, &patch);
            match timed(key, op, fut).await {
                Ok(_) => return Ok(WriteOutcome::Written),
                Err(e) if e.is_not_found() => return Ok(WriteOutcome::NotFound),
                Err(e) if e.rbac_denies("patch") => self.learn_patch_forbidden(&e),
                Err(e) => return Err(e),
            }
        }
        let Some(mut svc) = self.read_unless(key, read).await? else {
            return Ok(WriteOutcome::NotFound);
        };
        merge_annotations(&mut svc, &values);
        let api = self.services(key);
        let pp = PostParams::default();
        let fut = api.replace(&key.name, &pp, &svc);
        match timed(key, op, fut).await {
            Ok(_) => Ok(WriteOutcome::Written),
            Err(e) if e.is_not_found() => Ok(WriteOutcome::NotFound),
            Err(e) => Err(self.unlearn_if_update_denied(e)),
        }
    }

    /// Notes a server that dropped the ports it was sent.
    pub(super) fn learn_ports(&self, sent: &[LoadBalancerIngress], stored: &Service) {
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
}

/// Runs one API request about a Service with [`API_TIMEOUT`], mapping errors to
/// [`StatusError`].
pub(super) async fn timed<T>(
    key: &ServiceKey,
    op: &'static str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, StatusError> {
    timed_as("Service", key, op, fut).await
}

impl StatusWriter for KubeStatusWriter {
    /// Patches at once (the caller compared its cache, see the type's docs); the outcome
    /// is [`WriteOutcome::Written`] even when the server already had it.
    async fn set_ingress(
        &self,
        key: &ServiceKey,
        ingress: Vec<LoadBalancerIngress>,
    ) -> Result<WriteOutcome, StatusError> {
        let _slot = self.slot().await;
        match self.patch_ingress(key, &ingress, None).await? {
            Some(stored) => {
                self.learn_ports(&ingress, &stored);
                Ok(WriteOutcome::Written)
            }
            None => Ok(WriteOutcome::NotFound),
        }
    }

    fn compares_ports(&self) -> bool {
        !self.server_drops_ingress_ports()
    }

    /// Patches at once, like [`StatusWriter::set_ingress`].
    async fn set_vip_host(
        &self,
        key: &ServiceKey,
        node: &str,
    ) -> Result<WriteOutcome, StatusError> {
        let _slot = self.slot().await;
        self.patch_vip_host(key, Some(node), None).await
    }

    async fn set_annotations(
        &self,
        key: &ServiceKey,
        annotations: &[(&'static str, String)],
    ) -> Result<WriteOutcome, StatusError> {
        let _slot = self.slot().await;
        if annotations.is_empty() {
            return Ok(WriteOutcome::Unchanged);
        }
        let values: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_string(), serde_json::Value::String(v.clone())))
            .collect();
        self.patch_annotations(key, values.into(), "patch DHCP annotations", None)
            .await
    }

    async fn clear(&self, key: &ServiceKey) -> Result<WriteOutcome, StatusError> {
        let _slot = self.slot().await;
        let Some(current) = self.get(key).await? else {
            return Ok(WriteOutcome::NotFound);
        };
        let mut outcome = WriteOutcome::Unchanged;
        let has_host = vip_host_of(&current).is_some();
        let mut latest = current;
        if !current_ingress(&latest).is_empty() {
            match self.patch_ingress(key, &[], Some(latest)).await? {
                // The stored Service (its new resourceVersion) for the next write.
                Some(stored) => latest = stored,
                None => return Ok(WriteOutcome::NotFound),
            }
            outcome = WriteOutcome::Written;
        }
        if has_host {
            outcome = self.patch_vip_host(key, None, Some(latest)).await?;
        }
        Ok(outcome)
    }

    async fn event(
        &self,
        key: &ServiceKey,
        uid: Option<&str>,
        event: &ServiceEvent,
    ) -> Result<(), StatusError> {
        let _slot = self.slot().await;
        let uid = match uid {
            Some(u) => Some(u.to_string()),
            None => match self.get(key).await? {
                Some(svc) => svc.metadata.uid,
                // Gone: nothing to attach the Event to.
                None => return Ok(()),
            },
        };
        self.recorder
            .write_event(Regarding::of::<Service>(), key, uid, event)
            .await
    }
}

/// Applies `values` (a JSON object: a string sets the annotation, `null` removes it, as in a
/// merge patch, RFC 7386) to `svc`'s annotations.
pub(super) fn merge_annotations(svc: &mut Service, values: &serde_json::Value) {
    let Some(values) = values.as_object() else {
        return;
    };
    let annotations = svc
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    for (k, v) in values {
        match v.as_str() {
            Some(text) => {
                annotations.insert(k.clone(), text.to_string());
            }
            None => {
                annotations.remove(k);
            }
        }
    }
}
