//! The allocator's task: the election on kube-vip-cloud-provider's Lease, and while this
//! node holds it, the caches of Services and the pool ConfigMap (the Nodes: the process's
//! Node cache) and the passes of [`super::run::Allocator`].

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use super::metrics::PoolMetrics;
use super::probe::{AddressProbe, RawProbe};
use super::run::{Allocator, PassInput};
use super::settings::Settings;
use super::write::KubeServiceApi;
use crate::election::kube::KubeLeaseClient;
use crate::election::{Elector, Gates, LeaderState};
use crate::kube::client::{ClientError, ServicesClients};
use crate::kube::service::ServiceCache;
use crate::kube::service::{ANN_LOADBALANCER_IPS, ANN_REQUESTED_IP};
use crate::kube::watch::{View, spawn_reflector};
use crate::net::NetlinkKernel;
use crate::net::conflict::ConflictMonitor;
use crate::nodes::NodeCache;
use crate::obs::metrics::Metrics;

/// After a change, how long the allocator waits for more before a pass (a burst of
/// Services created at once is decided in one pass); at least as long as the last pass took.
const SETTLE: Duration = Duration::from_millis(20);

/// What the manager gives the IPAM wing.
pub struct Parts {
    /// The node's kernel (the interface an address is probed on).
    pub kernel: Arc<NetlinkKernel>,
    /// The conflict monitor of `vip_arpprobe`; `None`: addresses are not probed before
    /// they are handed out.
    pub conflict_monitor: Option<Arc<dyn ConflictMonitor>>,
    /// The metrics registry (the election's and the pools' families).
    pub metrics: Metrics,
    /// The process's Node cache (every Node): the addresses of the nodes; while this node
    /// allocates, a change of it starts a pass.
    pub nodes: NodeCache,
    /// The process's Services cache, shared with the Services wing: while this node
    /// allocates, a change of what the allocator reads of a Service ([`SERVICE_VIEW`])
    /// starts a pass.
    pub services: ServiceCache,
}

/// What the allocator reads of a Service, as a view of the process's Services cache
/// ([`crate::kube::watch::View`]): two versions are the same for it when what it reads of
/// them is ([`same_for_allocator`]). So a holder's status write or `kube-vip.io/vipHost`
/// change starts no pass (at 10 000 Services every such write started a full pass).
pub const SERVICE_VIEW: View<Service> = View {
    name: "ipam",
    same: same_for_allocator,
};

/// [`SERVICE_VIEW`]'s sameness, on two versions of a cached Service (stripped as
/// [`crate::kube::service::strip_cached_service`] strips, with the same resourceVersion):
/// equal metadata but for the annotations other than [`ANN_LOADBALANCER_IPS`] and
/// [`ANN_REQUESTED_IP`], equal spec, the same ingress addresses in the status, which is
/// what the allocator reads ([`super::view::view_of`], the finalizers, the name, UID and
/// resourceVersion its writes and Events carry). Compared in place: it runs for every
/// Service event while this node allocates (two copies of each Service before, 20 000 at a
/// 10 000-Service cold start). Pure.
fn same_for_allocator(old: &Service, new: &Service) -> bool {
    fn annotation<'a>(s: &'a Service, k: &str) -> Option<&'a String> {
        s.metadata.annotations.as_ref().and_then(|a| a.get(k))
    }
    fn ingress_ips(s: &Service) -> impl Iterator<Item = Option<&str>> {
        s.status
            .iter()
            .flat_map(|s| s.load_balancer.iter())
            .flat_map(|lb| lb.ingress.iter().flatten())
            .map(|i| i.ip.as_deref())
    }
    let ObjectMeta {
        annotations: _,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields,
        name,
        namespace,
        owner_references,
        resource_version,
        self_link,
        uid,
    } = &old.metadata;
    let n = &new.metadata;
    *creation_timestamp == n.creation_timestamp
        && *deletion_grace_period_seconds == n.deletion_grace_period_seconds
        && *deletion_timestamp == n.deletion_timestamp
        && *finalizers == n.finalizers
        && *generate_name == n.generate_name
        && *generation == n.generation
        && *labels == n.labels
        && *managed_fields == n.managed_fields
        && *name == n.name
        && *namespace == n.namespace
        && *owner_references == n.owner_references
        && *resource_version == n.resource_version
        && *self_link == n.self_link
        && *uid == n.uid
        && old.spec == new.spec
        && ingress_ips(old).eq(ingress_ips(new))
        && [ANN_LOADBALANCER_IPS, ANN_REQUESTED_IP]
            .iter()
            .all(|k| annotation(old, k) == annotation(new, k))
}

