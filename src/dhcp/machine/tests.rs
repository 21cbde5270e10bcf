use super::*;

pub(crate) const MAC: [u8; 6] = [0x02, 0x42, 0, 0, 0, 7];
pub(crate) const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub(crate) const ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 201);

fn cfg(requested: Option<Ipv4Addr>) -> ClientConfig {
    ClientConfig {
        mac: MAC,
        hostname: Some("lb-1".into()),
        broadcast: true,
        requested,
        max_attempts: 0,
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn kind(o: &Outgoing) -> MessageType {
    o.msg.opts().msg_type().unwrap()
}

fn opt50(o: &Outgoing) -> Option<Ipv4Addr> {
    match o.msg.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(a)) => Some(*a),
        _ => None,
    }
}

fn opt54(o: &Outgoing) -> Option<Ipv4Addr> {
    match o.msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(a)) => Some(*a),
        _ => None,
    }
}

/// A server reply of `kind` to `req`, with a 120 s lease (dnsmasq's minimum) and no T1/T2.
pub(crate) fn reply(req: &Outgoing, kind: MessageType, yiaddr: Ipv4Addr) -> Message {
    let mut m = Message::new_with_id(
        req.msg.xid(),
        Ipv4Addr::UNSPECIFIED,
        yiaddr,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &MAC,
    );
    m.set_opcode(Opcode::BootReply);
    m.opts_mut().insert(DhcpOption::MessageType(kind));
    m.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
    if kind != MessageType::Nak {
        m.opts_mut().insert(DhcpOption::AddressLeaseTime(120));
        m.opts_mut()
            .insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
    } else {
        m.opts_mut()
            .insert(DhcpOption::Message("address not available".into()));
    }
    m
}

fn one(v: Vec<Outgoing>) -> Outgoing {
    assert_eq!(v.len(), 1, "{v:?}");
    v.into_iter().next().unwrap()
}

/// INIT from `t0`: DISCOVER, OFFER, REQUEST, ACK at `t0`; returns the machine, bound.
fn bound(t0: Instant) -> Machine {
    let mut m = Machine::new(cfg(None), t0, 7);
    let discover = one(m.on_timeout(t0));
    let request = one(m.on_message(t0, &reply(&discover, MessageType::Offer, ADDR)));
    assert!(
        m.on_message(t0, &reply(&request, MessageType::Ack, ADDR))
            .is_empty()
    );
    m
}

#[test]
fn init_discovers_then_requests_the_offer_with_options() {
    let t0 = Instant::now();
    let mut m = Machine::new(cfg(None), t0, 1);
    assert_eq!(m.deadline(), Some(t0));
    assert_eq!(
        m.state(),
        DhcpState::Requesting {
            attempt: 0,
            last_error: None
        }
    );
    let d = one(m.on_timeout(t0));
    assert_eq!(kind(&d), MessageType::Discover);
    assert_eq!((d.dest, d.src), (Dest::Broadcast, Ipv4Addr::UNSPECIFIED));
    assert!(d.msg.flags().broadcast());
    assert_eq!(&d.msg.chaddr()[..6], &MAC);
    assert_eq!(opt50(&d), None);
    assert_eq!(
        d.msg.opts().get(OptionCode::ClientIdentifier),
        Some(&DhcpOption::ClientIdentifier(vec![
            1, 0x02, 0x42, 0, 0, 0, 7
        ]))
    );
    assert_eq!(
        d.msg.opts().get(OptionCode::Hostname),
        Some(&DhcpOption::Hostname("lb-1".into()))
    );
    // The REQUEST keeps the xid and names the offer and its server (RFC 2131 §4.4.1).
    let r = one(m.on_message(t0 + secs(1) / 2, &reply(&d, MessageType::Offer, ADDR)));
    assert_eq!(kind(&r), MessageType::Request);
    assert_eq!(r.msg.xid(), d.msg.xid());
    assert_eq!((opt50(&r), opt54(&r)), (Some(ADDR), Some(SERVER)));
    assert_eq!(r.msg.ciaddr(), Ipv4Addr::UNSPECIFIED);
    let sent = t0 + secs(1) / 2;
    m.on_message(t0 + secs(1), &reply(&r, MessageType::Ack, ADDR));
    // Times count from the REQUEST (§4.4.1); defaults T1 = 0.5, T2 = 0.875 of the lease.
    assert_eq!(
        m.state(),
        DhcpState::Bound(DhcpBinding {
            addr: ADDR.into(),
            prefix_len: 24,
            server: SERVER.into(),
            expires: sent + secs(120),
            t1: sent + secs(60),
            t2: sent + secs(105),
        })
    );
}

