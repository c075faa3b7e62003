//! The core workload at run time: YCSB's `CoreWorkload` operations, one draw at a time.
//!
//! # Load phase
//! Key numbers `insertstart .. insertstart + insertcount`, in that order (YCSB's
//! `keysequence`, a counter); each record has all `fieldcount` fields.
//!
//! # Run phase
//! Each operation is drawn by a [`Discrete`] chooser over the proportions, in YCSB's order
//! (read, update, insert, scan, read-modify-write). Then:
//! - read, update, scan, read-modify-write draw a key number with the request distribution
//!   (`nextKeynum`): a key above the insert counter's last acknowledged value is redrawn, so a
//!   key is never requested before its insert finished;
//! - insert takes the next number of an [`AcknowledgedCounter`] that starts at `recordcount`;
//!   the caller acknowledges it once the insert finished ([`CoreWorkload::acknowledge_insert`]).
//!   Until then `latest` does not return it and zipfian redraws it.
//!
//! Key choosers, as in YCSB's `CoreWorkload.init`:
//! - uniform: [`Uniform`] over `[insertstart, insertstart + insertcount - 1]`;
//! - zipfian: [`ScrambledZipfian`] over `[insertstart, insertstart + insertcount +
//!   expectednewkeys]`, `expectednewkeys = (int) (operationcount * insertproportion * 2)`;
//! - latest: [`SkewedLatest`] over the insert counter;
//! - hotspot: [`Hotspot`] over the same range as uniform.
//!
//! Every draw comes from one [`Random`] seeded at construction, in the order the methods are
//! called: a seed and a call sequence replay exactly.

use crate::config::{CoreWorkloadConfig, FieldLengthDistribution, RequestDistribution, ScanLengthDistribution};
use crate::generator::{
    AcknowledgedCounter, Counter, Discrete, Hotspot, ScrambledZipfian, SkewedLatest, Uniform, Zipfian,
};
use crate::key::{KeyName, KeyNames};
use crate::limits::KEY_DRAWS_MAX;
use crate::{Error, Random};

/// The five YCSB operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperationKind {
    /// Read one record.
    Read,
    /// Overwrite one field (or all, with `writeallfields`) of an existing record.
    Update,
    /// Insert a new record.
    Insert,
    /// Read a range of records in key order.
    Scan,
    /// Read a record, then update it.
    ReadModifyWrite,
}

impl OperationKind {
    /// The name YCSB prints in its report (`[READ]`, `[READ-MODIFY-WRITE]`, ...).
    pub fn ycsb_name(self) -> &'static str {
        match self {
            OperationKind::Read => "READ",
            OperationKind::Update => "UPDATE",
            OperationKind::Insert => "INSERT",
            OperationKind::Scan => "SCAN",
            OperationKind::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }
}

/// One drawn operation, with its key number (format it with [`CoreWorkload::key_name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Read the record of `key_number`.
    Read {
        /// The key number.
        key_number: u64,
    },
    /// Update the record of `key_number`.
    Update {
        /// The key number.
        key_number: u64,
    },
    /// Insert the record of `key_number`; acknowledge it when done.
    Insert {
        /// The key number, from the insert counter.
        key_number: u64,
    },
    /// Scan `record_count` records from `start_key_number`'s key in key order.
    Scan {
        /// The key number of the first key.
        start_key_number: u64,
        /// How many records.
        record_count: u64,
    },
    /// Read, then update, the record of `key_number`.
    ReadModifyWrite {
        /// The key number.
        key_number: u64,
    },
}

impl Operation {
    /// The operation's kind.
    pub fn kind(&self) -> OperationKind {
        match self {
            Operation::Read { .. } => OperationKind::Read,
            Operation::Update { .. } => OperationKind::Update,
            Operation::Insert { .. } => OperationKind::Insert,
            Operation::Scan { .. } => OperationKind::Scan,
            Operation::ReadModifyWrite { .. } => OperationKind::ReadModifyWrite,
        }
    }

    /// The (first) key number.
    pub fn key_number(&self) -> u64 {
        match *self {
            Operation::Read { key_number }
            | Operation::Update { key_number }
            | Operation::Insert { key_number }
            | Operation::ReadModifyWrite { key_number } => key_number,
            Operation::Scan { start_key_number, .. } => start_key_number,
        }
    }
}

/// The request distribution, resolved to a generator.
#[derive(Clone, Debug)]
enum KeyChooser {
    Uniform(Uniform),
    Zipfian(ScrambledZipfian),
    Latest(SkewedLatest),
    Hotspot(Hotspot),
}

