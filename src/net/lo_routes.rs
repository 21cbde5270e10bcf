//! IPv6 VIPs on `lo` as local routes (`svc_ipv6_loopback`, docs/design.md "IPv6 VIPs on lo").
//!
//! The node accepts a VIP's packets when the local table holds a local route to it: an
//! address is not needed for that (the kernel adds such a route for each of its addresses,
//! and `ip -6 route add local 2001:db8::/64 dev lo` is the known "AnyIP" use of it). An IPv6
//! address add walks every IPv6 address of the network namespace under the rtnl lock
//! (`addrconf_verify_rtnl`, called by `inet6_addr_add`), so a holder adding a shard's 600
//! VIPs next to 3 000 others paid about a millisecond each, seconds for a takeover; a local
//! route add is a fib6 insert, 14 µs each with 8 000 addresses present (docs/services-bench.md,
//! "Local routes instead of addresses on lo"). The route carries the fence lifetime as its
//! expiry (`RTA_EXPIRES`): the kernel ignores an expired route at lookup (verified on 6.18:
//! a connection to the VIP is refused once its route's expiry passed, while the collector
//! had not removed it yet), so the route is the same second line an address was.
//!
//! [`LoopbackRoutes`] is the Service holders' [`Kernel`] (one per process, also read by the
//! manager's `vipd_vips_held` count): every request for an IPv6 VIP on `lo`
//! ([`LOOPBACK_IFINDEX`]) goes to a route, every other one to the node's address kernel
//! unchanged. Its listings report each route as a vipd-tagged `/128` on `lo`, so the holder
//! core (the fence, the refresh, the step-down) runs unchanged. The routes it holds are
//! kept in memory and follow the kernel's route deletion notifications
//! ([`LoopbackRoutes::watched`]), so a route someone removes is put back by the holder's
//! next check; they are read from the kernel again after lost notifications, every
//! [`ROUTE_RECHECK`] and for each fresh listing. A route vipd does not know is created
//! exclusively (`NLM_F_EXCL`): someone else's local route to the VIP refuses it
//! ([`RouteError::Foreign`]) and is never replaced or removed.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use netlink_packet_core::NetlinkPayload;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{AsyncSocket, AsyncSocketExt, TokioSocket, protocols::NETLINK_ROUTE};
use tokio::time::Instant;

use super::cache::LIFETIME_MARGIN;
use super::lifetime::Lifetime;
use super::route::{RouteError, TABLE_LOCAL, VipRoute};
use super::route_kernel::LOOPBACK_IFINDEX;
use super::{AddrInfo, Kernel, LinkInfo, NetError, NetlinkKernel, Vip};

/// How long the routes kept in memory are trusted before the kernel's are read again: the
/// address cache's bound on what a missed change may hide ([`super::cache::WATCHED_MAX_AGE`]).
pub const ROUTE_RECHECK: Duration = super::cache::WATCHED_MAX_AGE;

