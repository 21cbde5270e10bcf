//! Backend health checks: each backend is asked as the API server's own clients ask it, an
//! HTTPS `GET /readyz` ([`READYZ`]) to `address:port` every [`INTERVAL`], the TCP connect
//! bounded by [`CONNECT_TIMEOUT`] and the whole exchange (connect, TLS handshake, the
//! answer's status line and headers) by [`CHECK_TIMEOUT`], all backends in parallel.
//!
//! A TCP connect alone is not a check: an API server that accepts connections but never
//! answers (kube-vip #890: a wedged process, a full accept queue served by nobody, a
//! frozen VM's kernel still completing handshakes) passed it and stayed in the set, and a
//! third of the new connections through the VIP hung. Now such a backend fails each check
//! after [`CHECK_TIMEOUT`] and leaves the set after
//! [`FALL`](super::backends::FALL) checks in a row, like a refused one.
//!
//! What counts as healthy ([`verdict`]): any HTTP answer below 500. `/readyz` rather than
//! `/livez`: a terminating API server fails `/readyz` first (its `shutdown` check, during
//! `--shutdown-delay-duration`) while it still serves, so load balancers stop sending it
//! new connections before it stops; `/livez` stays OK until the process exits, and a 500
//! from `/readyz` (etcd unreachable, informers not synced) means requests would fail. A
//! 401 or 403 (anonymous authentication disabled, or the `system:public-info-viewer`
//! binding removed) and a 404 (an API server older than 1.16 without `/readyz`) prove that
//! the server answers HTTP and count as healthy: taking every backend of such a cluster out
//! would send all connections to the holder's own API server.
//!
//! TLS without verifying the certificate's chain or name: the check asks whether the
//! backend answers, not who it is (the connections it balances are end-to-end TLS between
//! the clients and the API server, which verify it themselves). The handshake signature is
//! still checked against the presented key. The connection is closed after the answer's
//! headers (a complete request, where a bare TCP connect was a TLS handshake cut short).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::sync::{mpsc, watch};
use tokio::time::{MissedTickBehavior, interval, timeout};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Interval between two checks of a backend: 1 s.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How long the TCP connect may take: 300 ms. A control-plane node's API server on the
/// same segment accepts within milliseconds, and one failed first check after a takeover
/// takes a powered-off node's endpoint out within this time (with 900 ms, the new holder
/// sent a third of the new connections to a dead node for almost a second: `cargo xtask
/// bench failover --lb`, docs/failover.md).
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a whole check may take (connect, TLS handshake, the answer's headers): 500 ms.
/// A healthy API server answers `/readyz` in a few milliseconds (its checks read local
/// state; the etcd check reuses the last result); three late answers in a row are needed to
/// take a slow one out. A backend that accepts and never answers is out after [`FALL`]
/// checks: within `(FALL - 1) × INTERVAL + CHECK_TIMEOUT` = 2.5 s of its first missed check,
/// at most 3.5 s after it hangs. Under [`INTERVAL`], so rounds never overlap.
///
/// [`FALL`]: super::backends::FALL
pub const CHECK_TIMEOUT: Duration = Duration::from_millis(500);
/// The path every check asks for: `/readyz` (see the module docs for why not `/livez`).
pub const READYZ: &str = "/readyz";

/// Why a check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckFailure {
    /// No TCP connection within [`CONNECT_TIMEOUT`] (refused, unreachable, no answer).
    #[error("no TCP connection: {0}")]
    Connect(String),
    /// Connected, but no TLS handshake and HTTP answer within [`CHECK_TIMEOUT`] (kube-vip
    /// #890: accepts and never answers).
    #[error("connected, but no answer to GET {READYZ} within {} ms", CHECK_TIMEOUT.as_millis())]
    NoAnswer,
    /// The TLS handshake failed (or TLS could not be set up on this node).
    #[error("TLS: {0}")]
    Tls(String),
    /// The HTTP exchange failed (connection closed, not HTTP).
    #[error("HTTP: {0}")]
    Http(String),
    /// `/readyz` answered this 5xx status: the API server is not ready.
    #[error("GET {READYZ} answered {0}: not ready")]
    NotReady(u16),
}

/// One check's result.
pub type CheckResult = Result<(), CheckFailure>;

