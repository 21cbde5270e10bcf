//! The route fence (issue 29, kube-vip's routing-table mode): a VIP announced as a host route
//! (`/32`, `/128`) in a kernel routing table, which the node's BIRD (`protocol kernel {
//! learn; kernel table 198; }`) or FRR (`ip import-table 198`) exports over BGP, and which
//! the kernel itself removes when vipd stops refreshing it: killed, frozen or without its
//! lease, the route goes within a bounded time, counted by the kernel alone, like the
//! address fence (docs/design.md, "The route fence").
//!
//! Mechanisms, as verified on Linux 6.18 (the numbers are in design.md):
//! - **IPv6**: the route carries `RTA_EXPIRES` (`ip -6 route replace ... expires N`) and sits
//!   on the VIP's interface, as kube-vip's. The kernel's fib6 garbage collector deletes it
//!   once expired and sends `RTM_DELROUTE` (BIRD drops it at once). The collector runs every
//!   `net.ipv6.route.gc_interval` seconds (default 30), so the route goes up to that much
//!   after its expiry (measured: 0.08-0.9 s late at `gc_interval` 1, 26 s at 30). A replace
//!   with a new expiry refreshes it; a replace without one makes it permanent, so every
//!   request here carries one.
//! - **IPv4** has no route expiry (the kernel ignores `RTA_EXPIRES`), and a route whose
//!   preferred source is an expiring address is flushed only in the main table
//!   (`fib_sync_down_addr` matches `RT_TABLE_MAIN` or a VRF's table). What works in any table:
//!   the route sits on a [`FenceDevice`], a TUN device vipd opens (not persistent), whose
//!   only IPv4 address carries the lifetime; when the kernel expires the last address of a
//!   device it flushes every route through that device, in every table (`fib_disable_ip`).
//!   Measured: gone 18-350 ms after the address's lifetime (one address; the kernel's
//!   address expiry runs up to a second late with several). That flush sends **no**
//!   `RTM_DELROUTE`: BIRD notices it at its next scan (`scan time`), FRR's zebra, which does
//!   not scan, may not notice it at all. A killed vipd closes the TUN device's descriptor:
//!   the device goes at once, with its routes, and BIRD drops them at once (a link removal
//!   is an event it follows).
//!
//! kube-vip's defaults: table 198 (`vip_routingtableid`), protocol 248
//! (`vip_routingprotocol`), type unicast (`vip_routingtabletype` 1; 2 is local).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use futures::TryStreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::LinkUnspec;

use super::lifetime::Lifetime;
use super::netlink::errno;
use super::{Kernel, NetError, NetlinkKernel, Vip};

/// kube-vip's default routing table (`vip_routingtableid`).
pub const DEFAULT_TABLE: u32 = 198;
/// kube-vip's default route protocol (`vip_routingprotocol`; `ip route ... proto 248`).
pub const DEFAULT_PROTOCOL: u8 = 248;
/// The kernel's "forever" (`INFINITY_LIFE_TIME`), refused as a fence lifetime.
const FOREVER: u32 = u32::MAX;
/// `RT_TABLE_LOCAL`: the kernel's own local routes, and vipd's local routes of IPv6 VIPs
/// on `lo` ([`VipRoute::loopback`]); no other route of vipd goes there.
pub const TABLE_LOCAL: u32 = 255;
/// The route protocol (`rtm_protocol`) of vipd's local routes of IPv6 VIPs on `lo`
/// ([`VipRoute::loopback`]): the number vipd tags its addresses with
/// ([`super::ADDR_PROTO_VIPD`], 118), so `ip -6 route show table local proto 118` lists
/// them. kube-vip has no such routes.
pub const LOOPBACK_PROTOCOL: u8 = super::ADDR_PROTO_VIPD;
/// Clock ticks per second of `RTA_CACHEINFO`'s `rta_expires` (`USER_HZ`).
const USER_HZ: u32 = 100;
/// `TUNSETIFF` (`_IOW('T', 202, int)`).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `IFF_TUN`: a layer-3 device, no Ethernet header.
const IFF_TUN: libc::c_short = 0x0001;
/// `IFF_NO_PI`: no packet information header.
const IFF_NO_PI: libc::c_short = 0x1000;

