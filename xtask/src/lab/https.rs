//! A tiny blocking HTTPS client for the lab's bootstrap calls.
//!
//! The lab needs four requests (GET /readyz, GET a namespace, POST a ClusterRoleBinding,
//! GET /version) before any test code runs. Rather than spawning `curl` or adding an HTTP
//! client crate, this speaks HTTP/1.0 over rustls (already in the workspace through kube):
//! HTTP/1.0 makes the Go server answer without chunked encoding and close the connection,
//! so the body is simply everything up to EOF. It must run on a thread that is inside the
//! lab's network namespace (see [`super::netns`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};

use super::error::{LabError, Result, io_ctx};

/// An HTTP response: status code and body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// HTTP status code, e.g. 200.
    pub status: u16,
    /// Response body as (lossy) UTF-8.
    pub body: String,
}

/// Client for one API server address, trusting exactly one CA, authenticating with a
/// bearer token.
#[derive(Clone)]
pub struct ApiClient {
    config: Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    token: String,
}

impl ApiClient {
    /// Builds a client for `addr` that trusts only `ca_der` and sends `token`.
    ///
    /// # Errors
    /// [`LabError::Tls`] when the CA certificate is rejected.
    pub fn new(addr: SocketAddr, ca_der: &[u8], token: &str) -> Result<ApiClient> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(ca_der.to_vec()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ApiClient {
            config: Arc::new(config),
            addr,
            token: token.to_string(),
        })
    }

    /// Sends `method path` with an optional JSON body (a merge patch for `PATCH`); returns
    /// status and body.
    ///
    /// Connect/read timeouts are 5 s.
    ///
    /// # Errors
    /// [`LabError::Io`] on connection or TLS failures, [`LabError::Parse`] on a malformed
    /// response. HTTP error statuses are returned as `Ok`.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Result<HttpResponse> {
        let ctx = format!("{method} https://{}{path}", self.addr);
        let tcp = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))
            .map_err(io_ctx(ctx.clone()))?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(io_ctx(ctx.clone()))?;
        let name = ServerName::IpAddress(self.addr.ip().into());
        let conn = rustls::ClientConnection::new(self.config.clone(), name)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let body = body.unwrap_or("");
        let mut req = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Accept: application/json\r\nUser-Agent: vipd-lab\r\n",
            self.addr, self.token
        );
        if !body.is_empty() {
            // PATCH bodies are JSON merge patches (RFC 7386).
            let content_type = if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            req.push_str(&format!(
                "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        req.push_str(body);
        tls.write_all(req.as_bytes()).map_err(io_ctx(ctx.clone()))?;
        tls.flush().map_err(io_ctx(ctx.clone()))?;
        let mut raw = Vec::new();
        match tls.read_to_end(&mut raw) {
            Ok(_) => {}
            // A peer closing without close_notify after a complete response is fine here.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => return Err(io_ctx(ctx)(e)),
        }
        parse_response(&raw).ok_or_else(|| LabError::Parse {
            what: format!("HTTP response to {method} {path}"),
            detail: String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned(),
        })
    }

    /// Like [`ApiClient::request`] but turns a status outside 200..300 into
    /// [`LabError::Http`].
    ///
    /// # Errors
    /// As [`ApiClient::request`], plus [`LabError::Http`].
    pub fn request_ok(&self, method: &str, path: &str, body: Option<&str>) -> Result<String> {
        let resp = self.request(method, path, body)?;
        if (200..300).contains(&resp.status) {
            Ok(resp.body)
        } else {
            Err(LabError::Http {
                method: method.to_string(),
                path: path.to_string(),
                status: resp.status,
                body: resp.body.chars().take(500).collect(),
            })
        }
    }
}

impl ApiClient {
    /// Sends `GET path` (a watch, say) and calls `on_line(Some(line))` with each line of the
    /// body as it arrives, and `on_line(None)` whenever nothing arrived for `idle`; stops
    /// when the server ends the body or `on_line` returns false. Returns the HTTP status
    /// (the body of a non-200 answer is passed on as lines too).
    ///
    /// # Errors
    /// [`LabError::Io`] on connection or TLS failures, [`LabError::Parse`] on a malformed
    /// status line.
    pub fn get_lines(
        &self,
        path: &str,
        idle: Duration,
        mut on_line: impl FnMut(Option<&str>) -> bool,
    ) -> Result<u16> {
        let ctx = format!("GET https://{}{path}", self.addr);
        let tcp = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))
            .map_err(io_ctx(ctx.clone()))?;
        tcp.set_read_timeout(Some(idle))
            .map_err(io_ctx(ctx.clone()))?;
        let name = ServerName::IpAddress(self.addr.ip().into());
        let conn = rustls::ClientConnection::new(self.config.clone(), name)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let req = format!(
            "GET {path} HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Accept: application/json\r\nUser-Agent: vipd-lab\r\n\r\n",
            self.addr, self.token
        );
        tls.write_all(req.as_bytes()).map_err(io_ctx(ctx.clone()))?;
        tls.flush().map_err(io_ctx(ctx.clone()))?;
        let mut buf: Vec<u8> = Vec::new();
        let mut status: Option<u16> = None;
        let mut chunk = [0u8; 64 * 1024];
        loop {
            let n = match tls.read(&mut chunk) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if !on_line(None) {
                        break;
                    }
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                Err(e) => return Err(io_ctx(ctx)(e)),
            };
            buf.extend_from_slice(&chunk[..n]);
            if status.is_none() {
                if let Some(split) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let parsed =
                        parse_response(&buf[..split + 4]).ok_or_else(|| LabError::Parse {
                            what: format!("HTTP response to GET {path}"),
                            detail: String::from_utf8_lossy(&buf[..split.min(200)]).into_owned(),
                        })?;
                    status = Some(parsed.status);
                    buf.drain(..split + 4);
                } else if n == 0 {
                    return Err(LabError::Parse {
                        what: format!("HTTP response to GET {path}"),
                        detail: String::from_utf8_lossy(&buf[..buf.len().min(200)]).into_owned(),
                    });
                }
            }
            if status.is_some() {
                let mut keep = true;
                while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=end).collect();
                    if keep && !on_line(Some(String::from_utf8_lossy(&line).trim())) {
                        keep = false;
                    }
                }
                if !keep {
                    break;
                }
                if n == 0 {
                    if !buf.is_empty() {
                        on_line(Some(String::from_utf8_lossy(&buf).trim()));
                    }
                    break;
                }
            }
        }
        Ok(status.unwrap_or(0))
    }
}

fn parse_response(raw: &[u8]) -> Option<HttpResponse> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let status_line = head.lines().next()?;
    let mut parts = status_line.split_whitespace();
    let proto = parts.next()?;
    if !proto.starts_with("HTTP/") {
        return None;
    }
    let status = parts.next()?.parse().ok()?;
    Some(HttpResponse {
        status,
        body: String::from_utf8_lossy(&raw[split + 4..]).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_body() {
        let r = parse_response(b"HTTP/1.0 404 Not Found\r\nA: b\r\n\r\n{\"x\":1}").unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.body, "{\"x\":1}");
        assert!(parse_response(b"garbage").is_none());
        assert!(parse_response(b"SMTP 200\r\n\r\n").is_none());
    }
}
