//! Batching over RF-RPC: many small requests per message, and the automatic batch size.
//!
//! # Rules (the paper's section 4, with its names)
//! A [`Batcher`] buffers entries and sends them as one request message (one call) when
//! - the batch holds `size` entries (N; fixed, or chosen by the controller), or
//! - the next entry would push the packed entries past `bytes_max` (L, default 2048), or
//! - the oldest buffered entry is older than `timeout` (T) when the next entry arrives or
//!   when the caller asks (`flush_if_due`), or
//! - the caller flushes.
//!
//! An entry above `alone_above_bytes` is never batched: the buffered batch goes first, then the
//! entry alone. Replies come back in order, one per entry, each with its latency (enqueue to
//! reply).
//!
//! # Automatic batch size
//! With [`AutoBatchConfig`], every entry's latency is counted against `latency_limit`
//! (l_limit). After each window of `window_samples` latencies, with k the fraction above the
//! limit: k > `tolerance` (alpha) shrinks the batch size by one, k < alpha / 10 grows it by one
//! (up to `size_max`), else it stays. The size travels in each request's aux field, and every
//! choice is kept in [`BatchStats::size_trace`] so that results show it.

use super::endpoint::{RpcClient, RpcStats};
use super::message::EntryList;
use super::RpcError;
use crate::fabric::OneSided;
use crate::limits::{
    RPC_AUTO_BATCH_WINDOW_SAMPLES, RPC_BATCH_ALONE_ABOVE_BYTES_DEFAULT, RPC_BATCH_BYTES_DEFAULT, RPC_BATCH_ENTRIES_MAX,
    RPC_BATCH_TIMEOUT_US_DEFAULT,
};
use crate::rpc::message::ENTRY_PREFIX_BYTES;
use crate::words::Words;
use std::time::{Duration, Instant};

/// The automatic batch-size controller's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoBatchConfig {
    /// l_limit: the latency most entries should stay under.
    pub latency_limit: Duration,
    /// alpha: the fraction of entries allowed above the limit (the paper uses 0.05).
    pub tolerance: f64,
    /// Latencies per decision.
    pub window_samples: usize,
    /// Largest size the controller picks.
    pub size_max: usize,
}

impl AutoBatchConfig {
    /// A controller for `latency_limit` with the paper's alpha (5 %) and default window.
    pub fn new(latency_limit: Duration) -> Self {
        Self {
            latency_limit,
            tolerance: 0.05,
            window_samples: RPC_AUTO_BATCH_WINDOW_SAMPLES,
            size_max: RPC_BATCH_ENTRIES_MAX,
        }
    }
}

/// The automatic batch-size controller on its own: fed one latency per entry, it moves the
/// batch size by one after each window (see the module docs). [`Batcher`] uses it, and so does
/// any client that batches by itself (the rampkv RF-RPC transport).
#[derive(Clone, Debug)]
pub struct SizeController {
    config: AutoBatchConfig,
    size: usize,
    window_count: usize,
    window_over: usize,
}

impl SizeController {
    /// A controller starting at `initial` (clamped to `1..=size_max`).
    pub fn new(config: AutoBatchConfig, initial: usize) -> Self {
        let size = initial.clamp(1, config.size_max.clamp(1, RPC_BATCH_ENTRIES_MAX));
        Self { config, size, window_count: 0, window_over: 0 }
    }

    /// The batch size now in force.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Counts one entry's latency; returns the new size when this closed a window.
    pub fn record(&mut self, latency: Duration) -> Option<usize> {
        self.window_count += 1;
        self.window_over += usize::from(latency > self.config.latency_limit);
        if self.window_count < self.config.window_samples.max(1) {
            return None;
        }
        let over_fraction = self.window_over as f64 / self.window_count as f64;
        let size_max = self.config.size_max.clamp(1, RPC_BATCH_ENTRIES_MAX);
        if over_fraction > self.config.tolerance {
            self.size = self.size.saturating_sub(1).max(1);
        } else if over_fraction < self.config.tolerance / 10.0 {
            self.size = (self.size + 1).min(size_max);
        }
        debug_assert!((1..=size_max).contains(&self.size), "the size stays in 1..=size_max");
        self.window_count = 0;
        self.window_over = 0;
        Some(self.size)
    }
}

