//! The peer protocol in `vipd manager` (`svc_ridethrough`): one [`PeerNode`] per process,
//! for the Service leases only (the control-plane lease never rides through, P4).
//!
//! * A heartbeat every [`RideConfig::interval`] on the Services interface (signed frames of
//!   [`super::wire`], [`PeerSocket`]): this node's flags ([`Peers::outgoing_flags`]) and the
//!   leases whose VIPs may be live here ([`Peers::listed`]). Before each one, every Service
//!   lease this node leads is evaluated ([`Peers::may_ride_through`], at least once per
//!   interval as the chain rule needs); a `Ride { until }` is published to that lease's
//!   elector state as a raised `renewed_at` ([`ride_renewed_at`]), which the VIP holder turns
//!   into lifetimes that end by `until`.
//! * A receiver thread: frames with their kernel arrival time (turned into a monotonic
//!   instant, never later than the arrival), verified ([`Verifier`], rejections counted by
//!   reason), assembled, fed to [`Peers::receive`].
//! * An API probe (`GET /readyz` every [`PROBE_INTERVAL`], each within [`PROBE_TIMEOUT`]):
//!   this node *reaches the API* while the last `ok` answer came within [`API_WINDOW`].
//! * Membership: the names of the cluster's Node objects not labelled
//!   `vipd.io/ridethrough-member=false` ([`super::membership_of`]), from the Services wing's
//!   Node cache.
//! * Each Service lease's elector talks to it through a [`LeaseLink`] (the elector's
//!   [`RideLink`]): lease writes ([`Peers::renewed`]), confirmed drops ([`Peers::dropped`]),
//!   and acquisitions, allowed only by [`Peers::may_take`].
//!
//! * Hand-overs (P5/P6): a candidate's elector reports its view of the lease
//!   ([`RideLink::observe`]); at each heartbeat [`Peers::may_take`] on it either adds a
//!   `HandOverRequest` to the holder or, on the holder's `Released` for that version, wakes
//!   the elector ([`RideLink::news`]) to take the lease before expiry. A holder asked while it
//!   cannot reach the API ([`Peers::should_release`]) wakes its elector, which steps down at
//!   once; after the confirmed drop ([`RideLink::dropped`]) `Released` goes out for
//!   [`RELEASED_REPEAT`]. Requests and `Released` that arrive wake the heartbeat task at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::key::{KEY_OVERLAP, KEY_POLL, KEY_SIGN_DELAY, KeyId, KeyRing};
use super::metrics::PeerMetrics;
use super::ridethrough::{
    API_WINDOW, LeaseView, Peers, RideConfig, RideDecision, TakeDecision, TakeReason, reaches_api,
};
use super::socket::PeerSocket;
use super::verify::{DEFAULT_MAX_SKEW_MS, Rejection, Verifier};
use super::wire::{Encoder, HeldLease, Kind, LeaseRef, Message, PeerKey};
use crate::election::{LeaderState, Observed, RideLink};
use crate::lease::FENCE_MARGIN;
use crate::obs::metrics::Metrics;
use crate::obs::readiness::Readiness;

/// Interval of the API probe.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// Time limit of one API probe.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The `renewed_at` that makes the VIP holder's fence end exactly at `until`: the holder
/// gives lifetimes of [`crate::lease::fence_grant`] (`lease_duration - age - margin`,
/// whole seconds) and removes everything once [`crate::lease::fence_lapsed`]
/// (`age + margin >= lease_duration`), both counted from `renewed_at`; so `renewed_at =
/// until - (lease_duration - margin)` makes the lifetime of every add end no later than
/// `until`, and the holder stop at `until`. `None` when `until` is too early to express
/// (never, for a real process).
pub(crate) fn ride_renewed_at(until: Instant, lease_duration: Duration) -> Option<Instant> {
    until.checked_sub(lease_duration.saturating_sub(FENCE_MARGIN))
}

/// How long the first read of the peer key Secret retries failures that may pass (no
/// answer, a timeout, 429 or 5xx) before this node says it runs keyless: a node whose link or
/// API server comes up a moment after vipd (a reboot) need not warn.
const KEY_START_PATIENCE: Duration = Duration::from_secs(60);

