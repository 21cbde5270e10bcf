//! `cargo xtask bench addrs [--count N] [--step S]`: what the Linux kernel charges per address
//! operation as the addresses on a node grow. This decides how vipd can hold thousands of VIPs
//! per node. No vipd and no API server: `ip -batch` against a namespace of the bench's own. It
//! prints figures, not pass/fail; docs/services-bench.md ("Kernel cost of many VIP addresses")
//! records a run.
//!
//! The bench creates a fresh network namespace `vl<pid>x<n>-addrs` and removes it when it
//! returns, fails or panics. The name follows the lab's pattern, so if a run is killed outright,
//! the next `Lab::start` or `cargo xtask lab down` sweeps the namespace. Inside it, `lo` and two
//! veth pairs, `va`/`vb` and `vc`/`vd`, are up. Both ends of each pair stay in the namespace, so
//! nothing leaves it. Only lab addresses are used (2001:db8::/32 and the three IPv4
//! documentation /24s). With K = min(N, [`V4_MAX`]) the steps are:
//!
//! 1. **Equal count, on `vc`.** K IPv4 /32 adds (192.0.2.1-254, 198.51.100.1-254,
//!    203.0.113.1-254) in one batch, then their lifetime refresh (below). Then the same for K
//!    IPv6 /128 adds, 2001:db8::8:1 and up, with `nodad noprefixroute` (as vipd adds them). Each family's addresses are removed
//!    afterwards (untimed), so the steps below start from an empty namespace.
//! 2. **IPv6 adds on `va`.** 2001:db8::9:1 .. 2001:db8::9:`<N in hex>` /128 with `nodad
//!    noprefixroute`, in chunks of S, one `ip -batch` file per chunk. Each chunk prints its time and its time per
//!    address.
//! 3. **IPv6 adds on `lo`.** S adds of 2001:db8::7:1 and up while the N addresses sit on `va`,
//!    for comparison: `lo` joins no solicited-node multicast group. Then the solicited-node
//!    groups of those S addresses are joined on `va` by sockets ([`GROUPS_PER_SOCKET`] each,
//!    `IPV6_JOIN_GROUP`), timed, and left by closing the sockets, timed: what VIPs on `lo`
//!    whose neighbour solicitations are still to reach the node would pay instead of the
//!    adds on `va`. Then the `lo` addresses are deleted, also timed (a VIP's drop), so that
//!    step 4 runs with exactly the N addresses of `va`.
//! 4. **Lifetime refresh on `va`.** `addr change <a> dev va valid_lft 5 preferred_lft 0` for
//!    the first S addresses of `va`, with the N present. This is what vipd's renewal does for
//!    each VIP: an `RTM_NEWADDR` that resets the lifetime, the whole-second kernel fence. If the
//!    step takes longer than 5 s, the addresses refreshed first expire while it runs. The
//!    kernel then deletes them, and the bench prints how many.
//!
//! Steps 3 and 4 run in this order, not the other way round. Had the refresh run first, its
//! addresses would expire 5 s later, and the kernel's expiry work would delete them while `lo`
//! was being timed.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use xtask::lab::NAME_PREFIX;
use xtask::lab::process::ip;

use crate::args::{parse_flags, whole_number};

const USAGE: &str = "usage: cargo xtask bench addrs [options]

options:
  --count N   IPv6 /128 addresses added to veth `va` (default 8000, at most 65535:
              2001:db8::9:1 .. 2001:db8::9:<N in hex>)
  --step S    addresses per `ip -batch` chunk; also the number of `lo` adds and of lifetime
              refreshes (default 2000, at most N)

Runs as root in a network namespace of its own (vl<pid>x<n>-addrs), no vipd needed.";

