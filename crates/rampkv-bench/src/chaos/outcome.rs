//! What a chaos run concludes from its history: acknowledged writes lost, the longest window
//! without a completed transaction, and the report that says whether the run passed.
//!
//! # Definitions
//! - The **last acknowledged write** of a key is, among the write records with `ok: true` that
//!   wrote it, the one with the largest timestamp: RAMP makes the version with the largest
//!   timestamp the one every later read returns (`lastCommit` is a maximum), so once it was
//!   acknowledged no read may return an older one.
//! - A key's acknowledged write is **lost** when the final read-back of that key returns an
//!   older version or none (timestamp 0, nil). A newer version is fine: a write that failed
//!   (`ok: false`) may still have committed. That newer version must exist in the history:
//!   the final reads are part of the history, so the checker calls a made-up one garbage.
//! - The **unavailability window** is the longest stretch of the workload, from its start to
//!   its deadline, in which no transaction completed successfully (ends of `ok: true`
//!   records; the final read-back is not part of the workload).
//! - A **stale read** (the checker's) returned an older version of a key than a write that was
//!   acknowledged before the read started. RAMP does not promise freshness across clients in
//!   general, but this cluster returns the newest committed version (`lastCommit`) and
//!   acknowledges a write only once it committed on every partition, so a healthy run has
//!   none. With replication and a nemesis that leaves a deposed primary alive and reachable
//!   (pause, partition), a stale read is what a deposed primary serving its old store would
//!   show: such runs fail on one.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use super::clock::RunClock;
use super::nemesis::{Action, Event, MillisecondRange, NemesisKind};
use super::network::NetworkMode;
use super::workload::WorkloadTotals;
use crate::checker::{self, Verdict};
use crate::history::{ReadRecord, Record};
use crate::limits::{CHAOS_FAULT_HOLD_MS_MAX, CHAOS_LOST_EXAMPLES_MAX, CHAOS_REPLICA_WAIT_MS_MAX};

/// An acknowledged write the final read did not find.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LostWrite {
    /// The key, as the history shows it.
    pub key: String,
    /// The last acknowledged write of the key.
    pub acknowledged_ts: u64,
    pub acknowledged_client: u64,
    /// When it was acknowledged, in ms of the run.
    pub acknowledged_at_ms: u64,
    /// What the final read returned (0: nothing, nil).
    pub read_ts: u64,
}

/// The final read-back compared with the acknowledged writes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FinalRead {
    /// Keys read back: the whole small key space and every witness key.
    pub keys_read: u64,
    /// Of those, the keys with an acknowledged write.
    pub keys_acknowledged: u64,
    /// Keys whose last acknowledged write was lost.
    pub lost: u64,
    /// The first [`CHAOS_LOST_EXAMPLES_MAX`] of them, in the order they were acknowledged.
    pub lost_examples: Vec<LostWrite>,
    /// Read-back transactions (of up to 256 keys) that failed and were read again one key at
    /// a time: a multi-key read fails for good when a version another key's metadata names is
    /// gone, so a count above 0 is itself a sign of lost data.
    pub read_key_by_key: u64,
}

/// Compares the final read-back with the last acknowledged write of every key (module docs).
pub(super) fn compare_final_read(workload: &[Record], final_reads: &[ReadRecord]) -> FinalRead {
    // Per key: (ts, client, end_ns) of the last acknowledged write.
    let mut acknowledged: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for record in workload {
        let Record::Write(write) = record else { continue };
        if !write.ok {
            continue;
        }
        for key in &write.keys {
            let entry = acknowledged.entry(key).or_insert((0, 0, 0));
            if write.ts > entry.0 {
                *entry = (write.ts, write.client, write.end_ns);
            }
        }
    }
    let mut result = FinalRead::default();
    let mut lost = Vec::new();
    for read in final_reads {
        for (key, &read_ts) in &read.reads {
            result.keys_read += 1;
            let Some(&(ts, client, end_ns)) = acknowledged.get(key.as_str()) else { continue };
            result.keys_acknowledged += 1;
            if read_ts < ts {
                lost.push(LostWrite {
                    key: key.clone(),
                    acknowledged_ts: ts,
                    acknowledged_client: client,
                    acknowledged_at_ms: end_ns / 1_000_000,
                    read_ts,
                });
            }
        }
    }
    result.lost = lost.len() as u64;
    // The examples in the order the writes were acknowledged: the first losses first.
    lost.sort_by_key(|lost| (lost.acknowledged_at_ms, lost.acknowledged_ts));
    lost.truncate(CHAOS_LOST_EXAMPLES_MAX);
    result.lost_examples = lost;
    result
}

