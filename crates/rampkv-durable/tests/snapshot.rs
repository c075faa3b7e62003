//! Snapshots with the log: taken while writers run, loaded at start, fallen back from when
//! damaged, and what they let the directory drop.

mod common;

use std::sync::Arc;

use common::{assert_same_store, options, reopen, seed, test_dir, Workload};
use rampkv_core::storage::Store;
use rampkv_durable::{CutReason, DurableError, FsyncPolicy, OpenOptions};

fn files(dir: &std::path::Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(prefix))
        .collect();
    names.sort();
    names
}

#[test]
fn snapshots_taken_while_writers_run_plus_the_log_after_them_rebuild_the_live_store() {
    let seed = seed("snapshot under writers");
    let dir = test_dir();
    let options = OpenOptions { segment_bytes_target: 32 * 1024, ..options(FsyncPolicy::No) };
    let (log, store, _) = reopen(dir.path(), &options);
    let (log, store) = (Arc::new(log), Arc::new(store));
    let writers: Vec<_> = (1..=3u16)
        .map(|writer| {
            let (log, store) = (Arc::clone(&log), Arc::clone(&store));
            std::thread::spawn(move || {
                let mut workload = Workload::new(seed, writer, 40);
                for _ in 0..6_000 {
                    workload.step(&store, &log);
                }
            })
        })
        .collect();
    let mut reports = Vec::new();
    let mut concurrent = 0;
    while writers.iter().any(|writer| !writer.is_finished()) && reports.len() < 50 {
        let job = log.snapshot_in_background(Arc::clone(&store), |store| store).unwrap();
        assert!(matches!(log.write_snapshot(&store), Err(DurableError::SnapshotInProgress)));
        let report = job.join().unwrap();
        concurrent += usize::from(writers.iter().any(|writer| !writer.is_finished()));
        reports.push(report);
    }
    for writer in writers {
        writer.join().unwrap();
    }
    println!(
        "{} snapshots ({concurrent} ended while writers ran), LSNs {:?}, {} files dropped",
        reports.len(),
        reports.iter().map(|report| report.lsn).collect::<Vec<_>>(),
        reports.iter().map(|report| report.dropped.len()).sum::<usize>()
    );
    assert!(concurrent >= 1, "no snapshot overlapped the writers");
    let last_lsn = log.last_lsn();
    Arc::into_inner(log).unwrap().close().unwrap();
    let (_, recovered, report) = reopen(dir.path(), &options);
    let loaded = report.snapshot.as_ref().expect("a snapshot was loaded");
    assert_eq!(loaded.lsn, reports.last().unwrap().lsn);
    assert_eq!(report.last_lsn, last_lsn);
    assert!(report.skipped_snapshots.is_empty() && report.cuts.is_empty());
    println!(
        "loaded {:?}; replayed {}, covered {}, refused {}",
        loaded.counts, report.records_replayed, report.records_covered, report.records_refused
    );
    assert_same_store(&store, &recovered);
}

/// A single writer's store, log and snapshots, for the tests below: `rounds` rounds of 300
/// changes, each followed by a snapshot.
fn build(dir: &std::path::Path, options: &OpenOptions, seed: u64, rounds: usize) -> (Store, Vec<u64>) {
    let (log, store, _) = reopen(dir, options);
    let mut workload = Workload::new(seed, 1, 30);
    let mut snapshot_lsns = Vec::new();
    for _ in 0..rounds {
        for _ in 0..300 {
            workload.step(&store, &log);
        }
        snapshot_lsns.push(log.write_snapshot(&store).unwrap().lsn);
    }
    for _ in 0..300 {
        workload.step(&store, &log);
    }
    log.close().unwrap();
    (store, snapshot_lsns)
}

#[test]
fn a_damaged_newest_snapshot_is_skipped_for_the_one_before_it_and_the_log_after_that() {
    let seed = seed("damaged snapshot");
    let options = OpenOptions { segment_bytes_target: 16 * 1024, ..options(FsyncPolicy::Always) };
    for damage in ["flip", "truncate"] {
        let dir = test_dir();
        let (live, snapshot_lsns) = build(dir.path(), &options, seed, 3);
        let snapshots = files(dir.path(), "snapshot-");
        assert_eq!(snapshots.len(), 2, "two kept: {snapshots:?}");
        let newest = dir.path().join(&snapshots[1]);
        let mut bytes = std::fs::read(&newest).unwrap();
        match damage {
            "flip" => {
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0x08;
            }
            _ => bytes.truncate(bytes.len() - 5),
        }
        std::fs::write(&newest, &bytes).unwrap();
        let (_, recovered, report) = reopen(dir.path(), &options);
        assert_eq!(report.skipped_snapshots.len(), 1, "{damage}");
        let skipped = &report.skipped_snapshots[0];
        assert_eq!(skipped.path, newest);
        assert!(matches!(skipped.error, DurableError::CorruptSnapshot { .. }), "{damage}: {}", skipped.error);
        println!("{damage}: {}", skipped.error);
        assert_eq!(report.snapshot.as_ref().unwrap().lsn, snapshot_lsns[1], "the one before the newest");
        assert_same_store(&live, &recovered);
    }
}

