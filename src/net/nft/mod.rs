//! nftables from vipd: the ARP flux guard ([`arp_guard`]), the fence ([`fence`]) and
//! Service security ([`svcsec`]) change their tables through netlink from vipd's own
//! process ([`nl`]); the control-plane load balancer still runs the `nft` binary
//! (`run_nft`, [`NftBatch`]) until it is ported to [`nl`].

pub mod arp_guard;
pub mod fence;
pub mod nl;
mod run;
pub mod svcsec;

pub use run::NftBatch;
pub(crate) use run::run_nft;
