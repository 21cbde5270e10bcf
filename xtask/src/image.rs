//! `cargo xtask image`: vipd's container image, built without a daemon and reproducibly.
//!
//! One layer holds `/vipd` and the files of the Debian packages it needs at run time
//! ([`debs::ROOT_PACKAGES`] and their dependencies, fetched with apt and unpacked with
//! `dpkg-deb`). The layer, config, manifest and both archives are written here with the
//! `tar` and `flate2` crates and hashed with `ring`, so the same inputs (binary, `.deb`
//! files, `SOURCE_DATE_EPOCH`, labels) give the same bytes and the same digest: entries
//! sorted, one mtime, owner 0:0, no names, gzip without a time stamp, JSON with a fixed
//! field order. Written to the output directory (default `target/image/`):
//!
//! - `vipd.oci.tar`: an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/`),
//!   what `skopeo copy oci-archive:...`, `umoci` and `ctr image import` read;
//! - `vipd.docker.tar`: the same layout plus Docker's `manifest.json`, the shape
//!   `docker save` writes since Docker 25, which `docker load`, `podman load` and
//!   `ctr image import` (k3s: `k3s ctr images import`) read;
//! - `vipd.sbom.cdx.json`: the CycloneDX SBOM ([`sbom`]);
//! - `vipd.digest`: the manifest digest, `sha256:...`.

pub mod debs;
pub mod layer;
pub mod sbom;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;

use layer::{FileTree, Node};

/// Where the project's source lives (`org.opencontainers.image.source`).
pub const SOURCE_URL: &str = "https://github.com/vipd/vipd";
/// The image's repository; the tag is `v<version>` (as `vipd manifest`'s default image).
pub const REPOSITORY: &str = "ghcr.io/vipd/vipd";
/// `PATH` in the image (vipd runs no other program; kept for `kubectl exec` debugging).
pub const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Everything an image is made of: the same spec gives the same digest.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The vipd binary, copied to `/vipd`.
    pub binary: PathBuf,
    /// The Debian packages unpacked into the image.
    pub debs: Vec<debs::Deb>,
    /// Image reference written into the archives (`ghcr.io/vipd/vipd:v0.1.0`).
    pub reference: String,
    /// Time stamp of every file and of `created` (`SOURCE_DATE_EPOCH`), seconds.
    pub epoch: i64,
    /// `org.opencontainers.image.version`.
    pub version: String,
    /// `org.opencontainers.image.revision` (the git commit).
    pub revision: String,
    /// `org.opencontainers.image.licenses` (SPDX expression).
    pub license: String,
    /// `org.opencontainers.image.description`.
    pub description: String,
    /// The crates listed in the SBOM (from `Cargo.lock`).
    pub crates: Vec<sbom::LockedCrate>,
    /// Where the Debian packages come from (the build host's apt sources).
    pub distro: sbom::Distro,
}

/// What [`build`] wrote.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// Manifest digest, `sha256:<hex>`: what a registry reports and what to pin.
    pub digest: String,
    /// Config digest (Docker's image ID).
    pub config_digest: String,
    /// Size of the gzipped layer, bytes.
    pub layer_size: usize,
    /// Size of the unpacked root file system's tar, bytes.
    pub layer_tar_size: usize,
    /// `vipd.oci.tar`.
    pub oci_archive: PathBuf,
    /// `vipd.docker.tar`.
    pub docker_archive: PathBuf,
    /// `vipd.sbom.cdx.json`.
    pub sbom: PathBuf,
}

/// `sha256:<hex>` of `data`.
pub fn digest(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let mut s = String::from("sha256:");
    for b in d.as_ref() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// `2024-01-02T03:04:05Z` for `epoch` seconds.
///
/// # Errors
/// When `epoch` is out of chrono's range.
pub fn rfc3339(epoch: i64) -> Result<String> {
    let t = chrono::DateTime::from_timestamp(epoch, 0)
        .with_context(|| format!("SOURCE_DATE_EPOCH {epoch} is out of range"))?;
    Ok(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Splits `host/repo:tag` into (`host/repo`, `tag`); `latest` when there is no tag.
pub fn split_reference(reference: &str) -> (&str, &str) {
    match reference.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (reference, "latest"),
    }
}

/// The root file system: the packages' files, then `/vipd` (mode 0755).
///
/// # Errors
/// When a package cannot be unpacked or the binary read.
pub fn root_fs(spec: &ImageSpec) -> Result<FileTree> {
    let mut tree = FileTree::default();
    for deb in &spec.debs {
        debs::unpack_into(deb, &mut tree).with_context(|| format!("unpack {}", deb.name))?;
    }
    let data = std::fs::read(&spec.binary)
        .with_context(|| format!("read the vipd binary {}", spec.binary.display()))?;
    tree.insert("vipd", Node::File { mode: 0o755, data })?;
    Ok(tree)
}

/// The image config (OCI image spec "config"): entrypoint `/vipd`, command `manager`, the
/// OCI labels, the layer's uncompressed digest.
fn config_json(spec: &ImageSpec, diff_id: &str) -> Result<Vec<u8>> {
    let created = rfc3339(spec.epoch)?;
    let labels: BTreeMap<&str, &str> = [
        ("org.opencontainers.image.title", "vipd"),
        (
            "org.opencontainers.image.description",
            spec.description.as_str(),
        ),
        ("org.opencontainers.image.version", spec.version.as_str()),
        ("org.opencontainers.image.source", SOURCE_URL),
        ("org.opencontainers.image.revision", spec.revision.as_str()),
        ("org.opencontainers.image.licenses", spec.license.as_str()),
        ("org.opencontainers.image.created", created.as_str()),
    ]
    .into_iter()
    .collect();
    let config = json!({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": "0:0",
            "Env": [PATH_ENV],
            "Entrypoint": ["/vipd"],
            "Cmd": ["manager"],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "cargo xtask image"}],
    });
    serde_json::to_vec(&config).context("serialise the image config")
}

