//! Building kube-rs clients from vipd's configuration.
//!
//! Control-plane election must talk to the node's *own* API server, never through the VIP
//! (scenario S14: when the kubeconfig points at the VIP, no node can take over once the
//! holder dies). [`election_client`] therefore overrides the kubeconfig's server with
//! `kubernetes_addr`, or `127.0.0.1:<port>` in control-plane mode.
//!
//! Every API connection vipd opens has TCP keepalive ([`API_KEEPALIVE_IDLE`],
//! [`API_KEEPALIVE_INTERVAL`], [`API_KEEPALIVE_PROBES`]) and `TCP_USER_TIMEOUT`
//! ([`API_TCP_USER_TIMEOUT`]): a connection whose peer stopped answering (half-open after
//! an API server crash, a network outage or a firewall dropping its state) fails within
//! [`API_DEAD_PEER_DETECTION`] (25 s), so a watch on it errors and is re-established
//! instead of waiting for a read timeout. kube-rs's `ClientBuilder::try_from(Config)`
//! offers no socket options, so [`client_builder`] assembles kube-rs's default stack
//! around a hyper-util `HttpConnector` with these options set.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use kube::client::{ClientBuilder, ConfigExt, DynBody};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{BoxError, ServiceBuilder, ServiceExt as _};
use tracing::warn;

use crate::obs::readiness::WatchActivity;

/// Where the API server is, as the client builders need it (composed by the configuration
/// from kube-vip's `k8s_config_file`, `kubernetes_addr`, `cp_enable` and `port`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// `k8s_config_file` / `--k8sConfigPath`; `None`: in-cluster or the default kubeconfig
    /// (and kube-vip's `/etc/kubernetes/admin.conf` in control-plane mode).
    pub kubeconfig: Option<std::path::PathBuf>,
    /// `kubernetes_addr`: the API server address (`host:port`) the elections use instead of
    /// the kubeconfig's server.
    pub kubernetes_addr: Option<String>,
    /// `cp_enable`: control-plane mode (elections fall back to `127.0.0.1:<port>`).
    pub control_plane: bool,
    /// `port` (default 6443): the local API server's port.
    pub port: u16,
}

/// Idle time of an API connection before the first TCP keepalive probe (`TCP_KEEPIDLE`).
pub(crate) const API_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between unanswered TCP keepalive probes (`TCP_KEEPINTVL`).
pub(crate) const API_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered TCP keepalive probes after which the connection is dropped (`TCP_KEEPCNT`).
pub(crate) const API_KEEPALIVE_PROBES: u32 = 3;
/// How long after the peer's last sign of life a dead API connection fails: keepalive
/// idle time plus all probes, 10 s + 3 × 5 s = 25 s.
pub(crate) const API_DEAD_PEER_DETECTION: Duration = Duration::from_secs(
    API_KEEPALIVE_IDLE.as_secs() + API_KEEPALIVE_INTERVAL.as_secs() * API_KEEPALIVE_PROBES as u64,
);
/// `TCP_USER_TIMEOUT` of API connections (Linux, RFC 5482): data sent and not acknowledged
/// for this long drops the connection (a request written to a dead connection fails
/// instead of being retransmitted for about 15 minutes); with keepalive it is also the
/// bound on unanswered probes. Equal to [`API_DEAD_PEER_DETECTION`].
pub(crate) const API_TCP_USER_TIMEOUT: Duration = API_DEAD_PEER_DETECTION;

/// The service stack of a kube-rs client as [`client_builder`] builds it (kube-rs's own
/// `GenericService`, which it does not export).
pub(crate) type ApiService = tower::util::BoxService<
    http::Request<kube::client::Body>,
    http::Response<Box<DynBody>>,
    BoxError,
>;

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
pub(crate) const KUBEADM_ADMIN_CONF: &str = "/etc/kubernetes/admin.conf";

/// The URL `kubernetes_addr` stands for: `host:port`, `[v6]:port` or a full `https://` URL.
///
/// # Errors
/// [`ClientError::Address`] when it does not parse as a URI with a host.
pub fn api_url(addr: &str) -> Result<http::Uri, ClientError> {
    crate::syntax::uri_with_default_scheme(addr, "https").map_err(|message| ClientError::Address {
        value: addr.to_string(),
        message,
    })
}

