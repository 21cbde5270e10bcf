//! Lease timing and fence rules shared by election, holder and peer protocol.
