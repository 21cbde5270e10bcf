//! Lease timing and fence rules, shared by election, holder, peer protocol and the
//! configuration check: the [`Timing`] of a Lease (client-go `LeaderElectionConfig`) and
//! how long a holder may keep a VIP answered after a renewal (the kernel fence's whole
//! seconds, the nftables fence's milliseconds, and their margins). Pure: no I/O, no clock.

use std::time::Duration;

/// Lease timings and identity for one election (client-go leaderelection semantics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease object name, e.g. `plndr-cp-lock` (kube-vip `vip_leasename`).
    pub name: String,
    /// Namespace of the Lease (kube-vip `cp_namespace`).
    pub namespace: String,
    /// `vip_leaseduration`, `vip_renewdeadline`, `vip_retryperiod`.
    pub timing: Timing,
}

/// Lease timings (client-go `LeaderElectionConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Written as `leaseDurationSeconds` (rounded up to whole seconds): candidates wait this
    /// long after the last observed change before they take the lease.
    pub lease_duration: Duration,
    /// The holder stops leading when it could not renew for this long. Shorter than
    /// `lease_duration`.
    pub renew_deadline: Duration,
    /// Interval between renewals by the holder, and the poll interval of candidates whose
    /// watch is failing. Shorter than `renew_deadline`.
    pub retry_period: Duration,
}

impl Timing {
    /// Timeout of each single Lease API call: half the renew deadline, within 0.5..=5 s, so
    /// a holder gets at least two tries before its renew deadline.
    pub fn call_timeout(&self) -> Duration {
        (self.renew_deadline / 2).clamp(Duration::from_millis(500), Duration::from_secs(5))
    }

    /// Largest back-off between failed campaign attempts: the lease duration (so a node that
    /// lost its API connection gets the lease back within about one lease duration once the
    /// API returns), at least the retry period.
    pub fn max_backoff(&self) -> Duration {
        self.lease_duration.max(self.retry_period)
    }
}

/// Errors of the fence computation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TimingError {
    /// No whole number of seconds is both longer than the retry period and shorter than the
    /// lease duration.
    #[error(
        "lease timings leave no room for the kernel fence: the VIP lifetime must be a whole number of seconds longer than vip_retryperiod ({retry_ms} ms) and shorter than vip_leaseduration ({lease_ms} ms); use e.g. vip_leaseduration=3 vip_renewdeadline=2 vip_retryperiod=1, or leave the millisecond fence on (vip_nftfence unset or true) for sub-second timings"
    )]
    NoRoom {
        /// Retry period in ms.
        retry_ms: u128,
        /// Lease duration in ms.
        lease_ms: u128,
    },
    /// The millisecond fence (`min(renew deadline, lease duration - NFT_FENCE_MARGIN)`)
    /// would end before the next renewal.
    #[error(
        "lease timings leave no room for the millisecond fence: min(vip_renewdeadline, vip_leaseduration - 50 ms) = {fence_ms} ms must be longer than vip_retryperiod ({retry_ms} ms); use e.g. the fast profile vip_leaseduration=0.6 vip_renewdeadline=0.4 vip_retryperiod=0.2"
    )]
    NoRoomMs {
        /// The fence, ms.
        fence_ms: u128,
        /// Retry period in ms.
        retry_ms: u128,
    },
}

/// The kernel fence: the valid lifetime, in whole seconds (the kernel's unit), given to
/// every VIP and refreshed on every successful renew. A killed or frozen vipd stops
/// refreshing and the kernel removes the address before any other node may take the lease.
///
/// Rule: the largest whole number of seconds below the renew deadline; when that is not
/// longer than the retry period (the address would lapse between two renewals), the
/// smallest whole number above the retry period instead, as long as it stays below the lease
/// duration (the bound safety needs: a candidate waits a full lease duration after the last
/// renewal it saw). Kube-vip's 5/3/1 gives 2 s.
///
/// # Errors
/// [`TimingError::NoRoom`] when no such number exists (e.g. lease 2 s, retry 1 s).
pub fn fence_lifetime(t: &Timing) -> Result<u32, TimingError> {
    let rd_ms = t.renew_deadline.as_millis();
    let below_rd = rd_ms.div_ceil(1000).saturating_sub(1);
    let retry_ms = t.retry_period.as_millis();
    let lease_ms = t.lease_duration.as_millis();
    let f = if below_rd * 1000 > retry_ms {
        below_rd
    } else {
        retry_ms / 1000 + 1
    };
    if f == 0 || f * 1000 >= lease_ms {
        return Err(TimingError::NoRoom { retry_ms, lease_ms });
    }
    u32::try_from(f).map_err(|_| TimingError::NoRoom { retry_ms, lease_ms })
}

