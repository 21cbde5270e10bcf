//! VIP holder tests with a fake kernel on tokio's paused clock.

use crate::lease::{FENCE_MARGIN, Timing, fence_grant, fence_lapsed, fence_lifetime};
use std::sync::Mutex;

use tokio::sync::watch;

use super::*;
use crate::election::LeaderState;
use crate::net::conflict::{Claim, FakeConflictMonitor};

mod conflicts;
mod nft_fence;

#[derive(Default)]
pub(crate) struct KState {
    links: Vec<LinkInfo>,
    pub(crate) addrs: Vec<AddrInfo>,
    /// (vip, valid_lft) of every add/refresh the kernel took.
    pub(crate) adds: Vec<(Vip, u32)>,
    /// The [`Lifetime`] of every add/refresh call, taken or not.
    pub(crate) lifetimes: Vec<Lifetime>,
    /// Make every remove fail (as netlink EBUSY did under load).
    fail_remove: bool,
    /// Address dumps miss every vipd address (as a dump made while other holders add
    /// addresses can).
    dumps_miss_ours: bool,
    /// The next add/refresh reaches the kernel layer this long after the holder asked for
    /// it (the process was frozen between computing the grant and the request).
    stall_next_add: Option<Duration>,
    /// Make the next address dump take this long (a freeze in the middle of a check).
    stall_next_dump: Option<Duration>,
    /// Every add/refresh takes this long (the kernel next to thousands of IPv6 addresses,
    /// under the rtnl lock with other holders).
    pub(crate) add_delay: Option<Duration>,
    /// Count valid lifetimes down as the kernel does: when each of vipd's addresses goes
    /// (from its last add or refresh), reported in dumps as whole seconds rounded up, and
    /// the address gone from then on. Off: vipd's addresses stay until removed.
    lifetimes_run: bool,
    /// When each of vipd's addresses expires (with `lifetimes_run`).
    expires: Vec<(Vip, Instant)>,
    /// The size of every [`Kernel::add_or_refresh_many`] call.
    pub(crate) batches: Vec<usize>,
    /// Whether each [`Kernel::add_or_refresh_many`] call was given the caller's reading
    /// of the addresses (`known`).
    pub(crate) batches_known: Vec<bool>,
    /// Calls of [`Kernel::link_by_name`].
    pub(crate) name_queries: usize,
    /// The size of every [`Kernel::remove_many`] call.
    pub(crate) remove_batches: Vec<usize>,
}

impl KState {
    /// As the kernel at `now`: vipd's addresses past their lifetime are gone, the others
    /// report what is left in whole seconds, rounded up (`valid_lft - floor(elapsed)`).
    fn run_lifetimes(&mut self, now: Instant) {
        let expires = self.expires.clone();
        let end = |a: &AddrInfo| expires.iter().find(|(v, _)| *v == a.vip).map(|(_, e)| *e);
        self.addrs
            .retain(|a| !a.ours || end(a).is_none_or(|e| e > now));
        for a in self.addrs.iter_mut().filter(|a| a.ours) {
            a.valid_lft_secs = end(a).map(|e| {
                let left = e.saturating_duration_since(now);
                u32::try_from(left.as_millis().div_ceil(1000)).unwrap_or(u32::MAX)
            });
        }
    }
}

/// A fake [`Kernel`] (also used by the Services' DHCP tests).
#[derive(Default)]
pub(crate) struct FakeKernel(pub(crate) Mutex<KState>);

impl FakeKernel {
    /// A kernel with `eth0` (index 2) carrying 192.0.2.11/24.
    pub(crate) fn with_eth0() -> Arc<Self> {
        let k = FakeKernel::default();
        {
            let mut s = k.0.lock().unwrap();
            s.links.push(LinkInfo {
                index: 2,
                name: "eth0".into(),
                mac: [2, 0, 0, 0, 0, 0x11],
                up: true,
                carrier: true,
            });
            s.addrs.push(AddrInfo::plain(
                2,
                Vip::new("192.0.2.11".parse().unwrap(), 24).unwrap(),
                false,
            ));
        }
        Arc::new(k)
    }
    /// Adds an Ethernet link `name` with `index` (e.g. a macvlan), up with carrier.
    pub(crate) fn add_link(&self, name: &str, index: u32, mac: [u8; 6]) {
        self.0.lock().unwrap().links.push(LinkInfo {
            index,
            name: name.into(),
            mac,
            up: true,
            carrier: true,
        });
    }
    /// The interface index vipd's copy of `vip` is on, if any.
    pub(crate) fn where_is(&self, vip: Vip) -> Option<u32> {
        self.0
            .lock()
            .unwrap()
            .addrs
            .iter()
            .find(|a| a.vip == vip && a.ours)
            .map(|a| a.ifindex)
    }
    pub(crate) fn has(&self, vip: Vip) -> bool {
        self.0
            .lock()
            .unwrap()
            .addrs
            .iter()
            .any(|a| a.vip == vip && a.ours)
    }
    fn delete(&self, vip: Vip) {
        self.0.lock().unwrap().addrs.retain(|a| a.vip != vip);
    }
    fn set_carrier(&self, on: bool) {
        self.0.lock().unwrap().links[0].carrier = on;
    }
    fn set_flags(&self, vip: Vip, tentative: bool, dad_failed: bool) {
        for a in self.0.lock().unwrap().addrs.iter_mut() {
            if a.vip == vip {
                a.tentative = tentative;
                a.dad_failed = dad_failed;
            }
        }
    }
}

impl Kernel for FakeKernel {
    async fn link_by_name(&self, name: &str) -> Result<LinkInfo, NetError> {
        let mut s = self.0.lock().unwrap();
        s.name_queries += 1;
        s.links
            .iter()
            .find(|l| l.name == name)
            .cloned()
            .ok_or(NetError::NoSuchLink { name: name.into() })
    }
    async fn link_by_index(&self, index: u32) -> Result<LinkInfo, NetError> {
        self.0
            .lock()
            .unwrap()
            .links
            .iter()
            .find(|l| l.index == index)
            .cloned()
            .ok_or(NetError::NoSuchIndex { index })
    }
    async fn add_or_refresh(
        &self,
        ifindex: u32,
        vip: Vip,
        lifetime: Lifetime,
        _skip_dad: bool,
    ) -> Result<u32, NetError> {
        let stall = self.0.lock().unwrap().stall_next_add.take();
        if let Some(d) = stall {
            tokio::time::sleep(d).await;
        }
        let delay = self.0.lock().unwrap().add_delay;
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let mut s = self.0.lock().unwrap();
        s.lifetimes.push(lifetime);
        // Like the real kernel layer: the seconds are computed when the request is made.
        let valid = lifetime.secs_at(Instant::now());
        if valid == 0 {
            return Ok(0);
        }
        if let Some(a) = s.addrs.iter().find(|a| a.vip.addr == vip.addr && !a.ours) {
            return Err(NetError::NotOurs {
                addr: vip.addr,
                ifindex: a.ifindex,
                ifname: "eth0".into(),
            });
        }
        s.adds.push((vip, valid));
        if !s.addrs.iter().any(|a| a.vip == vip && a.ifindex == ifindex) {
            s.addrs.push(AddrInfo::plain(ifindex, vip, true));
        }
        s.expires.retain(|(v, _)| *v != vip);
        let end = Instant::now() + Duration::from_secs(u64::from(valid));
        s.expires.push((vip, end));
        Ok(valid)
    }
    async fn add_or_refresh_many(
        &self,
        items: &[(u32, Vip, Lifetime)],
        skip_dad: bool,
        known: Option<&[AddrInfo]>,
    ) -> Vec<Result<u32, NetError>> {
        {
            let mut s = self.0.lock().unwrap();
            s.batches.push(items.len());
            s.batches_known.push(known.is_some());
        }
        let mut out = Vec::with_capacity(items.len());
        for (ifindex, vip, lifetime) in items {
            out.push(
                self.add_or_refresh(*ifindex, *vip, *lifetime, skip_dad)
                    .await,
            );
        }
        out
    }
    async fn remove_many(&self, items: &[(u32, Vip)]) -> Vec<Result<(), NetError>> {
        self.0.lock().unwrap().remove_batches.push(items.len());
        let mut out = Vec::with_capacity(items.len());
        for (ifindex, vip) in items {
            out.push(self.remove(*ifindex, *vip).await);
        }
        out
    }
    async fn remove(&self, ifindex: u32, vip: Vip) -> Result<(), NetError> {
        let mut s = self.0.lock().unwrap();
        if s.fail_remove {
            return Err(NetError::NoSuchIndex { index: ifindex });
        }
        if s.addrs
            .iter()
            .any(|a| a.vip == vip && a.ifindex == ifindex && !a.ours)
        {
            return Err(NetError::NotOurs {
                addr: vip.addr,
                ifindex,
                ifname: "eth0".into(),
            });
        }
        s.addrs.retain(|a| !(a.vip == vip && a.ifindex == ifindex));
        Ok(())
    }
    async fn addresses(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        let stall = self.0.lock().unwrap().stall_next_dump.take();
        if let Some(d) = stall {
            tokio::time::sleep(d).await;
        }
        let mut s = self.0.lock().unwrap();
        if s.lifetimes_run {
            s.run_lifetimes(Instant::now());
        }
        Ok(s.addrs
            .iter()
            .filter(|a| ifindex.is_none_or(|i| a.ifindex == i))
            .filter(|a| !(a.ours && s.dumps_miss_ours))
            .cloned()
            .collect())
    }
    async fn choose_interface(&self, _addr: IpAddr) -> Result<u32, NetError> {
        Ok(2)
    }
}

