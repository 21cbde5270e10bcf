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
