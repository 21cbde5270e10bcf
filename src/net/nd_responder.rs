//! Answers IPv6 neighbour solicitations for VIPs the kernel does not answer for.
//!
//! An IPv6 VIP on `lo` costs the kernel far less per add than one on a NIC (no
//! solicited-node group, no MLD restart for every group of the interface), but the kernel
//! answers a neighbour solicitation (NS) arriving on `eth0` only for addresses of `eth0`. The
//! [`NdResponder`] does it instead: it joins the VIP's solicited-node group (RFC 4291 §2.7.1)
//! on the interface, so the NIC's multicast filter passes the solicitations, reads NS frames
//! (ICMPv6 type 135 only, filtered in the kernel by classic BPF) from one `AF_PACKET` socket,
//! checks them as RFC 4861 §7.1.1 says (`solicitation_in_frame`) and answers those whose
//! target it answers for on the receiving interface with a solicited neighbour
//! advertisement (RFC 4861 §7.2.4, `advert_frame`) while the VIP's [`AnswerGate`] is open.
//!
//! The frame functions are pure; the group bookkeeping (refcounts per interface and group,
//! at most [`GROUPS_PER_SOCKET`] memberships per socket) sits behind a private seam and is
//! unit-tested without the kernel.

use std::collections::HashMap;
use std::io;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use pnet::packet::icmpv6::ndp::NeighborAdvertFlags;
use pnet::packet::icmpv6::{self, Icmpv6Packet};
use tokio::io::unix::AsyncFd;
use tracing::{debug, warn};

use super::LinkInfo;
use super::NetError;
use super::arp::{ETH_LEN, IPV6_LEN, na_frame, unsolicited_na_frame};
use super::conflict::{
    ETH_P_IPV6, icmpv6_filter, open_filtered_capture, read_frames, register_capture, solicited_node,
};

/// Neighbour solicitation without options, bytes (RFC 4861 §4.3).
const NS_LEN: usize = 24;
/// ICMPv6 type of a neighbour solicitation.
const NS_TYPE: u8 = 135;
/// IPv6 next header value of ICMPv6.
const ICMPV6: u8 = 58;
/// Option type of a source link-layer address (RFC 4861 §4.6.1).
const OPT_SOURCE_LL: u8 = 1;

/// Memberships per group socket: each socket's multicast memberships are charged to its
/// option memory (`net.core.optmem_max`, 20 KiB by default on older kernels), which holds a
/// few hundred; 200 leaves room.
pub const GROUPS_PER_SOCKET: usize = 200;

/// The process-wide origin of [`AnswerGate`] times.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Whether answers for one VIP may be sent, and until when: shared between one VIP holder
/// (which opens it while it holds the VIP, until the end of its lease or fence) and the
/// [`NdResponder`] (which reads it before each answer). Lock-free: one atomic, milliseconds
/// since a process-wide epoch, 0 = closed. Granularity 1 ms, rounded down: the gate may close
/// up to 1 ms before `until`, never after.
#[derive(Debug, Default)]
pub struct AnswerGate {
    /// Milliseconds since [`epoch`], rounded down; 0 = closed.
    until: AtomicU64,
}

impl AnswerGate {
    /// A gate that lets no answer through.
    pub fn closed() -> Self {
        Self::default()
    }

    /// Lets answers through until `until` (exclusive). A later or earlier time simply
    /// replaces the one stored; a time already past closes the gate.
    pub fn open_until(&self, until: Instant) {
        // Rounded down: no answer after `until`, at the cost of up to a millisecond before.
        let ms =
            u64::try_from(until.saturating_duration_since(epoch()).as_millis()).unwrap_or(u64::MAX);
        self.until.store(ms, Ordering::Release);
    }

    /// Lets no answer through any more.
    pub fn close(&self) {
        self.until.store(0, Ordering::Release);
    }

    /// Whether an answer may be sent at `now`: `now` is before the time of the last
    /// [`Self::open_until`] (to the millisecond) and the gate was not closed since.
    pub fn is_open_at(&self, now: Instant) -> bool {
        let now_ms =
            u64::try_from(now.saturating_duration_since(epoch()).as_millis()).unwrap_or(u64::MAX);
        now_ms < self.until.load(Ordering::Acquire)
    }
}

