//! Where the layers' log records go in the `rampkv` binary: standard error, one line each,
//! warnings and errors only (what a server closes and refuses, and why). The layers log through
//! the `log` facade and never install a logger themselves; a program embedding them installs
//! its own.

/// Writes warnings and errors to standard error as `rampkv: warning: ...`.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let level = if record.level() == log::Level::Error { "error" } else { "warning" };
            eprintln!("rampkv: {level}: {}", record.args());
        }
    }

    fn flush(&self) {}
}

/// Installs the standard-error logger (once; later calls, or a logger already installed, leave
/// things as they are).
pub fn init() {
    static LOGGER: StderrLogger = StderrLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}
