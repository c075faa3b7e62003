//! Micro-benchmark of the persistence engine (docs/performance.md, "Persistence engine").
//!
//! ```text
//! cargo run --release -p rampkv-durable --example durable_bench -- [--quick]
//!     [--seconds S] [--appenders 1,4,16,64] [--keys N] [--value-bytes B] [--dir DIR]
//! ```
//! 1. Append throughput: for each policy and each number of appender threads, every thread
//!    appends a PUT of one `--value-bytes` value and waits until it is durable, in a closed
//!    loop, for `--seconds`: records/s, fsyncs/s and records per fsync (with `always`, the
//!    group commit; an appender writes its own record, so a `write` holds about one).
//! 2. Restart time for `--keys` keys of `--value-bytes`: the directory holds only the log (one
//!    PUT per key): replay time; then two snapshots (the log they cover is dropped): snapshot
//!    write time, and the restart that loads the snapshot.
//!
//! Files go to a fresh directory under `--dir` (default: the system's temporary directory),
//! removed at the end. `--quick` is the smoke run of scripts/test.sh.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_core::storage::{Key, Store};
use rampkv_durable::{open, FsyncPolicy, Log, OpenOptions, RecordRef, RecoveryReport};

type Failure = Box<dyn std::error::Error + Send + Sync>;

struct Settings {
    seconds: f64,
    appenders: Vec<u64>,
    keys: u64,
    value_bytes: usize,
    dir: PathBuf,
}

