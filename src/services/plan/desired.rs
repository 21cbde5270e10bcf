//! Which Service VIPs exist, which Lease governs each address, and which of them this node
//! should campaign for: one pure function ([`plan_leases`]) of the selected Services, the local
//! endpoints and the configuration. No kernel, no API server.
//!
//! Rules (scenarios S06, S07, S21 in `docs/scenarios.md`):
//! * One address, one governing lease: an address used by several Services is governed by
//!   the lease of the oldest of them (creation time, then namespace/name); an address that is
//!   also the control-plane VIP stays with the control-plane lease and no Service group
//!   touches it. The address goes only when its last consumer goes.
//! * Two Services with the same address, port and protocol: the later one is not programmed
//!   at all and gets a [`Conflict`] naming the earlier one; the same port with another
//!   protocol is fine.
//! * A DHCP Service's MAC and macvlan name are its own: a newer DHCP Service with the same
//!   (copied annotations) is left out with a [`DhcpConflict`].
//! * A DHCP Service's leased address (its `kube-vip.io/requestedIP`) is carried by its
//!   macvlan, unless an older Service names it concretely (oldest wins): another Service
//!   naming that address (Harvester's share-IP mode) joins the DHCP
//!   Service's group, is served there, and is never bound on the parent interface; the
//!   same address, port and protocol as the DHCP Service is a [`Conflict`].
//! * externalTrafficPolicy Local: a node campaigns for a group only when one of the group's
//!   Local Services has a ready endpoint on it, or a group member uses policy Cluster. With
//!   one lease for all (`svc_election=false`) a Local Service gets a lease of its own anyway
//!   ([`local_lease`], in the global lease's namespace), so it is announced only from a node
//!   that can serve it (kube-vip announces it from the global holder, whose kube-proxy drops
//!   the traffic when no endpoint runs there: harvester #6944).
//! * Node selector and subnet (per-Service election only): a member counts for the rule
//!   above only when this node may announce it ([`Candidate::not_here`] is `None`).
//! * Shard leases (`svc_leaseshards`, [`Shards`]): a Service is placed on a shard by a
//!   rendezvous hash of its UID; Services that not every node may announce keep a lease of
//!   their own ([`service_lease`]); a node campaigns for a shard only when it may announce
//!   every Service on it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::jiff::Timestamp;

use super::model::{DhcpRequest, PortProto, ServiceKey};
use crate::holder::VipSpec;
use crate::net::Vip;
use crate::net::VipSubnet;
use crate::net::conflict::fmt_mac;

/// A Lease by namespace and name.
pub type LeaseRef = crate::kube::ObjectKey;

/// A Service selected for announcement (class, type and ignore filters already applied,
/// addresses already parsed and valid), as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The Service.
    pub key: ServiceKey,
    /// `metadata.creationTimestamp` (older wins shared addresses and conflicts).
    pub created: Option<Timestamp>,
    /// Accepted addresses, in configured order.
    pub addresses: Vec<IpAddr>,
    /// Ports and protocols (for S07 conflicts and the status).
    pub ports: Vec<PortProto>,
    /// `externalTrafficPolicy: Local`.
    pub etp_local: bool,
    /// A ready endpoint of this Service runs on this node.
    pub local_endpoint: bool,
    /// Interface from the `kube-vip.io/serviceInterface` annotation.
    pub interface: Option<String>,
    /// The Service's own lease (per-Service election): `kubevip-<name>` in its namespace,
    /// or the annotation's override.
    pub lease: LeaseRef,
    /// DHCP mode: the Service's address `0.0.0.0` (`::`) asks for a DHCPv4 (DHCPv6) lease
    /// with this request (its other addresses, if any, are served as usual).
    pub dhcp: Option<DhcpRequest>,
    /// Why this node may not announce this Service (per-Service election only): its
    /// labels do not match the Service's node selector, or no subnet connected to it
    /// contains the Service's addresses. `None`: it may.
    pub not_here: Option<NotHere>,
    /// The Service's preferred nodes, in order (`vipd.io/preferred-nodes`; empty: none).
    pub preferred: Vec<String>,
    /// Addresses it shared from a DHCP Service's lease (`vipd.io/dhcp-lease`): never
    /// announced as static addresses ([`LapsedLease`]).
    pub dhcp_lease_marks: Vec<IpAddr>,
    /// `metadata.uid`: what places the Service on a shard lease ([`Shards::index_of`]);
    /// `None` (objects that never went through the API server): `namespace/name` does.
    pub uid: Option<String>,
    /// The Service sets conditions of its own on who announces it (a valid node selector
    /// or preferred-nodes annotation, or a health check of its own): it cannot share a
    /// shard lease, whose candidates are every node and whose holder announces every
    /// Service on it ([`service_lease`]).
    pub own_conditions: bool,
    /// [`Candidate::lease`] came from kube-vip's `kube-vip.io/leaseName` annotation (a
    /// "common lease" the user chose): kept under shard leases too.
    pub lease_annotated: bool,
}

/// Why this node may not announce a Service (the node selector and subnet rules of the Services runtime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotHere {
    /// The `reason` label of `vipd_vip_handovers_total`: `node-selector` or `subnet`.
    pub reason: &'static str,
    /// For the log and the `HandedOver` Event, e.g. `no subnet connected to the node
    /// contains 192.0.2.80`.
    pub message: String,
}

/// A DHCP Service of a group: the lease holder runs its client (issue 13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpService {
    /// The Service.
    pub key: ServiceKey,
    /// What its client asks for.
    pub request: DhcpRequest,
}

/// How Services are elected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// `svc_election`: every Service (address group) has its own lease.
    PerService,
    /// One lease for all Service addresses (`svc_leasename` in `cp_namespace`).
    Global(LeaseRef),
    /// `svc_leaseshards`: Services spread over a fixed number of shard leases by a stable
    /// hash of their UID ([`Shards`]).
    Sharded(Shards),
    /// No election (routing-table mode with `svc_election=false` and
    /// `vip_leaderelection=false`, kube-vip's `ServicesNoLeader` in
    /// `pkg/manager/worker/table.go`): every node that may serve a Service routes its
    /// addresses, and the fabric spreads the traffic by ECMP. One group per address
    /// ([`unelected_group`]), whose "lease" lives in the process only
    /// (`crate::election::local`): it never touches the API server, is never shared,
    /// retired or collected.
    Unelected,
}

impl Mode {
    /// Whether `lease` is shared by Services whatever they are: the global lease, or one of
    /// the current shard leases. A shared lease is not deleted when its Services go, and
    /// its candidates are every node that may announce all of its Services. Every other
    /// lease belongs to its Services (per-Service, `vipd-local.`, an annotated common
    /// lease, a shard beyond the current count).
    pub fn is_shared(&self, lease: &LeaseRef) -> bool {
        match self {
            Mode::PerService | Mode::Unelected => false,
            Mode::Global(g) => g == lease,
            Mode::Sharded(s) => s.index_of_lease(lease).is_some(),
        }
    }

    /// Whether vipd may delete `lease` once no Service uses it: every lease but the global
    /// one (which kube-vip shares and which carries no vipd labels). Shard leases beyond
    /// the current count are collected like per-Service leases.
    pub fn collectable(&self, lease: &LeaseRef) -> bool {
        match self {
            Mode::Global(g) => g != lease,
            Mode::Unelected => false,
            Mode::PerService | Mode::Sharded(_) => true,
        }
    }

    /// Whether this mode elects one holder per group through a Kubernetes Lease (every
    /// mode but [`Mode::Unelected`]).
    pub fn elects(&self) -> bool {
        !matches!(self, Mode::Unelected)
    }
}

/// The namespace of [`unelected_group`]s' keys: no Kubernetes object has it (a namespace
/// is a DNS label; this one never reaches the API server anyway).
pub const UNELECTED_NAMESPACE: &str = "local";

/// The group of `address` without election ([`Mode::Unelected`]): one per address, named
/// after it, whichever Services use it. The key does not change when the Service that
/// governs a shared address is deleted, so its route stays while another Service uses the
/// address (a per-Service key would stop one group and start another: the route withdrawn
/// and announced again on every node at once, the router left with no path).
pub fn unelected_group(address: IpAddr) -> LeaseRef {
    LeaseRef {
        namespace: UNELECTED_NAMESPACE.to_string(),
        name: address.to_string(),
    }
}

