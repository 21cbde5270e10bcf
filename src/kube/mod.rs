//! The Kubernetes API as every part of vipd uses it: building clients.

pub mod client;
pub mod key;

pub use key::ObjectKey;