/// Whether timings `t` can be fenced by the nftables element alone: no whole number of
/// seconds fits them ([`fence_lifetime`] fails), so [`fence_plan`] needs the millisecond
/// fence (`vip_nftfence` not false) and refuses them without it. Pure.
pub fn needs_nft_fence(t: &Timing) -> bool {
    fence_lifetime(t).is_err()
}

/// Time kept between a VIP's expiry and the earliest takeover by another node (its lease
/// duration after the last renewal it saw): the kernel's address expiry work
/// (`check_lifetime`, net/ipv4/devinet.c) removes a lone address up to 250 ms late
/// (`ADDRCONF_TIMER_FUZZ`), and clocks run at slightly different rates. Several addresses
/// expiring within a second of each other can be removed up to a second late (its runs are
/// at least `ADDRCONF_TIMER_FUZZ_MAX` apart): docs/design.md, "The kernel fence", says what
/// covers that (the RFC 5227 probe before a takeover after expiry; exactly, the nftables
/// fence).
pub const FENCE_MARGIN: Duration = Duration::from_millis(250);

/// The valid lifetime, in whole seconds, a VIP may get `age` after the last renewal request
/// was sent: [`fence_lifetime`]'s `fence_secs`, cut so that the address is gone
/// [`FENCE_MARGIN`] before `lease_duration` has passed since that send (no candidate takes
/// the lease earlier). 0 (do not add or refresh) once less than a second is left, e.g. when
/// a stale leadership update is acted on after the process was frozen. Pure.
pub fn fence_grant(fence_secs: u32, lease_duration: Duration, age: Duration) -> u32 {
    let left = lease_duration.saturating_sub(age.saturating_add(FENCE_MARGIN));
    u32::try_from(left.as_secs())
        .unwrap_or(u32::MAX)
        .min(fence_secs)
}

/// Whether the lease others see may have expired `age` after the last renewal request was
/// sent (less `margin`: [`FENCE_MARGIN`], or [`NFT_FENCE_MARGIN`] under the millisecond
/// fence): from then on this node must answer for nothing, whatever its elector has not
/// yet noticed (a process continued after a freeze, a stalled task): its addresses go, but
/// for second-line addresses, whose ended elements keep them inert. Pure.
pub fn fence_lapsed(lease_duration: Duration, margin: Duration, age: Duration) -> bool {
    age.saturating_add(margin) >= lease_duration
}

/// How long the nftables fence ([`crate::net::nft::fence`]) may keep a VIP answered when
/// its element is set `age` after the last renewal request was sent: `fence` (the fence
/// lifetime, the same one [`fence_grant`] gives the address) from now, never past the send
/// time plus `lease_duration` less `margin` ([`FencePlan::margin`]); whole milliseconds,
/// rounded down. Like the address, the element is set on every renewal and refreshed between
/// renewals while the holder still leads (`holder`'s periodic check, and each ride-through
/// evaluation during an API outage), so it ends with the address: `fence` after the holder
/// last ran, and never past the lease the other nodes see. Zero (drop now) once the lease
/// less the margin has passed, e.g. when the process was frozen between the renewal and
/// this call. Unlike [`fence_grant`] it is not cut to whole seconds.
///
/// `expected_run` is how long the transaction that sets the element is expected to take (from
/// its write to the kernel's answer; the holder passes what its recent runs took): the part
/// beyond [`NFT_RUN_ALLOWANCE`] is taken off the lease's end up front, so that a run as slow
/// as expected still ends inside the bound [`fence_overrun`] checks (its element then ends
/// that much earlier; the check itself is unchanged, so a slower run still overruns). With
/// [`Duration::ZERO`] the element gets all the lease allows. Pure.
pub fn fence_timeout(
    fence: Duration,
    lease_duration: Duration,
    margin: Duration,
    age: Duration,
    expected_run: Duration,
) -> Duration {
    let reserve = expected_run.saturating_sub(NFT_RUN_ALLOWANCE.min(margin));
    let left = fence.min(
        lease_duration
            .saturating_sub(margin)
            .saturating_sub(reserve)
            .saturating_sub(age),
    );
    Duration::from_millis(u64::try_from(left.as_millis()).unwrap_or(u64::MAX))
}