/// Most IPv4 addresses the bench uses: 192.0.2.1-254, 198.51.100.1-254, 203.0.113.1-254.
pub const V4_MAX: usize = 3 * 254;
/// The IPv4 documentation /24s (RFC 5737), in the order the bench fills them.
const V4_NETS: [[u8; 3]; 3] = [[192, 0, 2], [198, 51, 100], [203, 0, 113]];
/// Seventh group of the IPv6 addresses on `va` (2001:db8::9:x).
const GROUP_VA: u16 = 9;
/// Seventh group of the IPv6 addresses on `vc`, the equal-count comparison (2001:db8::8:x).
const GROUP_VC: u16 = 8;
/// Seventh group of the IPv6 addresses on `lo` (2001:db8::7:x).
const GROUP_LO: u16 = 7;
/// Lifetimes of the refresh: what vipd's renewal sets (seconds).
const REFRESH: &str = "valid_lft 5 preferred_lft 0";

/// Command-line options of `bench addrs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// IPv6 addresses added to `va`.
    pub count: usize,
    /// Addresses per batch chunk, `lo` adds and lifetime refreshes.
    pub step: usize,
}

impl Options {
    /// Parses the arguments after `bench addrs`.
    ///
    /// # Errors
    /// An unknown flag, a missing value, `--count` outside 1..=65535 or `--step` outside
    /// 1..=count; `--help` returns the usage as the error.
    pub fn parse(args: &[&str]) -> Result<Options> {
        let mut o = Options {
            count: 8000,
            step: 2000,
        };
        let mut step = None;
        parse_flags(args, USAGE, |flag, value| {
            match flag {
                "--count" => o.count = whole_number(flag, value()?, 1..=usize::from(u16::MAX))?,
                "--step" => step = Some(whole_number(flag, value()?, 1..=usize::from(u16::MAX))?),
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        match step {
            Some(s) if s > o.count => bail!("--step: {s} is more than --count {}", o.count),
            Some(s) => o.step = s,
            // The default step shrinks with a smaller --count.
            None => o.step = o.step.min(o.count),
        }
        Ok(o)
    }
}

/// IPv6 address 2001:db8::`group`:`i` (`i` in hex, as IPv6 writes it).
pub fn v6(group: u16, i: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, group, i)
}

/// The `i`-th IPv4 lab address (from 0): 192.0.2.1-254, then 198.51.100.1-254, then
/// 203.0.113.1-254; `None` from [`V4_MAX`] on.
pub fn v4(i: usize) -> Option<Ipv4Addr> {
    let [a, b, c] = *V4_NETS.get(i / 254)?;
    Some(Ipv4Addr::new(a, b, c, (i % 254) as u8 + 1))
}

/// The IPv6 addresses 2001:db8::`group`:`first` .. 2001:db8::`group`:`last` (inclusive, from 1).
fn v6_range(group: u16, first: usize, last: usize) -> Vec<IpAddr> {
    (first..=last)
        .map(|i| IpAddr::V6(v6(group, i as u16)))
        .collect()
}

/// The first `n` IPv4 lab addresses ([`v4`]).
fn v4_first(n: usize) -> Vec<IpAddr> {
    (0..n).filter_map(v4).map(IpAddr::V4).collect()
}

/// The 1-based inclusive ranges of `count` addresses in chunks of `step` (the last one shorter
/// when `step` does not divide `count`).
pub fn chunks(count: usize, step: usize) -> Vec<(usize, usize)> {
    let step = step.max(1);
    (0..count.div_ceil(step))
        .map(|k| (k * step + 1, ((k + 1) * step).min(count)))
        .collect()
}

/// Host prefix length of `a`: /32 or /128.
fn host_len(a: &IpAddr) -> u8 {
    if a.is_ipv4() { 32 } else { 128 }
}

/// What one batch line does to an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `addr add` (IPv6 with `nodad noprefixroute`, as vipd adds VIPs).
    Add,
    /// `addr change ... valid_lft 5 preferred_lft 0` (IPv6 also `noprefixroute`: a change
    /// without it gives the address its prefix route back): the renewal's lifetime refresh.
    Refresh,
    /// `addr del` (a VIP's drop).
    Del,
}

/// An `ip -batch` file: one line per address, `op` on `dev`.
fn batch(op: Op, addrs: &[IpAddr], dev: &str) -> String {
    let mut s = String::new();
    for a in addrs {
        let len = host_len(a);
        let _ = match op {
            Op::Add if a.is_ipv6() => {
                writeln!(s, "addr add {a}/{len} dev {dev} nodad noprefixroute")
            }
            Op::Add => writeln!(s, "addr add {a}/{len} dev {dev}"),
            Op::Refresh if a.is_ipv6() => {
                writeln!(s, "addr change {a}/{len} dev {dev} {REFRESH} noprefixroute")
            }
            Op::Refresh => writeln!(s, "addr change {a}/{len} dev {dev} {REFRESH}"),
            Op::Del => writeln!(s, "addr del {a}/{len} dev {dev}"),
        };
    }
    s
}

/// Milliseconds per operation.
fn per_op_ms(secs: f64, ops: usize) -> f64 {
    secs * 1000.0 / ops.max(1) as f64
}

/// One timed step, for the closing table.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    /// What was done.
    step: String,
    /// Addresses of the step's family (scope global) in the namespace before it.
    before: usize,
    /// Operations (batch lines).
    ops: usize,
    /// Wall time of the `ip -batch` run.
    secs: f64,
}

