//! Kernel tests of `vipd::net::macvlan` (rtnetlink + /proc/sys) against the real Linux
//! kernel, on a thread in a private network namespace (see tests/support/netns.rs): parent
//! `d0` (one end of a veth pair), a foreign macvlan `mv-user` on it that must never be touched.

mod support;

use std::process::Command;

use support::netns::{enter_private_netns, ip, root_or_skip};
use vipd::net::macvlan::{MacvlanError, MacvlanKernel, MacvlanSpec, Macvlans, NetlinkMacvlans};

fn in_private_netns(body: impl AsyncFnOnce(Macvlans<NetlinkMacvlans>) + Send + 'static) {
    if !root_or_skip("macvlan kernel tests") {
        return;
    }
    let t = std::thread::spawn(move || {
        enter_private_netns();
        ip("link add d0 type veth peer name d1");
        ip("link set d0 up");
        ip("link set d1 up");
        ip("link add link d0 name mv-user type macvlan mode bridge");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async {
            let m = Macvlans::new(NetlinkMacvlans::new().unwrap());
            body(m).await;
        });
    });
    if let Err(panic) = t.join() {
        std::panic::resume_unwind(panic);
    }
}

/// `ip -d -j link show NAME` as JSON, `None` when the link does not exist.
fn link(name: &str) -> Option<serde_json::Value> {
    let out = Command::new("ip")
        .args(["-d", "-j", "link", "show", name])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.get(0).cloned()
}

fn sysctl(family: &str, name: &str, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/{family}/conf/{name}/{key}"))
        .unwrap()
        .trim()
        .to_string()
}

fn spec(name: &str) -> MacvlanSpec {
    MacvlanSpec {
        parent: "d0".into(),
        name: name.into(),
        mac: [0x02, 0x76, 0x69, 0x70, 0x64, 0x10],
        mark: "vipd:uid-1".into(),
        rp_filter: 2,
        ipv6_now: false,
        own_addrs: Vec::new(),
        probe_mac: false,
    }
}

#[test]
fn creates_configures_reuses_replaces_and_removes_only_marked_macvlans() {
    in_private_netns(async |m| {
        // Stale vipd macvlan from an earlier run: removed at start; mv-user kept.
        ip("link add link d0 name vip-stale type macvlan mode bridge");
        ip("link set vip-stale alias vipd:gone");
        assert_eq!(m.remove_stale(&[]).await.unwrap(), vec!["vip-stale"]);
        assert!(link("vip-stale").is_none());
        assert!(link("mv-user").is_some());

        let s = spec("vip-abc");
        let index = m.ensure(&s).await.unwrap();
        let l = link("vip-abc").expect("created");
        assert_eq!(l["ifindex"], index);
        assert_eq!(l["address"], "02:76:69:70:64:10");
        assert_eq!(l["ifalias"], "vipd:uid-1");
        assert_eq!(l["link"], "d0");
        assert_eq!(l["linkinfo"]["info_kind"], "macvlan");
        assert_eq!(l["linkinfo"]["info_data"]["mode"], "bridge");
        assert!(
            l["flags"].as_array().unwrap().iter().any(|f| f == "UP"),
            "{l}"
        );
        assert_eq!(sysctl("ipv4", "vip-abc", "rp_filter"), "2");
        assert_eq!(sysctl("ipv4", "vip-abc", "arp_ignore"), "1");
        assert_eq!(sysctl("ipv4", "vip-abc", "arp_announce"), "2");
        // No SLAAC address for the node through the macvlan.
        assert_eq!(sysctl("ipv6", "vip-abc", "accept_ra"), "0");
        assert_eq!(sysctl("ipv6", "vip-abc", "autoconf"), "0");
        // MLD reports (a leftover's leaving its groups) within 20 ms, not over 1 s.
        assert_eq!(
            sysctl("ipv6", "vip-abc", "mldv2_unsolicited_report_interval"),
            "20"
        );
        assert_eq!(
            sysctl("ipv6", "vip-abc", "mldv1_unsolicited_report_interval"),
            "20"
        );

        // Same spec: the same link. Another MAC: replaced.
        assert_eq!(m.ensure(&s).await.unwrap(), index);
        let mut other = s.clone();
        other.mac[5] = 0x11;
        m.ensure(&other).await.unwrap();
        assert_eq!(link("vip-abc").unwrap()["address"], "02:76:69:70:64:11");

        // A foreign interface of that name is refused and left as it is.
        let foreign = link("mv-user").unwrap();
        let e = m.ensure(&spec("mv-user")).await.unwrap_err();
        assert!(matches!(e, MacvlanError::NotOurs { .. }), "{e}");
        assert!(m.remove("mv-user").await.is_err());
        assert_eq!(link("mv-user").unwrap(), foreign);

        // Bad input never reaches the kernel; a missing parent is named.
        let e = m.ensure(&spec("vip-0123456789ab")).await.unwrap_err();
        assert!(e.to_string().contains("\"vip-0123456789ab\""), "{e}");
        assert!(link("vip-0123456789ab").is_none());
        let mut orphan = spec("vip-def");
        orphan.parent = "eth9".into();
        let e = m.ensure(&orphan).await.unwrap_err();
        assert!(e.to_string().contains("\"eth9\""), "{e}");

        // Removal: ours goes; absent is fine; the foreign one stays.
        assert!(m.remove("vip-abc").await.unwrap());
        assert!(link("vip-abc").is_none());
        assert!(!m.remove("vip-abc").await.unwrap());
        assert_eq!(m.remove_stale(&[]).await.unwrap(), Vec::<String>::new());
        assert!(link("mv-user").is_some());
    });
}

