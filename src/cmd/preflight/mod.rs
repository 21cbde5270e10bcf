//! `vipd preflight`: checks a node before `vipd manager` runs there and prints a table with
//! a fix for every failure; the process exits non-zero when any check fails.
//!
//! Checks (each independent, all run):
//! - `capabilities`: `CAP_NET_ADMIN` (addresses via netlink) and `CAP_NET_RAW` (ARP/NDP
//!   frames) in the effective set (`CapEff` of `/proc/self/status`).
//! - `interface`: the VIP interface exists and has carrier (`IFLA_CARRIER`).
//! - `vip-address:<ip>`: a control-plane VIP is not the network or broadcast address of its
//!   own prefix (`vip_subnet`) or of a subnet on its interface (the manager refuses those).
//! - `vip-free:<ip>`: nobody on the segment answers for the VIP: the manager's own conflict
//!   probe ([`crate::net::conflict`]: RFC 5227 §2.1.1 ARP probes, IPv6 DAD-style neighbour
//!   solicitations) and ~1 s of listening for any frame from another MAC claiming it.
//! - `nftables`: `nft` can create vipd's `table arp vipd` (checked with `nft --check`,
//!   nothing is changed): without it the manager's ARP flux guard is off.
//! - `arp-flux:<interface>`: no other interface on the VIP's subnet would answer ARP for
//!   the VIP (effective `arp_ignore` and `arp_filter` 0 there); a warning names the
//!   interfaces and the sysctl remedy, and says whether the nftables guard covers it (S36).
//! - `lb-nftables` (with `lb_enable` and `cp_enable`): `nft` can create the load balancer's
//!   `table ip vipd_lb` with its NAT chains, numgen DNAT map and masquerade (`nft --check`,
//!   nothing is changed); a failure means the holder could not balance.
//! - `macvlan`: the kernel can create macvlans (asked of the kernel itself, see
//!   [`crate::net::macvlan::NetlinkMacvlans::kernel_has_macvlan`]; else the module is loaded
//!   or listed in modules.dep / modules.builtin). Needed by DHCP Services (address
//!   `0.0.0.0` / `::`) only: with `svc_enable` a missing macvlan is a warning.
//! - `dhcp-parent` (with `svc_enable`): the macvlans' parent interface (`vip_servicesinterface`,
//!   else `vip_interface`, else the IPv4 default route's interface, as the manager picks it)
//!   exists and is up with carrier.
//! - `tun` and `ipv6-route-gc` (routing-table mode, `vip_routingtable`): `/dev/net/tun`
//!   opens read-write (every IPv4 VIP route sits on a TUN fence device), and
//!   `net.ipv6.route.gc_interval` is writable (vipd sets it to 1 s so that an expired IPv6
//!   VIP route goes within its lifetime + 1 s); docs/design.md, "The route fence". In this
//!   mode `vip-free`, `arp-flux` and `nft-fence` are skipped: nothing is answered on the
//!   segment (the control-plane VIP's loopback address is fenced by its route's lifetime).
//! - `api`: the API server answers `/version` with the configured kubeconfig.
//! - `rbac`: a SelfSubjectAccessReview for every access of
//!   [`crate::kube::api::API_CALLS`] the configuration makes, in its namespace
//!   ([`check_rbac`]); a denied one fails, naming it and the rule that grants it.

use std::net::IpAddr;
use std::time::Duration;

use clap::Args;

use crate::config::{Config, ManagerArgs};
use crate::net::NetlinkKernel;
use crate::net::arpflux::{self, FluxFinding, FluxTarget};

mod cluster;
mod network;
mod rbac;

use cluster::{check_api, check_peer_key, explain_answers_by_holder};
use network::{check_interface, check_vips_free, dhcp_parent};
use rbac::check_rbac;

/// Linux capability number of `CAP_NET_ADMIN` (linux/capability.h).
pub const CAP_NET_ADMIN: u32 = 12;
/// Linux capability number of `CAP_NET_RAW`.
pub const CAP_NET_RAW: u32 = 13;
/// Linux capability number of `CAP_NET_BIND_SERVICE` (DHCPv6 clients bind UDP port 546).
pub const CAP_NET_BIND_SERVICE: u32 = 10;