impl KeyChooser {
    /// YCSB's choice of key generator for `requestdistribution` (see the module docs).
    fn new(config: &CoreWorkloadConfig, last_inserted: u64) -> Result<Self, Error> {
        let first = config.insert_start;
        let last_loaded = first + config.resolved_insert_count() - 1;
        Ok(match config.request_distribution {
            RequestDistribution::Uniform => KeyChooser::Uniform(Uniform::new(first, last_loaded)?),
            RequestDistribution::Zipfian => {
                let last = last_loaded.saturating_add(1 + config.expected_new_keys());
                KeyChooser::Zipfian(ScrambledZipfian::new(first, last)?)
            }
            RequestDistribution::Latest => KeyChooser::Latest(SkewedLatest::new(last_inserted)?),
            RequestDistribution::Hotspot { hot_data_fraction, hot_operation_fraction } => {
                KeyChooser::Hotspot(Hotspot::new(first, last_loaded, hot_data_fraction, hot_operation_fraction)?)
            }
        })
    }
}

/// A length distribution (field lengths, scan lengths).
#[derive(Clone, Debug)]
enum LengthChooser {
    Constant(u64),
    Uniform(Uniform),
    Zipfian(Zipfian),
}

impl LengthChooser {
    /// `fieldlengthdistribution` over `[minfieldlength, fieldlength]`.
    fn field_lengths(config: &CoreWorkloadConfig) -> Result<Self, Error> {
        let (min, max) = (config.min_field_length, config.field_length);
        Ok(match config.field_length_distribution {
            FieldLengthDistribution::Constant => LengthChooser::Constant(max),
            FieldLengthDistribution::Uniform => LengthChooser::Uniform(Uniform::new(min, max)?),
            FieldLengthDistribution::Zipfian => LengthChooser::Zipfian(Zipfian::new(min, max)?),
        })
    }

    /// `scanlengthdistribution` over `[minscanlength, maxscanlength]`.
    fn scan_lengths(config: &CoreWorkloadConfig) -> Result<Self, Error> {
        let (min, max) = (config.min_scan_length, config.max_scan_length);
        Ok(match config.scan_length_distribution {
            ScanLengthDistribution::Uniform => LengthChooser::Uniform(Uniform::new(min, max)?),
            ScanLengthDistribution::Zipfian => LengthChooser::Zipfian(Zipfian::new(min, max)?),
        })
    }

    #[inline]
    fn next(&self, random: &mut Random) -> u64 {
        match self {
            LengthChooser::Constant(length) => *length,
            LengthChooser::Uniform(uniform) => uniform.next(random),
            LengthChooser::Zipfian(zipfian) => zipfian.next(random),
        }
    }
}

/// A YCSB core workload generator.
#[derive(Clone, Debug)]
pub struct CoreWorkload {
    config: CoreWorkloadConfig,
    seed: u64,
    random: Random,
    operation_chooser: Discrete<OperationKind>,
    key_chooser: KeyChooser,
    field_chooser: Uniform,
    field_length: LengthChooser,
    scan_length: LengthChooser,
    load_sequence: Counter,
    load_end: u64,
    insert_sequence: AcknowledgedCounter,
    key_names: KeyNames,
}

