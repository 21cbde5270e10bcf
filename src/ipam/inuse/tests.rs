//! The in-use set: every source of an address, and the sharing rule.

use std::collections::BTreeMap;

use super::*;
use crate::ipam::pool::PoolBook;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn tcp(port: u16) -> PortUse {
    PortUse {
        protocol: Protocol::Tcp,
        port,
    }
}

fn udp(port: u16) -> PortUse {
    PortUse {
        protocol: Protocol::Udp,
        port,
    }
}

fn svc(ns: &str, name: &str) -> ServiceView {
    ServiceView {
        key: ObjectKey::new(ns, name),
        ports: vec![tcp(80)],
        ..ServiceView::default()
    }
}

fn shared_svc(name: &str, ports: Vec<PortUse>, share_ok: bool) -> User {
    User::Service {
        key: ObjectKey::new("default", name),
        ports,
        share_ok,
    }
}

#[test]
fn annotations_are_read_leniently() {
    let table: &[(&str, &[&str])] = &[
        ("10.0.0.1", &["10.0.0.1"]),
        ("10.0.0.1,fd00::1", &["10.0.0.1", "fd00::1"]),
        (" 10.0.0.1 , 10.0.0.2 ", &["10.0.0.1", "10.0.0.2"]),
        ("host.example,10.0.0.3", &["10.0.0.3"]),
        ("10.0.0.1,10.0.0.1", &["10.0.0.1"]),
        ("0.0.0.0", &[]),
        ("::", &[]),
        ("0.0.0.0,10.0.0.4", &["10.0.0.4"]),
        ("::ffff:10.0.0.5", &["10.0.0.5"]),
        ("", &[]),
        (" , ,", &[]),
        ("10.0.0.256,10.0.0.0/24,10.0.0.6", &["10.0.0.6"]),
    ];
    for (list, want) in table {
        let got: Vec<String> = lenient_ips(list).iter().map(|a| a.to_string()).collect();
        assert_eq!(got, *want, "{list:?}");
    }
}

#[test]
fn which_services_need_an_address() {
    let base = || ServiceView {
        is_load_balancer: true,
        ours: true,
        ..svc("default", "web")
    };
    let some = |s: &str| Some(s.to_string());
    let table: Vec<(&str, ServiceView, bool)> = vec![
        ("new LoadBalancer", base(), true),
        (
            "blank annotation and spec",
            ServiceView {
                annotation: some(" "),
                spec_ip: some(""),
                ..base()
            },
            true,
        ),
        (
            "annotation",
            ServiceView {
                annotation: some("10.0.0.1"),
                ..base()
            },
            false,
        ),
        (
            "DHCP annotation",
            ServiceView {
                annotation: some("0.0.0.0"),
                ..base()
            },
            false,
        ),
        (
            "hostname annotation",
            ServiceView {
                annotation: some("lb.example"),
                ..base()
            },
            false,
        ),
        (
            "spec.loadBalancerIP",
            ServiceView {
                spec_ip: some("10.0.0.1"),
                ..base()
            },
            false,
        ),
        (
            "deleting",
            ServiceView {
                deleting: true,
                ..base()
            },
            false,
        ),
        (
            "not ours",
            ServiceView {
                ours: false,
                ..base()
            },
            false,
        ),
        (
            "ClusterIP",
            ServiceView {
                is_load_balancer: false,
                ..base()
            },
            false,
        ),
        // Status alone does not count: KVCP looks at the annotation and spec only.
        (
            "status only",
            ServiceView {
                status_ips: vec![ip("10.0.0.9")],
                ..base()
            },
            true,
        ),
    ];
    for (name, view, want) in table {
        assert_eq!(view.needs_address(), want, "{name}");
    }
}

