//! How the gateway stores a Redis value in rampkv.
//!
//! RAMP versions have no tombstone: a key once written always has a newest version. So that
//! DEL can remove keys (atomically, in one `put_all`), every value the gateway writes carries a
//! one-byte prefix:
//!
//! | stored bytes | meaning for GET, MGET, EXISTS |
//! |---|---|
//! | none, version timestamp 0 | never written: absent |
//! | `0x00` | deleted (a tombstone written by DEL): absent |
//! | `0x01` + value | present with `value` |
//! | anything else | written without the gateway (e.g. `rampkv put`): present, all bytes |
//!
//! The gateway owns its key space's encoding: values written by other rampkv clients are shown
//! as they are, unless their first byte happens to be `0x00` or `0x01` (then they read as
//! deleted, or lose that byte). A value read through `rampkv get` shows the prefix byte.

use crate::limits::VALUE_BYTES_MAX;
use crate::types::{Timestamp, TIMESTAMP_INITIAL};

/// First byte of a present value.
pub const PRESENT: u8 = 0x01;
/// The whole stored value of a deleted key.
pub const TOMBSTONE: u8 = 0x00;

/// Largest value SET and MSET accept: one byte of the stored value is the prefix.
pub const STORED_VALUE_BYTES_MAX: usize = VALUE_BYTES_MAX - 1;

/// The stored form of `value`. The caller checks `value.len() <= STORED_VALUE_BYTES_MAX`.
pub fn encode(value: &[u8]) -> Vec<u8> {
    debug_assert!(value.len() <= STORED_VALUE_BYTES_MAX);
    let mut stored = Vec::with_capacity(value.len() + 1);
    stored.push(PRESENT);
    stored.extend_from_slice(value);
    stored
}

/// The stored form of a deleted key.
pub fn tombstone() -> Vec<u8> {
    vec![TOMBSTONE]
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
        for value in [&b""[..], b"v", &[0u8; 3], &[1u8]] {
            assert_eq!(decode(7, &encode(value)), Some(value));
        }
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
