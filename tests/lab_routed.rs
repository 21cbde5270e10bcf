//! Issue 29, routed networks, without vipd: three nodes run BIRD 2 configured by `vipd
//! manifest bird` (from kube-vip's bgp_* settings) and peer with a router (BIRD 2, BFD,
//! ECMP) in the routed lab ([`xtask::lab::routed`]). A Service VIP's /32 and /128 are put
//! into kernel table 198 with protocol 248 on each node (what vipd's routing-table mode
//! will do), and the test checks that the router learns them from exactly those nodes as
//! one multipath route, that the client reaches the VIP and that ECMP spreads 300 new
//! connections per family within ±20 % over the three nodes, that a route of another
//! protocol in table 198 is not exported, and measures how long the router takes to drop
//! a node's path when the node removes its route and when the node's link dies (BFD).
//!
//! Run as root: `cargo test --test lab_routed -- --nocapture --test-threads 1`; skipped
//! with `VIPD_SKIP_LAB=1`.

mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use xtask::lab::routed::{self, ROUTER_NODE_V4, ROUTER_NODE_V6, routed_node_v4};
use xtask::lab::{NODES, RoutedLab, ThreadServer};

/// The Service VIP: the routed lab has no 192.0.2.0/24 segment, so the VIP comes from the
/// range the other labs give Service VIPs, as a host route.
const VIP4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 80);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x80);
/// A route in table 198 of another protocol (static): must not be exported.
const DECOY4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 81);
const PORT: u16 = 80;
const CONNECTIONS: usize = support::routed::SPREAD;

/// `vipd manifest bird` for `node` from kube-vip's environment variables.
fn bird_conf(node: &str) -> String {
    support::routed::bird_conf(
        node,
        routed_node_v4(node).expect("node"),
        ROUTER_NODE_V4,
        ROUTER_NODE_V6,
    )
}

/// The gateways of the router's route to `dst` in its main table (one for a single path,
/// several for a multipath route; empty when there is none).
fn router_paths(lab: &RoutedLab, dst: IpAddr) -> Vec<IpAddr> {
    lab.next_hops("router", dst)
}

/// The node addresses of `family` (the router's next hops for the VIP from each node).
fn node_hops(v4: bool, nodes: &[&str]) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = nodes
        .iter()
        .map(|n| {
            if v4 {
                IpAddr::V4(routed_node_v4(n).expect("node"))
            } else {
                IpAddr::V6(xtask::lab::routed::routed_node_v6(n).expect("node"))
            }
        })
        .collect();
    v.sort();
    v
}

