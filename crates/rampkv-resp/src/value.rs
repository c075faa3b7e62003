//! How the gateway stores a Redis value in rampkv.
//!
//! DEL and expiry are rampkv's own now (issue 31): DEL writes a deletion (a version that has
//! already expired, `Write::delete`) and SET EX & co. a version with a deadline; a read reports
//! such a key absent ([`rampkv_core::protocol::ReadItem::exists`]), and the servers reclaim it.
//! Before that, RAMP versions had no tombstone, so a deleted key was stored as the single byte
//! `0x00`, and a value that could be mistaken for it, or for the escape itself, after a `0x01`
//! byte. The gateway still writes that escape and still reads those tombstones, so data files
//! written before read as they did, and a value the gateway writes never reads as one:
//!
//! | stored bytes | meaning for GET, MGET, EXISTS, TTL |
//! |---|---|
//! | none, version timestamp 0 | never written: absent |
//! | a deletion, or an expired version | deleted or expired: absent |
//! | `0x00` | deleted by a gateway that predates deletions (a tombstone): absent |
//! | `0x01` + value | present with `value` (the gateway writes an empty value, or one whose first byte is `0x00` or `0x01`, so) |
//! | anything else | present, all bytes (the gateway writes every other value as it is) |
//!
//! Most values are stored as they are: no copy with a byte in front, and a value whose size is
//! a size class of the allocator (1,024 bytes, say) stays in it rather than taking the next
//! one (1,280 bytes with mimalloc) for the sake of one byte; the stores keep every version
//! for the garbage-collection grace period, so that is a fifth of their memory for such values.
//! Values written by other rampkv clients are shown as they are, unless their first byte
//! happens to be `0x00` or `0x01` (then they read as deleted, or lose that byte).

use rampkv_core::limits::VALUE_BYTES_MAX;
use rampkv_core::protocol::ReadItem;
use rampkv_core::spare;
use rampkv_core::types::{Timestamp, TIMESTAMP_INITIAL};

/// First byte of a present value stored escaped (empty, or starting with `0x00` or `0x01`).
pub const PRESENT: u8 = 0x01;
/// The whole stored value of a deleted key.
pub const TOMBSTONE: u8 = 0x00;

/// Largest value SET and MSET accept: one byte of the stored value may be the escape.
pub const STORED_VALUE_BYTES_MAX: usize = VALUE_BYTES_MAX - 1;

/// The stored form of `value`. The caller checks `value.len() <= STORED_VALUE_BYTES_MAX`.
pub fn encode(value: &[u8]) -> Vec<u8> {
    debug_assert!(value.len() <= STORED_VALUE_BYTES_MAX);
    // In a spare buffer of its length when the thread keeps them (the gateway's does).
    match value.first() {
        Some(&first) if first != TOMBSTONE && first != PRESENT => spare::copy(value),
        _ => spare::copy_with_prefix(Some(PRESENT), value),
    }
}

/// The stored form of a key deleted by a gateway that predates deletions (tests of reading
/// old data: DEL writes a deletion now).
pub fn tombstone() -> Vec<u8> {
    vec![TOMBSTONE]
}

/// The value a read returned for its key, `None` if the key is absent at the read: never
/// written, deleted, expired (judged by the read), or an old tombstone.
pub fn of_item(item: &ReadItem) -> Option<&[u8]> {
    if !item.exists {
        return None;
    }
    decode(item.ts, &item.value)
}

/// The value a read returned, `None` if the key is absent (never written or deleted).
pub fn decode(ts: Timestamp, stored: &[u8]) -> Option<&[u8]> {
    if ts == TIMESTAMP_INITIAL {
        debug_assert!(stored.is_empty(), "the initial version is empty");
        return None;
    }
    match stored.split_first() {
        Some((&TOMBSTONE, [])) => None,
        Some((&PRESENT, value)) => Some(value),
        _ => Some(stored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_tombstones_and_unwritten_keys_are_absent() {
        for value in [&b""[..], b"v", &[0u8; 3], &[1u8], &[0u8], &[1, 0], &[2, 0], &[0xff; 1024]] {
            assert_eq!(decode(7, &encode(value)), Some(value), "{value:?}");
        }
        assert_eq!(encode(b"value"), b"value", "stored as it is");
        assert_eq!(encode(&[0xff; 1024]).len(), 1024, "no byte added");
        assert_eq!(encode(b""), [PRESENT], "escaped: empty");
        assert_eq!(encode(&[TOMBSTONE]), [PRESENT, TOMBSTONE], "escaped: never a tombstone");
        assert_eq!(encode(&[PRESENT, 7]), [PRESENT, PRESENT, 7], "escaped: the escape itself");
        let bytes = [0u8, 1, 2, 0xff];
        for len in 0..=3 {
            for index in 0..bytes.len().pow(len) {
                let value: Vec<u8> = (0..len).map(|at| bytes[index / bytes.len().pow(at) % bytes.len()]).collect();
                assert_eq!(decode(9, &encode(&value)), Some(&value[..]), "{value:?}");
            }
        }
        // What the earlier format stored (a 0x01 before every value) reads the same.
        assert_eq!(decode(7, b"\x01value"), Some(&b"value"[..]));
        assert_eq!(decode(7, &tombstone()), None);
        assert_eq!(decode(TIMESTAMP_INITIAL, b""), None);
    }

    #[test]
    fn values_written_without_the_gateway_show_as_they_are() {
        assert_eq!(decode(7, b"raw"), Some(&b"raw"[..]));
        assert_eq!(decode(7, b""), Some(&b""[..]), "an empty raw value is present");
        assert_eq!(decode(7, &[0, 5]), Some(&[0u8, 5][..]), "only a lone 0x00 is a tombstone");
    }
}
