//! Every bound of the system, in one place.
//!
//! Tiger-style: a limit on everything (sizes, queues, retries, spins), named with its unit
//! last, so that a reader can see what the system promises to stay within.

/// Largest key accepted anywhere (client library, wire decoder, storage).
pub const KEY_BYTES_MAX: usize = 256;

/// Largest value accepted anywhere.
pub const VALUE_BYTES_MAX: usize = 64 * 1024;

/// Most keys in one transaction (read or write). Bounds frame sizes and per-transaction state.
pub const TXN_KEYS_MAX: usize = 256;

/// Largest frame body on the TCP wire. A transaction's largest message is a PREPARE carrying
/// every write of the transaction to one server: `TXN_KEYS_MAX` values of `VALUE_BYTES_MAX`
/// plus keys and metadata, which stays under this bound.
pub const FRAME_BODY_BYTES_MAX: usize = 20 * 1024 * 1024;

/// A read transaction restarts from round 1 at most this many times when a server answers
/// that a requested version is gone (garbage collected); then it fails with an error.
pub const READ_RESTARTS_MAX: u32 = 8;

/// Superseded versions stay readable at least this long, so a round-2 read that asks for one
/// finds it. Must exceed the longest a read transaction may take (see `TXN_TIMEOUT_MS`).
pub const GC_GRACE_MS: u64 = 10_000;

/// A server sweeps its store in the background at most this often (from its front end's timer
/// path): superseded versions of keys not written again are collected once their grace period
/// is over, instead of waiting for the key's next write.
pub const GC_SWEEP_INTERVAL_MS: u64 = 100;

/// Keys one sweep visits at most (each with its shard write-locked): bounds the work per tick
/// and how long a sweep holds up the writes of a shard. A full pass over a million keys takes
/// about 100 s.
pub const GC_SWEEP_KEYS_PER_TICK: usize = 1_024;

/// A server without a cluster file (no cooperative termination: it cannot ask the other
/// participants) ends a prepared transaction whose COMMIT has not come this long after its
/// PREPARE: its versions are dropped and a late COMMIT gets an error. Twelve times
/// `TXN_TIMEOUT_MS`: its writer gave up long before.
pub const PREPARED_ABANDON_MS: u64 = 12 * TXN_TIMEOUT_MS;

/// How far ahead of a server's wall clock a transaction timestamp may claim to be (and of a
/// client's, for a timestamp its clock observes). Beyond it the timestamp is forged or comes
/// from a clock gone wrong: a server refuses the PREPARE or COMMIT carrying it, a client's clock
/// ignores it (`types::timestamp_too_far_ahead`). Machines synchronised by NTP stay within tens
/// of milliseconds of each other (CockroachDB's default bound on clock offset is 500 ms); one
/// second leaves room for that and for a client's logical clock running a little ahead.
pub const TIMESTAMP_FUTURE_SKEW_MS: u64 = 1_000;

/// The clock skew rampkv documents between any two of its machines (servers and clients) for
/// expiry: within it, every reader sees a key expire within this much of its deadline, and no
/// server reclaims a version a reader could still see alive. Beyond it, expiry is early or late
/// by the excess, but a read never sees part of a transaction expired (docs/architecture.md,
/// "Expiry and deletion"). The same bound as a client timestamp's lead.
pub const EXPIRY_CLOCK_SKEW_MS: u64 = TIMESTAMP_FUTURE_SKEW_MS;

/// A server reclaims a key whose latest version expired this long ago by its own clock: it
/// drops the version's value (keeping its timestamp, metadata and deadline, marked reclaimed),
/// and later the key ([`EXPIRY_RECLAIMED_RETENTION_MS`]). At least the skew bound plus the GC
/// grace period, so that a reader within the skew bound, even one whose read took the whole
/// grace period, judged the version expired already.
pub const EXPIRY_RECLAIM_MARGIN_MS: u64 = EXPIRY_CLOCK_SKEW_MS + GC_GRACE_MS;

