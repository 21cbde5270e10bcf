use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fail() -> Result<(), String> {
    Err("HTTP 500".into())
}

#[test]
fn parse_values() {
    assert_eq!(parse_check(""), Ok(None));
    assert_eq!(parse_check("off"), Ok(None));
    assert_eq!(parse_check(" OFF "), Ok(None));
    let kp = HealthCheck::Http {
        authority: "127.0.0.1:10256".into(),
        path: "/healthz".into(),
    };
    assert_eq!(parse_check("kube-proxy"), Ok(Some(kp.clone())));
    assert_eq!(
        parse_check("http://127.0.0.1:10256/healthz"),
        Ok(Some(kp.clone()))
    );
    assert_eq!(kp.to_string(), KUBE_PROXY_HEALTHZ);
    assert_eq!(
        parse_check("http://localhost"),
        Ok(Some(HealthCheck::Http {
            authority: "localhost:80".into(),
            path: "/".into()
        }))
    );
    assert_eq!(
        parse_check("http://[::1]:8080/ready?x=1"),
        Ok(Some(HealthCheck::Http {
            authority: "[::1]:8080".into(),
            path: "/ready?x=1".into()
        }))
    );
    assert_eq!(parse_check("tcp:8080"), Ok(Some(HealthCheck::Tcp(8080))));
    for bad in [
        "https://127.0.0.1/healthz",
        "tcp:0",
        "tcp:70000",
        "tcp:",
        "http://",
        "http://:80/",
        "http://a:b/",
        "http://u@h/",
        "http://[zz]:80/",
        "http://[::1]x/",
        "10256",
    ] {
        let e = parse_check(bad).expect_err(bad);
        assert!(!e.is_empty(), "{bad}");
    }
}

#[test]
fn status_lines() {
    assert_eq!(status_code("HTTP/1.1 200 OK"), Some(200));
    assert_eq!(status_code("HTTP/1.0 503 Service Unavailable"), Some(503));
    assert_eq!(status_code("SSH-2.0-OpenSSH"), None);
    assert_eq!(status_code(""), None);
}

#[test]
fn group_checks_annotation_overrides_node_default() {
    let node = HealthCheck::Tcp(1);
    let mut invalid = Vec::new();
    let checks = group_checks(
        [
            ("a".to_string(), None),
            ("b".to_string(), Some("off")),
            ("c".to_string(), Some("tcp:2")),
            ("d".to_string(), Some("bogus")),
        ],
        Some(&node),
        &mut invalid,
    );
    assert_eq!(checks, vec![HealthCheck::Tcp(1), HealthCheck::Tcp(2)]);
    assert_eq!(invalid.len(), 1);
    assert_eq!(invalid[0].0, "d");
    // No node default: only annotated Services are checked.
    let mut invalid = Vec::new();
    assert!(group_checks([("a".to_string(), None)], None, &mut invalid).is_empty());
    assert_eq!(
        group_checks([("a".to_string(), Some("tcp:3"))], None, &mut invalid),
        vec![HealthCheck::Tcp(3)]
    );
}

fn policy() -> HealthPolicy {
    HealthPolicy {
        interval: Duration::from_secs(1),
        fail_after: 3,
        recover_after: 2,
        hold: Duration::from_secs(30),
    }
}

