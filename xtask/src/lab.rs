//! The vipd network lab: network namespaces joined by a bridge, a real control plane
//! (etcd + kube-apiserver v1.20.2) and the helpers every lab test needs.
//!
//! Topology (see ../shared/design.md), every name carrying a per-run prefix such as
//! `vl4242x0-`:
//!
//! ```text
//!   ns lan      bridge br0 (the L2 segment); ports v-api, v-node-a, ..., v-client
//!   ns api      eth0 192.0.2.2/24; etcd on 127.0.0.1:2379, kube-apiserver on :6443
//!   ns node-a   eth0 192.0.2.11/24 + 2001:db8::11/64   (node-b .12, node-c .13)
//!               "local API server": TCP proxy [::]:6443 -> 192.0.2.2:6443
//!   ns client   eth0 192.0.2.100/24 + 2001:db8::100/64 (probes, ARP capture)
//!   ns dhcp     eth0 192.0.2.3/24 + 2001:db8::3/64; dnsmasq (DHCPv4 pool
//!               192.0.2.200-220, DHCPv6 pool 2001:db8::1000-1fff when asked) when a test
//!               starts it ([`Lab::start_dnsmasq`])
//! ```
//!
//! Veth pairs are created from inside `lan` with the peer moved straight into the member
//! namespace, so nothing is ever created in the root namespace. A [`Lab`] tears everything
//! down when dropped (also while unwinding from a panic); [`Lab::start`] also sweeps labs
//! left behind by runs that died.
//!
//! ```no_run
//! use xtask::lab::{Lab, LabOptions};
//! let lab = Lab::start(LabOptions::default())?;
//! let out = lab.exec("node-a", "ip", &["-br", "addr"])?;
//! # Ok::<(), xtask::lab::LabError>(())
//! ```
//!
//! [`RoutedLab`] is the routed topology of issue 29 (a BGP router between the nodes' subnet
//! and a client's, no control plane): see [`routed`].
//!
//! With [`LabOptions::pods`], each node also has a "pod" namespace behind it (see
//! [`pod_ipv4`]):
//!
//! ```text
//!   ns pod-a    eth0 198.51.100.11/32 + 2001:db8:1::11/128 (pod-b .12, pod-c .13)
//!               default via 169.254.1.1 / fe80::1 (onlink), the node's pod0
//!   ns node-a   pod0 169.254.1.1/32 + fe80::1/64, routes 198.51.100.11/32 and
//!               2001:db8:1::11/128 dev pod0, forwarding on
//!   ns client   routes 198.51.100.11/32 via 192.0.2.11, 2001:db8:1::11/128 via
//!               2001:db8::11, ... (replies to un-NATed pod traffic)
//! ```

pub mod arp;
mod cluster;
pub mod control_plane;
pub mod dhcp;
pub mod error;
mod fence;
pub mod https;
pub mod netns;
mod pods;
pub mod process;
mod registry;
pub mod routed;
pub mod servers;
mod topology;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use arp::{
    ArpFrame, ArpOp, ArpRoundProber, ArpWatcher, Capture, DEFAULT_WATCH_INTERVAL, FrameCapture,
    MacAddr, MultiResponderInterval, ProbeRound, ProbeSlot, SeenFrame, WatchReport,
};
pub use cluster::{ControlPlaneProcess, PEER_KEY_LEN};
pub use control_plane::{find_apiserver, vipd_binary};
pub use dhcp::{
    DHCP_LEASE_SECS, DHCP_POOL_END, DHCP_POOL_START, DHCP6_POOL_END, DHCP6_POOL_START,
    DnsmasqLease, DnsmasqLease6, DnsmasqOptions, parse_leases, parse_leases6,
};
pub use error::{LabError, Result};
pub use fence::FenceView;
pub use https::{ApiClient, HttpResponse};
pub use process::{LabProcess, Signal};
pub use registry::{LabRecord, list_netns, sweep_stale_labs};
pub use routed::RoutedLab;
pub use servers::ThreadServer;
pub use topology::{LabAddress, parse_ip_addr_json};

