//! Kernel access: netlink addresses and links, ARP/NDP frames, interface choice.
//!
//! This module is the *kernel layer* only: it adds, refreshes and removes addresses, lists
//! links/addresses/routes and sends announcements. The policy (which VIP to hold, when to
//! refresh, when to step down) lives in the VIP holder ([`crate::holder`]), which talks to
//! the kernel only through the two small traits here, [`Kernel`] and [`Announcer`], so it
//! can be driven by a fake in unit tests and by [`NetlinkKernel`] / [`RawAnnouncer`] in lab
//! tests (the same split podman's netavark makes around its netlink layer).
//!
//! Safety rules enforced here (not left to callers):
//! - every address vipd adds is tagged ([`ADDR_PROTO_VIPD`], or the IPv4 label
//!   `<ifname>:vip` on kernels without `IFA_PROTO`);
//! - [`Kernel::remove`] only removes tagged addresses;
//! - [`Kernel::add_or_refresh`] refuses an address the node already has that vipd did not add;
//! - VIPs get `preferred_lft 0` (never chosen as a source address) and a finite `valid_lft`
//!   (the kernel fence: the kernel itself deletes a VIP that is not refreshed in time).

use std::fmt;
use std::future::Future;
use std::net::IpAddr;

mod addr_socket;
mod addr_watch;
mod arp;
pub mod arpflux;
mod cache;
pub mod conflict;
mod iface;
pub mod lifetime;
pub mod lo_routes;
pub mod mac_in_use;
pub mod macvlan;
pub mod nd_responder;
mod netlink;
pub mod nft;
mod nlmsg;
pub mod packet;
pub mod route;
pub mod route_kernel;
pub mod vip;

pub use addr_watch::AddrWatch;
pub use arp::{RawAnnouncer, garp_frame, unsolicited_na_frame};
pub use cache::CachedKernel;
pub use iface::{
    DefaultRoute, IFNAME_MAX, IFNAME_RULE, SubnetEdge, choose_interface_from, in_subnet, is_ifname,
    network_of, subnet_edge, subnet_edge_of, vip_subnet_edge,
};
pub use lifetime::Lifetime;
pub use netlink::{
    NetlinkKernel, RawAddr, TagMode, decode_addr_flags, detect_tag_mode, label_for, tag_for,
};
pub use nft::arp_guard::{
    ArpGuard, ArpGuardError, ArpPins, NftArpGuard, NoopArpGuard, start_arp_guard,
};
pub use vip::VipSubnet;

/// `IFA_PROTO` value (an address "protocol", kernel >= 5.18, `ip address show proto`) that
/// vipd tags its addresses with: `0x76` (ASCII `v`).
///
/// The kernel defines `IFAPROT_UNSPEC` (0), `IFAPROT_KERNEL_LO` (1), `IFAPROT_KERNEL_RA` (2)
/// and `IFAPROT_KERNEL_LL` (3); values above are free for user space (iproute2 names them
/// from `/etc/iproute2/rt_addrprotos`). On kernels that ignore `IFA_PROTO` the fallback tag
/// is the IPv4 address label `<ifname>:vip` (see [`TagMode`]).
pub const ADDR_PROTO_VIPD: u8 = 0x76;

/// Suffix of the IPv4 address label vipd uses as its tag when `IFA_PROTO` is not supported
/// (the label is `<ifname>:vip`, the classic `ifconfig` alias form keepalived also uses).
pub(crate) const LABEL_SUFFIX: &str = ":vip";

/// A VIP with its prefix length (e.g. `192.0.2.10/32`, `2001:db8::10/128`).
///
/// `Display` prints `addr/prefix`. Construct with [`Vip::new`] to get the prefix checked;
/// the kernel calls check it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vip {
    /// The address.
    pub addr: IpAddr,
    /// Prefix length in bits: 0..=32 for IPv4, 0..=128 for IPv6.
    pub prefix: u8,
}

