//! Conflict detection while leading: claim watches, probes, binding and the reports of
//! what is held or refused (see [`super::acd`]).

use super::*;

impl<K: Kernel, A: Announcer> VipHolder<K, A> {
    /// The probe window in force: zero without a monitor.
    pub(super) fn probing_window(&self) -> Duration {
        if self.monitor.is_some() {
            self.cfg.probe_window
        } else {
            Duration::ZERO
        }
    }

    /// Starts the claim watch of VIP `i` (when conflict detection is on and its link known).
    pub(super) fn watch(&mut self, i: usize) {
        let (Some(monitor), Some(link), Some(spec)) =
            (&self.monitor, self.links.get(&i), self.vips.get(i))
        else {
            return;
        };
        if self.cfg.probe_window.is_zero() || self.watches.iter().any(|(w, _)| *w == i) {
            return;
        }
        let tx = self
            .claims
            .get_or_insert_with(mpsc::unbounded_channel)
            .0
            .clone();
        match monitor.watch(link, spec.vip.addr, tx) {
            Ok(id) => self.watches.push((i, id)),
            Err(e) => {
                warn!(holder = %self.name, vip = %spec.vip, error = %e, "cannot watch for address conflicts")
            }
        }
    }

    pub(super) fn unwatch_all(&mut self) {
        if let Some(monitor) = &self.monitor {
            for (_, id) in self.watches.drain(..) {
                monitor.unwatch(id);
            }
        }
        self.watches.clear();
        self.claims = None;
    }

    /// Carries out what the probe state of VIP `i` asked for, except binding (which needs
    /// the kernel: see [`VipHolder::bind`]).
    pub(super) fn act(&mut self, i: usize, action: Action) -> bool {
        let (Some(spec), Some(link)) = (self.vips.get(i), self.links.get(&i)) else {
            return false;
        };
        match action {
            Action::None => false,
            Action::Bind => true,
            Action::Probe => {
                if let Some(monitor) = &self.monitor {
                    let key = Quiet::Probe(spec.vip.addr);
                    match monitor.send_probe(link, spec.vip.addr) {
                        Ok(()) => {
                            if let Some(r) = self.quiet.clear(&key, Instant::now()) {
                                info!(holder = %self.name, vip = %spec.vip, "conflict probes sent again{r}");
                            }
                        }
                        Err(e) => {
                            if let Some(r) = self.quiet.observe(key, e.to_string(), Instant::now())
                            {
                                warn!(holder = %self.name, vip = %spec.vip, error = %e, "cannot send conflict probe; trying it again a probe window later{r}");
                            }
                            // A probe not on the wire does not count (RFC 5227 2.1.1).
                            let window = self.probing_window();
                            if let Some(p) = self.probes.get_mut(i) {
                                p.unsent(window);
                            }
                        }
                    }
                }
                false
            }
            Action::Refuse { mac, new } => {
                let other = fmt_mac(mac);
                if new {
                    warn!(holder = %self.name, vip = %spec.vip, interface = %link.name, other_mac = %other, "address conflict: another host answers for this address; not announcing it, probing again with back-off (RFC 5227)");
                    if let Some(m) = &self.metrics {
                        m.vip_conflict(spec.vip.addr);
                    }
                } else {
                    debug!(holder = %self.name, vip = %spec.vip, other_mac = %other, "address still in use by another host");
                }
                self.publish_conflicts();
                false
            }
        }
    }

    pub(super) fn publish_conflicts(&self) {
        if let Some(tx) = &self.conflicts {
            let now: Conflicts = self
                .vips
                .iter()
                .zip(&self.probes)
                .filter_map(|(spec, p)| p.refused_by().map(|mac| (spec.vip.addr, mac)))
                .collect();
            tx.send_if_modified(|cur| {
                if *cur != now {
                    *cur = now;
                    true
                } else {
                    false
                }
            });
        }
    }

    /// A claim from another host for one of our VIPs.
    pub(super) async fn on_claim(&mut self, claim: Claim) {
        if self.renewed_at.is_none() {
            return;
        }
        let rand = random_permille();
        let now = Instant::now();
        let hits: Vec<usize> = (0..self.vips.len())
            .filter(|i| self.vips[*i].vip.addr == claim.addr)
            .collect();
        for i in hits {
            let was_bound = self.probes[i].bound();
            let action = self.probes[i].claim(&claim, now, rand);
            let refused = matches!(action, Action::Refuse { .. });
            self.act(i, action);
            if refused && was_bound {
                self.unbind(i).await;
            }
        }
    }

    /// Removes VIP `i` (ours only) after a conflict.
    pub(super) async fn unbind(&mut self, i: usize) {
        let Some(spec) = self.vips.get(i) else { return };
        let vip = spec.vip;
        match self.kernel.all_addresses().await {
            Ok(present) => {
                for step in address_steps(&[(vip, 0)], &present, None) {
                    if let Step::Remove { vip, ifindex } = step
                        && let Err(e) = self.kernel.remove(ifindex, vip).await
                    {
                        warn!(holder = %self.name, %vip, error = %e, "removing conflicting VIP failed; retried at the next check");
                    }
                }
            }
            Err(e) => {
                warn!(holder = %self.name, error = %e, "cannot list addresses; conflicting VIP removed at the next check")
            }
        }
    }

