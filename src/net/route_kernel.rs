//! Routing-table mode (issue 29, kube-vip's `vip_routingtable`) behind the VIP holder's
//! [`Kernel`] seam: [`RouteKernel`] maps the holder's "add or refresh this VIP with this
//! lifetime", "remove it" and "list what is there" to fenced host routes
//! ([`NetlinkKernel::add_or_refresh_route`], [`NetlinkKernel::remove_route`],
//! [`NetlinkKernel::vip_routes`]), so the holder core (lease, fence lifetime, periodic
//! check, step-down) runs unchanged and binds no address (docs/design.md, "The route
//! fence").
//!
//! - IPv6: the route sits on the VIP's interface (kube-vip's place) and carries the
//!   lifetime as its expiry (`RTA_EXPIRES`).
//! - IPv4: each VIP gets its own [`FenceDevice`] (a TUN device named `vipr<8 hex digits of
//!   the VIP>` whose only address, in 127.119.0.0/16, carries the lifetime); the route is on
//!   it. One device per VIP rather than per lease: removing a VIP closes its device, which
//!   takes the route with it at once, and a lease's VIPs share the lifetime anyway.
//!   Closing vipd (killed or exited) closes every device: the routes go at once.
//!
//! [`NoAnnouncer`] is the holder's announcer in this mode: a route is not announced on the
//! segment (no gratuitous ARP, no unsolicited neighbour advertisement).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use tracing::{info, warn};

use super::lifetime::Lifetime;
use super::route::{FenceDevice, RouteDevice, RouteError, RouteKind, VipRoute};
use super::{AddrInfo, Announcer, Kernel, LinkInfo, NetError, NetlinkKernel, Vip};

/// The routing-table mode's settings (`vip_routingtable` on): where vipd's VIP routes go
/// and how they are found again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteMode {
    /// `vip_routingtableid`: the kernel routing table (default 198; never 0, 254 or 255).
    pub table: u32,
    /// `vip_routingprotocol`: the routes' `rtm_protocol` (default 248).
    pub protocol: u8,
    /// `vip_routingtabletype`: unicast (kube-vip 0 or 1, the default) or local (2).
    pub kind: RouteKind,
    /// `vip_cleanroutingtable`: remove every route of `protocol` left in `table` at start.
    pub clean: bool,
}

impl RouteMode {
    /// The route of VIP `addr` in this mode.
    pub fn route(&self, addr: IpAddr) -> VipRoute {
        VipRoute {
            addr,
            table: self.table,
            protocol: self.protocol,
            kind: self.kind,
        }
    }
}

/// The first two octets of the fence devices' addresses (127.119.0.0/16).
const FENCE_NET: [u8; 2] = [127, 119];

/// The fence device name of IPv4 VIP `v`: `vipr` and its 8 hex digits (12 bytes, under the
/// 15-byte interface name limit).
fn device_name(v: Ipv4Addr) -> String {
    format!("vipr{:08x}", u32::from(v))
}

/// The holder's [`Kernel`] in routing-table mode (see the module docs). Interface lookups
/// go to the node's kernel unchanged.
pub struct RouteKernel {
    inner: Arc<NetlinkKernel>,
    mode: RouteMode,
    /// The fence device of each IPv4 VIP routed now.
    devices: tokio::sync::Mutex<HashMap<Ipv4Addr, FenceDevice>>,
    /// The interface the holder asked each VIP on (reported back by `addresses`).
    placed: std::sync::Mutex<HashMap<IpAddr, u32>>,
}