/// The route type (`vip_routingtabletype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteKind {
    /// `RTN_UNICAST` (kube-vip 1, its default).
    Unicast,
    /// `RTN_LOCAL` (kube-vip 2).
    Local,
}

impl RouteKind {
    /// kube-vip's `vip_routingtabletype` number: 1 unicast, 2 local; `None` otherwise.
    pub fn from_kube_vip(n: u8) -> Option<Self> {
        match n {
            1 => Some(Self::Unicast),
            2 => Some(Self::Local),
            _ => None,
        }
    }

    fn rtn(self) -> RouteType {
        match self {
            Self::Unicast => RouteType::Unicast,
            Self::Local => RouteType::Local,
        }
    }

    fn scope(self) -> RouteScope {
        match self {
            // What `ip route add` gives a route without a gateway.
            Self::Unicast => RouteScope::Link,
            Self::Local => RouteScope::Host,
        }
    }
}

/// A VIP's host route (`/32` or `/128`) in a routing table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VipRoute {
    /// The VIP.
    pub addr: IpAddr,
    /// Routing table id, 1..=254 or above 255 (kube-vip's default [`DEFAULT_TABLE`]).
    pub table: u32,
    /// Route protocol (`rtm_protocol`), by which vipd finds its routes again
    /// ([`DEFAULT_PROTOCOL`]).
    pub protocol: u8,
    /// Unicast or local.
    pub kind: RouteKind,
}

impl VipRoute {
    /// kube-vip's defaults: table 198, protocol 248, unicast.
    pub fn new(addr: IpAddr) -> Self {
        Self {
            addr,
            table: DEFAULT_TABLE,
            protocol: DEFAULT_PROTOCOL,
            kind: RouteKind::Unicast,
        }
    }

    fn prefix(&self) -> u8 {
        Vip::host(self.addr).prefix
    }

    /// The request message: destination, table, protocol, type and scope (no device).
    pub(super) fn message(&self) -> RouteMessage {
        let mut m = RouteMessage::default();
        let h = &mut m.header;
        h.address_family = if self.addr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        h.destination_prefix_length = self.prefix();
        h.protocol = RouteProtocol::from(self.protocol);
        h.kind = self.kind.rtn();
        h.scope = self.kind.scope();
        h.table = u8::try_from(self.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
        m.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(self.addr)));
        m.attributes.push(RouteAttribute::Table(self.table));
        m
    }

    /// The local route of IPv6 VIP `addr` on `lo` (`svc_ipv6_loopback`, docs/design.md
    /// "IPv6 VIPs on lo"): type local, table local (255), protocol [`LOOPBACK_PROTOCOL`].
    pub fn loopback(addr: std::net::Ipv6Addr) -> Self {
        Self {
            addr: IpAddr::V6(addr),
            table: TABLE_LOCAL,
            protocol: LOOPBACK_PROTOCOL,
            kind: RouteKind::Local,
        }
    }

    /// The checks of a request to add or refresh this route with `lifetime` on `device`
    /// ([`RouteDevice::Link`]'s index, or `None` for a fence device): its table
    /// ([`Self::check`]), a lifetime of 1..=4294967294 s ([`RouteError::InvalidLifetime`]),
    /// and no IPv4 route on a link ([`RouteError::NoIpv4Expiry`]: IPv4 has no route expiry).
    fn check_request(&self, lifetime: &Lifetime, link: Option<u32>) -> Result<(), RouteError> {
        self.check()?;
        if lifetime.max_secs == 0 || lifetime.max_secs == FOREVER {
            return Err(RouteError::InvalidLifetime {
                route: *self,
                value: lifetime.max_secs,
            });
        }
        match link {
            Some(ifindex) if self.addr.is_ipv4() => Err(RouteError::NoIpv4Expiry {
                route: *self,
                ifindex,
            }),
            _ => Ok(()),
        }
    }

    /// The request message on output interface `ifindex`.
    fn message_on(&self, ifindex: u32) -> RouteMessage {
        let mut msg = self.message();
        msg.attributes.push(RouteAttribute::Oif(ifindex));
        msg
    }

    /// Table 0 is refused; so is the local table (255) but for [`Self::loopback`]'s routes.
    fn check(&self) -> Result<(), RouteError> {
        let loopback = self.kind == RouteKind::Local && self.protocol == LOOPBACK_PROTOCOL;
        if self.table == 0 || (self.table == TABLE_LOCAL && !loopback) {
            return Err(RouteError::InvalidTable { route: *self });
        }
        Ok(())
    }
}

