//! Backend health checks: a TCP connect to each backend's `address:port` every
//! [`INTERVAL`], bounded by [`CHECK_TIMEOUT`], all backends in parallel. The connection is
//! closed at once (no TLS, no request): the API server logs at most a handshake EOF.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio::time::{MissedTickBehavior, interval, timeout};
use tokio_util::sync::CancellationToken;

/// Interval between two checks of a backend: 1 s.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How long a connect may take before the check counts as failed: 300 ms. A control-plane
/// node's API server on the same segment accepts within milliseconds; three failures in a
/// row are needed to take a healthy-but-slow one out, while one failed first check after a
/// takeover takes a powered-off node's endpoint out within this time (with 900 ms, the new
/// holder sent a third of the new connections to a dead node for almost a second: `cargo
/// xtask bench failover --lb`, docs/failover.md). Under [`INTERVAL`], so rounds never
/// overlap.
pub const CHECK_TIMEOUT: Duration = Duration::from_millis(300);

/// One health check of a backend. Implemented by [`TcpProber`]; tests use a fake.
pub trait Prober: Send + Sync + 'static {
    /// Whether `addr` accepts a TCP connection (within [`CHECK_TIMEOUT`]).
    fn check(&self, addr: SocketAddr) -> BoxFuture<'static, bool>;
}

/// [`Prober`] by TCP connect.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpProber;

impl Prober for TcpProber {
    fn check(&self, addr: SocketAddr) -> BoxFuture<'static, bool> {
        Box::pin(async move {
            matches!(
                timeout(CHECK_TIMEOUT, tokio::net::TcpStream::connect(addr)).await,
                Ok(Ok(_))
            )
        })
    }
}

/// Checks every address in `targets` at `port` each [`INTERVAL`] (the first round at
/// once) and sends each round's results on `results`, until `stop` or the receiver is gone.
pub(crate) async fn run<P: Prober>(
    prober: Arc<P>,
    targets: watch::Receiver<Vec<IpAddr>>,
    port: u16,
    results: mpsc::Sender<Vec<(IpAddr, bool)>>,
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
