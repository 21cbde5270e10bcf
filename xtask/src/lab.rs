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

pub mod arp;
pub mod control_plane;
pub mod error;
pub mod https;
pub mod netns;
pub mod process;
pub mod servers;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use arp::{
    ArpFrame, ArpOp, ArpRoundProber, ArpWatcher, Capture, DEFAULT_WATCH_INTERVAL, MacAddr,
    MultiResponderInterval, ProbeRound, ProbeSlot, WatchReport,
};
pub use control_plane::{find_apiserver, vipd_binary};
pub use error::{LabError, Result};
pub use https::{ApiClient, HttpResponse};
pub use process::{LabProcess, Signal};
pub use servers::ThreadServer;

use error::io_ctx;
use process::ip;

/// The node namespaces, in order.
pub const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
/// Every namespace of a lab, in creation order.
pub const NAMESPACES: [&str; 6] = ["lan", "api", "node-a", "node-b", "node-c", "client"];
/// Address of the API server (ns `api`).
pub const API_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// Port of the API server and of every node's local API proxy.
pub const API_PORT: u16 = 6443;
/// The control-plane VIP used by the scenarios (in the serving certificate's SANs).
pub const CONTROL_PLANE_VIP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
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
    NODES
        .iter()
        .position(|n| *n == node)
        .map(|i| Ipv4Addr::new(192, 0, 2, 11 + i as u8))
}

/// IPv6 address of node `node` (`node-a` is 2001:db8::11, ...), `None` for other names.
pub fn node_ipv6(node: &str) -> Option<Ipv6Addr> {
    NODES
        .iter()
        .position(|n| *n == node)
        .map(|i| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x11 + i as u16))
}

/// Fixed MAC of a member's eth0 (02:00:c0:00:02:<last IPv4 octet>), for readable logs.
fn member_mac(ns: &str) -> Option<String> {
    let last = match ns {
        "api" => API_IP.octets()[3],
        "client" => CLIENT_V4.octets()[3],
        n => node_ipv4(n)?.octets()[3],
    };
    Some(format!("02:00:c0:00:02:{last:02x}"))
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
        }
    }
}

/// One address of an interface, from `ip -j addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabAddress {
    /// The address.
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// Scope (`global`, `link`, `host`).
    pub scope: String,
    /// Label (IPv4 only), e.g. `eth0` or `eth0:vip`.
    pub label: Option<String>,
    /// Boolean flags set on the address, e.g. `secondary`, `dynamic`, `tentative`,
    /// `dadfailed`, `deprecated`, `noprefixroute`.
    pub flags: Vec<String>,
    /// Address protocol (IFA_PROTO) if the kernel reports one (e.g. `"0x63"` or a name).
    pub protocol: Option<String>,
    /// Remaining valid lifetime in seconds; `None` means forever.
    pub valid_lft: Option<u64>,
    /// Remaining preferred lifetime in seconds; `None` means forever.
    pub preferred_lft: Option<u64>,
}

impl LabAddress {
    /// Whether `flag` (e.g. `"secondary"`) is set.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// Parses the JSON of `ip -j addr show dev IF` into addresses.
///
/// # Errors
/// [`LabError::Parse`] when the JSON has an unexpected shape.
pub fn parse_ip_addr_json(json: &str) -> Result<Vec<LabAddress>> {
    let perr = |detail: String| LabError::Parse {
        what: "ip -j addr output".into(),
        detail,
    };
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| perr(e.to_string()))?;
    let mut out = Vec::new();
    let links = v.as_array().ok_or_else(|| perr("not an array".into()))?;
    for link in links {
        let Some(infos) = link.get("addr_info").and_then(|a| a.as_array()) else {
            continue;
        };
        for info in infos {
            let Some(obj) = info.as_object() else {
                continue;
            };
            // Entries without `local` carry only lifetimes of the previous one.
            let Some(local) = obj.get("local").and_then(|l| l.as_str()) else {
                continue;
            };
            let addr: IpAddr = local
                .parse()
                .map_err(|_| perr(format!("bad address {local}")))?;
            let prefix = obj
                .get("prefixlen")
                .and_then(|p| p.as_u64())
                .and_then(|p| u8::try_from(p).ok())
                .ok_or_else(|| perr(format!("no prefixlen for {local}")))?;
            let lft = |k: &str| {
                obj.get(k)
                    .and_then(|x| x.as_u64())
                    .filter(|x| *x != u64::from(u32::MAX))
            };
            let flags = obj
                .iter()
                .filter(|(_, v)| v.as_bool() == Some(true))
                .map(|(k, _)| k.clone())
                .collect();
            out.push(LabAddress {
                addr,
                prefix,
                scope: obj
                    .get("scope")
                    .and_then(|s| s.as_str())
                    .unwrap_or_default()
                    .to_string(),
                label: obj
                    .get("label")
                    .and_then(|s| s.as_str())
                    .map(str::to_string),
                flags,
                protocol: obj.get("protocol").map(|p| match p.as_str() {
                    Some(s) => s.to_string(),
                    None => p.to_string(),
                }),
                valid_lft: lft("valid_life_time"),
                preferred_lft: lft("preferred_life_time"),
            });
        }
    }
    Ok(out)
}