/// A fake [`Announcer`] recording (when, VIP, source MAC).
#[derive(Default)]
pub(crate) struct FakeAnnouncer(pub(crate) Mutex<Vec<(Instant, Vip, [u8; 6])>>);

impl FakeAnnouncer {
    fn count(&self, vip: Vip) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, v, _)| *v == vip)
            .count()
    }
}

impl Announcer for FakeAnnouncer {
    fn announce(&self, link: &LinkInfo, vip: Vip) -> Result<(), NetError> {
        self.0.lock().unwrap().push((Instant::now(), vip, link.mac));
        Ok(())
    }
}

const TIMING: Timing = Timing {
    lease_duration: Duration::from_secs(5),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_secs(1),
};

fn vip4() -> Vip {
    Vip::new("192.0.2.10".parse().unwrap(), 32).unwrap()
}

/// A running holder on a fake kernel and announcer (also used by the Services' DHCP
/// tests).
pub(crate) struct Rig {
    kernel: Arc<FakeKernel>,
    pub(crate) ann: Arc<FakeAnnouncer>,
    state: watch::Sender<LeaderState>,
    dropped: watch::Receiver<u64>,
    gates: Gates,
    pub(crate) shutdown: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<()>,
    /// What the holder reports as held (`with_bound_reports`).
    bound: watch::Receiver<Vec<std::net::IpAddr>>,
}

fn rig(kernel: Arc<FakeKernel>, vips: Vec<Vip>, interface: Option<&str>) -> Rig {
    rig_with(kernel, vips, interface, None).0
}

/// A rig whose holder probes for conflicts through a fake monitor (50 ms window), and
/// publishes its conflicts on the returned receiver.
fn rig_probing(
    kernel: Arc<FakeKernel>,
    vips: Vec<Vip>,
) -> (Rig, FakeConflictMonitor, watch::Receiver<Conflicts>) {
    let monitor = FakeConflictMonitor::new();
    let (rig, rx) = rig_with(kernel, vips, Some("eth0"), Some(monitor.clone()));
    (rig, monitor, rx.unwrap())
}

fn rig_with(
    kernel: Arc<FakeKernel>,
    vips: Vec<Vip>,
    interface: Option<&str>,
    monitor: Option<FakeConflictMonitor>,
) -> (Rig, Option<watch::Receiver<Conflicts>>) {
    let mut cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    let probing = monitor.is_some();
    if let Some(m) = monitor {
        cfg.conflict_monitor = Some(Arc::new(m));
    }
    let specs = vips
        .into_iter()
        .map(|vip| VipSpec {
            vip,
            interface: interface.map(str::to_string),
            not_after: None,
        })
        .collect();
    rig_from(kernel, specs, cfg, probing, None)
}

/// The holder behind every rig: `specs` at start, `cfg`, conflict reports when `probing`,
/// and VIP set updates from `updates` when given (as the Services runtime sends them).
pub(crate) fn rig_from(
    kernel: Arc<FakeKernel>,
    specs: Vec<VipSpec>,
    cfg: HolderConfig,
    probing: bool,
    updates: Option<watch::Receiver<Vec<VipSpec>>>,
) -> (Rig, Option<watch::Receiver<Conflicts>>) {
    let ann = Arc::new(FakeAnnouncer::default());
    let (state, state_rx) = watch::channel(LeaderState::Following { holder: None });
    let (dropped_tx, dropped) = watch::channel(0u64);
    let gates = Gates::default();
    let mut holder = VipHolder::new(
        "test",
        kernel.clone(),
        ann.clone(),
        specs,
        cfg,
        gates.clone(),
    );
    if let Some(rx) = updates {
        holder = holder.with_updates(rx);
    }
    let (bound_tx, bound) = watch::channel(Vec::new());
    holder = holder.with_bound_reports(bound_tx);
    let mut conflicts = None;
    if probing {
        let (tx, rx) = watch::channel(Vec::new());
        holder = holder.with_conflict_reports(tx);
        conflicts = Some(rx);
    }
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(holder.run(
        Leadership {
            state: state_rx,
            dropped: dropped_tx,
        },
        shutdown.clone(),
    ));
    (
        Rig {
            kernel,
            ann,
            state,
            dropped,
            gates,
            shutdown,
            task,
            bound,
        },
        conflicts,
    )
}

/// Tells the holder it leads term `term`, renewed now (`clean`: after a clean release).
pub(crate) fn lead(r: &Rig, term: u64, clean: bool) {
    r.state.send_replace(LeaderState::Leading {
        term,
        renewed_at: Instant::now(),
        clean,
    });
}

/// Tells the holder it leads term `term` by a renewal sent `age` ago: the clock advances by
/// `age` between the send and the holder hearing of it (the API server's answer, a freeze).
/// Returns the send instant.
pub(crate) async fn lead_sent_before(r: &Rig, term: u64, clean: bool, age: Duration) -> Instant {
    let sent = Instant::now();
    tokio::time::advance(age).await;
    r.state.send_replace(LeaderState::Leading {
        term,
        renewed_at: sent,
        clean,
    });
    sent
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// The fence granted from a renewal never reaches past its send time + lease duration -
/// margin, whatever the delay before the holder acts on it.
#[test]
fn fence_grant_never_outlives_the_lease_others_see() {
    let lease = Duration::from_secs(3);
    let ms = Duration::from_millis;
    assert_eq!(fence_grant(2, lease, ms(0)), 2);
    assert_eq!(fence_grant(2, lease, ms(700)), 2);
    assert_eq!(fence_grant(2, lease, ms(800)), 1);
    assert_eq!(fence_grant(2, lease, ms(1700)), 1);
    assert_eq!(fence_grant(2, lease, ms(1800)), 0);
    assert_eq!(fence_grant(2, lease, Duration::from_secs(6)), 0);
    for age_ms in (0..4000).step_by(10) {
        let g = fence_grant(2, lease, ms(age_ms));
        assert!(
            ms(age_ms) + Duration::from_secs(u64::from(g)) + FENCE_MARGIN <= lease || g == 0,
            "age {age_ms} ms: {g} s"
        );
    }
    // kube-vip's 5/3/1: the 2 s fence is granted in full for the first 2.75 s.
    assert_eq!(fence_grant(2, Duration::from_secs(5), ms(2700)), 2);
}

/// The end the holder hands the kernel layer ([`VipHolder::fence_for`]) gives, at every
/// moment the kernel may take it, exactly the whole-second grant [`fence_grant`] defines
/// (the rule the peer simulation and the docs reason with), and `fence_left` is it; a DHCP
/// not-after time cuts it further.
#[tokio::test(start_paused = true)]
async fn the_fence_end_gives_the_grant_of_the_moment_the_kernel_takes_it() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    let secs = cfg.fence.address_secs;
    let mut h = VipHolder::new(
        "test",
        FakeKernel::with_eth0(),
        Arc::new(FakeAnnouncer::default()),
        Vec::new(),
        cfg,
        Gates::default(),
    );
    let renewed = Instant::now();
    h.renewed_at = Some(renewed);
    for age_ms in (0..=5000).step_by(50) {
        let now = renewed + Duration::from_millis(age_ms);
        let age = Duration::from_millis(age_ms);
        let lapsed = fence_lapsed(TIMING.lease_duration, FENCE_MARGIN, age);
        let end = h.fence_for(None, secs, now, false);
        assert_eq!(end.is_none(), lapsed, "age {age_ms} ms");
        if let Some(end) = end {
            let grant = fence_grant(secs, TIMING.lease_duration, age);
            assert_eq!(end.secs_at(now), grant, "age {age_ms} ms");
            assert_eq!(h.fence_left(now), Some(grant), "age {age_ms} ms");
        }
    }
    let soon = renewed + Duration::from_millis(1500);
    let cut = h.fence_for(Some(soon), secs, renewed, false).unwrap();
    assert_eq!(cut.secs_at(renewed), 1, "1.5 s to the not-after time: 1 s");
}

/// The kernel counts a lifetime from when it handles the add, not from when vipd computed
/// it: a freeze in between must not leave the VIP alive past the lease others see (found by
/// the chaos soak, seed 711036458, twice: a holder continued after SIGSTOP answered next to
/// the new holder, the second time for the ~80 ms it took to notice and remove it). The
/// holder hands the kernel layer the end of the fence, not a number: taken after the lease
/// lapsed, nothing is added at all, and nothing is announced.
#[tokio::test(start_paused = true)]
async fn a_freeze_between_grant_and_kernel_adds_nothing() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    settle().await;
    lead(&r, 1, true);
    settle().await;
    assert!(r.kernel.has(vip4()));
    let garps = r.ann.count(vip4());
    let adds_before = r.kernel.0.lock().unwrap().adds.len();
    // The next renewal's refresh reaches the kernel layer 6 s late (lease 5 s).
    r.kernel.0.lock().unwrap().stall_next_add = Some(Duration::from_secs(6));
    let renewed = Instant::now();
    lead(&r, 1, true);
    tokio::time::sleep(Duration::from_millis(6010)).await;
    let (adds, last) = {
        let s = r.kernel.0.lock().unwrap();
        (s.adds[adds_before..].to_vec(), s.lifetimes.last().copied())
    };
    assert_eq!(
        last,
        Some(Lifetime::until(
            2,
            renewed + TIMING.lease_duration - FENCE_MARGIN
        )),
        "the kernel layer is given the end of the fence"
    );
    assert!(
        adds.is_empty(),
        "nothing taken after the lease lapsed: {adds:?}"
    );
    assert!(!r.kernel.has(vip4()), "and the VIP is gone");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !r.kernel.has(vip4()),
        "and is not re-added without a renewal"
    );
    assert_eq!(
        r.ann.count(vip4()),
        garps,
        "nothing announced after the lease lapsed"
    );
}

