//! S44: health-checked Service failover against the real API server. Each node runs an
//! HTTP stub on 127.0.0.1 in its own namespace standing in for kube-proxy's health endpoint
//! (`svc_healthcheck`), answering 200 or 500 as the test says. When the holder's stub
//! answers 500 the Service moves to the other node, with a `HealthCheckFailed` Warning
//! Event naming the check and the error; a stub that flaps moves the Service at most once
//! per hold time (`svc_healthcheck_hold`).
//!
//! Run as root: `cargo test --test lab_health` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::{Lab, LabOptions, LabProcess, Signal, ThreadServer};

const SVC_VIP: &str = "192.0.2.20";
const LIMIT: Duration = Duration::from_secs(30);
const STUB_PORT: u16 = 18080;
const CHECK: &str = "http://127.0.0.1:18080/healthz";

/// One health stub per node, answering the node's entry of the returned codes.
fn start_stubs(lab: &Lab) -> (Vec<ThreadServer>, [Arc<AtomicU16>; 2]) {
    let codes = [Arc::new(AtomicU16::new(200)), Arc::new(AtomicU16::new(200))];
    let stubs = ["node-a", "node-b"]
        .iter()
        .zip(&codes)
        .map(|(n, code)| {
            ThreadServer::http_status(
                &lab.netns_path(n).expect("netns"),
                &format!("healthz-{n}"),
                SocketAddr::from((Ipv4Addr::LOCALHOST, STUB_PORT)),
                code.clone(),
            )
            .expect("start health stub")
        })
        .collect();
    (stubs, codes)
}

fn start_nodes(lab: &Lab, hold: &str) -> Vec<LabProcess> {
    ["node-a", "node-b"]
        .iter()
        .map(|n| {
            start_vipd_services(
                lab,
                n,
                true,
                &[("svc_healthcheck", CHECK), ("svc_healthcheck_hold", hold)],
            )
        })
        .collect()
}

fn idx(node: &str) -> usize {
    if node == "node-a" { 0 } else { 1 }
}

fn other(node: &str) -> &'static str {
    if node == "node-a" { "node-b" } else { "node-a" }
}

fn stop_all(procs: &mut [LabProcess]) {
    for p in procs {
        let _ = p.signal(Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(5));
    }
}

#[test]
fn s44_unhealthy_holder_hands_the_service_over() {
    let Some(lab) = lab("health", LabOptions::default()) else {
        return;
    };
    let (_stubs, codes) = start_stubs(&lab);
    let mut procs = start_nodes(&lab, "3");
    create_service(
        &lab,
        &service_json("web", Some(SVC_VIP), None, &[(80, "TCP")], false),
    );
    let first = single_holder(&lab, SVC_VIP, LIMIT);
    let second = other(&first);
    codes[idx(&first)].store(500, Ordering::SeqCst);
    wait_until(&format!("{SVC_VIP} moves to {second}"), LIMIT, || {
        holders(&lab, SVC_VIP) == vec![second.to_string()]
    });
    assert_eq!(
        lease_holder(&lab, "default", "kubevip-web").as_deref(),
        Some(second)
    );
    wait_until("HealthCheckFailed Warning Event", LIMIT, || {
        events_for(&lab, "web").iter().any(|(kind, reason, note)| {
            kind == "Warning"
                && reason == "HealthCheckFailed"
                && note.contains(&format!("node {first} hands {SVC_VIP} over"))
                && note.contains(CHECK)
                && note.contains("HTTP 500")
        })
    });
    // Graceful: the lease was released, not left to expire.
    let log = procs[idx(&first)].log();
    assert!(log.contains("lease released"), "{log}");
    // The old holder is healthy again: it campaigns but does not take the Service back.
    codes[idx(&first)].store(200, Ordering::SeqCst);
    assert_held_by_after(&lab, SVC_VIP, second, Duration::from_secs(6));
    // Now the new holder fails too; the first node reopened (2 passes after the 3 s hold).
    codes[idx(second)].store(500, Ordering::SeqCst);
    wait_until(&format!("{SVC_VIP} moves back to {first}"), LIMIT, || {
        holders(&lab, SVC_VIP) == vec![first.clone()]
    });
    stop_all(&mut procs);
}

#[test]
fn s44_flapping_check_moves_the_service_at_most_once_per_hold_time() {
    let Some(lab) = lab("health_flap", LabOptions::default()) else {
        return;
    };
    let hold = Duration::from_secs(8);
    let (_stubs, codes) = start_stubs(&lab);
    let mut procs = start_nodes(&lab, "8");
    create_service(
        &lab,
        &service_json("web", Some(SVC_VIP), None, &[(80, "TCP")], false),
    );
    single_holder(&lab, SVC_VIP, LIMIT);
    let transitions = || {
        lease(&lab, "default", "kubevip-web")
            .and_then(|l| l["spec"]["leaseTransitions"].as_i64())
            .unwrap_or(0)
    };
    // Both stubs flap: every 500 ms each answers 500 with probability 2/3 (a fixed
    // pseudo-random sequence), so runs of three failures are frequent.
    let stop = Arc::new(AtomicBool::new(false));
    let flapper = {
        let stop = stop.clone();
        let codes = codes.clone();
        std::thread::spawn(move || {
            let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
            while !stop.load(Ordering::SeqCst) {
                for c in &codes {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    c.store(
                        if seed.is_multiple_of(3) { 200 } else { 500 },
                        Ordering::SeqCst,
                    );
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    let window = Duration::from_secs(40);
    let start = Instant::now();
    let before = transitions();
    // Every holder change seen, polled every 100 ms (an unannounced gap counts as "").
    let mut changes: Vec<(Duration, String)> = Vec::new();
    let mut last = lease_holder(&lab, "default", "kubevip-web").unwrap_or_default();
    while start.elapsed() < window {
        std::thread::sleep(Duration::from_millis(100));
        let now = lease_holder(&lab, "default", "kubevip-web").unwrap_or_default();
        if now != last {
            changes.push((start.elapsed(), now.clone()));
            last = now;
        }
    }
    let moved = transitions() - before;
    stop.store(true, Ordering::SeqCst);
    let _ = flapper.join();
    eprintln!(
        "S44 flapping: {moved} lease transitions in {window:?} (hold {hold:?}); holder changes: {changes:?}"
    );
    // At most one move per hold time, plus one for the window's edges.
    let allowed = (window.as_secs() / hold.as_secs() + 1) as i64;
    assert!(
        moved <= allowed,
        "{moved} lease transitions in {window:?} with a {hold:?} hold (at most {allowed}): {changes:?}"
    );
    // Acquisitions (changes to a node) are a hold time apart (generous: 1 s slack for the
    // 100 ms polling and the API round trips).
    let acquired: Vec<Duration> = changes
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(t, _)| *t)
        .collect();
    for w in acquired.windows(2) {
        assert!(
            w[1] - w[0] + Duration::from_secs(1) >= hold,
            "two moves {:?} apart: {changes:?}",
            w[1] - w[0]
        );
    }
    stop_all(&mut procs);
}
