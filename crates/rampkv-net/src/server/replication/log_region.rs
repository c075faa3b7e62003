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
//! # The fabric: the process's, chosen per backup
//! The regions live on this process's fabric ([`LogFabric`]: `rampkv_fabric::AnyFabric`, as
//! `--fabric` chose), so a backup on this host is written through shared memory and one on
//! another host, where both hosts have an active RDMA port, by **RDMA WRITE** into its
//! registered region, its close word read back by **RDMA READ** (`rampkv_fabric::verbs_fabric`;
//! each side maps the other's region, so the backup returns ring credit by RDMA WRITE too).
//! When either side cannot map the other's region (`FabricError::NoMedium`: another host and no
//! RDMA on one side, or a fabric choice that forbids the pair) the two agree on the handshake's
//! last line to carry this stream over the replication port's TCP connection instead, and both
//! say so in a log line ([`Negotiated::Tcp`]): that backup then holds a record once it applied
//! it and acknowledged it, as with `--replication-medium tcp`. Any other failure of the
//! handshake fails the link, as before.
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
//! # Handshake (after the hello's answer; one JSON line each, `docs/wire.md`)
//! ```text
//! primary -> backup   {"region": <the primary's region>}
//! backup  -> primary  {"region": <its log region>}   or   {"no_medium": "<why it cannot map ours>"}
//! primary -> backup   {"medium": "onesided"}         or   {"medium": "tcp", "reason": "<why>"}
//!                     (only after a region)
//! ```
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
//! ## Why it still holds over RDMA (verbs)
//! The argument needs, on the primary's side, "the message is in the backup's memory, then the
//! close word is loaded", ordered as a store, a full fence and a load are. Over verbs:
//! - **Every one-sided operation waits for its completion** (`verbs_fabric::link`: each READ,
//!   WRITE and atomic is posted signalled under the link's lock and waited for with
//!   `wait_send_through`, bounded by `VERBS_OP_TIMEOUT_MS`; a completion in error, a timeout or
//!   the end of the link's control connection fails the link and returns
//!   `FabricError::PeerFailed`, which fails this replication link: that write is not held). On
//!   a reliable connection (RC) a WRITE completes at the requester only once the responder
//!   acknowledged it, i.e. once the backup's NIC accepted the data for placement in the region.
//! - **The message's parts are written in order**: the frame header, the body and the trailer
//!   are three WRITEs, each posted only after the one before completed, so the backup never
//!   sees a trailer (its poll's "complete" test) before the body it closes.
//! - **The close word is read by an RDMA READ posted after the last WRITE completed**, on the
//!   same queue pair. RC executes a queue pair's requests at the responder in order, and the
//!   READ is not even issued before the WRITE's acknowledgement came back, so the READ is
//!   performed after the WRITE's data was placed: a NIC's read of host memory does not pass its
//!   earlier posted writes (PCIe ordering; Soft-RoCE's responder is one kernel thread per queue
//!   pair that copies the WRITE into the region before it sends the acknowledgement, and the
//!   READ's copy happens after that acknowledgement's round trip, with the packet path's locks
//!   between them). The NIC's "place the message, then read the close word" is therefore the
//!   store-fence-load the argument needs; the backup's side (store the close word, fence, read
//!   the ring) is CPU code on its own memory, unchanged. Either the READ returns the close
//!   (the record is not held: the link fails) or the backup's drain finds the message.
//! - **A dead backup**: its process's end closes its replication connection (POLLRDHUP, as on
//!   one host) and its RDMA link's control connection (the link fails); a WRITE to a queue pair
//!   that is gone completes in error (retries exhausted). A write that completed before the
//!   backup died counted as held, as below. The credit word the backup writes into the
//!   primary's region and the primary's local fence are the ring's own business (the fence is
//!   harmless over verbs: every earlier operation has completed).
//!
//! # Crashes (what the emulation means)
//! - The primary's process dies: what it wrote stays in the backup's memory; the backup applies
//!   every complete message before it treats the stream as ended (the TCP control connection's
//!   end), so every record held is in the copy a failover takes over. Over verbs too: the
//!   region is the backup's own memory, which it polls locally.
//! - The backup's process dies: its copy and the unapplied part of its ring are gone (the
//!   region's file may outlive it; nothing reads it again: a restarted backup catches up from a
//!   snapshot). The kernel ends its connection as it dies, so a write completing after that is
//!   not held; one that completed just before counted as held, as a FaRM write that completed
//!   into a NIC whose machine then failed: the write is then on the primary alone, one failure
//!   of its replica set, which rejoin repairs (f failures at a time are promised, not more).
//! - A host dies: every process on it. On one host that is the whole cluster (not survived);
//!   across hosts it is the failure of every server placed there, survived only where no
//!   replica set has two members on that host (the placement's business, not this medium's).
//!   A primary whose backup's host went silent sees its WRITEs fail once the queue pair's
//!   retries run out (or `VERBS_OP_TIMEOUT_MS`), never a write counted held that did not land.

