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

/// Runs `vipd status ARGS` in node-b's namespace (it only talks to the API server) and
/// returns whether it succeeded and its stdout + stderr.
fn vipd_status(lab: &Lab, args: &[&str]) -> (bool, String) {
    let vipd = env!("CARGO_BIN_EXE_vipd");
    let mut all = vec!["status"];
    all.extend(args);
    let mut p = lab
        .spawn("node-b", vipd, &all, &[])
        .expect("spawn vipd status");
    let status = p
        .wait_timeout(Duration::from_secs(30))
        .unwrap()
        .unwrap_or_else(|| panic!("vipd status did not finish:\n{}", p.log()));
    (status.success(), p.log())
}

/// `vipd status`, read from the API alone: the control-plane holder with its VIP from the
/// node label, a Service with its own lease, holder and vipd's last Event, as a table and as
/// JSON; with a user that may not list nodes or Events it still prints the table and says
/// what it could not read.
#[test]
fn s41_vipd_status_shows_holders_from_the_api() {
    let Some(lab) = labeling_lab("status") else {
        return;
    };
    create_node(&lab, "node-a", json!({}));
    let limit = Duration::from_secs(30);
    let mut a = start_vipd(
        &lab,
        "node-a",
        T531,
        &[
            ("enable_node_labeling", "true"),
            ("svc_enable", "true"),
            ("svc_election", "true"),
        ],
    );
    assert_eq!(single_holder(&lab, VIP, limit), "node-a");
    wait_until("node-a labelled", limit, || {
        has_ip(&lab, "node-a").as_deref() == Some(VIP)
    });
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.20"), None, &[(80, "TCP")], false),
    );
    wait_until("web announced", limit, || {
        ingress_ips(&lab, "web") == vec!["192.0.2.20".to_string()]
    });
    // The holder writes the ingress before it posts the Event (both go through the
    // writer's slots, in that order): wait for the Event so the status has one to show.
    wait_until("web's AddressAnnounced Event", limit, || {
        events_for(&lab, "web")
            .iter()
            .any(|(_, reason, _)| reason == "AddressAnnounced")
    });
    let admin = lab.admin_kubeconfig();
    let admin = admin.to_str().unwrap();

    let (ok, out) = vipd_status(&lab, &["--kubeconfig", admin, "-o", "json"]);
    assert!(ok, "{out}");
    let json_start = out.find('{').expect("JSON output");
    let doc: serde_json::Value = serde_json::from_str(&out[json_start..]).expect(&out);
    let rows = doc["vips"].as_array().expect("vips");
    let cp = &rows[0];
    assert_eq!(cp["kind"], "control-plane", "{out}");
    assert_eq!(cp["holder"], "node-a", "{out}");
    assert_eq!(cp["vips"], json!([VIP]), "{out}");
    assert_eq!(cp["expired"], false, "{out}");
    let web = rows
        .iter()
        .find(|r| r["name"] == "default/web")
        .expect(&out);
    assert_eq!(web["holder"], "node-a", "{out}");
    assert_eq!(web["lease"], "default/kubevip-web", "{out}");
    assert_eq!(web["vips"], json!(["192.0.2.20"]), "{out}");
    let notes = web["notes"].to_string();
    assert!(notes.contains("last Event AddressAnnounced"), "{out}");
    assert!(!notes.contains("ingress shows"), "status matches: {out}");

    let (ok, out) = vipd_status(&lab, &["--kubeconfig", admin]);
    assert!(ok, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("service") && l.contains("default/web"))
        .expect(&out);
    assert!(
        line.contains("192.0.2.20") && line.contains("node-a"),
        "{out}"
    );

    // node-b's own user has the generated node RBAC only (no list on nodes or Events).
    let own = lab.kubeconfig("node-b").unwrap();
    let (ok, out) = vipd_status(&lab, &["--kubeconfig", own.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("default/web"), "{out}");
    assert!(out.contains("note: cannot list"), "{out}");

    let (ok, out) = vipd_status(
        &lab,
        &["--kubeconfig", admin, "--cp-lease", "plndr-cp-lock"],
    );
    assert!(!ok && out.contains("--cp-lease \"plndr-cp-lock\""), "{out}");
    a.signal(Signal::SIGTERM).unwrap();
    let _ = a.wait_timeout(Duration::from_secs(5));
}
