//! Events: their names ([`event_name`]), notes ([`truncate_note`]) and how
//! [`KubeStatusWriter`] writes them (events.k8s.io/v1 or core v1, repeats folded into a
//! series, failures logged with a rate limit).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cmd::manifest::rbac::{EventApi, discover_event_api};
use crate::services::plan::model::ServiceKey;

use super::writer::{KubeStatusWriter, timed_as};
use super::{
    EVENT_FAILURE_LOG_WINDOW, EVENT_SERIES_WINDOW, MAX_NOTE_BYTES, REPORTING_CONTROLLER,
    ServiceEvent, StatusError,
};

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
pub(super) struct EventIdentity {
    regarding: Regarding,
    key: ServiceKey,
    uid: Option<String>,
    event: ServiceEvent,
}

/// The kind of object an Event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Regarding {
    /// A core v1 Service.
    Service,
    /// A coordination.k8s.io/v1 Lease.
    Lease,
}

impl Regarding {
    pub(super) fn kind(self) -> &'static str {
        match self {
            Regarding::Service => "Service",
            Regarding::Lease => "Lease",
        }
    }
    pub(super) fn api_version(self) -> &'static str {
        match self {
            Regarding::Service => "v1",
            Regarding::Lease => "coordination.k8s.io/v1",
        }
    }
}

/// (Event reason, HTTP status of the failure) for rate-limiting failure logs.
pub(super) type FailureKey = (String, Option<u16>);

#[derive(Debug, Clone)]
pub(super) struct SeriesState {
    name: String,
    count: i32,
    last_seen: Instant,
}