use std::io::Read;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use rampkv_core::limits::{REPLICATION_LOG_MESSAGE_BYTES_MAX, REPLICATION_LOG_RING_BYTES};
use rampkv_fabric::{
    AnyFabric, FabricError, FenceOrdering, LoadOrdering, RegionDescriptor, RingAddresses, RingError, RingLayout,
    RingReceiver, RingSender, SendError, StoreOrdering, Words,
};
use rustix::event::{PollFd, PollFlags, Timespec};
use serde::{Deserialize, Serialize};

use rampkv_core::limits::WRITEPOLL_CONTROL_LINE_BYTES_MAX;

use crate::message::fabric::{write_json_line, Endpoint, FabricHandle, ServedRegion};

/// The fabric the replication of this process writes log regions over (module docs).
pub(super) type LogFabric = AnyFabric;

/// Bytes before the ring in a log region, and the whole of a primary's region.
const HEADER_BYTES: usize = 64;
const DOORBELL_OFFSET_BYTES: usize = 0;
/// In the log region: non-zero once the backup closed it.
const CLOSE_OFFSET_BYTES: usize = 16;
/// In the primary's region: the ring's credit word.
const CREDIT_OFFSET_BYTES: usize = 16;
/// Longest reason for a TCP fallback either side sends (a handshake line stays far below
/// `WRITEPOLL_CONTROL_LINE_BYTES_MAX`).
const REASON_CHARS_MAX: usize = 512;

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
    /// A side cannot map the other's region ([`LogSender::connect`] and
    /// [`LogReceiver::accept`], which take only the one-sided outcome).
    #[error("the stream goes over TCP: {reason}")]
    NoMedium { reason: String },
}

/// How the log region handshake ended: the one-sided end, or the stream goes over the
/// replication port's TCP connection, and why (module docs).
#[derive(Debug)]
pub(super) enum Negotiated<T> {
    OneSided(T),
    Tcp { reason: String },
}

/// A region line: the first line (the primary's region), or the backup's answer (its log
/// region, or why it cannot map the primary's).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionLine {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    region: Option<RegionDescriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    no_medium: Option<String>,
}

/// The primary's last line: what carries the stream.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MediumLine {
    medium: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

const MEDIUM_ONE_SIDED: &str = "onesided";
const MEDIUM_TCP: &str = "tcp";

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

/// Reads one JSON line of at most `WRITEPOLL_CONTROL_LINE_BYTES_MAX` bytes, a byte at a time:
/// after a TCP fallback the stream's bytes follow the line on the same connection, and none
/// may be read ahead (the stream's read timeout bounds each read).
fn read_line<T: for<'de> Deserialize<'de>>(control: &mut TcpStream) -> std::io::Result<T> {
    let mut line = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while line.len() <= WRITEPOLL_CONTROL_LINE_BYTES_MAX {
        match control.read(&mut byte) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) if byte[0] == b'\n' => {
                return serde_json::from_slice(&line)
                    .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error));
            }
            Ok(_) => line.push(byte[0]),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a handshake line too long"))
}

fn malformed(what: &str) -> LogError {
    LogError::Handshake(std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned()))
}

/// A reason from this side, cut to what a line carries.
fn reason_of(error: &FabricError) -> String {
    error.to_string().chars().take(REASON_CHARS_MAX).collect()
}

/// A reason from the peer: input from outside, cut and kept printable.
fn peer_reason(reason: &str) -> String {
    reason.chars().take(REASON_CHARS_MAX).map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// The region a peer named, unless it is one of this process's served regions.
fn peer_region(region: RegionDescriptor) -> Result<RegionDescriptor, LogError> {
    if ServedRegion::is_served(&region) {
        return Err(LogError::OwnRegion { name: region.name });
    }
    Ok(region)
}

/// Test hook: for the backups whose replication port is at one of these addresses, the regions
/// of one side (the backup's log region, or the primary's region) are described as another
/// host's without RDMA, so that the other side cannot map them (`NoMedium`).
#[cfg(test)]
pub(super) static FOREIGN_REGIONS: std::sync::Mutex<Vec<(std::net::SocketAddr, ForeignSide)>> =
    std::sync::Mutex::new(Vec::new());

/// Whose regions [`FOREIGN_REGIONS`] makes another host's.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ForeignSide {
    Primary,
    Backup,
}

