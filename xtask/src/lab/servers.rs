//! Small thread-based servers that run inside lab namespaces: the per-node "local API
//! server" (an L4 TCP proxy to the real one), the HTTP backend that answers its node name,
//! an HTTP echo that answers each client's source address, and a silent server that
//! accepts connections and never answers (a hung API server, kube-vip #890).
//!
//! Each server is one accept thread that entered the namespace; the threads it spawns
//! inherit the namespace. Stopping shuts the listening socket down (`shutdown(2)` on a
//! listening socket makes a blocked `accept(2)` return on Linux), closes live connections
//! and joins the thread, so after [`ThreadServer::stop`] returns the port refuses
//! connections.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::{LabError, Result, io_ctx};
use super::netns::spawn_in_netns;
use super::{API_IP, API_PORT, Lab, NODES};

type ConnList = Arc<Mutex<HashMap<u64, (TcpStream, TcpStream)>>>;

/// A server thread running inside a lab namespace; stopped on [`ThreadServer::stop`] or drop.
#[derive(Debug)]
pub struct ThreadServer {
    name: String,
    listen: SocketAddr,
    stop: Arc<AtomicBool>,
    listener_fd: i32,
    conns: ConnList,
    accepted: Arc<AtomicU64>,
    handle: Option<JoinHandle<Result<()>>>,
}

enum Behaviour {
    /// Forward every connection to this address.
    Proxy(SocketAddr),
    /// Answer every HTTP request with this body.
    Http(String),
    /// Answer every HTTP request with this status code (read at each request) and an
    /// empty body.
    Status(Arc<AtomicU16>),
    /// Answer every HTTP request with the client's address as accept(2) saw it.
    Echo,
    /// Accept every connection, keep it open, never read or write.
    Silent,
}

impl ThreadServer {
    /// Starts an L4 TCP proxy in the namespace at `netns`: listens on `listen`, forwards each
    /// connection to `target` (connect timeout 2 s).
    ///
    /// # Errors
    /// [`LabError::Io`] when the namespace cannot be entered or `listen` cannot be bound.
    pub fn proxy(
        netns: &Path,
        name: &str,
        listen: SocketAddr,
        target: SocketAddr,
    ) -> Result<ThreadServer> {
        Self::start(netns, name, listen, Behaviour::Proxy(target))
    }

    /// Starts an HTTP/1.x server in the namespace at `netns` that answers every request with
    /// `200 OK` and the body `body` followed by a newline, then closes the connection.
    ///
    /// # Errors
    /// [`LabError::Io`] when the namespace cannot be entered or `listen` cannot be bound.
    pub fn http(netns: &Path, name: &str, listen: SocketAddr, body: &str) -> Result<ThreadServer> {
        Self::start(netns, name, listen, Behaviour::Http(body.to_string()))
    }

    /// Starts an HTTP/1.x server in the namespace at `netns` that answers every request with
    /// `200 OK` and the client's IP address as accept(2) saw it, followed by a newline
    /// (`198.51.100.11`, IPv6 without brackets, an IPv4-mapped peer of a `[::]` listener as
    /// IPv4), then closes the connection: which source address a connection arrived from.
    ///
    /// # Errors
    /// [`LabError::Io`] when the namespace cannot be entered or `listen` cannot be bound.
    pub fn echo(netns: &Path, name: &str, listen: SocketAddr) -> Result<ThreadServer> {
        Self::start(netns, name, listen, Behaviour::Echo)
    }

    /// Starts an HTTP/1.x server in the namespace at `netns` that answers every request
    /// with the status code in `status` at the time of the request (e.g. 200 or 500; a
    /// health endpoint stub whose answer the test flips), then closes the connection.
    ///
    /// # Errors
    /// [`LabError::Io`] when the namespace cannot be entered or `listen` cannot be bound.
    pub fn http_status(
        netns: &Path,
        name: &str,
        listen: SocketAddr,
        status: Arc<AtomicU16>,
    ) -> Result<ThreadServer> {
        Self::start(netns, name, listen, Behaviour::Status(status))
    }

    /// Starts a server in the namespace at `netns` that accepts every connection on
    /// `listen` and never answers: no TLS, no HTTP, no close (an API server that is wedged
    /// but whose kernel still completes handshakes, kube-vip #890). The connections are
    /// closed at [`ThreadServer::stop`].
    ///
    /// # Errors
    /// [`LabError::Io`] when the namespace cannot be entered or `listen` cannot be bound.
    pub fn silent(netns: &Path, name: &str, listen: SocketAddr) -> Result<ThreadServer> {
        Self::start(netns, name, listen, Behaviour::Silent)
    }