fn settings() -> Result<Settings, Failure> {
    let mut settings = Settings {
        seconds: 3.0,
        appenders: vec![1, 4, 16, 64],
        keys: 1_000_000,
        value_bytes: 1024,
        dir: std::env::temp_dir(),
    };
    let mut arguments = std::env::args().skip(1);
    while let Some(flag) = arguments.next() {
        let mut value = || arguments.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--quick" => {
                settings.seconds = 0.3;
                settings.appenders = vec![1, 8];
                settings.keys = 20_000;
            }
            "--seconds" => settings.seconds = value()?.parse()?,
            "--appenders" => {
                settings.appenders = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--keys" => settings.keys = value()?.parse()?,
            "--value-bytes" => settings.value_bytes = value()?.parse()?,
            "--dir" => settings.dir = value()?.into(),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(settings)
}

/// A fresh directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(parent: &Path, name: &str) -> Scratch {
        let path = parent.join(format!("rampkv-durable-bench-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn key_of(number: u64) -> Key {
    format!("key{number:010}").into_bytes().into()
}

fn open_fresh(dir: &Path, policy: FsyncPolicy) -> Result<(Log, Store, RecoveryReport), Failure> {
    let store = Store::new(10_000);
    let options = OpenOptions { policy, ..OpenOptions::default() };
    let (log, report) = open(dir, &options, &store)?;
    Ok((log, store, report))
}

fn appends(settings: &Settings) -> Result<(), Failure> {
    println!("# append throughput: closed loop, append a PUT of {} B then wait until durable", settings.value_bytes);
    println!("# records/fsync: records per fsync (with always, the group commit)");
    println!("{:<9} {:>9} {:>12} {:>10} {:>14}", "policy", "appenders", "records/s", "fsyncs/s", "records/fsync");
    for policy in [FsyncPolicy::Always, FsyncPolicy::Everysec, FsyncPolicy::No] {
        for &appenders in &settings.appenders {
            let scratch = Scratch::new(&settings.dir, "append");
            let (log, _, _) = open_fresh(&scratch.0, policy)?;
            let log = Arc::new(log);
            let stop = Arc::new(AtomicBool::new(false));
            let acknowledged = Arc::new(AtomicU64::new(0));
            let value: Box<[u8]> = vec![0x5A; settings.value_bytes].into();
            let threads: Vec<_> = (1..=appenders)
                .map(|thread| {
                    let (log, stop, acknowledged, value) =
                        (Arc::clone(&log), Arc::clone(&stop), Arc::clone(&acknowledged), value.clone());
                    std::thread::spawn(move || -> Result<(), Failure> {
                        let mut counter = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            counter += 1;
                            let ts = counter << 16 | thread;
                            let writes = vec![(key_of(counter % 100_000), value.clone())];
                            let lsn = log.append(0, RecordRef::Put { ts, writes: (&writes).into() })?;
                            log.wait_durable(lsn, Duration::from_secs(30))?;
                            acknowledged.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    })
                })
                .collect();
            let before = log.stats();
            let started = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(settings.seconds));
            let (records, after, elapsed) = (acknowledged.load(Ordering::Relaxed), log.stats(), started.elapsed());
            stop.store(true, Ordering::Relaxed);
            for thread in threads {
                thread.join().map_err(|_| "an appender panicked")??;
            }
            let seconds = elapsed.as_secs_f64();
            let fsyncs = after.fsyncs - before.fsyncs;
            let fsyncs_counted = fsyncs.max(1);
            println!(
                "{:<9} {:>9} {:>12.0} {:>10.1} {:>14.2}",
                policy.name(),
                appenders,
                records as f64 / seconds,
                fsyncs as f64 / seconds,
                (after.records - before.records) as f64 / fsyncs_counted as f64
            );
            Arc::into_inner(log).ok_or("log still shared")?.close()?;
        }
    }
    Ok(())
}

fn restart(settings: &Settings) -> Result<(), Failure> {
    let gib = (settings.keys * settings.value_bytes as u64) as f64 / f64::from(1 << 30);
    println!(
        "# restart: {} keys of {} B ({gib:.2} GiB of values), warm page cache",
        settings.keys, settings.value_bytes
    );
    let scratch = Scratch::new(&settings.dir, "restart");
    let (log, store, _) = open_fresh(&scratch.0, FsyncPolicy::No)?;
    let value: Box<[u8]> = vec![0xA5; settings.value_bytes].into();
    let started = Instant::now();
    for number in 0..settings.keys {
        let writes = vec![(key_of(number), value.clone())];
        store.put(number + 1, writes.clone(), 0)?;
        log.append_timeout(0, RecordRef::Put { ts: number + 1, writes: (&writes).into() }, Duration::from_secs(30))?;
    }
    log.close()?;
    println!("log written: {:.2} s", started.elapsed().as_secs_f64());
    drop(store);

    let started = Instant::now();
    let (log, store, report) = open_fresh(&scratch.0, FsyncPolicy::No)?;
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(report.records_replayed, settings.keys);
    println!(
        "restart from the log only: {elapsed:.2} s ({} records replayed in {} ms)",
        report.records_replayed, report.replay_ms
    );

    let written = log.write_snapshot(&store)?;
    println!(
        "snapshot written: {:.2} s, {:.2} GiB, {} keys",
        written.duration_ms as f64 / 1e3,
        written.bytes as f64 / f64::from(1 << 30),
        written.counts.keys
    );
    // A second snapshot makes the first the oldest kept one, which drops the log it covers.
    let writes = vec![(key_of(0), value.clone())];
    store.put(settings.keys + 1, writes.clone(), 0)?;
    log.append(0, RecordRef::Put { ts: settings.keys + 1, writes: (&writes).into() })?;
    let second = log.write_snapshot(&store)?;
    println!("second snapshot: {:.2} s; dropped {} files", second.duration_ms as f64 / 1e3, second.dropped.len());
    log.close()?;
    drop(store);

    let started = Instant::now();
    let (log, store, report) = open_fresh(&scratch.0, FsyncPolicy::No)?;
    let elapsed = started.elapsed().as_secs_f64();
    let loaded = report.snapshot.as_ref().ok_or("no snapshot loaded")?;
    assert_eq!(store.stats().keys as u64, settings.keys);
    println!(
        "restart from the snapshot: {elapsed:.2} s (snapshot load {} ms, {} records replayed in {} ms)",
        loaded.duration_ms, report.records_replayed, report.replay_ms
    );
    log.close()?;
    Ok(())
}

fn main() -> Result<(), Failure> {
    let settings = settings()?;
    println!("# rampkv-durable micro-benchmark; files under {}", settings.dir.display());
    appends(&settings)?;
    restart(&settings)
}