/// Whether an answer with HTTP `status` to `GET /readyz` makes a healthy check: any status
/// below 500 (401, 403 and 404 included: the server answers HTTP; see the module docs).
/// Pure.
///
/// # Errors
/// [`CheckFailure::NotReady`] for a 5xx status.
pub fn verdict(status: u16) -> CheckResult {
    match status {
        500.. => Err(CheckFailure::NotReady(status)),
        _ => Ok(()),
    }
}

/// One health check of a backend. Implemented by [`HttpsProber`]; tests use a fake.
pub trait Prober: Send + Sync + 'static {
    /// Checks the API server at `addr` (bounded by [`CHECK_TIMEOUT`]).
    fn check(&self, addr: SocketAddr) -> BoxFuture<'static, CheckResult>;
}

/// [`Prober`] by HTTPS `GET /readyz` (see the module docs).
#[derive(Clone)]
pub struct HttpsProber {
    /// The TLS client; `Err` (why TLS cannot be set up) fails every check.
    tls: Result<tokio_rustls::TlsConnector, String>,
}

impl std::fmt::Debug for HttpsProber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsProber")
            .field("tls", &self.tls.as_ref().map(|_| "ready"))
            .finish()
    }
}

impl Default for HttpsProber {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpsProber {
    /// A prober with rustls (ring), TLS 1.2 and 1.3, ALPN `http/1.1`, accepting any
    /// certificate. Setting TLS up cannot fail with ring's provider; if it did, every check
    /// would fail naming why (logged here once), so every backend leaves the set and
    /// connections reach the holder's own API server.
    pub fn new() -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map(|b| {
                let mut cfg = b
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                    .with_no_client_auth();
                cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
                tokio_rustls::TlsConnector::from(Arc::new(cfg))
            })
            .map_err(|e| e.to_string());
        if let Err(e) = &tls {
            warn!(error = %e, "load balancer: cannot set up TLS for the backend health checks; every backend will fail them");
        }
        HttpsProber { tls }
    }
}

impl Prober for HttpsProber {
    fn check(&self, addr: SocketAddr) -> BoxFuture<'static, CheckResult> {
        let tls = self.tls.clone();
        Box::pin(async move {
            let tls = tls.map_err(CheckFailure::Tls)?;
            match timeout(CHECK_TIMEOUT, readyz(tls, addr)).await {
                Ok(r) => r,
                Err(_) => Err(CheckFailure::NoAnswer),
            }
        })
    }
}

/// `GET /readyz` on a new TLS connection to `addr`, unbounded but for the connect; the
/// connection is driven on this task, so dropping the future closes it.
async fn readyz(tls: tokio_rustls::TlsConnector, addr: SocketAddr) -> CheckResult {
    let tcp = match timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(CheckFailure::Connect(e.to_string())),
        Err(_) => {
            return Err(CheckFailure::Connect(format!(
                "no answer within {} ms",
                CONNECT_TIMEOUT.as_millis()
            )));
        }
    };
    let _ = tcp.set_nodelay(true);
    let stream = tls
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| CheckFailure::Tls(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| CheckFailure::Http(e.to_string()))?;
    let req = http::Request::get(READYZ)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::USER_AGENT, "vipd-lb-health")
        .header(http::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| CheckFailure::Http(e.to_string()))?;
    let exchange = sender.send_request(req);
    tokio::pin!(exchange);
    let resp = tokio::select! {
        r = &mut exchange => r,
        // The connection ended first: the exchange completes from what was received, or
        // with the connection's error.
        _ = conn => exchange.await,
    };
    let resp = resp.map_err(|e| CheckFailure::Http(e.to_string()))?;
    verdict(resp.status().as_u16())
}

/// Accepts any server certificate (the check is liveness, not identity; see the module
/// docs), still verifying the handshake's signature with the presented key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Checks every address in `targets` at `port` each [`INTERVAL`] (the first round at
/// once) and sends each round's results on `results`, until `stop` or the receiver is gone.
pub(crate) async fn run<P: Prober>(
    prober: Arc<P>,
    targets: watch::Receiver<Vec<IpAddr>>,
    port: u16,
    results: mpsc::Sender<Vec<(IpAddr, CheckResult)>>,
    stop: CancellationToken,
) {
    let mut tick = interval(INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let addrs = targets.borrow().clone();
        let round = futures::future::join_all(addrs.iter().map(|a| {
            let check = prober.check(SocketAddr::new(*a, port));
            let a = *a;
            async move { (a, check.await) }
        }));
        let done = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = round => r,
        };
        if results.send(done).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
