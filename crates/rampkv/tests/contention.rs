//! Contention tests: many clients, few keys, mixed reads and writes, checked for read
//! atomicity; and the skip-repair mutant, which the checker must catch.

use rampkv::bench::{self, BenchConfig, StopAfter};

fn contended(seed: u64, seconds: f64) -> BenchConfig {
    BenchConfig {
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

#[test]
fn ramp_fast_under_contention_has_no_fractured_or_garbage_reads() {
    let result = bench::run(&contended(seed(), 3.0)).unwrap();
    println!("{result}");
    let report = result.check.as_ref().unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(result.failed_transactions, 0, "{:?}", result.first_failure);
    assert!(result.read.count > 500 && result.write.count > 500, "the run did real work");
    assert!(result.round2.reads_with_round2 > 0, "contention must exercise the round-2 repair");
}

#[test]
fn the_checker_catches_the_skip_repair_mutant() {
    let seed = seed();
    // Fractured reads need a race; run until one shows, with a bound.
    for attempt in 0..5 {
        let mut config = contended(seed.wrapping_add(attempt), 2.0);
        config.mutant_skip_repair = true;
        let result = bench::run(&config).unwrap();
        let report = result.check.as_ref().unwrap();
        println!("attempt {attempt}: {report}");
        if !report.is_clean() {
            assert!(report.fractured_reads > 0, "the mutant's anomaly must be a fractured read");
            return;
        }
    }
    panic!("the mutant that skips the round-2 repair was never caught");
}
