//! Wire format: round trips, splitting, the verifier's rules and counters, and decoding of
//! arbitrary bytes (never panics).

use super::Gen;
use crate::peer::verify::*;
use crate::peer::wire::*;

const NOW_MS: u64 = 1_790_000_000_000;

fn key(byte: u8) -> PeerKey {
    PeerKey::from_bytes(&[byte; 32]).expect("32-byte key")
}

fn lease(ns: &str, name: &str, term: u64, rv: &str) -> HeldLease {
    HeldLease {
        lease: LeaseRef {
            namespace: ns.into(),
            name: name.into(),
        },
        term,
        resource_version: rv.into(),
    }
}

fn heartbeat(node: &str, leases: Vec<HeldLease>) -> Message {
    Message {
        kind: Kind::Heartbeat,
        node: node.into(),
        flags: Flags {
            api_reachable: true,
            api_heard: false,
            api_hold: false,
        },
        membership: 0x0123_4567_89ab_cdef,
        wall_ms: NOW_MS,
        leases,
        target: None,
    }
}

fn one(enc: &mut Encoder, msg: &Message) -> Vec<u8> {
    let mut frames = enc.encode(msg).expect("encodes");
    assert_eq!(frames.len(), 1);
    frames.remove(0)
}

#[test]
fn heartbeat_round_trip() {
    let mut enc = Encoder::new(key(1), 42);
    let msg = heartbeat(
        "node-a.example",
        vec![
            lease("kube-system", "vipd-svc-default-web", 3, "123456"),
            lease("default", "x", u64::MAX, "9"),
        ],
    );
    let b = one(&mut enc, &msg);
    assert!(b.len() <= MAX_PAYLOAD);
    assert_eq!(&b[..4], b"VIPD");
    let f = decode(&key(1), &b).expect("decodes");
    assert_eq!(f.boot_id, 42);
    assert_eq!(f.seq, 1);
    assert_eq!((f.part, f.parts), (0, 1));
    assert_eq!(f.message, msg);
    // Sequence numbers increase per frame.
    let f2 = decode(&key(1), &one(&mut enc, &msg)).expect("decodes");
    assert_eq!(f2.seq, 2);
}

#[test]
fn hand_over_request_and_released_round_trip() {
    let mut enc = Encoder::new(key(1), 7);
    let req = Message {
        kind: Kind::HandOverRequest,
        flags: Flags {
            api_reachable: false,
            api_heard: true,
            api_hold: true,
        },
        target: Some("node-b".into()),
        ..heartbeat("node-a", vec![lease("default", "l", 1, "5")])
    };
    let f = decode(&key(1), &one(&mut enc, &req)).expect("decodes");
    assert_eq!(f.message, req);
    let rel = Message {
        kind: Kind::Released,
        flags: Flags::default(),
        ..heartbeat("node-b", vec![lease("default", "l", 1, "5")])
    };
    let f = decode(&key(1), &one(&mut enc, &rel)).expect("decodes");
    assert_eq!(f.message, rel);
}

#[test]
fn encode_refuses_bad_fields_naming_them() {
    let mut enc = Encoder::new(key(1), 1);
    let e = enc.encode(&heartbeat("Node_A", vec![])).unwrap_err();
    assert!(e.to_string().contains("\"Node_A\""), "{e}");
    let e = enc
        .encode(&heartbeat("a", vec![lease("Bad NS", "l", 1, "1")]))
        .unwrap_err();
    assert!(
        matches!(&e, EncodeError::LeaseName { field: "namespace", value, .. } if value == "Bad NS"),
        "{e:?}"
    );
    let e = enc
        .encode(&heartbeat("a", vec![lease("ns", "l", 1, "")]))
        .unwrap_err();
    assert!(
        matches!(e, EncodeError::ResourceVersion { len: 0, .. }),
        "{e:?}"
    );
    let long_rv = "1".repeat(MAX_RESOURCE_VERSION + 1);
    let e = enc
        .encode(&heartbeat("a", vec![lease("ns", "l", 1, &long_rv)]))
        .unwrap_err();
    assert!(
        matches!(e, EncodeError::ResourceVersion { len: 65, .. }),
        "{e:?}"
    );
    let many = (0..=MAX_LEASES)
        .map(|i| lease("ns", &format!("l{i}"), 1, "1"))
        .collect();
    let e = enc.encode(&heartbeat("a", many)).unwrap_err();
    assert_eq!(
        e,
        EncodeError::TooManyLeases {
            count: MAX_LEASES + 1,
            max: MAX_LEASES
        }
    );
    // Hand-over requests: a target and exactly one lease; other kinds no target.
    let no_target = Message {
        kind: Kind::HandOverRequest,
        ..heartbeat("a", vec![lease("ns", "l", 1, "1")])
    };
    assert!(matches!(enc.encode(&no_target), Err(EncodeError::Shape(_))));
    let two = Message {
        target: Some("b".into()),
        ..heartbeat(
            "a",
            vec![lease("ns", "l", 1, "1"), lease("ns", "m", 1, "1")],
        )
    };
    let two = Message {
        kind: Kind::HandOverRequest,
        ..two
    };
    assert!(matches!(enc.encode(&two), Err(EncodeError::Shape(_))));
    let hb_target = Message {
        target: Some("b".into()),
        ..heartbeat("a", vec![])
    };
    assert!(matches!(enc.encode(&hb_target), Err(EncodeError::Shape(_))));
}

