//! The RFC 2131 client state machine (§4.4, figure 5), without I/O: it is fed received
//! messages, timeouts and the caller's commands, and answers with the messages to send. Times
//! are tokio [`Instant`]s passed in by the caller, so tests drive it with a paused clock.
//!
//! Messages are built and read with `dhcproto` (no hand-written DHCP framing).
//!
//! Timing choices (RFC 2131 leaves them to the client):
//! - an exchange (DISCOVER/OFFER, REQUEST/ACK) is sent at once, then retransmitted after
//!   [`RETRANSMIT`] (1 s, 2 s, 4 s), and given up 4 s after the last send: 11 s per attempt
//!   (an INIT-REBOOT: [`INIT_REBOOT_SENDS`] sends 1 s apart, then DISCOVER).
//!   §4.1 suggests 4 s doubling to 64 s; vipd uses shorter waits so that a missing server is
//!   reported (a Warning Event per failed attempt) within seconds. Each wait is randomised
//!   by ±[`RETRANSMIT_SPREAD_V4`] % (§4.1: ±1 s on 4 s), so that the clients of many
//!   Services started at once (a global Services lease changing holder) do not retransmit
//!   in step ([`jittered`]);
//! - between failed attempts it waits [`backoff`]: 1 s doubling to [`BACKOFF_CAP`] (60 s);
//!   after [`ClientConfig::max_attempts`] failed attempts in a row (kube-vip's
//!   `dhcp_backoff_attempts`; 0 = no limit) it gives up ([`DhcpState::GaveUp`], see
//!   [`exhausted`]) and sends nothing more; a lease resets the count, and so does a lease
//!   that ends (the attempts after a NAK or expiry count from one);
//! - while RENEWING / REBINDING it retransmits after half the time left to T2 / expiry
//!   (§4.4.5), but at least [`MIN_RENEW_RETRY`] (4 s) apart (§4.4.5 says 60 s, which with
//!   dnsmasq's 2-minute leases would skip the rebinding phase entirely), and never past T2 /
//!   expiry;
//! - after a NAK or expiry it is [`DhcpState::Lost`] for [`LOST_HOLDOFF`] (1 s), then starts
//!   over with INIT-REBOOT for the same address; after a DHCPDECLINE it waits
//!   [`DECLINE_HOLDOFF`] (10 s, §3.1.5) and starts over with DISCOVER, never asking for the
//!   declined address again.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use tokio::time::Instant;

use super::{DhcpBinding, DhcpState};

/// A lease as the v4 machine keeps it (IPv4 addresses); published as a [`DhcpBinding`].
#[derive(Clone, Debug, PartialEq)]
struct Lease {
    addr: Ipv4Addr,
    prefix_len: u8,
    server: Ipv4Addr,
    expires: Instant,
    t1: Instant,
    t2: Instant,
}

impl Lease {
    fn public(&self) -> DhcpBinding {
        DhcpBinding {
            addr: self.addr.into(),
            prefix_len: self.prefix_len,
            server: self.server.into(),
            expires: self.expires,
            t1: self.t1,
            t2: self.t2,
        }
    }
}

/// Waits after the 1st, 2nd and 3rd send of one exchange before the next send.
pub const RETRANSMIT: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];
/// Randomisation of a DHCPv4 retransmission wait, in percent either way (RFC 2131 §4.1:
/// "randomized by the value of a uniform random number chosen from the range -1 to +1"
/// seconds on a 4 s wait).
pub const RETRANSMIT_SPREAD_V4: u32 = 25;

