//! Unit tests of the checker on hand-made and synthetic histories.

use super::*;
use crate::test_support::SplitMix;
use std::collections::BTreeMap;
use std::time::Instant;

fn write(client: u64, ts: u64, keys: &[&str], start_ns: u64, end_ns: u64) -> Record {
    Record::Write(WriteRecord {
        client,
        ts,
        keys: keys.iter().map(ToString::to_string).collect(),
        start_ns,
        end_ns,
        ok: true,
    })
}

fn failed_write(client: u64, ts: u64, keys: &[&str], start_ns: u64, end_ns: u64) -> Record {
    let mut record = write(client, ts, keys, start_ns, end_ns);
    if let Record::Write(write) = &mut record {
        write.ok = false;
    }
    record
}

/// A check-mode read whose values all match their versions.
fn read(client: u64, reads: &[(&str, u64)], start_ns: u64, end_ns: u64) -> Record {
    let reads: BTreeMap<String, u64> = reads.iter().map(|(key, ts)| (key.to_string(), *ts)).collect();
    Record::Read(ReadRecord {
        client,
        keys: reads.keys().cloned().collect(),
        value_ts: reads.clone(),
        reads,
        round1: None,
        round2: Vec::new(),
        start_ns,
        end_ns,
        ok: true,
    })
}

fn with_value_ts(mut record: Record, key: &str, value_ts: u64) -> Record {
    if let Record::Read(read) = &mut record {
        read.value_ts.insert(key.to_owned(), value_ts);
    }
    record
}

fn failed(mut record: Record) -> Record {
    if let Record::Read(read) = &mut record {
        read.ok = false;
    }
    record
}

#[test]
fn clean_history_is_clean() {
    let history = [
        write(1, 10, &["a", "b"], 0, 10),
        read(2, &[("a", 0), ("b", 0)], 5, 6),
        write(1, 20, &["b", "c"], 20, 30),
        read(2, &[("a", 10), ("b", 10), ("c", 0)], 11, 12),
        read(3, &[("a", 10), ("b", 20), ("c", 20)], 31, 40),
        // Concurrent with the write of ts 20: either side of it is fine.
        read(4, &[("b", 10), ("c", 0)], 25, 26),
        read(4, &[("b", 20), ("c", 20)], 25, 26),
    ];
    let report = check(&history);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.reads_checked, 5);
    assert_eq!(report.writes, 2);
    assert_eq!((report.garbage, report.fractured, report.stale), (0, 0, 0));
    // No anomaly, but two concurrent reads and no recorded round 1 prove nothing.
    assert_eq!(report.verdict(), Verdict::Inconclusive);
    assert!(report.to_string().contains("INCONCLUSIVE"), "{report}");
}

#[test]
fn fractured_read_is_reported_with_both_transactions() {
    let history =
        [write(1, 10, &["a", "b"], 0, 5), write(2, 20, &["a", "b"], 6, 8), read(3, &[("a", 20), ("b", 10)], 7, 9)];
    let report = check(&history);
    assert!(!report.is_clean());
    assert_eq!((report.fractured, report.fractured_reads, report.garbage), (1, 1, 0));
    let example = &report.fractured_examples[0];
    assert_eq!(example.read.record_index, 2);
    assert_eq!(example.read.client, 3);
    assert_eq!(example.writer.record_index, 1);
    assert_eq!(example.writer.ts, Some(20));
    assert_eq!((example.key.as_str(), example.key_ts), ("a", 20));
    assert_eq!((example.sibling_key.as_str(), example.sibling_ts), ("b", 10));
    let text = report.to_string();
    assert!(text.contains("VIOLATED") && text.contains("older ts 10"), "{text}");
}

#[test]
fn fractured_against_the_initial_value() {
    let history = [write(1, 10, &["a", "b"], 0, 5), read(3, &[("a", 10), ("b", 0)], 1, 2)];
    let report = check(&history);
    assert_eq!(report.fractured, 1);
    assert_eq!(report.fractured_examples[0].sibling_ts, 0);
}

