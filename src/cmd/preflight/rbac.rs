//! The `rbac` row of `vipd preflight`: a SelfSubjectAccessReview for every access the
//! configuration makes, and the verdict over their answers.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;

use crate::config::Config;

use super::{Check, Status};

/// SelfSubjectAccessReviews for every access of [`crate::kube::api::API_CALLS`] this
/// configuration makes ([`crate::kube::api::checks_for`]: the features enabled, the Event and endpoint
/// APIs the server serves, each in the namespace it is made in: `cp_namespace`,
/// `svc_namespace` or cluster-wide). Fails naming each denied access and the rule that
/// grants it.
pub(crate) async fn check_rbac(client: kube::Client, cfg: &Config) -> Check {
    let events_v1 = match crate::kube::events::discover_event_api(&client).await {
        Ok(api) => Some(api == crate::kube::events::EventApi::EventsV1),
        Err(_) => None,
    };
    let needs = crate::kube::api::Needs {
        control_plane: cfg.control_plane,
        services: cfg.services,
        node_labeling: cfg.control_plane && cfg.enable_node_labeling,
        // The peer key's `get` is not needed to run (vipd runs without ride-through without
        // it): the `peer-key` row reads the Secret and warns when it cannot.
        ride_through: false,
        ipam: cfg.ipam.is_some(),
        events_v1,
        endpoint_slices: Some(crate::services::endpoints::endpointslice_v1_served(&client).await),
    };
    let namespaces = crate::kube::api::Namespaces {
        lease: cfg.lease.namespace.clone(),
        services: cfg.services_namespace.clone(),
        services_election: cfg.services_election,
        ipam: cfg.ipam.as_ref().map_or_else(
            || crate::ipam::DEFAULT_NAMESPACE.to_string(),
            |k| k.namespace.clone(),
        ),
    };
    let checks = crate::kube::api::checks_for(&needs, &namespaces);
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client);
    let mut denied = Vec::new();
    let mut errors = Vec::new();
    for a in &checks {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(a.group.to_string()),
                    resource: Some(a.resource.to_string()),
                    subresource: (!a.subresource.is_empty()).then(|| a.subresource.to_string()),
                    verb: Some(a.verb.as_str().to_string()),
                    namespace: a.namespace.clone(),
                    name: a.name.map(str::to_string),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            api.create(&PostParams::default(), &review),
        )
        .await;
        match answer {
            Ok(Ok(r)) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(Ok(_)) => denied.push(a),
            Ok(Err(e)) => errors.push(format!("{}: {e}", a.describe())),
            Err(_) => errors.push(format!("{}: no answer within 5 s", a.describe())),
        }
    }
    rbac_verdict(&checks, &denied, &errors, events_v1)
}

/// The `rbac` row from the outcome of [`check_rbac`]'s reviews: `denied` (a subset of
/// `checks`) and `errors` (failed reviews); `events_v1` as in [`crate::kube::api::Needs`].
pub(crate) fn rbac_verdict(
    checks: &[crate::kube::api::AccessCheck],
    denied: &[&crate::kube::api::AccessCheck],
    errors: &[String],
    events_v1: Option<bool>,
) -> Check {
    if !errors.is_empty() {
        return Check::new(
            "rbac",
            Status::Fail,
            format!("SelfSubjectAccessReview failed: {}", errors.join("; ")),
        )
        .fix("allow create on authorization.k8s.io selfsubjectaccessreviews (every user has it by default)");
    }
    if denied.is_empty() {
        let events = match events_v1 {
            Some(true) => " (Events through events.k8s.io/v1)",
            Some(false) => " (Events through core v1)",
            None => "",
        };
        return Check::new(
            "rbac",
            Status::Pass,
            format!(
                "all {} accesses vipd makes are allowed{events}",
                checks.len()
            ),
        );
    }
    let what: Vec<String> = denied.iter().map(|a| a.describe()).collect();
    let mut rules: Vec<String> = Vec::new();
    for r in denied.iter().map(|a| a.rule()) {
        if !rules.contains(&r) {
            rules.push(r);
        }
    }
    Check::new("rbac", Status::Fail, format!("denied: {}", what.join(", "))).fix(format!(
        "grant the rule(s) {} to this identity: `vipd manifest rbac | kubectl apply -f -` \
         has them all in the ClusterRole {} (bind it to this identity)",
        rules.join(", "),
        crate::kube::api::CLUSTER_ROLE
    ))
}
