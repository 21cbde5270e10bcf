//! Lab test of service security (`enable_service_security`, kube-vip's
//! `--onlyAllowTrafficServicePorts`; S60 in `docs/scenarios.md`): on the node announcing a
//! Service VIP only the Service's own ports reach the VIP; a host daemon listening on every
//! address of the holder is not reachable through the VIP.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::json;
use support::*;
use xtask::lab::servers::ThreadServer;
use xtask::lab::{LabOptions, NODES, Signal, node_ipv4};

const VIP: &str = "192.0.2.60";
/// The port of a host daemon listening on every address (an sshd, a kubelet API) that no
/// Service forwards.
const DAEMON_PORT: u16 = 2222;
/// How long a connection attempt may take before it counts as dropped.
const CONNECT: Duration = Duration::from_millis(800);

/// S60: with `enable_service_security=true`, a connection to the Service's VIP:80 from the
/// client reaches the holder's listener, one to VIP:2222 (a listener on every address of
/// every node) is dropped while the holder's own address:2222 still answers; the annotation
/// `kube-vip.io/ignore-service-security: "true"` opens the VIP, removing it closes it
/// again; deleting the Service removes its entries from the holder's table; a clean exit
/// deletes the table.
#[test]
fn s60_service_security_passes_the_service_ports_and_drops_the_rest() {
    let Some(lab) = lab("s60", LabOptions::default()) else {
        return;
    };
    lab.start_http_backends().expect("HTTP backends on :80");
    let _daemons: Vec<ThreadServer> = NODES
        .iter()
        .map(|n| {
            ThreadServer::http(
                &lab.netns_path(n).expect("netns"),
                &format!("daemon-{n}"),
                SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), DAEMON_PORT),
                &format!("daemon {n}"),
            )
            .expect("daemon on :2222")
        })
        .collect();
    let mut procs: Vec<_> = NODES
        .iter()
        .map(|n| start_vipd_services(&lab, n, true, &[("enable_service_security", "true")]))
        .collect();
    let nft_list = |node: &str| -> Option<String> {
        let out = lab
            .exec_unchecked(node, "nft", &["list", "table", "inet", "vipd_svcsec"])
            .expect("nft");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    for n in NODES {
        wait_for(&format!("table on {n}"), Duration::from_secs(10), || {
            nft_list(n)
        });
    }
    let get = |port: u16| {
        let addr = SocketAddr::new(VIP.parse().expect("vip"), port);
        lab.http_get("client", addr, "/", CONNECT)
    };
    create_service(
        &lab,
        &service_json("web", Some(VIP), None, &[(80, "TCP")], false),
    );
    let h = single_holder(&lab, VIP, Duration::from_secs(20));
    let t0 = std::time::Instant::now();
    wait_for(
        "the holder's table guards the VIP",
        Duration::from_secs(10),
        || {
            nft_list(&h)
                .filter(|t| t.contains(&format!("{VIP} . tcp . 80")) && t.contains(VIP))
                .map(|_| ())
        },
    );
    eprintln!(
        "S60: guard on {h} {:?} after the VIP was seen:\n{}",
        t0.elapsed(),
        nft_list(&h).unwrap_or_default()
    );
    let body = wait_for("VIP:80 answers", Duration::from_secs(10), || get(80).ok());
    assert_eq!(body.trim(), h, "VIP:80 reaches the holder's listener");
    let dropped = get(DAEMON_PORT);
    assert!(
        dropped.is_err(),
        "VIP:{DAEMON_PORT} must be dropped: {dropped:?}"
    );
    // The holder's own address is not guarded: the daemon is there and answers.
    let node_addr = SocketAddr::new(IpAddr::V4(node_ipv4(&h).expect("node ip")), DAEMON_PORT);
    let own = lab
        .http_get("client", node_addr, "/", CONNECT)
        .expect("node:2222");
    assert_eq!(own.trim(), format!("daemon {h}"));
    for other in NODES.iter().filter(|n| **n != h) {
        let t = nft_list(other).expect("table");
        assert!(!t.contains(VIP), "{other} does not announce {VIP}: {t}");
    }

    // Exempt: the daemon is reachable through the VIP; the entries go.
    patch_service(
        &lab,
        "web",
        json!({"metadata": {"annotations": {"kube-vip.io/ignore-service-security": "true"}}}),
    );
    let body = wait_for("VIP:2222 open once exempt", Duration::from_secs(10), || {
        get(DAEMON_PORT).ok()
    });
    assert_eq!(body.trim(), format!("daemon {h}"));
    assert!(!nft_list(&h).expect("table").contains(VIP));
    // Not exempt any more: dropped again, VIP:80 still answers.
    patch_service(
        &lab,
        "web",
        json!({"metadata": {"annotations": {"kube-vip.io/ignore-service-security": "false"}}}),
    );
    wait_until("VIP:2222 dropped again", Duration::from_secs(10), || {
        get(DAEMON_PORT).is_err()
    });
    assert_eq!(get(80).expect("VIP:80").trim(), h);

    // Deleted: the VIP and its entries go from the holder.
    delete_service(&lab, "web");
    let t0 = std::time::Instant::now();
    wait_until("entries gone", Duration::from_secs(10), || {
        nft_list(&h).is_some_and(|t| !t.contains(VIP))
    });
    eprintln!("S60: entries gone {:?} after the delete", t0.elapsed());
    wait_until("VIP gone", Duration::from_secs(10), || {
        holders(&lab, VIP).is_empty()
    });

    // Clean exit: the table is deleted.
    for p in &mut procs {
        p.signal(Signal::SIGTERM).expect("SIGTERM");
    }
    for p in &mut procs {
        p.wait_timeout(Duration::from_secs(15))
            .expect("wait")
            .expect("vipd exits on SIGTERM");
        assert!(!p.log().contains("panicked"), "{}", p.log());
    }
    for n in NODES {
        assert!(
            nft_list(n).is_none(),
            "table left on {n} after a clean exit"
        );
    }
}
