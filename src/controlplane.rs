//! The control-plane VIP: one Lease (`vip_leasename` in `cp_namespace`), its VIPs, and the
//! health check of the node's own API server (scenario S10).

use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin::Readiness;
use crate::election::Gates;

/// Gate closed while the node's own API server fails its health check.
pub const GATE_LOCAL_API: &str = "local-api";

/// Consecutive failed health checks after which the node steps down.
pub const HEALTH_FAILURES: u32 = 3;

/// Interval between health checks of the local API server (1 s).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// Counts consecutive failures and successes of a health check; pure.
#[derive(Debug, Clone, Default)]
pub struct HealthTracker {
    failures: u32,
}

impl HealthTracker {
    /// Records one result and returns whether the gate should be open: closes after
    /// [`HEALTH_FAILURES`] consecutive failures, opens again at the first success.
    pub fn record(&mut self, ok: bool) -> bool {
        if ok {
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
        }
        self.failures < HEALTH_FAILURES
    }
}

/// One health check of the API server behind `client`: `GET /livez`, falling back to
/// `/healthz` (the only one some old servers serve), each bounded by `limit`.
///
/// # Errors
/// A message saying what failed (transport error, timeout, or the body when not `ok`).
pub async fn check_api(client: &kube::Client, limit: Duration) -> Result<(), String> {
    let mut last = String::new();
    for path in ["/livez", "/healthz"] {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(limit, client.request_text(req)).await {
            Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
            Ok(Ok(body)) => last = format!("{path}: {}", body.trim()),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                last = format!("{path}: 404");
                continue;
            }
            Ok(Err(e)) => return Err(format!("{path}: {e}")),
            Err(_) => return Err(format!("{path}: timed out after {} ms", limit.as_millis())),
        }
    }
    Err(last)
}

/// Checks the API server behind `client` every [`HEALTH_INTERVAL`] until `shutdown`:
/// drives the [`GATE_LOCAL_API`] gate when `gates` is given (control-plane mode: the node's
/// own API server), sets `readiness`'s API flag, and tells systemd `READY=1` after the first
/// good answer.
pub async fn health_loop(
    client: kube::Client,
    gates: Option<Gates>,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    let mut notified = false;
    let mut tracker = HealthTracker::default();
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut was_open = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let res = check_api(&client, HEALTH_INTERVAL).await;
        let open = tracker.record(res.is_ok());
        match (&res, was_open, open) {
            (Err(e), true, false) => {
                warn!(error = %e, failures = HEALTH_FAILURES, "local API server unhealthy; stepping down and not campaigning")
            }
            (Err(e), true, true) => warn!(error = %e, "local API server health check failed"),
            (Ok(()), false, true) => info!("local API server healthy again"),
            _ => {}
        }
        was_open = open;
        if let Some(g) = &gates {
            g.set(GATE_LOCAL_API, open);
        }
        readiness.set_api_reachable(res.is_ok());
        if res.is_ok() && !notified {
            notified = true;
            if let Err(e) = crate::systemd::notify_ready("configuration valid, API reachable") {
                warn!(error = %e, "cannot notify systemd");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_consecutive_failures_close_and_one_success_opens() {
        let mut t = HealthTracker::default();
        assert!(t.record(false));
        assert!(t.record(false));
        assert!(t.record(true), "a success resets the count");
        assert!(t.record(false));
        assert!(t.record(false));
        assert!(!t.record(false));
        assert!(!t.record(false));
        assert!(t.record(true));
    }
}
