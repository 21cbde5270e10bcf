//! The holder's loop: follows leadership, VIP set updates, claims and the periodic check.

use super::*;
use crate::lease::{FENCE_MARGIN, fence_lapsed};

async fn next_update(updates: &mut Option<watch::Receiver<Vec<VipSpec>>>) -> Vec<VipSpec> {
    if let Some(rx) = updates {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().clone();
        }
        // Sender gone: the set stays as it is.
        *updates = None;
    }
    std::future::pending().await
}

/// The next claim of the current term's watches; pending while there are none.
async fn next_claim(
    claims: &mut Option<(mpsc::UnboundedSender<Claim>, mpsc::UnboundedReceiver<Claim>)>,
) -> Option<Claim> {
    match claims {
        Some((_, rx)) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl<K: Kernel, A: Announcer> VipHolder<K, A> {
    /// Follows `leadership` until `shutdown`: adds, refreshes, repairs and announces the VIPs
    /// while leading (after a conflict probe where the term calls for one, see [`probe`]),
    /// removes them when not, and acknowledges every dropped term on `leadership.dropped`.
    /// On shutdown removes the VIPs before returning.
    pub async fn run(mut self, mut leadership: Leadership, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.check_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut term = 0u64;
        let mut updates = self.updates.take();
        let mut unacked: Option<u64> = None;
        self.leader_view = Some(leadership.state.clone());
        if let Some(u) = updates.as_mut() {
            self.vips = u.borrow_and_update().clone();
        }
        self.probes = vec![ProbeState::default(); self.vips.len()];
        Box::pin(self.resolve_links()).await;
        self.gates.set(GATE_STARTING, true);
        loop {
            self.publish_bound();
            self.sync_answers();
            self.end_settled_takeover();
            // Checks run while leading, when configured for followers, and while a gate is
            // closed (to re-open it). Followers with nothing to check or acknowledge do not
            // tick: hundreds of Service groups per node would otherwise wake twice a second
            // each for nothing.
            let checking = self.renewed_at.is_some()
                || self.cfg.check_following
                || !self.gates.closed().is_empty();
            let probe_at = self.next_probe_deadline();
            let garp_at = self.next_garp();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    self.takeover_mark = None;
                    self.stop_answers();
                    if Box::pin(self.drop_all()).await {
                        let _ = leadership.dropped.send(term);
                        Box::pin(self.arp.release(&self.name)).await;
                        Box::pin(self.disarm_nft_fence()).await;
                    }
                    return;
                }
                changed = leadership.state.changed() => {
                    if changed.is_err() {
                        // Elector gone: hold nothing.
                        self.takeover_mark = None;
                        self.stop_answers();
                        if Box::pin(self.drop_all()).await {
                            Box::pin(self.arp.release(&self.name)).await;
                            Box::pin(self.disarm_nft_fence()).await;
                        }
                        shutdown.cancelled().await;
                        return;
                    }
                    let state = leadership.state.borrow_and_update().clone();
                    match state {
                        LeaderState::Leading { term: t, renewed_at: r, clean } => {
                            let first = self.renewed_at.is_none() || t != term;
                            term = t;
                            self.term = t;
                            self.renewed_at = Some(r);
                            if first {
                                info!(holder = %self.name, term, clean, "leading: adding VIPs");
                                Box::pin(self.resolve_links()).await;
                                self.start_term(clean);
                            }
                            Box::pin(self.refresh(first)).await;
                        }
                        LeaderState::Following { .. } => {
                            self.takeover_mark = None;
                            if self.renewed_at.take().is_some() {
                                info!(holder = %self.name, term, "not leading: removing VIPs");
                            }
                            // No answer from here on, before the addresses go.
                            self.answer_gate.close();
                            // Acknowledge (which lets the elector release the lease) only
                            // once the VIPs are confirmed gone; otherwise retry on the tick.
                            if Box::pin(self.drop_all()).await {
                                let _ = leadership.dropped.send(term);
                                unacked = None;
                                Box::pin(self.disarm_nft_fence()).await;
                            } else {
                                unacked = Some(term);
                            }
                        }
                    }
                }
                Some(claim) = next_claim(&mut self.claims) => {
                    Box::pin(self.on_claim(claim)).await;
                }
                new = next_update(&mut updates) => {
                    Box::pin(self.set_vips(new)).await;
                }
                _ = sleep_until_opt(probe_at) => {
                    Box::pin(self.probe_tick()).await;
                }
                _ = tick.tick(), if checking || unacked.is_some() => {
                    if let Some(t) = unacked
                        && self.renewed_at.is_none()
                        && Box::pin(self.drop_all()).await
                    {
                        let _ = leadership.dropped.send(t);
                        unacked = None;
                        Box::pin(self.disarm_nft_fence()).await;
                    }
                    if checking {
                        Box::pin(self.check()).await;
                    }
                }
                _ = sleep_until_opt(garp_at) => {
                    Box::pin(self.repeat_due(Instant::now())).await;
                }
            }
        }
    }

    /// Ends the term's takeover mark ([`HolderConfig::takeovers`]) once no VIP of it is
    /// still in its probe window: the others are in place (the mark ended with the first
    /// batch), refused by another host, gone from the set, or waiting for the next
    /// renewal's refresh (a stale first renewal, no nftables fence yet). Without it such a
    /// term kept the node busy, and every status write waited its limit, until the term
    /// ended.
    fn end_settled_takeover(&mut self) {
        if self.takeover_mark.is_some()
            && !self
                .probes
                .iter()
                .any(|p| matches!(p.phase(), acd::Phase::Probing { .. }))
        {
            self.takeover_mark = None;
        }
    }

    /// A term starts: watch every VIP for claims by other hosts, and probe before binding
    /// unless the lease was released cleanly by its previous holder (`clean`).
    pub(super) fn start_term(&mut self, clean: bool) {
        self.unwatch_all();
        // The repeats are the new term's: its refresh announces the VIPs again (a new term
        // can follow the last without a step-down seen in between).
        self.last_repeat = None;
        self.first_repeats.clear();
        let window = self.probing_window();
        let now = Instant::now();
        // A term that starts with no VIPs takes nothing over: a Service added later in it
        // is no takeover ([`Takeover`] would read as a failover as long as the term).
        self.term_started = (!self.vips.is_empty()).then_some(now);
        self.takeover_mark = self
            .term_started
            .map(|_| self.cfg.takeovers.mark(self.vips.len()));
        for i in 0..self.vips.len() {
            self.watch(i);
            let action = self.probes[i].lead(!clean, window, now);
            self.act(i, action);
        }
    }

    /// Between the chunks of a long batch of adds ([`ADD_CHUNK`]): takes the lease's latest
    /// renewal of this term from the elector (the run loop, busy with the batch, would see
    /// it only afterwards), sets the nftables elements again when they are due
    /// ([`Self::refresh_nft_fence_if_due`]), and says whether to go on: `false` when the
    /// elector no longer leads in this term, or the lease may have lapsed ([`Self::fence_left`]);
    /// the run loop then handles the step-down as usual.
    pub(super) async fn catch_up(&mut self) -> bool {
        let latest = match &self.leader_view {
            Some(view) => view.borrow().clone(),
            None => return self.fence_left(Instant::now()).is_some(),
        };
        match (latest, self.renewed_at) {
            (
                LeaderState::Leading {
                    term, renewed_at, ..
                },
                Some(known),
            ) if term == self.term => self.renewed_at = Some(renewed_at.max(known)),
            _ => return false,
        }
        let now = Instant::now();
        self.refresh_nft_fence_if_due(now).await;
        self.fence_left(now).is_some()
    }

    /// The lifetime a VIP may get now ([`fence_grant`] from the last renewal's send time):
    /// [`Self::fence_for`] without a not-after time, in seconds; `None` when not leading, or
    /// when the lease may have expired for the other nodes ([`fence_lapsed`]) even though
    /// the elector has not said so yet: then every VIP goes.
    pub(super) fn fence_left(&self, now: Instant) -> Option<u32> {
        self.fence_for(None, u32::MAX, now, false)
            .map(|f| f.secs_at(now))
    }

    /// The second line's length for this node now, seconds ([`crate::lease::second_line_len`]
    /// of the VIPs the node holds); 0 when the plan has none.
    pub(super) fn second_line_len(&self) -> u32 {
        crate::lease::second_line_len(&self.cfg.fence, self.cfg.announce_pace.held())
    }

    /// Whether an address added now, outside a renewal's refresh (a bind after the conflict
    /// probe), may get the plan's second line: the plan has one, the last attempt to set
    /// this holder's elements set all of them, and they still run. The same guarantee as a
    /// refresh's ([`Self::refresh_nft_fence`]): every VIP of the holder has a live element,
    /// which ends no later than the lease allows.
    pub(super) fn second_line_now(&self, now: Instant) -> bool {
        self.cfg.fence.second_line_secs > 0 && self.element_live(now)
    }

    /// Whether the last attempt to set this holder's nftables elements set all of them and
    /// they still run at `now`.
    pub(super) fn element_live(&self, now: Instant) -> bool {
        self.nft_set_ok && self.nft_until.is_some_and(|u| u > now)
    }

    /// The fence a VIP with `not_after` (its [`VipSpec::not_after`]) may get now, as an end
    /// rather than a number ([`Lifetime`]): at most `max_secs` (and the plan's address
    /// lifetime); under the address fence gone by the last renewal's send time plus the
    /// lease duration less [`FENCE_MARGIN`] (so [`Lifetime::secs_at`] is [`fence_grant`] of
    /// the moment the kernel takes it); never past `not_after` (DHCP lease expiry). `None`
    /// when not leading or when the lease may have lapsed for the other nodes
    /// ([`fence_lapsed`]).
    ///
    /// `second_line`: this holder's nftables elements were set by the refresh asking
    /// ([`Self::refresh_nft_fence`]), so a VIP without a not-after time may get the plan's
    /// second line ([`Self::second_line_len`], no end: the element is the fence and
    /// the address its inert second line) instead of the whole-second fence.
    pub(super) fn fence_for(
        &self,
        not_after: Option<Instant>,
        max_secs: u32,
        now: Instant,
        second_line: bool,
    ) -> Option<Lifetime> {
        let renewed = self.renewed_at?;
        let age = now.saturating_duration_since(renewed);
        if fence_lapsed(self.cfg.lease_duration, self.cfg.fence.margin, age) {
            return None;
        }
        let plan = &self.cfg.fence;
        if second_line && not_after.is_none() && plan.address_fences && plan.second_line_secs > 0 {
            return Some(Lifetime::fixed(max_secs.min(self.second_line_len())));
        }
        let max_secs = max_secs.min(self.cfg.fence.address_secs);
        if !self.cfg.fence.address_fences {
            // The nftables element fences; the address is its inert second line.
            return Some(Lifetime {
                max_secs,
                until: not_after,
            });
        }
        let end = renewed + self.cfg.lease_duration.saturating_sub(FENCE_MARGIN);
        Some(Lifetime::until(
            max_secs,
            not_after.map_or(end, |n| n.min(end)),
        ))
    }

    /// Adds or refreshes `vip` on `ifindex` for at most `lifetime` seconds (a grant of
    /// [`Self::fence_left`]), as [`Self::fence_for`] allows when the kernel takes it: the
    /// kernel layer turns the end into seconds right before the request and deletes the
    /// address again when this process was frozen or stalled in between
    /// ([`crate::net::lifetime`]; the chaos soak found this window, seeds 20261201 and
    /// 711036458). When nothing is left (the lease may have lapsed, the not-after time has
    /// come, less than a second is left), the VIP is removed until the next renewal.
    ///
    /// Returns `Ok(true)` when the VIP is in place, `Ok(false)` when it was removed.
    ///
    /// # Errors
    /// The kernel's error from the add, refresh or removal.
    pub(super) async fn add_fenced(
        &mut self,
        ifindex: u32,
        vip: Vip,
        lifetime: u32,
    ) -> Result<bool, NetError> {
        let Some(fence) = self.fence_or_remove(ifindex, vip, lifetime, false).await? else {
            return Ok(false);
        };
        let held = self
            .kernel
            .add_or_refresh(ifindex, vip, fence, self.cfg.skip_dad)
            .await?;
        self.after_add(ifindex, vip, held).await
    }

    /// The first half of [`Self::add_fenced`]: the fence `vip` gets now (the second line
    /// when `second_line` and the plan has one, [`Self::fence_for`]), or `None` after
    /// removing it when the lease may have lapsed or less than a second is left.
    ///
    /// # Errors
    /// The kernel's error from the removal.
    pub(super) async fn fence_or_remove(
        &mut self,
        ifindex: u32,
        vip: Vip,
        lifetime: u32,
        second_line: bool,
    ) -> Result<Option<Lifetime>, NetError> {
        let now = Instant::now();
        if !self.cfg.fence.address_fences && !self.element_live(now) {
            // Under the millisecond fence the address is no fence of its own: without a
            // live element (the last attempt to set them failed, or they ran out) it would
            // be unfenced, so a bind or the periodic check's repair adds nothing (found by
            // the new-user trial: with the tables gone, the check kept refreshing the fast
            // profile's 1 s addresses).
            debug!(holder = %self.name, %vip, "no live nftables element under the millisecond fence; not adding the VIP");
            self.kernel.remove(ifindex, vip).await?;
            return Ok(None);
        }
        // Only a VIP whose element this holder armed: one added to the set since the last
        // refresh has none yet.
        let second_line = second_line && self.nft_fenced.contains(&vip.addr);
        let Some(fence) = self.fence_for(self.not_after(vip), lifetime, now, second_line) else {
            debug!(holder = %self.name, %vip, "the lease may have lapsed since the grant; not adding the VIP");
            self.kernel.remove(ifindex, vip).await?;
            return Ok(None);
        };
        if fence.secs_at(now) == 0 {
            debug!(holder = %self.name, %vip, "less than a second of the lease or of the VIP's not-after time (DHCP lease expiry) is left; removing it");
            self.kernel.remove(ifindex, vip).await?;
            return Ok(None);
        }
        Ok(Some(fence))
    }

    /// The second half of [`Self::add_fenced`]: `held` seconds the kernel took; 0 removes
    /// the VIP again (returns `false`).
    ///
    /// # Errors
    /// The kernel's error from the removal.
    pub(super) async fn after_add(
        &mut self,
        ifindex: u32,
        vip: Vip,
        held: u32,
    ) -> Result<bool, NetError> {
        if held > 0 {
            return Ok(true);
        }
        self.log_late(&[vip]);
        self.kernel.remove(ifindex, vip).await?;
        Ok(false)
    }

    /// Says that the kernel took `vips`' lifetime with less than a second left, so they are
    /// removed until the next renewal: one line for one VIP, one with the count and the
    /// first three for a batch.
    pub(super) fn log_late(&self, vips: &[Vip]) {
        match vips {
            [vip] => {
                warn!(holder = %self.name, %vip, "less than a second of the lease was left when the kernel took the VIP's lifetime (renewals are late, or this process was frozen or stalled): the kernel counts lifetimes in whole seconds, so the VIP is removed until the next renewal")
            }
            _ => {
                let first: Vec<String> = vips.iter().take(3).map(Vip::to_string).collect();
                warn!(holder = %self.name, count = vips.len(), first = ?first, "less than a second of the lease was left when the kernel took these VIPs' lifetime (renewals are late, or this process was frozen or stalled): the kernel counts lifetimes in whole seconds, so they are removed until the next renewal")
            }
        }
    }

    /// The not-after time of `vip` ([`VipSpec::not_after`]), `None` when it has none.
    pub(super) fn not_after(&self, vip: Vip) -> Option<Instant> {
        self.vips
            .iter()
            .find(|s| s.vip == vip)
            .and_then(|s| s.not_after)
    }

    /// VIP `i` is past (or less than a second from) its not-after time.
    pub(super) fn expired(&self, i: usize, now: Instant) -> bool {
        self.vips
            .get(i)
            .is_some_and(|s| s.not_after.is_some() && cap_lifetime(1, s.not_after, now) == 0)
    }

    /// Every address of this holder's VIPs that `present` (the node's addresses) shows as
    /// ours, as `(ifindex, VIP)` items for [`Kernel::remove_many`]: what removing all of them
    /// takes ([`address_steps`] with no fence left).
    pub(super) fn removals(&self, present: &[AddrInfo]) -> Vec<(u32, Vip)> {
        let none: Vec<(Vip, u32)> = self.vips.iter().map(|s| (s.vip, 0)).collect();
        address_steps(&none, present, None)
            .into_iter()
            .filter_map(|step| match step {
                Step::Remove { vip, ifindex } => Some((ifindex, vip)),
                _ => None,
            })
            .collect()
    }

    /// Removes every VIP of this holder that is ours, wherever it is; true once confirmed
    /// gone. The caller acknowledges, then disarms the nftables fence
    /// ([`Self::disarm_nft_fence`]): with the addresses gone the filter has nothing left
    /// to guard, and its `nft` run (about 20 ms) would otherwise delay the lease's release.
    pub(super) async fn drop_all(&mut self) -> bool {
        self.pending_na.clear();
        self.last_repeat = None;
        self.first_repeats.clear();
        self.unwatch_all();
        for p in &mut self.probes {
            p.follow();
        }
        self.publish_conflicts();
        // Remove, then list again at once to confirm (every millisecond here delays the
        // lease's release, so a graceful hand-over); a few tries, with a pause only after a
        // failed netlink call, ride out transient errors.
        let mut failed = false;
        for attempt in 0..DROP_ATTEMPTS {
            if attempt > 0 && failed {
                tokio::time::sleep(DROP_RETRY).await;
            }
            failed = false;
            let present = match self.kernel.all_addresses().await {
                Ok(p) => p,
                Err(e) => {
                    warn!(holder = %self.name, error = %e, "cannot list addresses to drop VIPs; retrying");
                    failed = true;
                    continue;
                }
            };
            let removals = self.removals(&present);
            if removals.is_empty() {
                return true;
            }
            // One batch: one read of the node's addresses for all of them.
            let results = self.kernel.remove_many(&removals).await;
            let mut removed = Vec::new();
            for ((_, vip), r) in removals.into_iter().zip(results) {
                match r {
                    Ok(()) => removed.push(vip),
                    Err(e) => {
                        failed = true;
                        warn!(holder = %self.name, %vip, error = %e, "removing VIP failed; retrying")
                    }
                }
            }
            crate::obs::logging::each_or_summary(
                &removed,
                |vip, at_info| match at_info {
                    true => info!(holder = %self.name, %vip, "VIP removed"),
                    false => debug!(holder = %self.name, %vip, "VIP removed"),
                },
                |count| {
                    let first: Vec<String> =
                        removed.iter().take(3).map(ToString::to_string).collect();
                    info!(holder = %self.name, count, first = ?first, "VIP removed: {count} VIPs (each at debug level)");
                },
            );
        }
        error!(holder = %self.name, "could not confirm the VIPs are removed; not acknowledging, so the lease is not released and expires after the kernel fence removes them");
        false
    }
}
