//! The Debian packages in the image: resolved from the package roots through their
//! `Depends`/`Pre-Depends` with `apt-cache show`, fetched with `apt-get download` into a
//! cache (checked against the archive's SHA-256), and unpacked with `dpkg-deb`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::layer::{FileTree, Node};

/// What vipd needs besides itself: the C library and libgcc (Rust's std unwinder) of the
/// glibc-linked binary. vipd runs no other program (`grep -rn 'Command::new' src`): it
/// changes its nftables tables through netlink itself, so the image carries no `nft`.
pub const ROOT_PACKAGES: [&str; 2] = ["libc6", "libgcc-s1"];

/// Parts of the packages left out of the image: documentation, manual pages, translations,
/// and glibc's iconv modules (vipd converts no character sets).
pub const EXCLUDED_PATHS: [&str; 7] = [
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/bug",
    "usr/lib/x86_64-linux-gnu/gconv",
];

/// A `.deb` file and the control fields read from it.
#[derive(Debug, Clone)]
pub struct Deb {
    /// The archive.
    pub path: PathBuf,
    /// `Package`.
    pub name: String,
    /// `Version` (as dpkg writes it, epoch included).
    pub version: String,
    /// `Architecture`.
    pub arch: String,
    /// Its whole control file (`dpkg-deb --field`), copied to `/var/lib/dpkg/status.d/`.
    pub control: String,
    /// Lower-case hex SHA-256 of the archive.
    pub sha256: String,
}

