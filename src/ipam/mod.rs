//! The IPAM wing: Service address allocation from kube-vip-cloud-provider's (KVCP) `kubevip`
//! ConfigMap (issue 25), so that a cluster needs vipd alone where the k3s how-to ran kube-vip
//! and KVCP side by side.
//!
//! The pure decision core (no tokio, no `kube::Client`, no I/O, no k8s-openapi type in its
//! API; `layers::tests::the_ipam_core_is_pure` keeps it so):
//! - [`pool`]: the ConfigMap's data → a [`pool::PoolBook`] of [`pool::Pool`]s (every key, one
//!   malformed key an error for that key only) with KVCP's precedence and address order.
//! - [`inuse`]: [`inuse::ServiceView`], the plain view of a Service, and [`inuse::InUse`],
//!   every address that anything in the cluster shows; [`inuse::usage`], the pool figures.
//! - [`decide`]: one deterministic pass, [`decide::plan`]: what to write on each Service
//!   ([`decide::Decision`]), and the Warnings a requested address deserves.
//!
//! The runtime:
//! - [`start`] (`task.rs`): every node campaigns for the Lease [`LEASE_NAME`] in the
//!   ConfigMap's namespace (KVCP's own, so a running KVCP and vipd never allocate at once);
//!   the holder watches Services, Nodes and the ConfigMap while it holds it.
//! - [`run`]: one pass ([`run::Allocator::pass`]): views ([`view`]), the plan, the probe of
//!   the addresses about to be handed out ([`probe`], RFC 5227), the conditional writes
//!   ([`mod@write`]: a merge patch carrying the Service's resourceVersion, checked against the
//!   Lease's fence first), Events ([`reasons`]) and the pool metric ([`metrics`]).

//! # KVCP compatibility
//! The keys, their precedence (`cidr-<ns>` > `cidr-global` > `range-<ns>` > `range-global`),
//! the address order (lowest first, `search-order=desc` highest first; IPv4 `x.x.x.0` and
//! `x.x.x.255` never handed out, KVCP `isNetworkIDOrBroadcastIP`),
//! `skip-end-ips-in-cidr=true`, the DHCP pool `0.0.0.0/32`, dual stack from
//! `ipFamilyPolicy`/`ipFamilies`, and what is written (label `implementation=kube-vip`,
//! annotation `kube-vip.io/loadbalancerIPs`, `spec.loadBalancerIP` = the first address,
//! `kube-vip.io/serviceInterface`) follow KVCP `pkg/provider/loadBalancer.go` and
//! `pkg/ipam/` (HEAD d3522c6), so a cluster can move between KVCP and vipd with no Service
//! changing address. A Service that has an annotation or a `spec.loadBalancerIP` is never
//! given another address (KVCP `syncLoadBalancer`'s early returns).
//!
//! # Deliberate differences from KVCP
//! Each has a unit test in the module it concerns:
//! - **In use is everything.** Every address any Service shows (annotation,
//!   `spec.loadBalancerIP`, status ingress, `kube-vip.io/requestedIP`; any type, class,
//!   namespace, label, deleting or not), every Node address and the control-plane VIP. KVCP
//!   counts only the annotation of Services labelled `implementation=kube-vip`, and only in
//!   the Service's namespace when the pool is a namespace pool; both gave duplicates.
//! - **Annotations are read leniently** for in-use: entries are trimmed, anything that
//!   parses as an IP counts (`0.0.0.0`/`::` do not, IPv4-mapped IPv6 counts as its IPv4
//!   address), the rest is skipped. In KVCP one unparsable annotation stops every allocation
//!   of its scope.
//! - **Pool entries are trimmed** (`"a, b"` is accepted; KVCP fails), range ends too; an empty
//!   entry (`a,,b`, a trailing comma) is still an error. A value that is `0.0.0.0/32` once
//!   trimmed is the DHCP pool; `0.0.0.0/32` inside a longer list is an error (KVCP silently
//!   drops it by the `.0` rule).
//! - **Bad keys are reported, per key.** A malformed `cidr-*`/`range-*` value, or one whose
//!   namespace part is empty or not a DNS label, is a [`pool::PoolError`] for that key only:
//!   namespaces whose pool is another key keep allocating (KVCP fails the sync of every
//!   Service the bad key applies to, and never matches a bad namespace part, silently).
//! - **Sharing is deterministic and protocol-aware** (`allow-share-*`): the lowest shareable
//!   address in allocation order, not a random one; TCP/53 and UDP/53 may share, two TCP/80
//!   may not; a Service without ports shares with nobody, whichever side it is on (in KVCP a
//!   port-less new Service may join any address); every Service already on the address must
//!   come from a namespace that allows sharing (KVCP asks the requester's namespace only),
//!   the address must be inside the Service's pool (KVCP does not check), and an address a
//!   node or the control plane uses is never shared. As in KVCP only IPv4 addresses are
//!   shared (`mapImplementedServices`: `addr.Is4()`).
//! - **Refused addresses**: an address the allocator's probe found answered by a host is
//!   never handed out (KVCP does not probe).
//! - **Requested addresses are checked**: outside every pool, or used by something the
//!   Service may not share with, gives a Warning ([`decide::RequestWarning`]); the Service
//!   keeps them.
//! - **Release**: a Service labelled `implementation=kube-vip` that is no longer a
//!   LoadBalancer vipd serves gives its pool addresses back ([`decide::Decision::Release`]);
//!   KVCP keeps the label and annotation forever, so the address stays taken.
//! - **Exhaustion is reported** for a PreferDualStack Service whose pool has one family and
//!   none of it left (KVCP writes an empty annotation, `discoverVIPsDualStack`).
//! - No cache: pools are rebuilt from the data every time, so `skip-end-ips-in-cidr` takes
//!   effect at once (KVCP's per-namespace cache keeps the old set until the CIDR text
//!   changes).

pub mod decide;
pub mod inuse;
pub mod metrics;
pub mod pool;
pub mod probe;
pub mod reasons;
pub mod run;
mod settings;
mod task;
pub mod view;
pub mod write;

pub use settings::{DEFAULT_CONFIG_MAP, DEFAULT_NAMESPACE, LEASE_NAME, Settings};
pub use task::{Parts, Running, SERVICE_VIEW, start};
