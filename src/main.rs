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
    Probe(vipd::probe::Args),
    /// Print deployment files: static Pod, DaemonSet, RBAC or systemd unit.
    #[command(subcommand)]
    Manifest(vipd::manifest::ManifestCommand),
    /// Check this node (capabilities, interface, VIP free, macvlan, API, RBAC); exits
    /// non-zero when a check fails.
    Preflight(Box<vipd::preflight::PreflightArgs>),
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

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The chain of causes, without a backtrace: these are operator-facing errors.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Manager(args) => {
            let cfg = match Config::from_process(&args) {
                Ok(c) => c,
                Err(e) => {
                    init_tracing(tracing::level_filters::LevelFilter::INFO);
                    return Err(anyhow::anyhow!("invalid configuration: {e}"));
                }
            };
            init_tracing(cfg.log_level.as_tracing());
            let shutdown = CancellationToken::new();
            cancel_on_signal(shutdown.clone())?;
            vipd::manager::run(cfg, shutdown).await?;
            Ok(())
        }
        Command::Manifest(cmd) => {
            print!("{}", vipd::manifest::run(&cmd)?);
            Ok(())
        }
        Command::Preflight(args) => {
            let cfg = Config::from_process(&args.manager)
                .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
            let report = vipd::preflight::run(&cfg, &args).await;
            print!("{}", report.render());
            if report.failed() {
                anyhow::bail!("preflight found problems (see the table above)");
            }
            Ok(())
        }
        Command::Probe(args) => {
            let shutdown = CancellationToken::new();
            cancel_on_signal(shutdown.clone())?;
            let stats = vipd::probe::run(args, async move { shutdown.cancelled().await }).await?;
            if stats.summary().successes == 0 {
                anyhow::bail!("no successful answer");
            }
            Ok(())
        }
    }
}