/// The running IPAM wing.
pub struct Running {
    /// The election's gates: none is ever set (all open), kept for the election's lifetime.
    _gates: Gates,
    election_stop: CancellationToken,
    elector_task: JoinHandle<crate::election::ElectionEnd>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Steps down (the Lease is released once the current pass is over) and stops.
    pub async fn stop(self) {
        self.election_stop.cancel();
        let _ = self.elector_task.await;
        self.stop.cancel();
        if let Err(e) = self.task.await {
            error!(error = %e, "IPAM task failed");
        }
    }
}

/// Starts the allocator (`svc_ipam`): it campaigns for the Lease
/// `kube-system/kube-vip-cloud-controller` and allocates while it holds it.
///
/// # Errors
/// [`ClientError`] when the clients cannot be built.
pub async fn start(settings: Settings, parts: Parts) -> Result<Running, ClientError> {
    let settings = Arc::new(settings);
    let elections = crate::election::own_runtime::election_runtime();
    let clients = crate::kube::client::services_clients(&settings.kube, elections.as_ref()).await?;
    let leases = KubeLeaseClient::new(
        clients.leases.clone(),
        &settings.lease.namespace,
        &settings.lease.name,
    );
    let gates = Gates::default();
    let (elector, leadership) =
        Elector::new(leases, settings.node_name.clone(), settings.timing, &gates);
    let elector = elector.with_metrics(&parts.metrics);
    info!(
        lease = %settings.lease,
        config_map = %settings.config_map,
        "svc_ipam: Service addresses are allocated from the ConfigMap's pools by the holder of the Lease"
    );
    let election_stop = CancellationToken::new();
    let elector_task = crate::election::own_runtime::spawn_on(
        elections.as_ref(),
        elector.run(election_stop.clone()),
    );
    let stop = CancellationToken::new();
    let pool_metrics = parts.metrics.families::<PoolMetrics>();
    let api = KubeServiceApi::new(clients.other.clone(), &settings.node_name);
    let probe = parts
        .conflict_monitor
        .map(|monitor| RawProbe::new(parts.kernel.clone(), monitor, settings.interface.clone()));
    let allocator = Allocator::new(settings.clone(), api, probe, Some(pool_metrics));
    let task = tokio::spawn(follow(
        settings,
        clients,
        ProcessCaches {
            services: parts.services,
            nodes: parts.nodes,
        },
        parts.kernel,
        leadership,
        allocator,
        stop.clone(),
    ));
    Ok(Running {
        _gates: gates,
        election_stop,
        elector_task,
        stop,
        task,
    })
}

/// Follows the leadership until `stop`: each term runs [`allocate`].
async fn follow<P: AddressProbe>(
    settings: Arc<Settings>,
    clients: ServicesClients,
    process: ProcessCaches,
    kernel: Arc<NetlinkKernel>,
    leadership: crate::election::Leadership,
    mut allocator: Allocator<KubeServiceApi, P>,
    stop: CancellationToken,
) {
    let mut state = leadership.state;
    loop {
        let term = loop {
            if let LeaderState::Leading { term, .. } = *state.borrow_and_update() {
                break term;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                r = state.changed() => if r.is_err() { return },
            }
        };
        info!(lease = %settings.lease, term, "this node allocates Service addresses");
        allocate(
            &settings,
            &clients,
            &process,
            &kernel,
            &mut state,
            term,
            &mut allocator,
        )
        .await;
        allocator.stand_down();
        let _ = leadership.dropped.send(term);
        info!(lease = %settings.lease, term, "this node no longer allocates Service addresses");
    }
}

/// The process's caches the allocator reads (shared with the other wings).
struct ProcessCaches {
    services: ServiceCache,
    nodes: NodeCache,
}

/// The caches of one term.
struct Caches {
    services: Store<Service>,
    /// The process's Services cache (its first list: [`ServiceCache`]'s `ready`).
    service_cache: ServiceCache,
    nodes: Store<Node>,
    /// The process's Node cache (its first list: [`NodeCache::ready`]).
    node_cache: NodeCache,
    config_map: Store<ConfigMap>,
    changed: Arc<Notify>,
    stop: CancellationToken,
}

