//! Attacks of issue 15 that need the whole binary, reproduced as the attacker ran them, with
//! the fix shown. The rest of the threat model is tested beside the code it concerns (see
//! docs/security.md, "How each claim is tested").

use std::path::PathBuf;
use std::process::Command;

/// Whether this test process runs as root (creating a file owned by another user, and running a
/// process as an unprivileged one, need it).
fn running_as_root() -> bool {
    let output = Command::new("id").arg("-u").output().expect("id runs");
    String::from_utf8_lossy(&output.stdout).trim() == "0"
}

/// A file (or empty directory) removed on drop, even when the test fails.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Issue 15, item 3: "Any user who creates one empty file /dev/shm/rampkv-99999-x stops every
/// non-root rampkv process from starting (even --transport tcp): the stale-file cleanup passes
/// EPERM up." Here the file belongs to `nobody` (mode 0600, pid beyond `pid_max`, so never
/// alive), and the benchmark runs as a third user (uid 1, `daemon`), which may not remove it.
/// Before the fix this printed `i/o on region /dev/shm: Operation not permitted` and exited 2.
#[test]
fn another_users_file_in_dev_shm_does_not_stop_an_unprivileged_start() {
    if !running_as_root() {
        // Making a file of another user takes root; the skip logic itself is unit-tested in
        // rampkv-fabric (shm::tests::cleanup_skips_files_of_other_users_and_files_it_cannot_remove).
        println!("not root: cannot create another user's file; see the fabric's unit test");
        return;
    }
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    let never_alive = pid_max + 1;
    let path = PathBuf::from(format!("/dev/shm/rampkv-{never_alive}-x-security-test-{}", std::process::id()));
    std::fs::write(&path, b"").unwrap();
    let _guard = RemoveOnDrop(path.clone());
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

    // A copy uid 1 can run wherever the build lives (a checkout under /root is closed to it).
    let directory = std::env::temp_dir().join(format!("rampkv-security-test-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let _directory_guard = RemoveOnDrop(directory.clone());
    let binary = directory.join("rampkv");
    std::fs::copy(env!("CARGO_BIN_EXE_rampkv"), &binary).unwrap();
    let _binary_guard = RemoveOnDrop(binary.clone());
    for path in [&directory, &binary] {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let output = Command::new("setpriv")
        .args(["--reuid=1", "--regid=1", "--clear-groups"])
        .arg(&binary)
        .args(["bench", "--duration", "300ms", "--keys", "100", "--transport", "writepoll", "--seed", "1"])
        .current_dir("/")
        .output()
        .expect("setpriv runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the benchmark did not start as uid 1: {stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("txn/s"), "{stderr}");
    assert!(path.exists(), "another user's file is not ours to remove");
}
