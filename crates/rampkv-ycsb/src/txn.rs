//! Grouping YCSB operations into rampkv transactions.
//!
//! RAMP offers two kinds of transaction: read-only (`get_all` of a set of keys) and
//! write-only (`put_all` of keys and values). YCSB operations map onto them as follows:
//!
//! | YCSB operation     | rampkv transaction                                           |
//! |--------------------|--------------------------------------------------------------|
//! | read               | read-only: the keys                                          |
//! | update             | write-only: the keys, each with one field (or all fields)    |
//! | insert             | write-only: new keys from the insert counter, all fields     |
//! | read-modify-write  | a read-only transaction, then a write-only one, same keys    |
//! | scan               | [`Error::Unsupported`]: rampkv has no range scans             |
//!
//! # How a transaction is formed
//! [`TxnGenerator::next_txn`] draws the operation kind once per transaction from the
//! proportions, then `txn_size` distinct keys: for reads, updates and read-modify-writes by the
//! request distribution (repeats are redrawn, at most
//! [`DISTINCT_KEY_DRAWS_PER_KEY_MAX`] times per key), for inserts from the insert counter.
//! Every transaction holds `txn_size` operations of one kind, so the share of each kind among
//! all operations equals YCSB's proportion in expectation (not only the share among
//! transactions). Mixed transactions are not formed because RAMP could not run them as one
//! transaction anyway: a read and a write of the same transaction would have to be split.
//!
//! Redrawing repeated keys changes the key distribution within a transaction slightly (a hot
//! key appears at most once per transaction); across transactions it is still the requested
//! distribution.
//!
//! # Read-modify-write is not atomic
//! RAMP has no read-write transactions. A read-modify-write is issued as a read transaction
//! followed by a write transaction on the same keys; another writer may commit in between.
//! This is what YCSB's read-modify-write does against most stores too (a read, then an update),
//! but it is not an atomic read-modify-write.
//!
//! # Values
//! A written key carries YCSB fields (index and random printable bytes of the field length);
//! its rampkv value is the concatenation of those fields' bytes ([`Write::value`]), and
//! [`Write::fields`] gives the split. An update with `writeallfields=false` therefore writes a
//! value holding only the one updated field: rampkv values are opaque, there is no per-field
//! merge on the server.
//!
//! # Allocation
//! A [`Txn`] is a reusable buffer: generating into the same `Txn` again reuses its vectors, so
//! once they have grown to the largest transaction nothing is allocated per transaction.

use crate::limits::{DISTINCT_KEY_DRAWS_PER_KEY_MAX, TXN_KEYS_MAX};
use crate::workload::{CoreWorkload, OperationKind};
use crate::{Error, Expected, KeyNames, Random};

/// What a [`Txn`] asks of rampkv.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxnKind {
    /// One read-only transaction (`get_all`).
    ReadOnly,
    /// One write-only transaction (`put_all`).
    WriteOnly,
    /// A read-only transaction, then a write-only one on the same keys; not atomic.
    ReadThenWrite,
}

/// One written field: its index and where its bytes are in the value buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FieldSlot {
    index: u64,
    start: usize,
    end: usize,
}

/// A generated transaction: keys, and for writes, their values. Reused across draws.
#[derive(Clone, Debug, Default)]
pub struct Txn {
    operation: Option<OperationKind>,
    key_numbers: Vec<u64>,
    key_bytes: Vec<u8>,
    /// End of each key in `key_bytes`.
    key_ends: Vec<usize>,
    value_bytes: Vec<u8>,
    fields: Vec<FieldSlot>,
    /// End of each key's fields in `fields` (writes only).
    field_ends: Vec<usize>,
    /// Inserts of the run phase must be acknowledged after they finish.
    acknowledge_inserts: bool,
}

impl Txn {
    /// An empty buffer.
    pub fn new() -> Self {
        Txn::default()
    }

    /// A buffer with room for `keys` keys of `value_bytes` values each, so that even the first
    /// transactions do not allocate.
    pub fn with_capacity(keys: usize, value_bytes: usize) -> Self {
        Txn {
            operation: None,
            key_numbers: Vec::with_capacity(keys),
            key_bytes: Vec::with_capacity(keys * 32),
            key_ends: Vec::with_capacity(keys),
            value_bytes: Vec::with_capacity(keys * value_bytes),
            fields: Vec::with_capacity(keys * 16),
            field_ends: Vec::with_capacity(keys),
            acknowledge_inserts: false,
        }
    }

