//! One log line per API outage across the leases of a wing, not one per lease (issue 27).
//!
//! With many Service leases, an API server that stops answering made every lease's elector
//! log its own failed renewal and its own recovery: hundreds of WARN lines saying the same.
//! The electors of the Services wing share one [`ApiOutage`]; each reports its lease calls
//! to it (a call the server did not answer, [`LeaseError::unreachable`], or a call it
//! answered), and the outage is logged as a whole:
//! * one WARN when it starts, the retry period after the first failed call (the leases
//!   that renew once per retry period have all failed by then), with how many leases fail
//!   and the first error;
//! * while it lasts, one WARN per [`crate::obs::logging::REPEAT_WINDOW`] (60 s) with the
//!   leases failing and the failed calls since the start;
//! * one INFO when every lease that failed has reached the server again: how long it
//!   lasted, how many leases it affected. A blip over before the WARN was due logs one WARN
//!   instead, with its error.
//!
//! Each lease's own failed calls and recovery are logged at DEBUG. Errors the server
//! answered (a conflict, 403 Forbidden) are not an outage and are logged per lease as
//! before. The lease watch's errors, fanned out to every lease by the shared watch, are
//! logged once per distinct error and window, not once per lease.
//!
//! [`OutageLog`] is the pure decision (the clock is passed in); [`ApiOutage`] shares it
//! between the electors and writes the lines.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::LeaseError;
use crate::obs::logging::{REPEAT_WINDOW, RepeatLimiter};

impl LeaseError {
    /// Whether the call failed without an answer from the API server that settles it: a
    /// timeout, a transport failure (no HTTP status), an HTTP 5xx (e.g. etcd stalled behind
    /// a live API server) or 429 (throttled). Such failures are an API outage
    /// ([`ApiOutage`]); a conflict or a 4xx is an answer.
    pub fn unreachable(&self) -> bool {
        match self {
            LeaseError::Timeout { .. } => true,
            LeaseError::Api { status, .. } => status.is_none_or(|s| s >= 500 || s == 429),
            LeaseError::Conflict { .. } | LeaseError::AlreadyExists { .. } => false,
        }
    }
}

/// A line about an outage that [`OutageLog`] decided to log now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OutageLine {
    /// The outage started (WARN): `failing` leases failed their calls since, the first
    /// `since` ago, the first with `error`.
    Started {
        failing: usize,
        since: Duration,
        error: String,
    },
    /// The outage goes on (WARN, once per window): `failing` leases fail now, `affected`
    /// failed since it started `lasted` ago, `failed_calls` calls in all; the latest
    /// `error`.
    Continues {
        failing: usize,
        affected: usize,
        lasted: Duration,
        failed_calls: u64,
        error: String,
    },
    /// Every lease reached the server again: the outage `lasted` so long and `affected` so
    /// many leases (`failed_calls` calls). `warned`: a [`OutageLine::Started`] was logged
    /// (INFO); else nothing was yet (WARN, with the first `error`).
    Ended {
        lasted: Duration,
        affected: usize,
        failed_calls: u64,
        warned: bool,
        error: String,
    },
}

/// The outage in progress.
#[derive(Debug)]
struct Outage {
    started: Instant,
    first_error: String,
    last_error: String,
    /// Leases whose latest call failed unanswered.
    failing: BTreeSet<String>,
    /// Leases that failed since the start.
    affected: BTreeSet<String>,
    failed_calls: u64,
    /// When the latest line about it was logged (`None`: none yet).
    logged_at: Option<Instant>,
}

/// The outage state of a set of leases, and which lines to log about it. Pure: every
/// method takes the time.
#[derive(Debug)]
pub(crate) struct OutageLog {
    gather: Duration,
    window: Duration,
    current: Option<Outage>,
}

impl OutageLog {
    /// Logs the start `gather` after the first failed call (the leases' retry period: by
    /// then every lease that renews has tried), and repeats at most once per `window`.
    pub(crate) fn new(gather: Duration, window: Duration) -> Self {
        OutageLog {
            gather,
            window,
            current: None,
        }
    }

