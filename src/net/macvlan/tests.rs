use netlink_packet_route::link::MacVlanMode;
use rtnetlink::LinkMacVlan;

use super::fake::FakeKernel;
use super::rtnl::link_entry;
use super::*;

fn entry(index: u32, name: &str, macvlan: bool, alias: Option<&str>) -> LinkEntry {
    LinkEntry {
        index,
        name: name.into(),
        macvlan,
        alias: alias.map(Into::into),
        parent: macvlan.then_some(2),
        mac: [0x02, 0, 0, 0, 0, index as u8],
    }
}

fn spec(name: &str) -> MacvlanSpec {
    MacvlanSpec {
        parent: "eth0".into(),
        name: name.into(),
        mac: [0x02, 0, 0, 0, 0, 9],
        mark: "vipd:uid-1".into(),
        rp_filter: 0,
        ipv6_now: false,
        own_addrs: vec!["192.0.2.210".parse().unwrap()],
        probe_mac: false,
    }
}

#[test]
fn validation_names_the_value() {
    let long = spec("vip-0123456789ab");
    let e = validate(&long).unwrap_err().to_string();
    assert!(
        e.contains("\"vip-0123456789ab\"") && e.contains("15 bytes"),
        "{e}"
    );
    assert!(validate(&spec("vip-01234567")).is_ok());

    let mut multicast = spec("vip-a");
    multicast.mac = [0x01, 0, 0x5e, 0, 0, 1];
    let e = validate(&multicast).unwrap_err().to_string();
    assert!(e.contains("01:00:5e:00:00:01"), "{e}");
    let mut zero = spec("vip-a");
    zero.mac = [0; 6];
    assert!(validate(&zero).is_err());

    let mut unmarked = spec("vip-a");
    unmarked.mark = "kube-vip".into();
    let e = validate(&unmarked).unwrap_err().to_string();
    assert!(e.contains("\"kube-vip\""), "{e}");

    let mut rp = spec("vip-a");
    rp.rp_filter = 3;
    let e = validate(&rp).unwrap_err().to_string();
    assert!(e.contains("rp_filter 3"), "{e}");
}

#[test]
fn plan_reuses_replaces_or_refuses() {
    let s = spec("vip-a");
    let mut same = entry(5, "vip-a", true, Some("vipd:uid-1"));
    same.mac = s.mac;
    assert_eq!(
        link_action(&[same.clone()], &s, 2).unwrap(),
        LinkAction::Reuse(5)
    );
    // Other MAC, other parent or other mark: replaced.
    let mut other_mac = same.clone();
    other_mac.mac[5] = 1;
    assert_eq!(
        link_action(&[other_mac], &s, 2).unwrap(),
        LinkAction::Replace(5)
    );
    assert_eq!(
        link_action(&[same.clone()], &s, 3).unwrap(),
        LinkAction::Replace(5)
    );
    let mut other_mark = same.clone();
    other_mark.alias = Some("vipd:uid-2".into());
    assert_eq!(
        link_action(&[other_mark], &s, 2).unwrap(),
        LinkAction::Replace(5)
    );
    assert_eq!(link_action(&[], &s, 2).unwrap(), LinkAction::Create);
    // Not ours: a plain interface, a macvlan without or with a foreign alias.
    for foreign in [
        entry(5, "vip-a", false, Some("vipd:uid-1")),
        entry(5, "vip-a", true, None),
        entry(5, "vip-a", true, Some("kube-vip")),
    ] {
        let e = link_action(&[foreign], &s, 2).unwrap_err().to_string();
        assert!(e.contains("vip-a") && e.contains("refusing"), "{e}");
    }
}

#[test]
fn stale_is_only_marked_macvlans_not_kept() {
    let links = vec![
        entry(1, "lo", false, None),
        entry(2, "eth0", false, Some("vipd:looks-ours-but-not-a-macvlan")),
        entry(3, "vip-a", true, Some("vipd:a")),
        entry(4, "vip-b", true, Some("vipd:b")),
        entry(5, "mv-user", true, Some("user's")),
        entry(6, "mv-bare", true, None),
    ];
    let names = |v: Vec<&LinkEntry>| v.into_iter().map(|l| l.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(stale(&links, &[])), vec!["vip-a", "vip-b"]);
    assert_eq!(names(stale(&links, &["vip-b"])), vec!["vip-a"]);
}

