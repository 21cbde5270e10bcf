//! Syntax rules vipd shares with Kubernetes and Go, written once: DNS-1123 names (as the
//! API server validates object names) and Go's `strconv.ParseBool` (what kube-vip's cobra
//! flags and env variables accept).

/// Kubernetes `IsDNS1123Label`: 1 to 63 lower-case letters, digits and `-`, starting and
/// ending with a letter or digit (namespaces, Service names).
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_shaped(s)
}

/// Kubernetes `IsDNS1123Subdomain`: at most 253 characters, dot-separated parts shaped like
/// DNS-1123 labels (Kubernetes does not limit each part to 63 characters here). Object
/// names such as Leases, Nodes and Events.
pub fn is_dns1123_subdomain(s: &str) -> bool {
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
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// What [`parse_go_bool`] accepts, for error messages.
pub const GO_BOOL_VALUES: &str = "1 t T TRUE true True 0 f F FALSE false False";

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
}
