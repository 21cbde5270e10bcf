//! The `kubevip` ConfigMap's data (`kube-system`, KVCP `pkg/provider/provider.go`) as pools:
//! which pool applies to a namespace, which addresses it holds and in which order they are
//! handed out (tests in `pool/tests.rs`).
//!
//! Addresses are kept as integers per family (IPv4 in the low 32 bits of a `u128`), as
//! sorted, merged, inclusive ranges; std arithmetic is all this needs.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::syntax::{is_dns1123_label, parse_go_bool};

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `addr` (an IPv4-mapped IPv6 address is IPv6 here; callers that read
    /// Service fields canonicalize first, [`crate::ipam::inuse::lenient_ips`]).
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The other family.
    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    /// A Service's `spec.ipFamilies[]` entry (`IPv4`, `IPv6`); `None` for anything else.
    pub fn from_k8s(s: &str) -> Option<Family> {
        match s {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }

    /// Address width in bits: 32 or 128.
    fn bits(self) -> u32 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// Whom a pool key serves: every namespace (`-global`) or one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// `<kind>-global`.
    Global,
    /// `<kind>-<namespace>` (the text after the first `-`, as written; checked by
    /// [`PoolBook::from_data`]).
    Namespace(String),
}

/// A pool key's kind, from its name: it ranks the key (`cidr-*` before `range-*`). The
/// value's syntax is decided by its content, as in KVCP (`discoverVIPs`: any `/` means
/// CIDRs), so `cidr-x: 10.0.0.1-10.0.0.9` is a range pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PoolKind {
    /// `cidr-*` (usually comma-separated CIDRs).
    Cidr,
    /// `range-*` (usually comma-separated `start-end` ranges).
    Range,
}

/// A pool key of the ConfigMap. Displays as the key itself: `cidr-global`, `range-shop`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    /// `cidr` or `range`.
    pub kind: PoolKind,
    /// `global` or the namespace.
    pub scope: Scope,
}

impl PoolKey {
    /// The pool key a ConfigMap key names: `cidr-<rest>` or `range-<rest>`, `rest` being
    /// `global` or a namespace (not checked here); `None` for every other key.
    pub fn from_key(key: &str) -> Option<PoolKey> {
        let (kind, rest) = if let Some(rest) = key.strip_prefix("cidr-") {
            (PoolKind::Cidr, rest)
        } else {
            (PoolKind::Range, key.strip_prefix("range-")?)
        };
        let scope = match rest {
            "global" => Scope::Global,
            ns => Scope::Namespace(ns.to_string()),
        };
        Some(PoolKey { kind, scope })
    }
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            PoolKind::Cidr => "cidr",
            PoolKind::Range => "range",
        };
        match &self.scope {
            Scope::Global => write!(f, "{kind}-global"),
            Scope::Namespace(ns) => write!(f, "{kind}-{ns}"),
        }
    }
}

/// A malformed pool key: the key, its whole value, the entry at fault and why. Displays as
/// `key cidr-global: "10.0.0.0/33" is not a CIDR (prefix length 33 > 32)` (the runtime puts
/// the ConfigMap's name in front).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key {key}: \"{entry}\" {reason}")]
pub struct PoolError {
    /// The ConfigMap key (`cidr-global`).
    pub key: String,
    /// Its whole value, as written.
    pub value: String,
    /// The comma-separated entry at fault, trimmed (the namespace part for a bad key
    /// name; empty for an empty value or entry).
    pub entry: String,
    /// Why, as a phrase following the quoted entry (`is not a CIDR (...)`).
    pub reason: String,
}

/// Inclusive ranges of one family as integers, sorted and disjoint.
type Ranges = Vec<(u128, u128)>;

/// One pool: the addresses of one `cidr-*`/`range-*` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// The key.
    pub key: PoolKey,
    /// The value as written in the ConfigMap.
    pub text: String,
    /// The value is `0.0.0.0/32` (once trimmed): DHCP mode, every Service gets `0.0.0.0`
    /// (KVCP `discoverVIPs`). Such a pool holds no address.
    pub dhcp: bool,
    /// IPv4 ranges, after `skip-end-ips-in-cidr`.
    v4: Ranges,
    /// IPv6 ranges.
    v6: Ranges,
}

/// IPv4 addresses ending in `.0` or `.255` are never handed out, whatever the prefix
/// (KVCP `ipam.go` `isNetworkIDOrBroadcastIP`).
fn skipped(family: Family, v: u128) -> bool {
    family == Family::V4 && matches!(v & 0xff, 0 | 255)
}

fn to_int(addr: IpAddr) -> (Family, u128) {
    match addr {
        IpAddr::V4(a) => (Family::V4, u128::from(u32::from(a))),
        IpAddr::V6(a) => (Family::V6, u128::from(a)),
    }
}

