//! nf_tables through netlink, from vipd's own process: the one way vipd changes its
//! nftables tables (the fence, the ARP flux guard, Service security, the control-plane
//! load balancer). No `nft` process runs; `nft list table ...` stays a debugging tool.
//!
//! A change is a [`Batch`] of nf_tables messages sent as one transaction (uapi
//! `linux/netfilter/nfnetlink.h`): `NFNL_MSG_BATCH_BEGIN`, the messages, each with
//! `NLM_F_ACK`, then `NFNL_MSG_BATCH_END`, in one `sendmsg(2)` on a `NETLINK_NETFILTER`
//! socket. The kernel handles the whole batch inside that call (nfnetlink processes it in
//! the sender's context) and commits it atomically, or nothing when any message fails;
//! [`NftSocket::send`] then reads one acknowledgement per message and reports each
//! refused message with the kernel's errno ([`NftError::Refused`]). Consecutive set
//! element commands on one set travel as one message ([`Batch::messages`], as `nft add
//! element ... { a, b }` sends them), built from the commands only when the batch is
//! encoded ([`element`]): a shard holder's renewal sets hundreds of elements. Without
//! `BATCH_END` ([`Mode::Check`]) the kernel validates every message and aborts: what
//! `nft --check` does, for `vipd preflight`.
//!
//! Messages are built with netlink-packet-netfilter (rust-netlink, MIT: table, chain,
//! rule, set and set element messages, the batch markers and the payload, meta, cmp,
//! lookup, bitwise and immediate expressions); the expressions it does not model (counter,
//! and in [`nat`] fib, numgen, nat, masquerade, ct) are written as its generic attributes,
//! each checked against the bytecode `nft --debug=netlink` (nftables 1.0.6) generates for
//! the same rule.
//! The socket is netlink-sys's, opened per batch: a failed batch's unread answers go with
//! it.

use std::borrow::Cow;
use std::net::IpAddr;
use std::num::NonZeroI32;
use std::time::Duration;

use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, Cmp, DataAttribute, ExpressionAttribute, Expressions, Hook,
    HookNumber, Immediate, ListAttribute, Lookup, Meta, MetaKey, NfTablesMessage, Operator,
    Payload, Register, RuleAttribute, RuleMessage, SetAttribute, SetElementAttribute,
    SetElementList, SetElementMessage, SetFlags, TableAttribute, TableMessage, Verdict,
    VerdictAttribute,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

/// An nf_tables family (`nfgenmsg.nfgen_family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `arp` (NFPROTO_ARP).
    Arp,
    /// `inet` (NFPROTO_INET): IPv4 and IPv6.
    Inet,
    /// `ip` (NFPROTO_IPV4).
    Ip,
    /// `ip6` (NFPROTO_IPV6).
    Ip6,
}

impl Family {
    /// The family as `nft` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Arp => "arp",
            Family::Inet => "inet",
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }

    fn proto(self) -> NetfilterProtoFamily {
        match self {
            Family::Arp => NetfilterProtoFamily::ARP,
            Family::Inet => NetfilterProtoFamily::Inet,
            Family::Ip => NetfilterProtoFamily::IPv4,
            Family::Ip6 => NetfilterProtoFamily::IPv6,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One nf_tables command of a [`Batch`], with the same command in `nft` syntax (for errors
/// and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    family: Family,
    /// `NLM_F_*` flags besides `NLM_F_REQUEST | NLM_F_ACK`.
    flags: u16,
    body: Body,
}

/// What a [`Cmd`] carries.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    /// A message built whole, with its `nft` text.
    Message { msg: NfTablesMessage, text: String },
    /// One set element, built into a message (with the elements next to it on the same
    /// set, [`Batch::messages`]) only when the batch is encoded, and its text only when
    /// asked for: a shard's renewal is thousands of them.
    Element(Element),
}

/// A set element command ([`Body::Element`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Element {
    delete: bool,
    table: Cow<'static, str>,
    set: Cow<'static, str>,
    key: Key,
    /// Whole milliseconds.
    timeout: Option<u64>,
    /// Whole milliseconds (only with a timeout).
    expires: Option<u64>,
    /// The verdict of a verdict map's element (`NFTA_SET_ELEM_DATA`); `None` for a set's
    /// element.
    data: Option<MapVerdict>,
}

/// The verdict a verdict map's element holds (`<key> : drop`, `<key> : jump <chain>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapVerdict {
    /// `drop`.
    Drop,
    /// `jump <chain>` (a regular chain of the same table).
    Jump(String),
}

impl MapVerdict {
    fn attribute(&self) -> DataAttribute {
        DataAttribute::Verdict(match self {
            MapVerdict::Drop => vec![VerdictAttribute::Code(Verdict::Other(NF_DROP))],
            MapVerdict::Jump(chain) => vec![
                VerdictAttribute::Code(Verdict::Jump),
                VerdictAttribute::Chain(chain.clone()),
            ],
        })
    }
}

impl std::fmt::Display for MapVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapVerdict::Drop => f.write_str("drop"),
            MapVerdict::Jump(chain) => write!(f, "jump {chain}"),
        }
    }
}

impl Element {
    /// The element's attributes, as sent: timeout, expiration, key.
    fn attributes(&self) -> Vec<SetElementAttribute> {
        let mut element = Vec::with_capacity(3);
        if let Some(ms) = self.timeout {
            element.push(SetElementAttribute::Timeout(ms));
            if let Some(e) = self.expires {
                element.push(SetElementAttribute::Expiration(e));
            }
        }
        element.push(SetElementAttribute::Key(DataAttribute::Value(
            self.key.bytes(),
        )));
        if let Some(d) = &self.data {
            element.push(SetElementAttribute::Data(d.attribute()));
        }
        element
    }

    /// The message carrying `elements` (this element's table and set, and operation).
    fn message(&self, elements: Vec<ListAttribute<SetElementAttribute>>) -> NfTablesMessage {
        let m = SetElementMessage {
            attributes: vec![
                SetElementList::Table(self.table.to_string()),
                SetElementList::Set(self.set.to_string()),
                SetElementList::Elements(elements),
            ],
        };
        match self.delete {
            true => NfTablesMessage::DeleteSetElement(m),
            false => NfTablesMessage::NewSetElement(m),
        }
    }

    /// Whether `other` can travel in the same message: same table, set and operation.
    fn joins(&self, other: &Element) -> bool {
        self.delete == other.delete && self.table == other.table && self.set == other.set
    }
}

