//! The DHCP clients of one group while this node leads it (issue 13): one
//! [`crate::dhcp::Dhcp`] client per DHCP Service of the group's spec and family (`0.0.0.0`:
//! DHCPv4, `::`: DHCPv6; a dual-stack Service runs both on its one macvlan).
//!
//! * Leading: [`DhcpClients::follow`] starts a client for every DHCP Service, releases
//!   (DHCPRELEASE, [`DhcpHandle::release_and_stop`]) the client of a Service that left the
//!   spec (deleted, or no longer a DHCP LoadBalancer), and restarts one whose client
//!   settings changed (macvlan, parent, ...; a changed MAC releases the old MAC's lease
//!   first, since it is another client to the server), or that gave up
//!   ([`DhcpState::GaveUp`], `dhcp_backoff_attempts`) and whose request for its family
//!   changed in any way (the requested address too): the new client counts its attempts
//!   from zero. A client that gave up also starts again when this node takes the lease
//!   again.
//! * Leadership lost, shutdown: [`DhcpClients::stop_all`] without release (the next holder
//!   asks for the same address with the same MAC); the group's Services gone: with
//!   release.
//! * The leased address becomes a VIP (/32, /128) on the macvlan ([`DhcpClients::effective`])
//!   whose lifetime never reaches past the lease's expiry
//!   ([`crate::holder::VipSpec::not_after`]); a state without a binding (lost, requesting)
//!   removes it at once.
//! * [`DhcpClients::observe`] turns each new failure into a Warning Event (giving up:
//!   one `DHCPGaveUp`), and
//!   [`DhcpClients::annotations`] says which of `kube-vip.io/hwaddr` and
//!   `kube-vip.io/requestedIP` to write back.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use tracing::{info, warn};

use crate::dhcp::{Dhcp, DhcpBinding, DhcpFamily, DhcpHandle, DhcpState};
use crate::holder::VipSpec;
use crate::net::Vip;
use crate::net::conflict::fmt_mac;
use crate::services::metrics::dhcp::DhcpMetrics;
use crate::services::plan::decide::DhcpClientId;
use crate::services::plan::decide::GroupSpec;
use crate::services::plan::desired::DhcpService;
use crate::services::plan::model::{ANN_DHCP_LEASE, ANN_HWADDR, ANN_REQUESTED_IP, ServiceKey};

/// One running client.
struct Run {
    service: DhcpService,
    /// Which of the Service's clients.
    family: DhcpFamily,
    handle: DhcpHandle,
    /// The client's task is gone (its state channel closed): nothing is leased.
    closed: bool,
    /// The last problem posted as an Event (see [`problem_of`]); not posted twice.
    reported: Option<String>,
    /// What the metrics last saw of this client (see [`metric_updates`]).
    seen: Seen,
}

/// What the metrics last saw of one client: its state, its binding (address, expiry) and
/// its failed attempts, so that each event counts once even when the state watch skips a
/// short state (a renewal shows as a later expiry, whether or not `Renewing` was seen).
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    state: &'static str,
    binding: Option<(IpAddr, tokio::time::Instant)>,
    attempt: u32,
}

