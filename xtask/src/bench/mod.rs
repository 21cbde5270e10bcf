//! `cargo xtask bench ...`: benchmarks that print figures (failover against keepalived,
//! LoadBalancer Services at scale and under churn, the peer protocol's heartbeat cost, the
//! flapping guard under API server load, IPAM allocation, the kernel's cost per address
//! operation, the nftables fence's cost per renewal), the harness they share ([`harness`]) and their statistics.

pub mod addrs;
pub mod apiload;
pub mod failover;
pub mod fence;
pub mod harness;
pub mod heartbeat;
pub mod ipam;
pub mod services;
pub mod stats;
