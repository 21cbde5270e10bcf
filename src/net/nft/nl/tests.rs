//! The messages vipd builds, byte for byte against what nftables 1.0.6 sends for the same
//! commands (`nft --debug=mnl -f file` in a throwaway network namespace; the attributes
//! after the `nfgenmsg` header). `nft` also names its cached set by id in element
//! messages (`NFTA_SET_ELEM_LIST_SET_ID`), which vipd leaves out: the kernel finds an
//! existing set by name.

use super::*;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `add chain arp vipd_fence input { type filter hook input priority filter; policy accept; }`
const NFT_ARP_CHAIN: &str = "0f000100766970645f66656e636500000a000300696e7075740000000b00070066696c746572000008000500000000011400048008000100000000000800020000000000";
/// `add map arp vipd_fence vips { type ipv4_addr : verdict; }` (set id 1)
const NFT_SET_VIPS: &str = "0f000100766970645f66656e6365000009000200766970730000000008000300000000080800040000000007080005000000000408000600ffffff00080007000000000008000a000000000116000d000004020000000104000000000604000000000000";
/// `add set arp vipd_fence live { type mark; flags timeout; }` (set id 2)
const NFT_SET_LIVE: &str = "0f000100766970645f66656e63650000090002006c6976650000000008000300000000100800040000000013080005000000000408000a00000000020a000d000004010000000000";
/// `add rule arp vipd_fence input arp operation request arp daddr ip vmap @vips`
const NFT_ARP_RULE: &str = "0f000100766970645f66656e636500000a000200696e707574000000d0000480340001800c0001007061796c6f6164002400028008000100000000010800020000000001080003000000000608000400000000022c00018008000100636d700020000280080001000000000108000200000000000c0003800600010000010000340001800c0001007061796c6f616400240002800800010000000001080002000000000108000300000000180800040000000004380001800b0001006c6f6f6b7570000028000280080002000000000108000300000000000900010076697073000000000800040000000001";
/// `add map inet vipd_fence vips6 { type ipv6_addr : verdict; }` (set id 4)
const NFT_SET_VIPS6: &str = "0f000100766970645f66656e636500000a000200766970733600000008000300000000080800040000000008080005000000001008000600ffffff00080007000000000008000a000000000416000d000004020000000104000000000604000000000000";
/// `add element inet vipd_fence live4 { 192.0.2.10 timeout 1995ms }`
const NFT_ELEMENT_TIMEOUT: &str = "0f000100766970645f66656e636500000a0002006c69766534000000200003801c0001800c00040000000000000007cb0c00018008000100c000020a";
/// `delete element inet vipd_fence live4 { 192.0.2.10 }`
const NFT_ELEMENT_DELETE: &str = "0f000100766970645f66656e636500000a0002006c6976653400000014000380100001800c00018008000100c000020a";

#[test]
fn a_fence_element_with_a_millisecond_timeout_is_what_nft_sends() {
    let key = [192, 0, 2, 10];
    let add = add_element(
        Family::Inet,
        "vipd_fence",
        "live4",
        &key,
        Some(Duration::from_micros(1_995_900)),
        "192.0.2.10",
    );
    assert_eq!(
        hex(&add.payload()),
        NFT_ELEMENT_TIMEOUT,
        "rounded down to 1995 ms"
    );
    assert_eq!(
        add.text(),
        "add element inet vipd_fence live4 { 192.0.2.10 timeout 1995ms }"
    );
    let del = delete_element(Family::Inet, "vipd_fence", "live4", &key, "192.0.2.10");
    assert_eq!(hex(&del.payload()), NFT_ELEMENT_DELETE);
    // The fence's elements (keys known as addresses, nothing allocated until encoded) are
    // the same bytes and text.
    let vip = Key::Addr("192.0.2.10".parse().unwrap());
    let t = Some(Duration::from_micros(1_995_900));
    let fast = element(
        Family::Inet,
        "vipd_fence",
        "live4",
        vip.clone(),
        false,
        t,
        None,
    );
    assert_eq!(fast.payload(), add.payload());
    assert_eq!(fast.text(), add.text());
    let fast_del = element(Family::Inet, "vipd_fence", "live4", vip, true, None, None);
    assert_eq!(fast_del.payload(), del.payload());
    assert_eq!(fast_del.text(), del.text());
    let v6 = element(
        Family::Inet,
        "vipd_fence",
        "live6",
        Key::Addr("2001:db8::10".parse().unwrap()),
        false,
        Some(Duration::from_millis(5)),
        Some(Duration::from_millis(5)),
    );
    assert_eq!(
        v6.text(),
        "add element inet vipd_fence live6 { 2001:db8::10 timeout 5ms expires 5ms }"
    );
    assert!(hex(&v6.payload()).ends_with("20010db8000000000000000000000010"));
}

