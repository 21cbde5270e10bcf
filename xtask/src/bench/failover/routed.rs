//! `--routed` (issue 29): the failover bench in routing-table mode, with BGP and BFD.
//!
//! The lab is the ordinary one ([`Ctx::start`]) set up as S66 (`tests/lab_routed_vipd.rs`)
//! sets it up: the `client` namespace is the BGP router (BIRD 2, AS 65001,
//! [`router_bird_config_at`]: one session per node and family with BFD at 100 ms x 3,
//! `merge paths on` into its kernel, L4 multipath hashing) and the client at once: the probe
//! runs there, so every new connection is routed by the router's own FIB. Every node runs
//! BIRD configured by `vipd manifest bird` (table 198, protocol 248, scan 1 s, BFD 300 ms x
//! 3) and vipd in Services mode with `svc_election=true` and `vip_routingtable=true` (the
//! route fence); the Service `default/failover` has the routed VIPs [`ROUTED_VIP4`] and
//! [`ROUTED_VIP6`], on no lab segment. Each node accepts the VIPs as local (a `local` route
//! in its local table, as kube-proxy makes a node accept a LoadBalancer address) and its
//! HTTP backend answers its name, so the node the router picks answers.
//!
//! A trial ([`run_routed_trial`]) clears the Lease and waits until the router has no path,
//! starts vipd on every node, waits until the router routes both VIPs to one node alone
//! (the holder) for 500 ms, starts one `vipd probe` per family (a new TCP connection every
//! 20 ms) and waits until both answer steadily from the holder, acts on the holder
//! ([`act_routed`]), and polls the router's next hops for both VIPs (a sample every 20-30
//! ms: two `ip` runs and a 10 ms pause; [`PathWatch`]): when the old holder's path left and
//! when another node's came, and any time with two paths at once (an elected Service must
//! never have two). Then as the ARP trials: 2 s of settling (freeze: 3 s, SIGCONT, 4 s watching that the thawed node's path
//! does not come back), the probes stopped, the lab healed, vipd stopped. One
//! [`TrialResult`] per family (`vipd T routed:v4`, `:v6`), with `takeover_ms` the new
//! holder's path and `old_gone_ms` the old holder's path leaving the router.
//!
//! [`measure_spread`] is the ECMP part: new connections per node over whatever paths the
//! router has for a VIP ([`PathSource`]).

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use xtask::lab::routed::{bird_socket, birdc, router_bird_config_at, spread};
use xtask::lab::{CLIENT_V4, CLIENT_V6, LabProcess, NODES, Signal, node_ipv4, node_ipv6};

use super::PHASE_SPREAD;
use super::report::SpreadResult;
use super::scenario::{Scenario, act};
use super::trial::{TrialResult, Watch, say_setting_up, takeover_limit};
use crate::bench::harness::cluster::Cluster;
use crate::bench::harness::ctx::{Ctx, wait_stable};
use crate::bench::harness::probe::{ProbeSummary, stop_probe, wait_probe_steady};
use crate::bench::harness::subject::Subject;
use crate::bench::stats::ms;

/// The Service's IPv4 VIP: a routed address on no lab segment (as S66's).
pub const ROUTED_VIP4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 80);
/// The Service's IPv6 VIP (the same dual-stack Service).
pub const ROUTED_VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0, 0, 0, 0x80);
/// The nodes' AS (`bgp_as`); the router's is [`xtask::lab::routed::ROUTER_AS`].
pub const NODE_AS: u32 = 65000;
/// The router's namespace (also the client's).
pub const ROUTER_NS: &str = "client";
/// BGP sessions of the router: one per node and family.
const SESSIONS: usize = 2 * NODES.len();
/// How long BGP sessions may take to come up (BIRD's connect delay is 5 s).
const SESSION_LIMIT: Duration = Duration::from_secs(30);

