//! The conflict state of one VIP while its lease is held: RFC 5227 (IPv4 Address Conflict
//! Detection) adapted to leased VIPs. Pure: time and jitter come in as arguments, the VIP
//! holder carries out the returned [`Action`]s.
//!
//! * A term that starts from a lease its previous holder released cleanly binds at once
//!   (the previous holder confirmed its VIPs gone before it released). Every other start
//!   (lease taken after expiry, newly created, found under our own name) probes first:
//!   [`PROBES`] probes spread over the probe window; the VIP is bound only if no other MAC
//!   claimed the address by the end of the window.
//! * Probing: any claim from another MAC (a host using the address, or probing for it at
//!   the same time, RFC 5227 §2.1.1) refuses the address.
//! * Bound: a claim from another MAC that uses the address (not a mere probe, which the
//!   kernel answers in our defence) removes it at once: two responders are worse than
//!   none, and the other may be a host vipd must never fight (a router, a node's own
//!   address). RFC 5227 §2.4 (a): cease using the address.
//! * Refused: the lease is kept and the address is probed again after a back-off (1 s,
//!   doubling to 30 s, plus up to half of it as random jitter so that two vipd nodes that
//!   refused each other do not probe in lock-step), so the address is used as soon as it is
//!   free.

use crate::net::conflict::PROBES;
use std::time::Duration;

use tokio::time::Instant;

use crate::net::conflict::Claim;

/// First re-probe delay after a conflict.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest re-probe delay after repeated conflicts.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Where one VIP stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not leading: nothing to hold.
    Idle,
    /// Probing until `until`; `sent` probes went out so far.
    Probing {
        /// End of the probe window.
        until: Instant,
        /// Probes sent.
        sent: u32,
    },
    /// Bound on the interface (or to be bound: the holder adds it).
    Bound,
    /// Another host claims the address: not bound; probe again at `retry_at`.
    Refused {
        /// The other host's MAC.
        mac: [u8; 6],
        /// When to probe again.
        retry_at: Instant,
    },
}

/// What the holder must do after a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Send one probe (and keep the claim watch on).
    Probe,
    /// Add (or refresh) the address and announce it.
    Bind,
    /// Another host claims the address: remove it if bound, report the conflict (`new`:
    /// first report of this conflict, or another MAC than before; log and post an Event).
    Refuse {
        /// The other host's MAC.
        mac: [u8; 6],
        /// Whether this is news (log at warn, post an Event) or a repeat.
        new: bool,
    },
}

/// The conflict state of one VIP (see module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeState {
    phase: Phase,
    backoff: Duration,
    /// The MAC last reported, so a repeat of the same conflict is not reported again.
    reported: Option<[u8; 6]>,
}

impl Default for ProbeState {
    fn default() -> Self {
        ProbeState {
            phase: Phase::Idle,
            backoff: BACKOFF_MIN,
            reported: None,
        }
    }
}

impl ProbeState {
    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// `true` while the address should be on the interface.
    pub fn bound(&self) -> bool {
        self.phase == Phase::Bound
    }

    /// The other host's MAC while refused.
    pub(crate) fn refused_by(&self) -> Option<[u8; 6]> {
        match self.phase {
            Phase::Refused { mac, .. } => Some(mac),
            _ => None,
        }
    }

    /// A term starts. `probe`: whether to probe first (see module docs); `window`: the
    /// probe window (zero = probing disabled: bind at once).
    pub fn lead(&mut self, probe: bool, window: Duration, now: Instant) -> Action {
        if !probe || window.is_zero() {
            self.phase = Phase::Bound;
            return Action::Bind;
        }
        self.start_probe(window, now)
    }

    fn start_probe(&mut self, window: Duration, now: Instant) -> Action {
        self.phase = Phase::Probing {
            until: now + window,
            sent: 1,
        };
        Action::Probe
    }

    /// The term ended: back to idle, back-off reset (a new term starts afresh).
    pub(crate) fn follow(&mut self) {
        *self = ProbeState::default();
    }

    /// A claim for this address from another MAC was seen. `rand_permille` (0..1000, from
    /// any random source) picks the jitter added to the back-off: that share of half the
    /// back-off.
    pub fn claim(&mut self, claim: &Claim, now: Instant, rand_permille: u32) -> Action {
        match self.phase {
            Phase::Idle => Action::None,
            Phase::Bound if claim.probing => Action::None,
            Phase::Probing { .. } | Phase::Bound => self.refuse(claim.mac, now, rand_permille),
            Phase::Refused { retry_at, .. } => {
                // Still claimed: keep the retry time, remember who claims it now.
                self.phase = Phase::Refused {
                    mac: claim.mac,
                    retry_at,
                };
                Action::None
            }
        }
    }

