use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use super::*;

mod net;

// ---------- pure statistics ----------

fn meta() -> ProbeMeta {
    ProbeMeta {
        target: "http://192.0.2.10/".to_owned(),
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(1000),
        started_at: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    }
}

/// Request `seq` started at `seq * 100 ms`, took `lat_ms`.
fn out(seq: u64, lat_ms: u64, result: Result<&str, FailureKind>) -> Outcome {
    Outcome {
        seq,
        sent_at: Duration::from_millis(seq * 100),
        latency: Duration::from_millis(lat_ms),
        result: result.map(str::to_owned),
    }
}

fn stats_of(outcomes: impl IntoIterator<Item = Outcome>) -> ProbeStats {
    let mut s = ProbeStats::new(meta());
    for o in outcomes {
        s.record(o);
    }
    s
}

/// a a FAIL(refused) FAIL(timeout) b b, arrivals 1, 101, -, -, 402, 501 ms.
fn switch_sequence() -> Vec<Outcome> {
    vec![
        out(0, 1, Ok("node-a")),
        out(1, 1, Ok("node-a")),
        out(2, 3, Err(FailureKind::Refused)),
        out(3, 1000, Err(FailureKind::Timeout)),
        out(4, 2, Ok("node-b")),
        out(5, 1, Ok("node-b")),
    ]
}

#[test]
fn gap_spans_failures_between_successes() {
    let s = stats_of([
        out(0, 1, Ok("node-a")),
        out(1, 1000, Err(FailureKind::Timeout)),
        out(2, 5, Err(FailureKind::Refused)),
        out(3, 1, Ok("node-a")),
    ])
    .summary();
    assert_eq!(
        s.longest_gap,
        Some(Gap {
            start_ms: 1.0,
            gap_ms: 300.0,
            failures: 2
        })
    );
    assert_eq!((s.requests, s.successes, s.failures), (4, 2, 2));
    assert_eq!(s.switch_count, 0);
    assert!(s.switches.is_empty());
    assert_eq!(s.trailing_failures, 0);
    assert_eq!(
        s.failures_by_kind,
        BTreeMap::from([("refused".to_owned(), 1), ("timeout".to_owned(), 1)])
    );
}

#[test]
fn switch_with_failures_in_between() {
    let s = stats_of(switch_sequence()).summary();
    assert_eq!(s.switch_count, 1);
    assert_eq!(
        s.switches,
        vec![Switch {
            from: "node-a".to_owned(),
            to: "node-b".to_owned(),
            at_ms: 402.0,
            gap_ms: 301.0,
            failures: 2,
        }]
    );
    assert_eq!(
        s.longest_gap,
        Some(Gap {
            start_ms: 101.0,
            gap_ms: 301.0,
            failures: 2
        })
    );
    assert_eq!(
        s.backends,
        BTreeMap::from([("node-a".to_owned(), 2), ("node-b".to_owned(), 2)])
    );
    let lat = s.latency.as_ref().map(|l| (l.min_ms, l.avg_ms, l.max_ms));
    assert_eq!(lat, Some((1.0, 1.25, 2.0)));
    assert_eq!(s.first_success_ms, Some(1.0));
    assert_eq!(s.last_success_ms, Some(501.0));
}

#[test]
fn out_of_order_completions_are_analysed_in_start_order() {
    let in_order = stats_of(switch_sequence()).summary();
    // Completion order: the timeout (seq 3) completes last, seq 0 after seq 1.
    let seq = switch_sequence();
    let shuffled = [5, 1, 0, 4, 2, 3].map(|i| seq[i].clone());
    let s = stats_of(shuffled);
    assert_eq!(s.summary(), in_order);
    // Reversed order too, with a duplicate that must be ignored.
    let mut reversed: Vec<Outcome> = switch_sequence().into_iter().rev().collect();
    reversed.push(out(4, 2, Ok("node-b")));
    assert_eq!(stats_of(reversed).summary(), in_order);
}

#[test]
fn missing_request_does_not_block_the_summary() {
    // seq 1 was abandoned at shutdown: never recorded.
    let s = stats_of([
        out(0, 1, Ok("node-a")),
        out(2, 1, Ok("node-b")),
        out(3, 1, Err(FailureKind::Reset)),
    ])
    .summary();
    assert_eq!((s.requests, s.successes, s.failures), (3, 2, 1));
    assert_eq!(s.switch_count, 1);
    assert_eq!(s.trailing_failures, 1);
}

#[test]
fn no_success_at_all() {
    let s = stats_of([
        out(0, 3, Err(FailureKind::Refused)),
        out(1, 1000, Err(FailureKind::Timeout)),
        out(2, 1, Err(FailureKind::Status(503))),
    ])
    .summary();
    assert_eq!((s.requests, s.successes, s.failures), (3, 0, 3));
    assert_eq!(s.latency, None);
    assert_eq!(s.longest_gap, None);
    assert_eq!(s.first_success_ms, None);
    assert_eq!(s.last_success_ms, None);
    assert_eq!(s.trailing_failures, 3);
    assert!(s.failures_by_kind.contains_key("http_503"));
    assert!(s.backends.is_empty());
}

