use proptest::prelude::*;

use super::*;
use crate::files::segment_path;
use crate::record::{encode_record, RecordHeader, RecordRef};

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
