//! `rampkv figures`: the reference paper's four evaluation sweeps, each point a benchmark run
//! ([`crate::bench::run`]) in this process, written out as SVG plots, Markdown tables with
//! the paper's ratios beside ours, and every point's full [`BenchResult`] as JSON.
//!
//! # The sweeps (Murata et al., "Accelerating RAMP transactions with RDMA", section V)
//! - [`Sweep::Comm`] (Fig. 5): RAMP-Fast over every transport this build has
//!   ([`TransportKind::ALL`]), 95% reads, 8 operations per transaction, 4 servers, 8 clients.
//! - [`Sweep::TxnSize`] (Fig. 6): transaction size 1 to 32 at 95% reads for each [`METHODS`]
//!   entry whose transport exists.
//! - [`Sweep::ReadRatio`] (Fig. 7): read ratio 0 to 100% on the micro-benchmark, 8 operations
//!   per transaction, the same methods.
//! - [`Sweep::Ycsb`] (Fig. 8): read ratio 0 to 100% on YCSB (workload A's settings with
//!   `readproportion` = the ratio and `updateproportion` = the rest, 1,000 records of 1,000
//!   bytes, as YCSB's default 10 fields of 100 bytes), 8 operations per transaction.
//!
//! # Layout (bottom up: a room names only rooms above it in this list)
//! - this file: the sweeps, the methods, [`FiguresConfig`] and every point's benchmark
//!   configuration, and the outcome types; it names none of its rooms but to re-export.
//! - `paper`: the paper's ratios between methods, to print beside ours.
//! - [`svg`]: the plots.
//! - `report`: the Markdown tables and the plots of the outcome.
//! - `run`: [`run`], which runs the points and writes the output directory.

mod paper;
mod report;
mod run;
pub mod svg;

pub use paper::{PaperRatio, PAPER_RATIOS};
pub use run::run;

use std::path::PathBuf;

use serde::Serialize;

use crate::bench::{self, BenchConfig, BenchError, StopAfter, TransportKind, Workload};
use crate::checker::{Evidence, Verdict};
use rampkv_core::protocol::ramp::Algorithm;
use rampkv_core::types::UnknownName;
use rampkv_net::message::BatchStats;

/// Seconds per point in quick mode (CI): long enough for a few thousand transactions.
pub const QUICK_POINT_SECONDS: f64 = 0.3;
/// Seconds per point in full mode.
pub const FULL_POINT_SECONDS: f64 = 5.0;
/// Longest point a figure run accepts (a full run has about 60 points).
pub const POINT_SECONDS_MAX: f64 = 600.0;
/// Bytes of a YCSB record: YCSB's default `fieldcount` 10 times `fieldlength` 100.
pub const YCSB_VALUE_BYTES: usize = 1_000;

/// Quick (CI: fewer points, a fraction of a second each) or full (every point, seconds each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Quick,
    Full,
}

/// One of the paper's four figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sweep {
    Comm,
    TxnSize,
    ReadRatio,
    Ycsb,
}

impl Sweep {
    /// All four, in the paper's order.
    pub const ALL: [Sweep; 4] = [Sweep::Comm, Sweep::TxnSize, Sweep::ReadRatio, Sweep::Ycsb];

