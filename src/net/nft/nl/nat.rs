//! The expressions and the anonymous map of NAT rules (the control-plane load balancer's):
//! `fib daddr type local`, `ct status dnat`, `ct original <family> daddr`, `numgen inc mod
//! N map { ... }`, `dnat to <map>:<port>` and `masquerade`, each as nftables 1.0.6 writes
//! it (`nft --debug=netlink`): the attribute numbers are uapi
//! `linux/netfilter/nf_tables.h`'s.

use netlink_packet_core::DefaultNla;
use netlink_packet_core::NLM_F_CREATE;
use netlink_packet_netfilter::nftables::{
    Bitwise, DataAttribute, Expressions, Immediate, ListAttribute, NfTablesMessage, Register,
    SetAttribute, SetDescription, SetElementAttribute, SetElementList, SetElementMessage, SetFlags,
    SetMessage,
};

use super::{ANONYMOUS_MAP, Batch, Built, Cmd, Expr, Family, be32, other};

/// `ct load status => reg 1; bitwise reg 1 = (reg 1 & IPS_DST_NAT) ^ 0; cmp neq reg 1 0`:
/// `ct status dnat` (the connection was destination-NATed).
pub fn ct_status_dnat() -> [Expr; 3] {
    /// `NFT_CT_STATUS`.
    const STATUS: u32 = 2;
    /// `IPS_DST_NAT` (uapi `nf_conntrack_common.h`), in host byte order as the kernel
    /// keeps the status word.
    const IPS_DST_NAT: u32 = 1 << 5;
    [
        other("ct", vec![be32(CT_KEY, STATUS), be32(CT_DREG, 1)]),
        Expressions::Bitwise(vec![
            Bitwise::SourceRegister(Register::Reg1),
            Bitwise::DestinationRegister(Register::Reg1),
            Bitwise::Length(4),
            Bitwise::Mask(DataAttribute::Value(IPS_DST_NAT.to_ne_bytes().to_vec())),
            Bitwise::Xor(DataAttribute::Value(0u32.to_ne_bytes().to_vec())),
        ])
        .into(),
        super::cmp(false, &0u32.to_ne_bytes()),
    ]
}

/// `NFTA_CT_DREG`.
const CT_DREG: u16 = 1;
/// `NFTA_CT_KEY`.
const CT_KEY: u16 = 2;
/// `NFTA_CT_DIRECTION`.
const CT_DIRECTION: u16 = 3;

/// `ct load dst_ip => reg 1, dir original` (`dst_ip6` for [`Family::Ip6`]): the
/// connection's original destination address, to compare with [`super::cmp`].
pub fn ct_original_daddr(family: Family) -> Expr {
    ct_daddr(family, false)
}

/// `ct load dst_ip => reg 1, dir reply` (`dst_ip6` for [`Family::Ip6`]): the destination
/// of the connection's replies, which is the source it was translated to after a source
/// NAT (`ct reply ip daddr` in `nft` syntax).
pub fn ct_reply_daddr(family: Family) -> Expr {
    ct_daddr(family, true)
}

fn ct_daddr(family: Family, reply: bool) -> Expr {
    // NFT_CT_DST_IP, NFT_CT_DST_IP6.
    let key = if family == Family::Ip6 { 22 } else { 20 };
    other(
        "ct",
        vec![
            be32(CT_KEY, key),
            be32(CT_DREG, 1),
            // IP_CT_DIR_ORIGINAL 0, IP_CT_DIR_REPLY 1, one byte.
            DefaultNla::new(CT_DIRECTION, vec![u8::from(reply)]),
        ],
    )
}

/// `reject with tcp reset`: answers the packet with a TCP RST (uapi `NFTA_REJECT_TYPE`
/// 1 = `NFT_REJECT_TCP_RST` 1, `NFTA_REJECT_ICMP_CODE` 2 = 0). Only valid in the input,
/// forward and output hooks, and for TCP packets.
pub fn reject_tcp_reset() -> Expr {
    other("reject", vec![be32(1, 1), DefaultNla::new(2, vec![0])])
}

/// `fib daddr type => reg 1; cmp eq reg 1 RTN_LOCAL`: `fib daddr type local` (the
/// destination is an address of this host).
pub fn fib_daddr_local() -> [Expr; 2] {
    // NFTA_FIB_DREG, NFTA_FIB_RESULT, NFTA_FIB_FLAGS.
    const DREG: u16 = 1;
    const RESULT: u16 = 2;
    const FLAGS: u16 = 3;
    // NFTA_FIB_F_DADDR, NFT_FIB_RESULT_ADDRTYPE.
    const F_DADDR: u32 = 2;
    const ADDRTYPE: u32 = 3;
    /// `RTN_LOCAL` (uapi `rtnetlink.h`), host byte order.
    const RTN_LOCAL: u32 = 2;
    [
        other(
            "fib",
            vec![be32(FLAGS, F_DADDR), be32(RESULT, ADDRTYPE), be32(DREG, 1)],
        ),
        super::cmp(true, &RTN_LOCAL.to_ne_bytes()),
    ]
}

