//! Lab tests of the IPAM wing (issue 25): vipd allocates Service addresses from
//! kube-vip-cloud-provider's `kubevip` ConfigMap, with only the RBAC `vipd manifest rbac`
//! generates (the lab's node users have no other rights, `NodeRbac::None`). Named after the
//! scenarios in `docs/scenarios.md` (S54-S56).
//!
//! A recorder watches every Service from the lab's client namespace for the whole test, so
//! "never handed out" and "never changed once set" are checked on every version of every
//! Service the API server served, not on samples.
//!
//! Run as root: `cargo test --test lab_ipam` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};
use support::*;
use xtask::lab::{Lab, LabOptions, LabProcess, NodeRbac, Signal};

const ANN: &str = "kube-vip.io/loadbalancerIPs";
/// kube-vip-cloud-provider's Lease, which vipd's allocator campaigns for.
const IPAM_LEASE: &str = "kube-vip-cloud-controller";

/// A lab whose node users have exactly the generated ClusterRole.
fn ipam_lab(test: &str) -> Option<Lab> {
    let lab = lab(
        test,
        LabOptions {
            node_rbac: NodeRbac::None,
            ..LabOptions::default()
        },
    )?;
    apply_generated_role_to_nodes(&lab);
    Some(lab)
}

/// Creates ConfigMap `kube-system/kubevip` with `data`.
fn create_pools(lab: &Lab, data: &[(&str, &str)]) {
    let data: BTreeMap<&str, &str> = data.iter().copied().collect();
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kubevip", "namespace": "kube-system"},
        "data": data,
    });
    let r = lab
        .api_request(
            "POST",
            "/api/v1/namespaces/kube-system/configmaps",
            Some(&cm.to_string()),
        )
        .expect("create ConfigMap");
    assert_eq!(r.status, 201, "ConfigMap: {}", r.body);
}

/// A LoadBalancer Service with no address (80/TCP).
fn no_address(name: &str) -> Value {
    service_json(name, None, None, &[(80, "TCP")], false)
}

/// Service `ns/name` as JSON, or None.
fn get_in(lab: &Lab, ns: &str, name: &str) -> Option<Value> {
    let r = lab
        .api_request(
            "GET",
            &format!("/api/v1/namespaces/{ns}/services/{name}"),
            None,
        )
        .expect("get service");
    if r.status == 404 {
        return None;
    }
    assert_eq!(r.status, 200, "get {ns}/{name}: {}", r.body);
    Some(serde_json::from_str(&r.body).expect("service json"))
}

/// Every Service of namespace `ns`, by name.
fn list_in(lab: &Lab, ns: &str) -> BTreeMap<String, Value> {
    let r = lab
        .api_request("GET", &format!("/api/v1/namespaces/{ns}/services"), None)
        .expect("list services");
    assert_eq!(r.status, 200, "list {ns}: {}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("list json");
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s["metadata"]["name"].as_str().unwrap().to_string(), s))
        .collect()
}

/// What the allocator writes, as the Service shows it: (annotation, spec.loadBalancerIP,
/// label `implementation`).
fn written(svc: &Value) -> (Option<String>, Option<String>, Option<String>) {
    let s = |v: &Value| v.as_str().map(str::to_string);
    (
        s(&svc["metadata"]["annotations"][ANN]),
        s(&svc["spec"]["loadBalancerIP"]),
        s(&svc["metadata"]["labels"]["implementation"]),
    )
}