impl fmt::Display for VipRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            RouteKind::Unicast => "unicast",
            RouteKind::Local => "local",
        };
        write!(
            f,
            "{kind} {}/{} table {} proto {}",
            self.addr,
            self.prefix(),
            self.table,
            self.protocol
        )
    }
}

/// One of vipd's routes as the kernel reports it ([`NetlinkKernel::vip_routes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    /// The route.
    pub route: VipRoute,
    /// Its output interface (`RTA_OIF`), when it has one.
    pub ifindex: Option<u32>,
    /// Seconds until the kernel considers it expired (IPv6 `RTA_CACHEINFO`, rounded down);
    /// `None`: no expiry.
    pub expires_secs: Option<u32>,
}

/// Where a route goes.
#[derive(Debug, Clone, Copy)]
pub enum RouteDevice<'a> {
    /// The VIP's interface, by index (IPv6 only: the route carries its own expiry).
    Link(u32),
    /// A fence device: IPv4 routes must go here; its address is their fence.
    Fence(&'a FenceDevice),
}

/// Errors of the route fence. Every message names the route (VIP, table, protocol) and the
/// device concerned.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// A netlink request failed (the kernel's errno is in `source`).
    #[error("{op} {route} on {device}: {source}")]
    Netlink {
        /// The operation, e.g. `add route`.
        op: &'static str,
        /// The route.
        route: VipRoute,
        /// The device, e.g. `ifindex 3` or `fence device vipdrt0 (index 5)`.
        device: String,
        /// The rtnetlink error.
        #[source]
        source: Box<rtnetlink::Error>,
    },
    /// A route of this destination and metric is in the table already and the request
    /// was not to replace it (`EEXIST`): someone else's, or one of vipd's it did not know.
    #[error("route {route}: a route to this destination with the same metric exists already")]
    Exists {
        /// The route asked for.
        route: VipRoute,
    },
    /// A local route to the VIP exists in the local table that vipd did not add (another
    /// protocol): left untouched, the VIP refused here, as for an address of the node.
    #[error(
        "route {route}: a local route to this address exists and was not added by vipd; refusing to touch it"
    )]
    Foreign {
        /// The route vipd would have added.
        route: VipRoute,
    },
    /// The route's device does not exist (`ENODEV`).
    #[error("route {route}: device {device} does not exist")]
    NoSuchDevice {
        /// The route.
        route: VipRoute,
        /// The device asked for.
        device: String,
    },
    /// Table 0 (unspecified: the kernel would use main) or 255 (the kernel's local routes;
    /// only [`VipRoute::loopback`]'s routes go there).
    #[error("route {route}: table {} is not a table vipd may use (0 = unspecified, 255 = the kernel's local table)", route.table)]
    InvalidTable {
        /// The route.
        route: VipRoute,
    },
    /// A fence lifetime must be 1..=4294967294 seconds.
    #[error("route {route}: lifetime {value} s is invalid (must be 1..=4294967294)")]
    InvalidLifetime {
        /// The route.
        route: VipRoute,
        /// The value given.
        value: u32,
    },
    /// An IPv4 route asked for on a plain interface: IPv4 routes have no expiry, so the
    /// fence needs a [`FenceDevice`].
    #[error(
        "route {route} on ifindex {ifindex}: IPv4 routes have no expiry; an IPv4 VIP route goes on a fence device"
    )]
    NoIpv4Expiry {
        /// The route.
        route: VipRoute,
        /// The interface asked for.
        ifindex: u32,
    },
    /// A fence device could not be made.
    #[error("fence device {name}: {what}: {source}")]
    FenceDevice {
        /// Its name.
        name: String,
        /// Which step failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A fence device's name or address is not usable.
    #[error("fence device {name:?} with address {addr}: {reason}")]
    FenceSpec {
        /// The name asked for.
        name: String,
        /// The address asked for.
        addr: Ipv4Addr,
        /// Why.
        reason: &'static str,
    },
    /// A fence device's link or address request failed.
    #[error("fence device {name}: {source}")]
    FenceKernel {
        /// Its name.
        name: String,
        /// The kernel layer's error (it names the address and interface).
        #[source]
        source: Box<NetError>,
    },
    /// A route dump failed.
    #[error("dump routes of table {table}: {source}")]
    Dump {
        /// The table.
        table: u32,
        /// The rtnetlink error.
        #[source]
        source: Box<rtnetlink::Error>,
    },
}

