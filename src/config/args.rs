//! `vipd manager`'s command line, generated from the option table: every row with a flag
//! becomes one clap argument (hidden for kube-vip options vipd ignores or refuses), so a
//! flag, its help, its env name and its default are written once, in [`super::options`].

use clap::{Arg, ArgAction, ArgMatches, Args, Command, CommandFactory, FromArgMatches, Parser};

use super::options::{EnvOption, K_CONFIG_FILE, OptionKind, ValueType, env_names};

/// `vipd manager`: run the VIP announcer (kube-vip `manager` compatible flags).
///
/// Every option can also be given by its kube-vip environment variable, which wins over
/// the flag (kube-vip's precedence); `--config-file` fills only what is still unset.
/// Values are kept as text here and parsed by [`super::resolve`], so errors name the flag
/// or variable and value the same way whichever source they come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManagerArgs {
    /// (environment variable name, flag value) for every flag given, in table order.
    given: Vec<(&'static str, String)>,
}

impl ManagerArgs {
    /// (environment variable name, flag value) for every flag given on the command line.
    pub(super) fn flag_values(&self) -> Vec<(&'static str, &str)> {
        self.given.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    /// `--config-file`, if given.
    pub fn config_file(&self) -> Option<&std::path::Path> {
        self.flag(K_CONFIG_FILE).map(std::path::Path::new)
    }

    /// The value given for the flag of env name `env`.
    pub(super) fn flag(&self, env: &str) -> Option<&str> {
        self.given
            .iter()
            .find(|(k, _)| *k == env)
            .map(|(_, v)| v.as_str())
    }
}

/// The clap argument of one table row (its id is the env name).
fn arg_of(o: &'static EnvOption) -> Arg {
    let mut arg = Arg::new(o.env)
        .long(o.flag)
        .value_name(o.value_name)
        .action(ArgAction::Set)
        .help(o.help_text())
        .hide(!matches!(
            o.kind,
            OptionKind::Supported | OptionKind::Alias(_)
        ));
    if let Some(c) = o.short {
        arg = arg.short(c);
    }
    // kube-vip's boolean flags (cobra BoolVar): `--arp` alone means true, a value needs `=`.
    if o.value_type == ValueType::Bool {
        arg = arg
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true");
    }
    arg
}

fn rows_with_flags() -> impl Iterator<Item = &'static EnvOption> {
    env_names().iter().filter(|o| !o.flag.is_empty())
}

impl Args for ManagerArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd.args(rows_with_flags().map(arg_of))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for ManagerArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = ManagerArgs::default();
        args.update_from_arg_matches(m)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for o in rows_with_flags() {
            if let Some(v) = m.get_one::<String>(o.env) {
                self.given.retain(|(k, _)| *k != o.env);
                self.given.push((o.env, v.clone()));
            }
        }
        Ok(())
    }
}

impl CommandFactory for ManagerArgs {
    fn command() -> Command {
        Self::augment_args(Command::new("manager").about(
            "Run the VIP manager: the control-plane VIP and LoadBalancer Service VIPs, through Lease leader election",
        ))
    }

    fn command_for_update() -> Command {
        Self::command()
    }
}

impl Parser for ManagerArgs {}

/// The flags of the kube-vip features vipd refuses (the option table's refused rows), for a
/// command that has its own flags (`vipd manifest pod|daemonset`): each is accepted by the
/// parser (hidden) and kept, so the command can refuse it with the table's reason instead of
/// clap's bare "unexpected argument". A flag the command already defines is left to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefusedFlags {
    /// (environment variable name, flag value) for every refused flag given.
    given: Vec<(&'static str, String)>,
}

impl RefusedFlags {
    /// (environment variable name, flag value) for every refused flag given.
    pub fn given(&self) -> &[(&'static str, String)] {
        &self.given
    }
}

fn refused_rows() -> impl Iterator<Item = &'static EnvOption> {
    rows_with_flags().filter(|o| matches!(o.kind, OptionKind::Refused(..)))
}

impl Args for RefusedFlags {
    fn augment_args(cmd: Command) -> Command {
        let taken: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        let new: Vec<Arg> = refused_rows()
            .filter(|o| !taken.iter().any(|t| t == o.flag))
            .map(arg_of)
            .collect();
        cmd.args(new)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for RefusedFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut r = RefusedFlags::default();
        r.update_from_arg_matches(m)?;
        Ok(r)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for o in refused_rows() {
            if let Ok(Some(v)) = m.try_get_one::<String>(o.env) {
                self.given.retain(|(k, _)| *k != o.env);
                self.given.push((o.env, v.clone()));
            }
        }
        Ok(())
    }
}

/// The options of `vipd manifest bird|frr`: kube-vip's BGP flags (`--bgpRouterID`,
/// `--localAS`, `--bgppeers`, `--peerAddress`, `--peerAS`, ...) and the routing table's
/// (`--tableID`, `--routingProtocol`), generated from the option table's rows like
/// [`ManagerArgs`], plus `--config-file`. Resolved with the manager's precedence
/// (environment, flag, file) by [`super::routed_settings`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutedArgs {
    /// (environment variable name, flag value) for every flag given.
    given: Vec<(&'static str, String)>,
}

impl RoutedArgs {
    /// (environment variable name, flag value) for every flag given.
    pub(super) fn flag_values(&self) -> Vec<(&'static str, &str)> {
        self.given.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    /// `--config-file`, if given.
    pub fn config_file(&self) -> Option<&std::path::Path> {
        self.given
            .iter()
            .find(|(k, _)| *k == K_CONFIG_FILE)
            .map(|(_, v)| std::path::Path::new(v.as_str()))
    }
}

fn routed_rows() -> impl Iterator<Item = &'static EnvOption> {
    rows_with_flags()
        .filter(|o| o.env == K_CONFIG_FILE || super::options::ROUTED_KEYS.contains(&o.env))
}

/// The argument of a routed row: shown in `--help` (the manager hides refused rows),
/// with kube-vip's help in place of the feature name.
fn routed_arg(o: &'static EnvOption) -> Arg {
    let mut arg = arg_of(o).hide(false);
    if let Some(help) = super::options::routed_help(o.env) {
        let mut text = format!("{help} [env: {}]", o.env);
        if !o.default.is_empty() {
            text.push_str(&format!(" [default: {}]", o.default));
        }
        arg = arg.help(text);
    }
    arg
}

impl Args for RoutedArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd.args(routed_rows().map(routed_arg))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for RoutedArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut r = RoutedArgs::default();
        r.update_from_arg_matches(m)?;
        Ok(r)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for o in routed_rows() {
            if let Ok(Some(v)) = m.try_get_one::<String>(o.env) {
                self.given.retain(|(k, _)| *k != o.env);
                self.given.push((o.env, v.clone()));
            }
        }
        Ok(())
    }
}