/// A set element's key: its bytes (network byte order) and how `nft` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// An IPv4 or IPv6 address (4 or 16 bytes), shown as the address.
    Addr(IpAddr),
    /// A 32-bit integer in host byte order, shown in decimal: the key of a set of `type
    /// mark` (how `nft` stores a mark), as the fence's live sets are keyed.
    Mark(u32),
    /// Other bytes (concatenated fields, each padded to 4 bytes), with their text.
    Other(Vec<u8>, String),
}

impl Key {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Key::Addr(IpAddr::V4(a)) => a.octets().to_vec(),
            Key::Addr(IpAddr::V6(a)) => a.octets().to_vec(),
            Key::Mark(n) => n.to_ne_bytes().to_vec(),
            Key::Other(b, _) => b.clone(),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Addr(a) => write!(f, "{a}"),
            Key::Mark(n) => write!(f, "{n}"),
            Key::Other(_, shown) => f.write_str(shown),
        }
    }
}

/// The fields of a message built whole ([`Cmd::built`]).
struct Built {
    family: Family,
    msg: NfTablesMessage,
    flags: u16,
    text: String,
}

impl Cmd {
    fn built(b: Built) -> Self {
        Cmd {
            family: b.family,
            flags: b.flags,
            body: Body::Message {
                msg: b.msg,
                text: b.text,
            },
        }
    }

    /// The command in `nft` syntax.
    pub fn text(&self) -> Cow<'_, str> {
        match &self.body {
            Body::Message { text, .. } => Cow::Borrowed(text),
            Body::Element(e) => {
                let op = match (e.delete, self.flags & NLM_F_EXCL != 0) {
                    (true, _) => "delete",
                    (false, true) => "create",
                    (false, false) => "add",
                };
                let mut t = format!(
                    "{op} element {} {} {} {{ {}",
                    self.family, e.table, e.set, e.key
                );
                if let Some(d) = &e.data {
                    t.push_str(&format!(" : {d}"));
                }
                if let Some(ms) = e.timeout {
                    t.push_str(&format!(" timeout {ms}ms"));
                    if let Some(x) = e.expires {
                        t.push_str(&format!(" expires {x}ms"));
                    }
                }
                t.push_str(" }");
                Cow::Owned(t)
            }
        }
    }

    /// The message as sent alone.
    fn message(&self) -> NfTablesMessage {
        match &self.body {
            Body::Message { msg, .. } => msg.clone(),
            Body::Element(e) => e.message(vec![ListAttribute::Element(e.attributes())]),
        }
    }

    /// The message's nf_tables attributes, as the kernel receives them (after the
    /// `nfgenmsg` header): for tests comparing them with what `nft` sends.
    pub fn payload(&self) -> Vec<u8> {
        let msg = self.message();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.emit(&mut buf);
        buf
    }
}

/// One nf_tables transaction: its messages, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    cmds: Vec<Cmd>,
}

impl Batch {
    /// An empty transaction.
    pub fn new() -> Self {
        Batch::default()
    }

    /// Appends `cmd`.
    pub fn push(&mut self, cmd: Cmd) {
        self.cmds.push(cmd);
    }

    /// Appends every command of `other`.
    pub fn append(&mut self, other: Batch) {
        self.cmds.extend(other.cmds);
    }

    /// Whether it holds no command.
    pub fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    /// The commands.
    pub fn cmds(&self) -> &[Cmd] {
        &self.cmds
    }

    /// The commands in `nft` syntax, one per line.
    pub fn lines(&self) -> Vec<String> {
        self.cmds.iter().map(|c| c.text().into_owned()).collect()
    }

    /// The commands in `nft` syntax, joined with `; `.
    pub fn text(&self) -> String {
        self.lines().join("; ")
    }

    /// The first command in `nft` syntax and how many follow (`add chain ...; and 41 more
    /// commands`): a batch named in a log line without its whole text.
    pub fn summary(&self) -> String {
        match self.cmds.split_first() {
            None => String::new(),
            Some((first, [])) => first.text().into_owned(),
            Some((first, rest)) => format!("{}; and {} more commands", first.text(), rest.len()),
        }
    }

    /// The bytes sent: `BATCH_BEGIN` (sequence `seq`), the messages (`seq + 1`, ...,
    /// [`Batch::messages`]), and `BATCH_END` unless `mode` is [`Mode::Check`].
    pub fn encode(&self, seq: u32, mode: Mode) -> Vec<u8> {
        encode_messages(self.messages(), seq, mode)
    }

    /// The messages the commands are sent as, in order: one per command, except that
    /// consecutive element commands on one set with the same flags (a renewal's refresh of
    /// a shard's hundreds of VIPs) share one message, as `nft` sends `add element ... { a,
    /// b, ... }`, up to [`ELEMENT_BYTES_PER_MESSAGE`] of elements. The kernel handles the
    /// elements of a message in order, as it would the messages, and the transaction is
    /// still one: what changes is one acknowledgement per message instead of per element.
    pub fn messages(&self) -> Vec<Message> {
        let mut out: Vec<Message> = Vec::new();
        // The element message being filled (the last of `out`).
        let mut open: Option<OpenElements> = None;
        for (i, c) in self.cmds.iter().enumerate() {
            let Body::Element(e) = &c.body else {
                OpenElements::close(open.take(), &mut out);
                out.push(Message {
                    family: c.family,
                    msg: c.message(),
                    flags: c.flags,
                    cmds: i..i + 1,
                });
                continue;
            };
            let element = ListAttribute::Element(e.attributes());
            let size = element.buffer_len();
            if let (Some(o), Some(last)) = (open.as_mut(), out.last_mut())
                && last.family == c.family
                && last.flags == c.flags
                && o.first.joins(e)
                && o.bytes.saturating_add(size) <= ELEMENT_BYTES_PER_MESSAGE
            {
                o.elements.push(element);
                o.bytes += size;
                last.cmds.end = i + 1;
                continue;
            }
            OpenElements::close(open.take(), &mut out);
            // Its message is built when it closes (its elements are known then).
            out.push(Message {
                family: c.family,
                msg: NfTablesMessage::NewSetElement(SetElementMessage {
                    attributes: Vec::new(),
                }),
                flags: c.flags,
                cmds: i..i + 1,
            });
            open = Some(OpenElements {
                first: e,
                elements: vec![element],
                bytes: size,
            });
        }
        OpenElements::close(open, &mut out);
        out
    }
}

