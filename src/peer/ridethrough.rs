//! The ride-through rules as a pure state machine: no I/O, no clock of its own. Inputs are
//! monotonic instants, this node's API reachability, verified and assembled peer messages,
//! the membership (vipd nodes last known from the API) and this node's leases with their
//! renewal send times; outputs are decisions with reasons (for logs and metrics).
//!
//! Rules (the safety argument, case by case, is in `docs/design.md`, "Peer protocol"):
//! * **Ride-through** ([`Peers::may_ride_through`]): a holder that cannot reach the API keeps
//!   its Service VIPs (refreshing them for at most the fence lifetime at a time) only while,
//!   within the liveness window, it hears a strict majority of its membership (itself
//!   included, peers counted only if their membership digest equals its own), no frame from
//!   anyone says the API is reachable ([`Flags::any`]), no other node lists the lease, nobody
//!   asked for it, its evaluations follow each other within the liveness window, and at most
//!   `max_ride` after its API fence ended. A failed evaluation breaks that chain: past the
//!   API fence, ride-through cannot start again until a renewal through the API succeeds.
//! * The **control-plane** lease never rides through: its holder's own API server being
//!   down is a reason to move it.
//! * **Takeover with consent** ([`Peers::may_take`]): a candidate that reaches the API takes
//!   a lease from a holder it hears listing it only after that holder's `Released` (or a
//!   heartbeat no longer listing it, once expired); it asks (`HandOverRequest`) when the
//!   holder says it cannot reach the API and a probe of its own sent after the holder said
//!   so got a good answer, and defers while the holder reaches it. When the
//!   holder is silent, it takes an expired lease only once a *blocking set* of the same
//!   membership (at least half of the nodes other than the holder, itself included) has been
//!   vouching for the API long enough that no ride-through majority can exist, or else once
//!   the holder's ride-through cap has certainly passed.
//! * A holder that cannot reach the API and is asked to hand over releases at once
//!   ([`Peers::should_release`]): drops its VIPs, then sends `Released`.
//!
//! Assumption (the socket layer's contract, kept by `peer::node`): `received_at` is the instant a
//! frame reached this host (kernel receive timestamp), at most [`RideConfig::delivery`]
//! after its sender built it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::membership_digest;
use super::wire::{Flags, HeldLease, Kind, LeaseRef, Message};
use crate::lease::FENCE_MARGIN;
use crate::lease::Timing;

/// Timings of the peer protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RideConfig {
    /// Heartbeat interval (200 ms).
    pub interval: Duration,
    /// A peer counts as heard when a frame of it arrived within this window (3 intervals).
    pub liveness: Duration,
    /// The kernel fence lifetime (`crate::lease::fence_lifetime`, whole seconds): the longest VIP
    /// lifetime one refresh grants.
    pub fence: Duration,
    /// [`FENCE_MARGIN`]: kernel expiry lag and clock-rate drift.
    pub margin: Duration,
    /// Longest time from building a frame to its arrival at a peer (50 ms; an L2 segment
    /// delivers in well under a millisecond).
    pub delivery: Duration,
    /// A node that sends a frame with [`Flags::any`] keeps saying so in every frame it builds
    /// for this long afterwards (1 s): a promise candidates rely on.
    pub flag_hold: Duration,
    /// `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// Longest ride-through, counted from the end of the API fence (60 s).
    pub max_ride: Duration,
    /// A candidate asks a holder that cannot reach the API to hand over only after it has
    /// reached the API itself for this long (the renew deadline), so that a holder whose API
    /// has just come back renews instead of being asked, and only once the lease has not
    /// changed for this long (the holder missed its renewals for the renew deadline, after
    /// which it would have stepped down without ride-through).
    pub ask_delay: Duration,
    /// The lease's retry period: a holder's last renewal may be this much older than the
    /// start of an outage.
    pub retry_period: Duration,
    /// A node reaches the API while its last good probe answer is at most this old
    /// ([`API_WINDOW`], 1 s).
    pub api_window: Duration,
}

/// Service lease timings (seconds: lease duration, renew deadline, retry period) with which
/// a ride starts within the API fence of every outage ([`RideConfig::check_start`]):
/// kube-vip's defaults. `vipd manifest --servicesRideThrough` writes them as the Service
/// timings when the lease timings it writes do not allow a ride.
/// This node reaches the API while its last good probe answer is at most this old. Short,
/// so that the flags fade fast enough for a holder to start riding within its API fence
/// (detection + liveness window + flag hold + liveness window < fence end after an outage
/// starts: 1 + 0.6 + 1 + 0.6 s against at least 3.75 s with the default 5/3/1 s timings).
pub(crate) const API_WINDOW: Duration = Duration::from_secs(1);

