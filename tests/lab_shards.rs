//! S62, S63: shard leases (`svc_leaseshards`, issue 28). Services share a fixed number of
//! shard Leases (`kube-system/vipd-services-shard-<i>`), placed by a rendezvous hash of
//! their UID; the holder of a shard announces every address on it.
//!
//! * S62: 18 Services, one sharing an address, one `externalTrafficPolicy: Local`, three
//!   nodes, 6 shards: every address is carried by its shard's holder and no other node,
//!   the shards spread over the nodes, the Local Service keeps a lease of its own held by
//!   its endpoint's node, no per-Service lease exists; SIGKILL of the node holding the
//!   most shards moves its addresses (never two carriers); a drained node hands its
//!   shards over with a release.
//! * S63: a shard count change by a rolling restart (3 -> 4 shards): the Services placed
//!   on the new shard move to its holder, no address is ever carried by two nodes (the
//!   conflict probe refuses an address whose old shard's holder still answers), and the
//!   shard beyond a smaller count is released after a change back (4 -> 3).
//!
//! Run as root: `cargo test --test lab_shards` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use vipd::services::plan::desired::shard_of;
use xtask::lab::{Lab, LabOptions, LabProcess, Signal};

const LIMIT: Duration = Duration::from_secs(60);
const SHARD_NS: &str = "kube-system";

/// The nodes carrying each lab address on eth0 right now (one netlink dump per node), not
/// counting an inert second-line address whose fence element has expired ([`FenceView`]).
fn carried(lab: &Lab) -> BTreeMap<IpAddr, Vec<String>> {
    let mut out: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for n in NODES {
        let fence = FenceView::read(lab, n);
        for a in lab.addresses(n, "eth0").unwrap_or_default() {
            if fence.answers(a.addr) {
                out.entry(a.addr).or_default().push(n.to_string());
            }
        }
    }
    out
}

/// Panics if an address of `addrs` was carried by two nodes at once: seen on two in `now`
/// (read node after node) and still on the earlier one when read again ([`overlapping`]).
fn assert_one_carrier(
    lab: &Lab,
    now: &BTreeMap<IpAddr, Vec<String>>,
    addrs: &[IpAddr],
    when: &str,
) {
    for a in addrs {
        let c = now.get(a).map(Vec::as_slice).unwrap_or_default();
        let both = overlapping(c, |n| carries(lab, n, *a));
        assert!(both.is_empty(), "{when}: {a} carried by {both:?} at once");
    }
}

