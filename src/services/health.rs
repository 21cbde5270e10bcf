//! Health-checked Service failover: the holder of a Service lease checks its own data path
//! and hands the Service over when that path is broken, as cloud load balancers do with
//! kube-proxy's health endpoint (`http://127.0.0.1:10256/healthz`, which answers 200 while
//! kube-proxy has programmed the node and 503 otherwise).
//!
//! * What is checked ([`HealthCheck`]): the node's `svc_healthcheck` option, overridden per
//!   Service by the [`HEALTHCHECK_ANNOTATION`] annotation. Off by default: on a cluster
//!   without kube-proxy (Cilium's kube-proxy replacement, k3s with `--disable-kube-proxy`)
//!   nothing answers on 10256, and a default-on check would remove every Service VIP.
//! * When: every [`HealthPolicy::interval`] while this node leads the group's lease, and
//!   while its health gate is closed (to reopen it); never on a follower with the gate open.
//! * The decision ([`HealthMachine`], pure, fed with results and instants): after
//!   [`HealthPolicy::fail_after`] consecutive failures the [`GATE_HEALTH`] gate of the group
//!   closes: the elector removes the VIPs and releases the lease (graceful hand-over), and
//!   the node does not campaign. It reopens after [`HealthPolicy::recover_after`]
//!   consecutive successes, and not before [`HealthPolicy::hold`] after it closed. A holder
//!   hands over for health only once it has held the lease for at least the same hold time,
//!   so a flapping check moves a Service at most once per hold time.
//! * When every node's check fails, nobody announces the Service (each node's gate is
//!   closed): the check says the data path is broken everywhere.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// The node's Service health check settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicesHealth {
    /// `svc_healthcheck`: the check of Services without the `vipd.io/healthcheck`
    /// annotation; `None` (the default): none.
    pub check: Option<HealthCheck>,
    /// `svc_healthcheck_hold` (default 30 s): minimum time out after a health hand-over,
    /// and minimum hold before one.
    pub hold: Duration,
}

/// The election gate a failing health check closes (see [`crate::election::Gates`]).
pub const GATE_HEALTH: &str = "health";

/// Per-Service override of `svc_healthcheck`: an `http://` URL, `tcp:PORT`, `kube-proxy`,
/// or `off`.
pub const HEALTHCHECK_ANNOTATION: &str = crate::services::plan::model::ANN_HEALTHCHECK;

/// kube-proxy's health endpoint (`--healthz-bind-address`, default `0.0.0.0:10256`), what
/// the value `kube-proxy` stands for.
pub const KUBE_PROXY_HEALTHZ: &str = "http://127.0.0.1:10256/healthz";

/// How long one check may take (connect, request and status line).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// One data-path check.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HealthCheck {
    /// `GET` over HTTP/1.0; healthy on a 2xx status.
    Http {
        /// Host and port to connect to, as written (`127.0.0.1:10256`, `[::1]:8080`,
        /// `localhost:80`).
        authority: String,
        /// Path and query (`/healthz`), `/` when the URL has none.
        path: String,
    },
    /// A TCP connect to `127.0.0.1:PORT`; healthy when it is accepted.
    Tcp(u16),
}

impl std::fmt::Display for HealthCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HealthCheck::Http { authority, path } => write!(f, "http://{authority}{path}"),
            HealthCheck::Tcp(p) => write!(f, "tcp:{p}"),
        }
    }
}

