//! The Services wing: `type: LoadBalancer` Services. Watch Services and Endpoints, decide
//! which addresses exist and which Lease governs each ([`plan`]), run one election + VIP
//! holder per Lease, and publish status, the `kube-vip.io/vipHost` annotation and Events
//! (only from the holder, only when they change).
//!
//! * [`plan`]: the pure decisions: the Service model (kube-vip annotations, address
//!   parsing, class filter), the desired leases and addresses, the orchestration's
//!   decisions, governance moves (S34), Event reasons and notes. No tokio, no API client.
//! * [`settings`](Settings): what the wing reads of the configuration.
//! * `select`: which Services are candidates and what to report about the others (pure
//!   apart from the node's connected subnets).
//! * [`endpoints`]: ready local endpoints (externalTrafficPolicy Local).
//! * [`governance`]: when a retiring lease lets go (S34), and following it.
//! * [`lease_gc`]: deletes per-Service leases whose Services are gone (holder down at the
//!   time), never a lease vipd did not create.
//! * [`publish`]: status / annotation writer and the Services' Events.
//! * [`runtime`]: the orchestration: [`start`] / [`Running::stop`], the main loop;
//!   `shared`: what every group task shares.
//! * `group`: one task per Lease: election, VIP holder, status while leading; [`health`]:
//!   the data-path check of its holder.
//! * `security`: service security (`enable_service_security`): vipd's `inet vipd_svcsec`
//!   table kept equal to what the groups announce ([`plan::security`]).
//! * `dhcp_clients`: DHCP mode (issue 13): the DHCP clients of a group while it leads,
//!   their leased addresses as VIPs, their Events and annotations.
//! * `sync`: status, `kube-vip.io/vipHost` and Events kept level-triggered, with retries.
//! * `watch`: the reflectors and the endpoint cache.

mod dhcp_clients;
pub mod endpoints;
pub mod governance;
mod group;
pub mod health;
pub mod lease_gc;
pub mod metrics;
pub mod plan;
pub mod publish;
mod route_mode;
pub mod runtime;
mod security;
mod select;
mod settings;
mod shared;
mod sync;
mod watch;

pub use runtime::{Parts, Running, ServicesError, start};
pub use settings::Settings;
