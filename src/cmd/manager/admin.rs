//! The admin HTTP endpoint on `prometheus_server` (kube-vip's `--prometheusHTTPServer`,
//! default `:2112`), started by `vipd manager` only: `/metrics` (OpenMetrics text,
//! [`crate::obs::metrics`]), `/healthz` (200 while the process serves requests: the liveness
//! probe), `/readyz` (200 only when every [`Readiness`] condition holds: the readiness probe;
//! 503 with the missing conditions otherwise) and `/drain` (the local switch `vipd drain`
//! sets). HTTP/1.1 over plain TCP (hyper).

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::nodes::eligibility::DrainSwitch;
use crate::obs::metrics::{self, Metrics};
use crate::syntax::ListenAddr;

use crate::obs::readiness::*;

/// Errors starting the admin endpoint.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The socket could not be bound (port in use, no permission).
    #[error("prometheus_server {value:?}: cannot listen: {source}")]
    Bind {
        /// The configured value.
        value: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Binds `prometheus_server`: the first of [`ListenAddr::socket_addrs`] that binds.
///
/// # Errors
/// [`AdminError::Bind`] (the last bind error).
pub async fn bind(addr: &ListenAddr) -> Result<TcpListener, AdminError> {
    let mut last = None;
    for a in addr.socket_addrs() {
        match TcpListener::bind(a).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(AdminError::Bind {
        value: addr.to_string(),
        source: last.unwrap_or_else(|| std::io::Error::other("no address to bind")),
    })
}

/// A running admin endpoint.
#[derive(Debug)]
pub struct AdminServer {
    /// The bound address (useful with port 0).
    pub local_addr: SocketAddr,
    /// The accept loop; ends when the shutdown token is cancelled.
    pub task: JoinHandle<()>,
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Answers one request (pure apart from reading the metrics and readiness, and the drain
/// switch). `/drain`: GET says whether this node is drained; POST drains it and DELETE
/// undrains it (`vipd drain`), from a loopback peer only (`local`): the endpoint listens
/// on every address by default, and a drain moves every VIP.
pub(crate) fn respond(
    method: &http::Method,
    path: &str,
    local: bool,
    metrics: &Metrics,
    readiness: &Readiness,
    drain: &DrainSwitch,
) -> Response<Full<Bytes>> {
    if path == "/drain" {
        return match *method {
            http::Method::GET => text(StatusCode::OK, drain.report()),
            http::Method::POST | http::Method::DELETE if !local => text(
                StatusCode::FORBIDDEN,
                "drain and undrain only from this node (a loopback address or the address the endpoint listens on)\n".into(),
            ),
            http::Method::POST => {
                drain.set(true);
                text(StatusCode::OK, drain.report())
            }
            http::Method::DELETE => {
                drain.set(false);
                text(StatusCode::OK, drain.report())
            }
            _ => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "GET, POST (drain) or DELETE (undrain)\n".into(),
            ),
        };
    }
    match path {
        "/metrics" => {
            let mut r = Response::new(Full::new(Bytes::from(metrics.encode())));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            r
        }
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => {
            let status = if readiness.is_ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, readiness.report())
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// Serves the admin endpoint on `listener` until `shutdown` is cancelled.
pub fn serve(
    listener: TcpListener,
    metrics: Metrics,
    readiness: Readiness,
    drain: DrainSwitch,
    shutdown: CancellationToken,
) -> Result<AdminServer, AdminError> {
    let local_addr = listener.local_addr().map_err(|source| AdminError::Bind {
        value: "<listener>".into(),
        source,
    })?;
    let task = tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        warn!(error = %e, "admin endpoint: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let metrics = metrics.clone();
            let readiness = readiness.clone();
            let drain = drain.clone();
            let stop = shutdown.clone();
            // From this node: a loopback peer, or one connecting from the very address it
            // connected to (a client on this node using the node address the endpoint is
            // bound to; another host cannot have this node's address).
            let local = peer.ip().to_canonical().is_loopback()
                || stream
                    .local_addr()
                    .is_ok_and(|l| l.ip().to_canonical() == peer.ip().to_canonical());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let r = respond(
                        req.method(),
                        req.uri().path(),
                        local,
                        &metrics,
                        &readiness,
                        &drain,
                    );
                    async move { Ok::<_, Infallible>(r) }
                });
                let conn = http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(5))
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    r = conn => if let Err(e) = r {
                        debug!(%peer, error = %e, "admin endpoint: connection error");
                    },
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
    Ok(AdminServer { local_addr, task })
}

/// Binds `prometheus_server` and serves it (see [`bind`], [`serve`]).
///
/// # Errors
/// [`AdminError`].
pub async fn start(
    prometheus_server: &ListenAddr,
    metrics: Metrics,
    readiness: Readiness,
    drain: DrainSwitch,
    shutdown: CancellationToken,
) -> Result<AdminServer, AdminError> {
    let listener = bind(prometheus_server).await?;
    let server = serve(listener, metrics, readiness, drain, shutdown)?;
    info!(addr = %server.local_addr, "admin endpoint: /metrics /healthz /readyz /drain");
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        let (head, body) = buf.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_string(), body.to_string())
    }

    #[tokio::test]
    async fn endpoints_over_loopback() {
        let metrics = Metrics::new("node-a");
        let ready = Readiness::new();
        let stop = CancellationToken::new();
        let srv = start(
            &ListenAddr::from(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            metrics.clone(),
            ready.clone(),
            DrainSwitch::default(),
            stop.clone(),
        )
        .await
        .unwrap();
        let a = srv.local_addr;

        assert_eq!(get(a, "/healthz").await.0, 200);
        let (st, _, body) = get(a, "/readyz").await;
        assert_eq!(st, 503);
        assert!(body.contains("config, api, election"), "{body}");
        ready.set_config_valid(true);
        ready.set_api_reachable(true);
        let (st, _, body) = get(a, "/readyz").await;
        assert_eq!((st, body.trim()), (503, "not ready: election"));
        ready.set_election_running(true);
        assert_eq!(get(a, "/readyz").await.0, 200);
        ready.set_api_reachable(false);
        assert_eq!(get(a, "/readyz").await.0, 503);
        ready.set_api_reachable(true);
        ready.set_duplicate_identity("kube-system/plndr-cp-lock", true);
        let (st, _, body) = get(a, "/readyz").await;
        assert_eq!(st, 503);
        assert!(
            body.starts_with("not ready: duplicate-identity\n"),
            "{body}"
        );
        assert!(
            body.contains("kube-system/plndr-cp-lock") && body.contains("must be unique"),
            "{body}"
        );
        ready.set_duplicate_identity("kube-system/plndr-cp-lock", false);
        assert_eq!(get(a, "/readyz").await.0, 200);

        metrics
            .families::<crate::election::metrics::LeaseMetrics>()
            .set_leading("plndr-cp-lock", true);
        let (st, head, body) = get(a, "/metrics").await;
        assert_eq!(st, 200);
        assert!(
            head.to_lowercase().contains("application/openmetrics-text"),
            "{head}"
        );
        assert!(
            body.contains(r#"kube_vip_is_leader{node="node-a",lease_name="plndr-cp-lock"} 1"#),
            "{body}"
        );
        assert_eq!(get(a, "/nope").await.0, 404);

        stop.cancel();
        srv.task.await.unwrap();
        assert!(tokio::net::TcpStream::connect(a).await.is_err());
    }

    /// `/drain`: anyone may ask; only this node (loopback) may drain or undrain.
    #[test]
    fn drain_switch_from_loopback_only() {
        use http::Method;
        let (m, r, d) = (Metrics::new("n"), Readiness::new(), DrainSwitch::default());
        let mut rx = d.subscribe();
        let call = |method: Method, local: bool| {
            respond(&method, "/drain", local, &m, &r, &d)
                .status()
                .as_u16()
        };
        assert_eq!(call(Method::GET, false), 200);
        assert_eq!(call(Method::POST, false), 403);
        assert!(!d.is_set());
        assert_eq!(call(Method::POST, true), 200);
        assert!(d.is_set() && rx.has_changed().unwrap());
        rx.borrow_and_update();
        assert_eq!(call(Method::POST, true), 200);
        assert!(!rx.has_changed().unwrap(), "draining twice is no change");
        assert_eq!(call(Method::DELETE, false), 403);
        assert!(d.is_set());
        assert_eq!(call(Method::DELETE, true), 200);
        assert!(!d.is_set());
        assert_eq!(call(Method::PUT, true), 405);
    }

    /// While Service leases ride through an API outage, an unreachable API does not fail
    /// readiness (the data plane is served) and `/readyz` names the riding leases; once no
    /// lease rides, `api` fails it as before. Other conditions still fail it while riding.
    #[test]
    fn riding_through_keeps_readiness_and_shows_the_api_condition() {
        let ready = Readiness::new();
        ready.set_config_valid(true);
        ready.set_election_running(true);
        ready.set_api_reachable(true);
        assert_eq!(ready.report(), "ok\n");
        ready.set_api_reachable(false);
        assert_eq!(ready.missing(), vec!["api"]);
        ready.set_riding("default/kubevip-web", true);
        ready.set_riding("default/kubevip-db", true);
        assert!(ready.is_ready());
        assert_eq!(
            ready.report(),
            "ok\nriding-through: the API server is unreachable; the VIPs of 2 Service lease(s) \
             stay while a majority of the vipd nodes vouch (svc_ridethrough): \
             default/kubevip-db, default/kubevip-web\n"
        );
        ready.set_config_valid(false);
        let body = ready.report();
        assert!(
            body.starts_with("not ready: config\nriding-through: "),
            "{body}"
        );
        ready.set_config_valid(true);
        ready.set_riding("default/kubevip-web", false);
        ready.set_riding("default/kubevip-db", false);
        assert_eq!(ready.missing(), vec!["api"]);
        assert_eq!(ready.report(), "not ready: api\n");
    }

    /// Issue 27: while nothing rides, `/readyz` says the ride-through state (keyless, armed,
    /// off) on a second line that never changes the verdict; while riding, the
    /// `riding-through:` line replaces it.
    #[test]
    fn readyz_shows_the_ride_through_state_when_not_riding() {
        let ready = Readiness::new();
        ready.set_config_valid(true);
        ready.set_election_running(true);
        ready.set_api_reachable(true);
        ready.set_ride_state(Some(crate::peer::node::KEYLESS_STATE));
        let body = ready.report();
        assert!(body.starts_with("ok\nride-through: keyless ("), "{body}");
        assert!(body.contains("vipd-peer-key"), "{body}");
        ready.set_ride_state(Some(crate::peer::node::ARMED_STATE));
        assert!(ready.report().starts_with("ok\nride-through: armed ("));
        ready.set_api_reachable(false);
        assert!(
            ready
                .report()
                .starts_with("not ready: api\nride-through: armed")
        );
        ready.set_riding("default/kubevip-web", true);
        let body = ready.report();
        assert!(body.starts_with("ok\nriding-through: "), "{body}");
        assert!(!body.contains("ride-through: armed"), "{body}");
    }

    #[test]
    fn stalled_watches_are_those_silent_past_timeout_plus_margin() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let timeout = Duration::from_secs(55);
        let margin = Duration::from_secs(15);
        let watches = [
            ("services", s(0), timeout),
            ("nodes", s(10), timeout),
            ("leases", s(100), timeout),
            ("short", s(0), Duration::from_secs(5)),
        ];
        // At 70 s: exactly timeout + margin is not stalled yet; a short timeout is.
        assert_eq!(
            stalled_watches(watches, s(70), margin),
            vec![("short", Duration::from_secs(70))]
        );
        assert_eq!(
            stalled_watches(watches, s(81), margin),
            vec![
                ("services", Duration::from_secs(81)),
                ("nodes", Duration::from_secs(71)),
                ("short", Duration::from_secs(81)),
            ]
        );
        // Activity later than `now` (clock read before the last touch): not silent.
        assert!(stalled_watches([("leases", s(100), timeout)], s(90), margin).is_empty());
        assert!(stalled_watches([], s(1000), margin).is_empty());
    }

    /// A watch is stalled once silent for longer than its timeout plus the margin; the
    /// transition is reported once each way; an event or a restart ends it; /readyz names it.
    #[tokio::test(start_paused = true)]
    async fn stalled_watch_fails_readiness_until_it_recovers() {
        let ready = Readiness::new();
        ready.set_config_valid(true);
        ready.set_api_reachable(true);
        ready.set_election_running(true);
        let w = WatchActivity::new();
        ready.track_watches(w.clone());
        w.register("services", Duration::from_secs(55));
        w.register("leases", Duration::from_secs(55));
        w.touch("unregistered");
        tokio::time::advance(Duration::from_secs(60)).await;
        w.touch("leases");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(ready.is_ready(), "70 s is timeout + margin, not more");
        assert_eq!(w.transitions(Instant::now()), (vec![], vec![]));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(ready.missing(), vec!["watch-stalled:services"]);
        let body = ready.report();
        assert!(
            body.starts_with("not ready: watch-stalled:services\n")
                && body.contains("watch-stalled:services: no event and no restart for 71 s"),
            "{body}"
        );
        assert_eq!(
            w.transitions(Instant::now()),
            (
                vec![("services".to_string(), Duration::from_secs(71))],
                vec![]
            )
        );
        assert_eq!(w.transitions(Instant::now()), (vec![], vec![]), "once");
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            ready.missing(),
            vec!["watch-stalled:leases", "watch-stalled:services"]
        );
        w.touch("services");
        w.touch("leases");
        assert!(ready.is_ready(), "{}", ready.report());
        // `leases` stalled and recovered between two checks: no transition for it.
        assert_eq!(
            w.transitions(Instant::now()),
            (vec![], vec!["services".to_string()])
        );
    }
}