/// An element message being filled by [`Batch::messages`]: its first element (table, set,
/// operation), its elements so far and their bytes.
struct OpenElements<'a> {
    first: &'a Element,
    elements: Vec<ListAttribute<SetElementAttribute>>,
    bytes: usize,
}

impl OpenElements<'_> {
    /// Builds the message of `open`, the last of `out`.
    fn close(open: Option<Self>, out: &mut [Message]) {
        if let (Some(o), Some(m)) = (open, out.last_mut()) {
            m.msg = o.first.message(o.elements);
        }
    }
}

/// Bytes of set elements one message carries at most ([`Batch::messages`]): the elements'
/// nested attribute has a 16-bit length (65 535 bytes); an IPv6 element with its timeout
/// and expiration takes 52 bytes, so about 600 of them.
pub const ELEMENT_BYTES_PER_MESSAGE: usize = 32 * 1024;

/// One message of a batch as sent ([`Batch::messages`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    family: Family,
    msg: NfTablesMessage,
    flags: u16,
    /// The batch's commands this message carries (indices into [`Batch::cmds`]).
    pub cmds: std::ops::Range<usize>,
}

impl Message {
    /// The message's nf_tables attributes, as the kernel receives them (as
    /// [`Cmd::payload`]).
    pub fn payload(&self) -> Vec<u8> {
        let mut buf = vec![0u8; self.msg.buffer_len()];
        self.msg.emit(&mut buf);
        buf
    }
}

/// The bytes of `messages` framed as one batch beginning at `seq` ([`Batch::encode`]).
fn encode_messages(messages: Vec<Message>, seq: u32, mode: Mode) -> Vec<u8> {
    let mut out = Vec::new();
    let control = |m: ControlMessage| {
        // res_id of the batch markers: the subsystem the batch is for.
        NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES),
            m,
        )
    };
    push_message(&mut out, control(ControlMessage::BatchBegin), seq, 0);
    let n = messages.len();
    for (i, m) in messages.into_iter().enumerate() {
        let nf = NetfilterMessage::new(NetfilterHeader::new(m.family.proto(), 0, 0), m.msg);
        push_message(&mut out, nf, cmd_seq(seq, i), NLM_F_ACK | m.flags);
    }
    if mode == Mode::Commit {
        push_message(
            &mut out,
            control(ControlMessage::BatchEnd),
            cmd_seq(seq, n),
            0,
        );
    }
    out
}

/// `res_id` of the batch markers: nf_tables' subsystem (`NFNL_SUBSYS_NFTABLES`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// The sequence number of the `i`th command of a batch beginning at `seq`.
fn cmd_seq(seq: u32, i: usize) -> u32 {
    seq.wrapping_add(1)
        .wrapping_add(u32::try_from(i).unwrap_or(u32::MAX))
}

fn push_message(out: &mut Vec<u8>, m: NetfilterMessage, seq: u32, flags: u16) {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = seq;
    let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(m));
    nl.finalize();
    let start = out.len();
    out.resize(start + nl.buffer_len(), 0);
    nl.serialize(&mut out[start..]);
}

/// Whether a batch is committed or only checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Committed atomically when every message is accepted (`BATCH_END` sent).
    Commit,
    /// Validated by the kernel, then aborted whatever the outcome (no `BATCH_END`, as
    /// `nft --check`): nothing changes.
    Check,
}

/// Why a batch failed. Nothing of it was committed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NftError {
    /// No netfilter netlink socket (no CAP_NET_ADMIN is reported at send time; this is
    /// e.g. a kernel without nfnetlink).
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(String),
    /// Sending the batch or reading its answers failed.
    #[error("nf_tables batch `{batch}`: {detail}")]
    Io {
        /// The batch in `nft` syntax.
        batch: String,
        /// The socket's error, or the answers missing.
        detail: String,
    },
    /// The kernel refused the batch as a whole (no nf_tables in the kernel, or the commit
    /// failed): `errno` for the batch.
    #[error("nf_tables batch `{batch}` refused: {}", errno_text(*errno))]
    Batch {
        /// The batch in `nft` syntax.
        batch: String,
        /// The positive errno.
        errno: i32,
    },
    /// The kernel refused these messages (each with its positive errno); the batch was
    /// aborted.
    #[error("{}", refused_text(failed))]
    Refused {
        /// Each refused command in `nft` syntax, with its errno.
        failed: Vec<(String, i32)>,
    },
}

impl NftError {
    /// The kernel's or the socket's answer without the batch (which can be long): for
    /// messages that name the commands themselves.
    pub fn answer(&self) -> String {
        match self {
            NftError::Socket(e) => format!("cannot open a netfilter netlink socket: {e}"),
            NftError::Io { detail, .. } => detail.clone(),
            NftError::Batch { errno, .. } => format!("refused: {}", errno_text(*errno)),
            NftError::Refused { failed } => refused_text(failed),
        }
    }
}

fn errno_text(errno: i32) -> String {
    let hint = match errno {
        libc::EPERM => " (vipd needs CAP_NET_ADMIN)",
        libc::EOPNOTSUPP | libc::EAFNOSUPPORT => {
            " (the kernel lacks nf_tables or this family: module nf_tables / nf_tables_arp / nf_tables_inet)"
        }
        _ => "",
    };
    format!("{}{hint}", std::io::Error::from_raw_os_error(errno))
}