/// Batching settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchConfig {
    /// L: most packed entry bytes per batch.
    pub bytes_max: usize,
    /// Entries above this are sent alone.
    pub alone_above_bytes: usize,
    /// T: buffered entries older than this are sent.
    pub timeout: Duration,
    /// N: entries per batch (the controller's starting point when `auto` is set).
    pub size: usize,
    /// The automatic controller, if any.
    pub auto: Option<AutoBatchConfig>,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            bytes_max: RPC_BATCH_BYTES_DEFAULT,
            alone_above_bytes: RPC_BATCH_ALONE_ABOVE_BYTES_DEFAULT,
            timeout: Duration::from_micros(RPC_BATCH_TIMEOUT_US_DEFAULT),
            size: 16,
            auto: None,
        }
    }
}

/// Why a batch was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushReason {
    /// It reached the batch size.
    Size,
    /// The next entry would have exceeded the byte limit.
    Bytes,
    /// Its oldest entry passed the timeout.
    Timeout,
    /// A large entry, sent alone.
    Alone,
    /// The caller flushed.
    Explicit,
}

impl FlushReason {
    fn index(self) -> usize {
        self as usize
    }
}

/// What a batcher did, over its life.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batches sent.
    pub batches: u64,
    /// Entries sent.
    pub entries: u64,
    /// Batches per reason, indexed by `FlushReason as usize` (Size, Bytes, Timeout, Alone,
    /// Explicit).
    pub by_reason: [u64; 5],
    /// `size_histogram[n]`: batches sent with n entries.
    pub size_histogram: Vec<u64>,
    /// Every size the controller chose, in order (the initial size first).
    pub size_trace: Vec<u16>,
}

impl BatchStats {
    /// Batches sent for `reason`.
    pub fn count(&self, reason: FlushReason) -> u64 {
        self.by_reason[reason.index()]
    }
    /// Mean entries per batch.
    pub fn mean_entries(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.entries as f64 / self.batches as f64
        }
    }
}

/// One reply handed to the batcher's caller.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'a> {
    /// The tag `enqueue` returned for the entry.
    pub tag: u64,
    /// The reply entry.
    pub reply: &'a [u8],
    /// From enqueue to reply.
    pub latency: Duration,
    /// Entries in the batch it travelled in.
    pub batch_entries: usize,
    /// Why that batch was sent.
    pub reason: FlushReason,
}

/// Buffers requests into batches over one [`RpcClient`].
pub struct Batcher<F: OneSided, L> {
    client: RpcClient<F, L>,
    config: BatchConfig,
    pending: EntryList,
    pending_since: Vec<Instant>,
    pending_tags: Vec<u64>,
    alone: EntryList,
    size: usize,
    controller: Option<SizeController>,
    next_tag: u64,
    stats: BatchStats,
}

