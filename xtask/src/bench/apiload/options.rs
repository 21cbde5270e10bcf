//! The command line of `bench apiload`.

use std::path::PathBuf;

use anyhow::Result;

use crate::args::{parse_flags, whole_number};
use crate::bench::harness::subject::Timings;

const USAGE: &str = "usage: cargo xtask bench apiload [options]

options:
  --timings LIST    vipd lease timings as in `bench failover`: comma list of `default`
                    (3/2/1), `fast` (0.6/0.4/0.2 with vip_nftfence) or LEASE/RENEW/RETRY
                    seconds with an optional +nft (default: fast)
  --load LIST       load levels: comma list of concurrent load loops, each LISTing every
                    ConfigMap of namespace load and PATCHing one, again and again
                    (0 to 512; default 0,4,16,64)
  --seconds N       measuring window per row, seconds (1 to 3600; default 60)
  --objects N       ConfigMaps created in namespace load (1 to 100000; default 2000)
  --object-kib N    size of each ConfigMap's data, KiB (1 to 512; default 4)
  --no-build        do not run `cargo build --release -p vipd` first
  --vipd PATH       vipd binary to use (default target/release/vipd)
  -v, --verbose     print progress";

/// Parsed options of `bench apiload`.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// vipd timings, one block of rows each.
    pub timings: Vec<Timings>,
    /// Load levels: concurrent load loops.
    pub loads: Vec<usize>,
    /// Measuring window per row, seconds.
    pub seconds: u64,
    /// ConfigMaps in [`LOAD_NAMESPACE`](super::LOAD_NAMESPACE).
    pub objects: usize,
    /// KiB of data per ConfigMap.
    pub object_kib: usize,
    /// Build vipd in release mode first.
    pub build: bool,
    /// Explicit vipd binary.
    pub vipd_path: Option<PathBuf>,
    /// Print progress.
    pub verbose: bool,
}

impl Options {
    /// Parses the arguments after `bench apiload`.
    ///
    /// # Errors
    /// Names the flag and the value that is invalid (an unknown flag, a missing value, a
    /// timing `Timings::parse` refuses, a number out of range).
    pub fn parse(args: &[&str]) -> Result<Options> {
        let mut o = Options {
            timings: vec![Timings::parse("fast")?],
            loads: vec![0, 4, 16, 64],
            seconds: 60,
            objects: 2000,
            object_kib: 4,
            build: true,
            vipd_path: None,
            verbose: false,
        };
        parse_flags(args, USAGE, |a, value| {
            match a {
                "--timings" => {
                    o.timings = value()?
                        .split(',')
                        .map(Timings::parse)
                        .collect::<Result<_>>()?;
                }
                "--load" => {
                    o.loads = value()?
                        .split(',')
                        .map(|v| whole_number("--load", v, 0..=512))
                        .collect::<Result<_>>()?;
                }
                "--seconds" => o.seconds = whole_number("--seconds", value()?, 1..=3600)? as u64,
                "--objects" => o.objects = whole_number("--objects", value()?, 1..=100_000)?,
                "--object-kib" => o.object_kib = whole_number("--object-kib", value()?, 1..=512)?,
                "--no-build" => o.build = false,
                "--vipd" => o.vipd_path = Some(PathBuf::from(value()?)),
                "-v" | "--verbose" => o.verbose = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(o)
    }
}
