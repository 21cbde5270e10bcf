//! DHCP clients of a group, through the [`crate::dhcp::Dhcp`] seam with
//! [`crate::dhcp::FakeDhcp`], on tokio's paused clock.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use tokio::time::Instant;

use super::*;
use crate::dhcp::{FakeDhcp, FakeEnd};
use crate::services::plan::model::{self, PortProto};

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default", name)
}

/// A DHCP Service `name` (UID `uid<name>`) with `annotations`, as cached.
pub(crate) fn service(name: &str, annotations: &[(&str, &str)]) -> Service {
    let mut svc = Service::default();
    svc.metadata.name = Some(name.into());
    svc.metadata.namespace = Some("default".into());
    svc.metadata.uid = Some(format!("uid{name}"));
    let mut ann: BTreeMap<String, String> =
        [(model::ANN_LOADBALANCER_IPS.to_string(), "0.0.0.0".into())].into();
    for (k, v) in annotations {
        ann.insert(k.to_string(), v.to_string());
    }
    svc.metadata.annotations = Some(ann);
    svc.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
        type_: Some("LoadBalancer".into()),
        ..Default::default()
    });
    svc
}

/// The group's view of `svc` (as the plan makes it).
pub(crate) fn dhcp_service(svc: &Service) -> DhcpService {
    let info = model::service_info(svc);
    DhcpService {
        key: info.key.clone(),
        request: model::dhcp_request(&info).unwrap(),
    }
}

/// A group spec with the DHCP Service `s` and no fixed address.
fn spec(s: &[DhcpService]) -> GroupSpec {
    GroupSpec {
        vips: Vec::new(),
        services: s
            .iter()
            .map(|d| {
                (
                    d.key.clone(),
                    Vec::new(),
                    vec![PortProto {
                        port: 80,
                        protocol: "TCP".into(),
                    }],
                )
            })
            .collect(),
        preferred: Vec::new(),
        dhcp: s.to_vec(),
        dhcp_unserved: Vec::new(),
    }
}

fn binding(addr: &str, lease: Duration) -> DhcpBinding {
    let now = Instant::now();
    DhcpBinding {
        addr: addr.parse().unwrap(),
        prefix_len: 24,
        server: "192.0.2.1".parse().unwrap(),
        expires: now + lease,
        t1: now + lease / 2,
        t2: now + lease * 7 / 8,
    }
}

/// Lets the fake clients' tasks run.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// Waits (paused clock) for the next state change and reads it.
async fn next(clients: &mut DhcpClients) -> Vec<DhcpEvent> {
    tokio::time::timeout(Duration::from_secs(1), clients.changed())
        .await
        .expect("a state change");
    clients.observe()
}

#[tokio::test(start_paused = true)]
async fn bound_address_is_a_vip_on_the_macvlan_until_the_lease_expires_and_goes_when_lost() {
    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let web = dhcp_service(&service("web", &[]));
    let base = spec(std::slice::from_ref(&web));
    assert!(clients.follow(&base.dhcp, Some("eth0")).await.is_empty());
    let started = fake.started();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].macvlan, "vip-uidweb");
    assert_eq!(started[0].parent, "eth0");
    assert_eq!(started[0].mac, web.request.mac);
    assert_eq!(started[0].mark, "vipd:uidweb");
    // Requesting: nothing to hold.
    assert_eq!(clients.effective(&base), base);

    let b = binding("192.0.2.201", Duration::from_secs(120));
    assert!(fake.set_state("vip-uidweb", DhcpState::Bound(b.clone())));
    assert!(next(&mut clients).await.is_empty());
    let eff = clients.effective(&base);
    assert_eq!(
        eff.vips,
        vec![VipSpec {
            vip: Vip {
                addr: "192.0.2.201".parse().unwrap(),
                prefix: 32
            },
            interface: Some("vip-uidweb".into()),
            not_after: Some(b.expires),
        }]
    );
    assert_eq!(eff.services[0].1, vec![IpAddr::from([192, 0, 2, 201])]);
    // Next to a fixed address, the leased one comes first (Harvester reads ingress[0].ip).
    let mut with_fixed = base.clone();
    with_fixed.services[0].1 = vec![IpAddr::from([192, 0, 2, 50])];
    assert_eq!(
        clients.effective(&with_fixed).services[0].1,
        vec![
            IpAddr::from([192, 0, 2, 201]),
            IpAddr::from([192, 0, 2, 50])
        ]
    );

    // Renewing still holds it, with the new expiry.
    let renewed = binding("192.0.2.201", Duration::from_secs(120));
    fake.set_state("vip-uidweb", DhcpState::Renewing(renewed.clone()));
    assert!(next(&mut clients).await.is_empty());
    assert_eq!(
        clients.effective(&base).vips[0].not_after,
        Some(renewed.expires)
    );
    a_lost_lease_and_each_failed_attempt_warn_once(&fake, &mut clients, &base).await;
    clients.stop_all(false).await;
    settle().await;
    assert_eq!(fake.ended("vip-uidweb"), Some(FakeEnd::Stopped));
}