/// `/readyz` ride state until the peer key is read.
pub(crate) const KEYLESS_STATE: &str = "keyless (no peer key: the Secret vipd-peer-key in cp_namespace is missing, unreadable or short; see the log); Service VIPs go at the renew deadline during an API server outage";
/// `/readyz` ride state once the peer key is read.
pub(crate) const ARMED_STATE: &str =
    "armed (Service VIPs ride through API server outages while a majority of the vipd nodes vouch)";

/// How long a `Released` is repeated (once per heartbeat, and at once after the drop):
/// five heartbeats, so that one lost frame does not make the candidate wait for expiry.
pub(crate) const RELEASED_REPEAT: Duration = Duration::from_secs(1);

/// A registered Service lease: its elector's state channel, the term it leads, and the
/// hand-over bookkeeping.
struct Registered {
    state: Option<Arc<watch::Sender<LeaderState>>>,
    term: u64,
    riding: bool,
    /// Bumped for the elector ([`RideLink::news`]).
    news: watch::Sender<u64>,
    /// What the elector, not leading, last observed (`None` when not held by anyone).
    view: Option<LeaseView>,
    /// A peer asked for the lease and this node cannot reach the API: the asking node,
    /// until the elector's drop (or a new term).
    release_to: Option<String>,
    /// The resourceVersion the elector was last woken for (a `Released` of it arrived, or
    /// [`Peers::may_take`] began to allow taking it).
    woken_for: Option<String>,
    /// Whether the write being made carries the ride-through marker
    /// ([`RideLink::ride_cap`] answered `Some`): only such a renewal is recorded for a ride.
    marked: bool,
}

struct State {
    peers: Peers,
    leases: BTreeMap<LeaseRef, Registered>,
    /// The last good API probe answer.
    api_ok_at: Option<Instant>,
    /// Leases released after a hand-over request, with when: `Released` goes out for
    /// [`RELEASED_REPEAT`].
    released: Vec<(Instant, HeldLease)>,
    /// The peer key(s) from the Secret; `None` until read (keyless: nothing is sent, frames
    /// are not checked, no lease rides, and candidates follow the plain rule of
    /// [`crate::election::ridemark`]).
    ring: Option<KeyRing>,
}

struct Inner {
    cfg: RideConfig,
    own: String,
    state: Mutex<State>,
    api_back: watch::Sender<u64>,
    /// Wakes the heartbeat task before its tick: a hand-over request or `Released` to act
    /// on or to send.
    kick: tokio::sync::Notify,
    metrics: Arc<PeerMetrics>,
    readiness: Readiness,
}