/// A check whose address dump stalls past the lease (a freeze in the middle of the check)
/// finds the VIP missing but adds nothing: the grant computed before the dump is stale.
/// Found by the chaos soak (seed 20261201, debug vipd): a node thawed after 14 s re-added
/// the control-plane VIP for 33 ms next to the new holder.
#[tokio::test(start_paused = true)]
async fn a_stalled_check_does_not_re_add_a_vip_after_the_lease_lapsed() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    settle().await;
    lead(&r, 1, true);
    settle().await;
    assert!(r.kernel.has(vip4()));
    let adds_before = r.kernel.0.lock().unwrap().adds.len();
    {
        let mut s = r.kernel.0.lock().unwrap();
        s.addrs.retain(|a| a.vip != vip4());
        s.stall_next_dump = Some(Duration::from_secs(6));
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let adds = r.kernel.0.lock().unwrap().adds.clone();
    assert_eq!(
        adds.len(),
        adds_before,
        "nothing added once the lease may have lapsed: {adds:?}"
    );
    assert!(!r.kernel.has(vip4()));
}

/// A shorter stall still inside the lease: the lifetime is cut to what the lease covers
/// when the kernel took it, and the VIP stays.
#[tokio::test(start_paused = true)]
async fn a_late_kernel_add_gets_a_shorter_lifetime() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    settle().await;
    lead(&r, 1, true);
    settle().await;
    r.kernel.0.lock().unwrap().stall_next_add = Some(Duration::from_secs(3));
    lead(&r, 1, true);
    tokio::time::sleep(Duration::from_millis(3010)).await;
    // Granted 2 s at once; taken at 3 s of a 5 s lease: 1 s is all that fits.
    let adds = r.kernel.0.lock().unwrap().adds.clone();
    assert_eq!(adds.last(), Some(&(vip4(), 1)), "{adds:?}");
    assert!(r.kernel.has(vip4()));
}

/// An elector that stops renewing without saying so (frozen, stalled): once the lease
/// others see may have expired, the holder's own check removes the VIP and announces
/// nothing more, even before a Following state arrives.
#[tokio::test(start_paused = true)]
async fn a_silent_elector_lapses_the_vip() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    assert!(r.kernel.has(vip4()));
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(r.kernel.has(vip4()), "still inside the lease");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !r.kernel.has(vip4()),
        "lapsed 5 s - margin after the renewal"
    );
    let lapse = t0 + TIMING.lease_duration - FENCE_MARGIN;
    let late: Vec<Instant> = r
        .ann
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _, _)| *t)
        .filter(|t| *t >= lapse)
        .collect();
    assert!(late.is_empty(), "announced after the lapse: {late:?}");
}

/// A leadership update sent before the process was frozen and acted on after it was
/// continued must not re-arm the fence (found by the chaos soak: a frozen holder answered
/// again for an address another node had taken over).
#[tokio::test(start_paused = true)]
async fn a_stale_renewal_does_not_re_arm_the_fence() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    settle().await;
    // Frozen for 5 s between sending the renewal and acting on it.
    lead_sent_before(&r, 1, true, Duration::from_secs(5)).await;
    settle().await;
    assert!(!r.kernel.has(vip4()), "no VIP from a renewal 5 s old");
    // A fresh renewal binds it again, with the full fence.
    lead(&r, 1, true);
    settle().await;
    assert!(r.kernel.has(vip4()));
    let lft = r.kernel.0.lock().unwrap().adds.last().map(|(_, l)| *l);
    assert_eq!(lft, Some(2));
}

#[test]
fn fence_is_below_renew_deadline_and_above_retry() {
    let t = |l: u64, r: u64, p: u64| Timing {
        lease_duration: Duration::from_millis(l),
        renew_deadline: Duration::from_millis(r),
        retry_period: Duration::from_millis(p),
    };
    assert_eq!(fence_lifetime(&t(5000, 3000, 1000)), Ok(2));
    assert_eq!(fence_lifetime(&t(3000, 2500, 1000)), Ok(2));
    // renew deadline 2 s would give 1 s = the retry period: lapses; 2 s is still < lease.
    assert_eq!(fence_lifetime(&t(3000, 2000, 1000)), Ok(2));
    assert_eq!(fence_lifetime(&t(15000, 10000, 2000)), Ok(9));
    assert!(fence_lifetime(&t(2000, 1500, 1000)).is_err());
}

#[test]
fn plan_adds_missing_and_repairs_dadfailed_while_leading() {
    let v = vip4();
    assert_eq!(
        address_steps(&[(v, 2)], &[], Some(2)),
        vec![Step::Add {
            vip: v,
            ifindex: 2,
            valid_lft_secs: 2
        }]
    );
    // Fence nearly used up: do not re-add, the next renew does.
    assert!(address_steps(&[(v, 2)], &[], Some(0)).is_empty());
    let mut failed = AddrInfo::plain(2, v, true);
    failed.dad_failed = true;
    assert_eq!(
        address_steps(&[(v, 2)], &[failed], Some(2)),
        vec![
            Step::Remove { vip: v, ifindex: 2 },
            Step::Add {
                vip: v,
                ifindex: 2,
                valid_lft_secs: 2
            }
        ]
    );
    // Present and fine: nothing.
    assert!(address_steps(&[(v, 2)], &[AddrInfo::plain(2, v, true)], Some(2)).is_empty());
    // Our copy on another interface is moved.
    assert_eq!(
        address_steps(&[(v, 2)], &[AddrInfo::plain(3, v, true)], Some(2)),
        vec![
            Step::Remove { vip: v, ifindex: 3 },
            Step::Add {
                vip: v,
                ifindex: 2,
                valid_lft_secs: 2
            }
        ]
    );
}

/// The index a check and a refresh look their VIPs up in: only vipd's copies of the wanted
/// addresses, every copy of an address (any interface, the dump's order), one per place,
/// and nothing for an address not wanted, not present or not vipd's.
#[test]
fn the_ours_index_finds_every_copy_of_each_wanted_vip_and_nothing_else() {
    use std::net::IpAddr;
    let v = |host: u8| Vip::new(IpAddr::from([192, 0, 2, host]), 32).unwrap();
    let v6 = Vip::new("2001:db8::7".parse().unwrap(), 128).unwrap();
    let present = vec![
        AddrInfo::plain(3, v(9), true),
        AddrInfo::plain(2, v(1), true),
        AddrInfo::plain(2, v6, true),
        AddrInfo::plain(2, v(9), true),
        AddrInfo::plain(2, v(5), false),
        AddrInfo::plain(4, v(9), true),
        AddrInfo::plain(2, v(7), true),
    ];
    let ours = crate::holder::OursIndex::new(
        &present,
        [v(9).addr, v(1).addr, v(5).addr, v6.addr, v(8).addr],
    );
    let places =
        |addr: IpAddr| -> Vec<u32> { ours.copies(addr).iter().map(|a| a.ifindex).collect() };
    assert_eq!(
        places(v(9).addr),
        [3, 2, 4],
        "every copy, in the dump's order"
    );
    assert_eq!(places(v(1).addr), [2]);
    assert_eq!(places(v6.addr), [2]);
    assert!(places(v(5).addr).is_empty(), "not vipd's");
    assert!(places(v(8).addr).is_empty(), "not present");
    assert!(places(v(7).addr).is_empty(), "not wanted");
    assert_eq!(ours.at(4, v(9).addr).map(|a| a.ifindex), Some(4));
    assert_eq!(ours.at(2, v6.addr).map(|a| a.vip), Some(v6));
    assert!(ours.at(5, v(9).addr).is_none());
    assert!(ours.at(2, v(5).addr).is_none());
}

/// A VIP in place whose lifetime the kernel ends within a second is refreshed with what the
/// lease still covers (no "missing" re-add after the kernel removed it); one with more
/// left, a permanent one, or one the lease no longer covers a second of is left alone.
#[test]
fn plan_refreshes_a_vip_whose_lifetime_runs_out_while_the_lease_covers_it() {
    let v = vip4();
    let with_lft = |secs: Option<u32>| {
        let mut a = AddrInfo::plain(2, v, true);
        a.valid_lft_secs = secs;
        a
    };
    let refresh = |secs| Step::Refresh {
        vip: v,
        ifindex: 2,
        valid_lft_secs: secs,
    };
    for left in [1, 2] {
        for lft in [0, 1] {
            assert_eq!(
                address_steps(&[(v, 2)], &[with_lft(Some(lft))], Some(left)),
                vec![refresh(left)],
                "{lft} s left on the address, {left} s of fence"
            );
        }
    }
    assert!(address_steps(&[(v, 2)], &[with_lft(Some(2))], Some(2)).is_empty());
    assert!(address_steps(&[(v, 2)], &[with_lft(None)], Some(2)).is_empty());
    assert!(
        address_steps(&[(v, 2)], &[with_lft(Some(1))], Some(0)).is_empty(),
        "less than a second of the lease: the kernel removes it"
    );
    assert_eq!(
        address_steps(&[(v, 2)], &[with_lft(Some(1))], None),
        vec![Step::Remove { vip: v, ifindex: 2 }]
    );
}

