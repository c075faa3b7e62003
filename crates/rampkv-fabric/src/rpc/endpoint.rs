//! The two ends of an RF-RPC connection: [`RpcClient`] and [`RpcServerEndpoint`].
//!
//! One call is outstanding per connection at a time (a call may carry a batch of up to
//! `RPC_BATCH_ENTRIES_MAX` entries). Neither end allocates per call: buffers are sized at
//! construction.

use super::message::{decode_request, encode_request, Entries, EntryList, RequestMessage};
use super::reply::{
    decode_reply_header, decode_time, encode_reply, encode_time, encode_unsolicited, fetch_reply, reply_slot_bytes,
    Fetched, ReplyHeader, ReplySlotWriter, REPLY_HEADER_BYTES, REPLY_TRAILER_BYTES,
};
pub use super::ReplyMode;
use super::{RpcConfig, RpcError, RpcLayout};
use crate::fabric::OneSided;
use crate::limits::{RPC_BATCH_ENTRIES_MAX, RPC_REPLY_SLOT_BYTES_MAX, RPC_SLOW_FETCH_SPINS, WORD_BYTES};
use crate::ring::{Doorbell, Doorbells, RingReceiver, RingSender, SendError, WaitError};
use crate::words::Words;
use std::time::{Duration, Instant};

/// Counters of a client, over its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcStats {
    /// Calls completed.
    pub calls: u64,
    /// Calls whose reply was pushed.
    pub pushed_calls: u64,
    /// One-sided reads of the reply slot.
    pub slot_reads: u64,
    /// Fetches that found no reply for the call yet.
    pub failed_fetches: u64,
    /// Fetches that found a torn image (retried).
    pub torn_fetches: u64,
    /// Completed fetches that needed a second read (reply longer than F).
    pub second_reads: u64,
    /// Switches from fetch to push mode.
    pub switches_to_push: u64,
    /// Switches from push back to fetch mode.
    pub switches_to_fetch: u64,
}

/// A reply; borrows the client until dropped.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    /// The reply entries, one per request entry, in order.
    pub entries: Entries<'a>,
    /// The server's processing time (lower bound of the compact field).
    pub server_time: Duration,
    /// How it came back.
    pub mode: ReplyMode,
    /// Fetches that failed before it was complete (fetch mode).
    pub failed_fetches: u32,
}

struct Outstanding {
    generation: u32,
    entries: usize,
    mode: ReplyMode,
    started: Instant,
    failed_fetches: u32,
}

fn check_slot(offset_bytes: u64, slot_bytes: u64, region_bytes: usize) -> Result<(usize, usize), RpcError> {
    let invalid = |reason| Err(RpcError::InvalidLayout { reason });
    let (Ok(offset), Ok(slot)) = (usize::try_from(offset_bytes), usize::try_from(slot_bytes)) else {
        return invalid("reply slot field does not fit in usize");
    };
    if offset % WORD_BYTES != 0 || slot % WORD_BYTES != 0 {
        return invalid("reply slot offset and length must be multiples of 8");
    }
    if !(reply_slot_bytes(0)..=RPC_REPLY_SLOT_BYTES_MAX).contains(&slot) {
        return invalid("reply slot length outside its bounds");
    }
    match offset.checked_add(slot) {
        Some(end) if end <= region_bytes => Ok((offset, slot)),
        _ => invalid("reply slot does not fit in the server's region"),
    }
}

/// The client end: sends requests into the server's ring, fetches replies from the server's
/// slot or receives them pushed into its own ring.
pub struct RpcClient<F: OneSided, L> {
    fabric: F,
    server: F::RemoteRegion,
    requests: RingSender<F, L>,
    pushes: RingReceiver<F, L>,
    doorbell: Doorbell<L>,
    config: RpcConfig,
    slot_offset_bytes: usize,
    image: Vec<u8>,
    pushed: Vec<u8>,
    message: Vec<u8>,
    generation: u32,
    outstanding: Option<Outstanding>,
    mode: ReplyMode,
    slow_streak: u32,
    stats: RpcStats,
}

