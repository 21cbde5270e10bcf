//! The Node cache's stripping and the one-watch rule.

use super::*;

/// A Node as a kubelet writes it: every field a reader looks at and much it does not.
fn full_node() -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "node-a",
            "resourceVersion": "42",
            "uid": "0c3d",
            "labels": {
                "node-role.kubernetes.io/control-plane": "",
                eligibility::EXCLUDE_LABEL: "",
                "vipd.io/ridethrough-member": "false",
                "zone": "a",
            },
            "annotations": {
                eligibility::DRAIN_ANNOTATION: "true",
                "node.alpha.kubernetes.io/ttl": "0",
                crate::kube::watch::LAST_APPLIED: "{...}",
            },
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "podCIDR": "10.244.0.0/24",
            "podCIDRs": ["10.244.0.0/24", "fd00:10:244::/64"],
            "unschedulable": true,
            "providerID": "k3s://node-a",
            "taints": [{"key": "k", "effect": "NoSchedule"}],
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "192.0.2.11"},
                {"type": "ExternalIP", "address": "198.51.100.11"},
                {"type": "Hostname", "address": "node-a"},
            ],
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
            ],
            "images": [{"names": ["registry.example/huge:v1"], "sizeBytes": 123456789}],
            "nodeInfo": {
                "machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6",
                "osImage": "Debian", "containerRuntimeVersion": "containerd://1",
                "kubeletVersion": "v1.33.0", "kubeProxyVersion": "v1.33.0",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        },
    }))
    .unwrap()
}

/// Every reader of the Node cache reads the same from a stripped Node as from the whole
/// one: eligibility's facts, node addresses, pod CIDRs and the labels (node selectors, the
/// peer membership, the load balancer's control-plane label and readiness, which
/// `controlplane::lb` checks on its side); what no reader reads is gone.
#[test]
fn a_stripped_node_reads_the_same_to_every_reader() {
    let full = full_node();
    let mut stripped = full.clone();
    strip_node(&mut stripped);
    assert_eq!(
        eligibility::NodeFacts::of(Some(&stripped)),
        eligibility::NodeFacts::of(Some(&full))
    );
    let (full, stripped) = (Arc::new(full), Arc::new(stripped));
    let (one, other) = (std::slice::from_ref(&full), std::slice::from_ref(&stripped));
    assert_eq!(node_addresses(other), node_addresses(one));
    assert_eq!(node_addresses(other).len(), 2);
    assert_eq!(pod_cidrs(other), pod_cidrs(one));
    assert_eq!(pod_cidrs(other).len(), 2);
    assert_eq!(stripped.metadata.labels, full.metadata.labels);
    assert_eq!(stripped.metadata.name, full.metadata.name);
    assert_eq!(
        stripped.metadata.resource_version,
        full.metadata.resource_version
    );
    // Gone: managedFields, other annotations, images, node info, other conditions and
    // the conditions' reasons and times.
    assert_eq!(stripped.metadata.managed_fields, None);
    assert_eq!(
        stripped.metadata.annotations,
        Some(
            [(
                eligibility::DRAIN_ANNOTATION.to_string(),
                "true".to_string()
            )]
            .into()
        )
    );
    let status = stripped.status.as_ref().unwrap();
    assert_eq!(status.images, None);
    assert_eq!(status.node_info, None);
    let conditions: Vec<_> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.is_none()))
        .collect();
    assert_eq!(
        conditions,
        [
            ("NetworkUnavailable", "True", true),
            ("Ready", "True", true)
        ]
    );
    let spec = stripped.spec.as_ref().unwrap();
    assert_eq!(
        (spec.provider_id.as_ref(), spec.taints.as_ref()),
        (None, None)
    );
    // A Node without annotations, spec or status stays without them.
    let mut bare: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "node-b"}})).unwrap();
    strip_node(&mut bare);
    assert_eq!(bare.metadata.annotations, None);
    assert!(eligibility::NodeFacts::of(Some(&bare)).exists);
}

/// One Node watch per process (issue 28): the code builds an `Api<Node>` only for the Node
/// cache ([`start`]), the holder's label (get and patch of its own Node) and the start-up
/// check of the control-plane VIPs (one list); only the Node cache watches. A second
/// watch of Nodes (a reflector, a watcher, a list+watch per wing) fails this test: read
/// [`NodeCache`] instead. The API server's side of it: `lab_watch_health`'s
/// `s64_one_node_watch_per_process`.
#[test]
fn the_node_cache_is_the_only_node_watch() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // File -> what it may do with an Api<Node>.
    let allowed: &[(&str, &[&str])] = &[
        ("src/nodes/mod.rs", &["spawn_shared("]),
        ("src/nodes/label.rs", &["get_opt(", "patch("]),
        ("src/controlplane/mod.rs", &["api.list("]),
        // `vipd status`, with the user's kubeconfig: one list, no watch.
        ("src/cmd/status/mod.rs", &["list("]),
    ];
    let watching = ["watcher(", "spawn_reflector(", "spawn_shared(", ".watch("];
    let mut files = vec![root.join("src")];
    let mut found = Vec::new();
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
        // The API-call table, the RBAC tests and this test name the type in text.
        if p.extension().is_none_or(|e| e != "rs")
            || [
                "src/kube/api.rs",
                "src/cmd/manifest/rbac/tests.rs",
                "src/nodes/tests.rs",
            ]
            .contains(&rel.as_str())
        {
            continue;
        }
        let src = std::fs::read_to_string(&p).unwrap();
        // Spelled so that the RBAC table's own scan of `src/` does not read them as a type.
        let names_node_api = [concat!("Api", "<"), concat!("Api", "::<")]
            .iter()
            .any(|pat| {
                src.match_indices(pat).any(|(i, _)| {
                    let rest = &src[i + pat.len()..];
                    let ty = &rest[..rest.find('>').unwrap_or(rest.len())];
                    ty.rsplit("::").next().map(str::trim) == Some("Node")
                })
            });
        if !names_node_api {
            continue;
        }
        found.push(rel.clone());
        let Some((_, may)) = allowed.iter().find(|(f, _)| *f == rel) else {
            panic!(
                "{rel} builds an Api<Node>: a second Node watch or list? Read the process's \
                 Node cache (crate::nodes::NodeCache) instead"
            );
        };
        for w in watching {
            assert!(
                !src.contains(w) || may.contains(&w),
                "{rel} watches ({w}) next to its Api<Node>: the process has one Node watch, \
                 the Node cache (crate::nodes::start)"
            );
        }
    }
    found.sort();
    assert_eq!(
        found,
        [
            "src/cmd/status/mod.rs",
            "src/controlplane/mod.rs",
            "src/nodes/label.rs",
            "src/nodes/mod.rs"
        ]
    );
}
