//! Building kube-rs clients from vipd's configuration.
//!
//! Control-plane election must talk to the node's *own* API server, never through the VIP
//! (scenario S14: when the kubeconfig points at the VIP, no node can take over once the
//! holder dies). [`election_client`] therefore overrides the kubeconfig's server with
//! `kubernetes_addr`, or `127.0.0.1:<port>` in control-plane mode.

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::config::Config;

/// Errors while building a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("k8s_config_file {path}: {message}")]
    Kubeconfig {
        /// The path given (`k8s_config_file` / `--k8sConfigPath`).
        path: String,
        /// What went wrong.
        message: String,
    },
    /// No kubeconfig given and neither in-cluster nor default kubeconfig works.
    #[error(
        "no Kubernetes credentials: set k8s_config_file (--k8sConfigPath) or run in a pod: {0}"
    )]
    Infer(String),
    /// `kubernetes_addr` is not a usable `host:port` / URL.
    #[error("kubernetes_addr {value:?}: {message}")]
    Address {
        /// The value.
        value: String,
        /// Why it is wrong.
        message: String,
    },
    /// kube-rs refused the resulting configuration.
    #[error("cannot build the Kubernetes client: {0}")]
    Build(String),
}

/// kube-vip's default `k8s_config_file` in control-plane mode (kubeadm's admin kubeconfig),
/// used when no kubeconfig is configured and no in-cluster / default one is found.
pub const KUBEADM_ADMIN_CONF: &str = "/etc/kubernetes/admin.conf";

/// The URL `kubernetes_addr` stands for: `host:port`, `[v6]:port` or a full `https://` URL.
///
/// # Errors
/// [`ClientError::Address`] when it does not parse as a URI with a host.
pub fn api_url(addr: &str) -> Result<http::Uri, ClientError> {
    let text = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("https://{addr}")
    };
    let uri: http::Uri = text
        .parse()
        .map_err(|e: http::uri::InvalidUri| ClientError::Address {
            value: addr.to_string(),
            message: e.to_string(),
        })?;
    if uri.host().is_none() {
        return Err(ClientError::Address {
            value: addr.to_string(),
            message: "no host".into(),
        });
    }
    Ok(uri)
}

/// The kube-rs configuration from `k8s_config_file`, else in-cluster / `$KUBECONFIG` /
/// `~/.kube/config` (kube-rs `Config::infer`), else (control-plane mode)
/// [`KUBEADM_ADMIN_CONF`].
///
/// # Errors
/// [`ClientError::Kubeconfig`], [`ClientError::Infer`].
pub async fn base_config(cfg: &Config) -> Result<kube::Config, ClientError> {
    match &cfg.kubeconfig {
        Some(path) => from_file(path).await,
        None => match kube::Config::infer().await {
            Ok(c) => Ok(c),
            // kube-vip's default k8s_config_file for control-plane static pods.
            Err(_) if cfg.control_plane && Path::new(KUBEADM_ADMIN_CONF).exists() => {
                from_file(Path::new(KUBEADM_ADMIN_CONF)).await
            }
            Err(e) => Err(ClientError::Infer(e.to_string())),
        },
    }
}

async fn from_file(path: &Path) -> Result<kube::Config, ClientError> {
    let err = |m: String| ClientError::Kubeconfig {
        path: path.display().to_string(),
        message: m,
    };
    let kc = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))
}

/// The API server address the election talks to: `kubernetes_addr` when set; in
/// control-plane mode otherwise `127.0.0.1:<port>` (the node's own API server); in
/// services-only mode `None` (the kubeconfig's server is used).
pub fn election_address(cfg: &Config) -> Option<String> {
    match (&cfg.kubernetes_addr, cfg.control_plane) {
        (Some(a), _) => Some(a.clone()),
        (None, true) => Some(format!("127.0.0.1:{}", cfg.port)),
        (None, false) => None,
    }
}

/// A client for leader election and health checks (see module docs). When the server is
/// overridden with an IP address and the kubeconfig names no TLS server name, the
/// certificate is checked against the name `kubernetes`, which kubeadm, k3s and RKE2 all put
/// in the API server's certificate. Returns the client and the URL it talks to.
///
/// # Errors
/// See [`base_config`] and [`api_url`]; [`ClientError::Build`].
pub async fn election_client(cfg: &Config) -> Result<(kube::Client, String), ClientError> {
    let kc = election_config(cfg).await?;
    let url = kc.cluster_url.to_string();
    let client = kube::Client::try_from(kc).map_err(|e| ClientError::Build(e.to_string()))?;
    Ok((client, url))
}

