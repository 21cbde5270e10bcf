//! Lab tests of DHCPv6 mode end to end (issue 13, `::` Services): vipd on node-a/b/c in
//! Services mode (no DHCP option: `::` asks DHCP, as in kube-vip) and per-Service election against the real
//! kube-apiserver, dnsmasq in the lab's `dhcp` namespace with a DHCPv6 pool
//! (2001:db8::1000-1fff, IA_NA, lease 120 s). A Service whose address is `::` gets one from
//! dnsmasq through a macvlan on its holder; the client namespace probes it with neighbour
//! solicitations.

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use support::dhcp::*;
use support::*;
use xtask::lab::{
    DHCP_POOL_END, DHCP_POOL_START, DHCP6_POOL_END, DHCP6_POOL_START, DnsmasqOptions, FrameCapture,
    Lab, LabOptions, LabProcess, Signal,
};

/// How long a first lease may take: vipd's election (lease 5/3/1), Solicit/Advertise/
/// Request/Reply and vipd's conflict probe (well under a second in the lab; generous).
const BRING_UP: Duration = Duration::from_secs(30);

fn in_pool6(a: Ipv6Addr) -> bool {
    (u128::from(DHCP6_POOL_START)..=u128::from(DHCP6_POOL_END)).contains(&u128::from(a))
}

/// dnsmasq with the lab's DHCPv4 and DHCPv6 pools.
fn dnsmasq_options() -> DnsmasqOptions {
    DnsmasqOptions {
        range_v6: Some((DHCP6_POOL_START, DHCP6_POOL_END)),
        ..DnsmasqOptions::default()
    }
}

/// dnsmasq with DHCPv4 and DHCPv6 running, vipd on every node in DHCP mode with
/// per-Service election.
fn start(lab: &Lab) -> Vec<LabProcess> {
    lab.start_dnsmasq(&dnsmasq_options()).unwrap();
    NODES
        .iter()
        .map(|n| start_vipd_services(lab, n, true, &[]))
        .collect()
}

/// A LoadBalancer Service asking for DHCP: `kube-vip.io/loadbalancerIPs: <ips>`.
fn dhcp6_service(name: &str, ips: &str) -> serde_json::Value {
    service_json(name, Some(ips), None, &[(80, "TCP")], false)
}

/// Nodes that have a link named `name`.
fn nodes_with_link(lab: &Lab, name: &str) -> Vec<String> {
    NODES
        .iter()
        .filter(|n| lab.mac_of_if(n, name).is_ok())
        .map(|n| n.to_string())
        .collect()
}

/// The Service's IPv6 ingress address once it is one from the DHCPv6 pool.
fn wait_pool6_ingress(lab: &Lab, svc: &str, limit: Duration) -> Ipv6Addr {
    wait_for(
        &format!("a DHCPv6 pool address in {svc}'s status"),
        limit,
        || {
            ingress_ips(lab, svc)
                .iter()
                .filter_map(|a| a.parse::<Ipv6Addr>().ok())
                .find(|a| in_pool6(*a))
        },
    )
}

/// The lease holder of the Service's per-Service lease.
fn holder_of(lab: &Lab, svc: &str) -> String {
    wait_for("one lease holder", Duration::from_secs(10), || {
        lease_holder(lab, "default", &format!("kubevip-{svc}")).filter(|h| !h.is_empty())
    })
}