impl KubeStatusWriter {
    /// The Event API this writer posts to: events.k8s.io/v1 where the server serves it,
    /// core v1 otherwise ([`discover_event_api`]), asked once and then kept (a failed
    /// discovery is asked again on the next Event).
    ///
    /// # Errors
    /// [`StatusError`] about `key` (the object of the Event being written) when discovery
    /// fails or times out.
    pub(crate) async fn event_api(
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

    /// Writes an Event about `key` (see [`Self::write_event_inner`]); failures are logged
    /// ([`Self::log_event_failure`]) and returned.
    pub(super) async fn write_event(
        &self,
        regarding: Regarding,
        key: &ServiceKey,
        uid: Option<String>,
        ev: &ServiceEvent,
    ) -> Result<(), StatusError> {
        let ident = EventIdentity {
            regarding,
            key: key.clone(),
            uid,
            event: ev.clone(),
        };
        let r = self.write_event_inner(ident).await;
        match &r {
            Ok(()) => tracing::debug!(object = %key, reason = %ev.reason, "Event recorded"),
            Err(e) => self.log_event_failure(ev, e),
        }
        r
    }

    /// Creates the Event, or folds a repeat into the first one's series (events.k8s.io) or
    /// count (core).
    async fn write_event_inner(&self, ident: EventIdentity) -> Result<(), StatusError> {
        let api = self.event_api(ident.regarding.kind(), &ident.key).await?;
        let now = Instant::now();
        if let Some((name, count)) = self.count_repeat(&ident, now) {
            match self.patch_series(api, &ident, &name, count).await {
                Ok(()) => return Ok(()),
                // The Event was garbage-collected (TTL): start a new one below.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let name = event_name(&ident.key.name, ident.uid.as_deref(), &ident.event);
        let created = self.create_event(api, &ident, &name).await;
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

    /// Counts a repeat of `ident` seen at `now`, after forgetting the series last seen
    /// [`EVENT_SERIES_WINDOW`] or longer ago: the first Event's name and the new count, or
    /// `None` when `ident` is not a repeat.
    fn count_repeat(&self, ident: &EventIdentity, now: Instant) -> Option<(String, i32)> {
        let mut map = self.series.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| now.duration_since(s.last_seen) < EVENT_SERIES_WINDOW);
        map.get_mut(ident).map(|s| {
            s.count += 1;
            s.last_seen = now;
            (s.name.clone(), s.count)
        })
    }

    /// Folds a repeat of `ident` into its existing Event `name`: sets its `series`
    /// (events.k8s.io) or `count` (core) to `count`, last seen now.
    async fn patch_series(
        &self,
        api: EventApi,
        ident: &EventIdentity,
        name: &str,
        count: i32,
    ) -> Result<(), StatusError> {
        let (kind, key) = (ident.regarding.kind(), &ident.key);
        let pp = PatchParams::default();
        match api {
            EventApi::EventsV1 => {
                let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &key.namespace);
                let patch = json!({ "series": EventSeries {
                    count,
                    last_observed_time: MicroTime(Timestamp::now()),
                }});
                let patch = Patch::Merge(&patch);
                let fut = events.patch(name, &pp, &patch);
                timed_as(kind, key, "patch Event series", fut).await?;
            }
            EventApi::Core => {
                let core: Api<CoreEvent> = Api::namespaced(self.client.clone(), &key.namespace);
                let patch = json!({ "count": count, "lastTimestamp": Time(Timestamp::now()) });
                let patch = Patch::Merge(&patch);
                let fut = core.patch(name, &pp, &patch);
                timed_as(kind, key, "patch Event count", fut).await?;
            }
        }
        Ok(())
    }

    /// Creates the Event `ident` (its object, uid and text) named `name` through `api`.
    async fn create_event(
        &self,
        api: EventApi,
        ident: &EventIdentity,
        name: &str,
    ) -> Result<(), StatusError> {
        let (kind, key, ev) = (ident.regarding.kind(), &ident.key, &ident.event);
        let reference = ObjectReference {
            api_version: Some(ident.regarding.api_version().into()),
            kind: Some(kind.into()),
            namespace: Some(key.namespace.clone()),
            name: Some(key.name.clone()),
            uid: ident.uid.clone(),
            ..Default::default()
        };
        let meta = ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(key.namespace.clone()),
            ..Default::default()
        };
        let now = Timestamp::now();
        let pp = PostParams::default();
        match api {
            EventApi::Core => {
                let core: Api<CoreEvent> = Api::namespaced(self.client.clone(), &key.namespace);
                let obj = self.core_event(meta, reference, ev, now);
                timed_as(kind, key, "create Event", core.create(&pp, &obj)).await?;
            }
            EventApi::EventsV1 => {
                let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &key.namespace);
                let obj = self.events_v1_event(meta, reference, ev, now);
                timed_as(kind, key, "create Event", events.create(&pp, &obj)).await?;
            }
        }
        Ok(())
    }

    /// The core v1 Event for `ev` (count 1, first and last seen at `now`).
    fn core_event(
        &self,
        metadata: ObjectMeta,
        involved_object: ObjectReference,
        ev: &ServiceEvent,
        now: Timestamp,
    ) -> CoreEvent {
        CoreEvent {
            metadata,
            involved_object,
            type_: Some(ev.kind.as_str().into()),
            reason: Some(ev.reason.clone()),
            action: Some(ev.action.clone()),
            message: Some(truncate_note(&ev.note)),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(REPORTING_CONTROLLER.into()),
                host: Some(self.node.clone()),
            }),
            reporting_component: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.node.clone()),
            ..Default::default()
        }
    }

    /// The events.k8s.io/v1 Event for `ev`, observed at `now`.
    fn events_v1_event(
        &self,
        metadata: ObjectMeta,
        regarding: ObjectReference,
        ev: &ServiceEvent,
        now: Timestamp,
    ) -> K8sEvent {
        K8sEvent {
            metadata,
            event_time: Some(MicroTime(now)),
            type_: Some(ev.kind.as_str().into()),
            reason: Some(ev.reason.clone()),
            action: Some(ev.action.clone()),
            note: Some(truncate_note(&ev.note)),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.node.clone()),
            regarding: Some(regarding),
            ..Default::default()
        }
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
    pub(crate) async fn lease_event(
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