/// Whether a node whose last good API probe answer came at `ok_at` reaches the API at
/// `now`: that answer is at most [`API_WINDOW`] old.
pub(crate) fn reaches_api(ok_at: Option<Instant>, now: Instant) -> bool {
    ok_at.is_some_and(|t| now.saturating_duration_since(t) <= API_WINDOW)
}

pub(crate) const RIDE_SERVICE_TIMINGS: (&str, &str, &str) = ("5", "3", "1");

/// A [`RideConfig`] breaks a rule the safety argument or the ride's start needs.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum RideConfigError {
    /// Which rule, with the values.
    #[error("peer protocol timings: {0}")]
    Rule(String),
}

impl RideConfig {
    /// The defaults for these lease timings and fence lifetime (seconds).
    ///
    /// # Errors
    /// [`RideConfigError`] when the result breaks a rule of [`RideConfig::check`], or when
    /// a ride could not start before the API fence ends ([`RideConfig::check_start`]).
    pub(crate) fn new(timing: &Timing, fence_secs: u32) -> Result<Self, RideConfigError> {
        let c = Self::unchecked_start(timing, fence_secs)?;
        c.check_start()?;
        Ok(c)
    }

    /// [`RideConfig::new`] without [`RideConfig::check_start`] (a liveness rule, not a
    /// safety one): the model tests compare timings where a ride cannot start.
    ///
    /// # Errors
    /// [`RideConfigError`] when the result breaks a rule of [`RideConfig::check`].
    pub(crate) fn unchecked_start(
        timing: &Timing,
        fence_secs: u32,
    ) -> Result<Self, RideConfigError> {
        let c = RideConfig {
            fence: Duration::from_secs(u64::from(fence_secs)),
            ..Self::defaults_for(timing)
        };
        c.check()?;
        Ok(c)
    }

    /// Longest time from the start of an API outage that every node meets to the first
    /// evaluation at which a holder may ride, without frame loss: the probe notices it
    /// (the API window), the next heartbeat drops `api_reachable`, the one after drops
    /// `api_heard` (its relays see the source's latest frame), the flag hold runs out, the
    /// next frame carries no flag, and the holder evaluates at its next heartbeat; each
    /// frame on its way for up to the delivery bound. 2.9 s with the defaults.
    pub(crate) fn ride_start_bound(&self) -> Duration {
        self.api_window + self.interval * 4 + self.delivery * 2 + self.flag_hold
    }

    /// Shortest time from the start of an API outage to the end of the holder's API fence
    /// (its last renewal may be a retry period older than the outage): a ride must start
    /// before, or the `Gap` rule ends it for the term. 3.75 s at 5/3/1, 1.75 s at 3/2/1.
    pub(crate) fn api_fence_after_outage(&self) -> Duration {
        self.lease_duration
            .saturating_sub(self.retry_period)
            .saturating_sub(self.margin)
    }

    /// Whether Service leases with `timing` pass [`RideConfig::check_start`] (with the
    /// protocol's other defaults): what `vipd manifest --servicesRideThrough` asks before
    /// it writes [`RIDE_SERVICE_TIMINGS`].
    pub(crate) fn start_ok_for(timing: &Timing) -> bool {
        Self::defaults_for(timing).check_start().is_ok()
    }

    /// The protocol's defaults for `timing` (the fence still to be set).
    fn defaults_for(timing: &Timing) -> Self {
        let interval = Duration::from_millis(200);
        RideConfig {
            interval,
            liveness: interval * 3,
            fence: Duration::ZERO,
            margin: FENCE_MARGIN,
            delivery: Duration::from_millis(50),
            flag_hold: Duration::from_secs(1),
            lease_duration: timing.lease_duration,
            max_ride: Duration::from_secs(60),
            ask_delay: timing.renew_deadline,
            retry_period: timing.retry_period,
            api_window: API_WINDOW,
        }
    }