/// Lease requests (per-Service renewals, creates, deletes) the Services side keeps in
/// flight at once; see [`services_clients`].
pub const SERVICES_LEASE_MAX_IN_FLIGHT: usize = 16;
/// Other Services-side requests (status, annotations, Events, lists, watches) in flight at
/// once; see [`services_clients`].
pub const SERVICES_OTHER_MAX_IN_FLIGHT: usize = 16;

/// Server-side timeout (seconds) of the Services side's watches (Services, Nodes,
/// Endpoints/EndpointSlices, Leases); kube-rs's default is 290 s.
pub const SERVICES_WATCH_TIMEOUT_SECS: u32 = 55;

/// Read timeout of the Services side's connections: longer than
/// [`SERVICES_WATCH_TIMEOUT_SECS`], so an idle watch is never cut, but short enough that a
/// watch on a dead connection is noticed and re-established within about a minute.
pub const SERVICES_READ_TIMEOUT: Duration = Duration::from_secs(70);

/// The Services side's clients, to the same server as [`election_client`].
#[derive(Clone)]
pub struct ServicesClients {
    /// For per-Service Lease reads and writes only, so that renewals never queue behind a
    /// burst of status writes.
    pub leases: kube::Client,
    /// For everything else: Service status, annotations, Events, lists and watches.
    pub other: kube::Client,
}

/// Builds [`ServicesClients`]. Each has its own connections and keeps at most
/// [`SERVICES_LEASE_MAX_IN_FLIGHT`] / [`SERVICES_OTHER_MAX_IN_FLIGHT`] requests waiting for
/// their response headers; further requests queue in order (tower `ConcurrencyLimit`).
/// kube-rs speaks HTTP/1.1, one request per connection: without a limit, hundreds of lease
/// renewals due together opened hundreds of TLS connections (about 12 MB at 1000 Services).
/// Being separate from the election client also keeps such bursts from delaying the
/// control-plane lease. Time spent queued counts against each call's own timeout; a watch
/// holds its slot only until its response headers arrive.
///
/// # Errors
/// As [`election_client`].
pub async fn services_clients(cfg: &Config) -> Result<ServicesClients, ClientError> {
    let mut kc = election_config(cfg).await?;
    // Watches on these clients ask the server to end them after SERVICES_WATCH_TIMEOUT_SECS;
    // a read that waits longer than this means a dead connection (e.g. half-open after a
    // network outage), which then fails and is re-established instead of hanging until
    // kube-rs's default of 295 s.
    kc.read_timeout = Some(SERVICES_READ_TIMEOUT);
    let limited = |max: usize| -> Result<kube::Client, ClientError> {
        let builder = kube::client::ClientBuilder::try_from(kc.clone())
            .map_err(|e| ClientError::Build(e.to_string()))?;
        Ok(builder
            .with_layer(&tower::limit::ConcurrencyLimitLayer::new(max))
            .build())
    };
    Ok(ServicesClients {
        leases: limited(SERVICES_LEASE_MAX_IN_FLIGHT)?,
        other: limited(SERVICES_OTHER_MAX_IN_FLIGHT)?,
    })
}

/// The configuration [`election_client`] and [`services_clients`] are built from.
async fn election_config(cfg: &Config) -> Result<kube::Config, ClientError> {
    let mut kc = base_config(cfg).await?;
    if let Some(addr) = election_address(cfg) {
        let uri = api_url(&addr)?;
        let host_is_ip = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
            .is_some_and(|h| h.parse::<std::net::IpAddr>().is_ok());
        if host_is_ip && kc.tls_server_name.is_none() {
            kc.tls_server_name = Some("kubernetes".to_string());
        }
        kc.cluster_url = uri;
    }
    // Lease calls carry their own timeouts (see `election::Timing::call_timeout`); the
    // transport only bounds connecting. The read timeout stays kube-rs's (295 s), longer
    // than a watch's server-side timeout: a shorter one breaks idle watches.
    kc.connect_timeout = Some(Duration::from_secs(2));
    Ok(kc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_to_https_urls() {
        assert_eq!(
            api_url("127.0.0.1:6443").unwrap().to_string(),
            "https://127.0.0.1:6443/"
        );
        assert_eq!(
            api_url("[2001:db8::1]:6443").unwrap().host(),
            Some("[2001:db8::1]")
        );
        assert_eq!(
            api_url("https://api.example:443").unwrap().port_u16(),
            Some(443)
        );
        let e = api_url("bad host:1").unwrap_err().to_string();
        assert!(
            e.contains("kubernetes_addr") && e.contains("bad host:1"),
            "{e}"
        );
    }
}
