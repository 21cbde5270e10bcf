//! Tests of configuration resolution, the option table and the command line.

use super::args::*;
use super::options::*;
use super::resolve::*;
use super::*;
use crate::lease::LeaseConfig;
use clap::CommandFactory;
use clap::Parser;
use std::collections::HashMap;

/// A control-plane setup that resolves cleanly; cases override entries.
mod bad;
mod table;

const BASE: &[(&str, &str)] = &[
    ("cp_enable", "true"),
    ("address", "192.0.2.50"),
    ("vip_nodename", "node-a"),
];

fn args(flags: &[&str]) -> ManagerArgs {
    ManagerArgs::try_parse_from(std::iter::once("manager").chain(flags.iter().copied())).unwrap()
}

/// Resolve with `BASE` overridden by `env` (a value of "<unset>" removes the variable),
/// the given flags and file, and the hostname "Node-A".
fn run_with_host(
    flags: &[&str],
    env: &[(&str, &str)],
    file: Option<&str>,
    host: Option<&str>,
) -> Result<Resolved, ConfigError> {
    let mut map: HashMap<String, String> = HashMap::new();
    for (k, v) in BASE.iter().chain(env) {
        if *v == "<unset>" {
            map.remove(*k);
        } else {
            map.insert((*k).to_string(), (*v).to_string());
        }
    }
    let lookup = move |k: &str| map.get(k).cloned();
    let host = host.map(str::to_string);
    resolve_detailed(&args(flags), &lookup, file, &move || host.clone())
}

fn run(flags: &[&str], env: &[(&str, &str)], file: Option<&str>) -> Result<Resolved, ConfigError> {
    run_with_host(flags, env, file, Some("Node-A"))
}

fn ok(flags: &[&str], env: &[(&str, &str)], file: Option<&str>) -> Resolved {
    match run(flags, env, file) {
        Ok(r) => r,
        Err(e) => panic!("expected success for flags {flags:?} env {env:?}, got: {e}"),
    }
}

#[test]
fn service_lease_timings_default_to_the_control_plane_ones() {
    let c = ok(
        &[],
        &[("vip_leaseduration", "7"), ("vip_renewdeadline", "4")],
        None,
    )
    .config;
    assert_eq!(c.services_timing.lease_duration, Duration::from_secs(7));
    assert_eq!(c.services_timing.renew_deadline, Duration::from_secs(4));
    assert_eq!(c.services_timing.retry_period, Duration::from_secs(1));
    let c = ok(
        &["--servicesLeaseRetry=2"],
        &[("svc_leaseduration", "15"), ("svc_renewdeadline", "10")],
        None,
    )
    .config;
    assert_eq!(c.services_timing.lease_duration, Duration::from_secs(15));
    assert_eq!(c.services_timing.renew_deadline, Duration::from_secs(10));
    assert_eq!(c.services_timing.retry_period, Duration::from_secs(2));
    assert_eq!(
        c.lease.timing.lease_duration, DEFAULT_LEASE_DURATION,
        "control plane unchanged"
    );
    assert!(!c.ipv6_dad);
    assert!(ok(&["--ipv6DAD"], &[], None).config.ipv6_dad);
}