#[tokio::test]
async fn ensure_creates_configures_then_brings_up() {
    let m = Macvlans::new(FakeKernel::with(vec![entry(2, "eth0", false, None)]));
    let mut s = spec("vip-a");
    s.rp_filter = 2;
    let index = m.ensure(&s).await.unwrap();
    assert_eq!(
        m.kernel().calls(),
        vec![
            "create vip-a on 2 02:00:00:00:00:09 vipd:uid-1".to_string(),
            "addrgenmode none vip-a".into(),
            "sysctl ipv4 vip-a rp_filter=2".into(),
            "sysctl ipv4 vip-a arp_ignore=1".into(),
            "sysctl ipv4 vip-a arp_announce=2".into(),
            "sysctl ipv6 vip-a accept_ra=0".into(),
            "sysctl ipv6 vip-a autoconf=0".into(),
            "sysctl ipv6 vip-a mldv1_unsolicited_report_interval=20".into(),
            "sysctl ipv6 vip-a mldv2_unsolicited_report_interval=20".into(),
            format!("up vip-a {index}"),
        ]
    );
    // Again: reused, not recreated.
    m.ensure(&s).await.unwrap();
    assert!(
        !m.kernel().calls()[10..]
            .iter()
            .any(|c| c.starts_with("create"))
    );
}

#[tokio::test]
async fn ensure_works_on_a_kernel_without_ipv6() {
    let k = FakeKernel::with(vec![entry(2, "eth0", false, None)]);
    k.no_ipv6.store(true, std::sync::atomic::Ordering::Relaxed);
    let m = Macvlans::new(k);
    let index = m.ensure(&spec("vip-a")).await.unwrap();
    let calls = m.kernel().calls();
    assert!(
        calls.contains(&"sysctl ipv4 vip-a arp_ignore=1".to_string()),
        "{calls:?}"
    );
    assert_eq!(calls.last(), Some(&format!("up vip-a {index}")));
}

#[tokio::test]
async fn ensure_errors_name_parent_and_foreign_interface() {
    let m = Macvlans::new(FakeKernel::with(vec![
        entry(2, "eth0", false, None),
        entry(3, "vip-a", true, None),
    ]));
    let mut s = spec("vip-b");
    s.parent = "eth9".into();
    let e = m.ensure(&s).await.unwrap_err().to_string();
    assert!(
        e.contains("\"eth9\"") && e.contains("does not exist"),
        "{e}"
    );
    let e = m.ensure(&spec("vip-a")).await.unwrap_err().to_string();
    assert!(e.contains("vip-a") && e.contains("refusing"), "{e}");
    let e = m.remove("vip-a").await.unwrap_err().to_string();
    assert!(e.contains("refusing"), "{e}");
    assert!(m.kernel().calls().is_empty(), "{:?}", m.kernel().calls());
}

#[tokio::test]
async fn remove_stale_leaves_foreign_macvlans() {
    let m = Macvlans::new(FakeKernel::with(vec![
        entry(2, "eth0", false, None),
        entry(3, "vip-a", true, Some("vipd:a")),
        entry(4, "mv-user", true, None),
    ]));
    assert_eq!(m.remove_stale(&[]).await.unwrap(), vec!["vip-a"]);
    assert_eq!(m.kernel().calls(), vec!["delete vip-a 3"]);
    assert!(!m.remove("vip-a").await.unwrap());
}

#[test]
fn decodes_kind_alias_parent_and_mac() {
    let msg = LinkMacVlan::new("vip-a", 2, MacVlanMode::Bridge)
        .address(vec![2, 0, 0, 0, 0, 9])
        .alias("vipd:x")
        .index(7)
        .build();
    let e = link_entry(&msg);
    assert_eq!(
        e,
        LinkEntry {
            index: 7,
            name: "vip-a".into(),
            macvlan: true,
            alias: Some("vipd:x".into()),
            parent: Some(2),
            mac: [2, 0, 0, 0, 0, 9],
        }
    );
    assert!(e.is_ours());
}

/// `/proc/sys` read-only (a container without privileges): settings that already hold the
/// needed values (inherited from the host's `conf/default`) are fine; one that does not
/// fails with the path, the values and what to do.
#[tokio::test]
async fn ensure_on_a_read_only_proc_sys_checks_the_values_instead() {
    let k = FakeKernel::with(vec![entry(2, "eth0", false, None)]);
    let good: std::collections::HashMap<&'static str, u8> = [
        ("rp_filter", 0),
        ("arp_ignore", 1),
        ("arp_announce", 2),
        ("accept_ra", 0),
        ("autoconf", 0),
    ]
    .into();
    *k.read_only.lock().unwrap() = Some(good.clone());
    let m = Macvlans::new(k);
    let index = m.ensure(&spec("vip-a")).await.unwrap();
    assert_eq!(
        m.kernel().calls().last(),
        Some(&format!("up vip-a {index}"))
    );

    let k = FakeKernel::with(vec![entry(2, "eth0", false, None)]);
    let mut strict = good;
    strict.insert("rp_filter", 1);
    *k.read_only.lock().unwrap() = Some(strict);
    let m = Macvlans::new(k);
    let e = m.ensure(&spec("vip-a")).await.unwrap_err().to_string();
    assert!(
        e.contains("/proc/sys/net/ipv4/conf/vip-a/rp_filter")
            && e.contains("holds 1, not 0")
            && e.contains("privileged")
            && e.contains("net.ipv4.conf.default.rp_filter=0"),
        "{e}"
    );
}

