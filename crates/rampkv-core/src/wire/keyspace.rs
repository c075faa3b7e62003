//! The key space messages: listing a partition's live keys page by page, and counting them.
//!
//! # Format (frame bodies, all integers little-endian; `key` as in request.rs)
//! ```text
//! 0x10 LIST_KEYS   u32 partitions, u32 partition, u8 from, u64 after, u32 keys_max
//!                  the live keys of `partition` (of `partitions`) in the order of their
//!                  64-bit key hash, from the start (from = 0, `after` ignored and 0) or after
//!                  hash `after` (from = 1); at most `keys_max` (1..=LIST_PAGE_KEYS_MAX) keys
//! 0x11 COUNT_KEYS  u32 partitions, u32 count, u32 partition * count
//!                  how many live keys these partitions hold (count 1..=COUNT_PARTITIONS_PER_REQUEST_MAX)
//! 0x89 KEYS        u8 more, u64 resume, u32 count, key * count
//!                  a page; more = 0: the partition is done (`resume` 0), more = 1: ask again
//!                  after hash `resume` (the page may be empty then)
//! 0x8A KEY_COUNT   u64 count
//! ```
//! `partitions` is the sender's partition count (1..=CLUSTER_PARTITIONS_MAX) and every partition
//! is below it: a server with a cluster file refuses a count that differs from its own, one
//! without filters its store by `key_hash % partitions`.

use super::{Decoder, Encoder, WireError};
use crate::limits::{
    CLUSTER_PARTITIONS_MAX, COUNT_PARTITIONS_PER_REQUEST_MAX, KEY_BYTES_MAX, LIST_PAGE_KEYS_MAX, LIST_REPLY_KEYS_MAX,
};

pub const KIND_LIST_KEYS: u8 = 0x10;
pub const KIND_COUNT_KEYS: u8 = 0x11;
pub const KIND_KEYS: u8 = 0x89;
pub const KIND_KEY_COUNT: u8 = 0x8A;

/// LIST_KEYS: one page of a partition's live keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListKeys {
    /// The sender's partition count.
    pub partitions: u32,
    pub partition: u32,
    /// `None`: from the first key; `Some(h)`: the keys whose hash is above `h`.
    pub after: Option<u64>,
    /// Most keys wanted (1..=`LIST_PAGE_KEYS_MAX`).
    pub keys_max: u32,
}

/// COUNT_KEYS: how many live keys some partitions hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountKeys {
    pub partitions: u32,
    /// The partitions counted (each below `partitions`, 1..=`COUNT_PARTITIONS_PER_REQUEST_MAX`).
    pub of: Vec<u32>,
}

/// KEYS: a page of keys and where the next one starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPage {
    pub keys: Vec<Vec<u8>>,
    /// `None`: the partition is done; `Some(h)`: ask again after hash `h`.
    pub resume: Option<u64>,
}

fn check_partitions(partitions: u32) -> Result<(), WireError> {
    if partitions == 0 || partitions > CLUSTER_PARTITIONS_MAX {
        return Err(WireError::Invalid("partition count out of 1..=CLUSTER_PARTITIONS_MAX"));
    }
    Ok(())
}

fn check_partition(partition: u32, partitions: u32) -> Result<(), WireError> {
    if partition >= partitions {
        return Err(WireError::Invalid("partition beyond the partition count"));
    }
    Ok(())
}

fn encode_position(encoder: &mut Encoder<'_>, position: Option<u64>) {
    encoder.u8(u8::from(position.is_some()));
    encoder.u64(position.unwrap_or(0));
}

fn decode_position(decoder: &mut Decoder<'_>) -> Result<Option<u64>, WireError> {
    let flag = decoder.u8()?;
    let hash = decoder.u64()?;
    match (flag, hash) {
        (0, 0) => Ok(None),
        (1, hash) => Ok(Some(hash)),
        (0, _) => Err(WireError::Invalid("a hash position without its flag")),
        _ => Err(WireError::Invalid("a hash position flag other than 0 or 1")),
    }
}

impl ListKeys {
    pub fn encode(&self, encoder: &mut Encoder<'_>) {
        debug_assert!(self.partition < self.partitions);
        debug_assert!((1..=LIST_PAGE_KEYS_MAX as u32).contains(&self.keys_max));
        encoder.u32(self.partitions);
        encoder.u32(self.partition);
        encode_position(encoder, self.after);
        encoder.u32(self.keys_max);
    }

    pub fn decode(decoder: &mut Decoder<'_>) -> Result<ListKeys, WireError> {
        let partitions = decoder.u32()?;
        check_partitions(partitions)?;
        let partition = decoder.u32()?;
        check_partition(partition, partitions)?;
        let after = decode_position(decoder)?;
        let keys_max = decoder.u32()?;
        if keys_max == 0 || keys_max as usize > LIST_PAGE_KEYS_MAX {
            return Err(WireError::Invalid("keys_max out of 1..=LIST_PAGE_KEYS_MAX"));
        }
        Ok(ListKeys { partitions, partition, after, keys_max })
    }
}

impl CountKeys {
    pub fn encode(&self, encoder: &mut Encoder<'_>) {
        debug_assert!(!self.of.is_empty() && self.of.len() <= COUNT_PARTITIONS_PER_REQUEST_MAX);
        encoder.u32(self.partitions);
        encoder.count(self.of.len());
        for partition in &self.of {
            encoder.u32(*partition);
        }
    }

