//! [`CachedKernel`]: shares one address dump between many VIP holders.
//!
//! With per-Service elections a node runs one VIP holder per Service, each checking its
//! addresses every check interval. Instead of one `RTM_GETADDR` dump per holder per check,
//! holders read a snapshot at most `max_age` old; vipd's own adds and removes invalidate it so
//! a holder always sees its own changes.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{AddrInfo, Kernel, Lifetime, LinkInfo, NetError, Vip};

/// A [`Kernel`] whose `addresses()` answers from a shared snapshot (see module docs).
pub struct CachedKernel<K: Kernel> {
    inner: Arc<K>,
    max_age: Duration,
    snapshot: Mutex<Option<(Instant, Arc<Vec<AddrInfo>>)>>,
}

impl<K: Kernel> CachedKernel<K> {
    /// Wraps `inner`; snapshots are reused for at most `max_age`.
    pub fn new(inner: Arc<K>, max_age: Duration) -> Self {
        CachedKernel {
            inner,
            max_age,
            snapshot: Mutex::new(None),
        }
    }

    async fn invalidate(&self) {
        *self.snapshot.lock().await = None;
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
    ) -> Vec<Result<u32, NetError>> {
        let r = self.inner.add_or_refresh_many(items, skip_dad).await;
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
        match &*snap {
            Some((at, all)) if at.elapsed() <= self.max_age => Ok(all.clone()),
            _ => {
                let all = Arc::new(self.inner.addresses(None).await?);
                *snap = Some((Instant::now(), all.clone()));
                Ok(all)
            }
        }
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
            Ok(vec![AddrInfo::plain(
                2,
                Vip::host("192.0.2.11".parse().unwrap()),
                false,
            )])
        }
        async fn choose_interface(&self, addr: IpAddr) -> Result<u32, NetError> {
            Err(NetError::NoInterface { addr })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_dump_serves_many_readers_until_it_ages_or_we_write() {
        let inner = Arc::new(Counting {
            dumps: AtomicUsize::new(0),
        });
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
}