    /// The YCSB operation every key of this transaction performs; `None` before the first
    /// draw.
    pub fn operation(&self) -> Option<OperationKind> {
        self.operation
    }

    /// What to run on rampkv.
    pub fn kind(&self) -> TxnKind {
        match self.operation {
            Some(OperationKind::Update) | Some(OperationKind::Insert) => TxnKind::WriteOnly,
            Some(OperationKind::ReadModifyWrite) => TxnKind::ReadThenWrite,
            _ => TxnKind::ReadOnly,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.key_ends.len()
    }

    /// Whether the transaction has no keys.
    pub fn is_empty(&self) -> bool {
        self.key_ends.is_empty()
    }

    /// The key numbers, in transaction order.
    pub fn key_numbers(&self) -> &[u64] {
        &self.key_numbers
    }

    /// The key at `position`.
    pub fn key(&self, position: usize) -> Option<&[u8]> {
        let end = *self.key_ends.get(position)?;
        let start = position.checked_sub(1).map_or(0, |before| self.key_ends[before]);
        Some(&self.key_bytes[start..end])
    }

    /// All keys, in transaction order (the read set, or the write set).
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|position| self.key(position).unwrap_or_default())
    }

    /// Whether the transaction writes (write-only or read-then-write).
    pub fn writes_values(&self) -> bool {
        !self.field_ends.is_empty()
    }

    /// The written keys with their values; empty for read-only transactions.
    pub fn writes(&self) -> impl Iterator<Item = Write<'_>> + '_ {
        (0..self.field_ends.len()).filter_map(|position| self.write(position))
    }

    /// The write of the key at `position`, if this transaction writes.
    pub fn write(&self, position: usize) -> Option<Write<'_>> {
        let fields_end = *self.field_ends.get(position)?;
        let fields_start = position.checked_sub(1).map_or(0, |before| self.field_ends[before]);
        let fields = &self.fields[fields_start..fields_end];
        let value_start = fields.first().map_or(0, |field| field.start);
        let value_end = fields.last().map_or(value_start, |field| field.end);
        Some(Write {
            key: self.key(position)?,
            key_number: self.key_numbers[position],
            value: &self.value_bytes[value_start..value_end],
            value_bytes: &self.value_bytes,
            fields,
        })
    }

    fn clear(&mut self, operation: OperationKind, acknowledge_inserts: bool) {
        self.operation = Some(operation);
        self.key_numbers.clear();
        self.key_bytes.clear();
        self.key_ends.clear();
        self.value_bytes.clear();
        self.fields.clear();
        self.field_ends.clear();
        self.acknowledge_inserts = acknowledge_inserts;
    }

    fn push_key(&mut self, key_number: u64, names: &KeyNames) {
        self.key_numbers.push(key_number);
        names.append_name(key_number, &mut self.key_bytes);
        self.key_ends.push(self.key_bytes.len());
    }

    fn push_key_bytes(&mut self, key_number: u64, key: &[u8]) {
        self.key_numbers.push(key_number);
        self.key_bytes.extend_from_slice(key);
        self.key_ends.push(self.key_bytes.len());
    }

    /// Appends a field of `length` random printable bytes to the current key's value.
    fn push_field(&mut self, index: u64, length: usize, random: &mut Random) {
        let start = self.value_bytes.len();
        self.value_bytes.resize(start + length, 0);
        random.fill_printable(&mut self.value_bytes[start..]);
        self.fields.push(FieldSlot { index, start, end: start + length });
    }

    /// Closes the current key's list of fields.
    fn end_fields(&mut self) {
        self.field_ends.push(self.fields.len());
    }

    fn contains_key_number(&self, key_number: u64) -> bool {
        self.key_numbers.contains(&key_number)
    }
}

