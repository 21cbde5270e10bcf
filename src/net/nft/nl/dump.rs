//! Reading rules back: `NFT_MSG_GETRULE` with `NLM_F_DUMP` for one chain, each rule's
//! comment (`nft`'s user data, [`comment_userdata`]) and the packets and bytes of its
//! `counter` expression (uapi `NFTA_COUNTER_BYTES` 1, `NFTA_COUNTER_PACKETS` 2, 64-bit
//! big endian). What `nft list chain` shows, without the `nft` binary.

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla,
};
use netlink_packet_netfilter::nftables::{
    ExpressionAttribute, Expressions, ListAttribute, NfTablesMessage, RuleAttribute, RuleMessage,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner};

use super::{Family, NftError, NftSocket};

/// `NFTNL_UDATA_RULE_COMMENT`: the type of a rule comment in `nft`'s user data.
const UDATA_RULE_COMMENT: u8 = 0;

/// One rule as read back: its comment and its counter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleCount {
    /// The rule's comment (`comment "..."` in `nft` syntax), if any.
    pub comment: Option<String>,
    /// Packets its `counter` counted (0 without a counter).
    pub packets: u64,
    /// Bytes its `counter` counted.
    pub bytes: u64,
}

/// `nft`'s user data of a rule comment: type, length (with the NUL), the text, NUL. Texts
/// longer than 127 bytes are cut at a character boundary (`nft` allows 128 with the NUL).
pub fn comment_userdata(text: &str) -> Vec<u8> {
    let mut end = text.len().min(127);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text.as_bytes()[..end];
    let mut u = vec![
        UDATA_RULE_COMMENT,
        u8::try_from(text.len() + 1).unwrap_or(128),
    ];
    u.extend_from_slice(text);
    u.push(0);
    u
}

/// The comment in `nft` user data `u`, if it holds one.
pub fn comment_of(u: &[u8]) -> Option<String> {
    let mut rest = u;
    while let [kind, len, tail @ ..] = rest {
        let len = usize::from(*len);
        let value = tail.get(..len)?;
        if *kind == UDATA_RULE_COMMENT {
            let text = value.strip_suffix(&[0]).unwrap_or(value);
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        rest = &tail[len..];
    }
    None
}

/// The [`RuleCount`] of a rule's attributes.
pub fn rule_count(attributes: &[RuleAttribute]) -> RuleCount {
    let mut r = RuleCount::default();
    for a in attributes {
        match a {
            RuleAttribute::UserData(u) => r.comment = comment_of(u),
            RuleAttribute::Expressions(exprs) => {
                for e in exprs {
                    if let Some((p, b)) = counter_of(e) {
                        r.packets += p;
                        r.bytes += b;
                    }
                }
            }
            _ => {}
        }
    }
    r
}

fn counter_of(e: &ListAttribute<ExpressionAttribute>) -> Option<(u64, u64)> {
    let ListAttribute::Element(attrs) = e else {
        return None;
    };
    attrs.iter().find_map(|a| match a {
        ExpressionAttribute::Data(Expressions::Other {
            expression_type,
            attributes,
        }) if expression_type == "counter" => {
            let value = |kind: u16| {
                attributes
                    .iter()
                    .find(|n| n.kind() & 0x3fff == kind)
                    .and_then(|n| {
                        let mut v = vec![0u8; n.value_len()];
                        n.emit_value(&mut v);
                        <[u8; 8]>::try_from(v.as_slice()).ok()
                    })
                    .map(u64::from_be_bytes)
                    .unwrap_or(0)
            };
            Some((value(2), value(1)))
        }
        _ => None,
    })
}

impl NftSocket {
    /// The rules of chain `chain` of `family table`, in order ([`RuleCount`] each).
    ///
    /// # Errors
    /// [`NftError::Io`] on a socket error or an unreadable answer; [`NftError::Batch`]
    /// with the kernel's errno when it refuses the dump (no such table or chain:
    /// `ENOENT`).
    pub fn rule_counts(
        &self,
        family: Family,
        table: &str,
        chain: &str,
    ) -> Result<Vec<RuleCount>, NftError> {
        let what = format!("list chain {family} {table} {chain}");
        let io = |detail: String| NftError::Io {
            batch: what.clone(),
            detail,
        };
        let msg = NfTablesMessage::GetRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(table.to_string()),
                RuleAttribute::Chain(chain.to_string()),
            ],
        });
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = 1;
        let inner = NetfilterMessage::new(NetfilterHeader::new(family.proto(), 0, 0), msg);
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(inner));
        nl.finalize();
        let mut bytes = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut bytes);
        self.sock
            .send(&bytes, 0)
            .map_err(|e| io(format!("sending: {e}")))?;
        let mut out = Vec::new();
        loop {
            let (data, _) = self
                .sock
                .recv_from_full()
                .map_err(|e| io(format!("reading the rules: {e}")))?;
            let mut off = 0;
            while let Some(rest) = data.get(off..).filter(|r| !r.is_empty()) {
                let m = NetlinkMessage::<NetfilterMessage>::deserialize(rest)
                    .map_err(|e| io(format!("unreadable answer: {e}")))?;
                let len = usize::try_from(m.header.length).unwrap_or(0);
                if len == 0 {
                    return Ok(out);
                }
                off += (len + 3) & !3;
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        let errno = e.code.map(|c| c.get().abs()).unwrap_or(0);
                        if errno != 0 {
                            return Err(NftError::Batch { batch: what, errno });
                        }
                    }
                    NetlinkPayload::InnerMessage(NetfilterMessage {
                        inner: NetfilterMessageInner::NfTables(NfTablesMessage::NewRule(r)),
                        ..
                    }) => out.push(rule_count(&r.attributes)),
                    _ => {}
                }
            }
        }
    }
}