/// The longest stretch without a completed transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Unavailability {
    /// Its length, in milliseconds.
    pub longest_ms: u64,
    /// Where it started and ended, in ms of the run.
    pub from_ms: u64,
    pub to_ms: u64,
    /// Transactions that completed successfully in the workload.
    pub completed: u64,
}

/// The longest gap between successful completions of `records` in `start_ns..=end_ns`, the
/// edges included (a run whose cluster never came back ends with its longest gap).
pub(super) fn longest_unavailability(records: &[Record], start_ns: u64, end_ns: u64) -> Unavailability {
    let mut ends: Vec<u64> = records
        .iter()
        .filter(|record| record.is_ok())
        .map(|record| match record {
            Record::Write(write) => write.end_ns,
            Record::Read(read) => read.end_ns,
        })
        .filter(|end| (start_ns..=end_ns).contains(end))
        .collect();
    ends.sort_unstable();
    let completed = ends.len() as u64;
    let mut longest = (0, start_ns, start_ns);
    let mut previous = start_ns;
    for end in ends.into_iter().chain([end_ns]) {
        if end - previous > longest.0 {
            longest = (end - previous, previous, end);
        }
        previous = end;
    }
    let (gap, from, to) = longest;
    Unavailability { longest_ms: gap / 1_000_000, from_ms: from / 1_000_000, to_ms: to / 1_000_000, completed }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "failure", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Failure {
    /// The checker found garbage or fractured reads.
    Anomalies { garbage: u64, fractured: u64 },
    /// The history shows versions older than itself: the cluster did not start empty.
    NotCheckable,
    /// Acknowledged writes missing from the final read.
    Lost { keys: u64 },
    /// The longest window without a completed transaction exceeds `--max-unavailable-ms`.
    Unavailable { longest_ms: u64, max_ms: u64 },
    /// No anomaly, but too few races for the checker to vouch for anything (the workload did
    /// not make reads race writes at the servers).
    Inconclusive { races: u64 },
    /// No write was acknowledged or no read returned: the run shows nothing.
    NothingAcknowledged,
    /// Some partition still lacked a copy after the run (no server caught up: rejoin failed).
    ReplicaSetsNotRestored { waited_ms: u64 },
    /// Pauses or partitions whose victim the configuration service did not depose within the
    /// hold's bound: no failover.
    NotDeposed { faults: u64, waited_ms: u64 },
    /// Reads that returned an older version than a write acknowledged before they started, in
    /// a run whose deposed primaries stayed reachable (module docs).
    Stale { reads: u64 },
}

impl fmt::Display for Failure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Anomalies { garbage, fractured } => {
                write!(formatter, "the checker found {garbage} garbage and {fractured} fractured reads")
            }
            Failure::NotCheckable => write!(formatter, "the history cannot be checked (versions older than the run)"),
            Failure::Lost { keys } => write!(formatter, "{keys} acknowledged writes lost"),
            Failure::ReplicaSetsNotRestored { waited_ms } => write!(
                formatter,
                "a partition still lacked a copy {waited_ms} ms after the run (no server caught up: rejoin failed)"
            ),
            Failure::Unavailable { longest_ms, max_ms } => {
                write!(
                    formatter,
                    "no transaction completed for {longest_ms} ms (more than --max-unavailable-ms {max_ms})"
                )
            }
            Failure::Inconclusive { races } => write!(
                formatter,
                "the checker is INCONCLUSIVE: only {races} races (at least {} needed to show the run could catch a \
                 fractured read)",
                checker::RACES_MIN
            ),
            Failure::NothingAcknowledged => {
                write!(formatter, "no write was acknowledged or no read returned: the run proves nothing")
            }
            Failure::NotDeposed { faults, waited_ms } => write!(
                formatter,
                "{faults} paused or cut-off primaries were still primaries {waited_ms} ms later (no failover)"
            ),
            Failure::Stale { reads } => write!(
                formatter,
                "{reads} stale reads (older than a write acknowledged before they started): a deposed primary served"
            ),
        }
    }
}

