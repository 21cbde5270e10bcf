//! The orchestration's decisions, pass by pass, on plans made by the real planner.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use super::*;
use crate::election::record::{LeaseRecord, Observed};
use crate::net::VipSubnet;
use crate::services::plan::desired::{self, Mode, PlanConfig};
use crate::services::plan::governance::tests::{ip, lease, svc};

const NODE: &str = "node-a";

/// What a pass reports when it stops only `lease`.
fn stopped(lease: LeaseRef, delete_lease: bool) -> Vec<StopOrder> {
    vec![StopOrder {
        lease,
        delete_lease,
        not_here: None,
        continued_macs: BTreeSet::new(),
    }]
}

fn global() -> LeaseRef {
    LeaseRef {
        namespace: "kube-system".into(),
        name: "plndr-svcs-lock".into(),
    }
}

fn plan_cfg(per_service: bool) -> PlanConfig {
    mode_cfg(if per_service {
        Mode::PerService
    } else {
        Mode::Global(global())
    })
}

fn mode_cfg(mode: Mode) -> PlanConfig {
    PlanConfig {
        mode,
        control_plane: Vec::new(),
        interface: None,
        subnet: VipSubnet { v4: 32, v6: 128 },
    }
}

/// This node's groups across passes, applying the decisions as the runtime does (stops,
/// then starts and updates; retirements end at once, as when the stopped group released
/// its lease).
#[derive(Default)]
struct Node {
    prev: BTreeMap<IpAddr, LeaseRef>,
    groups: BTreeMap<LeaseRef, GroupSpec>,
}

/// What one pass did.
#[derive(Debug, Default)]
struct Pass {
    started: Vec<LeaseRef>,
    updated: Vec<LeaseRef>,
    stopped: Vec<StopOrder>,
    /// Retiring leases that keep running ([`Stops::kept`]).
    kept: BTreeSet<LeaseRef>,
}

impl Node {
    fn pass(&mut self, candidates: &[Candidate], per_service: bool) -> Pass {
        self.pass_in(candidates, &plan_cfg(per_service))
    }

    fn pass_in(&mut self, candidates: &[Candidate], cfg: &PlanConfig) -> Pass {
        let plan = desired::plan_leases(candidates, cfg);
        let running: BTreeSet<LeaseRef> = self.groups.keys().cloned().collect();
        let stops = stops(&self.prev, &plan, &running, &cfg.mode);
        self.prev = governance::governors(&plan);
        let mut out = Pass {
            kept: stops.kept,
            ..Pass::default()
        };
        for order in stops.stop {
            assert!(self.groups.remove(&order.lease).is_some(), "{order:?}");
            out.stopped.push(order);
        }
        let running: BTreeSet<LeaseRef> = self.groups.keys().cloned().collect();
        let runs = runs(&plan, candidates, &running, &BTreeMap::new());
        for (lease, spec) in runs.specs {
            match self.groups.insert(lease.clone(), spec.clone()) {
                None => out.started.push(lease),
                Some(old) if old != spec => out.updated.push(lease),
                Some(_) => {}
            }
        }
        out
    }

    /// Every address of every running group with its lease; panics if one is in two.
    fn lease_of_each_address(&self) -> BTreeMap<IpAddr, LeaseRef> {
        let mut out = BTreeMap::new();
        for (lease, spec) in &self.groups {
            for v in &spec.vips {
                let before = out.insert(v.vip.addr, lease.clone());
                assert!(before.is_none(), "{} in two groups", v.vip.addr);
            }
        }
        out
    }
}