/// `base` randomised by up to ±`spread_pct` % (at most 100), pseudo-randomly but fixed for
/// one transaction `xid` and send number `sends`: the xid is random per client, so clients
/// started together spread out, while a test with a fixed seed sees fixed times. Pure.
pub(crate) fn jittered(base: Duration, xid: u32, sends: u32, spread_pct: u32) -> Duration {
    let spread = u64::from(spread_pct.min(100));
    // SplitMix64 finaliser over (xid, sends): well mixed for neighbouring inputs.
    let mut h = (u64::from(xid) << 32 | u64::from(sends)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    // A factor in [100 - spread, 100 + spread] percent, in per-mille steps.
    let per_mille = (100 - spread) * 10 + h % (spread * 20 + 1);
    let ms = u64::try_from(base.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(ms.saturating_mul(per_mille) / 1000)
}

/// Wait after the last send of an exchange before the attempt counts as failed.
pub const LAST_WAIT: Duration = Duration::from_secs(4);
/// DHCPREQUESTs sent in INIT-REBOOT before the client goes to INIT (DISCOVER, still
/// hinting the address with option 50): the first, and one retransmission in case it was
/// lost; each followed by [`RETRANSMIT`]`[0]` (1 s, randomised). A server with no record of
/// the client MUST remain silent (RFC 2131 §4.3.2), and it has none for an address just
/// released (Harvester's keep-IP flow: a new Service with the old one's
/// `kube-vip.io/hwaddr` and `kube-vip.io/requestedIP`, the old one deleted), so silence is
/// an answer here: the full retransmission schedule (1 + 2 + 4 + 4 s) left that address
/// unanswered for 11-13 s (issue 26); this way about 2 s, and a DISCOVER with option 50
/// gets the same address from a server that has it free.
pub const INIT_REBOOT_SENDS: u32 = 2;
/// Longest wait between failed attempts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// Shortest retransmission interval while renewing or rebinding.
pub const MIN_RENEW_RETRY: Duration = Duration::from_secs(4);
/// Time spent in [`DhcpState::Lost`] after a NAK or expiry before starting over.
pub const LOST_HOLDOFF: Duration = Duration::from_secs(1);
/// Wait after a DHCPDECLINE before starting over (RFC 2131 §3.1.5: at least 10 s).
pub const DECLINE_HOLDOFF: Duration = Duration::from_secs(10);
/// Longest lease vipd plans with (an "infinite" lease, `0xffffffff`, is renewed like a
/// 1-year one).
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Wait before attempt `failures + 1` after `failures` (>= 1) failed attempts: 1 s, 2 s, 4 s,
/// ... capped at [`BACKOFF_CAP`].
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(6);
    Duration::from_secs(1u64 << exp).min(BACKOFF_CAP)
}

/// Wait before attempt `failures + 1` of the DHCPv4 client with `mac` (`chaddr`):
/// [`backoff`] randomised by ±[`RETRANSMIT_SPREAD_V4`] % (RFC 2131 §4.1 asks the same of
/// every retransmission delay), pseudo-randomly through [`jittered`] seeded by the MAC
/// instead of a transaction id: fixed for one MAC and failure count (the machine stays
/// pure), different for two clients of one node, so clients that failed together (a DHCP
/// server down) do not retry in step. Never above [`BACKOFF_CAP`] (waits at the cap are
/// spread below it). Pure.
pub fn backoff_v4(failures: u32, mac: &[u8; 6]) -> Duration {
    let [a, b, c, d, e, f] = *mac;
    let seed = u32::from_be_bytes([c, d, e, f]) ^ (u32::from(u16::from_be_bytes([a, b])) << 8);
    jittered(backoff(failures), seed, failures, RETRANSMIT_SPREAD_V4).min(BACKOFF_CAP)
}

/// Whether `failures` failed attempts in a row reach `max_attempts` (kube-vip's
/// `dhcp_backoff_attempts`: give up after that many; 0 = never). The one rule of both
/// machines and the client task (which counts failed macvlan setups too).
pub fn exhausted(failures: u32, max_attempts: u32) -> bool {
    max_attempts > 0 && failures >= max_attempts
}

/// Client settings the machine needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// `chaddr`; the client identifier (option 61) is type 1 + this MAC (RFC 2132 §9.14).
    pub mac: [u8; 6],
    /// Option 12, when set.
    pub hostname: Option<String>,
    /// BROADCAST flag on DISCOVER and REQUEST (RFC 2131 §4.1).
    pub broadcast: bool,
    /// The address to ask for first (INIT-REBOOT with option 50, §4.3.2).
    pub requested: Option<Ipv4Addr>,
    /// Give up after this many failed attempts in a row (see [`exhausted`]); 0 = never.
    pub max_attempts: u32,
}

/// Where a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// `255.255.255.255`, Ethernet broadcast.
    Broadcast,
    /// IP unicast to the server (renewal, release), from the leased address.
    Unicast(Ipv4Addr),
}

