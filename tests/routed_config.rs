//! `vipd manifest bird|frr` (issue 29): the generated configurations are accepted by the
//! daemons themselves — BIRD 2's `bird -p` (parse only) and FRR's `vtysh --dryrun` — and
//! the options are read as `vipd manager` reads its own (environment before flag before
//! config file). The daemon checks run nothing and open no socket; each is skipped, with
//! a message, only when its binary is absent (`.ci/run` installs bird2 and frr).

#[path = "golden/cases.rs"]
mod cases;
#[path = "support/manifest.rs"]
mod manifest_cli;

use std::path::PathBuf;

use vipd::cmd::manifest::routed::{Daemon, RoutedManifestArgs, generate};

fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs `checker args... <file with text>`; panics with its output when it refuses.
fn check_with(checker: &PathBuf, args: &[&str], name: &str, text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(checker)
        .args(args)
        .arg(&file)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !said.contains("Unknown command"),
        "{} refuses {name}: {said}\n{text}",
        checker.display()
    );
}

#[test]
fn bird_accepts_every_generated_bird_conf() {
    let Some(bird) = find("bird") else {
        eprintln!(
            "SKIPPED bird_accepts_every_generated_bird_conf: no `bird` (apt-get install bird2)"
        );
        return;
    };
    for (name, argv) in cases::routed_cases()
        .into_iter()
        .filter(|(_, a)| a[0] == "bird")
    {
        let text = manifest_cli::generate(&argv);
        check_with(&bird, &["-p", "-c"], name, &text);
    }
}

#[test]
fn frr_accepts_every_generated_frr_conf() {
    let Some(vtysh) = find("vtysh") else {
        eprintln!("SKIPPED frr_accepts_every_generated_frr_conf: no `vtysh` (apt-get install frr)");
        return;
    };
    for (name, argv) in cases::routed_cases()
        .into_iter()
        .filter(|(_, a)| a[0] == "frr")
    {
        let text = manifest_cli::generate(&argv);
        check_with(&vtysh, &["--dryrun", "-f"], name, &text);
    }
}

fn with_env(env: &[(&str, &str)], argv: &[&str], file: Option<&str>) -> Result<String, String> {
    let args = match manifest_cli::parse(argv).unwrap() {
        vipd::cmd::manifest::ManifestCommand::Bird(a) => a,
        _ => RoutedManifestArgs::default(),
    };
    let lookup = |k: &str| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    generate(Daemon::Bird, &args, &lookup, file).map_err(|e| e.to_string())
}

/// kube-vip's precedence: the environment variable beats the flag, the flag the config
/// file; `bgp_peeraddress` comes after the peers of `bgp_peers`, with `bgp_peeras`.
#[test]
fn options_are_read_as_the_manager_reads_them() {
    let file = "bgp_as: 65100\nbgp_peers: 198.51.100.3:65003\nvip_interface: eth0\n";
    let out = with_env(
        &[
            ("bgp_as", "65200"),
            ("bgp_peeraddress", "198.51.100.9"),
            ("bgp_peeras", "65009"),
        ],
        &[
            "bird",
            "--localAS",
            "65300",
            "--bgppeers",
            "198.51.100.2:65002",
        ],
        Some(file),
    )
    .unwrap();
    assert!(out.contains("local as 65200;"), "{out}");
    assert!(out.contains("neighbor 198.51.100.2 as 65002;"), "{out}");
    assert!(!out.contains("198.51.100.3"), "{out}");
    let p1 = out.find("198.51.100.2 as").unwrap();
    let p2 = out.find("neighbor 198.51.100.9 as 65009;").unwrap();
    assert!(p1 < p2, "{out}");
    let from_file = with_env(&[], &["bird"], Some(file)).unwrap();
    assert!(from_file.contains("local as 65100;") && from_file.contains("198.51.100.3 as 65003;"));
    let e = with_env(&[("bgp_peers", "198.51.100.1:65001:pw:x")], &["bird"], None).unwrap_err();
    assert!(
        e.contains("environment variable bgp_peers") && e.contains("<hidden>") && !e.contains("pw"),
        "{e}"
    );
}

/// The manager still refuses BGP, and says where to go instead.
#[test]
fn manager_refuses_bgp_and_points_to_the_generators() {
    let env = [
        ("svc_enable", "true"),
        ("bgp_enable", "true"),
        ("bgp_peers", "198.51.100.1:65001"),
    ];
    let lookup = |k: &str| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    let e = vipd::config::resolve_detailed(
        &vipd::config::ManagerArgs::default(),
        &lookup,
        None,
        &|| Some("node-a".into()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bgp_enable"), "{e}");
    assert!(
        e.contains("`vipd manifest bird` or `vipd manifest frr`"),
        "{e}"
    );
    assert_eq!(
        e.matches("vipd manifest bird").count(),
        1,
        "the hint is said once: {e}"
    );
}
