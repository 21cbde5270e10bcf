//! Log rate limiting: one line per state change, repeats of an unchanged condition folded
//! into one line per [`REPEAT_WINDOW`] with their count, and one line when it clears; and
//! batches (a shard's hundreds of VIPs) logged item by item only while small
//! ([`each_or_summary`]).
//!
//! A caller keeps a [`RepeatLimiter`] per task (no global state, no locks) and asks it,
//! each time a condition is seen, whether to log now; the clock is passed in, so the
//! decision is pure and unit-tested without sleeping.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// Items of one batch logged one line each at info level; a larger batch gets one summary
/// line at info level and each item at debug level.
pub(crate) const ITEM_LINES_MAX: usize = 8;

/// Logs a batch: `line(item, true)` (at info level) for each of `items` when there are at
/// most [`ITEM_LINES_MAX`], else `line(item, false)` (at debug level) for each and
/// `summary(count)` once (at info level). The caller's closures choose the level from the
/// flag, so each keeps its own message and fields.
pub(crate) fn each_or_summary<T>(
    items: &[T],
    mut line: impl FnMut(&T, bool),
    summary: impl FnOnce(usize),
) {
    let each_at_info = items.len() <= ITEM_LINES_MAX;
    for item in items {
        line(item, each_at_info);
    }
    if !each_at_info {
        summary(items.len());
    }
}

/// How long an unchanged condition stays quiet after it was logged (60 s): a condition seen
/// twice a second logs one line a minute, with the count of the repeats not logged.
pub(crate) const REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// What to say about repeats when a line is logged: how many times the condition was seen
/// without being logged since the previous line, and over how long.
///
/// Displays as `""` when there were none, else as
/// `" (repeated N times in the last T s)"` (append it to the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Repeats {
    /// Sightings not logged since the previous line.
    pub count: u64,
    /// Time since the previous line (zero for a first line).
    pub over: Duration,
    /// The condition ended (a line from [`RepeatLimiter::clear`]): the count is of the
    /// condition before it ended, not of the line it is appended to.
    pub cleared: bool,
}

impl Repeats {
    /// Both counts in one, for a line that reports two conditions ending together.
    pub fn merge(self, other: Repeats) -> Repeats {
        Repeats {
            count: self.count + other.count,
            over: self.over.max(other.over),
            cleared: self.cleared || other.cleared,
        }
    }
}

impl fmt::Display for Repeats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            return Ok(());
        }
        if self.cleared {
            let what = if self.count == 1 {
                "occurrence"
            } else {
                "occurrences"
            };
            return write!(
                f,
                " (after {} more {what} not logged in the last {} s)",
                self.count,
                self.over.as_secs()
            );
        }
        write!(
            f,
            " (repeated {} times in the last {} s)",
            self.count,
            self.over.as_secs()
        )
    }
}

#[derive(Debug)]
struct Entry<S> {
    state: S,
    logged_at: Instant,
    suppressed: u64,
}

/// Rate limiter of log lines about conditions identified by a key `K` (e.g. "VIP
/// interface", or "adding VIP 192.0.2.20") with a state `S` (e.g. the error text).
///
/// * [`RepeatLimiter::observe`]: the condition holds with `state`. Logged (returns `Some`)
///   when it is new, when its state changed, or when the window passed since the last line;
///   otherwise counted.
/// * [`RepeatLimiter::clear`]: the condition no longer holds. Returns `Some` (log "cleared")
///   when it had been logged.
#[derive(Debug)]
pub(crate) struct RepeatLimiter<K, S> {
    window: Duration,
    entries: HashMap<K, Entry<S>>,
}

impl<K: Eq + Hash, S: PartialEq> Default for RepeatLimiter<K, S> {
    fn default() -> Self {
        Self::new(REPEAT_WINDOW)
    }
}

impl<K: Eq + Hash, S: PartialEq> RepeatLimiter<K, S> {
    /// A limiter that logs an unchanged condition at most once per `window`.
    pub fn new(window: Duration) -> Self {
        RepeatLimiter {
            window,
            entries: HashMap::new(),
        }
    }

    /// Condition `key` holds with `state` at `now`. `Some(repeats)`: log a line now (with
    /// `repeats` appended); `None`: stay quiet (the sighting is counted).
    pub(crate) fn observe(&mut self, key: K, state: S, now: Instant) -> Option<Repeats> {
        match self.entries.get_mut(&key) {
            Some(e)
                if e.state == state && now.saturating_duration_since(e.logged_at) < self.window =>
            {
                e.suppressed += 1;
                None
            }
            Some(e) => {
                let r = Repeats {
                    count: e.suppressed,
                    over: now.saturating_duration_since(e.logged_at),
                    cleared: false,
                };
                *e = Entry {
                    state,
                    logged_at: now,
                    suppressed: 0,
                };
                Some(r)
            }
            None => {
                self.entries.insert(
                    key,
                    Entry {
                        state,
                        logged_at: now,
                        suppressed: 0,
                    },
                );
                Some(Repeats {
                    count: 0,
                    over: Duration::ZERO,
                    cleared: false,
                })
            }
        }
    }