    /// The name on the command line (`--only`) and of the output files.
    pub fn name(self) -> &'static str {
        match self {
            Sweep::Comm => "comm",
            Sweep::TxnSize => "txnsize",
            Sweep::ReadRatio => "readratio",
            Sweep::Ycsb => "ycsb",
        }
    }

    /// Parses a name given by [`Sweep::name`].
    pub fn from_name(name: &str) -> Result<Sweep, UnknownName> {
        let name = name.trim();
        Sweep::ALL.into_iter().find(|sweep| sweep.name() == name).ok_or_else(|| UnknownName {
            what: "figure",
            name: name.to_owned(),
            choices: Sweep::ALL.iter().map(|sweep| sweep.name()).collect(),
        })
    }

    /// The plot's title.
    pub fn title(self) -> &'static str {
        match self {
            Sweep::Comm => "Communication types (paper Fig. 5)",
            Sweep::TxnSize => "Varying transaction size (paper Fig. 6)",
            Sweep::ReadRatio => "Varying read ratio, micro-benchmark (paper Fig. 7)",
            Sweep::Ycsb => "Varying read ratio, YCSB (paper Fig. 8)",
        }
    }

    /// What the x axis shows.
    pub fn x_label(self) -> &'static str {
        match self {
            Sweep::Comm => "transport (RAMP-Fast)",
            Sweep::TxnSize => "transaction size (operations per transaction)",
            Sweep::ReadRatio | Sweep::Ycsb => "read ratio (%)",
        }
    }

    /// The x values of a mode (comm has none: its points are the transports).
    pub fn xs(self, mode: Mode) -> Vec<f64> {
        let values: &[f64] = match (self, mode) {
            (Sweep::Comm, _) => &[],
            (Sweep::TxnSize, Mode::Full) => &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
            (Sweep::TxnSize, Mode::Quick) => &[1.0, 4.0, 16.0],
            (Sweep::ReadRatio | Sweep::Ycsb, Mode::Full) => &[0.0, 25.0, 50.0, 75.0, 90.0, 95.0, 100.0],
            (Sweep::ReadRatio | Sweep::Ycsb, Mode::Quick) => &[0.0, 50.0, 100.0],
        };
        values.to_vec()
    }

    /// A point's x as it appears in file names and tables (`4`, `95`).
    fn x_text(self, x: f64) -> String {
        if x.fract() == 0.0 {
            format!("{x:.0}")
        } else {
            format!("{x}")
        }
    }
}

/// A way of running transactions that the line figures compare: an algorithm over a
/// transport. The transport is named, not typed, so that a method whose transport this build
/// lacks is reported as unavailable instead of failing to compile: adding a method (or a
/// transport another branch adds) is one line here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Method {
    /// Stable identifier (file names, JSON).
    pub id: &'static str,
    /// Legend and table label.
    pub label: &'static str,
    /// The paper's name for it.
    pub paper_name: &'static str,
    pub algorithm: Algorithm,
    /// A [`TransportKind`] name.
    pub transport: &'static str,
}

impl Method {
    /// The transport, if this build has it.
    pub fn transport_kind(&self) -> Option<TransportKind> {
        TransportKind::from_name(self.transport).ok().filter(|kind| TransportKind::ALL.contains(kind))
    }
}

/// The methods of the paper's Fig. 6 to 8, in its legend's order (bottom to top).
pub const METHODS: [Method; 4] = [
    Method { id: "s2pl-tcp", label: "S2PL (TCP)", paper_name: "S2PL", algorithm: Algorithm::S2pl, transport: "tcp" },
    Method {
        id: "ramp-fast-tcp",
        label: "RAMP-Fast (TCP)",
        paper_name: "RAMP(GET, PUT)",
        algorithm: Algorithm::RampFast,
        transport: "tcp",
    },
    Method {
        id: "ramp-fast-writepoll",
        label: "RAMP-Fast GET+/PUT+ (writepoll)",
        paper_name: "Proposed(GET+, PUT+)",
        algorithm: Algorithm::RampFast,
        transport: "writepoll",
    },
    Method {
        id: "ramp-fast-onesided",
        label: "RAMP-Fast GET*/PUT+ (onesided)",
        paper_name: "Proposed(GET*, PUT+)",
        algorithm: Algorithm::RampFast,
        transport: "onesided",
    },
];

/// The sweeps to run and their x values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepPlan {
    pub sweep: Sweep,
    /// Ignored for [`Sweep::Comm`] (its points are the transports).
    pub xs: Vec<f64>,
}

/// Everything that defines a figure run.
#[derive(Debug, Clone, Serialize)]
pub struct FiguresConfig {
    pub mode: Mode,
    /// Output directory (created if missing; files in it are overwritten).
    pub out: PathBuf,
    /// Seed of every point (all points draw the same transaction stream for the same x).
    pub seed: u64,
    /// Measured seconds per point.
    pub point_seconds: f64,
    pub sweeps: Vec<SweepPlan>,
    /// What every point shares: servers, clients, keys, micro-benchmark value size. Its
    /// algorithm, transport, transaction size, read ratio, workload and stop condition are
    /// set per point.
    pub base: BenchConfig,
    /// Bytes per value of the YCSB sweep.
    pub ycsb_value_size: usize,
    /// Check every point's history for read atomicity (slower; the numbers are then not
    /// comparable with unchecked runs).
    pub check: bool,
}