    fn start(
        netns: &Path,
        name: &str,
        listen: SocketAddr,
        behaviour: Behaviour,
    ) -> Result<ThreadServer> {
        let stop = Arc::new(AtomicBool::new(false));
        let conns: ConnList = Arc::new(Mutex::new(HashMap::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<i32>>();
        let thread_stop = stop.clone();
        let thread_conns = conns.clone();
        let accepted = Arc::new(AtomicU64::new(0));
        let thread_accepted = accepted.clone();
        let thread_name = name.to_string();
        let handle = spawn_in_netns(netns, name, move || {
            let listener = match TcpListener::bind(listen) {
                Ok(l) => l,
                Err(e) => {
                    let err = io_ctx(format!("{thread_name}: bind {listen}"))(e);
                    let _ = ready_tx.send(Err(LabError::Thread {
                        name: thread_name.clone(),
                        detail: err.to_string(),
                    }));
                    return Err(err);
                }
            };
            let _ = ready_tx.send(Ok(listener.as_raw_fd()));
            accept_loop(
                &listener,
                &thread_stop,
                &thread_conns,
                &thread_accepted,
                &behaviour,
            );
            Ok(())
        })?;
        let fd = match ready_rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(fd)) => fd,
            Ok(Err(e)) => {
                let _ = handle.join();
                return Err(e);
            }
            Err(_) => {
                // The thread failed before binding (e.g. setns): report its error.
                return Err(match handle.join() {
                    Ok(Err(e)) => e,
                    _ => LabError::Thread {
                        name: name.to_string(),
                        detail: "server thread did not start".into(),
                    },
                });
            }
        };
        Ok(ThreadServer {
            name: name.to_string(),
            listen,
            stop,
            listener_fd: fd,
            conns,
            accepted,
            handle: Some(handle),
        })
    }

    /// How many connections the server has accepted since it started.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The address the server listens on (inside its namespace).
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// The name given at start.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the server is still accepting connections.
    pub fn is_running(&self) -> bool {
        self.handle.is_some()
    }

    /// Stops accepting, resets every open connection and joins the accept thread.
    pub fn stop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        // SAFETY: the fd belongs to the listener owned by the accept thread, which is still
        // alive (not joined yet); shutdown(2) does not close it, it only wakes accept(2).
        unsafe {
            libc::shutdown(self.listener_fd, libc::SHUT_RDWR);
        }
        let _ = handle.join();
        if let Ok(mut conns) = self.conns.lock() {
            for (_, (a, b)) in conns.drain() {
                let _ = a.shutdown(Shutdown::Both);
                let _ = b.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for ThreadServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    conns: &ConnList,
    accepted_count: &AtomicU64,
    behaviour: &Behaviour,
) {
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok((stream, peer)) = accepted else {
            // Transient errors (ECONNABORTED, EMFILE): back off a little and go on.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        accepted_count.fetch_add(1, Ordering::SeqCst);
        match behaviour {
            Behaviour::Http(body) => serve_http(stream, 200, &format!("{body}\n")),
            Behaviour::Echo => serve_http(stream, 200, &format!("{}\n", peer.ip().to_canonical())),
            Behaviour::Status(code) => serve_http(stream, code.load(Ordering::SeqCst), ""),
            Behaviour::Proxy(target) => {
                start_proxy_conn(stream, *target, conns);
            }
            Behaviour::Silent => {
                if let (Ok(copy), Ok(mut map)) = (stream.try_clone(), conns.lock()) {
                    map.insert(NEXT_CONN.fetch_add(1, Ordering::Relaxed), (stream, copy));
                }
            }
        }
    }
}

fn serve_http(mut stream: TcpStream, code: u16, payload: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read the request head (up to 16 KiB) so the client never sees a reset.
    while buf.len() < 16 * 1024 && !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let reason = if code == 200 { "OK" } else { "Status" };
    let resp = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{payload}",
        payload.len()
    );
    let _ = stream.write_all(resp.as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
}

fn start_proxy_conn(client: TcpStream, target: SocketAddr, conns: &ConnList) {
    let Ok(upstream) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(c2), Ok(u2), Ok(c3), Ok(u3)) = (
        client.try_clone(),
        upstream.try_clone(),
        client.try_clone(),
        upstream.try_clone(),
    ) else {
        return;
    };
    let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut map) = conns.lock() {
        map.insert(id, (c3, u3));
    }
    let conns = conns.clone();
    let _ = std::thread::Builder::new()
        .name("proxy-conn".into())
        .spawn(move || {
            std::thread::scope(|s| {
                s.spawn(|| pump(u2, c2));
                pump(client, upstream);
            });
            if let Ok(mut map) = conns.lock() {
                map.remove(&id);
            }
        });
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(0);

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}
impl Lab {
    // ----- per-node servers --------------------------------------------------------------

