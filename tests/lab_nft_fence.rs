//! Lab test of the nftables fence (issue 16, `vip_nftfence=true`): a frozen control-plane
//! VIP holder stops answering ARP at its fence time (its last renewal's send time + the
//! fence lifetime, 2 s at lease 5/3/1), well before the lease expires for the other nodes;
//! continued, it never answers again while another node holds the VIP; after stop no
//! vipd nftables table is left and another owner's table is untouched.
//!
//! Run: `VIPD_LAB_ASSETS=... cargo test --test lab_nft_fence -- --nocapture` (prints the
//! measured times).

mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::{LabOptions, Signal};

/// The `PATH` vipd runs with here: a directory with no `nft` in it. The fence goes through
/// netlink from vipd's own process; a fence that ran the `nft` binary would find none and
/// run without the millisecond fence (no "millisecond fence on", no drops).
const PATH_WITHOUT_NFT: (&str, &str) = ("PATH", "/nonexistent/vipd-lab-no-nft");

/// Lease duration of [`T531`].
const LEASE: Duration = Duration::from_secs(5);

/// The `fast` profile (docs/failover.md): lease 600 ms, renew deadline 400 ms, retry 200 ms.
const FAST: Timings = ("0.6", "0.4", "0.2");

/// IPv4: ARP requests for the VIP are dropped by `arp vipd_fence` once its element expired.
#[test]
fn frozen_holder_stops_answering_arp_at_the_fence_time() {
    frozen_holder_goes_silent(
        "nft_fence_v4",
        VIP,
        &["arp", "vipd_fence"],
        "arp operation request",
    );
}

/// The `fast` profile (sub-second lease, millisecond fence): a frozen control-plane VIP
/// holder stops answering ARP within the lease (its element ends 400 ms after its last
/// renewal's send, renewals every 200 ms), although its address (lifetime 1 s, the lease
/// rounded up) may still be on eth0; the next holder takes over, and the thawed one never
/// answers again.
#[test]
fn fast_profile_frozen_holder_stops_answering_at_the_millisecond_fence() {
    silent_with(
        "nft_fence_fast",
        VIP,
        &["arp", "vipd_fence"],
        "arp operation request",
        FAST,
        Duration::from_millis(600),
    );
}

/// IPv6: neighbour solicitations for the VIP (target matched as raw ICMPv6 payload) are
/// dropped by `inet vipd_fence` once its element expired.
#[test]
fn frozen_holder_stops_answering_neighbour_solicitations_at_the_fence_time() {
    frozen_holder_goes_silent(
        "nft_fence_v6",
        "2001:db8::10",
        &["inet", "vipd_fence"],
        "nd-neighbor-solicit",
    );
}

/// Service VIPs (per-Service leases, svc timings 5/3/1): ten Services, so that several
/// holders on one node share the batched `nft` writer; a frozen holder's Service VIP stops
/// being answered at its fence time, like the control-plane VIP.
#[test]
fn frozen_holder_stops_answering_arp_for_a_service_vip_at_the_fence_time() {
    frozen_holder_goes_silent(
        "nft_fence_svc",
        "192.0.2.60",
        &["arp", "vipd_fence"],
        "arp operation request",
    );
}

/// Service VIPs of [`frozen_holder_stops_answering_arp_for_a_service_vip_at_the_fence_time`].
const SERVICE_VIPS: [&str; 10] = [
    "192.0.2.60",
    "192.0.2.61",
    "192.0.2.62",
    "192.0.2.63",
    "192.0.2.64",
    "192.0.2.65",
    "192.0.2.66",
    "192.0.2.67",
    "192.0.2.68",
    "192.0.2.69",
];

/// The scenario for `vip`: `table` is the fence table whose rule containing `rule` must
/// have dropped the frozen holder's requests.
fn frozen_holder_goes_silent(name: &str, vip_text: &str, table: &[&str], rule: &str) {
    silent_with(name, vip_text, table, rule, T531, LEASE);
}