/// Issue 27: renewals fail (the API server frozen) but the lease holds until the renew
/// deadline (3 s at 5/3/1, the VIP's lifetime 2 s): the VIP stays on the interface, with
/// no gap, until the holder stops leading, and never outlives the lease others see (send
/// time + lease duration - margin). Before, the kernel removed it 2 s after the renewal
/// and the check re-added it up to 500 ms later.
#[tokio::test(start_paused = true)]
async fn a_vip_stays_while_renewals_fail_and_the_lease_holds() {
    let kernel = FakeKernel::with_eth0();
    kernel.0.lock().unwrap().lifetimes_run = true;
    let r = rig(kernel, vec![vip4()], Some("eth0"));
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    let present = |now| {
        let mut s = r.kernel.0.lock().unwrap();
        s.run_lifetimes(now);
        s.addrs.iter().any(|a| a.vip == vip4() && a.ours)
    };
    let end = t0 + TIMING.lease_duration - FENCE_MARGIN;
    let mut gaps = Vec::new();
    while Instant::now() < end + Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = Instant::now();
        let age = now - t0;
        if now < t0 + TIMING.renew_deadline && !present(now) {
            gaps.push(age.as_millis());
        }
        assert!(now < end || !present(now), "on {age:?} after the renewal");
    }
    assert!(gaps.is_empty(), "VIP gone while leading at {gaps:?} ms");
}

#[test]
fn plan_never_touches_untagged_and_drops_ours_when_not_leading() {
    let v = vip4();
    assert!(address_steps(&[(v, 2)], &[AddrInfo::plain(2, v, false)], None).is_empty());
    assert_eq!(
        address_steps(
            &[(v, 2)],
            &[AddrInfo::plain(2, v, true), AddrInfo::plain(3, v, true)],
            None
        ),
        vec![
            Step::Remove { vip: v, ifindex: 2 },
            Step::Remove { vip: v, ifindex: 3 }
        ]
    );
    assert_eq!(
        conflicts(&[v], &[AddrInfo::plain(2, v, false)]),
        vec![(v.addr, 2)]
    );
    assert!(conflicts(&[v], &[AddrInfo::plain(2, v, true)]).is_empty());
}

#[tokio::test(start_paused = true)]
async fn leading_adds_with_fence_announces_at_once_then_every_arp_rate() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    settle().await;
    assert!(!r.kernel.has(vip4()));
    let t0 = Instant::now();
    r.state.send_replace(LeaderState::Leading {
        term: 1,
        renewed_at: t0,
        clean: true,
    });
    settle().await;
    assert!(r.kernel.has(vip4()));
    assert_eq!(r.kernel.0.lock().unwrap().adds, vec![(vip4(), 2)]);
    assert_eq!(
        r.ann.count(vip4()),
        1,
        "GARP at acquire, not at the next tick"
    );
    assert_eq!(
        r.ann.0.lock().unwrap()[0].2,
        [2, 0, 0, 0, 0, 0x11],
        "sender MAC = link MAC"
    );
    // Keep renewing every second; GARP repeats every 3 s.
    for i in 1..=9 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
        let _ = i;
    }
    let n = r.ann.count(vip4());
    assert!((3..=5).contains(&n), "announcements after 9 s: {n}");
    // Each renew refreshed the fence.
    assert!(r.kernel.0.lock().unwrap().adds.len() >= 10);
    assert!(r.kernel.0.lock().unwrap().adds.iter().all(|(_, l)| *l == 2));
}

/// The whole seconds after the bind at which a holder announces `vip4()` while its node
/// holds 1 000 VIPs (`vip_arpRate` 3 s, paced interval 100 s), renewing every second for
/// `seconds`, with the VIP deleted from the kernel after renewal `delete_after` when given.
async fn announcements_at_1000_held(seconds: u32, delete_after: Option<u32>) -> Vec<u64> {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let specs = vec![VipSpec {
        vip: vip4(),
        interface: Some("eth0".into()),
        not_after: None,
    }];
    let (r, _) = rig_from(FakeKernel::with_eth0(), specs, cfg, false, None);
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for s in 1..=seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
        if delete_after == Some(s) {
            r.kernel.delete(vip4());
        }
    }
    let sent = r.ann.0.lock().unwrap();
    sent.iter()
        .filter(|(_, v, _)| *v == vip4())
        .map(|(t, _, _)| t.duration_since(t0).as_secs())
        .collect()
}

/// A node holding more VIPs than `arp_rate` × 10 spreads its repeat announcements: the
/// bind's announcement and the first repeat keep `arp_rate` (3 s), later repeats come at
/// the node's paced interval from the bind (1 000 VIPs held: 100 s), so the node sends at
/// most 10 repeats a second however many VIPs it holds.
#[tokio::test(start_paused = true)]
async fn repeat_announcements_are_paced_by_the_vips_the_node_holds() {
    let at = announcements_at_1000_held(210, None).await;
    assert_eq!(at, vec![0, 3, 100, 200], "seconds after the bind");
}

/// A VIP the periodic check re-adds (someone deleted it) is announced at once, and its next
/// announcement comes `arp_rate` later like a bind's, not at the node's paced interval (the
/// new-user trial found the check's announcement counted as a repeat).
#[tokio::test(start_paused = true)]
async fn a_repaired_vip_gets_its_first_repeat_at_arp_rate_not_paced() {
    let at = announcements_at_1000_held(120, Some(5)).await;
    // Bind 0, first repeat 3; deleted at 5, repaired and announced by 5.5; its next at
    // arp_rate (by 8.5), then with the holder's paced repeat (100 s after the bind).
    assert_eq!(at, vec![0, 3, 5, 8, 100], "seconds after the bind");
}

/// The whole seconds after the bind at which a holder of two IPv4 VIPs on a node holding
/// 1 000 announces `vip4()` over 40 s of renewals, when at 10 s another VIP joins its set
/// (`add`) or its other VIP is deleted from the kernel and repaired by the check.
async fn announcements_of_an_old_vip(add: bool) -> Vec<u64> {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let on = |a: &str| VipSpec {
        vip: Vip::new(a.parse().unwrap(), 32).unwrap(),
        interface: Some("eth0".into()),
        not_after: None,
    };
    let start = vec![on("192.0.2.10"), on("192.0.2.12")];
    let (tx, updates) = watch::channel(start.clone());
    let (r, _) = rig_from(FakeKernel::with_eth0(), start, cfg, false, Some(updates));
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for s in 1..=40u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
        if s == 10 {
            match add {
                true => {
                    tx.send_replace(vec![on("192.0.2.10"), on("192.0.2.12"), on("192.0.2.13")]);
                }
                false => r.kernel.delete(on("192.0.2.12").vip),
            }
        }
    }
    let joined = Vip::new("192.0.2.13".parse().unwrap(), 32).unwrap();
    let repaired = Vip::new("192.0.2.12".parse().unwrap(), 32).unwrap();
    let other = if add { joined } else { repaired };
    let sent = r.ann.0.lock().unwrap();
    let at = |vip: Vip| -> Vec<u64> {
        sent.iter()
            .filter(|(_, v, _)| *v == vip)
            .map(|(t, _, _)| t.duration_since(t0).as_secs())
            .collect()
    };
    // The VIP that joined or was repaired: announced at once, repeated arp_rate later.
    let other_at = at(other);
    assert!(
        other_at.ends_with(&[10, 13]),
        "the {} VIP: {other_at:?}",
        if add { "new" } else { "repaired" }
    );
    at(vip4())
}

/// A VIP joining a holder's set (a Service created into a shard) or repaired by the check is
/// announced and repeated `arp_rate` later on its own: the holder's other VIPs keep their
/// paced repeats (found by the new-user trial: each such event made the holder announce all
/// its VIPs again `arp_rate` later, and a repair announced all of them at once, hundreds of
/// frames a second for a shard with Services created every few seconds).
#[tokio::test(start_paused = true)]
async fn a_vip_added_or_repaired_does_not_repeat_the_holders_other_vips() {
    assert_eq!(
        announcements_of_an_old_vip(true).await,
        vec![0, 3],
        "a VIP joins"
    );
    assert_eq!(
        announcements_of_an_old_vip(false).await,
        vec![0, 3],
        "a VIP is repaired"
    );
}

