use std::sync::Mutex;

use super::*;
use crate::kube::api::Verb;

/// Records writes and Events; answers every write with `outcome`.
#[derive(Default)]
struct FakeApi {
    writes: Mutex<Vec<(ObjectKey, String, Change)>>,
    events: Mutex<Vec<(ObjectKey, String, String)>>,
    /// The type of each Event in `events`.
    kinds: Mutex<Vec<EventKind>>,
    stale: Mutex<bool>,
    /// Every write fails (a request error).
    fail: Mutex<bool>,
    /// Writes and Events under way now, and the most at once.
    in_flight: Mutex<(usize, usize)>,
}

impl FakeApi {
    /// Counts a call in flight until the returned guard drops, yielding once so that the
    /// caller may start others meanwhile.
    async fn call(&self) -> InFlight<'_> {
        {
            let mut n = self.in_flight.lock().unwrap();
            n.0 += 1;
            n.1 = n.1.max(n.0);
        }
        tokio::task::yield_now().await;
        InFlight(self)
    }
}

struct InFlight<'a>(&'a FakeApi);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.lock().unwrap().0 -= 1;
    }
}

impl ServiceApi for Arc<FakeApi> {
    async fn write(
        &self,
        key: &ObjectKey,
        resource_version: &str,
        change: &Change,
    ) -> Result<WriteOutcome, crate::kube::events::ApiError> {
        let _call = self.call().await;
        self.writes.lock().unwrap().push((
            key.clone(),
            resource_version.to_string(),
            change.clone(),
        ));
        if *self.fail.lock().unwrap() {
            return Err(crate::kube::events::ApiError::Timeout {
                kind: "Service",
                key: key.clone(),
                op: "allocate",
                after: Duration::from_secs(10),
            });
        }
        Ok(if *self.stale.lock().unwrap() {
            WriteOutcome::Stale
        } else {
            WriteOutcome::Written
        })
    }

    async fn event(&self, key: &ObjectKey, _uid: &str, event: &Event) {
        let _call = self.call().await;
        self.kinds.lock().unwrap().push(event.kind);
        self.events
            .lock()
            .unwrap()
            .push((key.clone(), event.reason.clone(), event.note.clone()));
    }
}

/// Answers for the addresses it lists, with MAC 02:00:00:00:00:99.
#[derive(Default)]
struct FakeProbe {
    taken: Vec<IpAddr>,
    asked: Mutex<Vec<IpAddr>>,
}

impl AddressProbe for Arc<FakeProbe> {
    async fn answered(&self, addrs: Vec<IpAddr>) -> Vec<(IpAddr, [u8; 6])> {
        self.asked.lock().unwrap().extend(addrs.iter().copied());
        addrs
            .into_iter()
            .filter(|a| self.taken.contains(a))
            .map(|a| (a, [2, 0, 0, 0, 0, 0x99]))
            .collect()
    }
}

fn settings() -> Arc<Settings> {
    Arc::new(Settings {
        kube: crate::kube::client::Settings {
            kubeconfig: None,
            kubernetes_addr: None,
            control_plane: false,
            port: 6443,
        },
        node_name: "node-a".into(),
        config_map: ObjectKey::new("kube-system", "kubevip"),
        lease: ObjectKey::new("kube-system", "kube-vip-cloud-controller"),
        timing: crate::lease::Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        },
        services_namespace: None,
        lb_class_only: false,
        lb_class_name: crate::kube::service::DEFAULT_LB_CLASS_NAME.into(),
        control_plane: vec!["192.0.2.1".parse().unwrap()],
        interface: None,
    })
}

fn service(name: &str, created: &str, extra: serde_json::Value) -> Arc<Service> {
    let mut svc = serde_json::json!({
        "metadata": {
            "namespace": "default", "name": name, "uid": format!("uid-{name}"),
            "resourceVersion": "10", "creationTimestamp": created,
        },
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    });
    json_merge(&mut svc, extra);
    Arc::new(serde_json::from_value(svc).unwrap())
}

fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn pools(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

type Fixture = (
    Allocator<Arc<FakeApi>, Arc<FakeProbe>>,
    Arc<FakeApi>,
    Arc<FakeProbe>,
);

fn allocator(probe: FakeProbe) -> Fixture {
    let api = Arc::new(FakeApi::default());
    let probe = Arc::new(probe);
    (
        Allocator::new(settings(), api.clone(), probe.clone(), None),
        api,
        probe,
    )
}

/// The allocations written, as (Service, addresses), sorted (a pass writes concurrently).
fn allocated(api: &FakeApi) -> Vec<(String, Vec<IpAddr>)> {
    let mut written: Vec<(String, Vec<IpAddr>)> = api
        .writes
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(k, _, c)| match c {
            Change::Allocate { addrs, .. } => Some((k.name.clone(), addrs.clone())),
            _ => None,
        })
        .collect();
    written.sort();
    written
}

