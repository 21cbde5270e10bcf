//! The orchestration's decisions, pure (the runtime applies them; their unit tests are in
//! `decide/tests.rs`): which group tasks stop on a pass and whether their lease is deleted,
//! what every group that runs announces, whether a stopped group deletes its lease, which
//! Services are announced nowhere, when a group's holder writes status, and what the egress
//! wing is told ([`egress_facts`]).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;

use super::desired::{Candidate, LeaseRef, Mode, NotHere, Plan};
use super::model::{PortProto, ServiceKey};
use super::notes::{Note, announced_nowhere, uid_of};
use crate::election::ElectionEnd;
use crate::holder::VipSpec;
use crate::services::plan::governance;

/// What a group task needs to know about the Services whose addresses it announces.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupSpec {
    /// VIPs governed by the group's lease.
    pub vips: Vec<VipSpec>,
    /// Services announced through this group, with the addresses and ports for their
    /// status, sorted by Service (a vector: a BTreeMap's first node alone is about 1 KiB,
    /// and there is one spec per lease, often with a single Service).
    pub services: Vec<(ServiceKey, Vec<IpAddr>, Vec<PortProto>)>,
    /// The group's preferred nodes, in order (`vipd.io/preferred-nodes`; empty: none).
    pub preferred: Vec<String>,
    /// DHCP Services whose clients the group runs while it leads (issue 13).
    pub dhcp: Vec<super::desired::DhcpService>,
    /// DHCP Services this holder serves with no address now after at least one failed
    /// attempt (a lost lease not re-acquired, a NAK, a client that cannot set up or gave
    /// up): announced by no node, so their status and `vipHost` are cleared like a
    /// Service whose addresses are all refused. Filled by the DHCP clients
    /// (`DhcpClients::effective`), not by the planner.
    pub dhcp_unserved: Vec<ServiceKey>,
}

/// A running group to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StopOrder {
    /// The group's lease.
    pub(crate) lease: LeaseRef,
    /// The lease serves no Service any more (per-Service leases only; the global lease is
    /// never deleted): whoever releases it also deletes it.
    pub(crate) delete_lease: bool,
    /// The group stays in the plan but this node may not announce it any more (node
    /// selector, subnet): a holder hands it over with a `HandedOver` Event naming this.
    pub(crate) not_here: Option<NotHere>,
    /// DHCP clients (MAC, family) a DHCP Service of the plan goes on with ([`dhcp_macs`]): a
    /// gone Service's client that is one of them is stopped without DHCPRELEASE (Harvester's keep-IP flow:
    /// the copy's INIT-REBOOT then finds the server's lease, instead of a silent server,
    /// and a late DHCPRELEASE can never free the lease the copy was just given).
    pub(crate) continued_macs: BTreeSet<DhcpClientId>,
}

/// A DHCP client as the server knows it: its MAC (chaddr, client identifier, DUID) and
/// family.
pub(crate) type DhcpClientId = ([u8; 6], crate::dhcp::DhcpFamily);

/// The clients of every DHCP Service in `plan`.
pub(crate) fn dhcp_macs(plan: &Plan) -> BTreeSet<DhcpClientId> {
    plan.groups
        .values()
        .flat_map(|g| g.dhcp.iter())
        .flat_map(|d| d.request.families().into_iter().map(|f| (d.request.mac, f)))
        .collect()
}

/// The first half of a pass: the groups to stop and the leases that retire (S34).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Stops {
    /// Groups to stop, in lease order.
    pub(crate) stop: Vec<StopOrder>,
    /// Leases that stop governing addresses, with those addresses
    /// ([`governance::Changes::retire`]).
    pub(crate) retire: BTreeMap<LeaseRef, BTreeSet<IpAddr>>,
    /// The retiring leases that keep running ([`governance::Changes::kept`]): their
    /// handover is also done one lease duration after it began.
    pub(crate) kept: BTreeSet<LeaseRef>,
}

