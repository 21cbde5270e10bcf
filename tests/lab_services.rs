//! Lab tests of LoadBalancer Services, named after the scenarios in
//! `docs/scenarios.md`. vipd runs on node-a/b/c in Services mode against the real
//! kube-apiserver v1.20.2; Services and Endpoints are created through the API.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use xtask::lab::{LabOptions, LabProcess, NodeRbac, Signal};

fn three(lab: &xtask::lab::Lab, election: bool) -> Vec<LabProcess> {
    NODES
        .iter()
        .map(|n| start_vipd_services(lab, n, election, &[]))
        .collect()
}

/// Waits until one node holds `ip` and returns it.
fn held(lab: &xtask::lab::Lab, ip: &str) -> String {
    single_holder(lab, ip, Duration::from_secs(20))
}

fn nobody_holds(lab: &xtask::lab::Lab, ip: &str, limit: Duration) {
    wait_for(&format!("nobody holds {ip}"), limit, || {
        holders(lab, ip).is_empty().then_some(())
    });
}

/// S20: address sources (the annotation alone, spec.loadBalancerIP); malformed values
/// rejected for that Service only, each with a Warning Event naming it, the Service's good
/// address still announced; a Service without address skipped with a log line.
#[test]
fn s20_address_sources_and_malformed_values() {
    let Some(lab) = lab("s20", LabOptions::default()) else {
        return;
    };
    let procs = three(&lab, true);
    create_service(
        &lab,
        &service_json("no-addr", None, None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("ann-only", Some("192.0.2.20"), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("spec-ip", None, Some("192.0.2.22"), &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("bad", Some("192.0.2.300"), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json(
            "mixed",
            Some("192.0.2.21,192.0.2.1/24, 192.0.2.5,::ffff:zz"),
            None,
            &[(80, "TCP")],
            false,
        ),
    );
    let h = held(&lab, "192.0.2.20");
    held(&lab, "192.0.2.21");
    held(&lab, "192.0.2.22");
    for bad in ["192.0.2.1", "192.0.2.5"] {
        assert!(holders(&lab, bad).is_empty(), "{bad} must not be announced");
    }
    wait_for("status of ann-only", Duration::from_secs(10), || {
        (ingress_ips(&lab, "ann-only") == vec!["192.0.2.20".to_string()]).then_some(())
    });
    let svc = get_service(&lab, "ann-only").unwrap();
    assert_eq!(
        svc["metadata"]["annotations"]["kube-vip.io/vipHost"],
        json!(h)
    );
    for (svc, value) in [
        ("bad", "192.0.2.300"),
        ("mixed", "192.0.2.1/24"),
        ("mixed", " 192.0.2.5"),
        ("mixed", "::ffff:zz"),
    ] {
        wait_for(
            &format!("Warning for {value:?} on {svc}"),
            Duration::from_secs(10),
            || {
                events_for(&lab, svc)
                    .iter()
                    .any(|(t, _, m)| t == "Warning" && m.contains(value))
                    .then_some(())
            },
        );
    }
    // Refused values cost the Service only those values: its good address is announced and
    // in its status; a Service with nothing usable gets no status.
    wait_for("status of mixed", Duration::from_secs(10), || {
        (ingress_ips(&lab, "mixed") == vec!["192.0.2.21".to_string()]).then_some(())
    });
    assert!(ingress_ips(&lab, "bad").is_empty());
    // A Service without any address is skipped with a log line and gets no status.
    wait_for(
        "no-addr skipped with a log line",
        Duration::from_secs(10),
        || {
            procs
                .iter()
                .any(|p| {
                    p.log().lines().any(|l| {
                        l.contains("not announced: no address")
                            && l.contains("service=default/no-addr")
                    })
                })
                .then_some(())
        },
    );
    assert!(ingress_ips(&lab, "no-addr").is_empty());
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
}

/// S17: deleting a Service removes its VIP everywhere within seconds, stops ARP for it and
/// deletes its per-Service lease.
#[test]
fn s17_delete_cleans_up() {
    let Some(lab) = lab("s17", LabOptions::default()) else {
        return;
    };
    let _procs = three(&lab, true);
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.30"), None, &[(80, "TCP")], false),
    );
    held(&lab, "192.0.2.30");
    wait_for("lease", Duration::from_secs(5), || {
        lease(&lab, "default", "kubevip-web")
    });
    delete_service(&lab, "web");
    let t0 = Instant::now();
    nobody_holds(&lab, "192.0.2.30", Duration::from_secs(5));
    eprintln!("S17: VIP gone {:?} after delete", t0.elapsed());
    wait_for("lease deleted", Duration::from_secs(10), || {
        lease(&lab, "default", "kubevip-web")
            .is_none()
            .then_some(())
    });
    let cap = lab.start_capture().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let frames = cap.stop().unwrap();
    let ip = "192.0.2.30".parse().unwrap();
    assert!(
        !frames.iter().any(|f| f.is_announcement_of(ip)),
        "GARP after delete"
    );
}

/// S18: LoadBalancer -> ClusterIP acts as a delete, back to LoadBalancer as an add.
#[test]
fn s18_type_change() {
    let Some(lab) = lab("s18", LabOptions::default()) else {
        return;
    };
    let _procs = three(&lab, true);
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.31"), None, &[(80, "TCP")], false),
    );
    held(&lab, "192.0.2.31");
    patch_service(&lab, "web", json!({"spec": {"type": "ClusterIP"}}));
    nobody_holds(&lab, "192.0.2.31", Duration::from_secs(5));
    // S32: no lease for a Service that is not announced.
    wait_for("lease deleted", Duration::from_secs(10), || {
        lease(&lab, "default", "kubevip-web")
            .is_none()
            .then_some(())
    });
    patch_service(&lab, "web", json!({"spec": {"type": "LoadBalancer"}}));
    held(&lab, "192.0.2.31");
}

/// S19: editing the address annotation adds the new address and announces it from its
/// holder's MAC, removes the old, updates the status.
#[test]
fn s19_ip_change() {
    let Some(lab) = lab("s19", LabOptions::default()) else {
        return;
    };
    let _procs = three(&lab, true);
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.120"), None, &[(80, "TCP")], false),
    );
    held(&lab, "192.0.2.120");
    let cap = lab.start_capture().unwrap();
    patch_service(
        &lab,
        "web",
        json!({"metadata": {"annotations": {"kube-vip.io/loadbalancerIPs": "192.0.2.121"}}}),
    );
    let h = held(&lab, "192.0.2.121");
    // Announced at once on acquisition, then every vip_arpRate (1 s): 1.5 s holds at least one.
    std::thread::sleep(Duration::from_millis(1500));
    let frames = cap.stop().unwrap();
    let new_ip = "192.0.2.121".parse().unwrap();
    let mac = lab.mac_of(&h).unwrap();
    let garps: Vec<_> = frames
        .iter()
        .filter(|f| f.is_announcement_of(new_ip))
        .collect();
    assert!(!garps.is_empty(), "192.0.2.121 not announced: {frames:?}");
    assert!(garps.iter().all(|f| f.sender_mac == mac), "{garps:?}");
    nobody_holds(&lab, "192.0.2.120", Duration::from_secs(5));
    wait_for("status updated", Duration::from_secs(10), || {
        (ingress_ips(&lab, "web") == vec!["192.0.2.121".to_string()]).then_some(())
    });
    // An address that becomes invalid: nobody announces it, and the stale status goes.
    patch_service(
        &lab,
        "web",
        json!({"metadata": {"annotations": {"kube-vip.io/loadbalancerIPs": "192.0.2.999"}}}),
    );
    nobody_holds(&lab, "192.0.2.121", Duration::from_secs(5));
    wait_for("stale status cleared", Duration::from_secs(10), || {
        ingress_ips(&lab, "web").is_empty().then_some(())
    });
}

/// S06: two Services on one address; deleting one keeps the address held without a gap.
/// Variant: a Service that uses the control-plane VIP is deleted; the VIP stays.
#[test]
fn s06_shared_ip_one_consumer_deleted() {
    let Some(lab) = lab("s06", LabOptions::default()) else {
        return;
    };
    let _procs: Vec<_> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[("cp_enable", "true"), ("address", VIP)]))
        .collect();
    create_service(
        &lab,
        &service_json("dns-tcp", Some("192.0.2.60"), None, &[(53, "TCP")], false),
    );
    std::thread::sleep(Duration::from_millis(200));
    create_service(
        &lab,
        &service_json("dns-udp", Some("192.0.2.60"), None, &[(53, "UDP")], false),
    );
    create_service(
        &lab,
        &service_json("api", Some(VIP), None, &[(443, "TCP")], false),
    );
    let h = held(&lab, "192.0.2.60");
    let cp = held(&lab, VIP);
    wait_for("both statuses", Duration::from_secs(10), || {
        (ingress_ips(&lab, "dns-udp") == vec!["192.0.2.60".to_string()]
            && ingress_ips(&lab, "dns-tcp") == vec!["192.0.2.60".to_string()])
        .then_some(())
    });
    delete_service(&lab, "dns-udp");
    delete_service(&lab, "api");
    for _ in 0..60 {
        assert_eq!(
            holders(&lab, "192.0.2.60"),
            vec![h.clone()],
            "shared address must stay"
        );
        assert_eq!(
            holders(&lab, VIP),
            vec![cp.clone()],
            "control-plane VIP must stay"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// S07: same address, port and protocol: the second is not programmed and gets a Warning
/// naming the first; same port with another protocol is fine.
#[test]
fn s07_same_ip_same_port() {
    let Some(lab) = lab("s07", LabOptions::default()) else {
        return;
    };
    let _procs = three(&lab, true);
    create_service(
        &lab,
        &service_json("svc-a", Some("192.0.2.70"), None, &[(80, "TCP")], false),
    );
    held(&lab, "192.0.2.70");
    create_service(
        &lab,
        &service_json("svc-b", Some("192.0.2.70"), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("svc-c", Some("192.0.2.70"), None, &[(80, "UDP")], false),
    );
    wait_for(
        "Warning on svc-b naming svc-a",
        Duration::from_secs(10),
        || {
            events_for(&lab, "svc-b")
                .iter()
                .any(|(t, _, m)| t == "Warning" && m.contains("default/svc-a"))
                .then_some(())
        },
    );
    wait_for("svc-c served", Duration::from_secs(10), || {
        (ingress_ips(&lab, "svc-c") == vec!["192.0.2.70".to_string()]).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        ingress_ips(&lab, "svc-b").is_empty(),
        "svc-b must not be programmed"
    );
    assert!(
        lease(&lab, "default", "kubevip-svc-b").is_none(),
        "no lease for svc-b"
    );
}

/// S21: externalTrafficPolicy Local: only nodes with a ready local endpoint campaign (node-a,
/// which never has one, never starts an election); the VIP follows the endpoint and the
/// holder that loses its endpoint releases the lease; with no endpoints nobody announces.
#[test]
fn s21_etp_local_follows_endpoints() {
    let Some(lab) = lab("s21", LabOptions::default()) else {
        return;
    };
    let procs = three(&lab, true);
    let log_has = |i: usize, what: &str| {
        procs[i]
            .log()
            .lines()
            .any(|l| l.contains(what) && l.contains("default/kubevip-local"))
    };
    create_service(
        &lab,
        &service_json("local", Some("192.0.2.80"), None, &[(80, "TCP")], true),
    );
    set_endpoints(&lab, "local", &[]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        holders(&lab, "192.0.2.80").is_empty(),
        "no endpoints, nobody announces"
    );
    assert!(
        lease(&lab, "default", "kubevip-local").is_none(),
        "no lease without candidates"
    );
    set_endpoints(&lab, "local", &["node-b"]);
    assert_eq!(held(&lab, "192.0.2.80"), "node-b");
    set_endpoints(&lab, "local", &["node-c"]);
    wait_for("VIP moves to node-c", Duration::from_secs(10), || {
        (holders(&lab, "192.0.2.80") == vec!["node-c".to_string()]).then_some(())
    });
    assert!(log_has(1, "lease released"), "{}", procs[1].log());
    set_endpoints(&lab, "local", &[]);
    nobody_holds(&lab, "192.0.2.80", Duration::from_secs(10));
    assert!(log_has(1, "election started"), "{}", procs[1].log());
    assert!(!log_has(0, "election started"), "{}", procs[0].log());
}

/// S21 under one lease for all (issue 26, harvester #6944: Harvester guests run
/// `svc_election=false`): an externalTrafficPolicy Local Service gets a lease of its own in
/// the global lease's namespace (`vipd-local.<namespace>.<name>`) and is announced only from
/// the node with its endpoint, while a Cluster Service stays with the global holder; with no
/// endpoint it is announced nowhere with a `NoLocalEndpoint` Warning; its lease goes with it.
#[test]
fn s21_etp_local_under_one_lease_for_all_follows_endpoints() {
    let Some(lab) = lab("s21_global", LabOptions::default()) else {
        return;
    };
    let _procs = three(&lab, false);
    create_service(
        &lab,
        &service_json("cluster", Some("192.0.2.81"), None, &[(443, "TCP")], false),
    );
    let global = held(&lab, "192.0.2.81");
    let other = NODES.iter().find(|n| **n != global).unwrap().to_string();
    create_service(
        &lab,
        &service_json("local", Some("192.0.2.80"), None, &[(80, "TCP")], true),
    );
    set_endpoints(&lab, "local", &[&other]);
    assert_eq!(
        held(&lab, "192.0.2.80"),
        other,
        "announced where the endpoint runs"
    );
    assert_eq!(
        lease_holder(&lab, "kube-system", "vipd-local.default.local").as_deref(),
        Some(other.as_str())
    );
    wait_until(
        "vipHost names the endpoint's node",
        Duration::from_secs(10),
        || {
            support::dhcp::annotation(&lab, "local", "kube-vip.io/vipHost").as_deref()
                == Some(other.as_str())
        },
    );
    assert_eq!(holders(&lab, "192.0.2.81"), std::slice::from_ref(&global));
    set_endpoints(&lab, "local", &[]);
    nobody_holds(&lab, "192.0.2.80", Duration::from_secs(10));
    wait_until("a NoLocalEndpoint Warning", Duration::from_secs(10), || {
        events_for(&lab, "local")
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "NoLocalEndpoint")
    });
    set_endpoints(&lab, "local", &[&global]);
    assert_eq!(held(&lab, "192.0.2.80"), global);
    delete_service(&lab, "local");
    nobody_holds(&lab, "192.0.2.80", Duration::from_secs(10));
    wait_until("its lease deleted", Duration::from_secs(10), || {
        lease(&lab, "kube-system", "vipd-local.default.local").is_none()
    });
    assert_eq!(holders(&lab, "192.0.2.81"), [global]);
}

/// S20 at scale (issue 27): a Service whose `kube-vip.io/loadbalancerIPs` holds 10 000
/// malformed entries, created together with a valid one: the noisy one gets one
/// `InvalidAddress` Warning Event and a handful of log lines, the valid one is announced as
/// usual (the time is printed: before, 2 000 entries cost one Event and one log line each
/// and held the other Services up for 5.6 s).
#[test]
fn s20_ten_thousand_bad_entries_cost_one_event() {
    let Some(lab) = lab("s20_noisy", LabOptions::default()) else {
        return;
    };
    let vipd = start_vipd_services(&lab, "node-a", true, &[]);
    // Warm-up, then the time a valid Service takes alone (the baseline).
    create_service(
        &lab,
        &service_json("warm", Some("192.0.2.47"), None, &[(80, "TCP")], false),
    );
    assert_eq!(held(&lab, "192.0.2.47"), "node-a");
    let t0 = Instant::now();
    create_service(
        &lab,
        &service_json("alone", Some("192.0.2.46"), None, &[(80, "TCP")], false),
    );
    assert_eq!(held(&lab, "192.0.2.46"), "node-a");
    let alone = t0.elapsed();
    let bad: Vec<String> = (0..10_000)
        .map(|i| format!("10.{}.{}", i / 256, i % 256))
        .collect();
    let mut noisy = service_json("noisy", None, None, &[(80, "TCP")], false);
    noisy["metadata"]["annotations"]["kube-vip.io/loadbalancerIPs"] = json!(bad.join(","));
    let t0 = Instant::now();
    create_service(&lab, &noisy);
    create_service(
        &lab,
        &service_json("calm", Some("192.0.2.44"), None, &[(80, "TCP")], false),
    );
    assert_eq!(held(&lab, "192.0.2.44"), "node-a");
    eprintln!(
        "S20 figures: a valid Service announced {} ms after it was created alone, {} ms after it was created together with one holding 10 000 malformed entries",
        alone.as_millis(),
        t0.elapsed().as_millis()
    );
    wait_until(
        "the noisy Service's Warning",
        Duration::from_secs(10),
        || {
            events_for(&lab, "noisy")
                .iter()
                .any(|(t, r, _)| t == "Warning" && r == "InvalidAddress")
        },
    );
    let noisy_lines = |log: &str| log.lines().filter(|l| l.contains("default/noisy")).count();
    let first = noisy_lines(&vipd.log());
    // More passes (a third Service announced means they ran), then count.
    create_service(
        &lab,
        &service_json("later", Some("192.0.2.45"), None, &[(80, "TCP")], false),
    );
    assert_eq!(held(&lab, "192.0.2.45"), "node-a");
    let events: Vec<_> = events_for(&lab, "noisy")
        .into_iter()
        .filter(|(_, r, _)| r == "InvalidAddress")
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    let lines = noisy_lines(&vipd.log());
    assert_eq!(
        lines,
        first,
        "the noisy Service, handled again unchanged, logs nothing new:\n{}",
        vipd.log()
    );
    assert!(
        lines <= 5,
        "{lines} log lines about the noisy Service:\n{}",
        vipd.log()
    );
}

/// S03: endpoint churn: the Service's only endpoint moves between nodes 20 times; at most
/// one election per (Service, node) at a time, and afterwards exactly one holder with
/// renewTime advancing.
#[test]
fn s03_endpoint_churn() {
    let Some(lab) = lab("s03", LabOptions::default()) else {
        return;
    };
    let procs = three(&lab, true);
    create_service(
        &lab,
        &service_json("churn", Some("192.0.2.90"), None, &[(80, "TCP")], true),
    );
    for i in 0..20 {
        let node = NODES[i % 3];
        set_endpoints(&lab, "churn", &[node]);
        std::thread::sleep(Duration::from_millis(300 + (i as u64 % 4) * 100));
        set_endpoints(&lab, "churn", &[]);
        std::thread::sleep(Duration::from_millis(200));
    }
    set_endpoints(&lab, "churn", &["node-a"]);
    wait_for("one holder, node-a", Duration::from_secs(15), || {
        (holders(&lab, "192.0.2.90") == vec!["node-a".to_string()]).then_some(())
    });
    let r1 = lease(&lab, "default", "kubevip-churn").unwrap()["spec"]["renewTime"].clone();
    std::thread::sleep(Duration::from_millis(2500));
    let l = lease(&lab, "default", "kubevip-churn").unwrap();
    assert_eq!(l["spec"]["holderIdentity"], json!("node-a"));
    assert_ne!(l["spec"]["renewTime"], r1, "renewTime advances");
    for p in &procs {
        // Election tasks per lease strictly alternate start/stop: never two at once.
        let mut running = 0i32;
        for line in p.log().lines() {
            if line.contains("election started") && line.contains("kubevip-churn") {
                running += 1;
            }
            if line.contains("stopping election") && line.contains("kubevip-churn") {
                running -= 1;
            }
            assert!(
                (0..=1).contains(&running),
                "{}: {running} elections at once",
                p.name()
            );
        }
    }
}

/// Global lease mode: one holder announces every Service address, and all move together
/// when it dies.
#[test]
fn global_lease_moves_all_service_vips() {
    let Some(lab) = lab("global", LabOptions::default()) else {
        return;
    };
    let procs = three(&lab, false);
    for (i, name) in ["g1", "g2", "g3"].iter().enumerate() {
        let ip = format!("192.0.2.{}", 40 + i);
        create_service(
            &lab,
            &service_json(name, Some(&ip), None, &[(80, "TCP")], false),
        );
    }
    let h = held(&lab, "192.0.2.40");
    for ip in ["192.0.2.41", "192.0.2.42"] {
        assert_eq!(held(&lab, ip), h);
    }
    let i = NODES.iter().position(|n| *n == h).unwrap();
    procs[i].signal(Signal::SIGKILL).unwrap();
    let new = wait_for("all move", Duration::from_secs(15), || {
        let hs: Vec<Vec<String>> = ["192.0.2.40", "192.0.2.41", "192.0.2.42"]
            .iter()
            .map(|ip| holders(&lab, ip))
            .collect();
        (hs.iter()
            .all(|x| x.len() == 1 && x[0] != h && x[0] == hs[0][0]))
        .then(|| hs[0][0].clone())
    });
    assert_ne!(new, h);
    assert_eq!(
        lease_holder(&lab, "kube-system", "plndr-svcs-lock").as_deref(),
        Some(new.as_str())
    );
}

/// svc_election spreads 30 Services over the three nodes (no node holds them all).
#[test]
fn svc_election_spreads_services() {
    let Some(lab) = lab("spread", LabOptions::default()) else {
        return;
    };
    let _procs: Vec<_> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[("prometheus_server", ":2112")]))
        .collect();
    for i in 0..30 {
        let ip = format!("192.0.2.{}", 150 + i);
        create_service(
            &lab,
            &service_json(&format!("s{i}"), Some(&ip), None, &[(80, "TCP")], false),
        );
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..30 {
        let ip = format!("192.0.2.{}", 150 + i);
        *per_node.entry(held(&lab, &ip)).or_default() += 1;
    }
    eprintln!("spread: {per_node:?}");
    assert!(per_node.len() >= 2, "no spread: {per_node:?}");
    assert!(per_node.values().all(|n| *n < 30));
    // The admin endpoint reports what each node carries (gauge refreshed every 2 s).
    for n in NODES {
        let want = per_node.get(n).copied().unwrap_or(0);
        wait_for(
            &format!("vipd_vips_held {want} on {n}"),
            Duration::from_secs(6),
            || {
                let addr = "127.0.0.1:2112".parse().unwrap();
                let body = lab
                    .http_get(n, addr, "/metrics", Duration::from_secs(2))
                    .ok()?;
                body.lines()
                    .any(|l| l.starts_with("vipd_vips_held ") && l.ends_with(&format!(" {want}")))
                    .then_some(())
            },
        );
    }
}

/// S15: a watch that gets 403 retries with back-off (logged with the resource) and recovers
/// once RBAC is fixed, without a restart.
#[test]
fn s15_forbidden_watch_recovers_when_rbac_is_fixed() {
    let opts = LabOptions {
        node_rbac: NodeRbac::None,
        ..LabOptions::default()
    };
    let Some(lab) = lab("s15", opts) else { return };
    let p = start_vipd_services(&lab, "node-a", true, &[]);
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.33"), None, &[(80, "TCP")], false),
    );
    // One line names the resource and the verb the server refused.
    wait_for("forbidden logged", Duration::from_secs(15), || {
        p.log()
            .lines()
            .any(|l| {
                l.contains("forbidden")
                    && (l.contains(r#"cannot list resource \"services\""#)
                        || l.contains(r#"cannot watch resource \"services\""#))
            })
            .then_some(())
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "s15-fix"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "Group", "name": xtask::lab::NODE_GROUP, "apiGroup": "rbac.authorization.k8s.io"}]
    });
    let resp = lab
        .api_request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            Some(&binding.to_string()),
        )
        .unwrap();
    assert_eq!(resp.status, 201, "{}", resp.body);
    let t0 = Instant::now();
    single_holder(&lab, "192.0.2.33", Duration::from_secs(45));
    eprintln!("S15: announced {:?} after RBAC was fixed", t0.elapsed());
}

/// A Service whose address is a node's own address is refused with a Warning, and no node
/// takes that address (it would steal the node's traffic).
#[test]
fn node_address_as_service_vip_is_refused() {
    let Some(lab) = lab("nodeaddr", LabOptions::default()) else {
        return;
    };
    for (i, n) in NODES.iter().enumerate() {
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n},
            "status": {"addresses": [{"type": "InternalIP", "address": format!("192.0.2.{}", 11 + i)}]}
        });
        let resp = lab
            .api_request("POST", "/api/v1/nodes", Some(&node.to_string()))
            .unwrap();
        assert_eq!(resp.status, 201, "{}", resp.body);
    }
    let _procs = three(&lab, true);
    create_service(
        &lab,
        &service_json("own", Some("192.0.2.11"), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("ok", Some("192.0.2.35"), None, &[(80, "TCP")], false),
    );
    held(&lab, "192.0.2.35");
    wait_for("Warning naming node-a", Duration::from_secs(10), || {
        events_for(&lab, "own")
            .iter()
            .any(|(t, _, m)| t == "Warning" && m.contains("node-a"))
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        holders(&lab, "192.0.2.11"),
        vec!["node-a".to_string()],
        "only node-a's own address"
    );
    let a = lab.addresses("node-a", "eth0").unwrap();
    assert!(
        a.iter()
            .any(|x| x.addr.to_string() == "192.0.2.11" && x.prefix == 24),
        "node address intact"
    );
    assert!(lease(&lab, "default", "kubevip-own").is_none());
}
