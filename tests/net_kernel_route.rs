//! Kernel tests of the route fence (`vipd::net::route`, issue 29) against the real kernel.
//!
//! Needs root (`VIPD_SKIP_LAB=1` without it: `SKIPPED`). Like `net_kernel.rs`, every test
//! runs on a fresh thread in a private network namespace (`unshare(CLONE_NEWNET)`),
//! destroyed when the thread ends; the root namespace is never touched. In it:
//! veth `v0`/`v1` up, `198.51.100.1/24` and `2001:db8:1::1/64` on `v0`, and
//! `net.ipv6.route.gc_interval` 1 (the namespace's own sysctl: the IPv6 bound depends on it).
//!
//! Timing asserts are "gone by a generous deadline, and not before the lifetime": the
//! kernel counts the lifetime from when it handled the request, after the instant read
//! before sending it.
//!
//! Run: `cargo test --test net_kernel_route -- --nocapture` (prints the measured lateness).

mod support;

use std::future::Future;
use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use support::netns::{assert_private_netns, enter_private_netns, ip, root_or_skip};
use vipd::net::route::{FenceDevice, RouteDevice, RouteError, RouteKind, VipRoute};
use vipd::net::{Kernel, Lifetime, NetlinkKernel};

/// How late the kernel may remove an expired route and still pass: measured at most 0.9 s
/// (IPv6, `gc_interval` 1) and 0.35 s (IPv4 fence address); generous for a shared machine.
const SLACK: Duration = Duration::from_secs(3);