#[tokio::test(start_paused = true)]
async fn hands_over_after_n_failures_once_held_long_enough() {
    let mut m = HealthMachine::new(policy());
    let t0 = Instant::now();
    // A follower with an open gate runs no checks and counts nothing.
    assert!(!m.wants_checks());
    assert_eq!(m.on_result(t0, fail()), HealthStep::Nothing);
    m.on_leading(true, t0);
    assert!(m.wants_checks());
    // Held only 2 s: three failures do not hand over yet.
    for s in 0..3 {
        assert_eq!(m.on_result(t0 + ms(s * 1000), fail()), HealthStep::Nothing);
    }
    // Held 30 s: the next failure (still in a row) hands over, with the error.
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(
        m.on_result(Instant::now(), fail()),
        HealthStep::HandOver("HTTP 500".into())
    );
    assert!(!m.is_open());
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_failure_count() {
    let mut m = HealthMachine::new(policy());
    let t0 = Instant::now();
    m.on_leading(true, t0 - Duration::from_secs(60));
    let mut t = t0;
    for r in [fail(), fail(), Ok(()), fail(), fail()] {
        assert_eq!(m.on_result(t, r), HealthStep::Nothing);
        t += ms(1000);
    }
    assert!(matches!(m.on_result(t, fail()), HealthStep::HandOver(_)));
}

#[tokio::test(start_paused = true)]
async fn reopens_after_m_successes_and_the_hold_time() {
    let mut m = HealthMachine::new(policy());
    let t0 = Instant::now();
    m.on_leading(true, t0 - Duration::from_secs(60));
    for s in 0..2 {
        m.on_result(t0 + ms(s * 1000), fail());
    }
    let closed_at = t0 + ms(2000);
    assert!(matches!(
        m.on_result(closed_at, fail()),
        HealthStep::HandOver(_)
    ));
    m.on_leading(false, closed_at + ms(50));
    // Closed: keeps checking to reopen; successes before the hold time do not reopen.
    assert!(m.wants_checks());
    for s in 1..29 {
        assert_eq!(
            m.on_result(closed_at + ms(s * 1000), Ok(())),
            HealthStep::Nothing
        );
    }
    // At the hold time, with two successes in a row: reopens.
    assert_eq!(
        m.on_result(closed_at + Duration::from_secs(30), Ok(())),
        HealthStep::Reopen
    );
    assert!(m.is_open() && !m.wants_checks());
    // A failure after the hold time breaks the success streak.
    let mut m = HealthMachine::new(policy());
    m.on_leading(true, t0 - Duration::from_secs(60));
    for s in 0..3 {
        m.on_result(t0 + ms(s * 1000), fail());
    }
    m.on_leading(false, t0 + ms(2100));
    let after = t0 + Duration::from_secs(40);
    assert_eq!(m.on_result(after, Ok(())), HealthStep::Nothing);
    assert_eq!(m.on_result(after + ms(1000), fail()), HealthStep::Nothing);
    assert_eq!(m.on_result(after + ms(2000), Ok(())), HealthStep::Nothing);
    assert_eq!(m.on_result(after + ms(3000), Ok(())), HealthStep::Reopen);
}

#[tokio::test(start_paused = true)]
async fn switching_the_check_off_reopens() {
    let mut m = HealthMachine::new(policy());
    let t0 = Instant::now();
    m.on_leading(true, t0 - Duration::from_secs(60));
    for s in 0..3 {
        m.on_result(t0 + ms(s * 1000), fail());
    }
    assert!(!m.is_open());
    assert_eq!(m.on_disabled(), HealthStep::Reopen);
    assert_eq!(m.on_disabled(), HealthStep::Nothing);
}

/// Two nodes, one Service, a check that flips between healthy and failing every 500 ms on
/// both (checked every second, so each node sees runs of failures). Each node runs its own
/// machine; the lease goes to a node whose gate is open when the holder hands over. Over 5
/// minutes the Service moves at most once per hold time.
#[tokio::test(start_paused = true)]
async fn a_flapping_check_moves_the_service_at_most_once_per_hold_time() {
    let p = policy();
    let mut nodes = [HealthMachine::new(p), HealthMachine::new(p)];
    let start = Instant::now();
    let mut holder: Option<usize> = Some(0);
    nodes[0].on_leading(true, start);
    let mut moves: Vec<Instant> = Vec::new();
    let mut handovers: Vec<Instant> = Vec::new();
    // A pseudo-random flapping pattern (period 500 ms, phase differs per node).
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut healthy = [true, true];
    let mut next_flip = start;
    let step = ms(250);
    let mut next_check = [start + ms(1000), start + ms(1300)];
    while Instant::now() - start < Duration::from_secs(300) {
        tokio::time::advance(step).await;
        let now = Instant::now();
        if now >= next_flip {
            for h in healthy.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *h = !seed.is_multiple_of(3);
            }
            next_flip = now + ms(500);
        }
        for i in 0..2 {
            if now < next_check[i] {
                continue;
            }
            next_check[i] = now + p.interval;
            if !nodes[i].wants_checks() {
                continue;
            }
            let r = if healthy[i] { Ok(()) } else { fail() };
            if let HealthStep::HandOver(_) = nodes[i].on_result(now, r) {
                // Graceful step-down; the other node takes the lease if its gate is open.
                handovers.push(now);
                nodes[i].on_leading(false, now);
                holder = None;
                let j = 1 - i;
                if nodes[j].is_open() {
                    nodes[j].on_leading(true, now);
                    holder = Some(j);
                    moves.push(now);
                }
            }
        }
        // A free lease is taken by the first node whose gate opens.
        if holder.is_none()
            && let Some(j) = (0..2).find(|&j| nodes[j].is_open())
        {
            nodes[j].on_leading(true, now);
            holder = Some(j);
            moves.push(now);
        }
    }
    assert!(
        moves.len() >= 2,
        "the flapping pattern must cause moves: {moves:?}"
    );
    // Every change of holder (a step-down leaving the Service unannounced counts too) is
    // at least a hold time after the previous one.
    let mut changes: Vec<Instant> = moves.iter().chain(&handovers).copied().collect();
    changes.sort();
    changes.dedup();
    for w in changes.windows(2) {
        assert!(
            w[1] - w[0] >= p.hold,
            "two holder changes within the hold time: {:?} apart",
            w[1] - w[0]
        );
    }
}

#[tokio::test]
async fn checks_against_local_servers() {
    use tokio::io::AsyncWriteExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        for status in ["200 OK", "500 Internal Server Error"] {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
            let _ = s
                .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await;
        }
        l
    });
    let http = parse_check(&format!("http://127.0.0.1:{port}/healthz"))
        .unwrap()
        .unwrap();
    assert_eq!(run_check(&http).await, Ok(()));
    assert_eq!(run_check(&http).await, Err("HTTP 500".into()));
    let l = server.await.unwrap();
    // TCP: accepted while listening, refused once closed.
    assert_eq!(run_check(&HealthCheck::Tcp(port)).await, Ok(()));
    drop(l);
    let e = run_check(&HealthCheck::Tcp(port)).await.unwrap_err();
    assert!(e.starts_with(&format!("connect 127.0.0.1:{port}")), "{e}");
}
