use super::*;
use clap::Parser;

#[derive(Parser)]
struct T {
    #[command(subcommand)]
    cmd: ManifestCommand,
}

fn plan(args: &[&str]) -> Result<Deployment, ManifestError> {
    let mut v = vec!["t", "pod"];
    v.extend(args);
    match T::try_parse_from(v).unwrap().cmd {
        ManifestCommand::Pod(a) => a.plan(),
        _ => unreachable!(),
    }
}

/// DaemonSet-only flags on a static pod are refused with the flag's name, not ignored
/// (a static pod naming a ServiceAccount never reaches the API; --taint would do nothing).
#[test]
fn static_pod_refuses_daemonset_only_flags() {
    let plan_for = |args: &[&str]| {
        let mut v = vec!["t", "pod", "--controlplane", "--address", "192.0.2.10"];
        v.extend(args);
        match T::try_parse_from(v).unwrap().cmd {
            ManifestCommand::Pod(a) => a.static_pod_plan(),
            _ => unreachable!(),
        }
    };
    for (args, flag) in [
        (&["--inCluster"][..], "inCluster"),
        (&["--inCluster=true"][..], "inCluster"),
        (&["--taint"][..], "taint"),
    ] {
        match plan_for(args) {
            Err(ManifestError::Invalid { flag: f, .. }) => assert_eq!(f, flag, "{args:?}"),
            other => panic!("{args:?}: expected an error naming --{flag}, got {other:?}"),
        }
    }
    assert!(plan_for(&["--inCluster=false", "--taint=false"]).is_ok());
    assert!(plan_for(&[]).is_ok());
    // The DaemonSet takes both.
    let v = ["t", "daemonset", "--services", "--inCluster", "--taint"];
    match T::try_parse_from(v).unwrap().cmd {
        ManifestCommand::Daemonset(a) => assert!(a.plan().is_ok()),
        _ => unreachable!(),
    }
}

#[test]
fn every_generator_flag_has_an_env_name() {
    for f in [
        "arp",
        "leaderElection",
        "interface",
        "port",
        "controlplane",
        "services",
        "address",
        "vipSubnet",
        "namespace",
        "leaseName",
        "servicesLeaseName",
        "leaseDuration",
        "leaseRenewDuration",
        "leaseRetry",
        "arpRate",
        "servicesElection",
        "serviceInterface",
        "lbClassOnly",
        "lbClassName",
        "enableNodeLabeling",
        "log",
        "prometheusHTTPServer",
        "kubernetesAddr",
        "k8sConfigPath",
        "nodeName",
    ] {
        env_for(f).unwrap();
    }
    assert!(matches!(
        env_for("nope"),
        Err(ManifestError::UnknownFlag("nope"))
    ));
}

fn text_env(p: &Deployment) -> Vec<(&'static str, String)> {
    p.env
        .iter()
        .filter_map(|(k, v)| match v {
            EnvValue::Text(t) => Some((*k, t.clone())),
            EnvValue::NodeName => None,
        })
        .collect()
}

