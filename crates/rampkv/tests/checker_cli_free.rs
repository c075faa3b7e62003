//! Integration tests of the history and checker library API, without the binary or a server.
//!
//! A seeded, single-threaded simulation runs logical clients over a toy store in one of three
//! isolation modes, records what they saw through a [`HistorySink`] in check mode, and checks
//! the file with [`check_file`]. The checker must find nothing when transactions take effect
//! atomically (even with clients that die after committing), fractured reads when each key is
//! read and written on its own (NoCC), and garbage when, in addition, a value can be read while
//! half written. Every test prints its seed; the simulation is a pure function of it.

use std::collections::{BTreeMap, HashMap};

use rampkv::checker::{check, check_file, GarbageExample};
use rampkv::history::{
    fill_check_value, read_history, value_ts_of, HistorySink, ReadRecord, Record, WriteRecord, VALUE_TS_CORRUPT,
};

const VALUE_BYTES: usize = 64;
const KEYS_COUNT: u64 = 6;
const KEYS_PER_TRANSACTION: usize = 3;
const CLIENTS_COUNT: u64 = 8;
/// Records a client buffers before appending them to the sink in one batch.
const BATCH_RECORDS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// A transaction takes effect in one step.
    Atomic,
    /// One key per step, each key's value written whole (like NoCC).
    PerKey,
    /// One key per step, and each value written in two steps: a read in between gets the new
    /// version's prefix and the old version's tail.
    PerKeyTorn,
}

/// SplitMix64, so the simulation depends on nothing but its seed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let word = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let word = (word ^ (word >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        word ^ (word >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// What the store holds for a key: the version's timestamp and its value bytes.
#[derive(Default, Clone)]
struct Stored {
    ts: u64,
    value: Vec<u8>,
}

enum Work {
    Write { ts: u64 },
    Read { reads: BTreeMap<String, u64>, value_ts: BTreeMap<String, u64> },
}

struct Transaction {
    work: Work,
    keys: Vec<String>,
    /// Steps done so far: keys done, or half-keys in `PerKeyTorn` writes.
    steps_done: usize,
    start_ns: u64,
}

struct Simulation {
    isolation: Isolation,
    random: SplitMix,
    store: HashMap<String, Stored>,
    pending: Vec<Option<Transaction>>,
    batches: Vec<Vec<Record>>,
    clock_ns: u64,
    transactions_started: u64,
}

impl Simulation {
    fn new(isolation: Isolation, seed: u64) -> Self {
        Self {
            isolation,
            random: SplitMix(seed),
            store: HashMap::new(),
            pending: (0..CLIENTS_COUNT).map(|_| None).collect(),
            batches: (0..CLIENTS_COUNT).map(|_| Vec::new()).collect(),
            clock_ns: 0,
            transactions_started: 0,
        }
    }

    /// Runs `steps` scheduling steps, appending every finished transaction to `sink`.
    fn run(&mut self, steps: u64, sink: &HistorySink) {
        for _ in 0..steps {
            self.clock_ns += 10;
            let client = self.random.below(CLIENTS_COUNT) as usize;
            if self.pending[client].is_none() {
                self.pending[client] = Some(self.start_transaction(client));
            }
            self.advance(client, sink);
        }
        for batch in &mut self.batches {
            sink.append(batch).expect("append the last batch");
            batch.clear();
        }
    }

