//! S38 (permissions and status): vipd runs with only the RBAC `vipd manifest rbac`
//! generates (the lab's node users have no other rights, `NodeRbac::None`): every Event and
//! status write succeeds, through events.k8s.io/v1 where the server serves it and through
//! core v1 Events where it does not; `vipd preflight` passes with that RBAC and fails naming
//! the missing rule when one is taken away.
//!
//! Run as root: `cargo test --test lab_rbac` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::time::Duration;

use support::*;
use vipd::cmd::manifest::rbac;
use xtask::lab::{Lab, LabOptions, NodeRbac};

const SVC_VIP: &str = "192.0.2.20";

/// Control plane and Services with per-Service leases, on `node`.
fn start(lab: &Lab, node: &str) -> xtask::lab::LabProcess {
    start_vipd(
        lab,
        node,
        T531,
        &[("svc_enable", "true"), ("svc_election", "true")],
    )
}

/// `vipd preflight --no-arp-probe` on `node` with the manager's environment: (success,
/// output).
fn preflight(lab: &Lab, node: &str) -> (bool, String) {
    let mut p = spawn_vipd(
        lab,
        node,
        &["preflight", "--no-arp-probe"],
        T531,
        &[("svc_enable", "true"), ("svc_election", "true")],
    );
    let status = p
        .wait_timeout(Duration::from_secs(60))
        .unwrap()
        .unwrap_or_else(|| panic!("preflight did not finish:\n{}", p.log()));
    (status.success(), p.log())
}

/// Creates `web` (a good address) and `bad` (a malformed one) and waits for what the holder
/// writes: `web`'s status, vipHost and AddressAnnounced Event, `bad`'s InvalidAddress
/// Warning. `events` lists (type, reason, message) of the Events about a Service.
fn services_get_status_and_events(
    lab: &Lab,
    procs: &[&xtask::lab::LabProcess],
    events: impl Fn(&str) -> Vec<(String, String, String)>,
) {
    create_service(
        lab,
        &service_json("web", Some(SVC_VIP), None, &[(80, "TCP")], false),
    );
    create_service(
        lab,
        &service_json("bad", Some("192.0.2.300"), None, &[(80, "TCP")], false),
    );
    let waited = |what: &str, f: &mut dyn FnMut() -> bool| {
        let start = std::time::Instant::now();
        while !f() {
            if start.elapsed() > Duration::from_secs(30) {
                dump(procs);
                panic!("timed out after 30 s waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    waited("web announced", &mut || holders(lab, SVC_VIP).len() == 1);
    waited("web's status", &mut || {
        ingress_ips(lab, "web") == vec![SVC_VIP.to_string()]
    });
    waited("web's vipHost", &mut || {
        get_service(lab, "web").is_some_and(|s| {
            s["metadata"]["annotations"]["kube-vip.io/vipHost"].as_str() == Some("node-a")
        })
    });
    waited("web's AddressAnnounced Event", &mut || {
        events("web")
            .iter()
            .any(|(t, r, m)| t == "Normal" && r == "AddressAnnounced" && m.contains(SVC_VIP))
    });
    waited("bad's InvalidAddress Warning", &mut || {
        events("bad")
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "InvalidAddress" && m.contains("192.0.2.300"))
    });
}

/// Core v1 Events about `default/name`, as (type, reason, message).
fn core_events(lab: &Lab, name: &str) -> Vec<(String, String, String)> {
    let r = lab
        .api_request("GET", "/api/v1/namespaces/default/events", None)
        .expect("events");
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["source"]["component"] == "vipd")
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("type"), s("reason"), s("message"))
        })
        .collect()
}

