//! The subcommands of the `rampkv` binary: each module holds one subcommand's flags (a clap
//! `Args` struct) and the function that runs it. `main.rs` only parses and dispatches.
//!
//! # Layout
//! - [`server`]: `rampkv server` (one server; replication, failover, one-sided front end),
//!   and [`server::spawn_servers`], which `local` shares.
//! - [`local`]: `rampkv local` (a cluster in this process, its cluster file, a RESP gateway).
//! - [`gateway`]: `rampkv gateway` (RESP for a running cluster).
//! - [`client`]: `rampkv put`, `rampkv get` and `rampkv incr`.
//! - [`bench`]: `rampkv bench` and `--compare`.
//! - [`figures`]: `rampkv figures`.
//! - [`chaos`]: `rampkv chaos` (the fault test).
//! - [`check`]: `rampkv check`, and the exit status of a checked run, which `bench` shares.
//! - [`args`]: flag groups several subcommands flatten in (secret, persistence, RESP users).
//! - [`parse`]: parsers of flag values (durations, ranges, pairs, names).
//! - [`output`]: `say!` / `out!`, lines that a closed stderr or stdout drops instead of panicking.
//!
//! A subcommand's help text is the doc comment of its variant of `Command` in `main.rs`; the
//! `Args` structs here carry none, so that there is one place for it.
//!
//! These stay in the binary rather than in the `rampkv` library: they are its flags, its
//! printed lines and its exit statuses, and no library caller needs them. What a subcommand
//! does lives in the library crates (`rampkv-net`'s servers, `rampkv-bench`'s runs); these
//! modules only turn flags into their configurations and their results into lines.

pub(crate) mod args;
pub(crate) mod bench;
pub(crate) mod chaos;
pub(crate) mod check;
pub(crate) mod client;
pub(crate) mod figures;
pub(crate) mod gateway;
pub(crate) mod local;
pub(crate) mod output;
pub(crate) mod parse;
pub(crate) mod server;

/// A random seed for a run that was given none (printed, so the run can be replayed).
fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |elapsed| elapsed.as_nanos() as u64)
}
