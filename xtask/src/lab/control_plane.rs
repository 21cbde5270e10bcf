//! The lab's control plane: locating kube-apiserver v1.20.2, generating the PKI, tokens and
//! kubeconfigs, and installing missing Debian packages.

use std::fmt::Write as _;
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::error::{LabError, Result, io_ctx};
use super::process::{find_in_path, run};

/// File name of the packed API server in the assets folder.
pub const APISERVER_XZ: &str = "kube-apiserver-v1.20.2-linux-amd64.xz";

/// What to tell a user who has no kube-apiserver (mirrors ../shared/lab/README.md).
pub const APISERVER_HELP: &str = "\
The lab runs a real kube-apiserver v1.20.2 (with etcd from Debian's etcd-server package).
It is looked up, in order:
  1. $VIPD_KUBE_APISERVER: path to a kube-apiserver v1.20.2 binary;
  2. `kube-apiserver` in $PATH;
  3. $VIPD_LAB_ASSETS/kube-apiserver-v1.20.2-linux-amd64.xz, checked against
     $VIPD_LAB_ASSETS/SHA256SUMS (CI sets VIPD_LAB_ASSETS to ../shared/lab);
  4. ../shared/lab next to the repository checkout (same files).
To build one on Debian bookworm (about 11 minutes on 2 cores):
  apt-get install golang-go rsync jq etcd-server
  # enable deb-src: copy /etc/apt/sources.list.d/debian.sources to e.g. src.sources
  # with `Types: deb-src`, then:
  apt-get update && apt-get source --download-only kubernetes
  # unpack the .orig.tar.gz, then inside it:
  GOPROXY=off CGO_ENABLED=0 GOPATH=$PWD/.gopath HOME=$PWD/.home make WHAT=cmd/kube-apiserver
  # the binary is _output/bin/kube-apiserver; point VIPD_KUBE_APISERVER at it.";

/// Root of the workspace this xtask crate belongs to (compile-time location).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The cargo target directory: `$CARGO_TARGET_DIR` or `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Finds the built `vipd` binary: `explicit` (e.g. `env!("CARGO_BIN_EXE_vipd")` in an
/// integration test), then `$VIPD_BIN`, then the newer of `target/{debug,release}/vipd`.
///
/// # Errors
/// [`LabError::Io`] (NotFound) naming every place that was tried.
pub fn vipd_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = explicit {
        candidates.push(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("VIPD_BIN") {
        candidates.push(PathBuf::from(p));
    }
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
        tried.push(c.display().to_string());
    }
    let mut built: Vec<(std::time::SystemTime, PathBuf)> = ["debug", "release"]
        .iter()
        .map(|p| target_dir().join(p).join("vipd"))
        .filter_map(|p| {
            tried.push(p.display().to_string());
            let m = std::fs::metadata(&p).ok()?.modified().ok()?;
            Some((m, p))
        })
        .collect();
    built.sort();
    built.pop().map(|(_, p)| p).ok_or_else(|| LabError::Io {
        context: format!(
            "find the vipd binary (tried {}; run `cargo build` or set VIPD_BIN)",
            tried.join(", ")
        ),
        source: std::io::ErrorKind::NotFound.into(),
    })
}

