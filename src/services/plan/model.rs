//! The pure model of a `type: LoadBalancer` Service as vipd sees it: kube-vip's annotation
//! names, the strict address parser, a flat [`ServiceInfo`] view and the [`selection`]
//! rule that decides whether vipd handles a Service at all. No I/O.
//!
//! # Differences from kube-vip (deliberate, all stricter)
//! - kube-vip trims whitespace around each entry of `kube-vip.io/loadbalancerIPs`
//!   (`strings.TrimSpace`); vipd rejects such entries (scenario S20 lists ` 192.0.2.5` as
//!   malformed), naming the value, so `"192.0.2.1, 192.0.2.2"` announces only the first
//!   address and reports the second. Annotations written by kube-vip-cloud-provider have no
//!   spaces, so this only hits hand-written values.
//! - kube-vip treats an entry that is not an IP as a DNS name (newer releases) or passes it
//!   on to netlink (older); vipd rejects it.
//! - kube-vip also falls back to `status.loadBalancer.ingress` when the annotation is absent;
//!   vipd never reads its own output back as input (a stale status would pin an old
//!   address) and uses only the annotation, then `spec.loadBalancerIP` (kube-vip's order).
//! - An annotation whose value is the empty string counts as absent (falls back to
//!   `spec.loadBalancerIP`); kube-vip would use the empty list.

use std::fmt;
use std::net::IpAddr;

pub use crate::kube::service::{
    ANN_IGNORE, ANN_LOADBALANCER_IPS, ANN_REQUESTED_IP, ANN_SERVICE_INTERFACE,
    DEFAULT_LB_CLASS_NAME,
};
use crate::net::vip::{NotAVip, check_vip};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;

/// `kube-vip.io/leaseName`: name of the per-Service election Lease (kube-vip
/// `ServiceLease`, "common lease"); several Services naming the same lease share one
/// holder. kube-vip refuses it on Services whose externalTrafficPolicy is not `Cluster`.
pub(crate) const ANN_LEASE_NAME: &str = "kube-vip.io/leaseName";
/// `kube-vip.io/vipHost`: written by the holder, the node name that announces the Service
/// (kube-vip `VipHost`).
pub const ANN_VIP_HOST: &str = "kube-vip.io/vipHost";
/// `kube-vip.io/hwaddr`: MAC address of the DHCP macvlan (kube-vip `HwAddrKey`).
pub const ANN_HWADDR: &str = "kube-vip.io/hwaddr";
/// `vipd.io/dhcp-lease`: vipd's record on a Service that shares a DHCP Service's leased
/// address (Harvester's share-IP mode) of which of its addresses it got that way
/// (comma-separated). Written by the holder; such an address is never announced as a static
/// one when no DHCP Service asks for it any more ([`super::desired::LapsedLease`]).
pub const ANN_DHCP_LEASE: &str = "vipd.io/dhcp-lease";
/// `kube-vip.io/loadbalancerHostname`: DHCP client hostname (kube-vip
/// `LoadbalancerHostname`).
pub(crate) const ANN_LOADBALANCER_HOSTNAME: &str = "kube-vip.io/loadbalancerHostname";
/// `kube-vip.io/ignore-service-security`: exactly `"true"` exempts the Service from
/// service security (`enable_service_security`): traffic to its addresses is not filtered
/// (kube-vip `ServiceSecurityIgnore`, pkg/kubevip/annotations.go).
pub const ANN_IGNORE_SERVICE_SECURITY: &str = "kube-vip.io/ignore-service-security";
/// The Service's own health check (vipd; `crate::services::health`), overriding the node's
/// `svc_healthcheck`.
pub const ANN_HEALTHCHECK: &str = "vipd.io/healthcheck";
/// Prefix of the default per-Service lease name: `kubevip-<service name>` (kube-vip
/// `lease.ServiceName` / `GetName`), in the Service's namespace.
pub(crate) const LEASE_NAME_PREFIX: &str = "kubevip-";

/// A Service's identity: namespace and name (`namespace/name`, as kubectl and client-go
/// cache keys write it).
pub type ServiceKey = crate::kube::ObjectKey;

/// Where a Service's addresses came from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum AddressSource {
    /// Neither the annotation nor `spec.loadBalancerIP` is set.
    #[default]
    None,
    /// The [`ANN_LOADBALANCER_IPS`] annotation.
    Annotation,
    /// `spec.loadBalancerIP` (deprecated upstream, still used by kube-vip-cloud-provider).
    Spec,
}

