//! The node's network rows of `vipd preflight`: the VIP `interface`, one `vip-free:<vip>`
//! conflict probe per control-plane VIP, and the `dhcp-parent` of DHCP Services' macvlans.

use std::net::IpAddr;
use std::time::Duration;

use crate::config::Config;
use crate::net::conflict::{RawConflictMonitor, fmt_mac, probe_for};
use crate::net::{Kernel, LinkInfo, NetlinkKernel};

use super::{Check, PreflightArgs, Report, Status};

/// The `dhcp-parent` row for the macvlans of DHCP Services (address `0.0.0.0` / `::`):
/// `vip_servicesinterface`, else
/// `vip_interface`, else the IPv4 default route's interface (what the manager uses when a
/// Service names none with `kube-vip.io/serviceInterface`).
pub(super) async fn dhcp_parent(cfg: &Config) -> Check {
    let configured = cfg.services_interface.clone().or(cfg.interface.clone());
    let found = match NetlinkKernel::new() {
        Err(e) => Err(format!("netlink: {e}")),
        Ok(k) => match &configured {
            Some(name) => k.link_by_name(name).await.map_err(|e| e.to_string()),
            None => {
                let any = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
                match k.choose_interface(any).await {
                    Ok(idx) => k.link_by_index(idx).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    };
    check_dhcp_parent(
        configured.as_deref(),
        found.as_ref().map_err(String::as_str),
    )
}

/// The `dhcp-parent` row from the configured parent name (`None`: automatic) and what the
/// lookup found: pass when the link is up with carrier, a warning naming it (or the lookup's
/// error) otherwise: only DHCP Services need it, and they get a `DHCPFailed` Warning Event.
/// Pure.
pub(crate) fn check_dhcp_parent(configured: Option<&str>, found: Result<&LinkInfo, &str>) -> Check {
    const NAME: &str = "dhcp-parent";
    let how = match configured {
        Some(_) => "configured",
        None => "the IPv4 default route's interface",
    };
    match found {
        Ok(l) if l.up && l.carrier => Check::new(
            NAME,
            Status::Pass,
            format!("DHCP macvlans go on {} ({how}), up with carrier", l.name),
        ),
        Ok(l) => Check::new(
            NAME,
            Status::Warn,
            format!(
                "DHCP macvlans' parent {} ({how}): up={} carrier={}",
                l.name, l.up, l.carrier
            ),
        )
        .fix(format!("bring the link up: ip link set {} up", l.name)),
        Err(e) => Check::new(
            NAME,
            Status::Warn,
            match configured {
                Some(name) => format!("DHCP macvlans' parent {name:?} ({how}): {e}"),
                None => format!("no parent for DHCP macvlans ({how}): {e}"),
            },
        )
        .fix("set vip_servicesinterface (or vip_interface) to an interface of this node (ip -br link)"),
    }
}

/// The `interface` row: `vip_interface`, else the interface chosen for the first VIP, up
/// with carrier. Returns the link when it is usable.
pub(super) async fn check_interface(
    k: &NetlinkKernel,
    cfg: &Config,
    report: &mut Report,
) -> Option<LinkInfo> {
    // Without vip_interface the manager picks, per address, the interface whose subnet holds
    // it, else the IPv4 default route's: the control-plane VIP's, or (Services only, e.g.
    // Harvester's guest chart) vip_servicesinterface, else the default route's, where
    // Service VIPs of no connected subnet and DHCP macvlans go.
    let services_only = cfg.addresses.is_empty();
    let mut iface_name = cfg.interface.clone().or_else(|| {
        services_only
            .then(|| cfg.services_interface.clone())
            .flatten()
    });
    let target = cfg
        .addresses
        .first()
        .copied()
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    if iface_name.is_none()
        && let Ok(idx) = k.choose_interface(target).await
        && let Ok(l) = k.link_by_index(idx).await
    {
        iface_name = Some(l.name);
    }
    let Some(name) = iface_name else {
        let check = if services_only {
            // Service VIPs on a connected subnet still find their interface.
            Check::new(
                "interface",
                Status::Warn,
                "no vip_interface and no IPv4 default route: Service VIPs outside every connected subnet and DHCP Services have no interface",
            )
        } else {
            Check::new(
                "interface",
                Status::Fail,
                "no vip_interface and none chosen automatically",
            )
        };
        report
            .checks
            .push(check.fix("set vip_interface (--interface)"));
        return None;
    };
    match k.link_by_name(&name).await {
        Ok(l) if l.carrier && l.up => {
            report.checks.push(Check::new(
                "interface",
                Status::Pass,
                format!("{name} is up with carrier"),
            ));
            Some(l)
        }
        Ok(l) => {
            report.checks.push(
                Check::new(
                    "interface",
                    Status::Fail,
                    format!("{name}: up={} carrier={}", l.up, l.carrier),
                )
                .fix(format!(
                    "plug the cable / bring the link up: ip link set {name} up"
                )),
            );
            None
        }
        Err(e) => {
            report.checks.push(
                Check::new("interface", Status::Fail, e.to_string())
                    .fix("set vip_interface to an interface of this node (ip -br link)"),
            );
            None
        }
    }
}

/// One `vip-free:<vip>` row per control-plane VIP: an RFC 5227 probe (the manager's own)
/// on `vip_link`; a VIP this node carries now is not a conflict.
pub(super) async fn check_vips_free(
    k: &NetlinkKernel,
    cfg: &Config,
    args: &PreflightArgs,
    vip_link: Option<&LinkInfo>,
    has_raw: bool,
    report: &mut Report,
) {
    let local: Vec<IpAddr> = k
        .addresses(None)
        .await
        .map(|a| a.into_iter().map(|x| x.vip.addr).collect())
        .unwrap_or_default();
    for vip in &cfg.addresses {
        let name = format!("vip-free:{vip}");
        let c = match vip_link {
            _ if cfg.routing_table.is_some() => Check::new(
                name,
                Status::Skip,
                "routing-table mode: the VIP is routed, not answered on the segment (no probe sent)",
            ),
            _ if args.no_arp_probe => Check::new(name, Status::Skip, "--no-arp-probe"),
            _ if local.contains(vip) => Check::new(name, Status::Pass, "this node holds it now"),
            None => Check::new(name, Status::Skip, "needs a working interface"),
            _ if !has_raw => Check::new(name, Status::Skip, "needs CAP_NET_RAW"),
            Some(link) => {
                let listen = Duration::from_millis(args.arp_probe_ms);
                match probe_for(&RawConflictMonitor::new(), link, *vip, listen).await {
                    Ok(macs) if macs.is_empty() => Check::new(
                        name,
                        Status::Pass,
                        format!("no answer to a conflict probe within {} ms", args.arp_probe_ms),
                    ),
                    Ok(macs) => Check::new(
                        name,
                        Status::Fail,
                        format!(
                            "already in use on the segment by {}",
                            macs.into_iter().map(fmt_mac).collect::<Vec<_>>().join(", ")
                        ),
                    )
                    .fix("pick a free address, or stop whatever holds it (another kube-vip/keepalived?)"),
                    Err(e) => Check::new(name, Status::Fail, e.to_string()).fix("run with CAP_NET_RAW"),
                }
            }
        };
        report.checks.push(c);
    }
}
