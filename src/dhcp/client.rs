//! [`DhcpClient`]: the [`Dhcp`] implementation. One tokio task per started spec creates the
//! macvlan ([`Macvlans::acquire`]; a dual-stack Service's DHCPv4 and DHCPv6 clients share
//! it), opens a [`Wire`] on it and drives the family's [`ClientMachine`] (DHCPv4
//! [`Machine`], DHCPv6 [`Machine6`]) with its deadlines, the replies and the handle's
//! commands, publishing [`DhcpState`] after each step. Failed attempts in a row (a failed
//! macvlan setup or wire counts as one too) are counted across machines; at the limit
//! ([`DhcpClient::with_attempt_limit`]) the task publishes [`DhcpState::GaveUp`], closes its
//! socket and waits, keeping the macvlan, until it is stopped.

use std::marker::PhantomData;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::attempts::{Attempts, ClientMachine};
use super::machine::{ClientConfig, Machine, backoff, backoff_v4, exhausted};
use super::v6::{Machine6, Udp6Transport};
use super::wire::{PacketTransport, Transport, Wire};
use super::{Dhcp, DhcpCommand, DhcpFamily, DhcpHandle, DhcpSpec, DhcpState};
use crate::net::macvlan::{
    LINK_LOCAL_LIFETIME_SECS, LINK_LOCAL_REFRESH, MacvlanError, MacvlanKernel, Macvlans,
    NetlinkMacvlans, eui64_link_local,
};

impl ClientMachine for Machine {
    type Msg = dhcproto::v4::Message;
    type Out = super::machine::Outgoing;

    fn begin(
        spec: &DhcpSpec,
        requested: Option<IpAddr>,
        attempts: Attempts,
        now: Instant,
        seed: u32,
    ) -> Self {
        let requested = match requested {
            Some(IpAddr::V4(a)) => Some(a),
            _ => spec.requested,
        };
        let cfg = ClientConfig {
            mac: spec.mac,
            hostname: spec.hostname.clone(),
            broadcast: spec.broadcast,
            requested,
            max_attempts: attempts.max,
        };
        Machine::new(cfg, now, seed).after_failures(attempts.failed)
    }
    fn state(&self) -> DhcpState {
        Machine::state(self)
    }
    fn deadline(&self) -> Option<Instant> {
        Machine::deadline(self)
    }
    fn on_timeout(&mut self, now: Instant) -> Vec<Self::Out> {
        Machine::on_timeout(self, now)
    }
    fn on_message(&mut self, now: Instant, msg: &Self::Msg) -> Vec<Self::Out> {
        Machine::on_message(self, now, msg)
    }
    fn decline(&mut self, now: Instant, addr: IpAddr) -> Vec<Self::Out> {
        match addr {
            IpAddr::V4(a) => Machine::decline(self, now, a),
            IpAddr::V6(_) => Vec::new(),
        }
    }
    fn stop(&mut self, now: Instant, release: bool) -> Vec<Self::Out> {
        Machine::stop(self, now, release)
    }
}

/// [`Dhcp`] over macvlans vipd manages (kernel `K`), a DHCPv4 packet transport `T` and a
/// DHCPv6 transport `T6`.
pub struct DhcpClient<K, T, T6 = Udp6Transport> {
    macvlans: Arc<Macvlans<K>>,
    transport: Arc<T>,
    transport6: Arc<T6>,
    /// See [`DhcpClient::with_attempt_limit`].
    max_attempts: u32,
}

impl<K, T, T6> Clone for DhcpClient<K, T, T6> {
    fn clone(&self) -> Self {
        Self {
            macvlans: self.macvlans.clone(),
            transport: self.transport.clone(),
            transport6: self.transport6.clone(),
            max_attempts: self.max_attempts,
        }
    }
}

/// The production client: rtnetlink macvlans, `AF_PACKET` sockets (DHCPv4), UDP sockets
/// bound to the macvlan (DHCPv6).
pub type RawDhcp = DhcpClient<NetlinkMacvlans, PacketTransport, Udp6Transport>;

impl RawDhcp {
    /// A client in the current network namespace, on the current tokio runtime.
    ///
    /// # Errors
    /// [`MacvlanError::Socket`] when the rtnetlink socket cannot be opened.
    pub fn open() -> Result<Self, MacvlanError> {
        Ok(Self::new(
            NetlinkMacvlans::new()?,
            PacketTransport,
            Udp6Transport,
        ))
    }
}