/// Runs `program args` and returns its stdout; the error names the command and its stderr.
pub(crate) fn output(program: &str, args: &[&str], cwd: Option<&Path>) -> Result<Vec<u8>> {
    let mut cmd = Command::new(program);
    cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let line = format!("{program} {}", args.join(" "));
    let out = cmd.output().with_context(|| format!("run `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The fields of the first paragraph of a Debian control text (continuation lines joined).
pub fn control_fields(text: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in text.lines() {
        if line.trim().is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            if let Some(k) = &last
                && let Some(v) = fields.get_mut(k)
            {
                let v: &mut String = v;
                v.push('\n');
                v.push_str(line);
            }
        } else if let Some((k, v)) = line.split_once(':') {
            fields.insert(k.to_string(), v.trim().to_string());
            last = Some(k.to_string());
        }
    }
    fields
}

/// Package names a `Depends` value requires: the first alternative of each, without version
/// or architecture qualifiers (`libc6 (>= 2.34), libfoo:any | libbar` -> libc6, libfoo).
pub fn depends_names(value: &str) -> Vec<String> {
    value
        .split(',')
        .filter_map(|dep| {
            let first = dep.split('|').next()?.trim();
            let name = first.split([' ', '(', ':']).next()?.trim();
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// The packages `roots` need, themselves included, as `(name, candidate version)` sorted by
/// name: the closure of their `Pre-Depends` and `Depends` in the apt cache.
///
/// # Errors
/// When `apt-cache show` fails (e.g. a package unknown to apt: run `apt-get update`).
pub fn resolve(roots: &[&str]) -> Result<BTreeMap<String, String>> {
    let mut todo: Vec<String> = roots.iter().map(|s| s.to_string()).collect();
    let mut done = BTreeMap::new();
    while let Some(name) = todo.pop() {
        if done.contains_key(&name) {
            continue;
        }
        let show = output("apt-cache", &["show", "--no-all-versions", &name], None)?;
        let f = control_fields(&String::from_utf8_lossy(&show));
        let version = f
            .get("Version")
            .with_context(|| format!("apt-cache show {name}: no Version (run apt-get update)"))?;
        for key in ["Pre-Depends", "Depends"] {
            if let Some(v) = f.get(key) {
                todo.extend(
                    depends_names(v)
                        .into_iter()
                        .filter(|d| !done.contains_key(d)),
                );
            }
        }
        done.insert(name, version.clone());
    }
    Ok(done)
}

/// Reads a `.deb`'s control fields and checksum.
///
/// # Errors
/// When `dpkg-deb` fails or a required field is missing.
pub fn read_deb(path: &Path) -> Result<Deb> {
    let p = path.to_string_lossy();
    let control =
        String::from_utf8_lossy(&output("dpkg-deb", &["--field", &p], None)?).into_owned();
    let f = control_fields(&control);
    let field = |k: &str| {
        f.get(k)
            .cloned()
            .with_context(|| format!("{p}: no {k} field"))
    };
    Ok(Deb {
        path: path.to_path_buf(),
        name: field("Package")?,
        version: field("Version")?,
        arch: field("Architecture")?,
        control,
        sha256: crate::lab::control_plane::sha256_file(path)?,
    })
}

/// Fetches the candidate version of every package in `packages` into `cache` (kept between
/// builds: a file already there is not downloaded again) and reads them.
///
/// # Errors
/// When `apt-get download` or `dpkg-deb` fails, or a downloaded file has another version.
pub fn fetch(packages: &BTreeMap<String, String>, cache: &Path) -> Result<Vec<Deb>> {
    std::fs::create_dir_all(cache).with_context(|| format!("create {}", cache.display()))?;
    let mut debs = Vec::new();
    for (name, version) in packages {
        // apt names files <name>_<version, ':' as %3a>_<arch>.deb.
        let prefix = format!("{name}_{}_", version.replace(':', "%3a"));
        let find = || -> Result<Option<PathBuf>> {
            for e in
                std::fs::read_dir(cache).with_context(|| format!("list {}", cache.display()))?
            {
                let p = e?.path();
                let n = p.file_name().map(|n| n.to_string_lossy().into_owned());
                if n.is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb")) {
                    return Ok(Some(p));
                }
            }
            Ok(None)
        };
        let path = match find()? {
            Some(p) => p,
            None => {
                output(
                    "apt-get",
                    &["download", "-q", &format!("{name}={version}")],
                    Some(cache),
                )?;
                find()?.with_context(|| {
                    format!("apt-get download {name}={version}: no {prefix}*.deb")
                })?
            }
        };
        let deb = read_deb(&path)?;
        if deb.name != *name || deb.version != *version {
            bail!(
                "{}: is {} {}, expected {name} {version}",
                path.display(),
                deb.name,
                deb.version
            );
        }
        debs.push(deb);
    }
    Ok(debs)
}

/// Adds the files of `deb` (minus [`EXCLUDED_PATHS`]) to `tree`, and its control file as
/// `var/lib/dpkg/status.d/<name>` (where scanners such as Trivy look in distroless images).
///
/// # Errors
/// When `dpkg-deb --fsys-tarfile` fails or the archive has an entry other than a file,
/// directory, symlink or hard link.
pub fn unpack_into(deb: &Deb, tree: &mut FileTree) -> Result<()> {
    let p = deb.path.to_string_lossy();
    let data = output("dpkg-deb", &["--fsys-tarfile", &p], None)?;
    let mut ar = tar::Archive::new(data.as_slice());
    let mut links: Vec<(String, String)> = Vec::new();
    for entry in ar.entries().with_context(|| format!("read {p}"))? {
        let mut e = entry.with_context(|| format!("read {p}"))?;
        let path = e.path().with_context(|| format!("{p}: entry path"))?;
        let path = path.to_string_lossy().into_owned();
        let Some(norm) = super::layer::normalize(&path)? else {
            continue;
        };
        if EXCLUDED_PATHS
            .iter()
            .any(|x| norm == *x || norm.starts_with(&format!("{x}/")))
        {
            continue;
        }
        let mode = e
            .header()
            .mode()
            .with_context(|| format!("{p}: mode of {path}"))?
            & 0o7777;
        let node = match e.header().entry_type() {
            tar::EntryType::Directory => Node::Dir { mode },
            tar::EntryType::Regular => {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data)
                    .with_context(|| format!("{p}: read {path}"))?;
                Node::File { mode, data }
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = e
                    .link_name()
                    .with_context(|| format!("{p}: link of {path}"))?
                    .with_context(|| format!("{p}: {path} has no link target"))?
                    .to_string_lossy()
                    .into_owned();
                if e.header().entry_type() == tar::EntryType::Link {
                    links.push((norm, target));
                    continue;
                }
                Node::Symlink { target }
            }
            other => bail!("{p}: {path} is a {other:?}, not supported in the image"),
        };
        tree.insert(&norm, node)?;
    }
    // Hard links become copies (the layer has no hard links to order correctly).
    for (path, target) in links {
        let norm = super::layer::normalize(&target)?.unwrap_or_default();
        let node = tree
            .get(&norm)
            .cloned()
            .with_context(|| format!("{p}: hard link {path} to missing {target}"))?;
        tree.insert(&path, node)?;
    }
    tree.insert(
        &format!("var/lib/dpkg/status.d/{}", deb.name),
        Node::File {
            mode: 0o644,
            data: deb.control.clone().into_bytes(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_takes_first_alternatives_without_qualifiers() {
        assert_eq!(
            depends_names("libc6 (>= 2.34), libfoo:any | libbar, debconf (>= 0.5) | debconf-2.0"),
            ["libc6", "libfoo", "debconf"]
        );
        assert!(depends_names("").is_empty());
    }

    #[test]
    fn control_fields_reads_the_first_paragraph() {
        let f = control_fields(
            "Package: nft\nVersion: 1:1.0-2\nDescription: x\n more\n\nPackage: other\n",
        );
        assert_eq!(f["Package"], "nft");
        assert_eq!(f["Version"], "1:1.0-2");
        assert_eq!(f["Description"], "x\n more");
    }
}
