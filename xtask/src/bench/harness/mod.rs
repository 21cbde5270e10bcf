//! The bench harness: lab operations, process and procfs helpers shared by every bench
//! (failover, services, heartbeat, apiload), the chaos soak and the demo.
//!
//! - [`build`]: the release build of vipd (and other artifacts) the benches run;
//! - [`subject`]: what runs on the lab nodes (vipd timings, keepalived variants);
//! - [`ctx`]: a lab with HTTP backends and the VIPs of a failover run;
//! - [`cluster`]: one vipd or keepalived per node, started, signalled and stopped;
//! - [`probe`]: `vipd probe` summaries;
//! - [`api`]: API server calls (objects, the control-plane Lease);
//! - [`procfs`]: RSS, threads and CPU of processes from /proc;
//! - [`text`]: logs and `/metrics` text.

use std::net::Ipv4Addr;
use std::time::Duration;

use xtask::lab;

pub mod api;
pub mod build;
pub mod cluster;
pub mod ctx;
pub mod probe;
pub mod procfs;
pub mod subject;
pub mod text;

/// The control-plane VIP every trial moves (192.0.2.10).
pub const VIP: Ipv4Addr = lab::CONTROL_PLANE_VIP;
/// The Service of `--service` / `--ride` (its VIP is [`VIP`]) and of `--cp-and-service`
/// (its VIP is [`SERVICE_VIP`]).
pub const SERVICE_NAME: &str = "failover";
/// The Service VIP of `--cp-and-service` (192.0.2.20), next to the control-plane VIP.
pub const SERVICE_VIP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
/// Name of the Lease all Services share without `svc_election` (vipd's and kube-vip's
/// default `svc_leasename`), in [`LEASE_NAMESPACE`].
pub const SERVICES_LEASE_NAME: &str = "plndr-svcs-lock";
/// Namespace of vipd's control-plane Lease.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// Name of vipd's (and kube-vip's) control-plane Lease.
pub const LEASE_NAME: &str = "plndr-cp-lock";
/// Interval of `vipd probe` requests and of the ARP watcher's requests (20 ms).
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(20);
/// keepalived binary (Debian package `keepalived`).
pub const KEEPALIVED: &str = "/usr/sbin/keepalived";

/// Threads creating Services in parallel in the scale scenario.
pub const CREATE_THREADS: usize = 4;
/// Port of vipd's admin endpoint in the bench (`prometheus_server=:2112`).
pub const METRICS_PORT: u16 = 2112;

/// vipd's environment on `node` in Services mode as the Services benches run it: per-Service
/// Leases (`svc_election`), no control-plane VIP, ARP on the lab's eth0, the admin endpoint on
/// [`METRICS_PORT`] and `info` logs (the caller adds or overrides settings).
pub fn services_mode_env<'a>(node: &'a str, kubeconfig: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("cp_enable", "false"),
        ("svc_enable", "true"),
        ("svc_election", "true"),
        ("address", ""),
        ("vip_arp", "true"),
        ("vip_interface", lab::ETH),
        ("vip_nodename", node),
        ("k8s_config_file", kubeconfig),
        ("prometheus_server", ":2112"),
        ("vip_loglevel", "info"),
    ]
}
