//! `ZipfianGenerator` and `ScrambledZipfianGenerator`, formula for formula.
//!
//! Gray et al., "Quickly Generating Billion-Record Synthetic Databases" (SIGMOD 1994), as YCSB
//! implements it. For `n` items and constant `theta`:
//!
//! ```text
//! zeta(n)  = sum_{i=1..n} 1 / i^theta           (summed in this order, from i = 1)
//! alpha    = 1 / (1 - theta)
//! eta      = (1 - (2 / n)^(1 - theta)) / (1 - zeta(2) / zeta(n))
//! u        = uniform in [0, 1);  uz = u * zeta(n)
//! next     = base                 if uz < 1
//!            base + 1             if uz < 1 + 0.5^theta
//!            base + floor(n * (eta * u - eta + 1)^alpha)   otherwise
//! ```
//!
//! Item `base` is the most popular, `base + 1` the next, and so on.
//!
//! # YCSB quirks kept on purpose
//! - When the item count grows (the "latest" distribution after inserts), zeta is extended
//!   incrementally, but eta is recomputed with the item count given at construction
//!   (`Math.pow(2.0 / items, ...)` uses the field `items`, not the new count). Kept so that the
//!   skew matches YCSB's; the effect is small (eta moves with zeta only).
//! - A smaller item count than the one zeta was computed for does not recompute zeta
//!   (YCSB's `allowitemcountdecrease` is false by default, and nothing in CoreWorkload sets it).
//! - The scrambled generator draws ranks from a zipfian over `[0, 10^10]`, i.e. 10^10 + 1 items,
//!   with the precomputed `ZETAN` of 10^10 items, then maps a rank to
//!   `min + fnvhash64(rank) % itemcount`. Popularity is therefore that of the 10^10-item
//!   distribution folded onto `itemcount` slots, not a zipfian over `itemcount` items: the
//!   hottest key gets about `1 / ZETAN` = 3.8% of the draws, whatever the key count.

use crate::hash::fnv_hash64;
use crate::limits::ZETA_TERMS_MAX;
use crate::{Error, Expected, Random};

/// YCSB's default zipfian constant (`ZipfianGenerator.ZIPFIAN_CONSTANT`).
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The rank space of the scrambled zipfian (`ScrambledZipfianGenerator.ITEM_COUNT`, 10^10).
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;

/// zeta(10^10, 0.99), precomputed by YCSB (`ScrambledZipfianGenerator.ZETAN`). Summing 10^10
/// terms at start-up would take minutes; the tests check this value by Euler-Maclaurin instead.
pub const SCRAMBLED_ZETA_N: f64 = 26.469_028_201_783_02;

/// `zeta(n, theta) = sum_{i=1..n} 1/i^theta`, summed from `i = 1` upwards exactly as YCSB's
/// `zetastatic` does (the same order gives the same floating-point result).
///
/// Costs `n` calls to `powf`; callers bound `n` by [`ZETA_TERMS_MAX`].
pub fn zeta(item_count: u64, theta: f64) -> f64 {
    zeta_extend(0, item_count, theta, 0.0)
}

/// Adds the terms for items `start + 1 ..= end` to `initial_sum` (YCSB's incremental
/// `zetastatic(st, n, theta, initialsum)`).
fn zeta_extend(start: u64, end: u64, theta: f64, initial_sum: f64) -> f64 {
    let mut sum = initial_sum;
    for item in start..end {
        sum += 1.0 / ((item + 1) as f64).powf(theta);
    }
    sum
}

/// A zipfian distribution over `[min, max]`.
#[derive(Clone, Debug)]
pub struct Zipfian {
    /// Items at construction (`max - min + 1`); YCSB's `items`, used in eta forever after.
    item_count: u64,
    base: u64,
    theta: f64,
    alpha: f64,
    zeta_2_theta: f64,
    zeta_n: f64,
    eta: f64,
    /// Item count `zeta_n` was computed for (YCSB's `countforzeta`).
    count_for_zeta: u64,
    /// `1 + 0.5^theta`, the threshold below which the second item is returned.
    second_item_threshold: f64,
}

