//! What a PREPARE (or PUT) must be before it changes anything.
//!
//! # Contract
//! A write is refused, with [`InvalidPrepare`] naming the rule, before any version is stored:
//! timestamp 0 is the initial value's; 1 to `TXN_KEYS_MAX` writes; a RAMP-Fast write set of at
//! most `TXN_KEYS_MAX` keys that names every written key; keys and values within
//! `KEY_BYTES_MAX` and `VALUE_BYTES_MAX`. The store's other invariants rest on these bounds.

use super::{InvalidPrepare, Key, StoreError, StoredMetadata};
use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::types::{Timestamp, TIMESTAMP_INITIAL};

pub(super) fn validate_prepare(
    ts: Timestamp,
    metadata: &StoredMetadata,
    writes: &[(Key, Box<[u8]>)],
) -> Result<(), StoreError> {
    let invalid = |why: InvalidPrepare| Err(StoreError::InvalidPrepare(why));
    if ts == TIMESTAMP_INITIAL {
        return invalid(InvalidPrepare::ReservedTimestamp);
    }
    if writes.is_empty() || writes.len() > TXN_KEYS_MAX {
        return invalid(InvalidPrepare::WriteCount { count: writes.len() });
    }
    if let StoredMetadata::WriteSet(write_set) = metadata {
        if write_set.len() > TXN_KEYS_MAX {
            return invalid(InvalidPrepare::WriteSetTooLarge { count: write_set.len() });
        }
        if writes.iter().any(|(key, _)| !write_set.contains(key)) {
            return invalid(InvalidPrepare::KeyNotInWriteSet);
        }
    }
    match writes.iter().find(|(key, value)| key.len() > KEY_BYTES_MAX || value.len() > VALUE_BYTES_MAX) {
        Some((key, value)) => invalid(InvalidPrepare::TooLarge { key_bytes: key.len(), value_bytes: value.len() }),
        None => Ok(()),
    }
}
