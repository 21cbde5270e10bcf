//! Refreshing the held VIPs after an acquire or renew, and arming or disarming the
//! nftables fence that guards them.

use super::*;
use crate::lease::{fence_overrun, fence_run_expected, fence_timeout, second_line_fresh};

/// One VIP of a refresh: its index, the interface index its address goes on
/// ([`VipHolder::place`]), its interface, address and fence (`None`: removed; `Err`: the
/// removal failed).
type Refresh = (
    usize,
    u32,
    Arc<LinkInfo>,
    Vip,
    Result<Option<Lifetime>, NetError>,
);

/// One VIP's outcome in [`VipHolder::add_many`]: its index, interface, address and whether
/// it is held now.
pub(super) type Added = (usize, Arc<LinkInfo>, Vip, Result<bool, NetError>);

/// What [`VipHolder::refresh_nft_fence`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NftRefresh {
    /// The VIPs may be added or refreshed now: always under the address fence; under the
    /// millisecond fence only when every element was just set.
    pub(super) may_add: bool,
    /// Every VIP's element was just set, to end no later than the lease allows: the
    /// addresses may get the plan's second line ([`FencePlan::second_line_secs`]).
    pub(super) set: bool,
}

impl NftRefresh {
    /// Nothing was set; the addresses may be added when `may_add`.
    fn unset(may_add: bool) -> Self {
        Self {
            may_add,
            set: false,
        }
    }
}

impl<K: Kernel, A: Announcer> VipHolder<K, A> {
    /// After an acquire or renew: (re-)add every VIP with the full fence lifetime, and on
    /// acquire announce at once.
    pub(super) async fn refresh(&mut self, announce: bool) {
        self.refresh_announcing(|_| announce).await;
    }

    /// [`Self::refresh`], announcing (and logging as added) only the VIPs for which
    /// `announce` is true.
    pub(super) async fn refresh_announcing(&mut self, announce: impl Fn(&VipSpec) -> bool) {
        let mut added = Vec::new();
        // Never a full fence from a stale renewal (one sent before this process was frozen,
        // acted on after it was continued): only what the lease still covers.
        let lifetime = self.fence_left(Instant::now()).unwrap_or(0);
        if lifetime == 0 {
            debug!(holder = %self.name, "renewal too old to extend the fence; not refreshing");
            return;
        }
        let fence_started = Instant::now();
        let nft = Box::pin(self.refresh_nft_fence()).await;
        let fence_took = fence_started.elapsed();
        if !nft.may_add {
            debug!(holder = %self.name, "the nftables fence could not be set (millisecond fence) or was just expired (second line); adding or refreshing no VIP");
            return;
        }
        if !nft.set {
            // The address fence alone (the elements could not be set): answers for VIPs on
            // `lo` end with it, as the addresses' lifetimes do.
            self.answer_gate
                .open_until((Instant::now() + Duration::from_secs(u64::from(lifetime))).into_std());
        }
        let bound: Vec<usize> = (0..self.vips.len())
            .filter(|i| self.probes.get(*i).is_some_and(ProbeState::bound))
            .collect();
        // The second line: with every element just set, addresses get the long lifetime,
        // and those with more than its refresh point left are not touched (no kernel call).
        let second_line = nft.set && self.cfg.fence.second_line_secs > 0;
        // The split's reading of the node's addresses serves every chunk; without one, no
        // read here: a refresh's VIPs are mostly in place, and for those the kernel reads
        // the addresses afresh anyway ([`Kernel::add_or_refresh_many`]).
        let (due, fresh, known) = match second_line {
            true => self.split_fresh(&bound).await,
            false => (bound, Vec::new(), None),
        };
        // Second-line addresses with more than the refresh point left: announced (when asked),
        // untouched.
        let mut chunk_added: Vec<usize> = fresh
            .into_iter()
            .filter(|i| self.vips.get(*i).is_some_and(&announce))
            .collect();
        let mut adds_took = Duration::ZERO;
        let mut announce_took = Duration::ZERO;
        let mut announced = 0;
        // In chunks, the lease caught up between them ([`ADD_CHUNK`]); the first chunk
        // always runs (its announcements include the untouched addresses').
        let chunks: Vec<&[usize]> = match due.is_empty() {
            true => vec![&[]],
            false => due.chunks(ADD_CHUNK).collect(),
        };
        for (n, chunk) in chunks.into_iter().enumerate() {
            let (lifetime, second_line) = match n {
                0 => (
                    match second_line {
                        true => self.second_line_len(),
                        false => lifetime,
                    },
                    second_line,
                ),
                _ => match Box::pin(self.chunk_fence(true, second_line)).await {
                    Some(fence) => fence,
                    None => break,
                },
            };
            let adds_started = Instant::now();
            let outcomes = match chunk.is_empty() {
                true => Vec::new(),
                false => {
                    self.add_many(
                        chunk,
                        lifetime,
                        second_line,
                        known.as_deref().map(Vec::as_slice),
                    )
                    .await
                }
            };
            adds_took += adds_started.elapsed();
            for (i, link, vip, outcome) in outcomes {
                let key = Quiet::Add(vip.addr);
                match outcome {
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
                    chunk_added.push(i);
                }
            }
            if !chunk_added.is_empty() {
                self.pending_na.retain(|i| !chunk_added.contains(i));
                let announce_started = Instant::now();
                announced += self.announce_added(&chunk_added);
                announce_took += announce_started.elapsed();
                // Answered from this chunk on, not once the whole batch is in place.
                self.sync_answers();
                added.append(&mut chunk_added);
            }
        }
        self.log_added(&added, "VIP added");
        self.log_takeover(Takeover {
            vips: added.len(),
            since_leading: Duration::ZERO,
            probe_window: Duration::ZERO,
            fence: Some(fence_took),
            adds: adds_took,
            announced,
            announce: announce_took,
        });
    }

