//! Peer frames on the wire: an `AF_PACKET`/`SOCK_RAW` socket bound to the VIP interface and
//! to EtherType [`ETHERTYPE`], so the kernel hands over only peer frames; a member of the
//! group MAC [`GROUP_MAC`] (a NIC's multicast filter lets the frames in); with kernel receive
//! timestamps (`SO_TIMESTAMPNS`), the arrival instants `ridethrough` relies on: a frame that
//! waited in the queue while vipd was frozen keeps the time it arrived.
//!
//! Not pnet's datalink channel: its receiver binds
//! `ETH_P_ALL` (every frame of the interface through user space, filtered there) and reads
//! with `recvfrom`, without timestamps. The socket calls follow `net::conflict`'s capture
//! socket.
//!
//! Blocking reads with a timeout ([`PeerSocket::recv`]); the manager reads on a thread of
//! its own (`peer::node`).

use std::io::IoSliceMut;
use std::os::fd::AsRawFd;
use std::time::{Duration, SystemTime};

use nix::sys::socket::{
    ControlMessageOwned, LinkAddr, MsgFlags, recvmsg, setsockopt, sockopt::ReceiveTimestampns,
};

use super::wire::{ETHERTYPE, GROUP_MAC, MAX_PAYLOAD};
use crate::net::LinkInfo;
use crate::net::packet::{bound_packet_socket, sockaddr_ll};

/// `PACKET_OUTGOING`: a frame this host sent, looped back to packet sockets.
const PACKET_OUTGOING: u8 = 4;
/// Ethernet header: destination, source, EtherType.
const ETH_HEADER: usize = 14;

/// Errors of the peer socket.
#[derive(Debug, thiserror::Error)]
pub enum PeerSocketError {
    /// A socket call failed.
    #[error("peer socket on {ifname}: {what}: {source}")]
    Io {
        /// Interface name.
        ifname: String,
        /// Which step failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The interface has no MAC address (e.g. `lo`, tun devices): no Ethernet frames.
    #[error("peer socket on {ifname}: the interface has no MAC address")]
    NoMac {
        /// Interface name.
        ifname: String,
    },
    /// The payload does not fit in one frame.
    #[error("peer socket on {ifname}: payload of {len} bytes, at most {max}")]
    TooLong {
        /// Interface name.
        ifname: String,
        /// Payload length, in bytes.
        len: usize,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
}

/// One received peer frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The payload after the Ethernet header (for [`super::wire::Verifier::verify`]).
    pub payload: Vec<u8>,
    /// Source MAC address.
    pub src: [u8; 6],
    /// When the kernel received it (`SO_TIMESTAMPNS`, wall clock); `None` if the kernel gave
    /// no timestamp.
    pub arrived: Option<SystemTime>,
}

/// The peer protocol's socket on one interface.
#[derive(Debug)]
pub struct PeerSocket {
    sock: socket2::Socket,
    link: LinkInfo,
}

fn sockaddr(link: &LinkInfo, mac: [u8; 6]) -> libc::sockaddr_ll {
    sockaddr_ll(link.index, ETHERTYPE, mac)
}

impl PeerSocket {
    /// Opens the socket on `link` (needs `CAP_NET_RAW`).
    ///
    /// # Errors
    /// [`PeerSocketError::NoMac`] for an interface without MAC; [`PeerSocketError::Io`]
    /// naming the step that failed (open, bind, group membership, timestamps).
    pub fn open(link: &LinkInfo) -> Result<Self, PeerSocketError> {
        if link.mac == [0; 6] {
            return Err(PeerSocketError::NoMac {
                ifname: link.name.clone(),
            });
        }
        let err = |what| {
            let ifname = link.name.clone();
            move |source| PeerSocketError::Io {
                ifname,
                what,
                source,
            }
        };
        let sock = bound_packet_socket(link.index, socket2::Type::RAW, ETHERTYPE)
            .map_err(|(what, source)| err(what)(source))?;
        let mut addr = [0u8; 8];
        addr[..6].copy_from_slice(&GROUP_MAC);
        let mreq = libc::packet_mreq {
            mr_ifindex: i32::try_from(link.index).unwrap_or(0),
            mr_type: libc::PACKET_MR_MULTICAST as libc::c_ushort,
            mr_alen: 6,
            mr_address: addr,
        };
        // SAFETY: `mreq` is a valid packet_mreq for the duration of the call; the length is
        // its size.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                std::ptr::from_ref(&mreq).cast(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(err("join the group MAC")(std::io::Error::last_os_error()));
        }
        setsockopt(&sock, ReceiveTimestampns, &true)
            .map_err(|e| err("enable receive timestamps")(e.into()))?;
        Ok(PeerSocket {
            sock,
            link: link.clone(),
        })
    }

