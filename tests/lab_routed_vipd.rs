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
//! Scenarios S67-S70, without election (`svc_election=false`, `vip_leaderelection=false`,
//! kube-vip's `ServicesNoLeader`), in one lab: every node routes an ETP Cluster Service and
//! the router spreads 300 new connections per family within ±20 % (S67; then, with
//! `vip_leaderelection` unset, the global lease's holder alone); an ETP Local Service is
//! routed by the nodes with a ready endpoint only, and a rolling update of its endpoints
//! never leaves the router without a path, sampled every ~20 ms (S68); deleting one of two
//! Services sharing an address keeps its paths (S69); SIGKILL and SIGSTOP of one node's
//! vipd take its paths off the router within the route fence's bound while the others stay
//! (S70).
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

/// vipd in routing-table mode on `node` (Services, `svc_election` as `election`, 5/3/1,
/// VIPs on eth0), with `extra` settings.
fn start_routed(lab: &Lab, node: &str, election: bool, extra: &[(&str, &str)]) -> LabProcess {
    let env: Vec<(&str, &str)> = [
        ("vip_routingtable", "true"),
        ("vip_arp", "false"),
        ("vip_servicesinterface", "eth0"),
    ]
    .iter()
    .chain(extra)
    .copied()
    .collect();
    start_vipd_services(lab, node, election, &env)
}

/// [`start_routed`] on every node.
fn start_routed_all(lab: &Lab, election: bool, extra: &[(&str, &str)]) -> Vec<LabProcess> {
    NODES
        .iter()
        .map(|n| start_routed(lab, n, election, extra))
        .collect()
}

/// Creates the ETP Cluster Service `name` with the VIPs `v4` and `v6`, port 80.
fn create_dual_stack(lab: &Lab, name: &str, v4: &str, v6: &str) {
    let ips = format!("{v4},{v6}");
    create_service(
        lab,
        &service_json(name, Some(&ips), None, &[(80, "TCP")], false),
    );
}

