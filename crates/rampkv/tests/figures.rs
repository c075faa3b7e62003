//! `rampkv figures` and the benchmark's output formats, as a user reads them.
//!
//! - a small figure run (every sweep, tiny points) writes SVG that an XML parser accepts, with
//!   one polyline per series and one marker per point (bars for the transports), a Markdown
//!   table with a column for every series and a row for every point, each cell linking to a
//!   saved result that carries its configuration, seed, commit and machine, and an index
//!   linking every table and plot; every point is checked for read atomicity;
//! - the command line: `--only`, `--point-duration`, no progress output when stderr is not a
//!   terminal, and an unknown figure refused with the choices;
//! - `rampkv bench --ycsb` output read by a parser of YCSB's `[SECTION], Metric, value` lines,
//!   whose numbers agree with the `--json` result of the same run.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use rampkv::bench::TransportKind;
use rampkv::figures::{self, FiguresConfig, Mode, Sweep, SweepPlan, METHODS};
use rampkv::progress::ProgressBar;

fn rampkv(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rampkv")).args(args).output().expect("rampkv runs")
}

/// The methods of the line figures that this build can run, in legend order.
fn available_labels() -> Vec<&'static str> {
    METHODS.iter().filter(|method| method.transport_kind().is_some()).map(|method| method.label).collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The `<g class="series">` elements of a plot, by their `data-series` name.
fn series_groups<'a>(document: &'a roxmltree::Document<'a>) -> Vec<(String, roxmltree::Node<'a, 'a>)> {
    document
        .descendants()
        .filter(|node| node.has_tag_name("g") && node.attribute("class") == Some("series"))
        .map(|node| (node.attribute("data-series").expect("a series is named").to_string(), node))
        .collect()
}

fn legend_texts(document: &roxmltree::Document<'_>) -> Vec<String> {
    let legend =
        document.descendants().find(|node| node.attribute("class") == Some("legend")).expect("the plot has a legend");
    legend
        .descendants()
        .filter(|node| node.has_tag_name("text"))
        .filter_map(|node| node.text())
        .map(String::from)
        .collect()
}

/// Checks a line figure's SVG: a polyline with one vertex and one marker per x, per series.
fn check_line_svg(svg: &str, labels: &[&str], xs: usize) {
    let document = roxmltree::Document::parse(svg).unwrap_or_else(|error| panic!("invalid XML: {error}\n{svg}"));
    let root = document.root_element();
    assert!(root.has_tag_name(("http://www.w3.org/2000/svg", "svg")), "root is an SVG element");
    let groups = series_groups(&document);
    let names: Vec<&str> = groups.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, labels, "one series group per method, in order");
    for (name, group) in &groups {
        let polylines: Vec<_> = group.children().filter(|node| node.has_tag_name("polyline")).collect();
        assert_eq!(polylines.len(), 1, "{name}: one polyline");
        let vertices = polylines[0].attribute("points").expect("points").split_whitespace().count();
        assert_eq!(vertices, xs, "{name}: a vertex per point");
        let markers = group.children().filter(|node| node.attribute("class") == Some("marker")).count();
        assert_eq!(markers, xs, "{name}: a marker per point");
    }
    assert_eq!(legend_texts(&document), labels, "the legend names every series");
    let texts: Vec<&str> = document.descendants().filter_map(|node| node.text()).collect();
    assert!(texts.contains(&"throughput (transactions/s)"), "y axis label");
    assert!(texts.contains(&"0"), "y axis starts at 0 with a tick label");
}

