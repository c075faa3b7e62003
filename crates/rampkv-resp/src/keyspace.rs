//! SCAN's and KEYS's arguments and SCAN's cursor. No I/O and no gateway state.
//!
//! # The cursor
//! Redis clients parse SCAN's cursor as an unsigned 64-bit decimal number (redis-py's
//! `int(cursor)`, redis-cli's `strtoull`), so the gateway's cursor is one, opaque to them:
//!
//! ```text
//! bits 63..48  partition index (0..65,535: CLUSTER_PARTITIONS_MAX partitions)
//! bits 47..0   position p in the partition's key-hash order: resume at key hash p << 16
//!              (p = 0: at the partition's start)
//! ```
//!
//! `0` starts a scan and, returned, ends it, as in Redis. The servers end every page at the
//! end of a block of 2^16 hashes (`LIST_HASH_BLOCK_BITS`), so the position `(h + 1) >> 16` of
//! a page that ended after hash h is exact: a resumed scan neither repeats nor skips a key. (A
//! position that were not a block end would be rounded down: keys repeated, none skipped.)
//! The one position that would read as `0` (partition 0, a page that ended in its first block)
//! is not returned: the gateway goes on to the next page first.
//! A cursor that is not a number, or names a partition the cluster does not have, is Redis's
//! `ERR invalid cursor`.

use crate::codec::{Args, Frame};

/// Bits of the cursor that hold the position.
const POSITION_BITS: u32 = 48;
/// Hash bits the position leaves out (the rounding of a resumed page).
const POSITION_SHIFT: u32 = u64::BITS - POSITION_BITS;

/// Redis's reply to a cursor it cannot read.
pub const INVALID_CURSOR_REPLY: &str = "ERR invalid cursor";

/// SCAN's COUNT when none is given (Redis's).
pub const SCAN_COUNT_DEFAULT: usize = 10;

/// Where a scan stands: a partition and the hash its next page starts after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanCursor {
    pub partition: u32,
    /// `None`: from the partition's start.
    pub after: Option<u64>,
}

impl ScanCursor {
    /// The start of a scan (cursor `0`).
    pub const START: ScanCursor = ScanCursor { partition: 0, after: None };

    /// Reads a cursor a client sent back, for a cluster of `partitions` partitions.
    pub fn decode(cursor: u64, partitions: u32) -> Result<ScanCursor, Frame> {
        let partition = cursor >> POSITION_BITS;
        if partition >= u64::from(partitions) {
            return Err(Frame::error(INVALID_CURSOR_REPLY));
        }
        let position = cursor & ((1 << POSITION_BITS) - 1);
        let after = (position > 0).then(|| (position << POSITION_SHIFT) - 1);
        Ok(ScanCursor { partition: partition as u32, after })
    }

    /// The cursor to send for continuing in `partition` after hash `after`: `None` where that
    /// would be `0` (which ends a scan), and for `after` = `u64::MAX` (the partition is done).
    pub fn encode(partition: u32, after: u64) -> Option<u64> {
        let position = after.checked_add(1)? >> POSITION_SHIFT;
        let cursor = (u64::from(partition) << POSITION_BITS) | position;
        debug_assert!(u64::from(partition) < 1 << (u64::BITS - POSITION_BITS));
        (cursor != 0).then_some(cursor)
    }

    /// The cursor of `partition`'s start (`None` for partition 0: that is `0`, the end).
    pub fn of_partition_start(partition: u32) -> Option<u64> {
        (partition > 0).then(|| u64::from(partition) << POSITION_BITS)
    }
}

/// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanRequest {
    /// The cursor as sent (checked against the cluster when it runs).
    pub cursor: u64,
    pub pattern: Option<Vec<u8>>,
    /// Keys asked of a server per page (a hint, as in Redis).
    pub count: usize,
    /// Whether the TYPE asked for is `string` (or none was): every rampkv value is a string,
    /// so any other type matches no key.
    pub type_matches: bool,
}