impl FiguresConfig {
    /// The paper's configuration: 4 servers, 8 clients, 1,000 keys, 1 KiB values (1,000 B for
    /// YCSB), uniform micro-benchmark keys; every sweep with the mode's points and duration.
    pub fn new(mode: Mode, out: PathBuf, seed: u64) -> Self {
        let base = BenchConfig {
            servers: 4,
            clients: 8,
            keys: 1_000,
            value_size: 1_024,
            workload: Workload::Micro { zipfian: false },
            // The paper's clients find every item at start-up (its address table is filled
            // at initialisation): the keys exist before the measured window.
            preload: true,
            seed,
            ..BenchConfig::default()
        };
        Self {
            mode,
            out,
            seed,
            point_seconds: match mode {
                Mode::Quick => QUICK_POINT_SECONDS,
                Mode::Full => FULL_POINT_SECONDS,
            },
            sweeps: Sweep::ALL.into_iter().map(|sweep| SweepPlan { sweep, xs: sweep.xs(mode) }).collect(),
            base,
            ycsb_value_size: YCSB_VALUE_BYTES,
            check: false,
        }
    }

    /// Keeps only the named sweeps (in the paper's order).
    pub fn keep_only(&mut self, sweeps: &[Sweep]) {
        self.sweeps.retain(|plan| sweeps.contains(&plan.sweep));
    }

    /// Checks the run's own settings and every point's benchmark configuration.
    pub fn validate(&self) -> Result<(), FiguresError> {
        if !(self.point_seconds > 0.0 && self.point_seconds <= POINT_SECONDS_MAX) {
            return Err(FiguresError::PointSeconds { seconds: self.point_seconds });
        }
        if self.sweeps.is_empty() {
            return Err(FiguresError::NoFigure);
        }
        for plan in &self.sweeps {
            for point in self.points(plan) {
                point.config.validate().map_err(|error| FiguresError::Point {
                    figure: plan.sweep.name(),
                    point: point.file_stem.clone(),
                    error: Box::new(error),
                })?;
            }
        }
        Ok(())
    }

    /// The series of a sweep: for comm, one RAMP-Fast series over every transport; for the
    /// others, every method whose transport exists.
    fn series_of(&self, sweep: Sweep) -> Vec<SeriesSpec> {
        match sweep {
            Sweep::Comm => vec![SeriesSpec {
                id: "ramp-fast".into(),
                label: "RAMP-Fast".into(),
                paper_name: "RAMP-Fast over Eth / IPoIB / Verbs / RDMA".into(),
                algorithm: Algorithm::RampFast,
                transport: None,
            }],
            _ => METHODS
                .iter()
                .filter_map(|method| {
                    method.transport_kind().map(|transport| SeriesSpec {
                        id: method.id.into(),
                        label: method.label.into(),
                        paper_name: method.paper_name.into(),
                        algorithm: method.algorithm,
                        transport: Some(transport),
                    })
                })
                .collect(),
        }
    }

    /// Every point of a sweep, series by series.
    fn points(&self, plan: &SweepPlan) -> Vec<PointSpec> {
        let mut points = Vec::new();
        for (series, spec) in self.series_of(plan.sweep).into_iter().enumerate() {
            match plan.sweep {
                Sweep::Comm => {
                    for (index, &transport) in TransportKind::ALL.iter().enumerate() {
                        let config = self.point_config(plan.sweep, spec.algorithm, transport, 0.0);
                        let file_stem = transport.name().to_string();
                        points.push(PointSpec {
                            series,
                            x: index as f64,
                            category: Some(transport.name().into()),
                            config,
                            file_stem,
                        });
                    }
                }
                _ => {
                    for &x in &plan.xs {
                        let transport = spec.transport.expect("line figures name a transport");
                        let config = self.point_config(plan.sweep, spec.algorithm, transport, x);
                        let file_stem = format!("{}-{}", spec.id, plan.sweep.x_text(x));
                        points.push(PointSpec { series, x, category: None, config, file_stem });
                    }
                }
            }
        }
        points
    }