    /// Earliest moment a VIP's probe state has something to do.
    pub(super) fn next_probe_deadline(&self) -> Option<Instant> {
        self.renewed_at?;
        let window = self.probing_window();
        self.probes
            .iter()
            .filter_map(|p| p.next_deadline(window))
            .min()
    }

    /// Sends due probes, binds VIPs whose probe window stayed quiet, re-probes refused ones.
    pub(super) async fn probe_tick(&mut self) {
        let now = Instant::now();
        let window = self.probing_window();
        let mut bind = Vec::new();
        for i in 0..self.probes.len() {
            let action = self.probes[i].tick(window, now);
            if self.act(i, action) {
                bind.push(i);
            }
        }
        if !bind.is_empty() {
            self.publish_conflicts();
            self.bind(&bind).await;
        }
    }

    /// Adds VIPs `idx` with the fence time left of this term (or the second line while the
    /// last refresh set every element and they still run, [`Self::second_line_now`]) and
    /// announces them at once.
    pub(super) async fn bind(&mut self, idx: &[usize]) {
        let mut added = Vec::new();
        let mut adds_took = Duration::ZERO;
        let mut announce_took = Duration::ZERO;
        let mut announced = 0;
        // One reading of the node's addresses for every chunk (each chunk's VIPs are its
        // own, untouched by the chunks before).
        let known = self.kernel.all_addresses().await.ok();
        // In chunks, the lease caught up between them ([`ADD_CHUNK`]).
        for (n, chunk) in idx.chunks(ADD_CHUNK).enumerate() {
            // A shard's hundreds of VIPs take the kernel seconds to add at thousands of
            // addresses: with the whole-second fence the last ones found less than a second
            // left and were removed again. Nothing left: the next renewal adds them with a
            // full fence.
            let Some((lifetime, second_line)) = Box::pin(self.chunk_fence(n > 0, true)).await
            else {
                break;
            };
            let mut chunk_added = Vec::new();
            let adds_started = Instant::now();
            let outcomes = self
                .add_many(
                    chunk,
                    lifetime,
                    second_line,
                    known.as_deref().map(Vec::as_slice),
                )
                .await;
            adds_took += adds_started.elapsed();
            for (i, link, vip, outcome) in outcomes {
                match outcome {
                    Ok(false) => {}
                    Ok(true) => {
                        self.quiet.clear(&Quiet::Add(vip.addr), Instant::now());
                        chunk_added.push(i);
                    }
                    Err(e) => {
                        if let Some(r) =
                            self.quiet
                                .observe(Quiet::Add(vip.addr), e.to_string(), Instant::now())
                        {
                            error!(holder = %self.name, %vip, interface = %link.name, error = %e, "cannot add VIP{r}")
                        }
                    }
                }
            }
            let announce_started = Instant::now();
            announced += self.announce_added(&chunk_added);
            announce_took += announce_started.elapsed();
            // Answered from this chunk on, not once the whole batch is in place.
            self.sync_answers();
            added.extend(chunk_added);
        }
        self.log_added(&added, "no conflict; VIP added");
        self.log_takeover(Takeover {
            vips: added.len(),
            since_leading: Duration::ZERO,
            probe_window: self.probing_window(),
            fence: None,
            adds: adds_took,
            announced,
            announce: announce_took,
        });
    }

    /// The indexes of the VIPs held now: leading, interface resolved, conflict probe passed
    /// (none while following).
    pub(super) fn bound_now(&self) -> impl Iterator<Item = usize> + '_ {
        let leading = self.renewed_at.is_some();
        (0..self.vips.len()).filter(move |i| {
            leading
                && self.links.get(i).is_some()
                && self.probes.get(*i).is_some_and(ProbeState::bound)
        })
    }

    /// Publishes the addresses held now (see [`VipHolder::with_bound_reports`]), only when
    /// they change.
    pub(super) fn publish_bound(&self) {
        let Some(tx) = &self.bound else {
            return;
        };
        let now = || {
            self.bound_now()
                .filter_map(|i| self.vips.get(i).map(|s| s.vip.addr))
        };
        // Compared in place first: called at every turn of the loop, which at rest finds
        // the same hundreds of addresses.
        if now().eq(tx.borrow().iter().copied()) {
            return;
        }
        tx.send_if_modified(|cur| {
            let now: Vec<IpAddr> = now().collect();
            if *cur != now {
                *cur = now;
                true
            } else {
                false
            }
        });
    }
}

/// A random number in 0..1000 (for back-off jitter), from the standard library's randomly
/// keyed hasher: no RNG crate needed for this.
fn random_permille() -> u32 {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    u32::try_from(r % 1000).unwrap_or(0)
}
