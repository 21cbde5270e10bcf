//! Decisions, pass by pass: KVCP's reference cases (`pkg/provider/loadBalancer_test.go`
//! `Test_discoverVIPs` at d3522c6), the k3s how-to, and vipd's differences.

use std::collections::BTreeMap;

use super::*;
use crate::ipam::inuse::{self, PortUse, Protocol};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|a| ip(a)).collect()
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

fn book(pairs: &[(&str, &str)]) -> PoolBook {
    let data: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    PoolBook::from_data(&data)
}

/// A new LoadBalancer Service vipd serves, TCP/80, created at `created`.
fn lb(ns: &str, name: &str, created: i64) -> ServiceView {
    ServiceView {
        key: ObjectKey::new(ns, name),
        uid: format!("uid-{ns}-{name}"),
        created: Some(created),
        is_load_balancer: true,
        ours: true,
        ports: vec![tcp(80)],
        ..ServiceView::default()
    }
}

/// A Service showing `addrs` in its annotation (labelled, as KVCP or vipd left it).
fn holding(ns: &str, name: &str, addrs: &str, ports: Vec<PortUse>) -> ServiceView {
    ServiceView {
        annotation: Some(addrs.to_string()),
        labelled: true,
        ports,
        ..lb(ns, name, 0)
    }
}

/// One pass over `services` with `nodes`, control-plane VIPs and refused addresses.
fn pass(
    pairs: &[(&str, &str)],
    services: &[ServiceView],
    nodes: &[(&str, &str)],
    cp: &[&str],
    refused: &[&str],
) -> Vec<(String, Decision)> {
    let b = book(pairs);
    let nodes: Vec<(String, IpAddr)> = nodes.iter().map(|(n, a)| (n.to_string(), ip(a))).collect();
    let in_use = InUse::build(services, &nodes, &ips(cp), |ns| b.allow_share(ns));
    let refused = ips(refused);
    plan(services, &b, &in_use, &|a| refused.contains(&a))
        .into_iter()
        .map(|(k, d)| (k.to_string(), d))
        .collect()
}

fn run(pairs: &[(&str, &str)], services: &[ServiceView]) -> Vec<(String, Decision)> {
    pass(pairs, services, &[], &[], &[])
}

fn alloc(addrs: &[&str], pool: &str) -> Decision {
    Decision::Allocate {
        addrs: ips(addrs),
        pool: pool.to_string(),
        shared: false,
        interface: None,
    }
}

fn exhausted(pool: &str, family: Family) -> Decision {
    Decision::Exhausted {
        pool: pool.to_string(),
        family,
    }
}

/// The decision for the only Service named `name`.
fn of<'a>(decisions: &'a [(String, Decision)], key: &str) -> &'a Decision {
    &decisions.iter().find(|(k, _)| k == key).unwrap().1
}

/// The k3s how-to: `cidr-global=172.20.6.65/32` and two Services; the second waits until
/// the first is deleted.
#[test]
fn how_to_pool_serves_one_service_then_is_exhausted() {
    let data = [("cidr-global", "172.20.6.65/32")];
    let first = lb("default", "first", 1);
    let second = lb("default", "second", 2);
    let got = run(&data, &[second.clone(), first.clone()]);
    assert_eq!(
        got,
        [
            (
                "default/first".into(),
                alloc(&["172.20.6.65"], "cidr-global")
            ),
            (
                "default/second".into(),
                exhausted("cidr-global", Family::V4)
            ),
        ]
    );
    let written = ServiceView {
        labelled: true,
        annotation: Some("172.20.6.65".into()),
        spec_ip: Some("172.20.6.65".into()),
        ..first
    };
    let got = run(&data, &[written, second.clone()]);
    assert_eq!(of(&got, "default/first"), &Decision::Keep);
    assert_eq!(
        of(&got, "default/second"),
        &exhausted("cidr-global", Family::V4)
    );
    let got = run(&data, &[second]);
    assert_eq!(
        of(&got, "default/second"),
        &alloc(&["172.20.6.65"], "cidr-global")
    );
}