/// One written key of a [`Txn`].
#[derive(Clone, Copy, Debug)]
pub struct Write<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Its key number.
    pub key_number: u64,
    /// The rampkv value: the fields' bytes, concatenated in field order.
    pub value: &'a [u8],
    value_bytes: &'a [u8],
    fields: &'a [FieldSlot],
}

impl<'a> Write<'a> {
    /// The YCSB fields inside [`Write::value`].
    pub fn fields(&self) -> impl ExactSizeIterator<Item = Field<'a>> + 'a {
        let value_bytes = self.value_bytes;
        self.fields.iter().map(move |slot| Field { index: slot.index, value: &value_bytes[slot.start..slot.end] })
    }
}

/// One YCSB field of a written record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    /// Field number; its YCSB name is the field name prefix followed by this number.
    pub index: u64,
    /// The field's bytes.
    pub value: &'a [u8],
}

/// Checks a transaction size against the bound and the key space.
pub(crate) fn check_txn_size(txn_size: usize, keys_available: u64) -> Result<(), Error> {
    if txn_size == 0 || txn_size > TXN_KEYS_MAX {
        return Err(Error::invalid("txn_size", txn_size, Expected::Range { min: 1, max: TXN_KEYS_MAX as u64 }));
    }
    if txn_size as u64 > keys_available {
        return Err(Error::invalid(
            "txn_size",
            txn_size,
            Expected::AtMost { max: keys_available, unit: "keys (the distinct keys to choose from)" },
        ));
    }
    Ok(())
}

/// The most draws for one transaction's distinct keys.
pub(crate) fn distinct_draws_max(txn_size: usize) -> u64 {
    txn_size as u64 * u64::from(DISTINCT_KEY_DRAWS_PER_KEY_MAX)
}

/// Groups a [`CoreWorkload`]'s operations into rampkv transactions of `txn_size` keys.
#[derive(Clone, Debug)]
pub struct TxnGenerator {
    workload: CoreWorkload,
    txn_size: usize,
}