/// A DHCPv6 macvlan gets `accept_dad=0` before it goes up, so its link-local address is
/// usable at once; a DHCPv4-only one does not (a read-only `/proc/sys` would refuse it).
#[tokio::test]
async fn ipv6_now_disables_dad_before_up() {
    let m = Macvlans::new(FakeKernel::with(vec![entry(2, "eth0", false, None)]));
    let mut s = spec("vip-a");
    s.ipv6_now = true;
    let index = m.ensure(&s).await.unwrap();
    let calls = m.kernel().calls();
    let n = calls.len();
    assert_eq!(
        calls[n - 2..],
        [
            "sysctl ipv6 vip-a accept_dad=0".to_string(),
            format!("up vip-a {index}")
        ]
    );
    let m = Macvlans::new(FakeKernel::with(vec![entry(2, "eth0", false, None)]));
    m.ensure(&spec("vip-a")).await.unwrap();
    assert!(!m.kernel().calls().iter().any(|c| c.contains("accept_dad")));
}

/// Two users of one macvlan (a dual-stack Service's DHCPv4 and DHCPv6 clients): created
/// once, deleted only when the last one releases it.
#[tokio::test]
async fn shared_macvlan_is_removed_by_its_last_user() {
    let m = Macvlans::new(FakeKernel::with(vec![entry(2, "eth0", false, None)]));
    let s = spec("vip-a");
    m.acquire(&s, "v4").await.unwrap();
    m.acquire(&s, "v6").await.unwrap();
    // The same user again (a client setting up after a socket error) counts once.
    m.acquire(&s, "v4").await.unwrap();
    let creates = |m: &Macvlans<FakeKernel>| {
        m.kernel()
            .calls()
            .iter()
            .filter(|c| c.starts_with("create"))
            .count()
    };
    assert_eq!(creates(&m), 1);
    assert!(!m.release("vip-a", "v4").await.unwrap());
    assert!(!m.kernel().calls().iter().any(|c| c.starts_with("delete")));
    assert!(m.release("vip-a", "v6").await.unwrap());
    assert!(
        m.kernel()
            .calls()
            .iter()
            .any(|c| c.starts_with("delete vip-a"))
    );
}

