//! Orphaned per-Service lease collection: a Service deleted while its lease holder was down
//! (killed, frozen, partitioned) leaves its lease behind, because only the node that
//! released or still holds a lease deletes it when its Services go (see
//! [`super::runtime`]). One node of the cluster collects such leases once they have stayed
//! unchanged for their lease duration plus [`GC_GRACE`] (the holder, if it still runs, would
//! have renewed it by then): the holder of the Lease [`GC_LEASE`] (timings
//! [`GC_LEASE_TIMING`]), so the labelled leases are listed once per [`GC_INTERVAL`] in the
//! cluster, not once per node (at 10 000 per-Service leases, three nodes listing them every
//! 10 s read 3 000 objects a second for nothing). A collector that dies is replaced within
//! the GC lease's duration; the new one starts its own clock on each lease it lists.
//!
//! Only leases vipd created for Services are ever deleted: vipd creates per-Service leases
//! (with `svc_election`, and the own leases of `externalTrafficPolicy: Local` Services under
//! one lease for all, [`crate::services::plan::desired::local_lease`]) with the labels [`MANAGED_BY_LABEL`]`=vipd` and
//! [`COMPONENT_LABEL`]`=`[`COMPONENT_SERVICE_LEASE`] ([`lease_labels`]), and only leases
//! carrying both are considered. The control-plane lease, the global Services lease
//! (`plndr-svcs-lock`), leases created by kube-vip or by any other software (labels absent)
//! are never touched, whatever their name.
//!
//! The decision ([`GcState::decide`]) is pure; [`run`] lists the labelled leases every
//! [`GC_INTERVAL`] and deletes each orphan with a `resourceVersion` precondition, so a lease
//! written since it was listed (a new holder, a recreated Service) is kept.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::runtime::reflector::Store;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::election::LeaderState;
use tracing::{debug, info, warn};

use crate::services::plan::desired::{LeaseRef, Mode, info_lease_beside_shards};
use crate::services::plan::model;

/// Label key marking objects vipd manages (Kubernetes recommended labels).
pub(crate) const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on leases vipd creates for Services.
pub(crate) const MANAGED_BY: &str = "vipd";
/// Label key naming what an object is for (Kubernetes recommended labels).
pub(crate) const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Value of [`COMPONENT_LABEL`] on per-Service leases (`svc_election`).
pub(crate) const COMPONENT_SERVICE_LEASE: &str = "service-lease";

/// The Lease whose holder is the cluster's one collector (in the namespace the collector
/// lists, else `cp_namespace`). It carries no vipd labels, so it is never collected itself.
pub(crate) const GC_LEASE: &str = "vipd-lease-gc";

/// The collector election's timings: 15 s lease, 10 s renew deadline, 2 s retry period (a
/// write every 2 s for the cluster; a dead collector is replaced within 15 s).
pub(crate) const GC_LEASE_TIMING: crate::lease::Timing = crate::lease::Timing {
    lease_duration: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry_period: Duration::from_secs(2),
};

/// Whether this node collects now: it holds [`GC_LEASE`].
fn collecting(state: &watch::Receiver<LeaderState>) -> bool {
    matches!(*state.borrow(), LeaderState::Leading { .. })
}

/// Time an orphan must stay unchanged beyond its lease duration before it is deleted (30 s).
pub(crate) const GC_GRACE: Duration = Duration::from_secs(30);
/// How often the labelled leases are listed (10 s).
pub(crate) const GC_INTERVAL: Duration = Duration::from_secs(10);
/// Timeout of each list or delete call (10 s).
const GC_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The labels vipd puts on the per-Service leases it creates (and only on those).
pub(crate) fn lease_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (
            COMPONENT_LABEL.to_string(),
            COMPONENT_SERVICE_LEASE.to_string(),
        ),
    ])
}

