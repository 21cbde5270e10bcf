use super::*;

fn rule() -> SnatRule {
    SnatRule {
        service: "default/web".into(),
        vip: "192.0.2.50".parse().unwrap(),
        source: "198.51.100.11".parse().unwrap(),
        excluded: vec![
            "10.42.0.0/16".parse().unwrap(),
            "10.43.0.0/16".parse().unwrap(),
        ],
        allowed: Some("203.0.113.0/24".parse().unwrap()),
        port: Some((L4::Tcp, 8080)),
    }
}

#[test]
fn snat_rule_text_names_every_filter_in_order() {
    assert_eq!(
        rule().to_string(),
        "meta nfproto ipv4 ip saddr 198.51.100.11 ip daddr != 10.42.0.0/16 \
         ip daddr != 10.43.0.0/16 ip daddr 203.0.113.0/24 meta l4proto 6 th dport 8080 \
         [ 192.0.2.50 in @live4 ] counter snat ip to 192.0.2.50"
    );
    let v6 = SnatRule {
        service: "default/web".into(),
        vip: "2001:db8::50".parse().unwrap(),
        source: "2001:db8:1::11".parse().unwrap(),
        excluded: vec![],
        allowed: None,
        port: None,
    };
    assert_eq!(
        v6.to_string(),
        "meta nfproto ipv6 ip6 saddr 2001:db8:1::11 [ 2001:db8::50 in @live6 ] counter snat ip6 to 2001:db8::50"
    );
}

#[test]
fn snat_expressions_gate_the_nat_on_the_live_set() {
    let e = snat_exprs(&rule());
    // nfproto (2), saddr (2), 2 exclusions and 1 allowed (3 each), port (4), snat (4).
    assert_eq!(e.len(), 2 + 2 + 9 + 4 + 4);
    let tail: Vec<String> = e[e.len() - 4..].iter().map(|x| format!("{x:?}")).collect();
    assert!(tail[0].contains("Immediate"), "{tail:?}");
    assert!(
        tail[1].contains("Lookup") && tail[1].contains("live4"),
        "{tail:?}"
    );
    assert!(
        !tail[1].contains("Flags"),
        "the SNAT lookup is not inverted: {tail:?}"
    );
    assert!(tail[3].contains("nat"), "{tail:?}");
    let g: Vec<String> = guard_exprs("2001:db8::50".parse().unwrap())
        .iter()
        .map(|x| format!("{x:?}"))
        .collect();
    assert!(
        g.iter()
            .any(|x| x.contains("live6") && x.contains("Flags(1)")),
        "{g:?}"
    );
}

#[test]
fn apply_replaces_every_chain_in_one_batch() {
    let table = EgressTable {
        snat: vec![rule()],
        guarded: vec!["192.0.2.50".parse().unwrap()],
    };
    let lines = apply_commands(&table).lines();
    assert_eq!(
        lines,
        vec![
            "add chain inet vipd_fence egress_snat { type nat hook postrouting priority 99; policy accept; }".to_string(),
            "add chain inet vipd_fence egress_guard { type filter hook postrouting priority 300; policy accept; }".to_string(),
            "add chain inet vipd_fence egress_moved { type filter hook forward priority filter; policy accept; }".to_string(),
            "flush chain inet vipd_fence egress_snat".to_string(),
            "flush chain inet vipd_fence egress_guard".to_string(),
            "flush chain inet vipd_fence egress_moved".to_string(),
            format!("add rule inet vipd_fence egress_snat {} comment \"default/web\"", rule()),
            "add rule inet vipd_fence egress_guard meta nfproto ipv4 ip saddr 192.0.2.50 ip saddr != @live4 counter drop".to_string(),
            "add rule inet vipd_fence egress_moved meta nfproto ipv4 meta l4proto tcp ct reply ip daddr 192.0.2.50 ct reply ip daddr != @live4 counter reject with tcp reset".to_string(),
        ]
    );
    // Empty: the chains are emptied, not left with old rules.
    assert_eq!(apply_commands(&EgressTable::default()).lines().len(), 6);
}

#[tokio::test]
async fn apply_sends_one_commit_and_names_the_commands_on_failure() {
    let rec = nl::Recorder::default();
    let nft = NftEgress::new(Arc::new(rec.clone()));
    nft.apply(&EgressTable::default()).await.unwrap();
    assert_eq!(rec.batches().len(), 1);
    rec.set_fail(true);
    let err = nft.apply(&EgressTable::default()).await.unwrap_err();
    assert!(err.to_string().contains("egress_snat"), "{err}");
}