/// Everything a chaos run reports (printed as text, or as one JSON object with `--json`).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ChaosReport {
    pub seed: u64,
    pub network: NetworkMode,
    /// Why namespaces were not used, when they were asked for by default and unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_fallback: Option<String>,
    pub servers: usize,
    pub replicas: u32,
    pub nemesis: NemesisKind,
    pub kill_interval_ms: MillisecondRange,
    pub restart_after_ms: MillisecondRange,
    pub transport: &'static str,
    pub client_threads: usize,
    pub clients: usize,
    pub keys: u64,
    pub duration_ms: u64,
    /// The server processes started before the workload, in server order.
    pub initial_pids: Vec<u32>,
    /// Every kill, restart, return to service, pause, resumption, partition, heal and
    /// deposition, in order.
    pub timeline: Vec<Event>,
    pub kills: u64,
    /// Whole-cluster kills (every server killed at once; `kills` counts each server killed).
    pub whole_cluster_kills: u64,
    /// Primaries stopped with SIGSTOP (and resumed).
    pub pauses: u64,
    /// Primaries cut off from the other servers (and healed).
    pub partitions: u64,
    /// The longest time from a pause or partition to its victim's deposition (replication).
    pub deposed_ms_max: u64,
    /// Pauses and partitions whose victim was not deposed within `CHAOS_FAULT_HOLD_MS_MAX`.
    pub not_deposed: u64,
    /// Faults (kills, pauses, partitions) due while some partition lacked a copy (replication)
    /// for longer than the wait bound, not made. (The name is from when kills were the only
    /// faults.)
    pub kills_skipped: u64,
    /// The longest a fault waited for every partition's full replica set (rejoin), in ms.
    pub replica_wait_ms_max: u64,
    /// With replication and kills: every partition had its full replica set again after the
    /// run (rejoin restored f + 1 copies), asked of the configuration service; `None` otherwise.
    pub replica_sets_restored: Option<bool>,
    /// How much later than scheduled the latest fault came (a restart, catch-up or hold longer
    /// than the interval).
    pub kill_late_ms_max: u64,
    pub workload: WorkloadTotals,
    pub check: checker::Report,
    pub final_read: FinalRead,
    pub unavailability: Unavailability,
    pub max_unavailable_ms: Option<u64>,
    /// The history file; `None` when it went with the working directory of a run that passed
    /// (`--history FILE` keeps it).
    pub history: Option<PathBuf>,
    /// What the primaries sent catching-up backups, as their logs say (replication).
    pub catch_ups: CatchUps,
    /// The run's working directory (cluster file, server logs), kept when the run failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_directory: Option<PathBuf>,
    pub passed: bool,
    pub failures: Vec<Failure>,
}

/// The catch-ups the servers' logs report: snapshots of a primary's store, and deltas (only
/// the records a restarted backup with its copy on disk missed, docs/replication.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CatchUps {
    pub snapshots: u64,
    /// Versions the snapshots held, in all.
    pub snapshot_versions: u64,
    pub deltas: u64,
    /// Records the deltas held, in all, and the versions the primaries' stores held then (what
    /// snapshots instead would have sent).
    pub delta_records: u64,
    pub delta_store_versions: u64,
}

impl CatchUps {
    /// Counts the catch-up lines of a server's log (`rampkv_net::server::replication`'s).
    pub fn add_log(&mut self, text: &str) {
        let number_after = |line: &str, marker: &str| -> Option<u64> {
            let rest = &line[line.find(marker)? + marker.len()..];
            rest.split(|character: char| !character.is_ascii_digit()).next()?.parse().ok()
        };
        for line in text.lines() {
            if line.contains("sent a catching-up backup its snapshot") {
                self.snapshots += 1;
                self.snapshot_versions += number_after(line, "keys, ").unwrap_or(0);
            } else if line.contains("sent a catching-up backup a delta of ") {
                self.deltas += 1;
                self.delta_records += number_after(line, "a delta of ").unwrap_or(0);
                self.delta_store_versions += number_after(line, "snapshot of its store (").unwrap_or(0);
            }
        }
    }
}