#[test]
fn old_snapshots_and_the_segments_the_oldest_kept_snapshot_covers_are_dropped() {
    let seed = seed("snapshot retention");
    let dir = test_dir();
    let options = OpenOptions { segment_bytes_target: 8 * 1024, ..options(FsyncPolicy::No) };
    let (live, snapshot_lsns) = build(dir.path(), &options, seed, 4);
    let snapshots = files(dir.path(), "snapshot-");
    assert_eq!(
        snapshots,
        [format!("snapshot-{:020}.snap", snapshot_lsns[2]), format!("snapshot-{:020}.snap", snapshot_lsns[3])]
    );
    let first_segment: u64 = files(dir.path(), "segment-")[0][8..28].parse().unwrap();
    assert!(first_segment > 1, "early segments were dropped");
    assert!(first_segment <= snapshot_lsns[2] + 1, "the log after the oldest kept snapshot is whole");
    // Both the newest snapshot and the older one (if the newest were lost) recover the store.
    let (_, recovered, _) = reopen(dir.path(), &options);
    assert_same_store(&live, &recovered);
    std::fs::remove_file(dir.path().join(&snapshots[1])).unwrap();
    let (_, recovered, report) = reopen(dir.path(), &options);
    assert_eq!(report.snapshot.unwrap().lsn, snapshot_lsns[2]);
    assert_same_store(&live, &recovered);
}

#[test]
fn a_snapshot_half_written_by_a_crash_is_removed_at_start() {
    let dir = test_dir();
    let (live, _) = build(dir.path(), &options(FsyncPolicy::No), 7, 1);
    let leftover = dir.path().join("snapshot-00000000000000099999.snap.tmp");
    std::fs::write(&leftover, b"RKVSNAP\0 and then the crash").unwrap();
    let (_, recovered, report) = reopen(dir.path(), &options(FsyncPolicy::No));
    assert_eq!(report.removed_temporaries, std::slice::from_ref(&leftover));
    assert!(!leftover.exists());
    assert_same_store(&live, &recovered);
}

#[test]
fn a_log_that_ends_before_its_snapshot_resumes_after_the_snapshot() {
    // A power cut under `everysec` or `no` can lose log records that a snapshot (fsynced)
    // already holds: the log then resumes after the snapshot, and the next start accepts the
    // jump because the snapshot covers it.
    let seed = seed("log shorter than snapshot");
    let dir = test_dir();
    let options = options(FsyncPolicy::No);
    let (log, store, _) = reopen(dir.path(), &options);
    let mut workload = Workload::new(seed, 1, 30);
    for _ in 0..400 {
        workload.step(&store, &log);
    }
    let snapshot = log.write_snapshot(&store).unwrap();
    log.close().unwrap();
    let segment = dir.path().join(files(dir.path(), "segment-").last().unwrap());
    let length = std::fs::metadata(&segment).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&segment).unwrap().set_len(length / 2).unwrap();
    let (log, recovered, report) = reopen(dir.path(), &options);
    assert_eq!(report.last_lsn, snapshot.lsn);
    assert!(report.cuts.iter().all(|cut| matches!(cut.reason, CutReason::TornTail(_))));
    assert_same_store(&store, &recovered);
    for _ in 0..200 {
        workload.step(&recovered, &log);
    }
    assert!(log.last_lsn() > snapshot.lsn);
    log.close().unwrap();
    let (_, again, report) = reopen(dir.path(), &options);
    assert!(report.cuts.is_empty());
    assert_same_store(&recovered, &again);
}

#[test]
fn a_covered_segment_becomes_a_later_one_and_a_kill_after_that_loses_nothing() {
    // Segments of 8 KiB and a snapshot every 300 changes: the segments a snapshot covers go,
    // one of them kept for reuse, and the log makes later segments of it (older records after
    // their own). A crash (the log never closed) after the log moved past such a segment
    // loses no record. (Whether the closed segment kept older bytes after its own depends on
    // where its last group ended; recovery/tests.rs pins the rule for those bytes.)
    let seed = seed("segment recycling");
    let dir = test_dir();
    let options = OpenOptions { segment_bytes_target: 8 * 1024, ..options(FsyncPolicy::Always) };
    let (log, store, _) = reopen(dir.path(), &options);
    let mut workload = Workload::new(seed, 1, 30);
    for _ in 0..4 {
        for _ in 0..300 {
            workload.step(&store, &log);
        }
        log.write_snapshot(&store).unwrap();
    }
    // On until the log moves to a recycled segment, then one record into it.
    let recycled = log.stats().segments_recycled;
    for _ in 0..20_000 {
        if log.stats().segments_recycled > recycled {
            break;
        }
        workload.step(&store, &log);
        if log.stats().bytes % (4 * 1024) < 200 {
            log.write_snapshot(&store).unwrap();
        }
    }
    assert!(log.stats().segments_recycled > recycled, "no segment was recycled: {:?}", log.stats());
    // On until the log moved past it (closed as it was, older records after its own), then
    // one record into the next segment.
    let newest = || files(dir.path(), "segment-0").pop().expect("a segment");
    let recycled_segment = newest();
    for _ in 0..20_000 {
        if newest() != recycled_segment {
            break;
        }
        workload.step(&store, &log);
    }
    assert_ne!(newest(), recycled_segment, "the log never moved past the recycled segment");
    workload.step(&store, &log);
    // As a kill: the files as they are while the log runs (nothing closed, nothing cut).
    let copy = test_dir();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let name = entry.unwrap().file_name();
        if name != "LOCK" {
            std::fs::copy(dir.path().join(&name), copy.path().join(&name)).unwrap();
        }
    }
    let (_, recovered, report) = reopen(copy.path(), &options);
    // No record is cut (at most one report: the newest segment's tail, cut as a torn write is
    // when the writer stopped inside an older record's bytes and no whole one follows).
    assert!(report.cuts.len() <= 1 && report.cuts.iter().all(|cut| cut.records_dropped == 0), "{:?}", report.cuts);
    assert_same_store(&store, &recovered);
    log.close().unwrap();
}
