//! The DHCPv6 machine on a paused clock: every step is a call with an explicit instant.

use super::*;
use dhcproto::v6::{DhcpOptions, IAAddr, IANA, StatusCode};
use std::net::IpAddr;

pub(crate) const MAC: [u8; 6] = [0x02, 0x42, 0, 0, 0, 7];
pub(crate) const ADDR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x1005);
const OTHER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x1006);
pub(crate) const SERVER_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 3);
const SERVER_DUID: [u8; 4] = [0, 3, 0, 9];

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn machine(requested: Option<Ipv6Addr>, t0: Instant) -> Machine6 {
    Machine6::new(
        Config6 {
            mac: MAC,
            requested,
            max_attempts: 0,
        },
        t0,
        42,
    )
}

fn one(mut v: Vec<Outgoing6>) -> Outgoing6 {
    assert_eq!(v.len(), 1, "{v:?}");
    v.remove(0)
}

fn ia(o: &Outgoing6) -> IANA {
    match o.msg.opts().get(OptionCode::IANA) {
        Some(DhcpOption::IANA(ia)) => ia.clone(),
        other => panic!("no IA_NA: {other:?}"),
    }
}

fn ia_addr(o: &Outgoing6) -> Option<Ipv6Addr> {
    ia(o).opts.iter().find_map(|x| match x {
        DhcpOption::IAAddr(a) => Some(a.addr),
        _ => None,
    })
}

fn has_server_id(o: &Outgoing6) -> bool {
    o.msg.opts().get(OptionCode::ServerId).is_some()
}

/// The server's answer of `kind` to `req`: same xid and client id, an IA_NA (T1 60 s, T2
/// 105 s) with `addr` (preferred and valid 120 s) or, with `ia_status`, that status instead.
pub(crate) fn answer(
    req: &Outgoing6,
    kind: MessageType,
    addr: Ipv6Addr,
    ia_status: Option<Status>,
) -> Message {
    let mut m = Message::new(kind);
    m.set_xid_num(req.msg.xid_num());
    let opts = m.opts_mut();
    opts.insert(req.msg.opts().get(OptionCode::ClientId).unwrap().clone());
    opts.insert(DhcpOption::ServerId(SERVER_DUID.to_vec()));
    let mut ia_opts = DhcpOptions::new();
    match ia_status {
        Some(status) => ia_opts.insert(DhcpOption::StatusCode(StatusCode {
            status,
            msg: "no".into(),
        })),
        None => ia_opts.insert(DhcpOption::IAAddr(IAAddr {
            addr,
            preferred_life: 120,
            valid_life: 120,
            opts: DhcpOptions::new(),
        })),
    }
    opts.insert(DhcpOption::IANA(IANA {
        id: u32::from_be_bytes([MAC[2], MAC[3], MAC[4], MAC[5]]),
        t1: 60,
        t2: 105,
        opts: ia_opts,
    }));
    m
}

/// Solicit, Advertise, Request, Reply at t0 (+0.5 s): bound to `ADDR`.
fn bound(t0: Instant) -> Machine6 {
    let mut m = machine(None, t0);
    let s = one(m.on_timeout(t0));
    let r = one(m.on_message(
        t0,
        SERVER_LL,
        &answer(&s, MessageType::Advertise, ADDR, None),
    ));
    m.on_message(t0, SERVER_LL, &answer(&r, MessageType::Reply, ADDR, None));
    assert!(matches!(m.state(), DhcpState::Bound(_)), "{:?}", m.state());
    m
}