#[test]
fn config_defaults() {
    let r = ok(&[], &[("vip_nodename", "<unset>")], None);
    let c = r.config;
    assert_eq!(c.node_name, "node-a", "hostname lower-cased");
    assert_eq!(c.interface, None);
    assert_eq!(c.addresses, vec!["192.0.2.50".parse::<IpAddr>().unwrap()]);
    assert_eq!(c.vip_subnet, VipSubnet { v4: 32, v6: 128 });
    assert_eq!(c.port, 6443);
    assert!(c.arp && c.leader_election && c.control_plane && !c.services);
    assert_eq!(c.arp_rate, Duration::from_millis(3000));
    assert_eq!(
        c.lease,
        LeaseConfig {
            name: "plndr-cp-lock".into(),
            namespace: "kube-system".into(),
            timing: Timing {
                lease_duration: Duration::from_secs(3),
                renew_deadline: Duration::from_secs(2),
                retry_period: Duration::from_secs(1),
            },
        }
    );
    assert!(!c.services_election);
    assert_eq!(c.services_lease_name, "plndr-svcs-lock");
    assert_eq!(c.services_namespace, None);
    assert!(!c.lb_class_only);
    assert_eq!(c.lb_class_name, "kube-vip.io/kube-vip-class");
    assert_eq!(c.services_interface, None);
    assert_eq!(
        c.prometheus_server.map(|l| l.to_string()).as_deref(),
        Some(":2112")
    );
    assert_eq!(c.kubeconfig, None);
    assert_eq!(c.kubernetes_addr, None);
    assert!(!c.enable_node_labeling);
    assert_eq!(
        c.dhcp_backoff_attempts, 0,
        "vipd retries forever by default"
    );
    assert_eq!(c.log_level, LogLevel::Info);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn config_env_overrides_flag() {
    let c = ok(
        &["--leaseDuration=10", "--interface=eth1"],
        &[("vip_leaseduration", "8")],
        None,
    )
    .config;
    assert_eq!(
        c.lease.timing.lease_duration,
        Duration::from_secs(8),
        "env wins over flag"
    );
    assert_eq!(
        c.interface.as_deref(),
        Some("eth1"),
        "flag used where env is unset"
    );
    // kube-vip ignores empty environment values: the flag still applies.
    let c = ok(&["--interface=eth1"], &[("vip_interface", "")], None).config;
    assert_eq!(c.interface.as_deref(), Some("eth1"));
    // An env-origin error names the variable, a flag-origin error the flag.
    let e = run(&["--port=1"], &[("port", "x")], None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("environment variable port") && !e.contains("--port"),
        "{e}"
    );
}

#[test]
fn config_file_only_fills_unset() {
    let yaml = "vip_interface: eth2\nvip_leaseduration: 7.5\nvip_renewdeadline: 4\nport: 8443\n\
                vip_servicesinterface: ~\nenable_node_labeling: true\nvip_leasename: from-file\n";
    let c = ok(
        &["--port=7443"],
        &[("vip_leasename", "from-env")],
        Some(yaml),
    )
    .config;
    assert_eq!(c.interface.as_deref(), Some("eth2"), "file fills unset");
    assert_eq!(
        c.lease.timing.lease_duration,
        Duration::from_millis(7500),
        "YAML float"
    );
    assert_eq!(
        c.lease.timing.renew_deadline,
        Duration::from_secs(4),
        "YAML integer"
    );
    assert_eq!(c.port, 7443, "flag wins over file");
    assert_eq!(c.lease.name, "from-env", "env wins over file");
    assert!(c.enable_node_labeling, "YAML bool");
    assert_eq!(c.services_interface, None, "null = unset");
    // Empty file and empty-string values are fine.
    assert_eq!(ok(&[], &[], Some("")).config, ok(&[], &[], None).config);
    let c = ok(&[], &[], Some("vip_interface: \"\"\n")).config;
    assert_eq!(c.interface, None);
}

/// The control-plane VIP and Service addresses follow one rule (`net::vip::check_vip`):
/// every address class gets the same verdict from both parsers (`0.0.0.0` and `::`
/// aside, which ask a Service for DHCP).
#[test]
fn control_plane_and_service_addresses_follow_one_rule() {
    let cases: &[(&str, bool)] = &[
        ("192.0.2.10", true),
        ("10.1.2.3", true),
        ("2001:db8::10", true),
        ("127.0.0.1", false),
        ("::1", false),
        ("224.0.0.5", false),
        ("ff02::1", false),
        ("169.254.1.1", false),
        ("fe80::1", false),
        ("255.255.255.255", false),
        ("0.1.2.3", false),
        ("::ffff:192.0.2.1", false),
        ("::192.0.2.1", false),
    ];
    for (addr, usable) in cases {
        let cp = run(&[], &[("address", addr)], None);
        assert_eq!(cp.is_ok(), *usable, "control plane {addr}: {:?}", cp.err());
        if let Err(e) = cp {
            assert!(e.to_string().contains(addr), "{e}");
        }
        let svc = crate::services::plan::model::parse_address_list(addr);
        assert_eq!(svc.addresses.len() == 1, *usable, "Service {addr}: {svc:?}");
        assert_eq!(svc.rejected.len() == 1, !*usable, "Service {addr}: {svc:?}");
    }
}

#[test]
fn config_vip_address_alias() {
    let r = ok(
        &[],
        &[("address", "<unset>"), ("vip_address", "192.0.2.60")],
        None,
    );
    assert_eq!(
        r.config.addresses,
        vec!["192.0.2.60".parse::<IpAddr>().unwrap()]
    );
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("vip_address") && w.contains("deprecated")),
        "{:?}",
        r.warnings
    );
    // Both set: address wins, the alias is reported as ignored.
    let r = ok(&[], &[("vip_address", "192.0.2.60")], None);
    assert_eq!(
        r.config.addresses,
        vec!["192.0.2.50".parse::<IpAddr>().unwrap()]
    );
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("vip_address") && w.contains("ignored")),
        "{:?}",
        r.warnings
    );
    // The --vip flag is the same alias.
    let r = ok(&["--vip=192.0.2.61"], &[("address", "<unset>")], None);
    assert_eq!(
        r.config.addresses,
        vec!["192.0.2.61".parse::<IpAddr>().unwrap()]
    );
    assert!(
        r.warnings.iter().any(|w| w.contains("--vip")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn config_vip_cidr_alias_and_subnet_forms() {
    let r = ok(&[], &[("vip_cidr", "24")], None);
    assert_eq!(r.config.vip_subnet, VipSubnet { v4: 24, v6: 128 });
    assert!(
        r.warnings.iter().any(|w| w.contains("vip_cidr")),
        "{:?}",
        r.warnings
    );
    let r = ok(&[], &[("vip_cidr", "24"), ("vip_subnet", "28")], None);
    assert_eq!(r.config.vip_subnet.v4, 28, "vip_subnet wins over vip_cidr");
    // kube-vip's per-address form, in address order (IPv6 first here).
    let c = ok(
        &[],
        &[
            ("address", "2001:db8::50, 192.0.2.50"),
            ("vip_subnet", "64,/24"),
        ],
        None,
    )
    .config;
    assert_eq!(c.vip_subnet, VipSubnet { v4: 24, v6: 64 });
    assert_eq!(c.addresses.len(), 2);
    // The v4,v6 form when the count does not match the addresses.
    let c = ok(&[], &[("vip_subnet", "30,120")], None).config;
    assert_eq!(c.vip_subnet, VipSubnet { v4: 30, v6: 120 });
}

/// A control-plane VIP that is the network or broadcast address of its own prefix
/// (`vip_subnet`) is refused, naming `address`, the value and the subnet; /31, /32, IPv6
/// /127 and /128 have no such addresses, and IPv6 has no broadcast (only the Subnet-Router
/// anycast address, refused as the network address).
#[test]
fn control_plane_vip_on_its_own_subnet_edge_is_refused() {
    let refused: &[(&str, &str, &str)] = &[
        ("192.0.2.0", "24", "network address of 192.0.2.0/24"),
        ("192.0.2.255", "24", "broadcast address of 192.0.2.0/24"),
        ("192.0.2.63", "26", "broadcast address of 192.0.2.0/26"),
        ("2001:db8::", "64", "network address of 2001:db8::/64"),
    ];
    for (addr, prefix, says) in refused {
        let e = run(&[], &[("address", addr), ("vip_subnet", prefix)], None).unwrap_err();
        assert_eq!(e.key(), Some("address"), "{e}");
        assert_eq!(e.value(), Some(*addr), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(says) && msg.contains("vip_subnet"), "{msg}");
    }
    let usable: &[(&str, &str)] = &[
        ("192.0.2.0", "31"),
        ("192.0.2.1", "31"),
        ("192.0.2.255", "32"),
        ("192.0.2.0", "32"),
        ("192.0.2.50", "24"),
        ("2001:db8::", "127"),
        ("2001:db8::", "128"),
        ("2001:db8::ffff:ffff:ffff:ffff", "64"),
    ];
    for (addr, prefix) in usable {
        let r = run(&[], &[("address", addr), ("vip_subnet", prefix)], None);
        assert!(r.is_ok(), "{addr}/{prefix}: {:?}", r.err());
    }
}

/// `prometheus_server` accepts exactly what the admin endpoint binds (one parser,
/// [`crate::syntax::ListenAddr`]): host names other than localhost are refused here, not
/// when the listener starts.
#[test]
fn prometheus_server_is_what_the_listener_binds() {
    let sa = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
    let accepted: &[(&str, Vec<std::net::SocketAddr>)] = &[
        (":2112", vec![sa("[::]:2112"), sa("0.0.0.0:2112")]),
        ("0.0.0.0:2112", vec![sa("0.0.0.0:2112")]),
        ("[::1]:2112", vec![sa("[::1]:2112")]),
        ("localhost:2112", vec![sa("127.0.0.1:2112")]),
    ];
    for (v, binds) in accepted {
        let c = ok(&[], &[("prometheus_server", v)], None).config;
        let l = c.prometheus_server.expect("enabled");
        assert_eq!(&l.socket_addrs(), binds, "{v}");
        assert_eq!(l.to_string(), *v);
    }
    let refused: &[(&str, &str)] = &[
        ("myhost:2112", "\"myhost\" is not an IP address"),
        (
            "[::1:2112",
            "an IPv6 host in brackets must be followed by ]:port",
        ),
    ];
    for (v, says) in refused {
        let e = run(&[], &[("prometheus_server", v)], None).unwrap_err();
        assert_eq!(e.key(), Some("prometheus_server"), "{e}");
        assert_eq!(e.value(), Some(*v), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(says), "{msg}");
    }
    // Empty: the flag disables the endpoint; the environment variable counts as unset.
    let c = ok(&["--prometheusHTTPServer="], &[], None).config;
    assert_eq!(c.prometheus_server, None);
    let c = ok(&[], &[("prometheus_server", "")], None).config;
    assert_eq!(
        c.prometheus_server.map(|l| l.to_string()).as_deref(),
        Some(":2112")
    );
}

/// The configuration's warnings are logged after the log output is set up (before it, a
/// `tracing::warn!` goes nowhere), at the configured level.
#[test]
fn config_warnings_are_logged_after_logging_is_set_up() {
    let r = ok(&[], &[("vip_cidr", "32"), ("vip_loglevel", "3")], None);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    let (subscriber, lines) = crate::obs::logging::capture::subscriber();
    let marker = lines.clone();
    let cfg = tracing::subscriber::with_default(subscriber, || {
        r.init_logging_then_warn(|level| {
            marker.lock().unwrap().push(format!("init {level:?}"));
        })
    });
    assert_eq!(cfg.log_level, LogLevel::Warn);
    let lines = lines.lock().unwrap();
    assert_eq!(
        lines.first().map(String::as_str),
        Some("init Warn"),
        "{lines:?}"
    );
    assert!(
        lines[1..]
            .iter()
            .any(|l| l.contains("WARN") && l.contains("vip_cidr is deprecated")),
        "{lines:?}"
    );
}

#[test]
fn config_go_parse_bool_forms_and_bare_flags() {
    for t in ["1", "t", "T", "TRUE", "true", "True"] {
        assert!(
            ok(&[], &[("enable_node_labeling", t)], None)
                .config
                .enable_node_labeling,
            "{t}"
        );
    }
    for f in ["0", "f", "F", "FALSE", "false", "False"] {
        assert!(
            !ok(&[], &[("enable_node_labeling", f)], None)
                .config
                .enable_node_labeling,
            "{f}"
        );
    }
    for bad in ["yes", "on", "tRUE", " true"] {
        assert!(
            run(&[], &[("enable_node_labeling", bad)], None).is_err(),
            "{bad}"
        );
    }
    // pflag style: a bare boolean flag means true, and does not eat the next argument.
    let c = ok(
        &["--services", "--enableNodeLabeling"],
        &[("cp_enable", "<unset>"), ("address", "<unset>")],
        None,
    )
    .config;
    assert!(c.services && c.enable_node_labeling && !c.control_plane);
    assert!(ManagerArgs::try_parse_from(["manager", "--services", "true"]).is_err());
}

#[test]
fn config_decimal_and_whole_seconds() {
    let c = ok(
        &[],
        &[
            ("vip_leaseduration", "4"),
            ("vip_renewdeadline", "2.5"),
            ("vip_retryperiod", "0.5"),
        ],
        None,
    )
    .config;
    assert_eq!(c.lease.timing.lease_duration, Duration::from_secs(4));
    assert_eq!(c.lease.timing.renew_deadline, Duration::from_millis(2500));
    assert_eq!(c.lease.timing.retry_period, Duration::from_millis(500));
}

#[test]
fn config_services_and_misc_values() {
    let r = ok(
        &["--services", "--prometheusHTTPServer="],
        &[
            ("svc_election", "true"),
            ("svc_ridethrough", "true"),
            ("svc_namespace", "apps"),
            ("lb_class_name", ""),
            ("dhcp_mode", "false"),
            ("vip_servicesinterface", "eth1"),
            ("k8s_config_file", "/etc/kubernetes/admin.conf"),
            ("kubernetes_addr", "[2001:db8::2]:6443"),
            ("vip_loglevel", "debug"),
            ("vip_arpRate", "500"),
        ],
        None,
    );
    let c = r.config;
    assert!(c.services && c.services_election);
    assert!(c.services_ride_through);
    assert_eq!(c.services_namespace.as_deref(), Some("apps"));
    assert_eq!(
        c.lb_class_name, "",
        "empty lb_class_name env counts (LookupEnv)"
    );
    assert_eq!(c.services_interface.as_deref(), Some("eth1"));
    assert_eq!(c.prometheus_server, None, "empty flag disables metrics");
    assert_eq!(
        c.kubeconfig,
        Some(PathBuf::from("/etc/kubernetes/admin.conf"))
    );
    assert_eq!(c.kubernetes_addr.as_deref(), Some("[2001:db8::2]:6443"));
    assert_eq!(c.log_level, LogLevel::Debug);
    assert_eq!(c.arp_rate, Duration::from_millis(500));
    // DHCP (address 0.0.0.0) gives Services their addresses, never the control plane.
    let e = run(&[], &[("address", "<unset>"), ("svc_enable", "1")], None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("address") && e.contains("DHCP"), "{e}");
    // Empty prometheus_server env is "unset" as in kube-vip: the default stays.
    let c = ok(&[], &[("prometheus_server", "")], None).config;
    assert_eq!(
        c.prometheus_server.map(|l| l.to_string()).as_deref(),
        Some(":2112")
    );
    for (n, lvl) in [
        ("0", LogLevel::Error),
        ("3", LogLevel::Warn),
        ("4", LogLevel::Info),
        ("6", LogLevel::Trace),
    ] {
        assert_eq!(ok(&[], &[("vip_loglevel", n)], None).config.log_level, lvl);
    }
}

#[test]
fn services_health_check_defaults_off_and_parses() {
    let r = ok(&[], &[], None);
    assert_eq!(r.config.services_health.check, None);
    assert_eq!(
        r.config.services_health.hold,
        crate::services::health::DEFAULT_HOLD
    );
    let r = ok(
        &["--servicesHealthCheck=kube-proxy"],
        &[("svc_healthcheck_hold", "5")],
        None,
    );
    assert_eq!(
        r.config
            .services_health
            .check
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("http://127.0.0.1:10256/healthz")
    );
    assert_eq!(r.config.services_health.hold, Duration::from_secs(5));
    let r = ok(&[], &[("svc_healthcheck", "off")], None);
    assert_eq!(r.config.services_health.check, None);
}

#[test]
fn services_failback_defaults_off_and_parses_the_holddown() {
    assert_eq!(ok(&[], &[], None).config.services_failback, None);
    let r = ok(&["--servicesFailback=true"], &[], None);
    assert_eq!(r.config.services_failback, Some(Duration::from_secs(30)));
    let r = ok(
        &[],
        &[("svc_failback", "true"), ("svc_failback_holddown", "7")],
        None,
    );
    assert_eq!(r.config.services_failback, Some(Duration::from_secs(7)));
}

/// Harvester's guest-cluster settings (issue 13) start as they are: `lb_enable` and
/// `vip_leaderelection=false` without `cp_enable` are accepted (no effect); with
/// `cp_enable`, `vip_leaderelection=false` stays refused.
#[test]
fn harvester_guest_settings_are_accepted() {
    let harvester: &[(&str, &str)] = &[
        ("cp_enable", "false"),
        ("address", "<unset>"),
        ("vip_interface", ""),
        ("vip_arp", "true"),
        ("lb_enable", "true"),
        ("svc_enable", "true"),
        ("svc_election", "false"),
        ("vip_leaderelection", "false"),
        ("vip_subnet", "32"),
        ("prometheus_server", ":2112"),
    ];
    let c = ok(&[], harvester, None).config;
    assert!(c.services && !c.control_plane && !c.services_election);
    assert!(!c.leader_election && c.load_balancer.is_some() && c.interface.is_none());
    let e = run(
        &[],
        &[("svc_enable", "true"), ("vip_leaderelection", "false")],
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("vip_leaderelection") && e.contains("\"false\""),
        "{e}"
    );
    // A value that is no boolean is refused whatever cp_enable says.
    let e = run(
        &[],
        &[
            ("cp_enable", "false"),
            ("svc_enable", "true"),
            ("vip_leaderelection", "maybe"),
        ],
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("vip_leaderelection") && e.contains("maybe"),
        "{e}"
    );
}

/// The Harvester host cluster's kube-vip environment (issue 26, item 2), read from the
/// `harvester-host-env` block of docs/operators.md, which shows it verbatim
/// (harvester/harvester `deploy/charts/harvester/values.yaml`, `kube-vip.env`): it starts
/// as shipped, `enable_service_security=true` included, with one global Services lease.
#[test]
fn harvester_host_env_is_accepted_as_shipped() {
    let docs = include_str!("../../docs/operators.md");
    let block = docs
        .split("<!-- harvester-host-env")
        .nth(1)
        .and_then(|rest| rest.split("```yaml\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the harvester-host-env block in docs/operators.md");
    let env: Vec<(&str, &str)> = block
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
        .collect();
    assert_eq!(env.len(), 9, "{env:?}");
    assert!(
        env.contains(&("enable_service_security", "true")),
        "{env:?}"
    );
    // The base's `address` is not part of that env.
    let env: Vec<(&str, &str)> = std::iter::once(("address", "<unset>")).chain(env).collect();
    let r = ok(&[], &env, None);
    let c = &r.config;
    assert!(c.services && !c.control_plane && !c.services_election);
    assert!(c.service_security && c.services().service_security);
    assert!(c.interface.is_none() && c.load_balancer.is_some());
    // Off unless set, and refused as a non-boolean, naming the option.
    assert!(
        !ok(&[], &[("svc_enable", "true")], None)
            .config
            .service_security
    );
    let e = run(
        &[],
        &[
            ("svc_enable", "true"),
            ("enable_service_security", "yes please"),
        ],
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("enable_service_security"), "{e}");
    // The kube-vip flag feeds the same setting.
    let c = ok(
        &["--onlyAllowTrafficServicePorts=true"],
        &[("svc_enable", "true")],
        None,
    );
    assert!(c.config.service_security);
}

/// kube-vip's `dhcp_backoff_attempts` / `--dhcpBackoffAttempts`: a count (0 = forever,
/// vipd's default), from env, flag or file; a negative or non-number value names the
/// option and the value; set without `svc_enable` it warns.
#[test]
fn dhcp_backoff_attempts_is_a_count_and_needs_services() {
    let dhcp = [("svc_enable", "true")];
    let with = |extra: &[(&'static str, &'static str)]| {
        let env: Vec<(&str, &str)> = dhcp.iter().chain(extra).copied().collect();
        ok(&[], &env, None)
    };
    let r = with(&[("dhcp_backoff_attempts", "3")]);
    assert_eq!(r.config.dhcp_backoff_attempts, 3);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(
        with(&[("dhcp_backoff_attempts", "0")])
            .config
            .dhcp_backoff_attempts,
        0
    );
    assert_eq!(with(&[]).config.dhcp_backoff_attempts, 0);
    let r = ok(&["--dhcpBackoffAttempts", "5"], &dhcp, None);
    assert_eq!(r.config.dhcp_backoff_attempts, 5);
    let r = ok(&[], &dhcp, Some("dhcp_backoff_attempts: 7\n"));
    assert_eq!(r.config.dhcp_backoff_attempts, 7);
    // Environment wins over the flag, as everywhere.
    let r = ok(
        &["--dhcpBackoffAttempts=5"],
        &[dhcp[0], ("dhcp_backoff_attempts", "2")],
        None,
    );
    assert_eq!(r.config.dhcp_backoff_attempts, 2);
    let e = run(&[], &[("dhcp_backoff_attempts", "-3")], None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dhcp_backoff_attempts") && e.contains("\"-3\"") && e.contains("negative"),
        "{e}"
    );
    let e = run(&["--dhcpBackoffAttempts=lots"], &[], None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--dhcpBackoffAttempts") && e.contains("\"lots\"") && e.contains("whole number"),
        "{e}"
    );
    // Without svc_enable it does nothing: a warning says so.
    let r = ok(&[], &[("dhcp_backoff_attempts", "3")], None);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("dhcp_backoff_attempts") && w.contains("svc_enable")),
        "{:?}",
        r.warnings
    );
}

