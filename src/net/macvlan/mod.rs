//! Macvlan sub-interfaces for DHCP-mode Services (issue 13): one per Service address, with the
//! Service's own MAC, so that the DHCP server sees one client per Service and the address
//! follows the MAC from node to node.
//!
//! vipd marks every macvlan it creates with an ifalias starting with [`MARK_PREFIX`]
//! (`ip link show` prints it as `alias vipd:<service uid>`); it deletes and reuses only
//! macvlans carrying that mark, never any other interface ([`Macvlans::remove_stale`] at start,
//! [`Macvlans::ensure`], [`Macvlans::remove`]).
//!
//! The decisions (validation, what to reuse, what is stale) are pure functions over a link
//! listing; the kernel is reached through the small [`MacvlanKernel`] trait, implemented over
//! rtnetlink and `/proc/sys` by [`NetlinkMacvlans`].
//!
//! vipd's macvlans are mode `bridge`: macvlans on the same parent reach each other; the parent
//! itself cannot reach them (a property of macvlan, not of vipd).

use std::future::Future;

use futures::TryStreamExt;
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoKind, LinkAttribute, LinkInfo as NlLinkInfo,
    LinkMessage, MacVlanMode,
};
use rtnetlink::{Handle, LinkMacVlan, LinkUnspec};

use super::iface::{IFNAME_RULE, is_ifname};
use super::netlink::{EAFNOSUPPORT, ENODEV, errno, set_lifetimes};

/// Prefix of the ifalias marking a macvlan as vipd's (`vipd:<service uid>`).
pub const MARK_PREFIX: &str = "vipd:";

/// Longest ifalias the kernel stores (`IFALIASZ - 1` bytes).
pub const ALIAS_MAX: usize = 255;

/// What to create: one marked macvlan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacvlanSpec {
    /// Parent interface name, e.g. `eth0`.
    pub parent: String,
    /// The macvlan's name ([`is_ifname`]: 1 to 15 bytes, ...).
    pub name: String,
    /// Its MAC address: unicast (I/G bit clear), not all zero.
    pub mac: [u8; 6],
    /// Its ifalias: must start with [`MARK_PREFIX`], at most [`ALIAS_MAX`] bytes.
    pub mark: String,
    /// `net.ipv4.conf.<name>.rp_filter`: 0 off, 1 strict, 2 loose (RFC 3704). The kernel uses
    /// the larger of this and `net.ipv4.conf.all.rp_filter`.
    pub rp_filter: u8,
    /// Make the link-local IPv6 address usable at once (a DHCPv6 client runs on the
    /// macvlan): [`NO_DAD`] is written before the macvlan goes up.
    pub ipv6_now: bool,
    /// The addresses this macvlan's Service asks for (`kube-vip.io/requestedIP`): a
    /// neighbour entry mapping one of them to [`MacvlanSpec::mac`] is this Service's own
    /// (the previous holder's), not another host's ([`foreign_mac_owner`]).
    pub own_addrs: Vec<std::net::IpAddr>,
    /// Ask the segment whether a host already uses [`MacvlanSpec::mac`] before creating
    /// the macvlan ([`MacvlanKernel::mac_answers`], [`crate::net::macprobe`]): for a MAC
    /// vipd did not derive from the Service itself (given by `kube-vip.io/hwaddr`).
    pub probe_mac: bool,
}

/// One entry of the parent's neighbour table (ARP / NDP cache) that has a link-layer
/// address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    /// The neighbour's IP address.
    pub ip: std::net::IpAddr,
    /// Its MAC.
    pub mac: [u8; 6],
}

/// Who else has `spec.mac`, as far as this node can see: a local interface other than this
/// macvlan (any link of the namespace), or a host in the parent's neighbour table under an
/// address that is not one of the Service's own (`own_addrs`). A macvlan with another
/// host's MAC takes that host's traffic: the switch learns the MAC on this node's port
/// (the gateway's or the DHCP server's MAC in a copied `kube-vip.io/hwaddr` would cut the
/// segment off). `None` when nobody is seen. Pure.
pub fn foreign_mac_owner(
    links: &[LinkEntry],
    neighbours: &[Neighbour],
    spec: &MacvlanSpec,
) -> Option<String> {
    if let Some(l) = links
        .iter()
        .find(|l| l.mac == spec.mac && !(l.is_ours() && l.name == spec.name))
    {
        return Some(format!("this node's interface {}", l.name));
    }
    neighbours
        .iter()
        .find(|n| n.mac == spec.mac && !spec.own_addrs.contains(&n.ip))
        .map(|n| format!("{} in {}'s neighbour table", n.ip, spec.parent))
}