fn refused_text(failed: &[(String, i32)]) -> String {
    failed
        .iter()
        .map(|(c, e)| format!("`{c}`: {}", errno_text(*e)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// How long [`NftSocket::send`] waits for answers that have not come (the kernel answers
/// inside the `sendmsg`; this bounds a broken socket, never a normal wait).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A `NETLINK_NETFILTER` socket for one batch, in the caller's network namespace.
/// Blocking: use it from a blocking thread ([`tokio::task::spawn_blocking`]).
#[derive(Debug)]
pub struct NftSocket {
    sock: Socket,
}

impl NftSocket {
    /// Opens and binds the socket (extended and capped acknowledgements).
    ///
    /// # Errors
    /// [`NftError::Socket`].
    pub fn open() -> Result<Self, NftError> {
        let err = |e: std::io::Error| NftError::Socket(e.to_string());
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(err)?;
        sock.bind_auto().map_err(err)?;
        sock.connect(&SocketAddr::new(0, 0)).map_err(err)?;
        // Acknowledgements carry the request's header only; extended ones add the
        // kernel's message (best effort: old kernels lack both).
        let _ = sock.set_cap_ack(true);
        let _ = sock.set_ext_ack(true);
        let tv = nix::sys::time::TimeVal::new(
            i64::try_from(ANSWER_TIMEOUT.as_secs()).unwrap_or(i64::MAX),
            0,
        );
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
            .map_err(|e| err(e.into()))?;
        Ok(NftSocket { sock })
    }

    /// Sends `batch` in one `sendmsg(2)` (the kernel handles it inside the call) and reads
    /// one acknowledgement per message. An empty batch sends nothing.
    ///
    /// # Errors
    /// [`NftError::Refused`] naming each refused command and its errno,
    /// [`NftError::Batch`] when the kernel refused the batch as a whole, [`NftError::Io`].
    pub fn send(&self, batch: &Batch, mode: Mode) -> Result<(), NftError> {
        if batch.is_empty() {
            return Ok(());
        }
        let io = |detail: String| NftError::Io {
            batch: batch.text(),
            detail,
        };
        let messages = batch.messages();
        let carried: Vec<std::ops::Range<usize>> =
            messages.iter().map(|m| m.cmds.clone()).collect();
        // Room for every acknowledgement (counted by the kernel at a few hundred bytes of
        // buffer each): a full buffer would drop some and leave this waiting.
        let room = carried.len().saturating_mul(2048).saturating_add(1 << 18);
        let _ = nix::sys::socket::setsockopt(
            &self.sock,
            nix::sys::socket::sockopt::RcvBufForce,
            &room.min(64 << 20),
        );
        let seq = 1;
        let bytes = encode_messages(messages, seq, mode);
        // A batch is one datagram: the send buffer must hold it whole (the default, about
        // 200 KiB, refuses a few hundred rules with EMSGSIZE).
        let _ = nix::sys::socket::setsockopt(
            &self.sock,
            nix::sys::socket::sockopt::SndBufForce,
            &bytes.len().saturating_add(1 << 16).min(64 << 20),
        );
        let sent = self
            .sock
            .send(&bytes, 0)
            .map_err(|e| io(format!("sending: {e}")))?;
        if sent != bytes.len() {
            return Err(io(format!("sent {sent} of {} bytes", bytes.len())));
        }
        let acks = read_acks(&self.sock, seq, carried.len()).map_err(io)?;
        acks_result(batch, &carried, seq, &acks)
    }
}

/// The answers to a batch beginning at `seq`: `(sequence, errno or 0)` until every one of
/// its `n` messages is acknowledged or the batch itself is refused.
fn read_acks(sock: &Socket, seq: u32, n: usize) -> Result<Vec<(u32, i32)>, String> {
    let mut acks = Vec::new();
    let mut answered = 0;
    while answered < n {
        let (data, _) = sock
            .recv_from_full()
            .map_err(|e| format!("reading the kernel's answers ({answered} of {n}): {e}"))?;
        for m in crate::net::nlmsg::messages::<NetfilterMessage>(&data) {
            let m = m.map_err(|e| format!("unreadable answer: {e}"))?;
            if let NetlinkPayload::Error(e) = m.payload {
                let errno = e.code.map(NonZeroI32::get).unwrap_or(0).abs();
                let s = m.header.sequence_number;
                if s == seq && errno != 0 {
                    acks.push((s, errno));
                    return Ok(acks);
                }
                if s > seq && s <= cmd_seq(seq, n.saturating_sub(1)) {
                    answered += 1;
                    acks.push((s, errno));
                }
            }
        }
    }
    Ok(acks)
}

/// The outcome of a batch beginning at `seq` from its acknowledgements: `carried` is the
/// commands each message carried ([`Message::cmds`]); a refused message is reported with
/// its command's text, or its first element's and how many more it carried.
fn acks_result(
    batch: &Batch,
    carried: &[std::ops::Range<usize>],
    seq: u32,
    acks: &[(u32, i32)],
) -> Result<(), NftError> {
    if let Some((_, errno)) = acks.iter().find(|(s, e)| *s == seq && *e != 0) {
        return Err(NftError::Batch {
            batch: batch.text(),
            errno: *errno,
        });
    }
    let failed: Vec<(String, i32)> = acks
        .iter()
        .filter(|(_, e)| *e != 0)
        .map(|(s, e)| {
            let i = usize::try_from(s.wrapping_sub(seq).wrapping_sub(1)).unwrap_or(usize::MAX);
            let text = carried
                .get(i)
                .and_then(|r| batch.cmds.get(r.clone()))
                .map(|cmds| match cmds {
                    [one] => one.text().into_owned(),
                    [first, rest @ ..] => format!(
                        "{} (and {} more element{} in the same message)",
                        first.text(),
                        rest.len(),
                        if rest.len() == 1 { "" } else { "s" }
                    ),
                    [] => String::new(),
                })
                .unwrap_or_default();
            (text, *e)
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(NftError::Refused { failed })
    }
}

/// Opens a socket and sends `batch` ([`NftSocket::send`]). Blocking.
///
/// # Errors
/// As [`NftSocket::open`] and [`NftSocket::send`].
pub fn send(batch: &Batch, mode: Mode) -> Result<(), NftError> {
    NftSocket::open()?.send(batch, mode)
}

/// Where batches go: the kernel ([`Kernel`]), or a recorder in unit tests.
pub trait Transport: Send + Sync + std::fmt::Debug + 'static {
    /// Opens the way to the kernel, in the calling thread's network namespace (call it
    /// from the task's thread, then send from a blocking thread).
    ///
    /// # Errors
    /// As [`NftSocket::open`].
    fn open(&self) -> Result<Box<dyn Link>, NftError>;
}

/// An open way to the kernel: sends batches. Blocking.
pub trait Link: Send {
    /// Sends `batch` ([`NftSocket::send`]).
    ///
    /// # Errors
    /// As [`NftSocket::send`].
    fn send(&self, batch: &Batch, mode: Mode) -> Result<(), NftError>;
}

impl Link for NftSocket {
    fn send(&self, batch: &Batch, mode: Mode) -> Result<(), NftError> {
        NftSocket::send(self, batch, mode)
    }
}

/// The kernel, through a [`NftSocket`] per batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kernel;

impl Transport for Kernel {
    fn open(&self) -> Result<Box<dyn Link>, NftError> {
        Ok(Box::new(NftSocket::open()?))
    }
}

/// Opens `transport` here (this thread's network namespace), then sends `batch` from a
/// blocking thread.
///
/// # Errors
/// As [`Transport::open`] and [`Link::send`]; [`NftError::Io`] when the thread could not
/// run.
pub async fn send_with(
    transport: &dyn Transport,
    batch: Batch,
    mode: Mode,
) -> Result<(), NftError> {
    let link = transport.open()?;
    // Only for the error below; a renewal's batch can hold thousands of commands.
    let text = batch.summary();
    tokio::task::spawn_blocking(move || link.send(&batch, mode))
        .await
        .unwrap_or_else(|e| {
            Err(NftError::Io {
                batch: text,
                detail: e.to_string(),
            })
        })
}

/// A [`Transport`] for unit tests: records every batch sent (commits and checks) and
/// refuses them while [`Recorder::fail`] is set.
#[cfg(test)]
#[derive(Debug, Default, Clone)]
pub struct Recorder {
    /// The batches sent, in order, with their mode.
    pub sent: std::sync::Arc<std::sync::Mutex<Vec<(Batch, Mode)>>>,
    /// When set, every batch is refused (`EINVAL` for its first command).
    pub fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(test)]
impl Recorder {
    /// The batches sent so far.
    pub fn batches(&self) -> Vec<Batch> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|(b, _)| b.clone())
            .collect()
    }

    /// Refuses every batch from now on (`fail`), or accepts them again.
    pub fn set_fail(&self, fail: bool) {
        self.fail.store(fail, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
impl Transport for Recorder {
    fn open(&self) -> Result<Box<dyn Link>, NftError> {
        Ok(Box::new(self.clone()))
    }
}

#[cfg(test)]
impl Link for Recorder {
    fn send(&self, b: &Batch, mode: Mode) -> Result<(), NftError> {
        if b.is_empty() {
            return Ok(());
        }
        self.sent.lock().unwrap().push((b.clone(), mode));
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(NftError::Refused {
                failed: vec![(b.lines()[0].clone(), libc::EINVAL)],
            });
        }
        Ok(())
    }
}

// --- Messages -------------------------------------------------------------------------

/// `add table <family> <name>`.
pub fn add_table(family: Family, name: &str) -> Cmd {
    Cmd::built(Built {
        family,
        msg: NfTablesMessage::NewTable(TableMessage {
            attributes: vec![
                TableAttribute::Name(name.to_string()),
                TableAttribute::Flags(Default::default()),
            ],
        }),
        flags: NLM_F_CREATE,
        text: format!("add table {family} {name}"),
    })
}

/// `delete table <family> <name>`.
pub fn delete_table(family: Family, name: &str) -> Cmd {
    Cmd::built(Built {
        family,
        msg: NfTablesMessage::DeleteTable(TableMessage {
            attributes: vec![TableAttribute::Name(name.to_string())],
        }),
        flags: 0,
        text: format!("delete table {family} {name}"),
    })
}

/// `add table` then `delete table`: deletes the table whether it exists or not.
pub fn remove_table(family: Family, name: &str) -> Batch {
    Batch {
        cmds: vec![add_table(family, name), delete_table(family, name)],
    }
}

/// A base chain's hook: `type <chain_type> hook <hook> priority <priority>; policy
/// accept;`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseChain {
    /// `filter` or `nat`.
    pub chain_type: &'static str,
    /// The hook number (`NF_INET_*`, `NF_ARP_*`).
    pub hook: u32,
    /// `nft`'s name of the hook, for the text.
    pub hook_name: &'static str,
    /// The priority.
    pub priority: i32,
}

/// Hook numbers (uapi `linux/netfilter.h`).
pub mod hook {
    /// `NF_INET_PRE_ROUTING`.
    pub const PREROUTING: u32 = 0;
    /// `NF_INET_LOCAL_IN`.
    pub const INPUT: u32 = 1;
    /// `NF_INET_FORWARD`.
    pub const FORWARD: u32 = 2;
    /// `NF_INET_POST_ROUTING`.
    pub const POSTROUTING: u32 = 4;
    /// `NF_ARP_IN`.
    pub const ARP_IN: u32 = 0;
}

/// `NF_ACCEPT`, a chain policy and a verdict.
pub const NF_ACCEPT: u32 = 1;
/// `NF_DROP`, a verdict.
pub const NF_DROP: u32 = 0;

/// `add chain <family> <table> <name> { type ... hook ... priority ...; policy accept; }`.
pub fn add_chain(family: Family, table: &str, name: &str, base: BaseChain) -> Cmd {
    Cmd::built(Built {
        family,
        msg: NfTablesMessage::NewChain(ChainMessage {
            attributes: vec![
                ChainAttribute::Table(table.to_string()),
                ChainAttribute::Name(name.to_string()),
                ChainAttribute::Type(base.chain_type.to_string()),
                ChainAttribute::Policy(NF_ACCEPT),
                ChainAttribute::Hook(vec![
                    Hook::Number(HookNumber::Other(base.hook)),
                    // The kernel reads the priority as a signed 32-bit number.
                    Hook::Priority(base.priority.cast_unsigned()),
                ]),
            ],
        }),
        flags: NLM_F_CREATE,
        text: format!(
            "add chain {family} {table} {name} {{ type {} hook {} priority {}; policy accept; }}",
            base.chain_type,
            base.hook_name,
            priority_text(base)
        ),
    })
}

/// A base chain's priority as `nft` writes it (`filter`, `dstnat`, `srcnat`, or the
/// number).
fn priority_text(base: BaseChain) -> String {
    match (base.chain_type, base.hook, base.priority) {
        ("filter", _, 0) => "filter".into(),
        ("nat", hook::PREROUTING, -100) => "dstnat".into(),
        ("nat", hook::POSTROUTING, 100) => "srcnat".into(),
        (_, _, p) => p.to_string(),
    }
}

/// `flush set <family> <table> <name>` (a map too): deletes all its elements.
pub fn flush_set(family: Family, table: &str, name: &str) -> Cmd {
    Cmd::built(Built {
        family,
        msg: NfTablesMessage::DeleteSetElement(SetElementMessage {
            attributes: vec![
                SetElementList::Table(table.to_string()),
                SetElementList::Set(name.to_string()),
            ],
        }),
        flags: 0,
        text: format!("flush set {family} {table} {name}"),
    })
}

/// `flush chain <family> <table> <name>`: deletes its rules.
pub fn flush_chain(family: Family, table: &str, name: &str) -> Cmd {
    Cmd::built(Built {
        family,
        msg: NfTablesMessage::DeleteRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(table.to_string()),
                RuleAttribute::Chain(name.to_string()),
            ],
        }),
        flags: 0,
        text: format!("flush chain {family} {table} {name}"),
    })
}

