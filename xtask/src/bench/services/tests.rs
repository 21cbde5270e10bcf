use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::OnceLock;

use xtask::lab;

use super::coldstart::{coldstart_limit, slowest};
use super::context::LeaseSeen;
use super::drain::*;
use super::http::*;
use super::poweroff::*;
use super::*;
use crate::bench::harness::api::*;
use crate::bench::harness::procfs::*;
use crate::bench::harness::text::*;

#[test]
fn options_defaults_and_errors_name_flag_and_value() {
    let o = Options::parse(&[]).unwrap();
    assert_eq!(o, Options::default());
    let o = Options::parse(&["--scenario", "churn", "--minutes", "2.5", "--no-build"]).unwrap();
    assert_eq!(o.scenarios, [Scenario::Churn].into());
    assert_eq!(o.minutes, 2.5);
    assert!(!o.build);
    let o = Options::parse(&["--scenario", "scale,bringup", "--services", "300"]).unwrap();
    assert_eq!(o.scenarios, [Scenario::Bringup, Scenario::Scale].into());
    assert_eq!(o.services, 300);
    for (args, needle) in [
        (vec!["--scenario", "fast"], "\"fast\""),
        (vec!["--services", "0"], "--services"),
        (vec!["--services", "x1"], "\"x1\""),
        (vec!["--minutes", "-1"], "--minutes"),
        (vec!["--minutes"], "needs a value"),
        (vec!["--frobnicate"], "--frobnicate"),
    ] {
        let e = Options::parse(&args).unwrap_err().to_string();
        assert!(e.contains(needle), "{args:?}: {e}");
    }
}

#[test]
fn dhcp_scenario_and_its_service_count_are_parsed() {
    let o = Options::parse(&["--scenario", "dhcp", "--dhcp-services", "7"]).unwrap();
    assert_eq!(o.scenarios, [Scenario::Dhcp].into());
    assert_eq!(o.dhcp_services, 7);
    assert_eq!(Options::default().dhcp_services, 20);
    assert!(Options::default().scenarios.contains(&Scenario::Dhcp));
    let e = Options::parse(&["--dhcp-services", "72"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--dhcp-services") && e.contains("72"), "{e}");
}

#[test]
fn drain_scenario_is_parsed_and_in_all() {
    let o = Options::parse(&["--scenario", "drain"]).unwrap();
    assert_eq!(o.scenarios, [Scenario::Drain].into());
    let o = Options::parse(&["--scenario", "all"]).unwrap();
    assert!(o.scenarios.contains(&Scenario::Drain));
}

#[test]
fn drain_move_is_last_old_answer_to_first_new_one() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let a = || Some("node-a".to_string());
    let b = || Some("node-b".to_string());
    let log = vec![
        (at(0), a()),
        (at(10), a()),
        (at(20), None),
        (at(30), None),
        (at(70), b()),
        (at(80), b()),
    ];
    let m = drain_move(&log, "node-a", at(5)).unwrap();
    assert_eq!((m.gap_ms, m.failures, m.to.as_str()), (60.0, 2, "node-b"));
    assert_eq!((m.last_old_ms, m.first_new_ms), (5.0, 65.0));
    assert_eq!(drain_move(&log, "node-c", t0), None, "never on node-c");
    assert_eq!(
        drain_move(&log[..4], "node-a", t0),
        None,
        "never answered again"
    );
    assert_eq!(longest_gap_ms(&log), 60.0);
    assert_eq!(longest_gap_ms(&log[..1]), 0.0);
}

#[test]
fn addresses_stay_in_the_lab_subnets() {
    assert_eq!(v4_address(0).unwrap().to_string(), "192.0.2.150");
    assert_eq!(v4_address(49).unwrap().to_string(), "192.0.2.199");
    assert!(v4_address(50).is_err());
    assert_eq!(scale_address(0).unwrap().to_string(), "2001:db8::1:1");
    assert_eq!(scale_address(999).unwrap().to_string(), "2001:db8::1:3e8");
    assert!(scale_address(MAX_SCALE_SERVICES).is_err());
    assert_eq!(v6_bringup_address(9).unwrap().to_string(), "2001:db8::2:a");
    let all: BTreeSet<IpAddr> = (0..MAX_SCALE_SERVICES)
        .map(|i| scale_address(i).unwrap())
        .collect();
    assert_eq!(all.len(), MAX_SCALE_SERVICES, "addresses are distinct");
    // None collides with the nodes (::11-13), the client (::100) or the gateway (::1).
    for ip in [lab::CLIENT_V6, lab::GATEWAY_V6] {
        assert!(!all.contains(&IpAddr::V6(ip)));
    }
}

#[test]
fn service_json_carries_address_annotation() {
    let s = service_json("web", "2001:db8::1:5".parse().unwrap());
    assert_eq!(
        s["metadata"]["annotations"]["kube-vip.io/loadbalancerIPs"],
        "2001:db8::1:5"
    );
    assert_eq!(s["spec"]["type"], "LoadBalancer");
    assert_eq!(s["spec"]["ports"][0]["port"], 80);
}

#[test]
fn proc_parsing() {
    let status = "Name:\tvipd\nVmRSS:\t   12345 kB\nThreads:\t7\n";
    assert_eq!(status_field(status, "VmRSS"), Some(12345));
    assert_eq!(status_field(status, "Threads"), Some(7));
    assert_eq!(status_field(status, "VmSwap"), None);
    let stat = "42 (vipd (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0";
    assert_eq!(stat_cpu_ticks(stat), Some(300));
    assert_eq!(stat_cpu_ticks("garbage"), None);
}

#[test]
fn metrics_parsing() {
    let text = "# HELP vipd_vips_held VIPs\n# TYPE vipd_vips_held gauge\nvipd_vips_held 3\n\
                kube_vip_active_services{namespace=\"default\"} 2\n\
                kube_vip_active_services{namespace=\"other\"} 1\n\
                vipd_tokio_alive_tasks 41\n";
    assert_eq!(metric_sum(text, "vipd_vips_held"), Some(3.0));
    assert_eq!(metric_sum(text, "kube_vip_active_services"), Some(3.0));
    assert_eq!(metric_sum(text, "vipd_missing"), None);
    assert_eq!(
        task_metrics(text),
        vec![("vipd_tokio_alive_tasks".to_string(), 41.0)]
    );
}

#[test]
fn log_findings_counts_levels_and_dedups() {
    let log = "2025-01-01T00:00:00Z  INFO started\n\
               2025-01-01T00:00:01Z  WARN lease renew failed lease=a\n\
               2025-01-01T00:00:02Z  WARN lease renew failed lease=a\n\
               2025-01-01T00:00:03Z ERROR watch failed\n\
               thread 'x' panicked at src/a.rs\n";
    let (w, e, p, ex) = log_findings(log);
    assert_eq!((w, e, p), (2, 1, 1));
    assert_eq!(ex.len(), 2, "{ex:?}");
    assert!(ex[0].starts_with("WARN lease renew failed"), "{ex:?}");
}

#[test]
fn http_answer_reads_node_name_and_rejects_non_200() {
    use std::net::TcpListener;
    let serve = |reply: &'static str| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf);
            s.write_all(reply.as_bytes()).unwrap();
        });
        addr
    };
    let a = serve("HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nnode-b\n");
    assert_eq!(http_answer(a).unwrap(), "node-b");
    let a = serve("HTTP/1.0 503 Service Unavailable\r\n\r\nbusy\n");
    assert!(http_answer(a).is_err());
}