/// Checks a sweep's Markdown table: the header names every series, a row per x, and each cell
/// links to a saved result of that point.
fn check_line_table(out: &Path, sweep: Sweep, labels: &[&str], xs: &[f64]) {
    let markdown = read(&out.join(format!("{}.md", sweep.name())));
    assert!(markdown.contains(&format!("]({}.svg)", sweep.name())), "the page shows its plot");
    let table: Vec<&str> =
        markdown.lines().skip_while(|line| !line.starts_with("| txn size") && !line.starts_with("| read %")).collect();
    let header: Vec<&str> = table[0].trim_matches('|').split('|').map(str::trim).collect();
    assert_eq!(&header[1..], labels, "{}: a column per series", sweep.name());
    for (row, x) in table[2..2 + xs.len()].iter().zip(xs) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells[0], format!("{x:.0}"), "{row}");
        assert_eq!(cells.len(), labels.len() + 1, "{row}");
        for (cell, label) in cells[1..].iter().zip(labels) {
            let file = cell.split_once("](").and_then(|(_, rest)| rest.split_once(')')).map(|(file, _)| file);
            let file = file.unwrap_or_else(|| panic!("{label} at {x}: no result link in {cell:?}"));
            let result: serde_json::Value = serde_json::from_str(&read(&out.join(file))).unwrap();
            assert!(result["throughput_txn_per_s"].as_f64().unwrap() > 0.0, "{file}");
            assert!(result["git_commit"].is_string() && result["machine"]["cpus"].is_u64(), "{file}");
            assert_eq!(result["seed"], 3, "{file}");
            assert_eq!(result["check"]["fractured"], 0, "{file}");
            let config = &result["config"];
            match sweep {
                Sweep::TxnSize => assert_eq!(config["txn_size"].as_f64(), Some(*x), "{file}"),
                _ => assert_eq!(config["read_ratio"].as_f64(), Some(x / 100.0), "{file}"),
            }
            let expected_workload = if sweep == Sweep::Ycsb { "ycsb_read_ratio" } else { "micro" };
            assert!(config["workload"].to_string().contains(expected_workload), "{file}: {}", config["workload"]);
        }
    }
    assert!(markdown.contains("## The paper's ratios beside ours"), "{markdown}");
    let missing: Vec<_> = METHODS.iter().filter(|method| method.transport_kind().is_none()).collect();
    for method in &missing {
        assert!(markdown.contains(&format!("{}: this build has no transport", method.label)), "{markdown}");
    }
    assert_eq!(markdown.contains("Not in this build"), !missing.is_empty());
}

#[test]
fn a_small_figure_run_writes_valid_svg_and_a_table_with_every_series() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("figures");
    let mut config = FiguresConfig::new(Mode::Quick, out.clone(), 3);
    config.point_seconds = 0.1;
    config.base.keys = 200;
    config.base.value_size = 64;
    config.ycsb_value_size = 100;
    config.check = true;
    config.sweeps = vec![
        SweepPlan { sweep: Sweep::Comm, xs: Vec::new() },
        SweepPlan { sweep: Sweep::TxnSize, xs: vec![1.0, 4.0] },
        SweepPlan { sweep: Sweep::ReadRatio, xs: vec![0.0, 100.0] },
        SweepPlan { sweep: Sweep::Ycsb, xs: vec![50.0, 100.0] },
    ];
    let outcome = figures::run(&config, &ProgressBar::hidden()).unwrap();
    assert!(outcome.problems().is_empty(), "{:?}", outcome.problems());

    let labels = available_labels();
    for plan in &config.sweeps[1..] {
        check_line_svg(&read(&out.join(format!("{}.svg", plan.sweep.name()))), &labels, plan.xs.len());
        check_line_table(&out, plan.sweep, &labels, &plan.xs);
    }

    // The transports: one bar per transport in the build, in TransportKind::ALL order.
    let svg = read(&out.join("comm.svg"));
    let document = roxmltree::Document::parse(&svg).unwrap();
    let groups = series_groups(&document);
    assert_eq!(groups.len(), 1);
    let bars: Vec<&str> = groups[0]
        .1
        .children()
        .filter(|node| node.attribute("class") == Some("bar"))
        .map(|node| node.attribute("data-category").unwrap())
        .collect();
    let transports: Vec<&str> = TransportKind::ALL.iter().map(|kind| kind.name()).collect();
    assert_eq!(bars, transports);
    let comm = read(&out.join("comm.md"));
    for transport in &transports {
        assert!(comm.contains(&format!("| {transport} |")), "{comm}");
        assert!(out.join("results/comm").join(format!("{transport}.json")).is_file());
    }
    assert!(
        comm.contains("| RDMA-Write (GET+/PUT+) / Eth | writepoll / tcp | 95% reads, 8 ops/txn | 2.53x |"),
        "{comm}"
    );

    let index = read(&out.join("index.md"));
    for sweep in Sweep::ALL {
        assert!(index.contains(&format!("]({}.md)", sweep.name())), "{index}");
        assert!(index.contains(&format!("]({}.svg)", sweep.name())), "{index}");
    }
    assert!(index.contains("QUICK MODE"), "{index}");
    assert!(index.contains("EMULATION"), "{index}");
    let summary: serde_json::Value = serde_json::from_str(&read(&out.join("summary.json"))).unwrap();
    assert_eq!(summary["sweeps"].as_array().unwrap().len(), 4);

    // One evidence probe per (protocol, transport) pair of the points, not one per point:
    // RAMP-Fast over every transport (comm) and S2PL over TCP (the line figures' methods).
    let mut pairs: Vec<(&str, &str)> = transports.iter().map(|transport| ("ramp-fast", *transport)).collect();
    pairs.push(("s2pl", "tcp"));
    let probed: Vec<(&str, &str)> = outcome.probes.iter().map(|probe| (probe.protocol, probe.transport)).collect();
    assert_eq!(probed, pairs);
    for probe in &outcome.probes {
        let check = probe.check.unwrap_or_else(|| panic!("{probe:?}"));
        assert!(!check.found_anomaly(), "{probe:?}");
        assert!(check.evidence.reads_with_round1 > 0, "{probe:?}");
    }
    assert!(index.contains("## Evidence probes") && index.contains("| ramp-fast | tcp | "), "{index}");
    assert_eq!(summary["probes"].as_array().unwrap().len(), pairs.len());
}