/// A Warning Event to post about a Service: (Service, reason, message).
pub(super) type DhcpEvent = (ServiceKey, &'static str, String);

/// The DHCP clients of one group (see the module docs).
pub(super) struct DhcpClients {
    dhcp: Arc<dyn Dhcp>,
    runs: Vec<Run>,
    metrics: Option<Arc<DhcpMetrics>>,
}

impl DhcpClients {
    /// No clients yet; `dhcp` starts them.
    pub(super) fn new(dhcp: Arc<dyn Dhcp>) -> Self {
        DhcpClients {
            dhcp,
            runs: Vec::new(),
            metrics: None,
        }
    }

    /// Whether no client runs (none started, or every one released).
    pub(super) fn idle(&self) -> bool {
        self.runs.is_empty()
    }

    /// Exports each client's state and events (`vipd_dhcp_*`, [`DhcpMetrics`]).
    pub(super) fn with_metrics(mut self, metrics: &crate::obs::metrics::Metrics) -> Self {
        self.metrics = Some(metrics.families::<DhcpMetrics>());
        self
    }

    /// Removes the metric series of a client that stops.
    fn forget(&self, service: &ServiceKey, family: DhcpFamily) {
        if let Some(m) = &self.metrics {
            m.forget(&service.to_string(), family.metric());
        }
    }

    /// Makes the running clients those of `wanted` (this node leads; the group does it in
    /// two steps, [`Self::retire`] and [`Self::start_missing`], to update its VIP set in
    /// between): starts the missing
    /// ones, on their own parent interface or else `parent` (the Services interface,
    /// resolved; `None` when it cannot be found), releases those whose Service left, and
    /// restarts (without release) those whose client settings changed. Returns a Warning
    /// for every Service whose client cannot start for want of a parent interface.
    #[cfg(test)]
    pub(super) async fn follow(
        &mut self,
        wanted: &[DhcpService],
        parent: Option<&str>,
    ) -> Vec<DhcpEvent> {
        self.retire(wanted).finish().await;
        self.start_missing(wanted, parent)
    }

    /// The first half of [`Self::follow`]: takes out the clients to release (their
    /// Service left `wanted`) or restart (settings changed, or gave up and the request
    /// changed), so that their addresses leave
    /// [`Self::effective`] before [`Retired::finish`] removes their macvlans.
    pub(super) fn retire(&mut self, wanted: &[DhcpService]) -> Retired {
        let mut keep = Vec::new();
        let mut retired = Vec::new();
        for run in std::mem::take(&mut self.runs) {
            let family = run.family;
            match wanted
                .iter()
                .find(|w| w.key == run.service.key && w.request.families().contains(&family))
            {
                None => {
                    // Another DHCP Service going on with the MAC (Harvester's keep-IP flow)
                    // keeps the lease: no DHCPRELEASE.
                    let continued = wanted.iter().any(|w| {
                        w.request.mac == run.service.request.mac
                            && w.request.families().contains(&family)
                    });
                    if continued {
                        info!(service = %run.service.key, mac = %fmt_mac(run.service.request.mac), family = family.label(), "DHCP Service gone, its MAC goes on with another DHCP Service: lease kept for it (no DHCPRELEASE)");
                    } else {
                        info!(service = %run.service.key, macvlan = %run.service.request.macvlan, family = family.label(), "DHCP Service gone or no longer DHCP: releasing its lease");
                    }
                    self.forget(&run.service.key, family);
                    retired.push((run.handle, !continued));
                }
                Some(w) if !w.request.same_client(&run.service.request) => {
                    // A new MAC is a new DHCP client (chaddr, client identifier, DUID):
                    // the old one's lease would stay bound to nobody until it expires, and
                    // the server would refuse the new client the same address meanwhile.
                    let new_identity = w.request.mac != run.service.request.mac;
                    if new_identity {
                        info!(service = %w.key, macvlan = %w.request.macvlan, family = family.label(), old_mac = %fmt_mac(run.service.request.mac), new_mac = %fmt_mac(w.request.mac), "DHCP client's MAC changed: releasing the old MAC's lease and restarting the client");
                    } else {
                        info!(service = %w.key, macvlan = %w.request.macvlan, family = family.label(), "DHCP client settings changed: restarting the client");
                    }
                    self.forget(&run.service.key, family);
                    retired.push((run.handle, new_identity));
                }
                Some(w)
                    if matches!(*run.handle.state.borrow(), DhcpState::GaveUp { .. })
                        && !w.request.same_ask(&run.service.request, family) =>
                {
                    info!(service = %w.key, macvlan = %w.request.macvlan, family = family.label(), "DHCP request changed after the client gave up: starting it again");
                    self.forget(&run.service.key, family);
                    retired.push((run.handle, false));
                }
                Some(w) => keep.push(Run {
                    service: w.clone(),
                    ..run
                }),
            }
        }
        self.runs = keep;
        Retired(retired)
    }

    /// The second half of [`Self::follow`]: starts a client for every Service of `wanted`
    /// without one (see there).
    pub(super) fn start_missing(
        &mut self,
        wanted: &[DhcpService],
        parent: Option<&str>,
    ) -> Vec<DhcpEvent> {
        let mut events = Vec::new();
        for w in wanted {
            for family in w.request.families() {
                if let Some(e) = self.start_one(w, family, parent) {
                    events.push(e);
                }
            }
        }
        events
    }

    /// Starts `w`'s `family` client unless it runs; a Warning when it cannot start.
    fn start_one(
        &mut self,
        w: &DhcpService,
        family: DhcpFamily,
        parent: Option<&str>,
    ) -> Option<DhcpEvent> {
        if self
            .runs
            .iter()
            .any(|r| r.service.key == w.key && r.family == family)
        {
            return None;
        }
        if let Some(other) = self
            .runs
            .iter()
            .find(|r| r.service.request.macvlan == w.request.macvlan && r.service.key != w.key)
        {
            return Some((
                w.key.clone(),
                crate::services::plan::reasons::REASON_INVALID_CONFIG,
                format!(
                    "{} client not started: macvlan {} is already used by Service {}; give each DHCP Service its own kube-vip.io/macvlanName",
                    family.label(),
                    w.request.macvlan,
                    other.service.key
                ),
            ));
        }
        let Some(parent) = w.request.parent.as_deref().or(parent) else {
            return Some((
                w.key.clone(),
                crate::services::plan::reasons::REASON_DHCP_FAILED,
                format!(
                    "{} client not started: no parent interface for the macvlan (set kube-vip.io/serviceInterface or vip_servicesinterface, or give the node an IPv4 default route)",
                    family.label()
                ),
            ));
        };
        let spec = w.request.spec(parent, family);
        info!(service = %w.key, macvlan = %spec.macvlan, parent = %spec.parent, mac = %fmt_mac(spec.mac), family = family.label(), requested = ?spec.requested, requested_v6 = ?spec.requested_v6, "starting the DHCP client");
        self.runs.push(Run {
            service: w.clone(),
            family,
            handle: self.dhcp.start(spec),
            closed: false,
            reported: None,
            seen: Seen::default(),
        });
        None
    }

    /// Stops every client (the group does it in two steps, [`Self::take_all`] and
    /// [`Retired::finish`]): with `release`, each sends DHCPRELEASE first (the group's
    /// Services are gone); without, the lease stays for the next holder.
    #[cfg(test)]
    pub(super) async fn stop_all(&mut self, release: bool) {
        self.take_all(release, &BTreeSet::new()).finish().await;
    }

    /// Takes out every client to stop (see [`Self::stop_all`]), so that their addresses
    /// leave [`Self::effective`] before [`Retired::finish`] removes their macvlans. A
    /// client whose MAC is in `continued` (another DHCP Service of the plan goes on with
    /// it) is never released.
    pub(super) fn take_all(
        &mut self,
        release: bool,
        continued: &BTreeSet<DhcpClientId>,
    ) -> Retired {
        for r in &self.runs {
            self.forget(&r.service.key, r.family);
        }
        Retired(
            self.runs
                .drain(..)
                .map(|r| {
                    let keep = continued.contains(&(r.service.request.mac, r.family));
                    if release && keep {
                        info!(service = %r.service.key, mac = %fmt_mac(r.service.request.mac), "DHCP Service gone, its MAC goes on with another DHCP Service: lease kept for it (no DHCPRELEASE)");
                    }
                    (r.handle, release && !keep)
                })
                .collect(),
        )
    }

    /// Resolves when a client's state changes (or its task ends); never while none runs.
    pub(super) async fn changed(&mut self) {
        let waiting: Vec<usize> = (0..self.runs.len())
            .filter(|i| !self.runs[*i].closed)
            .collect();
        if waiting.is_empty() {
            return std::future::pending().await;
        }
        let futures = self
            .runs
            .iter_mut()
            .filter(|r| !r.closed)
            .map(|r| Box::pin(r.handle.state.changed()));
        let (result, i, rest) = futures::future::select_all(futures).await;
        drop(rest);
        if result.is_err()
            && let Some(run) = waiting.get(i).and_then(|i| self.runs.get_mut(*i))
        {
            warn!(service = %run.service.key, macvlan = %run.service.request.macvlan, family = run.family.label(), "the DHCP client ended on its own; its address is no longer held");
            run.closed = true;
        }
    }

    /// Reads every client's state; a Warning for each problem not posted yet: a failed
    /// attempt ([`crate::services::plan::reasons::REASON_DHCP_FAILED`], once per attempt), a lost lease
    /// ([`crate::services::plan::reasons::REASON_DHCP_LOST`]) or a client that gave up
    /// ([`crate::services::plan::reasons::REASON_DHCP_GAVE_UP`], once: it stays so).
    pub(super) fn observe(&mut self) -> Vec<DhcpEvent> {
        let mut events = Vec::new();
        for run in &mut self.runs {
            let state = run.handle.state.borrow_and_update().clone();
            if let Some(m) = &self.metrics {
                let (seen, events) = metric_updates(&run.seen, &state);
                let service = run.service.key.to_string();
                let expiry = seen.binding.map(|(_, at)| unix_time_of(at));
                let family = run.family.metric();
                m.state(&service, family, seen.state, expiry);
                for e in events {
                    m.event(&service, family, e);
                }
                run.seen = seen;
            }
            if state.binding().is_some() {
                // Bound again: the next failure is news, whatever its text.
                run.reported = None;
            }
            let Some((id, reason, message)) = problem_of(&run.service, run.family, &state) else {
                continue;
            };
            if run.reported.as_deref() == Some(id.as_str()) {
                continue;
            }
            warn!(service = %run.service.key, reason, "{message}");
            run.reported = Some(id);
            events.push((run.service.key.clone(), reason, message));
        }
        events
    }

    /// Another host answers for `addr` (the holder's RFC 5227 probe or watch): when it is
    /// a leased address, its client sends DHCPDECLINE and starts over (RFC 2131 §4.4.1).
    /// Returns the Service whose lease it was.
    pub(super) fn decline(&self, addr: IpAddr) -> Option<ServiceKey> {
        let (run, _) = self.leased().find(|(_, b)| b.addr == addr)?;
        let service = &run.service;
        warn!(service = %service.key, %addr, macvlan = %service.request.macvlan, family = run.family.label(), "another host answers for the leased address: declining it");
        run.handle.decline(addr);
        Some(service.key.clone())
    }

    /// The clients' bindings that may be held now.
    fn leased(&self) -> impl Iterator<Item = (&Run, DhcpBinding)> {
        self.runs
            .iter()
            .filter(|r| !r.closed)
            .filter_map(|r| r.handle.state.borrow().binding().cloned().map(|b| (r, b)))
    }

    /// `base` with the leased addresses: each a host VIP (/32, /128) on its Service's
    /// macvlan that must be gone by the lease's expiry, and first among its Service's
    /// addresses, the DHCPv4 one before the DHCPv6 one (the status lists them first:
    /// Harvester reads `ingress[0].ip`).
    pub(super) fn effective(&self, base: &GroupSpec) -> GroupSpec {
        let mut out = base.clone();
        let mut leased: Vec<(&Run, DhcpBinding)> = self.leased().collect();
        leased.sort_by_key(|(r, _)| r.family);
        let mut placed: Vec<(ServiceKey, usize)> = Vec::new();
        for (run, b) in leased {
            let service = &run.service;
            let addr = b.addr;
            if !out.vips.iter().any(|v| v.vip.addr == addr) {
                out.vips.push(VipSpec {
                    vip: Vip {
                        addr,
                        prefix: run.family.host_prefix(),
                    },
                    interface: Some(service.request.macvlan.clone()),
                    not_after: Some(b.expires),
                });
            }
            if let Some((_, addrs, _)) = out.services.iter_mut().find(|(k, _, _)| *k == service.key)
                && !addrs.contains(&addr)
            {
                let at = match placed.iter_mut().find(|(k, _)| *k == service.key) {
                    Some((_, n)) => {
                        *n += 1;
                        *n - 1
                    }
                    None => {
                        placed.push((service.key.clone(), 1));
                        0
                    }
                };
                addrs.insert(at.min(addrs.len()), addr);
            }
        }
        out.dhcp_unserved = self.unserved();
        out
    }

    /// The Services none of whose clients has a lease, at least one of which has failed
    /// an attempt (or lost its lease, or gave up) since: they answer nowhere. A client
    /// still on its first attempt (a new holder asking for the address after a failover)
    /// does not count, so the status is not cleared on every hand-over.
    fn unserved(&self) -> Vec<ServiceKey> {
        let leased: Vec<&ServiceKey> = self.leased().map(|(r, _)| &r.service.key).collect();
        let mut out: Vec<ServiceKey> = Vec::new();
        for run in self.runs.iter().filter(|r| !r.closed) {
            let key = &run.service.key;
            let failed = match &*run.handle.state.borrow() {
                DhcpState::Requesting { attempt, .. } => *attempt > 0,
                DhcpState::Lost { .. } | DhcpState::GaveUp { .. } => true,
                _ => false,
            };
            if failed && !leased.contains(&key) && !out.contains(key) {
                out.push(key.clone());
            }
        }
        out
    }

    /// The annotations to write back on each Service, compared with `cached` (the Services
    /// cache): `kube-vip.io/hwaddr` (the MAC in use, so the next holder uses it too) and,
    /// while at least one family is leased, `kube-vip.io/requestedIP` (`v4,v6`, `v4` or
    /// `v6`: each family's leased address, else the one it asks for, asked for again after
    /// a failover or restart). Only those that differ.
    pub(super) fn annotations(
        &self,
        cached: impl Fn(&ServiceKey) -> Option<Arc<Service>>,
    ) -> Vec<(ServiceKey, Vec<(&'static str, String)>)> {
        let leased: Vec<(ServiceKey, DhcpFamily, IpAddr)> = self
            .leased()
            .map(|(r, b)| (r.service.key.clone(), r.family, b.addr))
            .collect();
        let mut out: Vec<(ServiceKey, Vec<(&'static str, String)>)> = Vec::new();
        for run in &self.runs {
            let key = &run.service.key;
            if out.iter().any(|(k, _)| k == key) {
                // The Service's other family: done with the first.
                continue;
            }
            let Some(svc) = cached(key) else {
                continue;
            };
            let current = |name: &str| {
                svc.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(name))
                    .cloned()
            };
            let mut want = vec![(ANN_HWADDR, fmt_mac(run.service.request.mac))];
            let lease_of = |family: DhcpFamily| {
                leased
                    .iter()
                    .find(|(k, f, _)| k == key && *f == family)
                    .map(|(_, _, a)| *a)
            };
            let request = &run.service.request;
            if request
                .families()
                .into_iter()
                .any(|f| lease_of(f).is_some())
            {
                // Only the families it asks for: an entry of a dropped family would be
                // asked for again by no one, and read as current by tools.
                let v4 = lease_of(DhcpFamily::V4)
                    .or(request.requested.map(IpAddr::V4))
                    .filter(|_| request.v4);
                let v6 = lease_of(DhcpFamily::V6)
                    .or(request.requested_v6.map(IpAddr::V6))
                    .filter(|_| request.v6);
                let value: Vec<String> = [v4, v6]
                    .into_iter()
                    .flatten()
                    .map(|a| a.to_string())
                    .collect();
                want.push((ANN_REQUESTED_IP, value.join(",")));
            }
            want.retain(|(name, value)| match current(name) {
                // The same MAC in another spelling (upper case, from a user or GitOps) is
                // kept as written: rewriting it would show as drift.
                Some(cur) if *name == ANN_HWADDR => {
                    crate::services::plan::model::parse_unicast_mac(&cur).ok() != Some(request.mac)
                }
                cur => cur.as_deref() != Some(value.as_str()),
            });
            if !want.is_empty() {
                out.push((key.clone(), want));
            }
        }
        out
    }

    /// `vipd.io/dhcp-lease` to write on the Services of `spec` (the effective spec) that
    /// share a leased address without being DHCP Services themselves (Harvester's
    /// share-IP mode: a Service naming the address concretely): the leased addresses it
    /// names, when the cached annotation (`cached`) says otherwise. The record is never
    /// removed here: it is what keeps such an address from being announced as a static one
    /// once no DHCP Service asks for it ([`crate::services::plan::desired::LapsedLease`]).
    pub(super) fn lease_marks(
        &self,
        spec: &GroupSpec,
        cached: impl Fn(&ServiceKey) -> Option<Arc<Service>>,
    ) -> Vec<(ServiceKey, Vec<(&'static str, String)>)> {
        let leased: Vec<IpAddr> = self.leased().map(|(_, b)| b.addr).collect();
        let mut out = Vec::new();
        for (key, addrs, _) in &spec.services {
            if self.runs.iter().any(|r| r.service.key == *key) {
                continue;
            }
            let mut shared: Vec<IpAddr> = addrs
                .iter()
                .filter(|a| leased.contains(a))
                .copied()
                .collect();
            if shared.is_empty() {
                continue;
            }
            shared.sort();
            let Some(svc) = cached(key) else {
                continue;
            };
            if crate::services::plan::model::dhcp_lease_record(&svc).0 == shared {
                continue;
            }
            let value: Vec<String> = shared.iter().map(ToString::to_string).collect();
            out.push((key.clone(), vec![(ANN_DHCP_LEASE, value.join(","))]));
        }
        out
    }

    /// The macvlans of the running clients (for tests and logs), once each.
    #[cfg(test)]
    pub(super) fn macvlans(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &self.runs {
            if !out.contains(&r.service.request.macvlan) {
                out.push(r.service.request.macvlan.clone());
            }
        }
        out
    }
}

/// Clients taken out of a [`DhcpClients`], to stop: each with whether to send
/// DHCPRELEASE first.
#[must_use = "the clients run until finish() stops them"]
pub(super) struct Retired(Vec<(DhcpHandle, bool)>);

impl Retired {
    /// Stops the clients (DHCPRELEASE first where asked) and waits until their macvlans
    /// are gone.
    pub(super) async fn finish(self) {
        for (handle, release) in self.0 {
            if release {
                handle.release_and_stop().await;
            } else {
                handle.stop().await;
            }
        }
    }
}

/// The metric view of `state` after `before`, and the events (of
/// `vipd_dhcp_events_total`) it shows: `renewed` when the same address got a later
/// expiry, `failed` for a new failed attempt (the last one too, which gives up), `lost` (and
/// `nak` when a DHCPNAK ended it) on entering `Lost`. Pure.
fn metric_updates(before: &Seen, state: &DhcpState) -> (Seen, Vec<&'static str>) {
    let mut events = Vec::new();
    let name = match state {
        DhcpState::Requesting { .. } => "requesting",
        DhcpState::Bound(_) => "bound",
        DhcpState::Renewing(_) => "renewing",
        DhcpState::Rebinding(_) => "rebinding",
        DhcpState::Lost { .. } => "lost",
        DhcpState::GaveUp { .. } => "gave_up",
    };
    let binding = state.binding().map(|b| (b.addr, b.expires));
    if let (Some((addr, expires)), Some((was_addr, was_expires))) = (binding, before.binding)
        && addr == was_addr
        && expires > was_expires
    {
        events.push("renewed");
    }
    let mut attempt = before.attempt;
    let failed = match state {
        DhcpState::Requesting {
            attempt: a,
            last_error: Some(_),
        } => Some(*a),
        DhcpState::GaveUp { attempts, .. } => Some(*attempts),
        _ => None,
    };
    if let Some(a) = failed
        && a != before.attempt
    {
        events.push("failed");
        attempt = a;
    }
    if let DhcpState::Lost { reason } = state
        && before.state != "lost"
    {
        events.push("lost");
        if reason.contains("DHCPNAK") {
            events.push("nak");
        }
    }
    (
        Seen {
            state: name,
            binding,
            attempt,
        },
        events,
    )
}

/// Unix time (seconds) of the monotonic instant `at`.
fn unix_time_of(at: tokio::time::Instant) -> u64 {
    let now = std::time::SystemTime::now();
    let wall = match at.checked_duration_since(tokio::time::Instant::now()) {
        Some(ahead) => now + ahead,
        None => now - (tokio::time::Instant::now() - at),
    };
    wall.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The problem a client's state shows, as (id, reason, message); `None` when there is none
/// (bound, renewing, rebinding, or the first attempt under way). The id changes with each
/// failed attempt, so every failure is posted once.
fn problem_of(
    service: &DhcpService,
    family: DhcpFamily,
    state: &DhcpState,
) -> Option<(String, &'static str, String)> {
    let macvlan = &service.request.macvlan;
    let dhcp = family.label();
    match state {
        DhcpState::Requesting {
            attempt,
            last_error: Some(e),
        } => Some((
            format!("requesting/{attempt}"),
            crate::services::plan::reasons::REASON_DHCP_FAILED,
            format!("{dhcp} request on macvlan {macvlan} failed: {e}; retrying"),
        )),
        DhcpState::Lost { reason } => Some((
            format!("lost/{reason}"),
            crate::services::plan::reasons::REASON_DHCP_LOST,
            format!(
                "{dhcp} lease on macvlan {macvlan} lost: {reason}; address removed, asking the server again"
            ),
        )),
        DhcpState::GaveUp {
            attempts,
            last_error,
        } => Some((
            format!("gaveup/{attempts}"),
            crate::services::plan::reasons::REASON_DHCP_GAVE_UP,
            format!(
                "{dhcp} client of Service {} on macvlan {macvlan} gave up after {attempts} failed attempt(s) in a row (dhcp_backoff_attempts={attempts}); last error: {last_error}; no more requests until the Service's DHCP annotations change or its Lease changes holder",
                service.key
            ),
        )),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests;
