//! The lab's DHCP server: dnsmasq (Debian `dnsmasq-base`, installed on demand) in namespace
//! `dhcp` (192.0.2.3, 2001:db8::3), for the DHCP-mode tests (issue 13): DHCPv4, and DHCPv6
//! (IA_NA, pool 2001:db8::1000-1fff) when [`DnsmasqOptions::range_v6`] is set.
//!
//! Tests start and stop it ([`Lab::start_dnsmasq`], [`Lab::stop_dnsmasq`]), read its lease
//! file ([`Lab::dnsmasq_leases`]) and its log ([`Lab::dnsmasq_log`], `--log-dhcp`: one line
//! per DHCP message with the client MAC). To make it NAK a client, restart it with another
//! range ([`DnsmasqOptions::range`]): being authoritative, it NAKs requests for addresses
//! outside its range.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use super::error::{LabError, Result, io_ctx};
use super::{Lab, control_plane};

/// First address of the lab's DHCP pool.
pub const DHCP_POOL_START: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 200);
/// Last address of the lab's DHCP pool.
pub const DHCP_POOL_END: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 220);
/// First address of the lab's DHCPv6 pool.
pub const DHCP6_POOL_START: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x1000);
/// Last address of the lab's DHCPv6 pool.
pub const DHCP6_POOL_END: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x1fff);
/// Lease time the lab's dnsmasq grants by default: 120 s, dnsmasq's minimum (T1 60 s,
/// T2 105 s, dnsmasq's defaults of 1/2 and 7/8).
pub const DHCP_LEASE_SECS: u32 = 120;

/// How to run dnsmasq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsmasqOptions {
    /// Pool, inclusive. Default 192.0.2.200-192.0.2.220.
    pub range: (Ipv4Addr, Ipv4Addr),
    /// Lease time in seconds, at least 120 (dnsmasq raises shorter ones). Default 120.
    pub lease_secs: u32,
    /// `--dhcp-authoritative`: ACK INIT-REBOOT requests for free addresses it does not know,
    /// NAK requests for addresses outside its range. Default true.
    pub authoritative: bool,
    /// DHCPv6 pool (IA_NA, /64, same lease time), inclusive; `None` (the default): no
    /// DHCPv6. [`DHCP6_POOL_START`]-[`DHCP6_POOL_END`] for the lab's.
    pub range_v6: Option<(Ipv6Addr, Ipv6Addr)>,
}

impl Default for DnsmasqOptions {
    fn default() -> Self {
        Self {
            range: (DHCP_POOL_START, DHCP_POOL_END),
            lease_secs: DHCP_LEASE_SECS,
            authoritative: true,
            range_v6: None,
        }
    }
}

/// One line of dnsmasq's lease file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsmasqLease {
    /// Expiry, seconds since the Unix epoch.
    pub expires: u64,
    /// Client MAC, `aa:bb:cc:dd:ee:ff` (lower case, as dnsmasq writes it).
    pub mac: String,
    /// The leased address.
    pub addr: Ipv4Addr,
    /// Client host name (`None` for `*`).
    pub hostname: Option<String>,
    /// Client identifier in dnsmasq's hex form (`None` for `*`).
    pub client_id: Option<String>,
}

/// Parses dnsmasq's lease file (`<expiry> <mac> <ip> <hostname|*> <client-id|*>` per line);
/// DHCPv6 leases (an IPv6 address) are [`parse_leases6`]'s.
///
/// # Errors
/// [`LabError::Parse`] naming the line that does not have that shape.
pub fn parse_leases(text: &str) -> Result<Vec<DnsmasqLease>> {
    let star = |s: &str| (s != "*").then(|| s.to_string());
    parse_lease_lines(
        text,
        |l| !l.trim().is_empty() && !l.starts_with("duid") && !is_v6_lease(l),
        "dnsmasq lease file",
        |[expires, mac, addr, hostname, client_id]| {
            Some(DnsmasqLease {
                expires: expires.parse().ok()?,
                mac: mac.to_string(),
                addr: addr.parse().ok()?,
                hostname: star(hostname),
                client_id: star(client_id),
            })
        },
    )
}

/// The lines of a lease file that `keep` selects, each split into its five fields and
/// made into a lease by `lease` (`None`: a field does not parse).
///
/// # Errors
/// [`LabError::Parse`] about `what`, naming the first line that is not five fields or that
/// `lease` refuses.
fn parse_lease_lines<T>(
    text: &str,
    keep: impl Fn(&str) -> bool,
    what: &str,
    lease: impl Fn([&str; 5]) -> Option<T>,
) -> Result<Vec<T>> {
    text.lines()
        .filter(|l| keep(l))
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            <[&str; 5]>::try_from(f.as_slice())
                .ok()
                .and_then(&lease)
                .ok_or_else(|| LabError::Parse {
                    what: what.into(),
                    detail: format!("line {line:?}"),
                })
        })
        .collect()
}

