//! The systemd notify protocol (sd_notify(3)): `READY=1`, `WATCHDOG=1`, `STOPPING=1` sent
//! as one datagram to the socket named by `$NOTIFY_SOCKET` (a path, or `@name` for the
//! abstract namespace). Every helper is a no-op returning `Ok(false)` without
//! `$NOTIFY_SOCKET`, so vipd behaves the same in a pod.
//!
//! Use from `vipd manager`: [`notify_ready`] once the configuration is valid and the API
//! server answered, [`watchdog_interval`] to learn how often to call [`notify_watchdog`]
//! from the main loop (half of `WatchdogSec=`, as sd_watchdog_enabled(3) advises), and
//! [`notify_stopping`] when shutdown begins.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Errors sending a notification.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `$NOTIFY_SOCKET` is set but unusable (e.g. a relative path).
    #[error("NOTIFY_SOCKET={value:?}: {reason}")]
    BadSocket {
        /// The variable's value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The datagram could not be sent.
    #[error("sd_notify to {socket:?}: {source}")]
    Send {
        /// The socket.
        socket: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Sends `state` (newline-separated `KEY=VALUE` assignments) to the socket `socket`
/// (`/path` or `@abstract`).
///
/// # Errors
/// [`NotifyError::BadSocket`], [`NotifyError::Send`].
pub(crate) fn notify_to(socket: &str, state: &str) -> Result<(), NotifyError> {
    let sock = UnixDatagram::unbound().map_err(|source| NotifyError::Send {
        socket: socket.to_string(),
        source,
    })?;
    let send = |r: std::io::Result<usize>| {
        r.map(|_| ()).map_err(|source| NotifyError::Send {
            socket: socket.to_string(),
            source,
        })
    };
    if let Some(name) = socket.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| {
                NotifyError::BadSocket {
                    value: socket.to_string(),
                    reason: e.to_string(),
                }
            })?;
        send(sock.send_to_addr(state.as_bytes(), &addr))
    } else if socket.starts_with('/') {
        send(sock.send_to(state.as_bytes(), socket))
    } else {
        Err(NotifyError::BadSocket {
            value: socket.to_string(),
            reason: "expected an absolute path or @abstract-name".into(),
        })
    }
}

/// Sends `state` to `$NOTIFY_SOCKET`. Returns `Ok(false)` (nothing sent) when the variable
/// is unset or empty, `Ok(true)` when sent.
///
/// # Errors
/// See [`notify_to`].
pub fn notify(state: &str) -> Result<bool, NotifyError> {
    match std::env::var("NOTIFY_SOCKET") {
        Ok(s) if !s.is_empty() => notify_to(&s, state).map(|()| true),
        _ => Ok(false),
    }
}

/// `READY=1` (with a `STATUS=` line for `systemctl status`).
///
/// # Errors
/// See [`notify_to`].
pub fn notify_ready(status: &str) -> Result<bool, NotifyError> {
    notify(&format!("READY=1\nSTATUS={}", status.replace('\n', " ")))
}

/// `WATCHDOG=1`: the main loop is alive.
///
/// # Errors
/// See [`notify_to`].
pub fn notify_watchdog() -> Result<bool, NotifyError> {
    notify("WATCHDOG=1")
}

/// `STOPPING=1`: shutdown has begun.
///
/// # Errors
/// See [`notify_to`].
pub fn notify_stopping() -> Result<bool, NotifyError> {
    notify("STOPPING=1")
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC` (microseconds), when it is set
/// and `$WATCHDOG_PID` is unset or this process's pid (sd_watchdog_enabled(3)); `None`
/// otherwise.
pub(crate) fn watchdog_interval() -> Option<Duration> {
    watchdog_interval_from(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

/// [`watchdog_interval`] over explicit values (pure, for tests).
pub(crate) fn watchdog_interval_from(
    usec: Option<&str>,
    pid: Option<&str>,
    me: u32,
) -> Option<Duration> {
    if let Some(p) = pid
        && p.parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    let usec: u64 = usec?.parse().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_is_half_and_respects_pid() {
        assert_eq!(
            watchdog_interval_from(Some("10000000"), None, 7),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            watchdog_interval_from(Some("10000000"), Some("7"), 7),
            Some(Duration::from_secs(5))
        );
        assert_eq!(watchdog_interval_from(Some("10000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_from(None, None, 7), None);
        assert_eq!(watchdog_interval_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_from(Some("x"), None, 7), None);
    }

    #[test]
    fn relative_socket_is_an_error() {
        let e = notify_to("relative/sock", "READY=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("relative/sock"), "{e}");
    }
}
