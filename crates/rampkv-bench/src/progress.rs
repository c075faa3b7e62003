//! A small progress bar on stderr for long runs (`rampkv bench`, `rampkv figures`).
//!
//! Contract: it draws only when stderr is a terminal, so logs, pipes and CI output never see
//! control characters; when hidden every method is a cheap no-op. A drawing thread redraws
//! the line every [`REDRAW_INTERVAL`] (so elapsed time moves even while one long step runs)
//! and is stopped and joined by [`ProgressBar::finish`] or on drop, which also clears the
//! line. The line never exceeds [`LINE_CHARS_MAX`] characters, so it does not wrap on a
//! normal terminal.
//!
//! Written here rather than taken from a crate: it is one line of text, and none of the
//! workspace's dependencies offers one.

use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the drawing thread redraws.
pub const REDRAW_INTERVAL: Duration = Duration::from_millis(200);
/// Longest line drawn (characters), so that it fits an 80-column terminal.
pub const LINE_CHARS_MAX: usize = 79;
/// Cells of the bar itself.
const BAR_CELLS: usize = 24;

/// What the bar measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// `done` of `total` steps (points of a figure run, transactions).
    Steps { total: u64 },
    /// A run that ends after this long (a benchmark with a duration).
    Time { total: Duration },
    /// No known end: elapsed time only.
    Open,
}

/// What one drawn line shows.
#[derive(Debug, Clone)]
struct State {
    goal: Goal,
    done: u64,
    message: String,
}

struct Shared {
    state: Mutex<State>,
    started: Instant,
    stop: AtomicBool,
}

/// A progress line on stderr; hidden unless stderr is a terminal.
pub struct ProgressBar {
    shared: Option<Arc<Shared>>,
    drawer: Option<JoinHandle<()>>,
}

impl ProgressBar {
    /// A bar that draws when stderr is a terminal, and is hidden otherwise.
    pub fn new(goal: Goal, message: impl Into<String>) -> Self {
        if std::io::stderr().is_terminal() {
            Self::visible(goal, message)
        } else {
            Self::hidden()
        }
    }

    /// A bar that never draws.
    pub fn hidden() -> Self {
        Self { shared: None, drawer: None }
    }

    fn visible(goal: Goal, message: impl Into<String>) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { goal, done: 0, message: message.into() }),
            started: Instant::now(),
            stop: AtomicBool::new(false),
        });
        let drawing = Arc::clone(&shared);
        let drawer = std::thread::Builder::new()
            .name("rampkv-progress".into())
            .spawn(move || {
                while !drawing.stop.load(Ordering::Acquire) {
                    drawing.draw();
                    std::thread::park_timeout(REDRAW_INTERVAL);
                }
            })
            .ok();
        // Without a drawing thread the bar is simply not shown.
        match drawer {
            Some(drawer) => Self { shared: Some(shared), drawer: Some(drawer) },
            None => Self::hidden(),
        }
    }

    /// Whether anything is drawn.
    pub fn is_visible(&self) -> bool {
        self.shared.is_some()
    }

    /// Counts one more step done.
    pub fn inc(&self) {
        self.update(|state| state.done = state.done.saturating_add(1));
    }

    /// Sets the text after the bar (what runs now).
    pub fn set_message(&self, message: impl Into<String>) {
        let message = message.into();
        self.update(|state| state.message = message);
    }

    /// Prints a line above the bar (the bar is redrawn after it).
    pub fn println(&self, line: &str) {
        match &self.shared {
            Some(_) => {
                let mut stderr = std::io::stderr().lock();
                let _ = write!(stderr, "\r\x1b[2K{line}\n");
                let _ = stderr.flush();
            }
            None => {
                let _ = writeln!(std::io::stderr(), "{line}");
            }
        }
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        if let Some(shared) = &self.shared {
            change(&mut shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        }
    }

    /// Stops drawing and clears the line.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.stop.store(true, Ordering::Release);
            if let Some(drawer) = self.drawer.take() {
                drawer.thread().unpark();
                let _ = drawer.join();
            }
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
        }
    }
}

impl Drop for ProgressBar {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn draw(&self) {
        let state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let line = render_line(&state.goal, state.done, &state.message, self.started.elapsed());
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
    }
}

