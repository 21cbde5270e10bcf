//! S38 / issue 28: the status task of a shard's holder (`services::sync::follow`) under a
//! cold start's backlog. Hundreds of Services exist before vipd starts; their status,
//! `kube-vip.io/vipHost` and AddressAnnounced Events go through the process's 4 write
//! slots, so the holder of a shard Lease writes for a while. Meanwhile:
//! - a Service created then is bound at once (the group loop does not wait for the
//!   writes) and gets its status and vipHost once the backlog is through;
//! - a Service deleted then is not left announced;
//! - a Service deleted then and re-created under the same name as a ClusterIP Service
//!   (someone else's now) never shows the old status or vipHost: a write decided from the
//!   spec the sync started with must not land on the new object.
//!
//! The times are printed (`cargo test --test lab_status_task -- --nocapture`); the limits
//! are generous, only to end a hung run.
//!
//! Run as root: `cargo test --test lab_status_task` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::{Lab, LabOptions, LabProcess};

/// Generous limit for anything in these tests (a hung run, not a slow one).
const LIMIT: Duration = Duration::from_secs(90);

/// A Service's status as the API server has it: ingress IPs and `kube-vip.io/vipHost`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Seen {
    ingress: Vec<String>,
    vip_host: Option<String>,
    cluster_ip_type: bool,
}

/// Every Service in `default` by name, in one list call.
fn list(lab: &Lab) -> BTreeMap<String, Seen> {
    let resp = lab
        .api_request("GET", "/api/v1/namespaces/default/services", None)
        .expect("list services");
    assert_eq!(resp.status, 200, "list services: {}", resp.body);
    let v: serde_json::Value = serde_json::from_str(&resp.body).expect("services json");
    let mut out = BTreeMap::new();
    for s in v["items"].as_array().cloned().unwrap_or_default() {
        let Some(name) = s["metadata"]["name"].as_str() else {
            continue;
        };
        let ingress = s["status"]["loadBalancer"]["ingress"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i["ip"].as_str().map(str::to_string))
            .collect();
        let vip_host = s["metadata"]["annotations"]["kube-vip.io/vipHost"]
            .as_str()
            .map(str::to_string);
        out.insert(
            name.to_string(),
            Seen {
                ingress,
                vip_host,
                cluster_ip_type: s["spec"]["type"] == "ClusterIP",
            },
        );
    }
    out
}

/// `svc-<i>` on its own address: 192.0.2.21-99, then 192.0.2.101-191 (170 in all; .100 is
/// the client, .199 is left for the late Service, .200-220 for DHCP).
fn cold_services() -> Vec<(String, String)> {
    (21..=99)
        .chain(101..=191)
        .enumerate()
        .map(|(i, last)| (format!("svc-{i}"), format!("192.0.2.{last}")))
        .collect()
}

/// Whether `seen` has `ip` as its only ingress and `node` as its vipHost.
fn written(seen: Option<&Seen>, ip: &str, node: &str) -> bool {
    seen.is_some_and(|s| s.ingress == [ip] && s.vip_host.as_deref() == Some(node))
}

