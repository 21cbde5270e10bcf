//! The manager's start decisions that need no kernel.

use super::*;
use crate::config::ManagerArgs;
use clap::Parser;

/// A control-plane configuration with `env` on top (no conflict probe, so no socket).
fn config(env: &[(&str, &str)]) -> Config {
    let base = [
        ("cp_enable", "true"),
        ("address", "192.0.2.50"),
        ("vip_nodename", "node-a"),
        ("vip_arpprobe", "0"),
    ];
    let map: std::collections::HashMap<String, String> = base
        .iter()
        .chain(env)
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let args = ManagerArgs::try_parse_from(["manager"]).unwrap();
    crate::config::resolve(&args, &move |k: &str| map.get(k).cloned(), None).unwrap()
}

/// Issue 27: the millisecond fence is on by default; where it cannot start, whole-second
/// timings run on the address lifetime alone, and sub-second ones are refused with the
/// options and their values named (never run unfenced).
#[test]
fn without_the_millisecond_fence_only_sub_second_timings_are_refused() {
    let default = config(&[]);
    assert_eq!(
        default.nft_fence,
        crate::net::nft::fence::NftFenceSetting::Default
    );
    let hc = holder_config(&default).unwrap();
    assert!(needs_nft_fence(&default, &hc, false).is_ok(), "3/2/1");
    let fast = config(&[
        ("vip_leaseduration", "0.6"),
        ("vip_renewdeadline", "0.4"),
        ("vip_retryperiod", "0.2"),
    ]);
    let hc = holder_config(&fast).unwrap();
    assert!(
        needs_nft_fence(&fast, &hc, true).is_ok(),
        "the fence started"
    );
    let e = needs_nft_fence(&fast, &hc, false).unwrap_err().to_string();
    assert!(
        e.contains("vip_leaseduration=0.6 s, vip_renewdeadline=0.4 s, vip_retryperiod=0.2 s"),
        "{e}"
    );
    assert!(e.contains("refusing to run unfenced"), "{e}");
    // Sub-second Service timings under whole-second control-plane ones.
    let svc = config(&[
        ("svc_enable", "true"),
        ("svc_leaseduration", "0.6"),
        ("svc_renewdeadline", "0.4"),
        ("svc_retryperiod", "0.2"),
    ]);
    let hc = holder_config(&svc).unwrap();
    let e = needs_nft_fence(&svc, &hc, false).unwrap_err().to_string();
    assert!(e.contains("svc_leaseduration=0.6 s"), "{e}");
}

/// `vip_nftfence` unset, `true` and `false` are three settings: only `false` turns the
/// fence off (and sub-second timings are then refused when the configuration is read).
#[test]
fn vip_nftfence_unset_true_false() {
    use crate::net::nft::fence::NftFenceSetting;
    assert_eq!(
        config(&[("vip_nftfence", "true")]).nft_fence,
        NftFenceSetting::On
    );
    let off = config(&[("vip_nftfence", "false")]).nft_fence;
    assert_eq!(off, NftFenceSetting::Off);
    assert!(!off.wanted() && NftFenceSetting::Default.wanted() && NftFenceSetting::On.wanted());
}

/// The process's one Node watch lists every Node exactly when a reader needs them (the
/// Services wing, and with it the allocator; the load balancer), else only this node's,
/// which eligibility reads in every mode.
#[test]
fn the_node_watch_lists_every_node_only_for_readers_of_every_node() {
    assert_eq!(node_scope(&config(&[])), NodeScope::Own);
    assert_eq!(
        node_scope(&config(&[("lb_enable", "true")])),
        NodeScope::All
    );
    assert_eq!(
        node_scope(&config(&[("svc_enable", "true")])),
        NodeScope::All
    );
    assert_eq!(
        node_scope(&config(&[("cp_enable", "false"), ("svc_enable", "true")])),
        NodeScope::All
    );
}

/// Issue 29: a vipd whose only VIPs are routes (Services in routing-table mode) starts
/// neither the ARP flux guard nor the nftables fence; the control-plane VIP or Service
/// VIPs bound as addresses need both.
#[test]
fn only_address_binding_modes_start_the_arp_guard_and_the_nft_fence() {
    assert!(config(&[]).binds_addresses(), "control plane");
    let services = [
        ("cp_enable", "false"),
        ("svc_enable", "true"),
        ("svc_election", "true"),
    ];
    assert!(config(&services).binds_addresses(), "Services, ARP");
    let mut routed = services.to_vec();
    routed.push(("vip_routingtable", "true"));
    assert!(
        !config(&routed).binds_addresses(),
        "Services, routing table"
    );
}
