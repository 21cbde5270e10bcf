//! `cargo xtask bench heartbeat [--peers 3,50] [--seconds 30] [--vipd PATH] [--no-build] [-v]`:
//! the cost of the peer protocol (`svc_ridethrough`) on one vipd node as the segment grows.
//!
//! Per run: a fresh lab; one vipd (release build, Services mode, per-Service leases) on
//! node-a holding one Service's lease; Node objects `node-a` and `sim-01 .. sim-(N-1)` (the
//! membership) and the key Secret; `peer_sim` (the example `examples/peer_sim.rs`, built with
//! vipd) in ns node-b sending the simulated peers' valid signed heartbeats, each every
//! 200 ms, with the membership's digest, so node-a verifies, assembles and counts every one
//! of them. After 5 s of warm-up, over `--seconds`: frames/s node-a accepted
//! (`vipd_peer_frames_total{result="accepted"}`) and sent (what `peer_sim` received from it),
//! CPU of node-a's vipd (utime + stime, % of one core) and its VmRSS at the end. A first run
//! without the option (one Node, no peers) is the baseline.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use super::harness::api::{create, service_json};
use super::harness::build::{release_artifact, vipd_release_binary};
use super::harness::probe::json_summary;
use super::harness::procfs::{cpu_percent, proc_status};
use super::harness::text::tail;
use super::harness::{METRICS_PORT, services_mode_env};
use crate::lab::{self, Lab, LabOptions, LabProcess};

const USAGE: &str = "\
cargo xtask bench heartbeat [--peers 3,50] [--seconds 30] [--vipd PATH] [--no-build] [-v]
  --peers LIST   segment sizes (vipd nodes, node-a included; the others simulated), default 3,50
  --seconds N    measuring window per run (default 30)
  --vipd PATH    vipd binary (default: target/release/vipd, built unless --no-build;
                 peer_sim is taken from target/release/examples/)
  --no-build     do not run cargo build --release
  -v             progress on stderr";

const SERVICE_VIP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 30);

/// Options of `bench heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Segment sizes.
    pub peers: Vec<usize>,
    /// Measuring window.
    pub seconds: u64,
    /// Explicit vipd binary.
    pub vipd: Option<PathBuf>,
    /// Build first.
    pub build: bool,
    /// Progress on stderr.
    pub verbose: bool,
}

impl Options {
    /// Parses the arguments after `bench heartbeat`.
    ///
    /// # Errors
    /// An unknown flag, a missing value, or a value that is not what the flag needs (named).
    pub fn parse(args: &[&str]) -> Result<Options> {
        let mut o = Options {
            peers: vec![3, 50],
            seconds: 30,
            vipd: None,
            build: true,
            verbose: false,
        };
        crate::args::parse_flags(args, USAGE, |a, value| {
            match a {
                "--peers" => {
                    let v = value()?;
                    o.peers = v
                        .split(',')
                        .map(|p| match p.parse::<usize>() {
                            Ok(n) if (1..=99).contains(&n) => Ok(n),
                            _ => Err(anyhow!(
                                "invalid --peers value {p:?}: expected a number of nodes from 1 to 99"
                            )),
                        })
                        .collect::<Result<_>>()?;
                }
                "--seconds" => {
                    let v = value()?;
                    o.seconds = match v.parse::<u64>() {
                        Ok(n) if n > 0 => n,
                        _ => bail!("invalid --seconds value {v:?}: expected whole seconds > 0"),
                    };
                }
                "--vipd" => o.vipd = Some(PathBuf::from(value()?)),
                "--no-build" => o.build = false,
                "-v" | "--verbose" => o.verbose = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(o)
    }
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
struct Row {
    label: String,
    accepted_per_s: Option<f64>,
    sent_per_s: Option<f64>,
    rejected: Option<f64>,
    cpu_percent: Option<f64>,
    rss_kib: Option<u64>,
}

/// Entry point of `cargo xtask bench heartbeat ARGS`.
///
/// # Errors
/// Bad arguments, a failed build, a lab that cannot start, vipd or peer_sim failing.
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    crate::require_root("bench heartbeat")?;
    let vipd = vipd_release_binary(o.build, o.vipd.as_deref())?;
    let sim = release_artifact(o.build, &["--example", "peer_sim"], "examples/peer_sim")?;
    println!(
        "vipd binary: {}\npeer_sim: {}",
        vipd.display(),
        sim.display()
    );
    let mut rows = vec![measure(&vipd, &sim, None, &o)?];
    for n in &o.peers {
        rows.push(measure(&vipd, &sim, Some(*n), &o)?);
    }
    println!();
    println!(
        "| run | frames/s accepted | frames/s sent | rejected | CPU % of one core | VmRSS MiB |"
    );
    println!("|---|---|---|---|---|---|");
    let f = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.label,
            f(r.accepted_per_s, 1),
            f(r.sent_per_s, 1),
            f(r.rejected, 0),
            f(r.cpu_percent, 2),
            f(r.rss_kib.map(|k| k as f64 / 1024.0), 1)
        );
    }
    Ok(())
}

fn say(o: &Options, s: impl AsRef<str>) {
    if o.verbose {
        eprintln!("    {}", s.as_ref());
    }
}

fn metrics(lab: &Lab) -> String {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), METRICS_PORT);
    lab.http_get("node-a", addr, "/metrics", Duration::from_secs(2))
        .unwrap_or_default()
}