#[test]
fn solicit_advertise_request_reply_binds_with_duid_ll_and_stable_iaid() {
    let t0 = Instant::now();
    let mut m = machine(Some(ADDR), t0);
    let s = one(m.on_timeout(t0));
    assert_eq!(s.msg.msg_type(), MessageType::Solicit);
    assert_eq!(s.dest, Dest6::AllServers);
    // DUID-LL of the MAC (RFC 8415 §11.4), IAID = the MAC's last four bytes, the hint.
    assert_eq!(
        s.msg.opts().get(OptionCode::ClientId),
        Some(&DhcpOption::ClientId(vec![
            0, 3, 0, 1, 0x02, 0x42, 0, 0, 0, 7
        ]))
    );
    assert_eq!(ia(&s).id, 0x0000_0007);
    assert_eq!(ia_addr(&s), Some(ADDR));
    assert_eq!(
        s.msg.opts().get(OptionCode::ElapsedTime),
        Some(&DhcpOption::ElapsedTime(0))
    );
    assert!(!has_server_id(&s));
    // An Advertise for another client is ignored.
    let mut foreign = answer(&s, MessageType::Advertise, ADDR, None);
    foreign.opts_mut().remove(OptionCode::ClientId);
    foreign
        .opts_mut()
        .insert(DhcpOption::ClientId(vec![0, 3, 0, 1, 9, 9, 9, 9, 9, 9]));
    assert_ne!(
        foreign.opts().get(OptionCode::ClientId),
        s.msg.opts().get(OptionCode::ClientId)
    );
    assert!(m.on_message(t0, SERVER_LL, &foreign).is_empty());
    // The Advertise leads to a Request (a new transaction) to that server.
    let adv_at = t0 + secs(1) / 2;
    let r = one(m.on_message(
        adv_at,
        SERVER_LL,
        &answer(&s, MessageType::Advertise, ADDR, None),
    ));
    assert_eq!(r.msg.msg_type(), MessageType::Request);
    assert_ne!(r.msg.xid_num(), s.msg.xid_num());
    assert!(r.msg.xid_num() <= 0x00ff_ffff);
    assert_eq!(
        r.msg.opts().get(OptionCode::ServerId),
        Some(&DhcpOption::ServerId(SERVER_DUID.to_vec()))
    );
    assert_eq!(ia_addr(&r), Some(ADDR));
    m.on_message(
        t0 + secs(1),
        SERVER_LL,
        &answer(&r, MessageType::Reply, ADDR, None),
    );
    // Times count from the Request.
    assert_eq!(
        m.state(),
        DhcpState::Bound(DhcpBinding {
            addr: ADDR.into(),
            prefix_len: 128,
            server: SERVER_LL.into(),
            expires: adv_at + secs(120),
            t1: adv_at + secs(60),
            t2: adv_at + secs(105),
        })
    );
}

#[test]
fn renew_at_t1_rebind_at_t2_and_expiry_removes_the_address_at_once() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    assert_eq!(m.deadline(), Some(t0 + secs(60)));
    assert!(m.on_timeout(t0 + secs(59)).is_empty());
    // T1: Renew to ff02::1:2 (no Server Unicast option) naming the server.
    let r = one(m.on_timeout(t0 + secs(60)));
    assert_eq!(r.msg.msg_type(), MessageType::Renew);
    assert_eq!(r.dest, Dest6::AllServers);
    assert!(has_server_id(&r));
    assert_eq!(ia_addr(&r), Some(ADDR));
    assert!(matches!(m.state(), DhcpState::Renewing(_)));
    // REN_TIMEOUT 10 s, then doubling (20 s), never past T2 (105 s).
    assert_eq!(m.deadline(), Some(t0 + secs(70)));
    let r2 = one(m.on_timeout(t0 + secs(70)));
    assert_eq!(r2.msg.xid_num(), r.msg.xid_num(), "same transaction");
    assert_eq!(m.deadline(), Some(t0 + secs(90)));
    one(m.on_timeout(t0 + secs(90)));
    assert_eq!(m.deadline(), Some(t0 + secs(105)));
    // T2: Rebind, to any server.
    let b = one(m.on_timeout(t0 + secs(105)));
    assert_eq!(b.msg.msg_type(), MessageType::Rebind);
    assert!(!has_server_id(&b));
    assert!(matches!(m.state(), DhcpState::Rebinding(_)));
    assert_eq!(m.deadline(), Some(t0 + secs(115)));
    one(m.on_timeout(t0 + secs(115)));
    assert_eq!(
        m.deadline(),
        Some(t0 + secs(120)),
        "never past the valid lifetime"
    );
    // Expiry: no binding any more, at once.
    assert!(m.on_timeout(t0 + secs(120)).is_empty());
    match m.state() {
        DhcpState::Lost { reason } => assert!(reason.contains(&ADDR.to_string()), "{reason}"),
        s => panic!("{s:?}"),
    }
    assert!(m.state().binding().is_none());
    // Then a new Solicit, hinting the old address.
    let s = one(m.on_timeout(t0 + secs(121)));
    assert_eq!(s.msg.msg_type(), MessageType::Solicit);
    assert_eq!(ia_addr(&s), Some(ADDR));
}

#[test]
fn a_renew_reply_extends_the_lease() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    let r = one(m.on_timeout(t0 + secs(60)));
    m.on_message(
        t0 + secs(61),
        SERVER_LL,
        &answer(&r, MessageType::Reply, ADDR, None),
    );
    let b = m.state().binding().cloned().unwrap();
    assert!(matches!(m.state(), DhcpState::Bound(_)));
    assert_eq!((b.expires, b.t1), (t0 + secs(180), t0 + secs(120)));
}

#[test]
fn no_binding_on_renew_starts_over_asking_for_the_old_address() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    let r = one(m.on_timeout(t0 + secs(60)));
    let reply = answer(&r, MessageType::Reply, ADDR, Some(Status::NoBinding));
    assert!(m.on_message(t0 + secs(61), SERVER_LL, &reply).is_empty());
    match m.state() {
        DhcpState::Lost { reason } => assert!(reason.contains("NoBinding"), "{reason}"),
        s => panic!("{s:?}"),
    }
    assert_eq!(m.deadline(), Some(t0 + secs(61) + LOST_HOLDOFF));
    let s = one(m.on_timeout(t0 + secs(62)));
    assert_eq!(s.msg.msg_type(), MessageType::Solicit);
    assert_eq!(ia_addr(&s), Some(ADDR));
}