/// Second half of the test above: a lost lease is removed at once with one Warning (the
/// same state read again is not news); each failed attempt warns once; bound again, the
/// Service is served.
async fn a_lost_lease_and_each_failed_attempt_warn_once(
    fake: &FakeDhcp,
    clients: &mut DhcpClients,
    base: &GroupSpec,
) {
    // Lost: removed at once, and a Warning says why.
    fake.set_state(
        "vip-uidweb",
        DhcpState::Lost {
            reason: "DHCPNAK from 192.0.2.1".into(),
        },
    );
    let events = next(clients).await;
    // Nothing held, and the Service counts as announced nowhere (its status is cleared).
    let lost = GroupSpec {
        dhcp_unserved: vec![key("web")],
        ..base.clone()
    };
    assert_eq!(clients.effective(base), lost);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, key("web"));
    assert_eq!(events[0].1, "DHCPLeaseLost");
    assert!(
        events[0].2.contains("vip-uidweb") && events[0].2.contains("DHCPNAK from 192.0.2.1"),
        "{}",
        events[0].2
    );
    // The same state read again is not news.
    fake.set_state(
        "vip-uidweb",
        DhcpState::Lost {
            reason: "DHCPNAK from 192.0.2.1".into(),
        },
    );
    assert!(next(clients).await.is_empty());

    // Each failed attempt: one Warning.
    for attempt in 1..=2 {
        fake.set_state(
            "vip-uidweb",
            DhcpState::Requesting {
                attempt,
                last_error: Some("no DHCPOFFER within 4 s".into()),
            },
        );
        let events = next(clients).await;
        assert_eq!(events.len(), 1, "attempt {attempt}: {events:?}");
        assert_eq!(events[0].1, "DHCPFailed");
        assert!(events[0].2.contains("no DHCPOFFER"), "{}", events[0].2);
        assert_eq!(clients.effective(base).dhcp_unserved, vec![key("web")]);
    }
    // Bound again: served.
    fake.set_state(
        "vip-uidweb",
        DhcpState::Bound(binding("192.0.2.201", Duration::from_secs(120))),
    );
    next(clients).await;
    assert!(clients.effective(base).dhcp_unserved.is_empty());
}

#[tokio::test(start_paused = true)]
async fn leaving_services_release_changed_ones_restart_and_stopping_keeps_the_lease() {
    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let a = dhcp_service(&service("a", &[]));
    let b = dhcp_service(&service("b", &[]));
    clients.follow(&[a.clone(), b.clone()], Some("eth0")).await;
    assert_eq!(clients.macvlans(), ["vip-uida", "vip-uidb"]);
    // The holder's own write-back (hwaddr, requestedIP) changes the request, not the
    // client: no restart.
    let a_written = dhcp_service(&service(
        "a",
        &[
            (model::ANN_HWADDR, &fmt_mac(a.request.mac)),
            (model::ANN_REQUESTED_IP, "192.0.2.201"),
        ],
    ));
    assert!(a_written.request.same_client(&a.request));
    clients
        .follow(&[a_written.clone(), b.clone()], Some("eth0"))
        .await;
    assert_eq!(fake.started().len(), 2, "no restart");
    // b deleted (or no longer DHCP): DHCPRELEASE.
    clients
        .follow(std::slice::from_ref(&a_written), Some("eth0"))
        .await;
    settle().await;
    assert_eq!(fake.ended("vip-uidb"), Some(FakeEnd::Released));
    assert_eq!(fake.ended("vip-uida"), None);
    // a's macvlan renamed: the old client stops without release, a new one starts.
    let renamed = dhcp_service(&service("a", &[(model::ANN_MACVLAN_NAME, "lb-a")]));
    clients
        .follow(std::slice::from_ref(&renamed), Some("eth0"))
        .await;
    settle().await;
    assert_eq!(fake.ended("vip-uida"), Some(FakeEnd::Stopped));
    assert_eq!(fake.running(), ["lb-a"]);
    // a's MAC changed (kube-vip.io/hwaddr edited): to the server that is another client,
    // so the old MAC's lease is released before the new client starts (trial finding F4).
    let new_mac = dhcp_service(&service(
        "a",
        &[
            (model::ANN_MACVLAN_NAME, "lb-a"),
            (model::ANN_HWADDR, "02:00:5e:10:00:01"),
        ],
    ));
    clients
        .follow(std::slice::from_ref(&new_mac), Some("eth0"))
        .await;
    settle().await;
    assert_eq!(fake.ended_mac(renamed.request.mac), Some(FakeEnd::Released));
    assert_eq!(fake.running(), ["lb-a"]);
    assert_eq!(
        fake.started().last().map(|s| s.mac),
        Some(new_mac.request.mac)
    );
    let renamed = new_mac;
    // Leadership lost or shutdown: stopped, no release.
    clients.stop_all(false).await;
    settle().await;
    assert_eq!(fake.ended("lb-a"), Some(FakeEnd::Stopped));
    // The group's Services gone: released.
    clients
        .follow(std::slice::from_ref(&renamed), Some("eth0"))
        .await;
    clients.stop_all(true).await;
    settle().await;
    assert_eq!(fake.ended("lb-a"), Some(FakeEnd::Released));
    assert!(fake.running().is_empty());
}