    fn refuse(&mut self, mac: [u8; 6], now: Instant, rand_permille: u32) -> Action {
        let jitter = self.backoff / 2 * rand_permille.min(1000) / 1000;
        let retry_at = now + self.backoff + jitter;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        self.phase = Phase::Refused { mac, retry_at };
        let new = self.reported != Some(mac);
        self.reported = Some(mac);
        Action::Refuse { mac, new }
    }

    /// Time passes: sends the remaining probes, binds at the end of a quiet window, starts a
    /// new probe when a refusal's back-off is over.
    pub fn tick(&mut self, window: Duration, now: Instant) -> Action {
        match self.phase {
            Phase::Probing { until, .. } if now >= until => {
                self.phase = Phase::Bound;
                self.reported = None;
                Action::Bind
            }
            Phase::Probing { until, sent }
                if sent < PROBES && now >= self.next_probe_at(until, sent, window) =>
            {
                self.phase = Phase::Probing {
                    until,
                    sent: sent + 1,
                };
                Action::Probe
            }
            Phase::Refused { retry_at, .. } if now >= retry_at => self.start_probe(window, now),
            _ => Action::None,
        }
    }

    /// The probe just asked for ([`Action::Probe`]) could not be sent: it does not count
    /// (RFC 5227 section 2.1.1 binds after PROBE_NUM probes on the wire and a quiet window).
    /// The window moves one `window` later, so the same probe is tried again then (one
    /// window, not at once: a send that keeps failing, a full queue or a link going down, is
    /// not retried in a loop) and the quiet window still follows the last probe sent.
    /// Nothing changes outside the probing phase.
    pub(crate) fn unsent(&mut self, window: Duration) {
        if let Phase::Probing { until, sent } = self.phase {
            self.phase = Phase::Probing {
                until: until + window,
                sent: sent.saturating_sub(1),
            };
        }
    }

    /// Probes are spread evenly: probe `k` (0-based) at `start + k * window / PROBES`.
    fn next_probe_at(&self, until: Instant, sent: u32, window: Duration) -> Instant {
        let start = until.checked_sub(window).unwrap_or(until);
        start + window * sent / PROBES
    }

