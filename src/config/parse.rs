//! Value parsers; each error names the setting and the value.

use super::*;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Origin {
    Env,
    Flag(&'static str),
    File,
    Default,
    Hostname,
}

/// One raw setting value and its origin.
#[derive(Debug, Clone)]
pub(super) struct Raw {
    pub(super) key: &'static str,
    pub(super) value: String,
    pub(super) origin: Origin,
}

impl Raw {
    pub(super) fn default_of(key: &'static str, value: &str) -> Raw {
        Raw {
            key,
            value: value.to_string(),
            origin: Origin::Default,
        }
    }

    /// How the setting is named in messages, e.g. `flag --leaseDuration (vip_leaseduration)`.
    pub(super) fn setting(&self) -> String {
        match &self.origin {
            Origin::Env => format!("environment variable {}", self.key),
            Origin::Flag(f) => format!("flag --{f} ({})", self.key),
            Origin::File => format!("{} in the config file", self.key),
            Origin::Default => format!("{} (default)", self.key),
            Origin::Hostname => format!("{} (default: the hostname, lower-cased)", self.key),
        }
    }

    pub(super) fn invalid(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: self.key,
            setting: self.setting(),
            value: self.value.clone(),
            reason: reason.into(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Value parsers; each error names the setting and the value.
// ---------------------------------------------------------------------------------------

/// Go `strconv.ParseBool`.
pub(super) fn parse_bool(raw: &Raw) -> Result<bool, ConfigError> {
    crate::syntax::parse_go_bool(&raw.value).ok_or_else(|| {
        raw.invalid(format!(
            "not a boolean (Go strconv.ParseBool: {})",
            crate::syntax::GO_BOOL_VALUES
        ))
    })
}

/// Seconds, whole or with up to 9 decimals, in (0, [`MAX_LEASE_TIMING`]].
pub(super) fn parse_seconds(raw: &Raw) -> Result<Duration, ConfigError> {
    let v = raw.value.as_str();
    if v.starts_with('-') {
        return Err(raw.invalid("must be a positive number of seconds"));
    }
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits(int) || !digits(frac) || (v.contains('.') && frac.is_empty()) {
        return Err(raw.invalid("not a number of seconds (e.g. 5 or 2.5)"));
    }
    if frac.len() > 9 {
        return Err(raw.invalid("more than 9 decimal places"));
    }
    let secs: u64 = int
        .parse()
        .map_err(|_| raw.invalid(format!("must be at most {} s", MAX_LEASE_TIMING.as_secs())))?;
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        let padded = format!("{frac:0<9}");
        padded
            .parse()
            .map_err(|_| raw.invalid("not a number of seconds"))?
    };
    let d = Duration::new(secs, 0).checked_add(Duration::from_nanos(u64::from(nanos)));
    match d {
        Some(d) if d.is_zero() => Err(raw.invalid("must be greater than zero")),
        Some(d) if d <= MAX_LEASE_TIMING => Ok(d),
        _ => Err(raw.invalid(format!("must be at most {} s", MAX_LEASE_TIMING.as_secs()))),
    }
}

/// Whole milliseconds in [[`MIN_ARP_RATE`], [`MAX_ARP_RATE`]].
/// A whole number of milliseconds within `min..=max`.
pub(super) fn parse_millis(
    raw: &Raw,
    min: Duration,
    max: Duration,
) -> Result<Duration, ConfigError> {
    let v = raw.value.as_str();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(raw.invalid("not a whole number of milliseconds"));
    }
    let range = || {
        format!(
            "must be between {} and {} ms",
            min.as_millis(),
            max.as_millis()
        )
    };
    let ms: u64 = v.parse().map_err(|_| raw.invalid(range()))?;
    let d = Duration::from_millis(ms);
    if d < min || d > max {
        return Err(raw.invalid(range()));
    }
    Ok(d)
}

/// TCP port 1..=65535.
pub(super) fn parse_port(raw: &Raw) -> Result<u16, ConfigError> {
    let v = raw.value.as_str();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(raw.invalid("not a port number"));
    }
    match v.parse::<u16>() {
        Ok(0) | Err(_) => Err(raw.invalid("port must be between 1 and 65535")),
        Ok(p) => Ok(p),
    }
}

/// A count: a whole number from 0 to `u32::MAX`, no sign.
pub(super) fn parse_count(raw: &Raw) -> Result<u32, ConfigError> {
    let v = raw.value.as_str();
    if v.starts_with('-') && v.len() > 1 && v[1..].bytes().all(|b| b.is_ascii_digit()) {
        return Err(raw.invalid("must not be negative"));
    }
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(raw.invalid("not a whole number"));
    }
    v.parse::<u32>()
        .map_err(|_| raw.invalid(format!("must be at most {}", u32::MAX)))
}