#[test]
fn coldstart_scenario_is_parsed_and_uses_the_service_count() {
    for word in ["coldstart", "cold-start"] {
        let o = Options::parse(&["--scenario", word, "--services", "200"]).unwrap();
        assert_eq!(o.scenarios, [Scenario::Coldstart].into());
        assert_eq!(o.services, 200);
    }
    let o = Options::parse(&["--scenario", "coldstart,scale,bringup"]).unwrap();
    assert_eq!(
        o.scenarios.into_iter().collect::<Vec<_>>(),
        [Scenario::Bringup, Scenario::Scale, Scenario::Coldstart],
        "runs right after scale"
    );
    let all = Options::parse(&["--scenario", "all"]).unwrap().scenarios;
    assert!(!all.contains(&Scenario::Coldstart), "all leaves it out");
    assert!(!Options::default().scenarios.contains(&Scenario::Coldstart));
    let o = Options::parse(&["--scenario", "all,coldstart"]).unwrap();
    assert_eq!(o.scenarios.len(), Scenario::ALL.len() + 1);
    let e = Options::parse(&["--scenario", "cold"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("coldstart"), "names it among the expected: {e}");
}

#[test]
fn coldstart_limit_is_a_minute_plus_a_hundredth_second_per_service() {
    assert_eq!(coldstart_limit(0), Duration::from_secs(60));
    assert_eq!(coldstart_limit(200), Duration::from_secs(62));
    assert_eq!(coldstart_limit(1000), Duration::from_secs(70));
    assert_eq!(coldstart_limit(1050), Duration::from_millis(70_500));
}

#[test]
fn slowest_lists_the_latest_answers_first() {
    let t0 = Instant::now();
    let answered: Vec<OnceLock<Answer>> = [Some(30), None, Some(50), Some(10), Some(50)]
        .into_iter()
        .map(|ms| {
            let l = OnceLock::new();
            if let Some(ms) = ms {
                let _ = l.set(Answer {
                    at: t0 + Duration::from_millis(ms),
                    node: "node-a".into(),
                });
            }
            l
        })
        .collect();
    let s: Vec<(usize, u128)> = slowest(&answered, t0, 3)
        .into_iter()
        .map(|(i, d)| (i, d.as_millis()))
        .collect();
    assert_eq!(s, [(2, 50), (4, 50), (0, 30)]);
    assert!(slowest(&answered, t0, 0).is_empty());
}

/// A loopback HTTP server answering every connection with a 200 whose body is `node` (what
/// a lab node's backend answers), for the poller's tests; its address.
fn http_node(node: &'static str) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf);
            let _ = s.write_all(format!("HTTP/1.0 200 OK\r\n\r\n{node}\n").as_bytes());
        }
    });
    addr
}

