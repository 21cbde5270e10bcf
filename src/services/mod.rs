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
//! * [`runtime`]: the watches and the per-Lease group tasks.

pub mod desired;
pub mod endpoints;
pub mod governance;
pub mod lease_gc;
pub mod model;
pub mod runtime;
pub mod status;
