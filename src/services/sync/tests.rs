//! The status side against [`MemoryStatusWriter`] (through a recorder of the calls made):
//! what is written, when, and what is retried.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
use kube::runtime::watcher;

use super::*;
use crate::election::LeaderState;
use crate::services::plan::desired::{Group, LeaseRef};
use crate::services::plan::model::{self, PortProto};
use crate::services::publish::{MemoryStatusWriter, StatusError, WriteOutcome, desired_ingress};

const NODE: &str = "node-a";

/// A [`MemoryStatusWriter`] that records every call (`"<op> <ns>/<name>"`) and fails every
/// call while `fail` is set.
#[derive(Default)]
struct Recorder {
    memory: MemoryStatusWriter,
    calls: Mutex<Vec<String>>,
    fail: AtomicBool,
    /// How long each call takes (on tokio's clock); zero: none.
    latency_ms: std::sync::atomic::AtomicU64,
    /// Calls in flight now, and the most seen at once.
    in_flight: std::sync::atomic::AtomicUsize,
    most_in_flight: std::sync::atomic::AtomicUsize,
    /// Answers [`StatusWriter::compares_ports`] with `false` (a writer that saw the server
    /// drop `ingress[].ports`).
    drops_ports: AtomicBool,
    /// Fails every Event post (an RBAC without `events`) while set.
    fail_events: AtomicBool,
}

impl Recorder {
    /// Records the call; the error to answer with while `fail` is set.
    fn record(&self, op: &str, key: &ServiceKey) -> Option<StatusError> {
        self.calls.lock().unwrap().push(format!("{op} {key}"));
        self.fail
            .load(Ordering::SeqCst)
            .then(|| StatusError::Timeout {
                kind: "Service",
                key: key.clone(),
                op: "test",
                after: std::time::Duration::from_secs(1),
            })
    }