impl Inner {
    /// Records whether lease `name` (`namespace/name`) rides through: the
    /// `vipd_ride_through` metric and the `/readyz` line.
    fn set_riding(&self, name: &str, riding: bool) {
        self.metrics.set_riding(name, riding);
        self.readiness.set_riding(name, riding);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind: keep using it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// This process's side of the peer protocol (see the module docs). Cheap to clone.
#[derive(Clone)]
pub(crate) struct PeerNode(Arc<Inner>);

/// What [`PeerNode::start`] needs.
pub(crate) struct PeerParts {
    /// This node's name (`vip_nodename`).
    pub node: String,
    /// Protocol timings.
    pub cfg: RideConfig,
    /// `cp_namespace`: where the peer key Secret is (read at start and every [`KEY_POLL`]).
    pub namespace: String,
    /// The socket on the Services interface.
    pub socket: PeerSocket,
    /// This process's boot id ([`super::wire::new_boot_id`]).
    pub boot_id: u64,
    /// For the API probe.
    pub client: kube::Client,
    /// The Node cache (membership).
    pub nodes: Store<Node>,
    /// Metrics.
    pub metrics: Metrics,
    /// Readiness (the `/readyz` line of riding leases).
    pub readiness: Readiness,
}

impl PeerNode {
    /// Starts heartbeats, the receiver and the API probe until `stop`. Should the
    /// receiver thread not start (logged), this node hears nobody: it never rides through
    /// and, as a candidate, takes a silent holder's lease only after the ride cap.
    pub(crate) fn start(parts: PeerParts, stop: CancellationToken) -> Self {
        let boot_id = parts.boot_id;
        let inner = Arc::new(Inner {
            cfg: parts.cfg,
            own: parts.node.clone(),
            state: Mutex::new(State {
                peers: Peers::new(parts.cfg, &parts.node),
                leases: BTreeMap::new(),
                api_ok_at: None,
                released: Vec::new(),
                ring: None,
            }),
            api_back: watch::Sender::new(0),
            kick: tokio::sync::Notify::new(),
            metrics: parts.metrics.families::<PeerMetrics>(),
            readiness: parts.readiness.clone(),
        });
        let socket = Arc::new(parts.socket);
        let node = PeerNode(inner);
        parts.readiness.set_ride_state(Some(KEYLESS_STATE));
        tokio::spawn(
            node.clone()
                .heartbeats(boot_id, socket.clone(), parts.nodes, stop.clone()),
        );
        tokio::spawn(
            node.clone()
                .follow_key(parts.client.clone(), parts.namespace, stop.clone()),
        );
        tokio::spawn(node.clone().probe(parts.client, stop.clone()));
        let rx = node.clone();
        let rx_stop = stop.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("vipd-peer-rx".into())
            .spawn(move || rx.receive_loop(&socket, &rx_stop))
        {
            tracing::error!(error = %e, "peer protocol: the receiver thread did not start; this node hears no peer, so it never rides through");
        }
        info!(node = %parts.node, boot_id = format!("{boot_id:016x}"), "peer protocol started; Service VIPs ride through API server outages once the peer key is read");
        node
    }

    /// Reads the peer key Secret at start (retrying failures that may pass for
    /// [`KEY_START_PATIENCE`]) and again every [`KEY_POLL`] until `stop` (see
    /// [`super::key`]): a key created later arms ride-through without a restart, a changed
    /// one is a rotation. Without a key: one WARN naming the Secret, what is wrong and the
    /// command that creates it.
    async fn follow_key(self, client: kube::Client, namespace: String, stop: CancellationToken) {
        let mut patience = KEY_START_PATIENCE;
        let mut warned = false;
        // The last bad Secret content warned about while a key is held (once per content).
        let mut warned_invalid: Option<String> = None;
        loop {
            match super::key::read_key_with_id(&client, &namespace, patience).await {
                Ok((key, id)) => {
                    warned_invalid = None;
                    self.install_key(key, id, Instant::now());
                }
                Err(super::key::KeyReadError::Invalid(e)) if self.0.lock().ring.is_some() => {
                    if warned_invalid.as_deref() != Some(e.as_str()) {
                        warn!(
                            "svc_ridethrough: {e}. This node keeps the key it read before and still rides through; a vipd that starts now runs without ride-through"
                        );
                        warned_invalid = Some(e);
                    }
                }
                Err(e) if self.0.lock().ring.is_some() => {
                    debug!(error = %e, "peer protocol: cannot read the peer key again; keeping the key read before");
                }
                Err(e) if !warned => {
                    warn!(
                        "svc_ridethrough: {e}. Until then this node runs without ride-through: its Service VIPs go at the renew deadline when the API server is unreachable, and it takes a lease marked by a riding holder only after the ride cap (the Secret is read again every {} s, no restart needed)",
                        KEY_POLL.as_secs()
                    );
                    warned = true;
                }
                Err(e) => debug!(error = %e, "peer protocol: still no peer key"),
            }
            patience = Duration::ZERO;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(KEY_POLL) => {}
            }
        }
    }

    /// A key read at `now`: arms ride-through (the first) or starts a rotation (a new one).
    fn install_key(&self, key: PeerKey, id: KeyId, now: Instant) {
        let mut st = self.0.lock();
        match &mut st.ring {
            None => {
                st.ring = Some(KeyRing::new(key, id));
                self.0.readiness.set_ride_state(Some(ARMED_STATE));
                info!(
                    "svc_ridethrough: peer key read; Service VIPs ride through API server outages while a majority of the vipd nodes vouch"
                );
            }
            Some(ring) => {
                if ring.update(key, id, now) {
                    info!(
                        sign_old_s = KEY_SIGN_DELAY.as_secs(),
                        accept_old_s = KEY_OVERLAP.as_secs(),
                        "svc_ridethrough: the peer key changed (rotation); signing with the previous key a while longer, accepting both"
                    );
                }
            }
        }
    }

    /// The key to sign with now; `None` while keyless.
    fn signing_key(&self) -> Option<PeerKey> {
        let st = self.0.lock();
        st.ring.as_ref().map(|r| r.signing(Instant::now()).clone())
    }

    /// The link of Service lease `namespace/name` for its elector.
    pub(crate) fn link(&self, namespace: &str, name: &str) -> Arc<dyn RideLink> {
        let lease = LeaseRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        self.0.lock().leases.insert(
            lease.clone(),
            Registered {
                state: None,
                term: 0,
                riding: false,
                news: watch::Sender::new(0),
                view: None,
                release_to: None,
                woken_for: None,
                marked: false,
            },
        );
        Arc::new(LeaseLink {
            node: self.0.clone(),
            lease,
        })
    }

    /// Heartbeats (and ride-through evaluations before each) until `stop`.
    async fn heartbeats(
        self,
        boot_id: u64,
        socket: Arc<PeerSocket>,
        nodes: Store<Node>,
        stop: CancellationToken,
    ) {
        let mut enc: Option<Encoder> = None;
        let mut tick = tokio::time::interval(self.0.cfg.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut members: BTreeSet<String> = BTreeSet::new();
        let mut send_failing = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
                () = self.0.kick.notified() => {}
            }
            // Keyless: nothing to send, no lease rides (see `State::ring`).
            let Some(signing) = self.signing_key() else {
                continue;
            };
            let enc = enc.get_or_insert_with(|| Encoder::new(signing.clone(), boot_id));
            enc.set_key(signing);
            let names = super::membership_of(nodes.state().iter().map(|n| n.as_ref()));
            let msgs = {
                let now = Instant::now();
                let mut st = self.0.lock();
                if names != members {
                    info!(nodes = ?names, "peer protocol: membership");
                    members = names;
                    st.peers.set_membership(members.clone());
                }
                let api = reaches_api(st.api_ok_at, now);
                st.peers.set_api(now, api);
                let asks = self.evaluate(&mut st, now, api);
                let flags = st.peers.outgoing_flags(now);
                let wall = wall_ms(SystemTime::now());
                let membership = st.peers.digest();
                let own = self.0.own.clone();
                let msg = |kind, leases, target| Message {
                    kind,
                    node: own.clone(),
                    flags,
                    membership,
                    wall_ms: wall,
                    leases,
                    target,
                };
                let mut msgs = vec![msg(Kind::Heartbeat, st.peers.listed(now), None)];
                st.released
                    .retain(|(at, _)| now.saturating_duration_since(*at) < RELEASED_REPEAT);
                if !st.released.is_empty() {
                    let leases = st.released.iter().map(|(_, h)| h.clone()).collect();
                    msgs.push(msg(Kind::Released, leases, None));
                }
                let base = msg(Kind::HandOverRequest, Vec::new(), None);
                msgs.extend(hand_over_requests(&base, asks));
                msgs
            };
            let mut frames = Vec::new();
            for m in &msgs {
                match enc.encode(m) {
                    Ok(f) => frames.extend(f),
                    Err(e) => {
                        warn!(error = %e, kind = ?m.kind, "peer protocol: cannot encode a message")
                    }
                }
            }
            for f in frames {
                match socket.send(&f) {
                    Ok(()) if send_failing => {
                        send_failing = false;
                        info!("peer protocol: sending heartbeats works again");
                    }
                    Ok(()) => {}
                    Err(e) => {
                        if !send_failing {
                            warn!(error = %e, "peer protocol: cannot send a heartbeat");
                        }
                        send_failing = true;
                    }
                }
            }
        }
    }

