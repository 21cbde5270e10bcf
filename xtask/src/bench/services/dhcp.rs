//! `cargo xtask bench services --scenario dhcp`: DHCP mode (issue 13) against the lab's
//! dnsmasq. Figures, not pass/fail; docs/services-bench.md records a run against the
//! issue's targets (bring-up p95 <= 300 ms, RSS <= 20 MB with 50 DHCP Services, each
//! renewed on time).
//!
//! dnsmasq runs in ns `dhcp` with the bench's own pool [`POOL_START`]-[`POOL_END`] (71
//! addresses; the lab tests' 192.0.2.200-220 has only 21) and the lab's 120 s lease (T1 at
//! 60 s). Every Service is `type: LoadBalancer` with `kube-vip.io/loadbalancerIPs: 0.0.0.0`
//! (DHCP), port 80/TCP. vipd runs on node-a, node-b and node-c as in the other scenarios,
//! (a `0.0.0.0` Service asks DHCP with no option, as in kube-vip).
//!
//! 1. **bring-up** (a lab with `svc_election=true`: one Lease per Service): N Services
//!    (default [`DEFAULT_BRINGUP`]) created one at a time. For each, an ARP prober in ns
//!    `client` asks for every pool address not leased yet, one broadcast request per address
//!    every [`PROBE_PERIOD`]; the figure is the time from the create call's return to the
//!    round whose request got the first answer (so within one period of the truth). The
//!    answering MAC and address are then checked against the Service's
//!    `kube-vip.io/hwaddr` annotation and `status.loadBalancer.ingress[0].ip`.
//! 2. **held** (a new lab with `svc_election=false`: one global lease
//!    `kube-system/plndr-svcs-lock`, Harvester's setting, so its holder runs every DHCP
//!    client): [`HELD`] Services created one at a time the same way (their bring-up is
//!    printed too). The holder's VmRSS is printed before the first Service, once all are
//!    `bound` (`vipd_dhcp_state`), and after every lease was renewed. Renewals are read
//!    from dnsmasq's lease file: a Service's lease expiry moving from `E0` to `E1` means an
//!    ACK at `E1 - 120 s`; its T1 was `E0 - 60 s`, so `E1 - E0 - 60 s` is how late (or
//!    early) the renewal was, to a second. vipd's own `vipd_dhcp_events_total` (renewed,
//!    failed, lost) and `vipd_dhcp_lease_expiry_timestamp_seconds` are printed beside them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use xtask::lab::{self, ArpRoundProber, DHCP_LEASE_SECS, DnsmasqOptions, MacAddr, NODES};

use super::NAMESPACE;
use super::context::Bench;
use crate::bench::harness::text::or_none;
use crate::bench::stats::{ms, summary_ms};

/// First address of the bench's dnsmasq pool.
pub const POOL_START: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 150);
/// Last address of the bench's dnsmasq pool (the lab tests' pool ends here too).
pub const POOL_END: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 220);
/// Default number of Services in the bring-up part.
pub const DEFAULT_BRINGUP: usize = 20;
/// DHCP Services held by one node in the second part.
pub const HELD: usize = 50;
/// Period of the ARP prober's rounds (one request per free pool address each).
pub const PROBE_PERIOD: Duration = Duration::from_millis(25);
/// How long each round collects answers.
pub const PROBE_WINDOW: Duration = Duration::from_millis(15);
/// How long a Service may take to answer before it counts as not answered.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Every address of the bench's pool, in order.
pub fn pool() -> Vec<Ipv4Addr> {
    (u32::from(POOL_START)..=u32::from(POOL_END))
        .map(Ipv4Addr::from)
        .collect()
}

/// Entry point of the scenario: the bring-up lab with `bringup` Services, then the lab with
/// [`HELD`] Services on one node.
///
/// # Errors
/// A lab, dnsmasq or vipd that cannot start, or API calls that fail.
pub fn run(vipd: &Path, bringup: usize, verbose: bool) -> Result<()> {
    println!(
        "== bench services: dhcp (dnsmasq pool {POOL_START}-{POOL_END}, lease {DHCP_LEASE_SECS} s; answers = ARP from ns client)"
    );
    bringup_part(vipd, bringup, verbose)?;
    held_part(vipd, verbose)
}

