use super::*;

fn facts(ns: &str, name: &str, ann: &[(&str, &str)], vips: &[&str], eps: &[&str]) -> EgressFacts {
    EgressFacts {
        namespace: ns.into(),
        name: name.into(),
        annotations: ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        vips: vips.iter().map(|v| v.parse().unwrap()).collect(),
        etp_local: true,
        local_endpoints: eps.iter().map(|v| v.parse().unwrap()).collect(),
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn settings() -> Settings {
    Settings {
        pod_cidrs: vec![net("10.42.0.0/16"), net("fd00:42::/56")],
        service_cidrs: vec![net("10.43.0.0/16")],
        fence: true,
        ..Settings::default()
    }
}

/// Settings whose internal networks are none of the lab's (explicit, unrelated).
fn plain() -> Settings {
    Settings {
        pod_cidrs: vec![net("10.42.0.0/16")],
        service_cidrs: vec![net("10.43.0.0/16")],
        fence: true,
        ..Settings::default()
    }
}

fn report(services: &[EgressFacts]) -> EgressReport {
    EgressReport {
        services: services.to_vec(),
        node_pod_cidrs: vec![],
    }
}

#[test]
fn every_local_endpoint_of_each_family_leaves_with_the_vip_of_its_family() {
    let f = facts(
        "web",
        "api",
        &[(ANN_EGRESS, "true")],
        &["192.0.2.50", "2001:db8::50"],
        &["198.51.100.11", "198.51.100.21", "2001:db8:1::11"],
    );
    let (t, problems) = table(&report(&[f]), &settings());
    assert!(problems.is_empty(), "{problems:?}");
    let pairs: Vec<(String, String)> = t
        .snat
        .iter()
        .map(|r| (r.source.to_string(), r.vip.to_string()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("198.51.100.11", "192.0.2.50"),
            ("198.51.100.21", "192.0.2.50"),
            ("2001:db8:1::11", "2001:db8::50"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    // Pod and service CIDRs of the rule's family are excluded; the other family's are not.
    assert_eq!(
        t.snat[0].excluded,
        vec![net("10.42.0.0/16"), net("10.43.0.0/16")]
    );
    assert_eq!(t.snat[2].excluded, vec![net("fd00:42::/56")]);
    assert_eq!(
        t.guarded,
        vec![
            "192.0.2.50".parse::<IpAddr>().unwrap(),
            "2001:db8::50".parse().unwrap()
        ]
    );
}

#[test]
fn only_the_exact_value_true_turns_egress_on() {
    for v in ["True", "yes", "1", ""] {
        let f = facts(
            "a",
            "b",
            &[(ANN_EGRESS, v)],
            &["192.0.2.50"],
            &["198.51.100.11"],
        );
        assert_eq!(
            table(&report(&[f]), &settings()).0,
            EgressTable::default(),
            "{v:?}"
        );
    }
    let f = facts(
        "a",
        "b",
        &[(ANN_EGRESS_DENIED, "10.0.0.0/8")],
        &["192.0.2.50"],
        &["198.51.100.11"],
    );
    assert_eq!(table(&report(&[f]), &settings()).0, EgressTable::default());
}

#[test]
fn denied_allowed_and_ports_expand_into_rules() {
    let f = facts(
        "a",
        "b",
        &[
            (ANN_EGRESS, "true"),
            (ANN_EGRESS_DENIED, " 203.0.113.128/25 , 2001:db8:9::/48"),
            (ANN_EGRESS_ALLOWED, "203.0.113.0/24,198.51.100.200"),
            (ANN_EGRESS_PORTS, "TCP:8080, udp:53"),
        ],
        &["192.0.2.50"],
        &["198.51.100.11"],
    );
    let (t, problems) = table(&report(&[f]), &plain());
    assert!(problems.is_empty(), "{problems:?}");
    // 2 allowed networks x 2 ports, each with the internal networks and the v4 denied one.
    assert_eq!(t.snat.len(), 4);
    let want = vec![
        net("10.42.0.0/16"),
        net("10.43.0.0/16"),
        net("203.0.113.128/25"),
    ];
    assert!(t.snat.iter().all(|r| r.excluded == want), "{:?}", t.snat);
    let combos: Vec<_> = t
        .snat
        .iter()
        .map(|r| (r.allowed.unwrap().to_string(), r.port.unwrap()))
        .collect();
    assert_eq!(
        combos,
        vec![
            ("203.0.113.0/24".to_string(), (L4::Tcp, 8080)),
            ("203.0.113.0/24".to_string(), (L4::Udp, 53)),
            ("198.51.100.200/32".to_string(), (L4::Tcp, 8080)),
            ("198.51.100.200/32".to_string(), (L4::Udp, 53)),
        ]
    );
    // An allow list without an IPv6 network translates no IPv6.
    let f6 = facts(
        "a",
        "c",
        &[(ANN_EGRESS, "true"), (ANN_EGRESS_ALLOWED, "203.0.113.0/24")],
        &["2001:db8::50"],
        &["2001:db8:1::11"],
    );
    assert!(table(&report(&[f6]), &plain()).0.snat.is_empty());
}

#[test]
fn a_bad_entry_turns_that_service_off_and_names_annotation_and_value() {
    let bad = facts(
        "a",
        "bad",
        &[(ANN_EGRESS, "true"), (ANN_EGRESS_PORTS, "tcp:443,http")],
        &["192.0.2.50"],
        &["198.51.100.11"],
    );
    let good = facts(
        "a",
        "good",
        &[(ANN_EGRESS, "true")],
        &["192.0.2.51"],
        &["198.51.100.12"],
    );
    let (t, problems) = table(&report(&[bad, good]), &plain());
    assert_eq!(t.snat.len(), 1, "the other Service is not affected");
    assert_eq!(t.snat[0].vip.to_string(), "192.0.2.51");
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].service, "a/bad");
    assert!(
        problems[0].message.contains(ANN_EGRESS_PORTS) && problems[0].message.contains("\"http\""),
        "{}",
        problems[0].message
    );
    for (ann, v) in [
        (ANN_EGRESS_DENIED, "10.0.0.0/33"),
        (ANN_EGRESS_ALLOWED, "nope"),
        (ANN_EGRESS_PORTS, "tcp:0"),
        (ANN_EGRESS_PORTS, "icmp:1"),
        (ANN_EGRESS_PORTS, "tcp:70000"),
    ] {
        let f = facts(
            "a",
            "x",
            &[(ANN_EGRESS, "true"), (ann, v)],
            &["192.0.2.50"],
            &["198.51.100.11"],
        );
        let (t, p) = table(&report(&[f]), &plain());
        assert!(t.snat.is_empty(), "{ann}={v}");
        assert!(p[0].message.contains(ann), "{ann}={v}: {p:?}");
    }
}

#[test]
fn two_services_keep_their_own_rules_and_a_shared_pod_keeps_the_first() {
    let a = facts(
        "a",
        "one",
        &[(ANN_EGRESS, "true")],
        &["192.0.2.50"],
        &["198.51.100.11"],
    );
    let b = facts(
        "a",
        "two",
        &[(ANN_EGRESS, "true")],
        &["192.0.2.51"],
        &["198.51.100.12"],
    );
    let (both, _) = table(&report(&[a.clone(), b.clone()]), &plain());
    assert_eq!(both.snat.len(), 2);
    // One deleted (kube-vip #551): the other's rule stays as it was.
    let (only_b, _) = table(&report(std::slice::from_ref(&b)), &plain());
    assert_eq!(only_b.snat, vec![both.snat[1].clone()]);
    let mut shared = b.clone();
    shared.local_endpoints = a.local_endpoints.clone();
    let (t, problems) = table(&report(&[a, shared]), &plain());
    assert_eq!(t.snat.len(), 1);
    assert_eq!(t.snat[0].vip.to_string(), "192.0.2.50");
    assert!(problems[0].message.contains("a/one"), "{problems:?}");
}

#[test]
fn no_endpoint_here_no_rule_and_no_guard() {
    let f = facts("a", "b", &[(ANN_EGRESS, "true")], &["192.0.2.50"], &[]);
    assert_eq!(table(&report(&[f]), &plain()).0, EgressTable::default());
}

#[test]
fn internal_networks_configured_else_discovered_else_kube_vips_fallback() {
    let mut r = report(&[]);
    let none = Settings::default();
    assert_eq!(
        internal_networks(&r, &none),
        vec![net("10.0.0.0/16"), net("10.96.0.0/12")]
    );
    r.node_pod_cidrs = vec![net("10.42.0.0/24"), net("10.42.1.0/24")];
    assert_eq!(
        internal_networks(&r, &none),
        vec![
            net("10.42.0.0/24"),
            net("10.42.1.0/24"),
            net("10.96.0.0/12")
        ]
    );
    assert_eq!(
        internal_networks(&r, &settings()),
        vec![
            net("10.42.0.0/16"),
            net("fd00:42::/56"),
            net("10.43.0.0/16")
        ]
    );
}

#[test]
fn ipv6_only_no_internal_traffic_and_the_api_server() {
    let eps = ["198.51.100.11", "2001:db8:1::11"];
    let vips = ["192.0.2.50", "2001:db8::50"];
    let f = facts(
        "a",
        "b",
        &[(ANN_EGRESS, "true"), (ANN_EGRESS_IPV6, "true")],
        &vips,
        &eps,
    );
    let (t, _) = table(&report(&[f]), &plain());
    assert_eq!(t.snat.len(), 1);
    assert!(t.snat[0].vip.is_ipv6());
    // kube-vip's reading: "false" and "" keep the exclusion, anything else drops it.
    for (v, excluded) in [("false", 2), ("", 2), ("true", 0), ("yes", 0)] {
        let f = facts(
            "a",
            "b",
            &[(ANN_EGRESS, "true"), (ANN_EGRESS_NO_INTERNAL, v)],
            &vips[..1],
            &eps[..1],
        );
        let (t, _) = table(&report(&[f]), &plain());
        assert_eq!(t.snat[0].excluded.len(), excluded, "{v:?}");
    }
    let internal = Settings {
        internal_snat: true,
        api_server: Some("192.0.2.2".parse().unwrap()),
        ..plain()
    };
    let f = facts(
        "a",
        "b",
        &[(ANN_EGRESS, "true"), (ANN_EGRESS_DETECT_API, "yes")],
        &vips[..1],
        &eps[..1],
    );
    let (t, _) = table(&report(&[f]), &internal);
    assert_eq!(t.snat[0].excluded, vec![net("192.0.2.2/32")]);
}

#[test]
fn a_service_with_too_many_rules_is_off_alone_and_cluster_policy_is_reported() {
    let ports: Vec<String> = (1..=1100).map(|p| format!("tcp:{p}")).collect();
    let big = facts(
        "a",
        "big",
        &[(ANN_EGRESS, "true"), (ANN_EGRESS_PORTS, &ports.join(","))],
        &["192.0.2.50"],
        &["198.51.100.11"],
    );
    let ok = facts(
        "a",
        "ok",
        &[(ANN_EGRESS, "true")],
        &["192.0.2.51"],
        &["198.51.100.12"],
    );
    let (t, problems) = table(&report(&[big, ok]), &plain());
    assert_eq!(t.snat.len(), 1);
    assert_eq!(t.snat[0].service, "a/ok");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].message.contains("1100 rules"), "{problems:?}");
    let mut cluster = facts(
        "a",
        "c",
        &[(ANN_EGRESS, "true")],
        &["192.0.2.52"],
        &["198.51.100.13"],
    );
    cluster.etp_local = false;
    let (t, problems) = table(&report(&[cluster]), &plain());
    assert_eq!(
        t.snat.len(),
        1,
        "still translated where this node holds the VIP"
    );
    assert!(
        problems[0]
            .message
            .contains("externalTrafficPolicy is Cluster"),
        "{problems:?}"
    );
}

#[test]
fn without_the_fence_every_egress_service_is_reported_and_nothing_installed() {
    let f = facts(
        "a",
        "b",
        &[(ANN_EGRESS, "true")],
        &["192.0.2.50"],
        &["198.51.100.11"],
    );
    let off = Settings {
        fence: false,
        ..plain()
    };
    let (t, problems) = table(&report(&[f]), &off);
    assert_eq!(t, EgressTable::default());
    assert!(problems[0].message.contains("vip_nftfence"), "{problems:?}");
}

/// Every egress annotation is one the process's Services cache keeps
/// (`kube::service::cached_annotation`): else egress would read it as absent.
#[test]
fn every_egress_annotation_is_one_the_cache_keeps() {
    for name in [
        ANN_EGRESS,
        ANN_EGRESS_IPV6,
        ANN_EGRESS_DENIED,
        ANN_EGRESS_ALLOWED,
        ANN_EGRESS_PORTS,
        ANN_EGRESS_NO_INTERNAL,
        ANN_EGRESS_DETECT_API,
    ] {
        assert!(
            crate::kube::service::cached_annotation(name),
            "{name} is not kept by the Services cache"
        );
    }
}