    fn point_config(&self, sweep: Sweep, algorithm: Algorithm, transport: TransportKind, x: f64) -> BenchConfig {
        let mut config = BenchConfig {
            algorithm,
            transport,
            txn_size: 8,
            read_ratio: 0.95,
            workload: Workload::Micro { zipfian: false },
            stop_after: StopAfter::Duration { seconds: self.point_seconds },
            seed: self.seed,
            check: self.check,
            // One evidence probe per protocol and transport (`probe_pairs`), not one per point.
            probe: false,
            history: None,
            cluster_file: None,
            ..self.base.clone()
        };
        match sweep {
            Sweep::Comm => {}
            Sweep::TxnSize => config.txn_size = x as usize,
            Sweep::ReadRatio => config.read_ratio = x / 100.0,
            Sweep::Ycsb => {
                config.read_ratio = x / 100.0;
                config.workload = Workload::YcsbReadRatio;
                config.value_size = self.ycsb_value_size;
            }
        }
        // GET* slots that hold this point's versions (YCSB's long keys and write sets did not
        // fit the default, so its GET* series was GET+). A configuration the bench refuses
        // keeps the default slots and is refused by the bench with the reason.
        if let Ok(slot_bytes) = config.fitted_item_slot_bytes() {
            config.item_slots.slot_bytes = slot_bytes;
        }
        config
    }
}

impl FiguresConfig {
    /// The (protocol, transport) pairs of the selected sweeps' points, in first-use order, each
    /// with a configuration of that pair (a comm-style point) for its evidence probe;
    /// [`BenchConfig::probe_config`] sets the probe's own workload.
    fn probe_pairs(&self) -> Vec<(Algorithm, TransportKind, BenchConfig)> {
        let mut pairs: Vec<(Algorithm, TransportKind, BenchConfig)> = Vec::new();
        for plan in &self.sweeps {
            for point in self.points(plan) {
                let (algorithm, transport) = (point.config.algorithm, point.config.transport);
                if !pairs.iter().any(|(seen, over, _)| (*seen, *over) == (algorithm, transport)) {
                    pairs.push((algorithm, transport, self.point_config(Sweep::Comm, algorithm, transport, 0.0)));
                }
            }
        }
        pairs
    }
}

struct SeriesSpec {
    id: String,
    label: String,
    paper_name: String,
    algorithm: Algorithm,
    /// `None` for comm, whose single series runs over every transport.
    transport: Option<TransportKind>,
}

struct PointSpec {
    series: usize,
    x: f64,
    category: Option<String>,
    config: BenchConfig,
    file_stem: String,
}

/// Why a figure run stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FiguresError {
    #[error("the point duration must be within (0, {POINT_SECONDS_MAX}] s, got {seconds}")]
    PointSeconds { seconds: f64 },
    #[error("no figure selected")]
    NoFigure,
    #[error("figure {figure} point {point}: {error}")]
    Point { figure: &'static str, point: String, error: Box<BenchError> },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot encode a result: {0}")]
    Encode(#[from] serde_json::Error),
}

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct PointOutcome {
    pub x: f64,
    /// The transport, for comm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Throughput in transactions per second (NaN, serialized as null, when the point failed).
    pub throughput_txn_per_s: f64,
    pub read_p50_us: u64,
    pub read_p99_us: u64,
    pub write_p50_us: u64,
    pub write_p99_us: u64,
    pub transactions: u64,
    pub failed_transactions: u64,
    /// The read-atomicity verdict and its evidence, when checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<PointCheck>,
    /// How an RF-RPC point batched frames into calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batching: Option<BatchStats>,
    /// The full result, relative to the output directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_file: Option<String>,
    /// Why the point has no result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A point's read-atomicity check: the verdict and the evidence behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PointCheck {
    pub verdict: Verdict,
    pub evidence: Evidence,
}

impl PointCheck {
    /// Whether the check found an anomaly (violated, or not checkable).
    pub fn found_anomaly(&self) -> bool {
        matches!(self.verdict, Verdict::Violated | Verdict::NotCheckable)
    }
}

/// The evidence probe of one protocol over one transport (`--check`): the points' own
/// histories are short and, at 95% reads over 1,000 keys, race seldom, so each pair gets one
/// short run under contention whose verdict has teeth (docs/figures.md).
#[derive(Debug, Clone, Serialize)]
pub struct ProbeOutcome {
    pub protocol: &'static str,
    pub transport: &'static str,
    /// The probe's verdict and evidence (none if it failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<PointCheck>,
    /// Its one-line summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Why it has no result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ProbeOutcome {
    fn name(&self) -> String {
        format!("evidence probe {} over {}", self.protocol, self.transport)
    }
}

/// One line (or the bars) of a figure.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesOutcome {
    pub id: String,
    pub label: String,
    pub paper_name: String,
    pub points: Vec<PointOutcome>,
}