impl ChaosReport {
    /// Decides `passed` and `failures` from the rest.
    pub(super) fn conclude(&mut self) {
        let mut failures = Vec::new();
        match self.check.verdict() {
            Verdict::NotCheckable => failures.push(Failure::NotCheckable),
            _ if !self.check.is_clean() => {
                failures.push(Failure::Anomalies { garbage: self.check.garbage, fractured: self.check.fractured });
            }
            Verdict::Inconclusive => {
                failures.push(Failure::Inconclusive { races: self.check.evidence.round1_fractured_reads });
            }
            _ => {}
        }
        if self.final_read.lost > 0 {
            failures.push(Failure::Lost { keys: self.final_read.lost });
        }
        if let Some(max_ms) = self.max_unavailable_ms {
            if self.unavailability.longest_ms > max_ms {
                failures.push(Failure::Unavailable { longest_ms: self.unavailability.longest_ms, max_ms });
            }
        }
        if self.workload.writes_ok == 0 || self.workload.reads_ok == 0 {
            failures.push(Failure::NothingAcknowledged);
        }
        if self.replica_sets_restored == Some(false) {
            failures.push(Failure::ReplicaSetsNotRestored { waited_ms: CHAOS_REPLICA_WAIT_MS_MAX });
        }
        if self.not_deposed > 0 {
            failures.push(Failure::NotDeposed { faults: self.not_deposed, waited_ms: CHAOS_FAULT_HOLD_MS_MAX });
        }
        if self.replicas > 1 && self.nemesis.leaves_deposed_primaries_alive() && self.check.stale > 0 {
            failures.push(Failure::Stale { reads: self.check.stale });
        }
        self.passed = failures.is_empty();
        self.failures = failures;
    }
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let workload = &self.workload;
        writeln!(
            formatter,
            "rampkv chaos: seed {}, {} servers on {}, {} replica(s), nemesis {}, transport {}, {} clients on {} threads, {} keys, {:.1} s",
            self.seed,
            self.servers,
            self.network.label(),
            self.replicas,
            self.nemesis.name(),
            self.transport,
            self.clients,
            self.client_threads,
            self.keys,
            self.duration_ms as f64 / 1_000.0
        )?;
        if let Some(fallback) = &self.network_fallback {
            writeln!(formatter, "  (loopback because network namespaces are unavailable: {fallback})")?;
        }
        self.write_timeline(formatter)?;
        writeln!(
            formatter,
            "transactions: {} reads and {} writes acknowledged; {} reads and {} writes failed (recorded ok: false, \
             retried); {} reconnects, {} failed connection attempts, {} transactions given up",
            workload.reads_ok,
            workload.writes_ok,
            workload.reads_failed,
            workload.writes_failed,
            workload.reconnects,
            workload.connect_failures,
            workload.given_up
        )?;
        for error in &workload.errors {
            writeln!(formatter, "  client error: {error}")?;
        }
        for line in self.check.to_string().lines() {
            writeln!(formatter, "{line}")?;
        }
        self.write_final_read(formatter)?;
        let unavailable = &self.unavailability;
        writeln!(
            formatter,
            "longest window with no completed transaction: {} ms (from {} to {}; {} transactions completed)",
            unavailable.longest_ms,
            RunClock::label_of(unavailable.from_ms),
            RunClock::label_of(unavailable.to_ms),
            unavailable.completed
        )?;
        match &self.history {
            Some(path) => writeln!(formatter, "history: {}", path.display())?,
            None => writeln!(formatter, "history: not kept (--history FILE keeps it)")?,
        }
        if let Some(directory) = &self.kept_directory {
            writeln!(formatter, "cluster file and server logs kept in {}", directory.display())?;
        }
        if self.passed {
            let checker = match self.check.verdict() {
                Verdict::Clean => "checker clean".to_owned(),
                _ => format!("no anomaly, but the checker is INCONCLUSIVE ({})", self.check.evidence.shortfall()),
            };
            writeln!(formatter, "PASS: {checker}, 0 acknowledged writes lost")
        } else {
            let reasons: Vec<String> = self.failures.iter().map(Failure::to_string).collect();
            writeln!(formatter, "FAIL: {}", reasons.join("; "))
        }
    }
}

