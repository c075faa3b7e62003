//! The Bloom filter of RAMP-Hybrid's metadata: a transaction's write set in a few bytes.
//!
//! Positions come from double hashing: `h1 = fnv1a64(key)`, `h2 = splitmix64(h1) | 1`,
//! position `i = (h1 + i * h2) mod bits` for `i < hashes`. A false positive only costs a
//! round-2 request that finds nothing newer; it never changes a result.

use crate::cluster::key_hash;
use crate::wire::BLOOM_BYTES_MAX;

/// Size and hash count of the filters a client writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BloomParameters {
    /// Filter size in bits: a multiple of 8, 8..=8 * BLOOM_BYTES_MAX.
    pub bits: u32,
    /// Positions set per key, 1..=16.
    pub hashes: u8,
}

impl Default for BloomParameters {
    /// 256 bits and 4 hashes: about 2e-4 false positives for 8-key transactions.
    fn default() -> Self {
        Self { bits: 256, hashes: 4 }
    }
}

/// Bloom parameters out of their bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BloomError {
    #[error("bloom bits must be a multiple of 8 in 8..={max}, got {bits}", max = 8 * BLOOM_BYTES_MAX)]
    Bits { bits: u32 },
    #[error("bloom hashes must be 1..=16, got {hashes}")]
    Hashes { hashes: u8 },
}

impl BloomParameters {
    /// Checks the parameters; the error says what is wrong.
    pub fn validate(&self) -> Result<(), BloomError> {
        if self.bits == 0 || self.bits % 8 != 0 || self.bits as usize > 8 * BLOOM_BYTES_MAX {
            return Err(BloomError::Bits { bits: self.bits });
        }
        if !(1..=16).contains(&self.hashes) {
            return Err(BloomError::Hashes { hashes: self.hashes });
        }
        Ok(())
    }

    /// The filter of `keys`.
    pub fn build<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) -> Vec<u8> {
        let mut filter = vec![0u8; self.bits as usize / 8];
        for key in keys {
            for position in positions(key, filter.len() * 8, self.hashes) {
                filter[position / 8] |= 1 << (position % 8);
            }
        }
        filter
    }
}

/// Whether `filter` may contain `key` (false: certainly not). The filter's own length gives the
/// bit count, so a reader needs no parameters; a filter with no bytes contains nothing.
pub fn may_contain(filter: &[u8], hashes: u8, key: &[u8]) -> bool {
    !filter.is_empty()
        && positions(key, filter.len() * 8, hashes).all(|position| filter[position / 8] & (1 << (position % 8)) != 0)
}

fn positions(key: &[u8], bits: usize, hashes: u8) -> impl Iterator<Item = usize> {
    let first = key_hash(key);
    let step = splitmix64(first) | 1;
    (0..u64::from(hashes)).map(move |i| (first.wrapping_add(i.wrapping_mul(step)) % bits as u64) as usize)
}

fn splitmix64(mut value: u64) -> u64 {
    value = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_inserted_key_is_found() {
        let parameters = BloomParameters::default();
        let keys: Vec<Vec<u8>> = (0..32).map(|i| format!("key{i}").into_bytes()).collect();
        let filter = parameters.build(keys.iter().map(Vec::as_slice));
        assert_eq!(filter.len(), 32);
        assert!(keys.iter().all(|key| may_contain(&filter, parameters.hashes, key)));
    }

    #[test]
    fn the_false_positive_rate_is_near_theory() {
        let parameters = BloomParameters { bits: 256, hashes: 4 };
        let members: Vec<Vec<u8>> = (0..8).map(|i| format!("member{i}").into_bytes()).collect();
        let filter = parameters.build(members.iter().map(Vec::as_slice));
        let probes = 200_000;
        let false_positives =
            (0..probes).filter(|i| may_contain(&filter, parameters.hashes, format!("other{i}").as_bytes())).count();
        let rate = false_positives as f64 / probes as f64;
        // Theory: (1 - e^(-k n / m))^k = (1 - e^(-0.125))^4 ~ 1.9e-4; one filter varies, so allow 10x.
        assert!(rate < 2e-3, "false-positive rate {rate}");
    }

    #[test]
    fn invalid_parameters_are_refused() {
        assert!(BloomParameters { bits: 7, hashes: 4 }.validate().is_err());
        assert!(BloomParameters { bits: 256, hashes: 0 }.validate().is_err());
        assert!(BloomParameters { bits: 8 * 1025, hashes: 4 }.validate().is_err());
        assert!(BloomParameters::default().validate().is_ok());
        assert!(!may_contain(&[], 4, b"k"));
    }
}
