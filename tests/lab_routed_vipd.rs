//! Issue 29, scenario S66: vipd's routing-table mode with real `vipd manager`s. The three
//! lab nodes run vipd (Services, `svc_election=true`, `vip_routingtable=true`, 5/3/1) against
//! the real kube-apiserver and BIRD configured by `vipd manifest bird`, peering over BGP (BFD
//! on) with a BGP router: the lab's `client` namespace runs BIRD (AS 65001, one IPv4 and one
//! IPv6 session per node, `merge paths on`) and installs what it learns into its kernel. One
//! dual-stack LoadBalancer Service, its VIPs routed addresses on no segment (198.51.100.80,
//! 2001:db8:5::80).
//!
//! Checks: only the lease holder routes the VIP (table 198, protocol 248, no address, and
//! the router's route has exactly the holder as next hop); SIGKILL of the holder's vipd:
//! its IPv4 path leaves the router at once (the fence device closes with the process), its
//! IPv6 path at the route's expiry, both before another node's, and the new holder's paths
//! appear after the lease; SIGSTOP of the holder: its paths leave the router within the
//! fence lifetime (2 s from the last renewal) + the kernel's slack (+ BIRD's 1 s scan for
//! IPv4), always before a lease duration (5 s) + the scan time, and before another node's
//! path appears; SIGTERM: the routes are gone when vipd has exited, the router's paths at
//! once. Prints the measured times.
//!
//! Run as root: `cargo test --test lab_routed_vipd -- --nocapture --test-threads 1`.

mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::routed::router_bird_config_at;
use xtask::lab::{CLIENT_V4, CLIENT_V6, Lab, LabOptions, LabProcess, Signal, node_ipv4, node_ipv6};

/// The Service VIP: a routed address, on no lab segment.
const VIP: &str = "198.51.100.80";
/// Its IPv6 VIP (the same Service: dual stack).
const VIP6: &str = "2001:db8:5::80";
/// Lease duration of the 5/3/1 timings ([`T531`]).
const LEASE: Duration = Duration::from_secs(5);
/// BIRD's kernel scan time in `vipd manifest bird` (`routed::bird::KERNEL_SCAN_SECS`).
const SCAN: Duration = Duration::from_secs(1);

/// BIRD of the `client` namespace, the BGP router: AS 65001, one session with BFD per
/// node, multipath routes into its kernel.
fn router_conf() -> String {
    let nodes = NODES
        .iter()
        .map(|n| (*n, node_ipv4(n).expect("node"), node_ipv6(n).expect("node")));
    router_bird_config_at(CLIENT_V4, CLIENT_V6, 65000, nodes)
}

/// `vipd manifest bird` for `node` from kube-vip's environment variables.
fn node_conf(node: &str) -> String {
    support::routed::bird_conf(node, node_ipv4(node).expect("node"), CLIENT_V4, CLIENT_V6)
}

/// Starts BIRD in `ns` with `config` (checked first); returns once its socket answers.
fn start_bird(lab: &Lab, ns: &str, config: &str) -> LabProcess {
    lab.start_bird(ns, config)
        .unwrap_or_else(|e| panic!("BIRD in {ns}: {e}"))
}

/// The router's next hops for the VIP (empty: no route).
fn router_paths(lab: &Lab) -> Vec<IpAddr> {
    paths_to(lab, VIP)
}

/// The router's next hops for the IPv6 VIP.
fn router_paths6(lab: &Lab) -> Vec<IpAddr> {
    paths_to(lab, VIP6)
}

fn paths_to(lab: &Lab, vip: &str) -> Vec<IpAddr> {
    lab.next_hops("client", vip.parse().expect("VIP"))
}

fn hop(node: &str) -> IpAddr {
    IpAddr::V4(node_ipv4(node).expect("node"))
}

fn hop6(node: &str) -> IpAddr {
    IpAddr::V6(node_ipv6(node).expect("node"))
}

