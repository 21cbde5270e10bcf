//! What runs on the lab nodes in a failover run: vipd with its lease timings, or keepalived
//! in one of its VRRP variants.

use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use xtask::lab::{self, NODES};

use super::VIP;

/// vipd lease timings of a run: `None` = vipd's defaults (the `vip_lease*` variables
/// unset), else (lease duration, renew deadline, retry period) in seconds as given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// `default`, `fast` or `LEASE/RENEW/RETRY[+nft]`, as printed.
    pub label: String,
    /// `vip_leaseduration`, `vip_renewdeadline`, `vip_retryperiod` values (seconds).
    pub values: Option<[String; 3]>,
    /// Run with the nftables fence (`vip_nftfence=true`), which sub-second timings need.
    #[serde(default)]
    pub nft_fence: bool,
}

/// The `fast` profile (docs/failover.md): lease 0.6 s, renew deadline 0.4 s, retry 0.2 s
/// (5 Lease writes/s), with the millisecond nftables fence.
pub const FAST_PROFILE: &str = "0.6/0.4/0.2+nft";

impl Timings {
    /// Parses `default`, `fast` ([`FAST_PROFILE`]) or `LEASE/RENEW/RETRY` (positive decimal
    /// seconds, lease > renew > retry), optionally followed by `+nft` (the nftables fence).
    ///
    /// # Errors
    /// Names the value and what is wrong with it.
    pub fn parse(s: &str) -> Result<Timings> {
        if s == "default" {
            return Ok(Timings {
                label: s.to_string(),
                values: None,
                nft_fence: false,
            });
        }
        if s == "fast" {
            return Ok(Timings {
                label: s.to_string(),
                ..Timings::parse(FAST_PROFILE)?
            });
        }
        let (body, nft_fence) = match s.strip_suffix("+nft") {
            Some(b) => (b, true),
            None => (s, false),
        };
        let parts: Vec<&str> = body.split('/').collect();
        let [l, r, p] = parts.as_slice() else {
            bail!(
                "invalid --timings value {s:?}: expected `default`, `fast` or LEASE/RENEW/RETRY seconds, e.g. 5/3/1 (add +nft for the nftables fence)"
            );
        };
        let num = |x: &str| -> Result<f64> {
            x.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| {
                    anyhow!(
                        "invalid --timings value {s:?}: {x:?} is not a positive number of seconds"
                    )
                })
        };
        let (lv, rv, pv) = (num(l)?, num(r)?, num(p)?);
        if !(lv > rv && rv > pv) {
            bail!("invalid --timings value {s:?}: need lease > renew deadline > retry period");
        }
        Ok(Timings {
            label: s.to_string(),
            values: Some([l.to_string(), r.to_string(), p.to_string()]),
            nft_fence,
        })
    }
}

/// A keepalived variant of the bench: the VRRP version and advertisement interval of
/// [`keepalived_conf`] (everything else is the same recipe). Only the constants exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vrrp {
    label: &'static str,
    version: u8,
    /// Advertisement interval in centiseconds (VRRPv3's unit, RFC 5798 §5.2.7; VRRPv2
    /// only knows whole seconds, RFC 3768 §5.3.7).
    advert_cs: u16,
}

impl Vrrp {
    /// `keepalived`: VRRPv2 (keepalived's default), `advert_int 1`.
    pub const CLASSIC: Vrrp = Vrrp {
        label: "keepalived",
        version: 2,
        advert_cs: 100,
    };
    /// `keepalived-fast`: VRRPv3, `advert_int 0.1` (keepalived's sub-second adverts need
    /// VRRPv3).
    pub const FAST: Vrrp = Vrrp {
        label: "keepalived-fast",
        version: 3,
        advert_cs: 10,
    };
    /// Both variants, in the order they run.
    pub const ALL: [Vrrp; 2] = [Vrrp::CLASSIC, Vrrp::FAST];

