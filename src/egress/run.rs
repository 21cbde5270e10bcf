//! The egress wing at run time: one task keeps the egress chains equal to
//! [`super::plan::table`] of the latest facts, one transaction per change, retried every
//! [`RETRY`] after a failure; each problem is logged once (a WARN naming the Service, the
//! annotation and the value, and a Warning Event [`REASON_EGRESS_NOT_APPLIED`] on the
//! Service) until it goes away. At stop the chains are emptied. The rules'
//! counters are read every [`COUNT_EVERY`] and before each change, into
//! `vipd_egress_connections_total` ([`super::metrics`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Settings;
use super::metrics::EgressMetrics;
use super::plan::{Problem, table};
use crate::kube::events::{Event, EventKind, Recorder};
use crate::kube::service::EgressReport;
use crate::net::nft::egress::{EgressError, EgressTable, NftEgress, translated};
use k8s_openapi::api::core::v1::Service;

/// Pause before a refused change is tried again.
pub const RETRY: Duration = Duration::from_secs(1);
/// How often the rules' counters are read while there are rules.
pub const COUNT_EVERY: Duration = Duration::from_secs(10);

/// The running egress wing.
pub struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Empties the chains and ends the task.
    pub async fn stop(self) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            warn!(error = %e, "egress task failed");
        }
    }
}

/// Starts the wing: follows `facts` (sent by the Services wing) until [`Running::stop`].
pub fn start(
    settings: Settings,
    facts: watch::Receiver<Arc<EgressReport>>,
    nft: NftEgress,
    metrics: Arc<EgressMetrics>,
    events: Recorder,
) -> Running {
    let stop = CancellationToken::new();
    let st = State {
        metrics: Some(metrics),
        events: Some(events),
        ..State::default()
    };
    let task = tokio::spawn(follow(settings, facts, nft, st, stop.clone()));
    Running { stop, task }
}

/// What the task remembers between passes.
#[derive(Default)]
struct State {
    /// The chains' content as of the last successful change (`None`: not written yet).
    applied: Option<EgressTable>,
    /// Problems logged and not gone since.
    reported: BTreeSet<Problem>,
    /// The last refusal logged (one WARN per distinct error).
    failed: Option<String>,
    /// Per Service, the rules' counters at their last reading since the rules were last
    /// replaced (replaced rules count from 0).
    seen: BTreeMap<String, u64>,
    metrics: Option<Arc<EgressMetrics>>,
    /// Posts a Warning [`REASON_EGRESS_NOT_APPLIED`] per new problem.
    events: Option<Recorder>,
}

/// The reason of the Warning Event on a Service whose egress this node does not apply.
pub const REASON_EGRESS_NOT_APPLIED: &str = "EgressNotApplied";

/// Posts one Warning Event about `p`'s Service (in the background: an API outage never
/// holds the rules up; a failure is logged by the recorder).
fn post(events: &Recorder, p: &Problem) {
    let Some((namespace, name)) = p.service.split_once('/') else {
        return;
    };
    let key = crate::kube::ObjectKey::new(namespace, name);
    let event = Event {
        kind: EventKind::Warning,
        reason: REASON_EGRESS_NOT_APPLIED.into(),
        action: "Egress".into(),
        note: p.message.clone(),
        change: String::new(),
    };
    let events = events.clone();
    tokio::spawn(async move {
        if let Err(e) = events.record::<Service>(&key, &event).await {
            debug!(error = %e, "egress: Event not posted");
        }
    });
}

/// The connections counted since the last reading, per Service (`now`: the counters read
/// now; a counter below its last reading was replaced and counts from 0), and `seen`
/// updated to `now`.
fn deltas(seen: &mut BTreeMap<String, u64>, now: BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let out = now
        .iter()
        .filter_map(|(service, n)| {
            let before = seen.get(service).copied().unwrap_or(0);
            let d = if *n >= before { n - before } else { *n };
            (d > 0).then(|| (service.clone(), d))
        })
        .collect();
    *seen = now;
    out
}

/// Reads the rules' counters into the metrics (nothing while there are no rules).
async fn count(st: &mut State) {
    let Some(m) = st.metrics.clone() else {
        return;
    };
    if st.applied.as_ref().is_none_or(|t| t.snat.is_empty()) {
        return;
    }
    match translated().await {
        Ok(now) => {
            for (service, n) in deltas(&mut st.seen, now) {
                m.translated(&service, n);
            }
        }
        Err(e) => debug!(error = %e, "egress: counters not read"),
    }
}