/// A message to send: UDP from port 68 (`src`) to port 67 at `dest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The DHCP message.
    pub msg: Message,
    /// Where to.
    pub dest: Dest,
    /// IP source: `0.0.0.0` before a lease, the leased address after (RFC 2131 §4.1).
    pub src: Ipv4Addr,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// SELECTING: DISCOVER sent, waiting for an OFFER.
    Selecting(Exchange),
    /// INIT-REBOOT / REBOOTING: REQUEST for `addr` (option 50) sent, no server id.
    Rebooting {
        addr: Ipv4Addr,
        ex: Exchange,
    },
    /// REQUESTING: REQUEST for an offer sent.
    Requesting {
        addr: Ipv4Addr,
        server: Ipv4Addr,
        ex: Exchange,
    },
    Bound(Lease),
    Renewing {
        binding: Lease,
        ex: Exchange,
    },
    Rebinding {
        binding: Lease,
        ex: Exchange,
    },
    /// Waiting until `until`, then starting an attempt (INIT-REBOOT for `reboot` if set).
    Waiting {
        until: Instant,
        reboot: Option<Ipv4Addr>,
    },
    /// [`ClientConfig::max_attempts`] attempts in a row failed: nothing more is sent.
    GaveUp,
    Stopped,
}

/// One request/response exchange in flight (shared with the DHCPv6 machine, [`super::v6`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exchange {
    /// Transaction id.
    pub(crate) xid: u32,
    /// When the first message was sent (`secs`, and lease times count from here: §4.4.1).
    pub(crate) started: Instant,
    /// When the latest message was sent.
    pub(crate) sent: Instant,
    /// Messages sent so far.
    pub(crate) sends: u32,
    /// When to send again (or give up).
    pub(crate) next: Instant,
    /// Randomisation of the waits, ± percent ([`jittered`]).
    pub(crate) spread_pct: u32,
}

impl Exchange {
    /// A first send at `now` of transaction `xid`; the next after [`RETRANSMIT`]`[0]`,
    /// randomised by ±`spread_pct` % as every wait of the exchange ([`jittered`]).
    pub(crate) fn first(xid: u32, now: Instant, spread_pct: u32) -> Self {
        Exchange {
            xid,
            started: now,
            sent: now,
            sends: 1,
            next: now + jittered(RETRANSMIT[0], xid, 1, spread_pct),
            spread_pct,
        }
    }

    /// Counts a retransmission at `now` and sets the next deadline ([`RETRANSMIT`], then
    /// [`LAST_WAIT`]); `false` when the exchange is over (all sends made and [`LAST_WAIT`]
    /// passed).
    pub(crate) fn retransmit(&mut self, now: Instant) -> bool {
        if self.sends as usize > RETRANSMIT.len() {
            return false;
        }
        self.sends += 1;
        self.sent = now;
        let wait = RETRANSMIT
            .get(self.sends as usize - 1)
            .copied()
            .unwrap_or(LAST_WAIT);
        self.next = now + jittered(wait, self.xid, self.sends, self.spread_pct);
        true
    }
}

/// The next transaction id after `seed` (updated): a full-period LCG (Numerical Recipes
/// constants), distinct ids for 2^32 exchanges.
pub(crate) fn next_xid(seed: &mut u32) -> u32 {
    *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
    *seed
}

/// The client state machine for one address.
#[derive(Debug, Clone)]
pub struct Machine {
    cfg: ClientConfig,
    phase: Phase,
    xid_seed: u32,
    /// Failed attempts since the last lease.
    failures: u32,
    last_error: Option<String>,
    /// Why the last lease ended, shown as [`DhcpState::Lost`] while waiting to start over.
    lost: Option<String>,
    /// Address to hint with option 50 in DISCOVER (the last one asked for or leased).
    hint: Option<Ipv4Addr>,
    declined: BTreeSet<Ipv4Addr>,
}

/// `secs` as a lease duration, at most [`MAX_LEASE`].
pub(crate) fn lease_secs(secs: u32) -> Duration {
    Duration::from_secs(u64::from(secs)).min(MAX_LEASE)
}

