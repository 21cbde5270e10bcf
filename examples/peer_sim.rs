//! Simulated vipd peers for `cargo xtask bench heartbeat`: sends the peer protocol's signed
//! heartbeats (`svc_ridethrough`) of `--names` on one interface, each name every 200 ms
//! (spread evenly over the interval), for `--seconds`, and counts the valid frames of other
//! senders it receives. Prints one JSON line at the end:
//! `{"names":N,"seconds":S,"sent":..,"received":..,"rejected":..}`.
//!
//! Lab only: the bench runs it inside a lab namespace, never in the root namespace (it sends
//! raw Ethernet frames).
//!
//! Usage: `peer_sim --interface IF --key-file PATH --names a,b --membership a,b,c --seconds S`
//! The key file holds the peer key's bytes as the Secret's `key` does (used as they are);
//! `--membership` is the sorted set of Node names the real vipd knows (its digest goes in
//! every frame, so the simulated peers count towards the real node's majority).

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use vipd::net::{Kernel, NetlinkKernel};
use vipd::peer::socket::PeerSocket;
use vipd::peer::wire::{Encoder, Flags, Kind, Message, PeerKey, decode, new_boot_id};

struct Args {
    interface: String,
    key: PeerKey,
    names: Vec<String>,
    membership: BTreeSet<String>,
    seconds: u64,
}

fn parse() -> Result<Args, String> {
    let mut interface = None;
    let mut key = None;
    let mut names = None;
    let mut membership = None;
    let mut seconds = 30u64;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag}: missing value"))?;
        let list = |v: &str| -> Vec<String> {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        match flag.as_str() {
            "--interface" => interface = Some(value),
            "--key-file" => {
                let bytes = std::fs::read(&value)
                    .map_err(|e| format!("--key-file {value}: cannot read: {e}"))?;
                key = Some(
                    PeerKey::from_bytes(bytes.trim_ascii())
                        .map_err(|e| format!("--key-file {value}: {e}"))?,
                );
            }
            "--names" => names = Some(list(&value)),
            "--membership" => membership = Some(list(&value).into_iter().collect()),
            "--seconds" => {
                seconds = value
                    .parse()
                    .map_err(|_| format!("--seconds {value:?}: expected whole seconds"))?;
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(Args {
        interface: interface.ok_or("--interface is required")?,
        key: key.ok_or("--key-file is required")?,
        names: names.ok_or("--names is required")?,
        membership: membership.ok_or("--membership is required")?,
        seconds,
    })
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn run(a: Args) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let link = rt
        .block_on(async {
            let k = NetlinkKernel::new()?;
            k.link_by_name(&a.interface).await
        })
        .map_err(|e| format!("--interface {}: {e}", a.interface))?;
    let socket = Arc::new(PeerSocket::open(&link).map_err(|e| e.to_string())?);
    let digest = vipd::peer::membership_digest(&a.membership);
    let mut encoders = Vec::new();
    for _ in &a.names {
        let boot = new_boot_id().map_err(|_| "no random boot id".to_string())?;
        encoders.push(Encoder::new(a.key.clone(), boot));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let rx = {
        let (socket, stop, received, rejected) = (
            socket.clone(),
            stop.clone(),
            received.clone(),
            rejected.clone(),
        );
        let key = a.key.clone();
        let ours: BTreeSet<String> = a.names.iter().cloned().collect();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(Some(r)) = socket.recv(Duration::from_millis(100)) {
                    match decode(&key, &r.payload) {
                        Ok(f) if !ours.contains(&f.message.node) => {
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(_) => {
                            rejected.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        })
    };
    let interval = Duration::from_millis(200);
    let n = a.names.len().max(1);
    let step = interval / u32::try_from(n).unwrap_or(u32::MAX);
    let start = Instant::now();
    let end = start + Duration::from_secs(a.seconds);
    let mut sent = 0u64;
    let mut next = start;
    let mut i = 0usize;
    while Instant::now() < end {
        let msg = Message {
            kind: Kind::Heartbeat,
            node: a.names[i].clone(),
            flags: Flags {
                api_reachable: true,
                api_heard: true,
                api_hold: false,
            },
            membership: digest,
            wall_ms: wall_ms(),
            leases: Vec::new(),
            target: None,
        };
        for f in encoders[i].encode(&msg).map_err(|e| e.to_string())? {
            socket.send(&f).map_err(|e| e.to_string())?;
            sent += 1;
        }
        i = (i + 1) % n;
        next += step;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = rx.join();
    Ok(format!(
        "{{\"names\":{},\"seconds\":{:.3},\"sent\":{sent},\"received\":{},\"rejected\":{}}}",
        a.names.len(),
        start.elapsed().as_secs_f64(),
        received.load(Ordering::Relaxed),
        rejected.load(Ordering::Relaxed)
    ))
}

fn main() -> ExitCode {
    match parse().and_then(run) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("peer_sim: {e}");
            ExitCode::FAILURE
        }
    }
}
