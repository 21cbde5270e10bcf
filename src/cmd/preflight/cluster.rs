//! The cluster rows of `vipd preflight`: the `api` server answers, `vip-free` answers by
//! the Lease's holder are explained, and the `peer-key` Secret of `svc_ridethrough` reads.

use std::time::Duration;

use crate::config::Config;

use super::{Check, Report, Status};

/// The `api` row: the election client answers within 5 s. Returns the client when it does.
pub(super) async fn check_api(cfg: &Config, report: &mut Report) -> Option<kube::Client> {
    match crate::kube::client::election_client(&cfg.kube()).await {
        Ok((c, url)) => match tokio::time::timeout(Duration::from_secs(5), c.apiserver_version())
            .await
        {
            Ok(Ok(v)) => {
                report.checks.push(Check::new(
                    "api",
                    Status::Pass,
                    format!("{url} answers, version {}", v.git_version),
                ));
                Some(c)
            }
            Ok(Err(e)) => {
                report
                    .checks
                    .push(Check::new("api", Status::Fail, format!("{url}: {e}")).fix(
                        "check k8s_config_file and kubernetes_addr, and that the API server runs",
                    ));
                None
            }
            Err(_) => {
                report.checks.push(
                    Check::new("api", Status::Fail, format!("{url}: no answer within 5 s"))
                        .fix("check kubernetes_addr / the kubeconfig's server and the firewall"),
                );
                None
            }
        },
        Err(e) => {
            report.checks.push(
                Check::new("api", Status::Fail, e.to_string())
                    .fix("set k8s_config_file (--k8sConfigPath) to a readable kubeconfig"),
            );
            None
        }
    }
}

/// A VIP that answers on the segment while the control-plane Lease names another node as
/// holder is that node's vipd (or kube-vip) doing its job, not a conflict: the failed
/// `vip-free` checks become passes that say so.
pub(super) async fn explain_answers_by_holder(
    client: &kube::Client,
    cfg: &Config,
    report: &mut Report,
) {
    if !cfg.control_plane {
        return;
    }
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), &cfg.lease.namespace);
    let holder =
        match tokio::time::timeout(Duration::from_secs(5), api.get_opt(&cfg.lease.name)).await {
            Ok(Ok(Some(l))) => l.spec.and_then(|s| s.holder_identity).unwrap_or_default(),
            _ => return,
        };
    if holder.is_empty() || holder == cfg.node_name {
        return;
    }
    for c in report.checks.iter_mut().filter(|c| {
        c.name.starts_with("vip-free:")
            && c.status == Status::Fail
            && c.detail.starts_with("already in use")
    }) {
        c.status = Status::Pass;
        c.detail = format!(
            "{}; lease {}/{} is held by {holder}, so this is its announcer",
            c.detail, cfg.lease.namespace, cfg.lease.name
        );
        c.fix = None;
    }
}

/// The `peer-key` row (`svc_ridethrough`): the outcome of reading the peer key Secret as
/// the manager does ([`crate::peer::key::read_peer_key`]). Without it the manager runs
/// without ride-through (issue 27), so a failure warns, with the command that creates it.
pub(crate) fn check_peer_key(read: Result<crate::peer::wire::PeerKey, String>) -> Check {
    match read {
        Ok(_) => Check::new(
            "peer-key",
            Status::Pass,
            format!(
                "the Secret {} has a usable peer key",
                crate::kube::api::PEER_KEY_SECRET
            ),
        ),
        Err(e) => Check::new(
            "peer-key",
            Status::Warn,
            format!("{e}; until then Service VIPs do not ride through API server outages"),
        )
        .fix(
            "`vipd manifest rbac | kubectl apply -f -` (rules and a new key), or only the key: `vipd manifest peer-key | kubectl create -f -`; running vipd read it within a minute",
        ),
    }
}