impl RouteKernel {
    /// The adapter over `inner` for `mode`.
    pub fn new(inner: Arc<NetlinkKernel>, mode: RouteMode) -> Self {
        Self {
            inner,
            mode,
            devices: tokio::sync::Mutex::new(HashMap::new()),
            placed: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The mode's settings.
    pub fn mode(&self) -> RouteMode {
        self.mode
    }

    fn place(&self, addr: IpAddr, ifindex: Option<u32>) {
        if let Ok(mut p) = self.placed.lock() {
            match ifindex {
                Some(i) => {
                    p.insert(addr, i);
                }
                None => {
                    p.remove(&addr);
                }
            }
        }
    }

    fn placed(&self, addr: IpAddr) -> Option<u32> {
        self.placed.lock().ok().and_then(|p| p.get(&addr).copied())
    }

    /// A free fence address in 127.119.0.0/16 (not .0.0, not one in use).
    fn free_fence_addr(devices: &HashMap<Ipv4Addr, FenceDevice>) -> Option<Ipv4Addr> {
        (1..=u16::MAX)
            .map(|n| {
                let [hi, lo] = n.to_be_bytes();
                Ipv4Addr::new(FENCE_NET[0], FENCE_NET[1], hi, lo)
            })
            .find(|a| devices.values().all(|d| d.addr() != *a))
    }

    async fn add_v4(&self, v: Ipv4Addr, lifetime: Lifetime) -> Result<u32, RouteError> {
        let route = self.mode.route(IpAddr::V4(v));
        let mut devices = self.devices.lock().await;
        if !devices.contains_key(&v) {
            let name = device_name(v);
            let addr = Self::free_fence_addr(&devices).ok_or(RouteError::FenceSpec {
                name: name.clone(),
                addr: Ipv4Addr::new(FENCE_NET[0], FENCE_NET[1], 0, 0),
                reason: "no free fence address left in 127.119.0.0/16",
            })?;
            let dev = FenceDevice::open(&self.inner, &name, addr).await?;
            devices.insert(v, dev);
        }
        let Some(dev) = devices.get(&v) else {
            return Ok(0);
        };
        let held = self
            .inner
            .add_or_refresh_route(route, RouteDevice::Fence(dev), lifetime)
            .await;
        if !matches!(held, Ok(n) if n > 0) {
            // Nothing held: the device goes (closing it flushes anything left on it).
            devices.remove(&v);
        }
        held
    }

    /// Start-up of routing-table mode, once per process and before any election:
    /// `vip_cleanroutingtable` removes the routes of the protocol left in the table, and the
    /// IPv6 route collector is made to run every [`WANTED_IPV6_GC_INTERVAL`] s in this
    /// network namespace (an expired IPv6 route otherwise stays up to 30 s past its
    /// lifetime). Failures are logged.
    pub async fn prepare(&self) {
        let mode = self.mode;
        info!(
            table = mode.table,
            protocol = mode.protocol,
            kind = ?mode.kind,
            "routing-table mode: VIPs are fenced host routes in this table for BIRD or FRR to export; no ARP/NDP"
        );
        if mode.clean {
            match self.clean().await {
                Ok(r) => info!(
                    removed = r.len(),
                    "vip_cleanroutingtable: table {} cleaned of protocol {} routes",
                    mode.table,
                    mode.protocol
                ),
                Err(e) => warn!(error = %e, "vip_cleanroutingtable: cannot read the table"),
            }
        }
        match shorten_ipv6_route_gc() {
            Ok(Some((old, new))) if old != new => info!(
                old_secs = old,
                new_secs = new,
                "routing-table mode: set net.ipv6.route.gc_interval of this network namespace so that an expired IPv6 VIP route goes within its lifetime + {WANTED_IPV6_GC_INTERVAL} s"
            ),
            Ok(Some(_)) => {}
            Ok(None) => info!("routing-table mode: no IPv6 in this network namespace"),
            Err(e) => warn!(
                error = %e,
                "routing-table mode: cannot set net.ipv6.route.gc_interval to {WANTED_IPV6_GC_INTERVAL}: an expired IPv6 VIP route goes up to the current interval (kernel default 30 s) after its lifetime"
            ),
        }
    }

    /// Removes every route of the mode's protocol in its table (`vip_cleanroutingtable`;
    /// run at start, before any election: every such route is a previous run's). Returns
    /// the routes removed.
    ///
    /// # Errors
    /// [`RouteError::Dump`] when the table cannot be read; single failed removals are
    /// logged.
    pub async fn clean(&self) -> Result<Vec<VipRoute>, RouteError> {
        let mut removed = Vec::new();
        for r in self
            .inner
            .vip_routes(self.mode.table, self.mode.protocol)
            .await?
        {
            match self.inner.remove_route(r.route).await {
                Ok(()) => {
                    info!(route = %r.route, "vip_cleanroutingtable: removed a route left by an earlier run");
                    removed.push(r.route);
                }
                Err(e) => {
                    warn!(route = %r.route, error = %e, "vip_cleanroutingtable: could not remove a route")
                }
            }
        }
        Ok(removed)
    }
}

/// How long after its lifetime a VIP route may still be announced, at most: the kernel's
/// expiry work (an IPv4 fence device's address goes in runs up to a second late; the IPv6
/// route collector runs every [`WANTED_IPV6_GC_INTERVAL`] s) plus BIRD's 1 s scan of the
/// table (the routes an expired fence address takes with it send no netlink event).
/// docs/design.md, "The route fence".
pub const ROUTE_WITHDRAW_SLACK: std::time::Duration = std::time::Duration::from_secs(2);

/// The loopback's interface index: the kernel gives it 1 in every network namespace
/// (`LOOPBACK_IFINDEX`, include/net/flow.h).
pub const LOOPBACK_IFINDEX: u32 = 1;

/// The control-plane VIP's [`Kernel`] in routing-table mode: the VIP is routed as by
/// [`RouteKernel`] (the fenced host route BIRD or FRR exports) and also bound as a host
/// address on the loopback with the same lifetime, so that this node accepts the traffic
/// the fabric routes to it (the API server listens on every address). kube-vip binds it on
/// `vip_interface` (`pkg/cluster/service.go`); the loopback keeps it off the segment, where
/// every node binding one address would make them all answer ARP/NDP for it. The route
/// decides who gets traffic: listing reports the routes, and the address follows them
/// (removing the VIP withdraws the route and lets the address run out, see
/// [`RoutedAddressKernel::remove`]).
pub struct RoutedAddressKernel {
    routes: Arc<RouteKernel>,
}

impl RoutedAddressKernel {
    /// The control-plane VIP's kernel over the process's shared `routes`.
    pub fn new(routes: Arc<RouteKernel>) -> Self {
        Self { routes }
    }
}

impl Kernel for RoutedAddressKernel {
    async fn link_by_name(&self, name: &str) -> Result<LinkInfo, NetError> {
        self.routes.link_by_name(name).await
    }

    async fn link_by_index(&self, index: u32) -> Result<LinkInfo, NetError> {
        self.routes.link_by_index(index).await
    }

    /// The route first, then the loopback address with the same lifetime (only when the
    /// route holds some). Returns the route's lifetime held, seconds.
    ///
    /// # Errors
    /// The route's errors ([`RouteKernel`]), then the address's ([`NetlinkKernel`]).
    async fn add_or_refresh(
        &self,
        ifindex: u32,
        vip: Vip,
        lifetime: Lifetime,
        skip_dad: bool,
    ) -> Result<u32, NetError> {
        let held = self
            .routes
            .add_or_refresh(ifindex, vip, lifetime, skip_dad)
            .await?;
        if held > 0 {
            self.routes
                .inner
                .add_or_refresh(LOOPBACK_IFINDEX, Vip::host(vip.addr), lifetime, true)
                .await?;
        }
        Ok(held)
    }

    /// The route only: the loopback address is left to expire with its lifetime (at most
    /// the fence lifetime, 2 s at 3/2/1 and 5/3/1), so that the connections the router
    /// still sends while the withdrawal travels (BGP's update, the router's FIB) are
    /// accepted rather than reset: the hand-over gives the fabric that long to converge. A
    /// restart removes it at once (vipd removes its tagged addresses at start).
    async fn remove(&self, ifindex: u32, vip: Vip) -> Result<(), NetError> {
        self.routes.remove(ifindex, vip).await
    }

    async fn addresses(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        self.routes.addresses(ifindex).await
    }

    async fn choose_interface(&self, addr: IpAddr) -> Result<u32, NetError> {
        self.routes.choose_interface(addr).await
    }
}

fn route_err(e: RouteError) -> NetError {
    NetError::Route(Box::new(e))
}

impl Kernel for RouteKernel {
    async fn link_by_name(&self, name: &str) -> Result<LinkInfo, NetError> {
        self.inner.link_by_name(name).await
    }

    async fn link_by_index(&self, index: u32) -> Result<LinkInfo, NetError> {
        self.inner.link_by_index(index).await
    }

    /// Adds or refreshes the VIP's route with `lifetime` (`skip_dad` means nothing for a
    /// route). Returns the lifetime held, seconds (0: nothing left, nothing held).
    async fn add_or_refresh(
        &self,
        ifindex: u32,
        vip: Vip,
        lifetime: Lifetime,
        _skip_dad: bool,
    ) -> Result<u32, NetError> {
        let held = match vip.addr {
            IpAddr::V4(v) => self.add_v4(v, lifetime).await,
            IpAddr::V6(_) => {
                self.inner
                    .add_or_refresh_route(
                        self.mode.route(vip.addr),
                        RouteDevice::Link(ifindex),
                        lifetime,
                    )
                    .await
            }
        }
        .map_err(route_err)?;
        self.place(vip.addr, (held > 0).then_some(ifindex));
        Ok(held)
    }

    async fn remove(&self, _ifindex: u32, vip: Vip) -> Result<(), NetError> {
        let r = self.inner.remove_route(self.mode.route(vip.addr)).await;
        if let IpAddr::V4(v) = vip.addr {
            // Closing the device takes whatever is left on it.
            self.devices.lock().await.remove(&v);
        }
        self.place(vip.addr, None);
        r.map_err(route_err)
    }

    /// The mode's routes as the holder's addresses: on the interface the holder asked for
    /// (else the route's own), vipd's, with the lifetime left (IPv6: the route's expiry;
    /// IPv4: its fence device's address lifetime).
    async fn addresses(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        let routes = self
            .inner
            .vip_routes(self.mode.table, self.mode.protocol)
            .await
            .map_err(route_err)?;
        let fence_lft: HashMap<u32, Option<u32>> = if routes.iter().any(|r| r.route.addr.is_ipv4())
        {
            self.inner
                .addresses(None)
                .await?
                .into_iter()
                .filter(|a| matches!(a.vip.addr, IpAddr::V4(v) if v.octets()[..2] == FENCE_NET))
                .map(|a| (a.ifindex, a.valid_lft_secs))
                .collect()
        } else {
            HashMap::new()
        };
        let mut out = Vec::with_capacity(routes.len());
        for r in routes {
            let oif = r.ifindex.unwrap_or(0);
            let valid_lft_secs = match r.route.addr {
                IpAddr::V4(_) => fence_lft.get(&oif).copied().flatten(),
                IpAddr::V6(_) => r.expires_secs,
            };
            let at = self.placed(r.route.addr).unwrap_or(oif);
            if ifindex.is_some_and(|i| i != at) {
                continue;
            }
            out.push(AddrInfo {
                ifindex: at,
                vip: Vip::host(r.route.addr),
                ours: true,
                tentative: false,
                dad_failed: false,
                valid_lft_secs,
                preferred_lft_secs: Some(0),
                primary: true,
            });
        }
        Ok(out)
    }

    async fn choose_interface(&self, addr: IpAddr) -> Result<u32, NetError> {
        self.inner.choose_interface(addr).await
    }
}

/// The holder's announcer in routing-table mode: announces nothing (a route is exported by
/// the node's BIRD or FRR, not announced on the segment).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAnnouncer;

impl Announcer for NoAnnouncer {
    fn announce(&self, _link: &LinkInfo, _vip: Vip) -> Result<(), NetError> {
        Ok(())
    }
}

/// `net.ipv6.route.gc_interval` in vipd's network namespace (the sysctl is per namespace).
const IPV6_GC_INTERVAL: &str = "/proc/sys/net/ipv6/route/gc_interval";

/// The IPv6 route garbage collector interval routing-table mode wants, seconds: an expired
/// IPv6 route goes at the collector's next run, so its bound is lifetime + this.
pub const WANTED_IPV6_GC_INTERVAL: u32 = 1;

/// Sets `net.ipv6.route.gc_interval` of this network namespace to
/// [`WANTED_IPV6_GC_INTERVAL`] when it is longer (the kernel's default is 30 s). Returns
/// the value before and after, seconds; `None` when the kernel has no IPv6.
///
/// # Errors
/// The I/O error of reading or writing the sysctl (read-only `/proc/sys` in a container
/// without privileges), or `InvalidData` for a value that is not a number.
pub fn shorten_ipv6_route_gc() -> std::io::Result<Option<(u32, u32)>> {
    let now = match std::fs::read_to_string(IPV6_GC_INTERVAL) {
        Ok(v) => v,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let old: u32 = now.trim().parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{IPV6_GC_INTERVAL} reads {now:?}, not a number"),
        )
    })?;
    if old <= WANTED_IPV6_GC_INTERVAL && old > 0 {
        return Ok(Some((old, old)));
    }
    std::fs::write(IPV6_GC_INTERVAL, WANTED_IPV6_GC_INTERVAL.to_string())?;
    Ok(Some((old, WANTED_IPV6_GC_INTERVAL)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_fit_and_fence_addresses_are_free_loopback() {
        let n = device_name("203.0.113.10".parse().unwrap());
        assert_eq!(n, "viprcb00710a");
        assert!(n.len() <= 15);
        let a = RouteKernel::free_fence_addr(&HashMap::new()).unwrap();
        assert_eq!(a, Ipv4Addr::new(127, 119, 0, 1));
        assert!(a.is_loopback());
    }

    #[test]
    fn the_mode_makes_the_route() {
        let m = RouteMode {
            table: 1000,
            protocol: 99,
            kind: RouteKind::Local,
            clean: false,
        };
        let r = m.route("2001:db8::10".parse().unwrap());
        assert_eq!(r.to_string(), "local 2001:db8::10/128 table 1000 proto 99");
    }
}