    /// The liveness rule of the timings: a ride can start within the API fence of every
    /// outage ([`RideConfig::api_fence_after_outage`] longer than
    /// [`RideConfig::ride_start_bound`]). Timings that break it would drop every Service
    /// VIP at the renew deadline of an outage that starts right after a renewal, with or
    /// without ride-through.
    ///
    /// # Errors
    /// [`RideConfigError::Rule`] naming the fields, their values and timings that work.
    pub(crate) fn check_start(&self) -> Result<(), RideConfigError> {
        let fence = self.api_fence_after_outage();
        let start = self.ride_start_bound();
        if fence > start {
            return Ok(());
        }
        let secs = |d: Duration| d.as_secs_f64();
        Err(RideConfigError::Rule(format!(
            "svc_leaseduration {} s with svc_retryperiod {} s (both default to the vip_ \
             timings) end a holder's API fence as early as {} ms after an API outage starts, \
             before a ride can start (up to {} ms: the peers' flags must fade first); \
             svc_leaseduration minus svc_retryperiod must exceed {} s, e.g. \
             svc_leaseduration={} svc_renewdeadline={} svc_retryperiod={} (what `vipd \
             manifest --servicesRideThrough` writes)",
            secs(self.lease_duration),
            secs(self.retry_period),
            fence.as_millis(),
            start.as_millis(),
            secs(start + self.margin),
            RIDE_SERVICE_TIMINGS.0,
            RIDE_SERVICE_TIMINGS.1,
            RIDE_SERVICE_TIMINGS.2,
        )))
    }

    /// The rules: the liveness window spans at least two intervals; it is shorter than the
    /// fence plus margin (a holder that still rides evaluates within every window a candidate
    /// checks); the flag hold exceeds the interval plus the delivery bound (a vouching
    /// node's consecutive frames overlap); the fence plus margin is shorter than the lease
    /// duration.
    ///
    /// # Errors
    /// [`RideConfigError::Rule`] naming the rule and the values.
    pub(crate) fn check(&self) -> Result<(), RideConfigError> {
        let ms = |d: Duration| d.as_millis();
        if self.liveness < self.interval * 2 {
            return Err(RideConfigError::Rule(format!(
                "liveness window {} ms must be at least two heartbeat intervals ({} ms)",
                ms(self.liveness),
                ms(self.interval)
            )));
        }
        if self.liveness >= self.fence + self.margin {
            return Err(RideConfigError::Rule(format!(
                "liveness window {} ms must be shorter than the fence plus margin ({} ms)",
                ms(self.liveness),
                ms(self.fence + self.margin)
            )));
        }
        if self.flag_hold <= self.interval + self.delivery {
            return Err(RideConfigError::Rule(format!(
                "flag hold {} ms must be longer than the interval plus delivery bound ({} ms)",
                ms(self.flag_hold),
                ms(self.interval + self.delivery)
            )));
        }
        if self.fence.is_zero() || self.fence + self.margin >= self.lease_duration {
            return Err(RideConfigError::Rule(format!(
                "fence {} ms plus margin must be shorter than the lease duration ({} ms)",
                ms(self.fence),
                ms(self.lease_duration)
            )));
        }
        Ok(())
    }

    /// How long the vouching of a blocking-set member must have lasted before a candidate
    /// takes a silent holder's lease: fence + margin + liveness + delivery.
    fn evidence(&self) -> Duration {
        self.fence + self.margin + self.liveness + self.delivery
    }
}

/// Why a holder does not (or no longer) ride through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StepDownReason {
    /// This node does not hold the lease (or its term ended).
    NotHeld,
    /// The control-plane lease never rides through.
    ControlPlane,
    /// This node released the lease to a peer.
    Released,
    /// A peer asked for the lease; release it now ([`Peers::should_release`]).
    HandOverRequested {
        /// The asking node.
        by: String,
    },
    /// The API fence ended and the previous successful evaluation is older than the
    /// liveness window (the process was frozen or stalled), or there was none.
    Gap,
    /// The ride lasted `max_ride` past the API fence.
    RideTooLong,
    /// This node is not in its own membership.
    NotMember,
    /// Another node lists this lease as held.
    OtherHolder {
        /// That node.
        node: String,
    },
    /// A node reports reaching the API (or hearing one that does).
    PeerReachesApi {
        /// That node.
        node: String,
    },
    /// Fewer than a strict majority heard (this node included).
    NoMajority {
        /// Nodes heard, this node included.
        heard: usize,
        /// Membership size.
        of: usize,
    },
}