/// A TUN device that carries vipd's IPv4 VIP routes: opened without `TUNSETPERSIST`, so it
/// exists while this value (its descriptor) does, and brought up; its one IPv4 address, a
/// `/32` in 127.0.0.0/8 (never answered or routed off the node), carries the fence lifetime
/// (`valid_lft`, preferred 0, tagged like vipd's VIPs). When the kernel expires that address
/// it flushes every route through the device; when the process dies the device goes, with
/// its routes. All routes on one device share its lifetime: one device per lease.
#[derive(Debug)]
pub struct FenceDevice {
    _tun: File,
    name: String,
    ifindex: u32,
    addr: Ipv4Addr,
}

impl FenceDevice {
    /// Creates the TUN device `name` (at most 15 bytes) in the caller's network namespace,
    /// sets it up, and remembers `addr` (in 127.0.0.0/8) as its fence address; the address
    /// is added by the first [`NetlinkKernel::add_or_refresh_route`].
    ///
    /// # Errors
    /// [`RouteError::FenceSpec`] for a bad name or an address outside 127.0.0.0/8;
    /// [`RouteError::FenceDevice`] when `/dev/net/tun` cannot be opened or `TUNSETIFF`
    /// fails (e.g. the name is taken by another device, `EBUSY`/`EINVAL`);
    /// [`RouteError::FenceKernel`] when the link cannot be read or set up.
    pub async fn open(
        kernel: &NetlinkKernel,
        name: &str,
        addr: Ipv4Addr,
    ) -> Result<Self, RouteError> {
        let spec = |reason| RouteError::FenceSpec {
            name: name.to_string(),
            addr,
            reason,
        };
        if !super::is_ifname(name) {
            return Err(spec(
                "not an interface name (1-15 bytes, no '/', ':' or space)",
            ));
        }
        if !addr.is_loopback() {
            return Err(spec("the fence address must be in 127.0.0.0/8"));
        }
        let dev_err = |what, source| RouteError::FenceDevice {
            name: name.to_string(),
            what,
            source,
        };
        let tun = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|e| dev_err("open /dev/net/tun", e))?;
        // struct ifreq: the name (IFNAMSIZ bytes), then the flags (short) in the union.
        let mut ifr = [0u8; 40];
        ifr[..name.len()].copy_from_slice(name.as_bytes());
        ifr[16..18].copy_from_slice(&(IFF_TUN | IFF_NO_PI).to_ne_bytes());
        // SAFETY: `tun` is an open descriptor; `ifr` is a valid, writable `struct ifreq`
        // (40 bytes on Linux) for the duration of the call.
        let r = unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF as _, ifr.as_mut_ptr()) };
        if r < 0 {
            return Err(dev_err("TUNSETIFF", std::io::Error::last_os_error()));
        }
        let kernel_err = |source| RouteError::FenceKernel {
            name: name.to_string(),
            source: Box::new(source),
        };
        let link = kernel.link_by_name(name).await.map_err(kernel_err)?;
        kernel
            .handle()
            .link()
            .set(LinkUnspec::new_with_index(link.index).up().build())
            .execute()
            .await
            .map_err(|source| {
                kernel_err(NetError::Netlink {
                    op: "set link up",
                    target: format!("fence device {name} (index {})", link.index),
                    source,
                })
            })?;
        Ok(Self {
            _tun: tun,
            name: name.to_string(),
            ifindex: link.index,
            addr,
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's interface index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The fence address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    fn describe(&self) -> String {
        format!("fence device {} (index {})", self.name, self.ifindex)
    }
}

