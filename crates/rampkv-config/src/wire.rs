//! Frames of the configuration port: between nodes (Raft messages, heartbeats, lease grants,
//! catch-up reports) and between clients and nodes (configuration requests).
//!
//! # Format
//! ```text
//! header (20 bytes, little-endian)
//!   0  u32  magic 0x46434b52 ("RKCF")
//!   4  u8   version (1)
//!   5  u8   kind (Hello 1, Raft 2, Heartbeat 3, LeaseGrant 4, CaughtUp 5, ConfigRequest 6,
//!           ConfigReply 7, Refused 8)
//!   6  u16  reserved, 0
//!   8  u32  body length (at most CONFIG_FRAME_BODY_BYTES_MAX)
//!  12  u64  XXH3-64 of header bytes 0..12 followed by the body
//! body (per kind; docs/replication.md, "Encodings")
//! ```
//! A reader checks magic, version, kind and length before it reads the body, reads the body as
//! bytes arrive (memory grows with bytes received, never with the declared length), checks the
//! checksum, then decodes. Any failure is an error that closes the connection; none panics.
//! The Raft body is raft-rs's protobuf encoding of `eraftpb::Message` (its schema has no
//! recursive message, so a hostile body cannot nest deeply).

use std::io::{ErrorKind, Read};

use protobuf::Message as _;
use raft::eraftpb;
use xxhash_rust::xxh3::Xxh3;

use crate::codec::{Reader, Writer};
use crate::configuration::ServerId;
use crate::error::{ConfigError, FrameProblem, RefusalReason};
use crate::limits::CONFIG_FRAME_BODY_BYTES_MAX;

/// The first four bytes of every frame (little-endian "RKCF").
pub(crate) const MAGIC: u32 = 0x4643_4b52;
const VERSION: u8 = 1;
/// Bytes of a frame header.
pub const HEADER_BYTES: usize = 20;

/// A heartbeat: a server asks to extend its lease (sent to every node every heartbeat interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    pub from: ServerId,
    /// The sending process's incarnation (0 for a process that bootstrapped the cluster).
    pub incarnation: u64,
    /// The newest configuration epoch the sender knows.
    pub known_epoch: u64,
    /// When the sender sent it, by the sender's own clock (echoed in the grant).
    pub sent_at_ns: u64,
}

/// A lease grant from the Raft leader, answering one heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGrant {
    pub to: ServerId,
    /// The incarnation of the heartbeat it answers.
    pub incarnation: u64,
    /// The committed configuration epoch the lease is granted in.
    pub epoch: u64,
    /// The heartbeat's `sent_at_ns`: the lease runs from there, on the holder's clock.
    pub heartbeat_sent_at_ns: u64,
    /// The lease length (the holder subtracts its drift margin).
    pub lease_ns: u64,
    /// The encoded configuration of `epoch` when the heartbeat knew an older epoch, else empty.
    pub configuration: Vec<u8>,
}

/// Everything that travels on the configuration port.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// First frame of a connection between nodes: who is calling, from which cluster.
    Hello {
        cluster_id: u64,
        from: ServerId,
    },
    /// A Raft message (raft-rs protobuf).
    Raft(Box<eraftpb::Message>),
    Heartbeat(Heartbeat),
    LeaseGrant(LeaseGrant),
    /// A server holds a partition's snapshot and log since: make it an in-sync backup.
    CaughtUp {
        from: ServerId,
        incarnation: u64,
        partition: u32,
        epoch: u64,
    },
    /// A client asks for the configuration (`cluster_id` 0: any cluster).
    ConfigRequest {
        cluster_id: u64,
        known_epoch: u64,
    },
    /// The node's newest configuration, its Raft leader if known, and its commit index (0 until it
    /// has known a leader since it started: `client::ConfigAnswer::commit_index`).
    ConfigReply {
        leader: Option<ServerId>,
        commit_index: u64,
        configuration: Vec<u8>,
    },
    /// The request was refused; `cluster_id` is the refusing node's.
    Refused {
        reason: RefusalReason,
        cluster_id: u64,
    },
}