/// A named set as `nft` creates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    /// Its name.
    pub name: &'static str,
    /// Its id within the batch (rules of the same batch refer to it by name and id).
    pub id: u32,
    /// `nft`'s key type (`ipv4_addr` 7, `ipv6_addr` 8, concatenations 6 bits a field).
    pub key_type: u32,
    /// Key length in bytes (concatenated fields each padded to 4 bytes).
    pub key_len: u32,
    /// Whether elements carry timeouts (`flags timeout`).
    pub timeout: bool,
    /// `nft`'s user data (key byte order, `typeof` expression), shown by `nft list`.
    pub userdata: Vec<u8>,
    /// The set in `nft` syntax (what follows the name), for the text.
    pub shown: &'static str,
}

/// `add set <family> <table> <name> { ... }`.
pub fn add_set(family: Family, table: &str, spec: &SetSpec) -> Cmd {
    let mut flags = SetFlags::empty();
    if spec.timeout {
        flags |= SetFlags::Timeout;
    }
    let mut attributes = vec![
        SetAttribute::Table(table.to_string()),
        SetAttribute::Name(spec.name.to_string()),
        SetAttribute::Flags(flags),
        SetAttribute::KeyType(spec.key_type),
        SetAttribute::KeyLen(spec.key_len),
        SetAttribute::Id(spec.id),
    ];
    if !spec.userdata.is_empty() {
        attributes.push(SetAttribute::UserData(spec.userdata.clone()));
    }
    Cmd::built(Built {
        family,
        msg: NfTablesMessage::NewSet(netlink_packet_netfilter::nftables::SetMessage { attributes }),
        flags: NLM_F_CREATE,
        text: format!("add set {family} {table} {} {}", spec.name, spec.shown),
    })
}

