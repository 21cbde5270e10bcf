//! What is taken: every address any Service shows, every Node address and the control-plane
//! VIP, with who uses it (tests in `inuse/tests.rs`).
//!
//! KVCP counts only the `kube-vip.io/loadbalancerIPs` annotation of Services labelled
//! `implementation=kube-vip` (`loadBalancer.go` `mapImplementedServices`); vipd counts
//! everything a Service shows, of any type or class, so that no address is handed out
//! twice whatever created the other Service.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use super::pool::{Family, Pool};
use crate::kube::ObjectKey;

/// A Service port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP (also when `protocol` is unset).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// A `spec.ports[].protocol` value: unset is TCP (the API default); `None` for an
    /// unknown protocol.
    pub fn from_k8s(s: Option<&str>) -> Option<Protocol> {
        match s {
            None | Some("TCP") => Some(Protocol::Tcp),
            Some("UDP") => Some(Protocol::Udp),
            Some("SCTP") => Some(Protocol::Sctp),
            Some(_) => None,
        }
    }
}

/// One port a Service listens on: `spec.ports[].protocol` and `.port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortUse {
    /// The protocol.
    pub protocol: Protocol,
    /// The port.
    pub port: u16,
}

/// A Service's `spec.ipFamilyPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FamilyPolicy {
    /// `SingleStack`, and an unset policy.
    #[default]
    SingleStack,
    /// `PreferDualStack`.
    PreferDualStack,
    /// `RequireDualStack`.
    RequireDualStack,
}

impl FamilyPolicy {
    /// A `spec.ipFamilyPolicy` value: unset or unknown is `SingleStack` (KVCP
    /// `discoverVIPs` treats anything but the two dual-stack policies as single stack).
    pub fn from_k8s(s: Option<&str>) -> FamilyPolicy {
        match s {
            Some("PreferDualStack") => FamilyPolicy::PreferDualStack,
            Some("RequireDualStack") => FamilyPolicy::RequireDualStack,
            _ => FamilyPolicy::SingleStack,
        }
    }
}

