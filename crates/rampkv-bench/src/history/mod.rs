//! Histories: one JSON line per finished transaction, written during a run and read back by the
//! [`checker`](crate::checker). The format is documented field by field in `docs/history.md`.
//!
//! # Contract
//! - A history is text, one [`Record`] per line as a compact JSON object, in no particular order
//!   (threads append batches as they finish). Empty lines are allowed and skipped. A run's
//!   history streams to its file while the run goes on ([`HistoryStream`]), each read after the
//!   write records of the versions it returned, so the prefix a killed run leaves checks.
//! - A read records what its round 1 returned (`round1`) and which keys round 2 fetched
//!   (`round2`), where the protocol has an unrepaired first answer: the checker's evidence.
//!   Both fields are optional, so histories written before them read as before.
//! - Every record is validated on both sides of the file with the same rules
//!   ([`Record::validate`]): [`HistorySink::append`] refuses to write an invalid record, and the
//!   readers ([`HistoryReader`], [`parse_history`], [`read_history`]) refuse to return one. A
//!   bad producer is caught where it writes, a bad file where it is read.
//! - Reading never panics on bad input: a malformed line is a [`HistoryError`] naming the line
//!   number and what is wrong (a last line without newline that is not a record is
//!   [`HistoryError::CutLastLine`]: cut by a writer that died); a line longer than
//!   [`HISTORY_LINE_BYTES_MAX`] is refused before it is buffered whole.
//! - Keys are byte strings; a history shows them as [`key_to_history_string`] renders them.
//! - In check mode, every value written by the transaction with timestamp `ts` starts with `ts`
//!   (8 bytes, little-endian) followed by a pattern derived from `ts`: see [`fill_check_value`].
//!   A reader decodes what it got into `value_ts`, so a torn or misplaced value shows up in the
//!   history even when the version timestamp the protocol reported looks right.

mod stream;

pub use stream::{HistoryFeed, HistoryStream};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use rampkv_core::protocol::ReadOutcome;
use serde::{Deserialize, Serialize};

/// The timestamp of the initial value of every key (never written). Its value is empty.
pub(crate) const TIMESTAMP_INITIAL: u64 = 0;

/// Bytes at the start of a check-mode value that hold the writer's timestamp (little-endian).
pub const CHECK_VALUE_PREFIX_LEN: usize = 8;

/// Longest line a history reader accepts, in bytes (newline excluded).
///
/// The largest legitimate line is a read of 256 keys (the transaction bound) of 256 bytes each,
/// each key written three times (`keys`, `reads`, `value_ts`) and, in the worst case, JSON-escaped
/// at 6 characters per byte: about 1.2 MB. 4 MiB leaves room and still bounds the memory a
/// corrupt file (say, one without newlines) can make a reader allocate.
pub const HISTORY_LINE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Capacity of the buffered writer behind a [`HistorySink`]: large enough that appending a
/// batch rarely reaches the file system.
const SINK_BUFFER_BYTES: usize = 1024 * 1024;

/// Origin named in errors of [`parse_history`], which has no path.
const UNNAMED_ORIGIN: &str = "history";

/// One finished transaction: one line of a history.
///
/// Serialized internally tagged: `{"type":"write",...}` or `{"type":"read",...}`. Unknown
/// fields are ignored when reading, so a producer may add fields without breaking the checker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", try_from = "RecordFields")]
pub enum Record {
    /// A write-only transaction (`put_all`).
    Write(WriteRecord),
    /// A read-only transaction (`get_all`).
    Read(ReadRecord),
}

/// The fields of either kind of record, read in one pass.
///
/// Serde's derived reader for internally tagged enums first buffers every field into a
/// generic tree to find the tag, then reads the variant from that tree; for histories of
/// millions of lines that was most of the parsing time. Reading a flat struct and then
/// checking per kind which fields must be present is about twice as fast (measured on a
/// 1-million-line history) and gives the same errors for bad input.
#[derive(Deserialize)]
struct RecordFields {
    #[serde(rename = "type")]
    kind: RecordKind,
    client: u64,
    ts: Option<u64>,
    keys: Vec<String>,
    reads: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    value_ts: BTreeMap<String, u64>,
    round1: Option<Vec<u64>>,
    #[serde(default)]
    round2: Vec<String>,
    start_ns: u64,
    end_ns: u64,
    ok: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RecordKind {
    Write,
    Read,
}

impl TryFrom<RecordFields> for Record {
    type Error = RecordFault;

    fn try_from(fields: RecordFields) -> Result<Self, RecordFault> {
        match fields.kind {
            RecordKind::Write => Ok(Record::Write(WriteRecord {
                client: fields.client,
                ts: fields.ts.ok_or(RecordFault::MissingField { kind: "write", field: "ts" })?,
                keys: fields.keys,
                start_ns: fields.start_ns,
                end_ns: fields.end_ns,
                ok: fields.ok,
            })),
            RecordKind::Read => Ok(Record::Read(ReadRecord {
                client: fields.client,
                keys: fields.keys,
                reads: fields.reads.ok_or(RecordFault::MissingField { kind: "read", field: "reads" })?,
                value_ts: fields.value_ts,
                round1: fields.round1,
                round2: fields.round2,
                start_ns: fields.start_ns,
                end_ns: fields.end_ns,
                ok: fields.ok,
            })),
        }
    }
}

/// A write-only transaction as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    /// The logical client that ran the transaction.
    pub client: u64,
    /// The transaction's timestamp: unique in a run, never 0 (0 names the initial value).
    pub ts: u64,
    /// The keys written, as [`key_to_history_string`] renders them.
    pub keys: Vec<String>,
    /// When the transaction started, from the run's one monotonic clock.
    pub start_ns: u64,
    /// When the transaction finished (or was given up), same clock.
    pub end_ns: u64,
    /// False when the client failed or died after starting the write. Such a write may still
    /// become visible (cooperative termination commits what any participant committed), so the
    /// checker accepts reads of it.
    pub ok: bool,
}

