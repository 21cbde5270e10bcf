//! A blocking rtnetlink socket for the requests whose timing is a safety matter: an
//! address add or refresh carrying a fence lifetime ([`super::lifetime`]), and a VIP route
//! carrying one (`RTA_EXPIRES`, [`super::route`]).
//!
//! rtnetlink's asynchronous handle queues a request to its connection task, which writes it
//! when it is next polled; a lifetime computed before that can reach the kernel late. Here
//! the request is written with `send(2)`, and the kernel handles an `RTM_NEWADDR` inside
//! that call (rtnetlink requests are processed in the sender's context), so the lifetime
//! computed just before it is the one the kernel counts from. Messages are built by
//! netlink-packet-route; the socket is netlink-sys's.
//!
//! The socket is opened with the [`super::NetlinkKernel`] (so in the same network
//! namespace as its rtnetlink connection) and used from a blocking thread
//! ([`tokio::task::spawn_blocking`]), one request at a time.

use netlink_packet_route::address::{AddressFlags, AddressHeaderFlags, CacheInfo};
use std::cell::Cell;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::route::{RouteAttribute, RouteMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use super::lifetime::{Lifetime, add_within};

/// Gives an `RTM_NEWADDR` message its valid and preferred lifetimes (seconds,
/// `IFA_CACHEINFO`) and its address flags `flags` (`IFA_FLAGS`; `IFA_F_NODAD`, the only one
/// of them that fits the header's eight bits, also in the header): the one way vipd writes
/// both for its VIPs ([`vip_flags`]) and for a DHCPv6 macvlan's link-local address.
pub(crate) fn set_lifetimes(
    msg: &mut AddressMessage,
    valid: u32,
    preferred: u32,
    flags: AddressFlags,
) {
    let mut ci = CacheInfo::default();
    ci.ifa_preferred = preferred;
    ci.ifa_valid = valid;
    msg.attributes.push(AddressAttribute::CacheInfo(ci));
    if flags.contains(AddressFlags::Nodad) {
        msg.header.flags |= AddressHeaderFlags::Nodad;
    }
    if !flags.is_empty() {
        msg.attributes.push(AddressAttribute::Flags(flags));
    }
}

/// The address flags of a VIP's `RTM_NEWADDR` (add and refresh alike):
/// - `IFA_F_NODAD` for an IPv6 VIP when `skip_dad` (no duplicate address detection: the
///   conflict probe, design.md §4, does that job before the add);
/// - `IFA_F_NOPREFIXROUTE` for an IPv6 VIP of a full-length prefix (`/128`): the kernel
///   would otherwise put a `/128` route to the address in the main table next to the local
///   route that delivers its packets, one more fib6 node per VIP, which every address delete
///   walks (`rt6_remove_prefsrc`) and which sends nothing anywhere (an IPv4 `/32` gets no
///   such route either). A shorter prefix keeps its route: it reaches the subnet.
///
/// Measured: 4 000 IPv6 `/128` addresses deleted in 3.2 s with the routes, 1.7 s without
/// (`ip -batch` in a namespace; docs/services-bench.md "Kernel cost of many VIP addresses").
pub(crate) fn vip_flags(vip: &super::Vip, skip_dad: bool) -> AddressFlags {
    let mut flags = AddressFlags::empty();
    if vip.addr.is_ipv6() {
        if skip_dad {
            flags |= AddressFlags::Nodad;
        }
        if vip.prefix == 128 {
            flags |= AddressFlags::Noprefixroute;
        }
    }
    flags
}

/// How long a request waits for the kernel's answer before it is an error (the kernel
/// answers an address request at once; this bounds a stuck socket, never a normal wait).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Sends at most this many adds per call: the first, and up to two shorter ones after a
/// stall ([`add_within`]).
const ATTEMPTS: usize = 3;

/// The blocking socket and its sequence numbers.
#[derive(Debug)]
pub(super) struct AddrSocket {
    inner: Mutex<(Socket, u32)>,
}

impl AddrSocket {
    /// Opens, binds and connects the socket in the caller's network namespace.
    ///
    /// # Errors
    /// The socket's I/O error.
    pub(super) fn open() -> std::io::Result<Self> {
        let mut s = Socket::new(NETLINK_ROUTE)?;
        s.bind_auto()?;
        s.connect(&SocketAddr::new(0, 0))?;
        let tv = nix::sys::time::TimeVal::new(
            i64::try_from(ANSWER_TIMEOUT.as_secs()).unwrap_or(i64::MAX),
            0,
        );
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
            .map_err(std::io::Error::from)?;
        Ok(Self {
            inner: Mutex::new((s, 0)),
        })
    }

    /// Adds (`replace` false: `NLM_F_EXCL`) or replaces (`NLM_F_REPLACE`) the address
    /// `msg` describes with the lifetimes [`add_within`] computes from `lifetime` right
    /// before each send (`preferred_lft` 0, the address flags `flags`), and deletes it
    /// when the kernel may have taken a lifetime reaching past `lifetime.until`. Blocking.
    ///
    /// Returns the seconds the address holds (0: not added, or deleted).
    ///
    /// # Errors
    /// The kernel's refusal as [`rtnetlink::Error::NetlinkError`] (so callers read its
    /// errno as for any rtnetlink request), or [`rtnetlink::Error::RequestFailed`] when
    /// the socket fails or no answer comes within [`ANSWER_TIMEOUT`].
    pub(super) fn add(
        &self,
        msg: &AddressMessage,
        lifetime: &Lifetime,
        flags: AddressFlags,
        replace: bool,
    ) -> Result<u32, rtnetlink::Error> {
        // A panic while holding the socket leaves it usable: each request stands alone.
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (sock, next_seq) = &mut *guard;
        let seq = Cell::new(*next_seq);
        let create = if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
        let mut base = msg.clone();
        base.attributes
            .retain(|a| !matches!(a, AddressAttribute::CacheInfo(_)));
        let mut first = true;
        let r = add_within(
            lifetime,
            ATTEMPTS,
            tokio::time::Instant::now,
            // The kernel refused: it took nothing. Any other failure (the socket, the
            // answer) may have come after it took the request.
            |e| !matches!(e, rtnetlink::Error::NetlinkError(_)),
            |secs| {
                let mut m = base.clone();
                set_lifetimes(&mut m, secs, 0, flags);
                // A shorter lifetime after a stall replaces the address just added.
                let flags = if first { create } else { NLM_F_REPLACE };
                first = false;
                request(
                    sock,
                    &seq,
                    RouteNetlinkMessage::NewAddress(m),
                    NLM_F_CREATE | flags,
                )
            },
            || {
                match request(sock, &seq, RouteNetlinkMessage::DelAddress(base.clone()), 0) {
                    // Already gone (expired meanwhile): what the delete was for.
                    Err(rtnetlink::Error::NetlinkError(e))
                        if e.code.is_some_and(|c| {
                            matches!(
                                c.get().abs(),
                                nix::libc::EADDRNOTAVAIL | nix::libc::ENOENT | nix::libc::ENODEV
                            )
                        }) =>
                    {
                        Ok(())
                    }
                    r => r,
                }
            },
        );
        *next_seq = seq.get();
        r
    }
}

impl AddrSocket {
    /// Adds or replaces (`replace`: `NLM_F_CREATE | NLM_F_REPLACE`, like `ip route
    /// replace`; else `NLM_F_CREATE | NLM_F_EXCL`, like `ip route add`, which the kernel
    /// refuses with `EEXIST` when a route of that destination and metric exists) the route
    /// `msg` describes with `RTA_EXPIRES` set to the seconds [`add_within`] computes
    /// from `lifetime` right before each send, and deletes it when the kernel may have
    /// taken an expiry reaching past `lifetime.until`. Blocking. Only the IPv6 kernel
    /// honours `RTA_EXPIRES` (fib6 garbage collection); IPv4 ignores it.
    ///
    /// Returns the seconds the route holds (0: not added, or deleted).
    ///
    /// # Errors
    /// As [`Self::add`].
    pub(super) fn route(
        &self,
        msg: &RouteMessage,
        lifetime: &Lifetime,
        replace: bool,
    ) -> Result<u32, rtnetlink::Error> {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (sock, next_seq) = &mut *guard;
        let seq = Cell::new(*next_seq);
        let mut base = msg.clone();
        base.attributes
            .retain(|a| !matches!(a, RouteAttribute::Expires(_)));
        let create = if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
        let mut first = true;
        let r = add_within(
            lifetime,
            ATTEMPTS,
            tokio::time::Instant::now,
            |e| !matches!(e, rtnetlink::Error::NetlinkError(_)),
            |secs| {
                let mut m = base.clone();
                m.attributes.push(RouteAttribute::Expires(secs));
                // A shorter expiry after a stall replaces the route just added.
                let flags = if first { create } else { NLM_F_REPLACE };
                first = false;
                request(
                    sock,
                    &seq,
                    RouteNetlinkMessage::NewRoute(m),
                    NLM_F_CREATE | flags,
                )
            },
            || match request(sock, &seq, RouteNetlinkMessage::DelRoute(base.clone()), 0) {
                // Already gone (expired meanwhile): what the delete was for.
                Err(rtnetlink::Error::NetlinkError(e))
                    if e.code.is_some_and(|c| {
                        matches!(c.get().abs(), nix::libc::ESRCH | nix::libc::ENOENT)
                    }) =>
                {
                    Ok(())
                }
                r => r,
            },
        );
        *next_seq = seq.get();
        r
    }
}

/// Sends one request with `NLM_F_REQUEST | NLM_F_ACK | flags` and waits for its answer
/// (by sequence number; anything else on the socket is stale and skipped).
fn request(
    sock: &Socket,
    seq: &Cell<u32>,
    payload: RouteNetlinkMessage,
    flags: u16,
) -> Result<(), rtnetlink::Error> {
    seq.set(seq.get().wrapping_add(1));
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = seq.get();
    let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
    nl.finalize();
    let mut buf = vec![0u8; nl.buffer_len()];
    nl.serialize(&mut buf);
    sock.send(&buf, 0)
        .map_err(|_| rtnetlink::Error::RequestFailed)?;
    loop {
        let (data, _) = sock
            .recv_from_full()
            .map_err(|_| rtnetlink::Error::RequestFailed)?;
        for m in super::nlmsg::messages::<RouteNetlinkMessage>(&data) {
            let m = m.map_err(|_| rtnetlink::Error::RequestFailed)?;
            if m.header.sequence_number != seq.get() {
                continue;
            }
            match m.payload {
                NetlinkPayload::Error(e) if e.code.is_none() => return Ok(()),
                NetlinkPayload::Error(e) => return Err(rtnetlink::Error::NetlinkError(e)),
                other => {
                    return Err(rtnetlink::Error::UnexpectedMessage(NetlinkMessage::new(
                        m.header, other,
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Vip;

    fn vip(s: &str, prefix: u8) -> Vip {
        Vip::new(s.parse().unwrap(), prefix).unwrap()
    }

    #[test]
    fn an_ipv6_host_vip_has_no_prefix_route_and_skips_dad_when_asked() {
        let f = |v: &Vip, skip| vip_flags(v, skip);
        assert_eq!(
            f(&vip("2001:db8::1", 128), true),
            AddressFlags::Nodad | AddressFlags::Noprefixroute
        );
        assert_eq!(
            f(&vip("2001:db8::1", 128), false),
            AddressFlags::Noprefixroute
        );
        // A subnet prefix keeps the route that reaches the subnet.
        assert_eq!(f(&vip("2001:db8::1", 64), true), AddressFlags::Nodad);
        assert_eq!(f(&vip("2001:db8::1", 64), false), AddressFlags::empty());
        // IPv4: no DAD, and a /32 never gets a prefix route from the kernel.
        assert_eq!(f(&vip("192.0.2.10", 32), true), AddressFlags::empty());
        assert_eq!(f(&vip("192.0.2.10", 24), true), AddressFlags::empty());
    }

    #[test]
    fn the_flags_go_in_ifa_flags_and_nodad_also_in_the_header() {
        let mut m = AddressMessage::default();
        set_lifetimes(
            &mut m,
            9,
            0,
            AddressFlags::Nodad | AddressFlags::Noprefixroute,
        );
        assert!(m.header.flags.contains(AddressHeaderFlags::Nodad));
        assert!(m.attributes.iter().any(|a| matches!(
            a,
            AddressAttribute::Flags(f) if *f == AddressFlags::Nodad | AddressFlags::Noprefixroute
        )));
        assert!(m.attributes.iter().any(
            |a| matches!(a, AddressAttribute::CacheInfo(c) if c.ifa_valid == 9 && c.ifa_preferred == 0)
        ));
        let mut m = AddressMessage::default();
        set_lifetimes(&mut m, 9, 9, AddressFlags::empty());
        assert!(!m.header.flags.contains(AddressHeaderFlags::Nodad));
        assert!(
            !m.attributes
                .iter()
                .any(|a| matches!(a, AddressAttribute::Flags(_)))
        );
    }
}
