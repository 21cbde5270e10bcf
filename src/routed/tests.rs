use super::*;

fn settings(peers: &str) -> Settings {
    Settings {
        router_id: Some(Ipv4Addr::new(198, 51, 100, 11)),
        router_interface: None,
        local_as: DEFAULT_LOCAL_AS,
        peers: parse_peers(peers).unwrap(),
        source_ip: None,
        source_if: None,
        hold_time: DEFAULT_HOLD_TIME,
        keepalive: DEFAULT_KEEPALIVE,
        mpbgp: Mpbgp::default(),
        table: DEFAULT_TABLE,
        protocol: DEFAULT_PROTOCOL,
    }
}

#[test]
fn peers_parse_as_kube_vip_with_ipv6_in_brackets() {
    let p = parse_peers(
        "198.51.100.1:65001:secret:true,[2001:db8:1::1]:65002::false:1179,unnumbered:eth1",
    )
    .unwrap();
    assert_eq!(p.len(), 3);
    assert_eq!(
        p[0].address,
        PeerAddress::Ip("198.51.100.1".parse().unwrap())
    );
    assert_eq!(p[0].asn, Some(65001));
    assert_eq!(p[0].password.as_deref(), Some("secret"));
    assert!(p[0].multihop);
    assert_eq!(p[0].port, BGP_PORT);
    assert_eq!(p[0].bfd, DEFAULT_BFD);
    assert_eq!(
        p[1].address,
        PeerAddress::Ip("2001:db8:1::1".parse().unwrap())
    );
    assert_eq!(
        (p[1].asn, p[1].multihop, p[1].port),
        (Some(65002), false, 1179)
    );
    assert_eq!(p[2].address, PeerAddress::Unnumbered("eth1".into()));
    assert_eq!(p[2].asn, None);
}

#[test]
fn peer_mpbgp_and_bfd_fields() {
    let p = parse_peers(
        "198.51.100.1:65001::::mpbgp_nexthop=fixed;mpbgp_ipv4=198.51.100.11:true;100;;5",
    )
    .unwrap();
    assert_eq!(p[0].mpbgp.nexthop, Some(MpbgpNexthop::Fixed));
    assert_eq!(p[0].mpbgp.ipv4, Some("198.51.100.11".parse().unwrap()));
    // As in kube-vip, the fields are split at ':', so a peer's own mpbgp_ipv6 cannot be
    // given (the global mpbgp_ipv6 can).
    assert!(parse_peers("198.51.100.1:65001::::mpbgp_ipv6=2001:db8::1").is_err());
    assert_eq!(
        p[0].bfd,
        Bfd {
            enabled: true,
            receive_ms: 100,
            transmit_ms: 300,
            multiplier: 5
        }
    );
    let off = parse_peers("198.51.100.1:65001::::: false;;;").unwrap_err();
    assert!(off.contains("BFD enable"), "{off}");
    let off = parse_peers("198.51.100.1:65001:::::false;;;").unwrap();
    assert!(!off[0].bfd.enabled);
}

#[test]
fn bad_peers_say_which_and_why() {
    for (value, needle) in [
        ("198.51.100.1", "expected <address>:<AS>"),
        ("198.51.100.1:4294967296", "out of range"),
        ("198.51.100.1:0", "reserved"),
        ("198.51.100.1:x", "not an AS number"),
        ("198.51.100.300:65001", "not an IP address"),
        ("2001:db8::1:65001", "brackets"),
        ("[2001:db8::1:65001", "no matching ']'"),
        ("[fe80::1%eth0]:65001", "zone"),
        ("198.51.100.1:65001:a b", "printable ASCII"),
        ("198.51.100.1:65001::maybe", "multihop"),
        ("198.51.100.1:65001:::0", "port"),
        ("198.51.100.1:65001::::mpbgp_nexthop=magic", "next-hop mode"),
        ("198.51.100.1:65001::::x=1", "not supported"),
        ("198.51.100.1:65001:::::true;1", "4 fields"),
        ("198.51.100.1:65001:::::true;0;1;1", "out of range"),
        ("198.51.100.1:65001,198.51.100.1:65002", "listed twice"),
        ("127.0.0.1:65001", "cannot be a BGP peer"),
        ("", "no peer"),
        ("unnumbered:bad/name", "interface name"),
    ] {
        let e = parse_peers(value).unwrap_err();
        assert!(e.contains(needle), "{value:?}: {e:?} lacks {needle:?}");
    }
    let e = parse_peers("198.51.100.1:65001,198.51.100.2:x").unwrap_err();
    assert!(e.starts_with("peer 2 (198.51.100.2:x)"), "{e}");
}

#[test]
fn passwords_are_hidden_in_messages() {
    assert_eq!(
        redact_passwords(
            "198.51.100.1:65001:s3cret:true,[2001:db8::1]:65001:pw,unnumbered:eth0:65001:x"
        ),
        "198.51.100.1:65001:<hidden>,[2001:db8::1]:65001:<hidden>,unnumbered:eth0:65001:<hidden>",
        "what follows a password may be more of it"
    );
    // A password with ':' spills into the next fields: their errors quote nothing.
    for value in [
        "198.51.100.1:65001:p4ss:w0rd",
        "198.51.100.1:65001:p4ss:true:w0rd",
    ] {
        let e = parse_peers(value).unwrap_err();
        assert!(!e.contains("p4ss") && !e.contains("w0rd"), "{value}: {e}");
        assert!(e.contains("bgp_peerpass"), "{e}");
    }
    assert_eq!(redact_passwords("198.51.100.1:65001"), "198.51.100.1:65001");
}