/// `add map <family> <table> <name> { type <key> : verdict; }`: a named verdict map from
/// `spec`'s keys, as `nft` creates it (data type `NFT_DATA_VERDICT`, length 0; its user data:
/// the key's byte order as `spec` gives it, the data's 0). `spec.shown` is the map in `nft`
/// syntax; `spec.timeout` is ignored.
pub fn add_verdict_map(family: Family, table: &str, spec: &SetSpec) -> Cmd {
    /// `NFT_DATA_VERDICT`.
    const VERDICT: u32 = 0xffff_ff00;
    let mut userdata = spec.userdata.clone();
    // NFTNL_UDATA_SET_DATABYTEORDER (1) and NFTNL_UDATA_SET_MERGE_ELEMENTS (6), as nft
    // sends them: 0.
    for kind in [1u8, 6] {
        userdata.extend_from_slice(&[kind, 4]);
        userdata.extend_from_slice(&0u32.to_ne_bytes());
    }
    let attributes = vec![
        SetAttribute::Table(table.to_string()),
        SetAttribute::Name(spec.name.to_string()),
        SetAttribute::Flags(SetFlags::Map),
        SetAttribute::KeyType(spec.key_type),
        SetAttribute::KeyLen(spec.key_len),
        SetAttribute::DataType(VERDICT),
        SetAttribute::DataLen(0),
        SetAttribute::Id(spec.id),
        SetAttribute::UserData(userdata),
    ];
    Cmd::built(Built {
        family,
        msg: NfTablesMessage::NewSet(netlink_packet_netfilter::nftables::SetMessage { attributes }),
        flags: NLM_F_CREATE,
        text: format!("add map {family} {table} {} {}", spec.name, spec.shown),
    })
}

/// `add chain <family> <table> <name>`: a regular chain (no hook), reached by `jump`.
pub fn add_regular_chain(family: Family, table: &str, name: &str) -> Cmd {
    named_chain(family, table, name, false)
}

/// `delete chain <family> <table> <name>`: with its rules; the kernel refuses it (`EBUSY`)
/// while a map element or a rule still jumps to it.
pub fn delete_chain(family: Family, table: &str, name: &str) -> Cmd {
    named_chain(family, table, name, true)
}

/// A chain message naming only the table and the chain: `add chain` (`NLM_F_CREATE`) or,
/// with `delete`, `delete chain`.
fn named_chain(family: Family, table: &str, name: &str, delete: bool) -> Cmd {
    let m = ChainMessage {
        attributes: vec![
            ChainAttribute::Table(table.to_string()),
            ChainAttribute::Name(name.to_string()),
        ],
    };
    let (msg, flags, op) = match delete {
        true => (NfTablesMessage::DeleteChain(m), 0, "delete"),
        false => (NfTablesMessage::NewChain(m), NLM_F_CREATE, "add"),
    };
    Cmd::built(Built {
        family,
        msg,
        flags,
        text: format!("{op} chain {family} {table} {name}"),
    })
}

/// `immediate reg <reg> <data>`: `data` into `reg`.
pub fn immediate(reg: Register, data: &[u8]) -> Expr {
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(reg),
        Immediate::Data(DataAttribute::Value(data.to_vec())),
    ])
    .into()
}

/// An anonymous constant set of the same batch (`{ a, b }` in a rule), as `nft` creates
/// it: the set (`__set%d`, id `id`, `size` the number of keys) and one message adding its
/// keys. A rule refers to it with [`lookup`]`("__set%d", id, false)`.
pub fn add_anonymous_set(
    family: Family,
    table: &str,
    id: u32,
    key_type: u32,
    keys: &[&[u8]],
    userdata: &[u8],
    shown: &str,
) -> Batch {
    let key_len = keys.first().map_or(0, |k| k.len());
    let set = NfTablesMessage::NewSet(netlink_packet_netfilter::nftables::SetMessage {
        attributes: vec![
            SetAttribute::Table(table.to_string()),
            SetAttribute::Name(ANONYMOUS_SET.to_string()),
            SetAttribute::Flags(SetFlags::Anonymous | SetFlags::Constant),
            SetAttribute::KeyType(key_type),
            SetAttribute::KeyLen(u32::try_from(key_len).unwrap_or(u32::MAX)),
            SetAttribute::Id(id),
            SetAttribute::Description(vec![
                netlink_packet_netfilter::nftables::SetDescription::Size(
                    u32::try_from(keys.len()).unwrap_or(u32::MAX),
                ),
            ]),
            SetAttribute::UserData(userdata.to_vec()),
        ],
    });
    let elements = keys
        .iter()
        .map(|k| {
            ListAttribute::Element(vec![SetElementAttribute::Key(DataAttribute::Value(
                k.to_vec(),
            ))])
        })
        .collect();
    let elems = NfTablesMessage::NewSetElement(SetElementMessage {
        attributes: vec![
            SetElementList::Table(table.to_string()),
            SetElementList::Set(ANONYMOUS_SET.to_string()),
            SetElementList::SetId(id),
            SetElementList::Elements(elements),
        ],
    });
    Batch {
        cmds: vec![
            Cmd::built(Built {
                family,
                msg: set,
                flags: NLM_F_CREATE,
                text: format!("add set {family} {table} {ANONYMOUS_SET} {shown}"),
            }),
            Cmd::built(Built {
                family,
                msg: elems,
                flags: NLM_F_CREATE,
                text: format!("add element {family} {table} {ANONYMOUS_SET} {shown}"),
            }),
        ],
    }
}

