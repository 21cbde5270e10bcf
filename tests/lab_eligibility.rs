//! S42: eligibility and maintenance hand-over against the real API server, with Node
//! objects the test creates. A Service VIP leaves a node that gets the
//! `node.kubernetes.io/exclude-from-external-load-balancers` label, that the kubelet reports
//! NotReady, whose network is reported unavailable (`NetworkUnavailable=True`, metallb
//! #1710), that is annotated `vipd.io/drain=true` or drained with `vipd drain`; each time
//! the holder hands over gracefully (the lease is released, so the other node takes it at
//! once) and posts a `HandedOver` Event; clearing the condition lets the node campaign
//! again. `vipd drain` also moves the control-plane VIP.
//!
//! Run as root: `cargo test --test lab_eligibility` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;
use xtask::lab::{Lab, LabOptions, Signal};

const SVC_VIP: &str = "192.0.2.20";
const LIMIT: Duration = Duration::from_secs(30);
const ADMIN: (&str, &str) = ("prometheus_server", "127.0.0.1:2112");

fn other(node: &str) -> &'static str {
    if node == "node-a" { "node-b" } else { "node-a" }
}

/// The Service VIP moves away from `from` (to the other node, which answers it), and
/// `from` posted a HandedOver Event naming `why`.
fn moved_away(lab: &Lab, from: &str, why: &str) {
    let to = other(from);
    wait_until(
        &format!("{SVC_VIP} moves from {from} to {to}"),
        LIMIT,
        || holders(lab, SVC_VIP) == vec![to.to_string()],
    );
    wait_until(&format!("HandedOver Event from {from}"), LIMIT, || {
        events_for(lab, "web").iter().any(|(kind, reason, note)| {
            kind == "Normal"
                && reason == "HandedOver"
                && note.contains(&format!("node {from} hands {SVC_VIP} over"))
                && note.contains(why)
        })
    });
}

/// Runs `vipd drain ARGS` on `node` (its local admin endpoint).
fn vipd_drain(lab: &Lab, node: &str, args: &[&str]) -> String {
    let mut all = vec!["drain"];
    all.extend(args);
    let mut p = lab
        .spawn(node, env!("CARGO_BIN_EXE_vipd"), &all, &[])
        .expect("spawn vipd drain");
    let status = p
        .wait_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_or_else(|| panic!("vipd drain did not finish:\n{}", p.log()));
    assert!(status.success(), "vipd drain {args:?}:\n{}", p.log());
    p.log()
}

