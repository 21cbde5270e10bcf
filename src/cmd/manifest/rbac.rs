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
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
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
    /// Allow `get` on the Secret vipd-peer-key, by name (svc_ridethrough, on by default);
    /// =false leaves the rule and the Secret out
    #[arg(long = "servicesRideThrough", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub services_ride_through: Option<String>,
    /// Also print the Secret vipd-peer-key in --namespace (which must be cp_namespace) with
    /// a new random 32-byte key (a different one every time: re-applying rotates the key,
    /// which running vipd follow within two minutes); =false prints the rules only (create
    /// the Secret once with `vipd manifest peer-key | kubectl create -f -`)
    #[arg(long = "peerKey", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub peer_key: Option<String>,
}

/// `vipd manifest peer-key` flags.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct PeerKeyArgs {
    /// Namespace of the Secret: vipd's cp_namespace
    #[arg(
        long = "namespace",
        short = 'n',
        value_name = "NAMESPACE",
        default_value = "kube-system"
    )]
    pub namespace: String,
}

/// The ClusterRole: one rule per (group, resource) of [`required_permissions`] for
/// [`Needs::manifest`] (every feature, both Event APIs, both endpoint APIs; `get` and
/// `patch` on nodes only with `node_labeling`; `get` on the peer key Secret by name).
pub fn cluster_role(node_labeling: bool) -> ClusterRole {
    cluster_role_for(node_labeling, true)
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

/// The peer key Secret [`crate::kube::api::PEER_KEY_SECRET`] in `namespace` with a new key
/// of [`crate::peer::wire::MIN_KEY_LEN`] bytes from the OS's random number generator
/// (`ring::rand::SystemRandom`), a different one at every call.
///
/// # Errors
/// [`ManifestError::NoRandom`] when the OS gives no random bytes.
pub fn peer_key_secret(namespace: &str) -> Result<Secret, ManifestError> {
    use ring::rand::SecureRandom;
    let mut key = [0u8; crate::peer::wire::MIN_KEY_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| ManifestError::NoRandom)?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(crate::kube::api::PEER_KEY_SECRET.into()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(
            [(
                crate::peer::KEY_SECRET_KEY.to_string(),
                k8s_openapi::ByteString(key.to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    })
}

/// The comment printed above the peer key Secret.
const PEER_KEY_COMMENT: &str = "# The peer key of svc_ridethrough (random, new at every run of the generator). Re-applying\n\
     # this file rotates it: running vipd read the Secret every minute and accept the previous\n\
     # key for 10 minutes, so a rotation does not interrupt ride-through.\n";

/// `vipd manifest peer-key` output: the peer key Secret alone ([`peer_key_secret`]), for
/// `kubectl create -f -` (which never replaces an existing key).
///
/// # Errors
/// As [`peer_key_secret`]; [`ManifestError::Yaml`].
pub fn peer_key_yaml(namespace: &str) -> Result<String, ManifestError> {
    let mut out = PEER_KEY_COMMENT.to_string();
    out.push_str(&super::to_yaml_stream(&[peer_key_secret(namespace)?])?);
    Ok(out)
}

/// A `--flag[=BOOL]` of `vipd manifest rbac`, `default` when absent.
fn flag(name: &'static str, value: Option<&str>, default: bool) -> Result<bool, ManifestError> {
    Ok(value
        .map(|v| parse_go_bool(name, v))
        .transpose()?
        .unwrap_or(default))
}

/// `vipd manifest rbac` output: ServiceAccount, ClusterRole, ClusterRoleBinding, and the
/// peer key Secret (unless `--servicesRideThrough=false` or `--peerKey=false`).
///
/// # Errors
/// [`ManifestError::Invalid`] for a bad `--enableNodeLabeling`, `--servicesRideThrough` or
/// `--peerKey`; [`ManifestError::NoRandom`]; [`ManifestError::Yaml`].
pub fn rbac_yaml(args: &RbacArgs) -> Result<String, ManifestError> {
    let labeling = flag(
        "enableNodeLabeling",
        args.enable_node_labeling.as_deref(),
        false,
    )?;
    let ride_through = flag(
        "servicesRideThrough",
        args.services_ride_through.as_deref(),
        true,
    )?;
    let peer_key = ride_through && flag("peerKey", args.peer_key.as_deref(), true)?;
    let mut out = super::to_yaml_stream(&[service_account(&args.namespace)])?;
    out.push_str(&super::to_yaml_stream(&[cluster_role_for(
        labeling,
        ride_through,
    )])?);
    out.push_str(&super::to_yaml_stream(&[service_account_binding(
        &args.namespace,
    )])?);
    if peer_key {
        out.push_str(&peer_key_yaml(&args.namespace)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
