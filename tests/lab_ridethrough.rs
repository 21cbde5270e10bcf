//! S46, S51: lab tests of `svc_ridethrough`: Service VIPs ride through API server outages
//! (S46), and a holder cut off from the API alone hands over when asked (S51). vipd runs on
//! node-a/b/c in Services mode with per-Service leases against the real kube-apiserver; the
//! API server is frozen (SIGSTOP) and stopped while a watcher samples every node's eth0
//! every 100 ms; the holder's own path to the API server is cut while a client probe and an
//! ARP watcher measure the failover.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use support::*;
use xtask::lab::{ControlPlaneProcess, Lab, LabOptions, LabProcess};

const VIPS: [(&str, &str); 3] = [
    ("ride-a", "192.0.2.30"),
    ("ride-b", "192.0.2.31"),
    ("ride-c", "192.0.2.32"),
];
const LIMIT: Duration = Duration::from_secs(30);

/// The peer key Secret and the Node objects (the membership) `svc_ridethrough` needs.
fn prepare(lab: &Lab) {
    lab.register_nodes(&NODES).expect("create the Node objects");
    lab.create_peer_key_secret()
        .expect("create the peer key Secret");
}

fn start(lab: &Lab, ride: bool) -> Vec<LabProcess> {
    NODES
        .iter()
        .map(|n| {
            start_vipd_services(
                lab,
                n,
                true,
                &[("svc_ridethrough", if ride { "true" } else { "false" })],
            )
        })
        .collect()
}

/// Creates the Services and waits until each VIP has one holder whose lease names it;
/// returns VIP -> holder.
fn services_held(lab: &Lab) -> BTreeMap<&'static str, String> {
    for (name, ip) in VIPS {
        create_service(
            lab,
            &service_json(name, Some(ip), None, &[(80, "TCP")], false),
        );
    }
    let mut out = BTreeMap::new();
    for (name, ip) in VIPS {
        let h = single_holder(lab, ip, LIMIT);
        wait_until(&format!("lease of {name} names {h}"), LIMIT, || {
            lease_holder(lab, "default", &format!("kubevip-{name}")).as_deref() == Some(&h)
        });
        out.insert(ip, h);
    }
    out
}

/// Samples which nodes carry each VIP every 100 ms on its own thread (the API server may
/// be down; this reads the nodes' interfaces only).
struct Watcher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<String>>,
}

impl Watcher {
    /// Starts sampling; every sample where a VIP is not on exactly its node in `want` is a
    /// violation.
    fn start(lab: &Lab, want: &BTreeMap<&'static str, String>) -> Watcher {
        let namespaces: Vec<(String, String)> = NODES
            .iter()
            .map(|n| (n.to_string(), lab.ns_name(n).expect("ns name")))
            .collect();
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(ip, n)| (ip.to_string(), n.clone()))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut violations = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                let mut on: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for (node, ns) in &namespaces {
                    let out = std::process::Command::new("ip")
                        .args(["-n", ns, "-j", "addr", "show", "dev", "eth0"])
                        .output()
                        .expect("ip addr");
                    let v: serde_json::Value =
                        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
                    for a in v
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|l| l["addr_info"].as_array().into_iter().flatten())
                    {
                        if let Some(ip) = a["local"].as_str() {
                            on.entry(ip.to_string()).or_default().push(node.clone());
                        }
                    }
                }
                for (ip, node) in &want {
                    let got = on.get(ip).cloned().unwrap_or_default();
                    if got != [node.clone()] {
                        violations.push(format!(
                            "{} ms: {ip} on {got:?}, expected only on {node}",
                            t0.elapsed().as_millis()
                        ));
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            violations
        });
        Watcher { stop, thread }
    }

    /// Samples 8 s more (the recovery after an outage), stops, and asserts that every
    /// sample was clean (dumping the vipd logs otherwise).
    fn finish_clean(self, what: &str, procs: &[LabProcess]) {
        std::thread::sleep(Duration::from_secs(8));
        self.stop.store(true, Ordering::SeqCst);
        let v = self.thread.join().expect("watcher thread");
        if !v.is_empty() {
            dump(&procs.iter().collect::<Vec<_>>());
        }
        assert!(
            v.is_empty(),
            "{what}: {} violations: {:?}",
            v.len(),
            &v[..v.len().min(20)]
        );
    }
}

