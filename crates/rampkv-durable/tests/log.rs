//! The log on its own: group commit, the policies, the watermark and its wake-up, the bound.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{key, options, reopen, test_dir};
use rampkv_core::storage::Key;
use rampkv_durable::{DurableError, FsyncPolicy, OpenOptions, RecordRef};

const WAIT: Duration = Duration::from_secs(30);

fn put_writes(ts: u64) -> Vec<(Key, Box<[u8]>)> {
    vec![(key(&format!("k{ts}")), format!("value of {ts}").into_bytes().into())]
}

#[test]
fn concurrent_appenders_share_fsyncs_and_every_acknowledged_record_survives_a_reopen() {
    // Eight appenders each append a PUT and wait for it to be durable, 200 times, released
    // together each round: the writer fsyncs once per group, so far fewer fsyncs than records.
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 200;
    let dir = test_dir();
    let (log, _, _) = reopen(dir.path(), &options(FsyncPolicy::Always));
    let log = Arc::new(log);
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let appenders: Vec<_> = (1..=THREADS)
        .map(|thread| {
            let (log, barrier) = (Arc::clone(&log), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait();
                    let ts = round << 16 | thread;
                    let lsn = log.append(0, RecordRef::Put { ts, writes: (&put_writes(ts)).into() }).unwrap();
                    log.wait_durable(lsn, WAIT).unwrap();
                    assert!(log.durable_lsn() >= lsn);
                    acknowledged.push((lsn, ts));
                }
                acknowledged
            })
        })
        .collect();
    let acknowledged: Vec<(u64, u64)> = appenders.into_iter().flat_map(|appender| appender.join().unwrap()).collect();
    let stats = log.stats();
    println!(
        "{} records, {} fsyncs, mean group {:.2} records",
        stats.records,
        stats.fsyncs,
        stats.mean_group_records()
    );
    assert_eq!(stats.records, THREADS * ROUNDS);
    assert!(stats.fsyncs * 2 <= stats.records, "group commit shares fsyncs: {stats:?}");
    Arc::into_inner(log).unwrap().close().unwrap();
    let (_, store, report) = reopen(dir.path(), &options(FsyncPolicy::Always));
    assert_eq!(report.records_replayed, THREADS * ROUNDS);
    assert_eq!(report.last_lsn, THREADS * ROUNDS);
    for (_, ts) in acknowledged {
        let version = store.get_latest(&key(&format!("k{ts}"))).expect("an acknowledged PUT is there");
        assert_eq!(version.ts, ts);
    }
}

#[test]
fn every_policy_makes_records_durable_and_a_clean_close_keeps_them_all() {
    for policy in [FsyncPolicy::Always, FsyncPolicy::Everysec, FsyncPolicy::No] {
        let dir = test_dir();
        let (log, _, _) = reopen(dir.path(), &options(policy));
        let mut last = 0;
        for ts in 1..=500 {
            last = log.append(3, RecordRef::Put { ts, writes: (&put_writes(ts)).into() }).unwrap();
        }
        log.wait_durable(last, WAIT).unwrap();
        assert_eq!(log.durable_lsn(), 500, "{policy}");
        log.close().unwrap();
        let (log, store, report) = reopen(dir.path(), &options(policy));
        assert_eq!((report.records_replayed, report.last_lsn, report.last_epoch), (500, 500, 3), "{policy}");
        assert_eq!(store.stats().keys, 500);
        assert_eq!(log.last_lsn(), 500, "the log resumes after the last record");
        assert_eq!(log.append(3, RecordRef::Commit { ts: 9 }).unwrap(), 501);
    }
}

