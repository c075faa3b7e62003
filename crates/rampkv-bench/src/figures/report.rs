//! The Markdown tables, the plots and the index of a figure run.

use std::fmt::Write as _;

use super::svg::{Plot, Scale, Series, XAxis};
use super::{FiguresConfig, FiguresOutcome, Mode, PointOutcome, Sweep, SweepOutcome, PAPER_RATIOS};
use crate::checker::RACES_MIN;

/// What every page says about the numbers.
const EMULATION_NOTE: &str = "One-sided transports (writepoll = GET+/PUT+, and any other \
    non-TCP transport) run over rampkv's shared-memory EMULATION of an RDMA fabric on one \
    machine: no NIC, no RDMA hardware. TCP is loopback TCP. Servers and clients share the \
    machine's cores. These are not the paper's InfiniBand numbers; compare ratios, not values.";

/// The plot of a sweep.
pub(super) fn sweep_plot(config: &FiguresConfig, outcome: &SweepOutcome) -> Plot {
    let series = outcome
        .series
        .iter()
        .map(|series| Series {
            name: series.label.clone(),
            points: series.points.iter().map(|point| (point.x, point.throughput_txn_per_s)).collect(),
        })
        .collect();
    let x_axis = match outcome.sweep {
        Sweep::Comm => XAxis::Categories(
            outcome
                .series
                .first()
                .map(|series| series.points.iter().filter_map(|point| point.category.clone()).collect())
                .unwrap_or_default(),
        ),
        Sweep::TxnSize => XAxis::Numeric { scale: Scale::Log2, ticks: planned_xs(config, outcome.sweep) },
        Sweep::ReadRatio | Sweep::Ycsb => {
            XAxis::Numeric { scale: Scale::Linear, ticks: vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0] }
        }
    };
    Plot {
        title: outcome.sweep.title().into(),
        subtitle: [setting(config, outcome.sweep), mode_words(config)],
        x_label: outcome.sweep.x_label().into(),
        y_label: "throughput (transactions/s)".into(),
        x_axis,
        series,
    }
}

fn planned_xs(config: &FiguresConfig, sweep: Sweep) -> Vec<f64> {
    config.sweeps.iter().find(|plan| plan.sweep == sweep).map(|plan| plan.xs.clone()).unwrap_or_default()
}

/// The fixed parameters of a sweep, in words.
fn setting(config: &FiguresConfig, sweep: Sweep) -> String {
    let base = &config.base;
    let shared = format!("{} servers, {} clients, {} keys", base.servers, base.clients, base.keys);
    match sweep {
        Sweep::Comm => format!("RAMP-Fast, micro, 95% reads, 8 ops/txn, {shared}, {} B values", base.value_size),
        Sweep::TxnSize => format!("micro, 95% reads, {shared}, {} B values", base.value_size),
        Sweep::ReadRatio => format!("micro, 8 ops/txn, {shared}, {} B values", base.value_size),
        Sweep::Ycsb => format!("YCSB zipfian, 8 ops/txn, {shared}, {} B values", config.ycsb_value_size),
    }
}

fn mode_words(config: &FiguresConfig) -> String {
    let mode = match config.mode {
        Mode::Quick => "QUICK mode (smoke test, not for comparison)",
        Mode::Full => "full mode",
    };
    format!("{mode}, {} s per point, seed {}", config.point_seconds, config.seed)
}

