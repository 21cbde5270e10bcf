//! What a run printed and wrote: per-trial and per-pair lines, the summary, pair and ratio
//! tables, and the JSON report.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::idle::IdleResult;
use super::scenario::Scenario;
use super::trial::TrialResult;
use crate::bench::harness::subject::Vrrp;
use crate::bench::stats::percentile;

/// Both VIPs of one `--cp-and-service` trial, from its two [`TrialResult`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairResult {
    /// The scenario.
    pub scenario: Scenario,
    /// [`Subject::label`](crate::bench::harness::subject::Subject::label) (`vipd T cp+svc`).
    pub subject: String,
    /// Trial number, from 1.
    pub trial: usize,
    /// Node that held both VIPs before the event.
    pub holder: String,
    /// Node that carried the control-plane VIP after the event.
    pub cp_new_holder: Option<String>,
    /// Node that carried the Service VIP after the event.
    pub svc_new_holder: Option<String>,
    /// Both VIPs moved to the same node.
    pub same_node: bool,
    /// The larger of the two VIPs' gaps: until both answered again, ms (`None` if a probe
    /// had fewer than two answers).
    pub both_gap_ms: Option<f64>,
    /// The Service VIP's takeover minus the control-plane VIP's, ms (`None` if either did
    /// not move).
    pub takeover_spread_ms: Option<f64>,
}

impl PairResult {
    /// The pair of `cp` and `svc` (the two results of one trial, in [`Ctx::vips`](crate::bench::harness::ctx::Ctx::vips) order).
    pub fn of(subject: &str, cp: &TrialResult, svc: &TrialResult) -> PairResult {
        PairResult {
            scenario: cp.scenario,
            subject: subject.to_string(),
            trial: cp.trial,
            holder: cp.holder.clone(),
            cp_new_holder: cp.new_holder.clone(),
            svc_new_holder: svc.new_holder.clone(),
            same_node: cp.new_holder.is_some() && cp.new_holder == svc.new_holder,
            both_gap_ms: cp.gap_ms.zip(svc.gap_ms).map(|(a, b)| a.max(b)),
            takeover_spread_ms: svc.takeover_ms.zip(cp.takeover_ms).map(|(s, c)| s - c),
        }
    }
}

/// Everything a run measured (the `--json` output).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BenchReport {
    /// Every trial (with `--cp-and-service` one per VIP and trial).
    pub trials: Vec<TrialResult>,
    /// Idle figures per vipd timing.
    pub idle: Vec<IdleResult>,
    /// `--cp-and-service`: both VIPs of each trial.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<PairResult>,
    /// `--routed`: the ECMP spread per VIP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread: Vec<SpreadResult>,
}

/// ECMP spread of one VIP (`--routed`): new connections from the client, counted per node
/// that answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpreadResult {
    /// The VIP.
    pub vip: IpAddr,
    /// Where the router's paths came from
    /// ([`PathSource::name`](super::routed::PathSource::name)).
    pub source: String,
    /// The router's next hops during the measurement, as node names.
    pub paths: Vec<String>,
    /// New connections opened, one after the other.
    pub connections: usize,
    /// Answers per node (`-`: connections that failed).
    pub per_node: BTreeMap<String, usize>,
}

impl SpreadResult {
    /// The largest deviation of a path's share from an even share over [`Self::paths`],
    /// in percent of the even share (0: perfectly even; a path with no connection counts
    /// as -100 %); `None` without paths or connections.
    pub fn max_deviation_pct(&self) -> Option<f64> {
        if self.paths.is_empty() || self.connections == 0 {
            return None;
        }
        let even = self.connections as f64 / self.paths.len() as f64;
        self.paths
            .iter()
            .map(|p| {
                let got = self.per_node.get(p).copied().unwrap_or(0) as f64;
                ((got - even) / even * 100.0).abs()
            })
            .reduce(f64::max)
    }
}

