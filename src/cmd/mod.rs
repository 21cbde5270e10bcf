//! The `vipd` subcommands, one module each. A command composes the layers below it
//! (config, wings, cores, foundation) and never imports another command.

pub mod drain;
pub mod manager;
pub mod manifest;
pub mod preflight;
pub mod probe;
pub mod status;
