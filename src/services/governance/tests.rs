//! The governance-move rule (S34): which leases retire and which groups may bind what
//! (pure), when a retiring lease's handover is done (pure), and [`follow`] against a fake
//! lease on tokio's paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;
use tokio::sync::broadcast;

use super::*;
use crate::election::LeaseError;
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
    let c = changes(&governors(&before), &after, &set(&["old"]));
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
    let c = changes(&governors(&before), &after, &set(&["old"]));
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
    let c = changes(&governors(&before), &gone, &set(&["web"]));
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
    let c = changes(&governors(&before), &after, &set(&["web"]));
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
    let c = changes(&governors(&before), &after, &running);
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
    let c = changes(&governors(&before), &after, &set(&["web"]));
    assert!(c.retire.is_empty());
    assert_eq!(c.stop, set(&["web"]));
}

// ----- when a handover is done (pure) -----------------------------------------------------

fn rec(holder: &str, acquired: i64, transitions: i32, dur: i32) -> LeaseRecord {
    LeaseRecord {
        holder: holder.into(),
        lease_duration_secs: dur,
        acquire_time: Some(Timestamp::from_second(acquired).unwrap()),
        renew_time: Some(Timestamp::from_second(acquired).unwrap()),
        transitions,
        failback_request: None,
        lease_duration_ms: None,
    }
}

fn obs(r: LeaseRecord, rv: u64) -> Observed {
    Observed {
        record: r,
        resource_version: rv.to_string(),
    }
}

fn view(o: Option<Observed>, at: Instant) -> LeaseView {
    LeaseView {
        known: true,
        observed: o,
        observed_at: at,
        absent_until: None,
    }
}

#[test]
fn a_held_lease_is_handed_over_at_its_expiry_on_our_clock() {
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let v = view(Some(obs(held.clone(), 7)), t0);
    let at = t0 + Duration::from_secs(5);
    assert_eq!(
        handover(Some(&held), &v, t0 + Duration::from_secs(1)),
        Handover::NotBefore(at)
    );
    assert_eq!(handover(Some(&held), &v, at), Handover::Done);
    // Held by this very node counts the same (its VIP holder may not have confirmed).
    assert_eq!(handover(None, &v, t0), Handover::NotBefore(at));
}

#[test]
fn a_released_lease_is_handed_over_at_once() {
    let t0 = Instant::now();
    let released = record::release(
        &rec("node-a", 100, 0, 5),
        Timestamp::from_second(110).unwrap(),
    );
    assert_eq!(
        handover(None, &view(Some(obs(released, 8)), t0), t0),
        Handover::Done
    );
}

#[test]
fn a_renewal_by_the_same_holder_postpones_a_new_term_ends_it() {
    let t0 = Instant::now();
    let from = rec("node-a", 100, 3, 5);
    let mut v = view(Some(obs(from.clone(), 7)), t0);
    // The frozen holder resumed within its renew deadline and renewed: same term.
    let mut renewed = from.clone();
    renewed.renew_time = Some(Timestamp::from_second(104).unwrap());
    let t1 = t0 + Duration::from_secs(3);
    v.seen(Some(obs(renewed, 9)), t1);
    assert_eq!(
        handover(Some(&from), &v, t1 + Duration::from_secs(4)),
        Handover::NotBefore(t1 + Duration::from_secs(5))
    );
    // Another node took it (after a release or an expiry): that term is over.
    v.seen(Some(obs(rec("node-b", 120, 4, 5), 10)), t1);
    assert_eq!(handover(Some(&from), &v, t1), Handover::Done);
    // The same holder after a new acquisition: a new term too.
    let mut v = view(Some(obs(from.clone(), 7)), t0);
    v.seen(Some(obs(rec("node-a", 130, 4, 5), 11)), t1);
    assert_eq!(handover(Some(&from), &v, t1), Handover::Done);
}

#[test]
fn deleted_while_held_waits_one_lease_duration_deleted_after_release_does_not() {
    let t0 = Instant::now();
    let mut v = view(Some(obs(rec("node-a", 100, 0, 5), 7)), t0);
    let t1 = t0 + Duration::from_secs(1);
    v.deleted(t1);
    assert_eq!(v.absent_until, Some(t1 + Duration::from_secs(5)));
    assert_eq!(
        handover(None, &v, t1),
        Handover::NotBefore(t1 + Duration::from_secs(5))
    );
    let released = record::release(
        &rec("node-a", 100, 0, 5),
        Timestamp::from_second(110).unwrap(),
    );
    let mut v = view(Some(obs(released, 8)), t0);
    v.deleted(t1);
    assert_eq!(handover(None, &v, t1), Handover::Done);
}

#[test]
fn an_older_version_does_not_undo_a_newer_one() {
    let t0 = Instant::now();
    let released = record::release(
        &rec("node-a", 100, 0, 5),
        Timestamp::from_second(110).unwrap(),
    );
    let mut v = view(Some(obs(released, 9)), t0);
    v.seen(Some(obs(rec("node-a", 100, 0, 5), 8)), t0);
    assert_eq!(handover(None, &v, t0), Handover::Done);
}

#[test]
fn an_elector_that_saw_no_lease_is_no_evidence_of_absence() {
    let t0 = Instant::now();
    let end = ElectionEnd {
        released: false,
        observed: None,
        observed_at: t0,
        absent_until: None,
    };
    assert_eq!(
        handover(None, &LeaseView::from_end(&end), t0),
        Handover::Unknown
    );
    let end = ElectionEnd {
        absent_until: Some(t0 + Duration::from_secs(5)),
        ..end
    };
    assert_eq!(
        handover(None, &LeaseView::from_end(&end), t0),
        Handover::NotBefore(t0 + Duration::from_secs(5))
    );
}

