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
//! * [`runtime`]: the orchestration: the main loop and the per-Lease group tasks.
//! * `select`: which Services are candidates and what to report about the others (pure
//!   apart from the node's connected subnets).
//! * `sync`: status, `kube-vip.io/vipHost` and Events kept level-triggered, with retries.
//! * `watch`: the reflectors and the endpoint cache.

pub mod desired;
pub mod endpoints;
pub mod governance;
pub mod lease_gc;
pub mod model;
pub mod runtime;
mod select;
pub mod status;
mod sync;
mod watch;