/// A read-only transaction as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadRecord {
    /// The logical client that ran the transaction.
    pub client: u64,
    /// The keys asked for.
    pub keys: Vec<String>,
    /// Per key, the timestamp of the version returned (0 = the initial value). An ok read has an
    /// entry for every key; a failed one may have fewer.
    pub reads: BTreeMap<String, u64>,
    /// Per key, the timestamp decoded from the value bytes returned (check mode only). Absent or
    /// empty when values were not in check mode; then values are not checked for this read.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub value_ts: BTreeMap<String, u64>,
    /// What round 1 of the read returned, one timestamp per entry of `keys` (same order): the
    /// answer the read would have given without its round-2 repair (S2PL: each key's latest
    /// committed version when the lock request arrived, the answer without the lock wait).
    /// Absent in histories recorded before the field existed; then the checker cannot count
    /// this read's races.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round1: Option<Vec<u64>>,
    /// The keys round 2 fetched (empty: no round 2, and then not written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round2: Vec<String>,
    /// When the transaction started, from the run's one monotonic clock.
    pub start_ns: u64,
    /// When the transaction finished, same clock.
    pub end_ns: u64,
    /// False when the read failed; the checker ignores failed reads.
    pub ok: bool,
}

/// A record together with the line of the history it came from (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumberedRecord {
    /// 1-based line number in the history.
    pub line: u64,
    /// The record on that line.
    pub record: Record,
}

/// Errors of recording and reading histories. Every message names the file (or the origin given
/// to [`HistoryReader::new`]) and, for reading, the line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// The history file could not be created.
    #[error("cannot create history file {}: {error}", path.display())]
    Create { path: PathBuf, error: io::Error },
    /// The history file could not be opened for reading.
    #[error("cannot open history file {}: {error}", path.display())]
    Open { path: PathBuf, error: io::Error },
    /// Writing or flushing the history file failed.
    #[error("cannot write history file {}: {error}", path.display())]
    Write { path: PathBuf, error: io::Error },
    /// A caller asked to append a record that breaks the format's rules; nothing of that batch
    /// was written.
    #[error("refusing to append an invalid record to history file {}: {reason}", path.display())]
    InvalidRecord { path: PathBuf, reason: RecordFault },
    /// Reading the history failed at the operating-system level.
    #[error("cannot read {origin} at line {line}: {error}")]
    Read { origin: String, line: u64, error: io::Error },
    /// A line is longer than [`HISTORY_LINE_BYTES_MAX`]; reading stops there.
    #[error("{origin}:{line}: line longer than {bytes_max} bytes")]
    LineTooLong { origin: String, line: u64, bytes_max: usize },
    /// A line is not a valid record: bad JSON, a missing or mistyped field, or a broken rule.
    #[error("{origin}:{line}: malformed history record: {reason}")]
    Malformed { origin: String, line: u64, reason: RecordFault },
    /// The last line has no newline and is not a record: cut short by a writer that died
    /// (a benchmark killed while its history streamed out). The checker leaves it out.
    #[error("{origin}:{line}: last line cut short ({bytes} bytes, no newline): {reason}")]
    CutLastLine { origin: String, line: u64, bytes: u64, reason: RecordFault },
}

/// What is wrong with one record: not JSON of the format, or a rule of the format broken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordFault {
    /// Not JSON, or JSON that is not a record: a missing or mistyped field, an unknown type.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A field the record's type needs is absent.
    #[error("a {kind} record needs field `{field}`")]
    MissingField { kind: &'static str, field: &'static str },
    /// The transaction ends before it starts.
    #[error("end_ns {end_ns} is before start_ns {start_ns}")]
    EndBeforeStart { start_ns: u64, end_ns: u64 },
    /// A write at timestamp 0, which names every key's initial value.
    #[error("a write cannot have ts 0, which names the initial value")]
    WriteAtInitialTs,
    /// `reads` names a key the read did not ask for.
    #[error("\"reads\" has key {key:?}, which is not in \"keys\"")]
    ReadOfKeyNotAsked { key: String },
    /// `value_ts` names a key with no `reads` entry.
    #[error("\"value_ts\" has key {key:?}, which is not in \"reads\"")]
    ValueTsOfKeyNotRead { key: String },
    /// An ok read lacks the `reads` entry of a key it asked for.
    #[error("an ok read has no \"reads\" entry for key {key:?}")]
    OkReadMissingKey { key: String },
    /// `round1` does not have one entry per key asked for.
    #[error("\"round1\" has {entries} entries for {keys} keys")]
    RoundOneCount { entries: usize, keys: usize },
    /// `round2` without `round1`.
    #[error("\"round2\" needs \"round1\"")]
    RoundTwoWithoutRoundOne,
    /// `round2` names a key the read did not ask for.
    #[error("\"round2\" has key {key:?}, which is not in \"keys\"")]
    RoundTwoKeyNotAsked { key: String },
}

impl Record {
    /// The logical client that ran the transaction.
    pub fn client(&self) -> u64 {
        match self {
            Record::Write(write) => write.client,
            Record::Read(read) => read.client,
        }
    }

    /// The keys written or asked for.
    pub fn keys(&self) -> &[String] {
        match self {
            Record::Write(write) => &write.keys,
            Record::Read(read) => &read.keys,
        }
    }

    /// Whether the transaction finished successfully.
    pub fn is_ok(&self) -> bool {
        match self {
            Record::Write(write) => write.ok,
            Record::Read(read) => read.ok,
        }
    }

    /// Checks the rules of the format that JSON types alone cannot express.
    ///
    /// # Errors
    /// The first broken rule.
    pub fn validate(&self) -> Result<(), RecordFault> {
        match self {
            Record::Write(write) => write.validate(),
            Record::Read(read) => read.validate(),
        }
    }

    /// The record as one JSON line, newline excluded.
    pub fn to_json_line(&self) -> String {
        // Serializing plain structs with string-keyed maps into a String cannot fail; the
        // fallback keeps this total without an unwrap.
        serde_json::to_string(self).unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}"))
    }
}

