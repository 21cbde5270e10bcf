//! The periodic check: carrier, links and the repair of what others changed.

use super::*;

impl<K: Kernel, A: Announcer> VipHolder<K, A> {
    /// Periodic check: carrier, links, repair, and the GARP repeat.
    pub(super) async fn check(&mut self) {
        let now = Instant::now();
        let renewed_at = self.renewed_at;
        self.check_links(now).await;
        let fence_left = self.fence_left(now);
        if renewed_at.is_some() {
            self.refresh_nft_fence_if_due(now).await;
        }
        let Some(present) = self.list_for_check(now).await else {
            return;
        };
        let steps = self.repair_steps(&present, fence_left, now).await;
        self.say_missing(&steps, now);
        let mut repaired: Vec<Vip> = Vec::new();
        for step in steps {
            if let Some(vip) = self.apply_repair(step, now).await {
                repaired.push(vip);
            }
        }
        if renewed_at.is_some() && (!repaired.is_empty() || !self.pending_na.is_empty()) {
            // Repairs and IPv6 VIPs out of DAD: first announcements of those VIPs only (a
            // shard's other hundreds keep their paced repeats).
            let mut which: Vec<usize> = self.pending_na.clone();
            let repaired_idx: Vec<usize> = (0..self.vips.len())
                .filter(|i| repaired.contains(&self.vips[*i].vip) && !which.contains(i))
                .collect();
            which.extend(repaired_idx);
            self.announce_in_place(Some(&which), true).await;
        }
    }

    /// Carrier of the VIP interfaces (checked whether leading or not, to re-open the gate):
    /// re-resolves the links when one is gone, else sets [`GATE_LINK`] from the carrier.
    async fn check_links(&mut self, now: Instant) {
        let mut link_ok = true;
        let mut relink = false;
        // One query per interface, not per VIP: a shard lease's holder has hundreds of VIPs
        // on one interface.
        for idx in self.links.interfaces() {
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
                    self.links.update_interface(&l);
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
    async fn list_for_check(&mut self, now: Instant) -> Option<std::sync::Arc<Vec<AddrInfo>>> {
        match self.kernel.all_addresses().await {
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
    ///
    /// A lapsed fence (`fence_left` `None`) while the elector still says this node leads (its
    /// renewal is late: a stalled task, a frozen process) removes the VIPs, except
    /// second-line addresses ([`Self::second_line_inert`]): their elements have ended, so
    /// they are inert, and the next renewal makes them answer again without a kernel call.
    async fn repair_steps(
        &self,
        present: &[AddrInfo],
        fence_left: Option<u32>,
        now: Instant,
    ) -> Vec<Step> {
        let mut desired = self.desired();
        if fence_left.is_none() && self.second_line_inert(now) {
            // Only addresses that are their own fence (a not-after time) go.
            let own_fence: std::collections::HashSet<Vip> = self
                .vips
                .iter()
                .filter(|s| s.not_after.is_some())
                .map(|s| s.vip)
                .collect();
            desired.retain(|(vip, _)| own_fence.contains(vip));
        }
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

    /// Whether this holder's second-line addresses are inert at `now` and may stay while its
    /// fence has lapsed: the elector still says it leads (it has not stepped down: then every
    /// VIP goes), the plan gives Service VIPs the second line (the nftables element is the
    /// fence, [`crate::lease::with_second_line`]), and no element of this holder runs (each
    /// was set to end no later than the lease allows, so by a lapse they have ended; a live
    /// one would contradict that, and then the addresses go as under the address fence).
    ///
    /// Removing them instead cost the kernel milliseconds per IPv6 address next to thousands
    /// (each delete walks the routing table): in a 10 000-Service cold start a holder late by
    /// a second removed its 645 addresses and added them again at its next renewal.
    fn second_line_inert(&self, now: Instant) -> bool {
        self.renewed_at.is_some() && self.cfg.fence.second_line_secs > 0 && !self.element_live(now)
    }

    /// Warns of the VIPs `steps` re-add (found missing while leading), each once a minute
    /// at most: one line each while few, else one line with the count and the first three
    /// (each at debug level): a shard's holder whose addresses expired re-adds hundreds at
    /// once (1 263 WARN lines on one node in a 10 000-Service cold start).
    fn say_missing(&mut self, steps: &[Step], now: Instant) {
        let missing: Vec<(Vip, u32, String)> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Add { vip, ifindex, .. } => self
                    .quiet
                    .observe(Quiet::Missing(vip.addr), String::new(), now)
                    .map(|r| (*vip, *ifindex, r.to_string())),
                _ => None,
            })
            .collect();
        crate::obs::logging::each_or_summary(
            &missing,
            |(vip, ifindex, r), each| match each {
                true => {
                    warn!(holder = %self.name, %vip, ifindex, "VIP missing while leading; re-adding{r}")
                }
                false => {
                    debug!(holder = %self.name, %vip, ifindex, "VIP missing while leading; re-adding{r}")
                }
            },
            |count| {
                let first: Vec<String> = missing
                    .iter()
                    .take(3)
                    .map(|(v, ..)| v.to_string())
                    .collect();
                warn!(holder = %self.name, count, first = ?first, "VIP missing while leading; re-adding: {count} VIPs (each at debug level)");
            },
        );
    }

    /// Carries out one repair step of the check; the VIP when it was re-added.
    async fn apply_repair(&mut self, step: Step, now: Instant) -> Option<Vip> {
        match step {
            Step::Add {
                vip,
                ifindex,
                valid_lft_secs,
            } => {
                // Said by say_missing.
                match self.add_fenced(ifindex, vip, valid_lft_secs).await {
                    Ok(false) => None,
                    Ok(true) => {
                        // A VIP missing again later is news.
                        self.quiet.clear(&Quiet::Missing(vip.addr), now);
                        if let Some(r) = self.quiet.clear(&Quiet::Add(vip.addr), now) {
                            info!(holder = %self.name, %vip, "re-adding the VIP worked{r}");
                        }
                        Some(vip)
                    }
                    Err(e) => {
                        if let Some(r) =
                            self.quiet.observe(Quiet::Add(vip.addr), e.to_string(), now)
                        {
                            error!(holder = %self.name, %vip, ifindex, error = %e, "re-adding VIP failed{r}")
                        }
                        None
                    }
                }
            }
            Step::Refresh {
                vip,
                ifindex,
                valid_lft_secs,
            } => {
                self.refresh_lifetime(vip, ifindex, valid_lft_secs, now)
                    .await;
                None
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
                None
            }
        }
    }

    /// Refreshes the lifetime of `vip`, in place but about to run out (see
    /// [`REFRESH_BELOW_SECS`]: no renewal came in time), as far as the lease allows
    /// ([`Self::add_fenced`], which removes it when the lease may have lapsed).
    async fn refresh_lifetime(&mut self, vip: Vip, ifindex: u32, secs: u32, now: Instant) {
        debug!(holder = %self.name, %vip, secs, "refreshing the VIP's lifetime between renewals");
        match self.add_fenced(ifindex, vip, secs).await {
            Ok(_) => {
                if let Some(r) = self.quiet.clear(&Quiet::Add(vip.addr), now) {
                    info!(holder = %self.name, %vip, "refreshing the VIP works again{r}");
                }
            }
            Err(e) => {
                if let Some(r) = self.quiet.observe(Quiet::Add(vip.addr), e.to_string(), now) {
                    error!(holder = %self.name, %vip, ifindex, error = %e, "refreshing the VIP's lifetime failed{r}");
                }
            }
        }
    }
}
