//! The pure auditor of the chaos soak: the model it judges (faults and Service changes on a
//! timeline, the desired addresses) and the invariants, from recorded data only (ARP
//! rounds, observed Service statuses, leases, RSS, what is left on the nodes). Nothing here
//! touches the lab.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use xtask::lab::{self, LabAddress, MacAddr, ProbeRound};

use super::{CANARY_ADDR, LEASE_PREFIX};

/// A kind of fault (or Service change) the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL of a holder's vipd, restarted after the hold.
    Kill,
    /// SIGSTOP of a holder's vipd, SIGCONT after the hold.
    Stop,
    /// SIGTERM of a holder's vipd (graceful), restarted after the hold.
    Term,
    /// The node's switch port down (carrier lost), up after the hold.
    LinkCut,
    /// nftables drop of everything to/from the API server in the node's namespace.
    Partition,
    /// SIGSTOP of kube-apiserver, SIGCONT after the hold.
    ApiFreeze,
    /// kube-apiserver stopped (SIGTERM) and started again.
    ApiRestart,
    /// etcd stopped (SIGTERM) and started again.
    EtcdRestart,
    /// A Service created.
    SvcCreate,
    /// A Service's address changed.
    SvcEdit,
    /// A Service deleted.
    SvcDelete,
    /// An annotation change: `kube-vip.io/ignore` toggled, or an unrelated annotation set.
    Annotation,
    /// vipd found dead without the soak killing it, restarted.
    CrashRestart,
}

impl FaultKind {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "sigkill+restart",
            FaultKind::Stop => "sigstop/sigcont",
            FaultKind::Term => "sigterm+restart",
            FaultKind::LinkCut => "link cut",
            FaultKind::Partition => "partition from API",
            FaultKind::ApiFreeze => "API server freeze",
            FaultKind::ApiRestart => "API server restart",
            FaultKind::EtcdRestart => "etcd restart",
            FaultKind::SvcCreate => "service create",
            FaultKind::SvcEdit => "service address edit",
            FaultKind::SvcDelete => "service delete",
            FaultKind::Annotation => "annotation change",
            FaultKind::CrashRestart => "unexpected exit, restarted",
        }
    }

    /// Faults of the control plane.
    pub fn is_control_plane_fault(self) -> bool {
        matches!(
            self,
            FaultKind::ApiFreeze | FaultKind::ApiRestart | FaultKind::EtcdRestart
        )
    }
}

/// One disturbance on the timeline: from `start` until `settled` (`None`: never healed)
/// the addresses it concerns are not judged, nor for their answer bound
/// ([`AuditParams::bound`]) after `settled`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disturbance {
    /// What happened.
    pub kind: FaultKind,
    /// Its target (node, Service), for reports.
    pub target: String,
    /// When it started (since the run's epoch).
    pub start: Duration,
    /// When it was healed (process running again, link up, API ready, API call returned).
    pub settled: Option<Duration>,
    /// The addresses it may affect; `None`: every address (node and control-plane faults).
    pub addrs: Option<Vec<Ipv4Addr>>,
}

/// An interval during which `addr` should be announced (a Service that vipd must announce
/// has it), `[from, to)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The address.
    pub addr: Ipv4Addr,
    /// Who wants it (Service name, or `control-plane`).
    pub owner: String,
    /// Since when (since the epoch).
    pub from: Duration,
    /// Until when; `None`: still.
    pub to: Option<Duration>,
}

/// Everything the driver did, in the auditor's terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Faults and Service changes.
    pub disturbances: Vec<Disturbance>,
    /// Who should be answered when.
    pub desired: Vec<Desired>,
}

/// A kind of invariant violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// Two or more MACs answered one ARP request for an address.
    TwoMacs,
    /// An announceable address went unanswered although nothing disturbed it for the bound.
    Unanswered,
    /// An address without a Service (deleted, moved, ignored) was answered past the bound.
    StaleAnswer,
    /// After the final settle, status ingress or `kube-vip.io/vipHost` differ from reality.
    Status,
    /// A lease of a deleted Service is left.
    OrphanLease,
    /// RSS of a vipd grew beyond the threshold.
    RssGrowth,
    /// A vipd exited without being told to, or exited non-zero on SIGTERM, or panicked.
    VipdExit,
    /// A vipd did not exit within 15 s of SIGTERM.
    SlowShutdown,
    /// A VIP address is left on a node interface after vipd stopped.
    LeakedAddress,
    /// An nftables table `vipd` is left after vipd stopped.
    LeakedNftTable,
    /// A link other than lo and eth0 (e.g. a macvlan) is left after vipd stopped.
    LeakedLink,
}

