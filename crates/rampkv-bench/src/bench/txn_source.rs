//! One client thread's transaction generator, built from the run's configuration: the
//! micro-benchmark's or YCSB's (`rampkv-ycsb`), seeded per thread; the YCSB load phase's; and
//! the item slot size that holds the largest version a run writes.
//!
//! # Contract
//! A generator is a pure function of the configuration and its seed: two runs with the same
//! configuration and seed generate the same transactions in the same order per thread. A
//! setting the generator refuses is a [`ConfigError::Workload`], never a panic.

use rampkv_ycsb::{
    BuiltinWorkload, CoreWorkload, CoreWorkloadConfig, MicroDistribution, MicroGenerator, MicroWorkload, Proportions,
    Txn, TxnGenerator,
};

use super::config::{BenchConfig, BenchError, ConfigError};
use super::workload::Workload;
use rampkv_core::limits::ITEM_REGION_BYTES_MAX;
use rampkv_core::protocol::ramp::{metadata_for, TxnOptions};

impl Workload {
    /// The YCSB core workload settings of a run (`None` for the micro-benchmark).
    fn ycsb_config(config: &BenchConfig) -> Result<Option<CoreWorkloadConfig>, BenchError> {
        let mut core = match config.workload {
            Workload::Micro { .. } => return Ok(None),
            Workload::Ycsb { name } => {
                BuiltinWorkload::from_name(&name.to_string()).ok_or(ConfigError::UnknownYcsb(name))?.config()
            }
            Workload::YcsbReadRatio => {
                let mut core = BuiltinWorkload::A.config();
                let read = config.read_ratio;
                core.proportions =
                    Proportions { read, update: 1.0 - read, insert: 0.0, scan: 0.0, read_modify_write: 0.0 };
                core
            }
        };
        core.record_count = config.keys;
        Ok(Some(core))
    }
}

/// Digits of the largest number a YCSB key name can carry (a 64-bit key number or its hash).
const YCSB_KEY_DIGITS_MAX: usize = 20;

impl Workload {
    /// The longest key this run's workload can produce: the micro-benchmark's keys are the
    /// decimal digits of `0..keys`; YCSB's are "user", then a 64-bit number (its hash, by
    /// default) with at least `zeropadding` digits (inserts may go past `recordcount`).
    pub fn key_bytes_max(config: &BenchConfig) -> Result<usize, BenchError> {
        Ok(match Workload::ycsb_config(config)? {
            None => config.keys.saturating_sub(1).to_string().len(),
            Some(core) => rampkv_ycsb::key::KEY_PREFIX.len() + core.zero_padding.max(YCSB_KEY_DIGITS_MAX),
        })
    }
}

impl BenchConfig {
    /// GET\* item slot size that holds every version this run writes: the longest key, the
    /// metadata of a `txn_size`-key transaction of such keys (RAMP-Fast's write set, a Bloom
    /// filter, or nothing) and the value, with the slot's header and trailer
    /// (`rampkv_fabric::slot_bytes`). Capped so that the item region stays within
    /// `ITEM_REGION_BYTES_MAX`; a version over the cap is read over GET+ as before.
    pub fn fitted_item_slot_bytes(&self) -> Result<usize, BenchError> {
        let key_bytes = Workload::key_bytes_max(self)?;
        let options = TxnOptions { algorithm: self.algorithm, bloom: self.bloom, mutant_skip_repair: false };
        let widest_write_set = vec![vec![0u8; key_bytes]; self.txn_size];
        let metadata_bytes = metadata_for(&options, &widest_write_set).map_err(ConfigError::from)?.encoded_bytes();
        let fitted = rampkv_fabric::slot_bytes(key_bytes, metadata_bytes, self.value_size);
        let region_cap = ITEM_REGION_BYTES_MAX / self.item_slots.slots.max(1) / 8 * 8;
        Ok(fitted.min(region_cap))
    }
}

/// One client thread's generator.
pub(crate) enum TxnSource {
    Micro(MicroGenerator),
    Ycsb(Box<TxnGenerator>),
}

impl TxnSource {
    pub(crate) fn new(config: &BenchConfig, seed: u64) -> Result<TxnSource, BenchError> {
        let invalid = ConfigError::Workload;
        match config.workload {
            Workload::Micro { zipfian } => {
                let distribution =
                    if zipfian { MicroDistribution::Zipfian { theta: 0.99 } } else { MicroDistribution::Uniform };
                let workload = MicroWorkload {
                    read_ratio: config.read_ratio,
                    txn_size: config.txn_size,
                    keys: config.keys,
                    value_size: config.value_size,
                    distribution,
                };
                Ok(TxnSource::Micro(workload.generator(seed).map_err(invalid)?))
            }
            Workload::Ycsb { .. } | Workload::YcsbReadRatio => {
                let core = Workload::ycsb_config(config)?.expect("a YCSB workload");
                let workload = CoreWorkload::new(core, seed).map_err(invalid)?;
                Ok(TxnSource::Ycsb(Box::new(TxnGenerator::new(workload, config.txn_size).map_err(invalid)?)))
            }
        }
    }

