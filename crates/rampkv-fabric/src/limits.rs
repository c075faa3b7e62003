//! Every bound of the fabric, in one place.
//!
//! Tiger-style: a limit on everything (sizes, retries, spins, scans), named with its unit last,
//! so that a reader can see what the fabric promises to stay within.

/// Bytes in a fabric word: the unit of atomicity, alignment and padding everywhere in this
/// crate (RDMA atomics are 8 bytes too).
pub const WORD_BYTES: usize = 8;

/// Directory whose files stand for registered regions (tmpfs: memory, never disk).
pub const SHM_DIRECTORY: &str = "/dev/shm";

/// Every region file is named `rampkv-<pid>-<name>-<nonce>`, so that `cleanup_stale` can tell
/// whose file it is and whether its owner is still alive.
pub const SHM_FILE_PREFIX: &str = "rampkv-";

/// Longest region name a caller may register (the part after `rampkv-<pid>-`).
pub const REGION_NAME_BYTES_MAX: usize = 64;

/// Random bytes in every region file name (as hex): nobody can create a region's file before
/// its owner does, so no other user can make a registration fail.
pub const REGION_NONCE_BYTES: usize = 16;

/// Largest region. Bounds what a descriptor from a peer can make us map.
pub const REGION_BYTES_MAX: u64 = 1 << 32;

/// Most directory entries `cleanup_stale` looks at, so that a crowded /dev/shm cannot stall
/// start-up.
pub const STALE_SCAN_ENTRIES_MAX: usize = 100_000;

/// A slot reader retries a torn read at most this many times, then returns `Torn` so that
/// the caller falls back to a GET+ (message) read served by the server's CPU.
pub const SLOT_READ_ATTEMPTS_MAX: u32 = 8;

/// Largest item slot. A slot holds a key (<= 256 B), a value (<= 64 KiB) and metadata (the
/// write set of a transaction, <= 256 keys of <= 256 B), with room to spare.
pub const SLOT_BYTES_MAX: usize = 1 << 20;

/// Smallest receive ring: two minimal frames (header + trailer).
pub const RING_BYTES_MIN: usize = 32;

/// Largest receive ring. Must stay below `8 << RING_TAG_BITS` bytes so that the lap tag in a
/// frame header differs between consecutive laps over the same position.
pub const RING_BYTES_MAX: usize = 1 << 30;

/// Bits of the stream position (in words) stored in every frame header. A header left over
/// from an earlier lap, or a desynchronised sender, then fails the receiver's check.
pub const RING_TAG_BITS: u32 = 30;

/// The receiver writes credit back to the sender once at least `ring_bytes / this` bytes are
/// freed, or at once when it finds the ring empty (so a sender that waits for credit always
/// gets it). Batching saves a remote write per message.
pub const RING_CREDIT_RETURN_DIVISOR: usize = 4;

/// A waiter polls its condition this many times before it blocks on the doorbell. A few
/// microseconds of spinning catch a reply that is already on its way without a syscall.
pub const DOORBELL_SPIN_ITERATIONS: u32 = 2_000;

/// Most entries of a send/recv queue pair (receive queue, completion queue, buffers: one of
/// each per entry). Far below `2^SENDRECV_TAG_BITS`, so that an entry left over from the
/// previous lap never carries the tag the reader expects now.
pub const SENDRECV_DEPTH_MAX: usize = 4096;

/// Largest posted receive buffer of a send/recv queue pair.
pub const SENDRECV_BUFFER_BYTES_MAX: usize = 16 << 20;

/// Bits of the post / completion sequence number stored in every receive-queue and
/// completion-queue entry (the lap tag).
pub const SENDRECV_TAG_BITS: u32 = 30;

/// RF-RPC: bytes a client fetches from a reply slot in its first one-sided read (the paper's
/// F, 256 on its InfiniBand NICs). A reply no larger than this costs one read; a larger one a
/// second read for the rest.
pub const RPC_FETCH_BYTES_DEFAULT: usize = 256;

/// RF-RPC: failed fetches within one call after which the call counts as slow (the paper's R).
pub const RPC_FETCH_RETRIES_DEFAULT: u32 = 5;

/// RF-RPC: consecutive slow calls after which a connection switches to server-pushed replies
/// (the paper switches after two, so that one unexpectedly long request does not flip it).
pub const RPC_SLOW_CALLS_TO_PUSH_DEFAULT: u32 = 2;

/// RF-RPC: pause between two failed fetches of one call, in nanoseconds. On InfiniBand a read
/// round trip takes about 2 us, so R = 5 failed reads cover about 10 us of server time; a
/// shared-memory read takes about 0.1 us, so the fetches are paced to cover a similar span.
pub const RPC_FETCH_INTERVAL_NS_DEFAULT: u64 = 1_000;

