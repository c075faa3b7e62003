//! The store's unit tests.

use std::collections::BTreeMap;

use super::*;
use crate::storage::SweepClock;
use crate::types::TIMESTAMP_INITIAL;
use crate::wire::TxnState;

fn key(text: &str) -> Key {
    text.as_bytes().into()
}

fn write_set(keys: &[&str]) -> StoredMetadata {
    StoredMetadata::write_set(keys).unwrap()
}

/// The story: S2PL over a connection that reorders its messages staged a retried attempt's
/// writes twice, and its COMMIT_LOCKED put the same key twice in one transaction; the new
/// commit-once assertion fired. A key written twice keeps its last value, committed once.
#[test]
fn a_key_written_twice_in_one_transaction_keeps_its_last_value() {
    let store = Store::new(1_000);
    let writes = vec![(key("a"), b"first".to_vec().into()), (key("a"), b"last".to_vec().into())];
    store.put(7, writes, 0).unwrap();
    assert_eq!(&*store.get_latest(b"a").unwrap().value, b"last");
    assert_eq!((store.last_commit(b"a"), store.stats().versions), (7, 1));
}

fn prepare(store: &Store, ts: Timestamp, keys: &[&str], now_ms: u64) {
    let writes = keys.iter().map(|text| (key(text), format!("{text}@{ts}").into_bytes().into())).collect();
    store.prepare(ts, write_set(keys), WriteSet::default(), writes, now_ms).unwrap();
}

#[test]
fn prepared_versions_are_invisible_until_commit() {
    let store = Store::new(1_000);
    prepare(&store, 10, &["a", "b"], 0);
    assert!(store.get_latest(b"a").is_none());
    assert_eq!(store.get_at(b"a", 10).unwrap().ts, 10);
    assert_eq!(store.commit(10), 2);
    assert_eq!(store.get_latest(b"a").unwrap().ts, 10);
    assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b@10");
}

#[test]
fn two_prepares_of_one_transaction_are_committed_together() {
    // After a failover one server serves two servers' partitions, and a client sends it
    // one PREPARE per former server: the second must not drop the first one's keys.
    let store = Store::new(1_000);
    prepare(&store, 10, &["a"], 0);
    prepare(&store, 10, &["b", "a"], 0);
    assert_eq!(store.pending_keys(10).len(), 2);
    assert_eq!(store.commit(10), 2);
    assert_eq!((store.last_commit(b"a"), store.last_commit(b"b")), (10, 10));
    assert!(store.pending_keys(10).is_empty());
}

#[test]
fn a_late_commit_of_an_older_transaction_never_hides_a_newer_one() {
    // The bug this pins: lastCommit written with a blind store goes backwards.
    let store = Store::new(1_000);
    prepare(&store, 10, &["a"], 0);
    prepare(&store, 20, &["a"], 0);
    store.commit(20);
    store.commit(10);
    assert_eq!(store.last_commit(b"a"), 20);
}

#[test]
fn last_commit_keeps_advancing_after_the_first_write() {
    let store = Store::new(1_000);
    for ts in 1..=5 {
        prepare(&store, ts, &["a"], 0);
        store.commit(ts);
        assert_eq!(store.last_commit(b"a"), ts);
    }
}

#[test]
fn a_retried_commit_is_harmless() {
    let store = Store::new(1_000);
    prepare(&store, 10, &["a"], 0);
    assert_eq!(store.commit(10), 1);
    assert_eq!(store.commit(10), 0);
    assert_eq!(store.last_commit(b"a"), 10);
}

#[test]
fn an_invalid_prepare_changes_nothing() {
    let store = Store::new(1_000);
    let oversized = vec![0u8; VALUE_BYTES_MAX + 1].into_boxed_slice();
    let writes = vec![(key("a"), b"ok".to_vec().into()), (key("b"), oversized)];
    let error = store.prepare(5, write_set(&["a", "b"]), WriteSet::default(), writes, 0).unwrap_err();
    assert!(matches!(error, StoreError::InvalidPrepare(_)));
    assert_eq!(store.stats(), StoreStats::default());
    let outside = vec![(key("c"), b"x".to_vec().into())];
    assert!(store.prepare(6, write_set(&["a"]), WriteSet::default(), outside, 0).is_err());
    assert!(store
        .prepare(0, write_set(&["a"]), WriteSet::default(), vec![(key("a"), b"x".to_vec().into())], 0)
        .is_err());
}

#[test]
fn superseded_versions_survive_the_grace_period_then_go() {
    // Two-key transactions: a reader that got `b`'s version of one may ask for `a`'s.
    let store = Store::new(100);
    prepare(&store, 1, &["a", "b"], 0);
    store.commit(1);
    prepare(&store, 2, &["a", "b"], 10);
    store.commit(2);
    // Version 1 is marked superseded at t=50 and still readable within the grace period.
    prepare(&store, 3, &["a", "b"], 50);
    assert_eq!(store.get_at(b"a", 1).unwrap().ts, 1);
    store.commit(3);
    prepare(&store, 4, &["a", "b"], 149);
    assert!(store.get_at(b"a", 1).is_ok(), "still inside the grace period");
    prepare(&store, 5, &["a", "b"], 150);
    assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 });
    // The committed latest is never collected.
    assert_eq!(store.get_latest(b"a").unwrap().ts, 3);
    assert_eq!(store.stats().versions_collected, 2, "version 1 of a and of b");
}