#[test]
fn poller_records_answers_and_gives_up_at_the_limit() {
    use std::net::{SocketAddr, TcpListener};
    // Answers every connection with a 200 from "node-c".
    let up = http_node("node-c");
    // A port nobody listens on: refused at once.
    let down: SocketAddr = {
        let l = TcpListener::bind("127.0.0.2:0").unwrap();
        l.local_addr().unwrap()
    };
    let limit = Duration::from_millis(100);
    let p = Poller::new(3, limit);
    let t0 = Instant::now();
    p.add_all([(0, up, t0), (2, down, t0)]);
    // "up" is carried, "down" is not.
    let carried = || Ok(BTreeSet::from([up.ip()]));
    std::thread::scope(|s| {
        let polling = s.spawn(|| p.run(&carried));
        // Added while it runs, before it is closed.
        p.add(1, up, Instant::now());
        p.close();
        polling.join().unwrap().unwrap();
    });
    assert!(
        t0.elapsed() >= limit,
        "waited for the one that never answers"
    );
    assert_eq!(p.answered[0].get().unwrap().node, "node-c");
    assert_eq!(p.answered[1].get().unwrap().node, "node-c");
    assert!(p.answered[2].get().is_none());
    let f = p.failures();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].contains(&down.to_string()), "{f:?}");
    assert!(f[0].contains("never carried"), "{f:?}");
    // One attempt per POLL_INTERVAL at most: about 10 for the refused one.
    assert!(p.attempts() >= 3 && p.attempts() <= 20, "{}", p.attempts());
    let st = p.stats();
    assert!(st.samples >= 1 && st.sample_errors == 0, "{st:?}");
}

#[test]
fn a_carried_address_is_tried_at_once_and_its_delay_reported() {
    let up = http_node("node-a");
    let p = Poller::new(1, Duration::from_secs(10));
    let listings = std::sync::atomic::AtomicUsize::new(0);
    // The first listing fails; the next ones show the address carried.
    let carried = || {
        if listings.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            anyhow::bail!("no such device")
        }
        Ok(BTreeSet::from([up.ip()]))
    };
    std::thread::scope(|s| {
        let polling = s.spawn(|| p.run(&carried));
        // The third listing starts once the second (the first to succeed) is in force.
        while listings.load(std::sync::atomic::Ordering::SeqCst) < 3 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Added after a listing showed its address: queued with the carried ones.
        p.add(0, up, Instant::now());
        p.close();
        polling.join().unwrap().unwrap();
    });
    assert_eq!(p.answered[0].get().unwrap().node, "node-a");
    let st = p.stats();
    assert_eq!((st.attempts, st.carried_attempts), (1, 1), "{st:?}");
    assert_eq!(st.first_tries_ms.len(), 1, "{st:?}");
    assert!(st.first_tries_ms[0] < 1000.0, "{st:?}");
    assert!(st.samples >= 2, "{st:?}");
    assert_eq!(st.sample_errors, 1, "{st:?}");
    assert_eq!(st.first_sample_error.as_deref(), Some("no such device"));
    let line = st.line(Duration::from_secs(1));
    assert!(line.contains("1 attempts in 1.0 s"), "{line}");
    assert!(line.contains("1 failed, first: no such device"), "{line}");
}

fn pending(i: usize, low: u16, start: Instant) -> Pending {
    let ip = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 1, low));
    Pending::new(i, std::net::SocketAddr::new(ip, 80), start)
}

fn taken(s: &mut Schedule, role: Role) -> Vec<usize> {
    std::iter::from_fn(|| s.take(role)).map(|p| p.i).collect()
}

