//! Foundation lab tests: a kube-rs client inside node-b's namespace against the
//! lab's real kube-apiserver v1.20.2, the ARP watcher and capture, and process signals.
//!
//! Run as root: `cargo test --test lab_foundation` (or `cargo xtask test`). Without root
//! these tests fail with an explanation unless `VIPD_SKIP_LAB=1` is set.

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Event as CoreEvent, ObjectReference,
    Service,
};
use k8s_openapi::api::events::v1::Event as EventsV1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, ListParams, PostParams};
use support::{block_on_in, wait_until};
use xtask::lab::{self, ArpOp, Lab, LabOptions, Signal};

async fn node_client(path: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("kubeconfig -> config");
    kube::Client::try_from(cfg).expect("client")
}

fn api_status(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Creates Lease kube-system/lab-foundation held by node-b, reads it back, replaces it
/// conditionally (new resourceVersion) and checks that a replace with the stale
/// resourceVersion gets 409 and changes nothing. Returns the current resourceVersion.
async fn lease_create_replace_and_stale_conflict(client: kube::Client) -> String {
    let leases: Api<Lease> = Api::namespaced(client, "kube-system");
    let now = k8s_openapi::jiff::Timestamp::now();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("lab-foundation".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("node-b".into()),
            lease_duration_seconds: Some(5),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    };
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let rv1 = created.metadata.resource_version.clone().unwrap();

    // Read back.
    let got = leases.get("lab-foundation").await.unwrap();
    let spec = got.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-b"));
    assert_eq!(spec.lease_duration_seconds, Some(5));
    assert_eq!(got.metadata.resource_version.as_deref(), Some(rv1.as_str()));

    // Conditional replace: the body carries resourceVersion rv1 (a precondition).
    let mut renewed = got.clone();
    if let Some(s) = renewed.spec.as_mut() {
        s.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        s.holder_identity = Some("node-b".into());
    }
    let replaced = leases
        .replace("lab-foundation", &PostParams::default(), &renewed)
        .await
        .unwrap();
    let rv2 = replaced.metadata.resource_version.clone().unwrap();
    assert_ne!(rv1, rv2, "a replace must produce a new resourceVersion");

    // Replace with the stale resourceVersion rv1: 409 Conflict, lease unchanged.
    let mut stale = got.clone();
    if let Some(s) = stale.spec.as_mut() {
        s.holder_identity = Some("thief".into());
    }
    let err = leases
        .replace("lab-foundation", &PostParams::default(), &stale)
        .await
        .expect_err("a stale resourceVersion must be rejected");
    assert_eq!(api_status(&err), Some(409), "got {err:?}");
    let after = leases.get("lab-foundation").await.unwrap();
    assert_eq!(
        after.spec.unwrap().holder_identity.as_deref(),
        Some("node-b")
    );
    assert_eq!(
        after.metadata.resource_version.as_deref(),
        Some(rv2.as_str())
    );

    rv2
}

/// Lists Services until default/kubernetes exists (at most 10 s).
async fn wait_for_kubernetes_service(client: kube::Client) {
    // Services: the API server creates default/kubernetes itself, shortly after it
    // reports ready (its controller runs in the background): list until it is there.
    let services: Api<Service> = Api::namespaced(client, "default");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let list = services.list(&ListParams::default()).await.unwrap();
        if list
            .items
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some("kubernetes"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "default/kubernetes service missing after 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Creates core v1 Endpoints default/lab-foundation (192.0.2.12 on node-b, port 80).
async fn create_endpoints(client: kube::Client) {
    // Core v1 Endpoints.
    let endpoints: Api<Endpoints> = Api::namespaced(client, "default");
    let ep = Endpoints {
        metadata: ObjectMeta {
            name: Some("lab-foundation".into()),
            ..Default::default()
        },
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: "192.0.2.12".into(),
                node_name: Some("node-b".into()),
                ..Default::default()
            }]),
            ports: Some(vec![EndpointPort {
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }]),
    };
    let ep = endpoints.create(&PostParams::default(), &ep).await.unwrap();
    assert_eq!(
        ep.subsets.unwrap()[0].addresses.as_ref().unwrap()[0].ip,
        "192.0.2.12"
    );
}

