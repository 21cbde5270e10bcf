//! `vipd status`: every VIP vipd manages, who holds it, how fresh its lease is, how often it
//! moved and what vipd last said about it, read from the API server alone (Leases, Services,
//! vipd's Events, and the `kube-vip.io/has-ip` node label), so it works from any machine
//! with a kubeconfig, not only on a node.
//!
//! Where each column comes from:
//! * control plane: the Lease `--cp-lease` (kube-vip's `cp_namespace`/`vip_leasename`,
//!   default `kube-system/plndr-cp-lock`); its VIP from the Node carrying
//!   [`crate::nodes::label::HAS_IP`] (written with `enable_node_labeling`), else `-`;
//! * a `type: LoadBalancer` Service: its addresses as vipd reads them
//!   (`kube-vip.io/loadbalancerIPs`, then `spec.loadBalancerIP`); its lease is its own
//!   (`kubevip-<name>` or `kube-vip.io/leaseName`, in its namespace, with `svc_election`)
//!   when that Lease exists, an `externalTrafficPolicy: Local` Service's
//!   `vipd-local.<namespace>.<name>` beside the global lease when that exists, else the
//!   global `--svc-lease` (default `kube-system/plndr-svcs-lock`);
//! * holder, renewed, held since and moves: the Lease's `holderIdentity`, `renewTime`,
//!   `acquireTime` and `leaseTransitions`; a lease not renewed within its
//!   `leaseDurationSeconds` is shown as expired (nobody may be answering);
//! * notes: what disagrees (status `ingress` or `kube-vip.io/vipHost` versus the holder,
//!   rejected addresses, no lease) and the latest Event vipd posted for the Service.
//!
//! * pools: each pool of the IPAM ConfigMap `--ipam-configmap` (default `kube-system/kubevip`,
//!   kube-vip-cloud-provider's format) with its usable, used and free addresses (used: shown
//!   by a Service or a Node, or the control-plane VIP of the has-ip label, as the allocator
//!   counts them: `crate::ipam::inuse::usage`), malformed keys
//!   named, and the allocator: the holder of the Lease `kube-vip-cloud-controller` in the
//!   ConfigMap's namespace.
//!
//! The decisions ([`vip_statuses`], [`render_text`], [`pool_statuses`]) are pure and
//! unit-tested; [`run`] only reads the API. RBAC: `list` on leases, services, events and
//! nodes, `get` on the ConfigMap (a `403` on nodes, events or the ConfigMap only drops what
//! they give, with a note).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::election::LeaseRecord;
use crate::kube::client::ClientError;
use crate::kube::events::REPORTING_CONTROLLER;
use crate::nodes::label::HAS_IP;
use crate::services::plan::desired::LeaseRef;
use crate::services::plan::model::{ServiceInfo, service_info};
use crate::services::publish::current_ingress;
use crate::syntax::is_dns1123_subdomain;

/// Output format of `vipd status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table for people.
    Text,
    /// `{"vips": [...], "notes": [...]}` for scripts: one object per VIP row, and what
    /// could not be read.
    Json,
}

/// `vipd status` arguments.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Kubeconfig to read the cluster with [default: in-cluster, $KUBECONFIG, ~/.kube/config]
    #[arg(long = "kubeconfig", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The control-plane Lease as NAMESPACE/NAME (cp_namespace / vip_leasename)
    #[arg(
        long = "cp-lease",
        value_name = "NAMESPACE/NAME",
        default_value = "kube-system/plndr-cp-lock"
    )]
    pub cp_lease: String,
    /// The global Services Lease as NAMESPACE/NAME (used without svc_election;
    /// cp_namespace / svc_leasename)
    #[arg(
        long = "svc-lease",
        value_name = "NAMESPACE/NAME",
        default_value = "kube-system/plndr-svcs-lock"
    )]
    pub svc_lease: String,
    /// Only Services of this namespace [default: every namespace]
    #[arg(long = "namespace", short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The IPAM pool ConfigMap as NAMESPACE/NAME (KUBEVIP_NAMESPACE / KUBEVIP_CONFIG_MAP)
    #[arg(
        long = "ipam-configmap",
        value_name = "NAMESPACE/NAME",
        default_value = "kube-system/kubevip"
    )]
    pub ipam_configmap: String,
    /// Output format: a table, or JSON ({"vips": [...], "pools": [...], "allocator": ..., "notes": [...]})
    #[arg(long = "output", short = 'o', value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Errors of `vipd status`.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// A flag's value is not usable.
    #[error("--{flag} {value:?}: {reason}")]
    Invalid {
        /// The flag, without dashes.
        flag: &'static str,
        /// The value given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Building the client failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// No kubeconfig given and none found (in-cluster, `$KUBECONFIG`, `~/.kube/config`).
    #[error("no Kubernetes credentials: give --kubeconfig PATH or set KUBECONFIG ({0})")]
    NoKubeconfig(String),
    /// Listing objects failed (HTTP status and message, or the transport error).
    #[error("cannot list {what}: {message}")]
    List {
        /// `leases`, `services`, ...
        what: &'static str,
        /// The API server's or the transport's message.
        message: String,
    },
}