    /// Label in tables and JSON: `keepalived` or `keepalived-fast`.
    pub fn label(self) -> &'static str {
        self.label
    }

    /// VRRP version (`vrrp_version` in global_defs): 2 or 3.
    pub fn version(self) -> u8 {
        self.version
    }

    /// Advertisement interval (`advert_int`).
    pub fn advert(self) -> Duration {
        Duration::from_millis(u64::from(self.advert_cs) * 10)
    }

    /// Master-down interval of a BACKUP with priority 100: 3 x advert + skew, skew =
    /// (256 - priority) / 256 x advert (RFC 5798 §6.1; RFC 3768 §6.1 with the advert in
    /// whole seconds gives the same). 3.61 s for `keepalived`, 0.36 s for `keepalived-fast`.
    pub fn master_down(self) -> Duration {
        self.advert().mul_f64(3.0 + (256.0 - 100.0) / 256.0)
    }
}

/// What runs on the nodes.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// vipd in control-plane mode with these timings.
    Vipd(Timings),
    /// keepalived with this VRRP variant, see [`keepalived_conf`].
    Keepalived(Vrrp),
}

impl Subject {
    /// Label in tables: `vipd default`, `vipd 5/3/1`, `keepalived`, `keepalived-fast`.
    pub fn label(&self) -> String {
        match self {
            Subject::Vipd(t) => format!("vipd {}", t.label),
            Subject::Keepalived(v) => v.label().into(),
        }
    }
}

/// keepalived configuration of `node`: the common two-tier HA recipe, one MASTER with
/// priority 101 (node-a) and BACKUPs with priority 100, preemption on (keepalived's
/// default), multicast, virtual router id 51, no authentication, `192.0.2.10/32 dev eth0`,
/// with the VRRP version (`vrrp_version` in global_defs) and `advert_int` of `vrrp`
/// ([`Vrrp::CLASSIC`]: 2 and 1 s, [`Vrrp::FAST`]: 3 and 0.1 s). Everything else is
/// keepalived's default (5 gratuitous ARPs at the transition to MASTER, again 5 s later).
pub fn keepalived_conf(node: &str, vrrp: Vrrp) -> String {
    let (state, prio) = if node == NODES[0] {
        ("MASTER", 101)
    } else {
        ("BACKUP", 100)
    };
    // f64's Display prints 1.0 as `1` and 0.1 as `0.1`.
    let advert = vrrp.advert().as_secs_f64();
    format!(
        "global_defs {{\n    router_id {node}\n    vrrp_version {version}\n}}\n\n\
         vrrp_instance VI_CP {{\n    state {state}\n    interface {eth}\n    virtual_router_id 51\n    \
         priority {prio}\n    advert_int {advert}\n    virtual_ipaddress {{\n        {VIP}/32 dev {eth}\n    }}\n}}\n",
        version = vrrp.version(),
        eth = lab::ETH
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalived_conf_is_the_documented_recipe() {
        for vrrp in Vrrp::ALL {
            let a = keepalived_conf("node-a", vrrp);
            assert!(
                a.contains("state MASTER") && a.contains("priority 101"),
                "{a}"
            );
            for n in ["node-b", "node-c"] {
                let b = keepalived_conf(n, vrrp);
                assert!(
                    b.contains("state BACKUP") && b.contains("priority 100"),
                    "{b}"
                );
            }
            assert!(
                a.contains("virtual_router_id 51") && a.contains("192.0.2.10/32 dev eth0"),
                "{a}"
            );
        }
        let lines =
            |c: String| -> Vec<String> { c.lines().map(|l| l.trim().to_string()).collect() };
        let classic = lines(keepalived_conf("node-b", Vrrp::CLASSIC));
        assert!(classic.contains(&"vrrp_version 2".into()), "{classic:?}");
        assert!(classic.contains(&"advert_int 1".into()), "{classic:?}");
        let fast = lines(keepalived_conf("node-b", Vrrp::FAST));
        assert!(fast.contains(&"vrrp_version 3".into()), "{fast:?}");
        assert!(fast.contains(&"advert_int 0.1".into()), "{fast:?}");
        // Only the version and the advert interval differ.
        let differing: Vec<_> = classic.iter().filter(|l| !fast.contains(l)).collect();
        assert_eq!(differing, ["vrrp_version 2", "advert_int 1"]);
        assert_eq!(Vrrp::CLASSIC.label(), "keepalived");
        assert_eq!(Vrrp::FAST.label(), "keepalived-fast");
        assert_eq!(Vrrp::CLASSIC.master_down().as_millis(), 3609);
        assert_eq!(Vrrp::FAST.master_down().as_millis(), 360);
    }
}