/// Creates a core v1 Event and an events.k8s.io/v1 Event about default/kubernetes.
async fn create_events(client: kube::Client) {
    // Core v1 Event.
    let involved = ObjectReference {
        kind: Some("Service".into()),
        namespace: Some("default".into()),
        name: Some("kubernetes".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    };
    let core_events: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let ev = CoreEvent {
        metadata: ObjectMeta {
            generate_name: Some("lab-foundation-".into()),
            ..Default::default()
        },
        involved_object: involved.clone(),
        reason: Some("LabFoundation".into()),
        message: Some("core v1 event from node-b".into()),
        type_: Some("Normal".into()),
        first_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        last_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        count: Some(1),
        ..Default::default()
    };
    let ev = core_events
        .create(&PostParams::default(), &ev)
        .await
        .unwrap();
    assert_eq!(ev.reason.as_deref(), Some("LabFoundation"));

    // events.k8s.io/v1 Event (served by v1.20).
    let events: Api<EventsV1> = Api::namespaced(client.clone(), "default");
    let ev = EventsV1 {
        metadata: ObjectMeta {
            generate_name: Some("lab-foundation-".into()),
            ..Default::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        reporting_controller: Some("vipd.dev/lab".into()),
        reporting_instance: Some("node-b".into()),
        action: Some("Test".into()),
        reason: Some("LabFoundation".into()),
        note: Some("events.k8s.io/v1 event from node-b".into()),
        type_: Some("Normal".into()),
        regarding: Some(involved),
        ..Default::default()
    };
    let ev = events.create(&PostParams::default(), &ev).await.unwrap();
    assert_eq!(ev.reason.as_deref(), Some("LabFoundation"));
}

#[test]
fn kube_client_in_node_b_namespace_uses_leases_and_core_objects() {
    let Some(lab) = support::lab(
        "kube_client_in_node_b_namespace_uses_leases_and_core_objects",
        LabOptions::default(),
    ) else {
        return;
    };
    let kubeconfig = lab.kubeconfig("node-b").unwrap();
    let local_kubeconfig = lab.local_kubeconfig("node-b").unwrap();
    let (kc, local_kc) = (&kubeconfig, &local_kubeconfig);
    block_on_in(&lab, "node-b", move || async move {
        let client = node_client(kc).await;
        let rv2 = lease_create_replace_and_stale_conflict(client.clone()).await;
        wait_for_kubernetes_service(client.clone()).await;
        create_endpoints(client.clone()).await;
        create_events(client).await;
        // The node's local API server (127.0.0.1:6443 proxy) serves the same API.
        let local = node_client(local_kc).await;
        let leases_local: Api<Lease> = Api::namespaced(local, "kube-system");
        let via_local = leases_local.get("lab-foundation").await.unwrap();
        assert_eq!(
            via_local.metadata.resource_version.as_deref(),
            Some(rv2.as_str())
        );
    });

    // Node users are not cluster-admin by themselves: without the lab's binding, node-b is
    // forbidden (403).
    let r = lab
        .api_request(
            "DELETE",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/vipd-lab-nodes",
            None,
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let forbidden = block_on_in(&lab, "node-b", move || async move {
        let leases: Api<Lease> = Api::namespaced(node_client(kc).await, "kube-system");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match leases.get("lab-foundation").await {
                Err(e) if api_status(&e) == Some(403) => return true,
                _ if Instant::now() > deadline => return false,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    assert!(forbidden, "node-b must get 403 once its binding is gone");
}

#[test]
fn arp_watcher_counts_responders_and_capture_sees_arping() {
    let Some(lab) = support::lab(
        "arp_watcher_counts_responders_and_capture_sees_arping",
        LabOptions {
            local_api: false,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    let mac_a = lab.mac_of("node-a").unwrap();
    let mac_b = lab.mac_of("node-b").unwrap();
    assert_eq!(lab.ns_of_mac(mac_a).as_deref(), Some("node-a"));

    let probe = |target: IpAddr| {
        let w = lab.arp_watch(target, lab::DEFAULT_WATCH_INTERVAL).unwrap();
        wait_until("20 probe slots", Duration::from_secs(10), || {
            w.report().slots.len() >= 21
        });
        w.stop().unwrap()
    };
    let own = probe(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 11)));
    assert_eq!(own.max_simultaneous_responders(), 1, "{own:?}");
    assert_eq!(
        own.all_responders().into_iter().collect::<Vec<_>>(),
        vec![mac_a]
    );
    assert!(
        own.answered_slots() >= 15,
        "node-a answered only {} slots",
        own.answered_slots()
    );
    assert!(own.multi_responder_intervals().is_empty());

    let unused = probe(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77)));
    assert_eq!(unused.max_simultaneous_responders(), 0, "{unused:?}");
    assert!(unused.slots.len() >= 20);

    let v6 = probe(IpAddr::V6(lab::node_ipv6("node-b").unwrap()));
    assert_eq!(
        v6.all_responders().into_iter().collect::<Vec<_>>(),
        vec![mac_b]
    );
    assert_eq!(v6.max_simultaneous_responders(), 1);

    // Capture on the client sees node-a's arping for node-b (a broadcast request).
    xtask::lab::control_plane::ensure_packages(&[("arping", "arping")])
        .expect("arping (Debian package arping; run as root to install it)");
    let cap = lab.start_capture().unwrap();
    // Thomas Habets' arping (Debian `arping`) takes `-i IFACE`, iputils-arping `-I IFACE`;
    // try both, the wrong one exits with a usage error and sends nothing.
    let mut out = Vec::new();
    for iface_flag in ["-i", "-I"] {
        let o = lab
            .exec_unchecked(
                "node-a",
                "arping",
                &["-c", "1", iface_flag, "eth0", "192.0.2.12"],
            )
            .unwrap();
        out.extend_from_slice(&o.stdout);
        out.extend_from_slice(&o.stderr);
        if o.status.success() {
            break;
        }
    }
    let want = |f: &lab::ArpFrame| {
        f.op == ArpOp::Request
            && f.sender_mac == mac_a
            && f.sender_ip == IpAddr::V4(Ipv4Addr::new(192, 0, 2, 11))
            && f.target_ip == IpAddr::V4(Ipv4Addr::new(192, 0, 2, 12))
    };
    wait_until(
        "node-a's ARP request in the capture",
        Duration::from_secs(5),
        || cap.frames().iter().any(want),
    );
    let frames = cap.stop().unwrap();
    assert!(
        frames.iter().any(want),
        "arping output: {}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn lab_process_signals_stop_and_resume_it() {
    let Some(lab) = support::lab(
        "lab_process_signals_stop_and_resume_it",
        LabOptions {
            local_api: false,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    // etcd (a lab dependency anyway) as a process that answers HTTP on node-a's loopback.
    let data = lab.dir().join("etcd-signal-test");
    let data = data.to_string_lossy().into_owned();
    let mut etcd = lab
        .spawn(
            "node-a",
            "etcd",
            &[
                "--name",
                "sig",
                "--data-dir",
                &data,
                "--listen-client-urls",
                "http://127.0.0.1:12379",
                "--advertise-client-urls",
                "http://127.0.0.1:12379",
                "--listen-peer-urls",
                "http://127.0.0.1:12380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:12380",
                "--initial-cluster",
                "sig=http://127.0.0.1:12380",
            ],
            &[],
        )
        .unwrap();
    let health = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 12379);
    let answers = |timeout: Duration| {
        lab.http_get("node-a", health, "/health", timeout)
            .map(|b| b.contains("health"))
            .unwrap_or(false)
    };
    wait_until("etcd in node-a to answer", Duration::from_secs(20), || {
        answers(Duration::from_millis(500))
    });
    // Not reachable from the root namespace: it runs in node-a's own loopback.
    assert!(std::net::TcpStream::connect_timeout(&health, Duration::from_millis(200)).is_err());

    etcd.signal(Signal::SIGSTOP).unwrap();
    // kill(2) returns before every thread has stopped; a request served in between is not
    // the process answering while stopped (CI saw it once). Wait for the group stop.
    let pid = etcd.pid();
    wait_until("every etcd thread stopped", Duration::from_secs(5), || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.flatten().all(|t| {
                    std::fs::read_to_string(t.path().join("stat"))
                        .ok()
                        .and_then(|st| st.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
                        .unwrap_or(false)
                })
            })
            .unwrap_or(false)
    });
    assert!(
        !answers(Duration::from_secs(1)),
        "a SIGSTOPped process must not answer"
    );
    etcd.signal(Signal::SIGCONT).unwrap();
    wait_until(
        "etcd to answer again after SIGCONT",
        Duration::from_secs(10),
        || answers(Duration::from_millis(500)),
    );

    etcd.signal(Signal::SIGTERM).unwrap();
    let st = etcd.wait_timeout(Duration::from_secs(15)).unwrap();
    assert!(st.is_some(), "etcd did not exit on SIGTERM");
    assert!(
        etcd.signal(Signal::SIGTERM).is_err(),
        "signalling a reaped process is an error"
    );

    let mut sleeper = lab.spawn("node-b", "sleep", &["1000"], &[]).unwrap();
    assert!(
        sleeper
            .wait_timeout(Duration::from_millis(100))
            .unwrap()
            .is_none()
    );
    sleeper.signal(Signal::SIGKILL).unwrap();
    let st = sleeper
        .wait_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(9));

    // The log captures output, the environment is passed.
    let mut echo = lab
        .spawn(
            "node-c",
            "sh",
            &["-c", "echo hello $GREETING_TARGET"],
            &[("GREETING_TARGET", "lab")],
        )
        .unwrap();
    etcd_log_has_content(&lab);
    assert!(
        echo.wait_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap()
            .success()
    );
    assert_eq!(echo.log().trim(), "hello lab");
}

fn etcd_log_has_content(lab: &Lab) {
    let logs: Vec<_> = std::fs::read_dir(lab.dir().join("logs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(logs.iter().any(|l| l.contains("node-a-etcd")), "{logs:?}");
}

#[test]
fn cut_link_removes_carrier_and_partition_blocks_traffic() {
    let Some(lab) = support::lab(
        "cut_link_removes_carrier_and_partition_blocks_traffic",
        LabOptions {
            http_backends: true,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    let a = SocketAddr::new(IpAddr::V4(lab::node_ipv4("node-a").unwrap()), 80);
    let get = |to: SocketAddr| lab.http_get("client", to, "/", Duration::from_millis(500));
    assert_eq!(get(a).unwrap().trim(), "node-a");
    let carrier = || {
        let out = lab
            .exec("node-a", "ip", &["-j", "link", "show", "eth0"])
            .unwrap();
        !String::from_utf8_lossy(&out.stdout).contains("NO-CARRIER")
    };
    assert!(carrier());
    lab.cut_link("node-a").unwrap();
    wait_until("node-a to lose carrier", Duration::from_secs(5), || {
        !carrier()
    });
    assert!(get(a).is_err());
    lab.restore_link("node-a").unwrap();
    wait_until("node-a carrier back", Duration::from_secs(5), carrier);
    wait_until("node-a reachable again", Duration::from_secs(5), || {
        get(a).is_ok()
    });

    // Partition: carrier stays, but neither the client nor the API server is reachable.
    lab.partition("node-a").unwrap();
    assert!(carrier());
    assert!(get(a).is_err());
    let api = SocketAddr::new(IpAddr::V4(lab::API_IP), lab::API_PORT);
    let reach_api = |ns: &str| {
        lab.in_netns(ns, || {
            std::net::TcpStream::connect_timeout(&api, Duration::from_millis(500)).is_ok()
        })
        .unwrap()
    };
    assert!(!reach_api("node-a"));
    assert!(reach_api("node-b"));
    lab.heal("node-a").unwrap();
    wait_until(
        "node-a reachable after heal",
        Duration::from_secs(5),
        || get(a).is_ok(),
    );

    // The local API proxy goes down and comes back on request (scenario S10 support).
    let local = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), lab::API_PORT);
    let reach_local = || {
        lab.in_netns("node-b", || {
            std::net::TcpStream::connect_timeout(&local, Duration::from_millis(500)).is_ok()
        })
        .unwrap()
    };
    assert!(lab.local_api_running("node-b"));
    assert!(reach_local());
    lab.stop_local_api("node-b").unwrap();
    assert!(!reach_local(), "stopped local API must refuse connections");
    lab.start_local_api("node-b").unwrap();
    assert!(reach_local());

    let addrs = lab.addresses("node-a", "eth0").unwrap();
    assert!(
        addrs
            .iter()
            .any(|x| x.addr == IpAddr::V4(Ipv4Addr::new(192, 0, 2, 11))
                && x.prefix == 24
                && !x.has_flag("secondary"))
    );
    assert!(
        addrs
            .iter()
            .any(|x| x.addr == IpAddr::V6(lab::node_ipv6("node-a").unwrap()))
    );
}

#[test]
fn pods_reach_the_client_from_their_own_addresses() {
    let Some(lab) = support::lab(
        "pods_reach_the_client_from_their_own_addresses",
        LabOptions {
            local_api: false,
            pods: true,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    let client = lab.netns_path("client").unwrap();
    let v4 = SocketAddr::new(IpAddr::V4(lab::CLIENT_V4), 8080);
    let v6 = SocketAddr::new(IpAddr::V6(lab::CLIENT_V6), 8080);
    let _echo4 = lab::ThreadServer::echo(&client, "echo-v4", v4).unwrap();
    let _echo6 = lab::ThreadServer::echo(&client, "echo-v6", v6).unwrap();
    let t = Duration::from_secs(3);
    for node in lab::NODES {
        let pod = lab::pod_of(node).unwrap();
        let (pod4, pod6) = (lab::pod_ipv4(node).unwrap(), lab::pod_ipv6(node).unwrap());
        // No NAT anywhere: the client sees the pod's own addresses, and its replies go back
        // through the node.
        assert_eq!(lab.http_get(pod, v4, "/", t).unwrap(), format!("{pod4}\n"));
        assert_eq!(lab.http_get(pod, v6, "/", t).unwrap(), format!("{pod6}\n"));
    }
    // The node itself reaches the echo from its own address, or an explicit one of its own.
    let node_a = IpAddr::V4(lab::node_ipv4("node-a").unwrap());
    assert_eq!(
        lab.http_get_from("node-a", node_a, v4, "/", t).unwrap(),
        format!("{node_a}\n")
    );
    // A source the namespace does not have cannot be bound.
    assert!(
        lab.http_get_from("pod-a", IpAddr::V4(lab::CLIENT_V4), v4, "/", t)
            .is_err()
    );
}
