//! `rampkv local`: a cluster of several servers in this process, its cluster file written for
//! the other subcommands, and optionally a RESP gateway that calls the servers' cores.
//!
//! # Contract
//! Every check that can refuse the start (`--servers`, `--replicas`, the gateway's protected
//! mode and users) runs before any server starts. The cluster file is written once the servers
//! and the one-sided front end listen. A RESP gateway that stops takes the process down with
//! status 2 rather than leave servers up behind a dead port.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;

use rampkv::auth::SharedSecret;
use rampkv::cluster::{Cluster, Front};
use rampkv::item_slots::ItemSlotConfig;
use rampkv::recovery::{StartRecovery, RECOVERY_TIMEOUT_MS};
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::server::durable::cluster_data_dirs;
use rampkv::server::front::FrontEnd;
use rampkv::server::{Durability, ReplicationMedium, ReplicationOptions, ServerConfig, ServerOptions};

use super::args::{FabricArgs, PersistenceArgs, RespAuthArgs, SecretArgs};
use super::output::say;
use super::server::spawn_servers;

#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// Number of servers.
    #[arg(long, default_value_t = 4)]
    servers: usize,
    /// Copies of every partition (f + 1): server i's records are replicated synchronously
    /// to the N - 1 servers after it, and a write is acknowledged only once every backup
    /// holds it (docs/replication.md says what is promised). At most --servers.
    #[arg(long, default_value_t = 1, value_name = "N")]
    replicas: u32,
    /// With --replicas above 1: onesided (records written into a log region each backup
    /// registers, held once landed, applied by the backup off the write's path) or tcp
    /// (held once the backup applied it and said so).
    #[arg(long, value_name = "MEDIUM", default_value = "onesided")]
    replication_medium: ReplicationMedium,
    /// First port; server i listens on base-port + i (0: any free ports).
    #[arg(long, default_value_t = 0)]
    base_port: u16,
    /// Where to write the cluster file.
    #[arg(long, default_value = "cluster.toml")]
    cluster_file: PathBuf,
    /// Also serve the Redis protocol (RESP) on PORT of --resp-bind (see docs/resp.md).
    #[arg(long)]
    resp_port: Option<u16>,
    /// The address the RESP port listens on. An address other than loopback needs a
    /// password (--requirepass, --aclfile) unless --protected-mode no.
    #[arg(long, value_name = "IP", default_value = "127.0.0.1", requires = "resp_port")]
    resp_bind: IpAddr,
    #[command(flatten)]
    resp_auth: RespAuthArgs,
    /// The servers' one-sided front end, written into the cluster file: ring (writepoll,
    /// sendrecv, onesided clients), rfrpc, or none.
    #[arg(long, value_enum, default_value_t = FrontChoice::Ring)]
    front: FrontChoice,
    #[command(flatten)]
    secret: SecretArgs,
    #[command(flatten)]
    persistence: PersistenceArgs,
    #[command(flatten)]
    fabric: FabricArgs,
}

pub(crate) fn run(args: LocalArgs) -> Result<ExitCode> {
    let LocalArgs {
        servers,
        replicas,
        replication_medium,
        base_port,
        cluster_file,
        resp_port,
        resp_bind,
        resp_auth,
        front,
        secret,
        persistence,
        fabric,
    } = args;
    let resp =
        resp_port.map(|port| resp_auth.apply(GatewayConfig::new(SocketAddr::new(resp_bind, port)))).transpose()?;
    let secret = secret.install()?;
    fabric.install()?;
    let layout = LocalLayout { servers, replicas, base_port, medium: replication_medium };
    run_local(layout, &cluster_file, resp, front.front(), secret, &persistence)
}

