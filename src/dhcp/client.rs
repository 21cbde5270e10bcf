//! [`DhcpClient`]: the [`Dhcp`] implementation. One tokio task per started spec creates the
//! macvlan ([`Macvlans::ensure`]), opens a [`Wire`] on it and drives the
//! [`Machine`] with its deadlines, the replies and the handle's
//! commands, publishing [`DhcpState`] after each step.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::machine::{ClientConfig, Machine, Outgoing, backoff};
use super::wire::{PacketTransport, Transport, Wire};
use super::{Dhcp, DhcpCommand, DhcpHandle, DhcpSpec, DhcpState};
use crate::net::macvlan::{MacvlanError, MacvlanKernel, Macvlans, NetlinkMacvlans};

/// [`Dhcp`] over macvlans vipd manages (kernel `K`) and a packet transport `T`.
pub struct DhcpClient<K, T> {
    macvlans: Arc<Macvlans<K>>,
    transport: Arc<T>,
}

impl<K, T> Clone for DhcpClient<K, T> {
    fn clone(&self) -> Self {
        Self {
            macvlans: self.macvlans.clone(),
            transport: self.transport.clone(),
        }
    }
}

/// The production client: rtnetlink macvlans, `AF_PACKET` sockets.
pub type RawDhcp = DhcpClient<NetlinkMacvlans, PacketTransport>;

impl RawDhcp {
    /// A client in the current network namespace, on the current tokio runtime.
    ///
    /// # Errors
    /// [`MacvlanError::Socket`] when the rtnetlink socket cannot be opened.
    pub fn open() -> Result<Self, MacvlanError> {
        Ok(Self::new(NetlinkMacvlans::new()?, PacketTransport))
    }
}

impl<K: MacvlanKernel, T: Transport> DhcpClient<K, T> {
    /// Over `kernel` and `transport`.
    pub fn new(kernel: K, transport: T) -> Self {
        Self {
            macvlans: Arc::new(Macvlans::new(kernel)),
            transport: Arc::new(transport),
        }
    }

    /// The macvlan manager (for [`Macvlans::remove_stale`] at start).
    pub fn macvlans(&self) -> &Macvlans<K> {
        &self.macvlans
    }
}

impl<K: MacvlanKernel, T: Transport> Dhcp for DhcpClient<K, T> {
    fn start(&self, spec: DhcpSpec) -> DhcpHandle {
        let (state_tx, state_rx) = watch::channel(DhcpState::Requesting {
            attempt: 0,
            last_error: None,
        });
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let task = Task {
            spec,
            macvlans: self.macvlans.clone(),
            transport: self.transport.clone(),
            state: state_tx,
            commands: cmd_rx,
        };
        tokio::spawn(task.run());
        DhcpHandle::new(state_rx, cmd_tx)
    }
}

struct Task<K, T> {
    spec: DhcpSpec,
    macvlans: Arc<Macvlans<K>>,
    transport: Arc<T>,
    state: watch::Sender<DhcpState>,
    commands: mpsc::UnboundedReceiver<DhcpCommand>,
}

/// Why the client loop ended.
enum End {
    /// Stop requested (or the handle dropped); `done` answered after cleanup.
    Stop(Option<tokio::sync::oneshot::Sender<()>>),
    /// The wire failed: set up the macvlan again.
    WireFailed(String),
}

fn xid_seed(mac: [u8; 6]) -> u32 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]])
}

impl<K: MacvlanKernel, T: Transport> Task<K, T> {
    async fn setup(&self) -> Result<T::Wire, String> {
        self.spec.check().map_err(|e| e.to_string())?;
        let index = self
            .macvlans
            .ensure(&self.spec.macvlan_spec())
            .await
            .map_err(|e| e.to_string())?;
        self.transport
            .open(index, &self.spec.macvlan)
            .map_err(|e| format!("DHCP socket on macvlan {}: {e}", self.spec.macvlan))
    }

    async fn run(mut self) {
        let mut requested = self.spec.requested;
        let mut failures = 0u32;
        let done = loop {
            let wire = match self.setup().await {
                Ok(w) => w,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    warn!(macvlan = %self.spec.macvlan, attempt = failures, error = %e, "DHCP client setup failed");
                    self.state.send_replace(DhcpState::Requesting {
                        attempt: failures,
                        last_error: Some(e),
                    });
                    match self.wait_or_command(backoff(failures)).await {
                        Some(done) => break done,
                        None => continue,
                    }
                }
            };
            let cfg = ClientConfig {
                mac: self.spec.mac,
                hostname: self.spec.hostname.clone(),
                broadcast: self.spec.broadcast,
                requested,
            };
            let mut machine = Machine::new(cfg, Instant::now(), xid_seed(self.spec.mac));
            match self.drive(&mut machine, wire).await {
                End::Stop(done) => break done,
                End::WireFailed(e) => {
                    requested = machine.state().binding().map(|b| b.addr).or(requested);
                    failures = 1;
                    self.state.send_replace(DhcpState::Requesting {
                        attempt: failures,
                        last_error: Some(e),
                    });
                    if let Some(done) = self.wait_or_command(backoff(failures)).await {
                        break done;
                    }
                }
            }
        };
        self.state.send_replace(DhcpState::Lost {
            reason: super::STOPPED.into(),
        });
        match self.macvlans.remove(&self.spec.macvlan).await {
            Ok(_) => debug!(macvlan = %self.spec.macvlan, "DHCP client stopped, macvlan removed"),
            Err(e) => warn!(macvlan = %self.spec.macvlan, error = %e, "cannot remove the macvlan"),
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    /// Sleeps `wait`, handling commands meanwhile; `Some(done)` when told to stop (nothing
    /// to release: no lease).
    async fn wait_or_command(
        &mut self,
        wait: Duration,
    ) -> Option<Option<tokio::sync::oneshot::Sender<()>>> {
        let until = Instant::now() + wait;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return None,
                cmd = self.commands.recv() => match cmd {
                    Some(DhcpCommand::Stop { done, .. }) => return Some(Some(done)),
                    None => return Some(None),
                    Some(DhcpCommand::Decline(_)) => {}
                },
            }
        }
    }

    fn publish(&self, machine: &Machine) {
        let state = machine.state();
        self.state.send_if_modified(|current| {
            if *current == state {
                return false;
            }
            match &state {
                DhcpState::Bound(b) => {
                    info!(macvlan = %self.spec.macvlan, addr = %b.addr, server = %b.server, "DHCP lease bound")
                }
                DhcpState::Lost { reason } => {
                    warn!(macvlan = %self.spec.macvlan, %reason, "DHCP lease lost")
                }
                other => debug!(macvlan = %self.spec.macvlan, state = ?other, "DHCP state"),
            }
            *current = state.clone();
            true
        });
    }

    async fn send_all(&self, wire: &mut T::Wire, outs: Vec<Outgoing>) {
        for out in outs {
            if let Err(e) = wire.send(&out).await {
                // Retransmission covers a lost send.
                debug!(macvlan = %self.spec.macvlan, error = %e, "DHCP send failed");
            }
        }
    }

    async fn drive(&mut self, machine: &mut Machine, mut wire: T::Wire) -> End {
        loop {
            self.publish(machine);
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
                msg = wire.recv() => match msg {
                    Ok(msg) => {
                        let outs = machine.on_message(Instant::now(), &msg);
                        self.send_all(&mut wire, outs).await;
                    }
                    Err(e) => return End::WireFailed(format!("DHCP socket on macvlan {}: {e}", self.spec.macvlan)),
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