/// A neighbour solicitation that passed the RFC 4861 §7.1.1 checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Solicitation {
    /// Ethernet source of the frame.
    pub eth_src: [u8; 6],
    /// IPv6 source (`::` for duplicate address detection).
    pub src: Ipv6Addr,
    /// IPv6 destination (the target's solicited-node group, or the target itself).
    pub dst: Ipv6Addr,
    /// The address asked for.
    pub target: Ipv6Addr,
    /// The source link-layer address option's MAC, if any.
    pub source_ll: Option<[u8; 6]>,
}

/// `true` for a solicited-node multicast address (`ff02::1:ff00:0/104`, RFC 4291 §2.7.1).
fn is_solicited_node(ip: Ipv6Addr) -> bool {
    let o = ip.octets();
    o[..13] == [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff]
}

/// The Ethernet/IPv6 neighbour solicitation in `frame`, validated as RFC 4861 §7.1.1
/// requires: IPv6 (no extension headers) carrying ICMPv6 with hop limit 255, type 135 code
/// 0, an ICMPv6 length (the IPv6 payload length, which must fit the frame) of at least 24
/// bytes, a valid checksum, a target that is not multicast, every option of non-zero length
/// and within the message, and, from the unspecified source `::`, a solicited-node
/// multicast destination and no source link-layer address option. The first source
/// link-layer option (type 1) gives [`Solicitation::source_ll`]. Anything else: `None`.
pub(crate) fn solicitation_in_frame(frame: &[u8]) -> Option<Solicitation> {
    let eth = frame.get(..ETH_LEN)?;
    if eth[12..14] != ETH_P_IPV6.to_be_bytes() {
        return None;
    }
    let ip6 = frame.get(ETH_LEN..ETH_LEN + IPV6_LEN)?;
    if ip6[0] >> 4 != 6 || ip6[6] != ICMPV6 || ip6[7] != 255 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([ip6[4], ip6[5]]));
    let start = ETH_LEN + IPV6_LEN;
    let msg = frame.get(start..start + len)?;
    if len < NS_LEN || msg[0] != NS_TYPE || msg[1] != 0 {
        return None;
    }
    let addr = |b: &[u8]| <[u8; 16]>::try_from(b).ok().map(Ipv6Addr::from);
    let src = addr(&ip6[8..24])?;
    let dst = addr(&ip6[24..40])?;
    let target = addr(&msg[8..24])?;
    let icmp = Icmpv6Packet::new(msg)?;
    if icmpv6::checksum(&icmp, &src, &dst) != u16::from_be_bytes([msg[2], msg[3]]) {
        return None;
    }
    if target.is_multicast() {
        return None;
    }
    let mut source_ll = None;
    let mut off = NS_LEN;
    while off < len {
        let kind = *msg.get(off)?;
        let units = usize::from(*msg.get(off + 1)?);
        let opt = msg.get(off..off + units * 8)?;
        if units == 0 {
            return None;
        }
        if kind == OPT_SOURCE_LL && source_ll.is_none() {
            source_ll = <[u8; 6]>::try_from(opt.get(2..8)?).ok();
        }
        off += units * 8;
    }
    if src.is_unspecified() && (!is_solicited_node(dst) || source_ll.is_some()) {
        return None;
    }
    let mut eth_src = [0u8; 6];
    eth_src.copy_from_slice(&eth[6..12]);
    Some(Solicitation {
        eth_src,
        src,
        dst,
        target,
        source_ll,
    })
}

/// The neighbour advertisement (86 bytes, see [`na_frame`]) answering `s` from the
/// interface with MAC `mac`, as RFC 4861 §7.2.4 says: IPv6 source = `s.target`; for a
/// solicitation from `::` (another host's duplicate address detection) to `ff02::1`
/// (Ethernet `33:33:00:00:00:01`) with Solicited clear, otherwise to `s.src` (Ethernet: the
/// source link-layer option, else the frame's Ethernet source) with Solicited set. Override
/// always set (this node is the address's one responder), Router clear, hop limit 255, a
/// target link-layer address option with `mac`, Ethernet source `mac`.
pub(crate) fn advert_frame(mac: [u8; 6], s: &Solicitation) -> Vec<u8> {
    if s.src.is_unspecified() {
        // To all nodes, Override only: the unsolicited advertisement's form exactly.
        unsolicited_na_frame(mac, s.target)
    } else {
        na_frame(
            mac,
            s.source_ll.unwrap_or(s.eth_src),
            s.target,
            s.src,
            NeighborAdvertFlags::Override | NeighborAdvertFlags::Solicited,
        )
    }
}