impl<F, L> Batcher<F, L>
where
    F: OneSided + Clone,
    F::RemoteRegion: Clone,
    L: Words + Clone,
{
    /// A batcher over `client`.
    ///
    /// # Errors
    /// `InvalidLayout` if the limits contradict each other or the request ring.
    pub fn new(client: RpcClient<F, L>, config: BatchConfig) -> Result<Self, RpcError> {
        let invalid = |reason| Err(RpcError::InvalidLayout { reason });
        if config.bytes_max > client.request_entries_bytes_max() {
            return invalid("batch byte limit above what one request message carries");
        }
        if config.alone_above_bytes + ENTRY_PREFIX_BYTES > config.bytes_max {
            return invalid("an entry below the alone limit must fit in a batch");
        }
        let size_max = config.auto.map_or(RPC_BATCH_ENTRIES_MAX, |auto| auto.size_max.min(RPC_BATCH_ENTRIES_MAX));
        if !(1..=size_max).contains(&config.size) {
            return invalid("batch size outside 1..=size_max");
        }
        if config.auto.is_some_and(|auto| auto.window_samples == 0 || !(0.0..1.0).contains(&auto.tolerance)) {
            return invalid("auto batch window must be positive and tolerance in [0, 1)");
        }
        let stats = BatchStats {
            size_histogram: vec![0; RPC_BATCH_ENTRIES_MAX + 1],
            size_trace: vec![config.size as u16],
            ..BatchStats::default()
        };
        Ok(Self {
            client,
            config,
            pending: EntryList::new(),
            pending_since: Vec::with_capacity(RPC_BATCH_ENTRIES_MAX),
            pending_tags: Vec::with_capacity(RPC_BATCH_ENTRIES_MAX),
            alone: EntryList::new(),
            size: config.size,
            controller: config.auto.map(|auto| SizeController::new(auto, config.size)),
            next_tag: 0,
            stats,
        })
    }

    /// The batch size now in force.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Entries buffered, not yet sent.
    pub fn buffered(&self) -> usize {
        self.pending.len()
    }

    /// Batching counters.
    pub fn stats(&self) -> &BatchStats {
        &self.stats
    }

    /// The underlying client's counters.
    pub fn rpc_stats(&self) -> RpcStats {
        self.client.stats()
    }

    /// Buffers `entry`, sending batches as the rules say; replies of every batch sent go to
    /// `on_reply`. Returns the entry's tag (its enqueue number).
    ///
    /// # Errors
    /// `TooLarge` for an entry no request carries; any error of the call.
    pub fn enqueue(&mut self, entry: &[u8], on_reply: &mut impl FnMut(Completion<'_>)) -> Result<u64, RpcError> {
        let entry_max = self.client.request_entries_bytes_max() - ENTRY_PREFIX_BYTES;
        if entry.len() > entry_max {
            return Err(RpcError::TooLarge { bytes: entry.len(), bytes_max: entry_max });
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        let now = Instant::now();
        if entry.len() > self.config.alone_above_bytes {
            self.flush_pending(FlushReason::Alone, on_reply)?;
            self.alone.clear();
            self.alone.push(entry);
            self.send_alone(tag, now, on_reply)?;
            return Ok(tag);
        }
        if self.pending_since.first().is_some_and(|&first| now.duration_since(first) >= self.config.timeout) {
            self.flush_pending(FlushReason::Timeout, on_reply)?;
        }
        if self.pending.packed().len() + ENTRY_PREFIX_BYTES + entry.len() > self.config.bytes_max {
            self.flush_pending(FlushReason::Bytes, on_reply)?;
        }
        self.pending.push(entry);
        self.pending_since.push(now);
        self.pending_tags.push(tag);
        if self.pending.len() >= self.size {
            self.flush_pending(FlushReason::Size, on_reply)?;
        }
        Ok(tag)
    }

    /// Sends the buffered entries if the oldest is past the timeout. Returns whether it sent.
    ///
    /// # Errors
    /// Any error of the call.
    pub fn flush_if_due(&mut self, on_reply: &mut impl FnMut(Completion<'_>)) -> Result<bool, RpcError> {
        match self.pending_since.first() {
            Some(first) if first.elapsed() >= self.config.timeout => {
                self.flush_pending(FlushReason::Timeout, on_reply)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Sends whatever is buffered.
    ///
    /// # Errors
    /// Any error of the call.
    pub fn flush(&mut self, on_reply: &mut impl FnMut(Completion<'_>)) -> Result<(), RpcError> {
        self.flush_pending(FlushReason::Explicit, on_reply)
    }

    fn flush_pending(
        &mut self,
        reason: FlushReason,
        on_reply: &mut impl FnMut(Completion<'_>),
    ) -> Result<(), RpcError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let reply = self.client.call(&self.pending, self.size as u16)?;
        let done = Instant::now();
        let batch_entries = self.pending.len();
        let mut latencies = [Duration::ZERO; RPC_BATCH_ENTRIES_MAX];
        for (index, entry) in reply.entries.iter().enumerate() {
            let latency = done.duration_since(self.pending_since[index]);
            latencies[index] = latency;
            on_reply(Completion { tag: self.pending_tags[index], reply: entry, latency, batch_entries, reason });
        }
        self.pending.clear();
        self.pending_since.clear();
        self.pending_tags.clear();
        self.record_batch(reason, &latencies[..batch_entries]);
        Ok(())
    }

    fn send_alone(
        &mut self,
        tag: u64,
        since: Instant,
        on_reply: &mut impl FnMut(Completion<'_>),
    ) -> Result<(), RpcError> {
        let reply = self.client.call(&self.alone, self.size as u16)?;
        let latency = since.elapsed();
        for entry in reply.entries.iter() {
            on_reply(Completion { tag, reply: entry, latency, batch_entries: 1, reason: FlushReason::Alone });
        }
        self.record_batch(FlushReason::Alone, &[latency]);
        Ok(())
    }

    fn record_batch(&mut self, reason: FlushReason, latencies: &[Duration]) {
        self.stats.batches += 1;
        self.stats.entries += latencies.len() as u64;
        self.stats.by_reason[reason.index()] += 1;
        self.stats.size_histogram[latencies.len()] += 1;
        let Some(controller) = self.controller.as_mut() else {
            return;
        };
        for &latency in latencies {
            if let Some(size) = controller.record(latency) {
                self.size = size;
                self.stats.size_trace.push(size as u16);
            }
        }
    }
}
