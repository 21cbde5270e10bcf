//! Per-thread network-namespace switching.
//!
//! Linux keeps the network namespace per thread (`setns(2)` with `CLONE_NEWNET` only changes
//! the calling thread), and threads inherit it from the thread that creates them. So the
//! test process stays in the root namespace while helper threads (ARP capture, TCP proxy,
//! HTTP backend, a tokio runtime with a kube client) live inside a lab namespace. The same
//! trick is what `ip netns exec` does for a whole process.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;

use super::error::{LabError, Result, io_ctx};

/// Directory where `ip netns` keeps its named network namespaces (bind mounts).
pub const NETNS_DIR: &str = "/run/netns";

/// Path of the bind mount of the named network namespace `full_name`.
pub fn netns_path(full_name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(full_name)
}

/// Moves the calling thread into the network namespace bound at `path`.
///
/// Only the current thread changes; threads it spawns afterwards start in that namespace.
///
/// # Errors
/// [`LabError::Io`] when the namespace file cannot be opened or `setns(2)` fails.
pub fn enter_netns(path: &Path) -> Result<()> {
    let file = File::open(path).map_err(io_ctx(format!("open {}", path.display())))?;
    nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| LabError::Io {
        context: format!("setns(CLONE_NEWNET) into {}", path.display()),
        source: std::io::Error::from(e),
    })
}

/// Runs `f` on a new thread that first entered the network namespace at `path`, waits for
/// it and returns its value.
///
/// A panic inside `f` is re-raised in the caller (so test assertions inside work as usual).
///
/// # Errors
/// [`LabError::Io`] when the namespace cannot be entered; [`LabError::Thread`] when the
/// thread cannot be spawned.
pub fn run_in_netns<T, F>(path: &Path, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name(format!("netns-{}", short_name(path)))
            .spawn_scoped(scope, move || -> Result<T> {
                enter_netns(path)?;
                Ok(f())
            })
            .map_err(|e| LabError::Thread {
                name: format!("netns-{}", short_name(path)),
                detail: e.to_string(),
            })?;
        match handle.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Spawns a named background thread that enters the namespace at `path` and then runs `f`.
///
/// Errors entering the namespace are returned by the thread's result.
///
/// # Errors
/// [`LabError::Thread`] when the thread cannot be spawned.
pub fn spawn_in_netns<T, F>(
    path: &Path,
    name: &str,
    f: F,
) -> Result<std::thread::JoinHandle<Result<T>>>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            enter_netns(&path)?;
            f()
        })
        .map_err(|e| LabError::Thread {
            name: name.to_string(),
            detail: e.to_string(),
        })
}

fn short_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
