use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use xtask::lab::{LabAddress, MacAddr, ProbeRound};

use super::audit::*;
use super::options::*;
use super::*;

const A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 150);
const B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 151);

fn mac(n: u8) -> MacAddr {
    MacAddr::new(2, 0, 0xc0, 0, 2, n)
}

fn node_of(m: MacAddr) -> String {
    format!("node-{}", m.5)
}

fn s(x: f64) -> Duration {
    Duration::from_secs_f64(x)
}

/// Rounds every 0.25 s from `from` to `to` (s) in which `who(t)` answers `addr`.
fn rounds(from: f64, to: f64, addr: Ipv4Addr, who: impl Fn(f64) -> Vec<u8>) -> Vec<ProbeRound> {
    let mut out = Vec::new();
    let mut t = from;
    while t < to {
        let mut r = ProbeRound {
            t: s(t),
            replies: BTreeMap::new(),
        };
        let macs: BTreeSet<MacAddr> = who(t).into_iter().map(mac).collect();
        if !macs.is_empty() {
            r.replies.insert(addr, macs);
        }
        out.push(r);
        t += 0.25;
    }
    out
}

/// The control-plane VIP of the tests (outside the pool).
const CP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

fn params(universe: &[Ipv4Addr]) -> AuditParams {
    AuditParams {
        service_bound: s(4.5),
        control_plane: (CP, s(4.5)),
        audit_from: s(0.0),
        universe: universe.to_vec(),
    }
}

fn desired(addr: Ipv4Addr, from: f64, to: Option<f64>) -> Desired {
    Desired {
        addr,
        owner: "svc-0".into(),
        from: s(from),
        to: to.map(s),
    }
}

fn fault(kind: FaultKind, start: f64, settled: Option<f64>) -> Disturbance {
    Disturbance {
        kind,
        target: "node-b".into(),
        start: s(start),
        settled: settled.map(s),
        addrs: None,
    }
}

#[test]
fn two_macs_in_one_round_is_a_violation_even_during_a_fault() {
    let tl = Timeline {
        disturbances: vec![fault(FaultKind::Stop, 0.0, None)],
        desired: vec![desired(A, 0.0, None)],
    };
    // Two MACs from 2.0 s to 2.5 s (3 rounds): one violation naming both nodes.
    let r = rounds(0.0, 10.0, A, |t| {
        if (2.0..2.6).contains(&t) {
            vec![11, 12]
        } else {
            vec![11]
        }
    });
    let found = audit(&r, &tl, &params(&[A]), &node_of);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].kind, ViolationKind::TwoMacs);
    assert!(found[0].detail.contains("node-11 and node-12"), "{found:?}");
    assert!(found[0].detail.contains("3 rounds"), "{found:?}");
}

#[test]
fn unanswered_counts_only_after_the_bound_past_the_last_settle() {
    // Killed at 10 s, restarted at 12 s; bound 4.5 s: blind until 16.5 s.
    let tl = Timeline {
        disturbances: vec![fault(FaultKind::Kill, 10.0, Some(12.0))],
        desired: vec![desired(A, 0.0, None)],
    };
    let p = AuditParams {
        audit_from: s(5.0),
        ..params(&[A])
    };
    // Silent 10..16.25 s: inside the blind interval, fine.
    let ok = rounds(0.0, 30.0, A, |t| {
        if (10.0..16.3).contains(&t) {
            vec![]
        } else {
            vec![12]
        }
    });
    assert_eq!(audit(&ok, &tl, &p, &node_of), vec![]);
    // Silent until 17 s: the rounds at 16.5 and 16.75 s fail.
    let late = rounds(0.0, 30.0, A, |t| {
        if (10.0..17.0).contains(&t) {
            vec![]
        } else {
            vec![12]
        }
    });
    let found = audit(&late, &tl, &p, &node_of);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].kind, ViolationKind::Unanswered);
    assert!(
        found[0]
            .detail
            .contains("from 16.50 s to 16.75 s (2 rounds)"),
        "{found:?}"
    );
    assert!(
        found[0].detail.contains("sigkill+restart node-b"),
        "{found:?}"
    );
    // Silence before audit_from (warm-up) is not judged.
    let warm = rounds(0.0, 30.0, A, |t| if t < 5.0 { vec![] } else { vec![12] });
    assert_eq!(audit(&warm, &tl, &p, &node_of), vec![]);
}

