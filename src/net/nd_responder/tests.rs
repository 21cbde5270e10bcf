use super::*;
use crate::net::arp::tests::icmpv6_sum_ok;
use crate::net::conflict::dad_probe_frame;
use std::time::Duration;

const PEER: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const OPT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];
const OURS: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn vip() -> Ipv6Addr {
    v6("2001:db8:0:5::55")
}

/// Recomputes the ICMPv6 checksum of an Ethernet/IPv6/ICMPv6 frame.
fn fix_checksum(f: &mut [u8]) {
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&f[22..38]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap());
    f[56] = 0;
    f[57] = 0;
    let sum = icmpv6::checksum(&Icmpv6Packet::new(&f[54..]).unwrap(), &src, &dst);
    f[56..58].copy_from_slice(&sum.to_be_bytes());
}

/// A neighbour solicitation from `src` to `dst` for `target`, Ethernet source [`PEER`],
/// followed by the raw `options`, checksum valid.
fn ns_frame(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr, options: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 40 + 24];
    f[0..6].copy_from_slice(&solicited_node(target).1);
    f[6..12].copy_from_slice(&PEER);
    f[12..14].copy_from_slice(&[0x86, 0xdd]);
    f[14] = 0x60;
    let len = u16::try_from(24 + options.len()).unwrap();
    f[18..20].copy_from_slice(&len.to_be_bytes());
    f[20] = 58;
    f[21] = 255;
    f[22..38].copy_from_slice(&src.octets());
    f[38..54].copy_from_slice(&dst.octets());
    f[54] = 135;
    f[62..78].copy_from_slice(&target.octets());
    f.extend_from_slice(options);
    fix_checksum(&mut f);
    f
}

fn source_ll(mac: [u8; 6]) -> Vec<u8> {
    let mut o = vec![1, 1];
    o.extend_from_slice(&mac);
    o
}

fn client() -> Ipv6Addr {
    v6("2001:db8:0:4::2")
}

#[test]
fn a_solicitation_with_a_source_link_layer_option_parses() {
    let group = solicited_node(vip()).0;
    let f = ns_frame(client(), group, vip(), &source_ll(OPT_MAC));
    assert_eq!(
        solicitation_in_frame(&f),
        Some(Solicitation {
            eth_src: PEER,
            src: client(),
            dst: group,
            target: vip(),
            source_ll: Some(OPT_MAC),
        })
    );
}

#[test]
fn a_unicast_solicitation_without_options_parses() {
    let f = ns_frame(client(), vip(), vip(), &[]);
    let s = solicitation_in_frame(&f).unwrap();
    assert_eq!(
        (s.src, s.dst, s.target, s.source_ll),
        (client(), vip(), vip(), None)
    );
    // An unknown option (type 14, nonce) is skipped; the link-layer option after it counts.
    let mut opts = vec![14, 1, 1, 2, 3, 4, 5, 6];
    opts.extend(source_ll(OPT_MAC));
    let f = ns_frame(client(), vip(), vip(), &opts);
    assert_eq!(solicitation_in_frame(&f).unwrap().source_ll, Some(OPT_MAC));
    // Ethernet padding after the IPv6 payload is ignored.
    let mut padded = ns_frame(client(), vip(), vip(), &[]);
    padded.extend_from_slice(&[0; 8]);
    assert!(solicitation_in_frame(&padded).is_some());
}

#[test]
fn a_dad_solicitation_parses() {
    let f = dad_probe_frame(PEER, vip());
    assert_eq!(
        solicitation_in_frame(&f),
        Some(Solicitation {
            eth_src: PEER,
            src: Ipv6Addr::UNSPECIFIED,
            dst: solicited_node(vip()).0,
            target: vip(),
            source_ll: None,
        })
    );
}