/// BIRD on the router (the `client` namespace) and on every node.
fn start_birds(lab: &Lab) -> Vec<LabProcess> {
    let mut birds = vec![start_bird(lab, "client", &router_conf())];
    birds.extend(NODES.iter().map(|n| start_bird(lab, n, &node_conf(n))));
    birds
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

/// The router's paths to an IPv4 and an IPv6 VIP at one moment.
#[derive(Debug, Clone)]
struct Sample {
    /// Since the start of the sampling.
    at: Duration,
    v4: Vec<IpAddr>,
    v6: Vec<IpAddr>,
}

/// Samples the router's paths to `vip4` and `vip6` (none when `None`) every 10 ms (plus
/// the two `ip` calls) from `t0` until `done` holds for a sample; every sample taken.
/// Panics with the last one after `limit`.
fn sample_until(
    lab: &Lab,
    (vip4, vip6): (&str, Option<&str>),
    t0: Instant,
    limit: Duration,
    mut done: impl FnMut(&Sample) -> bool,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    loop {
        let s = Sample {
            at: t0.elapsed(),
            v4: paths_to(lab, vip4),
            v6: vip6.map(|v| paths_to(lab, v)).unwrap_or_default(),
        };
        let end = done(&s);
        samples.push(s);
        if end {
            return samples;
        }
        let last = samples.last().expect("a sample");
        assert!(
            t0.elapsed() < limit,
            "router's paths to {vip4} {vip6:?} after {limit:?}: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Samples until the router has no path through `node` to `vips`: when each family's
/// went (since `t0`), and every sample.
fn drops_of(
    lab: &Lab,
    vips: (&str, &str),
    node: &str,
    t0: Instant,
    limit: Duration,
) -> (Duration, Duration, Vec<Sample>) {
    let (mut v4, mut v6) = (None, None);
    let samples = sample_until(lab, (vips.0, Some(vips.1)), t0, limit, |s| {
        if v4.is_none() && !s.v4.contains(&hop(node)) {
            v4 = Some(s.at);
        }
        if v6.is_none() && !s.v6.contains(&hop6(node)) {
            v6 = Some(s.at);
        }
        v4.is_some() && v6.is_some()
    });
    (v4.expect("dropped"), v6.expect("dropped"), samples)
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
    let (v4, v6, samples) = drops_of(lab, (VIP, VIP6), node, t0, limit);
    let other_first = samples.iter().any(|s| {
        (s.at < v4 || s.at < v6)
            && (s.v4.iter().any(|p| *p != hop(node)) || s.v6.iter().any(|p| *p != hop6(node)))
    });
    (v4, v6, other_first)
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
    let _birds = start_birds(&lab);
    let mut procs = start_routed_all(&lab, true, &[]);
    create_dual_stack(&lab, "routed", VIP, VIP6);
    let holder = routed_by_holder(&lab, (VIP, VIP6), ("default", "kubevip-routed"));
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
    procs[i] = start_routed(&lab, holder, true, &[]);

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

/// The ETP Cluster Service of S67: routed by every node.
const ECMP4: &str = "198.51.100.81";
const ECMP6: &str = "2001:db8:5::81";
/// The ETP Local Service of S68 (IPv4 only).
const LOCAL4: &str = "198.51.100.82";
/// The address two Services share in S69.
const SHARED4: &str = "198.51.100.83";
/// The routers' paths through every node, per family.
fn all_hops() -> (Vec<IpAddr>, Vec<IpAddr>) {
    let mut v4: Vec<IpAddr> = NODES.iter().map(|n| hop(n)).collect();
    let mut v6: Vec<IpAddr> = NODES.iter().map(|n| hop6(n)).collect();
    v4.sort();
    v6.sort();
    (v4, v6)
}

/// The hops of `nodes` (IPv4), sorted.
fn hops(nodes: &[&str]) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = nodes.iter().map(|n| hop(n)).collect();
    v.sort();
    v
}

/// Samples until the router has the S67 Service's paths from every node, both families.
fn until_everywhere(lab: &Lab, limit: Duration) {
    let (all4, all6) = all_hops();
    sample_until(lab, (ECMP4, Some(ECMP6)), Instant::now(), limit, |s| {
        s.v4 == all4 && s.v6 == all6
    });
}

/// Samples the router's paths to `vip` until they are `want`; every sample.
fn until_paths(lab: &Lab, vip: &str, want: &[IpAddr], limit: Duration) -> Vec<Sample> {
    sample_until(lab, (vip, None), Instant::now(), limit, |s| s.v4 == want)
}

/// What kube-proxy does on a real node, for the lab: the node accepts the Service VIPs
/// `vips` (local routes, no address: vipd binds none for a Service in routing-table mode)
/// and answers HTTP on port 80, every address, with its name.
fn serve_vips(lab: &Lab, vips: &[&str]) -> Vec<xtask::lab::ThreadServer> {
    NODES
        .iter()
        .map(|n| {
            for vip in vips {
                let fam = if vip.contains(':') { "-6" } else { "-4" };
                lab.exec(n, "ip", &[fam, "route", "add", "local", vip, "dev", "lo"])
                    .unwrap_or_else(|e| panic!("{n}: local route {vip}: {e}"));
            }
            let path = lab.netns_path(n).expect("ns");
            xtask::lab::ThreadServer::http(
                &path,
                &format!("web-{n}"),
                "[::]:80".parse().expect("addr"),
                n,
            )
            .expect("listener")
        })
        .collect()
}

#[test]
fn s67_to_s70_without_election_every_node_routes_and_the_router_spreads() {
    let Some(lab) = lab("s67", LabOptions::default()) else {
        return;
    };
    let t_start = Instant::now();
    let _birds = start_birds(&lab);
    // New connections are hashed on the ports too (L4), as on a router that spreads flows.
    for key in [
        "net.ipv4.fib_multipath_hash_policy=1",
        "net.ipv6.fib_multipath_hash_policy=1",
    ] {
        lab.exec("client", "sysctl", &["-w", key]).expect("sysctl");
    }
    let _servers = serve_vips(&lab, &[ECMP4, ECMP6, LOCAL4, SHARED4]);
    let unelected = [("vip_leaderelection", "false")];
    let mut procs = start_routed_all(&lab, false, &unelected);
    // The Local Service first: once the router has the Cluster one's paths, every node
    // has planned both.
    create_service(
        &lab,
        &service_json("local", Some(LOCAL4), None, &[(80, "TCP")], true),
    );
    create_dual_stack(&lab, "ecmp", ECMP4, ECMP6);

    // S67: ETP Cluster, routed from all three nodes.
    let all4 = all_hops().0;
    let t = Instant::now();
    until_everywhere(&lab, Duration::from_secs(40));
    println!(
        "S67 the router has the Service's paths from all 3 nodes {:.2} s after its creation ({:.1} s after the lab started)",
        t.elapsed().as_secs_f64(),
        t_start.elapsed().as_secs_f64()
    );
    for n in NODES {
        let table = table_198(&lab, n);
        assert!(
            table.contains(ECMP4) && table.contains(ECMP6),
            "{n}: {table}"
        );
        assert!(
            !table.contains(LOCAL4),
            "{n} routes the Local Service: {table}"
        );
    }
    assert!(
        lease(&lab, "default", "kubevip-ecmp").is_none()
            && lease(&lab, "kube-system", "plndr-svcs-lock").is_none(),
        "no election: no Lease"
    );
    wait_until(
        "the ingress names both addresses",
        Duration::from_secs(10),
        || ingress_ips(&lab, "ecmp") == [ECMP4, ECMP6],
    );
    let svc = get_service(&lab, "ecmp").expect("service");
    assert!(
        svc["metadata"]["annotations"]["kube-vip.io/vipHost"].is_null(),
        "no vipHost without election: {svc}"
    );
    for vip in [ECMP4, ECMP6] {
        let ip: IpAddr = vip.parse().expect("ip");
        let t = Instant::now();
        let m = lab
            .in_netns("client", || {
                xtask::lab::routed::spread(
                    std::net::SocketAddr::new(ip, 80),
                    support::routed::SPREAD,
                )
            })
            .expect("client namespace");
        println!(
            "S67 {} new connections to {vip}: {m:?} ({:.2} s)",
            support::routed::SPREAD,
            t.elapsed().as_secs_f64()
        );
        support::routed::assert_even(vip, &m, &NODES);
    }
    assert!(paths_to(&lab, LOCAL4).is_empty(), "no endpoint: no route");

    // S68: ETP Local: only the nodes with a ready endpoint; a rolling update (new endpoint
    // added before the old one goes) never leaves the router without a path.
    set_endpoints(&lab, "local", &["node-a"]);
    let up = until_paths(&lab, LOCAL4, &hops(&["node-a"]), Duration::from_secs(10));
    wait_until(
        "the Local Service's ingress",
        Duration::from_secs(10),
        || ingress_ips(&lab, "local") == [LOCAL4],
    );
    set_endpoints(&lab, "local", &["node-a", "node-b"]);
    let mut rolled = until_paths(
        &lab,
        LOCAL4,
        &hops(&["node-a", "node-b"]),
        Duration::from_secs(10),
    );
    set_endpoints(&lab, "local", &["node-b"]);
    rolled.extend(until_paths(
        &lab,
        LOCAL4,
        &hops(&["node-b"]),
        Duration::from_secs(10),
    ));
    // And a while after: node-b's path stays.
    rolled.extend(sample_until(
        &lab,
        (LOCAL4, None),
        Instant::now(),
        Duration::from_secs(5),
        |s| s.at >= Duration::from_millis(500),
    ));
    let empty = rolled.iter().filter(|s| s.v4.is_empty()).count();
    println!(
        "S68 endpoint on node-a: routed by node-a alone after {:?}; rolling update to node-b and 0.5 s after: {} samples of the router's paths (every ~20 ms), {empty} without a path",
        up.last().map(|s| s.at).unwrap_or_default(),
        rolled.len()
    );
    assert_eq!(
        empty, 0,
        "a rolling update left the router without a path: {rolled:?}"
    );
    set_endpoints(&lab, "local", &[]);
    let gone = until_paths(&lab, LOCAL4, &[], Duration::from_secs(10));
    wait_until(
        "the endpointless Service's ingress cleared",
        Duration::from_secs(10),
        || ingress_ips(&lab, "local").is_empty(),
    );
    println!(
        "S68 no endpoint anywhere: no path after {:?}",
        gone.last().map(|s| s.at).unwrap_or_default()
    );

    // S69: two Services on one address; deleting the one that governs it (the older)
    // keeps the route.
    create_service(
        &lab,
        &service_json("shared-1", Some(SHARED4), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("shared-2", Some(SHARED4), None, &[(443, "TCP")], false),
    );
    until_paths(&lab, SHARED4, &all4, Duration::from_secs(10));
    delete_service(&lab, "shared-1");
    let t = Instant::now();
    let held = sample_until(&lab, (SHARED4, None), t, Duration::from_secs(10), |s| {
        s.at >= Duration::from_secs(3)
    });
    let short = held.iter().filter(|s| s.v4 != all4).count();
    println!(
        "S69 shared-1 deleted: {} samples over 3 s, {short} with fewer than 3 paths",
        held.len()
    );
    assert_eq!(short, 0, "the shared address lost paths: {held:?}");
    delete_service(&lab, "shared-2");
    until_paths(&lab, SHARED4, &[], Duration::from_secs(10));

    // S70: SIGKILL and SIGSTOP of one node's vipd: its paths leave within the route
    // fence's bound, the other nodes' paths stay throughout.
    let (v4, v6) = paths_go(&lab, &procs[2], "node-c", Signal::SIGKILL);
    println!(
        "S70 SIGKILL of node-c's vipd: its IPv4 path left the router after {v4:?}, IPv6 after {v6:?}"
    );
    assert!(v4 < Duration::from_secs(2), "kill: IPv4 after {v4:?}");
    let _ = procs[2].kill();
    procs[2] = start_routed(&lab, "node-c", false, &unelected);
    until_everywhere(&lab, Duration::from_secs(20));
    let (v4, v6) = paths_go(&lab, &procs[1], "node-b", Signal::SIGSTOP);
    println!(
        "S70 SIGSTOP of node-b's vipd: its IPv4 path left the router after {v4:?} (fence 2 s + address expiry ≤ 1 s + BIRD scan {SCAN:?}), IPv6 after {v6:?} (fence 2 s + gc 1 s)"
    );
    assert!(v4 <= LEASE, "freeze: IPv4 after {v4:?}");
    procs[1].signal(Signal::SIGCONT).expect("SIGCONT");
    let t = Instant::now();
    until_everywhere(&lab, Duration::from_secs(20));
    println!(
        "S70 thawed node-b routes again after {:.2} s",
        t.elapsed().as_secs_f64()
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }

    // With vip_leaderelection true (the default) and no svc_election: the holder of the
    // one Services lease routes every Service (kube-vip's GlobalLeader), alone.
    stop_all(&mut procs);
    sample_until(&lab, (ECMP4, Some(ECMP6)), Instant::now(), LEASE, |s| {
        s.v4.is_empty() && s.v6.is_empty()
    });
    let procs = start_routed_all(&lab, false, &[]);
    let holder = routed_by_holder(&lab, (ECMP4, ECMP6), ("kube-system", "plndr-svcs-lock"));
    for n in NODES.iter().filter(|n| **n != holder) {
        assert!(!table_198(&lab, n).contains(ECMP4), "{n} routes");
    }
    println!(
        "S67 with vip_leaderelection=true: {holder}, the holder of kube-system/plndr-svcs-lock, routes alone; the whole test {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
}

/// Sends `signal` to `node`'s vipd `proc` and samples the router until the S67 Service's
/// paths through `node` are gone: when each family's went. Asserts that the other nodes'
/// paths stayed in every sample and that the IPv6 path went within the fence (2 s) + the
/// collector (1 s) + 1 s of slack.
fn paths_go(lab: &Lab, proc: &LabProcess, node: &str, signal: Signal) -> (Duration, Duration) {
    let t0 = Instant::now();
    proc.signal(signal).expect("signal");
    let (v4, v6, samples) = drops_of(lab, (ECMP4, ECMP6), node, t0, LEASE * 2);
    assert_others_stay(&samples, node);
    assert!(
        v6 <= Duration::from_secs(4),
        "{signal:?}: IPv6 after {v6:?}"
    );
    (v4, v6)
}

/// Waits until one node alone is the router's next hop for `vips` (both families) and
/// asserts that it holds `lease` (namespace, name); that node.
fn routed_by_holder(lab: &Lab, vips: (&str, &str), lease: (&str, &str)) -> &'static str {
    let holder = wait_for(
        &format!("the router routes {} to one node", vips.0),
        Duration::from_secs(30),
        || {
            let p = paths_to(lab, vips.0);
            NODES.iter().copied().find(|n| p == [hop(n)])
        },
    );
    assert_eq!(
        lease_holder(lab, lease.0, lease.1).as_deref(),
        Some(holder),
        "the router's next hop is the holder of {lease:?}"
    );
    wait_for(
        &format!("the router routes {} to the holder", vips.1),
        Duration::from_secs(10),
        || (paths_to(lab, vips.1) == [hop6(holder)]).then_some(()),
    );
    holder
}

/// Every sample still has the paths of the nodes other than `gone`, both families.
fn assert_others_stay(samples: &[Sample], gone: &str) {
    for s in samples {
        for n in NODES.iter().filter(|n| **n != gone) {
            assert!(
                s.v4.contains(&hop(n)) && s.v6.contains(&hop6(n)),
                "{n}'s path missing while {gone}'s went: {s:?}"
            );
        }
    }
}

/// The control-plane VIP of S71: a routed address on no segment.
const CP4: &str = "198.51.100.90";

/// S71 (issue 29): the control-plane VIP in routing-table mode, as kube-vip runs it (no
/// election, `pkg/manager/worker/table.go`): every node whose own API server is healthy
/// (a node whose API server has not answered yet never routes it) routes it and binds it
/// on its loopback, so the router spreads new connections over the
/// three nodes (ECMP) and each node accepts them; no Lease is written. A node whose local
/// API server dies leaves the router (health check: 3 failures 1 s apart, then the route
/// goes) while the others stay, and comes back when it returns; SIGKILL of a node's vipd
/// takes its path at once (the fence device closes), the others stay; SIGTERM withdraws
/// the route at once and leaves the loopback VIP to run out with its lifetime (connections
/// still on their way are accepted).
#[test]
fn s71_control_plane_vip_routed_by_every_node_with_a_healthy_api_server() {
    let Some(lab) = lab("s71", LabOptions::default()) else {
        return;
    };
    let _birds = start_birds(&lab);
    for key in [
        "net.ipv4.fib_multipath_hash_policy=1",
        "net.ipv6.fib_multipath_hash_policy=1",
    ] {
        lab.exec("client", "sysctl", &["-w", key]).expect("sysctl");
    }
    // The API server stands in: a listener on every address of each node (no local route:
    // vipd binds the control-plane VIP on the loopback itself).
    let _servers = serve_vips(&lab, &[]);
    // vip_subnet 24: a route is a host route whatever it says (a trial found the holder
    // re-adding a /24 VIP it never saw every 0.5 s).
    let extra = [
        ("address", CP4),
        ("vip_subnet", "24"),
        ("vip_routingtable", "true"),
        ("vip_arp", "false"),
    ];
    // node-b starts with its own API server down: it must not route the VIP until it answers.
    lab.stop_local_api("node-b").expect("stop");
    let procs = start_vipd_on_all(&lab, T531, &extra);
    let all = hops(&NODES);
    let healthy = hops(&["node-a", "node-c"]);
    let t = Instant::now();
    let samples = until_paths(&lab, CP4, &healthy, Duration::from_secs(30));
    assert!(
        samples.iter().all(|s| !s.v4.contains(&hop("node-b"))),
        "node-b routed the VIP before its API server ever answered: {samples:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !table_198(&lab, "node-b").contains(CP4),
        "node-b routes the VIP without a healthy API server: {}",
        procs[1].log()
    );
    lab.start_local_api("node-b").expect("start");
    until_paths(&lab, CP4, &all, Duration::from_secs(15));
    println!(
        "S71 the router has the control-plane VIP's paths from all 3 nodes {:.2} s after the start (node-b's API server came up after {:.2} s)",
        t.elapsed().as_secs_f64(),
        samples.last().map_or(0.0, |s| s.at.as_secs_f64()) + 2.0
    );
    for n in NODES {
        let table = table_198(&lab, n);
        assert!(
            table.contains(CP4) && table.contains("dev vipr"),
            "{n}: {table}"
        );
        let lo = lab
            .exec(n, "ip", &["-4", "-o", "addr", "show", "dev", "lo"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .expect("ip");
        assert!(lo.contains(&format!("{CP4}/32")), "{n}'s loopback: {lo}");
    }
    assert!(
        lease(&lab, "kube-system", "plndr-cp-lock").is_none(),
        "no control-plane Lease in routing-table mode"
    );
    let vip: IpAddr = CP4.parse().expect("vip");
    let m = lab
        .in_netns("client", || {
            xtask::lab::routed::spread(std::net::SocketAddr::new(vip, 80), support::routed::SPREAD)
        })
        .expect("client");
    println!(
        "S71 {} new connections to the control-plane VIP: {m:?}",
        support::routed::SPREAD
    );
    support::routed::assert_even("S71", &m, &NODES);

    // node-b's own API server dies: only its path goes.
    lab.stop_local_api("node-b").expect("stop");
    let t0 = Instant::now();
    let rest = hops(&["node-a", "node-c"]);
    let samples = until_paths(&lab, CP4, &rest, Duration::from_secs(15));
    println!(
        "S71 node-b's local API server stopped: its path left the router after {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    for s in &samples {
        assert!(
            rest.iter().all(|h| s.v4.contains(h)),
            "another node's path went too: {s:?}"
        );
    }
    assert!(
        procs[1].log().contains("local API server"),
        "{}",
        procs[1].log()
    );
    lab.start_local_api("node-b").expect("start");
    let t0 = Instant::now();
    until_paths(&lab, CP4, &all, Duration::from_secs(15));
    println!(
        "S71 node-b's local API server back: its path returned after {:.2} s",
        t0.elapsed().as_secs_f64()
    );

    // SIGKILL of node-c's vipd: its path goes at once, the others stay.
    procs[2].signal(Signal::SIGKILL).expect("kill");
    let t0 = Instant::now();
    let rest = hops(&["node-a", "node-b"]);
    let samples = until_paths(&lab, CP4, &rest, LEASE);
    println!(
        "S71 SIGKILL of node-c's vipd: its path left the router after {:.0} ms",
        t0.elapsed().as_secs_f64() * 1000.0
    );
    for s in &samples {
        assert!(
            rest.iter().all(|h| s.v4.contains(h)),
            "another node's path went too: {s:?}"
        );
    }
    // SIGTERM of node-a's vipd: its route is withdrawn at once, its loopback address runs
    // out with its lifetime (the connections still on their way are accepted meanwhile).
    let t0 = Instant::now();
    procs[0].signal(Signal::SIGTERM).expect("SIGTERM");
    let rest = hops(&["node-b"]);
    until_paths(&lab, CP4, &rest, Duration::from_secs(5));
    let withdrawn = t0.elapsed();
    let has_lo = || {
        lab.exec("node-a", "ip", &["-4", "-o", "addr", "show", "dev", "lo"])
            .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("{CP4}/32")))
            .unwrap_or(false)
    };
    let lingered = has_lo();
    assert!(
        lingered,
        "the loopback VIP must outlive the route's withdrawal (connections on their way are accepted)"
    );
    wait_for(
        "node-a's loopback VIP runs out",
        Duration::from_secs(5),
        || (!has_lo()).then_some(()),
    );
    println!(
        "S71 SIGTERM of node-a's vipd: its path left the router after {:.0} ms; its loopback VIP {} after the withdrawal and was gone {:.2} s after the signal",
        withdrawn.as_secs_f64() * 1000.0,
        if lingered {
            "was still there"
        } else {
            "was already gone"
        },
        t0.elapsed().as_secs_f64()
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
        assert!(
            !p.log().contains("VIP missing while leading"),
            "{}",
            p.log()
        );
    }
}
