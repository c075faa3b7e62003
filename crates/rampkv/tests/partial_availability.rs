//! Partial availability (issue 15): one of three `rampkv server` processes is killed with
//! SIGKILL. Transactions that touch its partition fail with an error naming the partition;
//! transactions on the other partitions keep working, over every transport (tcp, sendrecv,
//! writepoll, onesided GET\* with its fallback, rfrpc) and through the RESP gateway; when the
//! server is started again on the same addresses, the clients reconnect on their own and the
//! partition works again.
//!
//! Before, one dead server failed every client for every key: the transport was broken as a
//! whole. No timing is asserted: every wait is a bounded loop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rampkv::client::{ClientError, Driver, TxnResult};
use rampkv::cluster::{Cluster, Front};
use rampkv::transport::onesided::OneSidedOptions;
use rampkv::transport::{
    ClientTransport, OneSidedClientTransport, RfRpcClientTransport, SendRecvClientTransport, TcpClientTransport,
    WritePollClientTransport,
};

/// How long a transaction may take to finish in these tests (far beyond what one takes).
const FINISH_WITHIN: Duration = Duration::from_secs(15);
/// How long the clients may take to notice the dead server, and to use the restarted one.
const NOTICE_WITHIN: Duration = Duration::from_secs(20);
const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

/// A `rampkv server` process, killed (SIGKILL) on drop.
struct ServerProcess {
    child: Child,
    address: String,
    control: String,
}

