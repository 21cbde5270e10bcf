//! `cargo xtask bench fence [--vips 600,3700] [--holders 1,6] [--rounds 300] [--no-build]`:
//! what the nftables fence's renewals cost vipd's process as the VIPs a holder and a node
//! fences grow. No vipd manager and no API server: the example `examples/fence_cost.rs`
//! (built with vipd) starts the fence in a network namespace of the bench's own
//! (`vl<pid>x<n>-fence`, `bench addrs`'s kind: removed when the bench returns, fails or
//! panics; nothing is sent on any link), arms the VIPs over the holders at once through the writer vipd's holders share
//! (a burst of new leases) and refreshes every holder `--rounds` times. For each VIP count and
//! holder count it prints the user and system CPU and the wall time of the arming and per
//! holder refresh (the system time is the kernel handling the transaction inside
//! `sendmsg`, charged to vipd). It prints figures, not pass/fail; docs/services-bench.md
//! records a run.

use anyhow::{Context, Result, bail};

use super::addrs::{Namespace, load1};
use super::harness::build::release_artifact;
use crate::args::{parse_flags, whole_number};

const USAGE: &str = "usage: cargo xtask bench fence [options]

options:
  --vips LIST      VIPs fenced on the node, IPv6 (default 600,3700)
  --holders LIST   holders they are spread over, each refreshed in turn (default 1,6)
  --rounds N       refreshes of every holder (default 300)
  --no-build       use target/release/examples/fence_cost as it is

Runs as root in a network namespace of its own (vl<pid>x<n>-fence), no vipd manager needed.";

/// Command-line options of `bench fence`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Options {
    vips: Vec<usize>,
    holders: Vec<usize>,
    rounds: usize,
    build: bool,
}

impl Options {
    fn parse(args: &[&str]) -> Result<Options> {
        let mut o = Options {
            vips: vec![600, 3700],
            holders: vec![1, 6],
            rounds: 300,
            build: true,
        };
        let list = |flag: &str, v: &str| -> Result<Vec<usize>> {
            v.split(',')
                .map(|x| whole_number(flag, x, 1..=100_000))
                .collect()
        };
        parse_flags(args, USAGE, |flag, value| {
            match flag {
                "--vips" => o.vips = list(flag, value()?)?,
                "--holders" => o.holders = list(flag, value()?)?,
                "--rounds" => o.rounds = whole_number(flag, value()?, 1..=1_000_000)?,
                "--no-build" => o.build = false,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(o)
    }
}

/// Runs the bench.
///
/// # Errors
/// Bad arguments, not root, a failed build, or the example failing.
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    crate::require_root("bench fence")?;
    let example = release_artifact(o.build, &["--example", "fence_cost"], "examples/fence_cost")?;
    let ns = Namespace::bare("fence")?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "== bench fence: per holder refresh, {} rounds (netns {}, kernel {}, load {})",
        o.rounds,
        ns.name,
        kernel.trim(),
        load1()
    );
    println!(
        "  VIPs | holders | VIPs a holder | arming all at once: user / system / wall ms | a renewal: user / system / wall ms | in-place updates"
    );
    for &n in &o.vips {
        for &h in &o.holders {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &ns.name])
                .arg(&example)
                .args(["--vips", &n.to_string(), "--holders", &h.to_string()])
                .args(["--rounds", &o.rounds.to_string()])
                .output()
                .context("run fence_cost")?;
            if !out.status.success() {
                bail!(
                    "fence_cost --vips {n} --holders {h}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
                format!(
                    "fence_cost's line: {}",
                    String::from_utf8_lossy(&out.stdout)
                )
            })?;
            let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "  {n} | {} | {} | {:.1} / {:.1} / {:.1} | {:.3} / {:.3} / {:.3} | {}",
                v["holders"],
                n.div_ceil(h),
                f("arm_user_ms"),
                f("arm_sys_ms"),
                f("arm_wall_ms"),
                f("user_ms"),
                f("sys_ms"),
                f("wall_ms"),
                v["updates"]
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_lists_and_refuse_zero() {
        let o = Options::parse(&["--vips", "16,600", "--holders", "2", "--no-build"]).unwrap();
        assert_eq!(o.vips, vec![16, 600]);
        assert_eq!(o.holders, vec![2]);
        assert!(!o.build);
        let e = Options::parse(&["--holders", "0"]).unwrap_err().to_string();
        assert!(e.contains("--holders") && e.contains("outside"), "{e}");
    }
}
