//! The idle phase: RSS of the leading and a following vipd and the Lease writes per second.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use serde::{Deserialize, Serialize};
use xtask::lab::NODES;

use super::IDLE_WINDOW;
use crate::bench::harness::api::lease_writes_per_s;
use crate::bench::harness::cluster::Cluster;
use crate::bench::harness::ctx::Ctx;
use crate::bench::harness::procfs::rss_kib;
use crate::bench::harness::subject::Subject;

/// Idle figures of one subject.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdleResult {
    /// [`Subject::label`](crate::bench::harness::subject::Subject::label).
    pub subject: String,
    /// VmRSS of the leading vipd after [`IDLE_WINDOW`], KiB.
    pub leader_rss_kib: Option<u64>,
    /// Largest VmRSS of a following vipd after [`IDLE_WINDOW`], KiB.
    pub follower_rss_kib: Option<u64>,
    /// Lease writes (watch events) per second over [`IDLE_WINDOW`].
    pub lease_writes_per_s: Option<f64>,
}

/// The idle phase: start `subject` on every node, wait for a holder, count Lease writes
/// and read the RSS of the leader and the followers after [`IDLE_WINDOW`].
///
/// # Errors
/// When the cluster does not elect a holder.
pub fn idle(ctx: &Ctx, subject: &Subject) -> Result<IdleResult> {
    ctx.delete_lease()?;
    ctx.clear_vip(Duration::from_secs(6))?;
    let mut cluster = Cluster::start(ctx, subject)?;
    let holder = ctx.single_holder(Duration::from_secs(30))?;
    let t0 = Instant::now();
    let writes = std::thread::scope(|s| {
        let h = s.spawn(|| lease_writes_per_s(&ctx.lab, IDLE_WINDOW));
        std::thread::sleep(IDLE_WINDOW.saturating_sub(t0.elapsed()));
        h.join()
            .map_err(|_| anyhow!("lease watch thread panicked"))
            .and_then(|r| r)
    });
    let leader_rss = cluster.process(&holder).and_then(|p| rss_kib(p.pid()));
    let follower_rss = NODES
        .iter()
        .filter(|n| **n != holder)
        .filter_map(|n| cluster.process(n).and_then(|p| rss_kib(p.pid())))
        .max();
    cluster.stop();
    let writes = match writes {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!("lease write count failed: {e:#}");
            None
        }
    };
    Ok(IdleResult {
        subject: subject.label(),
        leader_rss_kib: leader_rss,
        follower_rss_kib: follower_rss,
        lease_writes_per_s: writes,
    })
}

/// The idle figures of one subject as one line.
pub fn idle_line(r: &IdleResult) -> String {
    let mib = |k: Option<u64>| {
        k.map(|k| {
            format!(
                "{k} KiB = {:.1} MB ({:.1} MiB)",
                k as f64 * 1024.0 / 1e6,
                k as f64 / 1024.0
            )
        })
        .unwrap_or_else(|| "?".into())
    };
    format!(
        "idle {:<16} RSS leader {}  follower {}  lease writes {}/s",
        r.subject,
        mib(r.leader_rss_kib),
        mib(r.follower_rss_kib),
        r.lease_writes_per_s
            .map(|w| format!("{w:.2}"))
            .unwrap_or_else(|| "?".into())
    )
}