/// `--enableLoadBalancer` passes through as kube-vip's generator writes it: lb_enable,
/// lb_port and lb_fwdmethod (defaults filled in); a refused method names the flag.
#[test]
fn enable_load_balancer_passes_through_with_port_and_method() {
    let cp = ["--controlplane", "--address", "192.0.2.10"];
    let lb = |p: &Deployment| {
        text_env(p)
            .into_iter()
            .filter(|(k, _)| k.starts_with("lb_"))
            .collect::<Vec<_>>()
    };
    let p = plan(&[&cp[..], &["--services", "--enableLoadBalancer"]].concat()).unwrap();
    assert_eq!(
        lb(&p),
        [
            ("lb_enable", "true".to_string()),
            ("lb_port", "6443".to_string()),
            ("lb_fwdmethod", "local".to_string())
        ]
    );
    let p = plan(
        &[
            &cp[..],
            &[
                "--enableLoadBalancer=true",
                "--lbPort",
                "8443",
                "--lbForwardingMethod",
                "masquerade",
            ],
        ]
        .concat(),
    )
    .unwrap();
    assert_eq!(
        lb(&p)[1..],
        [
            ("lb_port", "8443".to_string()),
            ("lb_fwdmethod", "masquerade".to_string())
        ]
    );
    // Off: nothing written, whatever the other two say (as kube-vip), with a warning for
    // each that was given.
    let args = [&cp[..], &["--enableLoadBalancer=false", "--lbPort", "1"]].concat();
    let p = plan(&args).unwrap();
    assert!(lb(&p).is_empty());
    let mut v = vec!["t", "pod"];
    v.extend(&args);
    let w = warnings(&T::try_parse_from(v).unwrap().cmd);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("--lbPort=1") && w[0].contains("--enableLoadBalancer"),
        "{w:?}"
    );
    let mut v = vec!["t", "daemonset"];
    v.extend(&cp[..]);
    v.extend(["--lbForwardingMethod", "masquerade", "--lbPort", "8443"]);
    assert_eq!(warnings(&T::try_parse_from(v).unwrap().cmd).len(), 2);
    let mut v = vec!["t", "pod"];
    v.extend(&cp[..]);
    v.extend(["--enableLoadBalancer", "--lbPort", "8443"]);
    assert!(warnings(&T::try_parse_from(v).unwrap().cmd).is_empty());
    let e = plan(
        &[
            &cp[..],
            &["--enableLoadBalancer", "--lbForwardingMethod", "tunnel"],
        ]
        .concat(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("lb_fwdmethod") && e.contains("tunnel"), "{e}");
}

#[test]
fn control_plane_without_address_is_the_managers_error() {
    let e = plan(&["--controlplane"]).unwrap_err().to_string();
    assert!(e.contains("cp_enable needs at least one VIP"), "{e}");
}

