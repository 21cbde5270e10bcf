//! nftables from vipd, through the `nft` binary: the ARP flux guard ([`arp_guard`]), the
//! fence ([`fence`]), Service security ([`svcsec`]), and the transaction type and runner they and the control-plane load
//! balancer share ([`NftBatch`], `run_nft`).

pub mod arp_guard;
pub mod fence;
pub mod nl;
mod run;
pub mod svcsec;

pub use run::NftBatch;
pub(crate) use run::run_nft;
