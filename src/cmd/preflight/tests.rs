use super::network::check_dhcp_parent;
use super::rbac::rbac_verdict;
use super::*;
use crate::net::LinkInfo;

#[test]
fn capabilities_from_status() {
    let all = "Name:\tx\nCapEff:\t000001ffffffffff\n";
    assert_eq!(check_capabilities(all).status, Status::Pass);
    // NET_ADMIN (bit 12) only.
    let c = check_capabilities("CapEff:\t0000000000001000\n");
    assert_eq!(c.status, Status::Fail);
    assert_eq!(c.detail, "missing CAP_NET_RAW");
    assert!(c.fix.unwrap().contains("NET_RAW"));
    let c = check_capabilities("CapEff:\t0000000000000000\n");
    assert_eq!(c.detail, "missing CAP_NET_ADMIN, CAP_NET_RAW");
    assert_eq!(check_capabilities("nothing").status, Status::Fail);
}

#[test]
fn dhcpv6_port_row_needs_net_bind_service_with_services() {
    let all = "CapEff:\t000001ffffffffff\n";
    assert_eq!(check_dhcp6_port(all, false).status, Status::Skip);
    assert_eq!(check_dhcp6_port(all, true).status, Status::Pass);
    // NET_ADMIN and NET_RAW (bits 12, 13) only.
    let c = check_dhcp6_port("CapEff:\t0000000000003000\n", true);
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.contains("CAP_NET_BIND_SERVICE"), "{}", c.detail);
    assert!(c.fix.unwrap().contains("NET_BIND_SERVICE"));
    assert_eq!(check_dhcp6_port("nothing", true).status, Status::Warn);
}

#[test]
fn lb_nftables_row() {
    assert_eq!(check_lb_nftables(None).status, Status::Skip);
    assert_eq!(check_lb_nftables(Some(&Ok(()))).status, Status::Pass);
    let e = crate::controlplane::lb::LbError {
        command: "add table ip vipd_lb".into(),
        detail: "Could not process rule: No such file or directory".into(),
    };
    let c = check_lb_nftables(Some(&Err(e)));
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("No such file"), "{}", c.detail);
    assert!(c.fix.unwrap().contains("CONFIG_NFT_NAT"));
}

#[test]
fn macvlan_cases() {
    assert_eq!(
        check_macvlan(None, true, None, None, true).status,
        Status::Pass
    );
    let dep = "kernel/drivers/net/macvlan.ko.zst: kernel/drivers/net/tap.ko\n";
    assert_eq!(
        check_macvlan(None, false, Some(dep), None, true).status,
        Status::Pass
    );
    assert_eq!(
        check_macvlan(
            None,
            false,
            Some(""),
            Some("kernel/drivers/net/macvlan.ko\n"),
            true
        )
        .status,
        Status::Pass
    );
    // Only DHCP Services need macvlans: with svc_enable a kernel without them is a warning.
    let c = check_macvlan(
        None,
        false,
        Some("kernel/drivers/net/macvtap.ko:\n"),
        None,
        true,
    );
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.contains("0.0.0.0"), "{}", c.detail);
    assert!(c.fix.unwrap().contains("kernel-default-base"));
    assert_eq!(
        check_macvlan(None, false, Some(""), None, false).status,
        Status::Skip
    );
    assert_eq!(
        check_macvlan(None, false, None, None, true).status,
        Status::Warn
    );
    // Trial finding F7: macvlan built in, no /sys/module/macvlan, no /lib/modules (this
    // lab's kernel): the kernel's own answer passes instead of the modules.dep warning.
    let c = check_macvlan(Some(true), false, None, None, true);
    assert_eq!(c.status, Status::Pass, "{}", c.detail);
    assert!(c.fix.is_none());
    // The kernel says it has none, whatever the files say.
    let c = check_macvlan(Some(false), true, Some(dep), None, true);
    assert_eq!(c.status, Status::Warn, "{}", c.detail);
    assert!(c.detail.contains("unknown device type"), "{}", c.detail);
}