#[tokio::test(start_paused = true)]
async fn failover_keeps_the_mac_and_asks_for_the_leased_address_again() {
    // Node A leads: generated MAC, then bound.
    let fake_a = FakeDhcp::new();
    let mut node_a = DhcpClients::new(Arc::new(fake_a.clone()));
    let fresh = service("web", &[]);
    let web = dhcp_service(&fresh);
    node_a
        .follow(std::slice::from_ref(&web), Some("eth0"))
        .await;
    let cached = Arc::new(fresh.clone());
    // Before any lease: the generated MAC is written back at once.
    let writes = node_a.annotations(|_| Some(cached.clone()));
    assert_eq!(
        writes,
        vec![(key("web"), vec![(ANN_HWADDR, fmt_mac(web.request.mac))])]
    );
    fake_a.set_state(
        "vip-uidweb",
        DhcpState::Bound(binding("192.0.2.207", Duration::from_secs(120))),
    );
    next(&mut node_a).await;
    let writes = node_a.annotations(|_| Some(cached.clone()));
    assert_eq!(
        writes[0].1,
        vec![
            (ANN_HWADDR, fmt_mac(web.request.mac)),
            (ANN_REQUESTED_IP, "192.0.2.207".to_string())
        ]
    );
    // The Service as written back: nothing more to write.
    let mut written = fresh.clone();
    let ann = written.metadata.annotations.as_mut().unwrap();
    for (k, v) in &writes[0].1 {
        ann.insert(k.to_string(), v.clone());
    }
    let written = Arc::new(written);
    assert!(node_a.annotations(|_| Some(written.clone())).is_empty());
    // The same MAC in upper case (a user's or GitOps's spelling) is left as written.
    let mut upper = (*written).clone();
    upper
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANN_HWADDR.into(), fmt_mac(web.request.mac).to_uppercase());
    let upper = Arc::new(upper);
    assert!(node_a.annotations(|_| Some(upper.clone())).is_empty());
    // Node A goes away without release; node B takes over from the written Service.
    node_a.stop_all(false).await;
    let fake_b = FakeDhcp::new();
    let mut node_b = DhcpClients::new(Arc::new(fake_b.clone()));
    node_b.follow(&[dhcp_service(&written)], Some("eth1")).await;
    let spec_b = &fake_b.started()[0];
    assert_eq!(spec_b.mac, web.request.mac, "same MAC");
    assert_eq!(spec_b.macvlan, "vip-uidweb");
    assert_eq!(spec_b.requested, Some("192.0.2.207".parse().unwrap()));
    assert_eq!(spec_b.parent, "eth1");
    settle().await;
    assert_eq!(fake_a.ended("vip-uidweb"), Some(FakeEnd::Stopped));
}

