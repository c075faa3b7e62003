//! SCAN, KEYS and DBSIZE as Redis users reach them (issue 31): redis-py's `scan_iter`, `scan`,
//! `keys`, `dbsize` and `info("keyspace")` (`scripts/resp_keyspace.py`), `redis-cli --scan`,
//! and reply shapes compared byte for byte with a real redis-server 7.0 holding the same keys.
//! The tools come from Debian's `redis-tools` and `redis-server` and pip's `redis`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rampkv::cluster::Cluster;
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::server::{ServerConfig, ServerGroup};

fn start(servers: usize, in_process: bool) -> (ServerGroup, Gateway) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); servers]).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let in_process = in_process.then(|| InProcessServers { groups: vec![Arc::clone(group.servers())] });
    let config = GatewayConfig { sessions: 8, in_process, ..GatewayConfig::new(localhost) };
    let gateway = Gateway::spawn(&cluster, &config).unwrap();
    (group, gateway)
}

fn run(tool: &str, args: &[&str]) -> String {
    let output = Command::new("timeout")
        .arg("120")
        .arg(tool)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {tool}: {error}"));
    assert_ne!(
        output.status.code(),
        Some(127),
        "`{tool}` is not installed: apt-get install redis-tools, pip install redis"
    );
    assert!(output.status.success(), "{tool} {args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Sends one request (words as bulk strings) and reads until `expected_bytes` or a timeout.
fn raw(port: u16, words: &[&str]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut request = format!("*{}\r\n", words.len());
    for word in words {
        request.push_str(&format!("${}\r\n{word}\r\n", word.len()));
    }
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let mut buffer = [0u8; 65536];
    while let Ok(read) = stream.read(&mut buffer) {
        if read == 0 {
            break;
        }
        reply.extend_from_slice(&buffer[..read]);
    }
    String::from_utf8_lossy(&reply).into_owned()
}

#[test]
fn redis_py_scans_lists_and_counts_keys() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/resp_keyspace.py");
    for in_process in [false, true] {
        let (_group, gateway) = start(3, in_process);
        let port = gateway.address().port().to_string();
        let stdout = run("python3", &[script, &port]);
        assert!(stdout.contains("resp_keyspace.py: every check passed"), "{stdout}");
    }
}

#[test]
fn redis_cli_scans_and_replies_have_redis_s_shapes() {
    let (_group, gateway) = start(4, false);
    let port = gateway.address().port();
    let redis_port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut redis = Command::new("redis-server")
        .args(["--port", &redis_port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs (apt-get install redis-server)");
    for _ in 0..500 {
        if TcpStream::connect(("127.0.0.1", redis_port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let names: Vec<String> = (0..120).map(|index| format!("cli:{index}")).collect();
    for target in [port, redis_port] {
        let target = target.to_string();
        let mut args = vec!["-p", &target, "MSET"];
        for name in &names {
            args.extend([name.as_str(), "v"]);
        }
        assert_eq!(run("redis-cli", &args), "OK\n");
    }
    let expected: BTreeSet<String> = names.iter().cloned().collect();
    let port_text = port.to_string();
    let scanned = run("redis-cli", &["-p", &port_text, "--scan"]);
    assert_eq!(scanned.lines().map(str::to_string).collect::<BTreeSet<_>>(), expected);
    assert_eq!(scanned.lines().count(), names.len(), "each key once");
    let matched = run("redis-cli", &["-p", &port_text, "--scan", "--pattern", "cli:1?"]); // 7.0 has no --count
    let ten_to_nineteen: BTreeSet<String> = (10..20).map(|index| format!("cli:{index}")).collect();
    assert_eq!(matched.lines().map(str::to_string).collect::<BTreeSet<_>>(), ten_to_nineteen);

    // Replies Redis and rampkv give alike (same keys, so the same count and an empty match).
    for words in [
        &["DBSIZE"][..],
        &["KEYS", "nosuch*"],
        &["KEYS"],
        &["SCAN"],
        &["SCAN", "abc"],
        &["SCAN", "18446744073709551616"],
        &["SCAN", "0", "COUNT", "0"],
        &["SCAN", "0", "COUNT", "x"],
        &["SCAN", "0", "MATCH"],
        &["SCAN", "0", "foo", "bar"],
        &["SCAN", "0", "MATCH", "nosuch*", "COUNT", "1000"],
        &["SCAN", "0", "TYPE", "list", "COUNT", "1000"],
    ] {
        assert_eq!(raw(port, words), raw(redis_port, words), "{words:?}");
    }
    // KEYS * and SCAN 0 COUNT 1000 hold the same keys, in another order.
    let keys_reply = |port: u16| {
        let reply = raw(port, &["KEYS", "*"]);
        let mut lines: Vec<String> = reply.lines().skip(1).map(str::to_string).collect();
        lines.sort();
        lines
    };
    assert_eq!(keys_reply(port), keys_reply(redis_port));
    let info = raw(port, &["INFO", "keyspace"]);
    assert!(info.contains("db0:keys=120,expires=0,avg_ttl=0\r\n"), "{info}");
    let _ = redis.kill();
    let _ = redis.wait();
}
