//! The one table of every Kubernetes API call vipd makes ([`API_CALLS`]: API group,
//! resource, verb, the namespace scope it is called in, the feature that needs it and the
//! call site), and what is derived from it for one configuration ([`Needs`],
//! [`required_permissions`], [`checks_for`]). `vipd manifest rbac` renders the ClusterRole
//! from it, `vipd preflight` checks it row by row with SelfSubjectAccessReviews, and a unit
//! test (in `cmd/manifest/rbac/tests.rs`) ties it to the code: every `Api<T>` in `src/` is
//! a resource of the table; every row's call site exists.
//!
//! Not in the table: API discovery (`/apis/...`, allowed to every authenticated user by the
//! `system:discovery` ClusterRole) and `vipd preflight`'s own SelfSubjectAccessReviews
//! (allowed by `system:basic-user`).

use std::collections::BTreeSet;

use k8s_openapi::Resource;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Event as CoreEvent, Node, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as EventsV1Event;

/// Name of the ClusterRole vipd's ServiceAccount is bound to (kube-vip's is
/// `system:kube-vip-role`).
pub const CLUSTER_ROLE: &str = "system:vipd-role";

/// The Secret holding the peer key of `svc_ridethrough` (the peer protocol), in
/// `cp_namespace`; the only Secret vipd reads (RBAC `resourceNames`).
pub const PEER_KEY_SECRET: &str = "vipd-peer-key";

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
    /// `KUBEVIP_NAMESPACE`: the IPAM pool ConfigMap and the allocator's Lease.
    IpamNamespace,
}

/// Which part of vipd makes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// `cp_enable`.
    ControlPlane,
    /// `svc_enable`.
    Services,
    /// `enable_node_labeling` with `cp_enable` (the manifest's `--enableNodeLabeling`): the
    /// control-plane lease holder's `kube-vip.io/has-ip` label on its own Node.
    NodeLabeling,
    /// `svc_ridethrough` with `svc_enable` (on by default; the manifest's
    /// `--servicesRideThrough=false` leaves it out): the peer key Secret
    /// [`crate::kube::api::PEER_KEY_SECRET`], read at start and every minute.
    RideThrough,
    /// `svc_ipam` with `svc_enable`: the allocator (its Lease, the pool ConfigMap, the
    /// Services' addresses).
    Ipam,
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
    /// Only when the server refuses the merge patch beside it with 403: RBAC that grants
    /// `update` but not `patch` on Services, as the ClusterRoles of kube-vip's charts do
    /// (Harvester's among them), so that vipd keeps writing under them. Never in the
    /// generated role (which grants `patch`), never checked by `vipd preflight`.
    UpdateFallback,
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
    /// The only objects it is called on (RBAC `resourceNames`); empty: any.
    pub names: &'static [&'static str],
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
        names: &[],
    }
}

