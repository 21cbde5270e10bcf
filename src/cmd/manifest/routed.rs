//! `vipd manifest bird` and `vipd manifest frr`: the node's routing daemon configuration
//! (BIRD 2 `bird.conf`, FRR `frr.conf`) from kube-vip's `bgp_*` options, for routed
//! networks (issue 29): vipd keeps the VIP routes in a kernel table and the daemon
//! exports them over BGP with BFD. The options are read from the environment, the flags
//! and `--config-file` exactly as `vipd manager` reads its own
//! ([`crate::config::routed_settings`]); rendering is [`crate::routed::bird::render`] and
//! [`crate::routed::frr::render`].

use clap::Args;

use super::ManifestError;
use crate::config::{self, RoutedArgs};

/// `vipd manifest bird|frr` flags: kube-vip's BGP flags (each also read from its
/// environment variable, which wins, as in `vipd manager`).
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct RoutedManifestArgs {
    /// kube-vip's BGP options.
    #[command(flatten)]
    pub options: RoutedArgs,
}

/// The routing daemon to configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    /// BIRD 2 (`bird.conf`).
    Bird,
    /// FRR (`frr.conf`).
    Frr,
}

/// Renders `daemon`'s configuration for `settings`.
///
/// # Errors
/// [`ManifestError::Routed`] with the reason the daemon cannot do what the settings ask.
pub fn render(daemon: Daemon, settings: &crate::routed::Settings) -> Result<String, ManifestError> {
    let (name, out) = match daemon {
        Daemon::Bird => ("bird", crate::routed::bird::render(settings)),
        Daemon::Frr => ("frr", crate::routed::frr::render(settings)),
    };
    out.map_err(|e| ManifestError::Routed {
        daemon: name,
        reason: e.0,
    })
}

/// `vipd manifest bird|frr` with the given environment lookup and config-file text (pure;
/// [`run`] passes the process's).
///
/// # Errors
/// [`ManifestError::Bgp`] naming the setting and value, [`ManifestError::Routed`].
pub fn generate(
    daemon: Daemon,
    args: &RoutedManifestArgs,
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&str>,
) -> Result<String, ManifestError> {
    let settings = config::routed_settings(&args.options, env, file).map_err(ManifestError::Bgp)?;
    render(daemon, &settings)
}

/// `vipd manifest bird|frr` in the real process: environment, flags, `--config-file`.
///
/// # Errors
/// As [`generate`], and [`ManifestError::Bgp`] when the config file cannot be read.
pub fn run(daemon: Daemon, args: &RoutedManifestArgs) -> Result<String, ManifestError> {
    let settings =
        config::routed_settings_from_process(&args.options).map_err(ManifestError::Bgp)?;
    render(daemon, &settings)
}