    /// Takes `latency_ms` of tokio's clock, counting the call in flight meanwhile.
    async fn wait(&self) {
        let ms = self.latency_ms.load(Ordering::SeqCst);
        if ms == 0 {
            return;
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// The calls made since the last `take`.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl StatusWriter for Recorder {
    async fn set_ingress(
        &self,
        key: &ServiceKey,
        ingress: Vec<LoadBalancerIngress>,
    ) -> Result<WriteOutcome, StatusError> {
        self.wait().await;
        if let Some(e) = self.record("ingress", key) {
            return Err(e);
        }
        self.memory.set_ingress(key, ingress).await
    }

    fn compares_ports(&self) -> bool {
        !self.drops_ports.load(Ordering::SeqCst)
    }

    async fn set_vip_host(
        &self,
        key: &ServiceKey,
        node: &str,
    ) -> Result<WriteOutcome, StatusError> {
        self.wait().await;
        if let Some(e) = self.record("vipHost", key) {
            return Err(e);
        }
        self.memory.set_vip_host(key, node).await
    }

    async fn set_annotations(
        &self,
        key: &ServiceKey,
        annotations: &[(&'static str, String)],
    ) -> Result<WriteOutcome, StatusError> {
        self.wait().await;
        if let Some(e) = self.record("annotations", key) {
            return Err(e);
        }
        self.memory.set_annotations(key, annotations).await
    }

    async fn clear(&self, key: &ServiceKey) -> Result<WriteOutcome, StatusError> {
        self.wait().await;
        if let Some(e) = self.record("clear", key) {
            return Err(e);
        }
        self.memory.clear(key).await
    }

    async fn event(
        &self,
        key: &ServiceKey,
        uid: Option<&str>,
        event: &ServiceEvent,
    ) -> Result<(), StatusError> {
        self.wait().await;
        if let Some(e) = self.record(&format!("event {}", event.reason), key) {
            return Err(e);
        }
        if self.fail_events.load(Ordering::SeqCst) {
            return Err(StatusError::Timeout {
                kind: "Event",
                key: key.clone(),
                op: "test",
                after: std::time::Duration::from_secs(1),
            });
        }
        self.memory.event(key, uid, event).await
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn web() -> ServiceKey {
    ServiceKey::new("default", "web")
}

fn http() -> Vec<PortProto> {
    vec![PortProto {
        port: 80,
        protocol: "TCP".into(),
    }]
}

/// Service `web` as cached: resourceVersion `rv`, `vipHost` = `host`, ingress for `addrs`
/// (none when empty).
fn cached(rv: &str, host: Option<&str>, addrs: &[IpAddr]) -> Service {
    let mut svc = Service::default();
    svc.metadata.namespace = Some("default".into());
    svc.metadata.name = Some("web".into());
    svc.metadata.uid = Some("uid-web".into());
    svc.metadata.resource_version = Some(rv.into());
    svc.metadata.annotations =
        host.map(|h| [(model::ANN_VIP_HOST.to_string(), h.to_string())].into());
    if !addrs.is_empty() {
        svc.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(desired_ingress(addrs, &http())),
            }),
            ..Default::default()
        });
    }
    svc
}

fn store(services: &[Service]) -> Store<Service> {
    let (store, mut writer) = reflector::store();
    for s in services {
        writer.apply_watcher_event(&watcher::Event::Apply(s.clone()));
    }
    store
}

fn status_ctx<'a>(services: &'a Store<Service>, w: &'a Recorder) -> StatusCtx<'a, Recorder> {
    StatusCtx {
        node: NODE,
        services,
        writer: w,
        every_node: false,
    }
}

fn spec(addrs: &[IpAddr]) -> GroupSpec {
    GroupSpec {
        vips: Vec::new(),
        services: vec![(web(), addrs.to_vec(), http())],
        preferred: Vec::new(),
        dhcp: Vec::new(),
        dhcp_unserved: Vec::new(),
    }
}

/// Issue 28: a group governing many Services (a shard lease) writes their status, vipHost
/// and Events several at a time, at most `STATUS_WRITES_IN_FLIGHT`: one after another, a
/// shard of hundreds of Services took seconds per pass and held up its next VIP change.
#[tokio::test(start_paused = true)]
async fn many_services_are_written_concurrently_within_the_bound() {
    let w = Recorder::default();
    w.latency_ms.store(20, Ordering::SeqCst);
    let addrs: Vec<IpAddr> = (0..40)
        .map(|i| ip(&format!("192.0.2.{}", 100 + i)))
        .collect();
    let keys: Vec<ServiceKey> = (0..40)
        .map(|i| ServiceKey::new("default", format!("s{i}")))
        .collect();
    let services = store(&[]);
    let ctx = status_ctx(&services, &w);
    let spec = GroupSpec {
        vips: Vec::new(),
        services: keys
            .iter()
            .zip(&addrs)
            .map(|(k, a)| (k.clone(), vec![*a], http()))
            .collect(),
        preferred: Vec::new(),
        dhcp: Vec::new(),
        dhcp_unserved: Vec::new(),
    };
    let mut sync = StatusSync::default();
    sync.sync(&ctx, &spec, &addrs, &[], false).await;
    let calls = w.take();
    for k in &keys {
        for op in ["ingress", "vipHost", "event AddressAnnounced"] {
            assert!(calls.contains(&format!("{op} {k}")), "{op} {k}: {calls:?}");
        }
    }
    assert_eq!(calls.len(), 120);
    assert_eq!(
        w.most_in_flight.load(Ordering::SeqCst),
        STATUS_WRITES_IN_FLIGHT
    );
    assert!(sync.retry.at.is_none());
}

#[tokio::test]
async fn status_is_written_only_when_the_cache_differs() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    // Already as wanted in the cache: no call at all.
    let services = store(&[cached("1", Some(NODE), &[a])]);
    let ctx = status_ctx(&services, &w);
    let mut sync = StatusSync::default();
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    sync.sync(&ctx, &spec(&[a]), &[a], &[], true).await;
    assert_eq!(w.take(), Vec::<String>::new());
    assert!(sync.retry.at.is_none());
    // Someone removed the ingress: only the ingress is restored.
    let services = store(&[cached("2", Some(NODE), &[])]);
    let ctx = status_ctx(&services, &w);
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    assert_eq!(w.take(), ["ingress default/web"]);
    assert_eq!(w.memory.get(&web()).ingress, desired_ingress(&[a], &http()));
}

/// A server before 1.24 drops `ingress[].ports` (the lab's v1.20.2): once the writer has
/// seen that, a cache holding the ingress as such a server stored it is as wanted. Compared
/// with the ports, every pass of every group wrote again (read, before 2026-12-06) each of its
/// Services: at 10 000 Services, thousands of calls a pass.
#[tokio::test]
async fn a_server_that_drops_ports_is_compared_without_them() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    let mut stored = cached("1", Some(NODE), &[a]);
    for e in stored
        .status
        .as_mut()
        .and_then(|s| s.load_balancer.as_mut())
        .and_then(|lb| lb.ingress.as_mut())
        .unwrap()
    {
        e.ports = None;
    }
    let services = store(&[stored]);
    let ctx = status_ctx(&services, &w);
    let mut sync = StatusSync::default();
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    assert_eq!(
        w.take(),
        ["ingress default/web"],
        "before the writer saw the ports dropped, they count"
    );
    w.drops_ports.store(true, Ordering::SeqCst);
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    sync.sync(&ctx, &spec(&[a]), &[a], &[], true).await;
    assert_eq!(w.take(), Vec::<String>::new());
    // Another address still differs without the ports.
    let b = ip("192.0.2.21");
    sync.sync(&ctx, &spec(&[b]), &[b], &[], false).await;
    let calls = w.take();
    assert!(
        calls.contains(&"ingress default/web".to_string()),
        "{calls:?}"
    );
    assert_eq!(w.memory.get(&web()).ingress, desired_ingress(&[b], &http()));
}