/// Polls `f` every 50 ms until it holds, dumping `procs`' logs and panicking after
/// [`LIMIT`]; returns the time it took.
fn wait(what: &str, procs: &[&LabProcess], mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > LIMIT {
            dump(procs);
            panic!("timed out after {LIMIT:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// 170 Services exist before vipd starts on node-a alone with 4 shard Leases (so it holds
/// every shard and has all 170 statuses to write). As soon as the first status lands, while
/// the rest are still being written: a late Service is created, one unwritten Service is
/// deleted, another is deleted and re-created as a ClusterIP Service of the same name.
#[test]
fn s38_shard_holder_writing_a_cold_start_answers_new_and_deleted_services() {
    let Some(lab) = lab("status_task_cold_start", LabOptions::default()) else {
        return;
    };
    let cold = cold_services();
    for (name, ip) in &cold {
        create_service(
            &lab,
            &service_json(name, Some(ip), None, &[(80, "TCP")], false),
        );
    }
    let a = start_vipd_services(&lab, "node-a", true, &[("svc_leaseshards", "4")]);
    let procs = [&a];
    let started = Instant::now();
    // The first status written: the cold start's writes are under way.
    let mut seen = BTreeMap::new();
    wait("the first cold-start status", &procs, || {
        seen = list(&lab);
        cold.iter()
            .any(|(name, ip)| written(seen.get(name), ip, "node-a"))
    });
    let first = started.elapsed();
    let unwritten: Vec<&(String, String)> = cold
        .iter()
        .filter(|(name, ip)| !written(seen.get(name), ip, "node-a"))
        .collect();
    eprintln!(
        "cold start: first status after {first:?}; {} of {} still unwritten",
        unwritten.len(),
        cold.len()
    );
    // The late Service, and two victims among those not written yet (the last ones in
    // name order; with fewer than two left the backlog is over and the test says so below).
    let late_ip = "192.0.2.199";
    create_service(
        &lab,
        &service_json("late", Some(late_ip), None, &[(80, "TCP")], false),
    );
    let t0 = Instant::now();
    let victims: Vec<(String, String)> = unwritten
        .iter()
        .rev()
        .take(2)
        .map(|v| (*v).clone())
        .collect();
    for (name, _) in &victims {
        delete_service(&lab, name);
    }
    let recreated = victims.first().cloned();
    if let Some((name, ip)) = &recreated {
        let mut svc = service_json(name, Some(ip), None, &[(80, "TCP")], false);
        svc["spec"]["type"] = serde_json::json!("ClusterIP");
        svc["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("externalTrafficPolicy");
        create_service(&lab, &svc);
    }
    let now = list(&lab);
    let backlog_left = cold
        .iter()
        .filter(|(name, ip)| !written(now.get(name), ip, "node-a"))
        .count();
    eprintln!(
        "late Service created and {} deleted ({:?}) with {backlog_left} statuses still unwritten",
        victims.len(),
        victims.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()
    );
    // The late Service: bound without waiting for the backlog, then its status.
    wait("the late Service bound", &procs, || {
        holders(&lab, late_ip) == ["node-a"]
    });
    let bound = t0.elapsed();
    let mut stale_on_recreated: Vec<Seen> = Vec::new();
    let mut check_recreated = |seen: &BTreeMap<String, Seen>| {
        if let Some((name, _)) = &recreated
            && let Some(s) = seen.get(name)
            && s.cluster_ip_type
            && (!s.ingress.is_empty() || s.vip_host.is_some())
        {
            stale_on_recreated.push(s.clone());
        }
    };
    wait("the late Service's status and vipHost", &procs, || {
        let seen = list(&lab);
        check_recreated(&seen);
        written(seen.get("late"), late_ip, "node-a")
    });
    let status = t0.elapsed();
    let unwritten_then = {
        let seen = list(&lab);
        check_recreated(&seen);
        cold.iter()
            .filter(|c| !victims.contains(c))
            .filter(|(name, ip)| !written(seen.get(name), ip, "node-a"))
            .count()
    };
    eprintln!(
        "late Service: bound after {bound:?}, status and vipHost after {status:?} \
         ({unwritten_then} cold-start statuses still unwritten then)"
    );
    // The rest of the backlog, and the victims' addresses dropped.
    wait("every cold-start status", &procs, || {
        let seen = list(&lab);
        check_recreated(&seen);
        cold.iter()
            .filter(|c| !victims.contains(c))
            .all(|(name, ip)| written(seen.get(name), ip, "node-a"))
    });
    eprintln!(
        "cold start: every status written {:?} after vipd started",
        started.elapsed()
    );
    for (name, ip) in &victims {
        wait(&format!("{name}'s address {ip} dropped"), &procs, || {
            holders(&lab, ip).is_empty()
        });
    }
    // A few more cache passes: nothing lands on the re-created Service late.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(5) {
        let seen = list(&lab);
        check_recreated(&seen);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !victims.is_empty(),
        "the cold start's writes were over before the test saw the first one: no victim"
    );
    if stale_on_recreated.is_empty() {
        return;
    }
    dump(&procs);
    panic!(
        "{:?} was deleted and re-created as a ClusterIP Service while the holder wrote the \
         cold start's statuses, and got the old Service's status and vipHost: {:?}",
        recreated, stale_on_recreated
    );
}