    /// A call of `lease` failed unanswered with `error` at `now`.
    pub(crate) fn unreachable(
        &mut self,
        lease: &str,
        error: &str,
        now: Instant,
    ) -> Option<OutageLine> {
        let o = self.current.get_or_insert_with(|| Outage {
            started: now,
            first_error: error.to_string(),
            last_error: String::new(),
            failing: BTreeSet::new(),
            affected: BTreeSet::new(),
            failed_calls: 0,
            logged_at: None,
        });
        o.last_error = error.to_string();
        o.failing.insert(lease.to_string());
        o.affected.insert(lease.to_string());
        o.failed_calls += 1;
        self.due(now)
    }

    /// The line due at `now` about the outage in progress, if any: the start line once
    /// [`OutageLog::gather`] has passed since the first failed call, then one per window.
    /// Asked at every failed call, and once at the start plus the gathering time (the
    /// leases may have stopped calling by then: stepped down, gates closed).
    pub(crate) fn due(&mut self, now: Instant) -> Option<OutageLine> {
        let o = self.current.as_mut()?;
        let since = now.saturating_duration_since(o.started);
        match o.logged_at {
            None if since >= self.gather => {
                o.logged_at = Some(now);
                Some(OutageLine::Started {
                    failing: o.failing.len(),
                    since,
                    error: o.first_error.clone(),
                })
            }
            Some(at) if now.saturating_duration_since(at) >= self.window => {
                o.logged_at = Some(now);
                Some(OutageLine::Continues {
                    failing: o.failing.len(),
                    affected: o.affected.len(),
                    lasted: since,
                    failed_calls: o.failed_calls,
                    error: o.last_error.clone(),
                })
            }
            _ => None,
        }
    }

    /// A call of `lease` was answered at `now` (or `lease` is no longer followed): the
    /// outage ends when no lease fails any more.
    pub(crate) fn reached(&mut self, lease: &str, now: Instant) -> Option<OutageLine> {
        let o = self.current.as_mut()?;
        o.failing.remove(lease);
        if !o.failing.is_empty() {
            return None;
        }
        let o = self.current.take()?;
        Some(OutageLine::Ended {
            lasted: now.saturating_duration_since(o.started),
            affected: o.affected.len(),
            failed_calls: o.failed_calls,
            warned: o.logged_at.is_some(),
            error: o.first_error,
        })
    }

    /// Whether an outage is in progress.
    pub(crate) fn active(&self) -> bool {
        self.current.is_some()
    }

    /// How long after the first failed call the start line is due.
    pub(crate) fn gather(&self) -> Duration {
        self.gather
    }
}

/// The outage log of a wing's leases, shared by their electors ([`super::Elector::with_outage`]).
#[derive(Clone)]
pub(crate) struct ApiOutage {
    inner: Arc<Mutex<Shared>>,
}

struct Shared {
    calls: OutageLog,
    /// The lease watch's errors, keyed by nothing (one watch), the error text the state.
    watch: RepeatLimiter<(), String>,
}

