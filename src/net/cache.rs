//! [`CachedKernel`]: shares one address dump between many VIP holders.
//!
//! With per-Service elections a node runs one VIP holder per Service, and a shard's holder
//! checks hundreds of addresses, each every check interval. Instead of one `RTM_GETADDR`
//! dump per holder per check, holders read a shared snapshot; vipd's own adds and removes
//! invalidate it so a holder always sees its own changes.
//!
//! How long a snapshot is reused:
//! - without an [`AddrWatch`] (or once it stopped), for `max_age` (200 ms in vipd);
//! - with one, until the watch counts an address change (any address of the namespace), for
//!   at most [`WATCHED_MAX_AGE`], and for at most `max_age` while an address in it has
//!   [`LIFETIME_MARGIN`] or less of its valid lifetime left at the snapshot's age: a holder's
//!   decision to refresh an address that is about to end ([`crate::holder::REFRESH_BELOW_SECS`])
//!   reads a dump as young as without the watch. After a change the snapshot is reused for
//!   `max_age` at most, as without the watch (a burst of changes, a shard's refresh, costs
//!   one dump per `max_age`, not one per reader). A reused snapshot reports lifetimes less
//!   the whole seconds it has aged, so a reader sees at most one second more than the kernel
//!   would report (as a `max_age` old dump did).
//!
//! At 10 000 Services (3 000-4 000 addresses a node) the 200 ms dumps were a quarter of an
//! idle vipd's CPU (docs/services-bench.md); with the watch a node dumps after its own
//! writes and after changes, not on a clock.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{AddrInfo, AddrWatch, Kernel, Lifetime, LinkInfo, NetError, Vip};

/// The longest a snapshot is reused while the [`AddrWatch`] sees no change: a bound on what
/// a lost notification could hide (the kernel reports a lost one with `ENOBUFS`, which the
/// watch counts as a change; this is defence only). 30 s.
pub const WATCHED_MAX_AGE: Duration = Duration::from_secs(30);

/// An address whose valid lifetime as the dump reported it (whole seconds, rounded up),
/// less the snapshot's age, is this short or shorter is read from a dump at most `max_age`
/// old (module docs); really left then: at least this less one second. 3 s: two seconds
/// above [`crate::holder::REFRESH_BELOW_SECS`], covering the whole second a reused snapshot
/// may over-report and a check interval.
pub const LIFETIME_MARGIN: Duration = Duration::from_secs(3);

/// A [`Kernel`] whose `addresses()` answers from a shared snapshot (see module docs).
pub struct CachedKernel<K: Kernel> {
    inner: Arc<K>,
    max_age: Duration,
    watch: Option<Arc<AddrWatch>>,
    snapshot: Mutex<Option<Snapshot>>,
}

/// One dump and what its reuse depends on.
struct Snapshot {
    /// When the dump was made (before it was sent).
    at: Instant,
    /// The watch's change count before the dump, `None` without a running watch.
    changes: Option<u64>,
    /// How long the dump may be reused while the count stays (`max_age` .. [`WATCHED_MAX_AGE`]).
    watched_for: Duration,
    /// The dump as the kernel answered it.
    all: Arc<Vec<AddrInfo>>,
    /// The dump with its lifetimes less `.0` whole seconds, built when first asked at that age.
    aged: Option<(u32, Arc<Vec<AddrInfo>>)>,
}

impl Snapshot {
    fn new(at: Instant, changes: Option<u64>, all: Vec<AddrInfo>, max_age: Duration) -> Self {
        let watched_for = match all.iter().filter_map(|a| a.valid_lft_secs).min() {
            None => WATCHED_MAX_AGE,
            Some(shortest) => Duration::from_secs(u64::from(shortest))
                .saturating_sub(LIFETIME_MARGIN)
                .clamp(max_age, WATCHED_MAX_AGE.max(max_age)),
        };
        Snapshot {
            at,
            changes,
            watched_for,
            all: Arc::new(all),
            aged: None,
        }
    }

