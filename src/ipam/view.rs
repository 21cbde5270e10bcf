//! The allocator's view of a Kubernetes Service ([`ServiceView`]), read from the object.

use k8s_openapi::api::core::v1::Service;

use super::inuse::{FamilyPolicy, PortUse, Protocol, ServiceView, lenient_ips};
use super::pool::Family;
use crate::kube::ObjectKey;
use crate::kube::service::{
    ANN_LOADBALANCER_IPS, ANN_REQUESTED_IP, LABEL_IMPLEMENTATION, serves_class,
};

/// The view of `svc`: its addresses wherever it shows them, its ports, families and
/// whether vipd serves it (`type: LoadBalancer` of a class vipd serves, by `lb_class_only`
/// and `lb_class_name`). Pure; never fails (unknown protocols are left out of the ports).
pub fn view_of(svc: &Service, lb_class_only: bool, lb_class_name: &str) -> ServiceView {
    let meta = &svc.metadata;
    let spec = svc.spec.as_ref();
    let annotations = meta.annotations.as_ref();
    let is_load_balancer = crate::kube::service::is_load_balancer(svc);
    let class = spec.and_then(|s| s.load_balancer_class.as_deref());
    let (label, value) = LABEL_IMPLEMENTATION;
    ServiceView {
        key: ObjectKey::new(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        ),
        uid: meta.uid.clone().unwrap_or_default(),
        created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        is_load_balancer,
        ours: is_load_balancer && serves_class(class, lb_class_only, lb_class_name),
        deleting: meta.deletion_timestamp.is_some(),
        labelled: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(label))
            .is_some_and(|v| v == value),
        annotation: annotations
            .and_then(|a| a.get(ANN_LOADBALANCER_IPS))
            .cloned(),
        spec_ip: spec.and_then(|s| s.load_balancer_ip.clone()),
        status_ips: svc
            .status
            .iter()
            .flat_map(|s| s.load_balancer.iter())
            .flat_map(|lb| lb.ingress.iter().flatten())
            .filter_map(|i| i.ip.as_deref())
            .flat_map(lenient_ips)
            .collect(),
        requested_ips: annotations
            .and_then(|a| a.get(ANN_REQUESTED_IP))
            .map(|v| lenient_ips(v))
            .unwrap_or_default(),
        ports: spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some(PortUse {
                    protocol: Protocol::from_k8s(p.protocol.as_deref())?,
                    port: u16::try_from(p.port).ok()?,
                })
            })
            .collect(),
        ip_families: spec
            .and_then(|s| s.ip_families.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|f| Family::from_k8s(f))
            .collect(),
        family_policy: FamilyPolicy::from_k8s(spec.and_then(|s| s.ip_family_policy.as_deref())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::service::DEFAULT_LB_CLASS_NAME;

    fn service(json: serde_json::Value) -> Service {
        serde_json::from_value(json).expect("a Service")
    }

    #[test]
    fn every_place_an_address_shows_is_read() {
        let svc = service(serde_json::json!({
            "metadata": {
                "namespace": "shop", "name": "web", "uid": "u1",
                "creationTimestamp": "2026-12-03T10:00:00Z",
                "labels": {"implementation": "kube-vip"},
                "annotations": {
                    "kube-vip.io/loadbalancerIPs": "192.0.2.10, 2001:db8::10",
                    "kube-vip.io/requestedIP": "192.0.2.11"
                }
            },
            "spec": {
                "type": "LoadBalancer",
                "loadBalancerIP": "192.0.2.12",
                "ports": [{"port": 53, "protocol": "UDP"}, {"port": 80}],
                "ipFamilies": ["IPv6", "IPv4"],
                "ipFamilyPolicy": "PreferDualStack"
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.13"}, {"hostname": "x"}]}}
        }));
        let v = view_of(&svc, false, DEFAULT_LB_CLASS_NAME);
        assert_eq!(v.key, ObjectKey::new("shop", "web"));
        assert_eq!(v.created, Some(1_796_292_000));
        assert!(v.is_load_balancer && v.ours && v.labelled && !v.deleting);
        assert_eq!(v.annotation.as_deref(), Some("192.0.2.10, 2001:db8::10"));
        assert_eq!(v.spec_ip.as_deref(), Some("192.0.2.12"));
        assert_eq!(
            v.status_ips,
            vec!["192.0.2.13".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(
            v.requested_ips,
            vec!["192.0.2.11".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(
            v.ports,
            vec![
                PortUse {
                    protocol: Protocol::Udp,
                    port: 53
                },
                PortUse {
                    protocol: Protocol::Tcp,
                    port: 80
                }
            ]
        );
        assert_eq!(v.ip_families, vec![Family::V6, Family::V4]);
        assert_eq!(v.family_policy, FamilyPolicy::PreferDualStack);
    }

    #[test]
    fn class_and_type_decide_whether_vipd_serves_it() {
        let with = |spec: serde_json::Value| {
            view_of(
                &service(
                    serde_json::json!({"metadata": {"namespace": "a", "name": "b"}, "spec": spec}),
                ),
                false,
                DEFAULT_LB_CLASS_NAME,
            )
        };
        assert!(with(serde_json::json!({"type": "LoadBalancer"})).ours);
        assert!(!with(serde_json::json!({"type": "ClusterIP"})).ours);
        assert!(
            !with(serde_json::json!({"type": "LoadBalancer", "loadBalancerClass": "metallb"})).ours
        );
        assert!(
            with(serde_json::json!({"type": "LoadBalancer", "loadBalancerClass": DEFAULT_LB_CLASS_NAME}))
                .ours
        );
    }
}