/// Which of the `running` groups stop for `plan`, given the governors of the previous plan
/// (`prev`): gone from the plan, not campaigned for by this node, or retiring (a shared
/// lease under `mode` that still governs other addresses keeps running instead:
/// [`governance::Changes::kept`]). A lease that
/// governs no address anywhere any more (its Service was deleted, changed type or class, or
/// lost its addresses: S17, S18, S32) is deleted after its release, unless it is shared
/// under `mode` (the one lease for all Services, a current shard lease:
/// [`Mode::is_shared`]). Without election ([`Mode::Unelected`]) nothing retires.
pub(crate) fn stops(
    prev: &BTreeMap<IpAddr, LeaseRef>,
    plan: &Plan,
    running: &BTreeSet<LeaseRef>,
    mode: &Mode,
) -> Stops {
    let changes = governance::changes(prev, plan, running, |l| mode.is_shared(l));
    let continued_macs = dhcp_macs(plan);
    let stop = changes
        .stop
        .into_iter()
        .map(|lease| StopOrder {
            delete_lease: !mode.is_shared(&lease) && !plan.groups.contains_key(&lease),
            not_here: plan.groups.get(&lease).and_then(|g| g.not_here.clone()),
            continued_macs: continued_macs.clone(),
            lease,
        })
        .collect();
    Stops {
        stop,
        // Without election every node may route an address at once: a group that gives
        // one up holds back nobody.
        retire: match mode.elects() {
            true => changes.retire,
            false => BTreeMap::new(),
        },
        kept: changes.kept,
    }
}

/// The second half of a pass: the groups to start or update, and the held-back addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Runs {
    /// One spec per lease this node campaigns for (at most one group per lease), in lease
    /// order.
    pub(crate) specs: Vec<(LeaseRef, GroupSpec)>,
    /// Addresses held back per lease by another lease's unfinished handover
    /// ([`governance::Admission::held_back`]).
    pub(crate) held_back: BTreeMap<LeaseRef, BTreeSet<IpAddr>>,
}

/// What every group of `plan` this node campaigns for runs with, after the stops
/// (`running`: the groups still running; `retiring`: lease -> addresses whose handover is
/// not done): its admitted VIPs ([`governance::admit`]) and its Services with their
/// addresses and ports (ports from `candidates`, the planner's input).
pub(crate) fn runs(
    plan: &Plan,
    candidates: &[Candidate],
    running: &BTreeSet<LeaseRef>,
    retiring: &BTreeMap<LeaseRef, BTreeSet<IpAddr>>,
) -> Runs {
    let admission = governance::admit(plan, running, retiring);
    let ports: std::collections::HashMap<&ServiceKey, &[PortProto]> = candidates
        .iter()
        .map(|c| (&c.key, c.ports.as_slice()))
        .collect();
    let specs = admission
        .run
        .into_iter()
        .filter_map(|(lease, vips)| {
            let group = plan.groups.get(&lease)?;
            let services = group
                .services
                .iter()
                .map(|k| {
                    let addrs = plan.addresses.get(k).cloned().unwrap_or_default();
                    let ports = ports.get(k).map(|p| p.to_vec()).unwrap_or_default();
                    (k.clone(), addrs, ports)
                })
                .collect();
            let dhcp = group.dhcp.clone();
            Some((
                lease,
                GroupSpec {
                    vips,
                    services,
                    preferred: group.preferred.clone(),
                    dhcp,
                    dhcp_unserved: Vec::new(),
                },
            ))
        })
        .collect();
    Runs {
        specs,
        held_back: admission.held_back,
    }
}

/// The resourceVersion at which a stopped group deletes its lease, if it does: only when
/// deletion was ordered (`delete_lease`, see [`StopOrder`]) and this node (`node`) released
/// the lease or still holds it after stepping down without a release (e.g. frozen past its
/// renew deadline). The delete is conditional on that version: a lease someone else wrote
/// since is kept.
pub(crate) fn lease_to_delete<'a>(
    delete_lease: bool,
    end: Option<&'a ElectionEnd>,
    node: &str,
) -> Option<&'a str> {
    let end = end.filter(|_| delete_lease)?;
    let obs = end.observed.as_ref()?;
    (end.released || obs.record.holder == node).then_some(obs.resource_version.as_str())
}

