//! S45: spread without preemption. 30 LoadBalancer Services exist before three vipd nodes
//! start (per-Service leases); each node delays acquiring a free lease by how many it
//! already holds, so they end 10/10/10 (±1) with no lease ever taken from its holder.
//! S50 (at the end): preferred nodes campaign first. S52: fail-back (`svc_failback`).
//!
//! Run as root: `cargo test --test lab_spread` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::{LabOptions, Signal};

const SERVICES: usize = 30;

/// Holder of every `kubevip-svc-*` lease (empty: none).
fn lease_holders(lab: &xtask::lab::Lab) -> BTreeMap<String, String> {
    let r = lab
        .api_request(
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            None,
        )
        .expect("list leases");
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|l| {
            let name = l["metadata"]["name"].as_str()?;
            name.starts_with("kubevip-svc-").then(|| {
                (
                    name.to_string(),
                    l["spec"]["holderIdentity"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
        })
        .collect()
}

#[test]
fn s45_thirty_services_spread_over_three_nodes_without_preemption() {
    let Some(lab) = lab("spread", LabOptions::default()) else {
        return;
    };
    for i in 0..SERVICES {
        let ip = format!("192.0.2.{}", 100 + i);
        create_service(
            &lab,
            &service_json(&format!("svc-{i}"), Some(&ip), None, &[(80, "TCP")], false),
        );
    }
    let mut procs: Vec<_> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[]))
        .collect();
    let holders = wait_for("every Service lease held", Duration::from_secs(60), || {
        let h = lease_holders(&lab);
        (h.len() == SERVICES && h.values().all(|v| !v.is_empty())).then_some(h)
    });
    let count = |h: &BTreeMap<String, String>| {
        let mut c: BTreeMap<String, usize> = BTreeMap::new();
        for v in h.values() {
            *c.entry(v.clone()).or_default() += 1;
        }
        c
    };
    let first = count(&holders);
    eprintln!("S45 spread after a cold start: {first:?}");
    // No preemption: nothing moves afterwards.
    std::thread::sleep(Duration::from_secs(5));
    let later = lease_holders(&lab);
    assert_eq!(later, holders, "a held lease moved (preemption)");
    assert_eq!(first.len(), 3, "every node holds some: {first:?}");
    assert!(
        first.values().all(|&n| (9..=11).contains(&n)),
        "not 10/10/10 (±1): {first:?}"
    );
    for p in &mut procs {
        let _ = p.signal(Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(10));
    }
}

/// S50: preferred nodes campaign first. With both nodes up and idle, every Service whose
/// `vipd.io/preferred-nodes` is `node-b,node-a` goes to node-b (node-a waits 100 ms); when
/// node-b stops they move to node-a, and a returning node-b takes none back (no
/// preemption).
#[test]
fn s50_preferred_nodes_campaign_first_without_preemption() {
    let Some(lab) = lab("spread_preferred", LabOptions::default()) else {
        return;
    };
    let mut procs: Vec<_> = ["node-a", "node-b"]
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[]))
        .collect();
    // Past the spread's discovery period: idle nodes race equally for a new Service.
    std::thread::sleep(Duration::from_secs(4));
    let vips: Vec<String> = (0..4).map(|i| format!("192.0.2.{}", 60 + i)).collect();
    for (i, ip) in vips.iter().enumerate() {
        let mut svc = service_json(&format!("pref-{i}"), Some(ip), None, &[(80, "TCP")], false);
        svc["metadata"]["annotations"]["vipd.io/preferred-nodes"] =
            serde_json::json!("node-b, node-a");
        create_service(&lab, &svc);
        assert_eq!(
            single_holder(&lab, ip, Duration::from_secs(20)),
            "node-b",
            "{ip}: the preferred node takes it"
        );
    }
    procs[1].signal(Signal::SIGTERM).unwrap();
    let _ = procs[1].wait_timeout(Duration::from_secs(10));
    for ip in &vips {
        wait_until(
            &format!("{ip} moves to node-a"),
            Duration::from_secs(20),
            || holders(&lab, ip) == vec!["node-a".to_string()],
        );
    }
    procs[1] = start_vipd_services(&lab, "node-b", true, &[]);
    std::thread::sleep(Duration::from_secs(5));
    for ip in &vips {
        assert_eq!(
            holders(&lab, ip),
            vec!["node-a".to_string()],
            "{ip}: no preemption by the returning preferred node"
        );
    }
    for p in &mut procs {
        let _ = p.signal(Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(5));
    }
}

