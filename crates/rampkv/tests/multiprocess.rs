//! The one-sided transports between processes, as a user deploys them: `rampkv server`
//! processes with a ring or RF-RPC front end, a cluster file listing their control addresses,
//! and `rampkv bench --cluster` in another process mapping the servers' regions from /dev/shm.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// A `rampkv server` process with a one-sided front end, killed on drop.
struct ServerProcess {
    child: Child,
    address: String,
    control: String,
}

impl ServerProcess {
    /// Starts a server on free ports with `front_flag` (`--ring-listen` or `--rfrpc-listen`)
    /// and reads the addresses it reports.
    fn start(front_flag: &str, extra: &[&str]) -> ServerProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["server", "--listen", "127.0.0.1:0", front_flag, "127.0.0.1:0"])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("rampkv server starts");
        // Owned by the guard from here on, so a failed assertion below still kills it.
        let mut process = ServerProcess { child, address: String::new(), control: String::new() };
        let mut line = String::new();
        let stderr = process.child.stderr.take().expect("piped");
        BufReader::new(stderr).read_line(&mut line).expect("a start-up line");
        // "rampkv server listening on A; ring control on B"
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(line.starts_with("rampkv server listening on") && words.len() == 9, "{line}");
        process.address = words[4].trim_end_matches(';').to_string();
        process.control = words[8].to_string();
        process
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_cluster_file(path: &Path, key: &str, servers: &[ServerProcess]) {
    let mut text = String::new();
    for server in servers {
        text.push_str(&format!("[[servers]]\naddress = \"{}\"\n{key} = \"{}\"\n", server.address, server.control));
    }
    std::fs::write(path, text).expect("cluster file written");
}

fn bench(cluster_file: &Path, transport: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rampkv"))
        .args(["bench", "--transport", transport, "--duration", "1s", "--check", "--clients", "4"])
        .args(["--read-ratio", "0.8", "--keys", "100", "--seed", "7", "--cluster"])
        .arg(cluster_file)
        .output()
        .expect("rampkv bench runs")
}

/// Asserts the run succeeded, committed transactions and the checker found no anomaly (clean,
/// exit status 0, or inconclusive, 3: one client thread sends every request over per-server
/// FIFO connections, which shows no race; see docs/history.md, "Evidence and verdict"); returns its
/// standard output. The verdict is the last "read atomicity" line's: with the evidence probe
/// (which writes the same cluster's keys `k0`..`k15`), the run's.
fn assert_clean(output: &Output, transport: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stdout.lines().rev().find(|line| line.contains("read atomicity")).unwrap_or_default();
    let verdict_matches = match output.status.code() {
        Some(0) => last.contains(": clean"),
        Some(3) => last.contains(": INCONCLUSIVE"),
        _ => false,
    };
    assert!(verdict_matches, "{transport}: {stdout}\n{stderr}");
    assert!(stdout.contains("no garbage, no fractured reads"), "{transport}: {stdout}");
    assert!(stdout.contains(&format!("over {transport},")), "{transport}: {stdout}");
    assert!(stdout.contains(" 2 servers"), "{transport}: the cluster file's server count is reported: {stdout}");
    let committed: u64 = stdout
        .lines()
        .find(|line| line.contains("transactions in"))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    assert!(committed > 100, "{transport}: only {committed} transactions: {stdout}");
    stdout
}

/// Two fresh server processes with `front_flag`, and their cluster file listing `key`
/// addresses. A checked run needs servers that hold no data from an earlier run.
fn fresh_cluster(front_flag: &str, key: &str, extra: &[&str]) -> ([ServerProcess; 2], tempfile::TempDir) {
    let servers = [ServerProcess::start(front_flag, extra), ServerProcess::start(front_flag, extra)];
    let dir = tempfile::tempdir().expect("temporary directory");
    write_cluster_file(&dir.path().join("cluster.toml"), key, &servers);
    (servers, dir)
}