/// The kube-rs configuration from `k8s_config_file`, else in-cluster / `$KUBECONFIG` /
/// `~/.kube/config` (kube-rs `Config::infer`), else (control-plane mode)
/// [`KUBEADM_ADMIN_CONF`].
///
/// # Errors
/// [`ClientError::Kubeconfig`], [`ClientError::Infer`].
pub(crate) async fn base_config(cfg: &Settings) -> Result<kube::Config, ClientError> {
    kube_config(cfg.kubeconfig.as_deref(), cfg.control_plane).await
}

/// The rule behind [`base_config`], also used by `vipd status`: the kubeconfig at `path`;
/// else in-cluster / `$KUBECONFIG` / `~/.kube/config` (kube-rs `Config::infer`); else, when
/// `kubeadm_fallback`, [`KUBEADM_ADMIN_CONF`] if it exists.
///
/// # Errors
/// [`ClientError::Kubeconfig`], [`ClientError::Infer`].
pub(crate) async fn kube_config(
    path: Option<&Path>,
    kubeadm_fallback: bool,
) -> Result<kube::Config, ClientError> {
    match path {
        Some(path) => from_file(path).await,
        None => match kube::Config::infer().await {
            Ok(c) => Ok(c),
            // kube-vip's default k8s_config_file for control-plane static pods.
            Err(_) if kubeadm_fallback && Path::new(KUBEADM_ADMIN_CONF).exists() => {
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
pub(crate) fn election_address(cfg: &Settings) -> Option<String> {
    api_address(cfg.kubernetes_addr.as_deref(), cfg.control_plane, cfg.port)
}

/// The rule behind [`election_address`], also used by the generated manifests:
/// `kubernetes_addr` when set, else `127.0.0.1:<port>` in control-plane mode, else `None`.
pub(crate) fn api_address(
    kubernetes_addr: Option<&str>,
    control_plane: bool,
    port: impl std::fmt::Display,
) -> Option<String> {
    match (kubernetes_addr, control_plane) {
        (Some(a), _) => Some(a.to_string()),
        (None, true) => Some(format!("127.0.0.1:{port}")),
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
pub(crate) async fn election_client(cfg: &Settings) -> Result<(kube::Client, String), ClientError> {
    let kc = election_config(cfg).await?;
    let url = kc.cluster_url.to_string();
    let client = client_builder(&kc)?.build();
    Ok((client, url))
}

/// A client for a Lease's elector alone: [`election_client`]'s server and settings, built on
/// `elections` (the election runtime, [`crate::election::own_runtime`]) so that its request
/// queue, which kube-rs starts with `tokio::spawn` when the client is built, is driven there
/// and not by the caller's busy workers; `None`: on the caller's runtime.
///
/// # Errors
/// As [`election_client`].
pub(crate) async fn election_lease_client(
    cfg: &Settings,
    elections: Option<&tokio::runtime::Handle>,
) -> Result<kube::Client, ClientError> {
    let kc = election_config(cfg).await?;
    let builder = client_builder(&kc)?;
    Ok(match elections {
        // Every call a task there too ([`SpawnOnLayer`]), as the Services' lease client.
        Some(rt) => on_runtime(rt, || builder.with_layer(&SpawnOnLayer(rt.clone())).build()),
        None => builder.build(),
    })
}

/// Runs `build` (a client's construction) with `runtime` as the current runtime, so what it
/// spawns runs there (see [`election_lease_client`]).
fn on_runtime<T>(runtime: &tokio::runtime::Handle, build: impl FnOnce() -> T) -> T {
    let _on = runtime.enter();
    build()
}

/// kube-rs's default client stack for `kc` (base URL, kube-rs's retry of 429/503/504 when
/// `default_retry`, authentication, extra and impersonation headers, TLS with `kc`'s
/// roots, identity and server name, connect/read/write timeouts), on connections with TCP
/// keepalive and `TCP_USER_TIMEOUT` (see the module docs). Left out of kube-rs's stack:
/// its debug-level HTTP tracing spans, gzip (not enabled in vipd) and the client's
/// exec-credential expiry hint (vipd does not read it). With a `proxy-url` in the
/// kubeconfig, kube-rs's own stack is used (connections to the proxy have no keepalive;
/// logged as a warning).
///
/// # Errors
/// [`ClientError::Build`] when kube-rs rejects the TLS or authentication settings.
pub(crate) fn client_builder(kc: &kube::Config) -> Result<ClientBuilder<ApiService>, ClientError> {
    let build = |e: kube::Error| ClientError::Build(e.to_string());
    let mut kc = kc.clone();
    kc.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    let kc = &kc;
    if let Some(proxy) = &kc.proxy_url {
        warn!(proxy = %proxy, "API connections go through a proxy: no TCP keepalive on them");
        return ClientBuilder::try_from(kc.clone()).map_err(build);
    }
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_keepalive(Some(API_KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(API_KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(API_KEEPALIVE_PROBES));
    http.set_tcp_user_timeout(Some(API_TCP_USER_TIMEOUT));
    let https = kc
        .rustls_https_connector_with_connector(http)
        .map_err(build)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(kc.connect_timeout);
    connector.set_read_timeout(kc.read_timeout);
    connector.set_write_timeout(kc.write_timeout);
    connector.set_reset_reader_on_write(kc.reset_reader_on_write);
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(kc.base_uri_layer())
        .option_layer(kc.default_retry.then(|| {
            tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
        }))
        .option_layer(kc.auth_layer().map_err(build)?)
        .layer(kc.extra_headers_layer().map_err(build)?)
        .map_err(BoxError::from)
        .service(client)
        .map_response(|r: http::Response<hyper::body::Incoming>| {
            r.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(service, kc.default_namespace.clone()))
}

/// The User-Agent of vipd's API calls, `vipd/<version>`: the API server names the fields a
/// write without a field manager sets after its prefix (`managedFields[].manager: vipd`,
/// apiserver's `prefixFromUserAgent`), and audit logs and API priority and fairness see it.
/// kube-rs sends none, and the managers of vipd's status, annotation and label writes showed
/// as `unknown`.
pub(crate) const USER_AGENT: &str = concat!("vipd/", env!("CARGO_PKG_VERSION"));

/// First delay of [`WatchBackoff`].
pub(crate) const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(800);
/// Largest delay of [`WatchBackoff`] before jitter (with jitter at most 25 % more: 25 s).
pub(crate) const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(20);

/// Back-off of vipd's watches between failed attempts (S15): [`WATCH_BACKOFF_MIN`]
/// doubling to [`WATCH_BACKOFF_MAX`], each delay plus a random 0-25 % so that nodes do not
/// retry in step after an API outage; reset by any successful event. kube-runtime's
/// default (0.8 s doubling to 30 s, plus up to 100 % jitter) could wait 60 s before the
/// first attempt after a long outage; with this one a watch is back within about 25 s of
/// the API server (plus the 2 s connect timeout).
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    rng: u64,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // A random seed without another dependency: std's per-process random SipHash keys.
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        WatchBackoff {
            next: WATCH_BACKOFF_MIN,
            rng: seed | 1,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        // xorshift64: uniform enough for jitter.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let fraction = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        let base = self.next;
        self.next = (base * 2).min(WATCH_BACKOFF_MAX);
        Some(base + base.mul_f64(fraction * 0.25))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_MIN;
    }
}

/// The resource a watch request is for (the last segment of the path of a request with
/// `watch=true`/`watch=1` in its query, e.g. `services` for
/// `/api/v1/namespaces/default/services?watch=true&...`), `None` for other requests.
pub(crate) fn watch_resource(uri: &http::Uri) -> Option<&str> {
    let query = uri.query()?;
    if !query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
    {
        return None;
    }
    uri.path()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
}

/// A tower layer that reports every watch request answered with a success status to a
/// [`WatchActivity`] (under [`watch_resource`]): a watch (re)started. kube-runtime's
/// watcher restarts a watch silently when the server ends it, so this is how a healthy
/// but idle watch shows it is alive.
#[derive(Clone, Debug)]
pub(crate) struct WatchStartLayer(WatchActivity);

impl WatchStartLayer {
    /// Reports to `activity`.
    pub fn new(activity: WatchActivity) -> Self {
        Self(activity)
    }
}

impl<S> tower::Layer<S> for WatchStartLayer {
    type Service = WatchStart<S>;
    fn layer(&self, inner: S) -> WatchStart<S> {
        WatchStart {
            inner,
            activity: self.0.clone(),
        }
    }
}

/// The service of [`WatchStartLayer`].
#[derive(Clone, Debug)]
pub(crate) struct WatchStart<S> {
    inner: S,
    activity: WatchActivity,
}

impl<S, B> tower::Service<http::Request<kube::client::Body>> for WatchStart<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<B>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let watched = watch_resource(req.uri()).map(str::to_string);
        let activity = self.activity.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            if let (Some(w), Ok(resp)) = (&watched, &r)
                && resp.status().is_success()
            {
                activity.touch(w);
            }
            r
        })
    }
}

/// Lease requests (per-Service renewals, creates, deletes) the Services side keeps in
/// flight at once; see [`services_clients`].
pub(crate) const SERVICES_LEASE_MAX_IN_FLIGHT: usize = 16;
/// Other Services-side requests (status, annotations, Events, lists, watches) in flight at
/// once; see [`services_clients`].
pub(crate) const SERVICES_OTHER_MAX_IN_FLIGHT: usize = 16;

/// Server-side timeout (seconds) of the Services side's watches (Services, Nodes,
/// Endpoints/EndpointSlices, Leases); kube-rs's default is 290 s.
pub(crate) const SERVICES_WATCH_TIMEOUT_SECS: u32 = 55;

/// Read timeout of the Services side's connections: longer than
/// [`SERVICES_WATCH_TIMEOUT_SECS`], so an idle watch is never cut, but short enough that a
/// watch on a dead connection is noticed and re-established within about a minute.
pub(crate) const SERVICES_READ_TIMEOUT: Duration = Duration::from_secs(70);

/// The Services side's clients, to the same server as [`election_client`].
#[derive(Clone)]
pub(crate) struct ServicesClients {
    /// For per-Service Lease reads and writes only, so that renewals never queue behind a
    /// burst of status writes.
    pub leases: kube::Client,
    /// For everything else: Service status, annotations, Events, lists and watches.
    pub other: kube::Client,
    /// Activity of the watches run on `other`: successful watch (re)starts are reported
    /// here by its [`WatchStartLayer`]; the watches register and report their events.
    pub watches: WatchActivity,
    /// The runtime `leases` was built on, where the electors that use it run
    /// ([`crate::election::own_runtime`]); `None`: the caller's.
    pub elections: Option<tokio::runtime::Handle>,
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
/// `elections`: the runtime the Service electors run on
/// ([`crate::election::own_runtime`]); the lease client is built there, so its request
/// queue and connections are driven by that runtime, not by the caller's workers.
///
/// # Errors
/// As [`election_client`].
pub(crate) async fn services_clients(
    cfg: &Settings,
    elections: Option<&tokio::runtime::Handle>,
) -> Result<ServicesClients, ClientError> {
    let mut kc = election_config(cfg).await?;
    // Watches on these clients ask the server to end them after SERVICES_WATCH_TIMEOUT_SECS;
    // a read that waits longer than this means a dead connection (e.g. half-open after a
    // network outage), which then fails and is re-established instead of hanging until
    // kube-rs's default of 295 s.
    // TCP keepalive (client_builder) notices a dead connection sooner, in
    // API_DEAD_PEER_DETECTION.
    kc.read_timeout = Some(SERVICES_READ_TIMEOUT);
    let watches = WatchActivity::new();
    let limited = |max: usize| -> Result<ClientBuilder<_>, ClientError> {
        Ok(client_builder(&kc)?.with_layer(&tower::limit::ConcurrencyLimitLayer::new(max)))
    };
    Ok(ServicesClients {
        leases: leases_client(&kc, elections)?,
        other: limited(SERVICES_OTHER_MAX_IN_FLIGHT)?
            .with_layer(&WatchStartLayer::new(watches.clone()))
            .build(),
        watches,
        elections: elections.cloned(),
    })
}

/// The Services' lease client for `kc` ([`ServicesClients::leases`]): at most
/// [`SERVICES_LEASE_MAX_IN_FLIGHT`] calls in flight; with `elections`, its request queue
/// starts there (kube-rs starts it with `tokio::spawn` when the client is built) and every
/// call runs there as a task of its own ([`SpawnOnLayer`]). The latter matters because
/// hyper opens a connection, registers its socket and spawns its driver on the runtime of
/// the task that polls the call, and the pool hands that connection to any later call:
/// the peer protocol's API probe (every 250 ms) and lease deletes use this client from the
/// main runtime, and a renewal on their connection waited for the main runtime's workers.
fn leases_client(
    kc: &kube::Config,
    elections: Option<&tokio::runtime::Handle>,
) -> Result<kube::Client, ClientError> {
    let leases = client_builder(kc)?;
    Ok(match elections {
        Some(rt) => {
            let leases = leases.with_layer(&SpawnOnLayer(rt.clone())).with_layer(
                &tower::limit::ConcurrencyLimitLayer::new(SERVICES_LEASE_MAX_IN_FLIGHT),
            );
            on_runtime(rt, || leases.build())
        }
        None => leases
            .with_layer(&tower::limit::ConcurrencyLimitLayer::new(
                SERVICES_LEASE_MAX_IN_FLIGHT,
            ))
            .build(),
    })
}

/// Runs each call of the service it wraps as a task on its runtime (see [`leases_client`]):
/// the call's connection (opened, its socket registered, its driver spawned) belongs to
/// that runtime whichever task asked. A call dropped before its answer aborts its task.
#[derive(Clone)]
pub(crate) struct SpawnOnLayer(pub(crate) tokio::runtime::Handle);

impl<S> tower::Layer<S> for SpawnOnLayer {
    type Service = SpawnOn<S>;
    fn layer(&self, inner: S) -> SpawnOn<S> {
        SpawnOn {
            inner,
            runtime: self.0.clone(),
        }
    }
}

/// The service of [`SpawnOnLayer`].
pub(crate) struct SpawnOn<S> {
    inner: S,
    runtime: tokio::runtime::Handle,
}

/// Aborts its task when dropped (a call given up by its caller).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<S, R> tower::Service<R> for SpawnOn<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let mut task = AbortOnDrop(self.runtime.spawn(self.inner.call(req)));
        Box::pin(async move {
            match (&mut task.0).await {
                Ok(answer) => answer.map_err(Into::into),
                Err(e) => Err(BoxError::from(e)),
            }
        })
    }
}

/// A client for the process's shared watches ([`crate::kube::watch::spawn_shared`]: the
/// Node cache), to the same server as [`election_client`], and the [`WatchActivity`] its
/// [`WatchStartLayer`] reports their (re)starts to. Its reads time out after
/// [`SERVICES_READ_TIMEOUT`], as the Services side's: its watches run with
/// [`SERVICES_WATCH_TIMEOUT_SECS`].
///
/// # Errors
/// As [`election_client`].
pub(crate) async fn watch_client(
    cfg: &Settings,
) -> Result<(kube::Client, WatchActivity), ClientError> {
    let mut kc = election_config(cfg).await?;
    kc.read_timeout = Some(SERVICES_READ_TIMEOUT);
    let watches = WatchActivity::new();
    let client = client_builder(&kc)?
        .with_layer(&WatchStartLayer::new(watches.clone()))
        .build();
    Ok((client, watches))
}

/// The configuration [`election_client`] and [`services_clients`] are built from.
async fn election_config(cfg: &Settings) -> Result<kube::Config, ClientError> {
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
    use std::os::fd::BorrowedFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The socket of this process whose local address is `addr`, as (keepalive, idle,
    /// interval, probes, user timeout).
    fn socket_options(
        addr: std::net::SocketAddr,
    ) -> Option<(bool, Duration, Duration, u32, Duration)> {
        for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // SAFETY: only inspected while the client that owns it is alive (below).
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let sock = socket2::SockRef::from(&fd);
            if sock.local_addr().ok().and_then(|a| a.as_socket()) == Some(addr) {
                return Some((
                    sock.keepalive().ok()?,
                    sock.tcp_keepalive_time().ok()?,
                    sock.tcp_keepalive_interval().ok()?,
                    sock.tcp_keepalive_retries().ok()?,
                    sock.tcp_user_timeout().ok()??,
                ));
            }
        }
        None
    }

    /// A plain-HTTP/1.1 server on loopback, on threads of its own, that answers every
    /// request on a kept-alive connection with `ok`.
    fn keepalive_server() -> http::Uri {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut s) = conn else { return };
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if s.write_all(ok).is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        url
    }

    /// A lease call on the election runtime needs nothing of the main runtime, also on a
    /// pooled connection that a call from the main runtime opened (the peer protocol's API
    /// probe, every 250 ms, and lease deletes use this client there): with the main
    /// runtime's only worker blocked, the renewal is answered.
    #[test]
    fn lease_calls_on_the_election_runtime_need_no_other_runtime_on_a_pooled_connection() {
        let url = keepalive_server();
        // As election::own_runtime builds it: one worker.
        let runtime = |name: &str| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(name)
                .enable_all()
                .build()
                .unwrap()
        };
        let (main, elections_rt) = (runtime("main"), runtime("elections"));
        let elections = elections_rt.handle().clone();
        let client = leases_client(&kube::Config::new(url), Some(&elections)).unwrap();
        let get = |c: kube::Client| async move {
            c.request_text(http::Request::get("/readyz").body(Vec::new()).unwrap())
                .await
        };
        main.block_on(async {
            // A call from the main runtime opens the connection the pool keeps.
            assert_eq!(get(client.clone()).await.unwrap(), "ok");
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (tx, rx) = std::sync::mpsc::channel();
            let c = client.clone();
            elections.spawn(async move {
                let _ = tx.send(tokio::time::timeout(Duration::from_secs(3), get(c)).await);
            });
            // The main runtime's only worker blocked while the election runtime's call runs.
            let got = tokio::spawn(async move { rx.recv_timeout(Duration::from_secs(10)) })
                .await
                .unwrap();
            assert!(
                matches!(&got, Ok(Ok(Ok(body))) if body == "ok"),
                "the renewal waited for the main runtime: {got:?}"
            );
        });
    }

    /// Every API connection has TCP keepalive 10 s / 5 s / 3 probes and TCP_USER_TIMEOUT
    /// 25 s, and its calls carry vipd's User-Agent (a plain-HTTP server on loopback stands in
    /// for the API server).
    #[tokio::test]
    async fn api_connections_have_keepalive_and_user_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: http::Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let server = tokio::spawn(async move {
            let (mut s, peer) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).await.unwrap();
            let opts = socket_options(peer);
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            (opts, String::from_utf8_lossy(&buf[..n]).to_lowercase())
        });
        let client = client_builder(&kube::Config::new(url)).unwrap().build();
        let body = client
            .request_text(http::Request::get("/version").body(Vec::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(body, "ok");
        let (opts, request) = server.await.unwrap();
        let opts = opts.expect("the client's socket");
        assert!(
            request.contains(&format!("user-agent: {USER_AGENT}")),
            "every call names vipd: {request}"
        );
        assert_eq!(
            opts,
            (
                true,
                Duration::from_secs(10),
                Duration::from_secs(5),
                3,
                Duration::from_secs(25)
            )
        );
        assert_eq!(API_DEAD_PEER_DETECTION, Duration::from_secs(25));
    }

    #[test]
    fn watch_backoff_doubles_to_its_cap_with_bounded_jitter_and_resets() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff::default();
        let within = |d: Duration, base: Duration| d >= base && d <= base.mul_f64(1.25);
        let bases = [0.8, 1.6, 3.2, 6.4, 12.8, 20.0, 20.0, 20.0];
        for base in bases {
            let d = b.next().unwrap();
            assert!(within(d, Duration::from_secs_f64(base)), "{d:?} for {base}");
        }
        b.reset();
        assert!(within(b.next().unwrap(), WATCH_BACKOFF_MIN));
        let delays: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| b.next().unwrap()).collect();
        assert!(delays.len() > 5, "jitter varies the delays: {delays:?}");
    }

    #[test]
    fn watch_requests_name_their_resource() {
        let r = |u: &'static str| watch_resource(&http::Uri::from_static(u)).map(str::to_string);
        assert_eq!(
            r("/api/v1/namespaces/default/services?&watch=true&timeoutSeconds=55"),
            Some("services".into())
        );
        assert_eq!(
            r("https://10.0.0.1:6443/k8s/clusters/c-1/apis/coordination.k8s.io/v1/leases?watch=1"),
            Some("leases".into())
        );
        assert_eq!(r("/api/v1/services?limit=500"), None, "a list");
        assert_eq!(r("/api/v1/services?watch=false"), None);
        assert_eq!(r("/api/v1/services"), None);
    }

    /// The layer reports a watch (re)start when its response headers arrive with a success
    /// status, and nothing for failed watches or other requests.
    #[tokio::test(start_paused = true)]
    async fn watch_start_layer_reports_successful_watch_starts() {
        use tower::{Layer, Service};
        let activity = WatchActivity::new();
        activity.register("services", Duration::from_secs(55));
        activity.register("nodes", Duration::from_secs(55));
        let inner = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
            let status = if req.uri().path().ends_with("nodes") {
                403
            } else {
                200
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(status).body(()).unwrap(),
            )
        });
        let mut svc = WatchStartLayer::new(activity.clone()).layer(inner);
        let mut call = async |uri: &'static str| {
            let req = http::Request::get(uri)
                .body(kube::client::Body::empty())
                .unwrap();
            svc.call(req).await.unwrap();
        };
        tokio::time::advance(Duration::from_secs(69)).await;
        call("/api/v1/services?watch=true").await;
        call("/api/v1/nodes?watch=true").await;
        call("/api/v1/endpoints?watch=true").await;
        tokio::time::advance(Duration::from_secs(2)).await;
        let stalled = activity.stalled(tokio::time::Instant::now());
        assert_eq!(
            stalled,
            vec![("nodes".to_string(), Duration::from_secs(71))]
        );
    }

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