fn from_int(family: Family, v: u128) -> IpAddr {
    match family {
        // IPv4 values come from IPv4 addresses: the low 32 bits are the whole value.
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// All ones in the low `bits` bits.
fn all_ones(bits: u32) -> u128 {
    u128::MAX >> (128 - bits)
}

/// How many `x` in `lo..=hi` have `x % 256 == r`.
fn count_mod_256(lo: u128, hi: u128, r: u128) -> u128 {
    let base = lo - lo % 256;
    let first = if lo % 256 <= r {
        base + r
    } else {
        base + 256 + r
    };
    if first > hi {
        0
    } else {
        (hi - first) / 256 + 1
    }
}

/// `ranges` sorted and merged (overlapping or adjacent ranges become one).
fn merge(mut ranges: Ranges) -> Ranges {
    ranges.sort_unstable();
    let mut out: Ranges = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The fewest aligned IPv4 prefixes covering `lo..=hi` (netipx `IPSet.Prefixes`), as
/// inclusive ranges.
fn v4_prefixes(lo: u128, hi: u128) -> Ranges {
    let mut out = Vec::new();
    let mut a = lo;
    loop {
        let mut size: u128 = 1 << a.trailing_zeros().min(32);
        while a + size - 1 > hi {
            size >>= 1;
        }
        let last = a + size - 1;
        out.push((a, last));
        if last == hi {
            return out;
        }
        a = last + 1;
    }
}

/// `skip-end-ips-in-cidr=true` on merged IPv4 CIDR ranges: the first and last address of
/// each prefix of the merged set are dropped, except in a /31 and a /32 (KVCP
/// `addressbuilder.go` `buildHostsFromCidr`).
fn skip_ends(v4: &Ranges) -> Ranges {
    let trimmed = v4
        .iter()
        .flat_map(|&(lo, hi)| v4_prefixes(lo, hi))
        .map(|(lo, hi)| {
            if hi - lo < 2 {
                (lo, hi)
            } else {
                (lo + 1, hi - 1)
            }
        })
        .collect();
    merge(trimmed)
}

impl Pool {
    fn ranges(&self, family: Family) -> &Ranges {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    /// Usable addresses of `family` in allocation order: ascending over the merged
    /// ranges, or descending from the last with `desc` (`search-order=desc`), skipping
    /// IPv4 `x.x.x.0` and `x.x.x.255` (KVCP `ipam.go` `FindFreeAddress`). Lazy: a large
    /// IPv6 pool costs nothing until walked.
    pub fn addresses(&self, family: Family, desc: bool) -> impl Iterator<Item = IpAddr> + '_ {
        let ranges = self.ranges(family);
        let up = (!desc).then(|| ranges.iter().flat_map(|&(lo, hi)| lo..=hi));
        let down = desc.then(|| ranges.iter().rev().flat_map(|&(lo, hi)| (lo..=hi).rev()));
        up.into_iter()
            .flatten()
            .chain(down.into_iter().flatten())
            .filter(move |&v| !skipped(family, v))
            .map(move |v| from_int(family, v))
    }

    /// Whether `addr` is inside the pool's ranges (after `skip-end-ips-in-cidr`), IPv4
    /// `.0`/`.255` included: a requested address the pool holds, usable or not.
    pub fn covers(&self, addr: IpAddr) -> bool {
        let (family, v) = to_int(addr);
        let ranges = self.ranges(family);
        let i = ranges.partition_point(|&(_, hi)| hi < v);
        ranges.get(i).is_some_and(|&(lo, _)| lo <= v)
    }

    /// Whether the pool may hand out `addr`: [`Pool::covers`] it and it is not an IPv4
    /// `.0`/`.255` address.
    pub fn contains(&self, addr: IpAddr) -> bool {
        let (family, v) = to_int(addr);
        self.covers(addr) && !skipped(family, v)
    }

    /// How many addresses of `family` the pool may hand out (saturating at `u128::MAX`;
    /// 0 for a DHCP pool).
    pub fn size(&self, family: Family) -> u128 {
        self.ranges(family).iter().fold(0u128, |sum, &(lo, hi)| {
            let all = (hi - lo).saturating_add(1);
            let usable = match family {
                Family::V4 => all - count_mod_256(lo, hi, 0) - count_mod_256(lo, hi, 255),
                Family::V6 => all,
            };
            sum.saturating_add(usable)
        })
    }

    /// The families the pool's value lists, IPv4 first (a family whose entries hold only
    /// skipped addresses still counts: allocating from it reports exhaustion, as KVCP).
    pub fn families(&self) -> Vec<Family> {
        [Family::V4, Family::V6]
            .into_iter()
            .filter(|f| !self.ranges(*f).is_empty())
            .collect()
    }

    /// Parses one pool key's value (KVCP `addressbuilder.go` `parseCidrs` and
    /// `buildAddressesFromRange`, `loadBalancer.go` `discoverVIPs`), with vipd's trimming.
    ///
    /// # Errors
    /// A [`PoolError`] naming the key, the first entry at fault and why.
    fn parse(key: PoolKey, raw_key: &str, value: &str, skip_end: bool) -> Result<Pool, PoolError> {
        let fail = |entry: &str, reason: String| PoolError {
            key: raw_key.to_string(),
            value: value.to_string(),
            entry: entry.to_string(),
            reason,
        };
        if let Scope::Namespace(ns) = &key.scope {
            check_namespace(ns).map_err(|reason| fail(ns, reason))?;
        }
        let trimmed = value.trim();
        if trimmed.is_empty() {
            return Err(fail(
                "",
                "is empty: write CIDRs or ranges, or remove the key".into(),
            ));
        }
        let mut pool = Pool {
            key,
            text: value.to_string(),
            dhcp: trimmed == "0.0.0.0/32",
            v4: Vec::new(),
            v6: Vec::new(),
        };
        if pool.dhcp {
            return Ok(pool);
        }
        let cidrs = trimmed.contains('/');
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for entry in trimmed.split(',').map(str::trim) {
            let (family, lo, hi) = if cidrs {
                parse_cidr(entry)
            } else {
                parse_range(entry)
            }
            .map_err(|reason| fail(entry, reason))?;
            match family {
                Family::V4 => v4.push((lo, hi)),
                Family::V6 => v6.push((lo, hi)),
            }
        }
        pool.v4 = merge(v4);
        pool.v6 = merge(v6);
        if cidrs && skip_end {
            pool.v4 = skip_ends(&pool.v4);
        }
        Ok(pool)
    }
}

/// Checks a pool key's namespace part.
fn check_namespace(ns: &str) -> Result<(), String> {
    if ns.is_empty() {
        Err("is an empty namespace part: write cidr-<namespace> or cidr-global".into())
    } else if !is_dns1123_label(ns) {
        Err("is not a namespace name (lower-case letters, digits and '-', at most 63)".into())
    } else {
        Ok(())
    }
}

const EMPTY_ENTRY: &str = "is an empty entry (two commas in a row, or a comma at an end)";

fn parse_addr(s: &str) -> Result<IpAddr, String> {
    s.parse::<IpAddr>()
        .map_err(|_| format!("\"{s}\" is not an IP address"))
}

/// One CIDR entry (host bits allowed: `192.0.2.10/24` is `192.0.2.0/24`, netipx
/// `RangeOfPrefix`) as `(family, first, last)`.
fn parse_cidr(entry: &str) -> Result<(Family, u128, u128), String> {
    if entry.is_empty() {
        return Err(EMPTY_ENTRY.into());
    }
    if entry == "0.0.0.0/32" {
        return Err("asks for DHCP: it must then be the whole value".into());
    }
    let Some((addr, len)) = entry.split_once('/') else {
        return Err(if entry.contains('-') {
            "is a range in a list of CIDRs (a key holds CIDRs or ranges, not both)".into()
        } else {
            "is not a CIDR (no prefix length; one address is a /32 or a /128)".into()
        });
    };
    let (family, v) = to_int(parse_addr(addr).map_err(|e| format!("is not a CIDR ({e})"))?);
    let bits = family.bits();
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "is not a CIDR (prefix length \"{len}\" is not a number)"
        ));
    }
    let len: u32 = len
        .parse()
        .map_err(|_| format!("is not a CIDR (prefix length \"{len}\" is not a number)"))?;
    if len > bits {
        return Err(format!("is not a CIDR (prefix length {len} > {bits})"));
    }
    let host = if len == bits {
        0
    } else {
        all_ones(bits) >> len
    };
    let lo = v & !host;
    Ok((family, lo, lo | host))
}