/// Issue 31 (memory and speed of MSET): in a store that tracks reads, a superseded version
/// of a multi-key write goes at the COMMIT that supersedes it when no round-1 read of its
/// key is within the grace period; a read within it (of the key, of the key before it
/// existed, or through an item slot) keeps the grace period, counted from the read; a
/// store that does not track reads (a backup's copy) keeps it always.
#[test]
fn superseded_versions_of_keys_nobody_read_go_at_once_and_a_read_keeps_the_grace() {
    let grace = 1_000;
    let store = Store::new_tracking_reads(grace);
    let untracked = Store::new(grace);
    for store in [&store, &untracked] {
        prepare(store, 1, &["a", "b"], 0);
        store.commit(1);
        prepare(store, 2, &["a", "b"], 5);
        store.commit(2);
    }
    assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 }, "never read: gone");
    assert_eq!(store.stats().versions, 2, "the latest of a and b");
    assert!(untracked.get_at(b"a", 1).is_ok(), "a copy keeps the grace period");
    // A round-1 read of a at 100: its superseded versions keep the grace from the read on.
    assert_eq!(store.read_latest(b"a", 100).unwrap().ts, 2);
    prepare(&store, 3, &["a", "b"], 200);
    store.commit(3);
    assert!(store.get_at(b"a", 2).is_ok(), "a was read 100 ms ago");
    assert!(store.get_at(b"b", 2).is_err(), "b was not read");
    prepare(&store, 4, &["b"], 1_099);
    assert!(store.get_at(b"a", 2).is_ok(), "still within the grace of the read");
    let mut cursor = SweepCursor::default();
    store.sweep(&mut cursor, usize::MAX, SweepClock::monotonic(1_100), None);
    assert!(store.get_at(b"a", 2).is_err(), "the read is a grace period old: gone before its own grace");
    // RAMP-Small's round 1 (the latest timestamp) is a read too.
    assert_eq!(store.read_last_commit(b"a", 2_000), 3);
    prepare(&store, 5, &["a", "b"], 2_000);
    store.commit(5);
    assert!(store.get_at(b"a", 3).is_ok());
    // A key read while it did not exist inherits the read when it is created.
    assert!(store.read_latest(b"c", 2_000).is_none());
    prepare(&store, 6, &["c", "b"], 2_001);
    store.commit(6);
    prepare(&store, 7, &["c", "b"], 2_002);
    store.commit(7);
    assert!(store.get_at(b"c", 6).is_ok(), "a reader that found c missing may want version 6");
    // A key with an item slot is read without the store seeing it: always the grace.
    assert_eq!(store.get_latest_for_slot(b"b").unwrap().ts, 7);
    prepare(&store, 8, &["b", "d"], 50_000);
    store.commit(8);
    assert!(store.get_at(b"b", 7).is_ok(), "read through its slot at any moment");
    prepare(&store, 9, &["b", "d"], 50_000); // sees 7 superseded
    store.commit(9);
    prepare(&store, 10, &["b", "d"], 50_999);
    assert!(store.get_at(b"b", 7).is_ok());
    prepare(&store, 11, &["b", "d"], 51_000);
    assert!(store.get_at(b"b", 7).is_err(), "its own grace period, as before");
}

/// PREPARE_COMMIT's store side: visible at once, no pending entry left, a key written
/// twice committed once with its last value, the superseded version collected as a COMMIT
/// would; refused (aborted, invalid) without a change.
#[test]
fn a_one_phase_write_is_stored_and_visible_in_one_call() {
    let store = Store::new_tracking_reads(1_000);
    let one = |ts: Timestamp, text: &str| {
        let writes = vec![StoreWrite::new(key(text), format!("{text}@{ts}").into_bytes().into())];
        let (mut stored, mut committed) = (Vec::new(), Vec::new());
        store.prepare_commit_keeping(ts, write_set(&[text]), writes, 5, Some(&mut stored), Some(&mut committed))?;
        assert_eq!((stored.len(), committed), (1, vec![key(text)]));
        Ok::<_, StoreError>(())
    };
    one(1, "a").unwrap();
    assert_eq!(store.get_latest(b"a").unwrap().ts, 1);
    one(2, "a").unwrap();
    assert_eq!(&*store.get_latest(b"a").unwrap().value, b"a@2");
    assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 }, "alone: gone at once");
    let stats = store.stats();
    assert_eq!((stats.versions, stats.pending_transactions), (1, 0));
    // Several keys, one of them twice: every one visible, the last value kept.
    let writes = vec![
        StoreWrite::new(key("b"), b"b-first".to_vec().into()),
        StoreWrite::new(key("c"), b"c".to_vec().into()),
        StoreWrite::new(key("b"), b"b-last".to_vec().into()),
    ];
    let mut committed = Vec::new();
    store.prepare_commit_keeping(3, write_set(&["b", "c"]), writes, 5, None, Some(&mut committed)).unwrap();
    assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b-last");
    assert_eq!((store.last_commit(b"b"), store.last_commit(b"c")), (3, 3));
    assert_eq!(store.stats().pending_transactions, 0);
    // Refused: changes nothing.
    store.abort(9, 5);
    assert_eq!(one(9, "a"), Err(StoreError::Aborted { ts: 9 }));
    let bad = vec![StoreWrite::new(key("d"), b"x".to_vec().into())];
    let refused = store.prepare_commit_keeping(10, write_set(&["e"]), bad, 5, None, None);
    assert_eq!(refused, Err(StoreError::InvalidPrepare(InvalidPrepare::KeyNotInWriteSet)));
    assert_eq!((store.last_commit(b"a"), store.last_commit(b"d")), (2, 0));
}

/// A reader's round 2 for a version the store let go early is refused (`VersionGone`, the
/// reader restarts), never answered with another version; HIGHEST_OF too.
#[test]
fn a_version_let_go_early_is_refused_never_answered_wrongly() {
    let store = Store::new_tracking_reads(1_000);
    for ts in 1..=3 {
        prepare(&store, ts, &["a", "b"], 2_000 + ts);
        store.commit(ts);
    }
    for ts in 1..=2 {
        assert_eq!(store.get_at(b"a", ts).unwrap_err(), StoreError::VersionGone { ts });
    }
    assert!(matches!(store.get_highest_of(b"a", &[2]), Err(StoreError::VersionGone { ts: 2 })));
    assert_eq!(store.get_highest_of(b"a", &[2, 3]).unwrap().unwrap().ts, 3);
    assert_eq!(store.stats().versions_collected, 4);
}