/// What the next fence transaction of a holder is expected to take ([`fence_timeout`]'s
/// `expected_run`), after one that took `last` when `previous` was expected, under a lease
/// of `lease_duration` with `margin`: the slower of `last` and half of `previous`, so a slow
/// run is reserved for at once (the recheck after an overrun, and the next renewals, give it
/// room) and the reserve halves with every fast run after it (a node that was busy for a
/// moment does not shorten its elements for long). A run longer than
/// [`FENCE_RUN_LEARNT_MAX`] or a quarter of `lease_duration - margin` is not the node's pace
/// but a freeze (of this process or of `nft`): it is not learnt (`previous` stays), or one
/// freeze would cut the next elements short for several renewals. Pure.
pub fn fence_run_expected(
    previous: Duration,
    last: Duration,
    lease_duration: Duration,
    margin: Duration,
) -> Duration {
    let most = FENCE_RUN_LEARNT_MAX.min(lease_duration.saturating_sub(margin) / 4);
    if last > most {
        return previous;
    }
    last.max(previous / 2)
}

/// The longest fence transaction [`fence_run_expected`] takes as the node's pace: 300 ms
/// (ten times [`NFT_RUN_ALLOWANCE`]). A batched transaction of a few thousand elements on a
/// busy node (issue 28's 10 000 Services on a 2-core VM) stays well under it; a longer one is
/// a freeze.
pub const FENCE_RUN_LEARNT_MAX: Duration = Duration::from_millis(300);

/// Whether a fence element that may live until `ends` after the last renewal request was
/// sent (what [`crate::net::nft::fence::VipFence::refresh`] returns: its run's end plus
/// the timeout it carried) may outlive the lease as the other nodes see it: past
/// `lease_duration` less `margin` plus [`NFT_RUN_ALLOWANCE`], the part of the margin kept
/// for the transaction itself. Then the holder must shorten or expire it. Pure.
pub fn fence_overrun(lease_duration: Duration, margin: Duration, ends: Duration) -> bool {
    ends > lease_duration.saturating_sub(margin) + NFT_RUN_ALLOWANCE.min(margin)
}

/// How long a fence transaction may take (from building it to the kernel's answer) before the
/// element it set counts as overrunning the lease ([`fence_overrun`]): the part of
/// [`NFT_FENCE_MARGIN`] (and of [`FENCE_MARGIN`]) kept for it. The rest of the margin, 20 ms,
/// covers the jiffy granularity of nftables timeouts (at most 10 ms) and clock-rate drift
/// (under 1 ms on a 1 s lease). A delete of a live element makes a run wait for the kernel's
/// readers (about 20 ms), so a run rarely takes longer on an idle node; a longer one costs
/// another run with what is left of the element's time, or its expiry.
pub const NFT_RUN_ALLOWANCE: Duration = Duration::from_millis(30);

/// Margin of the millisecond fence ([`FencePlan`] with `address_fences` false): time kept
/// between the end of a VIP's nftables element and the earliest takeover by another node.
/// It covers what the whole-second [`FENCE_MARGIN`] covers except the kernel's address
/// expiry lag, which does not apply (an element's timeout is checked on every packet, to the
/// jiffy): clock-rate drift between the nodes (under 0.1 %, under 1 ms on a 1 s lease), the
/// jiffy granularity of nftables timeouts (at most 10 ms at HZ=100), and the time `nft`
/// takes to apply an element ([`NFT_RUN_ALLOWANCE`], which [`fence_overrun`] checks).
/// docs/design.md has the proof.
pub const NFT_FENCE_MARGIN: Duration = Duration::from_millis(50);

/// How a holder's VIPs are fenced, from the lease timings ([`fence_plan`], issue 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencePlan {
    /// Valid lifetime, whole seconds, given to every VIP address and refreshed on every
    /// renewal.
    pub address_secs: u32,
    /// The address lifetime is the fence: every grant is cut so that the address is gone
    /// [`FENCE_MARGIN`] before the lease can pass ([`fence_grant`]). `false` under the
    /// millisecond fence: the nftables element is the fence, and the address (which the
    /// kernel can only time in whole seconds) may outlive the lease, inert (its ARP, NS and
    /// IP packets dropped), as a second line.
    pub address_fences: bool,
    /// How long after a renewal's send time the VIP's nftables element keeps it answered
    /// ([`fence_timeout`]).
    pub nft: Duration,
    /// The margin before the lease can pass: [`FENCE_MARGIN`] or [`NFT_FENCE_MARGIN`].
    pub margin: Duration,
    /// Valid lifetime, whole seconds, that an address may get instead of `address_secs`
    /// right after its holder's nftables element was set by the same refresh
    /// ([`with_second_line`]): the element fences, the address is its inert second line and
    /// is refreshed only when the kernel reports at most [`Self::second_line_refresh_secs`] left
    /// ([`second_line_fresh`]). 0: never (the address lifetime fences every refresh). The
    /// shortest line: a node holding many VIPs gives a longer one ([`second_line_len`]).
    pub second_line_secs: u32,
    /// A second-line address is refreshed once the kernel reports at most this many
    /// seconds left (whole seconds; [`second_line_fresh`]): [`SECOND_LINE_REFRESH_SECS`],
    /// or twice the whole-second fence when that is longer, so that at least two renewals
    /// come before it would run out. 0 with no second line.
    pub second_line_refresh_secs: u32,
}