#[test]
fn one_finding_per_missed_key_with_the_newest_witness() {
    // "c" is required at 10 (via b from ts 10) and at 20 (via a from ts 20): one finding,
    // witnessed by ts 20, as RAMP's req[c] would be.
    let history = [
        write(1, 10, &["a", "b", "c"], 0, 5),
        write(2, 20, &["a", "c"], 6, 8),
        read(3, &[("a", 20), ("b", 10), ("c", 0)], 1, 2),
    ];
    let report = check(&history);
    assert_eq!((report.fractured, report.fractured_reads), (1, 1));
    let example = &report.fractured_examples[0];
    assert_eq!((example.key.as_str(), example.key_ts), ("a", 20));
    assert_eq!(example.sibling_key, "c");
}

#[test]
fn fractured_reads_of_a_write_that_failed_are_still_found() {
    let history = [failed_write(1, 10, &["a", "b"], 0, 5), read(3, &[("a", 10), ("b", 0)], 1, 2)];
    let report = check(&history);
    assert_eq!((report.fractured, report.garbage), (1, 0));
}

#[test]
fn read_of_an_unknown_timestamp_is_garbage() {
    let history = [write(1, 10, &["a"], 0, 5), read(2, &[("a", 99)], 6, 7)];
    let report = check(&history);
    assert!(!report.is_clean());
    assert_eq!(report.garbage, 1);
    let GarbageExample::UnknownVersion { read, key, ts } = &report.garbage_examples[0] else {
        panic!("expected an unknown version: {report}");
    };
    assert_eq!((read.record_index, key.as_str(), *ts), (1, "a", 99));
    assert_eq!(report.older_than_history, 0);
    assert!(report.to_string().contains("VIOLATED"), "{report}");
}

#[test]
fn versions_older_than_the_history_are_not_clean_and_named_as_such() {
    // A cluster holding data from an earlier run: the read returns ts 5, below every write.
    let history = [write(1, 10, &["a"], 0, 5), read(2, &[("a", 5)], 6, 7)];
    let report = check(&history);
    assert!(!report.is_clean());
    assert_eq!((report.garbage, report.older_than_history), (1, 1));
    let text = report.to_string();
    assert!(text.contains("NOT CHECKABLE") && text.contains("fresh cluster"), "{text}");
    // Mixed with a real finding, the verdict stays VIOLATED.
    let history = [write(1, 10, &["a"], 0, 5), read(2, &[("a", 5)], 6, 7), read(3, &[("a", 99)], 6, 7)];
    let report = check(&history);
    assert_eq!((report.garbage, report.older_than_history), (2, 1));
    assert!(report.to_string().contains("VIOLATED"), "{report}");
}

#[test]
fn read_of_a_key_the_writer_did_not_write_is_garbage() {
    let history = [write(1, 10, &["a"], 0, 5), read(2, &[("b", 10)], 6, 7)];
    let report = check(&history);
    assert_eq!(report.garbage, 1);
    let GarbageExample::KeyNotWritten { writer, key, .. } = &report.garbage_examples[0] else {
        panic!("expected a key not written: {report}");
    };
    assert_eq!((writer.record_index, key.as_str()), (0, "b"));
}

#[test]
fn value_of_another_version_is_garbage() {
    let history = [
        write(1, 10, &["a"], 0, 5),
        write(1, 20, &["a"], 6, 8),
        with_value_ts(read(2, &[("a", 10)], 2, 3), "a", 20),
        with_value_ts(read(2, &[("a", 0)], 2, 3), "a", VALUE_TS_CORRUPT),
    ];
    let report = check(&history);
    assert_eq!(report.garbage, 2);
    let GarbageExample::ValueMismatch { ts, value_ts, .. } = &report.garbage_examples[0] else {
        panic!("expected a value mismatch: {report}");
    };
    assert_eq!((*ts, *value_ts), (10, 20));
    assert!(report.to_string().contains("failed verification"), "{report}");
}