    /// Condition `key` no longer holds at `now`. `Some(repeats)` (the sightings not logged
    /// since its last line) when it was active: log that it cleared; `None` when it was not.
    pub fn clear(&mut self, key: &K, now: Instant) -> Option<Repeats> {
        self.entries.remove(key).map(|e| Repeats {
            count: e.suppressed,
            over: now.saturating_duration_since(e.logged_at),
            cleared: true,
        })
    }

    /// Forgets conditions whose key fails `keep`, without logging (e.g. a VIP that was
    /// removed from the configuration).
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.entries.retain(|k, _| keep(k));
    }

    /// Whether condition `key` is active (observed and not cleared).
    #[cfg(test)]
    pub(crate) fn is_active(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }
}

/// Log capture for unit tests: a subscriber writing every line (no colours) into a shared
/// list.
#[cfg(test)]
pub(crate) mod capture {
    use std::sync::{Arc, Mutex};

    /// The lines written so far (one entry per write, usually one line).
    pub(crate) type Lines = Arc<Mutex<Vec<String>>>;

    struct Sink(Lines);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(b).into_owned());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A subscriber at tracing-subscriber's default level (INFO) and the lines it writes.
    pub(crate) fn subscriber() -> (impl tracing::Subscriber + Send + Sync, Lines) {
        let lines: Lines = Arc::new(Mutex::new(Vec::new()));
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Sink(writer.clone()))
            .with_ansi(false)
            .finish();
        (subscriber, lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_batches_are_logged_item_by_item_and_large_ones_summarised() {
        for n in [0, 1, ITEM_LINES_MAX, ITEM_LINES_MAX + 1, 600] {
            let items: Vec<usize> = (0..n).collect();
            let (mut info, mut debug, mut summaries) = (0, 0, Vec::new());
            each_or_summary(
                &items,
                |_, at_info| match at_info {
                    true => info += 1,
                    false => debug += 1,
                },
                |count| summaries.push(count),
            );
            match n <= ITEM_LINES_MAX {
                true => assert_eq!((info, debug, summaries), (n, 0, vec![]), "{n}"),
                false => assert_eq!((info, debug, summaries), (0, n, vec![n]), "{n}"),
            }
        }
    }

    const W: Duration = Duration::from_secs(60);

    #[test]
    fn repeats_are_folded_into_one_line_per_window_with_their_count() {
        let t0 = Instant::now();
        let mut l: RepeatLimiter<&str, String> = RepeatLimiter::new(W);
        let first = l.observe("iface", "eth9 not found".into(), t0);
        assert_eq!(first.map(|r| r.count), Some(0));
        assert_eq!(first.map(|r| r.to_string()), Some(String::new()));
        // Twice a second for just under a minute: quiet.
        let mut logged = 0;
        for i in 1..120u64 {
            let now = t0 + Duration::from_millis(500 * i);
            if l.observe("iface", "eth9 not found".into(), now).is_some() {
                logged += 1;
            }
        }
        assert_eq!(logged, 0, "repeats within the window are not logged");
        // The window has passed: one line, with the count of the 119 not logged.
        let r = l.observe("iface", "eth9 not found".into(), t0 + W);
        assert_eq!(
            r,
            Some(Repeats {
                count: 119,
                over: W,
                cleared: false,
            })
        );
        assert_eq!(
            r.map(|r| r.to_string()).as_deref(),
            Some(" (repeated 119 times in the last 60 s)")
        );
        assert_eq!(l.observe("iface", "eth9 not found".into(), t0 + W), None);
    }

    #[test]
    fn a_changed_state_is_logged_at_once_and_a_cleared_condition_says_so_once() {
        let t0 = Instant::now();
        let mut l: RepeatLimiter<u8, &str> = RepeatLimiter::new(W);
        assert!(l.observe(1, "a", t0).is_some());
        assert!(l.observe(1, "a", t0 + Duration::from_secs(1)).is_none());
        // Another condition is independent.
        assert!(l.observe(2, "a", t0 + Duration::from_secs(1)).is_some());
        // Same key, new state: logged now, carrying the one repeat of the old state.
        assert_eq!(
            l.observe(1, "b", t0 + Duration::from_secs(2)),
            Some(Repeats {
                count: 1,
                over: Duration::from_secs(2),
                cleared: false,
            })
        );
        assert!(l.observe(1, "b", t0 + Duration::from_secs(3)).is_none());
        assert!(l.is_active(&1));
        let cleared = l.clear(&1, t0 + Duration::from_secs(4));
        assert_eq!(
            cleared,
            Some(Repeats {
                count: 1,
                over: Duration::from_secs(2),
                cleared: true,
            })
        );
        // A line saying the condition ended does not claim that line repeated.
        assert_eq!(
            cleared.map(|r| r.to_string()).as_deref(),
            Some(" (after 1 more occurrence not logged in the last 2 s)")
        );
        assert!(!l.is_active(&1));
        assert_eq!(l.clear(&1, t0 + Duration::from_secs(5)), None, "once");
        // After clearing, the condition coming back is news.
        assert!(l.observe(1, "b", t0 + Duration::from_secs(6)).is_some());
        l.retain(|k| *k != 2);
        assert!(!l.is_active(&2));
        assert_eq!(l.clear(&2, t0), None, "forgotten without a line");
    }
}