    /// One ride-through evaluation of every lease this node leads (see the module docs).
    /// While this node does not reach the API, or a lease's last renewal is so old that its
    /// VIPs' lifetime ends within two heartbeats, that lease's state is also touched
    /// (unchanged unless a ride grant raises it) so that its VIP holder refreshes the VIPs
    /// at every heartbeat for what the fence grants: within the API fence
    /// ([`crate::lease::fence_grant`], rule 3) and then within the ride grant. Renewals,
    /// which would otherwise refresh them, fail meanwhile; without this the VIPs would
    /// lapse at the fence lifetime after the last renewal, before a ride can start (the
    /// probe notices an outage only [`API_WINDOW`] after the last good answer).
    ///
    /// Hand-overs: a lease this node leads and is asked for while it cannot reach the API
    /// ([`Peers::should_release`]) is flagged for its elector (which steps down at once);
    /// for a lease it does not lead, [`Peers::may_take`] on the elector's last view says
    /// whether to ask its holder (returned: target node and leases, one hand-over request
    /// each) or to wake the elector for a `Released` version.
    fn evaluate(
        &self,
        st: &mut State,
        now: Instant,
        api: bool,
    ) -> BTreeMap<String, Vec<HeldLease>> {
        let State { peers, leases, .. } = st;
        let soon = self.0.cfg.fence.saturating_sub(self.0.cfg.interval * 2);
        let mut asks: BTreeMap<String, Vec<HeldLease>> = BTreeMap::new();
        // One line per outage, not per lease: the first lease to ride says so, the last
        // to end normally says it is over (both with the leases of this pass).
        let riding_before = leases.values().filter(|r| r.riding).count();
        let mut started: Vec<String> = Vec::new();
        let mut ended: Vec<String> = Vec::new();
        for (lease, reg) in leases.iter_mut() {
            let Some(state) = &reg.state else { continue };
            let renewed = match *state.borrow() {
                LeaderState::Leading {
                    term, renewed_at, ..
                } if term == reg.term => Some(renewed_at),
                _ => None,
            };
            let Some(renewed_at) = renewed.filter(|_| reg.term != 0) else {
                reg.riding = false;
                if reg.term == 0
                    && let Some(view) = &reg.view
                {
                    match peers.may_take(now, view) {
                        TakeDecision::AskFirst { holder } => {
                            asks.entry(holder).or_default().push(HeldLease {
                                lease: lease.clone(),
                                term: 0,
                                resource_version: view.resource_version.clone(),
                            });
                        }
                        TakeDecision::Take(reason)
                            if reg.woken_for.as_ref() != Some(&view.resource_version) =>
                        {
                            // Wake the elector now rather than at its next retry (up to a
                            // retry period after the peers allow the take).
                            let name = format!("{}/{}", lease.namespace, lease.name);
                            match &reason {
                                TakeReason::Released { holder } => {
                                    info!(lease = %name, %holder, "peer protocol: the holder handed the lease over; taking it");
                                }
                                other => {
                                    debug!(lease = %name, reason = ?other, "peer protocol: the lease may be taken now");
                                }
                            }
                            reg.woken_for = Some(view.resource_version.clone());
                            reg.news.send_modify(|v| *v += 1);
                        }
                        _ => {}
                    }
                }
                continue;
            };
            let touch = !api || now.saturating_duration_since(renewed_at) >= soon;
            let name = format!("{}/{}", lease.namespace, lease.name);
            let decision = peers.may_ride_through(now, lease);
            if reg.release_to.is_none()
                && let Some(by) = peers.should_release(now, lease)
            {
                warn!(lease = %name, asked_by = %by, "peer protocol: a peer that reaches the API asks for the lease and this node cannot reach it: handing over");
                reg.release_to = Some(by);
                reg.news.send_modify(|v| *v += 1);
            }
            let raise = match &decision {
                RideDecision::Ride { until } => ride_renewed_at(*until, self.0.cfg.lease_duration),
                _ => None,
            };
            // A step-down whose VIPs must go now (another node lists the lease) gets no
            // further refresh: the VIPs keep at most the lifetime they have.
            let drop_now = matches!(&decision, RideDecision::StepDown(r) if r.drop_now());
            publish_grant(state, reg.term, raise, touch && !drop_now);
            match decision {
                RideDecision::Ride { .. } => {
                    if !reg.riding {
                        debug!(lease = %name, "riding through");
                        started.push(name.clone());
                        reg.riding = true;
                        self.0.set_riding(&name, true);
                    }
                }
                RideDecision::StepDown(why) => {
                    if reg.riding {
                        warn!(lease = %name, reason = ?why, "ride-through ended; the VIPs go when the last grant ends unless a renewal succeeds first");
                        reg.riding = false;
                        self.0.set_riding(&name, false);
                    }
                }
                RideDecision::NotNeeded => {
                    if reg.riding {
                        debug!(lease = %name, "ride-through ends, renewing");
                        ended.push(name.clone());
                        reg.riding = false;
                        self.0.set_riding(&name, false);
                    }
                }
            }
        }
        let riding_after = leases.values().filter(|r| r.riding).count();
        log_ride_edges(riding_before, riding_after, &started, &ended);
        asks
    }