    /// Whether the dump may still answer, given the watch's count now (`None`: no running
    /// watch) and the unwatched `max_age`.
    fn reusable(&self, changes_now: Option<u64>, max_age: Duration) -> bool {
        let age = self.at.elapsed();
        match (self.changes, changes_now) {
            (Some(then), Some(now)) if then == now => age <= self.watched_for,
            _ => age <= max_age,
        }
    }

    /// The dump with lifetimes as the kernel would report them about now (less the whole
    /// seconds since the dump; never below zero).
    fn view(&mut self) -> Arc<Vec<AddrInfo>> {
        let secs = u32::try_from(self.at.elapsed().as_secs()).unwrap_or(u32::MAX);
        if secs == 0 {
            return self.all.clone();
        }
        if let Some((at_secs, aged)) = &self.aged
            && *at_secs == secs
        {
            return aged.clone();
        }
        let aged: Arc<Vec<AddrInfo>> = Arc::new(
            self.all
                .iter()
                .map(|a| AddrInfo {
                    valid_lft_secs: a.valid_lft_secs.map(|v| v.saturating_sub(secs)),
                    preferred_lft_secs: a.preferred_lft_secs.map(|p| p.saturating_sub(secs)),
                    ..a.clone()
                })
                .collect(),
        );
        self.aged = Some((secs, aged.clone()));
        aged
    }
}

impl<K: Kernel> CachedKernel<K> {
    /// Wraps `inner`; snapshots are reused for at most `max_age`.
    pub fn new(inner: Arc<K>, max_age: Duration) -> Self {
        CachedKernel {
            inner,
            max_age,
            watch: None,
            snapshot: Mutex::new(None),
        }
    }

    /// Wraps `inner` (a kernel whose `addresses` are the namespace's addresses); snapshots
    /// are reused until `watch` counts a change, within the bounds in the module docs, and
    /// for at most `max_age` once the watch stopped.
    pub fn watched(inner: Arc<K>, max_age: Duration, watch: Arc<AddrWatch>) -> Self {
        CachedKernel {
            watch: Some(watch),
            ..Self::new(inner, max_age)
        }
    }

    /// [`CachedKernel::watched`] with a new [`AddrWatch`] of the calling thread's network
    /// namespace, or, when the watch cannot be opened (logged as a warning), an unwatched
    /// cache of `max_age`. Needs a tokio runtime.
    pub fn watched_or_aged(inner: Arc<K>, max_age: Duration) -> Self {
        match AddrWatch::open() {
            Ok(watch) => Self::watched(inner, max_age, Arc::new(watch)),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    max_age_ms = max_age.as_millis(),
                    "cannot watch the node's address changes: the shared address dump is renewed every max_age instead"
                );
                Self::new(inner, max_age)
            }
        }
    }

    async fn invalidate(&self) {
        *self.snapshot.lock().await = None;
    }

    fn changes(&self) -> Option<u64> {
        self.watch.as_ref().and_then(|w| w.changes())
    }
}

impl<K: Kernel> Kernel for CachedKernel<K> {
    async fn link_by_name(&self, name: &str) -> Result<LinkInfo, NetError> {
        self.inner.link_by_name(name).await
    }

    async fn link_by_index(&self, index: u32) -> Result<LinkInfo, NetError> {
        self.inner.link_by_index(index).await
    }

    async fn add_or_refresh(
        &self,
        ifindex: u32,
        vip: Vip,
        lifetime: Lifetime,
        skip_dad: bool,
    ) -> Result<u32, NetError> {
        let r = self
            .inner
            .add_or_refresh(ifindex, vip, lifetime, skip_dad)
            .await;
        self.invalidate().await;
        r
    }

    async fn add_or_refresh_many(
        &self,
        items: &[(u32, Vip, Lifetime)],
        skip_dad: bool,
        known: Option<&[AddrInfo]>,
    ) -> Vec<Result<u32, NetError>> {
        let r = self.inner.add_or_refresh_many(items, skip_dad, known).await;
        self.invalidate().await;
        r
    }

    async fn remove(&self, ifindex: u32, vip: Vip) -> Result<(), NetError> {
        let r = self.inner.remove(ifindex, vip).await;
        self.invalidate().await;
        r
    }