/// `svc_ipam` (default on with Services), kube-vip-cloud-provider's ConfigMap variables, and
/// what they mean without Services or with bad names.
#[test]
fn ipam_follows_svc_ipam_and_kube_vip_cloud_providers_variables() {
    let c = ok(&["--services"], &[], None).config;
    assert_eq!(
        c.ipam,
        Some(crate::kube::ObjectKey::new("kube-system", "kubevip"))
    );
    let s = c.ipam().expect("IPAM settings");
    assert_eq!(
        s.lease,
        crate::kube::ObjectKey::new("kube-system", "kube-vip-cloud-controller")
    );
    let c = ok(
        &["--services"],
        &[("KUBEVIP_CONFIG_MAP", "pools"), ("KUBEVIP_NAMESPACE", "lb")],
        None,
    )
    .config;
    assert_eq!(c.ipam, Some(crate::kube::ObjectKey::new("lb", "pools")));
    assert_eq!(
        c.ipam().map(|s| s.lease),
        Some(crate::kube::ObjectKey::new(
            "lb",
            "kube-vip-cloud-controller"
        ))
    );
    assert_eq!(
        ok(&["--services", "--servicesIPAM=false"], &[], None)
            .config
            .ipam,
        None
    );
    let r = ok(
        &["--controlplane", "--address", "192.0.2.10"],
        &[("svc_ipam", "true")],
        None,
    );
    assert_eq!(r.config.ipam, None);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("svc_ipam") && w.contains("svc_enable")),
        "{:?}",
        r.warnings
    );
    let e = run(
        &["--services"],
        &[("KUBEVIP_NAMESPACE", "Not_A_Label")],
        None,
    )
    .expect_err("a bad namespace is refused");
    assert!(
        e.to_string().contains("KUBEVIP_NAMESPACE") && e.to_string().contains("Not_A_Label"),
        "{e}"
    );
}