/// Issue 18 (memory per key): a version whose transaction wrote its key alone goes as soon
/// as a newer commit supersedes it (no reader's round 2 can name it), from the COMMIT
/// itself; a HIGHEST_OF read that could have wanted it refuses; a two-key version beside
/// it keeps its grace period, and so does one with no write set (RAMP-Small, NoCC).
#[test]
fn a_version_alone_in_its_write_set_goes_when_superseded() {
    let store = Store::new(1_000);
    prepare(&store, 1, &["a"], 0);
    store.commit(1);
    prepare(&store, 2, &["a"], 0);
    assert_eq!(store.get_at(b"a", 1).unwrap().ts, 1, "the latest until 2 commits");
    let held = store.get_latest(b"a").unwrap();
    store.commit(2);
    assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 });
    assert_eq!(&*held.value, b"a@1", "a reader that got it keeps it");
    assert_eq!((store.stats().versions, store.stats().versions_collected), (1, 1));
    assert!(matches!(store.get_highest_of(b"a", &[1]), Err(StoreError::VersionGone { ts: 1 })));
    // A two-key version superseded by a one-key one keeps its grace period.
    prepare(&store, 3, &["a", "b"], 0);
    store.commit(3);
    assert_eq!(store.get_at(b"a", 2).unwrap_err(), StoreError::VersionGone { ts: 2 });
    prepare(&store, 4, &["a"], 10);
    store.commit(4);
    prepare(&store, 5, &["a"], 10); // marks 3 superseded at 10
    store.commit(5);
    assert!(store.get_at(b"a", 4).is_err(), "one-key, gone at the commit of 5");
    assert_eq!(store.get_at(b"a", 3).unwrap().ts, 3, "two-key: within the grace period");
    prepare(&store, 6, &["a"], 1_010);
    assert!(store.get_at(b"a", 3).is_err(), "past the grace period");
    // No write set (RAMP-Small, NoCC): the grace period.
    store.put(10, vec![(key("c"), b"x".to_vec().into())], 0).unwrap();
    store.put(11, vec![(key("c"), b"y".to_vec().into())], 0).unwrap();
    store.put(12, vec![(key("c"), b"z".to_vec().into())], 0).unwrap();
    assert_eq!(store.get_at(b"c", 10).unwrap().ts, 10);
    // A late COMMIT of an older one-key version leaves it superseded at once: it goes at
    // the key's next write.
    prepare(&store, 20, &["d"], 0);
    prepare(&store, 21, &["d"], 0);
    store.commit(21);
    store.commit(20);
    assert_eq!(store.get_at(b"d", 20).unwrap().ts, 20);
    prepare(&store, 22, &["d"], 0);
    assert!(store.get_at(b"d", 20).is_err());
}

/// Issue 15: "a key's old versions are freed only when it is written again". The sweep
/// collects them once the grace period is over, whether or not the key is written again,
/// and visits no more keys per call than it is allowed.
#[test]
fn a_sweep_collects_superseded_versions_of_keys_not_written_again() {
    let store = Store::new(100);
    for ts in [1, 2, 3] {
        store.put(ts, vec![(key("k"), vec![0u8; 8].into())], 0).unwrap();
    }
    assert_eq!(store.stats().versions, 3, "superseded, within the grace period");
    let mut cursor = SweepCursor::default();
    store.sweep(&mut cursor, usize::MAX, SweepClock::monotonic(50), None);
    assert_eq!(store.stats().versions, 3, "still within the grace period");
    store.sweep(&mut cursor, usize::MAX, SweepClock::monotonic(150), None);
    assert_eq!((store.stats().versions, store.stats().versions_collected), (1, 2));
    assert_eq!(store.get_latest(b"k").unwrap().ts, 3, "the latest stays");

    let many = Store::new(0);
    for index in 0..3_000u64 {
        let name = format!("key{index}");
        for ts in [index * 2 + 1, index * 2 + 2] {
            many.put(ts, vec![(key(&name), vec![1u8; 4].into())], 0).unwrap();
        }
    }
    let mut cursor = SweepCursor::default();
    let mut visits = Vec::new();
    while many.stats().versions > 3_000 {
        let visited = many.sweep(&mut cursor, 1_024, SweepClock::monotonic(1), None);
        assert!(visited <= 1_024);
        visits.push(visited);
        assert!(visits.len() <= 4, "a pass of 3,000 keys takes 3 sweeps of 1,024: {visits:?}");
    }
    assert_eq!(many.stats().versions_collected, 3_000);
}

/// Issue 18 (memory per key): a key back to its one version holds its version entry inline,
/// its timestamp inline and no superseded queue; the per-key state stays within 160 bytes (136
/// before its first two version entries moved inline, which saved their separate block), so
/// that a field added to every key is a decision.
#[test]
fn a_key_at_rest_holds_no_more_than_its_version() {
    assert!(std::mem::size_of::<KeyState>() <= 160, "KeyState is {} bytes", std::mem::size_of::<KeyState>());
    assert_eq!(std::mem::size_of::<StoredVersion>(), 16);
    let store = Store::new(100);
    for ts in 1..=5 {
        store.put(ts, vec![(key("a"), b"x".to_vec().into())], 0).unwrap();
    }
    let mut cursor = SweepCursor::default();
    store.sweep(&mut cursor, usize::MAX, SweepClock::monotonic(0), None);
    store.sweep(&mut cursor, usize::MAX, SweepClock::monotonic(100), None);
    let shard = store.shard(b"a").read();
    let state = shard.get(&b"a"[..]).unwrap();
    assert_eq!(store.stats().versions, 1);
    assert!(!state.versions.spilled(), "its one version entry is inline");
    assert!(!state.unmarked.spilled(), "the latest's timestamp is inline");
    assert_eq!(state.superseded.capacity(), 0, "the emptied queue was given back");
}