/// Shard leases (`svc_leaseshards`): `count` leases named [`SHARD_LEASE_PREFIX`]`<index>`
/// (index 0 to count - 1) in `namespace`. A Service is placed on the shard with the highest
/// rendezvous score of its UID ([`shard_of`]): every node computes the same placement from
/// the Service alone, and changing `count` from n to n + 1 moves only the Services whose
/// new shard is the new one (about 1/(n + 1) of them); names do not depend on the count,
/// so a shard keeps its lease (and holder) across a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards {
    /// Where the shard leases live: `svc_namespace` when set, else `cp_namespace`.
    pub namespace: String,
    /// `svc_leaseshards`, at least 1.
    pub count: u16,
}

/// Name prefix of shard leases: `vipd-services-shard-0`, `vipd-services-shard-1`, ...
pub const SHARD_LEASE_PREFIX: &str = "vipd-services-shard-";

impl Shards {
    /// The lease of shard `index`.
    pub fn lease(&self, index: u16) -> LeaseRef {
        LeaseRef {
            namespace: self.namespace.clone(),
            name: format!("{SHARD_LEASE_PREFIX}{index}"),
        }
    }

    /// Every shard lease, index 0 first.
    pub fn leases(&self) -> impl Iterator<Item = LeaseRef> + '_ {
        (0..self.count).map(|i| self.lease(i))
    }

    /// The index of `lease` if it is one of these shards (right namespace, the prefix
    /// followed by a canonical decimal index below `count`), else `None`.
    pub fn index_of_lease(&self, lease: &LeaseRef) -> Option<u16> {
        if lease.namespace != self.namespace {
            return None;
        }
        shard_index(&lease.name).filter(|i| *i < self.count)
    }

    /// The shard of a Service identified by `id` (its UID): [`shard_of`].
    pub fn index_of(&self, id: &str) -> u16 {
        shard_of(id, self.count)
    }
}

/// The index in a shard lease's name (`vipd-services-shard-<i>`, `<i>` canonical decimal,
/// no sign or leading zero), whatever the count; `None` for any other name. Pure.
pub fn shard_index(name: &str) -> Option<u16> {
    let digits = name.strip_prefix(SHARD_LEASE_PREFIX)?;
    let i: u16 = digits.parse().ok()?;
    (i.to_string() == digits).then_some(i)
}

/// Rendezvous (highest random weight) hashing: the index in `0..count` whose
/// [`shard_score`] with `id` is highest (the lower index on a tie); 0 when `count` is 0.
/// Stable across processes, versions and architectures (the score is FNV-1a and a fixed
/// mixer, not `std`'s hasher, which may change between Rust releases). Pure.
pub fn shard_of(id: &str, count: u16) -> u16 {
    let mut best = (0u16, 0u64);
    for i in 0..count {
        let score = shard_score(id, i);
        if i == 0 || score > best.1 {
            best = (i, score);
        }
    }
    best.0
}

/// The rendezvous score of `id` on shard `index`: 64-bit FNV-1a over the bytes of `id`,
/// a 0xff separator and `index` (big-endian), finished with the splitmix64 mixer so that
/// nearby indexes score independently. Pure.
pub fn shard_score(id: &str, index: u16) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in id.bytes().chain([0xff]).chain(index.to_be_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// What, besides the mode, decides the lease a Service campaigns under
/// ([`service_lease`]).
#[derive(Debug, Clone, Copy)]
pub struct LeaseChoice<'a> {
    /// The Service.
    pub key: &'a ServiceKey,
    /// `metadata.uid`, if any.
    pub uid: Option<&'a str>,
    /// `externalTrafficPolicy: Local`.
    pub etp_local: bool,
    /// It sets conditions of its own ([`Candidate::own_conditions`]).
    pub own_conditions: bool,
    /// Its per-Service lease (`kubevip-<name>` or the annotation's, in its namespace).
    pub own: &'a LeaseRef,
    /// `own` came from `kube-vip.io/leaseName`.
    pub annotated: bool,
}

/// The lease a Service campaigns under, the one rule the planner and the orphan collector
/// share:
/// * per-Service election: its own lease (`kubevip-<name>`, kube-vip's name, or the
///   `kube-vip.io/leaseName` annotation's);
/// * one lease for all: that lease, except an `externalTrafficPolicy: Local` Service's
///   ([`local_lease`]);
/// * shard leases: a `kube-vip.io/leaseName` annotation's lease (the user grouped those
///   Services); a Service whose candidates are not every node (ETP Local, a node
///   selector or preferred nodes) or with a health check of its own, its [`local_lease`]
///   (a shard's holder must be able to announce all of its Services, and one Service's
///   failing check must not move them all); every other Service its shard ([`Shards::index_of`]
///   of its UID, else of `namespace/name`). Pure.
pub fn service_lease(mode: &Mode, c: &LeaseChoice<'_>) -> LeaseRef {
    match lease_unless_shard(mode, c) {
        Ok(lease) => lease,
        Err(s) => match c.uid {
            Some(uid) => s.lease(s.index_of(uid)),
            None => s.lease(s.index_of(&format!("{}/{}", c.key.namespace, c.key.name))),
        },
    }
}

/// [`service_lease`] short of hashing the Service to its shard: `Err` with the shards when
/// the Service campaigns under one of them (which one costs a hash per shard,
/// [`Shards::index_of`]: the orphan collector, which keeps every current shard's lease
/// anyway, need not know). Pure.
fn lease_unless_shard<'m>(mode: &'m Mode, c: &LeaseChoice<'_>) -> Result<LeaseRef, &'m Shards> {
    match mode {
        // Unelected groups are per address (`unelected_group`); a Service's own lease
        // name is what the orphan collector and `vipd status` would look for.
        Mode::PerService | Mode::Unelected => Ok(c.own.clone()),
        Mode::Global(l) if c.etp_local => Ok(local_lease(&l.namespace, c.key)),
        Mode::Global(l) => Ok(l.clone()),
        Mode::Sharded(_) if c.annotated => Ok(c.own.clone()),
        Mode::Sharded(s) if c.etp_local || c.own_conditions => Ok(local_lease(&s.namespace, c.key)),
        Mode::Sharded(s) => Err(s),
    }
}

/// Settings the plan depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// Election mode.
    pub mode: Mode,
    /// Addresses of the control-plane VIP (governed by the control-plane lease).
    pub control_plane: Vec<IpAddr>,
    /// `vip_servicesinterface`, else `vip_interface`; `None` = automatic.
    pub interface: Option<String>,
    /// Prefix lengths (`vip_subnet`).
    pub subnet: VipSubnet,
}

/// One election group: a lease and the addresses it governs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// VIPs governed by this lease, with their interface.
    pub vips: Vec<VipSpec>,
    /// Whether this node should campaign for it (ETP Local rule, node selector, subnet).
    pub campaign: bool,
    /// When this node does not campaign because of a member's [`Candidate::not_here`]: the
    /// first such reason (for the Event of a holder that hands the group over).
    pub not_here: Option<NotHere>,
    /// The preferred nodes of the oldest member that names any (per-Service election; the
    /// group's elector campaigns by them).
    pub preferred: Vec<String>,
    /// Services whose addresses this group announces (their status is written by the
    /// group's holder).
    pub services: BTreeSet<ServiceKey>,
    /// DHCP Services whose client the group's holder runs, by Service.
    pub dhcp: Vec<DhcpService>,
}

/// A Service not programmed because an older one has the same address, port and protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The Service left out.
    pub service: ServiceKey,
    /// The older Service it collides with.
    pub with: ServiceKey,
    /// The shared address.
    pub address: IpAddr,
    /// Port and protocol both use.
    pub port: PortProto,
}

/// A Service not programmed because an address it shared from a DHCP Service's lease
/// (`vipd.io/dhcp-lease`) is asked for by no DHCP Service now (the DHCP Service was
/// deleted, or its lease lost and replaced: NAKed, declined, expired): the DHCP server may lease that address to
/// another host, so it is not announced as a static address either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LapsedLease {
    /// The Service left out.
    pub service: ServiceKey,
    /// Its addresses that are lapsed leases.
    pub addresses: Vec<IpAddr>,
}

/// A DHCP Service not programmed because an older DHCP Service has its MAC or its macvlan
/// name (a copied `kube-vip.io/hwaddr` or `kube-vip.io/macvlanName`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpConflict {
    /// The Service left out.
    pub service: ServiceKey,
    /// The older Service that has the MAC or macvlan.
    pub with: ServiceKey,
    /// What both use, e.g. `MAC 02:76:69:70:64:42 (kube-vip.io/hwaddr)` or `macvlan vip-lb0`.
    pub what: String,
}

