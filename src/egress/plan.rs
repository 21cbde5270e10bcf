//! The egress decision, pure: from the Services with egress annotations
//! ([`EgressFacts`]) and the wing's [`Settings`], the content of the egress chains
//! ([`EgressTable`]) and the problems to report (one per Service and cause).
//!
//! kube-vip's annotations (pkg/kubevip/annotations.go), read as kube-vip reads them
//! (pkg/services/services.go, pkg/nftables/nftables.go):
//! * [`ANN_EGRESS`] `"true"` (exactly): the Service's endpoints leave with its VIP;
//! * [`ANN_EGRESS_IPV6`] `"true"` (exactly): IPv6 only (the Service's IPv6 VIP for its IPv6
//!   endpoints); without it every family the Service has a VIP of, each VIP for the
//!   endpoints of its family;
//! * [`ANN_EGRESS_DENIED`]: comma-separated CIDRs never translated;
//! * [`ANN_EGRESS_ALLOWED`]: comma-separated CIDRs; when set, only those are translated;
//! * [`ANN_EGRESS_PORTS`]: comma-separated `proto:port` (`tcp:443`, `udp:53`, `sctp:...`);
//!   when set, only those destination ports are translated;
//! * [`ANN_EGRESS_NO_INTERNAL`]: any value but `""` and `"false"` translates traffic to the
//!   pod and service CIDRs too (kube-vip's reading, whatever the name suggests);
//! * [`ANN_EGRESS_DETECT_API`]: any value denies the API server's address
//!   ([`Settings::api_server`]).
//!
//! Besides the denied networks, the pod and service CIDRs are never translated (unless
//! internal SNAT is asked for): traffic inside the cluster keeps its pod address. The pod
//! CIDRs are `egress_podcidr`, else the Nodes' `spec.podCIDRs`, else kube-vip's IPv4
//! fallback; the service CIDRs `egress_servicecidr`, else kube-vip's IPv4 fallback. Where
//! kube-vip translates one endpoint of the Service (kube-vip #463, #1461), vipd translates
//! every endpoint of it on this node, ready or not (a Pod's first seconds count, kube-vip
//! #865).
//!
//! Where kube-vip skips a bad list entry (and a port list with only bad entries translates
//! every port), vipd turns egress off for that Service and reports the annotation and the
//! entry: a half-read allow or deny list could send traffic with the VIP where the operator
//! denied it. Entries are trimmed and protocols read in any case (kube-vip: lowercase,
//! untrimmed). Other Services are not affected.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use super::Settings;
use crate::kube::service::{EgressFacts, EgressReport};
use crate::net::nft::egress::{EgressTable, SnatRule};
use crate::net::nft::svcsec::L4;

/// Most source NAT rules one Service may have on a node (its endpoints here x allowed
/// networks x destination ports, per VIP): a Service over it gets no rules and a problem,
/// so that one Service never makes the node's transaction too large for the others.
pub const MAX_RULES_PER_SERVICE: usize = 1024;

/// `kube-vip.io/egress`: `"true"` turns egress on for the Service.
pub const ANN_EGRESS: &str = "kube-vip.io/egress";
/// `kube-vip.io/egress-ipv6`: `"true"` asks for IPv6 egress (kube-vip).
pub const ANN_EGRESS_IPV6: &str = "kube-vip.io/egress-ipv6";
/// `kube-vip.io/egress-denied-networks`: comma-separated CIDRs never translated.
pub const ANN_EGRESS_DENIED: &str = "kube-vip.io/egress-denied-networks";
/// `kube-vip.io/egress-allowed-networks`: comma-separated CIDRs, the only ones translated.
pub const ANN_EGRESS_ALLOWED: &str = "kube-vip.io/egress-allowed-networks";
/// `kube-vip.io/egress-destination-ports`: comma-separated `proto:port`, the only
/// destination ports translated.
pub const ANN_EGRESS_PORTS: &str = "kube-vip.io/egress-destination-ports";
/// `kube-vip.io/egress-no-internal-traffic`: any value but `""` / `"false"` translates
/// traffic to the pod and service CIDRs too.
pub const ANN_EGRESS_NO_INTERNAL: &str = "kube-vip.io/egress-no-internal-traffic";
/// `kube-vip.io/egress-detect-api-server`: any value denies the API server's address.
pub const ANN_EGRESS_DETECT_API: &str = "kube-vip.io/egress-detect-api-server";