    /// The lifetime cap (seconds) and second-line flag for the next chunk of a batch of adds
    /// ([`ADD_CHUNK`]): after the lease caught up when `catch_up` ([`Self::catch_up`], between
    /// chunks), the fence left now, and the second line's lifetime when `second_line` allows
    /// it and the elements still run ([`Self::second_line_now`]). `None` ends the batch: the
    /// elector no longer leads this term, or nothing of the lease is left.
    pub(super) async fn chunk_fence(
        &mut self,
        catch_up: bool,
        second_line: bool,
    ) -> Option<(u32, bool)> {
        if catch_up && !Box::pin(self.catch_up()).await {
            return None;
        }
        let now = Instant::now();
        let left = self.fence_left(now).filter(|l| *l > 0)?;
        Some(match second_line && self.second_line_now(now) {
            true => (self.second_line_len(), true),
            false => (left, false),
        })
    }

    /// Logs `t` (its time since leading filled in here) at info level when it is the
    /// current term's first batch of VIPs in place, once a term ([`Takeover`]).
    pub(super) fn log_takeover(&mut self, t: Takeover) {
        if t.vips == 0 {
            return;
        }
        let Some(started) = self.term_started.take() else {
            return;
        };
        self.takeover_mark = None;
        let t = Takeover {
            since_leading: started.elapsed(),
            ..t
        };
        info!(holder = %self.name, vips = t.vips, since_leading_ms = t.since_leading.as_millis() as u64, "takeover: {t}");
    }