#[tokio::test]
async fn a_new_holder_writes_status_and_vip_host_and_announces_once_per_term() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    let services = store(&[cached("7", Some("node-b"), &[])]);
    let ctx = status_ctx(&services, &w);
    let mut sync = StatusSync::default();
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    assert_eq!(
        w.take(),
        [
            "ingress default/web",
            "vipHost default/web",
            "event AddressAnnounced default/web"
        ]
    );
    let got = w.memory.get(&web());
    assert_eq!(got.vip_host.as_deref(), Some(NODE));
    assert_eq!(
        got.events[0].note,
        "192.0.2.20 announced by node node-a (moved from node-b)"
    );
    // The cache has not caught up yet: status and vipHost again, no second announcement.
    sync.sync(&ctx, &spec(&[a]), &[a], &[], true).await;
    assert_eq!(w.take(), ["ingress default/web", "vipHost default/web"]);
    assert_eq!(w.memory.get(&web()).events.len(), 1);
}

/// Trial finding F5: the address a Service holds on this node changed within the term (its
/// DHCP lease replaced after a NAK): one more `AddressAnnounced`, naming both.
/// Without election (every node routes): a group holding one of a dual-stack Service's
/// addresses writes the ingress of both (what every node's groups write, so they agree),
/// never `vipHost` and no announcement Event; an ingress already as wanted is not written
/// again, whichever node wrote it.
#[tokio::test]
async fn without_election_the_ingress_names_every_address_and_no_vip_host() {
    let (a, b) = (ip("192.0.2.20"), ip("2001:db8::20"));
    let w = Recorder::default();
    let services = store(&[cached("7", Some("node-b"), &[])]);
    let mut ctx = status_ctx(&services, &w);
    ctx.every_node = true;
    let mut sync = StatusSync::default();
    sync.sync(&ctx, &spec(&[a, b]), &[b], &[], false).await;
    assert_eq!(w.take(), ["ingress default/web"]);
    assert_eq!(
        w.memory.get(&web()).ingress,
        desired_ingress(&[a, b], &http())
    );
    // Written by another node already: nothing to do.
    let services = store(&[cached("8", None, &[a, b])]);
    let mut ctx = status_ctx(&services, &w);
    ctx.every_node = true;
    let mut sync = StatusSync::default();
    sync.sync(&ctx, &spec(&[a, b]), &[a], &[], true).await;
    assert_eq!(w.take(), Vec::<String>::new());
    // Nothing held here: nothing written.
    sync.sync(&ctx, &spec(&[a, b]), &[], &[], false).await;
    assert_eq!(w.take(), Vec::<String>::new());
}

#[tokio::test]
async fn a_changed_address_on_the_same_holder_is_announced_once() {
    let (a, b) = (ip("192.0.2.205"), ip("192.0.2.206"));
    let w = Recorder::default();
    let services = store(&[cached("7", Some(NODE), &[a])]);
    let ctx = status_ctx(&services, &w);
    let mut sync = StatusSync::default();
    // Already ours in the cache: nothing to write, nothing to announce.
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    assert_eq!(w.take(), Vec::<String>::new());
    // The lease lost for a moment: the claim is left as it is.
    sync.sync(&ctx, &spec(&[]), &[], &[], false).await;
    assert_eq!(w.take(), Vec::<String>::new());
    sync.sync(&ctx, &spec(&[b]), &[b], &[], false).await;
    assert_eq!(
        w.take(),
        ["ingress default/web", "event AddressAnnounced default/web"]
    );
    assert_eq!(
        w.memory.get(&web()).events[0].note,
        "192.0.2.206 announced by node node-a (was 192.0.2.205)"
    );
    // The cache has not caught up yet: the status again, no second Event.
    sync.sync(&ctx, &spec(&[b]), &[b], &[], true).await;
    assert_eq!(w.take(), ["ingress default/web"]);
}