#[test]
fn invalid_solicitations_are_rejected() {
    let group = solicited_node(vip()).0;
    let good = ns_frame(client(), group, vip(), &source_ll(OPT_MAC));
    assert!(solicitation_in_frame(&good).is_some());

    let mut hop = good.clone();
    hop[21] = 254;
    fix_checksum(&mut hop);
    assert_eq!(solicitation_in_frame(&hop), None, "hop limit 254");

    let mut sum = good.clone();
    sum[57] ^= 1;
    assert_eq!(solicitation_in_frame(&sum), None, "bad checksum");

    let mut code = good.clone();
    code[55] = 1;
    fix_checksum(&mut code);
    assert_eq!(solicitation_in_frame(&code), None, "code 1");

    let mcast = ns_frame(client(), group, v6("ff02::1"), &[]);
    assert_eq!(solicitation_in_frame(&mcast), None, "multicast target");

    for cut in [0, 13, 14, 53, 60, good.len() - 1] {
        assert_eq!(
            solicitation_in_frame(&good[..cut]),
            None,
            "truncated at {cut}"
        );
    }

    let zero = ns_frame(client(), group, vip(), &[1, 0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(solicitation_in_frame(&zero), None, "option length 0");

    let long = ns_frame(client(), group, vip(), &[1, 2, 1, 2, 3, 4, 5, 6]);
    assert_eq!(solicitation_in_frame(&long), None, "option past the packet");

    let dad_ll = ns_frame(Ipv6Addr::UNSPECIFIED, group, vip(), &source_ll(OPT_MAC));
    assert_eq!(
        solicitation_in_frame(&dad_ll),
        None,
        "DAD with a source link-layer option"
    );

    let dad_unicast = ns_frame(Ipv6Addr::UNSPECIFIED, vip(), vip(), &[]);
    assert_eq!(
        solicitation_in_frame(&dad_unicast),
        None,
        "DAD to a non-solicited-node destination"
    );

    let mut na = good.clone();
    na[54] = 136;
    fix_checksum(&mut na);
    assert_eq!(solicitation_in_frame(&na), None, "an advertisement");

    let mut short = ns_frame(client(), group, vip(), &[]);
    short.truncate(14 + 40 + 16);
    short[18..20].copy_from_slice(&16u16.to_be_bytes());
    assert_eq!(solicitation_in_frame(&short), None, "ICMPv6 length 16");
}

/// Checks the advertisement `f` in full; returns (Ethernet dst, IPv6 dst, flags byte).
fn check_advert(f: &[u8], target: Ipv6Addr) -> ([u8; 6], Ipv6Addr, u8) {
    assert_eq!(f.len(), 14 + 40 + 32);
    assert_eq!(&f[6..12], &OURS, "Ethernet source");
    assert_eq!(&f[12..14], &[0x86, 0xdd]);
    assert_eq!(f[14] >> 4, 6);
    assert_eq!(&f[18..20], &32u16.to_be_bytes());
    assert_eq!(f[20], 58);
    assert_eq!(f[21], 255, "hop limit");
    assert_eq!(&f[22..38], &target.octets(), "IPv6 source = the target");
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap());
    let icmp = &f[54..];
    assert_eq!((icmp[0], icmp[1]), (136, 0));
    assert_eq!(&icmp[8..24], &target.octets());
    assert_eq!(&icmp[24..26], &[2, 1], "target link-layer option");
    assert_eq!(&icmp[26..32], &OURS);
    assert!(icmpv6_sum_ok(target, dst, icmp), "checksum");
    let mut eth_dst = [0u8; 6];
    eth_dst.copy_from_slice(&f[..6]);
    (eth_dst, dst, icmp[4])
}

#[test]
fn an_answer_to_a_solicitation_goes_to_the_solicitor_with_s_and_o() {
    let group = solicited_node(vip()).0;
    let s = solicitation_in_frame(&ns_frame(client(), group, vip(), &source_ll(OPT_MAC))).unwrap();
    let (eth, dst, flags) = check_advert(&advert_frame(OURS, &s), vip());
    assert_eq!(eth, OPT_MAC, "the source link-layer option wins");
    assert_eq!(dst, client());
    assert_eq!(flags, 0x60, "S and O set, R clear");

    let s = solicitation_in_frame(&ns_frame(client(), vip(), vip(), &[])).unwrap();
    let (eth, dst, flags) = check_advert(&advert_frame(OURS, &s), vip());
    assert_eq!(eth, PEER, "no option: the Ethernet source");
    assert_eq!(dst, client());
    assert_eq!(flags, 0x60);
}

#[test]
fn an_answer_to_dad_goes_to_all_nodes_with_o_only() {
    let s = solicitation_in_frame(&dad_probe_frame(PEER, vip())).unwrap();
    let (eth, dst, flags) = check_advert(&advert_frame(OURS, &s), vip());
    assert_eq!(eth, [0x33, 0x33, 0, 0, 0, 1]);
    assert_eq!(dst, v6("ff02::1"));
    assert_eq!(flags, 0x20, "O set, S and R clear");
}

#[test]
fn a_gate_opens_closes_and_expires() {
    let now = Instant::now();
    let g = AnswerGate::closed();
    assert!(!g.is_open_at(now));
    g.open_until(now + Duration::from_millis(50));
    assert!(g.is_open_at(now));
    assert!(g.is_open_at(now + Duration::from_millis(48)));
    assert!(!g.is_open_at(now + Duration::from_millis(52)), "expired");
    g.open_until(now + Duration::from_secs(10));
    assert!(g.is_open_at(now + Duration::from_secs(9)), "extended");
    g.open_until(now + Duration::from_millis(5));
    assert!(!g.is_open_at(now + Duration::from_secs(1)), "shortened");
    g.close();
    assert!(!g.is_open_at(now));
    g.open_until(now - Duration::from_millis(1).min(now.elapsed()));
    assert!(!g.is_open_at(now + Duration::from_millis(2)), "a past time");
}

/// A fake group socket: records joins and leaves in a shared log; refuses joins with
/// `ENOBUFS` once it holds `cap`.
struct FakeSock {
    id: usize,
    cap: usize,
    held: Mutex<usize>,
    log: Log,
}

impl GroupSocket for FakeSock {
    fn join(&self, group: &Ipv6Addr, ifindex: u32) -> io::Result<()> {
        let mut held = self.held.lock().unwrap();
        if *held >= self.cap {
            return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
        }
        *held += 1;
        self.log
            .lock()
            .unwrap()
            .push((self.id, "join", ifindex, *group));
        Ok(())
    }
    fn leave(&self, group: &Ipv6Addr, ifindex: u32) -> io::Result<()> {
        *self.held.lock().unwrap() -= 1;
        self.log
            .lock()
            .unwrap()
            .push((self.id, "leave", ifindex, *group));
        Ok(())
    }
}

type Log = Arc<Mutex<Vec<(usize, &'static str, u32, Ipv6Addr)>>>;

fn fake_groups(cap: usize) -> (Groups<FakeSock>, Log, Arc<Mutex<usize>>) {
    let log: Log = Arc::default();
    let opened = Arc::new(Mutex::new(0usize));
    let (l, o) = (log.clone(), opened.clone());
    let groups = Groups::new(Box::new(move || {
        let mut n = o.lock().unwrap();
        *n += 1;
        Ok(FakeSock {
            id: *n,
            cap,
            held: Mutex::new(0),
            log: l.clone(),
        })
    }));
    (groups, log, opened)
}

fn group(i: u32) -> Ipv6Addr {
    solicited_node(Ipv6Addr::from(
        0x2001_0db8_0000_0000_0000_0000_0000_0000u128 + u128::from(i),
    ))
    .0
}

#[test]
fn memberships_are_refcounted_per_interface_and_group() {
    let (mut g, log, opened) = fake_groups(usize::MAX);
    g.acquire(2, group(1)).unwrap();
    g.acquire(2, group(1)).unwrap();
    g.acquire(3, group(1)).unwrap();
    assert_eq!(
        log.lock().unwrap().len(),
        2,
        "one join per (ifindex, group)"
    );
    g.release(2, group(1)).unwrap();
    assert_eq!(log.lock().unwrap().len(), 2, "still referenced");
    g.release(2, group(1)).unwrap();
    assert_eq!(log.lock().unwrap()[2], (1, "leave", 2, group(1)));
    g.release(2, group(1)).unwrap();
    assert_eq!(log.lock().unwrap().len(), 3, "unknown: no-op");
    assert_eq!(g.slots.len(), 1);
    g.release(3, group(1)).unwrap();
    assert!(g.slots.is_empty(), "an empty socket is closed");
    assert!(g.members.is_empty());
    assert_eq!(*opened.lock().unwrap(), 1);
}

#[test]
fn memberships_are_packed_and_left_on_the_socket_that_joined() {
    let (mut g, log, opened) = fake_groups(usize::MAX);
    let n = u32::try_from(GROUPS_PER_SOCKET).unwrap() * 2 + 1;
    for i in 0..n {
        g.acquire(2, group(i)).unwrap();
    }
    assert_eq!(*opened.lock().unwrap(), 3);
    assert_eq!(
        g.slots.iter().map(|s| s.members).collect::<Vec<_>>(),
        vec![GROUPS_PER_SOCKET, GROUPS_PER_SOCKET, 1]
    );
    // Leave one of the first socket's groups: it is left on socket 1, and the next join
    // fills the hole there.
    g.release(2, group(5)).unwrap();
    assert_eq!(log.lock().unwrap().last(), Some(&(1, "leave", 2, group(5))));
    g.acquire(2, group(n)).unwrap();
    assert_eq!(log.lock().unwrap().last(), Some(&(1, "join", 2, group(n))));
    // The last socket's only group leaves: the socket is closed.
    g.release(2, group(n - 1)).unwrap();
    assert_eq!(
        log.lock().unwrap().last(),
        Some(&(3, "leave", 2, group(n - 1)))
    );
    assert_eq!(g.slots.len(), 2);
}

#[test]
fn a_full_socket_moves_the_join_to_a_fresh_one() {
    let (mut g, log, opened) = fake_groups(3);
    for i in 0..5 {
        g.acquire(2, group(i)).unwrap();
    }
    assert_eq!(*opened.lock().unwrap(), 2, "ENOBUFS opened a second socket");
    assert_eq!(log.lock().unwrap().last(), Some(&(2, "join", 2, group(4))));
    assert!(g.slots[0].full);
    // A full socket is not tried again even after a leave.
    g.release(2, group(0)).unwrap();
    g.acquire(2, group(9)).unwrap();
    assert_eq!(log.lock().unwrap().last(), Some(&(2, "join", 2, group(9))));
}

#[test]
fn a_join_refused_twice_is_an_error_and_leaves_no_socket() {
    let (mut g, _log, opened) = fake_groups(0);
    let e = g.acquire(2, group(1)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS));
    assert_eq!(*opened.lock().unwrap(), 2, "retried once on a fresh socket");
    assert!(g.slots.is_empty());
    assert!(g.members.is_empty());
}

#[test]
fn a_responder_answers_nothing_until_asked() {
    let r = NdResponder::new();
    assert_eq!(r.answering(), 0);
    r.stop(2, vip(), &Arc::new(AnswerGate::closed()));
    assert_eq!(r.answering(), 0);
    assert!(format!("{r:?}").contains("answering: 0"));
    fn send_sync<T: Send + Sync>() {}
    send_sync::<NdResponder>();
    send_sync::<AnswerGate>();
}

#[test]
fn answering_outside_a_runtime_is_an_error_naming_the_interface_and_address() {
    let r = NdResponder::new();
    let link = LinkInfo {
        index: 7,
        name: "eth0".into(),
        mac: OURS,
        up: true,
        carrier: true,
    };
    let e = r
        .answer(&link, vip(), Arc::new(AnswerGate::closed()))
        .unwrap_err();
    assert!(
        matches!(e, NetError::NdAnswer { ifindex: 7, addr, .. } if addr == vip()),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("2001:db8:0:5::55") && text.contains("index 7"),
        "{text}"
    );
    assert_eq!(r.answering(), 0);
}
