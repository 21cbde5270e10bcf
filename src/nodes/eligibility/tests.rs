//! Eligibility decisions.

use super::*;

fn node(json: serde_json::Value) -> Node {
    serde_json::from_value(json).unwrap()
}

const NONE: EligibilityRules = EligibilityRules {
    drain_on_cordon: false,
    exclude_cordoned: false,
};

#[test]
fn facts_from_the_node_object() {
    assert_eq!(NodeFacts::of(None), NodeFacts::default());
    let n = node(serde_json::json!({
        "metadata": {
            "name": "node-a",
            "labels": {EXCLUDE_LABEL: ""},
            "annotations": {DRAIN_ANNOTATION: "True"},
        },
        "spec": {"unschedulable": true},
        "status": {"conditions": [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "NetworkUnavailable", "status": "True"},
            {"type": "Ready", "status": "Unknown"},
        ]},
    }));
    assert_eq!(
        NodeFacts::of(Some(&n)),
        NodeFacts {
            exists: true,
            excluded: true,
            drain_annotation: true,
            cordoned: true,
            not_ready: true,
            network_unavailable: true,
        }
    );
    // A plain node: no condition reported yet counts as ready; a drain annotation that is
    // not a true value is no drain.
    let n = node(serde_json::json!({
        "metadata": {"name": "node-b", "annotations": {DRAIN_ANNOTATION: "no"}},
    }));
    let f = NodeFacts::of(Some(&n));
    assert!(f.exists && !f.drain_annotation && !f.not_ready && !f.excluded && !f.cordoned);
    assert!(!f.network_unavailable);
    let n = node(serde_json::json!({
        "metadata": {"name": "node-c"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }));
    assert!(!NodeFacts::of(Some(&n)).not_ready);
}

/// `NetworkUnavailable` counts only when `True` (metallb #1710); `False` (what CNIs such as
/// Calico write once the network is up), `Unknown` and absent are an available network.
#[test]
fn network_unavailable_only_when_the_condition_is_true() {
    let cases = [
        (Some("True"), true),
        (Some("False"), false),
        (Some("Unknown"), false),
        (None, false),
    ];
    for (status, unavailable) in cases {
        let conditions: Vec<serde_json::Value> = status
            .iter()
            .map(|s| serde_json::json!({"type": "NetworkUnavailable", "status": s}))
            .chain([serde_json::json!({"type": "Ready", "status": "True"})])
            .collect();
        let n = node(serde_json::json!({
            "metadata": {"name": "node-a"},
            "status": {"conditions": conditions},
        }));
        let f = NodeFacts::of(Some(&n));
        assert_eq!(f.network_unavailable, unavailable, "{status:?}");
        assert!(!f.not_ready, "{status:?}");
    }
}

#[test]
fn services_need_an_eligible_node_the_control_plane_only_an_undrained_one() {
    let f = |excluded, drain_annotation, cordoned, not_ready| NodeFacts {
        exists: true,
        excluded,
        drain_annotation,
        cordoned,
        not_ready,
        network_unavailable: false,
    };
    let no_network = NodeFacts {
        network_unavailable: true,
        ..f(false, false, false, false)
    };
    let ok = f(false, false, false, false);
    assert_eq!(services_ineligibility(&ok, NONE, false), None);
    assert_eq!(control_plane_ineligibility(&ok, NONE, false), None);
    // No Node object: eligible (bootstrap).
    assert_eq!(
        services_ineligibility(&NodeFacts::default(), NONE, false),
        None
    );

    let cases = [
        (
            f(true, false, false, false),
            Some(Ineligible::Excluded),
            None,
        ),
        (
            f(false, false, false, true),
            Some(Ineligible::NotReady),
            None,
        ),
        // NetworkUnavailable: like NotReady, for Service VIPs only (metallb #1710).
        (
            no_network.clone(),
            Some(Ineligible::NetworkUnavailable),
            None,
        ),
        // NotReady is named first when both hold.
        (
            NodeFacts {
                not_ready: true,
                ..no_network.clone()
            },
            Some(Ineligible::NotReady),
            None,
        ),
        // Cordoned with the network unavailable: the network is the reason.
        (
            NodeFacts {
                cordoned: true,
                ..no_network.clone()
            },
            Some(Ineligible::NetworkUnavailable),
            None,
        ),
        // Cordoned: eligible by default.
        (f(false, false, true, false), None, None),
        (
            f(false, true, false, false),
            Some(Ineligible::DrainAnnotation),
            Some(Ineligible::DrainAnnotation),
        ),
        // Drains come first.
        (
            f(true, true, true, true),
            Some(Ineligible::DrainAnnotation),
            Some(Ineligible::DrainAnnotation),
        ),
    ];
    for (facts, svc, cp) in cases {
        assert_eq!(
            services_ineligibility(&facts, NONE, false),
            svc,
            "{facts:?}"
        );
        assert_eq!(
            control_plane_ineligibility(&facts, NONE, false),
            cp,
            "{facts:?}"
        );
    }
    // `vipd drain` wins over everything, for both.
    assert_eq!(
        services_ineligibility(&f(true, true, false, true), NONE, true),
        Some(Ineligible::DrainedLocally)
    );
    assert_eq!(
        control_plane_ineligibility(&ok, NONE, true),
        Some(Ineligible::DrainedLocally)
    );
    // The cordon options.
    let cordoned = f(false, false, true, false);
    let exclude = EligibilityRules {
        exclude_cordoned: true,
        ..NONE
    };
    assert_eq!(
        services_ineligibility(&cordoned, exclude, false),
        Some(Ineligible::Cordoned)
    );
    assert_eq!(control_plane_ineligibility(&cordoned, exclude, false), None);
    let drain = EligibilityRules {
        drain_on_cordon: true,
        ..NONE
    };
    assert_eq!(
        services_ineligibility(&cordoned, drain, false),
        Some(Ineligible::CordonDrain)
    );
    assert_eq!(
        control_plane_ineligibility(&cordoned, drain, false),
        Some(Ineligible::CordonDrain)
    );
}

