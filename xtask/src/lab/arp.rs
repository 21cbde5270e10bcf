//! ARP/NDP capture and the "who answers for this address" watcher, both run on a thread
//! inside a lab namespace (normally `client`) with a pnet AF_PACKET channel.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pnet::datalink::{self, Channel, DataLinkReceiver, DataLinkSender, NetworkInterface};
use pnet::packet::Packet;
use pnet::packet::arp::{ArpHardwareTypes, ArpOperations, ArpPacket, MutableArpPacket};
use pnet::packet::ethernet::{EtherTypes, EthernetPacket, MutableEthernetPacket};
use pnet::packet::icmpv6::ndp::{
    MutableNeighborSolicitPacket, NdpOptionPacket, NdpOptionTypes, NeighborAdvertPacket,
    NeighborSolicitPacket,
};
use pnet::packet::icmpv6::{Icmpv6Packet, Icmpv6Types};
use pnet::packet::ip::IpNextHeaderProtocols;
use pnet::packet::ipv6::{Ipv6Packet, MutableIpv6Packet};
pub use pnet::util::MacAddr;

use super::error::{LabError, Result};
use super::netns::spawn_in_netns;

/// Kind of a captured neighbour-discovery frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOp {
    /// ARP request (RFC 826 op 1); a gratuitous ARP request has sender IP == target IP
    /// (RFC 5227 section 3 "ARP Announcement").
    Request,
    /// ARP reply (op 2).
    Reply,
    /// ICMPv6 Neighbor Solicitation (RFC 4861 type 135).
    NeighborSolicit,
    /// ICMPv6 Neighbor Advertisement (RFC 4861 type 136); unsolicited ones announce moves.
    NeighborAdvert,
}

/// One ARP or NDP frame seen by a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArpFrame {
    /// Time since the capture started.
    pub t: Duration,
    /// Request/reply (ARP) or solicitation/advertisement (NDP).
    pub op: ArpOp,
    /// Ethernet source address of the frame.
    pub eth_src: MacAddr,
    /// Ethernet destination address of the frame.
    pub eth_dst: MacAddr,
    /// ARP sender hardware address; for NDP the link-layer-address option (source LLA for
    /// NS, target LLA for NA), or the Ethernet source when the option is absent.
    pub sender_mac: MacAddr,
    /// ARP sender protocol address; for NDP the IPv6 source address.
    pub sender_ip: IpAddr,
    /// ARP target protocol address; for NDP the target address field.
    pub target_ip: IpAddr,
}

impl ArpFrame {
    /// True for a gratuitous ARP (sender IP equal to target IP, request or reply) or an
    /// unsolicited-looking NA for `ip` (target == `ip`, sent to all-nodes).
    pub fn is_announcement_of(&self, ip: IpAddr) -> bool {
        match self.op {
            ArpOp::Request | ArpOp::Reply => self.sender_ip == ip && self.target_ip == ip,
            ArpOp::NeighborAdvert => {
                self.target_ip == ip && self.eth_dst == MacAddr::new(0x33, 0x33, 0, 0, 0, 1)
            }
            ArpOp::NeighborSolicit => false,
        }
    }
}