impl ServerProcess {
    /// Starts a server listening on `listen` with `front_flag` on `front_listen` and reads the
    /// addresses it reports (port 0: free ports).
    fn start(listen: &str, front_flag: &str, front_listen: &str) -> ServerProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["server", "--listen", listen, front_flag, front_listen])
            .stderr(Stdio::piped())
            .spawn()
            .expect("rampkv server starts");
        // Owned by the guard from here on, so a failed assertion below still kills it.
        let mut process = ServerProcess { child, address: String::new(), control: String::new() };
        let mut stderr = BufReader::new(process.child.stderr.take().expect("piped"));
        let mut line = String::new();
        stderr.read_line(&mut line).expect("a start-up line");
        // "rampkv server listening on A; ring control on B"
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(line.starts_with("rampkv server listening on") && words.len() == 9, "{line}");
        process.address = words[4].trim_end_matches(';').to_string();
        process.control = words[8].to_string();
        // Keep reading what it logs (a closed pipe would fail its writes).
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        process
    }

    /// Kills the process with SIGKILL (no chance to close anything) and reaps it.
    fn kill(&mut self) {
        // `Child::kill` sends SIGKILL on Unix.
        self.child.kill().expect("SIGKILL delivered");
        self.child.wait().expect("reaped");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three servers with `front_flag` and their cluster file (`front_key` names the control
/// addresses).
fn three_servers(front_flag: &str, front_key: &str, dir: &Path) -> (Vec<ServerProcess>, Cluster) {
    let servers: Vec<ServerProcess> =
        (0..3).map(|_| ServerProcess::start("127.0.0.1:0", front_flag, "127.0.0.1:0")).collect();
    let mut text = String::new();
    for server in &servers {
        text.push_str(&format!(
            "[[servers]]\naddress = \"{}\"\n{front_key} = \"{}\"\n",
            server.address, server.control
        ));
    }
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text).expect("cluster file written");
    let cluster = Cluster::from_file(&path).expect("the cluster file is valid");
    (servers, cluster)
}

/// A key named after `prefix` on each server of `cluster` (index = server).
fn key_per_server(cluster: &Cluster, prefix: &str) -> Vec<Vec<u8>> {
    (0..cluster.servers().len())
        .map(|server| {
            (0u32..100_000)
                .map(|n| format!("{prefix}-{n}").into_bytes())
                .find(|key| cluster.server_of(key) == server)
                .expect("some key lands on every server")
        })
        .collect()
}

/// One client, whatever its transport: transactions run one at a time.
trait Probe {
    fn read(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, ClientError>;
    fn write(&mut self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), ClientError>;
}

impl<T: ClientTransport> Probe for Driver<T> {
    fn read(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, ClientError> {
        self.begin_read(0, keys.to_vec())?;
        match finish(self)? {
            TxnResult::Read(outcome) => Ok(outcome.items.into_iter().map(|item| item.value.to_vec()).collect()),
            other => panic!("a read finished as {other:?}"),
        }
    }

    fn write(&mut self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), ClientError> {
        self.begin_write(0, pairs.to_vec())?;
        finish(self).map(|_| ())
    }
}

/// Steps until the one transaction in flight finishes (a step error is a failure of the whole
/// client: exactly what must no longer happen).
fn finish<T: ClientTransport>(driver: &mut Driver<T>) -> Result<TxnResult, ClientError> {
    let mut completions = Vec::new();
    let deadline = Instant::now() + FINISH_WITHIN;
    while Instant::now() < deadline {
        if let Err(error) = driver.step(Some(Duration::from_millis(20)), &mut completions) {
            panic!("the client failed as a whole: {error}");
        }
        if let Some(completion) = completions.pop() {
            return completion.result;
        }
    }
    panic!("no completion within {FINISH_WITHIN:?}");
}

/// Every transport of the cluster's front end, each a driver with one session.
fn probes(cluster: &Cluster, front: Front) -> Vec<(&'static str, Box<dyn Probe>)> {
    let controls = cluster.front_addresses(front).expect("the cluster file lists the front end");
    let tcp = TcpClientTransport::connect(cluster.servers()).expect("tcp connects");
    let mut probes: Vec<(&'static str, Box<dyn Probe>)> = vec![("tcp", Box::new(driver_of(cluster, tcp)))];
    match front {
        Front::Ring => {
            let writepoll = WritePollClientTransport::connect(&controls).expect("writepoll connects");
            let sendrecv = SendRecvClientTransport::connect(&controls).expect("sendrecv connects");
            let options = OneSidedOptions::default();
            let onesided = OneSidedClientTransport::connect(&controls, options).expect("onesided connects");
            probes.push(("writepoll", Box::new(driver_of(cluster, writepoll))));
            probes.push(("sendrecv", Box::new(driver_of(cluster, sendrecv))));
            probes.push(("onesided", Box::new(driver_of(cluster, onesided))));
        }
        Front::RfRpc => {
            let rfrpc = RfRpcClientTransport::connect(&controls).expect("rfrpc connects");
            probes.push(("rfrpc", Box::new(driver_of(cluster, rfrpc))));
        }
    }
    probes
}

fn driver_of<T: ClientTransport + 'static>(cluster: &Cluster, transport: T) -> Driver<T> {
    Driver::connect(transport, cluster.clone(), 1).expect("the driver connects")
}

fn value(name: &str, round: &str, key: usize) -> Vec<u8> {
    format!("{name}-{round}-{key}").into_bytes()
}

/// Runs the scenario over every transport of `front`: writes before the kill, SIGKILL of
/// server 1, what fails and what works, the restart, the recovery.
fn scenario(front_flag: &str, front_key: &str, front: Front) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (mut servers, cluster) = three_servers(front_flag, front_key, dir.path());
    let dead = cluster.partition_of(&key_per_server(&cluster, "any")[1]);
    // Each transport has keys of its own (one per partition).
    let mut probes: Vec<_> = probes(&cluster, front)
        .into_iter()
        .map(|(name, probe)| (name, probe, key_per_server(&cluster, name)))
        .collect();

    // Before: every transaction works. Each transport writes its own values and reads them
    // (onesided reads again so that its address cache holds the slots: GET* then reads them).
    for (name, probe, keys) in &mut probes {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..3).map(|k| (keys[k].clone(), value(name, "before", k))).collect();
        probe.write(&pairs).unwrap_or_else(|error| panic!("{name}: {error}"));
        for _ in 0..2 {
            let read = probe.read(keys).unwrap_or_else(|error| panic!("{name}: {error}"));
            assert_eq!(read, (0..3).map(|k| value(name, "before", k)).collect::<Vec<_>>(), "{name}");
        }
    }

    servers[1].kill();
    let (address, control) = (servers[1].address.clone(), servers[1].control.clone());

    for (name, probe, keys) in &mut probes {
        // A read of the dead partition alone fails, naming it. (A read in the instant before
        // the client notices may still be served: by GET* from the dead server's last slots,
        // which hold the last values; it must then be those.)
        let deadline = Instant::now() + NOTICE_WITHIN;
        for tries in 1.. {
            match probe.read(&keys[1..2]) {
                Err(ClientError::Unavailable { partitions }) => {
                    assert_eq!(partitions, vec![dead], "{name}");
                    eprintln!("{name}: partition {dead} unavailable at read {tries} after the kill");
                    break;
                }
                Ok(read) => assert_eq!(read, vec![value(name, "before", 1)], "{name}: a stale read is the last value"),
                Err(error) => panic!("{name}: expected the partition unavailable, got {error}"),
            }
            assert!(Instant::now() < deadline, "{name}: the dead server was not noticed");
            std::thread::sleep(Duration::from_millis(20));
        }
        // From now on, every transaction that touches it fails with the partition named, and
        // the error says so in words.
        let spanning = probe.read(&[keys[0].clone(), keys[1].clone()]).unwrap_err();
        assert!(
            matches!(&spanning, ClientError::Unavailable { partitions } if *partitions == vec![dead]),
            "{name}: {spanning}"
        );
        assert!(spanning.to_string().contains(&format!("partitions [{dead}] are unavailable")), "{name}: {spanning}");
        let write = probe.write(&[(keys[1].clone(), b"x".to_vec()), (keys[2].clone(), b"x".to_vec())]).unwrap_err();
        assert!(
            matches!(&write, ClientError::Unavailable { partitions } if *partitions == vec![dead]),
            "{name}: {write}"
        );
        // The other partitions keep working: reads see what was written, writes commit.
        let live = [keys[0].clone(), keys[2].clone()];
        let read = probe.read(&live).unwrap_or_else(|error| panic!("{name}: live partitions failed: {error}"));
        assert_eq!(read, vec![value(name, "before", 0), value(name, "before", 2)], "{name}");
        let pairs = vec![(keys[0].clone(), value(name, "during", 0)), (keys[2].clone(), value(name, "during", 2))];
        probe.write(&pairs).unwrap_or_else(|error| panic!("{name}: live partitions failed: {error}"));
        let read = probe.read(&live).unwrap_or_else(|error| panic!("{name}: live partitions failed: {error}"));
        assert_eq!(read, vec![value(name, "during", 0), value(name, "during", 2)], "{name}");
    }

    // The server comes back on the same addresses (empty: it has no data directory).
    servers[1] = ServerProcess::start(&address, front_flag, &control);
    for (name, probe, keys) in &mut probes {
        let deadline = Instant::now() + NOTICE_WITHIN;
        for tries in 1.. {
            match probe.write(&[(keys[1].clone(), value(name, "after", 1))]) {
                Ok(()) => {
                    eprintln!("{name}: partition {dead} written again at try {tries} after the restart");
                    break;
                }
                Err(ClientError::Unavailable { partitions }) => assert_eq!(partitions, vec![dead], "{name}"),
                Err(error) => panic!("{name}: expected the partition unavailable or working, got {error}"),
            }
            assert!(Instant::now() < deadline, "{name}: the client did not reconnect to the restarted server");
            std::thread::sleep(Duration::from_millis(50));
        }
        let read = probe.read(keys).unwrap_or_else(|error| panic!("{name}: after the restart: {error}"));
        assert_eq!(read, vec![value(name, "during", 0), value(name, "after", 1), value(name, "during", 2)], "{name}");
    }
}

#[test]
fn a_killed_server_fails_only_its_partition_over_tcp_and_the_ring_transports_and_clients_reconnect() {
    scenario("--ring-listen", "ring", Front::Ring);
}

#[test]
fn a_killed_server_fails_only_its_partition_over_rfrpc_and_clients_reconnect() {
    scenario("--rfrpc-listen", "rfrpc", Front::RfRpc);
}

/// A RESP gateway process in front of the cluster, killed on drop.
struct GatewayProcess(Child);

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends one inline command and reads its one-line reply.
fn command(stream: &mut TcpStream, line: &str) -> String {
    stream.write_all(format!("{line}\r\n").as_bytes()).expect("the gateway takes the command");
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => reply.push(byte[0]),
            other => panic!("reading the reply to {line}: {other:?} after {:?}", String::from_utf8_lossy(&reply)),
        }
    }
    // A bulk string: its header line, then the value line.
    if reply.starts_with(b"$") && reply != b"$-1\r\n" {
        let mut value = Vec::new();
        while !value.ends_with(b"\r\n") {
            stream.read_exact(&mut byte).expect("the bulk string's value");
            value.push(byte[0]);
        }
        return String::from_utf8_lossy(&value).trim_end().to_string();
    }
    String::from_utf8_lossy(&reply).trim_end().to_string()
}