/// The ECMP spread of each VIP, one line each: the counts per node and their share, the
/// largest deviation from an even share and failed connections. Empty without figures.
pub fn spread_table(report: &BenchReport) -> String {
    let mut s = String::new();
    let Some(first) = report.spread.first() else {
        return s;
    };
    let _ = writeln!(
        s,
        "\nECMP spread (new connections from the client, one after the other; paths: {}):",
        first.source
    );
    for r in &report.spread {
        let per: Vec<String> = r
            .paths
            .iter()
            .map(|p| {
                let n = r.per_node.get(p).copied().unwrap_or(0);
                format!(
                    "{p} {n} ({:.1} %)",
                    n as f64 * 100.0 / r.connections.max(1) as f64
                )
            })
            .collect();
        let failed: usize = r
            .per_node
            .iter()
            .filter(|(k, _)| !r.paths.contains(k))
            .map(|(_, n)| n)
            .sum();
        let _ = writeln!(
            s,
            "  {:<16} {} connections over {} paths: {}; max deviation from even {}, {failed} not answered by a path",
            r.vip.to_string(),
            r.connections,
            r.paths.len(),
            per.join(", "),
            r.max_deviation_pct()
                .map_or_else(|| "-".to_string(), |d| format!("{d:.1} %"))
        );
    }
    s
}

/// The router's side of the `--routed` trials per (scenario, subject): p50/p95/max of the
/// time until the router dropped the old holder's path and until it had the new holder's
/// (ms since the event), and the worst trial's time with two paths at once (must be 0 for
/// an elected Service). Empty without routed trials.
pub fn route_table(report: &BenchReport) -> String {
    let mut s = String::new();
    let groups: Vec<_> = grouped(report)
        .into_iter()
        .filter(|(_, rs)| rs.iter().all(|r| r.routed))
        .collect();
    if groups.is_empty() {
        return s;
    }
    let w = label_width(groups.iter().map(|((_, subj), _)| subj.as_str()));
    let _ = writeln!(
        s,
        "\nrouter (ms after the event: old = the old holder's path dropped, new = the new holder's path installed):"
    );
    let _ = writeln!(
        s,
        "{:<9} {:<w$} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>11}",
        "scenario",
        "impl",
        "trials",
        "old p50",
        "old p95",
        "old max",
        "new p50",
        "new p95",
        "new max",
        "2-path max",
    );
    for ((scenario, subject), rs) in groups {
        let old: Vec<f64> = rs.iter().filter_map(|r| r.old_gone_ms).collect();
        let [o50, o95, omax] = p50_p95_max(&old);
        let new: Vec<f64> = rs.iter().filter_map(|r| r.takeover_ms).collect();
        let [n50, n95, nmax] = p50_p95_max(&new);
        let two = rs
            .iter()
            .map(|r| r.two_responders_ms)
            .fold(0.0_f64, f64::max);
        let _ = writeln!(
            s,
            "{:<9} {:<w$} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>11}",
            scenario.name(),
            subject,
            rs.len(),
            o50,
            o95,
            omax,
            n50,
            n95,
            nmax,
            format!("{two:.0}"),
        );
    }
    s
}

/// p50, p95 and max of `v` (ms) as table cells (`-` when empty).
fn p50_p95_max(v: &[f64]) -> [String; 3] {
    [50.0, 95.0, 100.0].map(|p| opt_ms(percentile(v, p)))
}

fn opt_ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into())
}

/// One line per trial.
pub fn trial_line(r: &TrialResult) -> String {
    let (take, two) = if r.routed {
        ("new path", "two paths")
    } else {
        ("takeover", "two responders")
    };
    let mut s = format!(
        "{:<9} {:<16} #{} {}->{}: gap {} ms, {take} {} ms, old gone {} ms, {two} {:.0} ms",
        r.scenario.name(),
        r.subject,
        r.trial,
        r.holder,
        r.new_holder.as_deref().unwrap_or("?"),
        opt_ms(r.gap_ms),
        opt_ms(r.takeover_ms),
        opt_ms(r.old_gone_ms),
        r.two_responders_ms
    );
    for n in &r.notes {
        let _ = write!(s, "\n      note: {n}");
    }
    s
}

