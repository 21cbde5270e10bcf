use std::io;
use std::net::Ipv6Addr;
use std::sync::Mutex;

use dhcproto::v4::{Message, MessageType};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::*;
use crate::dhcp::machine::Dest;
use crate::dhcp::machine::Outgoing;
use crate::dhcp::machine::tests::{ADDR, MAC, SERVER, reply};
use crate::dhcp::v6::Outgoing6;
use crate::net::macvlan::LinkEntry;
use crate::net::macvlan::fake::FakeKernel;

/// A wire whose sends the test reads and whose replies the test writes: `O` sent, `M`
/// received.
struct FakeWire<O, M> {
    sent: UnboundedSender<O>,
    replies: UnboundedReceiver<M>,
}

impl<O: Clone + Send + Sync + 'static, M: Send + 'static> Wire for FakeWire<O, M> {
    type Out = O;
    type Msg = M;

    async fn send(&mut self, out: &O) -> io::Result<()> {
        let _ = self.sent.send(out.clone());
        Ok(())
    }
    async fn recv(&mut self) -> io::Result<M> {
        match self.replies.recv().await {
            Some(m) => Ok(m),
            None => Err(io::Error::other("wire closed")),
        }
    }
}

/// Hands out prepared wires, one per `open`.
struct FakeTransport<O, M> {
    wires: Mutex<Vec<FakeWire<O, M>>>,
}

impl<O, M> Default for FakeTransport<O, M> {
    fn default() -> Self {
        Self {
            wires: Mutex::new(Vec::new()),
        }
    }
}

impl<O: Clone + Send + Sync + 'static, M: Send + 'static> Transport for FakeTransport<O, M> {
    type Wire = FakeWire<O, M>;
    fn open(&self, _ifindex: u32, name: &str) -> io::Result<FakeWire<O, M>> {
        self.wires
            .lock()
            .unwrap()
            .pop()
            .ok_or_else(|| io::Error::other(format!("no wire for {name}")))
    }
}

/// DHCPv4 fakes.
type FakeTransport4 = FakeTransport<Outgoing, Message>;
/// DHCPv6 fakes: replies come with their source address.
type FakeTransport6 = FakeTransport<Outgoing6, (Ipv6Addr, dhcproto::v6::Message)>;

/// The test's end of a wire: what the client sent, and a way to answer.
struct Server {
    sent: UnboundedReceiver<Outgoing>,
    replies: UnboundedSender<Message>,
}

impl Server {
    async fn next(&mut self) -> Outgoing {
        self.sent.recv().await.expect("client gone")
    }
    fn answer(&self, req: &Outgoing, kind: MessageType) {
        self.replies.send(reply(req, kind, ADDR)).unwrap();
    }
}

/// The parent interface of the fakes' macvlans.
fn eth0() -> LinkEntry {
    LinkEntry {
        index: 2,
        name: "eth0".into(),
        macvlan: false,
        alias: None,
        parent: None,
        mac: [0x02, 0, 0, 0, 0, 1],
    }
}

fn client() -> (
    DhcpClient<FakeKernel, FakeTransport4, Udp6Transport>,
    Server,
) {
    let (sent_tx, sent_rx) = unbounded_channel();
    let (reply_tx, reply_rx) = unbounded_channel();
    let transport = FakeTransport4::default();
    transport.wires.lock().unwrap().push(FakeWire {
        sent: sent_tx,
        replies: reply_rx,
    });
    (
        DhcpClient::new(FakeKernel::with(vec![eth0()]), transport, Udp6Transport),
        Server {
            sent: sent_rx,
            replies: reply_tx,
        },
    )
}

fn spec() -> DhcpSpec {
    DhcpSpec {
        family: crate::dhcp::DhcpFamily::V4,
        parent: "eth0".into(),
        macvlan: "vip-0123abcd".into(),
        mac: MAC,
        requested: None,
        requested_v6: None,
        hostname: None,
        broadcast: false,
        rp_filter: 0,
        mark: "vipd:0123abcd-uid".into(),
        mac_derived: true,
    }
}

fn kind(o: &Outgoing) -> MessageType {
    o.msg.opts().msg_type().unwrap()
}