/// Parses `NAMESPACE/NAME` for `flag`.
///
/// # Errors
/// [`StatusError::Invalid`] naming `flag` unless there is exactly one `/` between two
/// DNS-1123 subdomains.
pub(crate) fn parse_lease_ref(flag: &'static str, value: &str) -> Result<LeaseRef, StatusError> {
    let invalid = |reason: &str| StatusError::Invalid {
        flag,
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let Some((namespace, name)) = value.split_once('/') else {
        return Err(invalid(
            "expected NAMESPACE/NAME, e.g. kube-system/plndr-cp-lock",
        ));
    };
    if !is_dns1123_subdomain(namespace) || !is_dns1123_subdomain(name) {
        return Err(invalid(
            "namespace and name must be DNS-1123 names (lowercase letters, digits, '-', '.')",
        ));
    }
    Ok(LeaseRef {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// One VIP (or one Service's set of VIPs) and who holds it. Times are whole seconds before
/// the moment `vipd status` read the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct VipStatus {
    /// `control-plane` or `service`.
    pub kind: &'static str,
    /// `control-plane`, or the Service as `namespace/name`.
    pub name: String,
    /// The VIPs, as vipd reads them (`-` when unknown: the control-plane VIP without the
    /// node label).
    pub vips: Vec<String>,
    /// The Lease as `namespace/name`.
    pub lease: String,
    /// `holderIdentity`; `None`: nobody (released, or no Lease).
    pub holder: Option<String>,
    /// Seconds since `renewTime`.
    pub renewed_ago_s: Option<i64>,
    /// Seconds since `acquireTime` (how long the holder has held it).
    pub held_for_s: Option<i64>,
    /// `leaseTransitions`: how many times the holder changed.
    pub moves: Option<i32>,
    /// Not renewed within `leaseDurationSeconds`: the holder is gone or cut off, and no
    /// other vipd has taken the lease (yet).
    pub expired: bool,
    /// Service rows whose lease is held: whether the holder's last write carried the
    /// ride-through marker ([`crate::election::ridemark::RIDE_THROUGH_ANNOTATION`]: it rides
    /// through API server outages); `None` otherwise (the control plane never rides).
    pub ride_through: Option<bool>,
    /// What disagrees or is worth knowing, one sentence each.
    pub notes: Vec<String>,
}

/// A vipd Event about a Service, as read (core v1 view, which also shows events.k8s.io
/// Events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventView {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// `reason`, e.g. `AddressAnnounced`.
    pub reason: String,
    /// `message` (events.k8s.io `note`).
    pub message: String,
    /// The latest of `series.lastObservedTime`, `lastTimestamp` and `eventTime`.
    pub time: Option<Timestamp>,
}

/// Everything [`vip_statuses`] reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterView {
    /// The control-plane Lease's reference.
    pub cp_lease: LeaseRef,
    /// The global Services Lease's reference.
    pub svc_lease: LeaseRef,
    /// Shard leases (`svc_leaseshards`) as found among the Leases ([`shards_in`]).
    pub shards: Option<crate::services::plan::desired::Shards>,
    /// Every Lease read, by reference.
    pub leases: BTreeMap<LeaseRef, LeaseRecord>,
    /// Every Service read (LoadBalancer or not), with the IPs of its
    /// `status.loadBalancer.ingress`.
    pub services: Vec<(ServiceInfo, Vec<String>)>,
    /// vipd's Events about Services.
    pub events: Vec<EventView>,
    /// Values of the `kube-vip.io/has-ip` label, with the Node carrying each.
    pub has_ip: Vec<(String, String)>,
    /// Notes about what could not be read (e.g. nodes forbidden).
    pub unread: Vec<String>,
    /// The IPAM ConfigMap's reference.
    pub ipam_configmap: LeaseRef,
    /// Its `data`; `None`: no such ConfigMap (or not readable: see `unread`).
    pub pools: Option<BTreeMap<String, String>>,
    /// The allocator's view of every Service read.
    pub ipam_views: Vec<crate::ipam::inuse::ServiceView>,
    /// Every Node's own addresses, as (node, address).
    pub node_addresses: Vec<(String, std::net::IpAddr)>,
}

/// One pool of the IPAM ConfigMap as `vipd status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PoolStatus {
    /// The key (`cidr-global`).
    pub pool: String,
    /// The value as written.
    pub addresses: String,
    /// Usable addresses (as text: an IPv6 pool may exceed JSON's integers).
    pub total: String,
    /// Of those, shown by a Service.
    pub used: String,
    /// `total - used`.
    pub free: String,
    /// Why the key is malformed; the figures are then empty.
    pub error: Option<String>,
}

