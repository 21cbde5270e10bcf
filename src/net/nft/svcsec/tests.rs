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

#[test]
fn setup_replaces_the_table_and_names_no_other() {
    let c = setup_commands();
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
    let c = change_commands(&from, &to);
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
    let c = change_commands(&BTreeSet::new(), &from);
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let t = NftSvcSec::start(crate::net::nft::run::fake_nft(dir))
        .await
        .unwrap();
    let a = ip("192.0.2.10");
    let want = set(&[Element::Guard(a), Element::Allow(a, L4::Tcp, 80)]);
    std::fs::write(dir.join("fail"), "").unwrap();
    let e = t.apply(&want).await.unwrap_err();
    assert!(matches!(e, SvcSecError::Change { .. }), "{e}");
    assert!(e.to_string().contains("boom"), "{e}");
    assert!(t.applied().await.is_empty());
    std::fs::remove_file(dir.join("fail")).unwrap();
    assert!(t.apply(&want).await.unwrap());
    assert_eq!(t.applied().await, want);
    assert!(!t.apply(&want).await.unwrap(), "nothing to change");
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    let runs: Vec<&str> = log.split("---\n").filter(|r| !r.is_empty()).collect();
    assert_eq!(runs.len(), 3, "setup, failed apply, apply: {log}");
    assert!(runs[2].contains("add element inet vipd_svcsec guard4 { 192.0.2.10 }"));
    t.close().await.unwrap();
    assert!(t.applied().await.is_empty());
}