/// A lab with vipd in DHCP mode on every node (`svc_election` as given) and the bench's
/// dnsmasq running.
fn start(vipd: &Path, verbose: bool, election: bool) -> Result<Bench> {
    let b = Bench::start_with(
        vipd,
        verbose,
        &[("svc_election", if election { "true" } else { "false" })],
    )?;
    b.lab.start_dnsmasq(&DnsmasqOptions {
        range: (POOL_START, POOL_END),
        ..DnsmasqOptions::default()
    })?;
    Ok(b)
}

fn bringup_part(vipd: &Path, n: usize, verbose: bool) -> Result<()> {
    println!("  -- bring-up: {n} DHCP Services one at a time, svc_election=true, 3 nodes");
    let b = start(vipd, verbose, true)?;
    let names: Vec<String> = (0..n).map(|i| format!("dhcp-{i}")).collect();
    let run = create_one_at_a_time(&b, &names)?;
    print_bringup(&b, &run)?;
    for (node, s) in b.samples() {
        println!("    {node}: {}", s.line());
    }
    b.finish();
    Ok(())
}

fn held_part(vipd: &Path, verbose: bool) -> Result<()> {
    println!(
        "  -- held: {HELD} DHCP Services on one node, svc_election=false (global lease), 3 nodes"
    );
    let b = start(vipd, verbose, false)?;
    // vipd campaigns for the global lease once there is a Service to serve: sample every
    // node now, keep the holder's sample.
    let idle = b.samples();
    let names: Vec<String> = (0..HELD).map(|i| format!("held-{i}")).collect();
    let run = create_one_at_a_time(&b, &names)?;
    print_bringup(&b, &run)?;
    let holder = wait_global_holder(&b)?;
    let idle = idle
        .into_iter()
        .find(|(n, _)| *n == holder)
        .map(|(_, s)| s)
        .unwrap_or_default();
    let bound_wait = Instant::now();
    let bound = wait_bound(&b, &holder, names.len(), Duration::from_secs(30))?;
    println!(
        "    vipd_dhcp_state on {holder}: {bound:?} ({:.1} s after the last answer)",
        bound_wait.elapsed().as_secs_f64()
    );
    let at_bound = b.sample(&holder);
    let addrs: BTreeMap<String, Ipv4Addr> = run
        .answers
        .iter()
        .map(|a| (a.name.clone(), a.addr))
        .collect();
    let renewals = wait_renewals(&b, &addrs)?;
    // Let vipd's own bookkeeping of the last renewal land before reading its metrics.
    std::thread::sleep(Duration::from_secs(2));
    let after = b.sample(&holder);
    print_renewals(&b, &holder, &addrs, &renewals)?;
    println!("    {holder} (holder of kube-system/plndr-svcs-lock):");
    println!("      before the Services:     {}", idle.line());
    println!("      {HELD} bound:                {}", at_bound.line());
    println!("      after the renewals:      {}", after.line());
    for node in NODES.iter().filter(|n| **n != holder) {
        println!("    {node}: {}", b.sample(node).line());
    }
    b.finish();
    Ok(())
}

// ----- bring-up ----------------------------------------------------------------------------

/// The first ARP answer for one Service.
#[derive(Debug, Clone)]
struct FirstAnswer {
    name: String,
    addr: Ipv4Addr,
    /// MACs that answered in that round (one, unless two hosts answered at once).
    macs: BTreeSet<MacAddr>,
    /// Create call returned -> the round that got the answer, ms.
    latency_ms: f64,
}

#[derive(Debug, Default)]
struct BringupRun {
    answers: Vec<FirstAnswer>,
    failures: Vec<String>,
}

