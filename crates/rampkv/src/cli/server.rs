//! `rampkv server`: one server (one store) on its own, with what the cluster file gives it:
//! cooperative termination (recovery), replication to backups and failover through the
//! configuration service, and optionally a one-sided front end (ring or rfrpc).
//!
//! # Contract
//! Nothing listens before the checks that can refuse the start have passed: protected mode
//! for the binary ports (no secret, an address other than loopback), the listen address being
//! in the cluster file, and (bootstrapping a replicated cluster) the first lease from the
//! configuration service. A log that stops working, or (with `--exit-on-stdin-eof`) a closed
//! standard input, takes the process down with status 1.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use rampkv::auth::SharedSecret;
use rampkv::cluster::{Cluster, Front};
use rampkv::item_slots::ItemSlotConfig;
use rampkv::limits::GC_GRACE_MS;
use rampkv::recovery::{StartRecovery, RECOVERY_TIMEOUT_MS};
use rampkv::server::front::FrontEnd;
use rampkv::server::resume::ServerStart;
use rampkv::server::{
    ConnectionLimits, Durability, FailoverOptions, ReplicationMedium, ReplicationOptions, ReplicationPeers,
    ServerConfig, ServerGroup, ServerOptions,
};

use super::args::{FabricArgs, PersistenceArgs, SecretArgs};
use super::output::say;

#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// Address to listen on, e.g. 127.0.0.1:7001.
    #[arg(long)]
    listen: SocketAddr,
    /// How long superseded versions stay readable, in milliseconds.
    #[arg(long, default_value_t = GC_GRACE_MS)]
    gc_grace_ms: u64,
    /// The cluster this server belongs to (its --listen address must be listed): enables
    /// cooperative termination of transactions whose writer died.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Also serve the ring transports (writepoll, sendrecv, onesided) over the shared-memory
    /// fabric, with their control port on ADDR; list it as `ring = "ADDR"` in the cluster
    /// file. Clients must run on this machine (/dev/shm).
    #[arg(long, value_name = "ADDR", conflicts_with = "rfrpc_listen")]
    ring_listen: Option<SocketAddr>,
    /// Also serve remote-fetch RPC (rfrpc), control port on ADDR (`rfrpc = "ADDR"`). A
    /// server has one one-sided front end: this or --ring-listen.
    #[arg(long, value_name = "ADDR")]
    rfrpc_listen: Option<SocketAddr>,
    /// With --ring-listen: item slots for GET* (onesided); 0: none, onesided reads use GET+.
    #[arg(long, default_value_t = rampkv::limits::ITEM_SLOTS_DEFAULT)]
    item_slots: usize,
    /// With --ring-listen: bytes per item slot (versions that do not fit are read over GET+).
    #[arg(long, default_value_t = rampkv::limits::ITEM_SLOT_BYTES_DEFAULT)]
    item_slot_bytes: usize,
    #[command(flatten)]
    secret: SecretArgs,
    /// Protected mode for the binary ports: a server without --secret-file refuses to listen
    /// (data, ring or rfrpc port) on an address other than loopback. This flag lets it,
    /// open to anyone who can reach it.
    #[arg(long)]
    insecure_no_secret: bool,
    /// Close a TCP connection that sent no request for SECONDS (0: never), as Redis's
    /// `timeout`. Clients reconnect only when a transaction fails, so set it only where
    /// idle connections must not hold the server's connection slots.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    timeout: u64,
    #[command(flatten)]
    persistence: PersistenceArgs,
    /// Exit (status 1) when standard input reaches its end: a supervisor that holds the
    /// write end of a pipe as the server's stdin takes its server down with it, even when it
    /// is killed with SIGKILL (the fault test, `rampkv chaos`, does).
    #[arg(long)]
    exit_on_stdin_eof: bool,
    /// With `replicas` above 1 in the cluster file: how records reach the backups. tcp:
    /// messages on the replication port; onesided: one-sided writes into a log region each
    /// backup registers on this process's fabric (FaRM's way: shared memory with a backup on
    /// this host, RDMA WRITE with one on another host when both have RDMA; a backup reached
    /// by neither gets TCP, said in a log line). Default: onesided when every server's
    /// `replicate` address is a loopback one or this process has an RDMA port (`--fabric`),
    /// tcp otherwise. A backup takes either.
    #[arg(long, value_name = "MEDIUM")]
    replication_medium: Option<ReplicationMedium>,
    #[command(flatten)]
    fabric: FabricArgs,
}

