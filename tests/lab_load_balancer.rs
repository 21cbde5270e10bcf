//! S43: control-plane load balancing (`lb_enable`, kube-vip's `--enableLoadBalancer`) against
//! the real API server: vipd runs with exactly the env of the k3s how-to's manifest
//! (`--enableLoadBalancer` included) and the generated RBAC only; the Node objects carry
//! the control-plane role label and the lab nodes' addresses; each node's local API proxy
//! (`[::]:6443`, forwarding to the API server) is a backend and counts its connections.
//!
//! Run as root: `cargo test --test lab_load_balancer`; skipped with `VIPD_SKIP_LAB=1`.

mod support;

#[path = "golden/cases.rs"]
mod cases;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use support::manifest::{lab_env, plan, spawn_manager};
use support::*;
use xtask::lab::{DHCP_SERVER_V4, Lab, LabOptions, LabProcess, NodeRbac, Signal, ThreadServer};

const LB_PORT: u16 = 6443;
const OTHER_TABLE: &str = "table ip other_owner {\n chain prerouting {\n type nat hook prerouting priority dstnat - 1; policy accept;\n tcp dport 9999 dnat to 192.0.2.99\n }\n}\n";

/// Registers Node `name` as a Ready control-plane node at its lab IPv4 address (as admin;
/// the lab has no kubelet).
fn create_cp_node(lab: &Lab, name: &str) {
    create_cp_node_at(lab, name, &[xtask::lab::node_ipv4(name).unwrap().into()]);
}

/// As [`create_cp_node`], with these InternalIP addresses.
fn create_cp_node_at(lab: &Lab, name: &str, ips: &[IpAddr]) {
    lab.register_control_plane_node(name, ips)
        .unwrap_or_else(|e| panic!("register node {name}: {e}"));
}

/// `nft -j list table ip vipd_lb` in `ns`; `None` when there is no such table.
fn lb_table(lab: &Lab, ns: &str) -> Option<serde_json::Value> {
    lb_table_of(lab, ns, "ip")
}

