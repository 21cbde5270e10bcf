//! The lab's wire: namespaces, the bridge `br0` in `lan` and one veth per member (built at
//! start), the link faults tests inject (cut, partition), extra interfaces, and reading
//! addresses and MACs back with `ip -j`.

use std::net::IpAddr;
use std::path::Path;

use super::error::{LabError, Result, io_ctx};
use super::process::ip;
use super::{
    API_IP, CLIENT_V4, CLIENT_V6, DHCP_SERVER_V4, DHCP_SERVER_V6, ETH, GATEWAY_V4, GATEWAY_V6, Lab,
    LabOptions, MacAddr, NAMESPACES, NODES, PODS, PREFIX_V4, PREFIX_V6, netns, node_ipv4,
    node_ipv6,
};

/// Fixed MAC of a member's eth0 (02:00:c0:00:02:<last IPv4 octet>), for readable logs.
fn member_mac(ns: &str) -> Option<String> {
    let last = match ns {
        "api" => API_IP.octets()[3],
        "client" => CLIENT_V4.octets()[3],
        "dhcp" => DHCP_SERVER_V4.octets()[3],
        n => node_ipv4(n)?.octets()[3],
    };
    Some(format!("02:00:c0:00:02:{last:02x}"))
}

/// One address of an interface, from `ip -j addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabAddress {
    /// The address.
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// Scope (`global`, `link`, `host`).
    pub scope: String,
    /// Label (IPv4 only), e.g. `eth0` or `eth0:vip`.
    pub label: Option<String>,
    /// Boolean flags set on the address, e.g. `secondary`, `dynamic`, `tentative`,
    /// `dadfailed`, `deprecated`, `noprefixroute`.
    pub flags: Vec<String>,
    /// Address protocol (IFA_PROTO) if the kernel reports one (e.g. `"0x63"` or a name).
    pub protocol: Option<String>,
    /// Remaining valid lifetime in seconds; `None` means forever.
    pub valid_lft: Option<u64>,
    /// Remaining preferred lifetime in seconds; `None` means forever.
    pub preferred_lft: Option<u64>,
}

impl LabAddress {
    /// Whether `flag` (e.g. `"secondary"`) is set.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// vipd's route protocol for the local routes of IPv6 VIPs on `lo` (`svc_ipv6_loopback`;
/// vipd's `net::route::LOOPBACK_PROTOCOL`).
pub const LOOPBACK_ROUTE_PROTOCOL: u8 = 118;

/// Parses the JSON of `ip -6 -j route show table local proto 118 type local` into the
/// destinations still routed: a route whose `expires` is negative has expired (the kernel
/// ignores it until its collector removes it) and is left out. `ip` rounds toward zero, so
/// a route expired less than a second ago reads 0 and is kept: counting it errs on the side
/// of "still answered".
///
/// # Errors
/// [`LabError::Parse`] when the JSON has an unexpected shape.
pub fn parse_loopback_routes_json(json: &str) -> Result<Vec<IpAddr>> {
    let perr = |detail: String| LabError::Parse {
        what: "ip -j route output".into(),
        detail,
    };
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| perr(e.to_string()))?;
    let routes = v.as_array().ok_or_else(|| perr("not an array".into()))?;
    let mut out = Vec::new();
    for r in routes {
        let Some(dst) = r.get("dst").and_then(|d| d.as_str()) else {
            continue;
        };
        if r.get("expires")
            .and_then(|e| e.as_i64())
            .is_some_and(|e| e < 0)
        {
            continue;
        }
        let dst = dst.strip_suffix("/128").unwrap_or(dst);
        out.push(
            dst.parse()
                .map_err(|_| perr(format!("bad destination {dst}")))?,
        );
    }
    Ok(out)
}

