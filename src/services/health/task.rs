//! The health side of one group task, run while the group runs.

use super::*;

/// The health side of one group task: follows leadership and the group's Services' checks
/// until `stop`, runs the checks when [`HealthMachine::wants_checks`], and opens and closes
/// [`GATE_HEALTH`] as [`HealthMachine`] decides; a hand-over is logged, counted
/// (`vipd_health_handovers_total`) and posted as a Warning Event on each Service.
pub(crate) async fn follow<K: crate::net::Kernel, A: crate::net::Announcer>(
    shared: std::sync::Arc<crate::services::shared::Shared<K, A>>,
    lease: String,
    mut spec: tokio::sync::watch::Receiver<
        std::sync::Arc<crate::services::plan::decide::GroupSpec>,
    >,
    mut state: tokio::sync::watch::Receiver<crate::election::LeaderState>,
    gates: crate::election::Gates,
    stop: tokio_util::sync::CancellationToken,
) {
    use crate::election::LeaderState;
    use tracing::{info, warn};
    let settings = shared.health.clone();
    let mut machine = HealthMachine::new(settings.policy);
    let mut tick = tokio::time::interval(settings.policy.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned_invalid: Vec<(String, String, String)> = Vec::new();
    let mut last_checks: Vec<HealthCheck> = Vec::new();
    // The checks are read again only when the group's Services or the cache changed: a
    // shard's group has hundreds of Services, and every node runs every shard's group.
    let mut seen = shared.services_seen.subscribe();
    let mut current = spec.borrow_and_update().clone();
    let mut checks = current_checks(&shared, &current, &mut warned_invalid);
    loop {
        // Leadership changes (every renewal is one) only update the machine; checks run on
        // the tick.
        let tick_due = tokio::select! {
            _ = stop.cancelled() => return,
            r = state.changed() => if r.is_err() { return } else { false },
            _ = tick.tick() => true,
        };
        let leading = matches!(*state.borrow_and_update(), LeaderState::Leading { .. });
        machine.on_leading(leading, Instant::now());
        if !tick_due {
            continue;
        }
        let spec_changed = spec.has_changed().unwrap_or(false);
        if spec_changed || seen.has_changed().unwrap_or(false) {
            seen.borrow_and_update();
            if spec_changed {
                current = spec.borrow_and_update().clone();
            }
            checks = current_checks(&shared, &current, &mut warned_invalid);
        }
        if checks != last_checks {
            if !checks.is_empty() {
                let list: Vec<String> = checks.iter().map(ToString::to_string).collect();
                info!(%lease, checks = ?list, "health checks of this Service lease");
            }
            last_checks = checks.clone();
        }
        if checks.is_empty() {
            if machine.on_disabled() == HealthStep::Reopen {
                info!(%lease, "health check switched off: campaigning again");
                gates.set(GATE_HEALTH, true);
            }
            continue;
        }
        if !machine.wants_checks() {
            continue;
        }
        let result = Box::pin(run_checks(&checks)).await;
        if result.is_err() {
            shared.service_metrics().health_check_failed(&lease);
        }
        let failed = result.as_ref().err().cloned();
        match machine.on_result(Instant::now(), result) {
            HealthStep::Nothing => {
                if let Some(e) = failed {
                    tracing::debug!(%lease, error = %e, "health check failed");
                }
            }
            HealthStep::HandOver(e) => {
                let why = format!(
                    "health check {e} ({} failures in a row)",
                    settings.policy.fail_after
                );
                warn!(%lease, reason = %why, "data path unhealthy: handing the Service over");
                shared.service_metrics().health_handover(&lease);
                current.count_handovers(&shared.metrics, "health");
                gates.set(GATE_HEALTH, false);
                let ctx = shared.status_ctx();
                Box::pin(crate::services::sync::report_each(
                    &ctx,
                    &current,
                    |addrs| {
                        crate::services::publish::ServiceEvent::health_handover(
                            &shared.node,
                            addrs,
                            &why,
                        )
                    },
                ))
                .await;
            }
            HealthStep::Reopen => {
                info!(%lease, "health check passes again: campaigning");
                gates.set(GATE_HEALTH, true);
            }
        }
    }
}

/// The checks of `current`'s Services now (each one's annotation from the cache, else the
/// node's `svc_healthcheck`), warning about an invalid annotation when it was not invalid
/// in the last call (`warned_invalid`: the invalid ones then).
fn current_checks<K: crate::net::Kernel, A: crate::net::Announcer>(
    shared: &crate::services::shared::Shared<K, A>,
    current: &crate::services::plan::decide::GroupSpec,
    warned_invalid: &mut Vec<(String, String, String)>,
) -> Vec<HealthCheck> {
    let mut invalid = Vec::new();
    let checks = {
        let ctx = shared.status_ctx();
        let anns: Vec<(String, Option<String>)> = current
            .services
            .iter()
            .map(|(k, _, _)| {
                let a = ctx.cached(k).and_then(|s| {
                    s.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(HEALTHCHECK_ANNOTATION).cloned())
                });
                (k.to_string(), a)
            })
            .collect();
        group_checks(
            anns.iter().map(|(k, a)| (k.clone(), a.as_deref())),
            shared.health.default.as_ref(),
            &mut invalid,
        )
    };
    for bad in &invalid {
        if !warned_invalid.contains(bad) {
            tracing::warn!(service = %bad.0, value = %bad.1, error = %bad.2, "invalid {HEALTHCHECK_ANNOTATION} annotation; using the node's svc_healthcheck");
        }
    }
    *warned_invalid = invalid;
    checks
}
