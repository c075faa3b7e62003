//! Key choice for the micro-benchmark.

use rand::Rng;

/// How a transaction's keys are drawn from `k0` .. `k{keys-1}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyChooser {
    /// Every key equally likely; the keys of one transaction are distinct.
    Uniform,
}

impl KeyChooser {
    /// `count` distinct keys from a key space of `keys` (`count <= keys`, checked by the
    /// configuration).
    pub fn choose(&self, rng: &mut impl Rng, keys: u64, count: usize) -> Vec<Vec<u8>> {
        debug_assert!(count as u64 <= keys);
        let mut chosen: Vec<u64> = Vec::with_capacity(count);
        match self {
            KeyChooser::Uniform => {
                while chosen.len() < count {
                    let key = rng.gen_range(0..keys);
                    if !chosen.contains(&key) {
                        chosen.push(key);
                    }
                }
            }
        }
        chosen.into_iter().map(key_name).collect()
    }
}

/// The name of key number `number`.
pub fn key_name(number: u64) -> Vec<u8> {
    format!("k{number}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn uniform_keys_of_a_transaction_are_distinct_and_in_range() {
        let seed = 7;
        println!("seed {seed}");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for _ in 0..1_000 {
            let keys = KeyChooser::Uniform.choose(&mut rng, 5, 5);
            let mut sorted = keys.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 5);
            assert!(keys.iter().all(|key| ["k0", "k1", "k2", "k3", "k4"].contains(&std::str::from_utf8(key).unwrap())));
        }
    }
}