/// The pools of `view`'s IPAM ConfigMap with their figures, valid keys first (key order),
/// then the malformed ones; the allocator (holder of its Lease), if any.
pub(crate) fn pool_statuses(
    view: &ClusterView,
    now: Timestamp,
) -> (Vec<PoolStatus>, Option<String>) {
    let Some(data) = &view.pools else {
        return (Vec::new(), None);
    };
    let book = crate::ipam::pool::PoolBook::from_data(data);
    // The control-plane VIP, as the has-ip label gives it.
    let control_plane: Vec<std::net::IpAddr> = view
        .has_ip
        .iter()
        .filter_map(|(v, _)| v.parse().ok())
        .collect();
    let in_use = crate::ipam::inuse::InUse::build(
        &view.ipam_views,
        &view.node_addresses,
        &control_plane,
        |ns| book.allow_share(ns),
    );
    let mut rows: Vec<PoolStatus> = crate::ipam::inuse::usage(&book, &in_use)
        .into_iter()
        .map(|u| PoolStatus {
            pool: u.pool,
            addresses: u.text.trim().to_string(),
            total: u.total.to_string(),
            used: u.used.to_string(),
            free: u.total.saturating_sub(u.used).to_string(),
            error: None,
        })
        .collect();
    for e in book.problems() {
        rows.push(PoolStatus {
            pool: e.key.clone(),
            addresses: e.value.clone(),
            total: String::new(),
            used: String::new(),
            free: String::new(),
            error: Some(e.to_string()),
        });
    }
    let lease = LeaseRef {
        namespace: view.ipam_configmap.namespace.clone(),
        name: crate::ipam::LEASE_NAME.to_string(),
    };
    let allocator = view.leases.get(&lease).and_then(|l| {
        let holder = Some(l.holder.clone()).filter(|h| !h.is_empty())?;
        let fresh =
            secs_since(l.renew_time, now).is_some_and(|s| s <= i64::from(l.lease_duration_secs));
        Some(if fresh {
            holder
        } else {
            format!("{holder} (expired)")
        })
    });
    (rows, allocator)
}

/// The pools section of the text output (nothing without an IPAM ConfigMap).
pub(crate) fn render_pools(rows: &[PoolStatus], allocator: Option<&str>, cm: &LeaseRef) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = format!("\nPOOLS (ConfigMap {}/{})\n", cm.namespace, cm.name);
    let width = rows.iter().map(|r| r.pool.len()).max().unwrap_or(0).max(4);
    let addr_width = rows
        .iter()
        .map(|r| r.addresses.len())
        .max()
        .unwrap_or(0)
        .max(9);
    out.push_str(&format!(
        "{:<width$}  {:<addr_width$}  TOTAL  USED  FREE\n",
        "POOL", "ADDRESSES"
    ));
    for r in rows {
        match &r.error {
            None => out.push_str(&format!(
                "{:<width$}  {:<addr_width$}  {:<5}  {:<4}  {}\n",
                r.pool, r.addresses, r.total, r.used, r.free
            )),
            Some(e) => out.push_str(&format!(
                "{:<width$}  {:<addr_width$}  malformed: {e}\n",
                r.pool, r.addresses
            )),
        }
    }
    out.push_str(&format!(
        "allocator: {}\n",
        allocator.unwrap_or("nobody holds the Lease kube-vip-cloud-controller (no vipd with svc_ipam, no kube-vip-cloud-provider)")
    ));
    out
}