#[test]
fn the_repeat_interval_keeps_arp_rate_up_to_10_repeats_a_second() {
    let rate = Duration::from_millis(3000);
    assert_eq!(repeat_interval(rate, 0), rate);
    assert_eq!(repeat_interval(rate, 30), rate, "30 VIPs every 3 s: 10/s");
    assert_eq!(repeat_interval(rate, 40), Duration::from_secs(4));
    assert_eq!(repeat_interval(rate, 1000), Duration::from_secs(100));
    assert_eq!(repeat_interval(rate, 3300), Duration::from_secs(330));
    assert_eq!(
        repeat_interval(Duration::from_millis(500), 10),
        Duration::from_secs(1),
        "a short vip_arpRate is paced the same way"
    );
}

#[tokio::test(start_paused = true)]
async fn losing_leadership_removes_and_acknowledges() {
    let mut r = rig(FakeKernel::with_eth0(), vec![vip4()], None);
    lead(&r, 3, true);
    settle().await;
    assert!(r.kernel.has(vip4()));
    r.state.send_replace(LeaderState::Following {
        holder: Some("b".into()),
    });
    r.dropped.wait_for(|t| *t >= 3).await.unwrap();
    assert!(!r.kernel.has(vip4()), "ack only after the VIP is gone");
    let before = r.ann.count(vip4());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(r.ann.count(vip4()), before, "no GARP when not held");
    assert!(!r.kernel.has(vip4()));
    r.shutdown.cancel();
    r.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn deleted_vip_is_readded_and_reannounced_within_the_check_interval() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    lead(&r, 1, true);
    settle().await;
    r.kernel.delete(vip4());
    let before = r.ann.count(vip4());
    tokio::time::sleep(Duration::from_millis(501)).await;
    assert!(r.kernel.has(vip4()));
    assert_eq!(r.ann.count(vip4()), before + 1);
    // The re-add gets only what the lease still covers since the last renew (5 s lease:
    // the whole 2 s fence at 0.5 s; see `fence_grant`).
    let adds = r.kernel.0.lock().unwrap().adds.clone();
    assert_eq!(
        adds.last(),
        Some(&(
            vip4(),
            fence_grant(2, TIMING.lease_duration, Duration::from_millis(501))
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn no_carrier_longer_than_renew_deadline_closes_the_link_gate() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    settle().await;
    assert!(r.gates.closed().is_empty());
    r.kernel.set_carrier(false);
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert!(r.gates.closed().is_empty(), "short flaps are tolerated");
    // Closed by the renew deadline plus at most one check interval after the loss.
    tokio::time::sleep(Duration::from_millis(1000 + 500)).await;
    assert_eq!(r.gates.closed(), vec![GATE_LINK.to_string()]);
    r.kernel.set_carrier(true);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(r.gates.closed().is_empty());
}

/// The elector must not campaign before the holder's first local checks: the starting gate
/// is closed from the holder's creation and opens only after them, by which time a missing
/// interface has closed the link gate (found by the gc helper's trial: a control-plane node
/// with no VIP interface took the lease, then stepped down).
#[tokio::test(start_paused = true)]
async fn no_campaign_before_the_first_local_checks() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth9"));
    assert_eq!(r.gates.closed(), vec![GATE_STARTING.to_string()]);
    settle().await;
    assert_eq!(r.gates.closed(), vec![GATE_LINK.to_string()]);
    r.shutdown.cancel();
    r.task.await.unwrap();

    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    assert_eq!(r.gates.closed(), vec![GATE_STARTING.to_string()]);
    settle().await;
    assert!(r.gates.closed().is_empty(), "{:?}", r.gates.closed());
}

#[tokio::test(start_paused = true)]
async fn missing_interface_and_foreign_vip_close_gates_without_crashing() {
    let k = FakeKernel::with_eth0();
    let r = rig(k.clone(), vec![vip4()], Some("eth9"));
    settle().await;
    assert!(r.gates.closed().contains(&GATE_LINK.to_string()));
    r.shutdown.cancel();
    r.task.await.unwrap();

    k.0.lock()
        .unwrap()
        .addrs
        .push(AddrInfo::plain(2, vip4(), false));
    let r = rig(k.clone(), vec![vip4()], Some("eth0"));
    settle().await;
    assert!(r.gates.closed().contains(&GATE_CONFLICT.to_string()));
    // Even when told to lead, the foreign address is never removed.
    r.state
        .send_replace(LeaderState::Following { holder: None });
    settle().await;
    assert!(
        k.0.lock()
            .unwrap()
            .addrs
            .iter()
            .any(|a| a.vip == vip4() && !a.ours)
    );
}

#[tokio::test(start_paused = true)]
async fn ipv6_vip_is_announced_only_after_it_leaves_tentative_state() {
    let v6 = Vip::new("2001:db8::10".parse().unwrap(), 128).unwrap();
    let r = rig(FakeKernel::with_eth0(), vec![v6], Some("eth0"));
    // The fake adds addresses non-tentative; make the add tentative by flagging right after.
    lead(&r, 1, true);
    settle().await;
    let first = r.ann.count(v6);
    assert_eq!(first, 1);
    // DAD failure (another node had it): removed and re-added, NA again once usable.
    r.kernel.set_flags(v6, false, true);
    tokio::time::sleep(Duration::from_millis(501)).await;
    assert!(r.kernel.has(v6));
    r.kernel.set_flags(v6, true, false);
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let while_tentative = r.ann.count(v6);
    r.kernel.set_flags(v6, false, false);
    tokio::time::sleep(Duration::from_millis(501)).await;
    assert!(r.ann.count(v6) > while_tentative, "announced once usable");
}

#[tokio::test(start_paused = true)]
async fn shutdown_removes_vips() {
    let r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    lead(&r, 1, true);
    settle().await;
    assert!(r.kernel.has(vip4()));
    r.shutdown.cancel();
    r.task.await.unwrap();
    assert!(!r.kernel.has(vip4()));
}

#[tokio::test(start_paused = true)]
async fn edited_vip_set_adds_new_and_removes_old_while_leading() {
    let kernel = FakeKernel::with_eth0();
    let v120 = Vip::host("192.0.2.120".parse().unwrap());
    let v121 = Vip::host("192.0.2.121".parse().unwrap());
    let spec = |v: Vip| VipSpec {
        vip: v,
        interface: None,
        not_after: None,
    };
    let (set_tx, set_rx) = watch::channel(vec![spec(v120)]);
    let mut cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.check_following = false;
    let (r, _) = rig_from(kernel.clone(), vec![], cfg, false, Some(set_rx));
    lead(&r, 1, true);
    settle().await;
    assert!(kernel.has(v120));
    set_tx.send_replace(vec![spec(v121)]);
    settle().await;
    assert!(!kernel.has(v120), "old address removed");
    assert!(kernel.has(v121), "new address added");
    assert_eq!(r.ann.count(v121), 1, "and announced at once");
    r.shutdown.cancel();
    r.task.await.unwrap();
    assert!(!kernel.has(v121));
}

/// A VIP added to a held set, or one whose `not_after` moved (a DHCP renewal), announces
/// only what is new: the VIPs already held are not announced again (issue 13's bench: with
/// one lease for 50 DHCP Services every change re-announced all of them, and bring-up grew
/// by about 14 ms per Service held).
#[tokio::test(start_paused = true)]
async fn a_grown_vip_set_announces_only_the_new_vip() {
    let kernel = FakeKernel::with_eth0();
    let v120 = Vip::host("192.0.2.120".parse().unwrap());
    let v121 = Vip::host("192.0.2.121".parse().unwrap());
    let spec = |v: Vip, not_after: Option<tokio::time::Instant>| VipSpec {
        vip: v,
        interface: None,
        not_after,
    };
    let (set_tx, set_rx) = watch::channel(vec![spec(v120, None)]);
    let mut cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.check_following = false;
    let (r, _) = rig_from(kernel.clone(), vec![], cfg, false, Some(set_rx));
    lead(&r, 1, true);
    settle().await;
    let first = r.ann.count(v120);
    assert!(first >= 1, "announced when it was bound");
    set_tx.send_replace(vec![spec(v120, None), spec(v121, None)]);
    settle().await;
    assert!(kernel.has(v120) && kernel.has(v121));
    assert_eq!(r.ann.count(v121), 1, "the new VIP is announced at once");
    assert_eq!(
        r.ann.count(v120),
        first,
        "the held VIP is not announced again"
    );
    let later = tokio::time::Instant::now() + Duration::from_secs(600);
    set_tx.send_replace(vec![spec(v120, Some(later)), spec(v121, None)]);
    settle().await;
    assert_eq!(
        r.ann.count(v120),
        first,
        "a moved not_after announces nothing"
    );
    assert_eq!(r.ann.count(v121), 1);
    r.shutdown.cancel();
    r.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn no_acknowledgement_until_the_vips_are_confirmed_gone() {
    let mut r = rig(FakeKernel::with_eth0(), vec![vip4()], Some("eth0"));
    lead(&r, 1, true);
    settle().await;
    r.kernel.0.lock().unwrap().fail_remove = true;
    r.state
        .send_replace(LeaderState::Following { holder: None });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        *r.dropped.borrow(),
        0,
        "removal failed: no ack, so no release"
    );
    assert!(r.kernel.has(vip4()));
    r.kernel.0.lock().unwrap().fail_remove = false;
    tokio::time::timeout(Duration::from_secs(1), r.dropped.wait_for(|t| *t >= 1))
        .await
        .expect("acked once removal works")
        .unwrap();
    assert!(!r.kernel.has(vip4()));
}

#[tokio::test(start_paused = true)]
async fn a_vip_just_added_is_announced_even_if_a_dump_misses_it() {
    for clean in [true, false] {
        let (r, _monitor, _) = rig_probing(FakeKernel::with_eth0(), vec![vip4()]);
        settle().await;
        r.kernel.0.lock().unwrap().dumps_miss_ours = true;
        lead(&r, 1, clean);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(
            r.kernel
                .0
                .lock()
                .unwrap()
                .adds
                .iter()
                .any(|(v, _)| *v == vip4())
        );
        assert_eq!(
            r.ann.count(vip4()),
            1,
            "announced right after the add (clean={clean}), not at the next repeat"
        );
    }
}

/// A holder of many VIPs (a shard lease) looks its interface up once, binds every VIP that
/// passed the conflict probe in one kernel batch (one read of the node's addresses, not one
/// per VIP: quadratic at hundreds of VIPs, which stalled a 10 000-Service node past its
/// renew deadline), announces each, and refreshes them in one batch per renewal.
#[tokio::test(start_paused = true)]
async fn many_vips_are_bound_and_refreshed_in_one_batch_each() {
    let vips: Vec<Vip> = (1..=40u8)
        .map(|i| Vip::new(IpAddr::from([192, 0, 2, 100 + i]), 32).unwrap())
        .collect();
    let (r, _monitor, _) = rig_probing(FakeKernel::with_eth0(), vips.clone());
    settle().await;
    let queries_before = r.kernel.0.lock().unwrap().name_queries;
    lead(&r, 1, false);
    tokio::time::sleep(Duration::from_millis(60)).await;
    {
        let s = r.kernel.0.lock().unwrap();
        assert_eq!(
            s.name_queries - queries_before,
            1,
            "one interface lookup for 40 VIPs on eth0"
        );
        assert_eq!(s.batches, vec![40], "bound in one batch after the probe");
        assert_eq!(
            s.batches_known,
            vec![true],
            "the batch given the holder's reading of the addresses"
        );
        for v in &vips {
            assert!(s.addrs.iter().any(|a| a.vip == *v && a.ours), "{v} bound");
        }
    }
    for v in &vips {
        assert_eq!(r.ann.count(*v), 1, "{v} announced once");
    }
    lead(&r, 1, false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        r.kernel.0.lock().unwrap().batches,
        vec![40, 40],
        "the renewal refreshed all 40 in one batch"
    );
    assert_eq!(
        r.kernel.0.lock().unwrap().batches_known,
        vec![true, false],
        "the bind passes its reading; a refresh without the second line's split reads none \
         of its own (its VIPs are in place: the kernel reads them afresh)"
    );
    r.state
        .send_replace(LeaderState::Following { holder: None });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let s = r.kernel.0.lock().unwrap();
    assert_eq!(s.remove_batches, vec![40], "dropped in one batch");
    assert!(
        !s.addrs.iter().any(|a| a.ours),
        "every VIP removed: {:?}",
        s.addrs
    );
}

/// A VIP with a not-after time (a DHCP lease's expiry, issue 13) never gets a valid
/// lifetime past it, however often the lease is renewed, and is removed (not re-added) once
/// less than a second is left; a VIP without one keeps the full fence.
#[tokio::test(start_paused = true)]
async fn a_vip_never_outlives_its_not_after_time() {
    let kernel = FakeKernel::with_eth0();
    let dhcp_vip = Vip::new("192.0.2.201".parse().unwrap(), 32).unwrap();
    let expires = Instant::now() + Duration::from_millis(3500);
    let specs = vec![
        VipSpec {
            vip: vip4(),
            interface: Some("eth0".into()),
            not_after: None,
        },
        VipSpec {
            vip: dhcp_vip,
            interface: Some("eth0".into()),
            not_after: Some(expires),
        },
    ];
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    let (r, _) = rig_from(kernel.clone(), specs, cfg, false, None);
    settle().await;
    // Renew every second, as the elector does, for five seconds.
    for term_second in 0..5u64 {
        lead(&r, 1, true);
        settle().await;
        let now = Instant::now();
        for (vip, lft) in kernel.0.lock().unwrap().adds.iter() {
            if *vip == dhcp_vip {
                assert!(lft >= &1, "a lifetime of 0 is never asked for");
            }
        }
        let last = kernel
            .0
            .lock()
            .unwrap()
            .adds
            .iter()
            .rev()
            .find(|(v, _)| *v == dhcp_vip)
            .map(|(_, l)| *l);
        if now + Duration::from_secs(1) <= expires {
            let lft = last.expect("added while the DHCP lease lasts");
            assert!(
                now + Duration::from_secs(u64::from(lft)) <= expires,
                "second {term_second}: lifetime {lft} s reaches past the DHCP expiry"
            );
            assert!(kernel.has(dhcp_vip));
        } else {
            assert!(
                !kernel.has(dhcp_vip),
                "second {term_second}: still held less than a second before expiry"
            );
        }
        assert!(kernel.has(vip4()), "the other VIP keeps its fence");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let dhcp_adds: Vec<u32> = kernel
        .0
        .lock()
        .unwrap()
        .adds
        .iter()
        .filter(|(v, _)| *v == dhcp_vip)
        .map(|(_, l)| *l)
        .collect();
    assert_eq!(dhcp_adds, vec![2, 2, 1], "capped to the seconds left");
    assert!(!kernel.has(dhcp_vip));
    assert_eq!(cap_lifetime(2, None, Instant::now()), 2);
    r.shutdown.cancel();
    let _ = r.task.await;
}

/// 5/3/1 (and longer leases) end a route before a takeover; vipd's 3/2/1 and 4/2/1
/// do not (fence 2 s + 2 s slack is not shorter than their lease).
#[test]
fn only_leases_longer_than_the_fence_and_its_slack_keep_one_path() {
    let t = |l: u64, r: u64, p: u64| crate::lease::Timing {
        lease_duration: std::time::Duration::from_secs(l),
        renew_deadline: std::time::Duration::from_secs(r),
        retry_period: std::time::Duration::from_secs(p),
    };
    assert!(route_gone_before_takeover(&ROUTED_SERVICE_TIMING));
    assert!(route_gone_before_takeover(&t(10, 6, 2)));
    assert!(!route_gone_before_takeover(&t(3, 2, 1)));
    assert!(!route_gone_before_takeover(&t(4, 2, 1)));
}

/// The takeover lines among the captured `lines` ([`crate::obs::logging::capture`]).
fn takeover_lines(lines: &crate::obs::logging::capture::Lines) -> Vec<String> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("takeover:"))
        .cloned()
        .collect()
}

/// Issue 28: the new holder's log says where a takeover's time went, once a term: after the
/// probe window for a term that probes (its bind, the fence set before by the renewal), at
/// once for a clean hand-over (the renewal's refresh, with its fence time), never for the
/// renewals that follow.
#[tokio::test(start_paused = true)]
async fn a_takeover_logs_its_step_times_once_a_term() {
    let (subscriber, lines) = crate::obs::logging::capture::subscriber();
    let _log = tracing::subscriber::set_default(subscriber);
    let takeovers = || takeover_lines(&lines);
    let vips: Vec<Vip> = (1..=12u8)
        .map(|i| Vip::new(IpAddr::from([192, 0, 2, 100 + i]), 32).unwrap())
        .collect();
    let (r, _monitor, _) = rig_probing(FakeKernel::with_eth0(), vips);
    settle().await;
    lead(&r, 1, false);
    tokio::time::sleep(Duration::from_millis(60)).await;
    let t = takeovers();
    assert_eq!(t.len(), 1, "{t:?}");
    assert!(
        t[0].contains("12 VIPs in place")
            && t[0].contains("probe window 50 ms")
            && t[0].contains("nftables fence set before")
            && t[0].contains("adds ")
            && t[0].contains("12 announced in "),
        "{}",
        t[0]
    );
    for _ in 0..3 {
        lead(&r, 1, false);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(takeovers().len(), 1, "renewals log no takeover");
    r.state
        .send_replace(LeaderState::Following { holder: None });
    tokio::time::sleep(Duration::from_millis(10)).await;
    lead(&r, 2, true);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let t = takeovers();
    assert_eq!(t.len(), 2, "{t:?}");
    assert!(
        t[1].contains("12 VIPs in place")
            && t[1].contains("probe window 0 ms")
            && t[1].contains("nftables fence "),
        "a clean hand-over binds at once: {}",
        t[1]
    );
}

/// Issue 28: a term that starts with VIPs marks them in the node's takeovers from its start
/// (through the probe window) until they are in place, not for the renewals after; a term
/// that ends before its VIPs are in place ends its mark too.
#[tokio::test(start_paused = true)]
async fn a_takeover_is_marked_from_the_term_start_until_its_vips_are_in_place() {
    let takeovers = Arc::new(takeovers::Takeovers::default());
    let mut cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.conflict_monitor = Some(Arc::new(FakeConflictMonitor::new()));
    cfg.takeovers = takeovers.clone();
    let kernel = FakeKernel::with_eth0();
    let (r, _) = rig_from(kernel.clone(), seventy(), cfg, true, None);
    settle().await;
    assert_eq!(takeovers.in_progress(), 0, "following");
    lead(&r, 1, false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(takeovers.in_progress(), 70, "probing: taking over");
    assert!(takeovers.busy());
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(kernel.has(Vip::new(IpAddr::from([192, 0, 2, 170]), 32).unwrap()));
    assert_eq!(takeovers.in_progress(), 0, "in place");
    lead(&r, 1, false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(takeovers.in_progress(), 0, "a renewal takes nothing over");
    // A new term that loses the lease within its probe window.
    r.state
        .send_replace(LeaderState::Following { holder: None });
    tokio::time::sleep(Duration::from_millis(10)).await;
    lead(&r, 2, false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(takeovers.in_progress(), 70);
    r.state
        .send_replace(LeaderState::Following { holder: None });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(takeovers.in_progress(), 0, "the term ended");
    lead(&r, 3, false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(takeovers.in_progress(), 70);
    r.shutdown.cancel();
    let _ = r.task.await;
    assert_eq!(takeovers.in_progress(), 0, "stopped");
}

#[test]
fn a_takeover_reads_in_milliseconds() {
    let t = Takeover {
        vips: 600,
        since_leading: Duration::from_millis(5_250),
        probe_window: Duration::from_millis(1_000),
        fence: Some(Duration::from_millis(40)),
        adds: Duration::from_millis(3_900),
        announced: 600,
        announce: Duration::from_millis(120),
    };
    assert_eq!(
        t.to_string(),
        "600 VIPs in place 5250 ms after leading: probe window 1000 ms, nftables fence 40 ms, adds 3900 ms, 600 announced in 120 ms"
    );
    let bind = Takeover { fence: None, ..t };
    assert!(
        bind.to_string()
            .contains("nftables fence set before, adds 3900 ms")
    );
}

/// A holder that leads with no VIPs (a shard or group whose Services are yet to come) and
/// gets a Service minutes into its term took nothing over: no takeover line, which would
/// read as a failover of minutes ("1 VIPs in place 60000 ms after leading").
#[tokio::test(start_paused = true)]
async fn a_vip_added_later_in_a_term_that_started_empty_is_no_takeover() {
    let (subscriber, lines) = crate::obs::logging::capture::subscriber();
    let _log = tracing::subscriber::set_default(subscriber);
    let takeovers = || takeover_lines(&lines);
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    let (updates_tx, updates) = watch::channel(Vec::new());
    let kernel = FakeKernel::with_eth0();
    let (r, _) = rig_from(kernel.clone(), Vec::new(), cfg, false, Some(updates));
    settle().await;
    lead(&r, 1, true);
    // A minute of renewals with nothing to hold.
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
    }
    let vip = Vip::new(IpAddr::from([192, 0, 2, 120]), 32).unwrap();
    updates_tx.send_replace(vec![VipSpec {
        vip,
        interface: Some("eth0".into()),
        not_after: None,
    }]);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
    }
    settle().await;
    assert!(kernel.has(vip), "the Service's VIP is added");
    assert_eq!(
        takeovers(),
        Vec::<String>::new(),
        "a Service added mid-term"
    );
}

/// 70 VIPs on eth0 (more than a chunk of adds), for the takeover-mark tests.
fn seventy() -> Vec<VipSpec> {
    (1..=70u8)
        .map(|i| VipSpec {
            vip: Vip::new(IpAddr::from([192, 0, 2, 100 + i]), 32).unwrap(),
            interface: Some("eth0".into()),
            not_after: None,
        })
        .collect()
}

/// Issue 28 (found by the session's trial): a term whose first refresh adds nothing (a
/// stale first renewal, as after a freeze) gets its VIPs from the next renewal's refresh,
/// which announces nothing and so never logs the takeover: the mark stays for the whole
/// term.
#[tokio::test(start_paused = true)]
async fn a_takeover_mark_ends_when_a_later_renewal_puts_the_vips_in_place() {
    let takeovers = Arc::new(takeovers::Takeovers::default());
    let mut cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.takeovers = takeovers.clone();
    let kernel = FakeKernel::with_eth0();
    let (r, _) = rig_from(kernel.clone(), seventy(), cfg, false, None);
    settle().await;
    lead_sent_before(&r, 1, true, Duration::from_secs(5)).await;
    settle().await;
    for _ in 0..30 {
        lead(&r, 1, true);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        kernel.has(Vip::new(IpAddr::from([192, 0, 2, 170]), 32).unwrap()),
        "in place"
    );
    assert_eq!(
        takeovers.in_progress(),
        0,
        "VIPs in place for 30 s: the mark leaked"
    );
}

/// Issue 28 (found by the session's trial): every VIP refused by the conflict probe
/// (another host answers): the term goes on, nothing is ever added, the node counts as busy
/// for the whole term.
#[tokio::test(start_paused = true)]
async fn a_takeover_mark_ends_when_every_vip_is_refused() {
    let takeovers = Arc::new(takeovers::Takeovers::default());
    let monitor = FakeConflictMonitor::new();
    let mut cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.conflict_monitor = Some(Arc::new(monitor.clone()));
    cfg.takeovers = takeovers.clone();
    let specs = seventy();
    for s in &specs {
        monitor.answer_probes(s.vip.addr, [2, 0, 0, 0, 0, 0xbb]);
    }
    let kernel = FakeKernel::with_eth0();
    let (r, _) = rig_from(kernel.clone(), specs, cfg, true, None);
    settle().await;
    lead(&r, 1, false);
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, false);
    }
    assert!(
        !kernel.has(Vip::new(IpAddr::from([192, 0, 2, 170]), 32).unwrap()),
        "refused"
    );
    assert_eq!(
        takeovers.in_progress(),
        0,
        "all refused for 30 s: still marked busy"
    );
}

/// Issue 28 (found by the session's trial): the VIPs leave the group within the probe
/// window (every Service moved off the shard): nothing is left to add, the mark stays until
/// the term ends.
#[tokio::test(start_paused = true)]
async fn a_takeover_mark_ends_when_the_vips_leave_during_the_probe() {
    let takeovers = Arc::new(takeovers::Takeovers::default());
    let mut cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.conflict_monitor = Some(Arc::new(FakeConflictMonitor::new()));
    cfg.takeovers = takeovers.clone();
    let (updates_tx, updates) = watch::channel(seventy());
    let kernel = FakeKernel::with_eth0();
    let (r, _) = rig_from(kernel.clone(), seventy(), cfg, true, Some(updates));
    settle().await;
    lead(&r, 1, false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(takeovers.in_progress(), 70, "probing");
    updates_tx.send_replace(Vec::new());
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, false);
    }
    assert_eq!(
        takeovers.in_progress(),
        0,
        "no VIP left for 30 s: still marked busy"
    );
}

/// A shard holder's VIPs on one interface share one `LinkInfo` (not hundreds of copies of
/// its name to clone at every check, refresh and announcement): a check that finds the
/// interface unchanged keeps the entry, a changed one (a new MAC) reaches every VIP on it
/// as one new entry, and VIPs on another interface keep theirs.
#[test]
fn vips_on_one_interface_share_one_link_entry() {
    let eth0 = LinkInfo {
        index: 2,
        name: "eth0".into(),
        mac: [2, 0, 0, 0, 0, 1],
        up: true,
        carrier: true,
    };
    let eth1 = LinkInfo {
        index: 3,
        name: "eth1".into(),
        mac: [2, 0, 0, 0, 0, 2],
        up: true,
        carrier: true,
    };
    let mut l = Links::default();
    for i in 0..3 {
        l.insert(i, eth0.clone());
    }
    l.insert(3, eth1.clone());
    let shared = |l: &Links, i: usize| l.shared(&i).unwrap().clone();
    assert!(
        Arc::ptr_eq(&shared(&l, 0), &shared(&l, 2)),
        "one entry for eth0"
    );
    let before = shared(&l, 0);
    l.update_interface(&eth0);
    assert!(
        Arc::ptr_eq(&shared(&l, 1), &before),
        "unchanged: kept, not copied"
    );
    let new_mac = LinkInfo {
        mac: [2, 0, 0, 0, 0, 9],
        ..eth0.clone()
    };
    l.update_interface(&new_mac);
    for i in 0..3 {
        assert_eq!(l.get(&i), Some(&new_mac));
    }
    assert!(
        Arc::ptr_eq(&shared(&l, 0), &shared(&l, 2)),
        "still one entry"
    );
    assert_eq!(
        l.get(&3),
        Some(&eth1),
        "the other interface's VIP keeps its own"
    );
    assert_eq!(l.interfaces(), vec![2, 3]);
    l.insert(4, new_mac.clone());
    assert!(
        Arc::ptr_eq(&shared(&l, 4), &shared(&l, 0)),
        "an insert shares it too"
    );
    for i in 0..5 {
        l.remove(&i);
    }
    assert_eq!(l.len(), 0);
    assert!(l.slots.is_empty() && l.recent.is_none(), "nothing kept");
}

// ---- Repeat announcements: per-VIP first repeats (the second new-user trial's probes) ----

fn pace_spec(a: &str) -> VipSpec {
    VipSpec {
        vip: Vip::new(a.parse().unwrap(), if a.contains(':') { 128 } else { 32 }).unwrap(),
        interface: Some("eth0".into()),
        not_after: None,
    }
}

fn pace_ms(r: &Rig, vip: Vip, t0: Instant) -> Vec<u64> {
    r.ann
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, v, _)| *v == vip)
        .map(|(t, _, _)| t.duration_since(t0).as_millis() as u64)
        .collect()
}

