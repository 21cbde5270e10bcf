//! Shared helpers for vipd's lab tests: start vipd in a node namespace, read who holds a
//! VIP or a Lease, and wait for conditions with a deadline (polling, never sleep-and-hope).

#![allow(dead_code)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use xtask::lab::{Lab, LabOptions, LabProcess};

pub mod dhcp;
pub mod manifest;
pub mod netns;
pub mod routed;

/// The lab's control-plane VIP (scenarios: 192.0.2.10).
pub const VIP: &str = "192.0.2.10";
/// Lab nodes.
pub const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

/// Starts a lab for `test`, or `None` when lab tests are skipped (`VIPD_SKIP_LAB=1`).
/// Panics with the reason when the lab cannot be had (not root, no API server binary).
pub fn lab(test: &str, opts: LabOptions) -> Option<Lab> {
    match xtask::lab::lab_available(test) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => panic!("{test}: {e}"),
    }
    Some(Lab::start(opts).unwrap_or_else(|e| panic!("{test}: lab start failed: {e}")))
}

/// [`lab`] as a cluster deployed with the generated manifests: the peer key Secret `vipd
/// manifest rbac` creates and the lab nodes' Node objects (a real cluster has them; they are
/// the ride-through membership), so vipd runs with ride-through armed and no "Secret does
/// not exist" warning.
pub fn keyed_lab(test: &str, opts: LabOptions) -> Option<Lab> {
    let lab = lab(test, opts)?;
    lab.register_nodes(&NODES)
        .unwrap_or_else(|e| panic!("{test}: cannot create the Node objects: {e}"));
    lab.create_peer_key_secret()
        .unwrap_or_else(|e| panic!("{test}: cannot create the peer key Secret: {e}"));
    Some(lab)
}

/// Applies the objects of `vipd manifest rbac` (ServiceAccount, ClusterRole, its binding to
/// the ServiceAccount, the peer key Secret) and binds the same ClusterRole to the lab's node users, which have
/// no other rights in a lab started with `NodeRbac::None`.
pub fn apply_generated_rbac(lab: &Lab) {
    use vipd::cmd::manifest::rbac;
    let yaml = rbac::rbac_yaml(&rbac::RbacArgs {
        namespace: "kube-system".into(),
        ..Default::default()
    })
    .unwrap();
    for doc in yaml.split("---\n").filter(|d| !d.trim().is_empty()) {
        let obj: serde_json::Value = serde_norway::from_str(doc).unwrap();
        let path = match obj["kind"].as_str().unwrap() {
            "ServiceAccount" => "/api/v1/namespaces/kube-system/serviceaccounts",
            "Secret" => "/api/v1/namespaces/kube-system/secrets",
            "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            "ClusterRoleBinding" => "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            other => panic!("unexpected {other} in vipd manifest rbac"),
        };
        let r = lab
            .api_request("POST", path, Some(&obj.to_string()))
            .unwrap();
        assert_eq!(r.status, 201, "{path}: {}", r.body);
    }
    bind_generated_role_to_nodes(lab);
}

/// Creates only the ClusterRole of `vipd manifest rbac` and binds it to the lab's node
/// users (no ServiceAccount): in a lab started with `NodeRbac::None` the node users then
/// have exactly the generated rights.
pub fn apply_generated_role_to_nodes(lab: &Lab) {
    apply_generated_role_to_nodes_with(lab, false);
}

/// As [`apply_generated_role_to_nodes`], the role of `vipd manifest rbac
/// --enableNodeLabeling=<node_labeling>`.
pub fn apply_generated_role_to_nodes_with(lab: &Lab, node_labeling: bool) {
    let role =
        serde_json::to_value(vipd::cmd::manifest::rbac::cluster_role(node_labeling)).unwrap();
    let path = "/apis/rbac.authorization.k8s.io/v1/clusterroles";
    let r = lab
        .api_request("POST", path, Some(&role.to_string()))
        .unwrap();
    assert_eq!(r.status, 201, "{path}: {}", r.body);
    bind_generated_role_to_nodes(lab);
}