use cluster::ControlPlaneCmd;
use error::io_ctx;
use registry::{record_path, remove_namespaces};

/// The node namespaces, in order.
pub const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
/// Every namespace of a lab, in creation order.
pub const NAMESPACES: [&str; 7] = ["lan", "api", "node-a", "node-b", "node-c", "client", "dhcp"];
/// The pod namespaces of a lab started with [`LabOptions::pods`], one behind each node of
/// [`NODES`] (same order).
pub const PODS: [&str; 3] = ["pod-a", "pod-b", "pod-c"];
/// The node-side end of a pod's veth, in the node namespace (the pod side is [`ETH`]).
pub const POD_IF: &str = "pod0";
/// IPv4 gateway of every pod: a link-scope /32 on the node's [`POD_IF`] (as Calico's
/// 169.254.1.1), reached onlink; not a lab-segment address.
pub const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// IPv6 gateway of every pod: the link-local fe80::1 on the node's [`POD_IF`].
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// Address of the API server (ns `api`).
pub const API_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// Port of the API server and of every node's local API proxy.
pub const API_PORT: u16 = 6443;
/// `--timeout` of every `vipd probe` the benches and lab tests run: below TCP's initial
/// retransmission timeout (1 s, RFC 6298 §2.1). A request whose SYN was lost in the outage
/// is retransmitted 1 s later; with a 1 s timeout it raced that retransmission, and when it
/// won, its late answer (from a request started early in the outage) made the gap about
/// 1 s whatever the failover took. At 900 ms it always counts as failed, and the gap is
/// the time the VIP gave no answer to requests started every 20 ms.
pub const PROBE_TIMEOUT: &str = "900ms";
/// The control-plane VIP used by the scenarios (in the serving certificate's SANs).
pub const CONTROL_PLANE_VIP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
/// IPv4 address of the DHCP server namespace (`dhcp`, dnsmasq).
pub const DHCP_SERVER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
/// IPv6 address of the DHCP server namespace (`dhcp`, dnsmasq's DHCPv6).
pub const DHCP_SERVER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 3);
/// IPv4 address of the client namespace.
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
/// IPv6 address of the client namespace.
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
/// Gateway used by [`LabOptions::default_route`] (no host answers for it).
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// IPv6 gateway used by [`LabOptions::default_route`].
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
/// Prefix length of the lab subnet (IPv4).
pub const PREFIX_V4: u8 = 24;
/// Prefix length of the lab subnet (IPv6).
pub const PREFIX_V6: u8 = 64;
/// Project prefix of every lab namespace name (`vl<pid>x<n>-<ns>`).
pub const NAME_PREFIX: &str = "vl";
/// Directory holding one JSON record per live lab (creator pid, start time, lab dir).
pub const REGISTRY_DIR: &str = "/run/vipd-lab";

/// The lab-side interface name inside every member namespace.
pub const ETH: &str = "eth0";

/// IPv4 address of node `node` (`node-a` is 192.0.2.11, ...), `None` for other names.
pub fn node_ipv4(node: &str) -> Option<Ipv4Addr> {
    node_index(node).map(|i| Ipv4Addr::new(192, 0, 2, 11 + i as u8))
}

/// IPv6 address of node `node` (`node-a` is 2001:db8::11, ...), `None` for other names.
pub fn node_ipv6(node: &str) -> Option<Ipv6Addr> {
    node_index(node).map(|i| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x11 + i as u16))
}

/// The pod namespace behind node `node` (`node-a` has `pod-a`, ...), `None` for other names.
pub fn pod_of(node: &str) -> Option<&'static str> {
    node_index(node).map(|i| PODS[i])
}

/// Position of `node` in [`NODES`]: its address suffix and its pod.
fn node_index(node: &str) -> Option<usize> {
    NODES.iter().position(|n| *n == node)
}

/// IPv4 address of the pod behind node `node` (`node-a`'s pod is 198.51.100.11/32, ...),
/// `None` for other names.
pub fn pod_ipv4(node: &str) -> Option<Ipv4Addr> {
    node_index(node).map(|i| Ipv4Addr::new(198, 51, 100, 11 + i as u8))
}

