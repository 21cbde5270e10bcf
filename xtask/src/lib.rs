//! Developer tasks for vipd: the network lab (used by `cargo xtask` and by vipd's
//! integration tests as `xtask::lab`).

pub mod image;
pub mod lab;