/// Creates `names` one at a time; each gets a fresh prober of the pool addresses nobody
/// answered for yet, started before the create call, and is done at its first answer (or
/// after [`ANSWER_LIMIT`]).
fn create_one_at_a_time(b: &Bench, names: &[String]) -> Result<BringupRun> {
    let client = b.lab.netns_path("client")?;
    let mut run = BringupRun::default();
    let mut taken: BTreeSet<Ipv4Addr> = BTreeSet::new();
    for name in names {
        let free: Vec<Ipv4Addr> = pool().into_iter().filter(|a| !taken.contains(a)).collect();
        if free.is_empty() {
            run.failures
                .push(format!("{name}: no free pool address left"));
            break;
        }
        let epoch = Instant::now();
        let prober = ArpRoundProber::start(
            &client,
            lab::ETH,
            lab::CLIENT_V4,
            free,
            PROBE_PERIOD,
            PROBE_WINDOW,
            epoch,
        )?;
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        if !b.in_client(|| b.create(name, any))? {
            run.failures.push(format!("{name}: create failed"));
            continue;
        }
        let created = epoch.elapsed();
        let first = loop {
            let hit = prober
                .rounds_from(0)
                .into_iter()
                .find_map(|r| r.replies.into_iter().next().map(|(a, m)| (r.t, a, m)));
            if hit.is_some() || epoch.elapsed() > created + ANSWER_LIMIT {
                break hit;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        prober.stop()?;
        match first {
            Some((t, addr, macs)) => {
                let latency_ms = ms(t.saturating_sub(created));
                b.say(format!(
                    "{name}: {addr} from {macs:?} after {latency_ms:.0} ms"
                ));
                taken.insert(addr);
                run.answers.push(FirstAnswer {
                    name: name.clone(),
                    addr,
                    macs,
                    latency_ms,
                });
            }
            None => run.failures.push(format!(
                "{name}: no ARP answer for a free pool address within {} s",
                ANSWER_LIMIT.as_secs()
            )),
        }
    }
    Ok(run)
}

/// What the API says about a DHCP Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DhcpStatus {
    /// `status.loadBalancer.ingress[0].ip`.
    pub ingress: Option<String>,
    /// `kube-vip.io/hwaddr`.
    pub hwaddr: Option<String>,
    /// `kube-vip.io/vipHost`.
    pub vip_host: Option<String>,
}

/// Name -> [`DhcpStatus`] of every Service in a Service list (JSON). Pure.
pub fn dhcp_statuses(list: &serde_json::Value) -> BTreeMap<String, DhcpStatus> {
    let s = |v: &serde_json::Value| v.as_str().map(str::to_string);
    list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|svc| {
            let a = &svc["metadata"]["annotations"];
            Some((
                svc["metadata"]["name"].as_str()?.to_string(),
                DhcpStatus {
                    ingress: s(&svc["status"]["loadBalancer"]["ingress"][0]["ip"]),
                    hwaddr: s(&a["kube-vip.io/hwaddr"]),
                    vip_host: s(&a["kube-vip.io/vipHost"]),
                },
            ))
        })
        .collect()
}

/// GET `path` from the API server as admin (from ns client) as JSON.
fn api_get(b: &Bench, path: &str) -> Result<serde_json::Value> {
    let r = b.in_client(|| b.api.request("GET", path, None))?;
    b.stats.record(&format!("GET {path}"), &r);
    let r = r?;
    if r.status != 200 {
        bail!("GET {path}: HTTP {}: {}", r.status, r.body);
    }
    serde_json::from_str(&r.body).with_context(|| format!("GET {path}: JSON"))
}

