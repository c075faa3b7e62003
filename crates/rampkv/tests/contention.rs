//! Contention tests: many clients, few keys, mixed reads and writes, checked for read
//! atomicity. Every RAMP variant must be clean; NoCC and the skip-repair mutants must be
//! caught, which proves the checker (and the test) can see fractured reads.

use rampkv::bench::{self, BenchConfig, BenchResult, StopAfter};
use rampkv::protocol::ramp::Algorithm;

fn contended(algorithm: Algorithm, seed: u64, seconds: f64) -> BenchConfig {
    BenchConfig {
        algorithm,
        servers: 3,
        server_threads: 2,
        clients: 24,
        client_threads: 2,
        txn_size: 3,
        read_ratio: 0.5,
        keys: 6,
        value_size: 24,
        stop_after: StopAfter::Duration { seconds },
        seed,
        check: true,
        ..BenchConfig::default()
    }
}

fn seed() -> u64 {
    let seed = std::env::var("RAMPKV_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (replay the workload with RAMPKV_TEST_SEED={seed})");
    seed
}

fn assert_clean_under_contention(algorithm: Algorithm) -> BenchResult {
    let result = bench::run(&contended(algorithm, seed(), 2.0)).unwrap();
    println!("{result}");
    let report = result.check.as_ref().unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(result.failed_transactions, 0, "{:?}", result.first_failure);
    assert!(result.read.count > 300 && result.write.count > 300, "the run did real work");
    assert!(result.round2.reads_with_round2 > 0, "contention must exercise round 2");
    result
}

/// Runs `config` until the checker reports an anomaly (bounded), and returns the result.
fn caught(mut config: BenchConfig) -> BenchResult {
    for attempt in 0..5 {
        config.seed = config.seed.wrapping_add(attempt);
        let result = bench::run(&config).unwrap();
        let report = result.check.as_ref().unwrap();
        println!("attempt {attempt}: {report}");
        if !report.is_clean() {
            assert!(report.fractured_reads > 0, "the anomaly must be a fractured read: {report}");
            return result;
        }
    }
    panic!("{} (mutant: {}) was never caught", config.algorithm.name(), config.mutant_skip_repair);
}

#[test]
fn ramp_fast_under_contention_has_no_fractured_or_garbage_reads() {
    let result = assert_clean_under_contention(Algorithm::RampFast);
    assert!(result.round2.reads_with_round2 < result.read.count, "RAMP-Fast needs round 2 only on a race");
}

#[test]
fn ramp_small_under_contention_has_no_fractured_or_garbage_reads() {
    let result = assert_clean_under_contention(Algorithm::RampSmall);
    // Every key goes to round 2 (round 1 returns no values), except in reads that found no key
    // ever written: those are done after round 1.
    assert_eq!(result.round2.round2_keys, 3 * result.round2.reads_with_round2, "all keys of a read go to round 2");
    assert!(result.round2.fraction_of_reads > 0.95, "only reads before any write skip round 2");
}

#[test]
fn ramp_hybrid_under_contention_has_no_fractured_or_garbage_reads() {
    assert_clean_under_contention(Algorithm::RampHybrid);
}

#[test]
fn s2pl_under_contention_has_no_fractured_or_garbage_reads() {
    let result = bench::run(&contended(Algorithm::S2pl, seed(), 2.0)).unwrap();
    println!("{result}");
    let report = result.check.as_ref().unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(result.failed_transactions, 0, "{:?}", result.first_failure);
    assert!(result.read.count > 100 && result.write.count > 100, "the run did real work");
    assert!(result.round2.read_restarts > 0, "contention must exercise wait-die aborts and retries");
}

#[test]
fn nocc_under_contention_is_caught_with_fractured_reads() {
    caught(contended(Algorithm::NoCc, seed(), 2.0));
}

#[test]
fn the_checker_catches_the_skip_repair_mutant_of_every_ramp_variant() {
    let seed = seed();
    for algorithm in [Algorithm::RampFast, Algorithm::RampSmall, Algorithm::RampHybrid] {
        let mut config = contended(algorithm, seed, 1.5);
        config.mutant_skip_repair = true;
        caught(config);
    }
}
