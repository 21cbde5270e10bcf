//! The Kubernetes API as every part of vipd uses it: building clients ([`client`]), one
//! key for namespaced objects ([`ObjectKey`]), Events ([`events::Recorder`]) and the
//! annotation names of `type: LoadBalancer` Services ([`service`]).

pub mod api;
pub mod calls;
pub mod client;
pub mod events;
#[cfg(test)]
pub(crate) mod fake_api;
pub mod key;
pub mod service;
pub mod watch;

pub use key::ObjectKey;