impl StepDownReason {
    /// The VIPs must go now (not only at the end of the API fence).
    pub(crate) fn drop_now(&self) -> bool {
        matches!(
            self,
            StepDownReason::OtherHolder { .. }
                | StepDownReason::HandOverRequested { .. }
                | StepDownReason::Released
        )
    }
}

/// Answer of [`Peers::may_ride_through`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RideDecision {
    /// This node reaches the API: renew through it; the API fence applies.
    NotNeeded,
    /// Keep the VIPs; refresh them with a lifetime that ends no later than `until`.
    Ride {
        /// End of the granted lifetime (≤ now + fence).
        until: Instant,
    },
    /// No ride-through now: the VIPs keep at most what the API fence grants (or go now, if
    /// [`StepDownReason::drop_now`]). Within the API fence a later evaluation may still
    /// start a ride (flags of peers that reached the API just before an outage take the
    /// liveness window plus the flag hold to clear); past it, only a renewal restarts.
    StepDown(StepDownReason),
}

/// What a candidate sees of a Lease (from the API), on its own monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseView {
    /// Which lease.
    pub lease: LeaseRef,
    /// `holderIdentity`, `None` when released.
    pub holder: Option<String>,
    /// Current resourceVersion.
    pub resource_version: String,
    /// When this candidate last observed the Lease change.
    pub observed_at: Instant,
    /// The control-plane lease (today's rules only).
    pub control_plane: bool,
    /// The write observed carried the ride-through marker
    /// ([`crate::election::ridemark`]): its holder may ride on it. A holder marks its
    /// writes only while it has the peer key and is a member of its own membership
    /// ([`Peers::may_mark`]), so an unmarked lease's holder never rides past its API fence.
    pub marked: bool,
}

/// Why a candidate may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TakeReason {
    /// No other holder (released, or our own identity): the elector's usual rules.
    NoOtherHolder,
    /// The control-plane lease, expired: today's rule.
    ControlPlane,
    /// The holder released this very lease version.
    Released {
        /// The holder.
        holder: String,
    },
    /// The holder heartbeats without listing the lease, and it expired.
    NotListed {
        /// The holder.
        holder: String,
    },
    /// The holder is silent and a blocking set vouched for the API long enough.
    HolderSilent {
        /// The holder.
        holder: String,
    },
    /// The holder is silent and its ride-through cap has passed.
    RideCapPassed {
        /// The holder.
        holder: String,
    },
    /// The holder is silent and the write observed carries no ride-through marker: it
    /// cannot ride on it, so the lease is taken at expiry as without ride-through (a holder
    /// that had not yet read the Node objects, e.g. killed right after its start; one whose
    /// Node object is missing or named otherwise than `vip_nodename`).
    Unmarked {
        /// The holder.
        holder: String,
    },
}

/// Why a candidate waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WaitReason {
    /// Not enough nodes (of the holder's membership) vouch for the API for long enough.
    NoQuorum {
        /// Nodes vouching long enough.
        vouching: usize,
        /// Nodes needed.
        needed: usize,
    },
}

/// Answer of [`Peers::may_take`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TakeDecision {
    /// Take it (a conditional write on the resourceVersion, as always).
    Take(TakeReason),
    /// Send the holder a `HandOverRequest` and wait for its `Released`.
    AskFirst {
        /// The holder.
        holder: String,
    },
    /// The holder heartbeats and reaches the API (or we reach it only since recently, or
    /// have no good answer to a probe sent since the holder said it cannot reach it): it
    /// will renew, or the outage is everyone's.
    Defer {
        /// The holder.
        holder: String,
    },
    /// Not before `at` (evaluate again then, or on the next frame).
    WaitUntil {
        /// Earliest instant.
        at: Instant,
        /// Why.
        why: WaitReason,
    },
    /// The lease has not expired (client-go rule) and the holder has not released it.
    NotExpired,
    /// This node does not reach the API.
    NoApi,
}

#[derive(Debug, Clone)]
struct PeerInfo {
    last_at: Instant,
    digest: u64,
    flagged_at: Option<Instant>,
    streak_start: Option<Instant>,
    /// Arrival and flags of its latest message (any kind).
    latest: Option<(Instant, Flags)>,
    /// Arrival of the first of its messages, without a break, that says it does not reach
    /// the API.
    unreachable_since: Option<Instant>,
    heartbeat: Option<(Instant, Flags, BTreeSet<LeaseRef>)>,
    released: BTreeMap<LeaseRef, String>,
}

