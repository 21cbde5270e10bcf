use super::*;

fn v(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn json(b: &NftBatch) -> serde_json::Value {
    serde_json::from_str(&b.to_json()).unwrap()
}

#[test]
fn setup_batch_json_and_text() {
    let b = setup_batch();
    let j = json(&b);
    let cmds = j["nftables"].as_array().unwrap();
    assert_eq!(cmds.len(), 7);
    assert_eq!(b.text.len(), 7);
    assert_eq!(
        cmds[0],
        serde_json::json!({"add": {"table": {"family": "arp", "name": "vipd"}}})
    );
    assert_eq!(
        cmds[1],
        serde_json::json!({"delete": {"table": {"family": "arp", "name": "vipd"}}})
    );
    assert_eq!(
        cmds[4]["add"]["set"]["type"],
        serde_json::json!(["ipv4_addr", "ifname"])
    );
    let chain = &cmds[5]["add"]["chain"];
    assert_eq!(chain["hook"], "input");
    assert_eq!(chain["policy"], "accept");
    assert_eq!(chain["type"], "filter");
    let expr = cmds[6]["add"]["rule"]["expr"].as_array().unwrap();
    assert_eq!(
        expr[0]["match"],
        serde_json::json!({"op": "==", "left": {"payload": {"protocol": "arp", "field": "operation"}}, "right": "request"})
    );
    assert_eq!(expr[1]["match"]["right"], "@vips");
    assert_eq!(
        expr[2]["match"],
        serde_json::json!({"op": "!=", "left": {"concat": [{"payload": {"protocol": "arp", "field": "daddr ip"}}, {"meta": {"key": "iifname"}}]}, "right": "@pinned"})
    );
    assert!(expr[4].get("drop").is_some(), "{expr:?}");
    assert!(b.command().ends_with("iifname != @pinned counter drop"));
    // Only vipd's own table is ever named.
    assert!(
        cmds.iter()
            .all(|c| c.to_string().contains(r#""family":"arp""#)
                && (c.to_string().contains(r#""table":"vipd""#)
                    || c.to_string().contains(r#""name":"vipd""#))),
        "{cmds:?}"
    );
}

#[test]
fn pin_and_unpin_batches() {
    let b = pin_batch(v("192.0.2.10"), "eth0", true);
    assert_eq!(
        json(&b),
        serde_json::json!({"nftables": [
            {"add": {"element": {"family": "arp", "table": "vipd", "name": "pinned",
                "elem": [{"concat": ["192.0.2.10", "eth0"]}]}}},
            {"add": {"element": {"family": "arp", "table": "vipd", "name": "vips",
                "elem": ["192.0.2.10"]}}}
        ]})
    );
    assert_eq!(
        b.command(),
        "add element arp vipd pinned { 192.0.2.10 . \"eth0\" }; add element arp vipd vips { 192.0.2.10 }"
    );
    assert_eq!(pin_batch(v("192.0.2.10"), "eth1", false).objects.len(), 1);
    let u = unpin_batch(v("192.0.2.10"), "eth0", true);
    let j = json(&u);
    assert_eq!(j["nftables"][0]["delete"]["element"]["name"], "vips");
    assert_eq!(j["nftables"][1]["delete"]["element"]["name"], "pinned");
    assert_eq!(unpin_batch(v("192.0.2.10"), "eth0", false).objects.len(), 1);
    assert_eq!(
        remove_batch().command(),
        "add table arp vipd; delete table arp vipd"
    );
}

#[test]
fn pin_counts_first_pin_and_last_unpin_only() {
    let (vip, other) = (v("192.0.2.10"), v("192.0.2.20"));
    let mut c = PinCounts::default();
    let b = c
        .pin_batch(vip, "eth0")
        .expect("first pin changes the table");
    assert_eq!(b.objects.len(), 2, "pair and VIP");
    c.pinned(vip, "eth0");
    assert!(c.pin_batch(vip, "eth0").is_none(), "second holder: counted");
    c.pinned(vip, "eth0");
    assert_eq!(c.count(vip, "eth0"), 2);
    // The same VIP on another interface: the pair only.
    assert_eq!(c.pin_batch(vip, "eth1").unwrap().objects.len(), 1);
    assert_eq!(c.pin_batch(other, "eth0").unwrap().objects.len(), 2);
    assert!(c.unpin_batch(vip, "eth0").is_none(), "one pin remains");
    c.unpinned(vip, "eth0");
    let u = c.unpin_batch(vip, "eth0").expect("last unpin");
    assert_eq!(u.objects.len(), 2, "VIP and pair");
    c.pinned(vip, "eth1");
    assert_eq!(
        c.unpin_batch(vip, "eth0").unwrap().objects.len(),
        1,
        "eth1 keeps the VIP pinned"
    );
    c.unpinned(vip, "eth0");
    c.unpinned(vip, "eth1");
    assert_eq!(c, PinCounts::default());
    assert!(c.unpin_batch(vip, "eth0").is_none(), "not pinned: nothing");
    c.unpinned(vip, "eth0");
    assert_eq!(c, PinCounts::default());
}

#[test]
fn holder_pin_changes() {
    let (a, b) = (v("192.0.2.10"), v("192.0.2.20"));
    let p = |x: Ipv4Addr, i: &str| (x, i.to_string());
    // First resolve: pin both.
    let (add, del) = pin_changes(&[], &[p(a, "eth0"), p(b, "eth0")], &[a, b]);
    assert_eq!(add, vec![p(a, "eth0"), p(b, "eth0")]);
    assert!(del.is_empty());
    // b left the set: unpinned.
    let (add, del) = pin_changes(&[p(a, "eth0"), p(b, "eth0")], &[p(a, "eth0")], &[a]);
    assert!(add.is_empty());
    assert_eq!(del, vec![p(b, "eth0")]);
    // a's interface not resolved this time but a still configured: kept.
    let (add, del) = pin_changes(&[p(a, "eth0")], &[], &[a]);
    assert!(add.is_empty() && del.is_empty());
    // a moved to eth1: pin eth1, unpin eth0.
    let (add, del) = pin_changes(&[p(a, "eth0")], &[p(a, "eth1")], &[a]);
    assert_eq!((add, del), (vec![p(a, "eth1")], vec![p(a, "eth0")]));
    // Duplicates in want are pinned once.
    let (add, _) = pin_changes(&[], &[p(a, "eth0"), p(a, "eth0")], &[a]);
    assert_eq!(add.len(), 1);
}

#[tokio::test]
async fn missing_nft_binary_is_a_setup_error_naming_the_command() {
    let e = NftArpGuard::start("/nonexistent/nft").await.unwrap_err();
    let s = e.to_string();
    assert!(s.contains("add table arp vipd"), "{s}");
    assert!(s.contains("install the nftables package"), "{s}");
}

#[tokio::test]
async fn noop_guard_accepts_everything() {
    let g = NoopArpGuard::default();
    assert!(!g.active());
    g.pin(v("192.0.2.10"), "eth0").await.unwrap();
    g.unpin(v("192.0.2.10"), "eth0").await.unwrap();
    g.close().await.unwrap();
}
