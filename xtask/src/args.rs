//! The flag parsing shared by `cargo xtask bench failover|services` and `cargo xtask chaos`:
//! one walk over the arguments with the same messages for a missing value, `--help` and an
//! unknown flag, and the whole-number check with a range.

use std::ops::RangeInclusive;

use anyhow::{Result, anyhow, bail};

/// Walks `args` (the flags after the subcommand) and calls `on(flag, value)` for each flag;
/// `value()` takes the next argument as the flag's value. `on` returns `Ok(false)` for a
/// flag it does not know.
///
/// # Errors
/// `FLAG needs a value` when `value()` finds none or finds another option (an argument
/// starting with `--`), `unknown option "FLAG"` when `on` returns
/// false (both followed by `usage`), `usage` itself for `-h`/`--help`, and whatever `on`
/// returns.
pub fn parse_flags<'a>(
    args: &[&'a str],
    usage: &str,
    mut on: impl FnMut(&'a str, &mut dyn FnMut() -> Result<&'a str>) -> Result<bool>,
) -> Result<()> {
    let mut it = args.iter().copied();
    while let Some(flag) = it.next() {
        if matches!(flag, "-h" | "--help") {
            bail!("{usage}");
        }
        // A next argument that is itself an option (`--scenario --services 10`) is not the
        // value: taking it made the option vanish into the value's error, or worse, into
        // the value (a path, a name).
        let mut value = || match it.next() {
            Some(v) if v.starts_with("--") => Err(anyhow!(
                "{flag} needs a value, found the option {v:?}\n\n{usage}"
            )),
            Some(v) => Ok(v),
            None => Err(anyhow!("{flag} needs a value\n\n{usage}")),
        };
        if !on(flag, &mut value)? {
            bail!("unknown option {flag:?}\n\n{usage}");
        }
    }
    Ok(())
}

/// Parses `v`, the value of `flag`, as a whole number within `range`.
///
/// # Errors
/// `FLAG: "V" is not a whole number` or `FLAG: N is outside LO..=HI`.
pub fn whole_number(flag: &str, v: &str, range: RangeInclusive<usize>) -> Result<usize> {
    let n: usize = v
        .parse()
        .map_err(|_| anyhow!("{flag}: {v:?} is not a whole number"))?;
    if !range.contains(&n) {
        bail!("{flag}: {n} is outside {}..={}", range.start(), range.end());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_values_help_and_unknown() {
        let mut seen = Vec::new();
        parse_flags(&["--a", "1", "--b"], "USAGE", |f, value| {
            match f {
                "--a" => seen.push(format!("a={}", value()?)),
                "--b" => seen.push("b".into()),
                _ => return Ok(false),
            }
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, ["a=1", "b"]);
        let err = |args: &[&str]| {
            parse_flags(args, "USAGE", |f, value| match f {
                "--a" => value().map(|_| true),
                _ => Ok(false),
            })
            .unwrap_err()
            .to_string()
        };
        assert_eq!(err(&["--a"]), "--a needs a value\n\nUSAGE");
        assert_eq!(
            err(&["--a", "--x", "3"]),
            "--a needs a value, found the option \"--x\"\n\nUSAGE"
        );
        assert_eq!(err(&["--x"]), "unknown option \"--x\"\n\nUSAGE");
        assert_eq!(err(&["-h"]), "USAGE");
        assert_eq!(whole_number("--n", "3", 1..=5).unwrap(), 3);
        assert_eq!(
            whole_number("--n", "x", 1..=5).unwrap_err().to_string(),
            "--n: \"x\" is not a whole number"
        );
        assert_eq!(
            whole_number("--n", "0", 1..=5).unwrap_err().to_string(),
            "--n: 0 is outside 1..=5"
        );
    }
}