impl Drop for Caches {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the term's reflector on the pool ConfigMap (until the caches are dropped); the
/// Services and the Nodes come from the process's caches `services` (woken on changes of
/// [`SERVICE_VIEW`] only) and `nodes`, whose changes wake the term like those of its own
/// cache.
fn start_caches(settings: &Settings, clients: &ServicesClients, process: &ProcessCaches) -> Caches {
    let ProcessCaches { services, nodes } = process;
    let changed = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    services.wake_on_view(SERVICE_VIEW.name, changed.clone(), stop.clone());
    nodes.wake(changed.clone(), stop.clone());
    let (config_map, writer) = reflector::store();
    spawn_reflector(
        "configmaps (ipam)",
        Api::<ConfigMap>::namespaced(clients.other.clone(), &settings.config_map.namespace),
        writer,
        changed.clone(),
        stop.clone(),
        clients.watches.clone(),
        |c: &mut ConfigMap| c.metadata.managed_fields = None,
        Some(format!("metadata.name={}", settings.config_map.name)),
    );
    Caches {
        services: services.store().clone(),
        service_cache: services.clone(),
        nodes: nodes.store().clone(),
        node_cache: nodes.clone(),
        config_map,
        changed,
        stop,
    }
}

/// Allocates while this node holds the Lease in `term`.
async fn allocate<P: AddressProbe>(
    settings: &Settings,
    clients: &ServicesClients,
    process: &ProcessCaches,
    kernel: &Arc<NetlinkKernel>,
    state: &mut watch::Receiver<LeaderState>,
    term: u64,
    allocator: &mut Allocator<KubeServiceApi, P>,
) {
    let caches = start_caches(settings, clients, process);
    let ready = async {
        let _ = tokio::join!(
            caches.service_cache.ready(),
            caches.node_cache.ready(),
            caches.config_map.wait_until_ready(),
        );
    };
    tokio::select! {
        _ = ready => {}
        _ = lost(state, term) => return,
    }
    let margin = crate::lease::FENCE_MARGIN;
    loop {
        let fence = state.clone();
        let lease_duration = settings.timing.lease_duration;
        let may_write = move || match *fence.borrow() {
            LeaderState::Leading {
                term: t,
                renewed_at,
                ..
            } => t == term && Instant::now() + margin < renewed_at + lease_duration,
            LeaderState::Following { .. } => false,
        };
        if !may_write() {
            return;
        }
        let services = caches.services.state();
        let mut nodes: Vec<(String, IpAddr)> = crate::nodes::node_addresses(&caches.nodes.state())
            .into_iter()
            .map(|(a, n)| (n, a))
            .collect();
        // This node's own addresses, also those its Node object does not publish: its probe
        // never hears itself answer for them.
        nodes.extend(
            own_addresses(kernel.as_ref())
                .await
                .into_iter()
                .map(|a| (settings.node_name.clone(), a)),
        );
        let config = caches
            .config_map
            .state()
            .first()
            .and_then(|c| c.data.clone());
        let input = PassInput {
            services: &services,
            nodes: &nodes,
            pools: config.as_ref(),
        };
        let started = Instant::now();
        let end = allocator.pass(&input, &may_write).await;
        // A pass over 10 000 Services takes tens of milliseconds: after a change, wait at
        // least as long as the last pass took, so that a stream of changes keeps the
        // allocator under half a core and each pass decides all that came in meanwhile.
        let settle = SETTLE.max(started.elapsed());
        let again = [end.again_in, allocator.retry_delay()]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            _ = caches.changed.notified() => tokio::time::sleep(settle).await,
            _ = tokio::time::sleep(again) => {}
            _ = lost(state, term) => return,
        }
    }
}

/// The addresses configured on this node that are not vipd's VIPs (empty when the kernel
/// cannot be read: the Node objects' addresses still count).
async fn own_addresses<K: crate::net::Kernel>(kernel: &K) -> Vec<IpAddr> {
    match kernel.addresses(None).await {
        Ok(addrs) => addrs
            .into_iter()
            .filter(|a| !a.ours && !a.vip.addr.is_loopback())
            .map(|a| a.vip.addr)
            .collect(),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read this node's addresses");
            Vec::new()
        }
    }
}

