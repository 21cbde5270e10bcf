//! The peer key of `svc_ridethrough`, read from its Secret in `cp_namespace`, and its
//! rotation ([`KeyRing`]).
//!
//! The manager reads the Secret at start and again every [`KEY_POLL`] (`get` by name: the
//! RBAC of `vipd manifest rbac`): without it vipd runs without ride-through (one WARN with
//! the command that creates it) and arms itself once the Secret appears, without a restart.
//! A changed key (a re-applied manifest writes a new random one) is a rotation: frames with
//! the previous key stay accepted for [`KEY_OVERLAP`], and this node keeps signing with the
//! previous key for [`KEY_SIGN_DELAY`] (two polls: by then every node that reaches the API
//! has read the new key and accepts it), so a rotation does not split the nodes. A deleted
//! Secret does not disarm a running vipd (it keeps the key it has).

use std::time::Duration;

use kube::Api;
use tracing::warn;

/// Reads the peer key of `svc_ridethrough` from the Secret [`crate::kube::api::PEER_KEY_SECRET`]
/// (data key [`crate::peer::KEY_SECRET_KEY`], at least 32 bytes) in `namespace`, retrying
/// an unreachable or failing API server for up to `patience` (zero: one try). Used by the
/// manager at start and by `vipd preflight`.
///
/// # Errors
/// A message naming the Secret and what is wrong (missing, no `key`, too short, not
/// readable), with the command that creates it.
pub async fn read_peer_key(
    client: &kube::Client,
    namespace: &str,
    patience: Duration,
) -> Result<crate::peer::wire::PeerKey, String> {
    read_key_with_id(client, namespace, patience)
        .await
        .map(|(k, _)| k)
        .map_err(|e| e.to_string())
}

/// Why the peer key could not be read ([`read_key_with_id`]); both messages name the Secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyReadError {
    /// The API server did not answer the `get` (unreachable, failing, or RBAC refused it):
    /// says nothing about the key itself.
    #[error("{0}")]
    Unreadable(String),
    /// The Secret was read and holds no usable key (missing, no `key`, too short), with
    /// the command that creates one.
    #[error("{0}")]
    Invalid(String),
}

/// The command that creates the peer key Secret in `namespace` (32 random bytes, base64).
pub fn create_command(namespace: &str) -> String {
    use super::KEY_SECRET_KEY;
    use crate::kube::api::PEER_KEY_SECRET as KEY_SECRET;
    format!(
        "kubectl create secret generic {KEY_SECRET} -n {namespace} --from-literal={KEY_SECRET_KEY}=$(head -c32 /dev/urandom | base64)"
    )
}

/// [`read_peer_key`], with the key's [`KeyId`] (to notice a rotation).
///
/// # Errors
/// As [`read_peer_key`], split into [`KeyReadError::Unreadable`] (the API) and
/// [`KeyReadError::Invalid`] (the Secret).
pub async fn read_key_with_id(
    client: &kube::Client,
    namespace: &str,
    patience: Duration,
) -> Result<(crate::peer::wire::PeerKey, KeyId), KeyReadError> {
    use super::KEY_SECRET_KEY;
    use crate::kube::api::PEER_KEY_SECRET as KEY_SECRET;
    let ns = namespace;
    let how = format!("create it with: {}", create_command(ns));
    let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    let started = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(500);
    let secret = loop {
        match api.get_opt(KEY_SECRET).await {
            Ok(Some(s)) => break s,
            Ok(None) => {
                return Err(KeyReadError::Invalid(format!(
                    "the Secret {ns}/{KEY_SECRET} with the peer key does not exist; {how}"
                )));
            }
            Err(e) if !key_read_is_final(&e) && started.elapsed() < patience => {
                warn!(error = %e, secret = %format!("{ns}/{KEY_SECRET}"), retry_ms = backoff.as_millis() as u64, "svc_ridethrough: cannot read the peer key Secret yet (API server unreachable or failing); retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                return Err(KeyReadError::Unreadable(format!(
                    "cannot read the Secret {ns}/{KEY_SECRET} with the peer key: {e} (vipd needs get on this Secret)"
                )));
            }
        }
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY_SECRET_KEY))
        .map(|b| b.0.clone())
        .ok_or_else(|| {
            KeyReadError::Invalid(format!(
                "the Secret {ns}/{KEY_SECRET} has no data key {KEY_SECRET_KEY:?}; {how}"
            ))
        })?;
    let key = crate::peer::wire::PeerKey::from_bytes(&bytes).map_err(|e| {
        KeyReadError::Invalid(format!(
            "the Secret {ns}/{KEY_SECRET}, key {KEY_SECRET_KEY:?}: {e}; {how}"
        ))
    })?;
    Ok((key, KeyId::of(&bytes)))
}

/// How often the manager reads the peer key Secret again (a key created later, a rotation).
pub const KEY_POLL: Duration = Duration::from_secs(60);
/// How long after it read a new key a node keeps signing with the previous one: two polls,
/// so every node that reaches the API accepts the new key before anyone signs with it.
pub const KEY_SIGN_DELAY: Duration = Duration::from_secs(120);
/// How long after it read a new key a node still accepts frames signed with the previous
/// one (longer than [`KEY_SIGN_DELAY`] plus a poll: nodes that read the new key late).
pub const KEY_OVERLAP: Duration = Duration::from_secs(600);

/// A short fingerprint of a key's bytes (the first 8 bytes of their SHA-256), to notice that
/// the Secret changed without keeping the bytes. Never printed with the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyId([u8; 8]);