/// S52: fail-back. With `svc_failback` (hold-down 4 s) on both nodes, a Service preferring
/// `node-b, node-a` moves to node-a when node-b stops; when node-b returns it stays on node-a
/// for the hold-down, then moves back with one graceful hand-over: never two ARP responders
/// (20 ms slots), one change of responder, a short silent gap (printed), and it stays.
#[test]
fn s52_failback_returns_the_service_after_the_holddown_with_one_handover() {
    let Some(lab) = lab("spread_failback", LabOptions::default()) else {
        return;
    };
    let extra = [("svc_failback", "true"), ("svc_failback_holddown", "4")];
    let mut procs: Vec<_> = ["node-a", "node-b"]
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &extra))
        .collect();
    std::thread::sleep(Duration::from_secs(4));
    let ip = "192.0.2.70";
    let mut svc = service_json("failback", Some(ip), None, &[(80, "TCP")], false);
    svc["metadata"]["annotations"]["vipd.io/preferred-nodes"] = serde_json::json!("node-b, node-a");
    create_service(&lab, &svc);
    assert_eq!(single_holder(&lab, ip, Duration::from_secs(20)), "node-b");
    procs[1].signal(Signal::SIGTERM).unwrap();
    let _ = procs[1].wait_timeout(Duration::from_secs(10));
    wait_until("the VIP moves to node-a", Duration::from_secs(20), || {
        holders(&lab, ip) == vec!["node-a".to_string()]
    });
    let arp = lab
        .arp_watch_from_api(ip.parse().expect("ip"), Duration::from_millis(20))
        .expect("arp watcher");
    procs[1] = start_vipd_services(&lab, "node-b", true, &extra);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        holders(&lab, ip),
        vec!["node-a".to_string()],
        "no move before the hold-down"
    );
    wait_until(
        "the VIP fails back to node-b",
        Duration::from_secs(20),
        || holders(&lab, ip) == vec!["node-b".to_string()],
    );
    let moved = t0.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    let report = arp.stop().expect("arp watcher");
    assert_eq!(holders(&lab, ip), vec!["node-b".to_string()], "it stays");
    let old_log = procs[0].log();
    if report.max_simultaneous_responders() > 1 || !old_log.contains("fail-back") {
        for p in &procs {
            eprintln!("===== {} =====\n{}", p.name(), p.log());
        }
    }
    assert!(
        report.max_simultaneous_responders() <= 1,
        "two responders: {:?}",
        report.multi_responder_intervals()
    );
    assert!(
        old_log.contains("fail-back"),
        "node-a handed over for fail-back"
    );
    // One hand-over: the responder changes once; the longest silent run between them.
    let answered: Vec<_> = report
        .slots
        .iter()
        .filter(|s| !s.responders.is_empty())
        .collect();
    let changes = answered
        .windows(2)
        .filter(|w| w[0].responders != w[1].responders)
        .count();
    let gap = answered
        .windows(2)
        .map(|w| w[1].t - w[0].t)
        .max()
        .unwrap_or_default();
    println!(
        "S52: node-b back, the VIP moved after {} ms (hold-down 4 s); responder changes {changes}; longest silent gap {} ms",
        moved.as_millis(),
        gap.as_millis()
    );
    assert_eq!(changes, 1, "one hand-over");
    assert!(moved >= Duration::from_secs(4), "not before the hold-down");
    for p in &mut procs {
        let _ = p.signal(Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(5));
    }
}
