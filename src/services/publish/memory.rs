//! [`MemoryStatusWriter`]: an in-memory [`StatusWriter`] for unit tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::LoadBalancerIngress;

use super::{ServiceEvent, StatusError, StatusWriter, WriteOutcome};
use crate::services::plan::model::ServiceKey;

/// What a [`MemoryStatusWriter`] holds for one Service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryServiceStatus {
    /// `status.loadBalancer.ingress`.
    pub ingress: Vec<LoadBalancerIngress>,
    /// `kube-vip.io/vipHost`.
    pub vip_host: Option<String>,
    /// Annotations written with [`StatusWriter::set_annotations`] (not `vipHost`).
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Events in order (identical repeats included).
    pub events: Vec<ServiceEvent>,
    /// Number of writes that changed something (ingress or annotation).
    pub writes: usize,
}

/// An in-memory [`StatusWriter`] for tests of the orchestration: same "only when it
/// changes" rule, no API. Services are created on first use (never [`WriteOutcome::NotFound`]).
#[derive(Debug, Clone, Default)]
pub struct MemoryStatusWriter {
    state: Arc<Mutex<HashMap<ServiceKey, MemoryServiceStatus>>>,
}

impl MemoryStatusWriter {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// What is recorded for `key` (default when nothing).
    pub fn get(&self, key: &ServiceKey) -> MemoryServiceStatus {
        self.lock().get(key).cloned().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ServiceKey, MemoryServiceStatus>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(
        &self,
        key: &ServiceKey,
        f: impl FnOnce(&mut MemoryServiceStatus) -> bool,
    ) -> WriteOutcome {
        let mut map = self.lock();
        let entry = map.entry(key.clone()).or_default();
        if f(entry) {
            entry.writes += 1;
            WriteOutcome::Written
        } else {
            WriteOutcome::Unchanged
        }
    }
}

impl StatusWriter for MemoryStatusWriter {
    async fn set_ingress(
        &self,
        key: &ServiceKey,
        ingress: Vec<LoadBalancerIngress>,
    ) -> Result<WriteOutcome, StatusError> {
        Ok(self.update(key, |s| {
            let changed = s.ingress != ingress;
            s.ingress = ingress;
            changed
        }))
    }

    async fn set_vip_host(
        &self,
        key: &ServiceKey,
        node: &str,
    ) -> Result<WriteOutcome, StatusError> {
        Ok(self.update(key, |s| {
            let changed = s.vip_host.as_deref() != Some(node);
            s.vip_host = Some(node.to_string());
            changed
        }))
    }

    async fn set_annotations(
        &self,
        key: &ServiceKey,
        annotations: &[(&'static str, String)],
    ) -> Result<WriteOutcome, StatusError> {
        Ok(self.update(key, |s| {
            let mut changed = false;
            for (k, v) in annotations {
                changed |= s.annotations.insert((*k).to_string(), v.clone()).as_ref() != Some(v);
            }
            changed
        }))
    }

    async fn clear(&self, key: &ServiceKey) -> Result<WriteOutcome, StatusError> {
        Ok(self.update(key, |s| {
            let changed = !s.ingress.is_empty() || s.vip_host.is_some();
            s.ingress.clear();
            s.vip_host = None;
            changed
        }))
    }

    async fn event(
        &self,
        key: &ServiceKey,
        _uid: Option<&str>,
        event: &ServiceEvent,
    ) -> Result<(), StatusError> {
        self.lock()
            .entry(key.clone())
            .or_default()
            .events
            .push(event.clone());
        Ok(())
    }
}