/// Seconds from `t` to `now` (negative when `t` is in the future, e.g. clock skew).
fn secs_since(t: Option<Timestamp>, now: Timestamp) -> Option<i64> {
    t.map(|t| now.as_second() - t.as_second())
}

/// Holder, ages and expiry of `lease` (all empty when it was not read).
fn lease_columns(
    view: &ClusterView,
    lease: &LeaseRef,
    now: Timestamp,
) -> (Option<String>, Option<i64>, Option<i64>, Option<i32>, bool) {
    let Some(r) = view.leases.get(lease) else {
        return (None, None, None, None, false);
    };
    let renewed = secs_since(r.renew_time, now);
    let held = r.is_held();
    let expired = held && renewed.is_none_or(|s| s > i64::from(r.lease_duration_secs));
    (
        held.then(|| r.holder.clone()),
        renewed,
        secs_since(r.acquire_time, now).filter(|_| held),
        Some(r.transitions),
        expired,
    )
}

/// The rows `vipd status` shows: the control plane first (when its Lease exists), then every
/// LoadBalancer Service that vipd would consider (not ignored), by namespace/name. Pure.
pub(crate) fn vip_statuses(view: &ClusterView, now: Timestamp) -> Vec<VipStatus> {
    let mut rows = Vec::new();
    if view.leases.contains_key(&view.cp_lease) {
        let (holder, renewed, held_for, moves, expired) = lease_columns(view, &view.cp_lease, now);
        let mut vips: Vec<String> = view.has_ip.iter().map(|(v, _)| v.clone()).collect();
        vips.sort();
        vips.dedup();
        let mut notes = Vec::new();
        if vips.is_empty() {
            vips.push("-".into());
        }
        for (value, node) in &view.has_ip {
            if holder.as_deref() != Some(node.as_str()) {
                notes.push(format!(
                    "node {node} still carries {HAS_IP}={value} but does not hold the lease"
                ));
            }
        }
        rows.push(VipStatus {
            kind: "control-plane",
            ride_through: None,
            name: "control-plane".into(),
            vips,
            lease: view.cp_lease.to_string(),
            holder,
            renewed_ago_s: renewed,
            held_for_s: held_for,
            moves,
            expired,
            notes,
        });
    }
    let mut services: Vec<&(ServiceInfo, Vec<String>)> = view
        .services
        .iter()
        .filter(|(s, _)| s.is_load_balancer && !s.ignored)
        .collect();
    services.sort_by_key(|(s, _)| s.key.to_string());
    for (svc, ingress) in services {
        rows.push(service_row(view, svc, ingress, now));
    }
    rows
}

/// What a Service's Lease says beyond its columns: a pending fail-back request
/// (`svc_failback`), and, while it is held, a holder that does not ride through API server
/// outages (no [`crate::election::ridemark::RIDE_THROUGH_ANNOTATION`] on its last write).
fn lease_notes(
    view: &ClusterView,
    lease: &LeaseRef,
    holder: Option<&str>,
    announced: bool,
) -> Vec<String> {
    let mut notes = Vec::new();
    let Some(r) = view.leases.get(lease) else {
        return notes;
    };
    if let Some(by) = r
        .failback_request
        .as_ref()
        .filter(|by| holder != Some(by.as_str()))
    {
        notes.push(format!(
            "fail-back requested by {by} (svc_failback: the holder hands over after its hold-down)"
        ));
    }
    if announced && r.ride_through.is_none() {
        notes.push(format!(
            "the holder does not ride through API server outages (no {} on the Lease: no peer key Secret vipd-peer-key, svc_ridethrough=false, or not vipd)",
            crate::election::ridemark::RIDE_THROUGH_ANNOTATION
        ));
    }
    notes
}