impl ChaosReport {
    fn write_timeline(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (interval, hold) = (self.kill_interval_ms, self.restart_after_ms);
        match self.nemesis {
            NemesisKind::None => return writeln!(formatter, "nemesis: none (no fault injected)"),
            NemesisKind::KillOne => writeln!(
                formatter,
                "nemesis: {} servers killed (interval {}..{} ms, restart after {}..{} ms; latest kill {} ms late)",
                self.kills, interval.min, interval.max, hold.min, hold.max, self.kill_late_ms_max
            )?,
            NemesisKind::KillAll => writeln!(
                formatter,
                "nemesis: {} whole-cluster kills, {} servers killed (interval {}..{} ms, restart after {}..{} ms; \
                 latest kill {} ms late)",
                self.whole_cluster_kills,
                self.kills,
                interval.min,
                interval.max,
                hold.min,
                hold.max,
                self.kill_late_ms_max
            )?,
            NemesisKind::Pause | NemesisKind::Partition | NemesisKind::Mixed => writeln!(
                formatter,
                "nemesis: {} kills ({} whole-cluster kills among them), {} pauses, {} partitions (interval {}..{} ms, \
                 each lasting {}..{} ms, at least {} ms and until its victim is deposed; latest fault {} ms late)",
                self.kills,
                self.whole_cluster_kills,
                self.pauses,
                self.partitions,
                interval.min,
                interval.max,
                hold.min,
                hold.max,
                crate::limits::CHAOS_FAULT_HOLD_MS_MIN,
                self.kill_late_ms_max
            )?,
        }
        if self.replicas > 1 {
            writeln!(
                formatter,
                "  every fault waited for every partition's full replica set (rejoin): {} ms at most",
                self.replica_wait_ms_max
            )?;
            if self.pauses + self.partitions > 0 {
                writeln!(
                    formatter,
                    "  every paused or cut-off primary deposed (failover) within {} ms; {} not deposed",
                    self.deposed_ms_max, self.not_deposed
                )?;
            }
        }
        for event in &self.timeline {
            let action = match event.action {
                Action::Kill => "kill -9",
                Action::Restart => "restart",
                Action::Ready => "serving",
                Action::Pause => "paused (SIGSTOP)",
                Action::Resume => "resumed (SIGCONT)",
                Action::Partition => "cut off from the other servers (clients still reach it)",
                Action::Heal => "partition healed",
                Action::Deposed => "deposed (the configuration names other primaries for its partitions)",
            };
            writeln!(
                formatter,
                "  {:>9}  server {} {action} (pid {})",
                RunClock::label_of(event.at_ms),
                event.server,
                event.pid
            )?;
        }
        match self.replica_sets_restored {
            Some(true) => writeln!(formatter, "  after the run: every partition has its full replica set (rejoin)")?,
            Some(false) => writeln!(formatter, "  after the run: a partition still LACKS a copy (rejoin failed)")?,
            None => {}
        }
        if self.kills_skipped > 0 {
            writeln!(
                formatter,
                "  {} faults skipped: a partition lacked a copy for too long (f = {}: one failure at a time; no server \
                 caught up)",
                self.kills_skipped,
                self.replicas.saturating_sub(1)
            )?;
        }
        Ok(())
    }

