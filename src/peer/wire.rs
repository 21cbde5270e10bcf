//! The peer protocol's wire format: signed frames that every vipd puts on its VIP
//! interface's segment (heartbeats, hand-over requests, releases), and their checks.
//!
//! # Transport (why raw Ethernet)
//! Frames are raw Ethernet frames with the IEEE 802 *local experimental* EtherType
//! [`ETHERTYPE`] (0x88B5, IEEE Std 802-2014 §9.2.2: for private protocols that never leave a
//! site) sent to the locally administered group MAC [`GROUP_MAC`] (03:76:69:70:64:00, "vipd"
//! in the bytes after the I/G+U/L bits) on the VIP interface. Compared with UDP multicast:
//! * the same frame works on IPv4-only, IPv6-only and dual-stack segments, and needs no
//!   address on the interface (a node whose only address is being moved still talks);
//! * no multicast routing, no IGMP/MLD membership and so nothing for IGMP snooping switches
//!   to prune;
//! * it never leaves the L2 segment: exactly the failure domain of the ARP / neighbour
//!   advertisements that make a VIP reachable, which is what the peers vouch for;
//! * the receiver uses the `AF_PACKET` machinery vipd already has (`src/net/` sends GARPs
//!   through an `AF_PACKET` socket), filtered on the EtherType.
//!
//! # Frame payload (after the 14-byte Ethernet header), big-endian integers
//! | bytes | field |
//! |---|---|
//! | 4 | magic `VIPD` (0x88B5 is shared by every experimental protocol) |
//! | 1 | version, [`VERSION`] |
//! | 1 | kind: 1 heartbeat, 2 hand-over request, 3 released ([`Kind`]) |
//! | 1 | flags: bit 0 `api_reachable`, bit 1 `api_heard`, bit 2 `api_hold` ([`Flags`]); other bits 0 |
//! | 2 | part index, from 0 |
//! | 2 | number of parts (1..=[`MAX_PARTS`]) |
//! | 8 | boot id (random per process start) |
//! | 8 | sequence number, strictly increasing per boot, one per frame |
//! | 8 | sender wall-clock time, ms since the Unix epoch |
//! | 8 | membership digest (see `super::membership_digest`) |
//! | 1+n | sender node name (DNS-1123 subdomain, n ≤ 253) |
//! | 1+n | hand-over request only: target node name (the holder asked) |
//! | 2 | number of leases in this part |
//! | per lease | namespace (1+n, DNS-1123 label), name (1+n, DNS-1123 subdomain), term (8), resourceVersion (1+n, 1..=[`MAX_RESOURCE_VERSION`] bytes) |
//! | 32 | HMAC-SHA256 over every byte before it ([`PeerKey`]) |
//!
//! The whole payload is at most [`MAX_PAYLOAD`] bytes (the Ethernet MTU). A node that holds
//! more leases than fit in one frame sends one message as several frames ("parts") with
//! consecutive sequence numbers, the same kind and flags, and the leases split between them;
//! [`Assembler`] puts them back together (a message counts only once all its parts
//! arrived). At most [`MAX_LEASES`] leases per message: [`Encoder::encode`] refuses more
//! ([`EncodeError::TooManyLeases`]); at worst-case name lengths that is 256 frames.
//!
//! The MAC is the full 32-byte HMAC-SHA256 (RFC 2104), checked with `ring::hmac::verify`
//! (constant time): a frame has room for it, and a full tag needs no truncation argument and
//! no hand-written comparison.
//!
//! Decoding never panics on any input; [`Verifier`] adds the checks that need memory
//! (replays, old boots, clock skew) and counts every rejection by reason.

use std::fmt;

use ring::hmac;

use crate::syntax::{is_dns1123_label, is_dns1123_subdomain};