    /// When [`ProbeState::tick`] next has something to do, if ever.
    pub(crate) fn next_deadline(&self, window: Duration) -> Option<Instant> {
        match self.phase {
            Phase::Probing { until, sent } if sent < PROBES => {
                Some(self.next_probe_at(until, sent, window).min(until))
            }
            Phase::Probing { until, .. } => Some(until),
            Phase::Refused { retry_at, .. } => Some(retry_at),
            Phase::Idle | Phase::Bound => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    const W: Duration = Duration::from_millis(50);
    const OTHER: [u8; 6] = [2, 0, 0, 0, 0, 0xbb];
    const THIRD: [u8; 6] = [2, 0, 0, 0, 0, 0xcc];

    fn claim(mac: [u8; 6], probing: bool) -> Claim {
        Claim {
            addr: "192.0.2.77".parse::<IpAddr>().unwrap(),
            mac,
            probing,
        }
    }

    #[test]
    fn clean_handover_binds_at_once_and_probing_disabled_too() {
        let now = Instant::now();
        let mut s = ProbeState::default();
        assert_eq!(s.lead(false, W, now), Action::Bind);
        assert!(s.bound());
        let mut s = ProbeState::default();
        assert_eq!(s.lead(true, Duration::ZERO, now), Action::Bind);
        assert!(s.bound());
    }

    /// A probe that could not be sent does not count: it is tried again a window later, and
    /// the bind waits for every probe on the wire and a quiet window after the last.
    #[test]
    fn a_probe_not_sent_is_tried_again_and_the_bind_waits_for_it() {
        let t0 = Instant::now();
        let mut s = ProbeState::default();
        assert_eq!(s.lead(true, W, t0), Action::Probe);
        s.unsent(W);
        // Where the window would have ended: still probing, the first probe due again now.
        assert_eq!(s.tick(W, t0 + W), Action::Probe, "the unsent probe again");
        assert!(!s.bound());
        assert_eq!(s.tick(W, t0 + W + W / 2), Action::Probe, "the second probe");
        assert_eq!(s.tick(W, t0 + W + W / 2), Action::None);
        assert_eq!(
            s.tick(W, t0 + 2 * W),
            Action::Bind,
            "a window after the first sent"
        );
        // Outside the probing phase nothing changes.
        let before = s.clone();
        s.unsent(W);
        assert_eq!(s, before);
    }

    #[test]
    fn quiet_probe_window_sends_every_probe_then_binds() {
        let t0 = Instant::now();
        let mut s = ProbeState::default();
        assert_eq!(s.lead(true, W, t0), Action::Probe);
        assert!(!s.bound());
        // Before the second probe is due: nothing.
        assert_eq!(s.tick(W, t0 + W / 4), Action::None);
        assert_eq!(s.next_deadline(W), Some(t0 + W / 2));
        assert_eq!(s.tick(W, t0 + W / 2), Action::Probe);
        assert_eq!(s.tick(W, t0 + W / 2), Action::None, "each probe once");
        assert_eq!(s.next_deadline(W), Some(t0 + W));
        assert_eq!(s.tick(W, t0 + W - Duration::from_millis(1)), Action::None);
        assert_eq!(s.tick(W, t0 + W), Action::Bind);
        assert!(s.bound());
        assert_eq!(s.next_deadline(W), None);
    }

    #[test]
    fn any_claim_while_probing_refuses_even_a_probe() {
        for probing in [false, true] {
            let t0 = Instant::now();
            let mut s = ProbeState::default();
            s.lead(true, W, t0);
            assert_eq!(
                s.claim(&claim(OTHER, probing), t0, 0),
                Action::Refuse {
                    mac: OTHER,
                    new: true
                }
            );
            assert_eq!(s.refused_by(), Some(OTHER));
            // The window ending no longer binds.
            assert_eq!(s.tick(W, t0 + W), Action::None);
            assert!(!s.bound());
        }
    }

    #[test]
    fn bound_address_is_given_up_on_a_claim_but_defended_against_probes() {
        let t0 = Instant::now();
        let mut s = ProbeState::default();
        s.lead(false, W, t0);
        assert_eq!(s.claim(&claim(OTHER, true), t0, 0), Action::None);
        assert!(
            s.bound(),
            "a probe for our address is answered, not yielded to"
        );
        assert_eq!(
            s.claim(&claim(OTHER, false), t0, 0),
            Action::Refuse {
                mac: OTHER,
                new: true
            }
        );
        assert!(!s.bound());
    }

    #[test]
    fn refused_address_is_probed_again_with_doubling_backoff_and_taken_when_free() {
        let t0 = Instant::now();
        let mut s = ProbeState::default();
        s.lead(true, W, t0);
        s.claim(&claim(OTHER, false), t0, 0);
        assert_eq!(s.next_deadline(W), Some(t0 + BACKOFF_MIN));
        assert_eq!(s.tick(W, t0 + BACKOFF_MIN / 2), Action::None);
        let t1 = t0 + BACKOFF_MIN;
        assert_eq!(s.tick(W, t1), Action::Probe);
        // Still there: same MAC, not news; back-off doubled.
        assert_eq!(
            s.claim(&claim(OTHER, false), t1, 0),
            Action::Refuse {
                mac: OTHER,
                new: false
            }
        );
        assert_eq!(s.next_deadline(W), Some(t1 + BACKOFF_MIN * 2));
        // Claims while refused change nothing but the MAC.
        assert_eq!(s.claim(&claim(THIRD, false), t1, 0), Action::None);
        assert_eq!(s.refused_by(), Some(THIRD));
        // Gone: the next probe window is quiet and the address is bound.
        let t2 = t1 + BACKOFF_MIN * 2;
        assert_eq!(s.tick(W, t2), Action::Probe);
        assert_eq!(s.tick(W, t2 + W / 2), Action::Probe);
        assert_eq!(s.tick(W, t2 + W), Action::Bind);
        assert!(s.bound());
        // A later conflict is news again.
        assert_eq!(
            s.claim(&claim(OTHER, false), t2 + W, 0),
            Action::Refuse {
                mac: OTHER,
                new: true
            }
        );
    }

    #[test]
    fn backoff_is_capped_and_jitter_bounded_by_half_the_backoff() {
        let mut now = Instant::now();
        let mut s = ProbeState::default();
        s.lead(true, W, now);
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            s.claim(&claim(OTHER, false), now, 1000);
            let Phase::Refused { retry_at, .. } = s.phase() else {
                panic!("not refused")
            };
            last = retry_at - now;
            now = retry_at;
            assert_eq!(s.tick(W, now), Action::Probe);
        }
        assert_eq!(last, BACKOFF_MAX + BACKOFF_MAX / 2);
    }

    #[test]
    fn following_resets_everything() {
        let t0 = Instant::now();
        let mut s = ProbeState::default();
        s.lead(true, W, t0);
        s.claim(&claim(OTHER, false), t0, 0);
        s.follow();
        assert_eq!(s, ProbeState::default());
        assert_eq!(s.claim(&claim(OTHER, false), t0, 0), Action::None);
        assert_eq!(s.tick(W, t0 + BACKOFF_MAX * 2), Action::None);
    }
}
