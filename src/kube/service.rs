//! The words a `type: LoadBalancer` Service carries that more than one wing reads: kube-vip's
//! and kube-vip-cloud-provider's annotation and label names, and which `loadBalancerClass`
//! vipd serves. The Services wing announces by them; the IPAM wing allocates by them.

/// Default `lb_class_name` (kube-vip's and kube-vip-cloud-provider's class,
/// `kube-vip.io/kube-vip-class`).
pub const DEFAULT_LB_CLASS_NAME: &str = "kube-vip.io/kube-vip-class";

/// `kube-vip.io/loadbalancerIPs`: comma-separated IPv4/IPv6 addresses of a Service
/// (kube-vip `LoadbalancerIPAnnotation`). Wins over `spec.loadBalancerIP`.
pub const ANN_LOADBALANCER_IPS: &str = "kube-vip.io/loadbalancerIPs";
/// `kube-vip.io/ignore`: the value `"true"` (exactly) makes kube-vip and vipd skip the
/// Service (kube-vip `LoadbalancerIgnore`).
pub const ANN_IGNORE: &str = "kube-vip.io/ignore";
/// `kube-vip.io/serviceInterface`: interface to put this Service's addresses on
/// (kube-vip `ServiceInterface`); overrides `vip_servicesinterface`. Written by
/// kube-vip-cloud-provider from its `interface-<namespace>` / `interface-global` keys.
pub const ANN_SERVICE_INTERFACE: &str = "kube-vip.io/serviceInterface";
/// `kube-vip.io/requestedIP`: address last leased by DHCP, asked for again on restart
/// (kube-vip `RequestedIP`).
pub const ANN_REQUESTED_IP: &str = "kube-vip.io/requestedIP";
/// The label kube-vip-cloud-provider puts on every Service it handled
/// (`implementation=kube-vip`, its `ImplementationLabelKey` / `ImplementationLabelValue`).
pub const LABEL_IMPLEMENTATION: (&str, &str) = ("implementation", "kube-vip");
/// The finalizer Kubernetes' service controller (which runs kube-vip-cloud-provider) puts on
/// the `type: LoadBalancer` Services it handles, and removes once their load balancer is
/// gone (k8s.io/cloud-provider `servicehelper.LoadBalancerCleanupFinalizer`).
pub const FINALIZER_LB_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";

/// The process's one cache of Services (one list+watch, [`crate::kube::watch::SharedCache`]),
/// read by the Services wing and by the allocator (`svc_ipam`).
pub type ServiceCache = crate::kube::watch::SharedCache<k8s_openapi::api::core::v1::Service>;

/// Starts the process's one list+watch of Services in `namespace` (`svc_namespace`; `None`:
/// every namespace) on `client` until `stop`, objects stripped with [`strip_cached_service`],
/// the watch tracked in `activity` as `services`; `views`: the narrower changes some readers
/// wake on (the allocator's). Errors and back-off: see [`crate::kube::watch::spawn_shared`].
/// RBAC: `list` and `watch` on services.
pub fn start_cache(
    client: &kube::Client,
    namespace: Option<&str>,
    activity: crate::obs::readiness::WatchActivity,
    stop: tokio_util::sync::CancellationToken,
    views: &[crate::kube::watch::View<k8s_openapi::api::core::v1::Service>],
) -> ServiceCache {
    crate::kube::watch::spawn_shared(
        "services",
        crate::kube::watch::scoped_api(client, namespace),
        strip_cached_service,
        None,
        activity,
        stop,
        views,
    )
}

/// The prefixes of every Service annotation a part of vipd reads: kube-vip's and vipd's own.
/// The Services cache keeps no other annotation ([`strip_cached_service`]); a reader of an
/// annotation outside them adds its prefix here.
pub const READ_ANNOTATION_PREFIXES: [&str; 2] = ["kube-vip.io/", "vipd.io/"];