/// `add rule inet vipd_fence prerouting ip6 daddr vmap @vips6` (the map's set id 4, as in
/// the fence's setup)
const NFT_IP6_RULE: &str = "0f000100766970645f66656e636500000f000200707265726f7574696e670000c000048024000180090001006d6574610000000014000280080002000000000f08000100000000012c00018008000100636d700020000280080001000000000108000200000000000c000380050001000a000000340001800c0001007061796c6f616400240002800800010000000001080002000000000108000300000000180800040000000010380001800b0001006c6f6f6b7570000028000280080002000000000108000300000000000a00010076697073360000000800040000000004";
/// `add element arp vipd_fence vips { 192.0.2.10 : jump holder_5 }` (without nft's set id)
const NFT_MAP_JUMP: &str = "0f000100766970645f66656e6365000009000200766970730000000034000380300001800c00018008000100c000020a200002801c00028008000100fffffffd0d000200686f6c6465725f3500000000";
/// `add element arp vipd_fence vips { 192.0.2.11 : drop }` (without nft's set id)
const NFT_MAP_DROP: &str = "0f000100766970645f66656e6365000009000200766970730000000024000380200001800c00018008000100c000020b100002800c0002800800010000000000";
/// `add element arp vipd_fence live { 5 timeout 1995ms }` (without nft's set id)
const NFT_LIVE_MARK: &str = "0f000100766970645f66656e63650000090002006c69766500000000200003801c0001800c00040000000000000007cb0c0001800800010005000000";
/// `add chain arp vipd_fence holder_5`, and `delete chain` of it: the same attributes.
const NFT_HOLDER_CHAIN: &str = "0f000100766970645f66656e636500000d000300686f6c6465725f3500000000";

#[test]
fn the_fence_map_elements_and_holder_chains_are_what_nft_sends() {
    let jump = map_element(
        Family::Arp,
        "vipd_fence",
        "vips",
        Key::Addr("192.0.2.10".parse().unwrap()),
        MapVerdict::Jump("holder_5".into()),
        false,
    );
    assert_eq!(hex(&jump.payload()), NFT_MAP_JUMP);
    assert_eq!(
        jump.text(),
        "add element arp vipd_fence vips { 192.0.2.10 : jump holder_5 }"
    );
    let drop = map_element(
        Family::Arp,
        "vipd_fence",
        "vips",
        Key::Addr("192.0.2.11".parse().unwrap()),
        MapVerdict::Drop,
        false,
    );
    assert_eq!(hex(&drop.payload()), NFT_MAP_DROP);
    let gone = map_element(
        Family::Arp,
        "vipd_fence",
        "vips",
        Key::Addr("192.0.2.11".parse().unwrap()),
        MapVerdict::Drop,
        true,
    );
    assert_eq!(
        gone.text(),
        "delete element arp vipd_fence vips { 192.0.2.11 }"
    );
    let live = element(
        Family::Arp,
        "vipd_fence",
        "live",
        Key::Mark(5),
        false,
        Some(Duration::from_micros(1_995_900)),
        None,
    );
    assert_eq!(hex(&live.payload()), NFT_LIVE_MARK);
    assert_eq!(
        live.text(),
        "add element arp vipd_fence live { 5 timeout 1995ms }"
    );
    let add = add_regular_chain(Family::Arp, "vipd_fence", "holder_5");
    let del = delete_chain(Family::Arp, "vipd_fence", "holder_5");
    assert_eq!(hex(&add.payload()), NFT_HOLDER_CHAIN);
    assert_eq!(hex(&del.payload()), NFT_HOLDER_CHAIN);
    assert_eq!(del.text(), "delete chain arp vipd_fence holder_5");
}

