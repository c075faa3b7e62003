//! The RESP gateway as Redis users meet it: real `redis-cli` and `redis-benchmark` processes, and
//! raw sockets for what those tools never send (malformed input, inline commands, pipelines).
//!
//! Every test starts its own cluster (`ServerGroup` on 127.0.0.1:0) and gateway (127.0.0.1:0).
//! The tools come from Debian's `redis-tools` and `redis-server` (`.ci/run` installs them); a
//! missing tool fails the test with a message saying so, it is never skipped.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rampkv::cluster::Cluster;
use rampkv::resp::auth::Users;
use rampkv::resp::codec::{parse_frame, Frame};
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::resp::RESP_BULK_BYTES_MAX;
use rampkv::server::{ServerConfig, ServerGroup};

#[allow(dead_code)] // the helpers this file's own byte-level `ask` does not need
mod resp_common;

use resp_common::{multibulk, run_tool, RedisServer, SOCKET_TIMEOUT};

struct Stack {
    _group: ServerGroup,
    cluster: Cluster,
    gateway: Gateway,
}

impl Stack {
    /// A gateway reaching its servers over TCP.
    fn start(servers: usize, sessions: usize) -> Stack {
        Self::start_with(servers, sessions, false)
    }

    /// A gateway calling the server cores of its process directly (as `rampkv local` does).
    fn start_in_process(servers: usize, sessions: usize) -> Stack {
        Self::start_with(servers, sessions, true)
    }

    fn start_with(servers: usize, sessions: usize, in_process: bool) -> Stack {
        Self::start_configured(servers, sessions, in_process, |config| config)
    }

    /// A gateway over TCP whose users are `users`.
    fn start_with_users(servers: usize, users: Users) -> Stack {
        Self::start_configured(servers, 16, false, |config| GatewayConfig { users: Arc::new(users), ..config })
    }

    fn start_configured(
        servers: usize,
        sessions: usize,
        in_process: bool,
        configure: impl FnOnce(GatewayConfig) -> GatewayConfig,
    ) -> Stack {
        let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); servers]).unwrap();
        let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
        let in_process = in_process.then(|| InProcessServers { groups: vec![std::sync::Arc::clone(group.servers())] });
        let config = configure(GatewayConfig { sessions, in_process, ..GatewayConfig::new(localhost) });
        let gateway = Gateway::spawn(&cluster, &config).unwrap();
        Stack { _group: group, cluster, gateway }
    }

    fn port(&self) -> u16 {
        self.gateway.address().port()
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.gateway.address()).unwrap();
        stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
        stream
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

/// `redis-cli -p PORT` reading one command per line from its standard input (one connection).
fn cli_script(port: u16, extra: &[&str], script: &str) -> String {
    let port = port.to_string();
    let mut all = vec!["-p", &port];
    all.extend_from_slice(extra);
    let output = run_tool("redis-cli", &all, Some(script));
    assert!(output.status.success(), "redis-cli script {script:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Reads until the peer closes or `expected` bytes arrived; returns what came.
fn read_reply(stream: &mut TcpStream, expected: usize) -> Vec<u8> {
    let mut reply = Vec::new();
    let mut buffer = [0u8; 65536];
    while reply.len() < expected {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => reply.extend_from_slice(&buffer[..read]),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => panic!("reading a reply: {error} (got {:?} so far)", String::from_utf8_lossy(&reply)),
        }
    }
    reply
}

fn exchange(stream: &mut TcpStream, request: &[u8], reply: &[u8]) {
    stream.write_all(request).unwrap();
    let got = read_reply(stream, reply.len());
    assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(reply), "reply to {request:?}");
}

fn assert_closed(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Err(error) if error.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("expected the connection closed, got {other:?}"),
    }
}

#[test]
fn redis_cli_commands_print_what_redis_prints() {
    let stack = Stack::start(4, 64);
    let port = stack.port();
    let keys = ["a", "b", "c", "d", "e", "f"];
    let servers: std::collections::HashSet<usize> =
        keys.iter().map(|k| stack.cluster.server_of(k.as_bytes())).collect();
    assert!(servers.len() > 1, "the keys must span servers");

    assert_eq!(cli(port, &["PING"]), "PONG\n");
    assert_eq!(cli(port, &["ping", "hello"]), "hello\n");
    assert_eq!(cli(port, &["ECHO", "x y"]), "x y\n");
    assert_eq!(cli(port, &["SET", "k", "v"]), "OK\n");
    assert_eq!(cli(port, &["GET", "k"]), "v\n");
    assert_eq!(cli(port, &["GET", "never"]), "\n");
    assert_eq!(cli(port, &["MSET", "a", "1", "b", "2", "c", "3", "d", "4", "e", "5", "f", "6"]), "OK\n");
    assert_eq!(cli(port, &["MGET", "a", "b", "missing", "f"]), "1\n2\n\n6\n");
    assert_eq!(cli(port, &["EXISTS", "a", "b", "missing", "a"]), "3\n");
    assert_eq!(cli(port, &["DEL", "a", "missing", "b", "a"]), "2\n");
    assert_eq!(cli(port, &["MGET", "a", "b", "c"]), "\n\n3\n");
    assert_eq!(cli(port, &["EXISTS", "a", "c"]), "1\n");
    assert_eq!(cli(port, &["DEL", "a"]), "0\n");
    assert_eq!(cli(port, &["SET", "a", ""]), "OK\n");
    assert_eq!(cli(port, &["EXISTS", "a"]), "1\n", "an empty value is present");
    assert_eq!(cli(port, &["SELECT", "0"]), "OK\n");

    // Errors: redis-cli prints the text and a blank line, and exits 0.
    assert_eq!(cli(port, &["FOO", "a", "b"]), "ERR unknown command 'FOO', with args beginning with: 'a' 'b' \n\n");
    assert_eq!(cli(port, &["GET"]), "ERR wrong number of arguments for 'get' command\n\n");
    assert_eq!(cli(port, &["MSET", "a", "1", "b"]), "ERR wrong number of arguments for 'mset' command\n\n");
    assert_eq!(cli(port, &["SELECT", "1"]), "ERR DB index is out of range\n\n");
    assert_eq!(cli(port, &["SET", "k", "v2", "NX"]), "\n", "k exists: not set (nil), as redis-cli prints it");
    assert_eq!(cli(port, &["SET", "k", "v2", "NX", "KEEPTTL"]), "\n", "k exists: NX KEEPTTL sets nothing either");
    assert_eq!(cli(port, &["SET", "k", "v2", "EX", "0"]), "ERR invalid expire time in 'set' command\n\n");
    assert_eq!(cli(port, &["SET", "k", "v2", "EX", "10", "PX", "10"]), "ERR syntax error\n\n");
    assert_eq!(cli(port, &["GET", "k"]), "v\n", "a refused SET changed nothing");
    assert_eq!(cli(port, &["TTL", "k"]), "-1\n", "no expiry");
    assert_eq!(cli(port, &["TTL", "never"]), "-2\n", "absent");
    let keys: u64 = cli(port, &["DBSIZE"]).trim().parse().expect("DBSIZE answers the count of live keys");
    assert!(keys >= 1, "k was written");

    // One connection: the name sticks to it.
    assert_eq!(cli_script(port, &[], "CLIENT SETNAME me\nCLIENT GETNAME\nGET k\n"), "OK\nme\nv\n");
    let info = cli(port, &["INFO"]);
    let lines: Vec<&str> = info.lines().map(str::trim_end).collect();
    assert_eq!(lines[0], "# Server", "{info}");
    assert!(lines.iter().any(|line| line.starts_with("redis_version:")), "{info}");
}

