//! `DiscreteGenerator`: one of a few values, by weight (the operation chooser).
//!
//! YCSB normalizes the weights (they need not sum to 1), draws `val` in [0, 1) and walks the
//! values in insertion order, returning the first whose normalized weight exceeds what is left
//! of `val` (`if (val < pw) return; val -= pw`). The same walk is done here, with the weights
//! normalized once at construction instead of on every draw (the same divisions, so the same
//! doubles).

use crate::{Error, Random};

/// A weighted choice among a few values.
#[derive(Clone, Debug)]
pub struct Discrete<T: Copy> {
    /// (normalized weight, value), in insertion order; weights are positive.
    choices: Vec<(f64, T)>,
    /// Returned if rounding leaves `val` past the last weight (YCSB would throw there).
    last: T,
}

impl<T: Copy> Discrete<T> {
    /// Values with their weights. Values of weight 0 are dropped, like YCSB adds only
    /// proportions `> 0`.
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] if a weight is negative or not finite, or no weight is
    /// positive.
    pub fn new(weighted: &[(f64, T)]) -> Result<Self, Error> {
        if let Some(&(weight, _)) = weighted.iter().find(|(weight, _)| !weight.is_finite() || *weight < 0.0) {
            return Err(Error::invalid("weight", weight, "weights must be finite and not negative"));
        }
        let sum: f64 = weighted.iter().map(|&(weight, _)| weight).sum();
        let choices: Vec<(f64, T)> = weighted
            .iter()
            .filter(|&&(weight, _)| weight > 0.0)
            .map(|&(weight, value)| (weight / sum, value))
            .collect();
        let Some(&(_, last)) = choices.last() else {
            return Err(Error::invalid("weights", "all zero", "at least one weight must be positive"));
        };
        Ok(Discrete { choices, last })
    }

    /// The next value.
    #[inline]
    pub fn next(&self, random: &mut Random) -> T {
        let mut value = random.next_f64();
        // YCSB's walk, written without an early return: the first choice whose weight exceeds
        // the remaining value wins. The comparisons are data-dependent coin flips, so a select
        // per choice is cheaper than a mispredicted branch.
        let mut chosen = self.last;
        let mut found = false;
        for &(weight, choice) in &self.choices {
            let hit = !found & (value < weight);
            chosen = if hit { choice } else { chosen };
            found |= hit;
            value -= weight;
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_respected() {
        let seed = 77;
        println!("seed {seed}");
        let mut random = Random::new(seed);
        // Unnormalized weights, one zero.
        let discrete = Discrete::new(&[(2.0, 'a'), (0.0, 'z'), (1.0, 'b'), (1.0, 'c')]).expect("valid weights");
        let draws = 100_000u32;
        let mut counts = [0u32; 3];
        for _ in 0..draws {
            match discrete.next(&mut random) {
                'a' => counts[0] += 1,
                'b' => counts[1] += 1,
                'c' => counts[2] += 1,
                other => panic!("unexpected {other}"),
            }
        }
        let share = |count: u32| f64::from(count) / f64::from(draws);
        assert!((share(counts[0]) - 0.5).abs() < 0.01);
        assert!((share(counts[1]) - 0.25).abs() < 0.01);
        assert!((share(counts[2]) - 0.25).abs() < 0.01);
    }

    #[test]
    fn bad_weights_are_errors() {
        assert!(Discrete::new(&[(0.0, 1), (0.0, 2)]).is_err());
        assert!(Discrete::<u8>::new(&[]).is_err());
        assert!(Discrete::new(&[(-1.0, 1), (2.0, 2)]).is_err());
        assert!(Discrete::new(&[(f64::NAN, 1)]).is_err());
    }
}