    async fn remove_many(&self, items: &[(u32, Vip)]) -> Vec<Result<(), NetError>> {
        let r = self.inner.remove_many(items).await;
        self.invalidate().await;
        r
    }

    async fn addresses(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        let fresh = self.all_addresses().await?;
        Ok(fresh
            .iter()
            .filter(|a| ifindex.is_none_or(|i| a.ifindex == i))
            .cloned()
            .collect())
    }

    async fn all_addresses(&self) -> Result<Arc<Vec<AddrInfo>>, NetError> {
        // Holding the lock across the dump makes concurrent callers wait for one dump.
        let mut snap = self.snapshot.lock().await;
        let changes = self.changes();
        if let Some(s) = snap.as_mut()
            && s.reusable(changes, self.max_age)
        {
            return Ok(s.view());
        }
        // The count read before the dump: a change while it runs limits its reuse to max_age.
        let at = Instant::now();
        let all = self.inner.addresses(None).await?;
        let fresh = snap.insert(Snapshot::new(at, changes, all, self.max_age));
        Ok(fresh.all.clone())
    }

    async fn addresses_fresh(&self, ifindex: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
        self.invalidate().await;
        self.addresses(ifindex).await
    }

    async fn choose_interface(&self, addr: IpAddr) -> Result<u32, NetError> {
        self.inner.choose_interface(addr).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Counting {
        dumps: AtomicUsize,
        /// The valid lifetime (seconds) of the one address a dump reports; `None`: forever.
        valid_lft_secs: std::sync::Mutex<Option<u32>>,
        /// A watch to count a change on while a dump runs (an address added meanwhile).
        change_during_dump: std::sync::Mutex<Option<Arc<AddrWatch>>>,
        /// When the one address ends; when set, a dump reports the time left to it in whole
        /// seconds rounded up, as the kernel does (it overrides `valid_lft_secs`).
        ends_at: std::sync::Mutex<Option<Instant>>,
    }

    impl Counting {
        fn new() -> Self {
            Counting {
                dumps: AtomicUsize::new(0),
                valid_lft_secs: std::sync::Mutex::new(None),
                change_during_dump: std::sync::Mutex::new(None),
                ends_at: std::sync::Mutex::new(None),
            }
        }

        fn dumps(&self) -> usize {
            self.dumps.load(Ordering::SeqCst)
        }
    }

    impl Kernel for Counting {
        async fn link_by_name(&self, name: &str) -> Result<LinkInfo, NetError> {
            Err(NetError::NoSuchLink { name: name.into() })
        }
        async fn link_by_index(&self, index: u32) -> Result<LinkInfo, NetError> {
            Err(NetError::NoSuchIndex { index })
        }
        async fn add_or_refresh(
            &self,
            _: u32,
            _: Vip,
            l: Lifetime,
            _: bool,
        ) -> Result<u32, NetError> {
            Ok(l.max_secs)
        }
        async fn remove(&self, _: u32, _: Vip) -> Result<(), NetError> {
            Ok(())
        }
        async fn addresses(&self, _: Option<u32>) -> Result<Vec<AddrInfo>, NetError> {
            self.dumps.fetch_add(1, Ordering::SeqCst);
            if let Some(w) = self.change_during_dump.lock().unwrap().take() {
                w.note_change();
            }
            let mut valid = *self.valid_lft_secs.lock().unwrap();
            if let Some(end) = *self.ends_at.lock().unwrap() {
                let left = end.saturating_duration_since(Instant::now());
                valid = Some(left.as_millis().div_ceil(1000) as u32);
            }
            Ok(vec![AddrInfo {
                valid_lft_secs: valid,
                preferred_lft_secs: valid.map(|_| 0),
                ..AddrInfo::plain(2, Vip::host("192.0.2.11".parse().unwrap()), true)
            }])
        }
        async fn choose_interface(&self, addr: IpAddr) -> Result<u32, NetError> {
            Err(NetError::NoInterface { addr })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_dump_serves_many_readers_until_it_ages_or_we_write() {
        let inner = Arc::new(Counting::new());
        let k = CachedKernel::new(inner.clone(), Duration::from_millis(200));
        for _ in 0..50 {
            assert_eq!(k.addresses(None).await.unwrap().len(), 1);
        }
        assert_eq!(k.addresses(Some(3)).await.unwrap().len(), 0);
        assert_eq!(inner.dumps.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(201)).await;
        k.addresses(None).await.unwrap();
        assert_eq!(inner.dumps.load(Ordering::SeqCst), 2);
        k.remove(2, Vip::host("192.0.2.10".parse().unwrap()))
            .await
            .unwrap();
        k.addresses(None).await.unwrap();
        assert_eq!(
            inner.dumps.load(Ordering::SeqCst),
            3,
            "our own write invalidates"
        );
        k.addresses_fresh(None).await.unwrap();
        assert_eq!(
            inner.dumps.load(Ordering::SeqCst),
            4,
            "a fresh read dumps although the snapshot is young"
        );
        k.addresses(None).await.unwrap();
        assert_eq!(
            inner.dumps.load(Ordering::SeqCst),
            4,
            "and the fresh dump serves the next readers"
        );
        // Readers of all addresses share the snapshot itself: no copy each.
        let (a, b) = (
            k.all_addresses().await.unwrap(),
            k.all_addresses().await.unwrap(),
        );
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(inner.dumps.load(Ordering::SeqCst), 4);
        tokio::time::sleep(Duration::from_millis(201)).await;
        let c = k.all_addresses().await.unwrap();
        assert!(!Arc::ptr_eq(&a, &c), "an aged snapshot is dumped again");
        assert_eq!(inner.dumps.load(Ordering::SeqCst), 5);
    }

    const MAX_AGE: Duration = Duration::from_millis(200);

    fn valid(all: &[AddrInfo]) -> Option<u32> {
        all[0].valid_lft_secs
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_dump_serves_until_an_address_changes_with_lifetimes_aged() {
        let inner = Arc::new(Counting::new());
        *inner.valid_lft_secs.lock().unwrap() = Some(150);
        let watch = Arc::new(AddrWatch::manual());
        let k = CachedKernel::watched(inner.clone(), MAX_AGE, watch.clone());
        assert_eq!(valid(&k.all_addresses().await.unwrap()), Some(150));
        // Ten seconds of holders' checks, every 100 ms: one dump, lifetimes counting down.
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            k.all_addresses().await.unwrap();
        }
        assert_eq!(inner.dumps(), 1, "no change: the dump is reused");
        let aged = k.all_addresses().await.unwrap();
        assert_eq!(
            valid(&aged),
            Some(140),
            "ten seconds later the address has 140 s"
        );
        assert_eq!(aged[0].preferred_lft_secs, Some(0));
        assert!(
            Arc::ptr_eq(&aged, &k.all_addresses().await.unwrap()),
            "one aged copy per second of age, not per reader"
        );
        // A change in the namespace (another program's address, an expiry): dumped again
        // once max_age has passed.
        watch.note_change();
        assert_eq!(valid(&k.all_addresses().await.unwrap()), Some(150));
        assert_eq!(inner.dumps(), 2);
        // Never longer than WATCHED_MAX_AGE without one.
        tokio::time::sleep(WATCHED_MAX_AGE).await;
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 2, "still within the bound");
        tokio::time::sleep(Duration::from_millis(1)).await;
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 3, "aged past WATCHED_MAX_AGE");
        // Our own write invalidates, watch or not.
        k.remove(2, Vip::host("192.0.2.11".parse().unwrap()))
            .await
            .unwrap();
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_during_the_dump_limits_its_reuse_to_max_age() {
        let inner = Arc::new(Counting::new());
        let watch = Arc::new(AddrWatch::manual());
        *inner.change_during_dump.lock().unwrap() = Some(watch.clone());
        let k = CachedKernel::watched(inner.clone(), MAX_AGE, watch.clone());
        k.all_addresses().await.unwrap();
        // The count moved while the kernel answered: that dump may miss the change. Within
        // max_age it is still shared (as without a watch), then dumped again.
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 1);
        tokio::time::sleep(MAX_AGE + Duration::from_millis(1)).await;
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 2);
        tokio::time::sleep(Duration::from_secs(5)).await;
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 2, "the second dump saw no change: reused");
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_near_its_end_is_read_from_young_dumps() {
        let inner = Arc::new(Counting::new());
        // 5 s left: reusable while more than LIFETIME_MARGIN (3 s) is left, i.e. 2 s.
        *inner.valid_lft_secs.lock().unwrap() = Some(5);
        let watch = Arc::new(AddrWatch::manual());
        let k = CachedKernel::watched(inner.clone(), MAX_AGE, watch);
        k.all_addresses().await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(valid(&k.all_addresses().await.unwrap()), Some(3));
        assert_eq!(inner.dumps(), 1);
        // The kernel fence's short lifetimes (2 s, refreshed every second) from now on: the
        // 200 ms dumps of an unwatched cache, never an aged copy.
        *inner.valid_lft_secs.lock().unwrap() = Some(2);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(valid(&k.all_addresses().await.unwrap()), Some(2));
        assert_eq!(inner.dumps(), 2, "3 s left: no longer reused past max_age");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(valid(&k.all_addresses().await.unwrap()), Some(2));
        assert_eq!(inner.dumps(), 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 3, "2 s left: reused for max_age only");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_watch_falls_back_to_max_age() {
        let inner = Arc::new(Counting::new());
        let watch = Arc::new(AddrWatch::manual());
        let k = CachedKernel::watched(inner.clone(), MAX_AGE, watch.clone());
        k.all_addresses().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 1);
        watch.stop();
        k.all_addresses().await.unwrap();
        assert_eq!(
            inner.dumps(),
            2,
            "the watch stopped: a second-old dump is too old"
        );
        tokio::time::sleep(MAX_AGE + Duration::from_millis(1)).await;
        k.all_addresses().await.unwrap();
        assert_eq!(inner.dumps(), 3);
    }