/// `12,345`, or `failed` for a point without a result.
fn throughput_text(point: &PointOutcome) -> String {
    if !point.throughput_txn_per_s.is_finite() {
        return "failed".into();
    }
    let whole = point.throughput_txn_per_s.round() as u64;
    let digits = whole.to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// A table cell: throughput linked to the point's saved result, plus flags.
fn point_cell(point: &PointOutcome) -> String {
    let mut cell = match &point.result_file {
        Some(file) => format!("[{}]({file})", throughput_text(point)),
        None => throughput_text(point),
    };
    if point.failed_transactions > 0 {
        let _ = write!(cell, " ({} failed txn)", point.failed_transactions);
    }
    if let Some(check) = point.check.filter(super::PointCheck::found_anomaly) {
        let _ = write!(cell, " {}", check.verdict.label());
    }
    cell
}

fn ratio_text(numerator: Option<f64>, denominator: Option<f64>) -> String {
    match (numerator, denominator) {
        (Some(numerator), Some(denominator)) if denominator > 0.0 => format!("{:.2}x", numerator / denominator),
        _ => "n/a".into(),
    }
}

/// A sweep's Markdown page: the plot, every series' throughput, ratios, the paper's ratios.
pub(super) fn sweep_markdown(config: &FiguresConfig, outcome: &SweepOutcome) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "# {}\n", outcome.sweep.title());
    let _ = writeln!(text, "{}; {}.\n", setting(config, outcome.sweep), mode_words(config));
    if config.mode == Mode::Quick {
        let _ = writeln!(text, "**Quick mode: points of {} s, for smoke tests only; run `rampkv figures --full` on a quiet machine for numbers.**\n", config.point_seconds);
    }
    let _ = writeln!(text, "![{}]({})\n", outcome.sweep.title(), outcome.svg_file);
    match outcome.sweep {
        Sweep::Comm => comm_tables(&mut text, outcome),
        _ => line_tables(&mut text, outcome),
    }
    paper_ratio_table(&mut text, outcome);
    check_table(&mut text, outcome);
    if !outcome.unavailable.is_empty() {
        let _ = writeln!(text, "\nNot in this build (left out of the plot and tables):\n");
        for missing in &outcome.unavailable {
            let _ = writeln!(text, "- {missing}");
        }
    }
    let errors: Vec<String> = outcome
        .series
        .iter()
        .flat_map(|series| {
            series.points.iter().filter_map(move |point| {
                point.error.as_ref().map(|error| format!("- {} at {}: {error}", series.label, x_name(outcome, point)))
            })
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(text, "\nFailed points:\n\n{}", errors.join("\n"));
    }
    let _ = writeln!(text, "\n{EMULATION_NOTE}");
    text
}

fn x_name(outcome: &SweepOutcome, point: &PointOutcome) -> String {
    point.category.clone().unwrap_or_else(|| outcome.sweep.x_text(point.x))
}

fn comm_tables(text: &mut String, outcome: &SweepOutcome) {
    let Some(series) = outcome.series.first() else { return };
    let baseline = outcome.throughput("tcp", 0.0);
    let _ = writeln!(text, "| transport | paper's counterpart | {} txn/s | vs tcp | read p50 µs | read p99 µs | write p50 µs | write p99 µs |", series.label);
    let _ = writeln!(text, "|---|---|---:|---:|---:|---:|---:|---:|");
    for point in &series.points {
        let transport = point.category.as_deref().unwrap_or("?");
        let counterpart = match transport {
            "tcp" => "Eth and IPoIB (TCP sockets)",
            "sendrecv" => "Send/Recv verbs",
            "writepoll" => "RDMA-Write (GET+/PUT+)",
            "onesided" => "GET*/PUT+ (not in Fig. 5)",
            _ => "none",
        };
        let _ = writeln!(
            text,
            "| {transport} | {counterpart} | {} | {} | {} | {} | {} | {} |",
            point_cell(point),
            ratio_text(Some(point.throughput_txn_per_s).filter(|value| value.is_finite()), baseline),
            point.read_p50_us,
            point.read_p99_us,
            point.write_p50_us,
            point.write_p99_us
        );
    }
    for point in &series.points {
        if let Some(batching) = point.batching {
            let _ = writeln!(text, "\n{}: {batching}.", point.category.as_deref().unwrap_or("?"));
        }
    }
}

