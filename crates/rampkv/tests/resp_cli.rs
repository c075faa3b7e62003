//! The RESP gateway as Redis users meet it: real `redis-cli` and `redis-benchmark` processes, and
//! raw sockets for what those tools never send (malformed input, inline commands, pipelines).
//!
//! Every test starts its own cluster (`ServerGroup` on 127.0.0.1:0) and gateway (127.0.0.1:0).
//! The tools come from Debian's `redis-tools` and `redis-server` (`.ci/run` installs them); a
//! missing tool fails the test with a message saying so, it is never skipped.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rampkv::cluster::Cluster;
use rampkv::resp::codec::{parse_frame, Frame};
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::resp::RESP_BULK_BYTES_MAX;
use rampkv::server::{ServerConfig, ServerGroup};

/// Longest any one tool invocation may take (coreutils `timeout` kills it after).
const TOOL_TIMEOUT_SECONDS: &str = "60";
const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

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
        let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); servers]).unwrap();
        let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
        let in_process = in_process.then(|| InProcessServers { groups: vec![std::sync::Arc::clone(group.servers())] });
        let config = GatewayConfig { sessions, in_process, ..GatewayConfig::new(localhost) };
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

/// Runs a tool under `timeout`; fails the test with an install hint if the tool is missing.
fn run_tool(tool: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new("timeout")
        .arg(TOOL_TIMEOUT_SECONDS)
        .arg(tool)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("coreutils `timeout` runs");
    if let Some(text) = stdin {
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    let output = child.wait_with_output().unwrap();
    if output.status.code() == Some(127) {
        panic!(
            "`{tool}` is not installed: install Debian's redis-tools and redis-server \
             (apt-get install redis-tools redis-server), as .ci/run does"
        );
    }
    output
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
    assert!(cli(port, &["SET", "k", "v", "EX", "10"]).starts_with("ERR SET options are not supported"));
    assert_eq!(cli(port, &["GET", "k"]), "v\n", "a refused SET changed nothing");
    assert!(cli(port, &["DBSIZE"]).starts_with("ERR DBSIZE is not supported"));

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
    assert!(lines[..4].iter().all(|line| line.starts_with("-ERR rampkv")), "{replies}");
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
        assert!(reply.starts_with(b"-ERR rampkv"), "{}", String::from_utf8_lossy(&reply));
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
    let local = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["local", "--resp-port", &port.to_string(), "--cluster-file"])
            .arg(&cluster_file)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_ping(port);
    assert_eq!(cli(port, &["MSET", "a", "1", "b", "2"]), "OK\n");
    assert_eq!(cli(port, &["MGET", "a", "b"]), "1\n2\n");

    let gateway_port = free_port();
    let gateway = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["gateway", "--listen", &format!("127.0.0.1:{gateway_port}"), "--cluster"])
            .arg(&cluster_file)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_ping(gateway_port);
    assert_eq!(cli(gateway_port, &["MGET", "a", "b"]), "1\n2\n", "a second gateway sees the same data");
    drop((gateway, local));
}

/// Kills and reaps a child process when dropped, so a failing test leaves nothing running.
struct ChildGuard(std::process::Child);

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

/// A real redis-server on a free port (Redis refuses port 0), killed on drop.
struct RedisServer {
    child: std::process::Child,
    port: u16,
}

impl RedisServer {
    fn start() -> RedisServer {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot run redis-server ({error}): install Debian's redis-server, as .ci/run does")
            });
        let server = RedisServer { child, port };
        wait_for_ping(port);
        server
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