/// One range entry `start-end` (inclusive; ends trimmed; both of one family, start not
/// after end) as `(family, first, last)`.
fn parse_range(entry: &str) -> Result<(Family, u128, u128), String> {
    if entry.is_empty() {
        return Err(EMPTY_ENTRY.into());
    }
    let parts: Vec<&str> = entry.split('-').map(str::trim).collect();
    let [start, end] = parts[..] else {
        return Err("is not a range (write start-end, e.g. 192.0.2.10-192.0.2.20)".into());
    };
    let start = parse_addr(start).map_err(|e| format!("is not a range ({e})"))?;
    let end = parse_addr(end).map_err(|e| format!("is not a range ({e})"))?;
    let ((fs, lo), (fe, hi)) = (to_int(start), to_int(end));
    if fs != fe {
        return Err(format!("is not a range (starts {fs} and ends {fe})"));
    }
    if lo > hi {
        return Err("is not a range (its start is after its end)".into());
    }
    Ok((fs, lo, hi))
}

/// Every pool and setting of the `kubevip` ConfigMap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolBook {
    /// Every `cidr-*`/`range-*` key, parsed.
    pools: BTreeMap<String, Result<Pool, PoolError>>,
    /// The `allow-share-*` and `interface-*` keys, as written.
    settings: BTreeMap<String, String>,
    /// `search-order=desc`.
    search_desc: bool,
    /// `skip-end-ips-in-cidr=true`.
    skip_end: bool,
}