/// Parses an Ethernet frame into an [`ArpFrame`] if it is ARP or an NS/NA.
pub fn parse_frame(frame: &[u8], t: Duration) -> Option<ArpFrame> {
    let eth = EthernetPacket::new(frame)?;
    match eth.get_ethertype() {
        EtherTypes::Arp => {
            let arp = ArpPacket::new(eth.payload())?;
            let op = match arp.get_operation() {
                ArpOperations::Request => ArpOp::Request,
                ArpOperations::Reply => ArpOp::Reply,
                _ => return None,
            };
            Some(ArpFrame {
                t,
                op,
                eth_src: eth.get_source(),
                eth_dst: eth.get_destination(),
                sender_mac: arp.get_sender_hw_addr(),
                sender_ip: IpAddr::V4(arp.get_sender_proto_addr()),
                target_ip: IpAddr::V4(arp.get_target_proto_addr()),
            })
        }
        EtherTypes::Ipv6 => {
            let ip6 = Ipv6Packet::new(eth.payload())?;
            if ip6.get_next_header() != IpNextHeaderProtocols::Icmpv6 {
                return None;
            }
            let icmp = Icmpv6Packet::new(ip6.payload())?;
            let (op, target, lla) = match icmp.get_icmpv6_type() {
                Icmpv6Types::NeighborSolicit => {
                    let ns = NeighborSolicitPacket::new(ip6.payload())?;
                    let lla = ns
                        .get_options_iter()
                        .find(|o| o.get_option_type() == NdpOptionTypes::SourceLLAddr)
                        .and_then(|o| option_mac(&o));
                    (ArpOp::NeighborSolicit, ns.get_target_addr(), lla)
                }
                Icmpv6Types::NeighborAdvert => {
                    let na = NeighborAdvertPacket::new(ip6.payload())?;
                    let lla = na
                        .get_options_iter()
                        .find(|o| o.get_option_type() == NdpOptionTypes::TargetLLAddr)
                        .and_then(|o| option_mac(&o));
                    (ArpOp::NeighborAdvert, na.get_target_addr(), lla)
                }
                _ => return None,
            };
            Some(ArpFrame {
                t,
                op,
                eth_src: eth.get_source(),
                eth_dst: eth.get_destination(),
                sender_mac: lla.unwrap_or_else(|| eth.get_source()),
                sender_ip: IpAddr::V6(ip6.get_source()),
                target_ip: IpAddr::V6(target),
            })
        }
        _ => None,
    }
}

fn option_mac(o: &NdpOptionPacket<'_>) -> Option<MacAddr> {
    let d = o.payload();
    (d.len() >= 6).then(|| MacAddr::new(d[0], d[1], d[2], d[3], d[4], d[5]))
}

/// An interface with an open AF_PACKET sender and receiver.
type LinkChannel = (
    NetworkInterface,
    Box<dyn DataLinkSender>,
    Box<dyn DataLinkReceiver>,
);

fn open_channel(ifname: &str, read_timeout: Duration) -> Result<LinkChannel> {
    let iface = datalink::interfaces()
        .into_iter()
        .find(|i| i.name == ifname)
        .ok_or_else(|| LabError::Thread {
            name: "arp".into(),
            detail: format!("interface {ifname} not found in this namespace"),
        })?;
    let config = datalink::Config {
        read_timeout: Some(read_timeout),
        ..Default::default()
    };
    match datalink::channel(&iface, config) {
        Ok(Channel::Ethernet(tx, rx)) => Ok((iface, tx, rx)),
        Ok(_) => Err(LabError::Thread {
            name: "arp".into(),
            detail: "unexpected channel type".into(),
        }),
        Err(e) => Err(LabError::Io {
            context: format!("open AF_PACKET channel on {ifname}"),
            source: e,
        }),
    }
}

/// A running ARP/NDP capture; collect the frames with [`Capture::stop`].
#[derive(Debug)]
pub struct Capture {
    frames: Arc<Mutex<Vec<ArpFrame>>>,
    thread: BackgroundThread,
}

