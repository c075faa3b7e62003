//! The expiry commands that rewrite a key's current version (issue 31): EXPIRE, PEXPIRE,
//! EXPIREAT, PEXPIREAT with NX|XX|GT|LT, PERSIST, GETEX, SET KEEPTTL and SET NX|XX|GET with an
//! expiry, each a single-key update at the key's primary.
//! - redis-py's own calls (`scripts/resp_expire.py`) and redis-cli against the command the docs
//!   give, `rampkv local --resp-port`, including a key that really expires after EXPIRE;
//! - every reply Redis also gives compared byte for byte with a real redis-server 7.0's (the
//!   results, TTLs at second precision, and the error texts in Redis's order of checks);
//! - inside MULTI each is refused with why, and the transaction with it.
//!
//! The tools come from Debian's `redis-tools` and `redis-server` and pip's `redis`; a missing
//! tool fails the test with a message saying so.

mod resp_common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv::cluster::Cluster;
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::server::{ServerConfig, ServerGroup};
use resp_common::{ask, connect, run_tool, RedisServer};

/// How long a key given PEXPIRE 1500 may outlive its deadline before the test fails.
const EXPIRY_WAIT_MAX: Duration = Duration::from_secs(5);

/// `rampkv local --resp-port PORT --cluster-file FILE`, killed and reaped on drop.
struct Local {
    child: Child,
    port: u16,
    _directory: tempfile::TempDir,
}