/// The largest message (512 leases with the longest names) splits into frames of at most
/// 1500 bytes with consecutive sequence numbers; the assembler returns it whole, once.
#[test]
fn largest_message_splits_and_reassembles() {
    let node = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    assert_eq!(node.len(), 253);
    let ns = "n".repeat(63);
    let leases: Vec<HeldLease> = (0..MAX_LEASES)
        .map(|i| {
            let name = format!("{i:03}{}", "x".repeat(250));
            lease(&ns, &name, i as u64, &"7".repeat(MAX_RESOURCE_VERSION))
        })
        .collect();
    let msg = heartbeat(&node, leases);
    let mut enc = Encoder::new(key(1), 9);
    let frames = enc.encode(&msg).expect("512 leases fit in parts");
    assert!(
        frames.len() > 1 && frames.len() <= MAX_PARTS,
        "{}",
        frames.len()
    );
    let mut asm = Assembler::default();
    let mut ver = Verifier::new(key(1), DEFAULT_MAX_SKEW_MS);
    let last = frames.len() - 1;
    for (i, b) in frames.iter().enumerate() {
        assert!(b.len() <= MAX_PAYLOAD, "frame {i}: {} bytes", b.len());
        let f = ver.verify(b, NOW_MS).expect("verifies");
        assert_eq!(f.seq, 1 + i as u64);
        let out = asm.push(f);
        if i < last {
            assert!(out.is_none(), "complete before part {i}");
        } else {
            assert_eq!(out.as_ref(), Some(&msg));
        }
    }
    // A message with a lost part never completes; the next message does.
    let frames = enc.encode(&msg).expect("encodes");
    for b in frames.iter().skip(1) {
        assert!(asm.push(ver.verify(b, NOW_MS).expect("verifies")).is_none());
    }
    let small = heartbeat(&node, vec![lease("ns", "l", 1, "1")]);
    let f = ver
        .verify(&one(&mut enc, &small), NOW_MS)
        .expect("verifies");
    assert_eq!(asm.push(f), Some(small));
}

#[test]
fn key_needs_32_bytes_and_is_never_printed() {
    assert_eq!(
        PeerKey::from_bytes(&[7; 31]).unwrap_err(),
        KeyError::TooShort { len: 31, min: 32 }
    );
    let k = PeerKey::from_bytes(b"SUPERSECRETSUPERSECRETSUPERSECRET").expect("33 bytes");
    let shown = format!("{k:?} {k:#?}");
    assert!(!shown.contains("SUPERSECRET"), "{shown}");
    assert!(!shown.contains("53555045"), "{shown}"); // "SUPE" in hex
}