/// [`frozen_holder_goes_silent`] with lease timings `t`, whose lease duration is `lease`.
fn silent_with(
    name: &str,
    vip_text: &str,
    table: &[&str],
    rule: &str,
    t: Timings,
    lease: Duration,
) {
    let Some(lab) = lab(name, LabOptions::default()) else {
        return;
    };
    let nft = |ns: &str, args: &[&str]| {
        let out = lab.exec(ns, "nft", args).expect("nft");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Another owner's table on every node: vipd must leave it alone.
    for n in NODES {
        lab.exec(n, "nft", &["add", "table", "inet", "other_owner"])
            .expect("nft add table");
        lab.exec(
            n,
            "nft",
            &[
                "add",
                "chain",
                "inet",
                "other_owner",
                "keep",
                "{ type filter hook input priority 10; policy accept; }",
            ],
        )
        .expect("nft add chain");
    }
    let services = SERVICE_VIPS.contains(&vip_text);
    let mut procs = if services {
        let procs: Vec<_> = NODES
            .iter()
            .map(|n| {
                start_vipd_services(&lab, n, true, &[("vip_nftfence", "true"), PATH_WITHOUT_NFT])
            })
            .collect();
        for (k, ip) in SERVICE_VIPS.iter().enumerate() {
            create_service(
                &lab,
                &service_json(
                    &format!("fenced-{k}"),
                    Some(ip),
                    None,
                    &[(80, "TCP")],
                    false,
                ),
            );
        }
        procs
    } else {
        start_vipd_on_all(
            &lab,
            t,
            &[
                ("vip_nftfence", "true"),
                ("address", vip_text),
                PATH_WITHOUT_NFT,
            ],
        )
    };
    let h = single_holder(&lab, vip_text, Duration::from_secs(30));
    let i = NODES
        .iter()
        .position(|n| *n == h)
        .expect("holder is a lab node");
    let log = procs[i].log();
    assert!(log.contains("millisecond fence on"), "{log}");
    assert!(
        nft(&h, &["list", "table", "inet", "vipd_fence"]).contains(vip_text),
        "the VIP is armed on its holder"
    );
    if services {
        // Every Service VIP is held somewhere and armed (with a live element) on its holder.
        for ip in SERVICE_VIPS {
            let holder = single_holder(&lab, ip, Duration::from_secs(30));
            wait_for(
                &format!("{ip} live in the fence on {holder}"),
                Duration::from_secs(5),
                || {
                    let vip: IpAddr = ip.parse().expect("ip");
                    xtask::lab::FenceView::read(&lab, &holder)
                        .live(vip)
                        .then_some(())
                },
            );
        }
    }
    let old_mac = lab.mac_of(&h).expect("mac");
    let vip: IpAddr = vip_text.parse().expect("ip");
    if services {
        // The second line: once a renewal set the elements, the holder's Service VIP
        // address gets the second line (300 s, docs/design.md), more than the whole-second fence (2 s) it is
        // bound with after the conflict probe.
        wait_for(
            &format!("{vip} given the second line on {h}"),
            Duration::from_secs(5),
            || {
                lab.addresses(&h, "eth0")
                    .ok()?
                    .iter()
                    .any(|a| a.addr == vip && a.valid_lft.is_some_and(|l| l > 2))
                    .then_some(())
            },
        );
    }
    let watch_start = Instant::now();
    let watch = lab
        .arp_watch(vip, Duration::from_millis(20))
        .expect("arp watch");
    wait_for("the client sees the holder", Duration::from_secs(5), || {
        watch
            .report()
            .last_responders()
            .contains(&old_mac)
            .then_some(())
    });

    procs[i].signal(Signal::SIGSTOP).expect("SIGSTOP");
    let frozen_at = watch_start.elapsed();
    // Answers stop (no answer from the frozen holder for 300 ms running).
    let mut address_gone: Option<Duration> = None;
    let stopped = wait_for("the frozen holder stops answering", lease * 2, || {
        if address_gone.is_none() && !holders(&lab, vip_text).contains(&h) {
            address_gone = Some(watch_start.elapsed().saturating_sub(frozen_at));
        }
        let r = watch.report();
        let last = r
            .slots
            .iter()
            .filter(|s| s.responders.contains(&old_mac))
            .map(|s| s.t)
            .max()?;
        let after = r.slots.last()?.t;
        (last > frozen_at && after >= last + Duration::from_millis(300)).then_some(last)
    });
    let mut list = vec!["list", "table"];
    list.extend_from_slice(table);
    let listing = nft(&h, &list);
    assert!(
        listing
            .lines()
            .any(|l| l.contains(rule) && l.contains(" vmap @vips")),
        "no {rule} rule: {listing}"
    );
    // The drops are counted in the holders' chains (`<key> != @live counter ... drop`).
    let counters: Vec<&str> = listing
        .lines()
        .filter(|l| l.contains("!= @live counter packets"))
        .collect();
    let silent_after = stopped.saturating_sub(frozen_at);
    println!(
        "{name}: frozen holder {h}: last answer {} ms after SIGSTOP (lease timings {t:?} s; lease {} ms); no longer held (element expired or address gone) about {:?} ms after SIGSTOP",
        silent_after.as_millis(),
        lease.as_millis(),
        address_gone.map(|d| d.as_millis())
    );
    assert!(
        silent_after < lease,
        "the frozen holder answered for {silent_after:?}, not less than the lease"
    );
    assert!(
        counters.iter().any(|l| !l.contains("counter packets 0 ")),
        "a holder chain's drop rule dropped the requests: {counters:?}\n{listing}"
    );

    // Another node takes over after the lease; the frozen one, continued, never answers.
    let new = wait_for_takeover(&lab, vip_text, &h, "takeover", lease * 4);
    let new_mac = lab.mac_of(&new).expect("mac");
    if services {
        // The second line: the frozen holder's Service VIP address outlives its lease on
        // eth0 (300 s, docs/design.md), inert; the watch below proves it answers nothing.
        let still = lab
            .addresses(&h, "eth0")
            .expect("addresses")
            .iter()
            .any(|a| a.addr == vip);
        assert!(
            still,
            "{h}: the second-line address of {vip} is gone already"
        );
    }
    procs[i].signal(Signal::SIGCONT).expect("SIGCONT");
    let thawed_at = watch_start.elapsed();
    std::thread::sleep(Duration::from_secs(4));
    let report = watch.stop().expect("watch");
    let after_thaw: Vec<_> = report
        .slots
        .iter()
        .filter(|s| s.t >= stopped + Duration::from_millis(20))
        .filter(|s| s.responders.contains(&old_mac))
        .map(|s| s.t)
        .collect();
    assert!(
        after_thaw.is_empty(),
        "the old holder answered again at {after_thaw:?} (frozen at {frozen_at:?}, thawed at {thawed_at:?})"
    );
    assert!(
        report.last_responders().contains(&new_mac) || report.all_responders().contains(&new_mac),
        "the new holder answers"
    );
    assert_eq!(
        report.max_simultaneous_responders(),
        1,
        "{:?}",
        report.multi_responder_intervals()
    );

    for p in &mut procs {
        p.signal(Signal::SIGTERM).expect("SIGTERM");
        let st = p.wait_timeout(Duration::from_secs(10)).expect("wait");
        assert!(
            st.is_some_and(|s| s.success()),
            "vipd exit: {st:?}\n{}",
            p.log()
        );
    }
    for n in NODES {
        let tables = nft(n, &["list", "tables"]);
        assert!(!tables.contains("vipd"), "{n}: vipd tables left: {tables}");
        assert!(
            tables.contains("table inet other_owner"),
            "{n}: another owner's table removed: {tables}"
        );
        assert!(
            nft(n, &["list", "table", "inet", "other_owner"]).contains("chain keep"),
            "{n}: another owner's chain changed"
        );
    }
}
