//! Figures of processes from /proc: RSS, status fields, CPU time, children.

use std::time::{Duration, Instant};

/// Direct children of `pid` (from /proc/*/stat field 4).
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// A field of /proc/<pid>/status, e.g. `VmRSS` (KiB) or `Threads`: the first number after
/// `<key>:`.
pub fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// utime + stime (clock ticks) from the text of /proc/<pid>/stat.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    // Fields after the command name (which may contain spaces) start with the state.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// [`status_field`] of `/proc/<pid>/status`.
pub fn proc_status(pid: i32, key: &str) -> Option<u64> {
    status_field(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        key,
    )
}

fn cpu_ticks(pid: i32) -> Option<u64> {
    stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf(3) only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU use of `pids` over `window`, percent of one core each (`None` when a pid vanished).
pub fn cpu_percent(pids: &[i32], window: Duration) -> Vec<Option<f64>> {
    let before: Vec<Option<u64>> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    let t0 = Instant::now();
    std::thread::sleep(window);
    let secs = t0.elapsed().as_secs_f64();
    let hz = clock_ticks_per_s();
    pids.iter()
        .zip(before)
        .map(|(p, b)| {
            let a = cpu_ticks(*p)?;
            Some((a.saturating_sub(b?)) as f64 / hz / secs * 100.0)
        })
        .collect()
}

// ----- metrics ---------------------------------------------------------------------------
