//! A Lease that lives in this process only ([`LocalLeaseClient`]): the elector's
//! [`LeaseClient`] for groups that every eligible node serves at once (routing-table mode
//! without election, kube-vip's `ServicesNoLeader`: every node routes every Service and the
//! fabric spreads the traffic by ECMP). Nobody else writes it, so the lease is always
//! granted: the elector leads while the node's gates are open, renews every retry period
//! (the VIP holder refreshes its kernel fence on every renewal, as with a real Lease) and
//! steps down and releases when a gate closes. No API call is ever made, so an API server
//! outage changes nothing here.

use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use futures::stream::BoxStream;

use super::{LeaseClient, LeaseError, LeaseEvent, LeaseRecord, Observed};

/// An in-memory Lease: increasing resourceVersions (`"1"`, `"2"`, ...), conditional
/// updates as the API server does them, no watch events (only this process writes it).
/// Clones share the lease.
#[derive(Clone)]
pub struct LocalLeaseClient {
    name: String,
    lease: Arc<Mutex<Option<(LeaseRecord, u64)>>>,
}

impl LocalLeaseClient {
    /// A new, absent lease described as `name` in logs (e.g. `local/198.51.100.80`).
    pub fn new(name: &str) -> Self {
        LocalLeaseClient {
            name: name.to_string(),
            lease: Arc::new(Mutex::new(None)),
        }
    }

    /// Stores `record` if the lease is at `expected` (`None`: absent), under the next
    /// resourceVersion.
    fn store(&self, record: &LeaseRecord, expected: Option<&str>) -> Result<Observed, LeaseError> {
        let mut lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        let current = lease.as_ref().map(|(_, rv)| *rv);
        match (expected, current) {
            (None, Some(_)) => {
                return Err(LeaseError::AlreadyExists {
                    lease: self.name.clone(),
                });
            }
            (Some(want), cur) if cur.map(|c| c.to_string()).as_deref() != Some(want) => {
                return Err(LeaseError::Conflict {
                    lease: self.name.clone(),
                });
            }
            _ => {}
        }
        let rv = current.unwrap_or(0) + 1;
        *lease = Some((record.clone(), rv));
        Ok(Observed {
            record: record.clone(),
            resource_version: rv.to_string(),
        })
    }
}

impl LeaseClient for LocalLeaseClient {
    fn describe(&self) -> String {
        self.name.clone()
    }

    async fn get(&self) -> Result<Option<Observed>, LeaseError> {
        let lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(lease.as_ref().map(|(record, rv)| Observed {
            record: record.clone(),
            resource_version: rv.to_string(),
        }))
    }

    async fn create(&self, record: &LeaseRecord) -> Result<Observed, LeaseError> {
        self.store(record, None)
    }

    async fn update(
        &self,
        record: &LeaseRecord,
        resource_version: &str,
    ) -> Result<Observed, LeaseError> {
        self.store(record, Some(resource_version))
    }

    fn watch(&self) -> BoxStream<'static, LeaseEvent> {
        // Nobody else writes the lease: nothing to hear of.
        futures::stream::pending().boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::{Elector, Gates, LeaderState};
    use crate::lease::Timing;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    const TIMING: Timing = Timing {
        lease_duration: Duration::from_secs(5),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
    };

    #[tokio::test]
    async fn writes_are_conditional_like_the_api_servers() {
        let c = LocalLeaseClient::new("local/x");
        assert_eq!(c.get().await.unwrap(), None);
        let rec = crate::election::record::claim(
            None,
            "node-a",
            TIMING.lease_duration,
            crate::election::record::now_micros(),
        );
        let first = c.create(&rec).await.unwrap();
        assert_eq!(first.resource_version, "1");
        assert!(matches!(
            c.create(&rec).await,
            Err(LeaseError::AlreadyExists { .. })
        ));
        assert!(matches!(
            c.update(&rec, "7").await,
            Err(LeaseError::Conflict { .. })
        ));
        let second = c.update(&rec, "1").await.unwrap();
        assert!(second.is_newer_than(&first));
        assert_eq!(c.get().await.unwrap(), Some(second));
    }

    /// The elector on a local lease leads at once, renews every retry period, steps down
    /// when a gate closes and leads again when it opens: the node's own conditions alone
    /// decide.
    #[tokio::test(start_paused = true)]
    async fn the_elector_leads_while_the_gates_are_open() {
        let gates = Gates::default();
        let (elector, leadership) = Elector::new(
            LocalLeaseClient::new("local/x"),
            "node-a".into(),
            TIMING,
            &gates,
        );
        let mut state = leadership.state.clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(elector.run(stop.clone()));
        // The follower acknowledges every dropped term at once (no VIPs to remove).
        let follower = tokio::spawn(crate::election::acknowledge_terms(leadership));
        let leading = |s: &LeaderState| matches!(s, LeaderState::Leading { .. });
        tokio::time::timeout(Duration::from_secs(1), state.wait_for(leading))
            .await
            .expect("leads within a second")
            .expect("state");
        let first = match &*state.borrow() {
            LeaderState::Leading { renewed_at, .. } => *renewed_at,
            LeaderState::Following { .. } => unreachable!(),
        };
        tokio::time::sleep(TIMING.retry_period * 3).await;
        match &*state.borrow() {
            LeaderState::Leading { renewed_at, .. } => assert!(*renewed_at > first, "renewed"),
            LeaderState::Following { .. } => panic!("stepped down"),
        }
        gates.set("link", false);
        tokio::time::timeout(Duration::from_secs(2), state.wait_for(|s| !leading(s)))
            .await
            .expect("steps down when a gate closes")
            .expect("state");
        gates.set("link", true);
        tokio::time::timeout(Duration::from_secs(3), state.wait_for(leading))
            .await
            .expect("leads again when it opens")
            .expect("state");
        stop.cancel();
        let end = task.await.expect("elector");
        assert!(end.released, "released at the end");
        follower.abort();
    }
}
