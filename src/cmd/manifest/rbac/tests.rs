use super::*;
use crate::kube::api::*;
use k8s_openapi::Resource;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Event as CoreEvent, Node, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use std::collections::BTreeSet;

/// enable_node_labeling reads and merge-patches the node's own Node: get and patch on
/// nodes, only then; preflight asks for them only with the control plane on.
#[test]
fn node_get_and_patch_only_with_labeling() {
    let node_verbs = |l| {
        cluster_role(l)
            .rules
            .unwrap()
            .into_iter()
            .find(|r| r.resources.as_ref().unwrap()[0] == "nodes")
            .map(|r| r.verbs)
            .unwrap()
    };
    assert_eq!(node_verbs(false), ["list", "watch"]);
    assert_eq!(node_verbs(true), ["get", "list", "watch", "patch"]);
    let ns = Namespaces {
        lease: "kube-system".into(),
        ipam: "kube-system".into(),
        services: None,
        services_election: false,
    };
    let described = |n: &Needs| -> Vec<String> {
        checks_for(n, &ns)
            .iter()
            .map(AccessCheck::describe)
            .collect()
    };
    let labeling = described(&Needs::manifest(true));
    for want in ["get nodes cluster-wide", "patch nodes cluster-wide"] {
        assert!(labeling.contains(&want.to_string()), "{labeling:?}");
    }
    let without = described(&Needs::manifest(false));
    assert!(
        !without
            .iter()
            .any(|d| d.starts_with("get nodes") || d.starts_with("patch nodes")),
        "{without:?}"
    );
}

/// svc_ridethrough reads one Secret, the peer key: `get` on `secrets` restricted to that
/// name, by default (issue 27), not with `--servicesRideThrough=false`; preflight asks
/// about that very object.
#[test]
fn secret_get_by_name_only_with_ride_through() {
    let role = cluster_role_for(false, true);
    let r = rule(&role, "", "secrets").expect("secrets rule");
    assert_eq!(r.verbs, ["get"]);
    assert_eq!(
        r.resource_names.as_deref(),
        Some(&["vipd-peer-key".to_string()][..])
    );
    assert!(rule(&cluster_role_for(true, false), "", "secrets").is_none());
    let ns = Namespaces {
        lease: "kube-system".into(),
        ipam: "kube-system".into(),
        services: None,
        services_election: true,
    };
    let needs = Needs {
        ride_through: true,
        ..Needs::manifest(false)
    };
    let c = checks_for(&needs, &ns)
        .into_iter()
        .find(|c| c.resource == "secrets")
        .expect("secret check");
    assert_eq!(
        c.describe(),
        "get secrets vipd-peer-key in namespace kube-system"
    );
    assert_eq!(
        c.rule(),
        "{apiGroups: [\"\"], resources: [secrets], resourceNames: [vipd-peer-key], verbs: [get]}"
    );
    let off = Needs {
        ride_through: false,
        ..Needs::manifest(true)
    };
    let without: Vec<_> = checks_for(&off, &ns)
        .into_iter()
        .filter(|c| c.resource == "secrets")
        .collect();
    assert!(without.is_empty(), "{without:?}");
}

/// No wildcard, and the only Secret is the peer key, by name, `get` only.
#[test]
fn no_wildcards_and_no_other_secrets() {
    for r in cluster_role(true).rules.unwrap() {
        assert!(!r.verbs.iter().any(|v| v == "*"));
        for res in r.resources.unwrap() {
            assert!(res != "*", "{res}");
            if res == "secrets" {
                assert_eq!(r.verbs, ["get"]);
                assert_eq!(
                    r.resource_names.as_deref(),
                    Some(&["vipd-peer-key".to_string()][..])
                );
            }
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
    assert_eq!(verbs("", "configmaps"), ["list", "watch"]);
    assert_eq!(verbs("", "secrets"), ["get"]);
    assert_eq!(role.rules.unwrap().len(), 10);
}

#[test]
fn checks_follow_the_configuration() {
    let ns = Namespaces {
        lease: "kube-system".into(),
        ipam: "kube-system".into(),
        services: None,
        services_election: true,
    };
    let cp_only = Needs {
        services: false,
        ipam: false,
        events_v1: Some(true),
        endpoint_slices: Some(true),
        ..Needs::manifest(false)
    };
    let c = checks_for(&cp_only, &ns);
    let described: Vec<String> = c.iter().map(AccessCheck::describe).collect();
    assert!(
        described
            .contains(&"update coordination.k8s.io/leases in namespace kube-system".to_string()),
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
        name: None,
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
            "ConfigMap",
            Some((ConfigMap::GROUP, ConfigMap::URL_PATH_SEGMENT)),
        ),
        (
            "Endpoints",
            Some((Endpoints::GROUP, Endpoints::URL_PATH_SEGMENT)),
        ),
        (
            "EndpointSlice",
            Some((EndpointSlice::GROUP, EndpointSlice::URL_PATH_SEGMENT)),
        ),
        (
            "EventsV1Event",
            Some((EventsV1Event::GROUP, EventsV1Event::URL_PATH_SEGMENT)),
        ),
        (
            "CoreEvent",
            Some((CoreEvent::GROUP, CoreEvent::URL_PATH_SEGMENT)),
        ),
        ("Secret", Some((Secret::GROUP, Secret::URL_PATH_SEGMENT))),
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
        // The table and this test name types in their docs and messages. `vipd status`
        // (overview.rs) runs with the user's own kubeconfig, not vipd's ServiceAccount: its
        // lists (leases, services, events, nodes) are in docs/operators.md, not the role.
        if p.extension().is_none_or(|e| e != "rs")
            || p.ends_with("manifest/rbac.rs")
            || p.ends_with("manifest/rbac/tests.rs")
            || p.ends_with("kube/api.rs")
            || p.ends_with("src/cmd/status/mod.rs")
        {
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
        "EventsV1Event",
        "CoreEvent",
    ] {
        assert!(seen.contains(ty), "no Api<{ty}> found in src/: {seen:?}");
    }
}