/// Control plane: one VIP, pace 0: bind, then every arp_rate.
#[tokio::test(start_paused = true)]
async fn control_plane_announces_every_arp_rate() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    let (r, _) = rig_from(
        FakeKernel::with_eth0(),
        vec![pace_spec("192.0.2.10")],
        cfg,
        false,
        None,
    );
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for _ in 1..=31 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
    }
    let at: Vec<u64> = pace_ms(&r, vip4(), t0).iter().map(|ms| ms / 1000).collect();
    assert_eq!(
        at,
        vec![0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30],
        "ms: {:?}",
        pace_ms(&r, vip4(), t0)
    );
}

/// A VIP joining shortly before the holder's paced repeat keeps its own first repeat
/// arp_rate later (not a repeat a moment after its first announcement).
#[tokio::test(start_paused = true)]
async fn a_vip_joining_just_before_the_paced_repeat_gets_its_repeat_arp_rate_later() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let start = vec![pace_spec("192.0.2.10")];
    let (tx, updates) = watch::channel(start.clone());
    let (r, _) = rig_from(FakeKernel::with_eth0(), start, cfg, false, Some(updates));
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for s in 1..=110u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
        if s == 99 {
            tx.send_replace(vec![pace_spec("192.0.2.10"), pace_spec("192.0.2.13")]);
            settle().await;
        }
    }
    let joined = pace_spec("192.0.2.13").vip;
    let ms = pace_ms(&r, joined, t0);
    assert!(ms.len() >= 2, "joined VIP never repeated: {ms:?}");
    assert!(
        ms[1] - ms[0] >= 2500,
        "the joined VIP's first repeat came {} ms after its first announcement: {ms:?}",
        ms[1] - ms[0]
    );
}

