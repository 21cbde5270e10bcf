//! Fail-back to a more preferred node (`svc_failback`, the Service annotation
//! `vipd.io/preferred-nodes`), never a preemption.
//!
//! A candidate that is more preferred than the holder, campaigning (its gates open), asks for
//! the lease by writing its node name into the Lease annotation
//! [`super::record::FAILBACK_REQUEST_ANNOTATION`], conditional on the Lease's
//! resourceVersion and without touching the record (holder, renew time): a conflict with the
//! holder's renewal is simply asked again at the next change seen. The request proves what
//! Node readiness cannot: that vipd runs on the preferred node and campaigns.
//!
//! The holder decides. At each renewal it judges the request ([`holder_step`]): a request
//! by a node that is not more preferred than itself (any more) is cleared by the renewal; one
//! by a more preferred node that has stood for the hold-down (as seen by the holder) makes it
//! hand over gracefully: VIPs removed, then the lease released with the request kept in it.
//! The released lease names the node it is handed to: that node takes it at once, without
//! spread or preference delay; every other candidate waits one more retry period on top of
//! its delays, so that the named node wins unless it is gone.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::spread::more_preferred;

/// What fail-back needs from the Services side: the hold-down and the Service's preferred
/// nodes as they change.
#[derive(Debug, Clone)]
pub(crate) struct FailbackLink {
    /// How long a request must stand, as seen by the holder, before it hands over
    /// (`svc_failback_holddown`).
    pub(crate) holddown: Duration,
    /// The Service's preferred nodes, in order (empty: no preference, no fail-back).
    pub(crate) preferred: watch::Receiver<Vec<String>>,
}

/// What the holder does with the fail-back request in the lease at a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HolderStep {
    /// Renew, keeping the lease's request as it is (none, or one still in its hold-down).
    Keep,
    /// Renew and clear the request: its node is not more preferred than the holder.
    Clear,
    /// Hand the lease over gracefully to this node.
    HandOver(String),
}

/// The holder `identity`'s step for `request` (the lease's request), which it first saw at
/// `seen_since` (`None`: now), with `preferred` the Service's preferred nodes. Pure.
pub(crate) fn holder_step(
    identity: &str,
    request: Option<&str>,
    preferred: &[String],
    seen_since: Option<Instant>,
    now: Instant,
    holddown: Duration,
) -> HolderStep {
    let Some(node) = request else {
        return HolderStep::Keep;
    };
    if !more_preferred(node, identity, preferred) {
        return HolderStep::Clear;
    }
    let since = seen_since.unwrap_or(now);
    if now.saturating_duration_since(since) >= holddown {
        HolderStep::HandOver(node.to_string())
    } else {
        HolderStep::Keep
    }
}

/// Whether candidate `identity` asks holder `holder` for the lease whose current request is
/// `request`: it is more preferred than the holder, and no request stands for itself or for
/// a node more preferred than itself. Pure.
pub(crate) fn should_ask(
    identity: &str,
    holder: &str,
    request: Option<&str>,
    preferred: &[String],
) -> bool {
    holder != identity
        && more_preferred(identity, holder, preferred)
        && request.is_none_or(|r| more_preferred(identity, r, preferred))
}

impl<C: super::LeaseClient> super::Elector<C> {
    /// Holder, at a renewal: judges the lease's fail-back request ([`holder_step`]) and
    /// returns the node to hand over to, when due. Remembers when this term first saw the
    /// request.
    pub(super) fn failback_due(&self, st: &mut super::Run, now: Instant) -> Option<String> {
        let link = self.failback.as_ref()?;
        let request = st
            .observed
            .as_ref()
            .and_then(|o| o.record.failback_request.clone());
        match (&request, &st.failback_seen) {
            (Some(r), Some((seen, _))) if seen == r => {}
            (Some(r), _) => st.failback_seen = Some((r.clone(), now)),
            (None, _) => st.failback_seen = None,
        }
        let step = holder_step(
            &self.identity,
            request.as_deref(),
            &link.preferred.borrow(),
            st.failback_seen.as_ref().map(|s| s.1),
            now,
            link.holddown,
        );
        match step {
            HolderStep::HandOver(node) => Some(node),
            HolderStep::Keep | HolderStep::Clear => None,
        }
    }

    /// Holder: the request its renewal writes, given the one in the lease: cleared when
    /// [`holder_step`] says so, else kept (also without fail-back: the holder does not
    /// judge what it does not use).
    pub(super) fn failback_kept(&self, request: Option<String>) -> Option<String> {
        let Some(link) = self.failback.as_ref() else {
            return request;
        };
        let clear = holder_step(
            &self.identity,
            request.as_deref(),
            &link.preferred.borrow(),
            None,
            Instant::now(),
            link.holddown,
        ) == HolderStep::Clear;
        if clear {
            tracing::debug!(lease = %self.client.describe(), ?request, "clearing a fail-back request of a node not more preferred");
            None
        } else {
            request
        }
    }