/// A socket that holds multicast group memberships (the seam between the bookkeeping of
/// [`Groups`] and the kernel).
trait GroupSocket: Send {
    /// Joins `group` on interface `ifindex`.
    fn join(&self, group: &Ipv6Addr, ifindex: u32) -> io::Result<()>;
    /// Leaves `group` on interface `ifindex`.
    fn leave(&self, group: &Ipv6Addr, ifindex: u32) -> io::Result<()>;
}

impl GroupSocket for socket2::Socket {
    fn join(&self, group: &Ipv6Addr, ifindex: u32) -> io::Result<()> {
        self.join_multicast_v6(group, ifindex)
    }
    fn leave(&self, group: &Ipv6Addr, ifindex: u32) -> io::Result<()> {
        self.leave_multicast_v6(group, ifindex)
    }
}

/// An `AF_INET6` UDP socket, unbound, used only to hold group memberships (in the network
/// namespace of the calling thread).
fn open_group_socket() -> io::Result<socket2::Socket> {
    socket2::Socket::new(
        socket2::Domain::IPV6,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
}

/// One group socket and how many memberships it holds.
struct Slot<S> {
    id: u64,
    sock: S,
    members: usize,
    /// The kernel refused a join with `ENOBUFS`: no further joins on it.
    full: bool,
}

/// Solicited-node group memberships, refcounted per (ifindex, group) and packed at most
/// [`GROUPS_PER_SOCKET`] to a socket; a socket left empty is dropped (closed).
struct Groups<S> {
    open: Box<dyn Fn() -> io::Result<S> + Send + Sync>,
    slots: Vec<Slot<S>>,
    next_id: u64,
    /// (ifindex, group) → (references, id of the socket that joined).
    members: HashMap<(u32, Ipv6Addr), (usize, u64)>,
}

impl<S: GroupSocket> Groups<S> {
    fn new(open: Box<dyn Fn() -> io::Result<S> + Send + Sync>) -> Self {
        Self {
            open,
            slots: Vec::new(),
            next_id: 0,
            members: HashMap::new(),
        }
    }

    /// Opens a new socket slot; returns its index.
    fn open_slot(&mut self) -> io::Result<usize> {
        let sock = (self.open)()?;
        self.next_id += 1;
        self.slots.push(Slot {
            id: self.next_id,
            sock,
            members: 0,
            full: false,
        });
        Ok(self.slots.len() - 1)
    }

    /// Takes one reference on `group` at `ifindex`, joining it on the first. A socket with
    /// room is used, else a new one; a join refused with `ENOBUFS` is retried once on a
    /// fresh socket.
    fn acquire(&mut self, ifindex: u32, group: Ipv6Addr) -> io::Result<()> {
        if let Some((refs, _)) = self.members.get_mut(&(ifindex, group)) {
            *refs += 1;
            return Ok(());
        }
        let room = self
            .slots
            .iter()
            .position(|s| !s.full && s.members < GROUPS_PER_SOCKET);
        let mut i = match room {
            Some(i) => i,
            None => self.open_slot()?,
        };
        let mut result = self.join_on(i, ifindex, group);
        if matches!(&result, Err(e) if e.raw_os_error() == Some(libc::ENOBUFS)) {
            if let Some(s) = self.slots.get_mut(i) {
                s.full = true;
            }
            self.drop_empty();
            i = self.open_slot()?;
            result = self.join_on(i, ifindex, group);
        }
        if result.is_err() {
            self.drop_empty();
        }
        result
    }

    fn join_on(&mut self, i: usize, ifindex: u32, group: Ipv6Addr) -> io::Result<()> {
        let slot = self
            .slots
            .get_mut(i)
            .ok_or_else(|| io::Error::other("no such group socket"))?;
        slot.sock.join(&group, ifindex)?;
        slot.members += 1;
        self.members.insert((ifindex, group), (1, slot.id));
        Ok(())
    }

    /// Drops one reference on `group` at `ifindex`, leaving it (on the socket that joined)
    /// at the last. Unknown: no-op.
    fn release(&mut self, ifindex: u32, group: Ipv6Addr) -> io::Result<()> {
        let key = (ifindex, group);
        let Some((refs, id)) = self.members.get_mut(&key) else {
            return Ok(());
        };
        *refs -= 1;
        if *refs > 0 {
            return Ok(());
        }
        let id = *id;
        self.members.remove(&key);
        let mut result = Ok(());
        if let Some(slot) = self.slots.iter_mut().find(|s| s.id == id) {
            slot.members = slot.members.saturating_sub(1);
            result = slot.sock.leave(&group, ifindex);
        }
        self.drop_empty();
        result
    }

    /// Closes the sockets that hold no membership.
    fn drop_empty(&mut self) {
        self.slots.retain(|s| s.members > 0);
    }
}

/// Who answers for one (ifindex, VIP): each owner (a VIP holder) with its gate and the MAC
/// it answers with. Two holders of one node own the same VIP for a moment when an address
/// moves between them (a shard move); an answer goes out while any owner's gate is open.
struct Entry {
    owners: Vec<(Arc<AnswerGate>, [u8; 6])>,
}

impl Entry {
    /// The MAC of the first owner whose gate is open at `now`.
    fn open_mac(&self, now: Instant) -> Option<[u8; 6]> {
        self.owners
            .iter()
            .find(|(g, _)| g.is_open_at(now))
            .map(|(_, mac)| *mac)
    }
}

/// Answers neighbour solicitations for VIPs on behalf of the VIP holders: the seam between
/// the holder ([`crate::holder`]) and [`NdResponder`], so the holder's rules are tested
/// with a fake.
pub trait SolicitationAnswers: Send + Sync + std::fmt::Debug + 'static {
    /// Starts answering for `vip` on `link` for the owner of `gate` (see
    /// [`NdResponder::answer`]).
    ///
    /// # Errors
    /// [`NetError::NdAnswer`] when the answers cannot be started.
    fn answer(&self, link: &LinkInfo, vip: Ipv6Addr, gate: Arc<AnswerGate>)
    -> Result<(), NetError>;
    /// Stops answering for `vip` on `ifindex` for the owner of `gate` (see
    /// [`NdResponder::stop`]).
    fn stop(&self, ifindex: u32, vip: Ipv6Addr, gate: &Arc<AnswerGate>);
}