#[test]
fn no_addrs_avail_is_a_failed_attempt_with_backoff_still_hinting() {
    let t0 = Instant::now();
    let mut m = machine(Some(ADDR), t0);
    let s = one(m.on_timeout(t0));
    let r = one(m.on_message(
        t0,
        SERVER_LL,
        &answer(&s, MessageType::Advertise, ADDR, None),
    ));
    let reply = answer(&r, MessageType::Reply, ADDR, Some(Status::NoAddrsAvail));
    m.on_message(t0 + secs(1), SERVER_LL, &reply);
    match m.state() {
        DhcpState::Requesting {
            attempt: 1,
            last_error: Some(e),
        } => assert!(
            e.contains("NoAddrsAvail") && e.contains(&ADDR.to_string()),
            "{e}"
        ),
        s => panic!("{s:?}"),
    }
    assert_eq!(m.deadline(), Some(t0 + secs(1) + backoff(1)));
    let s = one(m.on_timeout(t0 + secs(2)));
    assert_eq!(ia_addr(&s), Some(ADDR));
    // A second failure waits longer.
    for at in [3, 5, 9, 13] {
        m.on_timeout(t0 + secs(at));
    }
    assert_eq!(m.deadline(), Some(t0 + secs(13) + backoff(2)));
}

#[test]
fn no_server_is_reported_after_each_attempt() {
    let t0 = Instant::now();
    let mut m = machine(None, t0);
    one(m.on_timeout(t0));
    for at in [1, 3, 7] {
        assert_eq!(
            one(m.on_timeout(t0 + secs(at))).msg.msg_type(),
            MessageType::Solicit
        );
    }
    assert!(m.on_timeout(t0 + secs(11)).is_empty());
    match m.state() {
        DhcpState::Requesting {
            attempt: 1,
            last_error: Some(e),
        } => assert!(e.contains("no DHCPv6 Advertise"), "{e}"),
        s => panic!("{s:?}"),
    }
}

#[test]
fn server_unicast_renews_unicast_until_told_use_multicast() {
    let t0 = Instant::now();
    let mut m = machine(None, t0);
    let s = one(m.on_timeout(t0));
    let r = one(m.on_message(
        t0,
        SERVER_LL,
        &answer(&s, MessageType::Advertise, ADDR, None),
    ));
    let server: Ipv6Addr = "2001:db8::3".parse().unwrap();
    let mut reply = answer(&r, MessageType::Reply, ADDR, None);
    reply.opts_mut().insert(DhcpOption::ServerUnicast(server));
    m.on_message(t0, SERVER_LL, &reply);
    assert_eq!(m.state().binding().unwrap().server, IpAddr::from(server));
    let renew = one(m.on_timeout(t0 + secs(60)));
    assert_eq!(renew.dest, Dest6::Unicast(server));
    let mut use_mc = answer(&renew, MessageType::Reply, ADDR, None);
    use_mc.opts_mut().insert(DhcpOption::StatusCode(StatusCode {
        status: Status::UseMulticast,
        msg: String::new(),
    }));
    let again = one(m.on_message(t0 + secs(60), server, &use_mc));
    assert_eq!(again.dest, Dest6::AllServers);
    assert!(matches!(m.state(), DhcpState::Renewing(_)));
}

#[test]
fn a_zero_valid_lifetime_withdraws_the_address() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    let r = one(m.on_timeout(t0 + secs(60)));
    let mut reply = answer(&r, MessageType::Reply, ADDR, Some(Status::Success));
    reply.opts_mut().remove(OptionCode::IANA);
    let mut ia_opts = DhcpOptions::new();
    ia_opts.insert(DhcpOption::IAAddr(IAAddr {
        addr: ADDR,
        preferred_life: 0,
        valid_life: 0,
        opts: DhcpOptions::new(),
    }));
    reply.opts_mut().insert(DhcpOption::IANA(IANA {
        id: 7,
        t1: 0,
        t2: 0,
        opts: ia_opts,
    }));
    m.on_message(t0 + secs(60), SERVER_LL, &reply);
    assert!(
        matches!(m.state(), DhcpState::Lost { .. }),
        "{:?}",
        m.state()
    );
}

