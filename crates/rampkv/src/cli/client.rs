//! `rampkv put` and `rampkv get`: one atomic write or read of a few keys; `rampkv scan`: the
//! listing of every live key; `rampkv incr`: one single-key update (INCRBY); each through a
//! client of the cluster file's servers.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use rampkv::client::{Client, ScanOptions};
use rampkv::cluster::Cluster;

use super::args::SecretArgs;
use super::output::out;
use super::parse::parse_pair;

#[derive(Debug, Args)]
pub(crate) struct PutArgs {
    /// KEY=VALUE pairs.
    #[arg(required = true)]
    pairs: Vec<String>,
    #[arg(long)]
    cluster: PathBuf,
    #[command(flatten)]
    secret: SecretArgs,
}

#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    #[arg(required = true)]
    keys: Vec<String>,
    #[arg(long)]
    cluster: PathBuf,
    #[command(flatten)]
    secret: SecretArgs,
}

#[derive(Debug, Args)]
pub(crate) struct IncrArgs {
    key: String,
    /// What to add (negative to subtract).
    #[arg(default_value_t = 1, allow_hyphen_values = true)]
    by: i64,
    #[arg(long)]
    cluster: PathBuf,
    #[command(flatten)]
    secret: SecretArgs,
}

/// Adds `by` to the key's value at its primary (absent: 0) and prints the new value.
pub(crate) fn incr(args: IncrArgs) -> Result<ExitCode> {
    let IncrArgs { key, by, cluster, secret } = args;
    secret.install()?;
    let cluster = Cluster::from_file(&cluster)?;
    let value = Client::connect(&cluster)?.incr_by(key.into_bytes(), by)?;
    out!("{value}");
    Ok(ExitCode::SUCCESS)
}

/// Writes the pairs in one transaction and prints its timestamp.
pub(crate) fn put(args: PutArgs) -> Result<ExitCode> {
    let PutArgs { pairs, cluster, secret } = args;
    secret.install()?;
    let pairs = pairs.iter().map(|pair| parse_pair(pair)).collect::<Result<Vec<_>>>()?;
    let cluster = Cluster::from_file(&cluster)?;
    let ts = Client::connect(&cluster)?.put_all(pairs)?;
    out!("OK ts={ts}");
    Ok(ExitCode::SUCCESS)
}

/// Reads the keys in one transaction and prints `KEY=VALUE`, or `KEY (nil)` for a key never
/// written. Unlike the other output, a closed stdout is an error here.
pub(crate) fn get(args: GetArgs) -> Result<ExitCode> {
    let GetArgs { keys, cluster, secret } = args;
    secret.install()?;
    let cluster = Cluster::from_file(&cluster)?;
    let outcome = Client::connect(&cluster)?.get_all(keys.into_iter().map(String::into_bytes).collect())?;
    let mut stdout = std::io::stdout().lock();
    for item in outcome.items {
        let key = String::from_utf8_lossy(&item.key);
        if item.ts == 0 {
            writeln!(stdout, "{key} (nil)")?;
        } else {
            writeln!(stdout, "{key}={}", String::from_utf8_lossy(&item.value))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub(crate) struct ScanArgs {
    #[arg(long)]
    cluster: PathBuf,
    #[arg(long = "match", value_name = "PATTERN")]
    pattern: Option<String>,
    #[arg(long, default_value_t = ScanOptions::default().count)]
    count: usize,
    #[command(flatten)]
    secret: SecretArgs,
}

/// Prints every live key of the cluster (matching the pattern), one per line, as the listing
/// goes. A closed stdout is an error, as for `get`.
pub(crate) fn scan(args: ScanArgs) -> Result<ExitCode> {
    let ScanArgs { cluster, pattern, count, secret } = args;
    secret.install()?;
    let cluster = Cluster::from_file(&cluster)?;
    let mut client = Client::connect(&cluster)?;
    let mut stdout = std::io::stdout().lock();
    let options = ScanOptions { pattern: pattern.map(String::into_bytes), count };
    for key in client.keys(options) {
        stdout.write_all(&key?)?;
        stdout.write_all(b"\n")?;
    }
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}