fn line_tables(text: &mut String, outcome: &SweepOutcome) {
    let x_header = match outcome.sweep {
        Sweep::TxnSize => "txn size",
        _ => "read %",
    };
    let xs: Vec<f64> =
        outcome.series.first().map(|series| series.points.iter().map(|p| p.x).collect()).unwrap_or_default();
    let labels: Vec<&str> = outcome.series.iter().map(|series| series.label.as_str()).collect();
    let _ = writeln!(text, "Throughput (transactions per second; each links to the point's full result):\n");
    let _ = writeln!(text, "| {x_header} | {} |", labels.join(" | "));
    let _ = writeln!(text, "|---:|{}", "---:|".repeat(labels.len()));
    for &x in &xs {
        let cells: Vec<String> = outcome
            .series
            .iter()
            .map(|series| series.points.iter().find(|point| point.x == x).map_or("-".into(), point_cell))
            .collect();
        let _ = writeln!(text, "| {} | {} |", outcome.sweep.x_text(x), cells.join(" | "));
    }
    if outcome.series.iter().any(|series| series.id == "ramp-fast-tcp") {
        let _ = writeln!(text, "\nThroughput relative to RAMP-Fast (TCP), the paper's RAMP(GET, PUT):\n");
        let _ = writeln!(text, "| {x_header} | {} |", labels.join(" | "));
        let _ = writeln!(text, "|---:|{}", "---:|".repeat(labels.len()));
        for &x in &xs {
            let baseline = outcome.throughput("ramp-fast-tcp", x);
            let cells: Vec<String> =
                outcome.series.iter().map(|series| ratio_text(outcome.throughput(&series.id, x), baseline)).collect();
            let _ = writeln!(text, "| {} | {} |", outcome.sweep.x_text(x), cells.join(" | "));
        }
    }
    let _ = writeln!(text, "\nRead transaction latency p50 / p99 (µs):\n");
    let _ = writeln!(text, "| {x_header} | {} |", labels.join(" | "));
    let _ = writeln!(text, "|---:|{}", "---:|".repeat(labels.len()));
    for &x in &xs {
        let cells: Vec<String> = outcome
            .series
            .iter()
            .map(|series| {
                series.points.iter().find(|point| point.x == x && point.error.is_none()).map_or("-".into(), |point| {
                    if point.read_p50_us == 0 {
                        "no reads".into()
                    } else {
                        format!("{} / {}", point.read_p50_us, point.read_p99_us)
                    }
                })
            })
            .collect();
        let _ = writeln!(text, "| {} | {} |", outcome.sweep.x_text(x), cells.join(" | "));
    }
}

/// Every checked point's verdict and evidence: races (reads whose round 1 alone was
/// fractured, and how many round 2 repaired) and reads that overlapped a write of their keys.
fn check_table(text: &mut String, outcome: &SweepOutcome) {
    let checked = outcome.series.iter().flat_map(|series| &series.points).any(|point| point.check.is_some());
    if !checked {
        return;
    }
    let _ = writeln!(text, "\n## Read-atomicity check\n");
    let _ = writeln!(
        text,
        "Per point: the verdict; races, reads whose round 1 alone was fractured (a read without RAMP's \
         round-2 repair would have been), and how many round 2 repaired; reads that overlapped in time a \
         write of their keys by another client. INCONCLUSIVE: no anomaly, but fewer than {RACES_MIN} races \
         (docs/history.md, \"Evidence and verdict\").\n"
    );
    let _ = writeln!(text, "| series | point | verdict | races | repaired | overlapping reads |");
    let _ = writeln!(text, "|---|---|---|---:|---:|---:|");
    for series in &outcome.series {
        for point in &series.points {
            let Some(check) = point.check else { continue };
            let evidence = check.evidence;
            let (races, repaired) = match evidence.reads_with_round1 {
                0 => ("not recorded".to_owned(), "-".to_owned()),
                _ => (evidence.round1_fractured_reads.to_string(), evidence.repaired_reads.to_string()),
            };
            let _ = writeln!(
                text,
                "| {} | {} | {} | {races} | {repaired} | {} |",
                series.label,
                x_name(outcome, point),
                check.verdict.label(),
                evidence.overlapping_reads
            );
        }
    }
}

/// The paper's ratios for this sweep beside ours.
fn paper_ratio_table(text: &mut String, outcome: &SweepOutcome) {
    let ratios: Vec<_> = PAPER_RATIOS.iter().filter(|ratio| ratio.sweep == outcome.sweep).collect();
    if ratios.is_empty() {
        return;
    }
    let _ = writeln!(text, "\n## The paper's ratios beside ours\n");
    let _ = writeln!(text, "| paper's comparison | ours | at | paper | ours |");
    let _ = writeln!(text, "|---|---|---|---:|---:|");
    for ratio in ratios {
        let at = match outcome.sweep {
            Sweep::Comm => "95% reads, 8 ops/txn".to_string(),
            Sweep::TxnSize => format!("txn size {}", outcome.sweep.x_text(ratio.at_x)),
            _ => format!("{}% reads", outcome.sweep.x_text(ratio.at_x)),
        };
        let (ours_pair, ours) = match ratio.numerator {
            None => ("no counterpart: both are loopback TCP here".to_string(), "n/a".to_string()),
            Some(numerator) => {
                let pair = format!("{numerator} / {}", ratio.denominator);
                let measured_numerator = outcome.throughput(numerator, ratio.at_x);
                let value = if measured_numerator.is_none() && !has_series(outcome, numerator) {
                    "not in this build".into()
                } else if !has_x(outcome, ratio.at_x) {
                    "not measured".into()
                } else {
                    ratio_text(measured_numerator, outcome.throughput(ratio.denominator, ratio.at_x))
                };
                (pair, value)
            }
        };
        let _ = writeln!(text, "| {} | {ours_pair} | {at} | {:.2}x | {ours} |", ratio.paper_pair, ratio.paper);
    }
}