    pub fn decode(decoder: &mut Decoder<'_>) -> Result<CountKeys, WireError> {
        let partitions = decoder.u32()?;
        check_partitions(partitions)?;
        let count = decoder.count("counted partitions", COUNT_PARTITIONS_PER_REQUEST_MAX, 4)?;
        if count == 0 {
            return Err(WireError::Invalid("a count of no partition"));
        }
        let of = (0..count)
            .map(|_| decoder.u32().and_then(|partition| check_partition(partition, partitions).map(|()| partition)))
            .collect::<Result<_, _>>()?;
        Ok(CountKeys { partitions, of })
    }
}

impl KeyPage {
    pub fn encode(&self, encoder: &mut Encoder<'_>) {
        encode_keys_page(encoder, self.resume, self.keys.iter().map(Vec::as_slice));
    }

    pub fn decode(decoder: &mut Decoder<'_>) -> Result<KeyPage, WireError> {
        let resume = decode_position(decoder)?;
        let count = decoder.count("listed keys", LIST_REPLY_KEYS_MAX, 2)?;
        let keys = (0..count).map(|_| decoder.key()).collect::<Result<_, _>>()?;
        Ok(KeyPage { keys, resume })
    }
}

/// Encodes a KEYS body from borrowed keys (the server encodes straight from its store's).
pub fn encode_keys_page<'k>(
    encoder: &mut Encoder<'_>,
    resume: Option<u64>,
    keys: impl ExactSizeIterator<Item = &'k [u8]>,
) {
    encode_position(encoder, resume);
    encoder.count(keys.len());
    for key in keys {
        debug_assert!(key.len() <= KEY_BYTES_MAX);
        encoder.key(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_list(bytes: &[u8]) -> Result<ListKeys, WireError> {
        let mut decoder = Decoder::new(bytes);
        let list = ListKeys::decode(&mut decoder)?;
        decoder.finish()?;
        Ok(list)
    }

    fn encoded_list(list: &ListKeys) -> Vec<u8> {
        let mut bytes = Vec::new();
        list.encode(&mut Encoder::new(&mut bytes));
        bytes
    }

    #[test]
    fn list_keys_round_trips_and_its_byte_layout_is_as_documented() {
        let list = ListKeys { partitions: 8, partition: 3, after: Some(0x0102_0304_0506_0708), keys_max: 10 };
        let bytes = encoded_list(&list);
        assert_eq!(bytes, [8, 0, 0, 0, 3, 0, 0, 0, 1, 8, 7, 6, 5, 4, 3, 2, 1, 10, 0, 0, 0]);
        assert_eq!(decode_list(&bytes), Ok(list));
        let from_start = ListKeys { partitions: 1, partition: 0, after: None, keys_max: 1 };
        assert_eq!(decode_list(&encoded_list(&from_start)), Ok(from_start));
    }

    #[test]
    fn list_keys_out_of_bounds_is_an_error_not_a_panic() {
        let valid = encoded_list(&ListKeys { partitions: 8, partition: 3, after: Some(5), keys_max: 10 });
        let with = |at: usize, bytes: &[u8]| {
            let mut changed = valid.clone();
            changed[at..at + bytes.len()].copy_from_slice(bytes);
            decode_list(&changed)
        };
        assert!(with(0, &[0, 0, 0, 0]).is_err(), "no partitions");
        assert!(with(0, &[0xFF, 0xFF, 0xFF, 0xFF]).is_err(), "too many partitions");
        assert!(with(4, &[8, 0, 0, 0]).is_err(), "partition beyond the count");
        assert!(with(8, &[2]).is_err(), "a flag of 2");
        assert!(with(8, &[0]).is_err(), "a position without its flag");
        assert!(with(17, &[0, 0, 0, 0]).is_err(), "keys_max 0");
        assert!(with(17, &[0x01, 0x04, 0, 0]).is_err(), "keys_max past LIST_PAGE_KEYS_MAX");
        for length in 0..valid.len() {
            assert!(decode_list(&valid[..length]).is_err(), "truncated to {length}");
        }
    }

    #[test]
    fn count_keys_and_key_pages_round_trip_and_refuse_garbage() {
        let count = CountKeys { partitions: 4, of: vec![0, 3] };
        let mut bytes = Vec::new();
        count.encode(&mut Encoder::new(&mut bytes));
        assert_eq!(CountKeys::decode(&mut Decoder::new(&bytes)), Ok(count));
        bytes[8] = 4; // partition 4 of 4
        assert!(CountKeys::decode(&mut Decoder::new(&bytes)).is_err());
        let empty = [4, 0, 0, 0, 0, 0, 0, 0];
        assert!(CountKeys::decode(&mut Decoder::new(&empty)).is_err(), "no partition");
        let huge = [4, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0x7F];
        assert!(CountKeys::decode(&mut Decoder::new(&huge)).is_err(), "a count past the bound");

        for page in [
            KeyPage { keys: vec![b"a".to_vec(), Vec::new(), vec![7; 256]], resume: Some(u64::MAX) },
            KeyPage { keys: Vec::new(), resume: None },
        ] {
            let mut bytes = Vec::new();
            page.encode(&mut Encoder::new(&mut bytes));
            let mut decoder = Decoder::new(&bytes);
            assert_eq!(KeyPage::decode(&mut decoder), Ok(page));
            assert!(decoder.finish().is_ok());
        }
        let lying = [1, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0];
        assert!(KeyPage::decode(&mut Decoder::new(&lying)).is_err(), "a count the bytes cannot hold");
    }
}