/// `vipd preflight`: the manager's flags and environment, plus probe options.
#[derive(Debug, Clone, Args)]
pub struct PreflightArgs {
    /// How long to listen for answers to the ARP probe, in milliseconds
    #[arg(long = "arp-probe-ms", value_name = "MS", default_value_t = 1000)]
    pub arp_probe_ms: u64,
    /// Skip the ARP probe (it sends one ARP request on the VIP interface)
    #[arg(long = "no-arp-probe")]
    pub no_arp_probe: bool,
    /// `vipd manager` flags (environment variables win, as for the manager)
    #[command(flatten)]
    pub manager: ManagerArgs,
}

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Good.
    Pass,
    /// Bad: `vipd manager` will not work here.
    Fail,
    /// Worth knowing, does not stop vipd.
    Warn,
    /// Not applicable to this configuration (or not possible without an earlier check).
    Skip,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Pass => "ok",
            Status::Fail => "FAIL",
            Status::Warn => "warn",
            Status::Skip => "skip",
        })
    }
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Short name, e.g. `capabilities`.
    pub name: String,
    /// Outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// How to fix it (for failures and warnings).
    pub fix: Option<String>,
}

impl Check {
    fn new(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            status,
            detail: detail.into(),
            fix: None,
        }
    }
    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// All checks of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// In the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether any check failed (the process then exits non-zero).
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    /// The table: `CHECK  RESULT  DETAIL`, with a `fix:` line under each failure/warning.
    pub fn render(&self) -> String {
        let w = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let mut s = format!("{:<w$}  {:<6}  DETAIL\n", "CHECK", "RESULT");
        for c in &self.checks {
            s.push_str(&format!(
                "{:<w$}  {:<6}  {}\n",
                c.name,
                c.status.to_string(),
                c.detail
            ));
            if let Some(f) = &c.fix {
                s.push_str(&format!("{:<w$}  {:<6}  fix: {}\n", "", "", f));
            }
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        s.push_str(&if failed == 0 {
            "preflight passed\n".to_string()
        } else {
            format!("preflight FAILED: {failed} check(s)\n")
        });
        s
    }
}

/// The effective capability mask from `/proc/<pid>/status` text (`CapEff:` hex).
pub(crate) fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// The capability check over `/proc/self/status` text.
pub(crate) fn check_capabilities(status: &str) -> Check {
    let Some(eff) = parse_cap_eff(status) else {
        return Check::new(
            "capabilities",
            Status::Fail,
            "no CapEff line in /proc/self/status",
        )
        .fix("run on Linux with /proc mounted");
    };
    let missing: Vec<&str> = [
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_NET_RAW, "CAP_NET_RAW"),
    ]
    .iter()
    .filter(|(bit, _)| eff & (1u64 << bit) == 0)
    .map(|(_, n)| *n)
    .collect();
    if missing.is_empty() {
        Check::new(
            "capabilities",
            Status::Pass,
            "CAP_NET_ADMIN and CAP_NET_RAW effective",
        )
    } else {
        Check::new(
            "capabilities",
            Status::Fail,
            format!("missing {}", missing.join(", ")),
        )
        .fix(
            "Pod: securityContext.capabilities.add [NET_ADMIN, NET_RAW] (vipd manifest pod); \
             systemd: AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW (vipd manifest systemd); \
             shell: run as root",
        )
    }
}

