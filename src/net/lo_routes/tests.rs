use super::*;
use std::sync::Mutex;

/// The node's addresses, and each batch of adds and removes the address kernel got.
#[derive(Default)]
struct FakeAddrs {
    present: Mutex<Vec<AddrInfo>>,
    added: Mutex<Vec<Vec<(u32, Vip)>>>,
    removed: Mutex<Vec<Vec<(u32, Vip)>>>,
    snapshot: Mutex<Option<Arc<Vec<AddrInfo>>>>,
}

impl Kernel for FakeAddrs {
    async fn link_by_name(&self, name: &str) -> Result<LinkInfo, NetError> {
        Err(NetError::NoSuchLink { name: name.into() })
    }
    async fn link_by_index(&self, index: u32) -> Result<LinkInfo, NetError> {
        Err(NetError::NoSuchIndex { index })
    }
    async fn add_or_refresh(&self, i: u32, v: Vip, l: Lifetime, _: bool) -> Result<u32, NetError> {
        self.added.lock().unwrap().push(vec![(i, v)]);
        Ok(l.max_secs)
    }
    async fn add_or_refresh_many(
        &self,
        items: &[(u32, Vip, Lifetime)],
        _: bool,
        _: Option<&[AddrInfo]>,
    ) -> Vec<Result<u32, NetError>> {
        self.added
            .lock()
            .unwrap()
            .push(items.iter().map(|(i, v, _)| (*i, *v)).collect());
        items.iter().map(|(_, _, l)| Ok(l.max_secs)).collect()
    }
    async fn remove(&self, i: u32, v: Vip) -> Result<(), NetError> {
        self.removed.lock().unwrap().push(vec![(i, v)]);
        Ok(())
    }
    async fn remove_many(&self, items: &[(u32, Vip)]) -> Vec<Result<(), NetError>> {
        self.removed.lock().unwrap().push(items.to_vec());
        items.iter().map(|_| Ok(())).collect()
    }
    async fn addresses(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        Ok(self
            .present
            .lock()
            .unwrap()
            .iter()
            .filter(|a| ifindex.is_none_or(|i| a.ifindex == i))
            .cloned()
            .collect())
    }
    async fn choose_interface(&self, addr: IpAddr) -> Result<u32, NetError> {
        Err(NetError::NoInterface { addr })
    }
    /// One shared snapshot while the addresses stay the same, as the node's cached kernel
    /// answers (`net::cache`).
    async fn all_addresses(&self) -> Result<Arc<Vec<AddrInfo>>, NetError> {
        let now = self.addresses(None).await?;
        let mut snap = self.snapshot.lock().unwrap();
        match &*snap {
            Some(s) if **s == now => Ok(s.clone()),
            _ => {
                let s = Arc::new(now);
                *snap = Some(s.clone());
                Ok(s)
            }
        }
    }
}