fn lab<F, Fut>(body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    if !root_or_skip("route kernel tests") {
        return;
    }
    let t = std::thread::spawn(move || {
        enter_private_netns();
        ip("link set lo up");
        ip("link add v0 type veth peer name v1");
        ip("link set v0 up");
        ip("link set v1 up");
        ip("addr add 198.51.100.1/24 dev v0");
        ip("-6 addr add 2001:db8:1::1/64 dev v0 nodad");
        assert_private_netns();
        let ok = Command::new("sysctl")
            .args(["-qw", "net.ipv6.route.gc_interval=1"])
            .status()
            .expect("run sysctl")
            .success();
        assert!(
            ok,
            "sysctl net.ipv6.route.gc_interval=1 in the private namespace"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(body());
    });
    if let Err(panic) = t.join() {
        std::panic::resume_unwind(panic);
    }
}

fn addr(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn present(k: &NetlinkKernel, r: VipRoute) -> bool {
    k.vip_routes(r.table, r.protocol)
        .await
        .unwrap()
        .iter()
        .any(|i| i.route == r)
}

/// Polls until `r` is gone from its table; panics past `deadline`. Returns when it went.
async fn gone_by(k: &NetlinkKernel, r: VipRoute, deadline: Instant) -> Instant {
    loop {
        if !present(k, r).await {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{r} still in its table");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn ipv6_route_expires_in_the_kernel_and_a_refresh_extends_it() {
    lab(|| async {
        let k = NetlinkKernel::new().unwrap();
        let v0 = k.link_by_name("v0").await.unwrap();
        let r = VipRoute::new(addr("2001:db8:5::10"));
        let local = VipRoute {
            kind: RouteKind::Local,
            ..VipRoute::new(addr("2001:db8:5::11"))
        };
        let held = k
            .add_or_refresh_route(r, RouteDevice::Link(v0.index), Lifetime::fixed(3))
            .await
            .unwrap();
        assert_eq!(held, 3);
        k.add_or_refresh_route(local, RouteDevice::Link(v0.index), Lifetime::fixed(3))
            .await
            .unwrap();
        let listed = k.vip_routes(198, 248).await.unwrap();
        let info = listed.iter().find(|i| i.route == r).expect("listed");
        assert_eq!(info.ifindex, Some(v0.index));
        assert!(info.expires_secs.is_some_and(|s| s <= 3), "{info:?}");
        assert!(listed.iter().any(|i| i.route == local), "{listed:?}");

        // A refresh 2 s in extends it: still there past the first lifetime.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let refreshed = Instant::now();
        k.add_or_refresh_route(r, RouteDevice::Link(v0.index), Lifetime::fixed(3))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            present(&k, r).await,
            "refreshed route gone at its first lifetime"
        );

        // Then nothing: the kernel removes it by itself (the fence for a frozen vipd).
        let gone = gone_by(&k, r, refreshed + Duration::from_secs(3) + SLACK).await;
        let after = gone - refreshed;
        assert!(
            after >= Duration::from_secs(3),
            "gone {after:?} after a 3 s refresh"
        );
        println!("IPv6 route gone {after:?} after its 3 s refresh (gc_interval 1)");
    });
}

#[test]
fn ipv4_route_goes_with_its_fence_address_and_a_refresh_extends_it() {
    lab(|| async {
        let k = NetlinkKernel::new().unwrap();
        let fence = FenceDevice::open(&k, "vipdrt0", "127.118.0.1".parse().unwrap())
            .await
            .unwrap();
        let r = VipRoute::new(addr("203.0.113.10"));
        let local = VipRoute {
            kind: RouteKind::Local,
            ..VipRoute::new(addr("203.0.113.11"))
        };
        let start = Instant::now();
        for route in [r, local] {
            let held = k
                .add_or_refresh_route(route, RouteDevice::Fence(&fence), Lifetime::fixed(3))
                .await
                .unwrap();
            assert_eq!(held, 3);
        }
        let listed = k.vip_routes(198, 248).await.unwrap();
        assert!(
            listed
                .iter()
                .any(|i| i.route == r && i.ifindex == Some(fence.ifindex())),
            "{listed:?}"
        );
        assert!(listed.iter().any(|i| i.route == local), "{listed:?}");
        let fence_addr = k
            .addresses(Some(fence.ifindex()))
            .await
            .unwrap()
            .into_iter()
            .find(|a| a.vip.addr == IpAddr::V4(fence.addr()))
            .expect("fence address");
        assert!(fence_addr.ours && fence_addr.valid_lft_secs.is_some_and(|s| s <= 3));

        tokio::time::sleep(Duration::from_secs(2)).await;
        let refreshed = Instant::now();
        k.add_or_refresh_route(r, RouteDevice::Fence(&fence), Lifetime::fixed(3))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            present(&k, r).await,
            "refreshed route gone at its first lifetime"
        );
        assert!(
            present(&k, local).await,
            "the device's routes share its address: refreshed together"
        );
        assert!(refreshed - start < Duration::from_secs(3));

        let gone = gone_by(&k, r, refreshed + Duration::from_secs(3) + SLACK).await;
        let after = gone - refreshed;
        assert!(
            after >= Duration::from_secs(3),
            "gone {after:?} after a 3 s refresh"
        );
        assert!(!present(&k, local).await);
        println!("IPv4 route gone {after:?} after its fence address's 3 s refresh");
    });
}

#[test]
fn removal_listing_and_a_closed_fence_device() {
    lab(|| async {
        let k = NetlinkKernel::new().unwrap();
        let v0 = k.link_by_name("v0").await.unwrap();
        assert!(
            k.vip_routes(198, 248).await.unwrap().is_empty(),
            "no table yet: none"
        );
        let fence = FenceDevice::open(&k, "vipdrt1", "127.118.0.2".parse().unwrap())
            .await
            .unwrap();
        let r4 = VipRoute::new(addr("203.0.113.20"));
        let r6 = VipRoute::new(addr("2001:db8:5::20"));
        let other = VipRoute {
            protocol: 4,
            ..VipRoute::new(addr("203.0.113.21"))
        };
        for (route, dev) in [
            (r4, RouteDevice::Fence(&fence)),
            (r6, RouteDevice::Link(v0.index)),
            (other, RouteDevice::Fence(&fence)),
        ] {
            k.add_or_refresh_route(route, dev, Lifetime::fixed(30))
                .await
                .unwrap();
        }
        let mut ours: Vec<VipRoute> = k
            .vip_routes(198, 248)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.route)
            .collect();
        ours.sort_by_key(|r| r.addr);
        assert_eq!(ours, [r4, r6], "by protocol: not the proto 4 route");
        k.remove_route(r4).await.unwrap();
        k.remove_route(r6).await.unwrap();
        k.remove_route(r6).await.unwrap(); // absent: Ok
        assert!(k.vip_routes(198, 248).await.unwrap().is_empty());
        assert!(present(&k, other).await);

        // A killed vipd closes the TUN device: the device goes, and its routes at once.
        k.add_or_refresh_route(r4, RouteDevice::Fence(&fence), Lifetime::fixed(30))
            .await
            .unwrap();
        let closed = Instant::now();
        drop(fence);
        let gone = gone_by(&k, r4, closed + Duration::from_secs(2)).await;
        assert!(!present(&k, other).await);
        assert!(k.link_by_name("vipdrt1").await.is_err());
        println!(
            "closing the fence device removed its routes within {:?}",
            gone - closed
        );
    });
}

#[test]
fn bad_device_table_lifetime_and_family_are_clear_errors() {
    lab(|| async {
        let k = NetlinkKernel::new().unwrap();
        let v0 = k.link_by_name("v0").await.unwrap();
        let r6 = VipRoute::new(addr("2001:db8:5::30"));
        let e = k
            .add_or_refresh_route(r6, RouteDevice::Link(9999), Lifetime::fixed(3))
            .await
            .unwrap_err();
        assert!(matches!(e, RouteError::NoSuchDevice { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("2001:db8:5::30/128 table 198") && msg.contains("9999"),
            "{msg}"
        );

        let e = k
            .add_or_refresh_route(
                VipRoute { table: 0, ..r6 },
                RouteDevice::Link(v0.index),
                Lifetime::fixed(3),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, RouteError::InvalidTable { .. }), "{e}");
        let e = k
            .add_or_refresh_route(r6, RouteDevice::Link(v0.index), Lifetime::fixed(0))
            .await
            .unwrap_err();
        assert!(matches!(e, RouteError::InvalidLifetime { .. }), "{e}");

        let r4 = VipRoute::new(addr("203.0.113.30"));
        let e = k
            .add_or_refresh_route(r4, RouteDevice::Link(v0.index), Lifetime::fixed(3))
            .await
            .unwrap_err();
        assert!(matches!(e, RouteError::NoIpv4Expiry { .. }), "{e}");
        assert!(e.to_string().contains("203.0.113.30/32"), "{e}");

        let e = FenceDevice::open(&k, "vipdrt2", "192.0.2.1".parse().unwrap())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("127.0.0.0/8"), "{e}");
        let e = FenceDevice::open(&k, "v0", "127.118.0.3".parse().unwrap())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("v0"), "{e}");
        assert!(k.vip_routes(198, 248).await.unwrap().is_empty());
    });
}