/// The row of one LoadBalancer Service.
fn service_row(
    view: &ClusterView,
    svc: &ServiceInfo,
    ingress: &[String],
    now: Timestamp,
) -> VipStatus {
    let own = svc.own_lease();
    // Under shard leases, the planner's rule places it (its shard, or its own lease).
    let sharded = view.shards.as_ref().map(|s| {
        crate::services::plan::desired::info_lease(
            &crate::services::plan::desired::Mode::Sharded(s.clone()),
            svc,
        )
    });
    // A Local Service's own lease beside the global one (one lease for all).
    let local = crate::services::plan::desired::local_lease(&view.svc_lease.namespace, &svc.key);
    let lease = if let Some(l) = sharded.filter(|l| view.leases.contains_key(l)) {
        l
    } else if svc.etp_local && view.leases.contains_key(&local) {
        local
    } else if view.leases.contains_key(&own) || !view.leases.contains_key(&view.svc_lease) {
        own
    } else {
        view.svc_lease.clone()
    };
    let (holder, renewed, held_for, moves, expired) = lease_columns(view, &lease, now);
    let mut vips: Vec<String> = svc
        .addresses
        .addresses
        .iter()
        .map(|a| a.to_string())
        .collect();
    if svc.addresses.dhcp {
        vips.push("DHCP".into());
    }
    let mut notes = Vec::new();
    if vips.is_empty() {
        vips.push("-".into());
        notes.push("no address (kube-vip.io/loadbalancerIPs or spec.loadBalancerIP)".into());
    }
    if let Some(m) = svc.addresses.rejection_message() {
        notes.push(m);
    }
    if !view.leases.contains_key(&lease) {
        let has_event = view
            .events
            .iter()
            .any(|e| e.namespace == svc.key.namespace && e.name == svc.key.name);
        notes.push(if has_event {
            format!("no Lease {lease}: not announced (vipd's last Event below says why)")
        } else {
            format!(
                "no Lease {lease}: no vipd has campaigned for it (is vipd running with svc_enable?)"
            )
        });
    }
    let announced = holder.is_some() && !expired;
    let mut shown: Vec<String> = ingress.to_vec();
    shown.sort();
    let mut expected: Vec<String> = svc
        .addresses
        .addresses
        .iter()
        .map(|a| a.to_string())
        .collect();
    expected.sort();
    if announced && shown != expected {
        notes.push(format!(
            "status.loadBalancer.ingress shows [{}]",
            shown.join(", ")
        ));
    }
    if let (Some(h), Some(v)) = (&holder, &svc.vip_host)
        && h != v
        && announced
    {
        notes.push(format!("kube-vip.io/vipHost says {v}"));
    }
    notes.extend(lease_notes(view, &lease, holder.as_deref(), announced));
    if let Some(e) = view
        .events
        .iter()
        .filter(|e| e.namespace == svc.key.namespace && e.name == svc.key.name)
        .max_by_key(|e| e.time)
    {
        let age = secs_since(e.time, now).map_or(String::new(), |s| format!(" ({} ago)", age(s)));
        notes.push(format!("last Event {}: {}{age}", e.reason, e.message));
    }
    VipStatus {
        kind: "service",
        ride_through: announced
            .then(|| view.leases.get(&lease).map(|r| r.ride_through.is_some()))
            .flatten(),
        name: svc.key.to_string(),
        vips,
        lease: lease.to_string(),
        holder,
        renewed_ago_s: renewed,
        held_for_s: held_for,
        moves,
        expired,
        notes,
    }
}

/// A duration in kubectl's short style: `45s`, `3m12s`, `5h3m`, `2d4h`; `0s` for negatives.
pub(crate) fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// The table `vipd status` prints: one line per row with KIND, NAME, VIPS, HOLDER, RENEWED
/// (`expired` when the lease lapsed), HELD, MOVES; each note on its own indented line below.
pub(crate) fn render_text(rows: &[VipStatus], unread: &[String]) -> String {
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let table: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            let renewed = match (r.expired, r.renewed_ago_s) {
                (true, Some(s)) => format!("expired ({} ago)", age(s)),
                (true, None) => "expired".into(),
                (false, s) => dash(s.map(|s| format!("{} ago", age(s)))),
            };
            [
                r.kind.to_string(),
                r.name.clone(),
                r.vips.join(","),
                dash(r.holder.clone()),
                renewed,
                dash(r.held_for_s.map(age)),
                dash(r.moves.map(|m| m.to_string())),
            ]
        })
        .collect();
    let header = ["KIND", "NAME", "VIPS", "HOLDER", "RENEWED", "HELD", "MOVES"];
    let mut widths = header.map(str::len);
    for line in &table {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.len());
        }
    }
    let fmt_line = |cells: [&str; 7]| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = fmt_line(header);
    for (line, row) in table.iter().zip(rows) {
        out.push_str(&fmt_line([
            &line[0], &line[1], &line[2], &line[3], &line[4], &line[5], &line[6],
        ]));
        for n in &row.notes {
            out.push_str(&format!("    {n}\n"));
        }
    }
    if rows.is_empty() {
        out.push_str("(no vipd lease and no LoadBalancer Service found)\n");
    }
    for u in unread {
        out.push_str(&format!("note: {u}\n"));
    }
    out
}

