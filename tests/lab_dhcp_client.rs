//! Lab tests of the DHCPv4 client of DHCP mode (issue 13, kernel/protocol side): a macvlan
//! and `vipd::dhcp::RawDhcp` in node-a against dnsmasq in the lab's `dhcp` namespace
//! (lease 120 s: T1 60 s, T2 105 s).

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dhcproto::Decodable;
use dhcproto::v4::{Message, MessageType};
use pnet::datalink::{self, Channel};
use pnet::packet::Packet;
use pnet::packet::ethernet::{EtherTypes, EthernetPacket};
use pnet::packet::ip::IpNextHeaderProtocols;
use pnet::packet::ipv4::Ipv4Packet;
use pnet::packet::udp::UdpPacket;
use support::*;
use tokio::time::timeout;
use vipd::dhcp::{Dhcp, DhcpBinding, DhcpFamily, DhcpHandle, DhcpSpec, DhcpState, RawDhcp};
use xtask::lab::{DHCP_POOL_END, DHCP_POOL_START, DHCP_SERVER_V4, DnsmasqOptions, Lab, LabOptions};

const MAC: [u8; 6] = [0x02, 0x76, 0x69, 0x70, 0x64, 0x01];
const MAC_TEXT: &str = "02:76:69:70:64:01";
const MACVLAN: &str = "vip-test0001";
const REQUESTED: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 207);

/// A DHCP message seen on the server's wire (UDP to port 67).
#[derive(Debug, Clone)]
struct Seen {
    eth_src: [u8; 6],
    eth_dst: [u8; 6],
    ip_src: Ipv4Addr,
    ip_dst: Ipv4Addr,
    kind: Option<MessageType>,
    ciaddr: Ipv4Addr,
}

/// Captures DHCP client messages on eth0 of the `dhcp` namespace.
struct ServerCapture {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<xtask::lab::Result<()>>>,
}

fn decode(frame: &[u8]) -> Option<Seen> {
    let eth = EthernetPacket::new(frame)?;
    if eth.get_ethertype() != EtherTypes::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new(eth.payload())?;
    if ip.get_next_level_protocol() != IpNextHeaderProtocols::Udp {
        return None;
    }
    let udp = UdpPacket::new(ip.payload())?;
    if udp.get_destination() != 67 {
        return None;
    }
    let msg = Message::from_bytes(udp.payload()).ok()?;
    Some(Seen {
        eth_src: eth.get_source().octets(),
        eth_dst: eth.get_destination().octets(),
        ip_src: ip.get_source(),
        ip_dst: ip.get_destination(),
        kind: msg.opts().msg_type(),
        ciaddr: msg.ciaddr(),
    })
}

