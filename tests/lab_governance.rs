//! Lab tests of governance moves between Service leases (scenario S34 in
//! `docs/scenarios.md`): two Services share 192.0.2.51 under per-Service election;
//! the address is governed by the older Service's lease. When that Service goes, the
//! address moves to the newer Service's lease, and the new lease's holder must not bind it
//! while the previous holder may still answer.
//!
//! Variants: both Services in one namespace (leases `kubevip-<name>`), and Services in two
//! namespaces with one `kube-vip.io/leaseName` (leases `<ns>/<leaseName>`, one per
//! namespace).

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use xtask::lab::{Lab, LabOptions, LabProcess, Signal, WatchReport};

/// The shared address.
const SHARED: &str = "192.0.2.51";
/// `vip_leaseduration` of [`T531`], the lab's Service lease duration.
const LEASE_DURATION: Duration = Duration::from_secs(5);

/// A Service of the test: namespace, name, port, and the lease that governs it alone.
struct Svc {
    ns: &'static str,
    name: &'static str,
    port: i32,
    lease: &'static str,
}

#[derive(Clone, Copy, Debug)]
enum Variant {
    /// Both Services in `default`, default lease names.
    SameNamespace,
    /// `gov1/web` and `gov2/web` with `kube-vip.io/leaseName: shared`.
    SharedLeaseName,
}

impl Variant {
    /// (older, newer). Names sort in creation order too, so the older one governs even when
    /// both get the same creationTimestamp (one-second resolution; ties go by
    /// namespace/name).
    fn services(self) -> (Svc, Svc) {
        match self {
            Variant::SameNamespace => (
                Svc {
                    ns: "default",
                    name: "gov-a",
                    port: 80,
                    lease: "kubevip-gov-a",
                },
                Svc {
                    ns: "default",
                    name: "gov-b",
                    port: 8000,
                    lease: "kubevip-gov-b",
                },
            ),
            Variant::SharedLeaseName => (
                Svc {
                    ns: "gov1",
                    name: "web",
                    port: 80,
                    lease: "shared",
                },
                Svc {
                    ns: "gov2",
                    name: "web",
                    port: 8000,
                    lease: "shared",
                },
            ),
        }
    }
}

fn create(lab: &Lab, s: &Svc, shared_lease_name: bool) {
    let mut svc = service_json(s.name, Some(SHARED), None, &[(s.port, "TCP")], false);
    if shared_lease_name {
        svc["metadata"]["annotations"]["kube-vip.io/leaseName"] = json!(s.lease);
    }
    create_service_in(lab, s.ns, &svc);
}

fn delete(lab: &Lab, s: &Svc) {
    delete_service_in(lab, s.ns, s.name);
}

fn ingress(lab: &Lab, s: &Svc) -> Vec<String> {
    let resp = lab
        .api_request(
            "GET",
            &format!("/api/v1/namespaces/{}/services/{}", s.ns, s.name),
            None,
        )
        .expect("get service");
    let v: serde_json::Value = serde_json::from_str(&resp.body).unwrap_or_default();
    v["status"]["loadBalancer"]["ingress"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i["ip"].as_str().map(str::to_string))
        .collect()
}

/// Longest run of unanswered probe slots between the first and the last answered one:
/// the interruption a client saw.
fn longest_gap(report: &WatchReport) -> Duration {
    let answered: Vec<usize> = report
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.responders.is_empty())
        .map(|(i, _)| i)
        .collect();
    answered
        .windows(2)
        .map(|w| report.slots[w[1]].t.saturating_sub(report.slots[w[0]].t))
        .max()
        .unwrap_or_default()
}

/// The timestamp (RFC 3339, UTC, fixed width: comparable as text) of the first line of
/// `p`'s log containing every one of `needles`; waits up to 5 s for it to be written.
fn log_time(p: &LabProcess, needles: &[&str]) -> String {
    let line = wait_for(
        &format!("{}: a log line with {needles:?}", p.name()),
        Duration::from_secs(5),
        || {
            p.log()
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
                .map(str::to_string)
        },
    );
    let ts = line
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        ts.len() == "2026-01-01T00:00:00.000000Z".len() && ts.ends_with('Z'),
        "unexpected timestamp {ts:?} in {line:?}"
    );
    ts
}

/// What [`governance_move`] saw.
struct Outcome {
    old_holder: String,
    new_holder: String,
    gap: Duration,
}

