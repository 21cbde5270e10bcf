//! `svc_ridethrough`'s start-up: the peer socket on the Services interface and the protocol
//! timings, checked before the wing starts; the peer node started from them once the Node
//! cache is there. The peer node reads the key itself (`peer::key`): without it vipd runs
//! without ride-through and says so once, it never refuses to start for it.

use std::net::IpAddr;

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

/// What `svc_ridethrough` needs before the wing starts, checked at start.
pub(super) struct RideSetup {
    namespace: String,
    socket: crate::peer::socket::PeerSocket,
    cfg: crate::peer::ridethrough::RideConfig,
    boot_id: u64,
}

/// Opens the peer socket on the Services interface (`vip_servicesinterface`, else
/// `vip_interface`, else the IPv4 default route's) and derives the protocol timings; the
/// peer key (the Secret [`crate::kube::api::PEER_KEY_SECRET`] in `cp_namespace`) is read by
/// the peer node.
///
/// # Errors
/// [`ServicesError::RideThrough`] naming the interface or the timing rule.
pub(super) async fn ride_setup<K: Kernel>(
    cfg: &Settings,
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
    info!(interface = %link.name, secret = %format!("{ns}/{PEER_KEY_SECRET}"), "svc_ridethrough: heartbeats go on this interface once the peer key is read");
    Ok(RideSetup {
        namespace: ns.to_owned(),
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
            namespace: self.namespace,
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