pub(crate) fn run(args: ServerArgs) -> Result<ExitCode> {
    let ServerArgs {
        listen,
        gc_grace_ms,
        cluster,
        ring_listen,
        rfrpc_listen,
        item_slots,
        item_slot_bytes,
        secret,
        insecure_no_secret,
        timeout,
        persistence,
        exit_on_stdin_eof,
        replication_medium,
        fabric,
    } = args;
    if exit_on_stdin_eof {
        watch_stdin().context("cannot watch standard input (--exit-on-stdin-eof)")?;
    }
    let secret = secret.install()?;
    fabric.install()?;
    let addresses: Vec<SocketAddr> = [Some(listen), ring_listen, rfrpc_listen].into_iter().flatten().collect();
    if let Some(refusal) = binary_protected_mode_refusal(&addresses, secret.is_some(), insecure_no_secret) {
        bail!(refusal); // before anything listens
    }
    let idle_timeout_ms = timeout.checked_mul(1_000).context("--timeout is out of range")?;
    let limits = ConnectionLimits { idle_timeout_ms, ..ConnectionLimits::default() };
    let durability = persistence.durability().map(|(dir, config)| Durability { dirs: vec![dir], config });
    let has_cluster = cluster.is_some();
    // The cluster file first: it says where this server is and whether it replicates.
    let membership = cluster.as_deref().map(|path| membership(path, listen)).transpose()?;
    let data_dir = durability.as_ref().and_then(|durability| durability.dirs.first()).cloned();
    let (failover, start) = start_failover(membership.as_ref(), secret.as_ref(), data_dir)?;
    let rejoined = match &start {
        Some(ServerStart::Rejoin { why }) => Some(*why),
        _ => None,
    };
    let replication = match &membership {
        // A server that holds nothing ships records to no backup until it is primary of
        // something and a backup catches up from it; its port takes catching-up copies. One
        // that resumes ships to the backups the configuration counts.
        Some((file, index)) if file.replicas() > 1 => {
            let addresses = file.replicate_addresses()?;
            let medium = replication_medium
                .unwrap_or_else(|| ReplicationMedium::for_process(addresses.iter().map(String::as_str)));
            let base = ReplicationOptions::new(file.replicas());
            let (epoch, resume) = match &start {
                Some(ServerStart::Resume { epoch, backups }) => (*epoch, Some(backups.clone())),
                _ => (base.epoch, None),
            };
            Some(ReplicationOptions {
                peers: Some(ReplicationPeers { first_index: *index, addresses }),
                rejoining: rejoined.is_some(),
                resume,
                epoch,
                medium,
                ..base
            })
        }
        _ => None,
    };
    if let Some(why) = rejoined {
        say!(
            "rampkv server: {why}; it serves no partition until the configuration service names it a backup, it \
             catches up from the primary and is promoted in a later failover (rejoin)"
        );
    }
    if let Some(ServerStart::Resume { epoch, .. }) = &start {
        say!(
            "rampkv server: resumes from its data directory what the configuration (epoch {epoch}) still gives \
             this process"
        );
    }
    let options = ServerOptions { secret, limits, durability, replication, failover };
    let mut group = spawn_servers(&[ServerConfig { listen, gc_grace_ms }], &options, "rampkv server")
        .with_context(|| format!("cannot start the server on {listen}"))?;
    let in_doubt = group.cores()[0].store().stats().pending_transactions;
    if in_doubt > 0 && !has_cluster {
        say!(
            "rampkv server: {in_doubt} transactions recovered in doubt (prepared, never committed or aborted) \
             stay undecided: give --cluster FILE so that cooperative termination can ask the other servers"
        );
    }
    if let Some((cluster, index)) = membership {
        say_replication(&group, &cluster, index, rejoined.is_some());
        group.start_recovery(cluster, index, RECOVERY_TIMEOUT_MS).context("cannot start recovery")?;
    }
    let slots = ItemSlotConfig { slots: item_slots, slot_bytes: item_slot_bytes };
    let front = start_front(&group, ring_listen, rfrpc_listen, slots)?;
    match &front {
        Some(front) => say!(
            "rampkv server listening on {}; {} control on {}",
            group.addresses()[0],
            front.kind().key(),
            front.control_addresses()[0]
        ),
        None => say!("rampkv server listening on {}", group.addresses()[0]),
    }
    group.wait().context("server failed")?;
    drop(front);
    Ok(ExitCode::SUCCESS)
}

