//! A multi-node model: several nodes' [`Peers`] state machines exchange real signed frames
//! (encoded, verified, assembled) over a simulated segment with partitions, around a
//! simulated Lease in the API server, with explicit instants in 50 ms steps. Each node runs
//! a small model of the elector and VIP holder: it renews every second while it reaches
//! the API, gives its VIPs the kernel fence (2 s) at each renewal or ride-through refresh,
//! steps down at the renew deadline unless it rides through, and takes the lease when
//! [`Peers::may_take`] says so. The kernel removes a VIP when its lifetime ends, also on a
//! frozen node. After every step the model checks the promise: never two nodes with a live
//! VIP of the lease.

use crate::peer::verify::{Assembler, DEFAULT_MAX_SKEW_MS, Verifier};
use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use super::Gen;
use crate::lease::Timing;
use crate::peer::ridethrough::*;
use crate::peer::wire::*;

const TICK: Duration = Duration::from_millis(50);
const RETRY: Duration = Duration::from_secs(1);
const FENCE_SECS: u32 = 2;
const WALL0_MS: u64 = 1_790_000_000_000;

fn timing() -> Timing {
    Timing {
        lease_duration: Duration::from_secs(5),
        renew_deadline: Duration::from_secs(3),
        retry_period: RETRY,
    }
}