/// The `dhcpv6-port` row over `/proc/self/status` text: with `svc_enable` (`services`), the
/// DHCPv6 client of `::` Services binds UDP port 546 (RFC 8415 §7.2), which needs
/// `CAP_NET_BIND_SERVICE`; without it DHCPv6 fails (DHCPv4 uses raw sockets and does not
/// need it): a warning.
pub(crate) fn check_dhcp6_port(status: &str, services: bool) -> Check {
    if !services {
        return Check::new("dhcpv6-port", Status::Skip, "svc_enable is off");
    }
    match parse_cap_eff(status) {
        Some(eff) if eff & (1u64 << CAP_NET_BIND_SERVICE) != 0 => Check::new(
            "dhcpv6-port",
            Status::Pass,
            "CAP_NET_BIND_SERVICE effective: DHCPv6 clients can bind UDP port 546",
        ),
        _ => Check::new(
            "dhcpv6-port",
            Status::Warn,
            "missing CAP_NET_BIND_SERVICE: `::` Services (DHCPv6) cannot bind UDP port 546; DHCPv4 works",
        )
        .fix(
            "Pod: securityContext.capabilities.add NET_BIND_SERVICE (vipd manifest pod); \
             systemd: AmbientCapabilities=... CAP_NET_BIND_SERVICE (vipd manifest systemd)",
        ),
    }
}

/// The `nftables` row and one `arp-flux:<interface>` row per target of the ARP flux check
/// (S36): `guard` is the outcome of [`crate::net::NftArpGuard::check`], `findings` that of
/// [`crate::net::arpflux::flux_findings`] for `targets`. Findings are warnings (vipd works,
/// but clients may get two MACs for a VIP), with the sysctl remedy as the fix.
pub(crate) fn check_arp_flux(
    targets: &[FluxTarget],
    findings: &[FluxFinding],
    guard: &Result<(), crate::net::ArpGuardError>,
) -> Vec<Check> {
    let mut out = vec![match guard {
        Ok(()) => Check::new(
            "nftables",
            Status::Pass,
            "the kernel accepts table arp vipd (checked through netlink, nothing changed): the manager answers ARP for each VIP on its interface only",
        ),
        Err(e) => Check::new(
            "nftables",
            Status::Warn,
            format!("ARP flux protection will be off: {e}"),
        )
        .fix("run vipd with CAP_NET_ADMIN on a kernel with nf_tables (CONFIG_NF_TABLES_ARP), or set the sysctl below"),
    }];
    for t in targets {
        let name = format!("arp-flux:{}", t.ifname);
        let what = t
            .vip
            .map_or_else(|| "its subnet".to_string(), |v| format!("VIP {v}"));
        out.push(match findings.iter().find(|f| f.target == *t) {
            None => Check::new(
                name,
                Status::Pass,
                format!("no other interface answers ARP for {what}"),
            ),
            Some(f) => Check::new(name, Status::Warn, f.message(guard.is_ok())).fix(format!(
                "{} (persistent: {})",
                arpflux::REMEDY,
                arpflux::REMEDY_PERSISTENT
            )),
        });
    }
    out
}

/// The `lb-nftables` row: `checked` is the outcome of [`crate::controlplane::lb::check`] (`None` when
/// `lb_enable` is off or there is no control plane to balance: skipped).
pub(crate) fn check_lb_nftables(
    checked: Option<&Result<(), crate::controlplane::lb::LbError>>,
) -> Check {
    match checked {
        None => Check::new(
            "lb-nftables",
            Status::Skip,
            "lb_enable is off or cp_enable is off",
        ),
        Some(Ok(())) => Check::new(
            "lb-nftables",
            Status::Pass,
            "the kernel accepts table ip vipd_lb (NAT, fib, numgen DNAT map, masquerade; checked through netlink, nothing changed)",
        ),
        Some(Err(e)) => Check::new("lb-nftables", Status::Fail, e.to_string()).fix(
            "run vipd with CAP_NET_ADMIN on a kernel with nf_tables NAT (CONFIG_NF_TABLES, CONFIG_NFT_NAT, CONFIG_NFT_MASQ, CONFIG_NFT_NUMGEN, CONFIG_NFT_FIB_IPV4, CONFIG_NF_CONNTRACK), or unset lb_enable",
        ),
    }
}

