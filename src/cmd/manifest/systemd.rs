//! `vipd manifest systemd`: the systemd unit for bare-metal nodes (and, with
//! `--environment-file`, the matching EnvironmentFile with kube-vip's variable names).
//!
//! The unit is built as a typed list of sections and `Key=Value` entries and rendered; see
//! systemd.service(5), systemd.exec(5). Choices:
//! - `Type=notify` + `NotifyAccess=main`: vipd sends `READY=1` once its configuration is
//!   valid and the API server answered ([`crate::obs::systemd`]).
//! - `WatchdogSec=`: vipd pings `WATCHDOG=1` from its main loop at half that interval.
//! - `Restart=always`: a VIP announcer must come back.
//! - Runs as root but with the capability bounding set and ambient set limited to
//!   `CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE` (the last for the DHCPv6 client's
//!   port 546; root is needed to read root-only kubeconfigs such as
//!   k3s.yaml without CAP_DAC_OVERRIDE); `NoNewPrivileges`, a read-only file system
//!   (`ProtectSystem=strict`), and the address families netlink, packet, inet, unix only.

use clap::Args;

use super::{Access, EnvValue, GenArgs, ManifestError};

/// Default path of the vipd binary in the unit.
pub(crate) const DEFAULT_BINARY: &str = "/usr/local/bin/vipd";
/// Default EnvironmentFile path.
pub(crate) const DEFAULT_ENV_FILE: &str = "/etc/vipd/vipd.env";
/// Default `WatchdogSec=` (seconds).
pub(crate) const DEFAULT_WATCHDOG_SEC: u32 = 10;

/// `vipd manifest systemd` flags.
#[derive(Debug, Clone, Args, PartialEq, Eq)]
pub struct SystemdArgs {
    /// Print the EnvironmentFile (kube-vip variable names) for the given generator flags
    /// instead of the unit
    #[arg(long = "environment-file")]
    pub environment_file: bool,
    /// Path of the vipd binary
    #[arg(long = "binary", value_name = "PATH", default_value = DEFAULT_BINARY)]
    pub binary: String,
    /// Path of the EnvironmentFile the unit reads
    #[arg(long = "env-path", value_name = "PATH", default_value = DEFAULT_ENV_FILE)]
    pub env_path: String,
    /// WatchdogSec= in seconds (vipd pings at half of it); 0 disables the watchdog
    #[arg(long = "watchdog-sec", value_name = "SECONDS", default_value_t = DEFAULT_WATCHDOG_SEC)]
    pub watchdog_sec: u32,
    /// kube-vip generator flags, used with --environment-file
    #[command(flatten)]
    pub generator: GenArgs,
}

/// One `[Section]` of a unit file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Section name without brackets.
    pub name: &'static str,
    /// `Key=Value` entries, in order.
    pub entries: Vec<(&'static str, String)>,
}

/// A unit file: sections rendered in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Comment lines at the top (without `# `).
    pub header: Vec<String>,
    /// The sections.
    pub sections: Vec<Section>,
}

impl Unit {
    /// The unit file text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for h in &self.header {
            s.push_str("# ");
            s.push_str(h);
            s.push('\n');
        }
        for (i, sec) in self.sections.iter().enumerate() {
            if i > 0 || !self.header.is_empty() {
                s.push('\n');
            }
            s.push_str(&format!("[{}]\n", sec.name));
            for (k, v) in &sec.entries {
                s.push_str(&format!("{k}={v}\n"));
            }
        }
        s
    }
}

/// The capabilities vipd needs: netlink address changes, raw ARP/NDP sockets, and (DHCP
/// mode, `::` Services) the DHCPv6 client's UDP port 546.
pub(crate) const CAPABILITIES: &str = "CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE";

