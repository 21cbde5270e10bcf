//! `vipd drain` (the command) against the admin endpoint `vipd manager` serves, on
//! loopback: the two commands meet only here, over HTTP, as they do on a node.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;
use vipd::cmd::drain::{DrainArgs, run};
use vipd::cmd::manager::admin;
use vipd::nodes::eligibility::{DrainSwitch, Ineligible, Wing};
use vipd::obs::metrics::Metrics;
use vipd::obs::readiness::Readiness;
use vipd::syntax::ListenAddr;

/// `vipd drain` against a real admin endpoint on loopback: drain, ask, undrain; and a
/// clear error when nothing listens.
#[tokio::test]
async fn drain_status_undo_through_the_admin_endpoint() {
    let drain = DrainSwitch::default();
    let stop = CancellationToken::new();
    let srv = admin::start(
        &ListenAddr::from(SocketAddr::from(([127, 0, 0, 1], 0))),
        Metrics::new("n"),
        Readiness::new(),
        drain.clone(),
        stop.clone(),
    )
    .await
    .unwrap();
    let admin = srv.local_addr.to_string();
    let args = |undo, status| DrainArgs {
        undo,
        status,
        admin: Some(admin.clone()),
    };
    assert_eq!(run(&args(false, true)).await.unwrap(), "not drained");
    assert_eq!(run(&args(false, false)).await.unwrap(), "drained");
    assert!(drain.is_set());
    assert_eq!(run(&args(false, true)).await.unwrap(), "drained");
    // Drained by other means too: said after the switch's state.
    drain.record(Wing::Services, Some(Ineligible::DrainAnnotation));
    assert_eq!(
        run(&args(true, false)).await.unwrap(),
        "not drained\nservices: not announcing: annotated vipd.io/drain=true"
    );
    assert!(!drain.is_set());
    stop.cancel();
    srv.task.await.unwrap();
    let e = run(&args(false, false)).await.unwrap_err().to_string();
    assert!(e.contains("cannot reach") && e.contains("--admin"), "{e}");
}