    /// The API probe until `stop` (see the module docs).
    async fn probe(self, client: kube::Client, stop: CancellationToken) {
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut reachable = true;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let sent = Instant::now();
            let ok = match http::Request::get("/readyz").body(Vec::new()) {
                Ok(req) => matches!(
                    tokio::time::timeout(PROBE_TIMEOUT, client.request_text(req)).await,
                    Ok(Ok(body)) if body.trim() == "ok"
                ),
                Err(_) => false,
            };
            let now = Instant::now();
            let api = {
                let mut st = self.0.lock();
                if ok {
                    st.api_ok_at = Some(now);
                    st.peers.probe_ok(sent);
                }
                let api = reaches_api(st.api_ok_at, now);
                st.peers.set_api(now, api);
                api
            };
            if api != reachable {
                if api {
                    info!("peer protocol: API server reachable again");
                    self.0.api_back.send_modify(|v| *v += 1);
                } else {
                    warn!(
                        "peer protocol: API server unreachable (no good /readyz answer for {} ms)",
                        API_WINDOW.as_millis()
                    );
                }
                reachable = api;
                self.0.metrics.set_api_reachable(api);
            }
        }
    }

    /// The receiver (a thread: blocking reads with kernel timestamps) until `stop`.
    fn receive_loop(&self, socket: &PeerSocket, stop: &CancellationToken) {
        let mut verifier: Option<Verifier> = None;
        let mut assembler = super::verify::Assembler::default();
        let mut failing = false;
        let mut no_stamp_warned = false;
        while !stop.is_cancelled() {
            let r = match socket.recv(Duration::from_millis(200)) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "peer protocol: cannot receive");
                        failing = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            failing = false;
            let now = Instant::now();
            let wall = SystemTime::now();
            // The arrival instant on the monotonic clock: now less the time the frame
            // waited since the kernel stamped it (frames queued while vipd was frozen keep
            // their old arrival). Without a stamp, now (the kernel always stamps).
            let waited = match r.arrived {
                Some(a) => wall.duration_since(a).unwrap_or_default(),
                None => {
                    if !no_stamp_warned {
                        warn!("peer protocol: a frame without kernel receive timestamp");
                        no_stamp_warned = true;
                    }
                    Duration::ZERO
                }
            };
            let at = now.checked_sub(waited).unwrap_or(now);
            let keys = self.0.lock().ring.as_ref().map(|k| k.accepted(now));
            let Some((key, previous)) = keys else {
                self.0.metrics.frame("no_key");
                continue;
            };
            let verifier =
                verifier.get_or_insert_with(|| Verifier::new(key.clone(), DEFAULT_MAX_SKEW_MS));
            verifier.set_keys(key, previous);
            match verifier.verify(&r.payload, wall_ms(wall)) {
                Ok(frame) => {
                    self.0.metrics.frame("accepted");
                    if let Some(msg) = assembler.push(frame) {
                        self.0.lock().peers.receive(at, &msg);
                        let for_us = match msg.kind {
                            Kind::HandOverRequest => msg.target.as_deref() == Some(&self.0.own),
                            Kind::Released => true,
                            Kind::Heartbeat => false,
                        };
                        if for_us {
                            // Act on it now, not at the next heartbeat.
                            self.0.kick.notify_one();
                        }
                    }
                }
                Err(e) => {
                    self.0.metrics.frame(rejection_label(&e));
                    debug!(error = %e, "peer protocol: frame rejected");
                }
            }
        }
    }
}

