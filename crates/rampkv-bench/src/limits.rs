//! Bounds of the benchmark tooling, in one place.

use rampkv_config::limits::{DEFAULT_CLOCK_DRIFT_PPM, DEFAULT_LEASE_MS};
use rampkv_core::limits::TXN_TIMEOUT_MS;

/// How long a streamed history may sit written but not flushed: the file a killed run leaves
/// is at most about this much (plus [`HISTORY_SEND_INTERVAL_MS`]) behind the run.
pub const HISTORY_FLUSH_INTERVAL_MS: u64 = 500;

/// How long a client thread keeps finished records before handing them to the history writer.
pub const HISTORY_SEND_INTERVAL_MS: u64 = 200;

/// Records a client thread hands over at once at most (sooner than the interval if it has this
/// many), so a batch stays small next to the writer's buffer.
pub const HISTORY_SEND_RECORDS_MAX: usize = 4096;

/// Batches waiting for the history writer at most; a client thread that finds the queue full
/// waits (back-pressure) rather than let the queue grow without bound.
pub const HISTORY_QUEUE_BATCHES_MAX: usize = 64;

/// How long the history writer holds a read back while a version it returned has no write
/// record yet (a write still finishing). A write gives up within `TXN_TIMEOUT_MS` and is then
/// recorded too; beyond that (and the client's hand-over interval) the read is written anyway,
/// so a read of a version no write will ever name still reaches the checker as garbage.
pub const HISTORY_READ_HOLD_MS_MAX: u64 = TXN_TIMEOUT_MS + 2 * HISTORY_SEND_INTERVAL_MS + 1_000;

/// Reads the history writer holds back at most; beyond, the oldest is written anyway.
pub const HISTORY_HELD_READS_MAX: usize = 1 << 16;

/// Write timestamps the history writer remembers (the most recent ones), to tell whether a
/// read's versions already have their write records in the file. A read of an older version
/// is held until [`HISTORY_READ_HOLD_MS_MAX`]: later, never wrong.
pub const HISTORY_KNOWN_WRITES_MAX: usize = 1 << 20;

/// Writes overlapping a read in time (of any key) the checker compares with the read's keys one
/// by one; beyond, it asks its per-key index instead, which finds only writes of the read's keys.
pub const CHECKER_TIME_OVERLAPS_SCAN_MAX: usize = 64;

// The benchmark's evidence probe (`bench --check`; docs/history.md, "The evidence probe"): a
// short run of the same protocol, transport and cluster under contention, so that a workload
// too quiet to race (the README's 1,000 keys) still gets a verdict with teeth.

/// Keys of the probe's key space: 16 keys at [`PROBE_TXN_SIZE`] keys per transaction make a
/// read meet a write of two of its keys in most of its rounds.
pub const PROBE_KEYS: u64 = 16;

/// Keys per transaction of the probe, whatever the workload's: the README's 4. At 8 keys over
/// 16, S2PL's wait-die aborts most contended readers and showed 1 race in 2 s (17 over 32
/// keys); at 4 over 16 it showed 3 to 24 per 2 s on the loaded 2-core machine.
pub const PROBE_TXN_SIZE: usize = 4;

/// The probe's fraction of read-only transactions: half, so writes race every read.
pub const PROBE_READ_RATIO: f64 = 0.5;

/// Races (reads whose round 1 alone was fractured) after which the probe stops: four times
/// `RACES_MIN`, so a repair that fails only sometimes has more chances to show.
pub const PROBE_RACES_TARGET: u64 = 20;

/// Longest the probe runs when races come slowly (the verdict is then decided on what it saw).
/// RAMP and NoCC reach the target in well under a second; S2PL, whose wait-die aborts most
/// racing readers, took 1.6 s at load 6 and showed as few as 1 race per 2 s at load 10.
pub const PROBE_SECONDS_MAX: f64 = 10.0;

/// How often the probe counts the races of its history so far (a check of the partial history,
/// on the main thread while the client threads run).
pub const PROBE_CHECK_INTERVAL_MS: u64 = 250;

// The fault-injection harness (`chaos`). Every loop it runs is bounded by the run's deadline
// plus one of these, and every wait by one of these.

/// Most server processes one chaos run starts (namespace mode gives server `i` the address
/// 10.213.0.(10 + i), so the /24 holds them all).
pub const CHAOS_SERVERS_MAX: usize = 64;

