//! `cargo xtask bench ipam`: figures for vipd's IPAM wing (issue 25) in the lab. It prints
//! figures, not pass/fail; docs/services-bench.md records a run.
//!
//! ```text
//! cargo xtask bench ipam [--services 1,500] [--no-build] [--vipd PATH] [-v]
//! ```
//!
//! For each N of `--services`, a lab of its own (HTTP backends, as `bench services`) runs
//! vipd on node-a, node-b and node-c in Services mode with `svc_election` and IPAM on (its
//! default), and ConfigMap `kube-system/kubevip` holds `range-global=` [`POOL`] (550
//! addresses: 198.51.100.1-250, 203.0.113.1-250 and 192.0.2.150-199, so up to 550
//! Services). Before vipd starts, each node gets an eth0 address of its own in
//! 198.51.100.0/24 and 203.0.113.0/24 (.251-.253: vipd announces a Service address only on a
//! node with a connected subnet containing it) and the `client` namespace on-link routes to
//! both, so it resolves those addresses with ARP on the lab's segment like 192.0.2.x. Once the
//! holder of Lease `kube-system/kube-vip-cloud-controller` is known, N Services
//! `default/ipam-<i>` without address are created by 4 threads at once. Per Service:
//!
//! - **create -> address written**: from its create call returning to the first version of
//!   the Service carrying `kube-vip.io/loadbalancerIPs`, as seen by one watch on Services in
//!   `default` run from the `client` namespace (started before the first create);
//! - **create -> first answer**: from its create call returning to the first `HTTP 200` from
//!   `<address>:80` (the `bench services` definition: the first TCP connect needs the
//!   address's ARP answer, so it includes ARP resolution);
//! - **API writes**: every MODIFIED event of that watch is one write to the Service; each is
//!   classified by what changed from the previous version: metadata/spec (the allocator's
//!   patch), only annotation `kube-vip.io/vipHost` or only the status (both the Services
//!   wing's, once a node announces the address). Events (the
//!   `core/v1` kind) written about the Services are counted at the end, by reason.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use xtask::lab::{ETH, NODES};

use super::harness::CREATE_THREADS;
use super::harness::api;
use super::harness::build::vipd_release_binary;
use super::services::context::Bench;
use super::services::http::poll_until_answer;
use super::stats::{ms, summary_ms};
use crate::args::{parse_flags, whole_number};

const USAGE: &str = "usage: cargo xtask bench ipam [options]

options:
  --services LIST Services created at once, a comma list (default 1,500; each at most 550,
                  the bench's pool)
  --no-build      do not run `cargo build --release -p vipd` first
  --vipd PATH     vipd binary to use (default target/release/vipd)
  -v, --verbose   print progress details";

/// The pool of ConfigMap `kube-system/kubevip`.
pub const POOL: &str =
    "198.51.100.1-198.51.100.250,203.0.113.1-203.0.113.250,192.0.2.150-192.0.2.199";
/// Addresses in [`POOL`].
pub const POOL_SIZE: usize = 550;
/// The /24s of [`POOL`], routed on-link from the `client` namespace.
const POOL_NETS: [&str; 2] = ["198.51.100.0/24", "203.0.113.0/24"];
/// The Service annotation the allocator writes.
const ANN: &str = "kube-vip.io/loadbalancerIPs";
/// The annotation naming the node that announces a Service.
const ANN_VIP_HOST: &str = "kube-vip.io/vipHost";
/// kube-vip-cloud-provider's Lease, which vipd's allocator campaigns for.
const IPAM_LEASE: &str = "kube-vip-cloud-controller";

/// Command-line options of `bench ipam`.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Service counts, one run (and lab) each.
    pub services: Vec<usize>,
    /// Run `cargo build --release -p vipd` first.
    pub build: bool,
    /// Explicit vipd binary.
    pub vipd: Option<std::path::PathBuf>,
    /// Print progress details.
    pub verbose: bool,
}

