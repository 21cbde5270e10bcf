//! `cargo xtask bench ...`: benchmarks that print figures (failover against keepalived,
//! LoadBalancer Services at scale and under churn, the peer protocol's heartbeat cost, the
//! flapping guard under API server load) and their shared statistics.

pub mod apiload;
pub mod failover;
pub mod heartbeat;
pub mod services;
pub mod stats;

/// POSTs `body` to `path` as admin and expects 201 Created.
///
/// # Errors
/// The call failing, or another status (named with `what` and the server's answer).
pub fn create(
    lab: &xtask::lab::Lab,
    path: &str,
    body: &serde_json::Value,
    what: &str,
) -> anyhow::Result<()> {
    let r = lab.api_request("POST", path, Some(&body.to_string()))?;
    if r.status != 201 {
        anyhow::bail!("create {what}: HTTP {}: {}", r.status, r.body);
    }
    Ok(())
}