#[test]
fn an_unhealed_fault_blinds_forever_and_service_changes_blind_their_address_only() {
    let tl = Timeline {
        disturbances: vec![Disturbance {
            kind: FaultKind::SvcEdit,
            target: "svc-0".into(),
            start: s(9.9),
            settled: Some(s(10.0)),
            addrs: Some(vec![A, B]),
        }],
        // svc-0 moved from A to B at 10 s.
        desired: vec![desired(A, 0.0, Some(10.0)), desired(B, 10.0, None)],
    };
    let mut r = rounds(0.0, 20.0, A, |t| if t < 12.0 { vec![11] } else { vec![] });
    let rb = rounds(0.0, 20.0, B, |t| if t >= 11.0 { vec![12] } else { vec![] });
    for (x, y) in r.iter_mut().zip(rb) {
        x.replies.extend(y.replies);
    }
    assert_eq!(audit(&r, &tl, &params(&[A, B]), &node_of), vec![]);
    // A still answered at 15 s (past 10 + 4.5): stale.
    let mut r2 = rounds(0.0, 20.0, A, |t| if t < 15.0 { vec![11] } else { vec![] });
    let rb = rounds(0.0, 20.0, B, |t| if t >= 11.0 { vec![12] } else { vec![] });
    for (x, y) in r2.iter_mut().zip(rb) {
        x.replies.extend(y.replies);
    }
    let found = audit(&r2, &tl, &params(&[A, B]), &node_of);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].kind, ViolationKind::StaleAnswer);
    assert!(found[0].detail.starts_with("192.0.2.150"), "{found:?}");
    // A fault never settled: nothing is judged after it started.
    let tl2 = Timeline {
        disturbances: vec![fault(FaultKind::ApiFreeze, 1.0, None)],
        desired: vec![desired(A, 0.0, None)],
    };
    let silent = rounds(0.0, 20.0, A, |t| if t < 1.0 { vec![11] } else { vec![] });
    assert_eq!(audit(&silent, &tl2, &params(&[A]), &node_of), vec![]);
}

#[test]
fn status_must_name_the_answering_node() {
    let mut answering = BTreeMap::new();
    answering.insert(A, [mac(11)].into_iter().collect::<BTreeSet<_>>());
    answering.insert(B, [mac(11), mac(12)].into_iter().collect());
    let good = ObservedService {
        name: "svc-0".into(),
        addr: Some(A),
        ingress: vec![A.to_string()],
        vip_host: Some("node-11".into()),
    };
    assert_eq!(
        check_status(std::slice::from_ref(&good), &answering, &node_of),
        vec![]
    );
    let wrong_host = ObservedService {
        vip_host: Some("node-12".into()),
        ..good.clone()
    };
    let found = check_status(&[wrong_host], &answering, &node_of);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].kind, ViolationKind::Status);
    assert!(found[0].detail.contains("vipHost"), "{found:?}");
    let no_ingress = ObservedService {
        ingress: vec![],
        ..good.clone()
    };
    assert_eq!(
        check_status(&[no_ingress], &answering, &node_of)[0].kind,
        ViolationKind::Status
    );
    let two = ObservedService {
        addr: Some(B),
        ..good.clone()
    };
    assert_eq!(
        check_status(&[two], &answering, &node_of)[0].kind,
        ViolationKind::TwoMacs
    );
    let silent = ObservedService {
        addr: Some(Ipv4Addr::new(192, 0, 2, 200)),
        ..good
    };
    assert_eq!(
        check_status(&[silent], &answering, &node_of)[0].kind,
        ViolationKind::Unanswered
    );
}

#[test]
fn orphan_leases_are_default_service_leases_without_service() {
    let services: BTreeSet<String> = ["svc-1".to_string()].into();
    let leases = vec![
        "kubevip-svc-1".to_string(),
        "kubevip-svc-2".to_string(),
        "plndr-cp-lock".to_string(),
    ];
    assert_eq!(orphan_leases(&leases, &services), vec!["kubevip-svc-2"]);
}

#[test]
fn rss_growth_is_judged_on_the_same_process_only() {
    assert_eq!(rss_violation("node-a", (10, 1000), (10, 1200), 20.0), None);
    let x = rss_violation("node-a", (10, 1000), (10, 1201), 20.0).unwrap();
    assert_eq!(x.kind, ViolationKind::RssGrowth);
    assert!(x.detail.contains("1000 KiB -> 1201 KiB"), "{x:?}");
    assert_eq!(rss_violation("node-b", (10, 1000), (11, 5000), 20.0), None);
}