/// One line per `--cp-and-service` trial: where each VIP went and the slower VIP's gap.
pub fn pair_line(p: &PairResult) -> String {
    let to = |n: &Option<String>| n.clone().unwrap_or_else(|| "?".into());
    format!(
        "{:<9} {:<16} #{} {}->cp {}, svc {} ({}): both back after {} ms, svc takeover - cp takeover {} ms",
        p.scenario.name(),
        p.subject,
        p.trial,
        p.holder,
        to(&p.cp_new_holder),
        to(&p.svc_new_holder),
        if p.same_node {
            "same node"
        } else {
            "different nodes"
        },
        opt_ms(p.both_gap_ms),
        opt_ms(p.takeover_spread_ms)
    )
}

/// The `--cp-and-service` table per (scenario, subject): trials, p50/p95/max of the slower
/// VIP's gap (ms), the largest takeover spread between the two VIPs (ms, absolute) and in
/// how many trials both moved to the same node. Empty without pairs.
pub fn pair_table(report: &BenchReport) -> String {
    let mut s = String::new();
    if report.pairs.is_empty() {
        return s;
    }
    let mut order: Vec<(Scenario, &str)> = Vec::new();
    for p in &report.pairs {
        if !order.contains(&(p.scenario, p.subject.as_str())) {
            order.push((p.scenario, p.subject.as_str()));
        }
    }
    let w = label_width(order.iter().map(|(_, subj)| *subj));
    let _ = writeln!(
        s,
        "
both VIPs (control-plane and Service, one holder before the event; both back = the slower VIP's gap):"
    );
    let _ = writeln!(
        s,
        "{:<9} {:<w$} {:>6} {:>9} {:>9} {:>9} {:>11} {:>10}",
        "scenario", "impl", "trials", "both p50", "both p95", "both max", "spread max", "same node",
    );
    for (scenario, subject) in order {
        let ps: Vec<&PairResult> = report
            .pairs
            .iter()
            .filter(|p| p.scenario == scenario && p.subject == subject)
            .collect();
        let both: Vec<f64> = ps.iter().filter_map(|p| p.both_gap_ms).collect();
        let [b50, b95, bmax] = p50_p95_max(&both);
        let spread = ps
            .iter()
            .filter_map(|p| p.takeover_spread_ms)
            .map(f64::abs)
            .reduce(f64::max);
        let _ = writeln!(
            s,
            "{:<9} {:<w$} {:>6} {:>9} {:>9} {:>9} {:>11} {:>10}",
            scenario.name(),
            subject,
            ps.len(),
            b50,
            b95,
            bmax,
            opt_ms(spread),
            format!("{}/{}", ps.iter().filter(|p| p.same_node).count(), ps.len()),
        );
    }
    s
}

/// Width of the `impl` column: the longest label, at least 16.
fn label_width<'a>(labels: impl Iterator<Item = &'a str>) -> usize {
    labels.map(str::len).fold(16, usize::max)
}

/// p50, p95 and max of the trials' gaps of one (scenario, subject).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GapStats {
    /// Median gap, ms.
    pub p50: f64,
    /// 95th percentile, ms.
    pub p95: f64,
    /// Largest, ms.
    pub max: f64,
}

fn gap_stats(rs: &[&TrialResult]) -> Option<GapStats> {
    let v: Vec<f64> = rs.iter().filter_map(|r| r.gap_ms).collect();
    Some(GapStats {
        p50: percentile(&v, 50.0)?,
        p95: percentile(&v, 95.0)?,
        max: percentile(&v, 100.0)?,
    })
}