#[tokio::test]
async fn nothing_is_claimed_while_probing_and_a_refused_claim_is_taken_back() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    let services = store(&[cached("1", Some(NODE), &[a])]);
    let ctx = status_ctx(&services, &w);
    let mut sync = StatusSync::default();
    // Not bound yet (being probed): our earlier claim is left as it is.
    sync.sync(&ctx, &spec(&[a]), &[], &[], true).await;
    assert_eq!(w.take(), Vec::<String>::new());
    // Refused (another host claims it): the claim is cleared.
    sync.sync(&ctx, &spec(&[a]), &[], &[a], true).await;
    assert_eq!(w.take(), ["clear default/web"]);
    // Refused while another node's claim is in the cache: not ours to clear.
    let services = store(&[cached("2", Some("node-b"), &[a])]);
    let ctx = status_ctx(&services, &w);
    sync.sync(&ctx, &spec(&[a]), &[], &[a], true).await;
    assert_eq!(w.take(), Vec::<String>::new());
}

/// Trial finding: a DHCP Service whose lease was lost and not re-acquired (a NAK, its
/// macvlan's parent gone) kept the status and `vipHost` of an address nobody answered.
/// Listed as unserved by its clients, it is cleared when the claim is ours, left alone
/// when another node's.
#[tokio::test]
async fn a_dhcp_service_without_its_lease_is_cleared_when_the_claim_is_ours() {
    let a = ip("192.0.2.210");
    let w = Recorder::default();
    let services = store(&[cached("1", Some(NODE), &[a])]);
    let ctx = status_ctx(&services, &w);
    let mut sync = StatusSync::default();
    let lost = GroupSpec {
        dhcp_unserved: vec![web()],
        ..spec(&[])
    };
    // Still asking on its first attempt (a new holder): left as it is.
    sync.sync(&ctx, &spec(&[]), &[], &[], true).await;
    assert_eq!(w.take(), Vec::<String>::new());
    sync.sync(&ctx, &lost, &[], &[], true).await;
    assert_eq!(w.take(), ["clear default/web"]);
    let services = store(&[cached("2", Some("node-b"), &[a])]);
    let ctx = status_ctx(&services, &w);
    sync.sync(&ctx, &lost, &[], &[], true).await;
    assert_eq!(w.take(), Vec::<String>::new());
}

#[tokio::test]
async fn a_failed_write_is_retried_after_a_back_off_until_it_succeeds() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    let services = store(&[cached("1", None, &[])]);
    let ctx = status_ctx(&services, &w);
    let mut sync = StatusSync::default();
    w.fail.store(true, Ordering::SeqCst);
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    assert!(
        sync.retry.at.is_some(),
        "no retry scheduled after a failure"
    );
    assert_eq!(
        sync.pending.len(),
        1,
        "the announcement is kept for the retry"
    );
    w.take();
    w.fail.store(false, Ordering::SeqCst);
    sync.sync(&ctx, &spec(&[a]), &[a], &[], true).await;
    assert!(sync.retry.at.is_none());
    assert!(sync.pending.is_empty());
    assert_eq!(w.memory.get(&web()).events.len(), 1);
}

#[tokio::test]
async fn stale_status_of_a_service_announced_nowhere_is_cleared_once_per_version() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    let other = {
        let mut s = cached("1", Some("node-b"), &[a]);
        s.metadata.name = Some("other".into());
        s
    };
    let services = store(&[cached("1", Some(NODE), &[a]), other]);
    let ctx = status_ctx(&services, &w);
    let state = services.state();
    let mut cleared = HashSet::new();
    // Not in the plan (e.g. its address was removed): ours is cleared, node-b's is not.
    let empty = Plan::default();
    assert!(clear_stale(&ctx, &empty, &HashSet::new(), &state, &mut cleared).await);
    assert_eq!(w.take(), ["clear default/web"]);
    // Same version seen again: no second clear.
    assert!(clear_stale(&ctx, &empty, &HashSet::new(), &state, &mut cleared).await);
    assert_eq!(w.take(), Vec::<String>::new());
    // Announced (in the plan): left alone; endpointless: cleared.
    let mut plan = Plan::default();
    plan.addresses.insert(web(), vec![a]);
    plan.groups.insert(
        LeaseRef {
            namespace: "default".into(),
            name: "kubevip-web".into(),
        },
        Group {
            vips: Vec::new(),
            campaign: true,
            not_here: None,
            preferred: Vec::new(),
            services: [web()].into(),
            dhcp: Vec::new(),
        },
    );
    let mut cleared = HashSet::new();
    assert!(clear_stale(&ctx, &plan, &HashSet::new(), &state, &mut cleared).await);
    assert_eq!(w.take(), Vec::<String>::new());
    let endpointless: HashSet<ServiceKey> = [web()].into();
    assert!(clear_stale(&ctx, &plan, &endpointless, &state, &mut cleared).await);
    assert_eq!(w.take(), ["clear default/web"]);
    // A failed clear is reported for a retry and tried again.
    w.fail.store(true, Ordering::SeqCst);
    let mut cleared = HashSet::new();
    assert!(!clear_stale(&ctx, &empty, &HashSet::new(), &state, &mut cleared).await);
    assert!(!clear_stale(&ctx, &empty, &HashSet::new(), &state, &mut cleared).await);
    assert_eq!(w.take(), ["clear default/web", "clear default/web"]);
}

