//! The allocator's check before it hands an address out: is another host on the segment
//! already answering for it? (RFC 5227 probes, `crate::net::conflict::probe_for`.)

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use crate::net::Kernel;
use crate::net::conflict::{ConflictMonitor, probe_for};

/// How long the allocator listens for an answer to its probes of one address. A LAN answers
/// within a millisecond; the holder probes again when it binds the address.
pub const PROBE_LISTEN: Duration = Duration::from_millis(300);

/// Finds the addresses another host answers for.
pub trait AddressProbe: Send + Sync + 'static {
    /// Probes every address of `addrs` at once and returns those another host claimed,
    /// with its MAC. An address that cannot be probed (no interface, no capture) counts as
    /// free: the VIP holder's own probe still guards it before it is bound.
    fn answered(&self, addrs: Vec<IpAddr>) -> impl Future<Output = Vec<(IpAddr, [u8; 6])>> + Send;
}

/// [`AddressProbe`] on raw sockets, on `interface` or else the interface whose subnet holds
/// each address (as the VIP holder chooses it).
pub struct RawProbe<K: Kernel> {
    kernel: Arc<K>,
    monitor: Arc<dyn ConflictMonitor>,
    interface: Option<String>,
}

impl<K: Kernel> RawProbe<K> {
    /// Probes through `monitor` on `interface` (`None`: chosen per address).
    pub fn new(
        kernel: Arc<K>,
        monitor: Arc<dyn ConflictMonitor>,
        interface: Option<String>,
    ) -> Self {
        RawProbe {
            kernel,
            monitor,
            interface,
        }
    }

    async fn one(&self, addr: IpAddr) -> Option<(IpAddr, [u8; 6])> {
        let link = match &self.interface {
            Some(name) => self.kernel.link_by_name(name).await.ok()?,
            None => {
                let index = self.kernel.choose_interface(addr).await.ok()?;
                self.kernel.link_by_index(index).await.ok()?
            }
        };
        match probe_for(self.monitor.as_ref(), &link, addr, PROBE_LISTEN).await {
            Ok(macs) => macs.first().map(|mac| (addr, *mac)),
            Err(e) => {
                debug!(%addr, error = %e, "cannot probe the address before handing it out");
                None
            }
        }
    }
}

impl<K: Kernel> AddressProbe for RawProbe<K> {
    async fn answered(&self, addrs: Vec<IpAddr>) -> Vec<(IpAddr, [u8; 6])> {
        futures::future::join_all(addrs.into_iter().map(|a| self.one(a)))
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

impl<K: Kernel> AddressProbe for Option<RawProbe<K>> {
    /// `None` (`vip_arpprobe` off): no probing at all, nothing is ever answered.
    async fn answered(&self, addrs: Vec<IpAddr>) -> Vec<(IpAddr, [u8; 6])> {
        match self {
            Some(probe) => probe.answered(addrs).await,
            None => Vec::new(),
        }
    }
}
