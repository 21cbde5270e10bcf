//! Spread without preemption: a node that already holds leases waits a little before it
//! acquires a free one, so leases (Service VIPs) spread evenly over the nodes that
//! campaign, and nobody ever takes a held lease away.
//!
//! A node holding `h` leases (plus `f` acquisitions in flight) takes a free lease no sooner
//! than [`spread_delay`]`(h + f)` after the latest of three instants: when it saw the lease
//! free, when it last acquired a lease, and when it last began an acquisition. The first
//! makes a node with fewer leases win a released lease; the others pace a node through many
//! free leases at once (a cold start: every lease free at the same instant) one at a time,
//! slower the more it holds, so the other nodes get their share.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// Delay per lease held before acquiring a free lease.
pub const SPREAD_STEP: Duration = Duration::from_millis(20);

/// Upper bound of the spread delay (reached at 50 leases held).
pub const SPREAD_CAP: Duration = Duration::from_secs(1);

/// The delay of a node that holds (or is acquiring) `count` leases: `count` x `step`, at most
/// `cap`. Pure.
pub fn spread_delay(count: usize, step: Duration, cap: Duration) -> Duration {
    let n = u32::try_from(count).unwrap_or(u32::MAX);
    step.checked_mul(n).unwrap_or(cap).min(cap)
}

#[derive(Debug, Default)]
struct State {
    held: usize,
    in_flight: usize,
    last_acquired: Option<Instant>,
    last_begun: Option<Instant>,
}

/// The leases one node holds, shared by the electors that spread (one per Service lease).
#[derive(Debug)]
pub struct Spread {
    state: Mutex<State>,
    step: Duration,
    cap: Duration,
}

impl Spread {
    /// A counter with [`SPREAD_STEP`] and [`SPREAD_CAP`].
    pub fn new() -> Arc<Self> {
        Self::with(SPREAD_STEP, SPREAD_CAP)
    }

    /// A counter with the given step and cap.
    pub fn with(step: Duration, cap: Duration) -> Arc<Self> {
        Arc::new(Spread {
            state: Mutex::new(State::default()),
            step,
            cap,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this small lock leaves consistent counters.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Leases held now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    /// The earliest instant this node may acquire a lease it saw free at `free_since`.
    pub fn not_before(&self, free_since: Instant) -> Instant {
        let s = self.lock();
        let base = [s.last_acquired, s.last_begun]
            .into_iter()
            .flatten()
            .fold(free_since, Instant::max);
        base + spread_delay(s.held + s.in_flight, self.step, self.cap)
    }

    /// An acquisition starts now; it counts as held until the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        let mut s = self.lock();
        s.in_flight += 1;
        s.last_begun = Some(Instant::now());
        drop(s);
        InFlight(self.clone())
    }

    /// A lease was acquired at `now`.
    pub(crate) fn acquired(&self, now: Instant) {
        let mut s = self.lock();
        s.held += 1;
        s.last_acquired = Some(now);
    }

    /// A lease held was given up.
    pub(crate) fn released(&self) {
        let mut s = self.lock();
        s.held = s.held.saturating_sub(1);
    }
}

/// One acquisition in flight (see [`Spread::begin`]).
pub(crate) struct InFlight(Arc<Spread>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_grows_with_leases_held_and_is_capped() {
        let ms = Duration::from_millis;
        assert_eq!(spread_delay(0, ms(20), ms(1000)), Duration::ZERO);
        assert_eq!(spread_delay(1, ms(20), ms(1000)), ms(20));
        assert_eq!(spread_delay(10, ms(20), ms(1000)), ms(200));
        assert_eq!(spread_delay(50, ms(20), ms(1000)), ms(1000));
        assert_eq!(spread_delay(500, ms(20), ms(1000)), ms(1000));
        assert_eq!(spread_delay(usize::MAX, ms(20), ms(1000)), ms(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn not_before_counts_held_and_in_flight_from_the_later_instant() {
        let ms = Duration::from_millis;
        let s = Spread::with(ms(20), ms(1000));
        let t0 = Instant::now();
        assert_eq!(s.not_before(t0), t0, "nothing held: at once");
        tokio::time::advance(ms(30)).await;
        let g = s.begin();
        assert_eq!(
            s.not_before(t0),
            t0 + ms(50),
            "one in flight, paced from when it began"
        );
        drop(g);
        assert_eq!(s.not_before(t0), t0 + ms(30), "lost its race: no delay");
        let s = Spread::with(ms(20), ms(1000));
        let g = s.begin();
        tokio::time::advance(ms(5)).await;
        s.acquired(Instant::now());
        drop(g);
        assert_eq!(s.held(), 1);
        // Paced from the last acquisition when the lease was free before it.
        assert_eq!(s.not_before(t0), t0 + ms(55));
        // From when the lease was seen free when that is later.
        assert_eq!(s.not_before(t0 + ms(100)), t0 + ms(120));
        s.released();
        assert_eq!(s.not_before(t0 + ms(100)), t0 + ms(100));
        s.released();
        assert_eq!(s.held(), 0, "never below zero");
    }
}
