//! What to do for each Service, pure and deterministic (tests in `decide/tests.rs`): one
//! pass allocates in creation order and adds each allocation to the in-use set before the
//! next, so no address is handed out twice in a pass.

use std::net::{IpAddr, Ipv4Addr};

use super::inuse::{FamilyPolicy, InUse, ServiceView, User, may_share};
use super::pool::{Family, Pool, PoolBook, PoolError};
use crate::kube::ObjectKey;

/// What to do for one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do (has an address, not a LoadBalancer vipd serves, being deleted, ...).
    Keep,
    /// Write these addresses (primary family first): label `implementation=kube-vip`,
    /// annotation `kube-vip.io/loadbalancerIPs` = the addresses joined with `,`,
    /// `spec.loadBalancerIP` = the first, and `kube-vip.io/serviceInterface` = `interface`
    /// when set (KVCP `syncLoadBalancer`).
    Allocate {
        /// One per family, primary family first; `[0.0.0.0]` from a DHCP pool.
        addrs: Vec<IpAddr>,
        /// The pool's key (`cidr-global`).
        pool: String,
        /// At least one address was already used by other Services (`allow-share`).
        shared: bool,
        /// `interface-<ns>` / `interface-global`.
        interface: Option<String>,
    },
    /// No pool applies to the namespace (the runtime posts an Event telling how to make
    /// one; KVCP: `no address pools could be found`).
    NoPool,
    /// The applicable pool key is malformed.
    PoolInvalid(PoolError),
    /// Every usable address of `family` in the pool is in use or refused (KVCP
    /// `OutOfIPsError`: `no addresses available in [<ns>] cidr|range [<pool>]`).
    Exhausted {
        /// The pool's key.
        pool: String,
        /// The family that ran out (the first one, in the Service's order).
        family: Family,
    },
    /// The pool lists no address of a family the Service needs
    /// (SingleStack of the other family, or RequireDualStack and the pool has one family;
    /// KVCP: `could not find suitable pool for the IP family of the service` / `service
    /// requires dual-stack, but the configuration does not have both IPv4 and IPv6 pools`).
    FamilyMissing {
        /// The pool's key.
        pool: String,
        /// The family the pool lacks.
        family: Family,
    },
    /// Labelled `implementation=kube-vip`, with addresses from its namespace's pool, but
    /// no longer a LoadBalancer vipd serves (type changed, or its class is not ours):
    /// clear the label, the annotation and `spec.loadBalancerIP` so the addresses go back
    /// to the pool.
    Release {
        /// The addresses given back (annotation, then `spec.loadBalancerIP`).
        addrs: Vec<IpAddr>,
    },
}

/// A requested address that deserves a Warning Event (the Service keeps it; announcing
/// follows today's rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestWarning {
    /// Outside every pool (given only when a valid, non-DHCP pool is configured).
    NotInPool {
        /// The address.
        addr: IpAddr,
    },
    /// Used by another Service it may not share with, by a Node, or by the control-plane
    /// VIP.
    InUse {
        /// The address.
        addr: IpAddr,
        /// Who, joined with `, ` (`Service shop/web, Node n1, the control-plane VIP`).
        by: String,
    },
}

/// One pass: a decision for every Service, in allocation order (creation time, unknown
/// last, then namespace/name), each allocation added to the pass's copy of `in_use`
/// before the next (copied at the first allocation only: a pass that allocates nothing,
/// the usual case, copies nothing; 3.8 MB at 10 000 Services). `refused(addr)`: addresses
/// the allocator's probe found answered by another host; they are never handed out,
/// shared or not.
pub fn plan(
    services: &[ServiceView],
    book: &PoolBook,
    in_use: &InUse,
    refused: &dyn Fn(IpAddr) -> bool,
) -> Vec<(ObjectKey, Decision)> {
    let mut in_use = std::borrow::Cow::Borrowed(in_use);
    let mut order: Vec<&ServiceView> = services.iter().collect();
    order.sort_by_key(|s| (s.created.unwrap_or(i64::MAX), &s.key));
    order
        .into_iter()
        .map(|svc| {
            let decision = if svc.needs_address() {
                allocate(svc, book, &mut in_use, refused)
            } else if let Some(addrs) = release(svc, book) {
                Decision::Release { addrs }
            } else {
                Decision::Keep
            };
            (svc.key.clone(), decision)
        })
        .collect()
}

/// The allocation for a Service that needs addresses.
fn allocate(
    svc: &ServiceView,
    book: &PoolBook,
    in_use: &mut std::borrow::Cow<'_, InUse>,
    refused: &dyn Fn(IpAddr) -> bool,
) -> Decision {
    let ns = svc.key.namespace.as_str();
    let pool = match book.pool_for(ns) {
        None => return Decision::NoPool,
        Some(Err(e)) => return Decision::PoolInvalid(e.clone()),
        Some(Ok(pool)) => pool,
    };
    let name = pool.key.to_string();
    let interface = book.interface(ns).map(str::to_string);
    if pool.dhcp {
        return Decision::Allocate {
            addrs: vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
            pool: name,
            shared: false,
            interface,
        };
    }
    let families = match families_for(svc, pool) {
        Ok(families) => families,
        Err(family) => return Decision::FamilyMissing { pool: name, family },
    };
    let share = book.allow_share(ns);
    let mut addrs = Vec::new();
    let mut shared = false;
    let mut short = None;
    for family in families {
        match pick(
            svc,
            pool,
            family,
            share,
            book.search_desc(),
            in_use,
            refused,
        ) {
            Some((addr, was_shared)) => {
                addrs.push(addr);
                shared |= was_shared;
            }
            None => {
                short.get_or_insert(family);
            }
        }
    }
    if let Some(family) = short {
        // PreferDualStack keeps what it got (KVCP `discoverVIPsDualStack`).
        if svc.family_policy != FamilyPolicy::PreferDualStack || addrs.is_empty() {
            return Decision::Exhausted { pool: name, family };
        }
    }
    for addr in &addrs {
        let user = User::Service {
            key: svc.key.clone(),
            ports: svc.ports.clone(),
            share_ok: share,
        };
        in_use.to_mut().add(*addr, user);
    }
    Decision::Allocate {
        addrs,
        pool: name,
        shared,
        interface,
    }
}

