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
