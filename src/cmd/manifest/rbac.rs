//! `vipd manifest rbac`: ServiceAccount, ClusterRole and ClusterRoleBinding with exactly the
//! API calls vipd makes, nothing more.
//!
//! [`API_CALLS`] (in `src/kube/api.rs`) is the one table of every (API group, resource, verb) vipd calls, with the
//! namespace scope it calls it in, the feature that needs it and the call site. The
//! ClusterRole ([`cluster_role`]) is rendered from it, `vipd preflight` checks it row by row
//! with SelfSubjectAccessReviews ([`checks_for`]), and a unit test ties it to the code (every
//! `Api<T>` in `src/` is a resource of the table; every row's call site exists).
//!
//! Not in the table: API discovery (`/apis/...`, allowed to every authenticated user by the
//! `system:discovery` ClusterRole) and `vipd preflight`'s own SelfSubjectAccessReviews
//! (allowed by `system:basic-user`).

use clap::Args;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{APP_NAME, ManifestError, parse_go_bool, pod::labels};

/// Name of the ClusterRoleBinding (kube-vip's is `system:kube-vip-binding`).
pub(crate) const CLUSTER_ROLE_BINDING: &str = "system:vipd-binding";

use crate::kube::api::{CLUSTER_ROLE, Needs, required_permissions};

/// `vipd manifest rbac` flags.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct RbacArgs {
    /// Namespace of the ServiceAccount
    #[arg(
        long = "namespace",
        short = 'n',
        value_name = "NAMESPACE",
        default_value = "kube-system"
    )]
    pub namespace: String,
    /// Also allow `get` and `patch` on nodes (for enable_node_labeling)
    #[arg(long = "enableNodeLabeling", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub enable_node_labeling: Option<String>,
    /// Also allow `get` on the Secret vipd-peer-key (for svc_ridethrough; create the Secret
    /// with: kubectl create secret generic vipd-peer-key -n <cp_namespace>
    /// --from-literal=key=$(head -c32 /dev/urandom | base64))
    #[arg(long = "servicesRideThrough", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub services_ride_through: Option<String>,
}

/// The ClusterRole: one rule per (group, resource) of [`required_permissions`] for
/// [`Needs::manifest`] (every feature, both Event APIs, both endpoint APIs; `get` and
/// `patch` on nodes only with `node_labeling`).
pub fn cluster_role(node_labeling: bool) -> ClusterRole {
    cluster_role_for(node_labeling, false)
}

/// [`cluster_role`], plus `get` on the Secret [`crate::kube::api::PEER_KEY_SECRET`] (by name only)
/// with `ride_through` (`svc_ridethrough`).
pub fn cluster_role_for(node_labeling: bool, ride_through: bool) -> ClusterRole {
    let needs = Needs {
        ride_through,
        ..Needs::manifest(node_labeling)
    };
    let rules = required_permissions(&needs)
        .into_iter()
        .map(|p| PolicyRule {
            api_groups: Some(vec![p.group.to_string()]),
            resources: Some(vec![p.resource]),
            resource_names: (!p.names.is_empty())
                .then(|| p.names.iter().map(|n| n.to_string()).collect()),
            verbs: p.verbs.iter().map(|v| v.as_str().to_string()).collect(),
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
pub(crate) fn service_account(namespace: &str) -> ServiceAccount {
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
pub(crate) fn service_account_binding(namespace: &str) -> ClusterRoleBinding {
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
/// [`ManifestError::Invalid`] for a bad `--enableNodeLabeling` or `--servicesRideThrough`;
/// [`ManifestError::Yaml`].
pub fn rbac_yaml(args: &RbacArgs) -> Result<String, ManifestError> {
    let labeling = args
        .enable_node_labeling
        .as_deref()
        .map(|v| parse_go_bool("enableNodeLabeling", v))
        .transpose()?
        .unwrap_or(false);
    let ride_through = args
        .services_ride_through
        .as_deref()
        .map(|v| parse_go_bool("servicesRideThrough", v))
        .transpose()?
        .unwrap_or(false);
    let mut out = super::to_yaml_stream(&[service_account(&args.namespace)])?;
    out.push_str(&super::to_yaml_stream(&[cluster_role_for(
        labeling,
        ride_through,
    )])?);
    out.push_str(&super::to_yaml_stream(&[service_account_binding(
        &args.namespace,
    )])?);
    Ok(out)
}

#[cfg(test)]
mod tests;