/// Test hook ([`FOREIGN_REGIONS`]): `backup` is the backup's replication port.
#[cfg(test)]
fn foreign_for_tests(
    mut descriptor: RegionDescriptor,
    backup: std::io::Result<std::net::SocketAddr>,
    side: ForeignSide,
) -> RegionDescriptor {
    let foreign = FOREIGN_REGIONS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if backup.is_ok_and(|address| foreign.contains(&(address, side))) {
        descriptor.host = Some("another-host-without-rdma".to_owned());
        descriptor.verbs = None;
    }
    descriptor
}

/// The primary's end: writes the stream into the backup's log region.
pub(super) struct LogSender<F: FabricHandle = LogFabric> {
    fabric: F,
    sender: RingSender<F, Arc<F::LocalRegion>>,
    local: Arc<F::LocalRegion>,
    log: F::RemoteRegion,
    /// The medium the backup's region is reached through (`shm`, `verbs`, ...).
    medium: &'static str,
    /// The replication port's connection (a clone), whose end is the backup's.
    control: TcpStream,
    /// Keeps the primary's region registered.
    _endpoint: Endpoint<F>,
}

impl LogSender<LogFabric> {
    /// [`LogSender::negotiate`] over this process's fabric, taking only a log region: a backup
    /// that cannot be reached one-sidedly is [`LogError::NoMedium`].
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn connect(control: &mut TcpStream) -> Result<LogSender, LogError> {
        match LogSender::negotiate(<LogFabric as FabricHandle>::open()?, control)? {
            Negotiated::OneSided(sender) => Ok(sender),
            Negotiated::Tcp { reason } => Err(LogError::NoMedium { reason }),
        }
    }
}

impl<F: FabricHandle> LogSender<F> {
    /// The primary's side of the handshake on `control` (after the backup accepted a hello
    /// asking for a log region): sends its region, maps the backup's log region and says what
    /// carries the stream (module docs). `Negotiated::Tcp`: either side cannot map the other's
    /// region; both go on over `control`.
    pub(super) fn negotiate(fabric: F, control: &mut TcpStream) -> Result<Negotiated<LogSender<F>>, LogError> {
        let endpoint = Endpoint::register(fabric.clone(), "replication-primary", HEADER_BYTES)?;
        let descriptor = endpoint.descriptor.clone();
        #[cfg(test)]
        let descriptor = foreign_for_tests(descriptor, control.peer_addr(), ForeignSide::Primary);
        let line = RegionLine { region: Some(descriptor), no_medium: None };
        write_json_line(control, &line).map_err(LogError::Handshake)?;
        let answer: RegionLine = read_line(control).map_err(LogError::Handshake)?;
        let region = match answer {
            RegionLine { region: Some(region), no_medium: None } => peer_region(region)?,
            RegionLine { region: None, no_medium: Some(reason) } => {
                let reason = format!("the backup cannot map the primary's region: {}", peer_reason(&reason));
                return Ok(Negotiated::Tcp { reason });
            }
            _ => return Err(malformed("a region line with both or neither of region and no_medium")),
        };
        let log = match fabric.map(&region) {
            Ok(log) => log,
            Err(error @ FabricError::NoMedium { .. }) => {
                let reason = format!("the primary cannot map the backup's log region: {}", reason_of(&error));
                let line = MediumLine { medium: MEDIUM_TCP.to_owned(), reason: Some(reason.clone()) };
                write_json_line(control, &line).map_err(LogError::Handshake)?;
                return Ok(Negotiated::Tcp { reason });
            }
            Err(error) => return Err(error.into()),
        };
        let medium = fabric.medium_name(&log);
        let local = Arc::clone(&endpoint.region);
        let sender = RingSender::new(fabric.clone(), log.clone(), Arc::clone(&local), addresses())?;
        let control_clone = control.try_clone().map_err(LogError::Handshake)?;
        write_json_line(control, &MediumLine { medium: MEDIUM_ONE_SIDED.to_owned(), reason: None })
            .map_err(LogError::Handshake)?;
        Ok(Negotiated::OneSided(LogSender {
            fabric,
            sender,
            local,
            log,
            medium,
            control: control_clone,
            _endpoint: endpoint,
        }))
    }

