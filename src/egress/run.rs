//! The egress wing at run time: one task keeps the egress chains equal to
//! [`super::plan::table`] of the latest facts, one transaction per change, retried every
//! [`RETRY`] after a failure; each problem is logged once (a WARN naming the Service, the
//! annotation and the value) until it goes away. At stop the chains are emptied.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Settings;
use super::plan::{Problem, table};
use crate::kube::service::EgressReport;
use crate::net::nft::egress::{EgressTable, NftEgress};

/// Pause before a refused change is tried again.
pub const RETRY: Duration = Duration::from_secs(1);

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
) -> Running {
    let stop = CancellationToken::new();
    let task = tokio::spawn(follow(settings, facts, nft, stop.clone()));
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
}

async fn follow(
    settings: Settings,
    mut facts: watch::Receiver<Arc<EgressReport>>,
    nft: NftEgress,
    stop: CancellationToken,
) {
    let mut st = State::default();
    loop {
        let current = facts.borrow_and_update().clone();
        let retry_at = match pass(&settings, &current, &nft, &mut st).await {
            true => None,
            false => Some(tokio::time::Instant::now() + RETRY),
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            r = facts.changed() => if r.is_err() { stop.cancelled().await; break },
            _ = until(retry_at) => {}
        }
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
    }
    st.reported = now;
    // Not written yet: the chains do not exist (the fence table is new at start), which
    // is the empty table.
    if st.applied.as_ref().unwrap_or(&EgressTable::default()) == &want {
        return true;
    }
    match nft.apply(&want).await {
        Ok(()) => {
            info!(
                rules = want.snat.len(),
                vips = want.guarded.len(),
                "egress rules updated (nft list chain inet vipd_fence egress_snat)"
            );
            st.applied = Some(want);
            st.failed = None;
            true
        }
        Err(e) => {
            let text = e.to_string();
            if st.failed.as_deref() != Some(text.as_str()) {
                warn!(error = %text, retry_s = RETRY.as_secs(), "egress: the rules cannot be installed (egress needs the millisecond fence, vip_nftfence, and nf_tables NAT); trying again");
            }
            st.failed = Some(text);
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
