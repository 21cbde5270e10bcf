use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default", name)
}

fn pp(port: i32, protocol: &str) -> PortProto {
    PortProto {
        port,
        protocol: protocol.into(),
    }
}

fn held(name: &str, addrs: &[&str], ports: &[(i32, &str)], exempt: bool) -> Held {
    Held {
        key: key(name),
        addresses: addrs.iter().map(|a| ip(a)).collect(),
        ports: ports.iter().map(|(n, p)| pp(*n, p)).collect(),
        exempt,
    }
}

use Element::{Allow, Guard};
use L4::{Sctp, Tcp, Udp};

/// (case, Services held, elements expected, Services with a problem).
#[test]
fn the_ruleset_of_the_services_held() {
    let v4 = ip("192.0.2.10");
    let v4b = ip("192.0.2.11");
    let v6 = ip("2001:db8::10");
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Vec<Held>, Vec<Element>, Vec<&str>)> = vec![
        ("nothing held", vec![], vec![], vec![]),
        (
            "one TCP port",
            vec![held("web", &["192.0.2.10"], &[(80, "TCP")], false)],
            vec![Guard(v4), Allow(v4, Tcp, 80)],
            vec![],
        ),
        (
            "TCP, UDP and SCTP, same number",
            vec![held(
                "dns",
                &["192.0.2.10"],
                &[(53, "TCP"), (53, "UDP"), (53, "SCTP")],
                false,
            )],
            vec![
                Guard(v4),
                Allow(v4, Tcp, 53),
                Allow(v4, Udp, 53),
                Allow(v4, Sctp, 53),
            ],
            vec![],
        ),
        (
            "dual stack: both addresses guarded with the same ports",
            vec![held(
                "web",
                &["192.0.2.10", "2001:db8::10"],
                &[(443, "TCP")],
                false,
            )],
            vec![
                Guard(v4),
                Guard(v6),
                Allow(v4, Tcp, 443),
                Allow(v6, Tcp, 443),
            ],
            vec![],
        ),
        (
            "no ports: kube-vip skips it, nothing guarded",
            vec![held("bare", &["192.0.2.10"], &[], false)],
            vec![],
            vec![],
        ),
        (
            "ignore annotation: nothing guarded",
            vec![held("open", &["192.0.2.10"], &[(80, "TCP")], true)],
            vec![],
            vec![],
        ),
        (
            "shared address: the union of the ports",
            vec![
                held("a", &["192.0.2.10"], &[(80, "TCP")], false),
                held("b", &["192.0.2.10"], &[(53, "UDP")], false),
            ],
            vec![Guard(v4), Allow(v4, Tcp, 80), Allow(v4, Udp, 53)],
            vec![],
        ),
        (
            "shared address with an exempt Service: open; the other address stays guarded",
            vec![
                held("a", &["192.0.2.10", "192.0.2.11"], &[(80, "TCP")], false),
                held("b", &["192.0.2.10"], &[(53, "UDP")], true),
            ],
            vec![Guard(v4b), Allow(v4b, Tcp, 80)],
            vec![],
        ),
        (
            "a DHCP request (0.0.0.0) is no address",
            vec![held("dhcp", &["0.0.0.0", "::"], &[(80, "TCP")], false)],
            vec![],
            vec![],
        ),
        (
            "bad protocol: that port only, the Service still guarded, a problem for it alone",
            vec![
                held("bad", &["192.0.2.10"], &[(80, "TCP"), (80, "tcp")], false),
                held("good", &["192.0.2.11"], &[(22, "TCP")], false),
            ],
            vec![
                Guard(v4),
                Allow(v4, Tcp, 80),
                Guard(v4b),
                Allow(v4b, Tcp, 22),
            ],
            vec!["bad"],
        ),
        (
            "ports outside 1-65535",
            vec![held(
                "bad",
                &["192.0.2.10"],
                &[(0, "TCP"), (65536, "UDP"), (-1, "SCTP"), (65535, "UDP")],
                false,
            )],
            vec![Guard(v4), Allow(v4, Udp, 65535)],
            vec!["bad", "bad", "bad"],
        ),
    ];
    for (case, held, want, problems) in cases {
        let r = ruleset(&held);
        let want: BTreeSet<Element> = want.into_iter().collect();
        assert_eq!(r.elements, want, "{case}");
        let got: Vec<&str> = r.problems.iter().map(|p| p.key.name.as_str()).collect();
        assert_eq!(got, problems, "{case}");
    }
}

#[test]
fn a_problem_names_the_port_and_what_happens_to_it() {
    let r = ruleset(&[held("bad", &["192.0.2.10"], &[(80, "ICMP")], false)]);
    let m = &r.problems[0].message;
    assert!(
        m.contains("80/ICMP") && m.contains("not TCP, UDP or SCTP"),
        "{m}"
    );
    assert!(m.contains("dropped"), "{m}");
    // With no allowable port the address is still guarded: only UDP 68 (in the table's
    // rules) passes.
    assert_eq!(
        r.elements,
        [Guard(ip("192.0.2.10"))]
            .into_iter()
            .collect::<BTreeSet<_>>()
    );
}

#[test]
fn only_exactly_true_exempts() {
    let ann = |v: &str| {
        let mut m = BTreeMap::new();
        m.insert(ANN_IGNORE_SERVICE_SECURITY.to_string(), v.to_string());
        m
    };
    assert!(exempt(Some(&ann("true"))));
    for v in ["True", "yes", "1", ""] {
        assert!(!exempt(Some(&ann(v))), "{v:?}");
    }
    assert!(!exempt(None));
    assert!(!exempt(Some(&BTreeMap::new())));
}

/// The DHCP client port is in the table's rules, not per Service: any guarded address
/// passes UDP 68 (kube-vip `insertCommonNFTablesRules`).
#[test]
fn dhcp_client_port_is_open_on_every_guarded_address() {
    use crate::net::nft::svcsec::{DHCP_CLIENT_PORT, setup_commands};
    assert_eq!(DHCP_CLIENT_PORT, 68);
    let c = setup_commands().lines();
    for fam in ["ip daddr @guard4", "ip6 daddr @guard6"] {
        let accept = c
            .iter()
            .position(|l| l.ends_with(&format!("{fam} udp dport 68 accept")))
            .expect("DHCP accept");
        let drop = c
            .iter()
            .position(|l| l.ends_with(&format!("{fam} counter drop")))
            .expect("drop");
        assert!(accept < drop, "{fam}");
    }
}
