//! `svc_ridethrough`'s start-up: the peer key, the peer socket on the Services interface
//! and the protocol timings, checked before the wing starts; the peer node started from
//! them once the Node cache is there.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::ServicesError;
use crate::holder::HolderConfig;
use crate::net::Kernel;
use crate::obs::metrics::Metrics;
use crate::obs::readiness::Readiness;
use crate::services::Settings;

/// How long the start-up read of the peer key Secret retries failures that may pass (no
/// answer, a timeout, 429 or 5xx): a node whose link or API server comes up a moment after
/// vipd (a reboot, the lab's link healing) must not exit on it.
const KEY_READ_PATIENCE: Duration = Duration::from_secs(60);

/// What `svc_ridethrough` needs before the wing starts, checked at start.
pub(super) struct RideSetup {
    key: crate::peer::wire::PeerKey,
    socket: crate::peer::socket::PeerSocket,
    cfg: crate::peer::ridethrough::RideConfig,
    boot_id: u64,
}

/// Reads the peer key from the Secret [`crate::kube::api::PEER_KEY_SECRET`] in `cp_namespace`, opens
/// the peer socket on the Services interface (`vip_servicesinterface`, else
/// `vip_interface`, else the IPv4 default route's) and derives the protocol timings.
///
/// # Errors
/// [`ServicesError::RideThrough`] naming the Secret (missing, no `key`, too short, not
/// readable), the interface or the timing rule.
pub(super) async fn ride_setup<K: Kernel>(
    cfg: &Settings,
    client: &kube::Client,
    kernel: &K,
    holder_cfg: &HolderConfig,
) -> Result<RideSetup, ServicesError> {
    use crate::kube::api::PEER_KEY_SECRET;
    let ns = cfg.cp_namespace.as_str();
    let err = |what: String| ServicesError::RideThrough(format!("svc_ridethrough: {what}"));
    if !holder_cfg.fence.address_fences {
        // Its safety argument (docs/design.md) counts on the whole-second address fence.
        return Err(err(
            "needs Service lease timings with a whole-second address fence (e.g. \
             svc_leaseduration=3 svc_renewdeadline=2 svc_retryperiod=1), not the millisecond \
             fence of sub-second timings"
                .into(),
        ));
    }
    let key = crate::peer::key::read_peer_key(client, ns, KEY_READ_PATIENCE)
        .await
        .map_err(err)?;
    let ifname = cfg
        .services_interface
        .clone()
        .or_else(|| cfg.interface.clone());
    let link = match ifname {
        Some(name) => kernel.link_by_name(&name).await,
        None => match kernel
            .choose_interface(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
            .await
        {
            Ok(idx) => kernel.link_by_index(idx).await,
            Err(e) => Err(e),
        },
    }
    .map_err(|e| {
        err(format!(
            "cannot find the Services interface for the peer protocol (set vip_servicesinterface): {e}"
        ))
    })?;
    let socket = crate::peer::socket::PeerSocket::open(&link).map_err(|e| err(e.to_string()))?;
    let ride_cfg = crate::peer::ridethrough::RideConfig::new(
        &cfg.services_timing,
        holder_cfg.fence.address_secs,
    )
    .map_err(|e| err(e.to_string()))?;
    let boot_id = crate::peer::wire::new_boot_id()
        .map_err(|_| err("no random numbers for the peer protocol's boot id".into()))?;
    info!(interface = %link.name, secret = %format!("{ns}/{PEER_KEY_SECRET}"), "svc_ridethrough: peer key read, heartbeats go on this interface");
    Ok(RideSetup {
        key,
        socket,
        cfg: ride_cfg,
        boot_id,
    })
}

impl RideSetup {
    /// Starts the peer node (heartbeats, until `stop`) of `node`, its membership from the
    /// Node cache `nodes`.
    pub(super) fn start(
        self,
        node: &str,
        client: &kube::Client,
        nodes: &Store<Node>,
        metrics: &Metrics,
        readiness: &Readiness,
        stop: &CancellationToken,
    ) -> crate::peer::node::PeerNode {
        let parts = crate::peer::node::PeerParts {
            node: node.to_owned(),
            cfg: self.cfg,
            key: self.key,
            socket: self.socket,
            boot_id: self.boot_id,
            client: client.clone(),
            nodes: nodes.clone(),
            metrics: metrics.clone(),
            readiness: readiness.clone(),
        };
        crate::peer::node::PeerNode::start(parts, stop.clone())
    }
}