impl Machine {
    /// A machine that starts at `now`: INIT-REBOOT for `cfg.requested` when set, else INIT.
    /// `xid_seed` seeds the transaction ids (any value; a random one in production).
    pub fn new(cfg: ClientConfig, now: Instant, xid_seed: u32) -> Self {
        let hint = cfg.requested;
        Self {
            phase: Phase::Waiting {
                until: now,
                reboot: cfg.requested,
            },
            cfg,
            xid_seed,
            failures: 0,
            last_error: None,
            lost: None,
            hint,
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

    /// The state to publish.
    pub fn state(&self) -> DhcpState {
        match &self.phase {
            Phase::Bound(b) => DhcpState::Bound(b.public()),
            Phase::GaveUp => DhcpState::GaveUp {
                attempts: self.failures,
                last_error: self.last_error.clone().unwrap_or_default(),
            },
            Phase::Renewing { binding, .. } => DhcpState::Renewing(binding.public()),
            Phase::Rebinding { binding, .. } => DhcpState::Rebinding(binding.public()),
            Phase::Waiting { .. } | Phase::Stopped if self.lost.is_some() => DhcpState::Lost {
                reason: self.lost.clone().unwrap_or_default(),
            },
            _ => DhcpState::Requesting {
                attempt: self.failures,
                last_error: self.last_error.clone(),
            },
        }
    }

    /// When [`Machine::on_timeout`] must be called next; `None` once stopped.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Selecting(ex)
            | Phase::Rebooting { ex, .. }
            | Phase::Requesting { ex, .. }
            | Phase::Renewing { ex, .. }
            | Phase::Rebinding { ex, .. } => Some(ex.next),
            Phase::Bound(b) => Some(b.t1),
            Phase::Waiting { until, .. } => Some(*until),
            Phase::GaveUp | Phase::Stopped => None,
        }
    }

    /// The transaction id replies must carry now, if an exchange is in flight.
    pub fn xid(&self) -> Option<u32> {
        match &self.phase {
            Phase::Selecting(ex)
            | Phase::Rebooting { ex, .. }
            | Phase::Requesting { ex, .. }
            | Phase::Renewing { ex, .. }
            | Phase::Rebinding { ex, .. } => Some(ex.xid),
            _ => None,
        }
    }

    fn new_exchange(&mut self, now: Instant) -> Exchange {
        Exchange::first(next_xid(&mut self.xid_seed), now, RETRANSMIT_SPREAD_V4)
    }

