//! The governance-move rule (S34): which leases retire and which groups may bind what
//! (pure), when a retiring lease's handover is done (pure), and [`follow`] against a fake
//! lease on tokio's paused clock.

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::net::VipSubnet;
use crate::services::plan::desired::{Candidate, Mode, PlanConfig, plan_leases};
use crate::services::plan::model::{PortProto, ServiceKey};

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(crate) fn lease(name: &str) -> LeaseRef {
    LeaseRef {
        namespace: "default".into(),
        name: format!("kubevip-{name}"),
    }
}

/// Service `name` (namespace `default`, lease `kubevip-<name>`) created at second
/// `created`, with `addrs` on TCP `port`.
pub(crate) fn svc(name: &str, created: i64, addrs: &[&str], port: i32) -> Candidate {
    Candidate {
        key: ServiceKey {
            namespace: "default".into(),
            name: name.into(),
        },
        created: Some(Timestamp::from_second(created).unwrap()),
        addresses: addrs.iter().map(|a| ip(a)).collect(),
        ports: vec![PortProto {
            port,
            protocol: "TCP".into(),
        }],
        etp_local: false,
        local_endpoint: false,
        interface: None,
        lease: lease(name),
        not_here: None,
        preferred: Vec::new(),
        dhcp: None,
        dhcp_lease_marks: Vec::new(),
        uid: Some(format!("uid-{name}")),
        own_conditions: false,
        lease_annotated: false,
    }
}

fn plan_of(services: &[Candidate]) -> Plan {
    plan_leases(
        services,
        &PlanConfig {
            mode: Mode::PerService,
            control_plane: vec![],
            interface: None,
            subnet: VipSubnet { v4: 32, v6: 128 },
        },
    )
}

fn set(leases: &[&str]) -> BTreeSet<LeaseRef> {
    leases.iter().map(|l| lease(l)).collect()
}

fn addrs(a: &[&str]) -> BTreeSet<IpAddr> {
    a.iter().map(|s| ip(s)).collect()
}

fn vips_of(v: &[VipSpec]) -> Vec<IpAddr> {
    v.iter().map(|s| s.vip.addr).collect()
}

const SHARED: &str = "192.0.2.51";

// ----- which leases retire (pure) ---------------------------------------------------------

#[test]
fn deleting_the_governing_service_retires_its_lease_with_the_shared_address() {
    // S34: old (port 80) governs 192.0.2.51, new (8000) shares it.
    let old = svc("old", 1, &[SHARED], 80);
    let new = svc("new", 2, &[SHARED], 8000);
    let before = plan_of(&[old, new.clone()]);
    assert_eq!(governors(&before)[&ip(SHARED)], lease("old"));
    let after = plan_of(&[new]);
    let c = changes(&governors(&before), &after, &set(&["old"]), |_| false);
    assert_eq!(c.retire, [(lease("old"), addrs(&[SHARED]))].into());
    assert_eq!(c.stop, set(&["old"]));
    // The newer Service's lease governs now; it is held back by the retiring lease.
    let a = admit(&after, &BTreeSet::new(), &c.retire);
    assert!(!a.run.contains_key(&lease("new")), "not started: {a:?}");
    assert_eq!(a.held_back[&lease("new")], addrs(&[SHARED]));
    // Handover done: it starts with the address.
    let a = admit(&after, &BTreeSet::new(), &BTreeMap::new());
    assert_eq!(vips_of(&a.run[&lease("new")]), vec![ip(SHARED)]);
    assert!(a.held_back.is_empty());
}

#[test]
fn deleting_a_service_that_does_not_govern_moves_nothing() {
    // S06: the sharer goes, the governor stays: no retirement, nothing stops.
    let old = svc("old", 1, &[SHARED], 80);
    let new = svc("new", 2, &[SHARED], 8000);
    let before = plan_of(&[old.clone(), new]);
    let after = plan_of(&[old]);
    let c = changes(&governors(&before), &after, &set(&["old"]), |_| false);
    assert_eq!(c, Changes::default());
    let a = admit(&after, &set(&["old"]), &BTreeMap::new());
    assert_eq!(vips_of(&a.run[&lease("old")]), vec![ip(SHARED)]);
}

#[test]
fn a_deleted_service_retires_its_lease_so_a_quick_reuse_of_its_address_waits() {
    // `kubectl replace --force`, a re-installed chart: the address comes back under
    // another lease while the old holder may still answer.
    let before = plan_of(&[svc("web", 1, &[SHARED], 80)]);
    let gone = plan_of(&[]);
    let c = changes(&governors(&before), &gone, &set(&["web"]), |_| false);
    assert_eq!(c.retire, [(lease("web"), addrs(&[SHARED]))].into());
    let again = plan_of(&[svc("web2", 5, &[SHARED], 80)]);
    let a = admit(&again, &BTreeSet::new(), &c.retire);
    assert!(a.run.is_empty());
    // The same Service re-created has the same lease: the lease itself keeps one holder.
    let same = plan_of(&[svc("web", 5, &[SHARED], 80)]);
    let a = admit(&same, &BTreeSet::new(), &c.retire);
    assert_eq!(vips_of(&a.run[&lease("web")]), vec![ip(SHARED)]);
}

#[test]
fn an_address_edit_within_one_lease_retires_nothing() {
    // S19: 192.0.2.120 -> 192.0.2.121 on the same Service: the group updates its VIPs.
    let before = plan_of(&[svc("web", 1, &["192.0.2.120"], 80)]);
    let after = plan_of(&[svc("web", 1, &["192.0.2.121"], 80)]);
    let c = changes(&governors(&before), &after, &set(&["web"]), |_| false);
    assert_eq!(c, Changes::default());
}