/// The families to allocate, primary first (KVCP `discoverVIPs`): SingleStack takes
/// `ipFamilies[0]`, or IPv4 if the pool has it, else IPv6; the dual-stack policies take
/// both, `ipFamilies[0]` (IPv4 when unset) first: PreferDualStack those the pool has,
/// RequireDualStack both or none. `Err`: the family the pool lacks.
fn families_for(svc: &ServiceView, pool: &Pool) -> Result<Vec<Family>, Family> {
    let has = pool.families();
    let primary = svc.ip_families.first().copied();
    match svc.family_policy {
        FamilyPolicy::SingleStack => {
            let fallback = if has.contains(&Family::V4) {
                Family::V4
            } else {
                Family::V6
            };
            let family = primary.unwrap_or(fallback);
            if has.contains(&family) {
                Ok(vec![family])
            } else {
                Err(family)
            }
        }
        FamilyPolicy::PreferDualStack => {
            let first = primary.unwrap_or(Family::V4);
            let both = [first, first.other()];
            let listed: Vec<Family> = both.into_iter().filter(|f| has.contains(f)).collect();
            if listed.is_empty() {
                Err(first)
            } else {
                Ok(listed)
            }
        }
        FamilyPolicy::RequireDualStack => {
            let first = primary.unwrap_or(Family::V4);
            let both = [first, first.other()];
            match both.into_iter().find(|f| !has.contains(f)) {
                Some(missing) => Err(missing),
                None => Ok(both.to_vec()),
            }
        }
    }
}

/// One address of `family` for `svc`: with sharing allowed, the first IPv4 address in
/// allocation order that other Services use and `svc` may join ([`may_share`]); else the
/// first free one. `None`: nothing left. The bool: the address was shared.
fn pick(
    svc: &ServiceView,
    pool: &Pool,
    family: Family,
    share: bool,
    desc: bool,
    in_use: &InUse,
    refused: &dyn Fn(IpAddr) -> bool,
) -> Option<(IpAddr, bool)> {
    if share && family == Family::V4 {
        let joinable = |(addr, users): &(IpAddr, &[User])| {
            Family::of(*addr) == family
                && pool.contains(*addr)
                && !refused(*addr)
                && may_share(users, &svc.ports)
        };
        let found = if desc {
            in_use.iter().rev().find(joinable)
        } else {
            in_use.iter().find(joinable)
        };
        if let Some((addr, _)) = found {
            return Some((addr, true));
        }
    }
    pool.addresses(family, desc)
        .find(|a| !in_use.is_used(*a) && !refused(*a))
        .map(|a| (a, false))
}

/// The addresses a Service gives back: labelled `implementation=kube-vip`, not a
/// LoadBalancer vipd serves, not being deleted, and every requested address (annotation,
/// `spec.loadBalancerIP`) one its namespace's pool may hand out. A hand-set address
/// outside that pool, a DHCP Service (`0.0.0.0`) and a Service with no address are left
/// alone.
fn release(svc: &ServiceView, book: &PoolBook) -> Option<Vec<IpAddr>> {
    if !svc.labelled || svc.served() || svc.deleting {
        return None;
    }
    let addrs = svc.requested();
    let Some(Ok(pool)) = book.pool_for(&svc.key.namespace) else {
        return None;
    };
    (!addrs.is_empty() && addrs.iter().all(|a| pool.contains(*a))).then_some(addrs)
}

/// Warnings for a Service's requested addresses (annotation, `spec.loadBalancerIP`): one
/// [`RequestWarning::NotInPool`] for an address no valid pool covers (only when a valid
/// non-DHCP pool exists: with no pool, requested addresses are the only way), and one
/// [`RequestWarning::InUse`] naming every other user it may not share with (sharing as
/// [`may_share`], with `allow-share` of the Service's namespace). Meant for Services vipd
/// serves; `in_use` may include the Service itself (ignored).
pub fn requested_warnings(
    svc: &ServiceView,
    book: &PoolBook,
    in_use: &InUse,
) -> Vec<RequestWarning> {
    let pools: Vec<&Pool> = book.pools().filter_map(Result::ok).collect();
    let any_pool = pools.iter().any(|p| !p.dhcp);
    let share = book.allow_share(&svc.key.namespace);
    let mut out = Vec::new();
    for addr in svc.requested() {
        if any_pool && !pools.iter().any(|p| p.covers(addr)) {
            out.push(RequestWarning::NotInPool { addr });
        }
        let by: Vec<String> = in_use
            .users(addr)
            .iter()
            .filter(|u| !u.is_service(&svc.key))
            .filter(|u| !(share && may_share(std::slice::from_ref(*u), &svc.ports)))
            .map(User::to_string)
            .collect();
        if !by.is_empty() {
            out.push(RequestWarning::InUse {
                addr,
                by: by.join(", "),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
