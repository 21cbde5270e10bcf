//! [`Cluster`]: one instance of a [`Subject`] per lab node (vipd or keepalived), started,
//! signalled and stopped; the start of a trial (a clean lab, then a stable holder the client
//! reaches).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use xtask::lab::{self, LabProcess, NODES, Signal};

use super::ctx::Ctx;
use super::procfs::children_of;
use super::subject::{Subject, Timings, Vrrp, keepalived_conf};
use super::text::tail;
use super::{KEEPALIVED, VIP};

/// One instance per node of a [`Subject`].
pub struct Cluster {
    procs: Vec<(String, LabProcess)>,
}

impl Cluster {
    /// No instance yet (add them with [`Cluster::add`]).
    pub fn empty() -> Cluster {
        Cluster { procs: Vec::new() }
    }

    /// Starts one instance on every node.
    ///
    /// # Errors
    /// When a process cannot be spawned or a config file written.
    pub fn start(ctx: &Ctx, subject: &Subject) -> Result<Cluster> {
        let mut c = Cluster::empty();
        for n in NODES {
            c.add(ctx, subject, n)?;
        }
        Ok(c)
    }

    /// Starts an instance on `node` too.
    ///
    /// # Errors
    /// When the process cannot be spawned or a config file written.
    pub fn add(&mut self, ctx: &Ctx, subject: &Subject, node: &str) -> Result<()> {
        let p = match subject {
            Subject::Vipd(t) => start_vipd(ctx, node, t)?,
            Subject::Keepalived(v) => start_keepalived(ctx, node, *v)?,
        };
        self.procs.push((node.to_string(), p));
        Ok(())
    }

    /// The process started on `node`.
    pub fn process(&self, node: &str) -> Option<&LabProcess> {
        self.procs.iter().find(|(n, _)| n == node).map(|(_, p)| p)
    }

    fn process_mut(&mut self, node: &str) -> Option<&mut LabProcess> {
        self.procs
            .iter_mut()
            .find(|(n, _)| n == node)
            .map(|(_, p)| p)
    }

    /// Pids of `node`'s instance: the process and (keepalived) its descendants.
    pub fn pids(&self, node: &str) -> Vec<i32> {
        let Some(p) = self.process(node) else {
            return Vec::new();
        };
        let mut all = vec![p.pid()];
        let mut i = 0;
        while i < all.len() {
            all.extend(children_of(all[i]));
            i += 1;
        }
        all
    }

    /// Sends `sig` to `node`'s main process only.
    ///
    /// # Errors
    /// When kill(2) fails.
    pub fn signal_main(&self, node: &str, sig: Signal) -> Result<()> {
        let p = self
            .process(node)
            .ok_or_else(|| anyhow!("no instance on {node}"))?;
        Ok(p.signal(sig)?)
    }