/// The closing table.
fn table(rows: &[Row]) -> String {
    let w = rows.iter().map(|r| r.step.len()).max().unwrap_or(0).max(4);
    let mut s = format!(
        "  {:<w$}  {:>8}  {:>6}  {:>9}  {:>10}\n",
        "step", "before", "ops", "total", "per op"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "  {:<w$}  {:>8}  {:>6}  {:>7.2} s  {:>7.3} ms",
            r.step,
            r.before,
            r.ops,
            r.secs,
            per_op_ms(r.secs, r.ops)
        );
    }
    s
}

static NS_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A bench's network namespace: deleted when dropped (also while unwinding from a panic).
pub(crate) struct Namespace {
    pub(crate) name: String,
}

impl Namespace {
    /// Creates `vl<pid>x<n>-<suffix>` with `lo` up (the lab's pattern: a killed run's
    /// namespace is swept by the next `Lab::start` or `cargo xtask lab down`).
    pub(crate) fn bare(suffix: &str) -> Result<Namespace> {
        let name = format!(
            "{NAME_PREFIX}{}x{}-{suffix}",
            std::process::id(),
            NS_COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        ip(&["netns", "add", &name]).with_context(|| format!("create netns {name}"))?;
        // From here on the guard removes it, whatever fails next.
        let ns = Namespace { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Creates `vl<pid>x<n>-addrs` with `lo`, `va`/`vb` and `vc`/`vd` up.
    fn create() -> Result<Namespace> {
        let ns = Namespace::bare("addrs")?;
        for (a, b) in [("va", "vb"), ("vc", "vd")] {
            ns.ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
            ns.ip(&["link", "set", a, "up"])?;
            ns.ip(&["link", "set", b, "up"])?;
        }
        Ok(ns)
    }

    /// `ip -n <ns> args...`.
    fn ip(&self, args: &[&str]) -> Result<std::process::Output> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        Ok(ip(&all)?)
    }

    /// Addresses with scope global of `family` (`-4`/`-6`) in the namespace, or on `dev`.
    fn count(&self, family: &str, dev: Option<&str>) -> Result<usize> {
        let mut args = vec!["-o", family, "addr", "show"];
        if let Some(d) = dev {
            args.extend(["dev", d]);
        }
        args.extend(["scope", "global"]);
        let out = self.ip(&args)?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count())
    }

    /// Writes `lines` to `dir/file` and times `ip -n <ns> -batch` on it (seconds).
    fn timed_batch(&self, dir: &Path, file: &str, lines: &str) -> Result<f64> {
        let path = dir.join(file);
        std::fs::write(&path, lines).with_context(|| format!("write {}", path.display()))?;
        let p = path.to_string_lossy();
        let t0 = Instant::now();
        self.ip(&["-batch", &p])
            .with_context(|| format!("ip -batch {file}"))?;
        Ok(t0.elapsed().as_secs_f64())
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("bench: could not remove netns {}: {e}", self.name);
        }
    }
}

/// The first field of /proc/loadavg (1-minute load), for the record.
pub(crate) fn load1() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Multicast groups one socket joins in the group step: a socket's memberships are
/// charged to its option memory (`net.core.optmem_max`, 20 KiB on older kernels).
const GROUPS_PER_SOCKET: usize = 200;

