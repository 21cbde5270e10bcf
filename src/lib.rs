//! vipd: an on-node VIP announcer for Kubernetes (kube-vip ARP mode, done safer).
//!
//! The modules form five floors and imports only go down (docs/design.md, "The house";
//! `src/layers.rs` holds the table and the unit tests that keep it):
//!
//! 5. commands: `main.rs` and [`cmd`] (one module per `vipd` subcommand; no command imports
//!    another);
//! 4. [`config`]: resolves kube-vip's flags and environment into one `Config` and composes
//!    each component's own `Settings` from it;
//! 3. wings: [`controlplane`] (with its load balancer), [`services`] (with its pure
//!    `plan`) and [`ipam`] (Service address allocation, with its pure core), which never
//!    import each other;
//! 2. cores: [`election`] (with identity), and above it [`holder`], [`peer`], [`nodes`] and
//!    [`dhcp`];
//! 1. foundation: [`lease`], [`kube`], [`net`], [`obs`] and [`syntax`], which import no
//!    domain module.

pub mod cmd;
pub mod config;
pub mod controlplane;
pub mod dhcp;
pub mod egress;
pub mod election;
pub mod holder;
pub mod ipam;
pub mod kube;
#[cfg(test)]
mod layers;
pub mod lease;
pub mod net;
pub mod nodes;
pub mod obs;
pub mod peer;
pub mod routed;
pub mod services;
pub mod syntax;
