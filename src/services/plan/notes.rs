//! What the Services wing tells the user about Services it does not announce as asked
//! ([`Note`]), and which Services are announced nowhere. Pure.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;

use super::desired::Plan;
use super::model::ServiceKey;

/// Something to tell the user about a Service (logged, and a Warning Event when `warn`).
/// The same note (Service, reason, message) is logged once per process while its cause
/// lasts, and its Event is written until it succeeds.
#[derive(Debug)]
pub(crate) struct Note {
    pub(crate) key: ServiceKey,
    /// The Service's `metadata.uid` (part of the Event's name, see
    /// [`crate::kube::events::event_name`]).
    pub(crate) uid: Option<String>,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) warn: bool,
}

impl Note {
    /// Deduplication key: Service, reason and message (never the resourceVersion, which
    /// changes with every status write).
    pub(crate) fn id(&self) -> String {
        format!("{}|{}|{}", self.key, self.reason, self.message)
    }
}

/// The Services among `endpointless` (externalTrafficPolicy Local, no ready endpoint on
/// any node) that no node campaigns for: every group they are in has only such members
/// (a member with policy Cluster, or a Local one with an endpoint somewhere, keeps the
/// group's addresses announced, S21). Pure.
pub(crate) fn announced_nowhere(
    plan: &Plan,
    endpointless: &HashSet<ServiceKey>,
) -> HashSet<ServiceKey> {
    let mut alive: HashSet<&ServiceKey> = HashSet::new();
    for g in plan.groups.values() {
        if !g.services.iter().all(|k| endpointless.contains(k)) {
            alive.extend(g.services.iter());
        }
    }
    endpointless
        .iter()
        .filter(|k| plan.addresses.contains_key(*k) && !alive.contains(k))
        .cloned()
        .collect()
}

/// The uid of Service `key` in `services`.
pub(crate) fn uid_of(services: &[Arc<Service>], key: &ServiceKey) -> Option<String> {
    services
        .iter()
        .find(|s| ServiceKey::of(&***s) == *key)
        .and_then(|s| s.metadata.uid.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::plan::desired::LeaseRef;

    #[test]
    fn local_services_without_endpoints_are_announced_nowhere_unless_their_group_lives() {
        use crate::services::plan::desired::Group;
        let k = |n: &str| ServiceKey::new("default", n);
        let lease = |n: &str| LeaseRef {
            namespace: "default".into(),
            name: n.into(),
        };
        let mut plan = Plan::default();
        for (l, members) in [("kubevip-a", &["a"][..]), ("kubevip-b", &["b", "c"][..])] {
            plan.groups.insert(
                lease(l),
                Group {
                    vips: Vec::new(),
                    campaign: false,
                    not_here: None,
                    preferred: Vec::new(),
                    services: members.iter().map(|m| k(m)).collect(),
                    dhcp: Vec::new(),
                },
            );
            for m in members {
                plan.addresses.insert(k(m), Vec::new());
            }
        }
        // a: alone and endpointless; b: shares its address with c (policy Cluster, or
        // Local with an endpoint somewhere), so b's address is still announced.
        let endpointless: HashSet<ServiceKey> = [k("a"), k("b"), k("gone")].into();
        assert_eq!(announced_nowhere(&plan, &endpointless), [k("a")].into());
        let all: HashSet<ServiceKey> = [k("a"), k("b"), k("c")].into();
        assert_eq!(announced_nowhere(&plan, &all), all);
    }
}