/// Waits until `ns/name` carries `addr` the way kube-vip-cloud-provider writes it.
fn wait_allocated(
    lab: &Lab,
    ns: &str,
    name: &str,
    addr: &str,
    limit: Duration,
    procs: &[LabProcess],
) {
    let want = (
        Some(addr.to_string()),
        Some(addr.to_string()),
        Some("kube-vip".to_string()),
    );
    let start = Instant::now();
    loop {
        let got = get_in(lab, ns, name).map(|s| written(&s));
        if got.as_ref() == Some(&want) {
            return;
        }
        if start.elapsed() > limit {
            dump(&procs.iter().collect::<Vec<_>>());
            panic!("{ns}/{name}: waited {limit:?} for {want:?}, has {got:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether an Event about `ns/name` of `kind` and `reason` contains `text`.
fn has_event(lab: &Lab, ns: &str, name: &str, kind: &str, reason: &str, text: &str) -> bool {
    events_in(lab, ns, name)
        .iter()
        .any(|(t, r, m)| t == kind && r == reason && m.contains(text))
}

/// Waits for the Event (dumping the logs on timeout).
fn wait_event(
    lab: &Lab,
    (ns, name): (&str, &str),
    (kind, reason, text): (&str, &str, &str),
    limit: Duration,
    procs: &[LabProcess],
) {
    let start = Instant::now();
    while !has_event(lab, ns, name, kind, reason, text) {
        if start.elapsed() > limit {
            dump(&procs.iter().collect::<Vec<_>>());
            panic!(
                "{ns}/{name}: no {kind} {reason} Event containing {text:?} after {limit:?}: {:?}",
                events_in(lab, ns, name)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// No vipd log says it was refused by the API server or panicked.
fn assert_clean_logs(procs: &[LabProcess]) {
    for p in procs {
        let log = p.log();
        assert!(
            !log.to_lowercase().contains("forbidden"),
            "{}: a forbidden call with the generated RBAC:\n{log}",
            p.name()
        );
        assert!(!log.contains("panicked"), "{}:\n{log}", p.name());
    }
}

/// One version of a Service as the recorder saw it: (annotation, spec.loadBalancerIP).
type Shown = (Option<String>, Option<String>);

/// Every Service's versions, from a watch of all Services run in ns client for the whole
/// test: key `namespace/name/uid`, consecutive equal versions kept once.
struct Recorder {
    seen: Arc<Mutex<BTreeMap<String, Vec<Shown>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<xtask::lab::Result<()>>>,
}

impl Recorder {
    /// Starts the watch; returns once its initial list is in.
    fn start(lab: &Lab) -> Recorder {
        let seen: Arc<Mutex<BTreeMap<String, Vec<Shown>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(AtomicBool::new(false));
        let kubeconfig = lab.admin_kubeconfig();
        let (s, st, r) = (seen.clone(), stop.clone(), ready.clone());
        let thread = xtask::lab::netns::spawn_in_netns(
            &lab.netns_path("client").unwrap(),
            "svc-recorder",
            move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(record(kubeconfig, s, st, r));
                Ok(())
            },
        )
        .expect("recorder thread");
        wait_until("the recorder's first list", Duration::from_secs(20), || {
            ready.load(Ordering::SeqCst)
        });
        Recorder {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn snapshot(&self) -> BTreeMap<String, Vec<Shown>> {
        self.seen.lock().unwrap().clone()
    }

    /// Every Service (`ns/name/uid`) that ever showed `addr`, in the annotation or the spec.
    fn ever_showed(&self, addr: &str) -> Vec<String> {
        self.snapshot()
            .into_iter()
            .filter(|(_, h)| {
                h.iter().any(|(a, s)| {
                    a.as_deref()
                        .is_some_and(|a| a.split(',').any(|x| x.trim() == addr))
                        || s.as_deref() == Some(addr)
                })
            })
            .map(|(k, _)| k)
            .collect()
    }

    /// How many Services showed an annotation so far.
    fn annotated(&self) -> usize {
        self.seen
            .lock()
            .unwrap()
            .values()
            .filter(|h| h.iter().any(|(a, _)| a.is_some()))
            .count()
    }

    fn stop(mut self) -> BTreeMap<String, Vec<Shown>> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("recorder thread").expect("recorder");
        }
        self.snapshot()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn record(
    kubeconfig: std::path::PathBuf,
    seen: Arc<Mutex<BTreeMap<String, Vec<Shown>>>>,
    stop: Arc<AtomicBool>,
    ready: Arc<AtomicBool>,
) {
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).expect("read kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("kubeconfig -> config");
    let client = kube::Client::try_from(cfg).expect("client");
    let api: Api<Service> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while !stop.load(Ordering::SeqCst) {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
        };
        let svc = match ev {
            Some(Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s))) => s,
            Some(Ok(watcher::Event::InitDone)) => {
                ready.store(true, Ordering::SeqCst);
                continue;
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                eprintln!("recorder: watch error (the watcher retries): {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            None => return,
        };
        let m = &svc.metadata;
        let key = format!(
            "{}/{}/{}",
            m.namespace.as_deref().unwrap_or_default(),
            m.name.as_deref().unwrap_or_default(),
            m.uid.as_deref().unwrap_or_default()
        );
        let shown: Shown = (
            m.annotations.as_ref().and_then(|a| a.get(ANN)).cloned(),
            svc.spec.as_ref().and_then(|s| s.load_balancer_ip.clone()),
        );
        let mut seen = seen.lock().unwrap();
        let h = seen.entry(key).or_default();
        if h.last() != Some(&shown) {
            h.push(shown);
        }
    }
}

/// The Nodes whose eth0 carries `ip` and the MACs that answer ARP for it from ns client
/// agree on one node: returns it.
fn one_announcer(lab: &Lab, ip: &str, watch: &xtask::lab::ArpWatcher) -> String {
    let h = single_holder(lab, ip, Duration::from_secs(20));
    let mac = lab.mac_of(&h).unwrap();
    wait_for(
        &format!("{ip} answered by {h} ({mac}) alone"),
        Duration::from_secs(10),
        || (watch.report().last_responders() == BTreeSet::from([mac])).then_some(()),
    );
    h
}

/// S54: the k3s how-to with vipd alone. `kubectl create configmap -n kube-system kubevip
/// --from-literal cidr-global=192.0.2.54/32` and a LoadBalancer Service with no address:
/// the address is written as kube-vip-cloud-provider writes it (annotation,
/// spec.loadBalancerIP, label) with an `AddressAllocated` Event, one node announces it and
/// answers ARP for it; a second Service stays without address with a `PoolExhausted`
/// Warning, and gets the address once the first is deleted. Never two responders.
#[test]
fn s54_kubevip_configmap_how_to() {
    let Some(lab) = ipam_lab("s54") else { return };
    let t0 = Instant::now();
    const IP: &str = "192.0.2.54";
    create_pools(&lab, &[("cidr-global", "192.0.2.54/32")]);
    let recorder = Recorder::start(&lab);
    let procs: Vec<LabProcess> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[]))
        .collect();
    let watch = lab
        .arp_watch(IP.parse().unwrap(), Duration::from_millis(50))
        .expect("arp watch");
    create_service(&lab, &no_address("first"));
    wait_allocated(
        &lab,
        "default",
        "first",
        IP,
        Duration::from_secs(30),
        &procs,
    );
    eprintln!("S54: allocated {:?} after start", t0.elapsed());
    wait_event(
        &lab,
        ("default", "first"),
        ("Normal", "AddressAllocated", IP),
        Duration::from_secs(10),
        &procs,
    );
    let first_holder = one_announcer(&lab, IP, &watch);
    wait_for("first's status", Duration::from_secs(10), || {
        (ingress_ips(&lab, "first") == vec![IP.to_string()]).then_some(())
    });

    create_service(&lab, &no_address("second"));
    wait_event(
        &lab,
        ("default", "second"),
        ("Warning", "PoolExhausted", "cidr-global"),
        Duration::from_secs(15),
        &procs,
    );
    assert_eq!(
        get_in(&lab, "default", "second").map(|s| written(&s)),
        Some((None, None, None)),
        "second must stay without address while first has it"
    );
    assert_eq!(holders(&lab, IP), vec![first_holder.clone()]);

    delete_service(&lab, "first");
    let t_del = Instant::now();
    wait_allocated(
        &lab,
        "default",
        "second",
        IP,
        Duration::from_secs(30),
        &procs,
    );
    eprintln!(
        "S54: second allocated {:?} after first was deleted",
        t_del.elapsed()
    );
    let second_holder = one_announcer(&lab, IP, &watch);
    eprintln!("S54: announced by {first_holder}, then {second_holder}");
    wait_for("second's status", Duration::from_secs(10), || {
        (ingress_ips(&lab, "second") == vec![IP.to_string()]).then_some(())
    });
    let report = watch.stop().expect("arp watch");
    assert!(
        report.multi_responder_intervals().is_empty(),
        "{IP} answered by two MACs at once: {:?}",
        report.multi_responder_intervals()
    );
    // Each Service showed one address, the pool's, and never another.
    for (key, history) in recorder.stop() {
        for (a, s) in &history {
            for v in [a, s].into_iter().flatten() {
                assert_eq!(v, IP, "{key} showed {v}: {history:?}");
            }
        }
    }
    assert!(
        !events_in(&lab, "default", "second")
            .iter()
            .any(|(_, r, _)| r == "AddressInUse"),
        "the address handed over was taken for another host's: {:?}",
        events_in(&lab, "default", "second")
    );
    assert_clean_logs(&procs);
    eprintln!("S54: {:?}", t0.elapsed());
}

/// S55: a host outside the cluster (ns dhcp, no DHCP server running) answers for
/// 192.0.2.56, the lower address of the pool `range-global=192.0.2.56-192.0.2.57`. The
/// allocator's probe hears it: the Service gets 192.0.2.57 and an `AddressInUse` Warning
/// naming the host's MAC; a second Service gets `PoolExhausted` rather than the answered
/// address; no Service ever shows 192.0.2.56 and no node carries it.
#[test]
fn s55_pool_address_answered_by_another_host_is_never_handed_out() {
    let Some(lab) = ipam_lab("s55") else { return };
    let t0 = Instant::now();
    const TAKEN: &str = "192.0.2.56";
    const FREE: &str = "192.0.2.57";
    lab.exec(
        "dhcp",
        "ip",
        &["addr", "add", "192.0.2.56/24", "dev", "eth0"],
    )
    .expect("the host's address");
    let host_mac = lab.mac_of("dhcp").expect("mac").to_string();
    create_pools(&lab, &[("range-global", "192.0.2.56-192.0.2.57")]);
    let recorder = Recorder::start(&lab);
    let procs: Vec<LabProcess> = ["node-a", "node-b"]
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[]))
        .collect();
    create_service(&lab, &no_address("web"));
    wait_allocated(
        &lab,
        "default",
        "web",
        FREE,
        Duration::from_secs(30),
        &procs,
    );
    wait_event(
        &lab,
        ("default", "web"),
        ("Warning", "AddressInUse", &host_mac),
        Duration::from_secs(10),
        &procs,
    );
    assert!(
        has_event(&lab, "default", "web", "Warning", "AddressInUse", TAKEN),
        "the Warning names the address: {:?}",
        events_in(&lab, "default", "web")
    );
    let watch = lab
        .arp_watch(FREE.parse().unwrap(), Duration::from_millis(50))
        .expect("arp watch");
    one_announcer(&lab, FREE, &watch);
    drop(watch);

    create_service(&lab, &no_address("second"));
    wait_event(
        &lab,
        ("default", "second"),
        ("Warning", "PoolExhausted", "range-global"),
        Duration::from_secs(15),
        &procs,
    );
    // A few passes later (Events, status writes and renewals all wake the allocator):
    // still nothing on the answered address.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        assert_eq!(
            get_in(&lab, "default", "second").map(|s| written(&s)),
            Some((None, None, None))
        );
        assert!(holders(&lab, TAKEN).is_empty(), "a node carries {TAKEN}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let shown = recorder.ever_showed(TAKEN);
    assert!(shown.is_empty(), "{TAKEN} was written to {shown:?}");
    recorder.stop();
    assert_clean_logs(&procs);
    eprintln!("S55: {:?}", t0.elapsed());
}

/// The pools of S56: a global range, a namespace CIDR pool and a namespace range pool,
/// both overlapping the global one. `range-ipam-b` applies because the global pool is a
/// range (KVCP precedence: `cidr-<ns>` > `cidr-global` > `range-<ns>` > `range-global`).
const S56_POOLS: [(&str, &str); 3] = [
    (
        "range-global",
        "192.0.2.20-192.0.2.99,192.0.2.101-192.0.2.199",
    ),
    ("cidr-ipam-a", "192.0.2.32/27,192.0.2.128/26"),
    (
        "range-ipam-b",
        "192.0.2.90-192.0.2.99,192.0.2.200-192.0.2.254",
    ),
];
const S56_NAMESPACES: [&str; 4] = ["ipam-a", "ipam-b", "ipam-c", "ipam-d"];
const S56_SERVICES: usize = 200;
/// The hand-set address: the first one the global pool would hand out.
const S56_HAND_SET: &str = "192.0.2.20";

/// Whether `addr` is in the pool S56 gives namespace `ns`.
fn s56_in_pool(ns: &str, addr: Ipv4Addr) -> bool {
    let last = addr.octets()[3];
    let prefix = addr.octets()[..3] == [192, 0, 2];
    prefix
        && match ns {
            "ipam-a" => (32..=63).contains(&last) || (128..=191).contains(&last),
            "ipam-b" => (90..=99).contains(&last) || (200..=254).contains(&last),
            _ => (20..=99).contains(&last) || (101..=199).contains(&last),
        }
}

/// S56: no duplicate under concurrency. 3 vipd nodes; overlapping pools (S56_POOLS: a and b
/// have their own, c and d the global one); a Service with a hand-set spec.loadBalancerIP
/// (192.0.2.20, the global pool's first address) created first; then 200 Services created
/// in parallel across the four namespaces; the allocator's holder (the Lease
/// kube-system/kube-vip-cloud-controller) SIGKILLed once 40 have an address. Every
/// Service ends with an address of its namespace's pool; all distinct, none the hand-set
/// one; every Service's annotation, once set, never changed (every version the API server
/// served, watched from the client); at most one `AddressAllocated` Event per Service.
/// Pool sizes: every demand fits whatever the order (global 101 + a 50 + b ≤ 10 of 179
/// global addresses; a keeps ≥ 60 of its 96, b ≥ 55 of its 65).
#[test]
fn s56_no_duplicate_under_concurrency() {
    let Some(lab) = ipam_lab("s56") else { return };
    let t0 = Instant::now();
    for ns in S56_NAMESPACES {
        create_namespace(&lab, ns);
    }
    create_pools(&lab, &S56_POOLS);
    let recorder = Recorder::start(&lab);
    // One lease for every Service VIP (svc_election=false): the API server's load is the
    // allocator's, not 600 per-Service campaigns.
    let mut procs: Vec<LabProcess> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, false, &[]))
        .collect();
    let holder = wait_for("an allocator", Duration::from_secs(30), || {
        lease_holder(&lab, "kube-system", IPAM_LEASE).filter(|h| !h.is_empty())
    });
    create_service(
        &lab,
        &service_json("hand-set", None, Some(S56_HAND_SET), &[(80, "TCP")], false),
    );

    let created = AtomicUsize::new(0);
    let (killed, at_kill) = std::thread::scope(|scope| {
        for t in 0..10 {
            let (lab, created) = (&lab, &created);
            scope.spawn(move || {
                for i in (t..S56_SERVICES).step_by(10) {
                    let ns = S56_NAMESPACES[i % S56_NAMESPACES.len()];
                    create_service_in(lab, ns, &no_address(&format!("s{i:03}")));
                    created.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        wait_until("40 Services allocated", Duration::from_secs(60), || {
            recorder.annotated() >= 40
        });
        // The holder may have changed since start (it is read again right before the kill).
        let holder = lease_holder(&lab, "kube-system", IPAM_LEASE).unwrap_or(holder);
        let i = NODES.iter().position(|n| *n == holder).expect("a node");
        procs[i].signal(Signal::SIGKILL).expect("SIGKILL");
        let at_kill = (recorder.annotated(), created.load(Ordering::SeqCst));
        (holder, at_kill)
    });
    eprintln!(
        "S56: SIGKILLed the allocator {killed} with {} Services allocated, {} created ({:?})",
        at_kill.0,
        at_kill.1,
        t0.elapsed()
    );
    assert!(
        at_kill.0 < S56_SERVICES,
        "the allocator finished before the kill: not midway"
    );
    let t_kill = Instant::now();
    let next = wait_for("another allocator", Duration::from_secs(30), || {
        lease_holder(&lab, "kube-system", IPAM_LEASE).filter(|h| !h.is_empty() && *h != killed)
    });

    // Every Service gets an address (all fit: see the pool sizes above).
    let start = Instant::now();
    let services = loop {
        let all: Vec<(String, Value)> = S56_NAMESPACES
            .iter()
            .flat_map(|ns| {
                list_in(&lab, ns)
                    .into_values()
                    .map(move |s| (ns.to_string(), s))
            })
            .collect();
        let missing = all.iter().filter(|(_, s)| written(s).0.is_none()).count();
        if all.len() == S56_SERVICES && missing == 0 {
            break all;
        }
        if start.elapsed() > Duration::from_secs(60) {
            dump(&procs.iter().collect::<Vec<_>>());
            panic!("{missing} of {} Services still without address", all.len());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "S56: all {S56_SERVICES} allocated {:?} after the kill ({next} took over), {:?} in all",
        t_kill.elapsed(),
        t0.elapsed()
    );

    // Distinct, in the right pool, written as kube-vip-cloud-provider writes it.
    let mut owner: BTreeMap<Ipv4Addr, String> = BTreeMap::new();
    for (ns, s) in &services {
        let name = s["metadata"]["name"].as_str().unwrap();
        let (ann, spec, label) = written(s);
        let ann = ann.unwrap();
        let addr: Ipv4Addr = ann
            .parse()
            .unwrap_or_else(|_| panic!("{ns}/{name}: annotation {ann:?}"));
        assert_eq!(spec.as_deref(), Some(ann.as_str()), "{ns}/{name}");
        assert_eq!(label.as_deref(), Some("kube-vip"), "{ns}/{name}");
        assert_ne!(ann, S56_HAND_SET, "{ns}/{name} got the hand-set address");
        assert!(s56_in_pool(ns, addr), "{ns}/{name}: {addr} not in its pool");
        if let Some(other) = owner.insert(addr, format!("{ns}/{name}")) {
            panic!("{addr} handed out twice: {other} and {ns}/{name}");
        }
    }
    let hand_set = get_in(&lab, "default", "hand-set").unwrap();
    assert_eq!(
        written(&hand_set),
        (None, Some(S56_HAND_SET.to_string()), None),
        "the hand-set Service is left alone"
    );

    // Once set, never changed: every version of every Service the recorder saw.
    let history = recorder.stop();
    let mut recorded = 0;
    for (key, versions) in &history {
        if key.starts_with("default/") {
            continue;
        }
        recorded += 1;
        let values: Vec<&Shown> = versions
            .iter()
            .filter(|(a, s)| a.is_some() || s.is_some())
            .collect();
        let first = values
            .first()
            .unwrap_or_else(|| panic!("{key}: never allocated"));
        assert!(
            values.iter().all(|v| v == first),
            "{key} changed after it was set: {versions:?}"
        );
        assert!(
            !versions
                .iter()
                .skip_while(|v| v.0.is_none())
                .any(|v| v.0.is_none()),
            "{key}: annotation removed after it was set: {versions:?}"
        );
    }
    assert_eq!(recorded, S56_SERVICES, "the recorder saw every Service");

    // One AddressAllocated Event per Service at most: none only where the killed holder
    // wrote the address and died before its Event (each Event follows its write in the same
    // call, and at most 16 writes are in flight, the Services client's limit).
    let mut allocated_events = 0;
    for ns in S56_NAMESPACES {
        let r = lab
            .api_request(
                "GET",
                &format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
                None,
            )
            .expect("events");
        let v: Value = serde_json::from_str(&r.body).unwrap_or_default();
        let mut per_service: BTreeMap<String, u64> = BTreeMap::new();
        for e in v["items"].as_array().cloned().unwrap_or_default() {
            if e["reason"] == "AddressAllocated" {
                // A repeated Event is one object with a series count.
                let n = e["series"]["count"].as_u64().unwrap_or(1);
                *per_service
                    .entry(e["regarding"]["name"].as_str().unwrap_or_default().into())
                    .or_default() += n;
            }
        }
        for (name, n) in &per_service {
            assert_eq!(*n, 1, "{ns}/{name}: {n} AddressAllocated Events");
        }
        allocated_events += per_service.len();
    }
    eprintln!("S56: {allocated_events} AddressAllocated Events for {S56_SERVICES} Services");
    assert!(
        allocated_events >= S56_SERVICES - 16,
        "{allocated_events} Events"
    );

    let killed_i = NODES.iter().position(|n| *n == killed).unwrap();
    let survivors: Vec<LabProcess> = procs
        .drain(..)
        .enumerate()
        .filter(|(i, _)| *i != killed_i)
        .map(|(_, p)| p)
        .collect();
    assert_clean_logs(&survivors);
    eprintln!("S56: {:?}", t0.elapsed());
}
