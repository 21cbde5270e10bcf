//! LoadBalancer Services: watch Services and Endpoints, decide which addresses exist and
//! which Lease governs each ([`desired`]), run one election + VIP holder per Lease, and
//! write status, the `kube-vip.io/vipHost` annotation and Events back (only from the holder,
//! only when they change).
//!
//! * [`model`]: the pure view of a Service (kube-vip annotations, address parsing, class
//!   filter).
//! * [`endpoints`]: ready local endpoints (externalTrafficPolicy Local).
//! * [`desired`]: the plan (pure).
//! * [`governance`]: governance moves between leases: who may bind a moved address when
//!   (S34).
//! * [`lease_gc`]: deletes per-Service leases whose Services are gone (holder down at the
//!   time), never a lease vipd did not create.
//! * [`status`]: status / annotation / Event writer.
//! * [`runtime`]: the orchestration: [`start`] / [`Running::stop`], the main loop.
//! * `group`: one task per Lease: election, VIP holder, status while leading.
//! * `dhcp_clients`: DHCP mode (issue 13): the DHCP clients of a group while it leads,
//!   their leased addresses as VIPs, their Events and annotations.
//! * `decide`: the orchestration's decisions, pure and unit-tested (which groups stop,
//!   start or change, which leases are deleted, when status is written).
//! * `select`: which Services are candidates and what to report about the others (pure
//!   apart from the node's connected subnets).
//! * `sync`: status, `kube-vip.io/vipHost` and Events kept level-triggered, with retries.
//! * `watch`: the reflectors and the endpoint cache.

mod dhcp_clients;
pub mod endpoints;
pub mod governance;
mod group;
pub mod health;
pub mod lease_gc;
pub mod plan;
pub mod runtime;
mod select;
mod settings;
mod shared;
pub mod status;
mod sync;
mod watch;

pub use runtime::{Parts, Running, ServicesError, start};
pub use settings::Settings;