#[test]
fn s42_ineligible_nodes_hand_service_vips_over() {
    let Some(lab) = lab("eligibility", LabOptions::default()) else {
        return;
    };
    create_ready_node(&lab, "node-a");
    create_ready_node(&lab, "node-b");
    let mut procs: Vec<_> = ["node-a", "node-b"]
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[ADMIN]))
        .collect();
    create_service(
        &lab,
        &service_json("web", Some(SVC_VIP), None, &[(80, "TCP")], false),
    );
    let first = single_holder(&lab, SVC_VIP, LIMIT);

    // Excluded by label.
    patch_node(
        &lab,
        &first,
        json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}}}),
    );
    moved_away(&lab, &first, "exclude-from-external-load-balancers");
    // Graceful: the old holder released the lease (the other node did not wait it out).
    let idx = |n: &str| usize::from(n != "node-a");
    assert!(
        procs[idx(&first)].log().contains("lease released"),
        "{}",
        procs[idx(&first)].log()
    );
    // `vipd drain --status` names the reason, though `vipd drain` was not used.
    let status = vipd_drain(&lab, &first, &["--status"]);
    assert!(
        status.contains("not drained")
            && status.contains("services: not announcing: labelled node.kubernetes.io/exclude-from-external-load-balancers"),
        "{status}"
    );
    patch_node(
        &lab,
        &first,
        json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": null}}}),
    );

    // NotReady.
    let second = other(&first).to_string();
    set_ready(&lab, &second, false);
    moved_away(&lab, &second, "NotReady");
    set_ready(&lab, &second, true);

    // The drain annotation.
    patch_node(
        &lab,
        &first,
        json!({"metadata": {"annotations": {"vipd.io/drain": "true"}}}),
    );
    moved_away(&lab, &first, "vipd.io/drain=true");
    patch_node(
        &lab,
        &first,
        json!({"metadata": {"annotations": {"vipd.io/drain": null}}}),
    );

    // `vipd drain` on the node itself; the node stays out until --undo.
    assert_eq!(
        vipd_drain(&lab, &second, &["--status"]).trim(),
        "not drained"
    );
    assert_eq!(vipd_drain(&lab, &second, &[]).trim(), "drained");
    moved_away(&lab, &second, "vipd drain");
    assert_eq!(vipd_drain(&lab, &second, &["--status"]).trim(), "drained");
    // With the other node gone, the drained node still does not take it.
    procs[idx(&first)].signal(Signal::SIGTERM).unwrap();
    let _ = procs[idx(&first)].wait_timeout(Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        holders(&lab, SVC_VIP).is_empty(),
        "a drained node must not take the VIP: {:?}",
        holders(&lab, SVC_VIP)
    );
    assert_eq!(vipd_drain(&lab, &second, &["--undo"]).trim(), "not drained");
    wait_until("undrained node takes the VIP", LIMIT, || {
        holders(&lab, SVC_VIP) == vec![second.clone()]
    });
    for p in &mut procs {
        let _ = p.signal(Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(5));
    }
}

#[test]
fn s42_vipd_drain_moves_the_control_plane_vip() {
    let Some(lab) = lab("eligibility_cp", LabOptions::default()) else {
        return;
    };
    create_ready_node(&lab, "node-a");
    create_ready_node(&lab, "node-b");
    let mut procs: Vec<_> = ["node-a", "node-b"]
        .iter()
        .map(|n| start_vipd(&lab, n, T531, &[ADMIN]))
        .collect();
    let first = single_holder(&lab, VIP, LIMIT);
    // Exclusion and readiness are for Service VIPs: the control-plane VIP stays.
    patch_node(
        &lab,
        &first,
        json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}}}),
    );
    set_ready(&lab, &first, false);
    assert_held_by_after(&lab, VIP, &first, Duration::from_secs(3));
    assert_eq!(vipd_drain(&lab, &first, &[]).trim(), "drained");
    let to = other(&first);
    wait_until("control-plane VIP moves", LIMIT, || {
        holders(&lab, VIP) == vec![to.to_string()]
    });
    // Graceful: released, not expired (the lease's holder changed without waiting out the
    // lease).
    let log = procs[if first == "node-a" { 0 } else { 1 }].log();
    assert!(log.contains("lease released"), "{log}");
    assert_eq!(vipd_drain(&lab, &first, &["--undo"]).trim(), "not drained");
    // Undrained, it campaigns again but does not preempt the holder.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(holders(&lab, VIP), vec![to.to_string()]);
    for p in &mut procs {
        let _ = p.signal(Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(5));
    }
}

/// A Service `name` on `vip` with the `vipd.io/node-selector` annotation `selector`.
fn selected_service(name: &str, vip: &str, selector: &str) -> serde_json::Value {
    let mut svc = service_json(name, Some(vip), None, &[(80, "TCP")], false);
    svc["metadata"]["annotations"]["vipd.io/node-selector"] = json!(selector);
    svc
}