impl Capture {
    /// Starts capturing ARP and NS/NA frames on `ifname` inside the namespace at `netns`.
    /// Returns once the capture socket is open, so frames sent afterwards are seen.
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Thread`] when the namespace, interface or socket fails.
    pub fn start(netns: &Path, ifname: &str) -> Result<Capture> {
        let stop = Arc::new(AtomicBool::new(false));
        let frames = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::result::Result<(), String>>();
        let (s, f, name) = (stop.clone(), frames.clone(), ifname.to_string());
        let handle = spawn_in_netns(netns, "arp-capture", move || {
            let (_iface, _tx, mut rx) = match open_channel(&name, Duration::from_millis(20)) {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            let _ = ready_tx.send(Ok(()));
            let start = Instant::now();
            while !s.load(Ordering::SeqCst) {
                if let Ok(frame) = rx.next()
                    && let Some(p) = parse_frame(frame, start.elapsed())
                    && let Ok(mut v) = f.lock()
                {
                    v.push(p);
                }
            }
            Ok(())
        })?;
        BackgroundThread::ready(stop, ready_rx, handle, "arp-capture")
            .map(|thread| Capture { frames, thread })
    }

    /// Frames captured so far (the capture keeps running).
    pub fn frames(&self) -> Vec<ArpFrame> {
        self.frames.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Stops the capture and returns every frame seen, in arrival order.
    ///
    /// # Errors
    /// [`LabError::Thread`] when the capture thread failed while running.
    pub fn stop(mut self) -> Result<Vec<ArpFrame>> {
        self.thread.finish()?;
        Ok(self.frames())
    }
}

/// One frame of any kind seen by a [`FrameCapture`]: who sent it and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenFrame {
    /// Time since the capture started.
    pub t: Duration,
    /// Ethernet source address.
    pub eth_src: MacAddr,
    /// Sent by this namespace (`PACKET_OUTGOING`), not received.
    pub outgoing: bool,
    /// EtherType (0x0806 ARP, 0x86dd IPv6, ...).
    pub ethertype: u16,
    /// For IPv6: the ICMPv6 type when the payload is ICMPv6, past a hop-by-hop options
    /// header (MLD reports carry one): 135 NS, 136 NA, 131/143 MLD reports, 132 MLD done.
    pub icmpv6_type: Option<u8>,
}

/// The ICMPv6 type of an IPv6 packet `p` (from its header on), past one hop-by-hop header.
fn icmpv6_type_of(p: &[u8]) -> Option<u8> {
    const ICMPV6: u8 = 58;
    const HOP_BY_HOP: u8 = 0;
    let next = *p.get(6)?;
    let rest = p.get(40..)?;
    match next {
        ICMPV6 => rest.first().copied(),
        HOP_BY_HOP if *rest.first()? == ICMPV6 => {
            let len = (usize::from(*rest.get(1)?) + 1) * 8;
            rest.get(len).copied()
        }
        _ => None,
    }
}

/// An `AF_PACKET` socket receiving every frame on `ifname`, sent and received, with a
/// 20 ms read timeout.
fn packet_socket(ifname: &str) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let io = |context: &str| LabError::Io {
        context: format!("{context} on {ifname}"),
        source: std::io::Error::last_os_error(),
    };
    let index = nix::net::if_::if_nametoindex(ifname).map_err(|_| io("find interface"))?;
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); the descriptor is owned below.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
    if raw < 0 {
        return Err(io("open AF_PACKET socket"));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_ll is valid; the fields set below make it a bind address.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the size given.
    let bound = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if bound < 0 {
        return Err(io("bind AF_PACKET socket"));
    }
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 20_000,
    };
    // SAFETY: `tv` is a valid timeval of the size given.
    let set = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    if set < 0 {
        return Err(io("set receive timeout"));
    }
    Ok(fd)
}

/// One frame from [`packet_socket`] into `buf`: its length and whether it was sent by this
/// host (`PACKET_OUTGOING`); `None` on timeout or error.
fn recv_frame(fd: &std::os::fd::OwnedFd, buf: &mut [u8]) -> Option<(usize, bool)> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero sockaddr_ll is valid for recvfrom to fill.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
    // SAFETY: `buf` and `from` are valid for writes of the sizes given.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&raw mut from).cast(),
            &raw mut len,
        )
    };
    let n = usize::try_from(n).ok()?;
    Some((n, from.sll_pkttype == libc::PACKET_OUTGOING))
}

/// A running capture of every frame on an interface (not only ARP/NDP as [`Capture`]),
/// e.g. to see whether anything at all leaves a node from a MAC; collect with
/// [`FrameCapture::stop`].
#[derive(Debug)]
pub struct FrameCapture {
    frames: Arc<Mutex<Vec<SeenFrame>>>,
    thread: BackgroundThread,
}

impl FrameCapture {
    /// Starts capturing every frame on `ifname` (sent and received) inside the namespace at
    /// `netns`. Returns once the capture socket is open.
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Thread`] when the namespace, interface or socket fails.
    pub fn start(netns: &Path, ifname: &str) -> Result<FrameCapture> {
        let stop = Arc::new(AtomicBool::new(false));
        let frames = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::result::Result<(), String>>();
        let (s, f, name) = (stop.clone(), frames.clone(), ifname.to_string());
        let handle = spawn_in_netns(netns, "frame-capture", move || {
            let fd = match packet_socket(&name) {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            let _ = ready_tx.send(Ok(()));
            let start = Instant::now();
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::SeqCst) {
                let Some((n, outgoing)) = recv_frame(&fd, &mut buf) else {
                    continue;
                };
                if let Some(eth) = EthernetPacket::new(&buf[..n])
                    && let Ok(mut v) = f.lock()
                {
                    let ethertype = eth.get_ethertype().0;
                    v.push(SeenFrame {
                        t: start.elapsed(),
                        eth_src: eth.get_source(),
                        outgoing,
                        ethertype,
                        icmpv6_type: (ethertype == EtherTypes::Ipv6.0)
                            .then(|| icmpv6_type_of(eth.payload()))
                            .flatten(),
                    });
                }
            }
            Ok(())
        })?;
        BackgroundThread::ready(stop, ready_rx, handle, "frame-capture")
            .map(|thread| FrameCapture { frames, thread })
    }

    /// Frames captured so far (the capture keeps running).
    pub fn frames(&self) -> Vec<SeenFrame> {
        self.frames.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Stops the capture and returns every frame seen, in arrival order.
    ///
    /// # Errors
    /// [`LabError::Thread`] when the capture thread failed while running.
    pub fn stop(mut self) -> Result<Vec<SeenFrame>> {
        self.thread.finish()?;
        Ok(self.frames())
    }
}