/// One [`Kind::HandOverRequest`] per asked lease, each to its holder, built from `base`
/// (flags, membership, clock of this tick): the wire format names exactly one lease per
/// request (`wire::validate`), so the leases asked of one holder are never grouped. (A
/// grouped request could not be encoded: nothing was sent, and a holder partitioned from
/// the API alone kept a lease of a busy node until expiry instead of handing it over.)
pub(crate) fn hand_over_requests(
    base: &Message,
    asks: BTreeMap<String, Vec<HeldLease>>,
) -> Vec<Message> {
    asks.into_iter()
        .flat_map(|(holder, leases)| leases.into_iter().map(move |l| (holder.clone(), l)))
        .map(|(holder, lease)| Message {
            kind: Kind::HandOverRequest,
            leases: vec![lease],
            target: Some(holder),
            ..base.clone()
        })
        .collect()
}

/// Publishes a ride grant on a lease's elector state: raises `renewed_at` to `raise` (see
/// [`ride_renewed_at`]) and, with `touch`, notifies the VIP holder even when nothing
/// changed (it then refreshes what its fence grants). Only a `Leading` state of `term`,
/// checked under the channel's lock: a step-down or a new term published meanwhile is never
/// undone or extended, and `renewed_at` never goes down. Whether receivers were notified.
pub(crate) fn publish_grant(
    state: &watch::Sender<LeaderState>,
    term: u64,
    raise: Option<Instant>,
    touch: bool,
) -> bool {
    state.send_if_modified(|s| match s {
        LeaderState::Leading {
            term: t,
            renewed_at,
            ..
        } if *t == term => {
            let raised = match raise {
                Some(r) if r > *renewed_at => {
                    *renewed_at = r;
                    true
                }
                _ => false,
            };
            raised || touch
        }
        _ => false,
    })
}

