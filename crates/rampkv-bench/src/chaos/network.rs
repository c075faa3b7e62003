//! Where a chaos run's server processes live: each in a network namespace of its own, as hosts
//! would be, or on loopback.
//!
//! # Namespace mode
//! As root, with `ip netns` working, a run makes (every name carries the harness's pid):
//! - `rkvchaos-<pid>-hub`: a bridge `br0` and nothing else;
//! - `rkvchaos-<pid>-cl`: the client side, 10.213.0.1/24; the harness moves its own threads here;
//! - `rkvchaos-<pid>-s<i>`: server `i`, 10.213.0.(10 + i)/24;
//!
//! each node joined to the bridge by a veth pair whose two ends are created directly inside the
//! two namespaces. Nothing is added to the namespace the harness started in: every address and
//! every packet of the run stays inside namespaces the run made. Shared-memory transports still
//! work (every namespace sees the same /dev/shm); their control connections are TCP over the
//! bridge like everything else.
//!
//! Tear-down (on drop: after a failure and during a panic too) deletes the namespaces, and with
//! them their interfaces; the servers must be dead by then (the harness kills them first). A
//! harness killed outright leaves its namespaces behind: the next run deletes the namespaces of
//! harness processes that no longer exist, killing (by pid) the orphaned servers still in them.
//!
//! # Loopback mode
//! Anywhere else: servers listen on 127.0.0.1, on ports chosen free below the kernel's
//! ephemeral range, so that no outgoing connection takes a killed server's port before it
//! comes back.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::error::{ChaosError, NamespacesFault};
use crate::limits::{CHAOS_COMMAND_TIMEOUT_MS, CHAOS_SERVERS_MAX};

/// Prefix of every namespace a chaos run makes.
const NAMESPACE_PREFIX: &str = "rkvchaos-";

/// The private /24 of namespace mode: the client is .1, server `i` is .(10 + i).
const SUBNET: [u8; 3] = [10, 213, 0];
const CLIENT_HOST: u8 = 1;
const FIRST_SERVER_HOST: u8 = 10;

/// The port every server listens on in namespace mode (each has an address of its own), and
/// the one-sided front end's control port beside it.
const NAMESPACE_SERVER_PORT: u16 = 7001;
const NAMESPACE_CONTROL_PORT: u16 = 7002;
/// Its replication port (where its primaries' records arrive) in namespace mode.
const NAMESPACE_REPLICATE_PORT: u16 = 7003;
const NAMESPACE_CONFIG_PORT: u16 = 7004;

/// Lowest port loopback mode picks; it picks below the kernel's ephemeral range.
const LOOPBACK_PORT_MIN: u16 = 20_000;

/// Attempts at finding a free loopback port.
const LOOPBACK_PORT_ATTEMPTS_MAX: u32 = 1_000;

/// Where the servers of a run live, as asked on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkChoice {
    /// Namespaces where the machine allows (root, `ip netns`), loopback otherwise.
    #[default]
    Auto,
    /// Loopback, even where namespaces would work.
    Loopback,
    /// Namespaces, or an error saying why not.
    Namespaces,
}

impl NetworkChoice {
    /// Parses `auto`, `loopback` or `namespaces`.
    ///
    /// # Errors
    /// [`ChaosError::UnknownName`] for anything else.
    pub fn from_name(name: &str) -> Result<Self, ChaosError> {
        match name {
            "auto" => Ok(NetworkChoice::Auto),
            "loopback" => Ok(NetworkChoice::Loopback),
            "namespaces" => Ok(NetworkChoice::Namespaces),
            _ => Err(ChaosError::UnknownName {
                what: "network",
                name: name.to_owned(),
                known: "auto, loopback, namespaces",
            }),
        }
    }
}

/// Where the servers of a run lived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Every server on 127.0.0.1.
    Loopback,
    /// Every server in a network namespace of its own, joined by a bridge.
    Namespaces,
}

impl NetworkMode {
    /// The word printed for it.
    pub fn label(self) -> &'static str {
        match self {
            NetworkMode::Loopback => "loopback",
            NetworkMode::Namespaces => "network namespaces",
        }
    }
}

/// The network of one run; tears itself down on drop.
#[derive(Debug)]
pub(super) struct Network {
    mode: NetworkMode,
    /// `rkvchaos-<pid>-`.
    prefix: String,
    /// Namespaces made so far, in order (deleted in reverse).
    namespaces: Vec<String>,
    /// Loopback mode: the ports of each server (listen, control).
    loopback_ports: Vec<[u16; PORTS_PER_SERVER]>,
    /// Why namespace mode was not used, when `Auto` fell back to loopback.
    pub fallback: Option<String>,
}

