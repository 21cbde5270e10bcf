//! Issue 29, scenario S66: vipd's routing-table mode with real `vipd manager`s. The three
//! lab nodes run vipd (Services, `svc_election=true`, `vip_routingtable=true`, 5/3/1) against
//! the real kube-apiserver and BIRD configured by `vipd manifest bird`, peering over BGP (BFD
//! on) with a BGP router: the lab's `client` namespace runs BIRD (AS 65001, `merge paths
//! on`) and installs what it learns into its kernel. One LoadBalancer Service, its VIP a
//! routed address on no segment (198.51.100.80).
//!
//! Checks: only the lease holder routes the VIP (table 198, protocol 248, no address, and
//! the router's route has exactly the holder as next hop); SIGKILL of the holder's vipd:
//! its path leaves the router at once (the fence device closes with the process) and the
//! new holder's path appears after the lease; SIGSTOP of the holder: its path leaves the
//! router within the fence lifetime (2 s from the last renewal) + the kernel's address
//! expiry slack + BIRD's scan time (1 s), always before a lease duration (5 s) + the scan
//! time, and before the new holder's path appears. Prints the measured times.
//!
//! Run as root: `cargo test --test lab_routed_vipd -- --nocapture --test-threads 1`.

mod support;

use std::ffi::OsStr;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::*;
use vipd::cmd::manifest::routed::{Daemon, RoutedManifestArgs, generate};
use xtask::lab::process::run;
use xtask::lab::routed::bird_binary;
use xtask::lab::{CLIENT_V4, Lab, LabOptions, LabProcess, Signal, node_ipv4};

/// The Service VIP: a routed address, on no lab segment.
const VIP: &str = "198.51.100.80";
/// Lease duration of the 5/3/1 timings ([`T531`]).
const LEASE: Duration = Duration::from_secs(5);
/// BIRD's kernel scan time in `vipd manifest bird` (`routed::bird::KERNEL_SCAN_SECS`).
const SCAN: Duration = Duration::from_secs(1);

/// BIRD of the `client` namespace, the BGP router: AS 65001, one session with BFD per
/// node, multipath routes into its kernel.
fn router_conf() -> String {
    let mut s = format!(
        "router id {CLIENT_V4};\n\
         protocol device {{\n}}\n\
         protocol kernel kernel4 {{\n\tmerge paths on;\n\tipv4 {{ import none; export all; }};\n}}\n\
         protocol bfd bfd1 {{\n\tinterface \"eth0\" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }};\n}}\n\
         template bgp node4 {{\n\tlocal {CLIENT_V4} as 65001;\n\tbfd on;\n\tipv4 {{ import all; export none; }};\n}}\n"
    );
    for node in NODES {
        let ip = node_ipv4(node).expect("node");
        s.push_str(&format!(
            "protocol bgp {} from node4 {{ neighbor {ip} as 65000; }}\n",
            node.replace('-', "_")
        ));
    }
    s
}

/// `vipd manifest bird` for `node` from kube-vip's environment variables.
fn node_conf(node: &str) -> String {
    let id = node_ipv4(node).expect("node").to_string();
    let peers = format!("{CLIENT_V4}:65001");
    let env = [
        ("bgp_routerid", id.as_str()),
        ("bgp_as", "65000"),
        ("bgp_peers", peers.as_str()),
    ];
    let lookup = |k: &str| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    generate(Daemon::Bird, &RoutedManifestArgs::default(), &lookup, None)
        .unwrap_or_else(|e| panic!("vipd manifest bird for {node}: {e}"))
}

fn bird_dir(lab: &Lab) -> PathBuf {
    let d = lab.dir().join("bird");
    std::fs::create_dir_all(&d).expect("bird dir");
    d
}

/// Starts BIRD in `ns` with `config` (checked first); returns once its socket answers.
fn start_bird(lab: &Lab, ns: &str, config: &str) -> LabProcess {
    let dir = bird_dir(lab);
    let conf = dir.join(format!("{ns}.conf"));
    std::fs::write(&conf, config).expect("write bird conf");
    run(
        bird_binary("bird"),
        &[OsStr::new("-p"), OsStr::new("-c"), conf.as_os_str()],
    )
    .unwrap_or_else(|e| panic!("bird -p for {ns}: {e}"));
    let sock = dir.join(format!("{ns}.ctl"));
    let pid = dir.join(format!("{ns}.pid"));
    let args: Vec<&OsStr> = vec![
        OsStr::new("-d"),
        OsStr::new("-c"),
        conf.as_os_str(),
        OsStr::new("-s"),
        sock.as_os_str(),
        OsStr::new("-P"),
        pid.as_os_str(),
    ];
    let p = lab
        .spawn(ns, bird_binary("bird"), &args, &[])
        .expect("spawn bird");
    wait_for(
        &format!("BIRD's socket in {ns}"),
        Duration::from_secs(5),
        || {
            run(
                bird_binary("birdc"),
                &[
                    OsStr::new("-s"),
                    sock.as_os_str(),
                    OsStr::new("show status"),
                ],
            )
            .ok()
        },
    );
    p
}

