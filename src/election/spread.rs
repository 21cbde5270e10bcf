//! Spread without preemption: a node that holds more leases than its peers waits a little
//! before it acquires a free one, so leases (Service VIPs) spread evenly over the nodes that
//! campaign, and nobody ever takes a held lease away.
//!
//! The delay is relative. Every elector of a node reports who holds its lease
//! ([`Spread::watch_lease`], [`LeaseWatch::holder`]), so the node knows how many of the
//! leases it campaigns for each other node holds. A node holding `h` leases (plus `f`
//! acquisitions in flight) while the least loaded other holder holds `m` is `h + f - m`
//! ahead ([`lead`]). It takes a free lease no sooner than [`spread_delay`] of that lead
//! after the latest of three instants: when it saw the lease free, when it last acquired a
//! lease, and when it last began an acquisition. So:
//! * balanced nodes (and a node alone) take a free lease at once: a new Service, or a
//!   released lease raced by all, costs no delay;
//! * a node ahead of its peers lets them win, and paces itself through many free leases
//!   (a mass failover) one at a time, slower the further ahead it is;
//! * in the first [`SPREAD_DISCOVERY`] after the node's first attempt to acquire a lease
//!   the lead counts from zero (every lease held is ahead, whoever else holds what): the
//!   nodes of a cold start, which come up seconds apart, share the free leases instead of
//!   the first ones taking all before the last arrives (the other nodes show up as holders
//!   only once they win a lease). After that, a node that sees no other holder is alone and
//!   never waits. Counted from the first attempt, not from the process's start: with
//!   10 000 Services the nodes' first lists took 2.5 s, longer than the period, and one
//!   node, alone by then, took all 16 shard leases in 124 ms (and keeps them: no
//!   preemption).
//!
//! Shard leases add two rules ([`Spread::for_shards`]): a shard that does not exist yet is
//! paced from zero, and a freed shard is taken at once by a node below its [`fair_share`].
//!
//! A holder seen letting a lease expire is not counted for a lease duration while it holds
//! others ([`LeaseWatch::lapsed`]): a powered-off node's leases expire one after another.
//!
//! Nodes that hold nothing are invisible (they appear once they win a lease); that only
//! makes the least loaded visible node wait no more than an idle one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// Delay per lease a node is ahead of the least loaded other holder.
pub const SPREAD_STEP: Duration = Duration::from_millis(20);

/// Delay per lease a node is ahead under shard leases (`svc_leaseshards`): a shard carries
/// many Services and there are few of them, so one shard ahead must outweigh the seconds
/// by which the nodes of a cold start come up apart (with [`SPREAD_STEP`], the first node
/// took 5 shards in 160 ms, before a node starting 80 ms later looked). A node balanced
/// with its peers still takes a free shard at once, so a failover is paced only while one
/// node is ahead of another.
pub const SHARD_SPREAD_STEP: Duration = Duration::from_millis(250);

/// Upper bound of the spread delay (reached 50 leases ahead).
pub const SPREAD_CAP: Duration = Duration::from_secs(1);

/// Acquisitions a node may have in flight, once its discovery period is over, before they
/// count toward its lead under per-Service leases ([`Spread::new`]). The other nodes'
/// acquisitions in flight are invisible to it, so counting its own from the first made every
/// node of a balanced cluster look ahead during a burst of new Services (each node has
/// about its share of the creation rate times the API latency in flight): each paced itself
/// to one acquisition per 20 ms times that count, below the creation rate, and new Services
/// queued (1 000 created at 44 a second: create -> first answer p95 3.1 s, 0.45 s without
/// the pacing; docs/services-bench.md, twelfth session). Beyond the allowance they count as
/// before, so a node that begins many acquisitions at once (a mass failover) is still paced,
/// and a node ahead in leases held waits its lead. Shard leases ([`SHARD_SPREAD_STEP`]) keep
/// no allowance: a few shards, each worth hundreds of Services, alternate between the nodes
/// that race for them.
pub const SPREAD_IN_FLIGHT_ALLOWANCE: usize = 16;

/// How long after start the lead counts from zero (see the module doc).
pub const SPREAD_DISCOVERY: Duration = Duration::from_secs(2);

/// Extra delay per place a node stands behind in a Service's preferred-nodes list
/// (`vipd.io/preferred-nodes`): the first node waits nothing, the second one step, a node
/// not in the list as many steps as the list is long.
pub const PREFERENCE_STEP: Duration = Duration::from_millis(100);

/// Upper bound of the preference delay (a node 10 places back, or not in a list of 10 or
/// more).
pub const PREFERENCE_CAP: Duration = Duration::from_secs(1);