/// The Events posted, as (Service, reason), sorted (a pass posts them concurrently).
fn reasons(api: &FakeApi) -> Vec<(String, String)> {
    let mut posted: Vec<(String, String)> = api
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|(k, r, _)| (k.name.clone(), r.clone()))
        .collect();
    posted.sort();
    posted
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const T1: &str = "2026-12-03T10:00:00Z";
const T2: &str = "2026-12-03T10:00:05Z";

/// The k3s how-to: one address in `cidr-global`; the first Service gets it with one
/// conditional write, the second gets a PoolExhausted Warning, once.
#[tokio::test]
async fn the_how_to_pool_serves_the_first_service_and_tells_the_second_why_not() {
    let (mut a, api, _) = allocator(FakeProbe::default());
    let data = pools(&[("cidr-global", "192.0.2.65/32")]);
    let services = vec![
        service("first", T1, serde_json::json!({})),
        service("second", T2, serde_json::json!({})),
    ];
    let input = PassInput {
        services: &services,
        nodes: &[],
        pools: Some(&data),
    };
    let end = a.pass(&input, &|| true).await;
    assert_eq!(
        allocated(&api),
        [("first".to_string(), vec![ip("192.0.2.65")])]
    );
    assert_eq!(
        api.writes.lock().unwrap()[0].1,
        "10",
        "conditional on the resourceVersion"
    );
    assert_eq!(
        reasons(&api),
        [
            ("first".to_string(), REASON_ALLOCATED.to_string()),
            ("second".to_string(), REASON_POOL_EXHAUSTED.to_string())
        ]
    );
    assert!(end.again_in.is_some(), "a pending write is looked at again");
    // The cache has not caught up yet: the address is still counted as taken, nothing is
    // written again and no Event repeats.
    a.pass(&input, &|| true).await;
    assert_eq!(allocated(&api).len(), 1);
    assert_eq!(api.events.lock().unwrap().len(), 2);
}

/// An address another host answers for is never written; the Service gets the next one and
/// a Warning names the MAC.
#[tokio::test]
async fn an_answered_address_is_skipped_and_named() {
    let (mut a, api, probe) = allocator(FakeProbe {
        taken: vec![ip("192.0.2.70")],
        ..FakeProbe::default()
    });
    let data = pools(&[("range-global", "192.0.2.70-192.0.2.71")]);
    let services = vec![service("web", T1, serde_json::json!({}))];
    let input = PassInput {
        services: &services,
        nodes: &[],
        pools: Some(&data),
    };
    a.pass(&input, &|| true).await;
    assert_eq!(
        allocated(&api),
        [("web".to_string(), vec![ip("192.0.2.71")])]
    );
    assert_eq!(
        probe.asked.lock().unwrap().as_slice(),
        [ip("192.0.2.70"), ip("192.0.2.71")]
    );
    let events = api.events.lock().unwrap().clone();
    let in_use = events
        .iter()
        .find(|(_, r, _)| r == REASON_IN_USE)
        .expect("an AddressInUse Warning");
    assert!(
        in_use.2.contains("192.0.2.70") && in_use.2.contains("02:00:00:00:00:99"),
        "{}",
        in_use.2
    );
}

/// Past the Lease's fence nothing is written, and a stale write is decided again.
#[tokio::test]
async fn nothing_is_written_once_the_lease_may_be_lost_and_stale_writes_retry() {
    let (mut a, api, _) = allocator(FakeProbe::default());
    let data = pools(&[("cidr-global", "192.0.2.64/30")]);
    let services = vec![service("web", T1, serde_json::json!({}))];
    let input = PassInput {
        services: &services,
        nodes: &[],
        pools: Some(&data),
    };
    a.pass(&input, &|| false).await;
    assert!(api.writes.lock().unwrap().is_empty());
    *api.stale.lock().unwrap() = true;
    let end = a.pass(&input, &|| true).await;
    assert_eq!(api.writes.lock().unwrap().len(), 1);
    assert!(end.again_in.is_some_and(|d| d <= RETRY_MIN), "{end:?}");
    assert!(
        reasons(&api).is_empty(),
        "no AddressAllocated for a stale write"
    );
}

