//! `cargo xtask`: developer entry points for vipd.
//!
//! ```text
//! cargo xtask lab up     start a lab and leave it running (prints how to enter it)
//! cargo xtask lab down   remove the running lab and any stale ones
//! cargo xtask test       unit tests + lab tests (lab tests need root; skipped loudly if not)
//! cargo xtask image [--binary PATH | --profile P] [--out DIR] [--tag REF]
//!                        vipd's container image, built without a daemon (see image.rs)
//! cargo xtask demo       the failover demo: vipd on three lab nodes, the holder stopped
//!                        twice, the client's gap printed (see demo.rs)
//! cargo xtask chaos --minutes N [--seed S]
//!                        the chaos soak: random faults against 3 vipd nodes and 50
//!                        Services while an auditor checks invariants (see chaos/)
//! cargo xtask bench failover [--scenario ..] [--trials N] [--routed]
//!                        [--impl vipd|keepalived|keepalived-fast|both]
//!                        failover figures for vipd and keepalived (see bench/failover/)
//! cargo xtask bench heartbeat [--peers 3,50] [--seconds 30]
//!                        heartbeat cost of svc_ridethrough (see bench/heartbeat.rs)
//! cargo xtask bench apiload [--timings fast,default] [--load 0,4,16,64] [--seconds 60]
//!                        the flapping guard under API server load (see bench/apiload/)
//! cargo xtask bench ipam [--services 1,500]
//!                        IPAM: create -> address written -> first answer (see bench/ipam.rs)
//! cargo xtask bench addrs [--count 8000] [--step 2000]
//!                        the kernel's cost per address add and lifetime refresh as the
//!                        addresses grow (see bench/addrs.rs)
//! cargo xtask bench fence [--vips 600,3700] [--holders 1,6] [--rounds 300]
//!                        the nftables fence's CPU per holder renewal (see bench/fence.rs)
//! cargo xtask bench services [--scenario LIST] [--services 1000]
//!                        LoadBalancer Services at scale (see bench/services/)
//! ```

mod args;
mod bench;
mod chaos;
mod demo;
mod image_cli;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{SigSet, Signal};
use serde::{Deserialize, Serialize};
use xtask::lab::{self, Lab, LabOptions, NAMESPACES};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  lab up      start a lab (namespaces, etcd, kube-apiserver) and leave it running
  lab down    remove the lab started by `lab up`, and any lab left by a dead run
  test        cargo test --workspace: unit tests, then lab tests (need root)
  image [--binary PATH | --profile release|dev] [--out DIR] [--tag REF]
              vipd's OCI image and docker-archive (target/image/), reproducible,
              with its digest and a CycloneDX SBOM; no container daemon needed
  demo        vipd on three lab nodes, stop the holder (SIGTERM, then SIGKILL + link
              down), print the failover gaps the client saw; tears the lab down
  chaos --minutes N [--seed S] [--services 50] [--nodes 3] [--orphan-leases-warn]
              random faults against vipd on the lab nodes while an auditor checks
              invariants; exits non-zero on any violation (`chaos --help`, docs/chaos.md)
  bench failover [--scenario LIST] [--trials N]
              [--impl vipd|keepalived|keepalived-fast|both] [--timings default,5/3/1,...]
              [--routed [--spread N]]
              failover figures (`bench failover --help`); --routed: routing-table
              mode behind a BGP router (BFD, ECMP), and the ECMP spread
  bench heartbeat [--peers 3,50] [--seconds 30]
              the peer protocol's cost (svc_ridethrough) on one node, simulated peers
  bench apiload [--timings fast,default] [--load 0,4,16,64] [--seconds 60]
              vipd's lease renewals, step-downs and leadership moves while loops of
              LISTs and PATCHes load the API server (`bench apiload --help`)
  bench ipam [--services 1,500]
              IPAM: create -> address written -> first answer, API writes per
              allocation, at each Service count (`bench ipam --help`)
  bench addrs [--count 8000] [--step 2000]
              the kernel's cost per IPv6/IPv4 address add and lifetime refresh as the
              addresses grow, in a namespace of its own; no vipd (`bench addrs --help`)
  bench fence [--vips 600,3700] [--holders 1,6] [--rounds 300]
              the nftables fence's user and system CPU per holder renewal, in a namespace
              of its own; no vipd manager (`bench fence --help`)
  bench services [--scenario bringup|scale|coldstart|churn|drain|dhcp|all] [--services 1000]
              LoadBalancer Services: create -> first answer, lease writes, CPU and RSS
              per node, cold start, power-off, churn (`bench services --help`)

