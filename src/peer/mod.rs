//! The peer protocol (API outage ride-through, `svc_ridethrough`): vipd nodes on one segment vouch
//! for each other while the API server is unreachable.
//!
//! Active with `svc_ridethrough` (Service leases only): [`node`] drives it from `vipd
//! manager`. See "Peer protocol" in `docs/design.md` for the rules, the safety argument and
//! the wiring.
//!
//! * [`wire`]: the frame format (raw Ethernet, EtherType 0x88B5), HMAC-SHA256 signing with a
//!   [`wire::PeerKey`], decoding that never panics, and the [`wire::Verifier`] (replays,
//!   old boots, clock skew, counted by reason).
//! * `ridethrough` (crate-private): the pure state machine that decides whether a holder may
//!   keep its Service VIPs while it cannot renew (`Peers::may_ride_through`) and whether a
//!   candidate may take an expired lease (`Peers::may_take`).
//! * `node` (crate-private): the manager's side (heartbeats, receiver, API probe, ride
//!   grants published to the Service electors, acquisitions through `may_take`).
//! * [`socket`]: the frames on an interface (`AF_PACKET`, EtherType-filtered by the kernel,
//!   with kernel receive timestamps).
//!
//! `wire` and `socket` are public for the lab test (`tests/lab_peer_wire.rs`).

pub mod key;
pub mod metrics;
pub(crate) mod node;
pub(crate) mod ridethrough;
pub mod socket;
pub mod verify;
pub mod wire;

use std::collections::BTreeSet;

/// The Secret's data key holding the peer key (at least [`wire::MIN_KEY_LEN`] bytes, used
/// as they are: the text of a base64 string is fine).
pub const KEY_SECRET_KEY: &str = "key";

/// Node label that takes a Node out of the peer protocol's membership when its value is
/// `false`: for Nodes that do not run vipd (e.g. outside the DaemonSet's nodeSelector), which
/// would otherwise count as silent members.
pub const MEMBER_LABEL: &str = "vipd.io/ridethrough-member";

/// The membership from the Node objects (as every node reads them from the API): the names
/// of the Nodes not labelled [`MEMBER_LABEL`]`=false`. Derived from the API on purpose, not
/// from the peers heard on the segment: a node that restarted on the far side of a segment
/// partition would otherwise know only itself and ride alone (see docs/design.md,
/// "Membership").
pub(crate) fn membership_of<'a>(
    nodes: impl IntoIterator<Item = &'a k8s_openapi::api::core::v1::Node>,
) -> BTreeSet<String> {
    nodes
        .into_iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MEMBER_LABEL))
                .is_none_or(|v| v != "false")
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

/// Digest of a membership (the vipd nodes a node last knew from the API): the first 8 bytes
/// of SHA-256 over the sorted node names, each followed by `\n`. Two nodes count each
/// other's heartbeats towards a majority only when their digests are equal.
pub fn membership_digest(nodes: &BTreeSet<String>) -> u64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for n in nodes {
        ctx.update(n.as_bytes());
        ctx.update(b"\n");
    }
    let d = ctx.finish();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.as_ref()[..8]);
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests;