fn descriptor(media_type: &str, data: &[u8]) -> serde_json::Value {
    json!({"mediaType": media_type, "digest": digest(data), "size": data.len()})
}

fn blob_path(data: &[u8]) -> String {
    format!(
        "blobs/sha256/{}",
        digest(data).trim_start_matches("sha256:")
    )
}

/// Builds the image of `spec` into `out` (created if missing; the files named in the module
/// docs are replaced).
///
/// # Errors
/// When a package or the binary cannot be read, or a file cannot be written.
pub fn build(spec: &ImageSpec, out: &Path) -> Result<BuiltImage> {
    let epoch = u64::try_from(spec.epoch).context("SOURCE_DATE_EPOCH before 1970")?;
    let tar = root_fs(spec)?.to_tar(epoch)?;
    let gz = layer::gzip(&tar)?;
    let config = config_json(spec, &digest(&tar))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": descriptor(CONFIG_TYPE, &config),
        "layers": [descriptor(LAYER_TYPE, &gz)],
    }))?;
    let (repo, tag) = split_reference(&spec.reference);
    let mut entry = descriptor(MANIFEST_TYPE, &manifest);
    entry["annotations"] = json!({
        "io.containerd.image.name": spec.reference,
        "org.opencontainers.image.ref.name": tag,
    });
    entry["platform"] = json!({"architecture": "amd64", "os": "linux"});
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [entry],
    }))?;
    let docker_manifest = serde_json::to_vec(&json!([{
        "Config": blob_path(&config),
        "RepoTags": [spec.reference],
        "Layers": [blob_path(&gz)],
    }]))?;
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    let mut blobs: Vec<(String, &[u8])> = [&config, &gz, &manifest]
        .into_iter()
        .map(|b| (blob_path(b), b.as_slice()))
        .collect();
    blobs.sort();
    let mut oci = blobs.clone();
    oci.push(("index.json".into(), &index));
    oci.push(("oci-layout".into(), layout));
    let mut docker = oci.clone();
    docker.push(("manifest.json".into(), &docker_manifest));

    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let write = |name: &str, data: &[u8]| -> Result<PathBuf> {
        let p = out.join(name);
        std::fs::write(&p, data).with_context(|| format!("write {}", p.display()))?;
        Ok(p)
    };
    let dirs = ["blobs", "blobs/sha256"];
    let digest = digest(&manifest);
    let built = BuiltImage {
        oci_archive: write("vipd.oci.tar", &layer::archive(&dirs, &oci, epoch)?)?,
        docker_archive: write("vipd.docker.tar", &layer::archive(&dirs, &docker, epoch)?)?,
        sbom: write("vipd.sbom.cdx.json", &sbom_json(spec, repo, tag, &digest)?)?,
        digest,
        config_digest: crate::image::digest(&config),
        layer_size: gz.len(),
        layer_tar_size: tar.len(),
    };
    write("vipd.digest", format!("{}\n", built.digest).as_bytes())?;
    Ok(built)
}

fn sbom_json(spec: &ImageSpec, repo: &str, tag: &str, digest: &str) -> Result<Vec<u8>> {
    let image = sbom::ImageComponent {
        repository: repo.to_string(),
        tag: tag.to_string(),
        digest: digest.to_string(),
        created: rfc3339(spec.epoch)?,
    };
    let debs: Vec<sbom::DebComponent> = spec
        .debs
        .iter()
        .map(|d| sbom::DebComponent {
            name: d.name.clone(),
            version: d.version.clone(),
            arch: d.arch.clone(),
            sha256: d.sha256.clone(),
        })
        .collect();
    let mut text =
        serde_json::to_vec_pretty(&sbom::cyclonedx(&image, &spec.crates, &debs, &spec.distro))?;
    text.push(b'\n');
    Ok(text)
}

