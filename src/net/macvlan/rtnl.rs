//! [`NetlinkMacvlans`]: the production [`MacvlanKernel`], over rtnetlink and `/proc/sys`.

use futures::TryStreamExt;
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoKind, LinkAttribute, LinkInfo as NlLinkInfo,
    LinkMessage, MacVlanMode,
};
use rtnetlink::{Handle, LinkMacVlan, LinkUnspec};

use super::{ConfFamily, LinkEntry, MacvlanError, MacvlanKernel, Neighbour, format_mac};
use crate::net::addr_socket::set_lifetimes;
use crate::net::netlink::{EAFNOSUPPORT, ENODEV, errno};

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
            Err(e) => match crate::net::netlink::errno(&e) {
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
            .filter_map(|m| crate::net::netlink::RawAddr::from_message(m).to_info())
            .filter(|a| a.ifindex == parent_index && !a.tentative && !a.dad_failed)
            .find_map(|a| match a.vip.addr {
                std::net::IpAddr::V6(v6) if v6.is_unicast_link_local() => Some(v6),
                _ => None,
            });
        let Some(src) = link_local else {
            tracing::debug!(parent, mac = %format_mac(&mac), "the parent has no IPv6 link-local: not asking who uses the MAC");
            return Ok(None);
        };
        let answer = crate::net::mac_in_use::mac_answers(
            parent_index,
            parent_mac,
            src,
            mac,
            crate::net::mac_in_use::MAC_PROBE_WAIT,
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
        set_lifetimes(
            req.message_mut(),
            lifetime_secs,
            lifetime_secs,
            netlink_packet_route::address::AddressFlags::Nodad,
        );
        req.replace()
            .execute()
            .await
            .map_err(err("add link-local"))?;
        Ok(true)
    }
}