fn lease_ref() -> LeaseRef {
    LeaseRef {
        namespace: "default".into(),
        name: "vipd-svc-web".into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Power {
    On,
    Frozen(Instant),
    Off,
}

#[derive(Debug, Clone)]
struct Lead {
    term: u64,
    rv: u64,
    renewed_at: Instant,
    riding: bool,
}

struct Node {
    name: String,
    cfg: RideConfig,
    peers: Peers,
    enc: Encoder,
    ver: Verifier,
    asm: Assembler,
    power: Power,
    /// Reaches the API server (when it is up).
    api_link: bool,
    inbox: Vec<(Instant, Vec<u8>)>,
    lead: Option<Lead>,
    term: u64,
    vip_until: Option<Instant>,
    /// (resourceVersion, when this node observed it).
    seen: Option<(u64, Instant)>,
    next_hb: Instant,
    next_renew: Instant,
    /// Released this resourceVersion to a peer: do not campaign while it is current.
    released_rv: Option<u64>,
    /// Takes at plain expiry, ignoring the peers (negative control).
    naive: bool,
    /// Under [`Sim::probes`]: this node probes `/readyz` at the steps whose index is this
    /// modulo 5 (every 250 ms, phases apart), and its last good answer.
    probe_phase: u64,
    probe_ok_at: Option<Instant>,
}

/// What happened, for assertions.
#[derive(Debug, Default)]
struct Log {
    /// Steps with two or more live VIPs: (ms since start, nodes).
    overlaps: Vec<(u128, Vec<usize>)>,
    /// Steps with no live VIP, ms since start.
    gaps: Vec<u128>,
    /// Successful takes: (ms since start, node, reason).
    takes: Vec<(u128, usize, TakeReason)>,
    /// Ride-through step-downs: (ms, node, reason).
    stepdowns: Vec<(u128, usize, StepDownReason)>,
    /// Releases after a hand-over request: (ms, node).
    releases: Vec<(u128, usize)>,
}

struct Sim {
    start: Instant,
    now: Instant,
    nodes: Vec<Node>,
    api_up: bool,
    holder: Option<usize>,
    rv: u64,
    /// link[i][j]: frames from i reach j.
    link: Vec<Vec<bool>>,
    cfg: RideConfig,
    boot_counter: u64,
    /// Frames lost on the segment, per thousand (drawn from `rng`).
    loss_permille: u64,
    /// The nodes learn whether they reach the API from `/readyz` probes, as `peer::node`
    /// does (a good answer within the 1 s API window), not from their writes; `false`: at
    /// once from the API's state.
    probes: bool,
    /// `/readyz` keeps answering `ok` until then although writes fail (`api_up` false): an
    /// API server whose etcd stalls.
    readyz_until: Option<Instant>,
    rng: Gen,
    log: Log,
}

fn key() -> PeerKey {
    PeerKey::from_bytes(&[0x5a; 32]).expect("key")
}

impl Sim {
    fn new(n: usize) -> Sim {
        Sim::with(n, |_| {})
    }

    fn with(n: usize, tune: impl Fn(&mut RideConfig)) -> Sim {
        Sim::with_timing(n, &timing(), tune)
    }

    /// A segment of `n` nodes whose leases have `timing` (renewals still every second).
    fn with_timing(n: usize, timing: &Timing, tune: impl Fn(&mut RideConfig)) -> Sim {
        let mut cfg = RideConfig::unchecked_start(timing, FENCE_SECS).expect("config");
        tune(&mut cfg);
        cfg.check().expect("tuned config");
        let start = Instant::now();
        let mut s = Sim {
            start,
            now: start,
            nodes: Vec::new(),
            api_up: true,
            holder: None,
            rv: 1,
            link: vec![vec![true; n]; n],
            cfg,
            boot_counter: 0,
            loss_permille: 0,
            probes: false,
            readyz_until: None,
            rng: Gen(0x2545_F491_4F6C_DD1D),
            log: Log::default(),
        };
        for i in 0..n {
            let node = s.boot(i);
            s.nodes.push(node);
        }
        s
    }

    fn membership(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("n{i}")).collect()
    }

    fn boot(&mut self, i: usize) -> Node {
        self.boot_counter += 1;
        let name = format!("n{i}");
        let mut peers = Peers::new(self.cfg, &name);
        peers.set_membership(Sim::membership(self.link.len()));
        Node {
            name,
            cfg: self.cfg,
            peers,
            enc: Encoder::new(key(), self.boot_counter),
            ver: Verifier::new(key(), DEFAULT_MAX_SKEW_MS),
            asm: Assembler::default(),
            power: Power::On,
            api_link: true,
            inbox: Vec::new(),
            lead: None,
            term: 0,
            vip_until: None,
            seen: None,
            next_hb: self.now,
            next_renew: self.now,
            released_rv: None,
            naive: false,
            probe_phase: i as u64 % 5,
            probe_ok_at: None,
        }
    }

    fn ms(&self) -> u128 {
        self.now.duration_since(self.start).as_millis()
    }

    fn wall(&self) -> u64 {
        WALL0_MS + u64::try_from(self.ms()).expect("ms")
    }

    fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| {
                self.nodes[*i].power != Power::Off
                    && self.nodes[*i].vip_until.is_some_and(|u| u > self.now)
            })
            .collect()
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }

    fn step(&mut self) {
        self.now += TICK;
        for i in 0..self.nodes.len() {
            let out = self.step_node(i);
            for b in out {
                self.broadcast(i, &b);
            }
        }
        let live = self.live();
        let ms = self.ms();
        if live.len() > 1 {
            self.log.overlaps.push((ms, live));
        } else if live.is_empty() {
            self.log.gaps.push(ms);
        }
    }

    fn broadcast(&mut self, from: usize, bytes: &[u8]) {
        let wall = self.wall();
        for j in 0..self.nodes.len() {
            if j == from || !self.link[from][j] {
                continue;
            }
            if self.loss_permille > 0 && self.rng.below(1000) < self.loss_permille {
                continue;
            }
            let now = self.now;
            let n = &mut self.nodes[j];
            match n.power {
                Power::Off => {}
                Power::Frozen(_) => n.inbox.push((now, bytes.to_vec())),
                Power::On => n.deliver(now, bytes, wall),
            }
        }
    }

    fn api_ok(&self, i: usize) -> bool {
        self.api_up && self.nodes[i].api_link
    }

    fn step_node(&mut self, i: usize) -> Vec<Vec<u8>> {
        let now = self.now;
        let wall = self.wall();
        if !self.wake(i, now, wall) {
            return Vec::new();
        }
        let api = self.api_ok(i);
        let mut out = Vec::new();
        self.observe_api(i, api, now);
        if !self.step_holder(i, api, now, wall, &mut out) {
            self.step_candidate(i, api, now, wall, &mut out);
        }
        Sim::heartbeat(&mut self.nodes[i], out, now, wall)
    }

    /// Power: `false` while off or frozen; a node that thaws gets its queued frames.
    fn wake(&mut self, i: usize, now: Instant, wall: u64) -> bool {
        match self.nodes[i].power {
            Power::Off => return false,
            Power::Frozen(until) if now < until => return false,
            Power::Frozen(_) => {
                let n = &mut self.nodes[i];
                n.power = Power::On;
                for (at, b) in std::mem::take(&mut n.inbox) {
                    n.deliver(at, &b, wall);
                }
            }
            Power::On => {}
        }
        true
    }

    /// What node `i` learns from the API this step (a lease written by another node ends
    /// its leadership at once).
    fn observe_api(&mut self, i: usize, api: bool, now: Instant) {
        let lease = lease_ref();
        let (holder, rv) = (self.holder, self.rv);
        let step = u64::try_from(now.duration_since(self.start).as_millis() / TICK.as_millis())
            .expect("steps");
        let readyz = self.api_up || self.readyz_until.is_some_and(|u| now < u);
        let probes = self.probes;
        let n = &mut self.nodes[i];
        if probes {
            // A probe sent now, answered at once; reachable while the last good answer
            // is within the API window.
            if step % 5 == n.probe_phase && n.api_link && readyz {
                n.probe_ok_at = Some(now);
                n.peers.probe_ok(now);
            }
            n.peers.set_api(now, reaches_api(n.probe_ok_at, now));
        } else {
            n.peers.set_api(now, api);
            if api {
                // The sim's API answers at once: a probe sent now answered.
                n.peers.probe_ok(now);
            }
        }
        if api {
            if n.seen.is_none_or(|(r, _)| r != rv) {
                n.seen = Some((rv, now));
            }
            if n.lead.is_some() && holder != Some(i) {
                // Somebody else wrote the lease: stop at once.
                n.lead = None;
                n.vip_until = None;
                n.peers.dropped(&lease);
            }
        }
    }

    /// The holder's step: renew, ride through, or step down. `true` when the node must do
    /// nothing else this step (its VIP lives on a ride refresh past the API fence).
    fn step_holder(
        &mut self,
        i: usize,
        api: bool,
        now: Instant,
        wall: u64,
        out: &mut Vec<Vec<u8>>,
    ) -> bool {
        let lease = lease_ref();
        let holder = self.holder;
        let rv = self.rv;
        let cfg = self.nodes[i].cfg;
        let n = &mut self.nodes[i];
        // Holder: renew, ride through, or step down.
        if let Some(l) = n.lead.clone() {
            if api && now >= n.next_renew && holder == Some(i) && rv == l.rv {
                self.rv += 1;
                let rv = self.rv;
                let n = &mut self.nodes[i];
                n.next_renew = now + RETRY;
                n.lead = Some(Lead {
                    rv,
                    renewed_at: now,
                    riding: false,
                    ..l
                });
                n.seen = Some((rv, now));
                n.peers.renewed(held(l.term, rv), now, false);
                n.vip_until = Some(now + cfg.fence);
            } else if !api {
                if n.peers.should_release(now, &lease).is_some() {
                    n.vip_until = None;
                    n.released_rv = Some(l.rv);
                    n.lead = None;
                    if let Some(h) = n.peers.released(&lease) {
                        out.push(n.frame(Kind::Released, vec![h], None, now, wall));
                    }
                    self.log
                        .releases
                        .push((now.duration_since(self.start).as_millis(), i));
                } else {
                    match n.peers.may_ride_through(now, &lease) {
                        RideDecision::Ride { until } => {
                            let secs = until.saturating_duration_since(now).as_secs();
                            n.vip_until = (secs > 0).then(|| now + Duration::from_secs(secs));
                            if let Some(l) = &mut n.lead {
                                l.riding = true;
                            }
                        }
                        RideDecision::StepDown(r) => {
                            if r.drop_now() {
                                n.vip_until = None;
                            }
                            if let Some(l) = &mut n.lead
                                && l.riding
                            {
                                l.riding = false;
                                let ms = now.duration_since(self.start).as_millis();
                                self.log.stepdowns.push((ms, i, r));
                            }
                        }
                        RideDecision::NotNeeded => {}
                    }
                }
                let n = &mut self.nodes[i];
                if let Some(l) = &n.lead
                    && !l.riding
                {
                    // Not riding: the VIPs keep what the API fence grants (crate::lease::fence_grant),
                    // refreshed while it lasts; at its end the holder steps down.
                    let grant = crate::lease::fence_grant(
                        FENCE_SECS,
                        cfg.lease_duration,
                        now.saturating_duration_since(l.renewed_at),
                    );
                    if grant == 0 {
                        // Past it: what a ride refresh granted stays until the kernel
                        // removes it (a renewal may still come); then step down.
                        if n.vip_until.is_some_and(|u| u > now) {
                            return true;
                        }
                        n.lead = None;
                        n.vip_until = None;
                        n.peers.dropped(&lease);
                    } else if n.vip_until.is_some() {
                        n.vip_until = Some(now + Duration::from_secs(u64::from(grant)));
                    }
                }
            }
        }
        false
    }

    /// A candidate's step: take the lease, or ask its holder to hand it over.
    fn step_candidate(
        &mut self,
        i: usize,
        api: bool,
        now: Instant,
        wall: u64,
        out: &mut Vec<Vec<u8>>,
    ) {
        let lease = lease_ref();
        let (holder, rv) = (self.holder, self.rv);
        let holder_name = holder.map(|h| format!("n{h}"));
        let cfg = self.nodes[i].cfg;
        // Candidate.
        let probes = self.probes;
        let n = &mut self.nodes[i];
        // Under probes the candidate decides from what it believes (its probes), as
        // `peer::node` does; its write still needs the API.
        if n.lead.is_none()
            && (api || probes)
            && n.released_rv != Some(rv)
            && let Some((_, observed_at)) = n.seen
        {
            let view = LeaseView {
                lease: lease.clone(),
                holder: holder_name.clone(),
                resource_version: rv.to_string(),
                observed_at,
                control_plane: false,
                marked: true,
            };
            let d = if n.naive {
                if holder.is_none() || now >= observed_at + cfg.lease_duration {
                    TakeDecision::Take(TakeReason::NoOtherHolder)
                } else {
                    TakeDecision::NotExpired
                }
            } else {
                n.peers.may_take(now, &view)
            };
            match d {
                TakeDecision::Take(_) if !api => {}
                TakeDecision::Take(reason) => {
                    self.rv += 1;
                    self.holder = Some(i);
                    let rv = self.rv;
                    let n = &mut self.nodes[i];
                    n.term += 1;
                    n.lead = Some(Lead {
                        term: n.term,
                        rv,
                        renewed_at: now,
                        riding: false,
                    });
                    n.released_rv = None;
                    n.next_renew = now + RETRY;
                    n.seen = Some((rv, now));
                    n.peers.renewed(held(n.term, rv), now, false);
                    n.vip_until = Some(now + cfg.fence);
                    self.log
                        .takes
                        .push((now.duration_since(self.start).as_millis(), i, reason));
                }
                TakeDecision::AskFirst { holder } if now >= n.next_hb => {
                    let asked = HeldLease {
                        lease: lease.clone(),
                        term: 0,
                        resource_version: rv.to_string(),
                    };
                    out.push(n.frame(Kind::HandOverRequest, vec![asked], Some(holder), now, wall));
                }
                _ => {}
            }
        }
    }

    fn heartbeat(n: &mut Node, mut out: Vec<Vec<u8>>, now: Instant, wall: u64) -> Vec<Vec<u8>> {
        if now >= n.next_hb {
            n.next_hb = now + n.cfg.interval;
            let leases = n.peers.listed(now);
            out.push(n.frame(Kind::Heartbeat, leases, None, now, wall));
        }
        out
    }

    fn freeze(&mut self, i: usize, d: Duration) {
        self.nodes[i].power = Power::Frozen(self.now + d);
    }

    fn power_off(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.power = Power::Off;
        n.vip_until = None;
        n.lead = None;
    }

    /// A fresh process (new boot id) on a node that was off.
    fn power_on(&mut self, i: usize) {
        let naive = self.nodes[i].naive;
        let mut n = self.boot(i);
        n.naive = naive;
        self.nodes[i] = n;
    }

    /// Only frames within each group pass.
    fn partition(&mut self, groups: &[&[usize]]) {
        let n = self.nodes.len();
        for i in 0..n {
            for j in 0..n {
                self.link[i][j] = groups.iter().any(|g| g.contains(&i) && g.contains(&j));
            }
        }
    }

    fn heal(&mut self) {
        for row in &mut self.link {
            row.iter_mut().for_each(|l| *l = true);
        }
    }

    fn holder_name(&self) -> Option<usize> {
        self.holder
    }

    fn assert_safe(&self) {
        assert!(
            self.log.overlaps.is_empty(),
            "two live holders at (ms, nodes): {:?}; takes {:?}",
            &self.log.overlaps[..self.log.overlaps.len().min(5)],
            self.log.takes
        );
    }

    /// Longest run of steps with no live VIP after `from_ms`, in ms.
    fn longest_gap_after(&self, from_ms: u128) -> u128 {
        let mut longest = 0;
        let mut run = 0;
        let mut prev = None;
        for &g in self.log.gaps.iter().filter(|g| **g >= from_ms) {
            run = if prev == Some(g - TICK.as_millis()) {
                run + TICK.as_millis()
            } else {
                TICK.as_millis()
            };
            longest = longest.max(run);
            prev = Some(g);
        }
        longest
    }
}

fn held(term: u64, rv: u64) -> HeldLease {
    HeldLease {
        lease: lease_ref(),
        term,
        resource_version: rv.to_string(),
    }
}

impl Node {
    fn deliver(&mut self, at: Instant, bytes: &[u8], wall: u64) {
        if let Ok(f) = self.ver.verify(bytes, wall)
            && let Some(m) = self.asm.push(f)
        {
            self.peers.receive(at, &m);
        }
    }

    fn frame(
        &mut self,
        kind: Kind,
        leases: Vec<HeldLease>,
        target: Option<String>,
        now: Instant,
        wall: u64,
    ) -> Vec<u8> {
        let flags = self.peers.outgoing_flags(now);
        let msg = Message {
            kind,
            node: self.name.clone(),
            flags,
            membership: self.peers.digest(),
            wall_ms: wall,
            leases,
            target,
        };
        let mut frames = self.enc.encode(&msg).expect("encodes");
        frames.remove(0)
    }
}

mod cases;