/// A DHCPv6 line of the lease file: its address (third field) is IPv6.
fn is_v6_lease(line: &str) -> bool {
    line.split_whitespace()
        .nth(2)
        .is_some_and(|a| a.contains(':'))
}

/// One DHCPv6 (IA_NA) line of dnsmasq's lease file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsmasqLease6 {
    /// Expiry, seconds since the Unix epoch.
    pub expires: u64,
    /// The IA_NA's IAID (decimal, as dnsmasq writes it).
    pub iaid: u32,
    /// The leased address.
    pub addr: Ipv6Addr,
    /// The client DUID in dnsmasq's hex form (`00:03:00:01:<mac>` for a DUID-LL).
    pub duid: String,
}

/// The DHCPv6 leases of dnsmasq's lease file (`<expiry> <iaid> <ipv6> <hostname|*> <duid>`
/// per line, after the server's `duid` line).
///
/// # Errors
/// [`LabError::Parse`] naming the line that does not have that shape.
pub fn parse_leases6(text: &str) -> Result<Vec<DnsmasqLease6>> {
    parse_lease_lines(
        text,
        |l| !l.starts_with("duid") && is_v6_lease(l),
        "dnsmasq lease file (DHCPv6)",
        |[expires, iaid, addr, _hostname, duid]| {
            Some(DnsmasqLease6 {
                expires: expires.parse().ok()?,
                iaid: iaid.parse().ok()?,
                addr: addr.parse().ok()?,
                duid: duid.to_string(),
            })
        },
    )
}

/// dnsmasq's command line for `opts`, with its lease file at `leases`.
pub fn dnsmasq_args(opts: &DnsmasqOptions, leases: &std::path::Path) -> Vec<String> {
    let mut args = vec![
        // In the foreground, logging to stderr (the LabProcess log).
        "--no-daemon".to_string(),
        "--log-facility=-".into(),
        "--log-dhcp".into(),
        // No configuration file, no DNS, no pid file; root, so that it can write the lease
        // file in the lab directory.
        "--conf-file=/dev/null".into(),
        "--port=0".into(),
        "--pid-file=".into(),
        "--user=root".into(),
        "--interface=eth0".into(),
        "--bind-interfaces".into(),
        // No ICMP check before an offer: it delays the first lease by up to 3 s, and the
        // conflict check is the client's (RFC 5227 probe, DHCPDECLINE).
        "--no-ping".into(),
        format!(
            "--dhcp-range={},{},255.255.255.0,{}",
            opts.range.0, opts.range.1, opts.lease_secs
        ),
        format!("--dhcp-leasefile={}", leases.display()),
    ];
    if let Some((start, end)) = opts.range_v6 {
        // IA_NA from the /64 of eth0's 2001:db8::3; no router advertisements.
        args.push(format!("--dhcp-range={start},{end},64,{}", opts.lease_secs));
    }
    if opts.authoritative {
        args.push("--dhcp-authoritative".into());
    }
    args
}

impl Lab {
    /// Path of dnsmasq's lease file (kept across restarts, like a real server's).
    pub fn dnsmasq_lease_file(&self) -> PathBuf {
        self.dir().join("dnsmasq.leases")
    }

