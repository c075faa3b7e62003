//! The server processes of a chaos run: started from the `rampkv` binary, killed with SIGKILL,
//! restarted on the same addresses (and data directories), and killed for good on drop.
//!
//! # Contract
//! - Each server is one `rampkv server` process, started with the cluster file the harness
//!   wrote (`--cluster`), its one-sided front end when the workload's transport needs one, and
//!   its own data directory under `--data-dir` when given (`server-<i>`, with
//!   `--appendfsync always`). Its standard output and error go to
//!   `server-<i>.log` in the run's working directory, appended across restarts.
//! - A server is *ready* when every address it serves accepts a TCP connection (probed from
//!   the client side of the network) while its process is alive. A process that exits, or is
//!   not ready within [`CHAOS_SERVER_READY_TIMEOUT_MS`], is an error quoting its log's tail.
//! - [`Servers`] kills every process it started, by pid, when dropped: after an error, during
//!   a panic's unwinding, after Ctrl-C (a paused one too: SIGKILL ends a stopped process).
//!   Nothing else ever kills them; the nemesis may stop one for a while ([`Servers::signal`]). It then removes the
//!   shared-memory regions the dead servers left in /dev/shm.
//! - A harness killed outright (SIGKILL) leaves no server behind: each server's stdin is a
//!   pipe only the harness holds, and a server started with `--exit-on-stdin-eof` exits when
//!   it closes.

use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, Seek as _, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rampkv_core::cluster::Front;
use rampkv_net::server::durable::server_data_dir;

use super::error::ChaosError;
use super::network::Network;
use crate::limits::{
    CHAOS_LOG_TAIL_LINES, CHAOS_READY_PROBE_INTERVAL_MS, CHAOS_READY_PROBE_TIMEOUT_MS, CHAOS_RESTART_ATTEMPTS_MAX,
    CHAOS_SERVER_READY_TIMEOUT_MS,
};

/// How to start the servers of one run.
#[derive(Debug, Clone)]
pub(super) struct ServerSetup {
    /// The `rampkv` binary.
    pub program: PathBuf,
    /// The cluster file every server is given.
    pub cluster_file: PathBuf,
    /// Where each server's log goes (`server-<i>.log`).
    pub log_directory: PathBuf,
    /// Each server's data directory is `server-<i>` in here.
    pub data_directory: Option<PathBuf>,
    /// The one-sided front end the workload's transport talks to, if any.
    pub front: Option<Front>,
    /// The cluster's shared secret (`--secret-file`); none: `--insecure-no-secret`.
    pub secret_file: Option<PathBuf>,
}

/// One server: its addresses and, while it runs, its process.
#[derive(Debug)]
struct Server {
    address: SocketAddr,
    control: Option<SocketAddr>,
    process: Option<Child>,
    log: PathBuf,
}

impl Server {
    /// Reaps the process if it exited (this is server `index`).
    ///
    /// # Errors
    /// [`ChaosError::ServerExited`] if it did, with its log's tail.
    fn reap_exited(&mut self, index: usize) -> Result<(), ChaosError> {
        let Some(process) = self.process.as_mut() else { return Ok(()) };
        let Ok(Some(status)) = process.try_wait() else { return Ok(()) };
        self.process = None;
        Err(ChaosError::ServerExited {
            server: index,
            status: status.to_string(),
            log: self.log.clone(),
            tail: log_tail(&self.log),
        })
    }
}

/// Every server process of a run.
#[derive(Debug)]
pub(super) struct Servers {
    setup: ServerSetup,
    servers: Vec<Server>,
}

impl Servers {
    /// The servers of `network` (none started yet).
    pub fn new(setup: ServerSetup, network: &Network, count: usize) -> Servers {
        let servers = (0..count)
            .map(|index| Server {
                address: network.server_address(index),
                control: setup.front.map(|_| network.control_address(index)),
                process: None,
                log: setup.log_directory.join(format!("server-{index}.log")),
            })
            .collect();
        Servers { setup, servers }
    }

    /// How many servers there are.
    pub fn count(&self) -> usize {
        self.servers.len()
    }

    /// The address server `index` listens on.
    pub fn address(&self, index: usize) -> SocketAddr {
        self.servers[index].address
    }

