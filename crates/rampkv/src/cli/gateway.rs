//! `rampkv gateway`: serves the Redis protocol (RESP) for a running cluster, as a client of its
//! servers (docs/resp.md). Protected mode and the users are checked before anything connects to
//! the cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use rampkv::cluster::Cluster;
use rampkv::resp::gateway::{Gateway, GatewayConfig};

use super::args::{FabricArgs, RespAuthArgs, SecretArgs};
use super::output::say;

#[derive(Debug, Args)]
pub(crate) struct GatewayArgs {
    #[arg(long)]
    cluster: PathBuf,
    /// Address to listen on. An address other than loopback needs a password
    /// (--requirepass, --aclfile) unless --protected-mode no.
    #[arg(long, default_value = "127.0.0.1:6379")]
    listen: SocketAddr,
    #[command(flatten)]
    resp_auth: RespAuthArgs,
    #[command(flatten)]
    secret: SecretArgs,
    #[command(flatten)]
    fabric: FabricArgs,
}

pub(crate) fn run(args: GatewayArgs) -> Result<ExitCode> {
    let GatewayArgs { cluster, listen, resp_auth, secret, fabric } = args;
    let config = resp_auth.apply(GatewayConfig::new(listen))?;
    secret.install()?;
    fabric.install()?;
    // Refused before anything connects to the cluster.
    if let Some(refusal) = config.protected_mode_refusal() {
        return Err(refusal.into());
    }
    let gateway = Gateway::spawn(&Cluster::from_file(&cluster)?, &config)?;
    say!("rampkv gateway: RESP on {}", gateway.address());
    gateway.wait()?;
    Ok(ExitCode::SUCCESS)
}