/// The thread of a [`Capture`], [`ArpWatcher`] or [`ArpRoundProber`]: told to stop through
/// its flag and joined on [`BackgroundThread::finish`] or drop.
#[derive(Debug)]
struct BackgroundThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<()>>>,
    name: &'static str,
}

impl BackgroundThread {
    /// Waits until the thread `handle` reports on `rx` that it is ready ([`wait_ready`]).
    fn ready(
        stop: Arc<AtomicBool>,
        rx: std::sync::mpsc::Receiver<std::result::Result<(), String>>,
        handle: JoinHandle<Result<()>>,
        name: &'static str,
    ) -> Result<BackgroundThread> {
        wait_ready(rx, handle, name).map(|handle| BackgroundThread {
            stop,
            handle: Some(handle),
            name,
        })
    }

    /// Sets the stop flag and joins the thread unless already joined: the thread's own
    /// result, or [`LabError::Thread`] when it panicked.
    fn finish(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(LabError::Thread {
                name: self.name.into(),
                detail: "panicked".into(),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for BackgroundThread {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

fn wait_ready<T>(
    rx: std::sync::mpsc::Receiver<std::result::Result<(), String>>,
    handle: JoinHandle<Result<T>>,
    name: &str,
) -> Result<JoinHandle<Result<T>>> {
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(detail)) => {
            let _ = handle.join();
            Err(LabError::Thread {
                name: name.into(),
                detail,
            })
        }
        Err(_) => Err(match handle.join() {
            Ok(Err(e)) => e,
            _ => LabError::Thread {
                name: name.into(),
                detail: "did not start".into(),
            },
        }),
    }
}

/// Who answered in one probe slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSlot {
    /// When the request of this slot was sent, relative to the watcher's start.
    pub t: Duration,
    /// MACs that answered for the address during this slot (ARP reply sender hardware
    /// address, or NA target link-layer address).
    pub responders: BTreeSet<MacAddr>,
}

/// A contiguous run of slots in which two or more MACs answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiResponderInterval {
    /// Start of the first slot of the run (relative to the watcher's start).
    pub start: Duration,
    /// Start of the last slot of the run.
    pub end: Duration,
    /// Every MAC that answered during the run.
    pub macs: BTreeSet<MacAddr>,
}

/// What an [`ArpWatcher`] saw: one [`ProbeSlot`] per request sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchReport {
    /// The address that was probed.
    pub target: Option<IpAddr>,
    /// Probe interval.
    pub interval: Duration,
    /// Slots in sending order.
    pub slots: Vec<ProbeSlot>,
}

