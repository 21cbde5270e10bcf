//! A lab leaves nothing behind: no namespace with its prefix, no link in the root
//! namespace, no process, no directory, no registry record; also when the test thread that
//! owns it panics, and when the run that created it died (swept by the next run).
//!
//! Run as root: `cargo test --test lab_cleanup` (or `cargo xtask test`).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Every test here starts or sweeps labs, and `Lab::start` sweeps labs of dead runs: held
/// by each test so that no other test's sweep removes the fake dead lab of
/// `labs_of_dead_runs_are_swept` before its orphan has entered it.
static SWEEPS: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SWEEPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// True once `pid` runs in the network namespace mounted at /run/netns/`ns`.
fn in_netns(pid: i32, ns: &str) -> bool {
    let proc_ns = std::fs::metadata(format!("/proc/{pid}/ns/net"));
    let mounted = std::fs::metadata(format!("/run/netns/{ns}"));
    matches!((proc_ns, mounted), (Ok(a), Ok(b)) if a.ino() == b.ino() && a.dev() == b.dev())
}

use xtask::lab::{self, Lab, LabOptions};

#[derive(Debug, Clone)]
struct Footprint {
    prefix: String,
    dir: PathBuf,
    pids: Vec<i32>,
}

fn footprint(lab: &Lab, extra_pids: &[i32]) -> Footprint {
    let mut pids = lab.control_plane_pids();
    pids.extend_from_slice(extra_pids);
    Footprint {
        prefix: lab.prefix().to_string(),
        dir: lab.dir().to_path_buf(),
        pids,
    }
}

/// A process is "left" if it exists and is not a zombie (zombies run nothing; they only
/// wait for their parent to reap them).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.split_whitespace().next() != Some("Z"))
        })
        .unwrap_or(false)
}

fn assert_gone(fp: &Footprint) {
    let left: Vec<String> = lab::list_netns()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&fp.prefix))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    for pid in &fp.pids {
        assert!(!running(*pid), "process {pid} still running");
    }
    assert!(!fp.dir.exists(), "lab dir {} left", fp.dir.display());
    let record =
        PathBuf::from(lab::REGISTRY_DIR).join(format!("{}.json", fp.prefix.trim_end_matches('-')));
    assert!(
        !record.exists(),
        "registry record {} left",
        record.display()
    );
    // Veth ends are named v-<ns> in the lan namespace, pod0 in nodes and eth0 in members
    // and pods: none may appear in the root namespace.
    let out = std::process::Command::new(lab::process::ip_binary())
        .args(["-j", "link", "show"])
        .output()
        .unwrap();
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = links
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.get("ifname").and_then(|n| n.as_str()))
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("v-") || *n == "br0" || *n == lab::POD_IF),
        "lab links in the root namespace: {names:?}"
    );
}

fn enabled(test: &str) -> bool {
    if std::env::var("VIPD_LAB_KEEP").is_ok_and(|v| v == "1") {
        panic!("lab_cleanup cannot check removal while VIPD_LAB_KEEP=1");
    }
    lab::lab_available(test).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn dropped_lab_leaves_nothing_behind() {
    if !enabled("dropped_lab_leaves_nothing_behind") {
        return;
    }
    let _serial = serial();
    let lab = Lab::start(LabOptions {
        http_backends: true,
        pods: true,
        ..LabOptions::default()
    })
    .unwrap();
    // Processes the test "forgets" (their LabProcess is leaked), one in a node and one in
    // a pod: teardown must still kill them.
    let leaked: Vec<i32> = ["node-c", "pod-a"]
        .iter()
        .map(|ns| {
            let p = lab.spawn(ns, "sleep", &["1000"], &[]).unwrap();
            let pid = p.pid();
            std::mem::forget(p);
            pid
        })
        .collect();
    let fp = footprint(&lab, &leaked);
    assert!(fp.dir.exists());
    assert!(fp.pids.iter().all(|p| running(*p)));
    assert_eq!(
        lab::list_netns()
            .unwrap()
            .iter()
            .filter(|n| n.starts_with(&fp.prefix))
            .count(),
        lab::NAMESPACES.len() + lab::PODS.len()
    );
    drop(lab);
    assert_gone(&fp);
}

#[test]
fn lab_is_removed_when_its_test_thread_panics() {
    if !enabled("lab_is_removed_when_its_test_thread_panics") {
        return;
    }
    let _serial = serial();
    let (tx, rx) = std::sync::mpsc::channel();
    let joined = std::thread::spawn(move || {
        let lab = Lab::start(LabOptions::default()).unwrap();
        tx.send(footprint(&lab, &[])).unwrap();
        panic!("deliberate panic while the lab is up");
    })
    .join();
    assert!(joined.is_err(), "the thread was meant to panic");
    let fp = rx.recv_timeout(Duration::from_secs(1)).unwrap();
    assert_gone(&fp);
}

#[test]
fn labs_of_dead_runs_are_swept() {
    if !enabled("labs_of_dead_runs_are_swept") {
        return;
    }
    let _serial = serial();
    // A pid no process can have: above the kernel's pid_max. (A reaped child's pid is not
    // safe: with pid_max 32768 and tests running in parallel it was reused, the lab looked
    // alive, and the test waited for its orphan for 1000 s.)
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let dead_pid = pid_max + 1;
    assert!(!running(dead_pid as i32));
    let prefix = format!("{}{dead_pid}x0-", lab::NAME_PREFIX);
    let ns = format!("{prefix}node-a");
    lab::process::ip(&["netns", "add", &ns]).unwrap();
    // A pod namespace of the dead lab goes too.
    let pod_ns = format!("{prefix}{}", lab::PODS[0]);
    lab::process::ip(&["netns", "add", &pod_ns]).unwrap();
    // Something left running inside it, as after a crashed test binary.
    let mut orphan = std::process::Command::new(lab::process::ip_binary())
        .args(["netns", "exec", &ns, "sleep", "1000"])
        .spawn()
        .unwrap();
    let orphan_pid = orphan.id() as i32;
    // `ip netns exec` enters the namespace after it starts: a sweep before that finds no
    // process in it, and the orphan then enters the removed namespace and sleeps on.
    let entered = Instant::now();
    while !in_netns(orphan_pid, &ns) {
        assert!(
            entered.elapsed() < Duration::from_secs(10),
            "the orphan {orphan_pid} never entered {ns}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let _ = lab::sweep_stale_labs();
    let deadline = Instant::now() + Duration::from_secs(10);
    let reaped = loop {
        if let Some(status) = orphan.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = orphan.kill();
            let _ = orphan.wait();
            let _ = lab::process::ip(&["netns", "del", &ns]);
            panic!("the sweep left the orphan {orphan_pid} running in {ns}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        reaped.signal(),
        Some(9),
        "the orphan must have been SIGKILLed"
    );
    let left = lab::list_netns().unwrap();
    assert!(!left.contains(&ns), "stale namespace {ns} not removed");
    assert!(
        !left.contains(&pod_ns),
        "stale namespace {pod_ns} not removed"
    );
}
