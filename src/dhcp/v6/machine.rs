//! The RFC 8415 client state machine for one IA_NA address (§18.2), without I/O: fed
//! received messages, timeouts and the caller's commands, it answers with the messages to
//! send. Times are tokio [`Instant`]s passed in by the caller, so tests drive it with a
//! paused clock.
//!
//! Timing (RFC 8415 §7.6, §15), mirroring the DHCPv4 machine ([`crate::dhcp::machine`])
//! where the RFC leaves a choice:
//! - Solicit and Request: sent at once, retransmitted after 1 s, 2 s, 4 s (SOL_TIMEOUT /
//!   REQ_TIMEOUT = 1 s, doubling) and given up 4 s after the last send: 11 s per attempt,
//!   so that a missing server is reported (a Warning Event per failed attempt) within
//!   seconds rather than retransmitting up to SOL_MAX_RT (3600 s); between failed attempts
//!   the DHCPv4 [`backoff`] (1 s doubling to 60 s). Each retransmission wait is randomised
//!   by ±10 % ([`RETRANSMIT_SPREAD_V6`], the RAND of §15), so that the clients of many
//!   Services started at once do not retransmit in step;
//! - after [`Config6::max_attempts`] failed attempts in a row (kube-vip's
//!   `dhcp_backoff_attempts`; 0 = no limit) it gives up ([`DhcpState::GaveUp`], the DHCPv4
//!   rule [`exhausted`]) and sends nothing more; a lease resets the count, and the attempts
//!   after a lease ends count from one;
//! - the first Advertise with an address is taken (no wait for more, §18.2.1 allows it);
//! - Renew at T1: after REN_TIMEOUT (10 s) doubling up to REN_MAX_RT (600 s), never past
//!   T2; Rebind at T2: after REB_TIMEOUT (10 s) doubling up to REB_MAX_RT (600 s), never
//!   past the valid lifetime's end (§18.2.4, §18.2.5);
//! - T1 / T2 of 0 (the server leaves them to the client) or not T1 <= T2 < valid lifetime:
//!   0.5 and 0.8 x the preferred lifetime (§21.4), within the valid lifetime;
//! - NoBinding or NotOnLink in a Renew/Rebind Reply, a valid lifetime of 0 (the server
//!   withdrew the address) or expiry: [`DhcpState::Lost`] at once for [`LOST_HOLDOFF`], then
//!   a new Solicit hinting the old address; NoAddrsAvail answering a Request: a failed
//!   attempt (backoff), still hinting it;
//! - a conflict: Decline (§18.2.8, sent once) and [`DECLINE_HOLDOFF`] before a new
//!   Solicit that never asks for the declined address; Release (§18.2.7) is sent once, as
//!   the client stops and its macvlan goes away (no REL_MAX_RC retransmissions).

use std::collections::BTreeSet;
use std::net::Ipv6Addr;
use std::time::Duration;

use dhcproto::v6::{DhcpOption, Message, MessageType, OptionCode, Status};
use tokio::time::Instant;

use crate::dhcp::machine::{
    DECLINE_HOLDOFF, Exchange, LOST_HOLDOFF, backoff, exhausted, lease_secs, next_xid,
};
use crate::dhcp::{DhcpBinding, DhcpState};
use messages::{IaResult, status_text};

/// `All_DHCP_Relay_Agents_and_Servers` (RFC 8415 §7.1): where the client sends unless told
/// to unicast.
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
/// Randomisation of a Solicit / Request retransmission wait, in percent either way (RFC
/// 8415 §15: RAND uniform in -0.1 to +0.1).
pub const RETRANSMIT_SPREAD_V6: u32 = 10;

/// REN_TIMEOUT and REB_TIMEOUT (RFC 8415 §7.6): first Renew / Rebind retransmission.
pub const RENEW_TIMEOUT: Duration = Duration::from_secs(10);
/// REN_MAX_RT and REB_MAX_RT (RFC 8415 §7.6): longest Renew / Rebind retransmission
/// interval.
pub const RENEW_MAX_RT: Duration = Duration::from_secs(600);
/// Ethernet's hardware type in a DUID-LL (RFC 826 / IANA `hardware type` 1).
const HTYPE_ETHERNET: u16 = 1;