impl Zipfian {
    /// Zipfian over `[min, max]` with YCSB's constant 0.99, zeta computed now.
    ///
    /// # Errors
    /// See [`Zipfian::with_constant`].
    pub fn new(min: u64, max: u64) -> Result<Self, Error> {
        Self::with_constant(min, max, ZIPFIAN_CONSTANT)
    }

    /// Zipfian over `[min, max]` with constant `theta` in `[0, 1)`, zeta computed now: this
    /// takes time linear in the item count (about 10 ns per item).
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] for an empty range, `theta` outside `[0, 1)`, or more
    /// than [`ZETA_TERMS_MAX`] items.
    pub fn with_constant(min: u64, max: u64, theta: f64) -> Result<Self, Error> {
        let item_count = item_count(min, max)?;
        check_theta(theta)?;
        if item_count > ZETA_TERMS_MAX {
            return Err(Error::invalid(
                "zipfian item count",
                item_count,
                Expected::AtMost { max: ZETA_TERMS_MAX, unit: "items (computing zeta)" },
            ));
        }
        Self::with_zeta(min, max, theta, zeta(item_count, theta))
    }

    /// Zipfian over `[min, max]` using a precomputed `zeta_n` (YCSB's four-argument
    /// constructor), for item counts too large to sum.
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] for an empty range, `theta` outside `[0, 1)` or a
    /// `zeta_n` that is not finite and at least 1.
    pub fn with_zeta(min: u64, max: u64, theta: f64, zeta_n: f64) -> Result<Self, Error> {
        let item_count = item_count(min, max)?;
        check_theta(theta)?;
        if !(zeta_n.is_finite() && zeta_n >= 1.0) {
            return Err(Error::invalid("zeta", zeta_n, "must be finite and at least 1"));
        }
        let zeta_2_theta = zeta(2, theta);
        let mut zipfian = Zipfian {
            item_count,
            base: min,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta_2_theta,
            zeta_n,
            eta: 0.0,
            count_for_zeta: item_count,
            second_item_threshold: 1.0 + 0.5f64.powf(theta),
        };
        zipfian.eta = zipfian.compute_eta();
        Ok(zipfian)
    }

    /// YCSB's eta, always from the construction-time item count (see the module docs).
    fn compute_eta(&self) -> f64 {
        (1.0 - (2.0 / self.item_count as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta_2_theta / self.zeta_n)
    }

    /// The next value over the construction-time item count (YCSB's `nextValue`).
    #[inline]
    pub fn next(&self, random: &mut Random) -> u64 {
        // count_for_zeta >= item_count always (it only grows), and a decrease never
        // recomputes, so YCSB's nextValue() never touches zeta here either.
        self.sample(self.item_count, random)
    }

    /// The next value when the distribution now covers `item_count` items from `min`
    /// (YCSB's `nextLong(itemcount)`). A larger count extends zeta incrementally.
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] if `item_count` exceeds [`ZETA_TERMS_MAX`] while zeta
    /// would have to be extended to it.
    #[inline]
    pub fn next_with_item_count(&mut self, item_count: u64, random: &mut Random) -> Result<u64, Error> {
        if item_count > self.count_for_zeta {
            self.grow(item_count)?;
        }
        Ok(self.sample(item_count, random))
    }

    #[cold]
    fn grow(&mut self, item_count: u64) -> Result<(), Error> {
        if item_count > ZETA_TERMS_MAX {
            return Err(Error::invalid(
                "zipfian item count",
                item_count,
                Expected::AtMost { max: ZETA_TERMS_MAX, unit: "items (extending zeta)" },
            ));
        }
        self.zeta_n = zeta_extend(self.count_for_zeta, item_count, self.theta, self.zeta_n);
        self.count_for_zeta = item_count;
        self.eta = self.compute_eta();
        Ok(())
    }

    #[inline(always)]
    fn sample(&self, item_count: u64, random: &mut Random) -> u64 {
        self.value_at(random.next_f64(), item_count)
    }

    /// YCSB's `nextLong` for a given uniform draw `u` in [0, 1).
    #[inline(always)]
    fn value_at(&self, u: f64, item_count: u64) -> u64 {
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return self.base;
        }
        if uz < self.second_item_threshold {
            return self.base + 1;
        }
        let rank = (item_count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + rank
    }

    /// The current zeta (grows with [`Zipfian::next_with_item_count`]).
    pub fn zeta_n(&self) -> f64 {
        self.zeta_n
    }

    /// The item count zeta was last computed for.
    pub fn count_for_zeta(&self) -> u64 {
        self.count_for_zeta
    }

    /// The zipfian constant.
    pub fn theta(&self) -> f64 {
        self.theta
    }
}