/// A plain view of one Service (the runtime builds it from k8s-openapi's Service).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceView {
    /// Namespace and name.
    pub key: ObjectKey,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.creationTimestamp`, Unix seconds: allocation order (unknown: last).
    pub created: Option<i64>,
    /// `spec.type == LoadBalancer`.
    pub is_load_balancer: bool,
    /// vipd handles it (the runtime applies vipd's class rule: `lb_class_only` /
    /// `lb_class_name`).
    pub ours: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Label `implementation=kube-vip`.
    pub labelled: bool,
    /// `kube-vip.io/loadbalancerIPs`, raw.
    pub annotation: Option<String>,
    /// `spec.loadBalancerIP`, raw.
    pub spec_ip: Option<String>,
    /// `status.loadBalancer.ingress[].ip`.
    pub status_ips: Vec<IpAddr>,
    /// `kube-vip.io/requestedIP` (the DHCP-leased address), parsed leniently.
    pub requested_ips: Vec<IpAddr>,
    /// `spec.ports[]`.
    pub ports: Vec<PortUse>,
    /// `spec.ipFamilies`, in order.
    pub ip_families: Vec<Family>,
    /// `spec.ipFamilyPolicy`.
    pub family_policy: FamilyPolicy,
}

/// The addresses of a comma-separated list, leniently: entries trimmed, anything that
/// parses as an IP counts, IPv4-mapped IPv6 as its IPv4 address, `0.0.0.0` and `::` (DHCP)
/// do not; hostnames and garbage are skipped. Order kept, duplicates dropped.
pub fn lenient_ips(list: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let parsed = list
        .split(',')
        .filter_map(|e| e.trim().parse::<IpAddr>().ok());
    push_ips(&mut out, parsed);
    out
}

/// Appends the canonical, specified, not yet listed addresses of `ips` to `out`.
fn push_ips(out: &mut Vec<IpAddr>, ips: impl IntoIterator<Item = IpAddr>) {
    for ip in ips.into_iter().map(|ip| ip.to_canonical()) {
        if !ip.is_unspecified() && !out.contains(&ip) {
            out.push(ip);
        }
    }
}

/// Whether an optional raw field is absent or only white space.
fn blank(field: &Option<String>) -> bool {
    field.as_deref().is_none_or(|s| s.trim().is_empty())
}

impl ServiceView {
    /// A LoadBalancer vipd serves (type and class).
    pub fn served(&self) -> bool {
        self.is_load_balancer && self.ours
    }

    /// Whether the allocator gives it addresses: a LoadBalancer vipd serves, not being
    /// deleted, whose annotation and `spec.loadBalancerIP` are both absent or blank (KVCP
    /// `syncLoadBalancer` returns early when either is set, and so never re-allocates).
    pub fn needs_address(&self) -> bool {
        self.served() && !self.deleting && blank(&self.annotation) && blank(&self.spec_ip)
    }

    /// The addresses it asks for: the annotation's, then `spec.loadBalancerIP`
    /// ([`lenient_ips`]).
    pub fn requested(&self) -> Vec<IpAddr> {
        let mut out = lenient_ips(self.annotation.as_deref().unwrap_or(""));
        push_ips(&mut out, lenient_ips(self.spec_ip.as_deref().unwrap_or("")));
        out
    }

    /// Every address it shows: [`ServiceView::requested`], status ingress IPs and
    /// `kube-vip.io/requestedIP` (canonical, no `0.0.0.0`/`::`, no duplicates).
    pub fn shown(&self) -> Vec<IpAddr> {
        let mut out = self.requested();
        push_ips(&mut out, self.status_ips.iter().copied());
        push_ips(&mut out, self.requested_ips.iter().copied());
        out
    }
}

/// Who uses an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum User {
    /// A Service shows it.
    Service {
        /// The Service.
        key: ObjectKey,
        /// Its ports (no ports: it shares with nobody).
        ports: Vec<PortUse>,
        /// Its namespace allows sharing (`allow-share-<ns>` / `-global`).
        share_ok: bool,
    },
    /// A Node's address (`status.addresses`), by Node name.
    Node(String),
    /// The control-plane VIP.
    ControlPlane,
}

impl User {
    /// Whether this is the Service `key`.
    pub fn is_service(&self, key: &ObjectKey) -> bool {
        matches!(self, User::Service { key: k, .. } if k == key)
    }
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            User::Service { key, .. } => write!(f, "Service {key}"),
            User::Node(name) => write!(f, "Node {name}"),
            User::ControlPlane => f.write_str("the control-plane VIP"),
        }
    }
}

/// Whether two port lists clash on one address: the same (protocol, port) in both, or
/// either list empty (a Service without ports takes the whole address, KVCP's sentinel
/// port 0). TCP/53 and UDP/53 do not clash (KVCP compares port numbers only).
pub fn ports_clash(a: &[PortUse], b: &[PortUse]) -> bool {
    a.is_empty() || b.is_empty() || a.iter().any(|p| b.contains(p))
}

/// Whether a Service with `ports` may join an address used by `users`: there are users,
/// all Services from namespaces that allow sharing, none of whose ports clash
/// ([`ports_clash`]). A Node or the control plane never shares.
pub fn may_share(users: &[User], ports: &[PortUse]) -> bool {
    !users.is_empty()
        && users.iter().all(|u| match u {
            User::Service {
                ports: theirs,
                share_ok,
                ..
            } => *share_ok && !ports_clash(ports, theirs),
            User::Node(_) | User::ControlPlane => false,
        })
}

/// Every address in use, with its users, in address order (IPv4 first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InUse {
    users: BTreeMap<IpAddr, Vec<User>>,
}

impl InUse {
    /// Every address shown by any Service ([`ServiceView::shown`]), of any type or class,
    /// deleting or not; plus Node addresses and control-plane VIPs. `share_ok(namespace)`
    /// says whether a namespace allows sharing ([`super::pool::PoolBook::allow_share`]).
    pub fn build(
        services: &[ServiceView],
        nodes: &[(String, IpAddr)],
        control_plane: &[IpAddr],
        share_ok: impl Fn(&str) -> bool,
    ) -> InUse {
        let mut in_use = InUse::default();
        for svc in services {
            let share_ok = share_ok(&svc.key.namespace);
            for addr in svc.shown() {
                let user = User::Service {
                    key: svc.key.clone(),
                    ports: svc.ports.clone(),
                    share_ok,
                };
                in_use.add(addr, user);
            }
        }
        for (node, addr) in nodes {
            in_use.add(*addr, User::Node(node.clone()));
        }
        for addr in control_plane {
            in_use.add(*addr, User::ControlPlane);
        }
        in_use
    }

    /// Who uses `addr` (empty: nobody).
    pub fn users(&self, addr: IpAddr) -> &[User] {
        self.users
            .get(&addr.to_canonical())
            .map_or(&[], Vec::as_slice)
    }

    /// Whether anything uses `addr`.
    pub fn is_used(&self, addr: IpAddr) -> bool {
        !self.users(addr).is_empty()
    }

    /// Records a use, e.g. an allocation just decided (canonical form; `0.0.0.0`/`::` and
    /// a user already listed for the address are ignored).
    pub fn add(&mut self, addr: IpAddr, user: User) {
        let addr = addr.to_canonical();
        if addr.is_unspecified() {
            return;
        }
        let users = self.users.entry(addr).or_default();
        if !users.contains(&user) {
            users.push(user);
        }
    }

    /// How many addresses `pool` may hand out are in use (the used/free metric).
    pub fn used_in(&self, pool: &Pool) -> u128 {
        self.users.keys().filter(|a| pool.contains(**a)).count() as u128
    }

    /// Every used address with its users, in address order (IPv4 first, then ascending).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (IpAddr, &[User])> + '_ {
        self.users.iter().map(|(a, u)| (*a, u.as_slice()))
    }
}

/// One pool's figures: its key, its value, how many addresses it may hand out (after
/// `skip-end-ips-in-cidr` and the `.0`/`.255` rule, both families) and how many of those are
/// in use. For the pool metric and `vipd status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    /// The key (`cidr-global`).
    pub pool: String,
    /// The value as written.
    pub text: String,
    /// Usable addresses (saturating).
    pub total: u128,
    /// Of those, in use.
    pub used: u128,
}

/// The figures of every valid pool of `book` that holds addresses (the DHCP pool holds none),
/// in key order.
pub fn usage(book: &super::pool::PoolBook, in_use: &InUse) -> Vec<PoolUsage> {
    book.pools()
        .filter_map(Result::ok)
        .filter(|p| !p.dhcp)
        .map(|p| PoolUsage {
            pool: p.key.to_string(),
            text: p.text.clone(),
            total: p.size(Family::V4).saturating_add(p.size(Family::V6)),
            used: in_use.used_in(p),
        })
        .collect()
}

#[cfg(test)]
mod tests;
