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