const NO_LEADER: u16 = u16::MAX;

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Raft(_) => 2,
            Message::Heartbeat(_) => 3,
            Message::LeaseGrant(_) => 4,
            Message::CaughtUp { .. } => 5,
            Message::ConfigRequest { .. } => 6,
            Message::ConfigReply { .. } => 7,
            Message::Refused { .. } => 8,
        }
    }

    fn encode_body(&self) -> Vec<u8> {
        let mut writer = Writer::default();
        match self {
            Message::Hello { cluster_id, from } => {
                writer.u64(*cluster_id);
                writer.u16(*from);
            }
            Message::Raft(message) => {
                writer.bytes = message.write_to_bytes().expect("raft messages always encode");
            }
            Message::Heartbeat(heartbeat) => {
                writer.u16(heartbeat.from);
                writer.u64(heartbeat.incarnation);
                writer.u64(heartbeat.known_epoch);
                writer.u64(heartbeat.sent_at_ns);
            }
            Message::LeaseGrant(grant) => {
                writer.u16(grant.to);
                writer.u64(grant.incarnation);
                writer.u64(grant.epoch);
                writer.u64(grant.heartbeat_sent_at_ns);
                writer.u64(grant.lease_ns);
                writer.blob(&grant.configuration);
            }
            Message::CaughtUp { from, incarnation, partition, epoch } => {
                writer.u16(*from);
                writer.u64(*incarnation);
                writer.u32(*partition);
                writer.u64(*epoch);
            }
            Message::ConfigRequest { cluster_id, known_epoch } => {
                writer.u64(*cluster_id);
                writer.u64(*known_epoch);
            }
            Message::ConfigReply { leader, commit_index, configuration } => {
                writer.u16(leader.unwrap_or(NO_LEADER));
                writer.u64(*commit_index);
                writer.blob(configuration);
            }
            Message::Refused { reason, cluster_id } => {
                writer.u8(reason.code());
                writer.u64(*cluster_id);
            }
        }
        writer.bytes
    }

    fn decode_body(kind: u8, body: &[u8]) -> Result<Message, ConfigError> {
        if kind == 2 {
            let message = eraftpb::Message::parse_from_bytes(body).map_err(|_| ConfigError::Decode {
                what: "raft message",
                problem: "bad protobuf",
                offset: 0,
            })?;
            return Ok(Message::Raft(Box::new(message)));
        }
        let mut reader = Reader::new(body, "configuration-port message");
        let message = match kind {
            1 => Message::Hello { cluster_id: reader.u64()?, from: reader.u16()? },
            3 => Message::Heartbeat(Heartbeat {
                from: reader.u16()?,
                incarnation: reader.u64()?,
                known_epoch: reader.u64()?,
                sent_at_ns: reader.u64()?,
            }),
            4 => Message::LeaseGrant(LeaseGrant {
                to: reader.u16()?,
                incarnation: reader.u64()?,
                epoch: reader.u64()?,
                heartbeat_sent_at_ns: reader.u64()?,
                lease_ns: reader.u64()?,
                configuration: reader.blob()?.to_vec(),
            }),
            5 => Message::CaughtUp {
                from: reader.u16()?,
                incarnation: reader.u64()?,
                partition: reader.u32()?,
                epoch: reader.u64()?,
            },
            6 => Message::ConfigRequest { cluster_id: reader.u64()?, known_epoch: reader.u64()? },
            7 => {
                let leader = reader.u16()?;
                Message::ConfigReply {
                    leader: (leader != NO_LEADER).then_some(leader),
                    commit_index: reader.u64()?,
                    configuration: reader.blob()?.to_vec(),
                }
            }
            8 => {
                let code = reader.u8()?;
                let reason = RefusalReason::from_code(code).ok_or_else(|| reader.error("unknown refusal reason"))?;
                Message::Refused { reason, cluster_id: reader.u64()? }
            }
            _ => return Err(reader.error("unknown kind")),
        };
        reader.finish()?;
        Ok(message)
    }
}

fn checksum(header: &[u8], body: &[u8]) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(&header[..12]);
    hasher.update(body);
    hasher.digest()
}