/// Issue 26: kube-vip's `dhcp_mode` is not a switch but the address family (`ipv4`, `ipv6`,
/// `dual`) dynamic DNS asks DHCP for (kube-vip `pkg/kubevip/config_environment.go`; DHCP
/// for `0.0.0.0` / `::` Services needs no option, `pkg/instance/instance.go`). vipd does no
/// dynamic DNS: every value, kube-vip's or vipd's old `true`/`false`, starts with a warning
/// that says it is ignored and that such Services always use DHCP; nothing refuses it.
#[test]
fn dhcp_mode_is_kube_vips_dns_family_and_is_ignored() {
    for value in ["ipv4", "IPv6", "dual", "true", "false"] {
        for cp in ["true", "false"] {
            let r = ok(
                &[],
                &[
                    ("svc_enable", "true"),
                    ("cp_enable", cp),
                    ("dhcp_mode", value),
                ],
                None,
            );
            assert!(r.config.services, "{value}");
            assert!(
                r.warnings.iter().any(|w| w.contains("dhcp_mode")
                    && w.contains(value)
                    && w.contains("ignores")
                    && w.contains("0.0.0.0")),
                "{value}: {:?}",
                r.warnings
            );
        }
    }
    let r = ok(&["--services", "--dhcpMode=dual"], &[], None);
    assert!(
        r.warnings.iter().any(|w| w.contains("--dhcpMode")),
        "{:?}",
        r.warnings
    );
}