/// The result of [`plan_leases`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Election groups by lease.
    pub groups: BTreeMap<LeaseRef, Group>,
    /// Services left out because of a conflict.
    pub conflicts: Vec<Conflict>,
    /// DHCP Services left out because an older one has their MAC or macvlan name.
    pub dhcp_conflicts: Vec<DhcpConflict>,
    /// Services left out because an address they shared from a DHCP lease lapsed.
    pub lapsed: Vec<LapsedLease>,
    /// Addresses each programmed Service gets, in its configured order.
    pub addresses: BTreeMap<ServiceKey, Vec<IpAddr>>,
    /// Services whose addresses are (partly) the control-plane VIP.
    pub on_control_plane: BTreeSet<ServiceKey>,
}

/// The prefix length a Service VIP `a` is bound with: `vip_subnet`'s for its family.
pub(crate) fn vip_prefix(subnet: &VipSubnet, a: &IpAddr) -> u8 {
    match a {
        IpAddr::V4(_) => subnet.v4,
        IpAddr::V6(_) => subnet.v6,
    }
}

/// Computes the plan (see module docs). Deterministic: the result does not depend on the
/// order of `services`.
pub fn plan_leases(services: &[Candidate], cfg: &PlanConfig) -> Plan {
    let mut ordered: Vec<&Candidate> = services.iter().collect();
    ordered.sort_by(|a, b| {
        (a.created.is_none(), a.created, &a.key).cmp(&(b.created.is_none(), b.created, &b.key))
    });

    let mut out = Plan::default();
    let mut claims = Claims::default();
    // Addresses DHCP Services lease (their `kube-vip.io/requestedIP`), carried by their
    // macvlans: Services naming one concretely (Harvester's share-IP mode) join the DHCP
    // Service's group and are served on its macvlan, never bound on the parent as well
    // (that would be a second MAC, or a second node, answering for the address). The
    // oldest DHCP Service naming an address has it; its ports are claimed there first.
    let mut left_out = dhcp_identity_conflicts(&ordered);
    let dhcp_owned = claim_dhcp_addresses(&ordered, &left_out, cfg, &mut claims);

    for svc in ordered {
        if let Some(c) = left_out.remove(&svc.key) {
            out.dhcp_conflicts.push(c);
            continue;
        }
        place_service(&mut out, &mut claims, &dhcp_owned, svc, cfg);
    }
    for g in out.groups.values_mut() {
        if g.campaign {
            g.not_here = None;
        }
    }
    out
}

/// What the planner has handed out so far. Hash maps: only looked up, never iterated (so
/// the plan does not depend on their order), and at 10 000 Services the ordered maps'
/// address comparisons were the largest part of a plan.
#[derive(Default)]
struct Claims {
    /// (address, port, protocol) -> first Service using it.
    ports: std::collections::HashMap<(IpAddr, i32, String), ServiceKey>,
    /// address -> governing lease.
    governing: std::collections::HashMap<IpAddr, LeaseRef>,
    /// Addresses already in their governing lease's group's VIPs (an address has one
    /// governing lease, so one group).
    placed: std::collections::HashSet<IpAddr>,
}

/// The DHCP Services left out for their identity on the segment (`ordered` by age).
///
/// A DHCP Service's identity on the segment is its MAC (and, on the holder, its
/// macvlan's name): the oldest DHCP Service with a MAC or a macvlan name has it; a newer
/// one with the same (a copied `kube-vip.io/hwaddr` or `kube-vip.io/macvlanName`) is
/// left out with a [`DhcpConflict`]: two clients with one MAC share one DHCP lease, and
/// their holders would answer for it from two nodes with that MAC.
fn dhcp_identity_conflicts(ordered: &[&Candidate]) -> BTreeMap<ServiceKey, DhcpConflict> {
    let mut macs: BTreeMap<[u8; 6], &ServiceKey> = BTreeMap::new();
    let mut macvlans: BTreeMap<&str, &ServiceKey> = BTreeMap::new();
    let mut left_out: BTreeMap<ServiceKey, DhcpConflict> = BTreeMap::new();
    // A Service whose MAC vipd derived from its own UID has it before any other (a copy
    // made within the same second would otherwise win on its name), then by age.
    let mut by_identity: Vec<&&Candidate> = ordered.iter().collect();
    by_identity.sort_by_key(|c| !c.dhcp.as_ref().is_some_and(|r| r.mac_is_derived()));
    for svc in by_identity {
        let Some(r) = svc.dhcp.as_ref() else {
            continue;
        };
        let dup = match (macs.get(&r.mac), macvlans.get(r.macvlan.as_str())) {
            (Some(with), _) => Some((
                format!("MAC {} (kube-vip.io/hwaddr)", fmt_mac(r.mac)),
                *with,
            )),
            (None, Some(with)) => Some((format!("macvlan {}", r.macvlan), *with)),
            (None, None) => None,
        };
        match dup {
            Some((what, with)) => {
                left_out.insert(
                    svc.key.clone(),
                    DhcpConflict {
                        service: svc.key.clone(),
                        with: with.clone(),
                        what,
                    },
                );
            }
            None => {
                macs.insert(r.mac, &svc.key);
                macvlans.insert(r.macvlan.as_str(), &svc.key);
            }
        }
    }
    left_out
}

/// The addresses DHCP Services request and have (`ordered` by age, those `left_out`
/// skipped), governed by their own lease, their ports claimed first.
///
/// A DHCP Service asking for an address (requestedIP) that an older Service of another
/// namespace names concretely does not take it over (one annotation must not move
/// another tenant's address); it asks the DHCP server like for any address, and the
/// conflict probe before use declines it while the older Service answers. In its own
/// namespace it does: Harvester's share-IP Services and its upgrade flow (a DHCP
/// Service re-created with the old MAC and address) live there.
fn claim_dhcp_addresses(
    ordered: &[&Candidate],
    left_out: &BTreeMap<ServiceKey, DhcpConflict>,
    cfg: &PlanConfig,
    claims: &mut Claims,
) -> BTreeSet<IpAddr> {
    let mut first_static: BTreeMap<IpAddr, Vec<(usize, &str)>> = BTreeMap::new();
    for (i, svc) in ordered.iter().enumerate() {
        for a in &svc.addresses {
            first_static
                .entry(*a)
                .or_default()
                .push((i, svc.key.namespace.as_str()));
        }
    }
    let mut dhcp_owned: BTreeSet<IpAddr> = BTreeSet::new();
    for (i, svc) in ordered.iter().enumerate() {
        let Some(request) = svc.dhcp.as_ref() else {
            continue;
        };
        if left_out.contains_key(&svc.key) {
            continue;
        }
        for a in request.requested_addresses() {
            if cfg.control_plane.contains(&a)
                || first_static.get(&a).is_some_and(|users| {
                    users
                        .iter()
                        .any(|(j, ns)| *j < i && *ns != svc.key.namespace)
                })
                || !dhcp_owned.insert(a)
            {
                continue;
            }
            claims.governing.insert(a, own_lease(svc, cfg));
            for p in &svc.ports {
                claims
                    .ports
                    .entry((a, p.port, p.protocol.clone()))
                    .or_insert_with(|| svc.key.clone());
            }
        }
    }
    dhcp_owned
}

