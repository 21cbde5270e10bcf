//! Bounded concurrency for API calls: a wing with many writes to make (the allocator's
//! patches, a group's status writes) runs them a few at a time, under the Services
//! clients' limit of calls in flight ([`crate::kube::client`]).

use std::future::Future;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

/// Runs `call(item)` for each of `items`, at most `limit` at once (a `limit` of 0 counts
/// as 1), in order of starting; their outputs in order of finishing. Each call's future is
/// made only when it starts: a shard's holder writes hundreds of Service statuses, and
/// hundreds of API call futures made up front were about 2 MB of heap per write round
/// (heaptrack, 3 000 Services).
pub async fn at_most<T, F: Future>(
    limit: usize,
    items: Vec<T>,
    call: impl Fn(T) -> F,
) -> Vec<F::Output> {
    let mut calls = items.into_iter();
    let mut running = FuturesUnordered::new();
    let mut done = Vec::new();
    loop {
        while running.len() < limit.max(1) {
            let Some(item) = calls.next() else { break };
            running.push(call(item));
        }
        let Some(finished) = running.next().await else {
            break;
        };
        done.push(finished);
    }
    done
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Each call's future is made only when it starts: never more than `limit` exist at
    /// once, whatever the number of items, and every item runs once.
    #[tokio::test]
    async fn calls_are_made_when_they_start_never_more_than_the_limit() {
        let made = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let out = at_most(3, (0..100).collect(), |i: u32| {
            let alive = made.fetch_add(1, Ordering::SeqCst) + 1 - done.load(Ordering::SeqCst);
            most.fetch_max(alive, Ordering::SeqCst);
            let done = &done;
            async move {
                tokio::task::yield_now().await;
                done.fetch_add(1, Ordering::SeqCst);
                i
            }
        })
        .await;
        assert_eq!(made.load(Ordering::SeqCst), 100);
        assert_eq!(most.load(Ordering::SeqCst), 3, "futures alive at once");
        let mut out = out;
        out.sort_unstable();
        assert_eq!(out, (0..100).collect::<Vec<_>>());
    }
}
