//! Lab tests of the deployment paths against the real kube-apiserver v1.20.2:
//! - S30: every generated object is accepted by a server-side dry run (`?dryRun=All`);
//! - RBAC for real: vipd with a token bound only to the generated ClusterRole fails over
//!   the control-plane VIP (with exactly the env of the generated static Pod), and without
//!   the binding it cannot lead (403 logged, no VIP, no Lease);
//! - `vipd preflight` in a node namespace: passes on a good node, fails with fixes on a
//!   node without CAP_NET_RAW, on a VIP that is already in use, and without RBAC.

mod support;

#[path = "golden/cases.rs"]
mod cases;

use std::net::SocketAddr;
use std::time::Duration;

use support::manifest::{generate, lab_env, plan, spawn_manager};
use support::*;
use xtask::lab::{Lab, LabOptions, NodeRbac, Signal};

/// The API path that creates `obj` (by apiVersion/kind, in its namespace).
fn create_path(obj: &serde_json::Value) -> String {
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    match (
        obj["apiVersion"].as_str().unwrap(),
        obj["kind"].as_str().unwrap(),
    ) {
        ("v1", "Pod") => format!("/api/v1/namespaces/{ns}/pods"),
        ("v1", "ServiceAccount") => format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        ("v1", "Secret") => format!("/api/v1/namespaces/{ns}/secrets"),
        ("apps/v1", "DaemonSet") => format!("/apis/apps/v1/namespaces/{ns}/daemonsets"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            "/apis/rbac.authorization.k8s.io/v1/clusterroles".into()
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into()
        }
        other => panic!("unexpected object {other:?}"),
    }
}

/// Every document of a generated YAML stream, as JSON.
fn documents(yaml: &str) -> Vec<serde_json::Value> {
    yaml.split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_norway::from_str(d).unwrap())
        .collect()
}

fn create(lab: &Lab, obj: &serde_json::Value, query: &str) -> (u16, String) {
    let path = format!("{}{query}", create_path(obj));
    let r = lab
        .api_request("POST", &path, Some(&obj.to_string()))
        .unwrap();
    (r.status, r.body)
}

/// S30: the API server accepts every generated object (server-side dry run).
#[test]
fn s30_every_generated_manifest_passes_server_side_dry_run() {
    let Some(lab) = lab("s30_dry_run", LabOptions::default()) else {
        return;
    };
    // One case uses its own namespace.
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": "vipd-system"}});
    let r = lab
        .api_request("POST", "/api/v1/namespaces", Some(&ns.to_string()))
        .unwrap();
    assert!(r.status == 201 || r.status == 409, "{}", r.body);
    // RBAC first: its ServiceAccount must not exist yet for a dry-run create.
    let mut all: Vec<(String, Vec<&str>)> = vec![
        ("rbac".into(), vec!["rbac"]),
        (
            "rbac-node-labeling".into(),
            vec!["rbac", "--enableNodeLabeling"],
        ),
    ];
    all.extend(
        cases::ok_cases()
            .into_iter()
            .map(|(n, a)| (n.to_string(), a)),
    );
    let mut failures = Vec::new();
    let mut accepted = 0;
    for (i, (name, argv)) in all.iter().enumerate() {
        if i == 2 {
            service_accounts_with_tokens(&lab);
        }
        for obj in documents(&generate(argv)) {
            let (status, body) = create(&lab, &obj, "?dryRun=All");
            if status == 201 || status == 200 {
                accepted += 1;
                // A dry run must not persist anything.
                let back = serde_json::from_str::<serde_json::Value>(&body).unwrap();
                assert_eq!(back["kind"], obj["kind"]);
            } else {
                failures.push(format!("{name} {}: {status} {body}", obj["kind"]));
            }
        }
    }
    assert!(failures.is_empty(), "rejected:\n{}", failures.join("\n"));
    eprintln!(
        "S30: {accepted} objects accepted by kube-apiserver {}",
        lab.server_version().unwrap()
    );
    let r = lab
        .api_request("GET", "/api/v1/namespaces/kube-system/pods", None)
        .unwrap();
    let pods: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        pods["items"].as_array().map(Vec::len),
        Some(0),
        "dry run persisted pods"
    );
}

