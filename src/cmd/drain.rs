//! `vipd drain`: maintenance hand-over from the node itself. Asks the local vipd manager
//! (its admin endpoint's `/drain`, loopback only) to hand every VIP it holds to a peer and
//! stop campaigning (`--undo` to campaign again, `--status` to ask). The same as the Node
//! annotation `vipd.io/drain=true`, without needing API access (see
//! [`crate::nodes::eligibility`]).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::syntax::ListenAddr;

/// `vipd drain` arguments.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// Undrain: let this node campaign for VIPs again
    #[arg(long = "undo")]
    pub undo: bool,
    /// Only print whether this node is drained
    #[arg(long = "status", conflicts_with = "undo")]
    pub status: bool,
    /// The local vipd's admin endpoint, as its prometheus_server says (`:2112`,
    /// `192.0.2.11:2112`, ...) [default: $prometheus_server, else :2112]
    #[arg(long = "admin", value_name = "ADDR")]
    pub admin: Option<String>,
}

impl DrainArgs {
    /// The address to ask: `--admin`, else the `prometheus_server` environment variable (as
    /// the manager reads it), else `:2112`, reached from this node
    /// ([`ListenAddr::local_target`]).
    ///
    /// # Errors
    /// [`DrainError::Admin`] for a value the manager would refuse, or an empty one (the
    /// endpoint is disabled).
    pub fn target(&self) -> Result<SocketAddr, DrainError> {
        let (value, from) = match &self.admin {
            Some(v) => (v.clone(), "--admin"),
            None => match std::env::var("prometheus_server") {
                Ok(v) => (v, "prometheus_server"),
                Err(_) => (":2112".to_string(), "the default"),
            },
        };
        if value.is_empty() {
            return Err(DrainError::Admin {
                from,
                value,
                reason: "empty: the admin endpoint is disabled, so there is nothing to ask; use the vipd.io/drain=true node annotation".into(),
            });
        }
        ListenAddr::parse(&value)
            .map(|l| l.local_target())
            .map_err(|reason| DrainError::Admin {
                from,
                value,
                reason,
            })
    }
}

/// Errors of `vipd drain`.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The admin endpoint's address is unusable.
    #[error("{from} {value:?}: {reason}")]
    Admin {
        /// Where the value came from (`--admin`, `prometheus_server`, the default).
        from: &'static str,
        /// The value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The admin endpoint did not answer (vipd not running, or listening elsewhere).
    #[error(
        "cannot reach the vipd admin endpoint at {addr}: {message} (is vipd manager running on this node with this prometheus_server? use --admin)"
    )]
    Unreachable {
        /// Where it was asked.
        addr: SocketAddr,
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
    let addr = args.target()?;
    let unreachable = |message: String| DrainError::Unreachable { addr, message };
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

    /// The address forms the manager takes, reached from this node.
    #[test]
    fn the_admin_address_is_reached_from_this_node() {
        let target = |a: &str| {
            DrainArgs {
                undo: false,
                status: false,
                admin: Some(a.into()),
            }
            .target()
        };
        assert_eq!(target(":2112").unwrap().to_string(), "127.0.0.1:2112");
        assert_eq!(target("[::]:9").unwrap().to_string(), "[::1]:9");
        assert_eq!(
            target("192.0.2.11:2112").unwrap().to_string(),
            "192.0.2.11:2112"
        );
        let e = target("").unwrap_err().to_string();
        assert!(e.contains("--admin") && e.contains("disabled"), "{e}");
        let e = target("myhost:2112").unwrap_err().to_string();
        assert!(e.contains("--admin \"myhost:2112\""), "{e}");
    }
}