impl ViolationKind {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::TwoMacs => "two MACs for one address",
            ViolationKind::Unanswered => "announceable, not answered",
            ViolationKind::StaleAnswer => "answered without a Service",
            ViolationKind::Status => "status/vipHost != reality",
            ViolationKind::OrphanLease => "lease of deleted Service",
            ViolationKind::RssGrowth => "RSS growth",
            ViolationKind::VipdExit => "vipd exit/panic",
            ViolationKind::SlowShutdown => "slow shutdown",
            ViolationKind::LeakedAddress => "leaked address",
            ViolationKind::LeakedNftTable => "leaked nftables table",
            ViolationKind::LeakedLink => "leaked link",
        }
    }
}

/// One invariant violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant.
    pub kind: ViolationKind,
    /// What was seen (times in seconds since the epoch).
    pub detail: String,
}

/// A violation of `kind` with `detail`.
pub fn v(kind: ViolationKind, detail: String) -> Violation {
    Violation { kind, detail }
}

/// `d` in seconds with one decimal, as the report prints it.
pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Judging parameters of [`audit`].
#[derive(Debug, Clone)]
pub struct AuditParams {
    /// Answer bound of a Service address after a disturbance settles (the Service lease
    /// timings' [`Timings::answer_bound`](super::Timings::answer_bound)).
    pub service_bound: Duration,
    /// The control-plane VIP and its answer bound (its lease has its own timings).
    pub control_plane: (Ipv4Addr, Duration),
    /// Rounds before this are checked for two MACs only (warm-up).
    pub audit_from: Duration,
    /// Every address probed (pool and control-plane VIP).
    pub universe: Vec<Ipv4Addr>,
}

impl AuditParams {
    /// The answer bound of `addr`: the control-plane VIP's own, else the Services'.
    pub fn bound(&self, addr: Ipv4Addr) -> Duration {
        if addr == self.control_plane.0 {
            self.control_plane.1
        } else {
            self.service_bound
        }
    }
}

