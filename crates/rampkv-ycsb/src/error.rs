//! The one error type of this crate.
//!
//! Property files and configurations come from outside, so every mistake in them is an
//! [`Error`] value naming the property, the value and what would have been accepted. Expected
//! conditions of the generator (a scan drawn for a store without scans, the insert window
//! full, a key space too skewed to find distinct keys) are values too, never panics.

/// Everything that can go wrong while configuring or running a workload generator.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A line of a property file is not `name=value`, `name: value`, a comment or blank.
    #[error("property file line {line}: {reason}: {text:?}")]
    PropertySyntax {
        /// 1-based line number.
        line: usize,
        /// The offending line (trimmed).
        text: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A property or parameter has a value this crate does not accept.
    #[error("`{name}` = {value:?}: {expected}")]
    InvalidConfiguration {
        /// The property name (`requestdistribution`) or parameter name (`txn_size`).
        name: String,
        /// The value as given.
        value: String,
        /// What would have been accepted.
        expected: Expected,
    },

    /// The operation cannot be expressed as a rampkv transaction.
    #[error("{operation} is not supported: {reason}")]
    Unsupported {
        /// The YCSB operation or feature, e.g. `scan`.
        operation: &'static str,
        /// Why rampkv cannot run it.
        reason: &'static str,
    },

    /// Too many inserted keys were handed out without being acknowledged.
    #[error(
        "{outstanding} inserted keys are not acknowledged (window {window}); \
         acknowledge each insert once it has finished, as YCSB does"
    )]
    TooManyUnacknowledgedInserts {
        /// Keys handed out and not yet acknowledged.
        outstanding: u64,
        /// The bound, [`crate::limits::ACKNOWLEDGEMENT_WINDOW_KEYS`].
        window: u64,
    },

    /// An acknowledgement named a key number that is not waiting for one.
    #[error("cannot acknowledge insert of key number {key_number}: {reason}")]
    InvalidAcknowledgement {
        /// The key number passed in.
        key_number: u64,
        /// Never handed out, or acknowledged already.
        reason: &'static str,
    },

    /// The request distribution kept returning keys that are not inserted yet.
    #[error(
        "no inserted key after {draws} draws (the key chooser's space is much larger than \
         the keys inserted so far; lower operationcount or insertproportion)"
    )]
    KeyDrawsExhausted {
        /// How many draws were made.
        draws: u32,
    },

    /// The request distribution repeated keys too often to fill a transaction with distinct
    /// keys (key space too small or too skewed for the transaction size).
    #[error("found {found} of {wanted} distinct keys after {draws} draws")]
    DistinctKeysNotFound {
        /// Keys wanted (the transaction size).
        wanted: usize,
        /// Distinct keys found.
        found: usize,
        /// Draws made.
        draws: u64,
    },
}

/// What a configuration value would have had to be.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Expected {
    /// In words.
    #[error("{0}")]
    Words(&'static str),
    /// A number in `min..=max`.
    #[error("must be in {min}..={max}")]
    Range { min: u64, max: u64 },
    /// A number of `unit` at most `max`.
    #[error("at most {max} {unit}")]
    AtMost { max: u64, unit: &'static str },
    /// At most the value of another setting.
    #[error("must not exceed {setting} ({value})")]
    AtMostSetting { setting: &'static str, value: u64 },
}

impl From<&'static str> for Expected {
    fn from(words: &'static str) -> Self {
        Expected::Words(words)
    }
}

impl Error {
    /// Shorthand for [`Error::InvalidConfiguration`].
    pub(crate) fn invalid(name: impl Into<String>, value: impl ToString, expected: impl Into<Expected>) -> Self {
        Error::InvalidConfiguration { name: name.into(), value: value.to_string(), expected: expected.into() }
    }
}