fn item_count(min: u64, max: u64) -> Result<u64, Error> {
    if min > max {
        return Err(Error::invalid(
            "zipfian range",
            format!("[{min}, {max}]"),
            "the lower bound must not exceed the upper bound",
        ));
    }
    (max - min).checked_add(1).ok_or_else(|| Error::invalid("zipfian range", format!("[{min}, {max}]"), "too large"))
}

fn check_theta(theta: f64) -> Result<(), Error> {
    if (0.0..1.0).contains(&theta) {
        Ok(())
    } else {
        Err(Error::invalid("zipfian constant", theta, "must be in [0, 1) (alpha = 1 / (1 - theta))"))
    }
}

/// Zipfian popularity scattered over `[min, max]` by FNV (YCSB's `ScrambledZipfianGenerator`
/// with its default constant 0.99).
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    ranks: Zipfian,
    min: u64,
    item_count: FastModulus,
}

/// `value % divisor` for a divisor fixed in advance, without a division instruction
/// (Lemire, Kaser, Kurz, "Faster remainder by direct computation", 2019: with a 128-bit
/// magic number the result is exact for every 64-bit value and divisor). A 64-bit division
/// costs tens of cycles on the key-drawing hot path; this is four multiplications.
#[derive(Clone, Copy, Debug)]
struct FastModulus {
    divisor: u64,
    /// `ceil(2^128 / divisor)`, i.e. `u128::MAX / divisor + 1`, wrapping to 0 for divisor 1
    /// (which makes every remainder 0, correctly).
    magic: u128,
}

impl FastModulus {
    fn new(divisor: u64) -> Self {
        debug_assert!(divisor > 0);
        FastModulus { divisor, magic: (u128::MAX / u128::from(divisor)).wrapping_add(1) }
    }

    #[inline]
    fn remainder(&self, value: u64) -> u64 {
        let fraction = self.magic.wrapping_mul(u128::from(value));
        // The high 64 bits of the 192-bit product fraction * divisor.
        let divisor = u128::from(self.divisor);
        let low = ((fraction & u128::from(u64::MAX)) * divisor) >> 64;
        let high = (fraction >> 64) * divisor;
        ((low + high) >> 64) as u64
    }
}