    /// Sends `sig` to every process of `node`'s instance. For SIGKILL the processes are
    /// first stopped (SIGSTOP) so that none can react to another's death in between (a
    /// keepalived parent respawning its VRRP child).
    ///
    /// # Errors
    /// When no process could be signalled.
    pub fn signal_all(&self, node: &str, sig: Signal) -> Result<()> {
        let pids = self.pids(node);
        if sig == Signal::SIGKILL && pids.len() > 1 {
            for p in &pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), Signal::SIGSTOP);
            }
        }
        let mut ok = false;
        for p in &pids {
            ok |= nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), sig).is_ok();
        }
        if !ok {
            bail!("could not send {sig} to {node}'s processes {pids:?}");
        }
        Ok(())
    }

    /// Stops every instance: SIGCONT, SIGTERM, up to 3 s grace, then SIGKILL for the
    /// process and its descendants.
    pub fn stop(&mut self) {
        let nodes: Vec<String> = self.procs.iter().map(|(n, _)| n.clone()).collect();
        let mut descendants = Vec::new();
        for n in &nodes {
            let pids = self.pids(n);
            for p in &pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), Signal::SIGCONT);
            }
            descendants.extend(pids.into_iter().skip(1));
            if let Some(p) = self.process(n) {
                let _ = p.signal(Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for n in &nodes {
            if let Some(p) = self.process_mut(n) {
                let left = deadline.saturating_duration_since(Instant::now());
                if !matches!(p.wait_timeout(left), Ok(Some(_))) {
                    let _ = p.kill();
                }
            }
        }
        // keepalived children are reparented when the parent dies; make sure they are gone.
        for p in descendants {
            if Path::new(&format!("/proc/{p}")).exists() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Signal::SIGKILL);
            }
        }
    }

    /// Log of `node`'s instance.
    pub fn log(&self, node: &str) -> String {
        self.process(node).map(LabProcess::log).unwrap_or_default()
    }

    /// The last `lines` lines of every node's log, each under `--- NODE`.
    pub fn log_tails(&self, lines: usize) -> String {
        NODES
            .iter()
            .map(|n| format!("--- {n}\n{}", tail(&self.log(n), lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `vipd manager` in control-plane mode on `node` with kube-vip environment
/// variables (as tests/support/mod.rs does), the timings `t` (nothing set for `default`),
/// the default ARP rate and the metrics server left at its default; after
/// [`Ctx::enable_service`] in Services mode with per-Service leases (timings as `svc_*`,
/// `svc_ridethrough` as asked); after [`Ctx::enable_cp_and_service`] in control-plane mode
/// and Services mode with the global Services Lease (`svc_election=false`) and the
/// timings as both `vip_*` and `svc_*` (kube-vip has no `svc_*` timings: its Services use
/// `vip_*`, as vipd's do when `svc_*` are unset).
///
/// # Errors
/// When it cannot be spawned.
pub fn start_vipd(ctx: &Ctx, node: &str, t: &Timings) -> Result<LabProcess> {
    let kubeconfig = ctx.lab.kubeconfig(node)?.to_string_lossy().into_owned();
    if let Some(ride) = ctx.service {
        let mut env: Vec<(&str, &str)> = vec![
            ("vip_arp", "true"),
            ("cp_enable", "false"),
            ("svc_enable", "true"),
            ("svc_election", "true"),
            ("address", ""),
            ("vip_interface", lab::ETH),
            ("vip_nodename", node),
            ("k8s_config_file", &kubeconfig),
            ("vip_loglevel", "info"),
            ("svc_ridethrough", if ride { "true" } else { "false" }),
        ];
        env.extend(lease_env(SVC_TIMING_ENV, t));
        if t.nft_fence {
            env.push(("vip_nftfence", "true"));
        }
        if ctx.routed {
            env.retain(|(k, _)| *k != "vip_arp");
            env.extend(ROUTED_ENV);
        }
        return Ok(ctx.lab.spawn(node, &ctx.vipd, &["manager"], &env)?);
    }
    let vip = VIP.to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("vip_arp", "true"),
        ("cp_enable", "true"),
        ("vip_leaderelection", "true"),
        ("address", &vip),
        ("vip_interface", lab::ETH),
        ("vip_nodename", node),
        ("k8s_config_file", &kubeconfig),
        ("vip_loglevel", "info"),
    ];
    env.extend(lease_env(VIP_TIMING_ENV, t));
    if t.nft_fence {
        env.push(("vip_nftfence", "true"));
    }
    if ctx.lb {
        env.push(("lb_enable", "true"));
    }
    if ctx.cp_and_service {
        env.extend([("svc_enable", "true"), ("svc_election", "false")]);
        env.extend(lease_env(SVC_TIMING_ENV, t));
    }
    Ok(ctx.lab.spawn(node, &ctx.vipd, &["manager"], &env)?)
}

/// The routing-table mode of `--routed` ([`Ctx::enable_routed`]), on top of the Services
/// mode: the Service lease holder puts the VIPs' host routes into table 198 (protocol 248)
/// for the node's BIRD to announce, binds no address and sends no ARP; IPv6 routes on eth0.
const ROUTED_ENV: [(&str, &str); 3] = [
    ("vip_routingtable", "true"),
    ("vip_arp", "false"),
    ("vip_servicesinterface", lab::ETH),
];

/// vipd's (and kube-vip's) control-plane lease timing variables: duration, renew deadline,
/// retry period.
const VIP_TIMING_ENV: [&str; 3] = ["vip_leaseduration", "vip_renewdeadline", "vip_retryperiod"];
/// vipd's Service lease timing variables (vipd only; unset they take the `vip_*` values).
const SVC_TIMING_ENV: [&str; 3] = ["svc_leaseduration", "svc_renewdeadline", "svc_retryperiod"];

/// `keys` paired with the values of `t` (nothing for `default`).
fn lease_env<'a>(keys: [&'static str; 3], t: &'a Timings) -> Vec<(&'static str, &'a str)> {
    t.values
        .iter()
        .flat_map(|v| keys.into_iter().zip(v.iter().map(String::as_str)))
        .collect()
}

/// Starts `keepalived -n -l -D -P -f CONF -p PID -r VRRP_PID` on `node` (foreground, VRRP
/// only, per-node pid files under the lab directory) with [`keepalived_conf`]`(node, vrrp)`.
///
/// # Errors
/// When the config cannot be written or the process spawned.
pub fn start_keepalived(ctx: &Ctx, node: &str, vrrp: Vrrp) -> Result<LabProcess> {
    let dir = ctx.lab.dir().join("keepalived");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let conf = dir.join(format!("{node}.conf"));
    std::fs::write(&conf, keepalived_conf(node, vrrp))
        .with_context(|| format!("write {}", conf.display()))?;
    let s = |p: PathBuf| p.to_string_lossy().into_owned();
    let args = [
        "-n".to_string(),
        "-l".into(),
        "-D".into(),
        "-P".into(),
        "-f".into(),
        s(conf),
        "-p".into(),
        s(dir.join(format!("{node}.pid"))),
        "-r".into(),
        s(dir.join(format!("{node}-vrrp.pid"))),
    ];
    Ok(ctx.lab.spawn(node, KEEPALIVED, &args, &[])?)
}

/// Clears what a previous trial may have left (the vipd leases, the VIPs, a killed vipd's
/// fence tables).
pub fn prepare_trial(ctx: &Ctx, subject: &Subject, notes: &mut Vec<String>) -> Result<()> {
    if matches!(subject, Subject::Vipd(_)) {
        ctx.delete_lease()?;
    }
    // A vipd killed under the nftables fence leaves its tables (a restarted vipd replaces
    // them); they would keep dropping the VIP's ARP and traffic for the next subject.
    for n in NODES {
        for family in ["arp", "inet"] {
            let _ = ctx
                .lab
                .exec_unchecked(n, "nft", &["delete", "table", family, "vipd_fence"]);
        }
    }
    let leftovers = ctx.clear_vip(Duration::from_secs(6))?;
    if !leftovers.is_empty() {
        notes.push(format!(
            "VIP left on {} before the trial, removed by hand",
            leftovers.join(",")
        ));
    }
    Ok(())
}

/// Clears what a previous trial may have left ([`prepare_trial`]) and starts the subject on
/// every node.
pub(crate) fn start_trial_cluster(
    ctx: &Ctx,
    subject: &Subject,
    notes: &mut Vec<String>,
) -> Result<Cluster> {
    prepare_trial(ctx, subject, notes)?;
    Cluster::start(ctx, subject)
}

/// Waits for a stable holder of every VIP of the run and until the client reaches it
/// through each of them; returns it.
pub(crate) fn reachable_holder(ctx: &Ctx, subject: &Subject, cluster: &Cluster) -> Result<String> {
    // keepalived: longer than its master-down interval (3 x advert_int + skew: 3.6 s, 4.5 s
    // stable; keepalived-fast 0.36 s, 1.26 s stable).
    let stable_for = match subject {
        Subject::Vipd(_) => Duration::from_millis(500),
        Subject::Keepalived(v) => v.master_down() + Duration::from_millis(900),
    };
    let holder = ctx
        .stable_holder(Duration::from_secs(30), stable_for)
        .map_err(|e| anyhow!("{e:#}; logs:\n{}", cluster.log_tails(15)))?;
    for (vip, _) in ctx.vips() {
        let vip80 = SocketAddr::new(IpAddr::V4(vip), 80);
        let t_http = Instant::now();
        loop {
            let body = ctx
                .lab
                .http_get("client", vip80, "/", Duration::from_millis(500));
            if body.as_deref().is_ok_and(|b| b.trim() == holder) {
                break;
            }
            if t_http.elapsed() > Duration::from_secs(10) {
                bail!("client never reached {holder} through {vip}: {body:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(holder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_timings_mirror_the_control_plane_timings() {
        let fast = Timings::parse("fast").unwrap();
        assert_eq!(
            lease_env(SVC_TIMING_ENV, &fast),
            [
                ("svc_leaseduration", "0.6"),
                ("svc_renewdeadline", "0.4"),
                ("svc_retryperiod", "0.2")
            ]
        );
        assert_eq!(
            lease_env(VIP_TIMING_ENV, &fast),
            [
                ("vip_leaseduration", "0.6"),
                ("vip_renewdeadline", "0.4"),
                ("vip_retryperiod", "0.2")
            ]
        );
        assert!(lease_env(SVC_TIMING_ENV, &Timings::parse("default").unwrap()).is_empty());
    }
}
