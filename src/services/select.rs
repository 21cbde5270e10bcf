//! Which Services are candidates for announcement, and what to tell the user about the
//! others (refused addresses, S20, S39): the planner's input. Pure apart from the node's
//! connected subnets, read from the kernel through [`ConnectedSubnets`].

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use tracing::debug;

use super::Settings;
use crate::net::Kernel;
use crate::services::plan::desired::{self, Candidate, NotHere};
use crate::services::plan::model::{self, DhcpRequest, Selection, ServiceInfo};
use crate::services::plan::notes::Note;

/// The node's connected subnets (its own addresses, not vipd's), with the name of their
/// interface, read from the kernel at most every [`ConnectedSubnets::REFRESH`].
#[derive(Default)]
pub(super) struct ConnectedSubnets {
    pub(super) read_at: Option<tokio::time::Instant>,
    pub(super) subnets: Vec<Connected>,
}

/// One address of the node: the subnet it connects, on which interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Connected {
    /// The node's address.
    pub(super) addr: IpAddr,
    /// Its prefix length.
    pub(super) prefix: u8,
    /// Its interface's name (empty when the name could not be read).
    pub(super) interface: String,
}

impl ConnectedSubnets {
    /// How old the list may get.
    pub(super) const REFRESH: Duration = Duration::from_secs(2);

    /// Reads the list again if it is due; whether it differs from the list before.
    pub(super) async fn changed<K: Kernel>(&mut self, kernel: &K) -> bool {
        let before = self.subnets.clone();
        self.get(kernel).await != before
    }

    /// Every address of the node that is not a VIP of vipd's. A failed read keeps the last
    /// list.
    pub(super) async fn get<K: Kernel>(&mut self, kernel: &K) -> Vec<Connected> {
        let now = tokio::time::Instant::now();
        if self
            .read_at
            .is_none_or(|t| now.duration_since(t) >= Self::REFRESH)
        {
            match kernel.addresses(None).await {
                Ok(addrs) => {
                    let mut names: BTreeMap<u32, String> = BTreeMap::new();
                    let mut out = Vec::new();
                    for a in addrs.iter().filter(|a| !a.ours) {
                        if let std::collections::btree_map::Entry::Vacant(e) =
                            names.entry(a.ifindex)
                        {
                            e.insert(match kernel.link_by_index(a.ifindex).await {
                                Ok(l) => l.name,
                                Err(_) => String::new(),
                            });
                        }
                        out.push(Connected {
                            addr: a.vip.addr,
                            prefix: a.vip.prefix,
                            interface: names.get(&a.ifindex).cloned().unwrap_or_default(),
                        });
                    }
                    self.subnets = out;
                    self.read_at = Some(now);
                }
                Err(e) => debug!(error = %e, "reading the node's addresses failed"),
            }
        }
        self.subnets.clone()
    }
}

/// What decides, per Service, whether this node may announce it (besides the node-wide
/// eligibility of [`crate::nodes::eligibility`]): its Node labels against the Service's
/// node selector, and its connected subnets against the Service's addresses.
#[derive(Debug, Clone, Default)]
pub(super) struct ThisNode {
    /// This node's Node labels (empty while it has no Node object).
    pub(super) labels: BTreeMap<String, String>,
    /// This node's addresses and their interfaces.
    pub(super) connected: Vec<Connected>,
    /// `vip_servicesinterface`, else `vip_interface` (`None`: chosen per VIP by route).
    pub(super) interface: Option<String>,
    /// `svc_subnet_check`: whether the subnet rule applies (false: only the selector).
    pub(super) subnet_check: bool,
}

