//! `SkewedLatestGenerator`: the most recently inserted keys are the most popular.
//!
//! `next = max - zipfian.nextLong(max)` where `max` is the insert counter's last acknowledged
//! value, and the zipfian was built over `max` items at start-up (so over `recordcount - 1`
//! items in CoreWorkload). `max` itself is the likeliest result; since the zipfian returns at
//! most `max - 1`, key 0 is never returned: both are YCSB's behaviour, kept.

use crate::generator::Zipfian;
use crate::{Error, Random};

/// Zipfian popularity by recency.
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// A generator for a counter whose last acknowledged value is `last_value` now.
    ///
    /// YCSB builds `new ZipfianGenerator(lastValue)`, i.e. over `[0, lastValue - 1]`. For
    /// `last_value` 0 that range is empty; one item is used instead, which draws the same
    /// values (0 when `max` is 0).
    ///
    /// # Errors
    /// As [`Zipfian::new`] (item count beyond [`crate::limits::ZETA_TERMS_MAX`]).
    pub fn new(last_value: u64) -> Result<Self, Error> {
        let zipfian = Zipfian::new(0, last_value.saturating_sub(1))?;
        Ok(SkewedLatest { zipfian })
    }

    /// The next key given the counter's current last acknowledged value `max`.
    ///
    /// # Errors
    /// As [`Zipfian::next_with_item_count`] (growth beyond the zeta bound).
    #[inline]
    pub fn next(&mut self, max: u64, random: &mut Random) -> Result<u64, Error> {
        let offset = self.zipfian.next_with_item_count(max, random)?;
        // offset < max whenever max > 0; saturating keeps max = 0 at 0 without a branch.
        Ok(max.saturating_sub(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::AcknowledgedCounter;

    #[test]
    fn latest_returns_recent_keys_most() {
        let seed = 2024;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let mut counter = AcknowledgedCounter::new(1000);
        let mut latest = SkewedLatest::new(counter.last_value().unwrap_or(0)).expect("valid");
        let draws = 200_000u32;
        let mut counts = vec![0u32; 2000];
        for _ in 0..draws {
            let key = latest.next(counter.last_value().unwrap_or(0), &mut random).expect("no growth");
            assert!((1..=999).contains(&key), "key {key}");
            counts[key as usize] += 1;
        }
        // The newest key is the most popular, then popularity falls with age.
        let newest = f64::from(counts[999]) / f64::from(draws);
        let expected = 1.0 / crate::generator::zeta(999, 0.99);
        assert!((newest - expected).abs() < 0.005, "newest {newest} vs {expected}");
        assert!(counts[999] > counts[998] && counts[998] > counts[990]);
        assert!(counts[990] > counts[500]);
        let recent: u32 = counts[900..1000].iter().sum();
        assert!(f64::from(recent) / f64::from(draws) > 0.6);

        // Insert and acknowledge 100 keys: the hot spot moves to them.
        for _ in 0..100 {
            let key = counter.next_value().expect("room");
            counter.acknowledge(key).expect("valid");
        }
        assert_eq!(counter.last_value(), Some(1099));
        let mut moved = vec![0u32; 2000];
        for _ in 0..draws {
            let key = latest.next(counter.last_value().unwrap_or(0), &mut random).expect("small growth");
            assert!(key <= 1099);
            moved[key as usize] += 1;
        }
        let busiest = (0..moved.len()).max_by_key(|&key| moved[key]);
        assert_eq!(busiest, Some(1099));
        assert!(moved[1099] > moved[999] * 5);
    }

    #[test]
    fn tiny_counters() {
        let seed = 3;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let mut latest = SkewedLatest::new(0).expect("valid");
        assert!((0..100).all(|_| latest.next(0, &mut random) == Ok(0)));
        let mut latest = SkewedLatest::new(1).expect("valid");
        for _ in 0..100 {
            let key = latest.next(1, &mut random).expect("no growth");
            assert!(key <= 1);
        }
    }
}