/// The text of the progress line (no control characters), at most [`LINE_CHARS_MAX`] chars.
fn render_line(goal: &Goal, done: u64, message: &str, elapsed: Duration) -> String {
    let elapsed_s = elapsed.as_secs_f64();
    let (fraction, counter) = match *goal {
        Goal::Steps { total } => {
            let fraction = if total == 0 { 1.0 } else { done.min(total) as f64 / total as f64 };
            let eta = if done > 0 && done < total {
                format!(" eta {}", format_seconds(elapsed_s / done as f64 * (total - done) as f64))
            } else {
                String::new()
            };
            (Some(fraction), format!("{done}/{total} {}{eta}", format_seconds(elapsed_s)))
        }
        Goal::Time { total } => {
            let total_s = total.as_secs_f64().max(f64::MIN_POSITIVE);
            (Some((elapsed_s / total_s).min(1.0)), format!("{}/{}", format_seconds(elapsed_s), format_seconds(total_s)))
        }
        Goal::Open => (None, format_seconds(elapsed_s)),
    };
    let mut line = match fraction {
        Some(fraction) => {
            let filled = ((fraction * BAR_CELLS as f64).round() as usize).min(BAR_CELLS);
            format!("[{}{}] {counter}", "#".repeat(filled), "-".repeat(BAR_CELLS - filled))
        }
        None => format!("[{counter}]"),
    };
    if !message.is_empty() {
        line.push(' ');
        line.push_str(message);
    }
    if line.chars().count() > LINE_CHARS_MAX {
        line = line.chars().take(LINE_CHARS_MAX - 3).collect::<String>() + "...";
    }
    line
}

/// `12.3s`, `4m05s`, `1h02m`.
fn format_seconds(seconds: f64) -> String {
    let seconds = if seconds.is_finite() { seconds.max(0.0) } else { 0.0 };
    if seconds < 60.0 {
        format!("{seconds:.1}s")
    } else if seconds < 3600.0 {
        let whole = seconds as u64;
        format!("{}m{:02}s", whole / 60, whole % 60)
    } else {
        let whole = seconds as u64;
        format!("{}h{:02}m", whole / 3600, whole % 3600 / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_bar_shows_the_count_the_share_filled_and_an_estimate() {
        let line = render_line(&Goal::Steps { total: 4 }, 1, "txnsize 8", Duration::from_secs(2));
        assert_eq!(line, format!("[{}{}] 1/4 2.0s eta 6.0s txnsize 8", "#".repeat(6), "-".repeat(18)));
        let done = render_line(&Goal::Steps { total: 4 }, 4, "", Duration::from_secs(8));
        assert_eq!(done, format!("[{}] 4/4 8.0s", "#".repeat(BAR_CELLS)));
    }

    #[test]
    fn a_time_bar_fills_with_elapsed_time_and_stops_full() {
        let half = render_line(&Goal::Time { total: Duration::from_secs(10) }, 0, "", Duration::from_secs(5));
        assert!(half.starts_with(&format!("[{}{}]", "#".repeat(12), "-".repeat(12))), "{half}");
        assert!(half.ends_with("5.0s/10.0s"), "{half}");
        let over = render_line(&Goal::Time { total: Duration::from_secs(10) }, 0, "", Duration::from_secs(11));
        assert!(over.starts_with(&format!("[{}]", "#".repeat(BAR_CELLS))), "{over}");
    }

    #[test]
    fn lines_are_bounded_and_plain_text() {
        let long = "x".repeat(500);
        for goal in [Goal::Steps { total: 0 }, Goal::Time { total: Duration::ZERO }, Goal::Open] {
            let line = render_line(&goal, 7, &long, Duration::from_secs(4000));
            assert!(line.chars().count() <= LINE_CHARS_MAX, "{line}");
            assert!(!line.chars().any(char::is_control), "{line}");
        }
        assert_eq!(format_seconds(65.0), "1m05s");
        assert_eq!(format_seconds(3725.0), "1h02m");
        assert_eq!(format_seconds(f64::NAN), "0.0s");
    }

    #[test]
    fn a_hidden_bar_does_nothing() {
        let bar = ProgressBar::hidden();
        assert!(!bar.is_visible());
        bar.inc();
        bar.set_message("nothing");
        bar.finish();
    }
}