/// IPv6 address of the pod behind node `node` (`node-a`'s pod is 2001:db8:1::11/128, ...),
/// `None` for other names.
pub fn pod_ipv6(node: &str) -> Option<Ipv6Addr> {
    node_index(node).map(|i| Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x11 + i as u16))
}

/// How node users are authorised on the lab API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeRbac {
    /// A ClusterRoleBinding `vipd-lab-nodes` binds group [`NODE_GROUP`] to `cluster-admin`.
    #[default]
    ClusterAdmin,
    /// No binding: node users can do nothing until a test applies RBAC itself.
    None,
}

/// Group every node user belongs to (in tokens.csv); never `system:masters`.
pub const NODE_GROUP: &str = "vipd-lab-nodes";

/// Options of [`Lab::start`].
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Add a default route via 192.0.2.1 / 2001:db8::1 on every node (for interface-choice
    /// tests). Default false: nodes only have the connected subnet.
    pub default_route: bool,
    /// RBAC for node users. Default [`NodeRbac::ClusterAdmin`].
    pub node_rbac: NodeRbac,
    /// Start each node's local API proxy ([::]:6443 -> 192.0.2.2:6443). Default true.
    pub local_api: bool,
    /// Start each node's HTTP backend on :80 answering its node name. Default false.
    pub http_backends: bool,
    /// Extra IP SANs for the serving certificate.
    pub extra_sans: Vec<IpAddr>,
    /// Extra kube-apiserver flags (`--name=value`).
    pub apiserver_args: Vec<String>,
    /// How long to wait for the API server to become ready. Default 90 s.
    pub ready_timeout: Duration,
    /// Create a pod namespace behind each node ([`PODS`], [`pod_ipv4`], [`pod_ipv6`]),
    /// turn on IPv4 and IPv6 forwarding in the node namespaces and route the pod addresses
    /// from `client` via their nodes. Default false.
    pub pods: bool,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            default_route: false,
            node_rbac: NodeRbac::ClusterAdmin,
            local_api: true,
            http_backends: false,
            extra_sans: Vec::new(),
            apiserver_args: Vec::new(),
            ready_timeout: Duration::from_secs(90),
            pods: false,
        }
    }
}

static LAB_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A running lab. See the [module documentation](self).
///
/// All helpers take `&self`, so a lab can be shared between threads of a test.
#[derive(Debug)]
pub struct Lab {
    prefix: String,
    dir: PathBuf,
    created: Vec<String>,
    /// Whether the lab has the pod namespaces ([`LabOptions::pods`]).
    pods: bool,
    control_plane: Vec<LabProcess>,
    /// How each `control_plane` process was started (same order), for restarts.
    control_plane_cmds: Vec<ControlPlaneCmd>,
    local_apis: Mutex<HashMap<String, ThreadServer>>,
    http_backends: Mutex<HashMap<String, ThreadServer>>,
    /// dnsmasq in `dhcp`, while a test runs it ([`Lab::start_dnsmasq`]).
    dnsmasq: Mutex<Option<LabProcess>>,
    admin_token: String,
    node_tokens: HashMap<String, String>,
    ca_der: Vec<u8>,
    log_seq: AtomicU32,
    keep: bool,
}

