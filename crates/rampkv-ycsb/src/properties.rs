//! YCSB property files: `name=value` lines, `#` comments.
//!
//! # Format
//! The subset of `java.util.Properties` that YCSB's workload files use:
//! - one property per line; `\n` or `\r\n` line ends;
//! - blank lines and lines whose first non-blank character is `#` or `!` are comments;
//! - the name ends at the first `=`, `:` or blank; blanks around the separator are skipped;
//!   a name with no separator has the empty value (as in Java);
//! - the value is the rest of the line, with surrounding blanks removed (Java keeps trailing
//!   blanks, then most of YCSB's parsers reject them: trimming is the friendlier reading);
//! - a later line overrides an earlier one with the same name, and [`Properties::set`]
//!   overrides both (YCSB's `-p name=value` on the command line).
//!
//! Backslash escapes and line continuations are refused with an error rather than misread:
//! no YCSB workload file uses them.
//!
//! Unknown names are kept, not refused: YCSB files carry properties for the database binding
//! and the client (`workload`, `table`, `threadcount`) next to the workload's own.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::limits::PROPERTIES_TEXT_BYTES_MAX;
use crate::Error;

/// Parsed properties, name to value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Properties {
    entries: BTreeMap<String, String>,
}

impl Properties {
    /// No properties: every lookup falls back to YCSB's default.
    pub fn new() -> Self {
        Properties::default()
    }

    /// Parses a property file's text.
    ///
    /// # Errors
    /// [`Error::PropertySyntax`] for an empty name, a backslash, or text longer than
    /// [`PROPERTIES_TEXT_BYTES_MAX`].
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut properties = Properties::new();
        properties.merge(text)?;
        Ok(properties)
    }

    /// Parses `text` and adds its properties, overriding existing ones with the same names
    /// (several `-P file` options in YCSB).
    ///
    /// # Errors
    /// As [`Properties::parse`]. On error nothing is added.
    pub fn merge(&mut self, text: &str) -> Result<(), Error> {
        if text.len() > PROPERTIES_TEXT_BYTES_MAX {
            return Err(Error::PropertySyntax {
                line: 0,
                text: format!("{} bytes", text.len()),
                reason: "property text is larger than the 1 MiB limit",
            });
        }
        let mut parsed = Vec::new();
        for (index, raw_line) in text.lines().enumerate() {
            if let Some(entry) = parse_line(index + 1, raw_line)? {
                parsed.push(entry);
            }
        }
        for (name, value) in parsed {
            self.entries.insert(name, value);
        }
        Ok(())
    }

    /// Sets one property, overriding any earlier value.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.entries.insert(name.into(), value.into());
        self
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries.get(name).map(String::as_str)
    }

    /// All properties, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// Number of properties.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no property is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `name` or `default`.
    pub(crate) fn string_or<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        self.get(name).unwrap_or(default)
    }

    /// `name` as a non-negative integer, or `default` when unset.
    pub(crate) fn unsigned_or(&self, name: &str, default: u64) -> Result<u64, Error> {
        match self.get(name) {
            None => Ok(default),
            Some(text) => {
                text.parse::<u64>().map_err(|_| Error::invalid(name, text, "expected a non-negative integer"))
            }
        }
    }

    /// `name` as a finite number, or `default` when unset.
    pub(crate) fn number_or(&self, name: &str, default: f64) -> Result<f64, Error> {
        match self.get(name) {
            None => Ok(default),
            Some(text) => match text.parse::<f64>() {
                Ok(number) if number.is_finite() => Ok(number),
                _ => Err(Error::invalid(name, text, "expected a finite number")),
            },
        }
    }

    /// `name` as `true` or `false` (any case), or `default` when unset.
    ///
    /// Deviation: Java's `Boolean.parseBoolean` reads anything but "true" as false, so a typo
    /// silently flips the setting; here it is an error.
    pub(crate) fn boolean_or(&self, name: &str, default: bool) -> Result<bool, Error> {
        match self.get(name) {
            None => Ok(default),
            Some(text) if text.eq_ignore_ascii_case("true") => Ok(true),
            Some(text) if text.eq_ignore_ascii_case("false") => Ok(false),
            Some(text) => Err(Error::invalid(name, text, "expected true or false")),
        }
    }
}

