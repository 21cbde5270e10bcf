use super::*;
use crate::kube::events::{API_TIMEOUT, MAX_NOTE_BYTES, event_name, truncate_note};
use crate::services::plan::model::PortProto;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service};
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
    let e = ServiceEvent::address_in_use(ip("192.0.2.70"), "02:00:00:00:00:01", "node-a");
    assert_eq!(
        (e.kind, e.reason.as_str()),
        (EventKind::Warning, REASON_ADDRESS_IN_USE)
    );
    assert!(
        e.note.contains("02:00:00:00:00:01") && e.note.contains("node node-a"),
        "{}",
        e.note
    );
    for e in [
        e,
        ServiceEvent::warning(REASON_DHCP_FAILED, "no DHCP".into()),
        crate::election::identity::duplicate_identity_event(
            "node-a",
            "kube-system/plndr-svcs-lock",
        ),
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
    assert!(crate::services::plan::model::is_dns_subdomain(&n), "{n}");
    let dotted = format!("{}.b", "a".repeat(235));
    assert!(crate::services::plan::model::is_dns_subdomain(&event_name(
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
    w.event(
        &k,
        None,
        &ServiceEvent::warning(REASON_DHCP_FAILED, "no DHCP".into()),
    )
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

/// The update fallback applies annotations as a merge patch would (RFC 7386): a string
/// sets, `null` removes, others stay.
#[test]
fn annotations_merge_as_a_merge_patch_would() {
    let mut svc = Service::default();
    svc.metadata.annotations = Some(
        [
            ("keep".to_string(), "1".to_string()),
            ("kube-vip.io/vipHost".to_string(), "node-b".to_string()),
            ("gone".to_string(), "x".to_string()),
        ]
        .into(),
    );
    super::writer::merge_annotations(
        &mut svc,
        &serde_json::json!({"kube-vip.io/vipHost": "node-a", "gone": null, "new": "2"}),
    );
    let a = svc.metadata.annotations.unwrap();
    assert_eq!(a.get("keep").map(String::as_str), Some("1"));
    assert_eq!(
        a.get("kube-vip.io/vipHost").map(String::as_str),
        Some("node-a")
    );
    assert_eq!(a.get("new").map(String::as_str), Some("2"));
    assert!(!a.contains_key("gone"));
}

/// Issue 28: however many groups write at once (each through its own clone of the writer),
/// the process keeps at most `STATUS_CALLS_IN_FLIGHT` status calls at the API server, and
/// each call is one request (a patch, no read before it).
#[tokio::test(start_paused = true)]
async fn the_process_keeps_at_most_the_status_slots_in_flight() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (now, most, requests) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (n, m, r) = (now.clone(), most.clone(), requests.clone());
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (n, m, r) = (n.clone(), m.clone(), r.clone());
        async move {
            assert_eq!(req.method(), http::Method::PATCH, "{}", req.uri());
            r.fetch_add(1, Ordering::SeqCst);
            m.fetch_max(n.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            n.fetch_sub(1, Ordering::SeqCst);
            let body = serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "s", "namespace": "default"}});
            Ok::<_, std::convert::Infallible>(crate::kube::fake_api::json_reply(200, &body))
        }
    });
    let w = KubeStatusWriter::new(kube::Client::new(svc, "default"), "node-a");
    let ingress = desired_ingress(&[ip("192.0.2.5")], &[pp(80, "TCP")]);
    let calls = (0..24).map(|i| {
        let w = w.clone();
        let ingress = ingress.clone();
        tokio::spawn(async move {
            let key = ServiceKey::new("default", format!("s{i}"));
            match i % 2 {
                0 => w.set_ingress(&key, ingress).await,
                _ => w.set_vip_host(&key, "node-a").await,
            }
        })
    });
    for c in futures::future::join_all(calls).await {
        assert_eq!(c.unwrap().unwrap(), WriteOutcome::Written);
    }
    assert_eq!(requests.load(Ordering::SeqCst), 24, "one request a write");
    assert_eq!(most.load(Ordering::SeqCst), STATUS_CALLS_IN_FLIGHT);
}

/// Issue 28: while the node is busy taking over (a shard's VIPs being added), a status call
/// waits: it is sent when the takeover ends, or at the wait limit when it does not end; a
/// per-Service takeover of one VIP holds nothing back.
#[tokio::test(start_paused = true)]
async fn status_writes_give_way_to_the_nodes_takeovers() {
    use crate::holder::takeovers::Takeovers;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::time::{Duration, Instant};
    let requests = Arc::new(AtomicUsize::new(0));
    let r = requests.clone();
    let svc = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            let body = serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "s", "namespace": "default"}});
            Ok::<_, std::convert::Infallible>(crate::kube::fake_api::json_reply(200, &body))
        }
    });
    let takeovers = Arc::new(Takeovers::default());
    let w = KubeStatusWriter::new(kube::Client::new(svc, "default"), "node-a")
        .giving_way_to(takeovers.clone());
    let key = ServiceKey::new("default", "s");
    let one = takeovers.mark(1);
    assert_eq!(
        w.set_vip_host(&key, "node-a").await.unwrap(),
        WriteOutcome::Written
    );
    assert_eq!(requests.load(Ordering::SeqCst), 1, "one VIP: at once");
    let shard = takeovers.mark(600);
    let call = {
        let (w, key) = (w.clone(), key.clone());
        tokio::spawn(async move { w.set_vip_host(&key, "node-a").await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "waits while the shard is added"
    );
    drop(shard);
    assert_eq!(call.await.unwrap().unwrap(), WriteOutcome::Written);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "sent when the takeover ended"
    );
    // A takeover that does not end: the call goes at the limit.
    let _stuck = takeovers.mark(600);
    let started = Instant::now();
    assert_eq!(
        w.set_vip_host(&key, "node-a").await.unwrap(),
        WriteOutcome::Written
    );
    assert_eq!(started.elapsed(), TAKEOVER_WAIT_LIMIT);
    assert_eq!(requests.load(Ordering::SeqCst), 3);
    drop(one);
}
