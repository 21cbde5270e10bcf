//! Lab tests of IPv6 Service VIPs on `lo` (`svc_ipv6_loopback`, issue 28, scenario S72):
//! vipd on node-a/b/c in Services mode with per-Service election against the real
//! kube-apiserver, the nftables fence on (the default). The holder puts the VIP on `lo` as a
//! local route (table local, proto 118; no address on `lo` or `eth0`) and answers the
//! client's neighbour solicitations for it on `eth0` itself (the kernel does not answer
//! for `lo`'s there); TCP reaches the node's HTTP backend through it; a SIGKILLed holder
//! stops answering with its process and the next holder answers, never two at once;
//! deleting the Service takes the route off `lo` and the VIP's solicited-node group off
//! `eth0`. Also (from the new-user trial): a frozen
//! holder answers nothing after it is continued, a graceful stop cleans up; an edited
//! address and a dual-stack Service; shards with a killed holder and a shared address;
//! without the nftables fence the VIPs stay on `eth0`.

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::{Lab, LabOptions, LabProcess, Signal};

/// The Service's VIP (the lab's IPv6 range).
const VIP6: &str = "2001:db8::64";

/// Whether `node`'s interface `ifname` carries `ip`: as an address, or, on `lo`, as one of
/// vipd's local routes (how `svc_ipv6_loopback` puts an IPv6 VIP there).
fn carries(lab: &Lab, node: &str, ifname: &str, ip: IpAddr) -> bool {
    let address = lab
        .addresses(node, ifname)
        .map(|a| a.iter().any(|x| x.addr == ip))
        .unwrap_or(false);
    let routed = ifname == "lo"
        && lab
            .loopback_routes(node)
            .map(|r| r.contains(&ip))
            .unwrap_or(false);
    address || routed
}

/// Whether `node` has `ip` as an address on `lo` (never, since the VIPs there are routes).
fn address_on_lo(lab: &Lab, node: &str, ip: IpAddr) -> bool {
    lab.addresses(node, "lo")
        .map(|a| a.iter().any(|x| x.addr == ip))
        .unwrap_or(false)
}

/// The interfaces of `node` on which `ip`'s solicited-node group is joined
/// (`/proc/net/igmp6` of its namespace: the group in 32 hex digits).
fn joined_on(lab: &Lab, node: &str, ip: IpAddr) -> Vec<String> {
    let IpAddr::V6(v6) = ip else {
        return Vec::new();
    };
    let o = v6.octets();
    let group = format!(
        "ff0200000000000000000001ff{:02x}{:02x}{:02x}",
        o[13], o[14], o[15]
    );
    let text = lab
        .in_netns(node, || {
            std::fs::read_to_string("/proc/thread-self/net/igmp6")
        })
        .expect("enter the node's namespace")
        .expect("read igmp6");
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&group.as_str())).then(|| f.get(1).map(|s| s.to_string()))?
        })
        .collect()
}

/// The node name the HTTP backend behind `ip` answers with, asked from the client.
fn backend_behind(lab: &Lab, ip: IpAddr) -> Option<String> {
    let dst = SocketAddr::new(ip, 80);
    lab.in_netns("client", move || xtask::lab::routed::ask_backend(dst))
        .expect("enter the client's namespace")
}

/// Whether one node, and only one, answers `ip` over about half a second of probes from the
/// client (at least 5 of its slots answered); panics when two answer in one slot.
fn answered_by_one(lab: &Lab, ip: IpAddr) -> bool {
    let w = lab
        .arp_watch(ip, xtask::lab::DEFAULT_WATCH_INTERVAL)
        .expect("watch who answers");
    std::thread::sleep(Duration::from_millis(500));
    let r = w.stop().expect("stop the watch");
    assert!(
        r.max_simultaneous_responders() <= 1,
        "two answers for {ip} in one slot: {:?}",
        r.multi_responder_intervals()
    );
    r.answered_slots() >= 5 && r.all_responders().len() == 1
}