/// Client settings the machine needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config6 {
    /// The macvlan's MAC: the DUID-LL ([`Config6::duid`]) and the IAID ([`Config6::iaid`]).
    pub mac: [u8; 6],
    /// Address to hint in the IA_NA of the first Solicit (`kube-vip.io/requestedIP`).
    pub requested: Option<Ipv6Addr>,
    /// Give up after this many failed attempts in a row ([`exhausted`]); 0 = never.
    pub max_attempts: u32,
}

impl Config6 {
    /// The client DUID: DUID-LL (RFC 8415 §11.4: type 3, hardware type 1, the MAC). Built
    /// here because `dhcproto`'s `Duid::link_layer` takes a 16-byte address.
    pub fn duid(&self) -> Vec<u8> {
        let mut duid = vec![0, 3];
        duid.extend_from_slice(&HTYPE_ETHERNET.to_be_bytes());
        duid.extend_from_slice(&self.mac);
        duid
    }

    /// The IA_NA's IAID: the MAC's last four bytes (stable across nodes and restarts, as
    /// RFC 8415 §12 asks, because the MAC moves with the Service).
    pub fn iaid(&self) -> u32 {
        u32::from_be_bytes([self.mac[2], self.mac[3], self.mac[4], self.mac[5]])
    }
}

/// Where a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest6 {
    /// [`ALL_SERVERS`] on the macvlan.
    AllServers,
    /// The server's unicast address (RFC 8415 §21.12 Server Unicast option).
    Unicast(Ipv6Addr),
}

/// A message to send: UDP from port 546 (the macvlan's link-local address) to port 547.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing6 {
    /// The DHCPv6 message.
    pub msg: Message,
    /// Where to.
    pub dest: Dest6,
}

/// A lease as the machine keeps it.
#[derive(Debug, Clone, PartialEq)]
struct Lease6 {
    addr: Ipv6Addr,
    /// The Server Identifier option's DUID.
    server_id: Vec<u8>,
    /// Where the Reply came from.
    from: Ipv6Addr,
    /// The Server Unicast option, when given: Renew and Release go there.
    unicast: Option<Ipv6Addr>,
    expires: Instant,
    t1: Instant,
    t2: Instant,
}

