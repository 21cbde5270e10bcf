//! S41: `enable_node_labeling` (kube-vip's `--enableNodeLabeling`) against the real API server:
//! the control-plane lease holder labels its own Node `kube-vip.io/has-ip=<VIP>`, a node
//! that does not hold the lease removes a stale label at start, and the label moves with
//! the lease on a graceful hand-over. vipd runs with only the RBAC `vipd manifest rbac
//! --enableNodeLabeling` generates. A node without a Node object holds the VIP all the same,
//! says so once, and labels the Node once it is registered.
//!
//! Run as root: `cargo test --test lab_node_label` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;
use xtask::lab::{Lab, LabOptions, NodeRbac, Signal};

const HAS_IP: &str = vipd::nodes::label::HAS_IP;
const LABELING: &[(&str, &str)] = &[("enable_node_labeling", "true")];

/// Registers Node `name` (as admin), with `labels`.
fn create_node(lab: &Lab, name: &str, labels: serde_json::Value) {
    let node =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}});
    let r = lab
        .api_request("POST", "/api/v1/nodes", Some(&node.to_string()))
        .expect("create node");
    assert_eq!(r.status, 201, "create node {name}: {}", r.body);
}

/// The `kube-vip.io/has-ip` label of Node `name`, if any.
fn has_ip(lab: &Lab, name: &str) -> Option<String> {
    let r = lab
        .api_request("GET", &format!("/api/v1/nodes/{name}"), None)
        .expect("get node");
    assert_eq!(r.status, 200, "get node {name}: {}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).expect("node json");
    v["metadata"]["labels"][HAS_IP].as_str().map(str::to_string)
}

/// A lab whose node users have exactly the rights of `vipd manifest rbac
/// --enableNodeLabeling`.
fn labeling_lab(test: &str) -> Option<Lab> {
    let lab = lab(
        test,
        LabOptions {
            node_rbac: NodeRbac::None,
            ..Default::default()
        },
    )?;
    apply_generated_role_to_nodes_with(&lab, true);
    Some(lab)
}

/// The holder labels its Node; a follower removes a stale label at start; on SIGTERM the
/// old holder removes its label before it exits and the new holder labels itself.
#[test]
fn s41_holder_is_labelled_and_the_label_moves_on_handover() {
    let Some(lab) = labeling_lab("node_label_handover") else {
        return;
    };
    create_node(&lab, "node-a", json!({}));
    // Left by an earlier holder that crashed.
    create_node(&lab, "node-b", json!({ HAS_IP: VIP }));
    let limit = Duration::from_secs(30);

    let mut a = start_vipd(&lab, "node-a", T531, LABELING);
    assert_eq!(single_holder(&lab, VIP, limit), "node-a");
    let labelled = |n: &str| has_ip(&lab, n).as_deref() == Some(VIP);
    wait_until("node-a labelled", limit, || labelled("node-a"));

    let mut b = start_vipd(&lab, "node-b", T531, LABELING);
    wait_until("node-b's stale label removed", limit, || {
        has_ip(&lab, "node-b").is_none()
    });
    assert_eq!(holders(&lab, VIP), vec!["node-a".to_string()]);
    assert!(labelled("node-a"));

    a.signal(Signal::SIGTERM).unwrap();
    let status = a
        .wait_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap_or_else(|| {
            dump(&[&a, &b]);
            panic!("node-a did not exit within 5 s of SIGTERM")
        });
    assert!(status.success(), "exit status {status:?}");
    // Removed on the way out, before the process ended.
    assert_eq!(has_ip(&lab, "node-a"), None, "{}", a.log());
    wait_for_takeover(&lab, VIP, "node-a", "node-b takes over", limit);
    wait_until("node-b labelled", limit, || labelled("node-b"));
    assert_eq!(has_ip(&lab, "node-a"), None);
    assert!(
        !b.log().contains("cannot update this node's label"),
        "{}",
        b.log()
    );
    b.signal(Signal::SIGTERM).unwrap();
    let _ = b.wait_timeout(Duration::from_secs(5));
}

/// Bootstrap: no Node object yet. The VIP is held regardless, the missing Node is logged
/// once at info (retries at debug), and the Node is labelled once it is registered.
#[test]
fn s41_no_node_object_holds_the_vip_and_labels_it_once_registered() {
    let Some(lab) = labeling_lab("node_label_bootstrap") else {
        return;
    };
    let p = start_vipd(&lab, "node-a", T531, LABELING);
    assert_eq!(single_holder(&lab, VIP, Duration::from_secs(30)), "node-a");
    let count = |s: &str| p.log().matches(s).count();
    wait_until("two quiet retries", Duration::from_secs(30), || {
        count("still no Node object of this name") >= 2
    });
    assert_eq!(
        count("no Node object of this name yet"),
        1,
        "said once:\n{}",
        p.log()
    );
    create_node(&lab, "node-a", json!({}));
    wait_until("node-a labelled", Duration::from_secs(30), || {
        has_ip(&lab, "node-a").as_deref() == Some(VIP)
    });
    assert_eq!(holders(&lab, VIP), vec!["node-a".to_string()]);
}
