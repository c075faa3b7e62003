//! Recovery from damaged logs: torn tails at every kind of offset, corruption in the middle,
//! damaged or missing segments, the lock, and the transactions left in doubt.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{key, options, reopen, seed, test_dir};
use rampkv_core::storage::{Store, StoredMetadata};
use rampkv_core::wire::WriteSet;
use rampkv_durable::record::check_frame;
use rampkv_durable::{open, CutReason, DurableError, FsyncPolicy, OpenOptions, RecordRef};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const WAIT: Duration = Duration::from_secs(30);

/// Writes PUTs with timestamps 1..=count, each waited for (so each is its own group and, with
/// `always`, each vouches for the ones before it), and returns the segment files.
fn write_puts(dir: &Path, options: &OpenOptions, count: u64) -> Vec<PathBuf> {
    let (log, _, _) = reopen(dir, options);
    for ts in 1..=count {
        let value = format!("value {ts} ").repeat(1 + ts as usize % 7);
        let writes = vec![(key(&format!("k{}", ts % 10)), value.into_bytes().into())];
        let lsn = log.append(0, RecordRef::Put { ts, writes: (&writes).into() }).unwrap();
        log.wait_durable(lsn, WAIT).unwrap();
    }
    log.close().unwrap();
    segments(dir)
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with("segment-"))
        .collect();
    segments.sort();
    segments
}

/// The byte offset where each record of a segment starts, and the file length.
fn record_offsets(segment: &Path) -> (Vec<u64>, u64) {
    let bytes = std::fs::read(segment).unwrap();
    let mut offsets = Vec::new();
    let mut offset = 32;
    while offset < bytes.len() {
        offsets.push(offset as u64);
        offset += check_frame(&bytes[offset..]).unwrap().len();
    }
    (offsets, bytes.len() as u64)
}

/// Which of the PUTs 1..=count the store holds (they must be a prefix).
fn puts_present(store: &Store, count: u64) -> u64 {
    let present: Vec<bool> = (1..=count).map(|ts| store.get_at(&key(&format!("k{}", ts % 10)), ts).is_ok()).collect();
    let prefix = present.iter().take_while(|&&here| here).count();
    assert!(present[prefix..].iter().all(|&here| !here), "the records kept are not a prefix: {present:?}");
    prefix as u64
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

#[test]
fn a_log_cut_at_a_random_byte_keeps_every_whole_record_before_the_cut_and_reports_the_rest() {
    let seed = seed("torn tail");
    let mut random = SmallRng::seed_from_u64(seed);
    let original = test_dir();
    let options = options(FsyncPolicy::Always);
    const COUNT: u64 = 120;
    let segment = write_puts(original.path(), &options, COUNT).pop().unwrap();
    let (starts, length) = record_offsets(&segment);
    for attempt in 0..40 {
        let cut = random.gen_range(32..=length);
        let dir = test_dir();
        copy_dir(original.path(), dir.path());
        let copy = dir.path().join(segment.file_name().unwrap());
        std::fs::OpenOptions::new().write(true).open(&copy).unwrap().set_len(cut).unwrap();
        // Record i is whole when it ends (where the next starts, or at the end) by the cut.
        let ends = starts[1..].iter().copied().chain([length]);
        let whole = ends.filter(|&end| end <= cut).count() as u64;
        let (log, store, report) = reopen(dir.path(), &options);
        assert_eq!(puts_present(&store, COUNT), whole, "attempt {attempt}: cut at {cut}");
        assert_eq!(report.last_lsn, whole);
        let record_start = starts.get(whole as usize).copied();
        match record_start {
            Some(start) if start < cut => {
                assert_eq!(report.cuts.len(), 1, "attempt {attempt}: cut at {cut}: {:?}", report.cuts);
                let reported = &report.cuts[0];
                assert_eq!((reported.file.as_path(), reported.offset), (copy.as_path(), start));
                assert_eq!(reported.bytes_dropped, cut - start);
                assert_eq!(reported.first_lsn_dropped, whole + 1);
                assert!(matches!(reported.reason, CutReason::TornTail(_)));
            }
            _ => assert!(report.cuts.is_empty(), "a cut on a record boundary drops nothing: {:?}", report.cuts),
        }
        // The log goes on after the cut, and the next start finds it whole.
        let lsn = log.append(0, RecordRef::Commit { ts: 99_999 }).unwrap();
        assert_eq!(lsn, whole + 1);
        log.close().unwrap();
        let (_, _, again) = reopen(dir.path(), &options);
        assert!(again.cuts.is_empty(), "{:?}", again.cuts);
        assert_eq!(again.last_lsn, whole + 1);
    }
}

/// Garbage after the last record (also when zeros follow it) is a torn write: cut and
/// reported. Zeros after it are what a
/// allocated segment holds where no record was written yet: the end of the log, dropped from
/// the file without a report (no record is lost).
#[test]
fn garbage_after_the_last_record_is_cut_and_reported_and_zeros_end_the_log() {
    let seed = seed("garbage tail");
    let mut random = SmallRng::seed_from_u64(seed);
    let options = options(FsyncPolicy::Always);
    let garbage: Vec<u8> = (0..3000).map(|_| random.gen()).collect();
    // A group torn in a allocated segment: its first bytes written, zeros after them.
    let torn_in_zeros: Vec<u8> = garbage[..100].iter().copied().chain(std::iter::repeat_n(0, 8192)).collect();
    for tail in [vec![0u8; 4096], garbage, torn_in_zeros] {
        let zeros = tail.iter().all(|&byte| byte == 0);
        let dir = test_dir();
        let segment = write_puts(dir.path(), &options, 30).pop().unwrap();
        let length = std::fs::metadata(&segment).unwrap().len();
        let mut bytes = std::fs::read(&segment).unwrap();
        bytes.extend_from_slice(&tail);
        std::fs::write(&segment, bytes).unwrap();
        let (_, store, report) = reopen(dir.path(), &options);
        assert_eq!(puts_present(&store, 30), 30);
        if zeros {
            assert!(report.cuts.is_empty(), "{:?}", report.cuts);
        } else {
            assert_eq!(report.cuts.len(), 1);
            assert_eq!((report.cuts[0].offset, report.cuts[0].bytes_dropped), (length, tail.len() as u64));
        }
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), length, "the file was truncated");
    }
}

