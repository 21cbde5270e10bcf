//! A VIP's valid lifetime given as an end, not as a number: the kernel fence that survives a
//! freeze.
//!
//! The kernel counts an address's `valid_lft` from when it handles the request, not from
//! when vipd computed the number. A process frozen (SIGSTOP, a stalled VM, a long GC-like
//! pause) between the two hands the kernel a full lifetime long after the lease it came
//! from may have passed to another node, and the old holder answers next to the new one
//! until it notices. The chaos soak found that window more than once (seeds 20261201 and
//! 711036458): each fix moved the check closer to the request, and each time the awaits
//! left in between (a link lookup, an address dump, the rtnetlink connection task, a lock)
//! kept a window of tens of milliseconds after a thaw.
//!
//! So the holder no longer hands the kernel layer a number: it hands a [`Lifetime`], the
//! moment by which the address must be gone, and the kernel layer turns it into seconds
//! ([`Lifetime::secs_at`]) immediately before the request that carries them, on a blocking
//! netlink socket where the kernel handles the request inside the `sendmsg` call
//! ([`add_within`]). The clock is read again when the kernel has answered: if the process
//! was frozen in between, the lifetime the kernel took may reach past the end, and it is cut
//! or the address deleted before anything else runs. What is left is the few instructions
//! between the clock read and the system call.

use std::time::Duration;

use tokio::time::Instant;

/// How long a VIP may stay on the interface, as the kernel fence (`valid_lft`, whole
/// seconds) sees it: at most `max_secs`, and gone by `until` when there is one.
///
/// `until` is the end the holder derives from the lease (the last renewal's send time plus
/// the lease duration less [`crate::lease::FENCE_MARGIN`]) and, for a DHCP address, the
/// DHCP lease's expiry (RFC 2131 section 4.4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// Upper bound of the lifetime, seconds (the fence lifetime of `fence_plan`).
    pub max_secs: u32,
    /// The moment the address must be gone by; `None`: no end other than `max_secs`.
    pub until: Option<Instant>,
}

impl Lifetime {
    /// A fixed lifetime of `secs` seconds with no end (tests, one-off adds).
    pub fn fixed(secs: u32) -> Self {
        Self {
            max_secs: secs,
            until: None,
        }
    }

    /// At most `max_secs`, gone by `until`.
    pub fn until(max_secs: u32, until: Instant) -> Self {
        Self {
            max_secs,
            until: Some(until),
        }
    }

    /// The lifetime, whole seconds rounded down, that a request handled at `now` may carry
    /// so that the kernel removes the address by [`Self::until`]. 0: none (do not add, and
    /// remove what was just added). Pure.
    pub fn secs_at(&self, now: Instant) -> u32 {
        match self.until {
            Some(end) => {
                let left = end.saturating_duration_since(now).as_secs();
                self.max_secs.min(u32::try_from(left).unwrap_or(u32::MAX))
            }
            None => self.max_secs,
        }
    }

    /// Whether an address given `secs` seconds by a request the kernel handled no later than
    /// `answered` (the clock read once its answer arrived) is removed by [`Self::until`].
    /// Pure.
    pub fn holds(&self, secs: u32, answered: Instant) -> bool {
        self.until
            .is_none_or(|end| answered + Duration::from_secs(u64::from(secs)) <= end)
    }
}

