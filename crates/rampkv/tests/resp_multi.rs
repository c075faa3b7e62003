//! Issue 31 as a Redis user meets it: MULTI/EXEC/DISCARD, WATCH, TYPE, STRLEN, UNLINK and INFO
//! through redis-py (`scripts/resp_multi.py`), redis-cli, and raw sockets, with the replies that
//! Redis also gives compared byte for byte with a real redis-server 7.0.
//!
//! The concurrency check (MULTI/EXEC write groups against MULTI/EXEC read groups and MGETs, the
//! history checked for read atomicity) is in `tests/resp_atomicity.rs`. The tools come from
//! Debian's `redis-tools` and `redis-server` and pip's `redis` (`.ci/run` installs them); a
//! missing tool fails the test with a message saying so.

mod resp_common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use rampkv::cluster::Cluster;
use rampkv::resp::gateway::{
    Gateway, GatewayConfig, InProcessServers, MULTI_QUEUED_BYTES_MAX, MULTI_QUEUED_COMMANDS_MAX,
};
use rampkv::server::{ServerConfig, ServerGroup};
use resp_common::{ask, connect, multibulk, read_frames, run_tool, RedisServer};

struct Stack {
    group: ServerGroup,
    cluster: Cluster,
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
        Stack { group, cluster, gateway }
    }

    fn port(&self) -> u16 {
        self.gateway.address().port()
    }

    fn connect(&self) -> TcpStream {
        connect(self.port())
    }

    fn versions(&self) -> usize {
        self.group.cores().iter().map(|core| core.store().stats().versions).sum()
    }
}

/// `redis-cli -p PORT` reading one command per line from its standard input, on one connection.
fn cli_script(port: u16, extra: &[&str], script: &str) -> String {
    let port = port.to_string();
    let mut args = vec!["-p", &port];
    args.extend_from_slice(extra);
    let output = run_tool("redis-cli", &args, Some(script));
    assert!(output.status.success(), "redis-cli script {script:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn redis_py_runs_transactions_type_strlen_unlink_and_reads_info() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/resp_multi.py");
    for in_process in [false, true] {
        let stack = Stack::start(4, in_process);
        let port = stack.port().to_string();
        let mut args = vec![script, &port];
        if in_process {
            args.push("--in-process");
        }
        let output = run_tool("python3", &args, None);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "in process {in_process}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("resp_multi.py: every check passed"), "{stdout}");
    }
}

/// Every reply Redis also gives, byte for byte the same as a real redis-server 7.0's for the
/// same sessions: MULTI/EXEC/DISCARD and their errors, EXECABORT after a command that fails to
/// queue, writes-only and reads-only EXECs (DEL's and UNLINK's counts in order), connection
/// commands in the queue, TYPE, STRLEN, UNLINK and their arities.
#[test]
fn transaction_replies_are_byte_for_byte_redis_s() {
    let stack = Stack::start(3, false);
    let redis = RedisServer::start();
    let sessions: &[&[&[&str]]] = &[
        &[
            &["EXEC"],
            &["DISCARD"],
            &["MULTI"],
            &["MULTI"],
            &["SET", "a", "1"],
            &["WATCH", "a"],
            &["GET"],
            &["FOO", "bar"],
            &["EXEC"],
            &["GET", "a"],
            &["EXEC"],
        ],
        &[
            &["SET", "old", "x"],
            &["MULTI"],
            &["SET", "a", "1"],
            &["MSET", "b", "2", "c", "3", "a", "4"],
            &["DEL", "a", "nothing", "old", "a"],
            &["UNLINK", "old", "b"],
            &["SET", "old", "again"],
            &["PING"],
            &["ECHO", "in the queue"],
            &["UNWATCH"],
            &["EXEC"],
            &["MGET", "a", "b", "c", "old"],
        ],
        &[
            &["MULTI"],
            &["GET", "c"],
            &["MGET", "a", "c", "old", "nothing"],
            &["EXISTS", "c", "c", "nothing"],
            &["STRLEN", "old"],
            &["STRLEN", "nothing"],
            &["TYPE", "c"],
            &["TYPE", "nothing"],
            &["SELECT", "0"],
            &["EXEC"],
        ],
        &[&["MULTI"], &["EXEC"], &["MULTI"], &["SET", "d", "1"], &["DISCARD"], &["GET", "d"], &["DISCARD"]],
        &[&["MULTI"], &["SET", "z", "1"], &["EXEC", "x"], &["EXEC"], &["GET", "z"]],
        &[
            &["SET", "s", "hello"],
            &["STRLEN", "s"],
            &["TYPE", "s"],
            &["UNLINK", "s", "nothing", "s"],
            &["TYPE", "s"],
            &["STRLEN", "s"],
            &["UNWATCH"],
            &["TYPE"],
            &["STRLEN", "a", "b"],
            &["UNLINK"],
            &["MULTI", "x"],
            &["EXEC", "x"],
            &["DISCARD", "x"],
            &["WATCH"],
            &["UNWATCH", "x"],
        ],
    ];
    for (index, session) in sessions.iter().enumerate() {
        let (mut ours, mut theirs) = (stack.connect(), connect(redis.port));
        for command in *session {
            assert_eq!(ask(&mut ours, command), ask(&mut theirs, command), "session {index}: {command:?}");
        }
    }
}

