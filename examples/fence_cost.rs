//! What the nftables fence's renewals cost vipd's process, for `cargo xtask bench fence`:
//! starts the fence (`vipd::net::nft::fence::NftFence`, its tables `arp`/`inet vipd_fence`)
//! in the current network namespace behind the writer vipd's holders share
//! (`BatchedFence`), arms `--vips` VIPs over `--holders` holders at once (IPv6
//! 2001:db8::1:0 and up, or IPv4 from 192.0.2.1 with `--family 4`, at most 762), as a burst of
//! new leases does, then refreshes every holder in turn `--rounds` times, as renewals do, and
//! prints one JSON line: `{"vips":N,"holders":H,"rounds":R,"updates":true,"arm_user_ms":..,
//! "arm_sys_ms":..,"arm_wall_ms":..,"user_ms":..,"sys_ms":..,"wall_ms":..}`: the arming's
//! total, then per holder refresh (`getrusage(RUSAGE_SELF)`: the kernel's share is the
//! transaction's handling inside `sendmsg`, in this process's context). Deletes its tables at
//! the end.
//!
//! Lab only: it refuses to run in the root network namespace (its tables would drop the
//! lab addresses' traffic there); the bench runs it in a namespace of its own.
//!
//! Usage: `fence_cost --vips N --holders H --rounds R [--family 4|6]`

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::ExitCode;
use std::time::Duration;

use tokio::time::Instant;
use vipd::net::nft::fence::{BatchedFence, NftFence, VipFence};

/// The VIPs: IPv6 from 2001:db8::1:0, or IPv4 from 192.0.2.1 through the three
/// documentation /24s.
fn vips(n: usize, v4: bool) -> Vec<IpAddr> {
    if v4 {
        [[192u8, 0, 2], [198, 51, 100], [203, 0, 113]]
            .iter()
            .flat_map(|p| (1..=254u8).map(move |i| IpAddr::V4(Ipv4Addr::new(p[0], p[1], p[2], i))))
            .take(n)
            .collect()
    } else {
        let base = u128::from(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 1, 0));
        (0..n as u128)
            .map(|i| IpAddr::V6(Ipv6Addr::from(base + i)))
            .collect()
    }
}

/// This process's user and system CPU so far, in milliseconds.
fn cpu_ms() -> (f64, f64) {
    // SAFETY: getrusage only writes the struct it is given.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut r);
        r
    };
    let ms = |tv: libc::timeval| tv.tv_sec as f64 * 1e3 + tv.tv_usec as f64 / 1e3;
    (ms(r.ru_utime), ms(r.ru_stime))
}

fn arg(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name}: a whole number, not {:?}", args.get(i + 1))),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = (|| -> Result<(usize, usize, usize, bool), String> {
        let v4 = match arg(&args, "--family", 6)? {
            4 => true,
            6 => false,
            f => return Err(format!("--family: 4 or 6, not {f}")),
        };
        let n = arg(&args, "--vips", 600)?;
        let h = arg(&args, "--holders", 1)?.max(1);
        if v4 && n > 762 {
            return Err(format!("--vips: at most 762 IPv4 VIPs, not {n}"));
        }
        Ok((n, h, arg(&args, "--rounds", 300)?, v4))
    })();
    let (n, holders, rounds, v4) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fence_cost: {e}");
            return ExitCode::from(2);
        }
    };
    let here = std::fs::read_link("/proc/self/ns/net").ok();
    if here.is_none() || here == std::fs::read_link("/proc/1/ns/net").ok() {
        eprintln!(
            "fence_cost: refusing to run in the root network namespace (run it through `cargo xtask bench fence`)"
        );
        return ExitCode::from(2);
    }
    let fence = match NftFence::start().await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("fence_cost: {e}");
            return ExitCode::FAILURE;
        }
    };
    let updates = fence.timeout_updates();
    let fence = BatchedFence::new(fence);
    let all = vips(n, v4);
    let per = all.len().div_ceil(holders).max(1);
    let groups: Vec<&[IpAddr]> = all.chunks(per).collect();
    let until = || Instant::now() + Duration::from_millis(3000);
    let (au, asys) = cpu_ms();
    let aw = std::time::Instant::now();
    let armed = futures::future::join_all(
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| fence.refresh(i as u64 + 1, g, until())),
    )
    .await;
    if let Some(Err(e)) = armed.into_iter().find(Result::is_err) {
        eprintln!("fence_cost: arming: {e}");
        return ExitCode::FAILURE;
    }
    let arm_wall = aw.elapsed().as_secs_f64() * 1e3;
    let (au1, asys1) = cpu_ms();
    let (u0, s0) = cpu_ms();
    let w0 = std::time::Instant::now();
    for _ in 0..rounds {
        for (i, g) in groups.iter().enumerate() {
            if let Err(e) = fence.refresh(i as u64 + 1, g, until()).await {
                eprintln!("fence_cost: refresh: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let (u1, s1) = cpu_ms();
    let runs = (rounds * groups.len()).max(1) as f64;
    println!(
        "{{\"vips\":{n},\"holders\":{},\"rounds\":{rounds},\"updates\":{updates},\"arm_user_ms\":{:.3},\"arm_sys_ms\":{:.3},\"arm_wall_ms\":{:.3},\"user_ms\":{:.4},\"sys_ms\":{:.4},\"wall_ms\":{:.4}}}",
        groups.len(),
        au1 - au,
        asys1 - asys,
        arm_wall,
        (u1 - u0) / runs,
        (s1 - s0) / runs,
        w0.elapsed().as_secs_f64() * 1e3 / runs
    );
    if let Err(e) = fence.close().await {
        eprintln!("fence_cost: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