/// The route a dump message describes, when it is a host route of `table` and `protocol`
/// of a type vipd adds. Pure.
pub(super) fn route_info(msg: &RouteMessage, table: u32, protocol: u8) -> Option<RouteInfo> {
    let h = &msg.header;
    let mut t = u32::from(h.table);
    let mut addr = None;
    let mut ifindex = None;
    let mut expires_secs = None;
    for a in &msg.attributes {
        match a {
            RouteAttribute::Table(x) => t = *x,
            RouteAttribute::Destination(RouteAddress::Inet(v)) => addr = Some(IpAddr::V4(*v)),
            RouteAttribute::Destination(RouteAddress::Inet6(v)) => addr = Some(IpAddr::V6(*v)),
            RouteAttribute::Oif(i) => ifindex = Some(*i),
            // `rta_expires` is signed: an expired route the collector has not removed yet
            // reports a negative time left (0 here).
            RouteAttribute::CacheInfo(c) if c.expires != 0 => {
                let left = i32::from_ne_bytes(c.expires.to_ne_bytes());
                expires_secs = Some(u32::try_from(left).map_or(0, |t| t / USER_HZ));
            }
            _ => {}
        }
    }
    let kind = match h.kind {
        RouteType::Unicast => RouteKind::Unicast,
        RouteType::Local => RouteKind::Local,
        _ => return None,
    };
    let addr = addr?;
    let route = VipRoute {
        addr,
        table: t,
        protocol: u8::from(h.protocol),
        kind,
    };
    (t == table && route.protocol == protocol && h.destination_prefix_length == route.prefix())
        .then_some(RouteInfo {
            route,
            ifindex,
            expires_secs,
        })
}