/// S47 and S48: per-Service node choice. Only nodes whose labels match a Service's
/// `vipd.io/node-selector` campaign for it, and a holder whose labels stop matching hands
/// over gracefully with a HandedOver Event; an invalid selector announces the Service
/// nowhere with a Warning naming the value; a node without a subnet containing the VIP
/// never takes it.
#[test]
fn s47_node_selector_and_subnet_choose_the_nodes_per_service() {
    let Some(lab) = lab("eligibility_select", LabOptions::default()) else {
        return;
    };
    create_ready_node(&lab, "node-a");
    create_ready_node(&lab, "node-b");
    patch_node(
        &lab,
        "node-a",
        json!({"metadata": {"labels": {"zone": "a"}}}),
    );
    patch_node(
        &lab,
        "node-b",
        json!({"metadata": {"labels": {"zone": "b"}}}),
    );
    // node-a has no IPv6 subnet: it must not take an IPv6 Service VIP.
    lab.exec(
        "node-a",
        "ip",
        &["addr", "del", "2001:db8::11/64", "dev", "eth0"],
    )
    .expect("remove node-a's IPv6 address");
    let mut procs: Vec<_> = ["node-a", "node-b"]
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[ADMIN]))
        .collect();
    create_service(&lab, &selected_service("web", SVC_VIP, "zone in (b, c)"));
    create_service(
        &lab,
        &service_json("v6", Some("2001:db8::30"), None, &[(80, "TCP")], false),
    );
    create_service(&lab, &selected_service("bad", "192.0.2.21", "zone in (b"));
    assert_eq!(single_holder(&lab, SVC_VIP, LIMIT), "node-b");
    assert_eq!(single_holder(&lab, "2001:db8::30", LIMIT), "node-b");
    wait_until("Warning about the invalid selector", LIMIT, || {
        events_for(&lab, "bad").iter().any(|(kind, reason, note)| {
            kind == "Warning"
                && reason == "InvalidConfiguration"
                && note.contains(r#"vipd.io/node-selector="zone in (b""#)
        })
    });
    // Both nodes passed over it by now (the Warning is written after the plan) and neither
    // campaigns for it: no lease, no holder.
    assert!(holders(&lab, "192.0.2.21").is_empty());
    assert!(lease(&lab, "default", "kubevip-bad").is_none());
    // node-a never campaigned for web or v6 (the lease went to node-b at once).
    let a_log = procs[0].log();
    for lease in ["kubevip-web", "kubevip-v6"] {
        assert!(
            !a_log
                .lines()
                .any(|l| l.contains(lease) && l.contains("acquired lease")),
            "{a_log}"
        );
    }

    // node-b stops matching, node-a starts: the VIP moves with a HandedOver Event.
    patch_node(
        &lab,
        "node-a",
        json!({"metadata": {"labels": {"zone": "c"}}}),
    );
    patch_node(
        &lab,
        "node-b",
        json!({"metadata": {"labels": {"zone": "d"}}}),
    );
    moved_away(
        &lab,
        "node-b",
        r#"do not match vipd.io/node-selector="zone in (b, c)""#,
    );
    assert!(
        procs[1].log().contains("lease released"),
        "{}",
        procs[1].log()
    );
    // The IPv6 Service has no selector: it stays.
    assert_eq!(holders(&lab, "2001:db8::30"), vec!["node-b".to_string()]);

    // The holder loses its IPv6 subnet while node-a gets one: the VIP moves with the Event.
    lab.exec(
        "node-a",
        "ip",
        &["addr", "add", "2001:db8::11/64", "dev", "eth0", "nodad"],
    )
    .expect("give node-a its IPv6 address back");
    lab.exec(
        "node-b",
        "ip",
        &["addr", "del", "2001:db8::12/64", "dev", "eth0"],
    )
    .expect("remove node-b's IPv6 address");
    wait_until("2001:db8::30 moves to node-a", LIMIT, || {
        holders(&lab, "2001:db8::30") == vec!["node-a".to_string()]
    });
    wait_until("HandedOver Event naming the subnet", LIMIT, || {
        events_for(&lab, "v6").iter().any(|(kind, reason, note)| {
            kind == "Normal"
                && reason == "HandedOver"
                && note.contains("node node-b hands 2001:db8::30 over")
                && note.contains("no subnet on interface eth0 of the node contains 2001:db8::30")
        })
    });
    for p in &mut procs {
        let _ = p.signal(Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(5));
    }
}

