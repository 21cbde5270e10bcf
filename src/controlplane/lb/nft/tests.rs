//! The load balancer's transactions, byte for byte against what nftables 1.0.6 sends for
//! the same commands (`nft --debug=mnl -f file` in a throwaway network namespace; the
//! attributes after the `nfgenmsg` header). `nft` numbers a set's element list entries 1,
//! 2, ... where vipd gives each the type `NFTA_LIST_ELEM` (1; the kernel reads them by
//! position), and `nft` gave the IPv6 map the set id 2 where vipd gives 1 (any id unique in
//! the batch): the constants below carry vipd's.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn rs(backends: &[&str]) -> Ruleset {
    Ruleset {
        family: Family::Ip,
        vips: vec![ip("192.0.2.10")],
        lb_port: 6443,
        port: 6443,
        backends: backends.iter().map(|b| ip(b)).collect(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn payloads(b: &Batch) -> Vec<String> {
    b.cmds().iter().map(|c| hex(&c.payload())).collect()
}

/// `add chain ip vipd_lb prerouting { type nat hook prerouting priority dstnat; policy accept; }`
const NFT_PREROUTING_CHAIN: &str = "0c000100766970645f6c62000f000300707265726f7574696e670000080007006e617400080005000000000114000480080001000000000008000200ffffff9c";
/// `add chain ip vipd_lb postrouting { type nat hook postrouting priority srcnat; policy accept; }`
const NFT_POSTROUTING_CHAIN: &str = "0c000100766970645f6c620010000300706f7374726f7574696e6700080007006e61740008000500000000011400048008000100000000040800020000000064";
/// `add rule ip vipd_lb postrouting ct status dnat ct original ip daddr 192.0.2.10 counter masquerade`
const NFT_MASQ4: &str = "0c000100766970645f6c620010000200706f7374726f7574696e6700100104802000018007000100637400001400028008000200000000020800010000000001440001800c0001006269747769736500340002800800010000000001080002000000000108000300000000040c00048008000100200000000c00058008000100000000002c00018008000100636d700020000280080001000000000108000200000000010c00038008000100000000002800018007000100637400001c0002800800020000000014080001000000000105000300000000002c00018008000100636d700020000280080001000000000108000200000000000c00038008000100c000020a140001800c000100636f756e746572000400028014000180090001006d6173710000000004000280";
/// The anonymous map of the rule below (set id 1).
const NFT_MAP4: &str = "0c000100766970645f6c62000c0002005f5f6d6170256400080003000000000b080004000000000408000500000000040800060000000007080007000000000408000a00000000010c000980080001000000000316000d000004010000000104020000000604000000000000";
/// Its elements `0 : 192.0.2.11, 1 : 192.0.2.12, 2 : 192.0.2.13`.
const NFT_MAP4_ELEMENTS: &str = "0c000100766970645f6c62000c0002005f5f6d61702564000800040000000001580003801c0001800c00018008000100000000000c00028008000100c000020b1c0001800c00018008000100010000000c00028008000100c000020c1c0001800c00018008000100020000000c00028008000100c000020d";
/// `add rule ip vipd_lb prerouting ip daddr 192.0.2.10 fib daddr type local tcp dport 6443 counter dnat to numgen inc mod 3 map { 0 : 192.0.2.11, 1 : 192.0.2.12, 2 : 192.0.2.13 }:6443`
const NFT_DNAT4: &str = "0c000100766970645f6c62000f000200707265726f7574696e6700004c020480340001800c0001007061796c6f6164002400028008000100000000010800020000000001080003000000001008000400000000042c00018008000100636d700020000280080001000000000108000200000000000c00038008000100c000020a2800018008000100666962001c0002800800030000000002080002000000000308000100000000012c00018008000100636d700020000280080001000000000108000200000000000c000380080001000200000024000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010006000000340001800c0001007061796c6f6164002400028008000100000000010800020000000002080003000000000208000400000000022c00018008000100636d700020000280080001000000000108000200000000000c00038006000100192b0000140001800c000100636f756e7465720004000280340001800b0001006e756d67656e0000240002800800010000000001080002000000000308000300000000000800040000000000380001800b0001006c6f6f6b7570000028000280080002000000000108000300000000010c0001005f5f6d617025640008000400000000012c0001800e000100696d6d6564696174650000001800028008000100000000020c00028006000100192b000038000180080001006e6174002c00028008000100000000010800020000000002080003000000000108000500000000020800070000000002";
/// `add rule ip6 vipd_lb postrouting ct status dnat ct original ip6 daddr 2001:db8::10 counter masquerade`
const NFT_MASQ6: &str = "0c000100766970645f6c620010000200706f7374726f7574696e67001c0104802000018007000100637400001400028008000200000000020800010000000001440001800c0001006269747769736500340002800800010000000001080002000000000108000300000000040c00048008000100200000000c00058008000100000000002c00018008000100636d700020000280080001000000000108000200000000010c00038008000100000000002800018007000100637400001c0002800800020000000016080001000000000105000300000000003800018008000100636d70002c00028008000100000000010800020000000000180003801400010020010db8000000000000000000000010140001800c000100636f756e746572000400028014000180090001006d6173710000000004000280";
/// The anonymous map of the rule below.
const NFT_MAP6: &str = "0c000100766970645f6c62000c0002005f5f6d6170256400080003000000000b080004000000000408000500000000040800060000000008080007000000001008000a00000000010c000980080001000000000216000d000004010000000104020000000604000000000000";
/// Its elements `0 : 2001:db8::11, 1 : 2001:db8::12`.
const NFT_MAP6_ELEMENTS: &str = "0c000100766970645f6c62000c0002005f5f6d6170256400080004000000000154000380280001800c0001800800010000000000180002801400010020010db8000000000000000000000011280001800c0001800800010001000000180002801400010020010db8000000000000000000000012";
/// `add rule ip6 vipd_lb prerouting ip6 daddr 2001:db8::10 fib daddr type local tcp dport 6443 counter dnat to numgen inc mod 2 map { 0 : 2001:db8::11, 1 : 2001:db8::12 }:8443`
const NFT_DNAT6: &str = "0c000100766970645f6c62000f000200707265726f7574696e67000058020480340001800c0001007061796c6f6164002400028008000100000000010800020000000001080003000000001808000400000000103800018008000100636d70002c00028008000100000000010800020000000000180003801400010020010db80000000000000000000000102800018008000100666962001c0002800800030000000002080002000000000308000100000000012c00018008000100636d700020000280080001000000000108000200000000000c000380080001000200000024000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010006000000340001800c0001007061796c6f6164002400028008000100000000010800020000000002080003000000000208000400000000022c00018008000100636d700020000280080001000000000108000200000000000c00038006000100192b0000140001800c000100636f756e7465720004000280340001800b0001006e756d67656e0000240002800800010000000001080002000000000208000300000000000800040000000000380001800b0001006c6f6f6b7570000028000280080002000000000108000300000000010c0001005f5f6d617025640008000400000000012c0001800e000100696d6d6564696174650000001800028008000100000000020c0002800600010020fb000038000180080001006e6174002c0002800800010000000001080002000000000a080003000000000108000500000000020800070000000002";

/// The whole install is what `nft -f` sends for the documented ruleset: the stale table
/// replaced, both NAT chains, the masquerade rule, the backend map and the DNAT rule.
#[test]
fn install_batch_is_what_nft_sends_for_the_documented_ruleset() {
    let b = install_batch(&rs(&["192.0.2.11", "192.0.2.12", "192.0.2.13"]));
    assert_eq!(
        b.lines(),
        vec![
            "add table ip vipd_lb",
            "delete table ip vipd_lb",
            "add table ip vipd_lb",
            "add chain ip vipd_lb prerouting { type nat hook prerouting priority dstnat; policy accept; }",
            "add chain ip vipd_lb postrouting { type nat hook postrouting priority srcnat; policy accept; }",
            "add rule ip vipd_lb postrouting ct status dnat ct original ip daddr 192.0.2.10 counter masquerade",
            "add map ip vipd_lb __map%d { type integer : ipv4_addr; flags constant; }",
            "add element ip vipd_lb __map%d { 3 elements }",
            "add rule ip vipd_lb prerouting ip daddr 192.0.2.10 fib daddr type local tcp dport 6443 counter dnat to numgen inc mod 3 map { 0 : 192.0.2.11, 1 : 192.0.2.12, 2 : 192.0.2.13 }:6443",
        ]
    );
    let p = payloads(&b);
    assert_eq!(p[3], NFT_PREROUTING_CHAIN);
    assert_eq!(p[4], NFT_POSTROUTING_CHAIN);
    assert_eq!(p[5], NFT_MASQ4);
    assert_eq!(p[6], NFT_MAP4);
    assert_eq!(p[7], NFT_MAP4_ELEMENTS);
    assert_eq!(p[8], NFT_DNAT4);
    // Only vipd's own table is ever named.
    assert!(b.lines().iter().all(|l| l.contains(" ip vipd_lb")));
}

/// IPv6 VIPs get `table ip6 vipd_lb` with ip6 matches, an ipv6_addr map and an ip6 DNAT;
/// frontend and backend ports are the rule's (`VIP:lb_port` to `backend:port`).
#[test]
fn ipv6_install_with_other_ports_is_what_nft_sends() {
    let r = Ruleset {
        family: Family::Ip6,
        vips: vec![ip("2001:db8::10")],
        lb_port: 6443,
        port: 8443,
        backends: vec![ip("2001:db8::11"), ip("2001:db8::12")],
    };
    let b = install_batch(&r);
    let p = payloads(&b);
    assert_eq!(b.lines()[0], "add table ip6 vipd_lb");
    assert_eq!(p[5], NFT_MASQ6);
    assert_eq!(p[6], NFT_MAP6);
    assert_eq!(p[7], NFT_MAP6_ELEMENTS);
    assert_eq!(p[8], NFT_DNAT6);
    assert_eq!(
        remove_batch(Family::Ip6).lines(),
        vec!["add table ip6 vipd_lb", "delete table ip6 vipd_lb"]
    );
}

/// Without healthy backends there is no DNAT rule nor map (connections reach the holder
/// itself); the table and the masquerade rule stay.
#[test]
fn no_backends_no_dnat_rule() {
    let b = install_batch(&rs(&[]));
    assert_eq!(b.cmds().len(), 6, "{:#?}", b.lines());
    assert!(!b.text().contains("dnat to"), "{}", b.text());
    assert_eq!(
        update_batch(&rs(&[])).lines(),
        vec!["flush chain ip vipd_lb prerouting"]
    );
}

/// A backend change is one transaction: flush the DNAT chain, add the new map and rule.
#[test]
fn update_batch_flushes_and_refills_the_dnat_chain() {
    let b = update_batch(&rs(&["192.0.2.11", "192.0.2.13"]));
    assert_eq!(
        b.text(),
        "flush chain ip vipd_lb prerouting; add map ip vipd_lb __map%d { type integer : ipv4_addr; flags constant; }; add element ip vipd_lb __map%d { 2 elements }; add rule ip vipd_lb prerouting ip daddr 192.0.2.10 fib daddr type local tcp dport 6443 counter dnat to numgen inc mod 2 map { 0 : 192.0.2.11, 1 : 192.0.2.13 }:6443"
    );
    // The same rule as in the install, with its two backends.
    let full = install_batch(&rs(&["192.0.2.11", "192.0.2.13"]));
    assert_eq!(payloads(&b)[1..], payloads(&full)[6..]);
}

/// Two VIPs of one family: one map each, with distinct ids, each rule naming its own.
#[test]
fn each_vip_has_its_own_map() {
    let mut r = rs(&["192.0.2.11"]);
    r.vips.push(ip("192.0.2.20"));
    let b = install_batch(&r);
    let maps: Vec<String> = b
        .cmds()
        .iter()
        .filter(|c| c.text().starts_with("add map"))
        .map(|c| hex(&c.payload()))
        .collect();
    assert_eq!(maps.len(), 2);
    // NFTA_SET_ID 1 and 2.
    assert!(maps[0].contains("08000a0000000001"), "{}", maps[0]);
    assert!(maps[1].contains("08000a0000000002"), "{}", maps[1]);
    // Each DNAT rule looks up the map just before it (NFTA_LOOKUP_SET_ID 1, then 2).
    let lookup = |id: u8| format!("0c0001005f5f6d617025640008000400000000{id:02x}");
    let p = payloads(&b);
    // Two masquerade rules (5, 6), then map, elements and rule per VIP.
    assert!(
        b.lines()[9].contains("daddr 192.0.2.10 fib"),
        "{:#?}",
        b.lines()
    );
    assert!(p[9].contains(&lookup(1)) && !p[9].contains(&lookup(2)));
    assert!(b.lines()[12].contains("daddr 192.0.2.20 fib"));
    assert!(p[12].contains(&lookup(2)));
}
