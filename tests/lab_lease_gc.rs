//! Lab tests of the orphaned per-Service lease collector (`services::lease_gc`):
//! a Service deleted while its lease holder is down leaves a lease that the cluster's one
//! collector (the holder of `vipd-lease-gc`, another node if the killed one was it)
//! deletes once it stayed unchanged for its duration plus 30 s; a lease vipd did not create
//! (no vipd labels) is never deleted, whatever its name. S17 ("deleting a Service ...
//! deletes its per-Service lease") with the holder down.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use xtask::lab::{Lab, LabOptions, Signal};

/// Lease duration (5 s, T531) + the collector's 30 s grace + its 10 s list interval, + the
/// collector's own 15 s Lease (`vipd-lease-gc`) when the killed holder was the collector (its
/// successor starts its own clock), with margin for the lab's API server.
const GC_LIMIT: Duration = Duration::from_secs(90);

const VIPD_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/managed-by", "vipd"),
    ("app.kubernetes.io/component", "service-lease"),
];

/// Creates Lease `default/name` held by `holder` since an hour ago (long expired), with
/// `labels`; returns its resourceVersion.
fn create_lease(lab: &Lab, name: &str, holder: &str, labels: &[(&str, &str)]) -> String {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 5,
            "acquireTime": "2020-01-01T00:00:00.000000Z",
            "renewTime": "2020-01-01T00:00:00.000000Z",
            "leaseTransitions": 0
        }
    });
    let resp = lab
        .api_request(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            Some(&body.to_string()),
        )
        .expect("create lease");
    assert_eq!(resp.status, 201, "create lease {name}: {}", resp.body);
    let v: serde_json::Value = serde_json::from_str(&resp.body).expect("lease json");
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn resource_version(lab: &Lab, name: &str) -> Option<String> {
    lease(lab, "default", name).map(|l| {
        l["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    })
}

/// S17 with the holder down: node X holds `web`'s lease and is SIGKILLed; `web` is deleted
/// meanwhile. Nobody released the lease, so nobody deleted it at once; the other nodes
/// delete it once it stayed unchanged for its duration plus the grace, with one info line.
#[test]
fn s17_lease_of_service_deleted_while_holder_down_is_collected() {
    let Some(lab) = lab("s17gc", LabOptions::default()) else {
        return;
    };
    let mut procs: Vec<_> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[]))
        .collect();
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.31"), None, &[(80, "TCP")], false),
    );
    let holder = single_holder(&lab, "192.0.2.31", Duration::from_secs(20));
    let l = wait_for("web's lease held", Duration::from_secs(10), || {
        lease(&lab, "default", "kubevip-web")
            .filter(|l| l["spec"]["holderIdentity"].as_str() == Some(holder.as_str()))
    });
    for (k, v) in VIPD_LABELS {
        assert_eq!(
            l["metadata"]["labels"][k].as_str(),
            Some(v),
            "vipd marks the per-Service leases it creates: {l}"
        );
    }
    let i = NODES.iter().position(|n| *n == holder).expect("holder");
    procs[i].signal(Signal::SIGKILL).unwrap();
    let _ = procs[i].try_wait();
    delete_service(&lab, "web");
    let t0 = Instant::now();
    // The survivors do not delete it at once (they never held it) ...
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        lease_holder(&lab, "default", "kubevip-web").as_deref(),
        Some(holder.as_str()),
        "the lease stays while it may still be renewed"
    );
    // ... but once it stayed unchanged past its duration plus the grace.
    let mut gone = false;
    while t0.elapsed() < GC_LIMIT {
        if lease(&lab, "default", "kubevip-web").is_none() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let survivors: Vec<_> = procs
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, p)| p)
        .collect();
    if !gone {
        dump(&survivors);
        panic!("kubevip-web not collected within {GC_LIMIT:?} of the Service's deletion");
    }
    let took = t0.elapsed();
    eprintln!("S17/GC: orphaned lease deleted {took:?} after its Service");
    assert!(
        took >= Duration::from_secs(35),
        "deleted after {took:?}: before its duration (5 s) plus the 30 s grace"
    );
    let lines = wait_for("the GC log line", Duration::from_secs(5), || {
        let n: usize = survivors
            .iter()
            .map(|p| {
                p.log()
                    .lines()
                    .filter(|l| {
                        l.contains("lease GC: deleted") && l.contains("default/kubevip-web")
                    })
                    .count()
            })
            .sum();
        (n > 0).then_some(n)
    });
    assert_eq!(lines, 1, "one info line for the one deleted lease");
    // One collector for the cluster: the holder of vipd-lease-gc (a survivor) deleted it.
    let collector = lease_holder(&lab, "kube-system", "vipd-lease-gc").expect("a collector");
    let j = NODES
        .iter()
        .position(|n| *n == collector)
        .expect("a node collects");
    assert_ne!(j, i, "the killed node cannot collect");
    assert!(
        procs[j].log().contains("lease GC: deleted"),
        "the collector {collector} deleted it"
    );
}

/// A lease vipd did not create is never deleted, whatever its name and however long it has
/// been expired: `kubevip-ghost` (kube-vip's name pattern, no labels), `plndr-svcs-lock`,
/// one with only the managed-by label; a vipd lease whose Service exists is kept too. A
/// vipd-labelled orphan in the same namespace is collected, which proves the collector ran.
#[test]
fn s17_foreign_lease_in_the_namespace_is_never_collected() {
    let Some(lab) = lab("s17foreign", LabOptions::default()) else {
        return;
    };
    let kept = [
        (
            "kubevip-ghost",
            create_lease(&lab, "kubevip-ghost", "kube-vip-node", &[]),
        ),
        (
            "plndr-svcs-lock",
            create_lease(&lab, "plndr-svcs-lock", "node-z", &[]),
        ),
        (
            "kubevip-half",
            create_lease(&lab, "kubevip-half", "node-z", &VIPD_LABELS[..1]),
        ),
        (
            "kubevip-api",
            create_lease(&lab, "kubevip-api", "node-z", &VIPD_LABELS),
        ),
    ];
    // `api` exists (no address: skipped, nobody campaigns) and names kubevip-api.
    create_service(
        &lab,
        &service_json("api", None, None, &[(80, "TCP")], false),
    );
    create_lease(&lab, "kubevip-gone", "node-z", &VIPD_LABELS);
    let p = start_vipd_services(&lab, "node-a", true, &[]);
    let t0 = Instant::now();
    let mut gone = false;
    while t0.elapsed() < GC_LIMIT {
        if lease(&lab, "default", "kubevip-gone").is_none() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if !gone {
        dump(&[&p]);
        panic!("the vipd-labelled orphan kubevip-gone was not collected within {GC_LIMIT:?}");
    }
    // One more list interval and a half: the collector had every chance.
    std::thread::sleep(Duration::from_secs(15));
    for (name, rv) in &kept {
        assert_eq!(
            resource_version(&lab, name).as_deref(),
            Some(rv.as_str()),
            "{name} was deleted or changed"
        );
    }
    let log = p.log();
    for (name, _) in &kept {
        assert!(
            !log.lines()
                .any(|l| l.contains("lease GC: deleted") && l.contains(&format!("default/{name}"))),
            "a GC line about {name}"
        );
    }
}