#[derive(Debug, Clone)]
struct OwnLease {
    held: HeldLease,
    renewed_at: Instant,
    control_plane: bool,
    last_ride: Option<Instant>,
    stopped: Option<StepDownReason>,
    released: bool,
    live_until: Instant,
}

/// One node's knowledge of its peers and its own leases (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Peers {
    cfg: RideConfig,
    own: String,
    membership: BTreeSet<String>,
    digest: u64,
    api_since: Option<Instant>,
    /// When the latest good API probe answered by this node was sent.
    probe_ok_sent: Option<Instant>,
    flag_since: Option<Instant>,
    flag_hold_until: Option<Instant>,
    peers: BTreeMap<String, PeerInfo>,
    own_leases: BTreeMap<LeaseRef, OwnLease>,
    requests: BTreeMap<LeaseRef, (String, Instant)>,
}

fn within(now: Instant, at: Instant, window: Duration) -> bool {
    now.saturating_duration_since(at) <= window
}

impl Peers {
    /// A node named `own`, with an empty membership.
    pub(crate) fn new(cfg: RideConfig, own: &str) -> Self {
        let membership = BTreeSet::new();
        Peers {
            cfg,
            own: own.to_owned(),
            digest: membership_digest(&membership),
            membership,
            api_since: None,
            probe_ok_sent: None,
            flag_since: None,
            flag_hold_until: None,
            peers: BTreeMap::new(),
            own_leases: BTreeMap::new(),
            requests: BTreeMap::new(),
        }
    }

    /// The vipd nodes last known from the API (this node included when it runs vipd).
    pub(crate) fn set_membership(&mut self, nodes: BTreeSet<String>) {
        self.digest = membership_digest(&nodes);
        self.membership = nodes;
    }

    /// Whether this node may mark its lease writes for a ride ([`LeaseView::marked`]): it
    /// is a member of its own membership (it rides only then, [`StepDownReason::NotMember`]).
    pub(crate) fn may_mark(&self) -> bool {
        self.membership.contains(&self.own)
    }

    /// The membership digest put in outgoing frames.
    pub(crate) fn digest(&self) -> u64 {
        self.digest
    }

    /// Whether this node reaches the API server at `now` (its last call got an answer).
    pub(crate) fn set_api(&mut self, now: Instant, reachable: bool) {
        match (reachable, self.api_since) {
            (true, None) => self.api_since = Some(now),
            (false, _) => self.api_since = None,
            (true, Some(_)) => {}
        }
    }

    /// A good API probe answer to a probe sent at `sent`: what [`Peers::may_take`] asks
    /// before it asks a holder to hand over.
    pub(crate) fn probe_ok(&mut self, sent: Instant) {
        self.probe_ok_sent = Some(self.probe_ok_sent.map_or(sent, |s| s.max(sent)));
    }

    /// One verified, assembled message that arrived at `received_at`.
    pub(crate) fn receive(&mut self, received_at: Instant, msg: &Message) {
        if msg.node == self.own {
            return;
        }
        let hold = self.cfg.flag_hold.saturating_sub(self.cfg.delivery);
        let p = self
            .peers
            .entry(msg.node.clone())
            .or_insert_with(|| PeerInfo {
                last_at: received_at,
                digest: msg.membership,
                flagged_at: None,
                streak_start: None,
                latest: None,
                unreachable_since: None,
                heartbeat: None,
                released: BTreeMap::new(),
            });
        if msg.flags.api_reachable {
            p.unreachable_since = None;
        } else {
            p.unreachable_since.get_or_insert(received_at);
        }
        p.last_at = p.last_at.max(received_at);
        p.digest = msg.membership;
        if msg.flags.vouches() {
            let continues = p
                .flagged_at
                .is_some_and(|f| within(received_at, f, hold) && p.streak_start.is_some());
            if !continues {
                p.streak_start = Some(received_at);
            }
            p.flagged_at = Some(received_at);
        } else if !msg.flags.any() {
            // A hold-only frame neither extends nor breaks a streak; no flag breaks it.
            p.streak_start = None;
        }
        if p.latest.is_none_or(|(at, _)| received_at >= at) {
            p.latest = Some((received_at, msg.flags));
        }
        match msg.kind {
            Kind::Heartbeat => {
                let listed: BTreeSet<LeaseRef> =
                    msg.leases.iter().map(|l| l.lease.clone()).collect();
                for l in &listed {
                    p.released.remove(l);
                }
                p.heartbeat = Some((received_at, msg.flags, listed));
            }
            Kind::Released => {
                for l in &msg.leases {
                    p.released
                        .insert(l.lease.clone(), l.resource_version.clone());
                }
                if let Some((_, _, listed)) = &mut p.heartbeat {
                    for l in &msg.leases {
                        listed.remove(&l.lease);
                    }
                }
            }
            Kind::HandOverRequest => {
                if msg.target.as_deref() == Some(self.own.as_str()) {
                    for l in &msg.leases {
                        if self.own_leases.contains_key(&l.lease) {
                            self.requests
                                .insert(l.lease.clone(), (msg.node.clone(), received_at));
                        }
                    }
                }
            }
        }
    }