impl fmt::Display for AddressSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressSource::None => "no address source",
            AddressSource::Annotation => ANN_LOADBALANCER_IPS,
            AddressSource::Spec => "spec.loadBalancerIP",
        })
    }
}

/// Why an address entry was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RejectReason {
    /// Empty entry (`a,,b`, trailing comma).
    Empty,
    /// Leading or trailing whitespace (kube-vip would trim; vipd rejects, see module docs).
    Whitespace,
    /// A prefix length (`192.0.2.1/24`): addresses only; the prefix comes from `vip_subnet`.
    Cidr,
    /// A second `0.0.0.0` (or `::`): one DHCP address per family.
    SecondDhcp,
    /// An IPv6 zone id (`fe80::1%eth0`).
    ZoneId,
    /// Not an IPv4/IPv6 address (bad octet, hostname, `::ffff:zz`, leading zeros).
    NotAnAddress,
    /// Not usable as a VIP, by the one rule in [`crate::net::vip::check_vip`] (loopback,
    /// multicast, link-local, broadcast, `0.0.0.0/8`, IPv4 written as IPv6).
    NotAVip(NotAVip),
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RejectReason::Empty => "empty entry",
            RejectReason::Whitespace => "leading or trailing whitespace",
            RejectReason::Cidr => "prefix length not allowed, give a plain address",
            RejectReason::SecondDhcp => {
                "a second DHCP request of the same family (one DHCP address per family: at most one 0.0.0.0 and one ::)"
            }
            RejectReason::ZoneId => "IPv6 zone id not allowed",
            RejectReason::NotAnAddress => "not an IPv4 or IPv6 address",
            RejectReason::NotAVip(class) => return write!(f, "{class}, not usable as a VIP"),
        })
    }
}

/// At most this many entries of one address list are read (issue 27: a Service whose
/// `kube-vip.io/loadbalancerIPs` held 2 000 bad entries cost one Warning Event and one log
/// line each, and blocked every other Service for seconds); the rest are only counted
/// ([`ParsedAddresses::unread`]). A Service has one or two addresses (dual stack), a few
/// more when it shares several.
pub(crate) const MAX_ADDRESS_ENTRIES: usize = 64;

/// At most this many bytes of one address list are read (issue 27): 64 entries of the
/// longest IPv6 spelling (45 characters) and their commas fit; the entries that start
/// after the cut are not read, and the message says how long the text was
/// ([`ParsedAddresses::too_long`]). An annotation may hold 256 KiB.
pub(crate) const MAX_ADDRESS_LIST_BYTES: usize = 4096;

/// At most this many rejected values are quoted per reason in
/// [`ParsedAddresses::rejection_message`]; the others are counted.
const QUOTED_PER_REASON: usize = 3;

/// One rejected entry: the value exactly as written and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejected {
    /// The entry as written (untrimmed).
    pub value: String,
    /// Why it was rejected.
    pub reason: RejectReason,
}

/// The outcome of parsing a Service's address list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ParsedAddresses {
    /// Where the text came from.
    pub source: AddressSource,
    /// Accepted addresses, in the order written, each once (first occurrence kept). Never
    /// contains `0.0.0.0` / `::` (see [`ParsedAddresses::dhcp`]).
    pub addresses: Vec<IpAddr>,
    /// `0.0.0.0` or `::` was present: the Service asks for a DHCP address.
    pub dhcp: bool,
    /// `0.0.0.0` was present: DHCPv4.
    pub dhcp_v4: bool,
    /// `::` was present: DHCPv6 (IA_NA).
    pub dhcp_v6: bool,
    /// Rejected entries, in the order written.
    pub rejected: Vec<Rejected>,
    /// Entries dropped because they repeat an earlier one (as written, e.g.
    /// `2001:DB8::1` after `2001:db8::1`); not an error.
    pub duplicates: Vec<String>,
    /// Entries after the first [`MAX_ADDRESS_ENTRIES`], not read (counted only, within
    /// the first [`MAX_ADDRESS_LIST_BYTES`]).
    pub unread: usize,
    /// The text was longer than [`MAX_ADDRESS_LIST_BYTES`]: its length in bytes (only the
    /// entries that end within the cap were read).
    pub too_long: Option<usize>,
}

