//! Single-key conditional writes through the RESP gateway (issue 31 item 4): INCR, INCRBY,
//! DECR, DECRBY, SETNX, SET NX|XX|GET, GETSET, GETDEL and APPEND, with every reply Redis also
//! gives compared byte for byte with a real redis-server 7.0's; redis-py's own calls
//! (`scripts/resp_conditional.py`); and what rampkv refuses (MSETNX, a conditional write inside
//! MULTI), with why. The concurrency argument is tested in `tests/conditional_writes.rs`.
//! The tools come from Debian's `redis-tools` and `redis-server` and pip's `redis`; a missing
//! tool fails the test with a message saying so.

mod resp_common;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use rampkv::cluster::Cluster;
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::server::{ServerConfig, ServerGroup};
use resp_common::{ask, connect, run_tool, RedisServer};

struct Stack {
    _group: ServerGroup,
    gateway: Gateway,
}

impl Stack {
    /// `servers` servers and a gateway reaching them over TCP, or calling their cores in this
    /// process as `rampkv local` does.
    fn start(servers: usize, in_process: bool) -> Stack {
        let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); servers]).unwrap();
        let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
        let in_process = in_process.then(|| InProcessServers { groups: vec![Arc::clone(group.servers())] });
        let config = GatewayConfig { sessions: 16, in_process, ..GatewayConfig::new(localhost) };
        let gateway = Gateway::spawn(&cluster, &config).unwrap();
        Stack { _group: group, gateway }
    }

    fn port(&self) -> u16 {
        self.gateway.address().port()
    }

    fn connect(&self) -> TcpStream {
        connect(self.port())
    }
}

#[test]
fn redis_py_runs_incr_setnx_set_nx_getset_getdel_and_append() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/resp_conditional.py");
    for in_process in [false, true] {
        let stack = Stack::start(4, in_process);
        let port = stack.port().to_string();
        let output = run_tool("python3", &[script, &port], None);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "in process {in_process}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("resp_conditional.py: every check passed"), "{stdout}");
    }
}