environment:
  VIPD_KUBE_APISERVER   path to kube-apiserver v1.20.2
  VIPD_LAB_ASSETS       folder with kube-apiserver-v1.20.2-linux-amd64.xz + SHA256SUMS
  VIPD_LAB_KEEP=1       keep lab directories (logs, kubeconfigs) after teardown
  VIPD_LAB_TEST_THREADS test threads for lab tests (default 2)
  VIPD_CHAOS_MINUTES    minutes of the chaos soak run by `test` as root (default 2, 0: skip)
  VIPD_CHAOS_SEED       its seed (default 711036458, a fixed schedule)
  VIPD_BENCH_ENV        extra vipd environment for `bench services`, e.g. svc_leaseshards=16
  VIPD_BENCH_LOG        vipd's log filter (VIPD_LOG) for `bench services`, e.g.
                        info,vipd::election=debug (vipd::services::runtime stays at info
                        unless named: the bench waits for its start line; WARN counts
                        count what the filter lets through)
  VIPD_BENCH_SETTLE_SECS  seconds `bench services` scale/coldstart wait after the last answer
                        before the steady-state window (default 5)
  VIPD_BENCH_WINDOW_SECS  length of that window in seconds (default 10; 240 spans one
                        second-line refresh period of the Service VIPs on a node
                        holding up to 600 of them)";

/// Where `lab up` records the running lab.
const STATE_FILE: &str = "/run/vipd-lab/up.json";
/// Log of the background process holding a `lab up` lab.
const HOLDER_LOG: &str = "/run/vipd-lab/up.log";

#[derive(Debug, Serialize, Deserialize)]
struct UpState {
    holder_pid: i32,
    ready: bool,
    error: Option<String>,
    prefix: String,
    dir: PathBuf,
    namespaces: Vec<String>,
    admin_kubeconfig: PathBuf,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["lab", "up"] => lab_up(),
        ["lab", "down"] => lab_down(),
        ["lab", "hold"] => lab_hold(),
        ["test", rest @ ..] => test(rest),
        ["demo"] => demo::run(),
        ["image", rest @ ..] => image_cli::run(rest),
        ["chaos", rest @ ..] => chaos::run(rest),
        ["bench", "services", rest @ ..] => bench::services::run(rest),
        ["bench", "heartbeat", rest @ ..] => bench::heartbeat::run(rest),
        ["bench", "apiload", rest @ ..] => bench::apiload::run(rest),
        ["bench", "ipam", rest @ ..] => bench::ipam::run(rest),
        ["bench", "addrs", rest @ ..] => bench::addrs::run(rest),
        ["bench", "fence", rest @ ..] => bench::fence::run(rest),
        ["bench", rest @ ..] => bench::failover::run(rest),
        ["help" | "--help" | "-h"] | [] => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command `{}`\n\n{USAGE}", other.join(" ")),
    }
}

/// Fails unless run as root, naming `cargo xtask {what}`.
///
/// # Errors
/// Not root.
pub(crate) fn require_root(what: &str) -> Result<()> {
    let uid = nix::unistd::geteuid().as_raw();
    if uid != 0 {
        bail!("`cargo xtask {what}` needs root (network namespaces); run it with sudo -E");
    }
    Ok(())
}

