//! The generator cases shared by the golden-file tests (`tests/manifest_golden.rs`) and the
//! lab dry-run test (`tests/lab_deploy.rs`): name (= golden file stem) and argv after
//! `vipd manifest`.

#![allow(dead_code)]

/// Image used by most cases so golden files do not change with the version.
pub const IMAGE: &str = "--image=registry.example/vipd:test";

/// The command of the k3s HA how-to, verbatim.
pub const K3S: &[&str] = &[
    "pod",
    "--interface",
    "eth0",
    "--address",
    "192.0.2.10",
    "--controlplane",
    "--services",
    "--arp",
    "--leaderElection",
    "--vipSubnet",
    "16",
    "--servicesElection",
    "--enableLoadBalancer",
    "--k8sConfigPath",
    "/etc/rancher/k3s/k3s.yaml",
];

/// `vipd manifest systemd --environment-file` for the control-plane VIP 192.0.2.10 on eth0
/// (the checked-in manifests/vipd.env; the golden case adds a kubeconfig path).
pub const SYSTEMD_ENV: &[&str] = &[
    "systemd",
    "--environment-file",
    "--controlplane",
    "--address",
    "192.0.2.10",
    "--interface",
    "eth0",
];

/// Cases that must generate a manifest: (golden name, argv).
pub fn ok_cases() -> Vec<(&'static str, Vec<&'static str>)> {
    let cp = [
        "--controlplane",
        "--address",
        "192.0.2.10",
        "--interface",
        "eth0",
    ];
    let mut v: Vec<(&'static str, Vec<&'static str>)> = vec![
        ("pod-k3s", K3S.to_vec()),
        ("pod-cp", [&["pod", IMAGE][..], &cp].concat()),
        ("pod-svc", vec!["pod", IMAGE, "--services"]),
        (
            "pod-svc-address",
            vec!["pod", IMAGE, "--services", "--address", "192.0.2.20"],
        ),
        (
            "pod-cp-svc",
            [&["pod", IMAGE, "--services"][..], &cp].concat(),
        ),
        (
            "pod-cp-kubeadm-init",
            [&["pod", IMAGE, "--kubeadm-init"][..], &cp].concat(),
        ),
        (
            "pod-cp-dualstack",
            vec![
                "pod",
                IMAGE,
                "--controlplane",
                "--address",
                "192.0.2.10,2001:db8::10",
                "--vipSubnet",
                "32,128",
            ],
        ),
        (
            "pod-cp-timings-no-metrics",
            [
                &[
                    "pod",
                    IMAGE,
                    "--leaseDuration",
                    "15",
                    "--leaseRenewDuration",
                    "10",
                    "--leaseRetry",
                    "2",
                    "--prometheusHTTPServer=",
                    "--port",
                    "6444",
                ][..],
                &cp,
            ]
            .concat(),
        ),
        (
            "ds-cp-taint",
            [&["daemonset", IMAGE, "--taint"][..], &cp].concat(),
        ),
        ("ds-cp", [&["daemonset", IMAGE][..], &cp].concat()),
        (
            "ds-svc-incluster",
            vec!["daemonset", IMAGE, "--services", "--inCluster"],
        ),
        (
            "ds-svc-address",
            vec!["daemonset", IMAGE, "--services", "--address", "192.0.2.20"],
        ),
        (
            "ds-svc-election-taint-lbclass",
            vec![
                "daemonset",
                IMAGE,
                "--services",
                "--servicesElection",
                "--inCluster",
                "--taint",
                "--lbClassOnly",
                "--serviceInterface",
                "eth1",
                "--namespace",
                "vipd-system",
            ],
        ),
        (
            "ds-cp-svc-taint-incluster",
            [
                &["daemonset", IMAGE, "--services", "--taint", "--inCluster"][..],
                &cp,
            ]
            .concat(),
        ),
    ];
    v.sort_by_key(|(n, _)| *n);
    v
}

