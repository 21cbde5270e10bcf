//! The scenarios: what a trial does to the VIP holder, how the lab is healed afterwards, and
//! for `freeze` the thaw and the watch that follows it.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use serde::{Deserialize, Serialize};
use xtask::lab::{ArpWatcher, Signal};

use crate::bench::harness::cluster::Cluster;
use crate::bench::harness::ctx::Ctx;

/// What is done to the VIP holder in a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// SIGTERM to the holder (keepalived: to its parent process).
    Graceful,
    /// SIGKILL to the holder (keepalived: to the parent and its VRRP child at once, as a
    /// crashed node).
    Kill,
    /// SIGSTOP to the holder's processes; SIGCONT 3 s after the takeover, then 4 s checking
    /// the thawed node does not answer for the VIP again.
    Freeze,
    /// SIGKILL plus the holder's link cut (no carrier) at the same instant.
    Poweroff,
    /// The holder cut off from everything (switch port detached, carrier kept).
    Partition,
    /// `vipd drain` on the holder (maintenance hand-over; vipd only: keepalived has no
    /// equivalent, its trials are skipped).
    Drain,
}

impl Scenario {
    /// Every scenario, in the order they run.
    pub const ALL: [Scenario; 6] = [
        Scenario::Graceful,
        Scenario::Kill,
        Scenario::Freeze,
        Scenario::Poweroff,
        Scenario::Partition,
        Scenario::Drain,
    ];

    /// The scenarios of `--routed`, in the order they run (no partition: a node cut off
    /// with carrier is a poweroff for BFD; no drain: its figures would be the graceful ones).
    pub const ROUTED: [Scenario; 4] = [
        Scenario::Graceful,
        Scenario::Kill,
        Scenario::Freeze,
        Scenario::Poweroff,
    ];

    /// The command-line name (`graceful`, `kill`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Graceful => "graceful",
            Scenario::Kill => "kill",
            Scenario::Freeze => "freeze",
            Scenario::Poweroff => "poweroff",
            Scenario::Partition => "partition",
            Scenario::Drain => "drain",
        }
    }

    /// Parses a command-line name.
    ///
    /// # Errors
    /// Names the value and the accepted names when it is none of them.
    pub fn parse(s: &str) -> Result<Scenario> {
        Scenario::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                anyhow!(
                    "invalid --scenario value {s:?}: expected graceful, kill, freeze, poweroff, partition, drain or all"
                )
            })
    }
}

/// The event of `scenario` on `holder`.
pub fn act(ctx: &Ctx, cluster: &Cluster, scenario: Scenario, holder: &str) -> Result<()> {
    match scenario {
        Scenario::Graceful => cluster.signal_main(holder, Signal::SIGTERM)?,
        Scenario::Kill => cluster.signal_all(holder, Signal::SIGKILL)?,
        Scenario::Freeze => cluster.signal_all(holder, Signal::SIGSTOP)?,
        Scenario::Poweroff => {
            cluster.signal_all(holder, Signal::SIGKILL)?;
            ctx.lab.cut_link(holder)?;
        }
        Scenario::Partition => ctx.lab.partition(holder)?,
        Scenario::Drain => {
            // Through the holder's own admin endpoint (the default :2112), as an operator
            // would run it on the node.
            ctx.lab.exec(holder, &ctx.vipd, &["drain"])?;
        }
    }
    Ok(())
}

/// Undoes what the event of `scenario` did to the lab around `holder` (the link of
/// `poweroff`, the partition of `partition`; the other events need no healing).
///
/// # Errors
/// When `ip` or `nft` fails.
pub fn heal(ctx: &Ctx, scenario: Scenario, holder: &str) -> Result<()> {
    match scenario {
        Scenario::Poweroff => ctx.lab.restore_link(holder)?,
        Scenario::Partition => ctx.lab.heal(holder)?,
        _ => {}
    }
    Ok(())
}

/// Freeze only: 3 s after the event thaws the old holder and watches 4 s whether it carried
/// or answered for each VIP again (noted in that VIP's notes). `watching` holds each VIP, its
/// watcher and the event's time on that watcher's clock.
pub fn thaw_and_watch(
    ctx: &Ctx,
    cluster: &Cluster,
    watching: &[(Ipv4Addr, &ArpWatcher, Duration)],
    holder: &str,
    t0: Instant,
    notes: &mut [Vec<String>],
) -> Result<Vec<bool>> {
    std::thread::sleep(Duration::from_secs(3));
    for p in cluster.pids(holder) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Signal::SIGCONT);
    }
    let cont_after_event = t0.elapsed();
    let t_cont = Instant::now();
    let vips: Vec<Ipv4Addr> = watching.iter().map(|(v, _, _)| *v).collect();
    let mut carried = vec![false; vips.len()];
    while t_cont.elapsed() < Duration::from_secs(4) {
        for (c, h) in carried.iter_mut().zip(ctx.holders_of(&vips)?) {
            *c |= h.iter().any(|h| h == holder);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let old_mac = ctx.lab.mac_of(holder)?;
    let mut out = Vec::new();
    for (((_, watcher, event_at), carried), notes) in
        watching.iter().zip(carried).zip(notes.iter_mut())
    {
        let cont_at = *event_at + cont_after_event;
        let answered = watcher
            .report()
            .slots
            .iter()
            .filter(|s| s.t >= cont_at)
            .any(|s| s.responders.contains(&old_mac));
        if carried || answered {
            notes.push(format!(
                "thawed {holder} came back (carried the VIP: {carried}, answered ARP: {answered})"
            ));
        }
        out.push(carried || answered);
    }
    Ok(out)
}