impl Lab {
    /// Builds the topology, starts etcd + kube-apiserver in `api`, waits until the API
    /// server is ready and the `default` and `kube-system` namespaces exist, applies
    /// `opts.node_rbac`, and starts the per-node local API proxies (and HTTP backends if
    /// asked). Typically takes 3-6 s.
    ///
    /// # Errors
    /// [`LabError::NotRoot`] when not root; [`LabError::ApiServerMissing`] with instructions
    /// when no kube-apiserver is found; [`LabError::Timeout`] when the API server does not
    /// get ready; [`LabError::Command`] when an `ip` command fails. Whatever was built is
    /// torn down before the error is returned.
    pub fn start(opts: LabOptions) -> Result<Lab> {
        let uid = nix::unistd::geteuid().as_raw();
        if uid != 0 {
            return Err(LabError::NotRoot { uid });
        }
        // `nft`: the chaos soak's API partition and leak check, the ARP flux guard's tests.
        control_plane::ensure_packages(&[
            ("ip", "iproute2"),
            ("etcd", "etcd-server"),
            ("nft", "nftables"),
        ])?;
        let t0 = Instant::now();
        let apiserver = find_apiserver()?;
        trace(t0, "found kube-apiserver");
        let (prefix, dir) = new_lab(&["logs", "pki", "kubeconfig", "etcd"])?;
        let mut lab = Lab {
            prefix,
            dir,
            created: Vec::new(),
            pods: opts.pods,
            control_plane: Vec::new(),
            control_plane_cmds: Vec::new(),
            local_apis: Mutex::new(HashMap::new()),
            http_backends: Mutex::new(HashMap::new()),
            dnsmasq: Mutex::new(None),
            admin_token: control_plane::random_token()?,
            node_tokens: HashMap::new(),
            ca_der: Vec::new(),
            log_seq: AtomicU32::new(0),
            keep: std::env::var("VIPD_LAB_KEEP").is_ok_and(|v| v == "1"),
        };
        lab.write_record()?;
        lab.build_network(&opts)?;
        trace(t0, "network built");
        lab.start_control_plane(&opts, &apiserver)?;
        trace(t0, "control plane ready");
        if opts.local_api {
            for node in NODES {
                lab.start_local_api(node)?;
            }
        }
        if opts.http_backends {
            lab.start_http_backends()?;
        }
        Ok(lab)
    }

    // ----- names and paths -------------------------------------------------------------

    /// The per-run name prefix, e.g. `vl4242x0-`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The lab directory (logs/, pki/, kubeconfig/, etcd/). Removed on drop unless
    /// `VIPD_LAB_KEEP=1`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Short names of every namespace of this lab, in creation order: [`NAMESPACES`], then
    /// [`PODS`] when started with [`LabOptions::pods`].
    pub fn namespaces(&self) -> Vec<&'static str> {
        let pods: &[&'static str] = if self.pods { &PODS } else { &[] };
        NAMESPACES.iter().chain(pods).copied().collect()
    }