impl CoreWorkload {
    /// A generator for `config` whose every draw derives from `seed`.
    ///
    /// Start-up cost is that of YCSB: a zipfian field-length or scan-length distribution, and
    /// `latest`, sum zeta over their item counts (about 10 ns per item).
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] if `config` does not validate.
    pub fn new(config: CoreWorkloadConfig, seed: u64) -> Result<Self, Error> {
        config.validate()?;
        let insert_start = config.insert_start;
        let insert_count = config.resolved_insert_count();
        let insert_sequence = AcknowledgedCounter::new(config.record_count);
        let key_chooser = KeyChooser::new(&config, insert_sequence.last_value().unwrap_or(0))?;
        let proportions = config.proportions;
        let operation_chooser = Discrete::new(&[
            (proportions.read, OperationKind::Read),
            (proportions.update, OperationKind::Update),
            (proportions.insert, OperationKind::Insert),
            (proportions.scan, OperationKind::Scan),
            (proportions.read_modify_write, OperationKind::ReadModifyWrite),
        ])?;
        Ok(CoreWorkload {
            field_length: LengthChooser::field_lengths(&config)?,
            scan_length: LengthChooser::scan_lengths(&config)?,
            field_chooser: Uniform::new(0, config.field_count - 1)?,
            key_names: KeyNames::new(config.insert_order, config.zero_padding)?,
            load_sequence: Counter::new(insert_start),
            load_end: insert_start + insert_count,
            random: Random::new(seed),
            seed,
            operation_chooser,
            key_chooser,
            insert_sequence,
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CoreWorkloadConfig {
        &self.config
    }

    /// The seed every draw derives from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The key naming scheme.
    pub fn key_names(&self) -> &KeyNames {
        &self.key_names
    }

    /// The name of `key_number` (YCSB's `buildKeyName`).
    #[inline]
    pub fn key_name(&self, key_number: u64) -> KeyName {
        self.key_names.name(key_number)
    }

    /// The next key number of the load phase, `None` once all `insertcount` are handed out.
    pub fn next_load_key_number(&mut self) -> Option<u64> {
        if self.load_sequence.peek() >= self.load_end {
            return None;
        }
        self.load_sequence.next_value()
    }

    /// Load-phase key numbers not handed out yet.
    pub fn load_remaining(&self) -> u64 {
        self.load_end.saturating_sub(self.load_sequence.peek())
    }

    /// The next run-phase operation.
    ///
    /// # Errors
    /// [`Error::TooManyUnacknowledgedInserts`] for an insert while the window is full,
    /// [`Error::KeyDrawsExhausted`] if no inserted key could be drawn (see
    /// [`CoreWorkload::next_key_number`]).
    // `inline(always)` on this and the draws below, measured: when the compiler kept
    // `next_operation` out of line, zipfian generation fell from 27 to 15 million per second.
    #[inline(always)]
    pub fn next_operation(&mut self) -> Result<Operation, Error> {
        let kind = self.next_operation_kind();
        if kind == OperationKind::Insert {
            return Ok(Operation::Insert { key_number: self.next_insert_key_number()? });
        }
        // Read, update, scan and read-modify-write share the key draw; only the variant
        // differs, which the compiler can select without a branch on the (unpredictable) kind.
        let key_number = self.next_key_number()?;
        Ok(match kind {
            OperationKind::Read => Operation::Read { key_number },
            OperationKind::Update => Operation::Update { key_number },
            OperationKind::Scan => {
                Operation::Scan { start_key_number: key_number, record_count: self.next_scan_length() }
            }
            OperationKind::ReadModifyWrite | OperationKind::Insert => Operation::ReadModifyWrite { key_number },
        })
    }

    /// Draws only the kind of the next operation (YCSB's `operationchooser`).
    #[inline(always)]
    pub fn next_operation_kind(&mut self) -> OperationKind {
        self.operation_chooser.next(&mut self.random)
    }

    /// A key number of an existing (loaded or acknowledged) record, by the request
    /// distribution (YCSB's `nextKeynum`).
    ///
    /// # Errors
    /// [`Error::KeyDrawsExhausted`] after [`KEY_DRAWS_MAX`] draws above the last acknowledged
    /// insert (YCSB would loop forever); [`Error::InvalidConfiguration`] if `latest` would
    /// need zeta over more than [`crate::limits::ZETA_TERMS_MAX`] keys.
    #[inline(always)]
    pub fn next_key_number(&mut self) -> Result<u64, Error> {
        let last_inserted = self.last_inserted_key_number();
        let key_number = self.draw_key_number(last_inserted)?;
        if key_number <= last_inserted {
            return Ok(key_number);
        }
        self.redraw_key_number(last_inserted)
    }

    /// YCSB's redraw loop, bounded; only zipfian with inserts ever gets here.
    #[cold]
    fn redraw_key_number(&mut self, last_inserted: u64) -> Result<u64, Error> {
        for _ in 1..KEY_DRAWS_MAX {
            let key_number = self.draw_key_number(last_inserted)?;
            if key_number <= last_inserted {
                return Ok(key_number);
            }
        }
        Err(Error::KeyDrawsExhausted { draws: KEY_DRAWS_MAX })
    }

    #[inline(always)]
    fn draw_key_number(&mut self, last_inserted: u64) -> Result<u64, Error> {
        Ok(match &mut self.key_chooser {
            KeyChooser::Uniform(uniform) => uniform.next(&mut self.random),
            KeyChooser::Zipfian(zipfian) => zipfian.next(&mut self.random),
            KeyChooser::Latest(latest) => latest.next(last_inserted, &mut self.random)?,
            KeyChooser::Hotspot(hotspot) => hotspot.next(&mut self.random),
        })
    }

    /// A new key number for an insert. Acknowledge it with
    /// [`CoreWorkload::acknowledge_insert`] once the insert finished.
    ///
    /// # Errors
    /// [`Error::TooManyUnacknowledgedInserts`] when the acknowledgement window is full.
    #[inline]
    pub fn next_insert_key_number(&mut self) -> Result<u64, Error> {
        self.insert_sequence.next_value()
    }

    /// Marks an insert as finished: its key becomes readable (and the latest, once every
    /// earlier insert is acknowledged too). Call it whether the insert succeeded or not, as
    /// YCSB does.
    ///
    /// # Errors
    /// [`Error::InvalidAcknowledgement`] for a key number not waiting for acknowledgement.
    pub fn acknowledge_insert(&mut self, key_number: u64) -> Result<(), Error> {
        self.insert_sequence.acknowledge(key_number)
    }

    /// Inserts that can still be handed out before the window is full.
    pub fn inserts_available(&self) -> u64 {
        self.insert_sequence.available()
    }

    /// The highest key number below which every insert is acknowledged.
    #[inline]
    pub fn last_inserted_key_number(&self) -> u64 {
        // record_count >= 1 (validated), so the counter's last value exists from the start.
        self.insert_sequence.last_value().unwrap_or(0)
    }

    /// A scan length by `scanlengthdistribution`.
    #[inline]
    pub fn next_scan_length(&mut self) -> u64 {
        self.scan_length.next(&mut self.random)
    }

    /// A field index for single-field reads and updates, uniform in `[0, fieldcount)`.
    #[inline]
    pub fn next_field_index(&mut self) -> u64 {
        self.field_chooser.next(&mut self.random)
    }

    /// A field length by `fieldlengthdistribution`.
    #[inline]
    pub fn next_field_length(&mut self) -> u64 {
        self.field_length.next(&mut self.random)
    }

    /// Fills `bytes` with a random printable value (YCSB's `RandomByteIterator`).
    #[inline]
    pub fn fill_value(&mut self, bytes: &mut [u8]) {
        self.random.fill_printable(bytes);
    }

    /// The random source, for the transaction builder's values.
    pub(crate) fn random_mut(&mut self) -> &mut Random {
        &mut self.random
    }

    /// The name of field `index`: the prefix then the index (`field0`, `field1`, ...).
    pub fn field_name(&self, index: u64) -> String {
        format!("{}{index}", self.config.field_name_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BuiltinWorkload, Proportions};
    use crate::key::InsertOrder;

    fn workload(config: CoreWorkloadConfig, seed: u64) -> CoreWorkload {
        println!("seed {seed}");
        CoreWorkload::new(config, seed).expect("valid configuration")
    }

    /// 1e5 operations of each shipped workload: every operation's share is within 1% of the
    /// proportion (the binomial standard deviation is at most 0.16%).
    #[test]
    fn builtin_proportions_hold() {
        for (index, builtin) in BuiltinWorkload::ALL.into_iter().enumerate() {
            let mut generator = workload(builtin.config(), 1000 + index as u64);
            let draws = 100_000u32;
            let mut counts = [0u32; 5];
            for _ in 0..draws {
                let operation = generator.next_operation().expect("no error");
                if let Operation::Insert { key_number } = operation {
                    generator.acknowledge_insert(key_number).expect("valid");
                }
                let slot = match operation.kind() {
                    OperationKind::Read => 0,
                    OperationKind::Update => 1,
                    OperationKind::Insert => 2,
                    OperationKind::Scan => 3,
                    OperationKind::ReadModifyWrite => 4,
                };
                counts[slot] += 1;
            }
            let expected = builtin.config().proportions.normalized();
            for slot in 0..5 {
                let share = f64::from(counts[slot]) / f64::from(draws);
                assert!(
                    (share - expected[slot]).abs() < 0.01,
                    "{builtin:?} operation {slot}: {share} vs {}",
                    expected[slot]
                );
            }
        }
    }

    #[test]
    fn same_seed_same_operations() {
        let config = BuiltinWorkload::A.config();
        let mut first = workload(config.clone(), 9);
        let mut second = workload(config.clone(), 9);
        let mut other = workload(config, 10);
        let mut differs = false;
        for _ in 0..10_000 {
            let operation = first.next_operation().expect("no error");
            assert_eq!(operation, second.next_operation().expect("no error"));
            differs |= operation != other.next_operation().expect("no error");
        }
        assert!(differs);
    }

    #[test]
    fn load_phase_follows_ycsb_order() {
        let mut config = BuiltinWorkload::A.config();
        config.record_count = 100;
        config.insert_start = 10;
        config.insert_count = Some(5);
        let mut generator = workload(config, 1);
        let loaded: Vec<u64> = std::iter::from_fn(|| generator.next_load_key_number()).collect();
        assert_eq!(loaded, vec![10, 11, 12, 13, 14]);
        assert_eq!(generator.load_remaining(), 0);
        // Hashed names, as YCSB's first loaded keys.
        let mut default_load = workload(BuiltinWorkload::C.config(), 1);
        let first = default_load.next_load_key_number().expect("records to load");
        assert_eq!(default_load.key_name(first).as_str(), "user6284781860667377211");
    }

    #[test]
    fn keys_stay_in_the_loaded_range() {
        for builtin in [BuiltinWorkload::A, BuiltinWorkload::C] {
            let mut generator = workload(builtin.config(), 31);
            for _ in 0..100_000 {
                let key = generator.next_key_number().expect("no error");
                assert!(key < 1000, "{builtin:?} drew {key}");
            }
        }
        let mut config = BuiltinWorkload::C.config();
        config.request_distribution = RequestDistribution::Uniform;
        config.insert_start = 100;
        config.insert_count = Some(50);
        let mut generator = workload(config, 32);
        for _ in 0..10_000 {
            let key = generator.next_key_number().expect("no error");
            assert!((100..150).contains(&key), "drew {key}");
        }
    }

    /// Zipfian with inserts: the key space covers expected new keys, and a key is drawn only
    /// once its insert is acknowledged.
    #[test]
    fn zipfian_with_inserts_never_returns_unacknowledged_keys() {
        let mut config = BuiltinWorkload::E.config();
        config.operation_count = 10_000;
        assert_eq!(config.expected_new_keys(), 1000);
        let mut generator = workload(config, 41);
        let mut pending = Vec::new();
        let mut above_load = 0u32;
        for round in 0..20_000u32 {
            match generator.next_operation().expect("no error") {
                Operation::Insert { key_number } => pending.push(key_number),
                operation => {
                    let key = operation.key_number();
                    assert!(key <= generator.last_inserted_key_number(), "key {key}");
                    if key >= 1000 {
                        above_load += 1;
                    }
                }
            }
            // Acknowledge in batches, out of order.
            if round % 50 == 49 {
                while let Some(key_number) = pending.pop() {
                    generator.acknowledge_insert(key_number).expect("valid");
                }
            }
        }
        assert!(above_load > 0, "inserted keys become readable");
    }

    #[test]
    fn latest_follows_acknowledged_inserts() {
        let mut generator = workload(BuiltinWorkload::D.config(), 51);
        let key = generator.next_insert_key_number().expect("room");
        assert_eq!(key, 1000);
        for _ in 0..10_000 {
            assert!(generator.next_key_number().expect("no error") <= 999);
        }
        generator.acknowledge_insert(key).expect("valid");
        let newest = (0..10_000).filter(|_| generator.next_key_number().expect("no error") == 1000).count();
        assert!(newest > 1000, "the new key is the most popular: {newest}");
    }

    #[test]
    fn scans_and_fields_follow_their_distributions() {
        let mut generator = workload(BuiltinWorkload::E.config(), 61);
        for _ in 0..10_000 {
            let length = generator.next_scan_length();
            assert!((1..=100).contains(&length));
            let field = generator.next_field_index();
            assert!(field < 10);
            assert_eq!(generator.next_field_length(), 100);
        }
        assert_eq!(generator.field_name(3), "field3");
    }

    #[test]
    fn hotspot_and_ordered_keys() {
        let mut config = CoreWorkloadConfig {
            record_count: 1000,
            request_distribution: RequestDistribution::Hotspot { hot_data_fraction: 0.1, hot_operation_fraction: 0.9 },
            insert_order: InsertOrder::Ordered,
            ..CoreWorkloadConfig::default()
        };
        config.proportions = Proportions { read: 1.0, ..Proportions::default() };
        let mut generator = workload(config, 71);
        let hot = (0..10_000).filter(|_| generator.next_key_number().expect("no error") < 100).count();
        assert!((8_800..9_200).contains(&hot), "hot draws {hot}");
        assert_eq!(generator.key_name(42).as_str(), "user42");
    }

    #[test]
    fn invalid_configurations_are_errors() {
        let mut config = BuiltinWorkload::A.config();
        config.record_count = 0;
        assert!(CoreWorkload::new(config, 1).is_err());
        let mut config = BuiltinWorkload::A.config();
        config.proportions = Proportions { read: 0.0, update: 0.0, ..Proportions::default() };
        assert!(CoreWorkload::new(config, 1).is_err());
    }
}
