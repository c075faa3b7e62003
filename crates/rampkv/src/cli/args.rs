//! Flag groups that several subcommands share (`#[command(flatten)]`): the cluster's shared
//! secret, the fabric, persistence of the servers' stores, and who may use a RESP gateway. Each
//! turns its flags into the settings the servers or the gateway take.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use rampkv::auth::SharedSecret;
use rampkv::durable::FsyncPolicy;
use rampkv::fabric::FabricChoice;
use rampkv::resp::auth::Users;
use rampkv::resp::gateway::GatewayConfig;
use rampkv::server::durable::DurabilityConfig;

use super::parse::parse_policy;

/// The cluster's shared secret (docs/security.md).
#[derive(Debug, Args)]
pub(crate) struct SecretArgs {
    /// The cluster's shared secret: a file of at least 32 bytes (e.g. head -c 32 /dev/urandom)
    /// that only its owner may access (chmod 600). Servers require every client of their binary
    /// and control ports to prove it; clients (and servers talking to each other) prove it. Give
    /// every server and client of a cluster the same file.
    #[arg(long, value_name = "FILE")]
    pub(crate) secret_file: Option<PathBuf>,
}

impl SecretArgs {
    /// Reads the secret (a clear error if the file is unfit) and makes it the secret this
    /// process's clients prove. Returns it for the servers to require.
    pub(crate) fn install(&self) -> Result<Option<Arc<SharedSecret>>> {
        let Some(path) = &self.secret_file else { return Ok(None) };
        let secret = Arc::new(SharedSecret::from_file(path).context("--secret-file")?);
        rampkv::auth::set_client_secret(Some(Arc::clone(&secret)));
        Ok(Some(secret))
    }
}

/// The medium of the one-sided paths (README, "Running on RDMA"; docs/fabric.md).
#[derive(Debug, Args)]
pub(crate) struct FabricArgs {
    /// The medium of the one-sided transports and front ends (writepoll, sendrecv, onesided,
    /// rfrpc). auto: per peer, shared memory with a process on this host, RDMA verbs with one on
    /// another host when both have an active RDMA port, otherwise TCP (a client says so). verbs:
    /// RDMA must be there (an error without an active port). shm: shared memory only (peers on
    /// other hosts over TCP).
    #[arg(long, value_name = "MEDIUM", default_value = "auto")]
    pub(crate) fabric: FabricChoice,
}

impl FabricArgs {
    /// Makes the choice this process's fabric's and opens it: a forced choice that cannot be
    /// met is an error here, before anything listens or connects.
    pub(crate) fn install(&self) -> Result<()> {
        rampkv::message::fabric::set_fabric_choice(self.fabric).with_context(|| format!("--fabric {}", self.fabric))?;
        Ok(())
    }
}

/// Persistence of the servers' stores (docs/persistence.md).
#[derive(Debug, Args)]
pub(crate) struct PersistenceArgs {
    /// Keep the store in DIR across restarts: an append-only log of every change (written
    /// before the change is acknowledged) and snapshots; a restart on the same DIR recovers.
    /// One server per directory (it is locked). `rampkv local` and `rampkv bench`: one
    /// subdirectory server-<i> per server. Without it nothing survives a restart.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// When the log is fsynced, as Redis's appendfsync. always: before each acknowledgement
    /// (group commit: concurrent ones share an fsync); no acknowledged write is ever lost.
    /// everysec (the default, as in Redis): once a second in the background; a process crash
    /// loses nothing acknowledged, a power cut about the last second. no: when the operating
    /// system writes back.
    #[arg(long, value_name = "POLICY", default_value = "everysec", value_parser = parse_policy, requires = "data_dir")]
    appendfsync: FsyncPolicy,
    /// Write a snapshot of the store in the background after this many bytes of log (the log
    /// it covers is then dropped; a restart loads it and replays only the log after it).
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = rampkv::durable::limits::SNAPSHOT_EVERY_BYTES_DEFAULT,
        value_parser = clap::value_parser!(u64).range(rampkv::durable::limits::SNAPSHOT_EVERY_BYTES_MIN..),
        requires = "data_dir"
    )]
    snapshot_every_bytes: u64,
    /// A log damaged in the middle (a checksum mismatch a later record vouches for) refuses to
    /// start, naming the file and offset; with this flag it is cut there instead (everything
    /// after the damage is dropped) and the cut is reported. A torn tail (a crash during a
    /// write) is always cut and reported.
    #[arg(long, requires = "data_dir")]
    truncate_corrupt_log: bool,
}

impl PersistenceArgs {
    /// The data directory and how to keep it, if one was given.
    pub(crate) fn durability(&self) -> Option<(PathBuf, DurabilityConfig)> {
        let config = DurabilityConfig {
            policy: self.appendfsync,
            truncate_corrupt: self.truncate_corrupt_log,
            snapshot_every_bytes: self.snapshot_every_bytes,
        };
        self.data_dir.clone().map(|dir| (dir, config))
    }
}

/// Who may use a RESP gateway (docs/resp.md, "Authentication").
#[derive(Debug, Args)]
pub(crate) struct RespAuthArgs {
    /// Require this password of RESP clients (Redis's requirepass): `AUTH PASSWORD`, or
    /// `HELLO 3 AUTH default PASSWORD`. Other local users can read it in the process list:
    /// prefer --aclfile with a hashed (#<sha256>) password.
    #[arg(long, value_name = "PASSWORD", conflicts_with = "aclfile")]
    requirepass: Option<String>,
    /// Users, passwords and permissions from a Redis ACL file (the subset in docs/resp.md:
    /// on/off, >password, #sha256, nopass; permissions all or nothing).
    #[arg(long, value_name = "FILE")]
    aclfile: Option<PathBuf>,
    /// Redis's protected mode: a gateway that lets anyone in (no password for the default
    /// user) refuses to listen on an address other than loopback. `no` turns the check off.
    #[arg(long, value_enum, default_value_t = YesNo::Yes)]
    protected_mode: YesNo,
    /// Close a RESP connection idle for SECONDS (0: never), as Redis's `timeout`.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    timeout: u64,
}

/// Redis's spelling of a boolean setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum YesNo {
    Yes,
    No,
}

impl RespAuthArgs {
    /// The gateway's users.
    fn users(&self) -> Result<Users> {
        match (&self.requirepass, &self.aclfile) {
            (Some(password), _) if password.is_empty() => {
                bail!("--requirepass needs a non-empty password (leave the flag out for a gateway without one)")
            }
            (Some(password), _) => Ok(Users::with_default_password(password.as_bytes())),
            (None, Some(path)) => Ok(Users::from_acl_file(path)?),
            (None, None) => Ok(Users::open()),
        }
    }

    /// `config` with these users and protected mode.
    pub(crate) fn apply(&self, config: GatewayConfig) -> Result<GatewayConfig> {
        Ok(GatewayConfig {
            users: Arc::new(self.users()?),
            protected_mode: self.protected_mode == YesNo::Yes,
            idle_timeout: (self.timeout > 0).then(|| Duration::from_secs(self.timeout)),
            ..config
        })
    }
}
