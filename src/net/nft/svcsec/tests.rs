use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn set(e: &[Element]) -> BTreeSet<Element> {
    e.iter().copied().collect()
}

#[test]
fn elements_are_written_as_nft_set_elements() {
    let cases = [
        (Element::Guard(ip("192.0.2.10")), "guard4 { 192.0.2.10 }"),
        (
            Element::Guard(ip("2001:db8::10")),
            "guard6 { 2001:db8::10 }",
        ),
        (
            Element::Allow(ip("192.0.2.10"), L4::Tcp, 80),
            "allow4 { 192.0.2.10 . 6 . 80 }",
        ),
        (
            Element::Allow(ip("192.0.2.10"), L4::Udp, 53),
            "allow4 { 192.0.2.10 . 17 . 53 }",
        ),
        (
            Element::Allow(ip("2001:db8::10"), L4::Sctp, 3868),
            "allow6 { 2001:db8::10 . 132 . 3868 }",
        ),
    ];
    for (e, text) in cases {
        assert_eq!(e.to_string(), text);
    }
    assert_eq!(L4::from_kubernetes("TCP"), Some(L4::Tcp));
    assert_eq!(L4::from_kubernetes("SCTP"), Some(L4::Sctp));
    assert_eq!(
        L4::from_kubernetes("tcp"),
        None,
        "the API's names are upper case"
    );
    assert_eq!(L4::from_kubernetes("ICMP"), None);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// What nftables 1.0.6 sends for the same commands (`nft --debug=mnl -f file` in a throwaway
// network namespace; the attributes after the `nfgenmsg` header, without the set id `nft`
// adds to element messages of existing sets).
/// `add rule inet vipd_svcsec input ip daddr . meta l4proto . th dport @allow4 accept`
const NFT_ALLOW4_RULE: &str = "10000100766970645f737663736563000a000200696e7075740000004001048024000180090001006d6574610000000014000280080002000000000f08000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010002000000340001800c0001007061796c6f61640024000280080001000000000108000200000000010800030000000010080004000000000424000180090001006d657461000000001400028008000200000000100800010000000009340001800c0001007061796c6f61640024000280080001000000000a080002000000000208000300000000020800040000000002300001800b0001006c6f6f6b757000002000028008000200000000010b000100616c6c6f773400000800040000000003300001800e000100696d6d6564696174650000001c0002800800010000000000100002800c0002800800010000000001";
/// `add rule inet vipd_svcsec input ip6 daddr . meta l4proto . th dport @allow6 accept`
const NFT_ALLOW6_RULE: &str = "10000100766970645f737663736563000a000200696e7075740000004001048024000180090001006d6574610000000014000280080002000000000f08000100000000012c00018008000100636d700020000280080001000000000108000200000000000c000380050001000a000000340001800c0001007061796c6f61640024000280080001000000000108000200000000010800030000000018080004000000001024000180090001006d657461000000001400028008000200000000100800010000000002340001800c0001007061796c6f61640024000280080001000000000d080002000000000208000300000000020800040000000002300001800b0001006c6f6f6b757000002000028008000200000000010b000100616c6c6f773600000800040000000004300001800e000100696d6d6564696174650000001c0002800800010000000000100002800c0002800800010000000001";
/// The anonymous `{ nd-neighbor-solicit, nd-neighbor-advert }` set, its elements, and
/// the rule using it.
const NFT_ND_SET: &str = "10000100766970645f737663736563000c0002005f5f7365742564000800030000000003080004000000001d080005000000000108000a00000000050c000980080001000000000220000d000004020000000314000407000000010c00040e000000010401000000";
/// (`nft` numbers the list's entries 1, 2; vipd gives each the type `NFTA_LIST_ELEM`, 1:
/// the kernel reads them by position, not type.)
const NFT_ND_ELEMENTS: &str = "10000100766970645f737663736563000c0002005f5f736574256400080004000000000524000380100001800c0001800500010087000000100001800c0001800500010088000000";
const NFT_ND_RULE: &str = "10000100766970645f737663736563000a000200696e7075740000009c01048024000180090001006d6574610000000014000280080002000000000f08000100000000012c00018008000100636d700020000280080001000000000108000200000000000c000380050001000a000000340001800c0001007061796c6f616400240002800800010000000001080002000000000108000300000000180800040000000010300001800b0001006c6f6f6b757000002000028008000200000000010b0001006775617264360000080004000000000224000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c000380050001003a000000340001800c0001007061796c6f616400240002800800010000000001080002000000000208000300000000000800040000000001300001800b0001006c6f6f6b757000002000028008000200000000010c0001005f5f7365742564000800040000000005300001800e000100696d6d6564696174650000001c0002800800010000000000100002800c0002800800010000000001";
/// `add element inet vipd_svcsec allow4 { 192.0.2.10 . 6 . 80 }`
const NFT_ALLOW4_ELEMENT: &str = "10000100766970645f737663736563000b000200616c6c6f773400001c000380180001801400018010000100c000020a0600000000500000";

#[test]
fn setup_and_elements_are_what_nft_sends() {
    let c = setup_commands();
    let find = |text: &str| {
        c.cmds()
            .iter()
            .find(|m| m.text().contains(text))
            .map(|m| hex(&m.payload()))
            .unwrap_or_else(|| panic!("{text} in {:#?}", c.lines()))
    };
    assert_eq!(find("@allow4 accept"), NFT_ALLOW4_RULE);
    assert_eq!(find("@allow6 accept"), NFT_ALLOW6_RULE);
    assert_eq!(find("add set inet vipd_svcsec __set%d"), NFT_ND_SET);
    assert_eq!(
        find("add element inet vipd_svcsec __set%d"),
        NFT_ND_ELEMENTS
    );
    assert_eq!(find("icmpv6 type"), NFT_ND_RULE);
    let e = change_commands(
        &BTreeSet::new(),
        &set(&[Element::Allow(ip("192.0.2.10"), L4::Tcp, 80)]),
    );
    assert_eq!(hex(&e.cmds()[0].payload()), NFT_ALLOW4_ELEMENT);
}

#[test]
fn setup_replaces_the_table_and_names_no_other() {
    let c = setup_commands().lines();
    assert_eq!(c[0], "add table inet vipd_svcsec");
    assert_eq!(c[1], "delete table inet vipd_svcsec");
    assert!(c.iter().all(|l| l.contains(" inet vipd_svcsec")), "{c:?}");
    let rules: Vec<&String> = c.iter().filter(|l| l.starts_with("add rule")).collect();
    // Allows before the DHCP accept, the drops last.
    assert!(rules[0].ends_with("@allow4 accept"));
    assert!(rules[2].ends_with("udp dport 68 accept"));
    assert!(rules[rules.len() - 1].ends_with("ip6 daddr @guard6 counter drop"));
    assert!(
        c.iter()
            .any(|l| l.contains("type filter hook input priority filter"))
    );
}

#[test]
fn changes_add_and_delete_only_the_difference() {
    let a = ip("192.0.2.10");
    let b = ip("192.0.2.11");
    let from = set(&[
        Element::Guard(a),
        Element::Allow(a, L4::Tcp, 80),
        Element::Guard(b),
        Element::Allow(b, L4::Udp, 53),
    ]);
    let to = set(&[
        Element::Guard(a),
        Element::Allow(a, L4::Tcp, 80),
        Element::Allow(a, L4::Tcp, 443),
    ]);
    let c = change_commands(&from, &to).lines();
    assert_eq!(
        c,
        vec![
            "add element inet vipd_svcsec guard4 { 192.0.2.11 }",
            "delete element inet vipd_svcsec guard4 { 192.0.2.11 }",
            "add element inet vipd_svcsec allow4 { 192.0.2.11 . 17 . 53 }",
            "delete element inet vipd_svcsec allow4 { 192.0.2.11 . 17 . 53 }",
            "add element inet vipd_svcsec allow4 { 192.0.2.10 . 6 . 443 }",
        ]
    );
    assert!(change_commands(&to, &to).is_empty());
    // New VIP: its allows go in before its guard.
    let c = change_commands(&BTreeSet::new(), &from).lines();
    let guard = c.iter().position(|l| l.contains("guard4 { 192.0.2.11 }"));
    let allow = c
        .iter()
        .position(|l| l.contains("allow4 { 192.0.2.11 . 17 . 53 }"));
    assert!(allow < guard, "{c:?}");
}

/// A failed run leaves the recorded content as it was, so the next apply sends the whole
/// difference again; an unchanged content runs nothing.
#[tokio::test]
async fn a_failed_apply_is_retried_whole() {
    let rec = crate::net::nft::nl::Recorder::default();
    let t = NftSvcSec::start_with(std::sync::Arc::new(rec.clone()))
        .await
        .unwrap();
    let a = ip("192.0.2.10");
    let want = set(&[Element::Guard(a), Element::Allow(a, L4::Tcp, 80)]);
    rec.set_fail(true);
    let e = t.apply(&want).await.unwrap_err();
    assert!(matches!(e, SvcSecError::Change { .. }), "{e}");
    assert!(e.to_string().contains("Invalid argument"), "{e}");
    assert!(t.applied().await.is_empty());
    rec.set_fail(false);
    assert!(t.apply(&want).await.unwrap());
    assert_eq!(t.applied().await, want);
    assert!(!t.apply(&want).await.unwrap(), "nothing to change");
    let runs: Vec<String> = rec.batches().iter().map(|b| b.lines().join("\n")).collect();
    assert_eq!(runs.len(), 3, "setup, failed apply, apply: {runs:#?}");
    assert!(runs[2].contains("add element inet vipd_svcsec guard4 { 192.0.2.10 }"));
    t.close().await.unwrap();
    assert!(t.applied().await.is_empty());
}
