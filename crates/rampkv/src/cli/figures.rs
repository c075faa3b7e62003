//! `rampkv figures`: the reference paper's four figures as benchmark sweeps (SVG plots,
//! Markdown tables, every point's result; docs/figures.md). Exit status 1 when a point failed
//! or (with `--check`) showed an anomaly.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use rampkv::figures;
use rampkv::progress::{Goal, ProgressBar};

use super::output::{out, say};
use super::parse::parse_duration;

#[derive(Debug, Args)]
pub(crate) struct FiguresArgs {
    /// Fewer points of a fraction of a second each: a smoke test for CI (the default).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Every point, seconds each: for numbers, on a quiet machine.
    #[arg(long)]
    full: bool,
    /// Output directory (index.md, NAME.md, NAME.svg, summary.json, results/).
    #[arg(long, default_value = "target/figures")]
    out: PathBuf,
    /// Only these figures (comma-separated): comm, txnsize, readratio, ycsb.
    #[arg(long, value_delimiter = ',', value_parser = figures::Sweep::from_name)]
    only: Vec<figures::Sweep>,
    /// Seed of every point.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Measured time per point instead of the mode's (e.g. 2s, 500ms).
    #[arg(long)]
    point_duration: Option<String>,
    /// Check every point's history for read atomicity (slower; exit status 1 on any anomaly).
    /// Each point's verdict and evidence go into its table; an inconclusive point (at 100%
    /// reads there is nothing to race) does not change the exit status.
    #[arg(long)]
    check: bool,
}

pub(crate) fn run(args: FiguresArgs) -> Result<ExitCode> {
    let mode = if args.full { figures::Mode::Full } else { figures::Mode::Quick };
    let mut config = figures::FiguresConfig::new(mode, args.out, args.seed);
    if !args.only.is_empty() {
        config.keep_only(&args.only);
    }
    if let Some(text) = &args.point_duration {
        config.point_seconds = parse_duration(text)?.as_secs_f64();
    }
    config.check = args.check;
    config.validate()?;
    let points = figures::point_count(&config);
    say!(
        "rampkv figures: {points} points of {} s ({:?} mode), seed {}, into {}",
        config.point_seconds,
        mode,
        config.seed,
        config.out.display()
    );
    let progress = ProgressBar::new(Goal::Steps { total: points as u64 }, "starting");
    let outcome = figures::run(&config, &progress);
    progress.finish();
    let outcome = outcome?;
    for sweep in &outcome.sweeps {
        out!(
            "{}: {} and {}",
            sweep.sweep.title(),
            config.out.join(&sweep.table_file).display(),
            config.out.join(&sweep.svg_file).display()
        );
        for missing in &sweep.unavailable {
            out!("  not in this build: {missing}");
        }
    }
    out!("index: {}", outcome.index_file.display());
    let problems = outcome.problems();
    for problem in &problems {
        say!("rampkv figures: {problem}");
    }
    let inconclusive = outcome.inconclusive_points();
    if !inconclusive.is_empty() {
        say!(
            "rampkv figures: read atomicity INCONCLUSIVE at {} of {points} points (no anomaly, too few races to prove \
             anything; the evidence is in each figure's table)",
            inconclusive.len()
        );
    }
    let inconclusive_probes = outcome.inconclusive_probes();
    if !inconclusive_probes.is_empty() {
        say!(
            "rampkv figures: read atomicity INCONCLUSIVE for {} (no anomaly, too few races in the probe's time cap)",
            inconclusive_probes.join(", ")
        );
    }
    for probe in &outcome.probes {
        if let Some(summary) = &probe.summary {
            out!("{} over {}: {summary}", probe.protocol, probe.transport);
        }
    }
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