impl ScrambledZipfian {
    /// Keys in `[min, max]`.
    ///
    /// Only the constant 0.99 is offered: zeta for the 10^10-rank space is precomputed for it
    /// alone, and summing it for another constant takes minutes (YCSB does that; we do not).
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] for an empty range or one larger than `i64::MAX` keys
    /// (YCSB computes in Java `long`s).
    pub fn new(min: u64, max: u64) -> Result<Self, Error> {
        let item_count = item_count(min, max)?;
        if item_count > i64::MAX as u64 {
            return Err(Error::invalid("scrambled zipfian range", format!("[{min}, {max}]"), "too large"));
        }
        let ranks = Zipfian::with_zeta(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETA_N)?;
        Ok(ScrambledZipfian { ranks, min, item_count: FastModulus::new(item_count) })
    }

    /// The next key: `min + fnvhash64(rank) % itemcount`.
    #[inline(always)]
    pub fn next(&self, random: &mut Random) -> u64 {
        let rank = self.ranks.next(random);
        // fnvhash64 is non-negative except for an input hashing to i64::MIN (Java's `%` would
        // then give a negative key). Reading the hash as unsigned equals Java's `%` for every
        // non-negative hash, and keeps the key in range for that one value.
        let hashed = fnv_hash64(rank as i64) as u64;
        self.min + self.item_count.remainder(hashed)
    }

    /// The zipfian over ranks (for inspection: its zeta is [`SCRAMBLED_ZETA_N`]).
    pub fn ranks(&self) -> &Zipfian {
        &self.ranks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeta_matches_hand_sums() {
        // Written out term by term, independent of the loop under test.
        let theta = 0.99;
        let by_hand_3 = 1.0 + 1.0 / 2f64.powf(theta) + 1.0 / 3f64.powf(theta);
        assert_eq!(zeta(3, theta), by_hand_3);
        let by_hand_10: f64 = (1..=10).map(|i| 1.0 / f64::from(i).powf(theta)).sum();
        assert!((zeta(10, theta) - by_hand_10).abs() < 1e-12);
        // theta = 0: every term is 1.
        assert_eq!(zeta(1000, 0.0), 1000.0);
        // theta = 0.5: 1 + 1/sqrt(2) + 1/sqrt(3) + 1/2.
        let half = 1.0 + 0.5f64.sqrt() + (1.0 / 3f64).sqrt() + 0.5;
        assert!((zeta(4, 0.5) - half).abs() < 1e-12);
        assert_eq!(zeta(0, theta), 0.0);
    }

    /// zeta(N, theta) by Euler-Maclaurin: the first m-1 terms summed, the rest replaced by
    /// the integral plus end corrections. With m = 10^4 the neglected terms are below 1e-15.
    fn zeta_euler_maclaurin(n: f64, theta: f64) -> f64 {
        let m = 10_000u32;
        let head: f64 = (1..m).map(|i| f64::from(i).powf(-theta)).sum();
        let m = f64::from(m);
        let f = |x: f64| x.powf(-theta);
        let derivative = |x: f64| -theta * x.powf(-theta - 1.0);
        let integral = (n.powf(1.0 - theta) - m.powf(1.0 - theta)) / (1.0 - theta);
        head + integral + (f(m) + f(n)) / 2.0 + (derivative(n) - derivative(m)) / 12.0
    }

    /// Recomputing zeta(10^10, 0.99) term by term is not feasible in a test, but
    /// Euler-Maclaurin gets it to ~1e-12. It agrees with YCSB's constant to 3e-11 (the naive
    /// double sum YCSB ran could have drifted by up to ~1e-5; it did not). The check also pins
    /// which item count the constant belongs to: zeta(10^16, 0.99) would be about 45.
    #[test]
    fn scrambled_zeta_constant_is_zeta_of_ten_billion() {
        let estimate = zeta_euler_maclaurin(1e10, ZIPFIAN_CONSTANT);
        println!("Euler-Maclaurin zeta(1e10, 0.99) = {estimate}, YCSB {SCRAMBLED_ZETA_N}");
        assert!((estimate - SCRAMBLED_ZETA_N).abs() < 1e-9);
        // The method itself, against a sum we can do directly.
        let direct = zeta(100_000, 0.99);
        assert!((zeta_euler_maclaurin(1e5, 0.99) - direct).abs() < 1e-9);
    }

    #[test]
    fn scrambled_uses_the_precomputed_constant() {
        let scrambled = ScrambledZipfian::new(0, 999).expect("valid range");
        assert_eq!(scrambled.ranks().zeta_n(), SCRAMBLED_ZETA_N);
        assert_eq!(scrambled.ranks().count_for_zeta(), SCRAMBLED_ITEM_COUNT + 1);
    }

    /// P(first item) = P(u < 1/zeta) = 1/zeta(n) exactly, and P(second) = 0.5^theta/zeta(n).
    /// For 1000 items zeta(1000, 0.99) = 7.729, so item 0 gets 12.94% of the draws.
    #[test]
    fn hottest_item_frequency_is_one_over_zeta() {
        let seed = 1234;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let zipfian = Zipfian::new(0, 999).expect("valid range");
        let zeta_1000: f64 = (1..=1000).map(|i| 1.0 / f64::from(i).powf(0.99)).sum();
        let expected_first = 1.0 / zeta_1000;
        let expected_second = 0.5f64.powf(0.99) / zeta_1000;
        println!("1/zeta(1000, 0.99) = {expected_first:.4}");
        assert!((expected_first - 0.129_38).abs() < 1e-5);
        let draws = 1_000_000u32;
        let mut counts = vec![0u32; 1000];
        for _ in 0..draws {
            let value = zipfian.next(&mut random);
            assert!(value < 1000, "out of range: {value}");
            counts[value as usize] += 1;
        }
        let first = f64::from(counts[0]) / f64::from(draws);
        let second = f64::from(counts[1]) / f64::from(draws);
        // Binomial standard deviation sqrt(p(1-p)/n) is 3.4e-4; allow five of them.
        assert!((first - expected_first).abs() < 0.0017, "item 0: {first}");
        assert!((second - expected_second).abs() < 0.0017, "item 1: {second}");
        // Popularity falls with rank.
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
    }

    /// The scrambled generator folds the 10^10-rank zipfian onto the keys: the hottest key is
    /// fnvhash64(0) % 1000, with 1/ZETAN (3.8%) of the draws plus the ranks that fold onto
    /// it (about 1/1000 of the rest). Were zeta that of 1000 items, it would get 13%.
    #[test]
    fn scrambled_hottest_key_gets_one_over_zetan() {
        let seed = 99;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let scrambled = ScrambledZipfian::new(0, 999).expect("valid range");
        let draws = 1_000_000u32;
        let mut counts = vec![0u32; 1000];
        for _ in 0..draws {
            let key = scrambled.next(&mut random);
            assert!(key < 1000, "out of range: {key}");
            counts[key as usize] += 1;
        }
        let hottest = (fnv_hash64(0) % 1000) as usize;
        let (busiest, &busiest_count) = counts.iter().enumerate().max_by_key(|&(_, count)| *count).expect("non-empty");
        assert_eq!(busiest, hottest);
        let frequency = f64::from(busiest_count) / f64::from(draws);
        let floor = 1.0 / SCRAMBLED_ZETA_N;
        println!("hottest key frequency {frequency:.4}, 1/ZETAN {floor:.4}");
        assert!(frequency > floor - 0.001 && frequency < floor + 0.004);
    }

    /// The three cases of `nextLong`, at draws chosen on either side of each threshold, and
    /// the formula worked out separately for one draw.
    #[test]
    fn next_long_cases() {
        let zipfian = Zipfian::new(10, 1009).expect("valid range");
        let zeta_n = zeta(1000, 0.99);
        let first_end = 1.0 / zeta_n;
        let second_end = (1.0 + 0.5f64.powf(0.99)) / zeta_n;
        assert_eq!(zipfian.value_at(0.0, 1000), 10);
        assert_eq!(zipfian.value_at(first_end * 0.999_999, 1000), 10);
        assert_eq!(zipfian.value_at(first_end * 1.000_001, 1000), 11);
        assert_eq!(zipfian.value_at(second_end * 0.999_999, 1000), 11);
        assert!(zipfian.value_at(second_end * 1.000_001, 1000) >= 11);
        let theta: f64 = 0.99;
        let eta = (1.0 - (2.0f64 / 1000.0).powf(1.0 - theta)) / (1.0 - zeta(2, theta) / zeta_n);
        let alpha = 1.0 / (1.0 - theta);
        for u in [0.5, 0.9, 0.999_999] {
            let expected = 10 + (1000.0 * (eta * u - eta + 1.0).powf(alpha)) as u64;
            assert_eq!(zipfian.value_at(u, 1000), expected, "u = {u}");
            assert!(expected <= 1009);
        }
        // Gray's formula approximates the inverse of the zipfian CDF: the median draw is the
        // item where the cumulative share reaches about one half.
        let median_rank = zipfian.value_at(0.5, 1000) - 10;
        let share_below = zeta(median_rank, 0.99) / zeta_n;
        let share_through = zeta(median_rank + 1, 0.99) / zeta_n;
        assert!(share_below <= 0.52 && share_through >= 0.48, "median rank {median_rank}");
    }

    #[test]
    fn fast_modulus_equals_remainder() {
        let seed = 123;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let mut divisors = vec![1u64, 2, 3, 7, 1000, 1001, 1 << 32, (1 << 32) + 1];
        divisors.extend([u64::MAX, u64::MAX - 1, i64::MAX as u64, 10_000_000_001]);
        for _ in 0..100 {
            divisors.push(random.next_u64() >> (random.next_u64() % 64));
        }
        for divisor in divisors.into_iter().filter(|&divisor| divisor > 0) {
            let modulus = FastModulus::new(divisor);
            let mut values = vec![0u64, 1, divisor - 1, divisor, u64::MAX, u64::MAX - 1];
            values.extend((0..200).map(|_| random.next_u64()));
            for value in values {
                assert_eq!(modulus.remainder(value), value % divisor, "{value} % {divisor}");
            }
        }
    }

    #[test]
    fn incremental_zeta_equals_zeta_from_scratch() {
        let seed = 5;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let mut zipfian = Zipfian::new(0, 99).expect("valid range");
        assert_eq!(zipfian.zeta_n(), zeta(100, 0.99));
        let value = zipfian.next_with_item_count(250, &mut random).expect("small growth");
        assert!(value < 250);
        assert_eq!(zipfian.count_for_zeta(), 250);
        assert_eq!(zipfian.zeta_n(), zeta(250, 0.99));
        // A smaller count does not recompute (YCSB's allowitemcountdecrease = false).
        zipfian.next_with_item_count(10, &mut random).expect("no growth");
        assert_eq!(zipfian.count_for_zeta(), 250);
    }

    /// YCSB recomputes eta with the construction-time item count after growth.
    #[test]
    fn eta_after_growth_uses_original_item_count() {
        let seed = 6;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let mut zipfian = Zipfian::new(0, 99).expect("valid range");
        zipfian.next_with_item_count(1000, &mut random).expect("growth");
        let expected = (1.0 - (2.0f64 / 100.0).powf(1.0 - 0.99)) / (1.0 - zeta(2, 0.99) / zeta(1000, 0.99));
        assert_eq!(zipfian.eta, expected);
    }

    #[test]
    fn degenerate_ranges_work() {
        let seed = 8;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let one = Zipfian::new(7, 7).expect("one item");
        assert!((0..1000).all(|_| one.next(&mut random) == 7));
        let two = Zipfian::new(0, 1).expect("two items");
        for _ in 0..1000 {
            assert!(two.next(&mut random) <= 1);
        }
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Zipfian::new(5, 4).is_err());
        assert!(Zipfian::with_constant(0, 10, 1.0).is_err());
        assert!(Zipfian::with_constant(0, 10, -0.1).is_err());
        assert!(Zipfian::with_constant(0, 10, f64::NAN).is_err());
        assert!(Zipfian::with_zeta(0, 10, 0.99, f64::INFINITY).is_err());
        assert!(Zipfian::new(0, ZETA_TERMS_MAX).is_err());
        assert!(ScrambledZipfian::new(0, u64::MAX).is_err());
        let mut zipfian = Zipfian::new(0, 9).expect("valid");
        let seed = 1;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        assert!(zipfian.next_with_item_count(ZETA_TERMS_MAX + 1, &mut random).is_err());
    }
}
