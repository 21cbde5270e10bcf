//! DHCP clients for DHCP-mode Services (issue 13): one client per Service address family
//! (DHCPv4 for `0.0.0.0`, DHCPv6 IA_NA for `::`, [`v6`]), on a macvlan sub-interface vipd
//! creates for the Service (`crate::net::macvlan`; a dual-stack Service's two clients share
//! it).
//!
//! The seam the Services side uses is [`Dhcp::start`] -> [`DhcpHandle`]: the handle's
//! `state` watch says whether the Service's address may be held ([`DhcpState::Bound`],
//! [`DhcpState::Renewing`], [`DhcpState::Rebinding`]) or not (every other state). The
//! DHCPv4 machine follows RFC 2131 §4.4 (client behaviour; DHCPv6: see [`v6`]):
//!
//! ```text
//!  Requesting --ACK--> Bound --T1--> Renewing (unicast to the server)
//!      ^                  ^             |  ACK: back to Bound
//!      |                  +-------------+  T2:  Rebinding (broadcast), ACK: Bound
//!      |   NAK, expiry, or conflict (DHCPDECLINE)
//!      +---- Lost { reason } <----------+  (start over asking for the old address,
//!      |                                   capped exponential backoff between attempts)
//!      +--- N failed attempts in a row ---> GaveUp { attempts, last_error }
//! ```
//!
//! `N` is kube-vip's `dhcp_backoff_attempts` ([`DhcpClient::with_attempt_limit`]; 0, vipd's
//! default, retries forever). A client that gave up sends nothing more; it runs again, counting
//! from zero, only as a new client: the Services side starts one when the Service's DHCP
//! request changes or this node takes the Service's lease again.
//!
//! On [`DhcpHandle::stop`] the client stops and the macvlan is removed (once no client of
//! the Service uses it) with NO DHCPRELEASE / DHCPv6 Release (leadership loss, shutdown: the
//! next holder asks for the same address with the same MAC);
//! [`DhcpHandle::release_and_stop`] sends DHCPRELEASE (RFC 2131 §4.4.6) or a DHCPv6 Release
//! (RFC 8415 §18.2.7) first: the Service was deleted or is no longer a DHCP LoadBalancer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tokio::sync::{mpsc, oneshot, watch};

use crate::net::macvlan::{MacvlanError, MacvlanSpec, validate};

pub mod attempts;
pub mod client;
pub mod fake;
pub mod machine;
pub mod v6;
pub mod wire;

pub use client::{DhcpClient, RawDhcp};
pub use fake::{FakeDhcp, FakeEnd};

/// The [`DhcpState::Lost`] reason of a stopped client.
pub const STOPPED: &str = "DHCP client stopped";

/// Which protocol a client speaks: DHCPv4 (RFC 2131, a Service address `0.0.0.0`) or
/// DHCPv6 IA_NA (RFC 8415, a Service address `::`). A dual-stack Service runs one client of
/// each on the same macvlan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DhcpFamily {
    /// DHCPv4.
    V4,
    /// DHCPv6, one IA_NA address.
    V6,
}

impl DhcpFamily {
    /// `DHCP` or `DHCPv6`, for logs and Events.
    pub fn label(self) -> &'static str {
        match self {
            Self::V4 => "DHCP",
            Self::V6 => "DHCPv6",
        }
    }

    /// `v4` or `v6`, the `family` label of the `vipd_dhcp_*` metrics.
    pub fn metric(self) -> &'static str {
        match self {
            Self::V4 => "v4",
            Self::V6 => "v6",
        }
    }

    /// The host-route prefix length of a leased address: 32 or 128.
    pub fn host_prefix(self) -> u8 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }

    /// The family of `addr`.
    pub fn of(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }
}

