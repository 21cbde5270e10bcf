//! `AF_PACKET` sockets bound to one interface (Linux `packet(7)`), shared by the users that
//! talk below IP: the peer heartbeat socket, the conflict capture and the DHCP client.

use std::os::fd::AsRawFd;

/// `sockaddr_ll` for `ifindex`, protocol `ethertype` (host order), hardware address `mac`.
pub fn sockaddr_ll(ifindex: u32, ethertype: u16, mac: [u8; 6]) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as libc::sa_family_t;
    sll.sll_protocol = ethertype.to_be();
    sll.sll_ifindex = i32::try_from(ifindex).unwrap_or(0);
    sll.sll_halen = 6;
    sll.sll_addr[..6].copy_from_slice(&mac);
    sll
}

/// An `AF_PACKET` socket of type `ty` (`RAW`: whole frames; `DGRAM`: the kernel writes and
/// strips the link-layer header) for `ethertype` (host order), bound to interface `ifindex`
/// (needs `CAP_NET_RAW`). Blocking; the caller sets what else it needs.
///
/// # Errors
/// The step that failed (`open an AF_PACKET socket (needs CAP_NET_RAW)`, `bind to the
/// interface`) with the OS error.
pub fn bound_packet_socket(
    ifindex: u32,
    ty: socket2::Type,
    ethertype: u16,
) -> Result<socket2::Socket, (&'static str, std::io::Error)> {
    let sock = socket2::Socket::new(
        socket2::Domain::PACKET,
        ty,
        Some(socket2::Protocol::from(i32::from(ethertype.to_be()))),
    )
    .map_err(|e| ("open an AF_PACKET socket (needs CAP_NET_RAW)", e))?;
    let sll = sockaddr_ll(ifindex, ethertype, [0; 6]);
    // SAFETY: `sll` is a valid sockaddr_ll and the length is its size.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            std::ptr::from_ref(&sll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(("bind to the interface", std::io::Error::last_os_error()));
    }
    Ok(sock)
}

/// Attaches the classic BPF program `prog` to `sock` (`SO_ATTACH_FILTER`): the kernel drops
/// what it rejects before it is queued.
///
/// # Errors
/// The OS error (e.g. an invalid program).
pub fn attach_filter(sock: &socket2::Socket, prog: &[libc::sock_filter]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies the
    // program; the length matches the slice.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            std::ptr::from_ref(&fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The send-only `AF_PACKET` sockets of this process, one per network namespace (keyed by
/// the namespace's inode: a socket sends in the namespace it was opened in, and tests run
/// threads in several).
static SENDERS: std::sync::Mutex<Vec<(u64, socket2::Socket)>> = std::sync::Mutex::new(Vec::new());

/// Send buffer of the shared send-only socket: 4 MiB. A frame stays charged to the socket
/// until the interface's queue (qdisc) sends it; one socket for a burst of thousands of
/// announcements or probes with the default buffer (`wmem_default`, about 200 KiB) got
/// `WouldBlock` behind a slow qdisc (the new-user trial: 1607 of 2000 refused behind a
/// 1 Mbit/s `tbf`), where a socket per frame had a buffer of its own each.
const SEND_BUFFER_BYTES: usize = 4 << 20;

/// Sets the send buffer to [`SEND_BUFFER_BYTES`]: `SO_SNDBUFFORCE` (with `CAP_NET_ADMIN`,
/// which vipd has), else `SO_SNDBUF` (capped by `net.core.wmem_max`). Best effort: the
/// default buffer still sends, only smaller bursts.
fn widen_send_buffer(sock: &socket2::Socket) {
    use nix::sys::socket::{setsockopt, sockopt::SndBufForce};
    if setsockopt(sock, SndBufForce, &SEND_BUFFER_BYTES).is_err() {
        let _ = sock.set_send_buffer_size(SEND_BUFFER_BYTES);
    }
}

/// The inode of the calling thread's network namespace (`/proc/thread-self/ns/net`).
fn thread_netns() -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// Sends the whole Ethernet frame `frame` (destination, source, EtherType, payload) on
/// interface `ifindex` of the calling thread's network namespace, through one `AF_PACKET`
/// `SOCK_RAW` socket per namespace, opened on first use and kept (needs `CAP_NET_RAW`).
///
/// The socket is opened with protocol 0, so the kernel registers no receive hook for it and
/// queues nothing to it (`packet(7)`), and it is never closed. A socket opened, bound and
/// closed per frame (what a pnet datalink channel does) makes the kernel wait for an RCU
/// grace period at each close (`synchronize_net` when the protocol hook is removed, several
/// ms each) and copies every frame of the interface to it while open: a holder announcing or
/// probing 600 VIPs stalled its thread for about 10 s (the 10 000-Service cold start,
/// docs/services-bench.md). Non-blocking, with a 4 MiB send buffer
/// ([`SEND_BUFFER_BYTES`]): a buffer still full is an error for this frame (`WouldBlock`),
/// not a stalled thread; the announcement is repeated at the next `vip_arpRate`.
///
/// # Errors
/// The OS error of reading the namespace, opening the socket or sending (a frame shorter
/// than an Ethernet header is `InvalidInput`).
pub fn send_raw(ifindex: u32, frame: &[u8]) -> std::io::Result<()> {
    let ethertype = match frame.get(12..14) {
        Some(t) => u16::from_be_bytes([t[0], t[1]]),
        None => return Err(std::io::ErrorKind::InvalidInput.into()),
    };
    let mut dst = [0u8; 6];
    dst.copy_from_slice(&frame[..6]);
    let netns = thread_netns()?;
    let mut senders = SENDERS
        .lock()
        .map_err(|_| std::io::Error::other("the sender list lock is poisoned"))?;
    if !senders.iter().any(|(ns, _)| *ns == netns) {
        let sock = socket2::Socket::new(socket2::Domain::PACKET, socket2::Type::RAW, None)?;
        sock.set_nonblocking(true)?;
        widen_send_buffer(&sock);
        senders.push((netns, sock));
    }
    let Some((_, sock)) = senders.iter().find(|(ns, _)| *ns == netns) else {
        return Err(std::io::Error::other(
            "no sender for this network namespace",
        ));
    };
    let sll = sockaddr_ll(ifindex, ethertype, dst);
    // SAFETY: `frame` is valid for its length; `sll` is a valid sockaddr_ll and the length
    // is its size.
    let n = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            std::ptr::from_ref(&sll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