#[test]
fn the_gateway_answers_clusterdown_naming_the_dead_partition_and_serves_the_others() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (mut servers, cluster) = three_servers("--ring-listen", "ring", dir.path());
    let keys: Vec<String> =
        key_per_server(&cluster, "resp").into_iter().map(|key| String::from_utf8(key).expect("ascii")).collect();
    let dead = cluster.partition_of(keys[1].as_bytes());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
        .args(["gateway", "--listen", &listen, "--cluster"])
        .arg(dir.path().join("cluster.toml"))
        .stderr(Stdio::null())
        .spawn()
        .expect("rampkv gateway starts");
    let _gateway = GatewayProcess(child);
    let mut stream = (0..500)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            TcpStream::connect(&listen).ok()
        })
        .expect("the gateway listens within 5 s");
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
    for (index, key) in keys.iter().enumerate() {
        assert_eq!(command(&mut stream, &format!("SET {key} before{index}")), "+OK");
    }

    servers[1].kill();
    let deadline = Instant::now() + NOTICE_WITHIN;
    let expected = format!("-CLUSTERDOWN rampkv: partitions [{dead}] are unavailable");
    loop {
        let reply = command(&mut stream, &format!("GET {}", keys[1]));
        if reply.starts_with(&expected) {
            break;
        }
        assert_eq!(reply, "before1", "before the gateway notices, the last value");
        assert!(Instant::now() < deadline, "the gateway did not notice the dead server");
        std::thread::sleep(Duration::from_millis(20));
    }
    let spanning = command(&mut stream, &format!("MSET {} x {} x", keys[0], keys[1]));
    assert!(spanning.starts_with(&expected), "{spanning}");
    assert_eq!(command(&mut stream, &format!("GET {}", keys[0])), "before0");
    assert_eq!(command(&mut stream, &format!("MSET {} during0 {} during2", keys[0], keys[2])), "+OK");
    assert_eq!(command(&mut stream, &format!("GET {}", keys[2])), "during2");
    assert_eq!(command(&mut stream, "PING"), "+PONG");

    let (address, control) = (servers[1].address.clone(), servers[1].control.clone());
    servers[1] = ServerProcess::start(&address, "--ring-listen", &control);
    let deadline = Instant::now() + NOTICE_WITHIN;
    loop {
        let reply = command(&mut stream, &format!("SET {} after1", keys[1]));
        if reply == "+OK" {
            break;
        }
        assert!(reply.starts_with(&expected), "{reply}");
        assert!(Instant::now() < deadline, "the gateway did not reconnect to the restarted server");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(command(&mut stream, &format!("GET {}", keys[1])), "after1");
    assert_eq!(command(&mut stream, &format!("GET {}", keys[0])), "during0");
}
