//! [`Kernel`] over rtnetlink, plus the pure decoding/tagging helpers it uses.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};

use futures::TryStreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressMessage, AddressProtocol,
};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::{RouteAttribute, RouteHeader, RouteMessage, RouteType};
use rtnetlink::Handle;

use super::addr_socket::AddrSocket;
use super::iface::{DefaultRoute, choose_interface_from};
use super::lifetime::Lifetime;
use super::{ADDR_PROTO_VIPD, AddrInfo, Kernel, LABEL_SUFFIX, LinkInfo, NetError, Vip};

/// The kernel's "forever" lifetime (`INFINITY_LIFE_TIME`, seconds).
const INFINITY_LIFE_TIME: u32 = u32::MAX;
/// Longest interface address label the kernel accepts (`IFNAMSIZ - 1` bytes).
const MAX_LABEL_LEN: usize = 15;

/// `ENODEV`.
pub(super) const ENODEV: i32 = 19;
const EEXIST: i32 = 17;
const EINVAL: i32 = 22;
const ENOENT: i32 = 2;
const EADDRNOTAVAIL: i32 = 99;
const EOPNOTSUPP: i32 = 95;
/// `EAFNOSUPPORT`: e.g. an IPv6 setting on a kernel or link without IPv6.
pub(super) const EAFNOSUPPORT: i32 = 97;

/// How vipd tags the addresses it adds. Detected once per [`NetlinkKernel`], on the first
/// address it creates ([`detect_tag_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagMode {
    /// Not known yet: the next add sends `IFA_PROTO` and checks that the kernel kept it.
    Unknown,
    /// The kernel stores `IFA_PROTO` (Linux >= 5.18): tag = [`ADDR_PROTO_VIPD`].
    Proto,
    /// The kernel ignores or rejects `IFA_PROTO`: tag = IPv4 label `<ifname>:vip`; IPv6
    /// addresses cannot be tagged and are refused ([`NetError::TagUnsupported`]).
    Label,
}

impl TagMode {
    fn to_u8(self) -> u8 {
        match self {
            Self::Unknown => 0,
            Self::Proto => 1,
            Self::Label => 2,
        }
    }
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Proto,
            2 => Self::Label,
            _ => Self::Unknown,
        }
    }
}

/// The tag to put on a new address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tag {
    /// `IFA_PROTO` = the value.
    Proto(u8),
    /// `IFA_LABEL` = the string (IPv4 only).
    Label(String),
}

/// Decide the tag mode from what the kernel echoed back for an address just created with
/// `IFA_PROTO = ADDR_PROTO_VIPD`: the same value means the kernel supports it
/// ([`TagMode::Proto`]); anything else (absent, 0) means it silently dropped it, as kernels
/// before 5.18 do with unknown address attributes ([`TagMode::Label`]).
pub fn detect_tag_mode(echoed_proto: Option<u8>) -> TagMode {
    if echoed_proto == Some(ADDR_PROTO_VIPD) {
        TagMode::Proto
    } else {
        TagMode::Label
    }
}

/// The fallback IPv4 label for `ifname`: `<ifname>:vip`, or `None` when it would exceed the
/// kernel's 15-byte label limit (interface names longer than 11 bytes).
pub fn label_for(ifname: &str) -> Option<String> {
    let label = format!("{ifname}{LABEL_SUFFIX}");
    (label.len() <= MAX_LABEL_LEN).then_some(label)
}

/// The tag for `vip` on `ifname` under `mode` ([`TagMode::Unknown`] tries `IFA_PROTO`).
///
/// # Errors
/// [`NetError::TagUnsupported`] in label mode for IPv6 or for a name too long for a label.
pub fn tag_for(mode: TagMode, vip: Vip, ifname: &str) -> Result<Tag, NetError> {
    match mode {
        TagMode::Unknown | TagMode::Proto => Ok(Tag::Proto(ADDR_PROTO_VIPD)),
        TagMode::Label if vip.addr.is_ipv6() => Err(NetError::TagUnsupported {
            vip,
            ifname: ifname.to_string(),
            reason: "the kernel has no IFA_PROTO (Linux < 5.18) and IPv6 addresses have no labels",
        }),
        TagMode::Label => label_for(ifname).map(Tag::Label).ok_or(NetError::TagUnsupported {
            vip,
            ifname: ifname.to_string(),
            reason: "the kernel has no IFA_PROTO (Linux < 5.18) and \"<ifname>:vip\" exceeds the 15-byte label limit",
        }),
    }
}

