//! [`Bench`]: a lab running vipd in Services mode on every node, and the bench's API calls
//! (Services, Leases) with their statuses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use xtask::lab::{self, ApiClient, Lab, LabOptions, LabProcess, NODES};

use super::NAMESPACE;
use crate::bench::harness::api::service_json;
use crate::bench::harness::procfs::proc_status;
use crate::bench::harness::text::{log_findings, metric_sum, or_none, tail, task_metrics};
use crate::bench::harness::{METRICS_PORT, services_mode_env};

/// HTTP statuses of the bench's own API calls.
#[derive(Debug, Default)]
pub struct ApiStats {
    by_status: Mutex<BTreeMap<u16, u64>>,
    io_errors: AtomicU64,
    first_errors: Mutex<Vec<String>>,
}

impl ApiStats {
    /// Counts the status of a call (`what`) and keeps the first failures.
    pub fn record(&self, what: &str, r: &lab::Result<lab::HttpResponse>) {
        match r {
            Ok(resp) => {
                if let Ok(mut m) = self.by_status.lock() {
                    *m.entry(resp.status).or_default() += 1;
                }
                if !(200..300).contains(&resp.status) {
                    self.note(format!(
                        "{what}: HTTP {}: {}",
                        resp.status,
                        resp.body.chars().take(200).collect::<String>()
                    ));
                }
            }
            Err(e) => {
                self.io_errors.fetch_add(1, Ordering::Relaxed);
                self.note(format!("{what}: {e}"));
            }
        }
    }

    fn note(&self, s: String) {
        if let Ok(mut v) = self.first_errors.lock()
            && v.len() < 5
        {
            v.push(s);
        }
    }

    /// Prints the calls' statuses other than 2xx, the connection errors and the first errors.
    pub fn print(&self) {
        let m = self.by_status.lock().map(|m| m.clone()).unwrap_or_default();
        let calls: u64 = m.values().sum();
        let bad: Vec<String> = m
            .iter()
            .filter(|(s, _)| !(200..300).contains(*s))
            .map(|(s, n)| format!("{n} x HTTP {s}"))
            .collect();
        let io = self.io_errors.load(Ordering::Relaxed);
        println!(
            "  bench API calls: {calls} answered, non-2xx: {}, connection errors: {io}",
            or_none(&bad, ", ")
        );
        for e in self
            .first_errors
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
        {
            println!("    {e}");
        }
    }
}

/// Per-node figures of one moment.
#[derive(Debug, Clone, Default)]
pub struct NodeSample {
    /// VmRSS, KiB.
    pub rss_kib: Option<u64>,
    /// Anonymous (heap, stacks) part of the RSS; the rest is mostly the binary's pages.
    pub rss_anon_kib: Option<u64>,
    /// Threads of the process.
    pub threads: Option<u64>,
    /// Task gauges of `/metrics` ([`task_metrics`]).
    pub tasks: Vec<(String, f64)>,
    /// `vipd_vips_held`.
    pub vips_held: Option<f64>,
    /// `kube_vip_active_services`.
    pub active_services: Option<f64>,
}

impl NodeSample {
    /// The sample as one line of a table (RSS, anonymous RSS, threads, tasks, VIPs held).
    pub fn line(&self) -> String {
        let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
        let tasks = if self.tasks.is_empty() {
            "n/a".to_string()
        } else {
            self.tasks
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            "RSS {:>6.1} MiB (anon {:.1}), threads {:>3}, tasks {tasks}, vipd_vips_held {}, kube_vip_active_services {}",
            self.rss_kib.map_or(f64::NAN, |k| k as f64 / 1024.0),
            self.rss_anon_kib.map_or(f64::NAN, |k| k as f64 / 1024.0),
            opt(self.threads),
            self.vips_held.map_or("?".into(), |v| v.to_string()),
            self.active_services.map_or("?".into(), |v| v.to_string()),
        )
    }
}

