//! DHCP mode (issue 13): a Service's DHCP settings from kube-vip's annotations, checked.
//! Pure.
//!
//! Annotation names are kube-vip's (`pkg/kubevip` constants and its Service docs):
//! `kube-vip.io/hwaddr`, `kube-vip.io/requestedIP`, `kube-vip.io/loadbalancerHostname`,
//! `kube-vip.io/serviceInterface`, `kube-vip.io/macvlanName`, `kube-vip.io/rp_filter`;
//! `kube-vip.io/dhcp-broadcast` is the name issue 13 gives the broadcast flag.
//!
//! A malformed value is never guessed around: the Service gets no DHCP client until it is
//! fixed (a Warning Event names the annotation and the value), and other Services are not
//! affected.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{ANN_HWADDR, ANN_REQUESTED_IP, ServiceInfo};
use crate::dhcp::{DhcpFamily, DhcpSpec};

/// `kube-vip.io/macvlanName`: name of the Service's DHCP macvlan (kube-vip docs, "DHCP");
/// default `vip-<first 8 characters of the Service UID>`.
pub(crate) const ANN_MACVLAN_NAME: &str = "kube-vip.io/macvlanName";
/// `kube-vip.io/dhcp-broadcast`: Go boolean; `true` sets the BROADCAST flag of the DHCP
/// requests (RFC 2131 §4.1). Default `false`.
pub(crate) const ANN_DHCP_BROADCAST: &str = "kube-vip.io/dhcp-broadcast";
/// `kube-vip.io/rp_filter`: the macvlan's `rp_filter` (kube-vip `RPFilter`): `0`, `1` or
/// `2`. Default `0`.
pub(crate) const ANN_RP_FILTER: &str = "kube-vip.io/rp_filter";
/// Prefix of the default macvlan name.
pub(crate) const MACVLAN_PREFIX: &str = "vip-";
/// Prefix of the ifalias that marks a macvlan as vipd's (followed by the Service UID).
pub(crate) const MACVLAN_MARK_PREFIX: &str = "vipd:";

/// What a DHCP Service's client asks for, from its annotations ([`dhcp_request`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpRequest {
    /// The macvlan's name: [`ANN_MACVLAN_NAME`], else `vip-<uid[..8]>`.
    pub macvlan: String,
    /// The macvlan's MAC: [`ANN_HWADDR`], else [`generated_mac`].
    pub mac: [u8; 6],
    /// `mac` was generated (the holder writes it to [`ANN_HWADDR`]).
    pub mac_generated: bool,
    /// `0.0.0.0` was given: a DHCPv4 client runs.
    pub v4: bool,
    /// `::` was given: a DHCPv6 (IA_NA) client runs, on the same macvlan.
    pub v6: bool,
    /// The IPv4 address of [`ANN_REQUESTED_IP`], asked for again (option 50).
    pub requested: Option<Ipv4Addr>,
    /// The IPv6 address of [`ANN_REQUESTED_IP`], hinted in the DHCPv6 Solicit.
    pub requested_v6: Option<Ipv6Addr>,
    /// [`super::ANN_LOADBALANCER_HOSTNAME`].
    pub hostname: Option<String>,
    /// [`ANN_DHCP_BROADCAST`].
    pub broadcast: bool,
    /// [`ANN_RP_FILTER`].
    pub rp_filter: u8,
    /// Parent interface from [`super::ANN_SERVICE_INTERFACE`]; `None`: the configured
    /// Services interface, else the automatic one.
    pub parent: Option<String>,
    /// The macvlan's ifalias: [`MACVLAN_MARK_PREFIX`] + the Service UID.
    pub mark: String,
}

impl DhcpRequest {
    /// Whether the MAC is the one derived from this Service's own UID ([`generated_mac`]
    /// of the UID in [`DhcpRequest::mark`]): true for a Service that got its MAC from
    /// vipd, false for one whose `kube-vip.io/hwaddr` was copied from another Service (or
    /// set by hand).
    pub fn mac_is_derived(&self) -> bool {
        self.mark
            .strip_prefix(MACVLAN_MARK_PREFIX)
            .is_some_and(|uid| generated_mac(uid) == self.mac)
    }

    /// Whether `other` runs the same clients: equal in everything but the requested
    /// addresses, where the MAC came from (both change when the holder writes its
    /// annotations back, which must not restart the client) and the families (a family
    /// added or dropped starts or releases that family's client only).
    pub fn same_client(&self, other: &DhcpRequest) -> bool {
        self.macvlan == other.macvlan
            && self.mac == other.mac
            && self.hostname == other.hostname
            && self.broadcast == other.broadcast
            && self.rp_filter == other.rp_filter
            && self.parent == other.parent
            && self.mark == other.mark
    }