/// What to ask for: one Service's DHCPv4 or DHCPv6 address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DhcpSpec {
    /// DHCPv4 or DHCPv6 ([`v6`]).
    pub family: DhcpFamily,
    /// Parent interface of the macvlan (`kube-vip.io/serviceInterface`, else
    /// `vip_servicesinterface`, else the VIP interface), e.g. `eth0`.
    pub parent: String,
    /// Name of the macvlan to create (`kube-vip.io/macvlanName`, else `vip-<uid[..8]>`);
    /// at most 15 bytes (`IFNAMSIZ - 1`), checked when the macvlan is created.
    pub macvlan: String,
    /// The macvlan's MAC address (`kube-vip.io/hwaddr`); also the DHCP `chaddr`, the client
    /// identifier (option 61, type 1 + this MAC) and the DHCPv6 DUID-LL: a new MAC is a new
    /// client to the server.
    pub mac: [u8; 6],
    /// Address to ask for with option 50 (`kube-vip.io/requestedIP`): the first attempt is
    /// an INIT-REBOOT DHCPREQUEST for it (RFC 2131 §4.3.2, §4.4.2); `None` starts with
    /// DHCPDISCOVER (INIT). DHCPv4 only.
    pub requested: Option<Ipv4Addr>,
    /// DHCPv6: the address to hint in the IA_NA of the Solicit (the v6 entry of
    /// `kube-vip.io/requestedIP`, RFC 8415 §18.2.1); `None` asks for any.
    pub requested_v6: Option<Ipv6Addr>,
    /// Host name sent as option 12 (`kube-vip.io/loadbalancerHostname`), `None` = not sent.
    /// DHCPv4 only (the DHCPv6 client sends no FQDN option).
    pub hostname: Option<String>,
    /// Set the BROADCAST flag (RFC 2131 §4.1) so the server broadcasts its replies
    /// (`kube-vip.io/dhcp-broadcast`). DHCPv4 only.
    pub broadcast: bool,
    /// Value for `/proc/sys/net/ipv4/conf/<macvlan>/rp_filter` (0 off, 1 strict, 2 loose;
    /// `kube-vip.io/rp_filter`, default 0).
    pub rp_filter: u8,
    /// The macvlan's ifalias, marking it as vipd's (e.g. `vipd:<service uid>`); at start vipd
    /// removes stale macvlans whose ifalias starts with `vipd:` and no others.
    pub mark: String,
    /// `mac` is the one vipd derives from the Service UID; otherwise (a MAC given by
    /// `kube-vip.io/hwaddr`) the segment is asked whether a host already uses it before the
    /// macvlan is created ([`MacvlanSpec::probe_mac`]).
    pub mac_derived: bool,
}

/// Longest host name option 12 can carry (RFC 2132 §3.14: length 1 to 255 bytes).
pub const HOSTNAME_MAX: usize = 255;

/// A [`DhcpSpec`] field the client cannot use; the message names the field and the value.
#[derive(Debug, thiserror::Error)]
pub enum DhcpSpecError {
    /// The macvlan part (name, MAC, mark, rp_filter) is invalid.
    #[error(transparent)]
    Macvlan(#[from] MacvlanError),
    /// The host name cannot be sent as option 12 ([`check_hostname`]).
    #[error("DHCP host name {hostname:?} is invalid: {why}")]
    Hostname {
        /// The value given.
        hostname: String,
        /// Why ([`check_hostname`]).
        why: String,
    },
}

impl DhcpSpec {
    /// The macvlan to create for this spec.
    pub fn macvlan_spec(&self) -> MacvlanSpec {
        MacvlanSpec {
            parent: self.parent.clone(),
            name: self.macvlan.clone(),
            mac: self.mac,
            mark: self.mark.clone(),
            rp_filter: self.rp_filter,
            ipv6_now: self.family == DhcpFamily::V6,
            own_addrs: self
                .requested
                .map(IpAddr::V4)
                .into_iter()
                .chain(self.requested_v6.map(IpAddr::V6))
                .collect(),
            probe_mac: !self.mac_derived,
        }
    }

    /// Checks what can be checked without the kernel (the client does the same when it
    /// starts, and reports a failure as `Requesting { last_error }`): the macvlan's name, MAC,
    /// mark and `rp_filter` ([`crate::net::macvlan::validate`]) and the host name.
    ///
    /// # Errors
    /// [`DhcpSpecError`] naming the field and the value.
    pub fn check(&self) -> Result<(), DhcpSpecError> {
        validate(&self.macvlan_spec())?;
        if let Some(h) = &self.hostname
            && let Err(why) = check_hostname(h)
        {
            return Err(DhcpSpecError::Hostname {
                hostname: h.clone(),
                why,
            });
        }
        Ok(())
    }
}

/// Checks a host name for DHCPv4 option 12 (`kube-vip.io/loadbalancerHostname`): 1 to
/// [`HOSTNAME_MAX`] bytes (RFC 2132 §3.14) of printable ASCII without spaces (RFC 1123
/// host names are letters, digits, `-` and `.`; `_` and other punctuation are passed
/// through, as kube-vip does, since servers differ in what they accept).
///
/// # Errors
/// Why it is refused, as text naming the rule (the caller names the field and value).
pub fn check_hostname(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > HOSTNAME_MAX {
        return Err(format!(
            "{} bytes long: a DHCP host name (option 12) has 1 to {HOSTNAME_MAX}",
            host.len()
        ));
    }
    if let Some(c) = host.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "contains {c:?}: a DHCP host name is printable ASCII without spaces"
        ));
    }
    Ok(())
}