/// The cluster file at `path` and this server's index in it (the server listed as `listen`).
fn membership(path: &Path, listen: SocketAddr) -> Result<(Cluster, usize)> {
    let file = Cluster::from_file(path)?;
    let index = file.servers().iter().position(|address| {
        address.parse::<SocketAddr>().is_ok_and(|address| address == listen) || *address == listen.to_string()
    });
    let Some(index) = index else {
        bail!("{listen} is not one of the servers in {}", path.display());
    };
    Ok((file, index))
}

/// Failover needs the configuration service: a replicated cluster file whose servers have
/// `config` addresses. Its node starts first and decides how the server starts
/// (`rampkv::server::resume`): with the cluster (after its first lease), into a running cluster
/// as a process that holds nothing (rejoin), or resuming from its data directory what the
/// configuration still gives its process. Returns the failover options and that start.
fn start_failover(
    membership: Option<&(Cluster, usize)>,
    secret: Option<&Arc<SharedSecret>>,
    data_dir: Option<PathBuf>,
) -> Result<(Option<FailoverOptions>, Option<ServerStart>)> {
    let Some((file, index)) = membership.filter(|(file, _)| file.replicas() > 1 && file.config_addresses().is_ok())
    else {
        return Ok((None, None));
    };
    let started = rampkv::server::resume::start_config_node(file, *index, secret.cloned(), data_dir.as_deref())
        .context("cannot start the configuration service")?;
    let options = FailoverOptions {
        gate: started.gate,
        cluster: file.clone(),
        index: *index,
        state: started.state,
        state_dir: data_dir,
    };
    Ok((Some(options), Some(started.start)))
}

/// Says how a replicated server's writes reach its backups (nothing for an unreplicated one).
fn say_replication(group: &ServerGroup, cluster: &Cluster, index: usize, rejoined: bool) {
    let Some(port) = group.backups().first() else { return };
    let replicas = cluster.replicas();
    let backups = rampkv::config::configuration::backups_of(index as u16, cluster.servers().len(), replicas);
    if rejoined {
        say!(
            "rampkv server: {replicas} copies of every partition; replication port {}; a backup of nothing until \
             it catches up",
            port.address()
        );
    } else {
        say!(
            "rampkv server: {replicas} copies of every partition; replication port {}; writes acknowledged once \
             servers {backups:?} applied them",
            port.address()
        );
    }
}

/// The one-sided front end `--ring-listen` or `--rfrpc-listen` asks for, if any; `slots` are
/// the ring's item slots (none when `--item-slots 0`).
fn start_front(
    group: &ServerGroup,
    ring_listen: Option<SocketAddr>,
    rfrpc_listen: Option<SocketAddr>,
    slots: ItemSlotConfig,
) -> Result<Option<FrontEnd>> {
    match (ring_listen, rfrpc_listen) {
        (Some(control), _) => {
            let slots = match slots.slots {
                0 => None,
                _ => Some(slots),
            };
            if let Some(slots) = slots {
                slots.validate().map_err(|why| anyhow::anyhow!("--item-slots/--item-slot-bytes: {why}"))?;
            }
            Some(FrontEnd::spawn(group, Front::Ring, control, slots))
        }
        (None, Some(control)) => Some(FrontEnd::spawn(group, Front::RfRpc, control, None)),
        (None, None) => None,
    }
    .transpose()
    .context("cannot start the one-sided front end")
}

