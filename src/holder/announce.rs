//! Announcements: gratuitous ARP / unsolicited neighbour advertisements for held VIPs.

use super::*;

impl<K: Kernel, A: Announcer> VipHolder<K, A> {
    /// Sends one gratuitous ARP / unsolicited NA for `vip` on `link` and counts it; logs
    /// "announced" at info when `loud` (else debug), a failure rate-limited, and the end
    /// of a run of failures.
    pub(super) fn announce_one(&mut self, vip: Vip, link: &LinkInfo, loud: bool) {
        // Checked right before the send: a process continued after a freeze must not tell
        // the segment it holds a VIP whose lease may already be another node's.
        if self.fence_left(Instant::now()).is_none() {
            debug!(holder = %self.name, %vip, "not announcing: the lease may have expired");
            return;
        }
        match self.announcer.announce(link, vip) {
            Ok(()) => {
                if let Some(m) = &self.metrics {
                    m.garp_sent(vip.addr);
                }
                if let Some(r) = self.quiet.clear(&Quiet::Announce(vip.addr), Instant::now()) {
                    info!(holder = %self.name, %vip, "announcing works again{r}");
                }
                if loud {
                    info!(holder = %self.name, %vip, interface = %link.name, "announced");
                } else {
                    debug!(holder = %self.name, %vip, "announced");
                }
            }
            Err(e) => {
                if let Some(r) =
                    self.quiet
                        .observe(Quiet::Announce(vip.addr), e.to_string(), Instant::now())
                {
                    warn!(holder = %self.name, %vip, interface = %link.name, error = %e, "announce failed{r}")
                }
            }
        }
    }

    /// Announces VIPs `idx` that were just added, at once: from the add's success, not from an
    /// address dump (a dump made while other holders add addresses can miss entries, and a
    /// VIP that is not announced is reached only after the clients' own neighbour
    /// solicitation retransmits, a second later). IPv6 VIPs added with DAD wait in
    /// `pending_na` until they leave the tentative state (the periodic check announces them).
    /// Each announced VIP's first repeat comes `arp_rate` later ([`Self::next_garp`]).
    pub(super) fn announce_added(&mut self, idx: &[usize]) -> usize {
        if self.fence_left(Instant::now()).is_none() {
            // This holder's view of its lease is older than the lease (it was busy with a
            // long batch): not announced now, and not forgotten either. The periodic check
            // announces them once a renewal has been seen; a step-down drops them.
            for &i in idx {
                if !self.pending_na.contains(&i) {
                    self.pending_na.push(i);
                }
            }
            return 0;
        }
        // One "announced" line each while few (crate::obs::logging::each_or_summary's rule).
        let loud = idx.len() <= crate::obs::logging::ITEM_LINES_MAX;
        let mut sent = 0usize;
        for &i in idx {
            let (Some(spec), Some(link)) = (self.vips.get(i), self.links.shared(&i)) else {
                continue;
            };
            if spec.vip.addr.is_ipv6() && !self.cfg.skip_dad {
                if !self.pending_na.contains(&i) {
                    self.pending_na.push(i);
                }
                continue;
            }
            let (vip, link) = (spec.vip, link.clone());
            self.announce_first(vip, &link, loud);
            sent += 1;
        }
        if !loud && sent > 0 {
            info!(holder = %self.name, count = sent, "announced: {sent} VIPs (each at debug level)");
        }
        sent
    }

    /// Announces `vip` for the first time in this term (or again after a repair) and queues
    /// its first repeat, `arp_rate` later; the term's first announcement starts the paced
    /// repeats' clock.
    fn announce_first(&mut self, vip: Vip, link: &LinkInfo, loud: bool) {
        self.announce_one(vip, link, loud);
        let now = Instant::now();
        self.last_repeat.get_or_insert(now);
        self.first_repeats.push_back((now + self.cfg.arp_rate, vip));
    }