/// Address flags decoded from the 8-bit header flags and, when present, the 32-bit
/// `IFA_FLAGS` attribute (which supersedes the header byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedFlags {
    /// `IFA_F_TENTATIVE`.
    pub tentative: bool,
    /// `IFA_F_DADFAILED`.
    pub dad_failed: bool,
    /// `IFA_F_SECONDARY`.
    pub secondary: bool,
}

/// Decode address flags (see [`DecodedFlags`]).
pub fn decode_addr_flags(header: u8, attr: Option<u32>) -> DecodedFlags {
    let bits = attr.unwrap_or(u32::from(header));
    let f = AddressFlags::from_bits_retain(bits);
    DecodedFlags {
        tentative: f.contains(AddressFlags::Tentative),
        dad_failed: f.contains(AddressFlags::Dadfailed),
        secondary: f.contains(AddressFlags::Secondary),
    }
}

/// The fields of one `RTM_NEWADDR` message that vipd looks at, before interpretation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawAddr {
    /// `ifa_index`.
    pub ifindex: u32,
    /// `ifa_prefixlen`.
    pub prefix: u8,
    /// `ifa_flags` (8 bits).
    pub header_flags: u8,
    /// `IFA_ADDRESS`.
    pub address: Option<IpAddr>,
    /// `IFA_LOCAL` (IPv4: the interface's own address; differs from `IFA_ADDRESS` on
    /// point-to-point links).
    pub local: Option<IpAddr>,
    /// `IFA_LABEL` (IPv4 only).
    pub label: Option<String>,
    /// `IFA_PROTO`.
    pub proto: Option<u8>,
    /// `IFA_FLAGS` (32 bits).
    pub flags: Option<u32>,
    /// `IFA_CACHEINFO` (`ifa_prefered`, `ifa_valid`) remaining seconds.
    pub lifetimes: Option<(u32, u32)>,
}

impl RawAddr {
    /// Extract the fields from a netlink message.
    pub(crate) fn from_message(msg: &AddressMessage) -> Self {
        let mut raw = Self {
            ifindex: msg.header.index,
            prefix: msg.header.prefix_len,
            header_flags: msg.header.flags.bits(),
            ..Self::default()
        };
        for attr in &msg.attributes {
            match attr {
                AddressAttribute::Address(a) => raw.address = Some(*a),
                AddressAttribute::Local(a) => raw.local = Some(*a),
                AddressAttribute::Label(l) => raw.label = Some(l.clone()),
                AddressAttribute::Protocol(p) => raw.proto = Some(u8::from(*p)),
                AddressAttribute::Flags(f) => raw.flags = Some(f.bits()),
                AddressAttribute::CacheInfo(c) => {
                    raw.lifetimes = Some((c.ifa_preferred, c.ifa_valid))
                }
                _ => {}
            }
        }
        raw
    }

    /// Interpret: `None` when the message carries no address. An address is ours when its
    /// `IFA_PROTO` is [`ADDR_PROTO_VIPD`] or (IPv4) its label ends in `:vip`.
    pub(crate) fn to_info(&self) -> Option<AddrInfo> {
        let addr = match (self.local, self.address) {
            (Some(IpAddr::V4(l)), _) => IpAddr::V4(l),
            (_, Some(a)) => a,
            (Some(l), None) => l,
            (None, None) => return None,
        };
        let flags = decode_addr_flags(self.header_flags, self.flags);
        let label_ours = addr.is_ipv4()
            && self
                .label
                .as_deref()
                .is_some_and(|l| l.ends_with(LABEL_SUFFIX) && l.len() > LABEL_SUFFIX.len());
        let finite = |v: u32| (v != INFINITY_LIFE_TIME).then_some(v);
        Some(AddrInfo {
            ifindex: self.ifindex,
            vip: Vip {
                addr,
                prefix: self.prefix,
            },
            ours: self.proto == Some(ADDR_PROTO_VIPD) || label_ours,
            tentative: flags.tentative,
            dad_failed: flags.dad_failed,
            valid_lft_secs: self.lifetimes.and_then(|(_, v)| finite(v)),
            preferred_lft_secs: self.lifetimes.and_then(|(p, _)| finite(p)),
            primary: !flags.secondary,
        })
    }
}

/// The kernel's errno (positive) in a netlink error reply, if it is one.
pub(super) fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| c.get().abs()),
        _ => None,
    }
}

fn link_info(msg: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        index: msg.header.index,
        name: String::new(),
        mac: [0; 6],
        up: msg.header.flags.contains(LinkFlags::Up),
        carrier: msg.header.flags.contains(LinkFlags::LowerUp),
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => info.name = n.clone(),
            LinkAttribute::Address(a) if a.len() == 6 => info.mac.copy_from_slice(a),
            LinkAttribute::Carrier(c) => info.carrier = *c != 0,
            _ => {}
        }
    }
    info
}