/// Polls both families every 10 ms until the router has no path through `node`: when
/// each went (since `t0`), and whether a path of another node came first.
fn drops(lab: &Lab, node: &str, t0: Instant, limit: Duration) -> (Duration, Duration, bool) {
    let (mut v4, mut v6, mut other_first) = (None, None, false);
    loop {
        let (p4, p6) = (router_paths(lab), router_paths6(lab));
        let others = p4.iter().any(|p| *p != hop(node)) || p6.iter().any(|p| *p != hop6(node));
        if v4.is_none() && !p4.contains(&hop(node)) {
            v4 = Some(t0.elapsed());
        }
        if v6.is_none() && !p6.contains(&hop6(node)) {
            v6 = Some(t0.elapsed());
        }
        if let (Some(a), Some(b)) = (v4, v6) {
            return (a, b, other_first);
        }
        other_first |= others;
        assert!(
            t0.elapsed() < limit,
            "{node}'s paths still on the router after {limit:?}: {p4:?} {p6:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The node whose address is the router's only next hop for the VIP.
fn routed_by(lab: &Lab) -> Option<&'static str> {
    match router_paths(lab).as_slice() {
        [one] => NODES.iter().copied().find(|n| hop(n) == *one),
        _ => None,
    }
}

/// The routes of `node`'s table 198 (protocol 248), as `ip` prints them.
fn table_198(lab: &Lab, node: &str) -> String {
    lab.exec(
        node,
        "ip",
        &["route", "show", "table", "198", "proto", "248"],
    )
    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    .unwrap_or_default()
        + &lab
            .exec(
                node,
                "ip",
                &["-6", "route", "show", "table", "198", "proto", "248"],
            )
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
}

#[test]
fn s66_routing_table_mode_holder_routes_and_the_router_follows_kill_and_freeze() {
    let Some(lab) = lab("s66", LabOptions::default()) else {
        return;
    };
    let _router = start_bird(&lab, "client", &router_conf());
    let _birds: Vec<LabProcess> = NODES
        .iter()
        .map(|n| start_bird(&lab, n, &node_conf(n)))
        .collect();
    let extra = [
        ("vip_routingtable", "true"),
        ("vip_arp", "false"),
        ("vip_servicesinterface", "eth0"),
    ];
    let mut procs: Vec<LabProcess> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &extra))
        .collect();
    create_service(
        &lab,
        &service_json(
            "routed",
            Some(&format!("{VIP},{VIP6}")),
            None,
            &[(80, "TCP")],
            false,
        ),
    );
    let holder = wait_for(
        "the router routes the VIP to one node",
        Duration::from_secs(30),
        || routed_by(&lab),
    );
    assert_eq!(
        lease_holder(&lab, "default", "kubevip-routed").as_deref(),
        Some(holder),
        "the router's next hop is the lease holder"
    );
    wait_for(
        "the router routes the IPv6 VIP to the holder",
        Duration::from_secs(10),
        || (router_paths6(&lab) == vec![hop6(holder)]).then_some(()),
    );
    for n in NODES {
        let t = table_198(&lab, n);
        assert_eq!(t.contains(VIP), n == holder, "{n}'s table 198: {t:?}");
        assert_eq!(t.contains(VIP6), n == holder, "{n}'s table 198: {t:?}");
        if n == holder {
            assert!(t.contains("dev vipr") && t.contains("expires"), "{t}");
        }
        let addrs = lab
            .exec(n, "ip", &["addr", "show"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        assert!(
            !addrs.contains(VIP) && !addrs.contains(VIP6),
            "{n} bound the VIP as an address: {addrs}"
        );
    }
    // Stable: still the holder alone a few renewals later.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(router_paths(&lab), vec![hop(holder)]);
    assert_eq!(router_paths6(&lab), vec![hop6(holder)]);

    // SIGKILL: the fence device closes with the process, the route goes at once.
    let i = NODES.iter().position(|n| *n == holder).expect("node");
    let killed = Instant::now();
    procs[i].signal(Signal::SIGKILL).expect("SIGKILL");
    let (dropped, dropped6, other_first) = drops(&lab, holder, killed, LEASE);
    let next = wait_for("a new holder's path", LEASE * 3, || {
        routed_by(&lab).filter(|n| *n != holder)
    });
    let taken = killed.elapsed();
    println!(
        "S66 SIGKILL of {holder}'s vipd: IPv4 path dropped by the router after {dropped:?}, IPv6 after {dropped6:?} (expiry: fence 2 s + gc 1 s), new holder {next}'s path after {taken:?}"
    );
    assert!(
        !other_first,
        "kill: another node's path before {holder}'s went"
    );
    assert!(
        dropped < Duration::from_secs(2),
        "kill: dropped after {dropped:?}"
    );
    // Fence 2 s + the IPv6 collector's second after the last renewal, 1 s of slack.
    assert!(
        dropped6 <= Duration::from_secs(4),
        "kill: IPv6 dropped after {dropped6:?}"
    );
    let _ = procs[i].kill();
    procs[i] = start_vipd_services(&lab, holder, true, &extra);

    // SIGSTOP: the fence lifetime ends the route; BIRD sees it at its next scan.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(router_paths(&lab), vec![hop(next)], "settled on {next}");
    let j = NODES.iter().position(|n| *n == next).expect("node");
    let frozen = Instant::now();
    procs[j].signal(Signal::SIGSTOP).expect("SIGSTOP");
    let (dropped, dropped6, other_first) = drops(&lab, next, frozen, LEASE + SCAN);
    let third = wait_for("a new holder's path after the freeze", LEASE * 3, || {
        routed_by(&lab).filter(|n| *n != next)
    });
    let taken = frozen.elapsed();
    println!(
        "S66 SIGSTOP of {next}'s vipd: IPv4 path dropped by the router after {dropped:?} (bound: fence 2 s + address expiry ≤ 1 s + scan {SCAN:?}), IPv6 after {dropped6:?} (fence 2 s + gc 1 s), new holder {third}'s path after {taken:?}"
    );
    assert!(
        !other_first,
        "freeze: another node's path came before {next}'s went"
    );
    assert!(
        dropped6 <= Duration::from_secs(4),
        "freeze: IPv6 dropped after {dropped6:?}"
    );
    // Documented: fence 2 s + address expiry <= 1 s + scan 1 s after the last renewal; 1 s
    // of slack for a loaded machine (polling, BIRD's scan timer), under a lease + the scan.
    assert!(
        dropped <= Duration::from_secs(5),
        "freeze: dropped after {dropped:?}"
    );
    procs[j].signal(Signal::SIGCONT).expect("SIGCONT");
    // Thawed, it has lost the lease: it routes nothing.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(router_paths(&lab), vec![hop(third)], "after the thaw");
    assert_eq!(router_paths6(&lab), vec![hop6(third)], "after the thaw");
    assert!(
        !table_198(&lab, next).contains(VIP),
        "thawed {next} routes the VIP"
    );
    // Graceful stop (SIGTERM): the holder removes its routes (and closes its devices)
    // before it releases the lease; the router drops the paths at once.
    let k = NODES.iter().position(|n| *n == third).expect("node");
    let stopping = Instant::now();
    procs[k].stop(Duration::from_secs(10)).expect("SIGTERM");
    let exited = stopping.elapsed();
    assert!(
        !table_198(&lab, third).contains("proto"),
        "{third} left routes after a graceful stop: {}",
        table_198(&lab, third)
    );
    let (gone, gone6, _) = drops(&lab, third, stopping, Duration::from_secs(2));
    println!(
        "S66 SIGTERM of {third}'s vipd: exited after {exited:?}, IPv4 path dropped after {gone:?}, IPv6 after {gone6:?}"
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
}
