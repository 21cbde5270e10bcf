//! The release build of vipd (and of other artifacts of the vipd package) the benches run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use xtask::lab;

/// Builds vipd in release mode (unless `build` is false) and returns its path: `explicit`,
/// else `<target>/release/vipd`.
///
/// # Errors
/// When cargo fails or the binary is missing.
pub fn vipd_release_binary(build: bool, explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if !p.is_file() {
            bail!("--vipd {}: no such file", p.display());
        }
        return Ok(p.to_path_buf());
    }
    release_artifact(build, &[], "vipd")
}

/// Runs `cargo build --release -p vipd EXTRA...` (unless `build` is false) and returns
/// `<target>/release/<path>` (e.g. `vipd`, or `examples/peer_sim` with `--example
/// peer_sim`).
///
/// # Errors
/// When cargo fails or the file is missing (the message names the command to run).
pub fn release_artifact(build: bool, extra: &[&str], path: &str) -> Result<PathBuf> {
    let mut args = vec!["build", "--release", "-p", "vipd"];
    args.extend_from_slice(extra);
    let cmd = format!("cargo {}", args.join(" "));
    if build {
        let mut c = crate::cargo();
        c.args(&args);
        eprintln!("==> {c:?}");
        let st = c.status().with_context(|| format!("run {cmd}"))?;
        if !st.success() {
            bail!("{cmd} failed ({st})");
        }
    }
    let p = lab::control_plane::target_dir().join("release").join(path);
    if !p.is_file() {
        bail!(
            "{} not found: run `{cmd}` (or drop --no-build)",
            p.display()
        );
    }
    Ok(p)
}