/// Installs the Debian packages providing the missing `(binary, package)` pairs with
/// apt-get, when running as root; does nothing when every binary is present.
///
/// # Errors
/// [`LabError::Command`] when apt-get fails, [`LabError::NotRoot`] when something is missing
/// and we are not root.
pub fn ensure_packages(wanted: &[(&str, &str)]) -> Result<()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock();
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(bin, _)| {
            find_in_path(bin).is_none()
                && !["/usr/sbin", "/sbin", "/usr/bin"]
                    .iter()
                    .any(|d| Path::new(d).join(bin).is_file())
        })
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let uid = nix::unistd::geteuid().as_raw();
    if uid != 0 {
        return Err(LabError::NotRoot { uid });
    }
    eprintln!(
        "lab: installing missing Debian packages: {}",
        missing.join(" ")
    );
    run("apt-get", &["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend(missing.iter().copied());
    let mut cmd = std::process::Command::new("apt-get");
    cmd.args(&args).env("DEBIAN_FRONTEND", "noninteractive");
    let out = cmd.output().map_err(io_ctx("run apt-get install"))?;
    if !out.status.success() {
        return Err(LabError::Command {
            command: format!("apt-get {}", args.join(" ")),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Locates kube-apiserver v1.20.2 (see [`APISERVER_HELP`] for the order), unpacking and
/// verifying the assets copy into `<target>/lab-cache` once per process.
///
/// # Errors
/// [`LabError::ApiServerMissing`] with instructions when none is found;
/// [`LabError::Checksum`] when the assets do not match SHA256SUMS.
pub fn find_apiserver() -> Result<PathBuf> {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    if let Some(p) = FOUND.get() {
        return Ok(p.clone());
    }
    let _guard = LOCK.lock();
    if let Some(p) = FOUND.get() {
        return Ok(p.clone());
    }
    let found = locate_apiserver()?;
    let _ = FOUND.set(found.clone());
    Ok(found)
}

fn locate_apiserver() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("VIPD_KUBE_APISERVER") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(LabError::ApiServerMissing {
            help: format!(
                "VIPD_KUBE_APISERVER={} is not a file.\n{APISERVER_HELP}",
                p.display()
            ),
        });
    }
    if let Some(p) = find_in_path("kube-apiserver") {
        return Ok(p);
    }
    let mut assets: Vec<PathBuf> = Vec::new();
    if let Some(a) = std::env::var_os("VIPD_LAB_ASSETS") {
        assets.push(PathBuf::from(a));
    }
    assets.push(workspace_root().join("..").join("shared").join("lab"));
    let Some(dir) = assets.iter().find(|d| d.join(APISERVER_XZ).is_file()) else {
        return Err(LabError::ApiServerMissing {
            help: format!(
                "No {APISERVER_XZ} in {}.\n{APISERVER_HELP}",
                assets
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        });
    };
    let sums_path = dir.join("SHA256SUMS");
    let sums = std::fs::read_to_string(&sums_path)
        .map_err(io_ctx(format!("read {}", sums_path.display())))?;
    let (xz_sum, bin_sum) = parse_sums(&sums).ok_or_else(|| LabError::Parse {
        what: sums_path.display().to_string(),
        detail: format!("expected lines for {APISERVER_XZ} and `kube-apiserver (uncompressed)`"),
    })?;
    let cache = target_dir().join("lab-cache");
    std::fs::create_dir_all(&cache).map_err(io_ctx(format!("create {}", cache.display())))?;
    let dest = cache.join(format!("kube-apiserver-v1.20.2-{}", &bin_sum[..12]));
    if dest.is_file() && sha256_file(&dest)? == bin_sum {
        return Ok(dest);
    }
    let xz = dir.join(APISERVER_XZ);
    check_sum(&xz, &xz_sum)?;
    ensure_packages(&[("xz", "xz-utils")])?;
    let tmp = cache.join(format!(".kube-apiserver.{}.tmp", std::process::id()));
    let out = std::fs::File::create(&tmp).map_err(io_ctx(format!("create {}", tmp.display())))?;
    let status = std::process::Command::new("xz")
        .arg("-dc")
        .arg(&xz)
        .stdout(out)
        .status()
        .map_err(io_ctx("run xz -dc"))?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(LabError::Command {
            command: format!("xz -dc {}", xz.display()),
            status: status.to_string(),
            stderr: String::new(),
        });
    }
    if let Err(e) = check_sum(&tmp, &bin_sum) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(io_ctx(format!("chmod {}", tmp.display())))?;
    std::fs::rename(&tmp, &dest).map_err(io_ctx(format!("rename to {}", dest.display())))?;
    Ok(dest)
}

/// Parses SHA256SUMS: returns (digest of the .xz, digest of the uncompressed binary).
fn parse_sums(text: &str) -> Option<(String, String)> {
    let mut xz = None;
    let mut bin = None;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(sum), Some(name)) = (it.next(), it.next()) else {
            continue;
        };
        let rest: Vec<&str> = it.collect();
        if name.trim_start_matches('*') == APISERVER_XZ {
            xz = Some(sum.to_lowercase());
        } else if name == "kube-apiserver" && rest.first() == Some(&"(uncompressed)") {
            bin = Some(sum.to_lowercase());
        }
    }
    Some((xz?, bin?))
}

fn check_sum(path: &Path, expected: &str) -> Result<()> {
    let actual = sha256_file(path)?;
    if actual == expected {
        Ok(())
    } else {
        Err(LabError::Checksum {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            actual,
        })
    }
}

/// Lower-case hex SHA-256 of a file.
///
/// # Errors
/// [`LabError::Io`] when the file cannot be read.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(io_ctx(format!("open {}", path.display())))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io_ctx(format!("read {}", path.display())))?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(hex(ctx.finish().as_ref()))
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A random 32-hex-digit token from the kernel's CSPRNG.
///
/// # Errors
/// [`LabError::Io`] when /dev/urandom cannot be read.
pub fn random_token() -> Result<String> {
    Ok(hex(&random_bytes::<16>()?))
}

/// `N` bytes from `/dev/urandom` (tokens, the peer key).
///
/// # Errors
/// [`LabError::Io`] when `/dev/urandom` cannot be read.
pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut f = std::fs::File::open("/dev/urandom").map_err(io_ctx("open /dev/urandom"))?;
    f.read_exact(&mut b).map_err(io_ctx("read /dev/urandom"))?;
    Ok(b)
}

