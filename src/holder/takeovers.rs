//! The takeovers in progress on this node, so that other work can wait for them.
//!
//! A holder whose term starts with VIPs to take over marks them from the start of the term
//! until its first batch of them is in place (the `takeover:` line), none of them is still
//! in its probe window (all refused, gone from the set, left to the next renewal), or the
//! term ends. The
//! Services' status writer waits, before each call, while the node takes over
//! [`BUSY_VIPS`] VIPs or more (at most its own limit per call): at a power-off the
//! survivors' status and Event writes for thousands of Services (two calls each, every one
//! a watch event for every node) contend for the CPU and the API server with the adds of
//! the shards just taken, and the VIPs answering is what a takeover is for. Measured on the
//! lab's 2-core machine (10 000 Services, 16 shards): every address of the powered-off node
//! answered again within 9.5 s without the wait and 5.6-7.7 s with it, with the IPv6 VIPs
//! still addresses on `lo` (docs/services-bench.md).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The node is busy taking over while its holders' takeovers in progress count this many
/// VIPs or more (one chunk of adds, 64): a per-Service lease's takeover of one VIP, over in
/// tens of milliseconds, holds nothing back; a shard's hundreds, or a mass failover of
/// per-Service leases, do.
pub const BUSY_VIPS: usize = 64;

/// The VIPs this node's holders are taking over now: one per process, shared by its
/// Service VIP holders ([`super::HolderConfig::takeovers`]) and read by whoever should give
/// way to them. Default: nobody marks it (never busy).
#[derive(Debug)]
pub struct Takeovers {
    vips: watch::Sender<usize>,
}

impl Default for Takeovers {
    fn default() -> Self {
        Takeovers {
            vips: watch::Sender::new(0),
        }
    }
}

impl Takeovers {
    /// VIPs in takeovers in progress now.
    pub fn in_progress(&self) -> usize {
        *self.vips.borrow()
    }

    /// Whether the node takes over [`BUSY_VIPS`] VIPs or more now.
    pub fn busy(&self) -> bool {
        self.in_progress() >= BUSY_VIPS
    }

    /// Waits until the node is not [`busy`](Self::busy), at most `limit`. `true` when it is
    /// not busy (at once when it was not), `false` when the limit ran out first.
    pub async fn wait_not_busy(&self, limit: Duration) -> bool {
        if !self.busy() {
            return true;
        }
        let mut rx = self.vips.subscribe();
        // The sender lives in `self`: the channel cannot close while this waits.
        matches!(
            tokio::time::timeout(limit, rx.wait_for(|n| *n < BUSY_VIPS)).await,
            Ok(Ok(_))
        )
    }

    /// Marks `vips` VIPs as being taken over until the returned mark is dropped.
    pub(crate) fn mark(self: &Arc<Self>, vips: usize) -> TakeoverMark {
        self.vips.send_modify(|n| *n = n.saturating_add(vips));
        TakeoverMark {
            takeovers: self.clone(),
            vips,
        }
    }
}

/// One holder's takeover in progress ([`Takeovers::mark`]); dropping it ends it.
#[derive(Debug)]
pub(crate) struct TakeoverMark {
    takeovers: Arc<Takeovers>,
    vips: usize,
}

impl Drop for TakeoverMark {
    fn drop(&mut self) {
        let vips = self.vips;
        self.takeovers
            .vips
            .send_modify(|n| *n = n.saturating_sub(vips));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn busy_from_a_chunk_of_vips_until_the_marks_are_dropped() {
        let t = Arc::new(Takeovers::default());
        assert!(!t.busy());
        assert!(t.wait_not_busy(Duration::from_secs(1)).await, "at once");
        let small = t.mark(1);
        assert!(!t.busy(), "one per-Service VIP holds nothing back");
        let shard = t.mark(600);
        assert_eq!(t.in_progress(), 601);
        assert!(t.busy());
        // Gives up at the limit while the takeover goes on.
        let started = tokio::time::Instant::now();
        assert!(!t.wait_not_busy(Duration::from_secs(2)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        // Returns when the takeover ends, before the limit.
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move { t.wait_not_busy(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(shard);
        assert!(waiter.await.unwrap());
        assert_eq!(started.elapsed(), Duration::from_millis(2300));
        drop(small);
        assert_eq!(t.in_progress(), 0);
    }
}