/// Parses the JSON of `ip -j addr show dev IF` into addresses.
///
/// # Errors
/// [`LabError::Parse`] when the JSON has an unexpected shape.
pub fn parse_ip_addr_json(json: &str) -> Result<Vec<LabAddress>> {
    let perr = |detail: String| LabError::Parse {
        what: "ip -j addr output".into(),
        detail,
    };
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| perr(e.to_string()))?;
    let mut out = Vec::new();
    let links = v.as_array().ok_or_else(|| perr("not an array".into()))?;
    for link in links {
        let Some(infos) = link.get("addr_info").and_then(|a| a.as_array()) else {
            continue;
        };
        for info in infos {
            let Some(obj) = info.as_object() else {
                continue;
            };
            // Entries without `local` carry only lifetimes of the previous one.
            let Some(local) = obj.get("local").and_then(|l| l.as_str()) else {
                continue;
            };
            let addr: IpAddr = local
                .parse()
                .map_err(|_| perr(format!("bad address {local}")))?;
            let prefix = obj
                .get("prefixlen")
                .and_then(|p| p.as_u64())
                .and_then(|p| u8::try_from(p).ok())
                .ok_or_else(|| perr(format!("no prefixlen for {local}")))?;
            let lft = |k: &str| {
                obj.get(k)
                    .and_then(|x| x.as_u64())
                    .filter(|x| *x != u64::from(u32::MAX))
            };
            let flags = obj
                .iter()
                .filter(|(_, v)| v.as_bool() == Some(true))
                .map(|(k, _)| k.clone())
                .collect();
            out.push(LabAddress {
                addr,
                prefix,
                scope: obj
                    .get("scope")
                    .and_then(|s| s.as_str())
                    .unwrap_or_default()
                    .to_string(),
                label: obj
                    .get("label")
                    .and_then(|s| s.as_str())
                    .map(str::to_string),
                flags,
                protocol: obj.get("protocol").map(|p| match p.as_str() {
                    Some(s) => s.to_string(),
                    None => p.to_string(),
                }),
                valid_lft: lft("valid_life_time"),
                preferred_lft: lft("preferred_life_time"),
            });
        }
    }
    Ok(out)
}

impl Lab {
    pub(super) fn build_network(&mut self, opts: &LabOptions) -> Result<()> {
        self.create_namespaces()?;
        let lan = self.build_bridge()?;
        for ns in NAMESPACES.iter().filter(|n| **n != "lan") {
            self.connect_member(&lan, ns, opts)?;
        }
        if opts.pods {
            self.connect_pods()?;
        }
        Ok(())
    }

    /// Creates the namespaces and sets their namespace-wide sysctls.
    fn create_namespaces(&mut self) -> Result<()> {
        let all = self.namespaces();
        for ns in &all {
            let full = format!("{}{ns}", self.prefix);
            ip(&["netns", "add", &full])?;
            self.created.push(ns.to_string());
        }
        // Namespace-wide sysctls, before the interfaces exist so `default` applies to them.
        for ns in all {
            let mut settings: Vec<(&str, &str)> = vec![
                ("net/ipv6/conf/default/router_solicitations", "0"),
                ("net/ipv6/conf/all/router_solicitations", "0"),
            ];
            match ns {
                // The switch and the API server stay IPv4-only: no MLD/NDP noise on the
                // wire.
                "lan" | "api" => {
                    settings.push(("net/ipv6/conf/all/disable_ipv6", "1"));
                    settings.push(("net/ipv6/conf/default/disable_ipv6", "1"));
                }
                // The client's and the DHCP server's own addresses are usable at once (no
                // DAD; dnsmasq's DHCPv6 answers from its link-local address).
                // Pods too: their addresses are theirs alone.
                n if n == "client" || n == "dhcp" || PODS.contains(&n) => {
                    settings.push(("net/ipv6/conf/default/accept_dad", "0"))
                }
                // Nodes keep DAD (IPv6 VIP tests need it); their own address skips it.
                _ => {}
            }
            let path = self.netns_path(ns)?;
            netns::run_in_netns(&path, || -> Result<()> {
                for (k, v) in &settings {
                    let p = Path::new("/proc/sys").join(k);
                    std::fs::write(&p, v)
                        .map_err(io_ctx(format!("write {} in {ns}", p.display())))?;
                }
                Ok(())
            })??;
        }
        Ok(())
    }

    /// Creates bridge `br0` in `lan` (no STP, no snooping, no forward delay); returns the
    /// full name of `lan`.
    fn build_bridge(&self) -> Result<String> {
        let lan = self.ns_name("lan")?;
        ip(&["-n", &lan, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            &lan,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
            "mcast_snooping",
            "0",
            "forward_delay",
            "0",
        ])?;
        ip(&["-n", &lan, "link", "set", "br0", "up"])?;
        Ok(lan)
    }

