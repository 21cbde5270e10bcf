//! The reasons of the Events the allocator posts on Services.

/// Normal: an address was written to the Service.
pub const REASON_ALLOCATED: &str = "AddressAllocated";
/// Normal: a Service that stopped being a LoadBalancer vipd serves gave its addresses back.
pub const REASON_RELEASED: &str = "AddressReleased";
/// Warning: the pool that applies has no free address left.
pub const REASON_POOL_EXHAUSTED: &str = "PoolExhausted";
/// Warning: no pool applies to the Service's namespace (the message says how to add one).
pub const REASON_NO_POOL: &str = "NoAddressPool";
/// Warning: the pool key that applies is malformed (the message names key and value).
pub const REASON_POOL_INVALID: &str = "InvalidAddressPool";
/// Warning: a requested address is outside every pool.
pub const REASON_NOT_IN_POOL: &str = "AddressNotInPool";
/// Warning: a requested address is already used, or a pool address is answered by another
/// host on the segment (the message names the MAC).
pub const REASON_IN_USE: &str = "AddressInUse";