/// RF-RPC: in push mode, a reply whose reported server processing time is at or below this
/// (nanoseconds) switches the connection back to remote fetching.
pub const RPC_PUSH_BACK_BELOW_NS_DEFAULT: u64 = 2_000;

/// RF-RPC: unit of the 16-bit server-processing-time field of a reply, in nanoseconds. The
/// field saturates at `u16::MAX` units (6.55 ms): only "short or long" matters to the client.
pub const RPC_TIME_UNIT_NS: u64 = 100;

/// RF-RPC: largest reply slot (header, body, checksum and trailer).
pub const RPC_REPLY_SLOT_BYTES_MAX: usize = 1 << 20;

/// RF-RPC: most entries in one request batch (16-bit count field; the paper finds the best
/// batch size within 1..=128).
pub const RPC_BATCH_ENTRIES_MAX: usize = 128;

/// RF-RPC: default batch byte limit (the paper's L): a batch is sent once its entries would
/// exceed this.
pub const RPC_BATCH_BYTES_DEFAULT: usize = 2_048;

/// RF-RPC: default entry size above which an entry is sent alone, never batched.
pub const RPC_BATCH_ALONE_ABOVE_BYTES_DEFAULT: usize = 1_024;

/// RF-RPC: default batch timeout in microseconds: buffered entries older than this are sent
/// even if the batch is not full. The paper uses 5 ms over InfiniBand; calls here take about a
/// microsecond, so the default is shorter.
pub const RPC_BATCH_TIMEOUT_US_DEFAULT: u64 = 200;

/// RF-RPC automatic batch size: latencies per decision window.
pub const RPC_AUTO_BATCH_WINDOW_SAMPLES: usize = 256;

/// RF-RPC: spins of a waiting client between fetches after it passed R failed fetches, before
/// each yield of the CPU (the call still ends at its timeout).
pub const RPC_SLOW_FETCH_SPINS: u32 = 64;

/// RF-RPC: default bound on one call (send, then the reply by fetch or push), in milliseconds.
pub const RPC_CALL_TIMEOUT_MS_DEFAULT: u64 = 5_000;

/// In-memory fabric, fault mode: how long (spins) a torn read waits half way for the region's
/// owner to store, so that a read overlapping a write returns a mix of old and new words.
pub const MEMORY_FAULT_WAIT_SPINS_MAX: u32 = 4_000;

/// Longest an operation of the verbs fabric waits for its completion. Beyond it the peer's link
/// is declared failed (a late completion could still land in the link's bounce buffer, so the
/// link cannot be reused). Generous: Soft-RoCE under software emulation is slow, and a dead peer
/// is reported by the transport's retries well within it.
pub const VERBS_OP_TIMEOUT_MS: u64 = 10_000;

/// Registered bounce buffer of one verbs link: reads and writes move through it, larger ones in
/// chunks of this size.
pub const VERBS_BOUNCE_BYTES: usize = 64 << 10;

/// Most READs a verbs link posts with one doorbell for [`crate::OneSided::read_many`]
/// (well inside the send queue's depth); a longer list, or one whose ranges together exceed
/// [`VERBS_BOUNCE_BYTES`], is read one range after another.
pub const VERBS_READ_BATCH_MAX: usize = 32;

/// Receive buffers a verbs link keeps posted for wakes from its peer (each holds one wake).
pub const VERBS_WAKE_BUFFERS: u32 = 256;

/// Bytes of one wake message: the region's address and the word's offset, little-endian.
pub const VERBS_WAKE_MESSAGE_BYTES: u32 = 16;

/// Longest JSON line of the verbs rendezvous handshake.
pub const VERBS_RENDEZVOUS_LINE_BYTES_MAX: usize = 2_048;

/// Bound on connecting to a rendezvous and on each of its handshake's reads and writes.
pub const VERBS_RENDEZVOUS_TIMEOUT_MS: u64 = 10_000;

/// Longest sleep of a link's wake thread between checks of its peer's control connection
/// (it sleeps on the completion channel and the control socket together, so this only bounds
/// how late it notices its own fabric being dropped).
pub const VERBS_RECEIVER_POLL_MS: i32 = 1_000;

/// The RNR NAK timer code a verbs link asks senders to wait before retrying a wake that found
/// no receive buffer posted: 22 = 20.48 ms, so six retries give the wake thread 120 ms to
/// re-post before the sender's queue pair fails.
pub const VERBS_MIN_RNR_TIMER: u8 = 22;

/// Most verbs links (queue pairs to peers) one process keeps; a rendezvous beyond it is refused.
pub const VERBS_LINKS_MAX: usize = 1_024;
