//! The container image of `cargo xtask image`, run for real: built from the vipd binary of
//! this test run, read back by `skopeo`, unpacked by `umoci`, and its entrypoint run as the
//! manager on the lab's nodes against the lab's API server; it passes S01 (the holder
//! SIGKILLed, another node takes the VIP, never two holders). See docs/scenarios.md.
//!
//! The unpacked root file system runs with chroot inside each node's network namespace,
//! read-only like the generated Pod's (`readOnlyRootFilesystem`), with `/proc`, `/sys`,
//! `/dev` and the node's kubeconfig mounted as a container runtime would: all in the mount
//! namespace `ip netns exec` makes for the process, so nothing outlives it.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;
use xtask::image;
use xtask::lab::{Lab, LabOptions, LabProcess};

/// Where the node's kubeconfig is mounted inside the image.
const KUBECONFIG_IN_IMAGE: &str = "/etc/vipd/kubeconfig";

/// `in-image ROOTFS KUBECONFIG PROGRAM ARGS...`: mounts as a container runtime would, in
/// the private mount namespace of `ip netns exec`, then execs PROGRAM chrooted (the pid
/// stays the program's, so signals reach it).
const IN_IMAGE: &str = r#"#!/bin/sh
set -eu
rootfs=$1 kubeconfig=$2
shift 2
mount --bind "$rootfs" "$rootfs"
mount -o remount,bind,ro "$rootfs"
mount -t proc proc "$rootfs/proc"
mount --rbind /sys "$rootfs/sys"
mount --rbind /dev "$rootfs/dev"
mount --bind -o ro "$kubeconfig" "$rootfs/etc/vipd/kubeconfig"
exec chroot "$rootfs" "$@"
"#;

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The unpacked image: its root file system, the entrypoint + command and the environment
/// of umoci's runtime config, and the launcher script.
struct Unpacked {
    rootfs: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    launcher: PathBuf,
}

/// Checks both archives with `skopeo inspect` (entrypoint, command, architecture, labels).
fn inspect(built: &image::BuiltImage, spec: &image::ImageSpec) {
    let oci = format!("oci-archive:{}", built.oci_archive.display());
    let v: serde_json::Value =
        serde_json::from_slice(&run(Command::new("skopeo").args(["inspect", &oci]))).unwrap();
    assert_eq!(v["Digest"], built.digest.as_str());
    let labels = &v["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        spec.version.as_str()
    );
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        spec.revision.as_str()
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(labels["org.opencontainers.image.source"], image::SOURCE_URL);
    for archive in [
        oci,
        format!("docker-archive:{}", built.docker_archive.display()),
    ] {
        let c: serde_json::Value = serde_json::from_slice(&run(
            Command::new("skopeo").args(["inspect", "--config", &archive])
        ))
        .unwrap();
        assert_eq!(
            c["config"]["Entrypoint"],
            serde_json::json!(["/vipd"]),
            "{archive}"
        );
        assert_eq!(
            c["config"]["Cmd"],
            serde_json::json!(["manager"]),
            "{archive}"
        );
        assert_eq!(
            (&c["architecture"], &c["os"]),
            (&"amd64".into(), &"linux".into())
        );
    }
}

/// `umoci unpack` of the OCI archive into `dir/bundle`, plus the mount points a runtime
/// makes and the launcher script.
fn unpack(built: &image::BuiltImage, tag: &str, dir: &Path) -> Unpacked {
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&built.oci_archive)
        .arg("-C")
        .arg(&layout));
    let bundle = dir.join("bundle");
    run(Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:{tag}", layout.display()))
        .arg(&bundle));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let args: Vec<String> = serde_json::from_value(config["process"]["args"].clone()).unwrap();
    let env = config["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str()?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let rootfs = bundle.join("rootfs");
    for d in ["proc", "sys", "dev", "etc/vipd"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::write(rootfs.join("etc/vipd/kubeconfig"), b"").unwrap();
    let launcher = dir.join("in-image");
    std::fs::write(&launcher, IN_IMAGE).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&launcher, mode).unwrap();
    Unpacked {
        rootfs,
        args,
        env,
        launcher,
    }
}

impl Unpacked {
    /// The launcher's arguments for `program args` on `node`.
    fn argv(&self, lab: &Lab, node: &str, program: &[&str]) -> Vec<String> {
        let kc = lab.kubeconfig(node).unwrap();
        let mut v = vec![self.rootfs.display().to_string(), kc.display().to_string()];
        v.extend(program.iter().map(|s| s.to_string()));
        v
    }

