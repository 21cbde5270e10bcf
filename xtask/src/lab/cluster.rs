//! Starting, restarting and talking to the lab's control plane (etcd + kube-apiserver in
//! ns `api`); the PKI, tokens and kubeconfigs come from [`super::control_plane`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::{LabError, Result, io_ctx};
use super::{
    API_IP, API_PORT, ApiClient, CONTROL_PLANE_VIP, HttpResponse, Lab, LabOptions, NODE_GROUP,
    NODES, NodeRbac, Signal, control_plane, netns, node_ipv4, node_user, trace,
};

/// Length of the peer key `vipd manifest rbac` generates (bytes; vipd's minimum,
/// `peer::wire::MIN_KEY_LEN`).
pub const PEER_KEY_LEN: usize = 32;

/// A control-plane process of the lab (see [`Lab::restart_control_plane`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlPlaneProcess {
    /// etcd (ns `api`, 127.0.0.1:2379).
    Etcd = 0,
    /// kube-apiserver (ns `api`, :6443).
    ApiServer = 1,
}

/// Command line of a control-plane process, kept to restart it.
#[derive(Debug, Clone)]
pub(super) struct ControlPlaneCmd {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// etcd's command line in the lab (data in `data_dir`, client URL 127.0.0.1:2379).
fn etcd_args(data_dir: &str) -> Vec<String> {
    [
        "--name",
        "lab",
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        "http://127.0.0.1:2379",
        "--advertise-client-urls",
        "http://127.0.0.1:2379",
        "--listen-peer-urls",
        "http://127.0.0.1:2380",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:2380",
        "--initial-cluster",
        "lab=http://127.0.0.1:2380",
        "--log-level",
        "warn",
        "--logger",
        "zap",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The files [`Lab::start_control_plane`] writes to `<dir>/pki/`.
struct PkiFiles {
    pki_dir: PathBuf,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    sa_key: PathBuf,
    sa_pub: PathBuf,
    /// The CA certificate (PEM), for the kubeconfigs.
    ca_pem: String,
}

/// Writes `data` to `dir/name` and returns the path.
fn write_file(dir: &Path, name: &str, data: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, data).map_err(io_ctx(format!("write {}", p.display())))?;
    Ok(p)
}

/// kube-apiserver's command line in the lab (etcd on 127.0.0.1:2379, token and RBAC
/// authorisation, the PKI in `files`), followed by the `extra` flags of the test.
fn apiserver_args(files: &PkiFiles, tokens_csv: &Path, extra: &[String]) -> Vec<String> {
    let p = |x: &Path| x.to_string_lossy().into_owned();
    let mut args: Vec<String> = vec![
        "--etcd-servers=http://127.0.0.1:2379".into(),
        "--bind-address=0.0.0.0".into(),
        format!("--advertise-address={API_IP}"),
        format!("--secure-port={API_PORT}"),
        "--insecure-port=0".into(),
        format!("--tls-cert-file={}", p(&files.cert)),
        format!("--tls-private-key-file={}", p(&files.key)),
        format!("--client-ca-file={}", p(&files.ca)),
        format!("--token-auth-file={}", p(tokens_csv)),
        format!("--service-account-key-file={}", p(&files.sa_pub)),
        format!("--service-account-signing-key-file={}", p(&files.sa_key)),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        "--authorization-mode=RBAC".into(),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        // Every LoadBalancer Service takes a node port (no kube-proxy in the lab serves
        // them): 30000-32767, the default, holds only 2768, and the scale bench creates
        // 10 000.
        "--service-node-port-range=30000-65000".into(),
        format!("--cert-dir={}", p(&files.pki_dir)),
        "--profiling=false".into(),
        "--enable-priority-and-fairness=false".into(),
        "--allow-privileged=true".into(),
    ];
    args.extend(extra.iter().cloned());
    args
}

impl Lab {
    /// Starts the control plane: writes the PKI, tokens and kubeconfigs under the lab
    /// directory, starts etcd and kube-apiserver in ns `api`, waits until the API server is
    /// ready and applies `opts.node_rbac`.
    pub(super) fn start_control_plane(
        &mut self,
        opts: &LabOptions,
        apiserver: &Path,
    ) -> Result<()> {
        let files = self.write_pki(opts)?;
        let tokens_csv = self.write_tokens(&files.pki_dir)?;
        self.write_kubeconfigs(&files.ca_pem)?;
        self.start_etcd()?;
        let args = apiserver_args(&files, &tokens_csv, &opts.apiserver_args);
        self.start_control_plane_process(apiserver, args, Vec::new())?;
        let started_cp = Instant::now();
        let deadline = started_cp + opts.ready_timeout;
        self.wait_ready(started_cp, deadline)?;
        if opts.node_rbac == NodeRbac::ClusterAdmin {
            self.bind_nodes_to_cluster_admin(deadline)?;
        }
        Ok(())
    }

    /// Generates the CA, the serving certificate (SANs: the API address, the control-plane
    /// VIP, the nodes and `opts.extra_sans`) and the service-account keys, writes them to
    /// `<dir>/pki/` and keeps the CA (DER) for the bootstrap client.
    fn write_pki(&mut self, opts: &LabOptions) -> Result<PkiFiles> {
        let mut extra: Vec<IpAddr> = vec![IpAddr::V4(CONTROL_PLANE_VIP)];
        extra.extend(NODES.iter().filter_map(|n| node_ipv4(n)).map(IpAddr::V4));
        extra.extend(opts.extra_sans.iter().copied());
        let pki =
            control_plane::generate_pki(&control_plane::default_sans(IpAddr::V4(API_IP), &extra))?;
        let pki_dir = self.dir.join("pki");
        let files = PkiFiles {
            ca: write_file(&pki_dir, "ca.crt", &pki.ca_pem)?,
            cert: write_file(&pki_dir, "server.crt", &pki.server_cert_pem)?,
            key: write_file(&pki_dir, "server.key", &pki.server_key_pem)?,
            sa_key: write_file(&pki_dir, "sa.key", &pki.sa_key_pem)?,
            sa_pub: write_file(&pki_dir, "sa.pub", &pki.sa_pub_pem)?,
            pki_dir,
            ca_pem: pki.ca_pem,
        };
        self.ca_der = pki.ca_der;
        Ok(files)
    }

    /// Draws a token per node user and writes `tokens.csv` (admin in `system:masters`,
    /// node users in [`NODE_GROUP`]) to `pki_dir`; returns its path.
    fn write_tokens(&mut self, pki_dir: &Path) -> Result<PathBuf> {
        let mut tokens = format!("{},admin,uid-admin,\"system:masters\"\n", self.admin_token);
        for node in NODES {
            let t = control_plane::random_token()?;
            tokens.push_str(&format!(
                "{t},{},uid-{node},\"{NODE_GROUP}\"\n",
                node_user(node)
            ));
            self.node_tokens.insert(node.to_string(), t);
        }
        write_file(pki_dir, "tokens.csv", &tokens)
    }

    /// Writes `<dir>/kubeconfig/`: `admin.yaml`, and per node `<node>.yaml` (server
    /// [`Lab::api_url`]) and `<node>-local.yaml` (server [`Lab::local_api_url`]).
    fn write_kubeconfigs(&self, ca_pem: &str) -> Result<()> {
        let kdir = self.dir.join("kubeconfig");
        let api_url = self.api_url();
        let local_url = self.local_api_url();
        let kc = |name: String, server: &str, user: &str, token: &str| -> Result<()> {
            let kubeconfig = control_plane::kubeconfig(server, ca_pem, user, token);
            write_file(&kdir, &name, &kubeconfig).map(drop)
        };
        kc("admin.yaml".into(), &api_url, "admin", &self.admin_token)?;
        for node in NODES {
            let t = self.node_tokens.get(node).cloned().unwrap_or_default();
            kc(format!("{node}.yaml"), &api_url, &node_user(node), &t)?;
            kc(
                format!("{node}-local.yaml"),
                &local_url,
                &node_user(node),
                &t,
            )?;
        }
        Ok(())
    }

    /// Starts etcd in ns `api` with its data in `<dir>/etcd`.
    fn start_etcd(&mut self) -> Result<()> {
        let etcd_dir = self.dir.join("etcd");
        let etcd_dir_s = etcd_dir.to_string_lossy().into_owned();
        self.start_control_plane_process(
            Path::new("etcd"),
            etcd_args(&etcd_dir_s),
            vec![("ETCD_UNSUPPORTED_ARCH".into(), String::new())],
        )
    }

    /// Spawns one control-plane process in ns `api` and keeps its command line for
    /// [`Lab::restart_control_plane`].
    fn start_control_plane_process(
        &mut self,
        program: &Path,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<()> {
        let env_ref: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let p = self.spawn("api", program, &args, &env_ref)?;
        self.control_plane.push(p);
        self.control_plane_cmds.push(ControlPlaneCmd {
            program: program.to_path_buf(),
            args,
            env,
        });
        Ok(())
    }

    /// Waits (until `deadline`) for /readyz, then for namespaces `default` and
    /// `kube-system`.
    fn wait_ready(&mut self, started_cp: Instant, deadline: Instant) -> Result<()> {
        self.wait_api("kube-apiserver /readyz", deadline, |c| {
            Ok(c.request("GET", "/readyz", None)?.status == 200)
        })?;
        trace(started_cp, "kube-apiserver /readyz ok");
        for ns in ["default", "kube-system"] {
            self.wait_api(&format!("namespace {ns}"), deadline, |c| {
                Ok(c.request("GET", &format!("/api/v1/namespaces/{ns}"), None)?
                    .status
                    == 200)
            })?;
        }
        trace(started_cp, "namespaces default and kube-system exist");
        Ok(())
    }

    /// Creates ClusterRoleBinding `vipd-lab-nodes` (group [`NODE_GROUP`] to
    /// `cluster-admin`), retrying until `deadline` while RBAC bootstrap lags.
    fn bind_nodes_to_cluster_admin(&mut self, deadline: Instant) -> Result<()> {
        let crb = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "vipd-lab-nodes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                          "name": NODE_GROUP}],
        })
        .to_string();
        self.wait_api("ClusterRoleBinding vipd-lab-nodes", deadline, |c| {
            let r = c.request(
                "POST",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                Some(&crb),
            )?;
            match r.status {
                200..=299 | 409 => Ok(true),
                // RBAC bootstrap (cluster-admin role) may lag a moment behind /readyz.
                403 | 404 | 500 | 503 => Ok(false),
                s => Err(LabError::Http {
                    method: "POST".into(),
                    path: "clusterrolebindings".into(),
                    status: s,
                    body: r.body.chars().take(500).collect(),
                }),
            }
        })?;
        Ok(())
    }

    /// Restarts etcd or kube-apiserver (chaos soak: "API server restart", "etcd restart"):
    /// SIGCONT (in case it was frozen), SIGTERM, up to 10 s to exit, then SIGKILL; starts it
    /// again with the same command line and data directory, and waits until the API
    /// server's /readyz answers 200 again (at most `ready_timeout`).
    ///
    /// # Errors
    /// [`LabError::Io`] when it cannot be stopped or started, [`LabError::Timeout`] when the
    /// API server is not ready in time, [`LabError::Thread`] when a control-plane process
    /// exits meanwhile.
    pub fn restart_control_plane(
        &mut self,
        which: ControlPlaneProcess,
        ready_timeout: Duration,
    ) -> Result<()> {
        self.restart_control_plane_after(which, Duration::ZERO, ready_timeout)
    }

    /// Like [`Lab::restart_control_plane`], with the process down for `down` (not running:
    /// connections are refused) before it is started again.
    ///
    /// # Errors
    /// As [`Lab::restart_control_plane`].
    pub fn restart_control_plane_after(
        &mut self,
        which: ControlPlaneProcess,
        down: Duration,
        ready_timeout: Duration,
    ) -> Result<()> {
        let i = which as usize;
        let cmd = self
            .control_plane_cmds
            .get(i)
            .cloned()
            .ok_or_else(|| LabError::Thread {
                name: format!("{which:?}"),
                detail: "not started by this lab".into(),
            })?;
        if let Some(p) = self.control_plane.get_mut(i) {
            let _ = p.signal(Signal::SIGCONT);
            p.stop(Duration::from_secs(10))?;
        }
        std::thread::sleep(down);
        let env: Vec<(&str, &str)> = cmd
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let p = self.spawn("api", &cmd.program, &cmd.args, &env)?;
        if let Some(slot) = self.control_plane.get_mut(i) {
            *slot = p;
        }
        let deadline = Instant::now() + ready_timeout;
        self.wait_api("kube-apiserver /readyz after a restart", deadline, |c| {
            Ok(c.request("GET", "/readyz", None)?.status == 200)
        })
    }

    /// Polls `check` (run with an admin client inside ns `api`) every 100 ms until it
    /// returns true; connection errors count as "not yet". Fails fast if a control-plane
    /// process exits.
    fn wait_api(
        &mut self,
        what: &str,
        deadline: Instant,
        check: impl Fn(&ApiClient) -> Result<bool> + Sync,
    ) -> Result<()> {
        let started = Instant::now();
        let client =
            self.admin_client(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), API_PORT))?;
        let path = self.netns_path("api")?;
        loop {
            let res = netns::run_in_netns(&path, || check(&client))?;
            match res {
                Ok(true) => return Ok(()),
                Ok(false) | Err(LabError::Io { .. }) => {}
                Err(e) => return Err(e),
            }
            for p in &mut self.control_plane {
                if let Some(st) = p.try_wait()? {
                    let log = p.log();
                    let tail: String = log
                        .lines()
                        .rev()
                        .take(15)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n");
                    return Err(LabError::Thread {
                        name: p.name().to_string(),
                        detail: format!(
                            "exited ({st}) while waiting for {what}; log tail:\n{tail}"
                        ),
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(LabError::Timeout {
                    what: what.to_string(),
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// An admin (system:masters) client for the API server at `addr`. It must be used from a
    /// thread inside a lab namespace (see [`Lab::in_netns`]).
    ///
    /// # Errors
    /// [`LabError::Tls`] if the CA cannot be loaded.
    pub fn admin_client(&self, addr: SocketAddr) -> Result<ApiClient> {
        ApiClient::new(addr, &self.ca_der, &self.admin_token)
    }

    /// Registers Node `name` as a Ready control-plane node (label
    /// `node-role.kubernetes.io/control-plane`, `Ready=True`) with `ips` as its InternalIP
    /// addresses (as admin; the lab has no kubelet): the backends of vipd's control-plane
    /// load balancer.
    ///
    /// # Errors
    /// [`LabError::Http`] when the create does not answer 201 or the status patch 200;
    /// transport errors as [`Lab::api_request`].
    pub fn register_control_plane_node(&self, name: &str, ips: &[IpAddr]) -> Result<()> {
        let node = serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"node-role.kubernetes.io/control-plane": "true"}}});
        let status = serde_json::json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "lab", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "addresses": ips.iter().map(|ip| serde_json::json!({"type": "InternalIP", "address": ip.to_string()}))
                .chain([serde_json::json!({"type": "Hostname", "address": name})]).collect::<Vec<_>>()}});
        let status_path = format!("/api/v1/nodes/{name}/status");
        for (method, path, body, want) in [
            ("POST", "/api/v1/nodes", node, 201),
            ("PATCH", status_path.as_str(), status, 200),
        ] {
            let r = self.api_request(method, path, Some(&body.to_string()))?;
            if r.status != want {
                return Err(LabError::Http {
                    method: method.into(),
                    path: path.into(),
                    status: r.status,
                    body: r.body.chars().take(500).collect(),
                });
            }
        }
        Ok(())
    }