/// Whether a lease that a stopped group was ordered to delete may still be deleted when
/// its conditional delete ([`lease_to_delete`]) found it changed, or failed: its current
/// record (`current`, read again; `None`: gone) is released, or names this node (`node`)
/// and is one of the stopped elector's own writes (`own`, [`ElectionEnd::own`]). A
/// release whose answer was lost (a call timeout after the server wrote it) leaves exactly
/// such a record, one version past the one the group last saw; deleting a released lease
/// frees nothing that was not free. A lease another node holds now (a recreated Service's
/// new holder) is kept, and so is one that names this node but that this process never
/// wrote: another process under the same identity (duplicate identity) holds it, which
/// the elector, too, counts as another holder (`record::held_by_another`). Returns the
/// version to delete at, if any.
pub(crate) fn lease_to_delete_again<'a>(
    current: Option<&'a crate::election::Observed>,
    node: &str,
    own: &crate::election::OwnWrites,
) -> Option<&'a str> {
    let obs = current?;
    (!obs.record.is_held() || (obs.record.holder == node && own.is_ours(obs)))
        .then_some(obs.resource_version.as_str())
}

/// Services of `plan` that are announced nowhere: `externalTrafficPolicy: Local` Services
/// without a ready endpoint on any node (`without_ready_endpoint`) whose group nobody
/// campaigns for (their own lease, with per-Service leases or one lease for all alike; a
/// Local Service in a group with a Cluster one is announced with it).
pub(crate) fn endpointless(
    plan: &Plan,
    without_ready_endpoint: &HashSet<ServiceKey>,
) -> HashSet<ServiceKey> {
    announced_nowhere(plan, without_ready_endpoint)
}

/// The Warning notes about the `endpointless` Services of `plan` (reason
/// [`crate::services::plan::reasons::REASON_NO_LOCAL_ENDPOINT`]), in Service order.
pub(crate) fn endpointless_notes(
    plan: &Plan,
    endpointless: &HashSet<ServiceKey>,
    services: &[Arc<Service>],
) -> Vec<Note> {
    plan.addresses
        .keys()
        .filter(|k| endpointless.contains(*k))
        .map(|key| Note {
            key: key.clone(),
            uid: uid_of(services, key),
            reason: crate::services::plan::reasons::REASON_NO_LOCAL_ENDPOINT,
            message: "not announced: externalTrafficPolicy is Local and no node has a ready \
                      endpoint of this Service; status and kube-vip.io/vipHost cleared until \
                      one has"
                .to_string(),
            warn: true,
        })
        .collect()
}

/// Announced Services per namespace in `plan` (the `vipd_services_active` gauge).
pub(crate) fn per_namespace(plan: &Plan) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = BTreeMap::new();
    for k in plan.addresses.keys() {
        *out.entry(k.namespace.clone()).or_default() += 1;
    }
    out
}

/// What a group task saw happen (the inputs of its status decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupEvent {
    /// The group's spec (VIPs, Services, addresses, ports) changed.
    Spec,
    /// The election state changed: leading now or not.
    Leading(bool),
    /// A pass over the Services cache finished.
    CacheSeen,
    /// The status retry's back-off is over.
    RetryDue,
    /// The VIP holder bound, refused or gave up an address.
    Bound,
}

/// What the group's status side does about a [`GroupEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusStep {
    /// Nothing.
    Nothing,
    /// Compare with the cache and write what differs; `retrying`: also write pending
    /// Events.
    Sync {
        /// Write pending Events even when nothing else is due.
        retrying: bool,
    },
    /// This node just became the leader: start a new term (no announcement queued yet),
    /// then sync with `retrying`.
    NewTerm,
    /// Not leading any more: forget the term (the next holder writes its own status and
    /// Events).
    EndTerm,
    /// A retry fell due while not leading: drop it.
    DropRetry,
}

