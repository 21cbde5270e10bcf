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

use crate::election::DuplicateIdentity;
use crate::obs::readiness::Readiness;
use crate::services::plan::model::ServiceKey;
use crate::services::status::{KubeStatusWriter, ServiceEvent, StatusWriter};

/// Applies one value of the duplicate-identity condition of lease `lease` (namespace and
/// name): sets or clears the readiness condition and, when `cond` is `Some`, posts the
/// Warning Event about each of `services`, or about the Lease when `services` is empty.
/// Event failures (RBAC, API down) are logged, not retried: the log line, `/readyz` and the
/// metric carry the same news.
pub(crate) async fn publish(
    cond: Option<&DuplicateIdentity>,
    lease: &ServiceKey,
    services: &[ServiceKey],
    readiness: &Readiness,
    writer: &KubeStatusWriter,
) {
    let name = lease.to_string();
    readiness.set_duplicate_identity(&name, cond.is_some());
    let Some(cond) = cond else {
        return;
    };
    let ev = ServiceEvent::duplicate_identity(&cond.identity, &name);
    if services.is_empty() {
        if let Err(e) = writer.lease_event(lease, &ev).await {
            warn!(lease = %name, error = %e, "cannot record the DuplicateIdentity event");
        }
        return;
    }
    for svc in services {
        if let Err(e) = writer.event(svc, None, &ev).await {
            warn!(service = %svc, lease = %name, error = %e, "cannot record the DuplicateIdentity event");
        }
    }
}

/// Follows an elector's condition (from [`crate::election::Elector::duplicate_identity`])
/// until `stop` or until the elector is gone, calling [`publish`] on every change with the
/// Event about the Lease. Clears the readiness condition of `lease` when it ends.
pub(crate) async fn follow(
    mut cond: watch::Receiver<Option<DuplicateIdentity>>,
    lease: ServiceKey,
    readiness: Readiness,
    writer: KubeStatusWriter,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            r = cond.changed() => if r.is_err() { break },
        }
        let now = cond.borrow_and_update().clone();
        publish(now.as_ref(), &lease, &[], &readiness, &writer).await;
    }
    readiness.set_duplicate_identity(&lease.to_string(), false);
}
