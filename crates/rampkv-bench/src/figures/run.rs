//! Running a figure run: every point of every selected sweep, one benchmark run after
//! another, then the output directory (`index.md`, `summary.json`, per sweep `NAME.md` and
//! `NAME.svg`, and `results/NAME/POINT.json`).
//!
//! # Contract (fault model)
//! A point whose benchmark fails (or whose read-atomicity check fails, with `check`) is
//! recorded with its error, left out of the plot, marked in the table, and the run goes on;
//! [`FiguresOutcome::problems`] lists them so the command can exit non-zero. A checked point
//! whose history is inconclusive (no anomaly, too little concurrency to prove anything) is no
//! problem: each sweep's page has a table of every point's verdict and evidence. Failing to
//! write an output file stops the run with an error.
//!
//! Points run one after another, each with its own embedded cluster, so they never share the
//! cores with each other (the machine has two).

use std::path::Path;

use super::report;
use super::{
    FiguresConfig, FiguresError, FiguresOutcome, PointCheck, PointOutcome, PointSpec, ProbeOutcome, SeriesOutcome,
    Sweep, SweepOutcome, SweepPlan, METHODS,
};
use crate::bench::{self, BenchResult};
use crate::progress::ProgressBar;

/// Runs every point of every selected sweep and writes the output directory: `index.md`,
/// `summary.json`, per sweep `NAME.md` and `NAME.svg`, and `results/NAME/POINT.json`.
pub fn run(config: &FiguresConfig, progress: &ProgressBar) -> Result<FiguresOutcome, FiguresError> {
    config.validate()?;
    let load_before = load_average();
    create_dir(&config.out)?;
    let mut sweeps = Vec::with_capacity(config.sweeps.len());
    let mut git_commit = None;
    for plan in &config.sweeps {
        let outcome = run_sweep(config, plan, progress, &mut git_commit)?;
        write_file(&config.out.join(&outcome.table_file), report::sweep_markdown(config, &outcome).as_bytes())?;
        write_file(&config.out.join(&outcome.svg_file), report::sweep_plot(config, &outcome).to_svg().as_bytes())?;
        sweeps.push(outcome);
    }
    let probes = if config.check { run_probes(config, progress) } else { Vec::new() };
    let outcome = FiguresOutcome {
        config: config.clone(),
        git_commit: git_commit.unwrap_or_else(|| "unknown".into()),
        machine: bench::MachineInfo::current(),
        load_before,
        load_after: load_average(),
        sweeps,
        probes,
        index_file: config.out.join("index.md"),
    };
    write_file(&config.out.join("summary.json"), serde_json::to_string_pretty(&outcome)?.as_bytes())?;
    write_file(&outcome.index_file, report::index_markdown(&outcome).as_bytes())?;
    Ok(outcome)
}

fn run_sweep(
    config: &FiguresConfig,
    plan: &SweepPlan,
    progress: &ProgressBar,
    git_commit: &mut Option<String>,
) -> Result<SweepOutcome, FiguresError> {
    let name = plan.sweep.name();
    let results_dir = Path::new("results").join(name);
    create_dir(&config.out.join(&results_dir))?;
    let specs = config.series_of(plan.sweep);
    let mut series: Vec<SeriesOutcome> = specs
        .iter()
        .map(|spec| SeriesOutcome {
            id: spec.id.clone(),
            label: spec.label.clone(),
            paper_name: spec.paper_name.clone(),
            points: Vec::new(),
        })
        .collect();
    for point in config.points(plan) {
        progress.set_message(format!("{name}: {}", point.file_stem));
        let result_file = results_dir.join(format!("{}.json", point.file_stem));
        let outcome = match bench::run(&point.config) {
            Ok(result) => {
                write_file(&config.out.join(&result_file), serde_json::to_string_pretty(&result)?.as_bytes())?;
                git_commit.get_or_insert_with(|| result.git_commit.clone());
                measured_point(&point, &result, &result_file)
            }
            Err(error) => failed_point(&point, error.to_string()),
        };
        series[point.series].points.push(outcome);
        progress.inc();
    }
    let unavailable = match plan.sweep {
        Sweep::Comm => Vec::new(),
        _ => METHODS
            .iter()
            .filter(|method| method.transport_kind().is_none())
            .map(|method| format!("{}: this build has no transport `{}`", method.label, method.transport))
            .collect(),
    };
    Ok(SweepOutcome {
        sweep: plan.sweep,
        series,
        unavailable,
        table_file: format!("{name}.md"),
        svg_file: format!("{name}.svg"),
    })
}

/// One evidence probe per (protocol, transport) pair, each on a fresh embedded cluster.
fn run_probes(config: &FiguresConfig, progress: &ProgressBar) -> Vec<ProbeOutcome> {
    config
        .probe_pairs()
        .into_iter()
        .map(|(algorithm, transport, bench_config)| {
            progress.set_message(format!("evidence probe: {} over {}", algorithm.name(), transport.name()));
            let (check, summary, error) = match bench::probe_alone(&bench_config) {
                Ok(probe) => (
                    Some(PointCheck { verdict: probe.check.verdict(), evidence: probe.check.evidence }),
                    Some(probe.summary()),
                    None,
                ),
                Err(error) => (None, None, Some(error.to_string())),
            };
            ProbeOutcome { protocol: algorithm.name(), transport: transport.name(), check, summary, error }
        })
        .collect()
}

fn measured_point(point: &PointSpec, result: &BenchResult, result_file: &Path) -> PointOutcome {
    PointOutcome {
        x: point.x,
        category: point.category.clone(),
        throughput_txn_per_s: result.throughput_txn_per_s,
        read_p50_us: result.read.p50_us,
        read_p99_us: result.read.p99_us,
        write_p50_us: result.write.p50_us,
        write_p99_us: result.write.p99_us,
        transactions: result.transactions,
        failed_transactions: result.failed_transactions,
        check: result.check.as_ref().map(|report| PointCheck { verdict: report.verdict(), evidence: report.evidence }),
        batching: result.batching,
        result_file: Some(result_file.to_string_lossy().replace('\\', "/")),
        error: None,
    }
}

fn failed_point(point: &PointSpec, error: String) -> PointOutcome {
    PointOutcome {
        x: point.x,
        category: point.category.clone(),
        throughput_txn_per_s: f64::NAN,
        read_p50_us: 0,
        read_p99_us: 0,
        write_p50_us: 0,
        write_p99_us: 0,
        transactions: 0,
        failed_transactions: 0,
        check: None,
        batching: None,
        result_file: None,
        error: Some(error),
    }
}

fn create_dir(path: &Path) -> Result<(), FiguresError> {
    std::fs::create_dir_all(path).map_err(|source| FiguresError::Write { path: path.to_path_buf(), source })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), FiguresError> {
    std::fs::write(path, bytes).map_err(|source| FiguresError::Write { path: path.to_path_buf(), source })
}

/// The first three fields of `/proc/loadavg` ("unknown" elsewhere).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .filter(|load| !load.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