#[test]
fn decline_and_release() {
    let t0 = Instant::now();
    let mut m = bound(t0);
    assert!(m.decline(t0, OTHER).is_empty(), "not our lease");
    let d = one(m.decline(t0 + secs(1), ADDR));
    assert_eq!(d.msg.msg_type(), MessageType::Decline);
    assert!(has_server_id(&d));
    assert_eq!(ia_addr(&d), Some(ADDR));
    assert!(matches!(m.state(), DhcpState::Lost { .. }));
    assert_eq!(m.deadline(), Some(t0 + secs(1) + DECLINE_HOLDOFF));
    // The next Solicit does not hint the declined address, and an Advertise of it is
    // ignored.
    let s = one(m.on_timeout(t0 + secs(11)));
    assert_eq!(ia_addr(&s), None);
    assert!(
        m.on_message(
            t0 + secs(11),
            SERVER_LL,
            &answer(&s, MessageType::Advertise, ADDR, None)
        )
        .is_empty()
    );

    let mut m = bound(t0);
    let rel = one(m.stop(t0 + secs(5), true));
    assert_eq!(rel.msg.msg_type(), MessageType::Release);
    assert!(has_server_id(&rel));
    assert_eq!(ia_addr(&rel), Some(ADDR));
    assert_eq!(m.deadline(), None);
    let mut m = bound(t0);
    assert!(
        m.stop(t0, false).is_empty(),
        "no Release on leadership loss"
    );
}

/// The failed attempts counted so far (`Requesting`'s `attempt`, `GaveUp`'s `attempts`).
fn failed(m: &Machine6) -> u32 {
    match m.state() {
        DhcpState::Requesting { attempt, .. } => attempt,
        DhcpState::GaveUp { attempts, .. } => attempts,
        _ => 0,
    }
}

/// Runs the machine from `now` without a server until one more attempt has failed (a Lost
/// state's hold-off and a backoff wait included); returns the messages sent and the time
/// the attempt failed.
fn fail_one(m: &mut Machine6, mut now: Instant) -> (usize, Instant) {
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

fn limited(max_attempts: u32, t0: Instant) -> Machine6 {
    Machine6::new(
        Config6 {
            mac: MAC,
            requested: None,
            max_attempts,
        },
        t0,
        42,
    )
}

#[test]
fn gives_up_after_exactly_the_limit_of_failed_attempts() {
    let t0 = Instant::now();
    let mut m = limited(3, t0);
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
            if last_error.starts_with("no DHCPv6 Advertise from any server (4 Solicits over ")),
        "{:?}",
        m.state()
    );
    assert_eq!((m.deadline(), m.xid()), (None, None));
    assert!(m.on_timeout(at + secs(3600)).is_empty());
    assert!(m.decline(at, ADDR).is_empty());
    assert!(m.stop(at, true).is_empty(), "nothing to release");
}

#[test]
fn no_addrs_avail_to_the_last_allowed_request_gives_up_too() {
    let t0 = Instant::now();
    let mut m = limited(1, t0);
    let s = one(m.on_timeout(t0));
    let r = one(m.on_message(
        t0,
        SERVER_LL,
        &answer(&s, MessageType::Advertise, ADDR, None),
    ));
    let reply = answer(&r, MessageType::Reply, ADDR, Some(Status::NoAddrsAvail));
    assert!(m.on_message(t0, SERVER_LL, &reply).is_empty());
    match m.state() {
        DhcpState::GaveUp {
            attempts: 1,
            last_error,
        } => assert!(last_error.contains("NoAddrsAvail"), "{last_error}"),
        s => panic!("{s:?}"),
    }
    assert_eq!(m.deadline(), None);
}

#[test]
fn never_gives_up_without_a_limit() {
    let t0 = Instant::now();
    let mut m = limited(0, t0);
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
    let mut m = limited(3, t0);
    let (_, now) = fail_one(&mut m, t0);
    fail_one(&mut m, now);
    assert_eq!(failed(&m), 2);
    // The third attempt gets a lease.
    let mut now = m.deadline().unwrap();
    let s = one(m.on_timeout(now));
    let r = one(m.on_message(
        now,
        SERVER_LL,
        &answer(&s, MessageType::Advertise, ADDR, None),
    ));
    m.on_message(now, SERVER_LL, &answer(&r, MessageType::Reply, ADDR, None));
    assert!(matches!(m.state(), DhcpState::Bound(_)), "{:?}", m.state());
    // NoBinding at renewal: lost, then two failed attempts are not yet the limit...
    now = m.deadline().unwrap();
    let renew = one(m.on_timeout(now));
    let reply = answer(&renew, MessageType::Reply, ADDR, Some(Status::NoBinding));
    m.on_message(now, SERVER_LL, &reply);
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
    let mut m = limited(3, t0).after_failures(2);
    assert_eq!(failed(&m), 2);
    fail_one(&mut m, t0);
    assert!(
        matches!(m.state(), DhcpState::GaveUp { attempts: 3, .. }),
        "{:?}",
        m.state()
    );
}
