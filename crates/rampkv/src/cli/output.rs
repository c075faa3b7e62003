//! The binary's output lines. A closed stdout or stderr (a reader that went away, `rampkv bench |
//! head -1`) is not an error worth a panic, which `println!` and `eprintln!` would raise: the
//! line is dropped.

/// Writes a line to stderr; a closed stderr drops it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Writes a line to stdout; as [`say!`], a closed stdout drops it instead of panicking as
/// `println!` would.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`out!`] without the line end.
macro_rules! out_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

pub(crate) use {out, out_raw, say};
