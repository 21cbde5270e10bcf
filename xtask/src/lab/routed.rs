//! The routed lab (issue 29): a router between the nodes' subnet and a client's, speaking
//! BGP with BFD to a routing daemon on each node, with ECMP. No control plane.
//!
//! ```text
//!   ns lan      bridge br0 (the nodes' segment); ports v-router, v-node-a, ...
//!   ns router   eth0 198.51.100.1/24 + 2001:db8:1::1/64 (nodes' side)
//!               eth1 203.0.113.1/24 + 2001:db8:2::1/64 (client's side)
//!               forwarding on, L4 multipath hashing, BIRD 2 (AS 65001): one BGP session
//!               per node and family with BFD, `merge paths on` into the kernel (ECMP)
//!   ns node-a   eth0 198.51.100.11/24 + 2001:db8:1::11/64 (node-b .12, node-c .13),
//!               default routes via the router; BIRD as the test configures it
//!   ns client   eth0 203.0.113.100/24 + 2001:db8:2::100/64, default via the router
//! ```
//!
//! Every name carries the per-run prefix of [`super::Lab`] (`vl<pid>x<n>-`) and the lab is
//! in the same registry, so a crashed run's routed lab is swept like any other. BIRD runs
//! only inside the lab's namespaces, with its configuration, control socket and pid file
//! under the lab directory; dropping the [`RoutedLab`] (also while unwinding from a
//! panic) kills every process in its namespaces and removes them.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::error::{LabError, Result, io_ctx};
use super::process::{LabProcess, find_in_path, ip, ip_binary, run};
use super::registry::{record_path, remove_namespaces, write_record};
use super::{ETH, NODES, control_plane, netns};

/// Every namespace of a routed lab, in creation order.
pub const ROUTED_NAMESPACES: [&str; 6] = ["lan", "router", "node-a", "node-b", "node-c", "client"];
/// The router's AS.
pub const ROUTER_AS: u32 = 65001;
/// The router's address on the nodes' subnet (198.51.100.0/24).
pub const ROUTER_NODE_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The router's IPv6 address on the nodes' subnet (2001:db8:1::/64).
pub const ROUTER_NODE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
/// The router's address on the client's subnet (203.0.113.0/24).
pub const ROUTER_CLIENT_V4: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The router's IPv6 address on the client's subnet (2001:db8:2::/64).
pub const ROUTER_CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
/// The client's address.
pub const ROUTED_CLIENT_V4: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 100);
/// The client's IPv6 address.
pub const ROUTED_CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x100);
/// The client side of the router: its interface in `router`.
pub const ROUTER_CLIENT_IF: &str = "eth1";
/// BFD intervals of the router, ms (receive and transmit), and its multiplier.
pub const ROUTER_BFD: (u32, u32) = (100, 3);

/// Address of node `node` on the nodes' subnet (`node-a` is 198.51.100.11, ...).
pub fn routed_node_v4(node: &str) -> Option<Ipv4Addr> {
    NODES
        .iter()
        .position(|n| *n == node)
        .map(|i| Ipv4Addr::new(198, 51, 100, 11 + i as u8))
}

/// IPv6 address of node `node` (`node-a` is 2001:db8:1::11, ...).
pub fn routed_node_v6(node: &str) -> Option<Ipv6Addr> {
    NODES
        .iter()
        .position(|n| *n == node)
        .map(|i| Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x11 + i as u16))
}

/// The router's BIRD 2 configuration in the routed lab: [`router_bird_config_at`] with the
/// router's addresses on the nodes' subnet ([`ROUTER_NODE_V4`], [`ROUTER_NODE_V6`]) and the
/// nodes' ([`routed_node_v4`], [`routed_node_v6`]).
pub fn router_bird_config(node_as: u32) -> String {
    let nodes = NODES
        .iter()
        .filter_map(|n| Some((*n, routed_node_v4(n)?, routed_node_v6(n)?)));
    router_bird_config_at(ROUTER_NODE_V4, ROUTER_NODE_V6, node_as, nodes)
}