/// S23 (DHCPv6): a `::` Service gets an address from dnsmasq's DHCPv6 pool; its status and
/// `kube-vip.io/requestedIP` name it; the macvlan `vip-<uid[..8]>` exists only on the
/// holder and carries it as a /128; a neighbour solicitation for it from the client is
/// answered by the macvlan's MAC alone, which also announced it (unsolicited NA); dnsmasq
/// holds the lease for the macvlan's DUID-LL. SIGTERM of the holder then moves the macvlan
/// (same MAC) and the same address to another node, without a Release.
#[test]
fn s23_dhcpv6_service_gets_pool_address() {
    let Some(lab) = keyed_lab("s23_dhcpv6", LabOptions::default()) else {
        return;
    };
    let mut procs = start(&lab);
    let cap = lab.start_capture().unwrap();
    let epoch = Instant::now();
    create_service(&lab, &dhcp6_service("web6", "::"));
    let ip = wait_pool6_ingress(&lab, "web6", BRING_UP);
    let status_at = epoch.elapsed();
    assert_eq!(ingress_ips(&lab, "web6"), vec![ip.to_string()]);
    let macvlan = macvlan_of(&lab, "web6");
    let holder = holder_of(&lab, "web6");
    assert_eq!(nodes_with_link(&lab, &macvlan), vec![holder.clone()]);
    let mac = lab.mac_of_if(&holder, &macvlan).unwrap();
    let addrs = lab.addresses(&holder, &macvlan).unwrap();
    // A /128, fenced: its valid lifetime never reaches past the 120 s lease.
    assert!(
        addrs.iter().any(|a| a.addr == IpAddr::V6(ip)
            && a.prefix == 128
            && a.valid_lft.is_some_and(|l| l <= 120)),
        "{addrs:?}"
    );
    // The parent carries no leased address.
    let parent = lab.addresses(&holder, "eth0").unwrap();
    assert!(
        parent.iter().all(|a| a.addr != IpAddr::V6(ip)),
        "{parent:?}"
    );
    assert_eq!(responders(&lab, IpAddr::V6(ip)), BTreeSet::from([mac]));
    wait_until(
        "an unsolicited NA from the macvlan",
        Duration::from_secs(5),
        || {
            cap.frames()
                .iter()
                .any(|f| f.is_announcement_of(IpAddr::V6(ip)) && f.eth_src == mac)
        },
    );
    cap.stop().unwrap();
    eprintln!("S23 (DHCPv6) figures: status {status_at:?} after the Service was created");
    // dnsmasq leased it to the macvlan's DUID-LL (type 3, hardware type 1, the MAC).
    let duid = format!("00:03:00:01:{mac}");
    let leases = lab.dnsmasq_leases6().unwrap();
    assert!(
        leases.iter().any(|l| l.addr == ip && l.duid == duid),
        "{leases:?} (want {ip} for {duid})"
    );
    // The holder writes the MAC and the address back.
    wait_until(
        "hwaddr and requestedIP written",
        Duration::from_secs(10),
        || {
            annotation(&lab, "web6", "kube-vip.io/hwaddr").as_deref() == Some(&mac.to_string())
                && annotation(&lab, "web6", "kube-vip.io/requestedIP").as_deref()
                    == Some(&ip.to_string())
        },
    );
    quiet(&lab, &procs, "web6");

    // Failover: SIGTERM the holder; the next one asks as the same client (same MAC, so
    // same DUID and IAID) and gets the same address.
    signal_node(
        &mut procs,
        &holder,
        Signal::SIGTERM,
        Duration::from_secs(15),
    );
    assert!(
        !nodes_with_link(&lab, &macvlan).contains(&holder),
        "{macvlan} left behind on {holder} after SIGTERM"
    );
    let new = wait_for(
        "another node with the macvlan",
        BRING_UP,
        || match nodes_with_link(&lab, &macvlan).as_slice() {
            [one] if *one != holder => Some(one.clone()),
            _ => None,
        },
    );
    assert_eq!(lab.mac_of_if(&new, &macvlan).unwrap(), mac, "same MAC");
    wait_until("the same address on the new holder", BRING_UP, || {
        lab.addresses(&new, &macvlan)
            .is_ok_and(|a| a.iter().any(|a| a.addr == IpAddr::V6(ip)))
    });
    assert_eq!(responders(&lab, IpAddr::V6(ip)), BTreeSet::from([mac]));
    assert_eq!(ingress_ips(&lab, "web6"), vec![ip.to_string()]);
    assert!(
        !lab.dnsmasq_log().contains("DHCPRELEASE"),
        "no Release on shutdown: {}",
        lab.dnsmasq_log()
    );
    quiet(&lab, &procs, "web6");

    // Delete: the macvlan goes and dnsmasq sees the Release.
    delete_service(&lab, "web6");
    wait_until("no macvlan on any node", Duration::from_secs(10), || {
        nodes_with_link(&lab, &macvlan).is_empty()
    });
    wait_until(
        "the Release in dnsmasq's log",
        Duration::from_secs(10),
        || lab.dnsmasq_log().contains("DHCPRELEASE"),
    );
    no_panics(&procs);
}

/// Whether `node`'s `macvlan` carries `ip`.
fn carries(lab: &Lab, node: &str, macvlan: &str, ip: Ipv6Addr) -> bool {
    lab.addresses(node, macvlan)
        .is_ok_and(|a| a.iter().any(|a| a.addr == IpAddr::V6(ip)))
}

