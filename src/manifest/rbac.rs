//! `vipd manifest rbac`: ServiceAccount, ClusterRole and ClusterRoleBinding with exactly the
//! API calls vipd makes, nothing more.
//!
//! [`API_CALLS`] is the one table of every (API group, resource, verb) vipd calls, with the
//! namespace scope it calls it in, the feature that needs it and the call site. The
//! ClusterRole ([`cluster_role`]) is rendered from it, `vipd preflight` checks it row by row
//! with SelfSubjectAccessReviews ([`checks_for`]), and a unit test ties it to the code (every
//! `Api<T>` in `src/` is a resource of the table; every row's call site exists).
//!
//! Not in the table: API discovery (`/apis/...`, allowed to every authenticated user by the
//! `system:discovery` ClusterRole) and `vipd preflight`'s own SelfSubjectAccessReviews
//! (allowed by `system:basic-user`).

use std::collections::BTreeSet;

use clap::Args;
use k8s_openapi::Resource;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Event as CoreEvent, Node, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{APP_NAME, ManifestError, parse_go_bool, pod::labels};

/// Name of the ClusterRole (kube-vip's is `system:kube-vip-role`).
pub const CLUSTER_ROLE: &str = "system:vipd-role";
/// Name of the ClusterRoleBinding (kube-vip's is `system:kube-vip-binding`).
pub(crate) const CLUSTER_ROLE_BINDING: &str = "system:vipd-binding";

/// An RBAC verb (Kubernetes API conventions, "Verbs on resources").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// GET one object.
    Get,
    /// GET a collection (also the first step of a watch).
    List,
    /// GET with `?watch=1`.
    Watch,
    /// POST.
    Create,
    /// PUT (kube-rs `replace`).
    Update,
    /// PATCH (kube-rs `patch`, `patch_status`).
    Patch,
    /// DELETE.
    Delete,
}

impl Verb {
    /// The verb as RBAC spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }
}

/// Where vipd makes a call; `vipd preflight` asks for exactly this namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `cp_namespace` (the control-plane lease, the global Services lease, Events about
    /// them).
    LeaseNamespace,
    /// `svc_namespace`, or all namespaces when it is unset (Service watches and writes).
    ServiceNamespaces,
    /// Where Services' leases live: [`Scope::ServiceNamespaces`] with `svc_election`
    /// (one lease per Service, next to it), else [`Scope::LeaseNamespace`].
    ServiceLeases,
    /// A cluster-scoped resource (Nodes).
    Cluster,
}

/// Which part of vipd makes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// `cp_enable`.
    ControlPlane,
    /// `svc_enable`.
    Services,
    /// `enable_node_labeling` (the manifest's `--enableNodeLabeling`; vipd itself does not
    /// label nodes today, the rule is kept for kube-vip compatible manifests).
    NodeLabeling,
}

/// Calls made only when the server serves one of two API versions (decided once at start
/// by API discovery); the manifest grants both of each pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Always made.
    Always,
    /// Events through `events.k8s.io/v1` (served: Kubernetes 1.19+).
    EventsV1,
    /// Events through core `v1` (when `events.k8s.io/v1` is not served).
    CoreEvents,
    /// Endpoints through `discovery.k8s.io/v1` EndpointSlices (served: 1.21+).
    EndpointSlices,
    /// Core `v1` Endpoints (when EndpointSlice v1 is not served).
    CoreEndpoints,
}

/// One API call vipd makes: `verb` on `resource` (`subresource`) of API group `group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// Resource, plural (e.g. `leases`).
    pub resource: &'static str,
    /// Subresource (e.g. `status`), empty for none.
    pub subresource: &'static str,
    /// The verb.
    pub verb: Verb,
    /// Where it is called.
    pub scope: Scope,
    /// Which part of vipd calls it.
    pub feature: Feature,
    /// When it is called.
    pub variant: Variant,
    /// The call site: a source file and the call's text in it (checked by a unit test).
    pub call_site: (&'static str, &'static str),
}