fn default_route(msg: &RouteMessage) -> Option<DefaultRoute> {
    let h = &msg.header;
    let mut table = u32::from(h.table);
    let mut metric = 0;
    let mut devices = Vec::new();
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Priority(p) => metric = *p,
            RouteAttribute::Oif(i) => devices = vec![*i],
            RouteAttribute::MultiPath(hops) => {
                devices = hops.iter().map(|n| n.interface_index).collect();
            }
            _ => {}
        }
    }
    let ok = h.destination_prefix_length == 0
        && table == u32::from(RouteHeader::RT_TABLE_MAIN)
        && h.kind == RouteType::Unicast;
    ok.then(|| DefaultRoute {
        ipv6: h.address_family == AddressFamily::Inet6,
        metric,
        devices,
    })
}

/// Receive buffer asked for on vipd's rtnetlink socket, in bytes.
const NETLINK_RX_BUFFER: usize = 4 << 20;

/// [`Kernel`] over an rtnetlink socket.
///
/// The socket lives in the network namespace of the thread that called
/// [`NetlinkKernel::new`]; its connection task runs on a thread of its own
/// ([`spawn_connection`]).
#[derive(Debug)]
pub struct NetlinkKernel {
    handle: Handle,
    tag_mode: AtomicU8,
    /// The kernel answers a second dump on the same netlink socket while one is running
    /// with `EBUSY`: dumps (addresses, routes) take turns.
    dump_lock: tokio::sync::Mutex<()>,
    /// The blocking socket that carries fence lifetimes ([`super::addr_socket`]).
    addr_socket: std::sync::Arc<AddrSocket>,
}

/// Opens the rtnetlink socket on a new thread (which shares the calling thread's network
/// namespace) and runs its connection there, on a single-threaded tokio runtime, until
/// every [`Handle`] is dropped. The kernel carries out an address delete or a dump inside
/// the `sendto`/`recvfrom` that sends or reads it, under the rtnl lock every netlink caller
/// of the machine shares; with thousands of IPv6 addresses a delete takes milliseconds, and
/// on the runtime's workers (two on a 2-core node) those calls held up the lease renewals
/// (the 10 000-Service bench: shard holders stepped down "could not renew within the renew
/// deadline" with the API server idle, docs/services-bench.md).
fn spawn_connection() -> Result<Handle, NetError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("vipd-rtnetlink".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                let (mut conn, handle, _messages) = match rtnetlink::new_connection() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                // A dump of a node with a thousand Service VIPs overruns the default receive
                // buffer (ENOBUFS); ask for 4 MiB (the kernel caps it at net.core.rmem_max).
                {
                    use netlink_sys::AsyncSocket;
                    if let Err(e) = conn
                        .socket_mut()
                        .socket_mut()
                        .set_rx_buf_sz(NETLINK_RX_BUFFER)
                    {
                        tracing::warn!(error = %e, "cannot enlarge the netlink receive buffer");
                    }
                }
                if tx.send(Ok(handle)).is_ok() {
                    conn.await;
                }
            });
        })
        .map_err(NetError::Socket)?;
    rx.recv()
        .map_err(|e| NetError::Socket(std::io::Error::other(e)))?
        .map_err(NetError::Socket)
}

impl NetlinkKernel {
    /// Opens the rtnetlink socket, its connection running on a thread of its own
    /// ([`spawn_connection`]), and the blocking socket for fence lifetimes.
    ///
    /// # Errors
    /// [`NetError::Socket`] when a socket, the thread or its runtime cannot be created.
    pub fn new() -> Result<Self, NetError> {
        let handle = spawn_connection()?;
        let addr_socket = std::sync::Arc::new(AddrSocket::open().map_err(NetError::Socket)?);
        Ok(Self {
            handle,
            tag_mode: AtomicU8::new(TagMode::Unknown.to_u8()),
            dump_lock: tokio::sync::Mutex::new(()),
            addr_socket,
        })
    }

    /// The rtnetlink handle, for the kernel layer's other modules ([`super::route`]).
    pub(super) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The blocking socket that carries fence lifetimes, for [`super::route`].
    pub(super) fn addr_socket(&self) -> std::sync::Arc<AddrSocket> {
        self.addr_socket.clone()
    }