#[test]
fn the_fence_chain_sets_and_rules_are_what_nft_sends() {
    let chain = add_chain(
        Family::Arp,
        "vipd_fence",
        "input",
        BaseChain {
            chain_type: "filter",
            hook: hook::ARP_IN,
            hook_name: "input",
            priority: 0,
        },
    );
    assert_eq!(hex(&chain.payload()), NFT_ARP_CHAIN);
    let b = crate::net::nft::fence::setup_commands();
    let find = |text: &str| {
        b.cmds()
            .iter()
            .find(|c| c.text().starts_with(text))
            .map(|c| hex(&c.payload()))
            .unwrap_or_else(|| panic!("{text} in {:#?}", b.lines()))
    };
    assert_eq!(find("add map arp vipd_fence vips "), NFT_SET_VIPS);
    assert_eq!(find("add set arp vipd_fence live "), NFT_SET_LIVE);
    assert_eq!(find("add map inet vipd_fence vips6 "), NFT_SET_VIPS6);
    assert_eq!(find("add rule arp vipd_fence input "), NFT_ARP_RULE);
    assert_eq!(
        find("add rule inet vipd_fence prerouting ip6 daddr"),
        NFT_IP6_RULE
    );
    // `nft` refuses the neighbour solicitation rule (its `@th,64,128` is an integer, the
    // map's keys addresses; the kernel takes it, `net_kernel`, and `nft` lists it as
    // written): its lookup is the ip6 rule's.
    let ns = find("add rule inet vipd_fence prerouting icmpv6");
    let lookup = &NFT_IP6_RULE[NFT_IP6_RULE.rfind("380001800b0001006c6f6f6b7570").unwrap()..];
    assert!(ns.ends_with(lookup), "{ns}");
}

/// The framing: `BATCH_BEGIN` for nf_tables, each message acknowledged and numbered, and
/// `BATCH_END` only when committing.
#[test]
fn a_batch_is_framed_and_a_check_has_no_end() {
    let mut b = Batch::new();
    b.push(add_table(Family::Arp, "t"));
    b.push(delete_table(Family::Arp, "t"));
    let msgs = |bytes: &[u8]| {
        let mut out = Vec::new();
        let mut off = 0;
        while off < bytes.len() {
            let len = u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap()) as usize;
            let ty = u16::from_ne_bytes(bytes[off + 4..off + 6].try_into().unwrap());
            let flags = u16::from_ne_bytes(bytes[off + 6..off + 8].try_into().unwrap());
            let seq = u32::from_ne_bytes(bytes[off + 8..off + 12].try_into().unwrap());
            let nfgen = bytes[off + 16..off + 20].to_vec();
            out.push((ty, flags, seq, nfgen));
            off += (len + 3) & !3;
        }
        out
    };
    let commit = msgs(&b.encode(7, Mode::Commit));
    let ack = NLM_F_REQUEST | NLM_F_ACK;
    assert_eq!(
        commit,
        vec![
            (16, NLM_F_REQUEST, 7, vec![0, 0, 0, 10]),
            ((10 << 8), ack | NLM_F_CREATE, 8, vec![3, 0, 0, 0]),
            ((10 << 8) | 2, ack, 9, vec![3, 0, 0, 0]),
            (17, NLM_F_REQUEST, 10, vec![0, 0, 0, 10]),
        ]
    );
    let check = msgs(&b.encode(7, Mode::Check));
    assert_eq!(
        check,
        commit[..3].to_vec(),
        "no BATCH_END: validated, then aborted"
    );
}

/// The kernel's answers name each refused command with its errno; an error for the batch
/// itself (no nf_tables) is reported as such.
#[test]
fn refusals_name_the_command_and_errno() {
    let mut b = Batch::new();
    b.push(add_element(
        Family::Inet,
        "vipd_fence",
        "live4",
        &[192, 0, 2, 10],
        None,
        "192.0.2.10",
    ));
    b.push(delete_element(
        Family::Inet,
        "vipd_fence",
        "live4",
        &[192, 0, 2, 11],
        "192.0.2.11",
    ));
    let carried: Vec<_> = b.messages().iter().map(|m| m.cmds.clone()).collect();
    assert_eq!(carried, [0..1, 1..2], "an add and a delete: two messages");
    assert_eq!(acks_result(&b, &carried, 1, &[(2, 0), (3, 0)]), Ok(()));
    let e = acks_result(&b, &carried, 1, &[(2, 0), (3, libc::ENOENT)]).unwrap_err();
    assert_eq!(
        e,
        NftError::Refused {
            failed: vec![(
                "delete element inet vipd_fence live4 { 192.0.2.11 }".to_string(),
                libc::ENOENT
            )]
        }
    );
    assert!(
        e.to_string().contains(
            "`delete element inet vipd_fence live4 { 192.0.2.11 }`: No such file or directory"
        ),
        "{e}"
    );
    let e = acks_result(&b, &carried, 1, &[(1, libc::EOPNOTSUPP)]).unwrap_err();
    assert!(
        matches!(e, NftError::Batch { errno, .. } if errno == libc::EOPNOTSUPP),
        "{e:?}"
    );
    assert!(e.to_string().contains("nf_tables"), "{e}");
}