impl Lease6 {
    fn public(&self) -> DhcpBinding {
        DhcpBinding {
            addr: self.addr.into(),
            prefix_len: 128,
            server: self.unicast.unwrap_or(self.from).into(),
            expires: self.expires,
            t1: self.t1,
            t2: self.t2,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Solicit sent, waiting for an Advertise.
    Soliciting(Exchange),
    /// Request for an advertised address sent.
    Requesting {
        addr: Ipv6Addr,
        server_id: Vec<u8>,
        ex: Exchange,
    },
    Bound(Lease6),
    Renewing {
        lease: Lease6,
        ex: Exchange,
    },
    Rebinding {
        lease: Lease6,
        ex: Exchange,
    },
    /// Waiting until `until`, then soliciting.
    Waiting {
        until: Instant,
    },
    /// [`Config6::max_attempts`] attempts in a row failed: nothing more is sent.
    GaveUp,
    Stopped,
}

/// The DHCPv6 client state machine for one IA_NA address.
#[derive(Debug, Clone)]
pub struct Machine6 {
    cfg: Config6,
    duid: Vec<u8>,
    phase: Phase,
    xid_seed: u32,
    failures: u32,
    last_error: Option<String>,
    lost: Option<String>,
    /// Address hinted in the Solicit's IA_NA (the last one asked for or leased).
    hint: Option<Ipv6Addr>,
    declined: BTreeSet<Ipv6Addr>,
}

impl Machine6 {
    /// A machine that starts soliciting at `now`, hinting `cfg.requested`. `xid_seed` seeds
    /// the transaction ids (any value; a random one in production).
    pub fn new(cfg: Config6, now: Instant, xid_seed: u32) -> Self {
        Self {
            duid: cfg.duid(),
            hint: cfg.requested,
            cfg,
            phase: Phase::Waiting { until: now },
            xid_seed,
            failures: 0,
            last_error: None,
            lost: None,
            declined: BTreeSet::new(),
        }
    }

    /// This machine with `failures` failed attempts already counted (the client task's
    /// failed macvlan setups before it), so that the attempt limit and the attempt numbers
    /// go on from there.
    pub fn after_failures(mut self, failures: u32) -> Self {
        self.failures = failures;
        self
    }

    /// The state to publish (as the DHCPv4 machine's: only Bound, Renewing and Rebinding
    /// carry an address that may be held).
    pub fn state(&self) -> DhcpState {
        match &self.phase {
            Phase::Bound(l) => DhcpState::Bound(l.public()),
            Phase::GaveUp => DhcpState::GaveUp {
                attempts: self.failures,
                last_error: self.last_error.clone().unwrap_or_default(),
            },
            Phase::Renewing { lease, .. } => DhcpState::Renewing(lease.public()),
            Phase::Rebinding { lease, .. } => DhcpState::Rebinding(lease.public()),
            Phase::Waiting { .. } | Phase::Stopped if self.lost.is_some() => DhcpState::Lost {
                reason: self.lost.clone().unwrap_or_default(),
            },
            _ => DhcpState::Requesting {
                attempt: self.failures,
                last_error: self.last_error.clone(),
            },
        }
    }

    /// When [`Machine6::on_timeout`] must be called next; `None` once stopped.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Soliciting(ex)
            | Phase::Requesting { ex, .. }
            | Phase::Renewing { ex, .. }
            | Phase::Rebinding { ex, .. } => Some(ex.next),
            Phase::Bound(l) => Some(l.t1),
            Phase::Waiting { until } => Some(*until),
            Phase::GaveUp | Phase::Stopped => None,
        }
    }

    /// The transaction id (24 bits) replies must carry now, if an exchange is in flight.
    pub fn xid(&self) -> Option<u32> {
        match &self.phase {
            Phase::Soliciting(ex)
            | Phase::Requesting { ex, .. }
            | Phase::Renewing { ex, .. }
            | Phase::Rebinding { ex, .. } => Some(ex.xid),
            _ => None,
        }
    }

    fn new_exchange(&mut self, now: Instant) -> Exchange {
        Exchange::first(
            next_xid(&mut self.xid_seed) & 0x00ff_ffff,
            now,
            RETRANSMIT_SPREAD_V6,
        )
    }

    fn start_attempt(&mut self, now: Instant) -> Option<Outgoing6> {
        self.lost = None;
        let ex = self.new_exchange(now);
        self.phase = Phase::Soliciting(ex);
        self.current_message(now)
    }

    /// An attempt failed at `now` for `error`: wait [`backoff`] before the next one, or
    /// give up when that was the last one allowed.
    fn fail_attempt(&mut self, now: Instant, error: String) {
        self.failures = self.failures.saturating_add(1);
        self.last_error = Some(error);
        self.phase = if exhausted(self.failures, self.cfg.max_attempts) {
            Phase::GaveUp
        } else {
            Phase::Waiting {
                until: now + backoff(self.failures),
            }
        };
    }

    fn lose(&mut self, now: Instant, reason: String, holdoff: Duration) {
        self.lost = Some(reason);
        self.failures = 0;
        self.last_error = None;
        self.phase = Phase::Waiting {
            until: now + holdoff,
        };
    }

    /// Next Renew/Rebind retransmission: [`RENEW_TIMEOUT`] doubling per send up to
    /// [`RENEW_MAX_RT`], never past `end`.
    fn renew_next(now: Instant, sends: u32, end: Instant) -> Instant {
        let rt = RENEW_TIMEOUT
            .saturating_mul(1 << sends.saturating_sub(1).min(10))
            .min(RENEW_MAX_RT);
        (now + rt).min(end)
    }

