//! The holder and the nftables fence (issue 16, `vip_nftfence`): element timeouts from the
//! renewal's send time, on tokio's paused clock with a fake fence.

use std::net::IpAddr;
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::*;
use crate::net::nft::fence::{FenceError, VipFence};

/// One call the holder made on the fence, with the instant the "kernel" took it.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Refresh(Vec<IpAddr>, Duration),
    Expire(Vec<IpAddr>),
    Disarm(Vec<IpAddr>),
}

#[derive(Debug, Default)]
struct FakeFence {
    calls: Mutex<Vec<(Instant, Call)>>,
    /// The next refresh reaches the kernel this long after it was asked for.
    stall_next: Mutex<Option<Duration>>,
}

impl FakeFence {
    fn calls(&self) -> Vec<(Instant, Call)> {
        self.calls.lock().unwrap().clone()
    }
    /// When the VIP's live element ends, replaying the calls (`None`: not live).
    fn live_until(&self, vip: IpAddr) -> Option<Instant> {
        let mut until = None;
        for (at, c) in self.calls() {
            match c {
                Call::Refresh(v, t) if v.contains(&vip) => until = Some(at + t),
                Call::Expire(v) | Call::Disarm(v) if v.contains(&vip) => until = None,
                _ => {}
            }
        }
        until
    }
}

impl VipFence for FakeFence {
    fn refresh<'a>(
        &'a self,
        vips: &'a [IpAddr],
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            let stall = self.stall_next.lock().unwrap().take();
            if let Some(d) = stall {
                tokio::time::sleep(d).await;
            }
            self.calls
                .lock()
                .unwrap()
                .push((Instant::now(), Call::Refresh(vips.to_vec(), timeout)));
            Ok(())
        })
    }
    fn expire<'a>(&'a self, vips: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            self.calls
                .lock()
                .unwrap()
                .push((Instant::now(), Call::Expire(vips.to_vec())));
            Ok(())
        })
    }
    fn disarm<'a>(&'a self, vips: &'a [IpAddr]) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            self.calls
                .lock()
                .unwrap()
                .push((Instant::now(), Call::Disarm(vips.to_vec())));
            Ok(())
        })
    }
    fn active(&self) -> bool {
        true
    }
    fn close(&self) -> BoxFuture<'_, Result<(), FenceError>> {
        Box::pin(async { Ok(()) })
    }
}

const FENCE: Duration = Duration::from_secs(2);

fn fenced_rig(fence: Arc<FakeFence>) -> Rig {
    fenced_rig_at(fence, &TIMING)
}

fn fenced_rig_at(fence: Arc<FakeFence>, timing: &Timing) -> Rig {
    let mut cfg = HolderConfig::from_timing(timing, Duration::from_millis(3000)).unwrap();
    cfg.nft_fence = fence;
    let spec = VipSpec {
        vip: vip4(),
        interface: Some("eth0".into()),
        not_after: None,
    };
    rig_from(FakeKernel::with_eth0(), vec![spec], cfg, false, None).0
}

/// The element ends at the renewal's send time + fence, to the millisecond, whenever it is
/// asked; never past send + lease - margin; zero once that end has passed.
#[tokio::test(start_paused = true)]
async fn fence_timeout_counts_from_the_send_time() {
    let sent = Instant::now();
    let lease = TIMING.lease_duration;
    let ms = Duration::from_millis;
    let at = |t: Instant| t.saturating_duration_since(sent);
    assert_eq!(fence_timeout(FENCE, lease, at(Instant::now())), ms(2000));
    tokio::time::advance(ms(37)).await;
    assert_eq!(fence_timeout(FENCE, lease, at(Instant::now())), ms(1963));
    // A stale renewal (acted on long after it was sent) never reaches past
    // send + lease - margin, and not past send + fence either.
    for age_ms in (0..6000).step_by(7) {
        let t = fence_timeout(FENCE, lease, ms(age_ms));
        assert!(
            t.is_zero() || ms(age_ms) + t <= lease - FENCE_MARGIN,
            "age {age_ms} ms: {t:?}"
        );
        assert!(
            t.is_zero() || ms(age_ms) + t == FENCE,
            "age {age_ms} ms: {t:?}"
        );
    }
    // A fence longer than the lease allows is cut to lease - margin.
    assert_eq!(
        fence_timeout(Duration::from_secs(9), lease, ms(0)),
        lease - FENCE_MARGIN
    );
    // Frozen between the renewal and the nft call, past the fence: already expired.
    tokio::time::advance(ms(1963)).await;
    assert_eq!(
        fence_timeout(FENCE, lease, at(Instant::now())),
        Duration::ZERO
    );
    // Sub-millisecond rest rounds down: never more than granted.
    assert_eq!(
        fence_timeout(FENCE, lease, Duration::from_micros(1_999_001)),
        Duration::ZERO
    );
}