    /// The medium the backup's log region is reached through (`shm`, `verbs`, ...).
    pub(super) fn medium(&self) -> &'static str {
        self.medium
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
    /// error); here the close word is loaded after a fence (module docs: over verbs, an RDMA
    /// READ posted after every write completed), and the backup's connection is asked whether
    /// it ended (one `poll` for POLLRDHUP, which the kernel raises as soon as a process dies,
    /// even with acknowledgements still unread).
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
pub(super) struct LogReceiver<F: FabricHandle = LogFabric> {
    receiver: RingReceiver<F, Arc<F::LocalRegion>>,
    local: Arc<F::LocalRegion>,
    /// The medium the primary's region is reached through (`shm`, `verbs`, ...).
    medium: &'static str,
    /// The rest of a message the reader did not take yet.
    leftover: Vec<u8>,
    leftover_start: usize,
    closed: bool,
    /// Keeps the log region registered.
    _endpoint: Endpoint<F>,
}

impl LogReceiver<LogFabric> {
    /// [`LogReceiver::negotiate`] over this process's fabric, taking only a log region: a
    /// primary that cannot reach it is [`LogError::NoMedium`].
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn accept(control: &mut TcpStream) -> Result<LogReceiver, LogError> {
        match LogReceiver::negotiate(<LogFabric as FabricHandle>::open()?, control)? {
            Negotiated::OneSided(receiver) => Ok(receiver),
            Negotiated::Tcp { reason } => Err(LogError::NoMedium { reason }),
        }
    }
}

impl<F: FabricHandle> LogReceiver<F> {
    /// The backup's side of the handshake on `control`: maps the primary's region, registers a
    /// log region (its ring zeroed before the primary learns where it is), sends it, and takes
    /// the primary's word on what carries the stream (module docs). `Negotiated::Tcp`: either
    /// side cannot map the other's region; both go on over `control`.
    pub(super) fn negotiate(fabric: F, control: &mut TcpStream) -> Result<Negotiated<LogReceiver<F>>, LogError> {
        let line: RegionLine = read_line(control).map_err(LogError::Handshake)?;
        let region = match line {
            RegionLine { region: Some(region), no_medium: None } => peer_region(region)?,
            _ => return Err(malformed("the primary's region line names no region")),
        };
        let primary = match fabric.map(&region) {
            Ok(primary) => primary,
            Err(error @ FabricError::NoMedium { .. }) => {
                let reason = reason_of(&error);
                write_json_line(control, &RegionLine { region: None, no_medium: Some(reason.clone()) })
                    .map_err(LogError::Handshake)?;
                return Ok(Negotiated::Tcp {
                    reason: format!("this backup cannot map the primary's region: {reason}"),
                });
            }
            Err(error) => return Err(error.into()),
        };
        let medium = fabric.medium_name(&primary);
        let endpoint =
            Endpoint::register(fabric.clone(), "replication-log", HEADER_BYTES + REPLICATION_LOG_RING_BYTES)?;
        let local = Arc::clone(&endpoint.region);
        let receiver = RingReceiver::new(fabric, Arc::clone(&local), primary, addresses())?;
        let descriptor = endpoint.descriptor.clone();
        #[cfg(test)]
        let descriptor = foreign_for_tests(descriptor, control.local_addr(), ForeignSide::Backup);
        write_json_line(control, &RegionLine { region: Some(descriptor), no_medium: None })
            .map_err(LogError::Handshake)?;
        let mut log = LogReceiver {
            receiver,
            local,
            medium,
            leftover: Vec::new(),
            leftover_start: 0,
            closed: false,
            _endpoint: endpoint,
        };
        let word: MediumLine = read_line(control).map_err(LogError::Handshake)?;
        match (word.medium.as_str(), word.reason) {
            (MEDIUM_ONE_SIDED, None) => Ok(Negotiated::OneSided(log)),
            (MEDIUM_TCP, Some(reason)) => {
                log.close(); // nothing is written into it: the primary could not map it
                Ok(Negotiated::Tcp { reason: peer_reason(&reason) })
            }
            _ => Err(malformed("the primary's medium line names no known medium")),
        }
    }

    /// The medium the primary's region is reached through (`shm`, `verbs`, ...).
    pub(super) fn medium(&self) -> &'static str {
        self.medium
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

impl<F: FabricHandle> Drop for LogReceiver<F> {
    /// A stream that ends for any reason (refused, fenced, stopped) closes its region first, so
    /// the primary never counts a record the backup will not apply as held.
    fn drop(&mut self) {
        self.close();
    }
}