fn read_state() -> Result<Option<UpState>> {
    match std::fs::read_to_string(STATE_FILE) {
        Ok(s) => Ok(Some(
            serde_json::from_str(&s).with_context(|| format!("parse {STATE_FILE}"))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {STATE_FILE}")),
    }
}

fn pid_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// `lab up`: re-runs this binary as a detached `lab hold` process that owns the lab, waits
/// for it to report ready, prints how to use the lab and exits.
fn lab_up() -> Result<()> {
    require_root("lab up")?;
    if let Some(st) = read_state()?
        && pid_alive(st.holder_pid)
    {
        bail!(
            "a lab is already up (prefix {}, holder pid {}); run `cargo xtask lab down` first",
            st.prefix,
            st.holder_pid
        );
    }
    let _ = std::fs::remove_file(STATE_FILE);
    std::fs::create_dir_all(lab::REGISTRY_DIR)?;
    let log = std::fs::File::create(HOLDER_LOG).with_context(|| format!("create {HOLDER_LOG}"))?;
    let exe = std::env::current_exe().context("find the xtask binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(["lab", "hold"])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid(2) is async-signal-safe; it detaches the holder from our terminal
    // session so it outlives `cargo xtask lab up`.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let child = cmd.spawn().context("start the lab holder")?;
    let deadline = Instant::now() + Duration::from_secs(180);
    let state = loop {
        if let Some(st) = read_state()? {
            if let Some(e) = st.error {
                bail!("lab did not start: {e}");
            }
            if st.ready {
                break st;
            }
        }
        if !pid_alive(child.id() as i32) || Instant::now() > deadline {
            let log = std::fs::read_to_string(HOLDER_LOG).unwrap_or_default();
            bail!("lab holder exited or timed out; its log ({HOLDER_LOG}):\n{log}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "lab is up (prefix {}, holder pid {})\n",
        state.prefix, state.holder_pid
    );
    println!("enter a namespace:");
    for (short, full) in NAMESPACES.iter().zip(&state.namespaces) {
        println!("  {short:<7} sudo ip netns exec {full} bash");
    }
    println!(
        "\nAPI server: https://{}:{} (inside the lab namespaces)",
        lab::API_IP,
        lab::API_PORT
    );
    println!(
        "node kubeconfigs: {}/kubeconfig/<node>.yaml (and <node>-local.yaml for https://127.0.0.1:6443)",
        state.dir.display()
    );
    println!("admin kubeconfig: {}\n", state.admin_kubeconfig.display());
    let kc = std::fs::read_to_string(&state.admin_kubeconfig).unwrap_or_default();
    println!("{kc}");
    println!(
        "logs: {}/logs, holder log: {HOLDER_LOG}",
        state.dir.display()
    );
    println!("remove it with: cargo xtask lab down");
    Ok(())
}

/// `lab hold` (internal): starts a lab with HTTP backends, records it in the state file and
/// keeps it until SIGTERM/SIGINT/SIGHUP, then tears it down.
fn lab_hold() -> Result<()> {
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    // Block before any thread exists, so every lab thread inherits the mask and the signal
    // is delivered to `wait` below. Child processes get a clean mask from std::process.
    signals.thread_block().context("block signals")?;
    let pid = std::process::id() as i32;
    let write = |st: &UpState| -> Result<()> {
        let tmp = format!("{STATE_FILE}.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(st)?)?;
        std::fs::rename(&tmp, STATE_FILE)?;
        Ok(())
    };
    let opts = LabOptions {
        http_backends: true,
        ..LabOptions::default()
    };
    let lab = match Lab::start(opts) {
        Ok(l) => l,
        Err(e) => {
            write(&UpState {
                holder_pid: pid,
                ready: false,
                error: Some(e.to_string()),
                prefix: String::new(),
                dir: PathBuf::new(),
                namespaces: Vec::new(),
                admin_kubeconfig: PathBuf::new(),
            })?;
            return Err(e.into());
        }
    };
    write(&UpState {
        holder_pid: pid,
        ready: true,
        error: None,
        prefix: lab.prefix().to_string(),
        dir: lab.dir().to_path_buf(),
        namespaces: lab.namespace_names(),
        admin_kubeconfig: lab.admin_kubeconfig(),
    })?;
    println!("lab {} up; waiting for SIGTERM", lab.prefix());
    let sig = signals.wait().context("wait for a signal")?;
    println!("got {sig}, tearing down");
    drop(lab);
    let _ = std::fs::remove_file(STATE_FILE);
    Ok(())
}

/// `lab down`: stops the `lab up` holder (which tears its lab down) and sweeps stale labs.
fn lab_down() -> Result<()> {
    require_root("lab down")?;
    if let Some(st) = read_state()? {
        if pid_alive(st.holder_pid) {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(st.holder_pid), Signal::SIGTERM)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while pid_alive(st.holder_pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if pid_alive(st.holder_pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(st.holder_pid),
                    Signal::SIGKILL,
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            println!("stopped lab {} (holder pid {})", st.prefix, st.holder_pid);
        }
        let _ = std::fs::remove_file(STATE_FILE);
    } else {
        println!("no lab recorded in {STATE_FILE}");
    }
    let mut failed = false;
    for (prefix, err) in lab::sweep_stale_labs() {
        match err {
            None => println!("removed stale lab {prefix}"),
            Some(e) => {
                failed = true;
                eprintln!("could not fully remove stale lab {prefix}: {e}");
            }
        }
    }
    if failed {
        bail!("some lab leftovers remain");
    }
    Ok(())
}

/// A `cargo` command run from the workspace root, for every nested build and test of xtask.
/// Without the variables `cargo run` set for xtask itself ([`set_by_cargo_run`]): passed on,
/// they made `ring`'s build script dirty (its fingerprint records `CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_NAME` and `CARGO_PKG_VERSION_*`), so every bench, chaos soak and demo rebuilt
/// ring, rustls, kube and vipd (3-5 min) right after an identical `cargo build --release -p
/// vipd`, and the next build from the shell rebuilt them again.
pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(lab::control_plane::workspace_root());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            c.env_remove(name);
        }
    }
    c
}

/// Whether `name` is one of the variables `cargo run` sets for the program it runs, about
/// that program's own package (here xtask): `CARGO_MANIFEST_DIR`, `CARGO_MANIFEST_PATH`,
/// `CARGO_PKG_*`, `CARGO_CRATE_NAME`, `CARGO_BIN_NAME`, `CARGO_PRIMARY_PACKAGE`. Not the
/// user's settings (`CARGO_TARGET_DIR`, `CARGO_HOME`, `CARGO_PROFILE_*`, ...).
fn set_by_cargo_run(name: &str) -> bool {
    matches!(
        name,
        "CARGO_MANIFEST_DIR"
            | "CARGO_MANIFEST_PATH"
            | "CARGO_CRATE_NAME"
            | "CARGO_BIN_NAME"
            | "CARGO_PRIMARY_PACKAGE"
    ) || name.starts_with("CARGO_PKG_")
}

fn run_cargo(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("==> {what}: {cmd:?}");
    let st = cmd.status().with_context(|| format!("run {what}"))?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

/// Seed of the short soak of `cargo xtask test`: the schedule that first showed a frozen
/// holder answering after SIGCONT (docs/chaos.md), so CI replays it on every run.
const CI_CHAOS_SEED: &str = "711036458";

/// The short chaos soak of `cargo xtask test` (as root): `VIPD_CHAOS_MINUTES` minutes
/// (default 2, `0` skips it) with the vipd binary the tests built, seed `VIPD_CHAOS_SEED`
/// (default [`CI_CHAOS_SEED`]: the same fault schedule every run).
fn chaos_soak() -> Result<()> {
    let minutes = std::env::var("VIPD_CHAOS_MINUTES").unwrap_or_else(|_| "2".into());
    if minutes.trim() == "0" {
        eprintln!("==> chaos soak skipped (VIPD_CHAOS_MINUTES=0)");
        return Ok(());
    }
    let seed = std::env::var("VIPD_CHAOS_SEED").unwrap_or_else(|_| CI_CHAOS_SEED.into());
    eprintln!(
        "==> chaos soak: cargo xtask chaos --minutes {minutes} --seed {seed} --no-build --canary"
    );
    chaos::run(&[
        "--minutes",
        minutes.trim(),
        "--seed",
        seed.trim(),
        "--no-build",
        "--canary",
    ])
}

/// `test`: unit tests, then the lab tests (integration tests in tests/), the short chaos
/// soak (root only), then doc tests.
/// Extra arguments are passed to every `cargo test` before `--`.
fn test(extra: &[&str]) -> Result<()> {
    let uid = nix::unistd::geteuid().as_raw();
    let root = uid == 0;
    if root {
        lab::control_plane::ensure_packages(&[
            ("ip", "iproute2"),
            ("etcd", "etcd-server"),
            ("xz", "xz-utils"),
            // The ARP flux guard's lab and kernel tests run the real `nft`.
            ("nft", "nftables"),
            // tests/monitoring.rs checks and unit-tests the alert rules.
            ("promtool", "prometheus"),
            // lab_foundation's capture test sends with arping (.ci/run installs the same).
            ("arping", "arping"),
            ("tcpdump", "tcpdump"),
            // tests/lab_image.rs checks the container image with skopeo and umoci.
            ("skopeo", "skopeo"),
            ("umoci", "umoci"),
        ])?;
        // Fail early, with instructions, if there is no API server.
        let api = lab::find_apiserver()?;
        eprintln!("==> lab: kube-apiserver {}", api.display());
        for (prefix, err) in lab::sweep_stale_labs() {
            eprintln!(
                "==> removed stale lab {prefix}{}",
                err.map(|e| format!(" ({e})")).unwrap_or_default()
            );
        }
    }
    let threads = std::env::var("VIPD_LAB_TEST_THREADS").unwrap_or_else(|_| "2".into());

    let mut unit = cargo();
    unit.args(["test", "--workspace", "--lib", "--bins"])
        .args(extra);
    run_cargo(unit, "unit tests")?;

    let mut labt = cargo();
    labt.args(["test", "--workspace", "--no-fail-fast", "--test", "*"])
        .args(extra)
        .args(["--", &format!("--test-threads={threads}")]);
    if !root {
        labt.env("VIPD_SKIP_LAB", "1");
    }
    run_cargo(labt, "lab tests (tests/*.rs)")?;

    // A failed soak is reported after the doc tests, which run either way.
    let chaos = if root { chaos_soak() } else { Ok(()) };

    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc"]).args(extra);
    run_cargo(doc, "doc tests")?;
    chaos.context("chaos soak")?;

    if root {
        let left: Vec<String> = lab::list_netns()?
            .into_iter()
            .filter(|n| n.starts_with(lab::NAME_PREFIX) && n.contains('x'))
            .collect();
        if !left.is_empty() {
            bail!(
                "lab namespaces left behind after the tests: {}",
                left.join(", ")
            );
        }
        eprintln!("==> all tests passed, including lab tests");
    } else {
        eprintln!();
        eprintln!("==================================================================");
        eprintln!(" LAB TESTS SKIPPED: not running as root (uid {uid}).");
        eprintln!(" The lab needs network namespaces, veth pairs and raw sockets.");
        eprintln!(" Unit tests passed. To run everything: sudo -E cargo xtask test");
        eprintln!("==================================================================");
    }
    Ok(())
}

#[cfg(test)]
mod cargo_env_tests {
    use super::set_by_cargo_run;

    /// ring 0.17's build script records these (its `output`'s `rerun-if-env-changed`
    /// lines); `cargo run` sets them for xtask, the user's shell does not.
    #[test]
    fn the_variables_cargo_run_set_for_xtask_are_not_passed_on() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_PKG_VERSION_MINOR",
            "CARGO_PKG_VERSION_PATCH",
            "CARGO_PKG_VERSION_PRE",
            "CARGO_MANIFEST_PATH",
        ] {
            assert!(set_by_cargo_run(name), "{name}");
        }
        for name in [
            "CARGO_TARGET_DIR",
            "CARGO_HOME",
            "CARGO_PROFILE_RELEASE_DEBUG",
            "CARGO",
            "PATH",
        ] {
            assert!(!set_by_cargo_run(name), "{name}");
        }
    }
}