impl WatchReport {
    /// Largest number of distinct MACs that answered within a single slot. 0 means nobody
    /// ever answered; 2 or more is "two holders at once".
    pub fn max_simultaneous_responders(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.responders.len())
            .max()
            .unwrap_or(0)
    }

    /// Runs of consecutive slots with two or more responders.
    pub fn multi_responder_intervals(&self) -> Vec<MultiResponderInterval> {
        let mut out: Vec<MultiResponderInterval> = Vec::new();
        let mut open = false;
        for s in &self.slots {
            if s.responders.len() >= 2 {
                match out.last_mut() {
                    Some(last) if open => {
                        last.end = s.t;
                        last.macs.extend(s.responders.iter().copied());
                    }
                    _ => out.push(MultiResponderInterval {
                        start: s.t,
                        end: s.t,
                        macs: s.responders.clone(),
                    }),
                }
                open = true;
            } else {
                open = false;
            }
        }
        out
    }

    /// Every MAC that answered at least once.
    pub fn all_responders(&self) -> BTreeSet<MacAddr> {
        self.slots
            .iter()
            .flat_map(|s| s.responders.iter().copied())
            .collect()
    }

    /// Number of slots in which someone answered.
    pub fn answered_slots(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !s.responders.is_empty())
            .count()
    }

    /// The MAC(s) that answered in the most recent slot that got any answer.
    pub fn last_responders(&self) -> BTreeSet<MacAddr> {
        self.slots
            .iter()
            .rev()
            .find(|s| !s.responders.is_empty())
            .map(|s| s.responders.clone())
            .unwrap_or_default()
    }
}

/// Sends an ARP request (IPv4) or Neighbor Solicitation (IPv6) for one address every
/// `interval` from a lab namespace and records which MACs answer in each slot.
///
/// Replies are assigned to the slot during which they arrive, so a slot holding two MACs
/// means two hosts answered for the same address within one interval.
#[derive(Debug)]
pub struct ArpWatcher {
    report: Arc<Mutex<WatchReport>>,
    thread: BackgroundThread,
}

/// Default probe interval of an [`ArpWatcher`]: 50 ms.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_millis(50);

