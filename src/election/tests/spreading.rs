//! Spread without preemption ([`crate::election::spread`]) with real electors on the fake
//! server.

use super::*;
use crate::election::spread::Spread;

/// A released lease goes to the candidate that holds fewer leases, whatever the order in
/// which the candidates started.
#[tokio::test(start_paused = true)]
async fn a_released_lease_goes_to_the_node_holding_fewer() {
    let server = FakeServer::new();
    let mut z = start(&server, "z", true);
    assert!(until_leading(&mut z, Duration::from_millis(10)).await);
    let busy = Spread::new();
    let idle = Spread::new();
    for _ in 0..5 {
        busy.acquired(Instant::now());
    }
    idle.acquired(Instant::now());
    let mut x = start_with(&server, "x", "x", true, Some(busy.clone()), None);
    let mut y = start_with(&server, "y", "y", true, Some(idle.clone()), None);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = Instant::now();
    z.shutdown.cancel();
    (&mut z.task).await.unwrap();
    assert!(until_leading(&mut y, Duration::from_millis(100)).await);
    let gap = Instant::now() - t0;
    assert!(
        gap >= Duration::from_millis(20) && gap < Duration::from_millis(100),
        "taken after the one-lease delay: {gap:?}"
    );
    assert!(
        !until_leading(&mut x, Duration::from_secs(2)).await,
        "no preemption"
    );
    assert_eq!((busy.held(), idle.held()), (5, 2));
    // The holder stepping down gives its count back.
    y.shutdown.cancel();
    (&mut y.task).await.unwrap();
    assert_eq!(idle.held(), 1);
    assert!(until_leading(&mut x, Duration::from_millis(200)).await);
}

/// 30 leases, 3 nodes, everything starting at once: each node ends with 10 (±1).
#[tokio::test(start_paused = true)]
async fn thirty_leases_spread_over_three_nodes_from_a_cold_start() {
    let spreads = [Spread::new(), Spread::new(), Spread::new()];
    let mut all = Vec::new();
    for _ in 0..30 {
        let server = FakeServer::new();
        for (i, sp) in spreads.iter().enumerate() {
            let who = format!("n{i}");
            all.push(start_with(
                &server,
                &who,
                &who,
                true,
                Some(sp.clone()),
                None,
            ));
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held: Vec<usize> = spreads.iter().map(|s| s.held()).collect();
    let leading = all.iter().filter(|n| n.state.borrow().is_leading()).count();
    assert_eq!(leading, 30, "every lease has a holder: {held:?}");
    assert_eq!(held.iter().sum::<usize>(), 30);
    assert!(
        held.iter().all(|&h| (9..=11).contains(&h)),
        "spread unevenly: {held:?}"
    );
    for n in &all {
        n.shutdown.cancel();
    }
}