/// A BGP router's BIRD 2 configuration (router id and local addresses `local_v4` and
/// `local_v6`, AS [`ROUTER_AS`], BFD on [`ETH`]): one BGP session per node and family to
/// the nodes' AS `node_as`, each node given as (name, IPv4, IPv6); BFD on every session at
/// [`ROUTER_BFD`]; imports everything the nodes announce, exports nothing, and installs
/// equal routes of several nodes as one multipath route (`merge paths on`). Used by the
/// routed lab ([`router_bird_config`]) and by the ordinary lab's `client` namespace acting
/// as the router (S66, `bench failover --routed`).
pub fn router_bird_config_at<'a>(
    local_v4: Ipv4Addr,
    local_v6: Ipv6Addr,
    node_as: u32,
    nodes: impl IntoIterator<Item = (&'a str, Ipv4Addr, Ipv6Addr)>,
) -> String {
    let (ms, mult) = ROUTER_BFD;
    let mut s = format!(
        "router id {local_v4};\n\
         protocol device {{\n}}\n\
         protocol kernel kernel4 {{\n\tmerge paths on;\n\tipv4 {{ import none; export all; }};\n}}\n\
         protocol kernel kernel6 {{\n\tmerge paths on;\n\tipv6 {{ import none; export all; }};\n}}\n\
         protocol bfd bfd1 {{\n\tinterface \"{ETH}\" {{ min rx interval {ms} ms; min tx interval {ms} ms; multiplier {mult}; }};\n}}\n\
         template bgp node4 {{\n\tlocal {local_v4} as {ROUTER_AS};\n\tbfd on;\n\tipv4 {{ import all; export none; }};\n}}\n\
         template bgp node6 {{\n\tlocal {local_v6} as {ROUTER_AS};\n\tbfd on;\n\tipv6 {{ import all; export none; }};\n}}\n"
    );
    for (node, v4, v6) in nodes {
        let name = node.replace('-', "_");
        s.push_str(&format!(
            "protocol bgp {name}_4 from node4 {{ neighbor {v4} as {node_as}; }}\n\
             protocol bgp {name}_6 from node6 {{ neighbor {v6} as {node_as}; }}\n"
        ));
    }
    s
}

/// A running routed lab. See the [module documentation](self).
#[derive(Debug)]
pub struct RoutedLab {
    prefix: String,
    dir: PathBuf,
    created: Vec<String>,
    birds: Mutex<HashMap<String, LabProcess>>,
    keep: bool,
}

impl RoutedLab {
    /// Builds the topology and starts the router's BIRD (its sessions come up once the
    /// nodes' daemons run: [`RoutedLab::start_bird`]). Takes well under a second.
    ///
    /// # Errors
    /// [`LabError::NotRoot`] when not root; [`LabError::Command`] when BIRD 2 is not
    /// installed, or `ip` or BIRD's configuration check fails. Whatever was built is torn
    /// down before the error is returned.
    pub fn start(node_as: u32) -> Result<RoutedLab> {
        let uid = nix::unistd::geteuid().as_raw();
        if uid != 0 {
            return Err(LabError::NotRoot { uid });
        }
        control_plane::ensure_packages(&[("ip", "iproute2")])?;
        // Not installed from here: Debian's bird2 ships a service, and an install must not
        // start a BIRD in the root namespace (.ci/run installs it with services held back).
        if !bird_binary("bird").is_file() {
            return Err(LabError::Command {
                command: "bird".into(),
                status: "not found".into(),
                stderr: "the routed lab needs BIRD 2: install Debian's bird2 as .ci/run does \
                         (with services held back by policy-rc.d)"
                    .into(),
            });
        }
        let (prefix, dir) = super::new_lab(&["logs", "bird"])?;
        let mut lab = RoutedLab {
            prefix,
            dir,
            created: Vec::new(),
            birds: Mutex::new(HashMap::new()),
            keep: std::env::var("VIPD_LAB_KEEP").is_ok_and(|v| v == "1"),
        };
        write_record(&lab.prefix, &lab.dir)?;
        lab.build()?;
        lab.start_bird("router", &router_bird_config(node_as))?;
        Ok(lab)
    }