#[tokio::test(start_paused = true)]
async fn services_without_a_parent_or_sharing_a_macvlan_get_a_warning_and_others_run() {
    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let a = dhcp_service(&service("a", &[(model::ANN_MACVLAN_NAME, "lb-shared")]));
    let b = dhcp_service(&service("b", &[(model::ANN_MACVLAN_NAME, "lb-shared")]));
    let c = dhcp_service(&service("c", &[("kube-vip.io/serviceInterface", "eth1")]));
    let events = clients.follow(&[a, b, c], None).await;
    // a: no parent at all; b: a's macvlan name is free (a did not start), but no parent
    // either; c has its own parent.
    assert_eq!(fake.running(), ["vip-uidc"]);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events
            .iter()
            .all(|e| e.1 == "DHCPFailed" && e.2.contains("parent interface"))
    );
    let a = dhcp_service(&service("a", &[(model::ANN_MACVLAN_NAME, "lb-shared")]));
    let b = dhcp_service(&service("b", &[(model::ANN_MACVLAN_NAME, "lb-shared")]));
    let events = clients.follow(&[a, b], Some("eth0")).await;
    assert_eq!(fake.running(), ["lb-shared"]);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, key("b"));
    assert!(events[0].2.contains("lb-shared") && events[0].2.contains("default/a"));
}

/// Through both seams: the fake DHCP client binds, the group's VIP set
/// ([`DhcpClients::effective`]) goes to a real [`crate::holder::VipHolder`] on a fake
/// kernel: the leased address is added on the macvlan (announced from its MAC) with a
/// lifetime that never reaches past the lease's expiry, and removed at once when the lease
/// is lost.
#[tokio::test(start_paused = true)]
async fn the_holder_adds_the_leased_address_on_the_macvlan_within_the_lease_and_drops_it_when_lost()
{
    use crate::holder::HolderConfig;
    use crate::holder::tests::{FakeKernel, lead, rig_from};
    use crate::lease::Timing;
    use tokio::sync::watch;

    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let web = dhcp_service(&service("web", &[]));
    let base = spec(std::slice::from_ref(&web));
    let kernel = FakeKernel::with_eth0();
    // The macvlan the real client creates before it binds.
    kernel.add_link("vip-uidweb", 7, web.request.mac);
    let timing = Timing {
        lease_duration: Duration::from_secs(5),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
    };
    let cfg = HolderConfig::from_timing(&timing, Duration::from_millis(3000), false).unwrap();
    let (vips_tx, vips_rx) = watch::channel(base.vips.clone());
    let (rig, _) = rig_from(kernel.clone(), base.vips.clone(), cfg, false, Some(vips_rx));
    let lead = || lead(&rig, 1, true);
    lead();
    clients.follow(&base.dhcp, Some("eth0")).await;
    settle().await;
    let vip = Vip {
        addr: "192.0.2.201".parse().unwrap(),
        prefix: 32,
    };
    // A lease of 3.5 s (shorter than any real one, to see the cut).
    let b = binding("192.0.2.201", Duration::from_millis(3500));
    fake.set_state("vip-uidweb", DhcpState::Bound(b.clone()));
    next(&mut clients).await;
    vips_tx.send_replace(clients.effective(&base).vips);
    settle().await;
    assert_eq!(kernel.where_is(vip), Some(7), "on the macvlan");
    assert!(
        rig.ann
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|(_, v, mac)| *v == vip && *mac == web.request.mac),
        "announced from the macvlan's MAC"
    );
    // Renewals every second: every lifetime ends by the DHCP expiry.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lead();
        settle().await;
    }
    let adds: Vec<u32> = kernel
        .0
        .lock()
        .unwrap()
        .adds
        .iter()
        .filter(|(v, _)| *v == vip)
        .map(|(_, l)| *l)
        .collect();
    assert!(!adds.is_empty());
    assert!(
        !kernel.has(vip),
        "gone before the DHCP lease expired: {adds:?}"
    );

    // Bound again, then lost: removed at once.
    let b = binding("192.0.2.201", Duration::from_secs(120));
    fake.set_state("vip-uidweb", DhcpState::Bound(b));
    next(&mut clients).await;
    vips_tx.send_replace(clients.effective(&base).vips);
    lead();
    settle().await;
    assert_eq!(kernel.where_is(vip), Some(7));
    fake.set_state(
        "vip-uidweb",
        DhcpState::Lost {
            reason: "lease of 192.0.2.201 expired".into(),
        },
    );
    next(&mut clients).await;
    vips_tx.send_replace(clients.effective(&base).vips);
    settle().await;
    assert!(!kernel.has(vip), "removed as soon as the lease is lost");
    rig.shutdown.cancel();
    let _ = rig.task.await;
    clients.stop_all(false).await;
}