impl ParsedAddresses {
    /// No usable address and no DHCP request.
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty() && !self.dhcp
    }

    /// Some entries were rejected or not read (an entry cap, the length cap).
    pub(crate) fn has_problems(&self) -> bool {
        !self.rejected.is_empty() || self.unread > 0 || self.too_long.is_some()
    }

    /// One line about every rejected or unread entry and the source, for one Warning Event
    /// and one log line per Service, whatever the number of entries: per reason, the first
    /// [`QUOTED_PER_REASON`] values and a count; `None` when nothing was rejected. Examples:
    /// `kube-vip.io/loadbalancerIPs: rejected "192.0.2.300" (not an IPv4 or IPv6 address)`,
    /// `kube-vip.io/loadbalancerIPs: rejected 64 entries (not an IPv4 or IPv6 address): "a",
    /// "b", "c" and 61 more; 1936 entries after the first 64 not read (at most 64 per Service)`.
    pub(crate) fn rejection_message(&self) -> Option<String> {
        if !self.has_problems() {
            return None;
        }
        let mut by_reason: Vec<(RejectReason, Vec<&str>)> = Vec::new();
        for r in &self.rejected {
            match by_reason.iter_mut().find(|(reason, _)| *reason == r.reason) {
                Some((_, values)) => values.push(&r.value),
                None => by_reason.push((r.reason, vec![&r.value])),
            }
        }
        let mut items: Vec<String> = by_reason
            .iter()
            .map(|(reason, values)| match values.as_slice() {
                [one] => format!("{:?} ({reason})", quotable(one)),
                many => {
                    let quoted: Vec<String> = many
                        .iter()
                        .take(QUOTED_PER_REASON)
                        .map(|v| format!("{:?}", quotable(v)))
                        .collect();
                    let more = many.len().saturating_sub(QUOTED_PER_REASON);
                    let tail = if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    };
                    format!(
                        "{} entries ({reason}): {}{tail}",
                        many.len(),
                        quoted.join(", ")
                    )
                }
            })
            .collect();
        if let Some(len) = self.too_long {
            items.push(format!(
                "the text is {len} bytes long: entries past the first {MAX_ADDRESS_LIST_BYTES} bytes not read (at most {MAX_ADDRESS_LIST_BYTES} bytes per Service)"
            ));
        }
        if self.unread > 0 {
            items.push(format!(
                "{} entries after the first {MAX_ADDRESS_ENTRIES} not read (at most {MAX_ADDRESS_ENTRIES} per Service)",
                self.unread
            ));
        }
        Some(format!("{}: rejected {}", self.source, items.join("; ")))
    }
}

/// At most this many characters of one rejected value are quoted in a message.
const QUOTED_CHARS: usize = 64;

/// `value`, cut to [`QUOTED_CHARS`] characters with `...` when longer (an annotation may
/// hold up to 256 KiB: the message names the value, it need not carry it all).
fn quotable(value: &str) -> String {
    match value.char_indices().nth(QUOTED_CHARS) {
        Some((cut, _)) => format!("{}...", &value[..cut]),
        None => value.to_string(),
    }
}

/// Parses a `kube-vip.io/loadbalancerIPs` value: comma-separated IPv4 and IPv6 addresses.
///
/// Strict, unlike kube-vip (see the module docs): each entry must be exactly an address,
/// with no whitespace, prefix length or zone id. `0.0.0.0` and `::` set
/// [`ParsedAddresses::dhcp`]. Loopback, multicast, link-local, broadcast, `0.0.0.0/8` and
/// IPv4-in-IPv6 forms are rejected. Duplicates are dropped and listed. Never fails: every
/// bad entry lands in [`ParsedAddresses::rejected`]; the source is
/// [`AddressSource::Annotation`].
pub(crate) fn parse_address_list(text: &str) -> ParsedAddresses {
    let mut out = ParsedAddresses {
        source: AddressSource::Annotation,
        ..ParsedAddresses::default()
    };
    let text = within_length_cap(text, &mut out);
    if text.is_empty() && out.too_long.is_some() {
        return out;
    }
    for (i, entry) in text.split(',').enumerate() {
        if i < MAX_ADDRESS_ENTRIES {
            add_entry(&mut out, entry);
        } else {
            out.unread += 1;
        }
    }
    out
}

