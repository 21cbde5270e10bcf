//! The `vipd` binary: parses the command line, sets up logging and runs the library.

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use vipd::config::{Config, ManagerArgs};

/// vipd: on-node VIP announcer for Kubernetes (kube-vip ARP mode compatible).
#[derive(Parser)]
#[command(name = "vipd", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the VIP manager: the control-plane VIP and LoadBalancer Service VIPs, through
    /// Lease leader election.
    Manager(Box<ManagerArgs>),
    /// Request a URL on a fixed schedule and report gaps and backend switches (the
    /// failover "wget loop").
    Probe(vipd::cmd::probe::Args),
    /// Print deployment files: static Pod, DaemonSet, RBAC or systemd unit.
    #[command(subcommand)]
    Manifest(vipd::cmd::manifest::ManifestCommand),
    /// Check this node (capabilities, interface, VIP free, macvlan, API, RBAC); exits
    /// non-zero when a check fails.
    Preflight(Box<vipd::cmd::preflight::PreflightArgs>),
    /// Show every VIP, its holder, lease age, moves and vipd's last word on it, read from
    /// the API (works from any machine with a kubeconfig).
    Status(vipd::cmd::status::StatusArgs),
    /// Hand every VIP this node holds to a peer and stop campaigning (maintenance), via the
    /// local vipd's admin endpoint; --undo to campaign again.
    Drain(vipd::cmd::drain::DrainArgs),
}

fn init_tracing(level: tracing::level_filters::LevelFilter) {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(level.into())
        .with_env_var("VIPD_LOG")
        .from_env_lossy();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

/// Cancels the token on SIGTERM or SIGINT.
fn cancel_on_signal(token: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        token.cancel();
    });
    Ok(())
}

/// Async runtime worker threads.
const WORKER_THREADS: usize = 2;
/// Threads for blocking work (DNS lookups, file reads); tokio's default is 512.
const MAX_BLOCKING_THREADS: usize = 8;

/// glibc malloc settings, applied before any other thread starts: one arena (vipd's two
/// workers allocate little; every extra arena keeps its own free memory) and a trim
/// threshold of 0, so freed memory at the top of the heap goes back to the kernel at once
/// instead of glibc's dynamic threshold keeping up to tens of MiB. Measured at 1000
/// Services: about 2 MiB less RSS per node, no CPU change (`cargo xtask bench services
/// --scenario scale`); the container image runs this glibc build too. A musl build has its
/// own allocator, which returns memory eagerly by design. `GLIBC_TUNABLES` cannot override
/// these.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    // SAFETY: mallopt only sets allocator parameters; no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

/// How often the manager looks at the heap's free memory ([`spawn_heap_trim`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const HEAP_TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Free bytes inside glibc's heap (`mallinfo().fordblks`, chunks freed but not returned)
/// from which a look returns them to the kernel (`malloc_trim(0)`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const HEAP_TRIM_FREE_BYTES: usize = 4 << 20;

/// Returns the heap's freed pages to the kernel every [`HEAP_TRIM_EVERY`] while more than
/// [`HEAP_TRIM_FREE_BYTES`] are free, until `stop`. The trim threshold of
/// [`tune_allocator`] returns only the top of the heap: a pass that builds its plan for
/// thousands of Services frees megabytes in the middle of the heap, which glibc keeps
/// resident until something reuses them. `malloc_trim(0)` madvises every free page of every
/// arena away (glibc 2.8 and later); the look and the trim hold the arena lock while they
/// walk its free chunks. Measured at 10 000 Services: 0-3 MiB less RSS a node, about 7 MiB
/// on the allocator's node (docs/services-bench.md).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn spawn_heap_trim(stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEAP_TRIM_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // `mallinfo`, not `mallinfo2`: the latter is glibc 2.33 or later, and linking it
            // would stop vipd building on older hosts (RHEL 8, Debian 11). Its `int` counts
            // wrap past 2 GiB; a negative count is taken for a large one.
            // SAFETY: mallinfo and malloc_trim only read and release the allocator's free
            // memory; both take the arena locks themselves.
            unsafe {
                let free = usize::try_from(libc::mallinfo().fordblks).unwrap_or(usize::MAX);
                if free >= HEAP_TRIM_FREE_BYTES {
                    libc::malloc_trim(0);
                }
            }
        }
    });
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn spawn_heap_trim(_stop: CancellationToken) {}

/// Writes `text` to standard output. A reader that went away (`vipd status | head`) is not
/// an error (`println!` would panic, exit 101); any other failure is (a full disk under
/// `vipd manifest rbac > file`).
///
/// # Errors
/// The write error, other than a broken pipe.
fn say(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::anyhow!("cannot write the output: {e}"))
        }
        _ => Ok(()),
    }
}

/// Writes `line` and a newline to standard error, as [`say`].
fn say_err(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn main() -> std::process::ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    // Two worker threads whatever the core count: vipd's work is small and I/O-bound, and
    // every worker (the default is one per core) adds a stack and a malloc arena, which on a
    // 64-core node would multiply the memory figure for nothing.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say_err(&format!("error: cannot start the async runtime: {e}"));
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The chain of causes, without a backtrace: these are operator-facing errors.
            say_err(&format!("error: {e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Manager(args) => {
            let cfg = match Config::from_process(&args) {
                Ok(r) => r.init_logging_then_warn(|l| init_tracing(l.as_tracing())),
                Err(e) => {
                    init_tracing(tracing::level_filters::LevelFilter::INFO);
                    return Err(anyhow::anyhow!("invalid configuration: {e}"));
                }
            };
            let shutdown = CancellationToken::new();
            cancel_on_signal(shutdown.clone())?;
            spawn_heap_trim(shutdown.clone());
            vipd::cmd::manager::run(cfg, shutdown).await?;
            Ok(())
        }
        Command::Manifest(cmd) => {
            say(&vipd::cmd::manifest::run(&cmd)?)?;
            for w in vipd::cmd::manifest::warnings(&cmd) {
                say_err(&format!("warning: {w}"));
            }
            Ok(())
        }
        Command::Preflight(args) => {
            // Logs (config warnings, and what the checks log) go to stderr; the table to stdout.
            let cfg = Config::from_process(&args.manager)
                .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?
                .init_logging_then_warn(|l| init_tracing(l.as_tracing()));
            let report = vipd::cmd::preflight::run(&cfg, &args).await;
            say(&report.render())?;
            if report.failed() {
                anyhow::bail!("preflight found problems (see the table above)");
            }
            Ok(())
        }
        Command::Drain(args) => {
            say(&format!("{}\n", vipd::cmd::drain::run(&args).await?))?;
            Ok(())
        }
        Command::Status(args) => {
            init_tracing(tracing::level_filters::LevelFilter::WARN);
            say(&vipd::cmd::status::run(&args).await?)?;
            Ok(())
        }
        Command::Probe(args) => {
            let shutdown = CancellationToken::new();
            cancel_on_signal(shutdown.clone())?;
            let stats =
                vipd::cmd::probe::run(args, async move { shutdown.cancelled().await }).await?;
            if stats.summary().successes == 0 {
                anyhow::bail!("no successful answer");
            }
            Ok(())
        }
    }
}
