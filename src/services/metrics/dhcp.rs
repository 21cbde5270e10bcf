//! DHCP mode's metrics: per-Service client state, lease expiry and events.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `vipd_dhcp_state` | gauge | `service`, `family`, `state` | 1 for the DHCP client's current state (RFC 2131 / RFC 8415) of a `0.0.0.0` (`family="v4"`) or `::` (`family="v6"`) Service this node holds: `requesting`, `bound`, `renewing`, `rebinding`, `lost`, `gave_up` (`dhcp_backoff_attempts` attempts in a row failed: no more requests until the Service's DHCP request changes or its Lease changes holder); no series while no client runs |
//! | `vipd_dhcp_lease_expiry_timestamp_seconds` | gauge | `service`, `family` | Unix time at which the Service's DHCP lease expires (option 51 / the DHCPv6 valid lifetime, counted from the request); no series while unbound |
//! | `vipd_dhcp_events_total` | counter | `service`, `family`, `event` | `renewed` (the lease was extended, at T1 or T2), `failed` (an attempt to get a lease failed, the one that gives up too), `lost` (the lease ended: NAK, NoBinding or expiry), `nak` (of those, by a DHCPNAK; DHCPv6 has none) |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::obs::metrics::{Families, Registry};

/// The `state` values of `vipd_dhcp_state`.
pub(crate) const DHCP_STATES: [&str; 6] = [
    "requesting",
    "bound",
    "renewing",
    "rebinding",
    "lost",
    "gave_up",
];

/// The `event` values of `vipd_dhcp_events_total`.
pub(crate) const DHCP_EVENTS: [&str; 4] = ["renewed", "failed", "lost", "nak"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    service: String,
    family: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
    family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    service: String,
    family: String,
    event: String,
}

/// DHCP mode's families (see the module docs).
pub struct DhcpMetrics {
    state: Family<StateLabels, Gauge>,
    expiry: Family<ServiceLabels, Gauge>,
    events: Family<EventLabels, Counter>,
}

impl Families for DhcpMetrics {
    fn register(registry: &mut Registry, _node: &str) -> Self {
        let m = DhcpMetrics {
            state: Family::default(),
            expiry: Family::default(),
            events: Family::default(),
        };
        registry.register(
            "vipd_dhcp_state",
            "1 for the DHCP client's current state of a 0.0.0.0 Service this node holds",
            m.state.clone(),
        );
        registry.register(
            "vipd_dhcp_lease_expiry_timestamp_seconds",
            "Unix time at which the Service's DHCP lease expires",
            m.expiry.clone(),
        );
        registry.register(
            "vipd_dhcp_events",
            "DHCP client events of a Service: renewed, failed, lost, nak",
            m.events.clone(),
        );
        m
    }
}

impl DhcpMetrics {
    /// Sets `vipd_dhcp_state{service,family}` to `state` (one of `DHCP_STATES`) and
    /// `vipd_dhcp_lease_expiry_timestamp_seconds{service,family}` to `expiry` (Unix seconds;
    /// `None`: no series). `family`: `v4` or `v6`.
    pub fn state(&self, service: &str, family: &str, state: &str, expiry: Option<u64>) {
        let d = self;
        for s in DHCP_STATES {
            let labels = StateLabels {
                service: service.to_string(),
                family: family.to_string(),
                state: s.to_string(),
            };
            if s == state {
                d.state.get_or_create(&labels).set(1);
            } else {
                d.state.remove(&labels);
            }
        }
        let labels = ServiceLabels {
            service: service.to_string(),
            family: family.to_string(),
        };
        match expiry.and_then(|e| i64::try_from(e).ok()) {
            Some(e) => {
                d.expiry.get_or_create(&labels).set(e);
            }
            None => {
                d.expiry.remove(&labels);
            }
        }
    }

    /// Counts `event` (one of `DHCP_EVENTS`) for `service`'s `family` client.
    pub fn event(&self, service: &str, family: &str, event: &str) {
        self.events
            .get_or_create(&EventLabels {
                service: service.to_string(),
                family: family.to_string(),
                event: event.to_string(),
            })
            .inc();
    }

    /// Removes every DHCP series of `service`'s `family` client (it stopped).
    pub fn forget(&self, service: &str, family: &str) {
        self.state(service, family, "", None);
        for event in DHCP_EVENTS {
            self.events.remove(&EventLabels {
                service: service.to_string(),
                family: family.to_string(),
                event: event.to_string(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::metrics::Metrics;

    #[test]
    fn one_state_series_per_service_and_nothing_left_when_forgotten() {
        let metrics = Metrics::new("node-a");
        let m = metrics.families::<DhcpMetrics>();
        m.state("default/web", "v4", "requesting", None);
        m.state("default/web", "v4", "bound", Some(1_800_000_000));
        m.state("default/web", "v6", "requesting", None);
        m.event("default/web", "v4", "renewed");
        let text = metrics.encode();
        assert!(
            text.contains(r#"vipd_dhcp_state{service="default/web",family="v4",state="bound"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"vipd_dhcp_state{service="default/web",family="v6",state="requesting"} 1"#
            ),
            "{text}"
        );
        assert!(
            !text.contains(r#"family="v4",state="requesting""#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"vipd_dhcp_lease_expiry_timestamp_seconds{service="default/web",family="v4"} 1800000000"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"vipd_dhcp_events_total{service="default/web",family="v4",event="renewed"} 1"#
            ),
            "{text}"
        );
        m.forget("default/web", "v4");
        assert!(!metrics.encode().contains(r#"family="v4""#));
        m.forget("default/web", "v6");
        assert!(!metrics.encode().contains("default/web"));
    }

    #[test]
    fn gave_up_is_a_state_of_its_own() {
        let metrics = Metrics::new("node-a");
        let m = metrics.families::<DhcpMetrics>();
        m.state("default/web", "v6", "requesting", None);
        m.state("default/web", "v6", "gave_up", None);
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"vipd_dhcp_state{service="default/web",family="v6",state="gave_up"} 1"#
            ),
            "{text}"
        );
        assert!(!text.contains(r#"state="requesting""#), "{text}");
    }
}