/// EtherType of peer frames: IEEE 802 local experimental EtherType 1.
pub const ETHERTYPE: u16 = 0x88B5;
/// Destination of peer frames: a locally administered group (multicast) MAC.
pub const GROUP_MAC: [u8; 6] = [0x03, 0x76, 0x69, 0x70, 0x64, 0x00];
/// First bytes of every payload.
pub const MAGIC: [u8; 4] = *b"VIPD";
/// The only version this code writes and reads.
pub const VERSION: u8 = 1;
/// Largest payload, in bytes (Ethernet MTU).
pub const MAX_PAYLOAD: usize = 1500;
/// Length of the HMAC-SHA256 tag at the end of every payload, in bytes.
pub const MAC_LEN: usize = 32;
/// Most leases one message may list (all parts together).
pub const MAX_LEASES: usize = 512;
/// Most parts one message may have.
pub const MAX_PARTS: usize = 256;
/// Longest resourceVersion carried, in bytes (etcd revisions are at most 20 digits).
pub const MAX_RESOURCE_VERSION: usize = 64;
/// Shortest accepted key, in bytes (the HMAC-SHA256 output length, RFC 2104 §3).
pub const MIN_KEY_LEN: usize = 32;

/// Fixed part of the header: magic, version, kind, flags, part, parts, boot id, seq,
/// wall-clock ms, membership digest.
const FIXED_HEADER: usize = 4 + 1 + 1 + 1 + 2 + 2 + 8 + 8 + 8 + 8;
const FLAG_API_REACHABLE: u8 = 1;
const FLAG_API_HEARD: u8 = 2;
const FLAG_API_HOLD: u8 = 4;

/// The shared secret that signs and checks frames (later read from a Kubernetes Secret).
/// Its `Debug` never prints the key.
#[derive(Clone)]
pub struct PeerKey {
    key: hmac::Key,
}

/// Errors of [`PeerKey::from_bytes`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// The key is shorter than [`MIN_KEY_LEN`].
    #[error("peer key: {len} bytes, at least {min} needed")]
    TooShort {
        /// Length given, in bytes.
        len: usize,
        /// [`MIN_KEY_LEN`].
        min: usize,
    },
}

impl PeerKey {
    /// A key from the Secret's bytes.
    ///
    /// # Errors
    /// [`KeyError::TooShort`] below [`MIN_KEY_LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort {
                len: bytes.len(),
                min: MIN_KEY_LEN,
            });
        }
        Ok(PeerKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, bytes),
        })
    }
}

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerKey(HMAC-SHA256, redacted)")
    }
}

/// What a message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Periodic: "I am alive, this is what I hold".
    Heartbeat = 1,
    /// "Holder `target`, please hand over this lease" (exactly one lease).
    HandOverRequest = 2,
    /// "I no longer answer for these leases' VIPs" (sent after they are gone).
    Released = 3,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Heartbeat),
            2 => Some(Kind::HandOverRequest),
            3 => Some(Kind::Released),
            _ => None,
        }
    }
}

/// Sender's view of the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags {
    /// The sender reaches the API server itself.
    pub api_reachable: bool,
    /// The sender received a valid frame with `api_reachable` within the liveness window.
    pub api_heard: bool,
    /// Neither of the above any more, but the sender is within the hold time it promised
    /// after its last frame with one of them (see `ridethrough::RideConfig::flag_hold`).
    pub api_hold: bool,
}

impl Flags {
    /// Any flag: the API was reachable from the segment recently (a holder that hears this
    /// does not ride through).
    pub fn any(self) -> bool {
        self.api_reachable || self.api_heard || self.api_hold
    }

    /// `api_reachable` or `api_heard`: the sender vouches now, which renews its promise to
    /// keep some flag set for the hold time.
    pub fn vouches(self) -> bool {
        self.api_reachable || self.api_heard
    }

    fn to_u8(self) -> u8 {
        u8::from(self.api_reachable) * FLAG_API_REACHABLE
            + u8::from(self.api_heard) * FLAG_API_HEARD
            + u8::from(self.api_hold) * FLAG_API_HOLD
    }
}

/// A Lease, by namespace and name (the one type the Services runtime uses too).
pub use crate::kube::ObjectKey as LeaseRef;

/// A lease as its holder knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    /// Which lease.
    pub lease: LeaseRef,
    /// The holder's term (acquisition counter of its process).
    pub term: u64,
    /// The Lease's resourceVersion after the holder's last successful write.
    pub resource_version: String,
}