#[test]
fn the_schedule_tries_carried_addresses_first_and_the_others_in_the_background() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut s = Schedule::default();
    for i in 0..4 {
        assert!(!s.add(pending(i, i as u16 + 1, t0)), "no listing yet");
    }
    assert!(s.take(Role::Carried).is_none(), "nothing carried yet");
    // A listing at 200 ms: 2 and 4 (Services 1 and 3) are carried.
    s.sampled(addr_set(&[2, 4, 9]), t0 + ms(200));
    let one = s.take(Role::Carried).unwrap();
    assert_eq!(
        (one.i, one.carried, one.seen_carried),
        (1, true, Some(t0 + ms(200)))
    );
    assert_eq!(taken(&mut s, Role::Background), [0, 2]);
    // Service 1 failed and goes back (still carried); Service 0 failed too.
    let mut one = one;
    one.next = t0 + ms(210);
    assert!(s.put_back(one));
    assert!(!s.put_back(pending(0, 1, t0)));
    assert!(!s.is_idle(), "2 still in flight");
    // The next listing: 1 and 3 carried (Services 0 and 2), 2 no longer (Service 1).
    s.sampled(addr_set(&[1, 3, 4]), t0 + ms(400));
    s.done(); // Service 2 in flight answers (it is carried now, but no longer queued).
    let c: Vec<(usize, Option<Instant>)> = std::iter::from_fn(|| s.take(Role::Carried))
        .map(|p| (p.i, p.seen_carried))
        .collect();
    assert_eq!(c, [(3, Some(t0 + ms(200))), (0, Some(t0 + ms(400)))]);
    let b: Vec<(usize, Option<Instant>)> = std::iter::from_fn(|| s.take(Role::Background))
        .map(|p| (p.i, p.seen_carried))
        .collect();
    assert_eq!(
        b,
        [(1, Some(t0 + ms(200)))],
        "no longer carried: back in the background, first seen kept"
    );
    // Services 3, 0 and 1 in flight: done with all of them.
    for _ in 0..3 {
        s.done();
    }
    assert!(s.is_idle());
    // Added after a listing that shows its address: carried from its start (or the listing).
    assert!(s.add(pending(7, 3, t0 + ms(500))));
    assert!(s.add(pending(8, 3, t0)));
    let c: Vec<(usize, Option<Instant>)> = std::iter::from_fn(|| s.take(Role::Carried))
        .map(|p| (p.i, p.seen_carried))
        .collect();
    assert_eq!(c, [(7, Some(t0 + ms(500))), (8, Some(t0 + ms(400)))]);
}

#[test]
fn the_first_try_after_an_address_is_seen_carried_is_reported_once() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut p = pending(0, 1, t0);
    assert_eq!(p.attempt(t0), None, "not carried yet");
    p.seen_carried = Some(t0 + ms(200));
    assert_eq!(p.attempt(t0 + ms(203)), Some(ms(3)));
    assert_eq!(p.attempt(t0 + ms(300)), None, "only the first");
    assert_eq!(p.attempts, 3);
    p.last_error = Some("connection refused".into());
    let f = p.never_answered(Duration::from_secs(30));
    assert!(
        f.contains("2001:db8::1:1")
            && f.contains("3 attempts")
            && f.contains("carried 200 ms after its wait began")
            && f.contains("connection refused"),
        "{f}"
    );
    let f = pending(1, 2, t0).never_answered(Duration::from_secs(30));
    assert!(
        f.contains("never carried") && f.contains("0 attempts"),
        "{f}"
    );
}

#[test]
fn carried_addresses_are_tried_with_a_short_connect_timeout_that_doubles() {
    let mut p = pending(0, 1, Instant::now());
    let ms = Duration::from_millis;
    assert_eq!(p.connect_timeout(), CONNECT_TIMEOUT, "not carried");
    p.carried = true;
    let mut seen = Vec::new();
    for failures in 0..6 {
        p.carried_failures = failures;
        seen.push(p.connect_timeout());
    }
    assert_eq!(seen, [ms(50), ms(100), ms(200), ms(200), ms(200), ms(200)]);
    p.carried_failures = u32::MAX;
    assert_eq!(p.connect_timeout(), CONNECT_TIMEOUT);
    p.carried = false;
    assert_eq!(p.connect_timeout(), CONNECT_TIMEOUT);
}

#[test]
fn queued_services_past_their_limit_are_given_up() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut s = Schedule::default();
    s.add(pending(0, 1, t0));
    s.add(pending(1, 2, t0 + ms(50)));
    s.add(pending(2, 3, t0));
    s.sampled(addr_set(&[3]), t0 + ms(10));
    let in_flight = s.take(Role::Background).unwrap();
    assert_eq!(in_flight.i, 0);
    let gone: Vec<usize> = s
        .expire(t0 + ms(100), ms(100))
        .iter()
        .map(|p| p.i)
        .collect();
    assert_eq!(gone, [2], "the one in flight is its thread's");
    assert_eq!(taken(&mut s, Role::Background), [1]);
    s.done();
    s.done();
    assert!(s.is_idle());
    s.add(pending(3, 4, t0));
    s.clear();
    assert!(s.take(Role::Background).is_none());
}