/// How long one list may take before `vipd status` gives up: 10 s.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// Lists `api` with `lp` within [`LIST_TIMEOUT`].
async fn list<K>(api: &Api<K>, lp: &ListParams, what: &'static str) -> Result<Vec<K>, StatusError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(LIST_TIMEOUT, api.list(lp)).await {
        Ok(Ok(l)) => Ok(l.items),
        Ok(Err(e)) => Err(StatusError::List {
            what,
            message: e.to_string(),
        }),
        Err(_) => Err(StatusError::List {
            what,
            message: format!("timed out after {} s", LIST_TIMEOUT.as_secs()),
        }),
    }
}

/// The latest time an Event shows.
fn event_time(e: &Event) -> Option<Timestamp> {
    [
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0),
        e.last_timestamp.as_ref().map(|t| t.0),
        e.event_time.as_ref().map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()
}

/// Reads the IPAM ConfigMap `ipam_configmap` into `view` (a failure becomes a note).
async fn read_pools(client: &kube::Client, ipam_configmap: LeaseRef, view: &mut ClusterView) {
    let cm_api: Api<ConfigMap> = Api::namespaced(client.clone(), &ipam_configmap.namespace);
    match tokio::time::timeout(LIST_TIMEOUT, cm_api.get_opt(&ipam_configmap.name)).await {
        Ok(Ok(cm)) => view.pools = cm.map(|c| c.data.unwrap_or_default()),
        Ok(Err(e)) => view.unread.push(format!(
            "cannot read ConfigMap {}/{}: {e}; its pools are not shown",
            ipam_configmap.namespace, ipam_configmap.name
        )),
        Err(_) => view.unread.push(format!(
            "reading ConfigMap {}/{} timed out; its pools are not shown",
            ipam_configmap.namespace, ipam_configmap.name
        )),
    }
    view.ipam_configmap = ipam_configmap;
}

