//! Read atomicity as a redis-py user sees it: `scripts/resp_atomicity.py` runs concurrent MSETs
//! and MGETs through the gateway over keys on different partitions and records a history; the
//! read-atomicity checker must find it clean, and the run must actually have raced reads
//! against writes.
//!
//! The same runs through MULTI/EXEC (`--multi`): write groups queued as SETs and MSETs, read
//! groups queued as GETs and an MGET, racing each other and plain MGETs.
//!
//! Needs `python3` with redis-py (`.ci/run` installs it); without them the test fails and says
//! so. The script prints its seed; set `RESP_ATOMICITY_SEED` to replay its choices.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use rampkv::checker;
use rampkv::client::Client;
use rampkv::cluster::Cluster;
use rampkv::history::{key_from_history_string, read_history, verify_check_value, Record};
use rampkv::protocol::ramp::Algorithm;
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::server::{ServerConfig, ServerGroup};

const WRITERS: usize = 4;
const KEYS_PER_GROUP: usize = 6;

fn script_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/resp_atomicity.py")
}

fn require_redis_py() {
    let probe = Command::new("python3").args(["-c", "import redis"]).output();
    match probe {
        Ok(output) if output.status.success() => {}
        other => panic!(
            "this test needs python3 with redis-py (python3 -m pip install redis; .ci/run installs it): {other:?}"
        ),
    }
}

struct Run {
    _group: ServerGroup,
    cluster: Cluster,
    _directory: tempfile::TempDir,
    history: std::path::PathBuf,
}

/// Starts 4 servers and two gateways running `algorithm` (writers and half of the readers on the
/// first, which calls the server cores in-process as `rampkv local` does; the other readers on
/// the second, which reaches them over TCP), runs the script against them.
fn run_script(algorithm: Algorithm, extra: &[&str]) -> Run {
    require_redis_py();
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 4]).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let mut config = GatewayConfig::new(localhost);
    config.txn_options.algorithm = algorithm;
    let second_gateway = Gateway::spawn(&cluster, &config).unwrap();
    config.in_process = Some(InProcessServers { groups: vec![std::sync::Arc::clone(group.servers())] });
    let gateway = Gateway::spawn(&cluster, &config).unwrap();
    for writer in 0..WRITERS {
        let servers: HashSet<usize> =
            (0..KEYS_PER_GROUP).map(|key| cluster.server_of(format!("w{writer}:k{key}").as_bytes())).collect();
        assert!(servers.len() >= 2, "writer {writer}'s keys must span partitions, got {servers:?}");
    }

    let directory = tempfile::tempdir().unwrap();
    let history = directory.path().join("resp_history.jsonl");
    let mut command = Command::new("timeout");
    command.args(["180", "python3"]).arg(script_path());
    command.args(["--port", &gateway.address().port().to_string()]);
    command.args(["--reader-port", &second_gateway.address().port().to_string(), "--history"]).arg(&history);
    command.args(["--writers", &WRITERS.to_string(), "--keys-per-group", &KEYS_PER_GROUP.to_string()]);
    command.args(extra);
    if let Ok(seed) = std::env::var("RESP_ATOMICITY_SEED") {
        command.args(["--seed", &seed]);
    }
    let output = command.stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}"); // the seed
    assert!(output.status.success(), "the script failed: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    gateway.shutdown().unwrap();
    second_gateway.shutdown().unwrap();
    Run { _group: group, cluster, _directory: directory, history }
}

#[test]
fn concurrent_mset_and_mget_through_redis_py_are_read_atomic() {
    let Run { cluster, history, .. } = &run_script(Algorithm::RampFast, &[]);
    let report = checker::check_file(history).unwrap();
    assert!(report.is_clean(), "read atomicity violated through the gateway:\n{report}");

    let records = read_history(history).unwrap();
    let (writes, reads) = split(&records);
    assert!(writes.len() >= WRITERS * 100 && reads.len() >= 400, "{} writes, {} reads", writes.len(), reads.len());
    let raced = reads_overlapping_a_write_of_their_keys(&writes, &reads);
    assert!(raced >= 100, "only {raced} MGETs ran while an MSET of their keys was in flight");
    let saw_writes = reads.iter().filter(|read| read.0.iter().any(|(_, ts)| *ts != 0)).count();
    assert!(saw_writes * 2 >= reads.len(), "most MGETs read written values ({saw_writes} of {})", reads.len());
    println!("{} MSETs, {} MGETs, {raced} raced an MSET of their keys; checker: {report}", writes.len(), reads.len());

    values_are_stored_in_check_format(cluster, &writes);
    the_checker_would_catch_a_fractured_read_in_this_history(records);
}