/// `numgen reg 1 = inc mod <modulus>` (0, 1, ... modulus - 1, 0, ...: round-robin).
pub fn numgen_inc(modulus: u32) -> Expr {
    // NFTA_NG_DREG, NFTA_NG_MODULUS, NFTA_NG_TYPE (NFT_NG_INCREMENTAL 0), NFTA_NG_OFFSET.
    other(
        "numgen",
        vec![be32(1, 1), be32(2, modulus), be32(3, 0), be32(4, 0)],
    )
}

/// `lookup reg 1 set <map> dreg 1`: the data the map (`id` of the same batch) holds for
/// the key in register 1, into register 1.
pub fn map_lookup(map: &str, id: u32) -> Expr {
    super::map_lookup_to(map, id, Register::Reg1, Register::Reg1)
}

/// `immediate reg 2 <port>; nat dnat <family> addr_min reg 1 proto_min reg 2`: `dnat to
/// <address in register 1>:<port>`.
pub fn dnat_to_port(family: Family, port: u16) -> [Expr; 2] {
    /// `NF_NAT_RANGE_PROTO_SPECIFIED`.
    const PROTO_SPECIFIED: u32 = 2;
    let nfproto = if family == Family::Ip6 { 10 } else { 2 };
    [
        Expressions::Immediate(vec![
            Immediate::DestinationRegister(Register::Reg2),
            Immediate::Data(DataAttribute::Value(port.to_be_bytes().to_vec())),
        ])
        .into(),
        // NFTA_NAT_TYPE (NFT_NAT_DNAT 1), NFTA_NAT_FAMILY, NFTA_NAT_REG_ADDR_MIN,
        // NFTA_NAT_REG_PROTO_MIN, NFTA_NAT_FLAGS.
        other(
            "nat",
            vec![
                be32(1, 1),
                be32(2, nfproto),
                be32(3, 1),
                be32(5, 2),
                be32(7, PROTO_SPECIFIED),
            ],
        ),
    ]
}

/// `masquerade` (`masq`): the source becomes the outgoing interface's address.
pub fn masquerade() -> Expr {
    other("masq", vec![])
}

/// `nft`'s user data of a `numgen ... map { <integer> : <address> }`: key byte order host
/// (1), data byte order big endian (2), and `nft`'s attribute 6 (0).
fn map_userdata() -> Vec<u8> {
    let mut u = Vec::new();
    for (kind, v) in [(0u8, 1u32), (1, 2), (6, 0)] {
        u.extend_from_slice(&[kind, 4]);
        u.extend_from_slice(&v.to_ne_bytes());
    }
    u
}

/// An anonymous constant map of the same batch from the integers `0..addrs.len()` (host
/// byte order, as [`numgen_inc`] writes them) to the addresses `addrs` (all of `family`),
/// as `nft` creates it for `numgen inc mod N map { 0 : a, 1 : b, ... }`: the map (`__map%d`,
/// id `id`) and one message adding its elements. A rule refers to it with
/// [`map_lookup`]`(ANONYMOUS_MAP, id)`.
pub fn add_address_map(family: Family, table: &str, id: u32, addrs: &[Vec<u8>]) -> Batch {
    // nft's types: integer 4; ipv4_addr 7, ipv6_addr 8.
    let (data_type, data_len) = if family == Family::Ip6 {
        (8, 16)
    } else {
        (7, 4)
    };
    let n = u32::try_from(addrs.len()).unwrap_or(u32::MAX);
    let set = NfTablesMessage::NewSet(SetMessage {
        attributes: vec![
            SetAttribute::Table(table.to_string()),
            SetAttribute::Name(ANONYMOUS_MAP.to_string()),
            SetAttribute::Flags(SetFlags::Anonymous | SetFlags::Constant | SetFlags::Map),
            SetAttribute::KeyType(4),
            SetAttribute::KeyLen(4),
            SetAttribute::DataType(data_type),
            SetAttribute::DataLen(data_len),
            SetAttribute::Id(id),
            SetAttribute::Description(vec![SetDescription::Size(n)]),
            SetAttribute::UserData(map_userdata()),
        ],
    });
    let elements = (0u32..)
        .zip(addrs)
        .map(|(i, a)| {
            ListAttribute::Element(vec![
                SetElementAttribute::Key(DataAttribute::Value(i.to_ne_bytes().to_vec())),
                SetElementAttribute::Data(DataAttribute::Value(a.clone())),
            ])
        })
        .collect();
    let elems = NfTablesMessage::NewSetElement(SetElementMessage {
        attributes: vec![
            SetElementList::Table(table.to_string()),
            SetElementList::Set(ANONYMOUS_MAP.to_string()),
            SetElementList::SetId(id),
            SetElementList::Elements(elements),
        ],
    });
    let kind = if family == Family::Ip6 {
        "ipv6_addr"
    } else {
        "ipv4_addr"
    };
    let cmd = |msg, text: String| {
        Cmd::built(Built {
            family,
            msg,
            flags: NLM_F_CREATE,
            text,
        })
    };
    let mut b = Batch::new();
    b.push(cmd(
        set,
        format!(
            "add map {family} {table} {ANONYMOUS_MAP} {{ type integer : {kind}; flags constant; }}"
        ),
    ));
    b.push(cmd(
        elems,
        format!("add element {family} {table} {ANONYMOUS_MAP} {{ {n} elements }}"),
    ));
    b
}