/// Reads the cluster (Leases, Services, vipd's Service Events, labelled Nodes).
///
/// # Errors
/// [`StatusError::List`] when leases or services cannot be listed; events and nodes that
/// cannot be listed become notes in [`ClusterView::unread`].
pub(crate) async fn read_cluster(
    client: kube::Client,
    cp_lease: LeaseRef,
    svc_lease: LeaseRef,
    ipam_configmap: LeaseRef,
    namespace: Option<&str>,
) -> Result<ClusterView, StatusError> {
    let all = ListParams::default();
    let leases = list(&Api::<Lease>::all(client.clone()), &all, "leases").await?;
    let (svc_api, ev_api): (Api<Service>, Api<Event>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let services = list(&svc_api, &all, "services").await?;
    let mut view = ClusterView {
        cp_lease,
        svc_lease,
        ..Default::default()
    };
    read_pools(&client, ipam_configmap, &mut view).await;
    for l in &leases {
        let (Some(ns), Some(name)) = (&l.metadata.namespace, &l.metadata.name) else {
            continue;
        };
        view.leases.insert(
            LeaseRef {
                namespace: ns.clone(),
                name: name.clone(),
            },
            LeaseRecord::from_lease(l),
        );
    }
    view.shards = shards_in(view.leases.keys());
    for s in &services {
        let ingress = current_ingress(s)
            .iter()
            .filter_map(|x| x.ip.clone())
            .collect();
        view.services.push((service_info(s), ingress));
        view.ipam_views.push(crate::ipam::view::view_of(
            s,
            false,
            crate::kube::service::DEFAULT_LB_CLASS_NAME,
        ));
    }
    let ev_lp = ListParams::default().fields("involvedObject.kind=Service");
    match list(&ev_api, &ev_lp, "events").await {
        Ok(events) => {
            for e in events {
                let by_vipd = e.reporting_component.as_deref() == Some(REPORTING_CONTROLLER)
                    || e.source.as_ref().and_then(|s| s.component.as_deref())
                        == Some(REPORTING_CONTROLLER);
                if !by_vipd {
                    continue;
                }
                let time = event_time(&e);
                view.events.push(EventView {
                    namespace: e.involved_object.namespace.clone().unwrap_or_default(),
                    name: e.involved_object.name.clone().unwrap_or_default(),
                    reason: e.reason.clone().unwrap_or_default(),
                    message: e.message.clone().unwrap_or_default(),
                    time,
                });
            }
        }
        Err(e) => view
            .unread
            .push(format!("{e}; the last Event of each Service is not shown")),
    }
    match list(&Api::<Node>::all(client), &ListParams::default(), "nodes").await {
        Ok(nodes) => {
            for n in &nodes {
                let name = n.metadata.name.clone().unwrap_or_default();
                if let Some(v) = n.metadata.labels.as_ref().and_then(|l| l.get(HAS_IP)) {
                    view.has_ip.push((v.clone(), name));
                }
            }
            let nodes: Vec<std::sync::Arc<Node>> =
                nodes.into_iter().map(std::sync::Arc::new).collect();
            view.node_addresses = crate::nodes::node_addresses(&nodes)
                .into_iter()
                .map(|(a, n)| (n, a))
                .collect();
        }
        Err(e) => view.unread.push(format!(
            "{e}; the control-plane VIP is shown only from the {HAS_IP} node label"
        )),
    }
    Ok(view)
}

/// The shard leases (`svc_leaseshards`) among `leases`: the namespace of the first Lease
/// named `vipd-services-shard-<i>` and, as the count, the highest index found there plus
/// one (the count is vipd's configuration, which `vipd status` does not read: after the
/// count shrinks, the shards beyond it count until the orphan collector deletes them);
/// `None` without any. Pure.
pub(crate) fn shards_in<'a>(
    leases: impl Iterator<Item = &'a LeaseRef>,
) -> Option<crate::services::plan::desired::Shards> {
    let mut found: Option<(String, u16)> = None;
    for l in leases {
        let Some(i) = crate::services::plan::desired::shard_index(&l.name) else {
            continue;
        };
        match &mut found {
            None => found = Some((l.namespace.clone(), i)),
            Some((ns, top)) if *ns == l.namespace => *top = (*top).max(i),
            Some(_) => {}
        }
    }
    found.map(|(namespace, top)| crate::services::plan::desired::Shards {
        namespace,
        count: top.saturating_add(1),
    })
}

/// `vipd status`: reads the cluster and returns what to print.
///
/// # Errors
/// [`StatusError::Invalid`] for a bad `--cp-lease` / `--svc-lease`, [`StatusError::Client`]
/// without a usable kubeconfig, [`StatusError::List`] (see [`read_cluster`]).
pub async fn run(args: &StatusArgs) -> Result<String, StatusError> {
    let cp_lease = parse_lease_ref("cp-lease", &args.cp_lease)?;
    let svc_lease = parse_lease_ref("svc-lease", &args.svc_lease)?;
    let ipam_configmap = parse_lease_ref("ipam-configmap", &args.ipam_configmap)?;
    let config = crate::kube::client::kube_config(args.kubeconfig.as_deref(), false)
        .await
        .map_err(|e| match e {
            ClientError::Kubeconfig { path, message } => StatusError::Invalid {
                flag: "kubeconfig",
                value: path,
                reason: message,
            },
            ClientError::Infer(message) => StatusError::NoKubeconfig(message),
            other => StatusError::Client(other),
        })?;
    let client = kube::Client::try_from(config).map_err(|e| ClientError::Build(e.to_string()))?;
    let view = read_cluster(
        client,
        cp_lease,
        svc_lease,
        ipam_configmap,
        args.namespace.as_deref(),
    )
    .await?;
    let now = Timestamp::now();
    let rows = vip_statuses(&view, now);
    let (pools, allocator) = pool_statuses(&view, now);
    Ok(match args.output {
        Output::Text => {
            render_text(&rows, &view.unread)
                + &render_pools(&pools, allocator.as_deref(), &view.ipam_configmap)
        }
        Output::Json => {
            let doc = serde_json::json!({
                "vips": rows,
                "pools": pools,
                "allocator": allocator,
                "notes": view.unread,
            });
            format!("{doc:#}\n")
        }
    })
}

#[cfg(test)]
mod tests;