/// What a row of the dual-stack table expects.
#[derive(Debug)]
enum Want {
    Addrs(&'static str),
    Exhausted(Family),
    Missing(Family),
    Invalid,
}

/// KVCP `Test_discoverVIPs` (addresses in use given as Node addresses, so no sharing).
#[test]
fn kvcp_discover_vips() {
    use Family::{V4, V6};
    use FamilyPolicy::{
        PreferDualStack as Prefer, RequireDualStack as Require, SingleStack as Single,
    };
    use Want::*;
    const V4P: &str = "10.10.10.8-10.10.10.15";
    const V6P: &str = "fd00::1-fd00::10";
    const DUAL: &str = "10.10.10.8-10.10.10.15,fd00::1-fd00::10";
    const SMALL: &str = "10.10.10.8-10.10.10.9,fd00::1-fd00::2";
    const V4_USED: &[&str] = &["10.10.10.8", "10.10.10.9", "10.10.10.10", "10.10.10.12"];
    const V6_USED: &[&str] = &["fd00::1", "fd00::2", "fd00::4"];
    const SMALL_V4: &[&str] = &["10.10.10.8", "10.10.10.9"];
    const SMALL_V6: &[&str] = &["fd00::1", "fd00::2"];
    const SMALL_ALL: &[&str] = &["10.10.10.8", "10.10.10.9", "fd00::1", "fd00::2"];
    #[allow(clippy::type_complexity)]
    let table: &[(&str, FamilyPolicy, &[Family], &str, &[&str], Want)] = &[
        ("IPv4 pool", Single, &[], V4P, V4_USED, Addrs("10.10.10.11")),
        (
            "IPv4 pool, IPv4 service",
            Single,
            &[V4],
            V4P,
            V4_USED,
            Addrs("10.10.10.11"),
        ),
        ("IPv6 pool", Single, &[], V6P, V6_USED, Addrs("fd00::3")),
        (
            "IPv6 pool, IPv6 service",
            Single,
            &[V6],
            V6P,
            V6_USED,
            Addrs("fd00::3"),
        ),
        (
            "IPv6 pool, IPv4 service",
            Single,
            &[V4],
            V6P,
            &[],
            Missing(V4),
        ),
        (
            "IPv4 pool, IPv6 service",
            Single,
            &[V6],
            V4P,
            &[],
            Missing(V6),
        ),
        (
            "IPv4 pool, Prefer",
            Prefer,
            &[V4, V6],
            V4P,
            V4_USED,
            Addrs("10.10.10.11"),
        ),
        (
            "IPv6 pool, Prefer",
            Prefer,
            &[V4, V6],
            V6P,
            V6_USED,
            Addrs("fd00::3"),
        ),
        (
            "dual pool, Prefer, no families",
            Prefer,
            &[],
            DUAL,
            &[],
            Addrs("10.10.10.8,fd00::1"),
        ),
        (
            "dual pool, Prefer v4,v6",
            Prefer,
            &[V4, V6],
            DUAL,
            &[],
            Addrs("10.10.10.8,fd00::1"),
        ),
        (
            "dual pool, Prefer v6,v4",
            Prefer,
            &[V6, V4],
            DUAL,
            &[],
            Addrs("fd00::1,10.10.10.8"),
        ),
        (
            "Prefer v4,v6, v6 exhausted",
            Prefer,
            &[V4, V6],
            SMALL,
            SMALL_V6,
            Addrs("10.10.10.8"),
        ),
        (
            "Prefer v4,v6, v4 exhausted",
            Prefer,
            &[V4, V6],
            SMALL,
            SMALL_V4,
            Addrs("fd00::1"),
        ),
        (
            "Prefer v6,v4, v6 exhausted",
            Prefer,
            &[V6, V4],
            SMALL,
            SMALL_V6,
            Addrs("10.10.10.8"),
        ),
        (
            "Prefer v6,v4, v4 exhausted",
            Prefer,
            &[V6, V4],
            SMALL,
            SMALL_V4,
            Addrs("fd00::1"),
        ),
        (
            "Prefer, both exhausted",
            Prefer,
            &[V4, V6],
            SMALL,
            SMALL_ALL,
            Exhausted(V4),
        ),
        (
            "Prefer, an invalid pool",
            Prefer,
            &[V4, V6],
            "10.10.10.8-10.10.10.9,invalid-pool",
            &[],
            Invalid,
        ),
        (
            "IPv4 pool, Require",
            Require,
            &[V4, V6],
            V4P,
            &[],
            Missing(V6),
        ),
        (
            "IPv6 pool, Require",
            Require,
            &[V4, V6],
            V6P,
            &[],
            Missing(V4),
        ),
        ("empty pool, Require", Require, &[V4, V6], "", &[], Invalid),
        (
            "dual pool, Require v4,v6",
            Require,
            &[V4, V6],
            DUAL,
            &[],
            Addrs("10.10.10.8,fd00::1"),
        ),
        (
            "dual pool, Require v6,v4",
            Require,
            &[V6, V4],
            DUAL,
            &[],
            Addrs("fd00::1,10.10.10.8"),
        ),
        (
            "Require v4,v6, v6 exhausted",
            Require,
            &[V4, V6],
            SMALL,
            SMALL_V6,
            Exhausted(V6),
        ),
        (
            "Require v4,v6, v4 exhausted",
            Require,
            &[V4, V6],
            SMALL,
            SMALL_V4,
            Exhausted(V4),
        ),
        (
            "Require v6,v4, v4 exhausted",
            Require,
            &[V6, V4],
            SMALL,
            SMALL_V4,
            Exhausted(V4),
        ),
        (
            "Require, both exhausted",
            Require,
            &[V4, V6],
            SMALL,
            SMALL_ALL,
            Exhausted(V4),
        ),
        (
            "Require v6,v4, both exhausted",
            Require,
            &[V6, V4],
            SMALL,
            SMALL_ALL,
            Exhausted(V6),
        ),
        // vipd: KVCP writes an empty annotation here (discoverVIPsDualStack).
        (
            "IPv4 pool, Prefer, exhausted",
            Prefer,
            &[V4, V6],
            "10.10.10.8-10.10.10.9",
            SMALL_V4,
            Exhausted(V4),
        ),
        (
            "dual pool, single, no families",
            Single,
            &[],
            DUAL,
            &[],
            Addrs("10.10.10.8"),
        ),
        (
            "dual pool, single IPv6",
            Single,
            &[V6],
            DUAL,
            &[],
            Addrs("fd00::1"),
        ),
        (
            "dual pool, Require, no families",
            Require,
            &[],
            DUAL,
            &[],
            Addrs("10.10.10.8,fd00::1"),
        ),
    ];
    for (name, policy, families, pool, used, want) in table {
        let svc = ServiceView {
            family_policy: *policy,
            ip_families: families.to_vec(),
            ..lb("ns", "svc", 1)
        };
        let nodes: Vec<(&str, &str)> = used.iter().map(|a| ("node", *a)).collect();
        let got = pass(&[("range-global", pool)], &[svc], &nodes, &[], &[]);
        let got = &got[0].1;
        let pool = "range-global".to_string();
        match want {
            Addrs(list) => {
                let list: Vec<&str> = list.split(',').collect();
                assert_eq!(got, &alloc(&list, &pool), "{name}");
            }
            Exhausted(family) => assert_eq!(got, &exhausted(&pool, *family), "{name}"),
            Missing(family) => assert_eq!(
                got,
                &Decision::FamilyMissing {
                    pool,
                    family: *family
                },
                "{name}"
            ),
            Invalid => assert!(matches!(got, Decision::PoolInvalid(_)), "{name}: {got:?}"),
        }
    }
}

/// `0.0.0.0/32`: every Service gets `0.0.0.0` (dual stack too: KVCP has no DHCP dual stack),
/// nothing is taken, and the interface is still written.
#[test]
fn dhcp_pool_gives_every_service_the_unspecified_address() {
    let data = [("cidr-global", "0.0.0.0/32"), ("interface-global", "eth1")];
    let services = [
        lb("a", "one", 1),
        lb("a", "two", 2),
        ServiceView {
            family_policy: FamilyPolicy::RequireDualStack,
            ip_families: vec![Family::V6, Family::V4],
            ..lb("b", "dual", 3)
        },
    ];
    let want = Decision::Allocate {
        addrs: ips(&["0.0.0.0"]),
        pool: "cidr-global".into(),
        shared: false,
        interface: Some("eth1".into()),
    };
    for (key, decision) in run(&data, &services) {
        assert_eq!(decision, want, "{key}");
    }
}

/// A Service that has an address, or that vipd does not serve, is left as it is: KVCP
/// never re-allocates.
#[test]
fn services_with_an_address_or_not_served_are_kept() {
    let some = |s: &str| Some(s.to_string());
    let base = || lb("default", "web", 1);
    let table: Vec<(&str, ServiceView)> = vec![
        (
            "annotation in the pool",
            ServiceView {
                annotation: some("10.0.0.3"),
                ..base()
            },
        ),
        (
            "annotation outside every pool",
            ServiceView {
                annotation: some("192.0.2.1"),
                ..base()
            },
        ),
        (
            "DHCP annotation",
            ServiceView {
                annotation: some("0.0.0.0"),
                ..base()
            },
        ),
        (
            "spec.loadBalancerIP only",
            ServiceView {
                spec_ip: some("10.0.0.3"),
                ..base()
            },
        ),
        (
            "being deleted",
            ServiceView {
                deleting: true,
                ..base()
            },
        ),
        (
            "another class",
            ServiceView {
                ours: false,
                ..base()
            },
        ),
        (
            "ClusterIP",
            ServiceView {
                is_load_balancer: false,
                ..base()
            },
        ),
        (
            "unparsable annotation",
            ServiceView {
                annotation: some("lb.example"),
                ..base()
            },
        ),
    ];
    for (name, view) in table {
        let got = run(&[("cidr-global", "10.0.0.0/29")], &[view]);
        assert_eq!(got[0].1, Decision::Keep, "{name}");
    }
}

/// Whatever shows `.1`, a new Service gets `.2` (vipd's in-use set; KVCP would hand out
/// `.1` in every row but the labelled-annotation one).
#[test]
fn every_source_of_an_address_keeps_it_taken() {
    let some = |s: &str| Some(s.to_string());
    let other = |ns: &str| ServiceView {
        ports: vec![tcp(443)],
        ..lb(ns, "other", 0)
    };
    #[allow(clippy::type_complexity)]
    let table: &[(&str, Vec<ServiceView>, &[(&str, &str)], &[&str])] = &[
        (
            "hand-set spec.loadBalancerIP, no label",
            vec![ServiceView {
                spec_ip: some("10.0.0.1"),
                ..other("x")
            }],
            &[],
            &[],
        ),
        (
            "ClusterIP with a leftover annotation",
            vec![ServiceView {
                annotation: some("10.0.0.1"),
                is_load_balancer: false,
                labelled: true,
                ..other("x")
            }],
            &[],
            &[],
        ),
        (
            "status ingress of another class",
            vec![ServiceView {
                status_ips: ips(&["10.0.0.1"]),
                ours: false,
                ..other("x")
            }],
            &[],
            &[],
        ),
        (
            "requestedIP of a DHCP Service",
            vec![ServiceView {
                annotation: some("0.0.0.0"),
                requested_ips: ips(&["10.0.0.1"]),
                ..other("x")
            }],
            &[],
            &[],
        ),
        (
            "annotation in another namespace whose pool overlaps",
            vec![ServiceView {
                annotation: some("10.0.0.1"),
                ..other("shop")
            }],
            &[],
            &[],
        ),
        (
            "being deleted",
            vec![ServiceView {
                annotation: some("10.0.0.1"),
                deleting: true,
                ..other("x")
            }],
            &[],
            &[],
        ),
        ("a Node address", vec![], &[("n1", "10.0.0.1")], &[]),
        ("the control-plane VIP", vec![], &[], &["10.0.0.1"]),
    ];
    let data = [("cidr-global", "10.0.0.0/29"), ("cidr-shop", "10.0.0.0/30")];
    for (name, services, nodes, cp) in table {
        let mut services = services.clone();
        services.push(lb("default", "new", 5));
        let got = pass(&data, &services, nodes, cp, &[]);
        assert_eq!(
            of(&got, "default/new"),
            &alloc(&["10.0.0.2"], "cidr-global"),
            "{name}"
        );
    }
}

/// Allocation order: creation time (unknown last), then namespace/name; the input order
/// does not matter, and one pass never hands out an address twice.
#[test]
fn allocation_follows_creation_order() {
    let mut late = lb("a", "late", 0);
    late.created = None;
    let services = vec![
        late,
        lb("b", "third", 30),
        lb("b", "tie", 10),
        lb("a", "tie", 10),
        lb("z", "first", 5),
    ];
    let want = [
        ("z/first", "10.0.0.1"),
        ("a/tie", "10.0.0.2"),
        ("b/tie", "10.0.0.3"),
        ("b/third", "10.0.0.4"),
        ("a/late", "10.0.0.5"),
    ];
    let data = [("cidr-global", "10.0.0.0/29")];
    let mut reversed = services.clone();
    reversed.reverse();
    for input in [services, reversed] {
        let got = run(&data, &input);
        let got: Vec<(&str, Decision)> = got.iter().map(|(k, d)| (k.as_str(), d.clone())).collect();
        let want: Vec<(&str, Decision)> = want
            .iter()
            .map(|(k, a)| (*k, alloc(&[a], "cidr-global")))
            .collect();
        assert_eq!(got, want);
    }
}

/// A deterministic generator (64-bit LCG, Knuth's constants).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// 200 generated Services in five namespaces, with overlapping namespace and global
/// pools, hand-set addresses, leftovers, other controllers' Services, Nodes, the
/// control-plane VIP, refused addresses and sharing: every allocation is inside the
/// Service's pool, never refused, never a Node's or the control plane's, and never an
/// address already shown unless shared by the rules; exhaustion only when every address
/// is taken.
#[test]
fn overlapping_pools_never_hand_out_an_address_twice() {
    let data = [
        ("cidr-global", "10.0.0.0/23"),
        ("cidr-a", "10.0.0.0/24"),
        ("cidr-b", "10.0.0.128/28"),
        ("range-c", "10.0.1.10-10.0.1.40"),
        ("allow-share-a", "true"),
        ("allow-share-d", "true"),
    ];
    let services = generate(200, &mut Lcg(25));
    let nodes = [("n1", "10.0.0.5"), ("n2", "10.0.1.77")];
    let cp = ["10.0.0.9"];
    let refused = ["10.0.0.200", "10.0.1.1", "10.0.0.134"];
    let got = pass(&data, &services, &nodes, &cp, &refused);
    let mut reversed = services.clone();
    reversed.reverse();
    assert_eq!(
        got,
        pass(&data, &reversed, &nodes, &cp, &refused),
        "deterministic"
    );

    let b = book(&data);
    let view = |key: &str| services.iter().find(|s| s.key.to_string() == key).unwrap();
    let mut taken: BTreeMap<IpAddr, Vec<Option<&ServiceView>>> = BTreeMap::new();
    for s in &services {
        for a in s.shown() {
            taken.entry(a).or_default().push(Some(s));
        }
    }
    for a in nodes.iter().map(|n| n.1).chain(cp) {
        taken.entry(ip(a)).or_default().push(None);
    }
    let (mut allocated, mut shared, mut short, mut released) = (0, 0, 0, 0);
    for (key, decision) in &got {
        let svc = view(key);
        let pool = b.pool_for(&svc.key.namespace).unwrap().unwrap();
        match decision {
            Decision::Allocate {
                addrs,
                pool: name,
                shared: was_shared,
                ..
            } => {
                allocated += 1;
                assert_eq!(name, &pool.key.to_string(), "{key}");
                let [addr] = addrs[..] else {
                    panic!("{key}: {addrs:?}")
                };
                assert!(pool.contains(addr) && !refused.contains(&addr.to_string().as_str()));
                let before = taken.entry(addr).or_default();
                if *was_shared {
                    shared += 1;
                    assert!(b.allow_share(&svc.key.namespace), "{key}");
                    for other in before.iter() {
                        let other = other.expect("shared with a Node or the control plane");
                        assert!(
                            b.allow_share(&other.key.namespace),
                            "{key} with {}",
                            other.key
                        );
                        assert!(!inuse::ports_clash(&svc.ports, &other.ports), "{key}");
                    }
                } else {
                    assert!(before.is_empty(), "{key} got {addr}, taken by {before:?}");
                }
                before.push(Some(svc));
            }
            Decision::Exhausted {
                pool: name,
                family: Family::V4,
            } => {
                short += 1;
                assert_eq!(name, &pool.key.to_string());
                let free = pool
                    .addresses(Family::V4, false)
                    .find(|a| !taken.contains_key(a) && !refused.contains(&a.to_string().as_str()));
                assert_eq!(free, None, "{key} exhausted with {free:?} free");
            }
            Decision::Keep => assert!(!svc.needs_address(), "{key}"),
            // A generated leftover (labelled ClusterIP) inside its pool: still taken in this
            // pass (the runtime clears it; the next pass finds it free).
            Decision::Release { addrs } => {
                released += 1;
                assert!(svc.labelled && !svc.served(), "{key}");
                assert!(addrs.iter().all(|a| taken[a].contains(&Some(svc))), "{key}");
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    assert!(
        allocated > 100 && shared > 0 && short > 0 && released > 0,
        "{allocated} {shared} {short} {released}"
    );
}

/// `n` Services: mostly new LoadBalancers, some with hand-set addresses, leftovers and
/// other controllers' Services, random ports and creation times (ties included).
fn generate(n: usize, rng: &mut Lcg) -> Vec<ServiceView> {
    let all_ports = [tcp(80), udp(53), tcp(53), tcp(443)];
    (0..n)
        .map(|i| {
            let ns = ["a", "b", "c", "d", "e"][rng.below(5) as usize];
            let mut s = lb(ns, &format!("s{i}"), rng.below(60) as i64);
            if rng.below(10) == 0 {
                s.created = None;
            }
            s.ports = all_ports
                .iter()
                .copied()
                .filter(|_| rng.below(3) == 0)
                .collect();
            let addr = format!("10.0.{}.{}", rng.below(2), rng.below(256));
            match rng.below(10) {
                0 => s.spec_ip = Some(addr),
                1 => {
                    s.annotation = Some(addr);
                    s.is_load_balancer = false;
                    s.labelled = true;
                }
                2 => {
                    s.ours = false;
                    s.status_ips = ips(&[&addr]);
                }
                _ => {}
            }
            s
        })
        .collect()
}

/// `allow-share`: protocol-aware, deterministic (lowest in allocation order), only among
/// Services of namespaces that allow it, inside the pool, IPv4 only (as KVCP).
#[test]
fn sharing_is_protocol_aware_and_deterministic() {
    let old = |name: &str, addr: &str, ports: Vec<PortUse>| holding("dns", name, addr, ports);
    let v4 = "10.0.0.0/29";
    #[allow(clippy::type_complexity)]
    let table: &[(
        &str,
        &[(&str, &str)],
        Vec<ServiceView>,
        Vec<PortUse>,
        &[&str],
        (&[&str], bool),
    )] = &[
        (
            "TCP/53 joins UDP/53",
            &[],
            vec![old("o", "10.0.0.1", vec![udp(53)])],
            vec![tcp(53)],
            &[],
            (&["10.0.0.1"], true),
        ),
        (
            "two TCP/80",
            &[],
            vec![old("o", "10.0.0.1", vec![tcp(80)])],
            vec![tcp(80)],
            &[],
            (&["10.0.0.2"], false),
        ),
        (
            "theirs without ports",
            &[],
            vec![old("o", "10.0.0.1", vec![])],
            vec![tcp(53)],
            &[],
            (&["10.0.0.2"], false),
        ),
        (
            "mine without ports",
            &[],
            vec![old("o", "10.0.0.1", vec![udp(53)])],
            vec![],
            &[],
            (&["10.0.0.2"], false),
        ),
        (
            "their namespace refuses",
            &[("allow-share-dns", "false")],
            vec![old("o", "10.0.0.1", vec![udp(53)])],
            vec![tcp(53)],
            &[],
            (&["10.0.0.2"], false),
        ),
        (
            "my namespace refuses",
            &[("allow-share-default", "no")],
            vec![old("o", "10.0.0.1", vec![udp(53)])],
            vec![tcp(53)],
            &[],
            (&["10.0.0.2"], false),
        ),
        (
            "outside the pool",
            &[],
            vec![old("o", "10.0.0.9", vec![udp(53)])],
            vec![tcp(53)],
            &[],
            (&["10.0.0.1"], false),
        ),
        (
            "lowest first",
            &[],
            vec![
                old("o", "10.0.0.3", vec![udp(53)]),
                old("p", "10.0.0.1", vec![udp(53)]),
            ],
            vec![tcp(53)],
            &[],
            (&["10.0.0.1"], true),
        ),
        (
            "highest first with search-order=desc",
            &[("search-order", "desc")],
            vec![
                old("o", "10.0.0.3", vec![udp(53)]),
                old("p", "10.0.0.1", vec![udp(53)]),
            ],
            vec![tcp(53)],
            &[],
            (&["10.0.0.3"], true),
        ),
        (
            "a refused shared address is skipped",
            &[],
            vec![old("o", "10.0.0.1", vec![udp(53)])],
            vec![tcp(53)],
            &["10.0.0.1"],
            (&["10.0.0.2"], false),
        ),
        (
            "three on one address",
            &[],
            vec![
                old("o", "10.0.0.1", vec![udp(53)]),
                old("p", "10.0.0.1", vec![tcp(80)]),
            ],
            vec![tcp(53)],
            &[],
            (&["10.0.0.1"], true),
        ),
        (
            "IPv6 is not shared",
            &[("cidr-global", "fd00::/126")],
            vec![old("o", "fd00::", vec![udp(53)])],
            vec![tcp(53)],
            &[],
            (&["fd00::1"], false),
        ),
        (
            "dual stack shares its IPv4 address",
            &[("cidr-global", "10.0.0.0/29,fd00::/126")],
            vec![old("o", "10.0.0.1", vec![udp(53)])],
            vec![tcp(53)],
            &[],
            (&["10.0.0.1", "fd00::"], true),
        ),
    ];
    for (name, extra, olds, ports, refused, (want, want_shared)) in table {
        let mut pairs = vec![("allow-share-global", "true"), ("cidr-global", v4)];
        for &(k, v) in *extra {
            pairs.retain(|p| p.0 != k);
            pairs.push((k, v));
        }
        let mut new = ServiceView {
            ports: ports.clone(),
            ..lb("default", "new", 9)
        };
        if name.starts_with("dual") {
            new.family_policy = FamilyPolicy::PreferDualStack;
        }
        let mut services = olds.clone();
        services.push(new);
        let got = pass(&pairs, &services, &[], &[], refused);
        let want = Decision::Allocate {
            addrs: ips(want),
            pool: "cidr-global".into(),
            shared: *want_shared,
            interface: None,
        };
        assert_eq!(of(&got, "default/new"), &want, "{name}");
    }
}

#[test]
fn a_node_or_the_control_plane_never_shares() {
    let data = [
        ("cidr-global", "10.0.0.0/29"),
        ("allow-share-global", "true"),
    ];
    let old = holding("dns", "o", "10.0.0.1", vec![udp(53)]);
    let new = ServiceView {
        ports: vec![tcp(53)],
        ..lb("default", "new", 9)
    };
    let services = [old, new];
    for (nodes, cp) in [
        (&[("n1", "10.0.0.1")][..], &[][..]),
        (&[][..], &["10.0.0.1"][..]),
    ] {
        let got = pass(&data, &services, nodes, cp, &[]);
        assert_eq!(
            of(&got, "default/new"),
            &alloc(&["10.0.0.2"], "cidr-global")
        );
    }
}

/// Addresses the probe found answered by another host are never handed out.
#[test]
fn refused_addresses_are_skipped() {
    let data = [("cidr-global", "10.0.0.0/29")];
    let services = [lb("default", "a", 1), lb("default", "b", 2)];
    let got = pass(&data, &services, &[], &[], &["10.0.0.1", "10.0.0.3"]);
    assert_eq!(of(&got, "default/a"), &alloc(&["10.0.0.2"], "cidr-global"));
    assert_eq!(of(&got, "default/b"), &alloc(&["10.0.0.4"], "cidr-global"));
    let all: Vec<String> = (1..=7).map(|i| format!("10.0.0.{i}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let got = pass(&data, &services[..1], &[], &[], &all);
    assert_eq!(got[0].1, exhausted("cidr-global", Family::V4));
}

/// Release: labelled, no longer served, not being deleted, and every requested address in
/// the namespace's pool.
#[test]
fn release_gives_pool_addresses_back() {
    let some = |s: &str| Some(s.to_string());
    let gone = |ns: &str, addrs: &str| ServiceView {
        is_load_balancer: false,
        ..holding(ns, "old", addrs, vec![tcp(80)])
    };
    let table: &[(&str, ServiceView, Option<&[&str]>)] = &[
        (
            "turned ClusterIP",
            gone("default", "10.0.0.1"),
            Some(&["10.0.0.1"]),
        ),
        (
            "class no longer ours",
            ServiceView {
                ours: false,
                ..holding("default", "old", "10.0.0.1", vec![])
            },
            Some(&["10.0.0.1"]),
        ),
        (
            "dual stack",
            gone("default", "10.0.0.1,fd00::1"),
            Some(&["10.0.0.1", "fd00::1"]),
        ),
        (
            "spec.loadBalancerIP only",
            ServiceView {
                annotation: None,
                spec_ip: some("10.0.0.2"),
                ..gone("default", "")
            },
            Some(&["10.0.0.2"]),
        ),
        (
            "still served",
            holding("default", "old", "10.0.0.1", vec![]),
            None,
        ),
        (
            "being deleted",
            ServiceView {
                deleting: true,
                ..gone("default", "10.0.0.1")
            },
            None,
        ),
        (
            "hand-set outside the pool",
            gone("default", "192.0.2.1"),
            None,
        ),
        (
            "partly outside the pool",
            gone("default", "10.0.0.1,192.0.2.1"),
            None,
        ),
        (
            "not labelled",
            ServiceView {
                labelled: false,
                ..gone("default", "10.0.0.1")
            },
            None,
        ),
        ("DHCP", gone("default", "0.0.0.0"), None),
        ("no address", gone("default", ""), None),
        (
            "in the global pool, not its namespace's",
            gone("other", "10.0.0.1"),
            None,
        ),
        (
            "in its namespace's pool",
            gone("other", "10.1.0.1"),
            Some(&["10.1.0.1"]),
        ),
    ];
    let data = [
        ("cidr-global", "10.0.0.0/29,fd00::/126"),
        ("cidr-other", "10.1.0.0/29"),
    ];
    for (name, view, want) in table {
        let got = run(&data, std::slice::from_ref(view));
        let want = want.map_or(Decision::Keep, |a| Decision::Release { addrs: ips(a) });
        assert_eq!(got[0].1, want, "{name}");
    }
}

#[test]
fn pool_problems_stay_in_their_namespace() {
    let data = [
        ("cidr-bad", "10.0.0.0/33"),
        ("cidr-global", "10.1.0.0/30"),
        ("interface-good", "eth2"),
        ("search-order", "desc"),
    ];
    let services = [lb("bad", "a", 1), lb("good", "b", 2)];
    let got = run(&data, &services);
    let Decision::PoolInvalid(e) = of(&got, "bad/a") else {
        panic!("{got:?}")
    };
    assert_eq!(
        e.to_string(),
        "key cidr-bad: \"10.0.0.0/33\" is not a CIDR (prefix length 33 > 32)"
    );
    assert_eq!(
        of(&got, "good/b"),
        &Decision::Allocate {
            addrs: ips(&["10.1.0.3"]),
            pool: "cidr-global".into(),
            shared: false,
            interface: Some("eth2".into()),
        }
    );
    let got = run(&[("range-shop", "10.0.0.1-10.0.0.9")], &services);
    assert_eq!(of(&got, "bad/a"), &Decision::NoPool);
    assert_eq!(run(&[], &services[..1])[0].1, Decision::NoPool);
}

/// Warnings for requested addresses (the Service keeps them).
#[test]
fn requested_addresses_get_warnings() {
    use RequestWarning::{InUse as Used, NotInPool};
    let some = |s: &str| Some(s.to_string());
    let me = |annotation: &str| holding("default", "web", annotation, vec![tcp(80)]);
    let other = |ports: Vec<PortUse>| holding("default", "other", "10.0.0.1", ports);
    let pool = [("cidr-global", "10.0.0.0/29"), ("cidr-shop", "10.1.0.0/29")];
    let share = [
        ("cidr-global", "10.0.0.0/29"),
        ("allow-share-global", "true"),
    ];
    let used = |by: &str| Used {
        addr: ip("10.0.0.1"),
        by: by.into(),
    };
    #[allow(clippy::type_complexity)]
    let table: &[(
        &str,
        &[(&str, &str)],
        ServiceView,
        Vec<ServiceView>,
        &[(&str, &str)],
        &[&str],
        Vec<RequestWarning>,
    )] = &[
        (
            "free, in the pool",
            &pool,
            me("10.0.0.2"),
            vec![],
            &[],
            &[],
            vec![],
        ),
        (
            "outside every pool",
            &pool,
            me("192.0.2.1"),
            vec![],
            &[],
            &[],
            vec![NotInPool {
                addr: ip("192.0.2.1"),
            }],
        ),
        (
            "in another namespace's pool",
            &pool,
            me("10.1.0.1"),
            vec![],
            &[],
            &[],
            vec![],
        ),
        (
            "a .0 address the pool covers",
            &pool,
            me("10.0.0.0"),
            vec![],
            &[],
            &[],
            vec![],
        ),
        (
            "no pool configured",
            &[],
            me("192.0.2.1"),
            vec![],
            &[],
            &[],
            vec![],
        ),
        (
            "only a DHCP pool",
            &[("cidr-global", "0.0.0.0/32")],
            me("192.0.2.1"),
            vec![],
            &[],
            &[],
            vec![],
        ),
        (
            "only a malformed pool",
            &[("cidr-global", "x/1")],
            me("192.0.2.1"),
            vec![],
            &[],
            &[],
            vec![],
        ),
        (
            "spec.loadBalancerIP outside",
            &pool,
            ServiceView {
                spec_ip: some("192.0.2.9"),
                ..me("10.0.0.2")
            },
            vec![],
            &[],
            &[],
            vec![NotInPool {
                addr: ip("192.0.2.9"),
            }],
        ),
        (
            "another Service",
            &pool,
            me("10.0.0.1"),
            vec![other(vec![udp(53)])],
            &[],
            &[],
            vec![used("Service default/other")],
        ),
        (
            "another Service, sharing allowed",
            &share,
            me("10.0.0.1"),
            vec![other(vec![udp(53)])],
            &[],
            &[],
            vec![],
        ),
        (
            "sharing allowed, same port",
            &share,
            me("10.0.0.1"),
            vec![other(vec![tcp(80)])],
            &[],
            &[],
            vec![used("Service default/other")],
        ),
        (
            "a Node",
            &pool,
            me("10.0.0.1"),
            vec![],
            &[("n1", "10.0.0.1")],
            &[],
            vec![used("Node n1")],
        ),
        (
            "the control plane",
            &share,
            me("10.0.0.1"),
            vec![],
            &[],
            &["10.0.0.1"],
            vec![used("the control-plane VIP")],
        ),
        (
            "several users",
            &share,
            me("10.0.0.1"),
            vec![other(vec![tcp(80)])],
            &[("n1", "10.0.0.1")],
            &[],
            vec![used("Service default/other, Node n1")],
        ),
        (
            "its own status",
            &pool,
            ServiceView {
                status_ips: ips(&["10.0.0.1"]),
                ..me("10.0.0.1")
            },
            vec![],
            &[],
            &[],
            vec![],
        ),
        (
            "a hostname",
            &pool,
            me("lb.example"),
            vec![],
            &[],
            &[],
            vec![],
        ),
        ("DHCP", &pool, me("0.0.0.0"), vec![], &[], &[], vec![]),
    ];
    for (name, pairs, svc, others, nodes, cp, want) in table {
        let b = book(pairs);
        let mut others = others.clone();
        others.push(svc.clone());
        let nodes: Vec<(String, IpAddr)> =
            nodes.iter().map(|(n, a)| (n.to_string(), ip(a))).collect();
        let in_use = InUse::build(&others, &nodes, &ips(cp), |ns| b.allow_share(ns));
        assert_eq!(&requested_warnings(svc, &b, &in_use), want, "{name}");
    }
}