/// The record a lab leaves in [`REGISTRY_DIR`] so a later run can clean up after a crash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabRecord {
    /// Name prefix, e.g. `vl4242x0-`.
    pub prefix: String,
    /// Pid of the process that created (and owns) the lab.
    pub pid: i32,
    /// That process's start time (field 22 of /proc/PID/stat, clock ticks since boot), to
    /// tell a live owner from a recycled pid.
    pub start_time: u64,
    /// Lab directory (logs, PKI, kubeconfigs).
    pub dir: PathBuf,
}

/// A control-plane process of the lab (see [`Lab::restart_control_plane`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlPlaneProcess {
    /// etcd (ns `api`, 127.0.0.1:2379).
    Etcd = 0,
    /// kube-apiserver (ns `api`, :6443).
    ApiServer = 1,
}

/// Command line of a control-plane process, kept to restart it.
#[derive(Debug, Clone)]
struct ControlPlaneCmd {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// etcd's command line in the lab (data in `data_dir`, client URL 127.0.0.1:2379).
fn etcd_args(data_dir: &str) -> Vec<String> {
    [
        "--name",
        "lab",
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        "http://127.0.0.1:2379",
        "--advertise-client-urls",
        "http://127.0.0.1:2379",
        "--listen-peer-urls",
        "http://127.0.0.1:2380",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:2380",
        "--initial-cluster",
        "lab=http://127.0.0.1:2380",
        "--log-level",
        "warn",
        "--logger",
        "zap",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
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
    control_plane: Vec<LabProcess>,
    /// How each `control_plane` process was started (same order), for restarts.
    control_plane_cmds: Vec<ControlPlaneCmd>,
    local_apis: Mutex<HashMap<String, ThreadServer>>,
    http_backends: Mutex<HashMap<String, ThreadServer>>,
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
        control_plane::ensure_packages(&[("ip", "iproute2"), ("etcd", "etcd-server")])?;
        let t0 = Instant::now();
        let apiserver = find_apiserver()?;
        trace(t0, "found kube-apiserver");
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
        for sub in ["logs", "pki", "kubeconfig", "etcd"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(io_ctx(format!("create {}", dir.join(sub).display())))?;
        }
        let mut lab = Lab {
            prefix,
            dir,
            created: Vec::new(),
            control_plane: Vec::new(),
            control_plane_cmds: Vec::new(),
            local_apis: Mutex::new(HashMap::new()),
            http_backends: Mutex::new(HashMap::new()),
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

    fn write_record(&self) -> Result<()> {
        std::fs::create_dir_all(REGISTRY_DIR).map_err(io_ctx(format!("create {REGISTRY_DIR}")))?;
        let pid = std::process::id() as i32;
        let rec = LabRecord {
            prefix: self.prefix.clone(),
            pid,
            start_time: process_start_time(pid).unwrap_or(0),
            dir: self.dir.clone(),
        };
        let path = record_path(&self.prefix);
        let json = serde_json::to_string_pretty(&rec).map_err(|e| LabError::Parse {
            what: "lab record".into(),
            detail: e.to_string(),
        })?;
        std::fs::write(&path, json).map_err(io_ctx(format!("write {}", path.display())))
    }

    fn build_network(&mut self, opts: &LabOptions) -> Result<()> {
        for ns in NAMESPACES {
            let full = format!("{}{ns}", self.prefix);
            ip(&["netns", "add", &full])?;
            self.created.push(ns.to_string());
        }
        // Namespace-wide sysctls, before the interfaces exist so `default` applies to them.
        for ns in NAMESPACES {
            let mut settings: Vec<(&str, &str)> = vec![
                ("net/ipv6/conf/default/router_solicitations", "0"),
                ("net/ipv6/conf/all/router_solicitations", "0"),
            ];
            match ns {
                // The switch and the API server stay IPv4-only: no MLD/NDP noise on the wire.
                "lan" | "api" => {
                    settings.push(("net/ipv6/conf/all/disable_ipv6", "1"));
                    settings.push(("net/ipv6/conf/default/disable_ipv6", "1"));
                }
                // The client's own addresses are usable at once (no DAD).
                "client" => settings.push(("net/ipv6/conf/default/accept_dad", "0")),
                // Nodes keep DAD (IPv6 VIP tests need it); their own address skips it.
                _ => {}
            }
            let path = self.netns_path(ns)?;
            netns::run_in_netns(&path, || -> Result<()> {
                for (k, v) in &settings {
                    let p = Path::new("/proc/sys").join(k);
                    std::fs::write(&p, v)
                        .map_err(io_ctx(format!("write {} in {ns}", p.display())))?;
                }
                Ok(())
            })??;
        }
        let lan = self.ns_name("lan")?;
        ip(&["-n", &lan, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            &lan,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
            "mcast_snooping",
            "0",
            "forward_delay",
            "0",
        ])?;
        ip(&["-n", &lan, "link", "set", "br0", "up"])?;
        for ns in NAMESPACES.iter().filter(|n| **n != "lan") {
            let full = self.ns_name(ns)?;
            let port = format!("v-{ns}");
            let mut args = vec![
                "-n", &lan, "link", "add", &port, "type", "veth", "peer", "name", ETH,
            ];
            let mac = member_mac(ns);
            if let Some(mac) = mac.as_deref() {
                args.extend(["address", mac]);
            }
            args.extend(["netns", &full]);
            ip(&args)?;
            ip(&["-n", &lan, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &full, "link", "set", "lo", "up"])?;
            ip(&["-n", &full, "link", "set", ETH, "up"])?;
            let (v4, v6) = match *ns {
                "api" => (API_IP, None),
                "client" => (CLIENT_V4, Some(CLIENT_V6)),
                node => (node_ipv4(node).unwrap_or(API_IP), node_ipv6(node)),
            };
            ip(&[
                "-n",
                &full,
                "addr",
                "add",
                &format!("{v4}/{PREFIX_V4}"),
                "dev",
                ETH,
            ])?;
            if let Some(v6) = v6 {
                ip(&[
                    "-n",
                    &full,
                    "addr",
                    "add",
                    &format!("{v6}/{PREFIX_V6}"),
                    "dev",
                    ETH,
                    "nodad",
                ])?;
            }
            if opts.default_route && NODES.contains(ns) {
                ip(&[
                    "-n",
                    &full,
                    "route",
                    "add",
                    "default",
                    "via",
                    &GATEWAY_V4.to_string(),
                    "dev",
                    ETH,
                ])?;
                ip(&[
                    "-n",
                    &full,
                    "-6",
                    "route",
                    "add",
                    "default",
                    "via",
                    &GATEWAY_V6.to_string(),
                    "dev",
                    ETH,
                ])?;
            }
        }
        Ok(())
    }

    fn start_control_plane(&mut self, opts: &LabOptions, apiserver: &Path) -> Result<()> {
        let mut extra: Vec<IpAddr> = vec![IpAddr::V4(CONTROL_PLANE_VIP)];
        extra.extend(NODES.iter().filter_map(|n| node_ipv4(n)).map(IpAddr::V4));
        extra.extend(opts.extra_sans.iter().copied());
        let pki =
            control_plane::generate_pki(&control_plane::default_sans(IpAddr::V4(API_IP), &extra))?;
        let pki_dir = self.dir.join("pki");
        let write = |name: &str, data: &str| -> Result<PathBuf> {
            let p = pki_dir.join(name);
            std::fs::write(&p, data).map_err(io_ctx(format!("write {}", p.display())))?;
            Ok(p)
        };
        let ca = write("ca.crt", &pki.ca_pem)?;
        let cert = write("server.crt", &pki.server_cert_pem)?;
        let key = write("server.key", &pki.server_key_pem)?;
        let sa_key = write("sa.key", &pki.sa_key_pem)?;
        let sa_pub = write("sa.pub", &pki.sa_pub_pem)?;
        self.ca_der = pki.ca_der.clone();

        let mut tokens = format!("{},admin,uid-admin,\"system:masters\"\n", self.admin_token);
        for node in NODES {
            let t = control_plane::random_token()?;
            tokens.push_str(&format!(
                "{t},{},uid-{node},\"{NODE_GROUP}\"\n",
                node_user(node)
            ));
            self.node_tokens.insert(node.to_string(), t);
        }
        let tokens_csv = write("tokens.csv", &tokens)?;

        let kdir = self.dir.join("kubeconfig");
        let api_url = self.api_url();
        let local_url = self.local_api_url();
        let kc = |name: String, server: &str, user: &str, token: &str| -> Result<()> {
            let p = kdir.join(name);
            std::fs::write(
                &p,
                control_plane::kubeconfig(server, &pki.ca_pem, user, token),
            )
            .map_err(io_ctx(format!("write {}", p.display())))
        };
        kc("admin.yaml".into(), &api_url, "admin", &self.admin_token)?;
        for node in NODES {
            let t = self.node_tokens.get(node).cloned().unwrap_or_default();
            kc(format!("{node}.yaml"), &api_url, &node_user(node), &t)?;
            kc(
                format!("{node}-local.yaml"),
                &local_url,
                &node_user(node),
                &t,
            )?;
        }

        let etcd_dir = self.dir.join("etcd");
        let etcd_dir_s = etcd_dir.to_string_lossy().into_owned();
        let etcd = self.spawn(
            "api",
            "etcd",
            &etcd_args(&etcd_dir_s),
            &[("ETCD_UNSUPPORTED_ARCH", "")],
        )?;
        self.control_plane.push(etcd);
        self.control_plane_cmds.push(ControlPlaneCmd {
            program: PathBuf::from("etcd"),
            args: etcd_args(&etcd_dir_s),
            env: vec![("ETCD_UNSUPPORTED_ARCH".into(), String::new())],
        });
        let p = |x: &Path| x.to_string_lossy().into_owned();
        let mut args: Vec<String> = vec![
            "--etcd-servers=http://127.0.0.1:2379".into(),
            "--bind-address=0.0.0.0".into(),
            format!("--advertise-address={API_IP}"),
            format!("--secure-port={API_PORT}"),
            "--insecure-port=0".into(),
            format!("--tls-cert-file={}", p(&cert)),
            format!("--tls-private-key-file={}", p(&key)),
            format!("--client-ca-file={}", p(&ca)),
            format!("--token-auth-file={}", p(&tokens_csv)),
            format!("--service-account-key-file={}", p(&sa_pub)),
            format!("--service-account-signing-key-file={}", p(&sa_key)),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            format!("--cert-dir={}", p(&pki_dir)),
            "--profiling=false".into(),
            "--enable-priority-and-fairness=false".into(),
            "--allow-privileged=true".into(),
        ];
        args.extend(opts.apiserver_args.iter().cloned());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let api = self.spawn("api", apiserver, &argv, &[])?;
        self.control_plane.push(api);
        self.control_plane_cmds.push(ControlPlaneCmd {
            program: apiserver.to_path_buf(),
            args,
            env: Vec::new(),
        });

        let started_cp = Instant::now();
        let deadline = started_cp + opts.ready_timeout;
        self.wait_api("kube-apiserver /readyz", deadline, |c| {
            Ok(c.request("GET", "/readyz", None)?.status == 200)
        })?;
        trace(started_cp, "kube-apiserver /readyz ok");
        for ns in ["default", "kube-system"] {
            self.wait_api(&format!("namespace {ns}"), deadline, |c| {
                Ok(c.request("GET", &format!("/api/v1/namespaces/{ns}"), None)?
                    .status
                    == 200)
            })?;
        }
        trace(started_cp, "namespaces default and kube-system exist");
        if opts.node_rbac == NodeRbac::ClusterAdmin {
            let crb = serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "vipd-lab-nodes"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                              "name": NODE_GROUP}],
            })
            .to_string();
            self.wait_api("ClusterRoleBinding vipd-lab-nodes", deadline, |c| {
                let r = c.request(
                    "POST",
                    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                    Some(&crb),
                )?;
                match r.status {
                    200..=299 | 409 => Ok(true),
                    // RBAC bootstrap (cluster-admin role) may lag a moment behind /readyz.
                    403 | 404 | 500 | 503 => Ok(false),
                    s => Err(LabError::Http {
                        method: "POST".into(),
                        path: "clusterrolebindings".into(),
                        status: s,
                        body: r.body.chars().take(500).collect(),
                    }),
                }
            })?;
        }
        Ok(())
    }

    /// Restarts etcd or kube-apiserver (chaos soak: "API server restart", "etcd restart"):
    /// SIGCONT (in case it was frozen), SIGTERM, up to 10 s to exit, then SIGKILL; starts it
    /// again with the same command line and data directory, and waits until the API
    /// server's /readyz answers 200 again (at most `ready_timeout`).
    ///
    /// # Errors
    /// [`LabError::Io`] when it cannot be stopped or started, [`LabError::Timeout`] when the
    /// API server is not ready in time, [`LabError::Thread`] when a control-plane process
    /// exits meanwhile.
    pub fn restart_control_plane(
        &mut self,
        which: ControlPlaneProcess,
        ready_timeout: Duration,
    ) -> Result<()> {
        let i = which as usize;
        let cmd = self
            .control_plane_cmds
            .get(i)
            .cloned()
            .ok_or_else(|| LabError::Thread {
                name: format!("{which:?}"),
                detail: "not started by this lab".into(),
            })?;
        if let Some(p) = self.control_plane.get_mut(i) {
            let _ = p.signal(Signal::SIGCONT);
            p.stop(Duration::from_secs(10))?;
        }
        let env: Vec<(&str, &str)> = cmd
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let p = self.spawn("api", &cmd.program, &cmd.args, &env)?;
        if let Some(slot) = self.control_plane.get_mut(i) {
            *slot = p;
        }
        let deadline = Instant::now() + ready_timeout;
        self.wait_api("kube-apiserver /readyz after a restart", deadline, |c| {
            Ok(c.request("GET", "/readyz", None)?.status == 200)
        })
    }

    /// Polls `check` (run with an admin client inside ns `api`) every 100 ms until it
    /// returns true; connection errors count as "not yet". Fails fast if a control-plane
    /// process exits.
    fn wait_api(
        &mut self,
        what: &str,
        deadline: Instant,
        check: impl Fn(&ApiClient) -> Result<bool> + Sync,
    ) -> Result<()> {
        let started = Instant::now();
        let client =
            self.admin_client(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), API_PORT))?;
        let path = self.netns_path("api")?;
        loop {
            let res = netns::run_in_netns(&path, || check(&client))?;
            match res {
                Ok(true) => return Ok(()),
                Ok(false) | Err(LabError::Io { .. }) => {}
                Err(e) => return Err(e),
            }
            for p in &mut self.control_plane {
                if let Some(st) = p.try_wait()? {
                    let log = p.log();
                    let tail: String = log
                        .lines()
                        .rev()
                        .take(15)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n");
                    return Err(LabError::Thread {
                        name: p.name().to_string(),
                        detail: format!(
                            "exited ({st}) while waiting for {what}; log tail:\n{tail}"
                        ),
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(LabError::Timeout {
                    what: what.to_string(),
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// An admin (system:masters) client for the API server at `addr`. It must be used from a
    /// thread inside a lab namespace (see [`Lab::in_netns`]).
    ///
    /// # Errors
    /// [`LabError::Tls`] if the CA cannot be loaded.
    pub fn admin_client(&self, addr: SocketAddr) -> Result<ApiClient> {
        ApiClient::new(addr, &self.ca_der, &self.admin_token)
    }

    /// Sends one request as admin from ns `api` to the API server; returns status and body.
    ///
    /// # Errors
    /// [`LabError::Io`] on connection/TLS failures.
    pub fn api_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<HttpResponse> {
        let client =
            self.admin_client(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), API_PORT))?;
        self.in_netns("api", || client.request(method, path, body))?
    }

    /// `gitVersion` reported by the API server's /version (e.g. `v1.20.2`; Debian builds may
    /// report a different string).
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Http`]/[`LabError::Parse`].
    pub fn server_version(&self) -> Result<String> {
        let r = self.api_request("GET", "/version", None)?;
        let v: serde_json::Value = serde_json::from_str(&r.body).map_err(|e| LabError::Parse {
            what: "/version".into(),
            detail: e.to_string(),
        })?;
        Ok(v.get("gitVersion")
            .and_then(|g| g.as_str())
            .unwrap_or_default()
            .to_string())
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

    /// Full `ip netns` name of lab namespace `ns` (`lan`, `api`, `node-a`, ..., `client`).
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] for other names.
    pub fn ns_name(&self, ns: &str) -> Result<String> {
        if NAMESPACES.contains(&ns) {
            Ok(format!("{}{ns}", self.prefix))
        } else {
            Err(LabError::UnknownNamespace {
                name: ns.to_string(),
                expected: NAMESPACES.join(", "),
            })
        }
    }

    /// Full `ip netns` names of every namespace of this lab.
    pub fn namespace_names(&self) -> Vec<String> {
        NAMESPACES
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

    // ----- processes ---------------------------------------------------------------------

    /// Starts `program args...` inside lab namespace `ns` (via `ip netns exec`, which also
    /// gives it the namespace's /sys), with extra environment `env`. Output goes to a log
    /// file under `<dir>/logs/`.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`], or [`LabError::Io`] if it cannot be started.
    pub fn spawn<S: AsRef<OsStr>>(
        &self,
        ns: &str,
        program: impl AsRef<OsStr>,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Result<LabProcess> {
        let full = self.ns_name(ns)?;
        let program = program.as_ref();
        let base = Path::new(program)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "proc".into());
        let seq = self.log_seq.fetch_add(1, Ordering::SeqCst);
        let log = self
            .dir
            .join("logs")
            .join(format!("{seq:03}-{ns}-{base}.log"));
        let args: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
        LabProcess::spawn(&full, &base, program, &args, env, &log)
    }

    /// Runs `program args...` to completion inside `ns`; fails on a non-zero exit.
    ///
    /// # Errors
    /// [`LabError::Command`] with its stderr on a non-zero exit.
    pub fn exec<S: AsRef<OsStr>>(
        &self,
        ns: &str,
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> Result<Output> {
        let full = self.ns_name(ns)?;
        let mut all: Vec<&OsStr> = vec![OsStr::new("netns"), OsStr::new("exec"), OsStr::new(&full)];
        all.push(program.as_ref());
        all.extend(args.iter().map(AsRef::as_ref));
        process::run(process::ip_binary(), &all)
    }

    /// Like [`Lab::exec`] but returns the output whatever the exit status.
    ///
    /// # Errors
    /// [`LabError::Io`] when the command cannot be started.
    pub fn exec_unchecked<S: AsRef<OsStr>>(
        &self,
        ns: &str,
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> Result<Output> {
        let full = self.ns_name(ns)?;
        std::process::Command::new(process::ip_binary())
            .args(["netns", "exec", &full])
            .arg(program.as_ref())
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(io_ctx(format!(
                "run {} in {ns}",
                program.as_ref().to_string_lossy()
            )))
    }

    /// Runs `f` on a thread that entered lab namespace `ns` and returns its result (a panic
    /// in `f` is re-raised). Use it to talk to the API "from node-b" (e.g. build a tokio
    /// runtime with a kube client inside `f`) or to bind sockets in a namespace.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`], or [`LabError::Io`] if the namespace cannot be entered.
    pub fn in_netns<T: Send>(&self, ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
        netns::run_in_netns(&self.netns_path(ns)?, f)
    }

    // ----- links -------------------------------------------------------------------------

    fn port(&self, node: &str) -> Result<(String, String)> {
        if node == "lan" || !NAMESPACES.contains(&node) {
            return Err(LabError::UnknownNamespace {
                name: node.to_string(),
                expected: NAMESPACES[1..].join(", "),
            });
        }
        Ok((self.ns_name("lan")?, format!("v-{node}")))
    }

    /// Sets the switch-side end of `node`'s link down: `node`'s eth0 loses carrier
    /// (NO-CARRIER / LOWERLAYERDOWN), as when a cable is pulled.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Command`].
    pub fn cut_link(&self, node: &str) -> Result<()> {
        let (lan, port) = self.port(node)?;
        ip(&["-n", &lan, "link", "set", &port, "down"]).map(drop)
    }

    /// Undoes [`Lab::cut_link`].
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Command`].
    pub fn restore_link(&self, node: &str) -> Result<()> {
        let (lan, port) = self.port(node)?;
        ip(&["-n", &lan, "link", "set", &port, "up"]).map(drop)
    }

    /// Cuts `node` off from everything (other nodes, client and the API server) while its
    /// eth0 keeps carrier: the switch port is detached from the bridge, so frames go nowhere.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Command`].
    pub fn partition(&self, node: &str) -> Result<()> {
        let (lan, port) = self.port(node)?;
        ip(&["-n", &lan, "link", "set", &port, "nomaster"]).map(drop)
    }

    /// Undoes [`Lab::partition`].
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Command`].
    pub fn heal(&self, node: &str) -> Result<()> {
        let (lan, port) = self.port(node)?;
        ip(&["-n", &lan, "link", "set", &port, "master", "br0"]).map(drop)
    }

    /// Gives `node` a second interface `ifname` on the lab segment (S36): a veth whose
    /// switch end `v-<node>-<ifname>` joins the bridge, with `cidr` (e.g. `192.0.2.111/24`)
    /// on it, up. Created from `lan` with the peer moved straight into `node`, like eth0;
    /// it goes with the namespaces. Returns its MAC.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`], [`LabError::Command`] (e.g. the name is taken or
    /// longer than 15 bytes) or [`LabError::Parse`].
    pub fn add_interface(&self, node: &str, ifname: &str, cidr: &str) -> Result<MacAddr> {
        let (lan, port) = self.port(node)?;
        let port = format!("{port}-{ifname}");
        let full = self.ns_name(node)?;
        ip(&[
            "-n", &lan, "link", "add", &port, "type", "veth", "peer", "name", ifname, "netns",
            &full,
        ])?;
        ip(&["-n", &lan, "link", "set", &port, "master", "br0", "up"])?;
        ip(&["-n", &full, "addr", "add", cidr, "dev", ifname])?;
        ip(&["-n", &full, "link", "set", ifname, "up"])?;
        self.mac_of_if(node, ifname)
    }

    /// Addresses on `ifname` in namespace `ns`, from `ip -j addr show dev IFNAME`.
    ///
    /// # Errors
    /// [`LabError::Command`] (e.g. no such device) or [`LabError::Parse`].
    pub fn addresses(&self, ns: &str, ifname: &str) -> Result<Vec<LabAddress>> {
        let full = self.ns_name(ns)?;
        let out = ip(&["-n", &full, "-j", "addr", "show", "dev", ifname])?;
        parse_ip_addr_json(&String::from_utf8_lossy(&out.stdout))
    }

    /// MAC address of eth0 in `ns`.
    ///
    /// # Errors
    /// [`LabError::Command`] or [`LabError::Parse`].
    pub fn mac_of(&self, ns: &str) -> Result<MacAddr> {
        self.mac_of_if(ns, ETH)
    }

    /// MAC address of interface `ifname` in `ns`.
    ///
    /// # Errors
    /// [`LabError::Command`] or [`LabError::Parse`].
    pub fn mac_of_if(&self, ns: &str, ifname: &str) -> Result<MacAddr> {
        let full = self.ns_name(ns)?;
        let out = ip(&["-n", &full, "-j", "link", "show", "dev", ifname])?;
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| LabError::Parse {
                what: "ip -j link output".into(),
                detail: e.to_string(),
            })?;
        let s = v
            .get(0)
            .and_then(|l| l.get("address"))
            .and_then(|a| a.as_str())
            .unwrap_or_default();
        s.parse().map_err(|_| LabError::Parse {
            what: format!("MAC of {ns}"),
            detail: s.to_string(),
        })
    }

    /// The namespace whose eth0 has MAC `mac`, if any.
    pub fn ns_of_mac(&self, mac: MacAddr) -> Option<String> {
        NAMESPACES[1..]
            .iter()
            .find(|ns| self.mac_of(ns).ok() == Some(mac))
            .map(|s| s.to_string())
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

    // ----- per-node servers --------------------------------------------------------------

    /// Starts `node`'s local API server: a TCP proxy on [::]:6443 (all addresses, so also
    /// 127.0.0.1 and any VIP the node holds) forwarding to 192.0.2.2:6443. Idempotent.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Io`] if the port cannot be bound.
    pub fn start_local_api(&self, node: &str) -> Result<()> {
        Self::node_checked(node)?;
        let mut map = self.local_apis.lock().map_err(|_| poisoned("local_apis"))?;
        if map.contains_key(node) {
            return Ok(());
        }
        let server = ThreadServer::proxy(
            &self.netns_path(node)?,
            &format!("local-api-{node}"),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), API_PORT),
            SocketAddr::new(IpAddr::V4(API_IP), API_PORT),
        )?;
        map.insert(node.to_string(), server);
        Ok(())
    }

    /// Stops `node`'s local API server: the port refuses new connections and open ones are
    /// reset (scenario S10, "local API server dead"). Idempotent.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`].
    pub fn stop_local_api(&self, node: &str) -> Result<()> {
        Self::node_checked(node)?;
        let server = self
            .local_apis
            .lock()
            .map_err(|_| poisoned("local_apis"))?
            .remove(node);
        drop(server);
        Ok(())
    }

    /// Whether `node`'s local API server is running.
    pub fn local_api_running(&self, node: &str) -> bool {
        self.local_apis
            .lock()
            .map(|m| m.contains_key(node))
            .unwrap_or(false)
    }

    /// Starts the HTTP backend of `node` on [::]:80, answering every request with the node
    /// name and a newline. Idempotent.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Io`].
    pub fn start_http_backend(&self, node: &str) -> Result<()> {
        Self::node_checked(node)?;
        let mut map = self
            .http_backends
            .lock()
            .map_err(|_| poisoned("http_backends"))?;
        if map.contains_key(node) {
            return Ok(());
        }
        let server = ThreadServer::http(
            &self.netns_path(node)?,
            &format!("http-{node}"),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 80),
            node,
        )?;
        map.insert(node.to_string(), server);
        Ok(())
    }

    /// Starts the HTTP backends of all nodes.
    ///
    /// # Errors
    /// As [`Lab::start_http_backend`].
    pub fn start_http_backends(&self) -> Result<()> {
        NODES.iter().try_for_each(|n| self.start_http_backend(n))
    }

    /// Stops `node`'s HTTP backend. Idempotent.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`].
    pub fn stop_http_backend(&self, node: &str) -> Result<()> {
        Self::node_checked(node)?;
        let s = self
            .http_backends
            .lock()
            .map_err(|_| poisoned("http_backends"))?
            .remove(node);
        drop(s);
        Ok(())
    }

    /// Sends `GET path` (HTTP/1.0) to `addr` from namespace `ns` and returns the body,
    /// whatever the status (connect and read timeout `timeout`). Handy to check which
    /// node's backend a VIP reaches: `lab.http_get("client", vip_80, "/", t)`.
    ///
    /// # Errors
    /// [`LabError::Io`] on connection failure or timeout.
    pub fn http_get(
        &self,
        ns: &str,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<String> {
        self.in_netns(ns, || -> Result<String> {
            use std::io::{Read, Write};
            let ctx = format!("GET http://{addr}{path}");
            let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)
                .map_err(io_ctx(ctx.clone()))?;
            s.set_read_timeout(Some(timeout))
                .map_err(io_ctx(ctx.clone()))?;
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
                .map_err(io_ctx(ctx.clone()))?;
            let mut buf = String::new();
            s.read_to_string(&mut buf).map_err(io_ctx(ctx))?;
            Ok(buf
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default())
        })?
    }

    // ----- teardown ----------------------------------------------------------------------

    fn teardown(&mut self) {
        if let Ok(mut m) = self.local_apis.lock() {
            m.clear();
        }
        if let Ok(mut m) = self.http_backends.lock() {
            m.clear();
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

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Prints a start-up phase timing when `VIPD_LAB_TRACE=1`.
fn trace(t0: Instant, what: &str) {
    if std::env::var("VIPD_LAB_TRACE").is_ok_and(|v| v == "1") {
        eprintln!("lab: {:>6.2} s {what}", t0.elapsed().as_secs_f64());
    }
}

fn poisoned(what: &str) -> LabError {
    LabError::Thread {
        name: what.to_string(),
        detail: "lock poisoned by a panic".into(),
    }
}

/// User name of `node` in tokens.csv and its kubeconfig: `vipd-node-a`, ... Not in
/// `system:masters`; member of [`NODE_GROUP`].
pub fn node_user(node: &str) -> String {
    format!("vipd-{node}")
}

fn record_path(prefix: &str) -> PathBuf {
    Path::new(REGISTRY_DIR).join(format!("{}.json", prefix.trim_end_matches('-')))
}

/// Start time of process `pid` (field 22 of /proc/PID/stat), `None` if it does not exist
/// or is a zombie.
fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after ')' are plain.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Lists `ip netns` names.
///
/// # Errors
/// [`LabError::Command`] when `ip netns list` fails.
pub fn list_netns() -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

/// Parses `vl<pid>x<n>-rest` into (`vl<pid>x<n>-`, pid).
fn parse_lab_name(name: &str) -> Option<(String, i32)> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let (id, _) = rest.split_once('-')?;
    let (pid, n) = id.split_once('x')?;
    if pid.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pid: i32 = pid.parse().ok()?;
    Some((format!("{NAME_PREFIX}{id}-"), pid))
}

/// Kills every process in the named namespaces (`ip netns pids`), waits up to 3 s for them
/// to die, then deletes the namespaces.
fn remove_namespaces(full_names: &[String]) {
    let me = std::process::id() as i32;
    let mut victims = Vec::new();
    for ns in full_names {
        if let Ok(out) = ip(&["netns", "pids", ns]) {
            for pid in String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .filter(|p| *p != me)
            {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                victims.push(pid);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while victims.iter().any(|p| process_start_time(*p).is_some()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for ns in full_names {
        if netns::netns_path(ns).exists() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Removes labs whose creator process is gone: their namespaces (killing what runs in them),
/// their directory and their registry record. Labs of live processes are left alone.
/// Returns each swept prefix with the error that prevented full removal, if any.
pub fn sweep_stale_labs() -> Vec<(String, Option<LabError>)> {
    let mut by_prefix: HashMap<String, (i32, Vec<String>)> = HashMap::new();
    if let Ok(names) = list_netns() {
        for n in names {
            if let Some((prefix, pid)) = parse_lab_name(&n) {
                by_prefix
                    .entry(prefix)
                    .or_insert((pid, Vec::new()))
                    .1
                    .push(n);
            }
        }
    }
    let mut records: HashMap<String, LabRecord> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir(REGISTRY_DIR) {
        for e in rd.flatten() {
            if let Some(rec) = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| serde_json::from_str::<LabRecord>(&s).ok())
            {
                by_prefix
                    .entry(rec.prefix.clone())
                    .or_insert((rec.pid, Vec::new()));
                records.insert(rec.prefix.clone(), rec);
            }
        }
    }
    let mut swept = Vec::new();
    for (prefix, (pid, names)) in by_prefix {
        let alive = match (process_start_time(pid), records.get(&prefix)) {
            (None, _) => false,
            (Some(st), Some(rec)) => rec.start_time == 0 || rec.start_time == st,
            (Some(_), None) => true,
        };
        if alive {
            continue;
        }
        remove_namespaces(&names);
        let mut err = None;
        if let Some(rec) = records.get(&prefix) {
            if rec.dir.exists()
                && let Err(e) = std::fs::remove_dir_all(&rec.dir)
            {
                err = Some(io_ctx(format!("remove {}", rec.dir.display()))(e));
            }
            let _ = std::fs::remove_file(record_path(&prefix));
        }
        let left: Vec<String> = list_netns()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect();
        if !left.is_empty() {
            err = Some(LabError::Thread {
                name: "sweep".into(),
                detail: format!("namespaces still present: {}", left.join(", ")),
            });
        }
        swept.push((prefix, err));
    }
    swept
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
mod tests {
    use super::*;

    #[test]
    fn lab_names_parse() {
        assert_eq!(
            parse_lab_name("vl123x4-node-a"),
            Some(("vl123x4-".to_string(), 123))
        );
        assert_eq!(parse_lab_name("vlan-x"), None);
        assert_eq!(parse_lab_name("other"), None);
        assert_eq!(parse_lab_name("vl12x-node"), None);
    }

    #[test]
    fn node_addresses() {
        assert_eq!(node_ipv4("node-c"), Some(Ipv4Addr::new(192, 0, 2, 13)));
        assert_eq!(
            node_ipv6("node-a").map(|a| a.to_string()).as_deref(),
            Some("2001:db8::11")
        );
        assert_eq!(node_ipv4("client"), None);
        assert_eq!(member_mac("node-b").as_deref(), Some("02:00:c0:00:02:0c"));
    }

    #[test]
    fn ip_addr_json_is_parsed() {
        let json = r#"[{"ifname":"eth0","addr_info":[
          {"family":"inet","local":"192.0.2.5","prefixlen":24,"scope":"global","dynamic":true,
           "label":"eth0","valid_life_time":30,"preferred_life_time":30},
          {"family":"inet","local":"192.0.2.6","prefixlen":24,"scope":"global","secondary":true,
           "label":"eth0:vip","valid_life_time":4294967295,"preferred_life_time":4294967295},
          {"family":"inet6","local":"2001:db8::5","prefixlen":64,"scope":"global",
           "tentative":true,"valid_life_time":4294967295,"preferred_life_time":4294967295}]}]"#;
        let a = parse_ip_addr_json(json).unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].valid_lft, Some(30));
        assert!(a[0].has_flag("dynamic"));
        assert!(a[1].has_flag("secondary"));
        assert_eq!(a[1].label.as_deref(), Some("eth0:vip"));
        assert_eq!(a[1].valid_lft, None);
        assert!(a[2].has_flag("tentative"));
        assert_eq!(a[2].prefix, 64);
        assert!(parse_ip_addr_json("{").is_err());
    }
}
