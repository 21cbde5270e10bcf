//! Events, object-agnostic (like kube-runtime's `events::Recorder`, which vipd does not use:
//! it folds repeats on reason and action only and would keep showing an old note): their
//! names ([`event_name`]), notes ([`truncate_note`]) and how a [`Recorder`] writes them
//! (events.k8s.io/v1 or core v1, chosen by API discovery; repeats folded into a series;
//! failures logged with a rate limit). The Services status writer and the duplicate-identity
//! report each hold one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::{Event as EventsV1Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::{Metadata, NamespaceResourceScope, Resource};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::ObjectKey;

/// Time limit of every single API request about an object that the [`Recorder`] and the
/// Service status writer make (2 s).
pub const API_TIMEOUT: Duration = Duration::from_secs(2);
/// `reportingController` of vipd's Events (events.k8s.io/v1).
pub const REPORTING_CONTROLLER: &str = "vipd";
/// Longest Event note the API accepts (events.k8s.io/v1: 1 kB); longer notes are cut.
pub(crate) const MAX_NOTE_BYTES: usize = 1024;
/// How long an identical Event is folded into a series instead of creating a new one
/// (6 minutes, client-go's and kube-rs's value).
pub(crate) const EVENT_SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// A failed Event write is logged at warn once per (reason, HTTP status) in this window
/// (60 s); the next line after it gives the number of failures not logged meanwhile.
pub(crate) const EVENT_FAILURE_LOG_WINDOW: Duration = Duration::from_secs(60);

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

/// One Event about an object (a Service, a Lease): events.k8s.io/v1 `type`, `reason`, `action` (both
/// PascalCase, at most 128 characters) and `note` (human text, cut to
/// [`MAX_NOTE_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Event {
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

/// A failed API request about one object, naming the object (its kind, namespace and
/// name) and the operation.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API answered with an error or the connection failed.
    #[error("{kind} {key}: {op}: {source}")]
    Api {
        /// `Service` or `Lease`.
        kind: &'static str,
        /// The object's namespace and name.
        key: ObjectKey,
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
        key: ObjectKey,
        /// What was attempted.
        op: &'static str,
        /// The limit ([`API_TIMEOUT`]).
        after: Duration,
    },
}

impl ApiError {
    /// The HTTP status code of an API error (e.g. 403 for missing RBAC).
    pub fn api_code(&self) -> Option<u16> {
        match self {
            ApiError::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }

    /// The API said 403 because RBAC does not grant `verb` (the authorizer's message:
    /// `User "..." cannot patch resource "services" ...`), not for another reason (an
    /// admission webhook's denial, say).
    pub fn rbac_denies(&self, verb: &str) -> bool {
        match self {
            ApiError::Api {
                source: kube::Error::Api(s),
                ..
            } => s.code == 403 && s.message.contains(&format!("cannot {verb} resource")),
            _ => false,
        }
    }

    /// The API said 404.
    pub(crate) fn is_not_found(&self) -> bool {
        self.api_code() == Some(404)
    }
}

/// Runs one API request about the object `key` of kind `kind` with [`API_TIMEOUT`],
/// mapping errors to [`ApiError`].
///
/// # Errors
/// [`ApiError::Api`] with the kube-rs error; [`ApiError::Timeout`] after [`API_TIMEOUT`].
pub async fn timed_as<T>(
    kind: &'static str,
    key: &ObjectKey,
    op: &'static str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(API_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(ApiError::Api {
            kind,
            key: key.clone(),
            op,
            source,
        }),
        Err(_) => Err(ApiError::Timeout {
            kind,
            key: key.clone(),
            op,
            after: API_TIMEOUT,
        }),
    }
}

/// The Event API a server serves, of the two vipd writes through (both are rows of
/// `cmd/manifest/rbac.rs`'s `API_CALLS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventApi {
    /// `events.k8s.io/v1` (Kubernetes 1.19+).
    EventsV1,
    /// Core `v1` Events.
    Core,
}

/// Which Event API to use, given the resources the server lists for `events.k8s.io/v1`
/// (`None`: the group version is not served): events.k8s.io/v1 when it lists `events`, core
/// otherwise.
pub fn event_api_from_discovery(events_v1_resources: Option<&[&str]>) -> EventApi {
    match events_v1_resources {
        Some(list) if list.contains(&EventsV1Event::URL_PATH_SEGMENT) => EventApi::EventsV1,
        _ => EventApi::Core,
    }
}

