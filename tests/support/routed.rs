//! The routed labs' shared part: a node's BIRD configuration as `vipd manifest bird`
//! writes it from kube-vip's environment variables.

use std::fmt::Display;

use vipd::cmd::manifest::routed::{Daemon, RoutedManifestArgs, generate};

/// `vipd manifest bird` for `node` (router id `router_id`, AS 65000), peering with the
/// router at `peer_v4` and `[peer_v6]`, AS 65001.
pub fn bird_conf(
    node: &str,
    router_id: impl Display,
    peer_v4: impl Display,
    peer_v6: impl Display,
) -> String {
    let id = router_id.to_string();
    let peers = format!("{peer_v4}:65001,[{peer_v6}]:65001");
    let env = [
        ("bgp_routerid", id.as_str()),
        ("bgp_as", "65000"),
        ("bgp_peers", peers.as_str()),
    ];
    let lookup = |k: &str| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    generate(Daemon::Bird, &RoutedManifestArgs::default(), &lookup, None)
        .unwrap_or_else(|e| panic!("vipd manifest bird for {node}: {e}"))
}

/// The gateways of a route as `ip -j route show exact <dst>` prints it (one for a single
/// path, several for a multipath route; empty when there is none), sorted.
pub fn gateways(ip_json: &str) -> Vec<std::net::IpAddr> {
    let v: serde_json::Value = serde_json::from_str(ip_json).unwrap_or_default();
    let mut gws = Vec::new();
    for r in v.as_array().cloned().unwrap_or_default() {
        if let Some(hops) = r["nexthops"].as_array() {
            gws.extend(
                hops.iter()
                    .filter_map(|h| h["gateway"].as_str()?.parse::<std::net::IpAddr>().ok()),
            );
        } else if let Some(g) = r["gateway"].as_str().and_then(|g| g.parse().ok()) {
            gws.push(g);
        }
    }
    gws.sort();
    gws
}

/// One new TCP connection to `vip`:`port` from the calling thread's namespace; the last
/// line of the answer (the lab's HTTP servers answer their node's name).
pub fn ask(vip: std::net::IpAddr, port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let to = std::net::SocketAddr::new(vip, port);
    let mut s =
        std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.lines().last().map(|l| l.trim().to_string())
}

/// `n` new connections to `vip`:`port` from the calling thread's namespace (run it in
/// the client's with `in_netns`): answers per node (`"-"`: no answer).
pub fn spread(
    vip: std::net::IpAddr,
    port: u16,
    n: usize,
) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for _ in 0..n {
        *m.entry(ask(vip, port).unwrap_or_else(|| "-".into()))
            .or_insert(0) += 1;
    }
    m
}

/// Asserts that each of `nodes` got `total / nodes.len()` of `m` (from [`spread`]) within
/// ±20 %.
pub fn assert_even(what: &str, m: &std::collections::BTreeMap<String, usize>, nodes: &[&str]) {
    let total: usize = m.values().sum();
    let per = total / nodes.len();
    for node in nodes {
        let n = m.get(*node).copied().unwrap_or(0);
        assert!(
            n * 10 >= per * 8 && n * 10 <= per * 12,
            "{what}: {node} got {n} of {total}, want {per} ±20 %: {m:?}"
        );
    }
}
