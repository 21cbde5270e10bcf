//! Helpers of the DHCP-mode lab tests (issue 13): the Service's macvlan and annotations,
//! who answers for an address, and that a run was quiet (no Warning Event, no WARN/ERROR
//! log line, no panic). Shared by `tests/lab_dhcp.rs` and `tests/lab_dhcp6.rs`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use xtask::lab::{Lab, LabProcess, MacAddr, Signal};

use super::{NODES, events_for, get_service, wait_until};

/// The default macvlan name of a Service: `vip-` and the first 8 characters of its UID.
pub fn macvlan_of(lab: &Lab, svc: &str) -> String {
    let s = get_service(lab, svc).expect("service");
    let uid = s["metadata"]["uid"].as_str().expect("uid");
    format!("vip-{}", &uid[..8])
}
/// The Service's annotation `key`, if set.
pub fn annotation(lab: &Lab, svc: &str, key: &str) -> Option<String> {
    get_service(lab, svc)?["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

/// Probes `ip` from the client (ARP, or neighbour solicitations for IPv6) every 50 ms for
/// about 2 s and returns the MACs that answered, checking that no two answered in one slot
/// and that most slots were answered.
pub fn responders(lab: &Lab, ip: IpAddr) -> BTreeSet<MacAddr> {
    let w = lab
        .arp_watch(ip, xtask::lab::DEFAULT_WATCH_INTERVAL)
        .unwrap();
    wait_until("40 probe slots", Duration::from_secs(10), || {
        w.report().slots.len() >= 41
    });
    let r = w.stop().unwrap();
    assert!(
        r.max_simultaneous_responders() <= 1,
        "two answers for {ip} in one slot: {r:?}"
    );
    assert!(
        r.answered_slots() >= 30,
        "{ip} answered only {} of {} slots",
        r.answered_slots(),
        r.slots.len()
    );
    r.all_responders()
}

/// No vipd process panicked.
pub fn no_panics(procs: &[LabProcess]) {
    for p in procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
}

/// No Warning Event about `svc` and no WARN or ERROR line in any vipd log: the DHCP path
/// ran without a failure anywhere.
pub fn quiet(lab: &Lab, procs: &[LabProcess], svc: &str) {
    let warnings: Vec<_> = events_for(lab, svc)
        .into_iter()
        .filter(|(t, _, _)| t == "Warning")
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    for p in procs {
        let log = p.log();
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        assert!(bad.is_empty(), "{}: {bad:#?}", p.name());
    }
}
/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Sends `signal` to `node`'s vipd (`procs` in [`NODES`] order) and fails the test unless
/// it exits within `limit`.
pub fn signal_node(procs: &mut [LabProcess], node: &str, signal: Signal, limit: Duration) {
    let i = NODES.iter().position(|n| *n == node).unwrap();
    procs[i].signal(signal).unwrap();
    let exited = procs[i].wait_timeout(limit).unwrap();
    assert!(
        exited.is_some(),
        "{node} still runs {limit:?} after {signal:?}"
    );
}
