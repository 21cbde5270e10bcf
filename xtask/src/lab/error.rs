//! Errors returned by the lab.

use std::path::PathBuf;

/// Everything that can go wrong while building, using or tearing down a lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// An I/O operation failed; `context` says which one (file, socket, namespace).
    #[error("{context}: {source}")]
    Io {
        /// What was being done, e.g. `open /run/netns/vl12x0-api`.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An external command (`ip`, `xz`, `apt-get`) exited unsuccessfully.
    #[error("command `{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line, space separated.
        command: String,
        /// Exit status as printed by the OS.
        status: String,
        /// Captured standard error (trimmed).
        stderr: String,
    },
    /// The lab needs root (network namespaces, veth pairs, raw sockets).
    #[error(
        "the lab needs root (network namespaces, veth pairs, raw sockets) but runs as uid {uid}; \
         run `sudo -E cargo xtask test`, or set VIPD_SKIP_LAB=1 to skip lab tests explicitly"
    )]
    NotRoot {
        /// Effective uid of this process.
        uid: u32,
    },
    /// No kube-apiserver v1.20.2 binary could be found; `help` says how to get one.
    #[error("kube-apiserver v1.20.2 not found.\n{help}")]
    ApiServerMissing {
        /// Step-by-step instructions (the assets README text).
        help: String,
    },
    /// A file did not have the SHA-256 listed in SHA256SUMS.
    #[error("{path}: SHA-256 {actual} does not match {expected} from SHA256SUMS")]
    Checksum {
        /// The file that was hashed.
        path: PathBuf,
        /// Expected lower-case hex digest.
        expected: String,
        /// Actual lower-case hex digest.
        actual: String,
    },
    /// Something did not become ready in time.
    #[error("timed out after {seconds:.1} s waiting for {what}")]
    Timeout {
        /// What was awaited, e.g. `kube-apiserver /readyz`.
        what: String,
        /// How long was waited, in seconds.
        seconds: f64,
    },
    /// A name given to a lab helper is not one of the lab's namespaces or nodes.
    #[error("unknown lab namespace `{name}` (expected one of: {expected})")]
    UnknownNamespace {
        /// The name given by the caller.
        name: String,
        /// The accepted names, comma separated.
        expected: String,
    },
    /// The lab API server answered an HTTP request with an unexpected status.
    #[error("{method} {path} on the lab API server returned HTTP {status}: {body}")]
    Http {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// HTTP status code (0 when the response could not be parsed).
        status: u16,
        /// Response body (truncated to 500 bytes).
        body: String,
    },
    /// Certificate or key generation failed.
    #[error("certificate generation failed: {0}")]
    Cert(#[from] rcgen::Error),
    /// TLS set-up for the lab's bootstrap client failed.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// Output of a tool or a state file could not be parsed.
    #[error("cannot parse {what}: {detail}")]
    Parse {
        /// What was parsed, e.g. `ip -j addr output`.
        what: String,
        /// Why it failed.
        detail: String,
    },
    /// A helper thread (capture, proxy, closure in a namespace) failed.
    #[error("lab thread `{name}` failed: {detail}")]
    Thread {
        /// Thread name.
        name: String,
        /// Why it failed.
        detail: String,
    },
}

/// Result alias for lab operations.
pub type Result<T> = std::result::Result<T, LabError>;

/// Builds a closure turning an [`std::io::Error`] into [`LabError::Io`] with `context`.
pub(crate) fn io_ctx(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let context = context.into();
    move |source| LabError::Io { context, source }
}
