//! The one-sided replication medium (FaRM's way): the backup registers a *log region* for a
//! primary's stream, a message ring in its own memory (`rampkv_fabric::ring`, the ring the
//! write-poll medium is built on), and the primary appends the replication stream into it with
//! one-sided writes. The backup's stream thread polls the ring and applies the records off the
//! primary's critical path; the TCP connection of the replication port stays open as the
//! control path (hello, the backup's acknowledgements of what it applied, the end of a peer).
//! The backup looks at its ring every `REPLICATION_APPLY_POLL_US` and applies everything that
//! landed meanwhile; it never sleeps on the region's doorbell, so the primary's write rings
//! nothing (no system call, no wake-up on its path) and the backup neither spins nor wakes once
//! per write: what a record costs the backup's CPU is its apply, in batches (FaRM's backups
//! likewise process their logs lazily). A record is held once it landed, so the poll interval
//! adds to the apply lag, never to a write's latency.
//!
//! # Layout (little-endian words)
//! ```text
//! log region, the backup's:  +0 doorbell (bell, sleepers)   +16 close word   +24..64 reserved
//!                            +64 ring (REPLICATION_LOG_RING_BYTES)
//! the primary's region:      +0 doorbell (bell, sleepers)   +16 credit word  +24..64 reserved
//! ```
//! The ring's messages are slices of the same byte stream a TCP link carries (records with
//! their CRC and epoch, markers, snapshot chunks), at most `REPLICATION_LOG_MESSAGE_BYTES_MAX`
//! each: a record may span two messages, the backup reads them as a stream.
//!
//! # When a backup *holds* a record
//! Once the one-sided store of the message that ends it has completed into the backup's log
//! region, the region was still open and the backup's process still there: the primary stores
//! the message (its trailer last, release), runs a sequentially consistent fence and loads the
//! close word (zero: open), then asks the backup's connection whether it ended (the write's
//! completion status, [`LogSender::check_open`]).
//! A backup closes its region (takes the copy over in a failover, refuses the stream, or its
//! stream ends) by storing the close word, a sequentially consistent fence, and then reading
//! what is complete in the ring (and applying it when it takes the copy over). The two fences
//! make it impossible that the primary misses the close *and* the backup misses the message:
//! every record counted held is in the ring when the backup drains it, and a record landing
//! after the close is not counted (the link fails). RDMA would give the same with the backup
//! revoking the primary's access to the region (the write's completion then carries an error).
//!
//! # Crashes (what the emulation means)
//! - The primary's process dies: what it wrote stays in the backup's memory; the backup applies
//!   every complete message before it treats the stream as ended (the TCP control connection's
//!   end), so every record held is in the copy a failover takes over.
//! - The backup's process dies: its copy and the unapplied part of its ring are gone (the
//!   region's file may outlive it; nothing reads it again: a restarted backup catches up from a
//!   snapshot). The kernel ends its connection as it dies, so a write completing after that is
//!   not held; one that completed just before counted as held, as a FaRM write that completed
//!   into a NIC whose machine then failed: the write is then on the primary alone, one failure
//!   of its replica set, which rejoin repairs (f failures at a time are promised, not more).
//! - The host dies: every process with it (all servers here share one host: not survived).

use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use rampkv_core::limits::{REPLICATION_LOG_MESSAGE_BYTES_MAX, REPLICATION_LOG_RING_BYTES};
use rampkv_fabric::{
    Fabric, FabricError, FenceOrdering, LoadOrdering, OneSided, RegionDescriptor, RingAddresses, RingError, RingLayout,
    RingReceiver, RingSender, SendError, ShmFabric, ShmLocalRegion, ShmRemoteRegion, StoreOrdering, Words,
};
use rustix::event::{PollFd, PollFlags, Timespec};
use serde::{Deserialize, Serialize};

use crate::message::fabric::{read_json_line, write_json_line, Endpoint, FabricHandle, ServedRegion};

/// Bytes before the ring in a log region, and the whole of a primary's region.
const HEADER_BYTES: usize = 64;
const DOORBELL_OFFSET_BYTES: usize = 0;
/// In the log region: non-zero once the backup closed it.
const CLOSE_OFFSET_BYTES: usize = 16;
/// In the primary's region: the ring's credit word.
const CREDIT_OFFSET_BYTES: usize = 16;