/// `net.ipv6.conf.<macvlan>.accept_dad = 0`, for macvlans that carry a DHCPv6 client: its
/// link-local address (the source of every DHCPv6 message, RFC 8415 §13.1) is usable as soon
/// as the macvlan is up, instead of after 1 s or more of Duplicate Address Detection. DAD
/// is off rather than optimistic (`optimistic_dad`, RFC 4429) because the link-local comes
/// from the Service's MAC, which by design moves from node to node: a macvlan left behind
/// by a killed holder would fail the new holder's DAD and leave its address unusable
/// (`dadfailed`, optimistic or not), and `optimistic_dad` needs a kernel built with
/// `CONFIG_IPV6_OPTIMISTIC_DAD`.
pub const NO_DAD: (&str, u8) = ("accept_dad", 0);

/// One link as far as macvlan bookkeeping needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkEntry {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// `true` for `IFLA_INFO_KIND` = `macvlan`.
    pub macvlan: bool,
    /// The ifalias (`IFLA_IFALIAS`), if set.
    pub alias: Option<String>,
    /// Parent interface index (`IFLA_LINK`), if any.
    pub parent: Option<u32>,
    /// MAC address (zero when the link has none).
    pub mac: [u8; 6],
}

impl LinkEntry {
    /// A macvlan carrying vipd's mark.
    pub fn is_ours(&self) -> bool {
        self.macvlan
            && self
                .alias
                .as_deref()
                .is_some_and(|a| a.starts_with(MARK_PREFIX))
    }
}

/// Errors of macvlan management; each names the interface and the offending value.
#[derive(Debug, thiserror::Error)]
pub enum MacvlanError {
    /// The macvlan name is not a valid Linux interface name.
    #[error("macvlan name {name:?} is invalid ({IFNAME_RULE})")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// The MAC is all zero or multicast.
    #[error("macvlan {name}: MAC {mac} is not a unicast address (must be non-zero, I/G bit clear)")]
    InvalidMac {
        /// The macvlan name.
        name: String,
        /// The MAC, `aa:bb:cc:dd:ee:ff`.
        mac: String,
    },
    /// The mark does not start with [`MARK_PREFIX`] or is too long.
    #[error(
        "macvlan {name}: mark {mark:?} must start with {MARK_PREFIX:?} and be at most {ALIAS_MAX} bytes"
    )]
    InvalidMark {
        /// The macvlan name.
        name: String,
        /// The mark given.
        mark: String,
    },
    /// `rp_filter` outside 0..=2.
    #[error("macvlan {name}: rp_filter {value} is invalid (0 off, 1 strict, 2 loose)")]
    InvalidRpFilter {
        /// The macvlan name.
        name: String,
        /// The value given.
        value: u8,
    },
    /// The parent interface does not exist.
    #[error("macvlan {name}: parent interface {parent:?} does not exist")]
    NoParent {
        /// The macvlan name.
        name: String,
        /// The parent asked for.
        parent: String,
    },
    /// The parent interface has no Ethernet address (loopback, a tunnel or point-to-point
    /// device): no macvlan can go on it.
    #[error(
        "macvlan {name}: parent interface {parent} has no Ethernet address (loopback, tunnel or point-to-point device) and cannot carry a macvlan; set kube-vip.io/serviceInterface (or vip_servicesinterface) to an Ethernet interface"
    )]
    NotEthernet {
        /// The macvlan name.
        name: String,
        /// The parent interface.
        parent: String,
    },
    /// The MAC is another interface's or another host's ([`foreign_mac_owner`]).
    #[error(
        "macvlan {name}: MAC {mac} belongs to {owner}; refusing to take another host's MAC (the switch would send that host's traffic here): set kube-vip.io/hwaddr to a MAC of its own, or remove it to get one derived from the Service"
    )]
    ForeignMac {
        /// The macvlan name.
        name: String,
        /// The MAC, `aa:bb:cc:dd:ee:ff`.
        mac: String,
        /// Who has it.
        owner: String,
    },
    /// An interface of that name exists and is not a vipd macvlan: never touched.
    #[error(
        "macvlan {name}: an interface of that name exists and was not created by vipd (no {MARK_PREFIX:?} ifalias); refusing to touch it"
    )]
    NotOurs {
        /// The name.
        name: String,
    },
    /// Asking the segment who uses the MAC ([`crate::net::macprobe`]) failed.
    #[error("macvlan {name}: cannot ask {parent} who uses MAC {mac}: {what}: {source}")]
    MacProbe {
        /// The macvlan name.
        name: String,
        /// The parent interface.
        parent: String,
        /// The MAC, `aa:bb:cc:dd:ee:ff`.
        mac: String,
        /// The step that failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A netlink request failed.
    #[error("macvlan {name}: netlink {op} failed: {source}")]
    Netlink {
        /// The macvlan (or parent) concerned.
        name: String,
        /// The operation, e.g. `create`.
        op: &'static str,
        /// The rtnetlink error.
        #[source]
        source: rtnetlink::Error,
    },
    /// Writing a sysctl failed.
    #[error("macvlan {name}: cannot write {value} to {path}: {source}")]
    Sysctl {
        /// The macvlan.
        name: String,
        /// The `/proc/sys` path.
        path: String,
        /// The value.
        value: u8,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A sysctl of the macvlan cannot be written (`/proc/sys` is read-only: a container
    /// without privileges) and does not already hold the value DHCP mode needs.
    #[error(
        "macvlan {name}: {path} is read-only here and holds {current}, not {value}: run the vipd \
         container privileged in DHCP mode (securityContext.privileged: true), or set \
         net.{family}.conf.default.{key}={value} on the host so that new interfaces start with it"
    )]
    ReadOnlySysctl {
        /// The macvlan.
        name: String,
        /// The `/proc/sys` path.
        path: String,
        /// `ipv4` or `ipv6`.
        family: &'static str,
        /// The setting.
        key: &'static str,
        /// The value needed.
        value: u8,
        /// The value it holds (`?` when unreadable).
        current: String,
    },
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Checks a spec before any kernel call.
///
/// # Errors
/// [`MacvlanError::InvalidName`], [`MacvlanError::InvalidMac`], [`MacvlanError::InvalidMark`],
/// [`MacvlanError::InvalidRpFilter`], each naming the value.
pub fn validate(spec: &MacvlanSpec) -> Result<(), MacvlanError> {
    if !is_ifname(&spec.name) {
        return Err(MacvlanError::InvalidName {
            name: spec.name.clone(),
        });
    }
    if spec.mac == [0; 6] || spec.mac[0] & 1 != 0 {
        return Err(MacvlanError::InvalidMac {
            name: spec.name.clone(),
            mac: format_mac(&spec.mac),
        });
    }
    if !spec.mark.starts_with(MARK_PREFIX) || spec.mark.len() > ALIAS_MAX {
        return Err(MacvlanError::InvalidMark {
            name: spec.name.clone(),
            mark: spec.mark.clone(),
        });
    }
    if spec.rp_filter > 2 {
        return Err(MacvlanError::InvalidRpFilter {
            name: spec.name.clone(),
            value: spec.rp_filter,
        });
    }
    Ok(())
}

/// What [`Macvlans::ensure`] must do, decided from a link listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A vipd macvlan with this name, parent, MAC and mark exists: keep it (index given),
    /// re-apply the sysctls and bring it up.
    Reuse(u32),
    /// A vipd macvlan with this name exists but differs (parent, MAC or mark): delete it
    /// (index given), then create.
    Replace(u32),
    /// No interface of that name: create.
    Create,
}

