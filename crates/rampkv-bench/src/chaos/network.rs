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
//! # Partitions (namespace mode only)
//! [`Network::cut_off`] cuts one server off from every other server, and so from the
//! configuration service they all run, while the client namespace still reaches it: in the
//! victim's namespace every packet *from* another server is dropped, and in every other
//! server's namespace every packet from the victim, by `ip rule ... blackhole` rules (policy
//! routing, part of iproute2: no firewall needed). Dropping on arrival is silent, as a network
//! that loses packets is: a connection attempt hangs until its timeout and an open connection
//! stalls, rather than failing at once as a local "no route" would. A rule must come before the
//! `local` table's (preference 0) to apply to packets for the namespace's own address, so while
//! a server is cut off its namespace looks the `local` table up at preference
//! [`CUT_LOCAL_PREFERENCE`] instead, after the drop rules at [`CUT_DROP_PREFERENCE`]. Healing
//! undoes every step in reverse (the `local` rule back at 0), on every path: [`Cut::heal`], or
//! the guard's drop after an error or during a panic; and the namespaces go at the end of the
//! run whatever is left in them.
//!
//! # Loopback mode
//! Anywhere else: servers listen on 127.0.0.1, on ports chosen free below the kernel's
//! ephemeral range, so that no outgoing connection takes a killed server's port before it
//! comes back.

use std::fs::File;
use std::marker::PhantomData;
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

/// Preference of the rules that drop a cut-off server's packets (before the `local` table's).
const CUT_DROP_PREFERENCE: &str = "100";
/// Preference the `local` table is looked up at while a partition is in place (after the drop
/// rules; the main table's is 32766).
const CUT_LOCAL_PREFERENCE: &str = "200";

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

    /// Cuts server `victim` off from the other `servers - 1` servers (every packet between it
    /// and any of them is dropped on arrival, both ways) while the client namespace still
    /// reaches it: module docs, "Partitions". Healed by [`Cut::heal`], or when the guard drops.
    ///
    /// # Errors
    /// [`ChaosError::PartitionNeedsNamespaces`] in loopback mode; an `ip` command that failed
    /// or timed out (what was already done is undone first).
    pub fn cut_off(&self, victim: usize, servers: usize) -> Result<Cut<'_>, ChaosError> {
        if self.mode != NetworkMode::Namespaces {
            return Err(ChaosError::PartitionNeedsNamespaces { why: self.fallback.clone() });
        }
        assert!(victim < servers && servers <= CHAOS_SERVERS_MAX, "a server of the run");
        let mut cut = Cut { network: PhantomData, undo: Vec::new() };
        let others: Vec<usize> = (0..servers).filter(|server| *server != victim).collect();
        // In the victim's namespace: drop what any other server sends it.
        let victim_drops: Vec<IpAddr> = others.iter().map(|other| server_ip(*other)).collect();
        cut.drop_from(&self.server_namespace(victim), &victim_drops)?;
        // In each other server's namespace: drop what the victim sends it.
        for other in others {
            cut.drop_from(&self.server_namespace(other), &[server_ip(victim)])?;
        }
        Ok(cut)
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

/// A partition in place ([`Network::cut_off`]): the steps taken, each with the command that
/// undoes it. Healed on drop if [`Cut::heal`] was not called.
#[derive(Debug)]
pub(super) struct Cut<'a> {
    /// The namespaces it changed belong to the network: it must not outlive them.
    network: PhantomData<&'a Network>,
    /// `ip` arguments undoing each step taken so far, in the order taken.
    undo: Vec<Vec<String>>,
}

