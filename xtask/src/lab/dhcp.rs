//! The lab's DHCP server: dnsmasq (Debian `dnsmasq-base`, installed on demand) in namespace
//! `dhcp` (192.0.2.3), DHCPv4 only, for the DHCP-mode tests (issue 13).
//!
//! Tests start and stop it ([`Lab::start_dnsmasq`], [`Lab::stop_dnsmasq`]), read its lease
//! file ([`Lab::dnsmasq_leases`]) and its log ([`Lab::dnsmasq_log`], `--log-dhcp`: one line
//! per DHCP message with the client MAC). To make it NAK a client, restart it with another
//! range ([`DnsmasqOptions::range`]): being authoritative, it NAKs requests for addresses
//! outside its range.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use super::error::{LabError, Result, io_ctx};
use super::{Lab, control_plane};

/// First address of the lab's DHCP pool.
pub const DHCP_POOL_START: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 200);
/// Last address of the lab's DHCP pool.
pub const DHCP_POOL_END: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 220);
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
}

impl Default for DnsmasqOptions {
    fn default() -> Self {
        Self {
            range: (DHCP_POOL_START, DHCP_POOL_END),
            lease_secs: DHCP_LEASE_SECS,
            authoritative: true,
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

/// Parses dnsmasq's lease file (`<expiry> <mac> <ip> <hostname|*> <client-id|*>` per line).
///
/// # Errors
/// [`LabError::Parse`] naming the line that does not have that shape.
pub fn parse_leases(text: &str) -> Result<Vec<DnsmasqLease>> {
    let star = |s: &str| (s != "*").then(|| s.to_string());
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("duid"))
        .map(|line| {
            let bad = || LabError::Parse {
                what: "dnsmasq lease file".into(),
                detail: format!("line {line:?}"),
            };
            let f: Vec<&str> = line.split_whitespace().collect();
            let [expires, mac, addr, hostname, client_id] = f[..] else {
                return Err(bad());
            };
            Ok(DnsmasqLease {
                expires: expires.parse().map_err(|_| bad())?,
                mac: mac.to_string(),
                addr: addr.parse().map_err(|_| bad())?,
                hostname: star(hostname),
                client_id: star(client_id),
            })
        })
        .collect()
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
        loop {
            let out = self.exec_unchecked("dhcp", "ss", &["-Hlun", "sport", "= :67"])?;
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(LabError::Timeout {
                    what: format!("dnsmasq to listen on UDP 67 (log: {})", proc.log()),
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

    /// The current leases in dnsmasq's lease file.
    ///
    /// # Errors
    /// [`LabError::Io`] when it cannot be read, [`LabError::Parse`].
    pub fn dnsmasq_leases(&self) -> Result<Vec<DnsmasqLease>> {
        let path = self.dnsmasq_lease_file();
        match std::fs::read_to_string(&path) {
            Ok(text) => parse_leases(&text),
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