/// S23 (DHCPv6 renewal and expiry): the lease is renewed at T1 (dnsmasq sees a Renew from
/// the macvlan's DUID and extends it) and the address stays past the first lease's end;
/// with dnsmasq stopped, the address goes when the valid lifetime ends and a
/// `DHCPLeaseLost` Warning says why; with dnsmasq back, the same address returns.
#[test]
fn s23_dhcpv6_renewal_keeps_the_address_and_expiry_removes_it() {
    let Some(lab) = keyed_lab("s23_dhcpv6_renew", LabOptions::default()) else {
        return;
    };
    let procs = start(&lab);
    create_service(&lab, &dhcp6_service("web6", "::"));
    let ip = wait_pool6_ingress(&lab, "web6", BRING_UP);
    let macvlan = macvlan_of(&lab, "web6");
    let holder = holder_of(&lab, "web6");
    let mac = lab.mac_of_if(&holder, &macvlan).unwrap();
    let duid = format!("00:03:00:01:{mac}");
    let first = wait_for("dnsmasq's DHCPv6 lease", Duration::from_secs(5), || {
        lab.dnsmasq_leases6()
            .unwrap()
            .into_iter()
            .find(|l| l.addr == ip && l.duid == duid)
            .map(|l| l.expires)
    });
    wait_until("the lease renewed at T1", Duration::from_secs(90), || {
        lab.dnsmasq_leases6()
            .unwrap()
            .iter()
            .any(|l| l.addr == ip && l.duid == duid && l.expires > first)
    });
    assert!(
        lab.dnsmasq_log().contains("DHCPRENEW"),
        "{}",
        lab.dnsmasq_log()
    );
    wait_until(
        "the first lease's end passed",
        Duration::from_secs(90),
        || unix_now() > first + 2,
    );
    assert!(
        carries(&lab, &holder, &macvlan, ip),
        "{ip} gone from {holder}/{macvlan} after the first lease ended"
    );
    assert_eq!(responders(&lab, IpAddr::V6(ip)), BTreeSet::from([mac]));
    quiet(&lab, &procs, "web6");

    // No server: Renew, then Rebind, then the valid lifetime ends and the address goes.
    lab.stop_dnsmasq().unwrap();
    let stopped = Instant::now();
    wait_until(
        "the address removed at expiry",
        Duration::from_secs(150),
        || !carries(&lab, &holder, &macvlan, ip),
    );
    eprintln!(
        "S23 (DHCPv6) figures: address removed {:?} after the server stopped",
        stopped.elapsed()
    );
    wait_until("a DHCPLeaseLost Warning", Duration::from_secs(10), || {
        events_for(&lab, "web6").iter().any(|(t, r, m)| {
            t == "Warning"
                && r == "DHCPLeaseLost"
                && m.contains("DHCPv6")
                && m.contains(&ip.to_string())
        })
    });
    // Held nowhere now: its status and vipHost are cleared.
    wait_until("the status cleared", Duration::from_secs(10), || {
        ingress_ips(&lab, "web6").is_empty()
    });
    // The server back: the same address (asked for again, same DUID and IAID).
    lab.start_dnsmasq(&dnsmasq_options()).unwrap();
    wait_until("the same address again", Duration::from_secs(90), || {
        carries(&lab, &holder, &macvlan, ip)
    });
    // The status, cleared while no address was held, is written again.
    wait_until(
        "the status naming it again",
        Duration::from_secs(10),
        || ingress_ips(&lab, "web6") == vec![ip.to_string()],
    );
    no_panics(&procs);
}