/// The endpoints with rules per Service, for `vipd_egress_endpoints`.
fn endpoints_per_service(t: &EgressTable) -> Vec<(String, usize)> {
    let mut per: BTreeMap<&str, BTreeSet<std::net::IpAddr>> = BTreeMap::new();
    for r in &t.snat {
        per.entry(&r.service).or_default().insert(r.source);
    }
    per.into_iter()
        .map(|(s, e)| (s.to_string(), e.len()))
        .collect()
}

async fn follow(
    settings: Settings,
    mut facts: watch::Receiver<Arc<EgressReport>>,
    nft: NftEgress,
    mut st: State,
    stop: CancellationToken,
) {
    let mut counting = tokio::time::interval(COUNT_EVERY);
    counting.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry_at = None;
    let mut due = true;
    loop {
        if due {
            let current = facts.borrow_and_update().clone();
            retry_at = match pass(&settings, &current, &nft, &mut st).await {
                true => None,
                false => Some(tokio::time::Instant::now() + RETRY),
            };
        }
        due = tokio::select! {
            _ = stop.cancelled() => break,
            r = facts.changed() => match r {
                Ok(()) => true,
                Err(_) => { stop.cancelled().await; break }
            },
            _ = until(retry_at) => true,
            _ = counting.tick() => { count(&mut st).await; false }
        };
    }
    if st
        .applied
        .as_ref()
        .is_some_and(|t| *t != EgressTable::default())
        && let Err(e) = nft.apply(&EgressTable::default()).await
    {
        debug!(error = %e, "egress chains not emptied (the fence table may be gone already)");
    }
}

/// One pass; `false` when the kernel refused the change (try again later).
async fn pass(settings: &Settings, facts: &EgressReport, nft: &NftEgress, st: &mut State) -> bool {
    let (want, problems) = table(facts, settings);
    let now: BTreeSet<Problem> = problems.into_iter().collect();
    for p in now.difference(&st.reported) {
        warn!(service = %p.service, "egress: {}", p.message);
        if let Some(events) = &st.events {
            post(events, p);
        }
    }
    st.reported = now;
    // Not written yet: the chains do not exist (the fence table is new at start), which
    // is the empty table.
    if st.applied.as_ref().unwrap_or(&EgressTable::default()) == &want {
        return true;
    }
    // What the rules about to be replaced counted since the last reading.
    count(st).await;
    match nft.apply(&want).await {
        Ok(()) => {
            st.seen.clear();
            if let Some(m) = &st.metrics {
                m.set_endpoints(&endpoints_per_service(&want));
            }
            info!(
                rules = want.snat.len(),
                vips = want.guarded.len(),
                "egress rules updated (nft list chain inet vipd_fence egress_snat)"
            );
            st.applied = Some(want);
            st.failed = None;
            true
        }
        Err(EgressError::Change { command, detail }) => {
            // One WARN per kernel answer, whatever the rules (they change with endpoints).
            if st.failed.as_deref() != Some(detail.as_str()) {
                warn!(error = %detail, batch = %command, retry_s = RETRY.as_secs(), "egress: the rules cannot be installed (they need nf_tables NAT for the inet family, Linux 5.2+); trying again");
            }
            st.failed = Some(detail);
            false
        }
    }
}

/// Resolves at `at`; never when `None`.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_count_from_the_last_reading_and_from_zero_after_a_reset() {
        let mut seen = BTreeMap::new();
        let now = |v: &[(&str, u64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        assert_eq!(
            deltas(&mut seen, now(&[("a/x", 3), ("a/y", 0)])),
            vec![("a/x".to_string(), 3)]
        );
        assert_eq!(
            deltas(&mut seen, now(&[("a/x", 5), ("a/y", 1)])),
            vec![("a/x".to_string(), 2), ("a/y".to_string(), 1)]
        );
        // a/x's rules were replaced underneath (counter below the last reading).
        assert_eq!(
            deltas(&mut seen, now(&[("a/x", 1), ("a/y", 1)])),
            vec![("a/x".to_string(), 1)]
        );
        assert_eq!(deltas(&mut seen, now(&[])), vec![]);
        assert!(seen.is_empty());
    }
}
