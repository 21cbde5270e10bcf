use std::time::Duration;

use super::cp_and_service::follows;
use super::report::SpreadResult;
use super::routed::PathWatch;
use super::trial::TrialResult;
use super::*;

#[test]
fn options_parse_and_reject_bad_values() {
    let o = BenchOptions::parse(&[
        "--scenario",
        "kill,freeze",
        "--trials",
        "3",
        "--impl",
        "vipd",
        "--timings",
        "default,2.5/2/1",
    ])
    .unwrap();
    assert_eq!(o.scenarios, vec![Scenario::Kill, Scenario::Freeze]);
    assert_eq!(o.trials, 3);
    assert!(o.vipd && o.keepalived.is_empty());
    assert_eq!(o.timings[1].values.as_ref().unwrap()[0], "2.5");
    assert_eq!(o.subjects().len(), 2);
    assert!(BenchOptions::parse(&["--lb"]).unwrap().lb);
    assert!(!BenchOptions::parse(&[]).unwrap().lb);
    let e = BenchOptions::parse(&["--scenario", "reboot"]).unwrap_err();
    assert!(e.to_string().contains("\"reboot\""), "{e}");
    assert!(BenchOptions::parse(&["--trials", "0"]).is_err());
    assert!(BenchOptions::parse(&["--timings", "3/5/1"]).is_err());
    assert!(BenchOptions::parse(&["--timings", "5/3"]).is_err());
    assert!(BenchOptions::parse(&["--trials"]).is_err());
    // The fast profile: sub-second timings with the nftables fence.
    let o = BenchOptions::parse(&["--timings", "fast,3/2/1,1/0.6/0.3+nft"]).unwrap();
    let fast = &o.timings[0];
    assert_eq!(fast.label, "fast");
    assert_eq!(
        fast.values.as_ref().unwrap(),
        &["0.6".to_string(), "0.4".into(), "0.2".into()]
    );
    assert!(fast.nft_fence && !o.timings[1].nft_fence && o.timings[2].nft_fence);
    assert_eq!(o.timings[2].values.as_ref().unwrap()[1], "0.6");
    assert!(BenchOptions::parse(&["--timings", "fast+nft"]).is_err());
}

#[test]
fn impl_selects_vipd_and_the_keepalived_rows() {
    let labels = |args: &[&str]| -> Vec<String> {
        BenchOptions::parse(args)
            .unwrap()
            .subjects()
            .iter()
            .map(Subject::label)
            .collect()
    };
    let all = [
        "vipd default",
        "vipd 5/3/1",
        "keepalived",
        "keepalived-fast",
    ];
    assert_eq!(labels(&[]), all);
    assert_eq!(labels(&["--impl", "both"]), all);
    assert_eq!(labels(&["--impl", "vipd"]), ["vipd default", "vipd 5/3/1"]);
    assert_eq!(
        labels(&["--impl", "keepalived"]),
        ["keepalived", "keepalived-fast"]
    );
    assert_eq!(labels(&["--impl", "keepalived-fast"]), ["keepalived-fast"]);
    // Services mode is vipd only.
    assert_eq!(
        labels(&["--impl", "both", "--service", "--timings", "default"]),
        ["vipd default svc"]
    );
    let e = BenchOptions::parse(&["--impl", "kube-vip"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid --impl value \"kube-vip\": expected vipd, keepalived, keepalived-fast or both"
    );
}

#[test]
fn cp_and_service_is_vipd_only_and_alone() {
    let o = BenchOptions::parse(&["--cp-and-service", "--timings", "default,fast"]).unwrap();
    assert!(o.cp_and_service && o.service.is_none() && !o.lb);
    // keepalived rows are skipped, as with --service.
    let labels: Vec<String> = o.subjects().iter().map(Subject::label).collect();
    assert_eq!(labels, ["vipd default cp+svc", "vipd fast cp+svc"]);
    assert!(!BenchOptions::parse(&[]).unwrap().cp_and_service);
    for (flags, named) in [
        (&["--cp-and-service", "--service"][..], "--service"),
        (&["--service", "--cp-and-service"][..], "--service"),
        (&["--cp-and-service", "--ride"][..], "--ride"),
        (&["--lb", "--cp-and-service"][..], "--lb"),
    ] {
        let e = BenchOptions::parse(flags).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "--cp-and-service cannot be combined with {named}:"
            )),
            "{flags:?}: {e}"
        );
    }
    let e = BenchOptions::parse(&["--cp-and-service", "--impl", "keepalived"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--cp-and-service measures vipd only: use --impl vipd (or both)"
    );
}