/// Binds the generated ClusterRole to group [`xtask::lab::NODE_GROUP`] (ClusterRoleBinding
/// `vipd-lab-nodes-vipd`).
fn bind_generated_role_to_nodes(lab: &Lab) {
    let nodes = vipd::cmd::manifest::rbac::binding(
        "vipd-lab-nodes-vipd",
        vec![k8s_openapi::api::rbac::v1::Subject {
            kind: "Group".into(),
            name: xtask::lab::NODE_GROUP.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            namespace: None,
        }],
    );
    let r = lab
        .api_request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            Some(&serde_json::to_value(nodes).unwrap().to_string()),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
}

/// Creates the ClusterRole of kube-vip's chart (the `kube-vip` subchart of
/// `harvester-cloud-provider`, verbatim rules: `update`, not `patch`, on Services and their
/// status; no Events, no ConfigMaps) and binds it to the lab's node users, which have no
/// other rights in a lab started with `NodeRbac::None` (issue 26).
pub fn apply_kube_vip_chart_rbac(lab: &Lab) {
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "kube-vip"},
        "rules": [
            {"apiGroups": [""], "resources": ["services/status"], "verbs": ["update"]},
            {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["list", "get", "watch", "update"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "get", "watch", "update", "patch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list", "get", "watch", "update", "create"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "get", "watch", "update"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
        ]
    });
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kube-vip"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kube-vip"},
        "subjects": [{"kind": "Group", "name": xtask::lab::NODE_GROUP, "apiGroup": "rbac.authorization.k8s.io"}]
    });
    for (path, obj) in [
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            binding,
        ),
    ] {
        let r = lab
            .api_request("POST", path, Some(&obj.to_string()))
            .unwrap();
        assert_eq!(r.status, 201, "{path}: {}", r.body);
    }
}