/// The name an anonymous set is created with (the kernel numbers it).
pub const ANONYMOUS_SET: &str = "__set%d";

/// The name an anonymous map is created with (the kernel numbers it).
pub const ANONYMOUS_MAP: &str = "__map%d";

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A set element command on `table`'s `set` (names known at compile time: the fence's sets;
/// nothing is allocated for them), the timeout and expiration in whole milliseconds, rounded
/// down. `delete`: `delete element`, else `add element` (`NLM_F_CREATE`).
pub fn element(
    family: Family,
    table: &'static str,
    set: &'static str,
    key: Key,
    delete: bool,
    timeout: Option<Duration>,
    expires: Option<Duration>,
) -> Cmd {
    element_cmd(
        family,
        Cow::Borrowed(table),
        Cow::Borrowed(set),
        key,
        delete,
        timeout,
        expires,
    )
}

fn element_cmd(
    family: Family,
    table: Cow<'static, str>,
    set: Cow<'static, str>,
    key: Key,
    delete: bool,
    timeout: Option<Duration>,
    expires: Option<Duration>,
) -> Cmd {
    let timeout = timeout.map(millis);
    Cmd {
        family,
        flags: if delete { 0 } else { NLM_F_CREATE },
        body: Body::Element(Element {
            delete,
            table,
            set,
            key,
            timeout,
            expires: expires.filter(|_| timeout.is_some()).map(millis),
            data: None,
        }),
    }
}

/// A verdict map element command on `table`'s map `map` (names known at compile time: the
/// fence's maps): `add element <family> <table> <map> { <key> : <verdict> }`
/// (`NLM_F_CREATE`; the kernel refuses it with `EEXIST` when the key is there with another
/// verdict, so a change of verdict is a delete and then an add), or with `delete` (the
/// verdict is not sent), `delete element <family> <table> <map> { <key> }`.
pub fn map_element(
    family: Family,
    table: &'static str,
    map: &'static str,
    key: Key,
    verdict: MapVerdict,
    delete: bool,
) -> Cmd {
    let mut c = element(family, table, map, key, delete, None, None);
    if let Body::Element(e) = &mut c.body
        && !delete
    {
        e.data = Some(verdict);
    }
    c
}

/// `add element <family> <table> <set> { <shown> [timeout <ms>ms] }` with key bytes `key`
/// (network byte order, concatenated fields each padded to 4 bytes). A timeout is sent in
/// whole milliseconds, rounded down.
pub fn add_element(
    family: Family,
    table: &str,
    set: &str,
    key: &[u8],
    timeout: Option<Duration>,
    shown: &str,
) -> Cmd {
    new_element(family, table, set, key, timeout, None, shown)
}

/// [`add_element`], with the expiration attribute `expires` when given (with a timeout; the
/// kernel refuses an expiration longer than the timeout).
fn new_element(
    family: Family,
    table: &str,
    set: &str,
    key: &[u8],
    timeout: Option<Duration>,
    expires: Option<Duration>,
    shown: &str,
) -> Cmd {
    element_cmd(
        family,
        Cow::Owned(table.to_string()),
        Cow::Owned(set.to_string()),
        Key::Other(key.to_vec(), shown.to_string()),
        false,
        timeout,
        expires,
    )
}

/// `add element <family> <table> <set> { <shown> timeout <ms>ms expires <ms>ms }`: as
/// [`add_element`], with the expiration (`NFTA_SET_ELEM_EXPIRATION`) set to the timeout. On an
/// element that exists, a kernel that updates elements (found by the fence's probe; 6.18
/// does) sets its expiration from this attribute only: a plain add of the timeout the
/// element already has leaves it to expire at its old time (`nft add element ... { 192.0.2.10
/// timeout 2s }` twice a second apart shows `expires 988ms`; with `expires 2s`, `1s996ms`).
pub fn refresh_element(
    family: Family,
    table: &str,
    set: &str,
    key: &[u8],
    timeout: Duration,
    shown: &str,
) -> Cmd {
    new_element(family, table, set, key, Some(timeout), Some(timeout), shown)
}

/// `add element <family> <table> <set> { <shown> timeout <ms>ms expires <ms>ms }` with an
/// expiration `expires` other than the timeout (at most the timeout): the fence's probe sets
/// an element's expiration to 1 ms while keeping its timeout.
pub fn expiring_element(
    family: Family,
    table: &str,
    set: &str,
    key: &[u8],
    timeout: Duration,
    expires: Duration,
    shown: &str,
) -> Cmd {
    new_element(family, table, set, key, Some(timeout), Some(expires), shown)
}

/// `create element <family> <table> <set> { <shown> timeout <ms>ms }`: as [`add_element`],
/// but the kernel refuses it (EEXIST) when the element exists and has not expired.
pub fn create_element(
    family: Family,
    table: &str,
    set: &str,
    key: &[u8],
    timeout: Option<Duration>,
    shown: &str,
) -> Cmd {
    let mut c = add_element(family, table, set, key, timeout, shown);
    c.flags |= NLM_F_EXCL;
    c
}

/// `delete element <family> <table> <set> { <shown> }`.
pub fn delete_element(family: Family, table: &str, set: &str, key: &[u8], shown: &str) -> Cmd {
    let mut c = add_element(family, table, set, key, None, shown);
    c.flags = 0;
    if let Body::Element(e) = &mut c.body {
        e.delete = true;
    }
    c
}

/// `add rule <family> <table> <chain> <text>` with `exprs` (appended at the chain's end).
pub fn add_rule(family: Family, table: &str, chain: &str, exprs: Vec<Expr>, text: &str) -> Cmd {
    Cmd::built(Built {
        family,
        msg: NfTablesMessage::NewRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(table.to_string()),
                RuleAttribute::Chain(chain.to_string()),
                RuleAttribute::Expressions(exprs),
            ],
        }),
        flags: NLM_F_CREATE | NLM_F_APPEND,
        text: format!("add rule {family} {table} {chain} {text}"),
    })
}