#[test]
fn follows_reads_vipds_following_line() {
    let log = "2026-12-01T21:50:00.123456Z  INFO leader election starting lease=kube-system/plndr-svcs-lock identity=node-b\n\
               2026-12-01T21:50:00.200000Z  INFO following lease=kube-system/plndr-cp-lock holder=node-a";
    assert!(follows(log, "kube-system/plndr-cp-lock", "node-a"));
    assert!(!follows(log, "kube-system/plndr-cp-lock", "node-c"));
    assert!(!follows(log, "kube-system/plndr-svcs-lock", "node-a"));
}

#[test]
fn pairs_take_the_slower_vip_and_name_the_new_nodes() {
    let r = |subject: &str, to: &str, gap: f64, take: f64| TrialResult {
        scenario: Scenario::Poweroff,
        trial: 2,
        takeover_ms: Some(take),
        ..trial_result(subject, to, gap)
    };
    let same = PairResult::of(
        "vipd fast cp+svc",
        &r("vipd fast cp+svc:cp", "node-b", 700.0, 650.0),
        &r("vipd fast cp+svc:svc", "node-b", 900.0, 610.0),
    );
    assert!(same.same_node);
    assert_eq!(same.both_gap_ms, Some(900.0));
    assert_eq!(same.takeover_spread_ms, Some(-40.0));
    let split = PairResult::of(
        "vipd fast cp+svc",
        &r("vipd fast cp+svc:cp", "node-b", 700.0, 650.0),
        &r("vipd fast cp+svc:svc", "node-c", 600.0, 700.0),
    );
    assert!(!split.same_node);
    assert_eq!(split.both_gap_ms, Some(700.0));
    assert!(pair_line(&split).contains("->cp node-b, svc node-c (different nodes)"));
    let report = BenchReport {
        trials: vec![],
        idle: vec![],
        pairs: vec![same, split],
        spread: vec![],
    };
    let table = pair_table(&report);
    let row = table.lines().last().unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    // scenario, impl (3 words), trials, both p50/p95/max, spread max, same node
    assert_eq!(
        cols,
        [
            "poweroff", "vipd", "fast", "cp+svc", "2", "700", "900", "900", "50", "1/2"
        ],
        "{table}"
    );
    assert_eq!(pair_table(&BenchReport::default()), "");
}

