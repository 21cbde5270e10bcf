//! What vipd's nftables fence lets a node answer, read from its tables with `nft -j`: the
//! lab tests and the benches count a node as carrying a VIP only when its fence lets it
//! answer (docs/design.md, "The second line": a killed or frozen holder's Service VIP address
//! stays on eth0, inert, after its element expired).

use std::net::IpAddr;

use super::Lab;

/// vipd's nftables fence on one node, as read at one moment: the fenced VIPs and those whose
/// element is live (sets `vips`/`live` of `arp vipd_fence`, `vips6`/`live6` of
/// `inet vipd_fence`).
#[derive(Debug, Default)]
pub struct FenceView {
    armed: Vec<IpAddr>,
    live: Vec<IpAddr>,
}

impl FenceView {
    /// A view with `armed` the fenced VIPs and `live` those whose element is live (as
    /// [`FenceView::read`] finds them).
    pub fn new(armed: Vec<IpAddr>, live: Vec<IpAddr>) -> Self {
        FenceView { armed, live }
    }

    /// Reads both fence tables of `node` (two `nft` runs; a missing table reads as empty).
    pub fn read(lab: &Lab, node: &str) -> Self {
        let mut view = FenceView::default();
        for family in ["arp", "inet"] {
            let Ok(out) =
                lab.exec_unchecked(node, "nft", &["-j", "list", "table", family, "vipd_fence"])
            else {
                continue;
            };
            if !out.status.success() {
                continue;
            }
            let Ok(json) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                continue;
            };
            for item in json["nftables"].as_array().into_iter().flatten() {
                let set = &item["set"];
                let into = match set["name"].as_str() {
                    Some("vips" | "vips6") => &mut view.armed,
                    Some("live" | "live6") => &mut view.live,
                    _ => continue,
                };
                // Plain sets list addresses; sets with timeouts `{"elem": {"val": ...}}`.
                into.extend(
                    set["elem"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|e| e.as_str().or_else(|| e["elem"]["val"].as_str()))
                        .filter_map(|a| a.parse::<IpAddr>().ok()),
                );
            }
        }
        view
    }

    /// Whether the fence lets `ip` be answered: not a fenced VIP here, or its element live.
    /// A Service VIP's address is the fence's second line (docs/design.md, "The second
    /// line"): a killed or frozen holder's address stays on eth0 for up to 300 s after its
    /// element expired, inert (its ARP requests, neighbour solicitations and packets
    /// dropped), so it carries nothing.
    pub fn answers(&self, ip: IpAddr) -> bool {
        !self.armed.contains(&ip) || self.live.contains(&ip)
    }
}
