//! The seeded random source behind every generator.
//!
//! YCSB draws from `ThreadLocalRandom`, which cannot be seeded, so its runs do not replay. Here
//! one [`Random`] (xoshiro256++, seeded through SplitMix64) is owned by each workload, and every
//! draw comes from it: the same seed gives the same operations, keys and values, on any machine.
//! The algorithm is written out here rather than taken from a crate so that the stream can never
//! change under a dependency upgrade; the reference outputs are pinned in the tests.

/// A small, fast, seedable generator: xoshiro256++ (Blackman and Vigna).
#[derive(Clone, Debug)]
pub struct Random {
    state: [u64; 4],
}

/// 2^-53: turns the top 53 bits of a draw into a double in [0, 1), like Java's `nextDouble`.
const UNIT_DOUBLE_SCALE: f64 = 1.0 / (1u64 << 53) as f64;

impl Random {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        // SplitMix64 spreads any seed (0 included) over the 256-bit state; its outputs are a
        // bijection of the counter, so four consecutive ones are never all zero.
        let mut counter = seed;
        let mut state = [0u64; 4];
        for word in &mut state {
            counter = counter.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut mixed = counter;
            mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            *word = mixed ^ (mixed >> 31);
        }
        debug_assert!(state != [0; 4], "xoshiro must not start from the all-zero state");
        Random { state }
    }

    /// A generator started from a raw state, for replaying reference vectors. The all-zero
    /// state is a fixed point of xoshiro, so it is refused.
    pub fn from_state(state: [u64; 4]) -> Option<Self> {
        (state != [0; 4]).then_some(Random { state })
    }

    /// The next 64 uniformly distributed bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = self.state;
        let result = s0.wrapping_add(s3).rotate_left(23).wrapping_add(s0);
        let shifted = s1 << 17;
        let mut next = [s0, s1, s2 ^ s0, s3 ^ s1];
        next[1] ^= next[2];
        next[0] ^= next[3];
        next[2] ^= shifted;
        next[3] = next[3].rotate_left(45);
        self.state = next;
        result
    }

    /// A double in [0, 1) with 53 random bits, the same resolution as Java's `nextDouble`.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * UNIT_DOUBLE_SCALE
    }

    /// An integer in `[0, bound)`; 0 when `bound` is 0.
    ///
    /// Lemire's multiply-and-shift: one multiplication instead of a division. Its bias is at
    /// most `bound / 2^64` (below 1e-9 for any key space here), smaller than the bias of YCSB's
    /// own `abs(nextLong()) % n`.
    #[inline]
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// Fills `bytes` with printable ASCII (0x20..=0x5F), like YCSB's `RandomByteIterator`
    /// fills values with printable characters. Eight bytes per draw.
    pub fn fill_printable(&mut self, bytes: &mut [u8]) {
        let mut chunks = bytes.chunks_exact_mut(8);
        for chunk in &mut chunks {
            let word = self.next_u64().to_le_bytes();
            for (out, random) in chunk.iter_mut().zip(word) {
                *out = b' ' + (random & 0x3F);
            }
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let word = self.next_u64().to_le_bytes();
            for (out, random) in tail.iter_mut().zip(word) {
                *out = b' ' + (random & 0x3F);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xoshiro256++ from the state [1, 2, 3, 4]. The first two outputs were worked out by hand
    /// from the algorithm: rotl(1 + 4, 23) + 1 = 5 << 23 | 1, and after one state update
    /// s0 = 7, s3 = 6 << 45, so rotl(7 + (6 << 45), 23) + 7 = (7 << 23) + 96 + 7.
    #[test]
    fn xoshiro_reference_outputs() {
        let mut random = Random::from_state([1, 2, 3, 4]).expect("non-zero state");
        assert_eq!(random.next_u64(), 41_943_041);
        assert_eq!(random.next_u64(), 58_720_359);
    }

    #[test]
    fn zero_state_is_refused() {
        assert!(Random::from_state([0; 4]).is_none());
    }

    #[test]
    fn same_seed_same_stream() {
        let seed = 0x5EED;
        println!("seed {seed}");
        let mut first = Random::new(seed);
        let mut second = Random::new(seed);
        for _ in 0..1000 {
            assert_eq!(first.next_u64(), second.next_u64());
        }
        let mut other = Random::new(seed + 1);
        let mut again = Random::new(seed);
        assert_ne!(other.next_u64(), again.next_u64());
    }

    #[test]
    fn unit_doubles_stay_in_range() {
        let seed = 7;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        let mut sum = 0.0;
        for _ in 0..100_000 {
            let value = random.next_f64();
            assert!((0.0..1.0).contains(&value));
            sum += value;
        }
        let mean = sum / 100_000.0;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn below_respects_bound() {
        let seed = 11;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        assert_eq!(random.below(0), 0);
        for bound in [1u64, 2, 3, 10, 1000, u64::MAX] {
            for _ in 0..1000 {
                assert!(random.below(bound) < bound);
            }
        }
    }

    #[test]
    fn printable_fill_is_printable_and_complete() {
        let seed = 3;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        for length in [0usize, 1, 7, 8, 9, 100] {
            let mut bytes = vec![0u8; length];
            random.fill_printable(&mut bytes);
            assert!(bytes.iter().all(|byte| (0x20..=0x5F).contains(byte)));
        }
    }
}
