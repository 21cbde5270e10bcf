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
            let (Some(spec), Some(link)) = (self.vips.get(i), self.links.get(&i)) else {
                continue;
            };
            if spec.vip.addr.is_ipv6() && !self.cfg.skip_dad {
                if !self.pending_na.contains(&i) {
                    self.pending_na.push(i);
                }
                continue;
            }
            let (vip, link) = (spec.vip, link.clone());
            self.announce_one(vip, &link, loud);
            sent += 1;
        }
        if !loud && sent > 0 {
            info!(holder = %self.name, count = sent, "announced: {sent} VIPs (each at debug level)");
        }
        self.last_garp = Some(Instant::now());
        self.garp_repeated = false;
        sent
    }

    /// Announces every held VIP; IPv6 VIPs only once they left tentative state. `repeat`:
    /// the timer's repeat (the next one is then paced, [`super::AnnouncePace`]); else the
    /// check's, after a repair or for IPv6 VIPs that just left DAD, whose next comes at
    /// `arp_rate` like a bind's.
    pub(super) async fn announce_all(&mut self, first: bool, repeat: bool) {
        let present = match self.kernel.all_addresses().await {
            Ok(p) => p,
            Err(e) => {
                // Retried at the next check; say so instead of silently skipping.
                warn!(holder = %self.name, error = %e, "cannot list addresses; announcements postponed");
                self.pending_na = (0..self.vips.len()).collect();
                return;
            }
        };
        // A shard's holder announces hundreds of VIPs every `vip_arpRate` against the node's
        // thousands of addresses.
        let ours = OursIndex::new(&present, self.vips.iter().map(|s| s.vip.addr));
        for i in 0..self.vips.len() {
            let vip = self.vips[i].vip;
            let (Some(link), Some(place)) = (self.links.shared(&i).cloned(), self.place(i)) else {
                continue;
            };
            let here = ours.at(place, vip.addr);
            match here {
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
            self.announce_one(vip, &link, first);
        }
        self.last_garp = Some(Instant::now());
        self.garp_repeated = repeat;
    }

    /// When the next repeat of the announcements is due, while leading: `arp_rate` after a
    /// bind's announcements, and after a repeat the node's paced interval
    /// ([`super::repeat_interval`]: `arp_rate` up to 10 repeats a second for the node).
    pub(super) fn next_garp(&self) -> Option<Instant> {
        self.renewed_at?;
        let interval = match self.garp_repeated {
            true => self.cfg.announce_pace.interval(self.cfg.arp_rate),
            false => self.cfg.arp_rate,
        };
        Some(self.last_garp? + interval)
    }
}