#[test]
fn arp_flux_rows() {
    let t = |vip: Option<&str>, ifname: &str| FluxTarget {
        vip: vip.map(|v| v.parse().unwrap()),
        ifname: ifname.into(),
    };
    let targets = [t(Some("192.0.2.10"), "eth0"), t(None, "eth2")];
    let findings = [FluxFinding {
        target: targets[0].clone(),
        peers: vec![arpflux::FluxPeer {
            name: "eth1".into(),
            addr: ("192.0.2.111".parse().unwrap(), 24),
        }],
    }];
    let rows = check_arp_flux(&targets, &findings, &Ok(()));
    assert_eq!(rows.len(), 3);
    assert_eq!(
        (rows[0].name.as_str(), rows[0].status),
        ("nftables", Status::Pass)
    );
    assert_eq!(rows[1].name, "arp-flux:eth0");
    assert_eq!(rows[1].status, Status::Warn);
    assert!(
        rows[1].detail.contains("eth1 (192.0.2.111/24)"),
        "{}",
        rows[1].detail
    );
    assert!(rows[1].detail.contains("arp vipd"), "{}", rows[1].detail);
    let fix = rows[1].fix.as_deref().unwrap();
    assert!(
        fix.starts_with("sysctl -w net.ipv4.conf.all.arp_ignore=1"),
        "{fix}"
    );
    assert!(fix.contains("/etc/sysctl.d/"), "{fix}");
    assert_eq!(
        (rows[2].name.as_str(), rows[2].status),
        ("arp-flux:eth2", Status::Pass)
    );
    // Without nftables: the guard row warns and the finding says it is not covered.
    let err = Err(crate::net::ArpGuardError::Setup {
        command: "add table arp vipd".into(),
        detail: "nft not found".into(),
    });
    let rows = check_arp_flux(&targets, &findings, &err);
    assert_eq!(rows[0].status, Status::Warn);
    assert!(
        rows[0].detail.contains("nft not found"),
        "{}",
        rows[0].detail
    );
    assert!(
        rows[1].detail.contains("guard is off"),
        "{}",
        rows[1].detail
    );
    // Warnings do not fail preflight.
    assert!(!Report { checks: rows }.failed());
}

#[test]
fn rbac_denial_names_access_and_rule() {
    let checks = crate::kube::api::checks_for(
        &crate::kube::api::Needs {
            events_v1: Some(true),
            endpoint_slices: Some(true),
            ..crate::kube::api::Needs::manifest(false)
        },
        &crate::kube::api::Namespaces {
            lease: "kube-system".into(),
            ipam: "kube-system".into(),
            services: None,
            services_election: true,
        },
    );
    let pass = rbac_verdict(&checks, &[], &[], Some(true));
    assert_eq!(pass.status, Status::Pass);
    assert!(pass.detail.contains("events.k8s.io/v1"), "{}", pass.detail);
    let create_events: Vec<&crate::kube::api::AccessCheck> = checks
        .iter()
        .filter(|a| a.group == "events.k8s.io" && a.verb == crate::kube::api::Verb::Create)
        .collect();
    assert!(!create_events.is_empty());
    let c = rbac_verdict(&checks, &create_events, &[], Some(true));
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.detail
            .contains("create events.k8s.io/events cluster-wide"),
        "{}",
        c.detail
    );
    let fix = c.fix.unwrap();
    assert!(
        fix.contains(r#"{apiGroups: ["events.k8s.io"], resources: [events], verbs: [create]}"#)
            && fix.contains("vipd manifest rbac"),
        "{fix}"
    );
}

#[test]
fn report_renders_fixes_and_fails() {
    let r = Report {
        checks: vec![
            Check::new("a", Status::Pass, "fine"),
            Check::new("capabilities", Status::Fail, "missing CAP_NET_RAW").fix("add it"),
        ],
    };
    assert!(r.failed());
    let t = r.render();
    assert!(
        t.contains("capabilities  FAIL    missing CAP_NET_RAW"),
        "{t}"
    );
    assert!(t.contains("fix: add it"), "{t}");
    assert!(t.ends_with("preflight FAILED: 1 check(s)\n"), "{t}");
}

#[test]
fn dhcp_parent_row() {
    let link = |up, carrier| LinkInfo {
        index: 2,
        name: "eth0".into(),
        mac: [2, 0, 0, 0, 0, 1],
        up,
        carrier,
    };
    let ok = check_dhcp_parent(None, Ok(&link(true, true)));
    assert_eq!((ok.name.as_str(), ok.status), ("dhcp-parent", Status::Pass));
    assert!(
        ok.detail.contains("eth0") && ok.detail.contains("default route"),
        "{ok:?}"
    );
    let down = check_dhcp_parent(Some("eth0"), Ok(&link(true, false)));
    assert_eq!(down.status, Status::Warn, "only DHCP Services need it");
    assert!(down.detail.contains("carrier=false"), "{down:?}");
    assert!(
        down.fix
            .as_deref()
            .is_some_and(|f| f.contains("ip link set eth0 up"))
    );
    let missing = check_dhcp_parent(Some("bond7"), Err("no interface named bond7"));
    assert_eq!(missing.status, Status::Warn);
    assert!(
        missing.detail.contains("\"bond7\"") && missing.detail.contains("configured"),
        "{missing:?}"
    );
    let none = check_dhcp_parent(None, Err("no default route"));
    assert!(
        none.detail.contains("no parent") && none.detail.contains("no default route"),
        "{none:?}"
    );
}