#[test]
fn listings_start_every_interval_but_take_at_most_half_the_time() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let iv = ms(200);
    assert_eq!(next_sample_start(t0, t0 + ms(20), iv), t0 + ms(200));
    assert_eq!(next_sample_start(t0, t0 + ms(100), iv), t0 + ms(200));
    assert_eq!(next_sample_start(t0, t0 + ms(150), iv), t0 + ms(300));
    assert_eq!(next_sample_start(t0, t0 + ms(400), iv), t0 + ms(800));
}

#[test]
fn the_polling_line_gives_the_first_try_delays_and_the_listings() {
    let st = PollStats {
        attempts: 1200,
        carried_attempts: 400,
        carried_failures: 7,
        first_tries_ms: vec![1.0, 2.0, 3.0, 90.0],
        carried_to_answer_ms: vec![4.0, 1500.0],
        carried_errors: vec![("TimedOut".into(), 5), ("ConnectionRefused".into(), 2)],
        samples: 51,
        sample_errors: 0,
        first_sample_error: None,
        sample_periods_ms: vec![200.0, 201.0, 230.0],
        sample_took_ms: vec![5.0, 6.0, 30.0],
    };
    let line = st.line(Duration::from_secs(10));
    for part in [
        "1200 attempts in 10.0 s (64 threads)",
        "listing -> first try: p50 2 ms, p95 90 ms, max 90 ms (n=4)",
        "listed 51 times, every 201 ms (p50, max 230 ms)",
        "a listing took 6 ms (p50, max 30 ms), none failed",
        "400 attempts to carried addresses (7 failed: TimedOut 5, ConnectionRefused 2), 800 (80/s, 8 threads) to the others",
        "carried address, listing -> answer: p50 4 ms, p95 1500 ms, max 1500 ms (n=2)",
    ] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
}

#[test]
fn an_abandoned_poller_stops_before_the_limit() {
    let down: std::net::SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let p = Poller::new(1, Duration::from_secs(60));
    p.add(0, down, Instant::now());
    let t0 = Instant::now();
    let carried = || Ok(BTreeSet::new());
    std::thread::scope(|s| {
        let polling = s.spawn(|| p.run(&carried));
        std::thread::sleep(Duration::from_millis(50));
        p.abandon();
        polling.join().unwrap().unwrap();
    });
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(p.answered[0].get().is_none());
    assert!(p.failures().is_empty());
}

#[test]
fn service_lease_timing_is_svc_then_vip_then_vipd_defaults() {
    let env = |kv: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            kv.iter()
                .find(|(ek, _)| *ek == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let t = service_lease_timing(env(&[]));
    assert_eq!(
        t.iter().map(|v| (v.secs, v.key)).collect::<Vec<_>>(),
        [(3.0, None), (2.0, None), (1.0, None)]
    );
    assert_eq!(timing_text(&t), "3/2/1 s (vipd's defaults)");

    let t = service_lease_timing(env(&[
        ("svc_leaseduration", "9"),
        ("svc_renewdeadline", "6"),
        ("svc_retryperiod", "3"),
        ("vip_leaseduration", "5"),
    ]));
    assert_eq!(
        timing_text(&t),
        "9/6/3 s (svc_leaseduration=9, svc_renewdeadline=6, svc_retryperiod=3)"
    );

    // vip_* is what svc_* defaults to; a value vipd would refuse counts as unset.
    let t = service_lease_timing(env(&[
        ("vip_leaseduration", "5"),
        ("vip_renewdeadline", "3"),
        ("svc_retryperiod", "0.5"),
        ("svc_renewdeadline", "x"),
        ("vip_retryperiod", "1"),
    ]));
    assert_eq!(
        t.iter().map(|v| (v.secs, v.key)).collect::<Vec<_>>(),
        [
            (5.0, Some("vip_leaseduration")),
            (3.0, Some("vip_renewdeadline")),
            (0.5, Some("svc_retryperiod"))
        ]
    );
    let t = service_lease_timing(env(&[("svc_leaseduration", "0.6")]));
    assert_eq!(
        timing_text(&t),
        "0.6/2/1 s (svc_leaseduration=0.6; the rest vipd's defaults)"
    );
}

fn addr_set(lows: &[u16]) -> BTreeSet<IpAddr> {
    lows.iter()
        .map(|l| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 1, *l)))
        .collect()
}

fn carried_map(nodes: &[(&str, &[u16])]) -> BTreeMap<String, BTreeSet<IpAddr>> {
    nodes
        .iter()
        .map(|(n, l)| (n.to_string(), addr_set(l)))
        .collect()
}