fn has_series(outcome: &SweepOutcome, id: &str) -> bool {
    match outcome.sweep {
        Sweep::Comm => outcome
            .series
            .first()
            .is_some_and(|series| series.points.iter().any(|point| point.category.as_deref() == Some(id))),
        _ => outcome.series.iter().any(|series| series.id == id),
    }
}

fn has_x(outcome: &SweepOutcome, x: f64) -> bool {
    outcome.sweep == Sweep::Comm || outcome.series.iter().any(|series| series.points.iter().any(|point| point.x == x))
}

/// `index.md`: what ran, where, and links to every table and plot.
pub(super) fn index_markdown(outcome: &FiguresOutcome) -> String {
    let config = &outcome.config;
    let mut text = String::new();
    let _ = writeln!(text, "# rampkv figures\n");
    let _ = writeln!(
        text,
        "The reference paper's four evaluation figures (Murata et al., \"Accelerating RAMP \
         transactions with RDMA\", Fig. 5-8), reproduced by `rampkv figures`.\n"
    );
    if config.mode == Mode::Quick {
        let _ = writeln!(
            text,
            "**QUICK MODE: {} s per point and fewer points; a smoke test, not a measurement.**\n",
            config.point_seconds
        );
    }
    let _ = writeln!(text, "- mode: {}", mode_words(config));
    let _ = writeln!(text, "- commit: {}", outcome.git_commit);
    let _ =
        writeln!(text, "- machine: {} x {}, {}", outcome.machine.cpus, outcome.machine.cpu_model, outcome.machine.os);
    let _ =
        writeln!(text, "- load average (1, 5, 15 min) before: {}; after: {}", outcome.load_before, outcome.load_after);
    let _ = writeln!(text, "- read-atomicity check on every point: {}", if config.check { "yes" } else { "no" });
    let _ = writeln!(text, "- every point's full result (configuration, seed, commit, machine): `results/FIGURE/POINT.json`; all points: [summary.json](summary.json)\n");
    let _ = writeln!(text, "| figure | table | plot | series | points |");
    let _ = writeln!(text, "|---|---|---|---|---:|");
    for sweep in &outcome.sweeps {
        let points: usize = sweep.series.iter().map(|series| series.points.len()).sum();
        let labels: Vec<&str> = sweep.series.iter().map(|series| series.label.as_str()).collect();
        let _ = writeln!(
            text,
            "| {} | [{}]({}) | [{}]({}) | {} | {points} |",
            sweep.sweep.title(),
            sweep.table_file,
            sweep.table_file,
            sweep.svg_file,
            sweep.svg_file,
            labels.join(", ")
        );
    }
    let mut unavailable: Vec<&str> = Vec::new();
    for missing in outcome.sweeps.iter().flat_map(|sweep| &sweep.unavailable) {
        if !unavailable.contains(&missing.as_str()) {
            unavailable.push(missing);
        }
    }
    if !unavailable.is_empty() {
        let _ = writeln!(text, "\nMethods not in this build: {}.", unavailable.join("; "));
    }
    let problems = outcome.problems();
    if !problems.is_empty() {
        let _ = writeln!(text, "\nProblems:\n");
        for problem in problems {
            let _ = writeln!(text, "- {problem}");
        }
    }
    if !outcome.probes.is_empty() {
        let _ = writeln!(
            text,
            "\n## Evidence probes\n\nThe points' own histories (short, mostly reads over 1,000 keys) seldom race \
             enough to prove anything, so each protocol and transport also ran one evidence probe: the same \
             cluster and clients on {} keys, half reads, until {} races or {} s (docs/history.md, \"The evidence \
             probe\"). A probe's anomaly fails the run.\n",
            crate::limits::PROBE_KEYS,
            crate::limits::PROBE_RACES_TARGET,
            crate::limits::PROBE_SECONDS_MAX
        );
        let _ = writeln!(text, "| protocol | transport | verdict | races | repaired | overlapping reads |");
        let _ = writeln!(text, "|---|---|---|---:|---:|---:|");
        for probe in &outcome.probes {
            match (&probe.check, &probe.error) {
                (Some(check), _) => {
                    let _ = writeln!(
                        text,
                        "| {} | {} | {} | {} | {} | {} |",
                        probe.protocol,
                        probe.transport,
                        check.verdict.label(),
                        check.evidence.round1_fractured_reads,
                        check.evidence.repaired_reads,
                        check.evidence.overlapping_reads
                    );
                }
                (None, error) => {
                    let error = error.as_deref().unwrap_or("no result");
                    let _ = writeln!(text, "| {} | {} | failed: {error} | | | |", probe.protocol, probe.transport);
                }
            }
        }
    }
    let inconclusive = outcome.inconclusive_points();
    if !inconclusive.is_empty() {
        let _ = writeln!(
            text,
            "\nRead atomicity INCONCLUSIVE (no anomaly, fewer than {RACES_MIN} races; each figure's page has \
             the evidence) at {} points: {}.",
            inconclusive.len(),
            inconclusive.join(", ")
        );
    }
    let _ = writeln!(text, "\n{EMULATION_NOTE}");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::{Evidence, Verdict};
    use crate::figures::{SeriesOutcome, SweepPlan};
    use rampkv_net::message::BatchStats;

    fn point(x: f64, throughput: f64, error: Option<&str>) -> PointOutcome {
        PointOutcome {
            x,
            category: None,
            throughput_txn_per_s: throughput,
            read_p50_us: 10,
            read_p99_us: 20,
            write_p50_us: 30,
            write_p99_us: 40,
            transactions: 100,
            failed_transactions: 0,
            check: None,
            batching: None,
            result_file: error.is_none().then(|| format!("results/txnsize/x-{x}.json")),
            error: error.map(String::from),
        }
    }

    fn checked(mut point: PointOutcome, verdict: Verdict, races: u64, overlapping_reads: u64) -> PointOutcome {
        let evidence = Evidence {
            reads_with_round1: 100,
            round1_fractured_reads: races,
            repaired_reads: races,
            overlapping_reads,
            ..Evidence::default()
        };
        point.check = Some(super::super::PointCheck { verdict, evidence });
        point
    }

    #[test]
    fn checked_points_show_their_verdict_and_evidence() {
        let config = FiguresConfig::new(Mode::Quick, "out".into(), 1);
        let outcome = SweepOutcome {
            sweep: Sweep::TxnSize,
            series: vec![series(
                "ramp-fast-tcp",
                vec![
                    checked(point(1.0, 1000.0, None), Verdict::Clean, 12, 3456),
                    checked(point(4.0, 900.0, None), Verdict::Inconclusive, 2, 800),
                    checked(point(16.0, 800.0, None), Verdict::Violated, 7, 900),
                ],
            )],
            unavailable: Vec::new(),
            table_file: "txnsize.md".into(),
            svg_file: "txnsize.svg".into(),
        };
        let markdown = sweep_markdown(&config, &outcome);
        assert!(markdown.contains("| RAMP-FAST-TCP | 1 | clean | 12 | 12 | 3456 |"), "{markdown}");
        assert!(markdown.contains("| RAMP-FAST-TCP | 4 | INCONCLUSIVE | 2 | 2 | 800 |"), "{markdown}");
        assert!(markdown.contains("| RAMP-FAST-TCP | 16 | VIOLATED | 7 | 7 | 900 |"), "{markdown}");
        assert!(markdown.contains(" VIOLATED |"), "the throughput cell is marked too: {markdown}");
        let figures = FiguresOutcome {
            config,
            git_commit: "abc".into(),
            machine: crate::bench::MachineInfo::current(),
            load_before: String::new(),
            load_after: String::new(),
            sweeps: vec![outcome],
            probes: vec![
                probe("ramp-fast", "tcp", Verdict::Clean, 20),
                probe("nocc", "tcp", Verdict::Violated, 31),
                probe("s2pl", "tcp", Verdict::Inconclusive, 3),
            ],
            index_file: "out/index.md".into(),
        };
        assert_eq!(
            figures.problems(),
            [
                "txnsize RAMP-FAST-TCP 16: read atomicity VIOLATED",
                "evidence probe nocc over tcp: read atomicity VIOLATED"
            ]
        );
        assert_eq!(figures.inconclusive_points(), ["txnsize RAMP-FAST-TCP 4"]);
        assert_eq!(figures.inconclusive_probes(), ["evidence probe s2pl over tcp"]);
        let index = index_markdown(&figures);
        assert!(index.contains("INCONCLUSIVE") && index.contains("at 1 points: txnsize RAMP-FAST-TCP 4"), "{index}");
        assert!(index.contains("| ramp-fast | tcp | clean | 20 | 20 | 1000 |"), "{index}");
        assert!(index.contains("| nocc | tcp | VIOLATED | 31 | 31 | 1000 |"), "{index}");
    }

    fn probe(
        protocol: &'static str,
        transport: &'static str,
        verdict: Verdict,
        races: u64,
    ) -> super::super::ProbeOutcome {
        let point = checked(point(0.0, 0.0, None), verdict, races, 1000);
        super::super::ProbeOutcome { protocol, transport, check: point.check, summary: None, error: None }
    }

    fn series(id: &str, points: Vec<PointOutcome>) -> SeriesOutcome {
        SeriesOutcome { id: id.into(), label: id.to_uppercase(), paper_name: String::new(), points }
    }

    /// A failed point is marked in the table, listed with its error, left out of the plot, and
    /// the ratios that need it say n/a instead of inventing a number.
    #[test]
    fn a_failed_point_is_marked_listed_and_left_out_of_the_plot() {
        let mut config = FiguresConfig::new(Mode::Full, "out".into(), 1);
        config.sweeps = vec![SweepPlan { sweep: Sweep::TxnSize, xs: vec![1.0, 4.0] }];
        let outcome = SweepOutcome {
            sweep: Sweep::TxnSize,
            series: vec![
                series("ramp-fast-tcp", vec![point(1.0, 1000.0, None), point(4.0, 500.0, None)]),
                series("ramp-fast-writepoll", vec![point(1.0, 1500.0, None), point(4.0, f64::NAN, Some("boom"))]),
            ],
            unavailable: vec!["X: this build has no transport `x`".into()],
            table_file: "txnsize.md".into(),
            svg_file: "txnsize.svg".into(),
        };
        let markdown = sweep_markdown(&config, &outcome);
        assert!(
            markdown.contains("| 1 | [1,000](results/txnsize/x-1.json) | [1,500](results/txnsize/x-1.json) |"),
            "{markdown}"
        );
        assert!(markdown.contains("| 4 | [500](results/txnsize/x-4.json) | failed |"), "{markdown}");
        assert!(markdown.contains("| 1 | 1.00x | 1.50x |"), "{markdown}");
        assert!(markdown.contains("| 4 | 1.00x | n/a |"), "{markdown}");
        assert!(markdown.contains("- RAMP-FAST-WRITEPOLL at 4: boom"), "{markdown}");
        assert!(markdown.contains("| txn size 4 | 2.07x | n/a |"), "{markdown}");
        assert!(markdown.contains("| txn size 4 | 2.78x | not in this build |"), "{markdown}");
        assert!(markdown.contains("- X: this build has no transport `x`"), "{markdown}");
        let plot = sweep_plot(&config, &outcome);
        let svg = plot.to_svg();
        let polylines: Vec<&str> = svg.lines().filter(|line| line.starts_with("<polyline")).collect();
        assert_eq!(polylines.len(), 2);
        assert_eq!(polylines[1].matches(',').count(), 1, "the failed point is not drawn: {}", polylines[1]);
        assert!(!svg.contains("NaN"), "{svg}");
    }

    /// The transport sweep says how RF-RPC batched frames into calls under its table.
    #[test]
    fn the_transport_sweep_shows_how_rfrpc_batched() {
        let config = FiguresConfig::new(Mode::Full, "out".into(), 1);
        let transport = |name: &str, throughput, batching| PointOutcome {
            category: Some(name.into()),
            batching,
            ..point(0.0, throughput, None)
        };
        let batching = BatchStats { calls: 100, frames: 250, size: 64, size_changes: 3 };
        let outcome = SweepOutcome {
            sweep: Sweep::Comm,
            series: vec![series(
                "ramp-fast",
                vec![transport("tcp", 1000.0, None), transport("rfrpc", 2000.0, Some(batching))],
            )],
            unavailable: Vec::new(),
            table_file: "comm.md".into(),
            svg_file: "comm.svg".into(),
        };
        let markdown = sweep_markdown(&config, &outcome);
        let line = "rfrpc: 2.50 frames per call over 100 calls; automatic batch size 64 at the end (3 changes).";
        assert!(markdown.contains(line), "{markdown}");
        assert_eq!(markdown.matches("frames per call").count(), 1, "{markdown}");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(throughput_text(&point(0.0, 1_234_567.4, None)), "1,234,567");
        assert_eq!(throughput_text(&point(0.0, 999.6, None)), "1,000");
        assert_eq!(throughput_text(&point(0.0, 12.0, None)), "12");
        assert_eq!(throughput_text(&point(0.0, f64::INFINITY, None)), "failed");
    }
}