/// Every reply Redis also gives, byte for byte the same as a real redis-server 7.0's: the
/// results, their types (integer, +OK, bulk, null in RESP2 and RESP3), the errors for values
/// that are not integers, overflows, bad increments, SET's syntax errors and the arities.
#[test]
fn conditional_write_replies_are_byte_for_byte_redis_s() {
    let stack = Stack::start(3, false);
    let redis = RedisServer::start();
    let sessions: &[&[&[&str]]] = &[
        &[
            &["INCR", "c"],
            &["INCR", "c"],
            &["INCRBY", "c", "10"],
            &["DECR", "c"],
            &["DECRBY", "c", "5"],
            &["INCRBY", "c", "-3"],
            &["GET", "c"],
            &["INCRBY", "c", "abc"],
            &["INCRBY", "c", "1.5"],
            &["INCRBY", "c", "007"],
            &["INCRBY", "c", "+1"],
            &["DECRBY", "c", "-9223372036854775808"],
            &["DECRBY", "c", "9223372036854775807"],
            &["DECRBY", "c", "9223372036854775807"],
            &["GET", "c"],
            &["SET", "s", "hello"],
            &["INCR", "s"],
            &["SET", "e", ""],
            &["INCR", "e"],
            &["SET", "z", "-0"],
            &["INCR", "z"],
            &["SET", "max", "9223372036854775807"],
            &["INCR", "max"],
            &["SET", "min", "-9223372036854775808"],
            &["DECR", "min"],
            &["GET", "max"],
            &["INCR"],
            &["INCRBY", "c"],
            &["DECR", "a", "b"],
        ],
        &[
            &["SETNX", "n", "v"],
            &["SETNX", "n", "w"],
            &["GET", "n"],
            &["SET", "x", "1", "NX"],
            &["SET", "x", "2", "nx"],
            &["SET", "x", "3", "XX"],
            &["SET", "y", "1", "XX"],
            &["MGET", "x", "y"],
            &["SET", "x", "4", "GET"],
            &["SET", "w", "5", "GET"],
            &["SET", "x", "6", "NX", "GET"],
            &["SET", "x", "7", "XX", "GET"],
            &["SET", "v", "7", "GET", "XX"],
            &["GET", "x"],
            &["SET", "x", "1", "NX", "XX"],
            &["SET", "x", "1", "XX", "NX"],
            &["SET", "x", "1", "FOO"],
            &["SET", "x", "1", "GET", "GET"],
            &["GETSET", "x", "8"],
            &["GETSET", "never", "1"],
            &["GETDEL", "x"],
            &["GETDEL", "x"],
            &["GET", "x"],
            &["EXISTS", "x"],
            &["SETNX", "x", "again"],
            &["GET", "x"],
            &["SETNX", "x"],
            &["GETSET", "x"],
            &["GETDEL"],
        ],
        &[
            &["APPEND", "a", "hello"],
            &["APPEND", "a", " world"],
            &["GET", "a"],
            &["STRLEN", "a"],
            &["APPEND", "a", ""],
            &["APPEND", "b", ""],
            &["EXISTS", "b"],
            &["GET", "b"],
            &["SET", "num", "41"],
            &["APPEND", "num", "0"],
            &["INCR", "num"],
            &["APPEND", "a"],
        ],
        &[
            &["HELLO", "3"],
            &["SET", "r3", "1", "NX"],
            &["SET", "r3", "1", "NX"],
            &["GETDEL", "r3"],
            &["GETDEL", "r3"],
            &["GETSET", "r3", "2"],
            &["SET", "r3x", "1", "XX"],
            &["INCRBY", "r3", "5"],
        ],
        &[&["MSETNX", "a"], &["MSETNX", "a", "1", "b"]],
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

/// What rampkv refuses, and says why: MSETNX (a condition over several keys), a conditional
/// write inside MULTI (it reads and writes; a MULTI is read-only or write-only), SET NX with an
/// expiry inside MULTI too. None changes anything, and the connection stays usable.
#[test]
fn msetnx_and_conditional_writes_inside_multi_are_refused_with_why() {
    let stack = Stack::start(3, false);
    let mut stream = stack.connect();
    let msetnx = ask(&mut stream, &["MSETNX", "a", "1", "b", "2"]);
    assert!(msetnx.starts_with("-ERR MSETNX is not supported by rampkv: "), "{msetnx}");
    assert!(msetnx.contains("read-only or write-only"), "{msetnx}");
    assert_eq!(ask(&mut stream, &["MGET", "a", "b"]), "*2\r\n$-1\r\n$-1\r\n");

    assert_eq!(ask(&mut stream, &["MULTI"]), "+OK\r\n");
    assert_eq!(ask(&mut stream, &["SET", "k", "1"]), "+QUEUED\r\n");
    let refused = ask(&mut stream, &["INCR", "k"]);
    assert!(refused.starts_with("-ERR INCR inside MULTI is not supported by rampkv: "), "{refused}");
    assert!(refused.contains("read-only or write-only"), "{refused}");
    assert_eq!(ask(&mut stream, &["SET", "k", "2"]), "+QUEUED\r\n", "as Redis after a refused command");
    assert_eq!(ask(&mut stream, &["EXEC"]), "-EXECABORT Transaction discarded because of previous errors.\r\n");
    assert_eq!(ask(&mut stream, &["GET", "k"]), "$-1\r\n", "nothing ran");
    for command in [&["SETNX", "k", "1"][..], &["SET", "k", "1", "NX"], &["GETDEL", "k"], &["APPEND", "k", "x"]] {
        assert_eq!(ask(&mut stream, &["MULTI"]), "+OK\r\n");
        let refused = ask(&mut stream, command);
        assert!(refused.contains("inside MULTI is not supported by rampkv"), "{command:?}: {refused}");
        assert_eq!(ask(&mut stream, &["DISCARD"]), "+OK\r\n");
    }
    // SET NX with an expiry is an update too (tests/resp_expire.rs), refused the same way.
    assert_eq!(ask(&mut stream, &["MULTI"]), "+OK\r\n");
    let refused = ask(&mut stream, &["SET", "k", "1", "NX", "EX", "10"]);
    assert!(refused.starts_with("-ERR SET inside MULTI is not supported by rampkv"), "{refused}");
    assert_eq!(ask(&mut stream, &["DISCARD"]), "+OK\r\n");
    assert_eq!(ask(&mut stream, &["INCR", "k"]), ":1\r\n", "the connection stays usable");
}