#[test]
fn everysec_fsyncs_written_records_within_about_a_second_without_new_appends() {
    let dir = test_dir();
    let (log, _, _) = reopen(dir.path(), &options(FsyncPolicy::Everysec));
    let lsn = log.append(0, RecordRef::Put { ts: 1, writes: (&put_writes(1)).into() }).unwrap();
    log.wait_durable(lsn, WAIT).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while log.stats().fsyncs == 0 {
        assert!(std::time::Instant::now() < deadline, "no fsync came");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_wake_callback_sees_the_watermark_advance() {
    let dir = test_dir();
    let (log, _, _) = reopen(dir.path(), &options(FsyncPolicy::Always));
    let seen = Arc::new(AtomicU64::new(0));
    let seen_by_callback = Arc::clone(&seen);
    log.set_wake(move |lsn| {
        seen_by_callback.fetch_max(lsn, Ordering::AcqRel);
    });
    let mut last = 0;
    for ts in 1..=50 {
        last = log.append(0, RecordRef::Commit { ts }).unwrap();
    }
    log.wait_durable(last, WAIT).unwrap();
    // The callback runs right after the waiters are woken; give it a moment.
    let deadline = std::time::Instant::now() + WAIT;
    while seen.load(Ordering::Acquire) < last {
        assert!(std::time::Instant::now() < deadline, "the callback never saw {last}");
        std::thread::yield_now();
    }
}

#[test]
fn waiting_for_an_lsn_never_appended_is_an_error_not_a_hang() {
    let dir = test_dir();
    let (log, _, _) = reopen(dir.path(), &options(FsyncPolicy::Always));
    assert!(matches!(log.wait_durable(1, WAIT), Err(DurableError::NotAppended { lsn: 1, last_lsn: 0 })));
    assert!(matches!(log.append(0, RecordRef::Commit { ts: 0 }), Err(DurableError::InvalidRecord(_))));
    assert_eq!(log.last_lsn(), 0, "a refused record takes no LSN");
}

#[test]
fn a_full_log_refuses_appends_and_append_timeout_makes_room() {
    // A 4 KiB bound: appends of 1 KiB values never flushed fill it; append_timeout writes them.
    let dir = test_dir();
    let options = OpenOptions { waiting_bytes_max: 4096, ..options(FsyncPolicy::Always) };
    let (log, _, _) = reopen(dir.path(), &options);
    let value: Box<[u8]> = vec![7u8; 1024].into();
    let mut refused = 0;
    let mut appended = Vec::new();
    for ts in 1..=2_000u64 {
        let writes = vec![(key(&format!("k{ts}")), value.clone())];
        match log.append(0, RecordRef::Put { ts, writes: (&writes).into() }) {
            Ok(lsn) => appended.push(lsn),
            Err(DurableError::LogFull { waiting_bytes, max }) => {
                assert!(waiting_bytes <= max);
                refused += 1;
                let lsn = log.append_timeout(0, RecordRef::Put { ts, writes: (&writes).into() }, WAIT).unwrap();
                appended.push(lsn);
            }
            Err(other) => panic!("{other}"),
        }
    }
    println!("{refused} appends found the log full");
    assert!(refused > 0, "2,000 KiB appended at once never filled a 4 KiB queue");
    assert!(appended.windows(2).all(|pair| pair[1] == pair[0] + 1), "consecutive LSNs");
    log.close().unwrap();
    let (_, store, _) = reopen(dir.path(), &options);
    assert_eq!(store.stats().keys, 2_000);
}

#[test]
fn segments_rotate_and_a_reopen_reads_them_all_in_order() {
    let dir = test_dir();
    let options = OpenOptions { segment_bytes_target: 4096, ..options(FsyncPolicy::No) };
    let (log, _, _) = reopen(dir.path(), &options);
    for ts in 1..=1_000 {
        // One group per record (a segment is closed only between groups).
        let lsn = log.append(0, RecordRef::Put { ts, writes: (&put_writes(ts)).into() }).unwrap();
        log.wait_durable(lsn, WAIT).unwrap();
    }
    log.close().unwrap();
    let segments = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|entry| entry.as_ref().unwrap().file_name().to_string_lossy().starts_with("segment-"))
        .count();
    assert!(segments > 5, "{segments} segments");
    let (_, store, report) = reopen(dir.path(), &options);
    assert_eq!(report.records_replayed, 1_000);
    assert_eq!(store.get_latest(b"k1000").unwrap().ts, 1_000);
}

#[test]
fn closed_segments_are_fsynced_in_the_background_even_with_policy_no() {
    let dir = test_dir();
    let options = OpenOptions { segment_bytes_target: 4096, ..options(FsyncPolicy::No) };
    let (log, _, _) = reopen(dir.path(), &options);
    for ts in 1..=200 {
        let lsn = log.append(0, RecordRef::Put { ts, writes: (&put_writes(ts)).into() }).unwrap();
        log.wait_durable(lsn, WAIT).unwrap();
    }
    let deadline = std::time::Instant::now() + WAIT;
    while log.stats().fsyncs == 0 {
        assert!(std::time::Instant::now() < deadline, "no closed segment was fsynced");
        std::thread::sleep(Duration::from_millis(10));
    }
    log.close().unwrap();
}

/// Segments are allocated (reading as zeros) before they take records (the preparer allocates the next one while the
/// current one is used; the first one is filled at the start): a copy of the directory taken
/// while the log runs (what a kill -9 leaves) holds segments with zeros after their records,
/// and a start from it reads every record, reports no cut (zeros are not damage), and leaves
/// the last segment exactly its records. A clean close leaves no zeros and no prepared file.
#[test]
fn segments_are_allocated_beforehand_and_their_zeros_end_the_log_at_a_start() {
    const TARGET: u64 = 64 * 1024;
    let dir = test_dir();
    let options = OpenOptions { segment_bytes_target: TARGET, ..options(FsyncPolicy::Always) };
    let (log, _, _) = reopen(dir.path(), &options);
    let prepared = dir.path().join("segment-next.log.tmp");
    let mut ts = 0;
    let mut put = |log: &rampkv_durable::Log| {
        ts += 1;
        let lsn = log.append(0, RecordRef::Put { ts, writes: (&put_writes(ts)).into() }).unwrap();
        log.wait_durable(lsn, WAIT).unwrap();
    };
    // Three segments, waiting each time for the next one to be prepared before the current
    // one is used up (else the log goes on in a segment created empty: tested below too).
    for _ in 0..3 {
        let before = segments(dir.path()).len();
        let deadline = std::time::Instant::now() + WAIT;
        while !prepared.exists() || std::fs::metadata(&prepared).unwrap().len() < TARGET {
            assert!(std::time::Instant::now() < deadline, "no segment was prepared");
            put(&log);
            std::thread::sleep(Duration::from_millis(1));
        }
        while segments(dir.path()).len() == before {
            put(&log);
        }
    }
    let files = segments(dir.path());
    let newest = files.last().unwrap();
    let length = std::fs::metadata(newest).unwrap().len();
    assert_eq!(length, TARGET, "the newest segment was allocated to the target");
    let crash = test_dir();
    for file in &files {
        std::fs::copy(file, crash.path().join(file.file_name().unwrap())).unwrap();
    }
    let written = log.last_lsn();
    let (_, store, report) = reopen(crash.path(), &options);
    assert!(report.cuts.is_empty(), "zeros are not damage: {:?}", report.cuts);
    assert_eq!(report.last_lsn, written);
    assert_eq!(store.get_latest(format!("k{written}").as_bytes()).unwrap().ts, written);
    let copied = crash.path().join(newest.file_name().unwrap());
    assert!(std::fs::metadata(&copied).unwrap().len() < TARGET, "the zeros were dropped at the start");
    log.close().unwrap();
    assert!(!prepared.exists(), "an unused prepared segment is removed at close");
    let last = segments(dir.path()).pop().unwrap();
    let bytes = std::fs::read(&last).unwrap();
    assert!(bytes.len() < TARGET as usize && bytes[bytes.len() - 8..].iter().any(|&byte| byte != 0));
    let (_, store, report) = reopen(dir.path(), &options);
    assert!(report.cuts.is_empty(), "{:?}", report.cuts);
    assert_eq!(store.get_latest(format!("k{written}").as_bytes()).unwrap().ts, written);
}

fn segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .collect();
    segments.sort();
    segments
}
