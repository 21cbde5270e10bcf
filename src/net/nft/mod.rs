//! nftables from vipd: the ARP flux guard ([`arp_guard`]), the fence ([`fence`]), Service
//! security ([`svcsec`]), egress ([`egress`]) and the control-plane load balancer
//! ([`crate::controlplane::lb::nft`]) change their tables through netlink from vipd's own
//! process ([`nl`]). No `nft` process runs; `nft list table ...` stays a debugging tool.

pub mod arp_guard;
pub mod egress;
pub mod fence;
pub mod nl;
pub mod svcsec;
