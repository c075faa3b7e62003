//! The child process of the crash test (`tests/crash.rs`); not a tool.
//!
//! `rampkv-durable-crash-child DIR ROUND THREADS SECONDS` opens DIR with policy `always` and
//! runs THREADS appenders. Each repeats: PREPARE a version of one of its keys, COMMIT it, PUT
//! another; after each record is durable (`wait_durable` returned) it prints one line
//! `KIND LSN TS` (P, C or U) to stdout. It stops by itself after SECONDS (the test kills it
//! long before). Transaction timestamps are unique across rounds: `ROUND << 48 | counter <<
//! 16 | thread`. Keys and values are derived from the timestamp so the test can check them:
//! see `key_of` and `value_of`, which the test repeats.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_core::storage::{Key, Store, StoredMetadata};
use rampkv_core::wire::WriteSet;
use rampkv_durable::{open, FsyncPolicy, Log, OpenOptions, RecordRef};

/// The key a transaction writes: one of 32 per thread.
fn key_of(ts: u64) -> Key {
    format!("t{}-k{}", ts & 0xFFFF, (ts >> 16) % 32).into_bytes().into()
}

/// The value a transaction writes: its timestamp, repeated to a length that varies with it.
fn value_of(ts: u64) -> Box<[u8]> {
    let length = 16 + (ts >> 16) as usize % 3000;
    ts.to_le_bytes().iter().copied().cycle().take(length).collect()
}

/// Any failure of the child: it prints it and exits non-zero.
type Failure = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Failure> {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let [dir, round, threads, seconds] = arguments.as_slice() else {
        return Err("usage: rampkv-durable-crash-child DIR ROUND THREADS SECONDS".into());
    };
    let (round, threads, seconds): (u64, u64, u64) = (round.parse()?, threads.parse()?, seconds.parse()?);
    let store = Store::new(10_000);
    let options = OpenOptions { policy: FsyncPolicy::Always, ..OpenOptions::default() };
    let (log, report) = open(&PathBuf::from(dir), &options, &store)?;
    eprintln!("child round {round}: replayed {}, cuts {:?}", report.records_replayed, report.cuts);
    let log = Arc::new(log);
    let store = Arc::new(store);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (1..=threads)
        .map(|thread| {
            let (log, store) = (Arc::clone(&log), Arc::clone(&store));
            std::thread::spawn(move || append_until(&log, &store, round, thread, deadline))
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| "an appender panicked")??;
    }
    Ok(())
}

fn append_until(log: &Log, store: &Store, round: u64, thread: u64, deadline: Instant) -> Result<(), Failure> {
    let mut counter = 1u64;
    while Instant::now() < deadline {
        let prepared = round << 48 | counter << 16 | thread;
        let put = round << 48 | (counter + 1) << 16 | thread;
        counter += 2;
        let writes = vec![(key_of(prepared), value_of(prepared))];
        // A second key (written elsewhere, as far as this store knows), so that superseded
        // versions keep the grace period the test's check relies on: a version alone in its
        // write set goes as soon as it is superseded.
        let write_set = WriteSet::from_keys(&[&key_of(prepared)[..], b"elsewhere"]).expect("short keys");
        let metadata = StoredMetadata::WriteSet(write_set.clone());
        store.prepare(prepared, metadata.clone(), write_set.clone(), writes.clone(), 0)?;
        let record =
            RecordRef::Prepare { ts: prepared, metadata: &metadata, write_set: &write_set, writes: (&writes).into() };
        durable(log, "P", prepared, record)?;
        store.commit(prepared);
        durable(log, "C", prepared, RecordRef::Commit { ts: prepared })?;
        let writes = vec![(key_of(put), value_of(put))];
        store.put(put, writes.clone(), 0)?;
        durable(log, "U", put, RecordRef::Put { ts: put, writes: (&writes).into() })?;
    }
    Ok(())
}

/// Appends, waits until durable, then prints the line the test trusts.
fn durable(log: &Log, kind: &str, ts: u64, record: RecordRef<'_>) -> Result<(), Failure> {
    let lsn = log.append(0, record)?;
    log.wait_durable(lsn, Duration::from_secs(30))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{kind} {lsn} {ts}")?;
    Ok(out.flush()?)
}