/// Non-Kubernetes outputs with golden files: (golden name with extension, argv).
pub fn other_cases() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        // The peer key Secret is random (tests/manifest_golden.rs checks it apart).
        ("rbac.yaml", vec!["rbac", "--peerKey=false"]),
        (
            "rbac-node-labeling.yaml",
            vec!["rbac", "--enableNodeLabeling", "--peerKey=false"],
        ),
        (
            "rbac-no-ridethrough.yaml",
            vec!["rbac", "--servicesRideThrough=false"],
        ),
        ("vipd.service", vec!["systemd"]),
        (
            "vipd.env",
            [
                SYSTEMD_ENV,
                &["--k8sConfigPath", "/etc/rancher/k3s/k3s.yaml"],
            ]
            .concat(),
        ),
    ]
}

/// `vipd manifest bird|frr` cases: (golden file name, argv). Also checked by the daemons
/// themselves (`bird -p`, `vtysh --dryrun`) in tests/routed_config.rs.
pub fn routed_cases() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "bird.conf",
            vec![
                "bird",
                "--bgpRouterID",
                "198.51.100.11",
                "--bgppeers",
                "198.51.100.1:65001,[2001:db8:1::1]:65001",
            ],
        ),
        (
            "bird-peeraddress-multihop.conf",
            vec![
                "bird",
                "--localAS",
                "4200000001",
                "--peerAddress",
                "203.0.113.1",
                "--peerAS",
                "65010",
                "--peerPass",
                "s3cret",
                "--multihop",
                "--sourceIP",
                "198.51.100.11",
                "--bgpHoldTimer",
                "9",
                "--bgpKeepAliveInterval",
                "3",
                "--tableID",
                "200",
            ],
        ),
        // kube-vip's defaults: local and peer AS 65000 (iBGP), the peer on the segment;
        // BIRD would take it as multihop (whose BFD needs a local address) without `direct`.
        (
            "bird-ibgp.conf",
            vec![
                "bird",
                "--bgpRouterID",
                "198.51.100.11",
                "--bgppeers",
                "198.51.100.1:65000",
            ],
        ),
        (
            "frr.conf",
            vec![
                "frr",
                "--bgpRouterID",
                "198.51.100.11",
                "--bgppeers",
                "198.51.100.1:65001:s3cret:false:::true;100;100;3,[2001:db8:1::1]:65001",
            ],
        ),
        (
            "frr-unnumbered.conf",
            vec!["frr", "--bgppeers", "unnumbered:eth1,unnumbered:eth2:65001"],
        ),
    ]
}

