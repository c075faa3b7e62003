//! RESP2 and RESP3: the values ([`Frame`]), the request parser ([`RequestParser`]) and the
//! encoder. No I/O: bytes in, values or bytes out.
//!
//! # Format
//! Every value starts with one type byte; a header line ends with CRLF (`\r\n`). Lengths and
//! counts are decimal ASCII.
//!
//! | type | example bytes | RESP | value |
//! |---|---|---|---|
//! | `+` | `+OK\r\n` | 2 | simple string: no CR or LF inside |
//! | `-` | `-ERR unknown command\r\n` | 2 | simple error: first word is the error code |
//! | `:` | `:-12\r\n` | 2 | signed 64-bit integer |
//! | `$` | `$3\r\nfoo\r\n` | 2 | bulk string: binary-safe, `length` bytes, then CRLF |
//! | `$` | `$-1\r\n` | 2 | null (RESP2's null bulk string) |
//! | `*` | `*2\r\n:1\r\n:2\r\n` | 2 | array of `count` values; `*-1\r\n` is RESP2's null array |
//! | `_` | `_\r\n` | 3 | null |
//! | `#` | `#t\r\n`, `#f\r\n` | 3 | boolean |
//! | `,` | `,1.5\r\n`, `,inf\r\n`, `,-inf\r\n`, `,nan\r\n` | 3 | double |
//! | `(` | `(-3492890328409238509324850943850943825024385\r\n` | 3 | big number: optional `-`, digits |
//! | `!` | `!9\r\nERR oops!\r\n` | 3 | bulk error |
//! | `=` | `=8\r\ntxt:text\r\n` | 3 | verbatim string: 3-byte format, `:`, text (length counts all) |
//! | `%` | `%1\r\n+key\r\n:1\r\n` | 3 | map of `count` key-value pairs |
//! | `~` | `~1\r\n:1\r\n` | 3 | set |
//! | `\|` | `\|1\r\n+ttl\r\n:3\r\n` | 3 | attribute: pairs of metadata sent before a reply |
//! | `>` | `>1\r\n+msg\r\n` | 3 | push (out-of-band data) |
//!
//! RESP3's streamed strings and aggregates (`$?`, `*?`) are refused: no client sends them in
//! requests and the gateway never sends them.
//!
//! A RESP2 connection gets RESP3-only values in their RESP2 form ([`Frame::encode`]): null as
//! `$-1`, a boolean as `:1`/`:0`, a double, big number or verbatim string as a bulk string, a
//! bulk error as a simple error, a map as a flat array of keys and values, a set or push as an
//! array; an attribute is dropped.
//!
//! # Requests
//! A request is either an array of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or an
//! *inline* command: one line (`GET k\r\n`, CR optional) split at blanks, with Redis's quoting
//! (`"..."` with `\n \r \t \b \a \\ \" \xHH` escapes, `'...'` with `\'`). An empty array, a
//! negative count or a blank line is an empty request (skipped). Any other first byte than `*`
//! starts an inline command.
//!
//! # Checked before parsed
//! [`RequestParser::parse`] walks the request's headers and records where each argument lies,
//! without copying; it returns `Ok(None)` until the whole request is buffered, so a large value
//! arriving in pieces is never copied more than once. [`parse_frame`] likewise checks a whole
//! value's extent before it allocates anything. Every count and length is checked against a
//! bound in [`crate`] before it is trusted. Errors are [`CodecError`]s whose text is
//! Redis's (`Protocol error: ...`); after one the stream cannot be resynchronised, and the
//! gateway closes the connection. No input makes either parser panic.

use std::ops::Range;

use super::{
    RESP_AGGREGATE_ITEMS_MAX, RESP_ARGS_MAX, RESP_BULK_BYTES_MAX, RESP_HEADER_LINE_BYTES_MAX, RESP_INLINE_BYTES_MAX,
    RESP_NESTING_DEPTH_MAX, RESP_REPLY_BULK_BYTES_MAX, RESP_UNAUTHENTICATED_ARGS_MAX,
    RESP_UNAUTHENTICATED_BULK_BYTES_MAX,
};

const CRLF: &[u8] = b"\r\n";

/// The protocol version a connection speaks: RESP2 until the client says `HELLO 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

impl Protocol {
    /// The number HELLO uses for this version.
    pub fn number(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// Why bytes are not valid RESP. The text is what the client is sent after `-ERR `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("Protocol error: expected '$', got '{}'", shown_byte(.0))]
    ExpectedBulk(u8),
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    #[error("Protocol error: unauthenticated multibulk length")]
    UnauthenticatedMultibulkLength,
    #[error("Protocol error: unauthenticated bulk length")]
    UnauthenticatedBulkLength,
    #[error("Protocol error: too big mbulk count string")]
    MultibulkHeaderTooBig,
    #[error("Protocol error: too big bulk count string")]
    BulkHeaderTooBig,
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    #[error("Protocol error: too many arguments in inline request")]
    InlineTooManyArguments,
    #[error("Protocol error: expected CRLF")]
    ExpectedCrlf,
    #[error("Protocol error: unknown type byte '{}'", shown_byte(.0))]
    UnknownType(u8),
    #[error("Protocol error: invalid header line")]
    InvalidHeaderLine,
    #[error("Protocol error: invalid integer")]
    InvalidInteger,
    #[error("Protocol error: invalid double")]
    InvalidDouble,
    #[error("Protocol error: invalid boolean")]
    InvalidBoolean,
    #[error("Protocol error: invalid big number")]
    InvalidBigNumber,
    #[error("Protocol error: invalid verbatim string")]
    InvalidVerbatim,
    #[error("Protocol error: invalid aggregate length")]
    InvalidAggregateLength,
    #[error("Protocol error: values nested deeper than {RESP_NESTING_DEPTH_MAX}")]
    NestedTooDeep,
    #[error("Protocol error: streamed strings and aggregates are not supported")]
    Streamed,
}

fn shown_byte(byte: impl std::borrow::Borrow<u8>) -> String {
    let byte = *byte.borrow();
    if byte.is_ascii_graphic() || byte == b' ' {
        char::from(byte).to_string()
    } else {
        format!("\\x{byte:02x}")
    }
}

/// One RESP value.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `+`: no CR or LF inside (the encoder replaces them with blanks).
    Simple(Vec<u8>),
    /// `-`: the message, starting with the error code (`ERR ...`).
    Error(Vec<u8>),
    Integer(i64),
    Bulk(Vec<u8>),
    /// `_` (RESP3), `$-1` or `*-1` (RESP2).
    Null,
    Array(Vec<Frame>),
    Boolean(bool),
    Double(f64),
    /// Optional `-`, then one or more digits.
    BigNumber(Vec<u8>),
    BulkError(Vec<u8>),
    Verbatim {
        format: [u8; 3],
        text: Vec<u8>,
    },
    Map(Vec<(Frame, Frame)>),
    Set(Vec<Frame>),
    Attribute(Vec<(Frame, Frame)>),
    Push(Vec<Frame>),
}