/// A bound lease (RFC 2131 §4.4.5; DHCPv6: RFC 8415 §18.2.10.1). Instants are tokio
/// monotonic time (so paused-clock tests drive them), counted from the moment the request
/// was sent (RFC 2131 §4.4.1): DHCPv4 from the DHCPACK's option 51 (lease), 58 (T1) and 59
/// (T2); DHCPv6 from the IA Address's valid lifetime and the IA_NA's T1 and T2.
#[derive(Clone, Debug, PartialEq)]
pub struct DhcpBinding {
    /// The leased address (DHCPv4 `yiaddr`, DHCPv6 the IA Address of the IA_NA).
    pub addr: IpAddr,
    /// DHCPv4: prefix length from option 1 (subnet mask), 32 when the server sent none;
    /// DHCPv6: 128 (IA_NA carries no prefix length). The address is installed as a host
    /// route (/32, /128) regardless; this is for information.
    pub prefix_len: u8,
    /// The server that granted it: DHCPv4 option 54 (server identifier), where renewals go
    /// by unicast; DHCPv6 the Server Unicast option's address (RFC 8415 §21.12) or else the
    /// address the Reply came from (renewals then go to ff02::1:2).
    pub server: IpAddr,
    /// When the lease ends (option 51 seconds, or the valid lifetime, after the request):
    /// the address must be gone by then.
    pub expires: tokio::time::Instant,
    /// Renewal time T1 (option 58 / the IA_NA's T1; default 0.5 x lease).
    pub t1: tokio::time::Instant,
    /// Rebinding time T2 (option 59 / the IA_NA's T2; default 0.875 x lease, DHCPv6 0.8).
    pub t2: tokio::time::Instant,
}

/// The client's state, published on [`DhcpHandle::state`].
///
/// Only `Bound`, `Renewing` and `Rebinding` carry an address that may be held; on any other
/// state the holder removes the address at once. A watcher may miss a short-lived state
/// (a `Lost` immediately followed by `Requesting`), so it must judge the state it sees,
/// not the transitions.
#[derive(Clone, Debug, PartialEq)]
pub enum DhcpState {
    /// No lease: discovering or requesting (INIT, INIT-REBOOT, SELECTING, REQUESTING).
    /// `attempt` counts the failed attempts so far (0 = the first one is under way);
    /// `last_error` says why the previous attempt failed (no answer, macvlan error, ...).
    Requesting {
        /// Failed attempts so far.
        attempt: u32,
        /// Why the previous attempt failed, `None` before the first failure.
        last_error: Option<String>,
    },
    /// Leased, before T1.
    Bound(DhcpBinding),
    /// Past T1: renewing by unicast to the server (RFC 2131 §4.4.5).
    Renewing(DhcpBinding),
    /// Past T2: rebinding by broadcast.
    Rebinding(DhcpBinding),
    /// The lease ended (NAK, expiry, declined after a conflict). The client starts over,
    /// asking for the same address, after a backoff.
    Lost {
        /// Why, e.g. `DHCPNAK from 192.0.2.1`, `lease of 192.0.2.201 expired`.
        reason: String,
    },
    /// `attempts` attempts in a row failed, the limit set with
    /// [`DhcpClient::with_attempt_limit`] (kube-vip's `dhcp_backoff_attempts`): the client
    /// sends nothing more until it is stopped (kube-vip: "giving up").
    GaveUp {
        /// Failed attempts in a row: the limit.
        attempts: u32,
        /// Why the last attempt failed.
        last_error: String,
    },
}

impl DhcpState {
    /// The binding whose address may be held now, if any.
    pub fn binding(&self) -> Option<&DhcpBinding> {
        match self {
            Self::Bound(b) | Self::Renewing(b) | Self::Rebinding(b) => Some(b),
            Self::Requesting { .. } | Self::Lost { .. } | Self::GaveUp { .. } => None,
        }
    }
}