/// DISCOVER, OFFER, REQUEST, ACK: returns once the handle says Bound.
async fn bind(handle: &mut DhcpHandle, server: &mut Server) {
    let d = server.next().await;
    assert_eq!(kind(&d), MessageType::Discover);
    server.answer(&d, MessageType::Offer);
    let r = server.next().await;
    assert_eq!(kind(&r), MessageType::Request);
    server.answer(&r, MessageType::Ack);
    handle
        .state
        .wait_for(|s| matches!(s, DhcpState::Bound(b) if b.addr == std::net::IpAddr::V4(ADDR)))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn creates_the_macvlan_binds_renews_at_t1_and_stops_without_release() {
    let (dhcp, mut server) = client();
    let mut handle = dhcp.start(spec());
    let t0 = Instant::now();
    bind(&mut handle, &mut server).await;
    let calls = dhcp.macvlans().kernel().calls();
    assert_eq!(
        calls[0],
        "create vip-0123abcd on 2 02:42:00:00:00:07 vipd:0123abcd-uid"
    );
    // Nothing is sent until T1 (60 s of a 120 s lease), then a unicast REQUEST.
    let renew = server.next().await;
    assert_eq!(Instant::now() - t0, Duration::from_secs(60));
    assert_eq!(
        (kind(&renew), renew.dest),
        (MessageType::Request, Dest::Unicast(SERVER))
    );
    assert!(matches!(*handle.state.borrow(), DhcpState::Renewing(_)));
    server.answer(&renew, MessageType::Ack);
    handle
        .state
        .wait_for(|s| matches!(s, DhcpState::Bound(_)))
        .await
        .unwrap();
    let k = dhcp.macvlans().kernel();
    let state = handle.state.clone();
    handle.stop().await;
    assert_eq!(
        *state.borrow(),
        DhcpState::Lost {
            reason: crate::dhcp::STOPPED.into()
        }
    );
    assert!(server.sent.try_recv().is_err(), "no DHCPRELEASE on stop");
    assert!(
        k.calls().last().unwrap().starts_with("delete vip-0123abcd"),
        "{:?}",
        k.calls()
    );
    assert!(
        k.links
            .lock()
            .unwrap()
            .iter()
            .all(|l| l.name != "vip-0123abcd")
    );
}

#[tokio::test(start_paused = true)]
async fn release_and_stop_sends_release_then_removes_the_macvlan() {
    let (dhcp, mut server) = client();
    let mut handle = dhcp.start(spec());
    bind(&mut handle, &mut server).await;
    handle.release_and_stop().await;
    let rel = server.next().await;
    assert_eq!(
        (kind(&rel), rel.dest),
        (MessageType::Release, Dest::Unicast(SERVER))
    );
    assert!(
        dhcp.macvlans()
            .kernel()
            .calls()
            .last()
            .unwrap()
            .starts_with("delete")
    );
}

#[tokio::test(start_paused = true)]
async fn decline_from_the_handle_sends_decline_and_loses_the_lease() {
    let (dhcp, mut server) = client();
    let mut handle = dhcp.start(spec());
    bind(&mut handle, &mut server).await;
    handle.decline(ADDR.into());
    let d = server.next().await;
    assert_eq!(kind(&d), MessageType::Decline);
    assert!(
        matches!(&*handle.state.borrow(), DhcpState::Lost { reason } if reason.contains("DHCPDECLINE"))
    );
    handle.stop().await;
}

/// Waits for `attempt` failed set-ups and returns the last error; the client keeps retrying.
async fn setup_error(handle: &mut DhcpHandle, attempt: u32) -> String {
    let state = handle
        .state
        .wait_for(|s| matches!(s, DhcpState::Requesting { attempt: a, .. } if *a == attempt))
        .await
        .unwrap()
        .clone();
    match state {
        DhcpState::Requesting {
            last_error: Some(e),
            ..
        } => e,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn setup_errors_are_reported_and_retried_and_stop_still_works() {
    let (dhcp, _server) = client();
    let mut bad = spec();
    bad.parent = "eth9".into();
    let mut handle = dhcp.start(bad);
    let e = setup_error(&mut handle, 2).await;
    assert!(
        e.contains("\"eth9\"") && e.contains("does not exist"),
        "{e}"
    );
    handle.stop().await;
    // The spec's bad name is reported the same way, naming the value.
    let mut long = spec();
    long.macvlan = "vip-0123456789ab".into();
    let mut handle = dhcp.start(long);
    let e = setup_error(&mut handle, 1).await;
    assert!(e.contains("\"vip-0123456789ab\""), "{e}");
    handle.stop().await;
}

/// A dual-stack Service: its DHCPv4 and DHCPv6 clients share one macvlan, created once
/// with DAD off (the DHCPv6 client's link-local address); the DHCPv6 client binds through
/// Solicit/Advertise/Request/Reply; the macvlan stays while one client runs and goes with
/// the last, after the DHCPv6 Release.
#[tokio::test(start_paused = true)]
async fn dual_stack_clients_share_the_macvlan_and_the_last_one_removes_it() {
    use crate::dhcp::v6::machine::tests::{ADDR as ADDR6, SERVER_LL, answer};
    use dhcproto::v6::MessageType as M6;
    let (sent4, mut sent4_rx) = unbounded_channel();
    let (_reply4, reply4_rx) = unbounded_channel();
    let t4 = FakeTransport4::default();
    t4.wires.lock().unwrap().push(FakeWire {
        sent: sent4,
        replies: reply4_rx,
    });
    let (sent6, mut sent6_rx) = unbounded_channel::<Outgoing6>();
    let (reply6, reply6_rx) = unbounded_channel();
    let t6 = FakeTransport6::default();
    t6.wires.lock().unwrap().push(FakeWire {
        sent: sent6,
        replies: reply6_rx,
    });
    let dhcp = DhcpClient::new(FakeKernel::with(vec![eth0()]), t4, t6);
    let mut v6 = spec();
    v6.family = crate::dhcp::DhcpFamily::V6;
    v6.requested_v6 = Some(ADDR6);
    let mut h6 = dhcp.start(v6);
    let h4 = dhcp.start(spec());
    // Both clients run: the v4 one sends a DISCOVER, the v6 one a Solicit hinting ADDR6.
    assert_eq!(
        sent4_rx.recv().await.unwrap().msg.opts().msg_type(),
        Some(MessageType::Discover)
    );
    let sol = sent6_rx.recv().await.unwrap();
    assert_eq!(sol.msg.msg_type(), M6::Solicit);
    reply6
        .send((SERVER_LL, answer(&sol, M6::Advertise, ADDR6, None)))
        .unwrap();
    let req = sent6_rx.recv().await.unwrap();
    assert_eq!(req.msg.msg_type(), M6::Request);
    reply6
        .send((SERVER_LL, answer(&req, M6::Reply, ADDR6, None)))
        .unwrap();
    h6.state
        .wait_for(|s| matches!(s, DhcpState::Bound(b) if b.addr == std::net::IpAddr::V6(ADDR6)))
        .await
        .unwrap();
    let calls = dhcp.macvlans().kernel().calls();
    assert_eq!(
        calls.iter().filter(|c| c.starts_with("create")).count(),
        1,
        "{calls:?}"
    );
    let dad = calls.iter().position(|c| c.contains("accept_dad=0"));
    let up = calls.iter().position(|c| c.starts_with("up "));
    assert!(dad.is_some() && up.is_some(), "{calls:?}");
    // The v4 client stops: the macvlan stays for the v6 one.
    h4.stop().await;
    assert!(
        !dhcp
            .macvlans()
            .kernel()
            .calls()
            .iter()
            .any(|c| c.starts_with("delete")),
        "{:?}",
        dhcp.macvlans().kernel().calls()
    );
    // The v6 one releases and stops: Release sent, then the macvlan goes.
    h6.release_and_stop().await;
    let rel = sent6_rx.recv().await.unwrap();
    assert_eq!(rel.msg.msg_type(), M6::Release);
    assert!(
        dhcp.macvlans()
            .kernel()
            .calls()
            .last()
            .unwrap()
            .starts_with("delete vip-0123abcd")
    );
}

/// Waits for [`DhcpState::GaveUp`]; fails (instead of retrying forever on the paused
/// clock) when it has not come within an hour.
async fn gave_up(handle: &mut DhcpHandle) -> DhcpState {
    tokio::time::timeout(
        Duration::from_secs(3600),
        handle
            .state
            .wait_for(|s| matches!(s, DhcpState::GaveUp { .. })),
    )
    .await
    .expect("gave up within an hour")
    .unwrap()
    .clone()
}

/// With an attempt limit, failed set-ups and failed exchanges count together: one failed
/// set-up (no socket) and two exchanges without an answer give up at 3; the client then
/// sends nothing more, keeps its macvlan, and still stops on request.
#[tokio::test(start_paused = true)]
async fn gives_up_at_the_limit_counting_setups_and_exchanges_then_stops() {
    let (dhcp, mut server) = client();
    let dhcp = dhcp.with_attempt_limit(3);
    // No socket for the first set-up.
    let wire = dhcp.transport.wires.lock().unwrap().pop().unwrap();
    let mut handle = dhcp.start(spec());
    let e = setup_error(&mut handle, 1).await;
    assert!(e.contains("no wire"), "{e}");
    dhcp.transport.wires.lock().unwrap().push(wire);
    // Two attempts of 4 DISCOVERs each go unanswered.
    for _ in 0..8 {
        assert_eq!(kind(&server.next().await), MessageType::Discover);
    }
    let state = gave_up(&mut handle).await;
    // The seconds vary with the randomised retransmission waits.
    assert!(
        matches!(&state, DhcpState::GaveUp { attempts: 3, last_error }
            if last_error.starts_with("no DHCPOFFER from any server (4 DHCPDISCOVERs over ")),
        "{state:?}"
    );
    // Nothing more is sent (the socket is closed), however long it waits.
    assert!(server.sent.recv().await.is_none(), "the socket is closed");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(matches!(*handle.state.borrow(), DhcpState::GaveUp { .. }));
    let k = dhcp.macvlans().kernel();
    assert!(
        !k.calls().iter().any(|c| c.starts_with("delete")),
        "{:?}",
        k.calls()
    );
    let state = handle.state.clone();
    handle.stop().await;
    assert_eq!(
        *state.borrow(),
        DhcpState::Lost {
            reason: crate::dhcp::STOPPED.into()
        }
    );
    assert!(k.calls().last().unwrap().starts_with("delete vip-0123abcd"));
}

/// Set-ups alone reach the limit too: the last set-up error is the one reported.
#[tokio::test(start_paused = true)]
async fn failed_setups_alone_give_up_at_the_limit() {
    let (dhcp, _server) = client();
    let dhcp = dhcp.with_attempt_limit(2);
    let mut bad = spec();
    bad.parent = "eth9".into();
    let mut handle = dhcp.start(bad);
    let state = gave_up(&mut handle).await;
    match state {
        DhcpState::GaveUp {
            attempts: 2,
            last_error,
        } => assert!(last_error.contains("\"eth9\""), "{last_error}"),
        other => panic!("{other:?}"),
    }
    handle.stop().await;
}

/// A DHCPv6 client puts the macvlan's link-local address on itself, keeps refreshing it,
/// and when it finds it expired (the process was frozen past its lifetime) ends the wire
/// with an error naming it, instead of adding it back, and sets up anew after the backoff,
/// hinting the address it held.
#[tokio::test(start_paused = true)]
async fn v6_client_refreshes_its_link_local_and_sets_up_again_when_it_expired() {
    use crate::dhcp::v6::machine::tests::{ADDR as ADDR6, SERVER_LL, answer};
    use crate::net::macvlan::eui64_link_local;
    use dhcproto::v6::MessageType as M6;
    let t6 = FakeTransport6::default();
    let (sent6b, mut sent6b_rx) = unbounded_channel::<Outgoing6>();
    let (_reply6b, reply6b_rx) = unbounded_channel();
    let (sent6, mut sent6_rx) = unbounded_channel::<Outgoing6>();
    let (reply6, reply6_rx) = unbounded_channel();
    // `open` pops: the second wire first.
    t6.wires.lock().unwrap().push(FakeWire {
        sent: sent6b,
        replies: reply6b_rx,
    });
    t6.wires.lock().unwrap().push(FakeWire {
        sent: sent6,
        replies: reply6_rx,
    });
    let dhcp = DhcpClient::new(
        FakeKernel::with(vec![eth0()]),
        FakeTransport4::default(),
        t6,
    );
    let mut v6 = spec();
    v6.family = crate::dhcp::DhcpFamily::V6;
    let ll = eui64_link_local(v6.mac);
    let mut h6 = dhcp.start(v6);
    let sol = sent6_rx.recv().await.unwrap();
    reply6
        .send((SERVER_LL, answer(&sol, M6::Advertise, ADDR6, None)))
        .unwrap();
    let req = sent6_rx.recv().await.unwrap();
    reply6
        .send((SERVER_LL, answer(&req, M6::Reply, ADDR6, None)))
        .unwrap();
    h6.state
        .wait_for(|s| matches!(s, DhcpState::Bound(_)))
        .await
        .unwrap();
    let count = |what: &str| {
        dhcp.macvlans()
            .kernel()
            .calls()
            .iter()
            .filter(|c| c.starts_with(&format!("link-local {what}")))
            .count()
    };
    assert_eq!(count("add"), 1);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(
        count("refresh") >= 3,
        "{:?}",
        dhcp.macvlans().kernel().calls()
    );

    // The macvlan (index 3) loses its link-local: the client notices at the next refresh.
    dhcp.macvlans().kernel().expire_link_local(3);
    let state = tokio::time::timeout(
        Duration::from_secs(60),
        h6.state
            .wait_for(|s| matches!(s, DhcpState::Requesting { .. })),
    )
    .await
    .expect("the expired link-local went unnoticed")
    .unwrap()
    .clone();
    let DhcpState::Requesting {
        last_error: Some(e),
        ..
    } = state
    else {
        panic!("{state:?}")
    };
    assert!(e.contains(&ll.to_string()) && e.contains("expired"), "{e}");
    assert_eq!(count("add"), 1, "not added back by a refresh");
    // After the backoff: set up anew, the address added again.
    let sol = sent6b_rx.recv().await.unwrap();
    assert_eq!(sol.msg.msg_type(), M6::Solicit);
    assert_eq!(count("add"), 2);
    h6.stop().await;
}