#[test]
fn the_command_runs_one_figure_quietly_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let output = rampkv(&[
        "figures",
        "--quick",
        "--only",
        "comm",
        "--point-duration",
        "100ms",
        "--seed",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains('\r') && !stderr.contains('\x1b'), "no progress bar in a pipe: {stderr:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("index.md"));
    assert!(out.join("comm.svg").is_file() && out.join("comm.md").is_file());
    assert!(!out.join("txnsize.svg").exists(), "--only runs only the named figure");
    let tcp: serde_json::Value = serde_json::from_str(&read(&out.join("results/comm/tcp.json"))).unwrap();
    assert_eq!(tcp["seed"], 5);
    assert_eq!(tcp["config"]["stop_after"]["duration"]["seconds"], 0.1);

    let bad = rampkv(&["figures", "--only", "fig9"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("comm, txnsize, readratio, ycsb"));
}

/// YCSB's text output: `[SECTION], Metric, value` per line; other lines are not YCSB's.
#[derive(Debug, Default)]
struct YcsbOutput {
    sections: BTreeMap<String, BTreeMap<String, f64>>,
}

impl YcsbOutput {
    /// Parses like YCSB's own tooling: every line starting with `[` must be a metric line.
    fn parse(text: &str) -> Result<YcsbOutput, String> {
        let mut output = YcsbOutput::default();
        for line in text.lines().filter(|line| line.starts_with('[')) {
            let fields: Vec<&str> = line.splitn(3, ", ").collect();
            let [section, metric, value] = fields[..] else {
                return Err(format!("not three comma-separated fields: {line:?}"));
            };
            let name = section
                .strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
                .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '-'))
                .ok_or_else(|| format!("bad section {section:?}"))?;
            if metric.is_empty() || metric.contains(',') {
                return Err(format!("bad metric {metric:?}"));
            }
            let value: f64 = value.trim().parse().map_err(|_| format!("not a number: {line:?}"))?;
            if output.sections.entry(name.into()).or_default().insert(metric.into(), value).is_some() {
                return Err(format!("metric repeated: {line:?}"));
            }
        }
        Ok(output)
    }

    fn get(&self, section: &str, metric: &str) -> f64 {
        *self
            .sections
            .get(section)
            .and_then(|metrics| metrics.get(metric))
            .unwrap_or_else(|| panic!("[{section}], {metric} missing: {self:?}"))
    }
}

