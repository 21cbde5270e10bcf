//! Bounded concurrency for API calls: a wing with many writes to make (the allocator's
//! patches, a group's status writes) runs them a few at a time, under the Services
//! clients' limit of calls in flight ([`crate::kube::client`]).

use std::future::Future;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

/// Runs `calls`, at most `limit` at once (a `limit` of 0 counts as 1), in order of
/// starting; their outputs in order of finishing.
pub async fn at_most<F: Future>(limit: usize, calls: Vec<F>) -> Vec<F::Output> {
    let mut calls = calls.into_iter();
    let mut running = FuturesUnordered::new();
    let mut done = Vec::new();
    loop {
        while running.len() < limit.max(1) {
            let Some(call) = calls.next() else { break };
            running.push(call);
        }
        let Some(finished) = running.next().await else {
            break;
        };
        done.push(finished);
    }
    done
}
