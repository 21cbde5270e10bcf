use std::path::PathBuf;

use super::figures::*;
use super::lease::*;
use super::options::*;
use super::*;

#[test]
fn defaults() {
    let o = Options::parse(&[]).unwrap();
    assert_eq!(o.timings, vec![Timings::parse("fast").unwrap()]);
    assert_eq!(o.loads, vec![0, 4, 16, 64]);
    assert_eq!(o.seconds, 60);
    assert_eq!((o.objects, o.object_kib), (2000, 4));
    assert!(o.build && !o.verbose && o.vipd_path.is_none());
}

#[test]
fn flags() {
    let o = Options::parse(&[
        "--timings",
        "default,fast,5/3/1",
        "--load",
        "0,8,32",
        "--seconds",
        "30",
        "--objects",
        "500",
        "--object-kib",
        "8",
        "--no-build",
        "--vipd",
        "/x/vipd",
        "-v",
    ])
    .unwrap();
    let labels: Vec<&str> = o.timings.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(labels, ["default", "fast", "5/3/1"]);
    assert!(o.timings[1].nft_fence);
    assert_eq!(o.loads, vec![0, 8, 32]);
    assert_eq!(o.seconds, 30);
    assert_eq!((o.objects, o.object_kib), (500, 8));
    assert!(!o.build && o.verbose);
    assert_eq!(o.vipd_path, Some(PathBuf::from("/x/vipd")));
}

#[test]
fn bad_values_name_flag_and_value() {
    let err = |a: &[&str]| format!("{:#}", Options::parse(a).unwrap_err());
    assert!(err(&["--load", "0,x"]).contains("--load: \"x\""));
    assert!(err(&["--load", "513"]).contains("--load: 513 is outside 0..=512"));
    assert!(err(&["--seconds", "0"]).contains("--seconds: 0 is outside"));
    assert!(err(&["--objects", "-1"]).contains("--objects: \"-1\""));
    assert!(err(&["--object-kib", "600"]).contains("--object-kib: 600"));
    assert!(err(&["--timings", "0.4/0.6/0.2"]).contains("invalid --timings value"));
    assert!(err(&["--seconds"]).contains("--seconds needs a value"));
    assert!(err(&["--bogus"]).contains("unknown option \"--bogus\""));
}

#[test]
fn renew_time_of_day() {
    assert_eq!(time_of_day("2026-12-01T21:40:00.250000Z"), Some(78_000.25));
    assert_eq!(time_of_day("2026-12-01T00:00:01Z"), Some(1.0));
    assert_eq!(time_of_day("2026-12-01 21:40:00Z"), None);
    assert_eq!(time_of_day("2026-12-01T21:40:00+01:00"), None);
    assert_eq!(tod_diff(86_399.5, 0.5), 1.0);
}

fn w(holder: &str, t: Option<f64>) -> LeaseWrite {
    LeaseWrite {
        holder: holder.into(),
        renew_tod: t,
    }
}

#[test]
fn holder_changes_skip_releases_and_renewals() {
    let first = w("node-a", Some(0.0));
    let writes = [
        w("node-a", Some(1.0)),
        w("", None),
        w("node-a", Some(3.0)),
        w("node-b", Some(4.0)),
        w("node-b", Some(5.0)),
        w("", None),
        w("node-c", Some(7.0)),
    ];
    assert_eq!(holder_changes(&first, &writes), 2);
    assert_eq!(holder_changes(&w("", None), &writes[..1]), 0);
}

#[test]
fn write_gaps_count_window_edges() {
    let writes = [w("a", Some(10.5)), w("a", Some(11.0)), w("a", Some(13.0))];
    // Window 10..13.2: gaps 0.5, 0.5, 2.0, 0.2 s.
    assert!((max_write_gap_ms(&writes, 10.0, 13.2) - 2000.0).abs() < 1e-6);
    // Writes outside the window are ignored: 10.9..12 sees 11.0 only.
    assert!((max_write_gap_ms(&writes, 10.9, 12.0) - 1000.0).abs() < 1e-6);
}

const METRICS: &str = "# TYPE vipd_lease_renew_duration_seconds histogram\n\
    vipd_lease_renew_duration_seconds_bucket{lease_name=\"kube-system/plndr-cp-lock\",le=\"0.1\"} 6\n\
    vipd_lease_renew_duration_seconds_bucket{lease_name=\"kube-system/plndr-cp-lock\",le=\"0.25\"} 8\n\
    vipd_lease_renew_duration_seconds_bucket{lease_name=\"kube-system/plndr-cp-lock\",le=\"0.5\"} 10\n\
    vipd_lease_renew_duration_seconds_bucket{lease_name=\"kube-system/plndr-cp-lock\",le=\"+Inf\"} 10\n\
    vipd_lease_renew_duration_seconds_sum{lease_name=\"kube-system/plndr-cp-lock\"} 1.5\n\
    vipd_lease_renew_duration_seconds_count{lease_name=\"kube-system/plndr-cp-lock\"} 10\n\
    vipd_lease_renew_failures_total{lease_name=\"kube-system/plndr-cp-lock\"} 3\n";

#[test]
fn histogram_parsing_and_quantiles() {
    let b = histogram_buckets(METRICS, RENEW_HISTOGRAM);
    assert_eq!(
        b,
        vec![(0.1, 6.0), (0.25, 8.0), (0.5, 10.0), (f64::INFINITY, 10.0)]
    );
    // Rank 5 of 10 in the first bucket: 5/6 of 0..0.1.
    assert!((histogram_quantile(&b, 0.5).unwrap() - 0.1 * 5.0 / 6.0).abs() < 1e-9);
    // Rank 9.5 in 0.25..0.5, 1.5 of its 2.
    assert!((histogram_quantile(&b, 0.95).unwrap() - 0.4375).abs() < 1e-9);
    assert_eq!(
        histogram_quantile(&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.5),
        None
    );
    assert_eq!(
        histogram_quantile(&[(0.1, 1.0), (f64::INFINITY, 4.0)], 0.95),
        Some(0.1)
    );
    let (buckets, sum, count, failures) = renew_totals(&[METRICS.to_string(), METRICS.to_string()]);
    assert_eq!(buckets[1], (0.25, 16.0));
    assert_eq!((sum, count, failures), (3.0, 20.0, 6.0));
    assert_eq!(
        bucket_diff(&buckets, &b),
        vec![(0.1, 6.0), (0.25, 8.0), (0.5, 10.0), (f64::INFINITY, 10.0)]
    );
}

#[test]
fn log_lines_counted() {
    let log = "2026-12-01T21:00:00Z  INFO acquired lease; leading lease=kube-system/plndr-cp-lock term=1\n\
        2026-12-01T21:00:01Z  WARN stepping down lease=kube-system/plndr-cp-lock term=1 reason=\"renewals failed for 412 ms\"\n\
        2026-12-01T21:00:02Z  WARN local API server unhealthy; stepping down and not campaigning error=/livez: timed out\n\
        2026-12-01T21:00:02Z  INFO acquired lease; leading lease=kube-system/plndr-cp-lock term=2\n\
        2026-12-01T21:00:03Z  INFO stepping down: shutting down lease=kube-system/plndr-cp-lock term=2\n";
    let (downs, acquired, reasons) = log_counts(log);
    assert_eq!((downs, acquired), (2, 2));
    assert_eq!(reasons, ["renewals failed for 412 ms", "(none given)"]);
    assert_eq!(reason_kind(&reasons[0]), "renewals failed for N ms");
}
