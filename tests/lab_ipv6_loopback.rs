//! Lab test of IPv6 Service VIPs on `lo` (`svc_ipv6_loopback`, issue 28, scenario S72):
//! vipd on node-a/b/c in Services mode with per-Service election against the real
//! kube-apiserver, the nftables fence on (the default). The holder adds the VIP to `lo`, not
//! `eth0`, and answers the client's neighbour solicitations for it on `eth0` itself (the
//! kernel does not answer for an address of `lo` there); TCP reaches the node's HTTP
//! backend through it; a SIGKILLed holder stops answering with its process and the next
//! holder answers, never two at once; deleting the Service takes the address off `lo` and
//! the VIP's solicited-node group off `eth0`.

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::{Lab, LabOptions, LabProcess, Signal};

/// The Service's VIP (the lab's IPv6 range).
const VIP6: &str = "2001:db8::64";
/// Its solicited-node group as `/proc/net/igmp6` prints it (32 hex digits).
const GROUP6: &str = "ff0200000000000000000001ff000064";

/// Whether `node`'s interface `ifname` carries `ip`.
fn carries(lab: &Lab, node: &str, ifname: &str, ip: IpAddr) -> bool {
    lab.addresses(node, ifname)
        .map(|a| a.iter().any(|x| x.addr == ip))
        .unwrap_or(false)
}

/// The interfaces of `node` on which `GROUP6` is joined (`/proc/net/igmp6` of its namespace).
fn group_joined_on(lab: &Lab, node: &str) -> Vec<String> {
    let text = lab
        .in_netns(node, || {
            std::fs::read_to_string("/proc/thread-self/net/igmp6")
        })
        .expect("enter the node's namespace")
        .expect("read igmp6");
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&GROUP6)).then(|| f.get(1).map(|s| s.to_string()))?
        })
        .collect()
}

/// The node name the HTTP backend behind `ip` answers with, asked from the client.
fn backend_behind(lab: &Lab, ip: IpAddr) -> Option<String> {
    let dst = SocketAddr::new(ip, 80);
    lab.in_netns("client", move || xtask::lab::routed::ask_backend(dst))
        .expect("enter the client's namespace")
}

fn start_all(lab: &Lab) -> Vec<LabProcess> {
    NODES
        .iter()
        .map(|n| start_vipd_services(lab, n, true, &[("svc_ipv6_loopback", "true")]))
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
    let mut procs = start_all(&lab);
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
    }
    assert_eq!(
        group_joined_on(&lab, &holder),
        ["eth0"],
        "the holder joins the VIP's solicited-node group on eth0 (and only there)"
    );
    // The client's solicitations are answered by the holder's eth0 alone.
    let holder_mac = lab.mac_of_if(&holder, "eth0").expect("holder mac");
    let answered = support::dhcp::responders(&lab, ip);
    assert_eq!(answered, BTreeSet::from([holder_mac]), "who answers {VIP6}");
    // And TCP reaches the holder's backend through the address on lo.
    let behind = wait_for(
        "an HTTP answer through the VIP",
        Duration::from_secs(10),
        || backend_behind(&lab, ip),
    );
    assert_eq!(behind, holder, "the backend behind {VIP6}");

    // Failover: SIGKILL the holder. Its answers end with its process (the address stays on
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
    assert_eq!(group_joined_on(&lab, &next), ["eth0"]);
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
    assert!(group_joined_on(&lab, &holder).is_empty());

    // Deleting the Service takes the address off lo and the group off eth0.
    delete_service(&lab, "v6");
    wait_until(
        "the VIP gone from the holder's lo and its group left",
        Duration::from_secs(20),
        || !carries(&lab, &next, "lo", ip) && group_joined_on(&lab, &next).is_empty(),
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
    stop_all(&mut procs);
}
