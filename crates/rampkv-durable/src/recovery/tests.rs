use proptest::prelude::*;

use super::*;
use crate::files::segment_path;
use crate::record::{encode_record, RecordHeader, RecordRef};
use rampkv_core::storage::StoreWrite;

fn frames(range: std::ops::RangeInclusive<Lsn>, synced: impl Fn(Lsn) -> Lsn) -> Vec<u8> {
    let mut bytes = Vec::new();
    for lsn in range {
        let header = RecordHeader { lsn, epoch: 0, synced_lsn: synced(lsn) };
        encode_record(header, RecordRef::Commit { ts: lsn }, &mut bytes).unwrap();
    }
    bytes
}

#[test]
fn the_scan_after_damage_finds_the_records_that_follow_and_what_they_vouch_for() {
    let mut bytes = frames(1..=3, |_| 0);
    let damaged_at = bytes.len();
    bytes.extend_from_slice(&[0xEE; 13]);
    let resumed_at = bytes.len();
    bytes.extend_from_slice(&frames(5..=6, |lsn| lsn - 1));
    let after = scan_after(&bytes, damaged_at, 4);
    assert_eq!(after.records, 2);
    assert_eq!(after.max_synced_lsn, Some(5));
    assert_eq!(after.first, Some((resumed_at, 5)));
    assert_eq!(scan_after(&bytes, resumed_at, 7).records, 0, "records before the damaged LSN do not count");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn arbitrary_bytes_in_a_segment_never_panic_recovery(
        body in prop::collection::vec(any::<u8>(), 0..600), records in 0u64..5,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = FileHeader { lsn: 1, epoch: 0 }.encode(SEGMENT_MAGIC).to_vec();
        bytes.extend_from_slice(&frames(1..=records, |_| 0)[..]);
        bytes.extend_from_slice(&body);
        std::fs::write(segment_path(dir.path(), 1), &bytes).unwrap();
        for truncate_corrupt in [false, true] {
            let options = OpenOptions { truncate_corrupt, ..OpenOptions::default() };
            let store = Store::new(1_000);
            match open(dir.path(), &options, &store) {
                Ok((log, report)) => {
                    // The whole records before the garbage are never dropped.
                    prop_assert!(report.last_lsn >= records, "{report:?}");
                    log.close().unwrap();
                }
                Err(error) => prop_assert!(!truncate_corrupt, "with truncate_corrupt: {error}"),
            }
        }
    }
}

/// Writes segment files by hand: `(first LSN, last LSN, synced_lsn stamp)` each.
fn handmade_segments(dir: &std::path::Path, segments: &[(Lsn, Lsn, Lsn)]) -> Vec<(PathBuf, Vec<usize>)> {
    segments
        .iter()
        .map(|&(first, last, stamp)| {
            let mut bytes = FileHeader { lsn: first, epoch: 0 }.encode(SEGMENT_MAGIC).to_vec();
            let mut starts = Vec::new();
            for lsn in first..=last {
                starts.push(bytes.len());
                let header = RecordHeader { lsn, epoch: 0, synced_lsn: stamp };
                encode_record(header, RecordRef::Commit { ts: lsn }, &mut bytes).unwrap();
            }
            let path = segment_path(dir, first);
            std::fs::write(&path, &bytes).unwrap();
            (path, starts)
        })
        .collect()
}

#[test]
fn damage_in_an_older_segment_is_torn_unless_a_later_record_vouches_for_it() {
    // A power cut under `no` or `everysec` may leave a hole in a closed segment whose
    // background fsync had not finished, while the next segment has data: nothing written
    // after the hole vouches for it (stamps below its LSN), so it is cut with what follows.
    for (later_stamp, torn) in [(4, true), (12, false)] {
        let dir = tempfile::tempdir().unwrap();
        let written = handmade_segments(dir.path(), &[(1, 10, 0), (11, 20, later_stamp)]);
        let (first, starts) = &written[0];
        let mut bytes = std::fs::read(first).unwrap();
        bytes[starts[4] + 4] ^= 0xFF; // the checksum of LSN 5
        std::fs::write(first, &bytes).unwrap();
        let store = Store::new(1_000);
        let result = open(dir.path(), &OpenOptions::default(), &store);
        if torn {
            let (_, report) = result.unwrap();
            assert_eq!(report.last_lsn, 4);
            assert_eq!(report.cuts.len(), 2, "{:?}", report.cuts);
            assert!(matches!(report.cuts[0].reason, CutReason::TornTail(_)));
            assert_eq!((report.cuts[0].offset, report.cuts[0].records_dropped), (starts[4] as u64, 5));
            assert_eq!(report.cuts[1].reason, CutReason::AfterCut);
            assert_eq!((report.cuts[1].first_lsn_dropped, report.cuts[1].records_dropped), (11, 10));
            assert!(!written[1].0.exists());
        } else {
            let error = result.unwrap_err();
            assert!(matches!(error, DurableError::CorruptLog { lsn: 5, .. }), "{error}");
            assert!(written[1].0.exists(), "a refused start changes no file");
        }
    }
}

