use serde_json::json;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn rs(backends: &[&str]) -> Ruleset {
    Ruleset {
        family: Family::Ip,
        vips: vec![ip("192.0.2.10")],
        lb_port: 6443,
        port: 6443,
        backends: backends.iter().map(|b| ip(b)).collect(),
    }
}

fn cmds(b: &NftBatch) -> Vec<serde_json::Value> {
    let j: serde_json::Value = serde_json::from_str(&b.to_json()).unwrap();
    j["nftables"].as_array().unwrap().clone()
}

/// The DNAT and masquerade rules as `nft -j list table ip vipd_lb` writes them (nft 1.0.6,
/// handles and counter values left out): what vipd sends is what the kernel shows.
#[test]
fn install_batch_is_the_documented_ruleset() {
    let b = install_batch(&rs(&["192.0.2.11", "192.0.2.12", "192.0.2.13"]));
    let c = cmds(&b);
    assert_eq!(c.len(), 7, "{c:#?}");
    assert_eq!(b.text.len(), 7);
    assert_eq!(
        c[0],
        json!({"add": {"table": {"family": "ip", "name": "vipd_lb"}}})
    );
    assert_eq!(
        c[1],
        json!({"delete": {"table": {"family": "ip", "name": "vipd_lb"}}})
    );
    assert_eq!(
        c[2],
        json!({"add": {"table": {"family": "ip", "name": "vipd_lb"}}})
    );
    assert_eq!(
        c[3],
        json!({"add": {"chain": {"family": "ip", "table": "vipd_lb", "name": "prerouting",
            "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}}})
    );
    assert_eq!(
        c[4],
        json!({"add": {"chain": {"family": "ip", "table": "vipd_lb", "name": "postrouting",
            "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}}})
    );
    assert_eq!(
        c[5]["add"]["rule"]["expr"],
        json!([
            {"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}},
            {"match": {"op": "==", "left": {"ct": {"key": "ip daddr", "dir": "original"}}, "right": "192.0.2.10"}},
            {"counter": null},
            {"masquerade": null}
        ])
    );
    assert_eq!(c[5]["add"]["rule"]["chain"], "postrouting");
    assert_eq!(
        c[6]["add"]["rule"]["expr"],
        json!([
            {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "192.0.2.10"}},
            {"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}},
            {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 6443}},
            {"counter": null},
            {"dnat": {
                "addr": {"map": {
                    "key": {"numgen": {"mode": "inc", "mod": 3, "offset": 0}},
                    "data": {"set": [[0, "192.0.2.11"], [1, "192.0.2.12"], [2, "192.0.2.13"]]}
                }},
                "port": 6443
            }}
        ])
    );
    assert_eq!(c[6]["add"]["rule"]["chain"], "prerouting");
    assert_eq!(
        b.text[6],
        "add rule ip vipd_lb prerouting ip daddr 192.0.2.10 fib daddr type local tcp dport 6443 counter dnat to numgen inc mod 3 map { 0 : 192.0.2.11, 1 : 192.0.2.12, 2 : 192.0.2.13 }:6443"
    );
    // Only vipd's own table is ever named.
    for cmd in &c {
        let s = cmd.to_string();
        assert!(
            s.contains(r#""table":"vipd_lb""#) || s.contains(r#""name":"vipd_lb""#),
            "{s}"
        );
    }
}

/// Frontend and backend ports are the rule's: `VIP:lb_port` goes to `backend:port`.
#[test]
fn frontend_port_is_lb_port_and_backends_get_port() {
    let mut r = rs(&["192.0.2.11"]);
    r.lb_port = 8443;
    r.port = 6444;
    let c = cmds(&install_batch(&r));
    let expr = &c[6]["add"]["rule"]["expr"];
    assert_eq!(expr[2]["match"]["right"], 8443);
    assert_eq!(expr[4]["dnat"]["port"], 6444);
    assert_eq!(expr[4]["dnat"]["addr"]["map"]["key"]["numgen"]["mod"], 1);
}

/// Without healthy backends there is no DNAT rule (connections reach the holder itself);
/// the table and the masquerade rule stay.
#[test]
fn no_backends_no_dnat_rule() {
    let c = cmds(&install_batch(&rs(&[])));
    assert_eq!(c.len(), 6);
    assert!(
        !c.iter().any(|x| x.to_string().contains("dnat\":{")),
        "{c:?}"
    );
    let u = cmds(&update_batch(&rs(&[])));
    assert_eq!(
        u,
        vec![
            json!({"flush": {"chain": {"family": "ip", "table": "vipd_lb", "name": "prerouting"}}})
        ]
    );
}

/// A backend change is one transaction: flush the DNAT chain, add the new rule.
#[test]
fn update_batch_flushes_and_refills_the_dnat_chain() {
    let b = update_batch(&rs(&["192.0.2.11", "192.0.2.13"]));
    let c = cmds(&b);
    assert_eq!(c.len(), 2);
    assert!(c[0].get("flush").is_some());
    assert_eq!(
        c[1]["add"]["rule"]["expr"][4]["dnat"]["addr"]["map"]["data"],
        json!({"set": [[0, "192.0.2.11"], [1, "192.0.2.13"]]})
    );
    assert_eq!(
        b.command(),
        "flush chain ip vipd_lb prerouting; add rule ip vipd_lb prerouting ip daddr 192.0.2.10 fib daddr type local tcp dport 6443 counter dnat to numgen inc mod 2 map { 0 : 192.0.2.11, 1 : 192.0.2.13 }:6443"
    );
}

/// IPv6 VIPs get `table ip6 vipd_lb` with ip6 matches.
#[test]
fn ipv6_table() {
    let r = Ruleset {
        family: Family::Ip6,
        vips: vec![ip("2001:db8::10")],
        lb_port: 6443,
        port: 6443,
        backends: vec![ip("2001:db8::11")],
    };
    let c = cmds(&install_batch(&r));
    assert_eq!(c[0]["add"]["table"]["family"], "ip6");
    assert_eq!(
        c[5]["add"]["rule"]["expr"][1]["match"]["left"]["ct"]["key"],
        "ip6 daddr"
    );
    assert_eq!(
        c[6]["add"]["rule"]["expr"][0]["match"]["left"]["payload"]["protocol"],
        "ip6"
    );
    assert_eq!(
        cmds(&remove_batch(Family::Ip6))[1],
        json!({"delete": {"table": {"family": "ip6", "name": "vipd_lb"}}})
    );
}
