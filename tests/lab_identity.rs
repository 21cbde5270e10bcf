//! Lab test of scenario S35 "Identity collision": two vipd processes configured with the
//! same node name (`vip_nodename=node-x` on node-a and node-b). Before S35 both renewed the
//! one Lease as their own and both carried the control-plane VIP, silently.

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::LabOptions;

const LEASE_NS: &str = "kube-system";
const LEASE_NAME: &str = "plndr-cp-lock";

/// Events in `kube-system` about Lease `plndr-cp-lock`, as (type, reason, note).
fn lease_events(lab: &xtask::lab::Lab) -> Vec<(String, String, String)> {
    let resp = lab
        .api_request(
            "GET",
            &format!("/apis/events.k8s.io/v1/namespaces/{LEASE_NS}/events"),
            None,
        )
        .expect("events");
    let v: serde_json::Value = serde_json::from_str(&resp.body).unwrap_or_default();
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["regarding"]["kind"] == "Lease" && e["regarding"]["name"] == LEASE_NAME)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("type"), s("reason"), s("note"))
        })
        .collect()
}

/// S35: both processes run under `node-x`. Over four lease durations (5/3/1) no ARP request
/// for the VIP is answered by two MACs and only the holder ever carries it; the other one
/// logged the duplicate identity (ERROR naming the lease, the identity and that node names
/// must be unique), fails `/readyz`, counts it in its metrics, and a Warning Event
/// `DuplicateIdentity` was posted about the Lease.
#[test]
fn s35_duplicate_identity_never_two_holders() {
    let Some(lab) = lab("s35", LabOptions::default()) else {
        return;
    };
    let vip: IpAddr = VIP.parse().unwrap();
    let nodes = ["node-a", "node-b"];
    // From before the first acquisition: a second responder at any moment fails the test.
    let watch = lab.arp_watch(vip, Duration::from_millis(50)).unwrap();
    let extra = [("vip_nodename", "node-x"), ("prometheus_server", ":2112")];
    let procs: Vec<_> = nodes
        .iter()
        .map(|n| start_vipd(&lab, n, T531, &extra))
        .collect();
    let holder = wait_for("a holder of the VIP", Duration::from_secs(30), || {
        let h = holders(&lab, VIP);
        assert!(h.len() <= 1, "both nodes carry {VIP}: {h:?}");
        h.first().cloned()
    });
    let i = nodes.iter().position(|n| *n == holder).unwrap();
    let other = nodes[1 - i];
    // Several lease durations (each 5 s): with a twin that renews, nobody's lease expires;
    // the check runs every 100 ms on the nodes' addresses, the ARP watcher every 50 ms.
    // A sample without the VIP is not a failure: on a loaded machine a renewal that comes
    // late lets the address lifetime (the kernel fence) remove it until the next renewal,
    // which is the fence doing its job. The twin carrying it, or two carriers, is.
    let window = Duration::from_secs(20);
    let t0 = Instant::now();
    let mut empty_samples = 0u32;
    while t0.elapsed() < window {
        let h = holders(&lab, VIP);
        if h.is_empty() {
            empty_samples += 1;
        } else if h != vec![holder.clone()] {
            let why = format!(
                "after {:?}: VIP carried by {h:?}, expected only {holder}",
                t0.elapsed()
            );
            eprintln!("S35 FAILED: {why}");
            dump(&[&procs[0], &procs[1]]);
            panic!("{why}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("S35: {empty_samples} samples of 100 ms without the VIP on {holder}");
    let report = watch.stop().unwrap();
    assert!(
        report.max_simultaneous_responders() <= 1,
        "two MACs answered for {VIP}: {:?}",
        report.multi_responder_intervals()
    );
    let holder_mac = lab.mac_of(&holder).unwrap();
    assert_eq!(
        report.all_responders(),
        BTreeSet::from([holder_mac]),
        "only {holder} ever answered"
    );
    assert!(report.answered_slots() > 0);
    assert_eq!(
        lease_holder(&lab, LEASE_NS, LEASE_NAME).as_deref(),
        Some("node-x")
    );

    // The node that does not hold the VIP reported the duplicate; the holder had no reason
    // to (it saw no write but its own).
    let log = procs[1 - i].log();
    let error_line = log
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("duplicate identity"))
        .unwrap_or_else(|| {
            eprintln!("S35 FAILED: {other} logged no duplicate-identity error");
            dump(&[&procs[0], &procs[1]]);
            panic!("{other} logged no duplicate-identity error")
        });
    for part in ["kube-system/plndr-cp-lock", "node-x", "must be unique"] {
        assert!(
            error_line.contains(part),
            "{part:?} missing in: {error_line}"
        );
    }
    eprintln!("S35: {holder} holds the VIP; {other} logged: {error_line}");
    assert_eq!(
        log.matches("duplicate identity: another process").count(),
        1,
        "logged once:\n{log}"
    );
    assert!(
        !procs[i]
            .log()
            .contains("duplicate identity: another process"),
        "{}",
        procs[i].log()
    );

    let admin: SocketAddr = "127.0.0.1:2112".parse().unwrap();
    let get = |node: &str, path: &str| {
        lab.http_get(node, admin, path, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("GET {path} on {node}: {e}"))
    };
    let readyz = get(other, "/readyz");
    assert!(
        readyz.starts_with("not ready: duplicate-identity"),
        "{other} /readyz: {readyz}"
    );
    assert!(
        readyz.contains("kube-system/plndr-cp-lock") && readyz.contains("must be unique"),
        "{readyz}"
    );
    assert_eq!(
        get(&holder, "/readyz").lines().next().unwrap_or_default(),
        "ok",
        "{holder} /readyz"
    );
    let metrics = get(other, "/metrics");
    let counted = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                r#"vipd_duplicate_identity_total{lease_name="kube-system/plndr-cp-lock"}"#,
            )
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    // The holder renews every second, each renewal is a write under node-x it did not make.
    assert!(counted >= 10.0, "vipd_duplicate_identity_total {counted}");

    let events = wait_for("DuplicateIdentity event", Duration::from_secs(5), || {
        let ev: Vec<_> = lease_events(&lab)
            .into_iter()
            .filter(|(_, reason, _)| reason == "DuplicateIdentity")
            .collect();
        (!ev.is_empty()).then_some(ev)
    });
    let (kind, _, note) = &events[0];
    assert_eq!(kind, "Warning");
    assert!(
        note.contains("node-x") && note.contains("must be unique"),
        "{note}"
    );
}