/// `nft -j list table <family> vipd_lb` in `ns`.
fn lb_table_of(lab: &Lab, ns: &str, family: &str) -> Option<serde_json::Value> {
    let out = lab
        .exec_unchecked(ns, "nft", &["-j", "list", "table", family, "vipd_lb"])
        .unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// The DNAT rule's backends in `ns` (`None`: no table; empty: table without DNAT rule).
fn lb_backends(lab: &Lab, ns: &str) -> Option<Vec<String>> {
    lb_backends_of(lab, ns, "ip")
}

/// As [`lb_backends`], in the `family` table.
fn lb_backends_of(lab: &Lab, ns: &str, family: &str) -> Option<Vec<String>> {
    let t = lb_table_of(lab, ns, family)?;
    Some(
        t["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o.get("rule"))
            .filter(|r| r["chain"] == "prerouting")
            .flat_map(|r| {
                r["expr"][4]["dnat"]["addr"]["map"]["data"]["set"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|pair| pair[1].as_str().unwrap().to_string())
            .collect(),
    )
}

fn nodes_with_table(lab: &Lab) -> Vec<String> {
    NODES
        .iter()
        .filter(|n| lb_table(lab, n).is_some())
        .map(|n| n.to_string())
        .collect()
}

fn other_table(lab: &Lab, ns: &str) -> String {
    let out = lab
        .exec(ns, "nft", &["list", "table", "ip", "other_owner"])
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

fn all_ips() -> Vec<String> {
    NODES
        .iter()
        .map(|n| xtask::lab::node_ipv4(n).unwrap().to_string())
        .collect()
}

/// Opens `n` new TCP connections to VIP:lb_port from the client namespace, one after the
/// other; each sends nothing, half-closes and waits for the far end to close (the endpoint
/// proxy accepted it, reached the API server and saw the API server close). Returns how
/// many went through end to end.
fn connect_n(lab: &Lab, n: usize) -> usize {
    connect_n_to(lab, VIP, n)
}

/// As [`connect_n`], to `vip`.
fn connect_n_to(lab: &Lab, vip: &str, n: usize) -> usize {
    use std::io::Read;
    let vip = SocketAddr::new(vip.parse::<IpAddr>().unwrap(), LB_PORT);
    lab.in_netns("client", || {
        (0..n)
            .filter(|_| {
                let Ok(mut s) = std::net::TcpStream::connect_timeout(&vip, Duration::from_secs(2))
                else {
                    return false;
                };
                let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
                let _ = s.shutdown(std::net::Shutdown::Write);
                let mut buf = [0u8; 512];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => return true,
                        Ok(_) => continue,
                        Err(_) => return false,
                    }
                }
            })
            .count()
    })
    .unwrap()
}

fn accepted(lab: &Lab) -> Vec<u64> {
    NODES.iter().map(|n| lab.local_api_accepted(n)).collect()
}

/// The "Done when": spread, health, failover, cleanup, other owners untouched.
#[test]
fn s43_k3s_env_spreads_api_connections_over_the_control_plane_nodes() {
    let opts = LabOptions {
        node_rbac: NodeRbac::None,
        ..LabOptions::default()
    };
    let Some(lab) = lab("lb_spread", opts) else {
        return;
    };
    apply_generated_role_to_nodes(&lab);
    for n in NODES {
        create_cp_node(&lab, n);
        let out = lab
            .exec(n, "nft", &["-f", &write_tmp(&lab, n, OTHER_TABLE)])
            .unwrap();
        assert!(out.status.success());
    }
    let others: Vec<String> = NODES.iter().map(|n| other_table(&lab, n)).collect();
    let p = plan(cases::K3S);
    let env_a = lab_env(&lab, &p, "node-a");
    assert!(
        env_a.contains(&("lb_enable".into(), "true".into()))
            && env_a.contains(&("lb_port".into(), "6443".into()))
            && env_a.contains(&("lb_fwdmethod".into(), "local".into())),
        "{env_a:?}"
    );
    let mut procs: Vec<LabProcess> = NODES
        .iter()
        .map(|n| spawn_manager(&lab, n, &lab_env(&lab, &p, n)))
        .collect();
    let limit = Duration::from_secs(30);
    let holder = single_holder(&lab, VIP, limit);
    let ips = all_ips();
    wait_for("the holder's rules with all three backends", limit, || {
        (lb_backends(&lab, &holder).as_deref() == Some(&ips[..])).then_some(())
    });
    assert_eq!(
        nodes_with_table(&lab),
        vec![holder.clone()],
        "rules on the holder only"
    );

    // 300 new connections: each node's API endpoint gets a third, within 20 %.
    let before = accepted(&lab);
    assert_eq!(connect_n(&lab, 300), 300);
    let after = accepted(&lab);
    let got: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("connections per node {NODES:?}: {got:?}");
    for (n, c) in NODES.iter().zip(&got) {
        assert!((80..=120).contains(c), "{n} got {c} of 300: {got:?}");
    }
    // The API answers through the VIP (TLS to whichever node's endpoint).
    let client = lab
        .admin_client(SocketAddr::new(VIP.parse().unwrap(), LB_PORT))
        .unwrap();
    for _ in 0..3 {
        let r = lab
            .in_netns("client", || client.request("GET", "/version", None))
            .unwrap()
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body.contains("gitVersion"), "{}", r.body);
    }

    // One node's API endpoint stops: it leaves the set, no new connection fails.
    let victim = NODES.iter().find(|n| **n != holder).unwrap().to_string();
    let victim_ip = xtask::lab::node_ipv4(&victim).unwrap().to_string();
    let t0 = Instant::now();
    lab.stop_local_api(&victim).unwrap();
    wait_for("the stopped endpoint out of the set", limit, || {
        lb_backends(&lab, &holder)
            .is_some_and(|b| b.len() == 2 && !b.contains(&victim_ip))
            .then_some(())
    });
    let out_after = t0.elapsed();
    assert_eq!(
        connect_n(&lab, 60),
        60,
        "no connection goes to the stopped endpoint"
    );
    let t1 = Instant::now();
    lab.start_local_api(&victim).unwrap();
    wait_for("the restarted endpoint gets connections", limit, || {
        let before = lab.local_api_accepted(&victim);
        connect_n(&lab, 30);
        (lab.local_api_accepted(&victim) - before >= 5).then_some(())
    });
    let back_after = t1.elapsed();
    eprintln!("endpoint out of the set after {out_after:?}, back after {back_after:?}");
    assert!(
        out_after < Duration::from_secs(6) && back_after < Duration::from_secs(6),
        "out after {out_after:?}, back after {back_after:?} (expected about 3 s each)"
    );

    // Failover by SIGTERM: the old holder removes its table before it exits, the new
    // holder installs its own; never two nodes with rules.
    let i = NODES.iter().position(|n| *n == holder).unwrap();
    procs[i].signal(Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + limit;
    let new_holder = loop {
        let with = nodes_with_table(&lab);
        let both = overlapping(&with, |n| lb_table(&lab, n).is_some());
        assert!(both.is_empty(), "two nodes with rules at once: {both:?}");
        if let Some(h) = with.first().filter(|h| **h != holder)
            && lb_backends(&lab, h).as_deref() == Some(&ips[..])
        {
            break h.clone();
        }
        if Instant::now() > deadline {
            dump(&procs.iter().collect::<Vec<_>>());
            panic!("no new holder with rules for all three endpoints");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = procs[i].wait_timeout(Duration::from_secs(5)).unwrap();
    assert!(status.is_some_and(|s| s.success()), "{}", procs[i].log());
    assert!(
        lb_table(&lab, &holder).is_none(),
        "old holder left its table"
    );
    // The new holder installs its rules as its term starts and adds the VIP after its
    // conflict probe: the VIP may come a moment after the rules.
    let vip: IpAddr = VIP.parse().unwrap();
    wait_for("the VIP on the new holder alone", limit, || {
        let h = holders(&lab, VIP);
        let both = overlapping(&h, |n| carries(&lab, n, vip));
        assert!(both.is_empty(), "two nodes carry {VIP}: {both:?}");
        (h == [new_holder.clone()]).then_some(())
    });
    assert!(
        procs[i].log().contains("load balancer: rules removed"),
        "{}",
        procs[i].log()
    );
    assert_eq!(connect_n(&lab, 30), 30, "new holder forwards");

    // Failover by SIGKILL: the killed holder cannot clean up; its table stays but is inert
    // (the kernel fence removed the VIP), the third node forwards, and the stale table goes
    // when vipd starts again on the killed node.
    let j = NODES.iter().position(|n| *n == new_holder).unwrap();
    procs[j].kill().unwrap();
    let third = wait_for("a third holder with rules", limit, || {
        let h = holders(&lab, VIP);
        (h.len() == 1
            && h[0] != new_holder
            && lb_backends(&lab, &h[0]).as_deref() == Some(&ips[..]))
        .then(|| h[0].clone())
    });
    assert!(
        lb_table(&lab, &new_holder).is_some(),
        "a killed vipd cannot clean up"
    );
    assert_eq!(connect_n(&lab, 30), 30, "the third holder forwards");
    procs[j] = spawn_manager(&lab, &new_holder, &lab_env(&lab, &p, &new_holder));
    wait_for("the stale table removed at start", limit, || {
        lb_table(&lab, &new_holder).is_none().then_some(())
    });
    assert_eq!(nodes_with_table(&lab), vec![third.clone()]);

    // Power-off of the holder (SIGKILL and its link cut at once): the restarted node takes
    // over with rules, the dead node's API endpoint leaves the set (its health checks
    // fail), new connections all land; once the node is back its stale table goes at start.
    let k = NODES.iter().position(|n| *n == third).unwrap();
    procs[k].kill().unwrap();
    lab.cut_link(&third).unwrap();
    let third_ip = ips[k].clone();
    let alive: Vec<String> = ips.iter().filter(|ip| **ip != third_ip).cloned().collect();
    let survivor = wait_for(
        "a holder after the power-off, without the dead backend",
        limit,
        || {
            let h = holders(&lab, VIP);
            (h.len() == 1
                && h[0] != third
                && lb_backends(&lab, &h[0]).as_deref() == Some(&alive[..]))
            .then(|| h[0].clone())
        },
    );
    assert_eq!(survivor, new_holder);
    assert_eq!(
        connect_n(&lab, 30),
        30,
        "every new connection lands after the power-off"
    );
    lab.restore_link(&third).unwrap();
    procs[k] = spawn_manager(&lab, &third, &lab_env(&lab, &p, &third));
    wait_for(
        "the powered-off node's stale table removed at start",
        limit,
        || lb_table(&lab, &third).is_none().then_some(()),
    );
    wait_for(
        "the powered-off node's API endpoint back in the set",
        limit,
        || (lb_backends(&lab, &survivor).as_deref() == Some(&ips[..])).then_some(()),
    );
    assert_eq!(nodes_with_table(&lab), vec![survivor.clone()]);

    // Clean stop of everyone: no table left anywhere, other owners' tables untouched.
    procs.remove(i);
    for p in procs.iter_mut() {
        let _ = p.signal(Signal::SIGTERM);
    }
    for p in procs.iter_mut() {
        let s = p.wait_timeout(Duration::from_secs(5)).unwrap();
        assert!(s.is_some_and(|s| s.success()), "{}", p.log());
    }
    assert!(nodes_with_table(&lab).is_empty());
    for (n, before) in NODES.iter().zip(&others) {
        assert_eq!(
            &other_table(&lab, n),
            before,
            "{n}'s other_owner table changed"
        );
    }
}

/// Writes `text` to a file in the lab dir for `nft -f` in namespace `ns`.
fn write_tmp(lab: &Lab, ns: &str, text: &str) -> String {
    let path = lab.dir().join(format!("{ns}-other.nft"));
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// Harvester's guest values: `lb_enable=true` with `cp_enable=false` starts, announces a
/// Service as without it, and installs no table (the load balancer is the control plane's).
#[test]
fn s43_lb_enable_without_control_plane_is_accepted_and_does_nothing() {
    let Some(lab) = lab("lb_harvester", LabOptions::default()) else {
        return;
    };
    for n in NODES {
        create_cp_node(&lab, n);
    }
    let extra = [
        ("cp_enable", "false"),
        ("svc_enable", "true"),
        ("lb_enable", "true"),
        ("address", ""),
    ];
    let p = start_vipd(&lab, "node-a", T531, &extra);
    let svc_vip = "192.0.2.20";
    create_service(
        &lab,
        &service_json("web", Some(svc_vip), None, &[(80, "TCP")], false),
    );
    wait_for("the Service VIP announced", Duration::from_secs(30), || {
        (holders(&lab, svc_vip) == ["node-a"]).then_some(())
    });
    assert!(lb_table(&lab, "node-a").is_none(), "{}", p.log());
    assert!(
        p.log()
            .contains("lb_enable balances the control-plane VIP only"),
        "{}",
        p.log()
    );
}

/// Dual stack: an IPv4 and an IPv6 VIP get `table ip vipd_lb` and `table ip6 vipd_lb`, each
/// with the Nodes' InternalIP addresses of its family, and both spread connections; both
/// tables go at a clean stop.
#[test]
fn s43_dual_stack_vips_get_a_table_per_family() {
    let Some(lab) = lab("lb_dual", LabOptions::default()) else {
        return;
    };
    let v6 = "2001:db8::10";
    for n in NODES {
        create_cp_node_at(
            &lab,
            n,
            &[
                xtask::lab::node_ipv4(n).unwrap().into(),
                xtask::lab::node_ipv6(n).unwrap().into(),
            ],
        );
    }
    let address = format!("{VIP},{v6}");
    let mut procs: Vec<LabProcess> = NODES
        .iter()
        .map(|n| {
            start_vipd(
                &lab,
                n,
                T531,
                &[("lb_enable", "true"), ("address", &address)],
            )
        })
        .collect();
    let limit = Duration::from_secs(30);
    let holder = single_holder(&lab, v6, limit);
    let ips6: Vec<String> = NODES
        .iter()
        .map(|n| xtask::lab::node_ipv6(n).unwrap().to_string())
        .collect();
    wait_for("both tables with three backends each", limit, || {
        (lb_backends_of(&lab, &holder, "ip").as_deref() == Some(&all_ips()[..])
            && lb_backends_of(&lab, &holder, "ip6").as_deref() == Some(&ips6[..]))
        .then_some(())
    });
    // The IPv6 VIP may still be tentative for a moment on a fresh holder: retry the batch.
    let before = accepted(&lab);
    wait_for("IPv6 connections through the VIP", limit, || {
        (connect_n_to(&lab, v6, 30) == 30).then_some(())
    });
    let got: Vec<u64> = accepted(&lab)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    assert!(
        got.iter().all(|c| *c >= 5),
        "every node got IPv6 connections: {got:?}"
    );
    assert_eq!(connect_n(&lab, 30), 30);
    for p in procs.iter_mut() {
        let _ = p.signal(Signal::SIGTERM);
    }
    for p in procs.iter_mut() {
        let s = p.wait_timeout(Duration::from_secs(5)).unwrap();
        assert!(s.is_some_and(|s| s.success()), "{}", p.log());
    }
    for n in NODES {
        assert!(lb_table_of(&lab, n, "ip").is_none() && lb_table_of(&lab, n, "ip6").is_none());
    }
}

/// How long a backend may take to leave the set once it stops answering: by design at
/// most 3.5 s (three checks 1 s apart, the last failing 500 ms after it started; a new
/// backend: its first check, at most 1.5 s), the issue asks for 4 s; 1 s more covers
/// polling `nft` through `ip netns exec` and scheduling on a loaded 2-core lab machine.
/// The measured figures are printed.
const HUNG_OUT_LIMIT: Duration = Duration::from_secs(5);

/// Polls the holder's rules until they are exactly `want`; returns how long after `t0`.
fn backends_become(lab: &Lab, holder: &str, want: &[String], what: &str) -> Duration {
    let t0 = Instant::now();
    wait_for(what, Duration::from_secs(30), || {
        (lb_backends(lab, holder).as_deref() == Some(want)).then(|| t0.elapsed())
    })
}

/// S59 (issue 26, kube-vip #890): an API server that accepts TCP and never answers (no TLS,
/// no HTTP) leaves the set as a refused one does: a new control-plane Node whose address
/// has such a listener (ns dhcp, 192.0.2.3) after its first check, and a node whose API
/// server was healthy and then hangs (its local API proxy replaced by a silent listener)
/// after three failed checks; both within 4 s (the figures are printed), and then 30 of
/// 30 new connections through the VIP go through. When the hung node's API server answers
/// again it comes back.
#[test]
fn s59_a_backend_that_accepts_and_never_answers_leaves_the_set() {
    let Some(lab) = lab("lb_hung", LabOptions::default()) else {
        return;
    };
    for n in NODES {
        create_cp_node(&lab, n);
    }
    let mut procs: Vec<LabProcess> = NODES
        .iter()
        .map(|n| start_vipd(&lab, n, T531, &[("lb_enable", "true")]))
        .collect();
    let limit = Duration::from_secs(30);
    let holder = single_holder(&lab, VIP, limit);
    let ips = all_ips();
    backends_become(
        &lab,
        &holder,
        &ips,
        "the holder's rules with all three backends",
    );

    // A fourth control-plane Node, its API server hung: in the set until its first check.
    let hung_ip = DHCP_SERVER_V4.to_string();
    let hung = ThreadServer::silent(
        &lab.netns_path("dhcp").unwrap(),
        "hung-api",
        SocketAddr::new(IpAddr::V4(DHCP_SERVER_V4), LB_PORT),
    )
    .unwrap();
    let t0 = Instant::now();
    create_cp_node_at(&lab, "hung", &[IpAddr::V4(DHCP_SERVER_V4)]);
    wait_for("the new Node's backend in the set", limit, || {
        lb_backends(&lab, &holder)
            .is_some_and(|b| b.contains(&hung_ip))
            .then_some(())
    });
    backends_become(&lab, &holder, &ips, "the hung new backend out of the set");
    let new_out = t0.elapsed();
    assert!(
        hung.accepted() >= 1,
        "the check connected to the hung backend"
    );
    assert_eq!(
        connect_n(&lab, 30),
        30,
        "no connection goes to the hung backend"
    );

    // A backend in the set hangs: out after three failed checks.
    let victim = NODES.iter().find(|n| **n != holder).unwrap().to_string();
    let victim_ip = xtask::lab::node_ipv4(&victim).unwrap().to_string();
    let rest: Vec<String> = ips.iter().filter(|ip| **ip != victim_ip).cloned().collect();
    let t1 = Instant::now();
    lab.stop_local_api(&victim).unwrap();
    let silent = ThreadServer::silent(
        &lab.netns_path(&victim).unwrap(),
        "hung-local-api",
        SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), LB_PORT),
    )
    .unwrap();
    backends_become(&lab, &holder, &rest, "the hung backend out of the set");
    let hung_out = t1.elapsed();
    eprintln!(
        "hung backend out of the set after: new Node {new_out:?} (first check decides), \
         backend that hung {hung_out:?} (three checks)"
    );
    assert!(
        silent.accepted() >= 3,
        "the checks connected to the hung backend"
    );
    assert_eq!(
        connect_n(&lab, 30),
        30,
        "no connection goes to the hung backend"
    );
    let i = NODES.iter().position(|n| *n == holder).unwrap();
    let log = procs[i].log();
    assert!(
        log.lines().any(|l| l.contains("out of the set")
            && l.contains(&victim_ip)
            && l.contains("no answer to GET /readyz")),
        "{log}"
    );
    assert!(
        new_out < HUNG_OUT_LIMIT && hung_out < HUNG_OUT_LIMIT,
        "out after {new_out:?} (new) and {hung_out:?} (hung), limit {HUNG_OUT_LIMIT:?}"
    );

    // It answers again: back after two good checks.
    drop(silent);
    lab.start_local_api(&victim).unwrap();
    backends_become(&lab, &holder, &ips, "the recovered backend back in the set");
    drop(hung);
    for p in procs.iter_mut() {
        let _ = p.signal(Signal::SIGTERM);
    }
    for p in procs.iter_mut() {
        let s = p.wait_timeout(Duration::from_secs(5)).unwrap();
        assert!(s.is_some_and(|s| s.success()), "{}", p.log());
    }
}