#[test]
fn damage_in_the_middle_is_an_error_naming_file_and_offset_unless_truncation_is_asked() {
    let options = options(FsyncPolicy::Always);
    let dir = test_dir();
    let segment = write_puts(dir.path(), &options, 50).pop().unwrap();
    let (starts, _) = record_offsets(&segment);
    let damaged = starts[20] + 45; // inside the payload of the record with LSN 21
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[damaged as usize] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();
    let store = Store::new(1_000);
    match open(dir.path(), &options, &store) {
        Err(error @ DurableError::CorruptLog { .. }) => {
            let DurableError::CorruptLog { file, offset, lsn, .. } = &error else { unreachable!() };
            assert_eq!((file.as_path(), *offset, *lsn), (segment.as_path(), starts[20], 21));
            let message = error.to_string();
            assert!(message.contains(&segment.display().to_string()) && message.contains(&starts[20].to_string()));
            println!("{message}");
        }
        other => panic!("expected CorruptLog, got {other:?}"),
    }
    assert_eq!(std::fs::read(&segment).unwrap(), bytes, "a refused start changes no file");
    let truncating = OpenOptions { truncate_corrupt: true, ..options.clone() };
    let (log, store, report) = reopen(dir.path(), &truncating);
    assert_eq!(puts_present(&store, 50), 20);
    assert_eq!(report.cuts.len(), 1);
    let cut = &report.cuts[0];
    assert_eq!((cut.offset, cut.records_dropped, cut.first_lsn_dropped), (starts[20], 29, 21));
    assert!(matches!(cut.reason, CutReason::Corrupt(_)));
    log.close().unwrap();
    let (_, _, again) = reopen(dir.path(), &options);
    assert!(again.cuts.is_empty());
}

#[test]
fn damage_in_the_last_record_cannot_be_told_from_a_torn_write_and_is_cut() {
    // No later record vouches for it (module docs of recovery.rs: the limit).
    let options = options(FsyncPolicy::Always);
    let dir = test_dir();
    let segment = write_puts(dir.path(), &options, 10).pop().unwrap();
    let (starts, _) = record_offsets(&segment);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[starts[9] as usize + 44] ^= 1;
    std::fs::write(&segment, &bytes).unwrap();
    let (_, store, report) = reopen(dir.path(), &options);
    assert_eq!(puts_present(&store, 10), 9);
    assert!(matches!(report.cuts[0].reason, CutReason::TornTail(_)));
}