/// The shortest address lifetime of the second line ([`with_second_line`]): 300 s (5 min).
/// A VIP's address then costs the kernel one lifetime refresh per 240 s (refreshed at
/// [`SECOND_LINE_REFRESH_SECS`] left) instead of one per renewal (every retry period); a
/// node holding more than 600 VIPs gives a longer line ([`second_line_len`]). Every IPv6
/// address add or refresh on an interface walks all of its multicast groups, one
/// solicited-node group per VIP, restarting MLD for each (`ipv6_find_idev` ->
/// `ipv6_mc_up`), and every add, refresh or delete the node's addresses, under the rtnl
/// lock (`cargo xtask bench addrs`: a refresh 0.6 ms with 4 000 present, 1.2-1.8 ms with
/// 8 000), so per renewal that was seconds of kernel time per second at thousands of VIPs
/// per node, and a 30 s second line (refreshed every 15 s) was still the largest kernel cost
/// of an idle node with 1 000 IPv6 VIPs (issue 28's profile, docs/services-bench.md). The
/// price: a killed vipd that is not restarted leaves its Service VIP addresses on the
/// interface, inert, for up to the line's length, and an address whose nftables tables were
/// removed by someone else while vipd was killed or frozen answers for up to that long
/// instead of the whole-second fence (docs/design.md, "The second line").
pub const SECOND_LINE_SECS: u32 = 300;

/// How much second line a node gives per VIP address it holds, milliseconds: 500 (half a
/// second), so that the line's refreshes cost the kernel about the same share of a core
/// whatever the node holds. A refresh costs the kernel time in proportion to the addresses
/// present (above), so refreshing N addresses once per line costs N² per line: at 3 700
/// IPv6 VIPs a node, 2.2 ms a refresh in the 10 000-Service bench, 300 s lines were 5.5 % of
/// a core; 1 850 s lines are about 0.5 % (docs/services-bench.md, issue 28).
pub const SECOND_LINE_MS_PER_VIP: u64 = 500;

/// The longest second line, seconds: 3 600 (one hour), reached at 7 200 VIPs a node.
pub const SECOND_LINE_MAX_SECS: u32 = 3_600;

/// A second-line address is refreshed once the kernel reports at most this many seconds
/// left: 60 (with lease timings whose whole-second fence is longer than 30 s, twice the
/// fence: [`FencePlan::second_line_refresh_secs`]). Renewals come every retry period, so a
/// minute leaves dozens of them to refresh it in; refreshing at half the line, as until
/// 2026-12-06, cost 1.6 times the refreshes for the same line.
pub const SECOND_LINE_REFRESH_SECS: u32 = 60;

/// The second line's length, seconds, for a node holding `held` VIP addresses (vipd's, on
/// every interface, as the manager counts them every 2 s): `held` × [`SECOND_LINE_MS_PER_VIP`],
/// at least `plan`'s [`FencePlan::second_line_secs`] ([`SECOND_LINE_SECS`]) and at most
/// [`SECOND_LINE_MAX_SECS`] (or the plan's when longer); 0 when the plan has no second line.
/// 300 s up to 600 VIPs, 1 850 s at 3 700. Pure.
pub fn second_line_len(plan: &FencePlan, held: usize) -> u32 {
    if plan.second_line_secs == 0 {
        return 0;
    }
    let per_vip_ms = u64::try_from(held)
        .unwrap_or(u64::MAX)
        .saturating_mul(SECOND_LINE_MS_PER_VIP);
    let scaled = u32::try_from(per_vip_ms / 1000).unwrap_or(u32::MAX);
    scaled.clamp(
        plan.second_line_secs,
        SECOND_LINE_MAX_SECS.max(plan.second_line_secs),
    )
}