#[test]
fn nft_fence_row_warns_when_nftables_cannot_fence() {
    let off = check_nft_fence(None, false);
    assert_eq!(off.status, Status::Skip);
    // Off (vip_nftfence=false) says what it costs.
    assert!(
        off.detail.contains("outlive the lease by up to ~1 s"),
        "{}",
        off.detail
    );
    assert_eq!(check_nft_fence(Some(&Ok(())), true).status, Status::Pass);
    let e = || crate::net::nft::fence::FenceError::Setup {
        command: "add table arp vipd_fence".into(),
        detail: "Error: Could not process rule: No such file or directory".into(),
    };
    let c = check_nft_fence(Some(&Err(e())), false);
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.detail.contains("address lifetime alone fences"),
        "{}",
        c.detail
    );
    // Trial finding: with sub-second timings the manager refuses to run without the fence,
    // so preflight fails instead of passing with a warning that was not true.
    let c = check_nft_fence(Some(&Err(e())), true);
    assert_eq!(c.status, Status::Fail, "{}", c.detail);
    assert!(c.detail.contains("refuse to run"), "{}", c.detail);
}

#[test]
fn egress_row_warns_where_the_rules_cannot_work() {
    assert_eq!(check_egress(None, false).status, Status::Skip);
    assert_eq!(check_egress(Some(&Ok(())), false).status, Status::Pass);
    let e = crate::net::nft::egress::EgressError::Change {
        command: "add chain inet vipd_fence egress_snat".into(),
        detail: "Operation not supported".into(),
    };
    let c = check_egress(Some(&Err(e)), false);
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.detail.contains("egress_snat") && c.detail.contains("kube-vip.io/egress"),
        "{}",
        c.detail
    );
    let c = check_egress(Some(&Ok(())), true);
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.contains("cilium_host"), "{}", c.detail);
}

#[test]
fn peer_key_row_warns_without_a_key() {
    let key = crate::peer::wire::PeerKey::from_bytes(&[7; 32]).unwrap();
    assert_eq!(check_peer_key(Ok(key)).status, Status::Pass);
    let c = check_peer_key(Err(
        "the Secret kube-system/vipd-peer-key, key \"key\": 5 bytes, at least 32 needed".into(),
    ));
    assert_eq!(
        c.status,
        Status::Warn,
        "the manager runs without ride-through"
    );
    assert!(c.detail.contains("5 bytes"), "{}", c.detail);
    assert!(
        c.fix
            .as_deref()
            .is_some_and(|f| f.contains("vipd manifest peer-key")),
        "{:?}",
        c.fix
    );
}

/// Issue 29: routing-table mode's rows. `/dev/net/tun` refused fails with the fix naming
/// the generators; the IPv6 route collector's interval warns when it is read-only and
/// longer than vipd wants, passes when writable or already 1 s, and skips without IPv6.
#[test]
fn routing_table_rows() {
    assert_eq!(check_tun(Ok(())).status, Status::Pass);
    let c = check_tun(Err("No such file or directory (os error 2)".into()));
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.detail.contains("/dev/net/tun") && c.detail.contains("os error 2"),
        "{c:?}"
    );
    assert!(
        c.fix.as_deref().is_some_and(|f| f.contains("--table")),
        "{c:?}"
    );
    assert_eq!(check_ipv6_route_gc(None, Ok(())).status, Status::Skip);
    assert_eq!(check_ipv6_route_gc(Some(30), Ok(())).status, Status::Pass);
    assert_eq!(
        check_ipv6_route_gc(Some(1), Err("read-only".into())).status,
        Status::Pass
    );
    let c = check_ipv6_route_gc(Some(30), Err("Read-only file system (os error 30)".into()));
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.contains("30 s past its lifetime"), "{c:?}");
}
