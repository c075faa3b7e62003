//! Every bound and default of the verbs module, in one place.

/// Most GID table entries looked at when choosing a GID (rxe's table has 1024 entries, nearly
/// all empty; the addresses a port has sit at the front).
pub const GID_ENTRIES_SCANNED_MAX: u32 = 128;

/// Most ports looked at per device.
pub const PORTS_PER_DEVICE_MAX: u8 = 8;

/// Largest memory region this module registers (and largest remote region it accepts).
pub const REGION_BYTES_MAX: u64 = 1 << 36;

/// Largest single transfer (RDMA READ/WRITE or SEND): what every RoCE and InfiniBand device
/// supports (`max_msg_sz` is 2^31 on all of them).
pub const TRANSFER_BYTES_MAX: u32 = 1 << 31;

/// Deepest send or receive queue a caller may ask for.
pub const QUEUE_DEPTH_MAX: u32 = 4096;

/// Default send queue depth: work requests posted and not yet known complete.
pub const SEND_DEPTH_DEFAULT: u32 = 128;

/// Default receive queue depth: receive buffers posted at once.
pub const RECEIVE_DEPTH_DEFAULT: u32 = 64;

/// Default signalling interval: at least one send in this many asks for a completion, so a
/// full send queue always has a completion on its way.
pub const SIGNAL_INTERVAL_DEFAULT: u32 = 16;

/// Default local ACK timeout exponent: 4.096 µs * 2^14 = 67 ms per attempt (perftest's
/// default too). With [`RETRY_COUNT_DEFAULT`] retries a dead peer is reported within about
/// 0.5 s on hardware.
pub const TIMEOUT_EXPONENT_DEFAULT: u8 = 14;

/// Default transport retries. 7, the most the field holds, means "retry forever" to Soft-RoCE
/// (measured in the lab: a READ to a destroyed queue pair never completed in 60 s with 7,
/// and failed with `RETRY_EXC_ERR` with 6), so 6 keeps a dead peer's detection bounded on
/// every device.
pub const RETRY_COUNT_DEFAULT: u8 = 6;

/// Default receiver-not-ready retries. 7 would mean "retry forever", which a peer that never
/// posts a receive would turn into a hang; 6 keeps the wait bounded.
pub const RNR_RETRY_DEFAULT: u8 = 6;

/// Default minimal RNR NAK timer code: 14 = 1.28 ms between RNR retries.
pub const MIN_RNR_TIMER_DEFAULT: u8 = 14;

/// Most outstanding RDMA READs and atomics per queue pair asked for (the device's own maximum
/// lowers it).
pub const READ_ATOMIC_DEPTH_MAX: u8 = 16;

/// Hop limit of RoCE v2 packets (routable across IP routers).
pub const HOP_LIMIT: u8 = 64;

/// Polls of the completion queue a wait makes before it sleeps on the completion channel (a
/// wait for the queue pair's own sends may spin longer: `SEND_SPIN_MAX_US`).
pub const WAIT_SPIN_POLLS: u32 = 2_000;

/// Longest a wait for the queue pair's own sends spins, however long its round trips have
/// been (`completion::SpinBudget`: twice the typical wait). 2 ms covers a READ between two
/// software-emulated guests (about 0.5 ms); a hardware round trip is a few microseconds.
pub const SEND_SPIN_MAX_US: u64 = 2_000;

/// Completions fetched per `ibv_poll_cq` call inside the waits of this module.
pub const POLL_BATCH: usize = 32;

/// Longest single sleep of a wait without a completion channel (it polls in between).
pub const WAIT_SLEEP_MAX_US: u64 = 1_000;