/// Issue 31: MULTI/EXEC groups of writes (each sets its keys, on several partitions, to one
/// value) against MULTI/EXEC groups of reads and plain MGETs: no read ever sees part of a group.
#[test]
fn concurrent_multi_exec_groups_through_redis_py_are_read_atomic() {
    let Run { history, .. } = &run_script(Algorithm::RampFast, &["--multi"]);
    let report = checker::check_file(history).unwrap();
    assert!(report.is_clean(), "read atomicity violated through MULTI/EXEC:\n{report}");

    let records = read_history(history).unwrap();
    let (writes, reads) = split(&records);
    assert!(writes.len() >= WRITERS * 100 && reads.len() >= 400, "{} writes, {} reads", writes.len(), reads.len());
    let raced = reads_overlapping_a_write_of_their_keys(&writes, &reads);
    assert!(raced >= 100, "only {raced} reads ran while a MULTI/EXEC of their keys was in flight");
    let saw_writes = reads.iter().filter(|read| read.0.iter().any(|(_, ts)| *ts != 0)).count();
    assert!(saw_writes * 2 >= reads.len(), "most reads read written values ({saw_writes} of {})", reads.len());
    println!(
        "{} write groups, {} reads, {raced} raced a group of their keys; checker: {report}",
        writes.len(),
        reads.len()
    );
    the_checker_would_catch_a_fractured_read_in_this_history(records);
}

/// The MULTI/EXEC run without concurrency control shows fractured reads: the groups and the
/// checks above can see what RAMP prevents.
#[test]
fn the_multi_exec_run_without_concurrency_control_shows_fractured_reads() {
    let Run { history, .. } = &run_script(Algorithm::NoCc, &["--multi", "--writes", "600", "--reads", "1200"]);
    let report = checker::check_file(history).unwrap();
    println!("{report}");
    assert!(report.fractured_reads > 0, "no fractured read without concurrency control:\n{report}");
}

/// The same run without concurrency control (each server applies its part of an MSET on its own)
/// must show fractured reads: proof that the script and checker can see what RAMP prevents.
/// (Through one gateway alone it shows none: one driver sends every request to a server over one
/// ordered connection, which happens to serialise this workload; the second gateway's readers
/// interleave with the writes.)
#[test]
fn the_same_run_without_concurrency_control_shows_fractured_reads() {
    let Run { history, .. } = &run_script(Algorithm::NoCc, &["--writes", "600", "--reads", "1200"]);
    let report = checker::check_file(history).unwrap();
    println!("{report}");
    assert!(report.fractured_reads > 0, "no fractured read without concurrency control:\n{report}");
}

type WriteView = (u64, Vec<String>, u64, u64);
type ReadView = (Vec<(String, u64)>, u64, u64);

fn split(records: &[Record]) -> (Vec<WriteView>, Vec<ReadView>) {
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    for record in records {
        match record {
            Record::Write(write) if write.ok => {
                writes.push((write.ts, write.keys.clone(), write.start_ns, write.end_ns))
            }
            Record::Read(read) if read.ok => {
                let observed = read.keys.iter().map(|key| (key.clone(), read.reads[key])).collect();
                reads.push((observed, read.start_ns, read.end_ns));
            }
            _ => {}
        }
    }
    (writes, reads)
}

/// Reads whose interval overlaps that of a write sharing one of their keys: the reads that
/// could have been fractured.
fn reads_overlapping_a_write_of_their_keys(writes: &[WriteView], reads: &[ReadView]) -> usize {
    reads
        .iter()
        .filter(|(observed, start, end)| {
            writes.iter().any(|(_, keys, write_start, write_end)| {
                write_start < end && start < write_end && observed.iter().any(|(key, _)| keys.contains(key))
            })
        })
        .count()
}

/// The script's values are rampkv check values in the gateway's stored form: read back with
/// the native client, every one verifies (so the Python encoding matches rampkv's).
fn values_are_stored_in_check_format(cluster: &Cluster, writes: &[WriteView]) {
    let keys: Vec<Vec<u8>> = writes[0].1.iter().map(|key| key_from_history_string(key).unwrap()).collect();
    let outcome = Client::connect(cluster).unwrap().get_all(keys).unwrap();
    for item in outcome.items {
        let value = rampkv::resp::value::decode(item.ts, &item.value);
        assert!(value.is_some(), "a present value: {item:?}");
        let write_id = verify_check_value(value.unwrap_or_default());
        assert!(write_id.is_some_and(|id| id >> 32 >= 1), "not a check value: {item:?}");
    }
}

/// Guards against a vacuous pass: hiding one key of a write from a read that saw the write's
/// other key makes the checker report a fractured read.
fn the_checker_would_catch_a_fractured_read_in_this_history(mut records: Vec<Record>) {
    let keys_of: std::collections::HashMap<u64, Vec<String>> = records
        .iter()
        .filter_map(|record| match record {
            Record::Write(write) => Some((write.ts, write.keys.clone())),
            Record::Read(_) => None,
        })
        .collect();
    let target = records.iter_mut().find_map(|record| {
        let Record::Read(read) = record else { return None };
        let (seen, ts) = read.reads.iter().find(|(_, ts)| **ts != 0).map(|(key, ts)| (key.clone(), *ts))?;
        let other = keys_of[&ts].iter().find(|key| **key != seen && read.reads.contains_key(*key))?.clone();
        Some((read, other))
    });
    let (read, other) = target.expect("some read saw a write of two of its keys");
    read.reads.insert(other.clone(), 0);
    read.value_ts.insert(other, 0);
    assert!(!checker::check(&records).is_clean(), "the tampered history must not be clean");
}