const fn call<K: Resource>(
    verb: Verb,
    scope: Scope,
    feature: Feature,
    variant: Variant,
    call_site: (&'static str, &'static str),
) -> ApiCall {
    ApiCall {
        group: K::GROUP,
        resource: K::URL_PATH_SEGMENT,
        subresource: "",
        verb,
        scope,
        feature,
        variant,
        call_site,
    }
}

const fn status_call<K: Resource>(
    verb: Verb,
    scope: Scope,
    feature: Feature,
    call_site: (&'static str, &'static str),
) -> ApiCall {
    ApiCall {
        subresource: "status",
        ..call::<K>(verb, scope, feature, Variant::Always, call_site)
    }
}

use Feature::{ControlPlane, NodeLabeling, Services};
use Scope::{Cluster, LeaseNamespace, ServiceLeases, ServiceNamespaces};
use Variant::{Always, CoreEndpoints, CoreEvents, EndpointSlices, EventsV1};
use Verb::{Create, Delete, Get, List, Patch, Update, Watch};

const LEASE_CLIENT: &str = "src/election/kube.rs";
const STATUS: &str = "src/services/status/writer.rs";
const EVENTS: &str = "src/services/status/events.rs";
const RUNTIME: &str = "src/services/runtime.rs";
const LEASE_GC: &str = "src/services/lease_gc.rs";

