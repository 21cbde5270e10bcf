//! Peer protocol frames through the real kernel (the socket on its own, without the
//! manager): two private network namespaces joined by a veth pair; signed heartbeats sent
//! from one arrive in the other through `vipd::peer::socket::PeerSocket`, verify, and carry
//! kernel arrival timestamps; a forged frame (another key) is rejected and counted; frames
//! of other EtherTypes never reach the socket.
//!
//! Needs root. Not root: the test fails with a clear message, unless `VIPD_SKIP_LAB=1`, in
//! which case it prints `SKIPPED` and passes.
//!
//! Each side runs on its own thread that calls `unshare(CLONE_NEWNET)`: a private namespace
//! for that thread only, destroyed (with its end of the veth pair) when the thread ends,
//! also when it panics. Before any `ip` command or any frame the harness checks that the
//! thread's namespace is neither the test process's nor PID 1's. Nothing is ever sent in the
//! root namespace.

mod support;

use std::sync::mpsc;
use std::time::{Duration, SystemTime};
use support::netns::{assert_private_netns, enter_private_netns, ip};

use vipd::net::{Kernel, LinkInfo, NetlinkKernel};
use vipd::peer::socket::PeerSocket;
use vipd::peer::verify::{DEFAULT_MAX_SKEW_MS, Rejection, Verifier};
use vipd::peer::wire::{DecodeError, Encoder, Flags, HeldLease, Kind, LeaseRef, Message, PeerKey};

/// The link named `name` once it is up with carrier (bounded wait).
fn up_link(name: &str) -> LinkInfo {
    assert_private_netns();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let k = NetlinkKernel::new().expect("netlink");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let l = k.link_by_name(name).await.expect("link");
            if l.up && l.carrier {
                return l;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} has no carrier: {l:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Sends one Ethernet frame on `link` through a pnet datalink channel (private namespace
/// only).
fn send_with_pnet(link: &LinkInfo, frame: &[u8]) {
    use pnet::datalink::{self, Channel, NetworkInterface};
    assert_private_netns();
    let iface = NetworkInterface {
        name: link.name.clone(),
        description: String::new(),
        index: link.index,
        mac: Some(link.mac.into()),
        ips: Vec::new(),
        flags: 0,
    };
    let config = datalink::Config {
        promiscuous: false,
        ..Default::default()
    };
    let Ok(Channel::Ethernet(mut tx, _rx)) = datalink::channel(&iface, config) else {
        panic!("pnet channel on {}", link.name);
    };
    tx.send_to(frame, None)
        .expect("pnet send")
        .expect("pnet send result");
}

fn key(b: u8) -> PeerKey {
    PeerKey::from_bytes(&[b; 32]).expect("key")
}

fn wall_ms() -> u64 {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(d.as_millis()).expect("ms")
}

fn heartbeat(node: &str) -> Message {
    Message {
        kind: Kind::Heartbeat,
        node: node.into(),
        flags: Flags {
            api_reachable: true,
            api_heard: false,
            api_hold: false,
        },
        membership: 7,
        wall_ms: wall_ms(),
        leases: vec![HeldLease {
            lease: LeaseRef {
                namespace: "default".into(),
                name: "vipd-svc-web".into(),
            },
            term: 1,
            resource_version: "12345".into(),
        }],
        target: None,
    }
}

const HEARTBEATS: u64 = 5;

#[test]
fn signed_heartbeats_cross_a_veth_and_forgeries_are_counted() {
    if !support::netns::root_or_skip("peer wire lab test") {
        return;
    }
    // Receiver side: its thread id (for `ip link set v1 netns <tid>`), then "socket open".
    let (tid_tx, tid_rx) = mpsc::channel::<i32>();
    let (moved_tx, moved_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let (sent_tx, sent_rx) = mpsc::channel::<[u8; 6]>();

    let receiver = std::thread::spawn(move || {
        enter_private_netns();
        tid_tx
            .send(nix::unistd::gettid().as_raw())
            .expect("send tid");
        moved_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("sender moved v1 here");
        ip("link set lo up");
        ip("link set v1 up");
        let v1 = up_link("v1");
        let sock = PeerSocket::open(&v1).expect("peer socket on v1");
        ready_tx.send(()).expect("ready");
        let sender_mac = sent_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("sender finished");

        let mut verifier = Verifier::new(key(1), DEFAULT_MAX_SKEW_MS);
        let mut seqs = Vec::new();
        let mut forged = Vec::new();
        // Everything was sent before `sent_rx` fired, the other EtherType first: read the
        // expected number of frames (bounded wait); a delivered foreign frame would show up
        // among them as a rejection.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while seqs.len() + forged.len() < HEARTBEATS as usize + 1 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "frames missing: {seqs:?} {forged:?}");
            let Some(r) = sock.recv(left).expect("recv") else {
                continue;
            };
            assert_eq!(r.src, sender_mac, "source MAC");
            let arrived = r.arrived.expect("kernel receive timestamp");
            let age = SystemTime::now()
                .duration_since(arrived)
                .expect("arrival not in the future");
            assert!(age < Duration::from_secs(10), "arrival {age:?} ago");
            match verifier.verify(&r.payload, wall_ms()) {
                Ok(f) => {
                    assert_eq!(f.message.node, "node-a");
                    assert_eq!(f.message.leases.len(), 1);
                    seqs.push(f.seq);
                }
                Err(e) => forged.push(e),
            }
        }
        (seqs, forged, verifier.counters())
    });

    let tid = tid_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("receiver thread id");
    let sender = std::thread::spawn(move || {
        enter_private_netns();
        ip("link set lo up");
        ip("link add v0 type veth peer name v1");
        ip(&format!("link set v1 netns {tid}"));
        moved_tx.send(()).expect("moved");
        ip("link set v0 up");
        let v0 = up_link("v0");
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("receiver socket open");
        let sock = PeerSocket::open(&v0).expect("peer socket on v0");
        // First a frame of another EtherType to the same group MAC (through pnet, as
        // `net::arp` sends): the receiving socket must never return it.
        let mut other = Vec::new();
        other.extend_from_slice(&vipd::peer::wire::GROUP_MAC);
        other.extend_from_slice(&v0.mac);
        other.extend_from_slice(&0x88B6u16.to_be_bytes());
        other.extend_from_slice(b"VIPD\x01");
        other.resize(60, 0);
        send_with_pnet(&v0, &other);
        let mut enc = Encoder::new(key(1), 0xb007);
        for _ in 0..HEARTBEATS {
            for payload in enc.encode(&heartbeat("node-a")).expect("encode") {
                sock.send(&payload).expect("send");
            }
        }
        // A forgery: right format, another key.
        let mut forger = Encoder::new(key(2), 0xb007);
        for payload in forger.encode(&heartbeat("node-a")).expect("encode") {
            sock.send(&payload).expect("send forged");
        }
        sent_tx.send(v0.mac).expect("sent");
    });
    if let Err(panic) = sender.join() {
        std::panic::resume_unwind(panic);
    }
    let (seqs, forged, counters) = match receiver.join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    assert_eq!(
        seqs,
        (1..=HEARTBEATS).collect::<Vec<_>>(),
        "all heartbeats, in order"
    );
    assert_eq!(forged, vec![Rejection::Decode(DecodeError::Mac)]);
    assert_eq!(counters.accepted, HEARTBEATS);
    assert_eq!(counters.bad_mac, 1);
    assert_eq!(
        counters.malformed + counters.bad_magic,
        0,
        "other EtherType delivered"
    );
}