/// `plan` with the second line ([`FencePlan::second_line_secs`] = [`SECOND_LINE_SECS`],
/// refreshed at [`FencePlan::second_line_refresh_secs`] left) where it saves refreshes: only
/// when the address lifetime fences (`address_fences`; the millisecond fence's addresses
/// already outlive the lease) and only when the line, less its refresh point, is longer
/// than the whole-second fence (lease timings of minutes refresh rarely anyway). The caller
/// decides that the nftables fence is active: the second line is safe only where an element
/// fences the VIP. Pure.
pub fn with_second_line(plan: FencePlan) -> FencePlan {
    let refresh = SECOND_LINE_REFRESH_SECS.max(plan.address_secs.saturating_mul(2));
    let useful =
        plan.address_fences && SECOND_LINE_SECS.saturating_sub(refresh) > plan.address_secs;
    FencePlan {
        second_line_secs: if useful { SECOND_LINE_SECS } else { 0 },
        second_line_refresh_secs: if useful { refresh } else { 0 },
        ..plan
    }
}

/// Whether an address of `plan`'s second line that the kernel reports with `valid_lft_secs`
/// left (whole seconds; `None`: forever) needs no refresh yet: more than
/// [`FencePlan::second_line_refresh_secs`] is left. Never with no second line (then every
/// renewal refreshes: the lifetime is the fence). Pure.
pub fn second_line_fresh(plan: &FencePlan, valid_lft_secs: Option<u32>) -> bool {
    plan.second_line_secs > 0
        && valid_lft_secs.is_some_and(|left| left > plan.second_line_refresh_secs)
}