impl ServerCapture {
    fn start(lab: &Lab) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (s, st) = (seen.clone(), stop.clone());
        let thread = xtask::lab::netns::spawn_in_netns(
            &lab.netns_path("dhcp").unwrap(),
            "dhcp-capture",
            move || {
                let iface = datalink::interfaces()
                    .into_iter()
                    .find(|i| i.name == "eth0")
                    .expect("eth0 in dhcp");
                let cfg = datalink::Config {
                    read_timeout: Some(Duration::from_millis(50)),
                    ..Default::default()
                };
                let Ok(Channel::Ethernet(_, mut rx)) = datalink::channel(&iface, cfg) else {
                    panic!("no capture channel on dhcp/eth0");
                };
                let _ = ready_tx.send(());
                while !st.load(Ordering::Relaxed) {
                    if let Ok(frame) = rx.next()
                        && let Some(seen) = decode(frame)
                    {
                        s.lock().unwrap().push(seen);
                    }
                }
                Ok(())
            },
        )
        .unwrap();
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("capture ready");
        Self {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The captured messages matching `f`, once there is at least one, waiting up to
    /// `limit`: the capture thread reads the server's wire on its own schedule, so a
    /// message dnsmasq has already answered may not be recorded yet when the client's
    /// state changes (CI on 2 cores caught that). Panics naming `what` and everything
    /// captured if none arrives in time.
    async fn wait_for(&self, what: &str, limit: Duration, f: impl Fn(&Seen) -> bool) -> Vec<Seen> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let matching: Vec<Seen> = self.seen().into_iter().filter(|s| f(s)).collect();
            if !matching.is_empty() {
                return matching;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("no {what} on the wire after {limit:?}: {:?}", self.seen());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ServerCapture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn spec(requested: Option<Ipv4Addr>) -> DhcpSpec {
    DhcpSpec {
        family: DhcpFamily::V4,
        parent: "eth0".into(),
        macvlan: MACVLAN.into(),
        mac: MAC,
        requested,
        requested_v6: None,
        hostname: Some("lb-test".into()),
        broadcast: false,
        rp_filter: 0,
        mark: "vipd:test-service-uid".into(),
        mac_derived: true,
    }
}

async fn wait_state(
    h: &mut DhcpHandle,
    what: &str,
    limit: Duration,
    f: impl FnMut(&DhcpState) -> bool,
) -> DhcpState {
    let res = timeout(limit, h.state.wait_for(f))
        .await
        .map(|r| r.map(|s| s.clone()));
    match res {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => panic!("client task gone while waiting for {what}"),
        Err(_) => panic!(
            "timed out after {limit:?} waiting for {what}; state {:?}",
            *h.state.borrow()
        ),
    }
}

/// The IPv4 address of a DHCPv4 binding.
fn v4(b: &DhcpBinding) -> Ipv4Addr {
    match b.addr {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => panic!("a DHCPv4 client leased {a}"),
    }
}

async fn bound(h: &mut DhcpHandle, what: &str, limit: Duration) -> DhcpBinding {
    match wait_state(h, what, limit, |s| matches!(s, DhcpState::Bound(_))).await {
        DhcpState::Bound(b) => b,
        other => panic!("{other:?}"),
    }
}

/// What the holder does with a bound address: a /32 on the macvlan (so that the kernel
/// answers ARP for it and the server's unicast replies arrive).
fn hold(lab: &Lab, addr: Ipv4Addr) {
    lab.exec(
        "node-a",
        "ip",
        &["addr", "add", &format!("{addr}/32"), "dev", MACVLAN],
    )
    .unwrap();
}

fn links(lab: &Lab) -> String {
    let out = lab.exec("node-a", "ip", &["-d", "link", "show"]).unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `body` on a multi-thread tokio runtime (lab calls block one worker, the DHCP
/// client runs on the other) whose threads are in node-a.
fn in_node_a(lab: &Lab, body: impl AsyncFnOnce() + Send) {
    lab.in_netns("node-a", || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(body())
    })
    .unwrap();
}

fn in_pool(a: Ipv4Addr) -> bool {
    (u32::from(DHCP_POOL_START)..=u32::from(DHCP_POOL_END)).contains(&u32::from(a))
}

/// S23/S24 (client side): stale marked macvlans are removed at start and a foreign one is
/// untouched; the client binds the requested address from the pool on its own macvlan
/// (mark, MAC, rp_filter, ARP settings), renews at T1 by unicast from the macvlan's MAC to
/// the server, is Lost once the lease expires with the server gone, gets the same address
/// back when the server returns, keeps it across a stop/start without DHCPRELEASE (the
/// failover path), and DHCPRELEASE on release_and_stop frees it in dnsmasq's lease file.
#[test]
fn dhcp_client_binds_renews_expires_reacquires_and_releases() {
    let Some(lab) = lab(
        "dhcp_client",
        LabOptions {
            local_api: false,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    lab.start_dnsmasq(&DnsmasqOptions::default()).unwrap();
    for (name, alias) in [("vip-stale", Some("vipd:gone-uid")), ("mv-user", None)] {
        lab.exec(
            "node-a",
            "ip",
            &[
                "link", "add", "link", "eth0", "name", name, "type", "macvlan", "mode", "bridge",
            ],
        )
        .unwrap();
        if let Some(alias) = alias {
            lab.exec("node-a", "ip", &["link", "set", name, "alias", alias])
                .unwrap();
        }
    }
    let server_mac = lab.mac_of("dhcp").unwrap();
    let cap = ServerCapture::start(&lab);
    let lab = &lab;
    in_node_a(lab, async || {
        let dhcp = RawDhcp::open().unwrap();
        // Stale marked macvlans go, foreign ones stay.
        let removed = dhcp.macvlans().remove_stale(&[]).await.unwrap();
        assert_eq!(removed, vec!["vip-stale".to_string()]);
        let l = links(lab);
        assert!(!l.contains("vip-stale") && l.contains("mv-user"), "{l}");

        // Bind: the requested address (INIT-REBOOT), from the pool.
        let mut h = dhcp.start(spec(Some(REQUESTED)));
        let b = bound(&mut h, "the first lease", Duration::from_secs(15)).await;
        assert_eq!(b.addr, IpAddr::V4(REQUESTED));
        assert!(in_pool(v4(&b)));
        assert_eq!(b.server, IpAddr::V4(DHCP_SERVER_V4));
        hold(lab, v4(&b));
        let l = links(lab);
        assert!(
            l.contains(&format!("{MACVLAN}@eth0")) && l.contains("alias vipd:test-service-uid"),
            "{l}"
        );
        assert!(l.contains(MAC_TEXT), "{l}");
        for (key, want) in [
            ("rp_filter", "0"),
            ("arp_ignore", "1"),
            ("arp_announce", "2"),
        ] {
            let got = std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{MACVLAN}/{key}"))
                .unwrap();
            assert_eq!(got.trim(), want, "{key}");
        }
        let leases = lab.dnsmasq_leases().unwrap();
        assert!(
            leases
                .iter()
                .any(|l| l.addr == REQUESTED && l.mac == MAC_TEXT),
            "{leases:?}"
        );

        // T1: renewing by unicast from the macvlan's MAC and the leased address (the
        // Renewing state lasts one round trip: the watch may skip it; the longer lease
        // shows the renewal happened).
        let renewed = match wait_state(
            &mut h,
            "a renewed lease",
            Duration::from_secs(70),
            |s| matches!(s, DhcpState::Bound(nb) if nb.expires > b.expires),
        )
        .await
        {
            DhcpState::Bound(nb) => nb,
            other => unreachable!("{other:?}"),
        };
        assert_eq!(renewed.addr, IpAddr::V4(REQUESTED));
        let renewal = cap
            .wait_for("renewal", Duration::from_secs(5), |s| {
                s.kind == Some(MessageType::Request) && s.ciaddr == REQUESTED
            })
            .await;
        for s in &renewal {
            assert_eq!(s.eth_src, MAC, "{s:?}");
            assert_eq!(
                pnet::util::MacAddr::from(s.eth_dst),
                server_mac,
                "unicast to the server: {s:?}"
            );
            assert_eq!((s.ip_src, s.ip_dst), (REQUESTED, DHCP_SERVER_V4), "{s:?}");
        }
        let log = lab.dnsmasq_log();
        assert!(
            log.contains(&format!("DHCPREQUEST(eth0) {REQUESTED} {MAC_TEXT}")),
            "{log}"
        );

        // Server gone past expiry: renewing at T1 unanswered, rebinding (broadcast) at
        // T2 (105 s after the renewal), then Lost at expiry.
        tokio::task::block_in_place(|| lab.stop_dnsmasq()).unwrap();
        wait_state(&mut h, "rebinding at T2", Duration::from_secs(120), |s| {
            matches!(s, DhcpState::Rebinding(_))
        })
        .await;
        let lost = wait_state(&mut h, "Lost at expiry", Duration::from_secs(30), |s| {
            matches!(s, DhcpState::Lost { .. })
        })
        .await;
        assert!(
            tokio::time::Instant::now() >= renewed.expires,
            "held until the lease expired"
        );
        let DhcpState::Lost { reason } = lost else {
            unreachable!()
        };
        assert!(
            reason.contains("expired") && reason.contains(&REQUESTED.to_string()),
            "{reason}"
        );
        lab.exec("node-a", "ip", &["addr", "flush", "dev", MACVLAN])
            .unwrap();
        let rebinds = cap
            .seen()
            .into_iter()
            .filter(|s| s.ciaddr == REQUESTED && s.ip_dst == Ipv4Addr::BROADCAST)
            .count();
        assert!(rebinds > 0, "rebinding is broadcast: {:?}", cap.seen());

        // Server back: the same address again.
        tokio::task::block_in_place(|| lab.start_dnsmasq(&DnsmasqOptions::default())).unwrap();
        let again = bound(
            &mut h,
            "the lease after the server came back",
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(again.addr, IpAddr::V4(REQUESTED));

        // Stop without release (leadership loss): macvlan gone, the lease kept; a new
        // client with the same MAC and requested address gets it back at once.
        h.stop().await;
        assert!(!links(lab).contains(MACVLAN));
        let log_before = lab.dnsmasq_log();
        assert!(!log_before.contains("DHCPRELEASE"), "{log_before}");
        assert!(
            lab.dnsmasq_leases()
                .unwrap()
                .iter()
                .any(|l| l.addr == REQUESTED)
        );
        let mut h = dhcp.start(spec(Some(REQUESTED)));
        let b = bound(&mut h, "the lease after a restart", Duration::from_secs(15)).await;
        assert_eq!(b.addr, IpAddr::V4(REQUESTED));

        // Release: DHCPRELEASE, dnsmasq frees the lease; macvlan gone, the foreign one kept.
        h.release_and_stop().await;
        wait_until(
            "the lease freed in dnsmasq's lease file",
            Duration::from_secs(5),
            || {
                lab.dnsmasq_leases()
                    .unwrap()
                    .iter()
                    .all(|l| l.addr != REQUESTED)
            },
        );
        assert!(
            lab.dnsmasq_log()
                .contains(&format!("DHCPRELEASE(eth0) {REQUESTED} {MAC_TEXT}"))
        );
        let l = links(lab);
        assert!(!l.contains(MACVLAN) && l.contains("mv-user"), "{l}");
    });
}

/// A server that no longer serves the address NAKs the INIT-REBOOT request; the client
/// falls back to DISCOVER and binds an address of the new range.
#[test]
fn dhcp_client_nak_on_init_reboot_falls_back_to_discover() {
    let Some(lab) = lab(
        "dhcp_nak",
        LabOptions {
            local_api: false,
            ..LabOptions::default()
        },
    ) else {
        return;
    };
    let new_range = (Ipv4Addr::new(192, 0, 2, 215), Ipv4Addr::new(192, 0, 2, 220));
    lab.start_dnsmasq(&DnsmasqOptions {
        range: new_range,
        ..DnsmasqOptions::default()
    })
    .unwrap();
    let lab = &lab;
    in_node_a(lab, async || {
        let dhcp = RawDhcp::open().unwrap();
        let mut h = dhcp.start(spec(Some(REQUESTED)));
        let b = bound(
            &mut h,
            "a lease from the new range",
            Duration::from_secs(20),
        )
        .await;
        assert!(
            (u32::from(new_range.0)..=u32::from(new_range.1)).contains(&u32::from(v4(&b))),
            "{b:?}"
        );
        h.stop().await;
    });
    let log = lab.dnsmasq_log();
    assert!(
        log.contains(&format!("DHCPNAK(eth0) {REQUESTED} {MAC_TEXT}")),
        "{log}"
    );
}