/// Starts a DHCP client (and its macvlan) for one spec.
pub trait Dhcp: Send + Sync + 'static {
    /// Creates the macvlan for `spec` and runs the client until the returned handle is
    /// stopped. Errors (bad macvlan name, missing parent, no server) do not end the client:
    /// they show as [`DhcpState::Requesting`] with `last_error`, retried with backoff, until
    /// an attempt limit (if any) is reached: then [`DhcpState::GaveUp`].
    /// Must be called inside a tokio runtime.
    fn start(&self, spec: DhcpSpec) -> DhcpHandle;
}

/// A command from the handle to its client task.
#[derive(Debug)]
pub enum DhcpCommand {
    /// The caller found the leased address in use by another host (RFC 5227 probe): send
    /// DHCPDECLINE (RFC 2131 §4.4.1) or a DHCPv6 Decline (RFC 8415 §18.2.8) for it, drop
    /// the lease and start over.
    Decline(IpAddr),
    /// Stop: send DHCPRELEASE first when `release` (RFC 2131 §4.4.6), remove the macvlan,
    /// then answer on `done`.
    Stop {
        /// Send DHCPRELEASE for the current lease before stopping.
        release: bool,
        /// Completed once the client has stopped and the macvlan is gone.
        done: oneshot::Sender<()>,
    },
}

/// The caller's end of one running client ([`Dhcp::start`]). Dropping it without
/// [`DhcpHandle::stop`] stops the client too (no DHCPRELEASE), but without waiting for it.
#[derive(Debug)]
pub struct DhcpHandle {
    /// The client's state; see [`DhcpState`].
    pub state: watch::Receiver<DhcpState>,
    commands: mpsc::UnboundedSender<DhcpCommand>,
}

impl DhcpHandle {
    /// A handle over a client task that reads `commands` and publishes on `state`
    /// (for [`Dhcp`] implementations). The task must treat a closed `commands` channel as
    /// `Stop { release: false }`.
    pub fn new(
        state: watch::Receiver<DhcpState>,
        commands: mpsc::UnboundedSender<DhcpCommand>,
    ) -> Self {
        Self { state, commands }
    }

    /// Stops the client and removes the macvlan WITHOUT DHCPRELEASE (leadership loss,
    /// shutdown). Returns once that is done (or the task is already gone); the state then
    /// reads [`DhcpState::Lost`] with the reason [`STOPPED`].
    pub async fn stop(self) {
        self.send_stop(false).await;
    }

    /// Sends DHCPRELEASE for the current lease (if any), then stops like [`Self::stop`].
    pub async fn release_and_stop(self) {
        self.send_stop(true).await;
    }

    /// Reports that `addr` is in use by another host: the client sends DHCPDECLINE for it
    /// (if it is the current lease), goes [`DhcpState::Lost`] and starts over without asking
    /// for that address again.
    pub fn decline(&self, addr: IpAddr) {
        // A closed channel means the task is gone: nothing to decline.
        let _ = self.commands.send(DhcpCommand::Decline(addr));
    }

    async fn send_stop(self, release: bool) {
        let (done, wait) = oneshot::channel();
        if self
            .commands
            .send(DhcpCommand::Stop { release, done })
            .is_ok()
        {
            // An error means the task ended without answering: it is stopped either way.
            let _ = wait.await;
        }
    }
}

#[cfg(test)]
mod spec_tests {
    use super::*;

    fn spec() -> DhcpSpec {
        DhcpSpec {
            family: DhcpFamily::V4,
            parent: "eth0".into(),
            macvlan: "vip-0123abcd".into(),
            mac: [0x02, 0, 0, 0, 0, 1],
            requested: None,
            requested_v6: None,
            hostname: Some("lb-1".into()),
            broadcast: false,
            rp_filter: 0,
            mark: "vipd:uid".into(),
            mac_derived: true,
        }
    }

    #[test]
    fn check_names_the_bad_field() {
        assert!(spec().check().is_ok());
        let mut long_name = spec();
        long_name.macvlan = "vip-0123456789ab".into();
        let e = long_name.check().unwrap_err().to_string();
        assert!(e.contains("\"vip-0123456789ab\""), "{e}");
        for bad in [String::new(), "h".repeat(256)] {
            let mut s = spec();
            s.hostname = Some(bad.clone());
            let e = s.check().unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        let mut ok = spec();
        ok.hostname = Some("h".repeat(255));
        assert!(ok.check().is_ok());
    }
}