/// [`lease_labels`], built once per process and shared by every per-Service lease client
/// (a map of two labels is about 600 bytes; one per Service was 0.6 MB at 1 000 Services).
pub(crate) fn shared_lease_labels() -> Arc<BTreeMap<String, String>> {
    static LABELS: std::sync::LazyLock<Arc<BTreeMap<String, String>>> =
        std::sync::LazyLock::new(|| Arc::new(lease_labels()));
    LABELS.clone()
}

/// The label selector of [`lease_labels`] (`key=value,key=value`).
pub(crate) fn label_selector() -> String {
    lease_labels()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What the collector needs to know about one Lease (read from a list's JSON through
/// [`ListedLease`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(from = "ListedLease")]
pub(crate) struct LeaseFacts {
    /// The Lease.
    pub lease: LeaseRef,
    /// Its `metadata.resourceVersion` (the delete's precondition).
    pub resource_version: String,
    /// Whether it carries every label of [`lease_labels`].
    pub created_by_vipd: bool,
    /// `spec.leaseDurationSeconds` (absent or not positive: `None`).
    pub duration: Option<Duration>,
    /// `spec.holderIdentity` (`""` when released), for the log line.
    pub holder: String,
}

/// A listed Lease as the collector reads it from the list's JSON: only the fields
/// [`LeaseFacts`] needs (serde skips the rest, `managedFields` included, without building
/// it). Listing 1 000 whole `Lease` objects took 4-6 MB of heap at its peak on every
/// collector pass (issue 28's heap profile of 1 000 per-Service leases); the facts of
/// 1 000 are about a tenth of that.
#[derive(Debug, serde::Deserialize)]
struct ListedLease {
    #[serde(default, deserialize_with = "null_as_default")]
    metadata: ListedMeta,
    #[serde(default)]
    spec: Option<ListedSpec>,
}

/// The part of a listed Lease's `metadata` the collector reads.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
}

/// The part of a listed Lease's `spec` the collector reads.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedSpec {
    holder_identity: Option<String>,
    lease_duration_seconds: Option<i64>,
}

/// A `LeaseList` as the collector reads it (`items` only).
#[derive(Debug, serde::Deserialize)]
struct ListedLeases {
    #[serde(default, deserialize_with = "null_as_default")]
    items: Vec<LeaseFacts>,
}

/// `null` read as the default, as k8s-openapi read a Lease's `metadata` and kube's
/// `ObjectList` its `items` (an empty list may come as `"items": null`, Go's nil slice).
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + serde::Deserialize<'de>,
{
    Ok(<Option<T> as serde::Deserialize>::deserialize(deserializer)?.unwrap_or_default())
}

impl From<ListedLease> for LeaseFacts {
    /// The facts of a listed Lease (one without name or namespace gives empty strings, and
    /// is never used by a Service, nor deleted: its name matches no Service).
    fn from(lease: ListedLease) -> Self {
        let labels = lease.metadata.labels.as_ref();
        let created_by_vipd = shared_lease_labels()
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
        let spec = lease.spec;
        let duration = spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs);
        LeaseFacts {
            lease: LeaseRef {
                namespace: lease.metadata.namespace.unwrap_or_default(),
                name: lease.metadata.name.unwrap_or_default(),
            },
            resource_version: lease.metadata.resource_version.unwrap_or_default(),
            created_by_vipd,
            duration,
            holder: spec.and_then(|s| s.holder_identity).unwrap_or_default(),
        }
    }
}

/// Lists the Leases `lp` selects (in `namespace`, else in every namespace) as
/// [`LeaseFacts`], through `client` (the list request `Api::<Lease>::list` sends).
///
/// # Errors
/// The request's [`kube::Error`] (the API server's refusal, transport, or a body that is
/// not a `LeaseList`).
async fn list_facts(
    client: &kube::Client,
    namespace: Option<&str>,
    lp: &ListParams,
) -> Result<Vec<LeaseFacts>, kube::Error> {
    let url = <Lease as kube::Resource>::url_path(&(), namespace);
    let req = kube::core::Request::new(url)
        .list(lp)
        .map_err(kube::Error::BuildRequest)?;
    let list: ListedLeases = client.request(req).await?;
    Ok(list.items)
}

