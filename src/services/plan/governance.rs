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
    /// retiring leases of their own Services (they lost an address to another lease;
    /// started again by [`admit`] when they still govern other addresses).
    pub stop: BTreeSet<LeaseRef>,
    /// Leases that stop governing addresses, with those addresses: every other lease is
    /// held back from them until the retiring lease's handover is done
    /// (`crate::services::governance::handover`).
    pub retire: BTreeMap<LeaseRef, BTreeSet<IpAddr>>,
    /// The retiring leases of `retire` that keep running on their holder: shared leases (a
    /// shard, the one lease for all) still in the plan (they govern other addresses),
    /// whichever node holds them and whether or not this node campaigns for them. Their
    /// holder drops only the moved addresses and keeps the lease, so no release signals
    /// the handover: it is also done one lease duration after the retirement began
    /// (`crate::services::governance::follow`).
    pub kept: BTreeSet<LeaseRef>,
}

/// Compares the previous governors (`prev`, from [`governors`] of the last plan) with
/// `plan`, given the groups this node runs (`running`). A lease retires with an address
/// when the address is governed by another lease now, and with every address it governed
/// when it governs nothing now (so that an address re-used soon after its Service was
/// deleted waits as well). A retiring lease's group stops so that its holder releases it,
/// unless `shared` says the lease is shared by Services whatever they are (a shard, the one
/// lease for all: `Mode::is_shared`) and it is still in the plan (whether or not this node
/// campaigns for it): a release would hand every other Service of it over to move one
/// address, so it keeps running without the moved addresses ([`Changes::kept`]); a group
/// this node runs but no longer campaigns for still stops.
pub fn changes(
    prev: &BTreeMap<IpAddr, LeaseRef>,
    plan: &Plan,
    running: &BTreeSet<LeaseRef>,
    shared: impl Fn(&LeaseRef) -> bool,
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
    out.kept = out
        .retire
        .keys()
        .filter(|l| shared(l) && plan.groups.contains_key(*l))
        .cloned()
        .collect();
    for lease in running {
        let campaign = plan.groups.get(lease).is_some_and(|g| g.campaign);
        let restart = out.retire.contains_key(lease) && !out.kept.contains(lease);
        if !campaign || restart {
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
