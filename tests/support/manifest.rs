//! Runs `vipd manifest` in-process for the manifest tests: parses an argv (what follows
//! `vipd manifest`) with the real clap definition and generates its output.

#![allow(dead_code)]

use clap::Parser;
use vipd::cmd::manifest::{self, Deployment, ManifestCommand};
use xtask::lab::{Lab, LabProcess};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: ManifestCommand,
}

/// Parses `argv` (after `vipd manifest`, e.g. `["pod", "--address", ...]`).
///
/// # Errors
/// clap's message when the arguments are refused.
pub fn parse(argv: &[&str]) -> Result<ManifestCommand, String> {
    let mut v = vec!["vipd-manifest"];
    v.extend(argv);
    Cli::try_parse_from(v)
        .map(|cli| cli.cmd)
        .map_err(|e| e.to_string())
}

/// The output of `vipd manifest <argv>`.
///
/// # Errors
/// The parse error or the generator's error, as text.
pub fn try_generate(argv: &[&str]) -> Result<String, String> {
    manifest::run(&parse(argv)?).map_err(|e| e.to_string())
}

/// The output of `vipd manifest <argv>`; panics when it is refused.
pub fn generate(argv: &[&str]) -> String {
    try_generate(argv).unwrap_or_else(|e| panic!("vipd manifest {argv:?}: {e}"))
}

/// The plan of a `pod` or `daemonset` argv (panics when it is refused).
pub fn plan(argv: &[&str]) -> Deployment {
    match parse(argv).unwrap() {
        ManifestCommand::Pod(a) | ManifestCommand::Daemonset(a) => a.plan().unwrap(),
        _ => panic!("not a workload"),
    }
}

/// The env of the generated Pod for `node` in the lab: exactly the manifest's env, with
/// the downward-API node name filled in and the kubeconfig path pointing at the lab node's
/// kubeconfig (the hostPath mount in a real cluster).
pub fn lab_env(lab: &Lab, p: &Deployment, node: &str) -> Vec<(String, String)> {
    let kubeconfig = lab.kubeconfig(node).unwrap().to_string_lossy().into_owned();
    p.env_for_node(node)
        .into_iter()
        .map(|(k, v)| {
            if k == "k8s_config_file" {
                (k, kubeconfig.clone())
            } else {
                (k, v)
            }
        })
        .collect()
}

/// `vipd manager` on `node` with exactly `env`.
pub fn spawn_manager(lab: &Lab, node: &str, env: &[(String, String)]) -> LabProcess {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    lab.spawn(node, env!("CARGO_BIN_EXE_vipd"), &["manager"], &env)
        .unwrap()
}
