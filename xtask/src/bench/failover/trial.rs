//! One failover trial: set up, act on the holder, watch the takeover, and the figures of
//! each VIP ([`TrialResult`]).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use serde::{Deserialize, Serialize};
use xtask::lab::{ArpWatcher, LabProcess, WatchReport};

use super::PHASE_SPREAD;
use super::cp_and_service::start_one_node_first;
use super::scenario::{Scenario, act, heal, thaw_and_watch};
use crate::bench::harness::cluster::{Cluster, reachable_holder, start_trial_cluster};
use crate::bench::harness::ctx::Ctx;
use crate::bench::harness::probe::{ProbeSummary, stop_probe, wait_probe_steady};
use crate::bench::harness::subject::Subject;
use crate::bench::stats::ms;

/// Figures of one trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialResult {
    /// The scenario.
    pub scenario: Scenario,
    /// [`Subject::label`](crate::bench::harness::subject::Subject::label).
    pub subject: String,
    /// Trial number, from 1.
    pub trial: usize,
    /// Node that held the VIP before the event.
    pub holder: String,
    /// Node that carried it after the event, if any did within the time limit.
    pub new_holder: Option<String>,
    /// The probe's longest gap between two successful answers, ms (an open gap at the end
    /// counts up to the end of the probe). `None` if the probe got fewer than two answers.
    pub gap_ms: Option<f64>,
    /// From the event until another node carried the VIP (kernel view), ms.
    pub takeover_ms: Option<f64>,
    /// From the event until the old holder no longer carried the VIP, ms.
    pub old_gone_ms: Option<f64>,
    /// Time with two or more ARP responders for the VIP, ms (slots x 20 ms).
    pub two_responders_ms: f64,
    /// MACs seen answering together, as `node-a+node-b`.
    pub two_responder_nodes: Vec<String>,
    /// Backend switches the probe saw.
    pub switches: u64,
    /// Probe failures.
    pub probe_failures: u64,
    /// Probe requests with a known outcome.
    pub probe_requests: u64,
    /// The probe's backend switches, as `from->to at MS ms (gap MS ms)`.
    pub probe_switches: Vec<String>,
    /// Whether the probe's last answers came from a node (false: an open gap at the end).
    pub recovered: bool,
    /// freeze only: the thawed node carried or answered for the VIP again.
    pub came_back: Option<bool>,
    /// Anything worth a look.
    pub notes: Vec<String>,
    /// A `--routed` trial: `takeover_ms` is when the router got the new holder's path,
    /// `old_gone_ms` when it dropped the old holder's, `two_responders_ms` the time it had
    /// two paths at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub routed: bool,
}

impl TrialResult {
    /// The result of one VIP of a trial from what `w` and the probe (`summary`) saw: the
    /// probe's notes appended to `notes`; no time with two responders, no thaw, not routed
    /// (the caller sets those).
    pub(super) fn of(
        scenario: Scenario,
        subject: String,
        trial: usize,
        holder: &str,
        w: &Watch,
        summary: &ProbeSummary,
        mut notes: Vec<String>,
    ) -> TrialResult {
        let (recovered, probe_switches) = probe_notes(summary, &mut notes);
        TrialResult {
            scenario,
            subject,
            trial,
            holder: holder.to_string(),
            new_holder: w.new_holder.clone(),
            gap_ms: summary.worst_gap_ms(),
            takeover_ms: w.takeover.map(ms),
            old_gone_ms: w.old_gone.map(ms),
            two_responders_ms: 0.0,
            two_responder_nodes: Vec::new(),
            switches: summary.switch_count,
            probe_failures: summary.failures,
            probe_requests: summary.requests,
            probe_switches,
            recovered,
            came_back: None,
            notes,
            routed: false,
        }
    }
}

/// What happened to one VIP after the event, from polling the nodes' addresses (or, for
/// `--routed`, the router's paths); times since the event.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Watch {
    /// The first node other than the old holder that carried it.
    pub new_holder: Option<String>,
    /// When it did.
    pub takeover: Option<Duration>,
    /// When the old holder was first seen without it.
    pub old_gone: Option<Duration>,
    /// The most nodes that carried it at once.
    pub max_carriers: usize,
}

