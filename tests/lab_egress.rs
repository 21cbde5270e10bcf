//! Egress through the VIP (issue 30, kube-vip's `kube-vip.io/egress`) in the lab: "pods"
//! behind the nodes (`LabOptions::pods`) open HTTP connections to an echo server on the
//! client, which answers with the source address it sees.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use support::*;
use xtask::lab::{
    CLIENT_V4, CLIENT_V6, Lab, LabOptions, Signal, ThreadServer, pod_ipv4, pod_ipv6, pod_of,
};

const VIP4: &str = "192.0.2.50";
const VIP6: &str = "2001:db8::50";
const T: Duration = Duration::from_secs(2);

fn pods_lab(test: &str) -> Option<Lab> {
    let lab = lab(
        test,
        LabOptions {
            pods: true,
            ..LabOptions::default()
        },
    )?;
    lab.register_nodes(&xtask::lab::NODES)
        .unwrap_or_else(|e| panic!("{test}: cannot create the Node objects: {e}"));
    Some(lab)
}

/// Echo servers in `client` on `port` (IPv4 and IPv6).
fn echoes(lab: &Lab, port: u16) -> Vec<ThreadServer> {
    let ns = lab.netns_path("client").unwrap();
    [IpAddr::V4(CLIENT_V4), IpAddr::V6(CLIENT_V6)]
        .into_iter()
        .map(|ip| {
            ThreadServer::echo(&ns, &format!("echo-{ip}-{port}"), SocketAddr::new(ip, port))
                .unwrap()
        })
        .collect()
}

/// What the echo on the client's `dst` sees of a GET from `node`'s pod with `source`;
/// `Err` when the connection failed.
fn seen_from(
    lab: &Lab,
    node: &str,
    source: IpAddr,
    dst: IpAddr,
    port: u16,
) -> Result<String, String> {
    let pod = pod_of(node).unwrap();
    lab.http_get_from(pod, source, SocketAddr::new(dst, port), "/", T)
        .map(|b| b.trim().to_string())
        .map_err(|e| e.to_string())
}

fn pod4(node: &str) -> IpAddr {
    IpAddr::V4(pod_ipv4(node).unwrap())
}

fn pod6(node: &str) -> IpAddr {
    IpAddr::V6(pod_ipv6(node).unwrap())
}

fn egress_service(name: &str, ips: &str, extra: &[(&str, &str)]) -> serde_json::Value {
    let mut svc = service_json(name, Some(ips), None, &[(80, "TCP")], true);
    svc["metadata"]["annotations"]["kube-vip.io/egress"] = serde_json::json!("true");
    for (k, v) in extra {
        svc["metadata"]["annotations"][*k] = serde_json::json!(v);
    }
    svc
}

