//! Lab test of the Service status writer against the lab's real API server
//! (v1.20): `status.loadBalancer.ingress`, the `kube-vip.io/vipHost` annotation and
//! events.k8s.io/v1 Events, each written only when it changes.
//!
//! Run as root: `cargo test --test lab_services_status` (or `cargo xtask test`); skipped with
//! `VIPD_SKIP_LAB=1`.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use vipd::kube::events::REPORTING_CONTROLLER;
use vipd::services::plan::model::{ANN_LOADBALANCER_IPS, ANN_VIP_HOST, PortProto, ServiceKey};
use vipd::services::plan::reasons::REASON_ANNOUNCED;
use vipd::services::publish::{
    EventKind, KubeStatusWriter, ServiceEvent, StatusError, StatusWriter, WriteOutcome,
    desired_ingress,
};
use xtask::lab::LabOptions;

async fn admin_client(path: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("kubeconfig -> config");
    kube::Client::try_from(cfg).expect("client")
}

fn lb_service(name: &str, ips: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            annotations: Some(BTreeMap::from([(
                ANN_LOADBALANCER_IPS.to_string(),
                ips.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![
                ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    ..Default::default()
                },
                // v1.20 refuses two protocols on one LoadBalancer Service
                // (MixedProtocolLBService is off before 1.24).
                ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

fn ingress_ips(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .map(|i| i.iter().filter_map(|e| e.ip.clone()).collect())
        .unwrap_or_default()
}

fn rv(svc: &Service) -> String {
    svc.metadata.resource_version.clone().unwrap_or_default()
}

/// vipd's Events about `default/<name>` with `reason`.
async fn events_for(client: &kube::Client, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = api.list(&ListParams::default()).await.expect("list events");
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

#[test]
fn status_annotation_and_events_are_written_once() {
    let Some(lab) = support::lab(
        "status_annotation_and_events_are_written_once",
        LabOptions::default(),
    ) else {
        return;
    };
    let kubeconfig = lab.admin_kubeconfig();
    lab.in_netns("node-a", || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let client = admin_client(&kubeconfig).await;
            let services: Api<Service> = Api::namespaced(client.clone(), "default");
            let created = services
                .create(
                    &PostParams::default(),
                    &lb_service("web", "192.0.2.50,2001:db8::50"),
                )
                .await
                .expect("create Service");
            let uid = created.metadata.uid.clone().expect("uid");
            let key = ServiceKey::new("default", "web");
            let writer = KubeStatusWriter::new(client.clone(), "node-a");

            // --- status.loadBalancer.ingress ---
            let addrs: Vec<IpAddr> = vec![
                "192.0.2.50".parse().unwrap(),
                "2001:db8::50".parse().unwrap(),
            ];
            let ports = vec![
                PortProto {
                    port: 80,
                    protocol: "TCP".into(),
                },
                PortProto {
                    port: 443,
                    protocol: "TCP".into(),
                },
            ];
            let desired = desired_ingress(&addrs, &ports);
            let out = writer
                .set_ingress(&key, desired.clone())
                .await
                .expect("set_ingress");
            assert_eq!(out, WriteOutcome::Written);
            let after = services.get("web").await.unwrap();
            assert_eq!(ingress_ips(&after), ["192.0.2.50", "2001:db8::50"]);
            eprintln!(
                "server {} dropped ingress ports: {}",
                lab.server_version().unwrap_or_default(),
                writer.server_drops_ingress_ports()
            );
            if !writer.server_drops_ingress_ports() {
                let p = after
                    .status
                    .as_ref()
                    .unwrap()
                    .load_balancer
                    .as_ref()
                    .unwrap()
                    .ingress
                    .as_ref()
                    .unwrap()[0]
                    .ports
                    .clone()
                    .unwrap();
                assert_eq!((p[0].port, p[1].port), (80, 443));
            }
            // The identical write changes nothing on the server: resourceVersion unchanged
            // (the writer patches without reading first; its caller compares its cache, and
            // the API server writes nothing for a patch that changes nothing).
            writer
                .set_ingress(&key, desired.clone())
                .await
                .expect("set_ingress 2");
            assert_eq!(rv(&services.get("web").await.unwrap()), rv(&after));
            // A fresh writer (no learned state): the same, and it learns from its own write
            // whether the server drops the ports.
            let fresh = KubeStatusWriter::new(client.clone(), "node-b");
            fresh
                .set_ingress(&key, desired.clone())
                .await
                .expect("fresh set_ingress");
            assert_eq!(rv(&services.get("web").await.unwrap()), rv(&after));
            assert_eq!(
                fresh.server_drops_ingress_ports(),
                writer.server_drops_ingress_ports()
            );
            assert_eq!(fresh.compares_ports(), !fresh.server_drops_ingress_ports());
            // A changed address list is written, first configured address first.
            let moved = desired_ingress(&["192.0.2.51".parse().unwrap()], &ports);
            assert_eq!(
                writer.set_ingress(&key, moved).await.unwrap(),
                WriteOutcome::Written
            );
            assert_eq!(
                ingress_ips(&services.get("web").await.unwrap()),
                ["192.0.2.51"]
            );

            // --- kube-vip.io/vipHost ---
            assert_eq!(
                writer.set_vip_host(&key, "node-a").await.unwrap(),
                WriteOutcome::Written
            );
            let annotated = services.get("web").await.unwrap();
            let ann = annotated.metadata.annotations.clone().unwrap();
            assert_eq!(ann.get(ANN_VIP_HOST).map(String::as_str), Some("node-a"));
            assert_eq!(
                ann.get(ANN_LOADBALANCER_IPS).map(String::as_str),
                Some("192.0.2.50,2001:db8::50"),
                "other annotations stay"
            );
            writer.set_vip_host(&key, "node-a").await.unwrap();
            assert_eq!(
                rv(&services.get("web").await.unwrap()),
                rv(&annotated),
                "the same vipHost again changes nothing on the server"
            );

            // --- Events ---
            let announced = ServiceEvent::announced("node-a", &addrs, None);
            writer
                .event(&key, Some(&uid), &announced)
                .await
                .expect("event");
            let evs = events_for(&client, "web", REASON_ANNOUNCED).await;
            assert_eq!(evs.len(), 1, "{evs:?}");
            let ev = &evs[0];
            assert_eq!(ev.type_.as_deref(), Some(EventKind::Normal.as_str()));
            assert_eq!(
                ev.reporting_controller.as_deref(),
                Some(REPORTING_CONTROLLER)
            );
            assert_eq!(ev.reporting_instance.as_deref(), Some("node-a"));
            assert_eq!(ev.note.as_deref(), Some(announced.note.as_str()));
            let regarding = ev.regarding.as_ref().unwrap();
            assert_eq!(regarding.uid.as_deref(), Some(uid.as_str()));
            assert_eq!(regarding.kind.as_deref(), Some("Service"));
            // An identical repeat folds into the same Event's series.
            writer
                .event(&key, Some(&uid), &announced)
                .await
                .expect("repeat");
            let evs = events_for(&client, "web", REASON_ANNOUNCED).await;
            assert_eq!(evs.len(), 1, "{evs:?}");
            assert_eq!(evs[0].series.as_ref().map(|s| s.count), Some(2));
            // A different note is a new Event (and the uid is looked up when not given).
            let moved_ev = ServiceEvent::announced("node-b", &addrs, Some("node-a"));
            writer.event(&key, None, &moved_ev).await.expect("moved");
            let evs = events_for(&client, "web", REASON_ANNOUNCED).await;
            assert_eq!(evs.len(), 2, "{evs:?}");
            let new = evs
                .iter()
                .find(|e| e.note.as_deref() == Some(moved_ev.note.as_str()))
                .unwrap();
            assert_eq!(
                new.regarding.as_ref().unwrap().uid.as_deref(),
                Some(uid.as_str())
            );

            // An Event the API refuses is an error naming the Service and the operation.
            let bad = ServiceEvent::warning(&"R".repeat(200), "too long a reason".into());
            let err = writer.event(&key, Some(&uid), &bad).await.expect_err("422");
            let text = err.to_string();
            assert!(
                text.contains("default/web") && text.contains("create Event"),
                "{text}"
            );
            assert!(matches!(err, StatusError::Api { .. }), "{err:?}");
            assert_eq!(err.api_code(), Some(422), "{err:?}");

            // --- clear ---
            assert_eq!(writer.clear(&key).await.unwrap(), WriteOutcome::Written);
            let cleared = services.get("web").await.unwrap();
            assert!(ingress_ips(&cleared).is_empty(), "{:?}", cleared.status);
            let ann = cleared.metadata.annotations.clone().unwrap_or_default();
            assert!(!ann.contains_key(ANN_VIP_HOST), "{ann:?}");
            assert!(ann.contains_key(ANN_LOADBALANCER_IPS));
            assert_eq!(writer.clear(&key).await.unwrap(), WriteOutcome::Unchanged);
            assert_eq!(rv(&services.get("web").await.unwrap()), rv(&cleared));

            // --- a Service that does not exist ---
            let gone = ServiceKey::new("default", "no-such-service");
            assert_eq!(
                writer.set_ingress(&gone, desired.clone()).await.unwrap(),
                WriteOutcome::NotFound
            );
            assert_eq!(
                writer.set_vip_host(&gone, "node-a").await.unwrap(),
                WriteOutcome::NotFound
            );
            assert_eq!(writer.clear(&gone).await.unwrap(), WriteOutcome::NotFound);
            writer
                .event(&gone, None, &announced)
                .await
                .expect("event on a missing Service is a no-op");
            assert!(
                events_for(&client, "no-such-service", REASON_ANNOUNCED)
                    .await
                    .is_empty()
            );
        });
    })
    .unwrap();
}
