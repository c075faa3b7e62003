//! `rampkv check`: checks a recorded history for read atomicity; the verdict is the exit status
//! (0 clean, 1 violated or not checkable, 3 inconclusive; 2 is left to errors).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use rampkv::checker;

use super::output::{out, out_raw};

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The history file (JSON lines).
    file: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: CheckArgs) -> Result<ExitCode> {
    let CheckArgs { file, json } = args;
    let report = checker::check_file(&file).with_context(|| format!("cannot check {}", file.display()))?;
    if json {
        out!("{}", serde_json::to_string(&report)?);
    } else {
        out_raw!("{report}");
    }
    Ok(ExitCode::from(report.verdict().exit_status()))
}

/// The exit status of a command that checked `verdicts` (none: nothing was checked, success).
/// `rampkv bench --check` answers with it too.
pub(crate) fn check_exit_code(verdicts: impl IntoIterator<Item = checker::Verdict>) -> ExitCode {
    let verdict = verdicts.into_iter().reduce(checker::Verdict::combine);
    ExitCode::from(verdict.map_or(checker::EXIT_CLEAN, checker::Verdict::exit_status))
}