impl Frame {
    /// A simple string.
    pub fn simple(text: &str) -> Frame {
        Frame::Simple(text.as_bytes().to_vec())
    }

    /// An error reply; `message` starts with the code, e.g. `ERR syntax error`.
    pub fn error(message: impl Into<String>) -> Frame {
        Frame::Error(message.into().into_bytes())
    }

    /// A bulk string.
    pub fn bulk(bytes: impl Into<Vec<u8>>) -> Frame {
        Frame::Bulk(bytes.into())
    }

    /// Appends the value's bytes for a connection speaking `protocol` (see the module docs for
    /// the RESP2 forms of RESP3 values).
    pub fn encode(&self, protocol: Protocol, out: &mut Vec<u8>) {
        match self {
            Frame::Simple(text) => write_simple(out, text),
            Frame::Error(message) => write_error(out, message),
            Frame::Integer(value) => write_integer(out, *value),
            Frame::Bulk(bytes) => write_bulk(out, bytes),
            Frame::Null => write_null(out, protocol),
            Frame::Array(items) => write_items(out, b'*', items, protocol),
            Frame::Boolean(value) => match protocol {
                Protocol::Resp2 => write_integer(out, i64::from(*value)),
                Protocol::Resp3 => out.extend_from_slice(if *value { b"#t\r\n" } else { b"#f\r\n" }),
            },
            Frame::Double(value) => {
                let text = double_text(*value);
                match protocol {
                    Protocol::Resp2 => write_bulk(out, text.as_bytes()),
                    Protocol::Resp3 => write_line(out, b',', text.as_bytes()),
                }
            }
            Frame::BigNumber(digits) => match protocol {
                Protocol::Resp2 => write_bulk(out, digits),
                Protocol::Resp3 => write_line_sanitized(out, b'(', digits),
            },
            Frame::BulkError(message) => match protocol {
                Protocol::Resp2 => write_error(out, message),
                Protocol::Resp3 => write_length_prefixed(out, b'!', &[message]),
            },
            Frame::Verbatim { format, text } => match protocol {
                Protocol::Resp2 => write_bulk(out, text),
                Protocol::Resp3 => write_length_prefixed(out, b'=', &[format, b":", text]),
            },
            Frame::Map(pairs) => write_pairs(out, b'%', pairs, protocol),
            Frame::Attribute(pairs) => {
                if protocol == Protocol::Resp3 {
                    write_pairs(out, b'|', pairs, protocol);
                }
            }
            Frame::Set(items) => write_items(out, b'~', items, protocol),
            Frame::Push(items) => write_items(out, b'>', items, protocol),
        }
    }

    /// The value's bytes for `protocol`, in a new vector.
    pub fn to_bytes(&self, protocol: Protocol) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(protocol, &mut out);
        out
    }
}

fn write_items(out: &mut Vec<u8>, resp3_type: u8, items: &[Frame], protocol: Protocol) {
    let type_byte = if protocol == Protocol::Resp3 { resp3_type } else { b'*' };
    write_header(out, type_byte, items.len());
    for item in items {
        item.encode(protocol, out);
    }
}

fn write_pairs(out: &mut Vec<u8>, resp3_type: u8, pairs: &[(Frame, Frame)], protocol: Protocol) {
    match protocol {
        Protocol::Resp2 => write_header(out, b'*', 2 * pairs.len()),
        Protocol::Resp3 => write_header(out, resp3_type, pairs.len()),
    }
    for (key, value) in pairs {
        key.encode(protocol, out);
        value.encode(protocol, out);
    }
}

