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
/// The reason as text (callers name the field and the value): no `:`, or a port that is not a
/// number from 0 to 65535.
pub fn split_host_port(value: &str) -> Result<(&str, u16), &'static str> {
    let (host, port) = value
        .rsplit_once(':')
        .ok_or("expected host:port, e.g. :2112")?;
    let port: u16 = match port.parse() {
        Ok(p) if port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err("the port is not a number between 0 and 65535"),
    };
    Ok((host.trim_start_matches('[').trim_end_matches(']'), port))
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
    }
}