    /// Connects member `ns` to the bridge: a veth from `lan` with the peer `eth0` moved
    /// into `ns`, its addresses, and the default routes if `opts.default_route`.
    fn connect_member(&self, lan: &str, ns: &str, opts: &LabOptions) -> Result<()> {
        let full = self.ns_name(ns)?;
        let port = format!("v-{ns}");
        let mut args = vec![
            "-n", lan, "link", "add", &port, "type", "veth", "peer", "name", ETH,
        ];
        let mac = member_mac(ns);
        if let Some(mac) = mac.as_deref() {
            args.extend(["address", mac]);
        }
        args.extend(["netns", &full]);
        ip(&args)?;
        ip(&["-n", lan, "link", "set", &port, "master", "br0", "up"])?;
        ip(&["-n", &full, "link", "set", "lo", "up"])?;
        ip(&["-n", &full, "link", "set", ETH, "up"])?;
        let (v4, v6) = match ns {
            "api" => (API_IP, None),
            "client" => (CLIENT_V4, Some(CLIENT_V6)),
            "dhcp" => (DHCP_SERVER_V4, Some(DHCP_SERVER_V6)),
            node => (node_ipv4(node).unwrap_or(API_IP), node_ipv6(node)),
        };
        ip(&[
            "-n",
            &full,
            "addr",
            "add",
            &format!("{v4}/{PREFIX_V4}"),
            "dev",
            ETH,
        ])?;
        if let Some(v6) = v6 {
            ip(&[
                "-n",
                &full,
                "addr",
                "add",
                &format!("{v6}/{PREFIX_V6}"),
                "dev",
                ETH,
                "nodad",
            ])?;
        }
        if opts.default_route && NODES.contains(&ns) {
            ip(&[
                "-n",
                &full,
                "route",
                "add",
                "default",
                "via",
                &GATEWAY_V4.to_string(),
                "dev",
                ETH,
            ])?;
            ip(&[
                "-n",
                &full,
                "-6",
                "route",
                "add",
                "default",
                "via",
                &GATEWAY_V6.to_string(),
                "dev",
                ETH,
            ])?;
        }
        Ok(())
    }

    // ----- links -------------------------------------------------------------------------

    fn port(&self, node: &str) -> Result<(String, String)> {
        if node == "lan" || !NAMESPACES.contains(&node) {
            return Err(LabError::UnknownNamespace {
                name: node.to_string(),
                expected: NAMESPACES[1..].join(", "),
            });
        }
        Ok((self.ns_name("lan")?, format!("v-{node}")))
    }

    /// Sets the switch-side end of `node`'s link down: `node`'s eth0 loses carrier
    /// (NO-CARRIER / LOWERLAYERDOWN), as when a cable is pulled.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Command`].
    pub fn cut_link(&self, node: &str) -> Result<()> {
        let (lan, port) = self.port(node)?;
        ip(&["-n", &lan, "link", "set", &port, "down"]).map(drop)
    }

