//! The peer key of `svc_ridethrough`, read from its Secret in `cp_namespace`.

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
    use super::KEY_SECRET_KEY;
    use crate::kube::api::PEER_KEY_SECRET as KEY_SECRET;
    let ns = namespace;
    let how = format!(
        "create it with: kubectl create secret generic {KEY_SECRET} -n {ns} --from-literal={KEY_SECRET_KEY}=$(head -c32 /dev/urandom | base64)"
    );
    let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    let started = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(500);
    let secret = loop {
        match api.get_opt(KEY_SECRET).await {
            Ok(Some(s)) => break s,
            Ok(None) => {
                return Err(format!(
                    "the Secret {ns}/{KEY_SECRET} with the peer key does not exist; {how}"
                ));
            }
            Err(e) if !key_read_is_final(&e) && started.elapsed() < patience => {
                warn!(error = %e, secret = %format!("{ns}/{KEY_SECRET}"), retry_ms = backoff.as_millis() as u64, "svc_ridethrough: cannot read the peer key Secret yet (API server unreachable or failing); retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                return Err(format!(
                    "cannot read the Secret {ns}/{KEY_SECRET} with the peer key: {e} (vipd needs get on this Secret)"
                ));
            }
        }
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY_SECRET_KEY))
        .map(|b| b.0.clone())
        .ok_or_else(|| {
            format!("the Secret {ns}/{KEY_SECRET} has no data key {KEY_SECRET_KEY:?}; {how}")
        })?;
    crate::peer::wire::PeerKey::from_bytes(&bytes)
        .map_err(|e| format!("the Secret {ns}/{KEY_SECRET}, key {KEY_SECRET_KEY:?}: {e}; {how}"))
}

/// A failed read of the peer key Secret that retrying cannot fix: an answer of the API
/// server with a 4xx status other than 429 (403: RBAC, 401: credentials, ...).
fn key_read_is_final(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429)
}

#[cfg(test)]
mod tests {
    use super::*;

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