/// The solicited-node multicast group of `a`, ff02::1:ffXX:XXXX with its last 24 bits (RFC
/// 4291 section 2.7.1).
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// Joins the solicited-node groups of `addrs` on `dev` of namespace `ns`, from a thread in
/// it: the sockets that hold the memberships and the time the joins took (seconds).
fn join_groups(ns: &str, dev: &str, addrs: &[IpAddr]) -> Result<(Vec<socket2::Socket>, f64)> {
    let path = xtask::lab::netns::netns_path(ns);
    xtask::lab::netns::run_in_netns(&path, || -> Result<(Vec<socket2::Socket>, f64)> {
        let index =
            nix::net::if_::if_nametoindex(dev).with_context(|| format!("index of {dev}"))?;
        let t0 = Instant::now();
        let mut sockets = Vec::new();
        for chunk in addrs.chunks(GROUPS_PER_SOCKET) {
            let sock = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None)
                .context("an IPv6 UDP socket")?;
            for a in chunk {
                let IpAddr::V6(a) = a else { continue };
                let group = solicited_node(*a);
                sock.join_multicast_v6(&group, index)
                    .with_context(|| format!("join {group} on {dev}"))?;
            }
            sockets.push(sock);
        }
        Ok((sockets, t0.elapsed().as_secs_f64()))
    })?
}

/// The namespace, the batch files' directory and the rows timed so far.
struct Bench {
    ns: Namespace,
    dir: tempfile::TempDir,
    rows: Vec<Row>,
}

impl Bench {
    /// Times one batch: `op` on `addrs` on `dev`, whose family is `family` (`-4`/`-6`);
    /// prints it and keeps its row. Returns its time (seconds).
    fn step(
        &mut self,
        what: String,
        family: &str,
        op: Op,
        addrs: &[IpAddr],
        dev: &str,
    ) -> Result<f64> {
        let before = self.ns.count(family, None)?;
        let file = format!("{}.batch", self.rows.len());
        let secs = self
            .ns
            .timed_batch(self.dir.path(), &file, &batch(op, addrs, dev))?;
        println!(
            "  {what}: {secs:.2} s, {:.3} ms per address ({before} -> {} {} addresses in the netns)",
            per_op_ms(secs, addrs.len()),
            self.ns.count(family, None)?,
            if family == "-4" { "IPv4" } else { "IPv6" },
        );
        self.rows.push(Row {
            step: what,
            before,
            ops: addrs.len(),
            secs,
        });
        Ok(secs)
    }

    /// Prints and keeps a step timed otherwise than by a batch (`ops` operations in `secs`
    /// seconds, `before` IPv6 addresses in the namespace).
    fn timed_row(&mut self, what: String, before: usize, ops: usize, secs: f64) {
        println!(
            "  {what}: {secs:.2} s, {:.3} ms per group ({before} IPv6 addresses in the netns)",
            per_op_ms(secs, ops)
        );
        self.rows.push(Row {
            step: what,
            before,
            ops,
            secs,
        });
    }
}

