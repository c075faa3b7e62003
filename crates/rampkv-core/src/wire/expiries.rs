//! The expiries section: when each written or returned version expires, after the message's
//! other fields, only when one of them does.
//!
//! # Format
//! ```text
//! expiries := u32 count, u64 expiry * count     (count = the writes or entries before it)
//! expiry   := bits 0..63 the deadline, ms since the Unix epoch (0: never, 1: deleted);
//!             bit 63 reclaimed (replies only: the server dropped the value; types::Expiry)
//! ```
//! Appended to PREPARE, PREPARE_COMMIT, PUT and LOCK_WRITE after their writes, and to VERSIONS,
//! VERSIONS_LOCATED and VERSIONS_LOCKED after everything else, when at least one expiry is not
//! 0; absent otherwise, so a message about versions that never expire is byte for byte what it
//! was before expiry existed, and costs nothing more. A decoder refuses a count that differs
//! from the writes' or entries', a section whose expiries are all 0 (it would have been left
//! out: one encoding per message), and in a request an expiry with the reclaimed bit (only a
//! server sets it). A peer that predates the section refuses a message that carries one
//! (trailing bytes): an old server never stores a version without its deadline, an old client
//! never shows a version its expiry would hide.

use super::{Decoder, Encoder, WireError};
use crate::limits::TXN_KEYS_MAX;
use crate::types::Expiry;

/// Appends the section for `expiries` (as many as the message's writes or entries), if one of
/// them is not 0.
pub fn encode_expiries(encoder: &mut Encoder<'_>, expiries: impl ExactSizeIterator<Item = u64> + Clone) {
    if expiries.clone().all(|word| word == 0) {
        return;
    }
    encoder.count(expiries.len());
    for word in expiries {
        encoder.u64(word);
    }
}

/// Decodes the section at the end of a message of `count` writes or entries: `None` when no
/// byte is left (nothing expires). `reclaimed_allowed`: a reply's (a request's may not mark a
/// version reclaimed).
pub fn decode_expiries(
    decoder: &mut Decoder<'_>,
    count: usize,
    reclaimed_allowed: bool,
) -> Result<Option<Vec<u64>>, WireError> {
    if decoder.remaining().is_empty() {
        return Ok(None);
    }
    let listed = decoder.count("expiries", TXN_KEYS_MAX, 8)?;
    if listed != count {
        return Err(WireError::Invalid("expiry count differs from the write or entry count"));
    }
    let words = (0..listed).map(|_| decoder.u64()).collect::<Result<Vec<u64>, WireError>>()?;
    if words.iter().all(|&word| word == 0) {
        return Err(WireError::Invalid("an expiries section in which nothing expires"));
    }
    if !reclaimed_allowed && words.iter().any(|&word| Expiry::from_word(word).is_reclaimed()) {
        return Err(WireError::Invalid("a written expiry is marked reclaimed, which only a server sets"));
    }
    Ok(Some(words))
}