/// Protected mode for the binary ports (Redis's, for the RESP port): a server without a shared
/// secret that would listen on an address other than loopback refuses to start, unless
/// `--insecure-no-secret`. The refusal, if any.
fn binary_protected_mode_refusal(addresses: &[SocketAddr], secret: bool, insecure_no_secret: bool) -> Option<String> {
    if secret || insecure_no_secret {
        return None;
    }
    let open = addresses.iter().find(|address| !address.ip().is_loopback())?;
    Some(format!(
        "protected mode: without --secret-file this server would let anyone who reaches {open} read and write \
         every key; give it --secret-file FILE (the same file on every server and client), listen on a loopback \
         address, or pass --insecure-no-secret"
    ))
}

/// Starts the servers of `configs` with `options`, and prints what each recovery found (with
/// persistence: one data directory per server). `rampkv local` starts its servers here too.
pub(crate) fn spawn_servers(configs: &[ServerConfig], options: &ServerOptions, command: &str) -> Result<ServerGroup> {
    let (group, reports) = ServerGroup::start(configs, options).context("cannot start the servers")?;
    let Some(durability) = &options.durability else {
        return Ok(group);
    };
    for ((dir, report), address) in durability.dirs.iter().zip(&reports).zip(group.addresses()) {
        say!("{command}: {address} recovered {} (appendfsync {}): {report}", dir.display(), durability.config.policy);
    }
    // A log that stops (a failed write or fsync) takes the process with it: nothing more can be
    // made durable, and the replies waiting for it are never sent.
    let servers = Arc::clone(group.servers());
    let command = command.to_owned();
    std::thread::Builder::new().name("rampkv-log-watch".into()).spawn(move || loop {
        std::thread::sleep(Duration::from_millis(PERSISTENCE_WATCH_MS));
        if let Some((index, error)) = servers.persistence_failure() {
            say!("{command}: the log of server {index} failed: {error}; stopping (restart to recover from the files)");
            std::process::exit(1);
        }
        if let Some((index, error)) = servers.copy_failure() {
            say!("{command}: server {index} cannot keep a backup copy on disk: {error}; stopping");
            std::process::exit(1);
        }
    })?;
    Ok(group)
}

/// How often a server process checks that its logs still work.
const PERSISTENCE_WATCH_MS: u64 = 100;

/// Exits the process once standard input reaches its end or fails (`--exit-on-stdin-eof`).
fn watch_stdin() -> std::io::Result<()> {
    std::thread::Builder::new().name("rampkv-stdin".into()).spawn(|| {
        let mut buffer = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        loop {
            match std::io::Read::read(&mut stdin, &mut buffer) {
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(0) | Err(_) => {
                    eprintln!("rampkv server: standard input closed (--exit-on-stdin-eof): exiting");
                    std::process::exit(1);
                }
                Ok(_) => {}
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protected_mode_for_the_binary_ports_refuses_only_open_servers_without_a_secret() {
        let address = |text: &str| text.parse::<SocketAddr>().unwrap();
        let loopback = [address("127.0.0.1:7001"), address("[::1]:7002"), address("127.0.0.9:0")];
        assert_eq!(binary_protected_mode_refusal(&loopback, false, false), None);
        for open in ["0.0.0.0:7001", "[::]:7001", "10.0.0.1:7001", "192.0.2.1:0"] {
            let addresses = [address("127.0.0.1:7001"), address(open)];
            let refusal = binary_protected_mode_refusal(&addresses, false, false).expect("refused");
            assert!(refusal.contains(open.trim_end_matches(":0")) && refusal.contains("--secret-file"), "{refusal}");
            assert_eq!(binary_protected_mode_refusal(&addresses, true, false), None, "a secret lifts it");
            assert_eq!(binary_protected_mode_refusal(&addresses, false, true), None, "so does the flag");
        }
    }
}
