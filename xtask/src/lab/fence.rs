//! What vipd's nftables fence lets a node answer, read from its tables with `nft -j`: the
//! lab tests and the benches count a node as carrying a VIP only when its fence lets it
//! answer (docs/design.md, "The second line": a killed or frozen holder's Service VIP address
//! stays on eth0, inert, after its element expired).

use std::net::IpAddr;

use super::Lab;

/// vipd's nftables fence on one node, as read at one moment: the fenced VIPs and those whose
/// holder's element is live (the verdict maps `vips` of `arp vipd_fence` and `vips4`/`vips6`
/// of `inet vipd_fence`, each VIP jumping to its holder's chain `holder_<key>` or `drop`, and
/// each table's set `live` of the holders' keys).
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
            view.add_table(&json);
        }
        view
    }

    /// Adds what one table's `nft -j list table` output says.
    fn add_table(&mut self, json: &serde_json::Value) {
        let items: Vec<&serde_json::Value> =
            json["nftables"].as_array().into_iter().flatten().collect();
        // The holders whose element is live in this table.
        let live: Vec<String> = items
            .iter()
            .filter(|i| i["set"]["name"] == "live")
            .flat_map(|i| i["set"]["elem"].as_array().into_iter().flatten())
            .filter_map(|e| e["elem"]["val"].as_u64().or_else(|| e.as_u64()))
            .map(|k| format!("holder_{k}"))
            .collect();
        for item in &items {
            let map = &item["map"];
            if !matches!(map["name"].as_str(), Some("vips" | "vips4" | "vips6")) {
                continue;
            }
            // `[vip, {"jump": {"target": "holder_1"}}]` or `[vip, {"drop": null}]`.
            for e in map["elem"].as_array().into_iter().flatten() {
                let Some(vip) = e[0].as_str().and_then(|a| a.parse::<IpAddr>().ok()) else {
                    continue;
                };
                self.armed.push(vip);
                if e[1]["jump"]["target"]
                    .as_str()
                    .is_some_and(|chain| live.iter().any(|l| l == chain))
                {
                    self.live.push(vip);
                }
            }
        }
    }

    /// Whether `ip` is fenced here and its holder's element live.
    pub fn live(&self, ip: IpAddr) -> bool {
        self.live.contains(&ip)
    }

    /// Whether the fence lets `ip` be answered: not a fenced VIP here, or its element live.
    /// A Service VIP's address is the fence's second line (docs/design.md, "The second
    /// line"): a killed or frozen holder's address stays on eth0 for up to 300 s after its
    /// element expired, inert (its ARP requests, neighbour solicitations and packets
    /// dropped), so it carries nothing.
    pub fn answers(&self, ip: IpAddr) -> bool {
        !self.armed.contains(&ip) || self.live.contains(&ip)
    }

    /// [`Self::answers`] for an address listed before this view was read. On a node whose
    /// fence runs (it arms some VIP), one not fenced counts only if `still_listed()` (a
    /// listing after the read) still shows it: a holder that steps down disarms its VIPs
    /// once their addresses are gone, so an address listed while it was being removed
    /// reads as not fenced once the removal ended. On a node with nothing armed (no fence)
    /// an address is answered whenever it is there.
    pub fn answers_listed_before(&self, ip: IpAddr, still_listed: impl FnOnce() -> bool) -> bool {
        match (self.armed.contains(&ip), self.armed.is_empty()) {
            (true, _) => self.live.contains(&ip),
            (false, true) => true,
            (false, false) => still_listed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `nft -j list table inet vipd_fence` as nftables 1.0.6 prints it (trimmed): a VIP
    /// jumping to a live holder, one to a holder whose element expired, one dropped.
    #[test]
    fn a_vip_answers_when_its_holders_element_is_live() {
        let json: serde_json::Value = serde_json::from_str(
            r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"set": {"family": "inet", "name": "live", "table": "vipd_fence", "type": "mark",
              "flags": ["timeout"], "elem": [{"elem": {"val": 1, "timeout": 3, "expires": 2}}]}},
            {"map": {"family": "inet", "name": "vips6", "table": "vipd_fence", "type": "ipv6_addr",
              "map": "verdict", "elem": [["2001:db8::1", {"jump": {"target": "holder_1"}}],
              ["2001:db8::2", {"jump": {"target": "holder_2"}}], ["2001:db8::3", {"drop": null}]]}}]}"#,
        )
        .unwrap();
        let mut view = FenceView::default();
        view.add_table(&json);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(view.answers(ip("2001:db8::1")) && view.live(ip("2001:db8::1")));
        assert!(!view.live(ip("2001:db8::4")), "not fenced: not live either");
        assert!(
            !view.answers(ip("2001:db8::2")),
            "its holder's element expired"
        );
        assert!(!view.answers(ip("2001:db8::3")), "expired: dropped");
        assert!(view.answers(ip("2001:db8::4")), "not fenced here");
        // Listed before the read: an address not fenced counts only if still listed after.
        assert!(view.answers_listed_before(ip("2001:db8::4"), || true));
        assert!(
            !view.answers_listed_before(ip("2001:db8::4"), || false),
            "removed, then disarmed, between the listing and the read"
        );
        assert!(
            view.answers_listed_before(ip("2001:db8::1"), || panic!("armed: not listed again"))
        );
        assert!(!view.answers_listed_before(ip("2001:db8::2"), || true));
        // A node with no fence answers whatever it carries when listed.
        let unfenced = FenceView::default();
        assert!(
            unfenced
                .answers_listed_before(ip("2001:db8::4"), || panic!("no fence: not listed again"))
        );
    }
}