impl Network {
    /// Sets up the network for `servers` servers as `choice` asks.
    ///
    /// # Errors
    /// With [`NetworkChoice::Namespaces`], any failure making them; with any choice, a failure
    /// finding free ports.
    pub fn set_up(choice: NetworkChoice, servers: usize) -> Result<Network, ChaosError> {
        assert!((1..=CHAOS_SERVERS_MAX).contains(&servers), "validated by the configuration");
        let prefix = format!("{NAMESPACE_PREFIX}{}-", std::process::id());
        let mut network = Network {
            mode: NetworkMode::Loopback,
            prefix,
            namespaces: Vec::new(),
            loopback_ports: Vec::new(),
            fallback: None,
        };
        if choice != NetworkChoice::Loopback {
            match network.make_namespaces(servers) {
                Ok(()) => {
                    network.mode = NetworkMode::Namespaces;
                    return Ok(network);
                }
                Err(error @ ChaosError::NamespacesUnavailable { .. }) if choice == NetworkChoice::Namespaces => {
                    return Err(error)
                }
                // Asked for by name: whatever stopped them (a command failing, a kernel or
                // container refusing) is reported as namespaces being unavailable, with why.
                Err(error) if choice == NetworkChoice::Namespaces => {
                    return Err(ChaosError::NamespacesUnavailable { why: NamespacesFault::Setup(Box::new(error)) })
                }
                Err(error) => {
                    network.tear_down();
                    network.fallback = Some(error.to_string());
                }
            }
        }
        network.loopback_ports = free_loopback_ports(servers)?;
        Ok(network)
    }

    /// Which mode this is.
    pub fn mode(&self) -> NetworkMode {
        self.mode
    }

    /// The address server `index` listens on.
    pub fn server_address(&self, index: usize) -> SocketAddr {
        match self.mode {
            NetworkMode::Namespaces => SocketAddr::new(server_ip(index), NAMESPACE_SERVER_PORT),
            NetworkMode::Loopback => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.loopback_ports[index][0]),
        }
    }

    /// The control address of server `index`'s one-sided front end.
    pub fn control_address(&self, index: usize) -> SocketAddr {
        match self.mode {
            NetworkMode::Namespaces => SocketAddr::new(server_ip(index), NAMESPACE_CONTROL_PORT),
            NetworkMode::Loopback => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.loopback_ports[index][1]),
        }
    }

    /// The replication port of server `index` (the cluster file's `replicate`).
    pub fn replicate_address(&self, index: usize) -> SocketAddr {
        match self.mode {
            NetworkMode::Namespaces => SocketAddr::new(server_ip(index), NAMESPACE_REPLICATE_PORT),
            NetworkMode::Loopback => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.loopback_ports[index][2]),
        }
    }

    /// The configuration-service port of server `index` (the cluster file's `config`).
    pub fn config_address(&self, index: usize) -> SocketAddr {
        match self.mode {
            NetworkMode::Namespaces => SocketAddr::new(server_ip(index), NAMESPACE_CONFIG_PORT),
            NetworkMode::Loopback => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.loopback_ports[index][3]),
        }
    }

    /// A command that runs `program` where server `index` lives.
    pub fn server_command(&self, index: usize, program: &Path) -> Command {
        match self.mode {
            NetworkMode::Loopback => Command::new(program),
            NetworkMode::Namespaces => {
                // `ip netns exec` moves itself into the namespace and execs the program: the
                // child's pid is the server's.
                let mut command = Command::new("ip");
                command.args(["netns", "exec", &self.server_namespace(index)]).arg(program);
                command
            }
        }
    }

    /// Moves the calling thread into the client namespace (namespace mode; nothing on loopback)
    /// until the returned guard drops. Threads it starts meanwhile are born there too.
    ///
    /// # Errors
    /// [`ChaosError::Namespace`] if a namespace file cannot be opened or entered.
    pub fn enter_client(&self) -> Result<ClientSide, ChaosError> {
        if self.mode == NetworkMode::Loopback {
            return Ok(ClientSide { original: None });
        }
        let open =
            |path: &str| File::open(path).map_err(|error| ChaosError::Namespace { path: path.to_owned(), error });
        let original = open("/proc/thread-self/ns/net")?;
        let client_path = format!("/var/run/netns/{}", self.client_namespace());
        let client = open(&client_path)?;
        rustix::thread::move_into_link_name_space(client.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
            .map_err(|error| ChaosError::Namespace { path: client_path, error: error.into() })?;
        Ok(ClientSide { original: Some(original) })
    }

    fn hub_namespace(&self) -> String {
        format!("{}hub", self.prefix)
    }

    fn client_namespace(&self) -> String {
        format!("{}cl", self.prefix)
    }

    fn server_namespace(&self, index: usize) -> String {
        format!("{}s{index}", self.prefix)
    }

    fn make_namespaces(&mut self, servers: usize) -> Result<(), ChaosError> {
        if !rustix::process::geteuid().is_root() {
            return Err(ChaosError::NamespacesUnavailable { why: NamespacesFault::NotRoot });
        }
        remove_stale_namespaces();
        let hub = self.hub_namespace();
        self.add_namespace(&hub)?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        let client = self.client_namespace();
        self.add_node(&client, "h-cl", client_ip())?;
        for index in 0..servers {
            self.add_node(&self.server_namespace(index), &format!("h-s{index}"), server_ip(index))?;
        }
        Ok(())
    }

    fn add_namespace(&mut self, name: &str) -> Result<(), ChaosError> {
        ip(&["netns", "add", name])?;
        self.namespaces.push(name.to_owned());
        Ok(())
    }

    /// A namespace `name` with interface `veth0` at `address`, its peer `hub_end` on the bridge.
    fn add_node(&mut self, name: &str, hub_end: &str, address: IpAddr) -> Result<(), ChaosError> {
        self.add_namespace(name)?;
        let hub = self.hub_namespace();
        ip(&["link", "add", "veth0", "netns", name, "type", "veth", "peer", "name", hub_end, "netns", &hub])?;
        ip(&["-n", &hub, "link", "set", hub_end, "master", "br0"])?;
        ip(&["-n", &hub, "link", "set", hub_end, "up"])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        ip(&["-n", name, "addr", "add", &format!("{address}/24"), "dev", "veth0"])?;
        ip(&["-n", name, "link", "set", "veth0", "up"])
    }

    /// Deletes every namespace made, newest first; failures are ignored (nothing more can be
    /// done about them here, and the next run removes what is left).
    fn tear_down(&mut self) {
        while let Some(name) = self.namespaces.pop() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.tear_down();
    }
}

