//! The routed labs' shared part: a node's BIRD configuration as `vipd manifest bird`
//! writes it from kube-vip's environment variables, and the ±20 % check of an ECMP spread
//! (the spread itself and the router's next hops are `xtask::lab::routed`'s, which the
//! routed failover bench uses too).

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

/// New connections an ECMP spread check opens. The router hashes each connection's ports,
/// so a node's share of N connections over three paths is binomial (N, 1/3): at N = 300
/// (the figure) σ ≈ 8.2, and ±20 % is 2.4 σ: a node misses it about once in 60
/// checks, and the routed labs' five checks would fail a run about once in 12 (seen: S71
/// 79/104/117). At 3000, ±20 % is 7.7 σ: never in practice. The tests print what they saw.
pub const SPREAD: usize = 3000;

/// Asserts that each of `nodes` got `total / nodes.len()` of `m` (from
/// `xtask::lab::routed::spread`, [`SPREAD`] connections) within ±20 %.
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