/// [`call`] on the objects `names` only (RBAC `resourceNames`).
const fn named_call<K: Resource>(
    verb: Verb,
    scope: Scope,
    feature: Feature,
    names: &'static [&'static str],
    call_site: (&'static str, &'static str),
) -> ApiCall {
    ApiCall {
        names,
        ..call::<K>(verb, scope, feature, Variant::Always, call_site)
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

use Feature::{ControlPlane, Ipam, NodeLabeling, RideThrough, Services};
use Scope::{Cluster, IpamNamespace, LeaseNamespace, ServiceLeases, ServiceNamespaces};
use Variant::{Always, CoreEndpoints, CoreEvents, EndpointSlices, EventsV1, UpdateFallback};
use Verb::{Create, Delete, Get, List, Patch, Update, Watch};

const LEASE_CLIENT: &str = "src/election/kube.rs";
const STATUS: &str = "src/services/publish/writer.rs";
const EVENTS: &str = "src/kube/events.rs";
const RUNTIME: &str = "src/services/runtime.rs";
const PEER_KEY: &str = "src/peer/key.rs";
const LEASE_GC: &str = "src/services/lease_gc.rs";
const NODE_LABEL: &str = "src/nodes/label.rs";
const NODES: &str = "src/nodes/mod.rs";
const SERVICE_CACHE: &str = "src/kube/service.rs";
const IPAM_TASK: &str = "src/ipam/task.rs";
const IPAM_WRITE: &str = "src/ipam/write.rs";

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
    // The process's one watch of Nodes (`nodes::start`, the Node cache), read by
    // eligibility (this node's drain annotation, exclusion label, readiness, cordon) for the
    // control plane and Services alike, by lb_enable (the control-plane Nodes whose API
    // servers are the backends), by the Services wing (node addresses, labels) and by the
    // allocator (node addresses).
    call::<Node>(List, Cluster, ControlPlane, Always, (NODES, "spawn_shared(\n        \"nodes\"")),
    call::<Node>(Watch, Cluster, ControlPlane, Always, (NODES, "spawn_shared(\n        \"nodes\"")),
    call::<Node>(List, Cluster, Services, Always, (NODES, "spawn_shared(\n        \"nodes\"")),
    call::<Node>(Watch, Cluster, Services, Always, (NODES, "spawn_shared(\n        \"nodes\"")),
    call::<Node>(List, Cluster, Ipam, Always, (NODES, "spawn_shared(\n        \"nodes\"")),
    call::<Node>(Watch, Cluster, Ipam, Always, (NODES, "spawn_shared(\n        \"nodes\"")),
    // The process's one watch of Services (`kube::service::start_cache`, with `svc_enable`),
    // read by the Services wing and by the allocator; the Services wing's watches of
    // endpoints.
    call::<Service>(List, ServiceNamespaces, Services, Always, (SERVICE_CACHE, "spawn_shared(\n        \"services\"")),
    call::<Service>(Watch, ServiceNamespaces, Services, Always, (SERVICE_CACHE, "spawn_shared(\n        \"services\"")),
    call::<EndpointSlice>(List, ServiceNamespaces, Services, EndpointSlices, (RUNTIME, "\"endpointslices\",")),
    call::<EndpointSlice>(Watch, ServiceNamespaces, Services, EndpointSlices, (RUNTIME, "\"endpointslices\",")),
    call::<Endpoints>(List, ServiceNamespaces, Services, CoreEndpoints, (RUNTIME, "\"endpoints\",")),
    call::<Endpoints>(Watch, ServiceNamespaces, Services, CoreEndpoints, (RUNTIME, "\"endpoints\",")),
    // Services: the status writer (`KubeStatusWriter`): read, annotation, status, Events.
    call::<Service>(Get, ServiceNamespaces, Services, Always, (STATUS, "api.get(&key.name)")),
    call::<Service>(Patch, ServiceNamespaces, Services, Always, (STATUS, "api.patch(&key.name")),
    status_call::<Service>(Patch, ServiceNamespaces, Services, (STATUS, "api.patch_status(")),
    // The same two writes as read-modify-write PUTs where RBAC grants `update` only.
    call::<Service>(Update, ServiceNamespaces, Services, UpdateFallback, (STATUS, "api.replace(&key.name")),
    ApiCall { subresource: "status", ..call::<Service>(Update, ServiceNamespaces, Services, UpdateFallback, (STATUS, "api.replace_status(")) },
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
    // The orphaned-lease collector (`services::lease_gc`): its own election on the Lease
    // `vipd-lease-gc` (the elector's calls above, in the collector's namespace), then the
    // holder's list and deletes.
    call::<Lease>(List, ServiceLeases, Services, Always, (LEASE_GC, ".list(lp)")),
    call::<Lease>(Delete, ServiceLeases, Services, Always, (LEASE_GC, "api.delete(&o.lease.name")),
    call::<EventsV1Event>(Create, ServiceLeases, Services, EventsV1, (EVENTS, "events.create(")),
    call::<EventsV1Event>(Patch, ServiceLeases, Services, EventsV1, (EVENTS, "events.patch(")),
    call::<CoreEvent>(Create, ServiceLeases, Services, CoreEvents, (EVENTS, "core.create(")),
    call::<CoreEvent>(Patch, ServiceLeases, Services, CoreEvents, (EVENTS, "core.patch(")),
    // The check that no control-plane VIP is a node's own address (`manager`).
    call::<Node>(List, Cluster, ControlPlane, Always, ("src/controlplane/mod.rs", "api.list(&Default::default())")),
    // enable_node_labeling: the holder's `kube-vip.io/has-ip` label, read and merge-patched
    // on this node's own Node (`nodes::label::KubeNodeLabels`).
    call::<Node>(Get, Cluster, NodeLabeling, Always, (NODE_LABEL, "self.api.get_opt(")),
    call::<Node>(Patch, Cluster, NodeLabeling, Always, (NODE_LABEL, "self.api.patch(")),
    // svc_ipam: the allocator's election on kube-vip-cloud-provider's Lease; while it holds
    // it, the watches of Services and the pool ConfigMap (Nodes: the Node cache above), the conditional merge patch
    // of a Service's addresses (`ipam::write`), and Events about Services.
    call::<Lease>(Get, IpamNamespace, Ipam, Always, (LEASE_CLIENT, "self.api.get_opt(")),
    call::<Lease>(Create, IpamNamespace, Ipam, Always, (LEASE_CLIENT, "self.api.create(")),
    call::<Lease>(Update, IpamNamespace, Ipam, Always, (LEASE_CLIENT, "self.api.replace(")),
    call::<Lease>(List, IpamNamespace, Ipam, Always, (LEASE_CLIENT, "watcher(self.api.clone()")),
    call::<Lease>(Watch, IpamNamespace, Ipam, Always, (LEASE_CLIENT, "watcher(self.api.clone()")),
    call::<Service>(List, ServiceNamespaces, Ipam, Always, (SERVICE_CACHE, "spawn_shared(\n        \"services\"")),
    call::<Service>(Watch, ServiceNamespaces, Ipam, Always, (SERVICE_CACHE, "spawn_shared(\n        \"services\"")),
    call::<ConfigMap>(List, IpamNamespace, Ipam, Always, (IPAM_TASK, "\"configmaps (ipam)\"")),
    call::<ConfigMap>(Watch, IpamNamespace, Ipam, Always, (IPAM_TASK, "\"configmaps (ipam)\"")),
    call::<Service>(Patch, ServiceNamespaces, Ipam, Always, (IPAM_WRITE, "api.patch(&key.name, &pp, &patch)")),
    call::<EventsV1Event>(Create, ServiceNamespaces, Ipam, EventsV1, (EVENTS, "events.create(")),
    call::<EventsV1Event>(Patch, ServiceNamespaces, Ipam, EventsV1, (EVENTS, "events.patch(")),
    call::<CoreEvent>(Create, ServiceNamespaces, Ipam, CoreEvents, (EVENTS, "core.create(")),
    call::<CoreEvent>(Patch, ServiceNamespaces, Ipam, CoreEvents, (EVENTS, "core.patch(")),
    // svc_ridethrough: the peer key, read at start and every minute (`peer::key`).
    named_call::<Secret>(Get, LeaseNamespace, RideThrough, &[PEER_KEY_SECRET], (PEER_KEY, "api.get_opt(KEY_SECRET)")),
];

impl ApiCall {
    /// `resource` or `resource/subresource`, as an RBAC rule names it.
    pub fn resource_name(&self) -> String {
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
    /// `enable_node_labeling` with `cp_enable` (only the control-plane holder is labelled).
    pub node_labeling: bool,
    /// `svc_ridethrough` with `svc_enable` (the peer key Secret).
    pub ride_through: bool,
    /// `svc_ipam` with `svc_enable` (the allocator).
    pub ipam: bool,
    /// `Some(true)`: the server serves events.k8s.io/v1; `Some(false)`: it does not (core
    /// Events); `None`: unknown, both.
    pub events_v1: Option<bool>,
    /// As `events_v1`, for discovery.k8s.io/v1 EndpointSlices.
    pub endpoint_slices: Option<bool>,
}

impl Needs {
    /// What the generated manifest grants: every feature (get and patch on nodes only with
    /// `node_labeling`; `get` on the peer key Secret by name), both Event APIs and both
    /// endpoint APIs.
    pub fn manifest(node_labeling: bool) -> Self {
        Needs {
            control_plane: true,
            services: true,
            node_labeling,
            ride_through: true,
            ipam: true,
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
            Feature::RideThrough => self.ride_through,
            Feature::Ipam => self.ipam,
        };
        let variant = match call.variant {
            Variant::Always => true,
            Variant::EventsV1 => self.events_v1 != Some(false),
            Variant::CoreEvents => self.events_v1 != Some(true),
            Variant::EndpointSlices => self.endpoint_slices != Some(false),
            Variant::CoreEndpoints => self.endpoint_slices != Some(true),
            Variant::UpdateFallback => false,
        };
        feature && variant
    }
}

/// One rule of the ClusterRole: `verbs` on `resource` (`resource/subresource`) of `group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// Verbs, in [`Verb`] order.
    pub verbs: Vec<Verb>,
    /// The only objects (`resourceNames`); empty: any.
    pub names: &'static [&'static str],
}