    /// Whether `other` asks the same of the `family` client: [`Self::same_client`] and the
    /// same requested address of that family (the one `kube-vip.io/requestedIP` gives it).
    /// A client that gave up starts again when this changes.
    pub fn same_ask(&self, other: &DhcpRequest, family: DhcpFamily) -> bool {
        self.same_client(other)
            && match family {
                DhcpFamily::V4 => self.requested == other.requested,
                DhcpFamily::V6 => self.requested_v6 == other.requested_v6,
            }
    }

    /// The families asked for: DHCPv4 first.
    pub fn families(&self) -> Vec<DhcpFamily> {
        let mut out = Vec::new();
        if self.v4 {
            out.push(DhcpFamily::V4);
        }
        if self.v6 {
            out.push(DhcpFamily::V6);
        }
        out
    }

    /// The addresses this Service leases as far as `kube-vip.io/requestedIP` says: its IPv4
    /// entry when it asks DHCPv4, its IPv6 entry when it asks DHCPv6.
    pub fn requested_addresses(&self) -> Vec<IpAddr> {
        let v4 = self.requested.filter(|_| self.v4).map(IpAddr::V4);
        let v6 = self.requested_v6.filter(|_| self.v6).map(IpAddr::V6);
        v4.into_iter().chain(v6).collect()
    }

    /// The `family` client's spec on `parent` (this request's own parent when it has one).
    pub fn spec(&self, parent: &str, family: DhcpFamily) -> DhcpSpec {
        DhcpSpec {
            family,
            parent: self.parent.clone().unwrap_or_else(|| parent.to_string()),
            macvlan: self.macvlan.clone(),
            mac: self.mac,
            requested: self.requested,
            requested_v6: self.requested_v6,
            hostname: self.hostname.clone(),
            broadcast: self.broadcast,
            rp_filter: self.rp_filter,
            mark: self.mark.clone(),
            mac_derived: self.mac_is_derived(),
        }
    }
}

/// A DHCP annotation with a value vipd refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadAnnotation {
    /// The annotation's name.
    pub annotation: &'static str,
    /// Its value as written.
    pub value: String,
    /// Why it is refused.
    pub why: String,
}

impl fmt::Display for BadAnnotation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "annotation {}={:?}: {}",
            self.annotation, self.value, self.why
        )
    }
}