/// Without election: only an endpointless Service's ingress is cleared (no vipHost says
/// whose it is), once per version; a Service out of the plan is left alone (it may be
/// another controller's).
#[tokio::test]
async fn without_election_only_an_endpointless_services_ingress_is_cleared() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    let services = store(&[cached("1", None, &[a])]);
    let mut ctx = status_ctx(&services, &w);
    ctx.every_node = true;
    let state = services.state();
    let mut cleared = HashSet::new();
    let empty = Plan::default();
    assert!(clear_stale(&ctx, &empty, &HashSet::new(), &state, &mut cleared).await);
    assert_eq!(w.take(), Vec::<String>::new());
    let mut plan = Plan::default();
    plan.addresses.insert(web(), vec![a]);
    let endpointless: HashSet<ServiceKey> = [web()].into();
    assert!(clear_stale(&ctx, &plan, &endpointless, &state, &mut cleared).await);
    assert_eq!(w.take(), ["clear default/web"]);
    assert!(clear_stale(&ctx, &plan, &endpointless, &state, &mut cleared).await);
    assert_eq!(w.take(), Vec::<String>::new());
    // No ingress: nothing to clear.
    let services = store(&[cached("2", None, &[])]);
    let mut ctx = status_ctx(&services, &w);
    ctx.every_node = true;
    let state = services.state();
    assert!(clear_stale(&ctx, &plan, &endpointless, &state, &mut HashSet::new()).await);
    assert_eq!(w.take(), Vec::<String>::new());
}

fn note(reason: &'static str) -> Note {
    Note {
        key: web(),
        uid: None,
        reason,
        message: "not announced: test".into(),
        warn: true,
    }
}

/// One pass of [`report`] with no plan and the note `reason` (none when `None`).
async fn post(
    w: &Recorder,
    reported: &mut Reported,
    reason: Option<&'static str>,
    retry_failed: bool,
) -> bool {
    let notes = reason.map(note).into_iter().collect();
    report(w, &Plan::default(), &[], notes, reported, retry_failed).await
}

#[tokio::test]
async fn a_note_is_posted_once_while_its_cause_lasts_and_retried_after_a_failure() {
    use crate::services::plan::reasons::{REASON_NO_ADDRESS, REASON_UNUSABLE_ADDRESS};
    let w = Recorder::default();
    let mut reported = Reported::default();
    let (none, unusable) = (Some(REASON_NO_ADDRESS), Some(REASON_UNUSABLE_ADDRESS));
    assert!(post(&w, &mut reported, none, true).await);
    assert!(post(&w, &mut reported, none, true).await);
    assert_eq!(w.take(), ["event NoAddress default/web"]);
    // A new cause: posted; it fails, and is not tried again before the back-off is over.
    w.fail.store(true, Ordering::SeqCst);
    assert!(!post(&w, &mut reported, unusable, true).await);
    assert!(!post(&w, &mut reported, unusable, false).await);
    assert_eq!(w.take(), ["event UnusableAddress default/web"]);
    w.fail.store(false, Ordering::SeqCst);
    assert!(post(&w, &mut reported, unusable, true).await);
    assert!(post(&w, &mut reported, unusable, true).await);
    assert_eq!(w.take(), ["event UnusableAddress default/web"]);
    // The cause went away and came back: posted again.
    assert!(post(&w, &mut reported, None, true).await);
    assert!(post(&w, &mut reported, unusable, true).await);
    assert_eq!(w.take(), ["event UnusableAddress default/web"]);
}