/// Polls until the router's paths to `dst` are `want`; the time it took.
fn wait_paths(lab: &RoutedLab, dst: IpAddr, want: &[IpAddr], timeout: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let got = router_paths(lab, dst);
        if got == want {
            return t0.elapsed();
        }
        if t0.elapsed() > timeout {
            panic!(
                "router's paths to {dst}: {got:?}, want {want:?} after {timeout:?}\nbirdc show protocols:\n{}\nrouter BIRD log:\n{}",
                lab.birdc("router", &["show", "protocols"])
                    .unwrap_or_default(),
                lab.bird_log("router")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `n` new connections from the client to `vip`: answers per node (`"-"`: no answer).
fn spread(lab: &RoutedLab, vip: IpAddr, n: usize) -> BTreeMap<String, usize> {
    lab.in_netns("client", || routed::spread(SocketAddr::new(vip, PORT), n))
        .expect("client namespace")
}

fn route(lab: &RoutedLab, node: &str, verb: &str, dst: &str, proto: &str) {
    let fam = if dst.contains(':') { "-6" } else { "-4" };
    lab.ip(
        node,
        &[
            fam, "route", verb, dst, "dev", "lo", "table", "198", "proto", proto,
        ],
    )
    .unwrap_or_else(|e| panic!("{node}: ip route {verb} {dst}: {e}"));
}

#[test]
fn routed_vip_reaches_the_router_from_every_node_with_ecmp_and_bfd() {
    match xtask::lab::lab_available("lab_routed") {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => panic!("lab_routed: {e}"),
    }
    let t_start = Instant::now();
    let lab = RoutedLab::start(65000).unwrap_or_else(|e| panic!("routed lab: {e}"));
    let mut servers = Vec::new();
    for node in NODES {
        lab.start_bird(node, &bird_conf(node))
            .unwrap_or_else(|e| panic!("BIRD on {node}: {e}"));
        lab.ip(node, &["addr", "add", &format!("{VIP4}/32"), "dev", "lo"])
            .expect("VIP on lo");
        lab.ip(node, &["addr", "add", &format!("{VIP6}/128"), "dev", "lo"])
            .expect("VIP6 on lo");
        let path = lab.netns_path(node).expect("ns");
        for vip in [IpAddr::V4(VIP4), IpAddr::V6(VIP6)] {
            servers.push(
                ThreadServer::http(
                    &path,
                    &format!("vip-{node}"),
                    SocketAddr::new(vip, PORT),
                    node,
                )
                .expect("listener on the VIP"),
            );
        }
    }
    // What vipd's routing-table mode does: the VIP's host routes in table 198, protocol 248.
    let t_routes = Instant::now();
    for node in NODES {
        route(&lab, node, "add", &format!("{VIP4}/32"), "248");
        route(&lab, node, "add", &format!("{VIP6}/128"), "248");
    }
    route(&lab, "node-a", "add", &format!("{DECOY4}/32"), "static");

    let all4 = node_hops(true, &NODES);
    let all6 = node_hops(false, &NODES);
    wait_paths(&lab, IpAddr::V4(VIP4), &all4, Duration::from_secs(30));
    let up4 = t_routes.elapsed();
    wait_paths(&lab, IpAddr::V6(VIP6), &all6, Duration::from_secs(30));
    let up6 = t_routes.elapsed();
    eprintln!(
        "routes in table 198 -> router's multipath route over 3 nodes: IPv4 {:.2} s, IPv6 {:.2} s (sessions come up with BIRD's 5 s connect delay); lab and daemons up in {:.2} s",
        up4.as_secs_f64(),
        up6.as_secs_f64(),
        (t_routes - t_start).as_secs_f64()
    );
    let learned = lab
        .birdc(
            "router",
            &["show", "route", "for", &VIP4.to_string(), "all"],
        )
        .expect("birdc");
    eprintln!("router: birdc show route for {VIP4} all:\n{learned}");
    for node in NODES {
        let proto = format!("{}_4", node.replace('-', "_"));
        assert!(learned.contains(&proto), "{proto} missing:\n{learned}");
    }
    let bfd = lab
        .birdc("router", &["show", "bfd", "sessions"])
        .expect("birdc");
    eprintln!("router: birdc show bfd sessions:\n{bfd}");
    assert_eq!(bfd.matches(" Up ").count(), 6, "6 BFD sessions up:\n{bfd}");
    assert!(
        router_paths(&lab, IpAddr::V4(DECOY4)).is_empty(),
        "a table-198 route of another protocol must not be exported"
    );

    // ECMP: new connections from one client spread over the three nodes (L4 hashing).
    for vip in [IpAddr::V4(VIP4), IpAddr::V6(VIP6)] {
        let t = Instant::now();
        let m = spread(&lab, vip, CONNECTIONS);
        eprintln!(
            "{CONNECTIONS} connections to {vip}: {m:?} in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        support::routed::assert_even(&vip.to_string(), &m, &NODES);
    }

    // node-c removes its routes: the router drops its paths.
    let t = Instant::now();
    route(&lab, "node-c", "del", &format!("{VIP4}/32"), "248");
    route(&lab, "node-c", "del", &format!("{VIP6}/128"), "248");
    let ab4 = node_hops(true, &["node-a", "node-b"]);
    let ab6 = node_hops(false, &["node-a", "node-b"]);
    wait_paths(&lab, IpAddr::V4(VIP4), &ab4, Duration::from_secs(20));
    let w4 = t.elapsed();
    wait_paths(&lab, IpAddr::V6(VIP6), &ab6, Duration::from_secs(20));
    let w6 = t.elapsed();
    eprintln!(
        "routes removed on node-c -> router drops node-c's path: IPv4 {:.3} s, IPv6 {:.3} s",
        w4.as_secs_f64(),
        w6.as_secs_f64()
    );
    let m = spread(&lab, IpAddr::V4(VIP4), 60);
    assert!(!m.contains_key("node-c") && !m.contains_key("-"), "{m:?}");

    // node-b's link dies (as at a poweroff: no BGP notification): BFD drops its path.
    let t = Instant::now();
    lab.ip("lan", &["link", "set", "v-node-b", "down"])
        .expect("cut node-b");
    let a4 = node_hops(true, &["node-a"]);
    let a6 = node_hops(false, &["node-a"]);
    wait_paths(&lab, IpAddr::V4(VIP4), &a4, Duration::from_secs(10));
    let b4 = t.elapsed();
    wait_paths(&lab, IpAddr::V6(VIP6), &a6, Duration::from_secs(10));
    let b6 = t.elapsed();
    eprintln!(
        "node-b's link cut -> router drops node-b's path (BFD, node side 300 ms x 3): IPv4 {:.3} s, IPv6 {:.3} s",
        b4.as_secs_f64(),
        b6.as_secs_f64()
    );
    assert!(
        b4 < Duration::from_secs(3),
        "BFD should drop the path in about 1 s, took {b4:?}"
    );
    let m = spread(&lab, IpAddr::V4(VIP4), 30);
    assert_eq!(m.get("node-a"), Some(&30), "{m:?}");
    drop(servers);
    eprintln!("lab_routed: {:.1} s", t_start.elapsed().as_secs_f64());
}
