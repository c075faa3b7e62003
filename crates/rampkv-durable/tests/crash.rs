//! A real crash: a child process appends with policy `always` and prints each record's LSN
//! once it is durable; the test kills it with SIGKILL in the middle of its writes, twice on
//! the same directory, and then finds every record the child ever printed.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{key, options, reopen, seed, test_dir};
use rampkv_core::storage::{Key, Store};
use rampkv_core::wire::TxnState;
use rampkv_durable::{FsyncPolicy, Lsn};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// As the child computes them (src/bin/crash_child.rs).
fn key_of(ts: u64) -> Key {
    key(&format!("t{}-k{}", ts & 0xFFFF, (ts >> 16) % 32))
}

fn value_of(ts: u64) -> Box<[u8]> {
    let length = 16 + (ts >> 16) as usize % 3000;
    ts.to_le_bytes().iter().copied().cycle().take(length).collect()
}

/// Kills the child when dropped, even when the test fails.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One line the child printed: a record durable before the kill.
#[derive(Debug, Clone, Copy)]
struct Acknowledged {
    kind: u8,
    lsn: Lsn,
    ts: u64,
}

/// Runs the child on `dir` until it has acknowledged `lines` records (or a deadline), kills
/// it with SIGKILL, and returns every whole line it printed.
fn run_and_kill(dir: &Path, round: u64, lines: usize) -> Vec<Acknowledged> {
    let child = Command::new(env!("CARGO_BIN_EXE_rampkv-durable-crash-child"))
        .args([dir.to_str().unwrap(), &round.to_string(), "4", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child");
    let mut child = KillOnDrop(child);
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut acknowledged = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut line = Vec::new();
    while acknowledged.len() < lines {
        assert!(Instant::now() < deadline, "the child acknowledged only {} records", acknowledged.len());
        line.clear();
        if stdout.read_until(b'\n', &mut line).unwrap() == 0 {
            panic!("the child exited early ({:?})", child.0.wait());
        }
        acknowledged.push(parse(&line));
    }
    child.0.kill().expect("SIGKILL");
    child.0.wait().unwrap();
    // What it printed before dying is still in the pipe; a last line cut short does not count.
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    for line in rest.split_inclusive(|&byte| byte == b'\n').filter(|line| line.ends_with(b"\n")) {
        acknowledged.push(parse(line));
    }
    acknowledged
}

fn parse(line: &[u8]) -> Acknowledged {
    let text = std::str::from_utf8(line).unwrap().trim();
    let fields: Vec<&str> = text.split(' ').collect();
    assert_eq!(fields.len(), 3, "line {text:?}");
    Acknowledged { kind: fields[0].as_bytes()[0], lsn: fields[1].parse().unwrap(), ts: fields[2].parse().unwrap() }
}

/// Every acknowledged record is in the recovered store: versions with their values, commits
/// and PUTs committed.
fn check(store: &Store, acknowledged: &[Acknowledged]) {
    let committed: HashMap<u64, bool> =
        acknowledged.iter().filter(|record| record.kind == b'C').map(|record| (record.ts, true)).collect();
    for record in acknowledged {
        let version = store.get_at(&key_of(record.ts), record.ts).unwrap_or_else(|_| panic!("lost {record:?}"));
        assert_eq!(version.value, value_of(record.ts), "{record:?}");
        let must_be_committed = record.kind != b'P' || committed.contains_key(&record.ts);
        if must_be_committed {
            // (A PREPARE whose COMMIT was durable but not yet printed may be committed too.)
            assert_eq!(store.status(record.ts, &[key_of(record.ts)], 0), TxnState::Committed, "{record:?}");
            assert!(store.last_commit(&key_of(record.ts)) >= record.ts);
        }
    }
}

#[test]
fn every_record_acknowledged_before_a_kill_9_is_there_after_restarting() {
    let seed = seed("kill -9");
    let mut random = SmallRng::seed_from_u64(seed);
    let dir = test_dir();
    let mut acknowledged = Vec::new();
    for round in 1..=2 {
        let lines = random.gen_range(300..3_000);
        let printed = run_and_kill(dir.path(), round, lines);
        println!("round {round}: killed after {lines} lines; {} acknowledged in all", printed.len());
        acknowledged.extend(printed);
    }
    let (_, store, report) = reopen(dir.path(), &options(FsyncPolicy::Always));
    println!(
        "recovered: {} records replayed, last LSN {}, cuts {:?}, {} in doubt",
        report.records_replayed,
        report.last_lsn,
        report.cuts,
        report.in_doubt.len()
    );
    let highest = acknowledged.iter().map(|record| record.lsn).max().unwrap();
    assert!(report.last_lsn >= highest, "LSN {highest} was acknowledged, the log ends at {}", report.last_lsn);
    check(&store, &acknowledged);
    // In doubt can only be a PREPARE whose COMMIT never became durable.
    for in_doubt in &report.in_doubt {
        assert!(acknowledged.iter().all(|record| !(record.kind == b'C' && record.ts == in_doubt.ts)));
    }
}
