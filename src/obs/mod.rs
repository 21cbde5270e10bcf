//! Observability shared by every layer: the metrics registry, readiness, log rate limiting
//! and the systemd notify protocol.

pub mod logging;
pub mod metrics;
pub mod readiness;
pub mod systemd;