/// Both VIPs with their tags in result labels.
pub fn routed_vips() -> [(IpAddr, &'static str); 2] {
    [
        (IpAddr::V4(ROUTED_VIP4), "v4"),
        (IpAddr::V6(ROUTED_VIP6), "v6"),
    ]
}

/// The routed set-up of a run: the router's BIRD and each node's (from `vipd manifest
/// bird`), which a `poweroff` kills and the heal starts again.
pub struct Routed {
    _router: LabProcess,
    birds: Mutex<HashMap<String, LabProcess>>,
    confs: HashMap<String, String>,
}

impl Routed {
    /// Sets the lab up for routed trials ([`Ctx::enable_routed`] with both VIPs): L4
    /// multipath hashing and BIRD in the router's namespace, BIRD on every node with the
    /// configuration `vipd manifest bird` writes from kube-vip's `bgp_*` variables (run in
    /// the node's namespace), the VIPs local on every node; returns once the router's six
    /// BGP sessions are established.
    ///
    /// # Errors
    /// When a command, BIRD or the Service fails, or the sessions do not come up in 30 s.
    pub fn start(ctx: &mut Ctx) -> Result<Routed> {
        ctx.enable_routed(&routed_vips().map(|(v, _)| v))?;
        for fam in ["ipv4", "ipv6"] {
            ctx.lab.exec(
                ROUTER_NS,
                "sysctl",
                &["-qw", &format!("net.{fam}.fib_multipath_hash_policy=1")],
            )?;
        }
        let nodes = NODES.iter().filter_map(|n| {
            let (v4, v6) = (node_ipv4(n)?, node_ipv6(n)?);
            Some((*n, v4, v6))
        });
        let router = ctx.lab.start_bird(
            ROUTER_NS,
            &router_bird_config_at(CLIENT_V4, CLIENT_V6, NODE_AS, nodes),
        )?;
        let mut confs = HashMap::new();
        let mut birds = HashMap::new();
        for n in NODES {
            let conf = manifest_bird(ctx, n)?;
            birds.insert(n.to_string(), ctx.lab.start_bird(n, &conf)?);
            confs.insert(n.to_string(), conf);
            for (vip, _) in routed_vips() {
                let (fam, len) = if vip.is_ipv4() {
                    ("-4", 32)
                } else {
                    ("-6", 128)
                };
                ctx.lab.exec(
                    n,
                    "ip",
                    &[
                        fam,
                        "route",
                        "replace",
                        "local",
                        &format!("{vip}/{len}"),
                        "dev",
                        "lo",
                        "table",
                        "local",
                    ],
                )?;
            }
        }
        let r = Routed {
            _router: router,
            birds: Mutex::new(birds),
            confs,
        };
        r.wait_sessions(ctx, SESSIONS)?;
        Ok(r)
    }

    /// Waits until `want` of the router's BGP sessions are established.
    fn wait_sessions(&self, ctx: &Ctx, want: usize) -> Result<()> {
        let sock = bird_socket(ctx.lab.dir(), ROUTER_NS);
        let t0 = Instant::now();
        loop {
            let out = birdc(&sock, &["show", "protocols"]).unwrap_or_default();
            if out.matches("Established").count() >= want {
                return Ok(());
            }
            if t0.elapsed() > SESSION_LIMIT {
                bail!("{want} BGP sessions not established after {SESSION_LIMIT:?}:\n{out}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills `node`'s BIRD (SIGKILL, as a node that loses power).
    fn kill_bird(&self, node: &str) {
        let old = self.birds.lock().ok().and_then(|mut m| m.remove(node));
        if let Some(mut p) = old {
            let _ = p.kill();
        }
    }

    /// Starts `node`'s BIRD again (after a `poweroff`), restarts the router's sessions to
    /// it (BIRD would otherwise wait its error wait time, 60 s, after the BFD failure) and
    /// waits until every session is established again.
    fn restart_bird(&self, ctx: &Ctx, node: &str) -> Result<()> {
        let conf = self
            .confs
            .get(node)
            .ok_or_else(|| anyhow!("no BIRD configuration for {node}"))?;
        let _ = std::fs::remove_file(bird_socket(ctx.lab.dir(), node));
        let p = ctx.lab.start_bird(node, conf)?;
        if let Ok(mut m) = self.birds.lock() {
            m.insert(node.to_string(), p);
        }
        let sock = bird_socket(ctx.lab.dir(), ROUTER_NS);
        let name = node.replace('-', "_");
        for fam in ["4", "6"] {
            birdc(&sock, &["restart", &format!("{name}_{fam}")])?;
        }
        self.wait_sessions(ctx, SESSIONS)
    }
}

/// `vipd manifest bird` for `node`, run in its namespace with kube-vip's variables: router
/// id its address, AS [`NODE_AS`], the router's two addresses as peers (AS 65001).
///
/// # Errors
/// When the command fails.
fn manifest_bird(ctx: &Ctx, node: &str) -> Result<String> {
    let id = node_ipv4(node).ok_or_else(|| anyhow!("no address for {node}"))?;
    let vipd = ctx.vipd.to_string_lossy().into_owned();
    let out = ctx.lab.exec(
        node,
        "env",
        &[
            format!("bgp_routerid={id}"),
            format!("bgp_as={NODE_AS}"),
            format!("bgp_peers={CLIENT_V4}:65001,[{CLIENT_V6}]:65001"),
            vipd,
            "manifest".into(),
            "bird".into(),
        ],
    )?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The node whose address on the lab segment is `hop`, or `hop` itself.
fn node_of_hop(hop: IpAddr) -> String {
    NODES
        .iter()
        .find(|n| {
            node_ipv4(n).map(IpAddr::V4) == Some(hop) || node_ipv6(n).map(IpAddr::V6) == Some(hop)
        })
        .map_or_else(|| hop.to_string(), |n| n.to_string())
}

/// The router's next hops for each of [`routed_vips`], as node names (sorted).
fn router_paths(ctx: &Ctx) -> [Vec<String>; 2] {
    routed_vips().map(|(vip, _)| {
        ctx.lab
            .next_hops(ROUTER_NS, vip)
            .into_iter()
            .map(node_of_hop)
            .collect()
    })
}

/// What the router did with one VIP after the event, sample by sample
/// ([`PathWatch::sample`]): the takeover as the ARP trials see it ([`Watch`], with paths for
/// carriers) and what must not happen.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PathWatch {
    /// The first other node's path (`new_holder`, `takeover`), the old holder's path first
    /// missing (`old_gone`), the most paths at once (`max_carriers`); times since the event.
    pub watch: Watch,
    /// Time with two or more paths at once (sum of the sample intervals that ended with
    /// several paths).
    pub two_paths: Duration,
    /// The sets of nodes seen routed together, as `node-a+node-b`.
    pub pairs: BTreeSet<String>,
    /// The old holder's path came back after it had gone.
    pub old_back: bool,
    last: Option<Duration>,
}

impl PathWatch {
    /// Takes one sample: the router's paths `hops` (node names) at `now` since the event,
    /// `old` the holder before it.
    pub fn sample(&mut self, hops: &[String], old: &str, now: Duration) {
        let dt = self.last.map_or(Duration::ZERO, |l| now.saturating_sub(l));
        self.last = Some(now);
        if hops.len() >= 2 {
            self.two_paths += dt;
            self.pairs.insert(hops.join("+"));
        }
        let w = &mut self.watch;
        w.max_carriers = w.max_carriers.max(hops.len());
        let has_old = hops.iter().any(|h| h == old);
        match w.old_gone {
            None if !has_old => w.old_gone = Some(now),
            Some(_) if has_old => self.old_back = true,
            _ => {}
        }
        if w.new_holder.is_none()
            && let Some(n) = hops.iter().find(|h| *h != old)
        {
            w.new_holder = Some(n.clone());
            w.takeover = Some(now);
        }
    }

    /// Both the old path's removal and a new path were seen.
    pub fn done(&self) -> bool {
        self.watch.old_gone.is_some() && self.watch.takeover.is_some()
    }
}

/// Samples the router's paths into `ws` (one per VIP), pausing 10 ms between samples, until
/// `stop` says so.
fn poll_paths(
    ctx: &Ctx,
    ws: &mut [PathWatch; 2],
    old: &str,
    t0: Instant,
    stop: impl Fn(&[PathWatch; 2], Duration) -> bool,
) {
    loop {
        let paths = router_paths(ctx);
        let now = t0.elapsed();
        for (w, p) in ws.iter_mut().zip(&paths) {
            w.sample(p, old, now);
        }
        if stop(ws, now) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the router routes both VIPs to one node alone, for 500 ms; that node.
fn routed_holder(ctx: &Ctx, cluster: &Cluster, limit: Duration) -> Result<String> {
    wait_stable(limit, Duration::from_millis(500), || {
        let [p4, p6] = router_paths(ctx);
        let one = match (p4.as_slice(), p6.as_slice()) {
            ([a], [b]) if a == b => Some(a.clone()),
            _ => None,
        };
        Ok((one, format!("IPv4 paths {p4:?}, IPv6 {p6:?}")))
    })
    .map_err(|e| {
        anyhow!(
            "the router did not route both VIPs to one node: {e:#}; logs:\n{}",
            cluster.log_tails(15)
        )
    })
}

/// Clears what a previous trial may have left: the Service's Lease, and any path of the
/// router (waits up to 6 s for a killed holder's IPv6 route to expire, then flushes table
/// 198 on every node and notes it).
fn prepare(ctx: &Ctx, notes: &mut Vec<String>) -> Result<()> {
    ctx.delete_lease()?;
    let t0 = Instant::now();
    while router_paths(ctx).iter().any(|p| !p.is_empty()) {
        if t0.elapsed() > Duration::from_secs(6) {
            for n in NODES {
                for fam in ["-4", "-6"] {
                    ctx.lab.exec(
                        n,
                        "ip",
                        &[fam, "route", "flush", "table", "198", "proto", "248"],
                    )?;
                }
            }
            notes.push(format!(
                "router still had paths {:?} 6 s before the trial; table 198 flushed by hand",
                router_paths(ctx)
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The event of `scenario` on `holder` in routing-table mode: as [`act`], except
/// `poweroff`, which cuts the node's link first and then kills its vipd and its BIRD (so
/// neither a route removal nor a closing BGP session reaches the router: only BFD can tell).
///
/// # Errors
/// When a signal or `ip` fails.
pub fn act_routed(
    ctx: &Ctx,
    routed: &Routed,
    cluster: &Cluster,
    scenario: Scenario,
    holder: &str,
) -> Result<()> {
    if scenario != Scenario::Poweroff {
        return act(ctx, cluster, scenario, holder);
    }
    ctx.lab.cut_link(holder)?;
    cluster.signal_all(holder, Signal::SIGKILL)?;
    routed.kill_bird(holder);
    Ok(())
}

/// Runs one routed trial of `scenario` for `subject` (see the module documentation); one
/// result per family, IPv4 first.
///
/// # Errors
/// When the trial cannot be set up (no single routed holder, a probe never answers) or the
/// lab cannot be healed; what happens after the event is reported in the results.
pub fn run_routed_trial(
    ctx: &Ctx,
    routed: &Routed,
    scenario: Scenario,
    subject: &Subject,
    trial: usize,
) -> Result<Vec<TrialResult>> {
    say_setting_up(ctx, scenario, subject, trial);
    let mut notes = Vec::new();
    prepare(ctx, &mut notes)?;
    let mut cluster = Cluster::start(ctx, subject)?;
    let holder = routed_holder(ctx, &cluster, Duration::from_secs(30))?;
    let mut probes = Vec::new();
    for (vip, _) in routed_vips() {
        probes.push(ctx.start_probe(vip)?);
    }
    for p in &probes {
        wait_probe_steady(p, &holder, 25, Duration::from_secs(10))?;
    }
    std::thread::sleep(PHASE_SPREAD.mul_f64((trial.saturating_sub(1) % 5) as f64 / 5.0));
    ctx.say(format!(
        "the router routes both VIPs to {holder}; acting: {}",
        scenario.name()
    ));
    let t0 = Instant::now();
    act_routed(ctx, routed, &cluster, scenario, &holder)?;
    let mut ws: [PathWatch; 2] = Default::default();
    let limit = takeover_limit(subject);
    poll_paths(ctx, &mut ws, &holder, t0, |ws, now| {
        ws.iter().all(PathWatch::done) || now > limit
    });
    let settle = if scenario == Scenario::Freeze {
        std::thread::sleep(Duration::from_secs(3));
        for p in cluster.pids(&holder) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Signal::SIGCONT);
        }
        Duration::from_secs(4)
    } else {
        Duration::from_secs(2)
    };
    let settle_until = t0.elapsed() + settle;
    poll_paths(ctx, &mut ws, &holder, t0, |_, now| now >= settle_until);
    let summaries: Vec<Result<ProbeSummary>> = probes.into_iter().map(stop_probe).collect();
    if scenario == Scenario::Poweroff {
        ctx.lab.restore_link(&holder)?;
        routed
            .restart_bird(ctx, &holder)
            .with_context(|| format!("restart {holder}'s BIRD"))?;
    }
    cluster.stop();
    let mut out = Vec::new();
    for ((summary, pw), (_, tag)) in summaries.into_iter().zip(&ws).zip(routed_vips()) {
        let summary = summary?;
        let w = &pw.watch;
        let mut notes = notes.clone();
        ctx.say(format!(
            "{tag}: old path gone after {:?}, {} routed after {:?}",
            w.old_gone,
            w.new_holder.as_deref().unwrap_or("nobody"),
            w.takeover
        ));
        if w.new_holder.is_none() {
            notes.push("no other node's path within the time limit".into());
        }
        if !pw.pairs.is_empty() {
            notes.push(format!(
                "two paths at once ({}) for {:.0} ms",
                pw.pairs.iter().cloned().collect::<Vec<_>>().join(", "),
                ms(pw.two_paths)
            ));
        }
        if pw.old_back {
            notes.push(format!("{holder}'s path came back"));
        }
        out.push(TrialResult {
            two_responders_ms: ms(pw.two_paths),
            two_responder_nodes: pw.pairs.iter().cloned().collect(),
            came_back: (scenario == Scenario::Freeze).then_some(pw.old_back),
            routed: true,
            ..TrialResult::of(
                scenario,
                format!("{}:{tag}", subject.label()),
                trial,
                &holder,
                w,
                &summary,
                notes,
            )
        });
    }
    Ok(out)
}

/// Where the router's paths for the ECMP measurement come from.
///
/// The hook for vipd's no-election mode (every node routes every VIP:
/// `vip_routingtable=true svc_election=false vip_leaderelection=false`, being built on
/// another branch): add a variant that starts vipd so on every node instead of the static
/// routes, and let [`measure_spread`] run it; the measurement itself
/// ([`xtask::lab::routed::spread`]) works on whatever paths the router has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathSource {
    /// The VIPs' host routes put into table 198 (protocol 248) of every node by hand, as
    /// `tests/lab_routed.rs` does (no vipd running): what the no-election mode will do.
    StaticRoutes,
}

impl PathSource {
    /// The name printed with the figures.
    pub fn name(self) -> &'static str {
        match self {
            PathSource::StaticRoutes => "static routes in table 198 on every node",
        }
    }
}

/// `ip route add|del VIP dev lo table 198 proto 248` for both VIPs on every node.
fn static_routes(ctx: &Ctx, verb: &str) -> Result<()> {
    for n in NODES {
        for (vip, _) in routed_vips() {
            let fam = if vip.is_ipv4() { "-4" } else { "-6" };
            ctx.lab.exec(
                n,
                "ip",
                &[
                    fam,
                    "route",
                    verb,
                    &vip.to_string(),
                    "dev",
                    "lo",
                    "table",
                    "198",
                    "proto",
                    "248",
                ],
            )?;
        }
    }
    Ok(())
}

/// ECMP spread: routes both VIPs from every node (`source`; no vipd may run), waits until
/// the router has a multipath route over the three nodes for each, opens `n` new
/// connections to each VIP from the client one after the other and counts them per
/// answering node; removes the routes again. One result per VIP, IPv4 first.
///
/// # Errors
/// When a command fails or the router does not get three paths within 15 s.
pub fn measure_spread(ctx: &Ctx, source: PathSource, n: usize) -> Result<Vec<SpreadResult>> {
    let _ = ctx.delete_lease();
    match source {
        PathSource::StaticRoutes => static_routes(ctx, "add")?,
    }
    let t0 = Instant::now();
    let measured = (|| {
        loop {
            let paths = router_paths(ctx);
            if paths.iter().all(|p| p.len() == NODES.len()) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(15) {
                bail!("the router's paths after 15 s: {paths:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = Vec::new();
        for ((vip, _), paths) in routed_vips().into_iter().zip(router_paths(ctx)) {
            let per_node = ctx
                .lab
                .in_netns(ROUTER_NS, || spread(SocketAddr::new(vip, 80), n))?;
            out.push(SpreadResult {
                vip,
                source: source.name().to_string(),
                paths,
                connections: n,
                per_node,
            });
        }
        Ok(out)
    })();
    match source {
        PathSource::StaticRoutes => static_routes(ctx, "del")?,
    }
    measured
}
