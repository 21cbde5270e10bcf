//! Lab tests of vipd's log discipline: one line per state change, repeats
//! rate-limited with a count (`vipd::obs::logging`), a line when the condition clears.

mod support;

use std::time::{Duration, Instant};

use support::*;
use xtask::lab::LabOptions;

const PLACE_ERROR: &str = "cannot place VIPs";

fn count(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

/// S40 (logs): while the VIP interface is missing, the holder checks it twice a second;
/// the error is logged once, not twice a second. When the interface appears, one line says
/// so, the VIP goes on it and is announced with that interface's MAC.
#[test]
fn s40_missing_interface_is_logged_once_not_twice_a_second() {
    let Some(lab) = lab("s40logs", LabOptions::default()) else {
        return;
    };
    let p = start_vipd(&lab, "node-a", T531, &[("vip_interface", "eth9")]);
    wait_for(
        "the missing-interface error",
        Duration::from_secs(15),
        || {
            let log = p.log();
            (log.contains(PLACE_ERROR) && log.contains("eth9")).then_some(())
        },
    );
    // Ten check intervals (500 ms): before rate limiting, ten more lines.
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    let log = p.log();
    let n = count(&log, PLACE_ERROR);
    if n != 1 {
        dump(&[&p]);
    }
    assert_eq!(n, 1, "{PLACE_ERROR} logged {n} times in {:?}", t0.elapsed());
    // The interface appears (a second port on the segment): one line, the VIP on it.
    let cap = lab.start_capture().unwrap();
    let eth9 = lab
        .add_interface("node-a", "eth9", "192.0.2.211/32")
        .unwrap();
    let vip: std::net::IpAddr = VIP.parse().unwrap();
    wait_for("VIP on eth9", Duration::from_secs(20), || {
        lab.addresses("node-a", "eth9")
            .ok()?
            .iter()
            .any(|a| a.addr == vip)
            .then_some(())
    });
    // Announced at once on acquisition, then every vip_arpRate (1 s): 1.5 s holds at least one.
    std::thread::sleep(Duration::from_millis(1500));
    let garps: Vec<_> = cap
        .stop()
        .unwrap()
        .into_iter()
        .filter(|f| f.is_announcement_of(vip))
        .collect();
    assert!(!garps.is_empty(), "no GARP for the VIP on eth9");
    assert!(
        garps
            .iter()
            .all(|f| f.sender_mac == eth9 && f.eth_src == eth9),
        "announced with eth9's MAC {eth9}: {garps:?}"
    );
    let log = p.log();
    assert_eq!(count(&log, "VIP interfaces usable again"), 1, "{log}");
    assert_eq!(count(&log, PLACE_ERROR), 1, "no error after it cleared");
}

/// Lines about the Service leases' calls, at `level` (" WARN ", " INFO ").
fn per_lease_call_lines(log: &str, level: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(level) && l.contains("kubevip-svc"))
        .filter(|l| {
            [
                "renewing the lease failed",
                "lease call failed",
                "lease calls succeed again",
            ]
            .iter()
            .any(|w| l.contains(w))
        })
        .map(str::to_string)
        .collect()
}

/// S37 (logs, issue 27): the API server frozen 8 s under six Service leases. One WARN says
/// the outage started (with the count of leases and the error), one INFO that it ended
/// (how long, how many leases); no per-lease WARN or INFO about the failed calls (those are
/// at DEBUG).
#[test]
fn s37_api_outage_is_one_warning_and_one_info_not_one_per_lease() {
    let Some(lab) = lab("s37logs", LabOptions::default()) else {
        return;
    };
    let p = start_vipd_services(&lab, "node-a", true, &[]);
    let vips: Vec<String> = (0..6).map(|i| format!("192.0.2.{}", 40 + i)).collect();
    for (i, ip) in vips.iter().enumerate() {
        let svc = service_json(&format!("svc{i}"), Some(ip), None, &[(80, "TCP")], false);
        create_service(&lab, &svc);
    }
    wait_until("every Service VIP held", Duration::from_secs(30), || {
        vips.iter().all(|ip| !holders(&lab, ip).is_empty())
    });
    let pid = *lab.control_plane_pids().get(1).expect("apiserver pid");
    let pid = nix::unistd::Pid::from_raw(pid);
    let mark = p.log().len();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    std::thread::sleep(Duration::from_secs(8));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    wait_until("the outage's end line", Duration::from_secs(30), || {
        p.log()[mark..].contains("API server reachable again")
    });
    wait_until(
        "every Service VIP held again",
        Duration::from_secs(30),
        || vips.iter().all(|ip| !holders(&lab, ip).is_empty()),
    );
    let log = p.log()[mark..].to_string();
    let started: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("API server unreachable: lease calls fail"))
        .collect();
    let ended = count(&log, "API server reachable again: lease calls succeed");
    let per_lease = [" WARN ", " INFO "].map(|lvl| per_lease_call_lines(&log, lvl));
    if started.len() != 1 || ended != 1 || per_lease.iter().any(|v| !v.is_empty()) {
        dump(&[&p]);
    }
    assert_eq!(started.len(), 1, "one start line: {started:#?}");
    assert!(
        started[0].contains("leases_failing=6") && started[0].contains("error="),
        "the start line counts the six Service leases and names the error: {}",
        started[0]
    );
    assert_eq!(ended, 1, "one end line");
    assert!(
        log.lines().any(|l| l.contains("API server reachable again")
            && l.contains("leases_affected=6")
            && l.contains("lasted_ms=")),
        "the end line says how long and how many leases"
    );
    assert_eq!(
        per_lease,
        [Vec::<String>::new(), Vec::new()],
        "per-lease lines"
    );
    assert!(
        count(&log, "lease call failed (API server unreachable)") >= 6,
        "per-lease detail at DEBUG"
    );
}