    /// Sends one payload to the group MAC.
    ///
    /// # Errors
    /// [`PeerSocketError::TooLong`] above [`MAX_PAYLOAD`]; [`PeerSocketError::Io`] when the
    /// kernel refuses the frame.
    pub fn send(&self, payload: &[u8]) -> Result<(), PeerSocketError> {
        if payload.len() > MAX_PAYLOAD {
            return Err(PeerSocketError::TooLong {
                ifname: self.link.name.clone(),
                len: payload.len(),
                max: MAX_PAYLOAD,
            });
        }
        let mut frame = Vec::with_capacity(ETH_HEADER + payload.len());
        frame.extend_from_slice(&GROUP_MAC);
        frame.extend_from_slice(&self.link.mac);
        frame.extend_from_slice(&ETHERTYPE.to_be_bytes());
        frame.extend_from_slice(payload);
        self.send_frame(&frame)
    }

    /// Sends one whole Ethernet frame as it is.
    fn send_frame(&self, frame: &[u8]) -> Result<(), PeerSocketError> {
        let sll = sockaddr(&self.link, GROUP_MAC);
        // SAFETY: `frame` is valid for its length; `sll` is a valid sockaddr_ll and the
        // length is its size.
        let n = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::from_ref(&sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(PeerSocketError::Io {
                ifname: self.link.name.clone(),
                what: "send",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Waits up to `timeout` (at least 1 µs) for one peer frame from another host; `None` when
    /// none came. Frames this host sent, and frames too short for an Ethernet header, are
    /// skipped.
    ///
    /// # Errors
    /// [`PeerSocketError::Io`] when reading fails.
    pub fn recv(&self, timeout: Duration) -> Result<Option<Received>, PeerSocketError> {
        let err = |what| {
            let ifname = self.link.name.clone();
            move |source| PeerSocketError::Io {
                ifname,
                what,
                source,
            }
        };
        let deadline = std::time::Instant::now() + timeout;
        let mut buf = vec![0u8; ETH_HEADER + MAX_PAYLOAD + 64];
        loop {
            let left = deadline
                .saturating_duration_since(std::time::Instant::now())
                .max(Duration::from_micros(1));
            self.sock
                .set_read_timeout(Some(left))
                .map_err(err("set the read timeout"))?;
            let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
            let mut iov = [IoSliceMut::new(&mut buf)];
            let r = recvmsg::<LinkAddr>(
                self.sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::empty(),
            );
            let msg = match r {
                Ok(m) => m,
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {
                    if std::time::Instant::now() >= deadline {
                        return Ok(None);
                    }
                    continue;
                }
                Err(e) => return Err(err("receive")(e.into())),
            };
            let len = msg.bytes;
            let outgoing = msg.address.is_some_and(|a| a.pkttype() == PACKET_OUTGOING);
            let mut arrived = None;
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmTimestampns(ts) = c {
                        let d = Duration::new(
                            u64::try_from(ts.tv_sec()).unwrap_or(0),
                            u32::try_from(ts.tv_nsec()).unwrap_or(0),
                        );
                        arrived = SystemTime::UNIX_EPOCH.checked_add(d);
                    }
                }
            }
            let frame = buf.get(..len).unwrap_or_default();
            if outgoing || frame.len() < ETH_HEADER || frame[12..14] != ETHERTYPE.to_be_bytes() {
                continue;
            }
            let mut src = [0u8; 6];
            src.copy_from_slice(&frame[6..12]);
            return Ok(Some(Received {
                payload: frame[ETH_HEADER..].to_vec(),
                src,
                arrived,
            }));
        }
    }
}