#[test]
fn a_prepared_version_waiting_for_its_commit_is_never_collected() {
    // The bug this pins: a slow writer's version, superseded by a newer commit while its
    // own COMMIT was in flight, was collected; its COMMIT then found nothing.
    let store = Store::new(10);
    prepare(&store, 5, &["a"], 0);
    prepare(&store, 9, &["a"], 0);
    store.commit(9);
    prepare(&store, 12, &["a"], 1_000);
    prepare(&store, 13, &["a"], 5_000);
    assert_eq!(store.get_at(b"a", 5).unwrap().ts, 5, "still awaiting its COMMIT");
    assert_eq!(store.commit(5), 1);
    assert_eq!(store.last_commit(b"a"), 9, "an older commit never moves lastCommit back");
    prepare(&store, 14, &["a"], 6_000);
    prepare(&store, 15, &["a"], 7_000);
    assert!(store.get_at(b"a", 5).is_err(), "collected once committed and past the grace period");
}

#[test]
fn highest_of_returns_the_newest_stored_candidate_prepared_or_committed() {
    let store = Store::new(1_000);
    prepare(&store, 10, &["a"], 0);
    prepare(&store, 20, &["a"], 0);
    store.commit(10);
    let found = store.get_highest_of(b"a", &[5, 10, 20, 30]).unwrap().unwrap();
    assert_eq!(found.ts, 20, "a prepared version counts");
    assert!(store.get_highest_of(b"a", &[7, 30]).unwrap().is_none());
    assert!(store.get_highest_of(b"nothing", &[7]).unwrap().is_none());
}

#[test]
fn highest_of_refuses_rather_than_answer_below_a_collected_candidate() {
    let store = Store::new(10);
    for (ts, now_ms) in [(1, 0), (2, 0), (3, 100), (4, 200), (5, 300)] {
        prepare(&store, ts, &["a"], now_ms);
        store.commit(ts);
    }
    assert!(store.get_at(b"a", 2).is_err(), "version 2 was collected");
    assert!(matches!(store.get_highest_of(b"a", &[1, 2]), Err(StoreError::VersionGone { .. })));
    assert_eq!(store.get_highest_of(b"a", &[2, 5]).unwrap().unwrap().ts, 5, "a newer stored candidate wins");
}

#[test]
fn recovery_sees_prepared_and_committed_and_an_unknown_transaction_becomes_aborted() {
    let store = Store::new(1_000);
    prepare(&store, 10, &["a"], 0);
    assert_eq!(store.status(10, &[key("a")], 0), TxnState::Prepared);
    assert_eq!(store.stale_pending(1).len(), 1);
    assert!(store.stale_pending(0).is_empty(), "not stale yet");
    store.commit(10);
    assert_eq!(store.status(10, &[key("a")], 0), TxnState::Committed);
    assert_eq!(store.status(20, &[key("a")], 0), TxnState::Unknown);
    // A PREPARE of 20 still in flight is now refused, so its writer can never commit it.
    let late = store.prepare(20, write_set(&["a"]), WriteSet::default(), vec![(key("a"), b"x".to_vec().into())], 0);
    assert_eq!(late.unwrap_err(), StoreError::Aborted { ts: 20 });
    assert_eq!(store.status(20, &[key("a")], 0), TxnState::Aborted);
}

#[test]
fn abort_drops_the_uncommitted_versions() {
    let store = Store::new(1_000);
    prepare(&store, 10, &["a", "b"], 0);
    store.abort(10, 0);
    assert!(store.get_at(b"a", 10).is_err());
    assert_eq!(store.stats().versions, 0);
    assert_eq!(store.stats().pending_transactions, 0);
    assert_eq!(store.commit(10), 0, "nothing left to commit");
}

#[test]
fn put_is_visible_at_once() {
    let store = Store::new(1_000);
    store.put(7, vec![(key("a"), b"x".to_vec().into())], 0).unwrap();
    assert_eq!(store.get_latest(b"a").unwrap().ts, 7);
    assert_eq!(store.stats().pending_transactions, 0);
}

#[test]
fn concurrent_writers_and_readers_see_only_committed_increasing_versions() {
    let store = Arc::new(Store::new(50));
    let writers: Vec<_> = (0..2u64)
        .map(|writer| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for round in 1..=2_000u64 {
                    let ts = round * 2 + writer;
                    prepare(&store, ts, &["a", "b"], round);
                    store.commit(ts);
                }
            })
        })
        .collect();
    let reader = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            let mut last_seen = 0;
            for _ in 0..20_000 {
                if let Some(version) = store.get_latest(b"a") {
                    assert!(version.ts >= last_seen, "lastCommit went backwards");
                    assert_eq!(&*version.value, format!("a@{}", version.ts).as_bytes());
                    last_seen = version.ts;
                }
            }
        })
    };
    for writer in writers {
        writer.join().unwrap();
    }
    reader.join().unwrap();
    assert_eq!(store.last_commit(b"a"), 4_001);
    assert!(store.stats().versions < 4_000, "old versions were collected");
}

/// What the store must hold, computed the slow way: every version of every key with
/// whether it is committed and since when it has been seen superseded (marked, as the
/// store does, when the key is next prepared).
/// A version alone in its write set goes when first seen superseded, at a prepare of its
/// key or at a COMMIT that supersedes a latest version alone in its write set.
#[derive(Default)]
struct ModelKey {
    /// ts -> (committed, seen superseded at, alone in its write set).
    versions: BTreeMap<Timestamp, (bool, Option<u64>, bool)>,
    last_commit: Timestamp,
}