impl WriteRecord {
    /// Rules: the transaction does not end before it starts; its ts is not 0, which names the
    /// initial value of every key and is never written.
    ///
    /// # Errors
    /// The first broken rule.
    pub fn validate(&self) -> Result<(), RecordFault> {
        validate_times(self.start_ns, self.end_ns)?;
        if self.ts == TIMESTAMP_INITIAL {
            return Err(RecordFault::WriteAtInitialTs);
        }
        Ok(())
    }
}

impl ReadRecord {
    /// Rules: the transaction does not end before it starts; every key of `reads` was asked for
    /// (`keys`); every key of `value_ts` has a `reads` entry; an ok read has a `reads` entry for
    /// every key asked for; `round1`, if present, has one entry per entry of `keys` (for a key
    /// asked for twice, the first entry counts); every key of `round2` was asked for, and
    /// `round2` comes only with `round1`.
    ///
    /// # Errors
    /// The first broken rule.
    pub fn validate(&self) -> Result<(), RecordFault> {
        self.validate_rounds()?;
        validate_times(self.start_ns, self.end_ns)?;
        let asked: BTreeSet<&str> = self.keys.iter().map(String::as_str).collect();
        if let Some(key) = self.reads.keys().find(|key| !asked.contains(key.as_str())) {
            return Err(RecordFault::ReadOfKeyNotAsked { key: key.clone() });
        }
        if let Some(key) = self.value_ts.keys().find(|key| !self.reads.contains_key(*key)) {
            return Err(RecordFault::ValueTsOfKeyNotRead { key: key.clone() });
        }
        if self.ok {
            if let Some(key) = asked.iter().find(|key| !self.reads.contains_key(**key)) {
                return Err(RecordFault::OkReadMissingKey { key: (*key).to_owned() });
            }
        }
        Ok(())
    }
}

impl ReadRecord {
    /// The record of an ok read: `keys` as asked for (rendered by [`key_to_history_string`]),
    /// and from `outcome` (one item per key, in the same order) each version's timestamp, the
    /// timestamp its value carries ([`value_ts_of`]), round 1's answer and the keys round 2
    /// fetched.
    pub fn of_outcome(client: u64, keys: Vec<String>, outcome: &ReadOutcome, start_ns: u64, end_ns: u64) -> Self {
        let mut reads = BTreeMap::new();
        let mut value_ts = BTreeMap::new();
        let mut round2 = Vec::new();
        for (key, item) in keys.iter().zip(&outcome.items) {
            reads.insert(key.clone(), item.ts);
            // A key absent at the read though a version was read (deleted, expired) has no value
            // whose bytes could say anything: its value is not checked (its ts still is).
            if item.exists || item.ts == TIMESTAMP_INITIAL {
                value_ts.insert(key.clone(), value_ts_of(&item.value));
            }
            if item.fetched_in_round2 && !round2.contains(key) {
                round2.push(key.clone());
            }
        }
        // Every item of a read has round 1, or none has (an S2PL server that does not report it).
        let round1 = outcome.items.iter().map(|item| item.round1_ts).collect();
        Self { client, keys, reads, value_ts, round1, round2, start_ns, end_ns, ok: true }
    }

    fn validate_rounds(&self) -> Result<(), RecordFault> {
        match &self.round1 {
            Some(round1) if round1.len() != self.keys.len() => {
                return Err(RecordFault::RoundOneCount { entries: round1.len(), keys: self.keys.len() });
            }
            Some(_) => {}
            None if !self.round2.is_empty() => return Err(RecordFault::RoundTwoWithoutRoundOne),
            None => {}
        }
        // `reads` (a map) names every key of an ok read: a quick test before the linear one.
        let asked = |key: &String| self.reads.contains_key(key) || self.keys.contains(key);
        if let Some(key) = self.round2.iter().find(|key| !asked(key)) {
            return Err(RecordFault::RoundTwoKeyNotAsked { key: key.clone() });
        }
        Ok(())
    }

    /// Round 1's timestamp of `key`, if the read recorded its round 1 and asked for `key`.
    pub fn round1_ts(&self, key: &str) -> Option<u64> {
        let position = self.keys.iter().position(|asked| asked == key)?;
        self.round1.as_ref()?.get(position).copied()
    }
}

fn validate_times(start_ns: u64, end_ns: u64) -> Result<(), RecordFault> {
    if end_ns < start_ns {
        return Err(RecordFault::EndBeforeStart { start_ns, end_ns });
    }
    Ok(())
}

/// Renders a key (a byte string) as the string a history shows for it.
///
/// A key that is valid UTF-8 and does not start with `0x` appears as itself. Any other key
/// appears as `0x` followed by two lowercase hex digits per byte. The `0x` rule keeps the mapping
/// one-to-one: a UTF-8 key that itself starts with `0x` is hex-encoded too, so `0x...` in a
/// history always means hex. [`key_from_history_string`] inverts it.
pub fn key_to_history_string(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) if !text.starts_with("0x") => text.to_owned(),
        _ => {
            let mut rendered = String::with_capacity(2 + 2 * key.len());
            rendered.push_str("0x");
            for byte in key {
                // Writing to a String cannot fail.
                let _ = write!(rendered, "{byte:02x}");
            }
            rendered
        }
    }
}

/// The key bytes a history string names: the inverse of [`key_to_history_string`].
///
/// Returns `None` for a `0x` string whose rest is not an even number of lowercase hex digits,
/// which [`key_to_history_string`] never produces.
pub fn key_from_history_string(text: &str) -> Option<Vec<u8>> {
    let Some(hex) = text.strip_prefix("0x") else {
        return Some(text.as_bytes().to_vec());
    };
    if hex.len() % 2 != 0 {
        return None;
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| Some((lowercase_hex_digit(pair[0])? << 4) | lowercase_hex_digit(pair[1])?))
        .collect()
}