impl SolicitationAnswers for NdResponder {
    fn answer(
        &self,
        link: &LinkInfo,
        vip: Ipv6Addr,
        gate: Arc<AnswerGate>,
    ) -> Result<(), NetError> {
        NdResponder::answer(self, link, vip, gate)
    }

    fn stop(&self, ifindex: u32, vip: Ipv6Addr, gate: &Arc<AnswerGate>) {
        NdResponder::stop(self, ifindex, vip, gate);
    }
}

struct State {
    entries: HashMap<(u32, Ipv6Addr), Entry>,
    groups: Groups<socket2::Socket>,
    /// The capture task, once started.
    task: Option<tokio::task::AbortHandle>,
}

/// Answers neighbour solicitations for VIPs (see module docs): one `AF_PACKET` capture
/// socket (ICMPv6 type 135 only) and its Tokio task for all interfaces, opened on the first
/// [`NdResponder::answer`] in the network namespace of the calling thread, closed when the
/// responder is dropped (closing the group sockets leaves their groups). Needs
/// `CAP_NET_RAW` and a Tokio runtime. Answers go out through [`super::packet::send_raw`].
/// The capture socket and the group sockets (`AF_INET6` UDP, at most
/// [`GROUPS_PER_SOCKET`] memberships each) are opened in the network namespace of the
/// thread calling [`NdResponder::answer`]: call it from one namespace only.
pub struct NdResponder {
    state: Arc<Mutex<State>>,
}

impl Default for NdResponder {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for NdResponder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NdResponder")
            .field("answering", &self.answering())
            .finish()
    }
}

