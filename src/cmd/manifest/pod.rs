//! The static Pod and the DaemonSet (typed k8s-openapi objects).
//!
//! Shape (kube-vip's, made safer): `hostNetwork`, `args: [manager]`, the environment of
//! [`Deployment::env`] with every value a string and `vip_nodename` from `spec.nodeName`,
//! capabilities `NET_ADMIN` + `NET_RAW` + `NET_BIND_SERVICE` (the DHCPv6 client's port 546)
//! added and `ALL` dropped (no `privileged`; with `--dhcpServices` privileged, for the
//! sysctls of the macvlans vipd creates, and with `--table`, for `/dev/net/tun`), a
//! read-only root filesystem, the kubeconfig mounted read-only from a `hostPath`,
//! liveness (`/healthz`) and readiness (`/readyz`) probes on the admin endpoint, resource
//! requests and a memory limit, priority class `system-node-critical`, no `status`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EnvVar, EnvVarSource, HTTPGetAction, HostPathVolumeSource,
    NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector,
    Pod, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecurityContext, Toleration,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{APP_NAME, Access, Deployment, EnvValue, ManifestError, to_yaml_stream};

/// CPU request of the container (millicores).
pub(crate) const CPU_REQUEST: &str = "20m";
/// Memory request of the container.
pub(crate) const MEMORY_REQUEST: &str = "32Mi";
/// Memory limit of the container (no CPU limit: throttling would delay lease renewals).
pub(crate) const MEMORY_LIMIT: &str = "128Mi";
/// Seconds the kubelet waits after SIGTERM (vipd drops its VIPs and releases within ~2 s).
pub(crate) const TERMINATION_GRACE_SECONDS: i64 = 10;
/// Name of the kubeconfig volume.
pub(crate) const KUBECONFIG_VOLUME: &str = "kubeconfig";
/// Labels of every generated workload object.
pub fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app.kubernetes.io/name".to_string(), APP_NAME.to_string())])
}

fn env_vars(plan: &Deployment) -> Vec<EnvVar> {
    plan.env
        .iter()
        .map(|(name, v)| match v {
            EnvValue::Text(t) => EnvVar {
                name: (*name).to_string(),
                value: Some(t.clone()),
                value_from: None,
            },
            EnvValue::NodeName => EnvVar {
                name: (*name).to_string(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: Some("v1".into()),
                        field_path: "spec.nodeName".into(),
                    }),
                    ..Default::default()
                }),
            },
        })
        .collect()
}

fn probe(plan: &Deployment, path: &str, period: i32) -> Option<Probe> {
    let port = plan.admin_port?;
    Some(Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::Int(i32::from(port)),
            host: plan.admin_host.clone(),
            scheme: Some("HTTP".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(3),
        success_threshold: Some(1),
        ..Default::default()
    })
}

/// The Pod spec shared by the static Pod and the DaemonSet template.
pub(crate) fn pod_spec(plan: &Deployment) -> PodSpec {
    let (volumes, mounts, service_account) = match &plan.access {
        Access::Kubeconfig {
            host_path,
            mount_path,
        } => (
            Some(vec![Volume {
                name: KUBECONFIG_VOLUME.into(),
                host_path: Some(HostPathVolumeSource {
                    path: host_path.clone(),
                    type_: Some("File".into()),
                }),
                ..Default::default()
            }]),
            Some(vec![VolumeMount {
                name: KUBECONFIG_VOLUME.into(),
                mount_path: mount_path.clone(),
                read_only: Some(true),
                ..Default::default()
            }]),
            None,
        ),
        Access::InCluster => (None, None, Some(APP_NAME.to_string())),
    };
    let container = Container {
        name: APP_NAME.into(),
        image: Some(plan.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(vec!["manager".into()]),
        env: Some(env_vars(plan)),
        security_context: Some(security_context(plan.privileged)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity(CPU_REQUEST.into())),
                ("memory".to_string(), Quantity(MEMORY_REQUEST.into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity(MEMORY_LIMIT.into()),
            )])),
            ..Default::default()
        }),
        liveness_probe: probe(plan, "/healthz", 10),
        readiness_probe: probe(plan, "/readyz", 5),
        volume_mounts: mounts,
        ..Default::default()
    };
    // With a host kubeconfig the pod needs no ServiceAccount token: do not mount one.
    let automount = match plan.access {
        Access::Kubeconfig { .. } => Some(false),
        Access::InCluster => None,
    };
    PodSpec {
        containers: vec![container],
        automount_service_account_token: automount,
        host_network: Some(true),
        priority_class_name: Some("system-node-critical".into()),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        service_account_name: service_account,
        volumes,
        ..Default::default()
    }
}