/// [`NftSocket::rule_counts`] on a new socket, from a blocking thread.
///
/// # Errors
/// As [`NftSocket::open`] and [`NftSocket::rule_counts`].
pub async fn rule_counts(
    family: Family,
    table: &str,
    chain: &str,
) -> Result<Vec<RuleCount>, NftError> {
    let (table, chain) = (table.to_string(), chain.to_string());
    let what = format!("list chain {family} {table} {chain}");
    tokio::task::spawn_blocking(move || NftSocket::open()?.rule_counts(family, &table, &chain))
        .await
        .unwrap_or_else(|e| {
            Err(NftError::Io {
                batch: what,
                detail: e.to_string(),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_round_trip_and_are_cut_at_a_character() {
        let u = comment_userdata("default/web");
        assert_eq!(u[0], 0);
        assert_eq!(usize::from(u[1]), "default/web".len() + 1);
        assert_eq!(comment_of(&u).as_deref(), Some("default/web"));
        let long = "é".repeat(100);
        let u = comment_userdata(&long);
        assert!(usize::from(u[1]) <= 128);
        assert_eq!(comment_of(&u), Some("é".repeat(63)));
        // Other user data before the comment is skipped; truncated data is no comment.
        let mut other = vec![3, 2, 9, 9];
        other.extend(comment_userdata("x"));
        assert_eq!(comment_of(&other).as_deref(), Some("x"));
        assert_eq!(comment_of(&[0, 10, b'a']), None);
    }

    #[test]
    fn the_counter_of_a_rule_is_read() {
        let counter = Expressions::Other {
            expression_type: "counter".into(),
            attributes: vec![super::super::be64(1, 1500), super::super::be64(2, 3)],
        };
        let r = rule_count(&[
            RuleAttribute::UserData(comment_userdata("a/b")),
            RuleAttribute::Expressions(vec![super::super::counter(), counter.into()]),
        ]);
        assert_eq!(
            r,
            RuleCount {
                comment: Some("a/b".into()),
                packets: 3,
                bytes: 1500
            }
        );
    }
}