/// Places one Service (in age order) in the plan: left out when an address of its DHCP
/// lease lapsed or one of its ports is taken, else its addresses join the groups of their
/// governing leases and its DHCP client its own lease's group.
fn place_service(
    out: &mut Plan,
    claims: &mut Claims,
    dhcp_owned: &BTreeSet<IpAddr>,
    svc: &Candidate,
    cfg: &PlanConfig,
) {
    let lapsed: Vec<IpAddr> = svc
        .addresses
        .iter()
        .filter(|a| svc.dhcp_lease_marks.contains(a) && !dhcp_owned.contains(a))
        .copied()
        .collect();
    if !lapsed.is_empty() {
        out.lapsed.push(LapsedLease {
            service: svc.key.clone(),
            addresses: lapsed,
        });
        return;
    }
    let clash = svc.addresses.iter().find_map(|a| {
        svc.ports.iter().find_map(|p| {
            claims
                .ports
                .get(&(*a, p.port, p.protocol.clone()))
                .filter(|other| **other != svc.key)
                .map(|other| (*a, p.clone(), other.clone()))
        })
    });
    if let Some((address, port, with)) = clash {
        out.conflicts.push(Conflict {
            service: svc.key.clone(),
            with,
            address,
            port,
        });
        return;
    }
    for a in &svc.addresses {
        for p in &svc.ports {
            claims
                .ports
                .insert((*a, p.port, p.protocol.clone()), svc.key.clone());
        }
    }
    out.addresses.insert(svc.key.clone(), svc.addresses.clone());
    for a in &svc.addresses {
        if cfg.control_plane.contains(a) {
            out.on_control_plane.insert(svc.key.clone());
            continue;
        }
        let lease = match cfg.mode {
            Mode::Unelected => unelected_group(*a),
            _ => claims
                .governing
                .entry(*a)
                .or_insert_with(|| own_lease(svc, cfg))
                .clone(),
        };
        let group = join_group(out, lease, svc, cfg);
        if dhcp_owned.contains(a) {
            // On the DHCP Service's macvlan (its holder's effective VIPs).
            continue;
        }
        let vip = Vip {
            addr: *a,
            prefix: vip_prefix(&cfg.subnet, a),
        };
        if claims.placed.insert(*a) {
            group.vips.push(VipSpec {
                vip,
                interface: svc.interface.clone().or_else(|| cfg.interface.clone()),
                not_after: None,
            });
        }
    }
    if let Some(request) = svc.dhcp.as_ref().filter(|_| cfg.mode.elects()) {
        // Without election no DHCP client runs (every node would ask for the Service's
        // MAC). The Service's own lease governs its DHCP client (per-Service election), or
        // the global one; the leased address is not known in advance, so no other
        // lease competes for it.
        let group = join_group(out, own_lease(svc, cfg), svc, cfg);
        let mut request = request.clone();
        // The macvlan's parent: the Service's annotation, else the configured Services
        // interface, else (None) the automatic one, resolved by the holder.
        request.parent = request.parent.or_else(|| cfg.interface.clone());
        group.dhcp.push(DhcpService {
            key: svc.key.clone(),
            request,
        });
    }
}

/// The lease a Service described by `info` campaigns under in `mode` ([`service_lease`]):
/// what the orphan collector and `vipd status` compute from the Service objects.
pub(crate) fn info_lease(mode: &Mode, info: &super::model::ServiceInfo) -> LeaseRef {
    service_lease(mode, &info_choice(info, &info.own_lease()))
}

/// The lease `info`'s Service campaigns under when it is not a shard's, `None` when it
/// is one of `mode`'s shards ([`lease_unless_shard`]: the shard is not computed).
pub(crate) fn info_lease_beside_shards(
    mode: &Mode,
    info: &super::model::ServiceInfo,
) -> Option<LeaseRef> {
    lease_unless_shard(mode, &info_choice(info, &info.own_lease())).ok()
}

/// The [`LeaseChoice`] of `info`, whose own lease is `own`.
fn info_choice<'a>(info: &'a super::model::ServiceInfo, own: &'a LeaseRef) -> LeaseChoice<'a> {
    LeaseChoice {
        key: &info.key,
        uid: info.uid.as_deref(),
        etp_local: info.etp_local,
        own_conditions: info.own_conditions(),
        own,
        annotated: info.lease_name_from_annotation,
    }
}

/// The lease `svc` campaigns under ([`service_lease`]).
fn own_lease(svc: &Candidate, cfg: &PlanConfig) -> LeaseRef {
    service_lease(
        &cfg.mode,
        &LeaseChoice {
            key: &svc.key,
            uid: svc.uid.as_deref(),
            etp_local: svc.etp_local,
            own_conditions: svc.own_conditions,
            own: &svc.lease,
            annotated: svc.lease_annotated,
        },
    )
}

/// A Service's own lease beside shared ones (one lease for all, or shard leases), for a
/// Service that not every node may announce (`externalTrafficPolicy: Local`; under shard
/// leases also a node selector or preferred nodes): `vipd-local.<namespace>.<name>` in
/// `namespace`, the shared leases' (where vipd already reads and writes leases, so no
/// other RBAC is needed). A Lease name is a DNS subdomain (up to 253 characters): a
/// namespace (a DNS label) and a Service name (a DNS-1035 label) joined by dots always
/// make one.
pub fn local_lease(namespace: &str, svc: &ServiceKey) -> LeaseRef {
    LeaseRef {
        namespace: namespace.to_string(),
        name: format!("{LOCAL_LEASE_PREFIX}{}.{}", svc.namespace, svc.name),
    }
}

/// The name prefix of [`local_lease`]s.
pub const LOCAL_LEASE_PREFIX: &str = "vipd-local.";