/// Step-down and re-lead: nothing from the old term fires in the new one; the new term
/// announces at its bind, arp_rate later, then paced from the new term's bind.
#[tokio::test(start_paused = true)]
async fn step_down_and_re_lead_starts_a_fresh_clock() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let (r, _) = rig_from(
        FakeKernel::with_eth0(),
        vec![pace_spec("192.0.2.10")],
        cfg,
        false,
        None,
    );
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for s in 1..=130u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if s == 2 {
            r.state.send_replace(LeaderState::Following {
                holder: Some("b".into()),
            });
            settle().await;
            continue;
        }
        let term = if s < 2 { 1 } else { 2 };
        lead(&r, term, true);
        settle().await;
    }
    let at: Vec<u64> = pace_ms(&r, vip4(), t0).iter().map(|ms| ms / 1000).collect();
    assert_eq!(at, vec![0, 3, 6, 103], "ms: {:?}", pace_ms(&r, vip4(), t0));
}

/// A new term while leading (Leading t1 then Leading t2, no Following between): the
/// paced clock counts from the new term's first announcement.
#[tokio::test(start_paused = true)]
async fn a_new_term_without_step_down() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let (r, _) = rig_from(
        FakeKernel::with_eth0(),
        vec![pace_spec("192.0.2.10")],
        cfg,
        false,
        None,
    );
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for s in 1..=130u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let term = if s < 50 { 1 } else { 2 };
        lead(&r, term, true);
        settle().await;
    }
    let at: Vec<u64> = pace_ms(&r, vip4(), t0).iter().map(|ms| ms / 1000).collect();
    // Term 1: bind, first repeat; term 2 at 50 s: announced again, its first repeat, its
    // paced repeat not before 150 s.
    assert_eq!(at, vec![0, 3, 50, 53], "ms: {:?}", pace_ms(&r, vip4(), t0));
}