#[test]
fn reads_without_values_skip_the_value_check() {
    let mut record = read(2, &[("a", 10)], 6, 7);
    if let Record::Read(read) = &mut record {
        read.value_ts.clear();
    }
    let report = check(&[write(1, 10, &["a"], 0, 5), record]);
    assert!(report.is_clean(), "{report}");
}

#[test]
fn stale_read_is_counted_but_clean() {
    let history = [
        write(1, 10, &["a"], 0, 5),
        write(1, 20, &["a"], 6, 8),
        // Started after ts 20 finished but returned 10: stale.
        read(2, &[("a", 10)], 10, 12),
        read(2, &[("a", 0)], 10, 12),
        // Started while ts 20 was running: not stale.
        read(3, &[("a", 10)], 7, 9),
        // Started exactly when ts 20 finished: not "finished before".
        read(3, &[("a", 10)], 8, 9),
    ];
    let report = check(&history);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.stale, 2);
    let example = &report.stale_examples[0];
    assert_eq!(example.newer_write.ts, Some(20));
    assert_eq!(example.read_ts, 10);
}

#[test]
fn stale_uses_the_newest_ts_not_the_latest_finish() {
    // ts 30 finished first, ts 20 later; a read of 20 after both is still stale.
    let history = [write(1, 30, &["a"], 0, 2), write(2, 20, &["a"], 0, 5), read(3, &[("a", 20)], 10, 12)];
    let report = check(&history);
    assert_eq!(report.stale, 1);
    assert_eq!(report.stale_examples[0].newer_write.ts, Some(30));
}

#[test]
fn failed_writes_are_readable_but_never_make_reads_stale() {
    let history = [
        write(1, 10, &["a"], 0, 5),
        failed_write(1, 30, &["a"], 6, 8),
        read(2, &[("a", 10)], 10, 12),
        read(2, &[("a", 30)], 10, 12),
    ];
    let report = check(&history);
    assert!(report.is_clean(), "{report}");
    assert_eq!((report.stale, report.writes_not_ok), (0, 1));
}

#[test]
fn duplicate_write_timestamps_are_garbage() {
    let history = [write(1, 10, &["a"], 0, 5), write(2, 10, &["b"], 0, 5), write(3, 10, &["c"], 0, 5)];
    let report = check(&history);
    assert!(!report.is_clean());
    assert_eq!((report.garbage, report.duplicate_write_timestamps), (2, 2));
    let GarbageExample::DuplicateWriteTimestamp { ts, first, second } = &report.garbage_examples[1] else {
        panic!("expected a duplicate: {report}");
    };
    assert_eq!((*ts, first.record_index, second.record_index), (10, 0, 2));
}

#[test]
fn failed_reads_are_not_checked() {
    let history = [write(1, 10, &["a", "b"], 0, 5), failed(read(2, &[("a", 99)], 6, 7))];
    let report = check(&history);
    assert!(report.is_clean(), "{report}");
    assert_eq!((report.reads_checked, report.reads_not_ok), (0, 1));
}

#[test]
fn examples_are_bounded_but_counts_are_complete() {
    let history: Vec<Record> = (0..30).map(|client| read(client, &[("a", 7)], 1, 2)).collect();
    let report = check(&history);
    assert_eq!(report.garbage, 30);
    assert_eq!(report.garbage_examples.len(), EXAMPLES_PER_CLASS_MAX);
    assert!(report.to_string().contains("(20 of 30)"), "{report}");
}

#[test]
fn report_serializes_to_json_and_back() {
    let report = check(&[write(1, 10, &["a", "b"], 0, 5), read(3, &[("a", 10), ("b", 0)], 1, 2)]);
    let json = serde_json::to_value(&report).expect("serializable");
    assert_eq!(json["fractured"], 1);
    assert_eq!(json["fractured_examples"][0]["writer"]["ts"], 10);
    assert_eq!(json["fractured_examples"][0]["writer"]["kind"], "write");
    let back: Report = serde_json::from_value(json).expect("deserializable");
    assert_eq!(back, report);
}