    /// Creates a Node object for each of `names` (as admin; the lab has no kubelet): the
    /// peer membership of `svc_ridethrough` (docs/design.md, "Membership").
    ///
    /// # Errors
    /// [`LabError::Http`] when a create does not answer 201; transport errors as
    /// [`Lab::api_request`].
    pub fn register_nodes(&self, names: &[&str]) -> Result<()> {
        for n in names {
            let node =
                serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}});
            self.create_as_admin("/api/v1/nodes", &node)?;
        }
        Ok(())
    }

    /// Creates the peer key Secret `vipd-peer-key` in `kube-system` as `vipd manifest rbac`
    /// writes it: [`PEER_KEY_LEN`] random bytes under data key `key`. Returns the key
    /// (e.g. for a simulated peer's key file).
    ///
    /// # Errors
    /// [`LabError::Io`] when no random bytes can be read; [`LabError::Http`] when the create
    /// does not answer 201; transport errors as [`Lab::api_request`].
    pub fn create_peer_key_secret(&self) -> Result<[u8; PEER_KEY_LEN]> {
        let key = control_plane::random_bytes::<PEER_KEY_LEN>()?;
        let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "vipd-peer-key", "namespace": "kube-system"},
            "data": {"key": control_plane::base64(&key)}});
        self.create_as_admin("/api/v1/namespaces/kube-system/secrets", &secret)?;
        Ok(key)
    }

    /// POST `body` to `path` as admin; anything but 201 is [`LabError::Http`].
    fn create_as_admin(&self, path: &str, body: &serde_json::Value) -> Result<()> {
        let r = self.api_request("POST", path, Some(&body.to_string()))?;
        if r.status != 201 {
            return Err(LabError::Http {
                method: "POST".into(),
                path: path.into(),
                status: r.status,
                body: r.body.chars().take(500).collect(),
            });
        }
        Ok(())
    }

    /// Sends one request as admin from ns `api` to the API server; returns status and body.
    ///
    /// # Errors
    /// [`LabError::Io`] on connection/TLS failures.
    pub fn api_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<HttpResponse> {
        let client =
            self.admin_client(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), API_PORT))?;
        self.in_netns("api", || client.request(method, path, body))?
    }

    /// `gitVersion` reported by the API server's /version (e.g. `v1.20.2`; Debian builds may
    /// report a different string).
    ///
    /// # Errors
    /// [`LabError::Io`]/[`LabError::Http`]/[`LabError::Parse`].
    pub fn server_version(&self) -> Result<String> {
        let r = self.api_request("GET", "/version", None)?;
        let v: serde_json::Value = serde_json::from_str(&r.body).map_err(|e| LabError::Parse {
            what: "/version".into(),
            detail: e.to_string(),
        })?;
        Ok(v.get("gitVersion")
            .and_then(|g| g.as_str())
            .unwrap_or_default()
            .to_string())
    }
}