/// One Service's egress annotations, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    /// [`ANN_EGRESS_IPV6`] is `"true"`: IPv6 VIPs only.
    pub ipv6_only: bool,
    /// Traffic to the pod and service CIDRs is translated too ([`ANN_EGRESS_NO_INTERNAL`]
    /// or `egress_enableinternalsnat`).
    pub internal: bool,
    /// Networks never translated.
    pub denied: Vec<IpNet>,
    /// Networks translated (empty: all).
    pub allowed: Vec<IpNet>,
    /// Destination ports translated (empty: all).
    pub ports: Vec<(L4, u16)>,
}

/// A Service whose egress cannot be set up, for one Warning Event and log line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    /// `namespace/name`.
    pub service: String,
    /// What is wrong and what happens: names the annotation and the value.
    pub message: String,
}

/// Whether the Service asked for egress: [`ANN_EGRESS`] is exactly `"true"`.
pub fn wants_egress(f: &EgressFacts) -> bool {
    f.annotations.get(ANN_EGRESS).map(String::as_str) == Some("true")
}

/// Parses a comma-separated CIDR list (blank entries skipped, spaces trimmed; a bare
/// address is a host prefix).
///
/// # Errors
/// The message names `annotation` and the first bad entry.
pub fn parse_networks(annotation: &str, value: &str) -> Result<Vec<IpNet>, String> {
    entries(value)
        .map(|e| {
            e.parse::<IpNet>()
                .map(|n| n.trunc())
                .or_else(|_| e.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{annotation}: {e:?} is not a CIDR (e.g. 203.0.113.0/24)"))
        })
        .collect()
}

/// Parses `proto:port` entries (`tcp`, `udp`, `sctp`, any case; port 1-65535).
///
/// # Errors
/// The message names [`ANN_EGRESS_PORTS`] and the first bad entry.
pub fn parse_ports(value: &str) -> Result<Vec<(L4, u16)>, String> {
    entries(value)
        .map(|e| {
            let bad = || format!("{ANN_EGRESS_PORTS}: {e:?} is not proto:port (e.g. tcp:443)");
            let (proto, port) = e.split_once(':').ok_or_else(bad)?;
            let l4 = L4::from_kubernetes(&proto.trim().to_ascii_uppercase()).ok_or_else(bad)?;
            let port: u16 = port.trim().parse().map_err(|_| bad())?;
            if port == 0 {
                return Err(bad());
            }
            Ok((l4, port))
        })
        .collect()
}

fn entries(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|e| !e.is_empty())
}

/// The Service's [`Policy`].
///
/// # Errors
/// The first bad annotation value, named.
pub fn policy(f: &EgressFacts, settings: &Settings) -> Result<Policy, String> {
    let get = |k: &str| f.annotations.get(k).map(String::as_str).unwrap_or("");
    let mut denied = parse_networks(ANN_EGRESS_DENIED, get(ANN_EGRESS_DENIED))?;
    if f.annotations
        .get(ANN_EGRESS_DETECT_API)
        .is_some_and(|v| !v.is_empty())
        && let Some(api) = settings.api_server
    {
        denied.push(IpNet::from(api));
    }
    Ok(Policy {
        ipv6_only: get(ANN_EGRESS_IPV6) == "true",
        internal: settings.internal_snat || !matches!(get(ANN_EGRESS_NO_INTERNAL), "" | "false"),
        denied,
        allowed: parse_networks(ANN_EGRESS_ALLOWED, get(ANN_EGRESS_ALLOWED))?,
        ports: parse_ports(get(ANN_EGRESS_PORTS))?,
    })
}

/// The rules of one Service: for each VIP, each local endpoint of its family, each allowed
/// network (or any) and each port (or any), one rule excluding the pod and service CIDRs
/// and the denied networks of that family.
fn rules_of(f: &EgressFacts, p: &Policy, internal: &[IpNet]) -> Vec<SnatRule> {
    let same = |a: &IpAddr, n: &IpNet| a.is_ipv4() == n.addr().is_ipv4();
    let internal = if p.internal { &[][..] } else { internal };
    let mut out = Vec::new();
    for vip in f.vips.iter().filter(|v| !p.ipv6_only || v.is_ipv6()) {
        let excluded: Vec<IpNet> = internal
            .iter()
            .chain(&p.denied)
            .filter(|n| same(vip, n))
            .copied()
            .collect();
        // An allow list without a network of this family translates nothing of it.
        let allowed: Vec<Option<IpNet>> = match p.allowed.is_empty() {
            true => vec![None],
            false => p
                .allowed
                .iter()
                .filter(|n| same(vip, n))
                .map(|n| Some(*n))
                .collect(),
        };
        let ports: Vec<Option<(L4, u16)>> = match p.ports.is_empty() {
            true => vec![None],
            false => p.ports.iter().map(|x| Some(*x)).collect(),
        };
        for source in f
            .local_endpoints
            .iter()
            .filter(|e| e.is_ipv4() == vip.is_ipv4())
        {
            for a in &allowed {
                for port in &ports {
                    out.push(SnatRule {
                        service: format!("{}/{}", f.namespace, f.name),
                        vip: *vip,
                        source: *source,
                        excluded: excluded.clone(),
                        allowed: *a,
                        port: *port,
                    });
                }
            }
        }
    }
    out
}