/// Lease timings of a test run: (lease duration, renew deadline, retry period) seconds.
pub type Timings = (&'static str, &'static str, &'static str);

/// kube-vip's defaults, the scenarios' "lease 5/3/1".
pub const T531: Timings = ("5", "3", "1");

/// Starts `vipd manager` in control-plane mode on every node (as [`start_vipd`]), in
/// [`NODES`] order.
pub fn start_vipd_on_all(lab: &Lab, t: Timings, extra: &[(&str, &str)]) -> Vec<LabProcess> {
    NODES.iter().map(|n| start_vipd(lab, n, t, extra)).collect()
}

/// Starts `vipd manager` in control-plane mode on `node` with kube-vip environment
/// variables, plus `extra` (which override).
pub fn start_vipd(lab: &Lab, node: &str, t: Timings, extra: &[(&str, &str)]) -> LabProcess {
    spawn_vipd(lab, node, &["manager"], t, extra)
}

/// Starts `vipd ARGS...` (e.g. `preflight`) on `node` with the environment of
/// [`start_vipd`].
pub fn spawn_vipd(
    lab: &Lab,
    node: &str,
    args: &[&str],
    t: Timings,
    extra: &[(&str, &str)],
) -> LabProcess {
    let env = vipd_env(lab, node, t, extra);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    lab.spawn(node, env!("CARGO_BIN_EXE_vipd"), args, &env)
        .expect("spawn vipd")
}

/// The environment of [`start_vipd`]: kube-vip's variables for the control-plane VIP on
/// `node` with its kubeconfig and timings `t`, plus `extra` (which override).
pub fn vipd_env(
    lab: &Lab,
    node: &str,
    t: Timings,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let kubeconfig = lab.kubeconfig(node).expect("kubeconfig");
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    let mut env: Vec<(&str, &str)> = vec![
        ("vip_arp", "true"),
        ("cp_enable", "true"),
        ("vip_leaderelection", "true"),
        ("address", VIP),
        ("vip_interface", "eth0"),
        ("vip_nodename", node),
        ("k8s_config_file", &kubeconfig),
        ("vip_leaseduration", t.0),
        ("vip_renewdeadline", t.1),
        ("vip_retryperiod", t.2),
        ("vip_arpRate", "1000"),
        ("prometheus_server", ""),
        ("vip_loglevel", "debug"),
    ];
    for (k, v) in extra {
        env.retain(|(ek, _)| ek != k);
        env.push((k, v));
    }
    env.into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// S01 (docs/scenarios.md) with vipd started by `start(node)` on every node: the holder is
/// SIGKILLed; the kernel fence removes its VIP before another node binds it (never two
/// nodes carry it, never two ARP responders); the killed node, restarted, follows and holds
/// nothing. `start` must return the vipd process itself (SIGKILL goes to its pid).
pub fn s01_killed_holder(lab: &Lab, start: &dyn Fn(&str) -> LabProcess) {
    let vip: IpAddr = VIP.parse().expect("vip");
    let mut procs: Vec<LabProcess> = NODES.iter().map(|n| start(n)).collect();
    let holder = single_holder(lab, VIP, Duration::from_secs(30));
    let i = NODES
        .iter()
        .position(|n| *n == holder)
        .expect("holder is a node");
    // The default configuration fences to the millisecond (issue 27): no option, no `nft`.
    // (Logged before the election starts; the log file may lag the VIP by a moment.)
    wait_until("the millisecond fence on", Duration::from_secs(10), || {
        procs[i].log().contains("millisecond fence on")
    });
    let watch = lab
        .arp_watch(vip, Duration::from_millis(50))
        .expect("arp watch");
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    procs[i]
        .signal(xtask::lab::Signal::SIGKILL)
        .expect("SIGKILL the holder");
    let _ = procs[i].wait_timeout(Duration::from_secs(2));
    // Poll who carries the VIP every 20 ms until someone else does.
    let mut old_gone_at = None;
    let new = wait_for("takeover", Duration::from_secs(10), || {
        let h = holders(lab, VIP);
        if !h.contains(&holder) && old_gone_at.is_none() {
            old_gone_at = Some(t0.elapsed());
        }
        assert!(h.len() <= 1, "two nodes carry the VIP: {h:?}");
        h.iter().find(|n| **n != holder).cloned()
    });
    let taken = t0.elapsed();
    let old_gone = old_gone_at.expect("old holder's VIP removed before takeover");
    eprintln!("S01: fence removed the VIP after {old_gone:?}, {new} took over after {taken:?}");
    assert!(old_gone < taken);
    std::thread::sleep(Duration::from_millis(500));
    let report = watch.stop().expect("stop the arp watch");
    assert!(
        report.max_simultaneous_responders() <= 1,
        "{:?}",
        report.multi_responder_intervals()
    );
    // Restart the killed node: it follows and holds nothing.
    procs[i] = start(&holder);
    wait_for("restarted vipd following", Duration::from_secs(15), || {
        procs[i].log().contains("following").then_some(())
    });
    for _ in 0..20 {
        assert_eq!(holders(lab, VIP), vec![new.clone()]);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Nodes whose eth0 carries `vip` right now, read one after another ([`overlapping`]).
pub fn holders(lab: &Lab, vip: &str) -> Vec<String> {
    let ip: IpAddr = vip.parse().expect("vip");
    NODES
        .iter()
        .filter(|n| carries(lab, n, ip))
        .map(|n| n.to_string())
        .collect()
}

/// Whether `node`'s eth0 carries `ip` now and its fence lets it be answered (listed again
/// after the fence's read when the fence does not name it,
/// [`FenceView::answers_listed_before`]).
pub fn carries(lab: &Lab, node: &str, ip: IpAddr) -> bool {
    let listed = || {
        lab.addresses(node, "eth0")
            .map(|a| a.iter().any(|x| x.addr == ip))
            .unwrap_or(false)
    };
    listed() && FenceView::read(lab, node).answers_listed_before(ip, listed)
}

/// The nodes of `seen` that were at once: `seen` was sampled node after node in this order
/// (each one true when it was read), and `still` reads a node again. A sample of several
/// nodes one after another is no snapshot: the node read first can let go (its rules or
/// address removed, its lease released) and the next holder take over before the last
/// node is read, which is a clean hand-over (CI saw it on the load balancer's failover).
/// Two at once is proven only for an earlier node still true after the last one was read:
/// it is returned with the last one; empty when nothing overlapped.
pub fn overlapping(seen: &[String], still: impl Fn(&str) -> bool) -> Vec<String> {
    let Some((last, earlier)) = seen.split_last() else {
        return Vec::new();
    };
    let mut out: Vec<String> = earlier.iter().filter(|n| still(n)).cloned().collect();
    if !out.is_empty() {
        out.push(last.clone());
    }
    out
}

pub use xtask::lab::FenceView;

/// The lease's holderIdentity ("" when released), or None when it does not exist.
pub fn lease_holder(lab: &Lab, ns: &str, name: &str) -> Option<String> {
    let lease = lease(lab, ns, name)?;
    Some(
        lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// The Lease as JSON.
pub fn lease(lab: &Lab, ns: &str, name: &str) -> Option<serde_json::Value> {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}");
    let resp = lab.api_request("GET", &path, None).expect("api request");
    if resp.status == 404 {
        return None;
    }
    assert_eq!(resp.status, 200, "GET {path}: {}", resp.body);
    Some(serde_json::from_str(&resp.body).expect("lease json"))
}

/// Polls `f` every 20 ms until it returns `Some`, or panics with `what` after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` every 20 ms until it is true, or panics with `what` after `limit` (as
/// [`wait_for`]).
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    wait_for(what, limit, || cond().then_some(()))
}

/// Runs the future `make()` returns to completion on a current-thread tokio runtime, on a
/// thread inside lab namespace `ns`.
pub fn block_on_in<T: Send, F: std::future::Future<Output = T>>(
    lab: &Lab,
    ns: &str,
    make: impl FnOnce() -> F + Send,
) -> T {
    lab.in_netns(ns, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(make())
    })
    .unwrap()
}

/// Waits until exactly one node holds `vip` and returns it.
pub fn single_holder(lab: &Lab, vip: &str, limit: Duration) -> String {
    wait_for(&format!("one holder of {vip}"), limit, || {
        let h = holders(lab, vip);
        (h.len() == 1).then(|| h[0].clone())
    })
}

/// `Some(node)` when exactly one node other than `old` holds `vip`.
pub fn other_single_holder(lab: &Lab, vip: &str, old: &str) -> Option<String> {
    let h = holders(lab, vip);
    (h.len() == 1 && h[0] != old).then(|| h[0].clone())
}

/// Waits (up to `limit`, naming `what` on timeout) until exactly one node other than `old`
/// holds `vip`, and returns it.
pub fn wait_for_takeover(lab: &Lab, vip: &str, old: &str, what: &str, limit: Duration) -> String {
    wait_for(what, limit, || other_single_holder(lab, vip, old))
}

/// Lets `settle` pass, then asserts that `holder` alone holds `vip` (nothing moved).
pub fn assert_held_by_after(lab: &Lab, vip: &str, holder: &str, settle: Duration) {
    std::thread::sleep(settle);
    assert_eq!(holders(lab, vip), vec![holder.to_string()]);
}

/// Prints the logs of the given processes (for failing tests).
pub fn dump(procs: &[&LabProcess]) {
    for p in procs {
        eprintln!("===== {} =====\n{}", p.name(), p.log());
    }
}

/// Starts `vipd manager` in Services mode on `node` (`svc_election` as given), without the
/// control-plane VIP unless `extra` enables it.
pub fn start_vipd_services(
    lab: &Lab,
    node: &str,
    election: bool,
    extra: &[(&str, &str)],
) -> LabProcess {
    let mut env: Vec<(&str, &str)> = vec![
        ("cp_enable", "false"),
        ("svc_enable", "true"),
        ("svc_election", if election { "true" } else { "false" }),
        ("address", ""),
    ];
    for (k, v) in extra {
        env.retain(|(ek, _)| ek != k);
        env.push((k, v));
    }
    start_vipd(lab, node, T531, &env)
}

/// A LoadBalancer Service as JSON: `ip` goes to the `kube-vip.io/loadbalancerIPs`
/// annotation (when `Some`), ports are (port, protocol).
pub fn service_json(
    name: &str,
    annotation_ips: Option<&str>,
    spec_ip: Option<&str>,
    ports: &[(i32, &str)],
    etp_local: bool,
) -> serde_json::Value {
    let mut svc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": {}},
        "spec": {
            "type": "LoadBalancer",
            "ports": ports.iter().enumerate().map(|(i, (p, proto))| serde_json::json!({
                "name": format!("p{i}"), "port": p, "protocol": proto, "targetPort": 8080
            })).collect::<Vec<_>>(),
            "externalTrafficPolicy": if etp_local { "Local" } else { "Cluster" },
        }
    });
    if let Some(ips) = annotation_ips {
        svc["metadata"]["annotations"]["kube-vip.io/loadbalancerIPs"] = serde_json::json!(ips);
    }
    if let Some(ip) = spec_ip {
        svc["spec"]["loadBalancerIP"] = serde_json::json!(ip);
    }
    svc
}

/// Creates a Service in `default` through the admin API.
pub fn create_service(lab: &Lab, svc: &serde_json::Value) {
    create_service_in(lab, "default", svc);
}

/// Creates `svc` in namespace `ns` (its `metadata.namespace` is set to `ns`).
pub fn create_service_in(lab: &Lab, ns: &str, svc: &serde_json::Value) {
    let mut svc = svc.clone();
    svc["metadata"]["namespace"] = serde_json::json!(ns);
    let resp = lab
        .api_request(
            "POST",
            &format!("/api/v1/namespaces/{ns}/services"),
            Some(&svc.to_string()),
        )
        .expect("create service");
    assert_eq!(resp.status, 201, "create service: {}", resp.body);
}

/// Creates namespace `ns` (already there is fine; `default` always is).
pub fn create_namespace(lab: &Lab, ns: &str) {
    if ns == "default" {
        return;
    }
    let body =
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    let resp = lab
        .api_request("POST", "/api/v1/namespaces", Some(&body.to_string()))
        .expect("create namespace");
    assert!(
        resp.status == 201 || resp.status == 409,
        "namespace {ns}: {}",
        resp.body
    );
}

/// Deletes Service `default/name`.
pub fn delete_service(lab: &Lab, name: &str) {
    delete_service_in(lab, "default", name);
}

/// Deletes Service `ns/name`.
pub fn delete_service_in(lab: &Lab, ns: &str, name: &str) {
    let resp = lab
        .api_request(
            "DELETE",
            &format!("/api/v1/namespaces/{ns}/services/{name}"),
            None,
        )
        .expect("delete service");
    assert!(
        resp.status == 200 || resp.status == 202,
        "delete: {}",
        resp.body
    );
}

/// Merge-patches Service `default/name`. A 409 is retried (up to 5 attempts): the API
/// server gives up on a patch that keeps meeting concurrent writes, and vipd on three nodes
/// writes status and annotations of the same Service right after a change, as any client
/// of a busy object must expect.
pub fn patch_service(lab: &Lab, name: &str, patch: serde_json::Value) {
    let mut attempt = 1;
    loop {
        let resp = lab
            .api_request(
                "PATCH",
                &format!("/api/v1/namespaces/default/services/{name}"),
                Some(&patch.to_string()),
            )
            .expect("patch service");
        if resp.status == 409 && attempt < 5 {
            attempt += 1;
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert_eq!(resp.status, 200, "patch: {}", resp.body);
        return;
    }
}

/// Merge-patches Node `name` (e.g. its metadata's annotations).
pub fn patch_node(lab: &Lab, name: &str, patch: serde_json::Value) {
    let r = lab
        .api_request(
            "PATCH",
            &format!("/api/v1/nodes/{name}"),
            Some(&patch.to_string()),
        )
        .expect("patch node");
    assert_eq!(r.status, 200, "patch node {name}: {}", r.body);
}

/// Service `default/name` as JSON, or None.
pub fn get_service(lab: &Lab, name: &str) -> Option<serde_json::Value> {
    let resp = lab
        .api_request(
            "GET",
            &format!("/api/v1/namespaces/default/services/{name}"),
            None,
        )
        .expect("get service");
    if resp.status == 404 {
        return None;
    }
    Some(serde_json::from_str(&resp.body).expect("service json"))
}

/// Sets the core Endpoints of `default/name` to one ready address per node in `nodes`.
pub fn set_endpoints(lab: &Lab, name: &str, nodes: &[&str]) {
    let addresses: Vec<(String, &str)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("10.244.{}.{}", i + 1, 10), *n))
        .collect();
    let refs: Vec<(&str, &str)> = addresses.iter().map(|(ip, n)| (ip.as_str(), *n)).collect();
    set_endpoint_addresses(lab, name, &refs);
}

