//! The reasons of the Events the Services wing writes (events.k8s.io/v1 `reason`,
//! PascalCase), one constant each.

/// Reason of [`crate::services::publish::ServiceEvent::announced`].
pub const REASON_ANNOUNCED: &str = "AddressAnnounced";
/// Reason of a Warning naming a rejected Service address value.
pub const REASON_INVALID_ADDRESS: &str = "InvalidAddress";
/// Normal Event: the holder handed the Service's addresses over (node not eligible).
pub const REASON_HANDED_OVER: &str = "HandedOver";
/// Reason of [`crate::services::publish::ServiceEvent::health_handover`].
pub const REASON_HEALTH_CHECK_FAILED: &str = "HealthCheckFailed";
/// Reason of a Warning about a Service address and port already used by another Service
/// (the Service is not announced on it).
pub const REASON_ADDRESS_CONFLICT: &str = "AddressConflict";
/// Reason of [`crate::services::publish::ServiceEvent::address_in_use`].
pub const REASON_ADDRESS_IN_USE: &str = "AddressInUse";
/// Reason of a Warning about a DHCP attempt that failed (no server, parent interface
/// missing, macvlan refused): the client tries again after a back-off.
pub const REASON_DHCP_FAILED: &str = "DHCPFailed";
/// Reason of a Warning about a DHCP lease that ended (NAK, expiry, conflict): the address
/// is removed at once and the client asks for it again.
pub const REASON_DHCP_LOST: &str = "DHCPLeaseLost";
/// Reason of the Warning about a DHCP client that gave up: `dhcp_backoff_attempts` attempts
/// in a row failed; it asks no more until the Service's DHCP request changes or the
/// Service's lease moves.
pub const REASON_DHCP_GAVE_UP: &str = "DHCPGaveUp";
/// Reason of a Warning about a Service not announced because an address it shared from a
/// DHCP Service's lease (`vipd.io/dhcp-lease`) is asked for by no DHCP Service any more.
pub const REASON_DHCP_LEASE_LAPSED: &str = "DHCPLeaseLapsed";
/// Reason of a Warning about a Service skipped for a configuration the user should fix
/// ([`crate::services::plan::model::SkipReason::warrants_warning`]).
pub const REASON_INVALID_CONFIG: &str = "InvalidConfiguration";
/// Reason of a Warning about a Service address that is the control-plane VIP (refused:
/// the control-plane lease governs that address, and no Service group announces it).
pub const REASON_CONTROL_PLANE_ADDRESS: &str = "ControlPlaneAddress";
/// Reason of a Warning about a Service address that is the network or broadcast address of
/// a subnet connected to the node or of the VIP's own prefix (`vip_subnet`); see
/// [`crate::net::subnet_edge_of`].
pub const REASON_UNUSABLE_ADDRESS: &str = "UnusableAddress";
/// Reason of a Warning about an `externalTrafficPolicy: Local` Service with no ready
/// endpoint on any node: announced nowhere, its status and `vipHost` are cleared.
pub const REASON_NO_LOCAL_ENDPOINT: &str = "NoLocalEndpoint";
/// Reason of a Warning about a Service address that is a node's own address.
pub const REASON_ADDRESS_OF_NODE: &str = "AddressOfNode";
/// Reason of the log line (no Event) about a Service without any address.
pub const REASON_NO_ADDRESS: &str = "NoAddress";
/// Reason of a Warning about a Service port service security cannot allow (a protocol
/// other than TCP, UDP and SCTP, a port outside 1-65535): traffic to the Service's VIPs on
/// it is dropped; its other ports pass.
pub const REASON_SERVICE_SECURITY_PORT: &str = "ServiceSecurityPortRefused";