/// Prints the bring-up figures and checks each first answer against the Service's status
/// and `kube-vip.io/hwaddr` (written by the holder shortly after it binds: up to 10 s).
fn print_bringup(b: &Bench, run: &BringupRun) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (statuses, mismatches) = loop {
        let statuses = dhcp_statuses(&api_get(
            b,
            &format!("/api/v1/namespaces/{NAMESPACE}/services"),
        )?);
        let mismatches: Vec<String> = run
            .answers
            .iter()
            .filter_map(|a| {
                let st = statuses.get(&a.name).cloned().unwrap_or_default();
                let mac_ok =
                    a.macs.len() == 1 && a.macs.iter().all(|m| Some(m.to_string()) == st.hwaddr);
                let ip_ok = st.ingress == Some(a.addr.to_string());
                (!(mac_ok && ip_ok)).then(|| {
                    format!(
                        "{}: answered {} from {:?}, status {:?} hwaddr {:?}",
                        a.name, a.addr, a.macs, st.ingress, st.hwaddr
                    )
                })
            })
            .collect();
        if mismatches.is_empty() || Instant::now() > deadline {
            break (statuses, mismatches);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let lat: Vec<f64> = run.answers.iter().map(|a| a.latency_ms).collect();
    let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
    for a in &run.answers {
        let h = statuses
            .get(&a.name)
            .and_then(|s| s.vip_host.clone())
            .unwrap_or_else(|| "?".into());
        *by_node.entry(h).or_default() += 1;
    }
    println!(
        "    created -> first ARP answer from the macvlan: {} (probe period {} ms)",
        summary_ms(&lat),
        PROBE_PERIOD.as_millis()
    );
    println!(
        "    holders (kube-vip.io/vipHost): {by_node:?}; not answered within {} s: {}; answer != status/hwaddr: {}",
        ANSWER_LIMIT.as_secs(),
        run.failures.len(),
        mismatches.len()
    );
    for f in run.failures.iter().chain(&mismatches).take(5) {
        println!("      {f}");
    }
    Ok(())
}

// ----- the held part -----------------------------------------------------------------------

/// The holder of the global services lease, once there is one (30 s).
fn wait_global_holder(b: &Bench) -> Result<String> {
    let path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/plndr-svcs-lock";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(l) = api_get(b, path)
            && let Some(h) = l["spec"]["holderIdentity"].as_str()
            && NODES.contains(&h)
        {
            return Ok(h.to_string());
        }
        if Instant::now() > deadline {
            bail!("no holder of kube-system/plndr-svcs-lock after 30 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Samples of metric `name` in a Prometheus text exposition: (labels, value) with the
/// labels as `key -> value`. Pure.
pub fn labelled_samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            if n != name {
                return None;
            }
            let labels = rest
                .strip_suffix('}')?
                .split(',')
                .filter(|kv| !kv.is_empty())
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.trim_matches('"').to_string()))
                })
                .collect();
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

/// How many Services are in each `vipd_dhcp_state` (series with value 1). Pure.
pub fn dhcp_state_counts(metrics: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (l, v) in labelled_samples(metrics, "vipd_dhcp_state") {
        if v == 1.0
            && let Some(s) = l.get("state")
        {
            *out.entry(s.clone()).or_default() += 1;
        }
    }
    out
}