    /// Starts `node`'s local API server: a TCP proxy on [::]:6443 (all addresses, so also
    /// 127.0.0.1 and any VIP the node holds) forwarding to 192.0.2.2:6443. Idempotent.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Io`] if the port cannot be bound.
    pub fn start_local_api(&self, node: &str) -> Result<()> {
        self.start_node_server(&self.local_apis, "local_apis", node, |netns| {
            ThreadServer::proxy(
                netns,
                &format!("local-api-{node}"),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), API_PORT),
                SocketAddr::new(IpAddr::V4(API_IP), API_PORT),
            )
        })
    }

    /// Stops `node`'s local API server: the port refuses new connections and open ones are
    /// reset (scenario S10, "local API server dead"). Idempotent.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`].
    pub fn stop_local_api(&self, node: &str) -> Result<()> {
        stop_node_server(&self.local_apis, "local_apis", node)
    }

    /// Whether `node`'s local API server is running.
    pub fn local_api_running(&self, node: &str) -> bool {
        self.local_apis
            .lock()
            .map(|m| m.contains_key(node))
            .unwrap_or(false)
    }

    /// Connections `node`'s local API server has accepted since it was (re)started; 0 when
    /// it is not running. Counts every client: the node's own vipd, health checks, and
    /// connections a load balancer forwarded to it.
    pub fn local_api_accepted(&self, node: &str) -> u64 {
        self.local_apis
            .lock()
            .ok()
            .and_then(|m| m.get(node).map(ThreadServer::accepted))
            .unwrap_or(0)
    }

    /// Starts the HTTP backend of `node` on [::]:80, answering every request with the node
    /// name and a newline. Idempotent.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`] or [`LabError::Io`].
    pub fn start_http_backend(&self, node: &str) -> Result<()> {
        self.start_node_server(&self.http_backends, "http_backends", node, |netns| {
            ThreadServer::http(
                netns,
                &format!("http-{node}"),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 80),
                node,
            )
        })
    }

    /// Starts the HTTP backends of all nodes.
    ///
    /// # Errors
    /// As [`Lab::start_http_backend`].
    pub fn start_http_backends(&self) -> Result<()> {
        NODES.iter().try_for_each(|n| self.start_http_backend(n))
    }

    /// Stops `node`'s HTTP backend. Idempotent.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`].
    pub fn stop_http_backend(&self, node: &str) -> Result<()> {
        stop_node_server(&self.http_backends, "http_backends", node)
    }

    /// Starts `node`'s server in `servers` (a field named `what`) with `start(netns path)`,
    /// unless one runs already.
    fn start_node_server(
        &self,
        servers: &Mutex<HashMap<String, ThreadServer>>,
        what: &str,
        node: &str,
        start: impl FnOnce(&Path) -> Result<ThreadServer>,
    ) -> Result<()> {
        Self::node_checked(node)?;
        let mut map = servers.lock().map_err(|_| poisoned(what))?;
        if map.contains_key(node) {
            return Ok(());
        }
        let server = start(&self.netns_path(node)?)?;
        map.insert(node.to_string(), server);
        Ok(())
    }

    /// Sends `GET path` (HTTP/1.0) to `addr` from namespace `ns` and returns the body,
    /// whatever the status (connect and read timeout `timeout`). Handy to check which
    /// node's backend a VIP reaches: `lab.http_get("client", vip_80, "/", t)`.
    ///
    /// # Errors
    /// [`LabError::Io`] on connection failure or timeout.
    pub fn http_get(
        &self,
        ns: &str,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<String> {
        self.in_netns(ns, || http_get_here(None, addr, path, timeout))?
    }

    /// [`Lab::http_get`] from local address `source` (port chosen by the kernel): the
    /// source a [`ThreadServer::echo`] reports unless something translates it, e.g.
    /// `lab.http_get_from("pod-a", pod_ip, echo, "/", t)`.
    ///
    /// # Errors
    /// [`LabError::Io`] when `source` cannot be bound (not an address of `ns`), on
    /// connection failure or timeout.
    pub fn http_get_from(
        &self,
        ns: &str,
        source: IpAddr,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<String> {
        self.in_netns(ns, || http_get_here(Some(source), addr, path, timeout))?
    }

    // ----- teardown ----------------------------------------------------------------------
}

/// The GET of [`Lab::http_get`] from the calling thread's namespace, bound to `source`
/// first if given.
fn http_get_here(
    source: Option<IpAddr>,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<String> {
    let ctx = format!("GET http://{addr}{path}");
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .map_err(io_ctx(ctx.clone()))?;
    if let Some(src) = source {
        sock.bind(&SocketAddr::new(src, 0).into())
            .map_err(io_ctx(format!("{ctx}: bind {src}")))?;
    }
    sock.connect_timeout(&addr.into(), timeout)
        .map_err(io_ctx(ctx.clone()))?;
    let mut s = TcpStream::from(sock);
    s.set_read_timeout(Some(timeout))
        .map_err(io_ctx(ctx.clone()))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(io_ctx(ctx.clone()))?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(io_ctx(ctx))?;
    Ok(buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

fn poisoned(what: &str) -> LabError {
    LabError::Thread {
        name: what.to_string(),
        detail: "lock poisoned by a panic".into(),
    }
}

/// Stops (drops) `node`'s server in `servers` (a field named `what`), if any.
fn stop_node_server(
    servers: &Mutex<HashMap<String, ThreadServer>>,
    what: &str,
    node: &str,
) -> Result<()> {
    Lab::node_checked(node)?;
    let server = servers.lock().map_err(|_| poisoned(what))?.remove(node);
    drop(server);
    Ok(())
}