/// How long `node` waits, on top of its spread delay, before it acquires a free lease of
/// a Service whose preferred nodes are `preferred` (in order; empty: no preference): its
/// place in the list (0 for the first) times [`PREFERENCE_STEP`], the list's length for a
/// node not in it, at most [`PREFERENCE_CAP`]. So preferred nodes campaign first, and a
/// node that is not preferred still takes the lease when no preferred node does. Pure.
pub fn preference_delay(node: &str, preferred: &[String]) -> Duration {
    spread_delay(place(node, preferred), PREFERENCE_STEP, PREFERENCE_CAP)
}

/// `node`'s place in `preferred` (0 for the first), the list's length for a node not in it.
/// Pure.
fn place(node: &str, preferred: &[String]) -> usize {
    preferred
        .iter()
        .position(|n| n == node)
        .unwrap_or(preferred.len())
}

/// Whether `a` comes before `b` in `preferred` (a node not in the list comes after every
/// node in it; with no list nobody is more preferred): what fail-back judges by. Pure.
pub fn more_preferred(a: &str, b: &str, preferred: &[String]) -> bool {
    place(a, preferred) < place(b, preferred)
}

/// The delay of a node `ahead` leases ahead: `ahead` x `step`, at most `cap`. Pure.
pub fn spread_delay(ahead: usize, step: Duration, cap: Duration) -> Duration {
    let n = u32::try_from(ahead).unwrap_or(u32::MAX);
    step.checked_mul(n).unwrap_or(cap).min(cap)
}

/// A node's fair share of `leases` leases spread over itself and `other_holders` other nodes
/// that hold one: `leases` / (`other_holders` + 1), rounded up (0 for no lease). Under
/// shard leases a node below it takes a freed shard at once ([`Spread::for_shards`]). Pure.
pub fn fair_share(leases: usize, other_holders: usize) -> usize {
    leases.div_ceil(other_holders.saturating_add(1))
}

/// How many leases a node counting `own` (held plus in flight) is ahead of the least loaded
/// other holder, which holds `least_other` (`None`: no other holder seen). While
/// `discovering` (the first [`SPREAD_DISCOVERY`] after the node's first attempt to acquire)
/// the lead is `own` whatever
/// the others hold: nodes of a cold start come up seconds apart, and the ones already up
/// must not share everything among themselves before the last one arrives. After it, the
/// lead over the least loaded other holder, 0 with nobody else seen (alone). Pure.
pub fn lead(own: usize, least_other: Option<usize>, discovering: bool) -> usize {
    match least_other {
        _ if discovering => own,
        Some(m) => own.saturating_sub(m),
        None => 0,
    }
}

#[derive(Debug, Default)]
struct State {
    held: usize,
    in_flight: usize,
    last_acquired: Option<Instant>,
    last_begun: Option<Instant>,
    /// The end of the discovery period: [`Spread`]'s `discovery` after this node's first
    /// attempt to acquire or first acquisition (`None`: neither yet, still discovering
    /// unless the period is zero).
    discovery_until: Option<Instant>,
    /// How many leases this node's electors watch ([`LeaseWatch`]s alive): every lease it
    /// campaigns for, held by it, by another node or by nobody.
    watched: usize,
    /// Lease (`namespace/name`) -> its current holder, for the leases another node holds.
    others: HashMap<String, Arc<str>>,
    /// Holder -> how many entries of `others` name it.
    counts: HashMap<Arc<str>, usize>,
    /// Holders seen letting a lease expire (no release), with the end of their lapse: not
    /// counted as holders until then while they still hold others ([`Spread::ahead`],
    /// [`fair_share`]). A node powered off holds its unexpired leases for up to a retry
    /// period more (they lapse one after another); a live node that let one lapse (a slow
    /// renewal) renews its others, and counts again once the lapse ends (one lease
    /// duration), when it is seen taking a lease, or holds none any more.
    lapsed: HashMap<Arc<str>, Instant>,
}

impl State {
    /// Starts the discovery period of `discovery` at `now` unless it has started: at this
    /// node's first attempt to acquire or first acquisition.
    fn start_discovery(&mut self, now: Instant, discovery: Duration) {
        self.discovery_until.get_or_insert(now + discovery);
    }

    fn set_holder(&mut self, lease: &str, holder: Option<&str>) {
        if self.others.get(lease).map(|h| &**h) == holder {
            return;
        }
        if let Some(old) = self.others.remove(lease)
            && let Some(n) = self.counts.get_mut(&old)
        {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&old);
                self.lapsed.remove(&old);
            }
        }
        if let Some(h) = holder {
            // A lease newly seen held by `h`: `h` is alive.
            self.lapsed.remove(h);
            let key: Arc<str> = self
                .counts
                .get_key_value(h)
                .map(|(k, _)| k.clone())
                .unwrap_or_else(|| Arc::from(h));
            *self.counts.entry(key.clone()).or_insert(0) += 1;
            self.others.insert(lease.to_string(), key);
        }
    }
}

