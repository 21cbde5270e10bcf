//! Peer protocol tests: the wire format and verifier, and the ride-through state machine
//! (single-node rules and a multi-node model of a segment with partitions).

use std::collections::BTreeSet;

use super::*;

mod node;
mod ridethrough;
mod sim;
mod wire;

#[test]
fn digest_depends_on_the_set_only() {
    let set =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|s| s.to_string()).collect() };
    assert_eq!(
        membership_digest(&set(&["n1", "n2"])),
        membership_digest(&set(&["n2", "n1"]))
    );
    assert_ne!(
        membership_digest(&set(&["n1", "n2"])),
        membership_digest(&set(&["n1", "n2", "n3"]))
    );
    // The separator keeps {n1, n2} apart from {n1n2}.
    assert_ne!(
        membership_digest(&set(&["n1", "n2"])),
        membership_digest(&set(&["n1n2"]))
    );
}

#[test]
fn membership_is_the_nodes_not_labelled_out() {
    use k8s_openapi::api::core::v1::Node;
    let node = |name: &str, label: Option<&str>| {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        if let Some(v) = label {
            n.metadata.labels = Some([(MEMBER_LABEL.to_string(), v.to_string())].into());
        }
        n
    };
    let nodes = [
        node("a", None),
        node("b", Some("true")),
        node("c", Some("false")),
        node("d", Some("")),
    ];
    let want: BTreeSet<String> = ["a", "b", "d"].iter().map(|s| s.to_string()).collect();
    assert_eq!(membership_of(&nodes), want);
}

/// xorshift64*: a deterministic generator for the fuzz-like and chaos tests (no new crate).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `0..n` for tests.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