/// Cases that must be refused: (argv, text the error must contain).
pub fn err_cases() -> Vec<(Vec<&'static str>, &'static str)> {
    vec![
        // vipd manifest bird|frr: the setting and the value are named.
        (vec!["bird"], "no BGP peer"),
        (
            vec!["bird", "--bgppeers", "198.51.100.1:4294967296"],
            "flag --bgppeers (bgp_peers): peer 1 (198.51.100.1:4294967296): AS 4294967296 is out of range",
        ),
        (
            vec!["frr", "--peerAddress", "198.51.100.999"],
            "invalid value \"198.51.100.999\" for flag --peerAddress (bgp_peeraddress)",
        ),
        (
            vec!["bird", "--peerAddress", "198.51.100.1", "--localAS", "0"],
            "flag --localAS (bgp_as): AS 0 is reserved",
        ),
        (
            vec![
                "bird",
                "--peerAddress",
                "198.51.100.1",
                "--bgpKeepAliveInterval",
                "30",
            ],
            "for flag --bgpKeepAliveInterval (bgp_keepalive_interval): the keepalive interval must be shorter than the hold time",
        ),
        (
            vec!["bird", "--bgppeers", "198.51.100.1:65001:pass word"],
            "\"198.51.100.1:65001:<hidden>\"",
        ),
        (
            vec!["bird", "--bgppeers", "198.51.100.1:65001:pa:ss"],
            "\"198.51.100.1:65001:<hidden>\" for flag --bgppeers (bgp_peers): peer 1 (198.51.100.1:65001): multihop (a field after the password) is not valid; its value is not shown",
        ),
        (
            vec!["bird", "--bgppeers", "198.51.100.1:65001::true"],
            "peer 1 (198.51.100.1) is multihop with BFD: BIRD's multihop BFD needs the local address: set bgp_sourceip",
        ),
        (
            vec![
                "bird",
                "--bgppeers",
                "198.51.100.1:65001::true",
                "--sourceIP",
                "198.51.100.11",
                "--sourceIF",
                "eth0",
            ],
            "BIRD cannot bind a multihop session to an interface (bgp_sourceif=eth0)",
        ),
        (
            vec!["bird", "--bgppeers", "unnumbered:eth1"],
            "vipd manifest bird: peer 1 (unnumbered:eth1): BIRD needs the peer's address",
        ),
        // A bad value is named by the generator flag that gave it, not by the
        // environment variable the manager would read.
        (
            vec![
                "pod",
                "--controlplane",
                "--address",
                "192.0.2.10",
                "--vipSubnet",
                "abc",
            ],
            "invalid value \"abc\" for flag --vipSubnet (vip_subnet)",
        ),
        (
            vec!["pod", "--controlplane"],
            "cp_enable needs at least one VIP",
        ),
        (
            vec!["daemonset", "--controlplane", "--taint"],
            "cp_enable needs at least one VIP",
        ),
        (vec!["pod"], "nothing to do"),
        // One node's address as the admin endpoint of a DaemonSet (every node).
        (
            vec![
                "daemonset",
                "--services",
                "--inCluster",
                "--prometheusHTTPServer",
                "192.0.2.11:9999",
            ],
            "a DaemonSet runs on every node",
        ),
        // Generator flags for the unit itself (they belong in its EnvironmentFile).
        (
            vec!["systemd", "--controlplane", "--address", "192.0.2.10"],
            "go into the EnvironmentFile",
        ),
        // kube-vip generator flags of features vipd does not implement.
        (vec!["pod", "--services", "--bgp"], "bgp_enable"),
        (
            vec!["daemonset", "--services", "--wireguard=true"],
            "WireGuard",
        ),
        // DaemonSet-only flags on a static pod.
        (
            vec![
                "pod",
                "--controlplane",
                "--address",
                "192.0.2.10",
                "--inCluster",
            ],
            "a static pod cannot use a ServiceAccount",
        ),
        (
            vec!["pod", "--services", "--taint"],
            "applies to `manifest daemonset` only",
        ),
        (
            vec![
                "pod",
                "--services",
                "--enableLoadBalancer",
                "--lbForwardingMethod",
                "directroute",
            ],
            "lb_fwdmethod",
        ),
        (
            vec![
                "daemonset",
                "--services",
                "--enableLoadBalancer",
                "--lbPort=0",
            ],
            "lb_port",
        ),
        (
            vec![
                "pod",
                "--controlplane",
                "--address",
                "192.0.2.10",
                "--arp=false",
            ],
            "vip_arp",
        ),
        (
            vec![
                "pod",
                "--controlplane",
                "--address",
                "192.0.2.10",
                "--leaderElection=false",
            ],
            "vip_leaderelection",
        ),
        (
            vec!["pod", "--services", "--kubeadm-init"],
            "--kubeadm-init",
        ),
        (
            vec!["pod", "--controlplane", "--address", "vip.example"],
            "address",
        ),
        (
            vec![
                "pod",
                "--controlplane",
                "--address",
                "192.0.2.10",
                "--leaseDuration",
                "2",
            ],
            "shorter than the lease duration",
        ),
        (
            vec!["pod", "--services", "--k8sConfigPath", "k3s.yaml"],
            "absolute path",
        ),
        (
            vec!["systemd", "--environment-file", "--services", "--inCluster"],
            "--inCluster",
        ),
    ]
}