/// The leases that LoadBalancer Services (any class, ignored or not) use under `mode`, by
/// the planner's rule ([`service_lease`]): per-Service election, `kube-vip.io/leaseName`
/// else `kubevip-<service>` in the Service's namespace (the rule of
/// [`model::service_info`]); one lease for all, the global lease and the
/// `externalTrafficPolicy: Local` Services' own leases ([`crate::services::plan::desired::local_lease`]; the global
/// lease is never collected anyway: it carries no labels); shard leases, every current shard
/// (used or not: a shard keeps its lease) and the Services' own leases. A shard beyond the
/// current count is not in use.
pub(crate) fn leases_in_use(services: &[Arc<Service>], mode: &Mode) -> BTreeSet<LeaseRef> {
    // A Service in a shard needs no hash to its shard: every current shard's lease is kept.
    let mut out: BTreeSet<LeaseRef> = services
        .iter()
        .map(|s| model::service_info(s))
        .filter(|i| i.is_load_balancer)
        .filter_map(|i| info_lease_beside_shards(mode, &i))
        .collect();
    if let Mode::Sharded(s) = mode {
        out.extend(s.leases());
    }
    out
}

/// An orphan to delete: the lease and the `resourceVersion` it must still have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Orphan {
    /// The Lease.
    pub lease: LeaseRef,
    /// Its resourceVersion when judged orphaned (the delete's precondition).
    pub resource_version: String,
    /// Its holder then (`""` when released), for the log line.
    pub holder: String,
    /// How long it had been seen unchanged.
    pub unchanged_for: Duration,
}

/// Per-lease memory of the collector: the resourceVersion last seen and since when (on this
/// process's monotonic clock, like an elector judges expiry: no clock skew between nodes).
#[derive(Debug, Default)]
pub(crate) struct GcState {
    seen: HashMap<LeaseRef, (String, Instant)>,
}

impl GcState {
    /// Given every lease listed at `now` and the leases Services use, returns the orphans:
    /// created by vipd ([`LeaseFacts::created_by_vipd`]), used by no Service, and unchanged
    /// (same resourceVersion) for at least their duration (`default_duration` when the lease
    /// has none) plus `grace` since this process first saw them so. Leases not in `leases`
    /// are forgotten.
    pub(crate) fn decide(
        &mut self,
        leases: &[LeaseFacts],
        in_use: &BTreeSet<LeaseRef>,
        default_duration: Duration,
        grace: Duration,
        now: Instant,
    ) -> Vec<Orphan> {
        let listed: BTreeSet<&LeaseRef> = leases.iter().map(|l| &l.lease).collect();
        self.seen.retain(|k, _| listed.contains(k));
        let mut out = Vec::new();
        for l in leases {
            let since = match self.seen.get(&l.lease) {
                Some((rv, since)) if *rv == l.resource_version => *since,
                _ => {
                    self.seen
                        .insert(l.lease.clone(), (l.resource_version.clone(), now));
                    now
                }
            };
            if !l.created_by_vipd || in_use.contains(&l.lease) {
                continue;
            }
            let unchanged_for = now.saturating_duration_since(since);
            if unchanged_for >= l.duration.unwrap_or(default_duration) + grace {
                out.push(Orphan {
                    lease: l.lease.clone(),
                    resource_version: l.resource_version.clone(),
                    holder: l.holder.clone(),
                    unchanged_for,
                });
            }
        }
        out
    }
}

