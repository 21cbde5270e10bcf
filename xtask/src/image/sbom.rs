//! The image's SBOM: CycloneDX 1.5 JSON listing every crate of `Cargo.lock` (name, version,
//! source, SHA-256 checksum) and every Debian package in the image (name, version from its
//! control file, SHA-256 of the `.deb`), with package URLs. Deterministic: no serial number,
//! the timestamp is the image's `created`, components sorted.

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::{Value, json};

/// One `[[package]]` of a `Cargo.lock` (format v3/v4).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct LockedCrate {
    /// Crate name.
    pub name: String,
    /// Exact version.
    pub version: String,
    /// `registry+https://...` or `git+https://...#rev`; `None` for workspace (path) crates.
    pub source: Option<String>,
    /// SHA-256 of the `.crate` file (registry crates only).
    pub checksum: Option<String>,
}

#[derive(Deserialize)]
struct CargoLock {
    #[serde(default)]
    package: Vec<LockedCrate>,
}

/// Parses `Cargo.lock` text into its packages, in file order.
///
/// # Errors
/// When the text is not TOML of that shape.
pub fn parse_cargo_lock(text: &str) -> Result<Vec<LockedCrate>> {
    let lock: CargoLock = toml::from_str(text).context("parse Cargo.lock")?;
    Ok(lock.package)
}

/// A Debian package for the SBOM.
#[derive(Debug, Clone)]
pub struct DebComponent {
    /// Package name.
    pub name: String,
    /// Version as in its control file.
    pub version: String,
    /// Architecture (`amd64`, `all`).
    pub arch: String,
    /// SHA-256 of the `.deb`.
    pub sha256: String,
}

/// The distribution the Debian packages come from (the build host's apt sources), as
/// `/etc/os-release` names it (`ID`, `VERSION_ID`): the namespace and `distro` qualifier of
/// their package URLs (purl spec, type `deb`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distro {
    /// `ID` (`debian`, `ubuntu`).
    pub id: String,
    /// `VERSION_ID` (`12`, `24.04`); empty when the file has none (testing, sid).
    pub version_id: String,
}

impl Distro {
    /// Reads `ID` and `VERSION_ID` from os-release text (`KEY=value`, values maybe
    /// quoted); `ID` defaults to `linux` as os-release(5) says.
    pub fn parse(os_release: &str) -> Distro {
        let field = |key: &str| {
            os_release
                .lines()
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().trim_matches('"').trim_matches('\'').to_string())
        };
        Distro {
            id: field("ID").unwrap_or_else(|| "linux".into()),
            version_id: field("VERSION_ID").unwrap_or_default(),
        }
    }

    /// This machine's (`/etc/os-release`, else `/usr/lib/os-release`).
    pub fn of_host() -> Distro {
        let text = std::fs::read_to_string("/etc/os-release")
            .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
            .unwrap_or_default();
        Distro::parse(&text)
    }

    /// The purl `distro` qualifier: `debian-12`, or the bare id without a version.
    fn qualifier(&self) -> String {
        if self.version_id.is_empty() {
            self.id.clone()
        } else {
            format!("{}-{}", self.id, self.version_id)
        }
    }
}

/// What the SBOM says about the image itself.
#[derive(Debug, Clone)]
pub struct ImageComponent {
    /// Repository without tag (`ghcr.io/vipd/vipd`).
    pub repository: String,
    /// Tag (`v0.1.0`).
    pub tag: String,
    /// Manifest digest (`sha256:...`).
    pub digest: String,
    /// RFC 3339 creation time.
    pub created: String,
}

/// Percent-encodes what a package URL version may not carry literally (`+`, `:`, `~`...).
fn purl_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn crate_component(c: &LockedCrate) -> Value {
    let purl = format!("pkg:cargo/{}@{}", c.name, purl_escape(&c.version));
    let mut comp = json!({
        "type": "library",
        "bom-ref": purl,
        "name": c.name,
        "version": c.version,
        "purl": purl,
        "properties": [{
            "name": "cargo:source",
            "value": c.source.as_deref().unwrap_or("path (this workspace)"),
        }],
    });
    if let Some(sum) = &c.checksum {
        comp["hashes"] = json!([{"alg": "SHA-256", "content": sum}]);
    }
    comp
}

fn deb_component(d: &DebComponent, distro: &Distro) -> Value {
    let purl = format!(
        "pkg:deb/{}/{}@{}?arch={}&distro={}",
        purl_escape(&distro.id),
        d.name,
        purl_escape(&d.version),
        d.arch,
        purl_escape(&distro.qualifier()),
    );
    json!({
        "type": "library",
        "bom-ref": purl,
        "name": d.name,
        "version": d.version,
        "purl": purl,
        "hashes": [{"alg": "SHA-256", "content": d.sha256}],
        "properties": [{"name": "deb:architecture", "value": d.arch}],
    })
}