    /// The pid of server `index`, while it runs.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.servers[index].process.as_ref().map(Child::id)
    }

    /// Whether server `index` has a process (started and not killed by the harness; it may
    /// have exited on its own, which [`Servers::wait_ready`] reports).
    pub fn is_running(&self, index: usize) -> bool {
        self.servers[index].process.is_some()
    }

    /// Starts the servers `indices` (all at once: a whole cluster restarting recovers in
    /// parallel, as it would) and waits until each is ready; a start that fails (a port taken
    /// while the server was down) is tried again, [`CHAOS_RESTART_ATTEMPTS_MAX`] times in all.
    /// Returns their pids, in the order of `indices`.
    ///
    /// # Errors
    /// The first server's last error: the process could not be spawned, exited, or was not
    /// ready in time (with its log's tail).
    pub fn start_ready(
        &mut self,
        network: &Network,
        indices: &[usize],
        interrupted: &dyn Fn() -> bool,
    ) -> Result<Vec<u32>, ChaosError> {
        for &index in indices {
            self.start(network, index)?;
        }
        let mut pids = Vec::with_capacity(indices.len());
        for &index in indices {
            let mut attempt = 1;
            loop {
                match self.wait_ready(index, interrupted) {
                    Ok(()) => break,
                    Err(ChaosError::ServerExited { .. }) if attempt < CHAOS_RESTART_ATTEMPTS_MAX => {
                        attempt += 1;
                        std::thread::sleep(Duration::from_millis(100 * u64::from(attempt)));
                        self.start(network, index)?;
                    }
                    Err(error) => return Err(error),
                }
            }
            pids.push(self.pid(index).ok_or(ChaosError::ServerNotStarted { server: index })?);
        }
        Ok(pids)
    }

    /// Spawns server `index`'s process (not waiting for it to be ready).
    fn start(&mut self, network: &Network, index: usize) -> Result<(), ChaosError> {
        assert!(self.servers[index].process.is_none(), "server {index} started twice");
        let server = &self.servers[index];
        let mut command = network.server_command(index, &self.setup.program);
        command.arg("server").arg("--listen").arg(server.address.to_string());
        command.arg("--cluster").arg(&self.setup.cluster_file);
        command.arg("--fabric").arg(rampkv_net::message::fabric::fabric_choice().as_str());
        if let (Some(front), Some(control)) = (self.setup.front, server.control) {
            command.arg(front.flag()).arg(control.to_string());
        }
        match &self.setup.secret_file {
            Some(path) => command.arg("--secret-file").arg(path),
            None => command.arg("--insecure-no-secret"),
        };
        if let Some(directory) = &self.setup.data_directory {
            // `always`: an acknowledged write is on disk, so a kill -9 of every server at once
            // must lose none (what the run then checks).
            command.arg("--data-dir").arg(server_data_dir(directory, index)).args(["--appendfsync", "always"]);
        }
        let log = open_log(&server.log)?;
        let log_error = log.try_clone().map_err(|error| ChaosError::Io {
            what: "open a server log",
            path: Some(server.log.clone()),
            error,
        })?;
        // The server's stdin is a pipe whose write end only this process holds: when the
        // harness dies, even by SIGKILL, the pipe closes and the server exits
        // (`--exit-on-stdin-eof`), so no server outlives its harness.
        command.arg("--exit-on-stdin-eof");
        command.stdin(Stdio::piped()).stdout(log).stderr(log_error);
        let child = command.spawn().map_err(|error| ChaosError::Spawn { server: index, error })?;
        self.servers[index].process = Some(child);
        Ok(())
    }

    /// Waits until server `index` is ready (see the module docs).
    ///
    /// # Errors
    /// [`ChaosError::ServerExited`], [`ChaosError::ServerNotReady`], or
    /// [`ChaosError::Interrupted`].
    pub fn wait_ready(&mut self, index: usize, interrupted: &dyn Fn() -> bool) -> Result<(), ChaosError> {
        let deadline = Instant::now() + Duration::from_millis(CHAOS_SERVER_READY_TIMEOUT_MS);
        let addresses: Vec<SocketAddr> =
            std::iter::once(self.servers[index].address).chain(self.servers[index].control).collect();
        let probe_timeout = Duration::from_millis(CHAOS_READY_PROBE_TIMEOUT_MS);
        loop {
            if interrupted() {
                return Err(ChaosError::Interrupted);
            }
            let server = &mut self.servers[index];
            if server.process.is_none() {
                return Err(ChaosError::ServerNotStarted { server: index });
            }
            server.reap_exited(index)?;
            if addresses.iter().all(|address| TcpStream::connect_timeout(address, probe_timeout).is_ok()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ChaosError::ServerNotReady {
                    server: index,
                    timeout_ms: CHAOS_SERVER_READY_TIMEOUT_MS,
                    log: server.log.clone(),
                    tail: log_tail(&server.log),
                });
            }
            std::thread::sleep(Duration::from_millis(CHAOS_READY_PROBE_INTERVAL_MS));
        }
    }

    /// Checks that no server process exited on its own (a crash the run found: the harness
    /// only ever kills them itself).
    ///
    /// # Errors
    /// [`ChaosError::ServerExited`] for the first one that did, with its log's tail.
    pub fn check_alive(&mut self) -> Result<(), ChaosError> {
        for (index, server) in self.servers.iter_mut().enumerate() {
            server.reap_exited(index)?;
        }
        Ok(())
    }

    /// Kills server `index` with SIGKILL and reaps it. Returns its pid, or `None` if it had no
    /// process.
    pub fn kill(&mut self, index: usize) -> Option<u32> {
        let mut process = self.servers[index].process.take()?;
        let pid = process.id();
        // SIGKILL: the process gets no chance to flush or say goodbye, as in a power cut.
        let _ = process.kill();
        let _ = process.wait();
        Some(pid)
    }

    /// Sends server `index` `signal` (SIGSTOP or SIGCONT: a pause and its end; the process
    /// stays the harness's child, and a stopped one is still killed by [`Servers::kill`]).
    /// Returns its pid, or `None` if it has no process or the signal could not be sent.
    pub fn signal(&self, index: usize, signal: rustix::process::Signal) -> Option<u32> {
        let pid = self.pid(index)?;
        let process = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
        rustix::process::kill_process(process, signal).ok()?;
        Some(pid)
    }

    /// Kills every server (see [`Servers::kill`]).
    pub fn kill_all(&mut self) {
        for index in 0..self.servers.len() {
            self.kill(index);
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.kill_all();
        if self.setup.front.is_some() {
            // Killed servers leave their shared-memory regions behind; a server that starts
            // removes those of dead processes, but none will start after the last one dies.
            // Only files of processes that no longer exist are removed.
            let _ = rampkv_fabric::shm::cleanup_stale();
        }
    }
}

