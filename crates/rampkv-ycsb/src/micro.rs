//! The reference paper's micro-benchmark (Murata et al., "Accelerating RAMP transactions with
//! RDMA"): transactions of `txn_size` operations, read-only with probability `read_ratio` and
//! write-only otherwise, over `keys` integer keys chosen uniformly or by a zipfian.
//!
//! The paper's defaults are 95% reads and 8 operations per transaction; the team's anchor
//! measurements use 1,000 keys and 1 KB values ([`MicroWorkload::paper_default`]).
//!
//! Keys are the integers `0..keys`; a key's bytes are its decimal digits (the prototype
//! addresses integer keys, and rampkv keys are byte strings). The zipfian is YCSB's
//! [`Zipfian`] over `[0, keys - 1]` without scrambling: key 0 is the hottest. rampkv
//! hash-partitions keys, so clustering hot keys in number does not cluster them on a server.
//! Transactions use the same [`Txn`] type as the YCSB generator, with distinct keys drawn the
//! same way; a write carries one value of `value_size` random printable bytes (field 0).

use crate::generator::Zipfian;
use crate::key::{write_decimal, DECIMAL_BYTES_MAX};
use crate::limits::RECORD_BYTES_MAX;
use crate::txn::{build, check_txn_size, distinct_draws_max};
use crate::workload::OperationKind;
use crate::{Error, Expected, Random, Txn};

/// How micro-benchmark keys are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MicroDistribution {
    /// Every key equally likely.
    Uniform,
    /// Zipfian with constant `theta` in `[0, 1)` (YCSB's is 0.99); key 0 the hottest.
    Zipfian {
        /// The zipfian constant.
        theta: f64,
    },
}

/// The micro-benchmark's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MicroWorkload {
    /// Probability that a transaction is read-only, in `[0, 1]`.
    pub read_ratio: f64,
    /// Operations (distinct keys) per transaction.
    pub txn_size: usize,
    /// Number of keys, `0..keys`.
    pub keys: u64,
    /// Bytes per written value.
    pub value_size: usize,
    /// How keys are chosen.
    pub distribution: MicroDistribution,
}

impl MicroWorkload {
    /// The configuration of the paper's evaluation and the team's anchors: 95% reads, 8 keys
    /// per transaction, 1,000 keys, 1 KiB values, uniform.
    pub fn paper_default() -> Self {
        MicroWorkload {
            read_ratio: 0.95,
            txn_size: 8,
            keys: 1000,
            value_size: 1024,
            distribution: MicroDistribution::Uniform,
        }
    }

    /// A generator whose every draw derives from `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] for a ratio outside `[0, 1]`, no keys, a transaction
    /// size of 0, above the bound or above `keys`, a value larger than
    /// [`RECORD_BYTES_MAX`], or a bad zipfian constant.
    pub fn generator(&self, seed: u64) -> Result<MicroGenerator, Error> {
        if !(0.0..=1.0).contains(&self.read_ratio) {
            return Err(Error::invalid("read_ratio", self.read_ratio, "must be in [0, 1]"));
        }
        if self.keys == 0 {
            return Err(Error::invalid("keys", self.keys, "must be at least 1"));
        }
        check_txn_size(self.txn_size, self.keys)?;
        if self.value_size as u64 > RECORD_BYTES_MAX {
            return Err(Error::invalid(
                "value_size",
                self.value_size,
                Expected::AtMost { max: RECORD_BYTES_MAX, unit: "bytes" },
            ));
        }
        let chooser = match self.distribution {
            MicroDistribution::Uniform => MicroChooser::Uniform,
            MicroDistribution::Zipfian { theta } => {
                MicroChooser::Zipfian(Zipfian::with_constant(0, self.keys - 1, theta)?)
            }
        };
        Ok(MicroGenerator { workload: *self, random: Random::new(seed), seed, chooser })
    }
}

#[derive(Clone, Debug)]
enum MicroChooser {
    Uniform,
    Zipfian(Zipfian),
}

/// Generates micro-benchmark transactions.
#[derive(Clone, Debug)]
pub struct MicroGenerator {
    workload: MicroWorkload,
    random: Random,
    seed: u64,
    chooser: MicroChooser,
}

impl MicroGenerator {
    /// The parameters.
    pub fn workload(&self) -> &MicroWorkload {
        &self.workload
    }

    /// The seed every draw derives from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next key number in `0..keys`.
    #[inline]
    pub fn next_key_number(&mut self) -> u64 {
        match &self.chooser {
            MicroChooser::Uniform => self.random.below(self.workload.keys),
            MicroChooser::Zipfian(zipfian) => zipfian.next(&mut self.random),
        }
    }

