//! `cargo xtask image [--binary PATH | --profile release|dev] [--out DIR] [--tag REF]`: builds
//! vipd's container image (see `xtask::image`) and prints its digest.

use std::path::PathBuf;

use anyhow::{Result, bail};
use xtask::image;

const USAGE: &str =
    "usage: cargo xtask image [--binary PATH | --profile release|dev] [--out DIR] [--tag REF]

Builds vipd's OCI image without a container daemon, reproducibly (SOURCE_DATE_EPOCH, else
the last commit's time): vipd plus libc6 and libgcc-s1 from Debian (apt).

  --binary PATH   put this vipd binary in the image instead of building one
  --profile P     build vipd with `cargo build --profile P --bin vipd` (default release)
  --out DIR       output directory (default target/image)
  --tag REF       image reference in the archives (default ghcr.io/vipd/vipd:v<version>)

Writes vipd.oci.tar, vipd.docker.tar, vipd.sbom.cdx.json and vipd.digest.";

/// Runs `cargo xtask image`.
pub fn run(args: &[&str]) -> Result<()> {
    let mut binary: Option<PathBuf> = None;
    let mut profile = "release".to_string();
    let mut out = xtask::lab::control_plane::target_dir().join("image");
    let mut tag: Option<String> = None;
    crate::args::parse_flags(args, USAGE, |flag, value| {
        match flag {
            "--binary" => binary = Some(PathBuf::from(value()?)),
            "--profile" => profile = value()?.to_string(),
            "--out" => out = PathBuf::from(value()?),
            "--tag" => tag = Some(value()?.to_string()),
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let binary = match binary {
        Some(b) => b,
        None => {
            let mut cmd = crate::cargo();
            cmd.args(["build", "--locked", "--profile", &profile, "--bin", "vipd"]);
            crate::run_cargo(cmd, "build vipd")?;
            let dir = if profile == "dev" {
                "debug"
            } else {
                profile.as_str()
            };
            xtask::lab::control_plane::target_dir()
                .join(dir)
                .join("vipd")
        }
    };
    if !binary.is_file() {
        bail!("no vipd binary at {}", binary.display());
    }
    eprintln!(
        "==> Debian packages: {} and their dependencies",
        image::debs::ROOT_PACKAGES.join(", ")
    );
    let debs = image::fetch_debs()?;
    let spec = image::workspace_spec(binary, debs, tag)?;
    let built = image::build(&spec, &out)?;
    for d in &spec.debs {
        println!("package  {} {}", d.name, d.version);
    }
    println!("binary   {}", spec.binary.display());
    println!(
        "created  {} (SOURCE_DATE_EPOCH={})",
        image::rfc3339(spec.epoch)?,
        spec.epoch
    );
    println!(
        "layer    {:.1} MiB gzipped, {:.1} MiB unpacked",
        built.layer_size as f64 / 1048576.0,
        built.layer_tar_size as f64 / 1048576.0
    );
    println!("oci      {}", built.oci_archive.display());
    println!("docker   {}", built.docker_archive.display());
    println!("sbom     {}", built.sbom.display());
    println!("image    {}", spec.reference);
    println!("digest   {}", built.digest);
    let (repo, _) = image::split_reference(&spec.reference);
    println!("pin      {repo}@{}", built.digest);
    Ok(())
}