/// The kernel's local routes: each with its expiry, as the kernel would keep them.
#[derive(Default)]
struct FakeRoutes {
    routes: Mutex<HashMap<Ipv6Addr, Instant>>,
    requests: Mutex<usize>,
    dumps: Mutex<usize>,
    /// The next dump fails.
    dump_fails: Mutex<bool>,
    /// Local routes of another protocol (not listed as vipd's).
    foreign: Mutex<std::collections::HashSet<Ipv6Addr>>,
    /// Run once, after the next dump's listing is made (a change racing the dump).
    during_dump: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl LocalRoutes for FakeRoutes {
    async fn add_local(
        &self,
        addr: Ipv6Addr,
        lifetime: Lifetime,
        replace: bool,
    ) -> Result<u32, RouteError> {
        *self.requests.lock().unwrap() += 1;
        let route = VipRoute::loopback(addr);
        let exists = self.routes.lock().unwrap().contains_key(&addr)
            || self.foreign.lock().unwrap().contains(&addr);
        if exists && !replace {
            return Err(RouteError::Exists { route });
        }
        // A replace takes over whatever route of that destination is there.
        self.foreign.lock().unwrap().remove(&addr);
        let secs = lifetime.secs_at(Instant::now());
        if secs > 0 {
            let end = Instant::now() + Duration::from_secs(u64::from(secs));
            self.routes.lock().unwrap().insert(addr, end);
        }
        Ok(secs)
    }
    async fn remove_local(&self, addr: Ipv6Addr) -> Result<(), RouteError> {
        *self.requests.lock().unwrap() += 1;
        self.routes.lock().unwrap().remove(&addr);
        Ok(())
    }
    async fn local_routes(&self) -> Result<Vec<(Ipv6Addr, u32)>, RouteError> {
        *self.dumps.lock().unwrap() += 1;
        if std::mem::take(&mut *self.dump_fails.lock().unwrap()) {
            return Err(RouteError::Dump {
                table: TABLE_LOCAL,
                source: Box::new(rtnetlink::Error::RequestFailed),
            });
        }
        let now = Instant::now();
        let listed = self
            .routes
            .lock()
            .unwrap()
            .iter()
            .map(|(a, end)| (*a, end.saturating_duration_since(now).as_secs() as u32))
            .collect();
        let hook = self.during_dump.lock().unwrap().take();
        if let Some(f) = hook {
            f();
        }
        Ok(listed)
    }
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn host(s: &str) -> Vip {
    Vip::host(s.parse().unwrap())
}

fn kernel() -> (
    Arc<FakeAddrs>,
    Arc<FakeRoutes>,
    LoopbackRoutes<FakeAddrs, FakeRoutes>,
) {
    let (a, r) = (
        Arc::new(FakeAddrs::default()),
        Arc::new(FakeRoutes::default()),
    );
    let k = LoopbackRoutes::new(a.clone(), r.clone());
    (a, r, k)
}

/// Adds or refreshes IPv6 VIP `addr` on `lo` through `k` with a fixed lifetime of `secs`
/// (the holder's call for one VIP).
async fn put(
    k: &LoopbackRoutes<FakeAddrs, FakeRoutes>,
    addr: &str,
    secs: u32,
) -> Result<u32, NetError> {
    k.add_or_refresh(LOOPBACK_IFINDEX, host(addr), Lifetime::fixed(secs), true)
        .await
}

/// The addresses listed as vipd's on `lo`, in the listing's order, as text.
fn lo_addresses(all: &[AddrInfo]) -> Vec<String> {
    on_lo(all).into_iter().map(|(a, _)| a.to_string()).collect()
}

/// The `(ifindex, address, valid_lft)` of every address listed as vipd's on `lo`.
fn on_lo(all: &[AddrInfo]) -> Vec<(IpAddr, Option<u32>)> {
    all.iter()
        .filter(|a| a.ifindex == LOOPBACK_IFINDEX && a.ours)
        .map(|a| (a.vip.addr, a.valid_lft_secs))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn ipv6_vips_on_lo_become_local_routes_and_the_others_stay_addresses() {
    let (addrs, routes, k) = kernel();
    let items = [
        (2, host("192.0.2.10"), Lifetime::fixed(60)),
        (LOOPBACK_IFINDEX, host("2001:db8::a"), Lifetime::fixed(60)),
        (2, host("2001:db8::b"), Lifetime::fixed(60)),
        (LOOPBACK_IFINDEX, host("2001:db8::c"), Lifetime::fixed(30)),
        // IPv4 on lo is an address: only IPv6 has the route expiry the fence needs.
        (LOOPBACK_IFINDEX, host("192.0.2.11"), Lifetime::fixed(60)),
    ];
    let out = k.add_or_refresh_many(&items, true, None).await;
    let held: Vec<u32> = out.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(
        held,
        vec![60, 60, 60, 30, 60],
        "one result per item, in order"
    );
    assert_eq!(
        *addrs.added.lock().unwrap(),
        vec![vec![
            (2, host("192.0.2.10")),
            (2, host("2001:db8::b")),
            (LOOPBACK_IFINDEX, host("192.0.2.11"))
        ]],
        "the address kernel gets the others in one batch"
    );
    let mut kernel_routes: Vec<Ipv6Addr> = routes.routes.lock().unwrap().keys().copied().collect();
    kernel_routes.sort();
    assert_eq!(kernel_routes, vec![v6("2001:db8::a"), v6("2001:db8::c")]);
    assert_eq!(
        on_lo(&k.all_addresses().await.unwrap()),
        vec![
            ("2001:db8::a".parse().unwrap(), Some(60)),
            ("2001:db8::c".parse().unwrap(), Some(30))
        ],
        "the routes are listed as vipd's /128s on lo with their lifetimes"
    );
    tokio::time::advance(Duration::from_millis(10_500)).await;
    assert_eq!(
        on_lo(&k.addresses(Some(LOOPBACK_IFINDEX)).await.unwrap()),
        vec![
            ("2001:db8::a".parse().unwrap(), Some(50)),
            ("2001:db8::c".parse().unwrap(), Some(20))
        ],
        "seconds left, rounded up as the kernel reports an address's"
    );
    assert!(
        k.addresses(Some(2)).await.unwrap().is_empty(),
        "lo's routes are on lo only"
    );
}

#[tokio::test(start_paused = true)]
async fn an_untagged_copy_of_the_address_refuses_its_route() {
    let (addrs, routes, k) = kernel();
    addrs
        .present
        .lock()
        .unwrap()
        .push(AddrInfo::plain(3, host("2001:db8::a"), false));
    let out = k
        .add_or_refresh_many(
            &[
                (LOOPBACK_IFINDEX, host("2001:db8::a"), Lifetime::fixed(60)),
                (LOOPBACK_IFINDEX, host("2001:db8::b"), Lifetime::fixed(60)),
            ],
            true,
            None,
        )
        .await;
    assert!(
        matches!(&out[0], Err(NetError::NotOurs { ifindex: 3, .. })),
        "{:?}",
        out[0]
    );
    assert_eq!(out[1].as_ref().unwrap(), &60);
    assert_eq!(
        *routes.requests.lock().unwrap(),
        1,
        "no request for the refused one"
    );
    let single = put(&k, "2001:db8::a", 60).await;
    assert!(
        matches!(single, Err(NetError::NotOurs { .. })),
        "{single:?}"
    );
    // A tagged copy (vipd's own address, e.g. left on eth0) does not refuse it.
    addrs.present.lock().unwrap()[0].ours = true;
    let again = put(&k, "2001:db8::a", 60).await;
    assert_eq!(again.unwrap(), 60);
}

#[tokio::test(start_paused = true)]
async fn removing_drops_the_route_and_its_listing() {
    let (addrs, routes, k) = kernel();
    k.add_or_refresh_many(
        &[
            (LOOPBACK_IFINDEX, host("2001:db8::a"), Lifetime::fixed(60)),
            (LOOPBACK_IFINDEX, host("2001:db8::b"), Lifetime::fixed(60)),
        ],
        true,
        None,
    )
    .await;
    let out = k
        .remove_many(&[
            (2, host("192.0.2.10")),
            (LOOPBACK_IFINDEX, host("2001:db8::a")),
        ])
        .await;
    assert!(out.iter().all(Result::is_ok));
    assert_eq!(
        *addrs.removed.lock().unwrap(),
        vec![vec![(2, host("192.0.2.10"))]]
    );
    assert_eq!(
        routes
            .routes
            .lock()
            .unwrap()
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        vec![v6("2001:db8::b")]
    );
    assert_eq!(
        on_lo(&k.all_addresses().await.unwrap()),
        vec![("2001:db8::b".parse().unwrap(), Some(60))]
    );
    k.remove(LOOPBACK_IFINDEX, host("2001:db8::b"))
        .await
        .unwrap();
    assert!(on_lo(&k.all_addresses().await.unwrap()).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_route_expires_from_the_listing_with_its_lifetime() {
    let (_, _, k) = kernel();
    put(&k, "2001:db8::a", 2).await.unwrap();
    tokio::time::advance(Duration::from_millis(1_500)).await;
    assert_eq!(
        on_lo(&k.all_addresses().await.unwrap()),
        vec![("2001:db8::a".parse().unwrap(), Some(1))]
    );
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(
        on_lo(&k.all_addresses().await.unwrap()).is_empty(),
        "an expired route is no VIP in place (the kernel ignores it at lookup)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_route_removed_behind_vipds_back_is_seen_at_the_recheck_or_a_fresh_listing() {
    let (_, routes, k) = kernel();
    for a in ["2001:db8::a", "2001:db8::b"] {
        put(&k, a, 600).await.unwrap();
    }
    // The first listing reads the kernel; later ones trust memory until the recheck.
    assert_eq!(on_lo(&k.all_addresses().await.unwrap()).len(), 2);
    let dumps = *routes.dumps.lock().unwrap();
    routes.routes.lock().unwrap().remove(&v6("2001:db8::a"));
    tokio::time::advance(ROUTE_RECHECK - Duration::from_secs(1)).await;
    assert_eq!(
        on_lo(&k.all_addresses().await.unwrap()).len(),
        2,
        "memory until the recheck"
    );
    assert_eq!(
        *routes.dumps.lock().unwrap(),
        dumps,
        "no dump before the recheck"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        on_lo(&k.all_addresses().await.unwrap())
            .into_iter()
            .map(|(a, _)| a)
            .collect::<Vec<_>>(),
        vec!["2001:db8::b".parse::<IpAddr>().unwrap()]
    );
    routes.routes.lock().unwrap().remove(&v6("2001:db8::b"));
    assert!(
        on_lo(&k.addresses_fresh(None).await.unwrap()).is_empty(),
        "a fresh listing reads the kernel at once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dump_that_raced_a_change_is_not_taken() {
    let (_, routes, k) = kernel();
    let k = Arc::new(k);
    put(&k, "2001:db8::a", 600).await.unwrap();
    let weak = Arc::downgrade(&k);
    // vipd records a route while the kernel's listing (made before it) is on its way.
    *routes.during_dump.lock().unwrap() = Some(Box::new(move || {
        if let Some(k) = weak.upgrade() {
            k.record(v6("2001:db8::b"), 600, Instant::now());
        }
    }));
    let listed: Vec<IpAddr> = on_lo(&k.all_addresses().await.unwrap())
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(
        listed,
        vec![
            "2001:db8::a".parse::<IpAddr>().unwrap(),
            "2001:db8::b".parse().unwrap()
        ],
        "the route recorded during the dump stays"
    );
    assert_eq!(*routes.dumps.lock().unwrap(), 1);
    assert_eq!(
        k.held().next_read,
        Some(Instant::now() + REREAD_RETRY),
        "the kernel is read again a little later, not at every listing"
    );
    k.all_addresses().await.unwrap();
    assert_eq!(*routes.dumps.lock().unwrap(), 1, "no dump before the retry");
    tokio::time::advance(REREAD_RETRY).await;
    let listed = on_lo(&k.all_addresses().await.unwrap());
    assert_eq!(*routes.dumps.lock().unwrap(), 2);
    assert_eq!(
        listed,
        vec![("2001:db8::a".parse().unwrap(), Some(599))],
        "not in the kernel: gone"
    );
}

#[tokio::test(start_paused = true)]
async fn without_routes_held_the_kernel_routes_are_never_dumped() {
    let (addrs, routes, k) = kernel();
    addrs
        .present
        .lock()
        .unwrap()
        .push(AddrInfo::plain(2, host("192.0.2.10"), true));
    let base = k.addrs.all_addresses().await.unwrap();
    for _ in 0..3 {
        let all = k.all_addresses().await.unwrap();
        assert_eq!(*all, *base, "the address kernel's listing, nothing added");
        k.addresses_fresh(None).await.unwrap();
        tokio::time::advance(ROUTE_RECHECK).await;
    }
    assert_eq!(*routes.dumps.lock().unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn stale_routes_are_all_removed() {
    let routes = FakeRoutes::default();
    for a in ["2001:db8::a", "2001:db8::b"] {
        routes
            .add_local(v6(a), Lifetime::fixed(60), false)
            .await
            .unwrap();
    }
    let mut removed = remove_stale(&routes).await.unwrap();
    removed.sort();
    assert_eq!(removed, vec![v6("2001:db8::a"), v6("2001:db8::b")]);
    assert!(routes.routes.lock().unwrap().is_empty());
}

/// Someone else's local route to a VIP (another protocol) is never replaced: the VIP is
/// refused there, and the route stays (a replace would make it vipd's and a removal delete
/// it; found by the new-user trial).
#[tokio::test(start_paused = true)]
async fn someone_elses_local_route_refuses_the_vip_and_stays() {
    let (_, routes, k) = kernel();
    routes.foreign.lock().unwrap().insert(v6("2001:db8::a"));
    let out = k
        .add_or_refresh_many(
            &[
                (LOOPBACK_IFINDEX, host("2001:db8::a"), Lifetime::fixed(60)),
                (LOOPBACK_IFINDEX, host("2001:db8::b"), Lifetime::fixed(60)),
            ],
            true,
            None,
        )
        .await;
    assert!(
        matches!(&out[0], Err(NetError::Route(e)) if matches!(**e, RouteError::Foreign { .. })),
        "{:?}",
        out[0]
    );
    assert_eq!(out[1].as_ref().unwrap(), &60);
    assert!(
        routes.foreign.lock().unwrap().contains(&v6("2001:db8::a")),
        "taken over"
    );
    assert!(
        on_lo(&k.all_addresses().await.unwrap())
            .iter()
            .all(|(a, _)| *a != "2001:db8::a".parse::<IpAddr>().unwrap())
    );
    // The single add and a removal leave it too.
    let one = put(&k, "2001:db8::a", 60).await;
    assert!(matches!(one, Err(NetError::Route(_))), "{one:?}");
    assert!(routes.foreign.lock().unwrap().contains(&v6("2001:db8::a")));
}

/// A route of vipd's the kernel has and memory lost (a removal notified late, a process's
/// first add after a restart that could not clean up) is refreshed, not refused.
#[tokio::test(start_paused = true)]
async fn a_route_of_vipds_that_memory_lost_is_refreshed() {
    let (_, routes, k) = kernel();
    routes
        .add_local(v6("2001:db8::a"), Lifetime::fixed(5), false)
        .await
        .unwrap();
    let held = put(&k, "2001:db8::a", 60).await.unwrap();
    assert_eq!(held, 60);
    assert_eq!(
        *routes.dumps.lock().unwrap(),
        1,
        "one read to tell whose route it is"
    );
    // Known now: the next refresh replaces at once, without a read.
    put(&k, "2001:db8::a", 60).await.unwrap();
    assert_eq!(*routes.dumps.lock().unwrap(), 1);
    assert_eq!(
        on_lo(&k.all_addresses().await.unwrap()),
        vec![("2001:db8::a".parse().unwrap(), Some(60))]
    );
}

/// The deletion watch's parser: only `RTM_DELROUTE` of vipd's local routes (table local,
/// protocol 118, type local, /128), however many messages a datagram carries.
#[test]
fn deletions_of_vipds_local_routes_are_read_from_notifications() {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_packet_route::RouteNetlinkMessage;
    let datagram = |msgs: Vec<RouteNetlinkMessage>| {
        let mut out = Vec::new();
        for m in msgs {
            let mut nl =
                NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(m));
            nl.finalize();
            let mut buf = vec![0u8; nl.buffer_len()];
            nl.serialize(&mut buf);
            out.extend(buf);
        }
        out
    };
    let ours = VipRoute::loopback(v6("2001:db8::a"));
    let other_proto = VipRoute {
        protocol: 4,
        ..VipRoute::loopback(v6("2001:db8::b"))
    };
    let unicast = VipRoute {
        kind: crate::net::route::RouteKind::Unicast,
        ..VipRoute::loopback(v6("2001:db8::c"))
    };
    let data = datagram(vec![
        RouteNetlinkMessage::NewRoute(VipRoute::loopback(v6("2001:db8::d")).message()),
        RouteNetlinkMessage::DelRoute(other_proto.message()),
        RouteNetlinkMessage::DelRoute(ours.message()),
        RouteNetlinkMessage::DelRoute(unicast.message()),
        RouteNetlinkMessage::DelRoute(VipRoute::loopback(v6("2001:db8::e")).message()),
    ]);
    assert_eq!(
        deleted_routes(&data),
        vec![v6("2001:db8::a"), v6("2001:db8::e")]
    );
    assert!(deleted_routes(&[]).is_empty());
    assert!(
        deleted_routes(&[1, 2, 3]).is_empty(),
        "bytes that do not parse"
    );
}

/// When the kernel's routes cannot be read to tell whose an existing route is, the VIP is
/// not called someone else's: the refusal stays the kernel's, and the next try decides.
#[tokio::test(start_paused = true)]
async fn an_existing_route_whose_owner_cannot_be_read_is_not_called_foreign() {
    let (_, routes, k) = kernel();
    routes
        .add_local(v6("2001:db8::a"), Lifetime::fixed(5), false)
        .await
        .unwrap();
    *routes.dump_fails.lock().unwrap() = true;
    let r = put(&k, "2001:db8::a", 60).await;
    assert!(
        matches!(&r, Err(NetError::Route(e)) if matches!(**e, RouteError::Exists { .. })),
        "{r:?}"
    );
    let again = put(&k, "2001:db8::a", 60).await;
    assert_eq!(
        again.unwrap(),
        60,
        "the next try reads the kernel and refreshes"
    );
}

/// The merged listing (addresses, then the routes in address order) is built once per
/// second at most while nothing changes and no route is near its end: a node's holders
/// check against it every 500 ms each. A change of the routes or of the addresses, or a
/// route's expiry, builds it again at once: an expired route is never listed.
#[tokio::test(start_paused = true)]
async fn the_merged_listing_is_reused_for_a_second_unless_something_changed_or_expired() {
    let (addrs, _, k) = kernel();
    put(&k, "2001:db8::c", 60).await.unwrap();
    put(&k, "2001:db8::a", 60).await.unwrap();
    put(&k, "2001:db8::b", 30).await.unwrap();
    let first = k.all_addresses().await.unwrap();
    assert_eq!(
        lo_addresses(&first),
        ["2001:db8::a", "2001:db8::b", "2001:db8::c"],
        "routes in address order"
    );
    tokio::time::advance(Duration::from_millis(900)).await;
    let again = k.all_addresses().await.unwrap();
    assert!(Arc::ptr_eq(&first, &again), "reused within the second");
    tokio::time::advance(Duration::from_millis(200)).await;
    let later = k.all_addresses().await.unwrap();
    assert!(!Arc::ptr_eq(&first, &later), "built again after a second");
    assert_eq!(on_lo(&later)[0], ("2001:db8::a".parse().unwrap(), Some(59)));
    put(&k, "2001:db8::d", 60).await.unwrap();
    let changed = k.all_addresses().await.unwrap();
    assert!(!Arc::ptr_eq(&later, &changed), "a route added");
    assert_eq!(on_lo(&changed).len(), 4);
    addrs.present.lock().unwrap().push(AddrInfo {
        ifindex: 2,
        vip: host("192.0.2.10"),
        ours: true,
        tentative: false,
        dad_failed: false,
        valid_lft_secs: Some(60),
        preferred_lft_secs: Some(0),
        primary: true,
    });
    let readdressed = k.all_addresses().await.unwrap();
    assert!(!Arc::ptr_eq(&changed, &readdressed), "an address added");
    assert_eq!(readdressed.len(), 5);
    // 2001:db8::b ends 30 s after its add: 28.9 s from here.
    tokio::time::advance(Duration::from_millis(28_500)).await;
    let before_expiry = k.all_addresses().await.unwrap();
    assert_eq!(on_lo(&before_expiry).len(), 4);
    tokio::time::advance(Duration::from_millis(150)).await;
    assert!(
        Arc::ptr_eq(&before_expiry, &k.all_addresses().await.unwrap()),
        "reused, for less than the near-expiry age"
    );
    tokio::time::advance(Duration::from_millis(300)).await;
    let after_expiry = k.all_addresses().await.unwrap();
    assert_eq!(
        lo_addresses(&after_expiry),
        ["2001:db8::a", "2001:db8::c", "2001:db8::d"],
        "the expired route is gone at its expiry, not at the end of the reuse window"
    );
}

/// A holder whose renewals stall refreshes a route once a listing shows
/// `REFRESH_BELOW_SECS` (1 s) left: with a two-second route (3/2/1 without the second
/// line) and checks 500 ms apart, a listing reused for a whole second showed 2 s until the
/// expiry and the route lapsed (the new-user trial of session 21). Near its end a route is
/// listed from a listing at most 200 ms old.
#[tokio::test(start_paused = true)]
async fn a_route_near_its_end_is_listed_from_a_young_listing() {
    let (_, _, k) = kernel();
    put(&k, "2001:db8::a", 2).await.unwrap();
    tokio::time::advance(Duration::from_millis(950)).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let left = on_lo(&k.all_addresses().await.unwrap())
            .first()
            .and_then(|(_, l)| *l);
        seen.push(left);
        tokio::time::advance(Duration::from_millis(500)).await;
    }
    assert_eq!(
        seen,
        [Some(2), Some(1), Some(1)],
        "at 1 450 ms the check sees its last second (and would refresh)"
    );
}
