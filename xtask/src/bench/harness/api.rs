//! Calls to the lab API server shared by the benches: creating objects, the Service
//! manifest, the control-plane Lease and its writes.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use xtask::lab::Lab;

use super::{LEASE_NAME, LEASE_NAMESPACE};

/// Namespace of the benches' Services (and of their per-Service Leases).
pub const NAMESPACE: &str = "default";

/// POSTs `body` to `path` as admin and expects 201 Created.
///
/// # Errors
/// The call failing, or another status (named with `what` and the server's answer).
pub fn create(lab: &Lab, path: &str, body: &serde_json::Value, what: &str) -> Result<()> {
    let r = lab.api_request("POST", path, Some(&body.to_string()))?;
    if r.status != 201 {
        bail!("create {what}: HTTP {}: {}", r.status, r.body);
    }
    Ok(())
}

/// API path of the control-plane Lease.
pub fn lease_path() -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{LEASE_NAME}")
}

/// The control-plane Lease as JSON, and its `resourceVersion`.
///
/// # Errors
/// The request fails, answers other than 200, or the Lease has no resourceVersion.
pub(crate) fn get_lease(lab: &Lab) -> Result<(serde_json::Value, String)> {
    let r = lab.api_request("GET", &lease_path(), None)?;
    if r.status != 200 {
        bail!("GET lease: HTTP {}: {}", r.status, r.body);
    }
    let v: serde_json::Value = serde_json::from_str(&r.body)?;
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("lease without resourceVersion"))?
        .to_string();
    Ok((v, rv))
}

/// API path of a watch of the control-plane Lease from `rv`, ended by the server after
/// `timeout_secs`.
pub(crate) fn lease_watch_path(rv: &str, timeout_secs: u64) -> String {
    format!(
        "/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases?watch=1&fieldSelector=metadata.name%3D{LEASE_NAME}&resourceVersion={rv}&timeoutSeconds={timeout_secs}"
    )
}

/// Counts writes to the control-plane Lease for `window` with a watch
/// (`?watch=1&timeoutSeconds=N` from the current resourceVersion); returns writes/second.
///
/// # Errors
/// When the Lease cannot be read or the watch fails.
pub fn lease_writes_per_s(lab: &Lab, window: Duration) -> Result<f64> {
    let (_, rv) = get_lease(lab)?;
    let path = lease_watch_path(&rv, window.as_secs().max(1));
    let t0 = Instant::now();
    let w = lab.api_request("GET", &path, None)?;
    let took = t0.elapsed();
    if w.status != 200 {
        bail!("watch lease: HTTP {}: {}", w.status, w.body);
    }
    let events = w
        .body
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| matches!(e["type"].as_str(), Some("MODIFIED" | "ADDED" | "DELETED")))
        .count();
    Ok(events as f64 / took.as_secs_f64().max(1.0))
}

/// A `type: LoadBalancer` Service `default/<name>` with `addr` in the
/// `kube-vip.io/loadbalancerIPs` annotation, port 80/TCP, externalTrafficPolicy Cluster.
pub fn service_json(name: &str, addr: IpAddr) -> serde_json::Value {
    service_json_ips(name, &[addr])
}

/// [`service_json`] with several addresses (a dual-stack Service: `addrs` comma-joined in
/// the annotation).
pub fn service_json_ips(name: &str, addrs: &[IpAddr]) -> serde_json::Value {
    let addrs: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "annotations": {"kube-vip.io/loadbalancerIPs": addrs.join(",")},
        },
        "spec": {
            "type": "LoadBalancer",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
            "externalTrafficPolicy": "Cluster",
        }
    })
}

// ----- /proc -----------------------------------------------------------------------------