#[test]
fn the_node_carrying_the_most_is_powered_off() {
    let c = carried_map(&[
        ("node-a", &[1, 2]),
        ("node-b", &[3, 4, 5]),
        ("node-c", &[6]),
    ]);
    assert_eq!(most_carrying(&c), Some("node-b"));
    let tie = carried_map(&[("node-a", &[1]), ("node-b", &[2, 3]), ("node-c", &[4, 5])]);
    assert_eq!(
        most_carrying(&tie),
        Some("node-b"),
        "first by name on a tie"
    );
    let none = carried_map(&[("node-a", &[]), ("node-b", &[])]);
    assert_eq!(most_carrying(&none), None);
}

#[test]
fn double_carriers_count_samples_with_an_address_on_two_nodes() {
    let watched = addr_set(&[1, 2, 3, 4]);
    let ms = Duration::from_millis;
    let mut dc = DoubleCarriers::default();
    // Nobody has taken over yet; then a clean split; an address of another Service (9) on
    // both is not watched.
    dc.add(
        ms(0),
        &watched,
        &carried_map(&[("node-a", &[]), ("node-c", &[9])]),
    );
    dc.add(
        ms(200),
        &watched,
        &carried_map(&[("node-a", &[1, 2, 9]), ("node-c", &[3, 9])]),
    );
    assert_eq!((dc.samples, dc.samples_with), (2, 0));
    assert!(dc.first.is_empty() && dc.addresses.is_empty());
    // 3 on both, then 3 and 4 on both, then clean again.
    dc.add(
        ms(400),
        &watched,
        &carried_map(&[("node-a", &[1, 2, 3]), ("node-c", &[3])]),
    );
    dc.add(
        ms(600),
        &watched,
        &carried_map(&[("node-a", &[1, 2, 3, 4]), ("node-c", &[3, 4])]),
    );
    dc.add(
        ms(800),
        &watched,
        &carried_map(&[("node-a", &[1, 2]), ("node-c", &[3, 4])]),
    );
    assert_eq!((dc.samples, dc.samples_with), (5, 2));
    assert_eq!(dc.addresses, addr_set(&[3, 4]));
    let first: Vec<(String, u128, Vec<String>)> = dc
        .first
        .iter()
        .map(|(a, at, n)| (a.to_string(), at.as_millis(), n.clone()))
        .collect();
    let both = vec!["node-a".to_string(), "node-c".to_string()];
    assert_eq!(
        first,
        [
            ("2001:db8::1:3".to_string(), 400, both.clone()),
            ("2001:db8::1:4".to_string(), 600, both)
        ]
    );
    let (per_node, none) = dc.last.clone().unwrap();
    assert_eq!(per_node.get("node-a"), Some(&2));
    assert_eq!(per_node.get("node-c"), Some(&2));
    assert_eq!(none, 0);
    dc.add(
        ms(1000),
        &watched,
        &carried_map(&[("node-a", &[1]), ("node-c", &[3])]),
    );
    assert_eq!(dc.last.as_ref().unwrap().1, 2, "2 and 4 on neither");
    // Only the first few are listed; all are counted.
    let many = addr_set(&(1..=20).collect::<Vec<_>>());
    let mut dc = DoubleCarriers::default();
    let all: Vec<u16> = (1..=20).collect();
    dc.add(
        ms(0),
        &many,
        &carried_map(&[("node-a", &all), ("node-b", &all)]),
    );
    assert_eq!(dc.samples_with, 1);
    assert_eq!(dc.addresses.len(), 20);
    assert_eq!(dc.first.len(), DOUBLE_CARRIERS_LISTED);
}

