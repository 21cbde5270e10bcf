//! Lab test of ARP flux (S36): a node with a second interface on the VIP's
//! segment must not answer ARP for the VIP from that interface's MAC, and vipd (manager
//! log, `vipd preflight`) names the interface and the sysctl remedy.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use support::*;
use xtask::lab::{Lab, LabOptions, MacAddr, Signal};

/// Probes the VIP from the client every 20 ms until `enough` says the report is
/// conclusive (or 15 s pass), and returns the report.
fn watch_until(
    lab: &Lab,
    what: &str,
    mut enough: impl FnMut(&xtask::lab::WatchReport) -> bool,
) -> xtask::lab::WatchReport {
    let vip: IpAddr = VIP.parse().unwrap();
    let watch = lab.arp_watch(vip, Duration::from_millis(20)).unwrap();
    wait_for(what, Duration::from_secs(15), || {
        enough(&watch.report()).then_some(())
    });
    watch.stop().unwrap()
}

/// Stops `p` with SIGTERM and waits for it to exit.
fn stop(p: &mut xtask::lab::LabProcess) {
    p.signal(Signal::SIGTERM).unwrap();
    let st = p.wait_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        st.is_some_and(|s| s.success()),
        "vipd exit: {st:?}\n{}",
        p.log()
    );
}

/// Tables of `nft list tables` in `ns`.
fn nft_tables(lab: &Lab, ns: &str) -> String {
    let out = lab.exec(ns, "nft", &["list", "tables"]).unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// S36: node-a has eth1 192.0.2.111/24 on the same bridge as eth0, `arp_ignore` at its
/// default 0. With the nftables guard's table deleted the kernel answers ARP for
/// the control-plane VIP from eth1's MAC too (the scenario is real in this lab); with it
/// on, every request is answered by eth0's MAC only. The manager's log and `vipd
/// preflight` warn naming eth1 and the sysctl; no nftables table is left after vipd exits.
#[test]
fn s36_second_interface_only_vip_interface_answers() {
    let Some(lab) = lab("s36", LabOptions::default()) else {
        return;
    };
    let node = "node-a";
    let eth1: MacAddr = lab.add_interface(node, "eth1", "192.0.2.111/24").unwrap();
    let eth0: MacAddr = lab.mac_of(node).unwrap();
    let sysctl = |k: &str| {
        let out = lab
            .exec(node, "cat", &[format!("/proc/sys/net/ipv4/conf/{k}")])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(sysctl("all/arp_ignore"), "0");
    assert_eq!(sysctl("eth1/arp_ignore"), "0");
    assert_eq!(sysctl("eth1/arp_filter"), "0");

    // Control: the guard's table deleted under vipd (vipd changes nftables through
    // netlink, so hiding the `nft` binary no longer turns the guard off), the flux shows.
    let mut p = start_vipd(&lab, node, T531, &[]);
    assert_eq!(single_holder(&lab, VIP, Duration::from_secs(30)), node);
    wait_for("the guard's table", Duration::from_secs(10), || {
        lab.exec(node, "nft", &["list", "table", "arp", "vipd"])
            .ok()
            .map(|_| ())
    });
    lab.exec(node, "nft", &["delete", "table", "arp", "vipd"])
        .expect("delete the guard's table");
    let report = watch_until(&lab, "eth1 answering without the guard", |r| {
        r.all_responders().contains(&eth1)
    });
    let log = p.log();
    assert!(
        report.all_responders().contains(&eth0),
        "{:?}",
        report.all_responders()
    );
    assert!(log.contains("ARP flux protection on"), "{log}");
    stop(&mut p);

    // Guard on: one MAC, eth0's, for every request.
    let mut p = start_vipd(&lab, node, T531, &[]);
    assert_eq!(single_holder(&lab, VIP, Duration::from_secs(30)), node);
    let report = watch_until(&lab, "100 answered probes", |r| r.answered_slots() >= 100);
    let log = p.log();
    if report.all_responders() != [eth0].into() {
        dump(&[&p]);
    }
    assert_eq!(
        report.all_responders(),
        [eth0].into(),
        "only eth0 ({eth0}) may answer; eth1 is {eth1}"
    );
    assert_eq!(report.max_simultaneous_responders(), 1);
    assert!(log.contains("ARP flux protection on"), "{log}");
    let warning = log
        .lines()
        .find(|l| l.contains("ARP flux: VIP 192.0.2.10 is on eth0"))
        .unwrap_or_else(|| panic!("no ARP flux warning in\n{log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("eth1 (192.0.2.111/24)"), "{warning}");
    assert!(
        warning.contains("sysctl -w net.ipv4.conf.all.arp_ignore=1"),
        "{warning}"
    );
    assert!(warning.contains("table (arp vipd) drops"), "{warning}");
    let table = String::from_utf8_lossy(
        &lab.exec(node, "nft", &["list", "table", "arp", "vipd"])
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(table.contains(r#"192.0.2.10 . "eth0""#), "{table}");

    // Preflight in the same namespace warns likewise (and finds nftables usable).
    let mut pre = spawn_vipd(&lab, node, &["preflight", "--no-arp-probe"], T531, &[]);
    pre.wait_timeout(Duration::from_secs(30))
        .unwrap()
        .expect("preflight finished");
    let out = pre.log();
    let row = out
        .lines()
        .find(|l| l.starts_with("arp-flux:eth0"))
        .unwrap_or_else(|| panic!("no arp-flux row in\n{out}"));
    assert!(row.contains("warn"), "{row}");
    assert!(row.contains("eth1 (192.0.2.111/24)"), "{row}");
    assert!(
        out.contains("fix: sysctl -w net.ipv4.conf.all.arp_ignore=1"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("nftables") && l.contains(" ok ")),
        "{out}"
    );

    // No table left behind.
    stop(&mut p);
    for ns in NODES.iter().copied().chain(["client"]) {
        let tables = nft_tables(&lab, ns);
        assert!(!tables.contains("vipd"), "{ns}: {tables}");
    }
}