/// The vipd unit.
pub fn unit(args: &SystemdArgs) -> Unit {
    let e = |k: &'static str, v: &str| (k, v.to_string());
    let mut service = vec![
        e("Type", "notify"),
        e("NotifyAccess", "main"),
        e("EnvironmentFile", &args.env_path),
        e("ExecStart", &format!("{} manager", args.binary)),
        e("Restart", "always"),
        e("RestartSec", "2"),
        e("TimeoutStartSec", "90"),
        e("TimeoutStopSec", "10"),
        e("KillMode", "mixed"),
    ];
    if args.watchdog_sec > 0 {
        service.push(e("WatchdogSec", &args.watchdog_sec.to_string()));
    }
    service.extend([
        e("AmbientCapabilities", CAPABILITIES),
        e("CapabilityBoundingSet", CAPABILITIES),
        e("NoNewPrivileges", "yes"),
        e("ProtectSystem", "strict"),
        e("ProtectHome", "yes"),
        e("PrivateTmp", "yes"),
        // No device but the pseudo devices and /dev/net/tun, which routing-table mode opens
        // for the fence device of every IPv4 VIP route (net::route): the device cgroup
        // closes the rest (`PrivateDevices=yes` would hide /dev/net/tun itself).
        e("DevicePolicy", "closed"),
        e("DeviceAllow", "/dev/net/tun rw"),
        e("ProtectKernelTunables", "yes"),
        // DHCP mode sets rp_filter and the ARP settings of the macvlans it creates
        // (net::macvlan), routing-table mode the IPv6 route collector's interval
        // (net.ipv6.route.gc_interval); those sysctls stay writable, the rest of /proc/sys
        // read-only ("-": fine on a kernel without IPv6).
        e(
            "ReadWritePaths",
            "-/proc/sys/net/ipv4/conf -/proc/sys/net/ipv6/conf -/proc/sys/net/ipv6/route",
        ),
        e("ProtectKernelModules", "yes"),
        e("ProtectKernelLogs", "yes"),
        e("ProtectControlGroups", "yes"),
        e("ProtectClock", "yes"),
        e("ProtectHostname", "yes"),
        e(
            "RestrictAddressFamilies",
            "AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_PACKET",
        ),
        e("RestrictNamespaces", "yes"),
        e("RestrictRealtime", "yes"),
        e("RestrictSUIDSGID", "yes"),
        e("LockPersonality", "yes"),
        e("MemoryDenyWriteExecute", "yes"),
        e("SystemCallArchitectures", "native"),
        e("SystemCallFilter", "@system-service"),
    ]);
    Unit {
        header: vec![
            "vipd: on-node VIP announcer (kube-vip ARP mode compatible).".into(),
            "Generated by `vipd manifest systemd`; settings go to the EnvironmentFile".into(),
            "(kube-vip variable names, see `vipd manifest systemd --environment-file`).".into(),
        ],
        sections: vec![
            Section {
                name: "Unit",
                entries: vec![
                    e("Description", "vipd VIP announcer for Kubernetes"),
                    e("Wants", "network-online.target"),
                    e("After", "network-online.target"),
                    e("StartLimitIntervalSec", "0"),
                ],
            },
            Section {
                name: "Service",
                entries: service,
            },
            Section {
                name: "Install",
                entries: vec![e("WantedBy", "multi-user.target")],
            },
        ],
    }
}

/// The EnvironmentFile for the generator flags: one `name=value` per line (kube-vip
/// names). `vip_nodename` is left out (the hostname is the default).
///
/// # Errors
/// Everything [`GenArgs::plan`] returns; [`ManifestError::Invalid`] for `--inCluster`.
pub(crate) fn environment_file(generator: &GenArgs) -> Result<String, ManifestError> {
    refuse_workload_flags(generator)?;
    let plan = generator.plan()?;
    if plan.access == Access::InCluster {
        return Err(ManifestError::Invalid {
            flag: "inCluster",
            value: "true".into(),
            reason: "a systemd unit has no ServiceAccount: give --k8sConfigPath".into(),
        });
    }
    let mut s = String::from("# vipd manager settings (kube-vip environment variable names)\n");
    for (k, v) in &plan.env {
        if let EnvValue::Text(t) = v {
            if t.contains('\n') {
                return Err(ManifestError::Invalid {
                    flag: "environment-file",
                    value: t.clone(),
                    reason: format!("{k}: a value cannot contain a newline"),
                });
            }
            s.push_str(&format!("{k}={t}\n"));
        }
    }
    Ok(s)
}

/// Refuses the generator flags that shape a Pod and mean nothing to a systemd unit, rather
/// than dropping them: `--image` (the unit runs `--binary`), `--taint` (scheduling) and
/// `--kubeadm-init` (a Pod mount; a unit reads `--k8sConfigPath` directly).
///
/// # Errors
/// [`ManifestError::Invalid`] naming the flag.
fn refuse_workload_flags(generator: &GenArgs) -> Result<(), ManifestError> {
    if generator.image != super::DEFAULT_IMAGE {
        return Err(ManifestError::Invalid {
            flag: "image",
            value: generator.image.clone(),
            reason: "a systemd unit runs the vipd binary (--binary), not a container image".into(),
        });
    }
    for (flag, value, reason) in [
        (
            "taint",
            &generator.taint,
            "applies to `manifest daemonset` only (tolerations and node affinity)",
        ),
        (
            "kubeadm-init",
            &generator.kubeadm_init,
            "mounts super-admin.conf into a Pod; for a systemd unit on the first kubeadm node \
             give --k8sConfigPath /etc/kubernetes/super-admin.conf until `kubeadm init` ends, \
             then admin.conf",
        ),
    ] {
        if let Some(v) = value
            && GenArgs::flag_bool(flag, value)?
        {
            return Err(ManifestError::Invalid {
                flag,
                value: v.clone(),
                reason: reason.into(),
            });
        }
    }
    Ok(())
}

/// `vipd manifest systemd` output.
///
/// # Errors
/// See [`environment_file`].
pub fn render(args: &SystemdArgs) -> Result<String, ManifestError> {
    if args.environment_file {
        return environment_file(&args.generator);
    }
    refuse_workload_flags(&args.generator)?;
    // The unit reads everything else from its EnvironmentFile: generator flags given
    // without --environment-file would be silently dropped.
    let untouched = GenArgs {
        image: args.generator.image.clone(),
        ..GenArgs::default()
    };
    if args.generator != untouched {
        return Err(ManifestError::Invalid {
            flag: "environment-file",
            value: "false".into(),
            reason: "the generator flags (--address, --controlplane, ...) go into the \
                     EnvironmentFile: run `vipd manifest systemd --environment-file <flags>` \
                     for it, and `vipd manifest systemd` (only --binary, --env-path, \
                     --watchdog-sec) for the unit"
                .into(),
        });
    }
    Ok(unit(args).render())
}
