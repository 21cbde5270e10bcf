//! Syntax rules vipd shares with Kubernetes and Go, written once: DNS-1123 names (as the
//! API server validates object names) and Go's `strconv.ParseBool` (what kube-vip's cobra
//! flags and env variables accept), and the URL shorthand of `host[:port]` that kubectl's
//! `--server` and curl accept.

/// Kubernetes `IsDNS1123Label`: 1 to 63 lower-case letters, digits and `-`, starting and
/// ending with a letter or digit (namespaces, Service names).
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_shaped(s)
}

/// Kubernetes `IsDNS1123Subdomain`: at most 253 characters, dot-separated parts shaped like
/// DNS-1123 labels (Kubernetes does not limit each part to 63 characters here). Object
/// names such as Leases, Nodes and Events.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label_shaped)
}

/// Lower-case letters, digits and `-`, starting and ending with a letter or digit.
fn is_label_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Go `strconv.ParseBool`: `1 t T TRUE true True` and `0 f F FALSE false False`; `None` for
/// any other text (callers name the setting in their error).
pub(crate) fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// What [`parse_go_bool`] accepts, for error messages.
pub(crate) const GO_BOOL_VALUES: &str = "1 t T TRUE true True 0 f F FALSE false False";

/// Splits a listen address `host:port`, `[v6]:port` or `:port` (kube-vip's
/// `prometheus_server` forms) into the host without brackets (empty for `:port`) and the port.
///
/// # Errors
///
/// The reason as text (callers name the field and the value): no `:`, a `[` without its
/// `]:port`, a stray bracket, or a port that is not a number from 0 to 65535.
pub fn split_host_port(value: &str) -> Result<(&str, u16), &'static str> {
    let (host, port) = match value.strip_prefix('[') {
        Some(rest) => rest.split_once("]:").ok_or(
            "an IPv6 host in brackets must be followed by ]:port, e.g. [2001:db8::1]:6443",
        )?,
        None => value
            .rsplit_once(':')
            .ok_or("expected host:port (e.g. 192.0.2.10:6443), a port is required")?,
    };
    if host.contains(['[', ']']) {
        return Err("unbalanced brackets: write an IPv6 host as [addr]:port");
    }
    let port: u16 = match port.parse() {
        Ok(p) if port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err("the port is not a number between 0 and 65535"),
    };
    Ok((host, port))
}

/// The host of a `host:port` value ([`parse_host_port`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host<'a> {
    /// `:port`: no host.
    Empty,
    /// An IPv4 address, or an IPv6 address in brackets.
    Ip(std::net::IpAddr),
    /// A DNS name (dot-separated labels of letters, digits and `-`), not resolved here.
    Name(&'a str),
}

/// `host:port`, `[v6]:port` or `:port` ([`split_host_port`]) with the host classified: an
/// IPv6 host must be in brackets and a bracketed host must be IPv6; any other host is an
/// IPv4 address or a DNS name. The port is 1 to 65535.
///
/// # Errors
///
/// The reason as text (callers name the field and the value).
pub(crate) fn parse_host_port(value: &str) -> Result<(Host<'_>, u16), String> {
    let (host, port) = split_host_port(value)?;
    let host = if value.starts_with('[') {
        match host.parse::<std::net::Ipv6Addr>() {
            Ok(ip) => Host::Ip(ip.into()),
            Err(_) => {
                return Err(format!(
                    "expected [IPv6]:port; {host:?} is not an IPv6 address"
                ));
            }
        }
    } else if host.contains(':') {
        return Err("an IPv6 host must be written in brackets: [addr]:port".to_owned());
    } else if host.is_empty() {
        Host::Empty
    } else if let Ok(ip) = host.parse::<std::net::Ipv4Addr>() {
        Host::Ip(ip.into())
    } else if host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
    {
        Host::Name(host)
    } else {
        return Err(format!("{host:?} is not a host name or IP address"));
    };
    if port == 0 {
        return Err("port 0 is not a port between 1 and 65535".to_owned());
    }
    Ok((host, port))
}