impl Vip {
    /// A checked VIP.
    ///
    /// # Errors
    /// [`NetError::InvalidPrefix`] when `prefix` exceeds 32 (IPv4) or 128 (IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, NetError> {
        let vip = Self { addr, prefix };
        vip.check()?;
        Ok(vip)
    }

    /// A host VIP: `/32` for IPv4, `/128` for IPv6 (the `vip_subnet` default).
    pub fn host(addr: IpAddr) -> Self {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        Self { addr, prefix }
    }

    /// Checks the prefix length against the address family.
    ///
    /// # Errors
    /// [`NetError::InvalidPrefix`] when it is too long for the family.
    pub fn check(&self) -> Result<(), NetError> {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix > max {
            return Err(NetError::InvalidPrefix { vip: *self, max });
        }
        Ok(())
    }
}

impl fmt::Display for Vip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A network interface as the kernel reports it (`RTM_GETLINK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// Interface index (`ifindex`), > 0.
    pub index: u32,
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// Hardware (MAC) address; all zero when the link has none (e.g. `lo`, tun devices).
    pub mac: [u8; 6],
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// Carrier present (`IFLA_CARRIER`, falling back to `IFF_LOWER_UP`).
    pub carrier: bool,
}

/// One address on one interface (`RTM_GETADDR`), decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrInfo {
    /// Index of the interface holding the address.
    pub ifindex: u32,
    /// Address and prefix length.
    pub vip: Vip,
    /// Tagged by vipd: `IFA_PROTO == ADDR_PROTO_VIPD`, or (IPv4) a label ending in `:vip`.
    pub ours: bool,
    /// IPv6 duplicate address detection still running (`IFA_F_TENTATIVE`); such an address
    /// must not be announced yet.
    pub tentative: bool,
    /// IPv6 duplicate address detection failed (`IFA_F_DADFAILED`): another node has it.
    pub dad_failed: bool,
    /// Remaining valid lifetime in seconds (whole seconds, as the kernel reports it);
    /// `None` = forever (`INFINITY_LIFE_TIME`).
    pub valid_lft_secs: Option<u32>,
    /// Remaining preferred lifetime in seconds; `None` = forever. vipd's VIPs have `Some(0)`.
    pub preferred_lft_secs: Option<u32>,
    /// Not `IFA_F_SECONDARY`. Note: for IPv4 the kernel marks an address secondary only if a
    /// primary with the *same prefix length* in the same subnet exists, so a `/32` VIP next to
    /// a `/24` node address is primary; IPv6 never sets the flag (always `true`).
    pub primary: bool,
}

#[cfg(test)]
impl AddrInfo {
    /// A permanent primary address past duplicate address detection on `ifindex`, tagged as
    /// vipd's when `ours` (the shape most test fixtures want).
    pub(crate) fn plain(ifindex: u32, vip: Vip, ours: bool) -> Self {
        AddrInfo {
            ifindex,
            vip,
            ours,
            tentative: false,
            dad_failed: false,
            valid_lft_secs: None,
            preferred_lft_secs: None,
            primary: true,
        }
    }
}

/// Errors of the kernel layer. Every message names the interface and/or address concerned.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A netlink request failed (the kernel's errno is in `source`).
    #[error("netlink {op} for {target} failed: {source}")]
    Netlink {
        /// The operation, e.g. `add address`.
        op: &'static str,
        /// What it was about, e.g. `192.0.2.10/32 on ifindex 2`.
        target: String,
        /// The rtnetlink error.
        #[source]
        source: rtnetlink::Error,
    },
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    /// No interface of that name.
    #[error("interface {name:?} does not exist")]
    NoSuchLink {
        /// The name asked for.
        name: String,
    },
    /// No interface with that index.
    #[error("interface index {index} does not exist")]
    NoSuchIndex {
        /// The index asked for.
        index: u32,
    },
    /// Prefix length too long for the address family.
    #[error("VIP {vip}: prefix length {} exceeds {max}", vip.prefix)]
    InvalidPrefix {
        /// The offending VIP.
        vip: Vip,
        /// The maximum for its family (32 or 128).
        max: u8,
    },
    /// `valid_lft_secs` must be >= 1 and finite (the kernel rejects 0; infinite would
    /// defeat the kernel fence).
    #[error("VIP {vip}: valid_lft_secs = {value} is invalid (must be 1..=4294967294)")]
    InvalidLifetime {
        /// The VIP being added.
        vip: Vip,
        /// The value given.
        value: u32,
    },
    /// The node already has this address and vipd did not add it: refused, never touched.
    #[error(
        "address {addr} on interface {ifname} (index {ifindex}) exists and was not added by vipd; refusing to touch it"
    )]
    NotOurs {
        /// The address.
        addr: IpAddr,
        /// Interface index holding it.
        ifindex: u32,
        /// Interface name (or the index as text when unknown).
        ifname: String,
    },
    /// No interface could be chosen for the VIP (no connected subnet holds it, no default route).
    #[error(
        "no interface for VIP {addr}: no connected subnet holds it and there is no default route"
    )]
    NoInterface {
        /// The VIP address.
        addr: IpAddr,
    },
    /// The kernel cannot tag this address (no `IFA_PROTO`, and labels exist for IPv4 only, or
    /// `<ifname>:vip` would exceed the 15-byte label limit).
    #[error("cannot tag {vip} on {ifname}: {reason}")]
    TagUnsupported {
        /// The VIP.
        vip: Vip,
        /// The interface name.
        ifname: String,
        /// Why.
        reason: &'static str,
    },
    /// The conflict-detection capture (an `AF_PACKET` socket reading ARP / neighbour
    /// discovery frames) could not be set up.
    #[error("address conflict capture: {what}: {source}")]
    Capture {
        /// Which step failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A VIP route could not be added, removed or listed: routing-table mode
    /// ([`route_kernel::RouteKernel`]) or the local route of an IPv6 VIP on `lo`
    /// ([`lo_routes::LoopbackRoutes`]).
    #[error("{0}")]
    Route(#[source] Box<route::RouteError>),
    /// The neighbour discovery responder ([`nd_responder::NdResponder`]) could not start
    /// answering solicitations for an address on an interface: its capture socket could not
    /// be opened, or the solicited-node multicast group could not be joined.
    #[error(
        "answer neighbour solicitations for {addr} on interface index {ifindex}: {what}: {source}"
    )]
    NdAnswer {
        /// Interface index the address is answered on.
        ifindex: u32,
        /// The address (a VIP).
        addr: std::net::Ipv6Addr,
        /// Which step failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A raw (AF_PACKET) socket operation failed while announcing.
    #[error("announce {vip} on {ifname}: {what}: {source}")]
    Announce {
        /// The VIP announced.
        vip: Vip,
        /// The interface.
        ifname: String,
        /// Which step failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The kernel operations the VIP holder needs; implemented by [`NetlinkKernel`] (rtnetlink)
/// and by fakes in unit tests.
pub trait Kernel: Send + Sync + 'static {
    /// The link named `name`.
    ///
    /// # Errors
    /// [`NetError::NoSuchLink`]; [`NetError::Netlink`] on other failures.
    fn link_by_name(&self, name: &str) -> impl Future<Output = Result<LinkInfo, NetError>> + Send;

    /// The link with index `index`.
    ///
    /// # Errors
    /// [`NetError::NoSuchIndex`]; [`NetError::Netlink`] on other failures.
    fn link_by_index(&self, index: u32) -> impl Future<Output = Result<LinkInfo, NetError>> + Send;

    /// Add, or refresh the lifetimes of, a VIP on interface `ifindex`: `preferred_lft 0`
    /// (never a source address), a finite `valid_lft` (the kernel fence) computed from
    /// `lifetime` ([`Lifetime::secs_at`]) immediately before the kernel takes it and checked
    /// once it has ([`lifetime::add_within`]: a process frozen in between gets the address
    /// cut or deleted at once), tagged with [`ADDR_PROTO_VIPD`]; IPv6 with `IFA_F_NODAD`
    /// when `skip_dad`, and an IPv6 `/128` with `IFA_F_NOPREFIXROUTE` (no route beside the
    /// local one: `addr_socket::vip_flags`). Adding an address that exists on `ifindex`
    /// with this prefix and is ours refreshes it (`NLM_F_REPLACE`, like `ip address
    /// replace`).
    ///
    /// Returns the lifetime the address holds, seconds; 0 when nothing of `lifetime` was
    /// left (nothing added; an existing copy keeps its earlier lifetime, the caller removes
    /// it) or the add came too late and was deleted.
    ///
    /// # Errors
    /// [`NetError::NotOurs`] when the node has this address (any interface, any prefix)
    /// untagged; [`NetError::InvalidLifetime`] for a `max_secs` of 0 or `u32::MAX`;
    /// [`NetError::InvalidPrefix`]; [`NetError::TagUnsupported`]; [`NetError::Netlink`].
    fn add_or_refresh(
        &self,
        ifindex: u32,
        vip: Vip,
        lifetime: Lifetime,
        skip_dad: bool,
    ) -> impl Future<Output = Result<u32, NetError>> + Send;

    /// [`Self::add_or_refresh`] of each `(ifindex, vip, lifetime)` in `items`, in order,
    /// with one result per item (the same errors). The default makes one call per item;
    /// the netlink kernel reads each interface once for the whole batch and the node's
    /// addresses at most once (a holder refreshing hundreds of VIPs at each renewal).
    ///
    /// `known`: the node's addresses as the caller last read them ([`Self::all_addresses`]),
    /// taken instead of a read of its own to tell an add from a refresh and to find an
    /// untagged copy; `None`: read them now. A holder adding a shard's hundreds of VIPs in
    /// chunks passes one read for all its chunks (each chunk's VIPs are its own, untouched
    /// by the chunks before). An older `known` is safe for adds: an address added since (the
    /// kernel answers `EEXIST`) is looked up again at once. A batch `known` says refreshes a
    /// VIP (in place, ours) reads the addresses now: a refresh (`NLM_F_CREATE |
    /// NLM_F_REPLACE`) would rewrite an untagged copy added since as vipd's. The default
    /// ignores it.
    fn add_or_refresh_many(
        &self,
        items: &[(u32, Vip, Lifetime)],
        skip_dad: bool,
        known: Option<&[AddrInfo]>,
    ) -> impl Future<Output = Vec<Result<u32, NetError>>> + Send {
        let _ = known;
        async move {
            let mut out = Vec::with_capacity(items.len());
            for (ifindex, vip, lifetime) in items {
                out.push(
                    self.add_or_refresh(*ifindex, *vip, *lifetime, skip_dad)
                        .await,
                );
            }
            out
        }
    }

    /// Remove a VIP from `ifindex` only if it is ours (tagged). Absent = `Ok`.
    ///
    /// IPv4 caveat (kernel behaviour, same for the kernel-fence expiry): deleting a *primary*
    /// address also deletes the secondaries of its subnet unless `promote_secondaries` is set.
    /// A `/32` VIP never has secondaries; a VIP sharing the node's prefix length is normally
    /// added after the node's address and so is itself the secondary.
    ///
    /// # Errors
    /// [`NetError::NotOurs`] for an untagged address (left in place); [`NetError::Netlink`].
    fn remove(&self, ifindex: u32, vip: Vip) -> impl Future<Output = Result<(), NetError>> + Send;

    /// [`Self::remove`] of each `(ifindex, vip)` in `items`, in order, with one result per
    /// item (the same errors). The default makes one call per item; the netlink kernel reads
    /// the node's addresses once for the whole batch (a holder dropping hundreds of VIPs
    /// when it stops leading: one read per VIP made that quadratic and delayed the lease's
    /// release by seconds).
    fn remove_many(
        &self,
        items: &[(u32, Vip)],
    ) -> impl Future<Output = Vec<Result<(), NetError>>> + Send {
        async move {
            let mut out = Vec::with_capacity(items.len());
            for (ifindex, vip) in items {
                out.push(self.remove(*ifindex, *vip).await);
            }
            out
        }
    }

    /// All addresses, or those of interface `ifindex` only, decoded into [`AddrInfo`].
    ///
    /// # Errors
    /// [`NetError::Netlink`].
    fn addresses(
        &self,
        ifindex: Option<u32>,
    ) -> impl Future<Output = Result<Vec<AddrInfo>, NetError>> + Send;

    /// Like [`Kernel::addresses`], but from a dump made now: a caller that shares cached
    /// dumps uses this to confirm that an address is really missing. An address dump made
    /// while other addresses are added can skip entries (the kernel only flags such a dump
    /// with `NLM_F_DUMP_INTR`, which rtnetlink does not pass on).
    ///
    /// # Errors
    /// [`NetError::Netlink`].
    fn addresses_fresh(
        &self,
        ifindex: Option<u32>,
    ) -> impl Future<Output = Result<Vec<AddrInfo>, NetError>> + Send {
        self.addresses(ifindex)
    }

    /// Every address of the node, as [`Kernel::addresses`]`(None)`, shared: a kernel that
    /// caches its dumps ([`cache::CachedKernel`]) hands out its snapshot itself, so a reader
    /// takes no copy (a shard's holder reads the node's thousands of addresses at each
    /// check). The default wraps a dump.
    ///
    /// # Errors
    /// [`NetError::Netlink`].
    fn all_addresses(
        &self,
    ) -> impl Future<Output = Result<std::sync::Arc<Vec<AddrInfo>>, NetError>> + Send {
        async { self.addresses(None).await.map(std::sync::Arc::new) }
    }

    /// Interface choice for a VIP when none is configured (scenario S27): the interface whose
    /// connected subnet holds `addr` (longest prefix; addresses that are ours are ignored),
    /// else the main-table default route's interface (lowest metric; for a multipath default
    /// route the first nexthop's device). See [`choose_interface_from`].
    ///
    /// # Errors
    /// [`NetError::NoInterface`] when neither exists; [`NetError::Netlink`].
    fn choose_interface(&self, addr: IpAddr) -> impl Future<Output = Result<u32, NetError>> + Send;
}

