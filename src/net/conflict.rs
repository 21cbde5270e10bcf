//! Address conflict detection: is another host on the segment answering for an address?
//!
//! IPv4 follows RFC 5227 ("IPv4 Address Conflict Detection"): before a VIP is bound, ARP
//! probes (§2.1.1: sender IP `0.0.0.0`, target IP = the VIP) are sent and the address is
//! refused if any ARP packet claims it (sender IP = the VIP) from another MAC, or another
//! host probes for it at the same time; while the VIP is held, any ARP packet from another MAC
//! with the VIP as sender IP is a conflict (§2.4). IPv6 does the same with duplicate address
//! detection style neighbour solicitations (RFC 4862 §5.4.2: source `::`, to the solicited-node
//! group, no options) and neighbour advertisements for the address from other MACs.
//!
//! The frame builders and [`claim_in_frame`] are pure; [`RawConflictMonitor`] puts probes on
//! the wire and reads ARP and neighbour discovery frames from two `AF_PACKET` sockets (one
//! for ARP only, one for IPv6 with a classic BPF filter that passes only ICMPv6 neighbour
//! solicitations and advertisements, so ordinary traffic never reaches user space).

#[cfg(test)]
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pnet::packet::MutablePacket;
use pnet::packet::Packet;
use pnet::packet::arp::{ArpHardwareTypes, ArpOperations, ArpPacket};
use pnet::packet::ethernet::{EtherTypes, EthernetPacket, MutableEthernetPacket};
use pnet::packet::icmpv6::ndp::{
    MutableNeighborSolicitPacket, NdpOptionTypes, NeighborAdvertPacket, NeighborSolicitPacket,
};
use pnet::packet::icmpv6::{self, Icmpv6Code, Icmpv6Packet, Icmpv6Types};
use pnet::packet::ip::IpNextHeaderProtocols;
use pnet::packet::ipv6::{Ipv6Packet, MutableIpv6Packet};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::arp::{arp_request_frame, mac_of, send_frame};
use super::{LinkInfo, NetError, Vip};

/// Probes sent per probe window (RFC 5227 sends 3 over 1-3 s; vipd compresses the window
/// to tens of ms because a LAN answers within a millisecond and failover time matters).
pub const PROBES: u32 = 2;

/// Ethernet header length in bytes.
const ETH_LEN: usize = 14;
/// `ETH_P_ARP`.
const ETH_P_ARP: u16 = 0x0806;
/// `ETH_P_IPV6`.
pub(super) const ETH_P_IPV6: u16 = 0x86dd;
/// `PACKET_OUTGOING`: a frame this host sent, looped back to packet sockets.
const PACKET_OUTGOING: u8 = 4;

/// An RFC 5227 §2.1.1 ARP probe (42 bytes): Ethernet dst broadcast, src `mac`; ARP request
/// with sender MAC `mac`, sender IP `0.0.0.0` (so no host updates its ARP cache from it),
/// target MAC zero, target IP `target`. A host that has `target` answers it.
pub(crate) fn arp_probe_frame(mac: [u8; 6], target: Ipv4Addr) -> Vec<u8> {
    arp_request_frame(mac, Ipv4Addr::UNSPECIFIED, target)
}

/// The solicited-node multicast address of `ip` (RFC 4291 §2.7.1: `ff02::1:ffXX:XXXX`) and
/// its Ethernet address (RFC 2464 §7: `33:33` + the low 32 bits).
pub fn solicited_node(ip: Ipv6Addr) -> (Ipv6Addr, [u8; 6]) {
    let o = ip.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        (u16::from(o[14]) << 8) | u16::from(o[15]),
    );
    (group, [0x33, 0x33, 0xff, o[13], o[14], o[15]])
}