/// The calling thread in the client namespace; back in its own on drop.
#[derive(Debug)]
pub(super) struct ClientSide {
    original: Option<File>,
}

impl Drop for ClientSide {
    fn drop(&mut self) {
        if let Some(original) = &self.original {
            // Failing to go back leaves this thread in a namespace about to be deleted, which
            // still works for anything it does: not worth a panic.
            let _ = rustix::thread::move_into_link_name_space(
                original.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            );
        }
    }
}

fn client_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], CLIENT_HOST))
}

fn server_ip(index: usize) -> IpAddr {
    // index < CHAOS_SERVERS_MAX = 64, so the host part stays below 74.
    IpAddr::V4(Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], FIRST_SERVER_HOST + index as u8))
}

/// Runs `ip ARGS`, killed after [`CHAOS_COMMAND_TIMEOUT_MS`].
fn ip(args: &[&str]) -> Result<(), ChaosError> {
    ip_output(args).map(drop)
}

/// Runs `ip ARGS` as [`ip`] does and returns what it printed. Its output is small (a list of
/// namespaces at most), well within a pipe's buffer, so waiting before reading cannot block it.
fn ip_output(args: &[&str]) -> Result<String, ChaosError> {
    let command_line = format!("ip {}", args.join(" "));
    let mut child = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| ChaosError::NamespacesUnavailable {
            why: NamespacesFault::CannotRun { command: command_line.clone(), error },
        })?;
    let deadline = Instant::now() + Duration::from_millis(CHAOS_COMMAND_TIMEOUT_MS);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ChaosError::CommandTimeout { command: command_line, timeout_ms: CHAOS_COMMAND_TIMEOUT_MS });
            }
        }
    };
    let stdout = read_all(child.stdout.take());
    if status.success() {
        return Ok(stdout);
    }
    let stderr = read_all(child.stderr.take());
    Err(ChaosError::CommandFailed {
        command: command_line,
        status: status.to_string(),
        stderr: stderr.trim().to_owned(),
    })
}

/// What is left in a finished child's pipe (empty if it has none or cannot be read).
fn read_all(pipe: Option<impl std::io::Read>) -> String {
    let mut text = String::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_string(&mut text);
    }
    text
}