/// What rampkv refuses, and says why: a queue mixing reads and writes, WATCH, too many keys, a
/// full queue. None of them changes anything, and the connection stays usable.
#[test]
fn refused_transactions_say_why_and_change_nothing() {
    let stack = Stack::start(3, false);
    let mut stream = stack.connect();
    let queued = "+QUEUED\r\n";
    assert_eq!(ask(&mut stream, &["MULTI"]), "+OK\r\n");
    assert_eq!(ask(&mut stream, &["GET", "a"]), queued);
    assert_eq!(ask(&mut stream, &["SET", "a", "1"]), queued);
    assert_eq!(ask(&mut stream, &["DEL", "b"]), queued);
    assert_eq!(
        ask(&mut stream, &["EXEC"]),
        "-EXECABORT Transaction discarded because of: it mixes reads (GET) and writes (SET, DEL): rampkv runs a \
         transaction as read-only or write-only (RAMP); send them in two MULTI blocks\r\n"
    );
    assert_eq!(ask(&mut stream, &["GET", "a"]), "$-1\r\n", "nothing ran");
    assert_eq!(ask(&mut stream, &["EXEC"]), "-ERR EXEC without MULTI\r\n", "the queue is gone");

    let watch = ask(&mut stream, &["WATCH", "a"]);
    assert!(watch.starts_with("-ERR WATCH is not supported by rampkv: "), "{watch}");
    assert!(watch.contains("read-only or write-only (RAMP)"), "{watch}");

    // More distinct keys than one transaction takes.
    assert_eq!(ask(&mut stream, &["MULTI"]), "+OK\r\n");
    for chunk in 0..3 {
        let keys: Vec<String> = (0..100).map(|key| format!("k{}", chunk * 100 + key)).collect();
        let mut command = vec!["MGET"];
        command.extend(keys.iter().map(String::as_str));
        assert_eq!(ask(&mut stream, &command), queued);
    }
    assert_eq!(
        ask(&mut stream, &["EXEC"]),
        "-EXECABORT Transaction discarded because of: it touches 300 distinct keys, and a rampkv transaction takes \
         at most 256\r\n"
    );

    // A full queue: the command beyond the bound is refused, the queue dropped, EXEC aborts.
    assert_eq!(ask(&mut stream, &["MULTI"]), "+OK\r\n");
    let mut pings = Vec::new();
    for _ in 0..MULTI_QUEUED_COMMANDS_MAX {
        pings.extend_from_slice(&multibulk(&["PING"]));
    }
    stream.write_all(&pings).unwrap();
    assert_eq!(read_frames(&mut stream, MULTI_QUEUED_COMMANDS_MAX), queued.repeat(MULTI_QUEUED_COMMANDS_MAX));
    assert_eq!(
        ask(&mut stream, &["SET", "x", "1"]),
        format!(
            "-ERR MULTI queue full: rampkv queues at most {MULTI_QUEUED_COMMANDS_MAX} commands and \
             {MULTI_QUEUED_BYTES_MAX} bytes between MULTI and EXEC; the transaction is discarded\r\n"
        )
    );
    assert_eq!(ask(&mut stream, &["SET", "x", "2"]), queued, "as Redis after a refused command");
    assert_eq!(ask(&mut stream, &["EXEC"]), "-EXECABORT Transaction discarded because of previous errors.\r\n");
    assert_eq!(ask(&mut stream, &["GET", "x"]), "$-1\r\n");

    // The same by bytes: 64 KiB values to one key, until the queue's bytes run out.
    assert_eq!(ask(&mut stream, &["MULTI"]), "+OK\r\n");
    let value = "v".repeat(64 * 1024 - 1);
    let mut refused = None;
    for attempt in 0..MULTI_QUEUED_COMMANDS_MAX {
        let reply = ask(&mut stream, &["SET", "big", &value]);
        if reply != queued {
            refused = Some((attempt, reply));
            break;
        }
    }
    let (attempt, reply) = refused.expect("the byte bound refuses before the command bound");
    assert!(reply.starts_with("-ERR MULTI queue full"), "{reply}");
    assert!(
        attempt * value.len() <= MULTI_QUEUED_BYTES_MAX && (attempt + 1) * value.len() > MULTI_QUEUED_BYTES_MAX / 2
    );
    assert_eq!(ask(&mut stream, &["DISCARD"]), "+OK\r\n");
    assert_eq!(ask(&mut stream, &["PING"]), "+PONG\r\n", "the connection stays usable");
}