/// Adds (or refreshes) an address with `lifetime` through `send`, which sends one request
/// carrying the lifetime it is given (seconds) and returns once the kernel has answered:
/// the seconds are computed from `now()` right before each `send`, and `now()` is read again
/// after it. When the kernel may have taken them too late (the process was frozen or
/// stalled between the two reads) the address is sent again with what is left, or deleted
/// with `delete` when nothing is (at most `attempts` sends).
///
/// Returns the seconds the address holds after the last send, 0 when it was never sent
/// (nothing left at the first read) or deleted.
///
/// # Errors
/// The first error of `send` or `delete`. A `send` error after an earlier send was taken,
/// or one for which `taken` says the kernel may have taken the request anyway (the answer
/// was lost, not refused), first deletes the address (best effort: a lifetime taken late
/// may reach past [`Lifetime::until`]); after a failed `delete` it may still, and the caller
/// removes it by other means.
pub fn add_within<E>(
    lifetime: &Lifetime,
    attempts: usize,
    mut now: impl FnMut() -> Instant,
    taken: impl Fn(&E) -> bool,
    mut send: impl FnMut(u32) -> Result<(), E>,
    mut delete: impl FnMut() -> Result<(), E>,
) -> Result<u32, E> {
    let mut sent = false;
    for _ in 0..attempts.max(1) {
        let secs = lifetime.secs_at(now());
        if secs == 0 {
            break;
        }
        if let Err(e) = send(secs) {
            if sent || taken(&e) {
                // Best effort; the send's error is the one that matters.
                let _ = delete();
            }
            return Err(e);
        }
        sent = true;
        if lifetime.holds(secs, now()) {
            return Ok(secs);
        }
    }
    if sent {
        delete()?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn seconds_are_what_is_left_rounded_down_and_capped() {
        let t0 = Instant::now();
        let l = Lifetime::until(2, t0 + ms(2750));
        assert_eq!(l.secs_at(t0), 2);
        assert_eq!(l.secs_at(t0 + ms(800)), 1, "1.95 s left: 1 s");
        assert_eq!(l.secs_at(t0 + ms(1800)), 0, "0.95 s left: none");
        assert_eq!(l.secs_at(t0 + ms(9000)), 0, "past the end");
        assert_eq!(Lifetime::fixed(30).secs_at(t0 + ms(99_000)), 30);
        assert!(l.holds(2, t0 + ms(750)));
        assert!(!l.holds(2, t0 + ms(751)));
        assert!(Lifetime::fixed(5).holds(5, t0 + ms(99_000)));
    }

    /// The clock as the loop sees it: a freeze of `freeze` happens during the first send
    /// (the kernel takes the request after it).
    fn run(l: Lifetime, t0: Instant, freeze: Duration) -> (u32, Vec<u32>, usize) {
        let clock = Cell::new(t0);
        let sends = std::cell::RefCell::new(Vec::new());
        let deletes = Cell::new(0);
        let r = add_within::<()>(
            &l,
            3,
            || clock.get(),
            |_| false,
            |s| {
                if sends.borrow().is_empty() {
                    clock.set(clock.get() + freeze);
                }
                sends.borrow_mut().push(s);
                Ok(())
            },
            || {
                deletes.set(deletes.get() + 1);
                Ok(())
            },
        )
        .unwrap();
        (r, sends.into_inner(), deletes.get())
    }

    #[test]
    fn a_freeze_before_the_kernel_took_the_lifetime_deletes_or_shortens_at_once() {
        let t0 = Instant::now();
        let l = Lifetime::until(2, t0 + ms(2750));
        assert_eq!(run(l, t0, ms(1)), (2, vec![2], 0), "no freeze: as granted");
        assert_eq!(
            run(l, t0, ms(1200)),
            (1, vec![2, 1], 0),
            "taken 1.2 s late: cut to the 1 s that fits"
        );
        assert_eq!(
            run(l, t0, ms(6000)),
            (0, vec![2], 1),
            "taken after the end: deleted before anything else"
        );
    }

    #[test]
    fn nothing_is_sent_once_the_end_has_passed() {
        let t0 = Instant::now();
        let l = Lifetime::until(2, t0 + ms(900));
        assert_eq!(run(l, t0, ms(0)), (0, vec![], 0));
    }

    /// A refused send took nothing: nothing to delete. A send whose answer was lost may
    /// have been taken, and a failed second send follows one that was: both delete.
    #[test]
    fn a_failed_send_is_the_error_and_deletes_what_may_have_been_taken() {
        let t0 = Instant::now();
        let l = Lifetime::until(2, t0 + ms(2750));
        let deletes = Cell::new(0);
        let delete = || {
            deletes.set(deletes.get() + 1);
            Ok(())
        };
        let lost = |e: &&str| *e == "no answer";
        let r = add_within(&l, 3, || t0, lost, |_| Err("EBUSY"), delete);
        assert_eq!(r, Err("EBUSY"));
        assert_eq!(deletes.get(), 0, "refused: nothing taken");
        let r = add_within(&l, 3, || t0, lost, |_| Err("no answer"), delete);
        assert_eq!(r, Err("no answer"));
        assert_eq!(deletes.get(), 1, "maybe taken: deleted");
        // Taken 1.2 s late, then the shorter replace is refused: deleted.
        let clock = Cell::new(t0);
        let sends = Cell::new(0);
        let r = add_within(
            &l,
            3,
            || clock.get(),
            lost,
            |_| {
                sends.set(sends.get() + 1);
                if sends.get() == 1 {
                    clock.set(t0 + ms(1200));
                    Ok(())
                } else {
                    Err("EBUSY")
                }
            },
            delete,
        );
        assert_eq!(r, Err("EBUSY"));
        assert_eq!(deletes.get(), 2, "the late first add is deleted");
    }
}