/// The part of `text` that [`parse_address_list`] reads: all of it when it is at most
/// [`MAX_ADDRESS_LIST_BYTES`] long; else the entries that end within the cap (an entry cut
/// by it is dropped, never read as a shorter address), and `out.too_long` is set.
fn within_length_cap<'a>(text: &'a str, out: &mut ParsedAddresses) -> &'a str {
    if text.len() <= MAX_ADDRESS_LIST_BYTES {
        return text;
    }
    out.too_long = Some(text.len());
    let mut cut = MAX_ADDRESS_LIST_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    if text.as_bytes().get(cut) == Some(&b',') {
        return &text[..cut];
    }
    text[..cut].rfind(',').map_or("", |end| &text[..end])
}

/// Parses `spec.loadBalancerIP`: one address with the rules of [`parse_address_list`]
/// (a comma is not a separator here, so `a,b` is rejected as a whole, as kube-vip's
/// `net.ParseIP` would). The source is [`AddressSource::Spec`].
pub(crate) fn parse_spec_address(text: &str) -> ParsedAddresses {
    let mut out = ParsedAddresses {
        source: AddressSource::Spec,
        ..ParsedAddresses::default()
    };
    add_entry(&mut out, text);
    out
}

fn add_entry(out: &mut ParsedAddresses, entry: &str) {
    match parse_entry(entry) {
        Ok(None) => {
            let seen = if entry.contains(':') {
                &mut out.dhcp_v6
            } else {
                &mut out.dhcp_v4
            };
            if std::mem::replace(seen, true) {
                out.rejected.push(Rejected {
                    value: entry.to_string(),
                    reason: RejectReason::SecondDhcp,
                });
            }
            out.dhcp = true;
        }
        Ok(Some(ip)) => {
            if out.addresses.contains(&ip) {
                out.duplicates.push(entry.to_string());
            } else {
                out.addresses.push(ip);
            }
        }
        Err(reason) => out.rejected.push(Rejected {
            value: entry.to_string(),
            reason,
        }),
    }
}

/// One entry: `Ok(None)` for the DHCP marker, `Ok(Some(ip))` for a usable address.
fn parse_entry(entry: &str) -> Result<Option<IpAddr>, RejectReason> {
    if entry.is_empty() {
        return Err(RejectReason::Empty);
    }
    if entry.trim() != entry {
        return Err(if entry.trim().is_empty() {
            RejectReason::Empty
        } else {
            RejectReason::Whitespace
        });
    }
    if entry.contains('/') {
        return Err(RejectReason::Cidr);
    }
    if entry.contains('%') {
        return Err(RejectReason::ZoneId);
    }
    let ip: IpAddr = entry.parse().map_err(|_| RejectReason::NotAnAddress)?;
    match check_vip(ip) {
        Ok(()) => Ok(Some(ip)),
        // 0.0.0.0 / :: ask for DHCP.
        Err(NotAVip::Unspecified) => Ok(None),
        Err(class) => Err(RejectReason::NotAVip(class)),
    }
}

/// A Service's addresses in kube-vip's order: the [`ANN_LOADBALANCER_IPS`] annotation when
/// present and non-empty, else `spec.loadBalancerIP` when non-empty, else nothing
/// ([`AddressSource::None`]). The annotation, when used, hides `spec.loadBalancerIP`
/// entirely (also when all its entries are rejected).
pub(crate) fn addresses_of(svc: &Service) -> ParsedAddresses {
    if let Some(text) = annotation(svc, ANN_LOADBALANCER_IPS) {
        return parse_address_list(text);
    }
    match svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.as_deref())
    {
        Some(text) if !text.is_empty() => parse_spec_address(text),
        _ => ParsedAddresses::default(),
    }
}

/// A non-empty annotation value.
fn annotation<'a>(svc: &'a Service, name: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// A Service port as announced in `status.loadBalancer.ingress[].ports`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortProto {
    /// `spec.ports[].port`.
    pub port: i32,
    /// `spec.ports[].protocol`: `TCP` (the API default when absent), `UDP` or `SCTP`.
    pub protocol: String,
}