impl Drop for NdResponder {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.state).task.take() {
            task.abort();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl NdResponder {
    /// A responder with nothing answered and no socket open yet.
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                entries: HashMap::new(),
                groups: Groups::new(Box::new(open_group_socket)),
                task: None,
            })),
        }
    }

    /// Starts answering neighbour solicitations whose target is `vip`, received on
    /// `link.index`, with a solicited advertisement carrying `link.mac`, while `gate` is
    /// open. `gate` names the owner (compared by pointer): answering again for the same
    /// owner updates its MAC; another owner of the same (interface, VIP) is added beside it.
    /// Joins the solicited-node group of `vip` on `link.index` for the first owner
    /// (refcounted per interface and group: several VIPs share a group). Opens the capture
    /// socket and spawns its task on first use.
    ///
    /// # Errors
    /// [`NetError::NdAnswer`] (naming `link.index` and `vip`) when the capture socket cannot
    /// be opened, there is no Tokio runtime, or the group cannot be joined; nothing is
    /// answered then.
    pub fn answer(
        &self,
        link: &LinkInfo,
        vip: Ipv6Addr,
        gate: Arc<AnswerGate>,
    ) -> Result<(), NetError> {
        let err = |what| {
            move |source| NetError::NdAnswer {
                ifindex: link.index,
                addr: vip,
                what,
                source,
            }
        };
        let mut s = lock(&self.state);
        if s.task.is_none() {
            let runtime = tokio::runtime::Handle::try_current()
                .map_err(|e| err("find a Tokio runtime")(io::Error::other(e)))?;
            let sock = open_filtered_capture(ETH_P_IPV6, Some(&icmpv6_filter([NS_TYPE; 2])))
                .map_err(|e| match e {
                    NetError::Capture { what, source } => err(what)(source),
                    other => err("open the capture socket")(io::Error::other(other.to_string())),
                })?;
            let fd = register_capture(sock).map_err(err("register the capture socket"))?;
            let handle = runtime.spawn(capture(fd, Arc::downgrade(&self.state)));
            s.task = Some(handle.abort_handle());
        }
        let key = (link.index, vip);
        if let Some(e) = s.entries.get_mut(&key) {
            match e.owners.iter_mut().find(|(g, _)| Arc::ptr_eq(g, &gate)) {
                Some((_, mac)) => *mac = link.mac,
                None => e.owners.push((gate, link.mac)),
            }
            return Ok(());
        }
        let (group, _) = solicited_node(vip);
        s.groups
            .acquire(link.index, group)
            .map_err(err("join the solicited-node group"))?;
        s.entries.insert(
            key,
            Entry {
                owners: vec![(gate, link.mac)],
            },
        );
        Ok(())
    }

    /// Stops answering for `vip` on `ifindex` for the owner of `gate` (compared by pointer);
    /// with no owner left, leaves its solicited-node group there when no other VIP answered
    /// on that interface needs it. Not answered for that owner: no-op.
    pub fn stop(&self, ifindex: u32, vip: Ipv6Addr, gate: &Arc<AnswerGate>) {
        let mut s = lock(&self.state);
        let key = (ifindex, vip);
        let Some(e) = s.entries.get_mut(&key) else {
            return;
        };
        let before = e.owners.len();
        e.owners.retain(|(g, _)| !Arc::ptr_eq(g, gate));
        if e.owners.len() == before || !e.owners.is_empty() {
            return;
        }
        s.entries.remove(&key);
        let (group, _) = solicited_node(vip);
        if let Err(e) = s.groups.release(ifindex, group) {
            debug!(ifindex, %group, error = %e, "leaving a solicited-node group failed");
        }
    }

    /// How many (ifindex, VIP) entries are answered.
    pub fn answering(&self) -> usize {
        lock(&self.state).entries.len()
    }
}

/// The capture loop: reads solicitations, answers those with an entry whose gate is open.
/// Ends when the responder is gone or the socket fails (then logged at warn level, and the
/// capture forgotten so that the next [`NdResponder::answer`] opens it again).
async fn capture(fd: AsyncFd<socket2::Socket>, state: Weak<Mutex<State>>) {
    let failed = read_frames(&fd, "neighbour solicitation capture", |frame, ifindex| {
        let Some(state) = state.upgrade() else {
            return false;
        };
        if let Some(s) = solicitation_in_frame(frame) {
            answer_one(&state, ifindex, &s);
        }
        true
    })
    .await;
    if let Some(e) = failed {
        // Said at warn level: the holders still count on their answers. The next
        // `NdResponder::answer` opens the capture again.
        warn!(error = %e, "the neighbour solicitation capture failed: IPv6 VIPs on lo are not answered until the capture is opened again (at the next VIP answered)");
        if let Some(state) = state.upgrade() {
            lock(&state).task = None;
        }
    }
}

/// Answers `s`, received on `ifindex`, if an entry answers its target there and its gate
/// is open now.
fn answer_one(state: &Mutex<State>, ifindex: u32, s: &Solicitation) {
    let mac = {
        let st = lock(state);
        st.entries
            .get(&(ifindex, s.target))
            .and_then(|e| e.open_mac(Instant::now()))
    };
    let Some(mac) = mac else {
        return;
    };
    let frame = advert_frame(mac, s);
    match super::packet::send_raw(ifindex, &frame) {
        Ok(()) => {
            debug!(ifindex, target = %s.target, to = %s.src, "answered a neighbour solicitation")
        }
        Err(e) => {
            debug!(ifindex, target = %s.target, error = %e, "answering a neighbour solicitation failed")
        }
    }
}

#[cfg(test)]
mod tests;
