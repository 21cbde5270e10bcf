//! S45: spread without preemption. 30 LoadBalancer Services exist before three vipd nodes
//! start (per-Service leases); each node delays acquiring a free lease by how many it
//! already holds, so they end 10/10/10 (±1) with no lease ever taken from its holder.
//! S50 (at the end): preferred nodes campaign first.
//!
//! Run as root: `cargo test --test lab_spread` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

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
