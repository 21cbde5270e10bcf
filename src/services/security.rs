//! Service security at run time (`enable_service_security`): every group task reports the
//! Services it announces ([`Security::set`]); one task keeps vipd's `inet vipd_svcsec` table
//! equal to [`crate::services::plan::security::ruleset`] of all of them, one atomic nf_tables
//! transaction per change, retried after a failure. The table is created (replacing one a
//! killed run left) when the wing starts and deleted when it stops, after the groups have
//! dropped their VIPs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::net::nft::svcsec::{self, NftSvcSec, SVCSEC_TABLE, SvcSecError};
use crate::services::plan::security::{Held, ruleset};

/// Pause before a failed nf_tables transaction is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// The table and what each group announces.
#[derive(Debug)]
pub(super) struct Security {
    table: NftSvcSec,
    /// Per group (its lease), the Services it announces now.
    held: Mutex<BTreeMap<String, Vec<Held>>>,
    /// Woken by every change of `held`.
    changed: Notify,
}

impl Security {
    /// With `enabled`, creates the table ([`NftSvcSec::start`]); without, deletes one an
    /// earlier run with the option on may have left (quietly when `nft` cannot run: then
    /// there is none).
    ///
    /// # Errors
    /// [`SvcSecError::Setup`] when the option is on and the table cannot be created: vipd
    /// does not announce Services it was asked to guard without guarding them.
    pub(super) async fn start(enabled: bool) -> Result<Option<Arc<Security>>, SvcSecError> {
        if !enabled {
            if let Err(e) = svcsec::remove().await {
                debug!(error = %e, "no Service security table to remove (enable_service_security is off)");
            }
            return Ok(None);
        }
        let table = NftSvcSec::start().await?;
        info!(
            table = SVCSEC_TABLE,
            "service security on: only the Services' own ports (and UDP 68) reach the VIPs this node announces (nft list table inet vipd_svcsec)"
        );
        Ok(Some(Arc::new(Security {
            table,
            held: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
        })))
    }

    /// Records that `group` announces `held` now (empty: nothing any more).
    pub(super) fn set(&self, group: &str, held: Vec<Held>) {
        let mut all = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = if held.is_empty() {
            all.remove(group).is_some()
        } else if all.get(group) == Some(&held) {
            false
        } else {
            all.insert(group.to_string(), held);
            true
        };
        drop(all);
        if changed {
            self.changed.notify_one();
        }
    }

    /// Every group's Services, in group order.
    fn all(&self) -> Vec<Held> {
        let all = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        all.values().flatten().cloned().collect()
    }

    /// Keeps the table up to date until `stop`, then deletes it (the caller stops the
    /// groups first).
    pub(super) fn spawn(self: Arc<Self>, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut retry_at: Option<tokio::time::Instant> = None;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = self.changed.notified() => {}
                    _ = super::sync::until(retry_at) => {}
                }
                retry_at = self
                    .apply()
                    .await
                    .err()
                    .map(|_| tokio::time::Instant::now() + RETRY);
            }
            if let Err(e) = self.table.close().await {
                warn!(error = %e, "could not remove the Service security table");
            }
        })
    }

    /// One pass: the table made equal to the ruleset of every group's Services.
    async fn apply(&self) -> Result<(), SvcSecError> {
        let want = ruleset(&self.all()).elements;
        match self.table.apply(&want).await {
            Ok(true) => {
                debug!(elements = want.len(), "service security table updated");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => {
                warn!(error = %e, retry_s = RETRY.as_secs(), "service security: updating the table failed; trying again");
                Err(e)
            }
        }
    }
}