impl ThisNode {
    /// Why this node may not announce a Service with `addresses` on `interface` (its
    /// `kube-vip.io/serviceInterface`, else the configured one) and node selector
    /// `selector`; `None`: it may. The selector is checked first, then every address must
    /// lie in a subnet connected to the node on that interface (any interface when none is
    /// named). Pure.
    pub(super) fn not_here(
        &self,
        addresses: &[IpAddr],
        interface: Option<&str>,
        selector: Option<&crate::nodes::selector::NodeSelector>,
    ) -> Option<NotHere> {
        if let Some(sel) = selector
            && !sel.matches(&self.labels)
        {
            return Some(NotHere {
                reason: "node-selector",
                message: format!(
                    "the node's labels do not match {}={:?}",
                    crate::nodes::selector::NODE_SELECTOR_ANNOTATION,
                    sel.text
                ),
            });
        }
        if !self.subnet_check {
            return None;
        }
        let interface = interface.or(self.interface.as_deref());
        let missing: Vec<String> = addresses
            .iter()
            .filter(|a| {
                !self.connected.iter().any(|c| {
                    interface.is_none_or(|i| i == c.interface)
                        && crate::net::in_subnet(**a, c.addr, c.prefix)
                })
            })
            .map(IpAddr::to_string)
            .collect();
        if missing.is_empty() {
            return None;
        }
        let message = match interface {
            Some(i) => format!(
                "no subnet on interface {i} of the node contains {}",
                missing.join(", ")
            ),
            None => format!(
                "no subnet connected to the node contains {}",
                missing.join(", ")
            ),
        };
        Some(NotHere {
            reason: "subnet",
            message,
        })
    }
}

/// Addresses vipd refuses for Services (besides nodes' own addresses): the control-plane
/// VIP (with `cp_enable`), and network / broadcast addresses of the VIP's prefix or of a
/// subnet connected to the node (S39).
#[derive(Debug, Clone)]
pub struct Unusable {
    /// Control-plane VIP addresses (empty without `cp_enable`).
    pub control_plane: Vec<IpAddr>,
    /// `vip_subnet`: the prefix a Service VIP is bound with.
    pub vip_subnet: crate::net::VipSubnet,
    /// The node's own addresses with their prefixes (its connected subnets).
    pub connected: Vec<(IpAddr, u8)>,
}

impl Unusable {
    /// Why `addr` is refused, as the Warning's (reason, message), or `None`.
    pub fn check(&self, addr: IpAddr) -> Option<(&'static str, String)> {
        if self.control_plane.contains(&addr) {
            return Some((
                crate::services::plan::reasons::REASON_CONTROL_PLANE_ADDRESS,
                format!(
                    "address {addr} is the control-plane VIP; refused (the control-plane lease \
                     governs it; give the Service another address)"
                ),
            ));
        }
        let (edge, prefix) = self.edge(addr)?;
        Some((
            crate::services::plan::reasons::REASON_UNUSABLE_ADDRESS,
            format!(
                "address {addr} is the {edge} of subnet {}/{prefix}; refused (hosts on the \
                 segment do not send unicast to it)",
                crate::net::network_of(addr, prefix)
            ),
        ))
    }

    /// The network / broadcast rule ([`crate::net::vip_subnet_edge`]) over the VIP prefix
    /// and the connected subnets.
    pub(super) fn edge(&self, addr: IpAddr) -> Option<(crate::net::SubnetEdge, u8)> {
        let prefix = desired::vip_prefix(&self.vip_subnet, &addr);
        crate::net::vip_subnet_edge(addr, prefix, &self.connected)
    }
}