/// Decides how to get `spec`'s macvlan given the current links; `parent_index` is the
/// parent's index.
///
/// # Errors
/// [`MacvlanError::NotOurs`] when an interface of that name exists without vipd's mark.
pub fn plan(
    links: &[LinkEntry],
    spec: &MacvlanSpec,
    parent_index: u32,
) -> Result<Plan, MacvlanError> {
    let Some(existing) = links.iter().find(|l| l.name == spec.name) else {
        return Ok(Plan::Create);
    };
    if !existing.is_ours() {
        return Err(MacvlanError::NotOurs {
            name: spec.name.clone(),
        });
    }
    let same = existing.parent == Some(parent_index)
        && existing.mac == spec.mac
        && existing.alias.as_deref() == Some(spec.mark.as_str());
    Ok(if same {
        Plan::Reuse(existing.index)
    } else {
        Plan::Replace(existing.index)
    })
}

/// The vipd macvlans (marked) not named in `keep`: what [`Macvlans::remove_stale`] deletes.
pub fn stale<'a>(links: &'a [LinkEntry], keep: &[&str]) -> Vec<&'a LinkEntry> {
    links
        .iter()
        .filter(|l| l.is_ours() && !keep.contains(&l.name.as_str()))
        .collect()
}

/// The kernel operations macvlan management needs; [`NetlinkMacvlans`] in production.
pub trait MacvlanKernel: Send + Sync + 'static {
    /// All links of the namespace.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    fn links(&self) -> impl Future<Output = Result<Vec<LinkEntry>, MacvlanError>> + Send;

    /// Creates a macvlan (mode bridge) named `name` on `parent_index` with `mac`, down, and
    /// sets its ifalias to `mark`; returns its index.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    fn create(
        &self,
        parent_index: u32,
        name: &str,
        mac: [u8; 6],
        mark: &str,
    ) -> impl Future<Output = Result<u32, MacvlanError>> + Send;

    /// Sets link `index`'s IPv6 address generation mode to none
    /// (`IFLA_INET6_ADDR_GEN_MODE` = `IN6_ADDR_GEN_MODE_NONE`, `ip link set <name>
    /// addrgenmode none`), so that the kernel gives it no link-local address when it goes
    /// up. A netlink setting, so it works where `/proc/sys` is read-only. `Ok(false)` when
    /// the kernel has no IPv6 (nothing to do).
    ///
    /// Why: every node that holds a DHCP Service gives its macvlan the same MAC, so a
    /// kernel-made link-local (the EUI-64 of that MAC, infinite lifetime) would be the same
    /// on each. A macvlan left behind by a killed or frozen holder would then answer the
    /// next holder's Duplicate Address Detection and MLD queries, and each such frame moves
    /// the switch's entry for the shared MAC to the dead node's port, black-holing the
    /// Service until the next gratuitous ARP. Without any address the leftover is silent; a
    /// DHCPv6 macvlan gets a fenced link-local from vipd instead
    /// ([`Macvlans::add_link_local`]).
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    fn no_link_local(
        &self,
        index: u32,
        name: &str,
    ) -> impl Future<Output = Result<bool, MacvlanError>> + Send;

    /// Brings link `index` up.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    fn up(&self, index: u32, name: &str) -> impl Future<Output = Result<(), MacvlanError>> + Send;

    /// Deletes link `index` (gone already = `Ok`).
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    fn delete(
        &self,
        index: u32,
        name: &str,
    ) -> impl Future<Output = Result<(), MacvlanError>> + Send;

    /// Writes `value` to `/proc/sys/net/<family>/conf/<name>/<key>`.
    ///
    /// # Errors
    /// [`MacvlanError::Sysctl`] (its `source` is `NotFound` when the directory does not
    /// exist, e.g. IPv6 disabled on the kernel command line).
    fn set_conf(
        &self,
        family: ConfFamily,
        name: &str,
        key: &'static str,
        value: u8,
    ) -> Result<(), MacvlanError>;

    /// Reads `/proc/sys/net/<family>/conf/<name>/<key>`; `None` when it cannot be read or
    /// is not a small number.
    fn get_conf(&self, family: ConfFamily, name: &str, key: &'static str) -> Option<u8>;

    /// The neighbour entries (IPv4 and IPv6) of link `parent_index` that carry a MAC,
    /// failed and incomplete ones left out.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    fn neighbours(
        &self,
        parent_index: u32,
        parent: &str,
    ) -> impl Future<Output = Result<Vec<Neighbour>, MacvlanError>> + Send;

    /// Puts `addr/64` on link `index` with `IFA_F_NODAD` and valid and preferred lifetimes
    /// of `lifetime_secs` seconds, or, when it is there, renews its lifetimes. With
    /// `create` false an absent address is not added: `Ok(false)`. `Ok(true)` when the
    /// address is there afterwards.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    fn link_local(
        &self,
        index: u32,
        name: &str,
        addr: std::net::Ipv6Addr,
        lifetime_secs: u32,
        create: bool,
    ) -> impl Future<Output = Result<bool, MacvlanError>> + Send;

    /// Who on link `parent_index` (named `parent`, MAC `parent_mac`) sends from `mac`
    /// when asked ([`crate::net::macprobe`]: an ICMPv6 echo to all nodes, sent to `mac`
    /// alone, from the parent's link-local, answers awaited for
    /// [`crate::net::macprobe::MAC_PROBE_WAIT`]): a description of the answer, `None` when
    /// nothing answered or the parent has no IPv6 link-local to ask from.
    ///
    /// # Errors
    /// [`MacvlanError::MacProbe`] when the question cannot be sent; [`MacvlanError::Netlink`]
    /// when the parent's addresses cannot be read.
    fn mac_answers(
        &self,
        parent_index: u32,
        parent: &str,
        parent_mac: [u8; 6],
        mac: [u8; 6],
    ) -> impl Future<Output = Result<Option<String>, MacvlanError>> + Send;
}

