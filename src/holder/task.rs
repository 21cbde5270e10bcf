//! The holder's loop: follows leadership, VIP set updates, claims and the periodic check.

use super::*;
use crate::lease::{FENCE_MARGIN, fence_lapsed, fence_overrun, fence_timeout};

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
        if let Some(u) = updates.as_mut() {
            self.vips = u.borrow_and_update().clone();
        }
        self.probes = vec![ProbeState::default(); self.vips.len()];
        Box::pin(self.resolve_links()).await;
        self.gates.set(GATE_STARTING, true);
        loop {
            self.publish_bound();
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
                            self.renewed_at = Some(r);
                            if first {
                                info!(holder = %self.name, term, clean, "leading: adding VIPs");
                                Box::pin(self.resolve_links()).await;
                                self.start_term(clean);
                            }
                            Box::pin(self.refresh(first)).await;
                        }
                        LeaderState::Following { .. } => {
                            if self.renewed_at.take().is_some() {
                                info!(holder = %self.name, term, "not leading: removing VIPs");
                            }
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
                    Box::pin(self.announce_all(false)).await;
                }
            }
        }
    }

    /// A term starts: watch every VIP for claims by other hosts, and probe before binding
    /// unless the lease was released cleanly by its previous holder (`clean`).
    pub(super) fn start_term(&mut self, clean: bool) {
        self.unwatch_all();
        let window = self.probing_window();
        let now = Instant::now();
        for i in 0..self.vips.len() {
            self.watch(i);
            let action = self.probes[i].lead(!clean, window, now);
            self.act(i, action);
        }
    }

    /// The lifetime a VIP may get now ([`fence_grant`] from the last renewal's send time):
    /// [`Self::fence_for`] without a not-after time, in seconds; `None` when not leading, or
    /// when the lease may have expired for the other nodes ([`fence_lapsed`]) even though
    /// the elector has not said so yet: then every VIP goes.
    pub(super) fn fence_left(&self, now: Instant) -> Option<u32> {
        self.fence_for(None, u32::MAX, now).map(|f| f.secs_at(now))
    }

    /// The fence a VIP with `not_after` (its [`VipSpec::not_after`]) may get now, as an end
    /// rather than a number ([`Lifetime`]): at most `max_secs` (and the plan's address
    /// lifetime); under the address fence gone by the last renewal's send time plus the
    /// lease duration less [`FENCE_MARGIN`] (so [`Lifetime::secs_at`] is [`fence_grant`] of
    /// the moment the kernel takes it); never past `not_after` (DHCP lease expiry). `None`
    /// when not leading or when the lease may have lapsed for the other nodes
    /// ([`fence_lapsed`]).
    pub(super) fn fence_for(
        &self,
        not_after: Option<Instant>,
        max_secs: u32,
        now: Instant,
    ) -> Option<Lifetime> {
        let renewed = self.renewed_at?;
        let age = now.saturating_duration_since(renewed);
        if fence_lapsed(self.cfg.lease_duration, self.cfg.fence.margin, age) {
            return None;
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
        let now = Instant::now();
        let Some(fence) = self.fence_for(self.not_after(vip), lifetime, now) else {
            debug!(holder = %self.name, %vip, "the lease may have lapsed since the grant; not adding the VIP");
            self.kernel.remove(ifindex, vip).await?;
            return Ok(false);
        };
        if fence.secs_at(now) == 0 {
            debug!(holder = %self.name, %vip, "less than a second of the lease or of the VIP's not-after time (DHCP lease expiry) is left; removing it");
            self.kernel.remove(ifindex, vip).await?;
            return Ok(false);
        }
        let held = self
            .kernel
            .add_or_refresh(ifindex, vip, fence, self.cfg.skip_dad)
            .await?;
        if held > 0 {
            return Ok(true);
        }
        warn!(holder = %self.name, %vip, "less than a second of the lease was left when the kernel took the VIP's lifetime (renewals are late, or this process was frozen or stalled): the kernel counts lifetimes in whole seconds, so the VIP is removed until the next renewal");
        self.kernel.remove(ifindex, vip).await?;
        Ok(false)
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

    /// Replaces the VIP set (see [`VipHolder::with_updates`]).
    pub(super) async fn set_vips(&mut self, new: Vec<VipSpec>) {
        if new == self.vips {
            return;
        }
        let leading = self.renewed_at.is_some();
        let old = std::mem::replace(&mut self.vips, new);
        // Probe state follows its address; an address new to this term was never held by
        // it and is probed like any other (see `probe`).
        let old_probes = std::mem::take(&mut self.probes);
        self.probes = self
            .vips
            .iter()
            .map(|n| {
                old.iter()
                    .position(|o| o.vip == n.vip)
                    .and_then(|j| old_probes.get(j).cloned())
                    .unwrap_or_default()
            })
            .collect();
        self.unwatch_all();
        let gone: Vec<(Vip, u32)> = old
            .iter()
            .filter(|o| !self.vips.iter().any(|n| n.vip == o.vip))
            .map(|o| (o.vip, 0))
            .collect();
        if !gone.is_empty() {
            match self.kernel.addresses(None).await {
                Ok(present) => {
                    for step in address_steps(&gone, &present, None) {
                        if let Step::Remove { vip, ifindex } = step {
                            match self.kernel.remove(ifindex, vip).await {
                                Ok(()) => {
                                    info!(holder = %self.name, %vip, "VIP no longer configured; removed")
                                }
                                Err(e) => {
                                    warn!(holder = %self.name, %vip, error = %e, "removing VIP failed")
                                }
                            }
                        }
                    }
                }
                Err(e) => {
                    if let Some(r) =
                        self.quiet
                            .observe(Quiet::ListAddresses, e.to_string(), Instant::now())
                    {
                        warn!(holder = %self.name, error = %e, "cannot list addresses{r}")
                    }
                }
            }
        }
        let addrs: Vec<IpAddr> = self.vips.iter().map(|s| s.vip.addr).collect();
        self.quiet
            .retain(|k| k.vip().is_none_or(|a| addrs.contains(&a)));
        // Where each VIP was in the old set with the same interface (`None`: new). Such
        // VIPs keep their announcement state (an IPv6 VIP still waiting for DAD stays
        // pending) and their resolved link (resolved again below; not logged again); only
        // the new ones are announced.
        let was: Vec<Option<usize>> = self
            .vips
            .iter()
            .map(|n| {
                old.iter()
                    .position(|o| o.vip == n.vip && o.interface == n.interface)
            })
            .collect();
        let old_pending = std::mem::take(&mut self.pending_na);
        self.pending_na = (0..self.vips.len())
            .filter(|i| was[*i].is_some_and(|j| old_pending.contains(&j)))
            .collect();
        let fresh: Vec<Vip> = (0..self.vips.len())
            .filter(|i| was[*i].is_none())
            .map(|i| self.vips[i].vip)
            .collect();
        let old_links = std::mem::take(&mut self.links);
        for (i, j) in was.iter().enumerate() {
            if let Some(link) = j.and_then(|j| old_links.get(&j)) {
                self.links.insert(i, link.clone());
            }
        }
        self.resolve_links().await;
        if leading {
            let window = self.probing_window();
            let now = Instant::now();
            for i in 0..self.vips.len() {
                self.watch(i);
                if self.probes[i].phase() == probe::Phase::Idle {
                    let action = self.probes[i].lead(true, window, now);
                    self.act(i, action);
                }
            }
            self.publish_conflicts();
            // Every VIP's lifetime is set again (a `not_after` may have moved), but only the
            // new ones are announced: a Service added to a group of many, or a DHCP
            // renewal, must not resend gratuitous ARP / NA for all the others.
            self.refresh_announcing(|spec| fresh.contains(&spec.vip))
                .await;
        }
    }

    /// Resolves configured or automatic interfaces; closes [`GATE_LINK`] while any cannot
    /// be found, [`GATE_CONFLICT`] while a VIP is on the node untagged.
    pub(super) async fn resolve_links(&mut self) {
        let mut missing = Vec::new();
        for (i, spec) in self.vips.iter().enumerate() {
            let found = match &spec.interface {
                Some(name) => self.kernel.link_by_name(name).await,
                None => match self.kernel.choose_interface(spec.vip.addr).await {
                    Ok(idx) => self.kernel.link_by_index(idx).await,
                    Err(e) => Err(e),
                },
            };
            match found {
                Ok(link) if link.mac == [0; 6] => {
                    missing.push(format!(
                        "{}: interface {} has no hardware address (loopback or tunnel): gratuitous ARP cannot be sent on it; set vip_interface to the Ethernet interface",
                        spec.vip, link.name
                    ));
                    self.links.remove(&i);
                }
                Ok(link) => {
                    if self.links.get(&i).map(|l| l.index) != Some(link.index) {
                        info!(holder = %self.name, vip = %spec.vip, interface = %link.name, "VIP interface");
                    }
                    self.links.insert(i, link);
                }
                Err(e) => {
                    missing.push(format!("{}: {e}", spec.vip));
                    self.links.remove(&i);
                }
            }
        }
        // Pin before any address is added (S36: no window with two ARP responders).
        let (want, configured) = self.arp_pins_wanted();
        self.arp.sync(&self.name, &want, &configured).await;
        let now = Instant::now();
        if missing.is_empty() {
            if let Some(r) = self.quiet.clear(&Quiet::Place, now) {
                info!(holder = %self.name, "VIP interfaces usable again{r}");
            }
        } else if let Some(r) = self.quiet.observe(Quiet::Place, missing.join("; "), now) {
            error!(holder = %self.name, problems = ?missing, "cannot place VIPs; not campaigning until this is fixed{r}");
        }
        self.gates.set(GATE_LINK, missing.is_empty());
        match self.kernel.addresses(None).await {
            Ok(present) => {
                let vips: Vec<Vip> = self.vips.iter().map(|s| s.vip).collect();
                let c = conflicts(&vips, &present);
                if c.is_empty() {
                    if let Some(r) = self.quiet.clear(&Quiet::Untagged, now) {
                        info!(holder = %self.name, "no VIP is configured on this node by others any more{r}");
                    }
                } else if let Some(r) = self.quiet.observe(Quiet::Untagged, format!("{c:?}"), now) {
                    error!(holder = %self.name, conflicts = ?c, "VIP already configured on this node and not added by vipd; refusing to manage it (remove it from the node or change the VIP){r}");
                }
                self.gates.set(GATE_CONFLICT, c.is_empty());
            }
            Err(e) => {
                if let Some(r) = self.quiet.observe(Quiet::ListAddresses, e.to_string(), now) {
                    warn!(holder = %self.name, error = %e, "cannot list addresses{r}")
                }
            }
        }
    }

    /// `(IPv4 VIP, resolved interface name)` pairs, and every configured IPv4 VIP.
    pub(super) fn arp_pins_wanted(
        &self,
    ) -> (Vec<(std::net::Ipv4Addr, String)>, Vec<std::net::Ipv4Addr>) {
        let mut want = Vec::new();
        let mut configured = Vec::new();
        for (i, s) in self.vips.iter().enumerate() {
            if let IpAddr::V4(v4) = s.vip.addr {
                configured.push(v4);
                if let Some(l) = self.links.get(&i) {
                    want.push((v4, l.name.clone()));
                }
            }
        }
        (want, configured)
    }

    /// The VIPs to carry while leading, with their interface: those whose interface is
    /// known and whose conflict probe let them bind.
    pub(super) fn desired(&self) -> Vec<(Vip, u32)> {
        let now = Instant::now();
        self.vips
            .iter()
            .enumerate()
            .filter(|(i, _)| self.probes.get(*i).is_some_and(ProbeState::bound))
            .filter(|(i, _)| !self.expired(*i, now))
            .filter_map(|(i, s)| self.links.get(&i).map(|l| (s.vip, l.index)))
            .collect()
    }

    /// VIPs held back by the conflict probe (probing or refused) or past their not-after
    /// time: never on the interface.
    pub(super) fn held_back(&self) -> Vec<(Vip, u32)> {
        let now = Instant::now();
        self.vips
            .iter()
            .zip(&self.probes)
            .enumerate()
            .filter(|(i, (_, p))| !p.bound() || self.expired(*i, now))
            .map(|(_, (s, _))| (s.vip, 0))
            .collect()
    }

    /// After an acquire or renew: (re-)add every VIP with the full fence lifetime, and on
    /// acquire announce at once.
    pub(super) async fn refresh(&mut self, announce: bool) {
        self.refresh_announcing(|_| announce).await;
    }

    /// [`Self::refresh`], announcing (and logging as added) only the VIPs for which
    /// `announce` is true.
    async fn refresh_announcing(&mut self, announce: impl Fn(&VipSpec) -> bool) {
        let mut added = Vec::new();
        let mut any = false;
        // Never a full fence from a stale renewal (one sent before this process was frozen,
        // acted on after it was continued): only what the lease still covers.
        let lifetime = self.fence_left(Instant::now()).unwrap_or(0);
        if lifetime == 0 {
            debug!(holder = %self.name, "renewal too old to extend the fence; not refreshing");
            return;
        }
        if !Box::pin(self.refresh_nft_fence()).await {
            debug!(holder = %self.name, "the millisecond fence could not be set; adding or refreshing no VIP");
            return;
        }
        for i in 0..self.vips.len() {
            let (Some(spec), Some(link)) = (self.vips.get(i), self.links.get(&i)) else {
                continue;
            };
            if !self.probes.get(i).is_some_and(ProbeState::bound) {
                continue;
            }
            let key = Quiet::Add(spec.vip.addr);
            let (vip, link) = (spec.vip, link.clone());
            match self.add_fenced(link.index, vip, lifetime).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    if let Some(r) = self.quiet.observe(key, e.to_string(), Instant::now()) {
                        error!(holder = %self.name, %vip, interface = %link.name, error = %e, "cannot add VIP{r}");
                    }
                    continue;
                }
            }
            if let Some(r) = self.quiet.clear(&key, Instant::now()) {
                info!(holder = %self.name, %vip, interface = %link.name, "adding the VIP works again{r}");
            }
            if self.vips.get(i).is_some_and(&announce) {
                info!(holder = %self.name, %vip, interface = %link.name, "VIP added");
                added.push(i);
                any = true;
            }
        }
        if any {
            self.pending_na.retain(|i| !added.contains(i));
            self.announce_added(&added);
        }
    }

    /// On every renewal: arms this holder's VIPs in the nftables fence
    /// ([`HolderConfig::nft_fence`]) and lets them be answered until the renewal's send
    /// time plus the fence lifetime ([`fence_timeout`] of age zero). The fence turns that end
    /// into a timeout when its `nft` run is written ([`crate::net::nft::fence::VipFence::refresh`]) and says how
    /// long the element may live; past the lease ([`fence_overrun`]: this process was
    /// frozen or stalled during the run) the element is set again with what is left, and
    /// expired (the VIPs are dropped at once) when nothing is. VIPs that left the set are
    /// disarmed. Failures are logged; the elements keep their earlier timeout.
    ///
    /// Returns whether the VIPs may be added or refreshed now: always under the
    /// whole-second address fence; under the millisecond fence ([`FencePlan`] with
    /// `address_fences` false) only when every VIP's element was just set, since an address
    /// without a live element would outlive the lease unfenced.
    pub(super) async fn refresh_nft_fence(&mut self) -> bool {
        let needed = !self.cfg.fence.address_fences;
        if !self.cfg.nft_fence.active() {
            return !needed;
        }
        let Some(sent) = self.renewed_at else {
            return !needed;
        };
        let vips: Vec<IpAddr> = self.vips.iter().map(|s| s.vip.addr).collect();
        let gone: Vec<IpAddr> = self
            .nft_fenced
            .iter()
            .filter(|v| !vips.contains(v))
            .copied()
            .collect();
        if !gone.is_empty() {
            match self.cfg.nft_fence.disarm(self.fence_owner, &gone).await {
                Ok(()) => self.nft_fenced.retain(|v| !gone.contains(v)),
                Err(e) => {
                    warn!(holder = %self.name, error = %e, "cannot disarm the nftables fence of VIPs that left the set")
                }
            }
        }
        if vips.is_empty() {
            return true;
        }
        let (fence, margin) = (self.cfg.fence.nft, self.cfg.fence.margin);
        let lease = self.cfg.lease_duration;
        // The element's end, fixed by the renewal's send time; the fence turns it into a
        // timeout when its `nft` run is written, so a freeze before that shortens it.
        let until = sent + fence_timeout(fence, lease, margin, Duration::ZERO);
        for _ in 0..FENCE_RECHECKS {
            let now = Instant::now();
            if fence_timeout(fence, lease, margin, now.saturating_duration_since(sent)).is_zero() {
                break;
            }
            let ends = match self
                .cfg
                .nft_fence
                .refresh(self.fence_owner, &vips, until)
                .await
            {
                Ok(ends) => ends,
                Err(e) => {
                    warn!(holder = %self.name, error = %e, "cannot refresh the nftables fence; its elements keep their earlier timeout");
                    return !needed;
                }
            };
            for v in &vips {
                if !self.nft_fenced.contains(v) {
                    self.nft_fenced.push(*v);
                }
            }
            let now = Instant::now();
            if ends > now && !fence_overrun(lease, margin, ends.saturating_duration_since(sent)) {
                return true;
            }
            debug!(holder = %self.name, ends_ms = ends.saturating_duration_since(sent).as_millis(), "the nftables fence element may live past the lease (the run was late) or was written expired; setting it again");
        }
        if self.nft_fenced.is_empty() {
            return !needed;
        }
        warn!(holder = %self.name, "the renewal is older than the nftables fence (this process was frozen or stalled); the VIPs are not answered until the next renewal");
        if needed {
            // Under the millisecond fence the address is no fence of its own: an `nft` run
            // frozen with this process may have committed an element after the thaw that
            // outlives the lease. The addresses go first (one netlink request each, no
            // process to start), then the run that expires the elements; the next renewal
            // adds them again (found by the new-user trial: vipd and `nft` frozen together
            // for 0.8 s in the fast profile answered next to the new holder for 20-140 ms).
            let mine: Vec<(Vip, u32)> = self.vips.iter().map(|s| (s.vip, 0)).collect();
            match self.kernel.addresses(None).await {
                Ok(present) => {
                    for step in address_steps(&mine, &present, None) {
                        if let Step::Remove { vip, ifindex } = step
                            && let Err(e) = self.kernel.remove(ifindex, vip).await
                        {
                            warn!(holder = %self.name, %vip, error = %e, "cannot remove the VIP whose nftables element may outlive the lease");
                        }
                    }
                }
                Err(e) => {
                    warn!(holder = %self.name, error = %e, "cannot list addresses to remove the VIPs whose nftables element may outlive the lease")
                }
            }
        }
        if let Err(e) = self.cfg.nft_fence.expire(&vips).await {
            warn!(holder = %self.name, error = %e, "cannot expire the nftables fence; its elements expire at their earlier timeout");
        }
        !needed
    }

    /// Stops filtering this holder's VIPs in the nftables fence (their addresses are gone).
    pub(super) async fn disarm_nft_fence(&mut self) {
        if self.nft_fenced.is_empty() {
            return;
        }
        match self
            .cfg
            .nft_fence
            .disarm(self.fence_owner, &self.nft_fenced)
            .await
        {
            Ok(()) => self.nft_fenced.clear(),
            Err(e) => {
                warn!(holder = %self.name, error = %e, "cannot disarm the nftables fence; retried at the next step-down")
            }
        }
    }

    /// Periodic check: carrier, links, repair, and the GARP repeat.
    pub(super) async fn check(&mut self) {
        let now = Instant::now();
        let renewed_at = self.renewed_at;
        self.check_links(now).await;
        let fence_left = self.fence_left(now);
        let Some(present) = self.list_for_check(now).await else {
            return;
        };
        let mut repaired = false;
        for step in self.repair_steps(&present, fence_left).await {
            repaired |= self.apply_repair(step, now).await;
        }
        if renewed_at.is_some() && (repaired || !self.pending_na.is_empty()) {
            self.announce_all(repaired).await;
        }
    }

    /// Carrier of the VIP interfaces (checked whether leading or not, to re-open the gate):
    /// re-resolves the links when one is gone, else sets [`GATE_LINK`] from the carrier.
    async fn check_links(&mut self, now: Instant) {
        let mut link_ok = true;
        let mut relink = false;
        let indexes: Vec<(usize, u32)> = self.links.iter().map(|(i, l)| (*i, l.index)).collect();
        for (i, idx) in indexes {
            match self.kernel.link_by_index(idx).await {
                Ok(l) => {
                    if l.carrier && l.up {
                        if self.no_carrier_since.remove(&idx).is_some() {
                            info!(holder = %self.name, interface = %l.name, "carrier back");
                        }
                    } else {
                        let since = *self.no_carrier_since.entry(idx).or_insert_with(|| {
                            warn!(holder = %self.name, interface = %l.name, "no carrier");
                            now
                        });
                        if now - since > self.cfg.carrier_grace {
                            link_ok = false;
                        }
                    }
                    self.links.insert(i, l);
                }
                Err(_) => relink = true,
            }
        }
        if relink || self.links.len() < self.vips.len() {
            self.resolve_links().await;
        } else {
            if !link_ok && self.gates.closed().iter().all(|g| g != GATE_LINK) {
                warn!(holder = %self.name, grace_ms = self.cfg.carrier_grace.as_millis() as u64, "no carrier for longer than the renew deadline; stepping down");
            }
            self.gates.set(GATE_LINK, link_ok);
        }
    }

    /// The node's addresses for the check; `None` (logged, rate-limited) when listing fails.
    async fn list_for_check(&mut self, now: Instant) -> Option<Vec<AddrInfo>> {
        match self.kernel.addresses(None).await {
            Ok(p) => {
                if let Some(r) = self.quiet.clear(&Quiet::ListAddresses, now) {
                    info!(holder = %self.name, "listing addresses works again{r}");
                }
                Some(p)
            }
            Err(e) => {
                if let Some(r) = self.quiet.observe(Quiet::ListAddresses, e.to_string(), now) {
                    warn!(holder = %self.name, error = %e, "cannot list addresses{r}");
                }
                None
            }
        }
    }

    /// The repairs [`address_steps`] asks for given `present`: the bound VIPs while leading, and the
    /// held-back ones' removal. An add is confirmed against a fresh dump first.
    async fn repair_steps(&self, present: &[AddrInfo], fence_left: Option<u32>) -> Vec<Step> {
        let desired = self.desired();
        let held_back = self.held_back();
        let steps_for = |present: &[AddrInfo]| {
            let mut steps = address_steps(&desired, present, fence_left);
            if fence_left.is_some() {
                // A VIP refused for a conflict whose removal failed goes now.
                steps.extend(address_steps(&held_back, present, None));
            }
            steps
        };
        let mut steps = steps_for(present);
        if steps.iter().any(|s| matches!(s, Step::Add { .. })) {
            // Confirm with a dump of our own before calling a VIP missing: a shared or
            // concurrent dump can miss entries while other holders add addresses.
            match self.kernel.addresses_fresh(None).await {
                Ok(p) => steps = steps_for(&p),
                Err(e) => debug!(holder = %self.name, error = %e, "cannot re-list addresses"),
            }
        }
        steps
    }

    /// Carries out one repair step of the check; `true` when a VIP was re-added.
    async fn apply_repair(&mut self, step: Step, now: Instant) -> bool {
        match step {
            Step::Add {
                vip,
                ifindex,
                valid_lft_secs,
            } => {
                if let Some(r) = self
                    .quiet
                    .observe(Quiet::Missing(vip.addr), String::new(), now)
                {
                    warn!(holder = %self.name, %vip, ifindex, "VIP missing while leading; re-adding{r}");
                }
                match self.add_fenced(ifindex, vip, valid_lft_secs).await {
                    Ok(false) => false,
                    Ok(true) => {
                        // A VIP missing again later is news.
                        self.quiet.clear(&Quiet::Missing(vip.addr), now);
                        if let Some(r) = self.quiet.clear(&Quiet::Add(vip.addr), now) {
                            info!(holder = %self.name, %vip, "re-adding the VIP worked{r}");
                        }
                        true
                    }
                    Err(e) => {
                        if let Some(r) =
                            self.quiet.observe(Quiet::Add(vip.addr), e.to_string(), now)
                        {
                            error!(holder = %self.name, %vip, ifindex, error = %e, "re-adding VIP failed{r}")
                        }
                        false
                    }
                }
            }
            Step::Remove { vip, ifindex } => {
                match self.kernel.remove(ifindex, vip).await {
                    Ok(()) => {
                        if let Some(r) = self.quiet.clear(&Quiet::Remove(vip.addr), now) {
                            info!(holder = %self.name, %vip, "VIP removed after failures{r}");
                        }
                    }
                    Err(e) => {
                        if let Some(r) =
                            self.quiet
                                .observe(Quiet::Remove(vip.addr), e.to_string(), now)
                        {
                            warn!(holder = %self.name, %vip, ifindex, error = %e, "removing VIP failed{r}");
                        }
                    }
                }
                false
            }
        }
    }

    /// Removes every VIP of this holder that is ours, wherever it is; true once confirmed
    /// gone. The caller acknowledges, then disarms the nftables fence
    /// ([`Self::disarm_nft_fence`]): with the addresses gone the filter has nothing left
    /// to guard, and its `nft` run (about 20 ms) would otherwise delay the lease's release.
    pub(super) async fn drop_all(&mut self) -> bool {
        self.pending_na.clear();
        self.last_garp = None;
        self.unwatch_all();
        for p in &mut self.probes {
            p.follow();
        }
        self.publish_conflicts();
        let desired: Vec<(Vip, u32)> = self.vips.iter().map(|s| (s.vip, 0)).collect();
        // Remove, then list again at once to confirm (every millisecond here delays the
        // lease's release, so a graceful hand-over); a few tries, with a pause only after a
        // failed netlink call, ride out transient errors.
        let mut failed = false;
        for attempt in 0..DROP_ATTEMPTS {
            if attempt > 0 && failed {
                tokio::time::sleep(DROP_RETRY).await;
            }
            failed = false;
            let present = match self.kernel.addresses(None).await {
                Ok(p) => p,
                Err(e) => {
                    warn!(holder = %self.name, error = %e, "cannot list addresses to drop VIPs; retrying");
                    failed = true;
                    continue;
                }
            };
            let steps = address_steps(&desired, &present, None);
            if steps.is_empty() {
                return true;
            }
            for step in steps {
                if let Step::Remove { vip, ifindex } = step {
                    match self.kernel.remove(ifindex, vip).await {
                        Ok(()) => info!(holder = %self.name, %vip, "VIP removed"),
                        Err(e) => {
                            failed = true;
                            warn!(holder = %self.name, %vip, error = %e, "removing VIP failed; retrying")
                        }
                    }
                }
            }
        }
        error!(holder = %self.name, "could not confirm the VIPs are removed; not acknowledging, so the lease is not released and expires after the kernel fence removes them");
        false
    }
}
