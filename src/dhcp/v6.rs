//! DHCPv6 client for `::` Services (issue 13): one IA_NA address per Service (RFC 8415), on
//! the same macvlan as the Service's DHCPv4 client, driven by the same client task
//! ([`super::client`]) and published as the same [`super::DhcpState`].
//!
//! ```text
//!  Soliciting --Advertise--> Requesting --Reply--> Bound --T1--> Renewing (ff02::1:2, or
//!      ^                                             ^             |  the Server Unicast address)
//!      |                                             +-------------+  T2: Rebinding (ff02::1:2)
//!      |   NoBinding, withdrawn (valid lifetime 0), expiry, or conflict (Decline)
//!      +---- Lost { reason } <---------------------------------------+
//!            (start over: Solicit hinting the old address, capped backoff between attempts)
//! ```
//!
//! The client is identified as the same client on every node that holds the Service: its
//! DUID is a DUID-LL (RFC 8415 §11.4) of the macvlan's MAC (`kube-vip.io/hwaddr`, which
//! moves with the Service), and the IA_NA's IAID is the last four bytes of that MAC.
//! Messages are built and read with `dhcproto`'s v6 module; [`wire`] carries them over a UDP
//! socket on port 546 bound to the macvlan.

pub mod machine;
pub mod wire;

pub use machine::{Config6, Dest6, Machine6, Outgoing6};
pub use wire::{Udp6Transport, Udp6Wire};
