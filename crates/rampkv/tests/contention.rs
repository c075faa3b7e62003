//! Contention tests: many clients, few keys, mixed reads and writes, checked for read
//! atomicity. Every RAMP variant must be clean; NoCC and the skip-repair mutants must be
//! caught, which proves the checker (and the test) can see fractured reads.

mod common;

use common::{assert_clean, assert_no_anomaly, caught, contended, contended_transactions, seed};
use rampkv::bench::{BenchConfig, BenchResult, StopAfter, TransportKind};
use rampkv::protocol::ramp::Algorithm;

const TCP: TransportKind = TransportKind::Tcp;

fn assert_clean_under_contention(algorithm: Algorithm) -> BenchResult {
    let result = assert_clean(&contended(algorithm, TCP, seed(), 2.0), 300);
    assert!(result.round2.reads_with_round2 > 0, "contention must exercise round 2");
    result
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
    let result = assert_no_anomaly(&contended_transactions(Algorithm::S2pl, TCP, seed(), 500), 100);
    assert!(result.round2.read_restarts > 0, "contention must exercise wait-die aborts and retries");
}

/// S2PL at the benchmark's default concurrency (4 servers, 8 clients, one client thread, one
/// server poller) with a small key space: clean with races, the reads whose lock-free answer
/// on arrival was fractured and which the locks kept whole (before the network model and the
/// arrival timestamps, S2PL could only ever be inconclusive).
#[test]
fn s2pl_at_the_default_concurrency_is_clean_with_races() {
    let config = BenchConfig {
        algorithm: Algorithm::S2pl,
        keys: 16,
        read_ratio: 0.5,
        stop_after: StopAfter::Transactions { count: 6_000 },
        seed: seed(),
        check: true,
        probe: false, // this history's own races are the point
        ..BenchConfig::default()
    };
    let result = assert_clean(&config, 1_000);
    let evidence = result.check.as_ref().unwrap().evidence;
    assert_eq!(evidence.reads_with_round1, result.read.count, "every S2PL read records its arrival timestamps");
    assert_eq!(evidence.repaired_reads, evidence.round1_fractured_reads, "the locks repair every race");
}

#[test]
fn nocc_under_contention_is_caught_with_fractured_reads() {
    caught(contended(Algorithm::NoCc, TCP, seed(), 2.0));
}

#[test]
fn the_checker_catches_the_skip_repair_mutant_of_every_ramp_variant() {
    let seed = seed();
    for algorithm in [Algorithm::RampFast, Algorithm::RampSmall, Algorithm::RampHybrid] {
        let mut config = contended(algorithm, TCP, seed, 1.5);
        config.mutant_skip_repair = true;
        caught(config);
    }
}