impl ArpWatcher {
    /// Starts probing `target` every `interval` from `ifname` in the namespace at `netns`,
    /// using `source_v4`/`source_v6` as the sender address. Returns once the socket is open.
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Thread`] when the namespace, interface or socket fails.
    pub fn start(
        netns: &Path,
        ifname: &str,
        source_v4: Ipv4Addr,
        source_v6: Ipv6Addr,
        target: IpAddr,
        interval: Duration,
    ) -> Result<ArpWatcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(WatchReport {
            target: Some(target),
            interval,
            slots: Vec::new(),
        }));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::result::Result<(), String>>();
        let (s, r, name) = (stop.clone(), report.clone(), ifname.to_string());
        let handle = spawn_in_netns(netns, "arp-watch", move || {
            let poll = (interval / 5).clamp(Duration::from_millis(1), Duration::from_millis(10));
            let (iface, mut tx, mut rx) = match open_channel(&name, poll) {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            let Some(my_mac) = iface.mac else {
                let _ = ready_tx.send(Err(format!("{name} has no MAC address")));
                return Err(LabError::Thread {
                    name: "arp-watch".into(),
                    detail: format!("{name} has no MAC address"),
                });
            };
            let _ = ready_tx.send(Ok(()));
            let request = match target {
                IpAddr::V4(t) => arp_request(my_mac, source_v4, t),
                IpAddr::V6(t) => neighbor_solicit(my_mac, source_v6, t),
            };
            let start = Instant::now();
            let mut next = start;
            while !s.load(Ordering::SeqCst) {
                let now = Instant::now();
                if now >= next {
                    if let Ok(mut rep) = r.lock() {
                        rep.slots.push(ProbeSlot {
                            t: now - start,
                            responders: BTreeSet::new(),
                        });
                    }
                    let _ = tx.send_to(&request, None);
                    next += interval;
                    if next < now {
                        next = now + interval;
                    }
                }
                let Ok(frame) = rx.next() else { continue };
                let Some(f) = parse_frame(frame, start.elapsed()) else {
                    continue;
                };
                let answers = matches!(f.op, ArpOp::Reply | ArpOp::NeighborAdvert)
                    && match (f.op, target) {
                        (ArpOp::Reply, _) => f.sender_ip == target,
                        _ => f.target_ip == target,
                    }
                    && f.eth_src != my_mac;
                if answers
                    && let Ok(mut rep) = r.lock()
                    && let Some(slot) = rep.slots.last_mut()
                {
                    slot.responders.insert(f.sender_mac);
                }
            }
            Ok(())
        })?;
        BackgroundThread::ready(stop, ready_rx, handle, "arp-watch")
            .map(|thread| ArpWatcher { report, thread })
    }

    /// A copy of what has been seen so far (the watcher keeps running).
    pub fn report(&self) -> WatchReport {
        self.report.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Stops probing and returns the full report.
    ///
    /// # Errors
    /// [`LabError::Thread`] when the watcher thread failed.
    pub fn stop(mut self) -> Result<WatchReport> {
        self.thread.finish()?;
        Ok(self.report())
    }
}

/// One round of an [`ArpRoundProber`]: who answered which address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeRound {
    /// When the round's requests were sent, relative to the prober's `epoch`.
    pub t: Duration,
    /// For each probed address that got an answer, the ARP sender hardware addresses of the
    /// replies to this round's request. Addresses nobody answered are absent.
    pub replies: std::collections::BTreeMap<Ipv4Addr, BTreeSet<MacAddr>>,
}

/// Probes many IPv4 addresses in rounds (the chaos soak's auditor): every `period` it sends
/// one broadcast ARP request (RFC 826) per target, then for `window` records the replies
/// sent to the prober itself (unicast to its MAC and IP), so gratuitous ARPs (broadcast)
/// never count. Two MACs in one round's entry means two hosts answered the same request.
#[derive(Debug)]
pub struct ArpRoundProber {
    rounds: Arc<Mutex<Vec<ProbeRound>>>,
    thread: BackgroundThread,
}

impl ArpRoundProber {
    /// Starts probing `targets` from `ifname` (sender address `source`) in the namespace at
    /// `netns`; round times are measured from `epoch`. `window` must be shorter than
    /// `period`. Returns once the socket is open.
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Thread`] when the namespace, interface or socket fails.
    pub fn start(
        netns: &Path,
        ifname: &str,
        source: Ipv4Addr,
        targets: Vec<Ipv4Addr>,
        period: Duration,
        window: Duration,
        epoch: Instant,
    ) -> Result<ArpRoundProber> {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::result::Result<(), String>>();
        let (s, r, name) = (stop.clone(), rounds.clone(), ifname.to_string());
        let window = window.min(period);
        let handle = spawn_in_netns(netns, "arp-rounds", move || {
            let (iface, mut tx, mut rx) = match open_channel(&name, Duration::from_millis(5)) {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            let Some(my_mac) = iface.mac else {
                let detail = format!("{name} has no MAC address");
                let _ = ready_tx.send(Err(detail.clone()));
                return Err(LabError::Thread {
                    name: "arp-rounds".into(),
                    detail,
                });
            };
            let _ = ready_tx.send(Ok(()));
            let requests: Vec<Vec<u8>> = targets
                .iter()
                .map(|t| arp_request(my_mac, source, *t))
                .collect();
            let wanted: BTreeSet<Ipv4Addr> = targets.iter().copied().collect();
            let mut next = Instant::now();
            while !s.load(Ordering::SeqCst) {
                // Between rounds: drain (and drop) whatever arrives.
                while Instant::now() < next && !s.load(Ordering::SeqCst) {
                    let _ = rx.next();
                }
                let sent = Instant::now();
                let mut round = ProbeRound {
                    t: sent.saturating_duration_since(epoch),
                    replies: Default::default(),
                };
                for req in &requests {
                    let _ = tx.send_to(req, None);
                }
                let mut record = |frame: &[u8]| {
                    let Some(f) = parse_frame(frame, Duration::ZERO) else {
                        return;
                    };
                    if let (ArpOp::Reply, IpAddr::V4(from), IpAddr::V4(to)) =
                        (f.op, f.sender_ip, f.target_ip)
                        && to == source
                        && f.eth_dst == my_mac
                        && wanted.contains(&from)
                    {
                        round.replies.entry(from).or_default().insert(f.sender_mac);
                    }
                };
                while sent.elapsed() < window {
                    if let Ok(frame) = rx.next() {
                        record(frame);
                    }
                }
                // Then whatever is already queued: replies that arrived within the window
                // but were not read in it because this thread was not scheduled (a loaded
                // machine), which would otherwise show every address as unanswered in
                // that round. Stops at the first read timeout (5 ms without a frame), or
                // after 50 ms of reading (a backlog is read in far less).
                let drain_end = Instant::now() + Duration::from_millis(50);
                while Instant::now() < drain_end {
                    let Ok(frame) = rx.next() else { break };
                    record(frame);
                }
                if let Ok(mut v) = r.lock() {
                    v.push(round);
                }
                next = sent + period;
            }
            Ok(())
        })?;
        BackgroundThread::ready(stop, ready_rx, handle, "arp-rounds")
            .map(|thread| ArpRoundProber { rounds, thread })
    }

    /// Number of rounds completed so far.
    pub fn len(&self) -> usize {
        self.rounds.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Whether no round has completed yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rounds from index `from` on (the prober keeps running).
    pub fn rounds_from(&self, from: usize) -> Vec<ProbeRound> {
        self.rounds
            .lock()
            .map(|v| {
                v.get(from..)
                    .map(<[ProbeRound]>::to_vec)
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }

    /// The most recent completed round, if any.
    pub fn last(&self) -> Option<ProbeRound> {
        self.rounds.lock().ok().and_then(|v| v.last().cloned())
    }

    /// Stops probing and returns every round.
    ///
    /// # Errors
    /// [`LabError::Thread`] when the prober thread failed.
    pub fn stop(mut self) -> Result<Vec<ProbeRound>> {
        self.thread.finish()?;
        Ok(self.rounds_from(0))
    }
}

/// Builds a broadcast ARP request (RFC 826) from `mac`/`src` asking for `target`.
pub fn arp_request(mac: MacAddr, src: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut buf = vec![0u8; 42];
    if let Some(mut eth) = MutableEthernetPacket::new(&mut buf) {
        eth.set_destination(MacAddr::broadcast());
        eth.set_source(mac);
        eth.set_ethertype(EtherTypes::Arp);
    }
    if let Some(mut arp) = MutableArpPacket::new(&mut buf[14..]) {
        arp.set_hardware_type(ArpHardwareTypes::Ethernet);
        arp.set_protocol_type(EtherTypes::Ipv4);
        arp.set_hw_addr_len(6);
        arp.set_proto_addr_len(4);
        arp.set_operation(ArpOperations::Request);
        arp.set_sender_hw_addr(mac);
        arp.set_sender_proto_addr(src);
        arp.set_target_hw_addr(MacAddr::zero());
        arp.set_target_proto_addr(target);
    }
    buf
}

/// Builds a Neighbor Solicitation (RFC 4861 section 4.3) for `target` from `mac`/`src`,
/// sent to the target's solicited-node multicast group, with a source link-layer option.
pub fn neighbor_solicit(mac: MacAddr, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let t = target.octets();
    let dst_ip = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        (u16::from(t[14]) << 8) | u16::from(t[15]),
    );
    let dst_mac = MacAddr::new(0x33, 0x33, 0xff, t[13], t[14], t[15]);
    let icmp_len = 24 + 8; // NS header + source link-layer address option
    let mut buf = vec![0u8; 14 + 40 + icmp_len];
    if let Some(mut eth) = MutableEthernetPacket::new(&mut buf) {
        eth.set_destination(dst_mac);
        eth.set_source(mac);
        eth.set_ethertype(EtherTypes::Ipv6);
    }
    if let Some(mut ip6) = MutableIpv6Packet::new(&mut buf[14..54]) {
        ip6.set_version(6);
        ip6.set_payload_length(icmp_len as u16);
        ip6.set_next_header(IpNextHeaderProtocols::Icmpv6);
        ip6.set_hop_limit(255);
        ip6.set_source(src);
        ip6.set_destination(dst_ip);
    }
    {
        let icmp = &mut buf[54..];
        if let Some(mut ns) = MutableNeighborSolicitPacket::new(icmp) {
            ns.set_icmpv6_type(Icmpv6Types::NeighborSolicit);
            ns.set_target_addr(target);
        }
        // Source link-layer address option: type 1, length 1 (8 octets), MAC.
        icmp[24] = 1;
        icmp[25] = 1;
        icmp[26..32].copy_from_slice(&mac.octets());
    }
    let csum = Icmpv6Packet::new(&buf[54..])
        .map(|p| pnet::packet::icmpv6::checksum(&p, &src, &dst_ip))
        .unwrap_or(0);
    buf[56..58].copy_from_slice(&csum.to_be_bytes());
    buf
}

#[cfg(test)]
mod tests;