impl Local {
    fn start() -> Local {
        let directory = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cluster_file = directory.path().join("cluster.toml");
        let child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["local", "--resp-port", &port.to_string(), "--cluster-file"])
            .arg(&cluster_file)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let local = Local { child, port, _directory: directory };
        for _ in 0..500 {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) {
                let mut stream = stream;
                stream.set_read_timeout(Some(resp_common::SOCKET_TIMEOUT)).unwrap();
                if ask(&mut stream, &["PING"]) == "+PONG\r\n" {
                    return local;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("rampkv local answered no PING on port {port} within 5 s");
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-cli -p PORT args...`: its standard output, asserting it succeeded.
fn cli(port: u16, args: &[&str]) -> String {
    let port = port.to_string();
    let mut all = vec!["-p", &port];
    all.extend_from_slice(args);
    let output = run_tool("redis-cli", &all, None);
    assert!(output.status.success(), "redis-cli {args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn redis_py_and_redis_cli_expire_keys_against_rampkv_local() {
    let local = Local::start();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/resp_expire.py");
    let output = run_tool("python3", &[script, &local.port.to_string()], None);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("resp_expire.py: every check passed"), "{stdout}");

    let port = local.port;
    assert_eq!(cli(port, &["SET", "k", "v"]), "OK\n");
    assert_eq!(cli(port, &["EXPIRE", "k", "100"]), "1\n");
    assert_eq!(cli(port, &["TTL", "k"]), "100\n");
    assert_eq!(cli(port, &["EXPIRE", "k", "200", "NX"]), "0\n");
    assert_eq!(cli(port, &["PERSIST", "k"]), "1\n");
    assert_eq!(cli(port, &["TTL", "k"]), "-1\n");
    assert_eq!(cli(port, &["GETEX", "k", "EX", "50"]), "v\n");
    assert_eq!(cli(port, &["TTL", "k"]), "50\n");
    assert_eq!(cli(port, &["SET", "k", "w", "KEEPTTL"]), "OK\n");
    assert_eq!(cli(port, &["TTL", "k"]), "50\n");
    assert_eq!(cli(port, &["SET", "n", "1", "NX", "EX", "10"]), "OK\n");
    assert_eq!(cli(port, &["SET", "n", "2", "NX", "EX", "10"]), "\n", "(nil), as redis-cli prints it");
    assert_eq!(cli(port, &["TTL", "n"]), "10\n");
    assert_eq!(
        cli(port, &["EXPIRE", "k", "1", "GT", "LT"]),
        "ERR GT and LT options at the same time are not compatible\n\n"
    );

    // A key really expires after PEXPIRE: present until its deadline, missing soon after.
    assert_eq!(cli(port, &["SET", "soon", "v"]), "OK\n");
    let started = Instant::now();
    assert_eq!(cli(port, &["PEXPIRE", "soon", "1500"]), "1\n");
    assert_eq!(cli(port, &["GET", "soon"]), "v\n", "present before its deadline");
    let mut stream = connect(port);
    while ask(&mut stream, &["GET", "soon"]) != "$-1\r\n" {
        assert!(started.elapsed() < EXPIRY_WAIT_MAX, "the key outlived its 1.5 s deadline by seconds");
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(1_400), "expired after {elapsed:?}, before its 1.5 s");
    assert_eq!(cli(port, &["TTL", "soon"]), "-2\n");
    assert_eq!(cli(port, &["EXISTS", "soon"]), "0\n");
}

/// A gateway calling its servers' cores in this process, as `rampkv local` does, and the
/// servers it reaches.
struct Stack {
    _group: ServerGroup,
    gateway: Gateway,
}

impl Stack {
    fn start(servers: usize) -> Stack {
        let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); servers]).unwrap();
        let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
        let in_process = Some(InProcessServers { groups: vec![Arc::clone(group.servers())] });
        let config = GatewayConfig { sessions: 8, in_process, ..GatewayConfig::new(localhost) };
        let gateway = Gateway::spawn(&cluster, &config).unwrap();
        Stack { _group: group, gateway }
    }

    fn connect(&self) -> TcpStream {
        connect(self.gateway.address().port())
    }
}

/// Every reply Redis also gives, byte for byte the same as a real redis-server 7.0's. TTLs are
/// compared in seconds (TTL rounds, and both run the sessions within the same second of a
/// 100 s deadline); deadlines in the past delete the key in both.
#[test]
fn expiry_command_replies_are_byte_for_byte_redis_s() {
    let stack = Stack::start(3);
    let redis = RedisServer::start();
    // A deadline in whole Unix seconds, taken early in a second: TTL rounds the ms left to the
    // nearest second, so both servers answer 1000 (not one 999 and the other 1000) as long as the
    // sessions run within 400 ms of it.
    let since_epoch = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    while since_epoch().subsec_millis() >= 100 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let far = (since_epoch().as_secs() + 1_000).to_string();
    let far_ms = format!("{far}000");
    let sessions: &[&[&[&str]]] = &[
        &[
            &["SET", "k", "v"],
            &["EXPIRE", "k", "100"],
            &["TTL", "k"],
            &["EXPIRE", "k", "200", "NX"],
            &["EXPIRE", "k", "200", "xx"],
            &["TTL", "k"],
            &["EXPIRE", "k", "100", "GT"],
            &["EXPIRE", "k", "300", "gt"],
            &["TTL", "k"],
            &["EXPIRE", "k", "400", "LT"],
            &["EXPIRE", "k", "100", "LT", "XX"],
            &["TTL", "k"],
            &["EXPIRE", "k", "500", "XX", "GT"],
            &["TTL", "k"],
            &["PERSIST", "k"],
            &["PERSIST", "k"],
            &["TTL", "k"],
            &["EXPIRE", "k", "10", "XX"],
            &["EXPIRE", "k", "10", "GT"],
            &["EXPIRE", "k", "100", "LT"],
            &["TTL", "k"],
            &["PERSIST", "k"],
            &["EXPIRE", "k", "100", "NX"],
            &["TTL", "k"],
            &["PEXPIRE", "k", "100000"],
            &["TTL", "k"],
            &["EXPIREAT", "k", &far],
            &["TTL", "k"],
            &["PEXPIREAT", "k", &far_ms],
            &["TTL", "k"],
            &["GET", "k"],
            &["EXPIRE", "missing", "10"],
            &["PERSIST", "missing"],
            &["EXISTS", "missing"],
            &["EXPIRE", "k", "0"],
            &["EXISTS", "k"],
            &["SET", "k", "v"],
            &["PEXPIRE", "k", "-5"],
            &["GET", "k"],
            &["SET", "k", "v"],
            &["EXPIREAT", "k", "1"],
            &["TTL", "k"],
            &["SET", "k", "v"],
            &["EXPIRE", "k", "10", "LT"],
            &["EXPIRE", "k", "-1", "GT"],
            &["EXPIRE", "k", "-1", "LT"],
            &["EXISTS", "k"],
        ],
        &[
            // GETEX checks its number only once it found the key, in Redis; rampkv checks
            // every command before it runs (docs/resp.md, "Expiry"): present, both refuse.
            &["SET", "k", "v"],
            &["EXPIRE", "k", "10", "foo"],
            &["EXPIRE", "k", "ten", "foo"],
            &["EXPIRE", "k", "10", "NX", "XX"],
            &["EXPIRE", "k", "10", "GT", "NX"],
            &["EXPIRE", "k", "10", "NX", "LT"],
            &["EXPIRE", "k", "10", "GT", "LT"],
            &["EXPIRE", "k", "ten"],
            &["PEXPIRE", "k", "1.5"],
            &["EXPIRE", "k", "9223372036854776"],
            &["EXPIREAT", "k", "-9223372036854776"],
            &["PEXPIRE", "k", "9223372036854775000"],
            &["EXPIRE", "k"],
            &["PEXPIREAT"],
            &["PERSIST"],
            &["PERSIST", "a", "b"],
            &["GETEX"],
            &["GETEX", "k", "EX"],
            &["GETEX", "k", "EX", "1", "PX", "2"],
            &["GETEX", "k", "PERSIST", "EX", "1"],
            &["GETEX", "k", "EX", "1", "PERSIST"],
            &["GETEX", "k", "NX"],
            &["GETEX", "k", "EX", "0"],
            &["GETEX", "k", "PX", "x"],
            &["SET", "k", "v", "NX", "KEEPTTL", "EX", "1"],
            &["SET", "k", "v", "KEEPTTL", "PX", "1"],
            &["SET", "k", "v", "NX", "EX", "0"],
            &["SET", "k", "v", "XX", "PX", "-1"],
        ],
        &[
            &["SET", "g", "v"],
            &["GETEX", "g"],
            &["TTL", "g"],
            &["GETEX", "g", "EX", "100"],
            &["TTL", "g"],
            &["GETEX", "g", "PX", "50000"],
            &["TTL", "g"],
            &["GETEX", "g", "EXAT", &far],
            &["TTL", "g"],
            &["GETEX", "g", "PXAT", &far_ms],
            &["TTL", "g"],
            &["GETEX", "g", "PERSIST"],
            &["TTL", "g"],
            &["GETEX", "missing", "EX", "10"],
            &["GETEX", "g", "EXAT", "1"],
            &["EXISTS", "g"],
        ],
        &[
            &["SET", "s", "1", "EX", "100"],
            &["SET", "s", "2", "KEEPTTL"],
            &["TTL", "s"],
            &["GET", "s"],
            &["SET", "s", "3", "XX", "KEEPTTL", "GET"],
            &["TTL", "s"],
            &["INCR", "s"],
            &["TTL", "s"],
            &["APPEND", "s", "0"],
            &["TTL", "s"],
            &["SET", "s", "5"],
            &["TTL", "s"],
            &["SET", "n", "1", "NX", "EX", "100"],
            &["SET", "n", "2", "NX", "EX", "100"],
            &["TTL", "n"],
            &["SET", "n", "3", "XX", "PX", "50000"],
            &["TTL", "n"],
            &["SET", "n", "4", "GET", "EX", "200"],
            &["TTL", "n"],
            &["SET", "n", "5", "NX", "GET", "EX", "10"],
            &["SET", "none", "1", "XX", "EX", "10"],
            &["EXISTS", "none"],
            &["SET", "n", "6", "XX", "EXAT", "1"],
            &["EXISTS", "n"],
            &["SET", "t", "1", "KEEPTTL"],
            &["TTL", "t"],
        ],
        &[
            &["HELLO", "3"],
            &["SET", "r", "v"],
            &["EXPIRE", "r", "100"],
            &["EXPIRE", "r", "100", "NX"],
            &["TTL", "r"],
            &["GETEX", "r", "PERSIST"],
            &["GETEX", "missing"],
            &["PERSIST", "r"],
            &["SET", "r", "w", "NX", "EX", "10"],
            &["SET", "r", "w", "XX", "KEEPTTL", "GET"],
        ],
    ];
    for (index, session) in sessions.iter().enumerate() {
        let (mut ours, mut theirs) = (stack.connect(), connect(redis.port));
        for command in *session {
            let (mine, redis_s) = (ask(&mut ours, command), ask(&mut theirs, command));
            if command[0] != "HELLO" {
                assert_eq!(mine, redis_s, "session {index}: {command:?}");
            }
        }
    }
}

/// Inside MULTI each of them is refused as it is queued (it reads its key and writes it; a
/// MULTI/EXEC is one read-only or write-only RAMP transaction), and the transaction with it;
/// SET with an expiry alone still queues (a write).
#[test]
fn expiry_updates_inside_multi_are_refused_with_why() {
    let stack = Stack::start(2);
    let mut stream = stack.connect();
    let refused: &[(&[&str], &str)] = &[
        (&["EXPIRE", "k", "10"], "EXPIRE"),
        (&["PEXPIRE", "k", "10"], "PEXPIRE"),
        (&["EXPIREAT", "k", "10"], "EXPIREAT"),
        (&["PEXPIREAT", "k", "10"], "PEXPIREAT"),
        (&["PERSIST", "k"], "PERSIST"),
        (&["GETEX", "k", "EX", "10"], "GETEX"),
        (&["SET", "k", "v", "KEEPTTL"], "SET"),
        (&["SET", "k", "v", "NX", "EX", "10"], "SET"),
    ];
    for (command, name) in refused {
        assert_eq!(ask(&mut stream, &["MULTI"]), "+OK\r\n");
        assert_eq!(ask(&mut stream, &["SET", "k", "1", "EX", "100"]), "+QUEUED\r\n");
        let reply = ask(&mut stream, command);
        let expected = format!("-ERR {name} inside MULTI is not supported by rampkv: it reads its key and writes it");
        assert!(reply.starts_with(&expected), "{command:?}: {reply}");
        assert!(reply.contains("read-only or write-only"), "{reply}");
        assert_eq!(ask(&mut stream, &["EXEC"]), "-EXECABORT Transaction discarded because of previous errors.\r\n");
        assert_eq!(ask(&mut stream, &["EXISTS", "k"]), ":0\r\n", "{command:?}: nothing ran");
    }
    assert_eq!(ask(&mut stream, &["SET", "k", "v"]), "+OK\r\n");
    assert_eq!(ask(&mut stream, &["EXPIRE", "k", "100"]), ":1\r\n", "outside MULTI it runs");
    assert_eq!(ask(&mut stream, &["TTL", "k"]), ":100\r\n");
}