/// DEL and UNLINK inside MULTI count as if the queue ran in order; the write is one atomic
/// put_all (its versions, written together, wait out the GC grace period once their keys were
/// read, which independent one-key writes would not); a pipelined MULTI..EXEC is answered in order with what follows;
/// a connection that closes in MULTI leaves nothing behind; RESP3 gets RESP3 values.
#[test]
fn exec_counts_deletes_in_order_writes_atomically_and_forgets_closed_queues() {
    let stack = Stack::start(4, true);
    let mut stream = stack.connect();
    // One put_all, not independent one-key writes: superseded versions are kept.
    let keys: Vec<String> = (0..8).map(|key| format!("w{key}")).collect();
    let servers: std::collections::HashSet<usize> =
        keys.iter().map(|key| stack.cluster.server_of(key.as_bytes())).collect();
    assert!(servers.len() >= 2, "the keys span partitions");
    assert_eq!(stack.versions(), 0, "a fresh cluster");
    // Read before they exist: a reader may come back for their versions (issue 31: versions of
    // keys nobody read go at once, whatever wrote them).
    let mut mget = vec!["MGET"];
    mget.extend(keys.iter().map(String::as_str));
    assert_eq!(ask(&mut stream, &mget), format!("*8\r\n{}", "$-1\r\n".repeat(8)));
    for round in 0..2 {
        let mut request = multibulk(&["MULTI"]);
        for key in &keys {
            request.extend_from_slice(&multibulk(&["SET", key, &format!("v{round}")]));
        }
        request.extend_from_slice(&multibulk(&["EXEC"]));
        stream.write_all(&request).unwrap();
        let expected = format!("+OK\r\n{}*8\r\n{}", "+QUEUED\r\n".repeat(8), "+OK\r\n".repeat(8));
        assert_eq!(read_frames(&mut stream, 10), expected);
    }
    assert_eq!(stack.versions(), 16, "both rounds' versions kept: written together");

    assert_eq!(ask(&mut stream, &["MSET", "p", "1", "q", "1"]), "+OK\r\n");
    let script: &[&[&str]] = &[
        &["MULTI"],
        &["DEL", "p", "r"],    // p present before EXEC, r never written: 1
        &["SET", "p", "2"],    //
        &["DEL", "p", "p"],    // set by the queue: 1
        &["UNLINK", "p", "q"], // p deleted by the queue, q present before: 1
        &["SET", "r", "3"],
    ];
    for command in script {
        ask(&mut stream, command);
    }
    assert_eq!(ask(&mut stream, &["EXEC"]), "*5\r\n:1\r\n+OK\r\n:1\r\n:1\r\n+OK\r\n");
    assert_eq!(ask(&mut stream, &["MGET", "p", "q", "r"]), "*3\r\n$-1\r\n$-1\r\n$1\r\n3\r\n");

    // Pipelined: MULTI, the queue, EXEC and a read, in one write.
    let mut request = Vec::new();
    for command in [&["MULTI"][..], &["SET", "m1", "a"], &["SET", "m2", "b"], &["EXEC"], &["MGET", "m1", "m2"]] {
        request.extend_from_slice(&multibulk(command));
    }
    stream.write_all(&request).unwrap();
    assert_eq!(
        read_frames(&mut stream, 5),
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n+OK\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"
    );

    // A connection closed in MULTI: its queue never runs, and its session serves the next.
    let mut leaving = stack.connect();
    assert_eq!(ask(&mut leaving, &["MULTI"]), "+OK\r\n");
    assert_eq!(ask(&mut leaving, &["SET", "abandoned", "1"]), "+QUEUED\r\n");
    drop(leaving);
    let mut next = stack.connect();
    assert_eq!(ask(&mut next, &["EXEC"]), "-ERR EXEC without MULTI\r\n");
    assert_eq!(ask(&mut next, &["GET", "abandoned"]), "$-1\r\n");

    // RESP3: the queue's replies in RESP3 (a null is `_`), INFO in its place.
    assert!(ask(&mut next, &["HELLO", "3"]).starts_with('%'));
    assert_eq!(ask(&mut next, &["MULTI"]), "+OK\r\n");
    ask(&mut next, &["GET", "nothing"]);
    ask(&mut next, &["TYPE", "m1"]);
    ask(&mut next, &["INFO", "cluster"]);
    assert_eq!(ask(&mut next, &["EXEC"]), "*3\r\n_\r\n+string\r\n$30\r\n# Cluster\r\ncluster_enabled:0\r\n\r\n");
}