/// The holder's pods leave with the VIP (IPv4 and IPv6), the other endpoint nodes' pods
/// with their own address, though their rules are installed already; after a SIGKILL of
/// the holder's vipd the new holder's pods leave with the VIP and the old holder's (node
/// alive, vipd dead) with their own address again: never with the VIP another node now
/// answers for. Then the new holder is powered off (vipd killed, link cut): the third
/// node's pod leaves with the VIP.
#[test]
fn egress_follows_the_vip_holder_through_a_kill_and_a_poweroff() {
    let Some(lab) = pods_lab("egress-failover") else {
        return;
    };
    let _echo = echoes(&lab, 8080);
    let nodes = xtask::lab::NODES;
    let mut procs: Vec<_> = nodes
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[("svc_ridethrough", "false")]))
        .collect();
    create_service(&lab, &egress_service("web", &format!("{VIP4},{VIP6}"), &[]));
    let addrs: Vec<(String, &str)> = nodes
        .iter()
        .flat_map(|n| [(pod4(n).to_string(), *n), (pod6(n).to_string(), *n)])
        .collect();
    let eps: Vec<(&str, &str)> = addrs.iter().map(|(a, n)| (a.as_str(), *n)).collect();
    set_endpoint_addresses(&lab, "web", &eps);
    let holder = single_holder(&lab, VIP4, Duration::from_secs(30));
    let (c4, c6) = (IpAddr::V4(CLIENT_V4), IpAddr::V6(CLIENT_V6));
    let leaves_with = |node: &str, want4: &str, want6: &str| {
        seen_from(&lab, node, pod4(node), c4, 8080).as_deref() == Ok(want4)
            && seen_from(&lab, node, pod6(node), c6, 8080).as_deref() == Ok(want6)
    };
    wait_until(
        "the holder's pod leaves with the VIPs",
        Duration::from_secs(10),
        || leaves_with(&holder, VIP4, VIP6),
    );
    for other in nodes.iter().filter(|n| **n != holder) {
        let (own4, own6) = (pod4(other).to_string(), pod6(other).to_string());
        assert!(
            leaves_with(other, &own4, &own6),
            "{other} does not hold the VIP: its pod keeps its address"
        );
        let out = lab
            .exec(
                other,
                "nft",
                &["list", "chain", "inet", "vipd_fence", "egress_snat"],
            )
            .unwrap();
        let listed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            listed.contains(&own4) && listed.contains(&own6),
            "{other}: rules ready before it holds the VIP:\n{listed}"
        );
    }

    let i = nodes.iter().position(|n| *n == holder).unwrap();
    procs[i].signal(Signal::SIGKILL).unwrap();
    let new = wait_for_takeover(&lab, VIP4, &holder, "takeover", Duration::from_secs(20));
    // The dead holder's fence ended before its lease did, so before the takeover: its
    // pod already leaves with its own address (a VIP source now would reach the new
    // holder's answer and fail).
    let (own4, own6) = (pod4(&holder).to_string(), pod6(&holder).to_string());
    assert!(
        leaves_with(&holder, &own4, &own6),
        "the killed holder's pod must not leave with the VIP"
    );
    wait_until(
        "the new holder's pod leaves with the VIPs",
        Duration::from_secs(5),
        || leaves_with(&new, VIP4, VIP6),
    );

    // Power-off of the new holder: vipd killed and its link cut at once.
    let j = nodes.iter().position(|n| *n == new).unwrap();
    procs[j].signal(Signal::SIGKILL).unwrap();
    lab.cut_link(&new).unwrap();
    let last = wait_for_takeover(
        &lab,
        VIP4,
        &new,
        "takeover after the power-off",
        Duration::from_secs(20),
    );
    assert_ne!(last, holder, "{holder}'s vipd is dead");
    wait_until(
        "the last node's pod leaves with the VIPs",
        Duration::from_secs(5),
        || leaves_with(&last, VIP4, VIP6),
    );
    for p in &mut procs {
        let _ = p.stop(Duration::from_secs(5));
    }
}