    /// Full `ip netns` name of lab namespace `ns` (`lan`, `api`, `node-a`, ..., `client`,
    /// and `pod-a`, ... when the lab has pods).
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] for other names.
    pub fn ns_name(&self, ns: &str) -> Result<String> {
        let all = self.namespaces();
        if all.contains(&ns) {
            Ok(format!("{}{ns}", self.prefix))
        } else {
            Err(LabError::UnknownNamespace {
                name: ns.to_string(),
                expected: all.join(", "),
            })
        }
    }

    /// Full `ip netns` names of every namespace of this lab ([`Lab::namespaces`]).
    pub fn namespace_names(&self) -> Vec<String> {
        self.namespaces()
            .iter()
            .map(|n| format!("{}{n}", self.prefix))
            .collect()
    }

    /// Path of the bind mount of lab namespace `ns` (for `setns(2)`).
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] for unknown names.
    pub fn netns_path(&self, ns: &str) -> Result<PathBuf> {
        Ok(netns::netns_path(&self.ns_name(ns)?))
    }

    fn node_checked(node: &str) -> Result<()> {
        if NODES.contains(&node) {
            Ok(())
        } else {
            Err(LabError::UnknownNamespace {
                name: node.to_string(),
                expected: NODES.join(", "),
            })
        }
    }

    /// `https://192.0.2.2:6443`.
    pub fn api_url(&self) -> String {
        format!("https://{API_IP}:{API_PORT}")
    }

    /// `https://127.0.0.1:6443`: a node's local API server (its proxy), valid inside a node
    /// namespace.
    pub fn local_api_url(&self) -> String {
        format!("https://127.0.0.1:{API_PORT}")
    }

    /// Admin kubeconfig (user `admin` in `system:masters`, server [`Lab::api_url`]).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig").join("admin.yaml")
    }

    /// Kubeconfig of `node`'s user ([`node_user`]), server [`Lab::api_url`].
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] for a name that is not a node.
    pub fn kubeconfig(&self, node: &str) -> Result<PathBuf> {
        Self::node_checked(node)?;
        Ok(self.dir.join("kubeconfig").join(format!("{node}.yaml")))
    }

    /// Kubeconfig of `node`'s user pointing at the node's local API server
    /// (`https://127.0.0.1:6443`), for control-plane mode.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] for a name that is not a node.
    pub fn local_kubeconfig(&self, node: &str) -> Result<PathBuf> {
        Self::node_checked(node)?;
        Ok(self
            .dir
            .join("kubeconfig")
            .join(format!("{node}-local.yaml")))
    }

    /// CA certificate (PEM file) that signed the API server's serving certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("pki").join("ca.crt")
    }

    /// Bearer token of `admin` (system:masters).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Bearer token of `node`'s user.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] for a name that is not a node.
    pub fn node_token(&self, node: &str) -> Result<&str> {
        Self::node_checked(node)?;
        Ok(self
            .node_tokens
            .get(node)
            .map(String::as_str)
            .unwrap_or_default())
    }

    /// Pids of etcd and kube-apiserver.
    pub fn control_plane_pids(&self) -> Vec<i32> {
        self.control_plane.iter().map(LabProcess::pid).collect()
    }

    /// Log of the API server (stdout + stderr).
    pub fn apiserver_log(&self) -> String {
        self.control_plane
            .get(1)
            .map(LabProcess::log)
            .unwrap_or_default()
    }

    // ----- ARP / NDP ---------------------------------------------------------------------

    /// Starts capturing ARP and NS/NA frames on the client's eth0 (returns once the socket
    /// is open).
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Thread`] if the capture socket cannot be opened.
    pub fn start_capture(&self) -> Result<Capture> {
        Capture::start(&self.netns_path("client")?, ETH)
    }

    /// Captures ARP and NS/NA frames on the client's eth0 for `duration`.
    ///
    /// # Errors
    /// As [`Lab::start_capture`].
    pub fn capture_arp(&self, duration: Duration) -> Result<Vec<ArpFrame>> {
        let cap = self.start_capture()?;
        std::thread::sleep(duration);
        cap.stop()
    }

    /// Starts an [`ArpWatcher`] in ns client probing `target` every `interval` (ARP for IPv4,
    /// Neighbor Solicitation for IPv6).
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Thread`] if the socket cannot be opened.
    pub fn arp_watch(&self, target: IpAddr, interval: Duration) -> Result<ArpWatcher> {
        ArpWatcher::start(
            &self.netns_path("client")?,
            ETH,
            CLIENT_V4,
            CLIENT_V6,
            target,
            interval,
        )
    }

    /// Starts an [`ArpWatcher`] in ns api probing `target` every `interval`: for tests that
    /// also run a client probe, whose neighbour cache the watcher's replies must not touch.
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Thread`] if the socket cannot be opened.
    pub fn arp_watch_from_api(&self, target: IpAddr, interval: Duration) -> Result<ArpWatcher> {
        ArpWatcher::start(
            &self.netns_path("api")?,
            ETH,
            API_IP,
            CLIENT_V6,
            target,
            interval,
        )
    }

    fn teardown(&mut self) {
        if let Ok(mut m) = self.local_apis.lock() {
            m.clear();
        }
        if let Ok(mut m) = self.http_backends.lock() {
            m.clear();
        }
        if let Ok(mut d) = self.dnsmasq.lock() {
            d.take();
        }
        for mut p in self.control_plane.drain(..) {
            let _ = p.kill();
        }
        let full: Vec<String> = self
            .created
            .iter()
            .map(|n| format!("{}{n}", self.prefix))
            .collect();
        remove_namespaces(&full);
        self.created.clear();
        if self.keep {
            eprintln!("lab: VIPD_LAB_KEEP=1, keeping {}", self.dir.display());
        } else {
            if std::thread::panicking() {
                eprint!("{}", log_tails(&self.dir.join("logs")));
                eprintln!(
                    "lab: removing {} (set VIPD_LAB_KEEP=1 to keep the logs)",
                    self.dir.display()
                );
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        let _ = std::fs::remove_file(record_path(&self.prefix));
    }
}

/// Lines of each vipd log printed when a lab test fails ([`log_tails`]).
const FAILED_LOG_TAIL_LINES: usize = 40;

/// Characters of each line [`log_tails`] prints (longer ones end in `…`).
const FAILED_LOG_LINE_CHARS: usize = 2_000;

/// Bytes [`log_tails`] reads at most from the end of each log.
const FAILED_LOG_TAIL_BYTES: u64 = 256 * 1024;

/// For a failed test whose lab is about to be removed: the last
/// [`FAILED_LOG_TAIL_LINES`] lines of each vipd log in `logs` (files named `*vipd*.log`, in
/// name order), each under a line naming its file, so that a failure in CI, where the lab
/// is not kept, still says what the nodes did. Bounded: at most [`FAILED_LOG_TAIL_BYTES`]
/// are read from the end of each log (a first line cut there starts with `…`), bytes that are
/// not UTF-8 are replaced, and each line is cut to [`FAILED_LOG_LINE_CHARS`] characters.
/// Empty when `logs` cannot be read; a log that cannot be read is left out. Never panics.
fn log_tails(logs: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(logs) else {
        return String::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("vipd") && n.ends_with(".log"))
        })
        .collect();
    paths.sort();
    let mut out = String::new();
    for path in paths {
        let Some(text) = read_tail(&path, FAILED_LOG_TAIL_BYTES) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(FAILED_LOG_TAIL_LINES)..];
        out.push_str(&format!(
            "lab: the last {} lines of {}:\n",
            tail.len(),
            path.display()
        ));
        for line in tail {
            out.push_str("  ");
            match line.char_indices().nth(FAILED_LOG_LINE_CHARS) {
                Some((cut, _)) => {
                    out.push_str(&line[..cut]);
                    out.push('…');
                }
                None => out.push_str(line),
            }
            out.push('\n');
        }
    }
    out
}

/// The last `max` bytes of the file at `path` as text (bytes that are not UTF-8 replaced;
/// when the file is longer, the text starts with `…`, its first line cut). `None` when it
/// cannot be read.
fn read_tail(path: &Path, max: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let start = len.saturating_sub(max);
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    Some(match start {
        0 => text.into_owned(),
        _ => format!("…{text}"),
    })
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Sweeps labs left by dead runs, then names a new lab: its per-run prefix
/// (`vl<pid>x<n>-`) and its directory (under `$VIPD_LAB_DIR`, else /dev/shm, else the
/// temporary directory), created with the sub-directories `subs`.
///
/// # Errors
/// [`LabError::Io`] when a directory cannot be created.
pub(crate) fn new_lab(subs: &[&str]) -> Result<(String, PathBuf)> {
    for (prefix, err) in sweep_stale_labs() {
        if let Some(e) = err {
            eprintln!("lab: could not fully remove stale lab {prefix}: {e}");
        }
    }
    let prefix = format!(
        "{NAME_PREFIX}{}x{}-",
        std::process::id(),
        LAB_COUNTER.fetch_add(1, Ordering::SeqCst)
    );
    let base = std::env::var_os("VIPD_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let shm = Path::new("/dev/shm");
            if shm.is_dir() {
                shm.to_path_buf()
            } else {
                std::env::temp_dir()
            }
        });
    let dir = base.join(format!("vipd-lab-{}", prefix.trim_end_matches('-')));
    for sub in subs {
        std::fs::create_dir_all(dir.join(sub))
            .map_err(io_ctx(format!("create {}", dir.join(sub).display())))?;
    }
    Ok((prefix, dir))
}

/// Prints a start-up phase timing when `VIPD_LAB_TRACE=1`.
fn trace(t0: Instant, what: &str) {
    if std::env::var("VIPD_LAB_TRACE").is_ok_and(|v| v == "1") {
        eprintln!("lab: {:>6.2} s {what}", t0.elapsed().as_secs_f64());
    }
}

/// User name of `node` in tokens.csv and its kubeconfig: `vipd-node-a`, ... Not in
/// `system:masters`; member of [`NODE_GROUP`].
pub fn node_user(node: &str) -> String {
    format!("vipd-{node}")
}

/// Whether lab tests should run. Returns `Ok(true)` as root; `Ok(false)` (after printing
/// `SKIPPED <test>: ...`) when `VIPD_SKIP_LAB=1` (set by `cargo xtask test` when not root);
/// otherwise an error, so a lab test run without root never passes silently.
///
/// # Errors
/// [`LabError::NotRoot`] when not root and `VIPD_SKIP_LAB` is not `1`.
pub fn lab_available(test: &str) -> Result<bool> {
    if std::env::var("VIPD_SKIP_LAB").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: VIPD_SKIP_LAB=1 (lab tests need root)");
        return Ok(false);
    }
    let uid = nix::unistd::geteuid().as_raw();
    if uid != 0 {
        return Err(LabError::NotRoot { uid });
    }
    Ok(true)
}

#[cfg(test)]
mod log_tail_tests {
    use super::*;

    #[test]
    fn a_failed_test_prints_the_last_lines_of_each_vipd_log_only() {
        let dir = tempfile::tempdir().unwrap();
        let long: String = (1..=50).map(|i| format!("a{i}\n")).collect();
        std::fs::write(dir.path().join("002-node-a-vipd.log"), long).unwrap();
        std::fs::write(dir.path().join("003-node-b-vipd.log"), "b1\nb2\n").unwrap();
        std::fs::write(dir.path().join("000-api-etcd.log"), "etcd\n").unwrap();
        let out = log_tails(dir.path());
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("lab: the last 40 lines of "));
        assert!(lines[0].ends_with("002-node-a-vipd.log:"));
        assert_eq!(lines[1], "  a11");
        assert_eq!(lines[40], "  a50");
        assert!(lines[41].ends_with("003-node-b-vipd.log:"), "{}", lines[41]);
        assert_eq!(&lines[42..], ["  b1", "  b2"]);
        assert!(!out.contains("etcd"));
        assert_eq!(log_tails(&dir.path().join("absent")), "");
    }

    /// A log with a huge line (S20 logs Services with 10 000 addresses) or bytes that are
    /// not UTF-8 (a line cut by a kill) is still printed, and bounded: each line cut to
    /// [`FAILED_LOG_LINE_CHARS`] characters, at most [`FAILED_LOG_TAIL_BYTES`] read.
    #[test]
    fn a_huge_or_broken_log_is_printed_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = "é".repeat(1_000_000).into_bytes();
        log.extend_from_slice(b"\nbroken \xff\xfe line\nlast\n");
        std::fs::write(dir.path().join("001-node-a-vipd.log"), &log).unwrap();
        let mut big = vec![b'x'; 8 << 20];
        big.extend_from_slice(b"\nend\n");
        std::fs::write(dir.path().join("002-node-b-vipd.log"), &big).unwrap();
        let out = log_tails(dir.path());
        assert!(
            out.len() < 4 * (FAILED_LOG_LINE_CHARS * 4 + 200),
            "{} bytes",
            out.len()
        );
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].ends_with("001-node-a-vipd.log:"), "{}", lines[0]);
        // Read from 256 KiB before the end, the first character may be a cut 'é' (U+FFFD).
        assert!(lines[1].ends_with("é…"), "cut");
        assert_eq!(lines[1].chars().count(), 2 + FAILED_LOG_LINE_CHARS + 1);
        assert_eq!(lines[2], "  broken \u{fffd}\u{fffd} line");
        assert_eq!(lines[3], "  last");
        assert!(lines[4].ends_with("002-node-b-vipd.log:"), "{}", lines[4]);
        assert_eq!(lines[6], "  end");
    }
}