/// redis-cli, one command per line on one connection, as typed at its prompt: a MULTI of
/// writes, a MULTI of reads, then the refusals. What Redis also answers is compared with a real
/// redis-server's output.
#[test]
fn redis_cli_runs_multi_exec_over_several_lines() {
    let stack = Stack::start(4, false);
    let redis = RedisServer::start();
    let script = "MULTI\nSET a 1\nMSET b 2 c 3\nDEL nothing\nEXEC\nMULTI\nGET a\nMGET b c nope\nTYPE a\nSTRLEN b\n\
                  PING\nEXEC\nUNLINK a\nTYPE a\nMULTI\nDISCARD\n";
    for extra in [&[][..], &["-3"]] {
        let ours = cli_script(stack.port(), extra, script);
        assert_eq!(ours, cli_script(redis.port, extra, script), "redis-cli {extra:?}");
        assert_eq!(ours, "OK\nQUEUED\nQUEUED\nQUEUED\nOK\nOK\n0\nOK\nQUEUED\nQUEUED\nQUEUED\nQUEUED\nQUEUED\n1\n2\n3\n\nstring\n1\nPONG\n1\nnone\nOK\nOK\n");
    }
    let refused = cli_script(stack.port(), &[], "MULTI\nGET b\nSET b 9\nEXEC\nGET b\nWATCH b\n");
    let lines: Vec<&str> = refused.lines().collect();
    assert_eq!(&lines[..3], ["OK", "QUEUED", "QUEUED"], "{refused}");
    assert!(
        lines[3].starts_with("EXECABORT Transaction discarded because of: it mixes reads (GET) and writes (SET)"),
        "{refused}"
    );
    assert!(lines.contains(&"2"), "b unchanged: {refused}");
    assert!(lines.iter().any(|line| line.starts_with("ERR WATCH is not supported by rampkv")), "{refused}");
}