/// The router's next hops for the VIP (empty: no route).
fn router_paths(lab: &Lab) -> Vec<IpAddr> {
    let out = lab
        .exec("client", "ip", &["-4", "-j", "route", "show", "exact", VIP])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let mut gws = Vec::new();
    for r in v.as_array().cloned().unwrap_or_default() {
        if let Some(hops) = r["nexthops"].as_array() {
            gws.extend(
                hops.iter()
                    .filter_map(|h| h["gateway"].as_str()?.parse::<IpAddr>().ok()),
            );
        } else if let Some(g) = r["gateway"].as_str().and_then(|g| g.parse().ok()) {
            gws.push(g);
        }
    }
    gws.sort();
    gws
}

fn hop(node: &str) -> IpAddr {
    IpAddr::V4(node_ipv4(node).expect("node"))
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
        &["-4", "route", "show", "table", "198", "proto", "248"],
    )
    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    .unwrap_or_default()
}

/// Polls every 10 ms until `f` holds; the time it took. Panics past `limit`.
fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    loop {
        if f() {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
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
        &service_json("routed", Some(VIP), None, &[(80, "TCP")], false),
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
    for n in NODES {
        let t = table_198(&lab, n);
        assert_eq!(t.contains(VIP), n == holder, "{n}'s table 198: {t:?}");
        let addrs = lab
            .exec(n, "ip", &["-4", "addr", "show"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        assert!(
            !addrs.contains(VIP),
            "{n} bound the VIP as an address: {addrs}"
        );
    }
    // Stable: still the holder alone a few renewals later.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(router_paths(&lab), vec![hop(holder)]);

    // SIGKILL: the fence device closes with the process, the route goes at once.
    let i = NODES.iter().position(|n| *n == holder).expect("node");
    let killed = Instant::now();
    procs[i].signal(Signal::SIGKILL).expect("SIGKILL");
    let dropped = until("the killed holder's path leaves the router", LEASE, || {
        !router_paths(&lab).contains(&hop(holder))
    });
    let next = wait_for("a new holder's path", LEASE * 3, || {
        routed_by(&lab).filter(|n| *n != holder)
    });
    let taken = killed.elapsed();
    println!(
        "S66 SIGKILL of {holder}'s vipd: path dropped by the router after {dropped:?}, new holder {next}'s path after {taken:?}"
    );
    assert!(
        dropped < Duration::from_secs(2),
        "kill: dropped after {dropped:?}"
    );
    let _ = procs[i].kill();
    procs[i] = start_vipd_services(&lab, holder, true, &extra);

    // SIGSTOP: the fence lifetime ends the route; BIRD sees it at its next scan.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(router_paths(&lab), vec![hop(next)], "settled on {next}");
    let j = NODES.iter().position(|n| *n == next).expect("node");
    let frozen = Instant::now();
    procs[j].signal(Signal::SIGSTOP).expect("SIGSTOP");
    let mut other_at = None;
    let dropped = until(
        "the frozen holder's path leaves the router",
        LEASE + SCAN,
        || {
            let paths = router_paths(&lab);
            if other_at.is_none() && paths.iter().any(|p| *p != hop(next)) {
                other_at = Some(frozen.elapsed());
            }
            !paths.contains(&hop(next))
        },
    );
    let third = wait_for("a new holder's path after the freeze", LEASE * 3, || {
        routed_by(&lab).filter(|n| *n != next)
    });
    let taken = frozen.elapsed();
    println!(
        "S66 SIGSTOP of {next}'s vipd: path dropped by the router after {dropped:?} (bound: fence 2 s + address expiry ≤ 1 s + scan {SCAN:?}), new holder {third}'s path after {taken:?}"
    );
    assert!(
        other_at.is_none_or(|t| t >= dropped),
        "another node's path ({other_at:?}) came before the frozen holder's went ({dropped:?})"
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
    assert!(
        !table_198(&lab, next).contains(VIP),
        "thawed {next} routes the VIP"
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
}
