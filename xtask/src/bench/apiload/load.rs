//! The load on the API server: `--objects` ConfigMaps and the loops that LIST and PATCH them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Result, anyhow, bail};
use xtask::lab::{self, ApiClient, Lab};

use super::LOAD_NAMESPACE;
use crate::bench::harness::CREATE_THREADS;
use crate::bench::harness::api::create;

/// The admin client for the API server as seen from ns `api` (127.0.0.1:6443).
fn api_client(lab: &Lab) -> Result<ApiClient> {
    Ok(lab.admin_client(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        lab::API_PORT,
    ))?)
}

/// Creates namespace [`LOAD_NAMESPACE`] and `objects` ConfigMaps `load-N` of `kib` KiB each
/// ([`CREATE_THREADS`] threads in ns `api`; existing ones are kept).
pub(super) fn fill(lab: &Lab, objects: usize, kib: usize) -> Result<()> {
    create(
        lab,
        "/api/v1/namespaces",
        &serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": LOAD_NAMESPACE}}),
        "namespace load",
    )?;
    let client = api_client(lab)?;
    let blob = "x".repeat(kib * 1024);
    let path = format!("/api/v1/namespaces/{LOAD_NAMESPACE}/configmaps");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..CREATE_THREADS)
            .map(|t| {
                let (client, blob, path) = (&client, &blob, &path);
                s.spawn(move || {
                    lab.in_netns("api", || -> Result<()> {
                        for i in (t..objects).step_by(CREATE_THREADS) {
                            let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": format!("load-{i}")},
                                "data": {"blob": blob}})
                            .to_string();
                            let r = client.request("POST", path, Some(&body))?;
                            if !matches!(r.status, 201 | 409) {
                                bail!("create ConfigMap load-{i}: HTTP {}: {}", r.status, r.body);
                            }
                        }
                        Ok(())
                    })?
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow!("a ConfigMap creating thread panicked"))??;
        }
        Ok(())
    })
}

/// What the load loops did.
#[derive(Debug, Default)]
struct LoadCounters {
    lists: AtomicU64,
    writes: AtomicU64,
    failures: AtomicU64,
}

/// One load loop: LIST every ConfigMap of [`LOAD_NAMESPACE`], PATCH one, until `stop`.
/// Runs on a thread inside ns `api`.
fn load_loop(client: &ApiClient, id: usize, objects: usize, stop: &AtomicBool, k: &LoadCounters) {
    let list = format!("/api/v1/namespaces/{LOAD_NAMESPACE}/configmaps");
    let mut n = id;
    while !stop.load(Ordering::Relaxed) {
        match client.request("GET", &list, None) {
            Ok(r) if r.status == 200 => k.lists.fetch_add(1, Ordering::Relaxed),
            _ => k.failures.fetch_add(1, Ordering::Relaxed),
        };
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let path = format!("{list}/load-{}", n % objects);
        let body = format!(r#"{{"data":{{"tick":"{n}"}}}}"#);
        match client.request("PATCH", &path, Some(&body)) {
            Ok(r) if r.status == 200 => k.writes.fetch_add(1, Ordering::Relaxed),
            _ => k.failures.fetch_add(1, Ordering::Relaxed),
        };
        n += 7919;
    }
}

/// Running load loops.
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    counters: Arc<LoadCounters>,
    threads: Vec<std::thread::JoinHandle<lab::Result<()>>>,
}

impl Load {
    /// Starts `loops` load loops, each a thread inside ns `api`.
    pub(super) fn start(lab: &Lab, loops: usize, objects: usize) -> Result<Load> {
        let ns = lab.netns_path("api")?;
        let client = api_client(lab)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(LoadCounters::default());
        let mut threads = Vec::new();
        for id in 0..loops {
            let (c, s, k) = (client.clone(), stop.clone(), counters.clone());
            threads.push(lab::netns::spawn_in_netns(
                &ns,
                &format!("apiload-{id}"),
                move || {
                    load_loop(&c, id, objects, &s, &k);
                    Ok(())
                },
            )?);
        }
        Ok(Load {
            stop,
            counters,
            threads,
        })
    }

    /// (lists, writes, failures) so far.
    pub(super) fn counts(&self) -> (u64, u64, u64) {
        let k = &self.counters;
        (
            k.lists.load(Ordering::Relaxed),
            k.writes.load(Ordering::Relaxed),
            k.failures.load(Ordering::Relaxed),
        )
    }

    /// Stops the loops and waits for them (each finishes its request in flight).
    pub(super) fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().map_err(|_| anyhow!("a load loop panicked"))??;
        }
        Ok(())
    }
}
