//! The VIP set: replacing it, resolving each VIP's link, and which VIPs are wanted
//! (or held back) now.

use super::*;

impl<K: Kernel, A: Announcer> VipHolder<K, A> {
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
            match self.kernel.all_addresses().await {
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
            if let Some(link) = j.and_then(|j| old_links.shared(&j)) {
                self.links.insert_shared(i, link.clone());
            }
        }
        self.resolve_links().await;
        if leading {
            let window = self.probing_window();
            let now = Instant::now();
            for i in 0..self.vips.len() {
                self.watch(i);
                if self.probes[i].phase() == acd::Phase::Idle {
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
        let mut changed: Vec<(Vip, String)> = Vec::new();
        // One query per configured interface name: a shard's holder resolves hundreds of
        // VIPs on one interface.
        let mut by_name: Vec<(String, Result<LinkInfo, String>)> = Vec::new();
        for (i, spec) in self.vips.iter().enumerate() {
            let found: Result<LinkInfo, String> = match &spec.interface {
                Some(name) => match by_name.iter().find(|(n, _)| n == name) {
                    Some((_, r)) => r.clone(),
                    None => {
                        let r = self
                            .kernel
                            .link_by_name(name)
                            .await
                            .map_err(|e| e.to_string());
                        by_name.push((name.clone(), r.clone()));
                        r
                    }
                },
                None => match self.kernel.choose_interface(spec.vip.addr).await {
                    Ok(idx) => self.kernel.link_by_index(idx).await,
                    Err(e) => Err(e),
                }
                .map_err(|e| e.to_string()),
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
                        changed.push((spec.vip, link.name.clone()));
                    }
                    self.links.insert(i, link);
                }
                Err(e) => {
                    missing.push(format!("{}: {e}", spec.vip));
                    self.links.remove(&i);
                }
            }
        }
        crate::obs::logging::each_or_summary(
            &changed,
            |(vip, interface), at_info| match at_info {
                true => info!(holder = %self.name, %vip, interface, "VIP interface"),
                false => debug!(holder = %self.name, %vip, interface, "VIP interface"),
            },
            |count| {
                let interfaces: std::collections::BTreeSet<&str> =
                    changed.iter().map(|(_, n)| n.as_str()).collect();
                info!(holder = %self.name, count, interfaces = ?interfaces, "VIP interface: {count} VIPs (each at debug level)");
            },
        );
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
        match self.kernel.all_addresses().await {
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
            .filter_map(|(i, s)| self.place(i).map(|place| (s.vip, place)))
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
}
