//! `systemd-analyze verify` on the generated unit (skipped with a SKIPPED line when
//! systemd-analyze is not installed), and the unit's required settings.

use std::process::Command;

#[path = "support/manifest.rs"]
mod manifest_cli;

use manifest_cli::generate;
use vipd::cmd::manifest;

#[test]
fn systemd_analyze_verify_accepts_the_unit() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED systemd_analyze_verify_accepts_the_unit: systemd-analyze not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // verify checks that ExecStart's binary exists: point it at the built vipd.
    let unit = generate(&["systemd", "--binary", env!("CARGO_BIN_EXE_vipd")]);
    let path = dir.path().join("vipd.service");
    std::fs::write(&path, &unit).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("vipd.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify:\n{stderr}\n{unit}"
    );
}

#[test]
fn unit_has_notify_watchdog_restart_and_only_two_capabilities() {
    let unit = generate(&["systemd"]);
    for line in [
        "Type=notify",
        "WatchdogSec=10",
        "Restart=always",
        "AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE",
        "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE",
        "EnvironmentFile=/etc/vipd/vipd.env",
        "ExecStart=/usr/local/bin/vipd manager",
        "NoNewPrivileges=yes",
    ] {
        assert!(unit.lines().any(|l| l == line), "missing {line}:\n{unit}");
    }
    // AF_PACKET (ARP/NDP) and AF_NETLINK (addresses) must stay allowed.
    let families = unit
        .lines()
        .find_map(|l| l.strip_prefix("RestrictAddressFamilies="))
        .unwrap();
    assert!(families.contains("AF_PACKET") && families.contains("AF_NETLINK"));
    assert!(!generate(&["systemd", "--watchdog-sec", "0"]).contains("WatchdogSec"));
}

#[test]
fn environment_file_resolves_for_the_manager() {
    let text = generate(&[
        "systemd",
        "--environment-file",
        "--controlplane",
        "--address",
        "192.0.2.10",
    ]);
    let env: Vec<(String, String)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([("vip_nodename".to_string(), "node-a".to_string())])
        .collect();
    let r = manifest::resolve_env(&env).unwrap();
    assert!(r.config.control_plane);
    assert!(
        !env.iter()
            .any(|(k, _)| k == "vip_nodename" && text.contains("vip_nodename"))
    );
}