    /// Flags for a frame built at `now`. Records the promise: after a frame that vouches
    /// ([`Flags::vouches`]), every frame built within [`RideConfig::flag_hold`] has some flag
    /// set (`api_hold` when it no longer vouches itself).
    pub(crate) fn outgoing_flags(&mut self, now: Instant) -> Flags {
        let api_reachable = self.api_since.is_some();
        // Relayed while a peer's latest frame (within the liveness window) says it reaches
        // the API: the relay stops one frame after its source does. What `api_heard` means
        // does not enter the safety argument (only the hold promise on one's own frames
        // does), so it is free to fade fast.
        let api_heard = self.peers.values().any(|p| {
            p.latest
                .is_some_and(|(a, f)| f.api_reachable && within(now, a, self.cfg.liveness))
        });
        let vouches = api_reachable || api_heard;
        if vouches {
            self.flag_hold_until = Some(now + self.cfg.flag_hold);
        }
        let flags = Flags {
            api_reachable,
            api_heard,
            api_hold: !vouches && self.flag_hold_until.is_some_and(|u| now < u),
        };
        if flags.any() {
            self.flag_since.get_or_insert(now);
        } else {
            self.flag_since = None;
        }
        flags
    }

    /// A successful lease write (acquire or renew) of `held`, whose request was sent at
    /// `renewed_at`: a new term or a continued one; ride-through may start again.
    pub(crate) fn renewed(&mut self, held: HeldLease, renewed_at: Instant, control_plane: bool) {
        // The API fence ends at send + lease duration - margin; the kernel may remove the
        // address up to the margin later.
        let live_until = renewed_at + self.cfg.lease_duration;
        self.requests.remove(&held.lease);
        self.own_leases.insert(
            held.lease.clone(),
            OwnLease {
                held,
                renewed_at,
                control_plane,
                last_ride: None,
                stopped: None,
                released: false,
                live_until,
            },
        );
    }

    /// This node no longer leads `lease` and its VIPs are gone.
    pub(crate) fn dropped(&mut self, lease: &LeaseRef) {
        self.own_leases.remove(lease);
        self.requests.remove(lease);
    }

    /// This node dropped `lease`'s VIPs after a hand-over request: the entry for the
    /// `Released` frame. `None` when it does not hold the lease.
    pub(crate) fn released(&mut self, lease: &LeaseRef) -> Option<HeldLease> {
        self.requests.remove(lease);
        let l = self.own_leases.get_mut(lease)?;
        l.released = true;
        l.stopped = Some(StepDownReason::Released);
        Some(l.held.clone())
    }

    /// Whether `holder`'s `Released` for `lease` at `resource_version` arrived (and no
    /// later heartbeat of it listed the lease again).
    pub(crate) fn released_by(
        &self,
        holder: &str,
        lease: &LeaseRef,
        resource_version: &str,
    ) -> bool {
        self.peers
            .get(holder)
            .is_some_and(|p| p.released.get(lease).map(String::as_str) == Some(resource_version))
    }

    /// The leases this node's heartbeat built at `now` lists: every lease whose VIPs may be
    /// live here (not released, and within the API fence or the last ride grant).
    pub(crate) fn listed(&self, now: Instant) -> Vec<HeldLease> {
        self.own_leases
            .values()
            .filter(|l| !l.released && now < l.live_until)
            .map(|l| l.held.clone())
            .collect()
    }