#[tokio::test]
async fn an_address_conflict_is_posted_on_the_services_using_the_address() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    let services = store(&[cached("1", Some(NODE), &[a])]);
    let ctx = status_ctx(&services, &w);
    let mut spec = spec(&[a]);
    spec.services.push((
        ServiceKey::new("default", "db"),
        vec![ip("192.0.2.21")],
        http(),
    ));
    report_conflicts(&ctx, &spec, &[(a, [2, 0, 0, 0, 0, 1])], &[]).await;
    assert_eq!(w.take(), ["event AddressInUse default/web"]);
    assert!(
        w.memory.get(&web()).events[0]
            .note
            .contains("probes again with back-off")
    );
    // A DHCP lease: the client declined it, and the Event says so (trial finding F5).
    report_conflicts(&ctx, &spec, &[(a, [2, 0, 0, 0, 0, 1])], &[a]).await;
    assert_eq!(w.take(), ["event AddressInUse default/web"]);
    let note = &w.memory.get(&web()).events[1].note;
    assert!(note.contains("declined it (DHCPDECLINE)"), "{note}");
    assert!(note.contains("02:00:00:00:00:01"), "{note}");
}

#[test]
fn status_diff_compares_the_cache_and_queues_one_announcement() {
    use k8s_openapi::api::core::v1::{LoadBalancerStatus, ServiceStatus};
    let addrs: Vec<IpAddr> = vec!["192.0.2.20".parse().unwrap()];
    let ports = vec![PortProto {
        port: 80,
        protocol: "TCP".into(),
    }];
    let ingress = desired_ingress(&addrs, &ports);
    let mut svc = Service::default();
    svc.metadata.resource_version = Some("7".into());
    svc.metadata.annotations =
        Some([(model::ANN_VIP_HOST.to_string(), "node-a".to_string())].into());
    // Held by node-a before: everything differs, a move is announced.
    let d = status_diff(Some(&svc), "node-b", &addrs, &ingress, true);
    assert!(d.ingress && d.vip_host);
    let ev = d.announce.unwrap();
    assert_eq!(
        ev.note,
        "192.0.2.20 announced by node node-b (moved from node-a)"
    );
    assert_eq!(ev.change, "7");
    // Written: nothing to do, nothing to announce (a restart of the same holder).
    svc.metadata.annotations =
        Some([(model::ANN_VIP_HOST.to_string(), "node-b".to_string())].into());
    svc.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(ingress.clone()),
        }),
        ..Default::default()
    });
    let d = status_diff(Some(&svc), "node-b", &addrs, &ingress, true);
    assert_eq!(
        d,
        StatusDiff {
            ingress: false,
            vip_host: false,
            announce: None
        }
    );
    // Changed by someone else: restored.
    svc.status = None;
    assert!(status_diff(Some(&svc), "node-b", &addrs, &ingress, true).ingress);
    assert!(status_diff(None, "node-b", &addrs, &ingress, true).vip_host);
}

/// Trial finding (2026-12-06): under kube-vip's chart RBAC (no `events`) the failing Event
/// kept the status retry scheduled, so a hand edit of the status waited for the retry
/// (~25 s). Events have their own back-off: the status is restored at the next cache pass,
/// the Event is posted again only when its back-off is over.
#[tokio::test(start_paused = true)]
async fn events_that_keep_failing_do_not_hold_back_the_status() {
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    w.fail_events.store(true, Ordering::SeqCst);
    let services = store(&[cached("1", Some("node-b"), &[])]);
    let ctx = status_ctx(&services, &w);
    let mut sync = StatusSync::default();
    sync.sync(&ctx, &spec(&[a]), &[a], &[], true).await;
    assert_eq!(
        w.take(),
        [
            "ingress default/web",
            "vipHost default/web",
            "event AddressAnnounced default/web"
        ]
    );
    assert!(sync.retry.at.is_none(), "the writes succeeded");
    assert!(sync.event_retry.at.is_some(), "the Event is retried");
    // The status as written, then edited by hand: restored by a cache pass at once, while
    // the Event waits for its back-off.
    let services = store(&[cached("2", Some(NODE), &[])]);
    let ctx = status_ctx(&services, &w);
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    assert_eq!(w.take(), ["ingress default/web"]);
    assert_eq!(sync.pending.len(), 1);
    // Its back-off over, the Event is posted again; once it is, nothing is retried.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    w.fail_events.store(false, Ordering::SeqCst);
    let services = store(&[cached("3", Some(NODE), &[a])]);
    let ctx = status_ctx(&services, &w);
    sync.sync(&ctx, &spec(&[a]), &[a], &[], false).await;
    assert_eq!(w.take(), ["event AddressAnnounced default/web"]);
    assert!(sync.pending.is_empty());
    assert!(sync.retry.at.is_none() && sync.event_retry.at.is_none());
}