/// Resolves once this node no longer leads in `term`.
async fn lost(state: &mut watch::Receiver<LeaderState>, term: u64) {
    let _ = state
        .wait_for(|s| !matches!(s, LeaderState::Leading { term: t, .. } if *t == term))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
    /// The reference for [`same_for_allocator`]: keeps of a Service what the allocator reads ([`super::view::view_of`], the finalizers,
    /// the name, UID and resourceVersion its writes and Events carry): of its labels only
    /// [`crate::kube::service::LABEL_IMPLEMENTATION`] ([`crate::kube::service::strip_cached_service`]), of its annotations only
    /// [`ANN_LOADBALANCER_IPS`] and [`ANN_REQUESTED_IP`], of its status only the ingress
    /// addresses. So a holder's status write or `kube-vip.io/vipHost` change leaves the cached
    /// Service equal but for its resourceVersion and starts no pass (the cache wakes only on a
    /// change of content, [`crate::kube::watch`]): at 10 000 Services every such write started
    /// a full pass.
    fn strip_service(svc: &mut Service) {
        crate::kube::service::strip_cached_service(svc);
        crate::kube::watch::retain_keys(&mut svc.metadata.annotations, |k| {
            k == ANN_LOADBALANCER_IPS || k == ANN_REQUESTED_IP
        });
        if let Some(status) = svc.status.take() {
            let ingress = status.load_balancer.and_then(|lb| lb.ingress).map(|list| {
                list.into_iter()
                    .map(|i| LoadBalancerIngress {
                        ip: i.ip,
                        ..Default::default()
                    })
                    .collect()
            });
            svc.status = Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus { ingress }),
                ..Default::default()
            });
        }
    }

    use crate::holder::tests::FakeKernel;
    use crate::net::{AddrInfo, Vip};

    /// What a holder writes (status conditions, an ingress port, `kube-vip.io/vipHost`,
    /// another label) is stripped: the Service is cached equal to before, so its watch event
    /// starts no pass; what the allocator reads stays.
    #[test]
    fn the_allocators_services_keep_only_what_it_reads() {
        let mut svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
                "labels": {"implementation": "kube-vip", "app": "x"},
                "annotations": {
                    "kube-vip.io/loadbalancerIPs": "192.0.2.10",
                    "kube-vip.io/requestedIP": "192.0.2.10",
                    "kube-vip.io/vipHost": "node-a"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10", "ipMode": "VIP",
                "ports": [{"port": 80, "protocol": "TCP"}]}]},
                "conditions": [{"type": "x", "status": "True", "reason": "r", "message": "m",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        let before = crate::ipam::view::view_of(&svc, false, "");
        strip_service(&mut svc);
        assert_eq!(crate::ipam::view::view_of(&svc, false, ""), before);
        let expected: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
                "labels": {"implementation": "kube-vip"},
                "annotations": {
                    "kube-vip.io/loadbalancerIPs": "192.0.2.10",
                    "kube-vip.io/requestedIP": "192.0.2.10"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}
        }))
        .unwrap();
        assert_eq!(svc, expected);
    }

    /// The allocator's view of the shared Services cache: a holder's writes (vipHost,
    /// status conditions, ingress ports) and a new resourceVersion are no change for it, so
    /// they start no pass; a changed address annotation, ingress address or finalizer is.
    #[test]
    fn the_allocators_view_ignores_the_holders_writes() {
        let base: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"implementation": "kube-vip"},
                "annotations": {"kube-vip.io/loadbalancerIPs": "192.0.2.10"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}
        }))
        .unwrap();
        // The cache calls `same` with the cached version's resourceVersion on both.
        let edited = |f: &dyn Fn(&mut Service)| {
            let mut s = base.clone();
            f(&mut s);
            s
        };
        let same = SERVICE_VIEW.same;
        let holder_writes = edited(&|s| {
            s.metadata
                .annotations
                .get_or_insert_default()
                .insert("kube-vip.io/vipHost".into(), "node-b".into());
            let ingress = &mut s.status.as_mut().unwrap().load_balancer.as_mut().unwrap();
            ingress.ingress.as_mut().unwrap()[0].ip_mode = Some("VIP".into());
        });
        assert!(same(&base, &holder_writes));
        let readdressed = edited(&|s| {
            s.metadata
                .annotations
                .get_or_insert_default()
                .insert(ANN_LOADBALANCER_IPS.into(), "192.0.2.11".into());
        });
        assert!(!same(&base, &readdressed));
        let ingress_gone = edited(&|s| s.status = None);
        assert!(!same(&base, &ingress_gone));
        let finalized = edited(&|s| {
            s.metadata.finalizers = Some(vec!["service.kubernetes.io/load-balancer-cleanup".into()])
        });
        assert!(!same(&base, &finalized));
    }

    /// The in-place sameness says what comparing the two versions stripped as the
    /// reference [`strip_service`] strips says, for every change of a field the allocator
    /// reads and of fields it does not.
    #[test]
    fn the_allocators_sameness_is_the_stripped_comparison() {
        let base: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
                "labels": {"implementation": "kube-vip"},
                "annotations": {"kube-vip.io/loadbalancerIPs": "192.0.2.10",
                    "kube-vip.io/vipHost": "node-a"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}],
                "ipFamilies": ["IPv4"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10", "ipMode": "VIP"}]},
                "conditions": [{"type": "x", "status": "True", "reason": "r", "message": "m",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        type Edit = Box<dyn Fn(&mut Service)>;
        fn annotate(key: &'static str, value: &'static str) -> Edit {
            Box::new(move |s| {
                s.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(key.into(), value.into());
            })
        }
        fn ingress(s: &mut Service) -> &mut Vec<LoadBalancerIngress> {
            let lb = s.status.as_mut().unwrap().load_balancer.as_mut().unwrap();
            lb.ingress.as_mut().unwrap()
        }
        let edits: Vec<(&str, Edit)> = vec![
            ("nothing", Box::new(|_| {})),
            ("vipHost", annotate("kube-vip.io/vipHost", "node-b")),
            (
                "address annotation",
                annotate(ANN_LOADBALANCER_IPS, "192.0.2.11"),
            ),
            (
                "requested address",
                annotate(ANN_REQUESTED_IP, "192.0.2.12"),
            ),
            (
                "no annotations",
                Box::new(|s| s.metadata.annotations = None),
            ),
            ("ingress ipMode", Box::new(|s| ingress(s)[0].ip_mode = None)),
            (
                "ingress address",
                Box::new(|s| ingress(s)[0].ip = Some("192.0.2.13".into())),
            ),
            (
                "second ingress",
                Box::new(|s| {
                    ingress(s).push(LoadBalancerIngress {
                        ip: Some("192.0.2.14".into()),
                        ..Default::default()
                    })
                }),
            ),
            (
                "conditions",
                Box::new(|s| s.status.as_mut().unwrap().conditions = None),
            ),
            ("finalizers", Box::new(|s| s.metadata.finalizers = None)),
            ("label", Box::new(|s| s.metadata.labels = None)),
            (
                "deleting",
                Box::new(|s| {
                    s.metadata.deletion_timestamp = s.metadata.creation_timestamp.clone();
                }),
            ),
            ("uid", Box::new(|s| s.metadata.uid = Some("u2".into()))),
            (
                "spec",
                Box::new(|s| s.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.15".into())),
            ),
            (
                "family",
                Box::new(|s| s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into()])),
            ),
        ];
        let stripped = |s: &Service| {
            let mut s = s.clone();
            strip_service(&mut s);
            s
        };
        let mut differ = 0;
        for (what, edit) in &edits {
            let mut new = base.clone();
            edit(&mut new);
            let reference = stripped(&base) == stripped(&new);
            assert_eq!(same_for_allocator(&base, &new), reference, "{what}");
            differ += usize::from(!reference);
        }
        assert_eq!(differ, 11, "the edits the allocator reads");
    }

    /// The allocator's own node answers its probe for none of its addresses, so they count
    /// as used from the kernel: eth0's address, not vipd's VIPs (the trial handed a node its
    /// own eth0 address when no Node object published it).
    #[tokio::test]
    async fn this_nodes_own_addresses_come_from_the_kernel_without_vipds_vips() {
        let kernel = FakeKernel::with_eth0();
        kernel.0.lock().unwrap().addrs.push(AddrInfo::plain(
            2,
            Vip::new("192.0.2.50".parse().unwrap(), 32).unwrap(),
            true,
        ));
        assert_eq!(
            own_addresses(kernel.as_ref()).await,
            vec!["192.0.2.11".parse::<IpAddr>().unwrap()]
        );
    }
}
