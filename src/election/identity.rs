//! Reporting a duplicate identity (scenario S35: two vipd processes running with the same
//! node name) that an election found, see [`crate::election::DuplicateIdentity`]. The
//! elector itself logs the ERROR, counts `vipd_duplicate_identity_total` and steps down; this
//! module turns its published condition into the other two signals:
//!
//! * `/readyz` fails with [`crate::obs::readiness::DUPLICATE_IDENTITY`] while the condition lasts;
//! * a Warning Event `DuplicateIdentity` is posted once per episode, about the Lease itself
//!   (control-plane lease, global Services lease) or about the Services whose addresses a
//!   per-Service lease governs (that is where `kubectl describe service` shows it).

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;

use crate::election::DuplicateIdentity;
use crate::kube::ObjectKey;
use crate::kube::events::{Event, EventKind, Recorder};
use crate::obs::readiness::Readiness;

/// Reason of [`duplicate_identity_event`].
pub(crate) const REASON_DUPLICATE_IDENTITY: &str = "DuplicateIdentity";

/// Warning: another process writes lease `lease` (`namespace/name`) under this node's
/// identity `identity`, so this node does not hold the lease or its addresses while the
/// other one renews it.
pub(crate) fn duplicate_identity_event(identity: &str, lease: &str) -> Event {
    Event {
        kind: EventKind::Warning,
        reason: REASON_DUPLICATE_IDENTITY.into(),
        action: "LeaderElection".into(),
        note: format!(
            "another vipd process writes lease {lease} under this node's identity \
             {identity}; node names (vip_nodename) must be unique. This process does not \
             hold the lease or its addresses while the other one renews it"
        ),
        change: String::new(),
    }
}

/// Applies one value of the duplicate-identity condition of lease `lease` (namespace and
/// name): sets or clears the readiness condition and, when `cond` is `Some`, posts the
/// Warning Event about each of `services`, or about the Lease when `services` is empty.
/// Event failures (RBAC, API down) are logged, not retried: the log line, `/readyz` and the
/// metric carry the same news.
pub(crate) async fn publish(
    cond: Option<&DuplicateIdentity>,
    lease: &ObjectKey,
    services: &[ObjectKey],
    readiness: &Readiness,
    recorder: &Recorder,
) {
    let name = lease.to_string();
    readiness.set_duplicate_identity(&name, cond.is_some());
    let Some(cond) = cond else {
        return;
    };
    let ev = duplicate_identity_event(&cond.identity, &name);
    if services.is_empty() {
        if let Err(e) = recorder.record::<Lease>(lease, &ev).await {
            warn!(lease = %name, error = %e, "cannot record the DuplicateIdentity event");
        }
        return;
    }
    for svc in services {
        if let Err(e) = recorder.record::<Service>(svc, &ev).await {
            warn!(service = %svc, lease = %name, error = %e, "cannot record the DuplicateIdentity event");
        }
    }
}

/// Follows an elector's condition (from [`crate::election::Elector::duplicate_identity`])
/// until `stop` or until the elector is gone, calling [`publish`] on every change with the
/// Event about the Lease. Clears the readiness condition of `lease` when it ends.
pub(crate) async fn follow(
    mut cond: watch::Receiver<Option<DuplicateIdentity>>,
    lease: ObjectKey,
    readiness: Readiness,
    recorder: Recorder,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            r = cond.changed() => if r.is_err() { break },
        }
        let now = cond.borrow_and_update().clone();
        publish(now.as_ref(), &lease, &[], &readiness, &recorder).await;
    }
    readiness.set_duplicate_identity(&lease.to_string(), false);
}