impl ModelKey {
    /// Version `ts` was (re)prepared at `now_ms`: mark, then collect.
    fn prepared(&mut self, ts: Timestamp, alone: bool, now_ms: u64, grace_ms: u64) {
        self.versions.insert(ts, (false, None, alone));
        self.collect_alone();
        let last_commit = self.last_commit;
        for (version_ts, (committed, seen, _)) in self.versions.iter_mut() {
            if *committed && *version_ts < last_commit && seen.is_none() {
                *seen = Some(now_ms);
            }
        }
        self.versions.retain(|_, (_, seen, _)| seen.is_none_or(|seen| now_ms - seen < grace_ms));
    }

    fn committed(&mut self, ts: Timestamp) {
        self.versions.get_mut(&ts).unwrap().0 = true;
        let replaced = self.last_commit;
        self.last_commit = self.last_commit.max(ts);
        if ts > replaced && self.versions.get(&replaced).is_some_and(|&(_, _, alone)| alone) {
            self.collect_alone();
        }
    }

    fn collect_alone(&mut self) {
        let last_commit = self.last_commit;
        self.versions
            .retain(|&ts, &mut (committed, seen, alone)| !(alone && committed && ts < last_commit && seen.is_none()));
    }
}

/// A snapshot file's copy of every key is its full copy without the committed versions
/// below the newest committed one, with `collected_max_ts` raised past them (the rule as
/// stated, applied to every version).
fn assert_leave_out_is_the_rule(store: &Store, step: usize) {
    for shard in 0..store.shard_count() {
        let full = store.shard_versions(shard, Superseded::Keep);
        let left = store.shard_versions(shard, Superseded::LeaveOut);
        assert_eq!(full.len(), left.len(), "step {step}");
        for (full, left) in full.into_iter().zip(left) {
            assert_eq!(full.key, left.key, "step {step}");
            let newest = full.versions.iter().filter(|(_, committed)| *committed).map(|(v, _)| v.ts).max();
            let superseded = |ts: Timestamp, committed: bool| committed && newest.is_some_and(|newest| ts < newest);
            let collected = full
                .versions
                .iter()
                .filter(|(version, committed)| superseded(version.ts, *committed))
                .map(|(version, _)| version.ts)
                .fold(full.collected_max_ts, Timestamp::max);
            let kept: Vec<(Timestamp, bool)> = full
                .versions
                .iter()
                .filter(|(version, committed)| !superseded(version.ts, *committed))
                .map(|(version, committed)| (version.ts, *committed))
                .collect();
            let found: Vec<(Timestamp, bool)> =
                left.versions.iter().map(|(version, committed)| (version.ts, *committed)).collect();
            assert_eq!((found, left.collected_max_ts), (kept, collected), "step {step} key {:?}", full.key);
        }
    }
}

