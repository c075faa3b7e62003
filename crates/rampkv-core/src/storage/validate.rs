//! What a PREPARE (or PUT) must be before it changes anything.
//!
//! # Contract
//! A write is refused, with [`InvalidPrepare`] naming the rule, before any version is stored:
//! timestamp 0 is the initial value's; 1 to `TXN_KEYS_MAX` writes; a RAMP-Fast write set of at
//! most `TXN_KEYS_MAX` keys that names every written key; keys and values within
//! `KEY_BYTES_MAX` and `VALUE_BYTES_MAX`; no expiry marked reclaimed (only the sweep marks
//! one). The store's other invariants rest on these bounds.

use super::{InvalidPrepare, StoreError, StoreWrite, StoredMetadata};
use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::types::{Timestamp, TIMESTAMP_INITIAL};

pub(super) fn validate_prepare(
    ts: Timestamp,
    metadata: &StoredMetadata,
    writes: &[StoreWrite],
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
        if writes.iter().any(|write| !write_set.contains(&write.key)) {
            return invalid(InvalidPrepare::KeyNotInWriteSet);
        }
    }
    if let Some(write) = writes.iter().find(|write| write.expiry.is_reclaimed()) {
        return invalid(InvalidPrepare::ReclaimedExpiry { word: write.expiry.to_word() });
    }
    match writes.iter().find(|write| write.key.len() > KEY_BYTES_MAX || write.value.len() > VALUE_BYTES_MAX) {
        Some(write) => invalid(InvalidPrepare::TooLarge { key_bytes: write.key.len(), value_bytes: write.value.len() }),
        None => Ok(()),
    }
}
