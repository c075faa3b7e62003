//! Every bound of the generator, in one place.
//!
//! YCSB leaves most of these unbounded (a rejection loop may spin forever, zeta may be summed
//! over billions of terms). Here each one is a named constant, so that bad input or an
//! unlucky configuration ends in an error value instead of a hang or an allocation storm.

/// Most keys in one transaction. Mirrors `rampkv::limits::TXN_KEYS_MAX`: a larger transaction
/// would be refused by the store anyway, so the generator refuses it up front.
pub const TXN_KEYS_MAX: usize = 256;

/// Largest record (all fields of one key together). A YCSB record becomes one rampkv value,
/// and rampkv's default value limit is 64 KiB.
pub const RECORD_BYTES_MAX: u64 = 64 * 1024;

/// Most fields in a record. YCSB's default is 10; a bound keeps the per-key field list small.
pub const FIELD_COUNT_MAX: u64 = 1024;

/// Largest `zeropadding`. It bounds the length of a key name ("user" + padding), which must
/// stay far below rampkv's 256-byte key limit.
pub const ZERO_PADDING_MAX: usize = 64;

/// Longest key name this crate can produce: "user", then at least `ZERO_PADDING_MAX`
/// characters or a 20-character signed 64-bit decimal, whichever is longer.
pub const KEY_NAME_BYTES_MAX: usize = 4 + ZERO_PADDING_MAX;

/// Most terms of a zeta sum computed from scratch or incrementally. Summing is O(n) calls to
/// `powf` (about 10 ns each here), so 2^31 terms is tens of seconds: the largest start-up cost
/// we accept. YCSB truncates key numbers to 32-bit ints in `nextKeynum` anyway.
pub const ZETA_TERMS_MAX: u64 = 1 << 31;

/// YCSB's `nextKeynum` redraws while the drawn key has not been inserted yet (zipfian over a
/// key space sized for future inserts). We redraw at most this many times per key, then return
/// an error instead of spinning.
pub const KEY_DRAWS_MAX: u32 = 1_000_000;

/// A transaction needs distinct keys; skewed distributions repeat hot keys, so drawing is
/// retried. At most this many draws per wanted key, then an error value.
pub const DISTINCT_KEY_DRAWS_PER_KEY_MAX: u32 = 10_000;

/// How many inserted keys may be handed out and not yet acknowledged. The same window as
/// YCSB's `AcknowledgedCounterGenerator` (2^20); when it is full, inserts fail with an error.
pub const ACKNOWLEDGEMENT_WINDOW_KEYS: u64 = 1 << 20;

/// Largest property file text accepted by the parser.
pub const PROPERTIES_TEXT_BYTES_MAX: usize = 1024 * 1024;