/// Selected Services as planner input, plus what to report about the others. `local`:
/// Services with a ready endpoint on this node; `unusable`: addresses refused besides the
/// nodes' own (`node_addrs`); `here`: whether this node may announce each one
/// ([`ThisNode::not_here`], giving [`Candidate::not_here`]).
pub(super) fn candidates(
    cfg: &Settings,
    services: &[Arc<Service>],
    local: &HashSet<(String, String)>,
    node_addrs: &BTreeMap<IpAddr, String>,
    unusable: &Unusable,
    here: &ThisNode,
) -> (Vec<Candidate>, Vec<Note>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for svc in services {
        let info: ServiceInfo = model::service_info(svc);
        let mut n = Notes {
            info: &info,
            notes: &mut notes,
        };
        if !selected(cfg, &mut n) {
            continue;
        }
        // One Warning (and one log line) per Service, whatever the number of bad entries.
        if let Some(message) = info.addresses.rejection_message() {
            n.push(
                crate::services::plan::reasons::REASON_INVALID_ADDRESS,
                message,
                true,
            );
        }
        let dhcp = dhcp_of(&mut n);
        let addresses = usable_addresses(node_addrs, unusable, &mut n);
        if addresses.is_empty() && dhcp.is_none() {
            continue;
        }
        let local_endpoint = local.contains(&(info.key.namespace.clone(), info.key.name.clone()));
        let selector = info.node_selector.as_ref().and_then(|s| s.as_ref().ok());
        let not_here = here.not_here(&addresses, info.interface.as_deref(), selector);
        let preferred = preferred_nodes(&mut n);
        note_bad_lease_marks(&mut n);
        out.push(Candidate {
            not_here,
            preferred,
            key: info.key.clone(),
            created: info.created,
            addresses,
            ports: info.ports.clone(),
            etp_local: info.etp_local,
            local_endpoint,
            interface: info.interface.clone(),
            lease: info.own_lease(),
            dhcp,
            dhcp_lease_marks: info.dhcp_lease_marks.clone(),
            uid: info.uid.clone(),
            own_conditions: info.own_conditions(),
            lease_annotated: info.lease_name_from_annotation,
        });
    }
    (out, notes)
}

/// The notes about one Service, as [`candidates`] collects them.
struct Notes<'a> {
    info: &'a ServiceInfo,
    notes: &'a mut Vec<Note>,
}

impl Notes<'_> {
    /// Adds a note about the Service.
    fn push(&mut self, reason: &'static str, message: String, warn: bool) {
        self.notes.push(Note {
            key: self.info.key.clone(),
            uid: self.info.uid.clone(),
            reason,
            message,
            warn,
        });
    }
}

/// Whether the Service goes on to the address checks: selected, or skipped for no usable
/// address with rejected values (they get a note each). Notes why it is skipped.
fn selected(cfg: &Settings, n: &mut Notes<'_>) -> bool {
    let info = n.info;
    match model::selection(
        info,
        cfg.lb_class_only,
        &cfg.lb_class_name,
        cfg.services_namespace.as_deref(),
    ) {
        Selection::Announce => true,
        Selection::Skip(reason) => {
            // Only our own Services (of our class, LoadBalancer) get a word.
            if reason.warrants_warning() {
                n.push(
                    crate::services::plan::reasons::REASON_INVALID_CONFIG,
                    format!("not announced: {reason}"),
                    true,
                );
            } else if matches!(reason, model::SkipReason::NoAddress) {
                // Name the field and the rejected values, not just "no address".
                let message = match info.addresses.rejection_message() {
                    Some(rejected) => format!("not announced: no usable address; {rejected}"),
                    None => format!("not announced: {reason}"),
                };
                n.push(
                    crate::services::plan::reasons::REASON_NO_ADDRESS,
                    message,
                    false,
                );
            }
            matches!(reason, model::SkipReason::NoAddress) && info.addresses.has_problems()
        }
    }
}

/// The Service's DHCP request, when it asks for DHCP and may have one (notes why not).
fn dhcp_of(n: &mut Notes<'_>) -> Option<DhcpRequest> {
    let info = n.info;
    if info.addresses.dhcp {
        match model::dhcp_request(info) {
            Ok(request) => return Some(request),
            Err(bad) => {
                for b in bad {
                    n.push(
                        crate::services::plan::reasons::REASON_INVALID_CONFIG,
                        format!("DHCP client not started: {b}"),
                        true,
                    );
                }
            }
        }
    }
    None
}

/// The Service's addresses without nodes' own (`node_addrs`) and the `unusable` ones
/// (each refused one gets a note).
fn usable_addresses(
    node_addrs: &BTreeMap<IpAddr, String>,
    unusable: &Unusable,
    n: &mut Notes<'_>,
) -> Vec<IpAddr> {
    let info = n.info;
    let mut addresses = info.addresses.addresses.clone();
    addresses.retain(|a| {
        if let Some(node) = node_addrs.get(a) {
            n.push(
                crate::services::plan::reasons::REASON_ADDRESS_OF_NODE,
                format!(
                    "address {a} from {} is node {node}'s own address; refused (announcing it would take the node's traffic)",
                    info.addresses.source
                ),
                true,
            );
            return false;
        }
        if let Some((reason, why)) = unusable.check(*a) {
            n.push(
                reason,
                format!("{why}; from {}", info.addresses.source),
                true,
            );
            return false;
        }
        true
    });
    addresses
}