impl<F, L> RpcClient<F, L>
where
    F: OneSided + Clone,
    F::RemoteRegion: Clone,
    L: Words + Clone,
{
    /// The client of a connection: `server` is the server's mapped region, `local` the client's
    /// own. Build it before the server endpoint sends anything (it zeroes the push ring).
    ///
    /// # Errors
    /// `InvalidLayout` or `Ring` if an address breaks a rule or leaves its region.
    pub fn new(
        fabric: F,
        server: F::RemoteRegion,
        local: L,
        layout: RpcLayout,
        config: RpcConfig,
    ) -> Result<Self, RpcError> {
        Self::with_server_doorbell(fabric, server, None, local, layout, config)
    }

    /// [`RpcClient::new`] with the server's doorbell in `server_doorbell` (None: in `server`);
    /// the server doorbell offsets of `layout` then refer to that region.
    ///
    /// # Errors
    /// As [`RpcClient::new`].
    pub fn with_server_doorbell(
        fabric: F,
        server: F::RemoteRegion,
        server_doorbell: Option<F::RemoteRegion>,
        local: L,
        layout: RpcLayout,
        config: RpcConfig,
    ) -> Result<Self, RpcError> {
        let (slot_offset_bytes, slot_bytes) =
            check_slot(layout.reply_slot_offset_bytes, layout.reply_slot_bytes, fabric.remote_len_bytes(&server))?;
        let doorbells = Doorbells { remote: server_doorbell, local: None };
        let requests = RingSender::with_doorbells(
            fabric.clone(),
            server.clone(),
            local.clone(),
            layout.request,
            doorbells.clone(),
        )?;
        let pushes =
            RingReceiver::with_doorbells(fabric.clone(), local.clone(), server.clone(), layout.push, doorbells)?;
        let doorbell = Doorbell::new(local, layout.push.receiver_doorbell_offset_bytes as usize)?;
        Ok(Self {
            fabric,
            server,
            requests,
            pushes,
            doorbell,
            config,
            slot_offset_bytes,
            image: vec![0; slot_bytes],
            pushed: Vec::with_capacity(layout.push.ring.body_bytes_max as usize),
            message: Vec::with_capacity(layout.request.ring.body_bytes_max as usize),
            generation: 0,
            outstanding: None,
            mode: config.initial_mode,
            slow_streak: 0,
            stats: RpcStats::default(),
        })
    }

    /// The mode the next call will use.
    pub fn mode(&self) -> ReplyMode {
        self.mode
    }

    /// Counters so far.
    pub fn stats(&self) -> RpcStats {
        self.stats
    }

    /// Largest packed entry list one request carries.
    pub fn request_entries_bytes_max(&self) -> usize {
        // Entries are padded to words inside the message: round down so the padded length fits.
        let room = self.requests.body_bytes_max().saturating_sub(super::message::request_message_bytes(0));
        room - room % WORD_BYTES
    }

    /// Sends one request message carrying `entries` (1..=`RPC_BATCH_ENTRIES_MAX` of them);
    /// `aux` is the batch size the client currently aims for (0 if it does not batch).
    ///
    /// # Errors
    /// `Protocol` if a call is outstanding or the list is empty or too long, `TooLarge` if the
    /// message exceeds the ring, `Send` if the ring refuses.
    pub fn client_send(&mut self, entries: &EntryList, aux: u16) -> Result<(), RpcError> {
        if self.outstanding.is_some() {
            return Err(RpcError::Protocol { reason: "a call is already outstanding" });
        }
        if !(1..=RPC_BATCH_ENTRIES_MAX).contains(&entries.len()) {
            return Err(RpcError::Protocol { reason: "a request carries 1..=RPC_BATCH_ENTRIES_MAX entries" });
        }
        if entries.packed().len() > self.request_entries_bytes_max() {
            return Err(RpcError::TooLarge {
                bytes: entries.packed().len(),
                bytes_max: self.request_entries_bytes_max(),
            });
        }
        let generation = self.generation.wrapping_add(1);
        let mode = self.mode;
        let (push, stream) = (mode == ReplyMode::Push, self.config.stream_replies);
        encode_request(&mut self.message, generation, push, stream, aux, entries);
        self.requests.send(&self.message, self.config.call_timeout)?;
        self.generation = generation;
        self.outstanding =
            Some(Outstanding { generation, entries: entries.len(), mode, started: Instant::now(), failed_fetches: 0 });
        Ok(())
    }

    /// Waits for the reply of the outstanding call (fetching or receiving it, per the call's
    /// mode) and applies the hybrid rule.
    ///
    /// # Errors
    /// `Protocol` if no call is outstanding, `Timeout`, `Corrupt`, `Ring`. After any error but
    /// `Protocol` the connection is broken (a late reply to the abandoned call would be taken
    /// for the next one's and refused as `Corrupt`): close it, as after a transport error.
    pub fn client_recv(&mut self) -> Result<Reply<'_>, RpcError> {
        let Some(mut call) = self.outstanding.take() else {
            return Err(RpcError::Protocol { reason: "no call outstanding" });
        };
        let deadline = call.started + self.config.call_timeout;
        let header = match call.mode {
            ReplyMode::Fetch => loop {
                if let Some(header) = self.fetch_once(call.generation)? {
                    break header;
                }
                call.failed_fetches = call.failed_fetches.saturating_add(1);
                self.pace(call.failed_fetches, deadline)?;
            },
            ReplyMode::Push => loop {
                if let Some(header) = self.push_once(call.generation)? {
                    break header;
                }
                let remaining = deadline.saturating_duration_since(Instant::now());
                let pushes = &self.pushes;
                self.doorbell
                    .wait_until(|| pushes.has_pending(), remaining)
                    .map_err(|WaitError::Timeout| RpcError::Timeout)?;
            },
        };
        self.finish(call, header)
    }

    /// One attempt at the outstanding call's reply, without waiting: one fetch of the slot
    /// (fetch mode) or one poll of the push ring (push mode). `None`: not there yet; the call
    /// stays outstanding. For a thread that serves several connections; pace the attempts (and
    /// in push mode wait on the doorbell, see [`RpcClient::push_pending`]) between calls.
    ///
    /// # Errors
    /// As `client_recv` (`Timeout` once the call is older than `call_timeout`).
    pub fn try_client_recv(&mut self) -> Result<Option<Reply<'_>>, RpcError> {
        let Some(mut call) = self.outstanding.take() else {
            return Err(RpcError::Protocol { reason: "no call outstanding" });
        };
        let attempt = match call.mode {
            ReplyMode::Fetch => self.fetch_once(call.generation)?,
            ReplyMode::Push => self.push_once(call.generation)?,
        };
        let Some(header) = attempt else {
            if call.mode == ReplyMode::Fetch {
                call.failed_fetches = call.failed_fetches.saturating_add(1);
            }
            if call.started.elapsed() >= self.config.call_timeout {
                return Err(RpcError::Timeout);
            }
            self.outstanding = Some(call);
            return Ok(None);
        };
        self.finish(call, header).map(Some)
    }

    /// Whether the outstanding call's reply may be there: in fetch mode one 8-byte read of the
    /// slot's status word (READY with the call's generation), in push mode one local load.
    /// Cheap and read-only, for a doorbell condition; `try_client_recv` then fetches and checks
    /// the whole reply.
    pub fn reply_may_be_ready(&self) -> bool {
        match &self.outstanding {
            None => false,
            Some(call) if call.mode == ReplyMode::Push => self.pushes.has_pending(),
            Some(call) => self
                .fabric
                .read_word(&self.server, self.slot_offset_bytes, crate::words::LoadOrdering::Relaxed)
                .is_ok_and(|status| status & super::reply::REPLY_READY_BIT != 0 && status as u32 == call.generation),
        }
    }

    /// Whether a call is outstanding.
    pub fn has_outstanding(&self) -> bool {
        self.outstanding.is_some()
    }

    /// Whether something waits in the push ring (one local load): a doorbell condition for a
    /// client waiting in push mode.
    pub fn push_pending(&self) -> bool {
        self.pushes.has_pending()
    }

    /// Checks a complete reply against its call, applies the hybrid rule and returns it.
    fn finish(&mut self, call: Outstanding, header: ReplyHeader) -> Result<Reply<'_>, RpcError> {
        if !self.config.stream_replies && usize::from(header.entry_count) != call.entries {
            return Err(RpcError::Corrupt { reason: "reply entry count differs from the request's" });
        }
        self.stats.calls += 1;
        let server_time = Duration::from_nanos(decode_time(header.time_field));
        self.apply_hybrid_rule(call.mode, call.failed_fetches, server_time);
        let area = &self.image[REPLY_HEADER_BYTES..REPLY_HEADER_BYTES + header.body_bytes];
        let entries = Entries::parse(area, usize::from(header.entry_count))?;
        if entries.bytes_len() != area.len() {
            return Err(RpcError::Corrupt { reason: "reply body longer than its entries" });
        }
        Ok(Reply { entries, server_time, mode: call.mode, failed_fetches: call.failed_fetches })
    }

    /// The next unsolicited pushed message (entries the server sent outside any call), if one
    /// is complete. Only on fetch-only connections (`hybrid` off, `initial_mode` Fetch): there
    /// the push ring carries nothing else.
    ///
    /// # Errors
    /// `Protocol` on a connection that may push replies; `Corrupt` for a pushed message that is
    /// not a well-formed unsolicited one; `Ring`.
    pub fn try_recv_unsolicited(&mut self) -> Result<Option<Entries<'_>>, RpcError> {
        if self.config.hybrid || self.config.initial_mode != ReplyMode::Fetch {
            return Err(RpcError::Protocol { reason: "unsolicited pushes need a fetch-only connection" });
        }
        let Some(view) = self.pushes.poll()? else {
            return Ok(None);
        };
        let body = view.body();
        let header = decode_reply_header(body, body.len().saturating_sub(REPLY_HEADER_BYTES))?;
        if !header.unsolicited || header.generation != 0 || body.len() != REPLY_HEADER_BYTES + header.body_bytes {
            return Err(RpcError::Corrupt { reason: "pushed message is not a well-formed unsolicited one" });
        }
        self.pushed.clear();
        self.pushed.extend_from_slice(&body[REPLY_HEADER_BYTES..]);
        let entries = Entries::parse(&self.pushed, usize::from(header.entry_count))?;
        if entries.bytes_len() != self.pushed.len() {
            return Err(RpcError::Corrupt { reason: "unsolicited body longer than its entries" });
        }
        Ok(Some(entries))
    }

    /// `client_send` then `client_recv`.
    ///
    /// # Errors
    /// As those two.
    pub fn call(&mut self, entries: &EntryList, aux: u16) -> Result<Reply<'_>, RpcError> {
        self.client_send(entries, aux)?;
        self.client_recv()
    }

    /// One fetch of the reply slot; `Some` if the reply for `generation` is complete.
    fn fetch_once(&mut self, generation: u32) -> Result<Option<ReplyHeader>, RpcError> {
        let fetched = fetch_reply(
            &self.fabric,
            &self.server,
            self.slot_offset_bytes,
            self.config.fetch_bytes,
            generation,
            &mut self.image,
        )?;
        match fetched {
            Fetched::Complete { header, reads } => {
                self.stats.slot_reads += u64::from(reads);
                self.stats.second_reads += u64::from(reads - 1);
                Ok(Some(header))
            }
            Fetched::NotReady => {
                self.stats.slot_reads += 1;
                self.stats.failed_fetches += 1;
                Ok(None)
            }
            Fetched::Torn { reads } => {
                self.stats.slot_reads += u64::from(reads);
                self.stats.torn_fetches += 1;
                Ok(None)
            }
        }
    }

    /// Waits before the next fetch: `fetch_interval` busy while at most R fetches failed, then
    /// a short spin and a yield of the CPU (the call is slow). Bounded by the call's deadline.
    fn pace(&self, failed_fetches: u32, deadline: Instant) -> Result<(), RpcError> {
        let fetched_at = Instant::now();
        if fetched_at >= deadline {
            return Err(RpcError::Timeout);
        }
        if failed_fetches <= self.config.fetch_retries {
            while fetched_at.elapsed() < self.config.fetch_interval {
                std::hint::spin_loop();
            }
        } else {
            for _ in 0..RPC_SLOW_FETCH_SPINS {
                std::hint::spin_loop();
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// One poll of the push ring; `Some` if the pushed reply for `generation` is complete.
    fn push_once(&mut self, generation: u32) -> Result<Option<ReplyHeader>, RpcError> {
        let capacity = self.image.len() - REPLY_HEADER_BYTES - REPLY_TRAILER_BYTES;
        let Some(view) = self.pushes.poll()? else {
            return Ok(None); // nothing yet, or still in transfer
        };
        let body = view.body();
        let header = decode_reply_header(body, capacity)?;
        if body.len() != REPLY_HEADER_BYTES + header.body_bytes {
            return Err(RpcError::Corrupt { reason: "pushed reply length differs from its header" });
        }
        if header.unsolicited || header.generation != generation {
            return Err(RpcError::Corrupt { reason: "pushed reply for another call" });
        }
        self.image[..body.len()].copy_from_slice(body);
        self.stats.pushed_calls += 1;
        Ok(Some(header))
    }

    fn apply_hybrid_rule(&mut self, mode: ReplyMode, failed_fetches: u32, server_time: Duration) {
        if !self.config.hybrid {
            return;
        }
        match mode {
            ReplyMode::Fetch if failed_fetches >= self.config.fetch_retries => {
                self.slow_streak += 1;
                if self.slow_streak >= self.config.slow_calls_to_push {
                    self.mode = ReplyMode::Push;
                    self.slow_streak = 0;
                    self.stats.switches_to_push += 1;
                }
            }
            ReplyMode::Fetch => self.slow_streak = 0,
            ReplyMode::Push if server_time <= self.config.push_back_below => {
                self.mode = ReplyMode::Fetch;
                self.stats.switches_to_fetch += 1;
            }
            ReplyMode::Push => {}
        }
    }
}

struct Pending {
    generation: u32,
    entries: usize,
    push: bool,
    stream: bool,
    received: Instant,
}

/// The server end of one connection: receives requests from its own ring, publishes replies
/// in its own slot or pushes them into the client's ring.
pub struct RpcServerEndpoint<F: OneSided, L> {
    local: L,
    requests: RingReceiver<F, L>,
    pushes: RingSender<F, L>,
    slot: ReplySlotWriter,
    request: Vec<u8>,
    message: Vec<u8>,
    pending: Option<Pending>,
    last_generation: u32,
    push_timeout: Duration,
    notify_fetchers: bool,
}

impl<F, L> RpcServerEndpoint<F, L>
where
    F: OneSided + Clone,
    F::RemoteRegion: Clone,
    L: Words + Clone,
{
    /// The server end: `local` is the server's region, `client` the client's mapped region.
    /// Build it before the client sends (it zeroes the request ring). `push_timeout` bounds a
    /// push that waits for ring credit.
    ///
    /// # Errors
    /// `InvalidLayout`, `Ring` or `Fabric` if an address breaks a rule or leaves its region.
    pub fn new(
        fabric: F,
        local: L,
        client: F::RemoteRegion,
        layout: RpcLayout,
        push_timeout: Duration,
    ) -> Result<Self, RpcError> {
        Self::with_local_doorbell(fabric, local, None, client, layout, push_timeout)
    }

    /// [`RpcServerEndpoint::new`] with the server's own doorbell in `local_doorbell` (None: in
    /// `local`); the server doorbell offsets of `layout` then refer to that region.
    ///
    /// # Errors
    /// As [`RpcServerEndpoint::new`].
    pub fn with_local_doorbell(
        fabric: F,
        local: L,
        local_doorbell: Option<L>,
        client: F::RemoteRegion,
        layout: RpcLayout,
        push_timeout: Duration,
    ) -> Result<Self, RpcError> {
        let (slot_offset, slot_bytes) =
            check_slot(layout.reply_slot_offset_bytes, layout.reply_slot_bytes, local.len_words() * WORD_BYTES)?;
        let doorbells = Doorbells { remote: None, local: local_doorbell };
        let requests = RingReceiver::with_doorbells(
            fabric.clone(),
            local.clone(),
            client.clone(),
            layout.request,
            doorbells.clone(),
        )?;
        let pushes = RingSender::with_doorbells(fabric, client, local.clone(), layout.push, doorbells)?;
        let slot = ReplySlotWriter::new(&local, slot_offset, slot_bytes)?;
        for index in slot_offset / WORD_BYTES..(slot_offset + slot_bytes) / WORD_BYTES {
            local.store(index, 0, crate::words::StoreOrdering::Relaxed);
        }
        Ok(Self {
            local,
            requests,
            pushes,
            slot,
            request: Vec::with_capacity(layout.request.ring.body_bytes_max as usize),
            message: Vec::with_capacity(layout.push.ring.body_bytes_max as usize),
            pending: None,
            last_generation: 0,
            push_timeout,
            notify_fetchers: false,
        })
    }

    /// Whether `server_send` also rings the client's doorbell (if the client sleeps on it) after
    /// publishing a reply in the slot. Off by default: RF-RPC's point is that the server does
    /// no out-bound operation per reply. The rampkv transport turns it on, so that a client with
    /// a call outstanding can sleep instead of fetching forever; it costs one read of the
    /// client's sleeper count per reply (and a wake only when the client sleeps).
    pub fn set_notify_fetchers(&mut self, notify: bool) {
        self.notify_fetchers = notify;
    }

    /// Whether a request (possibly still in transfer) waits: one load, for a poller's doorbell
    /// condition.
    pub fn has_pending(&self) -> bool {
        self.pending.is_none() && self.requests.has_pending()
    }

    /// Whether a request was received and not answered yet.
    pub fn call_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The push ring's credit word as it is now (one local load): a push that found no room
    /// waits for it to change.
    pub fn push_credit(&self) -> u64 {
        self.pushes.credit_word()
    }

    /// Largest packed reply body this connection carries (slot and push ring alike).
    pub fn reply_entries_bytes_max(&self) -> usize {
        self.slot.body_bytes_max().min(self.pushes.body_bytes_max().saturating_sub(REPLY_HEADER_BYTES))
    }

    /// The next request, if one is complete. Its processing time runs from here to
    /// `server_send`.
    ///
    /// # Errors
    /// `Protocol` if the previous request has no reply yet; `Corrupt` or `Ring` for a request
    /// no correct client writes (close the connection).
    pub fn server_recv(&mut self) -> Result<Option<RequestMessage<'_>>, RpcError> {
        if self.pending.is_some() {
            return Err(RpcError::Protocol { reason: "reply to the pending request first" });
        }
        let Some(view) = self.requests.poll()? else {
            return Ok(None);
        };
        let received = Instant::now();
        self.request.clear();
        self.request.extend_from_slice(view.body());
        let message = decode_request(&self.request)?;
        if message.generation != self.last_generation.wrapping_add(1) {
            return Err(RpcError::Corrupt { reason: "request generation out of sequence" });
        }
        self.last_generation = message.generation;
        self.pending = Some(Pending {
            generation: message.generation,
            entries: message.entries.len(),
            push: message.push,
            stream: message.stream,
            received,
        });
        Ok(Some(message))
    }

    /// Publishes the reply to the pending request: one entry per request entry.
    ///
    /// # Errors
    /// `Protocol` if nothing is pending or the entry count differs, `TooLarge` if the reply
    /// does not fit (the request stays pending), `Send` if the push ring refuses.
    pub fn server_send(&mut self, replies: &EntryList) -> Result<(), RpcError> {
        let Some(pending) = self.pending.as_ref() else {
            return Err(RpcError::Protocol { reason: "no request pending" });
        };
        if pending.stream && replies.len() > RPC_BATCH_ENTRIES_MAX {
            return Err(RpcError::Protocol { reason: "a reply carries at most RPC_BATCH_ENTRIES_MAX entries" });
        }
        if !pending.stream && replies.len() != pending.entries {
            return Err(RpcError::Protocol { reason: "reply entry count differs from the request's" });
        }
        if replies.packed().len() > self.reply_entries_bytes_max() {
            return Err(RpcError::TooLarge {
                bytes: replies.packed().len(),
                bytes_max: self.reply_entries_bytes_max(),
            });
        }
        let time_field = encode_time(u64::try_from(pending.received.elapsed().as_nanos()).unwrap_or(u64::MAX));
        let count = replies.len() as u16;
        if pending.push {
            encode_reply(&mut self.message, pending.generation, count, time_field, replies.packed());
            self.pushes.send(&self.message, self.push_timeout)?;
        } else {
            self.slot.publish(&self.local, pending.generation, count, time_field, replies.packed())?;
            if self.notify_fetchers {
                self.pushes.notify_receiver()?;
            }
        }
        self.pending = None;
        Ok(())
    }

    /// Pushes `entries` into the client's push ring outside any call (for a fetch-only client
    /// that reads them with `try_recv_unsolicited`). Never blocks: `Ok(false)` if the ring has
    /// no room now (retry later; nothing was written).
    ///
    /// # Errors
    /// `Protocol` for an empty or too long list, `TooLarge` if it exceeds a push message,
    /// `Send` if the ring is broken.
    pub fn try_push_unsolicited(&mut self, entries: &EntryList) -> Result<bool, RpcError> {
        if !(1..=RPC_BATCH_ENTRIES_MAX).contains(&entries.len()) {
            return Err(RpcError::Protocol { reason: "an unsolicited push carries 1..=RPC_BATCH_ENTRIES_MAX entries" });
        }
        let bytes_max = self.pushes.body_bytes_max().saturating_sub(REPLY_HEADER_BYTES);
        if entries.packed().len() > bytes_max {
            return Err(RpcError::TooLarge { bytes: entries.packed().len(), bytes_max });
        }
        encode_unsolicited(&mut self.message, entries.len() as u16, entries.packed());
        match self.pushes.try_send(&self.message) {
            Ok(()) => Ok(true),
            Err(SendError::NoCredit) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Largest packed entry list one unsolicited push carries.
    pub fn unsolicited_entries_bytes_max(&self) -> usize {
        self.pushes.body_bytes_max().saturating_sub(REPLY_HEADER_BYTES)
    }
}