/// Why a log region could not be set up or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("the log region handshake: {0}")]
    Handshake(std::io::Error),
    /// The peer named one of this process's served regions as its own.
    #[error("the peer named a region of this process's servers ({name}) as its own")]
    OwnRegion { name: String },
    /// The backup closed its log region: it took the copy over, refused the stream, or ended it.
    #[error("the backup closed its log region (it took the copy over, or refused or ended the stream)")]
    Closed,
    /// The write's completion reports the backup gone (its connection ended: the process died
    /// or closed it).
    #[error("the backup's connection ended: a write into its log region is not held")]
    PeerGone,
    #[error("asking the backup's connection whether it ended: {0}")]
    Poll(std::io::Error),
}

/// The one JSON line either side sends on the control connection: its region.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionLine {
    region: RegionDescriptor,
}

fn addresses() -> RingAddresses {
    RingAddresses {
        ring: RingLayout {
            offset_bytes: HEADER_BYTES as u64,
            ring_bytes: REPLICATION_LOG_RING_BYTES as u64,
            body_bytes_max: REPLICATION_LOG_MESSAGE_BYTES_MAX as u64,
        },
        receiver_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES as u64,
        credit_offset_bytes: CREDIT_OFFSET_BYTES as u64,
        sender_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES as u64,
    }
}

/// Maps the region a peer named, unless it is one of this process's served regions.
fn map_peer(fabric: &ShmFabric, control: &mut TcpStream) -> Result<ShmRemoteRegion, LogError> {
    let line: RegionLine = read_json_line(control).map_err(LogError::Handshake)?;
    if ServedRegion::is_served(&line.region) {
        return Err(LogError::OwnRegion { name: line.region.name });
    }
    Ok(fabric.map(&line.region)?)
}

/// The primary's end: writes the stream into the backup's log region.
pub(super) struct LogSender {
    fabric: ShmFabric,
    sender: RingSender<ShmFabric, Arc<ShmLocalRegion>>,
    local: Arc<ShmLocalRegion>,
    log: ShmRemoteRegion,
    /// The replication port's connection (a clone), whose end is the backup's.
    control: TcpStream,
    /// Keeps the primary's region registered.
    _endpoint: Endpoint<ShmFabric>,
}

impl LogSender {
    /// The primary's side of the handshake on `control` (after the backup accepted a hello
    /// asking for a log region): sends its region, maps the backup's log region.
    pub(super) fn connect(control: &mut TcpStream) -> Result<LogSender, LogError> {
        let fabric = <ShmFabric as FabricHandle>::open()?;
        let endpoint = Endpoint::register(fabric, "replication-primary", HEADER_BYTES)?;
        write_json_line(control, &RegionLine { region: endpoint.descriptor.clone() }).map_err(LogError::Handshake)?;
        let log = map_peer(&fabric, control)?;
        let local = Arc::clone(&endpoint.region);
        let sender = RingSender::new(fabric, log.clone(), Arc::clone(&local), addresses())?;
        let control = control.try_clone().map_err(LogError::Handshake)?;
        Ok(LogSender { fabric, sender, local, log, control, _endpoint: endpoint })
    }

    /// Writes one message of at most `REPLICATION_LOG_MESSAGE_BYTES_MAX` from the front of
    /// `bytes` if the ring has room for it now, waiting for room until `deadline` (None: not at
    /// all). Returns the bytes written (0: no room).
    pub(super) fn write_message(&mut self, bytes: &[u8], deadline: Option<Instant>) -> Result<usize, LogError> {
        if bytes.is_empty() {
            return Ok(0);
        }
        let message = &bytes[..bytes.len().min(self.sender.body_bytes_max())];
        let sent = match deadline {
            None => self.sender.try_send(message),
            Some(deadline) => self.sender.send(message, deadline.saturating_duration_since(Instant::now())),
        };
        match sent {
            Ok(()) => Ok(message.len()),
            Err(SendError::NoCredit | SendError::Timeout) => Ok(0),
            Err(error) => Err(error.into()),
        }
    }

    /// Writes `bytes[*written..]` while the ring has room (waiting for room until `deadline`),
    /// advancing `written`. Returns whether all of `bytes` is written and held (module docs):
    /// false when the ring stayed full.
    pub(super) fn append(
        &mut self,
        bytes: &[u8],
        written: &mut usize,
        deadline: Option<Instant>,
    ) -> Result<bool, LogError> {
        while *written < bytes.len() {
            let taken = self.write_message(&bytes[*written..], deadline)?;
            if taken == 0 {
                return Ok(false);
            }
            *written += taken;
        }
        self.check_open()?;
        Ok(true)
    }