/// Polls the nodes' addresses until, for every one of `vips`, a node other than `old`
/// carries it, or `limit` passes; one [`Watch`] per VIP, in order.
fn watch_takeovers(
    ctx: &Ctx,
    vips: &[Ipv4Addr],
    old: &str,
    t0: Instant,
    limit: Duration,
) -> Result<Vec<Watch>> {
    let mut ws: Vec<Watch> = vips.iter().map(|_| Watch::default()).collect();
    loop {
        let hs = ctx.holders_of(vips)?;
        let now = t0.elapsed();
        for (w, h) in ws.iter_mut().zip(&hs) {
            if w.new_holder.is_some() {
                continue;
            }
            w.max_carriers = w.max_carriers.max(h.len());
            if w.old_gone.is_none() && !h.iter().any(|n| n == old) {
                w.old_gone = Some(now);
            }
            if let Some(n) = h.iter().find(|n| *n != old) {
                w.new_holder = Some(n.clone());
                w.takeover = Some(now);
            }
        }
        if ws.iter().all(|w| w.new_holder.is_some()) || now > limit {
            return Ok(ws);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Freeze trials with `--freeze-ms`: a thread that thaws the holder's processes (those
/// frozen by the event) that long after `t0`, whether or not another node took over; the
/// thaw of [`thaw_and_watch`] is then a no-op. `None` otherwise.
fn early_thaw(
    ctx: &Ctx,
    cluster: &Cluster,
    scenario: Scenario,
    holder: &str,
    t0: Instant,
) -> Option<std::thread::JoinHandle<()>> {
    let after = ctx.freeze_for.filter(|_| scenario == Scenario::Freeze)?;
    let pids = cluster.pids(holder);
    Some(std::thread::spawn(move || {
        std::thread::sleep((t0 + after).saturating_duration_since(Instant::now()));
        for p in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }))
}

/// Largest time a takeover may take before the trial gives up: generous, three lease
/// durations of the slowest timings we expect plus slack.
pub(super) fn takeover_limit(subject: &Subject) -> Duration {
    match subject {
        Subject::Vipd(t) => {
            let lease = t
                .values
                .as_ref()
                .and_then(|v| v[0].parse::<f64>().ok())
                .unwrap_or(5.0);
            Duration::from_secs_f64(lease * 3.0 + 10.0)
        }
        Subject::Keepalived(_) => Duration::from_secs(20),
    }
}

/// Runs one trial of `scenario` for `subject`. See the module documentation.
///
/// # Errors
/// When the trial cannot be set up (no holder, probe never answers); what happens after the
/// event is reported in the result, not as an error.
pub fn run_trial(
    ctx: &Ctx,
    scenario: Scenario,
    subject: &Subject,
    trial: usize,
) -> Result<TrialResult> {
    run_trial_per_vip(ctx, scenario, subject, trial)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("the trial measured no VIP"))
}

/// Runs one trial of `scenario` for `subject` and returns one result per VIP of the run
/// ([`Ctx::vips`], in that order; labelled `SUBJECT:TAG` when there are several). See the
/// module documentation.
///
/// # Errors
/// When the trial cannot be set up (no holder, probe never answers); what happens after the
/// event is reported in the results, not as an error.
pub fn run_trial_per_vip(
    ctx: &Ctx,
    scenario: Scenario,
    subject: &Subject,
    trial: usize,
) -> Result<Vec<TrialResult>> {
    let mut notes = Vec::new();
    say_setting_up(ctx, scenario, subject, trial);
    let mut cluster = if ctx.cp_and_service {
        start_one_node_first(ctx, subject, trial, &mut notes)?
    } else {
        start_trial_cluster(ctx, subject, &mut notes)?
    };
    let holder = reachable_holder(ctx, subject, &cluster)?;
    let vips = ctx.vips();
    let addrs: Vec<Ipv4Addr> = vips.iter().map(|(v, _)| *v).collect();
    let (watchers, probes) = start_watching(ctx, &addrs, &holder, &mut notes)?;
    // Spread the event over one renew (or VRRP advert) interval, trial by trial, so the
    // trials do not all hit the same phase of the holder's 1 s renew cycle.
    std::thread::sleep(PHASE_SPREAD.mul_f64((trial.saturating_sub(1) % 5) as f64 / 5.0));
    ctx.say(format!(
        "{holder} holds the VIP; acting: {}",
        scenario.name()
    ));

    let t0 = Instant::now();
    act(ctx, &cluster, scenario, &holder)?;
    let early_thaw = early_thaw(ctx, &cluster, scenario, &holder, t0);
    let ws = watch_takeovers(ctx, &addrs, &holder, t0, takeover_limit(subject))?;
    let mut per_vip = takeover_notes(ctx, scenario, subject, &ws, &vips);
    let came_back = if scenario == Scenario::Freeze {
        let watching: Vec<(Ipv4Addr, &ArpWatcher, Duration)> = addrs
            .iter()
            .zip(&watchers)
            .map(|(v, (w, at))| (*v, w, t0.duration_since(*at)))
            .collect();
        thaw_and_watch(ctx, &cluster, &watching, &holder, t0, &mut per_vip)?
            .into_iter()
            .map(Some)
            .collect()
    } else {
        std::thread::sleep(Duration::from_secs(2));
        vec![None; vips.len()]
    };
    if let Some(t) = early_thaw {
        let _ = t.join();
    }
    let summaries: Vec<Result<ProbeSummary>> = probes.into_iter().map(stop_probe).collect();
    let mut reports = Vec::new();
    for (w, at) in watchers {
        reports.push((w.stop()?, t0.duration_since(at)));
    }
    end_trial(ctx, &mut cluster, scenario, subject, &holder, &mut notes)?;

    let mut out = Vec::new();
    for (i, (summary, (report, event_at))) in summaries.into_iter().zip(reports).enumerate() {
        let summary = summary?;
        let mut notes = [notes.clone(), std::mem::take(&mut per_vip[i])].concat();
        let (two_ms, pairs) = two_responders(ctx, &report, event_at, &mut notes);
        let w = &ws[i];
        if w.new_holder.is_none() {
            notes.push("no takeover within the time limit".into());
        }
        let subject = match vips[i].1 {
            "" => subject.label(),
            tag => format!("{}:{tag}", subject.label()),
        };
        out.push(TrialResult {
            two_responders_ms: two_ms,
            two_responder_nodes: pairs.into_iter().collect(),
            came_back: came_back[i],
            ..TrialResult::of(scenario, subject, trial, &holder, w, &summary, notes)
        });
    }
    Ok(out)
}

/// Says (verbose runs) that trial `trial` of `scenario` for `subject` is being set up.
pub(super) fn say_setting_up(ctx: &Ctx, scenario: Scenario, subject: &Subject, trial: usize) {
    ctx.say(format!(
        "{} {} #{trial}: setting up",
        scenario.name(),
        subject.label()
    ));
}

/// An ARP watcher and when it started (its slots count from then).
type Watcher = (ArpWatcher, Instant);

/// Starts one ARP watcher (with its start: each watcher's slots count from it) and one probe
/// per VIP of `addrs`, waits until every probe answers steadily from `holder`, and notes a
/// change of holders meanwhile.
fn start_watching(
    ctx: &Ctx,
    addrs: &[Ipv4Addr],
    holder: &str,
    notes: &mut Vec<String>,
) -> Result<(Vec<Watcher>, Vec<LabProcess>)> {
    // Each watcher's slots count from its own start.
    let mut watchers = Vec::new();
    for v in addrs {
        watchers.push((ctx.start_arp_watch(*v)?, Instant::now()));
    }
    let mut probes = Vec::new();
    for v in addrs {
        probes.push(ctx.start_probe(IpAddr::V4(*v))?);
    }
    // The HTTP probe names the answering node; a TCP probe only says it connected.
    let answer = if ctx.lb { "connected" } else { holder };
    for p in &probes {
        wait_probe_steady(p, answer, 25, Duration::from_secs(10))?;
    }
    // The holder may have changed meanwhile (it should not).
    let h = ctx.holders_of(addrs)?;
    if h.iter().any(|h| *h != [holder.to_string()]) {
        let h: Vec<String> = h.iter().map(|h| format!("{h:?}")).collect();
        notes.push(format!(
            "holders changed before the event: {}",
            h.join(", ")
        ));
    }
    Ok((watchers, probes))
}

/// Says who took each of `vips` over and when; returns per VIP a note when several nodes
/// carried it at once in a scenario where that must not happen.
fn takeover_notes(
    ctx: &Ctx,
    scenario: Scenario,
    subject: &Subject,
    ws: &[Watch],
    vips: &[(Ipv4Addr, &str)],
) -> Vec<Vec<String>> {
    let opt_ms =
        |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{} ms", d.as_millis()));
    let mut per_vip: Vec<Vec<String>> = vec![Vec::new(); vips.len()];
    // Under the millisecond fence a killed or frozen holder's address outlives the lease
    // by design, inert (its element ended): only the two-responder figure counts there.
    let inert_allowed = matches!(subject, Subject::Vipd(t) if t.nft_fence)
        && matches!(scenario, Scenario::Kill | Scenario::Freeze);
    for ((w, (vip, _)), notes) in ws.iter().zip(vips).zip(per_vip.iter_mut()) {
        let of = if vips.len() > 1 {
            format!(" of {vip}")
        } else {
            String::new()
        };
        ctx.say(format!(
            "takeover{of} by {} after {} (old gone after {})",
            w.new_holder.as_deref().unwrap_or("nobody"),
            opt_ms(w.takeover),
            opt_ms(w.old_gone)
        ));
        if w.max_carriers > 1
            && !inert_allowed
            && matches!(
                scenario,
                Scenario::Graceful | Scenario::Kill | Scenario::Freeze | Scenario::Drain
            )
        {
            notes.push(format!("{} nodes carried the VIP at once", w.max_carriers));
        }
    }
    per_vip
}

/// Heals the event, stops every instance and removes a VIP left behind (noted).
fn end_trial(
    ctx: &Ctx,
    cluster: &mut Cluster,
    scenario: Scenario,
    subject: &Subject,
    holder: &str,
    notes: &mut Vec<String>,
) -> Result<()> {
    // Heal before stopping, so graceful stops can reach the API server.
    heal(ctx, scenario, holder)?;
    cluster.stop();
    // vipd removes its VIP when stopped (or the kernel fence does); a killed keepalived
    // leaves it behind for good. Either way the next trial starts clean.
    let grace = match subject {
        Subject::Vipd(_) => Duration::from_secs(6),
        Subject::Keepalived(_) => Duration::from_secs(1),
    };
    let left = ctx.clear_vip(grace)?;
    if !left.is_empty() {
        notes.push(format!(
            "VIP still on {} {grace:?} after every instance stopped; removed by hand",
            left.join(",")
        ));
    }
    Ok(())
}

/// Time with two or more ARP responders (slots x interval, ms) and the node pairs seen; a
/// note when there were any.
fn two_responders(
    ctx: &Ctx,
    report: &WatchReport,
    event_at: Duration,
    notes: &mut Vec<String>,
) -> (f64, BTreeSet<String>) {
    let mut two = 0usize;
    let mut pairs = BTreeSet::new();
    for s in &report.slots {
        if s.responders.len() >= 2 {
            two += 1;
            let names: Vec<String> = s.responders.iter().map(|m| ctx.node_of(m)).collect();
            pairs.insert(names.join("+"));
        }
    }
    let two_ms = two as f64 * ms(report.interval);
    if two > 0 {
        let first = report
            .slots
            .iter()
            .find(|s| s.responders.len() >= 2)
            .map(|s| ms(s.t.saturating_sub(event_at)))
            .unwrap_or_default();
        notes.push(format!(
            "two ARP responders ({}) for {two_ms:.0} ms, first {first:.0} ms after the event",
            pairs.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    (two_ms, pairs)
}

/// Whether the probe recovered, and its switches as text; notes a trailing gap and more
/// than one switch.
fn probe_notes(summary: &ProbeSummary, notes: &mut Vec<String>) -> (bool, Vec<String>) {
    let recovered = summary.trailing_failures == 0 && summary.successes > 0;
    if !recovered {
        notes.push(format!(
            "probe ended in a gap ({} trailing failures)",
            summary.trailing_failures
        ));
    }
    let sw: Vec<String> = summary
        .switches
        .iter()
        .map(|s| {
            format!(
                "{}->{} at {:.0} ms (gap {:.0} ms, {} failed)",
                s.from, s.to, s.at_ms, s.gap_ms, s.failures
            )
        })
        .collect();
    if summary.switch_count > 1 {
        notes.push(format!(
            "{} switches: {}",
            summary.switch_count,
            sw.join("; ")
        ));
    }
    (recovered, sw)
}