/// One message before encoding / after assembly (all parts together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// What it says.
    pub kind: Kind,
    /// Sender node name.
    pub node: String,
    /// Sender's view of the API server.
    pub flags: Flags,
    /// Sender's membership digest.
    pub membership: u64,
    /// Sender wall-clock time, ms since the Unix epoch.
    pub wall_ms: u64,
    /// Held leases (heartbeat), the lease asked for (hand-over request, exactly one), or the
    /// released leases (released).
    pub leases: Vec<HeldLease>,
    /// Hand-over request only: the holder asked.
    pub target: Option<String>,
}

/// One decoded frame (one part of a message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Sender's boot id.
    pub boot_id: u64,
    /// Sequence number.
    pub seq: u64,
    /// Part index, from 0.
    pub part: u16,
    /// Number of parts of the message.
    pub parts: u16,
    /// The message fields; `leases` holds this part's leases only.
    pub message: Message,
}

/// Errors of [`Encoder::encode`]: the message cannot be put on the wire.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// A node name (sender or target) is not a DNS-1123 subdomain.
    #[error("peer frame: {field} {value:?} is not a DNS-1123 subdomain")]
    NodeName {
        /// `node` or `target`.
        field: &'static str,
        /// The value.
        value: String,
    },
    /// A lease's namespace or name is not valid.
    #[error("peer frame: lease {field} {value:?} is not a valid {expected}")]
    LeaseName {
        /// `namespace` or `name`.
        field: &'static str,
        /// The value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A resourceVersion is empty or longer than [`MAX_RESOURCE_VERSION`].
    #[error("peer frame: lease {lease} resourceVersion of {len} bytes (1..={max} allowed)")]
    ResourceVersion {
        /// The lease.
        lease: String,
        /// Its length, in bytes.
        len: usize,
        /// [`MAX_RESOURCE_VERSION`].
        max: usize,
    },
    /// More than [`MAX_LEASES`] leases.
    #[error("peer frame: {count} leases, at most {max} per message")]
    TooManyLeases {
        /// Leases given.
        count: usize,
        /// [`MAX_LEASES`].
        max: usize,
    },
    /// A hand-over request must name a target and exactly one lease; other kinds no target.
    #[error("peer frame: {0}")]
    Shape(&'static str),
    /// This boot's sequence numbers are used up (after 2^64 frames).
    #[error("peer frame: sequence numbers of this boot exhausted")]
    SeqExhausted,
}

/// Errors of [`decode`]: what is wrong with a received payload.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than the smallest valid payload.
    #[error("peer frame: {len} bytes, too short")]
    TooShort {
        /// Payload length, in bytes.
        len: usize,
    },
    /// Longer than [`MAX_PAYLOAD`].
    #[error("peer frame: {len} bytes, more than {max}")]
    TooLong {
        /// Payload length, in bytes.
        len: usize,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
    /// Not a vipd frame.
    #[error("peer frame: bad magic {found:02x?}")]
    Magic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A version this code does not read.
    #[error("peer frame: version {found}, this vipd reads version {VERSION}")]
    Version {
        /// The version byte.
        found: u8,
    },
    /// The HMAC does not match (forged, corrupted, or signed with another key).
    #[error("peer frame: bad MAC (forged, corrupted or another key)")]
    Mac,
    /// A field ends past the MAC.
    #[error("peer frame: truncated in {field}")]
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// A field has a value outside its rules.
    #[error("peer frame: {field} {value}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong, with the value.
        value: String,
    },
    /// Bytes left between the last lease and the MAC.
    #[error("peer frame: {count} unexpected bytes before the MAC")]
    Trailing {
        /// How many.
        count: usize,
    },
}