#[test]
fn leftovers_find_vip_addresses_vipd_tables_and_extra_links() {
    let addr = |a: &str, p: u8| LabAddress {
        addr: a.parse().unwrap(),
        prefix: p,
        scope: "global".into(),
        label: None,
        flags: vec![],
        protocol: None,
        valid_lft: None,
        preferred_lft: None,
    };
    let own: Vec<IpAddr> = vec![
        "192.0.2.11".parse().unwrap(),
        "2001:db8::11".parse().unwrap(),
    ];
    let addrs = vec![
        addr("192.0.2.11", 24),
        addr("2001:db8::11", 64),
        addr("fe80::1", 64),
        addr("192.0.2.150", 32),
    ];
    let nft = "table inet vipd_chaos_partition\ntable arp vipd\ntable inet vipd_fence\n";
    let links = vec!["lo".to_string(), "eth0".into(), "vip-1".into()];
    let found = leftovers("node-a", &addrs, &own, nft, &links);
    let kinds: Vec<ViolationKind> = found.iter().map(|x| x.kind).collect();
    assert_eq!(
        kinds,
        vec![
            ViolationKind::LeakedAddress,
            ViolationKind::LeakedNftTable,
            ViolationKind::LeakedNftTable,
            ViolationKind::LeakedLink
        ],
        "{found:?}"
    );
    assert!(found[0].detail.contains("192.0.2.150/32"));
    assert!(leftovers("node-a", &addrs[..3], &own, "", &links[..2]).is_empty());
}

/// The printed rerun command replays the run: every option that changes the schedule
/// or what runs (found by the new-user trial: `--faults` and `--nft-fence` were left
/// out, so the command ran a different schedule).
#[test]
fn the_rerun_command_carries_the_options_of_the_run() {
    let o = Options::parse(&["--minutes", "2"]).unwrap();
    assert_eq!(
        rerun_command(&o, 711036458),
        "cargo xtask chaos --minutes 2 --seed 711036458"
    );
    let o = Options::parse(&[
        "--minutes",
        "3",
        "--faults",
        "services,stop",
        "--nft-fence",
        "--services",
        "10",
        "--nodes",
        "2",
        "--lease-shards",
        "8",
        "--no-ride",
    ])
    .unwrap();
    let c = rerun_command(&o, 5);
    assert_eq!(
        c,
        "cargo xtask chaos --minutes 3 --seed 5 --faults stop,services --services 10 --nodes 2 --nft-fence --lease-shards 8 --no-ride"
    );
    let args: Vec<&str> = c.split(' ').skip(3).collect();
    let again = Options::parse(&args).unwrap();
    assert_eq!(
        (
            again.faults,
            again.nft_fence,
            again.ride,
            again.services,
            again.nodes,
            again.lease_shards
        ),
        (o.faults, true, false, 10, 2, 8)
    );
    assert!(Options::parse(&["--minutes", "1", "--lease-shards", "0"]).is_err());
}

#[test]
fn options_parse_and_name_bad_values() {
    assert!(
        Options::parse(&["--minutes", "1", "--nft-fence"])
            .unwrap()
            .nft_fence
    );
    let o = Options::parse(&["--minutes", "2"]).unwrap();
    assert!(!o.nft_fence);
    assert!(o.ride, "the generated manifests' configuration by default");
    assert!(
        !Options::parse(&["--minutes", "1", "--no-ride"])
            .unwrap()
            .ride
    );
    assert_eq!(o.minutes, 2.0);
    assert_eq!(o.services, DEFAULT_SERVICES);
    assert_eq!(o.nodes, 3);
    assert!(o.build && !o.orphan_leases_warn && o.seed.is_none());
    let o = Options::parse(&[
        "--minutes",
        "0.5",
        "--seed",
        "42",
        "--services",
        "10",
        "--nodes",
        "2",
        "--no-build",
        "--orphan-leases-warn",
    ])
    .unwrap();
    assert_eq!((o.seed, o.services, o.nodes), (Some(42), 10, 2));
    assert!(!o.build && o.orphan_leases_warn);
    let o = Options::parse(&["--minutes", "1", "--faults", "stop, kill,services"]).unwrap();
    assert_eq!(
        o.faults,
        Some([FaultKind::Stop, FaultKind::Kill, FaultKind::SvcCreate].into())
    );
    for (args, needle) in [
        (vec![], "--minutes is required"),
        (vec!["--minutes", "0"], "--minutes"),
        (vec!["--minutes", "x"], "\"x\""),
        (vec!["--minutes", "1", "--services", "61"], "--services: 61"),
        (vec!["--minutes", "1", "--nodes", "4"], "--nodes: 4"),
        (vec!["--minutes", "1", "--seed", "-3"], "--seed: \"-3\""),
        (vec!["--minutes", "1", "--bogus"], "\"--bogus\""),
        (vec!["--minutes", "1", "--faults", "stop,nap"], "\"nap\""),
        (vec!["--minutes", "1", "--faults", ","], "--faults: empty"),
    ] {
        let e = Options::parse(&args).unwrap_err().to_string();
        assert!(e.contains(needle), "{args:?}: {e}");
    }
}

