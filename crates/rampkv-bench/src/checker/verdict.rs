//! The checker's verdict and the evidence it rests on.
//!
//! # Why a clean history is not always evidence
//! A history without anomalies shows read atomicity only if a system without it would have
//! shown anomalies in the same run. A run whose transactions never race at the servers (the
//! benchmark's embedded cluster at its defaults did exactly that: see `docs/history.md`,
//! "Evidence and verdict") passes any protocol, NoCC included. So the checker counts, besides
//! anomalies, how much the history exposed its reads:
//! - **overlapping reads**: reads that overlapped in time a write of at least one of their keys
//!   by another client;
//! - **contended reads**: of those, reads that overlapped one write of two or more of their
//!   keys, the only writes that can fracture a read;
//! - **races**: reads whose round-1 answer alone was fractured (the history records round 1):
//!   reads a protocol without RAMP's round-2 repair would have returned fractured, in this
//!   very run. Of those, the **repaired** ones had a final answer that was not. An S2PL read's
//!   round 1 is what each key's latest committed version was when its lock request reached the
//!   server: the answer of a read that takes no lock (and so does not wait for the writer).
//!
//! # Verdict
//! Anomalies decide first: garbage or fractured reads make [`Verdict::Violated`] (or
//! [`Verdict::NotCheckable`] when the only garbage is versions older than the history).
//! Without anomalies the history is [`Verdict::Clean`] when its evidence is sufficient
//! ([`Evidence::is_sufficient`]), [`Verdict::Inconclusive`] otherwise. Sufficient means at
//! least [`RACES_MIN`] races: proof that the servers interleaved transactions the way that
//! fractures reads, and that the protocol repaired what it had to.
//!
//! Time overlaps never suffice, however many: they say that reads and writes were in flight
//! together, not that any server saw them in another order than the others. The benchmark's
//! embedded cluster with one client thread showed 41,530 reads overlapping one write of two of
//! their keys in 5 s of NoCC (16 keys, half writes), and not one of them was fractured: every
//! request went through per-server FIFO connections from one sender, so every server saw every
//! transaction in the same order. So a history that records no round 1 (files recorded before
//! the field existed, or S2PL reads from servers that do not report arrival timestamps) is at
//! best inconclusive.

use serde::{Deserialize, Serialize};

/// Races (reads whose round 1 alone was fractured) a history needs for a clean verdict.
///
/// Every race is a read a protocol without the round-2 repair would have returned fractured
/// in this very run, so one race already shows the run could catch such a protocol. A few more
/// guard against a fluke and against a repair that fails only sometimes: one that left half
/// the races fractured would pass five with probability 1/32, about 3%. Races are rare at the
/// benchmark's defaults (1,000 keys, 4 per transaction, 5% writes: about 4 reads per second
/// overlap one write of two of their keys), so the bound cannot be much higher for a run of
/// seconds to reach it.
pub const RACES_MIN: u64 = 5;

/// Exit status of `rampkv check` and `rampkv bench --check` for a clean history.
pub const EXIT_CLEAN: u8 = 0;
/// Exit status for a violated or not checkable history.
pub const EXIT_VIOLATED: u8 = 1;
/// Exit status for an inconclusive history (2 is the command line's own error status).
pub const EXIT_INCONCLUSIVE: u8 = 3;

/// How much a history exposed its reads to concurrent writes (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Evidence {
    /// Ok reads that overlapped in time (closed intervals) a write, ok or not, of at least one
    /// of their keys by another client.
    pub overlapping_reads: u64,
    /// Of `overlapping_reads`, the reads that overlapped one write of two or more of their keys.
    pub contended_reads: u64,
    /// Ok reads whose record carries round 1 (`round1`).
    pub reads_with_round1: u64,
    /// Of those, the reads that ran a round 2 (`round2` not empty).
    pub round2_reads: u64,
    /// Races: ok reads whose round-1 answer alone was fractured; a read without the round-2
    /// repair would have been fractured.
    pub round1_fractured_reads: u64,
    /// Of the races, the reads whose final answer was not fractured: repaired by round 2 (or,
    /// S2PL, by waiting for the lock).
    pub repaired_reads: u64,
}

impl Evidence {
    /// Whether a history without anomalies and with this evidence counts as clean; see the
    /// module docs for the rule and [`RACES_MIN`] for the number.
    pub fn is_sufficient(&self) -> bool {
        self.round1_fractured_reads >= RACES_MIN
    }

    /// What is missing, for an insufficient history ("only 3 races; at least 5 needed").
    pub fn shortfall(&self) -> String {
        if self.reads_with_round1 > 0 {
            format!(
                "only {} races (reads whose round 1 alone was fractured); at least {RACES_MIN} needed",
                self.round1_fractured_reads
            )
        } else {
            format!(
                "no read records its round 1, so the history cannot show races (time overlaps do not prove \
                 that servers interleaved); at least {RACES_MIN} needed"
            )
        }
    }
}

/// What a history shows about read atomicity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Verdict {
    /// No anomaly, and enough evidence that the run could have shown one.
    Clean,
    /// Garbage or fractured reads.
    Violated,
    /// The only garbage is reads of versions older than every write of the history: the
    /// cluster held data from before it.
    NotCheckable,
    /// No anomaly, but too little concurrency to prove anything. Also the default of a report
    /// read from a file written before verdicts existed.
    #[default]
    Inconclusive,
}

impl Verdict {
    /// The word printed for it.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Clean => "clean",
            Verdict::Violated => "VIOLATED",
            Verdict::NotCheckable => "NOT CHECKABLE",
            Verdict::Inconclusive => "INCONCLUSIVE",
        }
    }

    /// The exit status of a command that checked one history or several ([`Verdict::combine`]).
    pub fn exit_status(self) -> u8 {
        match self {
            Verdict::Clean => EXIT_CLEAN,
            Verdict::Violated | Verdict::NotCheckable => EXIT_VIOLATED,
            Verdict::Inconclusive => EXIT_INCONCLUSIVE,
        }
    }

    /// The verdict of a run whose own history is `self` and whose evidence probe (a short run
    /// of the same protocol, transport and cluster under contention, checked on its own:
    /// `docs/history.md`, "The evidence probe") is `probe`. An anomaly in either decides (the
    /// worse of the two); without one the run is clean if either history proved the protocol
    /// (enough races), inconclusive only if neither did.
    pub fn with_probe(self, probe: Verdict) -> Verdict {
        let anomaly = |verdict: Verdict| matches!(verdict, Verdict::Violated | Verdict::NotCheckable);
        if anomaly(self) || anomaly(probe) {
            self.combine(probe)
        } else if self == Verdict::Clean || probe == Verdict::Clean {
            Verdict::Clean
        } else {
            Verdict::Inconclusive
        }
    }

    /// The verdict of several histories together: the worst of them (violated, then not
    /// checkable, then inconclusive, then clean).
    pub fn combine(self, other: Verdict) -> Verdict {
        let rank = |verdict: Verdict| match verdict {
            Verdict::Clean => 0,
            Verdict::Inconclusive => 1,
            Verdict::NotCheckable => 2,
            Verdict::Violated => 3,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}