/// The power-off's two-responder samples count an address on two nodes only where both
/// fences let it be answered and it is still there after the fence was read: an inert
/// second-line address (armed, element expired) on the node that lost it is no responder,
/// nor is one whose removal ended (and whose fence was disarmed after it) between the
/// listing and the fence read; the fence is read only for a sample with doubles.
#[test]
fn an_inert_second_line_address_is_no_second_responder() {
    use super::poweroff::drop_inert_doubles;
    use std::cell::Cell;
    use xtask::lab::FenceView;
    let a: IpAddr = "2001:db8::1:10".parse().unwrap();
    let b: IpAddr = "2001:db8::1:11".parse().unwrap();
    let sample_of = |pairs: &[(&str, &[IpAddr])]| -> BTreeMap<String, BTreeSet<IpAddr>> {
        pairs
            .iter()
            .map(|(n, addrs)| (n.to_string(), addrs.iter().copied().collect()))
            .collect()
    };
    let mut sample = sample_of(&[("node-a", &[a, b]), ("node-c", &[a])]);
    let reads = Cell::new(0);
    drop_inert_doubles(
        &mut sample,
        |n| {
            reads.set(reads.get() + 1);
            match n {
                // node-a lost `a` (armed, not live); it still answers `b`.
                "node-a" => FenceView::new(vec![a, b], vec![b]),
                _ => FenceView::new(vec![a], vec![a]),
            }
        },
        |_| None,
    );
    assert_eq!(sample["node-a"], [b].into());
    assert_eq!(sample["node-c"], [a].into());
    assert_eq!(reads.get(), 2);
    // Live on both and still there: a second responder, kept.
    let mut both = sample_of(&[("node-a", &[a]), ("node-c", &[a])]);
    drop_inert_doubles(
        &mut both,
        |_| FenceView::new(vec![a], vec![a]),
        |_| Some([a].into()),
    );
    assert_eq!(both["node-a"], [a].into());
    assert_eq!(both["node-c"], [a].into());
    // node-a was removing `a` during the listing, then disarmed it: not fenced when the
    // fence is read, gone from the second listing. No responder.
    let mut removing = sample_of(&[("node-a", &[a, b]), ("node-c", &[a])]);
    drop_inert_doubles(
        &mut removing,
        |n| match n {
            "node-a" => FenceView::new(vec![b], vec![b]),
            _ => FenceView::new(vec![a], vec![a]),
        },
        |n| match n {
            "node-a" => Some([b].into()),
            _ => Some([a].into()),
        },
    );
    assert_eq!(removing["node-a"], [b].into());
    assert_eq!(removing["node-c"], [a].into());
    // Not fenced and still there (a node answering it with no fence): kept.
    let mut unfenced = sample_of(&[("node-a", &[a]), ("node-c", &[a])]);
    drop_inert_doubles(
        &mut unfenced,
        |n| match n {
            "node-a" => FenceView::new(vec![], vec![]),
            _ => FenceView::new(vec![a], vec![a]),
        },
        |_| Some([a].into()),
    );
    assert_eq!(unfenced["node-a"], [a].into());
    assert_eq!(unfenced["node-c"], [a].into());
    // No doubles: no fence read, no listing.
    let mut single = sample_of(&[("node-a", &[a]), ("node-c", &[b])]);
    drop_inert_doubles(
        &mut single,
        |_| panic!("read without doubles"),
        |_| panic!("listed without doubles"),
    );
}

#[test]
fn bench_log_filter_keeps_the_line_the_bench_waits_for() {
    use super::context::vipd_log_filter;
    assert_eq!(vipd_log_filter(""), None);
    assert_eq!(vipd_log_filter("  "), None);
    assert_eq!(
        vipd_log_filter("warn").as_deref(),
        Some("warn,vipd::services::runtime=info")
    );
    assert_eq!(
        vipd_log_filter("info,vipd::election=debug").as_deref(),
        Some("info,vipd::election=debug,vipd::services::runtime=info")
    );
    // A filter that names the target is the user's choice.
    assert_eq!(
        vipd_log_filter("warn,vipd::services::runtime=debug").as_deref(),
        Some("warn,vipd::services::runtime=debug")
    );
}

/// The lease watch's record of a power-off: the last renewal by the powered-off node, the
/// first write by another holder after the power-off, the delay beyond the expiry; leases
/// the node did not hold, writes after the take and a take before the power-off (no
/// takeover) are not counted; leases of another duration are named apart.
#[test]
fn lease_moves_tell_each_lease_s_last_renewal_its_take_and_the_delay_past_expiry() {
    let start = Instant::now();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let lease = |key: &str, holder: &str, d: f64| {
        let (namespace, name) = key.split_once('/').unwrap();
        LeaseSeen {
            namespace: namespace.to_string(),
            name: name.to_string(),
            holder: holder.to_string(),
            duration_secs: Some(d),
        }
    };
    let listed = [
        lease("kube-system/shard-0", "node-a", 3.0),
        lease("kube-system/shard-1", "node-a", 3.0),
        lease("kube-system/shard-2", "node-a", 3.0),
        lease("default/shard-0", "node-b", 3.0),
        lease("kube-system/vipd-lease-gc", "node-a", 15.0),
    ];
    let mut m = LeaseMoves::new("node-a", &listed, 3.0);
    assert_eq!(m.moves.len(), 3);
    assert_eq!(
        m.other_durations,
        vec![("kube-system/vipd-lease-gc".to_string(), 15.0)]
    );
    m.observe(at(100), "kube-system/shard-0", "node-a");
    m.observe(at(1100), "kube-system/shard-0", "node-a");
    m.observe(at(1900), "kube-system/shard-1", "node-a");
    m.observe(at(1950), "default/shard-0", "node-c");
    // Handed over before the power-off (a rebalance): no takeover to measure.
    m.observe(at(1960), "kube-system/shard-2", "node-b");
    // Power-off at 2000 ms; lease duration 3 s.
    m.powered_off(at(2000));
    m.observe(at(2010), "kube-system/shard-1", "node-a");
    m.observe(at(4150), "kube-system/shard-0", "node-b");
    m.observe(at(4300), "kube-system/shard-0", "node-c");
    let moved = &m.moves["kube-system/shard-0"];
    assert_eq!(moved.last_renewal, Some(at(1100)));
    assert_eq!(
        moved.taken,
        Some((at(4150), "node-b".to_string())),
        "the first take counts"
    );
    assert!(
        !m.moves.contains_key("default/shard-0"),
        "same name, another namespace, another holder"
    );
    assert!(!m.moves.contains_key("kube-system/shard-2"), "taken before");
    let lines = m.lines(at(2000), Duration::from_secs(3));
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        lines[0].contains("taken by another node 1/2"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("max 2150 ms"), "{}", lines[0]);
    assert_eq!(
        lines[1], "kube-system/shard-1: last renewal seen +10 ms, taken not within the watch",
        "never taken: listed first; a renewal in flight at the power-off is seen after it"
    );
    assert_eq!(
        lines[2],
        "kube-system/shard-0: last renewal seen -900 ms, taken +2150 ms by node-b (+50 ms after its expiry)"
    );
    assert_eq!(
        lines[3],
        "left out, another lease duration: kube-system/vipd-lease-gc (15 s)"
    );
    // Hundreds of per-Service leases: the summary and the ones taken last.
    let many: Vec<LeaseSeen> = (0..100)
        .map(|i| lease(&format!("default/lease-{i:03}"), "node-a", 3.0))
        .collect();
    let mut m = LeaseMoves::new("node-a", &many, 3.0);
    m.powered_off(at(2000));
    for i in 0..100u64 {
        m.observe(at(1000), &format!("default/lease-{i:03}"), "node-a");
        m.observe(at(4000 + i), &format!("default/lease-{i:03}"), "node-b");
    }
    let lines = m.lines(at(2000), Duration::from_secs(3));
    assert_eq!(lines.len(), 2 + LEASES_LISTED, "{lines:?}");
    assert!(
        lines[0].contains("taken by another node 100/100"),
        "{}",
        lines[0]
    );
    assert!(lines[2].starts_with("default/lease-099: "), "{}", lines[2]);
    assert!(
        lines[17].starts_with("default/lease-084: "),
        "{}",
        lines[17]
    );
}