    fn base(&self, kind: MessageType, ex: &Exchange, now: Instant, ciaddr: Ipv4Addr) -> Message {
        let mut msg = Message::new_with_id(
            ex.xid,
            ciaddr,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &self.cfg.mac,
        );
        let secs = now.saturating_duration_since(ex.started).as_secs();
        msg.set_secs(u16::try_from(secs).unwrap_or(u16::MAX));
        if self.cfg.broadcast
            && ciaddr.is_unspecified()
            && matches!(kind, MessageType::Discover | MessageType::Request)
        {
            msg.set_flags(Flags::default().set_broadcast());
        }
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::MessageType(kind));
        let mut id = vec![1u8];
        id.extend_from_slice(&self.cfg.mac);
        opts.insert(DhcpOption::ClientIdentifier(id));
        if matches!(kind, MessageType::Discover | MessageType::Request) {
            if let Some(name) = &self.cfg.hostname {
                opts.insert(DhcpOption::Hostname(name.clone()));
            }
            opts.insert(DhcpOption::ParameterRequestList(vec![
                OptionCode::SubnetMask,
                OptionCode::AddressLeaseTime,
                OptionCode::ServerIdentifier,
                OptionCode::Renewal,
                OptionCode::Rebinding,
            ]));
        }
        msg
    }

    /// The message for the current phase's exchange (first send or retransmission).
    fn current_message(&self, now: Instant) -> Option<Outgoing> {
        let zero = Ipv4Addr::UNSPECIFIED;
        let out = match &self.phase {
            Phase::Selecting(ex) => {
                let mut msg = self.base(MessageType::Discover, ex, now, zero);
                if let Some(hint) = self.hint.filter(|h| !self.declined.contains(h)) {
                    msg.opts_mut().insert(DhcpOption::RequestedIpAddress(hint));
                }
                Outgoing {
                    msg,
                    dest: Dest::Broadcast,
                    src: zero,
                }
            }
            Phase::Rebooting { addr, ex } => {
                let mut msg = self.base(MessageType::Request, ex, now, zero);
                msg.opts_mut().insert(DhcpOption::RequestedIpAddress(*addr));
                Outgoing {
                    msg,
                    dest: Dest::Broadcast,
                    src: zero,
                }
            }
            Phase::Requesting { addr, server, ex } => {
                let mut msg = self.base(MessageType::Request, ex, now, zero);
                msg.opts_mut().insert(DhcpOption::RequestedIpAddress(*addr));
                msg.opts_mut().insert(DhcpOption::ServerIdentifier(*server));
                Outgoing {
                    msg,
                    dest: Dest::Broadcast,
                    src: zero,
                }
            }
            Phase::Renewing { binding, ex } => Outgoing {
                msg: self.base(MessageType::Request, ex, now, binding.addr),
                dest: Dest::Unicast(binding.server),
                src: binding.addr,
            },
            Phase::Rebinding { binding, ex } => Outgoing {
                msg: self.base(MessageType::Request, ex, now, binding.addr),
                dest: Dest::Broadcast,
                src: binding.addr,
            },
            Phase::Bound(_) | Phase::Waiting { .. } | Phase::GaveUp | Phase::Stopped => {
                return None;
            }
        };
        Some(out)
    }

    fn start_attempt(&mut self, now: Instant, reboot: Option<Ipv4Addr>) -> Option<Outgoing> {
        self.lost = None;
        let ex = self.new_exchange(now);
        self.phase = match reboot.filter(|a| !self.declined.contains(a)) {
            Some(addr) => {
                self.hint = Some(addr);
                Phase::Rebooting { addr, ex }
            }
            None => Phase::Selecting(ex),
        };
        self.current_message(now)
    }

    /// An attempt failed at `now` for `error`: wait [`backoff_v4`] before the next one, or
    /// give up when that was the last one allowed.
    fn fail_attempt(&mut self, now: Instant, error: String) {
        self.failures = self.failures.saturating_add(1);
        self.last_error = Some(error);
        self.phase = if exhausted(self.failures, self.cfg.max_attempts) {
            Phase::GaveUp
        } else {
            Phase::Waiting {
                until: now + backoff_v4(self.failures, &self.cfg.mac),
                reboot: None,
            }
        };
    }

    fn lose(&mut self, now: Instant, reason: String, holdoff: Duration, reboot: Option<Ipv4Addr>) {
        self.lost = Some(reason);
        self.failures = 0;
        self.last_error = None;
        self.phase = Phase::Waiting {
            until: now + holdoff,
            reboot,
        };
    }

    /// Next retransmission while renewing/rebinding: half the time left to `end`, at least
    /// [`MIN_RENEW_RETRY`], never past `end`.
    fn renew_retry(now: Instant, end: Instant) -> Instant {
        let half = end.saturating_duration_since(now) / 2;
        (now + half.max(MIN_RENEW_RETRY)).min(end)
    }

    /// Handles the deadline ([`Machine::deadline`]) having passed at `now`; returns what to
    /// send.
    pub fn on_timeout(&mut self, now: Instant) -> Vec<Outgoing> {
        if self.deadline().is_none_or(|d| now < d) {
            return Vec::new();
        }
        match &mut self.phase {
            Phase::Waiting { reboot, .. } => {
                let reboot = *reboot;
                self.start_attempt(now, reboot).into_iter().collect()
            }
            Phase::Selecting(ex) => {
                if ex.retransmit(now) {
                    self.current_message(now).into_iter().collect()
                } else {
                    let (sends, secs) = (ex.sends, now.saturating_duration_since(ex.started));
                    self.fail_attempt(
                        now,
                        format!(
                            "no DHCPOFFER from any server ({sends} DHCPDISCOVERs over {} s)",
                            secs.as_secs()
                        ),
                    );
                    Vec::new()
                }
            }
            Phase::Rebooting { addr, ex } => {
                if ex.sends < INIT_REBOOT_SENDS && ex.retransmit(now) {
                    // Every INIT-REBOOT wait is the first one ([`INIT_REBOOT_SENDS`]).
                    ex.next = now + jittered(RETRANSMIT[0], ex.xid, ex.sends, ex.spread_pct);
                    self.current_message(now).into_iter().collect()
                } else {
                    // RFC 2131 §3.2 step 5 / §4.4.2: no answer to INIT-REBOOT: go to INIT,
                    // still hinting the address with option 50.
                    self.hint = Some(*addr);
                    self.start_attempt(now, None).into_iter().collect()
                }
            }
            Phase::Requesting { addr, ex, .. } => {
                if ex.retransmit(now) {
                    self.current_message(now).into_iter().collect()
                } else {
                    let (addr, sends) = (*addr, ex.sends);
                    self.fail_attempt(now, format!("no DHCPACK for {addr} ({sends} DHCPREQUESTs)"));
                    Vec::new()
                }
            }
            Phase::Bound(binding) => {
                // T1: RENEWING, unicast to the server (§4.4.5).
                let binding = binding.clone();
                let mut ex = self.new_exchange(now);
                ex.next = Self::renew_retry(now, binding.t2);
                self.phase = Phase::Renewing { binding, ex };
                self.current_message(now).into_iter().collect()
            }
            Phase::Renewing { binding, ex } => {
                if now >= binding.t2 {
                    // T2: REBINDING, broadcast (§4.4.5).
                    let binding = binding.clone();
                    let mut ex = self.new_exchange(now);
                    ex.next = Self::renew_retry(now, binding.expires);
                    self.phase = Phase::Rebinding { binding, ex };
                } else {
                    ex.sends += 1;
                    ex.sent = now;
                    ex.next = Self::renew_retry(now, binding.t2);
                }
                self.current_message(now).into_iter().collect()
            }
            Phase::Rebinding { binding, ex } => {
                if now >= binding.expires {
                    let (addr, server) = (binding.addr, binding.server);
                    self.lose(
                        now,
                        format!("lease of {addr} from {server} expired without renewal"),
                        LOST_HOLDOFF,
                        Some(addr),
                    );
                    Vec::new()
                } else {
                    ex.sends += 1;
                    ex.sent = now;
                    ex.next = Self::renew_retry(now, binding.expires);
                    self.current_message(now).into_iter().collect()
                }
            }
            Phase::GaveUp | Phase::Stopped => Vec::new(),
        }
    }

    /// Handles a received BOOTREPLY at `now`; returns what to send. Replies for another
    /// transaction or client are ignored.
    pub fn on_message(&mut self, now: Instant, msg: &Message) -> Vec<Outgoing> {
        if msg.opcode() != Opcode::BootReply
            || Some(msg.xid()) != self.xid()
            || msg.chaddr().get(..6) != Some(&self.cfg.mac[..])
        {
            return Vec::new();
        }
        let Some(kind) = msg.opts().msg_type() else {
            return Vec::new();
        };
        let server = match msg.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(s)) => Some(*s),
            _ => None,
        };
        let text = match msg.opts().get(OptionCode::Message) {
            Some(DhcpOption::Message(m)) => format!(": {m}"),
            _ => String::new(),
        };
        let from = server.map_or_else(|| "a server".to_string(), |s| s.to_string());
        match (&self.phase, kind) {
            (Phase::Selecting(ex), MessageType::Offer) => {
                let (Some(server), addr) = (server, msg.yiaddr()) else {
                    return Vec::new();
                };
                if addr.is_unspecified() || self.declined.contains(&addr) {
                    return Vec::new();
                }
                // §4.4.1: REQUEST with the same xid, option 50 and 54.
                let mut ex = ex.clone();
                ex.sends = 1;
                ex.sent = now;
                ex.next = now + RETRANSMIT[0];
                self.phase = Phase::Requesting { addr, server, ex };
                self.current_message(now).into_iter().collect()
            }
            (
                Phase::Rebooting { ex, .. }
                | Phase::Requesting { ex, .. }
                | Phase::Renewing { ex, .. }
                | Phase::Rebinding { ex, .. },
                MessageType::Ack,
            ) => {
                let sent = ex.sent;
                match self.binding_from_ack(msg, server, sent) {
                    Ok(binding) => {
                        self.failures = 0;
                        self.last_error = None;
                        self.lost = None;
                        self.hint = Some(binding.addr);
                        self.phase = Phase::Bound(binding);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "ignoring a DHCPACK");
                    }
                }
                Vec::new()
            }
            (Phase::Rebooting { addr, .. }, MessageType::Nak) => {
                // §3.2 step 3: INIT-REBOOT NAKed: restart in INIT (DISCOVER, still hinting).
                let addr = *addr;
                self.last_error = Some(format!("DHCPNAK for {addr} from {from}{text}"));
                self.start_attempt(now, None).into_iter().collect()
            }
            (Phase::Requesting { addr, .. }, MessageType::Nak) => {
                let addr = *addr;
                self.fail_attempt(now, format!("DHCPNAK for {addr} from {from}{text}"));
                Vec::new()
            }
            (
                Phase::Renewing { binding, .. } | Phase::Rebinding { binding, .. },
                MessageType::Nak,
            ) => {
                let addr = binding.addr;
                self.lose(
                    now,
                    format!("DHCPNAK for {addr} from {from}{text}"),
                    LOST_HOLDOFF,
                    Some(addr),
                );
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn binding_from_ack(
        &self,
        msg: &Message,
        server: Option<Ipv4Addr>,
        sent: Instant,
    ) -> Result<Lease, String> {
        let addr = msg.yiaddr();
        if addr.is_unspecified() {
            return Err("DHCPACK without an address (yiaddr 0.0.0.0)".into());
        }
        let current_server = match &self.phase {
            Phase::Renewing { binding, .. } | Phase::Rebinding { binding, .. } => {
                Some(binding.server)
            }
            _ => None,
        };
        let server = server
            .or(current_server)
            .ok_or("DHCPACK without a server identifier (option 54)")?;
        let lease = match msg.opts().get(OptionCode::AddressLeaseTime) {
            Some(DhcpOption::AddressLeaseTime(s)) if *s > 0 => lease_secs(*s),
            _ => {
                return Err(format!(
                    "DHCPACK for {addr} without a lease time (option 51)"
                ));
            }
        };
        let t1 = match msg.opts().get(OptionCode::Renewal) {
            Some(DhcpOption::Renewal(s)) => lease_secs(*s),
            _ => lease / 2,
        };
        let t2 = match msg.opts().get(OptionCode::Rebinding) {
            Some(DhcpOption::Rebinding(s)) => lease_secs(*s),
            _ => lease * 7 / 8,
        };
        // §4.4.5 defaults when the server's values are not T1 < T2 < lease.
        let (t1, t2) = if t1 < t2 && t2 < lease {
            (t1, t2)
        } else {
            (lease / 2, lease * 7 / 8)
        };
        let prefix_len = match msg.opts().get(OptionCode::SubnetMask) {
            Some(DhcpOption::SubnetMask(m)) => u32::from(*m).leading_ones() as u8,
            _ => 32,
        };
        Ok(Lease {
            addr,
            prefix_len,
            server,
            expires: sent + lease,
            t1: sent + t1,
            t2: sent + t2,
        })
    }

    /// The caller found `addr` in use by another host. When it is the current lease: returns
    /// the DHCPDECLINE (§4.4.1: broadcast, option 50 = `addr`, option 54 = server), goes Lost
    /// and starts over with DISCOVER after [`DECLINE_HOLDOFF`], never asking for `addr` again.
    pub fn decline(&mut self, now: Instant, addr: Ipv4Addr) -> Vec<Outgoing> {
        let binding = match &self.phase {
            Phase::Bound(b)
            | Phase::Renewing { binding: b, .. }
            | Phase::Rebinding { binding: b, .. } => b.clone(),
            _ => return Vec::new(),
        };
        if binding.addr != addr {
            return Vec::new();
        }
        let ex = self.new_exchange(now);
        let mut msg = self.base(MessageType::Decline, &ex, now, Ipv4Addr::UNSPECIFIED);
        msg.opts_mut().insert(DhcpOption::RequestedIpAddress(addr));
        msg.opts_mut()
            .insert(DhcpOption::ServerIdentifier(binding.server));
        self.declined.insert(addr);
        self.hint = None;
        self.lose(
            now,
            format!(
                "address {addr} is in use by another host: DHCPDECLINE sent to {} (another address is asked for)",
                binding.server
            ),
            DECLINE_HOLDOFF,
            None,
        );
        vec![Outgoing {
            msg,
            dest: Dest::Broadcast,
            src: Ipv4Addr::UNSPECIFIED,
        }]
    }

    /// Stops the machine; with `release`, returns the DHCPRELEASE for the current lease
    /// (§4.4.6: unicast to the server, `ciaddr` = the address, option 54).
    pub fn stop(&mut self, now: Instant, release: bool) -> Vec<Outgoing> {
        let binding = match &self.phase {
            Phase::Bound(b)
            | Phase::Renewing { binding: b, .. }
            | Phase::Rebinding { binding: b, .. } => Some(b.clone()),
            _ => None,
        };
        self.phase = Phase::Stopped;
        let (true, Some(binding)) = (release, binding) else {
            return Vec::new();
        };
        let ex = self.new_exchange(now);
        let mut msg = self.base(MessageType::Release, &ex, now, binding.addr);
        msg.opts_mut()
            .insert(DhcpOption::ServerIdentifier(binding.server));
        vec![Outgoing {
            msg,
            dest: Dest::Unicast(binding.server),
            src: binding.addr,
        }]
    }
}

#[cfg(test)]
pub(crate) mod tests;