/// Every API call vipd makes (see the module docs). Events are created, and repeats
/// folded into the first one with a patch of its series / count; both Event APIs and both
/// endpoint APIs are listed, the one used is chosen at start by discovery.
#[rustfmt::skip]
pub const API_CALLS: &[ApiCall] = &[
    // Control-plane election: `KubeLeaseClient` (get, create, replace, watch of one lease),
    // and the Lease read for the uid of a DuplicateIdentity Event.
    call::<Lease>(Get, LeaseNamespace, ControlPlane, Always, (LEASE_CLIENT, "self.api.get_opt(")),
    call::<Lease>(Create, LeaseNamespace, ControlPlane, Always, (LEASE_CLIENT, "self.api.create(")),
    call::<Lease>(Update, LeaseNamespace, ControlPlane, Always, (LEASE_CLIENT, "self.api.replace(")),
    call::<Lease>(List, LeaseNamespace, ControlPlane, Always, (LEASE_CLIENT, "watcher(self.api.clone()")),
    call::<Lease>(Watch, LeaseNamespace, ControlPlane, Always, (LEASE_CLIENT, "watcher(self.api.clone()")),
    call::<EventsV1Event>(Create, LeaseNamespace, ControlPlane, EventsV1, (EVENTS, "events.create(")),
    call::<EventsV1Event>(Patch, LeaseNamespace, ControlPlane, EventsV1, (EVENTS, "events.patch(")),
    call::<CoreEvent>(Create, LeaseNamespace, ControlPlane, CoreEvents, (EVENTS, "core.create(")),
    call::<CoreEvent>(Patch, LeaseNamespace, ControlPlane, CoreEvents, (EVENTS, "core.patch(")),
    // Services: watches (reflectors) of Services, Nodes and endpoints.
    call::<Service>(List, ServiceNamespaces, Services, Always, (RUNTIME, "spawn_reflector(\n        \"services\"")),
    call::<Service>(Watch, ServiceNamespaces, Services, Always, (RUNTIME, "spawn_reflector(\n        \"services\"")),
    call::<Node>(List, Cluster, Services, Always, (RUNTIME, "spawn_reflector(\n        \"nodes\"")),
    call::<Node>(Watch, Cluster, Services, Always, (RUNTIME, "spawn_reflector(\n        \"nodes\"")),
    call::<EndpointSlice>(List, ServiceNamespaces, Services, EndpointSlices, (RUNTIME, "\"endpointslices\",")),
    call::<EndpointSlice>(Watch, ServiceNamespaces, Services, EndpointSlices, (RUNTIME, "\"endpointslices\",")),
    call::<Endpoints>(List, ServiceNamespaces, Services, CoreEndpoints, (RUNTIME, "\"endpoints\",")),
    call::<Endpoints>(Watch, ServiceNamespaces, Services, CoreEndpoints, (RUNTIME, "\"endpoints\",")),
    // Services: the status writer (`KubeStatusWriter`): read, annotation, status, Events.
    call::<Service>(Get, ServiceNamespaces, Services, Always, (STATUS, "api.get(&key.name)")),
    call::<Service>(Patch, ServiceNamespaces, Services, Always, (STATUS, "api.patch(&key.name")),
    status_call::<Service>(Patch, ServiceNamespaces, Services, (STATUS, "api.patch_status(")),
    call::<EventsV1Event>(Create, ServiceNamespaces, Services, EventsV1, (EVENTS, "events.create(")),
    call::<EventsV1Event>(Patch, ServiceNamespaces, Services, EventsV1, (EVENTS, "events.patch(")),
    call::<CoreEvent>(Create, ServiceNamespaces, Services, CoreEvents, (EVENTS, "core.create(")),
    call::<CoreEvent>(Patch, ServiceNamespaces, Services, CoreEvents, (EVENTS, "core.patch(")),
    // Services: leases (one per Service with svc_election, else the global one): the shared
    // watch (`LeaseHub`), each elector's get/create/replace, the delete of a gone Service's
    // lease by its last holder, the read for a DuplicateIdentity Event's uid; Events about the global lease.
    call::<Lease>(List, ServiceLeases, Services, Always, (LEASE_CLIENT, "watcher(api, cfg)")),
    call::<Lease>(Watch, ServiceLeases, Services, Always, (LEASE_CLIENT, "watcher(api, cfg)")),
    call::<Lease>(Get, ServiceLeases, Services, Always, (LEASE_CLIENT, "self.api.get_opt(")),
    call::<Lease>(Create, ServiceLeases, Services, Always, (LEASE_CLIENT, "self.api.create(")),
    call::<Lease>(Update, ServiceLeases, Services, Always, (LEASE_CLIENT, "self.api.replace(")),
    call::<Lease>(Delete, ServiceLeases, Services, Always, (LEASE_CLIENT, "self.api.delete(")),
    // The orphaned-lease collector (`services::lease_gc`, svc_election only).
    call::<Lease>(List, ServiceLeases, Services, Always, (LEASE_GC, "api.list(&lp)")),
    call::<Lease>(Delete, ServiceLeases, Services, Always, (LEASE_GC, "api.delete(&o.lease.name")),
    call::<EventsV1Event>(Create, ServiceLeases, Services, EventsV1, (EVENTS, "events.create(")),
    call::<EventsV1Event>(Patch, ServiceLeases, Services, EventsV1, (EVENTS, "events.patch(")),
    call::<CoreEvent>(Create, ServiceLeases, Services, CoreEvents, (EVENTS, "core.create(")),
    call::<CoreEvent>(Patch, ServiceLeases, Services, CoreEvents, (EVENTS, "core.patch(")),
    // The check that no control-plane VIP is a node's own address (`manager`).
    call::<Node>(List, Cluster, ControlPlane, Always, ("src/controlplane.rs", "api.list(&Default::default())")),
    // Only for kube-vip compatible manifests (`--enableNodeLabeling`).
    call::<Node>(Patch, Cluster, NodeLabeling, Always, ("src/config/options.rs", "enable_node_labeling")),
];