#[test]
fn scalars() {
    assert_eq!(parse_as("4294967295"), Ok(u32::MAX));
    assert!(parse_as("-1").is_err());
    assert_eq!(parse_timer("3", 3), Ok(3));
    assert!(parse_timer("2", 3).is_err());
    assert!(parse_timer("65536", 1).is_err());
    assert_eq!(parse_table("198"), Ok(198));
    assert!(parse_table("254").unwrap_err().contains("main"));
    assert!(parse_table("253").unwrap_err().contains("default"));
    assert!(parse_table("255").unwrap_err().contains("local"));
    assert!(parse_table("0").is_err());
    assert_eq!(parse_protocol("248"), Ok(248));
    assert!(parse_protocol("256").is_err());
    assert!(parse_protocol("12").is_err());
    assert_eq!(
        parse_peer_address("[2001:db8::1]"),
        Ok("2001:db8::1".parse().unwrap())
    );
    assert!(parse_peer_address("::").is_err());
}

#[test]
fn bird_learns_only_vipds_routes_and_exports_them_with_bfd() {
    let mut s = settings("198.51.100.1:65001:pw:true:1179,[2001:db8:1::1]:65001");
    // Multihop with BFD: BIRD binds its BFD to the local address.
    assert!(bird::render(&s).unwrap_err().0.contains("bgp_sourceip"));
    s.source_ip = Some("198.51.100.11".parse().unwrap());
    let c = bird::render(&s).unwrap();
    assert!(c.contains("router id 198.51.100.11;"));
    assert!(c.contains("local 198.51.100.11 as 65000;"));
    assert!(!c.contains("direct;"), "eBGP: no direct");
    assert_eq!(c.matches("kernel table 198;").count(), 2);
    assert_eq!(c.matches("import where krt_source = 248;").count(), 2);
    assert_eq!(c.matches("\tlearn;").count(), 2);
    assert_eq!(c.matches("export none;").count(), 2);
    assert!(c.contains("protocol bfd vipd_bfd"));
    assert!(c.contains("neighbor 198.51.100.1 port 1179 as 65001;"));
    assert!(c.contains("neighbor 2001:db8:1::1 as 65001;"));
    assert!(c.contains("\tmultihop 50;"));
    assert!(c.contains("\tpassword \"pw\";"));
    assert!(c.contains("\thold time 30;\n\tkeepalive time 10;"));
    assert_eq!(
        c.matches("bfd { min rx interval 300 ms; min tx interval 300 ms; multiplier 3; };")
            .count(),
        2
    );
    assert!(c.contains("ipv4 { table vipd4; import none; export all; next hop self; };"));
    assert!(c.contains("ipv6 { table vipd6; import none; export all; next hop self; };"));
    // One family per session without MP-BGP.
    assert_eq!(c.matches("\tipv4 { table").count(), 1);
    assert_eq!(c.matches("\tipv6 { table").count(), 1);
}

#[test]
fn bird_source_address_router_interface_and_mpbgp() {
    let mut s = settings("198.51.100.1:65001,[2001:db8:1::1]:65001");
    s.router_id = None;
    s.router_interface = Some("eth0".into());
    s.source_ip = Some("198.51.100.11".parse().unwrap());
    s.mpbgp = Mpbgp {
        nexthop: Some(MpbgpNexthop::Fixed),
        ipv4: Some("198.51.100.11".parse().unwrap()),
        ipv6: Some("2001:db8:1::11".parse().unwrap()),
    };
    let c = bird::render(&s).unwrap();
    assert!(c.contains("router id from \"eth0\";"));
    assert!(c.contains("local 198.51.100.11 as 65000;"));
    assert!(
        c.contains("local as 65000;"),
        "the IPv6 session has no IPv4 source"
    );
    assert!(c.contains(
        "ipv6 { table vipd6; import none; export all; next hop address 2001:db8:1::11; };"
    ));
    assert!(c.contains(
        "ipv4 { table vipd4; import none; export all; next hop address 198.51.100.11; };"
    ));
    s.mpbgp.ipv6 = None;
    assert!(bird::render(&s).unwrap_err().0.contains("mpbgp_ipv6"));
    s.mpbgp.nexthop = Some(MpbgpNexthop::AutoSourceIf);
    assert!(bird::render(&s).unwrap_err().0.contains("fixed"));
    let u = settings("unnumbered:eth1:65001");
    assert!(bird::render(&u).unwrap_err().0.contains("unnumbered:eth1"));
}

#[test]
fn frr_redistributes_table_198_with_bfd_and_takes_nothing() {
    let s = settings(
        "198.51.100.1:65001:pw:true:::true;100;100;3,[2001:db8:1::1]:65001,unnumbered:eth1",
    );
    let c = frr::render(&s).unwrap();
    for line in [
        "ip import-table 198\n",
        "router bgp 65000\n",
        " bgp router-id 198.51.100.11\n",
        " timers bgp 10 30\n",
        " neighbor 198.51.100.1 remote-as 65001\n",
        " neighbor 198.51.100.1 password pw\n",
        " neighbor 198.51.100.1 ebgp-multihop 50\n",
        " neighbor 198.51.100.1 bfd profile vipd-peer1\n",
        " profile vipd-peer1\n  receive-interval 100\n  transmit-interval 100\n  detect-multiplier 3\n",
        " neighbor eth1 interface remote-as external\n",
        "  redistribute table 198\n",
        "  maximum-paths 64\n",
        "  neighbor 198.51.100.1 route-map vipd-import-none in\n",
        "  neighbor 2001:db8:1::1 activate\n",
        "route-map vipd-import-none deny 10\n",
    ] {
        assert!(c.contains(line), "{line:?} missing:\n{c}");
    }
    let mut big = s.clone();
    big.table = 1000;
    assert!(frr::render(&big).unwrap_err().0.contains("1 to 252"));
}
