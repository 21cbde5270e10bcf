//! vipd: an on-node VIP announcer for Kubernetes (kube-vip ARP mode, done safer).
//!
//! The modules form five layers and imports only go down (docs/design.md, "The house";
//! the table is [`layers`]' and a unit test keeps it):
//!
//! 1. commands: `main.rs` and [`cmd`] (one module per `vipd` subcommand; no command imports
//!    another);
//! 2. [`config`]: resolves kube-vip's flags and environment into one `Config` and composes
//!    each component's own `Settings` from it;
//! 3. wings: [`controlplane`] (with its load balancer) and [`services`], which never import
//!    each other;
//! 4. cores: [`election`] (with identity), and above it [`holder`], [`peer`], [`nodes`] and
//!    [`dhcp`];
//! 5. foundation: [`lease`], [`kube`], [`net`], [`obs`] and [`syntax`], which import no
//!    domain module.

pub mod cmd;
pub mod config;
pub mod controlplane;
pub mod dhcp;
pub mod election;
pub mod holder;
pub mod kube;
#[cfg(test)]
mod layers;
pub mod lease;
pub mod net;
pub mod nodes;
pub mod obs;
pub mod peer;
pub mod services;
pub mod syntax;
