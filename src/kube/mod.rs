//! The Kubernetes API as every part of vipd uses it: building clients ([`client`]), one
//! key for namespaced objects ([`ObjectKey`]) and Events ([`events::Recorder`]).

pub mod api;
pub mod client;
pub mod events;
pub mod key;

pub use key::ObjectKey;