/// A lab with HTTP backends and vipd (Services mode, svc_election) on every node.
pub struct Bench {
    /// The lab.
    pub lab: Lab,
    /// vipd on each node, with the node's name.
    pub procs: Vec<(String, LabProcess)>,
    /// Admin client of the lab API server.
    pub api: ApiClient,
    /// Statuses of the bench's own API calls.
    pub stats: ApiStats,
    /// Print progress.
    pub verbose: bool,
    /// The settings the bench passed to the last vipd it spawned ([`Bench::spawn_vipd`]:
    /// [`services_mode_env`], `extra`, `VIPD_BENCH_ENV`); the same on every node but for
    /// the node's name and kubeconfig. vipd also inherits the bench's own environment.
    pub vipd_env: BTreeMap<String, String>,
}

/// The INFO line of vipd the bench waits for before it creates Services
/// ([`Bench::wait_healthy`]), and its target.
pub(crate) const READY_LINE: &str = "watching LoadBalancer Services";
const READY_TARGET: &str = "vipd::services::runtime";

/// vipd's `VIPD_LOG` for `VIPD_BENCH_LOG`'s value `user` (`None` when empty: vipd's default):
/// the user's filter, with [`READY_LINE`]'s target kept at INFO unless the filter names it
/// (a filter such as `warn` would otherwise hide the line and fail every run with "not
/// ready after 30 s").
pub(crate) fn vipd_log_filter(user: &str) -> Option<String> {
    let user = user.trim().trim_end_matches(',');
    if user.is_empty() {
        return None;
    }
    if user.split(',').any(|d| d.trim().starts_with(READY_TARGET)) {
        return Some(user.to_string());
    }
    Some(format!("{user},{READY_TARGET}=info"))
}

impl Bench {
    /// Starts a lab with HTTP backends and vipd in Services mode on every node; waits
    /// until each is ready ([`Bench::wait_ready`]).
    ///
    /// # Errors
    /// When the lab or a vipd cannot start.
    pub fn start(vipd: &Path, verbose: bool) -> Result<Bench> {
        Bench::start_with(vipd, verbose, &[])
    }

    /// As [`Bench::start`], with more vipd settings on every node (`extra` overrides the
    /// defaults; `VIPD_BENCH_ENV` overrides both).
    pub fn start_with(vipd: &Path, verbose: bool, extra: &[(&str, &str)]) -> Result<Bench> {
        Bench::start_prepared(vipd, verbose, extra, |_| Ok(()))
    }

    /// As [`Bench::start_with`], running `prepare` on the lab before any vipd starts (e.g.
    /// more node addresses, which vipd reads at start).
    pub fn start_prepared(
        vipd: &Path,
        verbose: bool,
        extra: &[(&str, &str)],
        prepare: impl FnOnce(&Lab) -> Result<()>,
    ) -> Result<Bench> {
        let mut b = Bench::start_lab(verbose, prepare)?;
        b.spawn_vipd(vipd, extra)?;
        b.wait_ready()?;
        Ok(b)
    }

    /// Starts a lab with HTTP backends and runs `prepare` on it, without any vipd: start
    /// them with [`Bench::spawn_vipd`] (then [`Bench::wait_ready`]).
    ///
    /// # Errors
    /// When the lab cannot start or `prepare` fails.
    pub fn start_lab(verbose: bool, prepare: impl FnOnce(&Lab) -> Result<()>) -> Result<Bench> {
        let lab = Lab::start(LabOptions {
            http_backends: true,
            ..LabOptions::default()
        })?;
        prepare(&lab)?;
        let api = lab.admin_client(SocketAddr::new(IpAddr::V4(lab::API_IP), lab::API_PORT))?;
        Ok(Bench {
            lab,
            procs: Vec::new(),
            api,
            stats: ApiStats::default(),
            verbose,
            vipd_env: BTreeMap::new(),
        })
    }