fn open_log(path: &Path) -> Result<File, ChaosError> {
    OpenOptions::new().create(true).append(true).open(path).map_err(|error| ChaosError::Io {
        what: "open a server log",
        path: Some(path.to_path_buf()),
        error,
    })
}

/// Bytes at the end of a log that [`log_tail`] looks at.
const LOG_TAIL_BYTES_MAX: u64 = 64 * 1024;

/// The last [`CHAOS_LOG_TAIL_LINES`] lines of a log (empty if it cannot be read).
pub(super) fn log_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let length = file.metadata().map_or(0, |metadata| metadata.len());
    if file.seek(SeekFrom::Start(length.saturating_sub(LOG_TAIL_BYTES_MAX))).is_err() {
        return String::new();
    }
    let mut tail = std::collections::VecDeque::with_capacity(CHAOS_LOG_TAIL_LINES);
    for line in BufReader::new(file).lines().map_while(Result::ok) {
        if tail.len() == CHAOS_LOG_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    Vec::from(tail).join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::network::NetworkChoice;

    /// A stand-in for `rampkv`: a script that ignores its arguments and sleeps, so the guard
    /// can be seen killing what it started.
    fn sleeper(directory: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = directory.join("sleeper");
        std::fs::write(&path, "#!/bin/sh\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn setup(program: PathBuf, directory: &Path) -> ServerSetup {
        ServerSetup {
            program,
            cluster_file: directory.join("cluster.toml"),
            log_directory: directory.to_path_buf(),
            data_directory: None,
            front: None,
            secret_file: None,
        }
    }

    fn alive(pid: u32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        !stat.is_empty() && !stat.contains(") Z")
    }

    #[test]
    fn every_process_started_is_killed_when_a_panic_unwinds_through_the_guard() {
        let directory = tempfile::tempdir().unwrap();
        let network = Network::set_up(NetworkChoice::Loopback, 3).unwrap();
        let mut servers = Servers::new(setup(sleeper(directory.path()), directory.path()), &network, 3);
        for index in 0..3 {
            servers.start(&network, index).unwrap();
        }
        let pids: Vec<u32> = (0..3).filter_map(|index| servers.pid(index)).collect();
        assert_eq!(pids.len(), 3);
        assert!(pids.iter().all(|pid| alive(*pid)));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _guard = servers;
            panic!("a harness bug");
        }));
        assert!(unwound.is_err());
        assert!(pids.iter().all(|pid| !alive(*pid)), "a process outlived its guard: {pids:?}");
    }

    #[test]
    fn a_process_that_exits_on_its_own_is_reported_with_its_log() {
        let directory = tempfile::tempdir().unwrap();
        let network = Network::set_up(NetworkChoice::Loopback, 1).unwrap();
        let mut servers = Servers::new(setup(PathBuf::from("false"), directory.path()), &network, 1);
        let error = servers.start_ready(&network, &[0], &|| false).unwrap_err();
        assert!(matches!(error, ChaosError::ServerExited { server: 0, .. }), "{error}");
        assert!(error.to_string().contains("server-0.log"), "{error}");
        assert!(!servers.is_running(0));
    }
}
