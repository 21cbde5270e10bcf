//! What a DHCP client task drives: one protocol's state machine ([`ClientMachine`],
//! implemented by the DHCPv4 and DHCPv6 machines) and the count of failed attempts it
//! starts from ([`Attempts`]).

use std::net::IpAddr;

use tokio::time::Instant;

use super::{DhcpSpec, DhcpState};

/// Where a client's count of failed attempts stands when a machine begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    /// Failed attempts in a row so far (failed macvlan setups, a failed wire).
    pub failed: u32,
    /// Give up after this many in a row (kube-vip's `dhcp_backoff_attempts`,
    /// [`super::machine::exhausted`]); 0 = never.
    pub max: u32,
}

/// One protocol's client state machine as the client task drives it: pure, fed the time,
/// the replies and the handle's commands, answering with the messages to send.
pub trait ClientMachine: Send + Sized + 'static {
    /// A received reply.
    type Msg: Send;
    /// A message to send.
    type Out: Send + Sync;

    /// A machine for `spec` starting at `now`, asking first for `requested` (the spec's
    /// requested address, or the one leased before the wire failed), with `attempts`
    /// failed so far and its limit; `seed` seeds the transaction ids.
    fn begin(
        spec: &DhcpSpec,
        requested: Option<IpAddr>,
        attempts: Attempts,
        now: Instant,
        seed: u32,
    ) -> Self;
    /// The state to publish.
    fn state(&self) -> DhcpState;
    /// When [`Self::on_timeout`] must be called next; `None` once stopped.
    fn deadline(&self) -> Option<Instant>;
    /// The deadline passed at `now`.
    fn on_timeout(&mut self, now: Instant) -> Vec<Self::Out>;
    /// A reply arrived at `now`.
    fn on_message(&mut self, now: Instant, msg: &Self::Msg) -> Vec<Self::Out>;
    /// `addr` is in use by another host: decline it (when it is the current lease).
    fn decline(&mut self, now: Instant, addr: IpAddr) -> Vec<Self::Out>;
    /// Stop; with `release`, the release message of the current lease.
    fn stop(&mut self, now: Instant, release: bool) -> Vec<Self::Out>;
}