pub(super) fn parse_log_level(raw: &Raw) -> Result<LogLevel, ConfigError> {
    Ok(match raw.value.to_ascii_lowercase().as_str() {
        "0" | "1" | "2" | "panic" | "fatal" | "error" => LogLevel::Error,
        "3" | "warn" | "warning" => LogLevel::Warn,
        "4" | "info" => LogLevel::Info,
        "5" | "debug" => LogLevel::Debug,
        "6" | "trace" => LogLevel::Trace,
        _ => {
            return Err(raw.invalid(
                "not a log level (logrus 0..=6, or panic/fatal/error/warn/info/debug/trace)",
            ));
        }
    })
}

/// Comma-separated IP addresses usable as VIPs; no duplicates.
pub(super) fn parse_addresses(raw: &Raw) -> Result<Vec<IpAddr>, ConfigError> {
    let mut out: Vec<IpAddr> = Vec::new();
    if raw.value.is_empty() {
        return Ok(out);
    }
    for item in raw.value.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(raw.invalid("empty entry in the comma-separated address list"));
        }
        let ip: IpAddr = item.parse().map_err(|_| {
            let hint = if item.contains('/') {
                "; give the prefix length in vip_subnet"
            } else if item.contains('%') {
                "; zone indexes are not supported"
            } else if item.bytes().any(|b| b.is_ascii_alphabetic()) && !item.contains(':') {
                "; vipd does not resolve DNS names"
            } else {
                ""
            };
            raw.invalid(format!("{item:?} is not an IP address{hint}"))
        })?;
        if let Err(class) = crate::net::vip::check_vip(ip) {
            return Err(raw.invalid(format!("{item} is {class}, not usable as a VIP")));
        }
        if out.contains(&ip) {
            return Err(raw.invalid(format!("{ip} is listed twice")));
        }
        out.push(ip);
    }
    Ok(out)
}