impl ApiCall {
    /// `resource` or `resource/subresource`, as an RBAC rule names it.
    pub(crate) fn resource_name(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// What a deployment of vipd does, to select the rows of [`API_CALLS`] it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// `cp_enable`.
    pub control_plane: bool,
    /// `svc_enable`.
    pub services: bool,
    /// `enable_node_labeling`.
    pub node_labeling: bool,
    /// `Some(true)`: the server serves events.k8s.io/v1; `Some(false)`: it does not (core
    /// Events); `None`: unknown, both.
    pub events_v1: Option<bool>,
    /// As `events_v1`, for discovery.k8s.io/v1 EndpointSlices.
    pub endpoint_slices: Option<bool>,
}

impl Needs {
    /// What the generated manifest grants: every feature (patch on nodes only with
    /// `node_labeling`), both Event APIs and both endpoint APIs.
    pub fn manifest(node_labeling: bool) -> Self {
        Needs {
            control_plane: true,
            services: true,
            node_labeling,
            events_v1: None,
            endpoint_slices: None,
        }
    }

    /// Whether `call` is made by such a deployment.
    pub fn wants(&self, call: &ApiCall) -> bool {
        let feature = match call.feature {
            Feature::ControlPlane => self.control_plane,
            Feature::Services => self.services,
            Feature::NodeLabeling => self.node_labeling,
        };
        let variant = match call.variant {
            Variant::Always => true,
            Variant::EventsV1 => self.events_v1 != Some(false),
            Variant::CoreEvents => self.events_v1 != Some(true),
            Variant::EndpointSlices => self.endpoint_slices != Some(false),
            Variant::CoreEndpoints => self.endpoint_slices != Some(true),
        };
        feature && variant
    }
}

/// One rule of the ClusterRole: `verbs` on `resource` (`resource/subresource`) of `group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Permission {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// Verbs, in [`Verb`] order.
    pub verbs: Vec<Verb>,
}

/// The rules for `needs`: one per (group, resource) of [`API_CALLS`], sorted by resource
/// then group, with the union of the verbs called on it.
pub(crate) fn required_permissions(needs: &Needs) -> Vec<Permission> {
    let mut out: Vec<(Permission, BTreeSet<Verb>)> = Vec::new();
    for c in API_CALLS.iter().filter(|c| needs.wants(c)) {
        let resource = c.resource_name();
        match out
            .iter_mut()
            .find(|(p, _)| p.group == c.group && p.resource == resource)
        {
            Some((_, verbs)) => {
                verbs.insert(c.verb);
            }
            None => out.push((
                Permission {
                    group: c.group,
                    resource,
                    verbs: Vec::new(),
                },
                BTreeSet::from([c.verb]),
            )),
        }
    }
    out.sort_by(|(a, _), (b, _)| (&a.resource, a.group).cmp(&(&b.resource, b.group)));
    out.into_iter()
        .map(|(mut p, verbs)| {
            p.verbs = verbs.into_iter().collect();
            p
        })
        .collect()
}

/// The namespaces of a configuration, to resolve [`Scope`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Namespaces {
    /// `cp_namespace`.
    pub lease: String,
    /// `svc_namespace` (`None`: all namespaces).
    pub services: Option<String>,
    /// `svc_election`.
    pub services_election: bool,
}

impl Namespaces {
    /// The namespace a call in `scope` is made in; `None` = cluster-wide (all namespaces,
    /// or a cluster-scoped resource).
    pub fn resolve(&self, scope: Scope) -> Option<String> {
        match scope {
            Scope::LeaseNamespace => Some(self.lease.clone()),
            Scope::ServiceNamespaces => self.services.clone(),
            Scope::ServiceLeases if self.services_election => self.services.clone(),
            Scope::ServiceLeases => Some(self.lease.clone()),
            Scope::Cluster => None,
        }
    }
}

/// One access `vipd preflight` asks about with a SelfSubjectAccessReview.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct AccessCheck {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Resource, plural.
    pub resource: &'static str,
    /// Subresource, empty for none.
    pub subresource: &'static str,
    /// The verb.
    pub verb: Verb,
    /// The namespace; `None` = cluster-wide.
    pub namespace: Option<String>,
}