/// A reclaimed key (its value dropped) stays in the store this long (the server's monotonic
/// clock) before it goes: meanwhile its version answers round-2 reads and recovery's STATUS
/// with its timestamp, write set and deadline, and keeps the key's `lastCommit`, so that a late
/// PREPARE of an older transaction cannot bring older data back. As long as an aborted
/// transaction is remembered (a PREPARE delayed longer could slip through either way), and
/// longer than the GC grace period.
pub const EXPIRY_RECLAIMED_RETENTION_MS: u64 = 60_000;

/// Reclaimed keys one store waits to remove at most (each costs its key and 24 bytes): past
/// it, expired keys keep their values until older ones are removed.
pub const EXPIRY_RECLAIMED_KEYS_MAX: usize = 1 << 18;

const _: () = assert!(EXPIRY_RECLAIM_MARGIN_MS >= EXPIRY_CLOCK_SKEW_MS + GC_GRACE_MS);
const _: () = assert!(EXPIRY_RECLAIMED_RETENTION_MS >= GC_GRACE_MS);

/// A transaction that has not finished after this long fails with a timeout error.
pub const TXN_TIMEOUT_MS: u64 = 5_000;

/// A client whose connection to a server failed tries to connect again after this long, then
/// after twice as long each time it fails, up to `CLIENT_RECONNECT_BACKOFF_MS_MAX`
/// (transactions that need the server fail at once meanwhile, the others go on).
pub const CLIENT_RECONNECT_BACKOFF_MS_MIN: u64 = 50;

/// The longest a client waits between two attempts to reconnect to a server (a restarted
/// server is used again at most this long after it listens).
pub const CLIENT_RECONNECT_BACKOFF_MS_MAX: u64 = 1_000;

/// How often at most a driver looks for transactions past their deadline (each look reads
/// every session; a timeout is noticed this much late at most, beside `TXN_TIMEOUT_MS`).
pub const DRIVER_EXPIRY_SCAN_INTERVAL_MS: u64 = 1;

/// A server stops reading from a connection whose unsent replies exceed this, until the
/// client drains them (back-pressure instead of unbounded buffering).
pub const CONNECTION_WRITE_BUFFER_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Most connections one server accepts at once; more are refused (closed at once).
pub const SERVER_CONNECTIONS_MAX: usize = 4096;

/// Most connections one server group's TCP front end accepts at once from one source address
/// (a quarter of `SERVER_CONNECTIONS_MAX`): one host cannot take every connection. More from it
/// are refused (closed at once, logged).
pub const SERVER_CONNECTIONS_PER_ADDRESS_MAX: usize = SERVER_CONNECTIONS_MAX / 4;

/// A stream connection reads into its input buffer in chunks of at least this many bytes; the
/// buffer grows with the bytes that arrived (at most doubling what is buffered per read), never
/// with the length a frame header declares.
pub const STREAM_READ_CHUNK_BYTES: usize = 64 * 1024;

/// An input or output buffer that empties while it holds more than this gives its memory back
/// (one large frame does not pin its size for the connection's lifetime).
pub const STREAM_BUFFER_KEEP_BYTES: usize = 1 << 20;