    /// Starts dnsmasq in `dhcp` with `opts` (restarting it if it runs), installing
    /// `dnsmasq-base` first if needed; returns once it listens on UDP port 67.
    ///
    /// # Errors
    /// [`LabError::Command`] when the package cannot be installed; [`LabError::Io`];
    /// [`LabError::Timeout`] when it does not listen within 5 s (its log is in the message).
    pub fn start_dnsmasq(&self, opts: &DnsmasqOptions) -> Result<()> {
        control_plane::ensure_packages(&[("dnsmasq", "dnsmasq-base")])?;
        self.stop_dnsmasq()?;
        let leases = self.dnsmasq_lease_file();
        if !leases.exists() {
            std::fs::write(&leases, "").map_err(io_ctx(format!("create {}", leases.display())))?;
        }
        let proc = self.spawn("dhcp", "dnsmasq", &dnsmasq_args(opts, &leases), &[])?;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let ports: &[&str] = if opts.range_v6.is_some() {
            &["= :67", "= :547"]
        } else {
            &["= :67"]
        };
        loop {
            let mut listening = true;
            for port in ports {
                let out = self.exec_unchecked("dhcp", "ss", &["-Hlun", "sport", port])?;
                listening &= !String::from_utf8_lossy(&out.stdout).trim().is_empty();
            }
            if listening {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(LabError::Timeout {
                    what: format!("dnsmasq to listen on UDP {ports:?} (log: {})", proc.log()),
                    seconds: 5.0,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        *self.dnsmasq.lock().map_err(|_| LabError::Thread {
            name: "dnsmasq".into(),
            detail: "lock poisoned".into(),
        })? = Some(proc);
        Ok(())
    }

    /// Stops dnsmasq (SIGTERM, then SIGKILL after 2 s); its log stays readable through
    /// [`Lab::dnsmasq_log`]. Not running = `Ok`.
    ///
    /// # Errors
    /// [`LabError::Io`] when it cannot be signalled.
    pub fn stop_dnsmasq(&self) -> Result<()> {
        let proc = self
            .dnsmasq
            .lock()
            .map_err(|_| LabError::Thread {
                name: "dnsmasq".into(),
                detail: "lock poisoned".into(),
            })?
            .take();
        if let Some(mut p) = proc {
            self.append_dnsmasq_log(&p.log());
            p.stop(Duration::from_secs(2))?;
        }
        Ok(())
    }

    fn append_dnsmasq_log(&self, text: &str) {
        use std::io::Write;
        let path = self.dir().join("logs").join("dnsmasq-stopped.log");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(text.as_bytes());
        }
    }

    /// Everything every dnsmasq of this lab logged so far (stopped runs first).
    pub fn dnsmasq_log(&self) -> String {
        let mut log = std::fs::read_to_string(self.dir().join("logs").join("dnsmasq-stopped.log"))
            .unwrap_or_default();
        if let Ok(d) = self.dnsmasq.lock()
            && let Some(p) = d.as_ref()
        {
            log.push_str(&p.log());
        }
        log
    }

    /// The current DHCPv6 leases in dnsmasq's lease file.
    ///
    /// # Errors
    /// [`LabError::Io`] when it cannot be read, [`LabError::Parse`].
    pub fn dnsmasq_leases6(&self) -> Result<Vec<DnsmasqLease6>> {
        self.read_lease_file(parse_leases6)
    }

    /// The current leases in dnsmasq's lease file.
    ///
    /// # Errors
    /// [`LabError::Io`] when it cannot be read, [`LabError::Parse`].
    pub fn dnsmasq_leases(&self) -> Result<Vec<DnsmasqLease>> {
        self.read_lease_file(parse_leases)
    }

    /// dnsmasq's lease file parsed by `parse`; no leases while it does not exist.
    fn read_lease_file<T>(&self, parse: fn(&str) -> Result<Vec<T>>) -> Result<Vec<T>> {
        let path = self.dnsmasq_lease_file();
        match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io_ctx(format!("read {}", path.display()))(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_file_is_parsed() {
        let text = "1767200000 02:42:c0:00:02:c9 192.0.2.205 lb-test 01:02:42:c0:00:02:c9\n\
                    1767200100 02:42:c0:00:02:ca 192.0.2.206 * *\n";
        let leases = parse_leases(text).unwrap();
        assert_eq!(leases.len(), 2);
        assert_eq!(leases[0].addr, Ipv4Addr::new(192, 0, 2, 205));
        assert_eq!(leases[0].hostname.as_deref(), Some("lb-test"));
        assert_eq!(leases[1].client_id, None);
        let e = parse_leases("garbage line\n").unwrap_err().to_string();
        assert!(e.contains("garbage line"), "{e}");
    }

    #[test]
    fn dhcpv6_leases_are_parsed_apart() {
        let text = "1767200000 02:42:c0:00:02:c9 192.0.2.205 * *\n\
                    duid 00:01:00:01:2c:00:00:00:02:00:00:00:00:03\n\
                    1767200100 7 2001:db8::1005 * 00:03:00:01:02:42:00:00:00:07\n";
        assert_eq!(parse_leases(text).unwrap().len(), 1);
        let v6 = parse_leases6(text).unwrap();
        assert_eq!(
            v6,
            vec![DnsmasqLease6 {
                expires: 1_767_200_100,
                iaid: 7,
                addr: "2001:db8::1005".parse().unwrap(),
                duid: "00:03:00:01:02:42:00:00:00:07".into(),
            }]
        );
        let args = dnsmasq_args(
            &DnsmasqOptions {
                range_v6: Some((DHCP6_POOL_START, DHCP6_POOL_END)),
                ..DnsmasqOptions::default()
            },
            std::path::Path::new("/l"),
        );
        assert!(args.contains(&"--dhcp-range=2001:db8::1000,2001:db8::1fff,64,120".into()));
        assert!(
            !dnsmasq_args(&DnsmasqOptions::default(), std::path::Path::new("/l"))
                .iter()
                .any(|a| a.contains("2001:db8"))
        );
    }

    #[test]
    fn args_carry_pool_lease_and_authority() {
        let args = dnsmasq_args(&DnsmasqOptions::default(), std::path::Path::new("/l"));
        assert!(args.contains(&"--dhcp-range=192.0.2.200,192.0.2.220,255.255.255.0,120".into()));
        assert!(args.contains(&"--dhcp-leasefile=/l".into()));
        assert!(args.contains(&"--dhcp-authoritative".into()));
        let quiet = DnsmasqOptions {
            authoritative: false,
            ..DnsmasqOptions::default()
        };
        assert!(
            !dnsmasq_args(&quiet, std::path::Path::new("/l"))
                .contains(&"--dhcp-authoritative".into())
        );
    }
}