/// The lab runs no controller-manager: create the ServiceAccounts (with the token Secret
/// the token controller of v1.20 would add) that `--inCluster` Pods name, so the
/// ServiceAccount admission plugin can resolve them.
fn service_accounts_with_tokens(lab: &Lab) {
    for ns in ["kube-system", "vipd-system"] {
        for sa in ["default", "vipd"] {
            let token = format!("{sa}-token-lab");
            let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                "type": "kubernetes.io/service-account-token",
                "metadata": {"name": token, "namespace": ns,
                             "annotations": {"kubernetes.io/service-account.name": sa}}});
            let r = lab
                .api_request(
                    "POST",
                    &format!("/api/v1/namespaces/{ns}/secrets"),
                    Some(&secret.to_string()),
                )
                .unwrap();
            assert!(r.status == 201 || r.status == 409, "{}", r.body);
            let obj = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                                         "metadata": {"name": sa, "namespace": ns},
                                         "secrets": [{"name": token}]});
            let (status, body) = create(lab, &obj, "");
            assert!(status == 201 || status == 409, "{body}");
        }
    }
}

/// [`wait_for`] that prints the processes' logs before panicking.
fn wait_for_or<T>(
    what: &str,
    limit: Duration,
    procs: &[xtask::lab::LabProcess],
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > limit {
            dump(&procs.iter().collect::<Vec<_>>());
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cp_args() -> Vec<&'static str> {
    vec![
        "pod",
        "--controlplane",
        "--address",
        VIP,
        "--interface",
        "eth0",
        "--k8sConfigPath",
        "/etc/vipd/kubeconfig",
    ]
}

/// RBAC for real: node users bound only to the generated ClusterRole run vipd with the
/// generated static Pod's env and fail the control-plane VIP over.
#[test]
fn generated_rbac_is_enough_for_control_plane_failover() {
    let opts = LabOptions {
        node_rbac: NodeRbac::None,
        ..LabOptions::default()
    };
    let Some(lab) = lab("rbac_failover", opts) else {
        return;
    };
    apply_generated_role_to_nodes(&lab);

    let p = plan(&cp_args());
    let mut procs: Vec<_> = NODES
        .iter()
        .map(|n| spawn_manager(&lab, n, &lab_env(&lab, &p, n)))
        .collect();
    let holder = single_holder(&lab, VIP, Duration::from_secs(30));
    let i = NODES.iter().position(|n| *n == holder).unwrap();
    assert_eq!(
        lease_holder(&lab, "kube-system", "plndr-cp-lock").as_deref(),
        Some(holder.as_str())
    );

    // The admin endpoint of the generated env answers in the holder's namespace.
    let admin: SocketAddr = "127.0.0.1:2112".parse().unwrap();
    let mut last = None;
    let health = wait_for_or("/healthz", Duration::from_secs(5), &procs, || {
        match lab.http_get(&holder, admin, "/healthz", Duration::from_secs(2)) {
            Ok(b) => Some(b),
            Err(e) => {
                last = Some(e.to_string());
                None
            }
        }
    });
    let _ = last;
    assert_eq!(health.trim(), "ok");
    let metrics = lab
        .http_get(&holder, admin, "/metrics", Duration::from_secs(2))
        .unwrap();
    assert!(metrics.contains("kube_vip_build_info{"), "{metrics}");

    procs[i].signal(Signal::SIGTERM).unwrap();
    let status = procs[i].wait_timeout(Duration::from_secs(5)).unwrap();
    assert!(status.is_some_and(|s| s.success()), "{}", procs[i].log());
    let new = wait_for_takeover(&lab, VIP, &holder, "a new holder", Duration::from_secs(10));
    wait_for("lease moved", Duration::from_secs(5), || {
        (lease_holder(&lab, "kube-system", "plndr-cp-lock").as_deref() == Some(new.as_str()))
            .then_some(())
    });
    for p in &procs {
        assert!(
            // "forbidden" is in every 403 vipd logs (reason and message); a bare "403"
            // also matches timestamps.
            !p.log().to_lowercase().contains("forbidden"),
            "{} hit a forbidden call:\n{}",
            p.name(),
            p.log()
        );
    }
}

/// Control: without the binding vipd cannot lead: the forbidden lease call is logged and no
/// node takes the VIP or creates the Lease. Preflight reports the missing RBAC.
#[test]
fn without_rbac_vipd_cannot_lead_and_preflight_says_so() {
    let opts = LabOptions {
        node_rbac: NodeRbac::None,
        ..LabOptions::default()
    };
    let Some(lab) = lab("rbac_control", opts) else {
        return;
    };
    let p = plan(&cp_args());
    let env = lab_env(&lab, &p, "node-a");
    let proc = spawn_manager(&lab, "node-a", &env);
    wait_for(
        "a forbidden lease call in the log",
        Duration::from_secs(20),
        || {
            let log = proc.log();
            (log.contains("403") && log.to_lowercase().contains("forbidden")).then_some(())
        },
    );
    assert!(holders(&lab, VIP).is_empty(), "{}", proc.log());
    assert_eq!(lease_holder(&lab, "kube-system", "plndr-cp-lock"), None);

    let (ok, out) = preflight(&lab, "node-a", &env, &[]);
    assert!(!ok, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("rbac")
            && l.contains("FAIL")
            && l.contains("get coordination.k8s.io/leases")),
        "{out}"
    );
    assert!(out.contains("vipd manifest rbac"), "{out}");
}