    /// What a holder's refresh decision relies on ([`crate::holder::REFRESH_BELOW_SECS`],
    /// one second): whatever an address's lifetime and whenever a check reads, a watched
    /// cache that sees no change reports at most one second more than the kernel would, and
    /// once the address has [`LIFETIME_MARGIN`] less one second or less really left, what a
    /// dump at most `max_age` old reported. Every lifetime from 1 to 40 s, at four offsets within its first
    /// second (the kernel's seconds are not the cache's), read every 50 ms until it ends.
    #[tokio::test(start_paused = true)]
    async fn a_reused_dump_never_hides_an_address_running_out() {
        for (secs, offset_ms) in (1..=40u64).flat_map(|s| [0, 250, 500, 750].map(|o| (s, o))) {
            let inner = Arc::new(Counting::new());
            let start = Instant::now();
            let end = start + Duration::from_secs(secs) + Duration::from_millis(offset_ms);
            *inner.ends_at.lock().unwrap() = Some(end);
            let k = CachedKernel::watched(inner.clone(), MAX_AGE, Arc::new(AddrWatch::manual()));
            while Instant::now() < end {
                let left = end - Instant::now();
                let kernel = left.as_millis().div_ceil(1000) as u32;
                let seen = valid(&k.all_addresses().await.unwrap()).unwrap();
                assert!(
                    seen <= kernel + 1,
                    "{secs}.{offset_ms} s address, {left:?} left: the cache says {seen} s, the kernel {kernel} s"
                );
                // The dump's whole seconds are rounded up: an address with LIFETIME_MARGIN
                // reported may have a second less really left, so the young dumps are
                // promised from LIFETIME_MARGIN less one second on (2 s: still a check
                // interval and max_age above the kernel reporting REFRESH_BELOW_SECS).
                if left <= LIFETIME_MARGIN - Duration::from_secs(1) {
                    let young = (left + MAX_AGE).as_millis().div_ceil(1000) as u32;
                    assert!(
                        seen <= young,
                        "{secs}.{offset_ms} s address, {left:?} left: the cache says {seen} s, a dump {MAX_AGE:?} old at most {young} s"
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(
                inner.dumps() <= 2 + (secs as usize) / 27 + 20,
                "{secs}.{offset_ms} s address: {} dumps (the last 3 s are read from 200 ms dumps, before that one dump serves)",
                inner.dumps()
            );
        }
    }
}