#[test]
fn latest_and_collection_match_a_model_under_out_of_order_commits_and_aborts() {
    use rand::{rngs::SmallRng, Rng, SeedableRng};
    let seed: u64 =
        std::env::var("STORE_MODEL_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(rand::random);
    println!("seed {seed} (replay with STORE_MODEL_SEED={seed})");
    let mut random = SmallRng::seed_from_u64(seed);
    const GRACE_MS: u64 = 40;
    const KEYS: [&str; 3] = ["a", "b", "c"];
    let store = Store::new(GRACE_MS);
    let mut model: HashMap<&str, ModelKey> = KEYS.iter().map(|&key| (key, ModelKey::default())).collect();
    let mut pending: Vec<(Timestamp, Vec<&str>)> = Vec::new();
    let mut now_ms = 0u64;
    let mut next_ts = 1u64;
    for step in 0..4_000 {
        now_ms += random.gen_range(0..8);
        match random.gen_range(0..10) {
            0..=3 => {
                // A new transaction; its ts jumps ahead by a random amount, so commits of
                // transactions prepared earlier often arrive after newer ones.
                next_ts += random.gen_range(1..4);
                let ts = next_ts;
                let mut keys: Vec<&str> = KEYS.iter().copied().filter(|_| random.gen_bool(0.5)).collect();
                if keys.is_empty() {
                    keys.push(KEYS[random.gen_range(0..KEYS.len())]);
                }
                prepare(&store, ts, &keys, now_ms);
                for key in &keys {
                    model.get_mut(key).unwrap().prepared(ts, keys.len() == 1, now_ms, GRACE_MS);
                }
                pending.push((ts, keys));
            }
            4..=7 if !pending.is_empty() => {
                let (ts, keys) = pending.swap_remove(random.gen_range(0..pending.len()));
                assert_eq!(store.commit(ts), keys.len(), "step {step}");
                for key in keys {
                    model.get_mut(key).unwrap().committed(ts);
                }
            }
            8 if !pending.is_empty() => {
                let (ts, keys) = pending.swap_remove(random.gen_range(0..pending.len()));
                store.abort(ts, now_ms);
                for key in keys {
                    model.get_mut(key).unwrap().versions.remove(&ts);
                }
            }
            _ if !pending.is_empty() => {
                // A retried PREPARE of a transaction awaiting its COMMIT.
                let (ts, keys) = pending[random.gen_range(0..pending.len())].clone();
                let writes = keys.iter().map(|text| (key(text), format!("{text}@{ts}").into_bytes().into())).collect();
                store.prepare(ts, write_set(&keys), WriteSet::default(), writes, now_ms).unwrap();
                for key in &keys {
                    model.get_mut(key).unwrap().prepared(ts, keys.len() == 1, now_ms, GRACE_MS);
                }
            }
            _ => {}
        }
        let mut versions = 0;
        for (name, entry) in &model {
            let latest = store.get_latest(name.as_bytes());
            assert_eq!(latest.as_ref().map_or(0, |version| version.ts), entry.last_commit, "step {step} key {name}");
            if let Some(latest) = latest {
                assert_eq!(&*latest.value, format!("{name}@{}", latest.ts).as_bytes(), "step {step}");
            }
            assert_eq!(store.last_commit(name.as_bytes()), entry.last_commit, "step {step} key {name}");
            for &ts in entry.versions.keys() {
                assert_eq!(
                    store.get_at(name.as_bytes(), ts).map(|version| version.ts),
                    Ok(ts),
                    "step {step} {name}@{ts}"
                );
            }
            // Nothing the model collected is still there.
            for ts in 1..=next_ts {
                if !entry.versions.contains_key(&ts) {
                    assert!(store.get_at(name.as_bytes(), ts).is_err(), "step {step}: {name}@{ts} should be gone");
                }
            }
            versions += entry.versions.len();
        }
        assert_eq!(store.stats().versions, versions, "step {step}");
        assert_leave_out_is_the_rule(&store, step);
    }
    assert!(store.stats().versions_collected > 100, "the run collected versions");
}

#[test]
fn latest_follows_last_commit_while_threads_commit_out_of_order() {
    // Four writers each prepare a batch of transactions, then commit them newest first,
    // while readers check that the latest version never goes back, always carries its own
    // value, and is never newer than lastCommit read right after it.
    let store = Arc::new(Store::new(5));
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|writer| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for batch in 0..200u64 {
                    let batch_ts: Vec<Timestamp> = (0..8).map(|i| ((batch * 8 + i + 1) << 2) | writer).collect();
                    for (round, &ts) in batch_ts.iter().enumerate() {
                        prepare(&store, ts, &["a", "b"], batch * 8 + round as u64);
                    }
                    for &ts in batch_ts.iter().rev() {
                        assert_eq!(store.commit(ts), 2);
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut last_seen = 0;
                while !done.load(Ordering::Acquire) {
                    for name in ["a", "b"] {
                        if let Some(version) = store.get_latest(name.as_bytes()) {
                            assert_eq!(&*version.value, format!("{name}@{}", version.ts).as_bytes());
                            assert!(version.ts <= store.last_commit(name.as_bytes()));
                            if name == "a" {
                                assert!(version.ts >= last_seen, "latest went back");
                                last_seen = version.ts;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    done.store(true, Ordering::Release);
    for reader in readers {
        reader.join().unwrap();
    }
    let highest = ((199 * 8 + 8) << 2) | 3;
    for name in ["a", "b"] {
        assert_eq!(store.get_latest(name.as_bytes()).unwrap().ts, highest);
        assert_eq!(store.last_commit(name.as_bytes()), highest);
    }
    assert!(store.stats().versions_collected > 0);
}

/// A copy for a snapshot file leaves out exactly the committed versions below the newest
/// committed one (prepared ones stay, above or below it) and says so in
/// `collected_max_ts`; a catch-up copy keeps every version.
#[test]
fn a_copy_leaves_out_superseded_versions_only_when_asked() {
    let store = Store::new(1_000);
    for (ts, commit) in [(10, true), (20, true), (15, false), (30, true), (40, false)] {
        prepare(&store, ts, &["a", "b"], 0);
        if commit {
            store.commit(ts);
        }
    }
    let copy_of_a = |superseded| {
        let entries = (0..store.shard_count()).flat_map(|shard| store.shard_versions(shard, superseded));
        let entry = entries.into_iter().find(|entry| entry.key == key("a")).expect("a is stored");
        let versions: Vec<(Timestamp, bool)> =
            entry.versions.iter().map(|(version, committed)| (version.ts, *committed)).collect();
        (versions, entry.collected_max_ts)
    };
    let all = vec![(10, true), (15, false), (20, true), (30, true), (40, false)];
    assert_eq!(copy_of_a(Superseded::Keep), (all, 0));
    assert_eq!(copy_of_a(Superseded::LeaveOut), (vec![(15, false), (30, true), (40, false)], 20));
    assert_eq!(store.stats().versions, 10, "copying changes nothing");
}

/// Copies `store` into a new store through the snapshot functions, as a restart would.
fn copy_through_restore(store: &Store) -> Store {
    let copy = Store::new(1_000);
    let mut uncommitted: HashMap<Timestamp, Vec<Key>> = HashMap::default();
    for shard in 0..store.shard_count() {
        for entry in store.shard_versions(shard, Superseded::Keep) {
            for (version, committed) in &entry.versions {
                if !committed {
                    uncommitted.entry(version.ts).or_default().push(entry.key.clone());
                }
            }
            copy.restore_key(entry, 0);
        }
    }
    for (ts, pending) in store.stale_pending(u64::MAX) {
        let keys = uncommitted.remove(&ts).unwrap_or_default();
        assert_eq!(copy.restore_pending(ts, keys, pending.write_set, 0), pending.keys.len());
    }
    for ts in store.aborted_transactions() {
        copy.restore_aborted(ts, 0);
    }
    copy
}

/// Failover moves a backup copy into the server's store: every version, pending
/// transaction and abort moves (a key held on both sides gets the copy's versions), the
/// copy is left empty, the counts follow, and a moved pending transaction commits.
#[test]
fn absorbing_a_copy_moves_everything_and_leaves_it_empty() {
    let copy = Store::new(1_000);
    prepare(&copy, 10, &["a", "b"], 0);
    copy.commit(10);
    prepare(&copy, 20, &["a"], 0);
    copy.commit(20);
    prepare(&copy, 30, &["b", "c"], 0);
    copy.restore_aborted(40, 0);
    let store = Store::new(1_000);
    prepare(&store, 5, &["b", "z"], 0);
    store.commit(5);
    let (copied_versions, held_versions) = (copy.stats().versions, store.stats().versions);
    let mut keys = Vec::new();
    assert_eq!(store.absorb(&copy, 7, Some(&mut keys)), 3);
    keys.sort();
    assert_eq!(keys, vec![key("a"), key("b"), key("c")]);
    assert_eq!(copy.stats().versions, 0);
    assert_eq!(copy.shard_versions(0, Superseded::Keep).len() + copy.stale_pending(u64::MAX).len(), 0);
    assert!(copy.aborted_transactions().is_empty());
    assert_eq!(store.stats().versions, copied_versions + held_versions);
    assert_eq!(&*store.get_latest(b"a").unwrap().value, b"a@20");
    assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b@10");
    assert_eq!(&*store.get_latest(b"z").unwrap().value, b"z@5");
    assert!(store.get_latest(b"c").is_none(), "prepared, not committed");
    assert!(store.was_aborted(40));
    assert_eq!(store.commit_keys(30).len(), 2, "the moved pending transaction commits");
    assert_eq!(&*store.get_latest(b"c").unwrap().value, b"c@30");
    assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b@30");
}

#[test]
fn a_store_copied_shard_by_shard_and_restored_answers_as_the_original() {
    let store = Store::new(1_000);
    prepare(&store, 10, &["a", "b"], 0);
    store.commit(10);
    prepare(&store, 20, &["a"], 0);
    store.commit(20);
    prepare(&store, 30, &["a", "c"], 0);
    prepare(&store, 40, &["b"], 0);
    store.abort(40, 0);
    let copy = copy_through_restore(&store);
    assert_eq!(copy.stats(), store.stats());
    for name in ["a", "b", "c"] {
        assert_eq!(copy.last_commit(name.as_bytes()), store.last_commit(name.as_bytes()), "{name}");
        let latest = copy.get_latest(name.as_bytes()).map(|version| version.ts);
        assert_eq!(latest, store.get_latest(name.as_bytes()).map(|version| version.ts), "{name}");
    }
    assert_eq!(copy.get_at(b"a", 30).unwrap().ts, 30, "a prepared version is restored");
    assert_eq!(copy.status(30, &[key("a")], 0), TxnState::Prepared);
    assert_eq!(copy.commit(30), 2, "and commits on both of its keys");
    assert_eq!(copy.last_commit(b"c"), 30);
    let refused = copy.prepare(40, write_set(&["b"]), WriteSet::default(), vec![(key("b"), b"x".to_vec().into())], 0);
    assert_eq!(refused.unwrap_err(), StoreError::Aborted { ts: 40 }, "the aborted set is restored");
    copy.clear();
    assert_eq!(copy.stats(), StoreStats::default());
    assert!(copy.get_latest(b"a").is_none() && copy.aborted_transactions().is_empty());
}

#[test]
fn a_restored_pending_transaction_names_only_keys_holding_its_prepared_version() {
    // A snapshot copies the pending map and the shards at different moments: it may name
    // a transaction pending whose versions it copied already committed (or not at all).
    let store = Store::new(1_000);
    let committed = KeyVersions {
        key: key("a"),
        collected_max_ts: 0,
        versions: vec![(Arc::new(Version::new(7, b"a@7".to_vec().into(), write_set(&["a"]))), true)],
    };
    store.restore_key(committed, 0);
    assert_eq!(store.restore_pending(7, vec![key("a"), key("z")], WriteSet::from_keys(&[key("a")]).unwrap(), 0), 0);
    assert_eq!(store.stats().pending_transactions, 0);
    assert_eq!(store.commit(7), 0, "a replayed COMMIT finds nothing left to do");
    assert_eq!(store.get_latest(b"a").unwrap().ts, 7);
}

/// Writes `keys` at `ts` as one transaction, every version expiring at `expiry`, committed.
fn write_expiring(store: &Store, ts: Timestamp, keys: &[&str], expiry: Expiry) {
    let writes = keys.iter().map(|text| StoreWrite {
        key: key(text),
        value: format!("{text}@{ts}").into_bytes().into(),
        expiry,
    });
    store.prepare_writes(ts, write_set(keys), WriteSet::default(), writes.collect(), 0).unwrap();
    store.commit(ts);
}

/// Issue 31: expired versions are reclaimed by the background sweep alone, no read touching
/// them. Stage 1 drops the value once the deadline is `EXPIRY_RECLAIM_MARGIN_MS` past by the
/// store's wall clock (not a millisecond earlier), keeping ts, write set and deadline for
/// round 2; stage 2 removes the key a retention period later by its monotonic clock, unless it
/// was written again; a removed key's round-2 answer is "reclaimed at that deadline".
#[test]
fn the_sweep_reclaims_expired_keys_without_a_read() {
    use crate::limits::{EXPIRY_RECLAIMED_RETENTION_MS, EXPIRY_RECLAIM_MARGIN_MS};
    let store = Store::new(1_000);
    let deadline_ms = 1_800_000_000_000;
    write_expiring(&store, 10, &["a", "b"], Expiry::at_ms(deadline_ms).unwrap());
    write_expiring(&store, 11, &["d"], Expiry::DELETED);
    write_expiring(&store, 12, &["n"], Expiry::NEVER);
    let before = store.stats();
    assert_eq!((before.keys, before.versions, before.values_reclaimed), (4, 4, 0));
    let mut cursor = SweepCursor::default();
    let sweep = |cursor: &mut SweepCursor, monotonic_ms, unix_ms, removed: Option<&mut Vec<(Timestamp, Key)>>| {
        store.sweep(cursor, usize::MAX, SweepClock { monotonic_ms, unix_ms }, removed)
    };

    // Without a wall clock nothing expires; a millisecond before the margin, only the deletion.
    sweep(&mut cursor, 100, 0, None);
    assert_eq!(store.stats().values_reclaimed, 0);
    sweep(&mut cursor, 100, deadline_ms + EXPIRY_RECLAIM_MARGIN_MS - 1, None);
    assert_eq!(store.stats().values_reclaimed, 1, "the deletion (deadline 1) only");
    assert!(store.get_latest(b"d").unwrap().expiry.is_reclaimed());
    assert_eq!(&*store.get_latest(b"a").unwrap().value, b"a@10");

    // Stage 1: values dropped, versions kept as round 2 and recovery need them.
    sweep(&mut cursor, 100, deadline_ms + EXPIRY_RECLAIM_MARGIN_MS, None);
    let stats = store.stats();
    assert_eq!((stats.values_reclaimed, stats.keys, stats.keys_reclaiming), (3, 4, 3));
    assert_eq!(stats.value_bytes, "n@12".len(), "only the live value's bytes are held");
    for name in ["a", "b"] {
        let latest = store.get_latest(name.as_bytes()).unwrap();
        assert_eq!((latest.ts, latest.value.is_empty()), (10, true));
        assert_eq!((latest.expiry.is_reclaimed(), latest.expiry.deadline_ms()), (true, deadline_ms));
        assert!(matches!(&latest.metadata, StoredMetadata::WriteSet(keys) if keys.len() == 2));
        assert_eq!(store.get_at(name.as_bytes(), 10).unwrap().ts, 10, "round 2 still finds it");
        assert_eq!(store.last_commit(name.as_bytes()), 10);
    }
    assert_eq!(&*store.get_latest(b"n").unwrap().value, b"n@12");

    // b is written again: live, stage 2 leaves it alone. a and d go a retention period later.
    store.put(20, vec![(key("b"), b"b@20".to_vec().into())], 200).unwrap();
    let mut removed = Vec::new();
    sweep(&mut cursor, 100 + EXPIRY_RECLAIMED_RETENTION_MS - 1, 1, Some(&mut removed));
    assert!(removed.is_empty(), "not before the retention period");
    sweep(&mut cursor, 100 + EXPIRY_RECLAIMED_RETENTION_MS, 1, Some(&mut removed));
    removed.sort();
    assert_eq!(removed, vec![(10, key("a")), (11, key("d"))]);
    let stats = store.stats();
    assert_eq!((stats.keys, stats.keys_reclaimed, stats.keys_reclaiming), (2, 2, 0));
    assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b@20");
    assert!(store.get_latest(b"a").is_none());

    // A round-2 read of the removed key (another key's write set named it) is answered
    // "reclaimed at the latest removed deadline", never "version gone".
    let exact = store.get_at(b"a", 10).unwrap();
    assert_eq!((exact.ts, exact.expiry.is_reclaimed(), exact.expiry.deadline_ms()), (10, true, deadline_ms));
    let highest = store.get_highest_of(b"a", &[10]).unwrap().unwrap();
    assert_eq!((highest.ts, highest.expiry.is_reclaimed()), (TIMESTAMP_INITIAL, true));
}

/// A PREPARE of an older timestamp reaching a key whose expired version was reclaimed is
/// stored below it: the key never reads as that older value (no resurrection).
#[test]
fn an_older_write_after_reclaiming_never_becomes_the_latest() {
    use crate::limits::EXPIRY_RECLAIM_MARGIN_MS;
    let store = Store::new(1_000);
    write_expiring(&store, 10, &["a"], Expiry::at_ms(5_000).unwrap());
    let clock = SweepClock { monotonic_ms: 100, unix_ms: 5_000 + EXPIRY_RECLAIM_MARGIN_MS };
    store.sweep(&mut SweepCursor::default(), usize::MAX, clock, None);
    assert!(store.get_latest(b"a").unwrap().expiry.is_reclaimed());
    store.put(7, vec![(key("a"), b"older".to_vec().into())], 200).unwrap();
    let latest = store.get_latest(b"a").unwrap();
    assert_eq!((latest.ts, latest.expiry.is_reclaimed()), (10, true));
    assert_eq!(store.last_commit(b"a"), 10);
}

/// The sweep tells an expiring version from the flag kept beside its pointer: a version an
/// update gives a deadline is reclaimed like any other, one whose update took the deadline
/// away (PERSIST) is not, and a reclaimed one is not looked at again.
#[test]
fn the_sweep_reclaims_what_updates_leave_expiring_and_nothing_else() {
    use crate::limits::EXPIRY_RECLAIM_MARGIN_MS;
    let store = Store::new(1_000);
    let deadline = Expiry::at_ms(5_000).unwrap();
    write_expiring(&store, 10, &["kept", "lost"], deadline);
    let update = |ts: Timestamp, name: &str, expiry: Expiry| {
        let decide = |current: Option<&Version>| {
            assert_eq!(current.map(|version| version.ts), Some(10), "the update reads the latest");
            (Some((Box::from(&b"1"[..]), expiry)), ())
        };
        let checked = store.update_keeping(ts, key(name), write_set(&[name]), decide, 100, None).unwrap();
        assert!(matches!(checked, UpdateCheck::Decided { written: true, .. }));
    };
    update(11, "kept", Expiry::NEVER); // PERSIST
    update(12, "lost", deadline); // INCR keeps the deadline
    let clock = SweepClock { monotonic_ms: 100 + 1_000, unix_ms: 5_000 + EXPIRY_RECLAIM_MARGIN_MS };
    store.sweep(&mut SweepCursor::default(), usize::MAX, clock, None); // collects ts 10 (grace: 1 s)
    store.sweep(&mut SweepCursor::default(), usize::MAX, clock, None); // one version each now
    assert_eq!(store.stats().values_reclaimed, 1);
    assert!(store.get_latest(b"lost").unwrap().expiry.is_reclaimed());
    assert_eq!((store.get_latest(b"kept").unwrap().ts, &*store.get_latest(b"kept").unwrap().value), (11, &b"1"[..]));
    store.sweep(&mut SweepCursor::default(), usize::MAX, clock, None);
    assert_eq!(store.stats().values_reclaimed, 1, "a reclaimed version is not reclaimed twice");
}