/// `add element inet vipd_fence live4 { 192.0.2.10 timeout 1995ms, 192.0.2.11 timeout
/// 1995ms }` as nft 1.0.6 sends it (without its set id). nft numbers the list's entries 1,
/// 2, ...; netlink-packet-netfilter writes each as `NFTA_LIST_ELEM` (1), and the kernel
/// reads a list's entries in order whatever their type (`nla_for_each_nested`): the second
/// entry's type is the one difference (`1c000280` here).
const NFT_TWO_ELEMENTS: &str = "0f000100766970645f66656e636500000a0002006c697665340000003c0003801c0001800c00040000000000000007cb0c00018008000100c000020a1c0002800c00040000000000000007cb0c00018008000100c000020b";

/// Consecutive element commands on one set with the same flags travel as one message (a
/// shard's renewal refreshes hundreds of VIPs: one acknowledgement, not one per element);
/// another set, another operation or another command starts a new one.
#[test]
fn consecutive_elements_of_one_set_share_a_message() {
    let t = Some(Duration::from_millis(1995));
    let add4 = |last: u8| {
        add_element(
            Family::Inet,
            "vipd_fence",
            "live4",
            &[192, 0, 2, last],
            t,
            &format!("192.0.2.{last}"),
        )
    };
    let mut b = Batch::new();
    b.push(add_table(Family::Inet, "vipd_fence"));
    b.push(add4(10));
    b.push(add4(11));
    b.push(add_element(
        Family::Arp,
        "vipd_fence",
        "live",
        &[192, 0, 2, 10],
        t,
        "192.0.2.10",
    ));
    b.push(delete_element(
        Family::Inet,
        "vipd_fence",
        "live4",
        &[192, 0, 2, 12],
        "192.0.2.12",
    ));
    b.push(delete_element(
        Family::Inet,
        "vipd_fence",
        "live4",
        &[192, 0, 2, 13],
        "192.0.2.13",
    ));
    b.push(create_element(
        Family::Inet,
        "vipd_fence",
        "live4",
        &[192, 0, 2, 14],
        t,
        "192.0.2.14",
    ));
    b.push(add4(15));
    let m = b.messages();
    let carried: Vec<_> = m.iter().map(|m| m.cmds.clone()).collect();
    assert_eq!(carried, [0..1, 1..3, 3..4, 4..6, 6..7, 7..8]);
    assert_eq!(
        hex(&m[1].payload()),
        NFT_TWO_ELEMENTS.replacen("1c0002800c000400", "1c0001800c000400", 1)
    );
    // A refused shared message names its first element and how many more it carried.
    let e = acks_result(&b, &carried, 1, &[(2, 0), (3, libc::ENOENT)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`add element inet vipd_fence live4 { 192.0.2.10 timeout 1995ms } (and 1 more \
         element in the same message)`: No such file or directory (os error 2)"
    );
}

/// A shard's refresh of thousands of IPv6 VIPs is split so that no message's element list
/// outgrows its 16-bit attribute length, and every command is carried once, in order.
#[test]
fn thousands_of_elements_are_split_below_the_attribute_limit() {
    let mut b = Batch::new();
    for i in 0..3000u32 {
        let mut key = [0u8; 16];
        key[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        key[12..].copy_from_slice(&i.to_be_bytes());
        b.push(refresh_element(
            Family::Inet,
            "vipd_fence",
            "live6",
            &key,
            Duration::from_millis(1800),
            &format!("2001:db8::{i:x}"),
        ));
    }
    let m = b.messages();
    assert!(m.len() > 1 && m.len() < 20, "{} messages", m.len());
    let mut next = 0;
    for msg in &m {
        assert_eq!(msg.cmds.start, next);
        next = msg.cmds.end;
        assert!(
            msg.payload().len() < usize::from(u16::MAX),
            "{} bytes",
            msg.payload().len()
        );
    }
    assert_eq!(next, 3000);
}