/// RFC 4291 appendix A: the modified EUI-64 of a MAC, universal/local bit flipped; the
/// address the kernel itself would have generated.
#[test]
fn eui64_link_local_is_the_kernels_address() {
    assert_eq!(
        eui64_link_local([0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc]),
        "fe80::ff:feaa:bbcc".parse::<std::net::Ipv6Addr>().unwrap()
    );
    assert_eq!(
        eui64_link_local([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
        "fe80::5054:ff:fe12:3456"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
    );
}

/// The link-local of a DHCPv6 macvlan is added with a finite lifetime and refreshed; once
/// it has expired, a refresh does not bring it back.
#[tokio::test]
async fn link_local_is_refreshed_but_never_revived() {
    let m = Macvlans::new(FakeKernel::with(vec![entry(2, "eth0", false, None)]));
    let mut s = spec("vip-a");
    s.ipv6_now = true;
    let index = m.ensure(&s).await.unwrap();
    let ll = m.add_link_local(index, "vip-a", s.mac).await.unwrap();
    assert_eq!(ll, eui64_link_local(s.mac));
    assert!(m.refresh_link_local(index, "vip-a", s.mac).await.unwrap());
    m.kernel().expire_link_local(index);
    assert!(!m.refresh_link_local(index, "vip-a", s.mac).await.unwrap());
    let calls = m.kernel().calls();
    assert_eq!(
        calls[calls.len() - 3..],
        [
            format!("link-local add vip-a {ll} {LINK_LOCAL_LIFETIME_SECS}s"),
            format!("link-local refresh vip-a {ll} {LINK_LOCAL_LIFETIME_SECS}s"),
            format!("link-local vip-a {ll} absent"),
        ]
    );
}

/// Trial finding (safety): a `kube-vip.io/hwaddr` naming another host's MAC (the gateway's,
/// a node's eth0) made the macvlan take that host's traffic. The MAC of any local interface
/// but this macvlan, or of a neighbour under an address that is not the Service's own, is
/// refused before anything is created; the Service's own address (the previous holder's
/// macvlan in the ARP cache) is not another host.
#[tokio::test]
async fn a_mac_of_another_interface_or_host_is_refused() {
    let mac = [0x02, 0, 0, 0, 0, 9];
    let mut eth1 = entry(3, "eth1", false, None);
    eth1.mac = mac;
    let m = Macvlans::new(FakeKernel::with(vec![entry(2, "eth0", false, None), eth1]));
    let e = m.ensure(&spec("vip-a")).await.unwrap_err().to_string();
    assert!(
        e.contains("02:00:00:00:00:09")
            && e.contains("interface eth1")
            && e.contains("kube-vip.io/hwaddr"),
        "{e}"
    );
    assert!(!m.kernel().calls().iter().any(|c| c.starts_with("create")));

    let k = FakeKernel::with(vec![entry(2, "eth0", false, None)]);
    *k.neighbours.lock().unwrap() = vec![Neighbour {
        ip: "192.0.2.1".parse().unwrap(),
        mac,
    }];
    let m = Macvlans::new(k);
    let e = m.ensure(&spec("vip-a")).await.unwrap_err().to_string();
    assert!(e.contains("192.0.2.1 in eth0's neighbour table"), "{e}");

    // The Service's own address with its MAC: the previous holder, fine; and our own
    // macvlan of that name is reused, not refused.
    let k = FakeKernel::with(vec![entry(2, "eth0", false, None)]);
    *k.neighbours.lock().unwrap() = vec![Neighbour {
        ip: "192.0.2.210".parse().unwrap(),
        mac,
    }];
    let m = Macvlans::new(k);
    m.ensure(&spec("vip-a")).await.unwrap();
    m.ensure(&spec("vip-a")).await.unwrap();
}

/// Trial finding F1: a given MAC (`kube-vip.io/hwaddr`, not derived) of a host this node
/// never talked to is in no table: the segment is asked before the macvlan is created, and
/// a host answering from it refuses the MAC. A derived MAC is not asked about, nor is the
/// MAC of a macvlan already ours (reused).
/// Trial finding: `kube-vip.io/serviceInterface: lo` gave a raw netlink EINVAL; a parent
/// without an Ethernet address is refused by name before anything is created.
#[tokio::test]
async fn a_parent_without_an_ethernet_address_is_refused_by_name() {
    let mut lo = entry(1, "lo", false, None);
    lo.mac = [0; 6];
    let m = Macvlans::new(FakeKernel::with(vec![lo, entry(2, "eth0", false, None)]));
    let e = m
        .ensure(&MacvlanSpec {
            parent: "lo".into(),
            ..spec("vip-a")
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("parent interface lo has no Ethernet address")
            && e.contains("kube-vip.io/serviceInterface"),
        "{e}"
    );
    assert!(!m.kernel().calls().iter().any(|c| c.starts_with("create")));
}

#[tokio::test]
async fn a_given_mac_a_host_answers_from_is_refused() {
    let mac = [0x02, 0, 0, 0, 0, 9];
    let asked = |m: &Macvlans<FakeKernel>| {
        m.kernel()
            .calls()
            .iter()
            .filter(|c| c.starts_with("ask eth0 who uses 02:00:00:00:00:09"))
            .count()
    };
    let given = MacvlanSpec {
        probe_mac: true,
        ..spec("vip-a")
    };
    let k = FakeKernel::with(vec![entry(2, "eth0", false, None)]);
    k.answering.lock().unwrap().push(mac);
    let m = Macvlans::new(k);
    let e = m.ensure(&given).await.unwrap_err().to_string();
    assert!(
        e.contains("02:00:00:00:00:09") && e.contains("a host on eth0 that answers from it"),
        "{e}"
    );
    assert!(!m.kernel().calls().iter().any(|c| c.starts_with("create")));
    // Derived: not asked, created.
    m.ensure(&spec("vip-a")).await.unwrap();
    assert_eq!(asked(&m), 1);
    // Ours already: reused without asking.
    m.ensure(&given).await.unwrap();
    assert_eq!(asked(&m), 1);
    // Nobody answers: asked once, created.
    let m = Macvlans::new(FakeKernel::with(vec![entry(2, "eth0", false, None)]));
    m.ensure(&given).await.unwrap();
    assert_eq!(asked(&m), 1);
    assert!(
        m.kernel()
            .calls()
            .iter()
            .any(|c| c.starts_with("create vip-a"))
    );
}