#[test]
fn a_lease_that_loses_an_address_but_governs_others_restarts() {
    // An older Service starts using an address of a younger one that has two addresses:
    // the younger lease keeps 192.0.2.52 but must release to hand 192.0.2.51 over.
    let young = svc("young", 5, &[SHARED, "192.0.2.52"], 80);
    let before = plan_of(&[young.clone(), svc("elder", 1, &["192.0.2.53"], 8000)]);
    let after = plan_of(&[young, svc("elder", 1, &["192.0.2.53", SHARED], 8000)]);
    assert_eq!(governors(&after)[&ip(SHARED)], lease("elder"));
    let running = set(&["young", "elder"]);
    let c = changes(&governors(&before), &after, &running, |_| false);
    assert_eq!(c.retire, [(lease("young"), addrs(&[SHARED]))].into());
    assert_eq!(
        c.stop,
        set(&["young"]),
        "restarted, so that its holder releases"
    );
    // Started again at once with its other address; elder keeps running and gets the
    // moved address only after the handover.
    let a = admit(&after, &set(&["elder"]), &c.retire);
    assert_eq!(vips_of(&a.run[&lease("young")]), vec![ip("192.0.2.52")]);
    assert_eq!(vips_of(&a.run[&lease("elder")]), vec![ip("192.0.2.53")]);
    assert_eq!(a.held_back[&lease("elder")], addrs(&[SHARED]));
    let a = admit(&after, &set(&["elder", "young"]), &BTreeMap::new());
    assert_eq!(
        vips_of(&a.run[&lease("elder")]),
        vec![ip("192.0.2.53"), ip(SHARED)]
    );
}

#[test]
fn a_shared_lease_that_loses_an_address_but_governs_others_keeps_running() {
    // The same move as above, but "young" is a shard (or the one lease for all): releasing
    // it would hand every other Service on it over. It keeps running without the moved
    // address; "elder" still waits for its handover (done by time, see `follow`).
    let young = svc("young", 5, &[SHARED, "192.0.2.52"], 80);
    let before = plan_of(&[young.clone(), svc("elder", 1, &["192.0.2.53"], 8000)]);
    let after = plan_of(&[young, svc("elder", 1, &["192.0.2.53", SHARED], 8000)]);
    let running = set(&["young", "elder"]);
    let shared = |l: &LeaseRef| *l == lease("young");
    let c = changes(&governors(&before), &after, &running, shared);
    assert_eq!(c.retire, [(lease("young"), addrs(&[SHARED]))].into());
    assert!(c.stop.is_empty(), "nothing restarts: {c:?}");
    assert_eq!(c.kept, set(&["young"]));
    let a = admit(&after, &running, &c.retire);
    assert_eq!(vips_of(&a.run[&lease("young")]), vec![ip("192.0.2.52")]);
    assert_eq!(vips_of(&a.run[&lease("elder")]), vec![ip("192.0.2.53")]);
    assert_eq!(a.held_back[&lease("elder")], addrs(&[SHARED]));
    // A node that does not campaign for the shared lease (it may not announce one of its
    // Services) stops its group, but the lease keeps running on its holder: the
    // retirement is still judged as kept (else the moved address would wait on this node
    // until the lease changed term, for ever while its holder renews).
    let mut away = after.clone();
    away.groups.get_mut(&lease("young")).unwrap().campaign = false;
    let c = changes(&governors(&before), &away, &running, shared);
    assert_eq!(c.stop, set(&["young"]));
    assert_eq!(c.kept, set(&["young"]));
    let c = changes(&governors(&before), &away, &set(&["elder"]), shared);
    assert!(c.stop.is_empty());
    assert_eq!(
        c.kept,
        set(&["young"]),
        "kept whether or not this node runs it"
    );
    // A shared lease that left the plan (no Service on it any more) stops and is released.
    let only_elder = plan_of(&[svc("elder", 1, &["192.0.2.53", SHARED, "192.0.2.52"], 8000)]);
    let c = changes(&governors(&before), &only_elder, &running, shared);
    assert_eq!(c.stop, set(&["young"]));
    assert!(c.kept.is_empty());
}

#[test]
fn a_running_group_with_every_address_held_back_keeps_running_without_them() {
    let mut p = plan_of(&[svc("new", 2, &[SHARED], 8000)]);
    let retiring = [(lease("old"), addrs(&[SHARED]))].into();
    let a = admit(&p, &set(&["new"]), &retiring);
    assert!(a.run[&lease("new")].is_empty());
    // Groups this node does not campaign for are neither run nor reported.
    p.groups.get_mut(&lease("new")).unwrap().campaign = false;
    assert_eq!(admit(&p, &BTreeSet::new(), &retiring), Admission::default());
}

#[test]
fn stopping_campaigning_is_no_retirement() {
    // ETP Local without a local endpoint: the lease still governs, its holder elsewhere
    // keeps the address; this node only stops its own election.
    let before = plan_of(&[svc("web", 1, &[SHARED], 80)]);
    let mut after = before.clone();
    after.groups.get_mut(&lease("web")).unwrap().campaign = false;
    let c = changes(&governors(&before), &after, &set(&["web"]), |_| false);
    assert!(c.retire.is_empty());
    assert_eq!(c.stop, set(&["web"]));
}

// ----- when a handover is done (pure) -----------------------------------------------------