fn meta(plan: &Deployment) -> ObjectMeta {
    ObjectMeta {
        name: Some(APP_NAME.into()),
        namespace: Some(plan.namespace.clone()),
        labels: Some(labels()),
        ..Default::default()
    }
}

/// The static Pod.
pub fn pod(plan: &Deployment) -> Pod {
    Pod {
        metadata: meta(plan),
        spec: Some(pod_spec(plan)),
        status: None,
    }
}

/// Tolerations of control-plane taints (any effect), as kube-vip's `--taint`.
pub(crate) fn control_plane_tolerations() -> Vec<Toleration> {
    ["NoSchedule", "NoExecute"]
        .iter()
        .map(|effect| Toleration {
            effect: Some((*effect).to_string()),
            operator: Some("Exists".into()),
            ..Default::default()
        })
        .collect()
}

/// Required node affinity: `node-role.kubernetes.io/control-plane` or (older clusters)
/// `node-role.kubernetes.io/master` exists.
pub(crate) fn control_plane_affinity() -> Affinity {
    let term = |key: &str| NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: key.to_string(),
            operator: "Exists".into(),
            values: None,
        }]),
        match_fields: None,
    };
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![
                    term("node-role.kubernetes.io/control-plane"),
                    term("node-role.kubernetes.io/master"),
                ],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The DaemonSet (tolerations + control-plane affinity when [`Deployment::taint`]).
pub fn daemonset(plan: &Deployment) -> DaemonSet {
    let mut spec = pod_spec(plan);
    if plan.taint {
        spec.tolerations = Some(control_plane_tolerations());
        spec.affinity = Some(control_plane_affinity());
    }
    DaemonSet {
        metadata: meta(plan),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    ..Default::default()
                }),
                spec: Some(spec),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// `vipd manifest pod` output.
///
/// # Errors
/// [`ManifestError::Yaml`].
pub(crate) fn pod_yaml(plan: &Deployment) -> Result<String, ManifestError> {
    to_yaml_stream(&[pod(plan)])
}

/// `vipd manifest daemonset` output.
///
/// # Errors
/// [`ManifestError::Yaml`].
pub(crate) fn daemonset_yaml(plan: &Deployment) -> Result<String, ManifestError> {
    to_yaml_stream(&[daemonset(plan)])
}

/// The container's security context: capabilities `NET_ADMIN`, `NET_RAW` and
/// `NET_BIND_SERVICE` (the DHCPv6 client's UDP port 546), everything else dropped, no
/// privilege escalation, read-only root. With `privileged` ([`Deployment::privileged`]) the
/// container is privileged instead. For DHCP Services: vipd writes the sysctls of the
/// macvlans it creates (`/proc/sys/net/*/conf/<macvlan>/`: `arp_ignore`, `arp_announce`,
/// `rp_filter`, IPv6 `accept_ra`/`autoconf`/`accept_dad`), and container runtimes mount
/// `/proc/sys` read-only in unprivileged containers; there vipd refuses a macvlan whose
/// inherited defaults differ (a `DHCPFailed` Warning), which is the case on a stock host
/// (`arp_ignore` defaults to 0). For routing-table mode: every IPv4 VIP route sits on a TUN
/// device vipd opens through `/dev/net/tun`, which the runtime gives only a privileged
/// container, and vipd sets `net.ipv6.route.gc_interval` (docs/design.md, "The route
/// fence").
fn security_context(privileged: bool) -> SecurityContext {
    if privileged {
        return SecurityContext {
            privileged: Some(true),
            read_only_root_filesystem: Some(true),
            ..Default::default()
        };
    }
    SecurityContext {
        capabilities: Some(Capabilities {
            add: Some(vec![
                "NET_ADMIN".into(),
                "NET_RAW".into(),
                // The DHCPv6 client's UDP port 546 (DHCP mode, `::` Services).
                "NET_BIND_SERVICE".into(),
            ]),
            drop: Some(vec!["ALL".into()]),
        }),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        ..Default::default()
    }
}