#[test]
fn no_broadcast_flag_unless_asked() {
    let t0 = Instant::now();
    let mut c = cfg(None);
    c.broadcast = false;
    let mut m = Machine::new(c, t0, 1);
    assert!(!one(m.on_timeout(t0)).msg.flags().broadcast());
}

#[test]
fn init_reboot_asks_for_the_requested_address_then_falls_back_to_discover() {
    let t0 = Instant::now();
    let mut m = Machine::new(cfg(Some(ADDR)), t0, 1);
    let r = one(m.on_timeout(t0));
    assert_eq!(kind(&r), MessageType::Request);
    assert_eq!((opt50(&r), opt54(&r)), (Some(ADDR), None));
    assert_eq!(r.msg.ciaddr(), Ipv4Addr::UNSPECIFIED);
    // NAK: DISCOVER at once, still hinting the address.
    let d = one(m.on_message(t0, &reply(&r, MessageType::Nak, Ipv4Addr::UNSPECIFIED)));
    assert_eq!(kind(&d), MessageType::Discover);
    assert_eq!(opt50(&d), Some(ADDR));

    // No answer at all (a server with no record of the client stays silent, RFC 2131
    // §4.3.2: issue 26's keep-IP gap): retransmitted once after 1 s, then DISCOVER 1 s
    // later, each wait randomised by ±25 % (RFC 2131 §4.1), nothing sent before its
    // deadline; the DISCOVER's exchange then waits as usual (1 s first).
    let mut m = Machine::new(cfg(Some(ADDR)), t0, 1);
    one(m.on_timeout(t0));
    let mut last = t0;
    for (base, next) in [
        (1, MessageType::Request),
        (1, MessageType::Discover),
        (1, MessageType::Discover),
    ] {
        let at = m.deadline().unwrap();
        let wait = at - last;
        assert!(
            wait >= secs(base) * 3 / 4 && wait <= secs(base) * 5 / 4,
            "{wait:?} after a {base} s wait"
        );
        assert!(m.on_timeout(at - Duration::from_millis(1)).is_empty());
        let out = one(m.on_timeout(at));
        assert_eq!((kind(&out), opt50(&out)), (next, Some(ADDR)));
        last = at;
    }
}

#[test]
fn renews_at_t1_by_unicast_rebinds_at_t2_by_broadcast() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    assert_eq!(m.deadline(), Some(t0 + secs(60)));
    assert!(m.on_timeout(t0 + secs(59)).is_empty());
    let r = one(m.on_timeout(t0 + secs(60)));
    assert!(matches!(m.state(), DhcpState::Renewing(_)));
    assert_eq!(kind(&r), MessageType::Request);
    assert_eq!(
        (r.dest, r.src, r.msg.ciaddr()),
        (Dest::Unicast(SERVER), ADDR, ADDR)
    );
    assert_eq!((opt50(&r), opt54(&r)), (None, None));
    assert!(!r.msg.flags().broadcast(), "ciaddr set: no broadcast flag");
    // Retransmissions: half the time to T2 (105 s), at least 4 s, never past T2.
    assert_eq!(
        m.deadline(),
        Some(t0 + secs(60) + Duration::from_millis(22_500))
    );
    let mut at = m.deadline().unwrap();
    while at < t0 + secs(105) {
        let again = one(m.on_timeout(at));
        assert_eq!(again.dest, Dest::Unicast(SERVER));
        at = m.deadline().unwrap();
        assert!(at <= t0 + secs(105));
    }
    let rb = one(m.on_timeout(t0 + secs(105)));
    assert!(matches!(m.state(), DhcpState::Rebinding(_)));
    assert_eq!(
        (rb.dest, rb.src, rb.msg.ciaddr()),
        (Dest::Broadcast, ADDR, ADDR)
    );
    // An ACK to the rebind: bound again, times from that REQUEST.
    m.on_message(t0 + secs(106), &reply(&rb, MessageType::Ack, ADDR));
    let DhcpState::Bound(b) = m.state() else {
        panic!("{:?}", m.state())
    };
    assert_eq!(b.expires, t0 + secs(105 + 120));
}

