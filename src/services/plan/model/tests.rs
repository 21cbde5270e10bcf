use super::*;
use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn svc(name: &str, annotations: &[(&str, &str)], spec: ServiceSpec) -> Service {
    Service {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

fn lb_spec() -> ServiceSpec {
    ServiceSpec {
        type_: Some("LoadBalancer".into()),
        ports: Some(vec![
            ServicePort {
                port: 80,
                ..Default::default()
            },
            ServicePort {
                port: 53,
                protocol: Some("UDP".into()),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

/// The fuzz-style table: annotation value -> (accepted in order, rejected values, dhcp).
/// 48 values: valid, malformed, mixed families, duplicates, whitespace, DHCP.
#[test]
fn annotation_table() {
    #[allow(clippy::type_complexity)]
    let table: &[(&str, &[&str], &[&str], bool)] = &[
        // valid, single and lists
        ("192.0.2.5", &["192.0.2.5"], &[], false),
        (
            "192.0.2.5,192.0.2.6",
            &["192.0.2.5", "192.0.2.6"],
            &[],
            false,
        ),
        ("2001:db8::5", &["2001:db8::5"], &[], false),
        ("2001:DB8::5", &["2001:db8::5"], &[], false),
        ("2001:db8:0:0:0:0:0:5", &["2001:db8::5"], &[], false),
        ("198.51.100.1", &["198.51.100.1"], &[], false),
        (
            "10.0.0.1,172.16.0.1",
            &["10.0.0.1", "172.16.0.1"],
            &[],
            false,
        ),
        ("192.0.2.255", &["192.0.2.255"], &[], false),
        ("1.1.1.1", &["1.1.1.1"], &[], false),
        // mixed families, order kept
        (
            "192.0.2.5,2001:db8::5",
            &["192.0.2.5", "2001:db8::5"],
            &[],
            false,
        ),
        (
            "2001:db8::5,192.0.2.5",
            &["2001:db8::5", "192.0.2.5"],
            &[],
            false,
        ),
        (
            "192.0.2.7,2001:db8::7,192.0.2.8",
            &["192.0.2.7", "2001:db8::7", "192.0.2.8"],
            &[],
            false,
        ),
        // duplicates dropped (not rejected)
        ("192.0.2.5,192.0.2.5", &["192.0.2.5"], &[], false),
        ("2001:db8::5,2001:DB8:0::5", &["2001:db8::5"], &[], false),
        (
            "192.0.2.6,192.0.2.5,192.0.2.6",
            &["192.0.2.6", "192.0.2.5"],
            &[],
            false,
        ),
        // DHCP markers
        ("0.0.0.0", &[], &[], true),
        ("::", &[], &[], true),
        ("0:0:0:0:0:0:0:0", &[], &[], true),
        ("0.0.0.0,192.0.2.5", &["192.0.2.5"], &[], true),
        ("0.0.0.0,::", &[], &[], true),
        // whitespace: rejected, not trimmed
        (" 192.0.2.5", &[], &[" 192.0.2.5"], false),
        ("192.0.2.5 ", &[], &["192.0.2.5 "], false),
        (
            "192.0.2.5, 192.0.2.6",
            &["192.0.2.5"],
            &[" 192.0.2.6"],
            false,
        ),
        ("\t2001:db8::5", &[], &["\t2001:db8::5"], false),
        (
            "192.0.2.5,\n192.0.2.6",
            &["192.0.2.5"],
            &["\n192.0.2.6"],
            false,
        ),
        ("192.0. 2.5", &[], &["192.0. 2.5"], false),
        // malformed
        ("192.0.2.300", &[], &["192.0.2.300"], false),
        ("192.0.2.1/24", &[], &["192.0.2.1/24"], false),
        ("2001:db8::/64", &[], &["2001:db8::/64"], false),
        ("::ffff:zz", &[], &["::ffff:zz"], false),
        ("192.0.2", &[], &["192.0.2"], false),
        ("192.0.2.1.5", &[], &["192.0.2.1.5"], false),
        ("192.0.2.05", &[], &["192.0.2.05"], false),
        ("0x7f.0.0.1", &[], &["0x7f.0.0.1"], false),
        ("example.com", &[], &["example.com"], false),
        ("2001:db8::5::1", &[], &["2001:db8::5::1"], false),
        ("[2001:db8::5]", &[], &["[2001:db8::5]"], false),
        ("fe80::1%eth0", &[], &["fe80::1%eth0"], false),
        ("192.0.2.5:80", &[], &["192.0.2.5:80"], false),
        // empty entries
        ("192.0.2.5,", &["192.0.2.5"], &[""], false),
        (",192.0.2.5", &["192.0.2.5"], &[""], false),
        (
            "192.0.2.5,,192.0.2.6",
            &["192.0.2.5", "192.0.2.6"],
            &[""],
            false,
        ),
        (" ", &[], &[" "], false),
        // unusable kinds of address
        ("127.0.0.1", &[], &["127.0.0.1"], false),
        ("::1", &[], &["::1"], false),
        ("224.0.0.5", &[], &["224.0.0.5"], false),
        ("ff02::1", &[], &["ff02::1"], false),
        ("169.254.1.1", &[], &["169.254.1.1"], false),
        ("fe80::1", &[], &["fe80::1"], false),
        ("255.255.255.255", &[], &["255.255.255.255"], false),
        ("0.1.2.3", &[], &["0.1.2.3"], false),
        ("::ffff:192.0.2.5", &[], &["::ffff:192.0.2.5"], false),
        ("::192.0.2.5", &[], &["::192.0.2.5"], false),
        // mixed good and bad: only the bad ones go
        (
            "192.0.2.5,192.0.2.300,2001:db8::5,::ffff:zz",
            &["192.0.2.5", "2001:db8::5"],
            &["192.0.2.300", "::ffff:zz"],
            false,
        ),
    ];
    assert!(table.len() >= 40, "table has {} rows", table.len());
    for (text, accepted, rejected, dhcp) in table {
        let p = parse_address_list(text);
        let want: Vec<IpAddr> = accepted.iter().map(|a| ip(a)).collect();
        let got_rej: Vec<&str> = p.rejected.iter().map(|r| r.value.as_str()).collect();
        assert_eq!(p.addresses, want, "accepted for {text:?}");
        assert_eq!(&got_rej, rejected, "rejected for {text:?}");
        assert_eq!(p.dhcp, *dhcp, "dhcp for {text:?}");
        assert_eq!(p.source, AddressSource::Annotation);
    }
}

#[test]
fn reasons_and_message_name_the_value() {
    let p = parse_address_list("192.0.2.300,192.0.2.1/24, 192.0.2.5,::ffff:zz");
    let reasons: Vec<RejectReason> = p.rejected.iter().map(|r| r.reason).collect();
    assert_eq!(
        reasons,
        [
            RejectReason::NotAnAddress,
            RejectReason::Cidr,
            RejectReason::Whitespace,
            RejectReason::NotAnAddress
        ]
    );
    let msg = p.rejection_message().unwrap();
    assert!(
        msg.starts_with("kube-vip.io/loadbalancerIPs: rejected "),
        "{msg}"
    );
    for v in [
        "\"192.0.2.300\"",
        "\"192.0.2.1/24\"",
        "\" 192.0.2.5\"",
        "\"::ffff:zz\"",
    ] {
        assert!(msg.contains(v), "{msg} lacks {v}");
    }
    assert!(msg.contains("prefix length"), "{msg}");
    assert_eq!(parse_address_list("192.0.2.1").rejection_message(), None);
}

#[test]
fn duplicates_are_listed_as_written() {
    let p = parse_address_list("2001:db8::5,2001:DB8::5,2001:db8::5");
    assert_eq!(p.addresses, vec![ip("2001:db8::5")]);
    assert_eq!(p.duplicates, vec!["2001:DB8::5", "2001:db8::5"]);
    assert!(p.rejected.is_empty());
}

#[test]
fn annotation_wins_over_spec() {
    let mut spec = lb_spec();
    spec.load_balancer_ip = Some("192.0.2.9".into());
    let s = svc("a", &[(ANN_LOADBALANCER_IPS, "192.0.2.5")], spec.clone());
    let p = addresses_of(&s);
    assert_eq!(p.addresses, vec![ip("192.0.2.5")]);
    assert_eq!(p.source, AddressSource::Annotation);

    // An annotation with only bad entries still hides the spec (kube-vip's rule).
    let s = svc("a", &[(ANN_LOADBALANCER_IPS, "bad")], spec.clone());
    let p = addresses_of(&s);
    assert!(p.addresses.is_empty());
    assert_eq!(p.rejected.len(), 1);

    // An empty annotation counts as absent.
    let s = svc("a", &[(ANN_LOADBALANCER_IPS, "")], spec.clone());
    let p = addresses_of(&s);
    assert_eq!(
        (p.addresses, p.source),
        (vec![ip("192.0.2.9")], AddressSource::Spec)
    );

    let s = svc("a", &[], spec);
    assert_eq!(addresses_of(&s).source, AddressSource::Spec);
}

#[test]
fn spec_address_is_one_value() {
    let mut spec = lb_spec();
    spec.load_balancer_ip = Some("192.0.2.5,192.0.2.6".into());
    let p = addresses_of(&svc("a", &[], spec));
    assert!(p.addresses.is_empty());
    assert_eq!(p.rejected[0].value, "192.0.2.5,192.0.2.6");
    let msg = p.rejection_message().unwrap();
    assert!(msg.starts_with("spec.loadBalancerIP: "), "{msg}");

    let mut spec = lb_spec();
    spec.load_balancer_ip = Some("0.0.0.0".into());
    assert!(addresses_of(&svc("a", &[], spec)).dhcp);

    let none = addresses_of(&svc("a", &[], lb_spec()));
    assert_eq!(none, ParsedAddresses::default());
    assert!(none.is_empty());
}

#[test]
fn info_fields() {
    let mut spec = lb_spec();
    spec.external_traffic_policy = Some("Local".into());
    spec.load_balancer_class = Some(crate::services::plan::model::DEFAULT_LB_CLASS_NAME.into());
    let s = svc(
        "web",
        &[
            (ANN_LOADBALANCER_IPS, "192.0.2.5"),
            (ANN_SERVICE_INTERFACE, "eth1"),
            (ANN_IGNORE, "True"),
            (ANN_HWADDR, "02:00:00:00:00:01"),
        ],
        spec,
    );
    let i = service_info(&s);
    assert_eq!(i.key.to_string(), "default/web");
    assert_eq!(i.uid.as_deref(), Some("uid-web"));
    assert!(i.is_load_balancer && i.etp_local);
    assert!(!i.ignored, "only exactly \"true\" ignores, like kube-vip");
    assert_eq!(i.interface.as_deref(), Some("eth1"));
    assert_eq!(i.lease_name, "kubevip-web");
    assert!(!i.lease_name_from_annotation);
    assert_eq!(i.hwaddr.as_deref(), Some("02:00:00:00:00:01"));
    assert_eq!(
        i.ports,
        vec![
            PortProto {
                port: 80,
                protocol: "TCP".into()
            },
            PortProto {
                port: 53,
                protocol: "UDP".into()
            }
        ]
    );

    let s = svc("web", &[(ANN_LEASE_NAME, "shared")], lb_spec());
    let i = service_info(&s);
    assert_eq!(
        (i.lease_name.as_str(), i.lease_name_from_annotation),
        ("shared", true)
    );
    let s = svc("web", &[(ANN_LEASE_NAME, "")], lb_spec());
    assert_eq!(service_info(&s).lease_name, "kubevip-web");
}

#[test]
fn key_order_and_display() {
    let mut keys = [
        ServiceKey::new("b", "a"),
        ServiceKey::new("a", "z"),
        ServiceKey::new("a", "b"),
    ];
    keys.sort();
    let shown: Vec<String> = keys.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["a/b", "a/z", "b/a"]);
}

fn info_with(
    class: Option<&str>,
    annotations: &[(&str, &str)],
    edit: impl FnOnce(&mut ServiceSpec),
) -> ServiceInfo {
    let mut spec = lb_spec();
    spec.load_balancer_class = class.map(str::to_string);
    edit(&mut spec);
    let mut ann = vec![(ANN_LOADBALANCER_IPS, "192.0.2.5")];
    ann.extend_from_slice(annotations);
    service_info(&svc("s", &ann, spec))
}

#[test]
fn selection_follows_kube_vip_legacy_class_rules() {
    use Selection::Announce;
    let cls = crate::services::plan::model::DEFAULT_LB_CLASS_NAME;
    let none = info_with(None, &[], |_| {});
    let ours = info_with(Some(cls), &[], |_| {});
    let other = info_with(Some("metallb"), &[], |_| {});
    // lb_class_only = false: no class and our class are announced.
    assert_eq!(selection(&none, false, cls, None), Announce);
    assert_eq!(selection(&ours, false, cls, None), Announce);
    let other_skip = Selection::Skip(SkipReason::OtherClass {
        class: "metallb".into(),
    });
    assert_eq!(selection(&other, false, cls, None), other_skip);
    // lb_class_only = true: class required.
    assert_eq!(
        selection(&none, true, cls, None),
        Selection::Skip(SkipReason::NoClass)
    );
    assert_eq!(selection(&ours, true, cls, None), Announce);
    assert_eq!(selection(&other, true, cls, None), other_skip);
    // Custom class name.
    let custom = info_with(Some("corp/lb"), &[], |_| {});
    assert_eq!(selection(&custom, true, "corp/lb", None), Announce);
    assert!(matches!(
        selection(&ours, true, "corp/lb", None),
        Selection::Skip(SkipReason::OtherClass { .. })
    ));
}

#[test]
fn other_class_is_never_touched_even_with_bad_input() {
    // Another class with ignore, bad lease name and no address: OtherClass wins, so the
    // caller emits no Warning for it.
    let i = info_with(
        Some("metallb"),
        &[(ANN_LEASE_NAME, "Bad_Name"), (ANN_IGNORE, "true")],
        |s| s.external_traffic_policy = Some("Local".into()),
    );
    let sel = selection(
        &i,
        false,
        crate::services::plan::model::DEFAULT_LB_CLASS_NAME,
        None,
    );
    assert!(
        matches!(&sel, Selection::Skip(r) if !r.warrants_warning()),
        "{sel:?}"
    );
    assert!(matches!(
        sel,
        Selection::Skip(SkipReason::OtherClass { .. })
    ));
}

#[test]
fn selection_other_reasons() {
    let cls = crate::services::plan::model::DEFAULT_LB_CLASS_NAME;
    let skip = |i: &ServiceInfo, ns: Option<&str>| match selection(i, false, cls, ns) {
        Selection::Skip(r) => Some(r),
        Selection::Announce => None,
    };
    let cluster_ip = info_with(None, &[], |s| s.type_ = Some("ClusterIP".into()));
    assert_eq!(skip(&cluster_ip, None), Some(SkipReason::NotLoadBalancer));
    let ok = info_with(None, &[], |_| {});
    assert_eq!(skip(&ok, Some("default")), None);
    assert!(matches!(
        skip(&ok, Some("kube-system")),
        Some(SkipReason::OtherNamespace { .. })
    ));
    let ignored = info_with(None, &[(ANN_IGNORE, "true")], |_| {});
    assert_eq!(skip(&ignored, None), Some(SkipReason::Ignored));
    let bad_lease = info_with(None, &[(ANN_LEASE_NAME, "Bad_Name")], |_| {});
    let r = skip(&bad_lease, None).unwrap();
    assert!(r.warrants_warning());
    assert!(r.to_string().contains("Bad_Name"), "{r}");
    let local_lease = info_with(None, &[(ANN_LEASE_NAME, "shared")], |s| {
        s.external_traffic_policy = Some("Local".into())
    });
    assert_eq!(
        skip(&local_lease, None),
        Some(SkipReason::LeaseNameWithLocalPolicy)
    );
    let shared = info_with(None, &[(ANN_LEASE_NAME, "shared")], |_| {});
    assert_eq!(skip(&shared, None), None);
    let no_addr = service_info(&svc("s", &[], lb_spec()));
    assert_eq!(
        selection(&no_addr, false, cls, None),
        Selection::Skip(SkipReason::NoAddress)
    );
    let only_bad = service_info(&svc("s", &[(ANN_LOADBALANCER_IPS, "x")], lb_spec()));
    assert_eq!(
        selection(&only_bad, false, cls, None),
        Selection::Skip(SkipReason::NoAddress)
    );
    let dhcp = service_info(&svc("s", &[(ANN_LOADBALANCER_IPS, "0.0.0.0")], lb_spec()));
    assert_eq!(selection(&dhcp, false, cls, None), Selection::Announce);
}

#[test]
fn dns_subdomain() {
    for ok in ["kubevip-web", "a", "a.b-c.d", "0abc"] {
        assert!(is_dns_subdomain(ok), "{ok}");
    }
    let long = "a".repeat(254);
    for bad in ["", "A", "a_b", "-a", "a-", "a..b", ".a", long.as_str()] {
        assert!(!is_dns_subdomain(bad), "{bad}");
    }
}

/// A DHCP Service (`0.0.0.0`) with `annotations` and UID `uid-<name>`.
fn dhcp_svc(name: &str, annotations: &[(&str, &str)]) -> ServiceInfo {
    let mut all = vec![(ANN_LOADBALANCER_IPS, "0.0.0.0")];
    all.extend_from_slice(annotations);
    service_info(&svc(name, &all, lb_spec()))
}

#[test]
fn dhcp_markers_are_told_apart_by_family() {
    let p = parse_address_list("0.0.0.0,::,192.0.2.5");
    assert!(p.dhcp && p.dhcp_v4 && p.dhcp_v6);
    assert_eq!(p.addresses, vec![ip("192.0.2.5")]);
    let p = parse_address_list("::");
    assert!(p.dhcp && !p.dhcp_v4 && p.dhcp_v6);
    let p = parse_spec_address("0.0.0.0");
    assert!(p.dhcp && p.dhcp_v4 && !p.dhcp_v6);
    // One DHCP address per family: a second marker is rejected, naming the value.
    let p = parse_address_list("0.0.0.0,::,0:0::0");
    assert!(p.dhcp_v4 && p.dhcp_v6);
    assert_eq!(p.rejected.len(), 1);
    assert_eq!(p.rejected[0].value, "0:0::0");
    assert!(
        p.rejection_message()
            .unwrap()
            .contains("one DHCP address per family"),
        "{:?}",
        p.rejection_message()
    );
    assert_eq!(parse_address_list("0.0.0.0,0.0.0.0").rejected.len(), 1);
}

#[test]
fn dhcp_request_defaults_macvlan_from_uid_and_generates_a_stable_local_unicast_mac() {
    let mut info = dhcp_svc("web", &[]);
    info.uid = Some("3f2a9c1e-0000-4000-8000-000000000001".into());
    let r = dhcp_request(&info).unwrap();
    assert_eq!(r.macvlan, "vip-3f2a9c1e");
    assert!(r.mac_generated);
    assert_eq!(r.mac[0] & 0x03, 0x02, "locally administered, unicast");
    assert_eq!(r.mac, generated_mac("3f2a9c1e-0000-4000-8000-000000000001"));
    assert_ne!(r.mac, generated_mac("another-uid"));
    assert_eq!(r.requested, None);
    assert!(!r.broadcast);
    assert_eq!(r.rp_filter, 0);
    assert_eq!(r.parent, None);
    assert_eq!(r.mark, "vipd:3f2a9c1e-0000-4000-8000-000000000001");
    // Every node derives the same MAC for the same Service.
    assert_eq!(dhcp_request(&info).unwrap(), r);
}

#[test]
fn dhcp_request_reads_kube_vips_annotations() {
    let info = dhcp_svc(
        "web",
        &[
            (ANN_HWADDR, "02:00:5e:10:00:01"),
            (ANN_REQUESTED_IP, "192.0.2.201,2001:db8::201"),
            (ANN_MACVLAN_NAME, "lb-web"),
            (ANN_DHCP_BROADCAST, "true"),
            (ANN_RP_FILTER, "2"),
            (ANN_SERVICE_INTERFACE, "eth1"),
            (ANN_LOADBALANCER_HOSTNAME, "web-lb"),
        ],
    );
    let r = dhcp_request(&info).unwrap();
    assert_eq!(r.mac, [0x02, 0x00, 0x5e, 0x10, 0x00, 0x01]);
    assert!(!r.mac_generated);
    assert_eq!(r.requested, Some("192.0.2.201".parse().unwrap()));
    assert_eq!(r.macvlan, "lb-web");
    assert!(r.broadcast);
    assert_eq!(r.rp_filter, 2);
    assert_eq!(r.parent.as_deref(), Some("eth1"));
    assert_eq!(r.hostname.as_deref(), Some("web-lb"));
    assert_eq!(r.requested_v6, Some("2001:db8::201".parse().unwrap()));
    let spec = r.spec("eth0", crate::dhcp::DhcpFamily::V4);
    assert_eq!(
        spec.parent, "eth1",
        "the annotation wins over the default parent"
    );
    // An IPv6-only requestedIP asks for nothing over DHCPv4, and hints DHCPv6.
    let r = dhcp_request(&dhcp_svc("web", &[(ANN_REQUESTED_IP, "2001:db8::201")])).unwrap();
    assert_eq!(r.requested, None);
    assert_eq!(r.requested_v6, Some("2001:db8::201".parse().unwrap()));
    assert_eq!(r.families(), [crate::dhcp::DhcpFamily::V4]);
}

#[test]
fn dual_stack_dhcp_request_runs_both_families_on_one_macvlan() {
    let info = service_info(&svc(
        "web",
        &[(ANN_LOADBALANCER_IPS, "0.0.0.0,::")],
        lb_spec(),
    ));
    let r = dhcp_request(&info).unwrap();
    use crate::dhcp::DhcpFamily;
    assert_eq!(r.families(), [DhcpFamily::V4, DhcpFamily::V6]);
    let (a, b) = (
        r.spec("eth0", DhcpFamily::V4),
        r.spec("eth0", DhcpFamily::V6),
    );
    assert_eq!((a.family, b.family), (DhcpFamily::V4, DhcpFamily::V6));
    assert_eq!((a.macvlan, a.mac), (b.macvlan, b.mac));
    let info = service_info(&svc("web", &[(ANN_LOADBALANCER_IPS, "::")], lb_spec()));
    assert_eq!(dhcp_request(&info).unwrap().families(), [DhcpFamily::V6]);
}

#[test]
fn bad_dhcp_annotations_are_each_named_with_their_value() {
    let cases: &[(&str, &str, &str)] = &[
        (ANN_HWADDR, "02:00:5e:10:00", "MAC"),
        (ANN_HWADDR, "zz:00:5e:10:00:01", "MAC"),
        (ANN_HWADDR, "01:00:5e:10:00:01", "multicast"),
        (ANN_HWADDR, "00:00:00:00:00:00", "all-zero"),
        (ANN_REQUESTED_IP, "192.0.2.300", "not an IPv4 or IPv6"),
        (
            ANN_REQUESTED_IP,
            "192.0.2.1,192.0.2.2",
            "more than one IPv4",
        ),
        (ANN_REQUESTED_IP, "0.0.0.0", "cannot be leased"),
        (ANN_REQUESTED_IP, "fe80::1", "cannot be leased"),
        (
            ANN_REQUESTED_IP,
            "127.0.0.1",
            "cannot be leased (a loopback",
        ),
        (ANN_REQUESTED_IP, "169.254.1.1", "cannot be leased"),
        (ANN_REQUESTED_IP, "255.255.255.255", "cannot be leased"),
        (ANN_REQUESTED_IP, "192.0.2.1,224.0.0.1", "cannot be leased"),
        (
            ANN_LOADBALANCER_HOSTNAME,
            &"h".repeat(300),
            "300 bytes long",
        ),
        (ANN_LOADBALANCER_HOSTNAME, "lb\0x", "printable ASCII"),
        (ANN_LOADBALANCER_HOSTNAME, "my lb", "printable ASCII"),
        (ANN_LOADBALANCER_HOSTNAME, "lb-é", "printable ASCII"),
        (
            ANN_REQUESTED_IP,
            "2001:db8::1,2001:db8::2",
            "more than one IPv6",
        ),
        (ANN_MACVLAN_NAME, "a-name-that-is-too-long", "1 to 15 bytes"),
        (ANN_MACVLAN_NAME, "a/b", "not a Linux interface name"),
        (ANN_DHCP_BROADCAST, "yes", "not a boolean"),
        (ANN_RP_FILTER, "3", "0 (off), 1 (strict) or 2 (loose)"),
        (ANN_SERVICE_INTERFACE, "eth 0", "not a Linux interface name"),
    ];
    for (annotation, value, why) in cases {
        let bad = dhcp_request(&dhcp_svc("web", &[(annotation, value)])).unwrap_err();
        assert_eq!(bad.len(), 1, "{annotation}={value}: {bad:?}");
        let text = bad[0].to_string();
        assert!(
            text.contains(annotation) && text.contains(&format!("{value:?}")) && text.contains(why),
            "{text}"
        );
    }
    // Host names a DHCP server may take are passed through.
    for host in ["lb-1.example.com", "my_lb", "h"] {
        let r = dhcp_request(&dhcp_svc("web", &[(ANN_LOADBALANCER_HOSTNAME, host)])).unwrap();
        assert_eq!(r.hostname.as_deref(), Some(host));
    }
    // Several bad values: each reported.
    let bad = dhcp_request(&dhcp_svc(
        "web",
        &[(ANN_HWADDR, "nope"), (ANN_RP_FILTER, "x")],
    ))
    .unwrap_err();
    assert_eq!(bad.len(), 2);
}

/// Issue 27: bad input costs what one bad Service costs. 2 000 malformed entries: the first
/// 64 are read, the rest only counted; one message of bounded size names the field, a few
/// values per reason and the counts.
#[test]
fn a_long_malformed_list_is_read_up_to_the_cap_and_told_in_one_bounded_line() {
    let text = (0..2000)
        .map(|i| format!("bad-{i}"))
        .chain(["192.0.2.1/24".to_string()])
        .collect::<Vec<_>>()
        .join(",");
    let p = parse_address_list(&text);
    assert_eq!(p.rejected.len(), MAX_ADDRESS_ENTRIES);
    // Past the length cap (4096 bytes, about 460 of these entries) nothing is counted.
    let read = &text[..text[..MAX_ADDRESS_LIST_BYTES].rfind(',').unwrap()];
    assert_eq!(p.unread, read.split(',').count() - MAX_ADDRESS_ENTRIES);
    assert_eq!(p.too_long, Some(text.len()));
    let msg = p.rejection_message().unwrap();
    assert_eq!(
        msg,
        format!(
            "kube-vip.io/loadbalancerIPs: rejected 64 entries (not an IPv4 or IPv6 address): \"bad-0\", \"bad-1\", \"bad-2\" and 61 more; the text is {} bytes long: entries past the first 4096 bytes not read (at most 4096 bytes per Service); {} entries after the first 64 not read (at most 64 per Service)",
            text.len(),
            p.unread
        )
    );
    assert!(msg.len() < 400, "{} bytes: {msg}", msg.len());
    // A good address within the cap is still served.
    let p = parse_address_list(&format!("192.0.2.7,{text}"));
    assert_eq!(p.addresses, vec![ip("192.0.2.7")]);
}

/// A rejected value is quoted cut to 64 characters: one message stays short whatever the
/// annotation holds (up to 256 KiB).
#[test]
fn a_huge_rejected_value_is_quoted_cut() {
    let huge = "x".repeat(4000);
    let msg = parse_address_list(&huge).rejection_message().unwrap();
    assert!(msg.len() < 200, "{} bytes", msg.len());
    assert!(msg.contains(&format!("\"{}...\"", "x".repeat(64))), "{msg}");
}

/// Issue 27: at most 4096 bytes of the list are read. Past the cap nothing is parsed, an
/// entry cut by it is dropped (never read as a shorter address), and the one message says
/// how long the text was.
#[test]
fn a_list_longer_than_the_length_cap_is_read_up_to_it_and_told() {
    let huge = "x".repeat(100_000);
    let p = parse_address_list(&huge);
    assert!(p.rejected.is_empty() && p.addresses.is_empty());
    assert_eq!(p.too_long, Some(100_000));
    assert_eq!(
        p.rejection_message().as_deref(),
        Some(
            "kube-vip.io/loadbalancerIPs: rejected the text is 100000 bytes long: entries past the first 4096 bytes not read (at most 4096 bytes per Service)"
        )
    );
    // 192.0.2.1 at the front, then padding so that 192.0.2.12 straddles the cut.
    let pad = "x".repeat(MAX_ADDRESS_LIST_BYTES - "192.0.2.1,".len() - ",192.0.2.1".len());
    let text = format!("192.0.2.1,{pad},192.0.2.12,192.0.2.13");
    assert_eq!(
        &text[MAX_ADDRESS_LIST_BYTES - 9..MAX_ADDRESS_LIST_BYTES],
        "192.0.2.1"
    );
    let p = parse_address_list(&text);
    assert_eq!(
        p.addresses,
        vec![ip("192.0.2.1")],
        "the cut 192.0.2.12 is not 192.0.2.1"
    );
    assert_eq!(p.rejected.len(), 1, "the padding");
    assert_eq!(p.too_long, Some(text.len()));
    // Exactly at the cap: all read.
    let p = parse_address_list(&text[..MAX_ADDRESS_LIST_BYTES - 10]);
    assert_eq!(p.too_long, None);
}

/// Every Service annotation the Services wing reads is one the process's Services cache
/// keeps (`kube::service::cached_annotation`): else the wing would read it as absent.
#[test]
fn every_annotation_read_is_one_the_cache_keeps() {
    use crate::kube::service::cached_annotation;
    let read = [
        ANN_LEASE_NAME,
        ANN_VIP_HOST,
        ANN_HWADDR,
        ANN_DHCP_LEASE,
        ANN_LOADBALANCER_HOSTNAME,
        ANN_IGNORE_SERVICE_SECURITY,
        ANN_HEALTHCHECK,
        dhcp::ANN_MACVLAN_NAME,
        dhcp::ANN_DHCP_BROADCAST,
        dhcp::ANN_RP_FILTER,
        crate::nodes::selector::NODE_SELECTOR_ANNOTATION,
        crate::nodes::selector::PREFERRED_NODES_ANNOTATION,
    ];
    for name in read {
        assert!(
            cached_annotation(name),
            "{name} is not kept by the Services cache"
        );
    }
}