/// Filters: the destination ports, the denied networks, the service CIDR and the pod CIDR
/// are honoured;
/// two egress Services on one node keep their own rules when one is deleted (kube-vip
/// #551); an annotation with a bad entry turns egress off for its Service only, with a log
/// line and a Warning Event naming the annotation and the entry.
#[test]
fn egress_filters_and_two_services_on_one_node() {
    let Some(lab) = pods_lab("egress-filters") else {
        return;
    };
    let _e1 = echoes(&lab, 8080);
    let _e2 = echoes(&lab, 8081);
    // A second pod address on pod-c (a second Pod on node-c), and a "service network"
    // address on the client routed from node-c.
    let pod_c2 = "198.51.100.23";
    lab.exec(
        "pod-c",
        "ip",
        &["addr", "add", &format!("{pod_c2}/32"), "dev", "eth0"],
    )
    .unwrap();
    lab.exec(
        "node-c",
        "ip",
        &["route", "add", &format!("{pod_c2}/32"), "dev", "pod0"],
    )
    .unwrap();
    lab.exec(
        "client",
        "ip",
        &["route", "add", &format!("{pod_c2}/32"), "via", "192.0.2.13"],
    )
    .unwrap();
    lab.exec(
        "client",
        "ip",
        &["addr", "add", "203.0.113.100/32", "dev", "eth0"],
    )
    .unwrap();
    lab.exec(
        "node-c",
        "ip",
        &[
            "route",
            "add",
            "203.0.113.100/32",
            "via",
            &CLIENT_V4.to_string(),
        ],
    )
    .unwrap();
    // Pod to pod: pod-a answers an echo, routed between node-c and node-a.
    let pod_echo = ThreadServer::echo(
        &lab.netns_path("pod-a").unwrap(),
        "echo-pod-a",
        SocketAddr::new(pod4("node-a"), 8080),
    )
    .unwrap();
    let route = |node: &str, to: IpAddr, via: &str| {
        lab.exec(
            node,
            "ip",
            &["route", "add", &format!("{to}/32"), "via", via],
        )
        .unwrap();
    };
    route("node-c", pod4("node-a"), "192.0.2.11");
    route("node-a", pod4("node-c"), "192.0.2.13");
    let svc_net_echo = ThreadServer::echo(
        &lab.netns_path("client").unwrap(),
        "echo-svc-net",
        "203.0.113.100:8080".parse().unwrap(),
    )
    .unwrap();
    let mut vipd = start_vipd_services(
        &lab,
        "node-c",
        true,
        &[
            ("svc_ridethrough", "false"),
            ("egress_servicecidr", "203.0.113.0/24"),
            ("egress_podcidr", "198.51.100.0/28"),
            ("prometheus_server", ":2112"),
        ],
    );
    let c4 = IpAddr::V4(CLIENT_V4);
    let c6 = IpAddr::V6(CLIENT_V6);
    create_service(
        &lab,
        &egress_service(
            "filtered",
            "192.0.2.51,2001:db8::51",
            &[
                ("kube-vip.io/egress-destination-ports", "tcp:8080"),
                ("kube-vip.io/egress-denied-networks", "2001:db8::100/128"),
            ],
        ),
    );
    let (p4, p6) = (pod4("node-c").to_string(), pod6("node-c").to_string());
    set_endpoint_addresses(&lab, "filtered", &[(&p4, "node-c"), (&p6, "node-c")]);
    create_service(&lab, &egress_service("second", "192.0.2.52", &[]));
    set_endpoint_addresses(&lab, "second", &[(pod_c2, "node-c")]);
    create_service(
        &lab,
        &egress_service(
            "broken",
            "192.0.2.53",
            &[(
                "kube-vip.io/egress-denied-networks",
                "10.0.0.0/8,not-a-cidr",
            )],
        ),
    );
    set_endpoint_addresses(&lab, "broken", &[(pod_c2, "node-c")]);
    let pod_c2_ip: IpAddr = pod_c2.parse().unwrap();
    wait_until(
        "the second Service's pod leaves with its VIP",
        Duration::from_secs(20),
        || seen_from(&lab, "node-c", pod_c2_ip, c4, 8080).as_deref() == Ok("192.0.2.52"),
    );
    wait_until(
        "port 8080 leaves with the VIP",
        Duration::from_secs(10),
        || seen_from(&lab, "node-c", pod4("node-c"), c4, 8080).as_deref() == Ok("192.0.2.51"),
    );
    assert_eq!(
        seen_from(&lab, "node-c", pod4("node-c"), c4, 8081),
        Ok(p4.clone()),
        "port 8081 is not in the list"
    );
    assert_eq!(
        seen_from(&lab, "node-c", pod6("node-c"), c6, 8080),
        Ok(p6.clone()),
        "denied network"
    );
    assert_eq!(
        seen_from(
            &lab,
            "node-c",
            pod4("node-c"),
            "203.0.113.100".parse().unwrap(),
            8080
        ),
        Ok(p4.clone()),
        "the service CIDR is never translated"
    );
    assert_eq!(
        seen_from(&lab, "node-c", pod4("node-c"), pod4("node-a"), 8080),
        Ok(p4.clone()),
        "the pod CIDR is never translated"
    );
    delete_service(&lab, "filtered");
    wait_until(
        "the deleted Service's pod keeps its address",
        Duration::from_secs(10),
        || seen_from(&lab, "node-c", pod4("node-c"), c4, 8080).as_deref() == Ok(p4.as_str()),
    );
    assert_eq!(
        seen_from(&lab, "node-c", pod_c2_ip, c4, 8080).as_deref(),
        Ok("192.0.2.52"),
        "the other Service's rule stays (kube-vip #551)"
    );
    // The deleted Service's rules go (its VIP was dropped already, which alone stops the
    // translation); they were read before they went: its translated connection (port
    // 8080, once) is counted. The other Service's endpoint is listed.
    let metrics = || {
        lab.http_get("node-c", "127.0.0.1:2112".parse().unwrap(), "/metrics", T)
            .unwrap()
    };
    let value = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let text = wait_for(
        "the deleted Service's rules gone",
        Duration::from_secs(5),
        || {
            let t = metrics();
            value(&t, r#"vipd_egress_endpoints{service="default/filtered"}"#)
                .is_none()
                .then_some(t)
        },
    );
    let translated = value(
        &text,
        r#"vipd_egress_connections_total{service="default/filtered"}"#,
    );
    assert!(translated.is_some_and(|n| n >= 1.0), "{text}");
    eprintln!("egress: default/filtered translated {translated:?} connections");
    assert_eq!(
        value(&text, r#"vipd_egress_endpoints{service="default/second"}"#),
        Some(1.0),
        "{text}"
    );
    let log = vipd.log();
    assert!(
        log.contains("kube-vip.io/egress-denied-networks: \\\"not-a-cidr\\\"")
            || log.contains("kube-vip.io/egress-denied-networks: \"not-a-cidr\""),
        "{log}"
    );
    // ... and a Warning Event on the Service says the same.
    let events = wait_for(
        "the EgressNotApplied Event",
        Duration::from_secs(10),
        || {
            let ev: Vec<_> = events_for(&lab, "broken")
                .into_iter()
                .filter(|(_, reason, _)| reason == "EgressNotApplied")
                .collect();
            (!ev.is_empty()).then_some(ev)
        },
    );
    assert_eq!(events[0].0, "Warning");
    assert!(events[0].2.contains("not-a-cidr"), "{events:?}");
    let _ = vipd.stop(Duration::from_secs(5));
    drop((svc_net_echo, pod_echo));
}

/// A pod on the holder keeps a TCP connection open through the VIP; the holder hands the
/// VIP over gracefully (the `vipd.io/drain` annotation): the pod's next packet on that
/// connection is answered with a reset by its own node (the connection was translated to a
/// VIP the node no longer holds), so the application sees it end at once instead of
/// retransmitting into a drop; a new connection then leaves with the pod's own address.
#[test]
fn egress_connection_through_a_moved_vip_is_reset() {
    use std::io::{Read, Write};
    let Some(lab) = pods_lab("egress-moved") else {
        return;
    };
    let _echo = echoes(&lab, 8080);
    let hold = ThreadServer::silent(
        &lab.netns_path("client").unwrap(),
        "hold",
        SocketAddr::new(IpAddr::V4(CLIENT_V4), 9000),
    )
    .unwrap();
    let nodes = ["node-a", "node-b"];
    let mut procs: Vec<_> = nodes
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[("svc_ridethrough", "false")]))
        .collect();
    create_service(&lab, &egress_service("web", VIP4, &[]));
    let (a, b) = (pod4("node-a").to_string(), pod4("node-b").to_string());
    set_endpoint_addresses(&lab, "web", &[(&a, "node-a"), (&b, "node-b")]);
    let holder = single_holder(&lab, VIP4, Duration::from_secs(30));
    let c4 = IpAddr::V4(CLIENT_V4);
    wait_until(
        "the holder's pod leaves with the VIP",
        Duration::from_secs(10),
        || seen_from(&lab, &holder, pod4(&holder), c4, 8080).as_deref() == Ok(VIP4),
    );
    let pod = pod_of(&holder).unwrap();
    let src = pod4(&holder);
    let mut conn = lab
        .in_netns(pod, move || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.bind(&SocketAddr::new(src, 0).into())?;
            s.connect_timeout(&SocketAddr::new(c4, 9000).into(), T)?;
            Ok::<_, std::io::Error>(std::net::TcpStream::from(s))
        })
        .unwrap()
        .expect("connect through the VIP");
    conn.write_all(b"before\n").unwrap();

    patch_node(
        &lab,
        &holder,
        serde_json::json!({"metadata": {"annotations": {"vipd.io/drain": "true"}}}),
    );
    wait_for_takeover(&lab, VIP4, &holder, "hand-over", Duration::from_secs(20));
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = conn.write_all(b"after\n");
    let mut buf = [0u8; 16];
    let err = conn.read(&mut buf).expect_err("the connection must end");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert_eq!(
        seen_from(&lab, &holder, pod4(&holder), c4, 8080),
        Ok(pod4(&holder).to_string()),
        "a new connection leaves with the pod's own address"
    );
    drop(hold);
    for p in &mut procs {
        let _ = p.stop(Duration::from_secs(5));
    }
}
