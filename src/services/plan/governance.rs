//! Governance moves between Service leases (scenario S34 in `docs/scenarios.md`), the
//! pure half: which leases retire when the plan changes ([`changes`]) and which addresses a
//! group may bind while others retire ([`admit`]). The rule and the runtime half (when a
//! retiring lease lets go) are in `crate::services::governance`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::holder::VipSpec;

use super::desired::{LeaseRef, Plan};

/// Every governed address and the lease that governs it in `plan`.
pub(crate) fn governors(plan: &Plan) -> BTreeMap<IpAddr, LeaseRef> {
    plan.groups
        .iter()
        .flat_map(|(lease, g)| g.vips.iter().map(move |v| (v.vip.addr, lease.clone())))
        .collect()
}

/// What changes between two plans for this node's group tasks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changes {
    /// Running groups to stop: gone from the plan, not campaigned for by this node, or
    /// retiring (they lost an address to another lease; started again by [`admit`] when
    /// they still govern other addresses).
    pub stop: BTreeSet<LeaseRef>,
    /// Leases that stop governing addresses, with those addresses: every other lease is
    /// held back from them until the retiring lease's handover is done ([`handover`]).
    pub retire: BTreeMap<LeaseRef, BTreeSet<IpAddr>>,
}

/// Compares the previous governors (`prev`, from [`governors`] of the last plan) with
/// `plan`, given the groups this node runs (`running`). A lease retires with an address
/// when the address is governed by another lease now, and with every address it governed
/// when it governs nothing now (so that an address re-used soon after its Service was
/// deleted waits as well).
pub fn changes(
    prev: &BTreeMap<IpAddr, LeaseRef>,
    plan: &Plan,
    running: &BTreeSet<LeaseRef>,
) -> Changes {
    let now = governors(plan);
    let mut out = Changes::default();
    for (addr, old) in prev {
        let moved = match now.get(addr) {
            Some(new) => new != old,
            None => !plan.groups.contains_key(old),
        };
        if moved {
            out.retire.entry(old.clone()).or_default().insert(*addr);
        }
    }
    for lease in running {
        let keep =
            plan.groups.get(lease).is_some_and(|g| g.campaign) && !out.retire.contains_key(lease);
        if !keep {
            out.stop.insert(lease.clone());
        }
    }
    out
}

/// Which groups run, with which VIPs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Admission {
    /// Groups to start or update, with the VIPs they may bind now.
    pub run: BTreeMap<LeaseRef, Vec<VipSpec>>,
    /// Groups with addresses held back by another lease's unfinished handover, with those
    /// addresses. A group that is not running and has every address held back is not
    /// started (it is in `held_back` and not in `run`).
    pub held_back: BTreeMap<LeaseRef, BTreeSet<IpAddr>>,
}

/// Decides, for every group of `plan` this node campaigns for, the VIPs it may bind:
/// its own minus those of other leases in `retiring` (lease -> addresses whose handover is
/// not done). A lease's own retirement never holds back its own group (the lease itself
/// guarantees one holder).
pub fn admit(
    plan: &Plan,
    running: &BTreeSet<LeaseRef>,
    retiring: &BTreeMap<LeaseRef, BTreeSet<IpAddr>>,
) -> Admission {
    let mut out = Admission::default();
    for (lease, g) in &plan.groups {
        if !g.campaign {
            continue;
        }
        let blocked: BTreeSet<IpAddr> = retiring
            .iter()
            .filter(|(l, _)| *l != lease)
            .flat_map(|(_, addrs)| addrs.iter().copied())
            .filter(|a| g.vips.iter().any(|v| v.vip.addr == *a))
            .collect();
        let vips: Vec<VipSpec> = g
            .vips
            .iter()
            .filter(|v| !blocked.contains(&v.vip.addr))
            .cloned()
            .collect();
        let wait = vips.is_empty() && !g.vips.is_empty() && !running.contains(lease);
        if !blocked.is_empty() {
            out.held_back.insert(lease.clone(), blocked);
        }
        if !wait {
            out.run.insert(lease.clone(), vips);
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
