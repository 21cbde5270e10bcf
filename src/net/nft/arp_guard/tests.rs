use super::*;

fn v(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// What nftables 1.0.6 sends for the same commands (`nft --debug=mnl -f file` in a throwaway
// network namespace; the attributes after the `nfgenmsg` header, without the set id `nft`
// adds to element messages).
/// `add set arp vipd pinned { type ipv4_addr . ifname; }` (set id 2)
const NFT_SET_PINNED: &str = "0900010076697064000000000b00020070696e6e65640000080003000000000008000400000001e9080005000000001408000a000000000214000d00000400000000030800040d0000000100";
/// `add rule arp vipd input arp operation request arp daddr ip @vips arp daddr ip . iifname != @pinned counter drop`
const NFT_RULE: &str = "0900010076697064000000000a000200696e7075740000009c010480340001800c0001007061796c6f6164002400028008000100000000010800020000000001080003000000000608000400000000022c00018008000100636d700020000280080001000000000108000200000000000c0003800600010000010000340001800c0001007061796c6f616400240002800800010000000001080002000000000108000300000000180800040000000004300001800b0001006c6f6f6b757000002000028008000200000000010900010076697073000000000800040000000001340001800c0001007061796c6f61640024000280080001000000000108000200000000010800030000000018080004000000000424000180090001006d657461000000001400028008000200000000060800010000000009380001800b0001006c6f6f6b757000002800028008000200000000010b00010070696e6e6564000008000400000000020800050000000001140001800c000100636f756e7465720004000280300001800e000100696d6d6564696174650000001c0002800800010000000000100002800c0002800800010000000000";
/// `add element arp vipd pinned { 192.0.2.10 . "eth0" }`
const NFT_PINNED_ELEMENT: &str = "0900010076697064000000000b00020070696e6e6564000024000380200001801c00018018000100c000020a65746830000000000000000000000000";

#[test]
fn setup_batch_bytes_and_text() {
    let b = setup_batch();
    assert_eq!(
        b.lines(),
        vec![
            "add table arp vipd",
            "delete table arp vipd",
            "add table arp vipd",
            "add set arp vipd vips { type ipv4_addr; }",
            "add set arp vipd pinned { type ipv4_addr . ifname; }",
            "add chain arp vipd input { type filter hook input priority filter; policy accept; }",
            "add rule arp vipd input arp operation request arp daddr ip @vips arp daddr ip . iifname != @pinned counter drop",
        ]
    );
    assert_eq!(hex(&b.cmds()[4].payload()), NFT_SET_PINNED);
    assert_eq!(hex(&b.cmds()[6].payload()), NFT_RULE);
}

#[test]
fn pin_and_unpin_batches() {
    let b = pin_batch(v("192.0.2.10"), "eth0", true);
    assert_eq!(
        b.text(),
        "add element arp vipd pinned { 192.0.2.10 . \"eth0\" }; add element arp vipd vips { 192.0.2.10 }"
    );
    assert_eq!(hex(&b.cmds()[0].payload()), NFT_PINNED_ELEMENT);
    assert_eq!(pin_batch(v("192.0.2.10"), "eth1", false).cmds().len(), 1);
    let u = unpin_batch(v("192.0.2.10"), "eth0", true);
    assert_eq!(
        u.lines(),
        vec![
            "delete element arp vipd vips { 192.0.2.10 }",
            "delete element arp vipd pinned { 192.0.2.10 . \"eth0\" }",
        ]
    );
    assert_eq!(unpin_batch(v("192.0.2.10"), "eth0", false).cmds().len(), 1);
    assert_eq!(
        remove_batch().text(),
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
    assert_eq!(b.cmds().len(), 2, "pair and VIP");
    c.pinned(vip, "eth0");
    assert!(c.pin_batch(vip, "eth0").is_none(), "second holder: counted");
    c.pinned(vip, "eth0");
    assert_eq!(c.count(vip, "eth0"), 2);
    // The same VIP on another interface: the pair only.
    assert_eq!(c.pin_batch(vip, "eth1").unwrap().cmds().len(), 1);
    assert_eq!(c.pin_batch(other, "eth0").unwrap().cmds().len(), 2);
    assert!(c.unpin_batch(vip, "eth0").is_none(), "one pin remains");
    c.unpinned(vip, "eth0");
    let u = c.unpin_batch(vip, "eth0").expect("last unpin");
    assert_eq!(u.cmds().len(), 2, "VIP and pair");
    c.pinned(vip, "eth1");
    assert_eq!(
        c.unpin_batch(vip, "eth0").unwrap().cmds().len(),
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
async fn a_refused_setup_is_an_error_naming_the_command() {
    let rec = crate::net::nft::nl::Recorder::default();
    rec.set_fail(true);
    let e = NftArpGuard::start_with(std::sync::Arc::new(rec))
        .await
        .unwrap_err();
    let s = e.to_string();
    assert!(s.contains("add table arp vipd"), "{s}");
    assert!(s.contains("Invalid argument"), "{s}");
}

#[tokio::test]
async fn noop_guard_accepts_everything() {
    let g = NoopArpGuard::default();
    assert!(!g.active());
    g.pin(v("192.0.2.10"), "eth0").await.unwrap();
    g.unpin(v("192.0.2.10"), "eth0").await.unwrap();
    g.close().await.unwrap();
}