/// Asks the server (API discovery, `GET /apis/events.k8s.io/v1`) which Event API to use,
/// like the EndpointSlice choice ([`crate::services::endpoints::endpointslice_v1_served`]).
///
/// # Errors
/// The kube-rs error when discovery fails for another reason than 404 (the group version
/// not served), so the caller can retry instead of settling on the wrong API.
pub async fn discover_event_api(client: &kube::Client) -> Result<EventApi, kube::Error> {
    let gv = format!("{}/{}", EventsV1Event::GROUP, EventsV1Event::VERSION);
    match client.list_api_group_resources(&gv).await {
        Ok(list) => {
            let names: Vec<&str> = list.resources.iter().map(|r| r.name.as_str()).collect();
            Ok(event_api_from_discovery(Some(&names)))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(event_api_from_discovery(None)),
        Err(e) => Err(e),
    }
}

/// Writes Events as one reporting instance (the node name): see the module docs. Cheap to
/// clone; clones share the discovered Event API, the series of repeats and the failure
/// log state.
#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    node: String,
    series: Arc<Mutex<SeriesBook>>,
    /// The Event API, once discovered (shared with clones).
    event_api: Arc<tokio::sync::OnceCell<EventApi>>,
    /// Event write failures by (reason, HTTP status): when last logged, and how many were
    /// not logged since.
    event_failures: Arc<Mutex<HashMap<FailureKey, (Instant, u32)>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("node", &self.node)
            .finish()
    }
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
pub fn event_name(object: &str, uid: Option<&str>, ev: &Event) -> String {
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
    key: ObjectKey,
    uid: Option<String>,
    event: Event,
}

/// The kind of object an Event is about: its `kind` and `apiVersion` (from its
/// k8s-openapi type: [`Regarding::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Regarding {
    kind: &'static str,
    api_version: &'static str,
}

impl Regarding {
    /// The kind of `K` (e.g. `Service`, `v1`; `Lease`, `coordination.k8s.io/v1`).
    pub fn of<K: Resource>() -> Self {
        Regarding {
            kind: K::KIND,
            api_version: K::API_VERSION,
        }
    }
    pub(super) fn kind(self) -> &'static str {
        self.kind
    }
    pub(super) fn api_version(self) -> &'static str {
        self.api_version
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

/// The series a recorder folds repeats into, by Event identity, and whether a task forgets
/// them ([`forget_series_while_any`]). A series is forgotten [`EVENT_SERIES_WINDOW`] after
/// it was last seen: at the next Event written, as client-go and kube-rs do, and also by
/// that task, so that a burst (an announcement Event for each of 10 000 Services at a cold
/// start, about 0.7 KB each) is not kept for good by a quiet cluster that writes no more.
#[derive(Debug, Default)]
struct SeriesBook {
    by_identity: HashMap<EventIdentity, SeriesState>,
    forgetting: bool,
}

impl SeriesBook {
    /// Forgets the series last seen [`EVENT_SERIES_WINDOW`] or longer before `now`, and
    /// gives back the map's room once it is a quarter full or less. Pure.
    fn forget_expired(&mut self, now: Instant) {
        self.by_identity
            .retain(|_, s| now.saturating_duration_since(s.last_seen) < EVENT_SERIES_WINDOW);
        if self.by_identity.len() <= self.by_identity.capacity() / 4 {
            self.by_identity.shrink_to_fit();
        }
    }

    /// When the next series expires, `None` when none is kept (a scan of them all: for the
    /// forgetting task, not for every Event written). Pure.
    fn next_expiry(&self) -> Option<Instant> {
        let oldest = self.by_identity.values().map(|s| s.last_seen).min()?;
        Some(oldest + EVENT_SERIES_WINDOW)
    }
}

/// Forgets each of `book`'s series when it expires, waking at the next expiry (the first
/// one a window after the task starts, with the series that started it), until none is
/// left; then ends (the next series remembered starts another,
/// [`Recorder::remember_series`]). Ends too when every recorder sharing `book` is gone.
async fn forget_series_while_any(book: std::sync::Weak<Mutex<SeriesBook>>) {
    let mut next = tokio::time::Instant::now() + EVENT_SERIES_WINDOW;
    loop {
        tokio::time::sleep_until(next).await;
        let Some(book) = book.upgrade() else {
            return;
        };
        let mut book = book.lock().unwrap_or_else(|p| p.into_inner());
        // tokio's clock (the same as std's but under a paused test runtime).
        book.forget_expired(tokio::time::Instant::now().into_std());
        match book.next_expiry() {
            Some(at) => next = tokio::time::Instant::from_std(at),
            None => {
                book.forgetting = false;
                return;
            }
        }
    }
}

