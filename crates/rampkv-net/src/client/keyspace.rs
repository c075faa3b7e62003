//! The blocking client's key space: an iterator over every live key of the cluster, partition
//! by partition and page by page ([`Client::keys`]), one page ([`Client::list_page`]) and the
//! count of live keys ([`Client::count_keys`]).
//!
//! # Contract
//! The iterator keeps Redis's SCAN guarantee over the whole cluster: every key live from the
//! moment the iteration starts to the moment it ends is returned at least once (exactly once
//! unless a failover moves a partition while it is listed: a page asked again of the new
//! primary may return keys again), whatever is written or deleted meanwhile; a key written or
//! deleted during the iteration may or may not be returned. The order is by partition, then by
//! key hash: no order a caller should rely on. With replication, a page that fails because a
//! server failed is asked again of the new primary, as a transaction is tried again. The first
//! error ends the iteration.

use std::collections::VecDeque;

use super::{Client, ClientError, TxnResult};
use crate::transport::ClientTransport;
use rampkv_core::limits::LIST_PAGE_KEYS_MAX;
use rampkv_core::pattern::Pattern;
use rampkv_core::wire::KeyPage;

/// What [`Client::keys`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOptions {
    /// Only keys matching this Redis glob pattern (`*`, `?`, `[abc]`, `[^a]`, `[a-z]`, `\x`);
    /// `None`: every key. Filtered on the client, as Redis filters after it scanned: a page
    /// may then bring no key at all.
    pub pattern: Option<Vec<u8>>,
    /// How many keys to ask each server for at a time (a hint, as SCAN's COUNT; clamped to
    /// 1..=`LIST_PAGE_KEYS_MAX`).
    pub count: usize,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions { pattern: None, count: 256 }
    }
}

impl<T: ClientTransport> Client<T> {
    /// Every live key of the cluster (module contract), as the iteration goes.
    pub fn keys(&mut self, options: ScanOptions) -> Keys<'_, T> {
        let pattern = options.pattern.as_deref().map(Pattern::new).filter(|pattern| !pattern.matches_everything());
        let count = options.count.clamp(1, LIST_PAGE_KEYS_MAX);
        Keys { client: self, pattern, count, partition: 0, after: None, buffered: VecDeque::new(), done: false }
    }

    /// One page of the live keys of `partition` after hash `after` (`None`: from its start):
    /// at most `keys_max` keys (clamped to `LIST_PAGE_KEYS_MAX`, but for keys of one hash,
    /// which come together), in key-hash order, and the hash to resume after (`None`: the
    /// partition is done).
    pub fn list_page(&mut self, partition: u32, after: Option<u64>, keys_max: usize) -> Result<KeyPage, ClientError> {
        self.with_failover(|client| {
            client.driver.begin_list(0, partition, after, keys_max)?;
            match client.wait()? {
                TxnResult::Keys(page) => Ok(page),
                other => unreachable!("a listing finished as {other:?}"),
            }
        })
    }

    /// How many live keys the cluster holds: exact when no write runs meanwhile (DBSIZE).
    pub fn count_keys(&mut self) -> Result<u64, ClientError> {
        self.with_failover(|client| {
            client.driver.begin_count(0)?;
            match client.wait()? {
                TxnResult::KeyCount(count) => Ok(count),
                other => unreachable!("a count finished as {other:?}"),
            }
        })
    }
}

/// The iterator [`Client::keys`] returns: each item a live key, or the error that ended it.
#[derive(Debug)]
pub struct Keys<'c, T: ClientTransport> {
    client: &'c mut Client<T>,
    pattern: Option<Pattern>,
    count: usize,
    /// The partition being listed, and the hash its next page starts after.
    partition: u32,
    after: Option<u64>,
    buffered: VecDeque<Vec<u8>>,
    done: bool,
}

impl<T: ClientTransport> Iterator for Keys<'_, T> {
    type Item = Result<Vec<u8>, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(key) = self.buffered.pop_front() {
                return Some(Ok(key));
            }
            if self.done {
                return None;
            }
            // Pages until one brings a key (a page may be empty: a sparse partition, a pattern).
            let page = match self.client.list_page(self.partition, self.after, self.count) {
                Ok(page) => page,
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            };
            let pattern = self.pattern.as_ref();
            self.buffered
                .extend(page.keys.into_iter().filter(|key| pattern.is_none_or(|pattern| pattern.matches(key))));
            match page.resume {
                Some(resume) => self.after = Some(resume),
                None => {
                    self.after = None;
                    self.partition += 1;
                    self.done = self.partition >= self.client.cluster.partition_count();
                }
            }
        }
    }
}