/// Parses a `svc_healthcheck` / [`HEALTHCHECK_ANNOTATION`] value: empty or `off` (no check,
/// `Ok(None)`), `kube-proxy` ([`KUBE_PROXY_HEALTHZ`]), `http://HOST[:PORT][/PATH]` (port 80
/// by default; no `https`, no user info) or `tcp:PORT` (1..=65535, on 127.0.0.1). The
/// error says what is wrong, for the caller to name the setting.
pub fn parse_check(value: &str) -> Result<Option<HealthCheck>, String> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    if v == "kube-proxy" {
        return parse_check(KUBE_PROXY_HEALTHZ);
    }
    if let Some(port) = v.strip_prefix("tcp:") {
        return match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok(Some(HealthCheck::Tcp(p))),
            _ => Err(format!("tcp:PORT needs a port in 1..=65535, got {port:?}")),
        };
    }
    let Some(rest) = v.strip_prefix("http://") else {
        return Err(
            "expected off, kube-proxy, an http:// URL (e.g. http://127.0.0.1:10256/healthz) or tcp:PORT"
                .into(),
        );
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') || authority.contains(char::is_whitespace) {
        return Err(format!("bad host in URL: {authority:?}"));
    }
    if path.contains(char::is_whitespace) || path.contains('#') {
        return Err(format!("bad path in URL: {path:?}"));
    }
    // Host and port: [v6]:port, [v6], host:port, host.
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let Some((h, after)) = r.split_once(']') else {
            return Err(format!("bad IPv6 host in URL: {authority:?}"));
        };
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("bad IPv6 host in URL: {authority:?}"));
        }
        match after {
            "" => (format!("[{h}]"), None),
            p => match p.strip_prefix(':') {
                Some(p) => (format!("[{h}]"), Some(p)),
                None => return Err(format!("bad host in URL: {authority:?}")),
            },
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let port = match port {
        None => 80,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(format!("bad port in URL: {p:?}")),
        },
    };
    if host.is_empty() {
        return Err(format!("bad host in URL: {authority:?}"));
    }
    Ok(Some(HealthCheck::Http {
        authority: format!("{host}:{port}"),
        path: path.to_string(),
    }))
}

/// Runs `check` once within [`CHECK_TIMEOUT`]: `Ok` when healthy, else what went wrong
/// (`connect 127.0.0.1:10256: Connection refused`, `HTTP 503`, `timed out after 1000 ms`).
pub async fn run_check(check: &HealthCheck) -> Result<(), String> {
    match tokio::time::timeout(CHECK_TIMEOUT, run_check_untimed(check)).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {} ms", CHECK_TIMEOUT.as_millis())),
    }
}

async fn run_check_untimed(check: &HealthCheck) -> Result<(), String> {
    match check {
        HealthCheck::Tcp(port) => {
            let addr = SocketAddr::from(([127, 0, 0, 1], *port));
            tokio::net::TcpStream::connect(addr)
                .await
                .map(|_| ())
                .map_err(|e| format!("connect {addr}: {e}"))
        }
        HealthCheck::Http { authority, path } => {
            let mut s = tokio::net::TcpStream::connect(authority.as_str())
                .await
                .map_err(|e| format!("connect {authority}: {e}"))?;
            let req = format!(
                "GET {path} HTTP/1.0\r\nHost: {authority}\r\nUser-Agent: vipd\r\nConnection: close\r\n\r\n"
            );
            s.write_all(req.as_bytes())
                .await
                .map_err(|e| format!("send request: {e}"))?;
            // The status line is all we need.
            let mut buf = Vec::with_capacity(64);
            let mut chunk = [0u8; 256];
            while !buf.contains(&b'\n') && buf.len() < 1024 {
                let n = s
                    .read(&mut chunk)
                    .await
                    .map_err(|e| format!("read response: {e}"))?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.lines().next().unwrap_or("").trim();
            match status_code(line) {
                Some(c) if (200..300).contains(&c) => Ok(()),
                Some(c) => Err(format!("HTTP {c}")),
                None if line.is_empty() => Err("no HTTP response".into()),
                None => Err(format!("not an HTTP status line: {line:?}")),
            }
        }
    }
}

/// The code of an HTTP status line (`HTTP/1.1 200 OK` -> 200).
fn status_code(line: &str) -> Option<u16> {
    let mut parts = line.split_whitespace();
    let proto = parts.next()?;
    if !proto.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

/// Thresholds and times of the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Time between checks (1 s).
    pub interval: Duration,
    /// Consecutive failures that close the gate (3).
    pub fail_after: u32,
    /// Consecutive successes that reopen it (2).
    pub recover_after: u32,
    /// `svc_healthcheck_hold` (30 s): a node that handed over for health stays out at
    /// least this long, and a holder holds at least this long before it hands over for
    /// health.
    pub hold: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            interval: Duration::from_secs(1),
            fail_after: 3,
            recover_after: 2,
            hold: DEFAULT_HOLD,
        }
    }
}

/// Default of `svc_healthcheck_hold`.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(30);

/// What [`HealthMachine::on_result`] asks the caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthStep {
    /// Nothing changes.
    Nothing,
    /// Close the gate: hand over (the check failed `fail_after` times; the last error).
    HandOver(String),
    /// Open the gate again (campaign).
    Reopen,
}