/// The holder's kernel seam in routing-table mode (`vipd::net::route_kernel::RouteKernel`):
/// an add through `Kernel::add_or_refresh` puts the VIP's route (IPv4 on its own fence
/// device, IPv6 on the interface asked for), `addresses` lists both as vipd's on that
/// interface with the lifetime left, `remove` takes them (the IPv4 device goes), an
/// un-refreshed IPv4 route goes with its device's address, and `clean` empties the
/// protocol's routes. `shorten_ipv6_route_gc` sets this namespace's collector to 1 s.
#[test]
fn route_kernel_maps_the_holder_seam_to_fenced_routes() {
    use std::sync::Arc;
    use vipd::net::Vip;
    use vipd::net::route_kernel::{RouteKernel, RouteMode, shorten_ipv6_route_gc};
    lab(|| async {
        let k = Arc::new(NetlinkKernel::new().unwrap());
        let v0 = k.link_by_name("v0").await.unwrap();
        let mode = RouteMode {
            table: 198,
            protocol: 248,
            kind: RouteKind::Unicast,
            clean: true,
        };
        let rk = RouteKernel::new(k.clone(), mode);
        let v4 = Vip::host(addr("203.0.113.40"));
        let v6 = Vip::host(addr("2001:db8:6::40"));
        assert_eq!(
            rk.add_or_refresh(v0.index, v4, Lifetime::fixed(3), true)
                .await
                .unwrap(),
            3
        );
        assert_eq!(
            rk.add_or_refresh(v0.index, v6, Lifetime::fixed(3), true)
                .await
                .unwrap(),
            3
        );
        assert!(k.link_by_name("viprcb007128").await.is_ok());
        let listed = rk.addresses(Some(v0.index)).await.unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        for a in &listed {
            assert!(a.ours && a.ifindex == v0.index, "{a:?}");
            assert!(a.valid_lft_secs.is_some_and(|s| s <= 3), "{a:?}");
        }
        // Nothing is bound as an address.
        assert!(
            k.addresses(Some(v0.index))
                .await
                .unwrap()
                .iter()
                .all(|a| a.vip.addr != v4.addr && a.vip.addr != v6.addr)
        );
        rk.remove(v0.index, v4).await.unwrap();
        rk.remove(v0.index, v6).await.unwrap();
        assert!(rk.addresses(None).await.unwrap().is_empty());
        assert!(k.link_by_name("viprcb007128").await.is_err());

        // Not refreshed: the IPv4 route goes with its fence device's address.
        let added = Instant::now();
        rk.add_or_refresh(v0.index, v4, Lifetime::fixed(2), true)
            .await
            .unwrap();
        let r4 = mode.route(v4.addr);
        let gone = gone_by(&k, r4, added + Duration::from_secs(2) + SLACK).await;
        println!(
            "RouteKernel IPv4 route gone {:?} after a 2 s add",
            gone - added
        );
        assert!(gone - added >= Duration::from_secs(1), "{:?}", gone - added);

        // clean: a previous run's route of the protocol goes.
        rk.add_or_refresh(v0.index, v6, Lifetime::fixed(30), true)
            .await
            .unwrap();
        let removed = rk.clean().await.unwrap();
        assert_eq!(removed, vec![mode.route(v6.addr)]);
        assert!(k.vip_routes(198, 248).await.unwrap().is_empty());

        std::fs::write("/proc/sys/net/ipv6/route/gc_interval", "30").unwrap();
        assert_eq!(shorten_ipv6_route_gc().unwrap(), Some((30, 1)));
        assert_eq!(shorten_ipv6_route_gc().unwrap(), Some((1, 1)));
    });
}