#[test]
fn check_file_names_lines() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("history.jsonl");
    let lines = [
        write(1, 10, &["a", "b"], 0, 5).to_json_line(),
        String::new(),
        read(3, &[("a", 10), ("b", 0)], 1, 2).to_json_line(),
    ];
    std::fs::write(&path, lines.join("\n")).expect("write history");
    let report = check_file(&path).expect("readable history");
    let example = &report.fractured_examples[0];
    assert_eq!((example.read.record_index, example.read.line), (1, Some(3)));
    assert_eq!((example.writer.record_index, example.writer.line), (0, Some(1)));
    assert!(report.to_string().contains("line 3"), "{report}");
}

#[test]
fn check_file_refuses_a_malformed_history() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("history.jsonl");
    let line = write(1, 10, &["a"], 0, 5).to_json_line();
    // A broken line followed by more lines was not cut by a dying writer: refused.
    let text = format!("{line}\n{{\"type\":\"read\"\n{line}\n");
    std::fs::write(&path, text).expect("write history");
    let error = check_file(&path).expect_err("malformed middle line");
    assert!(matches!(error, HistoryError::Malformed { line: 2, .. }), "{error}");
    // So is a broken last line that has its newline.
    std::fs::write(&path, format!("{line}\n{{\"type\":\"read\"\n")).expect("write history");
    let error = check_file(&path).expect_err("malformed last line with a newline");
    assert!(matches!(error, HistoryError::Malformed { line: 2, .. }), "{error}");
}

#[test]
fn check_file_leaves_out_a_cut_last_line_and_checks_the_rest() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("history.jsonl");
    let whole = [write(1, 10, &["a", "b"], 0, 5).to_json_line(), read(3, &[("a", 10), ("b", 0)], 1, 2).to_json_line()];
    let cut = read(4, &[("a", 10), ("b", 10)], 6, 7).to_json_line();
    let text = format!("{}\n{}\n{}", whole[0], whole[1], &cut[..cut.len() / 2]);
    std::fs::write(&path, &text).expect("write history");
    let report = check_file(&path).expect("a cut last line is not an error");
    assert_eq!(report.cut_last_line, Some(CutLine { line: 3, bytes: (cut.len() / 2) as u64 }));
    assert_eq!((report.reads_checked, report.fractured), (1, 1), "the whole lines were checked: {report}");
    assert_eq!(report.verdict(), Verdict::Violated);
    assert!(report.to_string().contains("last line 3 cut short"), "{report}");
    // A whole last line without its newline is a record like any other.
    std::fs::write(&path, format!("{}\n{}", whole[0], cut)).expect("write history");
    let report = check_file(&path).expect("readable history");
    assert_eq!((report.reads_checked, report.cut_last_line), (1, None));
}