#[tokio::test(start_paused = true)]
async fn an_address_another_host_answers_for_is_declined() {
    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let web = dhcp_service(&service("web", &[]));
    clients
        .follow(std::slice::from_ref(&web), Some("eth0"))
        .await;
    let leased: IpAddr = "192.0.2.203".parse().unwrap();
    // Not leased (yet): nothing to decline.
    assert_eq!(clients.decline(leased), None);
    fake.set_state(
        "vip-uidweb",
        DhcpState::Bound(binding("192.0.2.203", Duration::from_secs(120))),
    );
    next(&mut clients).await;
    assert_eq!(clients.decline("192.0.2.99".parse().unwrap()), None);
    assert_eq!(clients.decline(leased), Some(key("web")));
    settle().await;
    assert_eq!(
        fake.declined("vip-uidweb"),
        vec![std::net::IpAddr::from([192, 0, 2, 203])]
    );
    clients.stop_all(false).await;
}

/// Metric events count once each, from the states seen, even when the watch skipped a
/// short state (`Renewing`).
#[tokio::test(start_paused = true)]
async fn metric_updates_count_renewals_failures_and_losses_once() {
    use crate::dhcp::{DhcpBinding, DhcpState};
    let now = tokio::time::Instant::now();
    let bound = |secs: u64| {
        DhcpState::Bound(DhcpBinding {
            addr: "192.0.2.207".parse().unwrap(),
            prefix_len: 24,
            server: "192.0.2.3".parse().unwrap(),
            expires: now + std::time::Duration::from_secs(secs),
            t1: now,
            t2: now,
        })
    };
    let failing = |attempt| DhcpState::Requesting {
        attempt,
        last_error: Some("no DHCPOFFER".into()),
    };
    let mut seen = Seen::default();
    let mut all = Vec::new();
    for state in [
        failing(1),
        failing(1),
        failing(2),
        bound(120),
        bound(120),
        bound(180),
        DhcpState::Lost {
            reason: "DHCPNAK for 192.0.2.207 from 192.0.2.3".into(),
        },
        DhcpState::Lost {
            reason: "DHCPNAK for 192.0.2.207 from 192.0.2.3".into(),
        },
        bound(120),
    ] {
        let (next, events) = metric_updates(&seen, &state);
        all.extend(events);
        seen = next;
    }
    assert_eq!(all, vec!["failed", "failed", "renewed", "lost", "nak"]);
    assert_eq!(seen.state, "bound");
}