fn write_length_prefixed(out: &mut Vec<u8>, type_byte: u8, parts: &[&[u8]]) {
    write_header(out, type_byte, parts.iter().map(|part| part.len()).sum());
    for part in parts {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(CRLF);
}

fn double_text(value: f64) -> String {
    if value.is_nan() {
        "nan".to_string()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        // Rust's `Display` for f64 prints the shortest text that parses back to the same value.
        format!("{value}")
    }
}

/// Appends `+text\r\n`; CR and LF in `text` become blanks (they would end the line early).
pub fn write_simple(out: &mut Vec<u8>, text: &[u8]) {
    write_line_sanitized(out, b'+', text);
}

/// Appends `-message\r\n`; CR and LF become blanks, as Redis does with error texts.
pub fn write_error(out: &mut Vec<u8>, message: &[u8]) {
    write_line_sanitized(out, b'-', message);
}

fn write_line_sanitized(out: &mut Vec<u8>, type_byte: u8, text: &[u8]) {
    out.push(type_byte);
    out.extend(text.iter().map(|&byte| if byte == b'\r' || byte == b'\n' { b' ' } else { byte }));
    out.extend_from_slice(CRLF);
}

fn write_line(out: &mut Vec<u8>, type_byte: u8, text: &[u8]) {
    debug_assert!(!text.contains(&b'\r') && !text.contains(&b'\n'));
    out.push(type_byte);
    out.extend_from_slice(text);
    out.extend_from_slice(CRLF);
}

/// Appends `:value\r\n`.
pub fn write_integer(out: &mut Vec<u8>, value: i64) {
    out.push(b':');
    write_decimal(out, value);
    out.extend_from_slice(CRLF);
}

/// Appends `$length\r\nbytes\r\n`.
pub fn write_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    write_header(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(CRLF);
}

/// Appends the null value: `_\r\n` in RESP3, `$-1\r\n` in RESP2.
pub fn write_null(out: &mut Vec<u8>, protocol: Protocol) {
    out.extend_from_slice(match protocol {
        Protocol::Resp2 => b"$-1\r\n",
        Protocol::Resp3 => b"_\r\n",
    });
}

/// Appends the header of an array of `count` values.
pub fn write_array_header(out: &mut Vec<u8>, count: usize) {
    write_header(out, b'*', count);
}

fn write_header(out: &mut Vec<u8>, type_byte: u8, count: usize) {
    out.push(type_byte);
    write_decimal(out, i64::try_from(count).unwrap_or(i64::MAX));
    out.extend_from_slice(CRLF);
}

/// Decimal digits without an allocation.
fn write_decimal(out: &mut Vec<u8>, value: i64) {
    let mut digits = [0u8; 20];
    let mut magnitude = value.unsigned_abs();
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[start..]);
}

/// A header line starting at `start`: the bytes before CRLF and the index after it.
/// `Ok(None)`: the line is not complete yet. `too_long`: the error for a line longer than
/// `limit` bytes (CRLF excluded).
fn line_at(
    input: &[u8],
    start: usize,
    limit: usize,
    too_long: CodecError,
) -> Result<Option<(&[u8], usize)>, CodecError> {
    let window_end = input.len().min(start.saturating_add(limit + 1));
    let window = input.get(start..window_end).unwrap_or(&[]);
    match window.iter().position(|&byte| byte == b'\r') {
        Some(offset) => {
            let carriage_return = start + offset;
            match input.get(carriage_return + 1) {
                None => Ok(None),
                Some(b'\n') => Ok(Some((&input[start..carriage_return], carriage_return + 2))),
                Some(_) => Err(CodecError::ExpectedCrlf),
            }
        }
        None if input.len().saturating_sub(start) > limit => Err(too_long),
        None => Ok(None),
    }
}

/// A strict decimal integer: optional `-`, then 1 to 19 digits, no blanks or `+`.
fn parse_integer(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut magnitude: i128 = 0;
    for digit in digits {
        magnitude = magnitude * 10 + i128::from(digit - b'0');
    }
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

// ---------------------------------------------------------------------------------------------
// Requests

/// How large a request the parser accepts: everything the gateway can run once a connection
/// has authenticated, far less before (Redis's limits for unauthenticated clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub args_max: usize,
    pub bulk_bytes_max: usize,
}

impl RequestLimits {
    /// [`RESP_ARGS_MAX`] arguments of [`RESP_BULK_BYTES_MAX`].
    pub const AUTHENTICATED: RequestLimits =
        RequestLimits { args_max: RESP_ARGS_MAX, bulk_bytes_max: RESP_BULK_BYTES_MAX };

    /// [`RESP_UNAUTHENTICATED_ARGS_MAX`] arguments of [`RESP_UNAUTHENTICATED_BULK_BYTES_MAX`];
    /// beyond: `unauthenticated multibulk length` / `unauthenticated bulk length` (multibulk
    /// requests only: inline ones keep their 64 KiB line bound, as in Redis).
    pub const UNAUTHENTICATED: RequestLimits =
        RequestLimits { args_max: RESP_UNAUTHENTICATED_ARGS_MAX, bulk_bytes_max: RESP_UNAUTHENTICATED_BULK_BYTES_MAX };
}

/// Reusable state of the request parser: where the arguments of the last request lie, and the
/// unquoted bytes of an inline request. Kept per gateway thread, so parsing allocates nothing
/// once these have grown to the largest request seen.
#[derive(Debug, Default)]
pub struct RequestParser {
    spans: Vec<Range<usize>>,
    inline: Vec<u8>,
}

/// The arguments of one request (the command name first), borrowed from the input or, for an
/// inline request, from the parser.
#[derive(Debug, Clone, Copy)]
pub struct Args<'a> {
    source: &'a [u8],
    spans: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    /// Number of arguments, the command name included; 0 for an empty request.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True for an empty request (an empty array or a blank inline line), which gets no reply.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Argument `index`.
    ///
    /// # Panics
    /// If `index >= len()`.
    pub fn get(&self, index: usize) -> &'a [u8] {
        &self.source[self.spans[index].clone()]
    }

    /// Every argument from `start` on.
    pub fn iter_from(&self, start: usize) -> impl ExactSizeIterator<Item = &'a [u8]> + 'a {
        let source = self.source;
        self.spans.get(start..).unwrap_or(&[]).iter().map(move |span| &source[span.clone()])
    }
}

impl RequestParser {
    /// A parser with nothing buffered.
    pub fn new() -> RequestParser {
        RequestParser::default()
    }