/// Everything vipd needs from one Service, flattened; built by [`service_info`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceInfo {
    /// Namespace and name.
    pub key: ServiceKey,
    /// `metadata.uid` (`None` on objects that never went through the API server).
    pub uid: Option<String>,
    /// `metadata.creationTimestamp`: the older of two conflicting Services wins (S07).
    pub created: Option<Timestamp>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.resourceVersion`, for logs and change detection.
    pub resource_version: Option<String>,
    /// `spec.type == "LoadBalancer"`.
    pub is_load_balancer: bool,
    /// `spec.loadBalancerClass`.
    pub load_balancer_class: Option<String>,
    /// Annotation [`ANN_IGNORE`] is exactly `"true"`.
    pub ignored: bool,
    /// The parsed addresses ([`addresses_of`]).
    pub addresses: ParsedAddresses,
    /// `spec.ports`, in order.
    pub ports: Vec<PortProto>,
    /// `spec.externalTrafficPolicy == "Local"`.
    pub etp_local: bool,
    /// Annotation [`ANN_SERVICE_INTERFACE`] (non-empty).
    pub interface: Option<String>,
    /// Election lease name: annotation [`ANN_LEASE_NAME`] if non-empty, else
    /// `kubevip-<name>` (kube-vip `lease.ServiceName`); in the Service's namespace.
    pub lease_name: String,
    /// The lease name came from [`ANN_LEASE_NAME`] (kube-vip "common lease").
    pub lease_name_from_annotation: bool,
    /// Annotation [`ANN_HWADDR`] (DHCP mode).
    pub hwaddr: Option<String>,
    /// Annotation [`ANN_REQUESTED_IP`] (DHCP mode).
    pub requested_ip: Option<String>,
    /// Annotation [`ANN_LOADBALANCER_HOSTNAME`] (DHCP mode).
    pub dhcp_hostname: Option<String>,
    /// Annotation [`ANN_MACVLAN_NAME`] (DHCP mode).
    pub macvlan_name: Option<String>,
    /// Annotation [`ANN_DHCP_BROADCAST`] (DHCP mode).
    pub dhcp_broadcast: Option<String>,
    /// Annotation [`ANN_RP_FILTER`] (DHCP mode).
    pub rp_filter: Option<String>,
    /// Annotation [`ANN_VIP_HOST`]: who last announced it, as written by the holder.
    pub vip_host: Option<String>,
    /// Annotation [`ANN_DHCP_LEASE`]: addresses this Service shared from a DHCP lease.
    pub dhcp_lease_marks: Vec<IpAddr>,
    /// The entries of [`ANN_DHCP_LEASE`] that are not IP addresses (empty ones included):
    /// ignored, and reported.
    pub dhcp_lease_bad: Vec<String>,
    /// Annotation [`crate::nodes::selector::NODE_SELECTOR_ANNOTATION`] (non-empty),
    /// parsed; `Err` holds the value and why it is not a label selector.
    pub node_selector: Option<Result<crate::nodes::selector::NodeSelector, (String, String)>>,
    /// Annotation [`crate::nodes::selector::PREFERRED_NODES_ANNOTATION`] (non-empty),
    /// parsed; `Err` holds the value and why it is not a list of node names.
    pub preferred_nodes: Option<Result<Vec<String>, (String, String)>>,
    /// Annotation [`ANN_HEALTHCHECK`] is set (non-empty): the Service has a health check of
    /// its own.
    pub own_health_check: bool,
}

impl ServiceInfo {
    /// Its own lease under per-Service election: [`Self::lease_name`] in its namespace.
    pub(crate) fn own_lease(&self) -> crate::kube::ObjectKey {
        crate::kube::ObjectKey {
            namespace: self.key.namespace.clone(),
            name: self.lease_name.clone(),
        }
    }

    /// Whether the Service sets conditions of its own on who announces it: a valid node
    /// selector, a non-empty preferred-nodes annotation (an invalid one is ignored with a
    /// Warning, so it names none), or a health check of its own (its failure hands the
    /// Service over). Such a Service cannot share a shard lease: a shard's holder announces
    /// every Service of the shard, and one Service's check would move them all.
    pub(crate) fn own_conditions(&self) -> bool {
        matches!(self.node_selector, Some(Ok(_)))
            || matches!(&self.preferred_nodes, Some(Ok(n)) if !n.is_empty())
            || self.own_health_check
    }
}

/// The [`ANN_DHCP_LEASE`] record of `svc`: its addresses, and the entries that are not IP
/// addresses (empty ones included). Both empty without the annotation. Pure.
pub(crate) fn dhcp_lease_record(svc: &Service) -> (Vec<IpAddr>, Vec<String>) {
    let mut addrs = Vec::new();
    let mut bad = Vec::new();
    for entry in annotation(svc, ANN_DHCP_LEASE)
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
    {
        match entry.parse::<IpAddr>() {
            Ok(a) => addrs.push(a),
            Err(_) => bad.push(entry.to_string()),
        }
    }
    (addrs, bad)
}

/// The pure view of a Service. Never fails: bad input ends up in
/// [`ServiceInfo::addresses`]`.rejected` or as a [`Selection::Skip`].
pub(crate) fn service_info(svc: &Service) -> ServiceInfo {
    let dhcp_lease = dhcp_lease_record(svc);
    let key = ServiceKey::of(svc);
    let spec = svc.spec.as_ref();
    let ann = |name: &str| annotation(svc, name).map(str::to_string);
    let (lease_name, lease_name_from_annotation) = match annotation(svc, ANN_LEASE_NAME) {
        Some(n) => (n.to_string(), true),
        None => (format!("{LEASE_NAME_PREFIX}{}", key.name), false),
    };
    let ports = spec
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .map(|p| PortProto {
                    port: p.port,
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
                })
                .collect()
        })
        .unwrap_or_default();
    ServiceInfo {
        uid: svc.metadata.uid.clone(),
        created: svc.metadata.creation_timestamp.as_ref().map(|t| t.0),
        deleting: svc.metadata.deletion_timestamp.is_some(),
        resource_version: svc.metadata.resource_version.clone(),
        is_load_balancer: crate::kube::service::is_load_balancer(svc),
        load_balancer_class: spec.and_then(|s| s.load_balancer_class.clone()),
        ignored: svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_IGNORE))
            .is_some_and(|v| v == "true"),
        addresses: addresses_of(svc),
        ports,
        etp_local: spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local"),
        interface: ann(ANN_SERVICE_INTERFACE),
        lease_name,
        lease_name_from_annotation,
        hwaddr: ann(ANN_HWADDR),
        requested_ip: ann(ANN_REQUESTED_IP),
        dhcp_hostname: ann(ANN_LOADBALANCER_HOSTNAME),
        macvlan_name: ann(ANN_MACVLAN_NAME),
        dhcp_broadcast: ann(ANN_DHCP_BROADCAST),
        rp_filter: ann(ANN_RP_FILTER),
        vip_host: ann(ANN_VIP_HOST),
        dhcp_lease_marks: dhcp_lease.0,
        dhcp_lease_bad: dhcp_lease.1,
        node_selector: annotation(svc, crate::nodes::selector::NODE_SELECTOR_ANNOTATION).map(
            |text| {
                crate::nodes::selector::NodeSelector::parse(text).map_err(|e| (text.to_string(), e))
            },
        ),
        preferred_nodes: annotation(svc, crate::nodes::selector::PREFERRED_NODES_ANNOTATION).map(
            |text| {
                crate::nodes::selector::parse_preferred_nodes(text)
                    .map_err(|e| (text.to_string(), e))
            },
        ),
        own_health_check: annotation(svc, ANN_HEALTHCHECK).is_some(),
        key,
    }
}

/// Why a Service is not announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SkipReason {
    /// `spec.type` is not `LoadBalancer` (S18: acts as a delete).
    NotLoadBalancer,
    /// Being deleted (`metadata.deletionTimestamp` set).
    Deleting,
    /// Outside `svc_namespace`.
    OtherNamespace {
        /// The namespace vipd watches.
        watched: String,
    },
    /// `spec.loadBalancerClass` names another implementation: never touched (no Event, no
    /// status).
    OtherClass {
        /// The Service's class.
        class: String,
    },
    /// No `spec.loadBalancerClass` while `lb_class_only` is set.
    NoClass,
    /// Annotation `kube-vip.io/ignore: "true"`.
    Ignored,
    /// [`ANN_LEASE_NAME`] is not a valid Lease name (DNS-1123 subdomain).
    InvalidLeaseName {
        /// The annotation value.
        value: String,
    },
    /// [`ANN_LEASE_NAME`] on a Service with `externalTrafficPolicy: Local` (kube-vip
    /// refuses the combination: a shared lease cannot follow per-Service endpoints).
    LeaseNameWithLocalPolicy,
    /// [`crate::nodes::selector::NODE_SELECTOR_ANNOTATION`] is not a label selector: no
    /// node announces the Service (a typo in a restriction must not announce it
    /// everywhere).
    InvalidNodeSelector {
        /// The annotation value.
        value: String,
        /// Why it does not parse.
        error: String,
    },
    /// Neither a usable address nor a DHCP request (S20: skipped with a log line; rejected
    /// entries, if any, are reported separately).
    NoAddress,
}

impl SkipReason {
    /// The skip is the user's mistake and deserves a Warning Event on the Service (only for
    /// Services of our class; the others are never touched).
    pub(crate) fn warrants_warning(&self) -> bool {
        matches!(
            self,
            SkipReason::InvalidLeaseName { .. }
                | SkipReason::LeaseNameWithLocalPolicy
                | SkipReason::InvalidNodeSelector { .. }
        )
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NotLoadBalancer => f.write_str("not of type LoadBalancer"),
            SkipReason::Deleting => f.write_str("being deleted"),
            SkipReason::OtherNamespace { watched } => {
                write!(f, "outside the watched namespace {watched:?}")
            }
            SkipReason::OtherClass { class } => {
                write!(
                    f,
                    "loadBalancerClass {class:?} belongs to another implementation"
                )
            }
            SkipReason::NoClass => f.write_str("no loadBalancerClass and lb_class_only is set"),
            SkipReason::Ignored => write!(f, "annotation {ANN_IGNORE}=true"),
            SkipReason::InvalidLeaseName { value } => {
                write!(
                    f,
                    "annotation {ANN_LEASE_NAME}={value:?} is not a valid Lease name"
                )
            }
            SkipReason::LeaseNameWithLocalPolicy => write!(
                f,
                "annotation {ANN_LEASE_NAME} cannot be used with externalTrafficPolicy Local"
            ),
            SkipReason::InvalidNodeSelector { value, error } => write!(
                f,
                "annotation {}={value:?} is not a label selector: {error}",
                crate::nodes::selector::NODE_SELECTOR_ANNOTATION
            ),
            SkipReason::NoAddress => write!(
                f,
                "no address: set {ANN_LOADBALANCER_IPS} or spec.loadBalancerIP"
            ),
        }
    }
}

/// Whether vipd handles a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection {
    /// Announce it (its addresses may still include rejected entries, and DHCP-only
    /// Services are for the DHCP code to handle).
    Announce,
    /// Do not announce it.
    Skip(SkipReason),
}

/// Decides whether vipd handles a Service, checked in this order: type, deletion,
/// namespace (`svc_namespace`, `None` = all), class, ignore annotation, lease-name
/// annotation, node-selector annotation, address.
///
/// Class rule = kube-vip's legacy handling (`lbClassFilterLegacy`, the only one vipd
/// supports): a Service with a `loadBalancerClass` other than `lb_class_name` is skipped;
/// one without a class is skipped only when `lb_class_only`. Class comes before the ignore
/// annotation and every Warning-producing check, so a Service of another class is never
/// touched.
pub(crate) fn selection(
    info: &ServiceInfo,
    lb_class_only: bool,
    lb_class_name: &str,
    namespace: Option<&str>,
) -> Selection {
    use SkipReason::*;
    let skip = |r| Selection::Skip(r);
    if !info.is_load_balancer {
        return skip(NotLoadBalancer);
    }
    if info.deleting {
        return skip(Deleting);
    }
    if let Some(ns) = namespace
        && info.key.namespace != ns
    {
        return skip(OtherNamespace {
            watched: ns.to_string(),
        });
    }
    if !crate::kube::service::serves_class(
        info.load_balancer_class.as_deref(),
        lb_class_only,
        lb_class_name,
    ) {
        return skip(match &info.load_balancer_class {
            Some(class) => OtherClass {
                class: class.clone(),
            },
            None => NoClass,
        });
    }
    if info.ignored {
        return skip(Ignored);
    }
    if info.lease_name_from_annotation {
        if !is_dns_subdomain(&info.lease_name) {
            return skip(InvalidLeaseName {
                value: info.lease_name.clone(),
            });
        }
        if info.etp_local {
            return skip(LeaseNameWithLocalPolicy);
        }
    }
    if let Some(Err((value, error))) = &info.node_selector {
        return skip(InvalidNodeSelector {
            value: value.clone(),
            error: error.clone(),
        });
    }
    if info.addresses.is_empty() {
        return skip(NoAddress);
    }
    Selection::Announce
}

/// RFC 1123 subdomain as Kubernetes validates object names: at most 253 characters,
/// dot-separated labels of lowercase alphanumerics and `-`, each starting and ending with
/// an alphanumeric.
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    crate::syntax::is_dns1123_subdomain(name)
}

mod dhcp;
pub(crate) use dhcp::*;

#[cfg(test)]
mod tests;