/// A listen address (`prometheus_server`), parsed once: what the configuration accepts is
/// exactly what the admin endpoint binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenAddr {
    host: ListenHost,
    port: u16,
}

/// The host part of a [`ListenAddr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListenHost {
    /// `:port`: every address.
    All,
    /// `localhost:port`: 127.0.0.1.
    Localhost,
    /// An IPv4 address, or an IPv6 address in brackets.
    Ip(std::net::IpAddr),
}

impl ListenAddr {
    /// Parses `:port` (all addresses), `localhost:port` (127.0.0.1), `a.b.c.d:port` or
    /// `[v6]:port` ([`parse_host_port`]), with a port from 1 to 65535. Host names other than
    /// `localhost` are refused: a listener binds addresses, and vipd resolves no names.
    ///
    /// # Errors
    ///
    /// The reason as text (callers name the field and the value).
    pub fn parse(value: &str) -> Result<Self, String> {
        let (host, port) = parse_host_port(value)?;
        let host = match host {
            Host::Empty => ListenHost::All,
            Host::Ip(ip) => ListenHost::Ip(ip),
            Host::Name("localhost") => ListenHost::Localhost,
            Host::Name(name) => {
                return Err(format!(
                    "{name:?} is not an IP address: give an IP address, localhost, or \
                     nothing for all addresses (:port); host names are not resolved"
                ));
            }
        };
        Ok(ListenAddr { host, port })
    }

    /// The addresses to try, in order, until one binds: `:port` tries `[::]:port` (dual
    /// stack) then `0.0.0.0:port` (hosts without IPv6); `localhost` is 127.0.0.1.
    pub fn socket_addrs(&self) -> Vec<std::net::SocketAddr> {
        use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
        match self.host {
            ListenHost::All => vec![
                SocketAddr::from((Ipv6Addr::UNSPECIFIED, self.port)),
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, self.port)),
            ],
            ListenHost::Localhost => vec![SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))],
            ListenHost::Ip(ip) => vec![SocketAddr::new(ip, self.port)],
        }
    }
}

impl ListenAddr {
    /// Where a client on this node reaches the listener: its address, or loopback for
    /// `:port`, `localhost` and an unspecified address.
    pub fn local_target(&self) -> std::net::SocketAddr {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
        let ip = match self.host {
            ListenHost::All | ListenHost::Localhost => IpAddr::V4(Ipv4Addr::LOCALHOST),
            ListenHost::Ip(IpAddr::V4(a)) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            ListenHost::Ip(IpAddr::V6(a)) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ListenHost::Ip(ip) => ip,
        };
        SocketAddr::new(ip, self.port)
    }
}

/// A listener on exactly `addr` (port 0 lets the kernel choose, for tests).
impl From<std::net::SocketAddr> for ListenAddr {
    fn from(addr: std::net::SocketAddr) -> Self {
        ListenAddr {
            host: ListenHost::Ip(addr.ip()),
            port: addr.port(),
        }
    }
}

/// The configuration form: `:2112`, `localhost:2112`, `0.0.0.0:2112`, `[::1]:2112`.
impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host {
            ListenHost::All => write!(f, ":{}", self.port),
            ListenHost::Localhost => write!(f, "localhost:{}", self.port),
            ListenHost::Ip(ip) => write!(f, "{}", std::net::SocketAddr::new(ip, self.port)),
        }
    }
}