/// Runs `vipd preflight` in `node` (optionally through `wrapper`), returns (success, output).
fn preflight(lab: &Lab, node: &str, env: &[(String, String)], wrapper: &[&str]) -> (bool, String) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let vipd = env!("CARGO_BIN_EXE_vipd");
    let mut proc = if wrapper.is_empty() {
        lab.spawn(node, vipd, &["preflight"], &env).unwrap()
    } else {
        let mut args: Vec<&str> = wrapper[1..].to_vec();
        args.extend([vipd, "preflight"]);
        lab.spawn(node, wrapper[0], &args, &env).unwrap()
    };
    let status = proc
        .wait_timeout(Duration::from_secs(30))
        .unwrap()
        .unwrap_or_else(|| panic!("preflight did not finish:\n{}", proc.log()));
    (status.success(), proc.log())
}

/// `vipd preflight`: passes on a good lab node; fails with a fix without CAP_NET_RAW and when
/// the VIP already answers on the segment.
#[test]
fn preflight_in_the_lab() {
    let Some(lab) = lab("preflight", LabOptions::default()) else {
        return;
    };
    let p = plan(&cp_args());
    let env = lab_env(&lab, &p, "node-a");

    let (ok, out) = preflight(&lab, "node-a", &env, &[]);
    assert!(ok, "{out}");
    for check in [
        "capabilities",
        "interface",
        "vip-free:192.0.2.10",
        "api",
        "rbac",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(check) && l.contains(" ok ")),
            "{check} not ok:\n{out}"
        );
    }
    assert!(out.contains("preflight passed"), "{out}");

    // A node without NET_RAW.
    let dropper: Vec<&str> = if xtask::lab::process::find_in_path("capsh").is_some() {
        vec![
            "capsh",
            "--drop=cap_net_raw",
            "--",
            "-c",
            "exec \"$0\" \"$@\"",
        ]
    } else {
        vec!["setpriv", "--bounding-set=-net_raw", "--inh-caps=-net_raw"]
    };
    let (ok, out) = preflight(&lab, "node-a", &env, &dropper);
    assert!(!ok, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("capabilities")
            && l.contains("FAIL")
            && l.contains("missing CAP_NET_RAW")),
        "{out}"
    );
    assert!(
        out.contains("fix: Pod: securityContext.capabilities.add [NET_ADMIN, NET_RAW]"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("vip-free") && l.contains("skip")),
        "{out}"
    );

    // The VIP is already in use on the segment (the client namespace has it).
    lab.exec(
        "client",
        "ip",
        &["addr", "add", "192.0.2.10/32", "dev", "eth0"],
    )
    .unwrap();
    let (ok, out) = preflight(&lab, "node-a", &env, &[]);
    assert!(!ok, "{out}");
    let client_mac = lab.mac_of("client").unwrap().to_string().to_lowercase();
    assert!(
        out.lines().any(|l| l.starts_with("vip-free:192.0.2.10")
            && l.contains("FAIL")
            && l.to_lowercase().contains(&client_mac)),
        "expected a conflict with {client_mac}:\n{out}"
    );

    // The VIP answers from node-b, which holds the control-plane lease: that is its
    // announcer doing its job, not a conflict.
    lab.exec(
        "client",
        "ip",
        &["addr", "del", "192.0.2.10/32", "dev", "eth0"],
    )
    .unwrap();
    lab.exec(
        "node-b",
        "ip",
        &["addr", "add", "192.0.2.10/32", "dev", "eth0"],
    )
    .unwrap();
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "plndr-cp-lock", "namespace": "kube-system"},
        "spec": {"holderIdentity": "node-b", "leaseDurationSeconds": 3}
    });
    let resp = lab
        .api_request(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
            Some(&lease.to_string()),
        )
        .unwrap();
    assert_eq!(resp.status, 201, "{}", resp.body);
    let (ok, out) = preflight(&lab, "node-a", &env, &[]);
    assert!(ok, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("vip-free:192.0.2.10") && l.contains("held by node-b")),
        "{out}"
    );
}