impl TxnGenerator {
    /// Transactions of `txn_size` operations drawn from `workload`.
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] if `txn_size` is 0, above [`TXN_KEYS_MAX`], or larger
    /// than the number of loaded keys (distinct keys could not be found).
    pub fn new(workload: CoreWorkload, txn_size: usize) -> Result<Self, Error> {
        check_txn_size(txn_size, workload.config().resolved_insert_count())?;
        Ok(TxnGenerator { workload, txn_size })
    }

    /// The underlying workload (for key names, configuration, per-operation draws).
    pub fn workload(&self) -> &CoreWorkload {
        &self.workload
    }

    /// The underlying workload, mutably.
    pub fn workload_mut(&mut self) -> &mut CoreWorkload {
        &mut self.workload
    }

    /// Operations per transaction.
    pub fn txn_size(&self) -> usize {
        self.txn_size
    }

    /// Fills `txn` with the next run-phase transaction.
    ///
    /// After running a transaction of [`OperationKind::Insert`], pass it to
    /// [`TxnGenerator::acknowledge`], whether it succeeded or not.
    ///
    /// # Errors
    /// - [`Error::Unsupported`] when the drawn operation is a scan: rampkv has no range scans.
    ///   The draw is consumed; the caller counts the failure and asks for the next one.
    /// - [`Error::DistinctKeysNotFound`] if the distribution is too skewed for `txn_size`
    ///   distinct keys within the draw bound.
    /// - [`Error::TooManyUnacknowledgedInserts`] if inserts are not being acknowledged.
    /// - [`Error::KeyDrawsExhausted`] as [`CoreWorkload::next_key_number`].
    ///
    /// On error `txn` is left cleared or partially filled, and must not be run.
    pub fn next_txn(&mut self, txn: &mut Txn) -> Result<(), Error> {
        let operation = self.workload.next_operation_kind();
        match operation {
            OperationKind::Scan => Err(Error::Unsupported {
                operation: "scan",
                reason: "rampkv has no range scans: keys are hash-partitioned and a \
                         transaction names every key it reads",
            }),
            OperationKind::Insert => self.fill_insert(txn),
            OperationKind::Read => self.fill_existing(txn, operation, false),
            OperationKind::Update | OperationKind::ReadModifyWrite => self.fill_existing(txn, operation, true),
        }
    }

    /// Fills `txn` with up to `txn_size` records of the load phase, in YCSB's load order;
    /// returns `false` (and leaves `txn` empty) once everything is loaded.
    pub fn next_load_txn(&mut self, txn: &mut Txn) -> bool {
        txn.clear(OperationKind::Insert, false);
        while txn.len() < self.txn_size {
            let Some(key_number) = self.workload.next_load_key_number() else {
                break;
            };
            let name = self.workload.key_name(key_number);
            txn.push_key_bytes(key_number, name.as_bytes());
            self.push_record(txn, true);
        }
        !txn.is_empty()
    }

    /// Acknowledges the inserts of a finished run-phase insert transaction (a no-op for other
    /// transactions and for load transactions).
    ///
    /// # Errors
    /// [`Error::InvalidAcknowledgement`] if `txn` was acknowledged already or did not come
    /// from this generator.
    pub fn acknowledge(&mut self, txn: &Txn) -> Result<(), Error> {
        if !txn.acknowledge_inserts {
            return Ok(());
        }
        for &key_number in txn.key_numbers() {
            self.workload.acknowledge_insert(key_number)?;
        }
        Ok(())
    }

    fn fill_insert(&mut self, txn: &mut Txn) -> Result<(), Error> {
        txn.clear(OperationKind::Insert, true);
        // Check room first, so that a transaction never takes only part of its keys.
        if self.workload.inserts_available() < self.txn_size as u64 {
            return Err(Error::TooManyUnacknowledgedInserts {
                outstanding: crate::limits::ACKNOWLEDGEMENT_WINDOW_KEYS - self.workload.inserts_available(),
                window: crate::limits::ACKNOWLEDGEMENT_WINDOW_KEYS,
            });
        }
        let names = *self.workload.key_names();
        for _ in 0..self.txn_size {
            let key_number = self.workload.next_insert_key_number()?;
            txn.push_key(key_number, &names);
            self.push_record(txn, true);
        }
        Ok(())
    }

    fn fill_existing(&mut self, txn: &mut Txn, operation: OperationKind, writes: bool) -> Result<(), Error> {
        txn.clear(operation, false);
        let names = *self.workload.key_names();
        let draws_max = distinct_draws_max(self.txn_size);
        let mut draws = 0u64;
        while txn.len() < self.txn_size {
            if draws == draws_max {
                return Err(Error::DistinctKeysNotFound { wanted: self.txn_size, found: txn.len(), draws });
            }
            draws += 1;
            let key_number = self.workload.next_key_number()?;
            if txn.contains_key_number(key_number) {
                continue;
            }
            txn.push_key(key_number, &names);
            if writes {
                let all_fields = self.workload.config().write_all_fields;
                self.push_record(txn, all_fields);
            }
        }
        Ok(())
    }

    /// Appends the fields of one record: all of them, or one chosen uniformly.
    fn push_record(&mut self, txn: &mut Txn, all_fields: bool) {
        if all_fields {
            for index in 0..self.workload.config().field_count {
                self.push_field(txn, index);
            }
        } else {
            let index = self.workload.next_field_index();
            self.push_field(txn, index);
        }
        txn.end_fields();
    }

    fn push_field(&mut self, txn: &mut Txn, index: u64) {
        // Bounded by validation: fieldcount * fieldlength <= RECORD_BYTES_MAX.
        let length = self.workload.next_field_length() as usize;
        txn.push_field(index, length, self.workload.random_mut());
    }
}

/// Crate-internal access for generators outside this module (the micro benchmark).
pub(crate) mod build {
    use super::*;

    pub(crate) fn clear(txn: &mut Txn, operation: OperationKind) {
        txn.clear(operation, false);
    }

    pub(crate) fn push_key_bytes(txn: &mut Txn, key_number: u64, key: &[u8]) {
        txn.push_key_bytes(key_number, key);
    }

    pub(crate) fn push_single_field_value(txn: &mut Txn, length: usize, random: &mut Random) {
        txn.push_field(0, length, random);
        txn.end_fields();
    }

    pub(crate) fn contains_key_number(txn: &Txn, key_number: u64) -> bool {
        txn.contains_key_number(key_number)
    }
}
