//! `rampkv bench --compare`: one configuration run over every transport in turn, and a table of
//! the results side by side with ratios to TCP (the analog of the paper's communication-type
//! figure for whatever configuration the user chose).
//!
//! The runs are sequential, each with its own embedded cluster, so they never share the cores.

use std::fmt::Write as _;

use super::{run, BenchConfig, BenchError, BenchResult, ConfigError, TransportKind};

/// Runs `config` over each of `transports` (the transport in `config` is ignored), in order.
/// `on_result` sees each result as it comes (for progress output).
///
/// # Errors
/// The first run that fails; the results before it are lost with it, as a partial comparison
/// would mislead.
pub fn run_each(
    config: &BenchConfig,
    transports: &[TransportKind],
    mut on_result: impl FnMut(&BenchResult),
) -> Result<Vec<BenchResult>, BenchError> {
    if config.cluster_file.is_some() && transports.contains(&TransportKind::InProcess) {
        let why = "inprocess needs the embedded cluster: leave it out with --cluster";
        return Err(ConfigError::NotTogether { what: "--compare", why }.into());
    }
    let mut results = Vec::with_capacity(transports.len());
    for &transport in transports {
        let result = run(&BenchConfig { transport, ..config.clone() })?;
        on_result(&result);
        results.push(result);
    }
    Ok(results)
}

/// A Markdown table of `results`: throughput with its ratio to the TCP run (or to the first
/// run when there is no TCP run), latency percentiles, round-2 share and the checker's verdict
/// with its evidence (races: reads whose round 1 alone was fractured; overlaps: reads that
/// overlapped a write of their keys by another client).
pub fn comparison_table(results: &[BenchResult]) -> String {
    let baseline = results
        .iter()
        .find(|result| result.transport == TransportKind::Tcp.name())
        .or(results.first())
        .map_or(f64::NAN, |result| result.throughput_txn_per_s);
    let mut table = String::new();
    table.push_str(
        "| transport | txn/s | vs tcp | read p50 µs | read p99 µs | write p50 µs | write p99 µs | round-2 reads | client CPU µs/txn | failed | checker |\n",
    );
    table.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for result in results {
        let checker = match (&result.check, &result.probe) {
            (None, _) => "not run".to_owned(),
            (Some(report), None) => format!(
                "{} ({} races, {} overlaps)",
                report.verdict().label(),
                report.evidence.round1_fractured_reads,
                report.evidence.overlapping_reads
            ),
            (Some(report), Some(probe)) => format!(
                "{} (workload {}: {} races, {} overlaps; evidence probe {}: {} races)",
                result.verdict.unwrap_or_default().label(),
                report.verdict().label(),
                report.evidence.round1_fractured_reads,
                report.evidence.overlapping_reads,
                probe.check.verdict().label(),
                probe.check.evidence.round1_fractured_reads
            ),
        };
        let _ = writeln!(
            table,
            "| {} | {:.0} | {:.2}x | {} | {} | {} | {} | {:.2}% | {} | {} | {} |",
            result.transport,
            result.throughput_txn_per_s,
            result.throughput_txn_per_s / baseline,
            result.read.p50_us,
            result.read.p99_us,
            result.write.p50_us,
            result.write.p99_us,
            result.round2.fraction_of_reads * 100.0,
            result.client_cpu_us_per_txn.map_or("-".to_string(), |cpu| format!("{cpu:.1}")),
            result.failed_transactions,
            checker,
        );
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::StopAfter;

    #[test]
    fn every_transport_runs_and_the_table_has_a_row_each_with_ratios_to_tcp() {
        let config = BenchConfig {
            clients: 4,
            keys: 100,
            txn_size: 4,
            value_size: 64,
            check: true,
            probe: false, // the table's checker column without a probe: the workload's verdict
            stop_after: StopAfter::Transactions { count: 400 },
            seed: 7,
            ..BenchConfig::default()
        };
        let mut seen = Vec::new();
        let results = run_each(&config, TransportKind::ALL, |result| seen.push(result.transport)).unwrap();
        let names: Vec<&str> = TransportKind::ALL.iter().map(|kind| kind.name()).collect();
        assert_eq!(seen, names);
        for result in &results {
            assert!(result.transactions >= 400, "{}: {} transactions", result.transport, result.transactions);
            assert!(result.check.as_ref().is_some_and(|report| report.is_clean()), "{}", result.transport);
        }
        let table = comparison_table(&results);
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(rows.len(), results.len(), "{table}");
        for ((row, name), result) in rows.iter().zip(&names).zip(&results) {
            assert!(row.starts_with(&format!("| {name} |")), "{row}");
            let report = result.check.as_ref().unwrap();
            let checker = format!(
                "| {} ({} races, {} overlaps) |",
                report.verdict().label(),
                report.evidence.round1_fractured_reads,
                report.evidence.overlapping_reads
            );
            assert!(row.ends_with(&checker), "{row}");
        }
        assert!(rows[0].contains("| 1.00x |"), "TCP is its own baseline: {}", rows[0]);
    }

    #[test]
    fn the_in_process_transport_runs_clean_s2pl_included_and_refuses_a_cluster_file() {
        let config = BenchConfig {
            clients: 4,
            client_threads: 2,
            keys: 50,
            txn_size: 4,
            read_ratio: 0.5,
            value_size: 64,
            check: true,
            probe: false,
            stop_after: StopAfter::Transactions { count: 2_000 },
            seed: 11,
            transport: TransportKind::InProcess,
            ..BenchConfig::default()
        };
        let result = run(&config).unwrap();
        assert!(result.transactions >= 2_000 && result.failed_transactions == 0, "{result}");
        let report = result.check.as_ref().unwrap();
        assert!(report.is_clean() && report.reads_checked > 0, "{report}");
        // S2PL's deferred lock grants reach in-process clients through their inboxes.
        let s2pl = BenchConfig { algorithm: rampkv_core::protocol::ramp::Algorithm::S2pl, ..config.clone() };
        let result = run(&s2pl).unwrap();
        assert!(result.transactions >= 2_000 && result.failed_transactions == 0, "{result}");
        let report = result.check.as_ref().unwrap();
        assert!(report.is_clean() && report.reads_checked > 0, "{report}");
        let external = BenchConfig { cluster_file: Some("cluster.toml".into()), ..config };
        assert!(run(&external).unwrap_err().to_string().contains("--cluster"));
    }

    #[test]
    fn a_cluster_file_with_the_in_process_transport_is_refused_before_anything_runs() {
        let config = BenchConfig { cluster_file: Some("cluster.toml".into()), ..BenchConfig::default() };
        let mut ran = false;
        let with_in_process = [TransportKind::Tcp, TransportKind::InProcess];
        let error = run_each(&config, &with_in_process, |_| ran = true).unwrap_err();
        assert!(error.to_string().contains("--compare"), "{error}");
        assert!(error.to_string().contains("inprocess"), "{error}");
        assert!(!ran);
    }

    #[test]
    fn a_cluster_file_without_the_in_process_transport_is_run_against_and_a_missing_one_named() {
        let directory = tempfile::tempdir().unwrap();
        let missing = directory.path().join("no-such-cluster.toml");
        let config = BenchConfig { cluster_file: Some(missing.clone()), ..BenchConfig::default() };
        let mut ran = false;
        let error = run_each(&config, TransportKind::ALL, |_| ran = true).unwrap_err();
        assert!(error.to_string().contains("no-such-cluster.toml"), "{error}");
        assert!(!ran);
    }
}
