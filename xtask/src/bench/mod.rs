//! `cargo xtask bench ...`: benchmarks that print figures (failover against keepalived,
//! LoadBalancer Services at scale and under churn) and their shared statistics.

pub mod failover;
pub mod services;
pub mod stats;