#[test]
fn one_lease_per_service_and_per_shared_address_and_none_started_twice() {
    let mut node = Node::default();
    // a and b share 192.0.2.20 on different ports: a (older) governs it; c has its own.
    let services = [
        svc("a", 1, &["192.0.2.20"], 80),
        svc("b", 2, &["192.0.2.20"], 443),
        svc("c", 3, &["192.0.2.21"], 80),
    ];
    let pass = node.pass(&services, true);
    assert_eq!(pass.started, vec![lease("a"), lease("c")]);
    assert!(pass.stopped.is_empty());
    assert_eq!(
        node.lease_of_each_address(),
        BTreeMap::from([
            (ip("192.0.2.20"), lease("a")),
            (ip("192.0.2.21"), lease("c"))
        ])
    );
    // The shared address's group writes the status of both Services, each with its port.
    let a = &node.groups[&lease("a")];
    let keys: Vec<&str> = a.services.iter().map(|(k, _, _)| k.name.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(a.services[1].2[0].port, 443);
    // The same Services again: nothing starts, stops or changes.
    let pass = node.pass(&services, true);
    assert!(pass.started.is_empty() && pass.updated.is_empty() && pass.stopped.is_empty());
}

#[test]
fn one_global_lease_for_every_address() {
    let mut node = Node::default();
    let services = [
        svc("a", 1, &["192.0.2.20"], 80),
        svc("b", 2, &["192.0.2.21", "2001:db8::21"], 80),
    ];
    let pass = node.pass(&services, false);
    assert_eq!(pass.started, vec![global()]);
    assert_eq!(node.lease_of_each_address().len(), 3);
    assert!(node.pass(&services, false).started.is_empty());
}

#[test]
fn a_deleted_service_stops_its_group_and_deletes_its_lease() {
    let mut node = Node::default();
    let both = [
        svc("a", 1, &["192.0.2.20"], 80),
        svc("c", 3, &["192.0.2.21"], 80),
    ];
    node.pass(&both, true);
    // c deleted: its group stops (VIPs dropped, lease released) and its lease is deleted;
    // a's group is left alone.
    let pass = node.pass(&both[..1], true);
    assert_eq!(pass.stopped, stopped(lease("c"), true));
    assert!(pass.started.is_empty() && pass.updated.is_empty());
    assert_eq!(node.groups.keys().collect::<Vec<_>>(), [&lease("a")]);
}

#[test]
fn the_global_lease_stops_with_the_last_service_but_is_never_deleted() {
    let mut node = Node::default();
    let both = [
        svc("a", 1, &["192.0.2.20"], 80),
        svc("c", 3, &["192.0.2.21"], 80),
    ];
    node.pass(&both, false);
    // One Service deleted: the group stays and drops that address.
    let pass = node.pass(&both[..1], false);
    assert!(pass.stopped.is_empty());
    assert_eq!(pass.updated, vec![global()]);
    assert_eq!(node.lease_of_each_address().len(), 1);
    // The last one deleted: the group stops, the lease stays.
    let pass = node.pass(&[], false);
    assert_eq!(pass.stopped, stopped(global(), false));
    assert!(node.groups.is_empty());
}

#[test]
fn a_local_service_without_a_local_endpoint_stops_its_group_but_keeps_its_lease() {
    let mut node = Node::default();
    let mut local = svc("l", 1, &["192.0.2.30"], 80);
    local.etp_local = true;
    local.local_endpoint = true;
    assert_eq!(
        node.pass(std::slice::from_ref(&local), true).started,
        vec![lease("l")]
    );
    // The endpoint moved to another node: this node stops campaigning; the lease still
    // governs the address (for the node that has the endpoint) and is not deleted.
    local.local_endpoint = false;
    let pass = node.pass(std::slice::from_ref(&local), true);
    assert_eq!(pass.stopped, stopped(lease("l"), false));
    assert!(pass.started.is_empty());
    // Back on this node: campaigns again.
    local.local_endpoint = true;
    assert_eq!(node.pass(&[local], true).started, vec![lease("l")]);
}

#[test]
fn an_address_taken_over_by_an_older_service_moves_to_its_lease() {
    let mut node = Node::default();
    node.pass(&[svc("b", 2, &["192.0.2.20"], 80)], true);
    // An older Service a takes 192.0.2.20 on another port: a's lease governs it now; b's
    // group stops, and its lease, which governs nothing now, is deleted; b is announced
    // through a's group.
    let services = [
        svc("a", 1, &["192.0.2.20"], 443),
        svc("b", 2, &["192.0.2.20"], 80),
    ];
    let pass = node.pass(&services, true);
    assert_eq!(pass.stopped.len(), 1);
    assert_eq!(pass.stopped[0].lease, lease("b"));
    assert!(pass.stopped[0].delete_lease);
    assert_eq!(pass.started, vec![lease("a")]);
    assert_eq!(
        node.lease_of_each_address(),
        BTreeMap::from([(ip("192.0.2.20"), lease("a"))])
    );
    let names: Vec<&str> = node.groups[&lease("a")]
        .services
        .iter()
        .map(|(k, _, _)| k.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn retiring_addresses_are_held_back_from_the_new_lease() {
    let services = [svc("a", 1, &["192.0.2.20", "192.0.2.22"], 80)];
    let plan = desired::plan_leases(&services, &plan_cfg(true));
    let retiring = BTreeMap::from([(lease("b"), BTreeSet::from([ip("192.0.2.20")]))]);
    let r = runs(&plan, &services, &BTreeSet::new(), &retiring);
    assert_eq!(r.specs.len(), 1);
    let vips: Vec<IpAddr> = r.specs[0].1.vips.iter().map(|v| v.vip.addr).collect();
    assert_eq!(vips, [ip("192.0.2.22")]);
    assert_eq!(r.held_back[&lease("a")], BTreeSet::from([ip("192.0.2.20")]));
}

fn end(released: bool, holder: &str) -> ElectionEnd {
    ElectionEnd {
        released,
        observed: Some(Observed {
            record: LeaseRecord {
                holder: holder.into(),
                ..Default::default()
            },
            resource_version: "42".into(),
        }),
        observed_at: tokio::time::Instant::now(),
        absent_until: None,
        own: Default::default(),
    }
}

#[test]
fn the_lease_is_deleted_only_when_ordered_and_released_or_still_ours() {
    // Released on the way out (the holder is empty then).
    assert_eq!(
        lease_to_delete(true, Some(&end(true, "")), NODE),
        Some("42")
    );
    // Stepped down without a release, still named holder.
    assert_eq!(
        lease_to_delete(true, Some(&end(false, NODE)), NODE),
        Some("42")
    );
    // Another node holds it now, or deletion was not ordered, or nothing was seen.
    assert_eq!(
        lease_to_delete(true, Some(&end(false, "node-b")), NODE),
        None
    );
    assert_eq!(lease_to_delete(false, Some(&end(true, "")), NODE), None);
    assert_eq!(lease_to_delete(true, None, NODE), None);
    let mut unseen = end(true, "");
    unseen.observed = None;
    assert_eq!(lease_to_delete(true, Some(&unseen), NODE), None);
}

#[test]
fn a_lease_found_changed_is_deleted_again_only_when_released_or_still_ours() {
    // A release whose answer was lost: the server has the released record, one version on.
    let released = end(true, "").observed;
    let none = crate::election::OwnWrites::default();
    assert_eq!(
        lease_to_delete_again(released.as_ref(), NODE, &none),
        Some("42")
    );
    // Still under this node's name by the stopped elector's own write (one whose answer
    // was lost included).
    let mut ours = end(false, NODE).observed.unwrap();
    ours.record.renew_time = Some("2026-12-07T04:00:00.000001Z".parse().unwrap());
    let mut own = crate::election::OwnWrites::default();
    own.attempted(&ours.record);
    assert_eq!(lease_to_delete_again(Some(&ours), NODE, &own), Some("42"));
    // Under this node's name but written by another process (duplicate identity: a twin
    // holds it), another node holds it now (a recreated Service's holder), or it is gone.
    assert_eq!(lease_to_delete_again(Some(&ours), NODE, &none), None);
    let other = end(false, "node-b").observed;
    assert_eq!(lease_to_delete_again(other.as_ref(), NODE, &own), None);
    assert_eq!(lease_to_delete_again(None, NODE, &own), None);
}

#[test]
fn local_services_without_endpoints_are_noted_with_either_kind_of_lease() {
    let mut local = svc("l", 1, &["192.0.2.30"], 80);
    local.etp_local = true;
    let without: HashSet<ServiceKey> = [local.key.clone()].into();
    let plan = desired::plan_leases(std::slice::from_ref(&local), &plan_cfg(true));
    let nowhere = endpointless(&plan, &without);
    assert_eq!(nowhere, without);
    let notes = endpointless_notes(&plan, &nowhere, &[]);
    assert_eq!(notes.len(), 1);
    assert_eq!(
        notes[0].reason,
        crate::services::plan::reasons::REASON_NO_LOCAL_ENDPOINT
    );
    assert!(notes[0].warn);
    // One lease for all: the Local Service has a lease of its own all the same (issue 26),
    // which nobody campaigns for without an endpoint.
    let plan = desired::plan_leases(std::slice::from_ref(&local), &plan_cfg(false));
    assert_eq!(endpointless(&plan, &without), without);
    // Sharing its address with an older Cluster Service, it is announced with that one.
    let mut cluster = svc("c", 0, &["192.0.2.30"], 443);
    cluster.etp_local = false;
    let plan = desired::plan_leases(&[local, cluster], &plan_cfg(false));
    assert!(endpointless(&plan, &without).is_empty());
}

#[test]
fn services_are_counted_per_namespace() {
    let mut other = svc("x", 2, &["192.0.2.40"], 80);
    other.key = ServiceKey::new("prod", "x");
    let services = [svc("a", 1, &["192.0.2.20"], 80), other];
    let plan = desired::plan_leases(&services, &plan_cfg(true));
    assert_eq!(
        per_namespace(&plan),
        BTreeMap::from([("default".to_string(), 1), ("prod".to_string(), 1)])
    );
}

#[test]
fn status_is_written_only_while_leading() {
    use GroupEvent::*;
    use StatusStep::*;
    // Following: nothing is written; a due retry is dropped.
    for ev in [Spec, CacheSeen, Bound, Leading(false)] {
        assert_ne!(status_step(false, ev, false), Sync { retrying: true });
        assert_ne!(status_step(false, ev, false), Sync { retrying: false });
    }
    assert_eq!(status_step(false, RetryDue, true), DropRetry);
    // Taking the lease starts a term; losing it ends it; a repeat changes nothing.
    assert_eq!(status_step(false, Leading(true), false), NewTerm);
    assert_eq!(status_step(true, Leading(true), false), Nothing);
    assert_eq!(status_step(true, Leading(false), false), EndTerm);
    // Leading: a new spec or a due retry also writes pending Events; the holder's bound
    // addresses and a cache pass compare with the cache.
    assert_eq!(status_step(true, Spec, false), Sync { retrying: true });
    assert_eq!(status_step(true, RetryDue, true), Sync { retrying: true });
    assert_eq!(status_step(true, Bound, false), Sync { retrying: false });
    assert_eq!(
        status_step(true, CacheSeen, false),
        Sync { retrying: false }
    );
    // While a retry is scheduled, a cache pass leaves the writing to the retry.
    assert_eq!(status_step(true, CacheSeen, true), Nothing);
}

/// The status task takes every event queued while it wrote: one event alone is its
/// [`status_step`]; a burst of cache passes is one sync; a lost lease in the burst cancels
/// what came before it, and a lease lost and taken again is a new term.
#[test]
fn queued_status_events_fold_into_one_sync() {
    use GroupEvent::*;
    let all = [
        Spec,
        Leading(true),
        Leading(false),
        CacheSeen,
        RetryDue,
        Bound,
    ];
    for leading in [false, true] {
        for retry in [false, true] {
            for ev in all {
                let batch = status_batch(leading, retry, &[ev]);
                let expected = match status_step(leading, ev, retry) {
                    StatusStep::Nothing => StatusBatch::default(),
                    StatusStep::Sync { retrying } => StatusBatch {
                        sync: Some(retrying),
                        ..StatusBatch::default()
                    },
                    StatusStep::NewTerm => StatusBatch {
                        reset: true,
                        sync: Some(true),
                        ..StatusBatch::default()
                    },
                    StatusStep::EndTerm => StatusBatch {
                        reset: true,
                        ..StatusBatch::default()
                    },
                    StatusStep::DropRetry => StatusBatch {
                        drop_retry: true,
                        ..StatusBatch::default()
                    },
                };
                let leading_after = match ev {
                    Leading(now) => now,
                    _ => leading,
                };
                assert_eq!(
                    batch,
                    StatusBatch {
                        leading: leading_after,
                        ..expected
                    },
                    "{ev:?} leading={leading} retry={retry}"
                );
            }
        }
    }
    // A burst of cache passes and binds: one sync; a new spec in it also writes Events.
    let burst = status_batch(true, false, &[CacheSeen, Bound, CacheSeen]);
    assert_eq!(burst.sync, Some(false));
    assert_eq!(
        status_batch(true, false, &[CacheSeen, Spec, CacheSeen]).sync,
        Some(true)
    );
    // The lease lost after changes: nothing written, the term forgotten.
    let lost = status_batch(true, false, &[Spec, Bound, Leading(false), CacheSeen]);
    assert_eq!(
        lost,
        StatusBatch {
            leading: false,
            reset: true,
            drop_retry: false,
            sync: None
        }
    );
    // Lost and taken again: a new term that writes everything.
    let again = status_batch(true, true, &[Leading(false), Leading(true), CacheSeen]);
    assert_eq!(
        again,
        StatusBatch {
            leading: true,
            reset: true,
            drop_retry: false,
            sync: Some(true)
        }
    );
    // A retry scheduled: cache passes leave the writing to it, until the term is new.
    assert_eq!(status_batch(true, true, &[CacheSeen, CacheSeen]).sync, None);
    // Not leading: a due retry is dropped, and the cache passes after it write nothing.
    let following = status_batch(false, true, &[RetryDue, CacheSeen]);
    assert!(following.drop_retry && following.sync.is_none());
}

/// Issue 26: with one lease for all, a Local Service's own lease is deleted when the Service
/// goes (as a per-Service lease is); the global lease never is.
#[test]
fn a_local_services_own_lease_goes_with_it_under_one_lease_for_all() {
    let mut local = svc("l", 1, &["192.0.2.30"], 80);
    local.etp_local = true;
    local.local_endpoint = true;
    let cluster = svc("c", 2, &["192.0.2.31"], 80);
    let mut node = Node::default();
    let first = node.pass(&[local.clone(), cluster.clone()], false);
    let own = desired::local_lease(&global().namespace, &local.key);
    assert_eq!(first.started, [global(), own.clone()]);
    let second = node.pass(std::slice::from_ref(&cluster), false);
    assert_eq!(second.stopped.len(), 1, "{second:?}");
    assert_eq!(second.stopped[0].lease, own);
    assert!(second.stopped[0].delete_lease);
    let third = node.pass(&[], false);
    assert!(third.stopped.iter().all(|o| !o.delete_lease), "{third:?}");
}

/// The egress wing hears of the candidates with egress annotations only, with their
/// egress annotations alone and their VIPs without the DHCP placeholder.
#[test]
fn egress_facts_of_annotated_candidates_only() {
    use k8s_openapi::api::core::v1::Service;
    let service = |name: &str, ann: &[(&str, &str)]| {
        let mut s = Service::default();
        s.metadata.namespace = Some("default".into());
        s.metadata.name = Some(name.into());
        s.metadata.annotations = Some(
            ann.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Arc::new(s)
    };
    let services = vec![
        service(
            "out",
            &[
                ("kube-vip.io/egress", "true"),
                ("kube-vip.io/egress-destination-ports", "tcp:443"),
                ("kube-vip.io/vipHost", "node-a"),
            ],
        ),
        service("plain", &[("kube-vip.io/vipHost", "node-a")]),
    ];
    let mut out = svc("out", 1, &["192.0.2.30", "0.0.0.0"], 80);
    out.etp_local = true;
    let plain = svc("plain", 1, &["192.0.2.31"], 80);
    let facts = egress_facts(&[plain, out], &services);
    assert_eq!(facts.len(), 1);
    let f = &facts[0];
    assert_eq!((f.namespace.as_str(), f.name.as_str()), ("default", "out"));
    assert_eq!(f.vips, vec![ip("192.0.2.30")]);
    assert!(f.etp_local);
    assert!(f.local_endpoints.is_empty(), "filled by the runtime");
    assert_eq!(
        f.annotations.keys().collect::<Vec<_>>(),
        ["kube-vip.io/egress", "kube-vip.io/egress-destination-ports"]
    );
}

/// Issue 28: a shard count change while running. Growing: the new shard starts with the
/// Services placed on it, every shard that lost one is stopped (it retires those addresses:
/// its holder releases, so the new shard's holder binds them only after the hand-over) and
/// no lease is deleted; shrinking: the shard beyond the count is stopped and its lease
/// deleted once released, its Services move to the remaining shards.
#[test]
fn a_shard_count_change_moves_services_without_releasing_a_shard_and_deletes_only_dropped_shards() {
    let shards = |count| desired::Shards {
        namespace: "kube-system".into(),
        count,
    };
    let services: Vec<Candidate> = (0..12)
        .map(|i| svc(&format!("s{i}"), i, &[&format!("192.0.2.{}", 20 + i)], 80))
        .collect();
    let mut node = Node::default();
    let two = mode_cfg(Mode::Sharded(shards(2)));
    let pass = node.pass_in(&services, &two);
    assert_eq!(pass.started, vec![shards(2).lease(0), shards(2).lease(1)]);
    let three = mode_cfg(Mode::Sharded(shards(3)));
    let moved: Vec<&Candidate> = services
        .iter()
        .filter(|c| shards(3).index_of(c.uid.as_deref().unwrap()) == 2)
        .collect();
    assert!(!moved.is_empty(), "12 Services put none on the third shard");
    let losers: BTreeSet<LeaseRef> = moved
        .iter()
        .map(|c| shards(2).lease(shards(2).index_of(c.uid.as_deref().unwrap())))
        .collect();
    let pass = node.pass_in(&services, &three);
    // The shards that lose Services keep running (a release would hand all their other
    // Services over): they retire only the moved addresses.
    assert!(pass.stopped.is_empty(), "{:?}", pass.stopped);
    assert_eq!(pass.kept, losers);
    let updated: BTreeSet<LeaseRef> = pass.updated.iter().cloned().collect();
    assert_eq!(updated, losers);
    assert!(pass.started.contains(&shards(3).lease(2)));
    let held = node.lease_of_each_address();
    for c in &moved {
        assert_eq!(held[&c.addresses[0]], shards(3).lease(2));
    }
    // Back to two: shard 2 goes, its lease deleted after its release.
    let pass = node.pass_in(&services, &two);
    let dropped: Vec<&StopOrder> = pass
        .stopped
        .iter()
        .filter(|o| o.lease == shards(3).lease(2))
        .collect();
    assert_eq!(dropped.len(), 1);
    assert!(dropped[0].delete_lease);
    assert!(pass.stopped.iter().filter(|o| o.delete_lease).count() == 1);
    assert_eq!(node.lease_of_each_address().len(), 12);
}

/// Without election: the governing Service of a shared address deleted, its group stays
/// (only updated), nothing retires; the address's last Service deleted, its group stops
/// and retires nothing either (no other node waits for it).
#[test]
fn without_election_a_shared_address_keeps_its_group_and_nothing_retires() {
    let cfg = mode_cfg(Mode::Unelected);
    let mut node = Node::default();
    let services = [
        svc("a", 1, &["192.0.2.20"], 80),
        svc("b", 2, &["192.0.2.20"], 443),
    ];
    let group = desired::unelected_group(ip("192.0.2.20"));
    let pass = node.pass_in(&services, &cfg);
    assert_eq!(pass.started, vec![group.clone()]);
    let plan = desired::plan_leases(&services[1..], &cfg);
    let running: BTreeSet<LeaseRef> = node.groups.keys().cloned().collect();
    let s = stops(&node.prev, &plan, &running, &cfg.mode);
    assert!(s.stop.is_empty() && s.retire.is_empty(), "{s:?}");
    let pass = node.pass_in(&services[1..], &cfg);
    assert!(pass.started.is_empty() && pass.stopped.is_empty());
    assert_eq!(pass.updated, vec![group.clone()]);
    let plan = desired::plan_leases(&[], &cfg);
    let running: BTreeSet<LeaseRef> = node.groups.keys().cloned().collect();
    let s = stops(&node.prev, &plan, &running, &cfg.mode);
    assert_eq!(s.stop.len(), 1);
    assert!(s.retire.is_empty(), "{s:?}");
}