    /// Waits for this socket's turn to dump (the kernel refuses a second dump on one
    /// netlink socket while one runs).
    pub(super) async fn dump_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.dump_lock.lock().await
    }

    /// The tag mode detected so far.
    pub fn tag_mode(&self) -> TagMode {
        TagMode::from_u8(self.tag_mode.load(Ordering::Relaxed))
    }

    fn set_tag_mode(&self, mode: TagMode) {
        self.tag_mode.store(mode.to_u8(), Ordering::Relaxed);
    }

    async fn dump_addrs(&self) -> Result<Vec<(AddressMessage, AddrInfo)>, NetError> {
        let _turn = self.dump_lock.lock().await;
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|source| NetError::Netlink {
            op: "dump addresses",
            target: "all interfaces".into(),
            source,
        })?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| RawAddr::from_message(&m).to_info().map(|i| (m, i)))
            .collect())
    }

    async fn default_routes(&self) -> Result<Vec<DefaultRoute>, NetError> {
        let _turn = self.dump_lock.lock().await;
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut req = RouteMessage::default();
            req.header.address_family = family;
            let msgs: Vec<RouteMessage> = self
                .handle
                .route()
                .get(req)
                .execute()
                .try_collect()
                .await
                .map_err(|source| NetError::Netlink {
                    op: "dump routes",
                    target: format!("{family:?}"),
                    source,
                })?;
            out.extend(msgs.iter().filter_map(default_route));
        }
        Ok(out)
    }

    async fn ifname(&self, index: u32) -> String {
        match self.link_by_index(index).await {
            Ok(l) => l.name,
            Err(_) => format!("#{index}"),
        }
    }

    /// Sends the add (or, `replace`, the refresh) through the blocking socket, with the
    /// lifetime computed from `lifetime` right before the kernel takes it
    /// ([`AddrSocket::add`]). Returns the seconds the address holds (0: not added, or
    /// deleted again because the kernel took the lifetime too late).
    async fn send_add(
        &self,
        ifindex: u32,
        vip: Vip,
        lifetime: Lifetime,
        skip_dad: bool,
        tag: &Tag,
        replace: bool,
    ) -> Result<u32, rtnetlink::Error> {
        // rtnetlink builds the message (address, local, broadcast attributes); it is sent
        // on the blocking socket, not through the request's `execute`.
        let mut req = self.handle.address().add(ifindex, vip.addr, vip.prefix);
        let mut msg = req.message_mut().clone();
        match tag {
            Tag::Proto(p) => msg
                .attributes
                .push(AddressAttribute::Protocol(AddressProtocol::from(*p))),
            Tag::Label(l) => msg.attributes.push(AddressAttribute::Label(l.clone())),
        }
        let flags = super::addr_socket::vip_flags(&vip, skip_dad);
        let sock = self.addr_socket.clone();
        tokio::task::spawn_blocking(move || sock.add(&msg, &lifetime, flags, replace))
            .await
            .map_err(|_| rtnetlink::Error::RequestFailed)?
    }

    /// Delete exactly the address described by a dumped message.
    async fn send_del(&self, msg: AddressMessage) -> Result<(), rtnetlink::Error> {
        match self.handle.address().del(msg).execute().await {
            Err(e) if matches!(errno(&e), Some(EADDRNOTAVAIL | ENOENT | ENODEV)) => Ok(()),
            r => r,
        }
    }

    /// [`Kernel::add_or_refresh`] on `link`; `known`: the node's addresses as the caller
    /// read them (`None`: read them now). When the kernel answers `EEXIST` to an add that
    /// `known` called new (the address appeared since that read), the add is decided again
    /// on a fresh read ([`Kernel::add_or_refresh_many`]).
    async fn add_or_refresh_on(
        &self,
        link: &LinkInfo,
        vip: Vip,
        lifetime: Lifetime,
        skip_dad: bool,
        known: Option<&[AddrInfo]>,
    ) -> Result<u32, NetError> {
        if known.is_some() {
            match self
                .add_or_refresh_read(link, vip, lifetime, skip_dad, known)
                .await
            {
                Err(NetError::Netlink { source, .. }) if errno(&source) == Some(EEXIST) => {}
                r => return r,
            }
        }
        self.add_or_refresh_read(link, vip, lifetime, skip_dad, None)
            .await
    }

    /// [`Self::add_or_refresh_on`] with one reading of the node's addresses (`known`, or
    /// a dump when `None`). A retry after the kernel refused the tag reads them again.
    async fn add_or_refresh_read(
        &self,
        link: &LinkInfo,
        vip: Vip,
        lifetime: Lifetime,
        skip_dad: bool,
        known: Option<&[AddrInfo]>,
    ) -> Result<u32, NetError> {
        let ifindex = link.index;
        vip.check()?;
        if lifetime.max_secs == 0 || lifetime.max_secs == INFINITY_LIFE_TIME {
            return Err(NetError::InvalidLifetime {
                vip,
                value: lifetime.max_secs,
            });
        }
        let target = || format!("{vip} on {} (index {ifindex})", link.name);
        // At most: one try with IFA_PROTO, one with the label fallback.
        for attempt in 0..2 {
            let existing = match known {
                Some(addrs) if attempt == 0 => {
                    self.existing_ours_in(addrs.iter(), ifindex, vip).await?
                }
                _ => self.existing_ours(ifindex, vip).await?,
            };
            let mode = self.tag_mode();
            let tag = tag_for(mode, vip, &link.name)?;
            let held = match self
                .send_add(ifindex, vip, lifetime, skip_dad, &tag, existing)
                .await
            {
                Ok(held) => held,
                Err(e)
                    if mode == TagMode::Unknown
                        && matches!(errno(&e), Some(EINVAL | EOPNOTSUPP)) =>
                {
                    // The kernel rejected IFA_PROTO: fall back to labels and retry.
                    self.set_tag_mode(TagMode::Label);
                    continue;
                }
                Err(e) if errno(&e) == Some(EEXIST) => {
                    return Err(self.add_exists_error(vip, e, &target).await);
                }
                Err(source) => {
                    return Err(NetError::Netlink {
                        op: "add address",
                        target: target(),
                        source,
                    });
                }
            };
            if mode != TagMode::Unknown || existing || held == 0 {
                return Ok(held);
            }
            // First address created by this process: did the kernel keep IFA_PROTO?
            if self.kept_tag(ifindex, vip, &target).await? {
                return Ok(held);
            }
        }
        // Second pass failed to tag as well.
        tag_for(TagMode::Label, vip, &link.name).map(|_| ())?;
        Err(NetError::TagUnsupported {
            vip,
            ifname: link.name.clone(),
            reason: "the kernel kept neither IFA_PROTO nor the label",
        })
    }

    /// [`Kernel::remove`] against the dump `addrs`: deletes the entry of `vip` on
    /// `ifindex` found there (absent: `Ok`).
    async fn remove_in(
        &self,
        addrs: &[(AddressMessage, AddrInfo)],
        ifindex: u32,
        vip: Vip,
    ) -> Result<(), NetError> {
        let Some((msg, info)) = addrs.iter().find(|(_, a)| {
            a.ifindex == ifindex && a.vip.addr == vip.addr && a.vip.prefix == vip.prefix
        }) else {
            return Ok(());
        };
        if !info.ours {
            return Err(NetError::NotOurs {
                addr: vip.addr,
                ifindex,
                ifname: self.ifname(ifindex).await,
            });
        }
        self.send_del(msg.clone())
            .await
            .map_err(|source| NetError::Netlink {
                op: "remove address",
                target: format!("{vip} on index {ifindex}"),
                source,
            })
    }

    /// Whether `vip` is on `ifindex` already (same prefix); [`NetError::NotOurs`] when any
    /// interface carries its address without vipd's tag.
    async fn existing_ours(&self, ifindex: u32, vip: Vip) -> Result<bool, NetError> {
        let addrs = self.dump_addrs().await?;
        self.existing_ours_in(addrs.iter().map(|(_, a)| a), ifindex, vip)
            .await
    }

    /// [`Self::existing_ours`] against the addresses `addrs`.
    async fn existing_ours_in<'a>(
        &self,
        addrs: impl Iterator<Item = &'a AddrInfo> + Send,
        ifindex: u32,
        vip: Vip,
    ) -> Result<bool, NetError> {
        let mut existing = false;
        for a in addrs.filter(|a| a.vip.addr == vip.addr) {
            if !a.ours {
                return Err(NetError::NotOurs {
                    addr: vip.addr,
                    ifindex: a.ifindex,
                    ifname: self.ifname(a.ifindex).await,
                });
            }
            existing |= a.ifindex == ifindex && a.vip.prefix == vip.prefix;
        }
        Ok(existing)
    }

    /// The error of an add of `vip` the kernel refused with `EEXIST` (`e`): the address
    /// appeared between our dump and the add; [`NetError::NotOurs`] when it is not ours.
    async fn add_exists_error(
        &self,
        vip: Vip,
        e: rtnetlink::Error,
        target: &impl Fn() -> String,
    ) -> NetError {
        // Appeared between our dump and the add: find out whose it is.
        let addrs = match self.dump_addrs().await {
            Ok(addrs) => addrs,
            Err(dump) => return dump,
        };
        if let Some((_, a)) = addrs
            .iter()
            .find(|(_, a)| a.vip.addr == vip.addr && !a.ours)
        {
            return NetError::NotOurs {
                addr: vip.addr,
                ifindex: a.ifindex,
                ifname: self.ifname(a.ifindex).await,
            };
        }
        NetError::Netlink {
            op: "add address",
            target: target(),
            source: e,
        }
    }

    /// After the first address this process created (`vip` on `ifindex`, tag mode still
    /// unknown): detects whether the kernel kept IFA_PROTO. `true` when the add is done;
    /// `false` when the address came back untagged and was removed, to be added again with
    /// a label.
    async fn kept_tag(
        &self,
        ifindex: u32,
        vip: Vip,
        target: &impl Fn() -> String,
    ) -> Result<bool, NetError> {
        let addrs = self.dump_addrs().await?;
        let Some((msg, _)) = addrs.into_iter().find(|(_, a)| {
            a.ifindex == ifindex && a.vip.addr == vip.addr && a.vip.prefix == vip.prefix
        }) else {
            // Gone already (expired or removed meanwhile); decide next time.
            return Ok(true);
        };
        let detected = detect_tag_mode(RawAddr::from_message(&msg).proto);
        self.set_tag_mode(detected);
        if detected == TagMode::Proto {
            return Ok(true);
        }
        // The address we just created (NLM_F_EXCL, so it is ours) is untagged: replace it
        // with a labelled one, or remove it when it cannot be tagged.
        self.send_del(msg)
            .await
            .map_err(|source| NetError::Netlink {
                op: "remove untaggable address",
                target: target(),
                source,
            })?;
        Ok(false)
    }
}