/// Dual stack: a `0.0.0.0,::` Service gets one address of each pool on its one macvlan;
/// the status lists the IPv4 address first (Harvester reads `ingress[0].ip`) and
/// `kube-vip.io/requestedIP` is `v4,v6`; both are answered from the macvlan's MAC.
#[test]
fn s23_dual_stack_dhcp_service_gets_both_addresses_on_one_macvlan() {
    let Some(lab) = keyed_lab("s23_dhcp_dual", LabOptions::default()) else {
        return;
    };
    let procs = start(&lab);
    create_service(&lab, &dhcp6_service("dual", "0.0.0.0,::"));
    let in_pool4 = |a: Ipv4Addr| {
        (u32::from(DHCP_POOL_START)..=u32::from(DHCP_POOL_END)).contains(&u32::from(a))
    };
    let (v4, v6) = wait_for(
        "both addresses in the status",
        BRING_UP,
        || match ingress_ips(&lab, "dual").as_slice() {
            [a, b] => {
                let v4 = a.parse::<Ipv4Addr>().ok().filter(|a| in_pool4(*a))?;
                let v6 = b.parse::<Ipv6Addr>().ok().filter(|b| in_pool6(*b))?;
                Some((v4, v6))
            }
            _ => None,
        },
    );
    let macvlan = macvlan_of(&lab, "dual");
    let holder = holder_of(&lab, "dual");
    assert_eq!(nodes_with_link(&lab, &macvlan), vec![holder.clone()]);
    let mac = lab.mac_of_if(&holder, &macvlan).unwrap();
    let addrs = lab.addresses(&holder, &macvlan).unwrap();
    assert!(
        addrs
            .iter()
            .any(|a| a.addr == IpAddr::V4(v4) && a.prefix == 32)
            && addrs
                .iter()
                .any(|a| a.addr == IpAddr::V6(v6) && a.prefix == 128),
        "{addrs:?}"
    );
    assert_eq!(responders(&lab, IpAddr::V6(v6)), BTreeSet::from([mac]));
    wait_until("requestedIP v4,v6", Duration::from_secs(10), || {
        annotation(&lab, "dual", "kube-vip.io/requestedIP").as_deref()
            == Some(&format!("{v4},{v6}"))
    });
    quiet(&lab, &procs, "dual");
    // Deleted: both released, the macvlan gone.
    delete_service(&lab, "dual");
    wait_until("no macvlan on any node", Duration::from_secs(10), || {
        nodes_with_link(&lab, &macvlan).is_empty()
    });
    wait_until("both released", Duration::from_secs(10), || {
        let log = lab.dnsmasq_log();
        log.contains(&format!("DHCPRELEASE(eth0) {v4} {mac}"))
            && log.matches("DHCPRELEASE").count() >= 2
    });
    no_panics(&procs);
}

/// S24 (DHCPv6, SIGKILL): the holder's macvlan carries vipd's link-local address (the
/// EUI-64 of the Service's MAC) with a lifetime of seconds, not the kernel's infinite one.
/// SIGKILL the holder: the kernel keeps its macvlan, but within seconds it carries no
/// address at all (leased address fenced, link-local expired), while the next holder has
/// the same MAC and the same leased address. A leftover with the shared MAC's link-local
/// would answer for it, moving the switch's entry for the MAC to the dead node.
#[test]
fn s24_dhcpv6_holder_sigkill_leaves_a_silent_macvlan() {
    let Some(lab) = keyed_lab("s24_dhcpv6_kill", LabOptions::default()) else {
        return;
    };
    let mut procs = start(&lab);
    create_service(&lab, &dhcp6_service("web6", "::"));
    let ip = wait_pool6_ingress(&lab, "web6", BRING_UP);
    let macvlan = macvlan_of(&lab, "web6");
    let holder = holder_of(&lab, "web6");
    let mac = lab.mac_of_if(&holder, &macvlan).unwrap();
    let ll = IpAddr::V6(vipd::net::macvlan::eui64_link_local(mac.octets()));
    let addrs = lab.addresses(&holder, &macvlan).unwrap();
    assert!(
        addrs
            .iter()
            .any(|a| a.addr == ll && a.valid_lft.is_some_and(|l| l <= 2)),
        "want {ll} with a lifetime of at most 2 s: {addrs:?}"
    );

    signal_node(&mut procs, &holder, Signal::SIGKILL, Duration::from_secs(5));
    wait_until(
        "the killed holder's macvlan without any address",
        Duration::from_secs(6),
        || lab.addresses(&holder, &macvlan).is_ok_and(|a| a.is_empty()),
    );
    assert!(
        nodes_with_link(&lab, &macvlan).contains(&holder),
        "the kernel keeps the killed holder's macvlan"
    );
    let new = wait_for("another node carrying the address", BRING_UP, || {
        NODES
            .iter()
            .find(|n| **n != holder && carries(&lab, n, &macvlan, ip))
            .map(|n| n.to_string())
    });
    assert_eq!(lab.mac_of_if(&new, &macvlan).unwrap(), mac, "same MAC");
    assert!(lab.addresses(&holder, &macvlan).unwrap().is_empty());
    assert_eq!(responders(&lab, IpAddr::V6(ip)), BTreeSet::from([mac]));
    no_panics(&procs);
}

