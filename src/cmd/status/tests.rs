//! `vipd status` decisions and rendering.

use super::*;
use k8s_openapi::api::core::v1::Service;

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

const NOW: i64 = 1_800_000_000;

fn lref(ns: &str, name: &str) -> LeaseRef {
    LeaseRef {
        namespace: ns.into(),
        name: name.into(),
    }
}

fn record(holder: &str, renewed_ago: i64, acquired_ago: i64, moves: i32) -> LeaseRecord {
    LeaseRecord {
        holder: holder.into(),
        lease_duration_secs: 5,
        acquire_time: Some(ts(NOW - acquired_ago)),
        renew_time: Some(ts(NOW - renewed_ago)),
        transitions: moves,
        failback_request: None,
        lease_duration_ms: None,
        // vipd holders with the peer key (the default); see the ride-through note test.
        ride_through: Some(std::time::Duration::from_secs(60)),
    }
}

fn lb_service(ns: &str, name: &str, annotations: &[(&str, &str)]) -> ServiceInfo {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {
            "namespace": ns, "name": name,
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        },
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }))
    .unwrap();
    service_info(&svc)
}

fn view() -> ClusterView {
    ClusterView {
        cp_lease: lref("kube-system", "plndr-cp-lock"),
        svc_lease: lref("kube-system", "plndr-svcs-lock"),
        ..Default::default()
    }
}

#[test]
fn control_plane_row_from_its_lease_and_the_node_label() {
    let mut v = view();
    v.leases
        .insert(v.cp_lease.clone(), record("node-a", 1, 300, 4));
    v.has_ip.push(("192.0.2.10".into(), "node-a".into()));
    v.has_ip.push(("192.0.2.10".into(), "node-b".into()));
    let rows = vip_statuses(&v, ts(NOW));
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r.kind, "control-plane");
    assert_eq!(r.vips, vec!["192.0.2.10"]);
    assert_eq!(r.holder.as_deref(), Some("node-a"));
    assert_eq!(
        (r.renewed_ago_s, r.held_for_s, r.moves),
        (Some(1), Some(300), Some(4))
    );
    assert!(!r.expired);
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    assert!(r.notes[0].contains("node-b still carries"), "{:?}", r.notes);
}

#[test]
fn no_control_plane_row_without_its_lease_and_expired_when_not_renewed() {
    let mut v = view();
    assert!(vip_statuses(&v, ts(NOW)).is_empty());
    v.leases
        .insert(v.cp_lease.clone(), record("node-a", 6, 60, 0));
    let r = &vip_statuses(&v, ts(NOW))[0];
    assert!(r.expired, "renewed 6 s ago with a 5 s lease");
    assert_eq!(r.vips, vec!["-"], "no node label: VIP unknown");
    // Released: nobody holds it, nothing is expired.
    let mut released = record("", 20, 60, 1);
    released.acquire_time = None;
    v.leases.insert(v.cp_lease.clone(), released);
    let r = &vip_statuses(&v, ts(NOW))[0];
    assert_eq!((r.holder.as_ref(), r.expired), (None, false));
}