#[test]
fn reasons_have_distinct_labels_and_say_why() {
    let labels: std::collections::BTreeSet<&str> =
        Ineligible::ALL.iter().map(|r| r.label()).collect();
    assert_eq!(labels.len(), Ineligible::ALL.len());
    assert!(Ineligible::Excluded.to_string().contains(EXCLUDE_LABEL));
    assert!(
        Ineligible::DrainAnnotation
            .to_string()
            .contains(DRAIN_ANNOTATION)
    );
    assert_eq!(
        Ineligible::NetworkUnavailable.label(),
        "network-unavailable"
    );
    assert!(
        Ineligible::NetworkUnavailable
            .to_string()
            .contains("NetworkUnavailable")
    );
}

/// This node's facts follow its Node object in the process's Node cache: `None` until the
/// first list is in (also while it lists), the facts after it (no Node: it does not exist),
/// published again only when they change; another Node's changes publish nothing.
#[tokio::test]
async fn own_node_facts_follow_the_shared_cache_and_publish_only_changes() {
    use kube::runtime::watcher::Event::*;
    let (events, cache) = crate::kube::watch::test_cache::<Node>();
    let (tx, mut facts) = watch::channel(None);
    let stop = CancellationToken::new();
    let task = tokio::spawn(follow_own_node(
        cache.clone(),
        "node-a".into(),
        tx,
        stop.clone(),
    ));
    let other = || node(serde_json::json!({"metadata": {"name": "node-b"}}));
    let mut changes = cache.changes();
    events.unbounded_send(Ok(Init)).unwrap();
    events.unbounded_send(Ok(InitApply(other()))).unwrap();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*changes.borrow(), 0, "mid-list: the cache has not changed");
    assert_eq!(*facts.borrow_and_update(), None, "mid-list: not read yet");
    events.unbounded_send(Ok(InitDone)).unwrap();
    facts.changed().await.unwrap();
    assert_eq!(*facts.borrow_and_update(), Some(NodeFacts::default()));
    let drained = node(serde_json::json!({
        "metadata": {"name": "node-a", "annotations": {DRAIN_ANNOTATION: "true"}},
    }));
    events.unbounded_send(Ok(Apply(drained.clone()))).unwrap();
    facts.changed().await.unwrap();
    let want = NodeFacts {
        exists: true,
        drain_annotation: true,
        ..Default::default()
    };
    assert_eq!(facts.borrow_and_update().as_ref(), Some(&want));
    // The same Node again (no change of the cache) and another Node's change: nothing
    // published.
    events.unbounded_send(Ok(Apply(drained))).unwrap();
    events.unbounded_send(Ok(Delete(other()))).unwrap();
    changes.wait_for(|n| *n >= 3).await.unwrap();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!facts.has_changed().unwrap());
    // The watch fails: the last facts stay.
    events
        .unbounded_send(Err(kube::runtime::watcher::Error::NoResourceVersion))
        .unwrap();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(facts.borrow().as_ref(), Some(&want));
    stop.cancel();
    task.await.unwrap();
}
