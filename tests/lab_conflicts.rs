//! Lab tests of address conflict detection (RFC 5227 probing and the conflict watch): an
//! address that another host on the segment answers for is never bound by vipd, the
//! Service gets an `AddressInUse` Warning Event naming the other MAC, and the address is
//! taken as soon as it is free. Named after the scenarios in `docs/scenarios.md`
//! (S33 foreign address).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::*;
use xtask::lab::{Lab, LabOptions, LabProcess, MacAddr, WatchReport};

/// Every slot of the watch was answered by at most one MAC, and only by `allowed`.
fn assert_one_responder(report: &WatchReport, allowed: &BTreeSet<MacAddr>, what: &str) {
    let multi = report.multi_responder_intervals();
    assert!(
        multi.is_empty(),
        "{what}: answered by two MACs at once: {multi:?}"
    );
    let all = report.all_responders();
    assert!(
        all.is_subset(allowed),
        "{what}: answered by {all:?}, allowed only {allowed:?}"
    );
}

fn has_event(lab: &Lab, ns: &str, name: &str, reason: &str, contains: &str) -> bool {
    events_in(lab, ns, name)
        .iter()
        .any(|(t, r, note)| t == "Warning" && r == reason && note.contains(contains))
}

/// S33 (input: a host outside the cluster, or a node's secondary address that is in no Node
/// object): `192.0.2.77/24` added by hand to node-c's eth0, a Service annotated with it. No
/// vipd node binds it (node-c's own vipd refuses an address the node has untagged; node-a
/// and node-b probe and hear node-c answer); the Service gets a Warning naming node-c's MAC;
/// once node-c drops the address, a vipd node takes it. Same for a Service annotated with
/// node-b's own address while no Node objects exist (the lab has none).
#[test]
fn s33_foreign_address_never_bound_and_taken_once_free() {
    let Some(lab) = lab("s33-foreign", LabOptions::default()) else {
        return;
    };
    let mac_c = lab.mac_of("node-c").expect("mac");
    let mac_b = lab.mac_of("node-b").expect("mac");
    lab.exec(
        "node-c",
        "ip",
        &["addr", "add", "192.0.2.77/24", "dev", "eth0"],
    )
    .expect("add foreign address");
    let procs: Vec<LabProcess> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[]))
        .collect();
    let watch77 = lab
        .arp_watch("192.0.2.77".parse().unwrap(), Duration::from_millis(50))
        .expect("watch");
    let watch12 = lab
        .arp_watch("192.0.2.12".parse().unwrap(), Duration::from_millis(50))
        .expect("watch");
    create_service(
        &lab,
        &service_json("foreign", Some("192.0.2.77"), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json(
            "node-b-addr",
            Some("192.0.2.12"),
            None,
            &[(80, "TCP")],
            false,
        ),
    );
    // Some node takes each lease, probes, hears the owner and refuses with an Event.
    let mac_c_s = mac_c.to_string();
    let mac_b_s = mac_b.to_string();
    wait_for(
        "AddressInUse event naming node-c",
        Duration::from_secs(30),
        || has_event(&lab, "default", "foreign", "AddressInUse", &mac_c_s).then_some(()),
    );
    wait_for(
        "AddressInUse event naming node-b",
        Duration::from_secs(30),
        || has_event(&lab, "default", "node-b-addr", "AddressInUse", &mac_b_s).then_some(()),
    );
    // A few seconds of renewals and re-probes: still only the owners carry the addresses.
    for _ in 0..25 {
        assert_eq!(holders(&lab, "192.0.2.77"), vec!["node-c".to_string()]);
        assert_eq!(holders(&lab, "192.0.2.12"), vec!["node-b".to_string()]);
        // The status claims nothing the holder refused (the new-user trial saw ingress and
        // vipHost naming the lease holder, and an AddressAnnounced Event).
        for svc in ["foreign", "node-b-addr"] {
            assert!(ingress_ips(&lab, svc).is_empty(), "{svc}: ingress written");
            let host = get_service(&lab, svc).and_then(|s| {
                s["metadata"]["annotations"]["kube-vip.io/vipHost"]
                    .as_str()
                    .map(str::to_string)
            });
            assert_eq!(host, None, "{svc}: vipHost written");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !events_in(&lab, "default", "foreign")
            .iter()
            .any(|(_, r, _)| r == "AddressAnnounced"),
        "an AddressAnnounced Event for a refused address"
    );
    let report12 = watch12.stop().expect("watch");
    assert_one_responder(&report12, &BTreeSet::from([mac_b]), "192.0.2.12");
    assert!(report12.answered_slots() > 50, "node-b kept answering");
    // The foreign host lets the address go: a vipd node takes it (re-probe back-off is at
    // most 45 s).
    lab.exec(
        "node-c",
        "ip",
        &["addr", "del", "192.0.2.77/24", "dev", "eth0"],
    )
    .expect("del foreign address");
    let h = wait_for(
        "a vipd node takes 192.0.2.77",
        Duration::from_secs(60),
        || {
            let h = holders(&lab, "192.0.2.77");
            (h.len() == 1).then(|| h[0].clone())
        },
    );
    // Answered by the new holder from now on.
    let mac_h = lab.mac_of(&h).expect("mac");
    wait_for("the new holder answers", Duration::from_secs(10), || {
        watch77
            .report()
            .last_responders()
            .contains(&mac_h)
            .then_some(())
    });
    let report77 = watch77.stop().expect("watch");
    if !report77.multi_responder_intervals().is_empty() {
        dump(&procs.iter().collect::<Vec<_>>());
    }
    assert_one_responder(&report77, &BTreeSet::from([mac_c, mac_h]), "192.0.2.77");
    let log = procs.iter().map(LabProcess::log).collect::<String>();
    assert!(
        log.contains("address conflict"),
        "the conflict is logged:\n{log}"
    );
}

/// S33 (input: misconfigured nodes): node-a watches only namespace ns1, node-b only ns2, and
/// one address is used by a Service in each. Each node sees a different Service and lease
/// and would hold the address indefinitely; with conflict detection exactly one binds it,
/// the other refuses with a Warning Event naming the first one's MAC, and no ARP request
/// is ever answered by two MACs. (A simultaneous first probe may leave one Event on the
/// winner's Service too, never more: seen once in a loaded full run.)
#[test]
fn s33_nodes_watching_different_namespaces_one_responder() {
    let Some(lab) = lab("s33-namespaces", LabOptions::default()) else {
        return;
    };
    create_namespace(&lab, "ns1");
    create_namespace(&lab, "ns2");
    let watch = lab
        .arp_watch("192.0.2.78".parse().unwrap(), Duration::from_millis(50))
        .expect("watch");
    let procs = [
        start_vipd_services(&lab, "node-a", true, &[("svc_namespace", "ns1")]),
        start_vipd_services(&lab, "node-b", true, &[("svc_namespace", "ns2")]),
    ];
    let svc = service_json("web", Some("192.0.2.78"), None, &[(80, "TCP")], false);
    create_service_in(&lab, "ns1", &svc);
    create_service_in(&lab, "ns2", &svc);
    let h = single_holder(&lab, "192.0.2.78", Duration::from_secs(20));
    let (winner_ns, loser_ns, loser) = if h == "node-a" {
        ("ns1", "ns2", "node-b")
    } else {
        ("ns2", "ns1", "node-a")
    };
    let mac_h = lab.mac_of(&h).expect("mac");
    let mac_l = lab.mac_of(loser).expect("mac");
    wait_for(
        "AddressInUse event on the loser's Service",
        Duration::from_secs(30),
        || has_event(&lab, loser_ns, "web", "AddressInUse", &mac_h.to_string()).then_some(()),
    );
    // Both keep their leases and renew for several lease durations: still one holder.
    for _ in 0..50 {
        assert_eq!(holders(&lab, "192.0.2.78"), vec![h.clone()]);
        std::thread::sleep(Duration::from_millis(200));
    }
    let report = watch.stop().expect("watch");
    if !report.multi_responder_intervals().is_empty() {
        dump(&procs.iter().collect::<Vec<_>>());
    }
    assert_one_responder(&report, &BTreeSet::from([mac_h, mac_l]), "192.0.2.78");
    assert_eq!(
        report.all_responders(),
        BTreeSet::from([mac_h]),
        "only the first binder ever answered"
    );
    // Both nodes may probe in the same window at first (RFC 5227: each then takes the other's
    // probe as a conflict and backs off), which leaves one Event on the later winner too;
    // holding, it never posts another.
    let winner_events: Vec<_> = events_in(&lab, winner_ns, "web")
        .into_iter()
        .filter(|(_, r, _)| r == "AddressInUse")
        .collect();
    assert!(
        winner_events.len() <= 1,
        "the holder's Service gets no conflict events while it holds: {winner_events:?}"
    );
}

/// S33 for IPv6: `2001:db8::77/64` configured by hand on node-c, a Service annotated with
/// it. node-a and node-b probe with a DAD-style neighbour solicitation, hear node-c's
/// advertisement and refuse; only node-c ever answers a neighbour solicitation for it.
#[test]
fn s33_foreign_ipv6_address_never_bound() {
    let Some(lab) = lab("s33-foreign6", LabOptions::default()) else {
        return;
    };
    let mac_c = lab.mac_of("node-c").expect("mac");
    lab.exec(
        "node-c",
        "ip",
        &["addr", "add", "2001:db8::77/64", "dev", "eth0", "nodad"],
    )
    .expect("add foreign address");
    let procs: Vec<LabProcess> = ["node-a", "node-b"]
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[]))
        .collect();
    let watch = lab
        .arp_watch("2001:db8::77".parse().unwrap(), Duration::from_millis(50))
        .expect("watch");
    create_service(
        &lab,
        &service_json(
            "foreign6",
            Some("2001:db8::77"),
            None,
            &[(80, "TCP")],
            false,
        ),
    );
    wait_for(
        "AddressInUse event naming node-c",
        Duration::from_secs(30),
        || {
            has_event(
                &lab,
                "default",
                "foreign6",
                "AddressInUse",
                &mac_c.to_string(),
            )
            .then_some(())
        },
    );
    for _ in 0..25 {
        assert_eq!(holders(&lab, "2001:db8::77"), vec!["node-c".to_string()]);
        std::thread::sleep(Duration::from_millis(200));
    }
    let report = watch.stop().expect("watch");
    if !report.multi_responder_intervals().is_empty() {
        dump(&procs.iter().collect::<Vec<_>>());
    }
    assert_one_responder(&report, &BTreeSet::from([mac_c]), "2001:db8::77");
    assert!(report.answered_slots() > 50, "node-c kept answering");
}