impl ApiOutage {
    /// An outage log whose start line comes `gather` (the leases' retry period) after the
    /// first failed call.
    pub(crate) fn new(gather: Duration) -> Self {
        ApiOutage {
            inner: Arc::new(Mutex::new(Shared {
                calls: OutageLog::new(gather, REPEAT_WINDOW),
                watch: RepeatLimiter::default(),
            })),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> Option<T> {
        self.inner.lock().ok().map(|mut s| f(&mut s))
    }

    /// A call of `lease` failed with `e`, which [`LeaseError::unreachable`] says is an
    /// outage: logged at DEBUG, and counted into the outage's lines.
    pub(crate) fn call_failed(&self, lease: &str, e: &LeaseError) {
        debug!(%lease, error = %e, "lease call failed (API server unreachable)");
        let now = Instant::now();
        let (line, first) = self
            .with(|s| {
                let first = !s.calls.active();
                (s.calls.unreachable(lease, &e.to_string(), now), first)
            })
            .unwrap_or((None, false));
        if let Some(line) = line {
            log(&line);
        }
        if first {
            // The start line is due even when no lease calls again by then.
            let this = self.clone();
            let gather = self.with(|s| s.calls.gather()).unwrap_or_default();
            tokio::spawn(async move {
                tokio::time::sleep(gather).await;
                if let Some(Some(line)) = this.with(|s| s.calls.due(Instant::now())) {
                    log(&line);
                }
            });
        }
    }

    /// A call of `lease` was answered, or its elector stopped.
    pub(crate) fn reached(&self, lease: &str) {
        let now = Instant::now();
        if let Some(Some(line)) = self.with(|s| s.calls.reached(lease, now)) {
            debug!(%lease, "lease calls reach the API server again");
            log(&line);
        }
    }

    /// `lease`'s watch failed with `error`: `true` when this is news worth a WARN (a new
    /// error, or a window since it was last logged, and no outage in progress, whose lines
    /// say it already); the caller logs it at DEBUG otherwise.
    pub(crate) fn watch_failed(&self, error: &str) -> bool {
        let now = Instant::now();
        self.with(|s| {
            let news = s.watch.observe((), error.to_string(), now).is_some();
            news && !s.calls.active()
        })
        .unwrap_or(true)
    }
}

fn log(line: &OutageLine) {
    match line {
        OutageLine::Started {
            failing,
            since,
            error,
        } => warn!(
            leases_failing = failing,
            first_failure_ms = since.as_millis() as u64,
            %error,
            "API server unreachable: lease calls fail; retrying each lease until it answers (per-lease lines at DEBUG)"
        ),
        OutageLine::Continues {
            failing,
            affected,
            lasted,
            failed_calls,
            error,
        } => warn!(
            leases_failing = failing,
            leases_affected = affected,
            lasted_s = lasted.as_secs(),
            failed_calls,
            %error,
            "API server still unreachable: lease calls fail"
        ),
        OutageLine::Ended {
            lasted,
            affected,
            failed_calls,
            warned: true,
            ..
        } => info!(
            lasted_ms = lasted.as_millis() as u64,
            leases_affected = affected,
            failed_calls,
            "API server reachable again: lease calls succeed"
        ),
        OutageLine::Ended {
            lasted,
            affected,
            failed_calls,
            warned: false,
            error,
        } => warn!(
            lasted_ms = lasted.as_millis() as u64,
            leases_affected = affected,
            failed_calls,
            %error,
            "lease calls failed unanswered for a moment; they succeed again"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATHER: Duration = Duration::from_secs(1);
    const W: Duration = Duration::from_secs(60);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// 50 leases renewing once a second through a 90 s outage: one start line naming all
    /// 50 and the first error, one line a minute while it lasts, one end line with the
    /// duration and the count, and nothing else.
    #[test]
    fn an_outage_of_many_leases_is_three_lines_not_one_per_lease() {
        let t0 = Instant::now();
        let mut log = OutageLog::new(GATHER, W);
        let leases: Vec<String> = (0..50).map(|i| format!("default/kubevip-svc{i}")).collect();
        let mut lines = Vec::new();
        // Each lease fails once a second, 20 ms apart, for 90 s.
        for s in 0..90u64 {
            for (i, l) in leases.iter().enumerate() {
                let now = t0 + Duration::from_secs(s) + ms(20 * i as u64);
                let err = format!("lease {l}: update timed out after 1500 ms");
                lines.extend(log.unreachable(l, &err, now));
            }
        }
        let back = t0 + Duration::from_secs(90);
        for (i, l) in leases.iter().enumerate() {
            lines.extend(log.reached(l, back + ms(i as u64)));
        }
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert_eq!(
            lines[0],
            OutageLine::Started {
                failing: 50,
                since: GATHER,
                error: "lease default/kubevip-svc0: update timed out after 1500 ms".into(),
            }
        );
        assert!(
            matches!(&lines[1], OutageLine::Continues { failing: 50, affected: 50, lasted, failed_calls, .. }
                if *lasted == GATHER + W && *failed_calls == 61 * 50 + 1),
            "{:?}",
            lines[1]
        );
        assert_eq!(
            lines[2],
            OutageLine::Ended {
                lasted: Duration::from_secs(90) + ms(49),
                affected: 50,
                failed_calls: 90 * 50,
                warned: true,
                error: "lease default/kubevip-svc0: update timed out after 1500 ms".into(),
            }
        );
        assert!(!log.active());
    }

    /// The outage lasts until every failing lease was answered: one lease answered while
    /// another still fails ends nothing; the next outage is news again.
    #[test]
    fn the_outage_ends_when_the_last_failing_lease_is_answered() {
        let t0 = Instant::now();
        let mut log = OutageLog::new(GATHER, W);
        assert_eq!(log.unreachable("a", "e", t0), None);
        assert_eq!(log.unreachable("b", "e", t0 + ms(300)), None);
        assert!(matches!(
            log.unreachable("a", "e", t0 + ms(1000)),
            Some(OutageLine::Started { failing: 2, .. })
        ));
        assert_eq!(log.reached("a", t0 + ms(1500)), None, "b still fails");
        assert!(log.active());
        assert_eq!(
            log.unreachable("a", "e", t0 + ms(1600)),
            None,
            "no second start"
        );
        assert_eq!(log.reached("a", t0 + ms(1700)), None);
        assert!(matches!(
            log.reached("b", t0 + ms(2000)),
            Some(OutageLine::Ended {
                affected: 2,
                warned: true,
                failed_calls: 4,
                ..
            })
        ));
        assert_eq!(log.reached("b", t0 + ms(2100)), None, "once");
        // A lease answered while nothing fails is not news.
        assert_eq!(log.reached("c", t0 + ms(2200)), None);
        assert_eq!(log.unreachable("c", "e2", t0 + ms(3000)), None);
        assert!(matches!(
            log.unreachable("c", "e2", t0 + ms(4000)),
            Some(OutageLine::Started { failing: 1, .. })
        ));
    }

    /// One call that failed and the next that succeeded, within the gathering time: no
    /// start line was due, so the end says it at WARN, with the error.
    #[test]
    fn a_blip_before_the_start_line_is_one_warning() {
        let t0 = Instant::now();
        let mut log = OutageLog::new(GATHER, W);
        assert_eq!(log.unreachable("a", "connection reset", t0), None);
        assert_eq!(
            log.reached("a", t0 + ms(400)),
            Some(OutageLine::Ended {
                lasted: ms(400),
                affected: 1,
                failed_calls: 1,
                warned: false,
                error: "connection reset".into(),
            })
        );
    }

    /// Leases that stop calling (stepped down, gates closed) still get the start line when
    /// it is due, and only once.
    #[test]
    fn the_start_line_is_due_without_further_calls() {
        let t0 = Instant::now();
        let mut log = OutageLog::new(GATHER, W);
        assert_eq!(log.due(t0), None, "no outage");
        assert_eq!(log.unreachable("a", "e", t0), None);
        assert_eq!(log.unreachable("b", "e", t0 + ms(200)), None);
        assert_eq!(log.due(t0 + ms(999)), None);
        assert_eq!(
            log.due(t0 + GATHER),
            Some(OutageLine::Started {
                failing: 2,
                since: GATHER,
                error: "e".into(),
            })
        );
        assert_eq!(log.due(t0 + GATHER + ms(1)), None);
        assert!(matches!(
            log.reached("a", t0 + ms(5000))
                .or(log.reached("b", t0 + ms(6000))),
            Some(OutageLine::Ended {
                warned: true,
                affected: 2,
                ..
            })
        ));
    }

    #[test]
    fn only_unanswered_calls_are_an_outage() {
        let api = |status| LeaseError::Api {
            lease: "l".into(),
            op: "update",
            status,
            message: "m".into(),
        };
        assert!(api(None).unreachable());
        assert!(api(Some(504)).unreachable());
        assert!(api(Some(429)).unreachable());
        assert!(!api(Some(403)).unreachable());
        assert!(!LeaseError::Conflict { lease: "l".into() }.unreachable());
        assert!(
            LeaseError::Timeout {
                lease: "l".into(),
                op: "get",
                timeout_ms: 1500
            }
            .unreachable()
        );
    }
}