/// The route requests [`LoopbackRoutes`] makes: implemented by [`NetlinkKernel`] with
/// [`VipRoute::loopback`] routes, and by a fake in the tests.
pub trait LocalRoutes: Send + Sync + 'static {
    /// Adds (`replace` false: only where no route of that destination and metric is, else
    /// [`RouteError::Exists`]) or refreshes (`replace`) the local route of `addr` on `lo`
    /// with `lifetime` as its expiry (whole seconds, computed right before the kernel takes
    /// them: [`NetlinkKernel::add_or_refresh_routes`]). Returns the seconds it holds (0:
    /// none).
    ///
    /// # Errors
    /// [`RouteError`] of the request.
    fn add_local(
        &self,
        addr: Ipv6Addr,
        lifetime: Lifetime,
        replace: bool,
    ) -> impl Future<Output = Result<u32, RouteError>> + Send;

    /// [`Self::add_local`] of each `(addr, lifetime, replace)` in order, one result per
    /// item. The default makes one call per item; the netlink kernel sends the batch from
    /// one blocking thread.
    fn add_many_local(
        &self,
        items: &[(Ipv6Addr, Lifetime, bool)],
    ) -> impl Future<Output = Vec<Result<u32, RouteError>>> + Send {
        async move {
            let mut out = Vec::with_capacity(items.len());
            for (addr, lifetime, replace) in items {
                out.push(self.add_local(*addr, *lifetime, *replace).await);
            }
            out
        }
    }

    /// Removes the local route of `addr` (absent: `Ok`).
    ///
    /// # Errors
    /// [`RouteError`] of the request.
    fn remove_local(&self, addr: Ipv6Addr) -> impl Future<Output = Result<(), RouteError>> + Send;

    /// vipd's local routes now, each with the seconds left before it expires (0: expired,
    /// not yet collected).
    ///
    /// # Errors
    /// [`RouteError::Dump`].
    fn local_routes(&self)
    -> impl Future<Output = Result<Vec<(Ipv6Addr, u32)>, RouteError>> + Send;
}

impl LocalRoutes for NetlinkKernel {
    async fn add_local(
        &self,
        addr: Ipv6Addr,
        lifetime: Lifetime,
        replace: bool,
    ) -> Result<u32, RouteError> {
        let mut one = self.add_many_local(&[(addr, lifetime, replace)]).await;
        // One item in, one result out; nothing added otherwise.
        one.pop().unwrap_or(Ok(0))
    }

    async fn add_many_local(
        &self,
        items: &[(Ipv6Addr, Lifetime, bool)],
    ) -> Vec<Result<u32, RouteError>> {
        let routes: Vec<(VipRoute, Lifetime, bool)> = items
            .iter()
            .map(|(a, l, r)| (VipRoute::loopback(*a), *l, *r))
            .collect();
        self.add_or_refresh_routes(LOOPBACK_IFINDEX, &routes).await
    }

    async fn remove_local(&self, addr: Ipv6Addr) -> Result<(), RouteError> {
        self.remove_route(VipRoute::loopback(addr)).await
    }

    async fn local_routes(&self) -> Result<Vec<(Ipv6Addr, u32)>, RouteError> {
        let probe = VipRoute::loopback(Ipv6Addr::UNSPECIFIED);
        Ok(self
            .vip_routes(probe.table, probe.protocol)
            .await?
            .into_iter()
            .filter(|r| r.route.kind == probe.kind)
            .filter_map(|r| match r.route.addr {
                // A route without an expiry is not one vipd made: never counted as held.
                IpAddr::V6(a) => Some((a, r.expires_secs?)),
                IpAddr::V4(_) => None,
            })
            .collect())
    }
}

/// Removes every local route vipd left in the local table (a previous run killed, or
/// `svc_ipv6_loopback` turned off since): run at start before any election and at exit,
/// like [`crate::holder`]'s removal of tagged addresses. Returns the addresses removed.
///
/// # Errors
/// [`RouteError::Dump`] when the routes cannot be listed; single failed removals are
/// logged.
pub async fn remove_stale<R: LocalRoutes>(routes: &R) -> Result<Vec<Ipv6Addr>, RouteError> {
    let mut removed = Vec::new();
    for (addr, _) in routes.local_routes().await? {
        match routes.remove_local(addr).await {
            Ok(()) => removed.push(addr),
            Err(e) => {
                tracing::warn!(vip = %addr, error = %e, "could not remove a stale local route of a VIP on lo")
            }
        }
    }
    Ok(removed)
}

/// A merged listing ([`LoopbackRoutes`]' `all_addresses`) and what it was built on.
struct Merged {
    /// The address kernel's snapshot it was built on.
    base: Arc<Vec<AddrInfo>>,
    /// The routes' generation it was built on.
    generation: u64,
    /// Reused until then: [`MERGED_MAX_AGE`] after it was built
    /// ([`MERGED_MAX_AGE_NEAR_EXPIRY`] while a route it lists is near its end), or the first
    /// expiry of a route it lists if sooner (an expired route is never listed).
    until: Instant,
    /// The listing.
    listing: Arc<Vec<AddrInfo>>,
}