/// Waits until `n` Services are `bound` on `holder` (vipd's metrics); returns the state
/// counts then, or at the limit.
fn wait_bound(
    b: &Bench,
    holder: &str,
    n: usize,
    limit: Duration,
) -> Result<BTreeMap<String, usize>> {
    let deadline = Instant::now() + limit;
    loop {
        let counts = dhcp_state_counts(&b.metrics_get(holder, "/metrics")?);
        if counts.get("bound").copied().unwrap_or(0) >= n || Instant::now() > deadline {
            return Ok(counts);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One Service's renewal as dnsmasq's lease file shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// Lease expiry after the first ACK (Unix seconds).
    pub first_expiry: u64,
    /// Lease expiry after the renewal, `None` when it did not move.
    pub renewed_expiry: Option<u64>,
}

impl Renewal {
    /// Renewal ACK time minus T1 (half the lease after the first ACK), seconds: 0 is on
    /// time; `None` without a renewal.
    pub fn late_s(&self, lease_secs: u64) -> Option<i64> {
        let e1 = self.renewed_expiry? as i64;
        let t1 = self.first_expiry as i64 - (lease_secs / 2) as i64;
        Some(e1 - lease_secs as i64 - t1)
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Reads every Service's first lease expiry from dnsmasq's lease file, then waits until
/// each moved (the renewal), up to 30 s past the latest T1.
fn wait_renewals(
    b: &Bench,
    addrs: &BTreeMap<String, Ipv4Addr>,
) -> Result<BTreeMap<String, Renewal>> {
    let expiry_of = || -> Result<BTreeMap<Ipv4Addr, u64>> {
        Ok(b.lab
            .dnsmasq_leases()?
            .into_iter()
            .map(|l| (l.addr, l.expires))
            .collect())
    };
    let first = expiry_of()?;
    let mut out: BTreeMap<String, Renewal> = BTreeMap::new();
    for (name, a) in addrs {
        let e0 = *first
            .get(a)
            .ok_or_else(|| anyhow!("{name}: {a} is not in dnsmasq's lease file"))?;
        out.insert(
            name.clone(),
            Renewal {
                first_expiry: e0,
                renewed_expiry: None,
            },
        );
    }
    let half = u64::from(DHCP_LEASE_SECS / 2);
    let last_t1 = out
        .values()
        .map(|r| r.first_expiry - half)
        .max()
        .unwrap_or(0);
    println!(
        "    waiting for the renewals at T1 (the last one in {} s)",
        last_t1.saturating_sub(unix_now())
    );
    while out.values().any(|r| r.renewed_expiry.is_none()) && unix_now() < last_t1 + 30 {
        std::thread::sleep(Duration::from_millis(500));
        let now = expiry_of()?;
        for (name, r) in out.iter_mut() {
            if r.renewed_expiry.is_none()
                && let Some(e) = addrs.get(name).and_then(|a| now.get(a))
                && *e > r.first_expiry
            {
                r.renewed_expiry = Some(*e);
            }
        }
    }
    Ok(out)
}

/// Prints the renewals from dnsmasq's lease file and vipd's DHCP metrics on `holder`.
fn print_renewals(
    b: &Bench,
    holder: &str,
    addrs: &BTreeMap<String, Ipv4Addr>,
    renewals: &BTreeMap<String, Renewal>,
) -> Result<()> {
    let lease = u64::from(DHCP_LEASE_SECS);
    let late: Vec<i64> = renewals.values().filter_map(|r| r.late_s(lease)).collect();
    let on_time = late.iter().filter(|l| l.abs() <= 2).count();
    let missing: Vec<&String> = renewals
        .iter()
        .filter(|(_, r)| r.renewed_expiry.is_none())
        .map(|(n, _)| n)
        .collect();
    println!(
        "    renewals (dnsmasq lease file): {}/{} renewed; ACK - T1: min {} s, max {} s; within 2 s of T1: {on_time}; not renewed: {missing:?}",
        late.len(),
        renewals.len(),
        late.iter().min().map_or("-".into(), |v| v.to_string()),
        late.iter().max().map_or("-".into(), |v| v.to_string()),
    );
    let metrics = b.metrics_get(holder, "/metrics")?;
    let mut events: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    let svc_key = |n: &str| format!("{NAMESPACE}/{n}");
    let ours: BTreeSet<String> = addrs.keys().map(|n| svc_key(n)).collect();
    for (l, v) in labelled_samples(&metrics, "vipd_dhcp_events_total") {
        if let (Some(s), Some(e)) = (l.get("service"), l.get("event"))
            && ours.contains(s)
        {
            let x = events.entry(e.clone()).or_default();
            x.0 += usize::from(v > 0.0);
            x.1 += v;
        }
    }
    let fmt: Vec<String> = events
        .iter()
        .map(|(e, (svcs, total))| format!("{e}: {total} in {svcs} Services"))
        .collect();
    println!(
        "    vipd_dhcp_events_total on {holder}: {}",
        or_none(&fmt, ", ")
    );
    // vipd's idea of each lease's end against dnsmasq's.
    let expiry: BTreeMap<String, f64> =
        labelled_samples(&metrics, "vipd_dhcp_lease_expiry_timestamp_seconds")
            .into_iter()
            .filter_map(|(l, v)| Some((l.get("service")?.clone(), v)))
            .collect();
    let diffs: Vec<f64> = renewals
        .iter()
        .filter_map(|(n, r)| {
            let dnsmasq = r.renewed_expiry.unwrap_or(r.first_expiry) as f64;
            Some((expiry.get(&svc_key(n))? - dnsmasq).abs())
        })
        .collect();
    println!(
        "    vipd_dhcp_lease_expiry_timestamp_seconds vs dnsmasq's expiry: {} Services, largest difference {:.0} s; state now {:?}",
        diffs.len(),
        diffs.iter().copied().fold(0.0, f64::max),
        dhcp_state_counts(&metrics)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_is_71_addresses_clear_of_the_lab_hosts() {
        let p = pool();
        assert_eq!(p.len(), 71);
        assert!(p.len() >= HELD && p.len() >= DEFAULT_BRINGUP);
        for host in [
            lab::CLIENT_V4,
            lab::GATEWAY_V4,
            lab::API_IP,
            lab::DHCP_SERVER_V4,
        ] {
            assert!(!p.contains(&host), "{host}");
        }
    }

    #[test]
    fn metrics_with_labels_are_parsed() {
        let text = "# TYPE vipd_dhcp_state gauge\n\
            vipd_dhcp_state{service=\"default/a\",state=\"bound\"} 1\n\
            vipd_dhcp_state{service=\"default/b\",state=\"bound\"} 1\n\
            vipd_dhcp_state{service=\"default/c\",state=\"renewing\"} 1\n\
            vipd_dhcp_state{service=\"default/c\",state=\"bound\"} 0\n\
            vipd_dhcp_events_total{service=\"default/a\",event=\"renewed\"} 2\n\
            vipd_up 1\n";
        assert_eq!(
            dhcp_state_counts(text),
            BTreeMap::from([("bound".to_string(), 2), ("renewing".to_string(), 1)])
        );
        let ev = labelled_samples(text, "vipd_dhcp_events_total");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].0["event"], "renewed");
        assert_eq!(ev[0].1, 2.0);
        assert_eq!(labelled_samples(text, "vipd_up")[0].1, 1.0);
        assert!(labelled_samples(text, "vipd_dhcp").is_empty());
    }

    #[test]
    fn renewal_lateness_is_ack_minus_t1() {
        // First ACK at 1000 (expiry 1120, T1 1060); renewed at 1061 (expiry 1181).
        let r = Renewal {
            first_expiry: 1120,
            renewed_expiry: Some(1181),
        };
        assert_eq!(r.late_s(120), Some(1));
        let early = Renewal {
            first_expiry: 1120,
            renewed_expiry: Some(1178),
        };
        assert_eq!(early.late_s(120), Some(-2));
        let none = Renewal {
            first_expiry: 1120,
            renewed_expiry: None,
        };
        assert_eq!(none.late_s(120), None);
    }

    #[test]
    fn statuses_come_from_the_service_list() {
        let list = serde_json::json!({"items": [
            {"metadata": {"name": "a", "annotations": {
                "kube-vip.io/hwaddr": "02:00:00:00:00:01", "kube-vip.io/vipHost": "node-b"}},
             "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.160"}]}}},
            {"metadata": {"name": "b"}, "status": {}}
        ]});
        let s = dhcp_statuses(&list);
        assert_eq!(s["a"].ingress.as_deref(), Some("192.0.2.160"));
        assert_eq!(s["a"].hwaddr.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(s["a"].vip_host.as_deref(), Some("node-b"));
        assert_eq!(s["b"], DhcpStatus::default());
    }
}