/// IPv6 with DAD: announced once it leaves the tentative state, repeated arp_rate later.
#[tokio::test(start_paused = true)]
async fn ipv6_with_dad_is_announced_after_tentative_then_repeated() {
    let mut cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.skip_dad = false;
    cfg.announce_pace.set_held(1000);
    let spec = pace_spec("2001:db8::10");
    let v6 = spec.vip;
    let (r, _) = rig_from(FakeKernel::with_eth0(), vec![spec], cfg, false, None);
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    r.kernel.set_flags(v6, true, false);
    for s in 1..=110u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
        if s == 2 {
            r.kernel.set_flags(v6, false, false);
        }
    }
    let at: Vec<u64> = pace_ms(&r, v6, t0).iter().map(|ms| ms / 1000).collect();
    assert!(at.len() >= 3, "v6 DAD announcements: {at:?}");
    assert_eq!(
        &at[..2],
        &[2, 5],
        "announced out of DAD, repeated arp_rate later"
    );
}

/// A VIP removed from the set before its first repeat is not repeated.
#[tokio::test(start_paused = true)]
async fn a_removed_vip_is_not_repeated() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let start = vec![pace_spec("192.0.2.10"), pace_spec("192.0.2.12")];
    let (tx, updates) = watch::channel(start.clone());
    let (r, _) = rig_from(FakeKernel::with_eth0(), start, cfg, false, Some(updates));
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for s in 1..=110u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
        if s == 1 {
            tx.send_replace(vec![pace_spec("192.0.2.10")]);
        }
        if s == 50 {
            // Re-added later: announced and repeated arp_rate later once.
            tx.send_replace(vec![pace_spec("192.0.2.10"), pace_spec("192.0.2.12")]);
        }
    }
    let gone = pace_spec("192.0.2.12").vip;
    let at: Vec<u64> = pace_ms(&r, gone, t0).iter().map(|ms| ms / 1000).collect();
    assert_eq!(at, vec![0, 50, 53, 100], "removed VIP: {at:?}");
    let kept: Vec<u64> = pace_ms(&r, vip4(), t0).iter().map(|ms| ms / 1000).collect();
    assert_eq!(kept, vec![0, 3, 100]);
}

/// 200 VIPs bound at once on a node holding 1 000: each VIP at most once in any 2.5 s
/// window, and no spin (total bounded).
#[tokio::test(start_paused = true)]
async fn two_hundred_vips_at_once() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let specs: Vec<VipSpec> = (0..200u32)
        .map(|i| pace_spec(&format!("10.1.{}.{}", i / 200, 1 + i % 200)))
        .collect();
    let (r, _) = rig_from(FakeKernel::with_eth0(), specs.clone(), cfg, false, None);
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for _ in 1..=205u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
    }
    let sent = r.ann.0.lock().unwrap().clone();
    let mut per_sec: std::collections::BTreeMap<u64, usize> = Default::default();
    for (t, _, _) in &sent {
        *per_sec.entry(t.duration_since(t0).as_secs()).or_default() += 1;
    }
    assert_eq!(sent.len(), 200 * 4, "per second: {per_sec:?}");
    for s in &specs {
        let ms = pace_ms_from(&sent, s.vip, t0);
        for w in ms.windows(2) {
            assert!(w[1] - w[0] >= 2500, "{}: {ms:?}", s.vip);
        }
    }
}

fn pace_ms_from(sent: &[(Instant, Vip, [u8; 6])], vip: Vip, t0: Instant) -> Vec<u64> {
    sent.iter()
        .filter(|(_, v, _)| *v == vip)
        .map(|(t, _, _)| t.duration_since(t0).as_millis() as u64)
        .collect()
}

/// The node's held count drops (1000 -> 0) after the bind: repeats return to arp_rate
/// without a burst or spin.
#[tokio::test(start_paused = true)]
async fn pace_shrinking_does_not_spin() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let pace = cfg.announce_pace.clone();
    let (r, _) = rig_from(
        FakeKernel::with_eth0(),
        vec![pace_spec("192.0.2.10")],
        cfg,
        false,
        None,
    );
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for s in 1..=30u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, 1, true);
        settle().await;
        if s == 10 {
            pace.set_held(0);
        }
    }
    let at: Vec<u64> = pace_ms(&r, vip4(), t0).iter().map(|ms| ms / 1000).collect();
    // Paced at 100 s until 10 s, then every arp_rate (3 s) again: no burst, no spin.
    assert_eq!(at, vec![0, 3, 10, 13, 16, 19, 22, 25, 28], "{at:?}");
}

/// A new term observed right after the last (the Following between coalesced by the
/// watch): the old term's queued first repeat fires in the new term besides the new one.
#[tokio::test(start_paused = true)]
async fn a_new_term_soon_after_the_bind_keeps_no_stale_first_repeat() {
    let cfg = HolderConfig::from_timing(&TIMING, Duration::from_millis(3000), false).unwrap();
    cfg.announce_pace.set_held(1000);
    let (r, _) = rig_from(
        FakeKernel::with_eth0(),
        vec![pace_spec("192.0.2.10")],
        cfg,
        false,
        None,
    );
    settle().await;
    let t0 = Instant::now();
    lead(&r, 1, true);
    settle().await;
    for s in 1..=10u32 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead(&r, if s < 1 { 1 } else { 2 }, true);
        settle().await;
    }
    let at: Vec<u64> = pace_ms(&r, vip4(), t0).iter().map(|ms| ms / 1000).collect();
    assert_eq!(at, vec![0, 1, 4], "ms: {:?}", pace_ms(&r, vip4(), t0));
}