/// Standard base64 (RFC 4648 section 4, with padding), for kubeconfig `*-data` fields.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The lab's PKI, PEM encoded.
#[derive(Debug, Clone)]
pub struct Pki {
    /// CA certificate (PEM).
    pub ca_pem: String,
    /// CA certificate (DER), trusted by the bootstrap client.
    pub ca_der: Vec<u8>,
    /// API server serving certificate (PEM).
    pub server_cert_pem: String,
    /// API server serving key (PKCS#8 PEM).
    pub server_key_pem: String,
    /// Service-account signing key (PKCS#8 PEM).
    pub sa_key_pem: String,
    /// Service-account public key (SPKI PEM).
    pub sa_pub_pem: String,
}

/// Generates a CA and a serving certificate with `sans` (IP literals become IP SANs, the
/// rest DNS SANs), plus a service-account key pair. All keys are ECDSA P-256.
///
/// # Errors
/// [`LabError::Cert`] when rcgen rejects a SAN or fails to sign.
pub fn generate_pki(sans: &[String]) -> Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = cert_params(
        Vec::new(),
        "vipd-lab-ca",
        vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ],
    )?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate()?;
    let mut params = cert_params(
        sans.to_vec(),
        "kube-apiserver",
        vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ],
    )?;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = params.signed_by(&server_key, &issuer)?;

    let sa_key = KeyPair::generate()?;
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        ca_der: ca_cert.der().to_vec(),
        server_cert_pem: server_cert.pem(),
        server_key_pem: server_key.serialize_pem(),
        sa_key_pem: sa_key.serialize_pem(),
        sa_pub_pem: sa_key.public_key_pem(),
    })
}

/// Certificate parameters with `sans`, common name `cn` and `usages`.
fn cert_params(
    sans: Vec<String>,
    cn: &str,
    usages: Vec<KeyUsagePurpose>,
) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(sans)?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = usages;
    Ok(params)
}

/// Default serving-certificate SANs: the API address, the control-plane VIP used by the
/// scenarios, the node addresses (their local API proxies), loopback and the in-cluster
/// names.
pub fn default_sans(api: IpAddr, extra: &[IpAddr]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        api.to_string(),
        "127.0.0.1".into(),
        "::1".into(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
        "localhost".into(),
    ];
    v.extend(extra.iter().map(ToString::to_string));
    v.dedup();
    v
}

/// A kubeconfig (YAML) for `server` trusting `ca_pem`, authenticating with `token`.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: vipd-lab
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: {context}
  context:
    cluster: vipd-lab
    user: {user}
current-context: {context}
",
        context = yaml_str(&format!("{user}@vipd-lab")),
        ca = base64(ca_pem.as_bytes()),
        user = yaml_str(user),
    )
}

/// Quotes a string for YAML if it contains anything but `[A-Za-z0-9._-]`.
fn yaml_str(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        s.to_string()
    } else {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (i, o) in cases {
            assert_eq!(base64(i.as_bytes()), o, "input {i:?}");
        }
    }

    #[test]
    fn sums_file_is_parsed() {
        let text = "aa  kube-apiserver-v1.20.2-linux-amd64.xz\nBB  kube-apiserver (uncompressed)\n";
        assert_eq!(parse_sums(text), Some(("aa".into(), "bb".into())));
        assert_eq!(parse_sums("aa  other\n"), None);
    }

    #[test]
    fn pki_has_requested_sans() {
        let pki = generate_pki(&default_sans("192.0.2.2".parse().unwrap(), &[])).unwrap();
        assert!(pki.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.server_key_pem.contains("PRIVATE KEY"));
        assert!(pki.sa_pub_pem.contains("PUBLIC KEY"));
    }

    #[test]
    fn kubeconfig_quotes_user_names() {
        let k = kubeconfig("https://192.0.2.2:6443", "x", "system:node:a", "t");
        assert!(k.contains("- name: \"system:node:a\""));
        assert!(k.contains("certificate-authority-data: eA=="));
    }
}