#[test]
fn renewal_ack_keeps_bound() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    let r = one(m.on_timeout(t0 + secs(60)));
    m.on_message(t0 + secs(60), &reply(&r, MessageType::Ack, ADDR));
    let DhcpState::Bound(b) = m.state() else {
        panic!("{:?}", m.state())
    };
    assert_eq!((b.addr, b.t1), (ADDR.into(), t0 + secs(120)));
}

#[test]
fn expiry_is_lost_at_once_then_asks_for_the_old_address() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    let mut now = t0 + secs(60);
    while now < t0 + secs(120) {
        m.on_timeout(now);
        assert!(m.state().binding().is_some(), "{:?}", m.state());
        now = m.deadline().unwrap();
    }
    assert_eq!(now, t0 + secs(120));
    assert!(m.on_timeout(now).is_empty());
    let DhcpState::Lost { reason } = m.state() else {
        panic!("{:?}", m.state())
    };
    assert!(
        reason.contains("192.0.2.201") && reason.contains("expired"),
        "{reason}"
    );
    let r = one(m.on_timeout(now + LOST_HOLDOFF));
    assert_eq!(
        (kind(&r), opt50(&r), opt54(&r)),
        (MessageType::Request, Some(ADDR), None)
    );
    assert!(matches!(
        m.state(),
        DhcpState::Requesting { attempt: 0, .. }
    ));
    m.on_message(now + LOST_HOLDOFF, &reply(&r, MessageType::Ack, ADDR));
    assert_eq!(m.state().binding().map(|b| b.addr), Some(ADDR.into()));
}

#[test]
fn nak_while_renewing_is_lost_at_once() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    let r = one(m.on_timeout(t0 + secs(60)));
    m.on_message(
        t0 + secs(61),
        &reply(&r, MessageType::Nak, Ipv4Addr::UNSPECIFIED),
    );
    let DhcpState::Lost { reason } = m.state() else {
        panic!("{:?}", m.state())
    };
    assert_eq!(
        reason,
        "DHCPNAK for 192.0.2.201 from 192.0.2.1: address not available"
    );
    assert_eq!(m.deadline(), Some(t0 + secs(61) + LOST_HOLDOFF));
}

#[test]
fn no_server_counts_attempts_with_capped_backoff() {
    let t0 = Instant::now();
    let mut m = Machine::new(cfg(None), t0, 1);
    let mut now = t0;
    let mut waits = Vec::new();
    for attempt in 0..10u32 {
        // One attempt: 4 DISCOVERs over 11 s.
        let mut sends = 0;
        loop {
            let out = m.on_timeout(now);
            if out.is_empty() {
                break;
            }
            sends += out.len();
            now = m.deadline().unwrap();
        }
        assert_eq!(sends, 4);
        let DhcpState::Requesting {
            attempt: a,
            last_error,
        } = m.state()
        else {
            panic!("{:?}", m.state())
        };
        assert_eq!(a, attempt + 1);
        let last_error = last_error.unwrap_or_default();
        assert!(
            last_error.starts_with("no DHCPOFFER from any server (4 DHCPDISCOVERs over "),
            "{last_error}"
        );
        let failed_at = now;
        now = m.deadline().unwrap();
        waits.push(now - failed_at);
    }
    // 1 s doubling to 60 s, each randomised by up to ±25 % (RFC 2131 §4.1), per MAC.
    let base = [1, 2, 4, 8, 16, 32, 60, 60, 60, 60].map(secs);
    for (i, (w, b)) in waits.iter().zip(base).enumerate() {
        assert_eq!(*w, backoff_v4(i as u32 + 1, &MAC), "wait {i}");
        assert!(
            *w >= b * 3 / 4 && *w <= b * 5 / 4,
            "wait {i}: {w:?} from {b:?}"
        );
    }
    assert!(
        waits.iter().zip(base).any(|(w, b)| *w != b),
        "randomised: {waits:?}"
    );
}