impl FromStr for Properties {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        Properties::parse(text)
    }
}

/// One line: `Ok(None)` for blanks and comments.
fn parse_line(line: usize, raw_line: &str) -> Result<Option<(String, String)>, Error> {
    let text = raw_line.trim();
    if text.is_empty() || text.starts_with('#') || text.starts_with('!') {
        return Ok(None);
    }
    let syntax_error = |reason| Error::PropertySyntax { line, text: text.to_string(), reason };
    if text.contains('\\') {
        return Err(syntax_error("backslash escapes and line continuations are not supported"));
    }
    let name_end = text
        .find(|character: char| character == '=' || character == ':' || character.is_whitespace())
        .unwrap_or(text.len());
    let name = &text[..name_end];
    if name.is_empty() {
        return Err(syntax_error("expected `name=value`, found no name"));
    }
    let mut rest = text[name_end..].trim_start();
    if let Some(after_separator) = rest.strip_prefix(['=', ':']) {
        rest = after_separator.trim_start();
    }
    Ok(Some((name.to_string(), rest.trim_end().to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ycsb_style_file() {
        let text = "# Yahoo! Cloud System Benchmark\n\
                    # Workload A\n\
                    \n\
                    recordcount=1000\r\n\
                    operationcount = 2000\n\
                    ! bang comment\n\
                    workload=site.ycsb.workloads.CoreWorkload\n\
                    readproportion: 0.5\n\
                    requestdistribution zipfian\n\
                    empty=\n\
                    bare\n\
                    recordcount=3000\n";
        let properties = Properties::parse(text).expect("valid file");
        assert_eq!(properties.get("recordcount"), Some("3000"), "later line wins");
        assert_eq!(properties.get("operationcount"), Some("2000"));
        assert_eq!(properties.get("readproportion"), Some("0.5"));
        assert_eq!(properties.get("requestdistribution"), Some("zipfian"));
        assert_eq!(properties.get("workload"), Some("site.ycsb.workloads.CoreWorkload"));
        assert_eq!(properties.get("empty"), Some(""));
        assert_eq!(properties.get("bare"), Some(""));
        assert_eq!(properties.get("missing"), None);
        assert_eq!(properties.len(), 7);
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let error = Properties::parse("a=1\n=2\n").expect_err("no name");
        assert!(matches!(error, Error::PropertySyntax { line: 2, .. }), "{error}");
        let error = Properties::parse("a=1 \\\n  continued\n").expect_err("continuation");
        assert!(matches!(error, Error::PropertySyntax { line: 1, .. }), "{error}");
        let huge = "#".repeat(PROPERTIES_TEXT_BYTES_MAX + 1);
        assert!(Properties::parse(&huge).is_err());
    }

    #[test]
    fn merge_and_set_override() {
        let mut properties = Properties::parse("a=1\nb=2").expect("valid");
        properties.merge("b=3\nc=4").expect("valid");
        properties.set("c", "5");
        assert_eq!(properties.get("a"), Some("1"));
        assert_eq!(properties.get("b"), Some("3"));
        assert_eq!(properties.get("c"), Some("5"));
        // A failed merge adds nothing.
        assert!(properties.merge("d=1\n=x").is_err());
        assert_eq!(properties.get("d"), None);
    }

    #[test]
    fn typed_lookups_reject_bad_values() {
        let properties = Properties::parse("count=12\nbad=12x\nnegative=-1\nratio=0.25\nnan=NaN\nyes=TRUE\nmaybe=yes")
            .expect("valid");
        assert_eq!(properties.unsigned_or("count", 0), Ok(12));
        assert_eq!(properties.unsigned_or("unset", 7), Ok(7));
        assert!(properties.unsigned_or("bad", 0).is_err());
        assert!(properties.unsigned_or("negative", 0).is_err());
        assert_eq!(properties.number_or("ratio", 0.0), Ok(0.25));
        assert!(properties.number_or("nan", 0.0).is_err());
        assert_eq!(properties.boolean_or("yes", false), Ok(true));
        assert!(properties.boolean_or("maybe", false).is_err());
    }
}