/// Adds `svc` to the group of `lease` (created when new); the node campaigns for it when
/// `svc` is eligible here (the ETP Local rule, and [`Candidate::not_here`] is `None`), for
/// the global lease always, and for a shard lease unless a member is not eligible here.
fn join_group<'a>(
    out: &'a mut Plan,
    lease: LeaseRef,
    svc: &Candidate,
    cfg: &PlanConfig,
) -> &'a mut Group {
    let shared = cfg.mode.is_shared(&lease);
    let group = out.groups.entry(lease).or_insert_with(|| Group {
        vips: Vec::new(),
        campaign: shared,
        not_here: None,
        preferred: Vec::new(),
        services: BTreeSet::new(),
        dhcp: Vec::new(),
    });
    if group.preferred.is_empty() && matches!(cfg.mode, Mode::PerService) {
        group.preferred = svc.preferred.clone();
    }
    group.services.insert(svc.key.clone());
    if shared && matches!(cfg.mode, Mode::Sharded(_)) {
        // A shard's holder announces all of its Services: a node that may not announce
        // one of them (the subnet rule) does not campaign for the shard.
        if svc.not_here.is_some() {
            group.campaign = false;
        }
    } else if (!svc.etp_local || svc.local_endpoint) && svc.not_here.is_none() {
        group.campaign = true;
    }
    if group.not_here.is_none() {
        group.not_here = svc.not_here.clone();
    }
    group
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ServiceKey {
        ServiceKey {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn port(port: i32, proto: &str) -> PortProto {
        PortProto {
            port,
            protocol: proto.into(),
        }
    }

    fn svc(name: &str, created: i64, addrs: &[&str], ports: &[(i32, &str)]) -> Candidate {
        Candidate {
            key: key(name),
            created: Some(Timestamp::from_second(created).unwrap()),
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            ports: ports.iter().map(|(p, pr)| port(*p, pr)).collect(),
            etp_local: false,
            local_endpoint: false,
            interface: None,
            lease: LeaseRef {
                namespace: "default".into(),
                name: format!("kubevip-{name}"),
            },
            not_here: None,
            preferred: Vec::new(),
            dhcp: None,
            dhcp_lease_marks: Vec::new(),
            uid: Some(format!("uid-{name}")),
            own_conditions: false,
            lease_annotated: false,
        }
    }

    fn cfg(mode: Mode) -> PlanConfig {
        PlanConfig {
            mode,
            control_plane: vec!["192.0.2.10".parse().unwrap()],
            interface: None,
            subnet: VipSubnet { v4: 32, v6: 128 },
        }
    }

    fn lease(name: &str) -> LeaseRef {
        LeaseRef {
            namespace: "default".into(),
            name: format!("kubevip-{name}"),
        }
    }

    #[test]
    fn each_service_gets_its_own_group_in_per_service_mode() {
        let p = plan_leases(
            &[
                svc("a", 1, &["192.0.2.20"], &[(80, "TCP")]),
                svc("b", 2, &["192.0.2.21", "2001:db8::21"], &[(80, "TCP")]),
            ],
            &cfg(Mode::PerService),
        );
        assert_eq!(p.groups.len(), 2);
        let b = &p.groups[&lease("b")];
        assert_eq!(b.vips.len(), 2);
        assert_eq!(b.vips[1].vip.prefix, 128);
        assert!(b.campaign);
        assert!(p.conflicts.is_empty());
    }

    /// Without election every address is a group of its own, named after it; a node
    /// campaigns for it when it may serve any Service using it (ETP Cluster anywhere, ETP
    /// Local only with a ready local endpoint); deleting the oldest user of a shared
    /// address keeps its group; no DHCP client runs.
    #[test]
    fn unelected_groups_are_per_address_and_follow_the_local_endpoints() {
        let mut local = svc("local", 3, &["192.0.2.30", "2001:db8::30"], &[(80, "TCP")]);
        local.etp_local = true;
        let services = [
            svc("web", 1, &["192.0.2.20"], &[(80, "TCP")]),
            svc("dns", 2, &["192.0.2.20"], &[(53, "UDP")]),
            local.clone(),
        ];
        let p = plan_leases(&services, &cfg(Mode::Unelected));
        let g = unelected_group("192.0.2.20".parse().unwrap());
        assert_eq!(g.to_string(), "local/192.0.2.20");
        assert_eq!(p.groups.len(), 3, "{:?}", p.groups.keys());
        assert_eq!(p.groups[&g].services.len(), 2);
        assert!(p.groups[&g].campaign);
        let v6 = unelected_group("2001:db8::30".parse().unwrap());
        assert!(!p.groups[&v6].campaign, "no local endpoint: no route");
        assert!(!Mode::Unelected.collectable(&g) && !Mode::Unelected.is_shared(&g));
        // The governing Service deleted: the same group, with the other one.
        let p2 = plan_leases(&services[1..], &cfg(Mode::Unelected));
        assert_eq!(p2.groups[&g].vips, p.groups[&g].vips);
        assert!(p2.groups[&g].campaign);
        // A local endpoint: both of the Local Service's groups campaign.
        local.local_endpoint = true;
        let p3 = plan_leases(&[local.clone()], &cfg(Mode::Unelected));
        assert!(p3.groups.values().all(|g| g.campaign));
        // A Local Service without endpoint sharing a Cluster one's address: routed.
        let mut shy = svc("shy", 4, &["192.0.2.20"], &[(443, "TCP")]);
        shy.etp_local = true;
        let p4 = plan_leases(&[services[0].clone(), shy], &cfg(Mode::Unelected));
        assert!(p4.groups[&g].campaign);
        // A DHCP Service: no client without election.
        let mut dhcp = svc("dhcp", 5, &["0.0.0.0"], &[(80, "TCP")]);
        dhcp.addresses.clear();
        dhcp.dhcp = Some(DhcpRequest {
            macvlan: "vip-dhcp".into(),
            mac: [2, 0, 0, 0, 0, 1],
            mac_generated: true,
            v4: true,
            v6: false,
            requested: None,
            requested_v6: None,
            hostname: None,
            broadcast: false,
            rp_filter: 0,
            parent: None,
            mark: String::new(),
        });
        let p5 = plan_leases(&[dhcp], &cfg(Mode::Unelected));
        assert!(p5.groups.values().all(|g| g.dhcp.is_empty()), "{p5:?}");
    }

    #[test]
    fn shared_address_is_governed_by_the_oldest_service_only() {
        // S06: dns-tcp and dns-udp on one address: one group, both services in it.
        let services = [
            svc("dns-udp", 2, &["192.0.2.60"], &[(53, "UDP")]),
            svc("dns-tcp", 1, &["192.0.2.60"], &[(53, "TCP")]),
        ];
        let p = plan_leases(&services, &cfg(Mode::PerService));
        assert_eq!(p.groups.len(), 1);
        let g = &p.groups[&lease("dns-tcp")];
        assert_eq!(g.services.len(), 2);
        assert_eq!(g.vips.len(), 1);
        // Deleting dns-udp keeps the address; deleting dns-tcp moves it to dns-udp's lease.
        let p = plan_leases(&services[1..], &cfg(Mode::PerService));
        assert_eq!(p.groups[&lease("dns-tcp")].vips.len(), 1);
        let p = plan_leases(&services[..1], &cfg(Mode::PerService));
        assert_eq!(p.groups[&lease("dns-udp")].vips.len(), 1);
    }

    #[test]
    fn control_plane_vip_used_by_a_service_stays_with_the_control_plane() {
        let p = plan_leases(
            &[svc("api", 1, &["192.0.2.10"], &[(443, "TCP")])],
            &cfg(Mode::PerService),
        );
        assert!(p.groups.is_empty(), "no service group may hold the CP VIP");
        assert!(p.on_control_plane.contains(&key("api")));
    }

    #[test]
    fn same_address_port_and_protocol_conflicts_later_service_is_left_out() {
        // S07
        let p = plan_leases(
            &[
                svc("svc-b", 2, &["192.0.2.70"], &[(80, "TCP")]),
                svc("svc-a", 1, &["192.0.2.70"], &[(80, "TCP")]),
                svc("svc-c", 3, &["192.0.2.70"], &[(80, "UDP")]),
            ],
            &cfg(Mode::PerService),
        );
        assert_eq!(p.conflicts.len(), 1);
        assert_eq!(p.conflicts[0].service, key("svc-b"));
        assert_eq!(p.conflicts[0].with, key("svc-a"));
        assert!(!p.addresses.contains_key(&key("svc-b")));
        assert!(
            p.addresses.contains_key(&key("svc-c")),
            "80/UDP next to 80/TCP is fine"
        );
        assert_eq!(p.groups[&lease("svc-a")].services.len(), 2);
    }

    #[test]
    fn etp_local_campaigns_only_with_a_local_endpoint() {
        // S21
        let mut s = svc("web", 1, &["192.0.2.80"], &[(80, "TCP")]);
        s.etp_local = true;
        let p = plan_leases(std::slice::from_ref(&s), &cfg(Mode::PerService));
        assert!(!p.groups[&lease("web")].campaign);
        s.local_endpoint = true;
        let p = plan_leases(&[s], &cfg(Mode::PerService));
        assert!(p.groups[&lease("web")].campaign);
    }

    /// Issue 26 (harvester #6944): with one lease for all, a Local Service gets a lease of
    /// its own in the global lease's namespace, campaigned for only by a node with a ready
    /// endpoint; Cluster Services stay under the global lease, which every node campaigns
    /// for; a Cluster Service sharing the Local one's address (the Local one older) joins
    /// its group, which every node then campaigns for.
    #[test]
    fn a_local_service_under_one_lease_for_all_gets_its_own_lease() {
        let global = LeaseRef {
            namespace: "kube-system".into(),
            name: "plndr-svcs-lock".into(),
        };
        let mode = Mode::Global(global.clone());
        let mut web = svc("web", 1, &["192.0.2.80"], &[(80, "TCP")]);
        web.etp_local = true;
        let api = svc("api", 2, &["192.0.2.81"], &[(443, "TCP")]);
        let own = local_lease(&global.namespace, &web.key);
        assert_eq!(
            (own.namespace.as_str(), own.name.as_str()),
            ("kube-system", "vipd-local.default.web")
        );
        let p = plan_leases(&[web.clone(), api.clone()], &cfg(mode.clone()));
        assert_eq!(p.groups.len(), 2);
        assert!(!p.groups[&own].campaign, "no local endpoint here");
        assert_eq!(p.groups[&own].vips[0].vip.addr.to_string(), "192.0.2.80");
        assert!(p.groups[&global].campaign);
        assert_eq!(
            p.groups[&global].services,
            BTreeSet::from([api.key.clone()])
        );
        web.local_endpoint = true;
        let p = plan_leases(&[web.clone(), api.clone()], &cfg(mode.clone()));
        assert!(p.groups[&own].campaign);
        // A Cluster Service on the same address, newer: it joins the Local one's group.
        web.local_endpoint = false;
        let mut shared = svc("web-udp", 3, &["192.0.2.80"], &[(53, "UDP")]);
        shared.lease = lease("web-udp");
        let p = plan_leases(&[web.clone(), shared], &cfg(mode.clone()));
        assert!(p.groups[&own].campaign && p.groups[&own].services.len() == 2);
        // Back to Cluster: the global lease again.
        web.etp_local = false;
        let p = plan_leases(&[web], &cfg(mode));
        assert_eq!(p.groups.keys().collect::<Vec<_>>(), [&global]);
    }

    #[test]
    fn a_node_the_service_is_not_for_does_not_campaign_and_keeps_the_reason() {
        // S47 / S48: node selector mismatch, VIP outside the node's subnets.
        let mut s = svc("web", 1, &["192.0.2.80"], &[(80, "TCP")]);
        s.not_here = Some(NotHere {
            reason: "subnet",
            message: "no subnet connected to the node contains 192.0.2.80".into(),
        });
        let p = plan_leases(std::slice::from_ref(&s), &cfg(Mode::PerService));
        let g = &p.groups[&lease("web")];
        assert!(!g.campaign);
        assert_eq!(g.not_here, s.not_here);
        // A member this node may announce (sharing the address) keeps the group.
        let mut t = svc("web-udp", 2, &["192.0.2.80"], &[(80, "UDP")]);
        let p = plan_leases(&[s.clone(), t.clone()], &cfg(Mode::PerService));
        let g = &p.groups[&lease("web")];
        assert!(g.campaign && g.not_here.is_none());
        // Even with a local endpoint, an ETP Local Service stays off this node.
        s.etp_local = true;
        s.local_endpoint = true;
        t.not_here = s.not_here.clone();
        let p = plan_leases(&[s, t], &cfg(Mode::PerService));
        assert!(!p.groups[&lease("web")].campaign);
    }

    #[test]
    fn a_group_campaigns_by_the_preferred_nodes_of_its_oldest_member_that_names_any() {
        let a = svc("a", 1, &["192.0.2.60"], &[(53, "TCP")]);
        let mut b = svc("b", 2, &["192.0.2.60"], &[(53, "UDP")]);
        b.preferred = vec!["node-b".into()];
        let mut c = svc("c", 3, &["192.0.2.60"], &[(80, "TCP")]);
        c.preferred = vec!["node-c".into()];
        let p = plan_leases(&[c.clone(), b, a], &cfg(Mode::PerService));
        assert_eq!(p.groups[&lease("a")].preferred, ["node-b"]);
        // One lease for all: no per-Service preference.
        let global = LeaseRef {
            namespace: "kube-system".into(),
            name: "plndr-svcs-lock".into(),
        };
        let p = plan_leases(&[c], &cfg(Mode::Global(global.clone())));
        assert!(p.groups[&global].preferred.is_empty());
    }

    #[test]
    fn global_mode_has_one_group_for_everything() {
        let global = LeaseRef {
            namespace: "kube-system".into(),
            name: "plndr-svcs-lock".into(),
        };
        let p = plan_leases(
            &[
                svc("a", 1, &["192.0.2.20"], &[(80, "TCP")]),
                svc("b", 2, &["192.0.2.21"], &[(80, "TCP")]),
            ],
            &cfg(Mode::Global(global.clone())),
        );
        assert_eq!(p.groups.len(), 1);
        assert_eq!(p.groups[&global].vips.len(), 2);
        assert!(p.groups[&global].campaign);
    }

    fn shards(count: u16) -> Shards {
        Shards {
            namespace: "kube-system".into(),
            count,
        }
    }

    /// Issue 28: the placement is a pure function of the UID (the same on every node and
    /// in every version: these values are pinned), spreads evenly, and a change of count
    /// from n to n + 1 moves only Services onto the new shard, about 1/(n + 1) of them.
    #[test]
    fn shard_placement_is_stable_even_and_moves_few_on_a_count_change() {
        assert_eq!(shard_score("uid-a", 0), shard_score("uid-a", 0));
        assert_ne!(shard_score("uid-a", 0), shard_score("uid-a", 1));
        // Pinned: a change of hash would move every Service of a running cluster.
        // (computed apart from this code, in Python, from the algorithm in the doc comment.)
        assert_eq!(shard_score("", 0), 0x761e_40d0_e958_082d);
        assert_eq!(shard_of("any", 1), 0);
        assert_eq!(shard_of("any", 0), 0);
        let ids: Vec<String> = (0..8000).map(|i| format!("9f1c2e4a-{i:04x}-uid")).collect();
        let mut per = [0usize; 8];
        for id in &ids {
            per[usize::from(shard_of(id, 8))] += 1;
        }
        // 1000 expected per shard; a fair hash stays well within +-15 %.
        assert!(per.iter().all(|n| (850..=1150).contains(n)), "{per:?}");
        let moved: Vec<&String> = ids
            .iter()
            .filter(|id| shard_of(id, 8) != shard_of(id, 9))
            .collect();
        assert!(moved.iter().all(|id| shard_of(id, 9) == 8));
        // 8000 / 9 = 889 expected.
        assert!((750..=1030).contains(&moved.len()), "{}", moved.len());
    }

    #[test]
    fn shard_lease_names_parse_back_and_only_current_shards_are_shared() {
        let s = shards(4);
        assert_eq!(s.lease(3).name, "vipd-services-shard-3");
        assert_eq!(s.index_of_lease(&s.lease(3)), Some(3));
        assert_eq!(shard_index("vipd-services-shard-12"), Some(12));
        for bad in [
            "vipd-services-shard-",
            "vipd-services-shard-03",
            "vipd-services-shard-+3",
            "vipd-services-shard-3a",
            "kubevip-web",
        ] {
            assert_eq!(shard_index(bad), None, "{bad}");
        }
        let mode = Mode::Sharded(s.clone());
        assert!(mode.is_shared(&s.lease(0)));
        // Beyond the count (after it shrank), or in another namespace: not shared, so
        // deleted once its Services have moved.
        assert!(!mode.is_shared(&shards(5).lease(4)));
        let mut elsewhere = s.lease(0);
        elsewhere.namespace = "default".into();
        assert!(!mode.is_shared(&elsewhere));
        assert!(mode.collectable(&s.lease(0)));
        let global = lease("plndr-svcs-lock");
        assert!(!Mode::Global(global.clone()).collectable(&global));
    }

    /// Issue 28: under shard leases the Services of a shard form one group every node
    /// campaigns for; ETP Local, node-selector and preferred-nodes Services keep their own
    /// `vipd-local.` lease (candidates differ), an annotated common lease stays; a shared
    /// address goes to the oldest Service's lease.
    #[test]
    fn shard_mode_groups_services_by_shard_and_keeps_own_leases_where_candidates_differ() {
        let s = shards(2);
        let mode = Mode::Sharded(s.clone());
        let mut all: Vec<Candidate> = (0..20)
            .map(|i| {
                svc(
                    &format!("s{i}"),
                    i,
                    &[&format!("192.0.2.{}", 100 + i)],
                    &[(80, "TCP")],
                )
            })
            .collect();
        let mut local = svc("local", 30, &["192.0.2.150"], &[(80, "TCP")]);
        local.etp_local = true;
        let mut picky = svc("picky", 31, &["192.0.2.151"], &[(80, "TCP")]);
        picky.own_conditions = true;
        picky.not_here = Some(NotHere {
            reason: "node-selector",
            message: "labels do not match".into(),
        });
        let mut grouped = svc("grouped", 32, &["192.0.2.152"], &[(80, "TCP")]);
        grouped.lease = lease("common");
        grouped.lease_annotated = true;
        // Shares s0's address on another port: governed by s0's shard.
        let sharer = svc("sharer", 40, &["192.0.2.100"], &[(443, "TCP")]);
        all.extend([local, picky, grouped, sharer]);
        let p = plan_leases(&all, &cfg(mode));
        let shard0 = &p.groups[&s.lease(0)];
        let shard1 = &p.groups[&s.lease(1)];
        assert!(shard0.campaign && shard1.campaign);
        assert_eq!(shard0.services.len() + shard1.services.len(), 21);
        assert!(shard0.services.len() >= 5 && shard1.services.len() >= 5);
        for i in 0..20 {
            let k = key(&format!("s{i}"));
            let want = s.lease(s.index_of(&format!("uid-s{i}")));
            assert!(p.groups[&want].services.contains(&k), "s{i}");
        }
        let s0 = s.lease(s.index_of("uid-s0"));
        assert!(p.groups[&s0].services.contains(&key("sharer")));
        let local = &p.groups[&local_lease("kube-system", &key("local"))];
        assert!(!local.campaign, "no local endpoint here");
        let picky = &p.groups[&local_lease("kube-system", &key("picky"))];
        assert!(!picky.campaign);
        assert_eq!(
            picky.not_here.as_ref().map(|n| n.reason),
            Some("node-selector")
        );
        assert!(p.groups[&lease("common")].campaign);
        assert_eq!(p.groups.len(), 5);
    }

    /// A node that may not announce one Service of a shard (the subnet rule) does not
    /// campaign for the shard: its holder must announce every Service on it.
    #[test]
    fn a_node_campaigns_for_a_shard_only_when_it_may_announce_all_of_it() {
        let s = shards(1);
        let a = svc("a", 1, &["192.0.2.20"], &[(80, "TCP")]);
        let mut b = svc("b", 2, &["198.51.100.20"], &[(80, "TCP")]);
        b.not_here = Some(NotHere {
            reason: "subnet",
            message: "no subnet connected to the node contains 198.51.100.20".into(),
        });
        let p = plan_leases(&[a.clone(), b], &cfg(Mode::Sharded(s.clone())));
        let g = &p.groups[&s.lease(0)];
        assert!(!g.campaign);
        assert_eq!(g.not_here.as_ref().map(|n| n.reason), Some("subnet"));
        let p = plan_leases(&[a], &cfg(Mode::Sharded(s.clone())));
        assert!(p.groups[&s.lease(0)].campaign);
    }

    #[test]
    fn order_of_input_does_not_matter() {
        let a = svc("a", 1, &["192.0.2.60"], &[(53, "TCP")]);
        let b = svc("b", 2, &["192.0.2.60"], &[(53, "TCP")]);
        let c = svc("c", 3, &["192.0.2.61"], &[(53, "TCP")]);
        let p1 = plan_leases(&[a.clone(), b.clone(), c.clone()], &cfg(Mode::PerService));
        let p2 = plan_leases(&[c, b, a], &cfg(Mode::PerService));
        assert_eq!(p1, p2);
    }

    #[test]
    fn interface_annotation_beats_configured_interface() {
        let mut c = cfg(Mode::PerService);
        c.interface = Some("eth0".into());
        let mut s = svc("a", 1, &["192.0.2.20"], &[(80, "TCP")]);
        let p = plan_leases(std::slice::from_ref(&s), &c);
        assert_eq!(
            p.groups[&lease("a")].vips[0].interface.as_deref(),
            Some("eth0")
        );
        s.interface = Some("eth1".into());
        let p = plan_leases(&[s], &c);
        assert_eq!(
            p.groups[&lease("a")].vips[0].interface.as_deref(),
            Some("eth1")
        );
    }

    /// Issue 13, Harvester's share-IP mode: Services naming a DHCP Service's leased address
    /// (its requestedIP) join its group and are never bound on the parent (the macvlan
    /// carries the address), whatever their age and the election mode; the same port is a
    /// conflict with the DHCP Service.
    #[test]
    fn services_sharing_a_dhcp_address_join_its_group_without_a_second_binding() {
        let mut svc_dhcp = k8s_openapi::api::core::v1::Service::default();
        svc_dhcp.metadata.name = Some("primary".into());
        svc_dhcp.metadata.namespace = Some("default".into());
        svc_dhcp.metadata.uid = Some("uidprimary".into());
        svc_dhcp.metadata.annotations = Some(
            [
                (
                    crate::services::plan::model::ANN_LOADBALANCER_IPS.to_string(),
                    "0.0.0.0".to_string(),
                ),
                (
                    crate::services::plan::model::ANN_REQUESTED_IP.to_string(),
                    "192.0.2.205".to_string(),
                ),
            ]
            .into(),
        );
        let info = crate::services::plan::model::service_info(&svc_dhcp);
        let mut primary = svc("primary", 2, &[], &[(80, "TCP")]);
        primary.dhcp = Some(crate::services::plan::model::dhcp_request(&info).unwrap());
        // Older than the primary, and newer: both share; a third uses the primary's port.
        let older = svc("older", 1, &["192.0.2.205"], &[(443, "TCP")]);
        let newer = svc("newer", 3, &["192.0.2.205"], &[(8080, "TCP")]);
        let clash = svc("clash", 4, &["192.0.2.205"], &[(80, "TCP")]);
        let other = svc("other", 5, &["192.0.2.21"], &[(80, "TCP")]);
        let all = [primary, older, newer, clash, other];
        for mode in [
            Mode::PerService,
            Mode::Global(LeaseRef {
                namespace: "kube-system".into(),
                name: "plndr-svcs-lock".into(),
            }),
            Mode::Sharded(shards(3)),
        ] {
            let p = plan_leases(&all, &cfg(mode.clone()));
            let governing = match &mode {
                Mode::PerService => lease("primary"),
                Mode::Global(l) => l.clone(),
                Mode::Sharded(s) => s.lease(s.index_of("uid-primary")),
                Mode::Unelected => unreachable!("not among the modes"),
            };
            let g = &p.groups[&governing];
            assert_eq!(g.dhcp.len(), 1, "{mode:?}");
            assert!(g.services.contains(&key("older")) && g.services.contains(&key("newer")));
            assert!(
                p.groups.values().all(|g| g
                    .vips
                    .iter()
                    .all(|v| v.vip.addr.to_string() != "192.0.2.205")),
                "{mode:?}: the shared DHCP address is never bound on the parent: {p:?}"
            );
            assert_eq!(
                p.addresses[&key("newer")],
                ["192.0.2.205".parse::<IpAddr>().unwrap()]
            );
            assert!(
                !p.groups.contains_key(&lease("older")) && !p.groups.contains_key(&lease("newer"))
            );
            assert_eq!(p.conflicts.len(), 1, "{mode:?}");
            assert_eq!(p.conflicts[0].service, key("clash"));
            assert_eq!(p.conflicts[0].with, key("primary"));
            // An unrelated static address is bound as before.
            assert!(p.groups.values().any(|g| {
                g.vips
                    .iter()
                    .any(|v| v.vip.addr.to_string() == "192.0.2.21")
            }));
        }
    }

    /// Trial finding F3: a Service that shared a DHCP lease's address (its
    /// `vipd.io/dhcp-lease` record names it) is served on the DHCP Service's macvlan while a
    /// DHCP Service asks for the address, and left out (never bound on the parent as a
    /// static address) once none does: the DHCP Service deleted, or its address NAKed and
    /// replaced. The same address without the record is an ordinary static one.
    #[test]
    fn an_address_shared_from_a_lapsed_dhcp_lease_is_not_announced_as_static() {
        let primary = |requested: &str| {
            dhcp_svc(
                "primary",
                2,
                &[(crate::services::plan::model::ANN_REQUESTED_IP, requested)],
            )
        };
        let mut marked = svc("sharer", 3, &["192.0.2.205"], &[(443, "TCP")]);
        marked.dhcp_lease_marks = vec!["192.0.2.205".parse().unwrap()];
        let unmarked = svc("sharer", 3, &["192.0.2.205"], &[(443, "TCP")]);
        let bound_anywhere = |p: &Plan| {
            p.groups.values().any(|g| {
                g.vips
                    .iter()
                    .any(|v| v.vip.addr.to_string() == "192.0.2.205")
            })
        };
        for mode in [
            Mode::PerService,
            Mode::Global(LeaseRef {
                namespace: "kube-system".into(),
                name: "plndr-svcs-lock".into(),
            }),
        ] {
            // Still the primary's lease: shared on its macvlan.
            let p = plan_leases(
                &[primary("192.0.2.205"), marked.clone()],
                &cfg(mode.clone()),
            );
            assert!(p.lapsed.is_empty(), "{p:?}");
            assert!(p.addresses.contains_key(&key("sharer")));
            assert!(!bound_anywhere(&p));
            // NAKed and replaced, or the primary deleted: left out, never bound.
            for all in [
                vec![primary("192.0.2.207"), marked.clone()],
                vec![marked.clone()],
            ] {
                let p = plan_leases(&all, &cfg(mode.clone()));
                assert_eq!(
                    p.lapsed,
                    vec![LapsedLease {
                        service: key("sharer"),
                        addresses: vec!["192.0.2.205".parse().unwrap()],
                    }],
                    "{mode:?}"
                );
                assert!(!p.addresses.contains_key(&key("sharer")));
                assert!(!bound_anywhere(&p), "{mode:?}: {p:?}");
            }
            // Without the record: a static address, as before.
            let p = plan_leases(std::slice::from_ref(&unmarked), &cfg(mode.clone()));
            assert!(p.lapsed.is_empty());
            assert!(bound_anywhere(&p));
        }
    }

    /// Share-IP with DHCPv6: a dual-stack DHCP Service's leased IPv6 address is shared like
    /// its IPv4 one; the IPv6 entry of a Service that asks DHCPv4 only is not its lease.
    #[test]
    fn a_dhcp_services_ipv6_address_is_shared_only_when_it_asks_dhcpv6() {
        let dhcp_svc = |name: &str, ips: &str| {
            let mut s = k8s_openapi::api::core::v1::Service::default();
            s.metadata.name = Some(name.into());
            s.metadata.namespace = Some("default".into());
            s.metadata.uid = Some(format!("uid{name}"));
            s.metadata.annotations = Some(
                [
                    (
                        crate::services::plan::model::ANN_LOADBALANCER_IPS.to_string(),
                        ips.to_string(),
                    ),
                    (
                        crate::services::plan::model::ANN_REQUESTED_IP.to_string(),
                        "192.0.2.205,2001:db8::1005".to_string(),
                    ),
                ]
                .into(),
            );
            let mut c = svc(name, 1, &[], &[(80, "TCP")]);
            c.dhcp = Some(
                crate::services::plan::model::dhcp_request(
                    &crate::services::plan::model::service_info(&s),
                )
                .unwrap(),
            );
            c
        };
        let sharer = svc("sharer", 2, &["2001:db8::1005"], &[(443, "TCP")]);
        let mode = Mode::PerService;
        let p = plan_leases(
            &[dhcp_svc("dual", "0.0.0.0,::"), sharer.clone()],
            &cfg(mode.clone()),
        );
        assert!(
            p.groups[&lease("dual")].services.contains(&key("sharer")),
            "{p:?}"
        );
        assert!(!p.groups.contains_key(&lease("sharer")));
        // DHCPv4 only: the IPv6 entry is no lease of it, the sharer is on its own.
        let p = plan_leases(&[dhcp_svc("four", "0.0.0.0"), sharer], &cfg(mode));
        assert!(p.groups.contains_key(&lease("sharer")), "{p:?}");
    }

    /// A DHCP Service built from `name` with `annotations`, created at `created`.
    fn dhcp_svc(name: &str, created: i64, annotations: &[(&str, &str)]) -> Candidate {
        let mut s = k8s_openapi::api::core::v1::Service::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("default".into());
        s.metadata.uid = Some(format!("uid{name}"));
        s.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert("kube-vip.io/loadbalancerIPs".into(), "0.0.0.0".into());
        let info = crate::services::plan::model::service_info(&s);
        let mut c = svc(name, created, &[], &[(80, "TCP")]);
        c.dhcp = Some(crate::services::plan::model::dhcp_request(&info).unwrap());
        c
    }

    /// Trial finding: a DHCP Service copied with its `kube-vip.io/hwaddr` (or
    /// `kube-vip.io/macvlanName`) got its own client with the same MAC: two holders served
    /// one DHCP lease's address with one MAC. The newer one is left out, whatever the
    /// election mode, with a conflict naming the older one.
    #[test]
    fn a_dhcp_service_with_a_copied_mac_or_macvlan_is_left_out() {
        let mac = "02:76:69:70:64:42";
        let orig = dhcp_svc("orig", 1, &[("kube-vip.io/hwaddr", mac)]);
        // A copy of a Service whose MAC vipd derived from its UID, made in the same second
        // (creationTimestamp has whole seconds, and "a-copy" sorts before "derived"): the
        // original keeps its MAC.
        let derived = dhcp_svc("derived", 7, &[]);
        let derived_mac = crate::net::conflict::fmt_mac(derived.dhcp.as_ref().unwrap().mac);
        let copy = dhcp_svc("a-copy", 7, &[("kube-vip.io/hwaddr", derived_mac.as_str())]);
        assert!(derived.dhcp.as_ref().unwrap().mac_is_derived());
        assert!(!copy.dhcp.as_ref().unwrap().mac_is_derived());
        let p = plan_leases(&[copy, derived], &cfg(Mode::PerService));
        assert_eq!(p.dhcp_conflicts.len(), 1);
        assert_eq!(p.dhcp_conflicts[0].service, key("a-copy"));
        let clone = dhcp_svc("clone", 2, &[("kube-vip.io/hwaddr", mac)]);
        let named = dhcp_svc("named", 3, &[("kube-vip.io/macvlanName", "lb0")]);
        let same_name = dhcp_svc("same-name", 4, &[("kube-vip.io/macvlanName", "lb0")]);
        let other = dhcp_svc("other", 5, &[]);
        let all = [same_name, clone, other, named, orig];
        for mode in [
            Mode::PerService,
            Mode::Global(LeaseRef {
                namespace: "kube-system".into(),
                name: "plndr-svcs-lock".into(),
            }),
        ] {
            let p = plan_leases(&all, &cfg(mode.clone()));
            let left: Vec<(&str, &str)> = p
                .dhcp_conflicts
                .iter()
                .map(|c| (c.service.name.as_str(), c.with.name.as_str()))
                .collect();
            assert_eq!(
                left,
                [("clone", "orig"), ("same-name", "named")],
                "{mode:?}"
            );
            assert!(
                p.dhcp_conflicts[0].what.contains(mac),
                "{:?}",
                p.dhcp_conflicts
            );
            assert!(p.dhcp_conflicts[1].what.contains("lb0"));
            let clients: BTreeSet<&str> = p
                .groups
                .values()
                .flat_map(|g| g.dhcp.iter().map(|d| d.key.name.as_str()))
                .collect();
            assert_eq!(clients, ["named", "orig", "other"].into(), "{mode:?}");
            assert!(!p.addresses.contains_key(&key("clone")));
        }
    }

    /// Trial finding: a newer DHCP Service whose requestedIP names an older static
    /// Service's address took the address over (the older one got the AddressConflict),
    /// across namespaces. An older Service of another namespace keeps it; in the same
    /// namespace (share-IP, Harvester's upgrade flow) the DHCP Service has it.
    #[test]
    fn an_older_service_of_another_namespace_keeps_its_address_against_a_requested_ip() {
        let mut stat = svc("static", 1, &["192.0.2.215"], &[(80, "TCP")]);
        stat.key.namespace = "tenant-a".into();
        stat.lease.namespace = "tenant-a".into();
        let dhcp = dhcp_svc("dhcp", 2, &[("kube-vip.io/requestedIP", "192.0.2.215")]);
        let p = plan_leases(&[dhcp.clone(), stat.clone()], &cfg(Mode::PerService));
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        let g = &p.groups[&stat.lease];
        assert!(
            g.vips
                .iter()
                .any(|v| v.vip.addr.to_string() == "192.0.2.215")
        );
        assert_eq!(
            p.groups[&lease("dhcp")].dhcp.len(),
            1,
            "the DHCP client still runs"
        );
        // Same namespace: the DHCP Service's macvlan carries it, the static one joins
        // (on another port: the same one would be an AddressConflict).
        stat.key.namespace = "default".into();
        stat.lease.namespace = "default".into();
        stat.ports = vec![port(8080, "TCP")];
        let p = plan_leases(&[dhcp, stat], &cfg(Mode::PerService));
        assert!(
            p.groups.values().all(|g| {
                g.vips
                    .iter()
                    .all(|v| v.vip.addr.to_string() != "192.0.2.215")
            }),
            "{p:?}"
        );
        assert!(
            p.groups[&lease("dhcp")].services.contains(&key("static")),
            "{p:?}"
        );
    }

    /// Issue 13: a DHCP Service without a fixed address gets a group under its own lease
    /// (or the global one) that carries its request; the macvlan's parent falls back to
    /// the configured Services interface.
    #[test]
    fn dhcp_services_get_a_group_with_their_request() {
        let info = |name: &str| {
            let mut svc = k8s_openapi::api::core::v1::Service::default();
            svc.metadata.name = Some(name.into());
            svc.metadata.namespace = Some("default".into());
            svc.metadata.uid = Some(format!("uid{name}"));
            crate::services::plan::model::service_info(&svc)
        };
        let mut a = svc("a", 1, &[], &[(80, "TCP")]);
        a.dhcp = Some(crate::services::plan::model::dhcp_request(&info("a")).unwrap());
        let b = svc("b", 2, &["192.0.2.21"], &[(80, "TCP")]);
        let mut c = cfg(Mode::PerService);
        c.interface = Some("eth0".into());
        let p = plan_leases(&[a.clone(), b.clone()], &c);
        let g = &p.groups[&lease("a")];
        assert!(g.vips.is_empty() && g.campaign);
        assert_eq!(g.services, [key("a")].into());
        assert_eq!(g.dhcp.len(), 1);
        assert_eq!(g.dhcp[0].key, key("a"));
        assert_eq!(g.dhcp[0].request.parent.as_deref(), Some("eth0"));
        assert_eq!(g.dhcp[0].request.macvlan, "vip-uida");
        assert!(p.groups[&lease("b")].dhcp.is_empty());
        assert_eq!(p.addresses[&key("a")], Vec::<IpAddr>::new());
        let global = LeaseRef {
            namespace: "kube-system".into(),
            name: "plndr-svcs-lock".into(),
        };
        let p = plan_leases(&[a, b], &cfg(Mode::Global(global.clone())));
        assert_eq!(p.groups.len(), 1);
        let g = &p.groups[&global];
        assert_eq!(g.dhcp.len(), 1);
        assert_eq!(g.dhcp[0].request.parent, None, "automatic parent");
        assert_eq!(g.services.len(), 2);
    }
}