/// The wait between failed attempts is jittered per client: fixed for one MAC (the machine
/// stays pure, a test sees fixed times), different for two MACs of one node, so clients that
/// failed together do not retry in step.
#[test]
fn backoff_is_jittered_per_mac() {
    let other = [0x02, 0x42, 0, 0, 0, 8];
    let waits = |mac: &[u8; 6]| (1..=10).map(|f| backoff_v4(f, mac)).collect::<Vec<_>>();
    assert_eq!(waits(&MAC), waits(&MAC), "one MAC: the same waits");
    assert_ne!(waits(&MAC), waits(&other), "two MACs: different waits");
    let differ = waits(&MAC)
        .iter()
        .zip(waits(&other))
        .take(6)
        .filter(|(a, b)| **a != *b)
        .count();
    assert!(differ >= 5, "{differ} of the 6 uncapped waits differ");
    // Across many clients the waits spread over the whole ±25 % window (32 s: 24..40 s).
    let spread = |failures: u32| -> Vec<Duration> {
        (0..200u8)
            .map(|i| backoff_v4(failures, &[0x02, 0x42, 0, 0, 1, i]))
            .collect()
    };
    let s6 = spread(6);
    let (lo, hi) = (s6.iter().min().unwrap(), s6.iter().max().unwrap());
    assert!(*lo < secs(26) && *hi > secs(38), "{lo:?}..{hi:?}");
    assert!(*lo >= secs(24) && *hi <= secs(40), "{lo:?}..{hi:?}");
    // At the cap (60 s) the waits spread below it, never above.
    let s7 = spread(7);
    let (lo, hi) = (s7.iter().min().unwrap(), s7.iter().max().unwrap());
    assert!(*lo < secs(48) && *lo >= secs(45), "{lo:?}");
    assert_eq!(*hi, BACKOFF_CAP, "never above the cap");
}

#[test]
fn nak_to_a_request_is_a_failed_attempt() {
    let t0 = Instant::now();
    let mut m = Machine::new(cfg(None), t0, 1);
    let d = one(m.on_timeout(t0));
    let r = one(m.on_message(t0, &reply(&d, MessageType::Offer, ADDR)));
    m.on_message(t0, &reply(&r, MessageType::Nak, Ipv4Addr::UNSPECIFIED));
    assert_eq!(
        m.state(),
        DhcpState::Requesting {
            attempt: 1,
            last_error: Some(
                "DHCPNAK for 192.0.2.201 from 192.0.2.1: address not available".into()
            )
        }
    );
    assert_eq!(m.deadline(), Some(t0 + backoff_v4(1, &MAC)));
}

#[test]
fn decline_sends_decline_and_never_asks_for_it_again() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    assert!(m.decline(t0, Ipv4Addr::new(192, 0, 2, 99)).is_empty());
    let d = one(m.decline(t0 + secs(1), ADDR));
    assert_eq!(kind(&d), MessageType::Decline);
    assert_eq!((d.dest, d.src), (Dest::Broadcast, Ipv4Addr::UNSPECIFIED));
    assert_eq!((opt50(&d), opt54(&d)), (Some(ADDR), Some(SERVER)));
    let DhcpState::Lost { reason } = m.state() else {
        panic!("{:?}", m.state())
    };
    assert!(reason.contains("DHCPDECLINE"), "{reason}");
    assert!(
        m.on_timeout(t0 + secs(10)).is_empty(),
        "waits 10 s (RFC 2131 §3.1.5)"
    );
    let disc = one(m.on_timeout(t0 + secs(11)));
    assert_eq!((kind(&disc), opt50(&disc)), (MessageType::Discover, None));
    // The same address offered again is ignored; another one is taken.
    assert!(
        m.on_message(t0 + secs(11), &reply(&disc, MessageType::Offer, ADDR))
            .is_empty()
    );
    let other = Ipv4Addr::new(192, 0, 2, 202);
    let r = one(m.on_message(t0 + secs(11), &reply(&disc, MessageType::Offer, other)));
    assert_eq!(opt50(&r), Some(other));
}

#[test]
fn release_only_when_asked() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    assert!(m.clone().stop(t0, false).is_empty());
    let rel = one(m.stop(t0, true));
    assert_eq!(kind(&rel), MessageType::Release);
    assert_eq!(
        (rel.dest, rel.src, rel.msg.ciaddr()),
        (Dest::Unicast(SERVER), ADDR, ADDR)
    );
    assert_eq!(opt54(&rel), Some(SERVER));
    assert_eq!(m.deadline(), None);
    // Nothing to release without a lease.
    let mut fresh = Machine::new(cfg(None), t0, 1);
    assert!(fresh.stop(t0, true).is_empty());
}