/// A duplicate address detection probe (RFC 4862 §5.4.2; 78 bytes): a neighbour solicitation
/// from `::` to the solicited-node group of `target`, hop limit 255, target = `target`, no
/// options (a source link-layer option is forbidden with an unspecified source), Ethernet src
/// `mac`. A host that has `target` answers with a neighbour advertisement to `ff02::1`.
pub fn dad_probe_frame(mac: [u8; 6], target: Ipv6Addr) -> Vec<u8> {
    const NS_LEN: usize = 24;
    let (group, group_mac) = solicited_node(target);
    let mut buf = vec![0u8; ETH_LEN + 40 + NS_LEN];
    if let Some(mut eth) = MutableEthernetPacket::new(&mut buf) {
        eth.set_destination(mac_of(group_mac));
        eth.set_source(mac_of(mac));
        eth.set_ethertype(EtherTypes::Ipv6);
        if let Some(mut ip6) = MutableIpv6Packet::new(eth.payload_mut()) {
            ip6.set_version(6);
            ip6.set_payload_length(NS_LEN as u16);
            ip6.set_next_header(IpNextHeaderProtocols::Icmpv6);
            ip6.set_hop_limit(255);
            ip6.set_source(Ipv6Addr::UNSPECIFIED);
            ip6.set_destination(group);
            if let Some(mut ns) = MutableNeighborSolicitPacket::new(ip6.payload_mut()) {
                ns.set_icmpv6_type(Icmpv6Types::NeighborSolicit);
                ns.set_icmpv6_code(Icmpv6Code(0));
                ns.set_target_addr(target);
                ns.set_checksum(0);
            }
            let sum = Icmpv6Packet::new(ip6.payload_mut())
                .map(|p| icmpv6::checksum(&p, &Ipv6Addr::UNSPECIFIED, &group));
            if let (Some(sum), Some(mut ns)) =
                (sum, MutableNeighborSolicitPacket::new(ip6.payload_mut()))
            {
                ns.set_checksum(sum);
            }
        }
    }
    buf
}

/// What one frame says about an address: the host with `mac` uses `addr` (`probing` false),
/// or is probing for it (`probing` true: an ARP probe or a DAD neighbour solicitation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The address claimed.
    pub addr: IpAddr,
    /// The claimant's MAC: the ARP sender hardware address, the neighbour advertisement's
    /// target link-layer address option, else the Ethernet source.
    pub mac: [u8; 6],
    /// `true` for a probe: the claimant does not have the address yet. RFC 5227 §2.1.1 counts
    /// a probe as a conflict only while we probe ourselves (two hosts probing at once); a
    /// holder defends against probes by answering them (the kernel does).
    pub probing: bool,
}