#[test]
fn service_uses_its_own_lease_else_the_global_one_and_reports_disagreements() {
    let mut v = view();
    let web = lb_service(
        "apps",
        "web",
        &[("kube-vip.io/loadbalancerIPs", "192.0.2.20")],
    );
    let db = lb_service(
        "apps",
        "db",
        &[
            ("kube-vip.io/loadbalancerIPs", "192.0.2.21,192.0.2.300"),
            ("kube-vip.io/vipHost", "node-c"),
        ],
    );
    v.services.push((web, vec!["192.0.2.20".into()]));
    v.services.push((db, vec![]));
    v.leases
        .insert(lref("apps", "kubevip-web"), record("node-b", 0, 10, 1));
    v.leases
        .insert(v.svc_lease.clone(), record("node-a", 2, 100, 0));
    v.events.push(EventView {
        namespace: "apps".into(),
        name: "web".into(),
        reason: "AddressAnnounced".into(),
        message: "192.0.2.20 announced by node-b".into(),
        time: Some(ts(NOW - 9)),
    });
    v.events.push(EventView {
        namespace: "apps".into(),
        name: "web".into(),
        reason: "AddressAnnounced".into(),
        message: "older".into(),
        time: Some(ts(NOW - 90)),
    });
    let rows = vip_statuses(&v, ts(NOW));
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["apps/db", "apps/web"], "sorted by namespace/name");
    let (db, web) = (&rows[0], &rows[1]);
    assert_eq!(web.lease, "apps/kubevip-web");
    assert_eq!(web.holder.as_deref(), Some("node-b"));
    assert_eq!(
        web.notes,
        vec!["last Event AddressAnnounced: 192.0.2.20 announced by node-b (9s ago)"]
    );
    assert_eq!(
        db.lease, "kube-system/plndr-svcs-lock",
        "no own lease: the global one"
    );
    assert_eq!(db.holder.as_deref(), Some("node-a"));
    assert_eq!(db.vips, vec!["192.0.2.21"]);
    let notes = db.notes.join(" | ");
    assert!(notes.contains("192.0.2.300"), "{notes}");
    assert!(
        notes.contains("status.loadBalancer.ingress shows []"),
        "{notes}"
    );
    assert!(notes.contains("kube-vip.io/vipHost says node-c"), "{notes}");
}

/// A pending fail-back request (`vipd.io/failback-request` on the Service's lease) is shown
/// with the requesting node, unless that node already holds the lease.
#[test]
fn service_row_shows_a_pending_failback_request() {
    let mut v = view();
    let web = lb_service(
        "apps",
        "web",
        &[("kube-vip.io/loadbalancerIPs", "192.0.2.20")],
    );
    v.services.push((web, vec!["192.0.2.20".into()]));
    let mut r = record("node-b", 0, 10, 1);
    r.failback_request = Some("node-a".into());
    v.leases.insert(lref("apps", "kubevip-web"), r.clone());
    let notes = vip_statuses(&v, ts(NOW))[0].notes.join(" | ");
    assert!(notes.contains("fail-back requested by node-a"), "{notes}");
    r.holder = "node-a".into();
    v.leases.insert(lref("apps", "kubevip-web"), r);
    let notes = vip_statuses(&v, ts(NOW))[0].notes.join(" | ");
    assert!(!notes.contains("fail-back"), "{notes}");
}

#[test]
fn service_without_any_lease_or_address_says_so() {
    let mut v = view();
    v.services.push((lb_service("apps", "idle", &[]), vec![]));
    let r = &vip_statuses(&v, ts(NOW))[0];
    assert_eq!(r.lease, "apps/kubevip-idle");
    assert_eq!(r.holder, None);
    assert_eq!(r.vips, vec!["-"]);
    let notes = r.notes.join(" | ");
    assert!(
        notes.contains("no address") && notes.contains("no Lease apps/kubevip-idle"),
        "{notes}"
    );
    // Not a LoadBalancer, or ignored: not shown.
    let mut other = lb_service("apps", "cluster-ip", &[]);
    other.is_load_balancer = false;
    let ignored = lb_service("apps", "ignored", &[("kube-vip.io/ignore", "true")]);
    v.services.push((other, vec![]));
    v.services.push((ignored, vec![]));
    assert_eq!(vip_statuses(&v, ts(NOW)).len(), 1);
}

#[test]
fn text_table_aligns_columns_and_puts_notes_below() {
    let mut v = view();
    v.leases
        .insert(v.cp_lease.clone(), record("node-a", 1, 3700, 2));
    v.services.push((
        lb_service(
            "apps",
            "web",
            &[("kube-vip.io/loadbalancerIPs", "192.0.2.20")],
        ),
        vec![],
    ));
    v.leases
        .insert(lref("apps", "kubevip-web"), record("node-b", 2, 30, 0));
    v.services.push((
        lb_service(
            "apps",
            "x",
            &[("kube-vip.io/loadbalancerIPs", "192.0.2.21")],
        ),
        vec!["192.0.2.21".into()],
    ));
    v.leases
        .insert(lref("apps", "kubevip-x"), record("node-c", 9, 30, 0));
    let out = render_text(&vip_statuses(&v, ts(NOW)), &["events: forbidden".into()]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("KIND"), "{out}");
    let col = lines[0].find("HOLDER").unwrap();
    assert_eq!(&lines[1][col..col + 6], "node-a", "{out}");
    assert!(
        lines[1].contains("1s ago") && lines[1].contains("1h1m"),
        "{out}"
    );
    assert!(
        lines[2].contains("apps/web") && lines[2].contains("2s ago"),
        "{out}"
    );
    assert!(
        lines[3].starts_with("    status.loadBalancer.ingress shows []"),
        "{out}"
    );
    assert!(
        lines[4].contains("apps/x") && lines[4].contains("expired (9s ago)"),
        "{out}"
    );
    assert_eq!(lines.last(), Some(&"note: events: forbidden"));
    assert!(render_text(&[], &[]).contains("no vipd lease"));
}