impl Recorder {
    /// A recorder reporting as `node` (the Event `reportingInstance`, max 128 characters).
    pub fn new(client: kube::Client, node: &str) -> Self {
        Recorder {
            client,
            node: node.to_string(),
            series: Arc::new(Mutex::new(SeriesBook::default())),
            event_api: Arc::new(tokio::sync::OnceCell::new()),
            event_failures: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The Event API this recorder posts to: events.k8s.io/v1 where the server serves it,
    /// core v1 otherwise ([`discover_event_api`]), asked once and then kept (a failed
    /// discovery is asked again on the next Event).
    ///
    /// # Errors
    /// [`ApiError`] about `key` (the object of the Event being written) when discovery
    /// fails or times out.
    pub async fn event_api(
        &self,
        kind: &'static str,
        key: &ObjectKey,
    ) -> Result<EventApi, ApiError> {
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
    fn log_event_failure(&self, ev: &Event, err: &ApiError) {
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
    pub async fn write_event(
        &self,
        regarding: Regarding,
        key: &ObjectKey,
        uid: Option<String>,
        ev: &Event,
    ) -> Result<(), ApiError> {
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
    async fn write_event_inner(&self, ident: EventIdentity) -> Result<(), ApiError> {
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
        let mut book = self.series.lock().unwrap_or_else(|p| p.into_inner());
        book.forget_expired(now);
        book.by_identity.get_mut(ident).map(|s| {
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
    ) -> Result<(), ApiError> {
        let (kind, key) = (ident.regarding.kind(), &ident.key);
        let pp = PatchParams::default();
        match api {
            EventApi::EventsV1 => {
                let events: Api<EventsV1Event> =
                    Api::namespaced(self.client.clone(), &key.namespace);
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
    ) -> Result<(), ApiError> {
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
                let events: Api<EventsV1Event> =
                    Api::namespaced(self.client.clone(), &key.namespace);
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
        ev: &Event,
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
        ev: &Event,
        now: Timestamp,
    ) -> EventsV1Event {
        EventsV1Event {
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

    /// Remembers a created Event for folding its repeats, and starts the task that forgets
    /// expired series ([`forget_series_while_any`]) unless it runs. Called within a tokio
    /// runtime.
    fn remember_series(&self, ident: EventIdentity, name: String, now: Instant) {
        remember_series_in(&self.series, ident, name, now);
    }

    /// Records an Event about the object `key` of type `K` (a Service, a Lease), read
    /// first for its uid (`kubectl describe` matches Events by it); an object that is gone
    /// gets no Event. Repeats fold into a series. RBAC: `get` on the object, events create +
    /// patch.
    ///
    /// # Errors
    /// [`ApiError`] naming the object and the operation (read, Event discovery, create or
    /// patch).
    pub async fn record<K>(&self, key: &ObjectKey, event: &Event) -> Result<(), ApiError>
    where
        K: Resource<Scope = NamespaceResourceScope>
            + Metadata<Ty = ObjectMeta>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), &key.namespace);
        let uid = match timed_as(K::KIND, key, "get", api.get(&key.name)).await {
            Ok(obj) => obj.metadata().uid.clone(),
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        self.write_event(Regarding::of::<K>(), key, uid, event)
            .await
    }
}

/// [`Recorder::remember_series`] on `book`.
fn remember_series_in(
    book: &Arc<Mutex<SeriesBook>>,
    ident: EventIdentity,
    name: String,
    now: Instant,
) {
    let mut locked = book.lock().unwrap_or_else(|p| p.into_inner());
    locked.by_identity.insert(
        ident,
        SeriesState {
            name,
            count: 1,
            last_seen: now,
        },
    );
    if !locked.forgetting {
        locked.forgetting = true;
        tokio::spawn(forget_series_while_any(Arc::downgrade(book)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(name: &str) -> EventIdentity {
        EventIdentity {
            regarding: Regarding::of::<k8s_openapi::api::core::v1::Service>(),
            key: ObjectKey::new("default", name),
            uid: Some(format!("uid-{name}")),
            event: Event {
                kind: EventKind::Normal,
                reason: "Announced".into(),
                action: "Announce".into(),
                note: format!("announced {name}"),
                change: String::new(),
            },
        }
    }

    /// A series is forgotten once [`EVENT_SERIES_WINDOW`] has passed since it was last
    /// seen, not before; the map gives its room back when it empties.
    #[test]
    fn a_series_is_forgotten_a_window_after_it_was_last_seen() {
        let t0 = Instant::now();
        let mut book = SeriesBook::default();
        for i in 0..1000 {
            book.by_identity.insert(
                identity(&format!("web-{i}")),
                SeriesState {
                    name: format!("web-{i}.1"),
                    count: 1,
                    last_seen: t0,
                },
            );
        }
        let late = t0 + EVENT_SERIES_WINDOW / 2;
        if let Some(s) = book.by_identity.get_mut(&identity("web-7")) {
            s.last_seen = late;
        }
        book.forget_expired(t0 + EVENT_SERIES_WINDOW - Duration::from_secs(1));
        assert_eq!(
            book.next_expiry(),
            Some(t0 + EVENT_SERIES_WINDOW),
            "the next expiry is the oldest series'"
        );
        assert_eq!(book.by_identity.len(), 1000);
        book.forget_expired(t0 + EVENT_SERIES_WINDOW);
        assert_eq!(book.next_expiry(), Some(late + EVENT_SERIES_WINDOW));
        assert_eq!(
            book.by_identity.len(),
            1,
            "only the series seen later is left"
        );
        assert!(book.by_identity.contains_key(&identity("web-7")));
        assert!(book.by_identity.capacity() < 1000, "the room is given back");
        book.forget_expired(late + EVENT_SERIES_WINDOW);
        assert_eq!(book.next_expiry(), None);
        assert!(book.by_identity.is_empty());
    }

    /// With no Event written after a burst, the recorder's task forgets the burst's series
    /// a window later, and a younger one when its own window ends (not a whole window after
    /// the task's last look), then ends; the next series starts it again.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_recorder_forgets_a_burst_of_series() {
        let now = || tokio::time::Instant::now().into_std();
        let minute = Duration::from_secs(60);
        let book = Arc::new(Mutex::new(SeriesBook::default()));
        let state = |b: &Arc<Mutex<SeriesBook>>| {
            let b = b.lock().unwrap();
            (b.by_identity.len(), b.forgetting)
        };
        for i in 0..100 {
            remember_series_in(&book, identity(&format!("web-{i}")), format!("e{i}"), now());
        }
        assert_eq!(state(&book), (100, true));
        tokio::time::sleep(3 * minute).await;
        remember_series_in(&book, identity("younger"), "y".into(), now());
        tokio::time::sleep(3 * minute + Duration::from_secs(1)).await;
        assert_eq!(
            state(&book),
            (1, true),
            "the burst is forgotten, the younger series kept"
        );
        tokio::time::sleep(3 * minute).await;
        assert_eq!(
            state(&book),
            (0, false),
            "the younger series is forgotten when it expires and the task ends"
        );
        remember_series_in(&book, identity("next"), "n".into(), now());
        assert_eq!(state(&book), (1, true));
        tokio::time::sleep(EVENT_SERIES_WINDOW + Duration::from_secs(1)).await;
        assert_eq!(
            state(&book),
            (0, false),
            "a new task forgot the next series"
        );
    }

    /// Only RBAC's own 403 for the verb counts (the status writer's update fallback keys on
    /// it), not a webhook's 403 or another verb's.
    #[test]
    fn rbac_denial_is_told_apart_from_other_403s() {
        let err = |code: u16, msg: &str| ApiError::Api {
            kind: "Service",
            key: ObjectKey::new("default", "web"),
            op: "patch",
            source: kube::Error::Api(
                kube::core::Status::failure(msg, "Forbidden")
                    .with_code(code)
                    .boxed(),
            ),
        };
        let rbac = r#"services "web" is forbidden: User "system:serviceaccount:kube-system:kube-vip" cannot patch resource "services" in API group "" in the namespace "default""#;
        assert!(err(403, rbac).rbac_denies("patch"));
        assert!(!err(403, rbac).rbac_denies("update"));
        assert!(!err(403, "admission webhook \"policy\" denied the request").rbac_denies("patch"));
        assert!(!err(409, rbac).rbac_denies("patch"));
    }

    #[test]
    fn event_api_by_discovery() {
        assert_eq!(
            event_api_from_discovery(Some(&["events"])),
            EventApi::EventsV1
        );
        assert_eq!(event_api_from_discovery(Some(&[])), EventApi::Core);
        assert_eq!(event_api_from_discovery(None), EventApi::Core);
    }
}