fn grouped(report: &BenchReport) -> Vec<((Scenario, String), Vec<&TrialResult>)> {
    let mut order: Vec<(Scenario, String)> = Vec::new();
    let mut map: HashMap<(Scenario, String), Vec<&TrialResult>> = HashMap::new();
    for r in &report.trials {
        let k = (r.scenario, r.subject.clone());
        if !map.contains_key(&k) {
            order.push(k.clone());
        }
        map.entry(k).or_default().push(r);
    }
    order
        .into_iter()
        .map(|k| {
            let v = map.remove(&k).unwrap_or_default();
            (k, v)
        })
        .collect()
}

/// The per-(scenario, subject) table: trials, gap p50/p95/max (ms), takeover p50 (ms) and
/// the worst trial's time with two responders (ms).
pub fn summary_table(report: &BenchReport) -> String {
    let mut s = String::new();
    let groups = grouped(report);
    let w = label_width(groups.iter().map(|((_, subj), _)| subj.as_str()));
    let _ = writeln!(
        s,
        "{:<9} {:<w$} {:>6} {:>8} {:>8} {:>8} {:>10} {:>12}  notes",
        "scenario", "impl", "trials", "gap p50", "gap p95", "gap max", "takeover50", "2-resp max",
    );
    for ((scenario, subject), rs) in groups {
        let g = gap_stats(&rs);
        let take: Vec<f64> = rs.iter().filter_map(|r| r.takeover_ms).collect();
        let two_max = rs
            .iter()
            .map(|r| r.two_responders_ms)
            .fold(0.0_f64, f64::max);
        let flagged = rs.iter().filter(|r| !r.notes.is_empty()).count();
        let _ = writeln!(
            s,
            "{:<9} {:<w$} {:>6} {:>8} {:>8} {:>8} {:>10} {:>12}  {}",
            scenario.name(),
            subject,
            rs.len(),
            opt_ms(g.map(|g| g.p50)),
            opt_ms(g.map(|g| g.p95)),
            opt_ms(g.map(|g| g.max)),
            opt_ms(percentile(&take, 50.0)),
            format!("{two_max:.0}"),
            if flagged > 0 {
                format!("{flagged} trial(s) with notes")
            } else {
                String::new()
            }
        );
    }
    s
}

/// vipd / keepalived ratios of gap p50 and p95 per scenario and vipd timing, one section
/// per keepalived variant ([`Vrrp::label`]) in the report.
pub fn ratio_table(report: &BenchReport) -> String {
    let groups = grouped(report);
    let stats: HashMap<(Scenario, String), GapStats> = groups
        .iter()
        .filter_map(|(k, rs)| gap_stats(rs).map(|g| (k.clone(), g)))
        .collect();
    let mut s = String::new();
    for vrrp in Vrrp::ALL {
        ratio_section(&mut s, &groups, &stats, vrrp.label());
    }
    s
}

/// The lines of [`ratio_table`] against the keepalived row `against`.
fn ratio_section(
    s: &mut String,
    groups: &[((Scenario, String), Vec<&TrialResult>)],
    stats: &HashMap<(Scenario, String), GapStats>,
    against: &str,
) {
    let mut header = false;
    for ((scenario, subject), g) in groups
        .iter()
        .filter(|((_, subj), _)| subj.starts_with("vipd"))
        .filter_map(|(k, _)| stats.get(k).map(|g| (k, g)))
    {
        let Some(k) = stats.get(&(*scenario, against.to_string())) else {
            continue;
        };
        if !header {
            let _ = writeln!(s, "\nvipd / {against} (gap; < 1 means vipd is faster):");
            header = true;
        }
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}", a / b)
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            s,
            "  {:<9} {:<16} p50 {:>5}  p95 {:>5}",
            scenario.name(),
            subject,
            ratio(g.p50, k.p50),
            ratio(g.p95, k.p95)
        );
    }
}
