//! The sd_notify protocol against a test `NOTIFY_SOCKET` (a Unix datagram socket in a
//! temporary directory, and an abstract one): READY=1, WATCHDOG=1, STOPPING=1 arrive as
//! single datagrams; nothing is sent (and nothing fails) without NOTIFY_SOCKET.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

fn recv(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 1024];
    let n = sock.recv(&mut buf).expect("a notification within 5 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The only test in this binary that touches the environment, so no other thread reads it
/// concurrently.
#[test]
fn notify_protocol_against_a_test_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let server = UnixDatagram::bind(&path).unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();

    // Without NOTIFY_SOCKET: a no-op.
    // SAFETY: this test is the only one in this test binary, nothing else reads the
    // environment concurrently.
    unsafe { std::env::remove_var("NOTIFY_SOCKET") };
    assert!(!vipd::obs::systemd::notify_ready("x").unwrap());
    assert!(!vipd::obs::systemd::notify_watchdog().unwrap());

    // SAFETY: as above.
    unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
    assert!(vipd::obs::systemd::notify_ready("holding 0 VIPs").unwrap());
    assert_eq!(recv(&server), "READY=1\nSTATUS=holding 0 VIPs");
    assert!(vipd::obs::systemd::notify_watchdog().unwrap());
    assert_eq!(recv(&server), "WATCHDOG=1");
    assert!(vipd::obs::systemd::notify_stopping().unwrap());
    assert_eq!(recv(&server), "STOPPING=1");

    // Abstract namespace socket (`@name`), as systemd uses for some services.
    use std::os::linux::net::SocketAddrExt;
    let name = format!("vipd-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let abstract_server = UnixDatagram::bind_addr(&addr).unwrap();
    abstract_server
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // SAFETY: as above.
    unsafe { std::env::set_var("NOTIFY_SOCKET", format!("@{name}")) };
    assert!(vipd::obs::systemd::notify_watchdog().unwrap());
    assert_eq!(recv(&abstract_server), "WATCHDOG=1");

    // A socket nobody listens on is an error naming it.
    drop(server);
    // SAFETY: as above.
    unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
    let e = vipd::obs::systemd::notify_ready("x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("notify.sock"), "{e}");
    // SAFETY: as above.
    unsafe { std::env::remove_var("NOTIFY_SOCKET") };
}