/// The metric label of a rejection.
pub(crate) fn rejection_label(r: &Rejection) -> &'static str {
    use super::wire::DecodeError;
    match r {
        Rejection::Decode(DecodeError::Mac) => "bad_mac",
        Rejection::Decode(DecodeError::Magic { .. }) => "bad_magic",
        Rejection::Decode(DecodeError::Version { .. }) => "bad_version",
        Rejection::Decode(_) => "malformed",
        Rejection::Skew { .. } => "skew",
        Rejection::Replay { .. } => "replay",
        Rejection::OldBoot { .. } => "old_boot",
    }
}

fn wall_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One Service lease's [`RideLink`] (see the module docs); unregisters on drop.
struct LeaseLink {
    node: Arc<Inner>,
    lease: LeaseRef,
}

impl Drop for LeaseLink {
    fn drop(&mut self) {
        self.node.lock().leases.remove(&self.lease);
        self.node.set_riding(
            &format!("{}/{}", self.lease.namespace, self.lease.name),
            false,
        );
    }
}

impl RideLink for LeaseLink {
    fn attach(&self, state: Arc<watch::Sender<LeaderState>>) {
        if let Some(r) = self.node.lock().leases.get_mut(&self.lease) {
            r.state = Some(state);
        }
    }

    fn renewed(&self, term: u64, resource_version: &str, sent: Instant) {
        let mut st = self.node.lock();
        let held = HeldLease {
            lease: self.lease.clone(),
            term,
            resource_version: resource_version.chars().take(64).collect(),
        };
        // Only a write that carried the ride-through marker may be ridden on
        // (`election::ridemark`): candidates take an unmarked one at plain expiry, so an
        // unmarked write also ends any ride on an earlier marked one (a holder that left its
        // membership and came back must not ride on a write older than what they observed).
        if st.leases.get(&self.lease).is_some_and(|r| r.marked) {
            st.peers.renewed(held, sent, false);
        } else {
            st.peers.dropped(&self.lease);
        }
        if let Some(r) = st.leases.get_mut(&self.lease) {
            r.term = term;
            r.view = None;
            r.release_to = None;
        }
    }

    fn dropped(&self) {
        let mut st = self.node.lock();
        let asked = st
            .leases
            .get_mut(&self.lease)
            .and_then(|r| r.release_to.take());
        if let Some(by) = asked
            && let Some(held) = st.peers.released(&self.lease)
        {
            // The VIPs are confirmed gone: now `Released` may go out (P6).
            info!(lease = %format!("{}/{}", self.lease.namespace, self.lease.name), to = %by, "peer protocol: VIPs removed, lease released to the peers");
            st.released.push((Instant::now(), held));
            self.node.kick.notify_one();
        }
        st.peers.dropped(&self.lease);
        if let Some(r) = st.leases.get_mut(&self.lease) {
            r.term = 0;
            r.riding = false;
        }
    }