/// The `nft-fence` row: `checked` is the outcome of
/// [`crate::net::nft::fence::NftFence::check`] (the kernel's check mode: nothing changes;
/// `None` when `vip_nftfence=false`, or neither `cp_enable` nor `svc_enable` is on). A
/// failure is a warning saying what running without it costs, or a failure when the lease
/// timings are sub-second (the manager then refuses to run).
pub(crate) fn check_nft_fence(
    checked: Option<&Result<(), crate::net::nft::fence::FenceError>>,
    sub_second: bool,
) -> Check {
    use crate::net::nft::fence::WITHOUT_MS_FENCE;
    const FIX: &str = "run vipd with CAP_NET_ADMIN on a kernel with nf_tables arp and inet families and set timeouts (CONFIG_NF_TABLES, CONFIG_NF_TABLES_ARP, CONFIG_NF_TABLES_INET)";
    match checked {
        None => Check::new(
            "nft-fence",
            Status::Skip,
            format!("the millisecond fence is off (vip_nftfence=false, or neither cp_enable nor svc_enable): {WITHOUT_MS_FENCE}"),
        ),
        Some(Ok(())) => Check::new(
            "nft-fence",
            Status::Pass,
            "the kernel accepts tables arp/inet vipd_fence (sets with per-element timeouts; checked through netlink, nothing changed): every VIP is fenced to the millisecond",
        ),
        Some(Err(e)) if sub_second => Check::new(
            "nft-fence",
            Status::Fail,
            format!("the lease timings are sub-second and only the millisecond fence can fence them, but it cannot start: vipd manager will refuse to run: {e}"),
        )
        .fix(format!("{FIX}, or use whole-second lease timings (e.g. the default 3/2/1)")),
        Some(Err(e)) => Check::new(
            "nft-fence",
            Status::Warn,
            format!("the millisecond fence cannot start here, so {WITHOUT_MS_FENCE}: {e}"),
        )
        .fix(format!("{FIX}, or set vip_nftfence=false to run this way on purpose")),
    }
}

/// The `egress` row (`kube-vip.io/egress`): `checked` is the outcome of
/// [`crate::net::nft::egress::check`] (`None` without `svc_enable` or with
/// `vip_nftfence=false`), `cilium` whether Cilium's datapath is on the node
/// (`/sys/class/net/cilium_host`).
pub(crate) fn check_egress(
    checked: Option<&Result<(), crate::net::nft::egress::EgressError>>,
    cilium: bool,
) -> Check {
    match checked {
        None => Check::new(
            "egress",
            Status::Skip,
            "svc_enable is off, or vip_nftfence=false (egress needs the millisecond fence)",
        ),
        Some(Err(e)) => Check::new(
            "egress",
            Status::Warn,
            format!("Services annotated kube-vip.io/egress will leave with their pods' addresses: {e}"),
        )
        .fix("run vipd with CAP_NET_ADMIN on a kernel with nf_tables NAT for the inet family (Linux 5.2+, CONFIG_NFT_NAT)"),
        Some(Ok(())) if cilium => Check::new(
            "egress",
            Status::Warn,
            "Cilium's datapath runs on this node (cilium_host): with its eBPF kube-proxy replacement or BPF masquerading, pods' traffic is translated in eBPF and never meets vipd's egress rules (kube-vip.io/egress)",
        )
        .fix("use Cilium's egress gateway instead, or run Cilium with iptables masquerading (bpf.masquerade=false)"),
        Some(Ok(())) => Check::new(
            "egress",
            Status::Pass,
            "the kernel accepts the egress chains (source NAT gated on the fence, guard; checked through netlink, nothing changed)",
        ),
    }
}

/// One `vip-address:<vip>` row per control-plane VIP: the outcome of
/// [`crate::controlplane::subnet_edges`] (`None` when its interface could not be read).
/// The network or broadcast address of a subnet on the VIP's interface fails: the manager
/// refuses to start with it.
pub(crate) fn check_vip_addresses(
    edges: &[(
        IpAddr,
        Option<Result<(), crate::controlplane::ControlPlaneError>>,
    )],
) -> Vec<Check> {
    edges
        .iter()
        .map(|(vip, checked)| {
            let name = format!("vip-address:{vip}");
            match checked {
                None => Check::new(name, Status::Skip, "needs a working interface"),
                Some(Ok(())) => Check::new(
                    name,
                    Status::Pass,
                    "a host address: not the network or broadcast address of a subnet on its interface",
                ),
                Some(Err(e)) => Check::new(name, Status::Fail, e.to_string()).fix(
                    "set address (--address) to a host address of the subnet, not its first or last",
                ),
            }
        })
        .collect()
}

