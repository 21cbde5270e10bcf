//! Command output (`vipd manifest`, `preflight`, `status`, `drain`): a reader that goes away
//! (`vipd manifest rbac | head -1`) is not an error and never a panic; a write that fails for
//! another reason (a full disk under `vipd manifest rbac > file`) fails the command.

use std::process::{Command, Stdio};

#[test]
fn a_closed_pipe_is_not_an_error_and_a_full_disk_is() {
    let vipd = env!("CARGO_BIN_EXE_vipd");
    let mut child = Command::new(vipd)
        .args(["manifest", "rbac"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before vipd writes (println! panicked here: exit 101).
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");

    let full = std::fs::File::options()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(vipd)
        .args(["manifest", "rbac"])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write the output"), "{stderr}");
}
