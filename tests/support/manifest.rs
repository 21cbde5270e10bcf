//! Runs `vipd manifest` in-process for the manifest tests: parses an argv (what follows
//! `vipd manifest`) with the real clap definition and generates its output.

#![allow(dead_code)]

use clap::Parser;
use vipd::manifest::{self, ManifestCommand};

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