/// A random boot id for this process start (`ring::rand::SystemRandom`, the OS generator).
///
/// # Errors
/// The OS random generator failed.
pub fn new_boot_id() -> Result<u64, ring::error::Unspecified> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    ring::rand::SystemRandom::new().fill(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Signs messages of one boot and numbers their frames.
#[derive(Debug)]
pub struct Encoder {
    key: PeerKey,
    boot_id: u64,
    next_seq: u64,
}

impl Encoder {
    /// An encoder for this boot (`boot_id` from [`new_boot_id`]); sequence numbers start at 1.
    pub fn new(key: PeerKey, boot_id: u64) -> Self {
        Encoder {
            key,
            boot_id,
            next_seq: 1,
        }
    }

    /// Signs the next frames with `key` (a key rotation; the sequence numbers go on).
    pub fn set_key(&mut self, key: PeerKey) {
        self.key = key;
    }

    /// This boot's id.
    pub fn boot_id(&self) -> u64 {
        self.boot_id
    }

    /// The message as one or more signed payloads (each ≤ [`MAX_PAYLOAD`] bytes), to be sent
    /// in order.
    ///
    /// # Errors
    /// [`EncodeError`] naming the field and value that cannot be sent.
    pub fn encode(&mut self, msg: &Message) -> Result<Vec<Vec<u8>>, EncodeError> {
        validate(msg)?;
        let mut prefix_len = FIXED_HEADER + 1 + msg.node.len() + 2 + MAC_LEN;
        if let Some(t) = &msg.target {
            prefix_len += 1 + t.len();
        }
        // Split the leases into parts that fit.
        let mut parts: Vec<&[HeldLease]> = Vec::new();
        let mut start = 0;
        let mut size = prefix_len;
        for (i, l) in msg.leases.iter().enumerate() {
            let len = lease_len(l);
            if size + len > MAX_PAYLOAD && i > start {
                parts.push(&msg.leases[start..i]);
                start = i;
                size = prefix_len;
            }
            size += len;
        }
        parts.push(&msg.leases[start..]);
        let count = parts.len();
        let too_many = || EncodeError::TooManyLeases {
            count: msg.leases.len(),
            max: MAX_LEASES,
        };
        if count > MAX_PARTS {
            return Err(too_many());
        }
        let count16 = u16::try_from(count).map_err(|_| too_many())?;
        let last_seq = self
            .next_seq
            .checked_add(count as u64)
            .ok_or(EncodeError::SeqExhausted)?;
        let mut out = Vec::with_capacity(count);
        for (i, leases) in parts.into_iter().enumerate() {
            let seq = self.next_seq + i as u64;
            // i < count ≤ u16::MAX, checked above.
            let part = u16::try_from(i).unwrap_or(u16::MAX);
            out.push(self.encode_part(msg, seq, part, count16, leases));
        }
        self.next_seq = last_seq;
        Ok(out)
    }

    fn encode_part(
        &self,
        msg: &Message,
        seq: u64,
        part: u16,
        parts: u16,
        leases: &[HeldLease],
    ) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAX_PAYLOAD);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(msg.kind as u8);
        b.push(msg.flags.to_u8());
        b.extend_from_slice(&part.to_be_bytes());
        b.extend_from_slice(&parts.to_be_bytes());
        b.extend_from_slice(&self.boot_id.to_be_bytes());
        b.extend_from_slice(&seq.to_be_bytes());
        b.extend_from_slice(&msg.wall_ms.to_be_bytes());
        b.extend_from_slice(&msg.membership.to_be_bytes());
        put_str(&mut b, &msg.node);
        if let Some(t) = &msg.target {
            put_str(&mut b, t);
        }
        // leases.len() ≤ MAX_LEASES, checked by validate.
        b.extend_from_slice(
            &u16::try_from(leases.len())
                .unwrap_or(u16::MAX)
                .to_be_bytes(),
        );
        for l in leases {
            put_str(&mut b, &l.lease.namespace);
            put_str(&mut b, &l.lease.name);
            b.extend_from_slice(&l.term.to_be_bytes());
            put_str(&mut b, &l.resource_version);
        }
        let tag = hmac::sign(&self.key.key, &b);
        b.extend_from_slice(tag.as_ref());
        b
    }
}

/// `body` followed by its MAC under `key`: lets tests build payloads the encoder refuses.
#[cfg(test)]
pub(crate) fn sign_raw(key: &PeerKey, body: &[u8]) -> Vec<u8> {
    let mut b = body.to_vec();
    b.extend_from_slice(hmac::sign(&key.key, body).as_ref());
    b
}

/// Appends a string of at most 255 bytes (checked by `validate`) with its length byte.
fn put_str(b: &mut Vec<u8>, s: &str) {
    b.push(u8::try_from(s.len()).unwrap_or(u8::MAX));
    b.extend_from_slice(s.as_bytes());
}

