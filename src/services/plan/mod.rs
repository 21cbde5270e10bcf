//! The Services wing's decisions, pure: no tokio, no `kube::Client`, no kernel. The runtime
//! feeds them the watched objects and applies what they decide.

pub(crate) mod decide;
pub mod desired;
pub mod governance;
pub mod model;
pub(crate) mod notes;
pub mod reasons;
pub mod security;