/// `vipd_peer_frames_total` of one `result` (`accepted`), or of every other result.
fn frames(text: &str, accepted: bool) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("vipd_peer_frames_total{"))
        .filter(|l| l.contains("result=\"accepted\"") == accepted)
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .fold(0.0, |a, v| a + v)
}

fn wait_log(p: &LabProcess, needle: &str, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    while !p.log().contains(needle) {
        if Instant::now() > end {
            bail!(
                "vipd did not log {needle:?} within {} s; log tail:\n{}",
                limit.as_secs(),
                tail(&p.log(), 30)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// One run: `peers` = `None` is the baseline (option off, no peers), `Some(n)` a segment of
/// n vipd nodes (node-a and n - 1 simulated).
fn measure(vipd: &Path, sim: &Path, peers: Option<usize>, o: &Options) -> Result<Row> {
    let label = match peers {
        None => "baseline: svc_ridethrough off, 1 node".to_string(),
        Some(n) => format!("svc_ridethrough, {n} nodes ({} simulated)", n - 1),
    };
    eprintln!("==> {label}");
    let lab = Lab::start(LabOptions::default())?;
    let sims: Vec<String> = (1..peers.unwrap_or(1))
        .map(|i| format!("sim-{i:02}"))
        .collect();
    let mut members: Vec<String> = vec!["node-a".to_string()];
    members.extend(sims.iter().cloned());
    members.sort();
    let ride = peers.is_some();
    let key_file = lab.dir().join("peer.key");
    create_members(&lab, &members, ride, &key_file)?;
    let kubeconfig = lab.kubeconfig("node-a")?.to_string_lossy().into_owned();
    let mut env = services_mode_env("node-a", &kubeconfig);
    env.push(("svc_ridethrough", if ride { "true" } else { "false" }));
    let p = lab.spawn("node-a", vipd, &["manager"], &env)?;
    wait_log(
        &p,
        "watching LoadBalancer Services",
        Duration::from_secs(30),
    )?;
    create(
        &lab,
        "/api/v1/namespaces/default/services",
        &service_json("hb-bench", IpAddr::V4(SERVICE_VIP)),
        "Service hb-bench",
    )?;
    wait_log(&p, "acquired lease", Duration::from_secs(30))?;
    say(o, "node-a holds the Service's lease");
    let simp = if ride {
        Some(start_sim(&lab, sim, o, &sims, &members, &key_file)?)
    } else {
        None
    };
    std::thread::sleep(Duration::from_secs(5));
    let pid = p.pid();
    let before = metrics(&lab);
    let t0 = Instant::now();
    let cpu = cpu_percent(&[pid], Duration::from_secs(o.seconds))
        .first()
        .copied()
        .flatten();
    let secs = t0.elapsed().as_secs_f64();
    let after = metrics(&lab);
    let rss_kib = proc_status(pid, "VmRSS");
    let mut row = Row {
        label,
        cpu_percent: cpu,
        rss_kib,
        ..Row::default()
    };
    if let Some(s) = simp {
        row.accepted_per_s = Some((frames(&after, true) - frames(&before, true)) / secs);
        row.rejected = Some(frames(&after, false));
        row.sent_per_s = sim_sent_per_s(s, o)?;
    }
    let log = p.log();
    if ride && !log.contains("peer protocol: membership") {
        bail!(
            "vipd did not log its membership; log tail:\n{}",
            tail(&log, 30)
        );
    }
    say(o, format!("{row:?}"));
    drop(lab);
    Ok(row)
}

/// The Node objects of `members`; with `ride` also the peer key Secret `vipd-peer-key`
/// ([`Lab::create_peer_key_secret`]) and its key in `key_file` (for peer_sim).
fn create_members(lab: &Lab, members: &[String], ride: bool, key_file: &Path) -> Result<()> {
    let names: Vec<&str> = members.iter().map(String::as_str).collect();
    lab.register_nodes(&names)?;
    if ride {
        let key = lab.create_peer_key_secret()?;
        std::fs::write(key_file, key).context("write the peer key file")?;
    }
    Ok(())
}

/// Starts peer_sim on node-b for `--seconds` + 10 s, sending as the simulated nodes `sims`
/// of the segment `members`.
fn start_sim(
    lab: &Lab,
    sim: &Path,
    o: &Options,
    sims: &[String],
    members: &[String],
    key_file: &Path,
) -> Result<LabProcess> {
    let seconds = (o.seconds + 10).to_string();
    let names = sims.join(",");
    let membership = members.join(",");
    let key = key_file.to_string_lossy().into_owned();
    let args = [
        "--interface",
        lab::ETH,
        "--key-file",
        &key,
        "--names",
        &names,
        "--membership",
        &membership,
        "--seconds",
        &seconds,
    ];
    Ok(lab.spawn("node-b", sim, &args, &[])?)
}

/// Waits for peer_sim to finish and reads the frames per second it received (its JSON
/// summary line).
fn sim_sent_per_s(mut s: LabProcess, o: &Options) -> Result<Option<f64>> {
    let line = json_summary(
        &mut s,
        Duration::from_secs(20),
        "peer_sim did not finish",
        "no summary from peer_sim",
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&line).with_context(|| format!("parse {line}"))?;
    let (received, seconds) = (v["received"].as_f64(), v["seconds"].as_f64());
    say(o, format!("peer_sim: {line}"));
    Ok(received.zip(seconds).map(|(r, s)| r / s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_name_bad_values() {
        let o = Options::parse(&["--peers", "3,50", "--seconds", "10", "--no-build"]).unwrap();
        assert_eq!(o.peers, vec![3, 50]);
        assert_eq!(o.seconds, 10);
        assert!(!o.build);
        let e = Options::parse(&["--peers", "3,x"]).unwrap_err().to_string();
        assert!(e.contains("--peers") && e.contains("\"x\""), "{e}");
        let e = Options::parse(&["--peers", "100"]).unwrap_err().to_string();
        assert!(e.contains("\"100\""), "{e}");
        let e = Options::parse(&["--seconds", "0"]).unwrap_err().to_string();
        assert!(e.contains("--seconds") && e.contains("\"0\""), "{e}");
        let e = Options::parse(&["--vipd", "--no-build"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--vipd needs a value"), "{e}");
        let e = Options::parse(&["--frobnicate"]).unwrap_err().to_string();
        assert!(e.contains("\"--frobnicate\""), "{e}");
    }

    #[test]
    fn frames_split_accepted_from_rejected() {
        let text = "# HELP x\n\
                    vipd_peer_frames_total{result=\"accepted\"} 120\n\
                    vipd_peer_frames_total{result=\"bad_mac\"} 2\n\
                    vipd_peer_frames_total{result=\"replay\"} 1\n\
                    vipd_peer_frames_created{result=\"accepted\"} 5\n";
        assert_eq!(frames(text, true), 120.0);
        assert_eq!(frames(text, false), 3.0);
        // None at all: 0, printed as 0 (an empty f64 sum is -0.0).
        assert_eq!(format!("{:.0}", frames("", false)), "0");
    }
}