/// Parses a MAC address `aa:bb:cc:dd:ee:ff` (colon-separated hex; kube-vip writes this
/// form). It must be unicast and not all zeros (a macvlan's own address).
///
/// # Errors
/// The reason as text.
pub fn parse_unicast_mac(text: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = text.split(':').collect();
    if parts.len() != 6 || parts.iter().any(|p| p.len() != 2) {
        return Err("not a MAC address (six two-digit hex bytes separated by ':')".into());
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(&parts) {
        *b = u8::from_str_radix(p, 16)
            .map_err(|_| "not a MAC address (six two-digit hex bytes separated by ':')")?;
    }
    if mac[0] & 1 == 1 {
        return Err("a multicast MAC cannot be an interface's address".into());
    }
    if mac == [0; 6] {
        return Err("the all-zero MAC cannot be an interface's address".into());
    }
    Ok(mac)
}

/// The MAC for a Service without [`ANN_HWADDR`]: derived from `seed` (the Service UID), so
/// every node generates the same one; locally administered (bit 1 of the first byte set,
/// IEEE 802 "U/L") and unicast (bit 0 clear). FNV-1a, 64 bit, of `seed`; the first six
/// bytes.
pub fn generated_mac(seed: &str) -> [u8; 6] {
    let h = fnv1a64(seed.as_bytes()).to_be_bytes();
    [(h[0] & 0xfc) | 0x02, h[1], h[2], h[3], h[4], h[5]]
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The IPv4 and IPv6 addresses of a [`ANN_REQUESTED_IP`] value: `v4`, `v6`, `v4,v6` or
/// `v6,v4` (kube-vip writes the leased addresses, comma-separated).
///
/// # Errors
/// The reason as text: an entry that is not an address, two of one family, or an address
/// that cannot be a VIP and so cannot be leased for one (the VIP rule,
/// [`crate::net::vip::check_vip`]: unspecified, loopback, multicast, link-local,
/// broadcast, `0.0.0.0/8`, IPv4 in IPv6).
pub fn parse_requested_ip(text: &str) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), String> {
    let (mut v4, mut v6) = (None, None);
    for entry in text.split(',') {
        let ip: IpAddr = entry
            .parse()
            .map_err(|_| format!("{entry:?} is not an IPv4 or IPv6 address"))?;
        if let Err(why) = crate::net::vip::check_vip(ip) {
            return Err(format!("{ip} cannot be leased ({why})"));
        }
        match ip {
            IpAddr::V4(a) if v4.replace(a).is_some() => {
                return Err("more than one IPv4 address".into());
            }
            IpAddr::V6(a) if v6.replace(a).is_some() => {
                return Err("more than one IPv6 address".into());
            }
            _ => {}
        }
    }
    Ok((v4, v6))
}

/// A DHCP Service's request from its annotations (see [`DhcpRequest`]'s fields), or every
/// annotation whose value is refused.
///
/// # Errors
/// One [`BadAnnotation`] per malformed value: [`ANN_HWADDR`] (not a unicast MAC),
/// [`ANN_REQUESTED_IP`] (not `v4[,v6]`), [`ANN_MACVLAN_NAME`] (not a Linux interface name,
/// e.g. longer than 15 bytes), [`ANN_DHCP_BROADCAST`] (not a Go boolean),
/// [`ANN_RP_FILTER`] (not 0, 1 or 2), [`super::ANN_SERVICE_INTERFACE`] (not an interface
/// name), [`super::ANN_LOADBALANCER_HOSTNAME`] ([`crate::dhcp::check_hostname`]).
pub(crate) fn dhcp_request(info: &ServiceInfo) -> Result<DhcpRequest, Vec<BadAnnotation>> {
    let mut bad = Vec::new();
    let mut refuse = |annotation: &'static str, value: &str, why: String| {
        bad.push(BadAnnotation {
            annotation,
            value: value.to_string(),
            why,
        })
    };
    let seed = info.uid.clone().unwrap_or_else(|| info.key.to_string());
    let (mac, mac_generated) = match info.hwaddr.as_deref() {
        Some(text) => match parse_unicast_mac(text) {
            Ok(mac) => (mac, false),
            Err(why) => {
                refuse(ANN_HWADDR, text, why);
                ([0; 6], false)
            }
        },
        None => (generated_mac(&seed), true),
    };
    let (requested, requested_v6) = match info.requested_ip.as_deref() {
        Some(text) => parse_requested_ip(text).unwrap_or_else(|why| {
            refuse(ANN_REQUESTED_IP, text, why);
            (None, None)
        }),
        None => (None, None),
    };
    let macvlan = match info.macvlan_name.as_deref() {
        Some(name) => {
            if !crate::net::is_ifname(name) {
                refuse(ANN_MACVLAN_NAME, name, ifname_rule());
            }
            name.to_string()
        }
        None => default_macvlan_name(&seed),
    };
    let broadcast = match info.dhcp_broadcast.as_deref() {
        Some(text) => crate::syntax::parse_go_bool(text).unwrap_or_else(|| {
            refuse(
                ANN_DHCP_BROADCAST,
                text,
                format!("not a boolean (one of {})", crate::syntax::GO_BOOL_VALUES),
            );
            false
        }),
        None => false,
    };
    let rp_filter = match info.rp_filter.as_deref() {
        Some(text @ ("0" | "1" | "2")) => text.parse().unwrap_or(0),
        Some(text) => {
            refuse(
                ANN_RP_FILTER,
                text,
                "must be 0 (off), 1 (strict) or 2 (loose)".to_string(),
            );
            0
        }
        None => 0,
    };
    if let Some(name) = info.interface.as_deref()
        && !crate::net::is_ifname(name)
    {
        refuse(super::ANN_SERVICE_INTERFACE, name, ifname_rule());
    }
    if let Some(host) = info.dhcp_hostname.as_deref()
        && let Err(why) = crate::dhcp::check_hostname(host)
    {
        refuse(super::ANN_LOADBALANCER_HOSTNAME, host, why);
    }
    if !bad.is_empty() {
        return Err(bad);
    }
    Ok(DhcpRequest {
        macvlan,
        mac,
        mac_generated,
        v4: info.addresses.dhcp_v4,
        v6: info.addresses.dhcp_v6,
        requested,
        requested_v6,
        hostname: info.dhcp_hostname.clone(),
        broadcast,
        rp_filter,
        parent: info.interface.clone(),
        mark: format!("{MACVLAN_MARK_PREFIX}{seed}"),
    })
}

/// Why a name is refused as an interface name.
fn ifname_rule() -> String {
    format!("not a Linux interface name ({})", crate::net::IFNAME_RULE)
}

/// `vip-` + the first 8 characters of `uid` (a UUID's first group: hex digits, always a
/// valid 12-byte interface name).
fn default_macvlan_name(uid: &str) -> String {
    let head: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!("{MACVLAN_PREFIX}{head}")
}