/// Sends the "I have this address now" announcement for a VIP.
pub trait Announcer: Send + Sync + 'static {
    /// IPv4: one gratuitous ARP in ARP *request* form (RFC 5227 §3 ARP Announcement, RFC 5944
    /// §4.6): sender IP = target IP = VIP, sender MAC = `link.mac`, target MAC zero, to
    /// `ff:ff:ff:ff:ff:ff`. IPv6: one unsolicited neighbour advertisement (RFC 4861 §7.2.6)
    /// from the VIP to `ff02::1`, Override set, Solicited and Router clear, with a target
    /// link-layer address option, hop limit 255. The caller must not announce an IPv6 VIP
    /// that is still tentative.
    ///
    /// # Errors
    /// [`NetError::Announce`] when the raw socket cannot be opened or the send fails.
    fn announce(&self, link: &LinkInfo, vip: Vip) -> Result<(), NetError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vip_display_and_check() {
        let v = Vip::new("192.0.2.10".parse().unwrap(), 32).unwrap();
        assert_eq!(v.to_string(), "192.0.2.10/32");
        assert_eq!(
            Vip::host("2001:db8::10".parse().unwrap()).to_string(),
            "2001:db8::10/128"
        );
        let err = Vip::new("192.0.2.10".parse().unwrap(), 33).unwrap_err();
        assert!(err.to_string().contains("192.0.2.10/33"), "{err}");
        assert!(Vip::new("2001:db8::1".parse().unwrap(), 128).is_ok());
        assert!(Vip::new("2001:db8::1".parse().unwrap(), 129).is_err());
    }
}