/// A Lease object's JSON as the list and the watch give it.
#[test]
fn a_lease_is_read_with_its_namespace_holder_and_duration() {
    let o = serde_json::json!({
        "metadata": {"name": "vipd-services-shard-3", "namespace": "kube-system", "resourceVersion": "7"},
        "spec": {"holderIdentity": "node-b", "leaseDurationSeconds": 3},
    });
    assert_eq!(
        LeaseSeen::from_json(&o),
        Some(LeaseSeen {
            namespace: "kube-system".into(),
            name: "vipd-services-shard-3".into(),
            holder: "node-b".into(),
            duration_secs: Some(3.0),
        })
    );
    assert_eq!(
        LeaseSeen::from_json(&o).map(|l| l.key()).as_deref(),
        Some("kube-system/vipd-services-shard-3")
    );
    assert_eq!(
        LeaseSeen::from_json(&serde_json::json!({"kind": "Status"})),
        None
    );
}

/// Benches running at once share the raised neighbour limits: the first one's originals
/// are kept, a later one's reading (already raised) is not taken for an original, the limits
/// go back only when the last bench still running ends, and a bench that died without
/// leaving holds nothing back (the new-user trial: a bench ending put the defaults back
/// under another one, and that one then put back the first one's raised values).
#[test]
fn benches_at_once_put_the_neighbour_limits_back_after_the_last() {
    use super::SharedLimits;
    let lim = |v: &str| vec![("/proc/x/gc_thresh3".to_string(), v.to_string())];
    let everyone = |_: (u32, u64)| true;
    let mut s = SharedLimits::default();
    s.join((1, 100), &lim("1024"), everyone);
    // Bench 2 starts after bench 1 raised the limit: it reads 2224, not an original.
    s.join((2, 200), &lim("2224"), everyone);
    assert_eq!(s.originals, lim("1024"));
    assert_eq!(SharedLimits::parse(&s.render()), s, "the file round-trips");
    assert!(s.leave((1, 100), everyone).is_empty(), "bench 2 still runs");
    assert_eq!(
        s.leave((2, 200), everyone),
        lim("1024"),
        "the last one puts back the original"
    );
    assert_eq!(s, SharedLimits::default());
    assert_eq!(
        SharedLimits::parse(&s.render()),
        s,
        "an empty file: nothing shared"
    );
    // A bench SIGKILLed before it left, and its pid reused by another process (another
    // start time): not waited for.
    let mut s = SharedLimits::default();
    s.join((7, 700), &lim("1024"), everyone);
    let reused = |p: (u32, u64)| p != (7, 700);
    s.join((8, 800), &lim("41024"), reused);
    assert_eq!(s.pids, vec![(8, 800)]);
    assert_eq!(s.leave((8, 800), reused), lim("1024"));
}