/// Issue 27: Service ride-through is on by default wherever the Service lease timings allow
/// it (kube-vip's 5/3/1, what the generator writes for Services), off under vipd's bare
/// 3/2/1 (a ride cannot start within its API fence) and sub-second timings, and `svc_ridethrough=false` / `--servicesRideThrough=false` still
/// turns it off.
#[test]
fn service_ride_through_is_on_by_default_where_the_timings_allow() {
    assert!(!ok(&["--services"], &[], None).config.services_ride_through);
    let generator = [
        ("vip_leaseduration", "3"),
        ("vip_renewdeadline", "2"),
        ("vip_retryperiod", "1"),
    ];
    assert!(
        !ok(&["--services"], &generator, None)
            .config
            .services_ride_through,
        "3/2/1 cannot start a ride in time: off by default"
    );
    let kube_vip = [
        ("vip_leaseduration", "5"),
        ("vip_renewdeadline", "3"),
        ("vip_retryperiod", "1"),
    ];
    assert!(
        ok(&["--services"], &kube_vip, None)
            .config
            .services_ride_through
    );
    let sub_second = [
        ("vip_nftfence", "true"),
        ("svc_leaseduration", "0.6"),
        ("svc_renewdeadline", "0.4"),
        ("svc_retryperiod", "0.2"),
    ];
    assert!(
        !ok(&["--services"], &sub_second, None)
            .config
            .services_ride_through
    );
    let off = ok(&["--services"], &[("svc_ridethrough", "false")], None);
    assert!(!off.config.services_ride_through);
    let flag_off = ok(&["--services", "--servicesRideThrough=false"], &[], None);
    assert!(!flag_off.config.services_ride_through);
    // Given or defaulted: only a given one stops the manager when it cannot start.
    let defaulted = ok(&["--services"], &kube_vip, None).config;
    assert!(defaulted.services_ride_through && !defaulted.services_ride_through_set);
    assert!(off.config.services_ride_through_set && flag_off.config.services_ride_through_set);
    let given = ok(
        &["--services", "--servicesRideThrough=true"],
        &kube_vip,
        None,
    )
    .config;
    assert!(given.services_ride_through && given.services_ride_through_set);
}