/// The routes held, as kept in memory.
#[derive(Default)]
struct Held {
    /// Each route's expiry (the instant its lifetime ends), in address order (the
    /// listing's order: [`LoopbackRoutes::route_addrs`] needs no sort).
    routes: BTreeMap<Ipv6Addr, Instant>,
    /// When the kernel's routes are next read; `None`: at the next listing.
    next_read: Option<Instant>,
    /// Bumped at each change of `routes`.
    generation: u64,
    /// The last merged listing.
    merged: Option<Merged>,
}

impl Held {
    fn forget(&mut self, addr: Ipv6Addr) {
        self.routes.remove(&addr);
        self.generation += 1;
    }
}

/// How soon the kernel's routes are read again after a read that a change overtook (its
/// listing was not taken): not at every listing while a takeover changes routes.
const REREAD_RETRY: Duration = Duration::from_secs(1);

/// How long a merged listing is reused while neither the addresses nor the routes changed
/// (1 s) and every route it lists has more than [`LIFETIME_MARGIN`] left: its lifetimes are
/// then at most a second high, as the node's cached address listing's ([`super::cache`]),
/// which no holder decision reads so far from their end. A shard's holder checks its
/// hundreds of VIPs against it every 500 ms, each of a node's holders at its own time: with
/// 200 ms nearly every check built the node's thousands of routes into a listing again.
const MERGED_MAX_AGE: Duration = Duration::from_secs(1);

/// How long a merged listing is reused while a route it lists has [`LIFETIME_MARGIN`] or
/// less left (200 ms, the node's address cache's age for such addresses): a holder whose
/// renewals stall refreshes a route once a listing shows
/// [`crate::holder::REFRESH_BELOW_SECS`] left, and a listing a whole second old would show
/// a two-second route's last second too late (found by the new-user trial of session 21).
const MERGED_MAX_AGE_NEAR_EXPIRY: Duration = Duration::from_millis(200);

/// The holder's [`Kernel`] with IPv6 VIPs on `lo` as local routes (module docs): `addrs` is
/// the node's address kernel, `routes` makes the route requests.
pub struct LoopbackRoutes<K: Kernel, R: LocalRoutes> {
    addrs: Arc<K>,
    routes: Arc<R>,
    held: Arc<Mutex<Held>>,
    /// The deletion watch's task ([`LoopbackRoutes::watched`]), stopped on drop.
    watch: Option<tokio::task::JoinHandle<()>>,
}

impl<K: Kernel, R: LocalRoutes> Drop for LoopbackRoutes<K, R> {
    fn drop(&mut self) {
        if let Some(t) = self.watch.take() {
            t.abort();
        }
    }
}

impl<K: Kernel> LoopbackRoutes<K, NetlinkKernel> {
    /// [`LoopbackRoutes::new`] that also follows the namespace's IPv6 route notifications
    /// (`RTNLGRP_IPV6_ROUTE`): a deletion of one of its routes (by hand, by the kernel's
    /// collector) takes it out of memory at once, so the holder's next check puts it back;
    /// lost notifications (`ENOBUFS`) make the next listing read the kernel's routes. When
    /// the socket cannot be opened (logged), routes deleted by others are seen at the
    /// [`ROUTE_RECHECK`] only. Needs a tokio runtime.
    pub fn watched(addrs: Arc<K>, routes: Arc<NetlinkKernel>) -> Self {
        let mut me = Self::new(addrs, routes);
        match deletion_socket() {
            Ok(socket) => {
                me.watch = Some(tokio::spawn(follow_deletions(
                    socket,
                    Arc::downgrade(&me.held),
                )));
            }
            Err(e) => tracing::warn!(
                error = %e,
                recheck_s = ROUTE_RECHECK.as_secs(),
                "cannot follow route deletions: a local route of a VIP on lo deleted by someone else is put back only after the recheck"
            ),
        }
        me
    }
}