/// The scenario: older and newer Service share [`SHARED`]; optionally SIGSTOP the holder
/// of the governing lease; delete the older Service. Checks that no ARP request is ever
/// answered by two MACs and that the address comes back on the holder of the newer
/// Service's lease; with `freeze`, SIGCONTs the frozen process and checks it does not
/// re-add the address.
fn governance_move(test: &str, variant: Variant, freeze: bool) -> Option<Outcome> {
    let lab = lab(test, LabOptions::default())?;
    let (old, new) = variant.services();
    let shared_name = matches!(variant, Variant::SharedLeaseName);
    create_namespace(&lab, old.ns);
    create_namespace(&lab, new.ns);
    let procs: Vec<LabProcess> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[]))
        .collect();
    create(&lab, &old, shared_name);
    let h = single_holder(&lab, SHARED, Duration::from_secs(20));
    wait_for(
        "older Service's lease held",
        Duration::from_secs(10),
        || (lease_holder(&lab, old.ns, old.lease).as_deref() == Some(h.as_str())).then_some(()),
    );
    create(&lab, &new, shared_name);
    wait_for("both statuses", Duration::from_secs(10), || {
        (ingress(&lab, &old) == [SHARED] && ingress(&lab, &new) == [SHARED]).then_some(())
    });
    assert!(
        lease(&lab, new.ns, new.lease).is_none(),
        "the newer Service's lease governs nothing yet"
    );
    let i = NODES
        .iter()
        .position(|n| *n == h)
        .expect("holder is a lab node");
    let old_mac = lab.mac_of(&h).expect("mac");
    let watch = lab
        .arp_watch(SHARED.parse().expect("ip"), Duration::from_millis(20))
        .expect("arp watch");
    wait_for("the client sees the holder", Duration::from_secs(5), || {
        watch
            .report()
            .last_responders()
            .contains(&old_mac)
            .then_some(())
    });
    if freeze {
        procs[i].signal(Signal::SIGSTOP).expect("SIGSTOP");
    }
    let t0 = Instant::now();
    delete(&lab, &old);
    // The address comes back on the holder of the newer Service's lease (after the old
    // lease's expiry when its holder is frozen).
    let limit = LEASE_DURATION * 4;
    let new_holder = wait_for("the address on the new lease's holder", limit, || {
        let lh = lease_holder(&lab, new.ns, new.lease).filter(|l| !l.is_empty())?;
        (holders(&lab, SHARED) == [lh.clone()]).then_some(lh)
    });
    let back = t0.elapsed();
    if freeze {
        assert_ne!(
            new_holder, h,
            "the frozen node cannot have taken the new lease"
        );
    }
    let new_mac = lab.mac_of(&new_holder).expect("mac");
    wait_for(
        "the client sees the new holder",
        Duration::from_secs(5),
        || {
            watch
                .report()
                .last_responders()
                .contains(&new_mac)
                .then_some(())
        },
    );
    if freeze {
        procs[i].signal(Signal::SIGCONT).expect("SIGCONT");
        // The resumed node learns that the older Service is gone and must not put the
        // address back (its lease expired and it follows the new one).
        wait_for("the resumed node stops the old election", limit, || {
            let log = procs[i].log();
            (log.contains("stopping election") && log.contains(old.lease)).then_some(())
        });
        for _ in 0..40 {
            let hs = holders(&lab, SHARED);
            if hs != [new_holder.clone()] {
                dump(&procs.iter().collect::<Vec<_>>());
                panic!("after SIGCONT {SHARED} is held by {hs:?}, expected only {new_holder}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let report = watch.stop().expect("arp watch");
    let gap = longest_gap(&report);
    eprintln!(
        "{test}: {SHARED} was on {h}, back on {new_holder} after {back:?}; longest unanswered run seen by the client {gap:?}"
    );
    if report.max_simultaneous_responders() > 1 {
        dump(&procs.iter().collect::<Vec<_>>());
        panic!(
            "two MACs answered for {SHARED}: {:?}",
            report.multi_responder_intervals()
        );
    }
    if !freeze {
        // Causally, not by timing: the new lease's holder added the address only after the
        // old holder released its lease (which it does once its VIPs are confirmed gone).
        let released = log_time(
            &procs[i],
            &["lease released", &format!("lease={}/{}", old.ns, old.lease)],
        );
        let j = NODES
            .iter()
            .position(|n| *n == new_holder)
            .expect("new holder is a lab node");
        let added = log_time(
            &procs[j],
            &["VIP added", &format!("holder={}/{}", new.ns, new.lease)],
        );
        if added < released {
            dump(&procs.iter().collect::<Vec<_>>());
            panic!(
                "{new_holder} added {SHARED} at {added}, before {h} released the old lease at {released}"
            );
        }
    }
    // The older Service's lease serves nobody: it goes (S17), also when its holder froze.
    wait_for("older Service's lease deleted", limit, || {
        lease(&lab, old.ns, old.lease).is_none().then_some(())
    });
    assert_eq!(
        report.last_responders(),
        [new_mac].into_iter().collect(),
        "the client ends on the new holder"
    );
    for p in &procs {
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
    Some(Outcome {
        old_holder: h,
        new_holder,
        gap,
    })
}

/// S34: the holder of the governing lease is frozen when its Service is deleted: the
/// newer Service's lease holder waits until the old lease expired (the frozen node's
/// kernel fence removed the address before that), so no ARP request is answered twice; the
/// resumed node does not re-add the address.
#[test]
fn s34_governance_move_frozen_holder_never_two_responders() {
    let Some(o) = governance_move("s34_frozen", Variant::SameNamespace, true) else {
        return;
    };
    eprintln!(
        "S34 frozen: {} -> {}, gap {:?}",
        o.old_holder, o.new_holder, o.gap
    );
}

/// S34 with Services in two namespaces sharing one `kube-vip.io/leaseName`.
#[test]
fn s34_governance_move_frozen_holder_shared_lease_name() {
    let Some(o) = governance_move("s34_frozen_ns", Variant::SharedLeaseName, true) else {
        return;
    };
    eprintln!(
        "S34 frozen, two namespaces: {} -> {}, gap {:?}",
        o.old_holder, o.new_holder, o.gap
    );
}

/// S34 healthy: nobody frozen. The remaining Service is answered again within one lease
/// duration (in practice within tens of ms: the old holder releases its lease right after
/// dropping the address), never by two MACs at once.
#[test]
fn s34_governance_move_healthy_short_gap() {
    let Some(o) = governance_move("s34_healthy", Variant::SameNamespace, false) else {
        return;
    };
    eprintln!(
        "S34 healthy: {} -> {}, client saw a gap of {:?}",
        o.old_holder, o.new_holder, o.gap
    );
    assert!(
        o.gap < LEASE_DURATION,
        "the remaining Service must be answered again within one lease duration, gap {:?}",
        o.gap
    );
}