/// Entry point of `cargo xtask bench addrs ARGS`.
///
/// # Errors
/// Bad arguments, not root, or an `ip` command that fails.
pub fn run(args: &[&str]) -> Result<()> {
    let o = Options::parse(args)?;
    crate::require_root("bench addrs")?;
    xtask::lab::control_plane::ensure_packages(&[("ip", "iproute2")])?;
    let (n, s) = (o.count, o.step);
    let k = n.min(V4_MAX);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "== bench addrs: {n} IPv6 /128 on a veth in chunks of {s}, {s} on lo, {s} lifetime \
         refreshes; {k} IPv4 /32 and {k} IPv6 /128 at equal count (kernel {}, load {})",
        kernel.trim(),
        load1()
    );
    let dir = tempfile::Builder::new()
        .prefix("vipd-bench-addrs-")
        .tempdir()
        .context("temp dir for the batch files")?;
    let ns = Namespace::create()?;
    println!("  netns {} (lo, va/vb, vc/vd up)", ns.name);
    let mut b = Bench {
        ns,
        dir,
        rows: Vec::new(),
    };

    // 1. Equal count on vc: IPv4, then IPv6; each removed afterwards.
    let v4s = v4_first(k);
    b.step(format!("IPv4 add {k} /32, vc"), "-4", Op::Add, &v4s, "vc")?;
    b.step(
        format!("IPv4 refresh {k}, vc"),
        "-4",
        Op::Refresh,
        &v4s,
        "vc",
    )?;
    b.ns.ip(&["-4", "addr", "flush", "dev", "vc"])?;
    let v6s = v6_range(GROUP_VC, 1, k);
    b.step(format!("IPv6 add {k} /128, vc"), "-6", Op::Add, &v6s, "vc")?;
    b.step(
        format!("IPv6 refresh {k}, vc"),
        "-6",
        Op::Refresh,
        &v6s,
        "vc",
    )?;
    b.ns.ip(&["-6", "addr", "flush", "dev", "vc", "scope", "global"])?;
    if b.ns.count("-6", None)? + b.ns.count("-4", None)? != 0 {
        bail!("addresses left on vc after the equal-count step");
    }

    // 2. N IPv6 adds on va in chunks of S.
    for (first, last) in chunks(n, s) {
        let addrs = v6_range(GROUP_VA, first, last);
        let what = format!("IPv6 add {first}-{last} /128, va");
        b.step(what, "-6", Op::Add, &addrs, "va")?;
    }
    let on_va = b.ns.count("-6", Some("va"))?;
    if on_va != n {
        bail!("{on_va} IPv6 addresses on va, expected {n}");
    }

    // 3. S IPv6 adds on lo with the N on va; removed afterwards.
    let lo = v6_range(GROUP_LO, 1, s);
    b.step(format!("IPv6 add {s} /128, lo"), "-6", Op::Add, &lo, "lo")?;
    let before = b.ns.count("-6", None)?;
    let (sockets, secs) = join_groups(&b.ns.name, "va", &lo)?;
    b.timed_row(
        format!("IPv6 join {s} solicited-node groups, va"),
        before,
        s,
        secs,
    );
    let t0 = Instant::now();
    drop(sockets);
    let secs = t0.elapsed().as_secs_f64();
    b.timed_row(
        format!("IPv6 leave {s} solicited-node groups, va"),
        before,
        s,
        secs,
    );
    b.step(format!("IPv6 del {s} /128, lo"), "-6", Op::Del, &lo, "lo")?;

    // 4. Lifetime refresh of the first S of va with the N present.
    let first = v6_range(GROUP_VA, 1, s);
    let what = format!("IPv6 refresh {s} ({REFRESH}), va");
    let secs = b.step(what, "-6", Op::Refresh, &first, "va")?;
    let left = b.ns.count("-6", Some("va"))?;
    if left < n {
        println!(
            "  {} of the refreshed addresses expired (valid_lft 5) before the step ended \
             ({secs:.1} s) and the kernel deleted them",
            n - left
        );
    }

    println!("\n{}", table(&b.rows));
    println!("  (load {} at the end)", load1());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_count_and_step() {
        assert_eq!(
            Options::parse(&[]).unwrap(),
            Options {
                count: 8000,
                step: 2000
            }
        );
        let o = Options::parse(&["--count", "100", "--step", "30"]).unwrap();
        assert_eq!((o.count, o.step), (100, 30));
        // The default step follows a smaller count.
        assert_eq!(Options::parse(&["--count", "500"]).unwrap().step, 500);
        assert!(Options::parse(&["--count", "0"]).is_err());
        assert!(Options::parse(&["--count", "65536"]).is_err());
        assert!(Options::parse(&["--count", "10", "--step", "11"]).is_err());
        assert!(Options::parse(&["--step", "0"]).is_err());
        assert!(Options::parse(&["--steps", "1"]).is_err());
        assert!(
            Options::parse(&["-h"])
                .unwrap_err()
                .to_string()
                .contains("--count N")
        );
    }

    #[test]
    fn solicited_node_groups_take_the_last_24_bits() {
        assert_eq!(
            solicited_node(v6(GROUP_LO, 0x1a2b)),
            "ff02::1:ff07:1a2b".parse::<Ipv6Addr>().unwrap()
        );
        let a: Ipv6Addr = "2001:db8::12:3456:789a".parse().unwrap();
        assert_eq!(
            solicited_node(a),
            "ff02::1:ff56:789a".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn ipv6_addresses_are_hex_groups_in_the_lab_prefix() {
        assert_eq!(v6(GROUP_VA, 1).to_string(), "2001:db8::9:1");
        assert_eq!(v6(GROUP_VA, 8000).to_string(), "2001:db8::9:1f40");
        assert_eq!(v6(GROUP_LO, 2000).to_string(), "2001:db8::7:7d0");
        let r = v6_range(GROUP_VC, 1, 3);
        assert_eq!(r.len(), 3);
        assert_eq!(r[2].to_string(), "2001:db8::8:3");
        for a in v6_range(GROUP_VA, 1, 65535) {
            let IpAddr::V6(a) = a else { panic!("not IPv6") };
            assert_eq!(a.segments()[..2], [0x2001, 0xdb8]);
        }
    }

    #[test]
    fn ipv4_addresses_stay_in_the_documentation_nets() {
        assert_eq!(v4(0), Some(Ipv4Addr::new(192, 0, 2, 1)));
        assert_eq!(v4(253), Some(Ipv4Addr::new(192, 0, 2, 254)));
        assert_eq!(v4(254), Some(Ipv4Addr::new(198, 51, 100, 1)));
        assert_eq!(v4(508), Some(Ipv4Addr::new(203, 0, 113, 1)));
        assert_eq!(v4(V4_MAX - 1), Some(Ipv4Addr::new(203, 0, 113, 254)));
        assert_eq!(v4(V4_MAX), None);
        let all = v4_first(10_000);
        assert_eq!(all.len(), V4_MAX);
        let distinct: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), V4_MAX);
        assert!(all.iter().all(|a| match a {
            IpAddr::V4(a) => {
                let o = a.octets();
                V4_NETS.contains(&[o[0], o[1], o[2]]) && o[3] != 0 && o[3] != 255
            }
            IpAddr::V6(_) => false,
        }));
    }

    #[test]
    fn chunks_cover_the_count() {
        assert_eq!(
            chunks(8000, 2000),
            [(1, 2000), (2001, 4000), (4001, 6000), (6001, 8000)]
        );
        assert_eq!(chunks(5, 2), [(1, 2), (3, 4), (5, 5)]);
        assert_eq!(chunks(3, 3), [(1, 3)]);
        assert_eq!(chunks(0, 3), []);
    }

    #[test]
    fn batch_lines() {
        let v6s = v6_range(GROUP_VA, 1, 2);
        assert_eq!(
            batch(Op::Add, &v6s, "va"),
            "addr add 2001:db8::9:1/128 dev va nodad noprefixroute\naddr add 2001:db8::9:2/128 dev va nodad noprefixroute\n"
        );
        assert_eq!(
            batch(Op::Refresh, &v6s[..1], "va"),
            "addr change 2001:db8::9:1/128 dev va valid_lft 5 preferred_lft 0 noprefixroute\n"
        );
        let v4s = v4_first(1);
        assert_eq!(batch(Op::Add, &v4s, "vc"), "addr add 192.0.2.1/32 dev vc\n");
        assert_eq!(
            batch(Op::Refresh, &v4s, "vc"),
            "addr change 192.0.2.1/32 dev vc valid_lft 5 preferred_lft 0\n"
        );
        assert_eq!(batch(Op::Del, &v4s, "vc"), "addr del 192.0.2.1/32 dev vc\n");
    }

    #[test]
    fn table_has_a_row_per_step() {
        let t = table(&[Row {
            step: "IPv6 add 1-2000 /128, va".into(),
            before: 0,
            ops: 2000,
            secs: 1.5,
        }]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[1].contains("1.50 s") && lines[1].contains("0.750 ms"),
            "{t}"
        );
        assert_eq!(per_op_ms(1.0, 0), 1000.0);
    }
}
