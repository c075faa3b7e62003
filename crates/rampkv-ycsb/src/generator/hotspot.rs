//! `HotspotIntegerGenerator`: a fraction of the operations goes to a fraction of the keys.
//!
//! The hot set is the low end of the range, `(int) (interval * hotsetfraction)` keys; each
//! draw picks the hot set with probability `hotopnfraction`, then a key uniformly inside it.
//!
//! Deviation: YCSB replaces an out-of-range fraction by 0.0 with a warning and swaps reversed
//! bounds; here those are configuration errors, and so is a draw that could land in an empty
//! set (a Java `ArithmeticException` in YCSB).

use crate::{Error, Random};

/// Hot-set / cold-set uniform mixture.
#[derive(Clone, Debug)]
pub struct Hotspot {
    lower: u64,
    hot_keys: u64,
    cold_keys: u64,
    hot_operation_fraction: f64,
}

impl Hotspot {
    /// Keys in `[lower, upper]`; `hot_data_fraction` of them are hot and receive
    /// `hot_operation_fraction` of the draws.
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] for reversed bounds, fractions outside `[0, 1]`, or an
    /// empty hot (cold) set that would still receive draws.
    pub fn new(lower: u64, upper: u64, hot_data_fraction: f64, hot_operation_fraction: f64) -> Result<Self, Error> {
        for (name, fraction) in
            [("hotspotdatafraction", hot_data_fraction), ("hotspotopnfraction", hot_operation_fraction)]
        {
            if !(0.0..=1.0).contains(&fraction) {
                return Err(Error::invalid(name, fraction, "must be in [0, 1]"));
            }
        }
        if lower > upper || upper - lower == u64::MAX {
            return Err(Error::invalid("hotspot range", format!("[{lower}, {upper}]"), "must be a non-empty range"));
        }
        let interval = upper - lower + 1;
        // YCSB: `(int) (interval * hotsetFraction)`, a truncating cast.
        let hot_keys = ((interval as f64 * hot_data_fraction) as u64).min(interval);
        let cold_keys = interval - hot_keys;
        if hot_keys == 0 && hot_operation_fraction > 0.0 {
            return Err(Error::invalid(
                "hotspotdatafraction",
                hot_data_fraction,
                "the hot set is empty but receives draws",
            ));
        }
        if cold_keys == 0 && hot_operation_fraction < 1.0 {
            return Err(Error::invalid(
                "hotspotdatafraction",
                hot_data_fraction,
                "the cold set is empty but receives draws",
            ));
        }
        Ok(Hotspot { lower, hot_keys, cold_keys, hot_operation_fraction })
    }

    /// The next key.
    #[inline]
    pub fn next(&self, random: &mut Random) -> u64 {
        if random.next_f64() < self.hot_operation_fraction {
            self.lower + random.below(self.hot_keys)
        } else {
            self.lower + self.hot_keys + random.below(self.cold_keys)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_set_gets_its_share() {
        let seed = 17;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let hotspot = Hotspot::new(0, 999, 0.2, 0.8).expect("valid");
        let draws = 100_000u32;
        let mut hot = 0u32;
        for _ in 0..draws {
            let key = hotspot.next(&mut random);
            assert!(key < 1000);
            if key < 200 {
                hot += 1;
            }
        }
        let share = f64::from(hot) / f64::from(draws);
        assert!((share - 0.8).abs() < 0.01, "hot share {share}");
    }

    #[test]
    fn bad_fractions_are_errors() {
        assert!(Hotspot::new(0, 9, 1.5, 0.5).is_err());
        assert!(Hotspot::new(0, 9, 0.5, -0.5).is_err());
        assert!(Hotspot::new(9, 0, 0.5, 0.5).is_err());
        assert!(Hotspot::new(0, 9, 0.0, 0.5).is_err(), "empty hot set");
        assert!(Hotspot::new(0, 9, 1.0, 0.5).is_err(), "empty cold set");
        assert!(Hotspot::new(0, 9, 0.0, 0.0).is_ok());
        assert!(Hotspot::new(0, 9, 1.0, 1.0).is_ok());
    }
}