impl Cut<'_> {
    /// In `namespace`, drops every packet arriving from `sources`, recording how to undo it.
    fn drop_from(&mut self, namespace: &str, sources: &[IpAddr]) -> Result<(), ChaosError> {
        for source in sources {
            let source = source.to_string();
            self.step(
                &["-n", namespace, "rule", "add", "pref", CUT_DROP_PREFERENCE, "from", &source, "blackhole"],
                &["-n", namespace, "rule", "del", "pref", CUT_DROP_PREFERENCE, "from", &source, "blackhole"],
            )?;
        }
        // The drop rules must come before the local table: look it up after them instead of at 0
        // (added before the one at 0 goes, so the namespace always has one).
        self.step(
            &["-n", namespace, "rule", "add", "pref", CUT_LOCAL_PREFERENCE, "lookup", "local"],
            &["-n", namespace, "rule", "del", "pref", CUT_LOCAL_PREFERENCE, "lookup", "local"],
        )?;
        self.step(
            &["-n", namespace, "rule", "del", "pref", "0", "lookup", "local"],
            &["-n", namespace, "rule", "add", "pref", "0", "lookup", "local"],
        )
    }

    /// Runs `ip DO`; if it succeeded, remembers `ip UNDO`. On failure undoes everything so far.
    fn step(&mut self, command: &[&str], undo: &[&str]) -> Result<(), ChaosError> {
        if let Err(error) = ip(command) {
            let _ = self.undo_all();
            return Err(error);
        }
        self.undo.push(undo.iter().map(|argument| (*argument).to_owned()).collect());
        Ok(())
    }

    /// Undoes every step, newest first; every one is tried. Returns the first failure.
    fn undo_all(&mut self) -> Result<(), ChaosError> {
        let mut first_error = None;
        while let Some(undo) = self.undo.pop() {
            let arguments: Vec<&str> = undo.iter().map(String::as_str).collect();
            if let Err(error) = ip(&arguments) {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Heals the partition: every rule it added removed, the `local` table back at 0.
    ///
    /// # Errors
    /// The first `ip` command that failed (every other step is still undone; the namespaces
    /// are deleted at the end of the run whatever is left).
    pub fn heal(mut self) -> Result<(), ChaosError> {
        self.undo_all()
    }
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        // After an error or during a panic: nothing more can be done about a failure here.
        let _ = self.undo_all();
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

    /// Runs `work` on a thread that entered network namespace `name`.
    fn in_namespace<T: Send + 'static>(name: String, work: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            let namespace = File::open(format!("/var/run/netns/{name}")).unwrap();
            rustix::thread::move_into_link_name_space(
                namespace.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            work()
        })
        .join()
        .unwrap()
    }

    /// Whether a TCP connection from namespace `from` to `to` is accepted within 300 ms.
    fn connects(from: String, to: SocketAddr) -> bool {
        in_namespace(from, move || std::net::TcpStream::connect_timeout(&to, Duration::from_millis(300)).is_ok())
    }

    /// A partition is exactly what the nemesis promises: the victim and the other servers no
    /// longer reach each other (silently: a connection attempt times out), the client side
    /// still reaches the victim, and healing (or dropping the guard) puts every rule back.
    /// Needs root and `ip netns` (else there is nothing to test: namespace mode is refused).
    #[test]
    fn a_cut_separates_the_victim_from_the_servers_not_the_clients_and_heals_completely() {
        let network = match Network::set_up(NetworkChoice::Namespaces, 3) {
            Ok(network) => network,
            Err(error) => return eprintln!("no network namespaces here, nothing to test: {error}"),
        };
        let rules = |index: usize| ip_output(&["-n", &network.server_namespace(index), "rule"]).unwrap();
        let before: Vec<String> = (0..3).map(rules).collect();
        // A listener on the victim's address (server 1), as its servers' ports would be.
        let victim = SocketAddr::new(server_ip(1), 7999);
        let _listener = in_namespace(network.server_namespace(1), move || TcpListener::bind(victim).unwrap());
        assert!(connects(network.server_namespace(0), victim) && connects(network.client_namespace(), victim));

        let cut = network.cut_off(1, 3).unwrap();
        assert!(rules(1).contains("from 10.213.0.10 blackhole") && rules(1).contains("from 10.213.0.12 blackhole"));
        assert!(rules(0).contains("from 10.213.0.11 blackhole") && !rules(0).contains("from 10.213.0.12"));
        assert!(!connects(network.server_namespace(0), victim), "another server still reaches the victim");
        assert!(!connects(network.server_namespace(2), victim), "another server still reaches the victim");
        assert!(connects(network.client_namespace(), victim), "the clients no longer reach the victim");
        cut.heal().unwrap();
        assert_eq!((0..3).map(rules).collect::<Vec<_>>(), before);
        assert!(connects(network.server_namespace(0), victim));

        // A guard dropped without `heal` (an error, a panic) heals too.
        drop(network.cut_off(2, 3).unwrap());
        assert_eq!((0..3).map(rules).collect::<Vec<_>>(), before);
    }

    #[test]
    fn a_cut_needs_namespaces() {
        let network = Network::set_up(NetworkChoice::Loopback, 3).unwrap();
        let error = network.cut_off(0, 3).unwrap_err();
        assert!(matches!(error, ChaosError::PartitionNeedsNamespaces { .. }), "{error}");
    }

    #[test]
    fn network_names_parse() {
        assert_eq!(NetworkChoice::from_name("auto").unwrap(), NetworkChoice::Auto);
        assert_eq!(NetworkChoice::from_name("namespaces").unwrap(), NetworkChoice::Namespaces);
        assert!(NetworkChoice::from_name("wifi").unwrap_err().to_string().contains("loopback"));
    }
}