#[test]
fn lease_refs_are_checked_and_ages_are_short() {
    assert_eq!(
        parse_lease_ref("cp-lease", "kube-system/plndr-cp-lock").unwrap(),
        lref("kube-system", "plndr-cp-lock")
    );
    for bad in ["plndr-cp-lock", "a/b/c", "Kube/x", "/x", "x/"] {
        let e = parse_lease_ref("cp-lease", bad).unwrap_err().to_string();
        assert!(e.starts_with("--cp-lease") && e.contains(bad), "{bad}: {e}");
    }
    assert_eq!(age(-3), "0s");
    assert_eq!(age(59), "59s");
    assert_eq!(age(61), "1m1s");
    assert_eq!(age(7322), "2h2m");
    assert_eq!(age(90_000), "1d1h");
}

/// The pools section: figures as the allocator counts them, malformed keys named, the
/// allocator from its Lease.
#[test]
fn pools_with_their_figures_and_the_allocator() {
    let mut v = view();
    v.ipam_configmap = lref("kube-system", "kubevip");
    v.pools = Some(
        [
            ("cidr-global".to_string(), "192.0.2.20/30".to_string()),
            ("range-shop".to_string(), "192.0.2.40-192.0.2.3".to_string()),
        ]
        .into(),
    );
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "default", "name": "web",
                     "annotations": {"kube-vip.io/loadbalancerIPs": "192.0.2.21"}},
        "spec": {"type": "LoadBalancer"},
    }))
    .unwrap();
    v.ipam_views = vec![crate::ipam::view::view_of(&svc, false, "x")];
    // A Node's own address in the pool counts as used, as the allocator counts it.
    v.node_addresses = vec![("node-a".into(), "192.0.2.22".parse().unwrap())];
    v.leases.insert(
        lref("kube-system", crate::ipam::LEASE_NAME),
        record("node-b", 1, 100, 0),
    );
    let (rows, allocator) = pool_statuses(&v, ts(NOW));
    assert_eq!(allocator.as_deref(), Some("node-b"));
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (
            rows[0].pool.as_str(),
            rows[0].total.as_str(),
            rows[0].used.as_str(),
            rows[0].free.as_str()
        ),
        ("cidr-global", "4", "2", "2")
    );
    assert_eq!(rows[1].pool, "range-shop");
    assert!(
        rows[1]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("192.0.2.40-192.0.2.3")),
        "{rows:?}"
    );
    let text = render_pools(&rows, allocator.as_deref(), &v.ipam_configmap);
    assert!(
        text.contains("POOLS (ConfigMap kube-system/kubevip)"),
        "{text}"
    );
    assert!(text.contains("allocator: node-b"), "{text}");
    // No ConfigMap: no section.
    v.pools = None;
    assert_eq!(pool_statuses(&v, ts(NOW)), (Vec::new(), None));
    assert_eq!(render_pools(&[], None, &v.ipam_configmap), "");
}