/// S38 with the generated RBAC only (it once granted core `events` while vipd writes
/// events.k8s.io Events, so no Event was ever created): the AddressAnnounced Event, the
/// InvalidAddress Warning and the status are written, nothing is forbidden; preflight
/// passes, and fails naming the rule once `create` on events.k8s.io events is taken away.
#[test]
fn s38_generated_rbac_writes_events_and_status_and_preflight_checks_it() {
    let opts = LabOptions {
        node_rbac: NodeRbac::None,
        ..LabOptions::default()
    };
    let Some(lab) = lab("s38_rbac", opts) else {
        return;
    };
    apply_generated_rbac(&lab);
    let vipd = start(&lab, "node-a");
    wait_for("the control-plane VIP", Duration::from_secs(30), || {
        (holders(&lab, VIP) == ["node-a"]).then_some(())
    });
    services_get_status_and_events(&lab, &[&vipd], |n| events_for(&lab, n));
    let log = vipd.log();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "a forbidden call with the generated RBAC:\n{log}"
    );
    assert!(!log.contains("cannot record Event"), "{log}");

    let (ok, out) = preflight(&lab, "node-a");
    assert!(ok, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("rbac") && l.contains(" ok ") && l.contains("events.k8s.io/v1")),
        "{out}"
    );

    // Take `create` on events.k8s.io events away from the generated ClusterRole.
    let mut role = serde_json::to_value(rbac::cluster_role(false)).unwrap();
    for rule in role["rules"].as_array_mut().unwrap() {
        if rule["apiGroups"] == serde_json::json!(["events.k8s.io"]) {
            rule["verbs"] = serde_json::json!(["patch"]);
        }
    }
    let r = lab
        .api_request(
            "PUT",
            &format!(
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/{}",
                vipd::kube::api::CLUSTER_ROLE
            ),
            Some(&role.to_string()),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let out = wait_for(
        "preflight to fail on the missing rule",
        Duration::from_secs(30),
        || {
            let (ok, out) = preflight(&lab, "node-a");
            (!ok).then_some(out)
        },
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("rbac"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("FAIL"), "{out}");
    assert!(
        row.contains("create events.k8s.io/events in namespace kube-system")
            && row.contains("create events.k8s.io/events cluster-wide"),
        "{out}"
    );
    assert!(!row.contains("patch events.k8s.io"), "{out}");
    assert!(
        out.contains(r#"{apiGroups: ["events.k8s.io"], resources: [events], verbs: [create]}"#)
            && out.contains("vipd manifest rbac"),
        "{out}"
    );
    assert!(out.contains("preflight FAILED: 1 check(s)"), "{out}");

    // And the manager now says so at warn, naming the object, reason and HTTP status.
    create_service(
        &lab,
        &service_json("bad2", Some("192.0.2.301"), None, &[(80, "TCP")], false),
    );
    wait_for("the failed Event at warn", Duration::from_secs(30), || {
        vipd.log()
            .lines()
            .any(|l| {
                l.contains("WARN")
                    && l.contains("cannot record Event")
                    && l.contains("default/bad2")
                    && l.contains("InvalidAddress")
                    && l.contains("403")
            })
            .then_some(())
    });
}

/// S38 on a server that does not serve events.k8s.io/v1 (`--runtime-config`): vipd writes
/// core v1 Events, which the generated RBAC allows too.
#[test]
fn s38_core_events_where_events_k8s_io_is_not_served() {
    let opts = LabOptions {
        node_rbac: NodeRbac::None,
        apiserver_args: vec!["--runtime-config=events.k8s.io/v1=false".into()],
        ..LabOptions::default()
    };
    let Some(lab) = lab("s38_core_events", opts) else {
        return;
    };
    let r = lab
        .api_request("GET", "/apis/events.k8s.io/v1", None)
        .unwrap();
    assert_eq!(
        r.status, 404,
        "events.k8s.io/v1 is still served: {}",
        r.body
    );
    apply_generated_rbac(&lab);
    let vipd = start(&lab, "node-a");
    services_get_status_and_events(&lab, &[&vipd], |n| core_events(&lab, n));
    let log = vipd.log();
    assert!(log.contains("writing Events through core v1"), "{log}");
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    let (ok, out) = preflight(&lab, "node-a");
    assert!(ok, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("rbac") && l.contains(" ok ") && l.contains("core v1")),
        "{out}"
    );
}

/// Issue 26 (Harvester's charts as shipped): under the ClusterRole of kube-vip's chart (the
/// `kube-vip` subchart of `harvester-cloud-provider`, verbatim rules: `update`, not
/// `patch`, on Services and their status; no Events, no ConfigMaps), vipd announces a
/// Service and writes its status and `kube-vip.io/vipHost`: the merge patch is refused
/// with 403 once, then the writes are read-modify-write updates.
#[test]
fn s38_kube_vip_chart_rbac_still_gets_status_and_vip_host_written() {
    let opts = LabOptions {
        node_rbac: NodeRbac::None,
        ..LabOptions::default()
    };
    let Some(lab) = lab("kube_vip_chart_rbac", opts) else {
        return;
    };
    apply_kube_vip_chart_rbac(&lab);
    let vipd = start_vipd_services(&lab, "node-a", false, &[]);
    create_service(
        &lab,
        &service_json("web", Some(SVC_VIP), None, &[(80, "TCP")], false),
    );
    wait_for("web announced", Duration::from_secs(30), || {
        (holders(&lab, SVC_VIP) == ["node-a"]).then_some(())
    });
    wait_until("web's status", Duration::from_secs(30), || {
        ingress_ips(&lab, "web") == vec![SVC_VIP.to_string()]
    });
    wait_until("web's vipHost", Duration::from_secs(30), || {
        get_service(&lab, "web").is_some_and(|s| {
            s["metadata"]["annotations"]["kube-vip.io/vipHost"].as_str() == Some("node-a")
        })
    });
    assert!(
        vipd.log().contains("read-modify-write updates"),
        "{}",
        vipd.log()
    );
}
