//! The command line of `vipd probe`: [`Args`] (clap), [`parse_duration`], the parsed
//! [`Target`] and the validated [`ProbeConfig`].

use std::time::Duration;

use super::ProbeError;

/// A duration string that [`parse_duration`] refused; the message names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {reason} (expected e.g. \"100ms\", \"1s\", \"1.5s\", \"2m\")")]
pub struct DurationError {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a duration such as `"100ms"`, `"1s"`, `"1.5s"`, `"2m"`.
///
/// Grammar: a non-negative decimal number (digits, optionally `.` and more digits) followed
/// by exactly one unit: `us`, `ms`, `s`, `m` (minutes) or `h`, like Go's
/// `time.ParseDuration` for a single term. Surrounding whitespace is ignored. The value is
/// computed exactly (no floating point); sub-nanosecond digits are truncated.
///
/// # Errors
///
/// [`DurationError`] naming the value when the number or unit is missing or malformed, or the
/// result overflows [`Duration`].
pub fn parse_duration(value: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        value: value.to_owned(),
        reason,
    };
    let s = value.trim();
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(num_end);
    if number.is_empty() {
        return Err(err("missing number"));
    }
    let unit_ns: u128 = match unit {
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" => return Err(err("missing unit")),
        _ => return Err(err("unknown unit")),
    };
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if frac_part.contains('.') {
        return Err(err("more than one decimal point"));
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("missing number"));
    }
    let mut nanos: u128 = 0;
    for d in int_part.bytes() {
        nanos = nanos
            .checked_mul(10)
            .and_then(|n| n.checked_add(u128::from(d - b'0')))
            .ok_or_else(|| err("too large"))?;
    }
    nanos = nanos.checked_mul(unit_ns).ok_or_else(|| err("too large"))?;
    // Fractional digits: value = digit * unit / 10^position, truncated at 1 ns.
    let mut scale = unit_ns;
    for d in frac_part.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        nanos += u128::from(d - b'0') * scale;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| err("too large"))?;
    // The remainder is < 10^9 and always fits a u32.
    let sub = u32::try_from(nanos % 1_000_000_000).map_err(|_| err("too large"))?;
    Ok(Duration::new(secs, sub))
}

/// Command-line arguments of `vipd probe` (clap derive; the lead wires it into `main.rs`).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Args {
    /// Target URL, `http://HOST[:PORT][/PATH]` (HOST: IPv4, `[IPv6]` or a name resolved per
    /// request), or `tcp://HOST:PORT` to only open a TCP connection per probe (e.g. an API
    /// server's TLS port). Without a scheme, `http://` is assumed. HTTPS is not supported.
    #[arg(value_name = "URL")]
    pub target: String,
    /// Time between request starts (fixed schedule), e.g. 100ms, 1s, 1.5s, 2m.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Duration,
    /// Bound on resolve + connect + request + response body, per request. Keep it under
    /// 1s when measuring a failover: TCP retransmits a SYN lost in the outage 1 s later
    /// (RFC 6298), and an answer to that retransmission, counted in start order, would
    /// stretch the gap to about 1 s however short the outage was.
    #[arg(long, default_value = "900ms", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
    /// Stop after issuing this many requests (then wait for those in flight).
    #[arg(long, conflicts_with = "duration")]
    pub count: Option<u64>,
    /// Stop issuing requests after this long (then wait for those in flight).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,
    /// Do not print a line per answer; only the summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as one line of JSON on stdout (per-answer lines go to stderr).
    #[arg(long)]
    pub json: bool,
}

/// The parsed target of a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as normalised (`http://host[:port]/path`).
    pub url: String,
    /// Host as in the URL, without IPv6 brackets.
    pub host: String,
    /// TCP port (default 80).
    pub port: u16,
    /// Value of the `Host` header (the URL's authority).
    pub authority: String,
    /// Request target in origin form, `/path?query` (default `/`).
    pub path_and_query: String,
    /// `tcp://HOST:PORT`: each probe only opens a TCP connection (success = the handshake
    /// completed) and closes it, for services that are not plain HTTP (an API server's
    /// TLS port behind a VIP, a load balancer's frontend).
    pub tcp_only: bool,
}