impl<K: Kernel, R: LocalRoutes> LoopbackRoutes<K, R> {
    /// Routes through `routes` for IPv6 VIPs on `lo`, everything else through `addrs`
    /// (no deletion watch: [`LoopbackRoutes::watched`]).
    pub fn new(addrs: Arc<K>, routes: Arc<R>) -> Self {
        Self {
            addrs,
            routes,
            held: Arc::new(Mutex::new(Held::default())),
            watch: None,
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The request goes to a route: an IPv6 VIP on `lo`.
    fn routed(ifindex: u32, vip: &Vip) -> Option<Ipv6Addr> {
        match vip.addr {
            IpAddr::V6(a) if ifindex == LOOPBACK_IFINDEX => Some(a),
            _ => None,
        }
    }

    /// Splits requests by where they go, from each one's `(ifindex, vip)`: `(index,
    /// address)` of those that go to a route ([`Self::routed`]), the indexes of the others.
    fn split(places: impl Iterator<Item = (u32, Vip)>) -> (Vec<(usize, Ipv6Addr)>, Vec<usize>) {
        let (mut routed, mut plain) = (Vec::new(), Vec::new());
        for (i, (ifindex, vip)) in places.enumerate() {
            match Self::routed(ifindex, &vip) {
                Some(a) => routed.push((i, a)),
                None => plain.push(i),
            }
        }
        (routed, plain)
    }

    fn record(&self, addr: Ipv6Addr, secs: u32, at: Instant) {
        let mut h = self.held();
        match secs {
            0 => h.routes.remove(&addr),
            s => h
                .routes
                .insert(addr, at + Duration::from_secs(u64::from(s))),
        };
        h.generation += 1;
    }

    fn forget(&self, addr: Ipv6Addr) {
        self.held().forget(addr);
    }

    /// The node's untagged addresses in `present`, by address: what refuses a route.
    fn foreign(present: &[AddrInfo]) -> HashMap<IpAddr, &AddrInfo> {
        present
            .iter()
            .filter(|a| !a.ours)
            .map(|a| (a.vip.addr, a))
            .collect()
    }

    /// [`NetError::NotOurs`] when `foreign` (the node's untagged addresses,
    /// [`Self::foreign`]) holds `addr`, as for an address.
    async fn refused(
        &self,
        addr: Ipv6Addr,
        foreign: &HashMap<IpAddr, &AddrInfo>,
    ) -> Option<NetError> {
        let a = foreign.get(&IpAddr::V6(addr))?;
        let ifname = match self.addrs.link_by_index(a.ifindex).await {
            Ok(l) => l.name,
            Err(_) => a.ifindex.to_string(),
        };
        Some(NetError::NotOurs {
            addr: a.vip.addr,
            ifindex: a.ifindex,
            ifname,
        })
    }

    /// Records the outcome `r` of a route request for `addr` sent after `at`.
    fn took(
        &self,
        addr: Ipv6Addr,
        r: Result<u32, RouteError>,
        at: Instant,
    ) -> Result<u32, NetError> {
        match &r {
            Ok(secs) => self.record(addr, *secs, at),
            Err(_) => self.forget(addr),
        }
        r.map_err(|e| NetError::Route(Box::new(e)))
    }

    /// Adds or refreshes the routes of `items` (`(addr, lifetime)`), one result each in
    /// order: refused ([`Self::refused`]) where `foreign` holds the address; refreshed
    /// (replaced) where memory holds the route; else added only where no route of that
    /// destination is. A route found there is read from the kernel: one of vipd's (memory
    /// had lost it) is refreshed, another's is left alone and the VIP refused
    /// ([`RouteError::Foreign`]): a replace would take over someone else's local route and
    /// a removal then delete it.
    async fn add_routes(
        &self,
        items: &[(Ipv6Addr, Lifetime)],
        foreign: &HashMap<IpAddr, &AddrInfo>,
    ) -> Vec<Result<u32, NetError>> {
        let mut out: Vec<Option<Result<u32, NetError>>> = (0..items.len()).map(|_| None).collect();
        let mut send: Vec<(usize, Ipv6Addr, Lifetime, bool)> = Vec::with_capacity(items.len());
        for (i, (addr, lifetime)) in items.iter().enumerate() {
            match self.refused(*addr, foreign).await {
                Some(e) => out[i] = Some(Err(e)),
                None => send.push((i, *addr, *lifetime, false)),
            }
        }
        {
            let h = self.held();
            for s in &mut send {
                s.3 = h.routes.contains_key(&s.1);
            }
        }
        let exists = self.send(&send, &mut out).await;
        if !exists.is_empty() {
            let ours: std::collections::HashSet<Ipv6Addr> = match self.routes.local_routes().await {
                Ok(listed) => listed.into_iter().map(|(a, _)| a).collect(),
                // Whose route it is cannot be told: the kernel's refusal as it came, and
                // the holder tries again at its next check.
                Err(_) => {
                    for (i, addr, _) in exists {
                        self.forget(addr);
                        out[i] = Some(Err(NetError::Route(Box::new(RouteError::Exists {
                            route: VipRoute::loopback(addr),
                        }))));
                    }
                    return out.into_iter().map(|r| r.unwrap_or(Ok(0))).collect();
                }
            };
            let mut again = Vec::new();
            for (i, addr, lifetime) in exists {
                match ours.contains(&addr) {
                    true => again.push((i, addr, lifetime, true)),
                    false => {
                        self.forget(addr);
                        out[i] = Some(Err(NetError::Route(Box::new(RouteError::Foreign {
                            route: VipRoute::loopback(addr),
                        }))));
                    }
                }
            }
            for (i, addr, _) in self.send(&again, &mut out).await {
                self.forget(addr);
                out[i] = Some(Err(NetError::Route(Box::new(RouteError::Exists {
                    route: VipRoute::loopback(addr),
                }))));
            }
        }
        out.into_iter().map(|r| r.unwrap_or(Ok(0))).collect()
    }

    /// Sends `items` (`(index in out, addr, lifetime, replace)`) as one batch and records
    /// each outcome in memory and `out`; returns those the kernel refused because a route
    /// of that destination exists ([`RouteError::Exists`]), left out of `out`.
    async fn send(
        &self,
        items: &[(usize, Ipv6Addr, Lifetime, bool)],
        out: &mut [Option<Result<u32, NetError>>],
    ) -> Vec<(usize, Ipv6Addr, Lifetime)> {
        if items.is_empty() {
            return Vec::new();
        }
        let batch: Vec<(Ipv6Addr, Lifetime, bool)> =
            items.iter().map(|(_, a, l, r)| (*a, *l, *r)).collect();
        // The expiries are counted from before the requests: never later than the kernel's.
        let at = Instant::now();
        let done = self.routes.add_many_local(&batch).await;
        let mut exists = Vec::new();
        for ((i, addr, lifetime, _), r) in items.iter().zip(done) {
            match r {
                Err(RouteError::Exists { .. }) => exists.push((*i, *addr, *lifetime)),
                r => {
                    if let Some(slot) = out.get_mut(*i) {
                        *slot = Some(self.took(*addr, r, at));
                    }
                }
            }
        }
        exists
    }

    /// Reads the kernel's routes into memory when due (`now`; the first time; [`ROUTE_RECHECK`]
    /// after the last read; [`REREAD_RETRY`] after one a change overtook; after lost
    /// notifications), and only while some are held: with none there is nothing to
    /// confirm (the routes an earlier run left are [`remove_stale`]'s), so a process that
    /// never puts a VIP on `lo` never dumps its routes.
    async fn reread(&self, now: bool) -> Result<(), NetError> {
        let at = Instant::now();
        let generation = {
            let h = self.held();
            let due = !h.routes.is_empty() && (now || h.next_read.is_none_or(|t| at >= t));
            if !due {
                return Ok(());
            }
            h.generation
        };
        let listed = self
            .routes
            .local_routes()
            .await
            .map_err(|e| NetError::Route(Box::new(e)))?;
        let mut h = self.held();
        // A route added or removed during the dump: the listing may miss it; read again a
        // little later.
        if h.generation != generation {
            h.next_read = Some(Instant::now() + REREAD_RETRY);
            return Ok(());
        }
        // The kernel's seconds are rounded down: the expiry vipd counted itself is kept
        // when it lies within that second.
        let routes = listed
            .into_iter()
            .filter_map(|(a, secs)| {
                let low = at + Duration::from_secs(u64::from(secs));
                let end = match h.routes.get(&a) {
                    Some(end) if *end >= low && *end <= low + Duration::from_secs(1) => *end,
                    _ => low,
                };
                (end > at).then_some((a, end))
            })
            .collect();
        h.routes = routes;
        h.next_read = Some(at + ROUTE_RECHECK);
        h.generation += 1;
        Ok(())
    }

    /// The routes held as addresses on `lo` at `now`: vipd's, `/128`, with the whole seconds
    /// left rounded up (as the kernel reports an address's); expired ones left out. In
    /// address order.
    fn route_addrs(h: &Held, now: Instant) -> Vec<AddrInfo> {
        h.routes
            .iter()
            .filter(|(_, end)| **end > now)
            .map(|(a, end)| AddrInfo {
                ifindex: LOOPBACK_IFINDEX,
                vip: Vip::host(IpAddr::V6(*a)),
                ours: true,
                tentative: false,
                dad_failed: false,
                valid_lft_secs: Some(
                    u32::try_from(end.duration_since(now).as_secs_f64().ceil() as u64)
                        .unwrap_or(u32::MAX),
                ),
                preferred_lft_secs: Some(0),
                primary: true,
            })
            .collect()
    }
}

impl<K: Kernel, R: LocalRoutes> Kernel for LoopbackRoutes<K, R> {
    async fn link_by_name(&self, name: &str) -> Result<LinkInfo, NetError> {
        self.addrs.link_by_name(name).await
    }

    async fn link_by_index(&self, index: u32) -> Result<LinkInfo, NetError> {
        self.addrs.link_by_index(index).await
    }

    /// An IPv6 VIP on `lo`: its local route (`skip_dad` means nothing for a route), refused
    /// with [`NetError::NotOurs`] when the node has the address untagged. Otherwise the
    /// address kernel's add.
    async fn add_or_refresh(
        &self,
        ifindex: u32,
        vip: Vip,
        lifetime: Lifetime,
        skip_dad: bool,
    ) -> Result<u32, NetError> {
        match Self::routed(ifindex, &vip) {
            Some(a) => {
                let present = self.addrs.all_addresses().await?;
                let mut one = self
                    .add_routes(&[(a, lifetime)], &Self::foreign(&present))
                    .await;
                one.pop().unwrap_or(Ok(0))
            }
            None => {
                self.addrs
                    .add_or_refresh(ifindex, vip, lifetime, skip_dad)
                    .await
            }
        }
    }

    /// The routed items as one batch of route requests (`add_routes`: those refused by an
    /// address or a route of someone else left out); the others as one batch of the address
    /// kernel. One result per item, in `items` order. `known` (else one read of the address
    /// kernel) tells the refused ones; when that read fails, each routed item reads again
    /// and reports its own error.
    async fn add_or_refresh_many(
        &self,
        items: &[(u32, Vip, Lifetime)],
        skip_dad: bool,
        known: Option<&[AddrInfo]>,
    ) -> Vec<Result<u32, NetError>> {
        let (routed, plain) = Self::split(items.iter().map(|(i, v, _)| (*i, *v)));
        let mut out: Vec<Option<Result<u32, NetError>>> = (0..items.len()).map(|_| None).collect();
        if !plain.is_empty() {
            let batch: Vec<(u32, Vip, Lifetime)> = plain.iter().map(|&i| items[i]).collect();
            let done = self
                .addrs
                .add_or_refresh_many(&batch, skip_dad, known)
                .await;
            for (i, r) in plain.iter().zip(done) {
                out[*i] = Some(r);
            }
        }
        if !routed.is_empty() {
            let read = match known {
                Some(_) => None,
                None => self.addrs.all_addresses().await.ok(),
            };
            match known.or(read.as_deref().map(Vec::as_slice)) {
                Some(present) => {
                    let batch: Vec<(Ipv6Addr, Lifetime)> =
                        routed.iter().map(|&(i, a)| (a, items[i].2)).collect();
                    let done = self.add_routes(&batch, &Self::foreign(present)).await;
                    for ((i, _), r) in routed.iter().zip(done) {
                        out[*i] = Some(r);
                    }
                }
                // The batch's read failed: each item reads again and reports its error.
                None => {
                    for &(i, _) in &routed {
                        let (ifindex, vip, lifetime) = items[i];
                        out[i] = Some(self.add_or_refresh(ifindex, vip, lifetime, skip_dad).await);
                    }
                }
            }
        }
        out.into_iter().flatten().collect()
    }

    async fn remove(&self, ifindex: u32, vip: Vip) -> Result<(), NetError> {
        match Self::routed(ifindex, &vip) {
            Some(a) => {
                let r = self
                    .routes
                    .remove_local(a)
                    .await
                    .map_err(|e| NetError::Route(Box::new(e)));
                if r.is_ok() {
                    self.forget(a);
                }
                r
            }
            None => self.addrs.remove(ifindex, vip).await,
        }
    }

    async fn remove_many(&self, items: &[(u32, Vip)]) -> Vec<Result<(), NetError>> {
        let (routed, plain) = Self::split(items.iter().copied());
        let mut out: Vec<Option<Result<(), NetError>>> = (0..items.len()).map(|_| None).collect();
        if !plain.is_empty() {
            let batch: Vec<(u32, Vip)> = plain.iter().map(|&i| items[i]).collect();
            for (i, r) in plain.iter().zip(self.addrs.remove_many(&batch).await) {
                out[*i] = Some(r);
            }
        }
        for (i, _) in routed {
            out[i] = Some(self.remove(items[i].0, items[i].1).await);
        }
        out.into_iter().flatten().collect()
    }

    async fn addresses(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        let mut out = self.addrs.addresses(ifindex).await?;
        if ifindex.is_none_or(|i| i == LOOPBACK_IFINDEX) {
            self.reread(false).await?;
            out.extend(Self::route_addrs(&self.held(), Instant::now()));
        }
        Ok(out)
    }

    /// The address kernel's listing and the routes; a route read again from the kernel.
    async fn addresses_fresh(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        let mut out = self.addrs.addresses_fresh(ifindex).await?;
        if ifindex.is_none_or(|i| i == LOOPBACK_IFINDEX) {
            self.reread(true).await?;
            out.extend(Self::route_addrs(&self.held(), Instant::now()));
        }
        Ok(out)
    }

    /// The address kernel's shared listing with the routes after it, reused while neither
    /// changed for [`MERGED_MAX_AGE`] ([`MERGED_MAX_AGE_NEAR_EXPIRY`] while a route it lists
    /// has [`LIFETIME_MARGIN`] or less left) and no route it lists expired (a shard's holder
    /// reads thousands at each check).
    async fn all_addresses(&self) -> Result<Arc<Vec<AddrInfo>>, NetError> {
        let base = self.addrs.all_addresses().await?;
        self.reread(false).await?;
        let now = Instant::now();
        let mut h = self.held();
        if let Some(m) = &h.merged
            && Arc::ptr_eq(&m.base, &base)
            && m.generation == h.generation
            && now < m.until
        {
            return Ok(m.listing.clone());
        }
        let first_expiry = h.routes.values().filter(|end| **end > now).min().copied();
        let routes = Self::route_addrs(&h, now);
        let listing = match routes.is_empty() {
            true => base.clone(),
            false => {
                let mut all = Vec::with_capacity(base.len() + routes.len());
                all.extend(base.iter().cloned());
                all.extend(routes);
                Arc::new(all)
            }
        };
        let until = match first_expiry {
            None => now + MERGED_MAX_AGE,
            Some(e) if e.saturating_duration_since(now) <= LIFETIME_MARGIN => {
                e.min(now + MERGED_MAX_AGE_NEAR_EXPIRY)
            }
            Some(e) => e.min(now + MERGED_MAX_AGE),
        };
        h.merged = Some(Merged {
            base,
            generation: h.generation,
            until,
            listing: listing.clone(),
        });
        Ok(listing)
    }

    async fn choose_interface(&self, addr: IpAddr) -> Result<u32, NetError> {
        self.addrs.choose_interface(addr).await
    }
}

/// Receive buffer asked for the deletion watch's socket, bytes: as the address watch's
/// ([`super::addr_watch`]); an overflow costs one read of the kernel's routes.
const WATCH_RX_BUFFER: usize = 1 << 20;

/// A netlink socket of the calling thread's network namespace joined to the IPv6 route
/// group.
fn deletion_socket() -> Result<TokioSocket, NetError> {
    let mut socket = TokioSocket::new(NETLINK_ROUTE).map_err(NetError::Socket)?;
    let s = socket.socket_mut();
    s.bind_auto().map_err(NetError::Socket)?;
    s.add_membership(libc::RTNLGRP_IPV6_ROUTE)
        .map_err(NetError::Socket)?;
    if let Err(e) = s.set_rx_buf_sz(WATCH_RX_BUFFER) {
        tracing::debug!(error = %e, "cannot enlarge the route deletion watch's receive buffer");
    }
    Ok(socket)
}

/// The VIPs whose local route (table local, protocol [`super::route::LOOPBACK_PROTOCOL`],
/// type local, `/128`) one datagram of route notifications says was deleted
/// (`RTM_DELROUTE`). Other messages, other routes and bytes that do not parse are skipped.
/// Pure.
pub(crate) fn deleted_routes(data: &[u8]) -> Vec<Ipv6Addr> {
    let probe = VipRoute::loopback(Ipv6Addr::UNSPECIFIED);
    super::nlmsg::messages::<RouteNetlinkMessage>(data)
        .map_while(Result::ok)
        .filter_map(|m| match m.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelRoute(r)) => {
                super::route::route_info(&r, TABLE_LOCAL, probe.protocol)
            }
            _ => None,
        })
        .filter(|info| info.route.kind == probe.kind)
        .filter_map(|info| match info.route.addr {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        })
        .collect()
}

/// The deletion watch's task: forgets each of vipd's routes a notification says was
/// deleted; after lost notifications, has the next listing read the kernel's routes. Ends
/// when the routes' owner is gone or the socket fails (logged).
async fn follow_deletions(socket: TokioSocket, held: std::sync::Weak<Mutex<Held>>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        let r = socket.recv(&mut buf).await;
        let Some(held) = held.upgrade() else {
            return;
        };
        let mut h = held.lock().unwrap_or_else(PoisonError::into_inner);
        match r {
            Ok(()) => {
                for a in deleted_routes(&buf) {
                    if h.routes.contains_key(&a) {
                        h.forget(a);
                    }
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => h.next_read = None,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    recheck_s = ROUTE_RECHECK.as_secs(),
                    "the route deletion watch stopped: a local route of a VIP on lo deleted by someone else is put back only after the recheck"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