#[test]
fn arp_false_is_refused() {
    let e = plan(&["--controlplane", "--address", "192.0.2.10", "--arp=false"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("vip_arp"), "{e}");
}

#[test]
fn bad_bool_names_the_flag() {
    let e = plan(&["--controlplane=yes"]).unwrap_err().to_string();
    assert!(e.contains("--controlplane") && e.contains("yes"), "{e}");
}

#[test]
fn kubeadm_init_mounts_super_admin_at_the_kubeconfig_path() {
    let p = plan(&[
        "--controlplane",
        "--address",
        "192.0.2.10",
        "--kubeadm-init",
    ])
    .unwrap();
    assert_eq!(
        p.access,
        Access::Kubeconfig {
            host_path: SUPER_ADMIN_CONF.into(),
            mount_path: DEFAULT_KUBECONFIG.into()
        }
    );
    assert!(plan(&["--services", "--kubeadm-init"]).is_err());
}

#[test]
fn control_plane_sets_kubernetes_addr_to_the_local_api_server() {
    let p = plan(&[
        "--controlplane",
        "--address",
        "192.0.2.10",
        "--port",
        "6444",
    ])
    .unwrap();
    let env = p.env_for_node("n1");
    assert!(env.contains(&("kubernetes_addr".into(), "127.0.0.1:6444".into())));
    let p = plan(&["--services"]).unwrap();
    assert!(!p.env.iter().any(|(k, _)| *k == "kubernetes_addr"));
}

#[test]
fn admin_endpoint_forms() {
    assert_eq!(admin_endpoint(":2112").unwrap(), (None, Some(2112)));
    assert_eq!(
        admin_endpoint("127.0.0.1:9000").unwrap(),
        (Some("127.0.0.1".into()), Some(9000))
    );
    assert_eq!(admin_endpoint("").unwrap(), (None, None));
    assert!(admin_endpoint("x").is_err());
}

/// Issue 26: DHCP needs no variable (a `0.0.0.0` / `::` Service asks DHCP, as in
/// kube-vip): `--dhcpServices` writes none and only makes the container privileged; without
/// `--services` it is refused, naming the flag. kube-vip's `--dhcpMode` (the dynamic DNS
/// family) is not a generator flag.
#[test]
fn dhcp_services_flag_writes_no_variable() {
    let p = plan(&["--interface", "eth0", "--services", "--dhcpServices"]).unwrap();
    assert!(p.privileged);
    assert!(
        !text_env(&p).iter().any(|(k, _)| k.starts_with("dhcp")),
        "{:?}",
        text_env(&p)
    );
    let p = plan(&["--interface", "eth0", "--services"]).unwrap();
    assert!(!p.privileged);
    match plan(&[
        "--controlplane",
        "--address",
        "192.0.2.10",
        "--dhcpServices",
    ]) {
        Err(ManifestError::Invalid { flag, .. }) => assert_eq!(flag, "dhcpServices"),
        other => panic!("expected an error naming --dhcpServices, got {other:?}"),
    }
    assert!(T::try_parse_from(["t", "pod", "--services", "--dhcpMode"]).is_err());
}

/// Trial finding: the DHCP-mode manifests ran unprivileged, where `/proc/sys` is read-only
/// and vipd refuses every macvlan on a stock host (`arp_ignore` 0). With `--dhcpServices`
/// the container is privileged (and nothing contradicts it); without, unchanged.
#[test]
fn dhcp_mode_manifests_are_privileged_and_others_are_not() {
    let mut v = vec![
        "t",
        "daemonset",
        "--services",
        "--inCluster",
        "--dhcpServices",
    ];
    let yaml = run(&T::try_parse_from(v.clone()).unwrap().cmd).unwrap();
    assert!(yaml.contains("privileged: true"), "{yaml}");
    assert!(!yaml.contains("allowPrivilegeEscalation: false"), "{yaml}");
    assert!(!yaml.contains("NET_ADMIN"), "{yaml}");
    v.pop();
    let yaml = run(&T::try_parse_from(v).unwrap().cmd).unwrap();
    assert!(!yaml.contains("privileged"), "{yaml}");
    assert!(yaml.contains("NET_ADMIN") && yaml.contains("allowPrivilegeEscalation: false"));
    let yaml = run(&T::try_parse_from([
        "t",
        "pod",
        "--services",
        "--interface",
        "eth0",
        "--dhcpServices=1",
    ])
    .unwrap()
    .cmd)
    .unwrap();
    assert!(yaml.contains("privileged: true"), "{yaml}");
}

/// Issue 29: kube-vip's routing-table flags (`--table`, `--tableID`, `--tableType`,
/// `--routingProtocol`, `--cleanRoutingTable`, cmd/kube-vip.go) write their variables,
/// `--arp=false` goes with them, and the container is privileged (vipd opens
/// `/dev/net/tun` for the IPv4 routes' fence devices and sets a `/proc/sys` value); the
/// manager's own checks refuse what it would refuse, naming the variable and the value.
#[test]
fn routing_table_flags_write_their_variables_and_a_privileged_container() {
    let flags = [
        "--services",
        "--servicesElection",
        "--table",
        "--arp=false",
        "--tableID=1000",
        "--tableType=1",
        "--routingProtocol=99",
        "--cleanRoutingTable",
    ];
    let p = plan(&flags).unwrap();
    assert!(p.privileged);
    for (k, v) in [
        ("vip_routingtable", "true"),
        ("vip_arp", "false"),
        ("vip_routingtableid", "1000"),
        ("vip_routingtabletype", "1"),
        ("vip_routingprotocol", "99"),
        ("vip_cleanroutingtable", "true"),
    ] {
        assert!(
            p.env
                .iter()
                .any(|(n, e)| *n == k && *e == EnvValue::Text(v.into())),
            "{k}={v} in {:?}",
            p.env
        );
    }
    let mut args = vec!["t", "daemonset", "--inCluster"];
    args.extend(flags);
    let yaml = run(&T::try_parse_from(args).unwrap().cmd).unwrap();
    assert!(yaml.contains("privileged: true"), "{yaml}");
    // Lease timings given are the Service leases' too: written as given, not replaced.
    let p = plan(&[
        "--services",
        "--servicesElection",
        "--table",
        "--leaseDuration=10",
        "--leaseRenewDuration=7",
        "--leaseRetry=2",
    ])
    .unwrap();
    assert!(
        !p.env.iter().any(|(n, _)| n.starts_with("svc_lease")),
        "{:?}",
        p.env
    );
    // The manager's refusals, with the variable and the value.
    let e = plan(&[
        "--services",
        "--servicesElection",
        "--table",
        "--tableID=254",
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("vip_routingtableid") && e.contains("254"), "{e}");
    let e = plan(&["--services", "--servicesElection", "--arp=false"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("vip_arp"), "{e}");
}

/// kube-vip's `--dhcpBackoffAttempts` writes `dhcp_backoff_attempts` as given (the
/// manager checks it: a negative count is its error, naming the flag); unset, nothing is
/// written and vipd retries forever.
#[test]
fn dhcp_backoff_attempts_flag_is_passed_through() {
    let base = ["--interface", "eth0", "--services"];
    let with = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        plan(&args)
    };
    let p = with(&["--dhcpBackoffAttempts", "3"]).unwrap();
    assert!(
        text_env(&p).contains(&("dhcp_backoff_attempts", "3".to_string())),
        "{:?}",
        text_env(&p)
    );
    let p = with(&[]).unwrap();
    assert!(
        !text_env(&p)
            .iter()
            .any(|(k, _)| *k == "dhcp_backoff_attempts")
    );
    let e = with(&["--dhcpBackoffAttempts=-1"]).unwrap_err().to_string();
    assert!(
        e.contains("--dhcpBackoffAttempts") && e.contains("\"-1\""),
        "{e}"
    );
}

/// Flags the output would silently drop are refused, naming the flag: `--k8sConfigPath`
/// with `--inCluster`, and `--image`, `--taint`, `--kubeadm-init` for a systemd unit or its
/// EnvironmentFile.
#[test]
fn flags_the_output_would_drop_are_refused() {
    let run_args = |args: &[&str]| run(&T::try_parse_from(args).unwrap().cmd);
    let names = |args: &[&str], flag: &str| match run_args(args) {
        Err(ManifestError::Invalid { flag: f, .. }) => assert_eq!(f, flag, "{args:?}"),
        other => panic!("{args:?}: expected an error naming --{flag}, got {other:?}"),
    };
    names(
        &[
            "t",
            "daemonset",
            "--services",
            "--inCluster",
            "--k8sConfigPath",
            "/x/kubeconfig",
        ],
        "k8sConfigPath",
    );
    assert!(run_args(&["t", "daemonset", "--services", "--inCluster"]).is_ok());
    assert!(
        run_args(&[
            "t",
            "daemonset",
            "--services",
            "--k8sConfigPath",
            "/x/kubeconfig"
        ])
        .is_ok()
    );
    let cp = [
        "t",
        "systemd",
        "--environment-file",
        "--controlplane",
        "--address",
        "192.0.2.10",
    ];
    for (extra, flag) in [
        (&["--image", "example.com/vipd:1"][..], "image"),
        (&["--taint"][..], "taint"),
        (&["--kubeadm-init"][..], "kubeadm-init"),
    ] {
        names(&[&cp[..], extra].concat(), flag);
    }
    names(&["t", "systemd", "--image", "example.com/vipd:1"], "image");
    assert!(run_args(&[&cp[..], &["--taint=false", "--kubeadm-init=false"][..]].concat()).is_ok());
    assert!(run_args(&["t", "systemd"]).is_ok());
}

/// kube-vip's `--servicesLeaseName` writes `svc_leasename`.
#[test]
fn services_lease_name_flag_writes_svc_leasename() {
    let p = plan(&["--services", "--servicesLeaseName", "my-svcs-lock"]).unwrap();
    assert!(
        text_env(&p).contains(&("svc_leasename", "my-svcs-lock".to_string())),
        "{:?}",
        text_env(&p)
    );
    let p = plan(&["--services"]).unwrap();
    assert!(!text_env(&p).iter().any(|(k, _)| *k == "svc_leasename"));
}

/// Trial finding: flags that are written but do nothing in that combination get a warning
/// (the output is unchanged): `--dhcpBackoffAttempts` without `--services`,
/// `--servicesLeaseName` with `--servicesElection`.
#[test]
fn flags_without_effect_in_their_combination_are_warned_about() {
    let w = |args: &[&str]| {
        let mut v = vec!["t", "pod"];
        v.extend(args);
        warnings(&T::try_parse_from(v).unwrap().cmd)
    };
    let one = w(&[
        "--controlplane",
        "--address",
        "192.0.2.10",
        "--dhcpBackoffAttempts",
        "3",
    ]);
    assert!(
        one.len() == 1
            && one[0].contains("--dhcpBackoffAttempts=3")
            && one[0].contains("--services"),
        "{one:?}"
    );
    assert!(w(&["--services", "--dhcpBackoffAttempts", "3"]).is_empty());
    let two = w(&[
        "--services",
        "--servicesElection",
        "--servicesLeaseName",
        "x",
    ]);
    assert!(
        two.len() == 1 && two[0].contains("--servicesLeaseName=x"),
        "{two:?}"
    );
    assert!(w(&["--services", "--servicesLeaseName", "x"]).is_empty());
}

/// Trial finding: the documented fast profile could not be generated (`--nftFence` was
/// missing), and its timings without the fence were generated although the manager refuses
/// them. Now the millisecond fence is on by default: the fast profile is generated as is,
/// `--nftFence` writes `vip_nftfence`, and with `--nftFence=false` the timings are refused,
/// naming the value, as the manager does (one check, `config::resolve`).
#[test]
fn the_fast_profile_gets_the_millisecond_fence_by_default() {
    let fast = [
        "--controlplane",
        "--interface",
        "eth0",
        "--address",
        "192.0.2.10",
        "--leaseDuration",
        "0.6",
        "--leaseRenewDuration",
        "0.4",
        "--leaseRetry",
        "0.2",
    ];
    let p = plan(&fast).unwrap();
    assert!(
        !text_env(&p).iter().any(|(k, _)| *k == "vip_nftfence"),
        "the default needs no option: {:?}",
        text_env(&p)
    );
    let e = plan(&[&fast[..], &["--nftFence=false"][..]].concat())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("vip_leaseduration") && e.contains("\"0.6\""),
        "{e}"
    );
    let p = plan(&[&fast[..], &["--nftFence"][..]].concat()).unwrap();
    assert!(
        text_env(&p).contains(&("vip_nftfence", "true".to_string())),
        "{:?}",
        text_env(&p)
    );
    let e = plan(&[&fast[..10], &["0.001", "--nftFence"][..]].concat())
        .unwrap_err()
        .to_string();
    assert!(e.contains("vip_retryperiod") && e.contains("0.1 s"), "{e}");
}

/// Issue 27 (b): with `--servicesRideThrough` the generator writes Service lease timings
/// with which a ride starts within the API fence (the manager refuses the others with
/// ride-through), unless the lease timings it writes already allow it; ride-through is the
/// default, so only `--servicesRideThrough=false` leaves them out.
#[test]
fn ride_through_gets_service_timings_it_works_with() {
    let base = ["--services", "--interface", "eth0"];
    let svc = |p: &Deployment| -> Vec<(&'static str, String)> {
        text_env(p)
            .into_iter()
            .filter(|(k, _)| {
                ["svc_leaseduration", "svc_renewdeadline", "svc_retryperiod"].contains(k)
            })
            .collect()
    };
    let p = plan(&[&base[..], &["--servicesRideThrough"][..]].concat()).unwrap();
    assert_eq!(
        svc(&p),
        vec![
            ("svc_leaseduration", "5".to_string()),
            ("svc_renewdeadline", "3".to_string()),
            ("svc_retryperiod", "1".to_string()),
        ]
    );
    // Ride-through is vipd's default: the generator writes the timings without the flag
    // too, and not when it is turned off.
    assert_eq!(svc(&plan(&base).unwrap()), svc(&p));
    let off = plan(&[&base[..], &["--servicesRideThrough=false"][..]].concat()).unwrap();
    assert!(svc(&off).is_empty());
    let long = [
        "--servicesRideThrough",
        "--leaseDuration",
        "6",
        "--leaseRenewDuration",
        "4",
    ];
    assert!(svc(&plan(&[&base[..], &long[..]].concat()).unwrap()).is_empty());
}
