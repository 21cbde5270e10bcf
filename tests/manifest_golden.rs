//! Golden-file tests of `vipd manifest` (S30): every flag combination's output is compared
//! byte for byte with `tests/golden/<case>.yaml`; `UPDATE_GOLDEN=1 cargo test --test
//! manifest_golden` rewrites them (and the checked-in files under `manifests/`). Also:
//! the generated env is exactly what `vipd manager` accepts, env values are strings, there
//! is no `status`, and the refused combinations fail with a clear error.

#[path = "golden/cases.rs"]
mod cases;
#[path = "support/manifest.rs"]
mod manifest_cli;

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use manifest_cli::try_generate as generate;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn update() -> bool {
    std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1")
}

/// Compares `actual` with the file at `path`, or rewrites it with UPDATE_GOLDEN=1.
fn check_golden(path: &Path, actual: &str) -> Option<String> {
    if update() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, actual).unwrap();
        return None;
    }
    match std::fs::read_to_string(path) {
        Ok(expected) if expected == actual => None,
        Ok(expected) => Some(format!(
            "{} differs (UPDATE_GOLDEN=1 to accept):\n--- expected\n{expected}\n--- actual\n{actual}",
            path.display()
        )),
        Err(e) => Some(format!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )),
    }
}

#[test]
fn golden_kubernetes_manifests() {
    let mut failures = Vec::new();
    for (name, argv) in cases::ok_cases() {
        let out = generate(&argv).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(f) = check_golden(&root().join(format!("tests/golden/{name}.yaml")), &out) {
            failures.push(f);
        }
    }
    for (name, argv) in cases::other_cases()
        .into_iter()
        .chain(cases::routed_cases())
    {
        let out = generate(&argv).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(f) = check_golden(&root().join(format!("tests/golden/{name}")), &out) {
            failures.push(f);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The files under manifests/ are exactly what the generator prints (they never drift).
#[test]
fn checked_in_manifests_match_the_generator() {
    let files: Vec<(&str, Vec<&str>)> = vec![
        // No key in a checked-in file: every cluster needs its own (`vipd manifest peer-key`).
        ("manifests/rbac.yaml", vec!["rbac", "--peerKey=false"]),
        ("manifests/vipd.service", vec!["systemd"]),
        ("manifests/vipd.env", cases::SYSTEMD_ENV.to_vec()),
        (
            "manifests/static-pod-kubeadm.yaml",
            vec![
                "pod",
                "--controlplane",
                "--address",
                "192.0.2.10",
                "--interface",
                "eth0",
            ],
        ),
        ("manifests/static-pod-k3s.yaml", cases::K3S.to_vec()),
        (
            "manifests/daemonset-services.yaml",
            vec!["daemonset", "--services", "--inCluster"],
        ),
    ];
    let mut failures = Vec::new();
    for (path, argv) in files {
        let out = generate(&argv).unwrap_or_else(|e| panic!("{path}: {e}"));
        if let Some(f) = check_golden(&root().join(path), &out) {
            failures.push(f);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn refused_combinations_name_the_problem() {
    for (argv, needle) in cases::err_cases() {
        match generate(&argv) {
            Ok(out) => panic!("{argv:?} must fail, printed:\n{out}"),
            Err(e) => assert!(e.contains(needle), "{argv:?}: error {e:?} lacks {needle:?}"),
        }
    }
}

fn pod_spec_of(name: &str, yaml: &str) -> PodSpec {
    if name.starts_with("pod-") {
        let pod: Pod = serde_norway::from_str(yaml.trim_start_matches("---\n")).unwrap();
        assert!(pod.status.is_none());
        pod.spec.unwrap()
    } else {
        let ds: DaemonSet = serde_norway::from_str(yaml.trim_start_matches("---\n")).unwrap();
        assert!(ds.status.is_none());
        ds.spec.unwrap().template.spec.unwrap()
    }
}

/// The generated container env, as the kubelet would give it to `vipd manager` on node
/// `node-a`, resolves without error to the configuration the flags asked for.
#[test]
fn manager_accepts_exactly_the_generated_env() {
    for (name, argv) in cases::ok_cases() {
        let yaml = generate(&argv).unwrap();
        let spec = pod_spec_of(name, &yaml);
        assert_eq!(spec.host_network, Some(true), "{name}");
        let c = &spec.containers[0];
        assert_eq!(
            c.args.as_deref(),
            Some(&["manager".to_string()][..]),
            "{name}"
        );
        let mut env = Vec::new();
        for e in c.env.as_ref().unwrap() {
            let known = vipd::config::option(&e.name)
                .unwrap_or_else(|| panic!("{name}: env {} is not a vipd/kube-vip name", e.name));
            assert_eq!(
                known.kind,
                vipd::config::OptionKind::Supported,
                "{name}: {}",
                e.name
            );
            let value = match (&e.value, &e.value_from) {
                (Some(v), None) => v.clone(),
                (None, Some(src)) => {
                    let f = src.field_ref.as_ref().unwrap();
                    assert_eq!(
                        (e.name.as_str(), f.field_path.as_str()),
                        ("vip_nodename", "spec.nodeName")
                    );
                    "node-a".to_string()
                }
                other => panic!("{name}: env {} has {other:?}", e.name),
            };
            env.push((e.name.clone(), value));
        }
        let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let resolved = vipd::config::resolve_detailed(
            &vipd::config::ManagerArgs::default(),
            &lookup,
            None,
            &|| None,
        )
        .unwrap_or_else(|e| panic!("{name}: vipd manager refuses the generated env: {e}"));
        let cfg = resolved.config;
        assert!(
            resolved.warnings.is_empty(),
            "{name}: {:?}",
            resolved.warnings
        );
        assert_eq!(cfg.node_name, "node-a");
        assert_eq!(
            cfg.control_plane,
            argv.contains(&"--controlplane"),
            "{name}"
        );
        assert_eq!(cfg.services, argv.contains(&"--services"), "{name}");
        if cfg.control_plane {
            assert!(
                cfg.kubernetes_addr
                    .as_deref()
                    .is_some_and(|a| a.starts_with("127.0.0.1:")),
                "{name}"
            );
        }
        // The kubeconfig named in the env is the mounted one, read-only.
        match &cfg.kubeconfig {
            Some(path) => {
                let m = c.volume_mounts.as_ref().unwrap();
                assert!(
                    m.iter()
                        .any(|m| Path::new(&m.mount_path) == path && m.read_only == Some(true)),
                    "{name}"
                );
                assert!(spec.service_account_name.is_none(), "{name}");
            }
            None => assert_eq!(spec.service_account_name.as_deref(), Some("vipd"), "{name}"),
        }
        if name == "pod-k3s" {
            assert_eq!(cfg.vip_subnet.v4, 16);
            assert!(cfg.services_election);
            assert_eq!(
                cfg.kubeconfig.as_deref(),
                Some(Path::new("/etc/rancher/k3s/k3s.yaml"))
            );
        }
    }
}

/// Shape rules of S29/S30 checked on the raw YAML: env values are YAML strings, no
/// `status`, capabilities NET_ADMIN+NET_RAW+NET_BIND_SERVICE added and ALL dropped, probes on the admin
/// port, memory limit, super-admin.conf only with --kubeadm-init.
#[test]
fn manifest_shape() {
    for (name, argv) in cases::ok_cases() {
        let yaml = generate(&argv).unwrap();
        let v: serde_json::Value =
            serde_norway::from_str(yaml.trim_start_matches("---\n")).unwrap();
        assert!(v.get("status").is_none(), "{name}");
        let spec = if name.starts_with("pod-") {
            &v["spec"]
        } else {
            &v["spec"]["template"]["spec"]
        };
        let c = &spec["containers"][0];
        for e in c["env"].as_array().unwrap() {
            if let Some(val) = e.get("value") {
                assert!(
                    val.is_string(),
                    "{name}: env {} = {val} is not a string",
                    e["name"]
                );
            }
        }
        assert_eq!(
            c["securityContext"]["capabilities"]["add"],
            serde_json::json!(["NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE"])
        );
        assert_eq!(
            c["securityContext"]["capabilities"]["drop"],
            serde_json::json!(["ALL"])
        );
        assert!(c["securityContext"].get("privileged").is_none());
        assert!(c["resources"]["limits"]["memory"].is_string(), "{name}");
        assert!(c["resources"]["requests"]["memory"].is_string(), "{name}");
        if argv.contains(&"--prometheusHTTPServer=") {
            assert!(c.get("livenessProbe").is_none() && c.get("readinessProbe").is_none());
        } else {
            assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
            assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
            assert_eq!(c["livenessProbe"]["httpGet"]["port"], 2112);
        }
        let super_admin = yaml.contains("super-admin.conf");
        assert_eq!(super_admin, argv.contains(&"--kubeadm-init"), "{name}");
        if super_admin {
            assert_eq!(
                spec["volumes"][0]["hostPath"]["path"],
                "/etc/kubernetes/super-admin.conf"
            );
            assert_eq!(
                c["volumeMounts"][0]["mountPath"],
                "/etc/kubernetes/admin.conf"
            );
        }
        let tolerates = spec.get("tolerations").is_some();
        assert_eq!(tolerates, argv.contains(&"--taint"), "{name}");
        assert_eq!(
            spec.get("affinity").is_some(),
            argv.contains(&"--taint"),
            "{name}"
        );
    }
}

/// Issue 27: `vipd manifest rbac` (and `vipd manifest peer-key`) print the peer key Secret
/// with 32 random bytes, a different key at every run, after the same rules as the golden
/// file; `--servicesRideThrough=false` prints neither the Secret nor the rule.
#[test]
fn rbac_prints_a_new_random_peer_key_every_time() {
    use k8s_openapi::api::core::v1::Secret;
    let secret_of = |yaml: &str| -> Secret {
        let doc = yaml
            .split("---\n")
            .find(|d| d.contains("kind: Secret"))
            .expect("a Secret document");
        serde_norway::from_str(doc).expect("Secret")
    };
    let a = generate(&["rbac"]).unwrap();
    let b = generate(&["rbac"]).unwrap();
    let rules = generate(&["rbac", "--peerKey=false"]).unwrap();
    assert!(a.starts_with(&rules), "the rules come first, unchanged");
    let (sa, sb) = (secret_of(&a), secret_of(&b));
    assert_eq!(sa.metadata.name.as_deref(), Some("vipd-peer-key"));
    assert_eq!(sa.metadata.namespace.as_deref(), Some("kube-system"));
    let key = |s: &Secret| s.data.as_ref().unwrap()["key"].0.clone();
    assert_eq!(key(&sa).len(), 32);
    assert_ne!(key(&sa), key(&sb), "never the same key twice");
    assert!(rules.contains("vipd-peer-key") && !rules.contains("kind: Secret"));
    let alone = generate(&["peer-key", "-n", "vipd"]).unwrap();
    assert_eq!(
        secret_of(&alone).metadata.namespace.as_deref(),
        Some("vipd")
    );
    let off = generate(&["rbac", "--servicesRideThrough=false"]).unwrap();
    assert!(!off.contains("secrets") && !off.contains("kind: Secret"));
}
