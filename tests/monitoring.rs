//! The monitoring files in manifests/monitoring: the alert rules pass `promtool check rules`
//! and their unit tests (`promtool test rules`, Debian's `prometheus` package, installed when
//! missing and running as root), the PrometheusRule carries exactly the same groups, the
//! Grafana dashboard is well-formed, and every metric the rules and the dashboard name is
//! one vipd exports (so renaming a metric breaks this test, not the alerts).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/monitoring")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `promtool`, installed with Debian's `prometheus` package when missing (as root); `None`
/// (test skipped, said on stderr) when it cannot be installed and `VIPD_SKIP_LAB=1` (the
/// unprivileged run of `cargo xtask test`).
fn promtool() -> Option<PathBuf> {
    if let Err(e) = xtask::lab::control_plane::ensure_packages(&[("promtool", "prometheus")]) {
        if std::env::var("VIPD_SKIP_LAB").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED: promtool missing and cannot be installed: {e}");
            return None;
        }
        panic!("promtool is needed (Debian package prometheus; run as root to install it): {e}");
    }
    Some(
        xtask::lab::process::find_in_path("promtool")
            .or_else(|| Some(PathBuf::from("/usr/bin/promtool")).filter(|p| p.is_file()))
            .expect("promtool after install"),
    )
}

fn run_promtool(promtool: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir())
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let Some(promtool) = promtool() else {
        return;
    };
    let out = run_promtool(&promtool, &["check", "rules", "vipd-alerts.rules.yaml"]);
    assert!(out.contains("SUCCESS: 9 rules found"), "{out}");
    let out = run_promtool(&promtool, &["test", "rules", "vipd-alerts.test.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn prometheusrule_carries_the_same_groups() {
    let plain: serde_json::Value =
        serde_norway::from_str(&read("vipd-alerts.rules.yaml")).expect("rules YAML");
    let crd: serde_json::Value =
        serde_norway::from_str(&read("prometheusrule.yaml")).expect("PrometheusRule YAML");
    assert_eq!(crd["kind"], "PrometheusRule");
    assert_eq!(crd["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(crd["spec"]["groups"], plain["groups"]);
}

/// Metric names vipd exports, as queries spell them (`_total` for counters; `_bucket`,
/// `_sum`, `_count` for histograms).
fn exported() -> BTreeSet<String> {
    let text = vipd::cmd::manager::metrics::example("n").encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        if w.next() != Some("#") || w.next() != Some("TYPE") {
            continue;
        }
        let (Some(name), Some(kind)) = (w.next(), w.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{s}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// Every `kube_vip_*` / `vipd_*` identifier in `expr`.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' {
            cur.push(c);
        } else {
            if cur.starts_with("kube_vip_") || cur.starts_with("vipd_") {
                out.push(cur.clone());
            }
            cur.clear();
        }
    }
    out
}

#[test]
fn rules_and_dashboard_use_only_exported_metrics() {
    let names = exported();
    assert!(names.contains("kube_vip_is_leader"), "{names:?}");
    let rules: serde_json::Value =
        serde_norway::from_str(&read("vipd-alerts.rules.yaml")).expect("rules YAML");
    let mut exprs: Vec<String> = rules["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["expr"].as_str().expect("expr").to_string())
        .collect();
    let dash: serde_json::Value =
        serde_json::from_str(&read("grafana-dashboard.json")).expect("dashboard JSON");
    assert_eq!(dash["uid"], "vipd");
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_i64().expect("panel id")),
            "duplicate id"
        );
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()));
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "{p}");
        }
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{p}");
        exprs.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().expect("expr").to_string()),
        );
    }
    let mut used = 0;
    for e in &exprs {
        for m in metrics_in(e) {
            used += 1;
            assert!(
                names.contains(&m),
                "{m} (in `{e}`) is not exported by vipd: {names:?}"
            );
        }
    }
    assert!(used >= exprs.len(), "every query names a vipd metric");
}