#[test]
fn ring_transports_reach_server_processes_through_the_cluster_file() {
    for transport in ["writepoll", "sendrecv", "onesided", "tcp"] {
        let (_servers, dir) = fresh_cluster("--ring-listen", "ring", &[]);
        let cluster_file = dir.path().join("cluster.toml");
        let stdout = assert_clean(&bench(&cluster_file, transport), transport);
        if transport == "onesided" {
            // GET* reads the server processes' item slots: most round-1 reads come from slots.
            let line = stdout.lines().find(|line| line.trim_start().starts_with("GET*:")).expect("a GET* line");
            let from_slots: u64 =
                line.split_whitespace().nth(1).and_then(|count| count.parse().ok()).expect("a slot count");
            assert!(from_slots > 0, "{line}");
        }
        if transport == "writepoll" {
            // A second checked run against the same servers reads the first run's versions,
            // which its history cannot vouch for: it says so instead of passing or crying wolf.
            let again = bench(&cluster_file, transport);
            assert!(!again.status.success());
            let stdout = String::from_utf8_lossy(&again.stdout);
            assert!(stdout.contains("NOT CHECKABLE") && stdout.contains("fresh cluster"), "{stdout}");
        }
    }
    // An RF-RPC client needs `rfrpc` addresses, which a ring cluster file does not have.
    let (_servers, dir) = fresh_cluster("--ring-listen", "ring", &[]);
    let refused = bench(&dir.path().join("cluster.toml"), "rfrpc");
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("has no `rfrpc` control address") && message.contains("--rfrpc-listen"), "{message}");
}

#[test]
fn rfrpc_reaches_server_processes_through_the_cluster_file() {
    let (_servers, dir) = fresh_cluster("--rfrpc-listen", "rfrpc", &[]);
    let cluster_file = dir.path().join("cluster.toml");
    assert_clean(&bench(&cluster_file, "rfrpc"), "rfrpc");
    let refused = bench(&cluster_file, "writepoll");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("has no `ring` control address"));
}

#[test]
fn onesided_without_item_slots_reads_over_get_plus() {
    let (_servers, dir) = fresh_cluster("--ring-listen", "ring", &["--item-slots", "0"]);
    let cluster_file = dir.path().join("cluster.toml");
    let stdout = assert_clean(&bench(&cluster_file, "onesided"), "onesided");
    let line = stdout.lines().find(|line| line.trim_start().starts_with("GET*:")).expect("a GET* line");
    assert!(line.trim_start().starts_with("GET*: 0 of"), "no slots, no slot reads: {line}");
}

#[test]
fn bad_front_flags_are_refused_with_the_reason() {
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_rampkv")).args(args).output().expect("runs");
    let both =
        run(&["server", "--listen", "127.0.0.1:0", "--ring-listen", "127.0.0.1:0", "--rfrpc-listen", "127.0.0.1:0"]);
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
    let slots = run(&["server", "--listen", "127.0.0.1:0", "--ring-listen", "127.0.0.1:0", "--item-slot-bytes", "7"]);
    assert!(!slots.status.success());
    assert!(String::from_utf8_lossy(&slots.stderr).contains("item slot bytes must be a multiple of 8"));
    let front = run(&["local", "--front", "carrier-pigeon"]);
    assert!(!front.status.success());
    assert!(String::from_utf8_lossy(&front.stderr).contains("possible values: ring, rfrpc, none"));
}

fn os(text: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(text)
}

/// Writes `bytes` as a secret file of mode 0600 in `dir`.
fn secret_file(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("secret written");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("mode set");
    path
}

fn bench_with(cluster_file: &Path, transport: &str, extra: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rampkv"))
        .args(["bench", "--transport", transport, "--duration", "1s", "--check", "--clients", "4"])
        .args(["--read-ratio", "0.8", "--keys", "100", "--seed", "7", "--cluster"])
        .arg(cluster_file)
        .args(extra)
        .output()
        .expect("rampkv bench runs")
}