    /// Runs `program args` from the image on `node` to completion; its stdout.
    fn exec(&self, lab: &Lab, node: &str, program: &[&str]) -> String {
        let out = lab
            .exec(node, &self.launcher, &self.argv(lab, node, program))
            .unwrap_or_else(|e| panic!("{program:?} in the image on {node}: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts the image's entrypoint and command (`/vipd manager`) on `node` with the
    /// image's environment and the control-plane settings of [`start_vipd`].
    fn start_manager(&self, lab: &Lab, node: &str) -> LabProcess {
        let mut env = self.env.clone();
        env.extend(vipd_env(
            lab,
            node,
            T531,
            &[("k8s_config_file", KUBECONFIG_IN_IMAGE)],
        ));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        lab.spawn(node, &self.launcher, &self.argv(lab, node, &args), &env)
            .expect("start the image's manager")
    }
}

/// Builds the image, or `None` (test skipped, with the reason) when lab tests are skipped or
/// umoci / skopeo can neither be found nor installed.
fn build_image(dir: &Path) -> Option<(image::BuiltImage, image::ImageSpec)> {
    match xtask::lab::lab_available("lab_image") {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => panic!("lab_image: {e}"),
    }
    let tools = [("umoci", "umoci"), ("skopeo", "skopeo")];
    if let Err(e) = xtask::lab::control_plane::ensure_packages(&tools) {
        eprintln!("SKIPPED lab_image: umoci and skopeo are not installed and cannot be: {e}");
        return None;
    }
    let debs = image::fetch_debs().expect("fetch the image's Debian packages");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_vipd"));
    let spec = image::workspace_spec(binary, debs, None).expect("image spec");
    let t0 = std::time::Instant::now();
    let built = image::build(&spec, &dir.join("out")).expect("build the image");
    eprintln!(
        "lab_image: image {} built in {:?} ({} bytes gzipped)",
        built.digest,
        t0.elapsed(),
        built.layer_size
    );
    Some((built, spec))
}

/// The image's `vipd --version` and `vipd manifest` run; the image carries no `nft` (vipd
/// changes nftables through netlink itself); its `vipd manager` holds the VIP on three nodes
/// with the ARP flux guard's and the millisecond fence's tables (read with the host's
/// `nft`) and passes S01.
#[test]
fn s57_image_runs_as_the_manager_and_passes_s01() {
    let dir = tempfile::tempdir().unwrap();
    let Some((built, spec)) = build_image(dir.path()) else {
        return;
    };
    inspect(&built, &spec);
    let (repo, tag) = image::split_reference(&spec.reference);
    let img = unpack(&built, tag, dir.path());
    assert_eq!(img.args, ["/vipd", "manager"]);
    let lab = lab("lab_image", LabOptions::default()).expect("lab");

    let version = img.exec(&lab, "node-a", &["/vipd", "--version"]);
    assert_eq!(version.trim(), format!("vipd {}", spec.version));
    let pinned = format!("{repo}@{}", built.digest);
    let pod = img.exec(
        &lab,
        "node-a",
        &[
            "/vipd",
            "manifest",
            "pod",
            "--interface",
            "eth0",
            "--address",
            VIP,
            "--controlplane",
            "--image",
            &pinned,
        ],
    );
    assert!(pod.contains(&format!("image: {pinned}")), "{pod}");
    assert!(
        !img.rootfs.join("usr/sbin/nft").exists(),
        "no nft in the image"
    );

    // The ARP flux guard and the fence without nft: their tables exist on the holder.
    let first = img.start_manager(&lab, "node-a");
    single_holder(&lab, VIP, std::time::Duration::from_secs(30));
    wait_until(
        "ARP flux guard on",
        std::time::Duration::from_secs(10),
        || first.log().contains("ARP flux protection on"),
    );
    for (family, table) in [("arp", "vipd"), ("arp", "vipd_fence")] {
        let out = lab
            .exec("node-a", "nft", &["list", "table", family, table])
            .unwrap_or_else(|e| panic!("nft list table {family} {table}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("table {family} {table}")), "{text}");
    }
    drop(first);

    s01_killed_holder(&lab, &|node| img.start_manager(&lab, node));
}