/// `vipd_node_ineligible{vips="services",reason=...}` lines of `node`'s metrics; `None`
/// while its admin endpoint does not answer (vipd starting).
fn services_ineligible(lab: &Lab, node: &str) -> Option<Vec<String>> {
    let admin: std::net::SocketAddr = ADMIN.1.parse().expect("addr");
    let body = lab
        .http_get(node, admin, "/metrics", Duration::from_secs(2))
        .ok()?;
    Some(
        body.lines()
            .filter(|l| l.starts_with(r#"vipd_node_ineligible{vips="services""#))
            .map(str::to_string)
            .collect(),
    )
}

/// Issue 26 (metallb #1710): a node whose `NetworkUnavailable` condition is `True` takes no
/// Service lease, a holder that gets the condition hands its VIPs over as for NotReady
/// (lease released, `HandedOver` Event, the reason in `vipd_node_ineligible`), and it does
/// not take them even when it is the only vipd left; once the condition is `False` it does.
#[test]
fn s58_network_unavailable_nodes_hold_nothing() {
    let Some(lab) = lab("eligibility_network", LabOptions::default()) else {
        return;
    };
    create_ready_node(&lab, "node-a");
    create_ready_node(&lab, "node-b");
    set_conditions(&lab, "node-a", true, Some(true));
    set_conditions(&lab, "node-b", true, Some(false));
    let mut procs: Vec<_> = ["node-a", "node-b"]
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[ADMIN]))
        .collect();
    let unavailable = r#"vipd_node_ineligible{vips="services",reason="network-unavailable"} 1"#;
    wait_until("node-a reports network-unavailable", LIMIT, || {
        services_ineligible(&lab, "node-a") == Some(vec![unavailable.to_string()])
    });
    wait_until("node-b reports nothing", LIMIT, || {
        services_ineligible(&lab, "node-b") == Some(vec![])
    });
    create_service(
        &lab,
        &service_json("web", Some(SVC_VIP), None, &[(80, "TCP")], false),
    );
    assert_eq!(single_holder(&lab, SVC_VIP, LIMIT), "node-b");
    // node-a never campaigned: the lease went to node-b at once.
    let a_log = procs[0].log();
    assert!(
        !a_log
            .lines()
            .any(|l| l.contains("kubevip-web") && l.contains("acquired lease")),
        "{a_log}"
    );

    // node-a's network comes up, node-b's goes: the holder hands over gracefully.
    set_conditions(&lab, "node-a", true, Some(false));
    set_conditions(&lab, "node-b", true, Some(true));
    moved_away(&lab, "node-b", "NetworkUnavailable");
    assert!(
        procs[1].log().contains("lease released"),
        "{}",
        procs[1].log()
    );
    assert_eq!(
        services_ineligible(&lab, "node-b"),
        Some(vec![unavailable.to_string()])
    );

    // node-a stops (its lease released): node-b, alone and still without network, takes
    // nothing. An eligible node takes a released lease within its retry period (1 s) plus
    // its spread delay (under 1 s); 5 s is several times that.
    procs[0].signal(Signal::SIGTERM).unwrap();
    let _ = procs[0].wait_timeout(Duration::from_secs(5));
    wait_until("node-a's VIP gone", LIMIT, || {
        holders(&lab, SVC_VIP).is_empty()
    });
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        holders(&lab, SVC_VIP).is_empty(),
        "a NetworkUnavailable node must not take the VIP: {:?}",
        holders(&lab, SVC_VIP)
    );
    set_conditions(&lab, "node-b", true, Some(false));
    wait_until("node-b takes the VIP once its network is up", LIMIT, || {
        holders(&lab, SVC_VIP) == vec!["node-b".to_string()]
    });
    assert_eq!(services_ineligible(&lab, "node-b"), Some(vec![]));
    for p in &mut procs {
        let _ = p.signal(Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(5));
    }
}