/// vipd on every node with `svc_ipv6_loopback=true` and `extra`.
fn start_all(lab: &Lab, extra: &[(&str, &str)]) -> Vec<LabProcess> {
    let mut env = vec![("svc_ipv6_loopback", "true")];
    env.extend_from_slice(extra);
    NODES
        .iter()
        .map(|n| start_vipd_services(lab, n, true, &env))
        .collect()
}

/// The index of `node` in [`NODES`] (and in the processes of [`start_all`]).
fn idx(node: &str) -> usize {
    NODES.iter().position(|n| *n == node).expect("a lab node")
}

/// The nodes whose `lo` carries `ip`.
fn on_lo(lab: &Lab, ip: IpAddr) -> Vec<String> {
    NODES
        .iter()
        .filter(|n| carries(lab, n, "lo", ip))
        .map(|n| n.to_string())
        .collect()
}

#[test]
fn s72_ipv6_service_vips_on_lo_are_answered_by_their_holder_alone() {
    let opts = LabOptions {
        http_backends: true,
        ..LabOptions::default()
    };
    let Some(lab) = lab("s72_ipv6_loopback", opts) else {
        return;
    };
    let ip: IpAddr = VIP6.parse().expect("vip");
    let mut procs = start_all(&lab, &[]);
    create_service(
        &lab,
        &service_json("v6", Some(VIP6), None, &[(80, "TCP")], false),
    );
    let holder = wait_for("a holder of v6", Duration::from_secs(30), || {
        lease_holder(&lab, "default", "kubevip-v6").filter(|h| !h.is_empty())
    });
    wait_until(
        "the VIP on the holder's lo",
        Duration::from_secs(20),
        || carries(&lab, &holder, "lo", ip),
    );
    for n in NODES {
        assert!(
            !carries(&lab, n, "eth0", ip),
            "{n} carries {VIP6} on eth0: it belongs on lo"
        );
        assert!(
            !address_on_lo(&lab, n, ip),
            "{n} has {VIP6} as an address on lo: it is a local route there"
        );
    }
    wait_until(
        "the holder joins the VIP's solicited-node group on eth0 (and only there)",
        Duration::from_secs(10),
        || joined_on(&lab, &holder, ip) == ["eth0"],
    );
    // The client's solicitations are answered by the holder's eth0 alone.
    let holder_mac = lab.mac_of_if(&holder, "eth0").expect("holder mac");
    let answered = support::dhcp::responders(&lab, ip);
    assert_eq!(answered, BTreeSet::from([holder_mac]), "who answers {VIP6}");
    // And TCP reaches the holder's backend through the route on lo.
    let behind = wait_for(
        "an HTTP answer through the VIP",
        Duration::from_secs(10),
        || backend_behind(&lab, ip),
    );
    assert_eq!(behind, holder, "the backend behind {VIP6}");

    // The route deleted by hand is put back by the holder's next check (vipd follows route
    // deletions; before, it trusted its memory for 30 s while answering for the VIP: found
    // by the new-user trial).
    lab.exec(
        &holder,
        "ip",
        &[
            "-6", "route", "del", "local", VIP6, "table", "local", "proto", "118",
        ],
    )
    .expect("delete the route by hand");
    assert!(
        !carries(&lab, &holder, "lo", ip),
        "the route is still there"
    );
    wait_until(
        "the deleted route put back on the holder's lo",
        Duration::from_secs(10),
        || carries(&lab, &holder, "lo", ip),
    );
    let behind = wait_for(
        "an HTTP answer through the VIP after the route came back",
        Duration::from_secs(10),
        || backend_behind(&lab, ip),
    );
    assert_eq!(behind, holder, "the backend behind {VIP6}");

    // Failover: SIGKILL the holder. Its answers end with its process (the route stays on
    // its lo, inert, as the second line); the next holder answers; never two at once.
    let watch = lab
        .arp_watch(ip, xtask::lab::DEFAULT_WATCH_INTERVAL)
        .expect("watch who answers");
    let watch_started = Instant::now();
    let i = NODES
        .iter()
        .position(|n| *n == holder)
        .expect("holder index");
    procs[i].signal(Signal::SIGKILL).expect("kill the holder");
    let t0 = Instant::now();
    // Slot times count from the watch's start: a slot sent a probe interval after the kill
    // has no answer in flight from the killed process.
    let killed_at = watch_started.elapsed() + xtask::lab::DEFAULT_WATCH_INTERVAL;
    let next = wait_for("another holder", Duration::from_secs(30), || {
        lease_holder(&lab, "default", "kubevip-v6").filter(|h| !h.is_empty() && *h != holder)
    });
    let next_mac = lab.mac_of_if(&next, "eth0").expect("next mac");
    wait_until("the next holder answering", Duration::from_secs(20), || {
        watch.report().last_responders() == BTreeSet::from([next_mac])
    });
    eprintln!("S72: {next} answers {:?} after the kill", t0.elapsed());
    std::thread::sleep(Duration::from_millis(500));
    let report = watch.stop().expect("stop the watch");
    assert!(
        report.max_simultaneous_responders() <= 1,
        "two answers for {VIP6} in one slot: {:?}",
        report.multi_responder_intervals()
    );
    let late: Vec<_> = report
        .slots
        .iter()
        .filter(|s| s.t > killed_at && s.responders.contains(&holder_mac))
        .map(|s| s.t)
        .collect();
    assert!(
        late.is_empty(),
        "the killed holder answered after its process was gone (kill at {killed_at:?}): {late:?}"
    );
    assert!(carries(&lab, &next, "lo", ip), "the VIP on {next}'s lo");
    wait_until(
        "the next holder's group on eth0",
        Duration::from_secs(10),
        || joined_on(&lab, &next, ip) == ["eth0"],
    );
    let behind = wait_for(
        "an HTTP answer from the next holder",
        Duration::from_secs(10),
        || backend_behind(&lab, ip).filter(|b| *b == next),
    );
    assert_eq!(behind, next);

    // The killed node, restarted, removes what its last run left on lo and follows.
    procs[i] = start_vipd_services(&lab, &holder, true, &[("svc_ipv6_loopback", "true")]);
    wait_until(
        "the restarted node's stale VIP gone from lo",
        Duration::from_secs(20),
        || !carries(&lab, &holder, "lo", ip),
    );
    assert!(joined_on(&lab, &holder, ip).is_empty());

    // Deleting the Service takes the route off lo and the group off eth0.
    delete_service(&lab, "v6");
    wait_until(
        "the VIP gone from the holder's lo and its group left",
        Duration::from_secs(20),
        || !carries(&lab, &next, "lo", ip) && joined_on(&lab, &next, ip).is_empty(),
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
    stop_all(&mut procs);
}

/// A holder frozen for 8 s (SIGSTOP) loses its lease (5/3/1) to another node, which answers;
/// continued, it answers nothing more, and its route and group go; never two responders.
/// Then a graceful stop (SIGTERM) of the new holder takes its route off `lo` and its group
/// off `eth0` before it exits, and the node that takes the lease then answers alone.
#[test]
fn s72_a_frozen_holder_answers_nothing_after_it_is_continued_and_a_clean_stop_cleans_up() {
    let Some(lab) = lab("s72_ipv6_loopback_freeze", LabOptions::default()) else {
        return;
    };
    let ip: IpAddr = "2001:db8::65".parse().expect("vip");
    let mut procs = start_all(&lab, &[]);
    create_service(
        &lab,
        &service_json("f6", Some("2001:db8::65"), None, &[(80, "TCP")], false),
    );
    let holder = wait_for("a holder of f6", Duration::from_secs(30), || {
        lease_holder(&lab, "default", "kubevip-f6").filter(|h| !h.is_empty())
    });
    wait_until(
        "the VIP on the holder's lo",
        Duration::from_secs(20),
        || carries(&lab, &holder, "lo", ip),
    );
    let frozen_mac = lab.mac_of_if(&holder, "eth0").expect("holder mac");
    let watch = lab
        .arp_watch(ip, xtask::lab::DEFAULT_WATCH_INTERVAL)
        .expect("watch who answers");
    let watch_started = Instant::now();
    procs[idx(&holder)].signal(Signal::SIGSTOP).expect("freeze");
    let next = wait_for("another holder", Duration::from_secs(20), || {
        lease_holder(&lab, "default", "kubevip-f6").filter(|h| !h.is_empty() && *h != holder)
    });
    std::thread::sleep(Duration::from_secs(2));
    procs[idx(&holder)]
        .signal(Signal::SIGCONT)
        .expect("continue");
    let continued_at = watch_started.elapsed() + xtask::lab::DEFAULT_WATCH_INTERVAL;
    wait_until(
        "the continued holder's route and group gone",
        Duration::from_secs(20),
        || !carries(&lab, &holder, "lo", ip) && joined_on(&lab, &holder, ip).is_empty(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let report = watch.stop().expect("stop the watch");
    assert!(
        report.max_simultaneous_responders() <= 1,
        "two answers for {ip} in one slot: {:?}",
        report.multi_responder_intervals()
    );
    let late: Vec<_> = report
        .slots
        .iter()
        .filter(|s| s.t > continued_at && s.responders.contains(&frozen_mac))
        .map(|s| s.t)
        .collect();
    assert!(late.is_empty(), "the continued holder answered: {late:?}");
    let next_mac = lab.mac_of_if(&next, "eth0").expect("next mac");
    assert_eq!(report.last_responders(), BTreeSet::from([next_mac]));

    // A graceful stop of the new holder cleans up before it exits.
    procs[idx(&next)].signal(Signal::SIGTERM).expect("stop");
    let exited = procs[idx(&next)]
        .wait_timeout(Duration::from_secs(15))
        .expect("wait");
    assert!(exited.is_some(), "{next} did not exit");
    assert!(!carries(&lab, &next, "lo", ip), "{next} left the VIP on lo");
    assert!(
        joined_on(&lab, &next, ip).is_empty(),
        "{next} left its group joined"
    );
    let after = wait_for("the holder after the stop", Duration::from_secs(30), || {
        lease_holder(&lab, "default", "kubevip-f6").filter(|h| !h.is_empty() && *h != next)
    });
    wait_until("the VIP on its lo", Duration::from_secs(20), || {
        carries(&lab, &after, "lo", ip)
    });
    let after_mac = lab.mac_of_if(&after, "eth0").expect("mac");
    assert_eq!(
        support::dhcp::responders(&lab, ip),
        BTreeSet::from([after_mac])
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
    stop_all(&mut procs);
}

/// An edited address (the `kube-vip.io/loadbalancerIPs` annotation) leaves `lo` and its group
/// on every node and is answered no more; the new one is on its holder's `lo`, answered by
/// it alone. A dual-stack Service: its IPv4 VIP on `eth0`, its IPv6 VIP on `lo`, both
/// answered by the holder; deleted, both go.
#[test]
fn s72_an_edited_address_and_a_dual_stack_service() {
    let Some(lab) = lab("s72_ipv6_loopback_edit", LabOptions::default()) else {
        return;
    };
    let a: IpAddr = "2001:db8::66".parse().expect("vip");
    let b: IpAddr = "2001:db8::67".parse().expect("vip");
    let mut procs = start_all(&lab, &[]);
    create_service(
        &lab,
        &service_json("e6", Some("2001:db8::66"), None, &[(80, "TCP")], false),
    );
    let holder = wait_for("a holder of e6", Duration::from_secs(30), || {
        lease_holder(&lab, "default", "kubevip-e6").filter(|h| !h.is_empty())
    });
    wait_until(
        "the VIP on the holder's lo",
        Duration::from_secs(20),
        || carries(&lab, &holder, "lo", a),
    );
    wait_until(
        "the holder's group on eth0",
        Duration::from_secs(10),
        || joined_on(&lab, &holder, a) == ["eth0"],
    );
    patch_service(
        &lab,
        "e6",
        serde_json::json!({"metadata": {"annotations": {"kube-vip.io/loadbalancerIPs": "2001:db8::67"}}}),
    );
    let h2 = wait_for(
        "the new address on a node's lo",
        Duration::from_secs(30),
        || on_lo(&lab, b).into_iter().next(),
    );
    wait_until(
        "the old address gone everywhere",
        Duration::from_secs(20),
        || {
            NODES
                .iter()
                .all(|n| !carries(&lab, n, "lo", a) && joined_on(&lab, n, a).is_empty())
        },
    );
    wait_until(
        "the new address's group on eth0",
        Duration::from_secs(10),
        || joined_on(&lab, &h2, b) == ["eth0"],
    );
    let m2 = lab.mac_of_if(&h2, "eth0").expect("mac");
    assert_eq!(support::dhcp::responders(&lab, b), BTreeSet::from([m2]));
    let w = lab
        .arp_watch(a, xtask::lab::DEFAULT_WATCH_INTERVAL)
        .expect("watch the old address");
    std::thread::sleep(Duration::from_secs(2));
    let rep = w.stop().expect("stop the watch");
    assert_eq!(
        rep.answered_slots(),
        0,
        "the old address still answered: {:?}",
        rep.last_responders()
    );

    let v4: IpAddr = "192.0.2.68".parse().expect("vip");
    let v6: IpAddr = "2001:db8::68".parse().expect("vip");
    let mut svc = service_json(
        "ds",
        Some("192.0.2.68,2001:db8::68"),
        None,
        &[(80, "TCP")],
        false,
    );
    svc["spec"]["ipFamilyPolicy"] = serde_json::json!("PreferDualStack");
    create_service(&lab, &svc);
    let h = wait_for(
        "the IPv6 VIP on a node's lo",
        Duration::from_secs(30),
        || on_lo(&lab, v6).into_iter().next(),
    );
    wait_until("the IPv4 VIP on its eth0", Duration::from_secs(20), || {
        carries(&lab, &h, "eth0", v4)
    });
    assert!(!carries(&lab, &h, "lo", v4), "the IPv4 VIP on lo");
    assert!(!carries(&lab, &h, "eth0", v6), "the IPv6 VIP on eth0");
    let m = lab.mac_of_if(&h, "eth0").expect("mac");
    assert_eq!(support::dhcp::responders(&lab, v6), BTreeSet::from([m]));
    assert_eq!(support::dhcp::responders(&lab, v4), BTreeSet::from([m]));
    delete_service(&lab, "ds");
    wait_until("both VIPs gone", Duration::from_secs(20), || {
        NODES.iter().all(|n| {
            !carries(&lab, n, "lo", v6)
                && !carries(&lab, n, "eth0", v4)
                && joined_on(&lab, n, v6).is_empty()
        })
    });
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
    stop_all(&mut procs);
}

/// Shard leases (`svc_leaseshards=4`) with six IPv6 Services: a SIGKILLed node's Services
/// are answered elsewhere, each by one MAC, never two in one slot. Two Services sharing an
/// address (different ports) have one responder; deleting one leaves it answered by one
/// node (after a lease duration when it moves to the other's shard), deleting both takes it
/// off `lo` and its group off `eth0`.
#[test]
fn s72_shards_with_a_killed_holder_and_a_shared_address() {
    let Some(lab) = lab("s72_ipv6_loopback_shards", LabOptions::default()) else {
        return;
    };
    let mut procs = start_all(&lab, &[("svc_leaseshards", "4")]);
    let ips: Vec<IpAddr> = (0x70..0x76u16)
        .map(|x| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, x)))
        .collect();
    for (k, ip) in ips.iter().enumerate() {
        create_service(
            &lab,
            &service_json(
                &format!("sh{k}"),
                Some(&ip.to_string()),
                None,
                &[(80, "TCP")],
                false,
            ),
        );
    }
    wait_until(
        "every VIP on one node's lo",
        Duration::from_secs(40),
        || ips.iter().all(|ip| on_lo(&lab, *ip).len() == 1),
    );
    let victim = on_lo(&lab, ips[0])[0].clone();
    let theirs: Vec<IpAddr> = ips
        .iter()
        .copied()
        .filter(|ip| on_lo(&lab, *ip) == [victim.clone()])
        .collect();
    let victim_mac = lab.mac_of_if(&victim, "eth0").expect("mac");
    let watches: Vec<_> = theirs
        .iter()
        .take(2)
        .map(|ip| {
            lab.arp_watch(*ip, xtask::lab::DEFAULT_WATCH_INTERVAL)
                .expect("watch")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    procs[idx(&victim)]
        .signal(Signal::SIGKILL)
        .expect("kill the holder");
    // The killed node keeps its routes on lo (the second line, inert): another node
    // carries each too once it took the shard.
    wait_until(
        "every VIP on another node's lo",
        Duration::from_secs(40),
        || {
            ips.iter()
                .all(|ip| on_lo(&lab, *ip).iter().any(|n| *n != victim))
        },
    );
    for ip in &ips {
        let r = support::dhcp::responders(&lab, *ip);
        assert_eq!(r.len(), 1, "{ip}: responders {r:?}");
        assert!(!r.contains(&victim_mac), "{ip} answered by the killed node");
    }
    for w in watches {
        let rep = w.stop().expect("stop the watch");
        assert!(
            rep.max_simultaneous_responders() <= 1,
            "{:?}",
            rep.multi_responder_intervals()
        );
    }
    let shared: IpAddr = "2001:db8::77".parse().expect("vip");
    create_service(
        &lab,
        &service_json("sha", Some("2001:db8::77"), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("shb", Some("2001:db8::77"), None, &[(81, "TCP")], false),
    );
    wait_until("the shared VIP on one lo", Duration::from_secs(30), || {
        on_lo(&lab, shared).len() == 1
    });
    assert_eq!(support::dhcp::responders(&lab, shared).len(), 1);
    // Deleting one: when it governed the address and the other is on another shard, the
    // address moves there one lease duration later (design.md "Governance moves"); answered
    // again by one node, never by two.
    delete_service(&lab, "sha");
    wait_until(
        "the shared VIP answered again after one of its Services was deleted",
        Duration::from_secs(20),
        || answered_by_one(&lab, shared),
    );
    delete_service(&lab, "shb");
    wait_until("the shared VIP gone", Duration::from_secs(20), || {
        NODES.iter().all(|n| {
            (*n == victim || !carries(&lab, n, "lo", shared))
                && joined_on(&lab, n, shared).is_empty()
        })
    });
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
    stop_all(&mut procs);
}

/// Without the nftables fence (`vip_nftfence=false`) the option does nothing: each node
/// says so once, the VIP stays on `eth0` and the kernel answers for it.
#[test]
fn s72_without_the_nftables_fence_the_vips_stay_on_their_interface() {
    let Some(lab) = lab("s72_ipv6_loopback_nofence", LabOptions::default()) else {
        return;
    };
    let ip: IpAddr = "2001:db8::69".parse().expect("vip");
    let mut procs = start_all(&lab, &[("vip_nftfence", "false")]);
    create_service(
        &lab,
        &service_json("n6", Some("2001:db8::69"), None, &[(80, "TCP")], false),
    );
    let h = wait_for("the VIP on a node's eth0", Duration::from_secs(30), || {
        NODES
            .iter()
            .find(|n| carries(&lab, n, "eth0", ip))
            .map(|n| n.to_string())
    });
    assert!(on_lo(&lab, ip).is_empty(), "on lo without the fence");
    let m = lab.mac_of_if(&h, "eth0").expect("mac");
    assert_eq!(support::dhcp::responders(&lab, ip), BTreeSet::from([m]));
    for p in &procs {
        let said = p
            .log()
            .lines()
            .filter(|l| l.contains("svc_ipv6_loopback has no effect"))
            .count();
        assert_eq!(said, 1, "{}: the warning once", p.name());
    }
    stop_all(&mut procs);
}