/// Which `/proc/sys/net/<family>/conf` tree a setting lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfFamily {
    /// `net.ipv4.conf.<if>`.
    Ipv4,
    /// `net.ipv6.conf.<if>`.
    Ipv6,
}

impl ConfFamily {
    /// `ipv4` or `ipv6`.
    pub fn dir(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
        }
    }
}

/// The per-interface IPv6 settings vipd gives its macvlans: `accept_ra = 0` and
/// `autoconf = 0`, so that router advertisements never give the macvlan (and so the node)
/// a SLAAC address of its own. Skipped when the kernel has no IPv6.
pub const IPV6_SETTINGS: [(&str, u8); 2] = [("accept_ra", 0), ("autoconf", 0)];

/// Valid (and preferred) lifetime, in seconds, of the link-local address vipd puts on a
/// DHCPv6 macvlan ([`Macvlans::add_link_local`]). The client refreshes it every
/// [`LINK_LOCAL_REFRESH`] while it runs, so the address of a killed or frozen vipd is gone
/// 2 to 3 s later (the kernel counts whole seconds), before the Service's lease (at least
/// 3 s) can pass to another node; a refresh that finds it gone does not bring it back.
pub const LINK_LOCAL_LIFETIME_SECS: u32 = 2;

/// How often a DHCPv6 client refreshes its macvlan's link-local address
/// ([`LINK_LOCAL_LIFETIME_SECS`]).
pub const LINK_LOCAL_REFRESH: std::time::Duration = std::time::Duration::from_millis(500);