/// The fence for these lease timings. When [`fence_lifetime`] finds a whole number of
/// seconds, the address lifetime fences (and the nftables fence, when on, ends at the same
/// time). Otherwise (sub-second timings such as the `fast` profile) the nftables fence must
/// be on (`nft`): its elements last `min(renew deadline, lease duration -
/// NFT_FENCE_MARGIN)`, which must be longer than the retry period, and the addresses get
/// the lease duration rounded up to whole seconds.
///
/// # Errors
/// [`TimingError::NoRoom`] when no whole-second fence fits and `nft` is false;
/// [`TimingError::NoRoomMs`] when the millisecond fence would not outlast a retry period.
pub fn fence_plan(t: &Timing, nft: bool) -> Result<FencePlan, TimingError> {
    match fence_lifetime(t) {
        Ok(secs) => Ok(FencePlan {
            address_secs: secs,
            address_fences: true,
            nft: Duration::from_secs(u64::from(secs)),
            margin: FENCE_MARGIN,
            second_line_secs: 0,
            second_line_refresh_secs: 0,
        }),
        Err(e) if !nft => Err(e),
        Err(_) => {
            let fence = t
                .renew_deadline
                .min(t.lease_duration.saturating_sub(NFT_FENCE_MARGIN));
            if fence <= t.retry_period {
                return Err(TimingError::NoRoomMs {
                    fence_ms: fence.as_millis(),
                    retry_ms: t.retry_period.as_millis(),
                });
            }
            let secs = t.lease_duration.as_millis().div_ceil(1000).max(1);
            Ok(FencePlan {
                address_secs: u32::try_from(secs).unwrap_or(u32::MAX),
                address_fences: false,
                nft: fence,
                margin: NFT_FENCE_MARGIN,
                second_line_secs: 0,
                second_line_refresh_secs: 0,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(l: u64, r: u64, p: u64) -> Timing {
        Timing {
            lease_duration: Duration::from_secs(l),
            renew_deadline: Duration::from_secs(r),
            retry_period: Duration::from_secs(p),
        }
    }

    /// The second line is given where the address fences and the line less its refresh
    /// point is longer than the whole-second fence; never to the millisecond fence's plan,
    /// nor to long leases.
    #[test]
    fn the_second_line_is_given_only_where_it_saves_refreshes() {
        let plan = fence_plan(&t(3, 2, 1), true).unwrap();
        assert_eq!(plan.second_line_secs, 0, "fence_plan alone never gives one");
        let second = with_second_line(plan);
        assert_eq!(second.second_line_secs, SECOND_LINE_SECS);
        assert_eq!(
            (
                second.address_secs,
                second.address_fences,
                second.nft,
                second.margin
            ),
            (plan.address_secs, true, plan.nft, FENCE_MARGIN),
            "the fence itself is unchanged"
        );
        // kube-vip's defaults (15/10/2): the fence is 9 s, refreshed at 60 s left of 300.
        assert_eq!(
            with_second_line(fence_plan(&t(15, 10, 2), true).unwrap()).second_line_secs,
            SECOND_LINE_SECS
        );
        // A fence of minutes: nothing to save.
        let long = fence_plan(&t(600, 400, 100), true).unwrap();
        assert!(long.address_secs >= SECOND_LINE_SECS / 2, "{long:?}");
        assert_eq!(with_second_line(long).second_line_secs, 0);
        // The millisecond fence (sub-second timings) keeps its own address lifetime.
        let fast = Timing {
            lease_duration: Duration::from_millis(600),
            renew_deadline: Duration::from_millis(400),
            retry_period: Duration::from_millis(200),
        };
        assert_eq!(
            with_second_line(fence_plan(&fast, true).unwrap()).second_line_secs,
            0
        );
    }

    /// An address is left alone while more than the refresh point (60 s) is left; the
    /// boundary, an address the kernel keeps forever and a plan without a second line.
    #[test]
    fn a_second_line_address_is_refreshed_at_a_minute_left() {
        let second = with_second_line(fence_plan(&t(3, 2, 1), true).unwrap());
        assert_eq!(second.second_line_refresh_secs, SECOND_LINE_REFRESH_SECS);
        assert!(second_line_fresh(&second, Some(SECOND_LINE_SECS)));
        assert!(second_line_fresh(
            &second,
            Some(SECOND_LINE_REFRESH_SECS + 1)
        ));
        assert!(!second_line_fresh(&second, Some(SECOND_LINE_REFRESH_SECS)));
        assert!(!second_line_fresh(&second, Some(2)));
        assert!(
            !second_line_fresh(&second, None),
            "forever is not ours to keep"
        );
        let plain = fence_plan(&t(3, 2, 1), true).unwrap();
        assert!(
            !second_line_fresh(&plain, Some(SECOND_LINE_SECS)),
            "no second line: every renewal refreshes"
        );
    }

    /// A whole-second fence longer than 30 s moves the refresh point to twice the fence, so
    /// that two renewals come before an address could run out; a fence too long for the
    /// line to save anything gets none.
    #[test]
    fn a_long_fence_refreshes_earlier_or_gets_no_second_line() {
        for (timing, fence) in [(t(40, 30, 10), 40), (t(90, 60, 20), 90)] {
            let plan = fence_plan(&timing, true).unwrap();
            assert!(plan.address_secs <= fence, "{plan:?}");
            let second = with_second_line(plan);
            assert_eq!(second.second_line_secs, SECOND_LINE_SECS, "{plan:?}");
            assert_eq!(
                second.second_line_refresh_secs,
                SECOND_LINE_REFRESH_SECS.max(2 * plan.address_secs)
            );
            assert!(
                SECOND_LINE_SECS - second.second_line_refresh_secs > plan.address_secs,
                "refreshing less often than every fence: {second:?}"
            );
            assert!(!second_line_fresh(&second, Some(2 * plan.address_secs)));
        }
        let long = fence_plan(&t(200, 150, 50), true).unwrap();
        assert!(
            SECOND_LINE_SECS.saturating_sub(2 * long.address_secs) <= long.address_secs,
            "{long:?}"
        );
        let none = with_second_line(long);
        assert_eq!(
            (none.second_line_secs, none.second_line_refresh_secs),
            (0, 0)
        );
    }

    /// The line is 300 s up to 600 VIPs a node, half a second per VIP above, one hour at
    /// most; nothing without a second line.
    #[test]
    fn the_second_line_grows_with_the_vips_the_node_holds() {
        let second = with_second_line(fence_plan(&t(3, 2, 1), true).unwrap());
        assert_eq!(second_line_len(&second, 0), SECOND_LINE_SECS);
        assert_eq!(second_line_len(&second, 600), SECOND_LINE_SECS);
        assert_eq!(second_line_len(&second, 601), SECOND_LINE_SECS);
        assert_eq!(second_line_len(&second, 602), 301);
        assert_eq!(second_line_len(&second, 3_700), 1_850);
        assert_eq!(second_line_len(&second, 7_200), SECOND_LINE_MAX_SECS);
        assert_eq!(second_line_len(&second, usize::MAX), SECOND_LINE_MAX_SECS);
        let plain = fence_plan(&t(3, 2, 1), true).unwrap();
        assert_eq!(second_line_len(&plain, 3_700), 0);
    }
}