impl AccessCheck {
    /// E.g. `create events.k8s.io/events in namespace default` or `list nodes (cluster-wide)`.
    pub fn describe(&self) -> String {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!("{}/", self.group)
        };
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        let wher = match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "cluster-wide".to_string(),
        };
        format!(
            "{} {group}{}{sub} {wher}",
            self.verb.as_str(),
            self.resource
        )
    }

    /// The RBAC rule that grants it, as YAML flow text: `{apiGroups: [""], resources:
    /// [events], verbs: [create]}`.
    pub fn rule(&self) -> String {
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        format!(
            "{{apiGroups: [\"{}\"], resources: [{}{sub}], verbs: [{}]}}",
            self.group,
            self.resource,
            self.verb.as_str()
        )
    }
}

/// The accesses `vipd preflight` checks for `needs` in `namespaces`: one per (group,
/// resource, subresource, verb, namespace) of the rows of [`API_CALLS`] `needs` wants,
/// without duplicates, in the table's order.
pub(crate) fn checks_for(needs: &Needs, namespaces: &Namespaces) -> Vec<AccessCheck> {
    let mut out: Vec<AccessCheck> = Vec::new();
    for c in API_CALLS.iter().filter(|c| needs.wants(c)) {
        let a = AccessCheck {
            group: c.group,
            resource: c.resource,
            subresource: c.subresource,
            verb: c.verb,
            namespace: namespaces.resolve(c.scope),
        };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// The Event API a server serves, of the two in [`API_CALLS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum EventApi {
    /// `events.k8s.io/v1` (Kubernetes 1.19+).
    EventsV1,
    /// Core `v1` Events.
    Core,
}

/// Which Event API to use, given the resources the server lists for `events.k8s.io/v1`
/// (`None`: the group version is not served): events.k8s.io/v1 when it lists `events`, core
/// otherwise.
pub(crate) fn event_api_from_discovery(events_v1_resources: Option<&[&str]>) -> EventApi {
    match events_v1_resources {
        Some(list) if list.contains(&EventsV1Event::URL_PATH_SEGMENT) => EventApi::EventsV1,
        _ => EventApi::Core,
    }
}

/// Asks the server (API discovery, `GET /apis/events.k8s.io/v1`) which Event API to use,
/// like the EndpointSlice choice ([`crate::services::endpoints::endpointslice_v1_served`]).
///
/// # Errors
/// The kube-rs error when discovery fails for another reason than 404 (the group version
/// not served), so the caller can retry instead of settling on the wrong API.
pub(crate) async fn discover_event_api(client: &kube::Client) -> Result<EventApi, kube::Error> {
    let gv = format!("{}/{}", EventsV1Event::GROUP, EventsV1Event::VERSION);
    match client.list_api_group_resources(&gv).await {
        Ok(list) => {
            let names: Vec<&str> = list.resources.iter().map(|r| r.name.as_str()).collect();
            Ok(event_api_from_discovery(Some(&names)))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(event_api_from_discovery(None)),
        Err(e) => Err(e),
    }
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

/// The ClusterRole: one rule per (group, resource) of [`required_permissions`] for
/// [`Needs::manifest`] (every feature, both Event APIs, both endpoint APIs; `patch` on nodes
/// only with `node_labeling`).
pub fn cluster_role(node_labeling: bool) -> ClusterRole {
    let rules = required_permissions(&Needs::manifest(node_labeling))
        .into_iter()
        .map(|p| PolicyRule {
            api_groups: Some(vec![p.group.to_string()]),
            resources: Some(vec![p.resource]),
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

    fn rule<'a>(role: &'a ClusterRole, group: &str, resource: &str) -> Option<&'a PolicyRule> {
        role.rules.as_ref().unwrap().iter().find(|r| {
            r.api_groups.as_deref() == Some(&[group.to_string()][..])
                && r.resources.as_deref() == Some(&[resource.to_string()][..])
        })
    }

    /// vipd writes events.k8s.io Events; a role that granted only core ones lost them all.
    #[test]
    fn role_grants_both_event_apis_and_what_vipd_calls() {
        let role = cluster_role(false);
        for group in ["events.k8s.io", ""] {
            let r = rule(&role, group, "events").unwrap_or_else(|| panic!("{group:?} events"));
            assert_eq!(r.verbs, ["create", "patch"], "{group:?}");
        }
        let verbs = |g, r| {
            rule(&role, g, r)
                .map(|r| r.verbs.clone())
                .unwrap_or_default()
        };
        assert_eq!(
            verbs("coordination.k8s.io", "leases"),
            ["get", "list", "watch", "create", "update", "delete"]
        );
        assert_eq!(verbs("", "services"), ["get", "list", "watch", "patch"]);
        assert_eq!(verbs("", "services/status"), ["patch"]);
        assert_eq!(verbs("", "nodes"), ["list", "watch"]);
        assert_eq!(verbs("", "endpoints"), ["list", "watch"]);
        assert_eq!(
            verbs("discovery.k8s.io", "endpointslices"),
            ["list", "watch"]
        );
        assert_eq!(role.rules.unwrap().len(), 8);
    }

    #[test]
    fn checks_follow_the_configuration() {
        let ns = Namespaces {
            lease: "kube-system".into(),
            services: None,
            services_election: true,
        };
        let cp_only = Needs {
            services: false,
            events_v1: Some(true),
            endpoint_slices: Some(true),
            ..Needs::manifest(false)
        };
        let c = checks_for(&cp_only, &ns);
        let described: Vec<String> = c.iter().map(AccessCheck::describe).collect();
        assert!(
            described.contains(
                &"update coordination.k8s.io/leases in namespace kube-system".to_string()
            ),
            "{described:?}"
        );
        assert!(
            described.contains(&"create events.k8s.io/events in namespace kube-system".to_string()),
            "{described:?}"
        );
        assert!(
            described.contains(&"list nodes cluster-wide".to_string()),
            "{described:?}"
        );
        assert!(
            !described
                .iter()
                .any(|d| d.contains("services") || d.starts_with("create events ")),
            "{described:?}"
        );

        // Services with per-Service leases in all namespaces, core Events only.
        let svc = Needs {
            control_plane: false,
            events_v1: Some(false),
            endpoint_slices: Some(false),
            ..Needs::manifest(false)
        };
        let described: Vec<String> = checks_for(&svc, &ns)
            .iter()
            .map(AccessCheck::describe)
            .collect();
        for want in [
            "watch coordination.k8s.io/leases cluster-wide",
            "delete coordination.k8s.io/leases cluster-wide",
            "create events cluster-wide",
            "patch services/status cluster-wide",
            "watch endpoints cluster-wide",
        ] {
            assert!(
                described.contains(&want.to_string()),
                "{want}: {described:?}"
            );
        }
        assert!(
            !described
                .iter()
                .any(|d| d.contains("events.k8s.io") || d.contains("endpointslices")),
            "{described:?}"
        );
        // Without per-Service leases, the global lease is in cp_namespace.
        let global = Namespaces {
            services_election: false,
            services: Some("apps".into()),
            ..ns
        };
        let described: Vec<String> = checks_for(&svc, &global)
            .iter()
            .map(AccessCheck::describe)
            .collect();
        assert!(
            described
                .contains(&"watch coordination.k8s.io/leases in namespace kube-system".to_string()),
            "{described:?}"
        );
        assert!(
            described.contains(&"patch services in namespace apps".to_string()),
            "{described:?}"
        );
        // No duplicates.
        let all = checks_for(&Needs::manifest(true), &global);
        let set: BTreeSet<_> = all.iter().cloned().collect();
        assert_eq!(set.len(), all.len());
    }

    #[test]
    fn rule_text_names_group_resource_and_verb() {
        let a = AccessCheck {
            group: "events.k8s.io",
            resource: "events",
            subresource: "",
            verb: Verb::Create,
            namespace: Some("default".into()),
        };
        assert_eq!(
            a.describe(),
            "create events.k8s.io/events in namespace default"
        );
        assert_eq!(
            a.rule(),
            "{apiGroups: [\"events.k8s.io\"], resources: [events], verbs: [create]}"
        );
    }

    #[test]
    fn event_api_by_discovery() {
        assert_eq!(
            event_api_from_discovery(Some(&["events"])),
            EventApi::EventsV1
        );
        assert_eq!(event_api_from_discovery(Some(&[])), EventApi::Core);
        assert_eq!(event_api_from_discovery(None), EventApi::Core);
    }

    /// Ties the table to the code: every resource type vipd builds an `Api<T>` for in
    /// `src/` is in [`API_CALLS`] (or is preflight's SelfSubjectAccessReview), and every
    /// row's call site text is in its file.
    #[test]
    fn table_matches_the_code() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for c in API_CALLS {
            let (file, text) = c.call_site;
            let src = std::fs::read_to_string(root.join(file)).unwrap();
            assert!(src.contains(text), "{c:?}: {text:?} not in {file}");
        }
        // Type name as written in the code -> (group, resource) it is about.
        let known: &[(&str, Option<(&str, &str)>)] = &[
            ("Lease", Some((Lease::GROUP, Lease::URL_PATH_SEGMENT))),
            ("Service", Some((Service::GROUP, Service::URL_PATH_SEGMENT))),
            ("Node", Some((Node::GROUP, Node::URL_PATH_SEGMENT))),
            (
                "Endpoints",
                Some((Endpoints::GROUP, Endpoints::URL_PATH_SEGMENT)),
            ),
            (
                "EndpointSlice",
                Some((EndpointSlice::GROUP, EndpointSlice::URL_PATH_SEGMENT)),
            ),
            (
                "K8sEvent",
                Some((EventsV1Event::GROUP, EventsV1Event::URL_PATH_SEGMENT)),
            ),
            (
                "CoreEvent",
                Some((CoreEvent::GROUP, CoreEvent::URL_PATH_SEGMENT)),
            ),
            // vipd preflight only; allowed to every user (system:basic-user).
            ("SelfSubjectAccessReview", None),
            // Generic helpers (`scoped_api`, `spawn_reflector`).
            ("K", None),
        ];
        let mut files = vec![root.join("src")];
        let mut seen = BTreeSet::new();
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            // This file names types in its docs and messages.
            if p.extension().is_none_or(|e| e != "rs") || p.ends_with("manifest/rbac.rs") {
                continue;
            }
            let src = std::fs::read_to_string(&p).unwrap();
            for pat in ["Api<", "Api::<"] {
                for (i, _) in src.match_indices(pat) {
                    let rest = &src[i + pat.len()..];
                    let end = rest.find('>').unwrap();
                    let ty = rest[..end].rsplit("::").next().unwrap().trim();
                    let entry = known.iter().find(|(n, _)| *n == ty).unwrap_or_else(|| {
                        panic!(
                            "{}: Api<{ty}> is not in API_CALLS: add its calls to the table \
                             (and to this test's list)",
                            p.display()
                        )
                    });
                    seen.insert(ty.to_string());
                    if let Some((group, resource)) = entry.1 {
                        assert!(
                            API_CALLS
                                .iter()
                                .any(|c| c.group == group && c.resource == resource),
                            "{ty}: {group}/{resource} not in API_CALLS"
                        );
                    }
                }
            }
        }
        // The scan found the call sites (so it is not vacuous).
        for ty in [
            "Lease",
            "Service",
            "Node",
            "Endpoints",
            "EndpointSlice",
            "K8sEvent",
            "CoreEvent",
        ] {
            assert!(seen.contains(ty), "no Api<{ty}> found in src/: {seen:?}");
        }
    }
}