    /// Adds or refreshes VIPs `idx` (those with an interface) with at most `lifetime`
    /// seconds of fence ([`Self::fence_or_remove`] first, for each), in one batch for the
    /// kernel ([`Kernel::add_or_refresh_many`] with `known`, the node's addresses as the
    /// caller read them for its whole batch; `None`: one read for this call. One read per
    /// VIP made binding or refreshing a shard's hundreds of VIPs quadratic, and stalled the
    /// process past its renew deadline; one per chunk read 3 000 addresses ten times for a
    /// shard's 620). Returns each VIP's
    /// outcome in `idx` order: `Ok(true)` held now, `Ok(false)` not added (the lease may
    /// have lapsed, less than a second was left, or the kernel took less than a second:
    /// [`Self::after_add`]), `Err` the kernel's error.
    ///
    /// `second_line`: every VIP's nftables element was just set ([`Self::fence_for`]).
    pub(super) async fn add_many(
        &mut self,
        idx: &[usize],
        lifetime: u32,
        second_line: bool,
        known: Option<&[AddrInfo]>,
    ) -> Vec<Added> {
        let mut batch: Vec<Refresh> = Vec::with_capacity(idx.len());
        for &i in idx {
            let (Some(spec), Some(link)) = (self.vips.get(i), self.links.shared(&i)) else {
                continue;
            };
            let (vip, link) = (spec.vip, link.clone());
            let Some(place) = self.place(i) else {
                continue;
            };
            let fence = self
                .fence_or_remove(place, vip, lifetime, second_line)
                .await;
            batch.push((i, place, link, vip, fence));
        }
        let items: Vec<(u32, Vip, Lifetime)> = batch
            .iter()
            .filter_map(|(_, place, _, vip, f)| match f {
                Ok(Some(fence)) => Some((*place, *vip, *fence)),
                _ => None,
            })
            .collect();
        // Nothing to add (every VIP still probing): no read of the node's addresses.
        let held = match items.is_empty() {
            true => Vec::new(),
            false => {
                self.kernel
                    .add_or_refresh_many(&items, self.cfg.skip_dad, known)
                    .await
            }
        };
        let mut held = held.into_iter();
        let mut out = Vec::with_capacity(batch.len());
        // VIPs the kernel took with less than a second (`after_add`'s case), removed in one
        // batch below: one by one, each removal read the node's addresses again.
        let mut late: Vec<usize> = Vec::new();
        let mut places = Vec::with_capacity(batch.len());
        for (i, place, link, vip, fence) in batch {
            places.push(place);
            let outcome = match fence {
                Ok(None) => Ok(false),
                Err(e) => Err(e),
                Ok(Some(_)) => match held.next() {
                    Some(Ok(0)) => {
                        late.push(out.len());
                        Ok(false)
                    }
                    Some(Ok(_)) => Ok(true),
                    Some(Err(e)) => Err(e),
                    None => Ok(false),
                },
            };
            out.push((i, link, vip, outcome));
        }
        if !late.is_empty() {
            let items: Vec<(u32, Vip)> = late
                .iter()
                .filter_map(|k| Some((*places.get(*k)?, out.get(*k)?.2)))
                .collect();
            let vips: Vec<Vip> = items.iter().map(|(_, v)| *v).collect();
            self.log_late(&vips);
            let removed = self.kernel.remove_many(&items).await;
            for (k, r) in late.iter().zip(removed) {
                if let (Some(entry), Err(e)) = (out.get_mut(*k), r) {
                    entry.3 = Err(e);
                }
            }
        }
        out
    }

    /// Splits the VIPs `idx` into those to add or refresh now and those whose address is in
    /// place on their interface, ours, with more than the second line's refresh point left
    /// ([`second_line_fresh`]; VIPs with a not-after time, DHCP leases, are always due:
    /// they keep the whole-second fence). Reads the node's addresses once (a holder of
    /// Services shares the node's dump with its other holders, kept until an address changes
    /// and at most 30 s, its lifetimes aged: over-reported by at most a second,
    /// [`crate::net::cache`]); when that fails every VIP is due. Also returns that reading
    /// (for [`Self::add_many`]).
    async fn split_fresh(
        &self,
        idx: &[usize],
    ) -> (Vec<usize>, Vec<usize>, Option<Arc<Vec<AddrInfo>>>) {
        let Ok(present) = self.kernel.all_addresses().await else {
            return (idx.to_vec(), Vec::new(), None);
        };
        let wanted = idx
            .iter()
            .filter_map(|&i| self.vips.get(i))
            .map(|s| s.vip.addr);
        let ours = OursIndex::new(&present, wanted);
        let (due, fresh) = idx.iter().copied().partition(|&i| {
            let (Some(spec), Some(place)) = (self.vips.get(i), self.place(i)) else {
                return true;
            };
            spec.not_after.is_some()
                || !ours.at(place, spec.vip.addr).is_some_and(|a| {
                    a.vip.prefix == spec.vip.prefix
                        && second_line_fresh(&self.cfg.fence, a.valid_lft_secs)
                })
        });
        (due, fresh, Some(present))
    }