    /// Handles the deadline ([`Machine6::deadline`]) having passed at `now`; returns what to
    /// send.
    pub fn on_timeout(&mut self, now: Instant) -> Vec<Outgoing6> {
        if self.deadline().is_none_or(|d| now < d) {
            return Vec::new();
        }
        match &mut self.phase {
            Phase::Waiting { .. } => self.start_attempt(now).into_iter().collect(),
            Phase::Soliciting(ex) => {
                if ex.retransmit(now) {
                    return self.current_message(now).into_iter().collect();
                }
                let (sends, secs) = (ex.sends, now.saturating_duration_since(ex.started));
                self.fail_attempt(
                    now,
                    format!(
                        "no DHCPv6 Advertise from any server ({sends} Solicits over {} s)",
                        secs.as_secs()
                    ),
                );
                Vec::new()
            }
            Phase::Requesting { addr, ex, .. } => {
                if ex.retransmit(now) {
                    return self.current_message(now).into_iter().collect();
                }
                let (addr, sends) = (*addr, ex.sends);
                self.fail_attempt(
                    now,
                    format!("no DHCPv6 Reply to the Request for {addr} ({sends} Requests)"),
                );
                Vec::new()
            }
            Phase::Bound(lease) => {
                // T1: Renew (§18.2.4).
                let lease = lease.clone();
                let mut ex = self.new_exchange(now);
                ex.next = Self::renew_next(now, 1, lease.t2);
                self.phase = Phase::Renewing { lease, ex };
                self.current_message(now).into_iter().collect()
            }
            Phase::Renewing { lease, ex } => {
                if now >= lease.t2 {
                    // T2: Rebind to any server (§18.2.5).
                    let lease = lease.clone();
                    let mut ex = self.new_exchange(now);
                    ex.next = Self::renew_next(now, 1, lease.expires);
                    self.phase = Phase::Rebinding { lease, ex };
                } else {
                    ex.sends += 1;
                    ex.sent = now;
                    ex.next = Self::renew_next(now, ex.sends, lease.t2);
                }
                self.current_message(now).into_iter().collect()
            }
            Phase::Rebinding { lease, ex } => {
                if now >= lease.expires {
                    let addr = lease.addr;
                    self.hint = Some(addr);
                    self.lose(
                        now,
                        format!("valid lifetime of {addr} ended without renewal"),
                        LOST_HOLDOFF,
                    );
                    Vec::new()
                } else {
                    ex.sends += 1;
                    ex.sent = now;
                    ex.next = Self::renew_next(now, ex.sends, lease.expires);
                    self.current_message(now).into_iter().collect()
                }
            }
            Phase::GaveUp | Phase::Stopped => Vec::new(),
        }
    }

    /// Handles a message received at `now` from `from` (its IPv6 source); returns what to
    /// send. Messages for another transaction or client are ignored.
    pub fn on_message(&mut self, now: Instant, from: Ipv6Addr, msg: &Message) -> Vec<Outgoing6> {
        if Some(msg.xid_num()) != self.xid() {
            return Vec::new();
        }
        match msg.opts().get(OptionCode::ClientId) {
            Some(DhcpOption::ClientId(id)) if *id == self.duid => {}
            _ => return Vec::new(),
        }
        let Some(DhcpOption::ServerId(server_id)) = msg.opts().get(OptionCode::ServerId) else {
            return Vec::new();
        };
        let server_id = server_id.clone();
        let unicast = match msg.opts().get(OptionCode::ServerUnicast) {
            Some(DhcpOption::ServerUnicast(a)) => Some(*a),
            _ => None,
        };
        let result = self.ia_result(msg);
        match (&self.phase, msg.msg_type()) {
            (Phase::Soliciting(_), MessageType::Advertise) => {
                let IaResult::Addr { addr, valid, .. } = result else {
                    if let IaResult::Status(status, text) = result {
                        self.last_error = Some(format!(
                            "DHCPv6 Advertise from {from}: {}",
                            status_text(status, &text)
                        ));
                    }
                    return Vec::new();
                };
                if valid == 0 || self.declined.contains(&addr) {
                    return Vec::new();
                }
                // §18.2.2: a Request (new transaction) to the advertising server.
                let ex = self.new_exchange(now);
                self.phase = Phase::Requesting {
                    addr,
                    server_id,
                    ex,
                };
                self.current_message(now).into_iter().collect()
            }
            (
                Phase::Requesting { ex, .. }
                | Phase::Renewing { ex, .. }
                | Phase::Rebinding { ex, .. },
                MessageType::Reply,
            ) => {
                if let IaResult::Addr {
                    addr,
                    preferred,
                    valid,
                    t1,
                    t2,
                } = result
                    && valid > 0
                {
                    let sent = ex.sent;
                    let times = [preferred, valid, t1, t2];
                    self.bind(sent, addr, server_id, from, unicast, times);
                    return Vec::new();
                }
                self.on_failed_reply(now, from, result)
            }
            _ => Vec::new(),
        }
    }