/// The modified EUI-64 link-local address of `mac` (RFC 4291 §2.5.1 and appendix A:
/// `fe80::` + the MAC with `ff:fe` in the middle and the universal/local bit flipped), the
/// address the kernel would have made; a DHCPv6 macvlan's source address.
pub fn eui64_link_local(mac: [u8; 6]) -> std::net::Ipv6Addr {
    let [a, b, c, d, e, f] = mac;
    std::net::Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        a ^ 0x02,
        b,
        c,
        0xff,
        0xfe,
        d,
        e,
        f,
    ])
}

/// The per-interface IPv4 settings vipd gives its macvlans, besides `rp_filter`:
/// - `arp_ignore = 1`: answer ARP only for addresses configured on the macvlan itself, so its
///   MAC never answers for the node's own addresses (the leased address is a host route on
///   the macvlan);
/// - `arp_announce = 2`: ARP requests sent from the macvlan use its own address as source.
pub const ARP_SETTINGS: [(&str, u8); 2] = [("arp_ignore", 1), ("arp_announce", 2)];

/// Macvlan management over a [`MacvlanKernel`].
#[derive(Debug)]
pub struct Macvlans<K> {
    kernel: K,
    /// Who uses each macvlan ([`Macvlans::acquire`]): a dual-stack Service's DHCPv4 and
    /// DHCPv6 clients share one.
    users:
        tokio::sync::Mutex<std::collections::HashMap<String, std::collections::BTreeSet<String>>>,
}

impl<K: MacvlanKernel> Macvlans<K> {
    /// Over `kernel`.
    pub fn new(kernel: K) -> Self {
        Self {
            kernel,
            users: tokio::sync::Mutex::default(),
        }
    }

    /// [`Self::ensure`] for `user` (e.g. `v4`, `v6`: the clients of one Service): the
    /// macvlan stays until every user has called [`Self::release`]. Calls for one name are
    /// serialised, so two users never create it twice.
    ///
    /// # Errors
    /// As [`Self::ensure`].
    pub async fn acquire(&self, spec: &MacvlanSpec, user: &str) -> Result<u32, MacvlanError> {
        let mut users = self.users.lock().await;
        let index = self.ensure(spec).await?;
        users
            .entry(spec.name.clone())
            .or_default()
            .insert(user.to_string());
        Ok(index)
    }

    /// `user` is done with macvlan `name`: removes it ([`Self::remove`]) when no other user
    /// remains; `Ok(false)` when it stays (or was absent).
    ///
    /// # Errors
    /// As [`Self::remove`].
    pub async fn release(&self, name: &str, user: &str) -> Result<bool, MacvlanError> {
        let mut users = self.users.lock().await;
        if let Some(set) = users.get_mut(name) {
            set.remove(user);
            if !set.is_empty() {
                return Ok(false);
            }
            users.remove(name);
        }
        self.remove(name).await
    }

