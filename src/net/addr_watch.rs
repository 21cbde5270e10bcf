//! [`AddrWatch`]: counts the kernel's address change notifications, so a cached address dump
//! ([`super::CachedKernel`]) is reused until the node's addresses change instead of being
//! dumped again every few hundred milliseconds.
//!
//! The kernel multicasts an `RTM_NEWADDR` or `RTM_DELADDR` to the rtnetlink groups
//! `RTNLGRP_IPV4_IFADDR` and `RTNLGRP_IPV6_IFADDR` for every address added, deleted or
//! changed (a lifetime refresh, the end of IPv6 duplicate address detection, an expiry;
//! rtnetlink(7), `rtmsg_ifa` / `ipv6_ifa_notify` in the kernel). The watch does not parse
//! them: any message, and a lost one (the socket reports `ENOBUFS` when its receive buffer
//! overflowed), counts as a change. A cache compares the count before its dump with the
//! count when it is read; after a change, during the dump or later, it reuses that dump for
//! its short `max_age` only. The notification reaches the watch's socket before the kernel
//! acknowledges the request that caused it, but the watch reads it a moment later: a writer
//! that must see its own change invalidates the cache itself, as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use netlink_sys::{AsyncSocket, AsyncSocketExt, TokioSocket, protocols::NETLINK_ROUTE};

use super::NetError;

/// The change count and whether it is still kept, shared between the watch's task and its
/// readers.
#[derive(Debug, Default)]
struct Changes {
    count: AtomicU64,
    stopped: AtomicBool,
}

/// A running watch of the network namespace's address notifications (module docs). Dropping
/// it stops the watch.
#[derive(Debug)]
pub struct AddrWatch {
    changes: Arc<Changes>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Receive buffer asked for the watch's socket, bytes. The kernel caps the request at
/// `net.core.rmem_max` and doubles it for its bookkeeping; a notification takes about 830
/// bytes of it (its ~100 bytes of message in a socket buffer), so 1 MiB (2 MiB granted)
/// holds about 2 500 notifications, and Debian's default `rmem_max` (208 KiB, 416 KiB
/// granted) about 500 (net_kernel's overflow test). An overflow costs nothing but one more
/// dump (it counts as a change).
const WATCH_RX_BUFFER: usize = 1 << 20;

impl AddrWatch {
    /// Opens a netlink socket in the calling thread's network namespace, joins the IPv4 and
    /// IPv6 address groups and counts their messages on a task of the current tokio runtime.
    ///
    /// # Errors
    /// [`NetError::Socket`] when the socket cannot be opened, bound or joined to a group.
    pub fn open() -> Result<Self, NetError> {
        let mut socket = TokioSocket::new(NETLINK_ROUTE).map_err(NetError::Socket)?;
        {
            let s = socket.socket_mut();
            s.bind_auto().map_err(NetError::Socket)?;
            for group in [libc::RTNLGRP_IPV4_IFADDR, libc::RTNLGRP_IPV6_IFADDR] {
                s.add_membership(group).map_err(NetError::Socket)?;
            }
            if let Err(e) = s.set_rx_buf_sz(WATCH_RX_BUFFER) {
                tracing::debug!(error = %e, "cannot enlarge the address watch's receive buffer");
            }
        }
        let changes = Arc::new(Changes::default());
        let task = tokio::spawn(count_changes(socket, changes.clone()));
        Ok(AddrWatch {
            changes,
            task: Some(task),
        })
    }

    /// A watch that no socket feeds: its count moves only with [`AddrWatch::note_change`]
    /// (unit tests of the caches that read it).
    pub fn manual() -> Self {
        AddrWatch {
            changes: Arc::new(Changes::default()),
            task: None,
        }
    }

    /// The number of address changes seen so far, or `None` once the watch has stopped (its
    /// socket failed with anything but `ENOBUFS`): a reader must then fall back to dumps of
    /// a bounded age.
    pub fn changes(&self) -> Option<u64> {
        if self.changes.stopped.load(Ordering::Acquire) {
            return None;
        }
        Some(self.changes.count.load(Ordering::Acquire))
    }

    /// Counts one change, as a notification would.
    pub fn note_change(&self) {
        self.changes.count.fetch_add(1, Ordering::AcqRel);
    }

    /// Marks the watch stopped, as a failed socket would.
    pub fn stop(&self) {
        self.changes.stopped.store(true, Ordering::Release);
    }
}

impl Drop for AddrWatch {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The watch's task: one count per message read, and per overflow; stops (and says so) on
/// any other receive error.
async fn count_changes(socket: TokioSocket, changes: Arc<Changes>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        match socket.recv(&mut buf).await {
            Ok(()) => {
                changes.count.fetch_add(1, Ordering::AcqRel);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                // Notifications were lost: the count moves so no dump older than this
                // moment is reused.
                changes.count.fetch_add(1, Ordering::AcqRel);
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "the address watch stopped: cached address dumps are renewed at their short interval again"
                );
                changes.stopped.store(true, Ordering::Release);
                return;
            }
        }
    }
}
