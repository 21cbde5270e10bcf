//! vipd: an on-node VIP announcer for Kubernetes (kube-vip ARP mode, done safer).
//!
//! Data flows one way (see `shared/design.md`): [`config`] -> [`election`] (Lease leader
//! election, client-go semantics plus a watch) -> [`holder`] (which VIPs this node holds,
//! applied through the [`net`] kernel layer with a kernel fence and gratuitous ARP).
//! [`manager`] wires them together for `vipd manager`; `main.rs` is a thin shell.

pub mod admin;
pub mod config;
pub mod controlplane;
pub mod dhcp;
pub mod drain;
pub mod election;
pub mod holder;
pub mod identity;
pub mod kubeclient;
pub mod lb;
pub mod logging;
pub mod manager;
pub mod manifest;
pub mod metrics;
pub mod net;
pub mod nodes;
pub mod overview;
pub mod peer;
pub mod preflight;
pub mod probe;
pub mod services;
pub mod syntax;
pub mod systemd;
