//! Pools: KVCP's reference cases (`pkg/ipam/ipam_test.go`, `pkg/provider/loadBalancer_test.go`
//! at d3522c6) and vipd's deliberate differences.

use super::*;

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn book(pairs: &[(&str, &str)]) -> PoolBook {
    PoolBook::from_data(&data(pairs))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The one pool of a book made of `value` under `cidr-global` (the key does not decide
/// the syntax; the value does).
fn one(value: &str, skip_end: bool) -> Pool {
    let skip = if skip_end { "true" } else { "false" };
    let b = book(&[("cidr-global", value), ("skip-end-ips-in-cidr", skip)]);
    b.pool_for("default").unwrap().unwrap().clone()
}

/// Every usable address of a (small) pool, both families, ascending.
fn all(pool: &Pool) -> Vec<String> {
    [Family::V4, Family::V6]
        .into_iter()
        .flat_map(|f| {
            pool.addresses(f, false)
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// KVCP `Test_buildHostsFromRange`; the addresses handed out also skip IPv4 .0/.255
/// (`FindFreeAddress`), which the set KVCP builds still holds ([`Pool::covers`]).
#[test]
fn kvcp_ranges_hold_these_addresses() {
    let table: &[(&str, &[&str])] = &[
        ("192.168.0.10-192.168.0.10", &["192.168.0.10"]),
        (
            "192.168.0.10-192.168.0.12",
            &["192.168.0.10", "192.168.0.11", "192.168.0.12"],
        ),
        (
            "192.168.0.253-192.168.1.2",
            &[
                "192.168.0.253",
                "192.168.0.254",
                "192.168.1.1",
                "192.168.1.2",
            ],
        ),
        (
            "192.168.0.10-192.168.0.11,192.168.1.20-192.168.1.21",
            &[
                "192.168.0.10",
                "192.168.0.11",
                "192.168.1.20",
                "192.168.1.21",
            ],
        ),
        (
            "192.168.0.10-192.168.0.11,192.168.0.10-192.168.0.13",
            &[
                "192.168.0.10",
                "192.168.0.11",
                "192.168.0.12",
                "192.168.0.13",
            ],
        ),
        ("fe80::13-fe80::14", &["fe80::13", "fe80::14"]),
        (
            "fe80::ffff-fe80::1:3",
            &[
                "fe80::ffff",
                "fe80::1:0",
                "fe80::1:1",
                "fe80::1:2",
                "fe80::1:3",
            ],
        ),
        (
            "fe80::10-fe80::12,fe81::13-fe81::14",
            &["fe80::10", "fe80::11", "fe80::12", "fe81::13", "fe81::14"],
        ),
        (
            "fe80::10-fe80::12,fe80::10-fe80::14",
            &["fe80::10", "fe80::11", "fe80::12", "fe80::13", "fe80::14"],
        ),
        // vipd: ranges of both families in one value, in any order.
        (
            "fd00::1-fd00::2,10.0.0.1-10.0.0.2",
            &["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2"],
        ),
    ];
    for (value, want) in table {
        let pool = one(value, false);
        assert_eq!(all(&pool), *want, "{value}");
        assert_eq!(
            pool.size(Family::V4) + pool.size(Family::V6),
            want.len() as u128
        );
        for a in *want {
            assert!(pool.contains(ip(a)), "{value} contains {a}");
        }
    }
    let across = one("192.168.0.253-192.168.1.2", false);
    for skipped in ["192.168.0.255", "192.168.1.0"] {
        assert!(across.covers(ip(skipped)) && !across.contains(ip(skipped)));
    }
    assert!(!across.covers(ip("192.168.1.3")) && !across.covers(ip("192.168.0.252")));
}

/// KVCP `Test_buildHostsFromCidr` (skip-end-ips-in-cidr off and on), minus the .0/.255
/// addresses `FindFreeAddress` skips, plus prefixes of the merged set.
#[test]
fn kvcp_cidrs_hold_these_addresses() {
    let table: &[(&str, bool, &[&str])] = &[
        ("192.168.0.200/32", false, &["192.168.0.200"]),
        ("192.168.0.200/32", true, &["192.168.0.200"]),
        (
            "192.168.0.200/30",
            false,
            &[
                "192.168.0.200",
                "192.168.0.201",
                "192.168.0.202",
                "192.168.0.203",
            ],
        ),
        (
            "192.168.0.200/30",
            true,
            &["192.168.0.201", "192.168.0.202"],
        ),
        (
            "192.168.0.200/31",
            true,
            &["192.168.0.200", "192.168.0.201"],
        ),
        (
            "192.168.0.200/31",
            false,
            &["192.168.0.200", "192.168.0.201"],
        ),
        (
            "192.168.0.200/30,192.168.0.200/29",
            false,
            &[
                "192.168.0.200",
                "192.168.0.201",
                "192.168.0.202",
                "192.168.0.203",
                "192.168.0.204",
                "192.168.0.205",
                "192.168.0.206",
                "192.168.0.207",
            ],
        ),
        (
            "192.168.0.200/30,192.168.0.200/29",
            true,
            &[
                "192.168.0.201",
                "192.168.0.202",
                "192.168.0.203",
                "192.168.0.204",
                "192.168.0.205",
                "192.168.0.206",
            ],
        ),
        ("fe80::10/127", false, &["fe80::10", "fe80::11"]),
        ("fe80::10/127", true, &["fe80::10", "fe80::11"]),
        (
            "fe80::10/127,fe80::fe/127",
            false,
            &["fe80::10", "fe80::11", "fe80::fe", "fe80::ff"],
        ),
        (
            "fe80::10/126,fe80::12/127",
            false,
            &["fe80::10", "fe80::11", "fe80::12", "fe80::13"],
        ),
        // IPv6 is never trimmed: the subnet-router anycast address is handed out.
        (
            "fd00::/126",
            true,
            &["fd00::", "fd00::1", "fd00::2", "fd00::3"],
        ),
        // Two adjacent /31 merge into a /30, which is then trimmed (netipx Prefixes).
        ("10.0.0.4/31,10.0.0.6/31", true, &["10.0.0.5", "10.0.0.6"]),
        // .1-.7 is .1/32, .2/31 and .4/30: only the /30 loses its ends.
        (
            "10.0.0.1/32,10.0.0.2/32,10.0.0.3/32,10.0.0.4/30",
            true,
            &["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.5", "10.0.0.6"],
        ),
        // Host bits are allowed (netipx RangeOfPrefix masks them).
        (
            "10.0.0.9/30",
            false,
            &["10.0.0.8", "10.0.0.9", "10.0.0.10", "10.0.0.11"],
        ),
        // The .0/.255 rule holds for every prefix length.
        ("10.0.0.254/31", false, &["10.0.0.254"]),
        ("10.0.1.0/32", false, &[]),
    ];
    for (value, skip, want) in table {
        let pool = one(value, *skip);
        assert_eq!(all(&pool), *want, "{value} skip={skip}");
        let size = pool.size(Family::V4) + pool.size(Family::V6);
        assert_eq!(size, want.len() as u128, "{value} skip={skip}");
    }
}

/// KVCP `TestFindAvailableHostFromRange`, `TestFindAvailableHostFromCIDR`,
/// `Test_DiscoveryAddressCIDR` and `Test_DiscoveryAddressRange`: value, skip-end, desc,
/// addresses in use → the first free address (`None`: exhausted).
#[test]
fn kvcp_first_free_address() {
    #[allow(clippy::type_complexity)]
    let table: &[(&str, bool, bool, &[&str], Option<&str>)] = &[
        (
            "192.168.0.10-192.168.0.10",
            false,
            false,
            &[],
            Some("192.168.0.10"),
        ),
        (
            "192.168.0.10-192.168.0.10",
            false,
            true,
            &[],
            Some("192.168.0.10"),
        ),
        (
            "192.168.0.10-192.168.0.12",
            false,
            false,
            &[],
            Some("192.168.0.10"),
        ),
        (
            "192.168.0.10-192.168.0.12",
            false,
            true,
            &[],
            Some("192.168.0.12"),
        ),
        (
            "192.168.0.253-192.168.1.2",
            false,
            false,
            &["192.168.0.253", "192.168.0.254"],
            Some("192.168.1.1"),
        ),
        (
            "192.168.0.253-192.168.1.2",
            false,
            true,
            &["192.168.1.1", "192.168.1.2"],
            Some("192.168.0.254"),
        ),
        (
            "192.168.0.10-192.168.0.11,192.168.1.20-192.168.1.21",
            false,
            false,
            &["192.168.0.9", "192.168.0.10"],
            Some("192.168.0.11"),
        ),
        (
            "192.168.0.10-192.168.0.11,192.168.1.20-192.168.1.22",
            false,
            true,
            &["192.168.1.21", "192.168.1.22"],
            Some("192.168.1.20"),
        ),
        ("fe80::13-fe80::14", false, false, &[], Some("fe80::13")),
        ("fe80::13-fe80::14", false, true, &[], Some("fe80::14")),
        ("fe80::13-fe80::15", false, true, &[], Some("fe80::15")),
        (
            "fe80::ffff-fe80::1:3",
            false,
            false,
            &["fe80::ffff"],
            Some("fe80::1:0"),
        ),
        (
            "fe80::ffff-fe80::1:3",
            false,
            true,
            &["fe80::1:3", "fe80::1:2", "fe80::1:1", "fe80::1:0"],
            Some("fe80::ffff"),
        ),
        (
            "fe80::10-fe80::12,fe81::20-fe81::21",
            false,
            false,
            &["fe80::10", "fe80::11", "fe80::12"],
            Some("fe81::20"),
        ),
        (
            "fe80::10-fe80::12,fe81::20-fe81::21",
            false,
            true,
            &["fe81::21", "fe81::20"],
            Some("fe80::12"),
        ),
        ("192.168.0.200/30", false, false, &[], Some("192.168.0.200")),
        ("192.168.0.200/30", true, false, &[], Some("192.168.0.201")),
        ("192.168.0.200/30", false, true, &[], Some("192.168.0.203")),
        ("192.168.0.200/30", true, true, &[], Some("192.168.0.202")),
        ("192.168.0.10/24", false, false, &[], Some("192.168.0.1")),
        ("192.168.0.10/24", false, true, &[], Some("192.168.0.254")),
        (
            "192.168.0.255/30",
            false,
            false,
            &["192.168.0.254", "192.168.0.252", "192.168.0.253"],
            None,
        ),
        (
            "192.168.0.255/30",
            false,
            true,
            &["192.168.0.254", "192.168.0.252", "192.168.0.253"],
            None,
        ),
        (
            "192.168.0.200/30,192.168.0.200/29",
            false,
            false,
            &["192.168.0.201", "192.168.0.202"],
            Some("192.168.0.200"),
        ),
        (
            "192.168.0.200/30,192.168.0.200/29",
            true,
            false,
            &["192.168.0.201", "192.168.0.202"],
            Some("192.168.0.203"),
        ),
        (
            "192.168.0.200/30,192.168.0.200/29",
            false,
            true,
            &["192.168.0.201", "192.168.0.202"],
            Some("192.168.0.207"),
        ),
        (
            "192.168.0.200/30,192.168.0.200/29",
            true,
            true,
            &["192.168.0.201", "192.168.0.202"],
            Some("192.168.0.206"),
        ),
        ("2001::49fe/127", false, false, &[], Some("2001::49fe")),
        ("2001::49fe/127", true, false, &[], Some("2001::49fe")),
        ("2001::49fe/127", false, true, &[], Some("2001::49ff")),
        (
            "2001::49fe/127",
            false,
            false,
            &["2001::49fe", "2001::49ff"],
            None,
        ),
        (
            "2001::49fe/127",
            false,
            true,
            &["2001::49fe", "2001::49ff"],
            None,
        ),
        (
            "2001::10/126,2001::12/127",
            false,
            false,
            &["2001::10", "2001::11"],
            Some("2001::12"),
        ),
        (
            "2001::10/126,2001::12/127",
            false,
            true,
            &["2001::10", "2001::11"],
            Some("2001::13"),
        ),
        (
            "10.10.10.8/29",
            false,
            false,
            &["10.10.10.8", "10.10.10.9", "10.10.10.10", "10.10.10.12"],
            Some("10.10.10.11"),
        ),
        (
            "192.168.1.1/24",
            false,
            false,
            &[
                "10.10.10.8",
                "172.16.0.3",
                "192.168.1.1",
                "10.10.10.9",
                "192.168.1.2",
            ],
            Some("192.168.1.3"),
        ),
        (
            "fe80::10/126",
            false,
            false,
            &["fe80::10", "fe80::11", "fe80::12"],
            Some("fe80::13"),
        ),
        (
            "10.10.10.8-10.10.10.15",
            false,
            false,
            &["10.10.10.8", "10.10.10.9", "10.10.10.10", "10.10.10.12"],
            Some("10.10.10.11"),
        ),
        (
            "fe80::ffff-fe80::1:3",
            false,
            false,
            &["fe80::ffff", "fe80::1:0", "fe80::1:1"],
            Some("fe80::1:2"),
        ),
    ];
    for (value, skip, desc, used, want) in table {
        let pool = one(value, *skip);
        let used: Vec<IpAddr> = used.iter().map(|a| ip(a)).collect();
        let family = pool.families()[0];
        let got = pool.addresses(family, *desc).find(|a| !used.contains(a));
        assert_eq!(got, want.map(ip), "{value} skip={skip} desc={desc}");
    }
}

/// KVCP `discoverPool` (`Test_DiscoveryPoolCIDR`, `Test_DiscoveryPoolRange`): cidr-ns >
/// cidr-global > range-ns > range-global.
#[test]
fn pool_precedence() {
    #[allow(clippy::type_complexity)]
    let table: &[(&[(&str, &str)], &str, Option<&str>)] = &[
        (
            &[
                ("cidr-dummystart", "172.16.0.1/24"),
                ("cidr-global", "192.168.1.1/24"),
                ("cidr-system", "10.10.10.8/29"),
                ("cidr-dummyend", "172.16.0.2/24"),
                ("cidr-ipv6", "2001::10/127"),
            ],
            "system",
            Some("cidr-system"),
        ),
        (&[("cidr-ipv6", "2001::10/127")], "ipv6", Some("cidr-ipv6")),
        (
            &[
                ("cidr-system", "10.10.10.8/29"),
                ("cidr-global", "192.168.1.1/24"),
            ],
            "basic",
            Some("cidr-global"),
        ),
        (
            &[
                ("range-global", "192.168.1.1-192.168.1.254"),
                ("range-system", "10.10.10.8-10.10.10.15"),
            ],
            "system",
            Some("range-system"),
        ),
        (
            &[
                ("range-global", "192.168.1.1-192.168.1.254"),
                ("range-system", "10.10.10.8-10.10.10.15"),
            ],
            "basic",
            Some("range-global"),
        ),
        // KVCP's surprise, kept: cidr-global beats range-<ns>.
        (
            &[
                ("cidr-global", "10.0.0.0/24"),
                ("range-shop", "10.1.0.1-10.1.0.9"),
            ],
            "shop",
            Some("cidr-global"),
        ),
        (
            &[
                ("cidr-shop", "10.2.0.0/24"),
                ("range-shop", "10.1.0.1-10.1.0.9"),
            ],
            "shop",
            Some("cidr-shop"),
        ),
        (&[("range-shop", "10.1.0.1-10.1.0.9")], "other", None),
        (
            &[("search-order", "desc"), ("allow-share-global", "true")],
            "a",
            None,
        ),
        (&[], "a", None),
    ];
    for (pairs, ns, want) in table {
        let b = book(pairs);
        let got = b.pool_for(ns).map(|p| p.unwrap().key.to_string());
        assert_eq!(got.as_deref(), *want, "{pairs:?} {ns}");
    }
}

/// The key names the pool; the value's syntax is decided by a `/`, as in KVCP (its own
/// test data has `cidr-ipv6: 2001::10-2001::20`).
#[test]
fn the_value_decides_cidrs_or_ranges() {
    let b = book(&[
        ("cidr-ipv6", "2001::10-2001::20"),
        ("range-x", "10.0.0.0/30"),
    ]);
    let v6 = b.pool_for("ipv6").unwrap().unwrap();
    assert_eq!(v6.key.kind, PoolKind::Cidr);
    assert_eq!(v6.size(Family::V6), 17);
    let x = b.pool_for("x").unwrap().unwrap();
    assert_eq!(all(x), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
}

#[test]
fn settings_follow_kvcp() {
    let b = book(&[
        ("allow-share-system", "true"),
        ("allow-share-global", "True"),
        ("allow-share-odd", "maybe"),
        ("allow-share-no", "0"),
        ("interface-global", "eth0"),
        ("interface-shop", "eth1"),
        ("interface-quiet", ""),
    ]);
    assert!(b.allow_share("system"));
    assert!(b.allow_share("elsewhere"), "global True (ParseBool)");
    assert!(
        !b.allow_share("odd"),
        "a bad namespace value is false, no fallback"
    );
    assert!(!b.allow_share("no"));
    assert_eq!(b.interface("shop"), Some("eth1"));
    assert_eq!(b.interface("elsewhere"), Some("eth0"));
    assert_eq!(
        b.interface("quiet"),
        None,
        "an empty namespace key hides the global one"
    );
    assert!(!book(&[("allow-share-global", "yes")]).allow_share("a"));
    assert!(!book(&[]).allow_share("a"));
    assert_eq!(book(&[]).interface("a"), None);

    for (value, desc) in [
        ("desc", true),
        ("DESC", false),
        ("asc", false),
        (" desc", false),
    ] {
        assert_eq!(
            book(&[("search-order", value)]).search_desc(),
            desc,
            "{value}"
        );
    }
    for (value, skip) in [
        ("true", true),
        ("True", false),
        ("1", false),
        ("false", false),
    ] {
        assert_eq!(
            book(&[("skip-end-ips-in-cidr", value)]).skip_end(),
            skip,
            "{value}"
        );
    }
    assert!(!book(&[]).search_desc() && !book(&[]).skip_end());
}

#[test]
fn dhcp_pool() {
    for value in ["0.0.0.0/32", " 0.0.0.0/32 "] {
        let pool = one(value, false);
        assert!(pool.dhcp, "{value:?}");
        assert!(pool.families().is_empty());
        assert_eq!(pool.size(Family::V4), 0);
        assert!(!pool.contains(ip("0.0.0.0")));
        assert_eq!(pool.text, value);
    }
    let not = one("0.0.0.0/31", false);
    assert!(!not.dhcp);
    assert_eq!(all(&not), ["0.0.0.1"]);
}

#[test]
fn whitespace_is_trimmed() {
    let table: &[(&str, &[&str])] = &[
        ("10.0.0.1/32, 10.0.0.2/32", &["10.0.0.1", "10.0.0.2"]),
        (" 10.0.0.1/32 ,\t10.0.0.2/32\n", &["10.0.0.1", "10.0.0.2"]),
        (
            "10.0.0.1-10.0.0.2, 10.0.0.5 - 10.0.0.5",
            &["10.0.0.1", "10.0.0.2", "10.0.0.5"],
        ),
    ];
    for (value, want) in table {
        assert_eq!(all(&one(value, false)), *want, "{value:?}");
    }
}

/// Malformed values and key names: an error naming key, entry and reason, never a panic,
/// and the other keys unaffected.
#[test]
fn malformed_keys_are_errors_for_their_key_only() {
    let table: &[(&str, &str, &str)] = &[
        (
            "cidr-global",
            "10.0.0.0/33",
            "key cidr-global: \"10.0.0.0/33\" is not a CIDR (prefix length 33 > 32)",
        ),
        (
            "cidr-global",
            "::/129",
            "\"::/129\" is not a CIDR (prefix length 129 > 128)",
        ),
        (
            "cidr-global",
            "10.0.0.0/24,,10.0.1.0/24",
            "\"\" is an empty entry",
        ),
        ("cidr-global", "10.0.0.0/24,", "\"\" is an empty entry"),
        (
            "range-global",
            ",10.0.0.1-10.0.0.2",
            "\"\" is an empty entry",
        ),
        ("cidr-global", "", "\"\" is empty"),
        ("cidr-global", "   ", "\"\" is empty"),
        (
            "cidr-global",
            "10.0.1.0/24,10.0.0.1-10.0.0.5",
            "is a range in a list of CIDRs",
        ),
        (
            "cidr-global",
            "10.0.1.0/24,10.0.0.1",
            "\"10.0.0.1\" is not a CIDR (no prefix",
        ),
        (
            "cidr-global",
            "10.0.0.0/",
            "prefix length \"\" is not a number",
        ),
        (
            "cidr-global",
            "10.0.0.0/+8",
            "prefix length \"+8\" is not a number",
        ),
        (
            "cidr-global",
            "10.0.0.0/-1",
            "prefix length \"-1\" is not a number",
        ),
        (
            "cidr-global",
            "10.0.0.0/0008",
            "prefix length \"0008\" is not a number",
        ),
        ("cidr-global", "/24", "\"\" is not an IP address"),
        (
            "cidr-global",
            "host.example/24",
            "\"host.example\" is not an IP address",
        ),
        ("cidr-global", "fe80::1%eth0/64", "is not an IP address"),
        (
            "cidr-global",
            "10.0.0.0/24 10.0.1.0/24",
            "prefix length \"24 10.0.1.0/24\"",
        ),
        ("cidr-global", "0.0.0.0/32,10.0.0.0/24", "asks for DHCP"),
        (
            "range-global",
            "10.0.0.5-10.0.0.1",
            "start is after its end",
        ),
        (
            "range-global",
            "10.0.0.1-fd00::1",
            "starts IPv4 and ends IPv6",
        ),
        (
            "range-global",
            "10.0.0.1-10.0.0.2-10.0.0.3",
            "is not a range (write start-end",
        ),
        (
            "range-global",
            "10.0.0.1",
            "is not a range (write start-end",
        ),
        ("range-global", "hello", "is not a range"),
        ("range-global", "10.0.0.1-", "\"\" is not an IP address"),
        (
            "range-global",
            "１０.0.0.1-10.0.0.2",
            "is not an IP address",
        ),
        ("range-global", "010.0.0.1-10.0.0.2", "is not an IP address"),
        ("range-global", "10.0.0.1..10.0.0.2", "is not a range"),
        (
            "cidr-",
            "10.0.0.0/24",
            "key cidr-: \"\" is an empty namespace part",
        ),
        ("range-", "10.0.0.1-10.0.0.2", "empty namespace part"),
        (
            "cidr-Shop",
            "10.0.0.0/24",
            "\"Shop\" is not a namespace name",
        ),
        ("cidr-a_b", "10.0.0.0/24", "\"a_b\" is not a namespace name"),
        ("cidr--a", "10.0.0.0/24", "\"-a\" is not a namespace name"),
    ];
    for (key, value, want) in table {
        let b = book(&[(key, value), ("cidr-fine", "192.0.2.0/30")]);
        let problems = b.problems();
        assert_eq!(problems.len(), 1, "{key}={value:?}");
        let e = problems[0];
        let shown = e.to_string();
        assert!(shown.contains(want), "{key}={value:?}: {shown}");
        assert!(shown.starts_with(&format!("key {key}: ")), "{shown}");
        assert_eq!((e.key.as_str(), e.value.as_str()), (*key, *value));
        assert!(!b.is_empty());
        assert_eq!(b.pools().count(), 2);
        let fine = b.pool_for("fine").unwrap().unwrap();
        assert_eq!(all(fine), ["192.0.2.1", "192.0.2.2", "192.0.2.3"]);
    }
    let long = format!("cidr-{}", "a".repeat(64));
    let b = book(&[(&long, "10.0.0.0/24")]);
    assert!(b.problems()[0].reason.contains("not a namespace name"));
    // A malformed namespace key applies to its namespace: no fallback to the global pool.
    let b = book(&[("cidr-shop", "10.0.0.0/33"), ("cidr-global", "10.1.0.0/24")]);
    assert!(b.pool_for("shop").unwrap().is_err());
    assert!(b.pool_for("web").unwrap().is_ok());
}

#[test]
fn unknown_keys_are_ignored() {
    let b = book(&[
        ("kubevip-services", "{}"),
        ("cidr", "10.0.0.0/24"),
        ("cidrs-global", "10.0.0.0/24"),
        ("foo", "bar"),
    ]);
    assert!(b.is_empty());
    assert_eq!(b.pools().count(), 0);
    assert!(b.problems().is_empty());
    assert!(b.pool_for("default").is_none());
}

#[test]
fn size_contains_and_families() {
    let p = one("10.0.0.0/24", false);
    assert_eq!(p.size(Family::V4), 254);
    assert_eq!(p.size(Family::V6), 0);
    assert_eq!(p.families(), [Family::V4]);
    assert!(p.contains(ip("10.0.0.1")) && p.contains(ip("10.0.0.254")));
    assert!(!p.contains(ip("10.0.0.0")) && !p.contains(ip("10.0.0.255")));
    assert!(p.covers(ip("10.0.0.0")) && !p.covers(ip("10.0.1.1")));
    assert!(
        !p.contains(ip("::ffff:10.0.0.1")),
        "IPv4-mapped IPv6 is IPv6 to a pool"
    );

    assert_eq!(one("10.0.0.0/16", false).size(Family::V4), 65536 - 2 * 256);
    assert_eq!(one("10.0.0.0/16", true).size(Family::V4), 65536 - 2 * 256);
    assert_eq!(
        one("0.0.0.0/0", false).size(Family::V4),
        (1u128 << 32) - 2 * (1 << 24)
    );
    assert_eq!(one("fd00::/64", false).size(Family::V6), 1u128 << 64);
    assert_eq!(one("::/0", false).size(Family::V6), u128::MAX, "saturates");
    assert_eq!(one("::/1,8000::/1", false).size(Family::V6), u128::MAX);

    let dual = one("fd00::1/128,10.0.0.1/32", false);
    assert_eq!(dual.families(), [Family::V4, Family::V6]);
    let v6 = one("fd00::/120", false);
    assert_eq!(v6.families(), [Family::V6]);
    assert_eq!(v6.addresses(Family::V4, false).count(), 0);
    // A family whose entries hold only skipped addresses still counts (exhausted at once).
    let dead = one("10.0.0.255/32", false);
    assert_eq!(
        (dead.families(), dead.size(Family::V4)),
        (vec![Family::V4], 0)
    );
}

#[test]
fn descending_order_walks_ranges_from_the_last() {
    let p = one("10.0.0.1-10.0.0.2,10.0.1.254-10.0.2.1", false);
    let down: Vec<String> = p
        .addresses(Family::V4, true)
        .map(|a| a.to_string())
        .collect();
    assert_eq!(down, ["10.0.2.1", "10.0.1.254", "10.0.0.2", "10.0.0.1"]);
    // Large pools are walked lazily.
    let big = one("::/0", false);
    assert_eq!(
        big.addresses(Family::V6, true).next(),
        Some(ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
    );
    assert_eq!(big.addresses(Family::V6, false).nth(2), Some(ip("::2")));
}

#[test]
fn pool_keys_display_as_written() {
    for key in [
        "cidr-global",
        "range-global",
        "cidr-shop",
        "range-kube-system",
    ] {
        assert_eq!(PoolKey::from_key(key).unwrap().to_string(), key);
    }
    assert_eq!(
        PoolKey::from_key("range-shop"),
        Some(PoolKey {
            kind: PoolKind::Range,
            scope: Scope::Namespace("shop".into())
        })
    );
    for other in [
        "cidr",
        "range",
        "allow-share-global",
        "interface-shop",
        "search-order",
    ] {
        assert_eq!(PoolKey::from_key(other), None, "{other}");
    }
    assert_eq!(Family::from_k8s("IPv6"), Some(Family::V6));
    assert_eq!(Family::from_k8s("ipv6"), None);
    assert_eq!(Family::V4.to_string(), "IPv4");
}

/// Odd bytes anywhere in a value give an error or a pool, never a panic.
#[test]
fn odd_values_never_panic() {
    let pieces = [
        "",
        ",",
        "-",
        "/",
        " ",
        "10.0.0.1",
        "fd00::1",
        "/32",
        "/0",
        "/128",
        "/999999999999",
        "-10.0.0.9",
        "::",
        "0.0.0.0",
        "255.255.255.255",
        "\u{0}",
        "é",
        "%",
        "1e3",
    ];
    for a in pieces {
        for b in pieces {
            for c in pieces {
                let value = format!("{a}{b}{c}");
                let bk = book(&[("cidr-global", &value), ("skip-end-ips-in-cidr", "true")]);
                if let Some(Ok(p)) = bk.pool_for("x") {
                    let _ = p.size(Family::V4) + p.size(Family::V6);
                    let _ = p.addresses(Family::V4, true).take(3).count();
                }
            }
        }
    }
}
