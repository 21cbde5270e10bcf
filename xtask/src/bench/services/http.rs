//! HTTP probing of Service addresses from the client namespace.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::{CONNECT_TIMEOUT, POLL_INTERVAL, READ_TIMEOUT};

/// One `GET /` (HTTP/1.0) to `addr`; the first body line (the backend's node name) when the
/// answer is `HTTP/1.x 200`. Must run on a thread inside the client's namespace.
///
/// # Errors
/// The I/O error (connect refused / timed out / unreachable ...) or a non-200 answer.
pub fn http_answer(addr: SocketAddr) -> std::io::Result<String> {
    http_answer_within(addr, CONNECT_TIMEOUT)
}

/// [`http_answer`] with a connect timeout of `connect`.
///
/// # Errors
/// As [`http_answer`].
pub fn http_answer_within(addr: SocketAddr, connect: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, connect)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.set_write_timeout(Some(READ_TIMEOUT))?;
    s.write_all(format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut buf = Vec::new();
    s.take(4096).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let ok = text
        .lines()
        .next()
        .is_some_and(|l| l.starts_with("HTTP/1.") && l.split_whitespace().nth(1) == Some("200"));
    if !ok {
        return Err(std::io::Error::other(format!(
            "not a 200 answer: {:?}",
            text.lines().next().unwrap_or_default()
        )));
    }
    Ok(text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| b.lines().next())
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// When a Service first answered and from which node.
#[derive(Debug, Clone)]
pub struct Answer {
    /// When the answer arrived.
    pub at: Instant,
    /// The backend's node name.
    pub node: String,
}

/// Polls `addr` until it answers (see [`http_answer`]) or `deadline`; at most one attempt
/// per [`POLL_INTERVAL`]. Must run inside the client's namespace.
///
/// # Errors
/// At the deadline: the number of attempts and the last error.
pub fn poll_until_answer(addr: SocketAddr, deadline: Instant) -> Result<Answer> {
    let mut attempts = 0u64;
    loop {
        let started = Instant::now();
        attempts += 1;
        let err = match http_answer(addr) {
            Ok(node) => {
                return Ok(Answer {
                    at: Instant::now(),
                    node,
                });
            }
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            bail!("{addr} never answered ({attempts} attempts, last error: {err})");
        }
        let next = started + POLL_INTERVAL;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}

// ----- the bench context -------------------------------------------------------------------