impl Target {
    /// Parses `http://HOST[:PORT][/PATH]` (a missing scheme means `http://`) or
    /// `tcp://HOST:PORT` (connect only).
    ///
    /// # Errors
    ///
    /// [`ProbeError::InvalidArg`] for `TARGET` when the URL does not parse, the scheme is not
    /// `http` or `tcp`, the host is missing, or a `tcp://` target has no port.
    pub fn parse(value: &str) -> Result<Self, ProbeError> {
        let invalid = |reason: String| ProbeError::InvalidArg {
            flag: "TARGET",
            value: value.to_owned(),
            reason,
        };
        let uri = crate::syntax::uri_with_default_scheme(value, "http").map_err(invalid)?;
        let tcp_only = match uri.scheme_str() {
            Some("http") => false,
            Some("tcp") => true,
            Some(other) => {
                return Err(invalid(format!(
                    "scheme {other:?} unsupported, use http or tcp"
                )));
            }
            None => return Err(invalid("missing scheme".to_owned())),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| invalid("missing host".to_owned()))?;
        if authority.as_str().contains('@') {
            return Err(invalid("user info in the URL is not supported".to_owned()));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        // `Authority::port()` is `None` for an out-of-range port such as 99999: read the text
        // after the host instead, so that such a port is an error, not silently port 80.
        let port_text = authority
            .as_str()
            .strip_prefix(authority.host())
            .and_then(|rest| rest.strip_prefix(':'))
            .unwrap_or("");
        let port = if port_text.is_empty() {
            if tcp_only {
                return Err(invalid("tcp://HOST:PORT needs a port".to_owned()));
            }
            80
        } else {
            match port_text.parse::<u16>() {
                Ok(0) | Err(_) => return Err(invalid(format!("invalid port {port_text:?}"))),
                Ok(n) => n,
            }
        };
        let path_and_query = uri
            .path_and_query()
            .map(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .unwrap_or("/")
            .to_owned();
        Ok(Self {
            url: if tcp_only {
                format!("tcp://{}", authority.as_str())
            } else {
                format!("http://{}{}", authority.as_str(), path_and_query)
            },
            host,
            port,
            authority: authority.as_str().to_owned(),
            path_and_query,
            tcp_only,
        })
    }
}

/// When a probe run stops issuing requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Only the shutdown future stops it.
    Forever,
    /// After issuing this many requests.
    Count(u64),
    /// After this long since the first request.
    Duration(Duration),
}

/// Validated probe settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    /// What to request.
    pub target: Target,
    /// Time between request starts (> 0).
    pub interval: Duration,
    /// Per-request bound on resolve + connect + response (> 0).
    pub timeout: Duration,
    /// When to stop issuing requests.
    pub limit: Limit,
}

impl ProbeConfig {
    /// Validates [`Args`].
    ///
    /// # Errors
    ///
    /// [`ProbeError::InvalidArg`] naming the flag and value: a bad `TARGET`, `--interval` below
    /// 1 ms, a zero `--timeout`, `--count 0`, a zero `--duration`, or both `--count` and
    /// `--duration`.
    pub(crate) fn from_args(args: &Args) -> Result<Self, ProbeError> {
        let target = Target::parse(&args.target)?;
        if args.interval < Duration::from_millis(1) {
            return Err(ProbeError::InvalidArg {
                flag: "--interval",
                value: format!("{}ms", args.interval.as_millis()),
                reason: "must be at least 1ms".to_owned(),
            });
        }
        if args.timeout.is_zero() {
            return Err(ProbeError::InvalidArg {
                flag: "--timeout",
                value: format!("{}ms", args.timeout.as_millis()),
                reason: "must be greater than zero".to_owned(),
            });
        }
        let limit = match (args.count, args.duration) {
            (Some(_), Some(d)) => {
                return Err(ProbeError::InvalidArg {
                    flag: "--duration",
                    value: format!("{d:?}"),
                    reason: "cannot be combined with --count".to_owned(),
                });
            }
            (Some(0), None) => {
                return Err(ProbeError::InvalidArg {
                    flag: "--count",
                    value: "0".to_owned(),
                    reason: "must be at least 1".to_owned(),
                });
            }
            (Some(n), None) => Limit::Count(n),
            (None, Some(d)) if d.is_zero() => {
                return Err(ProbeError::InvalidArg {
                    flag: "--duration",
                    value: format!("{d:?}"),
                    reason: "must be greater than zero".to_owned(),
                });
            }
            (None, Some(d)) => Limit::Duration(d),
            (None, None) => Limit::Forever,
        };
        Ok(Self {
            target,
            interval: args.interval,
            timeout: args.timeout,
            limit,
        })
    }
}
