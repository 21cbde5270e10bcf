//! VIP holder tests against other responders of its addresses: conflict probing and claims
//! (RFC 5227), and the ARP flux pins placed around the addresses.

use super::*;

const OTHER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xbb];

/// A rig probing for `vip4()` on eth0, started and then told it leads term 1 (`clean`: after
/// a clean release, so without probing).
async fn probing_leader(clean: bool) -> (Rig, FakeConflictMonitor, watch::Receiver<Conflicts>) {
    let (r, monitor, conflicts) = rig_probing(FakeKernel::with_eth0(), vec![vip4()]);
    settle().await;
    lead(&r, 1, clean);
    settle().await;
    (r, monitor, conflicts)
}

#[tokio::test(start_paused = true)]
async fn lease_taken_after_expiry_probes_first_and_binds_after_a_quiet_window() {
    let (r, monitor, conflicts) = probing_leader(false).await;
    assert!(!r.kernel.has(vip4()), "not bound while probing");
    assert!(
        r.bound.borrow().is_empty(),
        "not reported held while probing"
    );
    assert_eq!(r.ann.count(vip4()), 0, "no announcement while probing");
    assert_eq!(monitor.probes(), vec![(2, vip4().addr)]);
    assert_eq!(monitor.watches(), 1);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(monitor.probes().len(), 2, "two probes per window");
    assert!(r.kernel.has(vip4()), "bound after the window");
    assert_eq!(
        *r.bound.borrow(),
        vec![vip4().addr],
        "reported held once bound"
    );
    assert_eq!(r.ann.count(vip4()), 1, "announced once bound");
    assert!(conflicts.borrow().is_empty());
    // Renewals keep it and do not probe again.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, false);
        settle().await;
    }
    assert_eq!(monitor.probes().len(), 2);
    assert!(r.kernel.has(vip4()));
}

#[tokio::test(start_paused = true)]
async fn cleanly_released_lease_binds_without_probing_but_still_watches() {
    let (r, monitor, _) = probing_leader(true).await;
    assert!(r.kernel.has(vip4()));
    assert!(monitor.probes().is_empty());
    assert_eq!(monitor.watches(), 1, "a bound VIP is watched for conflicts");
}

#[tokio::test(start_paused = true)]
async fn address_answered_by_another_host_is_never_bound_and_taken_once_free() {
    let (r, monitor, mut conflicts) = rig_probing(FakeKernel::with_eth0(), vec![vip4()]);
    monitor.answer_probes(vip4().addr, OTHER_MAC);
    settle().await;
    lead(&r, 1, false);
    // Keep renewing for 5 s: the address stays refused, probed again with back-off.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, false);
        settle().await;
        assert!(!r.kernel.has(vip4()), "a claimed address is never bound");
        assert!(r.bound.borrow().is_empty(), "nor reported held");
    }
    assert_eq!(r.ann.count(vip4()), 0);
    assert_eq!(
        *conflicts.borrow_and_update(),
        vec![(vip4().addr, OTHER_MAC)]
    );
    let probes = monitor.probes().len();
    assert!(
        (2..=6).contains(&probes),
        "re-probed with back-off (1 s, 2 s, ...), not continuously: {probes}"
    );
    // The other host goes away: the next re-probe window is quiet and the VIP is bound.
    monitor.stop_answering();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, false);
        settle().await;
    }
    assert!(r.kernel.has(vip4()));
    assert!(r.ann.count(vip4()) >= 1);
    assert!(conflicts.borrow().is_empty(), "conflict cleared once bound");
}

#[tokio::test(start_paused = true)]
async fn claim_while_bound_removes_the_vip_and_stops_announcing() {
    let (r, monitor, conflicts) = probing_leader(true).await;
    assert!(r.kernel.has(vip4()));
    // A probe from another host for our address is defended, not yielded to.
    monitor.claim(Claim {
        addr: vip4().addr,
        mac: OTHER_MAC,
        probing: true,
    });
    settle().await;
    assert!(r.kernel.has(vip4()));
    // Another host announcing it: removed at once.
    assert_eq!(
        monitor.claim(Claim {
            addr: vip4().addr,
            mac: OTHER_MAC,
            probing: false,
        }),
        1
    );
    settle().await;
    assert!(!r.kernel.has(vip4()), "removed on a conflict");
    assert_eq!(*conflicts.borrow(), vec![(vip4().addr, OTHER_MAC)]);
    let before = r.ann.count(vip4());
    monitor.answer_probes(vip4().addr, OTHER_MAC);
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
        assert!(
            !r.kernel.has(vip4()),
            "renewals do not re-add a refused VIP"
        );
    }
    assert_eq!(
        r.ann.count(vip4()),
        before,
        "no announcement of a refused VIP"
    );
}

