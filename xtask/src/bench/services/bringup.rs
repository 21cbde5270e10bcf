//! The `bringup` scenario of `bench services`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::context::Bench;
use super::http::poll_until_answer;
use super::*;
use crate::bench::stats::{ms, summary_ms};

/// (latency ms, answering node) per answered Service, and one message per failure.
pub type BringupResult = (Vec<(f64, String)>, Vec<String>);

/// Creates `names[i]` with `addrs[i]` one at a time, each polled until it answers (10 s
/// limit); returns (latency ms, node) per answered Service and the failures.
pub fn sequential_bringup(b: &Bench, names: &[String], addrs: &[IpAddr]) -> Result<BringupResult> {
    b.in_client(|| {
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        for (name, addr) in names.iter().zip(addrs) {
            if !b.create(name, *addr) {
                failed.push(format!("{name}: create failed"));
                continue;
            }
            let created = Instant::now();
            match poll_until_answer(
                SocketAddr::new(*addr, 80),
                created + Duration::from_secs(10),
            ) {
                Ok(a) => {
                    let l = ms(a.at.duration_since(created));
                    b.say(format!("{name} {addr}: {l:.0} ms ({})", a.node));
                    ok.push((l, a.node));
                }
                Err(e) => failed.push(format!("{name}: {e}")),
            }
        }
        (ok, failed)
    })
}

fn print_bringup(label: &str, ok: &[(f64, String)], failed: &[String]) {
    let lat: Vec<f64> = ok.iter().map(|(l, _)| *l).collect();
    let mut by_node: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, n) in ok {
        *by_node.entry(n.as_str()).or_default() += 1;
    }
    println!("  {label}: created -> first answer: {}", summary_ms(&lat));
    println!(
        "    answered by: {by_node:?}; not answered within 10 s: {}",
        failed.len()
    );
    for f in failed.iter().take(5) {
        println!("    {f}");
    }
}

/// Scenario (a), `bringup`: runs it in a lab of its own and prints its figures.
///
/// # Errors
/// When the lab or vipd cannot start, or the scenario cannot run.
pub fn run(vipd: &Path, verbose: bool) -> Result<()> {
    println!(
        "== bench services: bring-up ({BRINGUP_V4} IPv4 + {BRINGUP_V6} IPv6 Services, one at a time)"
    );
    let b = Bench::start(vipd, verbose)?;
    let (names, addrs) = services("bringup", BRINGUP_V4, v4_address)?;
    let (ok4, failed4) = sequential_bringup(&b, &names, &addrs)?;
    let (names6, addrs6) = services("bringup6", BRINGUP_V6, v6_bringup_address)?;
    let (ok6, failed6) = sequential_bringup(&b, &names6, &addrs6)?;
    print_bringup("IPv4 (192.0.2.150-199)", &ok4, &failed4);
    print_bringup("IPv6 (2001:db8::2:1-a)", &ok6, &failed6);
    for (n, s) in b.samples() {
        println!("  {n}: {}", s.line());
    }
    b.finish();
    Ok(())
}
