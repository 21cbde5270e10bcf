//! The words a `type: LoadBalancer` Service carries that more than one wing reads: kube-vip's
//! and kube-vip-cloud-provider's annotation and label names, and which `loadBalancerClass`
//! vipd serves. The Services wing announces by them; the IPAM wing allocates by them.

/// Default `lb_class_name` (kube-vip's and kube-vip-cloud-provider's class,
/// `kube-vip.io/kube-vip-class`).
pub const DEFAULT_LB_CLASS_NAME: &str = "kube-vip.io/kube-vip-class";

/// `kube-vip.io/loadbalancerIPs`: comma-separated IPv4/IPv6 addresses of a Service
/// (kube-vip `LoadbalancerIPAnnotation`). Wins over `spec.loadBalancerIP`.
pub const ANN_LOADBALANCER_IPS: &str = "kube-vip.io/loadbalancerIPs";
/// `kube-vip.io/ignore`: the value `"true"` (exactly) makes kube-vip and vipd skip the
/// Service (kube-vip `LoadbalancerIgnore`).
pub const ANN_IGNORE: &str = "kube-vip.io/ignore";
/// `kube-vip.io/serviceInterface`: interface to put this Service's addresses on
/// (kube-vip `ServiceInterface`); overrides `vip_servicesinterface`. Written by
/// kube-vip-cloud-provider from its `interface-<namespace>` / `interface-global` keys.
pub const ANN_SERVICE_INTERFACE: &str = "kube-vip.io/serviceInterface";
/// `kube-vip.io/requestedIP`: address last leased by DHCP, asked for again on restart
/// (kube-vip `RequestedIP`).
pub const ANN_REQUESTED_IP: &str = "kube-vip.io/requestedIP";
/// The label kube-vip-cloud-provider puts on every Service it handled
/// (`implementation=kube-vip`, its `ImplementationLabelKey` / `ImplementationLabelValue`).
pub const LABEL_IMPLEMENTATION: (&str, &str) = ("implementation", "kube-vip");
/// The finalizer Kubernetes' service controller (which runs kube-vip-cloud-provider) puts on
/// the `type: LoadBalancer` Services it handles, and removes once their load balancer is
/// gone (k8s.io/cloud-provider `servicehelper.LoadBalancerCleanupFinalizer`).
pub const FINALIZER_LB_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";

/// Whether vipd serves a Service of `class` (`spec.loadBalancerClass`; `None`: unset):
/// a class equal to `lb_class_name`, or no class unless `lb_class_only` (kube-vip's
/// `lb_class_only` / `lb_class_name`).
pub fn serves_class(class: Option<&str>, lb_class_only: bool, lb_class_name: &str) -> bool {
    match class {
        Some(c) => c == lb_class_name,
        None => !lb_class_only,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_served() {
        let name = DEFAULT_LB_CLASS_NAME;
        assert!(serves_class(None, false, name));
        assert!(!serves_class(None, true, name));
        assert!(serves_class(Some(name), true, name));
        assert!(serves_class(Some(name), false, name));
        assert!(!serves_class(Some("metallb.io/metallb"), false, name));
    }
}