#[test]
fn single_success_has_no_gap() {
    let s = stats_of([
        out(0, 1000, Err(FailureKind::Timeout)),
        out(1, 4, Ok("node-a")),
    ])
    .summary();
    assert_eq!(s.longest_gap, None);
    assert_eq!(s.switch_count, 0);
    assert_eq!(s.first_success_ms, Some(104.0));
    assert_eq!(s.last_success_ms, Some(104.0));
    assert_eq!(s.trailing_failures, 0);
}

#[test]
fn slow_earlier_answer_gives_zero_not_negative_gap() {
    // seq 0 answered at 900 ms, seq 1 at 101 ms: the second pair's gap is 0.
    let s = stats_of([
        out(0, 900, Ok("node-a")),
        out(1, 1, Ok("node-a")),
        out(2, 1, Ok("node-a")),
    ])
    .summary();
    assert_eq!(
        s.longest_gap,
        Some(Gap {
            start_ms: 101.0,
            gap_ms: 100.0,
            failures: 0
        })
    );
}

#[test]
fn flapping_backends_count_every_switch() {
    let s = stats_of([
        out(0, 1, Ok("node-a")),
        out(1, 1, Ok("node-b")),
        out(2, 1, Ok("node-a")),
    ])
    .summary();
    assert_eq!(s.switch_count, 2);
    let pairs: Vec<(&str, &str)> = s
        .switches
        .iter()
        .map(|w| (w.from.as_str(), w.to.as_str()))
        .collect();
    assert_eq!(pairs, [("node-a", "node-b"), ("node-b", "node-a")]);
}

#[test]
fn summary_text_names_gap_switch_and_kinds() {
    let mut stats = stats_of(switch_sequence());
    stats.set_elapsed(Duration::from_millis(600));
    let text = summary_text(&stats);
    assert!(text.contains("6 requests, 4 successes, 2 failures (refused 1, timeout 1)"));
    assert!(text.contains("longest gap 301.0 ms from "));
    assert!(text.contains("(2 failures in between)"));
    assert!(text.contains("1 backend switches"));
    assert!(text.contains("node-a -> node-b gap 301.0 ms (2 failures)"));
    assert!(text.contains("answers per backend: node-a 2, node-b 2"));
    let none = summary_text(&stats_of([out(0, 3, Err(FailureKind::Refused))]));
    assert!(none.contains("no successful answer"));
}

#[test]
fn json_summary_shape() {
    let mut stats = stats_of(switch_sequence());
    stats.set_elapsed(Duration::from_millis(600));
    stats.set_abandoned(1);
    let json = summary_json(&stats).expect("serialises");
    assert!(!json.contains('\n'));
    let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(v["target"], "http://192.0.2.10/");
    assert_eq!(v["interval_ms"], 100.0);
    assert_eq!(v["timeout_ms"], 1000.0);
    assert_eq!(v["started_unix_ms"], 1_700_000_000_000u64);
    assert_eq!(v["elapsed_ms"], 600.0);
    assert_eq!(v["requests"], 6);
    assert_eq!(v["abandoned"], 1);
    assert_eq!(v["failures_by_kind"]["timeout"], 1);
    assert_eq!(v["longest_gap"]["gap_ms"], 301.0);
    assert_eq!(v["switches"][0]["from"], "node-a");
    assert_eq!(v["switches"][0]["gap_ms"], 301.0);
    assert_eq!(v["latency"]["max_ms"], 2.0);
    let back: Summary = serde_json::from_str(&json).expect("parses back");
    assert_eq!(back, stats.summary());
    let empty = summary_json(&stats_of([])).expect("serialises");
    let v: serde_json::Value = serde_json::from_str(&empty).expect("valid JSON");
    assert!(v["longest_gap"].is_null() && v["latency"].is_null());
}

#[test]
fn outcome_lines() {
    let stats = stats_of([]);
    let ok = outcome_line(&stats, &out(0, 3, Ok("node-a")));
    let fail = outcome_line(&stats, &out(1, 1000, Err(FailureKind::Timeout)));
    let is_clock = |s: &str| {
        s.len() == 12
            && s.chars()
                .enumerate()
                .all(|(i, c)| matches!((i, c), (2 | 5, ':') | (8, '.')) || c.is_ascii_digit())
    };
    let (clock, rest) = ok.split_at(12);
    assert!(is_clock(clock), "{ok}");
    assert_eq!(rest, " node-a 3.0ms");
    let (clock, rest) = fail.split_at(12);
    assert!(is_clock(clock), "{fail}");
    assert_eq!(rest, " FAIL timeout 1000ms");
}