    /// Spawns vipd in Services mode on every node ([`services_mode_env`], then `extra`, then
    /// `VIPD_BENCH_ENV`; `VIPD_BENCH_WRAP` as documented in docs/services-bench.md) and
    /// returns at once, without waiting for them to be ready ([`Bench::wait_ready`]).
    /// Returns the instant just before the first spawn.
    ///
    /// # Errors
    /// When a vipd cannot be started (those already started are stopped).
    pub fn spawn_vipd(&mut self, vipd: &Path, extra: &[(&str, &str)]) -> Result<Instant> {
        let lab = &self.lab;
        let mut envs = Vec::new();
        for node in NODES {
            envs.push((node, lab.kubeconfig(node)?.to_string_lossy().into_owned()));
        }
        let from_env = std::env::var("VIPD_BENCH_ENV").unwrap_or_default();
        let wrap = std::env::var("VIPD_BENCH_WRAP").unwrap_or_default();
        let log = vipd_log_filter(&std::env::var("VIPD_BENCH_LOG").unwrap_or_default());
        let t0 = Instant::now();
        let mut procs = Vec::new();
        for (node, kubeconfig) in &envs {
            let node = *node;
            let env: Vec<(&str, &str)> = services_mode_env(node, kubeconfig);
            // Extra vipd settings for a run, e.g. Service lease timings:
            // VIPD_BENCH_ENV="svc_leaseduration=9,svc_renewdeadline=6,svc_retryperiod=3"
            let mut env = env;
            for (k, v) in extra {
                env.retain(|(ek, _)| ek != k);
                env.push((*k, *v));
            }
            for kv in from_env.split(',').filter(|kv| !kv.is_empty()) {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                env.retain(|(ek, _)| *ek != k);
                env.push((k, v));
            }
            // vipd's log filter (`VIPD_LOG`, tracing's EnvFilter: commas allowed here, unlike
            // in VIPD_BENCH_ENV), e.g. VIPD_BENCH_LOG="info,vipd::election=debug".
            if let Some(filter) = &log {
                env.retain(|(ek, _)| *ek != "VIPD_LOG");
                env.push(("VIPD_LOG", filter.as_str()));
            }
            self.vipd_env = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            // Profiling: VIPD_BENCH_WRAP="heaptrack -o /tmp/vipd-a" runs node-a's vipd under
            // that command; with `{node}` in it ("heaptrack -o /tmp/hp-{node}") every node's.
            // RSS figures of wrapped nodes are the wrapper's, not vipd's.
            let wrapped = !wrap.trim().is_empty() && (node == NODES[0] || wrap.contains("{node}"));
            let proc = if wrapped {
                let wrap = wrap.replace("{node}", node);
                let mut words: Vec<String> = wrap.split_whitespace().map(String::from).collect();
                let program = words.remove(0);
                words.push(vipd.to_string_lossy().into_owned());
                words.push("manager".into());
                lab.spawn(node, &program, &words, &env)?
            } else {
                lab.spawn(node, vipd, &["manager"], &env)?
            };
            procs.push((node.to_string(), proc));
        }
        self.procs.extend(procs);
        Ok(t0)
    }

    /// Prints `s` (indented) when the run is verbose.
    pub fn say(&self, s: impl AsRef<str>) {
        if self.verbose {
            eprintln!("    {}", s.as_ref());
        }
    }

    /// Waits until every vipd is healthy ([`Bench::wait_healthy`]), then 1 s more for the
    /// Service and Endpoints reflectors' first lists.
    ///
    /// # Errors
    /// As [`Bench::wait_healthy`].
    pub fn wait_ready(&self) -> Result<()> {
        self.wait_healthy()?;
        // The Service and Endpoints reflectors list right after that line; let them.
        std::thread::sleep(Duration::from_secs(1));
        Ok(())
    }