/// The CycloneDX 1.5 document: the image as the subject, then every crate of `crates` and
/// every package of `debs`, sorted by package URL.
pub fn cyclonedx(
    image: &ImageComponent,
    crates: &[LockedCrate],
    debs: &[DebComponent],
    distro: &Distro,
) -> Value {
    let mut components: Vec<Value> = crates
        .iter()
        .map(crate_component)
        .chain(debs.iter().map(|d| deb_component(d, distro)))
        .collect();
    components.sort_by(|a, b| a["purl"].as_str().cmp(&b["purl"].as_str()));
    let hex = image.digest.trim_start_matches("sha256:");
    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": image.created,
            "tools": {"components": [{"type": "application", "name": "cargo xtask image"}]},
            "component": {
                "type": "container",
                "bom-ref": "image",
                "name": image.repository,
                "version": image.tag,
                "hashes": [{"alg": "SHA-256", "content": hex}],
                "purl": format!(
                    "pkg:oci/{}@sha256%3A{hex}?repository_url={}&tag={}",
                    image.repository.rsplit('/').next().unwrap_or(&image.repository),
                    image.repository,
                    image.tag
                ),
            },
        },
        "components": components,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: &str = r#"
version = 4

[[package]]
name = "vipd"
version = "0.1.0"
dependencies = ["tokio"]

[[package]]
name = "tokio"
version = "1.48.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "ff360e02eab121e0bc37a2d3b4d4dc622e6eda3a8e5253d5435ecf5bd4c68408"
"#;

    fn bookworm() -> Distro {
        Distro::parse(
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\nID=debian\n",
        )
    }

    /// Trial finding F14: the packages' distribution is the build host's, not always Debian 12.
    #[test]
    fn the_distro_comes_from_os_release() {
        assert_eq!(
            bookworm(),
            Distro {
                id: "debian".into(),
                version_id: "12".into()
            }
        );
        let noble = Distro::parse("ID=ubuntu\nVERSION_ID=\"24.04\"\n");
        assert_eq!(noble.qualifier(), "ubuntu-24.04");
        let d = DebComponent {
            name: "libc6".into(),
            version: "2.39-0ubuntu8".into(),
            arch: "amd64".into(),
            sha256: "00".into(),
        };
        assert_eq!(
            deb_component(&d, &noble)["purl"],
            "pkg:deb/ubuntu/libc6@2.39-0ubuntu8?arch=amd64&distro=ubuntu-24.04"
        );
        let sid = Distro::parse("ID=debian\n");
        assert_eq!(sid.qualifier(), "debian");
        assert_eq!(Distro::parse("").id, "linux");
    }

    fn image() -> ImageComponent {
        ImageComponent {
            repository: "ghcr.io/vipd/vipd".into(),
            tag: "v0.1.0".into(),
            digest: "sha256:abc".into(),
            created: "2024-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn lock_packages_are_read_with_source_and_checksum() {
        let crates = parse_cargo_lock(LOCK).unwrap();
        assert_eq!(crates.len(), 2);
        assert_eq!(crates[0].source, None);
        assert_eq!(crates[1].name, "tokio");
        assert!(crates[1].checksum.as_deref().unwrap().starts_with("ff360e"));
    }

    #[test]
    fn sbom_lists_every_crate_and_deb_sorted_with_purls_and_hashes() {
        let crates = parse_cargo_lock(LOCK).unwrap();
        let debs = [DebComponent {
            name: "libc6".into(),
            version: "2.36-9+deb12u13".into(),
            arch: "amd64".into(),
            sha256: "00ff".into(),
        }];
        let bom = cyclonedx(&image(), &crates, &debs, &bookworm());
        let comps = bom["components"].as_array().unwrap();
        let purls: Vec<&str> = comps.iter().map(|c| c["purl"].as_str().unwrap()).collect();
        assert_eq!(
            purls,
            [
                "pkg:cargo/tokio@1.48.0",
                "pkg:cargo/vipd@0.1.0",
                "pkg:deb/debian/libc6@2.36-9%2Bdeb12u13?arch=amd64&distro=debian-12",
            ]
        );
        assert_eq!(
            comps[0]["hashes"][0]["content"],
            crates[1].checksum.clone().unwrap()
        );
        assert!(comps[1].get("hashes").is_none());
        assert_eq!(comps[2]["version"], "2.36-9+deb12u13");
        assert_eq!(bom["metadata"]["timestamp"], "2024-01-01T00:00:00Z");
        assert_eq!(bom["metadata"]["component"]["hashes"][0]["content"], "abc");
        assert_eq!(bom, cyclonedx(&image(), &crates, &debs, &bookworm()));
    }

    #[test]
    fn the_workspace_lock_parses_and_has_vipd() {
        let root = crate::lab::control_plane::workspace_root();
        let text = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
        let crates = parse_cargo_lock(&text).unwrap();
        assert!(
            crates
                .iter()
                .any(|c| c.name == "vipd" && c.source.is_none())
        );
        assert!(
            crates
                .iter()
                .filter(|c| c.source.is_some())
                .all(|c| c.checksum.is_some())
        );
    }
}