#[test]
fn canary_needs_both_two_macs_and_stale_answer() {
    let x = |kind, addr: Ipv4Addr| v(kind, format!("{addr} (-) something; more"));
    let found = vec![
        x(ViolationKind::TwoMacs, CANARY_ADDR),
        x(ViolationKind::StaleAnswer, CANARY_ADDR),
        x(ViolationKind::Unanswered, A),
    ];
    let (canary, rest) = split_canary(found);
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].kind, ViolationKind::Unanswered);
    let msg = canary_verdict(&canary).unwrap();
    assert!(msg.contains("192.0.2.250 (-) something"), "{msg}");
    assert!(canary_verdict(&canary[..1]).is_err());
    assert!(canary_verdict(&[]).is_err());
    assert!(
        CANARY_ADDR > POOL_LAST,
        "the canary is never a Service address"
    );
}

#[test]
fn pool_stays_inside_the_lab_subnet_and_off_the_broadcast() {
    assert_eq!(pool_address(0), Some(POOL_FIRST));
    assert_eq!(pool_address(99), Some(POOL_LAST));
    assert_eq!(pool_address(100), None);
}

#[test]
fn answer_bounds_follow_each_lease_s_timings() {
    // Lease + retry + 0.5 s probe slack: the generated manifests' 3/2/1 control plane and
    // 5/3/1 Services; --no-ride runs Services at 3/2/1.
    assert_eq!(CP_TIMINGS.answer_bound(), Duration::from_millis(4500));
    assert_eq!(svc_timings(true), SVC_TIMINGS);
    assert_eq!(SVC_TIMINGS.answer_bound(), Duration::from_millis(6500));
    assert_eq!(
        svc_timings(false).answer_bound(),
        Duration::from_millis(4500)
    );
    assert_eq!(SVC_TIMINGS.label(), "5/3/1 s");
    // The orphaned-lease wait grows with the Service lease.
    assert_eq!(lease_gc_wait(3), Duration::from_secs(75));
    assert_eq!(lease_gc_wait(5), Duration::from_secs(77));
}

#[test]
fn the_control_plane_vip_is_judged_with_its_own_bound() {
    // One node fault settled at 12 s: the control-plane VIP (bound 4.5 s) must answer
    // from 16.5 s, a Service address (bound 6.5 s) from 18.5 s. Both silent until 17.5 s.
    let tl = Timeline {
        disturbances: vec![fault(FaultKind::Kill, 10.0, Some(12.0))],
        desired: vec![desired(A, 0.0, None), desired(CP, 0.0, None)],
    };
    let p = AuditParams {
        service_bound: s(6.5),
        control_plane: (CP, s(4.5)),
        audit_from: s(5.0),
        universe: vec![A, CP],
    };
    assert_eq!(p.bound(A), s(6.5));
    assert_eq!(p.bound(CP), s(4.5));
    let silent_until = |addr| {
        rounds(0.0, 30.0, addr, |t| {
            if (10.0..17.5).contains(&t) {
                vec![]
            } else {
                vec![12]
            }
        })
    };
    let mut r = silent_until(A);
    for (round, cp) in r.iter_mut().zip(silent_until(CP)) {
        round.replies.extend(cp.replies);
    }
    let found = audit(&r, &tl, &p, &node_of);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].kind, ViolationKind::Unanswered);
    assert!(
        found[0].detail.starts_with("192.0.2.10 ")
            && found[0]
                .detail
                .contains("from 16.50 s to 17.25 s (4 rounds)"),
        "{found:?}"
    );
}