    /// Parses the request at the front of `input`. `Ok(Some((args, consumed)))` when it is
    /// complete (`args` may be empty: skip it), `Ok(None)` when more bytes are needed.
    pub fn parse<'a>(&'a mut self, input: &'a [u8]) -> Result<Option<(Args<'a>, usize)>, CodecError> {
        self.parse_within(input, RequestLimits::AUTHENTICATED)
    }

    /// [`RequestParser::parse`] within `limits`.
    pub fn parse_within<'a>(
        &'a mut self,
        input: &'a [u8],
        limits: RequestLimits,
    ) -> Result<Option<(Args<'a>, usize)>, CodecError> {
        self.spans.clear();
        let parsed = match input.first() {
            None => return Ok(None),
            Some(b'*') => check_multibulk(input, limits, &mut self.spans)?.map(|consumed| (input, consumed)),
            Some(_) => self.split_inline(input)?.map(|consumed| (&self.inline[..], consumed)),
        };
        Ok(parsed.map(|(source, consumed)| {
            debug_assert!(consumed <= input.len());
            debug_assert!(self.spans.iter().all(|span| span.end <= source.len()));
            (Args { source, spans: &self.spans }, consumed)
        }))
    }

    /// Splits the first line into `self.inline` / `self.spans`; returns the bytes consumed.
    fn split_inline(&mut self, input: &[u8]) -> Result<Option<usize>, CodecError> {
        let window = &input[..input.len().min(RESP_INLINE_BYTES_MAX + 1)];
        let Some(newline) = window.iter().position(|&byte| byte == b'\n') else {
            return if input.len() > RESP_INLINE_BYTES_MAX { Err(CodecError::InlineTooBig) } else { Ok(None) };
        };
        let line = input[..newline].strip_suffix(b"\r").unwrap_or(&input[..newline]);
        self.inline.clear();
        split_inline_arguments(line, &mut self.inline, &mut self.spans)?;
        Ok(Some(newline + 1))
    }
}

/// Walks `*count\r\n` and `count` bulk strings, recording each argument's span; returns the
/// bytes the request takes, or `None` if it is not all here.
fn check_multibulk(
    input: &[u8],
    limits: RequestLimits,
    spans: &mut Vec<Range<usize>>,
) -> Result<Option<usize>, CodecError> {
    debug_assert!(limits.args_max <= RESP_ARGS_MAX && limits.bulk_bytes_max <= RESP_BULK_BYTES_MAX);
    let Some((count_text, mut position)) =
        line_at(input, 1, RESP_HEADER_LINE_BYTES_MAX, CodecError::MultibulkHeaderTooBig)?
    else {
        return Ok(None);
    };
    let count = parse_integer(count_text).ok_or(CodecError::InvalidMultibulkLength)?;
    if count <= 0 {
        return Ok(Some(position)); // an empty request, skipped as Redis does
    }
    let count = usize::try_from(count).map_err(|_| CodecError::InvalidMultibulkLength)?;
    if count > RESP_ARGS_MAX {
        return Err(CodecError::InvalidMultibulkLength);
    }
    if count > limits.args_max {
        return Err(CodecError::UnauthenticatedMultibulkLength);
    }
    for _ in 0..count {
        match input.get(position) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&other) => return Err(CodecError::ExpectedBulk(other)),
        }
        let Some((length_text, data_start)) =
            line_at(input, position + 1, RESP_HEADER_LINE_BYTES_MAX, CodecError::BulkHeaderTooBig)?
        else {
            return Ok(None);
        };
        let length = parse_integer(length_text)
            .and_then(|length| usize::try_from(length).ok())
            .filter(|&length| length <= RESP_BULK_BYTES_MAX)
            .ok_or(CodecError::InvalidBulkLength)?;
        if length > limits.bulk_bytes_max {
            return Err(CodecError::UnauthenticatedBulkLength);
        }
        let data_end = data_start + length;
        match input.get(data_end..data_end + 2) {
            None => return Ok(None),
            Some(CRLF) => {}
            Some(_) => return Err(CodecError::ExpectedCrlf),
        }
        spans.push(data_start..data_end);
        position = data_end + 2;
    }
    debug_assert_eq!(spans.len(), count);
    Ok(Some(position))
}

/// Splits an inline line as Redis does (`sdssplitargs`): blanks separate arguments; `"..."`
/// takes `\xHH`, `\n`, `\r`, `\t`, `\b`, `\a` and `\<any>` escapes; `'...'` takes `\'`. A
/// closing quote must be followed by a blank or the end of the line.
fn split_inline_arguments(line: &[u8], out: &mut Vec<u8>, spans: &mut Vec<Range<usize>>) -> Result<(), CodecError> {
    let mut position = 0;
    loop {
        while line.get(position).is_some_and(|byte| is_blank(*byte)) {
            position += 1;
        }
        let Some(&first) = line.get(position) else {
            return Ok(());
        };
        if spans.len() == RESP_ARGS_MAX {
            return Err(CodecError::InlineTooManyArguments);
        }
        let start = out.len();
        position = match first {
            b'"' => split_double_quoted(line, position + 1, out)?,
            b'\'' => split_single_quoted(line, position + 1, out)?,
            _ => {
                let end = line[position..].iter().position(|byte| is_blank(*byte)).map_or(line.len(), |n| position + n);
                out.extend_from_slice(&line[position..end]);
                end
            }
        };
        spans.push(start..out.len());
    }
}