#[test]
fn tables_group_by_scenario_and_impl() {
    let t = |subject: &str, gap: f64| TrialResult {
        scenario: Scenario::Kill,
        takeover_ms: Some(gap),
        ..trial_result(subject, "node-b", gap)
    };
    let report = BenchReport {
        trials: vec![
            t("vipd default", 1000.0),
            t("keepalived", 4000.0),
            t("keepalived-fast", 500.0),
        ],
        idle: vec![],
        pairs: vec![],
        spread: vec![],
    };
    let table = summary_table(&report);
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(table.contains("\nkill      keepalived-fast "), "{table}");
    let ratios = ratio_table(&report);
    let (classic, fast) = ratios
        .split_once("vipd / keepalived-fast ")
        .expect("a keepalived-fast section");
    assert!(
        classic.contains("vipd / keepalived (") && classic.contains("p50  0.25"),
        "{ratios}"
    );
    assert!(fast.contains("p50  2.00"), "{ratios}");
    let json = serde_json::to_string(&report.trials[2]).unwrap();
    assert!(json.contains(r#""subject":"keepalived-fast""#), "{json}");
}

/// A recovered trial from node-a to `to` with a probe gap of `gap` ms and no notes.
fn trial_result(subject: &str, to: &str, gap: f64) -> TrialResult {
    TrialResult {
        scenario: Scenario::Kill,
        subject: subject.into(),
        trial: 1,
        holder: "node-a".into(),
        new_holder: Some(to.into()),
        gap_ms: Some(gap),
        takeover_ms: None,
        old_gone_ms: None,
        two_responders_ms: 0.0,
        two_responder_nodes: vec![],
        switches: 1,
        probe_failures: 0,
        probe_requests: 10,
        probe_switches: vec![],
        recovered: true,
        came_back: None,
        notes: vec![],
        routed: false,
    }
}

#[test]
fn freeze_ms_thaws_early_and_must_be_positive() {
    assert_eq!(BenchOptions::parse(&[]).unwrap().freeze_for, None);
    let o = BenchOptions::parse(&["--scenario", "freeze", "--freeze-ms", "800"]).unwrap();
    assert_eq!(o.freeze_for, Some(std::time::Duration::from_millis(800)));
    for bad in ["0", "-5", "0.8", "x"] {
        let e = BenchOptions::parse(&["--freeze-ms", bad])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--freeze-ms") && e.contains(bad), "{e}");
    }
}

#[test]
fn routed_runs_vipd_in_four_scenarios_and_refuses_the_other_modes() {
    let o = BenchOptions::parse(&["--routed"]).unwrap();
    assert!(o.routed && !o.lb && o.service.is_none() && !o.cp_and_service);
    assert_eq!(o.scenarios, Scenario::ROUTED);
    assert_eq!(o.spread, options::DEFAULT_SPREAD);
    // 5/3/1 (vipd refuses elected routes under 3/2/1), labelled with the mode; no
    // keepalived rows; --timings still chooses.
    let labels: Vec<String> = o.subjects().iter().map(Subject::label).collect();
    assert_eq!(labels, ["vipd 5/3/1 routed"]);
    let o = BenchOptions::parse(&["--routed", "--timings", "10/6/2"]).unwrap();
    let labels: Vec<String> = o.subjects().iter().map(Subject::label).collect();
    assert_eq!(labels, ["vipd 10/6/2 routed"]);
    let o = BenchOptions::parse(&["--routed", "--scenario", "poweroff", "--spread", "0"]).unwrap();
    assert_eq!(
        (o.scenarios.as_slice(), o.spread),
        (&[Scenario::Poweroff][..], 0)
    );
    for (flags, named) in [
        (&["--routed", "--service"][..], "--service"),
        (&["--ride", "--routed"][..], "--ride"),
        (&["--routed", "--lb"][..], "--lb"),
        (&["--routed", "--cp-and-service"][..], "--cp-and-service"),
        (&["--routed", "--freeze-ms", "800"][..], "--freeze-ms"),
    ] {
        let e = BenchOptions::parse(flags).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("--routed cannot be combined with {named}:")),
            "{flags:?}: {e}"
        );
    }
    let e = BenchOptions::parse(&["--routed", "--scenario", "kill,drain"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--routed runs graceful, kill, freeze and poweroff, not drain"
    );
    let e = BenchOptions::parse(&["--routed", "--impl", "keepalived"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--routed measures vipd only: use --impl vipd (or both)"
    );
    let e = BenchOptions::parse(&["--spread", "100"]).unwrap_err();
    assert!(e.to_string().contains("add --routed"), "{e}");
    let e = BenchOptions::parse(&["--routed", "--spread", "many"]).unwrap_err();
    assert!(e.to_string().contains("\"many\""), "{e}");
}

#[test]
fn path_watch_times_the_old_path_the_new_one_and_two_at_once() {
    let ms = Duration::from_millis;
    let hops = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
    let mut w = PathWatch::default();
    w.sample(&hops(&["node-a"]), "node-a", ms(10));
    assert!(!w.done() && w.watch.old_gone.is_none());
    w.sample(&hops(&[]), "node-a", ms(30));
    assert_eq!(w.watch.old_gone, Some(ms(30)));
    w.sample(&hops(&["node-b"]), "node-a", ms(50));
    assert_eq!(
        (w.watch.new_holder.as_deref(), w.watch.takeover),
        (Some("node-b"), Some(ms(50)))
    );
    assert!(w.done() && w.pairs.is_empty() && w.two_paths.is_zero() && !w.old_back);
    // The old holder's path back beside the new one: two paths for the interval, noted.
    w.sample(&hops(&["node-a", "node-b"]), "node-a", ms(70));
    w.sample(&hops(&["node-a", "node-b"]), "node-a", ms(85));
    w.sample(&hops(&["node-b"]), "node-a", ms(100));
    assert!(w.old_back);
    assert_eq!((w.two_paths, w.watch.max_carriers), (ms(35), 2));
    assert_eq!(w.pairs.iter().collect::<Vec<_>>(), ["node-a+node-b"]);
    // A new path before the old one went: the takeover counts, the old path is not gone.
    let mut w = PathWatch::default();
    w.sample(&hops(&["node-a", "node-c"]), "node-a", ms(5));
    assert_eq!(w.watch.new_holder.as_deref(), Some("node-c"));
    assert!(!w.done() && w.watch.old_gone.is_none());
}

/// A routed trial result: `subject:tag`, the old path gone after `old` ms, the new one
/// after `new` ms.
fn routed_result(scenario: Scenario, tag: &str, gap: f64, old: f64, new: f64) -> TrialResult {
    TrialResult {
        scenario,
        old_gone_ms: Some(old),
        takeover_ms: Some(new),
        routed: true,
        ..trial_result(&format!("vipd 5/3/1 routed:{tag}"), "node-b", gap)
    }
}

#[test]
fn route_table_and_trial_lines_speak_of_paths() {
    let report = BenchReport {
        trials: vec![
            routed_result(Scenario::Kill, "v4", 4980.0, 6.0, 4979.0),
            routed_result(Scenario::Kill, "v4", 4990.0, 12.0, 4985.0),
            routed_result(Scenario::Kill, "v6", 2460.0, 2552.0, 4979.0),
            trial_result("vipd 5/3/1", "node-b", 1000.0),
        ],
        ..BenchReport::default()
    };
    let table = route_table(&report);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| l.starts_with("kill"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    // scenario, impl (3 words), trials, old p50/p95/max, new p50/p95/max, 2-path max; the
    // ARP trial has no row.
    assert_eq!(
        rows,
        [
            vec![
                "kill",
                "vipd",
                "5/3/1",
                "routed:v4",
                "2",
                "6",
                "12",
                "12",
                "4979",
                "4985",
                "4985",
                "0"
            ],
            vec![
                "kill",
                "vipd",
                "5/3/1",
                "routed:v6",
                "1",
                "2552",
                "2552",
                "2552",
                "4979",
                "4979",
                "4979",
                "0"
            ],
        ],
        "{table}"
    );
    assert_eq!(route_table(&BenchReport::default()), "");
    let line = trial_line(&report.trials[0]);
    assert!(
        line.contains("new path 4979 ms, old gone 6 ms, two paths 0 ms"),
        "{line}"
    );
    assert!(trial_line(&report.trials[3]).contains("takeover - ms"));
    let json = serde_json::to_string(&report.trials[0]).unwrap();
    assert!(json.contains(r#""routed":true"#), "{json}");
    let json = serde_json::to_string(&report.trials[3]).unwrap();
    assert!(!json.contains("routed"), "{json}");
}

#[test]
fn spread_counts_shares_and_the_largest_deviation() {
    let r = SpreadResult {
        vip: "198.51.100.80".parse().unwrap(),
        source: routed::PathSource::StaticRoutes.name().into(),
        paths: vec!["node-a".into(), "node-b".into(), "node-c".into()],
        connections: 300,
        per_node: [("node-a", 120), ("node-b", 100), ("node-c", 78), ("-", 2)]
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
    };
    // node-a: 120 against an even 100, +20 %; node-c 78, -22 %.
    assert_eq!(r.max_deviation_pct(), Some(22.0));
    let table = spread_table(&BenchReport {
        spread: vec![r.clone()],
        ..BenchReport::default()
    });
    assert!(
        table.contains("paths: static routes in table 198 on every node"),
        "{table}"
    );
    assert!(
        table.contains(
            "198.51.100.80    300 connections over 3 paths: node-a 120 (40.0 %), node-b 100 (33.3 %), node-c 78 (26.0 %); max deviation from even 22.0 %, 2 not answered by a path"
        ),
        "{table}"
    );
    assert_eq!(spread_table(&BenchReport::default()), "");
    let none = SpreadResult { paths: vec![], ..r };
    assert_eq!(none.max_deviation_pct(), None);
}