#[test]
fn verifier_rejects_and_counts_each_reason() {
    let mut enc = Encoder::new(key(1), 100);
    let mut v = Verifier::new(key(1), DEFAULT_MAX_SKEW_MS);
    let msg = heartbeat("node-a", vec![]);
    let first = one(&mut enc, &msg);
    assert!(v.verify(&first, NOW_MS).is_ok());

    // Forged: right format, another key.
    let mut forger = Encoder::new(key(2), 100);
    let forged = one(&mut forger, &heartbeat("node-a", vec![]));
    assert_eq!(
        v.verify(&forged, NOW_MS).unwrap_err(),
        Rejection::Decode(DecodeError::Mac)
    );
    // One flipped bit anywhere in the signed part.
    let mut flipped = one(&mut enc, &msg);
    flipped[20] ^= 1;
    assert_eq!(
        v.verify(&flipped, NOW_MS).unwrap_err(),
        Rejection::Decode(DecodeError::Mac)
    );
    // Replay of an accepted frame, and an older sequence number.
    assert!(matches!(
        v.verify(&first, NOW_MS),
        Err(Rejection::Replay {
            seq: 1,
            last: 1,
            ..
        })
    ));
    let third = one(&mut enc, &msg);
    let fourth = one(&mut enc, &msg);
    assert!(v.verify(&fourth, NOW_MS).is_ok());
    assert!(matches!(
        v.verify(&third, NOW_MS),
        Err(Rejection::Replay {
            seq: 3,
            last: 4,
            ..
        })
    ));
    // Clock skew beyond the limit, both directions; at the limit is fine.
    let at = |enc: &mut Encoder, wall_ms| {
        one(
            enc,
            &Message {
                wall_ms,
                ..msg.clone()
            },
        )
    };
    let late = at(&mut enc, NOW_MS - DEFAULT_MAX_SKEW_MS - 1);
    assert!(matches!(
        v.verify(&late, NOW_MS),
        Err(Rejection::Skew {
            offset_ms: -10_001,
            ..
        })
    ));
    let early = at(&mut enc, NOW_MS + DEFAULT_MAX_SKEW_MS + 1);
    assert!(matches!(
        v.verify(&early, NOW_MS),
        Err(Rejection::Skew { .. })
    ));
    assert!(
        v.verify(&at(&mut enc, NOW_MS + DEFAULT_MAX_SKEW_MS), NOW_MS)
            .is_ok()
    );
    // Wrong version (checked before the MAC).
    let mut v2 = one(&mut enc, &msg);
    v2[4] = 2;
    assert_eq!(
        v.verify(&v2, NOW_MS).unwrap_err(),
        Rejection::Decode(DecodeError::Version { found: 2 })
    );
    // Not ours at all.
    assert!(matches!(
        v.verify(b"GARBAGE-GARBAGE", NOW_MS),
        Err(Rejection::Decode(DecodeError::Magic { .. }))
    ));
    assert!(matches!(
        v.verify(b"VIPD\x01short", NOW_MS),
        Err(Rejection::Decode(DecodeError::TooShort { .. }))
    ));

    let c = v.counters();
    assert_eq!(
        c,
        Counters {
            accepted: 3,
            bad_mac: 2,
            bad_version: 1,
            bad_magic: 1,
            malformed: 1,
            skew: 2,
            replay: 2,
            old_boot: 0,
        }
    );
}

#[test]
fn a_new_boot_is_accepted_only_when_newer() {
    let mut v = Verifier::new(key(1), DEFAULT_MAX_SKEW_MS);
    let mut old_boot = Encoder::new(key(1), 1);
    let old_frame = one(
        &mut old_boot,
        &Message {
            wall_ms: NOW_MS - 2000,
            ..heartbeat("node-a", vec![])
        },
    );
    let mut new_boot = Encoder::new(key(1), 2);
    let new_frame = one(
        &mut new_boot,
        &Message {
            wall_ms: NOW_MS - 1000,
            ..heartbeat("node-a", vec![])
        },
    );
    // Unknown node: its first frame is accepted.
    assert!(v.verify(&new_frame, NOW_MS).is_ok());
    // The old boot's frame (captured earlier, replayed now) is refused ...
    assert!(matches!(
        v.verify(&old_frame, NOW_MS),
        Err(Rejection::OldBoot { boot_id: 1, .. })
    ));
    // ... and a newer boot replaces the current one, restarting its sequence numbers.
    let mut newer = Encoder::new(key(1), 3);
    let f = one(&mut newer, &heartbeat("node-a", vec![]));
    assert_eq!(v.verify(&f, NOW_MS).expect("newer boot").seq, 1);
    assert_eq!(v.counters().old_boot, 1);
    assert_eq!(v.counters().accepted, 2);
}

/// Decoding arbitrary bytes never panics: random payloads of every size (also above the
/// MTU), every truncation of a valid frame, and valid frames with random bytes changed and
/// signed again (so that the field parser, not the MAC check, sees them).
#[test]
fn decoding_never_panics() {
    let k = key(1);
    let mut g = Gen(0x9E37_79B9_7F4A_7C15);
    for _ in 0..20_000 {
        let len = g.below(1700) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| g.next() as u8).collect();
        if len >= 5 && g.below(2) == 0 {
            b[..4].copy_from_slice(b"VIPD");
            b[4] = VERSION;
        }
        assert!(decode(&k, &b).is_err());
    }
    let mut enc = Encoder::new(k.clone(), 5);
    let msg = heartbeat(
        "node-a",
        vec![
            lease("default", "one", 1, "11"),
            lease("kube-system", "two", 2, "22"),
        ],
    );
    let valid = one(&mut enc, &msg);
    for cut in 0..valid.len() {
        assert!(decode(&k, &valid[..cut]).is_err(), "cut at {cut}");
    }
    let body = &valid[..valid.len() - MAC_LEN];
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut m = body.to_vec();
        for _ in 0..=g.below(4) {
            let i = 5 + g.below(m.len() as u64 - 5) as usize;
            m[i] = g.next() as u8;
        }
        // Sometimes cut or extend the body too.
        match g.below(4) {
            0 => m.truncate(5 + g.below(m.len() as u64 - 5) as usize),
            1 => m.extend((0..g.below(40)).map(|_| g.next() as u8)),
            _ => {}
        }
        if decode(&k, &sign_raw(&k, &m)).is_ok() {
            accepted += 1;
        }
    }
    // Changes to the numbers (seq, time, term) still decode; most others are refused.
    assert!(accepted > 0 && accepted < 20_000, "{accepted}");
}

