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

use super::iface::{IFNAME_RULE, is_ifname};

mod manage;
mod rtnl;

pub use manage::Macvlans;
pub use rtnl::NetlinkMacvlans;

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
    /// the macvlan ([`MacvlanKernel::mac_answers`], [`crate::net::mac_in_use`]): for a MAC
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
    /// Asking the segment who uses the MAC ([`crate::net::mac_in_use`]) failed.
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
pub enum LinkAction {
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
pub fn link_action(
    links: &[LinkEntry],
    spec: &MacvlanSpec,
    parent_index: u32,
) -> Result<LinkAction, MacvlanError> {
    let Some(existing) = links.iter().find(|l| l.name == spec.name) else {
        return Ok(LinkAction::Create);
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
        LinkAction::Reuse(existing.index)
    } else {
        LinkAction::Replace(existing.index)
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
    /// when asked ([`crate::net::mac_in_use`]: an ICMPv6 echo to all nodes, sent to `mac`
    /// alone, from the parent's link-local, answers awaited for
    /// [`crate::net::mac_in_use::MAC_PROBE_WAIT`]): a description of the answer, `None` when
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

/// The per-interface MLD settings vipd gives its macvlans, in milliseconds: unsolicited MLD
/// reports (joining or leaving a group, e.g. the solicited-node group of a DHCPv6
/// macvlan's link-local address) are repeated within 20 ms instead of spread over up to
/// 1 s (the kernel's default). A killed holder's leftover macvlan reports leaving that
/// group when its link-local expires ([`LINK_LOCAL_LIFETIME_SECS`]): with these, its last
/// frame from the Service's shared MAC follows the expiry within milliseconds, not up to a
/// second later, when the next holder may already send from the same MAC. Best effort: a
/// read-only `/proc/sys` keeps the kernel's default (the frames come later, within 1 s).
pub const MLD_SETTINGS: [(&str, u8); 2] = [
    ("mldv1_unsolicited_report_interval", 20),
    ("mldv2_unsolicited_report_interval", 20),
];

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

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
