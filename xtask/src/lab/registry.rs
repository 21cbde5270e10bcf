//! The registry of live labs ([`REGISTRY_DIR`]) and the sweep that removes labs whose
//! creator died: their namespaces (killing what runs in them), directory and record.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::error::{LabError, Result, io_ctx};
use super::process::ip;
use super::{Lab, NAME_PREFIX, REGISTRY_DIR, Signal, netns};

/// The record a lab leaves in [`REGISTRY_DIR`] so a later run can clean up after a crash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabRecord {
    /// Name prefix, e.g. `vl4242x0-`.
    pub prefix: String,
    /// Pid of the process that created (and owns) the lab.
    pub pid: i32,
    /// That process's start time (field 22 of /proc/PID/stat, clock ticks since boot), to
    /// tell a live owner from a recycled pid.
    pub start_time: u64,
    /// Lab directory (logs, PKI, kubeconfigs).
    pub dir: PathBuf,
}

impl Lab {
    pub(super) fn write_record(&self) -> Result<()> {
        write_record(&self.prefix, &self.dir)
    }
}

/// Writes the registry record of the lab `prefix` (lab directory `dir`) owned by this
/// process, so that a later run sweeps it if this process dies ([`sweep_stale_labs`]).
pub(super) fn write_record(prefix: &str, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(REGISTRY_DIR).map_err(io_ctx(format!("create {REGISTRY_DIR}")))?;
    let pid = std::process::id() as i32;
    let rec = LabRecord {
        prefix: prefix.to_string(),
        pid,
        start_time: process_start_time(pid).unwrap_or(0),
        dir: dir.to_path_buf(),
    };
    let path = record_path(prefix);
    let json = serde_json::to_string_pretty(&rec).map_err(|e| LabError::Parse {
        what: "lab record".into(),
        detail: e.to_string(),
    })?;
    std::fs::write(&path, json).map_err(io_ctx(format!("write {}", path.display())))
}

pub(super) fn record_path(prefix: &str) -> PathBuf {
    Path::new(REGISTRY_DIR).join(format!("{}.json", prefix.trim_end_matches('-')))
}

/// Start time of process `pid` (field 22 of /proc/PID/stat), `None` if it does not exist
/// or is a zombie.
fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after ')' are plain.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Lists `ip netns` names.
///
/// # Errors
/// [`LabError::Command`] when `ip netns list` fails.
pub fn list_netns() -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

/// Parses `vl<pid>x<n>-rest` into (`vl<pid>x<n>-`, pid).
fn parse_lab_name(name: &str) -> Option<(String, i32)> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let (id, _) = rest.split_once('-')?;
    let (pid, n) = id.split_once('x')?;
    if pid.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pid: i32 = pid.parse().ok()?;
    Some((format!("{NAME_PREFIX}{id}-"), pid))
}

/// Kills every process in the named namespaces (`ip netns pids`), waits up to 3 s for them
/// to die, then deletes the namespaces.
pub(super) fn remove_namespaces(full_names: &[String]) {
    let me = std::process::id() as i32;
    let mut victims = Vec::new();
    for ns in full_names {
        if let Ok(out) = ip(&["netns", "pids", ns]) {
            for pid in String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .filter(|p| *p != me)
            {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                victims.push(pid);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while victims.iter().any(|p| process_start_time(*p).is_some()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for ns in full_names {
        if netns::netns_path(ns).exists() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Removes labs whose creator process is gone: their namespaces (killing what runs in them),
/// their directory and their registry record. Labs of live processes are left alone.
/// Returns each swept prefix with the error that prevented full removal, if any.
pub fn sweep_stale_labs() -> Vec<(String, Option<LabError>)> {
    let mut by_prefix: HashMap<String, (i32, Vec<String>)> = HashMap::new();
    if let Ok(names) = list_netns() {
        for n in names {
            if let Some((prefix, pid)) = parse_lab_name(&n) {
                by_prefix
                    .entry(prefix)
                    .or_insert((pid, Vec::new()))
                    .1
                    .push(n);
            }
        }
    }
    let mut records: HashMap<String, LabRecord> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir(REGISTRY_DIR) {
        for e in rd.flatten() {
            if let Some(rec) = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| serde_json::from_str::<LabRecord>(&s).ok())
            {
                by_prefix
                    .entry(rec.prefix.clone())
                    .or_insert((rec.pid, Vec::new()));
                records.insert(rec.prefix.clone(), rec);
            }
        }
    }
    let mut swept = Vec::new();
    for (prefix, (pid, names)) in by_prefix {
        let alive = match (process_start_time(pid), records.get(&prefix)) {
            (None, _) => false,
            (Some(st), Some(rec)) => rec.start_time == 0 || rec.start_time == st,
            (Some(_), None) => true,
        };
        if alive {
            continue;
        }
        remove_namespaces(&names);
        let mut err = None;
        if let Some(rec) = records.get(&prefix) {
            if rec.dir.exists()
                && let Err(e) = std::fs::remove_dir_all(&rec.dir)
            {
                err = Some(io_ctx(format!("remove {}", rec.dir.display()))(e));
            }
            let _ = std::fs::remove_file(record_path(&prefix));
        }
        let left: Vec<String> = list_netns()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect();
        if !left.is_empty() {
            err = Some(LabError::Thread {
                name: "sweep".into(),
                detail: format!("namespaces still present: {}", left.join(", ")),
            });
        }
        swept.push((prefix, err));
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_names_parse() {
        assert_eq!(
            parse_lab_name("vl123x4-node-a"),
            Some(("vl123x4-".to_string(), 123))
        );
        assert_eq!(parse_lab_name("vlan-x"), None);
        assert_eq!(parse_lab_name("other"), None);
        assert_eq!(parse_lab_name("vl12x-node"), None);
    }
}