/// Sets the core Endpoints of `default/name` to the ready addresses `(ip, nodeName)`.
pub fn set_endpoint_addresses(lab: &Lab, name: &str, endpoints: &[(&str, &str)]) {
    let addresses: Vec<serde_json::Value> = endpoints
        .iter()
        .map(|(ip, n)| serde_json::json!({"ip": ip, "nodeName": n}))
        .collect();
    let subsets = if addresses.is_empty() {
        serde_json::json!([])
    } else {
        serde_json::json!([{"addresses": addresses, "ports": [{"port": 8080, "protocol": "TCP"}]}])
    };
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": name, "namespace": "default"},
        "subsets": subsets,
    });
    let path = format!("/api/v1/namespaces/default/endpoints/{name}");
    let resp = lab.api_request("GET", &path, None).expect("get endpoints");
    let resp = if resp.status == 404 {
        lab.api_request(
            "POST",
            "/api/v1/namespaces/default/endpoints",
            Some(&body.to_string()),
        )
    } else {
        lab.api_request(
            "PATCH",
            &path,
            Some(&serde_json::json!({"subsets": subsets}).to_string()),
        )
    }
    .expect("write endpoints");
    assert!(
        resp.status == 200 || resp.status == 201,
        "endpoints: {}",
        resp.body
    );
}