/// The macvlan check: `kernel` (the kernel's own answer,
/// [`crate::net::macvlan::NetlinkMacvlans::kernel_has_macvlan`]; `None` when it could not
/// be asked), `loaded` (`/sys/module/macvlan` exists: loaded, or built in with
/// parameters), `modules_dep` / `modules_builtin` (contents of
/// `/lib/modules/$(uname -r)/modules.dep` and `modules.builtin`, when readable), `needed`
/// (`svc_enable`: a Service with address `0.0.0.0` / `::` gets it by DHCP on a macvlan; a
/// kernel without macvlans is a warning, since only such Services fail, with a
/// `DHCPFailed` Warning Event). The kernel's answer wins: the files miss a built-in driver
/// without parameters, and containers often have no `/lib/modules`.
pub(crate) fn check_macvlan(
    kernel: Option<bool>,
    loaded: bool,
    modules_dep: Option<&str>,
    modules_builtin: Option<&str>,
    needed: bool,
) -> Check {
    let has = |t: Option<&str>| {
        t.is_some_and(|t| {
            t.lines().any(|l| {
                let path = l.split(':').next().unwrap_or_default();
                path.rsplit('/')
                    .next()
                    .is_some_and(|f| f == "macvlan.ko" || f.starts_with("macvlan.ko."))
            })
        })
    };
    let (status, detail) = if kernel == Some(true) {
        (
            Status::Pass,
            "the kernel creates macvlans (built in, or its module loads on demand)".to_string(),
        )
    } else if kernel == Some(false) {
        (
            if needed { Status::Warn } else { Status::Skip },
            "this kernel cannot create macvlans (RTNETLINK: unknown device type macvlan)"
                .to_string(),
        )
    } else if loaded {
        (Status::Pass, "macvlan is loaded (or built in)".to_string())
    } else if has(modules_builtin) {
        (Status::Pass, "macvlan is built into the kernel".to_string())
    } else if has(modules_dep) {
        (
            Status::Pass,
            "macvlan is loadable (modules.dep lists it; it loads on first use)".to_string(),
        )
    } else if modules_dep.is_none() {
        (
            if needed { Status::Warn } else { Status::Skip },
            "cannot read /lib/modules/<release>/modules.dep to tell whether macvlan exists"
                .to_string(),
        )
    } else {
        (
            if needed { Status::Warn } else { Status::Skip },
            "this kernel has no macvlan module".to_string(),
        )
    };
    let suffix = if needed {
        ": Services with address 0.0.0.0 / :: get theirs by DHCP on a macvlan"
    } else {
        " (only Services with address 0.0.0.0 / :: need it)"
    };
    let c = Check::new("macvlan", status, format!("{detail}{suffix}"));
    if matches!(status, Status::Fail | Status::Warn) || (!needed && status == Status::Skip) {
        c.fix(
            "install the full kernel package: minimal SUSE cloud images (SLE Micro, openSUSE \
             MicroOS/Leap Micro) ship kernel-default-base, which leaves out macvlan; \
             `transactional-update pkg install kernel-default` (or `zypper in kernel-default` \
             and remove kernel-default-base), then reboot. Other distributions: install the \
             linux-modules-extra / kernel-modules package for the running kernel",
        )
    } else {
        c
    }
}

