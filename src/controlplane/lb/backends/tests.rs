use serde_json::json;

use super::*;

fn node(name: &str, labels: serde_json::Value, ready: &str, ips: &[(&str, &str)]) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "status": {
            "conditions": [{"type": "Ready", "status": ready}],
            "addresses": ips.iter().map(|(t, a)| json!({"type": t, "address": a})).collect::<Vec<_>>(),
        }
    }))
    .unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn candidates_are_ready_control_plane_nodes_internal_ips() {
    let cp = json!({ CONTROL_PLANE_LABEL: "" });
    let nodes = [
        node("c", cp.clone(), "True", &[("InternalIP", "192.0.2.13")]),
        node(
            "a",
            json!({ CONTROL_PLANE_LABEL: "true" }),
            "True",
            &[
                ("InternalIP", "192.0.2.11"),
                ("ExternalIP", "198.51.100.1"),
                ("Hostname", "a"),
                ("InternalIP", "2001:db8::11"),
            ],
        ),
        // Not Ready, a worker, a bad address.
        node("b", cp.clone(), "False", &[("InternalIP", "192.0.2.12")]),
        node(
            "w",
            json!({"node-role.kubernetes.io/worker": ""}),
            "True",
            &[("InternalIP", "192.0.2.21")],
        ),
        node("x", cp, "True", &[("InternalIP", "not-an-ip")]),
    ];
    let got = node_backends(&nodes);
    let want = [
        ("a", "192.0.2.11"),
        ("c", "192.0.2.13"),
        ("a", "2001:db8::11"),
    ]
    .iter()
    .map(|(n, a)| Candidate {
        node: n.to_string(),
        addr: ip(a),
    })
    .collect::<Vec<_>>();
    assert_eq!(got, want);
}

#[test]
fn three_failures_out_two_successes_in() {
    let mut h = BackendHealth::default();
    assert!(!h.record(true), "first check good: stays in");
    assert!(!h.record(false));
    assert!(!h.record(false));
    assert!(h.in_set);
    assert!(h.record(false), "third failure takes it out");
    assert!(!h.in_set);
    assert!(!h.record(false));
    assert!(!h.record(true), "one success is not enough");
    assert!(!h.in_set);
    assert!(h.record(true), "second success brings it back");
    assert!(h.in_set);
    // A success in between resets the failure count.
    h.record(false);
    h.record(false);
    h.record(true);
    h.record(false);
    h.record(false);
    assert!(h.in_set);
}

#[test]
fn an_unchecked_backend_is_in_until_its_first_check_decides() {
    let mut h = BackendHealth::default();
    assert!(h.in_set);
    assert!(h.record(false), "first check failed: out at once");
    assert!(!h.in_set);
    let mut h = BackendHealth::default();
    h.record(true);
    assert!(h.in_set);
}

#[test]
fn candidates_change_keeps_others_state() {
    let c = |n: &str, a: &str| Candidate {
        node: n.into(),
        addr: ip(a),
    };
    let mut h = Health::default();
    assert!(h.set_candidates(&[c("a", "192.0.2.11"), c("b", "192.0.2.12")]));
    for _ in 0..3 {
        h.record(ip("192.0.2.12"), false);
    }
    assert_eq!(h.in_set(), vec![ip("192.0.2.11")]);
    // c joins: in at once, b stays out, a stays in.
    assert!(h.set_candidates(&[
        c("a", "192.0.2.11"),
        c("b", "192.0.2.12"),
        c("c", "192.0.2.13")
    ]));
    assert_eq!(h.in_set(), vec![ip("192.0.2.11"), ip("192.0.2.13")]);
    // a leaves.
    assert!(h.set_candidates(&[c("b", "192.0.2.12"), c("c", "192.0.2.13")]));
    assert_eq!(h.in_set(), vec![ip("192.0.2.13")]);
    assert_eq!(h.record(ip("192.0.2.11"), false), None, "gone: ignored");
    assert_eq!(h.node_of(ip("192.0.2.13")), Some("c"));
    // A new term forgets the checks.
    h.reset();
    assert_eq!(h.in_set(), vec![ip("192.0.2.12"), ip("192.0.2.13")]);
    assert!(!h.set_candidates(&[c("b", "192.0.2.12"), c("c", "192.0.2.13")]));
}