    fn may_acquire(&self, now: Instant, observed: Option<&Observed>, observed_at: Instant) -> bool {
        if self.node.lock().ring.is_none() {
            // Keyless: the rule of a node that cannot follow P5 (mixed clusters).
            return crate::election::record::plain_may_take(observed, observed_at, now);
        }
        let view = LeaseView {
            lease: self.lease.clone(),
            holder: observed
                .filter(|o| o.record.is_held())
                .map(|o| o.record.holder.clone()),
            resource_version: observed
                .map(|o| o.resource_version.clone())
                .unwrap_or_default(),
            observed_at,
            control_plane: false,
            marked: observed.is_some_and(|o| o.record.ride_through.is_some()),
        };
        let d = self.node.lock().peers.may_take(now, &view);
        match d {
            TakeDecision::Take(why) => {
                debug!(lease = %format!("{}/{}", self.lease.namespace, self.lease.name), reason = ?why, "peer protocol: may take the lease");
                true
            }
            other => {
                debug!(lease = %format!("{}/{}", self.lease.namespace, self.lease.name), decision = ?other, "peer protocol: not taking the lease yet");
                false
            }
        }
    }

    fn api_back(&self) -> watch::Receiver<u64> {
        self.node.api_back.subscribe()
    }

    fn observe(&self, observed: Option<&Observed>, observed_at: Instant) {
        let view = observed.filter(|o| o.record.is_held()).map(|o| LeaseView {
            lease: self.lease.clone(),
            holder: Some(o.record.holder.clone()),
            resource_version: o.resource_version.chars().take(64).collect(),
            observed_at,
            control_plane: false,
            marked: o.record.ride_through.is_some(),
        });
        if let Some(r) = self.node.lock().leases.get_mut(&self.lease)
            && r.view != view
        {
            r.view = view;
        }
    }

    fn handed_over(&self, observed: &Observed) -> bool {
        self.node.lock().peers.released_by(
            &observed.record.holder,
            &self.lease,
            &observed
                .resource_version
                .chars()
                .take(64)
                .collect::<String>(),
        )
    }

    fn hand_over_requested(&self) -> Option<String> {
        let mut st = self.node.lock();
        let now = Instant::now();
        let still = st.peers.should_release(now, &self.lease).is_some();
        let r = st.leases.get_mut(&self.lease)?;
        if !still {
            // The API came back (or the request is stale) before the elector acted.
            r.release_to = None;
        }
        r.release_to.clone()
    }

    fn news(&self) -> watch::Receiver<u64> {
        match self.node.lock().leases.get(&self.lease) {
            Some(r) => r.news.subscribe(),
            None => watch::Sender::new(0).subscribe(),
        }
    }

    fn ride_cap(&self) -> Option<Duration> {
        let mut st = self.node.lock();
        // Marked (and ridden) only with the key and as a member of its own membership: a
        // holder that has not read the Node objects yet, or whose Node is missing, cannot
        // ride, and candidates take its unmarked lease at expiry (P5).
        let may = st.ring.is_some() && st.peers.may_mark();
        let r = st.leases.get_mut(&self.lease)?;
        r.marked = may;
        may.then_some(self.node.cfg.max_ride)
    }
}

/// The aggregated ride-through log lines of one pass over the leases: a WARN when leases
/// start riding and none rode before (the outage begins: how many, the first few names),
/// an INFO when leases ended their ride normally (the API is back) and none rides any more.
/// Per-lease detail is at DEBUG.
fn log_ride_edges(before: usize, after: usize, started: &[String], ended: &[String]) {
    let first = |v: &[String]| v.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    if before == 0 && !started.is_empty() {
        warn!(leases = started.len(), first = %first(started), "API server unreachable: riding through (a majority of the vipd nodes vouch, none reaches the API)");
    }
    if after == 0 && !ended.is_empty() {
        info!(leases = ended.len(), first = %first(ended), "API server reachable again: ride-through ends, renewing");
    }
}