/// One figure's results.
#[derive(Debug, Clone, Serialize)]
pub struct SweepOutcome {
    pub sweep: Sweep,
    pub series: Vec<SeriesOutcome>,
    /// Methods left out because this build lacks their transport ("label: why").
    pub unavailable: Vec<String>,
    /// The Markdown table and the SVG plot, relative to the output directory.
    pub table_file: String,
    pub svg_file: String,
}

impl SweepOutcome {
    /// Throughput of series `id` at `x` (comm: of transport `id`), if measured.
    pub fn throughput(&self, id: &str, x: f64) -> Option<f64> {
        let point = if self.sweep == Sweep::Comm {
            self.series.first()?.points.iter().find(|point| point.category.as_deref() == Some(id))?
        } else {
            self.series.iter().find(|series| series.id == id)?.points.iter().find(|point| point.x == x)?
        };
        Some(point.throughput_txn_per_s).filter(|throughput| throughput.is_finite())
    }
}

/// A whole figure run.
#[derive(Debug, Clone, Serialize)]
pub struct FiguresOutcome {
    pub config: FiguresConfig,
    pub git_commit: String,
    pub machine: bench::MachineInfo,
    /// `/proc/loadavg` before and after the run (other work on the machine skews numbers).
    pub load_before: String,
    pub load_after: String,
    pub sweeps: Vec<SweepOutcome>,
    /// One evidence probe per (protocol, transport) pair of the points (`check` only).
    pub probes: Vec<ProbeOutcome>,
    /// Where `index.md` was written (inside `config.out`).
    pub index_file: PathBuf,
}

impl FiguresOutcome {
    /// Points that failed or whose check found anomalies ("figure point: why").
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for sweep in &self.sweeps {
            for series in &sweep.series {
                for point in &series.points {
                    let name = point.category.clone().unwrap_or_else(|| sweep.sweep.x_text(point.x));
                    if let Some(error) = &point.error {
                        problems.push(format!("{} {} {name}: {error}", sweep.sweep.name(), series.label));
                    } else if let Some(check) = point.check.filter(PointCheck::found_anomaly) {
                        problems.push(format!(
                            "{} {} {name}: read atomicity {}",
                            sweep.sweep.name(),
                            series.label,
                            check.verdict.label()
                        ));
                    }
                }
            }
        }
        for probe in &self.probes {
            if let Some(error) = &probe.error {
                problems.push(format!("{}: {error}", probe.name()));
            } else if let Some(check) = probe.check.filter(PointCheck::found_anomaly) {
                problems.push(format!("{}: read atomicity {}", probe.name(), check.verdict.label()));
            }
        }
        problems
    }

    /// Evidence probes that found no anomaly but too few races to prove the protocol.
    pub fn inconclusive_probes(&self) -> Vec<String> {
        let inconclusive =
            |probe: &&ProbeOutcome| probe.check.is_some_and(|check| check.verdict == Verdict::Inconclusive);
        self.probes.iter().filter(inconclusive).map(ProbeOutcome::name).collect()
    }

    /// Checked points whose history showed no anomaly but too little concurrency to prove
    /// anything ("figure series point"). Not problems: a point at 100% reads has no write to
    /// race, and a short quick-mode point few races.
    pub fn inconclusive_points(&self) -> Vec<String> {
        let mut points = Vec::new();
        for sweep in &self.sweeps {
            for series in &sweep.series {
                for point in &series.points {
                    if point.check.is_some_and(|check| check.verdict == Verdict::Inconclusive) {
                        let name = point.category.clone().unwrap_or_else(|| sweep.sweep.x_text(point.x));
                        points.push(format!("{} {} {name}", sweep.sweep.name(), series.label));
                    }
                }
            }
        }
        points
    }
}