impl NetlinkKernel {
    /// [`Self::add_or_refresh_route`] of IPv6 routes on interface `ifindex`, `(route,
    /// lifetime, replace)` each (`replace` false: created only where no route of that
    /// destination and metric exists, else [`RouteError::Exists`]), in order, from one
    /// blocking thread (one hop for the batch: a holder
    /// placing a shard's 600 VIPs on `lo` waited for 600 hops of a busy runtime, about 0.8
    /// ms each). One result per item: the same errors, and [`RouteError::NoIpv4Expiry`] for
    /// an IPv4 route.
    pub async fn add_or_refresh_routes(
        &self,
        ifindex: u32,
        items: &[(VipRoute, Lifetime, bool)],
    ) -> Vec<Result<u32, RouteError>> {
        let mut out: Vec<Option<Result<u32, RouteError>>> = Vec::with_capacity(items.len());
        let mut batch = Vec::with_capacity(items.len());
        for (i, (route, lifetime, replace)) in items.iter().enumerate() {
            match route.check_request(lifetime, Some(ifindex)) {
                Ok(()) => {
                    batch.push((i, route.message_on(ifindex), *lifetime, *replace));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let sock = self.addr_socket();
        let done = tokio::task::spawn_blocking(move || {
            batch
                .into_iter()
                .map(|(i, msg, lifetime, replace)| (i, sock.route(&msg, &lifetime, replace)))
                .collect::<Vec<_>>()
        })
        .await;
        let described = format!("ifindex {ifindex}");
        match done {
            Ok(done) => {
                for (i, r) in done {
                    out[i] = Some(r.map_err(|e| match errno(&e) {
                        Some(libc::EEXIST) => RouteError::Exists { route: items[i].0 },
                        _ => self.route_error("add route", items[i].0, &described, e),
                    }));
                }
            }
            Err(_) => {
                for (i, slot) in out.iter_mut().enumerate() {
                    if slot.is_none() {
                        *slot = Some(Err(self.route_error(
                            "add route",
                            items[i].0,
                            &described,
                            rtnetlink::Error::RequestFailed,
                        )));
                    }
                }
            }
        }
        out.into_iter().flatten().collect()
    }

    /// Adds, or refreshes, the fenced route `route` on `device`, valid for `lifetime`
    /// (whole seconds, computed from its end right before the kernel takes them, as for
    /// addresses: [`Lifetime::secs_at`]).
    ///
    /// - IPv6: `ip -6 route replace <vip>/128 dev <device> table T proto P expires S`, sent
    ///   on the blocking socket and checked after the kernel's answer (a freeze in between
    ///   gets the route cut or deleted, [`super::lifetime::add_within`]). Gone S s plus up to
    ///   `net.ipv6.route.gc_interval` later without vipd.
    /// - IPv4 (`device` must be a [`FenceDevice`]): `ip route replace <vip>/32 dev <fence>
    ///   table T proto P` without expiry, then the fence device's address refreshed to S s
    ///   (in that order: a route is never on a device whose address expired before it was
    ///   added). The address's lifetime is the fence of every route on the device.
    ///
    /// Returns the seconds the route holds; 0 when nothing of `lifetime` was left (the
    /// route is then removed, and for IPv4 the fence address is not refreshed).
    ///
    /// # Errors
    /// [`RouteError::InvalidTable`], [`RouteError::InvalidLifetime`] (0 or `u32::MAX`
    /// seconds), [`RouteError::NoIpv4Expiry`] (IPv4 on [`RouteDevice::Link`]),
    /// [`RouteError::NoSuchDevice`], [`RouteError::FenceKernel`] (the fence address: the
    /// route is removed again, best effort), [`RouteError::Netlink`].
    pub async fn add_or_refresh_route(
        &self,
        route: VipRoute,
        device: RouteDevice<'_>,
        lifetime: Lifetime,
    ) -> Result<u32, RouteError> {
        let (ifindex, described, link) = match device {
            RouteDevice::Link(i) => (i, format!("ifindex {i}"), Some(i)),
            RouteDevice::Fence(f) => (f.ifindex, f.describe(), None),
        };
        route.check_request(&lifetime, link)?;
        let msg = route.message_on(ifindex);
        let netlink = |op, source| self.route_error(op, route, &described, source);
        if route.addr.is_ipv6() {
            let sock = self.addr_socket();
            return tokio::task::spawn_blocking(move || sock.route(&msg, &lifetime, true))
                .await
                .map_err(|_| rtnetlink::Error::RequestFailed)
                .and_then(|r| r)
                .map_err(|e| netlink("add route", e));
        }
        let RouteDevice::Fence(fence) = device else {
            return Err(RouteError::NoIpv4Expiry { route, ifindex });
        };
        if lifetime.secs_at(tokio::time::Instant::now()) == 0 {
            self.remove_route(route).await?;
            return Ok(0);
        }
        self.handle()
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(|e| netlink("add route", e))?;
        let held = match self
            .add_or_refresh(
                fence.ifindex,
                Vip::host(IpAddr::V4(fence.addr)),
                lifetime,
                false,
            )
            .await
        {
            Ok(held) => held,
            Err(source) => {
                // Best effort: without its fence the route must not stay.
                let _ = self.remove_route(route).await;
                return Err(RouteError::FenceKernel {
                    name: fence.name.clone(),
                    source: Box::new(source),
                });
            }
        };
        if held == 0 {
            self.remove_route(route).await?;
        }
        Ok(held)
    }

    /// Removes `route` (its table, protocol, type and destination; whatever its device).
    /// Absent = `Ok`.
    ///
    /// # Errors
    /// [`RouteError::InvalidTable`]; [`RouteError::Netlink`].
    pub async fn remove_route(&self, route: VipRoute) -> Result<(), RouteError> {
        route.check()?;
        match self.handle().route().del(route.message()).execute().await {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(libc::ESRCH | libc::ENOENT)) => Ok(()),
            Err(e) => Err(self.route_error("remove route", route, "any device", e)),
        }
    }

    /// vipd's routes in `table`: host routes (`/32`, `/128`) of protocol `protocol`,
    /// unicast or local, both families (for clean-up at start, kube-vip's
    /// `vip_cleanroutingtable`). A table that does not exist (yet) has none.
    ///
    /// # Errors
    /// [`RouteError::Dump`].
    pub async fn vip_routes(&self, table: u32, protocol: u8) -> Result<Vec<RouteInfo>, RouteError> {
        let _turn = self.dump_turn().await;
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut req = RouteMessage::default();
            req.header.address_family = family;
            let msgs: Vec<RouteMessage> =
                match self.handle().route().get(req).execute().try_collect().await {
                    Ok(m) => m,
                    // IPv6 disabled on the node: no IPv6 routes.
                    Err(e) if errno(&e) == Some(libc::EAFNOSUPPORT) => Vec::new(),
                    Err(source) => {
                        return Err(RouteError::Dump {
                            table,
                            source: Box::new(source),
                        });
                    }
                };
            out.extend(msgs.iter().filter_map(|m| route_info(m, table, protocol)));
        }
        Ok(out)
    }

    fn route_error(
        &self,
        op: &'static str,
        route: VipRoute,
        device: &str,
        source: rtnetlink::Error,
    ) -> RouteError {
        if errno(&source) == Some(libc::ENODEV) {
            return RouteError::NoSuchDevice {
                route,
                device: device.to_string(),
            };
        }
        RouteError::Netlink {
            op,
            route,
            device: device.to_string(),
            source: Box::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::route::RouteCacheInfo;

    #[test]
    fn kube_vip_route_types_and_defaults() {
        assert_eq!(RouteKind::from_kube_vip(1), Some(RouteKind::Unicast));
        assert_eq!(RouteKind::from_kube_vip(2), Some(RouteKind::Local));
        assert_eq!(RouteKind::from_kube_vip(3), None);
        let r = VipRoute::new("203.0.113.10".parse().unwrap());
        assert_eq!(r.to_string(), "unicast 203.0.113.10/32 table 198 proto 248");
        let r6 = VipRoute {
            kind: RouteKind::Local,
            ..VipRoute::new("2001:db8::10".parse().unwrap())
        };
        assert_eq!(r6.to_string(), "local 2001:db8::10/128 table 198 proto 248");
        let bad = VipRoute { table: 0, ..r };
        assert!(matches!(bad.check(), Err(RouteError::InvalidTable { .. })));
        let e = VipRoute { table: 255, ..r }.check().unwrap_err();
        assert!(e.to_string().contains("table 255"), "{e}");
    }

    #[test]
    fn the_request_carries_table_protocol_type_and_a_big_table_in_its_attribute() {
        let r = VipRoute {
            table: 1000,
            kind: RouteKind::Local,
            ..VipRoute::new("2001:db8::10".parse().unwrap())
        };
        let m = r.message();
        assert_eq!(m.header.address_family, AddressFamily::Inet6);
        assert_eq!(m.header.destination_prefix_length, 128);
        assert_eq!(m.header.kind, RouteType::Local);
        assert_eq!(m.header.scope, RouteScope::Host);
        assert_eq!(u8::from(m.header.protocol), 248);
        assert_eq!(m.header.table, RouteHeader::RT_TABLE_UNSPEC);
        assert!(m.attributes.contains(&RouteAttribute::Table(1000)));
    }

    #[test]
    fn dumped_routes_are_ours_by_table_protocol_and_host_prefix() {
        let r = VipRoute::new("2001:db8::10".parse().unwrap());
        let mut m = r.message();
        m.attributes.push(RouteAttribute::Oif(3));
        // struct rta_cacheinfo: eight u32; rta_expires is the third, in USER_HZ ticks.
        let mut raw = [0u8; 32];
        raw[8..12].copy_from_slice(&499u32.to_ne_bytes()); // 4.99 s
        let ci = RouteCacheInfo::parse(&raw).unwrap();
        m.attributes.push(RouteAttribute::CacheInfo(ci));
        assert_eq!(
            route_info(&m, 198, 248),
            Some(RouteInfo {
                route: r,
                ifindex: Some(3),
                expires_secs: Some(4)
            })
        );
        assert_eq!(route_info(&m, 199, 248), None, "another table");
        assert_eq!(route_info(&m, 198, 4), None, "another protocol");
        let mut net = m.clone();
        net.header.destination_prefix_length = 64;
        assert_eq!(route_info(&net, 198, 248), None, "not a host route");
        let mut bh = m.clone();
        bh.header.kind = RouteType::BlackHole;
        assert_eq!(route_info(&bh, 198, 248), None, "not a type vipd adds");
    }

    /// `rta_expires` is signed: a route past its expiry that the collector has not removed
    /// yet reports a negative time left, which is none left (not 42 million seconds).
    #[test]
    fn an_expired_route_not_yet_collected_has_no_time_left() {
        let r = VipRoute::loopback("2001:db8::10".parse().unwrap());
        let mut m = r.message();
        let mut raw = [0u8; 32];
        raw[8..12].copy_from_slice(&(-150i32).to_ne_bytes()); // expired 1.5 s ago
        m.attributes.push(RouteAttribute::CacheInfo(
            RouteCacheInfo::parse(&raw).unwrap(),
        ));
        let listed = route_info(&m, TABLE_LOCAL, LOOPBACK_PROTOCOL).unwrap();
        assert_eq!(listed.expires_secs, Some(0));
        assert_eq!(listed.route, r);
    }

    /// The local table takes vipd's loopback routes and nothing else of vipd's.
    #[test]
    fn only_the_loopback_routes_may_go_to_the_local_table() {
        let a = "2001:db8::10".parse().unwrap();
        assert!(VipRoute::loopback(a).check().is_ok());
        assert_eq!(
            VipRoute::loopback(a).to_string(),
            "local 2001:db8::10/128 table 255 proto 118"
        );
        for other in [
            VipRoute {
                table: TABLE_LOCAL,
                ..VipRoute::new(IpAddr::V6(a))
            },
            VipRoute {
                kind: RouteKind::Unicast,
                ..VipRoute::loopback(a)
            },
            VipRoute {
                protocol: DEFAULT_PROTOCOL,
                ..VipRoute::loopback(a)
            },
            VipRoute {
                table: 0,
                ..VipRoute::loopback(a)
            },
        ] {
            assert!(
                matches!(other.check(), Err(RouteError::InvalidTable { .. })),
                "{other} must be refused"
            );
        }
    }
}