/// The status decision of a group task (S38): status, vipHost and Events are written only
/// while this node leads (`leading`, before the event), level-triggered; a cache pass while
/// a retry is scheduled (`retry_scheduled`) leaves the writing to the retry.
pub(crate) fn status_step(leading: bool, event: GroupEvent, retry_scheduled: bool) -> StatusStep {
    match event {
        GroupEvent::Leading(true) if !leading => StatusStep::NewTerm,
        GroupEvent::Leading(true) => StatusStep::Nothing,
        GroupEvent::Leading(false) => StatusStep::EndTerm,
        GroupEvent::RetryDue if !leading => StatusStep::DropRetry,
        _ if !leading => StatusStep::Nothing,
        GroupEvent::Spec | GroupEvent::RetryDue => StatusStep::Sync { retrying: true },
        GroupEvent::CacheSeen if retry_scheduled => StatusStep::Nothing,
        GroupEvent::CacheSeen | GroupEvent::Bound => StatusStep::Sync { retrying: false },
    }
}

/// What a group's status task does about the events it took at once (in their order):
/// their [`status_step`]s folded into one, so a burst of cache passes costs one sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct StatusBatch {
    /// Leading after the events.
    pub leading: bool,
    /// Forget the term so far (queued announcements, scheduled retries): the lease was
    /// lost, or lost and taken again.
    pub reset: bool,
    /// Drop the scheduled retry (it fell due while not leading).
    pub drop_retry: bool,
    /// Compare with the cache and write what differs; `Some(true)`: also the pending
    /// Events ([`StatusStep::Sync`]'s `retrying`). `None`: nothing to write.
    pub sync: Option<bool>,
}

/// Folds the [`status_step`] of each of `events` (in order) into one [`StatusBatch`],
/// starting from `leading` and `retry_scheduled` (a status write failed and its retry is
/// scheduled); a step that forgets the term or drops the retry also clears
/// `retry_scheduled` for the events after it. Pure.
pub(crate) fn status_batch(
    leading: bool,
    retry_scheduled: bool,
    events: &[GroupEvent],
) -> StatusBatch {
    let mut batch = StatusBatch {
        leading,
        ..StatusBatch::default()
    };
    let mut retry_scheduled = retry_scheduled;
    for &event in events {
        let step = status_step(batch.leading, event, retry_scheduled);
        if let GroupEvent::Leading(now) = event {
            batch.leading = now;
        }
        match step {
            StatusStep::Nothing => {}
            StatusStep::EndTerm => {
                batch.reset = true;
                batch.sync = None;
                retry_scheduled = false;
            }
            StatusStep::DropRetry => {
                batch.drop_retry = true;
                retry_scheduled = false;
            }
            StatusStep::NewTerm => {
                batch.reset = true;
                batch.sync = Some(true);
                retry_scheduled = false;
            }
            StatusStep::Sync { retrying } => {
                batch.sync = Some(batch.sync.unwrap_or(false) || retrying);
            }
        }
    }
    batch
}

#[cfg(test)]
mod tests;

/// The egress facts of the candidates whose Service carries an egress annotation
/// ([`crate::kube::service::ANN_EGRESS_PREFIX`]): their accepted VIPs (without the DHCP
/// placeholders `0.0.0.0` / `::`) and egress annotations; `local_endpoints` is left empty
/// for the caller, which looks the endpoints up only when there are such Services. Sorted
/// by Service. Without egress annotations anywhere it costs one scan of the annotations.
pub(crate) fn egress_facts(
    candidates: &[Candidate],
    services: &[Arc<Service>],
) -> Vec<crate::kube::service::EgressFacts> {
    use crate::kube::service::{ANN_EGRESS_PREFIX, EgressFacts};
    let annotated: BTreeMap<ServiceKey, BTreeMap<String, String>> = services
        .iter()
        .filter_map(|s| {
            let egress: BTreeMap<String, String> = s
                .metadata
                .annotations
                .iter()
                .flatten()
                .filter(|(k, _)| k.starts_with(ANN_EGRESS_PREFIX))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (!egress.is_empty()).then(|| (ServiceKey::of(&**s), egress))
        })
        .collect();
    if annotated.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<EgressFacts> = candidates
        .iter()
        .filter_map(|c| {
            let annotations = annotated.get(&c.key)?.clone();
            Some(EgressFacts {
                namespace: c.key.namespace.clone(),
                name: c.key.name.clone(),
                annotations,
                vips: c
                    .addresses
                    .iter()
                    .copied()
                    .filter(|a| !a.is_unspecified())
                    .collect(),
                etp_local: c.etp_local,
                local_endpoints: Vec::new(),
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}