    /// A Reply without a usable address: to a Request, a failed attempt; to a Renew or
    /// Rebind, the lease ends (withdrawn, NoBinding, NotOnLink), the message goes again to
    /// ff02::1:2 (UseMulticast), or nothing changes and the retransmissions go on
    /// (§18.2.10.1).
    fn on_failed_reply(
        &mut self,
        now: Instant,
        from: Ipv6Addr,
        result: IaResult,
    ) -> Vec<Outgoing6> {
        let old = match &self.phase {
            Phase::Requesting { addr, .. } => {
                let asked = *addr;
                let why = match result {
                    IaResult::Status(status, text) => status_text(status, &text),
                    _ => "no address".to_string(),
                };
                self.fail_attempt(
                    now,
                    format!("DHCPv6 Reply from {from} to the Request for {asked}: {why}"),
                );
                return Vec::new();
            }
            Phase::Renewing { lease, .. } | Phase::Rebinding { lease, .. } => lease.addr,
            _ => return Vec::new(),
        };
        match result {
            IaResult::Addr { addr, .. } => {
                self.hint = None;
                self.lose(
                    now,
                    format!("DHCPv6 server {from} withdrew {addr} (valid lifetime 0)"),
                    LOST_HOLDOFF,
                );
                Vec::new()
            }
            IaResult::Status(Status::UseMulticast, _) => {
                // §18.2.10: send again to All_DHCP_Relay_Agents_and_Servers.
                if let Phase::Renewing { lease, .. } = &mut self.phase {
                    lease.unicast = None;
                }
                self.current_message(now).into_iter().collect()
            }
            IaResult::Status(status @ (Status::NoBinding | Status::NotOnLink), text) => {
                self.hint = Some(old);
                self.lose(
                    now,
                    format!(
                        "DHCPv6 server {from} answered the renewal of {old} with {}",
                        status_text(status, &text)
                    ),
                    LOST_HOLDOFF,
                );
                Vec::new()
            }
            IaResult::Status(..) | IaResult::Nothing => Vec::new(),
        }
    }

    /// Bound to `addr` from a Reply to the message sent at `sent`; `times` = the IA
    /// Address's preferred and valid lifetimes and the IA_NA's T1, T2 (seconds).
    fn bind(
        &mut self,
        sent: Instant,
        addr: Ipv6Addr,
        server_id: Vec<u8>,
        from: Ipv6Addr,
        unicast: Option<Ipv6Addr>,
        times: [u32; 4],
    ) {
        let [preferred, valid, t1, t2] = times;
        let valid_d = lease_secs(valid);
        let base = if preferred > 0 && preferred <= valid {
            lease_secs(preferred)
        } else {
            valid_d
        };
        let (t1, t2) = (lease_secs(t1), lease_secs(t2));
        let (t1, t2) = if t1 > Duration::ZERO && t1 <= t2 && t2 < valid_d {
            (t1, t2)
        } else {
            (base / 2, base * 4 / 5)
        };
        self.failures = 0;
        self.last_error = None;
        self.lost = None;
        self.hint = Some(addr);
        self.phase = Phase::Bound(Lease6 {
            addr,
            server_id,
            from,
            unicast,
            expires: sent + valid_d,
            t1: sent + t1,
            t2: sent + t2,
        });
    }