/// `metadata.uid` of Service `default/name`.
fn uid(lab: &Lab, name: &str) -> String {
    get_service(lab, name).expect("service")["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string()
}

/// Holders of shards 0 to `count` - 1 (`None`: the Lease is missing or released).
fn shard_holders(lab: &Lab, count: u16) -> Vec<Option<String>> {
    (0..count)
        .map(|i| {
            lease_holder(lab, SHARD_NS, &format!("vipd-services-shard-{i}"))
                .filter(|h| !h.is_empty())
        })
        .collect()
}

/// Services `svc-<i>` on 192.0.2.(150 + i), port 80: their addresses and UIDs.
fn create_services(lab: &Lab, n: usize) -> Vec<(IpAddr, String)> {
    (0..n)
        .map(|i| {
            let ip = format!("192.0.2.{}", 150 + i);
            let name = format!("svc-{i}");
            create_service(
                lab,
                &service_json(&name, Some(&ip), None, &[(80, "TCP")], false),
            );
            (ip.parse().expect("ip"), uid(lab, &name))
        })
        .collect()
}

/// Waits until every shard of `count` that has Services is held and every address is
/// carried by its shard's holder alone; returns the holders (`""` for a shard without
/// Services, whose Lease never exists). On timeout, panics with what was seen last.
fn wait_placed(lab: &Lab, services: &[(IpAddr, String)], count: u16) -> Vec<String> {
    let start = Instant::now();
    loop {
        let holders = shard_holders(lab, count);
        let now = carried(lab);
        let all: Vec<IpAddr> = services.iter().map(|(a, _)| *a).collect();
        assert_one_carrier(lab, &now, &all, "placing");
        let used: BTreeSet<u16> = services.iter().map(|(_, u)| shard_of(u, count)).collect();
        let misplaced: Vec<String> = services
            .iter()
            .filter_map(|(a, uid)| {
                let want = holders[usize::from(shard_of(uid, count))].as_ref();
                let got = now.get(a).cloned().unwrap_or_default();
                (want.is_none() || got != [want.cloned().unwrap_or_default()])
                    .then(|| format!("{a} (shard {}): {got:?}", shard_of(uid, count)))
            })
            .collect();
        if misplaced.is_empty() && used.iter().all(|i| holders[usize::from(*i)].is_some()) {
            return holders.into_iter().map(Option::unwrap_or_default).collect();
        }
        assert!(
            start.elapsed() < LIMIT,
            "{count} shards: not every address on its shard's holder after {LIMIT:?}: holders \
             {holders:?}, misplaced {misplaced:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts vipd on `node` with `shards` shard leases and an admin endpoint.
fn start(lab: &Lab, node: &str, shards: &str) -> LabProcess {
    start_vipd_services(
        lab,
        node,
        true,
        &[
            ("svc_leaseshards", shards),
            ("prometheus_server", "127.0.0.1:2112"),
        ],
    )
}

fn node_index(node: &str) -> usize {
    NODES.iter().position(|n| *n == node).expect("node")
}

#[test]
fn s62_shards_carry_their_services_spread_fail_over_and_drain() {
    let Some(lab) = lab("shards", LabOptions::default()) else {
        return;
    };
    for n in NODES {
        create_ready_node(&lab, n);
    }
    // All three nodes up before the Services exist, so the spread is judged between nodes
    // that all campaign (a node that starts after the others have taken every shard gets
    // none: nothing is preempted; under CI load a node came up that late).
    let mut procs: Vec<LabProcess> = NODES.iter().map(|n| start(&lab, n, "6")).collect();
    for p in &procs {
        wait_until(
            &format!("{} has loaded its caches", p.name()),
            LIMIT,
            || {
                p.log()
                    .contains("Services: initial lists of Services, Nodes and endpoints loaded")
            },
        );
    }
    let mut services = create_services(&lab, 18);
    // Shares svc-0's address on another port: carried with it, by the lease of the older
    // of the two (creation second, then name: created in the same second, "sharer" wins).
    // On another shard than svc-0's (re-created until it is), so that deleting the
    // governing one of the two below moves the address between shards.
    let sharer = || service_json("sharer", Some("192.0.2.150"), None, &[(443, "TCP")], false);
    create_service(&lab, &sharer());
    for _ in 0..20 {
        if shard_of(&uid(&lab, "sharer"), 6) != shard_of(&services[0].1, 6) {
            break;
        }
        delete_service(&lab, "sharer");
        wait_until("the sharer deleted", LIMIT, || {
            get_service(&lab, "sharer").is_none()
        });
        create_service(&lab, &sharer());
    }
    let created = |name: &str| {
        get_service(&lab, name).expect("service")["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let (governor, survivor) = match created("sharer") == created("svc-0") {
        true => ("sharer", "svc-0"),
        false => ("svc-0", "sharer"),
    };
    services[0].1 = uid(&lab, governor);
    // Local: only node-c has an endpoint.
    create_service(
        &lab,
        &service_json("local", Some("192.0.2.190"), None, &[(80, "TCP")], true),
    );
    set_endpoints(&lab, "local", &["node-c"]);
    let placed = wait_placed(&lab, &services, 6);
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for h in &placed {
        *per_node.entry(h.as_str()).or_default() += 1;
    }
    per_node.remove("");
    eprintln!("S62 shard holders: {placed:?}");
    assert_eq!(per_node.len(), 3, "every node holds a shard: {per_node:?}");
    let local_lease = "vipd-local.default.local";
    wait_until("the Local Service's own lease on node-c", LIMIT, || {
        lease_holder(&lab, SHARD_NS, local_lease).as_deref() == Some("node-c")
            && holders(&lab, "192.0.2.190") == ["node-c"]
    });
    wait_until("the sharer's status", LIMIT, || {
        ingress_ips(&lab, "sharer") == ["192.0.2.150"]
    });
    // The governing one of the two sharers deleted: the shared address moves to the
    // survivor's shard. The shard it leaves keeps running with its other Services (a
    // release would hand all of them over to move one address): they stay on its holder
    // at every sample, the lease keeps its holder and term, and the moved address is
    // never carried by two nodes (the new shard's holder binds it once the old one has
    // had a lease duration to drop it, after a conflict probe).
    let shared_addr: IpAddr = "192.0.2.150".parse().expect("ip");
    let (from_shard, to_shard) = (
        shard_of(&services[0].1, 6),
        shard_of(&uid(&lab, survivor), 6),
    );
    assert_ne!(
        from_shard, to_shard,
        "the sharer was re-created until they differ"
    );
    let from_lease = format!("vipd-services-shard-{from_shard}");
    let term = |l: &serde_json::Value| {
        (
            l["spec"]["holderIdentity"].clone(),
            l["spec"]["acquireTime"].clone(),
            l["spec"]["leaseTransitions"].clone(),
        )
    };
    let before = term(&lease(&lab, SHARD_NS, &from_lease).expect("the old shard's lease"));
    let stay: Vec<IpAddr> = services
        .iter()
        .filter(|(a, u)| *a != shared_addr && shard_of(u, 6) == from_shard)
        .map(|(a, _)| *a)
        .collect();
    let old_holder = placed[usize::from(from_shard)].clone();
    let all: Vec<IpAddr> = services.iter().map(|(a, _)| *a).collect();
    let deleted = Instant::now();
    delete_service(&lab, governor);
    services[0].1 = uid(&lab, survivor);
    let moved_in = wait_for("the shared address on the survivor's shard", LIMIT, || {
        let now = carried(&lab);
        assert_one_carrier(&lab, &now, &all, "moving a shared address");
        for a in &stay {
            assert_eq!(
                now.get(a).map(Vec::as_slice).unwrap_or_default(),
                std::slice::from_ref(&old_holder),
                "{a} stays on shard {from_shard}'s holder while {shared_addr} leaves it"
            );
        }
        let to = shard_holders(&lab, 6)[usize::from(to_shard)].clone()?;
        (now.get(&shared_addr) == Some(&vec![to])).then(|| deleted.elapsed())
    });
    eprintln!(
        "S62 {shared_addr} moved from shard {from_shard} to {to_shard} in {} ms, its {} \
         neighbours carried throughout",
        moved_in.as_millis(),
        stay.len()
    );
    match stay.is_empty() {
        false => assert_eq!(
            term(&lease(&lab, SHARD_NS, &from_lease).expect("the old shard's lease")),
            before,
            "shard {from_shard} kept its holder and term"
        ),
        // The shard had no other Service: it left the plan, so its holder released it
        // (and the address moved on the release, without the lease-duration wait).
        true => assert_eq!(
            lease_holder(&lab, SHARD_NS, &from_lease).unwrap_or_default(),
            "",
            "shard {from_shard} had no other Service: released"
        ),
    }

    // Shards replace per-Service leases: none was created.
    let r = lab
        .api_request(
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            None,
        )
        .expect("list leases");
    assert!(!r.body.contains("kubevip-svc-"), "{}", r.body);

    // SIGKILL of the node with the most shards: its addresses move, one carrier each.
    let (victim, _) = per_node
        .iter()
        .max_by_key(|(n, c)| (**c, std::cmp::Reverse(**n)))
        .map(|(n, c)| (n.to_string(), *c))
        .expect("a holder");
    let moving: Vec<IpAddr> = services
        .iter()
        .filter(|(_, u)| placed[usize::from(shard_of(u, 6))] == victim)
        .map(|(a, _)| *a)
        .collect();
    let killed = Instant::now();
    procs[node_index(&victim)]
        .signal(Signal::SIGKILL)
        .expect("kill");
    let moved_in = wait_for("the killed node's addresses elsewhere", LIMIT, || {
        let now = carried(&lab);
        assert_one_carrier(&lab, &now, &all, "after SIGKILL");
        moving
            .iter()
            .all(|a| now.get(a).is_some_and(|c| c.len() == 1 && c[0] != victim))
            .then(|| killed.elapsed())
    });
    eprintln!(
        "S62 SIGKILL of {victim}: its {} addresses carried elsewhere after {} ms",
        moving.len(),
        moved_in.as_millis()
    );
    let _ = procs[node_index(&victim)].wait_timeout(Duration::from_secs(5));
    procs[node_index(&victim)] = start(&lab, &victim, "6");

    // Drain a node holding shards: it releases them, the others carry its addresses.
    let placed = wait_placed(&lab, &services, 6);
    let drained = placed
        .iter()
        .find(|h| !h.is_empty() && **h != victim)
        .cloned()
        .expect("a node other than the restarted one holds a shard");
    patch_node(
        &lab,
        &drained,
        json!({"metadata": {"annotations": {"vipd.io/drain": "true"}}}),
    );
    wait_for("the drained node to hold no shard", LIMIT, || {
        let now = carried(&lab);
        assert_one_carrier(&lab, &now, &all, "while draining");
        let h = shard_holders(&lab, 6);
        (h.iter().all(|h| h.as_ref() != Some(&drained))
            && all
                .iter()
                .all(|a| now.get(a).is_some_and(|c| c.len() == 1 && c[0] != drained)))
        .then_some(())
    });
    let log = procs[node_index(&drained)].log();
    assert!(
        log.contains("lease released"),
        "no graceful release:\n{log}"
    );
    stop_all(&mut procs);
}

#[test]
fn s63_a_shard_count_change_moves_services_with_one_carrier_throughout() {
    let Some(lab) = lab("shards_count", LabOptions::default()) else {
        return;
    };
    let services = create_services(&lab, 12);
    let all: Vec<IpAddr> = services.iter().map(|(a, _)| *a).collect();
    let mut procs: Vec<LabProcess> = NODES.iter().map(|n| start(&lab, n, "3")).collect();
    wait_placed(&lab, &services, 3);
    let moving: BTreeSet<IpAddr> = services
        .iter()
        .filter(|(_, u)| shard_of(u, 4) == 3)
        .map(|(a, _)| *a)
        .collect();
    eprintln!("S63 3 -> 4 shards moves {} of 12 Services", moving.len());
    let began = Instant::now();
    // Rolling restart with 4 shards, sampling the carriers all along.
    for (i, n) in NODES.iter().enumerate() {
        let _ = procs[i].signal(Signal::SIGTERM);
        let stop = Instant::now();
        while procs[i]
            .wait_timeout(Duration::from_millis(50))
            .ok()
            .flatten()
            .is_none()
        {
            assert_one_carrier(&lab, &carried(&lab), &all, "rolling restart");
            assert!(stop.elapsed() < Duration::from_secs(15), "{n} did not stop");
        }
        procs[i] = start(&lab, n, "4");
        let settle = Instant::now();
        while settle.elapsed() < Duration::from_secs(2) {
            assert_one_carrier(&lab, &carried(&lab), &all, "rolling restart");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    wait_placed(&lab, &services, 4);
    eprintln!(
        "S63 3 -> 4: every Service on its new shard {} ms after the roll began",
        began.elapsed().as_millis()
    );
    // Back to 3: shard 3 is released and no node campaigns for it any more (the orphan
    // collector deletes it once unchanged for its duration plus 30 s: unit-tested).
    for (i, n) in NODES.iter().enumerate() {
        let _ = procs[i].signal(Signal::SIGTERM);
        let _ = procs[i].wait_timeout(Duration::from_secs(15));
        procs[i] = start(&lab, n, "3");
    }
    wait_placed(&lab, &services, 3);
    wait_until("shard 3's lease released", LIMIT, || {
        lease_holder(&lab, SHARD_NS, "vipd-services-shard-3").is_none_or(|h| h.is_empty())
    });
    stop_all(&mut procs);
}
