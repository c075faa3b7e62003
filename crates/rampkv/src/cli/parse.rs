//! Parsers of flag values that clap does not know: durations, `MIN..MAX` ranges, `KEY=VALUE`
//! pairs and the names of fsync policies and protocols. Bad input is an error that says what is
//! accepted, never a panic.

use std::time::Duration;

use anyhow::{bail, Context, Result};

use rampkv::chaos;
use rampkv::durable::FsyncPolicy;
use rampkv::protocol::ramp::Algorithm;
use rampkv::types::UnknownName;

/// Shortest run `--duration` / `--point-duration` accept: a shorter one may end before a
/// single transaction finishes (a loaded machine takes milliseconds to start the clients), and a
/// run that measures nothing should be refused up front rather than report zeros.
pub(crate) const RUN_DURATION_MS_MIN: u64 = 10;

/// Longest run they accept: one week. Bounds the arithmetic on it (a duration of 1e30 seconds
/// overflowed `Duration` and panicked).
pub(crate) const RUN_DURATION_S_MAX: u64 = 7 * 24 * 3600;

/// Parses `10s`, `500ms`, `2m`, `1.5s` or a plain number of seconds, within
/// [`RUN_DURATION_MS_MIN`]..=[`RUN_DURATION_S_MAX`]. NaN, infinities, zero, negative and
/// out-of-range values are errors saying what is accepted, never a panic.
pub(crate) fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let (number, scale) = if let Some(number) = text.strip_suffix("ms") {
        (number, 0.001)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1.0)
    } else if let Some(number) = text.strip_suffix('m') {
        (number, 60.0)
    } else {
        (text, 1.0)
    };
    let value: f64 =
        number.trim().parse().with_context(|| format!("invalid duration {text:?} (try 10s, 500ms, 2m)"))?;
    let seconds = value * scale;
    let accepted = format!("durations from {RUN_DURATION_MS_MIN}ms to {RUN_DURATION_S_MAX}s (7 days) are accepted");
    if seconds.is_nan() || seconds <= 0.0 {
        bail!("duration must be a positive number, got {text:?}; {accepted}");
    }
    if seconds > RUN_DURATION_S_MAX as f64 {
        // Infinities too (`inf`, or `1e308m` overflowing to one).
        bail!("duration {text:?} is too long; {accepted}");
    }
    if seconds * 1_000.0 < RUN_DURATION_MS_MIN as f64 {
        bail!("duration {text:?} is too short to run a transaction; {accepted}");
    }
    // In range, so neither conversion can panic.
    Ok(Duration::from_secs_f64(seconds))
}

/// Parses `MIN..MAX` (two durations as [`parse_duration`] takes them) or one duration (MIN =
/// MAX) into milliseconds.
pub(crate) fn parse_duration_range(text: &str) -> Result<chaos::MillisecondRange> {
    let (min, max) = text.split_once("..").unwrap_or((text, text));
    let millis = |part: &str| parse_duration(part).map(|duration| duration.as_millis() as u64);
    let range = chaos::MillisecondRange { min: millis(min)?, max: millis(max)? };
    if range.min > range.max {
        bail!("{text:?}: the lower end is above the upper end");
    }
    Ok(range)
}

/// Splits `KEY=VALUE` at the first `=`.
pub(crate) fn parse_pair(pair: &str) -> Result<(Vec<u8>, Vec<u8>)> {
    match pair.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.as_bytes().to_vec(), value.as_bytes().to_vec())),
        _ => bail!("expected KEY=VALUE with a non-empty key, got {pair:?}"),
    }
}

/// `--appendfsync`: always, everysec or no.
pub(crate) fn parse_policy(name: &str) -> Result<FsyncPolicy, UnknownName> {
    name.parse().map_err(|_| UnknownName {
        what: "fsync policy",
        name: name.to_owned(),
        choices: vec!["always", "everysec", "no"],
    })
}

/// `bench --protocol`: one of [`Algorithm::ALL`] by name.
pub(crate) fn parse_algorithm(name: &str) -> Result<Algorithm, UnknownName> {
    Algorithm::from_name(name).ok_or_else(|| UnknownName {
        what: "protocol",
        name: name.to_owned(),
        choices: Algorithm::ALL.iter().map(Algorithm::name).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_the_documented_forms_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["", "abc", "-1s", "0", "nan", "inf"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// Issue 15: `bench --duration 1e30` panicked (Duration overflow) and `--duration
    /// 0.0000001s` ran nothing and exited 0. Every value out of the documented range is a
    /// clear error; the bounds themselves are accepted.
    #[test]
    fn durations_out_of_range_are_errors_that_state_the_range() {
        for (bad, why) in [
            ("1e30", "too long"),
            ("1e30ms", "too long"),
            ("604801s", "too long"),
            ("1e308m", "too long"),
            ("0.0000001s", "too short"),
            ("9ms", "too short"),
            ("5e-324", "too short"),
            ("NaN", "positive number"),
            ("-inf", "positive number"),
            ("infs", "too long"),
            ("-0", "positive number"),
            ("-3m", "positive number"),
        ] {
            let message = format!("{:#}", parse_duration(bad).unwrap_err());
            assert!(message.contains(why) && message.contains("10ms to 604800s"), "{bad:?}: {message}");
        }
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(parse_duration("604800s").unwrap(), Duration::from_secs(RUN_DURATION_S_MAX));
        assert_eq!(parse_duration("10080m").unwrap(), Duration::from_secs(RUN_DURATION_S_MAX));
    }

    #[test]
    fn pairs_split_at_the_first_equals_sign() {
        assert_eq!(parse_pair("k=v=w").unwrap(), (b"k".to_vec(), b"v=w".to_vec()));
        assert_eq!(parse_pair("k=").unwrap(), (b"k".to_vec(), b"".to_vec()));
        assert!(parse_pair("=v").is_err());
        assert!(parse_pair("novalue").is_err());
    }
}