/// Edits an object by hand as a user would: a merge patch `patch` to `path`, tried again
/// after 100 ms on a conflict (409), at most five times; the object as the server answered.
pub fn hand_edit(lab: &Lab, path: &str, patch: &serde_json::Value) -> serde_json::Value {
    for _ in 0..5 {
        let r = lab
            .api_request("PATCH", path, Some(&patch.to_string()))
            .expect("patch");
        if r.status == 409 {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        return serde_json::from_str(&r.body).expect("the patched object");
    }
    panic!("{path}: 409 five times");
}

/// Events (events.k8s.io/v1) about `default/name`, as (type, reason, message).
pub fn events_for(lab: &Lab, name: &str) -> Vec<(String, String, String)> {
    events_in(lab, "default", name)
}

/// Events (events.k8s.io/v1) about `ns/name`, as (type, reason, message).
pub fn events_in(lab: &Lab, ns: &str, name: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let resp = lab
        .api_request(
            "GET",
            &format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
            None,
        )
        .expect("events");
    let v: serde_json::Value = serde_json::from_str(&resp.body).unwrap_or_default();
    for e in v["items"].as_array().cloned().unwrap_or_default() {
        if e["regarding"]["name"] == name {
            out.push((
                e["type"].as_str().unwrap_or_default().to_string(),
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["note"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    out
}

/// First ingress IP in the Service's status.
pub fn ingress_ips(lab: &Lab, name: &str) -> Vec<String> {
    get_service(lab, name)
        .and_then(|s| s["status"]["loadBalancer"]["ingress"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i["ip"].as_str().map(str::to_string))
        .collect()
}

/// Checks a handover seen by an [`xtask::lab::WatchReport`]: the old holder's MAC never
/// answers after the new one first did, and the new one never before. A slot may contain
/// both when the handover (tens of ms) falls inside one probe interval; answers in the
/// same slot are sequential then, not simultaneous. Any third MAC fails the check.
pub fn assert_clean_handover(
    report: &xtask::lab::WatchReport,
    old: xtask::lab::MacAddr,
    new: xtask::lab::MacAddr,
) {
    let first_new = report
        .slots
        .iter()
        .position(|s| s.responders.contains(&new))
        .expect("the new holder never answered");
    for (i, s) in report.slots.iter().enumerate() {
        assert!(
            s.responders.iter().all(|m| *m == old || *m == new),
            "slot {i}: unexpected responder {:?}",
            s.responders
        );
        if i > first_new {
            assert!(
                !s.responders.contains(&old),
                "old holder answered in slot {i} after the new one answered in slot {first_new}"
            );
        }
    }
}

/// Starts `vipd probe http://<ip>/ --interval 20ms --timeout 900ms --json` in ns client (the
/// lab's HTTP backends answer it); [`probe_gap_ms`] stops it and reads the longest gap.
pub fn start_http_probe(lab: &Lab, ip: &str) -> LabProcess {
    lab.spawn(
        "client",
        env!("CARGO_BIN_EXE_vipd"),
        &[
            "probe",
            &format!("http://{ip}/"),
            "--interval",
            "20ms",
            "--timeout",
            xtask::lab::PROBE_TIMEOUT,
            "--json",
        ],
        &[],
    )
    .expect("start the probe")
}

/// Stops a running `vipd probe ... --json` (SIGINT, then SIGKILL after 5 s) and returns the
/// longest gap (ms) of its summary, an open gap at the end included.
pub fn probe_gap_ms(mut probe: LabProcess) -> f64 {
    let _ = probe.signal(xtask::lab::Signal::SIGINT);
    if probe
        .wait_timeout(Duration::from_secs(5))
        .expect("wait probe")
        .is_none()
    {
        let _ = probe.kill();
    }
    let log = probe.log();
    let line = log
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no probe summary: {log}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("probe summary");
    let closed = v["longest_gap"]["gap_ms"].as_f64().unwrap_or(0.0);
    let open = match (
        v["trailing_failures"].as_u64(),
        v["last_success_ms"].as_f64(),
    ) {
        (Some(n), Some(last)) if n > 0 => v["elapsed_ms"].as_f64().unwrap_or(last) - last,
        _ => 0.0,
    };
    closed.max(open)
}

/// Creates Node `name` with a Ready condition (tests create the Nodes they need: the lab runs
/// no kubelet or controller manager).
pub fn create_ready_node(lab: &Lab, name: &str) {
    let node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
    let r = lab
        .api_request("POST", "/api/v1/nodes", Some(&node.to_string()))
        .expect("create node");
    assert_eq!(r.status, 201, "create node {name}: {}", r.body);
    set_ready(lab, name, true);
}

/// Sets the Node's Ready condition (as the kubelet would); no NetworkUnavailable condition.
pub fn set_ready(lab: &Lab, name: &str, ready: bool) {
    set_conditions(lab, name, ready, None);
}

/// Sets the Node's conditions: Ready (as the kubelet would) and, when `Some`, the
/// NetworkUnavailable condition with that value (as a cloud route controller or the CNI
/// would). A merge patch replaces the whole list, so both are written each time.
pub fn set_conditions(lab: &Lab, name: &str, ready: bool, network_unavailable: Option<bool>) {
    let status = |b: bool| if b { "True" } else { "False" };
    let condition = |type_: &str, b: bool| {
        serde_json::json!({
            "type": type_, "status": status(b), "reason": "Test",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"
        })
    };
    let mut conditions = vec![condition("Ready", ready)];
    conditions.extend(network_unavailable.map(|b| condition("NetworkUnavailable", b)));
    let patch = serde_json::json!({"status": {"conditions": conditions}});
    let r = lab
        .api_request(
            "PATCH",
            &format!("/api/v1/nodes/{name}/status"),
            Some(&patch.to_string()),
        )
        .expect("patch node status");
    assert_eq!(r.status, 200, "node {name} status: {}", r.body);
}

/// Stops every process of `procs` gracefully (SIGTERM, then up to 10 s each to exit), as a
/// test's last step; errors are ignored (a process may have ended already).
pub fn stop_all(procs: &mut [LabProcess]) {
    for p in procs.iter_mut() {
        let _ = p.signal(xtask::lab::Signal::SIGTERM);
        let _ = p.wait_timeout(Duration::from_secs(10));
    }
}