/// Nodes' own addresses and the control-plane VIP are never handed out; a Service with a
/// hand-set address inside the pool keeps it taken.
#[tokio::test]
async fn node_control_plane_and_hand_set_addresses_are_taken() {
    let (mut a, api, _) = allocator(FakeProbe::default());
    let data = pools(&[("range-global", "192.0.2.1-192.0.2.4")]);
    let services = vec![
        service(
            "pinned",
            T1,
            serde_json::json!({"spec": {"loadBalancerIP": "192.0.2.3"}}),
        ),
        service("web", T2, serde_json::json!({})),
    ];
    let nodes = [("node-a".to_string(), ip("192.0.2.2"))];
    let input = PassInput {
        services: &services,
        nodes: &nodes,
        pools: Some(&data),
    };
    a.pass(&input, &|| true).await;
    assert_eq!(
        allocated(&api),
        [("web".to_string(), vec![ip("192.0.2.4")])]
    );
}

/// No pool: one Warning that says how to make one; a Service with an address gets none.
#[tokio::test]
async fn without_a_pool_the_event_says_how_to_add_one() {
    let (mut a, api, _) = allocator(FakeProbe::default());
    let services = vec![
        service("web", T1, serde_json::json!({})),
        service(
            "set",
            T1,
            serde_json::json!({"metadata": {"annotations": {"kube-vip.io/loadbalancerIPs": "192.0.2.9"}}}),
        ),
    ];
    let input = PassInput {
        services: &services,
        nodes: &[],
        pools: None,
    };
    a.pass(&input, &|| true).await;
    a.pass(&input, &|| true).await;
    let events = api.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, REASON_NO_POOL);
    assert!(
        events[0].2.contains(
            "kubectl create configmap -n kube-system kubevip --from-literal cidr-global="
        ),
        "{}",
        events[0].2
    );
    // No ConfigMap at all: maybe another controller (Harvester's cloud provider) assigns
    // addresses here; a Normal Event says how to turn vipd's allocation off too (trial F9).
    assert_eq!(*api.kinds.lock().unwrap(), [EventKind::Normal]);
    assert!(events[0].2.contains("svc_ipam=false"), "{}", events[0].2);
    assert!(api.writes.lock().unwrap().is_empty());
    // A ConfigMap without a pool for the namespace: a Warning.
    let data = pools(&[("cidr-other", "192.0.2.64/30")]);
    let input = PassInput {
        services: &services,
        nodes: &[],
        pools: Some(&data),
    };
    a.pass(&input, &|| true).await;
    let kinds = api.kinds.lock().unwrap().clone();
    let events = api.events.lock().unwrap().clone();
    let web: Vec<_> = events
        .iter()
        .zip(&kinds)
        .filter(|((k, r, _), _)| k.name == "web" && r == REASON_NO_POOL)
        .map(|(_, kind)| *kind)
        .collect();
    assert_eq!(web, [EventKind::Normal, EventKind::Warning], "{events:?}");
}

/// A labelled Service turned into ClusterIP gives its pool address back (and the cleanup
/// finalizer goes with it); a labelled Service being deleted loses the finalizer.
#[tokio::test]
async fn release_and_finalizers() {
    let (mut a, api, _) = allocator(FakeProbe::default());
    let data = pools(&[("cidr-global", "192.0.2.64/28")]);
    let labelled = |ip: &str| {
        serde_json::json!({
            "metadata": {
                "labels": {"implementation": "kube-vip"},
                "annotations": {"kube-vip.io/loadbalancerIPs": ip},
                "finalizers": ["service.kubernetes.io/load-balancer-cleanup", "other"]
            }
        })
    };
    let mut turned = labelled("192.0.2.66");
    json_merge(
        &mut turned,
        serde_json::json!({"spec": {"type": "ClusterIP"}}),
    );
    let mut deleting = labelled("192.0.2.67");
    json_merge(
        &mut deleting,
        serde_json::json!({"metadata": {"deletionTimestamp": "2026-12-03T10:01:00Z"}}),
    );
    let services = vec![service("turned", T1, turned), service("gone", T1, deleting)];
    let input = PassInput {
        services: &services,
        nodes: &[],
        pools: Some(&data),
    };
    a.pass(&input, &|| true).await;
    let writes = api.writes.lock().unwrap().clone();
    assert!(
        writes.contains(&(
            ObjectKey::new("default", "turned"),
            "10".into(),
            Change::Release {
                finalizers: Some(vec!["other".into()])
            }
        )),
        "{writes:?}"
    );
    assert!(
        writes.contains(&(
            ObjectKey::new("default", "gone"),
            "10".into(),
            Change::Finalizers(vec!["other".into()])
        )),
        "{writes:?}"
    );
    assert_eq!(writes.len(), 2, "{writes:?}");
}

/// The API table grants what the allocator writes.
#[test]
fn the_api_table_lists_the_allocators_patch() {
    assert!(crate::kube::api::API_CALLS.iter().any(|c| {
        c.resource == "services" && c.verb == Verb::Patch && c.call_site.0 == "src/ipam/write.rs"
    }));
}