    /// Undoes [`Lab::cut_link`].
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Command`].
    pub fn restore_link(&self, node: &str) -> Result<()> {
        let (lan, port) = self.port(node)?;
        ip(&["-n", &lan, "link", "set", &port, "up"]).map(drop)
    }

    /// Cuts `node` off from everything (other nodes, client and the API server) while its
    /// eth0 keeps carrier: the switch port is detached from the bridge, so frames go nowhere.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Command`].
    pub fn partition(&self, node: &str) -> Result<()> {
        let (lan, port) = self.port(node)?;
        ip(&["-n", &lan, "link", "set", &port, "nomaster"]).map(drop)
    }

    /// Undoes [`Lab::partition`].
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Command`].
    pub fn heal(&self, node: &str) -> Result<()> {
        let (lan, port) = self.port(node)?;
        ip(&["-n", &lan, "link", "set", &port, "master", "br0"]).map(drop)
    }

    /// Gives `node` a second interface `ifname` on the lab segment (S36): a veth whose
    /// switch end `v-<node>-<ifname>` joins the bridge, with `cidr` (e.g. `192.0.2.111/24`)
    /// on it, up. Created from `lan` with the peer moved straight into `node`, like eth0;
    /// it goes with the namespaces. Returns its MAC.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`], [`LabError::Command`] (e.g. the name is taken or
    /// longer than 15 bytes) or [`LabError::Parse`].
    pub fn add_interface(&self, node: &str, ifname: &str, cidr: &str) -> Result<MacAddr> {
        let (lan, port) = self.port(node)?;
        let port = format!("{port}-{ifname}");
        let full = self.ns_name(node)?;
        ip(&[
            "-n", &lan, "link", "add", &port, "type", "veth", "peer", "name", ifname, "netns",
            &full,
        ])?;
        ip(&["-n", &lan, "link", "set", &port, "master", "br0", "up"])?;
        ip(&["-n", &full, "addr", "add", cidr, "dev", ifname])?;
        ip(&["-n", &full, "link", "set", ifname, "up"])?;
        self.mac_of_if(node, ifname)
    }

    /// Addresses on `ifname` in namespace `ns`, from `ip -j addr show dev IFNAME`.
    ///
    /// # Errors
    /// [`LabError::Command`] (e.g. no such device) or [`LabError::Parse`].
    pub fn addresses(&self, ns: &str, ifname: &str) -> Result<Vec<LabAddress>> {
        let full = self.ns_name(ns)?;
        let out = ip(&["-n", &full, "-j", "addr", "show", "dev", ifname])?;
        parse_ip_addr_json(&String::from_utf8_lossy(&out.stdout))
    }

    /// The IPv6 VIPs `ns` routes to itself with vipd's local routes on `lo`
    /// (`svc_ipv6_loopback`), as [`parse_loopback_routes_json`] reads them.
    ///
    /// # Errors
    /// [`LabError::Command`] or [`LabError::Parse`].
    pub fn loopback_routes(&self, ns: &str) -> Result<Vec<IpAddr>> {
        let full = self.ns_name(ns)?;
        let proto = LOOPBACK_ROUTE_PROTOCOL.to_string();
        let out = ip(&[
            "-n", &full, "-6", "-j", "route", "show", "table", "local", "proto", &proto, "type",
            "local",
        ])?;
        parse_loopback_routes_json(&String::from_utf8_lossy(&out.stdout))
    }

    /// MAC address of eth0 in `ns`.
    ///
    /// # Errors
    /// [`LabError::Command`] or [`LabError::Parse`].
    pub fn mac_of(&self, ns: &str) -> Result<MacAddr> {
        self.mac_of_if(ns, ETH)
    }

    /// MAC address of interface `ifname` in `ns`.
    ///
    /// # Errors
    /// [`LabError::Command`] or [`LabError::Parse`].
    pub fn mac_of_if(&self, ns: &str, ifname: &str) -> Result<MacAddr> {
        let full = self.ns_name(ns)?;
        let out = ip(&["-n", &full, "-j", "link", "show", "dev", ifname])?;
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| LabError::Parse {
                what: "ip -j link output".into(),
                detail: e.to_string(),
            })?;
        let s = v
            .get(0)
            .and_then(|l| l.get("address"))
            .and_then(|a| a.as_str())
            .unwrap_or_default();
        s.parse().map_err(|_| LabError::Parse {
            what: format!("MAC of {ns}"),
            detail: s.to_string(),
        })
    }

    /// The namespace whose eth0 has MAC `mac`, if any.
    pub fn ns_of_mac(&self, mac: MacAddr) -> Option<String> {
        NAMESPACES[1..]
            .iter()
            .find(|ns| self.mac_of(ns).ok() == Some(mac))
            .map(|s| s.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn loopback_routes_leave_out_the_expired_ones() {
        let json = r#"[{"type":"local","dst":"2001:db8::5","dev":"lo","metric":1024,"flags":[],"expires":0,"pref":"medium"},{"type":"local","dst":"2001:db8::6","dev":"lo","metric":1024,"flags":[],"expires":98},{"type":"local","dst":"2001:db8::7","dev":"lo","expires":-3},{"type":"local","dst":"2001:db8::8/128","dev":"lo"}]"#;
        let got = parse_loopback_routes_json(json).unwrap();
        let want: Vec<IpAddr> = ["2001:db8::5", "2001:db8::6", "2001:db8::8"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(got, want);
        assert!(parse_loopback_routes_json("[]").unwrap().is_empty());
        assert!(parse_loopback_routes_json("{}").is_err());
    }

    #[test]
    fn node_addresses() {
        assert_eq!(node_ipv4("node-c"), Some(Ipv4Addr::new(192, 0, 2, 13)));
        assert_eq!(
            node_ipv6("node-a").map(|a| a.to_string()).as_deref(),
            Some("2001:db8::11")
        );
        assert_eq!(node_ipv4("client"), None);
        assert_eq!(member_mac("node-b").as_deref(), Some("02:00:c0:00:02:0c"));
    }

    #[test]
    fn ip_addr_json_is_parsed() {
        let json = r#"[{"ifname":"eth0","addr_info":[
          {"family":"inet","local":"192.0.2.5","prefixlen":24,"scope":"global","dynamic":true,
           "label":"eth0","valid_life_time":30,"preferred_life_time":30},
          {"family":"inet","local":"192.0.2.6","prefixlen":24,"scope":"global","secondary":true,
           "label":"eth0:vip","valid_life_time":4294967295,"preferred_life_time":4294967295},
          {"family":"inet6","local":"2001:db8::5","prefixlen":64,"scope":"global",
           "tentative":true,"valid_life_time":4294967295,"preferred_life_time":4294967295}]}]"#;
        let a = parse_ip_addr_json(json).unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].valid_lft, Some(30));
        assert!(a[0].has_flag("dynamic"));
        assert!(a[1].has_flag("secondary"));
        assert_eq!(a[1].label.as_deref(), Some("eth0:vip"));
        assert_eq!(a[1].valid_lft, None);
        assert!(a[2].has_flag("tentative"));
        assert_eq!(a[2].prefix, 64);
        assert!(parse_ip_addr_json("{").is_err());
    }
}
