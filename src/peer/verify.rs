//! Checking received frames ([`Verifier`]: MAC, replay, clock skew, per sender) and putting
//! multi-frame messages back together ([`Assembler`]). Re-exported by [`super::wire`].

use std::collections::BTreeMap;

use super::wire::{DecodeError, Frame, HeldLease, Message, PeerKey, decode};

/// Why [`Verifier::verify`] rejected a frame.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// The payload itself is bad (see [`DecodeError`]).
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The sender's clock differs from ours by more than the allowed skew.
    #[error(
        "peer frame from {node}: its clock is {offset_ms} ms off ours (at most {max_ms} ms allowed)"
    )]
    Skew {
        /// Sender.
        node: String,
        /// Sender's time minus ours, in ms.
        offset_ms: i128,
        /// The allowed skew, in ms.
        max_ms: u64,
    },
    /// Sequence number not above the last accepted one of the same boot.
    #[error("peer frame from {node}: sequence {seq} replayed (last accepted {last})")]
    Replay {
        /// Sender.
        node: String,
        /// The frame's sequence number.
        seq: u64,
        /// The last accepted sequence number of that boot.
        last: u64,
    },
    /// A boot id not seen before whose time is not after the last accepted frame's.
    #[error(
        "peer frame from {node}: boot {boot_id:016x} is not newer than the last accepted frame ({wall_ms} ms <= {last_wall_ms} ms)"
    )]
    OldBoot {
        /// Sender.
        node: String,
        /// The frame's boot id.
        boot_id: u64,
        /// The frame's wall-clock time, ms.
        wall_ms: u64,
        /// Wall-clock time of the last frame accepted from that node, ms.
        last_wall_ms: u64,
    },
}

/// Counts of accepted and rejected frames, by reason (exported as metrics later).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames accepted.
    pub accepted: u64,
    /// Bad or missing MAC.
    pub bad_mac: u64,
    /// Unknown version.
    pub bad_version: u64,
    /// Not a vipd frame (magic).
    pub bad_magic: u64,
    /// Any other malformed payload (length, truncation, field rules).
    pub malformed: u64,
    /// Clock skew above the limit.
    pub skew: u64,
    /// Replayed sequence number.
    pub replay: u64,
    /// Replayed old boot.
    pub old_boot: u64,
}

#[derive(Debug, Clone, Copy)]
struct SenderState {
    boot_id: u64,
    last_seq: u64,
    last_wall_ms: u64,
}

/// Default largest accepted difference between a sender's clock and ours.
pub const DEFAULT_MAX_SKEW_MS: u64 = 10_000;

/// Checks frames against the key and against what each sender sent before: per sender node
/// it keeps (boot id, last sequence number, last wall-clock time).
///
/// Rules: the MAC and fields ([`decode`]); the sender's wall-clock time within `max_skew_ms`
/// of ours; within one boot, sequence numbers strictly increase; a new boot id from a known
/// node is accepted only if its time is after the last accepted frame's (an old boot's frames
/// cannot be replayed once a newer one was heard). The first frame of an unknown node is
/// accepted (within the skew). Every rejection is counted in [`Verifier::counters`].
#[derive(Debug)]
pub struct Verifier {
    key: PeerKey,
    /// A second key also accepted (the previous one during a key rotation,
    /// [`crate::peer::key::KeyRing`]).
    previous: Option<PeerKey>,
    max_skew_ms: u64,
    senders: BTreeMap<String, SenderState>,
    counters: Counters,
}

impl Verifier {
    /// A verifier with this key and allowed clock skew in ms ([`DEFAULT_MAX_SKEW_MS`]).
    pub fn new(key: PeerKey, max_skew_ms: u64) -> Self {
        Verifier {
            key,
            previous: None,
            max_skew_ms,
            senders: BTreeMap::new(),
            counters: Counters::default(),
        }
    }

    /// Checks frames against `key`, and also `previous` when given (a key rotation's
    /// overlap: [`crate::peer::key::KeyRing::accepted`]); what each sender sent before is kept.
    pub fn set_keys(&mut self, key: PeerKey, previous: Option<PeerKey>) {
        self.key = key;
        self.previous = previous;
    }

