//! Elections on a runtime of their own.
//!
//! A lease is renewed once per retry period by a call that must start in time: client-go
//! steps down when no renewal succeeds within the renew deadline. On the process's main
//! runtime the elector's timer and its HTTP call share two worker threads with everything
//! else (VIP holders binding hundreds of addresses, Service passes, status writes); in a
//! 10 000-Service cold start on two cores those workers were busy for seconds at a time and
//! shard leases stepped down with no failed call logged ("could not renew within the renew
//! deadline" after 1.8 s of silence), which moved their VIPs and made more work.
//!
//! Here the electors run on one worker thread of their own (`vipd-election`), with the lease
//! client's connections: a renewal waits only for the kernel's scheduler and the API server,
//! not for the other tasks. The runtime is built on first use and lives as long as the
//! process.

use std::future::Future;
use std::sync::{Mutex, PoisonError};

use tokio::runtime::{Builder, Handle};
use tokio::task::JoinHandle;

/// Name of the election runtime's threads (`ps -T`, `top -H`).
pub const THREAD_NAME: &str = "vipd-election";

/// Blocking threads the election runtime may start: the lease client's name lookups
/// (hyper resolves the API server's host name on a blocking thread).
const MAX_BLOCKING_THREADS: usize = 4;

static RUNTIME: Mutex<Option<Handle>> = Mutex::new(None);

/// The process's election runtime: one worker thread named [`THREAD_NAME`] with timers and
/// I/O, started on the first call and never stopped (later calls return the same handle).
/// `None` (logged as a warning) when it cannot be built (its thread cannot be started):
/// the caller then runs its electors on its own runtime, as before this existed.
pub fn election_runtime() -> Option<Handle> {
    match build_or_get() {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the election runtime; leases are renewed on the main runtime");
            None
        }
    }
}

fn build_or_get() -> std::io::Result<Handle> {
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(h) = slot.as_ref() {
        return Ok(h.clone());
    }
    let rt = Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_name(THREAD_NAME)
        .enable_all()
        .build()?;
    // Never dropped: a runtime dropped inside another runtime's task panics, and this one
    // serves the process until it exits.
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(rt));
    let handle = rt.handle().clone();
    *slot = Some(handle.clone());
    Ok(handle)
}

/// Spawns `task` on `runtime` when given (the election runtime), else on the current one
/// (tests with paused time, callers that could not build it).
pub fn spawn_on<F>(runtime: Option<&Handle>, task: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match runtime {
        Some(h) => h.spawn(task),
        None => tokio::spawn(task),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn electors_run_on_the_election_thread_and_one_runtime_serves_every_caller() {
        let rt = election_runtime().expect("runtime");
        let again = election_runtime().expect("runtime");
        assert_eq!(rt.id(), again.id(), "one election runtime per process");
        let name = spawn_on(Some(&rt), async {
            std::thread::current().name().map(str::to_owned)
        })
        .await
        .expect("task");
        assert_eq!(name.as_deref(), Some(THREAD_NAME));
        // Without a handle the task stays on the caller's runtime.
        let here = tokio::runtime::Handle::current().id();
        let id = spawn_on(None, async { tokio::runtime::Handle::current().id() })
            .await
            .expect("task");
        assert_eq!(id, here);
        assert_ne!(id, rt.id());
    }

    #[test]
    fn the_election_runtime_keeps_time_while_the_callers_workers_are_blocked() {
        // The case it exists for: the caller's every worker busy (a holder's long kernel
        // batch). The election runtime's timers and tasks go on: the blocked worker waits
        // for a message only an election task that slept on its timers sends.
        let main = Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let elections = election_runtime().expect("runtime");
        let (tx, rx) = std::sync::mpsc::channel();
        main.block_on(async {
            let renewals = spawn_on(Some(&elections), async move {
                for round in 0..5 {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    let _ = tx.send(round);
                }
            });
            let got = tokio::spawn(async move {
                // Blocks the caller's only worker until five renewals' worth of timers fired.
                (0..5)
                    .map(|_| rx.recv_timeout(std::time::Duration::from_secs(10)))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await
            .expect("blocked worker");
            assert_eq!(got, Ok(vec![0, 1, 2, 3, 4]));
            renewals.await.expect("renewals");
        });
    }
}