fn lease_len(l: &HeldLease) -> usize {
    1 + l.lease.namespace.len() + 1 + l.lease.name.len() + 8 + 1 + l.resource_version.len()
}

fn validate(msg: &Message) -> Result<(), EncodeError> {
    if !is_dns1123_subdomain(&msg.node) {
        return Err(EncodeError::NodeName {
            field: "node",
            value: msg.node.clone(),
        });
    }
    match (msg.kind, &msg.target) {
        (Kind::HandOverRequest, Some(t)) => {
            if !is_dns1123_subdomain(t) {
                return Err(EncodeError::NodeName {
                    field: "target",
                    value: t.clone(),
                });
            }
            if msg.leases.len() != 1 {
                return Err(EncodeError::Shape(
                    "a hand-over request names exactly one lease",
                ));
            }
        }
        (Kind::HandOverRequest, None) => {
            return Err(EncodeError::Shape("a hand-over request names its target"));
        }
        (_, Some(_)) => {
            return Err(EncodeError::Shape(
                "only a hand-over request names a target",
            ));
        }
        (_, None) => {}
    }
    if msg.leases.len() > MAX_LEASES {
        return Err(EncodeError::TooManyLeases {
            count: msg.leases.len(),
            max: MAX_LEASES,
        });
    }
    for l in &msg.leases {
        check_lease(l).map_err(|(field, value, expected)| match field {
            "resourceVersion" => EncodeError::ResourceVersion {
                lease: l.lease.to_string(),
                len: l.resource_version.len(),
                max: MAX_RESOURCE_VERSION,
            },
            _ => EncodeError::LeaseName {
                field,
                value,
                expected,
            },
        })?;
    }
    Ok(())
}

/// The field rules of one lease entry, shared by encoding and decoding: `Err((field, value,
/// expected))`.
fn check_lease(l: &HeldLease) -> Result<(), (&'static str, String, &'static str)> {
    if !is_dns1123_label(&l.lease.namespace) {
        return Err(("namespace", l.lease.namespace.clone(), "DNS-1123 label"));
    }
    if !is_dns1123_subdomain(&l.lease.name) {
        return Err(("name", l.lease.name.clone(), "DNS-1123 subdomain"));
    }
    let rv = l.resource_version.len();
    if rv == 0 || rv > MAX_RESOURCE_VERSION {
        return Err((
            "resourceVersion",
            l.resource_version.clone(),
            "resourceVersion of 1 to 64 bytes",
        ));
    }
    Ok(())
}

/// A bounds-checked reader: every read returns [`DecodeError::Truncated`] instead of
/// panicking.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or(DecodeError::Truncated { field })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        let s = self.take(2, field)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let s = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_be_bytes(a))
    }

    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let n = usize::from(self.u8(field)?);
        let s = self.take(n, field)?;
        String::from_utf8(s.to_vec()).map_err(|_| DecodeError::Field {
            field,
            value: format!("is not UTF-8: {s:02x?}"),
        })
    }
}

/// Checks and decodes one payload: length, magic, version, then the MAC over everything
/// before the last [`MAC_LEN`] bytes, then the fields and their rules. Never panics.
///
/// # Errors
/// [`DecodeError`] naming what is wrong.
pub fn decode(key: &PeerKey, payload: &[u8]) -> Result<Frame, DecodeError> {
    let body = verified_body(key, payload)?;
    let mut r = Reader { b: body, pos: 5 };
    let (kind, flags) = read_kind_and_flags(&mut r)?;
    let part = r.u16("part")?;
    let parts = r.u16("parts")?;
    if parts == 0 || part >= parts || usize::from(parts) > MAX_PARTS {
        return Err(DecodeError::Field {
            field: "part",
            value: format!("{part} of {parts} parts"),
        });
    }
    let boot_id = r.u64("boot id")?;
    let seq = r.u64("seq")?;
    let wall_ms = r.u64("wall-clock time")?;
    let membership = r.u64("membership digest")?;
    let node = read_node_name(&mut r, "node")?;
    let target = if kind == Kind::HandOverRequest {
        Some(read_node_name(&mut r, "target")?)
    } else {
        None
    };
    let count = usize::from(r.u16("lease count")?);
    if count > MAX_LEASES {
        return Err(DecodeError::Field {
            field: "lease count",
            value: format!("{count} is more than {MAX_LEASES}"),
        });
    }
    if kind == Kind::HandOverRequest && (count != 1 || parts != 1) {
        return Err(DecodeError::Field {
            field: "lease count",
            value: format!("{count} in {parts} parts; a hand-over request names exactly one"),
        });
    }
    let leases = read_leases(&mut r, count)?;
    if r.pos != body.len() {
        return Err(DecodeError::Trailing {
            count: body.len() - r.pos,
        });
    }
    Ok(Frame {
        boot_id,
        seq,
        part,
        parts,
        message: Message {
            kind,
            node,
            flags,
            membership,
            wall_ms,
            leases,
            target,
        },
    })
}