    /// Logs the VIPs `idx` just added with `message`, one line each while few
    /// ([`crate::obs::logging::each_or_summary`]: a shard's holder adds hundreds at once).
    pub(super) fn log_added(&self, idx: &[usize], message: &str) {
        let vips: Vec<(Vip, &str)> = idx
            .iter()
            .filter_map(|i| Some((self.vips.get(*i)?.vip, self.links.get(i)?.name.as_str())))
            .collect();
        crate::obs::logging::each_or_summary(
            &vips,
            |(vip, interface), at_info| match at_info {
                true => info!(holder = %self.name, %vip, interface, "{message}"),
                false => debug!(holder = %self.name, %vip, interface, "{message}"),
            },
            |count| {
                let first: Vec<String> = vips.iter().take(3).map(|(v, _)| v.to_string()).collect();
                info!(holder = %self.name, count, first = ?first, "{message}: {count} VIPs (each at debug level)");
            },
        );
    }

    /// On every renewal, and between renewals when the elements run out
    /// ([`Self::refresh_nft_fence_if_due`]): arms this holder's VIPs in the nftables fence
    /// ([`HolderConfig::nft_fence`]) and lets them be answered for the fence lifetime from
    /// now, never past the renewal's send time plus the lease less the margin
    /// ([`fence_timeout`]). The fence turns that end
    /// into a timeout when its `nft` run is written ([`crate::net::nft::fence::VipFence::refresh`]) and says how
    /// long the element may live; past the lease ([`fence_overrun`]: this process was
    /// frozen or stalled during the run) the element is set again with what is left, and
    /// expired (the VIPs are dropped at once) when nothing is. VIPs that left the set are
    /// disarmed. Failures are logged (once, then once a minute while they last); the elements
    /// keep their earlier timeout.
    ///
    /// Returns whether the VIPs may be added or refreshed now: always under the
    /// whole-second address fence; under the millisecond fence ([`FencePlan`] with
    /// `address_fences` false) only when every VIP's element was just set, since an address
    /// without a live element would outlive the lease unfenced.
    pub(super) async fn refresh_nft_fence(&mut self) -> NftRefresh {
        let needed = !self.cfg.fence.address_fences;
        if !self.cfg.nft_fence.active() {
            return NftRefresh::unset(!needed);
        }
        let Some(sent) = self.renewed_at else {
            return NftRefresh::unset(!needed);
        };
        let vips: Vec<IpAddr> = self.vips.iter().map(|s| s.vip.addr).collect();
        let wanted: std::collections::HashSet<&IpAddr> = vips.iter().collect();
        let gone: Vec<IpAddr> = self
            .nft_fenced
            .iter()
            .filter(|v| !wanted.contains(v))
            .copied()
            .collect();
        let gone = self.addressless(gone).await;
        if !gone.is_empty() {
            match self.cfg.nft_fence.disarm(self.fence_owner, &gone).await {
                Ok(()) => {
                    for v in &gone {
                        self.nft_fenced.remove(v);
                    }
                }
                Err(e) => {
                    warn!(holder = %self.name, error = %e, "cannot disarm the nftables fence of VIPs that left the set")
                }
            }
        }
        if vips.is_empty() {
            return NftRefresh::unset(true);
        }
        let (fence, margin) = (self.cfg.fence.nft, self.cfg.fence.margin);
        let lease = self.cfg.lease_duration;
        for _ in 0..FENCE_RECHECKS {
            // The element's end: the fence lifetime from now, never past the renewal's send
            // time plus the lease less the margin; the fence turns it into a timeout right
            // before its transaction is sent, so a freeze before that shortens it.
            let now = Instant::now();
            let age = now.saturating_duration_since(sent);
            let left = fence_timeout(fence, lease, margin, age, self.nft_run_expected);
            if left.is_zero() {
                break;
            }
            let until = now + left;
            let ends = match self
                .cfg
                .nft_fence
                .refresh(self.fence_owner, &vips, until)
                .await
            {
                Ok(ends) => ends,
                Err(e) => {
                    // Once when it starts or changes, then once a minute (every renewal
                    // and check of every holder would say it).
                    // Keyed by the kernel's answer alone: the command text carries the
                    // timeouts, which differ at every run.
                    let kind = match &e {
                        crate::net::nft::fence::FenceError::Change { detail, .. } => detail.clone(),
                        other => other.to_string(),
                    };
                    if let Some(r) = self.quiet.observe(Quiet::NftFence, kind, Instant::now()) {
                        warn!(holder = %self.name, error = %e, "cannot refresh the nftables fence: elements set earlier keep their timeout, and the addresses fall back to the whole-second fence (sub-second timings: no address is added or refreshed){r}");
                    }
                    self.nft_set_ok = false;
                    return NftRefresh::unset(!needed);
                }
            };
            if let Some(r) = self.quiet.clear(&Quiet::NftFence, Instant::now()) {
                info!(holder = %self.name, "refreshing the nftables fence works again{r}");
            }
            // The run's own time: the fence answers its end plus the timeout it wrote, and
            // the timeout was what was left of `until` when it wrote it.
            self.nft_run_expected = fence_run_expected(
                self.nft_run_expected,
                ends.saturating_duration_since(until),
                lease,
                margin,
            );
            self.nft_fenced.extend(vips.iter().copied());
            let now = Instant::now();
            if ends > now && !fence_overrun(lease, margin, ends.saturating_duration_since(sent)) {
                self.nft_until = Some(until);
                self.answer_gate.open_until(until.into_std());
                self.nft_set_ok = true;
                return NftRefresh {
                    may_add: true,
                    set: true,
                };
            }
            debug!(holder = %self.name, ends_ms = ends.saturating_duration_since(sent).as_millis(), "the nftables fence element may live past the lease (the run was late) or was written expired; setting it again");
        }
        self.nft_set_ok = false;
        // Answers end with the elements (the addresses' second line is inert).
        self.answer_gate.close();
        if self.nft_fenced.is_empty() {
            return NftRefresh::unset(!needed);
        }
        warn!(holder = %self.name, "the renewal is older than the nftables fence (this process was frozen or stalled, or the fence's transaction was slow); the VIPs are not answered until the next renewal");
        if self.cfg.fence.second_line_secs > 0 {
            // Second-line addresses (no end of their own): the run that expires every element
            // of the holder goes first, one transaction; once it has, the VIPs are filtered
            // and their addresses inert, so they stay, and nothing is added or refreshed
            // until the next renewal sets the elements again, which needs no address call
            // (as the periodic check's `second_line_inert`). Removing them first, one delete
            // each, and adding them back with the whole-second fence cost a shard's holder
            // 1 200 IPv6 address calls next to thousands of addresses: in a 10 000-Service
            // power-off 274 of a shard's 593 addresses were still not back 17 s later.
            // Only when the elements cannot be expired do the addresses go.
            return match self.cfg.nft_fence.expire(&vips).await {
                Ok(()) => NftRefresh::unset(false),
                Err(e) => {
                    warn!(holder = %self.name, error = %e, "cannot expire the nftables fence; removing the VIPs whose element may outlive the lease");
                    self.remove_outliving().await;
                    NftRefresh::unset(true)
                }
            };
        }
        if needed {
            // Under the millisecond fence the address is no fence of its own: a transaction
            // that took long (or, before vipd sent them itself, an `nft` run frozen with this
            // process) may have committed an element that outlives the lease. The addresses
            // go first (one batch), then the run that expires the elements; the next renewal
            // adds them again (found by the new-user trial: vipd and `nft` frozen together
            // for 0.8 s in the fast profile answered next to the new holder for 20-140 ms).
            self.remove_outliving().await;
        }
        if let Err(e) = self.cfg.nft_fence.expire(&vips).await {
            warn!(holder = %self.name, error = %e, "cannot expire the nftables fence; its elements expire at their earlier timeout");
        }
        NftRefresh::unset(!needed)
    }