/// The leases one node holds and those it sees other nodes hold, shared by the electors
/// that spread (one per Service lease).
#[derive(Debug)]
pub struct Spread {
    state: Mutex<State>,
    step: Duration,
    cap: Duration,
    discovery: Duration,
    /// Acquisitions in flight not counted toward the lead after discovery
    /// ([`SPREAD_IN_FLIGHT_ALLOWANCE`]).
    in_flight_allowance: usize,
    /// The shard leases' two rules ([`Spread::for_shards`]): a lease that does not exist
    /// yet is paced as in discovery, by everything this node holds; a freed one is taken at
    /// once while this node holds less than its [`fair_share`].
    shards: bool,
}

impl Spread {
    /// The per-Service leases' spread: [`SPREAD_STEP`], [`SPREAD_CAP`], [`SPREAD_DISCOVERY`]
    /// and [`SPREAD_IN_FLIGHT_ALLOWANCE`].
    pub fn new() -> Arc<Self> {
        Self::with_allowance(
            SPREAD_STEP,
            SPREAD_CAP,
            SPREAD_DISCOVERY,
            SPREAD_IN_FLIGHT_ALLOWANCE,
        )
    }

    /// A spread with the given step, cap and discovery period (counted from this node's
    /// first attempt to acquire a lease, see the module doc), every acquisition in flight
    /// counting toward the lead.
    pub fn with(step: Duration, cap: Duration, discovery: Duration) -> Arc<Self> {
        Self::with_allowance(step, cap, discovery, 0)
    }

    /// [`Spread::with`], where after discovery the first `in_flight_allowance` acquisitions
    /// in flight do not count toward the lead ([`SPREAD_IN_FLIGHT_ALLOWANCE`]).
    pub fn with_allowance(
        step: Duration,
        cap: Duration,
        discovery: Duration,
        in_flight_allowance: usize,
    ) -> Arc<Self> {
        Self::build(step, cap, discovery, in_flight_allowance, false)
    }

    /// [`Spread::with`] with the shard leases' two rules (see [`Spread::for_shards`]).
    fn with_shard_rules(step: Duration, cap: Duration, discovery: Duration) -> Arc<Self> {
        Self::build(step, cap, discovery, 0, true)
    }

    /// The one constructor behind the public ones.
    fn build(
        step: Duration,
        cap: Duration,
        discovery: Duration,
        in_flight_allowance: usize,
        shards: bool,
    ) -> Arc<Self> {
        Arc::new(Spread {
            state: Mutex::new(State::default()),
            step,
            cap,
            discovery,
            in_flight_allowance,
            shards,
        })
    }

