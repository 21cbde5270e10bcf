//! What every group task of the Services wing shares ([`Shared`]), built once by the
//! runtime.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::Store;
use tokio::sync::watch;

use super::publish::KubeStatusWriter;
use super::sync::*;
use crate::election::kube::LeaseHub;
use crate::holder::HolderConfig;
use crate::lease::Timing;
use crate::net::{Announcer, Kernel};
use crate::nodes::eligibility::Ineligible;
use crate::obs::metrics::Metrics;
use crate::obs::readiness::Readiness;
use crate::services::plan::desired::{LeaseRef, Mode};

/// Everything the group tasks share.
pub(super) struct Shared<K: Kernel, A: Announcer> {
    pub(super) node: String,
    /// Where passes report the egress facts (`Parts::egress`).
    pub(super) egress: Option<crate::kube::service::EgressTx>,
    /// How Services are elected: which leases are shared (the one lease for all, the
    /// shard leases) and which are Services' own ([`Self::per_service`]).
    pub(super) mode: Mode,
    pub(super) timing: Timing,
    pub(super) holder_cfg: HolderConfig,
    pub(super) kernel: Arc<K>,
    pub(super) announcer: Arc<A>,
    /// For Lease reads and writes only (see `crate::kube::client::ServicesClients`).
    pub(super) lease_client: kube::Client,
    /// Where the group electors run: the election runtime `lease_client` was built on
    /// ([`crate::election::own_runtime`]); `None`: the current runtime (tests).
    pub(super) elections: Option<tokio::runtime::Handle>,
    pub(super) hub: LeaseHub,
    pub(super) status: KubeStatusWriter,
    pub(super) services: Store<Service>,
    pub(super) metrics: Metrics,
    /// `/readyz`: a lease written under this node's identity by another process fails it.
    pub(super) readiness: Readiness,
    /// Bumped after every pass over the Services cache: group tasks then compare their
    /// Services' status with the cache (no API call when it matches) and restore it.
    pub(super) services_seen: watch::Sender<u64>,
    /// Why this node may not announce Service VIPs (see [`Parts::ineligible`]).
    pub(super) ineligible: watch::Receiver<Option<Ineligible>>,
    /// `svc_healthcheck`, `svc_healthcheck_hold` ([`super::health`]).
    pub(super) health: super::health::HealthSettings,
    /// The Service leases this node holds: spreads them over the nodes
    /// ([`crate::election::spread`]); under shard leases, the shards only.
    pub(super) spread: Arc<crate::election::spread::Spread>,
    /// Under shard leases, the own leases beside the shards (`vipd-local.*`, a
    /// `kube-vip.io/leaseName`), spread apart with the per-Service rules: counted with the
    /// shards, a few hundred of them made every node's fair share of shards hundreds, and
    /// the share balanced nothing. Otherwise the same as [`Self::spread`].
    pub(super) own_spread: Arc<crate::election::spread::Spread>,
    /// The Service leases' API outages, logged once for all of them
    /// ([`crate::election::outage`]).
    pub(super) outage: crate::election::outage::ApiOutage,
    /// The peer protocol (`svc_ridethrough`): every Service lease's elector rides through
    /// API outages with it.
    pub(super) ride: Option<crate::peer::node::PeerNode>,
    /// The DHCP client of Services whose address is `0.0.0.0` / `::`: starts the clients
    /// of the groups this node leads;
    /// `None`: DHCP Services get no client.
    pub(super) dhcp: Option<Arc<dyn crate::dhcp::Dhcp>>,
    /// `svc_failback_holddown` when `svc_failback` is on: every Service lease's elector fails
    /// back to more preferred nodes ([`crate::election::failback`]); `None`: off.
    pub(super) failback: Option<Duration>,
    /// Service security (`enable_service_security`): the groups report the Services they
    /// announce to it; `None`: off.
    pub(super) security: Option<Arc<super::security::Security>>,
}

impl<K: Kernel, A: Announcer> Shared<K, A> {
    /// Whether `lease` is its Services' own (per-Service election, an
    /// `externalTrafficPolicy: Local` Service's beside shared leases, an annotated common
    /// lease): Events about its Services. A shared lease's (global, shard) are about the
    /// Lease ([`Mode::is_shared`]).
    pub(super) fn per_service(&self, lease: &LeaseRef) -> bool {
        !self.mode.is_shared(lease)
    }

    /// The spread `lease`'s elector counts in: [`Self::spread`] for a shared lease (a shard,
    /// the global lease) and under per-Service leases, [`Self::own_spread`] for an own
    /// lease beside shared ones.
    pub(super) fn spread_for(&self, lease: &LeaseRef) -> Arc<crate::election::spread::Spread> {
        match self.per_service(lease) {
            true => self.own_spread.clone(),
            false => self.spread.clone(),
        }
    }

    /// The Services wing's metric families.
    pub(super) fn service_metrics(&self) -> Arc<super::metrics::ServiceMetrics> {
        self.metrics.families()
    }

    /// The status side's view of this node, the cache and the writer.
    pub(super) fn status_ctx(&self) -> StatusCtx<'_, KubeStatusWriter> {
        StatusCtx {
            node: &self.node,
            services: &self.services,
            writer: &self.status,
            every_node: !self.mode.elects(),
        }
    }
}