/// A `0.0.0.0,::` Service runs a DHCPv4 and a DHCPv6 client on its one macvlan: the /32 and
/// the /128 are VIPs there (IPv4 first in the status), `requestedIP` is written as `v4,v6`,
/// dropping `::` releases the DHCPv6 lease only, and a `::` Service alone runs DHCPv6 only.
#[tokio::test(start_paused = true)]
async fn dual_stack_runs_both_families_on_one_macvlan() {
    use crate::dhcp::DhcpFamily;
    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let both = service("web", &[(model::ANN_LOADBALANCER_IPS, "0.0.0.0,::")]);
    let web = dhcp_service(&both);
    let base = spec(std::slice::from_ref(&web));
    assert!(clients.follow(&base.dhcp, Some("eth0")).await.is_empty());
    let started = fake.started();
    assert_eq!(
        started.iter().map(|s| s.family).collect::<Vec<_>>(),
        [DhcpFamily::V4, DhcpFamily::V6]
    );
    assert!(started.iter().all(|s| s.macvlan == "vip-uidweb"));
    assert_eq!(clients.macvlans(), ["vip-uidweb"]);

    // Only the DHCPv6 lease so far: its /128, and requestedIP holds just it.
    let mut v6 = binding("192.0.2.1", Duration::from_secs(120));
    v6.addr = "2001:db8::1005".parse().unwrap();
    v6.prefix_len = 128;
    assert!(fake.set_family_state("vip-uidweb", DhcpFamily::V6, DhcpState::Bound(v6.clone())));
    next(&mut clients).await;
    let eff = clients.effective(&base);
    assert_eq!(eff.vips.len(), 1);
    assert_eq!(eff.vips[0].vip.prefix, 128);
    assert_eq!(eff.vips[0].interface.as_deref(), Some("vip-uidweb"));
    assert_eq!(eff.vips[0].not_after, Some(v6.expires));
    let cached = Arc::new(both.clone());
    let writes = clients.annotations(|_| Some(cached.clone()));
    assert!(
        writes[0]
            .1
            .contains(&(ANN_REQUESTED_IP, "2001:db8::1005".to_string())),
        "{writes:?}"
    );

    // Both leased: IPv4 first in the status and in requestedIP.
    let v4 = binding("192.0.2.207", Duration::from_secs(120));
    assert!(fake.set_family_state("vip-uidweb", DhcpFamily::V4, DhcpState::Bound(v4)));
    next(&mut clients).await;
    let eff = clients.effective(&base);
    assert_eq!(
        eff.services[0].1,
        vec![
            IpAddr::from([192, 0, 2, 207]),
            "2001:db8::1005".parse::<IpAddr>().unwrap()
        ]
    );
    assert_eq!(eff.vips.len(), 2);
    let writes = clients.annotations(|_| Some(cached.clone()));
    assert!(
        writes[0]
            .1
            .contains(&(ANN_REQUESTED_IP, "192.0.2.207,2001:db8::1005".to_string())),
        "{writes:?}"
    );
    // A conflict on the IPv6 address declines it through the DHCPv6 client.
    let leased6: IpAddr = "2001:db8::1005".parse().unwrap();
    assert_eq!(clients.decline(leased6), Some(key("web")));

    // `::` dropped: the DHCPv6 client releases, the DHCPv4 one keeps running.
    let v4_only_svc = service("web", &[(ANN_REQUESTED_IP, "192.0.2.207,2001:db8::1005")]);
    let v4_only = dhcp_service(&v4_only_svc);
    clients
        .follow(std::slice::from_ref(&v4_only), Some("eth0"))
        .await;
    settle().await;
    assert_eq!(
        fake.family_ended("vip-uidweb", DhcpFamily::V6),
        Some(FakeEnd::Released)
    );
    assert_eq!(fake.family_ended("vip-uidweb", DhcpFamily::V4), None);
    assert_eq!(fake.declined("vip-uidweb"), vec![leased6]);
    // requestedIP drops the IPv6 entry the Service no longer asks for (trial finding F9).
    let v4_cached = Arc::new(v4_only_svc.clone());
    let writes = clients.annotations(|_| Some(v4_cached.clone()));
    assert!(
        writes[0]
            .1
            .contains(&(ANN_REQUESTED_IP, "192.0.2.207".to_string())),
        "{writes:?}"
    );
    clients.stop_all(false).await;

    // `::` alone: DHCPv6 only.
    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let only6 = dhcp_service(&service("six", &[(model::ANN_LOADBALANCER_IPS, "::")]));
    clients.follow(&[only6], Some("eth0")).await;
    assert_eq!(
        fake.started().iter().map(|s| s.family).collect::<Vec<_>>(),
        [DhcpFamily::V6]
    );
    clients.stop_all(false).await;
}