    /// Puts the link-local address of `mac` ([`eui64_link_local`]) on macvlan `index`
    /// (`name`) for [`LINK_LOCAL_LIFETIME_SECS`], for a DHCPv6 client, which keeps it with
    /// [`Self::refresh_link_local`]; returns the address.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    pub async fn add_link_local(
        &self,
        index: u32,
        name: &str,
        mac: [u8; 6],
    ) -> Result<std::net::Ipv6Addr, MacvlanError> {
        let addr = eui64_link_local(mac);
        self.kernel
            .link_local(index, name, addr, LINK_LOCAL_LIFETIME_SECS, true)
            .await?;
        Ok(addr)
    }

    /// Renews the lifetimes of [`Self::add_link_local`]'s address; `Ok(false)` when it has
    /// expired (vipd did not run for [`LINK_LOCAL_LIFETIME_SECS`]): it is not added back,
    /// so a holder frozen past its fence never sends from it again unless the client is set
    /// up anew.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    pub async fn refresh_link_local(
        &self,
        index: u32,
        name: &str,
        mac: [u8; 6],
    ) -> Result<bool, MacvlanError> {
        self.kernel
            .link_local(
                index,
                name,
                eui64_link_local(mac),
                LINK_LOCAL_LIFETIME_SECS,
                false,
            )
            .await
    }

    /// The kernel access.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// Makes `spec`'s macvlan exist, configured and up; returns its index. An existing vipd
    /// macvlan of that name is reused when identical, replaced otherwise. Order: create (down),
    /// ifalias, no kernel link-local ([`MacvlanKernel::no_link_local`]), sysctls (`rp_filter`, [`ARP_SETTINGS`], [`IPV6_SETTINGS`], [`NO_DAD`] when
    /// `ipv6_now`), up, so that it never answers with the kernel defaults.
    ///
    /// # Errors
    /// [`validate`]'s errors; [`MacvlanError::NoParent`]; [`MacvlanError::NotOurs`] (an
    /// interface of that name not created by vipd, left alone); kernel errors.
    pub async fn ensure(&self, spec: &MacvlanSpec) -> Result<u32, MacvlanError> {
        validate(spec)?;
        let links = self.kernel.links().await?;
        let parent_link = links
            .iter()
            .find(|l| l.name == spec.parent)
            .ok_or_else(|| MacvlanError::NoParent {
                name: spec.name.clone(),
                parent: spec.parent.clone(),
            })?;
        if parent_link.mac == [0; 6] {
            return Err(MacvlanError::NotEthernet {
                name: spec.name.clone(),
                parent: spec.parent.clone(),
            });
        }
        let parent = parent_link.index;
        let neighbours = self.kernel.neighbours(parent, &spec.parent).await?;
        if let Some(owner) = foreign_mac_owner(&links, &neighbours, spec) {
            return Err(MacvlanError::ForeignMac {
                name: spec.name.clone(),
                mac: format_mac(&spec.mac),
                owner,
            });
        }
        let planned = plan(&links, spec, parent)?;
        // Asked once per macvlan this node creates: a macvlan already ours carries the MAC,
        // and its own frames would be the answer.
        if spec.probe_mac
            && !matches!(planned, Plan::Reuse(_))
            && let Some(owner) = self
                .kernel
                .mac_answers(parent, &spec.parent, parent_link.mac, spec.mac)
                .await?
        {
            return Err(MacvlanError::ForeignMac {
                name: spec.name.clone(),
                mac: format_mac(&spec.mac),
                owner,
            });
        }
        let index = match planned {
            Plan::Reuse(index) => index,
            Plan::Replace(index) => {
                self.kernel.delete(index, &spec.name).await?;
                self.kernel
                    .create(parent, &spec.name, spec.mac, &spec.mark)
                    .await?
            }
            Plan::Create => {
                self.kernel
                    .create(parent, &spec.name, spec.mac, &spec.mark)
                    .await?
            }
        };
        self.kernel.no_link_local(index, &spec.name).await?;
        self.configure(ConfFamily::Ipv4, &spec.name, "rp_filter", spec.rp_filter)?;
        for (key, value) in ARP_SETTINGS {
            self.configure(ConfFamily::Ipv4, &spec.name, key, value)?;
        }
        for (key, value) in IPV6_SETTINGS {
            match self.configure(ConfFamily::Ipv6, &spec.name, key, value) {
                Err(MacvlanError::Sysctl { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
        if spec.ipv6_now {
            // DHCPv6 needs IPv6: no skipping when the kernel has none.
            self.configure(ConfFamily::Ipv6, &spec.name, NO_DAD.0, NO_DAD.1)?;
        }
        self.kernel.up(index, &spec.name).await?;
        Ok(index)
    }

    /// Writes one setting of macvlan `name`. Where `/proc/sys` is read-only (a container
    /// without privileges) a setting that already holds `value` (inherited from the host's
    /// `conf/default`) is fine; otherwise [`MacvlanError::ReadOnlySysctl`] says what to do.
    fn configure(
        &self,
        family: ConfFamily,
        name: &str,
        key: &'static str,
        value: u8,
    ) -> Result<(), MacvlanError> {
        match self.kernel.set_conf(family, name, key, value) {
            Err(MacvlanError::Sysctl { path, source, .. })
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                let current = self.kernel.get_conf(family, name, key);
                if current == Some(value) {
                    return Ok(());
                }
                Err(MacvlanError::ReadOnlySysctl {
                    name: name.into(),
                    path,
                    family: family.dir(),
                    key,
                    value,
                    current: current.map_or_else(|| "?".into(), |c| c.to_string()),
                })
            }
            other => other,
        }
    }

    /// Deletes the macvlan `name` if it is vipd's (marked); absent = `Ok(false)`.
    ///
    /// # Errors
    /// [`MacvlanError::NotOurs`] when `name` exists unmarked (left alone); kernel errors.
    pub async fn remove(&self, name: &str) -> Result<bool, MacvlanError> {
        let links = self.kernel.links().await?;
        match links.iter().find(|l| l.name == name) {
            None => Ok(false),
            Some(l) if l.is_ours() => {
                self.kernel.delete(l.index, name).await?;
                Ok(true)
            }
            Some(_) => Err(MacvlanError::NotOurs { name: name.into() }),
        }
    }

    /// Deletes every vipd macvlan not named in `keep` (at start: `keep` empty); returns the
    /// names deleted. Macvlans without vipd's mark are never touched.
    ///
    /// # Errors
    /// Kernel errors (the first one; the others are still tried).
    pub async fn remove_stale(&self, keep: &[&str]) -> Result<Vec<String>, MacvlanError> {
        let links = self.kernel.links().await?;
        let mut removed = Vec::new();
        let mut first_error = None;
        for link in stale(&links, keep) {
            match self.kernel.delete(link.index, &link.name).await {
                Ok(()) => removed.push(link.name.clone()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }
}

/// [`MacvlanKernel`] over rtnetlink and `/proc/sys`. The connection task runs on the tokio
/// runtime current at [`NetlinkMacvlans::new`].
#[derive(Debug, Clone)]
pub struct NetlinkMacvlans {
    handle: Handle,
}

/// Decodes one `RTM_NEWLINK` message.
pub(crate) fn link_entry(msg: &LinkMessage) -> LinkEntry {
    let mut entry = LinkEntry {
        index: msg.header.index,
        name: String::new(),
        macvlan: false,
        alias: None,
        parent: None,
        mac: [0; 6],
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => entry.name = n.clone(),
            LinkAttribute::IfAlias(a) => entry.alias = Some(a.clone()),
            LinkAttribute::Link(p) => entry.parent = Some(*p),
            LinkAttribute::Address(a) if a.len() == 6 => entry.mac.copy_from_slice(a),
            LinkAttribute::LinkInfo(infos) => {
                entry.macvlan = infos
                    .iter()
                    .any(|i| matches!(i, NlLinkInfo::Kind(InfoKind::MacVlan)));
            }
            _ => {}
        }
    }
    entry
}

impl NetlinkMacvlans {
    /// Opens an rtnetlink socket and spawns its connection task.
    ///
    /// # Errors
    /// [`MacvlanError::Socket`] when the socket cannot be opened or no tokio runtime runs.
    pub fn new() -> Result<Self, MacvlanError> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|e| MacvlanError::Socket(std::io::Error::other(e)))?;
        let (conn, handle, _) = rtnetlink::new_connection().map_err(MacvlanError::Socket)?;
        rt.spawn(conn);
        Ok(Self { handle })
    }

    /// Whether the running kernel can create macvlans, asked of the kernel itself (for
    /// `vipd preflight`, where `/sys/module` and `/lib/modules` may not tell: a built-in
    /// driver without parameters has no `/sys/module/macvlan`, and containers often have no
    /// `/lib/modules`). Sends an `RTM_NEWLINK` of kind `macvlan` on parent index 0, which
    /// no kernel accepts: "Unknown device type" (`EOPNOTSUPP`) means no macvlan (after the
    /// kernel tried to load the module, as a first macvlan would), any other refusal
    /// (`ENODEV`, `EINVAL`) means the driver is there. Nothing is created; should a kernel
    /// ever accept it, the link is deleted again.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`] when the answer says neither (e.g. `EPERM` without
    /// CAP_NET_ADMIN).
    pub async fn kernel_has_macvlan(&self) -> Result<bool, MacvlanError> {
        const PROBE: &str = "vipd-pf-probe";
        let msg = LinkMacVlan::new(PROBE, 0, MacVlanMode::Bridge).build();
        match self.handle.link().add(msg).execute().await {
            Ok(()) => {
                if let Ok(Some(m)) = self
                    .handle
                    .link()
                    .get()
                    .match_name(PROBE.to_string())
                    .execute()
                    .try_next()
                    .await
                {
                    let _ = self.handle.link().del(m.header.index).execute().await;
                }
                Ok(true)
            }
            Err(e) => match super::netlink::errno(&e) {
                Some(libc::EOPNOTSUPP) => Ok(false),
                Some(libc::ENODEV | libc::EINVAL) => Ok(true),
                _ => Err(MacvlanError::Netlink {
                    name: PROBE.into(),
                    op: "ask the kernel for the macvlan driver",
                    source: e,
                }),
            },
        }
    }
}

impl MacvlanKernel for NetlinkMacvlans {
    async fn links(&self) -> Result<Vec<LinkEntry>, MacvlanError> {
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|source| MacvlanError::Netlink {
                name: "(all links)".into(),
                op: "dump links",
                source,
            })?;
        Ok(msgs.iter().map(link_entry).collect())
    }

    async fn create(
        &self,
        parent_index: u32,
        name: &str,
        mac: [u8; 6],
        mark: &str,
    ) -> Result<u32, MacvlanError> {
        let err = |op| {
            move |source| MacvlanError::Netlink {
                name: name.into(),
                op,
                source,
            }
        };
        let msg = LinkMacVlan::new(name, parent_index, MacVlanMode::Bridge)
            .address(mac.to_vec())
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(err("create macvlan"))?;
        let created: Option<LinkMessage> = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute()
            .try_next()
            .await
            .map_err(err("get created macvlan"))?;
        let index = created
            .map(|m| m.header.index)
            .ok_or_else(|| MacvlanError::Netlink {
                name: name.into(),
                op: "get created macvlan",
                source: rtnetlink::Error::RequestFailed,
            })?;
        // The kernel ignores IFLA_IFALIAS in RTM_NEWLINK for a new device: set it after.
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).alias(mark).build())
            .execute()
            .await
            .map_err(err("set ifalias"))?;
        Ok(index)
    }

    async fn no_link_local(&self, index: u32, name: &str) -> Result<bool, MacvlanError> {
        let mut msg = LinkUnspec::new_with_index(index).build();
        msg.attributes
            .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(
                vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)],
            )]));
        match self.handle.link().set(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(EAFNOSUPPORT) => Ok(false),
            Err(source) => Err(MacvlanError::Netlink {
                name: name.into(),
                op: "set addrgenmode none",
                source,
            }),
        }
    }

    async fn up(&self, index: u32, name: &str) -> Result<(), MacvlanError> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(|source| MacvlanError::Netlink {
                name: name.into(),
                op: "set up",
                source,
            })
    }

    async fn delete(&self, index: u32, name: &str) -> Result<(), MacvlanError> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(()),
            Err(source) => Err(MacvlanError::Netlink {
                name: name.into(),
                op: "delete",
                source,
            }),
        }
    }

    fn set_conf(
        &self,
        family: ConfFamily,
        name: &str,
        key: &'static str,
        value: u8,
    ) -> Result<(), MacvlanError> {
        let path = format!("/proc/sys/net/{}/conf/{name}/{key}", family.dir());
        std::fs::write(&path, format!("{value}\n")).map_err(|source| MacvlanError::Sysctl {
            name: name.into(),
            path,
            value,
            source,
        })
    }

    fn get_conf(&self, family: ConfFamily, name: &str, key: &'static str) -> Option<u8> {
        let path = format!("/proc/sys/net/{}/conf/{name}/{key}", family.dir());
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    async fn neighbours(
        &self,
        parent_index: u32,
        parent: &str,
    ) -> Result<Vec<Neighbour>, MacvlanError> {
        use netlink_packet_route::neighbour::{
            NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
        };
        let msgs: Vec<NeighbourMessage> = self
            .handle
            .neighbours()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|source| MacvlanError::Netlink {
                name: parent.into(),
                op: "dump neighbours",
                source,
            })?;
        Ok(msgs
            .iter()
            .filter(|m| {
                m.header.ifindex == parent_index
                    && !matches!(
                        m.header.state,
                        NeighbourState::Failed | NeighbourState::Incomplete
                    )
            })
            .filter_map(|m| {
                let mut ip = None;
                let mut mac = None;
                for a in &m.attributes {
                    match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                            ip = Some(std::net::IpAddr::V4(*v4));
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                            ip = Some(std::net::IpAddr::V6(*v6));
                        }
                        NeighbourAttribute::LinkLayerAddress(l) => {
                            mac = <[u8; 6]>::try_from(l.as_slice()).ok();
                        }
                        _ => {}
                    }
                }
                Some(Neighbour { ip: ip?, mac: mac? })
            })
            .collect())
    }

    async fn mac_answers(
        &self,
        parent_index: u32,
        parent: &str,
        parent_mac: [u8; 6],
        mac: [u8; 6],
    ) -> Result<Option<String>, MacvlanError> {
        let mut get = self
            .handle
            .address()
            .get()
            .set_link_index_filter(parent_index);
        get.message_mut().header.family = netlink_packet_route::AddressFamily::Inet6;
        let msgs: Vec<netlink_packet_route::address::AddressMessage> = get
            .execute()
            .try_collect()
            .await
            .map_err(|source| MacvlanError::Netlink {
                name: parent.into(),
                op: "list the parent's IPv6 addresses",
                source,
            })?;
        let link_local = msgs
            .iter()
            .filter_map(|m| super::netlink::RawAddr::from_message(m).to_info())
            .filter(|a| a.ifindex == parent_index && !a.tentative && !a.dad_failed)
            .find_map(|a| match a.vip.addr {
                std::net::IpAddr::V6(v6) if v6.is_unicast_link_local() => Some(v6),
                _ => None,
            });
        let Some(src) = link_local else {
            tracing::debug!(parent, mac = %format_mac(&mac), "the parent has no IPv6 link-local: not asking who uses the MAC");
            return Ok(None);
        };
        let answer = crate::net::macprobe::mac_answers(
            parent_index,
            parent_mac,
            src,
            mac,
            crate::net::macprobe::MAC_PROBE_WAIT,
        )
        .await
        .map_err(|(what, source)| MacvlanError::MacProbe {
            name: parent.into(),
            parent: parent.into(),
            mac: format_mac(&mac),
            what,
            source,
        })?;
        Ok(answer.map(|ip| format!("a host on {parent} that answers from it (IPv6 {ip})")))
    }

    async fn link_local(
        &self,
        index: u32,
        name: &str,
        addr: std::net::Ipv6Addr,
        lifetime_secs: u32,
        create: bool,
    ) -> Result<bool, MacvlanError> {
        let err = |op| {
            move |source| MacvlanError::Netlink {
                name: name.into(),
                op,
                source,
            }
        };
        if !create {
            let mut get = self
                .handle
                .address()
                .get()
                .set_link_index_filter(index)
                .set_address_filter(std::net::IpAddr::V6(addr));
            get.message_mut().header.family = netlink_packet_route::AddressFamily::Inet6;
            let present = get
                .execute()
                .try_next()
                .await
                .map_err(err("get link-local"))?
                .is_some();
            if !present {
                return Ok(false);
            }
        }
        let mut req = self
            .handle
            .address()
            .add(index, std::net::IpAddr::V6(addr), 64);
        set_lifetimes(req.message_mut(), lifetime_secs, lifetime_secs, true);
        req.replace()
            .execute()
            .await
            .map_err(err("add link-local"))?;
        Ok(true)
    }
}

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
