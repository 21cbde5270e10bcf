//! S38/S39: Events and status that are always right, with only the RBAC that
//! `vipd manifest rbac` generates (the lab's node users have no other rights):
//! - status and `kube-vip.io/vipHost` are level-triggered: written once the permission is
//!   back, restored when someone else changes them (also on shard leases, and under the
//!   ClusterRole of kube-vip's chart, which grants `update` but not `patch`);
//! - one Event per change, whatever the number of nodes and restarts (deterministic Event
//!   names);
//! - every Service vipd will not announce gets a Warning saying why and no status: the
//!   control-plane VIP, the subnet's broadcast and network addresses, and
//!   `externalTrafficPolicy: Local` with no ready endpoint anywhere (status cleared, then
//!   restored when an endpoint appears).
//!
//! Run as root: `cargo test --test lab_events_status` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::time::Duration;

use support::*;
use vipd::cmd::manifest::rbac;
use xtask::lab::{Lab, LabOptions, LabProcess, NodeRbac};

/// A lab whose node users have only the generated RBAC.
fn rbac_lab(test: &str) -> Option<Lab> {
    let lab = lab(
        test,
        LabOptions {
            node_rbac: NodeRbac::None,
            ..LabOptions::default()
        },
    )?;
    apply_generated_rbac(&lab);
    Some(lab)
}

/// Services mode with per-Service leases on `node`.
fn start_svc(lab: &Lab, node: &str) -> LabProcess {
    start_vipd_services(lab, node, true, &[])
}

/// vipd's Events about `default/name` with `reason`, as (type, message).
fn events(lab: &Lab, name: &str, reason: &str) -> Vec<(String, String)> {
    events_for(lab, name)
        .into_iter()
        .filter(|(_, r, _)| r == reason)
        .map(|(t, _, m)| (t, m))
        .collect()
}

/// The Service's `kube-vip.io/vipHost`.
fn vip_host(lab: &Lab, name: &str) -> Option<String> {
    get_service(lab, name).and_then(|s| {
        s["metadata"]["annotations"]["kube-vip.io/vipHost"]
            .as_str()
            .map(str::to_string)
    })
}