impl KeyId {
    /// The fingerprint of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let d = ring::digest::digest(&ring::digest::SHA256, bytes);
        let mut b = [0u8; 8];
        b.copy_from_slice(&d.as_ref()[..8]);
        KeyId(b)
    }
}

/// The keys of one node: the current one and, for a while after a rotation, the previous
/// (see the module docs). Pure: every instant is given.
#[derive(Debug, Clone)]
pub struct KeyRing {
    current: (crate::peer::wire::PeerKey, KeyId),
    /// The previous key and when the current one replaced it.
    previous: Option<(crate::peer::wire::PeerKey, tokio::time::Instant)>,
}

impl KeyRing {
    /// The first key read.
    pub fn new(key: crate::peer::wire::PeerKey, id: KeyId) -> Self {
        KeyRing {
            current: (key, id),
            previous: None,
        }
    }

    /// A key read at `now`; `true` when it differs from the current one (a rotation: the
    /// current key becomes the previous).
    pub fn update(
        &mut self,
        key: crate::peer::wire::PeerKey,
        id: KeyId,
        now: tokio::time::Instant,
    ) -> bool {
        if id == self.current.1 {
            return false;
        }
        let old = std::mem::replace(&mut self.current, (key, id));
        self.previous = Some((old.0, now));
        true
    }

    /// The key that signs frames at `now`: the previous one for [`KEY_SIGN_DELAY`] after a
    /// rotation, else the current one.
    pub fn signing(&self, now: tokio::time::Instant) -> &crate::peer::wire::PeerKey {
        match &self.previous {
            Some((k, at)) if now.saturating_duration_since(*at) < KEY_SIGN_DELAY => k,
            _ => &self.current.0,
        }
    }

    /// The keys frames are checked against at `now`: the current one, and the previous one
    /// for [`KEY_OVERLAP`] after a rotation.
    pub fn accepted(
        &self,
        now: tokio::time::Instant,
    ) -> (
        crate::peer::wire::PeerKey,
        Option<crate::peer::wire::PeerKey>,
    ) {
        let previous = self
            .previous
            .as_ref()
            .filter(|(_, at)| now.saturating_duration_since(*at) < KEY_OVERLAP)
            .map(|(k, _)| k.clone());
        (self.current.0.clone(), previous)
    }
}

/// A failed read of the peer key Secret that retrying cannot fix: an answer of the API
/// server with a 4xx status other than 429 (403: RBAC, 401: credentials, ...).
fn key_read_is_final(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::verify::Verifier;
    use crate::peer::wire::{Encoder, HeldLease, Kind, Message, PeerKey};

    fn key(b: u8) -> (PeerKey, KeyId) {
        let bytes = [b; 32];
        (PeerKey::from_bytes(&bytes).expect("key"), KeyId::of(&bytes))
    }

    fn frame(enc: &mut Encoder) -> Vec<u8> {
        let m = Message {
            kind: Kind::Heartbeat,
            node: "node-a".into(),
            flags: Default::default(),
            membership: 0,
            wall_ms: 1_000,
            leases: Vec::<HeldLease>::new(),
            target: None,
        };
        enc.encode(&m).expect("encode").remove(0)
    }

    /// A re-applied manifest rotates the key: the node keeps signing with the previous key
    /// for the sign delay (nodes that have not read the new key yet still accept it), accepts
    /// both for the overlap, then only the new one. Reading the same key again changes nothing.
    #[tokio::test(start_paused = true)]
    async fn a_rotation_overlaps_old_and_new_keys() {
        let t0 = tokio::time::Instant::now();
        let (k1, id1) = key(1);
        let (k2, id2) = key(2);
        let mut ring = KeyRing::new(k1.clone(), id1);
        assert!(!ring.update(k1.clone(), id1, t0));
        assert!(ring.update(k2.clone(), id2, t0));
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Signing: the old key within the sign delay, the new one after.
        let old_reader = |signing: &PeerKey| {
            let mut enc = Encoder::new(signing.clone(), 1);
            Verifier::new(k1.clone(), 10_000)
                .verify(&frame(&mut enc), 1_000)
                .is_ok()
        };
        assert!(old_reader(ring.signing(at(0))));
        assert!(old_reader(ring.signing(at(119))));
        assert!(!old_reader(ring.signing(at(120))));
        // Accepting: both within the overlap, the new one only after.
        let accepts = |now, signer: &PeerKey| {
            let (cur, prev) = ring.accepted(now);
            let mut v = Verifier::new(cur, 10_000);
            v.set_keys(ring.accepted(now).0, prev);
            v.verify(&frame(&mut Encoder::new(signer.clone(), 1)), 1_000)
                .is_ok()
        };
        assert!(accepts(at(599), &k1));
        assert!(accepts(at(599), &k2));
        assert!(!accepts(at(600), &k1));
        assert!(accepts(at(600), &k2));
    }

    /// Only an API answer that retrying cannot change ends the start-up read of the peer
    /// key Secret; no answer (the error of the lab's bench: connect failed while the link
    /// came up), 429 and 5xx are retried.
    #[test]
    fn peer_key_read_retries_what_may_pass() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "Reason")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(key_read_is_final(&api(403)));
        assert!(key_read_is_final(&api(401)));
        assert!(!key_read_is_final(&api(429)));
        assert!(!key_read_is_final(&api(503)));
        assert!(!key_read_is_final(
            &kube::Error::LinesCodecMaxLineLengthExceeded
        ));
    }
}