impl Kernel for NetlinkKernel {
    async fn link_by_name(&self, name: &str) -> Result<LinkInfo, NetError> {
        let res: Result<Option<LinkMessage>, _> = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute()
            .try_next()
            .await;
        match res {
            Ok(Some(m)) => Ok(link_info(&m)),
            Ok(None) => Err(NetError::NoSuchLink { name: name.into() }),
            Err(e) if errno(&e) == Some(ENODEV) => Err(NetError::NoSuchLink { name: name.into() }),
            Err(source) => Err(NetError::Netlink {
                op: "get link",
                target: format!("interface {name:?}"),
                source,
            }),
        }
    }

    async fn link_by_index(&self, index: u32) -> Result<LinkInfo, NetError> {
        let res: Result<Option<LinkMessage>, _> = self
            .handle
            .link()
            .get()
            .match_index(index)
            .execute()
            .try_next()
            .await;
        match res {
            Ok(Some(m)) => Ok(link_info(&m)),
            Ok(None) => Err(NetError::NoSuchIndex { index }),
            Err(e) if errno(&e) == Some(ENODEV) => Err(NetError::NoSuchIndex { index }),
            Err(source) => Err(NetError::Netlink {
                op: "get link",
                target: format!("interface index {index}"),
                source,
            }),
        }
    }