/// Every source counts, whatever the Service's type, class, label or state.
#[test]
fn every_shown_address_is_in_use() {
    let some = |s: &str| Some(s.to_string());
    let services = [
        // Hand-set spec.loadBalancerIP, no label (KVCP's gap).
        ServiceView {
            spec_ip: some("10.0.0.1"),
            is_load_balancer: true,
            ..svc("a", "pinned")
        },
        // A ClusterIP Service's leftover annotation.
        ServiceView {
            annotation: some("10.0.0.2, junk"),
            ..svc("b", "was-lb")
        },
        // Status ingress (another controller's Service, e.g. ServiceLB).
        ServiceView {
            status_ips: vec![ip("10.0.0.3")],
            is_load_balancer: true,
            ..svc("c", "traefik")
        },
        // kube-vip's DHCP lease.
        ServiceView {
            annotation: some("0.0.0.0"),
            requested_ips: vec![ip("10.0.0.4")],
            ..svc("d", "dhcp")
        },
        // Being deleted still holds its address.
        ServiceView {
            annotation: some("10.0.0.5"),
            deleting: true,
            ..svc("e", "going")
        },
        // The same address twice in one Service: one user.
        ServiceView {
            annotation: some("10.0.0.6"),
            spec_ip: some("10.0.0.6"),
            status_ips: vec![ip("10.0.0.6")],
            ..svc("f", "twice")
        },
    ];
    let nodes = [
        ("n1".to_string(), ip("10.0.0.7")),
        ("n2".to_string(), ip("fd00::7")),
    ];
    let in_use = InUse::build(&services, &nodes, &[ip("10.0.0.8")], |ns| ns == "a");
    for (addr, who) in [
        ("10.0.0.1", "Service a/pinned"),
        ("10.0.0.2", "Service b/was-lb"),
        ("10.0.0.3", "Service c/traefik"),
        ("10.0.0.4", "Service d/dhcp"),
        ("10.0.0.5", "Service e/going"),
        ("10.0.0.6", "Service f/twice"),
        ("10.0.0.7", "Node n1"),
        ("fd00::7", "Node n2"),
        ("10.0.0.8", "the control-plane VIP"),
    ] {
        let users = in_use.users(ip(addr));
        assert_eq!(users.len(), 1, "{addr}: {users:?}");
        assert_eq!(users[0].to_string(), who);
        assert!(in_use.is_used(ip(addr)));
    }
    assert!(!in_use.is_used(ip("0.0.0.0")));
    assert!(!in_use.is_used(ip("10.0.0.9")));
    assert!(
        in_use.is_used(ip("::ffff:10.0.0.1")),
        "mapped form is the IPv4 address"
    );
    assert_eq!(
        in_use.users(ip("10.0.0.1")),
        [User::Service {
            key: ObjectKey::new("a", "pinned"),
            ports: vec![tcp(80)],
            share_ok: true
        }]
    );
    let data: BTreeMap<String, String> =
        [("cidr-global".to_string(), "10.0.0.0/29".to_string())].into();
    let book = PoolBook::from_data(&data);
    let pool = book.pool_for("x").unwrap().unwrap();
    // .1-.7 are the /29's usable addresses, all taken (.8, the control-plane VIP, is outside).
    assert_eq!(pool.size(Family::V4), 7);
    assert_eq!(in_use.used_in(pool), 7);
    let addrs: Vec<IpAddr> = in_use.iter().map(|(a, _)| a).collect();
    assert_eq!(addrs.len(), 9);
    assert!(addrs.windows(2).all(|w| w[0] < w[1]), "address order");
}

#[test]
fn add_records_each_user_once() {
    let mut in_use = InUse::default();
    let user = shared_svc("a", vec![tcp(80)], false);
    in_use.add(ip("10.0.0.1"), user.clone());
    in_use.add(ip("10.0.0.1"), user.clone());
    in_use.add(ip("::ffff:10.0.0.1"), User::ControlPlane);
    in_use.add(ip("0.0.0.0"), user.clone());
    in_use.add(ip("::"), user);
    assert_eq!(in_use.users(ip("10.0.0.1")).len(), 2);
    assert_eq!(in_use.iter().count(), 1);
}