    /// The YCSB load phase's generator (records `0..keys` in YCSB's load order).
    pub(crate) fn loader(config: &BenchConfig) -> Result<Option<TxnGenerator>, BenchError> {
        let Some(core) = Workload::ycsb_config(config)? else {
            return Ok(None);
        };
        let invalid = ConfigError::Workload;
        let workload = CoreWorkload::new(core, config.seed).map_err(invalid)?;
        Ok(Some(TxnGenerator::new(workload, config.txn_size).map_err(invalid)?))
    }

    pub(crate) fn next(&mut self, txn: &mut Txn) -> Result<(), BenchError> {
        let result = match self {
            TxnSource::Micro(generator) => generator.next_txn(txn),
            TxnSource::Ycsb(generator) => generator.next_txn(txn),
        };
        result.map_err(|error| ConfigError::Workload(error).into())
    }

    /// Tells the generator a transaction finished (YCSB's acknowledged inserts).
    pub(crate) fn acknowledge(&mut self, txn: &Txn) {
        if let TxnSource::Ycsb(generator) = self {
            let _ = generator.acknowledge(txn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampkv_core::protocol::ramp::Algorithm;

    #[test]
    fn the_read_ratio_workload_is_workload_a_with_the_read_share_of_the_run() {
        for (read_ratio, builtin) in [(0.5, BuiltinWorkload::A), (0.95, BuiltinWorkload::B), (1.0, BuiltinWorkload::C)]
        {
            let config =
                BenchConfig { workload: Workload::YcsbReadRatio, read_ratio, keys: 1000, ..BenchConfig::default() };
            let core = Workload::ycsb_config(&config).unwrap().expect("a YCSB workload");
            let mut shipped = builtin.config();
            shipped.record_count = 1000;
            let (ours, theirs) = (core.proportions.normalized(), shipped.proportions.normalized());
            for (share, shipped_share) in ours.iter().zip(theirs) {
                assert!((share - shipped_share).abs() < 1e-12, "read ratio {read_ratio}: {ours:?} vs {theirs:?}");
            }
            // Everything else (zipfian keys, field count and length, record count) as shipped.
            shipped.proportions = core.proportions;
            assert_eq!(core, shipped, "read ratio {read_ratio}");
        }
        let micro = BenchConfig::default();
        assert!(Workload::ycsb_config(&micro).unwrap().is_none());
    }

    /// Story: YCSB's 23-byte keys made 8-key write sets so large that its 1,000-byte records
    /// no longer fit the 1,280-byte default slot, and every GET* fell back to GET+. The fitted
    /// size holds the largest version a run writes, whatever the workload.
    #[test]
    fn fitted_item_slots_hold_the_largest_version_of_the_workload() {
        let ycsb = BenchConfig {
            workload: Workload::YcsbReadRatio,
            value_size: 1_000,
            txn_size: 8,
            keys: 1_000,
            ..BenchConfig::default()
        };
        assert_eq!(Workload::key_bytes_max(&ycsb).unwrap(), 24);
        // Header 40, key 24, write set 1 + 4 + 8 x (2 + 24) = 213 padded to 216, value 1,000,
        // trailer 16.
        assert_eq!(ycsb.fitted_item_slot_bytes().unwrap(), 1_296);
        let micro = BenchConfig { txn_size: 8, keys: 1_000, value_size: 1_024, ..BenchConfig::default() };
        assert_eq!(Workload::key_bytes_max(&micro).unwrap(), 3);
        assert_eq!(micro.fitted_item_slot_bytes().unwrap(), 40 + 8 + 48 + 1_024 + 16);
        let small = BenchConfig { algorithm: Algorithm::RampSmall, ..micro.clone() };
        assert_eq!(small.fitted_item_slot_bytes().unwrap(), 40 + 8 + 8 + 1_024 + 16);
        let hybrid = BenchConfig { algorithm: Algorithm::RampHybrid, ..micro.clone() };
        assert_eq!(hybrid.fitted_item_slot_bytes().unwrap(), 40 + 8 + 40 + 1_024 + 16);
        // The region bound caps it.
        let huge = BenchConfig {
            value_size: rampkv_core::limits::VALUE_BYTES_MAX,
            item_slots: rampkv_net::item_slots::ItemSlotConfig {
                slots: rampkv_core::limits::ITEM_SLOTS_MAX,
                slot_bytes: 1_280,
            },
            ..micro
        };
        let capped = huge.fitted_item_slot_bytes().unwrap();
        assert!(capped * rampkv_core::limits::ITEM_SLOTS_MAX <= ITEM_REGION_BYTES_MAX && capped % 8 == 0);
        // Every fitted configuration is a valid one.
        for config in [ycsb, small, hybrid, huge] {
            let slots = rampkv_net::item_slots::ItemSlotConfig {
                slot_bytes: config.fitted_item_slot_bytes().unwrap(),
                ..config.item_slots
            };
            slots.validate().unwrap();
        }
    }
}