/// The channels of a status task under test: (spec, bound, leader, events) senders and
/// the task's inputs and events receiver.
#[allow(clippy::type_complexity)]
fn status_task_inputs(
    first: GroupSpec,
    bound: &[IpAddr],
) -> (
    watch::Sender<Arc<GroupSpec>>,
    watch::Sender<Vec<IpAddr>>,
    watch::Sender<LeaderState>,
    mpsc::UnboundedSender<decide::GroupEvent>,
    StatusInputs,
    mpsc::UnboundedReceiver<decide::GroupEvent>,
) {
    let (spec_tx, spec) = watch::channel(Arc::new(first));
    let (bound_tx, bound) = watch::channel(bound.to_vec());
    let (_, conflicts) = watch::channel(Vec::new());
    let (leader_tx, leader) = watch::channel(LeaderState::Leading {
        term: 1,
        renewed_at: tokio::time::Instant::now(),
        clean: false,
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let inputs = StatusInputs {
        spec,
        bound,
        conflicts,
        leader,
    };
    (spec_tx, bound_tx, leader_tx, tx, inputs, rx)
}

/// Issue 28 (new-user trial, 2026-12-06): the group's loop awaited each status sync, so
/// with the process's 4 write slots busy at a cold start a new VIP waited behind the
/// writes. The status task takes the events sent while it wrote all at once: one more
/// sync, with the latest spec, however many cache passes came meanwhile.
#[tokio::test(start_paused = true)]
async fn the_status_task_takes_the_events_queued_while_it_wrote_in_one_sync() {
    use decide::GroupEvent::*;
    let (a, b) = (ip("192.0.2.20"), ip("192.0.2.21"));
    let api = ServiceKey::new("default", "api");
    let w = Recorder::default();
    w.latency_ms.store(1000, Ordering::SeqCst);
    let services = store(&[]);
    let ctx = status_ctx(&services, &w);
    let two = GroupSpec {
        services: vec![(web(), vec![a], http()), (api.clone(), vec![b], http())],
        ..spec(&[])
    };
    let (spec_tx, _bound, _leader, tx, inputs, rx) = status_task_inputs(spec(&[a]), &[a, b]);
    let stop = CancellationToken::new();
    let driver = async {
        tx.send(Leading(true)).unwrap();
        // The first sync is writing (each call takes a second): a new Service, then cache
        // passes.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        spec_tx.send_replace(Arc::new(two));
        tx.send(Spec).unwrap();
        for _ in 0..5 {
            tx.send(CacheSeen).unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        stop.cancel();
    };
    tokio::join!(follow(&ctx, rx, inputs, &stop), driver);
    let calls = w.take();
    let count = |c: &str| calls.iter().filter(|x| *x == c).count();
    // Two syncs: the cache never caught up, so each wrote web's status once.
    assert_eq!(count("ingress default/web"), 2, "{calls:?}");
    assert_eq!(count("ingress default/api"), 1, "{calls:?}");
    assert_eq!(count("vipHost default/api"), 1, "{calls:?}");
    assert_eq!(count("event AddressAnnounced default/web"), 1, "{calls:?}");
    assert_eq!(count("event AddressAnnounced default/api"), 1, "{calls:?}");
    assert_eq!(calls.len(), 8, "{calls:?}");
}

/// A sync still writing when the lease is lost stops there, and the events queued after
/// the loss write nothing; taken again, the lease starts a new term that announces again.
#[tokio::test(start_paused = true)]
async fn a_sync_still_writing_when_the_lease_is_lost_is_dropped() {
    use decide::GroupEvent::*;
    let a = ip("192.0.2.20");
    let keys: Vec<ServiceKey> = (0..40)
        .map(|i| ServiceKey::new("default", format!("s{i}")))
        .collect();
    let many = GroupSpec {
        services: keys.iter().map(|k| (k.clone(), vec![a], http())).collect(),
        ..spec(&[])
    };
    let w = Recorder::default();
    w.latency_ms.store(1000, Ordering::SeqCst);
    let services = store(&[]);
    let ctx = status_ctx(&services, &w);
    let (_spec, _bound, leader_tx, tx, inputs, rx) = status_task_inputs(many, &[a]);
    let stop = CancellationToken::new();
    let driver = async {
        tx.send(Leading(true)).unwrap();
        // 80 writes, 8 at a time, a second each: 10 s. Lost after 2.5 s.
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        leader_tx.send_replace(LeaderState::Following { holder: None });
        tx.send(Leading(false)).unwrap();
        tx.send(CacheSeen).unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        let lost = w.take();
        leader_tx.send_replace(LeaderState::Leading {
            term: 2,
            renewed_at: tokio::time::Instant::now(),
            clean: false,
        });
        tx.send(Leading(true)).unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        stop.cancel();
        lost
    };
    let ((), lost) = tokio::join!(follow(&ctx, rx, inputs, &stop), driver);
    // Three rounds of 8 started (the third dropped in flight: recorded when they end).
    assert_eq!(lost.len(), 16, "{lost:?}");
    let again = w.take();
    let events = again.iter().filter(|c| c.starts_with("event")).count();
    assert_eq!(events, 40, "a new term announces every Service: {again:?}");
}

/// New-user trial (2026-12-06): the elector's state says the lease is lost before the
/// group's loop hands the status task `Leading(false)` (the loop may be busy, e.g. posting
/// handover Events through the writer's slots). A status retry falling due then must not
/// write: the status task's select polled the sync and `not_leading` in random order, so
/// the sync could run its writes before being dropped, and a dropped sync left the retry
/// due, so the task looped at once until a sync won the race (and wrote).
#[tokio::test(start_paused = true)]
async fn a_retry_due_after_the_lease_is_lost_writes_nothing_before_the_loop_says_so() {
    use decide::GroupEvent::*;
    let a = ip("192.0.2.20");
    let w = Recorder::default();
    w.fail.store(true, Ordering::SeqCst);
    let services = store(&[cached("1", None, &[])]);
    let ctx = status_ctx(&services, &w);
    let (_spec, _bound, leader_tx, tx, inputs, rx) = status_task_inputs(spec(&[a]), &[a]);
    let stop = CancellationToken::new();
    let driver = async {
        tx.send(Leading(true)).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!w.take().is_empty(), "the first sync wrote (and failed)");
        // The lease is lost; the group's loop has not said so yet. The writes would work
        // now: only the lease forbids them.
        w.fail.store(false, Ordering::SeqCst);
        leader_tx.send_replace(LeaderState::Following { holder: None });
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        let written = w.take();
        // Leading again before the loop ever said otherwise (a watch keeps only the latest
        // state): the retry resumes.
        leader_tx.send_replace(LeaderState::Leading {
            term: 2,
            renewed_at: tokio::time::Instant::now(),
            clean: false,
        });
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        stop.cancel();
        (written, w.take())
    };
    let ((), (written, resumed)) = tokio::join!(follow(&ctx, rx, inputs, &stop), driver);
    assert!(
        written.is_empty(),
        "written after the lease was lost: {written:?}"
    );
    assert_eq!(
        resumed,
        [
            "ingress default/web",
            "vipHost default/web",
            "event AddressAnnounced default/web"
        ],
        "leading again, the retry writes"
    );
}

/// A change heard while the elector does not lead (the group's loop not having said so)
/// is written once the elector leads again, even if the loop never saw the loss (a watch
/// keeps only the latest state, so no `Leading` event comes).
#[tokio::test(start_paused = true)]
async fn a_change_skipped_while_the_elector_did_not_lead_is_written_when_it_leads_again() {
    use decide::GroupEvent::*;
    let (a, b) = (ip("192.0.2.20"), ip("192.0.2.21"));
    let api = ServiceKey::new("default", "api");
    let w = Recorder::default();
    let services = store(&[]);
    let ctx = status_ctx(&services, &w);
    let two = GroupSpec {
        services: vec![(web(), vec![a], http()), (api.clone(), vec![b], http())],
        ..spec(&[])
    };
    let (spec_tx, _bound, leader_tx, tx, inputs, rx) = status_task_inputs(spec(&[a]), &[a, b]);
    let stop = CancellationToken::new();
    let driver = async {
        tx.send(Leading(true)).unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        w.take();
        leader_tx.send_replace(LeaderState::Following { holder: None });
        spec_tx.send_replace(Arc::new(two));
        tx.send(Spec).unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        let while_lost = w.take();
        leader_tx.send_replace(LeaderState::Leading {
            term: 2,
            renewed_at: tokio::time::Instant::now(),
            clean: false,
        });
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        stop.cancel();
        (while_lost, w.take())
    };
    let ((), (while_lost, after)) = tokio::join!(follow(&ctx, rx, inputs, &stop), driver);
    assert!(while_lost.is_empty(), "{while_lost:?}");
    assert!(
        after.contains(&"ingress default/api".to_string())
            && after.contains(&"vipHost default/api".to_string()),
        "the skipped change is written: {after:?}"
    );
}