/// The bytes of one frame carrying `message`.
///
/// # Panics
/// If the body exceeds `CONFIG_FRAME_BODY_BYTES_MAX`: every message we build is bounded below
/// it (the largest is a configuration at the cluster limits).
pub fn encode_frame(message: &Message) -> Vec<u8> {
    let body = message.encode_body();
    assert!(body.len() <= CONFIG_FRAME_BODY_BYTES_MAX, "frame body of {} bytes", body.len());
    let mut frame = Vec::with_capacity(HEADER_BYTES + body.len());
    frame.extend_from_slice(&MAGIC.to_le_bytes());
    frame.push(VERSION);
    frame.push(message.kind());
    frame.extend_from_slice(&0u16.to_le_bytes());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    let sum = checksum(&frame, &body);
    frame.extend_from_slice(&sum.to_le_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Reads one frame. `Ok(None)`: the peer closed the connection between frames.
///
/// # Errors
/// [`ConfigError::BadFrame`] for a frame that is not one (the caller closes the connection),
/// [`ConfigError::Io`] for socket errors and timeouts.
pub fn read_frame(stream: &mut impl Read, peer: &str) -> Result<Option<Message>, ConfigError> {
    let bad = |problem| ConfigError::BadFrame { peer: peer.to_string(), problem };
    let mut header = [0u8; HEADER_BYTES];
    let mut filled = 0;
    while filled < HEADER_BYTES {
        match stream.read(&mut header[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(bad(FrameProblem::Truncated)),
            Ok(count) => filled += count,
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(ConfigError::Io { action: "reading from", address: peer.to_string(), error }),
        }
    }
    let field =
        |range: std::ops::Range<usize>| header[range].iter().rev().fold(0u64, |sum, b| sum << 8 | u64::from(*b));
    if field(0..4) as u32 != MAGIC {
        return Err(bad(FrameProblem::Magic));
    }
    if header[4] != VERSION {
        return Err(bad(FrameProblem::Version(header[4])));
    }
    let kind = header[5];
    if !(1..=8).contains(&kind) {
        return Err(bad(FrameProblem::Kind(kind)));
    }
    let length = field(8..12) as usize;
    if length > CONFIG_FRAME_BODY_BYTES_MAX {
        return Err(bad(FrameProblem::TooLarge(length)));
    }
    let mut body = Vec::new();
    let read = stream.take(length as u64).read_to_end(&mut body).map_err(|error| ConfigError::Io {
        action: "reading from",
        address: peer.to_string(),
        error,
    })?;
    if read != length {
        return Err(bad(FrameProblem::Truncated));
    }
    if checksum(&header, &body) != field(12..20) {
        return Err(bad(FrameProblem::Checksum));
    }
    Message::decode_body(kind, &body).map(Some).map_err(|_| bad(FrameProblem::Body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        let mut raft = eraftpb::Message::default();
        raft.set_msg_type(eraftpb::MessageType::MsgAppend);
        raft.from = 1;
        raft.to = 2;
        raft.term = 7;
        raft.mut_entries().push(eraftpb::Entry { index: 3, term: 7, data: vec![1, 2, 3].into(), ..Default::default() });
        vec![
            Message::Hello { cluster_id: 42, from: 3 },
            Message::Raft(Box::new(raft)),
            Message::Heartbeat(Heartbeat { from: 1, incarnation: 9, known_epoch: 4, sent_at_ns: 123 }),
            Message::LeaseGrant(LeaseGrant {
                to: 2,
                incarnation: 0,
                epoch: 5,
                heartbeat_sent_at_ns: 77,
                lease_ns: 300_000_000,
                configuration: vec![9; 40],
            }),
            Message::CaughtUp { from: 1, incarnation: 3, partition: 6, epoch: 8 },
            Message::ConfigRequest { cluster_id: 0, known_epoch: 2 },
            Message::ConfigReply { leader: None, commit_index: 5, configuration: vec![1, 2] },
            Message::ConfigReply { leader: Some(2), commit_index: 5, configuration: Vec::new() },
            Message::Refused { reason: RefusalReason::WrongCluster, cluster_id: 99 },
        ]
    }

    #[test]
    fn every_message_round_trips_through_a_frame() {
        for message in samples() {
            let frame = encode_frame(&message);
            let mut stream = frame.as_slice();
            assert_eq!(read_frame(&mut stream, "test").unwrap(), Some(message));
            assert_eq!(read_frame(&mut stream, "test").unwrap(), None);
        }
    }

    #[test]
    fn corrupt_truncated_and_oversized_frames_are_refused_without_panic() {
        for message in samples() {
            let frame = encode_frame(&message);
            for cut in 1..frame.len() {
                assert!(read_frame(&mut &frame[..cut], "test").is_err(), "cut at {cut} of {message:?}");
            }
            for at in 0..frame.len() {
                let mut flipped = frame.clone();
                flipped[at] ^= 0x10;
                assert!(read_frame(&mut flipped.as_slice(), "test").is_err(), "flip at {at} of {message:?}");
            }
        }
        let mut huge = encode_frame(&Message::ConfigRequest { cluster_id: 0, known_epoch: 0 });
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let error = read_frame(&mut huge.as_slice(), "test").unwrap_err();
        assert!(matches!(error, ConfigError::BadFrame { problem: FrameProblem::TooLarge(_), .. }), "{error}");
        let garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(matches!(
            read_frame(&mut garbage.as_slice(), "test"),
            Err(ConfigError::BadFrame { problem: FrameProblem::Magic, .. })
        ));
    }
}