/// `ip -6 route show table local proto 118`: vipd's local routes of IPv6 VIPs on `lo`.
fn loopback_routes_listed() -> String {
    assert_private_netns();
    let out = Command::new("ip")
        .args(["-6", "route", "show", "table", "local", "proto", "118"])
        .output()
        .expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether a TCP connection from this namespace to `target` is accepted within 1 s.
fn connects(target: std::net::SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&target, Duration::from_secs(1)).is_ok()
}

/// `svc_ipv6_loopback` (docs/design.md "IPv6 VIPs on lo"): the Services wing's kernel,
/// `LoopbackRoutes`, puts an IPv6 VIP on `lo` as a local route and no address. The node
/// takes the VIP's packets by the route alone (a server on the wildcard address answers);
/// past its expiry the kernel ignores the route although its collector has not removed it
/// yet (`gc_interval` 30 here, the kernel's default); a refresh brings it back, a removal
/// ends it, the stale clean-up removes every one; an untagged address equal to a VIP
/// refuses the route.
#[test]
fn an_ipv6_vip_on_lo_is_a_local_route_that_delivers_until_it_expires() {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use vipd::net::route_kernel::LOOPBACK_IFINDEX;
    use vipd::net::{NetError, Vip, lo_routes};
    lab(|| async {
        let ok = Command::new("sysctl")
            .args(["-qw", "net.ipv6.route.gc_interval=30"])
            .status()
            .expect("run sysctl")
            .success();
        assert!(ok, "sysctl net.ipv6.route.gc_interval=30");
        let k = Arc::new(NetlinkKernel::new().unwrap());
        let lo = lo_routes::LoopbackRoutes::new(k.clone(), k.clone());
        let vip = Vip::host(addr("2001:db8:5::55"));
        let listener = std::net::TcpListener::bind(("::", 0)).unwrap();
        let target = SocketAddr::new(vip.addr, listener.local_addr().unwrap().port());
        assert!(!connects(target), "no route yet, yet delivered");

        let held = lo
            .add_or_refresh(LOOPBACK_IFINDEX, vip, Lifetime::fixed(2), true)
            .await
            .unwrap();
        assert_eq!(held, 2);
        assert!(connects(target), "not delivered by the local route");
        assert!(
            loopback_routes_listed().contains("local 2001:db8:5::55 dev lo"),
            "{}",
            loopback_routes_listed()
        );
        let addresses = k.addresses(None).await.unwrap();
        assert!(
            addresses.iter().all(|a| a.vip.addr != vip.addr),
            "an address was added: {addresses:?}"
        );
        let listed = lo.addresses(Some(LOOPBACK_IFINDEX)).await.unwrap();
        assert!(
            listed
                .iter()
                .any(|a| a.vip == vip && a.ours && a.valid_lft_secs.is_some_and(|s| s <= 2)),
            "listed as vipd's /128 on lo: {listed:?}"
        );

        // Past the 2 s: still in the table, ignored by the kernel, not in place for vipd.
        tokio::time::sleep(Duration::from_millis(3200)).await;
        assert!(
            loopback_routes_listed().contains("2001:db8:5::55"),
            "collected already: the test no longer shows the lookup ignoring it"
        );
        assert!(!connects(target), "an expired local route still delivers");
        let fresh = lo.addresses_fresh(Some(LOOPBACK_IFINDEX)).await.unwrap();
        assert!(
            fresh.iter().all(|a| a.vip != vip),
            "expired yet in place: {fresh:?}"
        );

        // A refresh brings it back; a removal ends it.
        lo.add_or_refresh(LOOPBACK_IFINDEX, vip, Lifetime::fixed(60), true)
            .await
            .unwrap();
        assert!(connects(target), "not delivered after the refresh");
        lo.remove(LOOPBACK_IFINDEX, vip).await.unwrap();
        assert!(!connects(target), "delivered after the removal");
        assert!(!loopback_routes_listed().contains("2001:db8:5::55"));

        // A batch (one request each from one blocking thread), then what a killed vipd left:
        // removed at the next start.
        let batch: Vec<(u32, Vip, Lifetime)> = ["2001:db8:5::56", "2001:db8:5::57"]
            .iter()
            .map(|a| (LOOPBACK_IFINDEX, Vip::host(addr(a)), Lifetime::fixed(60)))
            .collect();
        let held: Vec<u32> = lo
            .add_or_refresh_many(&batch, true, None)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(held, vec![60, 60]);
        assert!(loopback_routes_listed().contains("2001:db8:5::57"));
        let mut removed = lo_routes::remove_stale(k.as_ref()).await.unwrap();
        removed.sort();
        assert_eq!(
            removed,
            vec![
                "2001:db8:5::56".parse::<std::net::Ipv6Addr>().unwrap(),
                "2001:db8:5::57".parse().unwrap()
            ]
        );
        assert_eq!(loopback_routes_listed().trim(), "");

        // Someone else's address equal to a VIP refuses its route.
        ip("-6 addr add 2001:db8:5::66/128 dev v0 nodad");
        let other = Vip::host(addr("2001:db8:5::66"));
        let refused = lo
            .add_or_refresh(LOOPBACK_IFINDEX, other, Lifetime::fixed(60), true)
            .await;
        assert!(
            matches!(refused, Err(NetError::NotOurs { .. })),
            "{refused:?}"
        );
        assert!(!loopback_routes_listed().contains("2001:db8:5::66"));
    });
}