/// Parses SCAN's arguments in Redis 7's order and with its replies: the cursor first
/// (`ERR invalid cursor`), then the options, each with its value (`ERR syntax error`).
pub fn parse_scan(args: &Args<'_>) -> Result<ScanRequest, Frame> {
    let cursor = parse_cursor(args.get(1)).ok_or_else(|| Frame::error(INVALID_CURSOR_REPLY))?;
    let mut request = ScanRequest { cursor, pattern: None, count: SCAN_COUNT_DEFAULT, type_matches: true };
    let mut at = 2;
    while at < args.len() {
        let (option, value) = (args.get(at), (at + 1 < args.len()).then(|| args.get(at + 1)));
        let Some(value) = value else { return Err(Frame::error("ERR syntax error")) };
        if option.eq_ignore_ascii_case(b"count") {
            let count = parse_long(value).ok_or_else(|| Frame::error("ERR value is not an integer or out of range"))?;
            if count < 1 {
                return Err(Frame::error("ERR syntax error"));
            }
            request.count = usize::try_from(count).unwrap_or(usize::MAX);
        } else if option.eq_ignore_ascii_case(b"match") {
            request.pattern = Some(value.to_vec());
        } else if option.eq_ignore_ascii_case(b"type") {
            request.type_matches = value.eq_ignore_ascii_case(b"string");
        } else {
            return Err(Frame::error("ERR syntax error"));
        }
        at += 2;
    }
    Ok(request)
}

/// A cursor as Redis reads one: an unsigned 64-bit decimal number.
fn parse_cursor(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

fn parse_long(text: &[u8]) -> Option<i64> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::RequestParser;

    fn scan(line: &str) -> Result<ScanRequest, Frame> {
        let mut parser = RequestParser::new();
        let input = format!("{line}\r\n");
        let (args, _) = parser.parse(input.as_bytes()).unwrap().unwrap();
        parse_scan(&args)
    }

    fn error(reply: Result<ScanRequest, Frame>) -> String {
        match reply {
            Err(Frame::Error(message)) => String::from_utf8(message).unwrap(),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn scan_arguments_are_read_as_redis_reads_them() {
        let plain = scan("SCAN 0").unwrap();
        assert_eq!((plain.cursor, plain.pattern, plain.count, plain.type_matches), (0, None, 10, true));
        let full = scan("scan 42 MATCH user:* count 100 TYPE String").unwrap();
        assert_eq!(
            (full.cursor, full.pattern.as_deref(), full.count, full.type_matches),
            (42, Some(&b"user:*"[..]), 100, true)
        );
        assert!(!scan("SCAN 0 TYPE list").unwrap().type_matches);
        assert_eq!(scan("SCAN 18446744073709551615").unwrap().cursor, u64::MAX);
        for bad in ["SCAN abc", "SCAN -1", "SCAN 18446744073709551616", "SCAN 1x", "SCAN +1", "SCAN ''"] {
            assert_eq!(error(scan(bad)), INVALID_CURSOR_REPLY, "{bad}");
        }
        assert_eq!(error(scan("SCAN 0 COUNT 0")), "ERR syntax error");
        assert_eq!(error(scan("SCAN 0 COUNT x")), "ERR value is not an integer or out of range");
        assert_eq!(error(scan("SCAN 0 MATCH")), "ERR syntax error");
        assert_eq!(error(scan("SCAN 0 foo bar")), "ERR syntax error");
        assert_eq!(error(scan("SCAN abc foo")), INVALID_CURSOR_REPLY, "the cursor is checked first");
    }

    #[test]
    fn cursors_round_trip_never_skip_and_bad_ones_are_refused() {
        assert_eq!(ScanCursor::decode(0, 4), Ok(ScanCursor::START));
        let partition_two = ScanCursor::of_partition_start(2).unwrap();
        assert_eq!(ScanCursor::decode(partition_two, 4), Ok(ScanCursor { partition: 2, after: None }));
        assert_eq!(ScanCursor::of_partition_start(0), None, "0 would end the scan");
        for after in [65_535u64, 65_536, 1 << 40, 0xDEAD_BEEF_0000_1234, u64::MAX - 1] {
            for partition in [0u32, 3] {
                let cursor = ScanCursor::encode(partition, after).unwrap();
                let decoded = ScanCursor::decode(cursor, 4).unwrap();
                assert_eq!(decoded.partition, partition);
                let resumed_after = decoded.after.unwrap();
                assert!(resumed_after <= after, "never past what the servers returned: {after:#x}");
                assert!(after - resumed_after < 1 << 16, "at most one rounding step back: {after:#x}");
            }
        }
        assert_eq!(ScanCursor::encode(0, 100), None, "would read as 0: the gateway goes on instead");
        assert_eq!(ScanCursor::encode(1, u64::MAX), None, "a partition done has no position");
        assert_eq!(ScanCursor::decode(4 << 48, 4), Err(Frame::error(INVALID_CURSOR_REPLY)), "partition 4 of 4");
        assert_eq!(ScanCursor::decode(u64::MAX, 65_536).map(|cursor| cursor.partition), Ok(65_535));
        assert!(ScanCursor::decode(u64::MAX, 8).is_err());
    }
}