    /// The per-run name prefix, e.g. `vl4242x0-`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The lab directory (logs/, bird/). Removed on drop unless `VIPD_LAB_KEEP=1`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Full `ip netns` name of lab namespace `ns` (one of [`ROUTED_NAMESPACES`]).
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] for other names.
    pub fn ns_name(&self, ns: &str) -> Result<String> {
        if ROUTED_NAMESPACES.contains(&ns) {
            Ok(format!("{}{ns}", self.prefix))
        } else {
            Err(LabError::UnknownNamespace {
                name: ns.to_string(),
                expected: ROUTED_NAMESPACES.join(", "),
            })
        }
    }

    /// Path of the bind mount of lab namespace `ns`.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`].
    pub fn netns_path(&self, ns: &str) -> Result<PathBuf> {
        Ok(netns::netns_path(&self.ns_name(ns)?))
    }

    fn build(&mut self) -> Result<()> {
        for ns in ROUTED_NAMESPACES {
            let full = format!("{}{ns}", self.prefix);
            ip(&["netns", "add", &full])?;
            self.created.push(ns.to_string());
        }
        let mut settings: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
        for ns in ROUTED_NAMESPACES {
            let mut v = vec![
                ("net/ipv6/conf/default/router_solicitations", "0"),
                ("net/ipv6/conf/all/router_solicitations", "0"),
                // Addresses usable at once.
                ("net/ipv6/conf/default/accept_dad", "0"),
                ("net/ipv6/conf/default/accept_ra", "0"),
            ];
            match ns {
                "lan" => {
                    v.push(("net/ipv6/conf/all/disable_ipv6", "1"));
                    v.push(("net/ipv6/conf/default/disable_ipv6", "1"));
                }
                "router" => {
                    v.push(("net/ipv4/ip_forward", "1"));
                    v.push(("net/ipv6/conf/all/forwarding", "1"));
                    // L4 hashing: new connections from one client spread over the paths.
                    v.push(("net/ipv4/fib_multipath_hash_policy", "1"));
                    v.push(("net/ipv6/fib_multipath_hash_policy", "1"));
                }
                _ => {}
            }
            settings.insert(ns, v);
        }
        for ns in ROUTED_NAMESPACES {
            let path = self.netns_path(ns)?;
            let list = settings.remove(ns).unwrap_or_default();
            netns::run_in_netns(&path, || -> Result<()> {
                for (k, v) in &list {
                    let p = Path::new("/proc/sys").join(k);
                    std::fs::write(&p, v)
                        .map_err(io_ctx(format!("write {} in {ns}", p.display())))?;
                }
                Ok(())
            })??;
            ip(&["-n", &self.ns_name(ns)?, "link", "set", "lo", "up"])?;
        }
        let lan = self.ns_name("lan")?;
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
        // The nodes' segment: the router's eth0 and every node's.
        let mut members: Vec<(&str, IpAddr, IpAddr)> = vec![(
            "router",
            IpAddr::V4(ROUTER_NODE_V4),
            IpAddr::V6(ROUTER_NODE_V6),
        )];
        for node in NODES {
            if let (Some(v4), Some(v6)) = (routed_node_v4(node), routed_node_v6(node)) {
                members.push((node, IpAddr::V4(v4), IpAddr::V6(v6)));
            }
        }
        for (ns, v4, v6) in members {
            let full = self.ns_name(ns)?;
            let port = format!("v-{ns}");
            ip(&[
                "-n", &lan, "link", "add", &port, "type", "veth", "peer", "name", ETH, "netns",
                &full,
            ])?;
            ip(&["-n", &lan, "link", "set", &port, "master", "br0", "up"])?;
            self.address(ns, ETH, v4, 24, v6, 64)?;
            if ns != "router" {
                self.default_routes(ns, ETH, ROUTER_NODE_V4, ROUTER_NODE_V6)?;
            }
        }
        // The client's link: a veth straight to the router.
        let router = self.ns_name("router")?;
        let client = self.ns_name("client")?;
        ip(&[
            "-n",
            &router,
            "link",
            "add",
            ROUTER_CLIENT_IF,
            "type",
            "veth",
            "peer",
            "name",
            ETH,
            "netns",
            &client,
        ])?;
        self.address(
            "router",
            ROUTER_CLIENT_IF,
            IpAddr::V4(ROUTER_CLIENT_V4),
            24,
            IpAddr::V6(ROUTER_CLIENT_V6),
            64,
        )?;
        self.address(
            "client",
            ETH,
            IpAddr::V4(ROUTED_CLIENT_V4),
            24,
            IpAddr::V6(ROUTED_CLIENT_V6),
            64,
        )?;
        self.default_routes("client", ETH, ROUTER_CLIENT_V4, ROUTER_CLIENT_V6)?;
        Ok(())
    }

    fn address(
        &self,
        ns: &str,
        ifname: &str,
        v4: IpAddr,
        p4: u8,
        v6: IpAddr,
        p6: u8,
    ) -> Result<()> {
        let full = self.ns_name(ns)?;
        ip(&["-n", &full, "link", "set", ifname, "up"])?;
        ip(&[
            "-n",
            &full,
            "addr",
            "add",
            &format!("{v4}/{p4}"),
            "dev",
            ifname,
        ])?;
        ip(&[
            "-n",
            &full,
            "addr",
            "add",
            &format!("{v6}/{p6}"),
            "dev",
            ifname,
            "nodad",
        ])?;
        Ok(())
    }

    fn default_routes(&self, ns: &str, ifname: &str, v4: Ipv4Addr, v6: Ipv6Addr) -> Result<()> {
        let full = self.ns_name(ns)?;
        ip(&[
            "-n",
            &full,
            "route",
            "add",
            "default",
            "via",
            &v4.to_string(),
            "dev",
            ifname,
        ])?;
        ip(&[
            "-n",
            &full,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &v6.to_string(),
            "dev",
            ifname,
        ])?;
        Ok(())
    }

    /// BIRD's control socket of namespace `ns`.
    pub fn bird_socket(&self, ns: &str) -> PathBuf {
        bird_socket(&self.dir, ns)
    }

    /// Writes `config` to `<dir>/bird/<ns>.conf`, checks it (`bird -p`), and starts BIRD in
    /// namespace `ns` with it (`bird -d`: foreground, log to its log file; control socket
    /// [`RoutedLab::bird_socket`], pid file beside it), replacing a BIRD already running
    /// there. Returns once the control socket answers.
    ///
    /// # Errors
    /// [`LabError::Command`] when BIRD refuses the configuration, [`LabError::Timeout`] when
    /// its socket does not answer within 5 s.
    pub fn start_bird(&self, ns: &str, config: &str) -> Result<()> {
        let full = self.ns_name(ns)?;
        self.stop_bird(ns);
        let proc = spawn_bird(&self.dir, &full, ns, config)?;
        if let Ok(mut m) = self.birds.lock() {
            m.insert(ns.to_string(), proc);
        }
        Ok(())
    }

    /// Kills namespace `ns`'s BIRD (SIGKILL: as a node that dies), if one runs.
    pub fn stop_bird(&self, ns: &str) {
        let old = self.birds.lock().ok().and_then(|mut m| m.remove(ns));
        if let Some(mut p) = old {
            let _ = p.kill();
        }
    }

    /// What namespace `ns`'s BIRD logged.
    pub fn bird_log(&self, ns: &str) -> String {
        bird_log(&self.dir, ns)
    }

    /// `birdc -s <socket> args...` for namespace `ns`'s BIRD; its output.
    ///
    /// # Errors
    /// [`LabError::Command`] when birdc fails (no BIRD, or the command is refused).
    pub fn birdc(&self, ns: &str, args: &[&str]) -> Result<String> {
        birdc(&self.bird_socket(ns), args)
    }

    /// The next hops of namespace `ns`'s route to `dst` ([`next_hops`]).
    pub fn next_hops(&self, ns: &str, dst: IpAddr) -> Vec<IpAddr> {
        self.ns_name(ns)
            .map(|full| next_hops(&full, dst))
            .unwrap_or_default()
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
        let mut all: Vec<&OsStr> = vec![
            OsStr::new("netns"),
            OsStr::new("exec"),
            OsStr::new(&full),
            program.as_ref(),
        ];
        all.extend(args.iter().map(AsRef::as_ref));
        run(ip_binary(), &all)
    }

    /// `ip args...` inside `ns` (`ip -n`); its standard output.
    ///
    /// # Errors
    /// [`LabError::Command`] on a non-zero exit.
    pub fn ip(&self, ns: &str, args: &[&str]) -> Result<String> {
        let full = self.ns_name(ns)?;
        let mut all = vec!["-n", full.as_str()];
        all.extend_from_slice(args);
        let out = ip(&all)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `f` on a thread inside namespace `ns` and returns its result.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`], or [`LabError::Io`] if it cannot be entered.
    pub fn in_netns<T: Send>(&self, ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
        netns::run_in_netns(&self.netns_path(ns)?, f)
    }

    fn teardown(&mut self) {
        if let Ok(mut m) = self.birds.lock() {
            for (_, mut p) in m.drain() {
                let _ = p.kill();
            }
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
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        let _ = std::fs::remove_file(record_path(&self.prefix));
    }
}

impl Drop for RoutedLab {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// `bird` / `birdc`: PATH, else /usr/sbin (Debian's bird2 puts them there).
pub fn bird_binary(name: &str) -> PathBuf {
    find_in_path(name)
        .or_else(|| {
            ["/usr/sbin", "/sbin", "/usr/bin"]
                .iter()
                .map(|d| Path::new(d).join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(name))
}

/// BIRD's control socket of lab namespace `ns` in the lab directory `dir`
/// (`<dir>/bird/<ns>.ctl`).
pub fn bird_socket(dir: &Path, ns: &str) -> PathBuf {
    dir.join("bird").join(format!("{ns}.ctl"))
}

/// What the BIRD of lab namespace `ns` in lab directory `dir` logged (`<dir>/logs/bird-<ns>.log`).
pub fn bird_log(dir: &Path, ns: &str) -> String {
    std::fs::read_to_string(dir.join("logs").join(format!("bird-{ns}.log"))).unwrap_or_default()
}

/// `birdc -s sock args...`; its output.
///
/// # Errors
/// [`LabError::Command`] when birdc fails (no BIRD on that socket, or the command is refused).
pub fn birdc(sock: &Path, args: &[&str]) -> Result<String> {
    let mut all: Vec<&OsStr> = vec![OsStr::new("-s"), sock.as_os_str()];
    all.extend(args.iter().map(OsStr::new));
    let out = run(bird_binary("birdc"), &all)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes `config` to `<dir>/bird/<ns>.conf`, checks it (`bird -p`), and starts BIRD in the
/// namespace named `full_ns` (lab namespace `ns` of the lab whose directory is `dir`) with
/// it: `bird -d` (foreground), control socket [`bird_socket`], pid file beside it, output to
/// `<dir>/logs/bird-<ns>.log`. Returns the process once the control socket answers. The
/// routed lab ([`RoutedLab::start_bird`]) and the ordinary lab ([`Lab::start_bird`]) start
/// their BIRDs with it.
///
/// # Errors
/// [`LabError::Io`] when the files cannot be written, [`LabError::Command`] when BIRD
/// refuses the configuration, [`LabError::Timeout`] when its socket does not answer within
/// 5 s.
pub fn spawn_bird(dir: &Path, full_ns: &str, ns: &str, config: &str) -> Result<LabProcess> {
    let bird_dir = dir.join("bird");
    std::fs::create_dir_all(&bird_dir).map_err(io_ctx(format!("create {}", bird_dir.display())))?;
    let conf = bird_dir.join(format!("{ns}.conf"));
    std::fs::write(&conf, config).map_err(io_ctx(format!("write {}", conf.display())))?;
    let bird = bird_binary("bird");
    run(
        &bird,
        &[OsStr::new("-p"), OsStr::new("-c"), conf.as_os_str()],
    )?;
    let sock = bird_socket(dir, ns);
    let pid = bird_dir.join(format!("{ns}.pid"));
    let log = dir.join("logs").join(format!("bird-{ns}.log"));
    let args: Vec<&OsStr> = vec![
        OsStr::new("-d"),
        OsStr::new("-c"),
        conf.as_os_str(),
        OsStr::new("-s"),
        sock.as_os_str(),
        OsStr::new("-P"),
        pid.as_os_str(),
    ];
    let proc = LabProcess::spawn(full_ns, "bird", bird.as_os_str(), &args, &[], &log)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if birdc(&sock, &["show", "status"]).is_ok() {
            return Ok(proc);
        }
        if Instant::now() >= deadline {
            return Err(LabError::Timeout {
                what: format!("BIRD's control socket in {ns}: {}", bird_log(dir, ns)),
                seconds: 5.0,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The gateways of the route to `dst` in the main table of the namespace named `full_ns`
/// (`ip -j route show exact`): one for a single path, several (sorted) for a multipath
/// route, none when there is no route or `ip` fails.
pub fn next_hops(full_ns: &str, dst: IpAddr) -> Vec<IpAddr> {
    let fam = if dst.is_ipv4() { "-4" } else { "-6" };
    let out = ip(&[
        "-n",
        full_ns,
        fam,
        "-j",
        "route",
        "show",
        "exact",
        &dst.to_string(),
    ])
    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    .unwrap_or_default();
    gateways_of(&out)
}

/// The gateways in `ip -j route` output (sorted; multipath routes give one per next hop).
pub fn gateways_of(json: &str) -> Vec<IpAddr> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mut gws = Vec::new();
    for r in v.as_array().cloned().unwrap_or_default() {
        if let Some(hops) = r["nexthops"].as_array() {
            gws.extend(
                hops.iter()
                    .filter_map(|h| h["gateway"].as_str()?.parse::<IpAddr>().ok()),
            );
        } else if let Some(g) = r["gateway"].as_str().and_then(|g| g.parse().ok()) {
            gws.push(g);
        }
    }
    gws.sort();
    gws
}

/// One new TCP connection to `dst` with an HTTP/1.0 `GET /` (2 s timeouts); the last line
/// of the answer (the lab's HTTP backends answer their node name), `None` when it failed.
/// Call it inside the client's namespace.
pub fn ask_backend(dst: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.lines().last().map(|l| l.trim().to_string())
}

/// ECMP spread: `n` new connections to `dst` one after the other ([`ask_backend`]), counted
/// per answering node (`"-"`: no answer). Works on whatever paths the router has; call it
/// inside the client's namespace (e.g. [`RoutedLab::in_netns`], `Lab::in_netns`).
pub fn spread(dst: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for _ in 0..n {
        *m.entry(ask_backend(dst).unwrap_or_else(|| "-".into()))
            .or_insert(0) += 1;
    }
    m
}

impl super::Lab {
    /// Starts BIRD in lab namespace `ns` with `config` ([`spawn_bird`]; files under the
    /// lab directory's bird/); the caller owns the process (dropping it kills BIRD).
    ///
    /// # Errors
    /// As [`spawn_bird`].
    pub fn start_bird(&self, ns: &str, config: &str) -> Result<LabProcess> {
        spawn_bird(self.dir(), &self.ns_name(ns)?, ns, config)
    }

    /// The next hops of namespace `ns`'s route to `dst` ([`next_hops`]).
    pub fn next_hops(&self, ns: &str, dst: IpAddr) -> Vec<IpAddr> {
        self.ns_name(ns)
            .map(|full| next_hops(&full, dst))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways_of_reads_single_and_multipath_routes() {
        let single = r#"[{"dst":"198.51.100.80","gateway":"192.0.2.12","dev":"eth0","flags":[]}]"#;
        assert_eq!(
            gateways_of(single),
            ["192.0.2.12".parse::<IpAddr>().unwrap()]
        );
        let multi = r#"[{"dst":"2001:db8:5::80","protocol":"bird","nexthops":[
            {"gateway":"2001:db8::13","dev":"eth0"},{"gateway":"2001:db8::11","dev":"eth0"}]}]"#;
        let want: Vec<IpAddr> = ["2001:db8::11", "2001:db8::13"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(gateways_of(multi), want, "sorted, one per next hop");
        assert!(gateways_of("[]").is_empty());
        assert!(gateways_of("").is_empty(), "ip failed: no route");
    }

    /// docs/operators.md quotes the lab router's configuration as the router's side of
    /// routing-table mode: it stays what the lab runs.
    #[test]
    fn the_router_configuration_in_the_operators_guide_is_the_labs() {
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operators.md"),
        )
        .unwrap();
        let start = docs
            .find("router id 198.51.100.1;\n")
            .expect("quoted in the guide");
        let end = start + docs[start..].find("```").expect("end of the block");
        let want = router_bird_config_at(
            Ipv4Addr::new(198, 51, 100, 1),
            "2001:db8:1::1".parse().unwrap(),
            65000,
            [(
                "node-a",
                Ipv4Addr::new(198, 51, 100, 11),
                "2001:db8:1::11".parse().unwrap(),
            )],
        );
        assert_eq!(&docs[start..end], want);
    }

    #[test]
    fn router_configuration_peers_every_node_in_both_families_with_bfd() {
        let v4 = Ipv4Addr::new(192, 0, 2, 100);
        let v6: Ipv6Addr = "2001:db8::100".parse().unwrap();
        let nodes = [(
            "node-a",
            Ipv4Addr::new(192, 0, 2, 11),
            "2001:db8::11".parse().unwrap(),
        )];
        let c = router_bird_config_at(v4, v6, 65000, nodes);
        assert!(c.starts_with("router id 192.0.2.100;\n"), "{c}");
        for want in [
            "local 192.0.2.100 as 65001;",
            "local 2001:db8::100 as 65001;",
            "protocol bgp node_a_4 from node4 { neighbor 192.0.2.11 as 65000; }",
            "protocol bgp node_a_6 from node6 { neighbor 2001:db8::11 as 65000; }",
        ] {
            assert!(c.contains(want), "{want} missing from\n{c}");
        }
        assert_eq!(c.matches("merge paths on;").count(), 2, "{c}");
        assert!(c.contains("min rx interval 100 ms; min tx interval 100 ms; multiplier 3;"));
        // The routed lab's router: its own addresses, three nodes.
        let lab = router_bird_config(65000);
        assert!(lab.contains(&format!("router id {ROUTER_NODE_V4};")));
        assert_eq!(lab.matches("protocol bgp ").count(), 2 * NODES.len());
    }
}