#[test]
fn foreign_replies_and_bad_acks_are_ignored() {
    let t0 = Instant::now();
    let mut m = Machine::new(cfg(None), t0, 1);
    let d = one(m.on_timeout(t0));
    let mut wrong_xid = reply(&d, MessageType::Offer, ADDR);
    wrong_xid.set_xid(d.msg.xid().wrapping_add(1));
    assert!(m.on_message(t0, &wrong_xid).is_empty());
    let mut wrong_mac = reply(&d, MessageType::Offer, ADDR);
    wrong_mac.set_chaddr(&[0x02, 0, 0, 0, 0, 1]);
    assert!(m.on_message(t0, &wrong_mac).is_empty());
    let r = one(m.on_message(t0, &reply(&d, MessageType::Offer, ADDR)));
    let mut no_lease = reply(&r, MessageType::Ack, ADDR);
    no_lease.opts_mut().remove(OptionCode::AddressLeaseTime);
    m.on_message(t0, &no_lease);
    assert!(m.state().binding().is_none());
    // T1/T2 out of order: the defaults.
    let mut bad_times = reply(&r, MessageType::Ack, ADDR);
    bad_times.opts_mut().insert(DhcpOption::Renewal(100));
    bad_times.opts_mut().insert(DhcpOption::Rebinding(50));
    m.on_message(t0, &bad_times);
    let b = m.state().binding().cloned().unwrap();
    assert_eq!((b.t1, b.t2), (t0 + secs(60), t0 + secs(105)));
}

#[test]
fn server_t1_t2_are_used() {
    let t0 = Instant::now();
    let mut m = Machine::new(cfg(None), t0, 1);
    let d = one(m.on_timeout(t0));
    let r = one(m.on_message(t0, &reply(&d, MessageType::Offer, ADDR)));
    let mut ack = reply(&r, MessageType::Ack, ADDR);
    ack.opts_mut().insert(DhcpOption::Renewal(30));
    ack.opts_mut().insert(DhcpOption::Rebinding(90));
    m.on_message(t0, &ack);
    let b = m.state().binding().cloned().unwrap();
    assert_eq!(
        (b.t1, b.t2, b.expires),
        (t0 + secs(30), t0 + secs(90), t0 + secs(120))
    );
}

#[test]
fn backoff_doubles_to_the_cap() {
    assert_eq!(backoff(1), secs(1));
    assert_eq!(backoff(3), secs(4));
    assert_eq!(backoff(7), secs(60));
    assert_eq!(backoff(u32::MAX), BACKOFF_CAP);
}

/// The failed attempts counted so far (`Requesting`'s `attempt`, `GaveUp`'s `attempts`).
fn failed(m: &Machine) -> u32 {
    match m.state() {
        DhcpState::Requesting { attempt, .. } => attempt,
        DhcpState::GaveUp { attempts, .. } => attempts,
        _ => 0,
    }
}

/// Runs the machine from `now` without a server until one more attempt has failed (a Lost
/// state's hold-off and a backoff wait included); returns the messages sent and the time
/// the attempt failed.
fn fail_one(m: &mut Machine, mut now: Instant) -> (usize, Instant) {
    let before = failed(m);
    let mut sends = 0;
    loop {
        sends += m.on_timeout(now).len();
        if failed(m) > before {
            return (sends, now);
        }
        now = m.deadline().expect("a deadline while trying");
    }
}

fn limited(max_attempts: u32) -> ClientConfig {
    ClientConfig {
        max_attempts,
        ..cfg(None)
    }
}

#[test]
fn gives_up_after_exactly_the_limit_of_failed_attempts() {
    let t0 = Instant::now();
    let mut m = Machine::new(limited(3), t0, 1);
    let mut now = t0;
    for attempt in 1..=2 {
        let (sends, at) = fail_one(&mut m, now);
        assert_eq!(sends, 4);
        assert!(
            matches!(m.state(), DhcpState::Requesting { attempt: a, .. } if a == attempt),
            "{:?}",
            m.state()
        );
        now = at;
    }
    let (sends, at) = fail_one(&mut m, now);
    assert_eq!(sends, 4, "the third attempt is made in full");
    // 1 + 2 + 4 + 4 s, each randomised by the retransmission spread.
    assert!(
        matches!(m.state(), DhcpState::GaveUp { attempts: 3, ref last_error }
            if last_error.starts_with("no DHCPOFFER from any server (4 DHCPDISCOVERs over ")),
        "{:?}",
        m.state()
    );
    // Nothing more: no deadline, no sends however late, replies ignored.
    assert_eq!((m.deadline(), m.xid()), (None, None));
    assert!(m.on_timeout(at + Duration::from_secs(3600)).is_empty());
    assert!(m.decline(at, ADDR).is_empty());
    assert!(m.stop(at, true).is_empty(), "nothing to release");
}

