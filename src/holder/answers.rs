//! IPv6 VIPs on `lo` (`svc_ipv6_loopback`): where their addresses go, and which of them
//! vipd answers neighbour solicitations for (docs/design.md "IPv6 VIPs on lo").

use super::*;
use crate::net::route_kernel::LOOPBACK_IFINDEX;
use std::net::Ipv6Addr;

impl<K: Kernel, A: Announcer> VipHolder<K, A> {
    /// Whether `spec`'s address goes on `lo`: answers are configured
    /// ([`HolderConfig::nd_answers`]), it is IPv6, and it has no not-after time (a DHCP
    /// lease's address stays on its macvlan, whose MAC the lease belongs to).
    pub(super) fn on_lo(&self, spec: &VipSpec) -> bool {
        self.cfg.nd_answers.is_some() && spec.vip.addr.is_ipv6() && spec.not_after.is_none()
    }

    /// The interface index VIP `i`'s address is added to: `lo` ([`LOOPBACK_IFINDEX`]) for a
    /// VIP [`Self::on_lo`], else its interface's. `None` while its interface is not known.
    /// Announcements, conflict probes and answers always go out on its interface.
    pub(super) fn place(&self, i: usize) -> Option<u32> {
        let link = self.links.get(&i)?;
        let spec = self.vips.get(i)?;
        Some(match self.on_lo(spec) {
            true => LOOPBACK_IFINDEX,
            false => link.index,
        })
    }

    /// Makes the answers ([`HolderConfig::nd_answers`]) cover exactly this holder's bound
    /// VIPs on `lo` while it leads (the addresses [`Self::publish_bound`] reports; called at
    /// each turn of the holder's loop and after each chunk of a batch of adds), each on
    /// its interface with the interface's MAC (answered again when it changed), and stops
    /// those that left (a VIP removed from the set, an interface changed, a step-down).
    /// Whether an answer goes out is decided per solicitation by the [`AnswerGate`]; a failure to start answering is logged and tried again at the next
    /// call.
    pub(super) fn sync_answers(&mut self) {
        let Some(answers) = self.cfg.nd_answers.clone() else {
            return;
        };
        if let Some(synced) = &self.answers_synced {
            let same = self
                .answers_wanted()
                .map(|(key, link)| (key.0, key.1, link.mac))
                .eq(synced.iter().copied());
            if same {
                return;
            }
        }
        let wanted: std::collections::HashMap<(u32, Ipv6Addr), Arc<LinkInfo>> = self
            .answers_wanted()
            .map(|(key, link)| (key, link.clone()))
            .collect();
        let gone: Vec<(u32, Ipv6Addr)> = self
            .answered
            .keys()
            .filter(|k| !wanted.contains_key(k))
            .copied()
            .collect();
        for (ifindex, vip) in gone {
            answers.stop(ifindex, vip, &self.answer_gate);
            self.answered.remove(&(ifindex, vip));
        }
        let mut all_started = true;
        for (key, link) in wanted {
            // Answered with the interface's MAC as it is now (a changed MAC is answered again).
            if self.answered.get(&key) == Some(&link.mac) {
                continue;
            }
            let vip = IpAddr::V6(key.1);
            match answers.answer(&link, key.1, self.answer_gate.clone()) {
                Ok(()) => {
                    self.answered.insert(key, link.mac);
                    if let Some(r) = self.quiet.clear(&Quiet::Answer(vip), Instant::now()) {
                        info!(holder = %self.name, %vip, "answering neighbour solicitations for the VIP works again{r}");
                    }
                }
                Err(e) => {
                    all_started = false;
                    let now = Instant::now();
                    if let Some(r) = self.quiet.observe(Quiet::Answer(vip), e.to_string(), now) {
                        warn!(holder = %self.name, %vip, interface = %link.name, error = %e, "cannot answer neighbour solicitations for the VIP; retried at the next check{r}");
                    }
                }
            }
        }
        self.answers_synced = all_started.then(|| {
            self.answers_wanted()
                .map(|(key, link)| (key.0, key.1, link.mac))
                .collect()
        });
    }

    /// The answers this holder wants now ([`Self::sync_answers`]): `(interface index, VIP)`
    /// and the interface of each bound IPv6 VIP on `lo`, in VIP order.
    fn answers_wanted(&self) -> impl Iterator<Item = ((u32, Ipv6Addr), &Arc<LinkInfo>)> + '_ {
        self.bound_now().filter_map(|i| {
            let (spec, link) = (self.vips.get(i)?, self.links.shared(&i)?);
            match (spec.vip.addr, self.on_lo(spec)) {
                (IpAddr::V6(v6), true) => Some(((link.index, v6), link)),
                _ => None,
            }
        })
    }

    /// Stops every answer of this holder (it ends).
    pub(super) fn stop_answers(&mut self) {
        self.answer_gate.close();
        self.answers_synced = None;
        if let Some(answers) = &self.cfg.nd_answers {
            for ((ifindex, vip), _) in self.answered.drain() {
                answers.stop(ifindex, vip, &self.answer_gate);
            }
        }
    }
}