/// The k3s how-to's command yields a manifest whose exact env (with
/// the generated RBAC only) fails over the control-plane VIP and announces a Service.
#[test]
fn k3s_manifest_env_with_generated_rbac_fails_over_and_announces_a_service() {
    let opts = LabOptions {
        node_rbac: NodeRbac::None,
        ..LabOptions::default()
    };
    let Some(lab) = lab("k3s_done_when", opts) else {
        return;
    };
    apply_generated_role_to_nodes(&lab);

    let p = plan(cases::K3S);
    let mut procs: Vec<_> = NODES
        .iter()
        .map(|n| spawn_manager(&lab, n, &lab_env(&lab, &p, n)))
        .collect();
    let holder = wait_for_or(
        "one control-plane VIP holder",
        Duration::from_secs(30),
        &procs,
        || {
            let h = holders(&lab, VIP);
            (h.len() == 1).then(|| h[0].clone())
        },
    );

    let svc_vip = "192.0.2.20";
    let svc = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default",
                     "annotations": {"kube-vip.io/loadbalancerIPs": svc_vip}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}});
    let r = lab
        .api_request(
            "POST",
            "/api/v1/namespaces/default/services",
            Some(&svc.to_string()),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    wait_for_or(
        "one node announcing the Service VIP",
        Duration::from_secs(30),
        &procs,
        || (holders(&lab, svc_vip).len() == 1).then_some(()),
    );

    let i = NODES.iter().position(|n| *n == holder).unwrap();
    procs[i].signal(Signal::SIGTERM).unwrap();
    let status = procs[i].wait_timeout(Duration::from_secs(5)).unwrap();
    assert!(status.is_some_and(|s| s.success()), "{}", procs[i].log());
    wait_for_or(
        "a new control-plane VIP holder",
        Duration::from_secs(10),
        &procs,
        || other_single_holder(&lab, VIP, &holder).map(drop),
    );
    wait_for_or(
        "the Service VIP on a running node",
        Duration::from_secs(15),
        &procs,
        || other_single_holder(&lab, svc_vip, &holder).map(drop),
    );
    for p in &procs {
        assert!(
            !p.log().contains(" 403"),
            "{} hit a forbidden call:\n{}",
            p.name(),
            p.log()
        );
    }
}
