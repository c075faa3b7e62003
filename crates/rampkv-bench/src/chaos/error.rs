//! The errors of a chaos run, at the bottom of the chaos rooms: every room returns them.
//!
//! # Contract
//! A [`ChaosError`] is what keeps a run from reaching a verdict (a bad setting, a server that
//! does not start, an interruption); a verdict of failure is not an error but a report with
//! `passed: false`.

use std::path::PathBuf;

use crate::history::HistoryError;
use rampkv_core::cluster::ClusterError;
use rampkv_net::client::ClientError;

/// Errors that keep a chaos run from reaching a verdict (a verdict of failure is not one).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChaosError {
    #[error("unknown {what} {name:?} (one of {known})")]
    UnknownName { what: &'static str, name: String, known: &'static str },
    #[error("{setting} must be {min}..={max}, got {value}")]
    OutOfRange { setting: &'static str, value: u64, min: u64, max: u64 },
    #[error("--read-ratio must be between 0 and 1, got {value}")]
    ReadRatio { value: f64 },
    #[error("{setting}: the lower end {min_ms} ms is above the upper end {max_ms} ms")]
    RangeOrder { setting: &'static str, min_ms: u64, max_ms: u64 },
    #[error("--transport {transport} is not available to chaos runs (its clients call servers in their own process)")]
    TransportUnsupported { transport: &'static str },
    /// `--replicas` above 1 with `--nemesis kill-all` without `--data-dir`: replication
    /// survives f failures at a time, and servers that keep nothing on disk lose everything
    /// when all of them die at once. With `--data-dir` the servers and the configuration service
    /// come back from their directories (`mixed` draws kill-all only then).
    #[error(
        "--replicas {replicas} with --nemesis kill-all needs --data-dir: replicas survive {} failure(s) at a time, \
         not every server at once, unless the servers keep their stores and the configuration on disk \
         (docs/replication.md, \"What survives what\")",
        replicas - 1
    )]
    ReplicasKillAll { replicas: u32 },
    #[error(
        "--data-dir: `{} server` has no --data-dir option (a build without persistence), so a run would test \
         servers that keep nothing",
        program.display()
    )]
    PersistenceMissing { program: PathBuf },
    #[error("--data-dir {}: not empty; a history can only be checked against a cluster that starts empty", path.display())]
    DataDirNotEmpty { path: PathBuf },
    #[error("cannot {what}{}: {error}", path.as_ref().map(|path| format!(" ({})", path.display())).unwrap_or_default())]
    Io { what: &'static str, path: Option<PathBuf>, error: std::io::Error },
    #[error(
        "--nemesis partition cuts a server off inside the run's network namespaces, which need root and `ip netns`{}",
        why.as_ref().map(|why| format!(": {why}")).unwrap_or_else(|| " (--network loopback)".to_owned())
    )]
    PartitionNeedsNamespaces { why: Option<String> },
    #[error("network namespaces are unavailable: {why}")]
    NamespacesUnavailable { why: NamespacesFault },
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed { command: String, status: String, stderr: String },
    #[error("`{command}` did not finish in {timeout_ms} ms")]
    CommandTimeout { command: String, timeout_ms: u64 },
    #[error("cannot enter network namespace {path}: {error}")]
    Namespace { path: String, error: std::io::Error },
    #[error("cannot start server {server}: {error}")]
    Spawn { server: usize, error: std::io::Error },
    #[error("server {server} exited ({status}); the end of {}:\n{tail}", log.display())]
    ServerExited { server: usize, status: String, log: PathBuf, tail: String },
    #[error("server {server} did not serve within {timeout_ms} ms; the end of {}:\n{tail}", log.display())]
    ServerNotReady { server: usize, timeout_ms: u64, log: PathBuf, tail: String },
    #[error("server {server} has no process")]
    ServerNotStarted { server: usize },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("{what} panicked")]
    Panicked { what: &'static str },
    #[error("the final read did not succeed within {timeout_ms} ms{}", last_error.as_ref().map(|error| format!(": {error}")).unwrap_or_default())]
    FinalRead { timeout_ms: u64, last_error: Option<ClientError> },
    #[error("interrupted")]
    Interrupted,
}

/// What stopped `--network namespaces` (asked for by name, so the run stops).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NamespacesFault {
    /// Creating namespaces, veth pairs and a bridge takes root.
    #[error("not running as root")]
    NotRoot,
    /// The `ip` command (or another) could not be started.
    #[error("cannot run `{command}`: {error}")]
    CannotRun { command: String, error: std::io::Error },
    /// A step of the set-up failed: a command refused, timed out, or a namespace could not be entered.
    #[error(transparent)]
    Setup(Box<ChaosError>),
}