    /// Counts so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Checks one received payload; `now_wall_ms` is our wall-clock time (ms since the Unix
    /// epoch). On success the sender's state advances.
    ///
    /// # Errors
    /// [`Rejection`] naming the reason (also counted).
    pub fn verify(&mut self, payload: &[u8], now_wall_ms: u64) -> Result<Frame, Rejection> {
        let r = self.check(payload, now_wall_ms);
        let c = &mut self.counters;
        match &r {
            Ok(_) => c.accepted += 1,
            Err(Rejection::Decode(DecodeError::Mac)) => c.bad_mac += 1,
            Err(Rejection::Decode(DecodeError::Version { .. })) => c.bad_version += 1,
            Err(Rejection::Decode(DecodeError::Magic { .. })) => c.bad_magic += 1,
            Err(Rejection::Decode(_)) => c.malformed += 1,
            Err(Rejection::Skew { .. }) => c.skew += 1,
            Err(Rejection::Replay { .. }) => c.replay += 1,
            Err(Rejection::OldBoot { .. }) => c.old_boot += 1,
        }
        r
    }

    fn check(&mut self, payload: &[u8], now_wall_ms: u64) -> Result<Frame, Rejection> {
        let f = match (decode(&self.key, payload), &self.previous) {
            (Err(DecodeError::Mac), Some(previous)) => decode(previous, payload)?,
            (r, _) => r?,
        };
        let node = &f.message.node;
        let offset = i128::from(f.message.wall_ms) - i128::from(now_wall_ms);
        if offset.unsigned_abs() > u128::from(self.max_skew_ms) {
            return Err(Rejection::Skew {
                node: node.clone(),
                offset_ms: offset,
                max_ms: self.max_skew_ms,
            });
        }
        if let Some(s) = self.senders.get(node) {
            if s.boot_id == f.boot_id {
                if f.seq <= s.last_seq {
                    return Err(Rejection::Replay {
                        node: node.clone(),
                        seq: f.seq,
                        last: s.last_seq,
                    });
                }
            } else if f.message.wall_ms <= s.last_wall_ms {
                return Err(Rejection::OldBoot {
                    node: node.clone(),
                    boot_id: f.boot_id,
                    wall_ms: f.message.wall_ms,
                    last_wall_ms: s.last_wall_ms,
                });
            }
        }
        self.senders.insert(
            node.clone(),
            SenderState {
                boot_id: f.boot_id,
                last_seq: f.seq,
                last_wall_ms: f.message.wall_ms,
            },
        );
        Ok(f)
    }
}

/// Puts the parts of multi-frame messages back together. Parts of one message have
/// consecutive sequence numbers (part `i` has the first part's number plus `i`); a message
/// is returned once all its parts arrived, and a sender's unfinished message is dropped when
/// a frame of a later message or another boot arrives (a lost part loses the message; the
/// next heartbeat follows 200 ms later).
#[derive(Debug, Default)]
pub struct Assembler {
    pending: BTreeMap<String, Pending>,
}

#[derive(Debug)]
struct Pending {
    boot_id: u64,
    first_seq: u64,
    parts: u16,
    got: Vec<Option<Vec<HeldLease>>>,
    message: Message,
}

impl Assembler {
    /// Feeds one verified frame; the whole message when it is complete.
    pub fn push(&mut self, f: Frame) -> Option<Message> {
        if f.parts == 1 {
            self.pending.remove(&f.message.node);
            return Some(f.message);
        }
        let first_seq = f.seq.checked_sub(u64::from(f.part))?;
        let node = f.message.node.clone();
        let fresh = match self.pending.get(&node) {
            Some(p) => p.boot_id != f.boot_id || p.first_seq != first_seq || p.parts != f.parts,
            None => true,
        };
        if fresh {
            self.pending.insert(
                node.clone(),
                Pending {
                    boot_id: f.boot_id,
                    first_seq,
                    parts: f.parts,
                    got: vec![None; usize::from(f.parts)],
                    message: Message {
                        leases: Vec::new(),
                        ..f.message.clone()
                    },
                },
            );
        }
        let p = self.pending.get_mut(&node)?;
        if p.message.kind != f.message.kind || p.message.flags != f.message.flags {
            self.pending.remove(&node);
            return None;
        }
        let slot = p.got.get_mut(usize::from(f.part))?;
        *slot = Some(f.message.leases);
        if p.got.iter().all(Option::is_some) {
            let mut p = self.pending.remove(&node)?;
            p.message.leases = p.got.into_iter().flatten().flatten().collect();
            return Some(p.message);
        }
        None
    }
}