    /// A peer asked for `lease` within the liveness window and this node cannot reach the
    /// API: release it now (drop the VIPs, then [`Peers::released`] and send `Released`).
    /// The asking node.
    pub(crate) fn should_release(&self, now: Instant, lease: &LeaseRef) -> Option<String> {
        if self.api_since.is_some() {
            return None;
        }
        let l = self.own_leases.get(lease)?;
        if l.released {
            return None;
        }
        self.requests
            .get(lease)
            .filter(|(_, at)| within(now, *at, self.cfg.liveness))
            .map(|(by, _)| by.clone())
    }

    /// Whether this holder may keep `lease`'s VIPs past its API fence at `now` (see the
    /// module docs). A `StepDown` ends ride-through for the term (until [`Peers::renewed`]);
    /// a `Ride` records the evaluation.
    pub(crate) fn may_ride_through(&mut self, now: Instant, lease: &LeaseRef) -> RideDecision {
        let reason = match self.ride_check(now, lease) {
            Ok(Some(until)) => {
                if let Some(l) = self.own_leases.get_mut(lease) {
                    l.last_ride = Some(now);
                    l.live_until = l.live_until.max(until + self.cfg.margin);
                }
                return RideDecision::Ride { until };
            }
            Ok(None) => return RideDecision::NotNeeded,
            Err(r) => r,
        };
        if let Some(l) = self.own_leases.get_mut(lease) {
            // A failed check breaks the chain of evaluations: past the API fence no ride can
            // start again (the `Gap` rule) until a renewal. Hand-overs are final at once.
            l.last_ride = None;
            if reason.drop_now() {
                l.stopped.get_or_insert_with(|| reason.clone());
            }
        }
        RideDecision::StepDown(reason)
    }

    fn ride_check(
        &self,
        now: Instant,
        lease: &LeaseRef,
    ) -> Result<Option<Instant>, StepDownReason> {
        let c = &self.cfg;
        let l = self.own_leases.get(lease).ok_or(StepDownReason::NotHeld)?;
        if let Some(r) = &l.stopped {
            return Err(r.clone());
        }
        if self.api_since.is_some() {
            return Ok(None);
        }
        if l.control_plane {
            return Err(StepDownReason::ControlPlane);
        }
        if let Some((by, at)) = self.requests.get(lease)
            && within(now, *at, c.liveness)
        {
            return Err(StepDownReason::HandOverRequested { by: by.clone() });
        }
        let age = now.saturating_duration_since(l.renewed_at);
        let api_fence_valid = age + c.margin < c.lease_duration;
        let continuous = l.last_ride.is_some_and(|t| within(now, t, c.liveness));
        if !api_fence_valid && !continuous {
            return Err(StepDownReason::Gap);
        }
        let cap = l.renewed_at + c.lease_duration + c.max_ride - c.margin;
        if now >= cap {
            return Err(StepDownReason::RideTooLong);
        }
        if !self.membership.contains(&self.own) {
            return Err(StepDownReason::NotMember);
        }
        for (node, p) in &self.peers {
            if p.heartbeat.as_ref().is_some_and(|(at, _, listed)| {
                within(now, *at, c.liveness) && listed.contains(lease)
            }) {
                return Err(StepDownReason::OtherHolder { node: node.clone() });
            }
        }
        for (node, p) in &self.peers {
            // The latest frame of each peer heard within the window: a frame of a node in
            // a blocking-set run built within the window is flagged (the hold promise), and
            // the latest one is such a frame, so checking it alone keeps the argument; an
            // older flagged frame followed by unflagged ones only says the flags faded.
            if p.latest
                .is_some_and(|(at, f)| f.any() && within(now, at, c.liveness))
            {
                return Err(StepDownReason::PeerReachesApi { node: node.clone() });
            }
        }
        let heard = 1 + self
            .peers
            .iter()
            .filter(|(n, p)| {
                **n != self.own
                    && self.membership.contains(*n)
                    && p.digest == self.digest
                    && within(now, p.last_at, c.liveness)
            })
            .count();
        let of = self.membership.len();
        if heard * 2 <= of {
            return Err(StepDownReason::NoMajority { heard, of });
        }
        Ok(Some((now + c.fence).min(cap)))
    }