/// The default reference: [`REPOSITORY`]`:v<version>`, what `vipd manifest` names.
pub fn default_reference(version: &str) -> String {
    format!("{REPOSITORY}:v{version}")
}

/// Where the `.deb` files are kept between builds: `<target>/image-debs`.
pub fn deb_cache() -> PathBuf {
    crate::lab::control_plane::target_dir().join("image-debs")
}

/// The Debian packages of the image ([`debs::ROOT_PACKAGES`] and their dependencies, apt's
/// candidate versions), fetched into [`deb_cache`]. When that fails as root (package lists
/// older than the mirror, whose old versions are gone), runs `apt-get update` and tries once
/// more.
///
/// # Errors
/// When apt cannot resolve or download them.
pub fn fetch_debs() -> Result<Vec<debs::Deb>> {
    let fetch = || debs::fetch(&debs::resolve(&debs::ROOT_PACKAGES)?, &deb_cache());
    match fetch() {
        Ok(d) => Ok(d),
        Err(e) if nix::unistd::geteuid().is_root() => {
            eprintln!("image: {e:#}; running apt-get update and trying again");
            debs::output("apt-get", &["update", "-q"], None)?;
            fetch()
        }
        Err(e) => {
            Err(e.context("fetch the image's Debian packages (apt-get update as root may help)"))
        }
    }
}

/// `SOURCE_DATE_EPOCH` if set, else the time of the checkout's last commit.
///
/// # Errors
/// When the variable is not a whole number, or git cannot tell.
pub fn source_date_epoch(root: &Path) -> Result<i64> {
    if let Ok(v) = std::env::var("SOURCE_DATE_EPOCH") {
        return v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a whole number"));
    }
    let r = root.to_string_lossy();
    let out = debs::output("git", &["-C", &r, "log", "-1", "--format=%ct"], None)
        .context("no SOURCE_DATE_EPOCH: take the last commit's time")?;
    let s = String::from_utf8_lossy(&out);
    s.trim()
        .parse()
        .with_context(|| format!("git log: commit time {s:?}"))
}

/// An [`ImageSpec`] for `binary` and `debs` from this workspace: version, license and
/// description from `Cargo.toml`, the crates of `Cargo.lock`, the git commit (`VIPD_IMAGE_REVISION`
/// overrides it), [`source_date_epoch`]; `reference` defaults to [`default_reference`].
///
/// # Errors
/// When `Cargo.toml` / `Cargo.lock` cannot be read or parsed, or git fails.
pub fn workspace_spec(
    binary: PathBuf,
    debs: Vec<debs::Deb>,
    reference: Option<String>,
) -> Result<ImageSpec> {
    let root = crate::lab::control_plane::workspace_root();
    let read = |name: &str| {
        std::fs::read_to_string(root.join(name))
            .with_context(|| format!("read {}", root.join(name).display()))
    };
    let manifest: toml::Table = toml::from_str(&read("Cargo.toml")?).context("parse Cargo.toml")?;
    let field = |table: &str, key: &str| -> Result<String> {
        manifest
            .get(table)
            .and_then(|t| t.get(key))
            .and_then(toml::Value::as_str)
            .map(str::to_string)
            .with_context(|| format!("Cargo.toml: no {table}.{key}"))
    };
    let version = field("package", "version")?;
    let revision = match std::env::var("VIPD_IMAGE_REVISION") {
        Ok(r) => r,
        Err(_) => {
            let r = root.to_string_lossy();
            let out = debs::output("git", &["-C", &r, "rev-parse", "HEAD"], None)?;
            String::from_utf8_lossy(&out).trim().to_string()
        }
    };
    let license = manifest
        .get("workspace")
        .and_then(|w| w.get("package"))
        .and_then(|p| p.get("license"))
        .and_then(toml::Value::as_str)
        .context("Cargo.toml: no workspace.package.license")?
        .to_string();
    Ok(ImageSpec {
        binary,
        debs,
        reference: reference.unwrap_or_else(|| default_reference(&version)),
        epoch: source_date_epoch(&root)?,
        description: field("package", "description")?,
        version,
        revision,
        license,
        crates: sbom::parse_cargo_lock(&read("Cargo.lock")?)?,
        distro: sbom::Distro::of_host(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_is_rfc3339_utc() {
        assert_eq!(rfc3339(0).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000).unwrap(), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn references_split_at_the_tag_not_the_port() {
        assert_eq!(
            split_reference("ghcr.io/vipd/vipd:v0.1.0"),
            ("ghcr.io/vipd/vipd", "v0.1.0")
        );
        assert_eq!(
            split_reference("localhost:5000/vipd"),
            ("localhost:5000/vipd", "latest")
        );
        assert_eq!(split_reference("vipd:dev"), ("vipd", "dev"));
    }

    #[test]
    fn digest_is_prefixed_lowercase_hex() {
        assert_eq!(
            digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
