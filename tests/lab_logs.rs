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