#[test]
fn the_ycsb_parser_refuses_what_is_not_ycsb_s_format() {
    assert!(YcsbOutput::parse("[OVERALL], RunTime(ms), 12\nsome other line\n").is_ok());
    for bad in
        ["[OVERALL] RunTime(ms) 12", "[], a, 1", "[OVERALL], RunTime(ms), twelve", "[a], b, 1", "[X], m, 1\n[X], m, 2"]
    {
        assert!(YcsbOutput::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn bench_ycsb_output_is_read_by_a_ycsb_parser_and_agrees_with_the_json_result() {
    let output = rampkv(&[
        "bench",
        "--workload",
        "ycsb-read-ratio",
        "--read-ratio",
        "0.75",
        "--keys",
        "300",
        "--txn-size",
        "4",
        "--txns",
        "600",
        "--seed",
        "4",
        "--check",
        "--json",
        "--ycsb",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    // 0 clean, 3 inconclusive (no anomaly, too few races in 600 transactions on one thread).
    assert!(matches!(output.status.code(), Some(0 | 3)), "{}", String::from_utf8_lossy(&output.stderr));
    let json_line = stdout.lines().find(|line| line.starts_with('{')).expect("the --json line");
    let result: serde_json::Value = serde_json::from_str(json_line).unwrap();
    let ycsb = YcsbOutput::parse(&stdout).unwrap();
    assert_eq!(ycsb.sections.keys().collect::<Vec<_>>(), ["OVERALL", "READ", "UPDATE"]);

    let txn_size = 4.0;
    let transactions = result["transactions"].as_f64().unwrap();
    let elapsed_s = result["elapsed_s"].as_f64().unwrap();
    assert!((ycsb.get("OVERALL", "RunTime(ms)") - elapsed_s * 1000.0).abs() <= 1.0);
    let throughput = ycsb.get("OVERALL", "Throughput(ops/sec)");
    assert!((throughput - transactions * txn_size / elapsed_s).abs() <= throughput * 1e-9);
    for (section, kind) in [("READ", "read"), ("UPDATE", "write")] {
        let latency = &result[kind];
        let operations = ycsb.get(section, "Operations");
        assert_eq!(operations, latency["count"].as_f64().unwrap() * txn_size, "{section}");
        assert_eq!(ycsb.get(section, "Return=OK"), operations, "{section}");
        assert!((ycsb.get(section, "AverageLatency(us)") - latency["mean_us"].as_f64().unwrap()).abs() < 1e-6);
        for (metric, field) in [
            ("MinLatency(us)", "min_us"),
            ("MaxLatency(us)", "max_us"),
            ("95thPercentileLatency(us)", "p95_us"),
            ("99thPercentileLatency(us)", "p99_us"),
        ] {
            assert_eq!(ycsb.get(section, metric), latency[field].as_f64().unwrap(), "[{section}], {metric}");
        }
        assert!(ycsb.get(section, "MinLatency(us)") <= ycsb.get(section, "99thPercentileLatency(us)"));
    }
    let reads = ycsb.get("READ", "Operations");
    assert_eq!(reads + ycsb.get("UPDATE", "Operations"), transactions * txn_size);
    // 600 draws at 75% reads: the share is within 0.1 of 0.75 with overwhelming probability
    // (seeded, so this replays exactly).
    let share = reads / (transactions * txn_size);
    assert!((share - 0.75).abs() < 0.1, "read share {share}");
    assert_eq!(result["config"]["workload"], "ycsb_read_ratio");
    assert_eq!(result["check"]["fractured"], 0);
    assert_eq!(result["check"]["garbage"], 0);
    let status = if result["verdict"] == "clean" { 0 } else { 3 };
    assert_eq!(output.status.code(), Some(status), "{}", result["check"]);
}