// ---------- parsing ----------

#[test]
fn durations() {
    let ok = [
        ("100ms", Duration::from_millis(100)),
        ("1s", Duration::from_secs(1)),
        ("1.5s", Duration::from_millis(1500)),
        ("2m", Duration::from_secs(120)),
        ("1h", Duration::from_secs(3600)),
        ("250us", Duration::from_micros(250)),
        (".5s", Duration::from_millis(500)),
        ("0.1s", Duration::from_millis(100)),
        (" 20ms ", Duration::from_millis(20)),
    ];
    for (s, d) in ok {
        assert_eq!(parse_duration(s), Ok(d), "{s}");
    }
    for bad in [
        "",
        "100",
        "ms",
        "1x",
        "-1s",
        "1..5s",
        "1.5.s",
        "1 s",
        "99999999999999999999h",
    ] {
        let e = parse_duration(bad).expect_err(bad);
        assert_eq!(e.value, bad);
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
}

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn cli(argv: &[&str]) -> Result<Args, clap::Error> {
    use clap::Parser as _;
    Cli::try_parse_from(std::iter::once("probe").chain(argv.iter().copied())).map(|c| c.args)
}

#[test]
fn cli_defaults_and_errors_name_flag_and_value() {
    let a = cli(&["http://192.0.2.10/"]).expect("parses");
    assert_eq!(a.interval, Duration::from_millis(100));
    assert_eq!(a.timeout, Duration::from_millis(900));
    assert_eq!(
        (a.count, a.duration, a.quiet, a.json),
        (None, None, false, false)
    );
    let e = cli(&["http://x/", "--interval", "1x"]).expect_err("bad interval");
    let msg = e.to_string();
    assert!(msg.contains("--interval") && msg.contains("1x"), "{msg}");
    let e = cli(&["http://x/", "--timeout", "5"]).expect_err("no unit");
    assert!(e.to_string().contains("--timeout"), "{e}");
    assert!(cli(&["http://x/", "--count", "3", "--duration", "1s"]).is_err());
}

#[test]
fn config_validation_names_the_flag() {
    let base = cli(&["http://x/"]).expect("parses");
    let flag_of = |a: Args| match ProbeConfig::from_args(&a) {
        Err(ProbeError::InvalidArg { flag, .. }) => flag,
        other => panic!("expected InvalidArg, got {other:?}"),
    };
    assert_eq!(
        flag_of(Args {
            interval: Duration::ZERO,
            ..base.clone()
        }),
        "--interval"
    );
    assert_eq!(
        flag_of(Args {
            timeout: Duration::ZERO,
            ..base.clone()
        }),
        "--timeout"
    );
    assert_eq!(
        flag_of(Args {
            count: Some(0),
            ..base.clone()
        }),
        "--count"
    );
    assert_eq!(
        flag_of(Args {
            duration: Some(Duration::ZERO),
            ..base.clone()
        }),
        "--duration"
    );
    assert_eq!(
        flag_of(Args {
            target: "https://x/".to_owned(),
            ..base.clone()
        }),
        "TARGET"
    );
    let c = ProbeConfig::from_args(&Args {
        count: Some(7),
        ..base
    })
    .expect("valid");
    assert_eq!(c.limit, Limit::Count(7));
}

#[test]
fn targets() {
    let t = Target::parse("http://192.0.2.10/").expect("v4");
    assert_eq!((t.host.as_str(), t.port), ("192.0.2.10", 80));
    assert_eq!(
        (t.authority.as_str(), t.path_and_query.as_str()),
        ("192.0.2.10", "/")
    );
    let t = Target::parse("http://[2001:db8::10]:8080/healthz?x=1").expect("v6");
    assert_eq!((t.host.as_str(), t.port), ("2001:db8::10", 8080));
    assert_eq!(t.authority, "[2001:db8::10]:8080");
    assert_eq!(t.path_and_query, "/healthz?x=1");
    let t = Target::parse("192.0.2.10:81").expect("no scheme");
    assert_eq!((t.port, t.url.as_str()), (81, "http://192.0.2.10:81/"));
    let t = Target::parse("tcp://192.0.2.10:6443").expect("tcp");
    assert!(t.tcp_only);
    assert_eq!(
        (t.host.as_str(), t.port, t.url.as_str()),
        ("192.0.2.10", 6443, "tcp://192.0.2.10:6443")
    );
    assert!(!Target::parse("http://192.0.2.10/").unwrap().tcp_only);
    for bad in [
        "tcp://192.0.2.10",
        "https://192.0.2.10/",
        "ftp://x/",
        "http://",
        "http://u@x/",
        "http://x:99999/",
        "http://x:0/",
    ] {
        match Target::parse(bad) {
            Err(ProbeError::InvalidArg { flag, value, .. }) => {
                assert_eq!((flag, value.as_str()), ("TARGET", bad));
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}