/// The pod and service CIDRs never translated: configured, else discovered (pods), else
/// kube-vip's IPv4 fallbacks.
pub fn internal_networks(report: &EgressReport, settings: &Settings) -> Vec<IpNet> {
    let fallback = |c: &str| c.parse::<IpNet>().into_iter().collect::<Vec<_>>();
    let pods = match (&settings.pod_cidrs, &report.node_pod_cidrs) {
        (configured, _) if !configured.is_empty() => configured.clone(),
        (_, found) if !found.is_empty() => found.clone(),
        _ => fallback(super::FALLBACK_POD_CIDR),
    };
    let services = match settings.service_cidrs.is_empty() {
        true => fallback(super::FALLBACK_SERVICE_CIDR),
        false => settings.service_cidrs.clone(),
    };
    pods.into_iter().chain(services).collect()
}

/// The egress chains' content for the report's Services (sorted by Service, as the Services wing sends
/// them) and the problems found. A source address already translated by an earlier
/// Service (a Pod behind two egress Services) keeps the earlier Service's VIP: one problem
/// names both.
pub fn table(report: &EgressReport, settings: &Settings) -> (EgressTable, Vec<Problem>) {
    let internal = internal_networks(report, settings);
    let facts = &report.services;
    let mut t = EgressTable::default();
    let mut problems = Vec::new();
    let mut owner: std::collections::BTreeMap<IpAddr, String> = Default::default();
    // Guarded: the VIPs of rules on this node (a node without endpoints never sends
    // with them).
    let mut guarded = BTreeSet::new();
    // Only Services with endpoints here: elsewhere egress has nothing to do, and a problem
    // is reported by the nodes it matters on.
    for f in facts
        .iter()
        .filter(|f| wants_egress(f) && !f.local_endpoints.is_empty())
    {
        let service = format!("{}/{}", f.namespace, f.name);
        let p = match policy(f, settings) {
            Ok(p) => p,
            Err(message) => {
                problems.push(Problem {
                    service,
                    message: format!("{message}; egress is off for this Service"),
                });
                continue;
            }
        };
        let rules = rules_of(f, &p, &internal);
        if !settings.fence && !rules.is_empty() {
            problems.push(Problem {
                service,
                message: "egress is off on this node: it needs the millisecond fence (vip_nftfence), which is off or could not start here (see the log at start)".into(),
            });
            continue;
        }
        if rules.len() > MAX_RULES_PER_SERVICE {
            problems.push(Problem {
                service,
                message: format!(
                    "{} rules needed here (endpoints x {ANN_EGRESS_ALLOWED} x {ANN_EGRESS_PORTS}), more than {MAX_RULES_PER_SERVICE}; egress is off for this Service",
                    rules.len()
                ),
            });
            continue;
        }
        if !f.etp_local && !rules.is_empty() {
            problems.push(Problem {
                service: service.clone(),
                message: "externalTrafficPolicy is Cluster: the VIP may be held by a node without endpoints of it, and only pods on the VIP's holder leave with it; set externalTrafficPolicy: Local (as kube-vip's docs require)".into(),
            });
        }
        for r in rules {
            guarded.insert(r.vip);
            match owner.get(&r.source) {
                Some(o) if *o != service => problems.push(Problem {
                    service: service.clone(),
                    message: format!(
                        "endpoint {} already leaves through {o}'s VIP: a Pod behind two egress Services keeps the first (by namespace/name)",
                        r.source
                    ),
                }),
                _ => {
                    owner.insert(r.source, service.clone());
                    t.snat.push(r);
                }
            }
        }
    }
    problems.dedup();
    t.guarded = guarded.into_iter().collect();
    (t, problems)
}

#[cfg(test)]
mod tests;