/// Issue 28: `svc_leaseshards` / `--servicesLeaseShards` (default 0, one lease per
/// Service) is a count of at most 1024 that applies with `svc_election`; without it (one
/// lease for all) it is ignored with a warning; a bad value names the option and value.
#[test]
fn services_lease_shards_is_a_bounded_count_under_per_service_election() {
    let on = [("svc_enable", "true"), ("svc_election", "true")];
    let with = |extra: &[(&'static str, &'static str)]| {
        let env: Vec<(&str, &str)> = on.iter().chain(extra).copied().collect();
        ok(&[], &env, None)
    };
    assert_eq!(with(&[]).config.services_lease_shards, 0);
    let r = with(&[("svc_leaseshards", "32")]);
    assert_eq!(r.config.services_lease_shards, 32);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let r = ok(&["--servicesLeaseShards=1024"], &on, None);
    assert_eq!(r.config.services_lease_shards, 1024);
    let e = run(&[], &[on[0], on[1], ("svc_leaseshards", "1025")], None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("svc_leaseshards") && e.contains("\"1025\"") && e.contains("at most 1024"),
        "{e}"
    );
    let e = run(&["--servicesLeaseShards=many"], &on, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--servicesLeaseShards") && e.contains("\"many\""),
        "{e}"
    );
    // One lease for all: nothing to shard.
    let r = ok(
        &[],
        &[("svc_enable", "true"), ("svc_leaseshards", "8")],
        None,
    );
    assert_eq!(r.config.services_lease_shards, 0);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("svc_leaseshards") && w.contains("svc_election")),
        "{:?}",
        r.warnings
    );
    // Without Services: the usual warning.
    let r = ok(&[], &[("svc_leaseshards", "8")], None);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("svc_leaseshards") && w.contains("svc_enable")),
        "{:?}",
        r.warnings
    );
}