    /// Fills `txn` with the next transaction: read-only ([`OperationKind::Read`]) with
    /// probability `read_ratio`, else write-only ([`OperationKind::Update`]).
    ///
    /// # Errors
    /// [`Error::DistinctKeysNotFound`] if the zipfian is too skewed to find `txn_size`
    /// distinct keys within the draw bound.
    pub fn next_txn(&mut self, txn: &mut Txn) -> Result<(), Error> {
        let reads = self.random.next_f64() < self.workload.read_ratio;
        let operation = if reads { OperationKind::Read } else { OperationKind::Update };
        build::clear(txn, operation);
        let wanted = self.workload.txn_size;
        let draws_max = distinct_draws_max(wanted);
        let mut draws = 0u64;
        while txn.len() < wanted {
            if draws == draws_max {
                return Err(Error::DistinctKeysNotFound { wanted, found: txn.len(), draws });
            }
            draws += 1;
            let key_number = self.next_key_number();
            if build::contains_key_number(txn, key_number) {
                continue;
            }
            build::push_key_bytes(txn, key_number, micro_key(key_number).as_slice());
            if !reads {
                build::push_single_field_value(txn, self.workload.value_size, &mut self.random);
            }
        }
        Ok(())
    }
}

/// A micro-benchmark key: the decimal digits of its number, on the stack.
#[derive(Clone, Copy, Debug)]
pub struct MicroKey {
    digits: [u8; DECIMAL_BYTES_MAX],
    start: u8,
}

impl MicroKey {
    /// The key's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.digits[usize::from(self.start)..]
    }
}

/// The key bytes of micro-benchmark key `key_number`.
pub fn micro_key(key_number: u64) -> MicroKey {
    let mut digits = [0u8; DECIMAL_BYTES_MAX];
    // Key numbers are below `keys`, far below i64::MAX.
    let length = write_decimal(key_number.min(i64::MAX as u64) as i64, &mut digits);
    MicroKey { digits, start: (DECIMAL_BYTES_MAX - length) as u8 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TxnKind;

    #[test]
    fn paper_default_mix() {
        let seed = 88;
        println!("seed {seed}");
        let mut generator = MicroWorkload::paper_default().generator(seed).expect("valid");
        let mut txn = Txn::new();
        let draws = 20_000u32;
        let mut reads = 0u32;
        for _ in 0..draws {
            generator.next_txn(&mut txn).expect("no error");
            assert_eq!(txn.len(), 8);
            let mut numbers = txn.key_numbers().to_vec();
            numbers.sort_unstable();
            numbers.dedup();
            assert_eq!(numbers.len(), 8, "distinct keys");
            assert!(numbers.iter().all(|&number| number < 1000));
            match txn.kind() {
                TxnKind::ReadOnly => {
                    reads += 1;
                    assert_eq!(txn.writes().count(), 0);
                }
                TxnKind::WriteOnly => {
                    for write in txn.writes() {
                        assert_eq!(write.value.len(), 1024);
                        assert_eq!(write.key, micro_key(write.key_number).as_slice());
                    }
                }
                TxnKind::ReadThenWrite => panic!("micro has no read-modify-write"),
            }
        }
        let share = f64::from(reads) / f64::from(draws);
        assert!((share - 0.95).abs() < 0.01, "read share {share}");
    }

    #[test]
    fn zipfian_prefers_low_keys() {
        let seed = 89;
        println!("seed {seed}");
        let workload = MicroWorkload {
            distribution: MicroDistribution::Zipfian { theta: 0.99 },
            ..MicroWorkload::paper_default()
        };
        let mut generator = workload.generator(seed).expect("valid");
        let zero = (0..100_000).filter(|_| generator.next_key_number() == 0).count();
        let expected = 100_000.0 / crate::generator::zeta(1000, 0.99);
        assert!((zero as f64 - expected).abs() < 600.0, "key 0 drawn {zero} times");
        // Transactions still get distinct keys despite the hot key.
        let mut txn = Txn::new();
        for _ in 0..1000 {
            generator.next_txn(&mut txn).expect("no error");
            let mut numbers = txn.key_numbers().to_vec();
            numbers.sort_unstable();
            numbers.dedup();
            assert_eq!(numbers.len(), 8);
        }
    }

    #[test]
    fn keys_are_decimal() {
        assert_eq!(micro_key(0).as_slice(), b"0");
        assert_eq!(micro_key(999).as_slice(), b"999");
    }

    #[test]
    fn bad_parameters_are_errors() {
        let base = MicroWorkload::paper_default();
        let cases = [
            MicroWorkload { read_ratio: 1.5, ..base },
            MicroWorkload { read_ratio: f64::NAN, ..base },
            MicroWorkload { keys: 0, ..base },
            MicroWorkload { txn_size: 0, ..base },
            MicroWorkload { txn_size: 10, keys: 5, ..base },
            MicroWorkload { value_size: 1 << 30, ..base },
            MicroWorkload { distribution: MicroDistribution::Zipfian { theta: 1.0 }, ..base },
        ];
        for workload in cases {
            assert!(workload.generator(1).is_err(), "{workload:?}");
        }
    }

    /// Every key of a tiny, skewed key space must still fill a transaction.
    #[test]
    fn whole_key_space_in_one_transaction() {
        let workload = MicroWorkload {
            keys: 8,
            txn_size: 8,
            distribution: MicroDistribution::Zipfian { theta: 0.99 },
            ..MicroWorkload::paper_default()
        };
        let mut generator = workload.generator(90).expect("valid");
        let mut txn = Txn::new();
        for _ in 0..100 {
            generator.next_txn(&mut txn).expect("no error");
            assert_eq!(txn.len(), 8);
        }
    }
}