/// The new-user trial's two findings, on the real kernel: someone else's local route to a
/// VIP (another protocol) is neither taken over nor deleted (the VIP is refused); a route
/// of vipd's deleted by hand leaves the watched listing at once (the holder's next check
/// puts it back), not at the 30 s recheck.
#[test]
fn a_foreign_local_route_is_left_alone_and_a_deleted_one_is_seen_at_once() {
    use std::sync::Arc;
    use vipd::net::route_kernel::LOOPBACK_IFINDEX;
    use vipd::net::{NetError, Vip, lo_routes};
    lab(|| async {
        let k = Arc::new(NetlinkKernel::new().unwrap());
        let lo = lo_routes::LoopbackRoutes::watched(k.clone(), k.clone());
        ip("-6 route add local 2001:db8:5::77/128 dev lo table local proto static");
        let theirs = Vip::host(addr("2001:db8:5::77"));
        let refused = lo
            .add_or_refresh(LOOPBACK_IFINDEX, theirs, Lifetime::fixed(60), true)
            .await;
        assert!(
            matches!(&refused, Err(NetError::Route(e)) if matches!(**e, RouteError::Foreign { .. })),
            "{refused:?}"
        );
        lo.remove(LOOPBACK_IFINDEX, theirs).await.unwrap();
        let out = Command::new("ip")
            .args(["-6", "route", "show", "table", "local", "2001:db8:5::77"])
            .output()
            .expect("run ip");
        let listed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            listed.contains("proto static"),
            "their route changed: {listed:?}"
        );
        assert!(!loopback_routes_listed().contains("2001:db8:5::77"));

        let ours = Vip::host(addr("2001:db8:5::78"));
        lo.add_or_refresh(LOOPBACK_IFINDEX, ours, Lifetime::fixed(600), true)
            .await
            .unwrap();
        let in_place = |all: &[vipd::net::AddrInfo]| all.iter().any(|a| a.vip == ours);
        assert!(in_place(&lo.all_addresses().await.unwrap()));
        ip("-6 route del local 2001:db8:5::78 table local proto 118");
        let deleted = Instant::now();
        loop {
            if !in_place(&lo.all_addresses().await.unwrap()) {
                break;
            }
            assert!(
                deleted.elapsed() < Duration::from_secs(5),
                "a route deleted by hand still listed as in place"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "deleted route out of the listing after {:?}",
            deleted.elapsed()
        );
    });
}