#[test]
fn redis_cli_speaks_resp3_after_hello_3() {
    let stack = Stack::start(2, 16);
    let port = stack.port();
    assert_eq!(cli(port, &["MSET", "x", "1", "y", "2"]), "OK\n");
    assert_eq!(cli(port, &["-3", "MGET", "x", "nothing", "y"]), "1\n\n2\n");
    let hello = cli(port, &["-3", "HELLO", "3"]);
    assert!(hello.contains("proto 3\n"), "{hello}");

    let mut stream = stack.connect();
    stream.write_all(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n").unwrap();
    let greeting = read_reply_until_quiet(&mut stream);
    let (frame, length) = parse_frame(&greeting).unwrap().expect("a whole reply");
    assert_eq!(length, greeting.len());
    let Frame::Map(fields) = frame else { panic!("HELLO 3 replies a map, got {frame:?}") };
    assert!(fields.contains(&(Frame::bulk("proto"), Frame::Integer(3))), "{fields:?}");
    exchange(&mut stream, b"GET nothing\r\n", b"_\r\n");
    exchange(&mut stream, b"MGET x nothing\r\n", b"*2\r\n$1\r\n1\r\n_\r\n");
    stream.write_all(b"HELLO 2\r\n").unwrap();
    assert!(read_reply_until_quiet(&mut stream).starts_with(b"*14\r\n"), "RESP2 has no maps");
    exchange(&mut stream, b"GET nothing\r\n", b"$-1\r\n");
}

/// Reads whatever arrives within a short while (the rest of a reply of unknown length).
fn read_reply_until_quiet(stream: &mut TcpStream) -> Vec<u8> {
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut rest = Vec::new();
    let mut buffer = [0u8; 4096];
    while let Ok(read) = stream.read(&mut buffer) {
        if read == 0 {
            break;
        }
        rest.extend_from_slice(&buffer[..read]);
    }
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
    rest
}

/// The same redis-cli commands against a real redis-server and the gateway print the same. This
/// pins the texts to Redis's, not to what this file's author believed them to be.
#[test]
fn redis_cli_prints_the_same_for_the_gateway_as_for_a_real_redis_server() {
    let stack = Stack::start(3, 16);
    let redis = RedisServer::start();
    let script: &[&[&str]] = &[
        &["PING"],
        &["SET", "k", "v"],
        &["GET", "k"],
        &["MSET", "a", "1", "b", "2"],
        &["MGET", "a", "b", "nothing"],
        &["EXISTS", "a", "nothing", "a"],
        &["DEL", "a", "nothing"],
        &["GET", "a"],
        &["-3", "MGET", "a", "b"],
        &["FOO", "bar"],
        &["FOO"],
        &["get"],
        &["ECHO"],
        &["ping", "a", "b"],
        &["MSET", "a"],
        &["SELECT", "x"],
        &["CLIENT", "FOO"],
        &["CLIENT", "SETNAME", "a b"],
        &["HELLO", "4"],
        &["CONFIG", "GET", "appendonly"],
    ];
    for args in script {
        assert_eq!(cli(stack.port(), args), cli(redis.port, args), "redis-cli {args:?}");
    }
}

#[test]
fn inline_commands_work_as_with_telnet() {
    let stack = Stack::start(2, 16);
    let mut stream = stack.connect();
    exchange(&mut stream, b"SET greeting \"hello world\"\r\n", b"+OK\r\n");
    exchange(&mut stream, b"GET greeting\n", b"$11\r\nhello world\r\n");
    exchange(&mut stream, b"\r\nPING\r\n", b"+PONG\r\n");
    exchange(&mut stream, b"set 'a b\r\n", b"-ERR Protocol error: unbalanced quotes in request\r\n");
    assert_closed(&mut stream);
}

#[test]
fn malformed_resp_gets_a_protocol_error_and_closes_only_that_connection() {
    let stack = Stack::start(2, 16);
    let mut good = stack.connect();
    exchange(&mut good, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", b"+OK\r\n");
    let cases: &[(&[u8], &[u8])] = &[
        (b"*1\r\n$4\r\nPING\r\n*x\r\n", b"+PONG\r\n-ERR Protocol error: invalid multibulk length\r\n"),
        (b"*2\r\n:3\r\n", b"-ERR Protocol error: expected '$', got ':'\r\n"),
        (b"*1\r\n$99999999999\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
        (b"*1\r\n$2\r\nabcd\r\n", b"-ERR Protocol error: expected CRLF\r\n"),
        (b"*600\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
    ];
    for (request, reply) in cases {
        let mut bad = stack.connect();
        exchange(&mut bad, request, reply);
        assert_closed(&mut bad);
        exchange(&mut good, b"GET k\r\n", b"$1\r\nv\r\n");
    }
    // A line that never ends is cut off at the inline bound.
    let mut bad = stack.connect();
    let _ = bad.write_all(&vec![b'x'; 70_000]);
    assert_eq!(read_reply(&mut bad, 1), b"-ERR Protocol error: too big inline request\r\n");
    exchange(&mut good, b"PING\r\n", b"+PONG\r\n");
}

#[test]
fn pipelined_commands_are_answered_in_order_and_see_earlier_writes() {
    let stack = Stack::start(4, 16);
    let mut stream = stack.connect();
    let mut request = Vec::new();
    let mut expected = Vec::new();
    for round in 0..200 {
        let key = format!("key{}", round % 7);
        let value = format!("v{round}");
        request.extend_from_slice(format!("SET {key} {value}\r\nGET {key}\r\nMGET {key} nothing\r\n").as_bytes());
        expected.extend_from_slice(b"+OK\r\n");
        expected.extend_from_slice(format!("${}\r\n{value}\r\n", value.len()).as_bytes());
        expected.extend_from_slice(format!("*2\r\n${}\r\n{value}\r\n$-1\r\n", value.len()).as_bytes());
    }
    stream.write_all(&request).unwrap();
    let reply = read_reply(&mut stream, expected.len());
    assert_eq!(String::from_utf8_lossy(&reply), String::from_utf8_lossy(&expected));
}

/// Issue 18 (memory per key): pipelined SETs are independent one-key writes, so the servers
/// keep one version per key, not every version written through the GC grace period; pipelined
/// MSETs of two keys stay atomic, and their superseded versions wait out the grace period once
/// a reader may come back for them (issue 31: a key read within the grace period, here before
/// it existed; versions of keys nobody read go at once). The values read back are the last
/// ones written, in process and over TCP.
#[test]
fn pipelined_sets_keep_one_version_per_key_and_msets_stay_atomic() {
    for stack in [Stack::start_in_process(4, 4), Stack::start(4, 4)] {
        let mut stream = stack.connect();
        let mut request = Vec::new();
        for round in 0..160 {
            request.extend_from_slice(format!("SET key{} v{round}\r\n", round % 10).as_bytes());
        }
        stream.write_all(&request).unwrap();
        let reply = read_reply(&mut stream, 160 * b"+OK\r\n".len());
        assert!(reply.chunks(5).all(|chunk| chunk == b"+OK\r\n"), "{}", String::from_utf8_lossy(&reply));
        let versions =
            |stack: &Stack| stack._group.cores().iter().map(|core| core.store().stats().versions).sum::<usize>();
        assert_eq!(versions(&stack), 10, "one version per key: superseded ones went at once");
        for index in 0..10 {
            assert_eq!(cli(stack.port(), &["GET", &format!("key{index}")]), format!("v{}\n", 150 + index));
        }
        // A round-1 read of both keys before they exist: a reader may come back for their
        // versions, so the servers keep the superseded ones for the grace period.
        assert_eq!(cli(stack.port(), &["MGET", "pair-a", "pair-b"]), "\n\n");
        for round in 0..4 {
            // One at a time: pipelined, they would be one transaction.
            exchange(&mut stream, format!("MSET pair-a m{round} pair-b m{round}\r\n").as_bytes(), b"+OK\r\n");
        }
        assert_eq!(versions(&stack), 10 + 2 * 4, "two-key versions keep their grace period");
        assert_eq!(cli(stack.port(), &["MGET", "pair-a", "pair-b"]), "m3\nm3\n");
    }
}

/// A seeded random pipeline of reads, writes, deletes and other commands gets exactly the
/// replies a sequential model predicts: batching consecutive reads or writes into one
/// transaction keeps every command's reply and order. Set `RESP_PIPELINE_SEED` to replay.
#[test]
fn random_pipelines_get_the_replies_of_a_sequential_model() {
    random_pipelines_match_the_model(Stack::start(4, 16));
}

#[test]
fn random_pipelines_get_the_replies_of_a_sequential_model_in_process() {
    random_pipelines_match_the_model(Stack::start_in_process(4, 16));
}

fn random_pipelines_match_the_model(stack: Stack) {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("RESP_PIPELINE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("seed {seed}");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut model: std::collections::HashMap<String, String> = Default::default();
    let bulk = |value: Option<&String>| match value {
        Some(value) => format!("${}\r\n{value}\r\n", value.len()),
        None => "$-1\r\n".to_string(),
    };
    for round in 0..5 {
        let (mut request, mut expected) = (String::new(), String::new());
        for _ in 0..300 {
            let keys: Vec<String> = (0..rng.gen_range(1..6)).map(|_| format!("k{}", rng.gen_range(0..12))).collect();
            let value = format!("v{}", rng.gen_range(0..1000));
            match rng.gen_range(0..10) {
                0..=2 => {
                    request += &format!("GET {}\r\n", keys[0]);
                    expected += &bulk(model.get(&keys[0]));
                }
                3 | 4 => {
                    request += &format!("MGET {}\r\n", keys.join(" "));
                    expected += &format!("*{}\r\n", keys.len());
                    keys.iter().for_each(|key| expected += &bulk(model.get(key)));
                }
                5 => {
                    request += &format!("EXISTS {}\r\n", keys.join(" "));
                    expected += &format!(":{}\r\n", keys.iter().filter(|key| model.contains_key(*key)).count());
                }
                6 => {
                    request += &format!("SET {} {value}\r\n", keys[0]);
                    expected += "+OK\r\n";
                    model.insert(keys[0].clone(), value);
                }
                7 => {
                    let pairs: Vec<String> =
                        keys.iter().enumerate().map(|(i, key)| format!("{key} {value}.{i}")).collect();
                    request += &format!("MSET {}\r\n", pairs.join(" "));
                    expected += "+OK\r\n";
                    keys.iter()
                        .enumerate()
                        .for_each(|(i, key)| drop(model.insert(key.clone(), format!("{value}.{i}"))));
                }
                8 => {
                    request += &format!("DEL {}\r\n", keys.join(" "));
                    let distinct: std::collections::HashSet<&String> = keys.iter().collect();
                    expected +=
                        &format!(":{}\r\n", distinct.iter().filter(|key| model.remove(**key).is_some()).count());
                }
                _ => {
                    request += "PING\r\nGET\r\n";
                    expected += "+PONG\r\n-ERR wrong number of arguments for 'get' command\r\n";
                }
            }
        }
        let mut stream = stack.connect();
        stream.write_all(request.as_bytes()).unwrap();
        let reply = read_reply(&mut stream, expected.len());
        assert_eq!(String::from_utf8_lossy(&reply), expected, "round {round}, seed {seed}");
    }
}

/// A client that pipelines far more replies than the gateway buffers, without reading them, is
/// simply not served further until it reads; others are served meanwhile, and it then gets
/// every reply.
#[test]
fn a_client_that_does_not_read_is_held_back_without_holding_back_others() {
    let stack = Stack::start(2, 16);
    let value = "x".repeat(60_000);
    let mut writer = stack.connect();
    exchange(&mut writer, format!("SET big {value}\r\n").as_bytes(), b"+OK\r\n");
    let gets = 500; // 30 MB of replies: far beyond the backlog bound and the socket buffers
    let mut reader = stack.connect();
    reader.write_all("GET big\r\n".repeat(gets).as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..10 {
        exchange(&mut writer, b"PING\r\n", b"+PONG\r\n");
    }
    let reply = format!("${}\r\n{value}\r\n", value.len());
    let all = read_reply(&mut reader, reply.len() * gets);
    assert_eq!(all.len(), reply.len() * gets);
    assert!(all.chunks(reply.len()).all(|chunk| chunk == reply.as_bytes()), "every reply whole and in order");
}

#[test]
fn a_client_that_stops_sending_still_gets_every_reply() {
    let stack = Stack::start(2, 16);
    let mut stream = stack.connect();
    stream.write_all(b"SET a 1\r\nMSET b 2 c 3\r\nMGET a b c\r\nDEL a\r\nGET a\r\nPARTIAL").unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let expected = b"+OK\r\n+OK\r\n*3\r\n$1\r\n1\r\n$1\r\n2\r\n$1\r\n3\r\n:1\r\n$-1\r\n";
    assert_eq!(read_reply(&mut stream, usize::MAX), expected, "every reply, then the end of the stream");
}

#[test]
fn values_and_keys_beyond_the_bounds_are_refused_without_changing_anything() {
    let stack = Stack::start(2, 16);
    let mut stream = stack.connect();
    let set = |value_length: usize| {
        let mut request = format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${value_length}\r\n").into_bytes();
        request.extend(std::iter::repeat_n(b'x', value_length));
        request.extend_from_slice(b"\r\n");
        request
    };
    let largest = RESP_BULK_BYTES_MAX - 1;
    exchange(&mut stream, &set(largest), b"+OK\r\n");
    let reply = format!("-ERR value too large: {RESP_BULK_BYTES_MAX} bytes, at most {largest}\r\n");
    exchange(&mut stream, &set(RESP_BULK_BYTES_MAX), reply.as_bytes());
    let key = "k".repeat(257);
    exchange(&mut stream, format!("SET {key} v\r\n").as_bytes(), b"-ERR key too large: 257 bytes, at most 256\r\n");
    exchange(&mut stream, format!("MGET a {key}\r\n").as_bytes(), b"-ERR key too large: 257 bytes, at most 256\r\n");
    exchange(&mut stream, b"EXISTS k\r\n", b":1\r\n");
    let mut value = format!("${largest}\r\n").into_bytes();
    value.extend(std::iter::repeat_n(b'x', largest));
    value.extend_from_slice(b"\r\n");
    exchange(&mut stream, b"GET k\r\n", &value);
    // Past the bulk bound the stream cannot be followed: a protocol error, then the close.
    exchange(&mut stream, &set(RESP_BULK_BYTES_MAX + 1), b"-ERR Protocol error: invalid bulk length\r\n");
    assert_closed(&mut stream);
}

#[test]
fn connections_beyond_the_session_pool_are_refused_until_one_closes() {
    let stack = Stack::start(1, 2);
    let mut first = stack.connect();
    let mut second = stack.connect();
    exchange(&mut first, b"PING\r\n", b"+PONG\r\n");
    exchange(&mut second, b"PING\r\n", b"+PONG\r\n");
    let mut refused = stack.connect();
    assert_eq!(read_reply(&mut refused, usize::MAX), b"-ERR max number of clients reached\r\n");
    exchange(&mut first, b"QUIT\r\n", b"+OK\r\n");
    assert_closed(&mut first);
    let mut third = stack.connect();
    exchange(&mut third, b"SET k v\r\nGET k\r\n", b"+OK\r\n$1\r\nv\r\n");
}

/// When the cluster goes away, every command waiting on it gets an error reply (one per
/// pipelined command, batched or not) and the connection stays usable; once the servers are
/// back on their addresses, the gateway reconnects on a later command.
#[test]
fn losing_the_cluster_fails_each_waiting_command_and_the_gateway_reconnects_later() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 2]).unwrap();
    let addresses = group.addresses().to_vec();
    let cluster = Cluster::with_servers(addresses.iter().map(SocketAddr::to_string).collect()).unwrap();
    let gateway = Gateway::spawn(&cluster, &GatewayConfig { sessions: 4, ..GatewayConfig::new(localhost) }).unwrap();
    let mut stream = TcpStream::connect(gateway.address()).unwrap();
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
    exchange(&mut stream, b"SET k v\r\n", b"+OK\r\n");

    group.shutdown().unwrap();
    stream.write_all(b"GET k\r\nGET k\r\nMGET a b\r\nSET x 1\r\nPING\r\n").unwrap();
    let replies = String::from_utf8(read_until_lines(&mut stream, 5)).unwrap();
    let lines: Vec<&str> = replies.split_terminator("\r\n").collect();
    assert_eq!(lines.len(), 5, "{replies}");
    // Both servers are down: every partition is unavailable, and the error names them.
    assert!(lines[..4].iter().all(|line| line.starts_with("-CLUSTERDOWN rampkv: partitions [")), "{replies}");
    assert_eq!(lines[4], "+PONG");

    let configs: Vec<ServerConfig> = addresses.iter().map(|address| ServerConfig::new(*address)).collect();
    let _group = ServerGroup::spawn(&configs).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        stream.write_all(b"SET k v2\r\n").unwrap();
        let reply = read_until_lines(&mut stream, 1);
        if reply == b"+OK\r\n" {
            break;
        }
        assert!(reply.starts_with(b"-CLUSTERDOWN rampkv"), "{}", String::from_utf8_lossy(&reply));
        assert!(std::time::Instant::now() < deadline, "the gateway did not reconnect");
        std::thread::sleep(Duration::from_millis(200));
    }
    exchange(&mut stream, b"GET k\r\n", b"$2\r\nv2\r\n");
}

/// Reads until `count` CRLF-terminated lines (replies of one line each) have arrived.
fn read_until_lines(stream: &mut TcpStream, count: usize) -> Vec<u8> {
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while reply.windows(2).filter(|pair| pair == b"\r\n").count() < count {
        match stream.read(&mut byte) {
            Ok(1) => reply.push(byte[0]),
            other => panic!("reading replies: {other:?} after {:?}", String::from_utf8_lossy(&reply)),
        }
    }
    reply
}

/// redis-benchmark's own tests (GET, SET, MSET of 10 keys) and MGET of 4 random keys, with and
/// without pipelining, finish without an error from the server.
#[test]
fn redis_benchmark_runs_get_set_mget_mset_without_errors() {
    redis_benchmark_runs_clean(Stack::start(4, 64));
}

#[test]
fn redis_benchmark_runs_get_set_mget_mset_without_errors_in_process() {
    redis_benchmark_runs_clean(Stack::start_in_process(4, 64));
}

fn redis_benchmark_runs_clean(stack: Stack) {
    let port = stack.port().to_string();
    let common = ["-p", &port, "-n", "2000", "-c", "8", "-r", "1000", "-d", "64", "--csv"];
    let mget = ["MGET", "k:__rand_int__", "k:__rand_int__", "k:__rand_int__", "k:__rand_int__"];
    for pipeline in ["1", "16"] {
        let mut builtin = common.to_vec();
        builtin.extend_from_slice(&["-P", pipeline, "-t", "get,set,mset"]);
        let mut custom = common.to_vec();
        custom.extend_from_slice(&["-P", pipeline]);
        custom.extend_from_slice(&mget);
        for args in [builtin, custom] {
            let output = run_tool("redis-benchmark", &args, None);
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "redis-benchmark {args:?} failed: {stdout}{stderr}");
            assert!(!stdout.contains("ERR") && !stderr.contains("ERR"), "errors in {stdout}{stderr}");
            assert!(!stderr.contains("Error"), "{stderr}");
            let rows = stdout.lines().filter(|line| line.starts_with('"') && !line.starts_with("\"test\"")).count();
            let expected_rows = if args.contains(&"-t") { 3 } else { 1 };
            assert_eq!(rows, expected_rows, "one result per test: {stdout}");
        }
    }
    let info = cli(stack.port(), &["INFO"]);
    let processed: u64 = info
        .lines()
        .find_map(|line| line.trim_end().strip_prefix("total_commands_processed:"))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no command count in {info}"));
    assert!(processed >= 2 * 4 * 2000, "every benchmark request reached the gateway: {processed}");
}

/// The command the docs give, `rampkv local --resp-port PORT`, serves redis-cli; so does
/// `rampkv gateway --cluster FILE --listen ADDR` in front of a running cluster.
#[test]
fn the_rampkv_command_serves_resp_from_local_and_gateway() {
    let directory = tempfile::tempdir().unwrap();
    let port = free_port();
    let cluster_file = directory.path().join("cluster.toml");
    let port_text = port.to_string();
    let local = ChildGuard::rampkv(&["local", "--resp-port", &port_text, "--cluster-file"], &cluster_file);
    wait_for_ping(port);
    assert_eq!(cli(port, &["MSET", "a", "1", "b", "2"]), "OK\n");
    assert_eq!(cli(port, &["MGET", "a", "b"]), "1\n2\n");

    let gateway_port = free_port();
    let listen = format!("127.0.0.1:{gateway_port}");
    let gateway = ChildGuard::rampkv(&["gateway", "--listen", &listen, "--cluster"], &cluster_file);
    wait_for_ping(gateway_port);
    assert_eq!(cli(gateway_port, &["MGET", "a", "b"]), "1\n2\n", "a second gateway sees the same data");
    drop((gateway, local));
}

/// Kills and reaps a child process when dropped, so a failing test leaves nothing running.
struct ChildGuard(std::process::Child);

impl ChildGuard {
    /// `rampkv ARGS... PATH` (a command line ending with a file's path), its stderr dropped.
    fn rampkv(args: &[&str], path: &std::path::Path) -> ChildGuard {
        let child = Command::new(env!("CARGO_BIN_EXE_rampkv")).args(args).arg(path).stderr(Stdio::null()).spawn();
        ChildGuard(child.unwrap())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for_ping(port: u16) {
    for _ in 0..500 {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
            if stream.write_all(b"PING\r\n").is_ok() && read_reply(&mut stream, 7) == b"+PONG\r\n" {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing answered PING on port {port} within 5 s");
}

fn wait_for_listener(port: u16) {
    for _ in 0..500 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing listened on port {port} within 5 s");
}

// ---------------------------------------------------------------------------------------------
// Authentication (issue 15: "HELLO 3 AUTH default anything is accepted; AUTH is unknown")

/// The ACL file of the authentication tests, also given to redis-server: `default` with a
/// password, a user with every permission, a disabled one, one without permissions, one without
/// keys, one whose password is given as its SHA-256 (of "secret").
const ACL_FILE: &str = "user default on >secret ~* &* +@all\n\
                        user alice on >apw ~* &* +@all\n\
                        user bob off >bpw ~* &* +@all\n\
                        user carol on nopass\n\
                        user dave on >dpw +@all\n\
                        user erin on #2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b ~* &* +@all\n";

/// [`ACL_FILE`] written to a file in a directory removed when the first value drops.
fn acl_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("users.acl");
    std::fs::write(&path, ACL_FILE).unwrap();
    (directory, path)
}

/// Sends `request` and reads one whole reply, or what arrives until the peer closes.
fn ask(stream: &mut TcpStream, request: &[u8]) -> Vec<u8> {
    stream.write_all(request).unwrap();
    let mut reply = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        if let Ok(Some((_, length))) = parse_frame(&reply) {
            assert_eq!(length, reply.len(), "one reply at a time");
            return reply;
        }
        match stream.read(&mut buffer) {
            Ok(0) => return [reply, b"<closed>".to_vec()].concat(),
            Ok(read) => reply.extend_from_slice(&buffer[..read]),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) if error.kind() == ErrorKind::ConnectionReset => return [reply, b"<reset>".to_vec()].concat(),
            Err(error) => panic!("reading a reply: {error} (got {:?})", String::from_utf8_lossy(&reply)),
        }
    }
}

/// Each session (one connection, its commands in order) gets byte for byte the replies a real
/// redis-server 7.0 gives with the same ACL file, from the first NOAUTH to the last WRONGPASS:
/// the texts and the order of checks are Redis's, not what this file's author believed them to
/// be. (HELLO's greeting itself differs, server name and version: checked apart.)
#[test]
fn authentication_replies_are_byte_for_byte_redis_s() {
    let (_directory, acl_path) = acl_file();
    let stack = Stack::start_with_users(2, Users::from_acl_file(&acl_path).unwrap());
    let redis = RedisServer::start_with(&["--aclfile", acl_path.to_str().unwrap()]);
    let sessions: &[&[&[&str]]] = &[
        &[
            &["PING"],
            &["GET", "k"],
            &["MGET", "a", "b"],
            &["SET", "k", "v"],
            &["FOO", "a", "b"],
            &["GET"],
            &["CLIENT", "ID"],
            &["CLIENT", "FOO"],
            &["CLIENT", "SETNAME"],
            &["SELECT", "0"],
            &["ECHO", "x"],
            &["COMMAND", "COUNT"],
            &["CONFIG", "GET", "save"],
            &["ACL", "WHOAMI"],
            &["HELLO"],
            &["HELLO", "3"],
            &["HELLO", "3", "AUTH", "default", "wrong"],
            &["HELLO", "3", "AUTH", "default"],
            &["HELLO", "4"],
            &["HELLO", "x"],
            &["AUTH"],
            &["AUTH", "wrong"],
            &["AUTH", "a", "b", "c"],
            &["AUTH", "default", "wrong"],
            &["AUTH", "nobody", "x"],
            &["AUTH", "bob", "bpw"],
            &["PING"],
            &["QUIT"],
        ],
        &[&["AUTH", "secret"], &["GET", "k"], &["AUTH", "wrong"], &["GET", "k"], &["ACL", "WHOAMI"]],
        &[&["AUTH", "alice", "apw"], &["ACL", "WHOAMI"], &["SET", "k", "v"], &["GET", "k"], &["MGET", "k", "nothing"]],
        &[&["AUTH", "erin", "secret"], &["ACL", "WHOAMI"], &["AUTH", "carol", "anything"], &["GET", "k"], &["PING"]],
        &[&["AUTH", "carol", "x"], &["CLIENT", "SETNAME", "x"], &["COMMAND"], &["CONFIG", "GET", "save"], &["QUIT"]],
        &[&["AUTH", "dave", "dpw"], &["PING"], &["GET", "k"], &["MGET", "a", "b"], &["DEL", "k"], &["ACL", "WHOAMI"]],
    ];
    for session in sessions {
        let mut ours = stack.connect();
        let mut theirs = TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
        theirs.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
        for words in *session {
            let request = multibulk(words);
            let expected = ask(&mut theirs, &request);
            assert_eq!(
                String::from_utf8_lossy(&ask(&mut ours, &request)),
                String::from_utf8_lossy(&expected),
                "{words:?} in session {session:?}"
            );
        }
    }
    // Before authenticating, requests are parsed within Redis's small limits; beyond them the
    // protocol error closes the connection, as redis-server does.
    for request in [&b"*11\r\n"[..], b"*2\r\n$3\r\nGET\r\n$16385\r\n"] {
        let mut ours = stack.connect();
        let mut theirs = TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
        theirs.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
        let expected = ask(&mut theirs, request);
        assert!(expected.starts_with(b"-ERR Protocol error: unauthenticated"), "{expected:?}");
        assert_eq!(String::from_utf8_lossy(&ask(&mut ours, request)), String::from_utf8_lossy(&expected));
        assert_closed(&mut theirs);
        assert_closed(&mut ours);
    }
    // Once logged in, the same request sizes are fine.
    let mut stream = stack.connect();
    exchange(&mut stream, &multibulk(&["AUTH", "alice", "apw"]), b"+OK\r\n");
    let big = "v".repeat(16_385);
    let eleven = ["MSET", "a", "1", "b", "2", "c", "3", "d", "4", "e", &big];
    exchange(&mut stream, &multibulk(&eleven), b"+OK\r\n");
}

/// HELLO 3 AUTH logs in and switches protocol in one command (redis-py and redis-cli -3 use it);
/// redis-cli logs in with -a and with --user/--pass, and without them meets NOAUTH.
#[test]
fn redis_cli_logs_in_with_a_password_and_with_a_user() {
    let (_directory, acl_path) = acl_file();
    let stack = Stack::start_with_users(3, Users::from_acl_file(&acl_path).unwrap());
    let port = stack.port();
    assert_eq!(cli(port, &["PING"]), "NOAUTH Authentication required.\n\n");
    assert_eq!(cli(port, &["-a", "secret", "--no-auth-warning", "MSET", "a", "1", "b", "2"]), "OK\n");
    assert_eq!(cli(port, &["--user", "alice", "--pass", "apw", "--no-auth-warning", "MGET", "a", "b"]), "1\n2\n");
    assert_eq!(cli(port, &["-3", "--user", "alice", "--pass", "apw", "--no-auth-warning", "MGET", "a", "x"]), "1\n\n");
    let port_text = port.to_string();
    let refused = run_tool("redis-cli", &["-p", &port_text, "--user", "alice", "--pass", "wrong", "GET", "a"], None);
    let shown = format!("{}{}", String::from_utf8_lossy(&refused.stdout), String::from_utf8_lossy(&refused.stderr));
    assert!(shown.contains("WRONGPASS invalid username-password pair or user is disabled."), "{shown}");
    assert!(shown.contains("NOAUTH Authentication required.") && !shown.contains("\n1\n"), "{shown}");

    let mut stream = stack.connect();
    let greeting = ask(&mut stream, &multibulk(&["HELLO", "3", "AUTH", "alice", "apw", "SETNAME", "me"]));
    let Some((Frame::Map(fields), _)) = parse_frame(&greeting).unwrap() else { panic!("{greeting:?}") };
    assert!(fields.contains(&(Frame::bulk("proto"), Frame::Integer(3))), "{fields:?}");
    exchange(&mut stream, &multibulk(&["CLIENT", "GETNAME"]), b"$2\r\nme\r\n");
    exchange(&mut stream, &multibulk(&["GET", "nothing"]), b"_\r\n");
}

/// The same with redis-py (scripts/resp_auth.py): password, user and password, RESP3's HELLO
/// AUTH, and the exceptions redis-py raises for NOAUTH, WRONGPASS and NOPERM.
#[test]
fn redis_py_logs_in_and_gets_its_authentication_errors() {
    let (_directory, acl_path) = acl_file();
    let stack = Stack::start_with_users(3, Users::from_acl_file(&acl_path).unwrap());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/resp_auth.py");
    let output = run_tool("python3", &[script, &stack.port().to_string()], None);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("resp_auth.py: every check passed"), "{stdout}");
}

/// `--requirepass` on the command line: `rampkv local --resp-port` and `rampkv gateway` ask for
/// the password.
#[test]
fn the_rampkv_command_requires_the_password_it_is_given() {
    let directory = tempfile::tempdir().unwrap();
    let port = free_port();
    let cluster_file = directory.path().join("cluster.toml");
    let port_text = port.to_string();
    let local = ChildGuard::rampkv(
        &["local", "--servers", "2", "--resp-port", &port_text, "--requirepass", "pw1", "--cluster-file"],
        &cluster_file,
    );
    wait_for_listener(port);
    let auth = ["-a", "pw1", "--no-auth-warning"];
    assert_eq!(cli(port, &[&auth[..], &["PING"]].concat()), "PONG\n");
    assert_eq!(cli(port, &["SET", "k", "v"]), "NOAUTH Authentication required.\n\n");
    assert_eq!(cli(port, &[&auth[..], &["SET", "k", "v"]].concat()), "OK\n");

    let gateway_port = free_port();
    let (_acl_directory, acl_path) = acl_file();
    let listen = format!("127.0.0.1:{gateway_port}");
    let acl = acl_path.to_str().unwrap();
    let gateway = ChildGuard::rampkv(&["gateway", "--listen", &listen, "--aclfile", acl, "--cluster"], &cluster_file);
    wait_for_listener(gateway_port);
    assert_eq!(cli(gateway_port, &["GET", "k"]), "NOAUTH Authentication required.\n\n");
    assert_eq!(cli(gateway_port, &["--user", "alice", "--pass", "apw", "--no-auth-warning", "GET", "k"]), "v\n");
    drop((gateway, local));
}

/// Redis's protected mode, at start-up: a gateway anyone could use refuses an address other than
/// loopback (here checked without binding one: tests stay on loopback), a password or
/// `--protected-mode no` lifts the refusal, loopback addresses never need it.
#[test]
fn protected_mode_refuses_an_open_gateway_on_a_non_loopback_address() {
    let config = |listen: &str, users: Users, protected_mode: bool| GatewayConfig {
        users: Arc::new(users),
        protected_mode,
        ..GatewayConfig::new(listen.parse().unwrap())
    };
    for exposed in ["0.0.0.0:6379", "[::]:6379", "10.1.2.3:6379", "[2001:db8::1]:6379"] {
        let refusal = config(exposed, Users::open(), true).protected_mode_refusal().expect(exposed);
        let message = refusal.to_string();
        assert!(message.contains("protected mode") && message.contains("--requirepass"), "{message}");
        assert!(config(exposed, Users::with_default_password(b"pw"), true).protected_mode_refusal().is_none());
        assert!(config(exposed, Users::open(), false).protected_mode_refusal().is_none());
        let only_users = Users::from_acl("user default off\nuser alice on >pw allkeys allcommands\n").unwrap();
        assert!(config(exposed, only_users, true).protected_mode_refusal().is_none());
    }
    for local in ["127.0.0.1:6379", "127.0.0.2:6379", "[::1]:6379", "[::ffff:127.0.0.1]:6379"] {
        assert!(config(local, Users::open(), true).protected_mode_refusal().is_none(), "{local}");
    }
    // Gateway::spawn refuses before it binds or connects (the cluster here does not exist).
    let cluster = Cluster::with_servers(vec!["127.0.0.1:1".into()]).unwrap();
    let refused = Gateway::spawn(&cluster, &config("0.0.0.0:0", Users::open(), true)).unwrap_err();
    assert!(refused.to_string().starts_with("refusing to serve RESP on 0.0.0.0:0 without a password"), "{refused}");

    for args in [
        &["gateway", "--listen", "0.0.0.0:0", "--cluster", "/nonexistent.toml"][..],
        &["local", "--resp-port", "0", "--resp-bind", "0.0.0.0", "--cluster-file", "/nonexistent/c.toml"][..],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_rampkv")).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("(protected mode)") && stderr.contains("--protected-mode no"), "{stderr}");
    }
}

// ---------------------------------------------------------------------------------------------
// Timestamp poisoning (issue 15, item 1)

/// Writes `key` with timestamp `ts` straight to the server's binary port, as the attacker did
/// (a raw PUT frame; no client library would choose such a timestamp).
fn forge_put(server: &str, ts: u64, key: &[u8]) {
    use rampkv::wire::{FrameHeader, Request, Write as WireWrite, FRAME_HEADER_BYTES};
    let mut frame = Vec::new();
    Request::Put { ts, writes: vec![WireWrite::new(key.to_vec(), b"forged".to_vec())] }.encode_frame(1, &mut frame);
    let mut stream = TcpStream::connect(server).unwrap();
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
    stream.write_all(&frame).unwrap();
    // The reply: accepted by servers that do not yet check timestamps against their clock,
    // refused by those that do. What follows must hold either way.
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let body = FrameHeader::decode(&header).unwrap().body_length as usize;
    stream.read_exact(&mut vec![0u8; body]).unwrap();
}

/// "One raw PUT with timestamp u64::MAX pins the key ... Any client that then reads that key
/// and writes panics with `clock overflow`: in rampkv local --resp-port the gateway thread dies
/// while the process stays up and the RESP port refuses every connection." The session that
/// read the forged version now ignores it (too far ahead of its wall clock), writes with an
/// ordinary timestamp, and the gateway goes on serving every connection.
#[test]
fn a_forged_u64_max_timestamp_does_not_stop_the_gateway() {
    let stack = Stack::start(1, 4);
    forge_put(&stack.cluster.servers()[0], u64::MAX, b"pinned");
    let mut stream = stack.connect();
    let read = ask(&mut stream, &multibulk(&["GET", "pinned"]));
    assert!(read == b"$6\r\nforged\r\n" || read == b"$-1\r\n", "{read:?}");
    exchange(&mut stream, &multibulk(&["SET", "pinned", "mine"]), b"+OK\r\n");
    exchange(&mut stream, &multibulk(&["SET", "other", "1"]), b"+OK\r\n");
    let mut fresh = stack.connect();
    exchange(&mut fresh, b"PING\r\n", b"+PONG\r\n");
    exchange(&mut fresh, &multibulk(&["GET", "other"]), b"$1\r\n1\r\n");
}

/// "A smaller future timestamp spreads through the gateway's pooled sessions (15 of 20 keys
/// written later over RESP became un-updatable)." A session that reads a version an hour ahead
/// no longer moves its clock there, so what it writes afterwards stays updatable by every other
/// session.
#[test]
fn a_timestamp_from_the_future_does_not_spread_through_pooled_sessions() {
    let stack = Stack::start(1, 4);
    let an_hour_us = 3_600_000_000;
    let ahead = ((rampkv::types::wall_clock_us() + an_hour_us) << rampkv::types::CLIENT_ID_BITS) | 1;
    forge_put(&stack.cluster.servers()[0], ahead, b"ahead");
    let mut reader = stack.connect();
    ask(&mut reader, &multibulk(&["GET", "ahead"]));
    let keys: Vec<String> = (0..20).map(|index| format!("key{index}")).collect();
    for key in &keys {
        exchange(&mut reader, &multibulk(&["SET", key, "first"]), b"+OK\r\n");
    }
    let mut other = stack.connect(); // another session: `reader` still holds its own
    for key in &keys {
        exchange(&mut other, &multibulk(&["SET", key, "second"]), b"+OK\r\n");
        exchange(&mut other, &multibulk(&["GET", key]), b"$6\r\nsecond\r\n");
    }
}

// ---------------------------------------------------------------------------------------------
// Idle connections (issue 15, phase B item 2: the gateway's `--timeout`)

/// Redis's `timeout`: a connection idle that long is closed and its session goes back to the
/// pool (here 2 sessions, a 300 ms timeout), so idle clients cannot hold every session; a
/// client that keeps sending commands stays connected.
#[test]
fn the_idle_timeout_closes_idle_connections_and_frees_their_sessions() {
    let stack = Stack::start_configured(1, 2, false, |config| GatewayConfig {
        idle_timeout: Some(Duration::from_millis(300)),
        ..config
    });
    let mut idle = stack.connect();
    exchange(&mut idle, b"PING\r\n", b"+PONG\r\n");
    let mut active = stack.connect();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(1_000) {
        exchange(&mut active, b"PING\r\n", b"+PONG\r\n");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(idle.read(&mut [0u8; 16]).unwrap_or(0), 0, "the idle connection was closed");
    let mut third = stack.connect(); // the idle one's session is free again
    exchange(&mut third, b"PING\r\n", b"+PONG\r\n");
    exchange(&mut active, &multibulk(&["SET", "k", "v"]), b"+OK\r\n");
}

/// The gateway-wide byte budget: each connection may buffer one large request (an MSET of 256
/// values of 64 KiB: 32 MiB), so 1,024 connections could make the gateway hold 32 GiB. Here
/// eight connections each send the first 1 MiB of such an MSET (16 of its values) and stop,
/// against a gateway budget of 4 MiB: the ones that hold the most are closed until the total is
/// under the budget (at least four of the eight), and a client that sends ordinary commands is
/// served throughout. Before, all eight were held.
#[test]
fn the_gateway_closes_the_largest_connections_over_its_byte_budget_and_serves_the_others() {
    let budget = 4 << 20;
    let stack = Stack::start_configured(1, 16, false, |config| GatewayConfig { buffered_bytes_max: budget, ..config });
    let mut honest = stack.connect();
    exchange(&mut honest, b"SET k before\r\n", b"+OK\r\n");
    let mut prefix = b"*513\r\n$4\r\nMSET\r\n".to_vec();
    for index in 0..16 {
        prefix.extend_from_slice(format!("$5\r\nkey{index:02}\r\n$65536\r\n").as_bytes());
        prefix.extend_from_slice(&vec![b'x'; 65_536]);
        prefix.extend_from_slice(b"\r\n");
    }
    let mut hogs: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut hog = stack.connect();
            hog.set_write_timeout(Some(SOCKET_TIMEOUT)).unwrap();
            // A hog closed already may refuse the rest: that is the fix at work.
            let _ = hog.write_all(&prefix);
            // The honest client is served between them.
            exchange(&mut honest, b"GET k\r\n", b"$6\r\nbefore\r\n");
            hog
        })
        .collect();
    // Bounded rounds until at least four are closed (the gateway reads their bytes as they come).
    let mut open: Vec<bool> = vec![true; hogs.len()];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while open.iter().filter(|open| !**open).count() < 4 && std::time::Instant::now() < deadline {
        for (hog, open) in hogs.iter_mut().zip(&mut open).filter(|(_, open)| **open) {
            hog.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            match hog.read(&mut [0u8; 1]) {
                Ok(0) => *open = false,
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => *open = false,
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                }
                other => panic!("a hog got {other:?}"),
            }
        }
    }
    let closed = open.iter().filter(|open| !**open).count();
    println!("{closed} of 8 connections closed over the gateway's budget of {budget} bytes");
    assert!(closed >= 4, "only {closed} of 8 hogs closed: 8 MiB held against a budget of 4 MiB");
    assert!(closed < 8, "the budget closes only what it must");
    exchange(&mut honest, b"SET k after\r\n", b"+OK\r\n");
    exchange(&mut honest, b"GET k\r\n", b"$5\r\nafter\r\n");
}