#[test]
fn port_clashes_are_protocol_aware() {
    let table: &[(&[PortUse], &[PortUse], bool)] = &[
        (&[tcp(53)], &[udp(53)], false),
        (&[tcp(80)], &[tcp(80)], true),
        (&[tcp(80), udp(53)], &[tcp(443), udp(53)], true),
        (&[tcp(80)], &[tcp(443)], false),
        (&[], &[tcp(443)], true),
        (&[tcp(443)], &[], true),
        (&[], &[], true),
        (
            &[PortUse {
                protocol: Protocol::Sctp,
                port: 80,
            }],
            &[tcp(80)],
            false,
        ),
    ];
    for (a, b, want) in table {
        assert_eq!(ports_clash(a, b), *want, "{a:?} {b:?}");
        assert_eq!(ports_clash(b, a), *want, "symmetric");
    }
}

#[test]
fn who_may_share() {
    let table: Vec<(&str, Vec<User>, Vec<PortUse>, bool)> = vec![
        (
            "TCP/53 with UDP/53",
            vec![shared_svc("a", vec![udp(53)], true)],
            vec![tcp(53)],
            true,
        ),
        (
            "two TCP/80",
            vec![shared_svc("a", vec![tcp(80)], true)],
            vec![tcp(80)],
            false,
        ),
        (
            "other namespace refuses",
            vec![shared_svc("a", vec![udp(53)], false)],
            vec![tcp(53)],
            false,
        ),
        (
            "they have no ports",
            vec![shared_svc("a", vec![], true)],
            vec![tcp(53)],
            false,
        ),
        (
            "I have no ports",
            vec![shared_svc("a", vec![udp(53)], true)],
            vec![],
            false,
        ),
        (
            "two users, one clash",
            vec![
                shared_svc("a", vec![udp(53)], true),
                shared_svc("b", vec![tcp(53)], true),
            ],
            vec![tcp(53)],
            false,
        ),
        (
            "two users, no clash",
            vec![
                shared_svc("a", vec![udp(53)], true),
                shared_svc("b", vec![tcp(80)], true),
            ],
            vec![tcp(53)],
            true,
        ),
        (
            "a node",
            vec![User::Node("n1".into())],
            vec![tcp(53)],
            false,
        ),
        (
            "the control plane",
            vec![User::ControlPlane],
            vec![tcp(53)],
            false,
        ),
        ("nobody", vec![], vec![tcp(53)], false),
    ];
    for (name, users, ports, want) in table {
        assert_eq!(may_share(&users, &ports), want, "{name}");
    }
}

#[test]
fn kubernetes_spellings() {
    assert_eq!(Protocol::from_k8s(None), Some(Protocol::Tcp));
    assert_eq!(Protocol::from_k8s(Some("UDP")), Some(Protocol::Udp));
    assert_eq!(Protocol::from_k8s(Some("SCTP")), Some(Protocol::Sctp));
    assert_eq!(Protocol::from_k8s(Some("udp")), None);
    assert_eq!(FamilyPolicy::from_k8s(None), FamilyPolicy::SingleStack);
    assert_eq!(
        FamilyPolicy::from_k8s(Some("SingleStack")),
        FamilyPolicy::SingleStack
    );
    assert_eq!(
        FamilyPolicy::from_k8s(Some("PreferDualStack")),
        FamilyPolicy::PreferDualStack
    );
    assert_eq!(
        FamilyPolicy::from_k8s(Some("RequireDualStack")),
        FamilyPolicy::RequireDualStack
    );
}

#[test]
fn requested_and_shown_addresses() {
    let view = ServiceView {
        annotation: Some("10.0.0.1,fd00::1".into()),
        spec_ip: Some("10.0.0.2".into()),
        status_ips: vec![ip("10.0.0.3"), ip("10.0.0.1")],
        requested_ips: vec![ip("10.0.0.4"), ip("0.0.0.0")],
        ..svc("a", "b")
    };
    let s = |v: Vec<IpAddr>| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    assert_eq!(s(view.requested()), ["10.0.0.1", "fd00::1", "10.0.0.2"]);
    assert_eq!(
        s(view.shown()),
        ["10.0.0.1", "fd00::1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    );
}