/// The rules for `needs`: one per (group, resource, resource names) of [`API_CALLS`],
/// sorted by resource then group, with the union of the verbs called on it.
pub fn required_permissions(needs: &Needs) -> Vec<Permission> {
    let mut out: Vec<(Permission, BTreeSet<Verb>)> = Vec::new();
    for c in API_CALLS.iter().filter(|c| needs.wants(c)) {
        let resource = c.resource_name();
        match out
            .iter_mut()
            .find(|(p, _)| p.group == c.group && p.resource == resource && p.names == c.names)
        {
            Some((_, verbs)) => {
                verbs.insert(c.verb);
            }
            None => out.push((
                Permission {
                    group: c.group,
                    resource,
                    verbs: Vec::new(),
                    names: c.names,
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
pub struct Namespaces {
    /// `cp_namespace`.
    pub lease: String,
    /// `svc_namespace` (`None`: all namespaces).
    pub services: Option<String>,
    /// `svc_election`.
    pub services_election: bool,
    /// `KUBEVIP_NAMESPACE` (the IPAM pool ConfigMap and Lease).
    pub ipam: String,
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
            Scope::IpamNamespace => Some(self.ipam.clone()),
        }
    }
}

/// One access `vipd preflight` asks about with a SelfSubjectAccessReview.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccessCheck {
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
    /// The object's name, when the call is on one named object only.
    pub name: Option<&'static str>,
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
        let named = self.name.map(|n| format!(" {n}")).unwrap_or_default();
        format!(
            "{} {group}{}{sub}{named} {wher}",
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
        let names = self
            .name
            .map(|n| format!(", resourceNames: [{n}]"))
            .unwrap_or_default();
        format!(
            "{{apiGroups: [\"{}\"], resources: [{}{sub}]{names}, verbs: [{}]}}",
            self.group,
            self.resource,
            self.verb.as_str()
        )
    }
}

/// The accesses `vipd preflight` checks for `needs` in `namespaces`: one per (group,
/// resource, subresource, verb, namespace) of the rows of [`API_CALLS`] `needs` wants,
/// without duplicates, in the table's order.
pub fn checks_for(needs: &Needs, namespaces: &Namespaces) -> Vec<AccessCheck> {
    let mut out: Vec<AccessCheck> = Vec::new();
    for c in API_CALLS.iter().filter(|c| needs.wants(c)) {
        let a = AccessCheck {
            group: c.group,
            resource: c.resource,
            subresource: c.subresource,
            verb: c.verb,
            namespace: namespaces.resolve(c.scope),
            name: c.names.first().copied(),
        };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}