    fn write_final_read(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let final_read = &self.final_read;
        let verdict = if final_read.lost == 0 { "none lost".to_owned() } else { format!("{} LOST", final_read.lost) };
        writeln!(
            formatter,
            "final read: {} keys read back, {} with an acknowledged write: {verdict}",
            final_read.keys_read, final_read.keys_acknowledged
        )?;
        if final_read.read_key_by_key > 0 {
            writeln!(
                formatter,
                "  {} read-back transactions failed and were read key by key (versions named by other keys' \
                 metadata are gone)",
                final_read.read_key_by_key
            )?;
        }
        for lost in &final_read.lost_examples {
            let read = match lost.read_ts {
                0 => "nothing (nil)".to_owned(),
                ts => format!("older version ts {ts}"),
            };
            writeln!(
                formatter,
                "  - {}: write ts {} (client {}) acknowledged at {}; read back {read}",
                lost.key,
                lost.acknowledged_ts,
                lost.acknowledged_client,
                RunClock::label_of(lost.acknowledged_at_ms)
            )?;
        }
        if final_read.lost > final_read.lost_examples.len() as u64 {
            writeln!(formatter, "  ... and {} more", final_read.lost - final_read.lost_examples.len() as u64)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod catch_up_tests {
    use super::CatchUps;

    #[test]
    fn catch_up_lines_of_server_logs_are_counted() {
        let log = "rampkv: warning: replication: primary 0 sent a catching-up backup its snapshot at record 1708 \
                   (574 keys, 2326 versions)\n\
                   rampkv: warning: replication: primary 1 sent a catching-up backup a delta of 302 records (960 to \
                   1261) instead of a snapshot of its store (1055 versions)\nunrelated line\n";
        let mut catch_ups = CatchUps::default();
        catch_ups.add_log(log);
        let expected = CatchUps {
            snapshots: 1,
            snapshot_versions: 2326,
            deltas: 1,
            delta_records: 302,
            delta_store_versions: 1055,
        };
        assert_eq!(catch_ups, expected);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::history::WriteRecord;

    fn write(ts: u64, keys: &[&str], end_ms: u64, ok: bool) -> Record {
        let keys = keys.iter().map(|key| (*key).to_owned()).collect();
        Record::Write(WriteRecord { client: 1, ts, keys, start_ns: 0, end_ns: end_ms * 1_000_000, ok })
    }

    fn read_back(reads: &[(&str, u64)]) -> ReadRecord {
        let reads: BTreeMap<String, u64> = reads.iter().map(|(key, ts)| ((*key).to_owned(), *ts)).collect();
        ReadRecord {
            client: 0,
            keys: reads.keys().cloned().collect(),
            reads,
            value_ts: BTreeMap::new(),
            round1: None,
            round2: Vec::new(),
            start_ns: 0,
            end_ns: 0,
            ok: true,
        }
    }

    #[test]
    fn a_key_read_back_older_than_its_last_acknowledged_write_is_lost() {
        let history = [
            write(10, &["a", "b"], 1, true),
            write(20, &["a"], 2, true),
            write(30, &["b"], 3, false), // failed: may or may not have committed
            write(40, &["c"], 4, true),
        ];
        // a: read 10 < 20 lost; b: read 30 (newer than the acknowledged 10, from a failed
        // write) fine; c: nil lost; d: never written, not compared.
        let final_read = compare_final_read(&history, &[read_back(&[("a", 10), ("b", 30), ("c", 0), ("d", 0)])]);
        assert_eq!((final_read.keys_read, final_read.keys_acknowledged, final_read.lost), (4, 3, 2));
        let lost: Vec<(&str, u64, u64)> = final_read
            .lost_examples
            .iter()
            .map(|lost| (lost.key.as_str(), lost.acknowledged_ts, lost.read_ts))
            .collect();
        assert_eq!(lost, [("a", 20, 10), ("c", 40, 0)]);
    }

    fn report(check: checker::Report, lost: u64, longest_ms: u64) -> ChaosReport {
        let range = MillisecondRange { min: 1, max: 1 };
        ChaosReport {
            seed: 1,
            network: NetworkMode::Loopback,
            network_fallback: None,
            servers: 3,
            replicas: 1,
            nemesis: NemesisKind::KillOne,
            kill_interval_ms: range,
            restart_after_ms: range,
            transport: "tcp",
            client_threads: 1,
            clients: 1,
            keys: 16,
            duration_ms: 1_000,
            initial_pids: Vec::new(),
            timeline: Vec::new(),
            kills: 0,
            whole_cluster_kills: 0,
            pauses: 0,
            partitions: 0,
            deposed_ms_max: 0,
            not_deposed: 0,
            kills_skipped: 0,
            replica_wait_ms_max: 0,
            replica_sets_restored: None,
            kill_late_ms_max: 0,
            workload: WorkloadTotals { reads_ok: 1, writes_ok: 1, ..WorkloadTotals::default() },
            check,
            final_read: FinalRead { lost, ..FinalRead::default() },
            unavailability: Unavailability { longest_ms, ..Unavailability::default() },
            max_unavailable_ms: Some(1_000),
            history: None,
            catch_ups: CatchUps::default(),
            kept_directory: None,
            passed: false,
            failures: Vec::new(),
        }
    }

    /// The verdict of a run: every condition of `docs/reliability.md` alone fails it.
    #[test]
    fn a_run_passes_only_when_clean_with_nothing_lost_and_served() {
        let clean = checker::Report { verdict: Verdict::Clean, ..checker::Report::default() };
        let mut passing = report(clean.clone(), 0, 1_000);
        passing.conclude();
        assert!(passing.passed && passing.failures.is_empty(), "{:?}", passing.failures);
        let failures_of = |mut report: ChaosReport| {
            report.conclude();
            assert!(!report.passed);
            report.failures
        };
        assert_eq!(failures_of(report(clean.clone(), 3, 1_000)), [Failure::Lost { keys: 3 }]);
        assert_eq!(
            failures_of(report(clean.clone(), 0, 1_001)),
            [Failure::Unavailable { longest_ms: 1_001, max_ms: 1_000 }]
        );
        let inconclusive = checker::Report { verdict: Verdict::Inconclusive, ..checker::Report::default() };
        assert_eq!(failures_of(report(inconclusive, 0, 0)), [Failure::Inconclusive { races: 0 }]);
        let violated = checker::Report { verdict: Verdict::Violated, fractured: 2, ..checker::Report::default() };
        assert_eq!(failures_of(report(violated, 0, 0)), [Failure::Anomalies { garbage: 0, fractured: 2 }]);
        let mut idle = report(clean.clone(), 0, 0);
        idle.workload.writes_ok = 0;
        assert_eq!(failures_of(idle), [Failure::NothingAcknowledged]);
        let mut undeposed = report(clean.clone(), 0, 0);
        undeposed.not_deposed = 2;
        assert_eq!(
            failures_of(undeposed),
            [Failure::NotDeposed { faults: 2, waited_ms: crate::limits::CHAOS_FAULT_HOLD_MS_MAX }]
        );
    }

    /// A stale read fails a replicated run whose deposed primaries stayed reachable (a pause,
    /// a partition: what one serving its old store would show), and only such a run: killed
    /// primaries serve nothing, and without replication no primary is ever deposed.
    #[test]
    fn a_stale_read_fails_only_runs_that_leave_deposed_primaries_alive() {
        let stale = checker::Report { verdict: Verdict::Clean, stale: 3, ..checker::Report::default() };
        for (replicas, nemesis, fails) in [
            (2, NemesisKind::Pause, true),
            (2, NemesisKind::Partition, true),
            (2, NemesisKind::Mixed, true),
            (2, NemesisKind::KillOne, false),
            (1, NemesisKind::Pause, false),
        ] {
            let mut run = report(stale.clone(), 0, 0);
            (run.replicas, run.nemesis) = (replicas, nemesis);
            run.conclude();
            let expected = if fails { vec![Failure::Stale { reads: 3 }] } else { Vec::new() };
            assert_eq!(run.failures, expected, "{replicas} replicas, {nemesis:?}");
        }
    }

    #[test]
    fn unavailability_is_the_longest_gap_between_completions_edges_included() {
        let history = [write(1, &["a"], 100, true), write(2, &["a"], 900, false), write(3, &["a"], 1_500, true)];
        // Gaps: 0..100, 100..1500 (the failed write does not count), 1500..2000.
        let window = longest_unavailability(&history, 0, 2_000 * 1_000_000);
        assert_eq!((window.longest_ms, window.from_ms, window.to_ms, window.completed), (1_400, 100, 1_500, 2));
        // Nothing completed at all: the whole run.
        let window = longest_unavailability(&[], 0, 2_000 * 1_000_000);
        assert_eq!((window.longest_ms, window.from_ms, window.to_ms), (2_000, 0, 2_000));
    }
}