    /// The current lease, if the address may be held.
    fn lease(&self) -> Option<&Lease6> {
        match &self.phase {
            Phase::Bound(l)
            | Phase::Renewing { lease: l, .. }
            | Phase::Rebinding { lease: l, .. } => Some(l),
            _ => None,
        }
    }

    /// The caller found `addr` in use by another host. When it is the current lease: returns
    /// the Decline (§18.2.8), goes Lost and solicits again after [`DECLINE_HOLDOFF`], never
    /// asking for `addr` again.
    pub fn decline(&mut self, now: Instant, addr: Ipv6Addr) -> Vec<Outgoing6> {
        let Some(lease) = self.lease().filter(|l| l.addr == addr).cloned() else {
            return Vec::new();
        };
        let ex = self.new_exchange(now);
        let mut msg = self.base(MessageType::Decline, &ex, now);
        msg.opts_mut()
            .insert(DhcpOption::ServerId(lease.server_id.clone()));
        msg.opts_mut().insert(self.ia_na(Some(addr)));
        self.declined.insert(addr);
        self.hint = None;
        self.lose(
            now,
            format!(
                "address {addr} is in use by another host: DHCPv6 Decline sent to {} (another address is asked for)",
                lease.unicast.unwrap_or(lease.from)
            ),
            DECLINE_HOLDOFF,
        );
        vec![Outgoing6 {
            msg,
            dest: lease.unicast.map_or(Dest6::AllServers, Dest6::Unicast),
        }]
    }

    /// Stops the machine; with `release`, returns the Release for the current lease
    /// (§18.2.7).
    pub fn stop(&mut self, now: Instant, release: bool) -> Vec<Outgoing6> {
        let lease = self.lease().cloned();
        self.phase = Phase::Stopped;
        let (true, Some(lease)) = (release, lease) else {
            return Vec::new();
        };
        let ex = self.new_exchange(now);
        let mut msg = self.base(MessageType::Release, &ex, now);
        msg.opts_mut()
            .insert(DhcpOption::ServerId(lease.server_id.clone()));
        msg.opts_mut().insert(self.ia_na(Some(lease.addr)));
        vec![Outgoing6 {
            msg,
            dest: lease.unicast.map_or(Dest6::AllServers, Dest6::Unicast),
        }]
    }
}

impl crate::dhcp::attempts::ClientMachine for Machine6 {
    type Msg = (Ipv6Addr, Message);
    type Out = Outgoing6;

    fn begin(
        spec: &crate::dhcp::DhcpSpec,
        requested: Option<std::net::IpAddr>,
        attempts: crate::dhcp::attempts::Attempts,
        now: Instant,
        seed: u32,
    ) -> Self {
        let requested = match requested {
            Some(std::net::IpAddr::V6(a)) => Some(a),
            _ => spec.requested_v6,
        };
        Machine6::new(
            Config6 {
                mac: spec.mac,
                requested,
                max_attempts: attempts.max,
            },
            now,
            seed,
        )
        .after_failures(attempts.failed)
    }
    fn state(&self) -> DhcpState {
        Machine6::state(self)
    }
    fn deadline(&self) -> Option<Instant> {
        Machine6::deadline(self)
    }
    fn on_timeout(&mut self, now: Instant) -> Vec<Outgoing6> {
        Machine6::on_timeout(self, now)
    }
    fn on_message(&mut self, now: Instant, msg: &Self::Msg) -> Vec<Outgoing6> {
        Machine6::on_message(self, now, msg.0, &msg.1)
    }
    fn decline(&mut self, now: Instant, addr: std::net::IpAddr) -> Vec<Outgoing6> {
        match addr {
            std::net::IpAddr::V6(a) => Machine6::decline(self, now, a),
            std::net::IpAddr::V4(_) => Vec::new(),
        }
    }
    fn stop(&mut self, now: Instant, release: bool) -> Vec<Outgoing6> {
        Machine6::stop(self, now, release)
    }
}

mod messages;
#[cfg(test)]
pub(crate) mod tests;
