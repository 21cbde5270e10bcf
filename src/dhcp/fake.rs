//! [`FakeDhcp`]: a [`Dhcp`] for tests of the Services side. It creates nothing; the test
//! sets each client's state and reads what the caller asked for.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, watch};

use super::{Dhcp, DhcpCommand, DhcpHandle, DhcpSpec, DhcpState};

/// How a fake client ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeEnd {
    /// [`DhcpHandle::stop`] (or the handle was dropped): no DHCPRELEASE.
    Stopped,
    /// [`DhcpHandle::release_and_stop`]: DHCPRELEASE sent.
    Released,
}

struct FakeRun {
    spec: DhcpSpec,
    state: watch::Sender<DhcpState>,
    declined: Vec<IpAddr>,
    ended: Option<FakeEnd>,
}

/// A [`Dhcp`] that records what it is asked and whose states the test sets. Clones share
/// the record. Each started client begins in `Requesting { attempt: 0, last_error: None }`
/// and ends, like the real one, in `Lost` with the reason [`super::STOPPED`].
#[derive(Clone, Default)]
pub struct FakeDhcp {
    runs: Arc<Mutex<Vec<FakeRun>>>,
}

impl FakeDhcp {
    /// An empty fake.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Vec<FakeRun>) -> R) -> R {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut runs)
    }

    /// Every spec started so far, oldest first (stopped ones included).
    pub fn started(&self) -> Vec<DhcpSpec> {
        self.with(|runs| runs.iter().map(|r| r.spec.clone()).collect())
    }

    /// The macvlan names of the clients still running.
    pub fn running(&self) -> Vec<String> {
        self.with(|runs| {
            runs.iter()
                .filter(|r| r.ended.is_none())
                .map(|r| r.spec.macvlan.clone())
                .collect()
        })
    }

    /// Sets the state of the running client for `macvlan`; `false` when none is running.
    pub fn set_state(&self, macvlan: &str, state: DhcpState) -> bool {
        self.with(|runs| {
            match runs
                .iter()
                .rev()
                .find(|r| r.spec.macvlan == macvlan && r.ended.is_none())
            {
                Some(run) => {
                    run.state.send_replace(state);
                    true
                }
                None => false,
            }
        })
    }

    /// Sets the state of the running `family` client for `macvlan` (a dual-stack Service
    /// runs two on one macvlan); `false` when none is running.
    pub fn set_family_state(
        &self,
        macvlan: &str,
        family: super::DhcpFamily,
        state: DhcpState,
    ) -> bool {
        self.with(|runs| {
            match runs
                .iter()
                .rev()
                .find(|r| r.spec.macvlan == macvlan && r.spec.family == family && r.ended.is_none())
            {
                Some(run) => {
                    run.state.send_replace(state);
                    true
                }
                None => false,
            }
        })
    }

    /// How the latest `family` client for `macvlan` ended; `None` while it runs or if never
    /// started.
    pub fn family_ended(&self, macvlan: &str, family: super::DhcpFamily) -> Option<FakeEnd> {
        self.with(|runs| {
            runs.iter()
                .rev()
                .find(|r| r.spec.macvlan == macvlan && r.spec.family == family)
                .and_then(|r| r.ended)
        })
    }

    /// How the latest client with MAC `mac` ended (`None`: still running, or never
    /// started).
    pub fn ended_mac(&self, mac: [u8; 6]) -> Option<FakeEnd> {
        self.with(|runs| {
            runs.iter()
                .rev()
                .find(|r| r.spec.mac == mac)
                .and_then(|r| r.ended)
        })
    }

    /// How the latest client for `macvlan` ended; `None` while it runs or if never started.
    pub fn ended(&self, macvlan: &str) -> Option<FakeEnd> {
        self.with(|runs| {
            runs.iter()
                .rev()
                .find(|r| r.spec.macvlan == macvlan)
                .and_then(|r| r.ended)
        })
    }

    /// Addresses declined through the latest client for `macvlan`.
    pub fn declined(&self, macvlan: &str) -> Vec<IpAddr> {
        self.with(|runs| {
            runs.iter()
                .rev()
                .find(|r| r.spec.macvlan == macvlan)
                .map(|r| r.declined.clone())
                .unwrap_or_default()
        })
    }
}

impl Dhcp for FakeDhcp {
    fn start(&self, spec: DhcpSpec) -> DhcpHandle {
        let (state_tx, state_rx) = watch::channel(DhcpState::Requesting {
            attempt: 0,
            last_error: None,
        });
        let (cmd_tx, mut cmd_rx) = mpsc::unbounded_channel();
        let id = self.with(|runs| {
            runs.push(FakeRun {
                spec,
                state: state_tx,
                declined: Vec::new(),
                ended: None,
            });
            runs.len() - 1
        });
        let fake = self.clone();
        tokio::spawn(async move {
            let end = loop {
                match cmd_rx.recv().await {
                    Some(DhcpCommand::Decline(addr)) => {
                        fake.with(|runs| runs[id].declined.push(addr));
                    }
                    Some(DhcpCommand::Stop { release, done }) => {
                        let end = if release {
                            FakeEnd::Released
                        } else {
                            FakeEnd::Stopped
                        };
                        fake.with(|runs| {
                            runs[id].ended = Some(end);
                            runs[id].state.send_replace(DhcpState::Lost {
                                reason: super::STOPPED.into(),
                            });
                        });
                        let _ = done.send(());
                        break end;
                    }
                    None => break FakeEnd::Stopped,
                }
            };
            fake.with(|runs| {
                runs[id].ended.get_or_insert(end);
                runs[id].state.send_replace(DhcpState::Lost {
                    reason: super::STOPPED.into(),
                });
            });
        });
        DhcpHandle::new(state_rx, cmd_tx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> DhcpSpec {
        DhcpSpec {
            family: super::super::DhcpFamily::V4,
            parent: "eth0".into(),
            macvlan: name.into(),
            mac: [0x02, 0, 0, 0, 0, 1],
            requested: None,
            requested_v6: None,
            hostname: None,
            broadcast: false,
            rp_filter: 0,
            mark: "vipd:uid".into(),
            mac_derived: true,
        }
    }

    #[tokio::test]
    async fn records_states_declines_and_ends() {
        let fake = FakeDhcp::new();
        let a = fake.start(spec("vip-a"));
        let b = fake.start(spec("vip-b"));
        assert_eq!(fake.running(), vec!["vip-a", "vip-b"]);
        assert!(fake.set_state("vip-a", DhcpState::Lost { reason: "x".into() }));
        assert_eq!(*a.state.borrow(), DhcpState::Lost { reason: "x".into() });
        let addr = IpAddr::from([192, 0, 2, 201]);
        a.decline(addr);
        let a_state = a.state.clone();
        a.stop().await;
        b.release_and_stop().await;
        assert_eq!(fake.declined("vip-a"), vec![addr]);
        assert_eq!(fake.ended("vip-a"), Some(FakeEnd::Stopped));
        assert_eq!(fake.ended("vip-b"), Some(FakeEnd::Released));
        assert_eq!(
            *a_state.borrow(),
            DhcpState::Lost {
                reason: crate::dhcp::STOPPED.into()
            }
        );
        assert!(fake.running().is_empty());
        assert!(!fake.set_state("vip-a", DhcpState::Lost { reason: "y".into() }));
    }
}