impl Options {
    /// Parses the arguments after `bench ipam`.
    ///
    /// # Errors
    /// An unknown flag, a missing value or a count outside 1..=[`POOL_SIZE`]; `--help`
    /// returns the usage as the error.
    pub fn parse(args: &[&str]) -> Result<Options> {
        let mut o = Options {
            services: vec![1, 500],
            build: true,
            vipd: None,
            verbose: false,
        };
        parse_flags(args, USAGE, |a, value| {
            match a {
                "--services" => {
                    let v = value()?;
                    o.services = v
                        .split(',')
                        .map(str::trim)
                        .filter(|w| !w.is_empty())
                        .map(|w| whole_number(a, w, 1..=POOL_SIZE))
                        .collect::<Result<Vec<_>>>()?;
                    if o.services.is_empty() {
                        bail!("--services: empty value {v:?}");
                    }
                }
                "--no-build" => o.build = false,
                "--vipd" => o.vipd = Some(value()?.into()),
                "-v" | "--verbose" => o.verbose = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(o)
    }
}

/// Entry point of `cargo xtask bench ipam ARGS`.
///
/// # Errors
/// Bad arguments, a failed build, a lab that cannot start, or a run that cannot proceed.
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    crate::require_root("bench ipam")?;
    let vipd = vipd_release_binary(o.build, o.vipd.as_deref())?;
    println!("vipd binary: {}", vipd.display());
    for n in &o.services {
        let t0 = Instant::now();
        run_one(&vipd, *n, o.verbose)?;
        println!("({n} Services took {:.0} s)\n", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

/// A LoadBalancer Service `default/<name>` without address (80/TCP).
fn no_address(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": api::NAMESPACE},
        "spec": {
            "type": "LoadBalancer",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
            "externalTrafficPolicy": "Cluster",
        }
    })
}

/// What the watch saw of one Service.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// When the first version with the annotation arrived, and its (first) address.
    written: Option<(Instant, IpAddr)>,
    /// MODIFIED events that changed metadata or spec other than annotation
    /// `kube-vip.io/vipHost` (the allocator's patch).
    spec_writes: u64,
    /// MODIFIED events that changed only annotation `kube-vip.io/vipHost` (the Services
    /// wing names the announcing node).
    viphost_writes: u64,
    /// MODIFIED events that changed only the status.
    status_writes: u64,
    /// MODIFIED events that changed none of these.
    other_writes: u64,
    /// The last version ([`parts`]).
    last: Option<[String; 3]>,
}

/// (metadata and spec, annotation `kube-vip.io/vipHost`, status) of a Service, without the
/// fields every write changes.
fn parts(obj: &Value) -> [String; 3] {
    let mut meta = obj["metadata"].clone();
    if let Some(m) = meta.as_object_mut() {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    let vip_host = meta["annotations"][ANN_VIP_HOST].to_string();
    if let Some(a) = meta["annotations"].as_object_mut() {
        a.remove(ANN_VIP_HOST);
    }
    [
        json!([meta, obj["spec"]]).to_string(),
        vip_host,
        obj["status"].to_string(),
    ]
}

/// Index `i` of a Service named `ipam-<i>`.
fn index(name: &str) -> Option<usize> {
    name.strip_prefix("ipam-")?.parse().ok()
}

/// Applies one watch line to `seen`.
fn apply_event(line: &str, seen: &Mutex<BTreeMap<usize, Seen>>, now: Instant) {
    let Ok(e) = serde_json::from_str::<Value>(line) else {
        return;
    };
    let kind = e["type"].as_str().unwrap_or_default();
    let obj = &e["object"];
    let Some(i) = obj["metadata"]["name"].as_str().and_then(index) else {
        return;
    };
    let Ok(mut seen) = seen.lock() else { return };
    let s = seen.entry(i).or_default();
    let now_parts = parts(obj);
    if kind == "MODIFIED"
        && let Some(last) = &s.last
    {
        if last[0] != now_parts[0] {
            s.spec_writes += 1;
        } else if last[1] != now_parts[1] {
            s.viphost_writes += 1;
        } else if last[2] != now_parts[2] {
            s.status_writes += 1;
        } else {
            s.other_writes += 1;
        }
    }
    s.last = Some(now_parts);
    if s.written.is_none()
        && let Some(addr) = obj["metadata"]["annotations"][ANN]
            .as_str()
            .and_then(|a| a.split(',').next())
            .and_then(|a| a.trim().parse().ok())
    {
        s.written = Some((now, addr));
    }
}

/// A lab with 3 vipd nodes, routes and node addresses for the pool's extra /24s, and the
/// pool ConfigMap; returns once a node holds the allocator's Lease.
fn prepare(vipd: &Path, verbose: bool) -> Result<Bench> {
    let b = Bench::start_prepared(vipd, verbose, &[], |lab| {
        for net in POOL_NETS {
            lab.exec("client", "ip", &["route", "add", net, "dev", ETH])
                .with_context(|| format!("route {net} in ns client"))?;
        }
        // vipd announces a Service address only on a node with a connected subnet that
        // contains it: each node gets an address of its own in both /24s (.251-.253).
        for (k, node) in NODES.iter().enumerate() {
            for prefix in ["198.51.100", "203.0.113"] {
                let addr = format!("{prefix}.{}/24", 251 + k);
                lab.exec(node, "ip", &["addr", "add", &addr, "dev", ETH])
                    .with_context(|| format!("{addr} on {node}"))?;
            }
        }
        Ok(())
    })?;
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kubevip", "namespace": "kube-system"},
        "data": {"range-global": POOL},
    });
    api::create(
        &b.lab,
        "/api/v1/namespaces/kube-system/configmaps",
        &cm,
        "ConfigMap kube-system/kubevip",
    )?;
    let holder = wait_ipam_holder(&b)?;
    println!("  pool range-global={POOL}; allocator: {holder}");
    // Let every allocator's ConfigMap watch catch up.
    std::thread::sleep(Duration::from_secs(2));
    Ok(b)
}

/// One run with `n` Services in a lab of its own.
fn run_one(vipd: &Path, n: usize, verbose: bool) -> Result<()> {
    println!("== bench ipam: {n} Services without address created at once (svc_election, 3 nodes)");
    let b = prepare(vipd, verbose)?;

    let seen: Mutex<BTreeMap<usize, Seen>> = Mutex::new(BTreeMap::new());
    let stop = AtomicBool::new(false);
    let pending = AtomicUsize::new(0);
    let all_done: OnceLock<Instant> = OnceLock::new();
    let created: Vec<OnceLock<Instant>> = (0..n).map(|_| OnceLock::new()).collect();
    let answered: Vec<OnceLock<Instant>> = (0..n).map(|_| OnceLock::new()).collect();
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let limit = Duration::from_secs(60 + n as u64 / 5);
    let rv = b.in_client(|| list_rv(&b))??;
    let t0 = Instant::now();
    let bench = &b;
    b.in_client(|| {
        std::thread::scope(|s| -> Result<()> {
            let b = bench;
            let (seen, stop) = (&seen, &stop);
            let watch = s.spawn(move || {
                let path = format!(
                    "/api/v1/namespaces/{}/services?watch=1&resourceVersion={rv}&timeoutSeconds=3600",
                    api::NAMESPACE
                );
                b.api.get_lines(&path, Duration::from_millis(200), |line| {
                    if let Some(l) = line {
                        apply_event(l, seen, Instant::now());
                    }
                    !stop.load(Ordering::Relaxed)
                })
            });
            let mut creators = Vec::new();
            for k in 0..CREATE_THREADS {
                let (created, answered, failures) = (&created, &answered, &failures);
                let pending = &pending;
                creators.push(s.spawn(move || -> Result<()> {
                    for i in (k..n).step_by(CREATE_THREADS) {
                        let name = format!("ipam-{i}");
                        if !b.create_from(&name, &no_address(&name).to_string()) {
                            if let Ok(mut f) = failures.lock() {
                                f.push(format!("{name}: create failed"));
                            }
                            continue;
                        }
                        let at = Instant::now();
                        let _ = created[i].set(at);
                        pending.fetch_add(1, Ordering::SeqCst);
                        std::thread::Builder::new()
                            .name(format!("poll-{i}"))
                            .stack_size(128 * 1024)
                            .spawn_scoped(s, move || {
                                let r = wait_and_poll(seen, i, at + limit);
                                match r {
                                    Ok(a) => {
                                        let _ = answered[i].set(a);
                                    }
                                    Err(e) => {
                                        if let Ok(mut f) = failures.lock() {
                                            f.push(format!("{name}: {e:#}"));
                                        }
                                    }
                                }
                                pending.fetch_sub(1, Ordering::SeqCst);
                            })
                            .context("spawn a poller thread")?;
                    }
                    Ok(())
                }));
            }
            for c in creators {
                c.join().map_err(|_| anyhow!("creator thread panicked"))??;
            }
            while pending.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = all_done.set(Instant::now());
            // Writes that follow the answers (status) still count: 3 s more of the watch.
            std::thread::sleep(Duration::from_secs(3));
            stop.store(true, Ordering::Relaxed);
            match watch.join() {
                Ok(Ok(200)) => Ok(()),
                Ok(Ok(status)) => bail!("watch services: HTTP {status}"),
                Ok(Err(e)) => Err(anyhow!("watch services: {e}")),
                Err(_) => bail!("watch thread panicked"),
            }
        })
    })??;
    let all_done = all_done.get().copied().unwrap_or_else(Instant::now);
    print_figures(&b, n, t0, all_done, &created, &answered, &seen, &failures)?;
    b.finish();
    Ok(())
}

/// Waits until the watch saw Service `i`'s address, then polls it until it answers;
/// returns when it answered.
fn wait_and_poll(
    seen: &Mutex<BTreeMap<usize, Seen>>,
    i: usize,
    deadline: Instant,
) -> Result<Instant> {
    let addr = loop {
        let w = seen
            .lock()
            .ok()
            .and_then(|s| s.get(&i).and_then(|s| s.written));
        if let Some((_, a)) = w {
            break a;
        }
        if Instant::now() >= deadline {
            bail!("no address written");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(poll_until_answer(SocketAddr::new(addr, 80), deadline)?.at)
}

/// resourceVersion of the Service list in `default` (inside a lab namespace).
fn list_rv(b: &Bench) -> Result<String> {
    let r = b.api.request(
        "GET",
        &format!("/api/v1/namespaces/{}/services", api::NAMESPACE),
        None,
    )?;
    if r.status != 200 {
        bail!("list services: HTTP {}: {}", r.status, r.body);
    }
    let v: Value = serde_json::from_str(&r.body).context("service list JSON")?;
    Ok(v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Waits (up to 30 s) for a holder of Lease `kube-system/kube-vip-cloud-controller`.
fn wait_ipam_holder(b: &Bench) -> Result<String> {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{IPAM_LEASE}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = b.lab.api_request("GET", &path, None)
            && r.status == 200
            && let Ok(v) = serde_json::from_str::<Value>(&r.body)
            && let Some(h) = v["spec"]["holderIdentity"].as_str()
            && !h.is_empty()
        {
            return Ok(h.to_string());
        }
        if Instant::now() > deadline {
            bail!("Lease kube-system/{IPAM_LEASE} has no holder after 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Events in `default` about Services `ipam-*`, counted by reason (each Event's `count`).
fn events_by_reason(b: &Bench) -> Result<BTreeMap<String, u64>> {
    let r = b.lab.api_request(
        "GET",
        &format!("/api/v1/namespaces/{}/events", api::NAMESPACE),
        None,
    )?;
    if r.status != 200 {
        bail!("list events: HTTP {}: {}", r.status, r.body);
    }
    let v: Value = serde_json::from_str(&r.body).context("event list JSON")?;
    let mut out = BTreeMap::new();
    for e in v["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let about = &e["involvedObject"];
        if about["kind"] != "Service" || about["name"].as_str().and_then(index).is_none() {
            continue;
        }
        let reason = e["reason"].as_str().unwrap_or("?").to_string();
        *out.entry(reason).or_default() += e["count"].as_u64().unwrap_or(1).max(1);
    }
    Ok(out)
}

/// Prints the run's figures.
#[allow(clippy::too_many_arguments)]
fn print_figures(
    b: &Bench,
    n: usize,
    t0: Instant,
    all_done: Instant,
    created: &[OnceLock<Instant>],
    answered: &[OnceLock<Instant>],
    seen: &Mutex<BTreeMap<usize, Seen>>,
    failures: &Mutex<Vec<String>>,
) -> Result<()> {
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let mut to_written = Vec::new();
    let mut to_answer = Vec::new();
    let (mut spec_w, mut host_w, mut status_w, mut other_w) = (0u64, 0u64, 0u64, 0u64);
    let mut allocated = 0usize;
    let mut addrs = std::collections::BTreeSet::new();
    for (i, c) in created.iter().enumerate() {
        let Some(c) = c.get() else { continue };
        if let Some(s) = seen.get(&i) {
            spec_w += s.spec_writes;
            host_w += s.viphost_writes;
            status_w += s.status_writes;
            other_w += s.other_writes;
            if let Some((w, a)) = s.written {
                allocated += 1;
                addrs.insert(a);
                to_written.push(ms(w.saturating_duration_since(*c)));
            }
        }
        if let Some(a) = answered[i].get() {
            to_answer.push(ms(a.saturating_duration_since(*c)));
        }
    }
    let created_n = created.iter().filter(|c| c.get().is_some()).count();
    println!(
        "  created {created_n}/{n}; address written {allocated} ({} distinct); answered {}/{n}; all done {:.2} s after the first create call",
        addrs.len(),
        to_answer.len(),
        all_done.duration_since(t0).as_secs_f64()
    );
    println!(
        "  per Service, create -> address written: {}",
        summary_ms(&to_written)
    );
    println!(
        "  per Service, create -> first answer:    {}",
        summary_ms(&to_answer)
    );
    let per = |w: u64| w as f64 / allocated.max(1) as f64;
    println!(
        "  API writes to the Services (watch MODIFIED events until 3 s after the last answer), per allocation: {:.2} ({}) total = {:.2} address (metadata/spec) + {:.2} vipHost annotation + {:.2} status + {:.2} other",
        per(spec_w + host_w + status_w + other_w),
        spec_w + host_w + status_w + other_w,
        per(spec_w),
        per(host_w),
        per(status_w),
        per(other_w),
    );
    match events_by_reason(b) {
        Ok(ev) => {
            let total: u64 = ev.values().sum();
            println!(
                "  Events about the Services: {total} ({:.2} per allocation) {ev:?}",
                per(total)
            );
        }
        Err(e) => println!("  Events about the Services: {e:#}"),
    }
    let fails = failures.lock().map(|f| f.clone()).unwrap_or_default();
    if !fails.is_empty() {
        println!("  {} failures, first ones:", fails.len());
        for f in fails.iter().take(5) {
            println!("    {f}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_service_lists() {
        assert_eq!(Options::parse(&[]).unwrap().services, vec![1, 500]);
        let o = Options::parse(&["--services", "1,200", "--no-build"]).unwrap();
        assert_eq!(o.services, vec![1, 200]);
        assert!(!o.build);
        assert!(Options::parse(&["--services", "551"]).is_err());
        assert!(Options::parse(&["--services", ""]).is_err());
    }

    #[test]
    fn classifies_writes_and_first_address() {
        let seen = Mutex::new(BTreeMap::new());
        let t = Instant::now();
        let svc = |rv: &str, ann: Option<&str>, ingress: bool| {
            let mut s = no_address("ipam-3");
            s["metadata"]["resourceVersion"] = json!(rv);
            if let Some(a) = ann {
                s["metadata"]["annotations"] = json!({ ANN: a });
            }
            if ingress {
                s["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}});
            }
            s
        };
        let ev = |k: &str, o: Value| json!({"type": k, "object": o}).to_string();
        apply_event(&ev("ADDED", svc("1", None, false)), &seen, t);
        apply_event(
            &ev("MODIFIED", svc("2", Some("198.51.100.1"), false)),
            &seen,
            t,
        );
        apply_event(
            &ev("MODIFIED", svc("3", Some("198.51.100.1"), true)),
            &seen,
            t,
        );
        apply_event(&ev("ADDED", no_address("other")), &seen, t);
        let s = seen.lock().unwrap();
        assert_eq!(s.len(), 1);
        let s = &s[&3];
        assert_eq!((s.spec_writes, s.status_writes), (1, 1));
        assert_eq!((s.viphost_writes, s.other_writes), (0, 0));
        assert_eq!(
            s.written.map(|w| w.1),
            Some("198.51.100.1".parse().unwrap())
        );
    }
}