/// Most client threads of the chaos workload (each one driver, reconnected on failure).
pub const CHAOS_CLIENT_THREADS_MAX: usize = 16;

/// Most logical clients (sessions) of the chaos workload, over all its threads.
pub const CHAOS_CLIENTS_MAX: usize = 256;

/// Largest key space of the chaos workload: it is meant to be small, so reads race writes, and
/// the final read-back reads every key.
pub const CHAOS_KEYS_MAX: u64 = 10_000;

/// How long a chaos client thread waits in one poll of its driver.
pub const CHAOS_POLL_INTERVAL_MS: u64 = 5;

/// How long a chaos client thread waits before connecting again after its connections broke
/// (or a connection attempt failed): short, so that the unavailability it measures is the
/// cluster's, not the client's.
pub const CHAOS_RECONNECT_BACKOFF_MS: u64 = 20;

/// How long the workload lets transactions in flight at the end of the run finish before it
/// records them as failed: a transaction gives up within `TXN_TIMEOUT_MS`.
pub const CHAOS_DRAIN_MS_MAX: u64 = TXN_TIMEOUT_MS + 1_000;

/// How many times one planned transaction is tried (the first try and its retries after a
/// failure) before the workload moves on to another.
pub const CHAOS_TRIES_PER_TRANSACTION_MAX: u32 = 50;

/// How long a started (or restarted) server process has to accept connections on every
/// address it serves. Generous: a restart with persistence replays a log first.
pub const CHAOS_SERVER_READY_TIMEOUT_MS: u64 = 30_000;

/// How often readiness is probed (a TCP connection to each of the server's addresses).
pub const CHAOS_READY_PROBE_INTERVAL_MS: u64 = 20;

/// Timeout of one readiness probe connection.
pub const CHAOS_READY_PROBE_TIMEOUT_MS: u64 = 200;

/// Attempts to restart one server (a port taken in the meantime makes one fail).
pub const CHAOS_RESTART_ATTEMPTS_MAX: u32 = 3;

/// How long the final read-back may take, retries included, once every server is back.
pub const CHAOS_FINAL_READ_TIMEOUT_MS: u64 = 30_000;

/// Step of every sleep of the nemesis and the harness, so a stop or Ctrl-C is seen this soon.
pub const CHAOS_SLEEP_STEP_MS: u64 = 20;

/// Chaos: the longest a kill waits for every partition's full replica set (a server catching
/// up, rejoin) before it is skipped.
pub const CHAOS_REPLICA_WAIT_MS_MAX: u64 = 20_000;

/// Shortest kill interval accepted: a server needs some time to come back between kills.
pub const CHAOS_KILL_INTERVAL_MS_MIN: u64 = 100;

/// Chaos: the shortest pause or partition. A server's lease ends `lease * (1 - drift)` after
/// the heartbeat that bought it, and the configuration service may depose it only
/// `lease * (1 + drift)` after that heartbeat arrived: a fault shorter than that could end
/// before its victim is even suspected. 200 ms on top leave the failover time to start.
pub const CHAOS_FAULT_HOLD_MS_MIN: u64 = DEFAULT_LEASE_MS * (1_000_000 + DEFAULT_CLOCK_DRIFT_PPM) / 1_000_000 + 200;

/// Chaos: the longest a pause or partition is held waiting for the configuration service to
/// depose its victim (a failover takes under a second: docs/replication.md, "Timing"); the
/// fault then ends all the same and the run fails.
pub const CHAOS_FAULT_HOLD_MS_MAX: u64 = 10_000;

/// Chaos: how often the nemesis asks the configuration service whether a paused or cut-off
/// server was deposed.
pub const CHAOS_DEPOSED_POLL_MS: u64 = 50;

/// Examples of lost acknowledged writes a chaos report lists (all are counted).
pub const CHAOS_LOST_EXAMPLES_MAX: usize = 10;

/// Distinct client errors a chaos report keeps (all are counted).
pub const CHAOS_ERRORS_KEPT_MAX: usize = 8;

/// Lines of a server's log quoted in an error about it.
pub const CHAOS_LOG_TAIL_LINES: usize = 20;

/// How long one `ip` command (namespace set-up and tear-down) may take before it is killed.
pub const CHAOS_COMMAND_TIMEOUT_MS: u64 = 10_000;
