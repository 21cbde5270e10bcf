//! `cargo xtask bench ...`: benchmarks that print figures (failover against keepalived,
//! LoadBalancer Services at scale and under churn, the peer protocol's heartbeat cost) and
//! their shared statistics.

pub mod failover;
pub mod heartbeat;
pub mod services;
pub mod stats;