impl<K: MacvlanKernel, T: Transport, T6: Transport> DhcpClient<K, T, T6> {
    /// Over `kernel`, `transport` (DHCPv4) and `transport6` (DHCPv6); clients retry
    /// forever (see [`Self::with_attempt_limit`]).
    pub fn new(kernel: K, transport: T, transport6: T6) -> Self {
        Self {
            macvlans: Arc::new(Macvlans::new(kernel)),
            transport: Arc::new(transport),
            transport6: Arc::new(transport6),
            max_attempts: 0,
        }
    }

    /// Clients started from now on give up after `max_attempts` failed attempts in a row
    /// to get a lease (kube-vip's `dhcp_backoff_attempts`; 0, the default here, retries
    /// forever): [`DhcpState::GaveUp`]. An attempt is one DISCOVER/REQUEST (DHCPv6:
    /// Solicit/Request) exchange without a lease, or a failed macvlan setup.
    pub fn with_attempt_limit(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The macvlan manager (for [`Macvlans::remove_stale`] at start).
    pub fn macvlans(&self) -> &Macvlans<K> {
        &self.macvlans
    }
}

impl<K, T, T6> Dhcp for DhcpClient<K, T, T6>
where
    K: MacvlanKernel,
    T: Transport,
    T::Wire: Wire<Out = <Machine as ClientMachine>::Out, Msg = <Machine as ClientMachine>::Msg>,
    T6: Transport,
    T6::Wire: Wire<Out = <Machine6 as ClientMachine>::Out, Msg = <Machine6 as ClientMachine>::Msg>,
{
    fn start(&self, spec: DhcpSpec) -> DhcpHandle {
        let (state_tx, state_rx) = watch::channel(DhcpState::Requesting {
            attempt: 0,
            last_error: None,
        });
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        match spec.family {
            DhcpFamily::V4 => {
                let task: Task<K, T, Machine> = Task {
                    spec,
                    max_attempts: self.max_attempts,
                    macvlans: self.macvlans.clone(),
                    transport: self.transport.clone(),
                    state: state_tx,
                    commands: cmd_rx,
                    machine: PhantomData,
                };
                tokio::spawn(task.run());
            }
            DhcpFamily::V6 => {
                let task: Task<K, T6, Machine6> = Task {
                    spec,
                    max_attempts: self.max_attempts,
                    macvlans: self.macvlans.clone(),
                    transport: self.transport6.clone(),
                    state: state_tx,
                    commands: cmd_rx,
                    machine: PhantomData,
                };
                tokio::spawn(task.run());
            }
        }
        DhcpHandle::new(state_rx, cmd_tx)
    }
}

struct Task<K, T, M> {
    spec: DhcpSpec,
    /// Give up after this many failed attempts in a row; 0 = never.
    max_attempts: u32,
    macvlans: Arc<Macvlans<K>>,
    transport: Arc<T>,
    state: watch::Sender<DhcpState>,
    commands: mpsc::UnboundedReceiver<DhcpCommand>,
    machine: PhantomData<fn() -> M>,
}

/// Why the client loop ended.
enum End {
    /// Stop requested (or the handle dropped); `done` answered after cleanup.
    Stop(Done),
    /// The wire failed: set up the macvlan again.
    WireFailed(String),
    /// The machine gave up ([`DhcpState::GaveUp`], published).
    GaveUp,
}

/// Stop answer channel of a [`DhcpCommand::Stop`] (`None`: the handle was dropped).
type Done = Option<tokio::sync::oneshot::Sender<()>>;

fn xid_seed(mac: [u8; 6]) -> u32 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]])
}