/// Issue 26 (second trial): under one lease for all, a Local Service's row names its own
/// lease `vipd-local.<namespace>.<name>` and that lease's holder, not the global holder.
#[test]
fn a_local_service_under_one_lease_for_all_shows_its_own_lease() {
    let mut v = view();
    let mut local = lb_service(
        "apps",
        "web",
        &[("kube-vip.io/loadbalancerIPs", "192.0.2.20")],
    );
    local.etp_local = true;
    v.services.push((local, vec!["192.0.2.20".into()]));
    v.leases
        .insert(v.svc_lease.clone(), record("node-a", 2, 100, 0));
    v.leases.insert(
        lref("kube-system", "vipd-local.apps.web"),
        record("node-c", 0, 10, 0),
    );
    let rows = vip_statuses(&v, ts(NOW));
    assert_eq!(rows[0].lease, "kube-system/vipd-local.apps.web");
    assert_eq!(rows[0].holder.as_deref(), Some("node-c"));
}

/// Issue 27: a held Service lease without the ride-through marker (its holder has no peer
/// key, runs with svc_ridethrough=false, or is not vipd) gets a note and
/// `ride_through: false`; a marked one no note and `true`; the control plane `None`.
#[test]
fn a_holder_that_does_not_ride_through_is_noted() {
    let mut v = view();
    let web = lb_service(
        "apps",
        "web",
        &[("kube-vip.io/loadbalancerIPs", "192.0.2.20")],
    );
    v.services.push((web, vec!["192.0.2.20".into()]));
    let mut rec = record("node-b", 0, 10, 1);
    rec.ride_through = None;
    v.leases.insert(lref("apps", "kubevip-web"), rec);
    let rows = vip_statuses(&v, ts(NOW));
    let web = rows.iter().find(|r| r.name == "apps/web").expect("row");
    assert_eq!(web.ride_through, Some(false));
    assert!(
        web.notes
            .iter()
            .any(|n| n.contains("does not ride through") && n.contains("vipd-peer-key")),
        "{:?}",
        web.notes
    );
    v.leases
        .insert(lref("apps", "kubevip-web"), record("node-b", 0, 10, 1));
    let rows = vip_statuses(&v, ts(NOW));
    let web = rows.iter().find(|r| r.name == "apps/web").expect("row");
    assert_eq!(web.ride_through, Some(true));
    assert!(
        !web.notes.iter().any(|n| n.contains("ride")),
        "{:?}",
        web.notes
    );
}

/// Issue 28: under shard leases a Service's row names its shard (found from the shard
/// Leases present, placed by its UID as vipd places it) and that shard's holder; an ETP
/// Local Service's row its own `vipd-local.` lease.
#[test]
fn services_under_shard_leases_show_their_shard_and_its_holder() {
    let mut v = view();
    let mut web = lb_service(
        "apps",
        "web",
        &[("kube-vip.io/loadbalancerIPs", "192.0.2.20")],
    );
    web.uid = Some("0c6f-web".into());
    let mut local = lb_service(
        "apps",
        "local",
        &[("kube-vip.io/loadbalancerIPs", "192.0.2.21")],
    );
    local.uid = Some("0c6f-local".into());
    local.etp_local = true;
    v.services.push((web, vec!["192.0.2.20".into()]));
    v.services.push((local, vec!["192.0.2.21".into()]));
    let shards = crate::services::plan::desired::Shards {
        namespace: "kube-system".into(),
        count: 3,
    };
    for (i, holder) in ["node-a", "node-b", "node-c"].iter().enumerate() {
        let i = u16::try_from(i).unwrap();
        v.leases.insert(shards.lease(i), record(holder, 0, 10, 0));
    }
    v.leases.insert(
        lref("kube-system", "vipd-local.apps.local"),
        record("node-c", 0, 10, 0),
    );
    v.shards = shards_in(v.leases.keys());
    assert_eq!(v.shards.as_ref(), Some(&shards));
    let rows = vip_statuses(&v, ts(NOW));
    let web = rows.iter().find(|r| r.name == "apps/web").unwrap();
    let i = shards.index_of("0c6f-web");
    assert_eq!(web.lease, format!("kube-system/vipd-services-shard-{i}"));
    assert_eq!(
        web.holder.as_deref(),
        Some(["node-a", "node-b", "node-c"][usize::from(i)])
    );
    let local = rows.iter().find(|r| r.name == "apps/local").unwrap();
    assert_eq!(local.lease, "kube-system/vipd-local.apps.local");
    // No shard Leases: no shards.
    assert_eq!(shards_in([lref("apps", "kubevip-web")].iter()), None);
}