    /// The shard leases' spread (`svc_leaseshards`): [`SHARD_SPREAD_STEP`], [`SPREAD_CAP`],
    /// [`SPREAD_DISCOVERY`], no in-flight allowance, and a shard lease that does not exist
    /// yet (its first Service was just created) paced by every shard this node holds, as
    /// in discovery, whatever the others hold. A node that holds nothing is invisible to
    /// the others (it shows up only once it wins), so under the relative rule a node that
    /// loses every race by a few milliseconds (a slower path to the API server) never got
    /// a shard: 6 shards created one by one ended 3/3/0 in 2 of 6 loaded lab runs. Paced
    /// from zero, a node holding `k` shards lets a new one go for `k` x 250 ms to nodes
    /// holding fewer. Only new shards.
    ///
    /// A freed shard (released, or expired: a node powered off) is taken at once, after the
    /// discovery period, by a node that holds (plus in flight) less than its [`fair_share`]
    /// of the shards it watches among itself and the other nodes seen holding one; at or
    /// above it, by the relative rule. Under the relative rule alone the survivors of a
    /// power-off took the dead node's six shards one after another, each node waiting 250 ms
    /// per shard it was ahead since its last acquisition (1.9 s from the first to the last,
    /// five of six to one node in one run; docs/services-bench.md); with the share, each
    /// takes its part at once and no more (a node faster to the API server wins races only
    /// up to its share). Per-Service leases keep the relative rule: with hundreds of leases
    /// the races even out, pacing from zero would delay every new Service's bring-up, and
    /// taking every freed lease at once would send hundreds of writes together.
    pub fn for_shards() -> Arc<Self> {
        Self::with_shard_rules(SHARD_SPREAD_STEP, SPREAD_CAP, SPREAD_DISCOVERY)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this small lock leaves consistent counters.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Leases held now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    /// How many leases this node is ahead of the least loaded other holder now ([`lead`]).
    pub fn ahead(&self) -> usize {
        let s = self.lock();
        self.ahead_of(&s, Instant::now())
    }

    fn ahead_of(&self, s: &State, now: Instant) -> usize {
        self.ahead_for(s, now, false)
    }

    /// [`Self::ahead_of`] for a lease that does not exist yet when `absent`.
    fn ahead_for(&self, s: &State, now: Instant, absent: bool) -> usize {
        let in_discovery = match s.discovery_until {
            Some(until) => now < until,
            None => !self.discovery.is_zero(),
        };
        // The other holders, but for those that let a lease lapse.
        let live = || {
            s.counts
                .iter()
                .filter(|(h, _)| s.lapsed.get(*h).is_none_or(|until| *until <= now))
        };
        if self.shards
            && !absent
            && !in_discovery
            && s.held + s.in_flight < fair_share(s.watched, live().count())
        {
            return 0;
        }
        let discovering = (absent && self.shards) || in_discovery;
        // While discovering every acquisition counts: the first node up must not take
        // everything before the others arrive.
        let in_flight = match discovering {
            true => s.in_flight,
            false => s.in_flight.saturating_sub(self.in_flight_allowance),
        };
        lead(
            s.held + in_flight,
            live().map(|(_, n)| *n).min(),
            discovering,
        )
    }

    /// The earliest instant this node may acquire a lease it saw free at `free_since`;
    /// `absent`: the lease does not exist yet (see [`Spread::for_shards`]).
    /// The first call (this node's first campaign) starts the discovery period.
    pub fn not_before(&self, free_since: Instant, absent: bool) -> Instant {
        let mut s = self.lock();
        let now = Instant::now();
        s.start_discovery(now, self.discovery);
        let ahead = self.ahead_for(&s, now, absent);
        if ahead == 0 {
            return free_since;
        }
        let base = [s.last_acquired, s.last_begun]
            .into_iter()
            .flatten()
            .fold(free_since, Instant::max);
        base + spread_delay(ahead, self.step, self.cap)
    }

    /// Reports the holder of lease `lease` (`namespace/name`) as its elector sees it:
    /// another node's identity while that node holds it validly, `None` while it is free,
    /// absent or held by this node. The report ends when the returned guard is dropped.
    pub(crate) fn watch_lease(self: &Arc<Self>, lease: &str) -> LeaseWatch {
        self.lock().watched += 1;
        LeaseWatch {
            spread: self.clone(),
            lease: lease.to_string(),
        }
    }

    /// Ends the discovery period now, or keeps it ended: for a node that had no lease to
    /// campaign for when it started (its first list of Services had no LoadBalancer
    /// Service). Its first campaign is then for a Service created into a running cluster,
    /// not part of a cold start; counted from there, the period paced every node through
    /// the first 2 s of a burst of new Services from zero (1 000 created at 44 a second:
    /// create -> first answer p95 1.4 s with it, 0.38 s without; docs/services-bench.md).
    pub fn end_discovery(&self) {
        let mut s = self.lock();
        let now = Instant::now();
        s.discovery_until = Some(s.discovery_until.map_or(now, |until| until.min(now)));
    }

    /// An acquisition starts now; it counts as held until the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        let mut s = self.lock();
        let now = Instant::now();
        s.start_discovery(now, self.discovery);
        s.in_flight += 1;
        s.last_begun = Some(now);
        drop(s);
        InFlight(self.clone())
    }

    /// A lease was acquired at `now`.
    pub(crate) fn acquired(&self, now: Instant) {
        let mut s = self.lock();
        s.start_discovery(now, self.discovery);
        s.held += 1;
        s.last_acquired = Some(now);
    }

    /// A lease held was given up.
    pub(crate) fn released(&self) {
        let mut s = self.lock();
        s.held = s.held.saturating_sub(1);
    }
}

/// One acquisition in flight (see [`Spread::begin`]).
pub(crate) struct InFlight(Arc<Spread>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
    }
}

/// One elector's report of who holds its lease (see [`Spread::watch_lease`]); dropping it
/// forgets the lease.
pub(crate) struct LeaseWatch {
    spread: Arc<Spread>,
    lease: String,
}

impl LeaseWatch {
    /// The lease is now held by `holder`, another node (`None`: free, absent or ours).
    pub(crate) fn holder(&self, holder: Option<&str>) {
        self.spread.lock().set_holder(&self.lease, holder);
    }

