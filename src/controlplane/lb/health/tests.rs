//! The verdict (pure) and the check against real sockets on loopback: a server that accepts
//! and never answers, one that answers TLS + HTTP with a given status, a refused port.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::*;

#[test]
fn any_answer_below_500_is_healthy() {
    let cases = [
        (200, Ok(())),
        // Anonymous auth disabled, or public-info-viewer unbound: the server answers HTTP.
        (401, Ok(())),
        (403, Ok(())),
        // No /readyz (API servers before 1.16).
        (404, Ok(())),
        (429, Ok(())),
        // /readyz failing (shutting down, etcd unreachable).
        (500, Err(CheckFailure::NotReady(500))),
        (503, Err(CheckFailure::NotReady(503))),
    ];
    for (status, want) in cases {
        assert_eq!(verdict(status), want, "{status}");
    }
    assert!(
        CheckFailure::NotReady(500).to_string().contains("/readyz"),
        "{}",
        CheckFailure::NotReady(500)
    );
}

/// A TLS acceptor with a fresh self-signed certificate for a name the check never asks
/// for (it does not verify names).
fn acceptor() -> tokio_rustls::TlsAcceptor {
    let ck =
        rcgen::generate_simple_self_signed(vec!["not-the-address.example".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

/// Serves HTTPS on loopback: every request answered with `status`; returns the address and
/// the paths asked for.
async fn https_server(status: u16) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let tls = acceptor();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                let mut s = tls.accept(s).await.unwrap();
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let _ = tx.send(req.split(' ').nth(1).unwrap_or_default().to_string());
                let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok");
                s.write_all(answer.as_bytes()).await.unwrap();
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn an_answering_api_server_is_up_a_5xx_one_is_not() {
    let (addr, mut paths) = https_server(200).await;
    assert_eq!(HttpsProber::new().check(addr).await, Ok(()));
    assert_eq!(paths.recv().await.unwrap(), READYZ);
    let (addr, _) = https_server(401).await;
    assert_eq!(HttpsProber::new().check(addr).await, Ok(()));
    let (addr, _) = https_server(500).await;
    assert_eq!(
        HttpsProber::new().check(addr).await,
        Err(CheckFailure::NotReady(500))
    );
}

/// kube-vip #890: the server accepts TCP and never answers (no TLS, no HTTP). The check
/// fails when its time is up, not before and not much later.
#[tokio::test]
async fn a_server_that_accepts_and_never_answers_is_down() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        loop {
            let (s, _) = l.accept().await.unwrap();
            conns.push(s);
        }
    });
    let t0 = Instant::now();
    assert_eq!(
        HttpsProber::new().check(addr).await,
        Err(CheckFailure::NoAnswer)
    );
    let took = t0.elapsed();
    // Not before the timeout; the upper bound only says the check does not hang (a
    // generous second of margin for a loaded machine: it would otherwise never return).
    assert!(
        took >= CHECK_TIMEOUT && took < CHECK_TIMEOUT + Duration::from_secs(1),
        "{took:?}"
    );
    held.abort();
}

#[tokio::test]
async fn a_refused_port_is_down() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    match HttpsProber::new().check(addr).await {
        Err(CheckFailure::Connect(e)) => assert!(e.contains("refused"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// A server that answers plain HTTP (no TLS) fails the check: it is not an API server.
#[tokio::test]
async fn a_plain_http_server_is_down() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .await;
    });
    match HttpsProber::new().check(addr).await {
        Err(CheckFailure::Tls(_)) => {}
        other => panic!("{other:?}"),
    }
}