    /// Announces those of VIPs `which` (`None`: every VIP) that are in place on the node and
    /// out of DAD, as the node's address dump shows them; an IPv6 VIP still tentative (or
    /// failed DAD) joins `pending_na`, announced by a later check. `first`: a first
    /// announcement (a repair, an IPv6 VIP out of DAD), logged as [`Self::announce_added`]
    /// logs and repeated `arp_rate` later; else a repeat, logged at debug level.
    pub(super) async fn announce_in_place(&mut self, which: Option<&[usize]>, first: bool) {
        let present = match self.kernel.all_addresses().await {
            Ok(p) => p,
            Err(e) => {
                // Retried at the next check; say so instead of silently skipping.
                warn!(holder = %self.name, error = %e, "cannot list addresses; announcements postponed");
                let all: Vec<usize> = (0..self.vips.len()).collect();
                for i in which.unwrap_or(&all) {
                    if !self.pending_na.contains(i) {
                        self.pending_na.push(*i);
                    }
                }
                return;
            }
        };
        let all: Vec<usize>;
        let which = match which {
            Some(w) => w,
            None => {
                all = (0..self.vips.len()).collect();
                &all
            }
        };
        // A shard's holder announces hundreds of VIPs against the node's thousands of
        // addresses.
        let ours = OursIndex::new(
            &present,
            which
                .iter()
                .filter_map(|i| self.vips.get(*i).map(|s| s.vip.addr)),
        );
        let mut ready: Vec<(Vip, Arc<LinkInfo>)> = Vec::new();
        for &i in which {
            let Some(vip) = self.vips.get(i).map(|s| s.vip) else {
                continue;
            };
            let (Some(link), Some(place)) = (self.links.shared(&i).cloned(), self.place(i)) else {
                continue;
            };
            match ours.at(place, vip.addr) {
                Some(a) if a.tentative || a.dad_failed => {
                    if !self.pending_na.contains(&i) {
                        self.pending_na.push(i);
                    }
                    continue;
                }
                Some(_) => {}
                None => continue,
            }
            self.pending_na.retain(|p| *p != i);
            ready.push((vip, link));
        }
        let loud = first && ready.len() <= crate::obs::logging::ITEM_LINES_MAX;
        for (vip, link) in &ready {
            match first {
                true => self.announce_first(*vip, link, loud),
                false => self.announce_one(*vip, link, false),
            }
        }
        if first && !loud && !ready.is_empty() {
            let count = ready.len();
            info!(holder = %self.name, count, "announced: {count} VIPs (each at debug level)");
        }
    }

    /// The repeats due at `now` ([`Self::next_garp`]): the queued first repeats that are due,
    /// and when the paced repeat is due every VIP with no first repeat still queued (such a
    /// VIP was announced less than `arp_rate` ago and keeps its own first repeat: a VIP
    /// that joined just before the paced round would otherwise get its repeat milliseconds
    /// after its announcement and the next one a whole paced interval later).
    pub(super) async fn repeat_due(&mut self, now: Instant) {
        let mut due: foldhash::HashSet<IpAddr> = foldhash::HashSet::default();
        while let Some((_, vip)) = self.first_repeats.front().filter(|(t, _)| *t <= now) {
            due.insert(vip.addr);
            self.first_repeats.pop_front();
        }
        let paced_due = self
            .last_repeat
            .is_some_and(|t| t + self.cfg.announce_pace.interval(self.cfg.arp_rate) <= now);
        let queued: foldhash::HashSet<IpAddr> = match paced_due {
            true => {
                self.last_repeat = Some(now);
                self.first_repeats.iter().map(|(_, v)| v.addr).collect()
            }
            false => foldhash::HashSet::default(),
        };
        // VIPs that left the set since are not repeated.
        let idx: Vec<usize> = self
            .vips
            .iter()
            .enumerate()
            .filter(|(_, s)| match paced_due {
                true => due.contains(&s.vip.addr) || !queued.contains(&s.vip.addr),
                false => due.contains(&s.vip.addr),
            })
            .map(|(i, _)| i)
            .collect();
        if !idx.is_empty() {
            self.announce_in_place(Some(&idx), false).await;
        }
    }

    /// When the next repeat is due, while leading: the first queued first repeat
    /// (`arp_rate` after a VIP's first announcement) or the paced repeat of every VIP (the
    /// node's paced interval after the term's first announcement or the last paced repeat:
    /// [`super::repeat_interval`], `arp_rate` up to 10 repeats a second for the node),
    /// whichever comes first.
    pub(super) fn next_garp(&self) -> Option<Instant> {
        self.renewed_at?;
        let paced = self
            .last_repeat
            .map(|t| t + self.cfg.announce_pace.interval(self.cfg.arp_rate));
        let first = self.first_repeats.front().map(|(t, _)| *t);
        match (paced, first) {
            (Some(p), Some(f)) => Some(p.min(f)),
            (p, f) => p.or(f),
        }
    }
}