/// Issue 15, item 5: "the binary port, ring and RF-RPC control ports ... accept anyone". Two
/// server processes with `--secret-file`: `bench --cluster` with the same file works over TCP
/// and over the rings (writepoll) and `put`/`get` too; without the file, or with another secret,
/// every client is refused with a clear error at both the binary and the control ports, and
/// learns nothing (no transaction runs).
#[test]
fn servers_with_a_secret_serve_only_clients_that_prove_it() {
    let keys = tempfile::tempdir().expect("temporary directory");
    let secret = secret_file(keys.path(), "secret", &[0x5Au8; 48]);
    let wrong = secret_file(keys.path(), "wrong", &[0xA5u8; 48]);
    let secret_flag = ["--secret-file", secret.to_str().expect("utf-8 path")];
    for transport in ["tcp", "writepoll"] {
        let (_servers, dir) = fresh_cluster("--ring-listen", "ring", &secret_flag);
        let cluster_file = dir.path().join("cluster.toml");

        let without = bench_with(&cluster_file, transport, &[]);
        assert_eq!(without.status.code(), Some(2), "{transport}: {without:?}");
        let message = String::from_utf8_lossy(&without.stderr);
        assert!(message.contains("authentication required") && message.contains("--secret-file"), "{message}");
        assert!(!String::from_utf8_lossy(&without.stdout).contains("transactions in"), "learns nothing");

        let flag = std::ffi::OsStr::new("--secret-file");
        let with_wrong = bench_with(&cluster_file, transport, &[flag, wrong.as_os_str()]);
        assert_eq!(with_wrong.status.code(), Some(2), "{transport}: {with_wrong:?}");
        let message = String::from_utf8_lossy(&with_wrong.stderr);
        assert!(message.contains("wrong proof: the client's secret is not the server's"), "{transport}: {message}");

        assert_clean(&bench_with(&cluster_file, transport, &[flag, secret.as_os_str()]), transport);
    }

    let (_servers, dir) = fresh_cluster("--ring-listen", "ring", &secret_flag);
    let cluster_file = dir.path().join("cluster.toml");
    let rampkv = |args: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_rampkv")).args(args).arg("--cluster").arg(&cluster_file).output().unwrap()
    };
    let put = rampkv(&[os("put"), os("k=v"), os("--secret-file"), secret.as_os_str()]);
    assert!(put.status.success(), "{put:?}");
    let get = rampkv(&[os("get"), os("k"), os("--secret-file"), secret.as_os_str()]);
    assert_eq!(String::from_utf8_lossy(&get.stdout), "k=v\n", "{get:?}");
    let refused = rampkv(&[os("get"), os("k")]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(refused.stdout.is_empty(), "learns nothing: {refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("authentication required"), "{refused:?}");
}

/// A secret file that others can read, or that is too short, stops the command with a clear
/// error before anything listens or connects; and protected mode: a server without a secret
/// refuses an address other than loopback (checked without binding one).
#[test]
fn unfit_secret_files_and_open_servers_without_a_secret_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temporary directory");
    let readable = secret_file(dir.path(), "readable", &[1u8; 32]);
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let short = secret_file(dir.path(), "short", &[1u8; 31]);
    let run = |args: &[&std::ffi::OsStr]| Command::new(env!("CARGO_BIN_EXE_rampkv")).args(args).output().unwrap();
    for (file, expected) in [(&readable, "chmod 600"), (&short, "at least 32")] {
        for command in [&["server", "--listen", "127.0.0.1:0"][..], &["get", "k", "--cluster", "/nonexistent"][..]] {
            let mut args: Vec<&std::ffi::OsStr> = command.iter().copied().map(os).collect();
            args.extend([os("--secret-file"), file.as_os_str()]);
            let output = run(&args);
            assert_eq!(output.status.code(), Some(2), "{output:?}");
            let message = String::from_utf8_lossy(&output.stderr);
            assert!(message.contains("--secret-file") && message.contains(expected), "{message}");
        }
    }
    for listen in ["0.0.0.0:0", "[::]:0", "192.0.2.1:7001"] {
        let output = run(&[os("server"), os("--listen"), os(listen)]);
        assert_eq!(output.status.code(), Some(2), "{listen}: {output:?}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains("protected mode") && message.contains("--insecure-no-secret"), "{message}");
    }
    // A front end's control port counts as much as the data port.
    let output = run(&[os("server"), os("--listen"), os("127.0.0.1:0"), os("--ring-listen"), os("0.0.0.0:0")]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("protected mode"), "{output:?}");
}
