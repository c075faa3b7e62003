//! rampkv: read-atomic multi-key transactions (RAMP) over a hash-partitioned in-memory store.
//!
//! # Layout (bottom up; see `docs/architecture.md`)
//! - [`limits`]: every bound, in one place.
//! - [`types`]: timestamps and the per-client timestamp clock.
//! - [`wire`]: the binary message format, framed for byte streams.
//! - [`storage`]: the multi-version partition store (lastCommit by atomic max, GC).
//! - [`item_slots`]: the latest committed versions published in item slots for GET\*.
//! - [`cluster`]: cluster files and key routing (FNV-1a hash partitioning).
//! - [`protocol`]: RAMP-Fast as I/O-free state machines (client transactions, server core).
//! - [`transport`]: how requests reach servers: TCP today.
//! - [`recovery`]: cooperative termination of transactions whose writer died.
//! - [`server`]: the event loop that serves connections with the server core.
//! - [`server_writepoll`]: the ring poller that serves GET+/PUT+ clients with the same cores.
//! - [`client`]: the driver that runs transactions over a transport, and the blocking client.
//! - [`resp`]: a Redis-protocol gateway that runs MGET/MSET as read-atomic transactions.
//! - [`history`], [`checker`]: recording histories and checking them for read atomicity.
//! - [`bench`]: the closed-loop benchmark over an embedded or external cluster.
//! - [`figures`]: the reference paper's four figures as benchmark sweeps, plots and tables.
//! - [`progress`]: a progress line on stderr for long runs.

pub mod bench;
pub mod checker;
pub mod client;
pub mod cluster;
pub mod figures;
pub mod front;
pub mod history;
pub mod item_slots;
pub mod limits;
pub mod progress;
pub mod protocol;
pub mod recovery;
pub mod resp;
pub mod server;
pub mod server_rfrpc;
pub mod server_writepoll;
pub mod storage;
pub mod transport;
pub mod types;
pub mod wire;