    async fn add_or_refresh(
        &self,
        ifindex: u32,
        vip: Vip,
        lifetime: Lifetime,
        skip_dad: bool,
    ) -> Result<u32, NetError> {
        let link = self.link_by_index(ifindex).await?;
        self.add_or_refresh_on(&link, vip, lifetime, skip_dad, None)
            .await
    }

    async fn add_or_refresh_many(
        &self,
        items: &[(u32, Vip, Lifetime)],
        skip_dad: bool,
        known: Option<&[AddrInfo]>,
    ) -> Vec<Result<u32, NetError>> {
        // At most one dump and one query per interface for the whole batch: per VIP, a
        // holder of hundreds of VIPs (a shard lease) dumped every address of the node for
        // each one at every renewal, and the last ones got their lifetime after the lease
        // had run low. With `known`, no dump at all, unless it says a VIP of the batch is
        // in place: a refresh (`NLM_F_REPLACE`) rewrites whatever address the kernel has
        // there, and one decided on an older reading took over an untagged copy added
        // since vipd's went (tagged it vipd's, with vipd's lifetime; found by the new-user
        // trial). An add is safe on `known`: the kernel refuses it (`EEXIST`) when the
        // address is there, and it is decided again on a fresh read.
        let known = known.filter(|known| {
            let batch: std::collections::HashSet<(u32, Vip)> =
                items.iter().map(|(i, v, _)| (*i, *v)).collect();
            !known
                .iter()
                .any(|a| a.ours && batch.contains(&(a.ifindex, a.vip)))
        });
        let dumped: Vec<AddrInfo>;
        let addrs: Option<&[AddrInfo]> = match known {
            Some(known) => Some(known),
            None => match self.dump_addrs().await {
                Ok(all) => {
                    dumped = all.into_iter().map(|(_, a)| a).collect();
                    Some(&dumped)
                }
                Err(_) => None,
            },
        };
        let mut links: Vec<(u32, Result<LinkInfo, NetError>)> = Vec::new();
        let mut out = Vec::with_capacity(items.len());
        for (ifindex, vip, lifetime) in items {
            if !links.iter().any(|(i, _)| i == ifindex) {
                links.push((*ifindex, self.link_by_index(*ifindex).await));
            }
            let link = links.iter().find(|(i, _)| i == ifindex).map(|(_, l)| l);
            let r = match (link, addrs) {
                (Some(Ok(link)), Some(addrs)) => {
                    self.add_or_refresh_on(link, *vip, *lifetime, skip_dad, Some(addrs))
                        .await
                }
                // Without the shared reads, each VIP the one-by-one way (its own errors).
                _ => {
                    self.add_or_refresh(*ifindex, *vip, *lifetime, skip_dad)
                        .await
                }
            };
            out.push(r);
        }
        out
    }