fn lowercase_hex_digit(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// Fills `buffer` with the check-mode value of the write with timestamp `ts`.
///
/// Layout: bytes 0..8 hold `ts` little-endian; the rest is a pattern of 8-byte little-endian
/// words derived from `ts`, the value's length and the word's position (the last word truncated
/// to fit). A value torn between two versions, shifted, truncated or taken from another key's
/// slot therefore fails [`verify_check_value`] with overwhelming probability, not only when the
/// prefix happens to be hit.
///
/// # Panics
/// If `buffer` is shorter than [`CHECK_VALUE_PREFIX_LEN`]: check mode needs values of at least
/// that size, which the caller's configuration must ensure before the run starts.
pub fn fill_check_value(ts: u64, buffer: &mut [u8]) {
    assert!(
        buffer.len() >= CHECK_VALUE_PREFIX_LEN,
        "check-mode values need at least {CHECK_VALUE_PREFIX_LEN} bytes, got {}",
        buffer.len()
    );
    let seed = pattern_seed(ts, buffer.len());
    let (prefix, body) = buffer.split_at_mut(CHECK_VALUE_PREFIX_LEN);
    prefix.copy_from_slice(&ts.to_le_bytes());
    for (word_index, chunk) in body.chunks_mut(8).enumerate() {
        let word = pattern_word(seed, word_index).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// The writer's timestamp a check-mode value claims (its first 8 bytes), without checking the
/// rest. The initial value of every key is empty, so an empty value decodes to `Some(0)`.
/// Returns `None` for a value of 1 to 7 bytes, which no check-mode writer produces.
pub fn decode_check_value(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return Some(TIMESTAMP_INITIAL);
    }
    let prefix: [u8; CHECK_VALUE_PREFIX_LEN] = value.get(..CHECK_VALUE_PREFIX_LEN)?.try_into().ok()?;
    Some(u64::from_le_bytes(prefix))
}

/// Like [`decode_check_value`], but also checks that every byte after the prefix is the pattern
/// [`fill_check_value`] writes for that timestamp and length. Returns `None` when it is not
/// (a torn, truncated or corrupted value).
pub fn verify_check_value(value: &[u8]) -> Option<u64> {
    let ts = decode_check_value(value)?;
    if value.is_empty() {
        return Some(ts);
    }
    let seed = pattern_seed(ts, value.len());
    let body = &value[CHECK_VALUE_PREFIX_LEN..];
    let intact = body.chunks(8).enumerate().all(|(word_index, chunk)| {
        let word = pattern_word(seed, word_index).to_le_bytes();
        chunk == &word[..chunk.len()]
    });
    intact.then_some(ts)
}

/// The `value_ts` a reader records for a value that fails [`verify_check_value`] (torn,
/// truncated, corrupted). No write has this timestamp in practice (it would need the largest
/// clock and client id at once), so the checker reports it as a value mismatch.
pub const VALUE_TS_CORRUPT: u64 = u64::MAX;

/// What a reader in check mode records in `value_ts` for the value bytes it got: the verified
/// timestamp, or [`VALUE_TS_CORRUPT`] when the value does not verify.
pub fn value_ts_of(value: &[u8]) -> u64 {
    verify_check_value(value).unwrap_or(VALUE_TS_CORRUPT)
}

/// The SplitMix64 increment (2^64 / golden ratio).
const PATTERN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output mixer: a bijection on u64 with good avalanche.
fn mix(word: u64) -> u64 {
    let word = (word ^ (word >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let word = (word ^ (word >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    word ^ (word >> 31)
}

fn pattern_seed(ts: u64, value_len: usize) -> u64 {
    mix(ts ^ mix(value_len as u64 ^ PATTERN_GAMMA))
}

fn pattern_word(seed: u64, word_index: usize) -> u64 {
    mix(seed.wrapping_add((word_index as u64).wrapping_add(1).wrapping_mul(PATTERN_GAMMA)))
}

/// A thread-safe appender of records to a history file.
///
/// Callers batch records (per thread) and append the batch in one call: the batch is
/// serialized outside the lock, then copied into one buffered writer under a mutex, so lines
/// from different threads never interleave and the lock is held only for a memory copy (and an
/// occasional write to the file). Dropping the sink flushes it but cannot report errors; call
/// [`HistorySink::finish`] at the end of a run.
#[derive(Debug)]
pub struct HistorySink {
    path: PathBuf,
    writer: Mutex<BufWriter<File>>,
}

impl HistorySink {
    /// Creates (or truncates) the history file at `path`.
    ///
    /// # Errors
    /// [`HistoryError::Create`] when the file cannot be created.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, HistoryError> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).map_err(|error| HistoryError::Create { path: path.clone(), error })?;
        Ok(Self { path, writer: Mutex::new(BufWriter::with_capacity(SINK_BUFFER_BYTES, file)) })
    }

    /// The file this sink writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `records`, one line each, in order. All or nothing with respect to validation:
    /// if any record is invalid, none of the batch is written.
    ///
    /// # Errors
    /// [`HistoryError::InvalidRecord`] for a record that breaks the format's rules;
    /// [`HistoryError::Write`] when the file cannot be written.
    pub fn append(&self, records: &[Record]) -> Result<(), HistoryError> {
        let batch = self.encode_batch(records)?;
        let mut writer = self.lock_writer();
        writer.write_all(&batch).map_err(|error| self.write_error(error))
    }

    /// Writes buffered lines to the file.
    ///
    /// # Errors
    /// [`HistoryError::Write`] when the file cannot be written.
    pub fn flush(&self) -> Result<(), HistoryError> {
        self.lock_writer().flush().map_err(|error| self.write_error(error))
    }

    /// Flushes and syncs the file to stable storage, consuming the sink.
    ///
    /// # Errors
    /// [`HistoryError::Write`] when flushing or syncing fails.
    pub fn finish(self) -> Result<(), HistoryError> {
        let writer = self.writer.into_inner().unwrap_or_else(PoisonError::into_inner);
        let file = writer
            .into_inner()
            .map_err(|error| HistoryError::Write { path: self.path.clone(), error: error.into_error() })?;
        file.sync_all().map_err(|error| HistoryError::Write { path: self.path.clone(), error })
    }

    fn encode_batch(&self, records: &[Record]) -> Result<Vec<u8>, HistoryError> {
        // About 160 bytes per line for small transactions; a hint, not a bound.
        let mut batch = Vec::with_capacity(records.len() * 160);
        for record in records {
            let invalid = |reason: RecordFault| HistoryError::InvalidRecord { path: self.path.clone(), reason };
            record.validate().map_err(invalid)?;
            serde_json::to_writer(&mut batch, record).map_err(|error| invalid(error.into()))?;
            batch.push(b'\n');
        }
        Ok(batch)
    }

    fn lock_writer(&self) -> std::sync::MutexGuard<'_, BufWriter<File>> {
        // A panic while the lock is held can only interrupt `write_all` of a whole batch or a
        // flush, neither of which leaves the writer itself inconsistent, so a poisoned lock is
        // still usable.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_error(&self, error: io::Error) -> HistoryError {
        HistoryError::Write { path: self.path.clone(), error }
    }
}

/// A streaming reader of a history: yields each record with its line number.
///
/// Empty (or all-whitespace) lines are skipped. After a malformed line the reader goes on with
/// the next one, so a caller may choose to skip bad lines; after an I/O error or an over-long
/// line it ends, because the position in the input is no longer at a line start. A last line
/// without a newline that is not a record is [`HistoryError::CutLastLine`], not `Malformed`:
/// a run killed mid-write leaves one, and a checker may leave it out.
#[derive(Debug)]
pub struct HistoryReader<R> {
    reader: R,
    origin: String,
    line: u64,
    buffer: Vec<u8>,
    finished: bool,
}

impl<R: BufRead> HistoryReader<R> {
    /// Reads `reader`; `origin` names it in errors (a path, say).
    pub fn new(reader: R, origin: impl Into<String>) -> Self {
        Self { reader, origin: origin.into(), line: 0, buffer: Vec::new(), finished: false }
    }

    /// Reads the next line into the buffer. `Ok(false)` at the end of the input.
    fn read_line(&mut self) -> Result<bool, HistoryError> {
        self.buffer.clear();
        self.line += 1;
        // One byte more than the bound, so that an over-long line is detected, not truncated.
        let limit = HISTORY_LINE_BYTES_MAX as u64 + 1;
        let bytes_read = (&mut self.reader)
            .take(limit)
            .read_until(b'\n', &mut self.buffer)
            .map_err(|error| HistoryError::Read { origin: self.origin.clone(), line: self.line, error })?;
        if self.buffer.len() > HISTORY_LINE_BYTES_MAX && self.buffer.last() != Some(&b'\n') {
            return Err(HistoryError::LineTooLong {
                origin: self.origin.clone(),
                line: self.line,
                bytes_max: HISTORY_LINE_BYTES_MAX,
            });
        }
        Ok(bytes_read > 0)
    }

    fn parse_buffer(&self) -> Result<NumberedRecord, HistoryError> {
        let origin = self.origin.clone();
        let line = self.line;
        // Only the last line of the input can lack its newline.
        let cut = self.buffer.last() != Some(&b'\n');
        let bytes = self.buffer.len() as u64;
        let malformed = |reason: RecordFault| match cut {
            true => HistoryError::CutLastLine { origin: origin.clone(), line, bytes, reason },
            false => HistoryError::Malformed { origin: origin.clone(), line, reason },
        };
        let record: Record = serde_json::from_slice(&self.buffer).map_err(|error| malformed(error.into()))?;
        record.validate().map_err(malformed)?;
        Ok(NumberedRecord { line: self.line, record })
    }
}

impl<R: BufRead> Iterator for HistoryReader<R> {
    type Item = Result<NumberedRecord, HistoryError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.finished {
            match self.read_line() {
                Ok(true) if self.buffer.trim_ascii().is_empty() => continue,
                Ok(true) => return Some(self.parse_buffer()),
                Ok(false) => self.finished = true,
                Err(error) => {
                    self.finished = true;
                    return Some(Err(error));
                }
            }
        }
        None
    }
}

/// Opens the history file at `path` for streaming.
///
/// # Errors
/// [`HistoryError::Open`] when the file cannot be opened.
pub fn open_history(path: impl AsRef<Path>) -> Result<HistoryReader<BufReader<File>>, HistoryError> {
    let path = path.as_ref();
    let file = File::open(path).map_err(|error| HistoryError::Open { path: path.to_path_buf(), error })?;
    Ok(HistoryReader::new(BufReader::with_capacity(SINK_BUFFER_BYTES, file), path.display().to_string()))
}

/// Reads a whole history file.
///
/// # Errors
/// The first error met: see [`HistoryError`].
pub fn read_history(path: impl AsRef<Path>) -> Result<Vec<Record>, HistoryError> {
    collect_records(open_history(path)?)
}

/// Parses a whole history from `reader`; errors name it "history".
///
/// # Errors
/// The first error met: see [`HistoryError`].
pub fn parse_history(reader: impl BufRead) -> Result<Vec<Record>, HistoryError> {
    collect_records(HistoryReader::new(reader, UNNAMED_ORIGIN))
}

fn collect_records<R: BufRead>(reader: HistoryReader<R>) -> Result<Vec<Record>, HistoryError> {
    reader.map(|numbered| numbered.map(|numbered| numbered.record)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn write_record(client: u64, ts: u64, keys: &[&str]) -> WriteRecord {
        WriteRecord {
            client,
            ts,
            keys: keys.iter().map(ToString::to_string).collect(),
            start_ns: 100,
            end_ns: 200,
            ok: true,
        }
    }

    fn read_record(client: u64, reads: &[(&str, u64)], with_values: bool) -> ReadRecord {
        let reads: BTreeMap<String, u64> = reads.iter().map(|(key, ts)| (key.to_string(), *ts)).collect();
        ReadRecord {
            client,
            keys: reads.keys().cloned().collect(),
            value_ts: if with_values { reads.clone() } else { BTreeMap::new() },
            reads,
            round1: None,
            round2: Vec::new(),
            start_ns: 300,
            end_ns: 400,
            ok: true,
        }
    }

    fn sample_history_text() -> String {
        let records = [
            Record::Write(write_record(3, 1234, &["k1", "k7"])),
            Record::Read(read_record(5, &[("k1", 1234), ("k7", 1234)], true)),
            Record::Read(read_record(6, &[("k1", 0)], false)),
        ];
        records.iter().map(|record| record.to_json_line() + "\n").collect()
    }

    #[test]
    fn records_round_trip_through_json_lines() {
        let records = vec![
            Record::Write(write_record(3, 1234, &["k1", "k7"])),
            Record::Read(read_record(5, &[("k1", 1234), ("k7", 1234)], true)),
            Record::Read(read_record(6, &[("k1", 0)], false)),
        ];
        for record in &records {
            let line = record.to_json_line();
            assert!(!line.contains('\n'), "one record must be one line: {line}");
            let parsed: Record = serde_json::from_str(&line).expect("own output parses");
            assert_eq!(&parsed, record);
        }
        let parsed = parse_history(sample_history_text().as_bytes()).expect("valid history");
        assert_eq!(parsed, records);
    }

    #[test]
    fn design_document_lines_parse_with_their_field_names() {
        let text = concat!(
            r#"{"type":"write","client":3,"ts":1234,"keys":["k1","k7"],"start_ns":10,"end_ns":20,"ok":true}"#,
            "\n",
            r#"{"type":"read","client":5,"keys":["k1","k7"],"reads":{"k1":1234,"k7":1234},"value_ts":{"k1":1234,"k7":1234},"start_ns":30,"end_ns":40,"ok":true}"#,
            "\n"
        );
        let records = parse_history(text.as_bytes()).expect("design example is valid");
        let Record::Write(write) = &records[0] else {
            panic!("first line is a write: {records:?}");
        };
        assert_eq!((write.client, write.ts, write.keys.len()), (3, 1234, 2));
        let Record::Read(read) = &records[1] else {
            panic!("second line is a read: {records:?}");
        };
        assert_eq!(read.reads.get("k7"), Some(&1234));
        assert_eq!(read.value_ts.get("k1"), Some(&1234));
        // Serialization emits the fields in the documented order.
        assert_eq!(records[0].to_json_line(), text.lines().next().unwrap_or_default());
        assert_eq!(records[1].to_json_line(), text.lines().nth(1).unwrap_or_default());
    }

    #[test]
    fn absent_value_ts_parses_as_empty_and_is_not_written() {
        let line = r#"{"type":"read","client":5,"keys":["k1"],"reads":{"k1":0},"start_ns":1,"end_ns":2,"ok":true}"#;
        let records = parse_history(line.as_bytes()).expect("value_ts is optional");
        let Record::Read(read) = &records[0] else {
            panic!("a read: {records:?}");
        };
        assert!(read.value_ts.is_empty());
        assert!(!records[0].to_json_line().contains("value_ts"));
    }

    #[test]
    fn malformed_line_error_names_its_line_and_problem() {
        let mut text = sample_history_text();
        text.push('\n'); // line 4: empty, skipped
        text.push_str(r#"{"type":"write","client":3,"ts":"soon","keys":[],"start_ns":1,"end_ns":2,"ok":true}"#);
        text.push('\n');
        let error = parse_history(text.as_bytes()).expect_err("ts must be a number");
        let HistoryError::Malformed { line, .. } = &error else {
            panic!("expected a malformed-line error, got {error}");
        };
        assert_eq!(*line, 5);
        let message = error.to_string();
        assert!(message.starts_with("history:5:"), "{message}");
        assert!(message.contains("invalid type"), "{message}");
    }

    #[test]
    fn rule_violations_are_malformed_lines() {
        let cases = [
            (r#"{"type":"write","client":1,"ts":0,"keys":["a"],"start_ns":1,"end_ns":2,"ok":true}"#, "ts 0"),
            (r#"{"type":"write","client":1,"ts":9,"keys":["a"],"start_ns":5,"end_ns":2,"ok":true}"#, "before start_ns"),
            (
                r#"{"type":"read","client":1,"keys":["a"],"reads":{"a":1,"b":2},"start_ns":1,"end_ns":2,"ok":true}"#,
                "\"b\", which is not in \"keys\"",
            ),
            (
                r#"{"type":"read","client":1,"keys":["a","b"],"reads":{"a":1},"start_ns":1,"end_ns":2,"ok":true}"#,
                "no \"reads\" entry for key \"b\"",
            ),
            (
                r#"{"type":"read","client":1,"keys":["a","b"],"reads":{"a":1},"value_ts":{"b":1},"start_ns":1,"end_ns":2,"ok":false}"#,
                "\"value_ts\" has key \"b\"",
            ),
            (r#"{"type":"scan","client":1,"keys":[],"start_ns":1,"end_ns":2,"ok":true}"#, "unknown variant"),
            (r#"{"type":"write","client":1,"keys":["a"],"start_ns":1,"end_ns":2,"ok":true}"#, "needs field `ts`"),
            (r#"{"type":"read","client":1,"keys":["a"],"start_ns":1,"end_ns":2,"ok":true}"#, "needs field `reads`"),
            (r#"{"client":1,"ts":3,"keys":["a"],"start_ns":1,"end_ns":2,"ok":true}"#, "missing field `type`"),
            (r#"{"type":"write","client":-1,"ts":3,"keys":["a"],"start_ns":1,"end_ns":2,"ok":true}"#, "invalid value"),
        ];
        for (line, expected) in cases {
            let error = parse_history(line.as_bytes()).expect_err(line);
            let message = error.to_string();
            assert!(message.contains(expected), "{line}\n  gave: {message}");
        }
    }

    #[test]
    fn each_broken_rule_is_its_own_fault() {
        let mut write = write_record(1, 0, &["a"]);
        assert!(matches!(Record::Write(write.clone()).validate(), Err(RecordFault::WriteAtInitialTs)));
        write.ts = 3;
        write.end_ns = write.start_ns.wrapping_sub(1);
        let fault = Record::Write(write).validate().expect_err("ends before it starts");
        assert!(matches!(fault, RecordFault::EndBeforeStart { .. }), "{fault}");
        let line = r#"{"type":"read","client":1,"keys":["a"],"reads":{"a":1},"round1":[1,2],"start_ns":1,"end_ns":2,"ok":true}"#;
        // Each line ends with its newline: only a last line without one is read as cut short.
        match parse_history(format!("{line}\n").as_bytes()).expect_err(line) {
            HistoryError::Malformed { line: 1, reason: RecordFault::RoundOneCount { entries: 2, keys: 1 }, .. } => {}
            other => panic!("{other}"),
        }
        let line = r#"{"type":"read","client":1,"keys":["a"],"reads":{"a":1},"round2":["a"],"start_ns":1,"end_ns":2,"ok":true}"#;
        match parse_history(format!("{line}\n").as_bytes()).expect_err(line) {
            HistoryError::Malformed { reason: RecordFault::RoundTwoWithoutRoundOne, .. } => {}
            other => panic!("{other}"),
        }
        match parse_history(&b"{not json"[..]).expect_err("not JSON") {
            HistoryError::CutLastLine { reason: RecordFault::Json(_), .. } => {}
            other => panic!("{other}"),
        }
    }

    #[test]
    fn failed_read_may_lack_keys() {
        let line = r#"{"type":"read","client":1,"keys":["a","b"],"reads":{"a":1},"start_ns":1,"end_ns":2,"ok":false}"#;
        assert!(parse_history(line.as_bytes()).is_ok());
    }

    #[test]
    fn empty_and_blank_lines_are_skipped() {
        let text = format!("\n  \n{}\r\n\n", sample_history_text().trim_end());
        let records = parse_history(text.as_bytes()).expect("blank lines are fine");
        assert_eq!(records.len(), 3);
    }

    #[test]
    fn streaming_reader_numbers_lines_and_continues_after_a_bad_line() {
        let text = format!(
            "{}\nnot json\n\n{}",
            Record::Write(write_record(1, 7, &["a"])).to_json_line(),
            Record::Write(write_record(1, 8, &["a"])).to_json_line()
        );
        let items: Vec<_> = HistoryReader::new(text.as_bytes(), "test").collect();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].as_ref().map(|numbered| numbered.line).ok(), Some(1));
        assert!(matches!(items[1], Err(HistoryError::Malformed { line: 2, .. })));
        assert_eq!(items[2].as_ref().map(|numbered| numbered.line).ok(), Some(4));
    }

    #[test]
    fn over_long_line_is_refused_and_ends_reading() {
        let mut text = vec![b' '; HISTORY_LINE_BYTES_MAX + 10];
        text.extend_from_slice(b"\n{}\n");
        let items: Vec<_> = HistoryReader::new(text.as_slice(), "big").collect();
        assert_eq!(items.len(), 1);
        assert!(matches!(items[0], Err(HistoryError::LineTooLong { line: 1, .. })));
    }

    #[test]
    fn line_of_exactly_the_maximum_is_accepted() {
        let record = Record::Write(write_record(1, 7, &["a"])).to_json_line();
        let mut text = vec![b' '; HISTORY_LINE_BYTES_MAX - record.len()];
        text.extend_from_slice(record.as_bytes());
        text.push(b'\n');
        let records = parse_history(text.as_slice()).expect("at the bound is fine");
        assert_eq!(records.len(), 1);
    }

    proptest! {
        #[test]
        fn parser_never_panics_on_arbitrary_text(text in ".{0,300}") {
            let _ = parse_history(text.as_bytes());
        }

        #[test]
        fn parser_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_history(bytes.as_slice());
        }

        #[test]
        fn cut_line_is_a_cut_last_line_error_on_line_one(cut in 0usize..1000, which in 0usize..3) {
            let text = sample_history_text();
            let line = text.lines().nth(which).unwrap_or_default();
            let cut = cut % (line.len() + 1);
            let result = parse_history(&line.as_bytes()[..cut]);
            if cut == 0 {
                prop_assert_eq!(result.ok().map(|records| records.len()), Some(0));
            } else if cut == line.len() {
                prop_assert!(result.is_ok());
            } else {
                let is_cut_line_one = matches!(result, Err(HistoryError::CutLastLine { line: 1, .. }));
                prop_assert!(is_cut_line_one, "cut at {}: {:?}", cut, result);
                let mut terminated = line.as_bytes()[..cut].to_vec();
                terminated.push(b'\n');
                let result = parse_history(terminated.as_slice());
                let is_malformed_line_one = matches!(result, Err(HistoryError::Malformed { line: 1, .. }));
                prop_assert!(is_malformed_line_one, "cut at {} with a newline: {:?}", cut, result);
            }
        }

        #[test]
        fn mutated_line_never_panics(position in 0usize..200, byte in any::<u8>(), which in 0usize..3) {
            let text = sample_history_text();
            let mut line = text.lines().nth(which).unwrap_or_default().as_bytes().to_vec();
            let position = position % line.len();
            line[position] = byte;
            let _ = parse_history(line.as_slice());
        }

        #[test]
        fn history_key_strings_round_trip(key in proptest::collection::vec(any::<u8>(), 0..40)) {
            let rendered = key_to_history_string(&key);
            prop_assert_eq!(key_from_history_string(&rendered), Some(key));
        }

        #[test]
        fn plain_utf8_keys_appear_as_themselves(key in "[a-zA-Z0-9_:/ -]{0,30}") {
            prop_assume!(!key.starts_with("0x"));
            prop_assert_eq!(key_to_history_string(key.as_bytes()), key);
        }

        #[test]
        fn check_values_round_trip(ts in 1u64.., length in 8usize..300) {
            let mut value = vec![0u8; length];
            fill_check_value(ts, &mut value);
            prop_assert_eq!(decode_check_value(&value), Some(ts));
            prop_assert_eq!(verify_check_value(&value), Some(ts));
        }
    }

    #[test]
    fn hex_rendering_of_binary_and_0x_keys() {
        assert_eq!(key_to_history_string(b"user:17"), "user:17");
        assert_eq!(key_to_history_string(b""), "");
        assert_eq!(key_to_history_string(&[0xff, 0x00, 0x1a]), "0xff001a");
        assert_eq!(key_to_history_string(b"0x1"), "0x307831");
        assert_eq!(key_from_history_string("0xABCD"), None);
        assert_eq!(key_from_history_string("0x123"), None);
    }

    #[test]
    fn check_value_layout_is_prefix_then_pattern() {
        let ts = 0x0102_0304_0506_0708;
        let mut value = [0u8; 20];
        fill_check_value(ts, &mut value);
        assert_eq!(value[..8], [8, 7, 6, 5, 4, 3, 2, 1]);
        let mut other_ts = [0u8; 20];
        fill_check_value(ts + 1, &mut other_ts);
        assert_ne!(value[8..], other_ts[8..], "the body depends on ts");
        let mut longer = [0u8; 28];
        fill_check_value(ts, &mut longer);
        assert_ne!(value[8..], longer[8..20], "the body depends on the length");
    }

    #[test]
    fn empty_value_is_the_initial_value_and_short_values_are_invalid() {
        assert_eq!(decode_check_value(&[]), Some(0));
        assert_eq!(verify_check_value(&[]), Some(0));
        for length in 1..CHECK_VALUE_PREFIX_LEN {
            assert_eq!(decode_check_value(&vec![1; length]), None);
            assert_eq!(verify_check_value(&vec![1; length]), None);
        }
        let mut prefix_only = [0u8; 8];
        fill_check_value(42, &mut prefix_only);
        assert_eq!(verify_check_value(&prefix_only), Some(42));
    }

    #[test]
    fn any_flipped_byte_fails_verification() {
        let mut value = vec![0u8; 61];
        fill_check_value(987_654_321, &mut value);
        for position in 0..value.len() {
            let mut corrupted = value.clone();
            corrupted[position] ^= 0x10;
            assert_eq!(verify_check_value(&corrupted), None, "flip at byte {position}");
        }
    }

    #[test]
    fn torn_value_fails_verification() {
        let mut old = vec![0u8; 64];
        let mut new = vec![0u8; 64];
        fill_check_value(100, &mut old);
        fill_check_value(200, &mut new);
        // The reader got the new prefix and the old tail: decode alone is fooled, verify is not.
        let mut torn = new[..32].to_vec();
        torn.extend_from_slice(&old[32..]);
        assert_eq!(decode_check_value(&torn), Some(200));
        assert_eq!(verify_check_value(&torn), None);
        assert_eq!(verify_check_value(&old[..40]), None, "a truncated value fails too");
    }

    #[test]
    fn value_ts_of_marks_corrupt_values() {
        let mut value = vec![0u8; 32];
        fill_check_value(77, &mut value);
        assert_eq!(value_ts_of(&value), 77);
        assert_eq!(value_ts_of(&[]), 0);
        value[20] ^= 1;
        assert_eq!(value_ts_of(&value), VALUE_TS_CORRUPT);
    }

    #[test]
    #[should_panic(expected = "at least 8 bytes")]
    fn filling_a_too_short_value_is_a_caller_bug() {
        fill_check_value(1, &mut [0u8; 7]);
    }

    #[test]
    fn sink_is_shareable_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<HistorySink>();
    }

    #[test]
    fn sink_batches_from_threads_come_back_whole() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("history.jsonl");
        let sink = HistorySink::create(&path).expect("create");
        let threads_count = 4u64;
        let batches_per_thread = 50u64;
        std::thread::scope(|scope| {
            for thread in 0..threads_count {
                let sink = &sink;
                scope.spawn(move || {
                    for batch in 0..batches_per_thread {
                        let records: Vec<Record> = (0..10)
                            .map(|item| {
                                let ts = (thread << 32) | (batch << 8) | (item + 1);
                                Record::Write(write_record(thread, ts, &["a", "b"]))
                            })
                            .collect();
                        sink.append(&records).expect("append");
                    }
                });
            }
        });
        sink.finish().expect("finish");
        let records = read_history(&path).expect("read back");
        assert_eq!(records.len() as u64, threads_count * batches_per_thread * 10);
        let distinct: BTreeSet<u64> = records
            .iter()
            .filter_map(|record| match record {
                Record::Write(write) => Some(write.ts),
                Record::Read(_) => None,
            })
            .collect();
        assert_eq!(distinct.len(), records.len());
    }

    #[test]
    fn sink_refuses_an_invalid_batch_whole() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("history.jsonl");
        let sink = HistorySink::create(&path).expect("create");
        let batch = [Record::Write(write_record(1, 5, &["a"])), Record::Write(write_record(1, 0, &["a"]))];
        let error = sink.append(&batch).expect_err("ts 0 is invalid");
        assert!(matches!(error, HistoryError::InvalidRecord { reason: RecordFault::WriteAtInitialTs, .. }), "{error}");
        assert!(error.to_string().contains("history.jsonl"), "{error}");
        sink.flush().expect("flush");
        assert_eq!(read_history(&path).expect("read back"), Vec::new());
    }

    #[test]
    fn file_errors_name_the_path() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let missing = directory.path().join("no-such-dir").join("history.jsonl");
        let create_error = HistorySink::create(&missing).expect_err("parent is missing");
        assert!(create_error.to_string().contains("no-such-dir"), "{create_error}");
        let open_error = read_history(&missing).expect_err("file is missing");
        assert!(open_error.to_string().contains("no-such-dir"), "{open_error}");

        let path = directory.path().join("bad.jsonl");
        std::fs::write(&path, "{}\n").expect("write");
        let parse_error = read_history(&path).expect_err("missing tag");
        let message = parse_error.to_string();
        assert!(message.contains("bad.jsonl:1:"), "{message}");
    }
}