/// `vip_subnet`: one prefix per address (kube-vip's form), or `v4` / `v4,v6`.
pub(super) fn parse_subnet(raw: &Raw, addresses: &[IpAddr]) -> Result<VipSubnet, ConfigError> {
    let mut prefixes = Vec::new();
    for item in raw.value.split(',') {
        let item = item.trim();
        let digits = item.strip_prefix('/').unwrap_or(item);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 3 {
            return Err(raw.invalid(format!("{item:?} is not a prefix length")));
        }
        let p: u8 = digits
            .parse()
            .map_err(|_| raw.invalid(format!("prefix length {digits} is out of range")))?;
        prefixes.push(p);
    }
    let check = |p: u8, v6: bool| -> Result<u8, ConfigError> {
        let max = if v6 { 128 } else { 32 };
        if p == 0 || p > max {
            Err(raw.invalid(format!(
                "prefix length {p} is out of range for IPv{} (1..={max})",
                if v6 { 6 } else { 4 }
            )))
        } else {
            Ok(p)
        }
    };
    let mut subnet = VipSubnet {
        v4: DEFAULT_V4_PREFIX,
        v6: DEFAULT_V6_PREFIX,
    };
    if !addresses.is_empty() && prefixes.len() == addresses.len() {
        let (mut v4, mut v6): (Option<u8>, Option<u8>) = (None, None);
        for (ip, p) in addresses.iter().zip(&prefixes) {
            let slot = if ip.is_ipv6() { &mut v6 } else { &mut v4 };
            let p = check(*p, ip.is_ipv6())?;
            match slot {
                Some(prev) if *prev != p => {
                    return Err(raw.invalid(format!(
                        "addresses of the same family need the same prefix length ({prev} and {p})"
                    )));
                }
                _ => *slot = Some(p),
            }
        }
        subnet.v4 = v4.unwrap_or(DEFAULT_V4_PREFIX);
        subnet.v6 = v6.unwrap_or(DEFAULT_V6_PREFIX);
        return Ok(subnet);
    }
    match prefixes.as_slice() {
        [v4] => subnet.v4 = check(*v4, false)?,
        [v4, v6] => {
            subnet.v4 = check(*v4, false)?;
            subnet.v6 = check(*v6, true)?;
        }
        _ => {
            return Err(raw.invalid(format!(
                "{} prefix lengths for {} address(es): give one per address, or v4 / v4,v6",
                prefixes.len(),
                addresses.len()
            )));
        }
    }
    Ok(subnet)
}

/// Linux interface name ([`crate::net::is_ifname`]). Empty = automatic (`None`).
pub(super) fn parse_interface(raw: Raw) -> Result<Option<String>, ConfigError> {
    let v = raw.value.as_str();
    if v.is_empty() {
        return Ok(None);
    }
    if !crate::net::is_ifname(v) {
        return Err(raw.invalid(format!(
            "not a Linux interface name ({})",
            crate::net::IFNAME_RULE
        )));
    }
    Ok(Some(raw.value))
}

/// Kubernetes `IsDNS1123Subdomain` (object names such as Leases and nodes).
pub(super) fn check_dns1123_subdomain(raw: &Raw) -> Result<(), ConfigError> {
    let v = raw.value.as_str();
    if v.is_empty() {
        return Err(raw.invalid("must not be empty"));
    }
    if !crate::syntax::is_dns1123_subdomain(v) {
        return Err(raw.invalid(
            "not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)",
        ));
    }
    Ok(())
}

/// Kubernetes `IsDNS1123Label` (namespaces).
pub(super) fn check_dns1123_label(raw: &Raw) -> Result<(), ConfigError> {
    if raw.value.is_empty() {
        return Err(raw.invalid("must not be empty"));
    }
    if !crate::syntax::is_dns1123_label(&raw.value) {
        return Err(raw.invalid(
            "not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)",
        ));
    }
    Ok(())
}

/// Kubernetes `IsQualifiedName` (`[prefix/]name`), the syntax of `spec.loadBalancerClass`.
pub(super) fn check_qualified_name(raw: &Raw) -> Result<(), ConfigError> {
    let (prefix, name) = match raw.value.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, raw.value.as_str()),
    };
    let name_ok = {
        let b = name.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
    };
    let prefix_ok = prefix.is_none_or(crate::syntax::is_dns1123_subdomain);
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(raw.invalid(
            "not a qualified name ([DNS-1123 subdomain/]name, name at most 63 characters)",
        ))
    }
}

/// `host:port` or `[v6]:port` (`kubernetes_addr`): [`crate::syntax::parse_host_port`]
/// (an IPv6 host in brackets, any other host an IPv4 address or a DNS name, port 1 to
/// 65535), and a host is required.
pub(super) fn check_host_port(raw: &Raw) -> Result<(), ConfigError> {
    match crate::syntax::parse_host_port(&raw.value).map_err(|r| raw.invalid(r))? {
        (crate::syntax::Host::Empty, _) => Err(raw.invalid("a host is required (host:port)")),
        _ => Ok(()),
    }
}