    /// The completion of what was written so far: whether the backup's region was still open
    /// after it landed, and its process still there. RDMA reports both in the write's
    /// completion (a revoked region, or a reliable connection to a dead peer, completes in
    /// error); here the close word is loaded after a fence (module docs), and the backup's
    /// connection is asked whether it ended (one `poll` for POLLRDHUP, which the kernel raises
    /// as soon as a process dies, even with acknowledgements still unread).
    pub(super) fn check_open(&self) -> Result<(), LogError> {
        self.local.fence(FenceOrdering::SeqCst);
        if self.fabric.read_word(&self.log, CLOSE_OFFSET_BYTES, LoadOrdering::Acquire)? != 0 {
            return Err(LogError::Closed);
        }
        let mut connection = [PollFd::new(&self.control, PollFlags::RDHUP)];
        let ready = rustix::event::poll(&mut connection, Some(&Timespec { tv_sec: 0, tv_nsec: 0 }));
        let ended = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR;
        match ready {
            Ok(_) if connection[0].revents().intersects(ended) => Err(LogError::PeerGone),
            Ok(_) => Ok(()),
            Err(error) => Err(LogError::Poll(error.into())),
        }
    }
}

/// The backup's end: polls the log region and hands out the stream's bytes.
pub(super) struct LogReceiver {
    receiver: RingReceiver<ShmFabric, Arc<ShmLocalRegion>>,
    local: Arc<ShmLocalRegion>,
    /// The rest of a message the reader did not take yet.
    leftover: Vec<u8>,
    leftover_start: usize,
    closed: bool,
    /// Keeps the log region registered.
    _endpoint: Endpoint<ShmFabric>,
}

impl LogReceiver {
    /// The backup's side of the handshake on `control`: maps the primary's region, registers a
    /// log region (its ring zeroed before the primary learns where it is), sends it.
    pub(super) fn accept(control: &mut TcpStream) -> Result<LogReceiver, LogError> {
        let fabric = <ShmFabric as FabricHandle>::open()?;
        let primary = map_peer(&fabric, control)?;
        let endpoint = Endpoint::register(fabric, "replication-log", HEADER_BYTES + REPLICATION_LOG_RING_BYTES)?;
        let local = Arc::clone(&endpoint.region);
        let receiver = RingReceiver::new(fabric, Arc::clone(&local), primary, addresses())?;
        write_json_line(control, &RegionLine { region: endpoint.descriptor.clone() }).map_err(LogError::Handshake)?;
        Ok(LogReceiver { receiver, local, leftover: Vec::new(), leftover_start: 0, closed: false, _endpoint: endpoint })
    }

    /// Copies the next bytes of the stream into `out`, as many as it takes of what landed (all
    /// of a burst at once: the backup applies it and acknowledges it once), without waiting.
    /// Returns 0 when nothing complete arrived (the caller polls again later: module docs).
    pub(super) fn read(&mut self, out: &mut [u8]) -> Result<usize, LogError> {
        let mut count = 0;
        while count < out.len() {
            let room = out.len() - count;
            if self.leftover_start < self.leftover.len() {
                let taken = room.min(self.leftover.len() - self.leftover_start);
                out[count..count + taken]
                    .copy_from_slice(&self.leftover[self.leftover_start..self.leftover_start + taken]);
                self.leftover_start += taken;
                count += taken;
                continue;
            }
            let Some(message) = self.receiver.poll()? else { break };
            // Straight from the ring into `out`; only what does not fit is kept for the next read.
            let body = message.body();
            let taken = room.min(body.len());
            out[count..count + taken].copy_from_slice(&body[..taken]);
            count += taken;
            self.leftover.clear();
            self.leftover.extend_from_slice(&body[taken..]);
            self.leftover_start = 0;
        }
        Ok(count)
    }

    /// Closes the region: a message landing from now on is not held (module docs). What is in
    /// the ring already can still be read.
    pub(super) fn close(&mut self) {
        if !self.closed {
            self.local.store(CLOSE_OFFSET_BYTES / 8, 1, StoreOrdering::Release);
            self.local.fence(FenceOrdering::SeqCst);
            self.closed = true;
        }
    }

    /// Whether [`LogReceiver::close`] ran.
    pub(super) fn is_closed(&self) -> bool {
        self.closed
    }
}

impl Drop for LogReceiver {
    /// A stream that ends for any reason (refused, fenced, stopped) closes its region first, so
    /// the primary never counts a record the backup will not apply as held.
    fn drop(&mut self) {
        self.close();
    }
}