/// Issue 29: routing-table mode without `svc_election`: with `vip_leaderelection=false`
/// every node routes (kube-vip's `ServicesNoLeader`); with it true or unset the one
/// Services lease's holder routes (kube-vip's `GlobalLeader`); `vip_leaderelection=false`
/// without routing-table mode (ARP/NDP) still elects; with `svc_election` it is the
/// per-Service lease holder whatever `vip_leaderelection` says.
#[test]
fn routing_table_mode_without_service_election() {
    let base = [
        ("cp_enable", "false"),
        ("svc_enable", "true"),
        ("vip_routingtable", "true"),
        ("vip_arp", "false"),
    ];
    let mut env = base.to_vec();
    env.push(("vip_leaderelection", "false"));
    let c = ok(&[], &env, None).config;
    assert!(c.routing_table.is_some() && !c.services_election);
    assert!(c.services_unelected() && c.services().services_unelected);
    // vip_leaderelection unset or true: the global lease, routed.
    let c = ok(&[], &base, None).config;
    assert!(c.routing_table.is_some() && !c.services_unelected());
    let mut env = base.to_vec();
    env.push(("vip_leaderelection", "true"));
    assert!(!ok(&[], &env, None).config.services_unelected());
    // With svc_election: elected per Service.
    let mut env = base.to_vec();
    env.extend([("vip_leaderelection", "false"), ("svc_election", "true")]);
    assert!(!ok(&[], &env, None).config.services().services_unelected);
    // The flags: --table --leaderElection=false.
    let c = ok(
        &["--services", "--table", "--leaderElection=false"],
        &[("cp_enable", "false")],
        None,
    )
    .config;
    assert!(c.services_unelected());
    // ARP/NDP: vip_leaderelection=false changes nothing, Services are elected.
    let c = ok(
        &[],
        &[
            ("cp_enable", "false"),
            ("svc_enable", "true"),
            ("vip_leaderelection", "false"),
        ],
        None,
    )
    .config;
    assert!(c.routing_table.is_none() && !c.services_unelected());
    assert!(!c.services().services_unelected);
}

/// Issue 29: routing-table mode (`vip_routingtable`) is accepted for Services with
/// election, with kube-vip's defaults (table 198, protocol 248, unicast) and its own
/// values through the routed wing's parsers; `vip_arp=false` goes with it (kube-vip's
/// guide turns every other mode off); off, its type and clean options only warn.
#[test]
fn routing_table_mode_for_elected_services() {
    use crate::net::route::RouteKind;
    let base = [
        ("cp_enable", "false"),
        ("svc_enable", "true"),
        ("svc_election", "true"),
        ("vip_routingtable", "true"),
    ];
    let r = ok(&[], &base, None);
    let m = r.config.routing_table.expect("on");
    assert_eq!(
        (m.table, m.protocol, m.kind, m.clean),
        (198, 248, RouteKind::Unicast, false)
    );
    assert_eq!(r.config.services().routing_table, Some(m));
    // A routed VIP is on no node subnet: no subnet check unless asked for.
    assert!(!r.config.services_subnet_check);
    let mut env = base.to_vec();
    env.push(("svc_subnet_check", "true"));
    assert!(ok(&[], &env, None).config.services_subnet_check);
    let mut env = base.to_vec();
    env.extend([
        ("vip_routingtableid", "1000"),
        ("vip_routingprotocol", "99"),
        ("vip_routingtabletype", "2"),
        ("vip_cleanroutingtable", "true"),
        ("vip_arp", "false"),
    ]);
    let m = ok(&[], &env, None).config.routing_table.expect("on");
    assert_eq!(
        (m.table, m.protocol, m.kind, m.clean),
        (1000, 99, RouteKind::Local, true)
    );
    let m = ok(
        &[
            "--services",
            "--servicesElection",
            "--table",
            "--tableID=7",
            "--tableType=2",
        ],
        &[("cp_enable", "false")],
        None,
    )
    .config
    .routing_table
    .expect("on");
    // kube-vip's flags (cmd/kube-vip.go): --tableID, --tableType.
    assert_eq!((m.table, m.kind), (7, RouteKind::Local));
    // Off: the table's id and protocol are `vipd manifest bird|frr`'s; the rest warns.
    let r = ok(
        &[],
        &[
            ("cp_enable", "false"),
            ("svc_enable", "true"),
            ("vip_routingtableid", "1000"),
            ("vip_cleanroutingtable", "true"),
        ],
        None,
    );
    assert_eq!(r.config.routing_table, None);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("vip_cleanroutingtable") && w.contains("vip_routingtable=true")),
        "{:?}",
        r.warnings
    );
    // Without svc_election: accepted (routing_table_mode_without_service_election).
}