/// Runs every check for `cfg`.
pub async fn run(cfg: &Config, args: &PreflightArgs) -> Report {
    let mut report = Report::default();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = check_capabilities(&status);
    let has_raw = parse_cap_eff(&status).is_some_and(|e| e & (1 << CAP_NET_RAW) != 0);
    report.checks.push(caps);
    report.checks.push(check_dhcp6_port(&status, cfg.services));
    run_network(cfg, args, has_raw, &mut report).await;
    run_nftables(cfg, &mut report).await;
    if cfg.routing_table.is_some() {
        report.checks.push(check_tun(open_rw(TUN_DEVICE)));
        report.checks.push(check_ipv6_route_gc(
            std::fs::read_to_string(IPV6_ROUTE_GC)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            open_rw(IPV6_ROUTE_GC),
        ));
    }
    report.checks.push(run_macvlan(cfg).await);
    if cfg.services {
        report.checks.push(dhcp_parent(cfg).await);
    }
    run_cluster(cfg, &mut report).await;
    report
}

/// The netlink rows of [`run`]: `interface`, `vip-address:<ip>`, `vip-free:<ip>` and
/// `arp-flux` (S36).
async fn run_network(cfg: &Config, args: &PreflightArgs, has_raw: bool, report: &mut Report) {
    match NetlinkKernel::new() {
        Err(e) => report.checks.push(
            Check::new("interface", Status::Fail, format!("netlink: {e}"))
                .fix("run on Linux with NET_ADMIN"),
        ),
        Ok(k) => {
            let vip_link = check_interface(&k, cfg, report).await;
            if cfg.control_plane {
                let edges = crate::controlplane::subnet_edges(&k, &cfg.controlplane()).await;
                report.checks.extend(check_vip_addresses(&edges));
            }
            check_vips_free(&k, cfg, args, vip_link.as_ref(), has_raw, report).await;
            if !cfg.binds_addresses() {
                report.checks.push(Check::new(
                    "arp-flux",
                    Status::Skip,
                    "routing-table mode: no VIP address on any interface, nothing answered on the segment",
                ));
                return;
            }
            // ARP flux (S36).
            let guard = crate::net::NftArpGuard::check().await;
            let targets = cfg.arp_flux_targets(&k).await;
            match arpflux::check(&k, &targets).await {
                Ok(findings) => report
                    .checks
                    .extend(check_arp_flux(&targets, &findings, &guard)),
                Err(e) => report.checks.push(
                    Check::new("arp-flux", Status::Fail, format!("netlink: {e}"))
                        .fix("run on Linux with NET_ADMIN"),
                ),
            }
        }
    }
}

/// The TUN device routing-table mode opens for every IPv4 VIP route's fence device.
const TUN_DEVICE: &str = "/dev/net/tun";
/// The IPv6 route collector's interval, seconds (`net.ipv6.route.gc_interval`).
const IPV6_ROUTE_GC: &str = "/proc/sys/net/ipv6/route/gc_interval";