#[test]
fn a_nak_to_the_last_allowed_request_gives_up_too() {
    let t0 = Instant::now();
    let mut m = Machine::new(limited(1), t0, 1);
    let d = one(m.on_timeout(t0));
    let r = one(m.on_message(t0, &reply(&d, MessageType::Offer, ADDR)));
    assert!(
        m.on_message(t0, &reply(&r, MessageType::Nak, Ipv4Addr::UNSPECIFIED))
            .is_empty()
    );
    let DhcpState::GaveUp {
        attempts: 1,
        last_error,
    } = m.state()
    else {
        panic!("{:?}", m.state())
    };
    assert!(
        last_error.starts_with("DHCPNAK for 192.0.2.201"),
        "{last_error}"
    );
    assert_eq!(m.deadline(), None);
}

#[test]
fn never_gives_up_without_a_limit() {
    let t0 = Instant::now();
    let mut m = Machine::new(limited(0), t0, 1);
    let mut now = t0;
    for attempt in 1..=50 {
        let (sends, at) = fail_one(&mut m, now);
        assert_eq!(sends, 4);
        assert_eq!(failed(&m), attempt);
        assert!(matches!(m.state(), DhcpState::Requesting { .. }));
        now = at;
    }
    assert!(m.deadline().is_some());
}

#[test]
fn a_lease_resets_the_count_and_a_lost_lease_counts_afresh() {
    let t0 = Instant::now();
    let mut m = Machine::new(limited(3), t0, 1);
    let (_, now) = fail_one(&mut m, t0);
    fail_one(&mut m, now);
    assert_eq!(failed(&m), 2);
    // The third attempt gets a lease.
    let mut now = m.deadline().unwrap();
    let d = one(m.on_timeout(now));
    let r = one(m.on_message(now, &reply(&d, MessageType::Offer, ADDR)));
    m.on_message(now, &reply(&r, MessageType::Ack, ADDR));
    assert!(matches!(m.state(), DhcpState::Bound(_)), "{:?}", m.state());
    // NAKed at renewal: lost, then two failed attempts are not yet the limit...
    now = m.deadline().unwrap();
    let renew = one(m.on_timeout(now));
    m.on_message(now, &reply(&renew, MessageType::Nak, Ipv4Addr::UNSPECIFIED));
    assert!(matches!(m.state(), DhcpState::Lost { .. }));
    for attempt in 1..=2 {
        (_, now) = fail_one(&mut m, now);
        assert!(
            matches!(m.state(), DhcpState::Requesting { attempt: a, .. } if a == attempt),
            "{:?}",
            m.state()
        );
    }
    // ...the third is.
    fail_one(&mut m, now);
    assert!(
        matches!(m.state(), DhcpState::GaveUp { attempts: 3, .. }),
        "{:?}",
        m.state()
    );
}

#[test]
fn failures_counted_before_the_machine_count_towards_the_limit() {
    let t0 = Instant::now();
    let mut m = Machine::new(limited(3), t0, 1).after_failures(2);
    assert_eq!(failed(&m), 2);
    fail_one(&mut m, t0);
    assert!(
        matches!(m.state(), DhcpState::GaveUp { attempts: 3, .. }),
        "{:?}",
        m.state()
    );
}

#[test]
fn exhausted_is_the_limit_rule() {
    assert!(!exhausted(0, 0) && !exhausted(u32::MAX, 0), "0: no limit");
    assert!(!exhausted(2, 3) && exhausted(3, 3) && exhausted(4, 3));
    assert!(exhausted(1, 1));
}

/// RFC 2131 §4.1 randomisation: each wait within ±spread of its base, the same for one
/// (xid, send), different across transactions, so clients started together spread out.
#[test]
fn retransmission_waits_are_randomised_within_the_spread() {
    use super::jittered;
    let base = secs(4);
    let waits: Vec<Duration> = (0..200u32)
        .map(|xid| jittered(base, xid.wrapping_mul(2_654_435_761), 1, 25))
        .collect();
    assert!(
        waits.iter().all(|w| *w >= secs(3) && *w <= secs(5)),
        "{waits:?}"
    );
    let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
    assert!(
        distinct.len() > 150,
        "{} distinct waits of 200",
        distinct.len()
    );
    // Both halves of the range are used.
    assert!(waits.iter().any(|w| *w < Duration::from_millis(3500)));
    assert!(waits.iter().any(|w| *w > Duration::from_millis(4500)));
    assert_eq!(jittered(base, 7, 2, 25), jittered(base, 7, 2, 25));
    assert_eq!(jittered(base, 7, 2, 0), base);
}
