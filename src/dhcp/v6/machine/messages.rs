//! The messages of one exchange: what the client sends in each phase ([`Machine6`]'s
//! Solicit, Request, Renew and Rebind), and what a server's Advertise or Reply says about
//! our IA_NA.

use std::net::Ipv6Addr;

use dhcproto::v6::{
    DhcpOption, DhcpOptions, IAAddr, IANA, Message, MessageType, ORO, OptionCode, Status,
};
use tokio::time::Instant;

use super::{Dest6, Machine6, Outgoing6, Phase};
use crate::dhcp::machine::Exchange;

/// What a Reply or Advertise says about our IA_NA.
pub(super) enum IaResult {
    /// An address with its lifetimes (preferred, valid) and the IA_NA's T1, T2 (seconds).
    Addr {
        addr: Ipv6Addr,
        preferred: u32,
        valid: u32,
        t1: u32,
        t2: u32,
    },
    /// A status other than Success, at the top level or in the IA_NA.
    Status(Status, String),
    /// Nothing usable (no IA_NA for our IAID, no address).
    Nothing,
}

fn status_of(opts: &DhcpOptions) -> Option<(Status, String)> {
    match opts.get(OptionCode::StatusCode) {
        Some(DhcpOption::StatusCode(s)) if s.status != Status::Success => {
            Some((s.status, s.msg.clone()))
        }
        _ => None,
    }
}

pub(super) fn status_text(status: Status, msg: &str) -> String {
    if msg.is_empty() {
        format!("{status:?}")
    } else {
        format!("{status:?} ({msg})")
    }
}

impl Machine6 {
    /// Client Identifier, Elapsed Time (§21.9, hundredths of a second since the exchange
    /// began), and for Solicit/Request/Renew/Rebind the Option Request option (§21.7:
    /// SOL_MAX_RT, as §18.2.1 asks).
    pub(super) fn base(&self, kind: MessageType, ex: &Exchange, now: Instant) -> Message {
        let mut msg = Message::new(kind);
        msg.set_xid_num(ex.xid);
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::ClientId(self.duid.clone()));
        let centis = now.saturating_duration_since(ex.started).as_millis() / 10;
        opts.insert(DhcpOption::ElapsedTime(
            u16::try_from(centis).unwrap_or(u16::MAX),
        ));
        if matches!(
            kind,
            MessageType::Solicit | MessageType::Request | MessageType::Renew | MessageType::Rebind
        ) {
            opts.insert(DhcpOption::ORO(ORO {
                opts: vec![OptionCode::SolMaxRt],
            }));
        }
        msg
    }

    /// Our IA_NA, holding `addr` (lifetimes 0: the server chooses) when given.
    pub(super) fn ia_na(&self, addr: Option<Ipv6Addr>) -> DhcpOption {
        let mut opts = DhcpOptions::new();
        if let Some(addr) = addr {
            opts.insert(DhcpOption::IAAddr(IAAddr {
                addr,
                preferred_life: 0,
                valid_life: 0,
                opts: DhcpOptions::new(),
            }));
        }
        DhcpOption::IANA(IANA {
            id: self.cfg.iaid(),
            t1: 0,
            t2: 0,
            opts,
        })
    }

    /// The message for the current phase's exchange (first send or retransmission).
    pub(super) fn current_message(&self, now: Instant) -> Option<Outgoing6> {
        let out = match &self.phase {
            Phase::Soliciting(ex) => {
                let mut msg = self.base(MessageType::Solicit, ex, now);
                let hint = self.hint.filter(|h| !self.declined.contains(h));
                msg.opts_mut().insert(self.ia_na(hint));
                Outgoing6 {
                    msg,
                    dest: Dest6::AllServers,
                }
            }
            Phase::Requesting {
                addr,
                server_id,
                ex,
            } => {
                let mut msg = self.base(MessageType::Request, ex, now);
                msg.opts_mut()
                    .insert(DhcpOption::ServerId(server_id.clone()));
                msg.opts_mut().insert(self.ia_na(Some(*addr)));
                Outgoing6 {
                    msg,
                    dest: Dest6::AllServers,
                }
            }
            Phase::Renewing { lease, ex } => {
                let mut msg = self.base(MessageType::Renew, ex, now);
                msg.opts_mut()
                    .insert(DhcpOption::ServerId(lease.server_id.clone()));
                msg.opts_mut().insert(self.ia_na(Some(lease.addr)));
                Outgoing6 {
                    msg,
                    dest: lease.unicast.map_or(Dest6::AllServers, Dest6::Unicast),
                }
            }
            Phase::Rebinding { lease, ex } => {
                let mut msg = self.base(MessageType::Rebind, ex, now);
                msg.opts_mut().insert(self.ia_na(Some(lease.addr)));
                Outgoing6 {
                    msg,
                    dest: Dest6::AllServers,
                }
            }
            Phase::Bound(_) | Phase::Waiting { .. } | Phase::GaveUp | Phase::Stopped => {
                return None;
            }
        };
        Some(out)
    }

    /// What `msg` says about our IA_NA.
    pub(super) fn ia_result(&self, msg: &Message) -> IaResult {
        if let Some((status, text)) = status_of(msg.opts()) {
            return IaResult::Status(status, text);
        }
        let iaid = self.cfg.iaid();
        let ia = msg.opts().iter().find_map(|o| match o {
            DhcpOption::IANA(ia) if ia.id == iaid => Some(ia),
            _ => None,
        });
        let Some(ia) = ia else {
            return IaResult::Nothing;
        };
        if let Some((status, text)) = status_of(&ia.opts) {
            return IaResult::Status(status, text);
        }
        // The current address first, then any other.
        let current = match &self.phase {
            Phase::Renewing { lease, .. } | Phase::Rebinding { lease, .. } => Some(lease.addr),
            Phase::Requesting { addr, .. } => Some(*addr),
            _ => None,
        };
        let addrs: Vec<&IAAddr> = ia
            .opts
            .iter()
            .filter_map(|o| match o {
                DhcpOption::IAAddr(a) => Some(a),
                _ => None,
            })
            .collect();
        let chosen = addrs.iter().find(|a| Some(a.addr) == current).or_else(|| {
            addrs
                .iter()
                .find(|a| a.valid_life > 0 && !self.declined.contains(&a.addr))
        });
        match chosen {
            Some(a) => IaResult::Addr {
                addr: a.addr,
                preferred: a.preferred_life,
                valid: a.valid_life,
                t1: ia.t1,
                t2: ia.t2,
            },
            None => IaResult::Nothing,
        }
    }
}