/// Issue 29: sub-second Service timings are refused at configuration time in
/// routing-table mode (a route's lifetime is whole seconds), naming the Service lease
/// duration and its value, also with the millisecond fence on; 5/3/1 and 3/2/1 pass.
#[test]
fn routing_table_mode_refuses_timings_without_a_route_fence() {
    let base = [
        ("cp_enable", "false"),
        ("svc_enable", "true"),
        ("svc_election", "true"),
        ("vip_routingtable", "true"),
    ];
    let mut env = base.to_vec();
    env.extend([
        ("svc_leaseduration", "0.6"),
        ("svc_renewdeadline", "0.4"),
        ("svc_retryperiod", "0.2"),
    ]);
    let e = run(&[], &env, None).unwrap_err().to_string();
    assert!(
        e.contains("svc_leaseduration") && e.contains("0.6") && e.contains("whole seconds"),
        "{e}"
    );
    // Inherited from the control-plane timings: named as given.
    let mut env = base.to_vec();
    env.extend([
        ("vip_leaseduration", "0.6"),
        ("vip_renewdeadline", "0.4"),
        ("vip_retryperiod", "0.2"),
    ]);
    let e = run(&[], &env, None).unwrap_err().to_string();
    assert!(e.contains("vip_leaseduration") && e.contains("0.6"), "{e}");
    // The same timings without the mode are fine (the millisecond fence).
    let plain: Vec<_> = env
        .iter()
        .filter(|(k, _)| *k != "vip_routingtable")
        .copied()
        .collect();
    assert!(run(&[], &plain, None).is_ok());
    let with = |t: [&'static str; 3], extra: &[(&'static str, &'static str)]| {
        let mut env = base.to_vec();
        env.extend([
            ("svc_leaseduration", t[0]),
            ("svc_renewdeadline", t[1]),
            ("svc_retryperiod", t[2]),
        ]);
        env.extend(extra);
        run(&[], &env, None)
    };
    assert!(with(["5", "3", "1"], &[]).is_ok());
    // Elected: the route (2 s + 2 s slack) must be gone before a takeover (3 s): the lab's
    // router had two paths at once at 3/2/1.
    let e = with(["3", "2", "1"], &[]).unwrap_err().to_string();
    assert!(
        e.contains("svc_leaseduration") && e.contains("two paths"),
        "{e}"
    );
    // Without election every node routes anyway: 3/2/1 is fine.
    let r = with(
        ["3", "2", "1"],
        &[("svc_election", "false"), ("vip_leaderelection", "false")],
    )
    .expect("unelected");
    assert_eq!(r.config.services_timing.lease_duration.as_secs(), 3);
    // Elected without any timing given: 5/3/1.
    let r = ok(&[], &base, None);
    assert_eq!(
        r.config.services_timing,
        crate::holder::ROUTED_SERVICE_TIMING
    );
}

/// Issue 29: the control-plane VIP in routing-table mode (kube-vip routes it without
/// election, `pkg/manager/worker/table.go`): accepted with Services or alone,
/// `vip_leaderelection=false` accepted there (there is no control-plane election in this
/// mode), `enable_node_labeling` warned about; no ARP guard or nftables fence.
#[test]
fn routing_table_mode_for_the_control_plane() {
    let base = [
        ("cp_enable", "true"),
        ("address", "198.51.100.90"),
        ("vip_routingtable", "true"),
    ];
    let r = ok(&[], &base, None);
    assert!(r.config.routing_table.is_some());
    assert!(!r.config.binds_addresses());
    let mut env = base.to_vec();
    env.extend([
        ("svc_enable", "true"),
        ("vip_leaderelection", "false"),
        ("enable_node_labeling", "true"),
    ]);
    let r = ok(&[], &env, None);
    assert!(r.config.services_unelected());
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("enable_node_labeling") && w.contains("routing-table")),
        "{:?}",
        r.warnings
    );
    // Outside the mode vip_leaderelection=false with cp_enable stays refused.
    let plain: Vec<_> = env
        .iter()
        .filter(|(k, _)| *k != "vip_routingtable")
        .copied()
        .collect();
    let e = run(&[], &plain, None).unwrap_err().to_string();
    assert!(e.contains("vip_leaderelection"), "{e}");
}

/// Trial findings (issue 29): without election there is no lease to ride through, so
/// ride-through is off (asked for, a warning); a local route type (2) is accepted as
/// kube-vip does but warned about: BIRD exports no local route.
#[test]
fn routing_table_mode_without_election_rides_nothing_and_local_routes_warn() {
    let base = [
        ("cp_enable", "false"),
        ("svc_enable", "true"),
        ("vip_routingtable", "true"),
        ("vip_leaderelection", "false"),
        ("svc_leaseduration", "5"),
        ("svc_renewdeadline", "3"),
        ("svc_retryperiod", "1"),
    ];
    let r = ok(&[], &base, None);
    assert!(!r.config.services_ride_through);
    let mut env = base.to_vec();
    env.push(("svc_ridethrough", "true"));
    let r = ok(&[], &env, None);
    assert!(!r.config.services_ride_through);
    assert!(
        r.warnings.iter().any(|w| w.contains("svc_ridethrough")),
        "{:?}",
        r.warnings
    );
    // Elected, the same timings ride through by default.
    let mut env = base.to_vec();
    env.push(("svc_election", "true"));
    assert!(ok(&[], &env, None).config.services_ride_through);
    let mut env = base.to_vec();
    env.push(("vip_routingtabletype", "2"));
    let r = ok(&[], &env, None);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("vip_routingtabletype") && w.contains("BIRD")),
        "{:?}",
        r.warnings
    );
}