/// `value` as a URI, with `default_scheme://` put in front when it names no scheme: `host`,
/// `host:port` and `[v6]:port` are accepted as kubectl's `--server` and curl accept them.
///
/// # Errors
///
/// The reason as text (callers name the field and the value): the URI parser's message, or
/// `missing host` when the URI's host is empty.
pub(crate) fn uri_with_default_scheme(
    value: &str,
    default_scheme: &str,
) -> Result<http::Uri, String> {
    let text = if value.contains("://") {
        value.to_owned()
    } else {
        format!("{default_scheme}://{value}")
    };
    let uri: http::Uri = text
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    match uri.host() {
        Some(h) if !h.trim_start_matches('[').trim_end_matches(']').is_empty() => Ok(uri),
        _ => Err("missing host".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_names() {
        for ok in ["a", "kubevip-web", "plndr-cp-lock", "a1", &"a".repeat(63)] {
            assert!(is_dns1123_label(ok), "{ok}");
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
        assert!(is_dns1123_subdomain("node-a.example.com"));
        // Kubernetes limits only the whole subdomain, not each part.
        assert!(is_dns1123_subdomain(&format!("{}.b", "a".repeat(64))));
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "Node",
            &"a".repeat(254),
            &"a.".repeat(127),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn go_parse_bool() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "on", "tRUE", " true", "2"] {
            assert_eq!(parse_go_bool(bad), None, "{bad}");
        }
    }

    #[test]
    fn uri_shorthand_gets_the_default_scheme() {
        let u = uri_with_default_scheme("192.0.2.10:6443", "https").unwrap();
        assert_eq!(u.to_string(), "https://192.0.2.10:6443/");
        let u = uri_with_default_scheme("[2001:db8::1]:8080", "http").unwrap();
        assert_eq!(u.host(), Some("[2001:db8::1]"));
        assert_eq!(u.scheme_str(), Some("http"));
        let u = uri_with_default_scheme("http://a.example:1", "https").unwrap();
        assert_eq!(u.scheme_str(), Some("http"), "an explicit scheme is kept");
        assert!(uri_with_default_scheme("https://", "https").is_err());
        assert!(uri_with_default_scheme("http://[]:80", "https").is_err());
        assert!(uri_with_default_scheme("a b", "https").is_err());
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port(":2112"), Ok(("", 2112)));
        assert_eq!(split_host_port("192.0.2.1:80"), Ok(("192.0.2.1", 80)));
        assert_eq!(split_host_port("[2001:db8::1]:9"), Ok(("2001:db8::1", 9)));
        assert!(split_host_port("2112").is_err());
        assert!(split_host_port(":65536").is_err());
        assert!(split_host_port("host:").is_err());
        assert!(split_host_port(":+80").is_err(), "digits only, no sign");
        let e = split_host_port("[::1:2112").unwrap_err();
        assert!(e.contains("]:port"), "{e}");
        assert!(split_host_port("::1]:80").unwrap_err().contains("brackets"));
        assert!(split_host_port("[::1]80").is_err());
    }

    #[test]
    fn listen_address_forms() {
        let addrs = |v: &str| ListenAddr::parse(v).map(|l| l.socket_addrs());
        let sa = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert_eq!(
            addrs(":2112"),
            Ok(vec![sa("[::]:2112"), sa("0.0.0.0:2112")])
        );
        assert_eq!(addrs("0.0.0.0:2112"), Ok(vec![sa("0.0.0.0:2112")]));
        assert_eq!(addrs("[::1]:2112"), Ok(vec![sa("[::1]:2112")]));
        assert_eq!(addrs("localhost:2112"), Ok(vec![sa("127.0.0.1:2112")]));
        for v in [":2112", "0.0.0.0:2112", "[::1]:2112", "localhost:2112"] {
            assert_eq!(ListenAddr::parse(v).unwrap().to_string(), v);
        }
        let refused = [
            ("myhost:2112", "host names are not resolved"),
            ("[::1:2112", "]:port"),
            ("::1:2112", "in brackets"),
            ("[192.0.2.1]:2112", "not an IPv6 address"),
            (":0", "port 0"),
            ("2112", "host:port"),
            ("", "host:port"),
        ];
        for (v, says) in refused {
            let e = ListenAddr::parse(v).unwrap_err();
            assert!(e.contains(says), "{v}: {e}");
        }
    }
}