/// Whether the Services cache keeps the annotation `name` (it starts with one of
/// [`READ_ANNOTATION_PREFIXES`]).
pub fn cached_annotation(name: &str) -> bool {
    READ_ANNOTATION_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Keeps of a Service what a reader of [`ServiceCache`] reads: what
/// [`crate::kube::watch::strip_service`] keeps, of the labels only [`LABEL_IMPLEMENTATION`]
/// (the allocator's), of the annotations only kube-vip's and vipd's ([`cached_annotation`]:
/// a chart's, a GitOps tool's or another load balancer's annotations are never read; no
/// annotation left: none at all).
pub fn strip_cached_service(svc: &mut k8s_openapi::api::core::v1::Service) {
    crate::kube::watch::strip_service(svc, |k| k == LABEL_IMPLEMENTATION.0);
    crate::kube::watch::retain_keys(&mut svc.metadata.annotations, cached_annotation);
}

/// The prefix of kube-vip's egress annotations (`kube-vip.io/egress`,
/// `kube-vip.io/egress-ipv6`, `kube-vip.io/egress-denied-networks`, ...; kube-vip
/// pkg/kubevip/annotations.go): a Service carrying any of them is reported to the egress
/// wing with them.
pub const ANN_EGRESS_PREFIX: &str = "kube-vip.io/egress";

/// What the Services wing reports about one Service with egress annotations, for the
/// egress wing: the Service's VIPs, its egress annotations and this node's endpoints of it.
/// Sent as a whole list on every change (`tokio::sync::watch`), sorted by Service.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EgressFacts {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// Its annotations whose name starts with [`ANN_EGRESS_PREFIX`], name to value.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Its VIPs as the Services wing accepted them (no DHCP placeholder `0.0.0.0` / `::`).
    pub vips: Vec<std::net::IpAddr>,
    /// `spec.externalTrafficPolicy` is `Local`.
    pub etp_local: bool,
    /// The addresses of its endpoints on this node, ready or not (a Pod's first seconds
    /// before it is Ready count), sorted, without duplicates.
    pub local_endpoints: Vec<std::net::IpAddr>,
}

/// What the Services wing reports to the egress wing on every change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EgressReport {
    /// The Services with egress annotations, sorted by Service.
    pub services: Vec<EgressFacts>,
    /// The pod CIDRs of every Node (`spec.podCIDRs`, else `spec.podCIDR`), sorted, without
    /// duplicates (kube-vip discovers them the same way when `egress_podcidr` is unset).
    pub node_pod_cidrs: Vec<ipnet::IpNet>,
}

/// The sender of the [`EgressReport`], replaced when it changes (the Services wing sends,
/// the egress wing follows; the manager wires them).
pub type EgressTx = tokio::sync::watch::Sender<std::sync::Arc<EgressReport>>;

/// Whether `svc` is `type: LoadBalancer` (`spec.type`; a Service without a spec or a type
/// is not). Pure.
pub fn is_load_balancer(svc: &k8s_openapi::api::core::v1::Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// Whether vipd serves a Service of `class` (`spec.loadBalancerClass`; `None`: unset):
/// a class equal to `lb_class_name`, or no class unless `lb_class_only` (kube-vip's
/// `lb_class_only` / `lb_class_name`).
pub fn serves_class(class: Option<&str>, lb_class_only: bool, lb_class_name: &str) -> bool {
    match class {
        Some(c) => c == lb_class_name,
        None => !lb_class_only,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_served() {
        let name = DEFAULT_LB_CLASS_NAME;
        assert!(serves_class(None, false, name));
        assert!(!serves_class(None, true, name));
        assert!(serves_class(Some(name), true, name));
        assert!(serves_class(Some(name), false, name));
        assert!(!serves_class(Some("metallb.io/metallb"), false, name));
    }

    /// The cache keeps kube-vip's and vipd's annotations and drops the others; a Service
    /// with only others keeps none at all.
    #[test]
    fn the_cache_keeps_only_the_annotations_vipd_reads() {
        let svc = |annotations: serde_json::Value| -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "default", "annotations": annotations},
                "spec": {"type": "LoadBalancer"}
            }))
            .unwrap()
        };
        let mut s = svc(serde_json::json!({
            ANN_LOADBALANCER_IPS: "192.0.2.10",
            "vipd.io/healthcheck": "tcp:80",
            "meta.helm.sh/release-name": "web",
            "external-dns.alpha.kubernetes.io/hostname": "web.example.",
            "kube-vip.io": "no slash: not kube-vip's",
        }));
        strip_cached_service(&mut s);
        let kept: Vec<String> = s
            .metadata
            .annotations
            .unwrap_or_default()
            .into_keys()
            .collect();
        assert_eq!(kept, [ANN_LOADBALANCER_IPS, "vipd.io/healthcheck"]);
        let mut s = svc(serde_json::json!({"meta.helm.sh/release-name": "web"}));
        strip_cached_service(&mut s);
        assert_eq!(s.metadata.annotations, None);
        for name in [
            ANN_LOADBALANCER_IPS,
            ANN_IGNORE,
            ANN_SERVICE_INTERFACE,
            ANN_REQUESTED_IP,
        ] {
            assert!(cached_annotation(name), "{name}");
        }
        assert!(cached_annotation(&format!("{ANN_EGRESS_PREFIX}-ipv6")));
    }
}