/// Opens `path` for reading and writing and closes it again (nothing is written): `Err`
/// with the OS error when that is refused.
fn open_rw(path: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The `tun` row (routing-table mode): whether `/dev/net/tun` opened read-write.
pub(crate) fn check_tun(opened: Result<(), String>) -> Check {
    match opened {
        Ok(()) => Check::new(
            "tun",
            Status::Pass,
            format!("{TUN_DEVICE} opens read-write: IPv4 VIP routes get their fence devices"),
        ),
        Err(e) => Check::new(
            "tun",
            Status::Fail,
            format!("{TUN_DEVICE}: {e}: every IPv4 VIP route sits on a TUN fence device, so none would be added"),
        )
        .fix("run vipd privileged in a container (`vipd manifest pod|daemonset --table` does), or with DeviceAllow=/dev/net/tun rw under systemd (`vipd manifest systemd` does), on a kernel with CONFIG_TUN"),
    }
}

/// The `ipv6-route-gc` row (routing-table mode): `interval` is the current
/// `net.ipv6.route.gc_interval` in seconds (`None`: no IPv6 here), `writable` whether it
/// opened for writing.
pub(crate) fn check_ipv6_route_gc(interval: Option<u64>, writable: Result<(), String>) -> Check {
    const NAME: &str = "ipv6-route-gc";
    match (interval, writable) {
        (None, _) => Check::new(NAME, Status::Skip, "no IPv6 in this network namespace"),
        (Some(n), Ok(())) => Check::new(
            NAME,
            Status::Pass,
            format!("net.ipv6.route.gc_interval is writable (now {n} s; vipd sets 1 s: an expired IPv6 VIP route goes within its lifetime + 1 s)"),
        ),
        (Some(n), Err(_)) if n <= 1 => Check::new(
            NAME,
            Status::Pass,
            format!("net.ipv6.route.gc_interval is {n} s (read-only here, and already what vipd wants)"),
        ),
        (Some(n), Err(e)) => Check::new(
            NAME,
            Status::Warn,
            format!("net.ipv6.route.gc_interval is {n} s and read-only here ({e}): an expired IPv6 VIP route (a frozen vipd's) stays up to {n} s past its lifetime"),
        )
        .fix("run vipd privileged in a container (`vipd manifest pod|daemonset --table` does), or keep /proc/sys/net/ipv6/route writable under systemd (`vipd manifest systemd` does), or set it to 1 on the node"),
    }
}

/// The nftables rows of [`run`]: the control-plane load balancer's `lb-nftables`, the
/// `nft-fence` and `egress`.
async fn run_nftables(cfg: &Config, report: &mut Report) {
    // Control-plane load balancer.
    let lb = match (&cfg.load_balancer, cfg.control_plane) {
        (Some(_), true) => Some(crate::controlplane::lb::check().await),
        _ => None,
    };
    report.checks.push(check_lb_nftables(lb.as_ref()));
    let fence = match cfg.nft_fence.wanted() && cfg.binds_addresses() {
        true => Some(crate::net::nft::fence::NftFence::check().await),
        false => None,
    };
    let needs_ms = (cfg.control_plane && crate::lease::needs_nft_fence(&cfg.lease.timing))
        || (cfg.services && crate::lease::needs_nft_fence(&cfg.services_timing));
    report.checks.push(match cfg.routing_table {
        None => check_nft_fence(fence.as_ref(), needs_ms),
        Some(_) => Check::new(
            "nft-fence",
            Status::Skip,
            "routing-table mode: the VIPs are host routes, fenced by their lifetime (the route fence), not by nftables",
        ),
    });
    let egress = match cfg.services && cfg.nft_fence.wanted() {
        true => Some(crate::net::nft::egress::check().await),
        false => None,
    };
    let cilium = std::path::Path::new("/sys/class/net/cilium_host").exists();
    report.checks.push(check_egress(egress.as_ref(), cilium));
}

/// The `macvlan` row of [`run`], from the kernel and the running kernel's module lists.
async fn run_macvlan(cfg: &Config) -> Check {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    let read = |f: &str| std::fs::read_to_string(format!("/lib/modules/{release}/{f}")).ok();
    let kernel = match crate::net::macvlan::NetlinkMacvlans::new() {
        Ok(k) => k.kernel_has_macvlan().await.ok(),
        Err(_) => None,
    };
    check_macvlan(
        kernel,
        std::path::Path::new("/sys/module/macvlan").exists(),
        read("modules.dep").as_deref(),
        read("modules.builtin").as_deref(),
        cfg.services,
    )
}

/// The cluster rows of [`run`]: `api`, `peer-key` and `rbac`.
async fn run_cluster(cfg: &Config, report: &mut Report) {
    // API and RBAC.
    let client = check_api(cfg, report).await;
    if let Some(c) = &client {
        explain_answers_by_holder(c, cfg, report).await;
    }
    let ride_through = cfg.services && cfg.services_ride_through;
    match (&client, ride_through) {
        (_, false) => report.checks.push(Check::new(
            "peer-key",
            Status::Skip,
            "svc_ridethrough is off",
        )),
        (None, true) => {
            report
                .checks
                .push(Check::new("peer-key", Status::Skip, "needs the API server"))
        }
        (Some(c), true) => report.checks.push(check_peer_key(
            crate::peer::key::read_peer_key(c, &cfg.lease.namespace, Duration::ZERO).await,
        )),
    }
    match client {
        None => report
            .checks
            .push(Check::new("rbac", Status::Skip, "needs the API server")),
        Some(c) => report.checks.push(check_rbac(c, cfg).await),
    }
}

#[cfg(test)]
mod tests;