/// Replaces the generated ClusterRole with `role`.
fn put_role(lab: &Lab, role: &serde_json::Value) {
    let path = format!(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/{}",
        vipd::kube::api::CLUSTER_ROLE
    );
    let current = lab.api_request("GET", &path, None).unwrap();
    let current: serde_json::Value = serde_json::from_str(&current.body).unwrap();
    let mut role = role.clone();
    role["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    let r = lab
        .api_request("PUT", &path, Some(&role.to_string()))
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Waits for `f` with a deadline, printing the logs of `procs` on timeout.
fn wait_or_dump(what: &str, limit: Duration, procs: &[&LabProcess], mut f: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !f() {
        if start.elapsed() > limit {
            dump(procs);
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// S38: a Service created while the holder can write neither `services/status` nor Events
/// keeps its VIP; its status and its AddressAnnounced Event (exactly one) are written as
/// soon as the permission is back (retried with back-off, no failover needed), and a
/// status changed by someone else is restored. Today's main tried once and never again.
#[test]
fn s39_status_written_after_rbac_restored() {
    let Some(lab) = rbac_lab("s39_status_rbac") else {
        return;
    };
    let full = serde_json::to_value(rbac::cluster_role(false)).unwrap();
    let mut without_status = full.clone();
    for rule in without_status["rules"].as_array_mut().unwrap() {
        if rule["resources"] == serde_json::json!(["services/status"]) {
            rule["verbs"] = serde_json::json!(["get"]);
        }
        // No Event either (both APIs): the announcement must not be lost.
        if rule["resources"] == serde_json::json!(["events"]) {
            rule["verbs"] = serde_json::json!(["patch"]);
        }
    }
    put_role(&lab, &without_status);
    let vipd = start_svc(&lab, "node-a");
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.30"), None, &[(80, "TCP")], false),
    );
    wait_or_dump(
        "web's VIP on node-a",
        Duration::from_secs(30),
        &[&vipd],
        || holders(&lab, "192.0.2.30") == ["node-a"],
    );
    wait_or_dump(
        "the forbidden status write",
        Duration::from_secs(30),
        &[&vipd],
        || vipd.log().contains("writing status failed"),
    );
    assert!(ingress_ips(&lab, "web").is_empty());
    assert!(events(&lab, "web", "AddressAnnounced").is_empty());

    put_role(&lab, &full);
    // Back-off at most 20 s (+25 %) plus the RBAC cache.
    wait_or_dump(
        "web's status after the permission is back",
        Duration::from_secs(45),
        &[&vipd],
        || ingress_ips(&lab, "web") == ["192.0.2.30"],
    );
    assert_eq!(vip_host(&lab, "web").as_deref(), Some("node-a"));
    wait_or_dump(
        "the AddressAnnounced Event",
        Duration::from_secs(45),
        &[&vipd],
        || !events(&lab, "web", "AddressAnnounced").is_empty(),
    );

    // Someone else changes the status: restored from the cache's change, no failover.
    let r = lab
        .api_request(
            "PATCH",
            "/api/v1/namespaces/default/services/web/status",
            Some(r#"{"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.99"}]}}}"#),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    wait_or_dump(
        "web's status restored",
        Duration::from_secs(15),
        &[&vipd],
        || ingress_ips(&lab, "web") == ["192.0.2.30"],
    );
    let announced = events(&lab, "web", "AddressAnnounced");
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert_eq!(holders(&lab, "192.0.2.30"), ["node-a"]);
}

/// S39: a Service whose address is the control-plane VIP (cp_enable + svc_enable) is
/// refused with a Warning `ControlPlaneAddress` and gets no status, while the control-plane
/// VIP stays with the control-plane lease. Today's main left it pending without a word.
#[test]
fn s39_cp_vip_service_gets_warning() {
    let Some(lab) = rbac_lab("s39_cp_vip") else {
        return;
    };
    let vipd = start_vipd(
        &lab,
        "node-a",
        T531,
        &[("svc_enable", "true"), ("svc_election", "true")],
    );
    wait_or_dump(
        "the control-plane VIP",
        Duration::from_secs(30),
        &[&vipd],
        || holders(&lab, VIP) == ["node-a"],
    );
    create_service(
        &lab,
        &service_json("api", None, Some(VIP), &[(443, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.31"), None, &[(80, "TCP")], false),
    );
    wait_or_dump(
        "the ControlPlaneAddress Warning",
        Duration::from_secs(30),
        &[&vipd],
        || {
            events(&lab, "api", "ControlPlaneAddress")
                .iter()
                .any(|(t, m)| {
                    t == "Warning" && m.contains(VIP) && m.contains("spec.loadBalancerIP")
                })
        },
    );
    // A Service created after it is announced and has its status: the plan that refused
    // `api` has been applied.
    wait_or_dump("web's status", Duration::from_secs(30), &[&vipd], || {
        ingress_ips(&lab, "web") == ["192.0.2.31"]
    });
    assert!(ingress_ips(&lab, "api").is_empty());
    assert_eq!(vip_host(&lab, "api"), None);
    assert_eq!(holders(&lab, VIP), ["node-a"]);
    assert!(
        vipd.log().lines().any(|l| l.contains("WARN")
            && l.contains("default/api")
            && l.contains("ControlPlaneAddress")),
        "{}",
        vipd.log()
    );
}

/// S39: the broadcast (192.0.2.255) and network (192.0.2.0) addresses of the nodes'
/// 192.0.2.0/24 are refused with one `UnusableAddress` Warning each (two nodes see it,
/// one Event is kept), never bound, and get no status. Today's main bound them and
/// reported them announced.
#[test]
fn s39_broadcast_address_refused() {
    let Some(lab) = rbac_lab("s39_broadcast") else {
        return;
    };
    let a = start_svc(&lab, "node-a");
    let b = start_svc(&lab, "node-b");
    let procs = [&a, &b];
    create_service(
        &lab,
        &service_json("bcast", Some("192.0.2.255"), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("net", None, Some("192.0.2.0"), &[(80, "TCP")], false),
    );
    for (name, what) in [("bcast", "broadcast address"), ("net", "network address")] {
        wait_or_dump(
            &format!("{name}'s Warning"),
            Duration::from_secs(30),
            &procs,
            || {
                events(&lab, name, "UnusableAddress")
                    .iter()
                    .any(|(t, m)| t == "Warning" && m.contains(what) && m.contains("192.0.2.0/24"))
            },
        );
    }
    // Both nodes have planned with both Services once their logs say so.
    wait_or_dump(
        "both nodes' warnings",
        Duration::from_secs(30),
        &procs,
        || {
            procs.iter().all(|p| {
                let log = p.log();
                log.contains("192.0.2.255 is the broadcast address")
                    && log.contains("192.0.2.0 is the network address")
            })
        },
    );
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.32"), None, &[(80, "TCP")], false),
    );
    wait_or_dump("web's status", Duration::from_secs(30), &procs, || {
        ingress_ips(&lab, "web") == ["192.0.2.32"]
    });
    for (name, addr) in [("bcast", "192.0.2.255"), ("net", "192.0.2.0")] {
        assert!(holders(&lab, addr).is_empty(), "{addr} bound");
        assert!(ingress_ips(&lab, name).is_empty(), "{name} has a status");
        assert_eq!(vip_host(&lab, name), None);
        let ev = events(&lab, name, "UnusableAddress");
        assert_eq!(ev.len(), 1, "one Event for two nodes: {ev:?}");
        assert!(lease_holder(&lab, "default", &format!("kubevip-{name}")).is_none());
    }
}

/// S39 / S21: externalTrafficPolicy Local with no ready endpoint on any node: the VIP is
/// dropped, the status and vipHost are cleared and one `NoLocalEndpoint` Warning is
/// posted; when an endpoint appears, the Service is announced and its status restored.
/// Today's main dropped the VIP but left the status in place without an Event.
#[test]
fn s39_etp_local_without_endpoint_clears_status() {
    let Some(lab) = rbac_lab("s39_etp_local") else {
        return;
    };
    let a = start_svc(&lab, "node-a");
    let b = start_svc(&lab, "node-b");
    let procs = [&a, &b];
    set_endpoints(&lab, "local", &["node-b"]);
    create_service(
        &lab,
        &service_json("local", Some("192.0.2.33"), None, &[(80, "TCP")], true),
    );
    wait_or_dump(
        "local announced by node-b",
        Duration::from_secs(30),
        &procs,
        || {
            holders(&lab, "192.0.2.33") == ["node-b"]
                && ingress_ips(&lab, "local") == ["192.0.2.33"]
                && vip_host(&lab, "local").as_deref() == Some("node-b")
        },
    );

    set_endpoints(&lab, "local", &[]);
    wait_or_dump(
        "the status cleared",
        Duration::from_secs(30),
        &procs,
        || {
            holders(&lab, "192.0.2.33").is_empty()
                && ingress_ips(&lab, "local").is_empty()
                && vip_host(&lab, "local").is_none()
        },
    );
    wait_or_dump(
        "the NoLocalEndpoint Warning",
        Duration::from_secs(30),
        &procs,
        || {
            events(&lab, "local", "NoLocalEndpoint")
                .iter()
                .any(|(t, m)| t == "Warning" && m.contains("externalTrafficPolicy is Local"))
        },
    );

    set_endpoints(&lab, "local", &["node-a"]);
    wait_or_dump(
        "local announced by node-a",
        Duration::from_secs(30),
        &procs,
        || {
            holders(&lab, "192.0.2.33") == ["node-a"]
                && ingress_ips(&lab, "local") == ["192.0.2.33"]
                && vip_host(&lab, "local").as_deref() == Some("node-a")
        },
    );
    let ev = events(&lab, "local", "NoLocalEndpoint");
    assert_eq!(ev.len(), 1, "{ev:?}");
}

/// S38/S39: one Event per change across nodes and restarts. Three nodes see a Service
/// with a malformed address and a good one; every vipd is restarted: still one
/// InvalidAddress Warning, and one AddressAnnounced Event per holder change. Today's main
/// posted the Warning once per node and again after each restart.
#[test]
fn s39_one_event_per_change_across_nodes_and_restarts() {
    let Some(lab) = rbac_lab("s39_one_event") else {
        return;
    };
    let mut procs: Vec<LabProcess> = NODES.iter().map(|n| start_svc(&lab, n)).collect();
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.34"), None, &[(80, "TCP")], false),
    );
    create_service(
        &lab,
        &service_json("bad", Some("192.0.2.300"), None, &[(80, "TCP")], false),
    );
    // Every node has written (or found) the Warning once its log says "Event recorded".
    let seen_bad = |procs: &[LabProcess]| {
        procs.iter().all(|p| {
            p.log().lines().any(|l| {
                l.contains("Event recorded")
                    && l.contains("default/bad")
                    && l.contains("InvalidAddress")
            })
        })
    };
    let refs: Vec<&LabProcess> = procs.iter().collect();
    wait_or_dump(
        "every node's InvalidAddress Event written",
        Duration::from_secs(30),
        &refs,
        || seen_bad(&procs),
    );
    let first = single_holder(&lab, "192.0.2.34", Duration::from_secs(30));
    wait_or_dump(
        "web's status and Event",
        Duration::from_secs(30),
        &refs,
        || {
            vip_host(&lab, "web").as_deref() == Some(first.as_str())
                && events(&lab, "web", "AddressAnnounced").len() == 1
        },
    );
    let bad = events(&lab, "bad", "InvalidAddress");
    assert_eq!(bad.len(), 1, "one Warning for three nodes: {bad:?}");

    // Killed together (no release): the lease moves at most once, at its expiry.
    for p in &mut procs {
        p.kill().unwrap();
    }
    procs = NODES.iter().map(|n| start_svc(&lab, n)).collect();
    let refs: Vec<&LabProcess> = procs.iter().collect();
    wait_or_dump(
        "every node's warning after the restart",
        Duration::from_secs(30),
        &refs,
        || seen_bad(&procs),
    );
    let second = single_holder(&lab, "192.0.2.34", Duration::from_secs(30));
    wait_or_dump(
        "web's vipHost after the restart",
        Duration::from_secs(30),
        &refs,
        || vip_host(&lab, "web").as_deref() == Some(second.as_str()),
    );
    let expected = if second == first { 1 } else { 2 };
    wait_or_dump(
        "the announcement of a move",
        Duration::from_secs(30),
        &refs,
        || events(&lab, "web", "AddressAnnounced").len() >= expected,
    );
    let announced = events(&lab, "web", "AddressAnnounced");
    assert_eq!(
        announced.len(),
        expected,
        "{first} then {second}: {announced:?}"
    );
    let bad = events(&lab, "bad", "InvalidAddress");
    assert_eq!(bad.len(), 1, "one Warning across restarts: {bad:?}");
}

/// Edits `name`'s `status.loadBalancer.ingress` (another address, then none) and its
/// `kube-vip.io/vipHost` (removed, then naming another node) by hand, as an operator might,
/// and waits after each edit for `holder` to restore it: a write after the edit (a newer
/// resourceVersion) puts back `ip` and `holder` within `limit`, with no failover. The writer
/// patches without reading the Service first since 2026-12-06: what it restores is decided
/// from its cache alone.
fn hand_edits_are_restored(
    lab: &Lab,
    name: &str,
    ip: &str,
    holder: &str,
    procs: &[&LabProcess],
    limit: Duration,
) {
    let rv = |v: &serde_json::Value| -> u64 {
        v["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("resourceVersion")
    };
    let service = format!("/api/v1/namespaces/default/services/{name}");
    let status = format!("{service}/status");
    let edits = [
        (
            "status: another address",
            status.as_str(),
            serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.99"}]}}}),
        ),
        (
            "status: no ingress",
            status.as_str(),
            serde_json::json!({"status": {"loadBalancer": {"ingress": null}}}),
        ),
        (
            "vipHost removed",
            service.as_str(),
            serde_json::json!({"metadata": {"annotations": {"kube-vip.io/vipHost": null}}}),
        ),
        (
            "vipHost naming another node",
            service.as_str(),
            serde_json::json!({"metadata": {"annotations": {"kube-vip.io/vipHost": "node-x"}}}),
        ),
    ];
    for (what, path, patch) in edits {
        let edited = rv(&hand_edit(lab, path, &patch));
        wait_or_dump(
            &format!("{name} restored after a hand edit ({what})"),
            limit,
            procs,
            || {
                get_service(lab, name).is_some_and(|s| rv(&s) > edited)
                    && ingress_ips(lab, name) == [ip]
                    && vip_host(lab, name).as_deref() == Some(holder)
            },
        );
        assert_eq!(
            holders(lab, ip),
            [holder],
            "{name} after {what}: no failover"
        );
    }
}

/// S38: status and `kube-vip.io/vipHost` edited by hand on Services that share shard
/// Leases (`svc_leaseshards`, issue 28), with the generated RBAC (merge patches): each edit
/// is restored by the shard's holder from its cache, the other node writes nothing back,
/// and no AddressAnnounced Event is added (the holder did not change).
#[test]
fn s38_hand_edited_status_and_vip_host_are_restored_on_shard_leases() {
    let Some(lab) = rbac_lab("s38_hand_edits_shards") else {
        return;
    };
    let shards = [("svc_leaseshards", "4")];
    let a = start_vipd_services(&lab, "node-a", true, &shards);
    let b = start_vipd_services(&lab, "node-b", true, &shards);
    let procs = [&a, &b];
    for p in procs {
        wait_or_dump(
            &format!("{} has loaded its caches", p.name()),
            Duration::from_secs(60),
            &procs,
            || {
                p.log()
                    .contains("Services: initial lists of Services, Nodes and endpoints loaded")
            },
        );
    }
    let services: Vec<(String, String)> = (0..4)
        .map(|i| (format!("web-{i}"), format!("192.0.2.{}", 40 + i)))
        .collect();
    for (name, ip) in &services {
        create_service(
            &lab,
            &service_json(name, Some(ip), None, &[(80, "TCP")], false),
        );
    }
    let mut placed = Vec::new();
    for (name, ip) in &services {
        let holder = single_holder(&lab, ip, Duration::from_secs(30));
        wait_or_dump(
            &format!("{name}'s status, vipHost and AddressAnnounced Event"),
            Duration::from_secs(30),
            &procs,
            || {
                ingress_ips(&lab, name) == [ip.as_str()]
                    && vip_host(&lab, name).as_deref() == Some(holder.as_str())
                    && !events(&lab, name, "AddressAnnounced").is_empty()
            },
        );
        placed.push((holder, events(&lab, name, "AddressAnnounced").len()));
    }
    // The API server names the writer of the status and vipHost after vipd's User-Agent.
    let web = get_service(&lab, "web-0").expect("web-0");
    let by_vipd: Vec<String> = web["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter(|f| f["manager"] == "vipd")
        .map(|f| f["fieldsV1"].to_string())
        .collect();
    assert!(
        by_vipd.iter().any(|f| f.contains("f:loadBalancer"))
            && by_vipd.iter().any(|f| f.contains("f:kube-vip.io/vipHost")),
        "status and vipHost written by manager vipd: {}",
        web["metadata"]["managedFields"]
    );
    for ((name, ip), (holder, _)) in services.iter().zip(&placed) {
        hand_edits_are_restored(&lab, name, ip, holder, &procs, Duration::from_secs(15));
    }
    for ((name, _), (_, announced)) in services.iter().zip(&placed) {
        let now = events(&lab, name, "AddressAnnounced");
        assert_eq!(
            now.len(),
            *announced,
            "{name}: no new announcement: {now:?}"
        );
    }
}

/// S38 / issue 26: the same hand edits under the ClusterRole of kube-vip's chart (`update`,
/// not `patch`, on Services and their status), with per-Service leases: restored by
/// read-modify-write updates after the first refused merge patch. That RBAC grants no
/// Events: the AddressAnnounced Event keeps failing on its own back-off
/// (`sync::StatusSync::event_retry`), which no longer holds back the status: each edit is
/// restored within the same limit as with vipd's RBAC (until 2026-12-06 the Event's failure
/// kept the status retry scheduled and a cache change waited for it, up to 20 s + 25 %).
#[test]
fn s38_hand_edits_are_restored_under_kube_vip_chart_rbac() {
    let Some(lab) = lab(
        "s38_hand_edits_chart_rbac",
        LabOptions {
            node_rbac: NodeRbac::None,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    apply_kube_vip_chart_rbac(&lab);
    let vipd = start_svc(&lab, "node-a");
    create_service(
        &lab,
        &service_json("web", Some("192.0.2.35"), None, &[(80, "TCP")], false),
    );
    wait_or_dump(
        "web's status and vipHost",
        Duration::from_secs(30),
        &[&vipd],
        || {
            holders(&lab, "192.0.2.35") == ["node-a"]
                && ingress_ips(&lab, "web") == ["192.0.2.35"]
                && vip_host(&lab, "web").as_deref() == Some("node-a")
        },
    );
    hand_edits_are_restored(
        &lab,
        "web",
        "192.0.2.35",
        "node-a",
        &[&vipd],
        Duration::from_secs(15),
    );
    assert!(
        vipd.log().contains("read-modify-write updates"),
        "{}",
        vipd.log()
    );
}