/// Segment bytes: a header for `first`, then PUTs for `lsns` (a value of 300 bytes in a segment
/// starting at LSN 1, 200 otherwise, so that old and new records never line up), each
/// stamped `synced_lsn` `stamp`; returns the bytes and where each record starts.
fn segment_of_puts(first: Lsn, lsns: std::ops::RangeInclusive<Lsn>, stamp: Lsn) -> (Vec<u8>, Vec<usize>) {
    let value_bytes = if first == 1 { 300 } else { 200 };
    let mut bytes = FileHeader { lsn: first, epoch: 0 }.encode(SEGMENT_MAGIC).to_vec();
    let mut starts = Vec::new();
    for lsn in lsns {
        starts.push(bytes.len());
        let writes: crate::record::Writes =
            vec![StoreWrite::new(Box::from(&b"key"[..]), vec![b'v'; value_bytes].into_boxed_slice())];
        let header = RecordHeader { lsn, epoch: 0, synced_lsn: stamp };
        encode_record(header, RecordRef::Put { ts: lsn << 8, writes: (&writes).into() }, &mut bytes).unwrap();
    }
    (bytes, starts)
}

/// A segment recycled from an older one: `old` (a whole older segment) with the header and
/// records of `new` written over its start, as the log writes over a recycled segment.
fn written_over(old: &[u8], new: &[u8]) -> Vec<u8> {
    let mut bytes = old.to_vec();
    bytes[..new.len()].copy_from_slice(new);
    bytes
}

#[test]
fn a_recycled_segments_older_records_end_the_log_without_a_cut() {
    // Segment 1..=20, then segment 21.. recycled from a copy of it (older records, LSNs 1..=20,
    // after the new ones): the new records are replayed, the old ones are not records of this
    // log and are dropped without a report, whether the new ones end inside an old record or
    // none was written yet (an old record right after the header).
    for new_records in [5u64, 0] {
        let dir = tempfile::tempdir().unwrap();
        let (old, _) = segment_of_puts(1, 1..=20, 0);
        std::fs::write(segment_path(dir.path(), 1), &old).unwrap();
        let (new, _) = segment_of_puts(21, 21..=20 + new_records, 0);
        let recycled = segment_path(dir.path(), 21);
        std::fs::write(&recycled, written_over(&old, &new)).unwrap();
        let store = Store::new(1_000);
        let (log, report) = open(dir.path(), &OpenOptions::default(), &store).unwrap();
        assert_eq!(report.last_lsn, 20 + new_records, "{report:?}");
        assert!(report.cuts.is_empty(), "{:?}", report.cuts);
        if new_records > 0 {
            assert_eq!(std::fs::read(&recycled).unwrap().len(), new.len(), "cut to its own records");
        } // (else the log starts a new segment 21 in its place)
        log.close().unwrap();
    }
}

#[test]
fn a_recycled_segment_still_reports_torn_writes_and_refuses_damage_in_the_middle() {
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = segment_of_puts(1, 1..=20, 0);
    std::fs::write(segment_path(dir.path(), 1), &old).unwrap();
    // Torn: record 26 begun (its header carries LSN 26) and cut short by the old bytes.
    let (new, starts) = segment_of_puts(21, 21..=26, 0);
    let torn = &new[..starts[5] + 60];
    let recycled = segment_path(dir.path(), 21);
    std::fs::write(&recycled, written_over(&old, torn)).unwrap();
    let (log, report) = open(dir.path(), &OpenOptions::default(), &Store::new(1_000)).unwrap();
    assert_eq!(report.last_lsn, 25);
    assert_eq!(report.cuts.len(), 1, "{:?}", report.cuts);
    assert!(matches!(report.cuts[0].reason, CutReason::TornTail(_)));
    assert_eq!(report.cuts[0].offset, starts[5] as u64);
    log.close().unwrap();
    // Damage in the middle: record 23 broken, records after it stamped as written once it was
    // fsynced: corruption, as in a segment that was never recycled.
    let (mut new, starts) = segment_of_puts(21, 21..=25, 24);
    new[starts[2] + 4] ^= 0xFF;
    std::fs::write(&recycled, written_over(&old, &new)).unwrap();
    let error = open(dir.path(), &OpenOptions::default(), &Store::new(1_000)).unwrap_err();
    assert!(matches!(error, DurableError::CorruptLog { lsn: 23, .. }), "{error}");
}

#[test]
fn a_closed_recycled_segment_ends_where_the_next_one_begins() {
    // Rotation leaves the closed segment's tail as it was: old records, then the next segment.
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = segment_of_puts(1, 1..=20, 0);
    std::fs::write(segment_path(dir.path(), 1), &old).unwrap();
    let (new, _) = segment_of_puts(21, 21..=25, 0);
    std::fs::write(segment_path(dir.path(), 21), written_over(&old, &new)).unwrap();
    let (next, _) = segment_of_puts(26, 26..=30, 0);
    std::fs::write(segment_path(dir.path(), 26), &next).unwrap();
    let (log, report) = open(dir.path(), &OpenOptions::default(), &Store::new(1_000)).unwrap();
    assert_eq!((report.last_lsn, report.cuts.len()), (30, 0), "{report:?}");
    log.close().unwrap();
}