/// A history of an atomic store: transactions take effect one at a time, reads see the
/// current state, 10% writes, `keys_per_txn` distinct keys out of `key_count`. Read-atomic
/// and never stale by construction.
fn atomic_history(seed: u64, records_count: u64, key_count: u64, keys_per_txn: u64) -> Vec<Record> {
    let mut random = SplitMix(seed);
    let mut state: HashMap<String, u64> = HashMap::new();
    let mut records = Vec::with_capacity(records_count as usize);
    for step in 0..records_count {
        let mut keys: Vec<String> = Vec::new();
        while (keys.len() as u64) < keys_per_txn {
            let key = format!("k{}", random.below(key_count));
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let client = random.below(64) + 1;
        let (start_ns, end_ns) = (step * 10, step * 10 + 5);
        if random.below(10) == 0 {
            let ts = ((step + 1) << 16) | client;
            for key in &keys {
                state.insert(key.clone(), ts);
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            records.push(write(client, ts, &keys, start_ns, end_ns));
        } else {
            let reads: Vec<(&str, u64)> =
                keys.iter().map(|key| (key.as_str(), state.get(key).copied().unwrap_or(0))).collect();
            records.push(read(client, &reads, start_ns, end_ns));
        }
    }
    records
}

fn check_large_history(records_count: u64) {
    let seed = 0x5eed_0000 + records_count;
    println!("seed {seed:#x}, {records_count} records");
    let mut history = atomic_history(seed, records_count, 1000, 8);
    let clean = check(&history);
    assert!(clean.is_clean(), "seed {seed:#x}: {clean}");
    assert_eq!(clean.stale, 0, "seed {seed:#x}: {clean}");
    assert!(clean.reads_checked > records_count / 2);

    // Inject 50 fractured reads on fresh keys and 7 torn values: exactly those are found.
    let base_ts = u64::MAX / 2;
    for injected in 0..50u64 {
        let (left, right) = (format!("x{injected}l"), format!("x{injected}r"));
        history.push(write(1, base_ts + injected, &[left.as_str(), right.as_str()], 0, u64::MAX));
        history.push(read(2, &[(left.as_str(), base_ts + injected), (right.as_str(), 0)], 1, 2));
    }
    for injected in 0..7 {
        history.push(with_value_ts(read(3, &[("k1", 0)], 0, 1), "k1", injected + 1));
    }
    let started = Instant::now();
    let report = check(&history);
    println!("checked {} records in {:?}", history.len(), started.elapsed());
    assert_eq!((report.fractured, report.garbage), (50, 7), "seed {seed:#x}: {report}");
    assert_eq!(report.fractured_examples.len(), EXAMPLES_PER_CLASS_MAX);
}

#[test]
fn hundred_thousand_record_history_is_checked() {
    check_large_history(100_000);
}

#[test]
#[ignore = "takes seconds and about a gigabyte; run with --ignored to measure"]
fn million_record_history_is_checked() {
    check_large_history(1_000_000);
}

/// The read with round 1 recorded: `round1` gives round 1's timestamp per key (keys not named
/// got their final version in round 1), `round2` the keys round 2 fetched.
fn with_rounds(mut record: Record, round1: &[(&str, u64)], round2: &[&str]) -> Record {
    if let Record::Read(read) = &mut record {
        let first: Vec<u64> = read
            .keys
            .iter()
            .map(|key| {
                let named = round1.iter().find(|(name, _)| name == key).map(|(_, ts)| *ts);
                named.unwrap_or(read.reads[key])
            })
            .collect();
        read.round1 = Some(first);
        read.round2 = round2.iter().map(ToString::to_string).collect();
    }
    record
}

#[test]
fn a_read_overlaps_only_writes_of_its_keys_by_other_clients_in_its_time() {
    let history = [
        write(1, 10, &["a", "b"], 100, 200),
        // Overlaps ts 10 on "a" (inclusive ends count).
        read(2, &[("a", 0)], 200, 300),
        // Ends before ts 10 starts / starts after it ended.
        read(3, &[("a", 0)], 0, 99),
        read(3, &[("a", 10)], 201, 300),
        // In time, but of another key.
        read(4, &[("c", 0)], 150, 160),
        // In time and of its key, but by its own client.
        read(1, &[("a", 0)], 150, 160),
    ];
    let report = check(&history);
    assert!(report.is_clean(), "{report}");
    let evidence = report.evidence;
    assert_eq!((evidence.overlapping_reads, evidence.contended_reads), (1, 0), "{report}");
}

#[test]
fn a_read_overlapping_one_write_of_two_of_its_keys_is_contended() {
    let history = [
        write(1, 10, &["a", "b"], 100, 200),
        write(5, 20, &["c"], 100, 200),
        // Overlaps ts 10 on both keys: contended.
        read(2, &[("a", 10), ("b", 10)], 150, 160),
        // Overlaps ts 10 on "a" and ts 20 on "c": two writes of one key each, not contended.
        read(3, &[("a", 0), ("c", 0)], 150, 160),
        // One key of ts 10 only.
        read(4, &[("b", 10), ("d", 0)], 150, 160),
    ];
    let evidence = check(&history).evidence;
    assert_eq!((evidence.overlapping_reads, evidence.contended_reads), (3, 1));
}

#[test]
fn a_race_repaired_by_round_two_is_counted_as_repaired() {
    // Round 1 saw ts 20 on "a" but the older ts 10 on "b"; round 2 fetched "b" at 20.
    let history = [
        write(1, 10, &["a", "b"], 0, 5),
        write(1, 20, &["a", "b"], 10, 30),
        with_rounds(read(2, &[("a", 20), ("b", 20)], 15, 25), &[("b", 10)], &["b"]),
        // A round 2 that changed nothing (RAMP-Small fetches every key) is no race.
        with_rounds(read(3, &[("a", 20), ("b", 20)], 31, 40), &[], &["a", "b"]),
        // One round, nothing raced.
        with_rounds(read(4, &[("a", 10), ("b", 10)], 6, 8), &[], &[]),
    ];
    let report = check(&history);
    assert!(report.is_clean(), "{report}");
    let evidence = report.evidence;
    assert_eq!(
        (evidence.reads_with_round1, evidence.round2_reads, evidence.round1_fractured_reads, evidence.repaired_reads),
        (3, 2, 1, 1),
        "{report}"
    );
    assert!(report.to_string().contains("1 reads' round 1 alone was fractured"), "{report}");
}

#[test]
fn a_race_round_two_did_not_repair_is_a_race_and_a_violation() {
    // The mutant that skips the repair: round 1 is the final answer, and it is fractured.
    let history = [
        write(1, 10, &["a", "b"], 0, 5),
        write(1, 20, &["a", "b"], 10, 30),
        with_rounds(read(2, &[("a", 20), ("b", 10)], 15, 25), &[], &[]),
    ];
    let report = check(&history);
    assert_eq!(report.verdict(), Verdict::Violated);
    let evidence = report.evidence;
    assert_eq!((evidence.round1_fractured_reads, evidence.repaired_reads), (1, 0));
}

#[test]
fn round_one_versions_no_write_has_witness_nothing_and_are_not_garbage() {
    let history = [
        write(1, 10, &["a", "b"], 0, 5),
        with_rounds(read(2, &[("a", 10), ("b", 10)], 6, 8), &[("a", 999), ("b", 0)], &["a", "b"]),
    ];
    let report = check(&history);
    assert_eq!((report.garbage, report.evidence.round1_fractured_reads), (0, 0), "{report}");
}

/// `races` writer/reader pairs, each a race round 2 repaired, on keys of their own.
fn repaired_races(races: u64) -> Vec<Record> {
    let mut history = Vec::new();
    for race in 0..races {
        let (left, right) = (format!("l{race}"), format!("r{race}"));
        let (left, right) = (left.as_str(), right.as_str());
        let ts = 100 + race;
        history.push(write(1, ts, &[left, right], race * 100, race * 100 + 50));
        let read = read(2, &[(left, ts), (right, ts)], race * 100 + 10, race * 100 + 40);
        history.push(with_rounds(read, &[(right, 0)], &[right]));
    }
    history
}

#[test]
fn a_history_with_round_one_needs_enough_races_to_be_clean() {
    let report = check(&repaired_races(RACES_MIN - 1));
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.verdict(), Verdict::Inconclusive);
    let text = report.to_string();
    assert!(text.contains("INCONCLUSIVE") && text.contains(&format!("only {} races", RACES_MIN - 1)), "{text}");
    assert_eq!(report.verdict().exit_status(), EXIT_INCONCLUSIVE);

    let report = check(&repaired_races(RACES_MIN));
    assert_eq!(report.verdict(), Verdict::Clean, "{report}");
    assert_eq!(report.evidence.repaired_reads, RACES_MIN);
    assert!(report.to_string().starts_with("read atomicity: clean"), "{report}");
    assert_eq!(report.verdict().exit_status(), EXIT_CLEAN);
}

/// `reads` reads, each overlapping one write of both its keys in time, seeing no race: what the
/// embedded cluster did before it interleaved (every server saw every write and read in the
/// same order, so no round 1 was ever fractured, and NoCC would have passed). With round 1
/// recorded or without (S2PL, old files).
fn contended_reads_without_races(reads: u64, record_round1: bool) -> Vec<Record> {
    let mut history = vec![write(1, 99, &["a", "b"], 0, 1)];
    for step in 0..reads {
        let ts = 100 + step;
        history.push(write(1, ts, &["a", "b"], step * 100 + 10, step * 100 + 50));
        let read = read(2, &[("a", ts - 1), ("b", ts - 1)], step * 100, step * 100 + 20);
        history.push(if record_round1 { with_rounds(read, &[], &[]) } else { read });
    }
    history
}

#[test]
fn time_overlaps_without_races_never_make_a_history_clean() {
    for record_round1 in [true, false] {
        let report = check(&contended_reads_without_races(1000, record_round1));
        assert!(report.is_clean(), "{report}");
        assert_eq!((report.evidence.overlapping_reads, report.evidence.contended_reads), (1000, 1000));
        assert_eq!(report.verdict(), Verdict::Inconclusive, "round 1 recorded: {record_round1}: {report}");
    }
    let text = check(&contended_reads_without_races(10, false)).to_string();
    assert!(text.contains("races: not recorded") && text.contains("no read records its round 1"), "{text}");
}

#[test]
fn nocc_style_histories_are_still_caught() {
    // NoCC's reads record round 1, which is their answer: every fractured read is a race and a
    // violation, however much else the history shows.
    let mut history = repaired_races(RACES_MIN * 3);
    history.push(write(7, 5000, &["x", "y"], 0, 100));
    history.push(with_rounds(read(8, &[("x", 5000), ("y", 0)], 50, 60), &[], &[]));
    let report = check(&history);
    assert_eq!(report.verdict(), Verdict::Violated, "{report}");
    assert_eq!((report.fractured_reads, report.evidence.round1_fractured_reads), (1, RACES_MIN * 3 + 1));
    assert_eq!(report.verdict().exit_status(), EXIT_VIOLATED);
    // And a NoCC history whose servers never interleaved shows no race: inconclusive, not clean.
    let quiet =
        [write(7, 5000, &["x", "y"], 0, 100), with_rounds(read(8, &[("x", 5000), ("y", 5000)], 50, 60), &[], &[])];
    assert_eq!(check(&quiet).verdict(), Verdict::Inconclusive);
}

#[test]
fn verdicts_combine_to_the_worst() {
    use Verdict::{Clean, Inconclusive, NotCheckable, Violated};
    assert_eq!(Clean.combine(Inconclusive), Inconclusive);
    assert_eq!(Inconclusive.combine(Clean), Inconclusive);
    assert_eq!(Inconclusive.combine(Violated), Violated);
    assert_eq!(NotCheckable.combine(Inconclusive), NotCheckable);
    assert_eq!(Violated.combine(NotCheckable), Violated);
    assert_eq!(Clean.combine(Clean), Clean);
    let statuses: Vec<u8> =
        [Clean, Violated, NotCheckable, Inconclusive].iter().map(|verdict| verdict.exit_status()).collect();
    assert_eq!(statuses, [0, 1, 1, 3]);
}

#[test]
fn a_run_with_an_evidence_probe_is_clean_if_either_history_proved_the_protocol_and_violated_if_either_broke_it() {
    use Verdict::{Clean, Inconclusive, NotCheckable, Violated};
    // (the workload's own verdict, the probe's) -> the run's
    let cases = [
        (Inconclusive, Clean, Clean),
        (Clean, Inconclusive, Clean),
        (Clean, Clean, Clean),
        (Inconclusive, Inconclusive, Inconclusive),
        (Inconclusive, Violated, Violated),
        (Clean, Violated, Violated),
        (Violated, Clean, Violated),
        (NotCheckable, Clean, NotCheckable),
        (Clean, NotCheckable, NotCheckable),
        (NotCheckable, Violated, Violated),
    ];
    for (workload, probe, run) in cases {
        assert_eq!(workload.with_probe(probe), run, "workload {workload:?}, probe {probe:?}");
    }
}

#[test]
fn the_json_report_carries_evidence_and_verdict() {
    let report = check(&repaired_races(RACES_MIN));
    let json = serde_json::to_value(&report).expect("serializable");
    assert_eq!(json["verdict"], "clean");
    assert_eq!(json["evidence"]["repaired_reads"], RACES_MIN);
    assert_eq!(json["evidence"]["round1_fractured_reads"], RACES_MIN);
    assert_eq!(json["evidence"]["overlapping_reads"], RACES_MIN);
    assert_eq!(json["evidence"]["contended_reads"], RACES_MIN);
    let back: Report = serde_json::from_value(json).expect("deserializable");
    assert_eq!(back, report);
}

#[test]
fn a_history_recorded_before_rounds_existed_reads_and_checks() {
    let text = concat!(
        r#"{"type":"write","client":3,"ts":1234,"keys":["k1","k7"],"start_ns":10,"end_ns":20,"ok":true}"#,
        "\n",
        r#"{"type":"read","client":5,"keys":["k1","k7"],"reads":{"k1":1234,"k7":1234},"value_ts":{"k1":1234,"k7":1234},"start_ns":15,"end_ns":40,"ok":true}"#,
        "\n"
    );
    let records = history::parse_history(text.as_bytes()).expect("old format");
    let report = check(&records);
    assert_eq!((report.evidence.reads_with_round1, report.evidence.contended_reads), (0, 1));
    assert_eq!(report.verdict(), Verdict::Inconclusive);
}

#[test]
fn a_write_naming_a_key_twice_is_not_two_keys_of_the_read() {
    let history = [write(1, 10, &["a", "a"], 100, 200), read(2, &[("a", 0), ("b", 0)], 150, 160)];
    let evidence = check(&history).evidence;
    assert_eq!((evidence.overlapping_reads, evidence.contended_reads), (1, 0));
}

/// The overlap figures by their definitions, read by write: the reference for the index.
fn overlap_figures_by_definition(history: &[Record]) -> (u64, u64) {
    let writes: Vec<&WriteRecord> = history
        .iter()
        .filter_map(|record| match record {
            Record::Write(write) => Some(write),
            Record::Read(_) => None,
        })
        .collect();
    let (mut overlapping, mut contended) = (0, 0);
    for record in history {
        let Record::Read(read) = record else { continue };
        let shared_counts = writes
            .iter()
            .filter(|write| {
                write.client != read.client && write.start_ns <= read.end_ns && write.end_ns >= read.start_ns
            })
            .map(|write| read.reads.keys().filter(|key| write.keys.contains(key)).count());
        let most_shared = shared_counts.max().unwrap_or(0);
        overlapping += u64::from(most_shared >= 1);
        contended += u64::from(most_shared >= 2);
    }
    (overlapping, contended)
}

#[test]
fn overlap_figures_match_their_definition_with_few_and_many_concurrent_writes() {
    let seed = 0x0e7a_1ab5;
    println!("seed {seed:#x}");
    let mut random = SplitMix(seed);
    // Spans short and long: from a few writes at a time (one query of all writes) to hundreds
    // (one query per key of the read).
    for (round, (span, length_max)) in
        [(100_000u64, 10_000), (10_000, 1_000), (1_000, 100), (100, 100)].into_iter().enumerate()
    {
        let mut history = Vec::new();
        for step in 0..600u64 {
            let key_count = 1 + random.below(4);
            let keys: Vec<String> = (0..key_count).map(|_| format!("k{}", random.below(12))).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let start = random.below(span);
            let end = start + random.below(length_max + 1);
            let client = 1 + random.below(6);
            if random.below(2) == 0 {
                history.push(write(client, 1000 + step, &keys, start, end));
            } else {
                let mut reads: Vec<(&str, u64)> = keys.iter().map(|key| (*key, 0)).collect();
                reads.sort_unstable();
                reads.dedup();
                history.push(read(client, &reads, start, end));
            }
        }
        let evidence = check(&history).evidence;
        let expected = overlap_figures_by_definition(&history);
        assert_eq!((evidence.overlapping_reads, evidence.contended_reads), expected, "seed {seed:#x}, round {round}");
    }
}