/// Collects orphaned per-Service leases in `namespace` (`None` = all namespaces, as the
/// Services cache; with one lease for all, the global lease's namespace) until `stop`: every
/// [`GC_INTERVAL`] while `collector` says this node holds [`GC_LEASE`], lists the leases carrying [`lease_labels`], decides with
/// [`GcState::decide`] against the leases the Services in `services` use under `mode` ([`leases_in_use`])
/// (call only once its first list is loaded), and deletes each orphan with a
/// `resourceVersion` precondition. Logs one info line per deleted lease; list and delete
/// failures are logged at warn once per [`crate::obs::logging::REPEAT_WINDOW`]. RBAC: `list` and
/// `delete` on `coordination.k8s.io` leases (rows of
/// [`crate::kube::api::API_CALLS`]).
pub async fn run(
    client: kube::Client,
    namespace: Option<String>,
    mode: Mode,
    services: Store<Service>,
    default_duration: Duration,
    collector: watch::Receiver<LeaderState>,
    stop: CancellationToken,
) {
    // From the API server's watch cache (resourceVersion "0"), not etcd: every node lists
    // every few seconds, and a stale answer costs nothing (the delete's precondition fails).
    let lp = ListParams::default().labels(&label_selector()).match_any();
    let mut state = GcState::default();
    let mut quiet: crate::obs::logging::RepeatLimiter<&'static str, String> = Default::default();
    let mut tick = tokio::time::interval(GC_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !collecting(&collector) {
            // Another node collects: what this one saw is stale once it takes over.
            state = GcState::default();
            continue;
        }
        let listed = tokio::time::timeout(
            GC_CALL_TIMEOUT,
            list_facts(&client, namespace.as_deref(), &lp),
        )
        .await;
        let facts = match listed {
            Ok(Ok(l)) => {
                quiet.clear(&"list", Instant::now());
                l
            }
            Ok(Err(e)) => {
                let e = e.to_string();
                if let Some(r) = quiet.observe("list", e.clone(), Instant::now()) {
                    warn!(namespace = namespace.as_deref().unwrap_or("<all>"), error = %e, "lease GC: cannot list Service leases{r}");
                }
                continue;
            }
            Err(_) => {
                if let Some(r) = quiet.observe("list", "timed out".into(), Instant::now()) {
                    warn!(
                        namespace = namespace.as_deref().unwrap_or("<all>"),
                        timeout_s = GC_CALL_TIMEOUT.as_secs(),
                        "lease GC: listing Service leases timed out{r}"
                    );
                }
                continue;
            }
        };
        let in_use = leases_in_use(&services.state(), &mode);
        let orphans = state.decide(&facts, &in_use, default_duration, GC_GRACE, Instant::now());
        for o in orphans {
            let api: Api<Lease> = Api::namespaced(client.clone(), &o.lease.namespace);
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(o.resource_version.clone()),
                    uid: None,
                }),
                ..Default::default()
            };
            let deleted =
                tokio::time::timeout(GC_CALL_TIMEOUT, api.delete(&o.lease.name, &dp)).await;
            match deleted {
                Ok(Ok(_)) => info!(
                    lease = %o.lease,
                    holder = %o.holder,
                    unchanged_s = o.unchanged_for.as_secs(),
                    "lease GC: deleted the lease of a Service that no longer exists (unchanged for longer than its duration plus {} s)",
                    GC_GRACE.as_secs()
                ),
                Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => {
                    debug!(lease = %o.lease, "lease GC: lease already changed or gone; not deleted")
                }
                Ok(Err(e)) => {
                    let e = e.to_string();
                    if let Some(r) = quiet.observe("delete", e.clone(), Instant::now()) {
                        warn!(lease = %o.lease, resource_version = %o.resource_version, error = %e, "lease GC: deleting an orphaned lease failed{r}");
                    }
                }
                Err(_) => {
                    if let Some(r) = quiet.observe("delete", "timed out".into(), Instant::now()) {
                        warn!(lease = %o.lease, timeout_s = GC_CALL_TIMEOUT.as_secs(), "lease GC: deleting an orphaned lease timed out{r}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One collector per cluster: only the GC lease's holder collects, and every term it
    /// ends is acknowledged at once so the elector releases the lease on a clean stop.
    #[tokio::test]
    async fn only_the_gc_lease_holder_collects_and_its_terms_are_acknowledged() {
        let (state_tx, state_rx) = watch::channel(LeaderState::Following { holder: None });
        let (dropped_tx, mut dropped_rx) = watch::channel(0u64);
        assert!(!collecting(&state_rx));
        let ack = tokio::spawn(crate::election::acknowledge_terms(
            crate::election::Leadership {
                state: state_rx.clone(),
                dropped: dropped_tx,
            },
        ));
        state_tx.send_replace(LeaderState::Leading {
            term: 3,
            renewed_at: Instant::now(),
            clean: false,
        });
        assert!(collecting(&state_rx));
        // The current-thread test runtime runs the task up to its next wait here.
        tokio::task::yield_now().await;
        state_tx.send_replace(LeaderState::Following { holder: None });
        tokio::time::timeout(Duration::from_secs(5), dropped_rx.changed())
            .await
            .expect("acknowledged")
            .expect("open");
        assert_eq!(*dropped_rx.borrow(), 3);
        assert!(!collecting(&state_rx));
        drop(state_tx);
        tokio::time::timeout(Duration::from_secs(5), ack)
            .await
            .expect("ends with the elector")
            .expect("no panic");
    }
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const D: Duration = Duration::from_secs(5);

    fn lref(ns: &str, name: &str) -> LeaseRef {
        LeaseRef {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn facts(name: &str, rv: &str, ours: bool) -> LeaseFacts {
        LeaseFacts {
            lease: lref("default", name),
            resource_version: rv.into(),
            created_by_vipd: ours,
            duration: Some(D),
            holder: "node-a".into(),
        }
    }

    fn svc(name: &str, type_: &str, ann: &[(&str, &str)]) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                annotations: Some(
                    ann.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                ..Default::default()
            }),
            status: None,
        })
    }

    #[test]
    fn an_orphan_is_collected_only_after_its_duration_plus_grace_unchanged() {
        let t0 = Instant::now();
        let mut st = GcState::default();
        let leases = [facts("kubevip-web", "10", true)];
        let none = BTreeSet::new();
        assert!(st.decide(&leases, &none, D, GC_GRACE, t0).is_empty());
        let just_before = t0 + D + GC_GRACE - Duration::from_millis(1);
        assert!(
            st.decide(&leases, &none, D, GC_GRACE, just_before)
                .is_empty()
        );
        let due = t0 + D + GC_GRACE;
        assert_eq!(
            st.decide(&leases, &none, D, GC_GRACE, due),
            vec![Orphan {
                lease: lref("default", "kubevip-web"),
                resource_version: "10".into(),
                holder: "node-a".into(),
                unchanged_for: D + GC_GRACE,
            }]
        );
        // A renewal (new resourceVersion) restarts the wait: a live holder is never robbed.
        let renewed = [facts("kubevip-web", "11", true)];
        assert!(st.decide(&renewed, &none, D, GC_GRACE, due).is_empty());
        assert!(
            st.decide(
                &renewed,
                &none,
                D,
                GC_GRACE,
                due + D + GC_GRACE - Duration::from_secs(1)
            )
            .is_empty()
        );
        assert_eq!(
            st.decide(&renewed, &none, D, GC_GRACE, due + D + GC_GRACE)
                .len(),
            1
        );
        // A longer lease waits longer; one without duration uses the default.
        let mut long = facts("kubevip-long", "1", true);
        long.duration = Some(Duration::from_secs(60));
        let mut unset = facts("kubevip-unset", "1", true);
        unset.duration = None;
        let mut st = GcState::default();
        let both = [long, unset];
        st.decide(&both, &none, D, GC_GRACE, t0);
        let got = st.decide(&both, &none, D, GC_GRACE, t0 + D + GC_GRACE);
        assert_eq!(
            got.iter()
                .map(|o| o.lease.name.as_str())
                .collect::<Vec<_>>(),
            ["kubevip-unset"]
        );
    }

    #[test]
    fn foreign_and_used_leases_are_never_collected() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(3600);
        let mut st = GcState::default();
        let leases = [
            // Same name pattern, not created by vipd (kube-vip, another tool).
            facts("kubevip-ghost", "1", false),
            facts("plndr-svcs-lock", "1", false),
            facts("plndr-cp-lock", "1", false),
            // vipd's, but a Service uses it.
            facts("kubevip-web", "1", true),
            facts("shared", "1", true),
        ];
        let services = [
            svc("web", "LoadBalancer", &[]),
            svc("a", "LoadBalancer", &[(model::ANN_LEASE_NAME, "shared")]),
        ];
        let in_use = leases_in_use(&services, &Mode::PerService);
        st.decide(&leases, &in_use, D, GC_GRACE, t0);
        assert!(st.decide(&leases, &in_use, D, GC_GRACE, later).is_empty());
        // The Service using "shared" goes: only then is it collected.
        let in_use = leases_in_use(&services[..1], &Mode::PerService);
        assert_eq!(
            st.decide(&leases, &in_use, D, GC_GRACE, later)
                .iter()
                .map(|o| o.lease.name.as_str())
                .collect::<Vec<_>>(),
            ["shared"]
        );
    }

    /// Issue 26: with one lease for all, only the `externalTrafficPolicy: Local` Services'
    /// own leases are in use beside it (in its namespace); a Local Service's lease whose
    /// Service is gone or now Cluster is an orphan. (The global lease itself is listed; it
    /// carries no vipd labels, so it is never collected anyway.)
    #[test]
    fn under_one_lease_for_all_local_services_own_leases_are_in_use() {
        let global = lref("kube-system", "plndr-svcs-lock");
        let mut local = (*svc("web", "LoadBalancer", &[])).clone();
        if let Some(spec) = local.spec.as_mut() {
            spec.external_traffic_policy = Some("Local".into());
        }
        let services = [Arc::new(local), svc("api", "LoadBalancer", &[])];
        let mode = Mode::Global(global.clone());
        let got = leases_in_use(&services, &mode);
        assert_eq!(
            got,
            BTreeSet::from([
                global.clone(),
                lref("kube-system", "vipd-local.default.web")
            ])
        );
        assert_eq!(
            leases_in_use(&services[1..], &mode),
            BTreeSet::from([global])
        );
    }

    /// Issue 28: under shard leases every current shard is in use (an empty one too: a
    /// shard keeps its lease), a shard beyond the count is not (it is collected once
    /// unchanged for its duration plus the grace), and the Services that cannot share a
    /// shard keep theirs: an ETP Local Service, one with its own health check or a node
    /// selector its `vipd-local.` lease, a Service with a `kube-vip.io/leaseName` its
    /// annotated lease; a Service's `kubevip-<name>` lease
    /// from before the switch to shards is an orphan.
    #[test]
    fn under_shard_leases_every_shard_and_the_own_leases_are_in_use() {
        let shards = crate::services::plan::desired::Shards {
            namespace: "kube-system".into(),
            count: 4,
        };
        let mut local = (*svc("local", "LoadBalancer", &[])).clone();
        if let Some(spec) = local.spec.as_mut() {
            spec.external_traffic_policy = Some("Local".into());
        }
        let services = [
            Arc::new(local),
            svc("web", "LoadBalancer", &[]),
            svc(
                "grouped",
                "LoadBalancer",
                &[(model::ANN_LEASE_NAME, "common")],
            ),
            // Its own health check: one failing check must not move a whole shard.
            svc(
                "checked",
                "LoadBalancer",
                &[(model::ANN_HEALTHCHECK, "http://127.0.0.1:8080/ready")],
            ),
            svc(
                "pinned",
                "LoadBalancer",
                &[("vipd.io/node-selector", "zone=a")],
            ),
        ];
        let got = leases_in_use(&services, &Mode::Sharded(shards.clone()));
        let mut want: BTreeSet<LeaseRef> = shards.leases().collect();
        want.insert(lref("kube-system", "vipd-local.default.local"));
        want.insert(lref("kube-system", "vipd-local.default.checked"));
        want.insert(lref("kube-system", "vipd-local.default.pinned"));
        want.insert(lref("default", "common"));
        assert_eq!(got, want);
        let mut st = GcState::default();
        let t0 = Instant::now();
        let mut beyond = facts("vipd-services-shard-4", "1", true);
        beyond.lease.namespace = "kube-system".into();
        let mut kept = facts("vipd-services-shard-3", "1", true);
        kept.lease.namespace = "kube-system".into();
        let leases = [beyond, kept, facts("kubevip-web", "1", true)];
        st.decide(&leases, &got, D, GC_GRACE, t0);
        let orphans = st.decide(&leases, &got, D, GC_GRACE, t0 + D + GC_GRACE);
        assert_eq!(
            orphans
                .iter()
                .map(|o| o.lease.name.as_str())
                .collect::<Vec<_>>(),
            ["vipd-services-shard-4", "kubevip-web"]
        );
    }

    #[test]
    fn leases_in_use_follow_the_lease_name_rule_and_the_type() {
        let services = [
            svc("web", "LoadBalancer", &[]),
            svc("dns", "LoadBalancer", &[(model::ANN_LEASE_NAME, "common")]),
            svc("internal", "ClusterIP", &[]),
        ];
        let got = leases_in_use(&services, &Mode::PerService);
        assert_eq!(
            got,
            BTreeSet::from([lref("default", "kubevip-web"), lref("default", "common")])
        );
    }

    /// The facts of `lease` as the collector reads them: `lease` as the API server sends it
    /// in a `LeaseList`, through [`ListedLeases`].
    fn listed(lease: &Lease) -> LeaseFacts {
        let list = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "LeaseList",
            "metadata": {"resourceVersion": "99"},
            "items": [lease],
        });
        let mut items = serde_json::from_value::<ListedLeases>(list)
            .expect("a LeaseList")
            .items;
        assert_eq!(items.len(), 1);
        items.remove(0)
    }

    #[test]
    fn facts_recognise_vipd_leases_by_both_labels() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some("kubevip-web".into()),
                namespace: Some("default".into()),
                resource_version: Some("7".into()),
                labels: Some(lease_labels()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("vipd".into()),
                    operation: Some("Update".into()),
                    fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {}}))),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("node-b".into()),
                lease_duration_seconds: Some(15),
                ..Default::default()
            }),
        };
        assert_eq!(
            listed(&lease),
            LeaseFacts {
                lease: lref("default", "kubevip-web"),
                resource_version: "7".into(),
                created_by_vipd: true,
                duration: Some(Duration::from_secs(15)),
                holder: "node-b".into(),
            }
        );
        // Only managed-by: not enough (e.g. vipd's control-plane lease some day, or another
        // vipd-managed object).
        lease.metadata.labels = Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_string(),
            MANAGED_BY.to_string(),
        )]));
        assert!(!listed(&lease).created_by_vipd);
        lease.metadata.labels = None;
        lease.spec = Some(LeaseSpec {
            lease_duration_seconds: Some(-3),
            ..Default::default()
        });
        let f = listed(&lease);
        assert!(!f.created_by_vipd);
        assert_eq!(f.duration, None);
        assert_eq!(f.holder, "");
        // Released, no spec at all, no name: empty facts, never matching a Service.
        lease.spec = None;
        lease.metadata = ObjectMeta::default();
        let f = listed(&lease);
        assert_eq!((f.lease.name.as_str(), f.duration), ("", None));
        assert_eq!(
            label_selector(),
            "app.kubernetes.io/component=service-lease,app.kubernetes.io/managed-by=vipd"
        );
    }

    /// A client whose API server answers every request with `status` and `body`, and the
    /// (method, URI) of each request it got.
    fn answering(status: u16, body: &str) -> (kube::Client, Arc<std::sync::Mutex<Vec<String>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let body = body.to_string();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            log.lock()
                .unwrap()
                .push(format!("{} {}", req.method(), req.uri()));
            let resp = http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(hyper::body::Bytes::from(
                    body.clone(),
                )))
                .unwrap();
            async move { Ok::<_, std::convert::Infallible>(resp) }
        });
        (kube::Client::new(svc, "default"), seen)
    }

    fn gc_list_params() -> ListParams {
        ListParams::default().labels(&label_selector()).match_any()
    }

    /// `list_facts` sends the request `Api::<Lease>::list` sent (namespaced and in every
    /// namespace): same path, label selector, resourceVersion=0, no limit.
    #[tokio::test]
    async fn list_facts_sends_the_request_api_list_sent() {
        let empty = r#"{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{"resourceVersion":"9"},"items":[]}"#;
        let lp = gc_list_params();
        for ns in [Some("kube-system"), None] {
            let (client, seen) = answering(200, empty);
            let api: Api<Lease> = match ns {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            api.list(&lp).await.expect("Api::list");
            list_facts(&client, ns, &lp).await.expect("list_facts");
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[0], seen[1], "{ns:?}");
            let want_path = match ns {
                Some(ns) => format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases?"),
                None => "/apis/coordination.k8s.io/v1/leases?".to_string(),
            };
            assert!(seen[1].starts_with(&format!("GET {want_path}")), "{seen:?}");
            assert!(seen[1].contains("resourceVersion=0"), "{seen:?}");
            assert!(
                seen[1].contains("labelSelector=app.kubernetes.io%2Fcomponent%3Dservice-lease%2Capp.kubernetes.io%2Fmanaged-by%3Dvipd"),
                "{seen:?}"
            );
            assert!(!seen[1].contains("limit="), "{seen:?}");
        }
    }

    /// The API server's refusals come back as they did from `Api::list`: `kube::Error::Api`
    /// with its code.
    #[tokio::test]
    async fn list_facts_returns_the_api_servers_refusal() {
        for code in [403u16, 404, 500] {
            let status = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "leases.coordination.k8s.io is forbidden", "reason": "Forbidden",
                "code": code,
            });
            let (client, _) = answering(code, &status.to_string());
            match list_facts(&client, None, &gc_list_params()).await {
                Err(kube::Error::Api(s)) => assert_eq!(s.code, code),
                other => panic!("{code}: {other:?}"),
            }
        }
    }

    /// Every list body `Api::<Lease>::list` read, `list_facts` reads, to as many facts; and
    /// what it refused, `list_facts` may refuse too (one Lease of the wrong shape fails the
    /// whole list, as it did; the API server validates Leases, so it sends none). An empty list sent as `"items": null` (Go's nil slice; kube's
    /// `ObjectList` reads it as empty since kube-rs #1199) is an empty list, not an error.
    #[tokio::test]
    async fn list_facts_reads_every_list_api_list_read() {
        let list = |items: serde_json::Value| {
            serde_json::json!({
                "kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1",
                "metadata": {"resourceVersion": "9"}, "items": items,
            })
            .to_string()
        };
        let bodies = [
            ("empty", list(serde_json::json!([]))),
            ("items null", list(serde_json::Value::Null)),
            (
                "items missing",
                r#"{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{}}"#
                    .to_string(),
            ),
            (
                "spec null, labels null",
                list(
                    serde_json::json!([{"metadata": {"name": "a", "namespace": "default", "labels": null}, "spec": null}]),
                ),
            ),
            (
                "metadata null",
                list(serde_json::json!([{"metadata": null, "spec": {}}])),
            ),
            (
                "metadata missing",
                list(serde_json::json!([{"spec": {"holderIdentity": "n"}}])),
            ),
            (
                "duration a string",
                list(
                    serde_json::json!([{"metadata": {"name": "a"}, "spec": {"leaseDurationSeconds": "15"}}]),
                ),
            ),
        ];
        for (what, body) in bodies {
            let (client, _) = answering(200, &body);
            let before = Api::<Lease>::all(client.clone())
                .list(&gc_list_params())
                .await
                .map(|l| l.items.len());
            let now = list_facts(&client, None, &gc_list_params())
                .await
                .map(|f| f.len());
            // Refused before (e.g. a duration that is not a number: the API server never
            // sends one): reading it now is no loss.
            if let Ok(n) = before {
                assert_eq!(now.ok(), Some(n), "{what}: Api::list read {n} leases");
            }
        }
    }
}