#[test]
fn decode_names_what_is_wrong() {
    let k = key(1);
    let mut enc = Encoder::new(k.clone(), 5);
    let valid = one(
        &mut enc,
        &heartbeat("node-a", vec![lease("ns", "l", 1, "1")]),
    );
    let body = &valid[..valid.len() - MAC_LEN];
    // Unknown kind.
    let mut m = body.to_vec();
    m[5] = 9;
    assert_eq!(
        decode(&k, &sign_raw(&k, &m)).unwrap_err().to_string(),
        "peer frame: kind 9 is not 1, 2 or 3"
    );
    // Unknown flag bits.
    let mut m = body.to_vec();
    m[6] = 0x80;
    assert!(
        decode(&k, &sign_raw(&k, &m))
            .unwrap_err()
            .to_string()
            .contains("flags 0x80")
    );
    // Part index not below the part count.
    let mut m = body.to_vec();
    m[7..9].copy_from_slice(&1u16.to_be_bytes());
    assert!(
        decode(&k, &sign_raw(&k, &m))
            .unwrap_err()
            .to_string()
            .contains("part 1 of 1")
    );
    // Extra bytes before the MAC.
    let mut m = body.to_vec();
    m.push(0);
    assert_eq!(
        decode(&k, &sign_raw(&k, &m)).unwrap_err(),
        DecodeError::Trailing { count: 1 }
    );
    // Longer than the MTU.
    assert_eq!(
        decode(&k, &[0u8; MAX_PAYLOAD + 1]).unwrap_err(),
        DecodeError::TooLong {
            len: 1501,
            max: 1500
        }
    );
}

/// Parts may arrive out of order and interleaved with other nodes' frames; a part from a
/// message that does not match (another boot) starts over.
#[test]
fn assembler_handles_order_interleaving_and_boots() {
    let leases: Vec<HeldLease> = (0..60)
        .map(|i| {
            lease(
                "kube-system",
                &format!("vipd-svc-{i:03}-{}", "x".repeat(40)),
                1,
                "123456789",
            )
        })
        .collect();
    let big = heartbeat("node-a", leases);
    let mut a = Encoder::new(key(1), 1);
    let frames = a.encode(&big).expect("encodes");
    assert!(frames.len() >= 3, "{}", frames.len());
    let k = key(1);
    let dec = |b: &Vec<u8>| decode(&k, b).expect("decodes");
    let mut other = Encoder::new(key(1), 2);
    let small = heartbeat("node-b", vec![]);
    let mut asm = Assembler::default();
    // Last part first, another node's message in between.
    let mut order: Vec<usize> = (0..frames.len()).rev().collect();
    order.rotate_left(1);
    for (n, i) in order.iter().enumerate() {
        if n == 1 {
            assert_eq!(asm.push(dec(&one(&mut other, &small))), Some(small.clone()));
        }
        let out = asm.push(dec(&frames[*i]));
        assert_eq!(out.is_some(), n == frames.len() - 1, "after part {i}");
        if let Some(m) = out {
            assert_eq!(m, big);
        }
    }
    // A part of a new boot of node-a drops the unfinished message of the old one (the
    // verifier refuses the old boot's later frames anyway).
    let frames = a.encode(&big).expect("encodes");
    assert!(asm.push(dec(&frames[0])).is_none());
    let mut reboot = Encoder::new(key(1), 3);
    let newer = reboot.encode(&big).expect("encodes");
    for (i, b) in newer.iter().enumerate() {
        assert_eq!(asm.push(dec(b)).is_some(), i == newer.len() - 1);
    }
    for b in &frames[1..] {
        assert!(
            asm.push(dec(b)).is_none(),
            "the old boot's message completed without its first part"
        );
    }
}
