//! The option table against the code: kube-vip options refused or warned, defaults, `--help`,
//! every flag feeding its environment key, config-file errors.

use super::*;

#[test]
fn config_kube_vip_options_refused_or_warned() {
    // Falsy / empty values of refused options are accepted (generated kube-vip
    // manifests carry bgp_enable "false" and the like).
    let r = ok(
        &[],
        &[
            ("bgp_enable", "false"),
            ("lb_enable", "0"),
            ("vip_ddns", "false"),
            ("bgp_routerid", ""),
            ("health_check_port", "0"),
            ("lb_class_legacy_handling", "true"),
        ],
        None,
    );
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // Every refused option set is named in one error.
    let e = run(
        &["--multihop"],
        &[("bgp_enable", "true"), ("vip_wireguard", "t")],
        Some("vip_ddns: true\n"),
    )
    .unwrap_err();
    let ConfigError::Unsupported { options } = &e else {
        panic!("{e}")
    };
    let keys: Vec<_> = options.iter().map(|o| o.key).collect();
    assert_eq!(
        keys,
        ["bgp_enable", "bgp_multihop", "vip_wireguard", "vip_ddns"]
    );
    let msg = e.to_string();
    assert!(
        msg.contains("BGP")
            && msg.contains("--multihop")
            && msg.contains("vip_ddns in the config file"),
        "{msg}"
    );
    // Ignored options warn; dns_mode=first (kube-vip's default) is silent.
    assert!(ok(&[], &[("dns_mode", "first")], None).warnings.is_empty());
    let r = ok(&["--enableEndpoints=true"], &[("dns_mode", "ipv4")], None);
    assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
    assert!(
        r.warnings.iter().any(|w| w.contains("dns_mode"))
            && r.warnings.iter().any(|w| w.contains("--enableEndpoints"))
    );
    // Services options without svc_enable warn.
    let r = ok(&[], &[("svc_election", "true")], None);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("svc_election") && w.contains("svc_enable")),
        "{:?}",
        r.warnings
    );
    let r = ok(&["--servicesRideThrough=true"], &[], None);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("--servicesRideThrough") && w.contains("svc_enable")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn config_table_defaults_match_resolution() {
    // For every supported option with a literal default, setting it explicitly to the
    // table's default must give the same Config as leaving it unset.
    let base = ok(&[], &[], None).config;
    let in_base = |k: &str| BASE.iter().any(|(b, _)| *b == k);
    let mut checked = 0;
    for o in env_names() {
        if o.kind != OptionKind::Supported
            || o.default.is_empty()
            || o.default.starts_with('<')
            || in_base(o.env)
        {
            continue;
        }
        let c = ok(&[], &[(o.env, o.default)], None).config;
        assert_eq!(
            c, base,
            "table default of {} disagrees with resolution",
            o.env
        );
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} defaults checked");
    // And the constants agree with the table.
    let d = |k: &str| option(k).map(|o| o.default).unwrap_or_default();
    assert_eq!(
        d("vip_leaseduration").parse::<u64>().ok(),
        Some(DEFAULT_LEASE_DURATION.as_secs())
    );
    assert_eq!(
        d("vip_renewdeadline").parse::<u64>().ok(),
        Some(DEFAULT_RENEW_DEADLINE.as_secs())
    );
    assert_eq!(
        d("vip_retryperiod").parse::<u64>().ok(),
        Some(DEFAULT_RETRY_PERIOD.as_secs())
    );
    assert_eq!(
        d("vip_arpRate").parse::<u128>().ok(),
        Some(DEFAULT_ARP_RATE.as_millis())
    );
    assert_eq!(d("port").parse::<u16>().ok(), Some(DEFAULT_PORT));
}

#[test]
fn config_help_and_table_agree() {
    let cmd = ManagerArgs::command();
    let table_flags: Vec<_> = env_names().iter().filter(|o| !o.flag.is_empty()).collect();
    // Every clap option is in the table, with the table's help text.
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" {
            continue;
        }
        let row = table_flags
            .iter()
            .find(|o| o.flag == long)
            .unwrap_or_else(|| panic!("--{long} is not in env_names()"));
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        assert_eq!(help, row.help_text(), "--{long}");
        assert!(
            help.contains(&format!("[env: {}]", row.env)),
            "--{long}: {help}"
        );
        assert_eq!(
            arg.is_hide_set(),
            row.kind != OptionKind::Supported && !matches!(row.kind, OptionKind::Alias(_)),
            "--{long} visibility"
        );
    }
    // Every supported/alias row has a visible flag, and `--help` shows its env name.
    let rendered = ManagerArgs::command()
        .term_width(10_000)
        .render_help()
        .to_string();
    for o in env_names()
        .iter()
        .filter(|o| matches!(o.kind, OptionKind::Supported | OptionKind::Alias(_)))
    {
        assert!(!o.flag.is_empty(), "{} has no flag", o.env);
        assert!(
            rendered.contains(&format!("--{}", o.flag)),
            "--help lacks --{}",
            o.flag
        );
        assert!(
            rendered.contains(&format!("[env: {}]", o.env)),
            "--help lacks [env: {}]",
            o.env
        );
    }
    // Defaults and units are in the help.
    assert!(
        rendered.contains("[default: plndr-cp-lock]")
            && rendered.contains("in seconds")
            && rendered.contains("in milliseconds")
    );
    // No env name appears twice in the table.
    let mut envs: Vec<_> = env_names().iter().map(|o| o.env).collect();
    envs.sort_unstable();
    let before = envs.len();
    envs.dedup();
    assert_eq!(before, envs.len(), "duplicate env name in the table");
}

#[test]
fn config_every_flag_feeds_its_env_key() {
    // `--flag=v` must land on the table row's env key (catches a flag wired to the
    // wrong field), for every row that has a flag.
    let rows: Vec<_> = env_names().iter().filter(|o| !o.flag.is_empty()).collect();
    for o in &rows {
        let a = ManagerArgs::try_parse_from([
            "manager".to_string(),
            format!("--{}=probe-value", o.flag),
        ])
        .unwrap_or_else(|e| panic!("--{}: {e}", o.flag));
        assert_eq!(
            a.flag_values(),
            vec![(o.env, "probe-value")],
            "--{}",
            o.flag
        );
    }
    // ... and flag_values covers exactly the table's flags.
    assert_eq!(args(&[]).flag_values(), vec![]);
    // 74, kube-vip's BGP and routing-table flags `vipd manifest bird|frr` reads (issue 29),
    // and --tableType (kube-vip's flag of vip_routingtabletype, cmd/kube-vip.go).
    // + --servicesIPv6Loopback (svc_ipv6_loopback, issue 28).
    assert_eq!(rows.len(), 85);
}

#[test]
fn config_file_errors_and_from_process() {
    for (text, what) in [("[1, 2]", "mapping"), ("a: [", "YAML"), ("1: x", "strings")] {
        let e = run(&[], &[], Some(text)).unwrap_err();
        assert!(
            matches!(e, ConfigError::File { .. }) && e.to_string().contains(what),
            "{e}"
        );
    }
    let missing = "/nonexistent/vipd-config-test.yaml";
    let e = Config::from_process(&args(&["--config-file", missing])).unwrap_err();
    assert!(
        matches!(e, ConfigError::FileRead { .. }) && e.to_string().contains(missing),
        "{e}"
    );
}