    /// Candidate, on a change of a lease held by another node: asks for a fail-back when
    /// [`should_ask`] says so and this node campaigns (its gates open). One conditional
    /// write of the annotation; a conflict (the holder renewed meanwhile) is asked again at
    /// the next change seen.
    pub(super) async fn ask_failback(&mut self, st: &mut super::Run) {
        let Some(link) = &self.failback else {
            return;
        };
        if st.leading.is_some() || !st.known || !super::closed(&self.gates.borrow()).is_empty() {
            return;
        }
        let Some(obs) = st.observed.clone() else {
            return;
        };
        let now = Instant::now();
        if st.failback_asked.is_some_and(|t| now < t + link.holddown) {
            return;
        }
        let asks = should_ask(
            &self.identity,
            &obs.record.holder,
            obs.record.failback_request.as_deref(),
            &link.preferred.borrow(),
        );
        let held = matches!(
            super::record::standing(Some(&obs), st.observed_at, now, &self.identity, &st.own),
            super::Standing::HeldByOther { .. }
        );
        if !asks || !held {
            return;
        }
        let lease = self.client.describe();
        let mut rec = obs.record.clone();
        rec.failback_request = Some(self.identity.clone());
        let r = super::attempt::timed(
            &lease,
            "update",
            self.timing.call_timeout(),
            self.client.update(&rec, &obs.resource_version),
        )
        .await;
        match r {
            Ok(new) => {
                tracing::info!(%lease, holder = %obs.record.holder, "asked the holder for a fail-back to this more preferred node");
                st.failback_asked = Some(now);
                // Not a change of the holder's: its expiry still counts from `observed_at`.
                if st
                    .observed
                    .as_ref()
                    .is_none_or(|cur| new.is_newer_than(cur))
                {
                    st.observed = Some(new);
                }
            }
            Err(e) => {
                tracing::debug!(%lease, error = %e, "fail-back request not written; asking again at the next change");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn holder_hands_over_to_a_more_preferred_node_only_after_the_holddown() {
        let p = list(&["a", "b"]);
        let t = Instant::now();
        let hd = Duration::from_secs(30);
        assert_eq!(holder_step("b", None, &p, None, t, hd), HolderStep::Keep);
        assert_eq!(
            holder_step("b", Some("a"), &p, None, t, hd),
            HolderStep::Keep
        );
        assert_eq!(
            holder_step("b", Some("a"), &p, Some(t), t + Duration::from_secs(29), hd),
            HolderStep::Keep
        );
        assert_eq!(
            holder_step("b", Some("a"), &p, Some(t), t + hd, hd),
            HolderStep::HandOver("a".into())
        );
        // Not listed holder: any listed node is more preferred.
        assert_eq!(
            holder_step("x", Some("b"), &p, Some(t), t + hd, hd),
            HolderStep::HandOver("b".into())
        );
    }

    #[test]
    fn holder_clears_requests_of_nodes_not_more_preferred() {
        let p = list(&["a", "b"]);
        let t = Instant::now();
        let hd = Duration::from_secs(1);
        assert_eq!(
            holder_step("a", Some("b"), &p, None, t, hd),
            HolderStep::Clear
        );
        assert_eq!(
            holder_step("a", Some("a"), &p, None, t, hd),
            HolderStep::Clear
        );
        assert_eq!(
            holder_step("b", Some("x"), &p, None, t, hd),
            HolderStep::Clear
        );
        assert_eq!(
            holder_step("b", Some("a"), &[], None, t, hd),
            HolderStep::Clear
        );
    }

    #[test]
    fn only_a_more_preferred_candidate_asks_and_never_over_a_better_request() {
        let p = list(&["a", "b", "c"]);
        assert!(should_ask("a", "c", None, &p));
        assert!(should_ask("b", "c", None, &p));
        assert!(!should_ask("c", "b", None, &p), "less preferred");
        assert!(!should_ask("a", "a", None, &p), "holder itself");
        assert!(!should_ask("a", "c", Some("a"), &p), "already asked");
        assert!(!should_ask("b", "c", Some("a"), &p), "a better node asked");
        assert!(should_ask("a", "c", Some("b"), &p), "a worse node asked");
        assert!(!should_ask("a", "c", None, &[]), "no preference");
    }
}
