//! The `rampkv` command: a thin layer that parses flags and dispatches to a subcommand. Each
//! subcommand's flags and wiring live in its own module under `cli/` (see [`cli`]).
#![forbid(unsafe_code)]

/// mimalloc: the protocol core allocates small vectors per request and reply; a third of the
/// CPU of an in-process run was glibc malloc/free (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use cli::output::say;

#[derive(Debug, Parser)]
#[command(
    name = "rampkv",
    version,
    about = "Read-atomic (RAMP) transactions over a partitioned in-memory key-value store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one server (one store) listening on ADDR.
    Server(cli::server::ServerArgs),
    /// Run a local cluster of several servers in this process and write its cluster file.
    Local(cli::local::LocalArgs),
    /// Serve the Redis protocol (RESP) for a running cluster: rampkv gateway --cluster FILE --listen ADDR
    Gateway(cli::gateway::GatewayArgs),
    /// Write keys atomically: rampkv put k1=v1 k2=v2 --cluster FILE
    Put(cli::client::PutArgs),
    /// Read keys atomically: rampkv get k1 k2 --cluster FILE
    Get(cli::client::GetArgs),
    /// List the cluster's live keys, one per line: rampkv scan --cluster FILE [--match PATTERN]
    /// [--count N]. PATTERN is a Redis glob (`*` any run, `?` any byte, `[abc]`, `[^a]`, `[a-z]`,
    /// `\x` the byte x). Every key present for the whole listing is printed at least once, keys
    /// written or deleted meanwhile may or may not be; the order is no order (partition by
    /// partition, then by key hash). N is how many keys each server is asked for at a time.
    Scan(cli::client::ScanArgs),
    /// Add to a counter at its primary, linearizably (Redis's INCRBY): rampkv incr KEY [BY] --cluster FILE
    Incr(cli::client::IncrArgs),
    /// Run the closed-loop benchmark (an embedded local cluster unless --cluster is given).
    Bench(cli::bench::BenchArgs),
    /// Reproduce the reference paper's four figures: benchmark sweeps written as SVG plots,
    /// Markdown tables with the paper's ratios, and every point's result (see docs/figures.md).
    Figures(cli::figures::FiguresArgs),
    /// Fault test: server processes (each in a network namespace of its own where the machine
    /// allows), a workload recording its history, a nemesis that kill -9's servers and restarts
    /// them, pauses primaries (SIGSTOP) or cuts them off from the other servers; then the
    /// checker, a read-back of every key against its last acknowledged write, and the longest
    /// window with no completed transaction. Exit status: 0 passed, 1 failed (lost writes,
    /// anomalies, unavailability, a victim not deposed, a stale read), 2 an error, 130
    /// interrupted. See docs/reliability.md.
    Chaos(cli::chaos::ChaosArgs),
    /// Check a recorded history for read atomicity. Exit status: 0 clean, 1 violated (or not
    /// checkable), 3 inconclusive (no anomaly, but no race showed the run could catch one),
    /// 2 an error (say, a malformed line). A last line cut short (a killed run) is left out.
    Check(cli::check::CheckArgs),
}

fn main() -> ExitCode {
    // Before any thread starts and before the stores grow: fresh huge pages stall the thread
    // that touches them for milliseconds here (`rampkv::pages`).
    rampkv::pages::disable_transparent_huge_pages();
    let cli = Cli::parse();
    rampkv::logging::init();
    match run(cli.command) {
        Ok(code) => code,
        Err(error) => {
            say!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Server(args) => cli::server::run(args),
        Command::Local(args) => cli::local::run(args),
        Command::Gateway(args) => cli::gateway::run(args),
        Command::Put(args) => cli::client::put(args),
        Command::Get(args) => cli::client::get(args),
        Command::Scan(args) => cli::client::scan(args),
        Command::Incr(args) => cli::client::incr(args),
        Command::Bench(args) => cli::bench::run(args),
        Command::Figures(args) => cli::figures::run(args),
        Command::Chaos(args) => cli::chaos::run(args),
        Command::Check(args) => cli::check::run(args),
    }
}