/// Number of benchmark points `config` runs (for a progress bar).
pub fn point_count(config: &FiguresConfig) -> usize {
    config.sweeps.iter().map(|plan| config.points(plan).len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_names_round_trip_and_unknown_ones_list_the_choices() {
        for sweep in Sweep::ALL {
            assert_eq!(Sweep::from_name(sweep.name()), Ok(sweep));
        }
        let error = Sweep::from_name("fig9").unwrap_err().to_string();
        assert!(error.contains("comm, txnsize, readratio, ycsb"), "{error}");
    }

    #[test]
    fn a_method_is_available_exactly_when_its_transport_is_in_the_build() {
        for method in METHODS {
            let known = TransportKind::ALL.iter().any(|kind| kind.name() == method.transport);
            assert_eq!(method.transport_kind().is_some(), known, "{}", method.id);
        }
        // The baselines always exist.
        assert!(METHODS[0].transport_kind() == Some(TransportKind::Tcp));
        assert!(METHODS[1].transport_kind() == Some(TransportKind::Tcp));
    }

    #[test]
    fn points_carry_the_paper_s_parameters_and_the_swept_value() {
        let config = FiguresConfig::new(Mode::Full, "out".into(), 9);
        config.validate().unwrap();
        let available = METHODS.iter().filter(|method| method.transport_kind().is_some()).count();
        for plan in &config.sweeps {
            let points = config.points(plan);
            let expected = match plan.sweep {
                Sweep::Comm => TransportKind::ALL.len(),
                _ => available * plan.xs.len(),
            };
            assert_eq!(points.len(), expected, "{:?}", plan.sweep);
            for point in &points {
                let bench = &point.config;
                assert_eq!((bench.servers, bench.clients, bench.keys, bench.seed), (4, 8, 1_000, 9));
                assert_eq!(bench.stop_after, StopAfter::Duration { seconds: FULL_POINT_SECONDS });
                match plan.sweep {
                    Sweep::Comm => {
                        assert_eq!((bench.txn_size, bench.read_ratio), (8, 0.95));
                        assert_eq!(bench.algorithm, Algorithm::RampFast);
                        assert_eq!(point.category.as_deref(), Some(bench.transport.name()));
                    }
                    Sweep::TxnSize => assert_eq!((bench.txn_size, bench.read_ratio), (point.x as usize, 0.95)),
                    Sweep::ReadRatio => {
                        assert_eq!((bench.txn_size, bench.read_ratio), (8, point.x / 100.0));
                        assert_eq!(bench.workload, Workload::Micro { zipfian: false });
                    }
                    Sweep::Ycsb => {
                        assert_eq!((bench.txn_size, bench.read_ratio), (8, point.x / 100.0));
                        assert_eq!((bench.workload, bench.value_size), (Workload::YcsbReadRatio, YCSB_VALUE_BYTES));
                    }
                }
            }
        }
        let mut quick = FiguresConfig::new(Mode::Quick, "out".into(), 1);
        quick.keep_only(&[Sweep::TxnSize]);
        assert_eq!(quick.sweeps.len(), 1);
        assert!(quick.sweeps[0].xs.contains(&4.0), "the paper's ratios are at size 4");
        assert_eq!(point_count(&quick), available * 3);
    }

    #[test]
    fn bad_durations_and_empty_selections_are_refused() {
        let mut config = FiguresConfig::new(Mode::Quick, "out".into(), 1);
        for bad in [0.0, -1.0, f64::NAN, POINT_SECONDS_MAX * 2.0] {
            config.point_seconds = bad;
            assert!(config.validate().is_err(), "{bad}");
        }
        config.point_seconds = 1.0;
        config.keep_only(&[]);
        assert!(config.validate().unwrap_err().to_string().contains("no figure"));
        let mut config = FiguresConfig::new(Mode::Quick, "out".into(), 1);
        config.sweeps = vec![SweepPlan { sweep: Sweep::TxnSize, xs: vec![0.0] }];
        assert!(config.validate().unwrap_err().to_string().contains("--txn-size"));
    }
}