/// [`add_rule`] with a comment (`comment "<comment>"` in `nft` syntax, stored as `nft`
/// does, [`dump::comment_userdata`]; cut to 127 bytes).
pub fn add_rule_commented(
    family: Family,
    table: &str,
    chain: &str,
    exprs: Vec<Expr>,
    text: &str,
    comment: &str,
) -> Cmd {
    let mut c = add_rule(
        family,
        table,
        chain,
        exprs,
        &format!("{text} comment {comment:?}"),
    );
    if let Body::Message {
        msg: NfTablesMessage::NewRule(r),
        ..
    } = &mut c.body
    {
        r.attributes
            .push(RuleAttribute::UserData(dump::comment_userdata(comment)));
    }
    c
}

// --- Expressions ----------------------------------------------------------------------

/// One expression of a rule.
pub type Expr = ListAttribute<ExpressionAttribute>;

/// A 32-bit attribute in network byte order.
pub fn be32(kind: u16, v: u32) -> DefaultNla {
    DefaultNla::new(kind, v.to_be_bytes().to_vec())
}

/// A 64-bit attribute in network byte order.
pub fn be64(kind: u16, v: u64) -> DefaultNla {
    DefaultNla::new(kind, v.to_be_bytes().to_vec())
}

/// A nested attribute holding `attrs`.
pub fn nested(kind: u16, attrs: &[DefaultNla]) -> DefaultNla {
    let mut buf = vec![0u8; attrs.buffer_len()];
    attrs.emit(&mut buf);
    DefaultNla::new(kind | NLA_F_NESTED, buf)
}

/// An expression the message crate does not model: `name` with `attrs`.
pub fn other(name: &str, attrs: Vec<DefaultNla>) -> Expr {
    Expressions::Other {
        expression_type: name.to_string(),
        attributes: attrs,
    }
    .into()
}

/// Payload bases (`NFT_PAYLOAD_*_HEADER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// The network header (IP, ARP).
    Network = 1,
    /// The transport header.
    Transport = 2,
}

/// `payload load <len>b @ <base> header + <offset> => reg 1`.
pub fn payload(base: Base, offset: u32, len: u32) -> Expr {
    payload_to(base, offset, len, Register::Reg1)
}

/// `payload load <len>b @ <base> header + <offset> => <reg>` (a concatenation's later
/// field).
pub fn payload_to(base: Base, offset: u32, len: u32, reg: Register) -> Expr {
    Expressions::Payload(vec![
        Payload::DestinationRegister(reg),
        Payload::Base(base as u32),
        Payload::Offset(offset),
        Payload::Len(len),
    ])
    .into()
}

/// `meta load <key> => reg 1`.
pub fn meta(key: MetaKey) -> Expr {
    meta_to(key, Register::Reg1)
}

/// `meta load <key> => <reg>` (a concatenation's later field goes to a 32-bit register
/// after the first field's, e.g. [`Register::Reg32_01`]).
pub fn meta_to(key: MetaKey, reg: Register) -> Expr {
    Expressions::Meta(vec![Meta::Key(key), Meta::DestinationRegister(reg)]).into()
}

/// `cmp eq reg 1 <data>` (or `neq` when `!equal`).
pub fn cmp(equal: bool, data: &[u8]) -> Expr {
    Expressions::Cmp(vec![
        Cmp::SourceRegister(Register::Reg1),
        Cmp::Op(if equal {
            Operator::Equal
        } else {
            Operator::NotEqual
        }),
        Cmp::Data(DataAttribute::Value(data.to_vec())),
    ])
    .into()
}

/// `lookup reg 1 set <set>` (set `id` of the same batch), `0x1` (not in the set) when
/// `invert`.
pub fn lookup(set: &str, id: u32, invert: bool) -> Expr {
    set_lookup(set, Some(id), Register::Reg1, invert)
}

/// `lookup reg <sreg> set <set>` (by name alone: a set of an earlier batch), `0x1` (not in
/// the set) when `invert`.
pub fn lookup_named(set: &str, sreg: Register, invert: bool) -> Expr {
    set_lookup(set, None, sreg, invert)
}

/// A set lookup without a destination register: [`lookup`], [`lookup_named`].
fn set_lookup(set: &str, id: Option<u32>, sreg: Register, invert: bool) -> Expr {
    let mut a = vec![Lookup::SourceRegister(sreg), Lookup::Set(set.to_string())];
    a.extend(id.map(Lookup::SetId));
    if invert {
        a.push(Lookup::Flags(1));
    }
    Expressions::Lookup(a).into()
}

/// `lookup reg <sreg> set <map> dreg <dreg>` (map `id` of the same batch): the data `map`
/// holds for the key in `sreg`, into `dreg` (with [`Register::Verdict`], the verdict of a
/// verdict map). A key not in the map ends the rule there (`NFT_BREAK`): the rule does not
/// match.
pub fn map_lookup_to(map: &str, id: u32, sreg: Register, dreg: Register) -> Expr {
    Expressions::Lookup(vec![
        Lookup::SourceRegister(sreg),
        Lookup::DestinationRegister(dreg),
        Lookup::Set(map.to_string()),
        Lookup::SetId(id),
    ])
    .into()
}

/// `counter`.
pub fn counter() -> Expr {
    other("counter", vec![])
}

/// `immediate reg 0 <verdict>` ([`NF_ACCEPT`], [`NF_DROP`]).
pub fn verdict(code: u32) -> Expr {
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(Register::Verdict),
        Immediate::Data(DataAttribute::Verdict(vec![VerdictAttribute::Code(
            Verdict::Other(code),
        )])),
    ])
    .into()
}

/// `nft`'s set user data giving the key's byte order (`NFTNL_UDATA_SET_KEYBYTEORDER`,
/// 2: big endian, 1: host), as `nft` stores it for `type` sets.
pub fn keybyteorder(order: u32) -> Vec<u8> {
    let mut u = vec![0u8, 4];
    u.extend_from_slice(&order.to_ne_bytes());
    u
}

/// The bytes of `hex` (pairs of hex digits; anything else ends it): for `nft`'s user data
/// constants.
pub fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map_while(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

pub mod dump;
pub mod nat;

#[cfg(test)]
mod tests;