/// Most bytes one connection may hold at a server: input received and not yet served, plus
/// replies not yet sent. An honest client stays under it by construction (one largest frame in,
/// `CONNECTION_WRITE_BUFFER_BYTES_MAX` plus one largest reply out, about 45 MiB); what gets past
/// it (a pile of S2PL lock waits granted at once, each answered with large values) closes the
/// connection, with the reason logged.
pub const CONNECTION_BUFFERED_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Most bytes all connections of one front end (a server group's TCP poller) may hold together.
/// Beyond it the connection holding the most is closed, with the reason logged, until the total
/// is back under it.
pub const SERVER_BUFFERED_BYTES_MAX: usize = 512 * 1024 * 1024;

/// A server closes a connection whose unsent replies made no progress for this long (a client
/// that sends and never reads).
pub const CONNECTION_SLOW_READER_TIMEOUT_MS: u64 = 30_000;

/// A server closes a stream connection that began a frame and has not completed it after this
/// long (a client that declares a large frame and trickles its bytes, holding its buffer).
pub const CONNECTION_FRAME_TIMEOUT_MS: u64 = 30_000;

/// A server closes a connection that has not finished its handshake this long after it opened:
/// with a shared secret, not authenticated; without one, not a single complete frame received
/// (every client says HELLO first). Connections that never say anything would otherwise hold
/// connection slots until the idle timeout, which is off by default, and lock clients out.
pub const CONNECTION_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// A server closes a connection that sent no request for this long, holds no unsent reply and
/// no partial frame (0: never, the default, as Redis's `timeout 0`: clients keep idle
/// connections to every server, and reconnect only on failure). Set per server group.
pub const CONNECTION_IDLE_TIMEOUT_MS_DEFAULT: u64 = 0;

/// How often a server front end looks for connections past a timeout (each look reads every
/// connection; a timeout fires at most this much late).
pub const CONNECTION_TIMEOUT_SCAN_INTERVAL_MS: u64 = 100;

/// Most logical clients (sessions) one client process may run: client ids are 16 bits.
pub const CLIENT_IDS_MAX: u64 = (1 << 16) - 1;

/// Most servers in a cluster file.
pub const CLUSTER_SERVERS_MAX: usize = 1024;

/// Most copies of a partition a cluster file may ask for (`replicas`): f + 1 with f failures
/// survived.
pub const CLUSTER_REPLICAS_MAX: u32 = 8;

/// Replication: most bytes of records a primary holds for one backup that the backup has not
/// acknowledged yet. A write that finds the link this far behind waits for room, at most
/// `REPLICATION_FULL_WAIT_MS_MAX`; a backup that stays behind that long is treated as failed.
pub const REPLICATION_UNACKED_BYTES_MAX: usize = 64 << 20;
/// Bytes of a primary's last records kept (with a data directory) so that a restarted backup
/// whose copy holds a prefix of the stream is sent only the records it missed (a delta) rather
/// than a snapshot of the store. Half the unacknowledged bound: the delta goes into the
/// catching-up link's queue, which holds at most `REPLICATION_UNACKED_BYTES_MAX`.
pub const REPLICATION_BACKLOG_BYTES: usize = REPLICATION_UNACKED_BYTES_MAX / 2;

/// Replication: the longest a write waits for room on a backup's link (see above).
pub const REPLICATION_FULL_WAIT_MS_MAX: u64 = 5_000;

/// Replication: how long a primary keeps trying to reach a backup's replication port at start
/// (a backup process may start a moment after its primary), between attempts
/// `REPLICATION_CONNECT_BACKOFF_MS`.
pub const REPLICATION_CONNECT_WAIT_MS_MAX: u64 = 10_000;

/// Replication: the pause between two attempts to reach a backup.
pub const REPLICATION_CONNECT_BACKOFF_MS: u64 = 50;

/// Replication: the bound on each read and write of the hello exchange, and on each blocking
/// read of a backup's connection (it then looks at its stop flag and sweeps its stores).
pub const REPLICATION_IO_TIMEOUT_MS: u64 = 100;

/// Failover: the longest a server's failover thread waits for a new configuration before it
/// looks at its stop flag again (it wakes at once when one is committed).
pub const FAILOVER_POLL_MS: u64 = 100;

/// Failover: how long a replicated `rampkv server` waits at start for its first lease (the
/// configuration service must elect a leader, which takes a majority of the servers up).
pub const FAILOVER_FIRST_LEASE_WAIT_MS_MAX: u64 = 30_000;

/// Failover: how long a client waits for one configuration node's answer.
pub const FAILOVER_CONFIG_ASK_TIMEOUT_MS: u64 = 500;

/// Failover: how long the blocking client keeps trying a transaction again after failures a
/// failover explains (a failed or deposed server), learning the configuration each time.
pub const FAILOVER_CLIENT_RETRY_MS_MAX: u64 = 10_000;

/// Failover: the pause before the blocking client asks for the configuration again.
pub const FAILOVER_RETRY_BACKOFF_MS: u64 = 50;

/// One-sided replication: bytes of the log region's ring a backup registers for one primary's
/// stream. It bounds the backup's apply lag: records landed in the ring and not yet applied
/// never exceed it. A write that finds the ring full waits for the backup's apply (back-pressure
/// on the primary), at most `REPLICATION_FULL_WAIT_MS_MAX`; then the backup is treated as failed.
pub const REPLICATION_LOG_RING_BYTES: usize = 1 << 20;

/// One-sided replication: how often a backup's stream thread looks at its log region for records
/// that landed (it applies them all at once). It never sleeps on the region's doorbell, so a
/// primary's write wakes nothing; the interval adds to the apply lag, not to a write's latency
/// (a record is held once it landed), and bounds the wake-ups of an idle stream to
/// 1 s / interval. The ring (`REPLICATION_LOG_RING_BYTES`) takes far more than one interval's
/// records at any rate this machine writes.
pub const REPLICATION_APPLY_POLL_US: u64 = 500;

/// One-sided replication: the largest message the primary writes into a log region at once (a
/// larger part of the stream is cut into several).
pub const REPLICATION_LOG_MESSAGE_BYTES_MAX: usize = 64 << 10;

/// One-sided replication: the bound on each read of the log region handshake (JSON lines on the
/// replication port's connection, after the hello). Each side maps the other's region before it
/// answers, which across hosts brings up an RDMA queue pair (bounded by the fabric's rendezvous
/// timeout, 10 s, and seconds under Soft-RoCE in an emulated guest): the bound leaves room for it.
pub const REPLICATION_LOG_HANDSHAKE_TIMEOUT_MS: u64 = 12_000;

/// One-sided replication: the pause of a primary's link thread between two looks at a full log
/// region, when it writes what waited (a snapshot, records queued before the link was up).
pub const REPLICATION_LOG_FULL_BACKOFF_US: u64 = 50;

/// Replication: most primaries' connections one backup service serves at once.
pub const REPLICATION_CONNECTIONS_MAX: usize = 64;

/// Replication: bytes a backup reads from its socket at once (records are applied as whole
/// frames arrive).
pub const REPLICATION_READ_BYTES: usize = 64 << 10;

/// Rejoin: bytes of one chunk of a snapshot a primary streams to a catching-up backup (the
/// backup refuses a longer chunk; its memory per chunk is bounded by this).
pub const REPLICATION_SNAPSHOT_CHUNK_BYTES: usize = 64 << 10;

/// Rejoin: the longest a catching-up backup waits for the rest of a snapshot once it began
/// (a primary that stops sending mid-snapshot is dropped; it tries again with a new link).
pub const REPLICATION_SNAPSHOT_WAIT_MS_MAX: u64 = 60_000;

/// Rejoin: the pause before a primary opens a new link to a catching-up backup whose last one
/// failed (a backup that refuses is not hammered).
pub const REPLICATION_CATCH_UP_RETRY_MS: u64 = 200;

/// Rejoin: how often the failover thread looks at its catching-up backups' links (to report
/// the ones in sync to the configuration service) when no configuration arrives.
pub const FAILOVER_REJOIN_POLL_MS: u64 = 10;

/// Most partitions in a cluster file.
pub const CLUSTER_PARTITIONS_MAX: u32 = 65_536;

/// Key listing (LIST_KEYS, SCAN): most keys one page asks for. A page may hold more only when
/// the keys of one 64-bit hash (a collision) outnumber what is left of it: a page never splits
/// the keys of one hash, so that the cursor "resume after hash h" loses none.
pub const LIST_PAGE_KEYS_MAX: usize = 1_024;

/// Key listing: most key bytes (with their 2-byte length fields) in one page, under the same
/// exception. Fits every transport's largest message (send/recv: 256 KiB).
pub const LIST_PAGE_BYTES_MAX: usize = 64 * 1024;

/// Key listing: a page never splits a block of 2^this consecutive key hashes, and ends at the
/// end of one, so that a resume point needs 64 - this bits (the RESP gateway's SCAN cursor
/// holds it beside a 16-bit partition index in the 64-bit number Redis clients parse).
pub const LIST_HASH_BLOCK_BITS: u32 = 16;

/// Key listing: most keys a server looks at for one page. Past it, the page ends at the end
/// of the store shard it was in, with fewer keys than asked (maybe none) and a cursor that
/// moves on: one request costs bounded work however sparse the partition is.
pub const LIST_VISITED_KEYS_MAX: usize = 64 * 1024;

/// Key listing: most keys a client accepts in one page (a hostile server's reply is refused
/// past it; an honest page stays under `LIST_PAGE_KEYS_MAX` but for collisions).
pub const LIST_REPLY_KEYS_MAX: usize = 64 * 1024;

/// Key counting (COUNT_KEYS, DBSIZE): most partitions one request names.
pub const COUNT_PARTITIONS_PER_REQUEST_MAX: usize = 4_096;

/// A TCP poller that finds nothing polls again without blocking for up to this long before it
/// blocks in the kernel: when its peer is running the next message usually arrives within a
/// few microseconds, and a sleep/wake-up pair costs more than that. Bounded so an idle poller
/// sleeps and leaves the core to others (the machine has 2); the spin actually used adapts
/// below it (`message::tcp::PollSpin`: none while spinning does not pay, as on a loaded
/// machine, where it only took CPU from the peer).
pub const POLL_SPIN_US: u64 = 50;

/// While a TCP poller spins, how often it looks (each look is an `epoll_wait` system call; back
/// to back they were 30 of the 35 system calls of a transaction under load).
pub const POLL_SPIN_CHECK_US: u64 = 5;

/// S2PL: the longest a lock request may wait before its transaction is aborted (and retried).
pub const LOCK_WAIT_MS_MAX: u64 = 200;

/// S2PL: a transaction aborted by wait-die or a lock timeout is retried at most this many times.
pub const LOCKING_ATTEMPTS_MAX: u32 = 64;

/// S2PL: the first backoff after an abort; it doubles per attempt up to `LOCK_BACKOFF_US_MAX`,
/// with jitter.
pub const LOCK_BACKOFF_US_MIN: u64 = 50;

/// S2PL: the longest backoff after an abort.
pub const LOCK_BACKOFF_US_MAX: u64 = 5_000;

/// A single-key update that finds its key prepared by a write in flight (`Busy`) tries again
/// after a backoff doubling from this (µs) ...
pub const UPDATE_BUSY_BACKOFF_US_MIN: u64 = 50;

/// ... up to this (µs): the writer's COMMIT is one round trip away (short backoffs catch the
/// gap between one writer's COMMIT and the next one's PREPARE on a key written back to back),
/// and cooperative termination resolves a dead writer's prepare.
pub const UPDATE_BUSY_BACKOFF_US_MAX: u64 = 2_000;

/// Most `Busy` replies one update takes before it fails (about 2 s of backoff; the
/// transaction timeout, `TXN_TIMEOUT_MS`, bounds it as well).
pub const UPDATE_BUSY_RETRIES_MAX: u32 = 1_024;

/// Most `TsTooLow` replies one update takes before it fails: each retry's timestamp is above
/// the newest the server named, so only updates of the same key racing it make it retry again.
pub const UPDATE_TS_RETRIES_MAX: u32 = 64;

/// How far ahead of the newest timestamp a server named an update's next attempt goes, per
/// `TsTooLow` reply so far (microseconds): writers of a hot key keep writing newer timestamps
/// while a retry travels. At most `UPDATE_TS_RETRIES_MAX` x this = 6.4 ms, far below
/// `TIMESTAMP_FUTURE_SKEW_MS`.
pub const UPDATE_TS_LEAD_US: u64 = 100;

/// GET+/PUT+ (write-poll transport): bytes of each message ring (request ring in the server's
/// region, reply ring in the client's). Sparse in /dev/shm until a connection zeroes it.
pub const WRITEPOLL_RING_BYTES: usize = 1 << 20;

/// GET+/PUT+: largest ring message body. A message carries one or more whole frames; a single
/// frame larger than this is refused with an error (a reply is replaced by an ERROR frame).
pub const WRITEPOLL_MESSAGE_BYTES_MAX: usize = 1 << 19;

/// GET+/PUT+: a client's reply ring must carry at least this much per message, so that an
/// ERROR reply always fits.
pub const WRITEPOLL_MESSAGE_BYTES_MIN: usize = 4096;

/// GET+/PUT+: most ring connections one server group serves at once (the group registers one
/// region with this many request-ring slots at start-up); more are refused.
pub const WRITEPOLL_GROUP_CONNECTIONS_MAX: usize = 64;

/// GET+/PUT+: longest line of the JSON control handshake.
pub const WRITEPOLL_CONTROL_LINE_BYTES_MAX: usize = 4096;

/// GET+/PUT+: how long connecting and the control handshake may take.
pub const WRITEPOLL_CONTROL_TIMEOUT_MS: u64 = 5_000;

/// A fabric front end closes a control connection whose handshake (hello, then the answer to
/// the challenge) has not finished this long after it opened. Handshakes run side by side
/// without blocking, so one that never finishes holds no other back.
pub const CONTROL_HANDSHAKE_TIMEOUT_MS: u64 = WRITEPOLL_CONTROL_TIMEOUT_MS;

/// Most control handshakes a fabric front end runs at once; a new connection beyond it closes
/// the oldest (an honest client finishes within a round trip, so only stalled ones are old).
pub const CONTROL_HANDSHAKES_MAX: usize = 256;

/// Shared secret (`--secret-file`): the fewest bytes a secret file may hold (256 bits, the
/// HMAC-SHA-256 key size that makes guessing hopeless).
pub const SECRET_BYTES_MIN: usize = 32;

/// Shared secret: the most bytes a secret file may hold (a key, not a document).
pub const SECRET_BYTES_MAX: usize = 4096;

/// The binary port's authentication step: how long a client waits for each of the server's
/// frames.
pub const AUTH_TIMEOUT_MS: u64 = 5_000;

/// The binary port's authentication step: the most body bytes a client reads for one of the
/// server's replies (an AUTH_CHALLENGE or AUTH_ACCEPTED of 32 bytes, or an ERROR: 6 bytes and a
/// message of at most `wire::response::ERROR_MESSAGE_BYTES_MAX` = 1,024); anything longer is
/// refused unread.
pub const AUTH_REPLY_BODY_BYTES_MAX: usize = 2048;

/// Fabric control handshake: bytes of the random challenge a client must write into its own
/// region before a server maps that region for a connection (proof that the client can write
/// it: another user cannot write a 0600 region file of rampkv's user).
pub const CONTROL_CHALLENGE_BYTES: usize = 32;

/// GET+/PUT+: the longest a ring poller sleeps on its doorbell before it re-checks its stop
/// flag, lock deadlines and (client) whether the control connection is still open.
pub const WRITEPOLL_SLEEP_MS_MAX: u64 = 50;

/// GET+/PUT+: ring messages the server takes from one connection per pass (fairness).
pub const WRITEPOLL_MESSAGES_PER_PASS_MAX: usize = 64;

/// Send/recv: receive buffers each side posts per connection (and entries of its receive and
/// completion queues). A sender that finds none posted waits (receiver not ready).
pub const SENDRECV_QUEUE_DEPTH: usize = 16;

/// Send/recv: bytes of each posted receive buffer, the largest message. A message carries one
/// or more whole frames; a single frame larger than this is refused with an error (a reply is
/// replaced by an ERROR frame). Must be at least `WRITEPOLL_MESSAGE_BYTES_MIN`.
pub const SENDRECV_BUFFER_BYTES: usize = 256 * 1024;

/// Send/recv: most send/recv connections one server group serves at once (its region holds
/// this many request-queue slots after the write-poll slots); more are refused.
pub const SENDRECV_GROUP_CONNECTIONS_MAX: usize = 64;

/// GET\* (item slots): slots one server's item region has by default. A key gets a slot on its
/// first GET_LOCATE while free slots remain; keys without one are read over GET+.
pub const ITEM_SLOTS_DEFAULT: usize = 16_384;

/// GET\*: bytes per item slot by default. Holds a 1 KiB value with a short key and a 4-key
/// write set (slot header 40 B, trailer 16 B); a version that does not fit is not published.
/// `rampkv bench` and `rampkv figures` fit the size to their workload instead unless told
/// (`BenchConfig::fitted_item_slot_bytes`).
pub const ITEM_SLOT_BYTES_DEFAULT: usize = 1_280;

/// GET\*: most slots one server's item region may have.
pub const ITEM_SLOTS_MAX: usize = 1 << 22;

/// GET\*: largest item region (slots x slot bytes) of one server.
pub const ITEM_REGION_BYTES_MAX: usize = 1 << 30;

/// GET\*: a round-1 read from a server's item slots is accepted only if, read after the slots,
/// the host's monotonic clock is at least this far before the end of the lease the server
/// wrote into its item region (its lease word): otherwise the read goes to the server as GET+,
/// whose lease gate answers. Processes of one host share that clock, so there the check would
/// hold without a margin; 1 ms (a third of a percent of the 300 ms lease) is a guard. A
/// deployment across hosts must make it cover the clocks' drift over a lease, as FaRM does
/// (docs/replication.md).
pub const GETSTAR_LEASE_MARGIN_US: u64 = 1_000;

/// GET\*: most entries in a client transport's address cache (key -> server and slot). When
/// full, an arbitrary entry is evicted for a new one.
pub const ADDRESS_CACHE_ENTRIES_MAX: usize = 1 << 18;

/// RF-RPC transport (`--transport rfrpc`): bytes of each request ring (server's region) and push
/// ring (client's region). A request message carries at most half of it.
pub const RFRPC_RING_BYTES: usize = 1 << 18;

/// RF-RPC transport: bytes of each connection's reply slot in the server's region (header,
/// reply frames, checksum, trailer). Replies that do not fit follow as unsolicited pushes.
pub const RFRPC_REPLY_SLOT_BYTES: usize = 1 << 17;

/// RF-RPC transport: the call round trip the automatic batch-size controller keeps 95% of the
/// frames under (the paper's l_limit): it shrinks the frames per call when more wait longer,
/// and grows them (up to `RPC_BATCH_ENTRIES_MAX`) when almost none do.
pub const RFRPC_BATCH_LATENCY_LIMIT_US: u64 = 200;

/// RF-RPC transport: most connections one server group serves at once.
pub const RFRPC_GROUP_CONNECTIONS_MAX: usize = 64;

/// Interleaving network model (`rampkv_net::transport::interleave`): the longest extra delay
/// one request may draw, as a multiple of the mean jitter. The draw is long-tailed (Pareto);
/// the cap keeps one unlucky request from holding its session for a whole run.
pub const INTERLEAVE_JITTER_TAIL_FACTOR_MAX: u64 = 50;

/// Interleaving network model: the longest fixed delay or mean jitter it accepts (1 s: far
/// beyond any network it stands for, and far below the transaction timeout's reach).
pub const INTERLEAVE_DELAY_US_MAX: u64 = 1_000_000;

/// Interleaving network model: a client thread waiting for a held request's delivery time
/// less than this far ahead sleeps in slices of [`INTERLEAVE_SLEEP_SLICE_US`] and polls for
/// replies between them, instead of blocking in the medium: an epoll wait rounds its timeout
/// up to whole milliseconds, which would hold a 50 µs delay for 1 ms.
pub const INTERLEAVE_BLOCKING_WAIT_US_MIN: u64 = 1_000;

/// Interleaving network model: one slice of the short waits above.
pub const INTERLEAVE_SLEEP_SLICE_US: u64 = 50;

/// Most spare value buffers one thread keeps (`spare`; a pipeline's worth of writes: 16 MSETs
/// of 10 keys).
pub const SPARE_BUFFERS_MAX: usize = 256;

/// Most bytes of spare buffers one thread keeps.
pub const SPARE_BYTES_MAX: usize = 1024 * 1024;

/// Most distinct lengths one thread keeps spares of (writes of a workload mostly share a few).
pub const SPARE_LENGTHS_MAX: usize = 4;

/// Longest buffer kept as a spare.
pub const SPARE_VALUE_BYTES_MAX: usize = 64 * 1024;