/// Deletes the namespaces of chaos runs whose harness process is gone, killing the processes
/// left in them (servers orphaned by a harness that was killed outright).
fn remove_stale_namespaces() {
    let Ok(listing) = ip_output(&["netns", "list"]) else {
        return;
    };
    for line in listing.lines() {
        // "rkvchaos-1234-s0 (id: 3)" or "rkvchaos-1234-s0".
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some(owner) = name.strip_prefix(NAMESPACE_PREFIX).and_then(|rest| rest.split('-').next()) else {
            continue;
        };
        let Ok(owner) = owner.parse::<u32>() else { continue };
        if process_alive(owner) {
            continue; // a run in progress (or a pid reused: left alone, removed later)
        }
        if let Ok(pids) = ip_output(&["netns", "pids", name]) {
            for pid in pids.split_whitespace() {
                let pid = pid.parse::<i32>().ok().and_then(rustix::process::Pid::from_raw);
                if let Some(pid) = pid {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
        let _ = ip(&["netns", "del", name]);
    }
}

/// Whether process `pid` exists and is not a zombie (a harness killed a moment ago stays one
/// until its parent reaps it).
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state is the first field after the command name, which ends at the last ')'.
    let state = stat.rfind(')').and_then(|end| stat[end + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// Loopback ports per server: listen, control, replicate.
const PORTS_PER_SERVER: usize = 4;

/// For each of `servers` servers, `PORTS_PER_SERVER` loopback ports free now (listen, control,
/// replicate, config): random ones between [`LOOPBACK_PORT_MIN`] and the kernel's ephemeral range, else
/// any free ones.
fn free_loopback_ports(servers: usize) -> Result<Vec<[u16; PORTS_PER_SERVER]>, ChaosError> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|low| low.parse::<u16>().ok()))
        .unwrap_or(32_768);
    // Not the run's seed: ports are not part of the schedule, and two runs at once must not
    // pick the same ones.
    let salt =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |time| time.as_nanos() as u64);
    let mut random = rampkv_ycsb::Random::new(salt ^ u64::from(std::process::id()));
    let mut listeners = Vec::with_capacity(PORTS_PER_SERVER * servers);
    let mut attempts = 0;
    while listeners.len() < PORTS_PER_SERVER * servers {
        attempts += 1;
        let port = if ephemeral_low > LOOPBACK_PORT_MIN + 1_000 && attempts <= LOOPBACK_PORT_ATTEMPTS_MAX {
            LOOPBACK_PORT_MIN + random.below(u64::from(ephemeral_low - LOOPBACK_PORT_MIN)) as u16
        } else {
            0
        };
        // Held until every port is found, so that no port is picked twice.
        match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            Ok(listener) => listeners.push(listener),
            Err(_) if port != 0 => continue,
            Err(error) => return Err(ChaosError::Io { what: "find a free loopback port", path: None, error }),
        }
    }
    let ports = listeners
        .iter()
        .map(|listener| listener.local_addr().map(|address| address.port()))
        .collect::<Result<Vec<u16>, _>>()
        .map_err(|error| ChaosError::Io { what: "find a free loopback port", path: None, error })?;
    Ok(ports.chunks(PORTS_PER_SERVER).map(|ports| [ports[0], ports[1], ports[2], ports[3]]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_ports_are_distinct_and_below_the_ephemeral_range() {
        let network = Network::set_up(NetworkChoice::Loopback, 5).unwrap();
        assert_eq!(network.mode(), NetworkMode::Loopback);
        let mut ports: Vec<u16> = (0..5)
            .flat_map(|index| {
                [
                    network.server_address(index),
                    network.control_address(index),
                    network.replicate_address(index),
                    network.config_address(index),
                ]
                .map(|address| address.port())
            })
            .collect();
        assert!(ports.iter().all(|port| *port >= LOOPBACK_PORT_MIN), "{ports:?}");
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 20);
    }

    #[test]
    fn namespace_addresses_stay_in_the_private_subnet() {
        assert_eq!(server_ip(0).to_string(), "10.213.0.10");
        assert_eq!(server_ip(CHAOS_SERVERS_MAX - 1).to_string(), "10.213.0.73");
        assert_eq!(client_ip().to_string(), "10.213.0.1");
    }

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(process_alive(std::process::id()));
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[test]
    fn network_names_parse() {
        assert_eq!(NetworkChoice::from_name("auto").unwrap(), NetworkChoice::Auto);
        assert_eq!(NetworkChoice::from_name("namespaces").unwrap(), NetworkChoice::Namespaces);
        assert!(NetworkChoice::from_name("wifi").unwrap_err().to_string().contains("loopback"));
    }
}