/// `ip -j addr show dev NAME` flags of its link-local address.
fn link_local_flags(name: &str) -> Option<Vec<String>> {
    let out = Command::new("ip")
        .args(["-6", "-j", "addr", "show", "dev", name])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let info = v.get(0)?["addr_info"].as_array()?.clone();
    let ll = info.iter().find(|a| a["scope"] == "link")?;
    Some(
        ["tentative", "dadfailed", "optimistic"]
            .iter()
            .filter(|f| ll[**f].as_bool() == Some(true))
            .map(|f| f.to_string())
            .collect(),
    )
}

/// A macvlan for a DHCPv6 client (`ipv6_now`): the kernel makes no link-local address
/// (address generation off, as on every vipd macvlan); vipd adds the EUI-64 one itself,
/// not tentative (DAD off), with a 2 s lifetime, renews it while it is there and does not
/// bring it back once gone; each such macvlan gets its own UDP socket on port 546
/// (`SO_BINDTODEVICE`).
#[test]
fn dhcpv6_macvlan_has_a_usable_link_local_at_once_and_its_own_port_546() {
    use vipd::dhcp::v6::Udp6Transport;
    use vipd::dhcp::wire::Transport;
    in_private_netns(async |m| {
        let mut a = spec("vip-six");
        a.ipv6_now = true;
        let ia = m.ensure(&a).await.unwrap();
        assert_eq!(sysctl("ipv6", "vip-six", "accept_dad"), "0");
        assert_eq!(link_local_flags("vip-six"), None, "no kernel link-local");
        let ll = m.add_link_local(ia, "vip-six", a.mac).await.unwrap();
        assert_eq!(ll, vipd::net::macvlan::eui64_link_local(a.mac));
        assert_eq!(link_local_flags("vip-six"), Some(Vec::new()));
        let out = Command::new("ip")
            .args(["-6", "-j", "addr", "show", "dev", "vip-six"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let valid = v[0]["addr_info"][0]["valid_life_time"].as_u64().unwrap();
        assert!(valid <= 2, "lifetime {valid} s");
        assert!(m.refresh_link_local(ia, "vip-six", a.mac).await.unwrap());
        let mut b = spec("vip-six2");
        b.ipv6_now = true;
        b.mac[5] = 0x12;
        let ib = m.ensure(&b).await.unwrap();
        m.add_link_local(ib, "vip-six2", b.mac).await.unwrap();
        let _wa = Udp6Transport.open(ia, "vip-six").unwrap();
        let _wb = Udp6Transport.open(ib, "vip-six2").unwrap();
        // Gone (expired): a refresh does not add it back.
        let ll_text = format!("{ll}/64");
        let st = Command::new("ip")
            .args(["-6", "addr", "del", ll_text.as_str(), "dev", "vip-six"])
            .status()
            .unwrap();
        assert!(st.success());
        assert!(!m.refresh_link_local(ia, "vip-six", a.mac).await.unwrap());
        assert_eq!(link_local_flags("vip-six"), None);
        // Without ipv6_now: no link-local at all (a leftover macvlan stays silent).
        let mut c = spec("vip-dad");
        c.mac[5] = 0x13;
        m.ensure(&c).await.unwrap();
        assert_eq!(link_local_flags("vip-dad"), None);
    });
}

/// Trial finding F7: preflight asks the kernel itself whether it has macvlan. This kernel
/// has it built in (no /sys/module/macvlan, no /lib/modules here): the answer is yes, and
/// the question creates nothing.
#[test]
fn the_kernel_is_asked_whether_it_has_macvlan_and_nothing_is_created() {
    in_private_netns(async |m| {
        // The link names only: the veths' carrier may still be coming up meanwhile.
        let names = || {
            let out = Command::new("ip").args(["-o", "link"]).output().unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_string())
                .collect::<Vec<_>>()
        };
        let before = names();
        assert_eq!(m.kernel().kernel_has_macvlan().await.ok(), Some(true));
        assert_eq!(before, names());
        assert!(link("vipd-pf-probe").is_none());
    });
}

/// Runs `ip ARGS` in the network namespace of process `pid`.
fn ip_in(pid: &str, args: &str) -> String {
    let out = Command::new("nsenter")
        .args(["-t", pid, "-n", "ip"])
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`ip {args}` in {pid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (up to 10 s) until `check` holds.
fn wait_until(what: &str, check: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !check() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn mac_of(name: &str) -> [u8; 6] {
    let l = link(name).unwrap();
    let bytes: Vec<u8> = l["address"]
        .as_str()
        .unwrap()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    bytes.try_into().unwrap()
}

/// Trial finding F1: a host this node never talked to, on the parent's segment, answers
/// the MAC probe (ICMPv6 echo to all nodes, sent to its MAC alone) and is found; a macvlan
/// without IPv6 addresses (a killed holder's leftover) stays silent and is not.
#[test]
fn a_host_using_the_mac_answers_the_probe_and_a_silent_leftover_does_not() {
    in_private_netns(async |m| {
        let mut other = Command::new("unshare")
            .args(["--net", "sleep", "60"])
            .spawn()
            .unwrap();
        let pid = other.id().to_string();
        // This thread's namespace (the test's private one), not the process's: the child
        // starts in this one and leaves it only once `unshare` ran, which is what to wait
        // for before moving d1 into its namespace.
        let ours = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        wait_until("the other host's namespace", || {
            std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|n| n != ours)
        });
        let host_mac = mac_of("d1");
        ip(&format!("link set d1 netns {pid}"));
        ip_in(&pid, "link set d1 up");
        ip_in(
            &pid,
            "link add link d1 name mv-left address 02:76:69:70:64:77 type macvlan mode bridge",
        );
        ip_in(&pid, "link set mv-left addrgenmode none");
        ip_in(&pid, "link set mv-left up");
        let ready = |out: String| out.contains("fe80::") && !out.contains("tentative");
        wait_until("d1's link-local", || {
            ready(ip_in(&pid, "-6 addr show dev d1"))
        });
        wait_until("d0's link-local", || {
            let out = Command::new("ip")
                .args(["-6", "addr", "show", "dev", "d0"])
                .output()
                .unwrap();
            ready(String::from_utf8_lossy(&out.stdout).into_owned())
        });
        let d0 = u32::try_from(link("d0").unwrap()["ifindex"].as_u64().unwrap()).unwrap();
        let k = m.kernel();
        let found = k
            .mac_answers(d0, "d0", mac_of("d0"), host_mac)
            .await
            .unwrap();
        assert!(
            found.as_deref().is_some_and(|f| f.contains("fe80::")),
            "the host was not found: {found:?}"
        );
        let silent = k
            .mac_answers(d0, "d0", mac_of("d0"), [0x02, 0x76, 0x69, 0x70, 0x64, 0x77])
            .await
            .unwrap();
        assert_eq!(silent, None);
        let nobody = k
            .mac_answers(d0, "d0", mac_of("d0"), [0x02, 0x76, 0x69, 0x70, 0x64, 0x78])
            .await
            .unwrap();
        assert_eq!(nobody, None);
        let _ = other.kill();
        let _ = other.wait();
    });
}