    /// Waits until every vipd answers /healthz and logged that it watches Services (30 s at
    /// most).
    ///
    /// # Errors
    /// When a vipd is not there after 30 s, with the end of its log.
    pub fn wait_healthy(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        for (node, p) in &self.procs {
            loop {
                let healthy = self
                    .metrics_get(node, "/healthz")
                    .is_ok_and(|b| b.contains("ok"));
                if healthy && p.log().contains(READY_LINE) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "vipd on {node} not ready after 30 s (healthz: {healthy}); log:\n{}",
                        tail(&p.log(), 30)
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// GET `path` from `node`'s admin endpoint (port [`METRICS_PORT`], IPv6 loopback first).
    ///
    /// # Errors
    /// When neither loopback address answers.
    pub fn metrics_get(&self, node: &str, path: &str) -> Result<String> {
        let t = Duration::from_secs(2);
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), METRICS_PORT);
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), METRICS_PORT);
        match self.lab.http_get(node, v6, path, t) {
            Ok(b) => Ok(b),
            Err(_) => Ok(self.lab.http_get(node, v4, path, t)?),
        }
    }

    /// Pid of `node`'s vipd.
    pub fn pid(&self, node: &str) -> Option<i32> {
        self.procs
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, p)| p.pid())
    }

    /// RSS, threads and `/metrics` figures of `node`'s vipd now.
    pub fn sample(&self, node: &str) -> NodeSample {
        let pid = self.pid(node);
        let metrics = self.metrics_get(node, "/metrics").unwrap_or_default();
        NodeSample {
            rss_kib: pid.and_then(|p| proc_status(p, "VmRSS")),
            rss_anon_kib: pid.and_then(|p| proc_status(p, "RssAnon")),
            threads: pid.and_then(|p| proc_status(p, "Threads")),
            tasks: task_metrics(&metrics),
            vips_held: metric_sum(&metrics, "vipd_vips_held"),
            active_services: metric_sum(&metrics, "kube_vip_active_services"),
        }
    }

    /// RSS, threads and `/metrics` figures of `node`'s vipd now.s
    pub fn samples(&self) -> Vec<(String, NodeSample)> {
        NODES
            .iter()
            .map(|n| (n.to_string(), self.sample(n)))
            .collect()
    }

    /// Runs `f` on a thread in the client namespace (threads it spawns stay there).
    pub fn in_client<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        Ok(self.lab.in_netns("client", f)?)
    }

    /// Creates `default/<name>` with `addr`; must run inside a lab namespace. A call that
    /// got no answer (the lab client's 5 s timeout) is repeated up to twice; 409
    /// AlreadyExists on a repeat means the first call went through. Returns whether the
    /// Service exists.
    pub fn create(&self, name: &str, addr: IpAddr) -> bool {
        self.create_from(name, &service_json(name, addr).to_string())
    }

    /// Like [`Bench::create`], with the Service's JSON `body` (named `name`) as given.
    pub fn create_from(&self, name: &str, body: &str) -> bool {
        for attempt in 0..3 {
            let r = self.api.request(
                "POST",
                &format!("/api/v1/namespaces/{NAMESPACE}/services"),
                Some(body),
            );
            self.stats.record(&format!("create {name}"), &r);
            match r {
                Ok(x) if x.status == 201 => return true,
                Ok(x) if x.status == 409 && attempt > 0 => return true,
                Ok(_) => return false,
                Err(_) => continue,
            }
        }
        false
    }

    /// Deletes `default/<name>`; must run inside a lab namespace.
    pub fn delete(&self, name: &str) -> bool {
        let r = self.api.request(
            "DELETE",
            &format!("/api/v1/namespaces/{NAMESPACE}/services/{name}"),
            None,
        );
        self.stats.record(&format!("delete {name}"), &r);
        matches!(r, Ok(ref x) if matches!(x.status, 200 | 202))
    }

    /// Leases in `default` (must run inside a lab namespace): the list's resourceVersion
    /// and (name, holderIdentity) of each.
    pub fn leases(&self) -> Result<(String, BTreeMap<String, String>)> {
        self.leases_at(&format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
        ))
    }

    /// GET `path` (must run inside a lab namespace), counted in the bench's API statistics
    /// as `what`; the body of a 200 answer.
    ///
    /// # Errors
    /// The call failing, or any other status (naming `what`, the status and the body).
    fn get_ok(&self, what: &str, path: &str) -> Result<String> {
        let r = self.api.request("GET", path, None);
        self.stats.record(what, &r);
        let r = r?;
        if r.status != 200 {
            bail!("{what}: HTTP {}: {}", r.status, r.body);
        }
        Ok(r.body)
    }

    /// Leases at `path` (a namespace's, or all namespaces' with
    /// `/apis/coordination.k8s.io/v1/leases`; must run inside a lab namespace): the list's
    /// resourceVersion and (name, holderIdentity) of each.
    pub fn leases_at(&self, path: &str) -> Result<(String, BTreeMap<String, String>)> {
        let (rv, leases) = self.lease_list(path)?;
        Ok((rv, leases.into_iter().map(|l| (l.name, l.holder)).collect()))
    }

    /// Leases at `path` as [`Bench::leases_at`] lists them, each whole ([`LeaseSeen`]).
    ///
    /// # Errors
    /// When the list fails, answers with another status than 200 or is not JSON.
    pub fn lease_list(&self, path: &str) -> Result<(String, Vec<LeaseSeen>)> {
        let body = self.get_ok("list leases", path)?;
        let v: serde_json::Value = serde_json::from_str(&body).context("lease list JSON")?;
        let rv = v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let leases = v["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(LeaseSeen::from_json)
            .collect();
        Ok((rv, leases))
    }

    /// Counts Lease writes in every namespace (per-Service leases in `default`, shard
    /// leases and the allocator's in `kube-system`) with a watch for `window` (must run
    /// inside a lab namespace): (writes, writes per second, holder changes, leases at the
    /// start).
    pub fn lease_writes(&self, window: Duration) -> Result<LeaseWatch> {
        let (rv, mut holders) = self.leases_at("/apis/coordination.k8s.io/v1/leases")?;
        let leases = holders.len();
        let path = format!(
            "/apis/coordination.k8s.io/v1/leases?watch=1&resourceVersion={rv}&timeoutSeconds={}",
            window.as_secs().max(1)
        );
        let t0 = Instant::now();
        let body = self.get_ok("watch leases", &path)?;
        let took = t0.elapsed();
        let mut writes = 0u64;
        let mut holder_changes = 0u64;
        for e in body
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        {
            if !matches!(e["type"].as_str(), Some("MODIFIED" | "ADDED" | "DELETED")) {
                continue;
            }
            writes += 1;
            let Some(l) = LeaseSeen::from_json(&e["object"]) else {
                continue;
            };
            if holders
                .insert(l.name, l.holder.clone())
                .is_some_and(|old| old != l.holder)
            {
                holder_changes += 1;
            }
        }
        Ok(LeaseWatch {
            writes,
            per_s: writes as f64 / took.as_secs_f64().max(1.0),
            seconds: took.as_secs_f64(),
            holder_changes,
            leases,
        })
    }

    /// Counts the writes to Services and Events in `default` for `window` (must run inside
    /// a lab namespace): watches from the current resourceVersion (a list with `limit=1`),
    /// in 4 s watches chained by resourceVersion (the lab client's read timeout is 5 s).
    /// Each Service write is named by the newest `managedFields` entry (manager,
    /// subresource, operation: who wrote what), each Event write by its reason.
    pub fn rest_writes(&self, window: Duration) -> Result<RestWrites> {
        let mut out = RestWrites::default();
        let mut names = BTreeSet::new();
        for (kind, path) in [
            (
                "services",
                format!("/api/v1/namespaces/{NAMESPACE}/services"),
            ),
            ("events", format!("/api/v1/namespaces/{NAMESPACE}/events")),
        ] {
            let body = self.get_ok(&format!("list {kind}"), &format!("{path}?limit=1"))?;
            let v: serde_json::Value = serde_json::from_str(&body).context("list JSON")?;
            let rv = v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if kind == "services" {
                out.service_rv = rv;
            } else {
                out.event_rv = rv;
            }
        }
        let t0 = Instant::now();
        while t0.elapsed() < window {
            let left = window.saturating_sub(t0.elapsed()).as_secs().clamp(1, 4);
            for kind in ["services", "events"] {
                let rv = if kind == "services" {
                    &mut out.service_rv
                } else {
                    &mut out.event_rv
                };
                let path = format!(
                    "/api/v1/namespaces/{NAMESPACE}/{kind}?watch=1&resourceVersion={rv}&timeoutSeconds={left}"
                );
                let body = self.get_ok(&format!("watch {kind}"), &path)?;
                for e in body
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                {
                    let ty = e["type"].as_str().unwrap_or_default();
                    if let Some(v) = e["object"]["metadata"]["resourceVersion"].as_str() {
                        *rv = v.to_string();
                    }
                    if !matches!(ty, "MODIFIED" | "ADDED" | "DELETED") {
                        continue;
                    }
                    let o = &e["object"];
                    if kind == "services" {
                        out.service_writes += 1;
                        names.insert(
                            o["metadata"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                        );
                        let newest = o["metadata"]["managedFields"]
                            .as_array()
                            .and_then(|m| {
                                m.iter().max_by_key(|f| {
                                    f["time"].as_str().unwrap_or_default().to_string()
                                })
                            })
                            .map(|f| {
                                format!(
                                    "{} {}{}",
                                    f["manager"].as_str().unwrap_or("?"),
                                    f["operation"].as_str().unwrap_or("?"),
                                    f["subresource"]
                                        .as_str()
                                        .map(|s| format!(" {s}"))
                                        .unwrap_or_default()
                                )
                            })
                            .unwrap_or_else(|| "?".into());
                        *out.service_by_writer.entry(newest).or_default() += 1;
                    } else {
                        out.event_writes += 1;
                        let reason = o["reason"].as_str().unwrap_or("?").to_string();
                        *out.event_by_reason
                            .entry(format!("{ty} {reason}"))
                            .or_default() += 1;
                    }
                }
            }
        }
        out.seconds = t0.elapsed().as_secs_f64();
        out.services_written = names.len();
        Ok(out)
    }

    /// How many of `addrs` each node carries on eth0 or lo ([`Bench::carried_on`]).
    pub fn carried(&self, addrs: &BTreeSet<IpAddr>) -> Result<BTreeMap<String, usize>> {
        Ok(self
            .carried_sets(addrs)?
            .into_iter()
            .map(|(n, s)| (n, s.len()))
            .collect())
    }

    /// Which of `addrs` each node carries on eth0 or lo ([`Bench::carried_on`]).
    pub fn carried_sets(
        &self,
        addrs: &BTreeSet<IpAddr>,
    ) -> Result<BTreeMap<String, BTreeSet<IpAddr>>> {
        let mut out = BTreeMap::new();
        for n in NODES {
            out.insert(n.to_string(), self.carried_on(n, addrs)?);
        }
        Ok(out)
    }

    /// Which of `addrs` any of `nodes` carries on eth0 or lo ([`Bench::carried_on`]: two
    /// address listings and a route listing per node).
    pub fn carried_by(&self, nodes: &[&str], addrs: &BTreeSet<IpAddr>) -> Result<BTreeSet<IpAddr>> {
        let mut out = BTreeSet::new();
        for n in nodes {
            out.extend(self.carried_on(n, addrs)?);
        }
        Ok(out)
    }

    /// Which of `addrs` `node` carries on eth0 or on lo (`svc_ipv6_loopback` puts IPv6
    /// Service VIPs there as local routes): two address listings of the node
    /// ([`Lab::addresses`], `ip -j addr show dev eth0` and `dev lo`) and one of vipd's
    /// local routes ([`Lab::loopback_routes`]), however many addresses.
    pub fn carried_on(&self, node: &str, addrs: &BTreeSet<IpAddr>) -> Result<BTreeSet<IpAddr>> {
        let mut out = BTreeSet::new();
        for ifname in [lab::ETH, "lo"] {
            out.extend(
                self.lab
                    .addresses(node, ifname)?
                    .into_iter()
                    .map(|a| a.addr)
                    .filter(|a| addrs.contains(a)),
            );
        }
        // svc_ipv6_loopback: IPv6 VIPs are local routes on lo, not addresses.
        out.extend(
            self.lab
                .loopback_routes(node)?
                .into_iter()
                .filter(|a| addrs.contains(a)),
        );
        Ok(out)
    }

    /// Prints WARN/ERROR counts and the first distinct lines of each vipd's log.
    pub fn print_logs(&self) {
        println!("  vipd logs:");
        for (node, p) in &self.procs {
            let log = p.log();
            let (warn, err, panics, examples) = log_findings(&log);
            println!(
                "    {node}: {} lines, {warn} WARN, {err} ERROR, {panics} panics",
                log.lines().count()
            );
            for e in examples {
                println!("      {e}");
            }
        }
    }

    /// The end of every scenario: prints the statuses of the bench's API calls
    /// ([`ApiStats::print`]) and the vipd logs' findings ([`Bench::print_logs`]), then stops
    /// every vipd ([`Bench::stop`]).
    pub fn finish(self) {
        self.stats.print();
        self.print_logs();
        self.stop();
    }

    /// Stops every vipd (SIGTERM to all first, so they release their Leases in parallel;
    /// 20 s each) and prints those that did not exit cleanly.
    pub fn stop(mut self) {
        // SIGTERM all first so they release their leases in parallel.
        for (_, p) in &self.procs {
            let _ = p.signal(lab::Signal::SIGTERM);
        }
        for (node, p) in &mut self.procs {
            match p.stop(Duration::from_secs(20)) {
                Ok(st) if st.success() => {}
                Ok(st) => println!("  vipd on {node} exited with {st}"),
                Err(e) => println!("  stopping vipd on {node}: {e}"),
            }
        }
    }
}

/// Result of [`Bench::lease_writes`].
#[derive(Debug, Clone, Copy)]
pub struct LeaseWatch {
    /// Lease writes (watch events).
    pub writes: u64,
    /// Writes per second.
    pub per_s: f64,
    /// Length of the watch, s.
    pub seconds: f64,
    /// Writes that changed a Lease's holder.
    pub holder_changes: u64,
    /// Leases at the start.
    pub leases: usize,
}

/// Result of [`Bench::rest_writes`]: the Service and Event writes in `default` over a window.
#[derive(Debug, Clone, Default)]
pub struct RestWrites {
    /// Service watch events (ADDED, MODIFIED, DELETED).
    pub service_writes: u64,
    /// Distinct Services written.
    pub services_written: usize,
    /// Service writes by the newest managedFields entry ("manager operation [subresource]").
    pub service_by_writer: BTreeMap<String, u64>,
    /// Event watch events.
    pub event_writes: u64,
    /// Event writes by "type reason".
    pub event_by_reason: BTreeMap<String, u64>,
    /// Length of the watches, s.
    pub seconds: f64,
    /// The resourceVersions the watches reached (internal).
    service_rv: String,
    event_rv: String,
}

/// One lease as a list or a watch event gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseSeen {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.holderIdentity` (empty when released).
    pub holder: String,
    /// `spec.leaseDurationSeconds`.
    pub duration_secs: Option<f64>,
}

impl LeaseSeen {
    /// From a Lease object's JSON; `None` without a name.
    pub fn from_json(o: &serde_json::Value) -> Option<LeaseSeen> {
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        Some(LeaseSeen {
            namespace: text(&o["metadata"]["namespace"]),
            name: o["metadata"]["name"].as_str()?.to_string(),
            holder: text(&o["spec"]["holderIdentity"]),
            duration_secs: o["spec"]["leaseDurationSeconds"].as_f64(),
        })
    }

    /// `namespace/name`: names repeat across namespaces.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