/// Longest time a SIGKILLed DHCPv6 holder's leftover macvlan may still send a frame after
/// the kill: its link-local's lifetime ([`vipd::net::macvlan::LINK_LOCAL_LIFETIME_SECS`], 2 s)
/// counted from the last refresh (every 500 ms), plus the kernel's whole-second expiry
/// check (up to 1 s), plus the MLD reports of leaving its solicited-node group, which vipd's
/// macvlans send at once (`mldv*_unsolicited_report_interval` of 20 ms) instead of spread
/// over a second. 3.2 s with scheduling slack; under the Service lease (5 s) less one retry
/// period, the earliest a new holder may take over after a kill.
const LEFTOVER_SILENT_BY: Duration = Duration::from_millis(3200);

/// S24 (DHCPv6, SIGKILL, issue 27): nothing at all leaves the killed holder from the
/// Service's shared MAC later than [`LEFTOVER_SILENT_BY`] after the kill, while the client
/// keeps soliciting the macvlan's link-local address every 50 ms: no neighbour advertisement
/// for it, no MLD report, and nothing once the next holder (same MAC) has the address.
#[test]
fn s24_killed_dhcpv6_holders_macvlan_goes_silent_before_the_next_holder() {
    let Some(lab) = keyed_lab("s24_dhcpv6_silent", LabOptions::default()) else {
        return;
    };
    let mut procs = start(&lab);
    create_service(&lab, &dhcp6_service("web6", "::"));
    let ip = wait_pool6_ingress(&lab, "web6", BRING_UP);
    let macvlan = macvlan_of(&lab, "web6");
    let holder = holder_of(&lab, "web6");
    let mac = lab.mac_of_if(&holder, &macvlan).unwrap();
    let ll = IpAddr::V6(vipd::net::macvlan::eui64_link_local(mac.octets()));
    let cap = FrameCapture::start(&lab.netns_path(&holder).unwrap(), "eth0").unwrap();
    let ns = lab
        .arp_watch(ll, xtask::lab::DEFAULT_WATCH_INTERVAL)
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let kill_at = cap.frames().len();
    let t0 = Instant::now();
    signal_node(&mut procs, &holder, Signal::SIGKILL, Duration::from_secs(5));
    let killed = t0.elapsed();
    let new = wait_for("another node carrying the address", BRING_UP, || {
        NODES
            .iter()
            .find(|n| **n != holder && carries(&lab, n, &macvlan, ip))
            .map(|n| n.to_string())
    });
    let taken = t0.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    let report = ns.stop().unwrap();
    let frames = cap.stop().unwrap();
    let sent = |f: &&xtask::lab::SeenFrame| f.outgoing && f.eth_src == mac;
    let before: Vec<_> = frames[..kill_at].iter().filter(sent).collect();
    let first_t = frames[kill_at..].first().map(|f| f.t).unwrap_or_default();
    // Capture time of the kill: the first frame after the mark less the time it took to send.
    let kill_t = first_t.saturating_sub(killed);
    let after: Vec<_> = frames[kill_at..]
        .iter()
        .filter(sent)
        .map(|f| (f.t.saturating_sub(kill_t), f.ethertype, f.icmpv6_type))
        .collect();
    println!(
        "S24 figures: new holder {new} carried the address {} ms after the kill; frames from the shared MAC on {holder} after the kill (ms, ethertype, icmpv6 type): {after:?}",
        taken.as_millis()
    );
    assert!(
        before.iter().any(|f| f.icmpv6_type == Some(136)),
        "the live holder answered the solicitations for {ll} (the capture sees it): {before:?}"
    );
    let last = after.last().map(|f| f.0).unwrap_or_default();
    assert!(
        last <= LEFTOVER_SILENT_BY,
        "the leftover macvlan on {holder} sent from the shared MAC {} ms after the kill (bound {} ms): {after:?}",
        last.as_millis(),
        LEFTOVER_SILENT_BY.as_millis()
    );
    assert!(
        last < taken,
        "the leftover sent after the next holder had the address: {after:?}"
    );
    assert_eq!(lab.mac_of_if(&new, &macvlan).unwrap(), mac, "same MAC");
    assert!(report.all_responders().iter().all(|m| *m == mac));
    no_panics(&procs);
}