    /// The lease was held by `holder`, another node, and expired without a release: it is
    /// free, and `holder`, if this lease was last seen held by it, no longer counts among
    /// the holders for `lapse` (the lease duration) while it holds other leases, or until
    /// it is seen taking one.
    pub(crate) fn lapsed(&self, holder: &str, lapse: Duration) {
        let mut s = self.spread.lock();
        // Only when this lease was last seen held by `holder`: a lease first seen expired
        // says nothing of its holder now, and a holder seen taking a lease since stays.
        let was_held = s.others.get(&self.lease).is_some_and(|h| &**h == holder);
        s.set_holder(&self.lease, None);
        let now = Instant::now();
        s.lapsed.retain(|_, until| *until > now);
        if was_held && let Some((h, _)) = s.counts.get_key_value(holder) {
            let h = h.clone();
            s.lapsed.insert(h, now + lapse);
        }
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        let mut s = self.spread.lock();
        s.set_holder(&self.lease, None);
        s.watched = s.watched.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn under_shards_a_new_lease_is_paced_by_every_lease_held_a_freed_one_is_not() {
        let ms = Duration::from_millis;
        let s = Spread::with_shard_rules(ms(250), ms(1000), Duration::ZERO);
        let other = s.watch_lease("ns/held-by-b");
        other.holder(Some("b"));
        let other2 = s.watch_lease("ns/held-by-b-too");
        other2.holder(Some("b"));
        let t0 = Instant::now();
        s.acquired(t0);
        s.acquired(t0);
        tokio::time::advance(ms(10)).await;
        let t1 = Instant::now();
        // Balanced with b (2 each): a released or expired lease is taken at once.
        assert_eq!(s.not_before(t1, false), t1, "freed: balanced, at once");
        // A shard that does not exist yet: two held, 500 ms after it was seen (later than
        // the last acquisition), whatever b holds (a node holding nothing is invisible).
        assert_eq!(s.not_before(t1, true), t1 + ms(500));
        // Per-Service leases never pace a new lease from zero after discovery.
        let per_service = Spread::with(ms(250), ms(1000), Duration::ZERO);
        per_service.acquired(t0);
        assert_eq!(per_service.not_before(t1, true), t1, "alone: at once");
    }

    #[test]
    fn the_fair_share_is_the_leases_over_the_holders_rounded_up() {
        assert_eq!(fair_share(16, 1), 8, "two nodes left");
        assert_eq!(fair_share(16, 2), 6, "three nodes: 6/5/5");
        assert_eq!(fair_share(7, 2), 3);
        assert_eq!(fair_share(5, 0), 5, "alone: every lease");
        assert_eq!(fair_share(0, 3), 0, "no lease watched");
        assert_eq!(fair_share(3, usize::MAX), 1, "no overflow");
    }

    /// A shard spread (250 ms step, 1 s cap, `discovery`) watching 16 shards: 0-4 held by
    /// this node (acquired at the returned instant), 5-9 by `b`, 10-15 by `dead`.
    fn sixteen_shards_5_5_6(discovery: Duration) -> (Arc<Spread>, Vec<LeaseWatch>, Instant) {
        let ms = Duration::from_millis;
        let s = Spread::with_shard_rules(ms(250), ms(1000), discovery);
        let watches: Vec<LeaseWatch> = (0..16)
            .map(|i| s.watch_lease(&format!("ns/shard-{i}")))
            .collect();
        let t0 = Instant::now();
        for _ in 0..5 {
            s.acquired(t0);
        }
        for w in &watches[5..10] {
            w.holder(Some("b"));
        }
        for w in &watches[10..] {
            w.holder(Some("dead"));
        }
        (s, watches, t0)
    }

    /// The power-off of a node holding 6 of 16 shards: a survivor holding 5, with the other
    /// survivor seen holding 5, takes freed shards at once up to its share of 8 (16 over
    /// two holders), then by the relative rule; a new shard is still paced from zero; while
    /// discovering nothing is taken by share.
    #[tokio::test(start_paused = true)]
    async fn under_shards_a_freed_lease_is_taken_at_once_up_to_the_fair_share() {
        let ms = Duration::from_millis;
        let (s, watches, t0) = sixteen_shards_5_5_6(ms(2000));
        // While discovering every lease held counts (5 ahead), the share does not apply.
        let t1 = Instant::now();
        assert_eq!(
            s.not_before(t1, false),
            t0 + ms(1000),
            "discovering: from zero, capped"
        );
        tokio::time::advance(ms(2500)).await;
        // Balanced with the least loaded (b 5) while the dead node still holds: at once.
        let t2 = Instant::now();
        assert_eq!(s.not_before(t2, false), t2);
        // Its leases expire: only b is seen; 5 held of a share of 8.
        for w in &watches[10..] {
            w.holder(None);
        }
        tokio::time::advance(ms(10)).await;
        let t3 = Instant::now();
        let mut marks = Vec::new();
        for taken in 0..3 {
            assert_eq!(
                s.not_before(t3, false),
                t3,
                "{taken} begun: below the share"
            );
            marks.push(s.begin());
        }
        // 5 held + 3 in flight = the share: the relative rule, 3 ahead of b, from the last
        // acquisition begun.
        assert_eq!(s.ahead(), 3);
        assert_eq!(s.not_before(t3, false), t3 + ms(750));
        // Two races lost (b took them), one won: 6 held, b 7; below the share again.
        marks.truncate(1);
        watches[10].holder(Some("b"));
        watches[11].holder(Some("b"));
        drop(marks);
        s.acquired(Instant::now());
        let t4 = Instant::now();
        assert_eq!(s.not_before(t4, false), t4, "6 of a share of 8");
        // A shard that does not exist yet is paced from zero whatever the share.
        assert_eq!(
            s.not_before(t4, true),
            t4 + ms(1000),
            "6 held: capped at 1 s"
        );
        // A third holder seen: the share is 6 (16 over three), and 6 are held.
        watches[12].holder(Some("c"));
        assert_eq!(s.ahead(), 5, "6 held, c 1");
        drop(watches);
        assert_eq!(s.lock().watched, 0, "every elector gone");
    }

    /// A powered-off node's leases expire one after another over up to a retry period: while
    /// it still holds the rest, it is not counted (issue 28: a survivor at its share saw the
    /// dead node's last shard as the least loaded holder and waited its 1 s cap for each
    /// further one). It counts again once seen taking a lease; a lease first seen expired
    /// marks nobody.
    #[tokio::test(start_paused = true)]
    async fn a_holder_that_lets_a_lease_lapse_is_not_counted_until_it_takes_one() {
        const LAPSE: Duration = Duration::from_secs(5);
        let (s, watches, _) = sixteen_shards_5_5_6(Duration::ZERO);
        // Share 6 with b and the dead node seen: 5 held, below it.
        assert_eq!(s.ahead(), 0);
        let marks: Vec<InFlight> = (0..2).map(|_| s.begin()).collect();
        assert_eq!(s.ahead(), 2, "7 counted, at or above 6: relative to b's 5");
        // The dead node's first lease lapses: it no longer counts, the share is 8.
        watches[10].lapsed("dead", LAPSE);
        let t1 = Instant::now();
        assert_eq!(s.not_before(t1, false), t1, "7 below a share of 8");
        // Four more lapse: the dead node's last lease is not the least loaded holder.
        for w in &watches[11..15] {
            w.lapsed("dead", LAPSE);
        }
        let m = s.begin();
        assert_eq!(
            s.ahead(),
            3,
            "8 counted, relative to b's 5, not the dead node's 1"
        );
        drop((m, marks));
        // Without the rule the dead node's last lease would be the least loaded (7 ahead).
        // It is seen taking a lease: alive, counted again (share 6, least loaded 2).
        watches[10].holder(Some("dead"));
        let m = s.begin();
        assert_eq!(s.ahead(), 4, "6 counted, a share of 6: relative to its 2");
        // A lease first seen expired (no holder seen before) marks nobody.
        let fresh = s.watch_lease("ns/shard-16");
        fresh.lapsed("b", LAPSE);
        assert_eq!(s.ahead(), 4, "b still counted");
        // A live node lets one lease lapse (a slow renewal) and renews the others: not
        // counted for the lapse, counted again after it.
        watches[5].lapsed("b", LAPSE);
        assert_eq!(
            s.ahead(),
            0,
            "b not counted: 6 below a share of 9 (17 over two)"
        );
        tokio::time::advance(LAPSE).await;
        assert_eq!(
            s.ahead(),
            4,
            "b's lapse over: share 6, relative to the dead node's 2"
        );
        drop(m);
        // A lapse of a holder's last lease leaves nothing behind.
        for w in &watches[10..16] {
            w.lapsed("dead", LAPSE);
        }
        assert!(!s.lock().lapsed.contains_key("dead"));
        assert!(!s.lock().counts.contains_key("dead"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_shard_waits_at_most_the_cap_and_a_node_alone_waits_too() {
        let ms = Duration::from_millis;
        let s = Spread::for_shards();
        let t0 = Instant::now();
        for _ in 0..6 {
            s.acquired(t0);
        }
        tokio::time::advance(ms(3000)).await;
        let t1 = Instant::now();
        // Alone (no other holder seen), 6 shards held: paced from zero, capped at 1 s.
        assert_eq!(s.not_before(t1, true), t1 + SPREAD_CAP);
        assert_eq!(s.not_before(t1, false), t1, "a freed shard: alone, at once");
    }

    #[test]
    fn preference_delay_follows_the_place_in_the_list() {
        let list: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let ms = Duration::from_millis;
        assert_eq!(preference_delay("a", &list), Duration::ZERO);
        assert_eq!(preference_delay("b", &list), ms(100));
        assert_eq!(preference_delay("c", &list), ms(200));
        assert_eq!(preference_delay("x", &list), ms(300), "not listed: last");
        assert_eq!(preference_delay("x", &[]), Duration::ZERO, "no preference");
        let long: Vec<String> = (0..30).map(|i| format!("n{i}")).collect();
        assert_eq!(preference_delay("x", &long), PREFERENCE_CAP);
    }

    #[test]
    fn delay_grows_with_leases_held_and_is_capped() {
        let ms = Duration::from_millis;
        assert_eq!(spread_delay(0, ms(20), ms(1000)), Duration::ZERO);
        assert_eq!(spread_delay(1, ms(20), ms(1000)), ms(20));
        assert_eq!(spread_delay(10, ms(20), ms(1000)), ms(200));
        assert_eq!(spread_delay(50, ms(20), ms(1000)), ms(1000));
        assert_eq!(spread_delay(500, ms(20), ms(1000)), ms(1000));
        assert_eq!(spread_delay(usize::MAX, ms(20), ms(1000)), ms(1000));
    }

    #[test]
    fn lead_is_relative_to_the_least_loaded_other_holder() {
        assert_eq!(lead(10, Some(10), false), 0, "balanced");
        assert_eq!(lead(10, Some(7), false), 3);
        assert_eq!(lead(10, Some(10), true), 10, "discovering: from zero");
        assert_eq!(lead(3, Some(7), false), 0, "behind: never negative");
        assert_eq!(lead(4, None, true), 4, "nobody seen yet: from zero");
        assert_eq!(lead(4, None, false), 0, "alone");
    }

    /// While discovering with nobody else seen: held and in flight count from zero, paced
    /// from the latest of free, last acquired and last begun.
    #[tokio::test(start_paused = true)]
    async fn while_discovering_not_before_counts_held_and_in_flight_from_the_later_instant() {
        let ms = Duration::from_millis;
        let s = Spread::with(ms(20), ms(1000), ms(10_000));
        let t0 = Instant::now();
        assert_eq!(s.not_before(t0, false), t0, "nothing held: at once");
        tokio::time::advance(ms(30)).await;
        let g = s.begin();
        assert_eq!(
            s.not_before(t0, false),
            t0 + ms(50),
            "one in flight, paced from when it began"
        );
        drop(g);
        assert_eq!(s.not_before(t0, false), t0, "lost its race: no delay");
        let s = Spread::with(ms(20), ms(1000), ms(10_000));
        let g = s.begin();
        tokio::time::advance(ms(5)).await;
        s.acquired(Instant::now());
        drop(g);
        assert_eq!(s.held(), 1);
        // Paced from the last acquisition when the lease was free before it.
        assert_eq!(s.not_before(t0, false), t0 + ms(55));
        // From when the lease was seen free when that is later.
        assert_eq!(s.not_before(t0 + ms(100), false), t0 + ms(120));
        s.released();
        assert_eq!(s.not_before(t0 + ms(100), false), t0 + ms(100));
        s.released();
        assert_eq!(s.held(), 0, "never below zero");
    }

    /// With other holders seen, only the lead over the least loaded one delays; leases
    /// forgotten (elector gone) or freed stop counting.
    #[tokio::test(start_paused = true)]
    async fn the_delay_is_the_lead_over_the_least_loaded_other_holder() {
        let ms = Duration::from_millis;
        let s = Spread::with(ms(20), ms(1000), Duration::ZERO);
        let t0 = Instant::now();
        for _ in 0..10 {
            s.acquired(t0);
        }
        let watches: Vec<LeaseWatch> = (0..19)
            .map(|i| s.watch_lease(&format!("ns/l{i}")))
            .collect();
        for (i, w) in watches.iter().enumerate() {
            w.holder(Some(if i < 10 { "b" } else { "c" }));
        }
        assert_eq!(s.ahead(), 1, "10 held, b 10, c 9");
        assert_eq!(s.not_before(t0, false), t0 + ms(20));
        watches[18].holder(Some("b"));
        assert_eq!(s.ahead(), 2, "b 11, c 8");
        watches[17].holder(None);
        assert_eq!(s.ahead(), 3, "freed: c 7");
        drop(watches);
        assert_eq!(s.ahead(), 0, "every elector gone: nobody seen, alone");
        let w = s.watch_lease("ns/l0");
        w.holder(Some("c"));
        w.holder(Some("c"));
        assert_eq!(s.ahead(), 9, "a repeated report counts once");
        let discovering = Spread::with(ms(20), ms(1000), ms(10_000));
        discovering.acquired(t0);
        let w2 = discovering.watch_lease("ns/l0");
        w2.holder(Some("c"));
        assert_eq!(discovering.ahead(), 1, "discovering: from zero");
    }

    /// After discovery, a balanced node's own acquisitions in flight (a burst of new
    /// Services: the other nodes' are invisible to it) do not delay the next one up to the
    /// allowance; beyond it they count, as every one does while discovering and under
    /// [`Spread::with`] (no allowance).
    #[tokio::test(start_paused = true)]
    async fn in_flight_acquisitions_count_only_beyond_the_allowance_after_discovery() {
        let ms = Duration::from_millis;
        let balanced = |s: &Arc<Spread>| -> Vec<LeaseWatch> {
            for _ in 0..10 {
                s.acquired(Instant::now());
            }
            (0..20)
                .map(|i| {
                    let w = s.watch_lease(&format!("ns/l{i}"));
                    w.holder(Some(if i < 10 { "b" } else { "c" }));
                    w
                })
                .collect()
        };
        let s = Spread::with_allowance(ms(20), ms(1000), ms(2000), 3);
        let _seen = balanced(&s);
        let t0 = Instant::now();
        let discovering: Vec<InFlight> = (0..2).map(|_| s.begin()).collect();
        assert_eq!(
            s.not_before(t0, false),
            t0 + ms(240),
            "discovering: 10 held and 2 in flight count from zero"
        );
        drop(discovering);
        tokio::time::advance(ms(2000)).await;
        let t1 = Instant::now();
        assert_eq!(s.not_before(t1, false), t1, "balanced: at once");
        let mut burst: Vec<InFlight> = (0..3).map(|_| s.begin()).collect();
        assert_eq!(s.ahead(), 0, "3 in flight, within the allowance");
        assert_eq!(
            s.not_before(t1, false),
            t1,
            "a new lease during the burst: at once"
        );
        burst.push(s.begin());
        assert_eq!(s.ahead(), 1, "the fourth counts");
        assert_eq!(s.not_before(t1, false), t1 + ms(20));
        drop(burst);
        // Without an allowance every acquisition in flight counts.
        let strict = Spread::with(ms(20), ms(1000), ms(2000));
        let _seen_strict = balanced(&strict);
        tokio::time::advance(ms(2000)).await;
        let t2 = Instant::now();
        let _one = strict.begin();
        assert_eq!(strict.not_before(t2, false), t2 + ms(20));
        assert_eq!(
            Spread::new().in_flight_allowance,
            SPREAD_IN_FLIGHT_ALLOWANCE,
            "per-Service leases get the allowance"
        );
    }

    /// A node whose discovery was ended (nothing to campaign for at start) counts only its
    /// lead over the others, from its first campaign on; ending it again, or after it
    /// started, never lengthens it.
    #[tokio::test(start_paused = true)]
    async fn an_ended_discovery_counts_only_the_lead_from_the_first_campaign() {
        let ms = Duration::from_millis;
        let s = Spread::with(ms(20), ms(1000), ms(2000));
        s.end_discovery();
        let t0 = Instant::now();
        let _g = s.begin();
        s.acquired(t0);
        let w = s.watch_lease("ns/other");
        w.holder(Some("b"));
        assert_eq!(
            s.ahead(),
            1,
            "held 1 and 1 in flight, b holds 1: not from zero"
        );
        s.end_discovery();
        assert_eq!(s.ahead(), 1);
        let started = Spread::with(ms(20), ms(1000), ms(2000));
        let _g2 = started.begin();
        let w2 = started.watch_lease("ns/other");
        w2.holder(Some("b"));
        assert_eq!(started.ahead(), 1, "discovering: from zero");
        started.end_discovery();
        assert_eq!(started.ahead(), 0, "ended now: 1 in flight against b's 1");
    }

    /// A node alone (nobody else seen once discovery is over) never waits, however many it
    /// holds: a single-node cold start of many Services is not paced.
    #[tokio::test(start_paused = true)]
    async fn a_node_alone_after_discovery_never_waits() {
        let ms = Duration::from_millis;
        let s = Spread::with(ms(20), ms(1000), ms(2000));
        let t0 = Instant::now();
        for _ in 0..100 {
            s.acquired(t0);
        }
        assert_eq!(
            s.not_before(t0, false),
            t0 + ms(1000),
            "discovering: capped delay"
        );
        tokio::time::advance(ms(2000)).await;
        let now = Instant::now();
        assert_eq!(s.not_before(now, false), now, "alone");
        let w = s.watch_lease("ns/x");
        w.holder(Some("b"));
        assert_eq!(
            s.not_before(now, false),
            now + ms(1000),
            "b holds 1: 99 ahead, capped"
        );
        drop(w);
        assert_eq!(
            s.not_before(now, false),
            now,
            "b's lease forgotten: alone again"
        );
    }

    /// Discovery starts with the node's first campaign, not with the process: a node whose
    /// first lists took longer than the period still paces its first acquisitions, so the
    /// nodes of a cold start of 10 000 Services share the shard leases.
    #[tokio::test(start_paused = true)]
    async fn discovery_counts_from_the_first_campaign_not_from_start() {
        let ms = Duration::from_millis;
        let s = Spread::with(ms(250), ms(1000), ms(2000));
        // The Services' first lists take 2.5 s: nobody campaigns meanwhile.
        tokio::time::advance(ms(2500)).await;
        let t0 = Instant::now();
        assert_eq!(s.not_before(t0, false), t0, "nothing held: at once");
        s.acquired(t0);
        assert_eq!(
            s.not_before(t0, false),
            t0 + ms(250),
            "one held while discovering: one step, though 2.5 s passed since start"
        );
        tokio::time::advance(ms(2000)).await;
        let now = Instant::now();
        assert_eq!(
            s.not_before(now, false),
            now,
            "discovery over, nobody seen: alone"
        );
    }
}
