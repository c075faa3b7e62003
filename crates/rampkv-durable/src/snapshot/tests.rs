use proptest::prelude::*;

use super::*;
use rampkv_core::storage::StoreError;

fn key(text: &str) -> Key {
    text.as_bytes().into()
}

/// A store with committed, superseded, prepared and aborted state.
fn sample_store() -> Store {
    let store = Store::new(1_000_000);
    let write_set = WriteSet::from_keys(&[key("a"), key("b")]).unwrap();
    for ts in 1..=20u64 {
        let writes = vec![(key("a"), vec![ts as u8; ts as usize].into()), (key("b"), Box::from(&b"b"[..]))];
        let metadata = match ts % 3 {
            0 => StoredMetadata::WriteSet(write_set.clone()),
            1 => StoredMetadata::Bloom(Arc::from(&[ts as u8; 4][..])),
            _ => StoredMetadata::None,
        };
        store.prepare(ts, metadata, write_set.clone(), writes, 0).unwrap();
        match ts % 4 {
            0 => {}
            1 => store.abort(ts, 0),
            _ => {
                store.commit(ts);
            }
        }
    }
    store
}

fn written(store: &Store) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let report = write(dir.path(), store, 77, 5).unwrap();
    assert_eq!(report.path, snapshot_path(dir.path(), 77));
    (dir, report.path)
}

/// A file snapshot gives back every key's newest committed version, every prepared version
/// (its transaction pending), lastCommit and the aborted transactions; the committed versions
/// the newest supersedes are left out as collected (a `HIGHEST_OF` read that could need one
/// refuses rather than answer below it).
#[test]
fn a_snapshot_loads_back_what_was_written() {
    let store = sample_store();
    let (_dir, path) = written(&store);
    let loaded_into = Store::new(1_000_000);
    let loaded = load(&path, &loaded_into, 0).unwrap();
    assert_eq!((loaded.lsn, loaded.epoch), (77, 5));
    assert_eq!(loaded.counts.keys, 2);
    assert_eq!(loaded_into.stale_pending(u64::MAX).len(), 5);
    let newest = store.last_commit(b"a");
    assert_eq!(newest, 19);
    for ts in 1..=20u64 {
        let original = store.get_at(b"a", ts).map(|version| (version.value.clone(), version.metadata.clone()));
        let copy = loaded_into.get_at(b"a", ts).map(|version| (version.value.clone(), version.metadata.clone()));
        let superseded = matches!(ts % 4, 2 | 3) && ts < newest;
        if superseded {
            assert!(original.is_ok() && copy.is_err(), "version {ts} is superseded: left out");
            assert!(
                matches!(loaded_into.get_highest_of(b"a", &[ts]), Err(StoreError::VersionGone { .. })),
                "version {ts}: reads that could need it restart"
            );
        } else {
            assert_eq!(original, copy, "version {ts}");
        }
    }
    assert_eq!(loaded.counts.versions, 2 * (1 + 5), "per key: the newest committed and five prepared");
    assert_eq!(loaded_into.last_commit(b"a"), newest);
    assert_eq!(loaded_into.get_latest(b"a").map(|version| version.ts), Some(newest));
    let mut aborted = loaded_into.aborted_transactions();
    aborted.sort();
    assert_eq!(aborted, [1, 5, 9, 13, 17]);
}

/// The catch-up stream of a backup ([`write_to`]) keeps every version, superseded ones too.
#[test]
fn a_catch_up_stream_keeps_every_version() {
    let store = sample_store();
    let mut bytes = Vec::new();
    let counts = write_to(&mut bytes, &store, 77, 5).unwrap();
    let loaded_into = Store::new(1_000_000);
    load_from(&bytes[..], Path::new("stream"), &loaded_into, 0).unwrap();
    assert_eq!(loaded_into.stats(), store.stats());
    assert_eq!(counts.versions, store.stats().versions as u64);
    for ts in 1..=20u64 {
        let original = store.get_at(b"a", ts).map(|version| version.value.clone());
        assert_eq!(loaded_into.get_at(b"a", ts).map(|version| version.value.clone()), original, "version {ts}");
    }
}

#[test]
fn a_snapshot_cut_short_anywhere_is_refused_whole() {
    let (_dir, path) = written(&sample_store());
    let bytes = std::fs::read(&path).unwrap();
    for length in (0..bytes.len()).step_by(7) {
        std::fs::write(&path, &bytes[..length]).unwrap();
        let result = load(&path, &Store::new(1_000), 0);
        assert!(matches!(result, Err(DurableError::CorruptSnapshot { .. })), "cut at {length}: {result:?}");
    }
}

#[test]
fn any_changed_byte_of_a_snapshot_is_refused() {
    let (_dir, path) = written(&sample_store());
    let bytes = std::fs::read(&path).unwrap();
    for position in (0..bytes.len()).step_by(3) {
        let mut damaged = bytes.clone();
        damaged[position] ^= 0x20;
        std::fs::write(&path, &damaged).unwrap();
        let result = load(&path, &Store::new(1_000), 0);
        assert!(matches!(result, Err(DurableError::CorruptSnapshot { .. })), "byte {position}: {result:?}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    std::fs::write(&path, &longer).unwrap();
    let result = load(&path, &Store::new(1_000), 0);
    assert!(matches!(result, Err(DurableError::CorruptSnapshot { cause: SnapshotDamage::TrailingBytes(1), .. })));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn arbitrary_bytes_after_a_valid_header_never_panic(body in prop::collection::vec(any::<u8>(), 0..400)) {
        let dir = tempfile::tempdir().unwrap();
        let path = snapshot_path(dir.path(), 1);
        let mut bytes = FileHeader { lsn: 1, epoch: 0 }.encode(SNAPSHOT_MAGIC).to_vec();
        bytes.extend_from_slice(&body);
        std::fs::write(&path, &bytes).unwrap();
        prop_assert!(load(&path, &Store::new(1_000), 0).is_err());
    }
}

#[test]
fn the_largest_version_fits_an_entry() {
    use rampkv_core::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
    let keys: Vec<Key> = (0..TXN_KEYS_MAX).map(|index| Key::from(vec![index as u8; KEY_BYTES_MAX])).collect();
    let write_set = WriteSet::from_keys(&keys).unwrap();
    let store = Store::new(1_000);
    let writes = vec![(keys[0].clone(), vec![3u8; VALUE_BYTES_MAX].into_boxed_slice())];
    store.prepare(5, StoredMetadata::WriteSet(write_set.clone()), write_set.clone(), writes, 0).unwrap();
    let (_dir, path) = written(&store);
    let loaded_into = Store::new(1_000);
    load(&path, &loaded_into, 0).unwrap();
    assert_eq!(loaded_into.get_at(&keys[0], 5).unwrap().value.len(), VALUE_BYTES_MAX);
    assert_eq!(loaded_into.stale_pending(u64::MAX)[0].1.write_set, write_set);
}
