//! One HTTP/1.1 request on a new TCP connection (hyper 1 over tokio) and the mapping of its
//! errors to [`FailureKind`].

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::config::Target;
use super::stats::FailureKind;

/// Largest number of body bytes read per answer while looking for the first line (64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// One request on a new connection, bound by `timeout` as a whole.
pub(super) async fn request(target: &Target, timeout: Duration) -> Result<String, FailureKind> {
    match tokio::time::timeout(timeout, request_unbounded(target)).await {
        Ok(result) => result,
        Err(_) => Err(FailureKind::Timeout),
    }
}

async fn request_unbounded(target: &Target) -> Result<String, FailureKind> {
    let addr = match target.host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, target.port),
        Err(_) => tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .map_err(|e| FailureKind::Other(format!("resolve {}: {e}", target.host)))?
            .next()
            .ok_or_else(|| FailureKind::Other(format!("resolve {}: no address", target.host)))?,
    };
    let stream = TcpStream::connect(addr).await.map_err(|e| io_failure(&e))?;
    if target.tcp_only {
        // The handshake completed: a listener answered (behind a DNAT, whichever backend
        // it chose, which a connect alone cannot name).
        return Ok("connected".to_owned());
    }
    // Small requests: do not let Nagle delay them. Failure to set it is harmless.
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| hyper_failure(&e))?;
    let req = http::Request::get(target.path_and_query.as_str())
        .header(http::header::HOST, target.authority.as_str())
        .header(http::header::CONNECTION, "close")
        .header(http::header::USER_AGENT, "vipd-probe")
        .body(Empty::<Bytes>::new())
        .map_err(|e| FailureKind::Other(format!("building request: {e}")))?;
    let exchange = async move {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| hyper_failure(&e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(FailureKind::Status(status.as_u16()));
        }
        first_line(resp.into_body()).await
    };
    // Drive the connection and the exchange together on this task, so that a timeout drops
    // both and no connection task outlives the request. Once the exchange has its answer the
    // connection is dropped (closed) without waiting for the rest of the body.
    tokio::pin!(exchange);
    tokio::select! {
        result = &mut exchange => result,
        // The connection ended first (closed after the response, or failed): the exchange
        // now completes from what was received, or with the connection's error.
        _ = conn => exchange.await,
    }
}

/// Reads the body until its first line is complete (or EOF, or [`MAX_BODY_BYTES`]) and
/// returns that line without trailing whitespace; invalid UTF-8 is replaced.
async fn first_line(mut body: hyper::body::Incoming) -> Result<String, FailureKind> {
    let mut buf: Vec<u8> = Vec::new();
    while !buf.contains(&b'\n') && buf.len() < MAX_BODY_BYTES {
        match body.frame().await {
            None => break,
            Some(Err(e)) => return Err(hyper_failure(&e)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
    let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
    Ok(String::from_utf8_lossy(line).trim_end().to_owned())
}

fn io_failure(e: &std::io::Error) -> FailureKind {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => FailureKind::Refused,
        K::HostUnreachable | K::NetworkUnreachable => FailureKind::Unreachable,
        K::TimedOut => FailureKind::Timeout,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
            FailureKind::Reset
        }
        _ => FailureKind::Other(e.to_string()),
    }
}

fn hyper_failure(e: &hyper::Error) -> FailureKind {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io_failure(io);
        }
        source = s.source();
    }
    if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        FailureKind::Reset
    } else if e.is_parse() || e.is_parse_status() {
        FailureKind::Protocol(e.to_string())
    } else if e.is_timeout() {
        FailureKind::Timeout
    } else {
        FailureKind::Other(e.to_string())
    }
}