    /// Whether this candidate may take the lease it sees as `view` at `now` (see the module
    /// docs). Every `Take` is still a conditional write on the resourceVersion.
    pub(crate) fn may_take(&self, now: Instant, view: &LeaseView) -> TakeDecision {
        let c = &self.cfg;
        let Some(api_since) = self.api_since else {
            return TakeDecision::NoApi;
        };
        let expired = now >= view.observed_at + c.lease_duration;
        let holder = match &view.holder {
            Some(h) if *h != self.own => h.clone(),
            _ => return TakeDecision::Take(TakeReason::NoOtherHolder),
        };
        if view.control_plane {
            return if expired {
                TakeDecision::Take(TakeReason::ControlPlane)
            } else {
                TakeDecision::NotExpired
            };
        }
        let info = self.peers.get(&holder);
        if self.released_by(&holder, &view.lease, &view.resource_version) {
            return TakeDecision::Take(TakeReason::Released { holder });
        }
        let recent = info
            .and_then(|p| p.heartbeat.as_ref())
            .filter(|(at, _, _)| within(now, *at, c.liveness));
        if let Some((_, flags, listed)) = recent {
            if listed.contains(&view.lease) {
                // The holder reaches the API (it renews), or we do only since recently (its
                // API may be coming back too), or the holder renewed within the ask delay
                // (a short blip of its API: it renews again): defer. Otherwise ask.
                // Asked only on a good probe answer to a probe sent after the holder said it
                // cannot reach the API: the holder says so once it had no good answer for
                // the API window, so an answer after that is news, not this node's last
                // answer from before an outage everyone shares (probes are out of phase:
                // the lab's etcd freeze saw a candidate still within its window ask, the
                // holders release, and the Service VIPs unanswered for the whole freeze).
                let confirmed = self.probe_ok_sent.is_some_and(|sent| {
                    info.and_then(|p| p.unreachable_since)
                        .is_some_and(|since| sent > since)
                });
                if flags.api_reachable
                    || now < api_since + c.ask_delay
                    || now < view.observed_at + c.ask_delay
                    || !confirmed
                {
                    return TakeDecision::Defer { holder };
                }
                return TakeDecision::AskFirst { holder };
            }
            return if expired {
                TakeDecision::Take(TakeReason::NotListed { holder })
            } else {
                TakeDecision::NotExpired
            };
        }
        if !expired {
            return TakeDecision::NotExpired;
        }
        if !view.marked {
            return TakeDecision::Take(TakeReason::Unmarked { holder });
        }
        // No wait for a silence window: the blocking set alone rules out every ride grant
        // alive now (docs/design.md, "Why no two nodes answer for one address"), and the
        // API fence ended at expiry (rule 3).
        match self.blocking_set(now, &holder, info.map(|p| p.digest)) {
            Ok(()) => TakeDecision::Take(TakeReason::HolderSilent { holder }),
            Err((vouching, needed)) => {
                let at = view.observed_at + c.lease_duration + c.max_ride;
                if now >= at {
                    TakeDecision::Take(TakeReason::RideCapPassed { holder })
                } else {
                    TakeDecision::WaitUntil {
                        at,
                        why: WaitReason::NoQuorum { vouching, needed },
                    }
                }
            }
        }
    }

    /// At least ⌈n/2⌉ nodes of the membership other than `holder` (n = membership size, the
    /// holder's digest equal to ours) have vouched for the API, without a break, for
    /// [`RideConfig::evidence`]: every strict majority of the holder's membership that
    /// contains the holder contains one of them, so no ride-through majority can have been
    /// heard since. `Err((vouching, needed))` otherwise.
    fn blocking_set(
        &self,
        now: Instant,
        holder: &str,
        holder_digest: Option<u64>,
    ) -> Result<(), (usize, usize)> {
        let c = &self.cfg;
        let n = self.membership.len();
        let needed = n.div_ceil(2).max(1);
        if holder_digest != Some(self.digest) {
            return Err((0, needed));
        }
        let evidence = c.evidence();
        let own_ok = self.membership.contains(&self.own)
            && self.own != holder
            && self
                .flag_since
                .is_some_and(|s| now.saturating_duration_since(s) >= evidence);
        let hold = c.flag_hold.saturating_sub(c.delivery);
        let peers_ok = self
            .peers
            .iter()
            .filter(|(name, p)| {
                name.as_str() != holder
                    && self.membership.contains(*name)
                    && p.digest == self.digest
                    && p.streak_start
                        .is_some_and(|s| now.saturating_duration_since(s) >= evidence)
                    && p.flagged_at.is_some_and(|f| within(now, f, hold))
            })
            .count();
        let vouching = peers_ok + usize::from(own_ok);
        if vouching >= needed {
            Ok(())
        } else {
            Err((vouching, needed))
        }
    }
}