// ----- follow() against a fake lease, on the paused clock -------------------------------

#[derive(Clone)]
struct Fake {
    lease: Arc<Mutex<Option<Observed>>>,
    events: broadcast::Sender<LeaseEvent>,
    gets: Arc<AtomicUsize>,
}

impl Fake {
    fn new(o: Option<Observed>) -> Self {
        Fake {
            lease: Arc::new(Mutex::new(o)),
            events: broadcast::channel(16).0,
            gets: Arc::new(AtomicUsize::new(0)),
        }
    }
    fn write(&self, o: Observed) {
        *self.lease.lock().unwrap() = Some(o.clone());
        let _ = self.events.send(LeaseEvent::Changed(o));
    }
    fn delete(&self) {
        *self.lease.lock().unwrap() = None;
        let _ = self.events.send(LeaseEvent::Deleted);
    }
}

impl LeaseClient for Fake {
    fn describe(&self) -> String {
        "default/kubevip-old".into()
    }
    async fn get(&self) -> Result<Option<Observed>, LeaseError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        Ok(self.lease.lock().unwrap().clone())
    }
    async fn create(&self, _: &LeaseRecord) -> Result<Observed, LeaseError> {
        panic!("a retirement never writes")
    }
    async fn update(&self, _: &LeaseRecord, _: &str) -> Result<Observed, LeaseError> {
        panic!("a retirement never writes")
    }
    fn watch(&self) -> BoxStream<'static, LeaseEvent> {
        let rx = self.events.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.ok().map(|ev| (ev, rx))
        })
        .boxed()
    }
}

const TIMING: Timing = Timing {
    lease_duration: Duration::from_secs(5),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_secs(1),
};

fn spawn_follow(
    fake: &Fake,
    v: LeaseView,
) -> (tokio::task::JoinHandle<(bool, Instant)>, CancellationToken) {
    let stop = CancellationToken::new();
    let events = fake.watch();
    let (f, s) = (fake.clone(), stop.clone());
    let h = tokio::spawn(async move {
        let r = follow(f, events, v, TIMING, s).await;
        (r, Instant::now())
    });
    (h, stop)
}

#[tokio::test(start_paused = true)]
async fn frozen_holder_is_waited_for_until_its_lease_expires() {
    // The holder froze right after its last renewal (seen at t0) and never writes again.
    let t0 = Instant::now();
    let held = obs(rec("node-a", 100, 0, 5), 7);
    let fake = Fake::new(Some(held.clone()));
    let (h, _stop) = spawn_follow(&fake, view(Some(held), t0));
    let (done, at) = h.await.unwrap();
    assert!(done);
    assert_eq!(
        at,
        t0 + Duration::from_secs(5),
        "exactly at expiry, not before"
    );
    assert_eq!(fake.gets.load(Ordering::SeqCst), 1, "one read at the start");
}

#[tokio::test(start_paused = true)]
async fn a_release_ends_the_wait_at_once_and_a_renewal_postpones_it() {
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let fake = Fake::new(Some(obs(held.clone(), 7)));
    let (h, _stop) = spawn_follow(&fake, view(Some(obs(held.clone(), 7)), t0));
    // The holder resumes after 4 s and renews (same term): 5 s more from then.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut renewed = held.clone();
    renewed.renew_time = Some(Timestamp::from_second(104).unwrap());
    fake.write(obs(renewed, 8));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!h.is_finished(), "renewed 3 s ago: still held");
    // It learns its Service is gone: drops the VIPs, releases.
    let released = record::release(&held, Timestamp::from_second(108).unwrap());
    fake.write(obs(released, 9));
    let (done, at) = h.await.unwrap();
    assert!(done);
    assert_eq!(at, t0 + Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn a_release_the_elector_missed_is_found_by_the_first_read() {
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let released = record::release(&held, Timestamp::from_second(108).unwrap());
    let fake = Fake::new(Some(obs(released, 9)));
    let (h, _stop) = spawn_follow(&fake, view(Some(obs(held, 7)), t0));
    let (done, at) = h.await.unwrap();
    assert!(done);
    assert_eq!(at, t0);
}

#[tokio::test(start_paused = true)]
async fn released_then_deleted_by_its_holder_is_done_deleted_while_held_waits() {
    let t0 = Instant::now();
    let held = rec("node-a", 100, 0, 5);
    let fake = Fake::new(Some(obs(held.clone(), 7)));
    let (h, _stop) = spawn_follow(&fake, view(Some(obs(held.clone(), 7)), t0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.write(obs(
        record::release(&held, Timestamp::from_second(108).unwrap()),
        8,
    ));
    fake.delete();
    let (_, at) = h.await.unwrap();
    assert_eq!(at, t0 + Duration::from_millis(100));

    // `kubectl delete lease` while node-a holds it: node-a may still answer.
    let fake = Fake::new(Some(obs(held.clone(), 7)));
    let (h, _stop) = spawn_follow(&fake, view(Some(obs(held, 7)), t0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t1 = Instant::now();
    fake.delete();
    let (_, at) = h.await.unwrap();
    assert_eq!(at, t1 + Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_lease_never_seen_is_read_first() {
    let fake = Fake::new(None);
    let (h, _stop) = spawn_follow(&fake, LeaseView::unknown(Instant::now()));
    let (done, _) = h.await.unwrap();
    assert!(done, "absent on the first read: nothing to wait for");
    assert_eq!(fake.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn stopping_a_retirement_reports_not_done() {
    let t0 = Instant::now();
    let held = obs(rec("node-a", 100, 0, 5), 7);
    let fake = Fake::new(Some(held.clone()));
    let (h, stop) = spawn_follow(&fake, view(Some(held), t0));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let (done, _) = h.await.unwrap();
    assert!(!done);
}
