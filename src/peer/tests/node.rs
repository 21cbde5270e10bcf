//! The manager side of the peer protocol: the ride grant as the VIP holder sees it.

use std::time::Duration;

use tokio::time::Instant;

use crate::holder::{FENCE_MARGIN, fence_grant, fence_lapsed};
use crate::peer::node::ride_renewed_at;

const LEASE: Duration = Duration::from_secs(5);
const FENCE_SECS: u32 = 2;

/// A ride grant `until` published as `renewed_at`: at every instant the holder gives a
/// lifetime that ends no later than `until`, and from `until` on it holds nothing.
#[tokio::test(start_paused = true)]
async fn ride_grant_bounds_every_lifetime_the_holder_gives() {
    let e = Instant::now();
    let until = e + Duration::from_secs(2);
    let r = ride_renewed_at(until, LEASE).expect("renewed_at");
    assert_eq!(r + LEASE - FENCE_MARGIN, until);
    let mut t = e;
    let mut granted_any = false;
    while t < until + Duration::from_millis(500) {
        let age = t.saturating_duration_since(r);
        let grant = fence_grant(FENCE_SECS, LEASE, age);
        let lapsed = fence_lapsed(LEASE, age);
        if t >= until {
            assert!(
                lapsed,
                "the holder must hold nothing at or after until ({t:?})"
            );
        } else {
            assert!(!lapsed, "before until the grant stands ({t:?})");
        }
        assert!(
            grant == 0 || t + Duration::from_secs(u64::from(grant)) <= until,
            "a lifetime of {grant} s given at {:?} outlives the grant",
            t - e
        );
        granted_any |= grant > 0;
        t += Duration::from_millis(10);
    }
    assert!(granted_any, "a fresh grant gives at least one second");
    // Right after the evaluation the holder gives one whole second (a 2 s grant less the
    // time since), refreshed at every heartbeat.
    assert_eq!(
        fence_grant(FENCE_SECS, LEASE, (e + Duration::from_millis(1)) - r),
        1
    );
}
