//! A long write-heavy run: garbage collection keeps memory bounded.
//!
//! 1,000 keys, 90% writes, a 1-second grace period, for `RAMPKV_GC_SOAK_SECONDS` (default 60).
//! The resident set size is sampled every second; after a warm-up it must stay flat, and the
//! stores must end holding a small fraction of every version ever written.

use std::time::{Duration, Instant};

use rampkv::bench::{self, BenchConfig, StopAfter};

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn memory_stays_flat_under_a_long_write_heavy_run() {
    let seconds: u64 = std::env::var("RAMPKV_GC_SOAK_SECONDS").ok().and_then(|text| text.parse().ok()).unwrap_or(60);
    let seed = 7;
    println!("seed {seed}, {seconds} s");
    let config = BenchConfig {
        clients: 8,
        txn_size: 4,
        read_ratio: 0.1,
        keys: 1_000,
        value_size: 256,
        gc_grace_ms: 1_000,
        stop_after: StopAfter::Duration { seconds: seconds as f64 },
        seed,
        ..BenchConfig::default()
    };
    let runner = std::thread::spawn(move || bench::run(&config).unwrap());
    let started = Instant::now();
    let mut samples = Vec::new();
    while !runner.is_finished() {
        std::thread::sleep(Duration::from_secs(1));
        samples.push((started.elapsed().as_secs(), resident_bytes()));
    }
    let result = runner.join().unwrap();
    for (second, bytes) in &samples {
        println!("t={second:>3}s rss={:.1} MiB", *bytes as f64 / (1 << 20) as f64);
    }
    let written: u64 = result.write.count * 4;
    let versions: usize = result.store.iter().map(|stats| stats.versions).sum();
    let collected: usize = result.store.iter().map(|stats| stats.versions_collected).sum();
    println!("{result}");
    println!("versions written {written}, held at the end {versions}, collected {collected}");
    assert!(result.write.count > 1_000, "the run wrote");
    assert!((versions as u64) < written / 5, "most versions were collected");
    // After a warm-up of a sixth of the run, the resident set may wobble but not grow. The
    // bound is loose (twice the early level, plus 32 MiB) because on a loaded machine the
    // server thread is starved in bursts, GC falls behind by a grace period's worth of versions
    // and the allocator keeps what it got (once seen: 27 to 56 MiB at load 10). Without GC the
    // run writes over 100 MiB of versions a minute even on a loaded machine, so a leak still
    // fails it, and the count of versions held (above) is checked exactly.
    let warm = samples.len() / 6;
    let baseline = samples[warm..].iter().take(3).map(|(_, bytes)| *bytes).max().unwrap();
    let peak_late = samples[samples.len() * 2 / 3..].iter().map(|(_, bytes)| *bytes).max().unwrap();
    println!(
        "rss after warm-up {:.1} MiB, late peak {:.1} MiB",
        baseline as f64 / 1048576.0,
        peak_late as f64 / 1048576.0
    );
    assert!(peak_late <= 2 * baseline + (32 << 20), "memory grew from {baseline} to {peak_late} bytes");
}