    fn start_transaction(&mut self, client: usize) -> Transaction {
        self.transactions_started += 1;
        let mut keys = Vec::new();
        while keys.len() < KEYS_PER_TRANSACTION {
            let key = format!("key{}", self.random.below(KEYS_COUNT));
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let work = if self.random.below(2) == 0 {
            Work::Write { ts: (self.transactions_started << 16) | (client as u64 + 1) }
        } else {
            Work::Read { reads: BTreeMap::new(), value_ts: BTreeMap::new() }
        };
        Transaction { work, keys, steps_done: 0, start_ns: self.clock_ns }
    }

    /// Does one step of the client's transaction (all of it when atomic); finishes it when done.
    fn advance(&mut self, client: usize, sink: &HistorySink) {
        let Some(mut transaction) = self.pending[client].take() else {
            return;
        };
        let steps_total = self.steps_total(&transaction);
        let steps_now = if self.isolation == Isolation::Atomic { steps_total } else { 1 };
        for _ in 0..steps_now {
            self.step(&mut transaction);
        }
        if transaction.steps_done < steps_total {
            self.pending[client] = Some(transaction);
            return;
        }
        let record = self.finish(client, transaction);
        self.batches[client].push(record);
        if self.batches[client].len() >= BATCH_RECORDS {
            sink.append(&self.batches[client]).expect("append a batch");
            self.batches[client].clear();
        }
    }

    fn steps_total(&self, transaction: &Transaction) -> usize {
        match (&transaction.work, self.isolation) {
            (Work::Write { .. }, Isolation::PerKeyTorn) => 2 * transaction.keys.len(),
            _ => transaction.keys.len(),
        }
    }

    fn step(&mut self, transaction: &mut Transaction) {
        let torn = self.isolation == Isolation::PerKeyTorn;
        let (key_index, second_half) = if torn && matches!(transaction.work, Work::Write { .. }) {
            (transaction.steps_done / 2, transaction.steps_done % 2 == 1)
        } else {
            (transaction.steps_done, false)
        };
        let key = transaction.keys[key_index].clone();
        match &mut transaction.work {
            Work::Write { ts } => self.write_key(&key, *ts, torn, second_half),
            Work::Read { reads, value_ts } => {
                let stored = self.store.get(&key).cloned().unwrap_or_default();
                reads.insert(key.clone(), stored.ts);
                value_ts.insert(key, value_ts_of(&stored.value));
            }
        }
        transaction.steps_done += 1;
    }

    /// Writes the version `ts` of `key`: whole, or when `torn` one half per call (the version
    /// and the first half of the bytes first).
    fn write_key(&mut self, key: &str, ts: u64, torn: bool, second_half: bool) {
        let mut value = vec![0u8; VALUE_BYTES];
        fill_check_value(ts, &mut value);
        let stored = self.store.entry(key.to_owned()).or_default();
        if !torn {
            *stored = Stored { ts, value };
            return;
        }
        let half = VALUE_BYTES / 2;
        if second_half {
            stored.value[half..].copy_from_slice(&value[half..]);
        } else {
            stored.value.resize(VALUE_BYTES, 0);
            stored.value[..half].copy_from_slice(&value[..half]);
            stored.ts = ts;
        }
    }

    fn finish(&mut self, client: usize, transaction: Transaction) -> Record {
        let (client, start_ns, end_ns) = (client as u64 + 1, transaction.start_ns, self.clock_ns);
        match transaction.work {
            Work::Write { ts } => Record::Write(WriteRecord {
                client,
                ts,
                keys: transaction.keys,
                start_ns,
                end_ns,
                // Some clients "die" after their write took effect: it may still be read.
                ok: self.random.below(20) != 0,
            }),
            Work::Read { reads, value_ts } => {
                // No protocol ran, so no round 1 to record.
                let (round1, round2) = (None, Vec::new());
                Record::Read(ReadRecord {
                    client,
                    keys: transaction.keys,
                    reads,
                    value_ts,
                    round1,
                    round2,
                    start_ns,
                    end_ns,
                    ok: true,
                })
            }
        }
    }
}

/// Simulates, records to a temporary file, checks the file, and checks that the in-memory
/// checker agrees with the file checker.
fn simulate_and_check(isolation: Isolation, seed: u64, steps: u64) -> rampkv::checker::Report {
    println!("isolation {isolation:?}, seed {seed:#x}, {steps} steps");
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("history.jsonl");
    let sink = HistorySink::create(&path).expect("create the history");
    let mut simulation = Simulation::new(isolation, seed);
    simulation.run(steps, &sink);
    sink.finish().expect("finish the history");
    let started = std::time::Instant::now();
    let report = check_file(&path).expect("check the history");
    println!("check_file took {:?}", started.elapsed());
    let records = read_history(&path).expect("read the history back");
    let in_memory = check(&records);
    assert_eq!(
        (in_memory.garbage, in_memory.fractured, in_memory.stale),
        (report.garbage, report.fractured, report.stale)
    );
    println!("{report}");
    report
}

#[test]
fn atomic_store_gives_a_clean_history() {
    let report = simulate_and_check(Isolation::Atomic, 0xA70_u64, 20_000);
    assert!(report.is_clean(), "{report}");
    assert!(report.reads_checked > 1_000, "{report}");
    assert!(report.writes_not_ok > 0, "dead clients' writes are part of the test: {report}");
}

#[test]
fn per_key_store_gives_fractured_reads() {
    let report = simulate_and_check(Isolation::PerKey, 0xF4AC_u64, 20_000);
    assert!(report.fractured > 0, "{report}");
    assert_eq!(report.garbage, 0, "values are written whole: {report}");
    assert!(!report.is_clean());
}

#[test]
fn half_written_values_are_garbage() {
    let report = simulate_and_check(Isolation::PerKeyTorn, 0x7047_u64, 20_000);
    assert!(report.garbage > 0, "{report}");
    let torn = report.garbage_examples.iter().any(
        |example| matches!(example, GarbageExample::ValueMismatch { value_ts, .. } if *value_ts == VALUE_TS_CORRUPT),
    );
    assert!(torn, "torn values show as corrupt: {report}");
}

#[test]
#[ignore = "writes and checks a history of about a million records; run with --ignored to measure"]
fn check_file_handles_a_million_records() {
    let started = std::time::Instant::now();
    let report = simulate_and_check(Isolation::Atomic, 0x1_000_000, 1_000_000);
    println!("simulated, recorded and checked in {:?}", started.elapsed());
    assert!(report.is_clean(), "{report}");
    assert!(report.reads_checked + report.writes > 990_000, "{report}");
}
