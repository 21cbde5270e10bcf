//! Processes started inside lab namespaces, and one-shot commands.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub use nix::sys::signal::Signal;
use nix::unistd::Pid;

use std::sync::atomic::Ordering;

use super::error::{LabError, Result, io_ctx};
use super::{Lab, netns};

/// Finds `ip` (iproute2): PATH first, then /usr/sbin and /sbin (not always in a user's PATH).
pub fn ip_binary() -> PathBuf {
    find_in_path("ip")
        .or_else(|| {
            ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("ip"))
}

/// Looks `name` up in `$PATH` and returns the first regular file found.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Runs `program args...` to completion and returns its output.
///
/// # Errors
/// [`LabError::Io`] if it cannot be started, [`LabError::Command`] if it exits non-zero.
pub fn run<S: AsRef<OsStr>>(program: impl AsRef<OsStr>, args: &[S]) -> Result<Output> {
    let mut cmd = Command::new(program.as_ref());
    cmd.args(args).stdin(Stdio::null());
    let line = command_line(program.as_ref(), args);
    let out = cmd.output().map_err(io_ctx(format!("run `{line}`")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(LabError::Command {
            command: line,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Runs `ip args...` (iproute2); see [`run`].
///
/// # Errors
/// As [`run`].
pub fn ip(args: &[&str]) -> Result<Output> {
    run(ip_binary(), args)
}

pub(crate) fn command_line<S: AsRef<OsStr>>(program: &OsStr, args: &[S]) -> String {
    let mut line = program.to_string_lossy().into_owned();
    for a in args {
        line.push(' ');
        line.push_str(&a.as_ref().to_string_lossy());
    }
    line
}

/// A long-running process started inside a lab namespace with `ip netns exec` (which execs
/// the command in place, so [`LabProcess::pid`] is the command's own pid).
///
/// Standard output and error both go to [`LabProcess::log`]. Dropping a `LabProcess`
/// kills it (SIGKILL) and reaps it; the lab's teardown also kills anything left in its
/// namespaces.
#[derive(Debug)]
pub struct LabProcess {
    name: String,
    child: Option<Child>,
    pid: i32,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl LabProcess {
    /// Starts `program args...` in the network namespace `full_ns` (full `ip netns` name)
    /// with extra environment `env`, logging to `log`.
    pub(crate) fn spawn(
        full_ns: &str,
        name: &str,
        program: &OsStr,
        args: &[&OsStr],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<LabProcess> {
        let out = File::create(log).map_err(io_ctx(format!("create {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_ctx(format!("dup {}", log.display())))?;
        let mut cmd = Command::new(ip_binary());
        cmd.arg("netns")
            .arg("exec")
            .arg(full_ns)
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(io_ctx(format!(
            "spawn `{}` in netns {full_ns}",
            command_line(program, args)
        )))?;
        let pid = i32::try_from(child.id()).map_err(|_| LabError::Parse {
            what: "child pid".into(),
            detail: child.id().to_string(),
        })?;
        Ok(LabProcess {
            name: name.to_string(),
            child: Some(child),
            pid,
            log: log.to_path_buf(),
            status: None,
        })
    }

    /// The process id (in the root pid namespace).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The short name given at spawn time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Path of the file receiving the process's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything the process wrote to stdout/stderr so far (lossy UTF-8; empty if the log
    /// cannot be read).
    pub fn log(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Sends `signal` (e.g. SIGTERM, SIGKILL, SIGSTOP, SIGCONT) to the process.
    ///
    /// # Errors
    /// [`LabError::Io`] when `kill(2)` fails (e.g. the process was already reaped).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        if self.status.is_some() {
            return Err(LabError::Io {
                context: format!("signal {signal} to {} (pid {})", self.name, self.pid),
                source: std::io::Error::other("process already exited and was reaped"),
            });
        }
        nix::sys::signal::kill(Pid::from_raw(self.pid), signal).map_err(|e| LabError::Io {
            context: format!("signal {signal} to {} (pid {})", self.name, self.pid),
            source: e.into(),
        })
    }

    /// Returns the exit status if the process has exited (reaping it), without blocking.
    ///
    /// # Errors
    /// [`LabError::Io`] when `waitpid(2)` fails.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let Some(child) = self.child.as_mut() else {
            return Ok(None);
        };
        let st = child
            .try_wait()
            .map_err(io_ctx(format!("wait for {}", self.name)))?;
        self.status = st;
        Ok(st)
    }

    /// Waits up to `timeout` for the process to exit; `Ok(None)` if it is still running.
    ///
    /// # Errors
    /// [`LabError::Io`] when `waitpid(2)` fails.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(Some(st));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGTERM, waits up to `grace`, then SIGKILLs; returns the exit status.
    ///
    /// # Errors
    /// [`LabError::Io`] when signalling or waiting fails.
    pub fn stop(&mut self, grace: Duration) -> Result<ExitStatus> {
        if let Some(st) = self.try_wait()? {
            return Ok(st);
        }
        let _ = self.signal(Signal::SIGTERM);
        if let Some(st) = self.wait_timeout(grace)? {
            return Ok(st);
        }
        self.kill()
    }

    /// SIGKILLs the process (and SIGCONTs it, in case it was stopped) and reaps it.
    ///
    /// # Errors
    /// [`LabError::Io`] when waiting fails.
    pub fn kill(&mut self) -> Result<ExitStatus> {
        if let Some(st) = self.try_wait()? {
            return Ok(st);
        }
        let _ = self.signal(Signal::SIGKILL);
        let _ = self.signal(Signal::SIGCONT);
        let Some(child) = self.child.as_mut() else {
            return Err(LabError::Io {
                context: format!("kill {}", self.name),
                source: std::io::Error::other("no child handle"),
            });
        };
        let st = child
            .wait()
            .map_err(io_ctx(format!("wait for {}", self.name)))?;
        self.status = Some(st);
        Ok(st)
    }
}

impl Drop for LabProcess {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.kill();
        }
    }
}
impl Lab {
    // ----- processes ---------------------------------------------------------------------

    /// Starts `program args...` inside lab namespace `ns` (via `ip netns exec`, which also
    /// gives it the namespace's /sys), with extra environment `env`. Output goes to a log
    /// file under `<dir>/logs/`.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`], or [`LabError::Io`] if it cannot be started.
    pub fn spawn<S: AsRef<OsStr>>(
        &self,
        ns: &str,
        program: impl AsRef<OsStr>,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Result<LabProcess> {
        let full = self.ns_name(ns)?;
        let program = program.as_ref();
        let base = Path::new(program)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "proc".into());
        let seq = self.log_seq.fetch_add(1, Ordering::SeqCst);
        let log = self
            .dir
            .join("logs")
            .join(format!("{seq:03}-{ns}-{base}.log"));
        let args: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
        LabProcess::spawn(&full, &base, program, &args, env, &log)
    }

    /// Runs `program args...` to completion inside `ns`; fails on a non-zero exit.
    ///
    /// # Errors
    /// [`LabError::Command`] with its stderr on a non-zero exit.
    pub fn exec<S: AsRef<OsStr>>(
        &self,
        ns: &str,
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> Result<Output> {
        let full = self.ns_name(ns)?;
        run(ip_binary(), &netns_exec_argv(&full, program.as_ref(), args))
    }

    /// Like [`Lab::exec`] but returns the output whatever the exit status.
    ///
    /// # Errors
    /// [`LabError::Io`] when the command cannot be started.
    pub fn exec_unchecked<S: AsRef<OsStr>>(
        &self,
        ns: &str,
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> Result<Output> {
        let full = self.ns_name(ns)?;
        Command::new(ip_binary())
            .args(netns_exec_argv(&full, program.as_ref(), args))
            .stdin(Stdio::null())
            .output()
            .map_err(io_ctx(format!(
                "run {} in {ns}",
                program.as_ref().to_string_lossy()
            )))
    }

    /// Runs `f` on a thread that entered lab namespace `ns` and returns its result (a panic
    /// in `f` is re-raised). Use it to talk to the API "from node-b" (e.g. build a tokio
    /// runtime with a kube client inside `f`) or to bind sockets in a namespace.
    ///
    /// # Errors
    /// [`LabError::UnknownNamespace`], or [`LabError::Io`] if the namespace cannot be entered.
    pub fn in_netns<T: Send>(&self, ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
        netns::run_in_netns(&self.netns_path(ns)?, f)
    }
}

/// `netns exec FULL PROGRAM ARGS...`: the arguments of `ip` that run `program` in the
/// namespace named `full`.
fn netns_exec_argv<'a, S: AsRef<OsStr>>(
    full: &'a str,
    program: &'a OsStr,
    args: &'a [S],
) -> Vec<&'a OsStr> {
    let mut all: Vec<&OsStr> = vec![OsStr::new("netns"), OsStr::new("exec"), OsStr::new(full)];
    all.push(program);
    all.extend(args.iter().map(AsRef::as_ref));
    all
}