fn is_blank(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// After a closing quote at `closing`: the position to continue from, or an error unless a
/// blank or the end of the line follows.
fn after_closing_quote(line: &[u8], closing: usize) -> Result<usize, CodecError> {
    match line.get(closing + 1) {
        None => Ok(closing + 1),
        Some(&byte) if is_blank(byte) => Ok(closing + 1),
        Some(_) => Err(CodecError::UnbalancedQuotes),
    }
}

fn split_double_quoted(line: &[u8], mut position: usize, out: &mut Vec<u8>) -> Result<usize, CodecError> {
    loop {
        match line.get(position) {
            None => return Err(CodecError::UnbalancedQuotes),
            Some(b'"') => return after_closing_quote(line, position),
            Some(b'\\') => {
                let escaped = line.get(position + 1).copied().ok_or(CodecError::UnbalancedQuotes)?;
                let hex = line.get(position + 2..position + 4).and_then(hex_byte);
                match (escaped, hex) {
                    (b'x', Some(byte)) => {
                        out.push(byte);
                        position += 4;
                        continue;
                    }
                    (b'n', _) => out.push(b'\n'),
                    (b'r', _) => out.push(b'\r'),
                    (b't', _) => out.push(b'\t'),
                    (b'b', _) => out.push(0x08),
                    (b'a', _) => out.push(0x07),
                    (other, _) => out.push(other),
                }
                position += 2;
            }
            Some(&byte) => {
                out.push(byte);
                position += 1;
            }
        }
    }
}

fn split_single_quoted(line: &[u8], mut position: usize, out: &mut Vec<u8>) -> Result<usize, CodecError> {
    loop {
        match line.get(position) {
            None => return Err(CodecError::UnbalancedQuotes),
            Some(b'\'') => return after_closing_quote(line, position),
            Some(b'\\') if line.get(position + 1) == Some(&b'\'') => {
                out.push(b'\'');
                position += 2;
            }
            Some(&byte) => {
                out.push(byte);
                position += 1;
            }
        }
    }
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    let text = std::str::from_utf8(pair).ok()?;
    if text.len() == 2 && text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        u8::from_str_radix(text, 16).ok()
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Any value (replies; used by tests and tools)

/// Parses the value at the front of `input`: `Ok(Some((frame, consumed)))`, or `Ok(None)`
/// until the whole value is buffered. Its extent is checked before anything is allocated.
pub fn parse_frame(input: &[u8]) -> Result<Option<(Frame, usize)>, CodecError> {
    let Some(end) = frame_end(input, 0, 0)? else {
        return Ok(None);
    };
    let (frame, decoded_end) = decode_frame(&input[..end], 0, 0)?;
    debug_assert_eq!(decoded_end, end, "check and decode agree on the value's extent");
    Ok(Some((frame, end)))
}

/// What the header line of a value says.
enum Header<'a> {
    /// A value complete in its header line.
    Line(u8, &'a [u8]),
    /// `length` bytes of data (and CRLF) follow the header line.
    Data(u8, usize),
    /// `count` values (pairs for maps and attributes) follow.
    Aggregate(u8, usize),
    /// `$-1` or `*-1`.
    Null,
}

/// Reads the header line at `start`: the header and where the value's body starts.
fn header_at(input: &[u8], start: usize) -> Result<Option<(Header<'_>, usize)>, CodecError> {
    let Some(&type_byte) = input.get(start) else {
        return Ok(None);
    };
    if !b"+-:$*_#,(!=%~|>".contains(&type_byte) {
        return Err(CodecError::UnknownType(type_byte));
    }
    let limit = match type_byte {
        b'+' | b'-' | b'(' | b',' => RESP_INLINE_BYTES_MAX,
        _ => RESP_HEADER_LINE_BYTES_MAX,
    };
    let Some((line, body)) = line_at(input, start + 1, limit, CodecError::InvalidHeaderLine)? else {
        return Ok(None);
    };
    if line.first() == Some(&b'?') && b"$*%~|>=!".contains(&type_byte) {
        return Err(CodecError::Streamed);
    }
    let header = match type_byte {
        b'$' | b'!' | b'=' => match parse_integer(line) {
            Some(-1) if type_byte == b'$' => Header::Null,
            Some(length) => {
                let length = usize::try_from(length).map_err(|_| CodecError::InvalidBulkLength)?;
                if length > RESP_REPLY_BULK_BYTES_MAX {
                    return Err(CodecError::InvalidBulkLength);
                }
                Header::Data(type_byte, length)
            }
            None => return Err(CodecError::InvalidBulkLength),
        },
        b'*' | b'%' | b'~' | b'|' | b'>' => match parse_integer(line) {
            Some(-1) if type_byte == b'*' => Header::Null,
            Some(count) => {
                let count = usize::try_from(count).map_err(|_| CodecError::InvalidAggregateLength)?;
                if count > RESP_AGGREGATE_ITEMS_MAX {
                    return Err(CodecError::InvalidAggregateLength);
                }
                Header::Aggregate(type_byte, count)
            }
            None => return Err(CodecError::InvalidAggregateLength),
        },
        _ => Header::Line(type_byte, line),
    };
    Ok(Some((header, body)))
}

/// The end of the value starting at `start`, or `None` if it is not all here. Validates
/// everything [`decode_frame`] relies on.
fn frame_end(input: &[u8], start: usize, depth: usize) -> Result<Option<usize>, CodecError> {
    let Some((header, body)) = header_at(input, start)? else {
        return Ok(None);
    };
    match header {
        Header::Null => Ok(Some(body)),
        Header::Line(type_byte, line) => {
            line_value(type_byte, line)?;
            Ok(Some(body))
        }
        Header::Data(type_byte, length) => {
            let data_end = body + length;
            match input.get(data_end..data_end + 2) {
                None => Ok(None),
                Some(CRLF) => {
                    if type_byte == b'=' && (length < 4 || input[body + 3] != b':') {
                        return Err(CodecError::InvalidVerbatim);
                    }
                    Ok(Some(data_end + 2))
                }
                Some(_) => Err(CodecError::ExpectedCrlf),
            }
        }
        Header::Aggregate(type_byte, count) => {
            if depth >= RESP_NESTING_DEPTH_MAX {
                return Err(CodecError::NestedTooDeep);
            }
            let items = if matches!(type_byte, b'%' | b'|') { count * 2 } else { count };
            let mut position = body;
            for _ in 0..items {
                match frame_end(input, position, depth + 1)? {
                    Some(end) => position = end,
                    None => return Ok(None),
                }
            }
            Ok(Some(position))
        }
    }
}

/// The value of a one-line type (`+ - : _ # , (`).
fn line_value(type_byte: u8, line: &[u8]) -> Result<Frame, CodecError> {
    Ok(match type_byte {
        b'+' => Frame::Simple(line.to_vec()),
        b'-' => Frame::Error(line.to_vec()),
        b':' => Frame::Integer(parse_integer(line).ok_or(CodecError::InvalidInteger)?),
        b'_' if line.is_empty() => Frame::Null,
        b'_' => return Err(CodecError::InvalidHeaderLine),
        b'#' => match line {
            b"t" => Frame::Boolean(true),
            b"f" => Frame::Boolean(false),
            _ => return Err(CodecError::InvalidBoolean),
        },
        b',' => Frame::Double(parse_double(line).ok_or(CodecError::InvalidDouble)?),
        b'(' => {
            let digits = line.strip_prefix(b"-").unwrap_or(line);
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return Err(CodecError::InvalidBigNumber);
            }
            Frame::BigNumber(line.to_vec())
        }
        other => return Err(CodecError::UnknownType(other)),
    })
}

fn parse_double(line: &[u8]) -> Option<f64> {
    match line {
        b"inf" | b"+inf" => return Some(f64::INFINITY),
        b"-inf" => return Some(f64::NEG_INFINITY),
        b"nan" | b"-nan" => return Some(f64::NAN),
        _ => {}
    }
    // Only digits, sign, point and exponent: Rust's parser also takes words like "infinity".
    if line.is_empty() || !line.iter().all(|byte| byte.is_ascii_digit() || b"+-.eE".contains(byte)) {
        return None;
    }
    std::str::from_utf8(line).ok()?.parse().ok()
}

/// Decodes the value at `start` of an input that [`frame_end`] has checked.
fn decode_frame(input: &[u8], start: usize, depth: usize) -> Result<(Frame, usize), CodecError> {
    let (header, body) = header_at(input, start)?.ok_or(CodecError::InvalidHeaderLine)?;
    match header {
        Header::Null => Ok((Frame::Null, body)),
        Header::Line(type_byte, line) => Ok((line_value(type_byte, line)?, body)),
        Header::Data(type_byte, length) => {
            let data = input.get(body..body + length).ok_or(CodecError::InvalidBulkLength)?;
            let frame = match type_byte {
                b'$' => Frame::Bulk(data.to_vec()),
                b'!' => Frame::BulkError(data.to_vec()),
                _ => {
                    let format: [u8; 3] =
                        data.get(..3).and_then(|f| f.try_into().ok()).ok_or(CodecError::InvalidVerbatim)?;
                    Frame::Verbatim { format, text: data[4..].to_vec() }
                }
            };
            Ok((frame, body + length + 2))
        }
        Header::Aggregate(type_byte, count) => {
            if depth >= RESP_NESTING_DEPTH_MAX {
                return Err(CodecError::NestedTooDeep);
            }
            let mut position = body;
            let next = |position: &mut usize| -> Result<Frame, CodecError> {
                let (frame, end) = decode_frame(input, *position, depth + 1)?;
                *position = end;
                Ok(frame)
            };
            let frame = if matches!(type_byte, b'%' | b'|') {
                let mut pairs = Vec::with_capacity(count);
                for _ in 0..count {
                    let key = next(&mut position)?;
                    pairs.push((key, next(&mut position)?));
                }
                if type_byte == b'%' {
                    Frame::Map(pairs)
                } else {
                    Frame::Attribute(pairs)
                }
            } else {
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    items.push(next(&mut position)?);
                }
                match type_byte {
                    b'*' => Frame::Array(items),
                    b'~' => Frame::Set(items),
                    _ => Frame::Push(items),
                }
            };
            Ok((frame, position))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_all(input: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CodecError> {
        let mut parser = RequestParser::new();
        Ok(parser.parse(input)?.map(|(args, consumed)| {
            assert!(consumed <= input.len());
            args.iter_from(0).map(<[u8]>::to_vec).collect()
        }))
    }

    fn strings(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    #[test]
    fn multibulk_requests_parse_and_report_their_length() {
        let input = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n";
        let mut parser = RequestParser::new();
        let (args, consumed) = parser.parse(input).unwrap().unwrap();
        assert_eq!((args.len(), args.get(0), args.get(1), consumed), (2, &b"GET"[..], &b"k"[..], 20));
        let (args, consumed) = parser.parse(&input[20..]).unwrap().unwrap();
        assert_eq!((args.get(0), consumed), (&b"PING"[..], 14));
    }

    #[test]
    fn every_truncation_of_a_request_is_incomplete_not_an_error() {
        let input = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\r\nxy\r\n";
        for end in 0..input.len() {
            assert_eq!(parse_all(&input[..end]), Ok(None), "prefix of {end} bytes");
        }
        assert_eq!(parse_all(input), Ok(Some(strings(&["SET", "k", "v\r\nxy"]))));
    }

    #[test]
    fn malformed_requests_get_redis_protocol_errors() {
        let cases: &[(&[u8], &str)] = &[
            (b"*x\r\n", "Protocol error: invalid multibulk length"),
            (b"*2\r\n:3\r\n", "Protocol error: expected '$', got ':'"),
            (b"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"),
            (b"*1\r\n$65537\r\n", "Protocol error: invalid bulk length"),
            (b"*514\r\n", "Protocol error: invalid multibulk length"),
            (b"*1\r\n$1\r\nab\r\n", "Protocol error: expected CRLF"),
            (b"*1\rx", "Protocol error: expected CRLF"),
            (b"*11111111111111111111111111111111111111", "Protocol error: too big mbulk count string"),
            (b"*1\r\n$11111111111111111111111111111111111111", "Protocol error: too big bulk count string"),
            (b"set \"a b\r\n", "Protocol error: unbalanced quotes in request"),
            (b"set \"a\"b c\r\n", "Protocol error: unbalanced quotes in request"),
            (b"set 'a\r\n", "Protocol error: unbalanced quotes in request"),
        ];
        for (input, text) in cases {
            let error = parse_all(input).unwrap_err();
            assert_eq!(error.to_string(), *text, "{:?}", String::from_utf8_lossy(input));
        }
        let words = format!("MGET{}\r\n", " k".repeat(RESP_ARGS_MAX - 1));
        assert_eq!(parse_all(words.as_bytes()).unwrap().unwrap().len(), RESP_ARGS_MAX);
        let too_many = format!("MGET{}\r\n", " k".repeat(RESP_ARGS_MAX));
        assert_eq!(parse_all(too_many.as_bytes()), Err(CodecError::InlineTooManyArguments));
        let long_line = vec![b'x'; RESP_INLINE_BYTES_MAX + 1];
        assert_eq!(parse_all(&long_line), Err(CodecError::InlineTooBig));
        assert_eq!(parse_all(&long_line[..RESP_INLINE_BYTES_MAX]), Ok(None));
        let max_bulk = format!("*1\r\n${RESP_BULK_BYTES_MAX}\r\n");
        assert_eq!(parse_all(max_bulk.as_bytes()), Ok(None), "the largest bulk is accepted");
    }

    /// Before a connection authenticates, Redis's limits for anonymous clients: 10 arguments,
    /// 16 KiB per bulk string; refused as soon as the header says more, before any of it is
    /// buffered. Inline requests keep their own 64 KiB line bound.
    #[test]
    fn unauthenticated_requests_are_held_to_redis_s_small_limits() {
        let limited = |input: &[u8]| {
            RequestParser::new()
                .parse_within(input, RequestLimits::UNAUTHENTICATED)
                .map(|parsed| parsed.map(|(args, consumed)| (args.len(), consumed)))
        };
        let ten = format!("*10\r\n{}", "$1\r\nx\r\n".repeat(10));
        assert_eq!(limited(ten.as_bytes()), Ok(Some((10, ten.len()))));
        assert_eq!(limited(b"*11\r\n"), Err(CodecError::UnauthenticatedMultibulkLength));
        let at_bound = format!("*1\r\n${RESP_UNAUTHENTICATED_BULK_BYTES_MAX}\r\n");
        assert_eq!(limited(at_bound.as_bytes()), Ok(None));
        let beyond = format!("*1\r\n${}\r\n", RESP_UNAUTHENTICATED_BULK_BYTES_MAX + 1);
        assert_eq!(limited(beyond.as_bytes()), Err(CodecError::UnauthenticatedBulkLength));
        assert_eq!(limited(b"*514\r\n"), Err(CodecError::InvalidMultibulkLength), "the general bound first");
        assert_eq!(CodecError::UnauthenticatedBulkLength.to_string(), "Protocol error: unauthenticated bulk length");
        let inline = format!("AUTH {}\r\n", "p".repeat(20_000));
        assert_eq!(limited(inline.as_bytes()), Ok(Some((2, inline.len()))));
        assert_eq!(RequestParser::new().parse(beyond.as_bytes()).map(|parsed| parsed.is_none()), Ok(true));
    }

    #[test]
    fn inline_requests_split_like_redis() {
        assert_eq!(parse_all(b"GET k\n"), Ok(Some(strings(&["GET", "k"]))));
        assert_eq!(parse_all(b"  set\tk   v \r\n"), Ok(Some(strings(&["set", "k", "v"]))));
        assert_eq!(
            parse_all(b"set \"a\\x41\\n\\\"\" 'b\\'c' d\"e\r\n"),
            Ok(Some(strings(&["set", "aA\n\"", "b'c", "d\"e"])))
        );
        assert_eq!(parse_all(b"echo \"\\xZZ\" \"\"\r\n"), Ok(Some(strings(&["echo", "xZZ", ""]))));
        assert_eq!(parse_all(b"\r\n"), Ok(Some(vec![])), "a blank line is an empty request");
        assert_eq!(parse_all(b"*0\r\n"), Ok(Some(vec![])));
        assert_eq!(parse_all(b"*-1\r\n"), Ok(Some(vec![])));
        assert_eq!(parse_all(b"GET k"), Ok(None), "no newline yet");
    }

    #[test]
    fn replies_encode_in_each_protocol() {
        let cases: Vec<(Frame, &[u8], &[u8])> = vec![
            (Frame::Null, b"$-1\r\n", b"_\r\n"),
            (Frame::Boolean(true), b":1\r\n", b"#t\r\n"),
            (Frame::Double(1.5), b"$3\r\n1.5\r\n", b",1.5\r\n"),
            (Frame::Double(f64::NEG_INFINITY), b"$4\r\n-inf\r\n", b",-inf\r\n"),
            (Frame::BigNumber(b"-12".to_vec()), b"$3\r\n-12\r\n", b"(-12\r\n"),
            (Frame::BulkError(b"ERR x".to_vec()), b"-ERR x\r\n", b"!5\r\nERR x\r\n"),
            (Frame::Verbatim { format: *b"txt", text: b"hi".to_vec() }, b"$2\r\nhi\r\n", b"=6\r\ntxt:hi\r\n"),
            (Frame::Map(vec![(Frame::simple("a"), Frame::Integer(1))]), b"*2\r\n+a\r\n:1\r\n", b"%1\r\n+a\r\n:1\r\n"),
            (Frame::Set(vec![Frame::Integer(-7)]), b"*1\r\n:-7\r\n", b"~1\r\n:-7\r\n"),
            (Frame::Attribute(vec![(Frame::simple("a"), Frame::Null)]), b"", b"|1\r\n+a\r\n_\r\n"),
            (Frame::Error(b"ERR a\r\nb".to_vec()), b"-ERR a  b\r\n", b"-ERR a  b\r\n"),
            (Frame::Integer(i64::MIN), b":-9223372036854775808\r\n", b":-9223372036854775808\r\n"),
        ];
        for (frame, resp2, resp3) in cases {
            assert_eq!(frame.to_bytes(Protocol::Resp2), resp2, "{frame:?} in RESP2");
            assert_eq!(frame.to_bytes(Protocol::Resp3), resp3, "{frame:?} in RESP3");
        }
    }

    #[test]
    fn frames_parse_including_resp2_nulls_and_nan() {
        assert_eq!(parse_frame(b"*-1\r\n"), Ok(Some((Frame::Null, 5))));
        assert_eq!(parse_frame(b"$-1\r\n"), Ok(Some((Frame::Null, 5))));
        let (nan, _) = parse_frame(b",nan\r\n").unwrap().unwrap();
        assert!(matches!(nan, Frame::Double(value) if value.is_nan()));
        assert_eq!(parse_frame(b",1e3\r\n"), Ok(Some((Frame::Double(1000.0), 6))));
        for bad in
            [&b",infinity\r\n"[..], b",\r\n", b"#x\r\n", b"(1a\r\n", b":1.5\r\n", b"=2\r\nab\r\n", b"$?\r\n", b"_x\r\n"]
        {
            assert!(parse_frame(bad).is_err(), "{:?} accepted", String::from_utf8_lossy(bad));
        }
        let deep = "*1\r\n".repeat(RESP_NESTING_DEPTH_MAX + 1) + ":1\r\n";
        assert_eq!(parse_frame(deep.as_bytes()), Err(CodecError::NestedTooDeep));
    }

    fn leaf(resp3: bool) -> BoxedStrategy<Frame> {
        let line =
            proptest::collection::vec(any::<u8>().prop_filter("no CR/LF", |b| *b != b'\r' && *b != b'\n'), 0..16);
        let bytes = proptest::collection::vec(any::<u8>(), 0..32);
        let resp2 = prop_oneof![
            line.clone().prop_map(Frame::Simple),
            line.clone().prop_map(Frame::Error),
            any::<i64>().prop_map(Frame::Integer),
            bytes.clone().prop_map(Frame::Bulk),
            Just(Frame::Null),
        ];
        if !resp3 {
            return resp2.boxed();
        }
        let digits = "-?[0-9]{1,40}".prop_map(String::into_bytes);
        let double = any::<f64>().prop_filter("NaN never equals itself", |value| !value.is_nan());
        prop_oneof![
            resp2,
            any::<bool>().prop_map(Frame::Boolean),
            double.prop_map(Frame::Double),
            digits.prop_map(Frame::BigNumber),
            bytes.clone().prop_map(Frame::BulkError),
            (any::<[u8; 3]>(), bytes).prop_map(|(format, text)| Frame::Verbatim { format, text }),
        ]
        .boxed()
    }

    fn frame(resp3: bool) -> impl Strategy<Value = Frame> {
        leaf(resp3).prop_recursive(4, 48, 6, move |inner| {
            let items = proptest::collection::vec(inner.clone(), 0..6);
            let pairs = proptest::collection::vec((inner.clone(), inner), 0..4);
            if resp3 {
                prop_oneof![
                    items.clone().prop_map(Frame::Array),
                    items.clone().prop_map(Frame::Set),
                    items.prop_map(Frame::Push),
                    pairs.clone().prop_map(Frame::Map),
                    pairs.prop_map(Frame::Attribute),
                ]
                .boxed()
            } else {
                items.prop_map(Frame::Array).boxed()
            }
        })
    }

    fn request() -> impl Strategy<Value = Vec<Vec<u8>>> {
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..8)
    }

    fn encode_request(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        write_array_header(&mut out, args.len());
        for arg in args {
            write_bulk(&mut out, arg);
        }
        out
    }

    proptest! {
        #[test]
        fn resp2_frames_round_trip(frame in frame(false)) {
            let bytes = frame.to_bytes(Protocol::Resp2);
            prop_assert_eq!(parse_frame(&bytes), Ok(Some((frame, bytes.len()))));
        }

        #[test]
        fn resp3_frames_round_trip(frame in frame(true)) {
            let bytes = frame.to_bytes(Protocol::Resp3);
            prop_assert_eq!(parse_frame(&bytes), Ok(Some((frame, bytes.len()))));
        }

        #[test]
        fn truncated_frames_are_incomplete(frame in frame(true), cut in any::<prop::sample::Index>()) {
            let bytes = frame.to_bytes(Protocol::Resp3);
            let end = cut.index(bytes.len());
            prop_assert_eq!(parse_frame(&bytes[..end]), Ok(None));
        }

        #[test]
        fn requests_round_trip_and_truncations_are_incomplete(
            args in request(), cut in any::<prop::sample::Index>(), tail in proptest::collection::vec(any::<u8>(), 0..8)
        ) {
            let mut bytes = encode_request(&args);
            let length = bytes.len();
            prop_assert_eq!(parse_all(&bytes[..cut.index(length)]), Ok(None));
            bytes.extend_from_slice(&tail);
            let mut parser = RequestParser::new();
            let (parsed, consumed) = parser.parse(&bytes).unwrap().unwrap();
            prop_assert_eq!(consumed, length);
            prop_assert_eq!(parsed.iter_from(0).map(<[u8]>::to_vec).collect::<Vec<_>>(), args);
        }

        #[test]
        fn arbitrary_bytes_never_panic_either_parser(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut parser = RequestParser::new();
            if let Ok(Some((args, consumed))) = parser.parse(&bytes) {
                prop_assert!(consumed <= bytes.len() && args.len() <= RESP_ARGS_MAX);
            }
            if let Ok(Some((_, consumed))) = parse_frame(&bytes) {
                prop_assert!(consumed <= bytes.len());
            }
        }

        #[test]
        fn mutated_requests_never_panic(args in request(), position in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let mut bytes = encode_request(&args);
            let index = position.index(bytes.len());
            bytes[index] = byte;
            let mut parser = RequestParser::new();
            let _ = parser.parse(&bytes);
            let _ = parse_frame(&bytes);
        }

        #[test]
        fn inline_words_round_trip(words in proptest::collection::vec("[a-zA-Z0-9:_.-]{1,12}", 1..8)) {
            let line = words.join(" ") + "\r\n";
            prop_assert_eq!(parse_all(line.as_bytes()), Ok(Some(words.iter().map(|w| w.as_bytes().to_vec()).collect())));
        }
    }
}
