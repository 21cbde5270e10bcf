//! Service security (`enable_service_security`, kube-vip's `--onlyAllowTrafficServicePorts`),
//! the decision: from the Services whose VIPs this node announces, the elements of vipd's
//! `inet vipd_svcsec` table ([`crate::net::nft::svcsec`]). Pure.
//!
//! As kube-vip (pkg/vip/address.go `configureNFTables`; `SetServicePorts` reads
//! `spec.ports` and the `kube-vip.io/ignore-service-security` annotation):
//! * a Service with at least one port guards each of its addresses: traffic to the address
//!   passes on the Service's ports (`spec.ports[].protocol` and `.port`, not the node port
//!   nor the target port) and on UDP 68 (the DHCP client); everything else is dropped;
//! * a Service with no port guards nothing (kube-vip skips it: `len(ports) > 0`);
//! * a Service annotated [`ANN_IGNORE_SERVICE_SECURITY`]`: "true"` guards nothing.
//!
//! Where kube-vip has one rule set per Service, vipd joins the Services sharing an address
//! (`kube-vip.io/loadbalancerIPs` on several Services, different ports): the address passes
//! the union of their ports. When one of them is exempt the address is not guarded at all:
//! its Service asked for every port of that address to pass (in kube-vip the other
//! Service's drop rule would drop the exempt Service's own ports).
//!
//! A port whose protocol is not `TCP`, `UDP` or `SCTP`, or whose number is outside 1-65535,
//! cannot be allowed (the API server refuses such ports, so only a damaged object has one):
//! the Service is still guarded with its other ports (what no Service forwards stays
//! dropped) and a [`Problem`] names the port, for a Warning on that Service only.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::model::{ANN_IGNORE_SERVICE_SECURITY, PortProto, ServiceKey};
use crate::net::nft::svcsec::{Element, L4};

/// One Service whose addresses this node announces, as service security sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The Service.
    pub key: ServiceKey,
    /// Its addresses announced by this node (`0.0.0.0` / `::`, a DHCP request, is skipped).
    pub addresses: Vec<IpAddr>,
    /// `spec.ports`.
    pub ports: Vec<PortProto>,
    /// [`ANN_IGNORE_SERVICE_SECURITY`] is exactly `"true"` ([`exempt`]).
    pub exempt: bool,
}

/// A Service port service security cannot allow.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    /// The Service.
    pub key: ServiceKey,
    /// The Warning's message: which port, why, and what happens to its traffic.
    pub message: String,
}

/// The table's content and the problems found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    /// Every set element the table must hold.
    pub elements: BTreeSet<Element>,
    /// One per port that cannot be allowed, in Service order.
    pub problems: Vec<Problem>,
}

/// Whether `annotations` exempt a Service: [`ANN_IGNORE_SERVICE_SECURITY`] is exactly
/// `"true"` (kube-vip compares with `== "true"`).
pub fn exempt(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(ANN_IGNORE_SERVICE_SECURITY))
        .is_some_and(|v| v == "true")
}

/// The protocol and port of `p`, or why it cannot be allowed.
fn allowed(p: &PortProto) -> Result<(L4, u16), String> {
    let l4 = L4::from_kubernetes(&p.protocol)
        .ok_or_else(|| format!("protocol {:?} is not TCP, UDP or SCTP", p.protocol.as_str()))?;
    let port = u16::try_from(p.port)
        .ok()
        .filter(|n| *n != 0)
        .ok_or_else(|| format!("port {} is outside 1-65535", p.port))?;
    Ok((l4, port))
}

/// The table's elements for `held` (the Services whose addresses this node announces) and
/// the problems found; see the module documentation for the rules.
pub fn ruleset(held: &[Held]) -> Ruleset {
    let mut out = Ruleset::default();
    let mut open: BTreeSet<IpAddr> = BTreeSet::new();
    for svc in held {
        let addresses = svc.addresses.iter().filter(|a| !a.is_unspecified());
        if svc.exempt {
            open.extend(addresses);
            continue;
        }
        if svc.ports.is_empty() {
            continue;
        }
        let mut ports = Vec::new();
        for p in &svc.ports {
            match allowed(p) {
                Ok(lp) => ports.push(lp),
                Err(why) => out.problems.push(Problem {
                    key: svc.key.clone(),
                    message: format!(
                        "service security cannot allow spec.ports entry {}/{}: {why}; traffic to the Service's addresses on it is dropped (its other ports pass)",
                        p.port, p.protocol
                    ),
                }),
            }
        }
        for addr in addresses {
            out.elements.insert(Element::Guard(*addr));
            for (l4, port) in &ports {
                out.elements.insert(Element::Allow(*addr, *l4, *port));
            }
        }
    }
    out.elements.retain(|e| match e {
        Element::Guard(a) | Element::Allow(a, _, _) => !open.contains(a),
    });
    out
}

#[cfg(test)]
mod tests;