/// An address a Service showed and shows no more (here: deleted) is held back for the
/// Services lease duration, not even probed: its VIP holder may still answer for it, and
/// the probe took that answer for another host's (refused 60 s, a Warning naming a node's
/// MAC; lab S54). The Service waiting for it gets it once the hold ends.
#[tokio::test(start_paused = true)]
async fn a_released_address_is_held_back_for_the_lease_duration() {
    let (mut a, api, probe) = allocator(FakeProbe::default());
    let data = pools(&[("cidr-global", "192.0.2.65/32")]);
    let first = service(
        "first",
        T1,
        serde_json::json!({
            "metadata": {"annotations": {"kube-vip.io/loadbalancerIPs": "192.0.2.65"}},
            "spec": {"loadBalancerIP": "192.0.2.65"},
        }),
    );
    let second = service("second", T2, serde_json::json!({}));
    let both = vec![first, second.clone()];
    let input = PassInput {
        services: &both,
        nodes: &[],
        pools: Some(&data),
    };
    a.pass(&input, &|| true).await;
    assert!(allocated(&api).is_empty());
    let only = vec![second];
    let input = PassInput {
        services: &only,
        nodes: &[],
        pools: Some(&data),
    };
    let end = a.pass(&input, &|| true).await;
    let hold = settings().timing.lease_duration;
    assert!(allocated(&api).is_empty(), "handed out during the hold");
    assert!(
        probe.asked.lock().unwrap().is_empty(),
        "probed during the hold"
    );
    assert_eq!(
        end.again_in,
        Some(hold),
        "looked at again when the hold ends"
    );
    tokio::time::advance(hold - Duration::from_millis(1)).await;
    a.pass(&input, &|| true).await;
    assert!(allocated(&api).is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    a.pass(&input, &|| true).await;
    assert_eq!(
        allocated(&api),
        [("second".to_string(), vec![ip("192.0.2.65")])]
    );
    assert_eq!(probe.asked.lock().unwrap().as_slice(), [ip("192.0.2.65")]);
    assert!(!reasons(&api).iter().any(|(_, r)| r == REASON_IN_USE));
}

/// A pass makes its writes and posts its Events concurrently, never more at once than the
/// Services client lets wait for a response: 40 Services, 40 distinct addresses, 40
/// Events, at most 16 calls in flight and more than one.
#[tokio::test]
async fn a_pass_writes_concurrently_within_the_clients_limit() {
    let (mut a, api, _) = allocator(FakeProbe::default());
    let data = pools(&[("range-global", "192.0.2.1-192.0.2.100")]);
    let services: Vec<Arc<Service>> = (0..40)
        .map(|i| service(&format!("s{i:02}"), T1, serde_json::json!({})))
        .collect();
    let input = PassInput {
        services: &services,
        nodes: &[],
        pools: Some(&data),
    };
    a.pass(&input, &|| true).await;
    let written = allocated(&api);
    assert_eq!(written.len(), 40);
    let distinct: BTreeSet<IpAddr> = written.iter().flat_map(|(_, a)| a.clone()).collect();
    assert_eq!(distinct.len(), 40, "every address distinct: {written:?}");
    assert_eq!(
        reasons(&api)
            .iter()
            .filter(|(_, r)| r == REASON_ALLOCATED)
            .count(),
        40
    );
    let (now, most) = *api.in_flight.lock().unwrap();
    assert_eq!(now, 0);
    assert_eq!(
        most, WRITES_IN_FLIGHT,
        "at most the client's limit, and that many"
    );
}

/// One failed write in a pass backs the next pass off; a pass whose writes all go through
/// clears the back-off.
#[tokio::test]
async fn a_failed_write_backs_off_and_a_clean_pass_clears_it() {
    let (mut a, api, _) = allocator(FakeProbe::default());
    let data = pools(&[("range-global", "192.0.2.1-192.0.2.9")]);
    let services = vec![service("one", T1, serde_json::json!({}))];
    let input = PassInput {
        services: &services,
        nodes: &[],
        pools: Some(&data),
    };
    *api.fail.lock().unwrap() = true;
    a.pass(&input, &|| true).await;
    assert_eq!(a.retry_delay(), Some(RETRY_MIN));
    a.pass(&input, &|| true).await;
    assert_eq!(a.retry_delay(), Some(RETRY_MIN * 2));
    *api.fail.lock().unwrap() = false;
    a.pass(&input, &|| true).await;
    assert_eq!(a.retry_delay(), None);
    assert_eq!(
        allocated(&api).len(),
        3,
        "tried on every pass, written on the last"
    );
}