    /// The periodic check's part of the nftables fence: while leading and the lease still
    /// covers the VIPs, sets the elements again ([`Self::refresh_nft_fence`]) when they end
    /// within the check interval plus [`NFT_REFRESH_SLACK`] (no renewal came in time).
    pub(super) async fn refresh_nft_fence_if_due(&mut self, now: Instant) {
        if !self.cfg.nft_fence.active() || self.nft_fenced.is_empty() {
            return;
        }
        let due = self
            .nft_until
            .is_some_and(|u| u <= now + self.cfg.check_interval + NFT_REFRESH_SLACK);
        if due && self.fence_left(now).is_some() {
            debug!(holder = %self.name, "refreshing the nftables fence between renewals");
            Box::pin(self.refresh_nft_fence()).await;
        }
    }

    /// Those of `vips` (armed by this holder, no longer in its set) with no address of
    /// vipd's on the node: only their arming may be taken back. One whose removal failed
    /// when it left the set (`set_vips`; netlink EBUSY under load) keeps its address with
    /// what is left of its second line, up to an hour ([`crate::lease::second_line_len`]):
    /// disarmed, it would answer with no element, next to the node carrying the VIP now.
    /// Armed but not named by this holder's refreshes, the fence keeps it filtered (on
    /// another holder's element of this node that armed it, or dropped) until the address
    /// is gone (removed, or its lifetime ran out); a failed read of the addresses keeps
    /// every arming.
    async fn addressless(&self, vips: Vec<IpAddr>) -> Vec<IpAddr> {
        if vips.is_empty() {
            return vips;
        }
        let Ok(present) = self.kernel.all_addresses().await else {
            return Vec::new();
        };
        let ours = OursIndex::new(&present, vips.iter().copied());
        vips.iter()
            .copied()
            .filter(|v| ours.copies(*v).is_empty())
            .collect()
    }