/// A client that gave up (`dhcp_backoff_attempts`): one `DHCPGaveUp` Warning naming the
/// Service, the family, the count and the last error, shown as `gave_up` and counted as a
/// failed attempt; it is not restarted by the holder's own write-back, but is (from zero)
/// when the Service's request changes for its family, and when this node leads again.
#[tokio::test(start_paused = true)]
async fn a_client_that_gave_up_warns_once_and_starts_again_only_on_a_change() {
    use crate::dhcp::DhcpFamily;
    let fake = FakeDhcp::new();
    let metrics = crate::obs::metrics::Metrics::new("node-a");
    let mut clients = DhcpClients::new(Arc::new(fake.clone())).with_metrics(&metrics);
    let both = service("web", &[(model::ANN_LOADBALANCER_IPS, "0.0.0.0,::")]);
    let web = dhcp_service(&both);
    clients
        .follow(std::slice::from_ref(&web), Some("eth0"))
        .await;
    assert_eq!(fake.started().len(), 2);
    the_dhcpv6_client_gives_up_with_one_warning(&fake, &mut clients, &metrics).await;

    // The holder writes back the MAC and the DHCPv4 lease: no restart.
    let mut v4 = binding("192.0.2.201", Duration::from_secs(120));
    v4.prefix_len = 24;
    fake.set_family_state("vip-uidweb", DhcpFamily::V4, DhcpState::Bound(v4));
    next(&mut clients).await;
    let written = service(
        "web",
        &[
            (model::ANN_LOADBALANCER_IPS, "0.0.0.0,::"),
            (model::ANN_HWADDR, &fmt_mac(web.request.mac)),
            (model::ANN_REQUESTED_IP, "192.0.2.201"),
        ],
    );
    clients
        .follow(&[dhcp_service(&written)], Some("eth0"))
        .await;
    settle().await;
    assert_eq!(fake.started().len(), 2, "no restart");
    assert_eq!(fake.family_ended("vip-uidweb", DhcpFamily::V6), None);

    // The user asks for another IPv6 address: the DHCPv6 client starts again, the DHCPv4
    // one (bound, its request unchanged) keeps running.
    let asked = service(
        "web",
        &[
            (model::ANN_LOADBALANCER_IPS, "0.0.0.0,::"),
            (model::ANN_HWADDR, &fmt_mac(web.request.mac)),
            (model::ANN_REQUESTED_IP, "192.0.2.201,2001:db8::1005"),
        ],
    );
    clients.follow(&[dhcp_service(&asked)], Some("eth0")).await;
    settle().await;
    let started = fake.started();
    assert_eq!(started.len(), 3, "{started:?}");
    assert_eq!(started[2].family, DhcpFamily::V6);
    assert_eq!(
        started[2].requested_v6,
        Some("2001:db8::1005".parse().unwrap())
    );
    assert_eq!(fake.family_ended("vip-uidweb", DhcpFamily::V4), None);
    assert!(
        !metrics.encode().contains(r#"state="gave_up""#),
        "the new client's series start afresh"
    );

    // A DHCPv4 client that gave up is not restarted by an unchanged request either...
    fake.set_family_state(
        "vip-uidweb",
        DhcpFamily::V4,
        DhcpState::GaveUp {
            attempts: 1,
            last_error: "no DHCPOFFER".into(),
        },
    );
    next(&mut clients).await;
    clients.follow(&[dhcp_service(&asked)], Some("eth0")).await;
    assert_eq!(fake.started().len(), 3);
    // ...but is when this node loses and takes the lease again (a new holder).
    clients.stop_all(false).await;
    clients.follow(&[dhcp_service(&asked)], Some("eth0")).await;
    assert_eq!(fake.started().len(), 5);
}

/// First step of the test above: the DHCPv6 client gives up; one `DHCPGaveUp` Warning names
/// the Service, the family, the count and the last error; `gave_up` and one failed attempt
/// are exported; the same state read again is not news.
async fn the_dhcpv6_client_gives_up_with_one_warning(
    fake: &FakeDhcp,
    clients: &mut DhcpClients,
    metrics: &crate::obs::metrics::Metrics,
) {
    use crate::dhcp::DhcpFamily;
    let gave_up = DhcpState::GaveUp {
        attempts: 3,
        last_error: "no DHCPv6 Advertise from any server (4 Solicits over 11 s)".into(),
    };
    fake.set_family_state("vip-uidweb", DhcpFamily::V6, gave_up.clone());
    let events = next(clients).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let (service_key, reason, message) = &events[0];
    assert_eq!((service_key, *reason), (&key("web"), "DHCPGaveUp"));
    for part in [
        "DHCPv6",
        "default/web",
        "vip-uidweb",
        "3 failed attempt(s)",
        "no DHCPv6 Advertise from any server",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let text = metrics.encode();
    assert!(
        text.contains(r#"vipd_dhcp_state{service="default/web",family="v6",state="gave_up"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"vipd_dhcp_events_total{service="default/web",family="v6",event="failed"} 1"#
        ),
        "{text}"
    );
    // Read again: not news.
    fake.set_family_state("vip-uidweb", DhcpFamily::V6, gave_up.clone());
    assert!(next(clients).await.is_empty());
}

#[test]
fn metric_updates_show_gave_up_and_count_its_failure() {
    let failing = DhcpState::Requesting {
        attempt: 2,
        last_error: Some("no DHCPOFFER".into()),
    };
    let gave_up = DhcpState::GaveUp {
        attempts: 3,
        last_error: "no DHCPOFFER".into(),
    };
    let (seen, events) = metric_updates(&Seen::default(), &failing);
    assert_eq!(events, ["failed"]);
    let (seen, events) = metric_updates(&seen, &gave_up);
    assert_eq!((seen.state, events), ("gave_up", vec!["failed"]));
    let (_, events) = metric_updates(&seen, &gave_up);
    assert!(events.is_empty());
}

/// Trial finding F3: a Service sharing the leased address (Harvester's share-IP mode) gets
/// the `vipd.io/dhcp-lease` record naming it, once; the DHCP Service itself does not.
#[tokio::test(start_paused = true)]
async fn a_service_sharing_the_leased_address_gets_the_lease_record() {
    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let primary = dhcp_service(&service("primary", &[]));
    let mut base = spec(std::slice::from_ref(&primary));
    let sharer = key("sharer");
    let leased: IpAddr = "192.0.2.205".parse().unwrap();
    base.services
        .push((sharer.clone(), vec![leased], Vec::new()));
    clients.follow(&base.dhcp, Some("eth0")).await;
    let plain = Arc::new(service("sharer", &[]));
    // Not leased yet: nothing to record.
    assert!(
        clients
            .lease_marks(&clients.effective(&base), |_| Some(plain.clone()))
            .is_empty()
    );
    fake.set_state(
        "vip-uidprima",
        DhcpState::Bound(binding("192.0.2.205", Duration::from_secs(120))),
    );
    next(&mut clients).await;
    let eff = clients.effective(&base);
    let writes = clients.lease_marks(&eff, |_| Some(plain.clone()));
    assert_eq!(
        writes,
        vec![(sharer, vec![(ANN_DHCP_LEASE, "192.0.2.205".to_string())])]
    );
    // Written: nothing more.
    let recorded = Arc::new(service("sharer", &[(ANN_DHCP_LEASE, "192.0.2.205")]));
    assert!(
        clients
            .lease_marks(&eff, |_| Some(recorded.clone()))
            .is_empty()
    );
    clients.stop_all(false).await;
}

/// Issue 26, Harvester's keep-IP flow: a new DHCP Service with the old one's
/// `kube-vip.io/hwaddr` (and `kube-vip.io/requestedIP`), then the old one deleted. The old
/// client stops WITHOUT DHCPRELEASE, in the same group (one lease for all) and when its own
/// group stops (per-Service leases: the plan's other DHCP clients are `continued`): the
/// server still has the lease when the copy asks for it (a server with no record stays
/// silent, RFC 2131 §4.3.2), and a late DHCPRELEASE can never free the copy's lease. A
/// family the copy does not ask for is released.
#[tokio::test(start_paused = true)]
async fn a_gone_services_mac_taken_over_by_a_copy_keeps_its_lease() {
    let fake = FakeDhcp::new();
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let mac = "02:76:69:70:64:42";
    let copied = [
        (model::ANN_HWADDR, mac),
        (model::ANN_REQUESTED_IP, "192.0.2.213"),
    ];
    let old = dhcp_service(&service("old", &copied));
    let copy = dhcp_service(&service("copy", &copied));
    clients
        .follow(std::slice::from_ref(&old), Some("eth0"))
        .await;
    // One lease for all: the old one leaves the group's spec as the copy enters it.
    clients
        .follow(std::slice::from_ref(&copy), Some("eth0"))
        .await;
    settle().await;
    assert_eq!(fake.ended("vip-uidold"), Some(FakeEnd::Stopped));
    assert_eq!(fake.running(), ["vip-uidcopy"]);
    // Per-Service leases: the old group stops with its Services gone, the copy runs in
    // another group of the plan.
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let other = dhcp_service(&service("other", &[]));
    clients
        .follow(&[old.clone(), other.clone()], Some("eth0"))
        .await;
    let continued: BTreeSet<DhcpClientId> =
        [(copy.request.mac, crate::dhcp::DhcpFamily::V4)].into();
    clients.take_all(true, &continued).finish().await;
    settle().await;
    assert_eq!(fake.ended("vip-uidold"), Some(FakeEnd::Stopped));
    assert_eq!(fake.ended("vip-uidother"), Some(FakeEnd::Released));
    // A dual-stack old Service, the copy IPv4 only: its DHCPv6 lease is released.
    let mut clients = DhcpClients::new(Arc::new(fake.clone()));
    let both = dhcp_service(&service(
        "dual",
        &[
            (model::ANN_LOADBALANCER_IPS, "0.0.0.0,::"),
            (model::ANN_HWADDR, mac),
        ],
    ));
    clients
        .follow(std::slice::from_ref(&both), Some("eth0"))
        .await;
    let v4_copy = dhcp_service(&service("v4copy", &[(model::ANN_HWADDR, mac)]));
    clients
        .follow(std::slice::from_ref(&v4_copy), Some("eth0"))
        .await;
    settle().await;
    assert_eq!(
        fake.family_ended("vip-uiddual", crate::dhcp::DhcpFamily::V4),
        Some(FakeEnd::Stopped)
    );
    assert_eq!(
        fake.family_ended("vip-uiddual", crate::dhcp::DhcpFamily::V6),
        Some(FakeEnd::Released)
    );
}