#[test]
fn an_element_taken_late_overruns_the_lease() {
    let lease = TIMING.lease_duration;
    let ms = Duration::from_millis;
    assert!(!fence_overrun(lease, ms(2000), ms(5)));
    assert!(!fence_overrun(
        lease,
        ms(2000),
        lease - FENCE_MARGIN - ms(2000)
    ));
    assert!(fence_overrun(
        lease,
        ms(2000),
        lease - FENCE_MARGIN - ms(1999)
    ));
}

/// Every renewal refreshes the element so that it ends at that renewal's send time + fence.
#[tokio::test(start_paused = true)]
async fn each_renewal_refreshes_the_element_from_its_send_time() {
    let fence = Arc::new(FakeFence::default());
    let r = fenced_rig(fence.clone());
    settle().await;
    let vip: IpAddr = vip4().addr;
    for _ in 0..3 {
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(40)).await; // the API server's answer
        r.state.send_replace(LeaderState::Leading {
            term: 1,
            renewed_at: sent,
            clean: true,
        });
        settle().await;
        assert_eq!(fence.live_until(vip), Some(sent + FENCE));
        assert!(
            r.kernel.has(vip4()),
            "the address lifetime stays the second line"
        );
        tokio::time::advance(Duration::from_millis(960)).await;
    }
    assert!(
        matches!(fence.calls()[0].1, Call::Refresh(ref v, t) if v == &[vip] && t == Duration::from_millis(1960))
    );
}

/// A freeze while the element is being set (the kernel takes the timeout 3 s late, lease
/// 5 s, fence 2 s): the element would end 5 s after the send, past the lease others see;
/// nothing is left to grant, so it is expired at once.
#[tokio::test(start_paused = true)]
async fn a_freeze_during_the_nft_call_expires_the_element() {
    let fence = Arc::new(FakeFence::default());
    let r = fenced_rig(fence.clone());
    settle().await;
    lead(&r, 1, true);
    settle().await;
    let vip: IpAddr = vip4().addr;
    *fence.stall_next.lock().unwrap() = Some(Duration::from_secs(3));
    lead(&r, 1, true);
    tokio::time::sleep(Duration::from_millis(3010)).await;
    let calls = fence.calls();
    assert!(
        matches!(calls.last(), Some((_, Call::Expire(v))) if v == &[vip]),
        "{calls:?}"
    );
    assert_eq!(fence.live_until(vip), None);
}

/// A fence that reaches into the margin (lease 2.2 s, fence 2 s: cut to 1.95 s) and a
/// short stall: the element taken 0.5 s late is set again with what is left of
/// send + lease - margin.
#[tokio::test(start_paused = true)]
async fn a_short_stall_sets_the_element_again_shorter() {
    let fence = Arc::new(FakeFence::default());
    let timing = Timing {
        lease_duration: Duration::from_millis(2200),
        renew_deadline: Duration::from_millis(2100),
        retry_period: Duration::from_millis(1000),
    };
    let r = fenced_rig_at(fence.clone(), &timing);
    settle().await;
    let vip: IpAddr = vip4().addr;
    *fence.stall_next.lock().unwrap() = Some(Duration::from_millis(500));
    let sent = Instant::now();
    lead(&r, 1, true);
    tokio::time::sleep(Duration::from_millis(510)).await;
    let refreshes: Vec<Duration> = fence
        .calls()
        .into_iter()
        .filter_map(|(_, c)| match c {
            Call::Refresh(_, t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(
        refreshes,
        vec![Duration::from_millis(1950), Duration::from_millis(1450)]
    );
    assert_eq!(
        fence.live_until(vip),
        Some(sent + timing.lease_duration - FENCE_MARGIN)
    );
}

/// Losing the lease: the VIP's address goes first, then it is disarmed (no longer
/// filtered); the same at shutdown.
#[tokio::test(start_paused = true)]
async fn step_down_disarms_after_the_address_is_gone() {
    let fence = Arc::new(FakeFence::default());
    let mut r = fenced_rig(fence.clone());
    settle().await;
    lead(&r, 1, true);
    settle().await;
    let vip: IpAddr = vip4().addr;
    assert!(fence.live_until(vip).is_some());
    r.state.send_replace(LeaderState::Following {
        holder: Some("b".into()),
    });
    r.dropped.wait_for(|t| *t >= 1).await.unwrap();
    assert!(!r.kernel.has(vip4()));
    assert!(matches!(fence.calls().last(), Some((_, Call::Disarm(v))) if v == &[vip]));
    let n = fence.calls().len();
    r.shutdown.cancel();
    r.task.await.unwrap();
    assert_eq!(fence.calls().len(), n, "nothing left to disarm");
}
