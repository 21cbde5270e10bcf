//! Guards for tests that change network state themselves (outside `Lab`): they run in a
//! thread moved into a private network namespace, and check that first.

/// The namespace `path` (a `/proc/.../ns/net` link) points at.
pub fn ns_of(path: &str) -> String {
    std::fs::read_link(path)
        .unwrap_or_else(|e| panic!("readlink {path}: {e}"))
        .to_string_lossy()
        .into_owned()
}

/// Panics unless this thread is in a namespace other than the process's main thread's (the
/// namespace the test binary started in) and, where readable, other than PID 1's.
pub fn assert_private_netns() {
    let mine = ns_of("/proc/thread-self/ns/net");
    let process = ns_of("/proc/self/ns/net");
    assert_ne!(
        mine, process,
        "refusing to touch the test process's own network namespace"
    );
    if let Ok(init) = std::fs::read_link("/proc/1/ns/net") {
        assert_ne!(
            mine,
            init.to_string_lossy(),
            "refusing to touch the root network namespace"
        );
    }
}

/// Moves the calling thread into a new, private network namespace (checked).
pub fn enter_private_netns() {
    let before = ns_of("/proc/thread-self/ns/net");
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .expect("unshare(CLONE_NEWNET) on the test thread");
    assert_ne!(
        ns_of("/proc/thread-self/ns/net"),
        before,
        "unshare did not change the netns"
    );
    assert_private_netns();
}

/// Runs `ip ARGS` inside this thread's private namespace; panics on failure.
pub fn ip(args: &str) {
    assert_private_netns();
    let out = std::process::Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip {args}`: {e}"));
    assert!(
        out.status.success(),
        "`ip {args}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `true` when running as root; otherwise prints `SKIPPED <what>` and returns `false` when
/// `VIPD_SKIP_LAB=1`, and panics with the reason when not (a kernel test run without root
/// never passes silently).
pub fn root_or_skip(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("VIPD_SKIP_LAB").as_deref() == Ok("1") {
        println!("SKIPPED: {what} needs root (VIPD_SKIP_LAB=1)");
        return false;
    }
    panic!("{what} needs root (it creates network namespaces); set VIPD_SKIP_LAB=1 to skip");
}