impl PoolBook {
    /// Reads the ConfigMap's data. Never fails: a malformed pool key is kept as a
    /// [`PoolError`] for that key only, so namespaces whose pool is another key keep
    /// allocating. Unknown keys (and the legacy `kubevip-services`) are ignored, as in
    /// KVCP.
    pub fn from_data(data: &BTreeMap<String, String>) -> PoolBook {
        let search_desc = data.get("search-order").is_some_and(|v| v == "desc");
        let skip_end = data
            .get("skip-end-ips-in-cidr")
            .is_some_and(|v| v == "true");
        let mut book = PoolBook {
            search_desc,
            skip_end,
            ..PoolBook::default()
        };
        for (k, v) in data {
            if let Some(key) = PoolKey::from_key(k) {
                book.pools
                    .insert(k.clone(), Pool::parse(key, k, v, skip_end));
            } else if k.starts_with("allow-share-") || k.starts_with("interface-") {
                book.settings.insert(k.clone(), v.clone());
            }
        }
        book
    }

    /// The pool for Services of `namespace`, in KVCP's precedence `cidr-<ns>` >
    /// `cidr-global` > `range-<ns>` > `range-global` (so `cidr-global` beats `range-<ns>`;
    /// KVCP `loadBalancer.go` `discoverPool`). A namespace key replaces the global pool
    /// entirely, even when exhausted or malformed. `None`: no key applies.
    pub fn pool_for(&self, namespace: &str) -> Option<Result<&Pool, &PoolError>> {
        [
            format!("cidr-{namespace}"),
            "cidr-global".to_string(),
            format!("range-{namespace}"),
            "range-global".to_string(),
        ]
        .iter()
        .find_map(|k| self.pools.get(k))
        .map(Result::as_ref)
    }

    /// The setting `<prefix>-<namespace>`, else `<prefix>-global` (KVCP `getConfig`: a
    /// namespace key present wins whatever its value).
    fn setting(&self, prefix: &str, namespace: &str) -> Option<&str> {
        self.settings
            .get(&format!("{prefix}-{namespace}"))
            .or_else(|| self.settings.get(&format!("{prefix}-global")))
            .map(String::as_str)
    }

    /// Whether Services of `namespace` may share addresses: `allow-share-<ns>`, else
    /// `allow-share-global`, read as Go `strconv.ParseBool`; anything else is false (KVCP
    /// `discoverPool` ignores the parse error, and an unparsable namespace key does not
    /// fall back to the global one).
    pub fn allow_share(&self, namespace: &str) -> bool {
        self.setting("allow-share", namespace)
            .and_then(parse_go_bool)
            .unwrap_or(false)
    }

    /// The `kube-vip.io/serviceInterface` to write for `namespace`: `interface-<ns>`, else
    /// `interface-global`; an empty value writes nothing (KVCP `discoverInterface`, and an
    /// empty namespace key hides the global one there too).
    pub fn interface(&self, namespace: &str) -> Option<&str> {
        self.setting("interface", namespace)
            .filter(|v| !v.is_empty())
    }

    /// `search-order` is exactly `desc`: highest address first (KVCP `config.go`).
    pub fn search_desc(&self) -> bool {
        self.search_desc
    }

    /// `skip-end-ips-in-cidr` is exactly `true` (not `True` or `1`; KVCP `config.go`).
    pub fn skip_end(&self) -> bool {
        self.skip_end
    }

    /// Every pool key, in key order, parsed or not (metrics, `vipd status`).
    pub fn pools(&self) -> impl Iterator<Item = Result<&Pool, &PoolError>> {
        self.pools.values().map(Result::as_ref)
    }

    /// No `cidr-*`/`range-*` key at all: allocation is off for every namespace.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// The malformed pool keys, in key order.
    pub fn problems(&self) -> Vec<&PoolError> {
        self.pools().filter_map(Result::err).collect()
    }
}

#[cfg(test)]
mod tests;