/// The Service's preferred nodes (none, with a note, when the annotation is invalid).
fn preferred_nodes(n: &mut Notes<'_>) -> Vec<String> {
    match &n.info.preferred_nodes {
        Some(Ok(nodes)) => nodes.clone(),
        Some(Err((value, error))) => {
            n.push(
                crate::services::plan::reasons::REASON_INVALID_CONFIG,
                format!(
                    "annotation {}={value:?} ignored: {error}",
                    crate::nodes::selector::PREFERRED_NODES_ANNOTATION
                ),
                true,
            );
            Vec::new()
        }
        None => Vec::new(),
    }
}

/// Notes the entries of the Service's DHCP lease record that are not IP addresses.
fn note_bad_lease_marks(n: &mut Notes<'_>) {
    let info = n.info;
    if !info.dhcp_lease_bad.is_empty() {
        n.push(
            crate::services::plan::reasons::REASON_INVALID_CONFIG,
            format!(
                "annotation {}: entries {:?} are not IP addresses and are ignored (vipd writes this record of the addresses a Service shares from a DHCP lease; fix or remove it)",
                model::ANN_DHCP_LEASE,
                info.dhcp_lease_bad
            ),
            true,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::plan::model;

    #[test]
    fn unusable_addresses_name_the_rule() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let u = Unusable {
            control_plane: vec![ip("192.0.2.10")],
            vip_subnet: crate::net::VipSubnet { v4: 32, v6: 128 },
            connected: vec![(ip("192.0.2.11"), 24), (ip("2001:db8::11"), 64)],
        };
        let (reason, msg) = u.check(ip("192.0.2.10")).unwrap();
        assert_eq!(reason, "ControlPlaneAddress");
        assert!(
            msg.contains("192.0.2.10") && msg.contains("control-plane VIP"),
            "{msg}"
        );
        let (reason, msg) = u.check(ip("192.0.2.255")).unwrap();
        assert_eq!(reason, "UnusableAddress");
        assert!(
            msg.contains("broadcast address of subnet 192.0.2.0/24"),
            "{msg}"
        );
        let (_, msg) = u.check(ip("192.0.2.0")).unwrap();
        assert!(
            msg.contains("network address of subnet 192.0.2.0/24"),
            "{msg}"
        );
        assert_eq!(u.check(ip("192.0.2.20")), None);
        assert_eq!(
            u.check(ip("198.51.100.255")),
            None,
            "no connected subnet holds it"
        );
        assert_eq!(u.check(ip("2001:db8::ffff")), None);
        assert!(u.check(ip("2001:db8::")).is_some());
        // The VIP's own prefix counts too (vip_subnet /28: .15 is its broadcast).
        let u = Unusable {
            control_plane: Vec::new(),
            vip_subnet: crate::net::VipSubnet { v4: 28, v6: 128 },
            connected: Vec::new(),
        };
        let (_, msg) = u.check(ip("198.51.100.15")).unwrap();
        assert!(msg.contains("198.51.100.0/28"), "{msg}");
    }

    fn connected(addr: &str, prefix: u8, interface: &str) -> Connected {
        Connected {
            addr: addr.parse().unwrap(),
            prefix,
            interface: interface.into(),
        }
    }

    /// `svc_subnet_check=false`: a VIP outside the node's subnets (a pool routed to the
    /// segment) may be announced; the node selector still applies.
    #[test]
    fn without_the_subnet_check_only_the_selector_decides() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut here = ThisNode {
            labels: [("zone".to_string(), "a".to_string())].into(),
            connected: vec![connected("192.0.2.11", 24, "eth0")],
            interface: None,
            subnet_check: true,
        };
        let routed = [ip("198.51.100.7")];
        assert_eq!(
            here.not_here(&routed, None, None).map(|n| n.reason),
            Some("subnet")
        );
        here.subnet_check = false;
        assert!(here.not_here(&routed, None, None).is_none());
        let sel = crate::nodes::selector::NodeSelector::parse("zone=b").unwrap();
        assert_eq!(
            here.not_here(&routed, None, Some(&sel)).map(|n| n.reason),
            Some("node-selector")
        );
    }

    #[test]
    fn not_here_checks_the_selector_then_every_address_on_the_chosen_interface() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut here = ThisNode {
            labels: [("zone".to_string(), "a".to_string())].into(),
            connected: vec![
                connected("192.0.2.11", 24, "eth0"),
                connected("2001:db8::11", 64, "eth1"),
            ],
            interface: None,
            subnet_check: true,
        };
        let v4 = [ip("192.0.2.20")];
        let dual = [ip("192.0.2.20"), ip("2001:db8::20")];
        assert_eq!(here.not_here(&v4, None, None), None);
        assert_eq!(here.not_here(&dual, None, None), None, "any interface");
        let why = here.not_here(&dual, Some("eth0"), None).unwrap();
        assert_eq!(why.reason, "subnet");
        assert_eq!(
            why.message,
            "no subnet on interface eth0 of the node contains 2001:db8::20"
        );
        here.interface = Some("eth1".into());
        let why = here.not_here(&v4, None, None).unwrap().message;
        assert!(why.contains("interface eth1"), "{why}");
        assert_eq!(
            here.not_here(&v4, Some("eth0"), None),
            None,
            "the Service's interface wins over the configured one"
        );
        here.interface = None;
        let why = here.not_here(&[ip("198.51.100.7")], None, None).unwrap();
        assert_eq!(
            why.message,
            "no subnet connected to the node contains 198.51.100.7"
        );
        let b = crate::nodes::selector::NodeSelector::parse("zone=b").unwrap();
        let a = crate::nodes::selector::NodeSelector::parse("zone in (a,c)").unwrap();
        assert_eq!(here.not_here(&v4, None, Some(&a)), None);
        let why = here.not_here(&v4, None, Some(&b)).unwrap();
        assert_eq!(why.reason, "node-selector");
        assert_eq!(
            why.message,
            "the node's labels do not match vipd.io/node-selector=\"zone=b\""
        );
    }

    /// The Services settings of node `node-a` with vipd's defaults (what
    /// `Config::services` gives for `svc_enable=true` alone), changed by `edit`.
    fn settings(edit: impl FnOnce(&mut Settings)) -> Settings {
        let mut s = Settings {
            kube: crate::kube::client::Settings::default(),
            node_name: "node-a".into(),
            interface: None,
            control_plane: false,
            addresses: Vec::new(),
            services_interface: None,
            vip_subnet: crate::net::VipSubnet { v4: 32, v6: 128 },
            arp_rate: Duration::from_secs(3),
            nft_fence: false,
            cp_namespace: "kube-system".into(),
            services_timing: crate::lease::Timing {
                lease_duration: Duration::from_secs(3),
                renew_deadline: Duration::from_secs(2),
                retry_period: Duration::from_secs(1),
            },
            services_election: false,
            services_unelected: false,
            services_lease_shards: 0,
            services_ipv6_loopback: false,
            services_ride_through: false,
            services_ride_through_set: false,
            services_lease_name: "plndr-svcs-lock".into(),
            services_namespace: None,
            services_subnet_check: true,
            service_security: false,
            services_health: crate::services::health::ServicesHealth {
                check: None,
                hold: Duration::from_secs(30),
            },
            services_failback: None,
            routing_table: None,
            lb_class_only: false,
            lb_class_name: crate::services::plan::model::DEFAULT_LB_CLASS_NAME.into(),
        };
        edit(&mut s);
        s
    }

    #[test]
    fn node_selector_mismatch_is_not_here_and_an_invalid_one_is_not_announced() {
        let cfg = settings(|s| {
            s.services_election = true;
            s.interface = Some("eth0".into());
        });
        let unusable = Unusable {
            control_plane: Vec::new(),
            vip_subnet: cfg.vip_subnet,
            connected: Vec::new(),
        };
        let here = ThisNode {
            labels: [("zone".to_string(), "a".to_string())].into(),
            connected: vec![connected("192.0.2.11", 24, "eth0")],
            interface: None,
            subnet_check: true,
        };
        let with_selector = |name: &str, ip: &str, sel: &str| {
            with_annotation(
                lb(name, ip),
                crate::nodes::selector::NODE_SELECTOR_ANNOTATION,
                sel,
            )
        };
        let services = [
            with_selector("a", "192.0.2.20", "zone=a"),
            with_selector("b", "192.0.2.21", "zone=b"),
            with_selector("bad", "192.0.2.22", "zone in (a"),
        ];
        let (cands, notes) = candidates(
            &cfg,
            &services,
            &HashSet::new(),
            &BTreeMap::new(),
            &unusable,
            &here,
        );
        let not_here: Vec<(&str, bool)> = cands
            .iter()
            .map(|c| (c.key.name.as_str(), c.not_here.is_some()))
            .collect();
        assert_eq!(not_here, [("a", false), ("b", true)], "bad is left out");
        let bad: Vec<&Note> = notes.iter().filter(|n| n.key.name == "bad").collect();
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].reason, "InvalidConfiguration");
        assert!(bad[0].warn);
        assert!(
            bad[0]
                .message
                .contains("vipd.io/node-selector=\"zone in (a\""),
            "{}",
            bad[0].message
        );
    }

    /// A LoadBalancer Service `name` with annotation `kube-vip.io/loadbalancerIPs` = `ips`.
    fn lb(name: &str, ips: &str) -> Arc<Service> {
        let mut svc = Service::default();
        svc.metadata.name = Some(name.into());
        svc.metadata.namespace = Some("default".into());
        svc.metadata.uid = Some(format!("uid-{name}"));
        svc.metadata.annotations =
            Some([(model::ANN_LOADBALANCER_IPS.to_string(), ips.to_string())].into());
        svc.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ..Default::default()
        });
        Arc::new(svc)
    }

    #[test]
    fn refused_addresses_are_noted_with_field_and_value() {
        let cfg = settings(|s| {
            s.control_plane = true;
            s.addresses = vec!["192.0.2.10".parse().unwrap()];
            s.interface = Some("eth0".into());
        });
        let unusable = Unusable {
            control_plane: cfg.addresses.clone(),
            vip_subnet: cfg.vip_subnet,
            connected: vec![("192.0.2.11".parse().unwrap(), 24)],
        };
        let services = [
            lb("bad", "192.0.2.300"),
            lb("cp", "192.0.2.10"),
            lb("bcast", "192.0.2.255,192.0.2.40"),
            lb("good", "192.0.2.41"),
        ];
        let here = ThisNode {
            connected: vec![connected("192.0.2.11", 24, "eth0")],
            subnet_check: true,
            ..Default::default()
        };
        let (cands, notes) = candidates(
            &cfg,
            &services,
            &HashSet::new(),
            &BTreeMap::new(),
            &unusable,
            &here,
        );
        let found = |svc: &str, reason: &str| -> Vec<String> {
            notes
                .iter()
                .filter(|n| n.key.name == svc && n.reason == reason)
                .map(|n| {
                    assert_eq!(n.uid.as_deref(), Some(format!("uid-{svc}").as_str()));
                    n.message.clone()
                })
                .collect()
        };
        // All entries rejected: the log line names the field and the value, not just
        // "no address".
        let m = found("bad", "NoAddress");
        assert_eq!(m.len(), 1);
        assert!(
            m[0].contains("kube-vip.io/loadbalancerIPs") && m[0].contains("\"192.0.2.300\""),
            "{m:?}"
        );
        assert_eq!(found("bad", "InvalidAddress").len(), 1);
        let m = found("cp", "ControlPlaneAddress");
        assert!(m.len() == 1 && m[0].contains("192.0.2.10"), "{m:?}");
        let m = found("bcast", "UnusableAddress");
        assert!(
            m.len() == 1 && m[0].contains("192.0.2.255") && m[0].contains("192.0.2.0/24"),
            "{m:?}"
        );
        let announced: Vec<(String, Vec<IpAddr>)> = cands
            .iter()
            .map(|c| (c.key.name.clone(), c.addresses.clone()))
            .collect();
        assert_eq!(
            announced,
            [
                ("bcast".to_string(), vec!["192.0.2.40".parse().unwrap()]),
                ("good".to_string(), vec!["192.0.2.41".parse().unwrap()]),
            ]
        );
        // The ids do not change with the resourceVersion (no repeat on every re-plan, e.g.
        // after vipd's own status writes).
        let bumped: Vec<Arc<Service>> = services
            .iter()
            .map(|s| {
                let mut s = (**s).clone();
                s.metadata.resource_version = Some("2".into());
                Arc::new(s)
            })
            .collect();
        let (_, again) = candidates(
            &cfg,
            &bumped,
            &HashSet::new(),
            &BTreeMap::new(),
            &unusable,
            &here,
        );
        let ids = |n: &[Note]| n.iter().map(Note::id).collect::<Vec<_>>();
        assert_eq!(ids(&notes), ids(&again));
    }

    /// Trial finding: entries of the `vipd.io/dhcp-lease` record that are not IP addresses
    /// were ignored silently; they are reported (InvalidConfiguration, naming them) and the
    /// valid ones still count.
    #[test]
    fn a_malformed_dhcp_lease_record_is_reported_and_its_valid_entries_kept() {
        let cfg = settings(|_| {});
        let unusable = Unusable {
            control_plane: Vec::new(),
            vip_subnet: cfg.vip_subnet,
            connected: vec![("192.0.2.11".parse().unwrap(), 24)],
        };
        let svc = with_annotation(
            lb("sharer", "192.0.2.54"),
            model::ANN_DHCP_LEASE,
            "192.0.2.54,,not-an-ip",
        );
        let (cands, notes) = candidates(
            &cfg,
            &[svc],
            &HashSet::new(),
            &BTreeMap::new(),
            &unusable,
            &ThisNode::default(),
        );
        let m: Vec<&Note> = notes
            .iter()
            .filter(|n| n.reason == crate::services::plan::reasons::REASON_INVALID_CONFIG)
            .collect();
        assert_eq!(m.len(), 1, "{notes:?}");
        assert!(
            m[0].message.contains("vipd.io/dhcp-lease")
                && m[0].message.contains("\"not-an-ip\"")
                && m[0].message.contains("\"\""),
            "{}",
            m[0].message
        );
        assert_eq!(
            cands[0].dhcp_lease_marks,
            vec!["192.0.2.54".parse::<IpAddr>().unwrap()]
        );
    }

    fn with_annotation(svc: Arc<Service>, name: &str, value: &str) -> Arc<Service> {
        let mut s = (*svc).clone();
        s.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(name.to_string(), value.to_string());
        Arc::new(s)
    }

    /// Issue 27: a Service with 2 000 malformed entries (and one good address) costs one
    /// Warning note, not one per entry; it keeps its good address and the other Services
    /// are untouched.
    #[test]
    fn a_thousand_bad_entries_cost_one_note() {
        let unusable = Unusable {
            control_plane: Vec::new(),
            vip_subnet: crate::net::VipSubnet { v4: 32, v6: 128 },
            connected: Vec::new(),
        };
        let bad: Vec<String> = (0..2000).map(|i| format!("10.0.{i}")).collect();
        let services = [
            lb("noisy", &format!("192.0.2.43,{}", bad.join(","))),
            lb("good", "192.0.2.41"),
        ];
        let here = ThisNode {
            connected: vec![connected("192.0.2.11", 24, "eth0")],
            subnet_check: true,
            ..Default::default()
        };
        let (cands, notes) = candidates(
            &settings(|_| {}),
            &services,
            &HashSet::new(),
            &BTreeMap::new(),
            &unusable,
            &here,
        );
        let names: Vec<&str> = cands.iter().map(|c| c.key.name.as_str()).collect();
        assert_eq!(names, ["noisy", "good"]);
        assert_eq!(
            cands[0].addresses,
            vec!["192.0.2.43".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!(notes[0].key.name, "noisy");
        assert_eq!(notes[0].reason, "InvalidAddress");
        assert!(
            notes[0]
                .message
                .contains("entries after the first 64 not read")
                && notes[0]
                    .message
                    .contains("entries past the first 4096 bytes not read"),
            "{}",
            notes[0].message
        );
    }

    /// Issue 13: a `0.0.0.0` or `::` Service is a candidate with its DHCP request and no
    /// address, with no option (as in kube-vip; issue 26); bad DHCP annotations and two
    /// DHCP requests of one family each get a Warning naming the value, and never stop the
    /// other Services.
    #[test]
    fn dhcp_services_are_candidates_and_bad_input_is_noted() {
        let unusable = Unusable {
            control_plane: Vec::new(),
            vip_subnet: crate::net::VipSubnet { v4: 32, v6: 128 },
            connected: Vec::new(),
        };
        let services = [
            lb("dhcp", "0.0.0.0"),
            with_annotation(lb("badmac", "0.0.0.0"), model::ANN_HWADDR, "02:00:00"),
            with_annotation(
                lb("longname", "0.0.0.0"),
                model::ANN_MACVLAN_NAME,
                "sixteen-bytes-xx",
            ),
            lb("v6", "::"),
            with_annotation(
                lb("twice", "192.0.2.42"),
                model::ANN_LOADBALANCER_IPS,
                "0.0.0.0,::,0.0.0.0",
            ),
            lb("good", "192.0.2.41"),
        ];
        let here = ThisNode {
            connected: vec![connected("192.0.2.11", 24, "eth0")],
            subnet_check: true,
            ..Default::default()
        };
        let run = || {
            candidates(
                &settings(|_| {}),
                &services,
                &HashSet::new(),
                &BTreeMap::new(),
                &unusable,
                &here,
            )
        };
        let (cands, notes) = run();
        let names: Vec<&str> = cands.iter().map(|c| c.key.name.as_str()).collect();
        assert_eq!(names, ["dhcp", "v6", "twice", "good"]);
        let dhcp = &cands[0];
        assert!(dhcp.addresses.is_empty());
        let request = dhcp.dhcp.as_ref().expect("a DHCP request");
        assert_eq!(request.macvlan, "vip-uiddhcp");
        assert!(request.v4 && !request.v6);
        let v6 = cands[1].dhcp.as_ref().expect("a DHCPv6 request");
        assert!(!v6.v4 && v6.v6);
        let twice = cands[2].dhcp.as_ref().expect("a dual-stack request");
        assert!(twice.v4 && twice.v6);
        assert!(cands[3].dhcp.is_none());
        let msg = |svc: &str, reason: &str| -> Vec<String> {
            notes
                .iter()
                .filter(|n| n.key.name == svc && n.reason == reason && n.warn)
                .map(|n| n.message.clone())
                .collect()
        };
        let m = msg("badmac", "InvalidConfiguration");
        assert!(
            m.len() == 1 && m[0].contains("kube-vip.io/hwaddr") && m[0].contains("\"02:00:00\""),
            "{m:?}"
        );
        let m = msg("longname", "InvalidConfiguration");
        assert!(
            m.len() == 1
                && m[0].contains("kube-vip.io/macvlanName")
                && m[0].contains("\"sixteen-bytes-xx\"")
                && m[0].contains("15 bytes"),
            "{m:?}"
        );
        assert!(
            notes.iter().all(|n| n.key.name != "v6"),
            "no Warning for ::"
        );
        let m = msg("twice", "InvalidAddress");
        assert!(
            m.len() == 1
                && m[0].contains("\"0.0.0.0\"")
                && m[0].contains("one DHCP address per family"),
            "{m:?}"
        );
        assert!(
            notes.iter().all(|n| n.key.name != "dhcp"),
            "no note for a plain 0.0.0.0 Service"
        );
    }
}