/// Merged `[start, end)` intervals during which `addr` is not judged.
fn blind_intervals(addr: Ipv4Addr, tl: &Timeline, bound: Duration) -> Vec<(Duration, Duration)> {
    let mut iv: Vec<(Duration, Duration)> = tl
        .disturbances
        .iter()
        .filter(|d| d.addrs.as_ref().is_none_or(|a| a.contains(&addr)))
        .map(|d| (d.start, d.settled.map_or(Duration::MAX, |s| s + bound)))
        .collect();
    // A desired interval's edges are changes of this address too.
    for d in tl.desired.iter().filter(|d| d.addr == addr) {
        iv.push((d.from, d.from + bound));
        if let Some(to) = d.to {
            iv.push((to, to + bound));
        }
    }
    iv.sort();
    let mut out: Vec<(Duration, Duration)> = Vec::new();
    for (s, e) in iv {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

fn covered(iv: &[(Duration, Duration)], t: Duration) -> bool {
    let i = iv.partition_point(|(s, _)| *s <= t);
    i > 0 && t < iv[i - 1].1
}

/// The last disturbance of `addr` that started at or before `t`, for reports.
fn last_disturbance(addr: Ipv4Addr, tl: &Timeline, t: Duration) -> String {
    tl.disturbances
        .iter()
        .filter(|d| d.addrs.as_ref().is_none_or(|a| a.contains(&addr)) && d.start <= t)
        .max_by_key(|d| d.start)
        .map(|d| {
            format!(
                "last disturbance: {} {} at {}, settled {}",
                d.kind.name(),
                d.target,
                secs(d.start),
                d.settled.map_or("never".into(), secs)
            )
        })
        .unwrap_or_else(|| "no disturbance before".into())
}

/// The auditor's verdict on the probe rounds of a run (pure).
///
/// - [`ViolationKind::TwoMacs`]: a round in which two or more MACs answered one address,
///   at any time.
/// - From `audit_from` on, for every address at every round outside its blind intervals
///   (a disturbance that may affect it, from its start until `bound` after it settled; a
///   Service change of it, for `bound`): [`ViolationKind::Unanswered`] when it should be
///   answered (a [`Desired`] interval covers the round) and nobody did;
///   [`ViolationKind::StaleAnswer`] when it should not and somebody did.
///
/// Consecutive failing rounds of one address and kind are one violation (its detail gives
/// the first and last round and the count). `node_of` names a MAC's node.
pub fn audit(
    rounds: &[ProbeRound],
    tl: &Timeline,
    p: &AuditParams,
    node_of: &dyn Fn(MacAddr) -> String,
) -> Vec<Violation> {
    let mut out = Vec::new();
    // TwoMacs runs per address: (first t, last t, rounds, macs).
    type Run = (Duration, Duration, usize, BTreeSet<String>);
    let mut open: BTreeMap<(ViolationKind, Ipv4Addr), Run> = BTreeMap::new();
    let blind: BTreeMap<Ipv4Addr, Vec<(Duration, Duration)>> = p
        .universe
        .iter()
        .map(|a| (*a, blind_intervals(*a, tl, p.bound(*a))))
        .collect();
    let close = |key: (ViolationKind, Ipv4Addr), run: Run, out: &mut Vec<Violation>| {
        let (kind, addr) = key;
        let owner = tl
            .desired
            .iter()
            .filter(|d| d.addr == addr && d.from <= run.0)
            .max_by_key(|d| d.from)
            .map(|d| d.owner.clone())
            .unwrap_or_else(|| "-".into());
        let what = match kind {
            ViolationKind::TwoMacs => format!(
                "answered by {} at once",
                run.3.iter().cloned().collect::<Vec<_>>().join(" and ")
            ),
            ViolationKind::Unanswered => "not answered".to_string(),
            _ => format!(
                "answered by {} without a Service",
                run.3.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        };
        out.push(v(
            kind,
            format!(
                "{addr} ({owner}) {what} from {} to {} ({} rounds); {}",
                secs(run.0),
                secs(run.1),
                run.2,
                last_disturbance(addr, tl, run.0)
            ),
        ));
    };
    for r in rounds {
        let mut failing: BTreeMap<(ViolationKind, Ipv4Addr), BTreeSet<String>> = BTreeMap::new();
        for (addr, macs) in &r.replies {
            if macs.len() >= 2 {
                failing.insert(
                    (ViolationKind::TwoMacs, *addr),
                    macs.iter().map(|m| node_of(*m)).collect(),
                );
            }
        }
        if r.t >= p.audit_from {
            for addr in &p.universe {
                if blind.get(addr).is_some_and(|iv| covered(iv, r.t)) {
                    continue;
                }
                let expected = tl
                    .desired
                    .iter()
                    .any(|d| d.addr == *addr && d.from <= r.t && d.to.is_none_or(|to| r.t < to));
                let answered: BTreeSet<String> = r
                    .replies
                    .get(addr)
                    .map(|m| m.iter().map(|m| node_of(*m)).collect())
                    .unwrap_or_default();
                if expected && answered.is_empty() {
                    failing.insert((ViolationKind::Unanswered, *addr), BTreeSet::new());
                } else if !expected && !answered.is_empty() {
                    failing.insert((ViolationKind::StaleAnswer, *addr), answered);
                }
            }
        }
        let keys: Vec<_> = open.keys().copied().collect();
        for k in keys {
            if !failing.contains_key(&k)
                && let Some(run) = open.remove(&k)
            {
                close(k, run, &mut out);
            }
        }
        for (k, nodes) in failing {
            let run = open.entry(k).or_insert((r.t, r.t, 0, BTreeSet::new()));
            run.1 = r.t;
            run.2 += 1;
            run.3.extend(nodes);
        }
    }
    for (k, run) in std::mem::take(&mut open) {
        close(k, run, &mut out);
    }
    out
}

/// A Service as read back from the API server after the final settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedService {
    /// Its name.
    pub name: String,
    /// Its address (the `kube-vip.io/loadbalancerIPs` annotation).
    pub addr: Option<Ipv4Addr>,
    /// `status.loadBalancer.ingress[*].ip`.
    pub ingress: Vec<String>,
    /// The `kube-vip.io/vipHost` annotation.
    pub vip_host: Option<String>,
}

/// Status check after the final settle (pure): for each Service, exactly one node answers
/// its address (`answering`, the last probe round), its ingress is exactly that address and
/// `kube-vip.io/vipHost` names the answering node.
pub fn check_status(
    services: &[ObservedService],
    answering: &BTreeMap<Ipv4Addr, BTreeSet<MacAddr>>,
    node_of: &dyn Fn(MacAddr) -> String,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for s in services {
        let Some(addr) = s.addr else {
            out.push(v(
                ViolationKind::Status,
                format!("{}: no address annotation", s.name),
            ));
            continue;
        };
        let nodes: Vec<String> = answering
            .get(&addr)
            .map(|m| m.iter().map(|m| node_of(*m)).collect())
            .unwrap_or_default();
        let node = match nodes.as_slice() {
            [n] => n.clone(),
            [] => {
                out.push(v(
                    ViolationKind::Unanswered,
                    format!("{} ({addr}) not answered after the final settle", s.name),
                ));
                continue;
            }
            many => {
                out.push(v(
                    ViolationKind::TwoMacs,
                    format!(
                        "{} ({addr}) answered by {} after the final settle",
                        s.name,
                        many.join(" and ")
                    ),
                ));
                continue;
            }
        };
        if s.ingress != [addr.to_string()] {
            out.push(v(
                ViolationKind::Status,
                format!(
                    "{} ({addr}, answered by {node}): status ingress {:?}",
                    s.name, s.ingress
                ),
            ));
        }
        if s.vip_host.as_deref() != Some(node.as_str()) {
            out.push(v(
                ViolationKind::Status,
                format!(
                    "{} ({addr}) answered by {node} but kube-vip.io/vipHost is {:?}",
                    s.name, s.vip_host
                ),
            ));
        }
    }
    out
}

/// Lease names (`kubevip-<service>`) whose Service is not in `services` (pure). Leases with
/// other names are not vipd's default Service leases and are left alone.
pub fn orphan_leases(leases: &[String], services: &BTreeSet<String>) -> Vec<String> {
    leases
        .iter()
        .filter(|l| {
            l.strip_prefix(LEASE_PREFIX)
                .is_some_and(|svc| !services.contains(svc))
        })
        .cloned()
        .collect()
}

/// RSS verdict (pure): a violation when the same process (`pid`) grew by more than
/// `pct` percent from `start` to `end` (KiB). Restarted processes are not compared.
pub fn rss_violation(
    node: &str,
    start: (i32, u64),
    end: (i32, u64),
    pct: f64,
) -> Option<Violation> {
    let ((p0, r0), (p1, r1)) = (start, end);
    if p0 != p1 || r0 == 0 {
        return None;
    }
    let growth = (r1 as f64 / r0 as f64 - 1.0) * 100.0;
    (growth > pct).then(|| {
        v(
            ViolationKind::RssGrowth,
            format!("{node} (pid {p0}): RSS {r0} KiB -> {r1} KiB ({growth:+.1} %, limit {pct} %)"),
        )
    })
}

/// What is left on a node after vipd stopped (pure): addresses on `eth0` other than the
/// node's own and link-local ones, `nft list tables` lines naming one of vipd's tables
/// (`vipd`, `vipd_fence`, `vipd_lb`; not the soak's own [`PARTITION_TABLE`](super::PARTITION_TABLE)), and links
/// other than `lo` and `eth0` (`links`: names from `ip -j link`).
pub fn leftovers(
    node: &str,
    addrs: &[LabAddress],
    own: &[IpAddr],
    nft_tables: &str,
    links: &[String],
) -> Vec<Violation> {
    let mut out = Vec::new();
    for a in addrs {
        let link_local = matches!(a.addr, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
        if !own.contains(&a.addr) && !link_local {
            out.push(v(
                ViolationKind::LeakedAddress,
                format!("{node}: {}/{} left on eth0", a.addr, a.prefix),
            ));
        }
    }
    for l in nft_tables.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let vipds = |name: &str| ["vipd", "vipd_fence", "vipd_lb"].contains(&name);
        if w.first() == Some(&"table") && w.last().is_some_and(|n| vipds(n)) {
            out.push(v(
                ViolationKind::LeakedNftTable,
                format!("{node}: {} left", l.trim()),
            ));
        }
    }
    for l in links.iter().filter(|l| *l != "lo" && *l != lab::ETH) {
        out.push(v(
            ViolationKind::LeakedLink,
            format!("{node}: link {l} left"),
        ));
    }
    out
}

/// Splits the violations about [`CANARY_ADDR`] from the others (pure).
pub fn split_canary(found: Vec<Violation>) -> (Vec<Violation>, Vec<Violation>) {
    let prefix = format!("{CANARY_ADDR} ");
    found
        .into_iter()
        .partition(|x| x.detail.starts_with(&prefix))
}

/// Verdict of the `--canary` check (pure): the auditor must have reported the canary
/// address as answered by two MACs and as answered without a Service. `Ok` describes what
/// it saw; `Err` is the violation "the auditor missed it".
pub fn canary_verdict(canary: &[Violation]) -> std::result::Result<String, Violation> {
    let two = canary.iter().any(|x| x.kind == ViolationKind::TwoMacs);
    let stale = canary.iter().any(|x| x.kind == ViolationKind::StaleAnswer);
    if two && stale {
        Ok(format!(
            "detected as expected ({})",
            canary
                .iter()
                .map(|x| x.detail.split(';').next().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
                .join("; ")
        ))
    } else {
        Err(v(
            ViolationKind::TwoMacs,
            format!(
                "canary {CANARY_ADDR} on two nodes was not reported (two MACs: {two}, answered without a Service: {stale})"
            ),
        ))
    }
}