/// The pure health decision of one group on one node (see the module docs).
#[derive(Debug, Clone)]
pub struct HealthMachine {
    policy: HealthPolicy,
    /// Consecutive failures while open.
    failures: u32,
    /// `Some(since)` while the gate is closed for health.
    closed_since: Option<Instant>,
    /// Consecutive successes while closed.
    successes: u32,
    /// When the current term began (`None`: not leading).
    leading_since: Option<Instant>,
}

impl HealthMachine {
    /// Open, not leading.
    pub fn new(policy: HealthPolicy) -> Self {
        HealthMachine {
            policy,
            failures: 0,
            closed_since: None,
            successes: 0,
            leading_since: None,
        }
    }

    /// Whether the gate is open.
    pub fn is_open(&self) -> bool {
        self.closed_since.is_none()
    }

    /// Whether checks should run now: while leading, and while the gate is closed.
    pub fn wants_checks(&self) -> bool {
        self.leading_since.is_some() || self.closed_since.is_some()
    }

    /// Leadership changed at `now`: a new term starts its hold time; losing it forgets the
    /// failures counted while leading.
    pub fn on_leading(&mut self, leading: bool, now: Instant) {
        match (leading, self.leading_since) {
            (true, None) => {
                self.leading_since = Some(now);
                self.failures = 0;
            }
            (false, Some(_)) => {
                self.leading_since = None;
                self.failures = 0;
            }
            _ => {}
        }
    }

    /// The health check was switched off (or the group has no check any more): open.
    pub fn on_disabled(&mut self) -> HealthStep {
        self.failures = 0;
        self.successes = 0;
        if self.closed_since.take().is_some() {
            HealthStep::Reopen
        } else {
            HealthStep::Nothing
        }
    }

    /// One check result at `now`.
    pub fn on_result(&mut self, now: Instant, result: Result<(), String>) -> HealthStep {
        let p = self.policy;
        match self.closed_since {
            Some(since) => {
                match result {
                    Ok(()) => self.successes = self.successes.saturating_add(1),
                    Err(_) => self.successes = 0,
                }
                if self.successes >= p.recover_after && now.duration_since(since) >= p.hold {
                    self.closed_since = None;
                    self.successes = 0;
                    self.failures = 0;
                    HealthStep::Reopen
                } else {
                    HealthStep::Nothing
                }
            }
            None => {
                let err = match result {
                    Ok(()) => {
                        self.failures = 0;
                        return HealthStep::Nothing;
                    }
                    Err(e) => e,
                };
                let Some(lead) = self.leading_since else {
                    // Not leading, gate open: nothing to hand over, nothing to count.
                    return HealthStep::Nothing;
                };
                self.failures = self.failures.saturating_add(1);
                if self.failures >= p.fail_after && now.duration_since(lead) >= p.hold {
                    self.closed_since = Some(now);
                    self.successes = 0;
                    self.failures = 0;
                    HealthStep::HandOver(err)
                } else {
                    HealthStep::Nothing
                }
            }
        }
    }
}

/// The node's health settings, shared by every group task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HealthSettings {
    /// `svc_healthcheck`: the check of Services without [`HEALTHCHECK_ANNOTATION`].
    pub(crate) default: Option<HealthCheck>,
    /// Thresholds and times (`svc_healthcheck_hold`).
    pub(crate) policy: HealthPolicy,
}

/// The checks of a group's Services: each Service's [`HEALTHCHECK_ANNOTATION`] when set
/// (an invalid value is reported in `invalid` as `(service, value, error)` and the node's
/// check used instead), else `default`. Sorted and without repeats. Pure.
pub(crate) fn group_checks<'a>(
    annotations: impl IntoIterator<Item = (String, Option<&'a str>)>,
    default: Option<&HealthCheck>,
    invalid: &mut Vec<(String, String, String)>,
) -> Vec<HealthCheck> {
    let mut out = std::collections::BTreeSet::new();
    for (service, ann) in annotations {
        let check = match ann.map(parse_check) {
            None => default.cloned(),
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                invalid.push((service, ann.unwrap_or_default().to_string(), e));
                default.cloned()
            }
        };
        out.extend(check);
    }
    out.into_iter().collect()
}

/// Runs `checks` one after the other; the first failure as `check: error`.
async fn run_checks(checks: &[HealthCheck]) -> Result<(), String> {
    for c in checks {
        run_check(c).await.map_err(|e| format!("{c}: {e}"))?;
    }
    Ok(())
}

/// The health task of a group ([`task::follow`]).
pub(super) mod task;

#[cfg(test)]
mod tests;