#[tokio::test(start_paused = true)]
async fn losing_the_lease_ends_watches_and_clears_conflicts() {
    let (mut r, monitor, conflicts) = rig_probing(FakeKernel::with_eth0(), vec![vip4()]);
    monitor.answer_probes(vip4().addr, OTHER_MAC);
    settle().await;
    lead(&r, 1, false);
    settle().await;
    assert_eq!(conflicts.borrow().len(), 1);
    r.state
        .send_replace(LeaderState::Following { holder: None });
    r.dropped.wait_for(|t| *t >= 1).await.unwrap();
    assert_eq!(monitor.watches(), 0);
    assert!(conflicts.borrow().is_empty());
    let probes = monitor.probes().len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        monitor.probes().len(),
        probes,
        "no probing while not leading"
    );
}

/// Records pins with whether the kernel had the VIP at that moment.
struct RecordingGuard {
    kernel: Arc<FakeKernel>,
    events: Mutex<Vec<(String, bool)>>,
}

impl RecordingGuard {
    fn record(&self, what: &str, vip: std::net::Ipv4Addr, ifname: &str) {
        let present = self.kernel.has(Vip::host(IpAddr::V4(vip)));
        self.events
            .lock()
            .unwrap()
            .push((format!("{what} {vip} {ifname}"), present));
    }
    fn events(&self) -> Vec<(String, bool)> {
        self.events.lock().unwrap().clone()
    }
}

impl std::fmt::Debug for RecordingGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordingGuard")
    }
}

impl crate::net::ArpGuard for RecordingGuard {
    fn pin<'a>(
        &'a self,
        vip: std::net::Ipv4Addr,
        ifname: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::net::ArpGuardError>> {
        self.record("pin", vip, ifname);
        Box::pin(async { Ok(()) })
    }
    fn unpin<'a>(
        &'a self,
        vip: std::net::Ipv4Addr,
        ifname: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::net::ArpGuardError>> {
        self.record("unpin", vip, ifname);
        Box::pin(async { Ok(()) })
    }
    fn active(&self) -> bool {
        true
    }
    fn close(&self) -> futures::future::BoxFuture<'_, Result<(), crate::net::ArpGuardError>> {
        Box::pin(async { Ok(()) })
    }
}

/// S36: IPv4 VIPs are pinned to their interface before the address is added, unpinned
/// after it is removed (VIP set edited, holder shut down); IPv6 VIPs are never pinned.
#[tokio::test(start_paused = true)]
async fn arp_pins_come_before_the_address_and_go_after_it() {
    let kernel = FakeKernel::with_eth0();
    let guard = Arc::new(RecordingGuard {
        kernel: kernel.clone(),
        events: Mutex::new(Vec::new()),
    });
    let v120 = Vip::host("192.0.2.120".parse().unwrap());
    let v121 = Vip::host("192.0.2.121".parse().unwrap());
    let v6 = Vip::host("2001:db8::120".parse().unwrap());
    let spec = |v: Vip| VipSpec {
        vip: v,
        interface: Some("eth0".into()),
        not_after: None,
    };
    let (set_tx, set_rx) = watch::channel(vec![spec(v120), spec(v6)]);
    let cfg = HolderConfig {
        arp_guard: guard.clone(),
        ..HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap()
    };
    let (r, _) = rig_from(kernel.clone(), vec![], cfg, false, Some(set_rx));
    settle().await;
    let pin120 = ("pin 192.0.2.120 eth0".to_string(), false);
    assert_eq!(
        guard.events(),
        vec![pin120.clone()],
        "pinned while following"
    );
    lead(&r, 1, true);
    settle().await;
    assert!(kernel.has(v120));
    assert_eq!(guard.events().len(), 1, "no second pin on acquire");
    set_tx.send_replace(vec![spec(v121)]);
    settle().await;
    assert!(kernel.has(v121) && !kernel.has(v120));
    assert_eq!(
        guard.events(),
        vec![
            pin120.clone(),
            ("pin 192.0.2.121 eth0".to_string(), false),
            ("unpin 192.0.2.120 eth0".to_string(), false),
        ]
    );
    r.shutdown.cancel();
    r.task.await.unwrap();
    assert_eq!(
        guard.events().last(),
        Some(&("unpin 192.0.2.121 eth0".to_string(), false)),
        "unpinned after the address is gone"
    );
    assert_eq!(guard.events().len(), 4);
}