/// `rampkv local`: servers in this process, and a RESP gateway calling their cores if `resp` says
/// where (and with which users).
fn run_local(
    layout: LocalLayout,
    cluster_file: &PathBuf,
    resp: Option<GatewayConfig>,
    front: Option<Front>,
    secret: Option<Arc<SharedSecret>>,
    persistence: &PersistenceArgs,
) -> Result<ExitCode> {
    let LocalLayout { servers, replicas, base_port, medium } = layout;
    if !(1..=64).contains(&servers) {
        bail!("--servers must be 1..=64, got {servers}");
    }
    check_replicas(replicas, servers)?;
    if let Some(refusal) = resp.as_ref().and_then(GatewayConfig::protected_mode_refusal) {
        return Err(refusal.into()); // before any server starts
    }
    let configs = (0..servers)
        .map(|index| {
            let port = if base_port == 0 { 0 } else { base_port.checked_add(index as u16).context("port overflow")? };
            Ok(ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], port))))
        })
        .collect::<Result<Vec<_>>>()?;
    let durability = persistence
        .durability()
        .map(|(dir, config)| Ok::<_, anyhow::Error>(Durability { dirs: cluster_data_dirs(&dir, servers)?, config }))
        .transpose()?;
    let replication = (replicas != 1).then(|| ReplicationOptions { medium, ..ReplicationOptions::new(replicas) });
    let options = ServerOptions { secret, durability, replication, ..ServerOptions::default() };
    let mut group = spawn_servers(&configs, &options, "rampkv local").context("cannot start the local cluster")?;
    let mut cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect())?
        .with_replicas(replicas)?;
    group.start_recovery(cluster.clone(), 0, RECOVERY_TIMEOUT_MS).context("cannot start recovery")?;
    let localhost = SocketAddr::from(([127, 0, 0, 1], 0));
    let item_slots = Some(ItemSlotConfig::default());
    let front = front
        .map(|front| FrontEnd::spawn(&group, front, localhost, item_slots))
        .transpose()
        .context("cannot start the one-sided front end")?;
    if let Some(front) = &front {
        let controls = front.control_addresses().iter().map(SocketAddr::to_string).collect();
        cluster = cluster.with_fronts(front.kind(), controls)?;
    }
    std::fs::write(cluster_file, cluster.to_toml())
        .with_context(|| format!("cannot write {}", cluster_file.display()))?;
    let copies = match replicas {
        1 => String::new(),
        _ => format!(", {replicas} copies of every partition (synchronous replication)"),
    };
    say!(
        "rampkv local cluster: {servers} servers on {}{copies}; cluster file {}",
        group.addresses().iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(", "),
        cluster_file.display()
    );
    if let Some(config) = resp {
        // The gateway lives with the servers: it calls their cores rather than their sockets.
        let in_process = InProcessServers { groups: vec![Arc::clone(group.servers())] };
        let config = GatewayConfig { in_process: Some(in_process), ..config };
        let gateway = Gateway::spawn(&cluster, &config).context("cannot start the RESP gateway")?;
        say!("rampkv local cluster: RESP on {} (try redis-cli -p {})", gateway.address(), gateway.address().port());
        // A gateway that stops (it should not) takes the process with it, rather than leaving
        // servers up behind a RESP port that refuses every connection (issue 15).
        std::thread::Builder::new().name("rampkv-gateway-watch".into()).spawn(move || {
            let outcome = gateway.wait();
            say!("rampkv local: the RESP gateway stopped ({outcome:?}); exiting");
            std::process::exit(2);
        })?;
    }
    group.wait().context("local cluster failed")?;
    drop(front);
    Ok(ExitCode::SUCCESS)
}

/// `rampkv local`'s servers: how many, how many copies of each partition, which ports.
#[derive(Debug, Clone, Copy)]
struct LocalLayout {
    servers: usize,
    replicas: u32,
    base_port: u16,
    medium: ReplicationMedium,
}

/// `--replicas N` against `--servers`: refused before anything starts.
fn check_replicas(replicas: u32, servers: usize) -> Result<()> {
    if replicas == 0 || replicas > rampkv::limits::CLUSTER_REPLICAS_MAX {
        bail!("--replicas must be 1..={}, got {replicas}", rampkv::limits::CLUSTER_REPLICAS_MAX);
    }
    if replicas as usize > servers {
        bail!("--replicas {replicas} needs at least {replicas} servers (each copy on a server of its own), got --servers {servers}");
    }
    Ok(())
}

/// `rampkv local --front`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum FrontChoice {
    Ring,
    Rfrpc,
    None,
}

impl FrontChoice {
    fn front(self) -> Option<Front> {
        match self {
            FrontChoice::Ring => Some(Front::Ring),
            FrontChoice::Rfrpc => Some(Front::RfRpc),
            FrontChoice::None => None,
        }
    }
}