    async fn remove(&self, ifindex: u32, vip: Vip) -> Result<(), NetError> {
        let addrs = self.dump_addrs().await?;
        self.remove_in(&addrs, ifindex, vip).await
    }

    async fn remove_many(&self, items: &[(u32, Vip)]) -> Vec<Result<(), NetError>> {
        // One dump for the whole batch; without it, each VIP the one-by-one way.
        let addrs = match self.dump_addrs().await {
            Ok(addrs) => addrs,
            Err(_) => {
                let mut out = Vec::with_capacity(items.len());
                for (ifindex, vip) in items {
                    out.push(self.remove(*ifindex, *vip).await);
                }
                return out;
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (ifindex, vip) in items {
            out.push(self.remove_in(&addrs, *ifindex, *vip).await);
        }
        out
    }

    async fn addresses(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        Ok(self
            .dump_addrs()
            .await?
            .into_iter()
            .map(|(_, a)| a)
            .filter(|a| ifindex.is_none_or(|i| a.ifindex == i))
            .collect())
    }

    async fn choose_interface(&self, addr: IpAddr) -> Result<u32, NetError> {
        let addrs = self.addresses(None).await?;
        // Only consult routes when no connected subnet matches.
        if let Some(i) = choose_interface_from(addr, &addrs, &[]) {
            return Ok(i);
        }
        let routes = self.default_routes().await?;
        choose_interface_from(addr, &addrs, &routes).ok_or(NetError::NoInterface { addr })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::address::{AddressHeaderFlags, CacheInfo};

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn tag_mode_detection() {
        assert_eq!(detect_tag_mode(Some(ADDR_PROTO_VIPD)), TagMode::Proto);
        assert_eq!(detect_tag_mode(None), TagMode::Label);
        assert_eq!(detect_tag_mode(Some(0)), TagMode::Label);
        for m in [TagMode::Unknown, TagMode::Proto, TagMode::Label] {
            assert_eq!(TagMode::from_u8(m.to_u8()), m);
        }
    }

    #[test]
    fn label_fallback() {
        assert_eq!(label_for("eth0").as_deref(), Some("eth0:vip"));
        assert_eq!(label_for("enp0s31f6abc").as_deref(), None); // 12 + 4 > 15
        assert_eq!(label_for("enp0s31f6ab").as_deref(), Some("enp0s31f6ab:vip"));
        let vip4 = Vip::host(v4("192.0.2.10"));
        let vip6 = Vip::host(v4("2001:db8::10"));
        assert_eq!(
            tag_for(TagMode::Unknown, vip4, "eth0").unwrap(),
            Tag::Proto(ADDR_PROTO_VIPD)
        );
        assert_eq!(
            tag_for(TagMode::Proto, vip6, "eth0").unwrap(),
            Tag::Proto(ADDR_PROTO_VIPD)
        );
        assert_eq!(
            tag_for(TagMode::Label, vip4, "eth0").unwrap(),
            Tag::Label("eth0:vip".into())
        );
        let e = tag_for(TagMode::Label, vip6, "eth0").unwrap_err();
        assert!(
            e.to_string().contains("2001:db8::10/128") && e.to_string().contains("eth0"),
            "{e}"
        );
        assert!(tag_for(TagMode::Label, vip4, "averylonginterface").is_err());
    }

    #[test]
    fn flag_decoding() {
        let none = decode_addr_flags(0, None);
        assert!(!none.tentative && !none.dad_failed && !none.secondary);
        // header byte only: IFA_F_SECONDARY | IFA_F_TENTATIVE
        let h = decode_addr_flags(0x41, None);
        assert!(h.secondary && h.tentative && !h.dad_failed);
        // IFA_FLAGS supersedes the header byte: dadfailed + noprefixroute (0x200, > 8 bits)
        let a = decode_addr_flags(0x41, Some(0x208));
        assert!(a.dad_failed && !a.tentative && !a.secondary);
    }

    #[test]
    fn raw_addr_interpretation() {
        let mut r = RawAddr {
            ifindex: 3,
            prefix: 32,
            address: Some(v4("192.0.2.10")),
            local: Some(v4("192.0.2.10")),
            label: Some("v0".into()),
            proto: Some(ADDR_PROTO_VIPD),
            flags: Some(0x20), // deprecated
            lifetimes: Some((0, 2)),
            ..RawAddr::default()
        };
        let i = r.to_info().unwrap();
        assert_eq!(i.vip, Vip::host(v4("192.0.2.10")));
        assert!(i.ours && i.primary && !i.tentative);
        assert_eq!(i.valid_lft_secs, Some(2));
        assert_eq!(i.preferred_lft_secs, Some(0));

        r.proto = None;
        assert!(!r.to_info().unwrap().ours);
        r.label = Some("v0:vip".into());
        assert!(r.to_info().unwrap().ours, "label fallback recognised");
        r.label = Some(":vip".into());
        assert!(!r.to_info().unwrap().ours);

        r.lifetimes = Some((u32::MAX, u32::MAX));
        let i = r.to_info().unwrap();
        assert_eq!((i.valid_lft_secs, i.preferred_lft_secs), (None, None));

        // point-to-point IPv4: IFA_LOCAL is ours, IFA_ADDRESS is the peer.
        r.address = Some(v4("192.0.2.99"));
        assert_eq!(r.to_info().unwrap().vip.addr, v4("192.0.2.10"));

        // IPv6 with a label-looking string is not ours (labels are IPv4 only), IFA_ADDRESS used.
        let r6 = RawAddr {
            prefix: 128,
            address: Some(v4("2001:db8::10")),
            label: Some("x:vip".into()),
            header_flags: 0x40,
            ..RawAddr::default()
        };
        let i6 = r6.to_info().unwrap();
        assert!(!i6.ours && i6.tentative);
        assert_eq!(RawAddr::default().to_info(), None);
    }

    #[test]
    fn decode_real_message() {
        let mut m = AddressMessage::default();
        m.header.family = AddressFamily::Inet6;
        m.header.prefix_len = 128;
        m.header.index = 7;
        m.header.flags = AddressHeaderFlags::Nodad;
        let mut ci = CacheInfo::default();
        ci.ifa_preferred = 0;
        ci.ifa_valid = 9;
        m.attributes
            .push(AddressAttribute::Address(v4("2001:db8::10")));
        m.attributes.push(AddressAttribute::CacheInfo(ci));
        m.attributes.push(AddressAttribute::Flags(
            AddressFlags::Nodad | AddressFlags::Dadfailed,
        ));
        m.attributes
            .push(AddressAttribute::Protocol(AddressProtocol::from(
                ADDR_PROTO_VIPD,
            )));
        let i = RawAddr::from_message(&m).to_info().unwrap();
        assert_eq!(i.ifindex, 7);
        assert_eq!(i.vip.to_string(), "2001:db8::10/128");
        assert!(i.ours && i.dad_failed && !i.tentative && i.primary);
        assert_eq!(i.valid_lft_secs, Some(9));
    }

    #[test]
    fn default_route_filtering() {
        use netlink_packet_route::route::RouteNextHop;
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.kind = RouteType::Unicast;
        m.attributes.push(RouteAttribute::Priority(50));
        let mut a = RouteNextHop::default();
        a.interface_index = 4;
        let mut b = RouteNextHop::default();
        b.interface_index = 2;
        m.attributes.push(RouteAttribute::MultiPath(vec![a, b]));
        assert_eq!(
            default_route(&m),
            Some(DefaultRoute {
                ipv6: false,
                metric: 50,
                devices: vec![4, 2]
            })
        );
        let mut local = m.clone();
        local.header.table = 255;
        assert_eq!(default_route(&local), None);
        let mut other = m.clone();
        other.attributes.push(RouteAttribute::Table(100));
        assert_eq!(default_route(&other), None);
        let mut not_default = m.clone();
        not_default.header.destination_prefix_length = 24;
        assert_eq!(default_route(&not_default), None);
    }
}
