//! `vipd manifest rbac`: ServiceAccount, ClusterRole and ClusterRoleBinding with exactly the
//! API verbs vipd calls, nothing more. [`required_permissions`] is also what
//! `vipd preflight` checks with SelfSubjectAccessReviews.

use clap::Args;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{APP_NAME, ManifestError, parse_go_bool, pod::labels};

/// Name of the ClusterRole (kube-vip's is `system:kube-vip-role`).
pub const CLUSTER_ROLE: &str = "system:vipd-role";
/// Name of the ClusterRoleBinding (kube-vip's is `system:kube-vip-binding`).
pub const CLUSTER_ROLE_BINDING: &str = "system:vipd-binding";

/// One API permission vipd needs: `verbs` on `resource` (with optional `subresource`) of API
/// group `group` (`""` = core).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// Resource, plural (e.g. `leases`).
    pub resource: &'static str,
    /// Subresource (e.g. `status`), empty for none.
    pub subresource: &'static str,
    /// Verbs, as RBAC spells them.
    pub verbs: &'static [&'static str],
    /// Which part of vipd uses it (for preflight's table).
    pub used_for: &'static str,
}

impl Permission {
    /// `resource` or `resource/subresource`, as an RBAC rule names it.
    pub fn resource_name(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// Every API call vipd makes: Lease election (get/create/update, list+watch for the watch,
/// delete for per-Service leases), Services (watch; update/patch for annotations and
/// `status.loadBalancer`), Endpoints and EndpointSlices (read: local endpoints), Events
/// (create/patch), Nodes (read; `patch` only with `enable_node_labeling`).
pub fn required_permissions(node_labeling: bool) -> Vec<Permission> {
    vec![
        Permission {
            group: "coordination.k8s.io",
            resource: "leases",
            subresource: "",
            verbs: &["get", "list", "watch", "create", "update", "delete"],
            used_for: "leader election",
        },
        Permission {
            group: "",
            resource: "services",
            subresource: "",
            verbs: &["get", "list", "watch", "update", "patch"],
            used_for: "LoadBalancer Services",
        },
        Permission {
            group: "",
            resource: "services",
            subresource: "status",
            verbs: &["update", "patch"],
            used_for: "Service status.loadBalancer",
        },
        Permission {
            group: "",
            resource: "endpoints",
            subresource: "",
            verbs: &["get", "list", "watch"],
            used_for: "local endpoints (externalTrafficPolicy: Local)",
        },
        Permission {
            group: "discovery.k8s.io",
            resource: "endpointslices",
            subresource: "",
            verbs: &["get", "list", "watch"],
            used_for: "local endpoints (externalTrafficPolicy: Local)",
        },
        Permission {
            group: "",
            resource: "events",
            subresource: "",
            verbs: &["create", "patch"],
            used_for: "Events on Services",
        },
        Permission {
            group: "",
            resource: "nodes",
            subresource: "",
            verbs: if node_labeling {
                &["get", "list", "watch", "patch"]
            } else {
                &["get", "list", "watch"]
            },
            used_for: "node addresses and labels",
        },
    ]
}

/// `vipd manifest rbac` flags.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct RbacArgs {
    /// Namespace of the ServiceAccount [default: kube-system]
    #[arg(
        long = "namespace",
        short = 'n',
        value_name = "NAMESPACE",
        default_value = "kube-system"
    )]
    pub namespace: String,
    /// Also allow `patch` on nodes (for enable_node_labeling)
    #[arg(long = "enableNodeLabeling", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub enable_node_labeling: Option<String>,
}

/// The ClusterRole: one rule per API group, resources with the same verbs grouped.
pub fn cluster_role(node_labeling: bool) -> ClusterRole {
    let rules = required_permissions(node_labeling)
        .into_iter()
        .map(|p| PolicyRule {
            api_groups: Some(vec![p.group.to_string()]),
            resources: Some(vec![p.resource_name()]),
            verbs: p.verbs.iter().map(|v| (*v).to_string()).collect(),
            ..Default::default()
        })
        .collect();
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(CLUSTER_ROLE.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(rules),
        aggregation_rule: None,
    }
}

/// The ServiceAccount `vipd` in `namespace`.
pub fn service_account(namespace: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: ObjectMeta {
            name: Some(APP_NAME.into()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A ClusterRoleBinding of [`CLUSTER_ROLE`] to `subjects`, named `name`.
pub fn binding(name: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: CLUSTER_ROLE.into(),
        },
        subjects: Some(subjects),
    }
}

/// The ClusterRoleBinding of [`CLUSTER_ROLE`] to the ServiceAccount `vipd` in `namespace`.
pub fn service_account_binding(namespace: &str) -> ClusterRoleBinding {
    binding(
        CLUSTER_ROLE_BINDING,
        vec![Subject {
            kind: "ServiceAccount".into(),
            name: APP_NAME.into(),
            namespace: Some(namespace.to_string()),
            api_group: None,
        }],
    )
}

/// `vipd manifest rbac` output: ServiceAccount, ClusterRole, ClusterRoleBinding.
///
/// # Errors
/// [`ManifestError::Invalid`] for a bad `--enableNodeLabeling`; [`ManifestError::Yaml`].
pub fn rbac_yaml(args: &RbacArgs) -> Result<String, ManifestError> {
    let labeling = args
        .enable_node_labeling
        .as_deref()
        .map(|v| parse_go_bool("enableNodeLabeling", v))
        .transpose()?
        .unwrap_or(false);
    let mut out = super::to_yaml_stream(&[service_account(&args.namespace)])?;
    out.push_str(&super::to_yaml_stream(&[cluster_role(labeling)])?);
    out.push_str(&super::to_yaml_stream(&[service_account_binding(
        &args.namespace,
    )])?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_patch_only_with_labeling() {
        let has_patch = |l| {
            cluster_role(l).rules.unwrap().iter().any(|r| {
                r.resources.as_ref().unwrap()[0] == "nodes" && r.verbs.contains(&"patch".into())
            })
        };
        assert!(!has_patch(false));
        assert!(has_patch(true));
    }

    #[test]
    fn no_wildcards_and_no_secrets() {
        for r in cluster_role(true).rules.unwrap() {
            assert!(!r.verbs.iter().any(|v| v == "*"));
            for res in r.resources.unwrap() {
                assert!(res != "*" && res != "secrets", "{res}");
            }
        }
    }
}