/// The address the sender of an Ethernet frame claims, if the frame is an ARP packet
/// (Ethernet/IPv4, any operation), an ICMPv6 neighbour advertisement, or a neighbour
/// solicitation. ARP with sender IP `0.0.0.0` and a solicitation from `::` are probes for
/// their target; other ARP packets claim their sender IP, advertisements their target, and
/// other solicitations their IPv6 source. Anything else, or a truncated frame: `None`.
pub(crate) fn claim_in_frame(frame: &[u8]) -> Option<Claim> {
    let eth = EthernetPacket::new(frame)?;
    let eth_src = eth.get_source().octets();
    match eth.get_ethertype() {
        EtherTypes::Arp => {
            let arp = ArpPacket::new(eth.payload())?;
            if arp.get_hardware_type() != ArpHardwareTypes::Ethernet
                || arp.get_protocol_type() != EtherTypes::Ipv4
                || arp.get_hw_addr_len() != 6
                || arp.get_proto_addr_len() != 4
            {
                return None;
            }
            let mac = arp.get_sender_hw_addr().octets();
            let sender = arp.get_sender_proto_addr();
            if sender.is_unspecified() {
                (arp.get_operation() == ArpOperations::Request).then(|| Claim {
                    addr: IpAddr::V4(arp.get_target_proto_addr()),
                    mac,
                    probing: true,
                })
            } else {
                Some(Claim {
                    addr: IpAddr::V4(sender),
                    mac,
                    probing: false,
                })
            }
        }
        EtherTypes::Ipv6 => {
            let ip6 = Ipv6Packet::new(eth.payload())?;
            if ip6.get_next_header() != IpNextHeaderProtocols::Icmpv6 || ip6.get_hop_limit() != 255
            {
                return None;
            }
            let icmp = Icmpv6Packet::new(ip6.payload())?;
            match icmp.get_icmpv6_type() {
                Icmpv6Types::NeighborAdvert => {
                    let na = NeighborAdvertPacket::new(ip6.payload())?;
                    let mac = ll_option(&na.get_options(), NdpOptionTypes::TargetLLAddr)
                        .unwrap_or(eth_src);
                    Some(Claim {
                        addr: IpAddr::V6(na.get_target_addr()),
                        mac,
                        probing: false,
                    })
                }
                Icmpv6Types::NeighborSolicit => {
                    let ns = NeighborSolicitPacket::new(ip6.payload())?;
                    let src = ip6.get_source();
                    if src.is_unspecified() {
                        Some(Claim {
                            addr: IpAddr::V6(ns.get_target_addr()),
                            mac: eth_src,
                            probing: true,
                        })
                    } else {
                        let mac = ll_option(&ns.get_options(), NdpOptionTypes::SourceLLAddr)
                            .unwrap_or(eth_src);
                        Some(Claim {
                            addr: IpAddr::V6(src),
                            mac,
                            probing: false,
                        })
                    }
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The Ethernet address in the first link-layer address option of `kind` (RFC 4861 §4.6.1:
/// source or target), if any.
fn ll_option(
    options: &[pnet::packet::icmpv6::ndp::NdpOption],
    kind: pnet::packet::icmpv6::ndp::NdpOptionType,
) -> Option<[u8; 6]> {
    options
        .iter()
        .find(|o| o.option_type == kind)
        .and_then(|o| <[u8; 6]>::try_from(o.data.get(..6)?).ok())
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`, for logs and Events.
pub(crate) fn fmt_mac(mac: [u8; 6]) -> String {
    mac_of(mac).to_string()
}

/// Identifies one [`ConflictMonitor::watch`] registration.
pub(crate) type WatchId = u64;

/// Probing and watching for other hosts that claim an address (see module docs). The VIP
/// holder drives the RFC 5227 decisions; implementations only send probes and deliver claims.
pub trait ConflictMonitor: Send + Sync + std::fmt::Debug + 'static {
    /// Delivers to `tx` every [`Claim`] for `addr` seen on `link` from a MAC other than
    /// `link.mac`, until [`ConflictMonitor::unwatch`] with the returned id.
    ///
    /// # Errors
    /// [`NetError::Capture`] when the capture socket cannot be opened.
    fn watch(
        &self,
        link: &LinkInfo,
        addr: IpAddr,
        tx: mpsc::UnboundedSender<Claim>,
    ) -> Result<WatchId, NetError>;

    /// Ends a watch; unknown ids are ignored.
    fn unwatch(&self, id: WatchId);

    /// Sends one probe for `addr` on `link`: an ARP probe (IPv4) or a DAD neighbour
    /// solicitation (IPv6), see [`arp_probe_frame`] and [`dad_probe_frame`].
    ///
    /// # Errors
    /// [`NetError::Announce`] when the frame cannot be sent.
    fn send_probe(&self, link: &LinkInfo, addr: IpAddr) -> Result<(), NetError>;
}

struct Subscriber {
    id: WatchId,
    ifindex: u32,
    addr: IpAddr,
    own_mac: [u8; 6],
    tx: mpsc::UnboundedSender<Claim>,
}

#[derive(Default)]
struct Subscribers {
    next_id: WatchId,
    list: Vec<Subscriber>,
    /// Capture tasks started, by family (IPv4 = ARP socket, IPv6 = ND socket).
    v4_started: bool,
    v6_started: bool,
}

/// [`ConflictMonitor`] on raw `AF_PACKET` sockets (needs `CAP_NET_RAW`; sockets live in the
/// network namespace of the thread that first watches a family). One ARP socket and one
/// neighbour-discovery socket serve every interface and VIP of the process; they are opened on
/// the first watch of their family and kept for the process lifetime. Must be used inside a
/// Tokio runtime.
#[derive(Clone, Default)]
pub(crate) struct RawConflictMonitor {
    subs: Arc<Mutex<Subscribers>>,
}

impl std::fmt::Debug for RawConflictMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RawConflictMonitor")
    }
}

impl RawConflictMonitor {
    /// A monitor with no sockets open yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn dispatch(subs: &Mutex<Subscribers>, ifindex: u32, claim: Claim) {
        let Ok(mut s) = subs.lock() else {
            return;
        };
        s.list.retain(|sub| {
            if sub.ifindex != ifindex || sub.addr != claim.addr || sub.own_mac == claim.mac {
                return true;
            }
            // A receiver that is gone unsubscribes itself.
            sub.tx.send(claim).is_ok()
        });
    }

    fn start_capture(&self, v6: bool) -> Result<(), NetError> {
        let sock = open_capture(v6)?;
        let fd = register_capture(sock).map_err(|source| NetError::Capture {
            what: "register the capture socket",
            source,
        })?;
        let subs = self.subs.clone();
        tokio::spawn(async move {
            let failed = read_frames(&fd, "conflict capture", |frame, ifindex| {
                if let Some(claim) = claim_in_frame(frame) {
                    Self::dispatch(&subs, ifindex, claim);
                }
                true
            })
            .await;
            if let Some(e) = failed {
                warn!(error = %e, "conflict capture socket failed; conflict detection stopped");
            }
        });
        Ok(())
    }
}

impl ConflictMonitor for RawConflictMonitor {
    fn watch(
        &self,
        link: &LinkInfo,
        addr: IpAddr,
        tx: mpsc::UnboundedSender<Claim>,
    ) -> Result<WatchId, NetError> {
        let v6 = addr.is_ipv6();
        let start = {
            let s = self.subs.lock().map_err(|_| NetError::Capture {
                what: "lock the subscriber list",
                source: std::io::Error::other("poisoned"),
            })?;
            if v6 { !s.v6_started } else { !s.v4_started }
        };
        if start {
            self.start_capture(v6)?;
        }
        let mut s = self.subs.lock().map_err(|_| NetError::Capture {
            what: "lock the subscriber list",
            source: std::io::Error::other("poisoned"),
        })?;
        if v6 {
            s.v6_started = true;
        } else {
            s.v4_started = true;
        }
        s.next_id += 1;
        let id = s.next_id;
        s.list.push(Subscriber {
            id,
            ifindex: link.index,
            addr,
            own_mac: link.mac,
            tx,
        });
        Ok(id)
    }

    fn unwatch(&self, id: WatchId) {
        if let Ok(mut s) = self.subs.lock() {
            s.list.retain(|sub| sub.id != id);
        }
    }

    fn send_probe(&self, link: &LinkInfo, addr: IpAddr) -> Result<(), NetError> {
        let frame = match addr {
            IpAddr::V4(ip) => arp_probe_frame(link.mac, ip),
            IpAddr::V6(ip) => dad_probe_frame(link.mac, ip),
        };
        send_frame(link, Vip::host(addr), &frame)
    }
}

/// Classic BPF for the IPv6 capture socket: neighbour solicitations and advertisements
/// ([`icmpv6_filter`] of types 135 and 136).
fn nd_filter() -> [libc::sock_filter; 7] {
    icmpv6_filter([135, 136])
}

/// Classic BPF for an IPv6 capture socket: accept ICMPv6 (next header 58, no extension
/// headers: neighbour discovery never carries any) of type `types[0]` or `types[1]` (give
/// one type twice to accept only it), drop the rest. Offsets include the 14-byte Ethernet
/// header.
pub(super) fn icmpv6_filter(types: [u8; 2]) -> [libc::sock_filter; 7] {
    const LDB_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    [
        ins(LDB_ABS, 0, 0, 20),                // IPv6 next header
        ins(JEQ_K, 0, 4, 58),                  // ICMPv6, else drop
        ins(LDB_ABS, 0, 0, 54),                // ICMPv6 type
        ins(JEQ_K, 1, 0, u32::from(types[0])), // first type: accept
        ins(JEQ_K, 0, 1, u32::from(types[1])), // second type: accept, else drop
        ins(RET_K, 0, 0, 0x0004_0000),         // accept
        ins(RET_K, 0, 0, 0),                   // drop
    ]
}

/// Opens a non-blocking `AF_PACKET`/`SOCK_RAW` socket for ARP (`v6` false) or for IPv6
/// neighbour discovery (`v6` true, with [`nd_filter`]), not bound to an interface.
fn open_capture(v6: bool) -> Result<socket2::Socket, NetError> {
    if v6 {
        open_filtered_capture(ETH_P_IPV6, Some(&nd_filter()))
    } else {
        open_filtered_capture(ETH_P_ARP, None)
    }
}

/// Opens a non-blocking `AF_PACKET`/`SOCK_RAW` socket for EtherType `ethertype` (host order)
/// on every interface of the calling thread's network namespace, with the classic BPF
/// program `filter` attached when given (needs `CAP_NET_RAW`).
///
/// # Errors
/// [`NetError::Capture`] naming the step that failed.
pub(super) fn open_filtered_capture(
    ethertype: u16,
    filter: Option<&[libc::sock_filter]>,
) -> Result<socket2::Socket, NetError> {
    let err = |what| move |e| NetError::Capture { what, source: e };
    let sock = socket2::Socket::new(
        socket2::Domain::PACKET,
        socket2::Type::RAW,
        Some(socket2::Protocol::from(i32::from(ethertype.to_be()))),
    )
    .map_err(err("open an AF_PACKET socket (needs CAP_NET_RAW)"))?;
    if let Some(prog) = filter {
        super::packet::attach_filter(&sock, prog)
            .map_err(err("attach the neighbour discovery filter"))?;
    }
    sock.set_nonblocking(true)
        .map_err(err("make the capture socket non-blocking"))?;
    Ok(sock)
}

/// Registers the non-blocking capture socket `sock` with the Tokio reactor (needs a
/// runtime).
///
/// # Errors
/// The OS error of the registration.
pub(super) fn register_capture(sock: socket2::Socket) -> std::io::Result<AsyncFd<socket2::Socket>> {
    // SAFETY: the socket2 socket owns its descriptor and moves into the AsyncFd, which owns
    // it until dropped; `as_raw_fd` always returns that same descriptor.
    unsafe { AsyncFd::register(sock) }.map_err(|e| e.into_parts().1)
}

/// Reads the capture socket `fd` until it fails or `on_frame` returns `false`: calls
/// `on_frame(frame, ifindex)` for each frame this host did not send (see [`recv_frame`]).
/// Returns the error that ended the loop, if the socket failed (`None`: `on_frame` ended
/// it). A failed read of one frame is logged at debug level, naming `what`.
pub(super) async fn read_frames(
    fd: &AsyncFd<socket2::Socket>,
    what: &'static str,
    mut on_frame: impl FnMut(&[u8], u32) -> bool,
) -> Option<std::io::Error> {
    let mut buf = vec![0u8; 2048];
    loop {
        let mut guard = match fd.readable().await {
            Ok(g) => g,
            Err(e) => return Some(e),
        };
        match guard.try_io(|inner| recv_frame(inner.get_ref().as_raw_fd(), &mut buf)) {
            Ok(Ok(Some((len, ifindex)))) => {
                if let Some(frame) = buf.get(..len)
                    && !on_frame(frame, ifindex)
                {
                    return None;
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => debug!(error = %e, what, "capture read failed"),
            Err(_would_block) => {}
        }
    }
}

/// Reads one frame into `buf`: `Some((length, ifindex))`, or `None` for a frame this host
/// sent itself. `WouldBlock` when nothing is queued.
fn recv_frame(fd: i32, buf: &mut [u8]) -> std::io::Result<Option<(usize, u32)>> {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: `buf` is valid for `buf.len()` bytes; `sll`/`len` describe a sockaddr_ll the
    // kernel fills in (it never writes more than `len` bytes).
    let n = unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            std::ptr::from_mut(&mut sll).cast(),
            &mut len,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if sll.sll_pkttype == PACKET_OUTGOING {
        return Ok(None);
    }
    let ifindex = u32::try_from(sll.sll_ifindex).unwrap_or(0);
    Ok(Some((usize::try_from(n).unwrap_or(0), ifindex)))
}

/// Probes for `addr` on `link` once: [`PROBES`](PROBES) probes
/// spread over `listen`, and returns the distinct MACs (other than `link.mac`) that claimed
/// the address during `listen`, probes from other hosts included (`vipd preflight` uses it;
/// the manager drives the same monitor through the VIP holder's state machine).
///
/// # Errors
/// [`NetError::Capture`] or [`NetError::Announce`] when the capture cannot be opened or a
/// probe cannot be sent.
pub(crate) async fn probe_for<M: ConflictMonitor + ?Sized>(
    monitor: &M,
    link: &LinkInfo,
    addr: IpAddr,
    listen: Duration,
) -> Result<Vec<[u8; 6]>, NetError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let id = monitor.watch(link, addr, tx)?;
    let probes = PROBES;
    let start = tokio::time::Instant::now();
    let mut seen: Vec<[u8; 6]> = Vec::new();
    let mut result = Ok(());
    for k in 0..probes {
        tokio::time::sleep_until(start + listen * k / probes).await;
        if let Err(e) = monitor.send_probe(link, addr) {
            result = Err(e);
            break;
        }
    }
    if result.is_ok() {
        let end = start + listen;
        while let Ok(Some(claim)) = tokio::time::timeout_at(end, rx.recv()).await {
            if !seen.contains(&claim.mac) {
                seen.push(claim.mac);
            }
        }
    }
    monitor.unwatch(id);
    result.map(|()| seen)
}

/// In-memory [`ConflictMonitor`] for unit tests of the holder: records watches and probes;
/// [`FakeConflictMonitor::claim`] injects a claim as if it had been captured.
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeConflictMonitor {
    inner: Arc<Mutex<FakeInner>>,
}

#[cfg(test)]
#[derive(Debug, Default)]
struct FakeInner {
    next_id: WatchId,
    watches: HashMap<WatchId, (u32, IpAddr, mpsc::UnboundedSender<Claim>)>,
    probes: Vec<(u32, IpAddr)>,
    /// Claims answered to every probe: (address, MAC).
    answer: Vec<(IpAddr, [u8; 6])>,
}

#[cfg(test)]
impl FakeConflictMonitor {
    /// A fake with no watches.
    pub fn new() -> Self {
        Self::default()
    }

    /// Delivers `claim` to every watch of its address; returns how many got it.
    pub fn claim(&self, claim: Claim) -> usize {
        let Ok(s) = self.inner.lock() else { return 0 };
        s.watches
            .values()
            .filter(|(_, a, _)| *a == claim.addr)
            .filter(|(_, _, tx)| tx.send(claim).is_ok())
            .count()
    }

    /// From now on every probe for `addr` is answered by `mac` (another host has it).
    pub(crate) fn answer_probes(&self, addr: IpAddr, mac: [u8; 6]) {
        if let Ok(mut s) = self.inner.lock() {
            s.answer.push((addr, mac));
        }
    }

    /// Probes stop being answered (the other host is gone).
    pub(crate) fn stop_answering(&self) {
        if let Ok(mut s) = self.inner.lock() {
            s.answer.clear();
        }
    }

    /// Probes sent so far: (ifindex, address).
    pub fn probes(&self) -> Vec<(u32, IpAddr)> {
        self.inner
            .lock()
            .map(|s| s.probes.clone())
            .unwrap_or_default()
    }

    /// Number of active watches.
    pub fn watches(&self) -> usize {
        self.inner.lock().map(|s| s.watches.len()).unwrap_or(0)
    }
}

#[cfg(test)]
impl ConflictMonitor for FakeConflictMonitor {
    fn watch(
        &self,
        link: &LinkInfo,
        addr: IpAddr,
        tx: mpsc::UnboundedSender<Claim>,
    ) -> Result<WatchId, NetError> {
        let mut s = self.inner.lock().map_err(|_| NetError::Capture {
            what: "lock",
            source: std::io::Error::other("poisoned"),
        })?;
        s.next_id += 1;
        let id = s.next_id;
        s.watches.insert(id, (link.index, addr, tx));
        Ok(id)
    }

    fn unwatch(&self, id: WatchId) {
        if let Ok(mut s) = self.inner.lock() {
            s.watches.remove(&id);
        }
    }

    fn send_probe(&self, link: &LinkInfo, addr: IpAddr) -> Result<(), NetError> {
        let Ok(mut s) = self.inner.lock() else {
            return Ok(());
        };
        s.probes.push((link.index, addr));
        let answers: Vec<[u8; 6]> = s
            .answer
            .iter()
            .filter(|(a, _)| *a == addr)
            .map(|(_, m)| *m)
            .collect();
        for mac in answers {
            for (ifindex, a, tx) in s.watches.values() {
                if *ifindex == link.index && *a == addr {
                    let _ = tx.send(Claim {
                        addr,
                        mac,
                        probing: false,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{garp_frame, unsolicited_na_frame};

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];

    #[test]
    fn arp_probe_is_rfc5227_probe_and_parses_as_probing_claim() {
        let ip = Ipv4Addr::new(192, 0, 2, 77);
        let f = arp_probe_frame(MAC, ip);
        assert_eq!(f.len(), 42);
        // op request, sender IP 0.0.0.0, target MAC zero, target IP = ip.
        assert_eq!(&f[20..22], &[0, 1]);
        assert_eq!(&f[28..32], &[0, 0, 0, 0]);
        assert_eq!(&f[32..38], &[0; 6]);
        assert_eq!(&f[38..42], &ip.octets());
        assert_eq!(
            claim_in_frame(&f),
            Some(Claim {
                addr: IpAddr::V4(ip),
                mac: MAC,
                probing: true
            })
        );
    }

    #[test]
    fn garp_and_arp_reply_claim_their_sender_ip() {
        let ip = Ipv4Addr::new(192, 0, 2, 77);
        assert_eq!(
            claim_in_frame(&garp_frame(MAC, ip)),
            Some(Claim {
                addr: IpAddr::V4(ip),
                mac: MAC,
                probing: false
            })
        );
        // An ARP reply: op 2, sender = the host that has the address.
        let mut reply = garp_frame(MAC, ip);
        reply[21] = 2;
        reply[38..42].copy_from_slice(&[192, 0, 2, 100]);
        assert_eq!(claim_in_frame(&reply).map(|c| c.addr), Some(IpAddr::V4(ip)));
        // An ordinary request from a client claims the client's own address only.
        let mut req = arp_probe_frame(MAC, ip);
        req[28..32].copy_from_slice(&[192, 0, 2, 100]);
        assert_eq!(
            claim_in_frame(&req).map(|c| (c.addr, c.probing)),
            Some(("192.0.2.100".parse().unwrap(), false))
        );
        // A reply with sender IP 0 is nothing.
        let mut odd = arp_probe_frame(MAC, ip);
        odd[21] = 2;
        assert_eq!(claim_in_frame(&odd), None);
        // Truncated frames are nothing.
        assert_eq!(claim_in_frame(&reply[..30]), None);
        assert_eq!(claim_in_frame(&[]), None);
    }

    #[test]
    fn dad_probe_is_rfc4862_and_parses_as_probing_claim() {
        let ip: Ipv6Addr = "2001:db8::77".parse().unwrap();
        let f = dad_probe_frame(MAC, ip);
        assert_eq!(f.len(), 14 + 40 + 24);
        assert_eq!(&f[0..6], &[0x33, 0x33, 0xff, 0, 0, 0x77]);
        assert_eq!(&f[22..38], &Ipv6Addr::UNSPECIFIED.octets());
        assert_eq!(
            &f[38..54],
            &"ff02::1:ff00:77".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(f[21], 255, "hop limit");
        assert_eq!(f[54], 135, "neighbour solicitation");
        // Checksum verifies over the pseudo-header.
        let icmp = Icmpv6Packet::new(&f[54..]).unwrap();
        let (group, _) = solicited_node(ip);
        assert_eq!(
            icmpv6::checksum(&icmp, &Ipv6Addr::UNSPECIFIED, &group),
            icmp.get_checksum()
        );
        assert_eq!(
            claim_in_frame(&f),
            Some(Claim {
                addr: IpAddr::V6(ip),
                mac: MAC,
                probing: true
            })
        );
    }

    #[test]
    fn neighbour_advertisement_claims_its_target_with_the_option_mac() {
        let ip: Ipv6Addr = "2001:db8::77".parse().unwrap();
        let mut f = unsolicited_na_frame(MAC, ip);
        // Ethernet source differs from the option: the option wins.
        f[6..12].copy_from_slice(&[2, 9, 9, 9, 9, 9]);
        assert_eq!(
            claim_in_frame(&f),
            Some(Claim {
                addr: IpAddr::V6(ip),
                mac: MAC,
                probing: false
            })
        );
        // Hop limit other than 255 is not neighbour discovery (RFC 4861 §7.1.2).
        f[21] = 64;
        assert_eq!(claim_in_frame(&f), None);
    }

    #[test]
    fn nd_filter_jumps_land_inside_the_program() {
        let prog = nd_filter();
        for (i, ins) in prog.iter().enumerate() {
            if ins.code == 0x15 {
                assert!(i + 1 + usize::from(ins.jt) < prog.len());
                assert!(i + 1 + usize::from(ins.jf) < prog.len());
            }
        }
        // Both exits are returns; the drop is 0.
        assert_eq!(prog[5].code, 0x06);
        assert_ne!(prog[5].k, 0);
        assert_eq!((prog[6].code, prog[6].k), (0x06, 0));
    }
}

#[cfg(test)]
mod probe_for_tests {
    use super::*;

    fn link() -> LinkInfo {
        LinkInfo {
            index: 2,
            name: "eth0".into(),
            mac: [2, 0, 0, 0, 0, 1],
            up: true,
            carrier: true,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn probe_for_reports_who_answers_and_cleans_up() {
        let m = FakeConflictMonitor::new();
        let addr: IpAddr = "192.0.2.77".parse().unwrap();
        let w = Duration::from_millis(100);
        assert!(probe_for(&m, &link(), addr, w).await.unwrap().is_empty());
        assert_eq!(m.probes().len(), 2);
        m.answer_probes(addr, [2, 0, 0, 0, 0, 0xbb]);
        assert_eq!(
            probe_for(&m, &link(), addr, w).await.unwrap(),
            vec![[2, 0, 0, 0, 0, 0xbb]],
            "two answers from one MAC are one MAC"
        );
        assert_eq!(m.watches(), 0, "the watch ends with the probe");
    }
}