impl<K, T, M> Task<K, T, M>
where
    K: MacvlanKernel,
    T: Transport,
    M: ClientMachine,
    T::Wire: Wire<Out = M::Out, Msg = M::Msg>,
{
    /// Who uses the macvlan ([`Macvlans::acquire`]): one client per family.
    fn user(&self) -> &'static str {
        self.spec.family.metric()
    }

    /// Creates (or joins) the macvlan, gives a DHCPv6 client its link-local address and
    /// opens the wire: (macvlan index, wire).
    async fn setup(&self) -> Result<(u32, T::Wire), String> {
        self.spec.check().map_err(|e| e.to_string())?;
        let index = self
            .macvlans
            .acquire(&self.spec.macvlan_spec(), self.user())
            .await
            .map_err(|e| e.to_string())?;
        if self.spec.family == DhcpFamily::V6 {
            self.macvlans
                .add_link_local(index, &self.spec.macvlan, self.spec.mac)
                .await
                .map_err(|e| e.to_string())?;
        }
        let wire = self
            .transport
            .open(index, &self.spec.macvlan)
            .map_err(|e| {
                format!(
                    "{} socket on macvlan {}: {e}",
                    self.spec.family.label(),
                    self.spec.macvlan
                )
            })?;
        Ok((index, wire))
    }

    async fn run(mut self) {
        let mut requested: Option<IpAddr> = match self.spec.family {
            DhcpFamily::V4 => self.spec.requested.map(IpAddr::V4),
            DhcpFamily::V6 => self.spec.requested_v6.map(IpAddr::V6),
        };
        // Failed attempts in a row, across machines: a failed setup or wire counts as one.
        let mut failures = 0u32;
        let done = loop {
            let (index, wire) = match self.setup().await {
                Ok(w) => w,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    warn!(macvlan = %self.spec.macvlan, family = self.spec.family.label(), attempt = failures, error = %e, "DHCP client setup failed");
                    match self.failed(failures, e).await {
                        Some(done) => break done,
                        None => continue,
                    }
                }
            };
            let attempts = Attempts {
                failed: failures,
                max: self.max_attempts,
            };
            let mut machine = M::begin(
                &self.spec,
                requested,
                attempts,
                Instant::now(),
                xid_seed(self.spec.mac),
            );
            match self.drive(&mut machine, wire, index).await {
                End::Stop(done) => break done,
                End::GaveUp => break self.wait_for_stop().await,
                End::WireFailed(e) => {
                    let state = machine.state();
                    requested = state.binding().map(|b| b.addr).or(requested);
                    failures = match state {
                        DhcpState::Requesting { attempt, .. } => attempt,
                        _ => 0,
                    }
                    .saturating_add(1);
                    if let Some(done) = self.failed(failures, e).await {
                        break done;
                    }
                }
            }
        };
        self.state.send_replace(DhcpState::Lost {
            reason: super::STOPPED.into(),
        });
        match self.macvlans.release(&self.spec.macvlan, self.user()).await {
            Ok(removed) => {
                debug!(macvlan = %self.spec.macvlan, family = self.spec.family.label(), removed, "DHCP client stopped")
            }
            Err(e) => warn!(macvlan = %self.spec.macvlan, error = %e, "cannot remove the macvlan"),
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    /// Attempt `failures` (in a row) failed outside the machine for `error`: publishes it
    /// and waits the backoff ([`backoff_v4`] for DHCPv4, [`backoff`] for DHCPv6), or, at the
    /// limit, publishes [`DhcpState::GaveUp`] and waits
    /// for the stop. `Some(done)` when told to stop.
    async fn failed(&mut self, failures: u32, error: String) -> Option<Done> {
        if exhausted(failures, self.max_attempts) {
            let state = DhcpState::GaveUp {
                attempts: failures,
                last_error: error,
            };
            self.log_state(&state);
            self.state.send_replace(state);
            return Some(self.wait_for_stop().await);
        }
        self.state.send_replace(DhcpState::Requesting {
            attempt: failures,
            last_error: Some(error),
        });
        let wait = match self.spec.family {
            DhcpFamily::V4 => backoff_v4(failures, &self.spec.mac),
            DhcpFamily::V6 => backoff(failures),
        };
        self.wait_or_command(Some(wait)).await
    }

    /// After giving up: nothing more is sent; waits until told to stop.
    async fn wait_for_stop(&mut self) -> Done {
        self.wait_or_command(None).await.unwrap_or_default()
    }

    /// Sleeps `wait` (`None`: until a stop), handling commands meanwhile; `Some(done)` when
    /// told to stop (nothing to release: no lease).
    async fn wait_or_command(&mut self, wait: Option<Duration>) -> Option<Done> {
        let until = wait.map(|w| Instant::now() + w);
        loop {
            tokio::select! {
                () = async {
                    match until {
                        Some(u) => tokio::time::sleep_until(u).await,
                        None => std::future::pending().await,
                    }
                } => return None,
                cmd = self.commands.recv() => match cmd {
                    Some(DhcpCommand::Stop { done, .. }) => return Some(Some(done)),
                    None => return Some(None),
                    Some(DhcpCommand::Decline(_)) => {}
                },
            }
        }
    }

    /// Logs a state the client enters.
    fn log_state(&self, state: &DhcpState) {
        let (macvlan, family) = (&self.spec.macvlan, self.spec.family.label());
        match state {
            DhcpState::Bound(b) => {
                info!(%macvlan, family, addr = %b.addr, server = %b.server, "DHCP lease bound")
            }
            DhcpState::Lost { reason } => {
                warn!(%macvlan, family, %reason, "DHCP lease lost")
            }
            DhcpState::GaveUp {
                attempts,
                last_error,
            } => {
                warn!(%macvlan, family, attempts, %last_error, "DHCP client gave up after {attempts} failed attempt(s) in a row (dhcp_backoff_attempts); it sends nothing more until the Service's DHCP request changes or its Lease changes holder")
            }
            other => debug!(%macvlan, family, state = ?other, "DHCP state"),
        }
    }

    fn publish(&self, machine: &M) {
        let state = machine.state();
        self.state.send_if_modified(|current| {
            if *current == state {
                return false;
            }
            self.log_state(&state);
            *current = state.clone();
            true
        });
    }

    async fn send_all(&self, wire: &mut T::Wire, outs: Vec<M::Out>) {
        for out in outs {
            if let Err(e) = wire.send(&out).await {
                // Retransmission covers a lost send.
                debug!(macvlan = %self.spec.macvlan, error = %e, "DHCP send failed");
            }
        }
    }

    /// Runs `machine` over `wire` on macvlan `index` until it stops, gives up or the wire
    /// fails. A DHCPv6 client also refreshes the macvlan's link-local address every
    /// [`LINK_LOCAL_REFRESH`]; one found expired (the process was frozen or starved for
    /// [`LINK_LOCAL_LIFETIME_SECS`]) ends the wire, so the address comes back only through a
    /// new setup, after the backoff, by which time a lost Lease has stopped the client.
    async fn drive(&mut self, machine: &mut M, mut wire: T::Wire, index: u32) -> End {
        let mut refresh_at =
            (self.spec.family == DhcpFamily::V6).then(|| Instant::now() + LINK_LOCAL_REFRESH);
        loop {
            self.publish(machine);
            if matches!(machine.state(), DhcpState::GaveUp { .. }) {
                return End::GaveUp;
            }
            let deadline = machine.deadline();
            tokio::select! {
                () = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => {
                    let outs = machine.on_timeout(Instant::now());
                    self.send_all(&mut wire, outs).await;
                }
                () = async {
                    match refresh_at {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                } => {
                    refresh_at = Some(Instant::now() + LINK_LOCAL_REFRESH);
                    match self.macvlans.refresh_link_local(index, &self.spec.macvlan, self.spec.mac).await {
                        Ok(true) => {}
                        Ok(false) => return End::WireFailed(format!(
                            "link-local address {} of macvlan {} expired: vipd did not refresh it for {LINK_LOCAL_LIFETIME_SECS} s (frozen or starved)",
                            eui64_link_local(self.spec.mac),
                            self.spec.macvlan
                        )),
                        // The next tick tries again; the address outlives a few misses.
                        Err(e) => debug!(macvlan = %self.spec.macvlan, error = %e, "cannot refresh the link-local address"),
                    }
                }
                msg = wire.recv() => match msg {
                    Ok(msg) => {
                        let outs = machine.on_message(Instant::now(), &msg);
                        self.send_all(&mut wire, outs).await;
                    }
                    Err(e) => return End::WireFailed(format!("{} socket on macvlan {}: {e}", self.spec.family.label(), self.spec.macvlan)),
                },
                cmd = self.commands.recv() => match cmd {
                    Some(DhcpCommand::Decline(addr)) => {
                        let outs = machine.decline(Instant::now(), addr);
                        self.send_all(&mut wire, outs).await;
                    }
                    Some(DhcpCommand::Stop { release, done }) => {
                        let outs = machine.stop(Instant::now(), release);
                        self.send_all(&mut wire, outs).await;
                        return End::Stop(Some(done));
                    }
                    None => {
                        machine.stop(Instant::now(), false);
                        return End::Stop(None);
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests;