    /// Removes every address of this holder's VIPs at once, in one batch for the kernel:
    /// their nftables elements may outlive the lease ([`Self::refresh_nft_fence`]).
    async fn remove_outliving(&mut self) {
        let present = match self.kernel.all_addresses().await {
            Ok(p) => p,
            Err(e) => {
                warn!(holder = %self.name, error = %e, "cannot list addresses to remove the VIPs whose nftables element may outlive the lease");
                return;
            }
        };
        let items = self.removals(&present);
        for ((_, vip), r) in items.iter().zip(self.kernel.remove_many(&items).await) {
            if let Err(e) = r {
                warn!(holder = %self.name, %vip, error = %e, "cannot remove the VIP whose nftables element may outlive the lease");
            }
        }
    }

    /// Stops filtering this holder's VIPs in the nftables fence (their addresses are gone;
    /// one that left the set earlier and whose address is still on the node stays armed,
    /// [`Self::addressless`]).
    pub(super) async fn disarm_nft_fence(&mut self) {
        if self.nft_fenced.is_empty() {
            return;
        }
        let in_set: foldhash::HashSet<IpAddr> = self.vips.iter().map(|s| s.vip.addr).collect();
        let (set, left): (Vec<IpAddr>, Vec<IpAddr>) =
            self.nft_fenced.iter().partition(|v| in_set.contains(*v));
        let mut vips = set;
        vips.extend(self.addressless(left).await);
        if vips.is_empty() {
            return;
        }
        match self.cfg.nft_fence.disarm(self.fence_owner, &vips).await {
            Ok(()) => {
                for v in &vips {
                    self.nft_fenced.remove(v);
                }
                self.nft_until = None;
            }
            Err(e) => {
                warn!(holder = %self.name, error = %e, "cannot disarm the nftables fence; retried at the next step-down")
            }
        }
    }
}