/// Checks a payload's envelope (length, magic, version) and its MAC; returns what the MAC
/// covers (everything before the last [`MAC_LEN`] bytes).
fn verified_body<'a>(key: &PeerKey, payload: &'a [u8]) -> Result<&'a [u8], DecodeError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(DecodeError::TooLong {
            len: payload.len(),
            max: MAX_PAYLOAD,
        });
    }
    if payload.len() < 5 {
        return Err(DecodeError::TooShort { len: payload.len() });
    }
    let mut magic = [0u8; 4];
    magic.copy_from_slice(&payload[..4]);
    if magic != MAGIC {
        return Err(DecodeError::Magic { found: magic });
    }
    if payload[4] != VERSION {
        return Err(DecodeError::Version { found: payload[4] });
    }
    // Smallest: header, 1-character node name, lease count, MAC.
    if payload.len() < FIXED_HEADER + 2 + 2 + MAC_LEN {
        return Err(DecodeError::TooShort { len: payload.len() });
    }
    let (body, tag) = payload.split_at(payload.len() - MAC_LEN);
    hmac::verify(&key.key, body, tag).map_err(|_| DecodeError::Mac)?;
    Ok(body)
}

/// Reads the kind and flags bytes, each checked.
fn read_kind_and_flags(r: &mut Reader<'_>) -> Result<(Kind, Flags), DecodeError> {
    let kind_byte = r.u8("kind")?;
    let kind = Kind::from_u8(kind_byte).ok_or(DecodeError::Field {
        field: "kind",
        value: format!("{kind_byte} is not 1, 2 or 3"),
    })?;
    let flags_byte = r.u8("flags")?;
    if flags_byte & !(FLAG_API_REACHABLE | FLAG_API_HEARD | FLAG_API_HOLD) != 0 {
        return Err(DecodeError::Field {
            field: "flags",
            value: format!("{flags_byte:#04x} has unknown bits"),
        });
    }
    let flags = Flags {
        api_reachable: flags_byte & FLAG_API_REACHABLE != 0,
        api_heard: flags_byte & FLAG_API_HEARD != 0,
        api_hold: flags_byte & FLAG_API_HOLD != 0,
    };
    Ok((kind, flags))
}

/// Reads a node name (`field`: the sender, or a hand-over request's target), checked to be
/// a DNS-1123 subdomain.
fn read_node_name(r: &mut Reader<'_>, field: &'static str) -> Result<String, DecodeError> {
    let name = r.string(field)?;
    if !is_dns1123_subdomain(&name) {
        return Err(DecodeError::Field {
            field,
            value: format!("{name:?} is not a DNS-1123 subdomain"),
        });
    }
    Ok(name)
}

/// Reads `count` held leases (namespace, name, term, resourceVersion), each checked.
fn read_leases(r: &mut Reader<'_>, count: usize) -> Result<Vec<HeldLease>, DecodeError> {
    let mut leases = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let namespace = r.string("lease namespace")?;
        let name = r.string("lease name")?;
        let term = r.u64("lease term")?;
        let resource_version = r.string("lease resourceVersion")?;
        let l = HeldLease {
            lease: LeaseRef { namespace, name },
            term,
            resource_version,
        };
        check_lease(&l).map_err(|(field, value, expected)| DecodeError::Field {
            field,
            value: format!("{value:?} is not a {expected}"),
        })?;
        leases.push(l);
    }
    Ok(leases)
}
