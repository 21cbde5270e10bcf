//! `vipd drain`: maintenance hand-over from the node itself. Asks the local vipd manager
//! (its admin endpoint's `/drain`, loopback only) to hand every VIP it holds to a peer and
//! stop campaigning (`--undo` to campaign again, `--status` to ask). The same as the Node
//! annotation `vipd.io/drain=true`, without needing API access (see
//! [`crate::nodes::eligibility`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// `vipd drain` arguments.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// Undrain: let this node campaign for VIPs again
    #[arg(long = "undo")]
    pub undo: bool,
    /// Only print whether this node is drained
    #[arg(long = "status", conflicts_with = "undo")]
    pub status: bool,
    /// Port of the local admin endpoint (the port of prometheus_server)
    #[arg(long = "admin-port", value_name = "PORT", default_value_t = 2112)]
    pub admin_port: u16,
}

/// Errors of `vipd drain`.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The admin endpoint did not answer (vipd not running, another port, or disabled with
    /// an empty `prometheus_server`).
    #[error(
        "cannot reach the vipd admin endpoint at {addr}: {message} (is vipd manager running with prometheus_server on port {port}? use --admin-port)"
    )]
    Unreachable {
        /// Where it was asked.
        addr: SocketAddr,
        /// The port.
        port: u16,
        /// What failed.
        message: String,
    },
    /// It answered with an error status.
    #[error("the vipd admin endpoint answered {status}: {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The answer's text.
        body: String,
    },
}

/// How long one request may take: 5 s.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Drains, undrains or asks (see [`DrainArgs`]); returns the manager's answer (`drained` or
/// `not drained`).
///
/// # Errors
/// [`DrainError`].
pub async fn run(args: &DrainArgs) -> Result<String, DrainError> {
    let method = if args.status {
        http::Method::GET
    } else if args.undo {
        http::Method::DELETE
    } else {
        http::Method::POST
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.admin_port));
    let unreachable = |message: String| DrainError::Unreachable {
        addr,
        port: args.admin_port,
        message,
    };
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let req = http::Request::builder()
            .method(method)
            .uri("/drain")
            .header(http::header::HOST, addr.to_string())
            .header(http::header::USER_AGENT, "vipd-drain")
            .body(Empty::<Bytes>::new())
            .map_err(|e| unreachable(e.to_string()))?;
        let answer = async {
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            let body = String::from_utf8_lossy(&body).trim().to_string();
            if status.is_success() {
                Ok(body)
            } else {
                Err(DrainError::Refused {
                    status: status.as_u16(),
                    body,
                })
            }
        };
        tokio::select! {
            r = answer => r,
            r = conn => Err(unreachable(match r {
                Ok(()) => "connection closed before the answer".into(),
                Err(e) => e.to_string(),
            })),
        }
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(unreachable(format!(
                "no answer within {} s",
                TIMEOUT.as_secs()
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::Readiness;
    use crate::metrics::Metrics;
    use crate::nodes::eligibility::DrainSwitch;
    use tokio_util::sync::CancellationToken;

    /// `vipd drain` against a real admin endpoint on loopback: drain, ask, undrain; and a
    /// clear error when nothing listens.
    #[tokio::test]
    async fn drain_status_undo_through_the_admin_endpoint() {
        let drain = DrainSwitch::default();
        let stop = CancellationToken::new();
        let srv = crate::admin::start(
            &crate::syntax::ListenAddr::from(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
            Metrics::new("n"),
            Readiness::new(),
            drain.clone(),
            stop.clone(),
        )
        .await
        .unwrap();
        let port = srv.local_addr.port();
        let args = |undo, status| DrainArgs {
            undo,
            status,
            admin_port: port,
        };
        assert_eq!(run(&args(false, true)).await.unwrap(), "not drained");
        assert_eq!(run(&args(false, false)).await.unwrap(), "drained");
        assert!(drain.is_set());
        assert_eq!(run(&args(false, true)).await.unwrap(), "drained");
        assert_eq!(run(&args(true, false)).await.unwrap(), "not drained");
        assert!(!drain.is_set());
        stop.cancel();
        srv.task.await.unwrap();
        let e = run(&args(false, false)).await.unwrap_err().to_string();
        assert!(
            e.contains("cannot reach") && e.contains("--admin-port"),
            "{e}"
        );
    }
}