#[test]
fn a_damaged_segment_in_the_middle_or_a_missing_one_is_an_error_and_a_torn_new_segment_is_removed() {
    let options = OpenOptions { segment_bytes_target: 2048, ..options(FsyncPolicy::Always) };
    let original = test_dir();
    let segments = write_puts(original.path(), &options, 200);
    assert!(segments.len() >= 4, "{} segments", segments.len());
    let name = |index: usize| segments[index].file_name().unwrap().to_owned();

    // A damaged header in the middle.
    let dir = test_dir();
    copy_dir(original.path(), dir.path());
    let middle = dir.path().join(name(1));
    let mut bytes = std::fs::read(&middle).unwrap();
    bytes[20] ^= 0xFF;
    std::fs::write(&middle, &bytes).unwrap();
    let result = open(dir.path(), &options, &Store::new(1_000));
    assert!(matches!(result, Err(DurableError::BadSegmentHeader { ref file, .. }) if *file == middle), "{result:?}");
    let truncating = OpenOptions { truncate_corrupt: true, ..options.clone() };
    let (_, store, report) = reopen(dir.path(), &truncating);
    let kept = puts_present(&store, 200);
    assert!(kept > 0 && kept < 200);
    assert!(matches!(report.cuts[0].reason, CutReason::CorruptSegmentHeader(_)));
    assert!(report.cuts[1..].iter().all(|cut| cut.reason == CutReason::AfterCut));
    assert_eq!(report.cuts.len(), segments.len() - 1);

    // A missing segment.
    let dir = test_dir();
    copy_dir(original.path(), dir.path());
    std::fs::remove_file(dir.path().join(name(2))).unwrap();
    let result = open(dir.path(), &options, &Store::new(1_000));
    assert!(matches!(result, Err(DurableError::MissingRecords { .. })), "{result:?}");
    println!("{}", result.unwrap_err());

    // A segment whose creation a crash interrupted (a few bytes of header, nothing more).
    let dir = test_dir();
    copy_dir(original.path(), dir.path());
    let torn = dir.path().join("segment-00000000000000000201.log");
    std::fs::write(&torn, b"RKVLOG").unwrap();
    let (_, store, report) = reopen(dir.path(), &options);
    assert_eq!(puts_present(&store, 200), 200);
    assert!(matches!(report.cuts[0].reason, CutReason::TornSegmentHeader(_)));
}

#[test]
fn a_directory_is_held_by_one_log_at_a_time() {
    let dir = test_dir();
    let options = options(FsyncPolicy::Always);
    let (log, _, _) = reopen(dir.path(), &options);
    let error = open(dir.path(), &options, &Store::new(1_000)).unwrap_err();
    assert!(matches!(&error, DurableError::Locked { dir: named, holder_pid: Some(pid) }
        if named == dir.path() && *pid == std::process::id()));
    println!("{error}");
    assert!(error.to_string().contains(&dir.path().display().to_string()));
    log.close().unwrap();
    reopen(dir.path(), &options);
}

#[test]
fn open_needs_an_empty_store() {
    let dir = test_dir();
    let store = Store::new(1_000);
    store.put(1, vec![(key("a"), Box::from(&b"x"[..]))], 0).unwrap();
    assert!(matches!(open(dir.path(), &options(FsyncPolicy::Always), &store), Err(DurableError::StoreNotEmpty)));
}

#[test]
fn transactions_prepared_and_never_decided_are_reported_in_doubt() {
    let dir = test_dir();
    let options = options(FsyncPolicy::Always);
    let (log, store, _) = reopen(dir.path(), &options);
    let write_set = WriteSet::from_keys(&[key("a"), key("b"), key("elsewhere")]).unwrap();
    for ts in [10, 20, 30] {
        let writes = vec![(key("a"), Box::from(&b"1"[..])), (key("b"), Box::from(&b"2"[..]))];
        let metadata = StoredMetadata::None;
        store.prepare(ts, metadata.clone(), write_set.clone(), writes.clone(), 0).unwrap();
        log.append(0, RecordRef::Prepare { ts, metadata: &metadata, write_set: &write_set, writes: (&writes).into() })
            .unwrap();
    }
    store.commit(10);
    log.append(0, RecordRef::Commit { ts: 10 }).unwrap();
    store.abort(20, 0);
    log.append(0, RecordRef::Abort { ts: 20 }).unwrap();
    log.close().unwrap();
    let (_, recovered, report) = reopen(dir.path(), &options);
    assert_eq!(report.in_doubt.len(), 1);
    let in_doubt = &report.in_doubt[0];
    assert_eq!(in_doubt.ts, 30);
    let mut keys = in_doubt.keys.clone();
    keys.sort();
    assert_eq!(keys, [key("a"), key("b")]);
    assert_eq!(in_doubt.write_set, write_set);
    assert_eq!(recovered.get_latest(b"a").unwrap().ts, 10);
    assert!(recovered.get_at(b"a", 20).is_err());
    common::assert_same_store(&store, &recovered);
}
