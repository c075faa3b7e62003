//! What the RESP tests that compare rampkv's gateway with a real redis-server share: raw RESP
//! requests and replies over a socket, the Redis tools run under a timeout, and a redis-server
//! of the test's own on a free port.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rampkv::resp::codec::parse_frame;

const TOOL_TIMEOUT_SECONDS: &str = "120";
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

pub fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
    stream
}

/// Runs a tool under `timeout`; fails the test with an install hint if the tool is missing.
pub fn run_tool(tool: &str, args: &[&str], stdin: Option<&str>) -> Output {
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
        panic!("`{tool}` is not installed: apt-get install redis-tools redis-server, pip install redis (.ci/run does)");
    }
    output
}

/// One request as redis-cli sends it (an array of bulk strings).
pub fn multibulk(words: &[&str]) -> Vec<u8> {
    let mut request = format!("*{}\r\n", words.len()).into_bytes();
    for word in words {
        request.extend_from_slice(format!("${}\r\n{word}\r\n", word.len()).as_bytes());
    }
    request
}

/// Sends `words` as one request and reads its one whole reply.
pub fn ask(stream: &mut TcpStream, words: &[&str]) -> String {
    stream.write_all(&multibulk(words)).unwrap();
    read_frames(stream, 1)
}

/// Reads until `count` whole replies arrived; returns their bytes as text.
pub fn read_frames(stream: &mut TcpStream, count: usize) -> String {
    let mut reply = Vec::new();
    let mut buffer = [0u8; 65536];
    loop {
        let (mut parsed, mut offset) = (0, 0);
        while let Ok(Some((_, length))) = parse_frame(&reply[offset..]) {
            offset += length;
            parsed += 1;
        }
        if parsed >= count {
            assert_eq!(parsed, count, "more replies than asked for: {}", String::from_utf8_lossy(&reply));
            return String::from_utf8_lossy(&reply).into_owned();
        }
        match stream.read(&mut buffer) {
            Ok(0) => panic!("closed after {:?}", String::from_utf8_lossy(&reply)),
            Ok(read) => reply.extend_from_slice(&buffer[..read]),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => panic!("reading a reply: {error} (got {:?})", String::from_utf8_lossy(&reply)),
        }
    }
}

/// A real redis-server on a free port (Redis refuses port 0), killed on drop.
pub struct RedisServer {
    child: std::process::Child,
    pub port: u16,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// With more configuration (`--requirepass`, `--aclfile`): then PING answers NOAUTH, so
    /// a listening port is what says it is up.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot run redis-server ({error}): apt-get install redis-server"));
        let server = RedisServer { child, port };
        for _ in 0..500 {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
                if !extra.is_empty() || ask(&mut stream, &["PING"]) == "+PONG\r\n" {
                    return server;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not answer on port {port} within 5 s");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