/// The leases' (holder, renewTime) now.
fn leases_now(lab: &Lab) -> BTreeMap<&'static str, (String, String)> {
    VIPS.iter()
        .map(|(name, _)| {
            let l = lease(lab, "default", &format!("kubevip-{name}")).expect("lease");
            (
                *name,
                (
                    l["spec"]["holderIdentity"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    l["spec"]["renewTime"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ),
            )
        })
        .collect()
}

/// After an outage: every lease still names the holder it named before and is renewed by
/// it again (its renewTime moves past the one before).
fn assert_renewed_by_same_holders(lab: &Lab, before: &BTreeMap<&'static str, (String, String)>) {
    wait_until("every lease renewed by its holder", LIMIT, || {
        leases_now(lab)
            .iter()
            .all(|(name, (h, t))| before[name].0 == *h && before[name].1 != *t)
    });
    let now = leases_now(lab);
    for (name, (h, _)) in &now {
        assert_eq!(*h, before[name].0, "lease of {name} changed holder");
    }
}

fn wait_for_peers(procs: &[LabProcess]) {
    for p in procs {
        wait_until("peer membership of three nodes", LIMIT, || {
            p.log()
                .lines()
                .any(|l| l.contains("peer protocol: membership") && l.contains("node-c"))
        });
    }
    // Heartbeats flow (W = 600 ms) before the outage starts.
    std::thread::sleep(Duration::from_secs(2));
}

/// Issue 12, first "Done when": the API server frozen for 6 s, then stopped for 30 s; no
/// Service VIP is removed or moved (sampled every 100 ms through each outage and the
/// recovery after it), no lease changes holder, and afterwards the same holders renew.
/// While riding, a holder's `/readyz` is ready and names its riding lease(s).
///
/// Issue 27: then etcd frozen for 20 s (SIGSTOP: the API server answers, but neither
/// `/readyz` nor any write succeeds); the same holds, and when etcd resumes the holders
/// recognise their own late-committed renewals (no duplicate-identity report). Throughout the
/// three outages an ARP watcher (ns api, every 50 ms) sees the probed VIP answered by one MAC
/// only, no lease changes holder or counts a transition, and no holder finds its VIP
/// missing (its lifetime refreshed while riding, `holder::REFRESH_BELOW_SECS`). The
/// Service timings are 5/3/1, what `vipd manifest --servicesRideThrough` writes.
#[test]
fn s46_service_vips_ride_through_api_freeze_and_stop() {
    let Some(mut lab) = lab(
        "ridethrough",
        LabOptions {
            http_backends: true,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    prepare(&lab);
    let procs = start(&lab, true);
    wait_for_peers(&procs);
    let want = services_held(&lab);
    let before = leases_now(&lab);
    let transitions_before = transitions(&lab);

    // A client probes one Service VIP through the outages (every 20 ms over HTTP), and an
    // ARP watcher asks for it every 50 ms.
    let (probe_ip, _) = want.iter().next().expect("a VIP");
    let probe_ip = probe_ip.to_string();
    let arp = lab
        .arp_watch_from_api(probe_ip.parse().expect("ip"), Duration::from_millis(50))
        .expect("arp watcher");

    // Frozen for 6 s.
    let pid = *lab.control_plane_pids().get(1).expect("apiserver pid");
    let pid = nix::unistd::Pid::from_raw(pid);
    let probe = start_http_probe(&lab, &probe_ip);
    std::thread::sleep(Duration::from_secs(1));
    let w = Watcher::start(&lab, &want);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    // Riding by 5 s (flags fade within 3.2 s): /readyz of a holder stays ready and names
    // the riding lease.
    std::thread::sleep(Duration::from_secs(5));
    let holder = want.values().next().expect("a holder").clone();
    let admin: std::net::SocketAddr = "127.0.0.1:2112".parse().expect("addr");
    let readyz = lab
        .http_get(&holder, admin, "/readyz", Duration::from_secs(2))
        .unwrap_or_else(|e| format!("admin endpoint error: {e}"));
    std::thread::sleep(Duration::from_secs(1));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    assert!(
        readyz.starts_with("ok\nriding-through: ") && readyz.contains("default/kubevip-ride-"),
        "{holder} /readyz while riding: {readyz}"
    );
    w.finish_clean("freeze", &procs);
    let freeze_gap = probe_gap_ms(probe);
    assert_renewed_by_same_holders(&lab, &before);
    let before = leases_now(&lab);

    // Stopped for 30 s, then started again (the watcher runs through the restart).
    let probe = start_http_probe(&lab, &probe_ip);
    std::thread::sleep(Duration::from_secs(1));
    let w = Watcher::start(&lab, &want);
    lab.restart_control_plane_after(
        ControlPlaneProcess::ApiServer,
        Duration::from_secs(30),
        Duration::from_secs(120),
    )
    .expect("restart the API server");
    w.finish_clean("stop", &procs);
    let stop_gap = probe_gap_ms(probe);
    assert_renewed_by_same_holders(&lab, &before);
    let before = leases_now(&lab);

    // etcd frozen for 20 s (the API server up).
    let etcd = nix::unistd::Pid::from_raw(*lab.control_plane_pids().first().expect("etcd pid"));
    let probe = start_http_probe(&lab, &probe_ip);
    std::thread::sleep(Duration::from_secs(1));
    let w = Watcher::start(&lab, &want);
    nix::sys::signal::kill(etcd, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP etcd");
    std::thread::sleep(Duration::from_secs(20));
    nix::sys::signal::kill(etcd, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT etcd");
    w.finish_clean("etcd freeze", &procs);
    let etcd_gap = probe_gap_ms(probe);
    let report = arp.stop().expect("arp watcher");
    let arp_gap = longest_unanswered_ms(&report);
    println!(
        "S46 figures: longest client probe gap through {probe_ip}: {freeze_gap:.0} ms (API frozen 6 s), {stop_gap:.0} ms (API stopped 30 s), {etcd_gap:.0} ms (etcd frozen 20 s); longest ARP silence {arp_gap} ms over the three; ARP responders {}",
        report.all_responders().len()
    );
    // The VIP stayed on its holder (the watcher above); the client's longest gap is a
    // figure (target 200 ms, printed), bounded here well below the 2 s drop of a VIP
    // without the option so that a loaded machine does not fail the test.
    for (what, gap) in [
        ("freeze", freeze_gap),
        ("stop", stop_gap),
        ("etcd freeze", etcd_gap),
    ] {
        assert!(
            gap < 1000.0,
            "client probe through {probe_ip} had a {gap:.0} ms gap during the API {what}"
        );
    }
    assert_eq!(
        report.all_responders().len(),
        1,
        "one MAC answers ARP for {probe_ip}"
    );
    assert!(
        arp_gap < 1000,
        "ARP for {probe_ip} unanswered for {arp_gap} ms"
    );
    assert_renewed_by_same_holders(&lab, &before);
    assert_eq!(transitions(&lab), transitions_before, "no lease moved");
    for (n, p) in NODES.iter().zip(&procs) {
        let log = p.log();
        assert!(
            !log.contains("VIP missing while leading"),
            "{n}: a VIP's lifetime ran out while riding: {}",
            log.lines()
                .filter(|l| l.contains("VIP missing while leading"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(
            !log.contains("duplicate identity"),
            "{n} reported a duplicate identity: {}",
            log.lines()
                .filter(|l| l.contains("duplicate identity"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(
        procs
            .iter()
            .any(|p| p.log().lines().any(|l| l.contains("riding through"))),
        "the holders rode through"
    );
}

/// Every Service lease's `leaseTransitions`.
fn transitions(lab: &Lab) -> Vec<i64> {
    VIPS.iter()
        .map(|(name, _)| {
            lease(lab, "default", &format!("kubevip-{name}")).expect("lease")["spec"]
                ["leaseTransitions"]
                .as_i64()
                .unwrap_or_default()
        })
        .collect()
}

/// The longest run of ARP watcher slots nobody answered, in ms.
fn longest_unanswered_ms(r: &xtask::lab::WatchReport) -> u128 {
    let mut longest = 0;
    let mut run = 0;
    for s in &r.slots {
        run = if s.responders.is_empty() { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    longest * r.interval.as_millis()
}

/// Issue 27: with the defaults (ride-through on) but no key Secret, vipd starts, announces
/// its Service, warns exactly once naming the Secret and the command that creates it, and
/// `/readyz` says `ride-through: keyless`. Without the option a Service VIP is removed at
/// the renew deadline of an API freeze, as before.
#[test]
fn s46_without_the_option_service_vips_drop_during_an_api_freeze() {
    let Some(lab) = lab("ridethrough-off", LabOptions::default()) else {
        return;
    };
    let mut keyless = start_vipd_services(&lab, "node-a", true, &[]);
    create_service(
        &lab,
        &service_json("keyless", Some("192.0.2.33"), None, &[(80, "TCP")], false),
    );
    wait_until("the keyless node holds its Service", LIMIT, || {
        holders(&lab, "192.0.2.33") == ["node-a"]
    });
    assert!(
        keyless.try_wait().expect("wait").is_none(),
        "vipd runs without the key"
    );
    let log = keyless.log();
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("vipd-peer-key"))
        .collect();
    assert_eq!(warns.len(), 1, "one WARN about the key:\n{log}");
    assert!(
        warns[0].contains("kube-system/vipd-peer-key")
            && warns[0].contains("kubectl create secret generic vipd-peer-key"),
        "{}",
        warns[0]
    );
    let admin: std::net::SocketAddr = "127.0.0.1:2112".parse().expect("addr");
    let ready = lab
        .http_get("node-a", admin, "/readyz", Duration::from_secs(2))
        .unwrap_or_else(|e| format!("admin endpoint error: {e}"));
    assert!(ready.contains("ride-through: keyless"), "{ready}");
    drop(keyless);
    delete_service(&lab, "keyless");
    prepare(&lab);
    let _procs = start(&lab, false);
    let want = services_held(&lab);
    let (ip, _) = want.iter().next().expect("a VIP");
    let pid = *lab.control_plane_pids().get(1).expect("apiserver pid");
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let dropped = (0..60).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        holders(&lab, ip).is_empty()
    });
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    assert!(
        dropped,
        "{ip} must be removed within 6 s of the freeze without ride-through"
    );
}

/// nftables table S51 adds in the holder's namespace (not vipd's own table).
const CUT_TABLE: &str = "s47_api_cut";

/// Drops, in `node`'s namespace, every packet to and from the API server's port 6443 (both
/// directions: the node's API calls time out); the segment (ARP, peer frames) is untouched.
fn cut_api(lab: &Lab, node: &str) {
    let script = format!(
        "add table inet {CUT_TABLE}; \
         add chain inet {CUT_TABLE} input {{ type filter hook input priority -10; }}; \
         add chain inet {CUT_TABLE} output {{ type filter hook output priority -10; }}; \
         add rule inet {CUT_TABLE} input ip saddr {api} tcp sport 6443 drop; \
         add rule inet {CUT_TABLE} output ip daddr {api} tcp dport 6443 drop",
        api = xtask::lab::API_IP
    );
    lab.exec(node, "nft", &[script.as_str()])
        .expect("nft: cut the node from the API server");
}

/// What one S51 run saw.
struct CutRun {
    procs: Vec<LabProcess>,
    old: String,
    new: String,
    report: xtask::lab::WatchReport,
}

/// Starts vipd on the three nodes (`svc_ridethrough` = `ride`), one Service, a client probe
/// (`vipd probe http://VIP/` every 20 ms from ns client) and an ARP watcher (every 20 ms
/// from ns api); cuts the holder's path to the API server and waits for another node to
/// carry the VIP, then 3 s more.
fn cut_holder_from_api(lab: &Lab, ride: bool) -> CutRun {
    prepare(lab);
    let procs = start(lab, ride);
    if ride {
        wait_for_peers(&procs);
    }
    let (name, ip) = VIPS[0];
    create_service(
        lab,
        &service_json(name, Some(ip), None, &[(80, "TCP")], false),
    );
    let old = single_holder(lab, ip, LIMIT);
    wait_until("the lease names the holder", LIMIT, || {
        lease_holder(lab, "default", &format!("kubevip-{name}")).as_deref() == Some(old.as_str())
    });
    let arp = lab
        .arp_watch_from_api(ip.parse().expect("ip"), Duration::from_millis(20))
        .expect("arp watcher");
    let probe = start_http_probe(lab, ip);
    std::thread::sleep(Duration::from_secs(2));
    cut_api(lab, &old);
    let t0 = Instant::now();
    let new = wait_for_takeover(lab, ip, &old, "takeover after the API cut", LIMIT);
    let takeover = t0.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    let gap_ms = probe_gap_ms(probe);
    let report = arp.stop().expect("arp watcher");
    println!(
        "S51 (svc_ridethrough={ride}): holder {old} cut off from the API; {new} carries {ip} after {} ms; client probe gap {gap_ms:.0} ms; max responders per 20 ms slot {}",
        takeover.as_millis(),
        report.max_simultaneous_responders()
    );
    CutRun {
        procs,
        old,
        new,
        report,
    }
}

fn log_of(procs: &[LabProcess], node: &str) -> String {
    procs[NODES.iter().position(|n| *n == node).expect("node")].log()
}

/// S51 (issue 12, second "Done when"): the holder's own path to the API server is cut (both
/// directions of 6443 dropped in its namespace) while the segment works. The nodes that
/// reach the API ask it over the peer protocol; it drops the VIP at once and says
/// `Released`, and one of them takes the lease before it expires. Never two responders (ARP
/// watcher every 20 ms); the client probe's gap and the time to takeover are printed (no
/// tight assert: a loaded machine stretches them; compare with the run without the option
/// below).
#[test]
fn s51_holder_cut_off_from_the_api_hands_over_on_request() {
    let Some(lab) = lab(
        "ridethrough-cut",
        LabOptions {
            http_backends: true,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    let r = cut_holder_from_api(&lab, true);
    let old_log = log_of(&r.procs, &r.old);
    let new_log = log_of(&r.procs, &r.new);
    let ok = r.report.max_simultaneous_responders() <= 1
        && old_log.contains("handing over")
        && new_log.contains("handed the lease over");
    if !ok {
        dump(&r.procs.iter().collect::<Vec<_>>());
    }
    assert!(
        r.report.max_simultaneous_responders() <= 1,
        "two responders: {:?}",
        r.report.multi_responder_intervals()
    );
    assert!(
        old_log.contains("handing over"),
        "the cut holder was asked and handed over"
    );
    assert!(
        new_log.contains("handed the lease over"),
        "the new holder took a handed-over lease (not an expired one)"
    );
    wait_until("the lease names the new holder", LIMIT, || {
        lease_holder(&lab, "default", "kubevip-ride-a").as_deref() == Some(r.new.as_str())
    });
    assert_held_by_after(&lab, VIPS[0].1, &r.new, Duration::from_secs(2));
}

/// S51 without `svc_ridethrough` (today's behaviour, for the comparison the scenario asks
/// for): the cut holder steps down at its renew deadline and another node takes the lease
/// when it expires. Never two responders; the figures are printed.
#[test]
fn s51_without_the_option_the_cut_holder_steps_down_and_the_lease_expires() {
    let Some(lab) = lab(
        "ridethrough-cut-off",
        LabOptions {
            http_backends: true,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    let r = cut_holder_from_api(&lab, false);
    assert!(
        r.report.max_simultaneous_responders() <= 1,
        "two responders: {:?}",
        r.report.multi_responder_intervals()
    );
}

/// `vipd_peer_frames_total{result="bad_mac"}` of `node` (0 when absent).
fn bad_mac_frames(lab: &Lab, node: &str) -> u64 {
    let admin: std::net::SocketAddr = "127.0.0.1:2112".parse().expect("addr");
    let body = lab
        .http_get(node, admin, "/metrics", Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("{node} /metrics: {e}"));
    body.lines()
        .find(|l| l.starts_with("vipd_peer_frames_total{") && l.contains("result=\"bad_mac\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Issue 12: forged heartbeats are ignored. A host on the segment (ns client) without the
/// key sends, for 3 s, frames that would move the lease if they were believed: the holder's
/// `Released` for the lease's current resourceVersion (a candidate would take it at once), a
/// `HandOverRequest` to the holder, and heartbeats of the other two nodes saying they do not
/// reach the API, all signed with another key. Every node counts them as `bad_mac`, and the
/// lease and the VIP stay where they were.
#[test]
fn s46_forged_peer_frames_are_ignored_and_counted() {
    use vipd::net::{Kernel, NetlinkKernel};
    use vipd::peer::socket::PeerSocket;
    use vipd::peer::wire::{Encoder, Flags, HeldLease, Kind, LeaseRef, Message, PeerKey};

    let Some(lab) = lab("ridethrough-forged", LabOptions::default()) else {
        return;
    };
    prepare(&lab);
    let procs = start(&lab, true);
    wait_for_peers(&procs);
    let (name, ip) = VIPS[0];
    create_service(
        &lab,
        &service_json(name, Some(ip), None, &[(80, "TCP")], false),
    );
    let lease_name = format!("kubevip-{name}");
    let holder = single_holder(&lab, ip, LIMIT);
    wait_until("the lease names the holder", LIMIT, || {
        lease_holder(&lab, "default", &lease_name).as_deref() == Some(holder.as_str())
    });
    let before: Vec<u64> = NODES.iter().map(|n| bad_mac_frames(&lab, n)).collect();
    let transitions = |lab: &Lab| {
        lease(lab, "default", &lease_name).expect("lease")["spec"]["leaseTransitions"].as_i64()
    };
    let transitions_before = transitions(&lab);

    let wall_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64
    };
    let lease_ref = LeaseRef {
        namespace: "default".into(),
        name: lease_name.clone(),
    };
    let others: Vec<&str> = NODES.iter().copied().filter(|n| *n != holder).collect();
    let mut sent = 0u64;
    let client = lab.netns_path("client").expect("client ns");
    xtask::lab::netns::run_in_netns(&client, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let link = rt
            .block_on(async {
                let k = NetlinkKernel::new().expect("netlink");
                k.link_by_name("eth0").await
            })
            .expect("client eth0");
        let socket = PeerSocket::open(&link).expect("peer socket in ns client");
        let forged = PeerKey::from_bytes(&[0x42; 32]).expect("key");
        let mut enc = Encoder::new(forged, 7);
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            let rv =
                lease(&lab, "default", &lease_name).expect("lease")["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
            let held = HeldLease {
                lease: lease_ref.clone(),
                term: 1,
                resource_version: rv,
            };
            let mut msgs = vec![
                Message {
                    kind: Kind::Released,
                    node: holder.clone(),
                    flags: Flags::default(),
                    membership: 0,
                    wall_ms: wall_ms(),
                    leases: vec![held.clone()],
                    target: None,
                },
                Message {
                    kind: Kind::HandOverRequest,
                    node: others[0].to_string(),
                    flags: Flags::default(),
                    membership: 0,
                    wall_ms: wall_ms(),
                    leases: vec![held.clone()],
                    target: Some(holder.clone()),
                },
            ];
            for o in &others {
                msgs.push(Message {
                    kind: Kind::Heartbeat,
                    node: o.to_string(),
                    flags: Flags::default(),
                    membership: 0,
                    wall_ms: wall_ms(),
                    leases: vec![],
                    target: None,
                });
            }
            for m in &msgs {
                for frame in enc.encode(m).expect("encode") {
                    socket.send(&frame).expect("send a forged frame");
                    sent += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .expect("forger in ns client");

    // Counted by every node (the counters are read after the frames had time to arrive).
    std::thread::sleep(Duration::from_millis(500));
    for (i, n) in NODES.iter().enumerate() {
        let counted = bad_mac_frames(&lab, n) - before[i];
        assert!(
            counted >= sent,
            "{n} counted {counted} bad_mac frames of the {sent} forged ones"
        );
    }
    // Nothing moved: the same holder, no lease transition, the VIP on that node only.
    assert_eq!(
        lease_holder(&lab, "default", &lease_name).as_deref(),
        Some(holder.as_str())
    );
    assert_eq!(transitions(&lab), transitions_before);
    assert_eq!(holders(&lab, ip), vec![holder.clone()]);
    println!("S46 (forged): {sent} forged frames sent, counted as bad_mac by every node");
    drop(procs);
}
